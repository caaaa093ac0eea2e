//! `ALLOC_PD`. (`DEALLOC_PD` is a destroy: `destroy.rs`.)

use irpverbs_abi::*;

use super::Op;
use crate::device::{Device, State};
use crate::object::{Body, Object, Pd};
use crate::{Command, CommandOut, FileKey, Hca, Platform};

/// `IOCTL_IV_ALLOC_PD`: no flags are defined yet.
///
/// # Errors
/// `STATUS_INVALID_PARAMETER` for flags or a reserved field set; those of
/// [`Device::reserve`].
pub(crate) fn alloc_pd<P: Platform, H: Hca>(
    d: &Device<P, H>,
    s: &mut State<P::Request>,
    file: FileKey,
    i: &IvAllocPdIn,
) -> Result<(Op, Command), NtStatus> {
    if i.flags != 0 || i.reserved != 0 {
        return Err(STATUS_INVALID_PARAMETER);
    }
    let idx = d.reserve(s, file, Body::Pd(Pd { pdn: 0 }), d.hca.caps().max_pd)?;
    Ok((Op::AllocPd(idx), Command::AllocPd))
}

/// `IOCTL_IV_ALLOC_PD`'s completion: the PD takes the number the HCA gave
/// it.
pub(crate) fn alloc_pd_done(o: &mut Object, pd: IvHandle, out: CommandOut) -> Option<IvAllocPdOut> {
    let (Body::Pd(p), CommandOut::Pd { pdn }) = (&mut o.body, out) else {
        return None;
    };
    p.pdn = pdn;
    Some(IvAllocPdOut {
        pd,
        pdn,
        reserved: 0,
    })
}

/// The PD number of the PD at `idx`.
pub(crate) fn pdn(s: &mut State<impl Sized>, file: FileKey, idx: u32) -> u32 {
    match s.files.get(&file).map(|f| &f.objects.get(idx).body) {
        Some(Body::Pd(p)) => p.pdn,
        _ => 0,
    }
}
