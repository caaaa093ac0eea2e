//! Notification, three ways, every pended request cancelable:
//!
//! - `CQ_NOTIFY`: a request that targets one CQ and completes when that CQ
//!   gets an event (`STATUS_SUCCESS`), is destroyed (`STATUS_DELETE_PENDING`)
//!   or overruns (`STATUS_DATA_OVERRUN`) — seed 000;
//! - completion channels: CQs bound at creation, `GET_CQ_EVENT` returns the
//!   next CQ with an event, `ACK_CQ_EVENTS` acknowledges; a CQ with
//!   unacknowledged events, or a channel with CQs bound, is busy — seed 001;
//! - async events: `GET_ASYNC_EVENT` on the file, `ACK_ASYNC_EVENT`; an object
//!   with unacknowledged events is busy.
//!
//! Events come from the HCA's event queue through interrupt then DPC. A
//! pended request lives in the wait table under a key; the platform calls
//! [`crate::Device::cancel`] with that key. Ownership is race-free: the
//! completing side unmarks the request under the device lock and leaves it
//! to the cancel routine if that fails; the cancel routine removes it from
//! the table under the same lock.

use alloc::collections::VecDeque;

use irpverbs_abi::*;
use zerocopy::IntoBytes;

use crate::device::{Response, State};
use crate::hca::AsyncEvent;
use crate::object::{Body, Kind, Life};
use crate::platform::{FileKey, Request};

/// A pended request.
pub(crate) struct Wait<R> {
    pub file: FileKey,
    pub request: R,
}

/// An async event queued on a file until someone takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AsyncRecord {
    pub event_type: u32,
    pub port_num: u32,
    /// The object (index) it is about.
    pub object: Option<u32>,
}

/// Most async events a file queues; older ones are dropped (and counted).
pub const MAX_QUEUED_ASYNC_EVENTS: usize = 4096;

/// A request to complete once the device lock is released.
pub(crate) type Done<R> = (R, NtStatus, Response);

/// Takes a wait out of the table to complete it, if the cancel routine does
/// not own it.
pub(crate) fn take_wait<R: Request>(s: &mut State<R>, key: u64) -> Option<R> {
    let w = s.waits.get_mut(&key)?;
    if w.request.unmark_cancelable().is_err() {
        // Cancelled meanwhile: the cancel routine owns it and will find it.
        return None;
    }
    s.waits.remove(&key).map(|w| w.request)
}

/// Pends `request` as a wait: marks it cancelable under `key` (the caller
/// files the key in the list of what it waits for).
/// Returns the request back (to complete with `STATUS_CANCELLED`) if it was
/// already cancelled.
pub(crate) fn pend<R: Request>(
    s: &mut State<R>,
    file: FileKey,
    request: R,
) -> Result<u64, (R, NtStatus)> {
    // The wait's room first: nothing to undo if it is refused.
    if reserve_waits(s).is_err() {
        return Err((request, STATUS_INSUFFICIENT_RESOURCES));
    }
    pend_reserved(s, file, request)
}

/// Room in the wait table for one more wait, one for every multi-phase
/// CM request in progress (each may park its request when the engine
/// sends its MAD, in a completion path that cannot fail) and one more.
///
/// # Errors
/// `STATUS_INSUFFICIENT_RESOURCES` when refused.
pub(crate) fn reserve_waits<R>(s: &mut State<R>) -> Result<(), NtStatus> {
    let total = s.waits.len() + s.cm_ops.len() + 2;
    s.waits.reserve_total(total)?;
    s.reserve_deferred()
}

/// [`pend`] in the room [`reserve_waits`] made: never allocates.
///
/// # Errors
/// As [`pend`] (`STATUS_INSUFFICIENT_RESOURCES` only if no room was made).
pub(crate) fn pend_reserved<R: Request>(
    s: &mut State<R>,
    file: FileKey,
    mut request: R,
) -> Result<u64, (R, NtStatus)> {
    s.next_wait += 1;
    let key = s.next_wait;
    if request.mark_cancelable(key).is_err() {
        return Err((request, STATUS_CANCELLED));
    }
    let wait = Wait { file, request };
    if let Err((_, mut wait)) = s.waits.insert_reserved(key, wait) {
        // Not reached: the room was reserved above.
        let _ = wait.request.unmark_cancelable();
        return Err((wait.request, STATUS_INSUFFICIENT_RESOURCES));
    }
    Ok(key)
}

/// Writes the `IvCqEventOut` of CQ `cq` into `request`.
fn cq_event_out<R: Request>(s: &State<R>, file: FileKey, cq: u32, request: &mut R) -> Response {
    let Some(f) = s.files.get(&file) else {
        return Response::None;
    };
    let o = f.objects.get(cq);
    let out = IvCqEventOut {
        cq: f.objects.handle_of(cq),
        user_context: o.user_context(),
    };
    Response::write(request, out.as_bytes())
}

/// An armed CQ got an event: completes its notify waits, and queues the
/// event on its channel (completing a channel wait if there is one).
/// `vector`: the completion vector whose DPC delivers the event; the
/// requests it completes are completed by that DPC.
pub(crate) fn cq_event<R: Request>(s: &mut State<R>, file: FileKey, cq: u32, vector: Option<u32>) {
    let Some(f) = s.files.get_mut(&file) else {
        return;
    };
    let o = f.objects.get_mut(cq);
    if o.life != Life::Live {
        return;
    }
    let Body::Cq(c) = &mut o.body else { return };
    let waits = core::mem::take(&mut c.notify_waits);
    let channel = c.channel;
    if channel.is_some() {
        c.unacked_events += 1;
    }
    for key in waits {
        if let Some(mut r) = take_wait(s, key) {
            let out = cq_event_out(s, file, cq, &mut r);
            s.defer_on(vector, r, STATUS_SUCCESS, out);
        }
    }
    if let Some(ch) = channel {
        let f = s.files.get_mut(&file);
        if let Some(f) = f {
            let queued = match &mut f.objects.get_mut(ch).body {
                Body::Channel(chan) => {
                    // Into the room the channel's CQs took when created:
                    // nothing is allocated here.
                    let room = chan.events.len() < chan.events.capacity();
                    if room {
                        chan.events.push_back(cq);
                    }
                    room
                }
                _ => true,
            };
            if !queued {
                // No memory for the event: dropped and counted.
                if let Body::Cq(c) = &mut f.objects.get_mut(cq).body {
                    c.unacked_events = c.unacked_events.saturating_sub(1);
                }
                s.stats.cq_events_dropped += 1;
            }
        }
        deliver_channel(s, file, ch, vector);
    }
}

/// Pairs queued channel events with pending `GET_CQ_EVENT` waits; the
/// waits it completes are kept for `vector`'s DPC, if given.
pub(crate) fn deliver_channel<R: Request>(
    s: &mut State<R>,
    file: FileKey,
    ch: u32,
    vector: Option<u32>,
) {
    loop {
        let Some(Body::Channel(chan)) = s
            .files
            .get_mut(&file)
            .map(|f| &mut f.objects.get_mut(ch).body)
        else {
            return;
        };
        if chan.events.is_empty() {
            return;
        }
        let Some(key) = chan.waits.pop_front() else {
            return;
        };
        let Some(mut r) = take_wait(s, key) else {
            continue;
        };
        let Some(Body::Channel(chan)) = s
            .files
            .get_mut(&file)
            .map(|f| &mut f.objects.get_mut(ch).body)
        else {
            return;
        };
        let Some(cq) = chan.events.pop_front() else {
            return;
        };
        let out = cq_event_out(s, file, cq, &mut r);
        s.defer_on(vector, r, STATUS_SUCCESS, out);
    }
}

/// Completes every notify wait of a CQ with `status` (destroyed, failed).
pub(crate) fn fail_cq_waits<R: Request>(
    s: &mut State<R>,
    file: FileKey,
    cq: u32,
    status: NtStatus,
) {
    let Some(f) = s.files.get_mut(&file) else {
        return;
    };
    let Body::Cq(c) = &mut f.objects.get_mut(cq).body else {
        return;
    };
    for key in core::mem::take(&mut c.notify_waits) {
        if let Some(r) = take_wait(s, key) {
            s.defer(r, status, Response::None);
        }
    }
}

/// Queues an async event on a file and completes a waiting request.
pub(crate) fn async_event<R: Request>(s: &mut State<R>, file: FileKey, rec: AsyncRecord) {
    let Some(f) = s.files.get_mut(&file) else {
        return;
    };
    if f.cleaning_up {
        return;
    }
    if let Some(obj) = rec.object {
        f.objects.get_mut(obj).unacked_async += 1;
    }
    if f.async_events.len() >= MAX_QUEUED_ASYNC_EVENTS {
        if let Some(old) = f.async_events.pop_front() {
            if let Some(obj) = old.object {
                let o = f.objects.get_mut(obj);
                o.unacked_async = o.unacked_async.saturating_sub(1);
            }
        }
        s.stats.async_events_dropped += 1;
    }
    if let Some(f) = s.files.get_mut(&file) {
        if f.async_events.try_reserve(1).is_ok() {
            f.async_events.push_back(rec);
        } else {
            // No memory past the room the file's create took: the event
            // is dropped and counted, as past the queue's limit.
            if let Some(obj) = rec.object {
                let o = f.objects.get_mut(obj);
                o.unacked_async = o.unacked_async.saturating_sub(1);
            }
            s.stats.async_events_dropped += 1;
        }
    }
    deliver_async(s, file);
}

/// Pairs queued async events with pending `GET_ASYNC_EVENT` waits.
pub(crate) fn deliver_async<R: Request>(s: &mut State<R>, file: FileKey) {
    loop {
        let Some(f) = s.files.get_mut(&file) else {
            return;
        };
        if f.async_events.is_empty() {
            return;
        }
        let Some(key) = f.async_waits.pop_front() else {
            return;
        };
        let Some(mut r) = take_wait(s, key) else {
            continue;
        };
        let Some(f) = s.files.get_mut(&file) else {
            return;
        };
        let Some(rec) = f.async_events.pop_front() else {
            return;
        };
        let out = async_out(s, file, rec, &mut r);
        s.defer(r, STATUS_SUCCESS, out);
    }
}

/// Writes the `IvAsyncEventOut` of an async event record into `request`.
pub(crate) fn async_out<R: Request>(
    s: &State<R>,
    file: FileKey,
    rec: AsyncRecord,
    request: &mut R,
) -> Response {
    let (handle, user_context) = match (rec.object, s.files.get(&file)) {
        (Some(obj), Some(f)) => (f.objects.handle_of(obj), f.objects.get(obj).user_context()),
        _ => (0, 0),
    };
    let out = IvAsyncEventOut {
        event_type: rec.event_type,
        port_num: rec.port_num,
        handle,
        user_context,
    };
    Response::write(request, out.as_bytes())
}

/// The ABI event type, and which numbered object (kind, number) or port an
/// HCA async event is about.
pub(crate) fn classify(ev: AsyncEvent) -> (u32, Option<(Kind, u32)>, u32) {
    match ev {
        AsyncEvent::QpFatal(n) => (IV_EVENT_QP_FATAL, Some((Kind::Qp, n)), 0),
        AsyncEvent::QpRequestError(n) => (IV_EVENT_QP_REQ_ERR, Some((Kind::Qp, n)), 0),
        AsyncEvent::QpAccessError(n) => (IV_EVENT_QP_ACCESS_ERR, Some((Kind::Qp, n)), 0),
        AsyncEvent::CommEstablished(n) => (IV_EVENT_COMM_EST, Some((Kind::Qp, n)), 0),
        AsyncEvent::SqDrained(n) => (IV_EVENT_SQ_DRAINED, Some((Kind::Qp, n)), 0),
        AsyncEvent::PathMigrated(n) => (IV_EVENT_PATH_MIG, Some((Kind::Qp, n)), 0),
        AsyncEvent::PathMigrationError(n) => (IV_EVENT_PATH_MIG_ERR, Some((Kind::Qp, n)), 0),
        AsyncEvent::LastWqeReached(n) => (IV_EVENT_QP_LAST_WQE_REACHED, Some((Kind::Qp, n)), 0),
        AsyncEvent::SrqLimitReached(n) => (IV_EVENT_SRQ_LIMIT_REACHED, Some((Kind::Srq, n)), 0),
        AsyncEvent::SrqError(n) => (IV_EVENT_SRQ_ERR, Some((Kind::Srq, n)), 0),
        AsyncEvent::CqError(n) => (IV_EVENT_CQ_ERR, Some((Kind::Cq, n)), 0),
        AsyncEvent::PortActive(p) => (IV_EVENT_PORT_ACTIVE, None, u32::from(p)),
        AsyncEvent::PortError(p) => (IV_EVENT_PORT_ERR, None, u32::from(p)),
        AsyncEvent::DeviceFatal => (IV_EVENT_DEVICE_FATAL, None, 0),
    }
}

/// Completes every wait of `file` (cleanup: `STATUS_CANCELLED`; removal:
/// `STATUS_DEVICE_REMOVED`). Waits the cancel routine owns are left to it.
///
/// Allocates nothing: the waits are visited in key order, and each
/// completes in the room its pend reserved in the deferred queue.
pub(crate) fn fail_file_waits<R: Request>(s: &mut State<R>, file: FileKey, status: NtStatus) {
    let mut after = None;
    loop {
        let next = s
            .waits
            .iter()
            .find(|&(k, w)| w.file == file && after.is_none_or(|a| *k > a))
            .map(|(k, _)| *k);
        let Some(key) = next else { break };
        after = Some(key);
        if let Some(r) = take_wait(s, key) {
            s.defer(r, status, Response::None);
        }
    }
    if let Some(f) = s.files.get_mut(&file) {
        f.async_waits.clear();
        if status == STATUS_CANCELLED || status == STATUS_PROCESS_IS_TERMINATING {
            f.async_events.clear();
        }
    }
}

/// Async events a file's queue has room for from its create: those
/// never need memory (past them the queue grows fallibly, and an event it
/// has no memory for is dropped and counted).
pub(crate) const ASYNC_EVENTS_RESERVED: usize = 8;

/// An empty async event queue for a new file, with room for
/// [`ASYNC_EVENTS_RESERVED`] events.
///
/// # Errors
/// `STATUS_INSUFFICIENT_RESOURCES` when the room is refused.
pub(crate) fn new_queue() -> Result<VecDeque<AsyncRecord>, NtStatus> {
    let mut q = VecDeque::new();
    q.try_reserve_exact(ASYNC_EVENTS_RESERVED)
        .map_err(|_| irpverbs_abi::STATUS_INSUFFICIENT_RESOURCES)?;
    Ok(q)
}

/// Runs a notification verb under the device lock: answers it at once
/// (returned), or pends it in the wait table (`None`).
pub(crate) fn start<P: crate::Platform, H: crate::Hca>(
    d: &crate::Device<P, H>,
    s: &mut State<P::Request>,
    file: FileKey,
    verb: crate::verbs::Verb,
    mut request: P::Request,
) -> Option<Done<P::Request>> {
    use crate::verbs::Verb;
    let fail = |r: P::Request, st: NtStatus| Some((r, st, Response::None));
    if let Err(st) = s.file(file) {
        return fail(request, st);
    }
    match verb {
        Verb::CreateChannel(i) => {
            if i.flags != 0 || i.reserved != 0 {
                return fail(request, STATUS_INVALID_PARAMETER);
            }
            let limit = d.hca.caps().max_cq;
            match d.reserve(
                s,
                file,
                Body::Channel(crate::object::Channel::default()),
                limit,
            ) {
                Ok(idx) => {
                    let f = s.files.get_mut(&file)?;
                    f.objects.get_mut(idx).life = Life::Live;
                    let channel = f.objects.handle_of(idx);
                    let out = IvCreateChannelOut { channel };
                    let response = Response::write(&mut request, out.as_bytes());
                    Some((request, STATUS_SUCCESS, response))
                }
                Err(st) => fail(request, st),
            }
        }
        Verb::Destroy(h, Kind::Channel) => {
            let f = s.files.get_mut(&file)?;
            let idx = match f.objects.lookup(h.handle, Kind::Channel) {
                Ok(i) => i,
                Err(st) => return fail(request, st),
            };
            if f.objects.get(idx).dependents != 0 {
                return fail(request, STATUS_DEVICE_BUSY);
            }
            if let Body::Channel(ch) = &mut f.objects.get_mut(idx).body {
                for key in core::mem::take(&mut ch.waits) {
                    if let Some(r) = take_wait(s, key) {
                        s.defer(r, STATUS_DELETE_PENDING, Response::None);
                    }
                }
            }
            d.free_object(s, file, idx);
            Some((request, STATUS_SUCCESS, Response::None))
        }
        Verb::CqNotify(i) => {
            if i.reserved != 0 || i.arm > IV_NOTIFY_SOLICITED {
                return fail(request, STATUS_INVALID_PARAMETER);
            }
            let f = s.files.get_mut(&file)?;
            let idx = match f.objects.lookup(i.cq, Kind::Cq) {
                Ok(i) => i,
                Err(st) => return fail(request, st),
            };
            let Body::Cq(c) = &mut f.objects.get_mut(idx).body else {
                return fail(request, STATUS_INVALID_HANDLE);
            };
            if c.failed {
                return fail(request, STATUS_DATA_OVERRUN);
            }
            let arm = if i.arm == IV_NOTIFY_NO_ARM {
                None
            } else {
                c.arm_seq = c.arm_seq.wrapping_add(1);
                let sol = if i.arm == IV_NOTIFY_SOLICITED {
                    IV_CQ_ARM_SOLICITED
                } else {
                    0
                };
                Some((
                    c.ring.clone(),
                    IV_CQ_ARM_NEXT | sol | (c.arm_seq & 0x3FFF_FFFF),
                    c.cqn,
                ))
            };
            let room =
                s.files
                    .get_mut(&file)
                    .is_some_and(|f| match &mut f.objects.get_mut(idx).body {
                        Body::Cq(c) => c.notify_waits.try_reserve(1).is_ok(),
                        _ => false,
                    });
            if !room {
                return fail(request, STATUS_INSUFFICIENT_RESOURCES);
            }
            let key = match pend(s, file, request) {
                Ok(k) => k,
                Err((r, st)) => return Some((r, st, Response::None)),
            };
            if let Some(f) = s.files.get_mut(&file) {
                if let Body::Cq(c) = &mut f.objects.get_mut(idx).body {
                    c.notify_waits.push(key);
                }
            }
            if let Some((Some(ring), word, cqn)) = arm {
                ring.arm_word()
                    .store(word, core::sync::atomic::Ordering::Release);
                d.hca.cq_arm_doorbell(cqn);
            }
            None
        }
        Verb::GetCqEvent(h) => {
            let f = s.files.get_mut(&file)?;
            let ch = match f.objects.lookup(h.handle, Kind::Channel) {
                Ok(i) => i,
                Err(st) => return fail(request, st),
            };
            let room = match &mut f.objects.get_mut(ch).body {
                Body::Channel(c) => c.waits.try_reserve(1).is_ok(),
                _ => false,
            };
            if !room {
                return fail(request, STATUS_INSUFFICIENT_RESOURCES);
            }
            let key = match pend(s, file, request) {
                Ok(k) => k,
                Err((r, st)) => return Some((r, st, Response::None)),
            };
            if let Some(Body::Channel(c)) = s
                .files
                .get_mut(&file)
                .map(|f| &mut f.objects.get_mut(ch).body)
            {
                c.waits.push_back(key);
            }
            deliver_channel(s, file, ch, None);
            None
        }
        Verb::AckCqEvents(a) => {
            if a.count == 0 || a.event_type != 0 {
                return fail(request, STATUS_INVALID_PARAMETER);
            }
            let f = s.files.get_mut(&file)?;
            let idx = match f.objects.lookup(a.handle, Kind::Cq) {
                Ok(i) => i,
                Err(st) => return fail(request, st),
            };
            let Body::Cq(c) = &mut f.objects.get_mut(idx).body else {
                return fail(request, STATUS_INVALID_HANDLE);
            };
            if a.count > c.unacked_events {
                return fail(request, STATUS_INVALID_PARAMETER);
            }
            c.unacked_events -= a.count;
            Some((request, STATUS_SUCCESS, Response::None))
        }
        Verb::GetAsyncEvent => {
            let removed = s.removed;
            let f = s.files.get_mut(&file)?;
            if let Some(rec) = f.async_events.pop_front() {
                let out = async_out(s, file, rec, &mut request);
                return Some((request, STATUS_SUCCESS, out));
            }
            if removed {
                return fail(request, STATUS_DEVICE_REMOVED);
            }
            if s.files
                .get_mut(&file)
                .is_none_or(|f| f.async_waits.try_reserve(1).is_err())
            {
                return fail(request, STATUS_INSUFFICIENT_RESOURCES);
            }
            let key = match pend(s, file, request) {
                Ok(k) => k,
                Err((r, st)) => return Some((r, st, Response::None)),
            };
            if let Some(f) = s.files.get_mut(&file) {
                f.async_waits.push_back(key);
            }
            None
        }
        Verb::AckAsyncEvent(a) => {
            if a.count == 0 {
                return fail(request, STATUS_INVALID_PARAMETER);
            }
            if a.handle == 0 {
                return Some((request, STATUS_SUCCESS, Response::None));
            }
            let f = s.files.get_mut(&file)?;
            let idx = [Kind::Qp, Kind::Srq, Kind::Cq]
                .into_iter()
                .find_map(|k| f.objects.lookup(a.handle, k).ok());
            let Some(idx) = idx else {
                return fail(request, STATUS_INVALID_HANDLE);
            };
            let o = f.objects.get_mut(idx);
            if a.count > o.unacked_async {
                return fail(request, STATUS_INVALID_PARAMETER);
            }
            o.unacked_async -= a.count;
            Some((request, STATUS_SUCCESS, Response::None))
        }
        _ => fail(request, STATUS_INVALID_DEVICE_REQUEST),
    }
}
