//! Shared receive queues.

use irpverbs_abi::*;

use crate::device::{Device, Op, Response, State};
use crate::object::{Body, Kind, Srq};
use crate::{Command, CommandOut, FileKey, Hca, Platform};

/// `IOCTL_IV_CREATE_SRQ`.
pub(crate) fn start_create_srq<P: Platform, H: Hca>(
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
    let pdn = crate::pd::pdn(s, file, pd);
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
    Ok((
        Op::Create(idx),
        Command::CreateSrq(crate::CreateSrq {
            pdn,
            max_wr: i.max_wr,
            max_sge: i.max_sge,
            srq_limit: i.srq_limit,
        }),
    ))
}

/// `IOCTL_IV_MODIFY_SRQ`: resize (needs `IV_DEVICE_SRQ_RESIZE`) and/or arm
/// the limit; the limit must stay below the depth.
pub(crate) fn start_modify_srq<P: Platform, H: Hca>(
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
    Ok((
        Op::ModifySrq {
            srq: idx,
            mask,
            max_wr: i.max_wr,
        },
        Command::ModifySrq(crate::ModifySrq {
            srqn,
            mask,
            max_wr: i.max_wr,
            srq_limit: i.srq_limit,
        }),
    ))
}

pub(crate) fn finish_modify_srq<R>(
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

/// `IOCTL_IV_QUERY_SRQ`.
pub(crate) fn start_query_srq<R>(
    s: &mut State<R>,
    file: FileKey,
    i: &IvHandleIn,
) -> Result<(Op, Command), NtStatus> {
    let (idx, srqn) = s.begin_query(file, i.handle, Kind::Srq)?;
    Ok((Op::QuerySrq(idx), Command::QuerySrq { srqn }))
}

pub(crate) fn finish_query_srq<R>(
    s: &mut State<R>,
    file: FileKey,
    idx: u32,
    status: NtStatus,
    out: CommandOut,
) -> (NtStatus, Response) {
    s.end_query(file, idx);
    match out {
        CommandOut::SrqAttr(a) if nt_success(status) => (status, Response::SrqAttr(a)),
        _ if nt_success(status) => (STATUS_DEVICE_HARDWARE_ERROR, Response::None),
        _ => (status, Response::None),
    }
}
