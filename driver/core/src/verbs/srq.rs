//! `CREATE_SRQ`, `MODIFY_SRQ` and `QUERY_SRQ`. (`DESTROY_SRQ` is a
//! destroy: `destroy.rs`.)

use irpverbs_abi::*;
use irpverbs_ring::Ring;

use super::Op;
use crate::device::{Device, State};
use crate::object::{Body, Kind, Object, Srq};
use crate::{Command, CommandOut, CreateSrq, FileKey, Hca, ModifySrq, Platform};

/// `IOCTL_IV_CREATE_SRQ`.
///
/// # Errors
/// `STATUS_INVALID_PARAMETER` for a reserved field set, `max_wr` or
/// `max_sge` 0 or above the device's limits, or a limit not below
/// `max_wr`; `STATUS_INVALID_HANDLE` for a PD handle that names no live PD
/// of the file; those of [`Device::reserve_with`].
pub(crate) fn create_srq<P: Platform, H: Hca>(
    d: &Device<P, H>,
    s: &mut State<P::Request>,
    file: FileKey,
    i: &IvCreateSrqIn,
) -> Result<(Op, Command), NtStatus> {
    let caps = d.hca.caps();
    if i.reserved != 0
        || i.max_wr == 0
        || i.max_wr > caps.max_srq_wr
        || i.max_sge == 0
        || i.max_sge > caps.max_srq_sge
        || i.srq_limit >= i.max_wr
    {
        return Err(STATUS_INVALID_PARAMETER);
    }
    let pd = s.file(file)?.objects.lookup(i.pd, Kind::Pd)?;
    let pdn = super::pd::pdn(s, file, pd);
    let body = Body::Srq(Srq {
        pd,
        srqn: 0,
        max_wr: 0,
        max_sge: i.max_sge,
        user_context: i.user_context,
        ring: None,
    });
    let rings = crate::quota::srq_ring(i.max_wr, i.max_sge);
    let idx = d.reserve_with(s, file, body, caps.max_srq, rings)?;
    let cmd = Command::CreateSrq(CreateSrq {
        pdn,
        max_wr: i.max_wr,
        max_sge: i.max_sge,
        srq_limit: i.srq_limit,
    });
    Ok((Op::CreateSrq(idx), cmd))
}

/// `IOCTL_IV_CREATE_SRQ`'s completion: the SRQ takes the number, depth
/// and ring the HCA gave it.
pub(crate) fn create_srq_done(
    o: &mut Object,
    srq: IvHandle,
    out: CommandOut,
    map: &dyn Fn(&Ring) -> IvRingMap,
) -> Option<IvCreateSrqOut> {
    let (
        Body::Srq(s),
        CommandOut::Srq {
            srqn,
            max_wr,
            max_sge,
            ring,
        },
    ) = (&mut o.body, out)
    else {
        return None;
    };
    s.srqn = srqn;
    s.max_wr = max_wr;
    let ring_map = map(&ring);
    s.ring = Some(ring);
    Some(IvCreateSrqOut {
        srq,
        srqn,
        max_wr,
        max_sge,
        reserved: 0,
        ring: ring_map,
    })
}

/// `IOCTL_IV_MODIFY_SRQ`: resize (needs `IV_DEVICE_SRQ_RESIZE`) and/or arm
/// the limit; the limit must stay below the depth. One modify at a time.
///
/// # Errors
/// `STATUS_INVALID_PARAMETER` for a reserved field set, an empty mask or
/// unknown bits, `max_wr` 0 or above `max_srq_wr`, or a limit not below
/// the (new) depth; `STATUS_NOT_SUPPORTED` for a resize the device cannot
/// do; `STATUS_INVALID_HANDLE` for a handle that names no live SRQ of the
/// file; `STATUS_DEVICE_BUSY` while another modify is in flight;
/// `STATUS_QUOTA_EXCEEDED` past the file's ring quota.
pub(crate) fn modify_srq<P: Platform, H: Hca>(
    d: &Device<P, H>,
    s: &mut State<P::Request>,
    file: FileKey,
    i: &IvModifySrqIn,
) -> Result<(Op, Command), NtStatus> {
    let caps = d.hca.caps();
    let mask = i.attr_mask;
    if i.reserved != 0 || mask == 0 || mask & !(IV_SRQ_MAX_WR | IV_SRQ_LIMIT) != 0 {
        return Err(STATUS_INVALID_PARAMETER);
    }
    if mask & IV_SRQ_MAX_WR != 0 {
        if caps.device_cap_flags & IV_DEVICE_SRQ_RESIZE == 0 {
            return Err(STATUS_NOT_SUPPORTED);
        }
        if i.max_wr == 0 || i.max_wr > caps.max_srq_wr {
            return Err(STATUS_INVALID_PARAMETER);
        }
    }
    let quota = s.quota;
    let f = s.file(file)?;
    let idx = f.objects.lookup(i.srq, Kind::Srq)?;
    let o = f.objects.get_mut(idx);
    if o.busy {
        return Err(STATUS_DEVICE_BUSY);
    }
    let Body::Srq(srq) = &o.body else {
        return Err(STATUS_INVALID_HANDLE);
    };
    let resize = (mask & IV_SRQ_MAX_WR != 0).then(|| crate::quota::srq_ring(i.max_wr, srq.max_sge));
    let depth = if mask & IV_SRQ_MAX_WR != 0 {
        i.max_wr
    } else {
        srq.max_wr
    };
    if mask & IV_SRQ_LIMIT != 0 && i.srq_limit >= depth {
        return Err(STATUS_INVALID_PARAMETER);
    }
    let srqn = srq.srqn;
    if let Some(new) = resize {
        f.usage.check_bytes(&quota, new, o.bytes)?;
        crate::quota::begin_resize(&mut f.usage, o, new);
    }
    o.busy = true;
    let op = Op::ModifySrq {
        srq: idx,
        mask,
        max_wr: i.max_wr,
    };
    let cmd = Command::ModifySrq(ModifySrq {
        srqn,
        mask,
        max_wr: i.max_wr,
        srq_limit: i.srq_limit,
    });
    Ok((op, cmd))
}

/// `IOCTL_IV_MODIFY_SRQ`'s completion: the SRQ is no longer busy; a
/// resize that succeeded sets its depth. No output.
pub(crate) fn modify_srq_done<R>(
    s: &mut State<R>,
    file: FileKey,
    idx: u32,
    mask: u32,
    max_wr: u32,
    ok: bool,
) {
    let Some(f) = s.files.get_mut(&file) else {
        return;
    };
    let o = f.objects.get_mut(idx);
    o.busy = false;
    crate::quota::end_resize(&mut f.usage, o, ok);
    if let (true, Body::Srq(srq)) = (ok && mask & IV_SRQ_MAX_WR != 0, &mut o.body) {
        srq.max_wr = max_wr;
    }
}

/// `IOCTL_IV_QUERY_SRQ`: counted as a query in flight on the SRQ (a
/// destroy waits for it).
///
/// # Errors
/// `STATUS_INVALID_HANDLE` for a handle that names no live SRQ of the file.
pub(crate) fn query_srq<R>(
    s: &mut State<R>,
    file: FileKey,
    i: &IvHandleIn,
) -> Result<(Op, Command), NtStatus> {
    let (idx, srqn) = s.begin_query(file, i.handle, Kind::Srq)?;
    Ok((Op::QuerySrq(idx), Command::QuerySrq { srqn }))
}

/// `IOCTL_IV_QUERY_SRQ`'s completion: the SRQ's attributes are the output.
pub(crate) fn query_srq_done<R>(
    s: &mut State<R>,
    file: FileKey,
    idx: u32,
    out: CommandOut,
) -> Option<IvQuerySrqOut> {
    s.end_query(file, idx);
    match out {
        CommandOut::SrqAttr(a) => Some(a),
        _ => None,
    }
}
