//! `CREATE_CQ` and `RESIZE_CQ`. (`DESTROY_CQ` is a destroy: `destroy.rs`.)

use irpverbs_abi::*;
use irpverbs_ring::Ring;

use super::Op;
use crate::device::{Device, State};
use crate::object::{Body, Cq, Kind, Object};
use crate::{Command, CommandOut, CreateCq, FileKey, Hca, Platform};

fn check_cqe(cqe: u32, caps: &IvQueryDeviceOut) -> Result<(), NtStatus> {
    if cqe == 0 || cqe > caps.max_cqe {
        return Err(STATUS_INVALID_PARAMETER);
    }
    Ok(())
}

/// `IOCTL_IV_CREATE_CQ`.
///
/// # Errors
/// `STATUS_INVALID_PARAMETER` for `cqe` 0 or above `max_cqe`, or a
/// completion vector past `num_comp_vectors`; `STATUS_INVALID_HANDLE` for a
/// channel handle that names no live channel of the file; those of
/// [`Device::reserve_with`].
pub(crate) fn create_cq<P: Platform, H: Hca>(
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
    if let Some(ch) = channel {
        // Room in the channel's queue for an event of every CQ on it, this
        // one too: an event is queued at DISPATCH_LEVEL into that room.
        let o = s.file(file)?.objects.get_mut(ch);
        let cqs = o.dependents as usize + 1;
        if let Body::Channel(c) = &mut o.body {
            c.events
                .try_reserve_exact(cqs.saturating_sub(c.events.len()))
                .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        }
    }
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
    let cmd = Command::CreateCq(CreateCq {
        cqe: i.cqe,
        comp_vector: i.comp_vector,
    });
    Ok((Op::CreateCq(idx), cmd))
}

/// `IOCTL_IV_CREATE_CQ`'s completion: the CQ takes the number, size and
/// ring the HCA gave it.
pub(crate) fn create_cq_done(
    o: &mut Object,
    cq: IvHandle,
    out: CommandOut,
    map: &dyn Fn(&Ring) -> IvRingMap,
) -> Option<IvCreateCqOut> {
    let (Body::Cq(c), CommandOut::Cq { cqn, cqe, ring }) = (&mut o.body, out) else {
        return None;
    };
    c.cqn = cqn;
    c.cqe = cqe;
    let ring_map = map(&ring);
    c.ring = Some(ring);
    Some(IvCreateCqOut {
        cq,
        cqn,
        cqe,
        ring: ring_map,
    })
}

/// `IOCTL_IV_RESIZE_CQ`: one modify or resize at a time; the new ring is
/// held against the file's quota while the command is in flight.
///
/// # Errors
/// `STATUS_INVALID_PARAMETER` for a reserved field set or `cqe` 0 or above
/// `max_cqe`; `STATUS_INVALID_HANDLE` for a handle that names no live CQ
/// of the file; `STATUS_DEVICE_BUSY` while another resize is in flight;
/// `STATUS_QUOTA_EXCEEDED` past the file's ring quota.
pub(crate) fn resize_cq<P: Platform, H: Hca>(
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

/// `IOCTL_IV_RESIZE_CQ`'s completion: the CQ is no longer busy; on success
/// it takes the new size and ring (the old one stays mapped until the
/// owner's next request sweeps it).
pub(crate) fn resize_cq_done<R>(
    s: &mut State<R>,
    file: FileKey,
    idx: u32,
    ok: bool,
    out: CommandOut,
    map: &dyn Fn(&Ring) -> IvRingMap,
) -> Option<IvResizeCqOut> {
    let f = s.files.get_mut(&file)?;
    let o = f.objects.get_mut(idx);
    o.busy = false;
    crate::quota::end_resize(&mut f.usage, o, ok);
    let (true, Body::Cq(c), CommandOut::Cq { cqe, ring, .. }) = (ok, &mut o.body, out) else {
        return None;
    };
    c.cqe = cqe;
    let ring_map = map(&ring);
    c.ring = Some(ring);
    Some(IvResizeCqOut {
        cqe,
        reserved: 0,
        ring: ring_map,
    })
}
