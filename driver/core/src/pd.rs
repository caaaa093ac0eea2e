//! Protection domains.

use irpverbs_abi::*;

use crate::device::{Device, Op, State};
use crate::object::{Body, Pd};
use crate::{Command, FileKey, Hca, Platform};

/// `IOCTL_IV_ALLOC_PD`: no flags are defined yet.
pub(crate) fn start_alloc_pd<P: Platform, H: Hca>(
    d: &Device<P, H>,
    s: &mut State<P::Request>,
    file: FileKey,
    i: &IvAllocPdIn,
) -> Result<(Op, Command), NtStatus> {
    if i.flags != 0 || i.reserved != 0 {
        return Err(STATUS_INVALID_PARAMETER);
    }
    let idx = d.reserve(s, file, Body::Pd(Pd { pdn: 0 }), d.hca.caps().max_pd)?;
    Ok((Op::Create(idx), Command::AllocPd))
}

/// The PD number of the PD at `idx`.
pub(crate) fn pdn(s: &mut State<impl Sized>, file: FileKey, idx: u32) -> u32 {
    match s.files.get(&file).map(|f| &f.objects.get(idx).body) {
        Some(Body::Pd(p)) => p.pdn,
        _ => 0,
    }
}
