//! Completion queues.

use irpverbs_abi::*;

use crate::device::{Device, Op, Response, State};
use crate::object::{Body, Cq, Kind};
use crate::{Command, CommandOut, FileKey, Hca, Platform};

fn check_cqe(cqe: u32, caps: &IvQueryDeviceOut) -> Result<(), NtStatus> {
    if cqe == 0 || cqe > caps.max_cqe {
        return Err(STATUS_INVALID_PARAMETER);
    }
    Ok(())
}

/// `IOCTL_IV_CREATE_CQ`.
pub(crate) fn start_create_cq<P: Platform, H: Hca>(
    d: &Device<P, H>,
    s: &mut State<P::Request>,
    file: FileKey,
    i: &IvCreateCqIn,
) -> Result<(Op, Command), NtStatus> {
    let caps = d.hca.caps();
    check_cqe(i.cqe, caps)?;
    if i.comp_vector >= caps.num_comp_vectors {
        return Err(STATUS_INVALID_PARAMETER);
    }
    let channel = if i.channel == 0 {
        None
    } else {
        Some(s.file(file)?.objects.lookup(i.channel, Kind::Channel)?)
    };
    let body = Body::Cq(Cq {
        cqn: 0,
        cqe: 0,
        user_context: i.user_context,
        ring: None,
        channel,
        unacked_events: 0,
        notify_waits: alloc::vec::Vec::new(),
        failed: false,
        arm_seq: 0,
    });
    let idx = d.reserve_with(s, file, body, caps.max_cq, crate::quota::cq_ring(i.cqe))?;
    Ok((
        Op::Create(idx),
        Command::CreateCq(crate::CreateCq {
            cqe: i.cqe,
            comp_vector: i.comp_vector,
        }),
    ))
}

/// `IOCTL_IV_RESIZE_CQ`.
pub(crate) fn start_resize_cq<P: Platform, H: Hca>(
    d: &Device<P, H>,
    s: &mut State<P::Request>,
    file: FileKey,
    i: &IvResizeCqIn,
) -> Result<(Op, Command), NtStatus> {
    if i.reserved != 0 {
        return Err(STATUS_INVALID_PARAMETER);
    }
    check_cqe(i.cqe, d.hca.caps())?;
    let quota = s.quota;
    let f = s.file(file)?;
    let idx = f.objects.lookup(i.cq, Kind::Cq)?;
    let o = f.objects.get_mut(idx);
    if o.busy {
        return Err(STATUS_DEVICE_BUSY);
    }
    let Body::Cq(c) = &o.body else {
        return Err(STATUS_INVALID_HANDLE);
    };
    let cqn = c.cqn;
    let new = crate::quota::cq_ring(i.cqe);
    f.usage.check_bytes(&quota, new, o.bytes)?;
    crate::quota::begin_resize(&mut f.usage, o, new);
    o.busy = true;
    Ok((Op::ResizeCq(idx), Command::ResizeCq { cqn, cqe: i.cqe }))
}

pub(crate) fn finish_resize_cq<R>(
    s: &mut State<R>,
    file: FileKey,
    idx: u32,
    status: NtStatus,
    out: CommandOut,
    map: &dyn Fn(&irpverbs_ring::Ring) -> IvRingMap,
) -> (NtStatus, Response) {
    let Some(f) = s.files.get_mut(&file) else {
        return (status, Response::None);
    };
    let o = f.objects.get_mut(idx);
    o.busy = false;
    crate::quota::end_resize(&mut f.usage, o, nt_success(status));
    match (&mut o.body, out) {
        (Body::Cq(c), CommandOut::Cq { cqe, ring, .. }) if nt_success(status) => {
            c.cqe = cqe;
            let map = map(&ring);
            c.ring = Some(ring);
            (
                status,
                Response::CqResize(IvResizeCqOut {
                    cqe,
                    reserved: 0,
                    ring: map,
                }),
            )
        }
        _ if nt_success(status) => (STATUS_DEVICE_HARDWARE_ERROR, Response::None),
        _ => (status, Response::None),
    }
}
