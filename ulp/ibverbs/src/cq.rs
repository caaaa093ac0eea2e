//! CQs and completion channels: `ibv_create_cq`, `ibv_resize_cq`,
//! `ibv_destroy_cq`, the inline `ibv_poll_cq` / `ibv_req_notify_cq`
//! (`context->ops`), `ibv_create_comp_channel`, `ibv_get_cq_event`,
//! `ibv_ack_cq_events`, `ibv_destroy_comp_channel`.
//!
//! A completion channel's `fd` is an eventfd (semaphore mode) counting the
//! events queued for the program: a thread waits on the driver's
//! `IOCTL_IV_GET_CQ_EVENT` for the channel, queues each event (the CQ's
//! handle and user context, which is the `ibv_cq` itself) and counts it,
//! so that the fd works with `poll`, `epoll` and `O_NONBLOCK` as a kernel
//! channel does; `ibv_get_cq_event` takes one count and one event.
//! Destroying a CQ drops its events the program has not taken (and
//! acknowledges them to the driver), as the kernel drops them.

use std::ffi::{c_int, c_void};

use crate::os::{IvUserCq, IvUserCqClose, IvUserCqOpen, IvUserPollCq, IvUserReqNotifyCq};
use irpverbs_abi::*;
use zerocopy::{FromBytes, IntoBytes};

use crate::abi::*;
use crate::events::{Events, Mapped, destroy_mapped};
use crate::{COND, Context, MUTEX, context, errno_of, leak, null_with, set_errno};

/// A CQ: the `ibv_cq`, the driver's create response and the open speed
/// path.
#[repr(C)]
pub(crate) struct Cq {
    pub ibv: ibv_cq,
    pub out: IvCreateCqOut,
    pub user: *mut IvUserCq,
}

/// A completion channel: the `ibv_comp_channel` (its `fd` the events'
/// eventfd), the driver's channel and its events.
#[repr(C)]
pub(crate) struct Channel {
    pub ibv: ibv_comp_channel,
    pub handle: IvHandle,
    events: Option<Events<IvCqEventOut>>,
}

/// The CQ behind `cq` and its context.
///
/// # Safety
/// `cq` is NULL or from `ibv_create_cq`, not destroyed.
pub(crate) unsafe fn cq_of<'a>(cq: *mut ibv_cq) -> Option<(&'a Cq, &'a crate::Context)> {
    // SAFETY: forwarded (C contract).
    unsafe { crate::object_of(cq) }
}

impl crate::Object for Cq {
    fn context_ptr(&self) -> *mut ibv_context {
        self.ibv.context
    }
}

/// The handle of the CQ `cq`, 0 for NULL.
///
/// # Safety
/// As [`cq_of`].
pub(crate) unsafe fn cq_handle(cq: *mut ibv_cq) -> IvHandle {
    // SAFETY: forwarded.
    unsafe { cq.cast::<Cq>().as_ref() }.map_or(0, |q| q.out.cq)
}

/// `ibv_create_cq`: at least `cqe` entries, on `channel` (or none) and
/// completion vector `comp_vector`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    // SAFETY: a context from `ibv_open_device` (C contract).
    let Some(c) = (unsafe { context(ctx) }) else {
        return null_with(libc::EINVAL);
    };
    let (Ok(cqe), Ok(comp_vector)) = (u32::try_from(cqe), u32::try_from(comp_vector)) else {
        return null_with(libc::EINVAL);
    };
    // SAFETY: a channel's `ibv_comp_channel` is the first field of its
    // `Channel` (C contract: from `ibv_create_comp_channel`).
    let channel_handle = unsafe { channel.cast::<Channel>().as_ref() }.map_or(0, |ch| ch.handle);
    let q = leak(Cq {
        ibv: ibv_cq {
            context: ctx,
            channel,
            cq_context,
            handle: 0,
            cqe: 0,
            mutex: MUTEX,
            cond: COND,
            comp_events_completed: 0,
            async_events_completed: 0,
        },
        out: IvCreateCqOut::default(),
        user: std::ptr::null_mut(),
    });
    let created = c.client.create_cq_with(&IvCreateCqIn {
        cqe,
        comp_vector,
        channel: channel_handle,
        user_context: q as u64,
    });
    let out = match created {
        Ok(out) => out,
        Err(s) => {
            // SAFETY: just leaked, never handed out.
            drop(unsafe { Box::from_raw(q) });
            return null_with(errno_of(s));
        }
    };
    // SAFETY: the unmodified create response of a CQ of this file.
    let user = unsafe { IvUserCqOpen(c.file.handle(), &out) };
    if user.is_null() {
        let _ = c.client.destroy_cq(out.cq);
        // SAFETY: just leaked, never handed out.
        drop(unsafe { Box::from_raw(q) });
        return null_with(libc::ENOMEM);
    }
    // SAFETY: `q` is ours until returned.
    let qm = unsafe { &mut *q };
    qm.ibv.handle = out.cq as u32;
    qm.ibv.cqe = c_int::try_from(out.cqe).unwrap_or(c_int::MAX);
    qm.out = out;
    qm.user = user;
    // SAFETY: the program's channel (C contract), counted while CQs use it.
    if let Some(ch) = unsafe { channel.as_mut() } {
        ch.refcnt += 1;
    }
    q.cast()
}

/// `ibv_resize_cq`: the driver moves the CQ to a ring of at least `cqe`
/// entries; completions not yet polled move with it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    // SAFETY: a CQ from `ibv_create_cq` (C contract).
    let Some((_, c)) = (unsafe { cq_of(cq) }) else {
        return libc::EINVAL;
    };
    let Ok(cqe) = u32::try_from(cqe) else {
        return libc::EINVAL;
    };
    let q = cq.cast::<Cq>();
    // SAFETY: the speed path's view of the old ring goes first (the driver
    // refuses to resize a CQ that is open).
    unsafe { IvUserCqClose((*q).user) };
    // SAFETY: `q` is a live CQ.
    let handle = unsafe { (*q).out.cq };
    let resized = c.client.resize_cq(handle, cqe);
    let (out, status) = match resized {
        Ok(r) => (
            IvCreateCqOut {
                cqe: r.cqe,
                ring: r.ring,
                // SAFETY: `q` is a live CQ.
                ..unsafe { (*q).out }
            },
            0,
        ),
        // SAFETY: as above.
        Err(s) => (unsafe { (*q).out }, errno_of(s)),
    };
    // SAFETY: the CQ's current create/resize response.
    let user = unsafe { IvUserCqOpen(c.file.handle(), &out) };
    // SAFETY: `q` is a live CQ; the program does not use it during the
    // resize (as with rdma-core).
    let qm = unsafe { &mut *q };
    qm.user = user;
    qm.out = out;
    qm.ibv.cqe = c_int::try_from(out.cqe).unwrap_or(c_int::MAX);
    if user.is_null() {
        return libc::ENOMEM;
    }
    status
}

/// `ibv_destroy_cq`: `EBUSY` while QPs use it or events of it are not
/// acknowledged.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    // SAFETY: a CQ from `ibv_create_cq` (C contract).
    let Some((_, c)) = (unsafe { cq_of(cq) }) else {
        return libc::EINVAL;
    };
    // SAFETY: a CQ of `leak`, not in use (C contract).
    unsafe { destroy_mapped(cq.cast::<Cq>(), c) }
}

impl Mapped for Cq {
    fn settle(&self, c: &Context) {
        // Its completion events the program has not taken go,
        // acknowledged; and its asynchronous ones.
        // SAFETY: the channel (if any) outlives its CQs.
        let channel = unsafe { self.ibv.channel.cast::<Channel>().as_ref() };
        if let Some(ev) = channel.and_then(|ch| ch.events.as_ref()) {
            let dropped = ev.drop_where(|e| e.cq == self.out.cq).len();
            if dropped > 0 {
                let _ = c
                    .client
                    .ack_cq_events(self.out.cq, u32::try_from(dropped).unwrap_or(u32::MAX));
            }
        }
        c.drop_async_of(self.out.cq);
    }

    fn destroy(&self, c: &Context) -> Result<(), NtStatus> {
        c.client.destroy_cq(self.out.cq)
    }

    unsafe fn close(&mut self) {
        // SAFETY: the ring the speed path opened (caller: once).
        unsafe { IvUserCqClose(self.user) };
    }

    unsafe fn reopen(&mut self, c: &Context) {
        // SAFETY: the CQ the driver kept (caller).
        self.user = unsafe { IvUserCqOpen(c.file.handle(), &self.out) };
    }

    fn destroyed(&mut self) {
        // SAFETY: the channel (if any) outlives its CQs.
        if let Some(ch) = unsafe { self.ibv.channel.as_mut() } {
            ch.refcnt -= 1;
        }
    }
}

fn wc_of(e: &IvCqe) -> ibv_wc {
    let imm = if e.wc_flags & IV_WC_WITH_IMM != 0 {
        // Immediate data in network byte order, as the wire carried it.
        e.imm_or_inv.to_be()
    } else {
        e.imm_or_inv
    };
    ibv_wc {
        wr_id: e.wr_id,
        status: e.status as c_int,
        opcode: e.opcode as c_int,
        vendor_err: e.vendor_err,
        byte_len: e.byte_len,
        imm_data: imm,
        qp_num: e.qp_num,
        src_qp: e.src_qp,
        wc_flags: e.wc_flags,
        pkey_index: e.pkey_index,
        slid: e.slid,
        sl: e.sl,
        dlid_path_bits: e.dlid_path_bits,
    }
}

/// Completions taken from the ring per step (on the stack).
const POLL_STEP: usize = 16;

/// `ops.poll_cq` (`ibv_poll_cq`): up to `num_entries` completions, oldest
/// first; a negative errno if the CQ is broken.
pub(crate) unsafe extern "C" fn poll_cq(
    cq: *mut ibv_cq,
    num_entries: c_int,
    wc: *mut ibv_wc,
) -> c_int {
    // SAFETY: a CQ from `ibv_create_cq` (C contract).
    let Some(q) = (unsafe { cq.cast::<Cq>().as_ref() }) else {
        return -libc::EINVAL;
    };
    let want = usize::try_from(num_entries).unwrap_or(0);
    if want > 0 && wc.is_null() {
        return -libc::EINVAL;
    }
    // A poll for one completion (what latency loops do) takes it through
    // a buffer of one, not one of POLL_STEP the compiler must zero.
    if want == 1 {
        // SAFETY: forwarded; `wc` holds one entry.
        unsafe { poll_steps::<1>(q, want, wc) }
    } else {
        // SAFETY: forwarded; `wc` holds `want` entries.
        unsafe { poll_steps::<POLL_STEP>(q, want, wc) }
    }
}

/// Polls `want` completions in steps of `N` through a buffer of `N`.
///
/// # Safety
/// `q` is open; `wc` holds `want` entries.
#[inline(always)]
unsafe fn poll_steps<const N: usize>(q: &Cq, want: usize, wc: *mut ibv_wc) -> c_int {
    let mut buf = [IvCqe::default(); N];
    let mut got = 0usize;
    while got < want {
        let step = (want - got).min(N);
        // SAFETY: an open speed-path CQ; `buf` holds `step` entries.
        let n = unsafe { IvUserPollCq(q.user, buf.as_mut_ptr(), step as u32) };
        if n < 0 {
            return -errno_of(n);
        }
        let n = n as usize;
        for (i, e) in buf[..n].iter().enumerate() {
            // SAFETY: the caller's array holds `want` entries.
            unsafe { wc.add(got + i).write(wc_of(e)) };
        }
        got += n;
        if n < step {
            break;
        }
    }
    got as c_int
}

/// `ops.req_notify_cq` (`ibv_req_notify_cq`).
pub(crate) unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    // SAFETY: a CQ from `ibv_create_cq` (C contract).
    let Some(q) = (unsafe { cq.cast::<Cq>().as_ref() }) else {
        return libc::EINVAL;
    };
    // SAFETY: an open speed-path CQ.
    errno_of(unsafe { IvUserReqNotifyCq(q.user, solicited_only) })
}

/// `ibv_create_comp_channel`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_comp_channel(ctx: *mut ibv_context) -> *mut ibv_comp_channel {
    // SAFETY: a context from `ibv_open_device` (C contract).
    let Some(c) = (unsafe { context(ctx) }) else {
        return null_with(libc::EINVAL);
    };
    let (status, out) = c.client.raw(
        IOCTL_IV_CREATE_CHANNEL,
        IvAllocPdIn::default().as_bytes(),
        size_of::<IvCreateChannelOut>(),
    );
    if !nt_success(status) {
        return null_with(errno_of(status));
    }
    let Ok(created) = IvCreateChannelOut::read_from_bytes(&out) else {
        return null_with(libc::EIO);
    };
    let handle = created.channel;
    let destroy = || {
        let _ = c.client.raw(
            IOCTL_IV_DESTROY_CHANNEL,
            IvHandleIn { handle }.as_bytes(),
            0,
        );
    };
    let events = match Events::start(
        c.file,
        IOCTL_IV_GET_CQ_EVENT,
        IvHandleIn { handle }.as_bytes().to_vec(),
    ) {
        Ok(e) => e,
        Err(e) => {
            destroy();
            return null_with(e);
        }
    };
    leak(Channel {
        ibv: ibv_comp_channel {
            context: ctx,
            fd: events.fd(),
            refcnt: 0,
        },
        handle,
        events: Some(events),
    })
    .cast()
}

/// `ibv_get_cq_event`: the next CQ event of `channel` (waits while there
/// is none, unless its fd is non-blocking: then -1 with `EAGAIN`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    if channel.is_null() || cq.is_null() || cq_context.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: a channel's `ibv_comp_channel` is the first field of its
    // `Channel`.
    let chan = unsafe { &*channel.cast::<Channel>() };
    let Some(events) = &chan.events else {
        set_errno(libc::EINVAL);
        return -1;
    };
    let event = match events.take() {
        Ok(e) => e,
        Err(e) => {
            set_errno(e);
            return -1;
        }
    };
    let ev_cq = event.user_context as usize as *mut ibv_cq;
    // SAFETY: the user context of a CQ on this channel is the `ibv_cq`,
    // alive while it has unacknowledged events (the driver refuses its
    // destroy).
    let ctx = unsafe { (*ev_cq).cq_context };
    // SAFETY: a non-null out pointer (checked).
    unsafe { cq.write(ev_cq) };
    // SAFETY: as above.
    unsafe { cq_context.write(ctx) };
    0
}

/// `ibv_ack_cq_events`: acknowledges `nevents` events of `cq`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: u32) {
    // SAFETY: a CQ from `ibv_create_cq` (C contract).
    let Some((q, c)) = (unsafe { cq_of(cq) }) else {
        return;
    };
    if nevents == 0 {
        return;
    }
    if c.client.ack_cq_events(q.out.cq, nevents).is_ok() {
        // SAFETY: a live CQ; the counter is the program's to read.
        unsafe { (*cq).comp_events_completed = (*cq).comp_events_completed.wrapping_add(nevents) };
    }
}

/// `ibv_destroy_comp_channel`: `EBUSY` while CQs use it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    // SAFETY: a channel from `ibv_create_comp_channel` (C contract).
    let Some(ch) = (unsafe { channel.cast::<Channel>().as_mut() }) else {
        return libc::EINVAL;
    };
    // SAFETY: its context is open (C contract).
    let Some(c) = (unsafe { context(ch.ibv.context) }) else {
        return libc::EINVAL;
    };
    if ch.ibv.refcnt > 0 {
        return libc::EBUSY;
    }
    let (status, _) = c.client.raw(
        IOCTL_IV_DESTROY_CHANNEL,
        IvHandleIn { handle: ch.handle }.as_bytes(),
        0,
    );
    if !nt_success(status) {
        return errno_of(status);
    }
    // The destroy ended the thread's wait.
    if let Some(ev) = ch.events.take() {
        ev.finish();
    }
    // SAFETY: from `leak`, destroyed once.
    drop(unsafe { Box::from_raw(channel.cast::<Channel>()) });
    0
}
