//! `ALLOC_MW` and `BIND_MW` (type 1 windows). (`DEALLOC_MW` is a destroy:
//! `destroy.rs`.) A type 2 window is bound and invalidated by work
//! requests, which the driver does not see: the HCA keeps the window's
//! binding and its MR's count of bound windows, and refuses to deregister
//! an MR that has any (`STATUS_DEVICE_BUSY`). docs/memory-windows.md states
//! the rules.

use irpverbs_abi::*;

use super::Op;
use crate::device::{Device, State};
use crate::object::{Body, Kind, Mw, Object};
use crate::{BindMw, Command, CommandOut, FileKey, Hca, Platform};

/// `IOCTL_IV_ALLOC_MW`.
///
/// # Errors
/// `STATUS_INVALID_PARAMETER` for a type other than `IV_MW_TYPE_1` and
/// `IV_MW_TYPE_2` or a reserved field set; `STATUS_INVALID_HANDLE` for a
/// PD handle that names no live PD of the file; those of
/// [`Device::reserve`] (windows count against the device's `max_mw` and
/// the file's MR quota).
pub(crate) fn alloc_mw<P: Platform, H: Hca>(
    d: &Device<P, H>,
    s: &mut State<P::Request>,
    file: FileKey,
    i: &IvAllocMwIn,
) -> Result<(Op, Command), NtStatus> {
    if i.reserved != 0 || !matches!(i.mw_type, IV_MW_TYPE_1 | IV_MW_TYPE_2) {
        return Err(STATUS_INVALID_PARAMETER);
    }
    let pd = s.file(file)?.objects.lookup(i.pd, Kind::Pd)?;
    let pdn = super::pd::pdn(s, file, pd);
    let body = Body::Mw(Mw {
        pd,
        mw_type: i.mw_type,
        rkey: 0,
    });
    let idx = d.reserve(s, file, body, d.hca.caps().max_mw)?;
    let cmd = Command::AllocMw {
        pdn,
        mw_type: i.mw_type,
    };
    Ok((Op::AllocMw(idx), cmd))
}

/// `IOCTL_IV_ALLOC_MW`'s completion: the window takes the rkey the HCA
/// gave it.
pub(crate) fn alloc_mw_done(o: &mut Object, mw: IvHandle, out: CommandOut) -> Option<IvAllocMwOut> {
    let (Body::Mw(m), CommandOut::Mw { rkey }) = (&mut o.body, out) else {
        return None;
    };
    m.rkey = rkey;
    Some(IvAllocMwOut {
        mw,
        rkey,
        reserved: 0,
    })
}

/// `IOCTL_IV_BIND_MW`: binds a type 1 window (length 0: unbinds it). The
/// window is busy until the bind completes (a second bind, or its
/// dealloc, gets `STATUS_DEVICE_BUSY`). The HCA checks the MR's access and
/// the range.
///
/// # Errors
/// `STATUS_INVALID_PARAMETER` for a reserved field set, access flags other
/// than `IV_ACCESS_REMOTE_*`, a range that wraps, or a type 2 window;
/// `STATUS_INVALID_HANDLE` for a handle that names no live MW or MR of the
/// file; `STATUS_INVALID_PARAMETER_MIX` for an MR of another PD than the
/// window's; `STATUS_DEVICE_BUSY` for a window with a bind in flight.
pub(crate) fn bind_mw<R: crate::Request>(
    s: &mut State<R>,
    file: FileKey,
    i: &IvBindMwIn,
) -> Result<(Op, Command), NtStatus> {
    if i.reserved != 0
        || i.access & !IV_ACCESS_MW_ALL != 0
        || i.addr.checked_add(i.length).is_none()
    {
        return Err(STATUS_INVALID_PARAMETER);
    }
    let f = s.file(file)?;
    let mw = f.objects.lookup(i.mw, Kind::Mw)?;
    let mr = f.objects.lookup(i.mr, Kind::Mr)?;
    let Body::Mr(m) = &f.objects.get(mr).body else {
        return Err(STATUS_INVALID_HANDLE);
    };
    let (mr_pd, lkey) = (m.pd, m.lkey);
    let o = f.objects.get_mut(mw);
    let Body::Mw(w) = &o.body else {
        return Err(STATUS_INVALID_HANDLE);
    };
    if w.mw_type != IV_MW_TYPE_1 {
        return Err(STATUS_INVALID_PARAMETER);
    }
    if w.pd != mr_pd {
        return Err(STATUS_INVALID_PARAMETER_MIX);
    }
    if o.busy {
        return Err(STATUS_DEVICE_BUSY);
    }
    let rkey = w.rkey;
    o.busy = true;
    let cmd = Command::BindMw(BindMw {
        rkey,
        lkey,
        addr: i.addr,
        length: i.length,
        access: i.access,
    });
    Ok((Op::BindMw(mw), cmd))
}

/// `IOCTL_IV_BIND_MW`'s completion: the window is no longer busy and, when
/// the bind succeeded, takes its new rkey.
pub(crate) fn bind_mw_done(
    s: &mut State<impl Sized>,
    file: FileKey,
    idx: u32,
    out: CommandOut,
) -> Option<IvBindMwOut> {
    let o = s.files.get_mut(&file)?.objects.get_mut(idx);
    o.busy = false;
    let (Body::Mw(m), CommandOut::Mw { rkey }) = (&mut o.body, out) else {
        return None;
    };
    m.rkey = rkey;
    Some(IvBindMwOut { rkey, reserved: 0 })
}
