//! The destroys of every kind of object the HCA holds: `DEALLOC_PD`,
//! `DEREG_MR`, `DESTROY_CQ`, `DESTROY_QP`, `DESTROY_SRQ`, `DESTROY_AH`,
//! and the destroys a file's rundown issues. (A completion channel or a
//! CEP is the driver's alone: `crate::notify`, `crate::cm`.)

use irpverbs_abi::*;

use super::Op;
use crate::device::{Device, State};
use crate::object::{Body, Kind, Life};
use crate::{Command, FileKey, Hca, Platform};

/// A destroy IOCTL: an object with dependents, a modify or query in
/// flight, or events not acknowledged is busy and stays as it is. The
/// handle is unusable from now on; a CQ's notify waits complete with
/// `STATUS_DELETE_PENDING`.
///
/// # Errors
/// `STATUS_INVALID_HANDLE` for a handle that names no live object of
/// `kind` in the file; `STATUS_DEVICE_BUSY` for a busy object.
pub(crate) fn destroy<R: crate::Request>(
    s: &mut State<R>,
    file: FileKey,
    handle: IvHandle,
    kind: Kind,
) -> Result<(Op, Command), NtStatus> {
    let f = s.file(file)?;
    let idx = f.objects.lookup(handle, kind)?;
    let o = f.objects.get_mut(idx);
    let unacked_cq_events = matches!(&o.body, Body::Cq(c) if c.unacked_events != 0);
    if o.dependents != 0 || o.busy || o.queries != 0 || o.unacked_async != 0 || unacked_cq_events {
        return Err(STATUS_DEVICE_BUSY);
    }
    let cmd = o.destroy_command().ok_or(STATUS_INVALID_HANDLE)?;
    o.life = Life::Destroying;
    if kind == Kind::Cq {
        crate::notify::fail_cq_waits(s, file, idx, STATUS_DELETE_PENDING);
    }
    Ok((Op::Destroy(idx), cmd))
}

/// A destroy's completion: the object goes (its parents lose a
/// dependent). A destroy the HCA refused leaves the object live, unless
/// the file's rundown issued it (`rundown`): then the object goes anyway,
/// counted in `DeviceStats::rundown_failures`. No output.
pub(crate) fn destroy_done<P: Platform, H: Hca>(
    d: &Device<P, H>,
    s: &mut State<P::Request>,
    file: FileKey,
    (idx, rundown): (u32, bool),
    ok: bool,
) {
    if !ok && rundown {
        s.stats.rundown_failures += 1;
    }
    if ok || rundown {
        d.free_object(s, file, idx);
    } else if let Some(f) = s.files.get_mut(&file) {
        f.objects.get_mut(idx).life = Life::Live;
    }
}

/// A destroy IOCTL on a removed device: the hardware is gone, so the
/// object is simply freed (busy rules still apply).
///
/// # Errors
/// `STATUS_INVALID_HANDLE` for a handle that names no live object of
/// `kind` in the file; `STATUS_DEVICE_BUSY` for an object with dependents
/// or an operation in flight.
pub(crate) fn destroy_removed<P: Platform, H: Hca>(
    d: &Device<P, H>,
    s: &mut State<P::Request>,
    file: FileKey,
    handle: IvHandle,
    kind: Kind,
) -> Result<(), NtStatus> {
    let f = s.files.get_mut(&file).ok_or(STATUS_INVALID_HANDLE)?;
    let idx = f.objects.lookup(handle, kind)?;
    let o = f.objects.get(idx);
    if o.dependents != 0 || o.busy || o.queries != 0 {
        return Err(STATUS_DEVICE_BUSY);
    }
    d.free_object(s, file, idx);
    Ok(())
}
