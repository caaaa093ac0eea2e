//! The connection manager in the device: one [`irpverbs_cm::Engine`] per
//! [`Device`], under the device lock.
//!
//! - **Receive.** The HCA announces MADs its GSI (QP1) received with
//!   [`Event::Mad`](crate::Event::Mad); the DPC takes them
//!   ([`Hca::poll_mad`]) and feeds each to [`Engine::receive`] right there,
//!   at DISPATCH_LEVEL, with no thread switch. A MAD the engine's parser
//!   refuses is counted ([`DeviceStats::cm_mads_malformed`]).
//! - **Send.** After every engine call the device drains
//!   [`Engine::poll_transmit`] under its lock and, with the lock released,
//!   hands each MAD to [`Hca::send_mad`] (a UD send from QP1 with Q_Key
//!   0x80010000). A MAD the HCA refuses is counted
//!   ([`DeviceStats::cm_send_failures`]) and left to the CM's
//!   retransmission, as a MAD lost on the wire.
//! - **Time.** The platform glue gives the device a way to arm a one-shot
//!   platform timer ([`Device::set_cm_timer`]: on Windows a KTIMER and
//!   KDPC, in host mode a `HostTimer`), whose DPC calls
//!   [`Device::cm_timer`]. The device arms it at
//!   [`Engine::next_deadline`] whenever that changes, on the clock of
//!   [`Platform::now_ns`]. Retransmissions, giving up and time wait run
//!   from there.
//!
//! - **CEPs.** Objects of the per-file handle table ([`Kind::Cep`]), each
//!   naming an engine CEP. `IOCTL_IV_GET_CEP_EVENT` follows the polling
//!   model: when the engine names a CEP ([`Engine::poll_ready`]) the device
//!   takes all its events ([`Engine::poll_event`] until `None`), queues
//!   them on the CEP, and completes its pended request with the oldest;
//!   one request per CEP (a second: `STATUS_DEVICE_BUSY`). A connect
//!   request's event carries the new connection's CEP, made in the
//!   listener's file (if the file has no room, the engine rejects it).
//!   Destroying a CEP (or closing its file) destroys the engine's CEP,
//!   which sends the REJ or DREQ its state asks for, and completes its
//!   pended requests with `STATUS_CANCELLED`.
//!
//! ## Multi-phase requests
//!
//! Each is one request (IRP) the device moves through phases; a phase is a
//! QP modify command posted to the HCA (the request travels with it and
//! the next phase runs from its completion in the DPC) or a CM event it
//! waits for (the request is parked on the CEP and the event, taken from
//! the CEP's queue before the owner sees it, resumes it; while parked the
//! request is cancelable, and a cancelled connect or accept is rejected at
//! the next event or request on the CEP). Nothing blocks.
//! Every QP attribute comes from the engine.
//!
//! | request | phases | completes |
//! |---|---|---|
//! | `CM_CONNECT` | QP to INIT (`ConnectParams::init_attr`); REQ (`connect`); on the REP: QP to RTR, RTS (`qp_attr`); RTU | after the RTU is sent |
//! | `CM_ACCEPT` | QP to INIT, RTR, RTS (`accept_qp_attr`); REP (`accept`) | on the RTU, or on the QP's first receive (COMM_EST: `notify_established`) |
//! | `CM_REJECT` | REJ (`reject`) | at once |
//! | `CM_DISCONNECT`, established | DREQ (`disconnect`); QP to ERR | on the DREP |
//! | `CM_DISCONNECT`, after a DREQ | QP to ERR; DREP (`drep`) | after the DREP is sent |
//! | `CM_MRA` | MRA (`mra`) | at once |
//! | `SIDR_REQUEST` | SIDR_REQ (`sidr_request`) | on the SIDR_REP (its values as output) |
//! | `SIDR_REPLY` | SIDR_REP (`sidr_reply`) | at once |
//! | `CM_CONNECT` without a QP | REQ (`connect`) | on the REP |
//! | `CM_ACCEPT` without a QP | REP (`accept`) | on the RTU, or the first receive of the QP numbered in it |
//! | `CM_DISCONNECT` without a QP | DREQ (`disconnect`) or DREP (`drep`) | on the DREP, or at once |
//! | `CM_ESTABLISH` | RTU (`rtu`) | at once |
//! | `CM_INIT_QP_ATTR` | the attributes (`qp_attr`, `accept_qp_attr`) | at once, whatever is in progress |
//!
//! Without a QP handle the caller moves its QP itself, with the
//! attributes `CM_INIT_QP_ATTR` gives (rdma_cm's ids without a QP); the
//! CEP then holds no QP.
//!
//! Private data (up to each message's size) and the connection's
//! parameters travel in the requests; the events carry the received
//! message's values and private data. A peer-to-peer `CM_CONNECT` whose
//! REQ crossed the peer's goes on as an accept. Kernel ULPs may take a
//! CEP's events through a callback at DISPATCH_LEVEL instead
//! ([`Device::set_cep_callback`], [`Device::poll_cep_event`]).
//!
//! Errors: `STATUS_INVALID_HANDLE` (no such CEP or QP in the file),
//! `STATUS_INVALID_PARAMETER` (not an RC QP, a value out of range),
//! `STATUS_INVALID_DEVICE_STATE` (the CEP is not in a state the request
//! starts from), `STATUS_DEVICE_BUSY` (a request in progress on the CEP, or
//! the QP busy with another modify); then, while in progress: a QP
//! modify's failure status, `STATUS_CONNECTION_REFUSED` (a REJ),
//! `STATUS_IO_TIMEOUT` (the CM gave up after its retries),
//! `STATUS_CANCELLED` (the CEP was destroyed), `STATUS_DEVICE_REMOVED`.
//!
//! IRQL: every entry point runs at IRQL <= DISPATCH_LEVEL (the IOCTL
//! queue, the DPC, the timer's DPC) under the device's spin lock, and
//! calls the HCA (`send_mad`, the timer's arming) after releasing it.
//!
//! [`DeviceStats::cm_mads_malformed`]: crate::DeviceStats::cm_mads_malformed
//! [`DeviceStats::cm_send_failures`]: crate::DeviceStats::cm_send_failures

use alloc::boxed::Box;
use alloc::sync::Arc;
use alloc::vec::Vec;
use irpverbs_ring::Shared;
use zerocopy::IntoBytes;

use irpverbs_cm::msg::{AprStatus, Info, RejReason, SidrStatus};
use irpverbs_cm::{
    AcceptParams, Config, ConnectParams, Engine, LapState, MadAddr, QpModify, QpTarget, SidrParams,
    SidrReplyParams, State as CmState, Transmit,
};

use irpverbs_abi::*;

use crate::device::{Response, State, own_frame};
use crate::fallible::try_to_vec;
use crate::hca::{MadIn, MadOut};
use crate::notify::{Done, pend, pend_reserved, take_wait};
use crate::verbs::Verb;

/// Events a CEP object holds for its owner (the engine queues no more per
/// CEP: a connection's reply, establishment, disconnect request and reply,
/// or a listener's next requests, which each made a CEP of their own),
/// taken when the CEP is made.
const CEP_EVENTS: usize = 4;

/// Connection requests a listener holds for its owner before further ones
/// are dropped (the remote retries them): its backlog, taken at listen.
const LISTEN_BACKLOG: usize = 64;

/// A listener's backlog room ([`LISTEN_BACKLOG`]).
fn reserve_backlog<R>(s: &mut State<R>, file: FileKey, idx: u32) -> Result<(), NtStatus> {
    let c = cep_mut(s, file, idx).ok_or(STATUS_INVALID_HANDLE)?;
    let more = LISTEN_BACKLOG.saturating_sub(c.events.len());
    c.events
        .try_reserve_exact(more)
        .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)
}
use crate::object::{Body, Life};
use crate::{Device, FileKey, Hca, Kind, Platform, Request, SpinLock};

/// Arms the CM's platform timer to fire at an absolute time (ns on the
/// clock of [`Platform::now_ns`]), replacing any earlier arming. Called
/// with no driver lock held, at IRQL <= DISPATCH_LEVEL. Made by
/// [`cm_timer_arm`], which allocates it fallibly.
pub type CmTimerArm = Shared<Box<dyn Fn(u64) + Send + Sync>>;

/// The arming function `arm` as the device takes it ([`CmTimerArm`]): the
/// closure's box and its reference count, both allocated fallibly.
///
/// IRQL: <= DISPATCH_LEVEL.
///
/// # Errors
/// `STATUS_INSUFFICIENT_RESOURCES` when either allocation is refused;
/// nothing stays allocated.
pub fn cm_timer_arm(arm: impl Fn(u64) + Send + Sync + 'static) -> Result<CmTimerArm, NtStatus> {
    let arm: Box<dyn Fn(u64) + Send + Sync> =
        irpverbs_ring::try_box(arm).map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
    Shared::try_new(arm).map_err(|_| STATUS_INSUFFICIENT_RESOURCES)
}

/// What a kernel ULP's CEP callback is told: the CEP has events; poll them
/// with [`Device::poll_cep_event`] until it returns `None`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CepReady {
    /// The file the CEP is in.
    pub file: FileKey,
    /// The CEP.
    pub cep: IvHandle,
    /// Its `user_context`.
    pub user_context: u64,
}

/// A kernel ULP's CEP callback ([`Device::set_cep_callback`]).
///
/// Called once each time the CEP goes from no events to some (and once
/// more after a poll that returned `None` if events came since): the owner
/// then polls until `None`, which re-arms it.
///
/// IRQL: DISPATCH_LEVEL, whatever the context that queued it: the device
/// runs the callbacks holding a spin lock of their own
/// ([`CEP_CALLBACK_LOCK`](crate::platform::CEP_CALLBACK_LOCK)), one at a
/// time (callbacks never run concurrently on one device, and never inside
/// one another), with no device lock held, so a callback may call back
/// into the device: poll events, issue requests (`CM_ACCEPT`, `CM_REJECT`,
/// `CM_MRA`, ... as internal device control IRPs), destroy the CEP. It
/// must not block, nor set or clear its own CEP's callback (that waits for
/// the callback to return).
#[derive(Clone)]
pub enum CepCallback {
    /// A closure (Rust kernel ULPs).
    Closure(Arc<dyn Fn(CepReady) + Send + Sync>),
    /// A function and two words of context: what a C kernel ULP registers
    /// through the direct-call table, with nothing to allocate.
    Function(CepFunction),
}

/// A CEP callback without a closure: `call(words, ready)`.
#[derive(Clone, Copy, Debug)]
pub struct CepFunction {
    /// Called with `words` and the CEP.
    pub call: fn([usize; 2], CepReady),
    /// The registrant's context (a C function and its context pointer).
    pub words: [usize; 2],
}

impl CepCallback {
    fn call(&self, ready: CepReady) {
        match self {
            Self::Closure(f) => f(ready),
            Self::Function(f) => (f.call)(f.words, ready),
        }
    }
}

impl core::fmt::Debug for CepCallback {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Closure(_) => f.write_str("CepCallback::Closure"),
            Self::Function(func) => f.debug_tuple("CepCallback::Function").field(func).finish(),
        }
    }
}

/// The device's CM (part of the state under the device lock).
pub(crate) struct Cm {
    pub(crate) engine: Engine,
    /// The timer's arming function, once the glue gave one.
    arm: Option<CmTimerArm>,
    /// The deadline the timer is armed for.
    armed: Option<u64>,
}

/// What to do after releasing the device lock: send MADs, arm the timer.
#[must_use]
pub(crate) struct CmFlush {
    arm: Option<(CmTimerArm, u64)>,
}

impl Cm {
    /// The CM of a CA whose node GUID is `ca_guid`; communication IDs
    /// rotated by `seed`.
    pub(crate) fn new(ca_guid: u64, seed: u32) -> Self {
        let mut cfg = Config::new(ca_guid);
        cfg.id_seed = seed;
        Self {
            engine: Engine::new(cfg),
            arm: None,
            armed: None,
        }
    }

    /// The timer to arm if the engine's deadline changed; its transmits
    /// stay queued in the engine until [`Device::cm_flush`] takes them
    /// (one at a time: no list to allocate).
    pub(crate) fn take(&mut self) -> CmFlush {
        let next = self.engine.next_deadline();
        let arm = match (&self.arm, next) {
            (Some(f), Some(d)) if self.armed != Some(d) => {
                self.armed = Some(d);
                Some((Shared::clone(f), d))
            }
            _ => None,
        };
        CmFlush { arm }
    }
}

/// Where a received MAD came from, as the engine takes it.
pub(crate) fn mad_addr(m: &MadIn) -> MadAddr {
    MadAddr {
        port_num: m.port,
        pkey_index: m.pkey_index,
        sgid_index: m.dgid_index,
        gid: m.sgid,
        lid: 0,
        qpn: m.src_qpn,
        sl: 0,
        traffic_class: m.traffic_class,
        hop_limit: m.hop_limit,
        flow_label: m.flow_label,
    }
}

/// A transmit as the HCA's GSI sends it.
pub(crate) fn mad_out(t: &Transmit) -> MadOut {
    MadOut {
        port: t.dest.port_num,
        sgid_index: t.dest.sgid_index,
        dgid: t.dest.gid,
        dest_qpn: t.dest.qpn,
        traffic_class: t.dest.traffic_class,
        flow_label: t.dest.flow_label,
        hop_limit: if t.dest.hop_limit == 0 {
            64
        } else {
            t.dest.hop_limit
        },
        mad: t.mad,
    }
}

impl<P: Platform, H: Hca> Device<P, H> {
    /// Takes every MAD the HCA's GSI holds into the CM (the DPC, on
    /// [`crate::Event::Mad`], under the device lock). Out of line: its
    /// MAD buffers are not on the stack of the delivery that follows
    /// (docs/stack-budget.md).
    #[inline(never)]
    pub(crate) fn cm_receive(&self, s: &mut State<P::Request>) {
        let now = self.platform.now_ns();
        while let Some(m) = self.hca.poll_mad() {
            s.stats.mads_received += 1;
            if s.cm.engine.receive(now, &mad_addr(&m), &m.mad).is_err() {
                s.stats.cm_mads_malformed += 1;
            }
        }
    }

    /// Sends the MADs and arms the timer `flush` holds (no lock held).
    pub(crate) fn cm_flush(&self, flush: CmFlush) {
        let mut failed = 0u64;
        while let Some(t) = self.state.lock(|s| s.cm.engine.poll_transmit()) {
            if self.hca.send_mad(&mad_out(&t)).is_err() {
                failed += 1;
            }
        }
        if failed != 0 {
            self.state.lock(|s| s.stats.cm_send_failures += failed);
        }
        if let Some((arm, deadline)) = flush.arm {
            (**arm)(deadline);
        }
    }

    /// Gives the device the function that arms its CM timer (see
    /// [`CmTimerArm`]); the platform timer's DPC must call
    /// [`Device::cm_timer`]. Arms it at once if the CM waits for time.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    pub fn set_cm_timer(&self, arm: CmTimerArm) {
        let flush = self.state.lock(|s| {
            s.cm.arm = Some(arm);
            s.cm.armed = None;
            s.cm.take()
        });
        self.cm_flush(flush);
    }

    /// Forgets the timer's arming function (before the driver unloads and
    /// cancels the timer): the CM's timers stop.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    pub fn stop_cm_timer(&self) {
        self.state.lock(|s| {
            s.cm.arm = None;
            s.cm.armed = None;
        });
    }

    /// The CM timer's DPC: runs the CM's timers due now (retransmissions,
    /// timeouts, time wait), sends what they produced and re-arms the
    /// timer at the next deadline.
    ///
    /// IRQL: DISPATCH_LEVEL (any IRQL <= DISPATCH_LEVEL).
    // An entry of the stack budget (docs/stack-budget.md): kept out of
    // line so that the checker finds it by name.
    #[inline(never)]
    pub fn cm_timer(&self) {
        let now = self.platform.now_ns();
        let (flush, done) = self.state.lock(|s| {
            s.cm.armed = None;
            s.cm.engine.on_timer(now);
            self.cep_deliver(s);
            (s.cm.take(), crate::device::Drain)
        });
        self.complete_all(done);
        self.cm_flush(flush);
    }

    /// The CM engine's counters.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    pub fn cm_stats(&self) -> irpverbs_cm::Stats {
        self.state.lock(|s| s.cm.engine.stats())
    }

    /// Makes the CEP `cep` of `file` a kernel ULP's (or gives it back to
    /// `GET_CEP_EVENT` with `None`): from now on, when it has events the
    /// device calls `callback` (see [`CepCallback`]) instead of completing
    /// a pended `GET_CEP_EVENT`, and the owner takes them with
    /// [`Device::poll_cep_event`]. The CEPs of the connect requests it
    /// receives as a listener get the same callback (each may be given
    /// another). Called at once if the CEP already has events.
    ///
    /// Rundown: when this returns, the CEP's previous callback is not
    /// running (if a call of it was running on another processor, this
    /// waited for it to return) and is never called again. So after
    /// `set_cep_callback(.., None)` the owner may free what its callback
    /// uses. A CEP destroyed (or its file closed) is never called back
    /// again either, but a call already running may still be: clear the
    /// callback first to know it returned.
    ///
    /// IRQL: <= DISPATCH_LEVEL. Not from the CEP's own callback: it would
    /// wait for itself (any other CEP's callback may call it).
    ///
    /// # Errors
    /// `STATUS_INVALID_HANDLE` (no such CEP in the file),
    /// `STATUS_DEVICE_BUSY` (a `GET_CEP_EVENT` is pended on it); nothing
    /// changes then.
    pub fn set_cep_callback(
        &self,
        file: FileKey,
        cep: IvHandle,
        callback: Option<CepCallback>,
    ) -> Result<(), NtStatus> {
        let (r, done, flush) = self.state.lock(|s| {
            let r = (|| {
                let idx = s.file(file)?.objects.lookup(cep, Kind::Cep)?;
                let wait = cep_mut(s, file, idx).and_then(|c| c.wait);
                if wait.is_some_and(|k| s.waits.contains_key(&k)) {
                    return Err(STATUS_DEVICE_BUSY);
                }
                let c = cep_mut(s, file, idx).ok_or(STATUS_INVALID_HANDLE)?;
                c.callback = callback;
                c.armed = true;
                self.cm_route(s, file, idx);
                self.cep_serve(s, file, idx);
                Ok(())
            })();
            (r, crate::device::Drain, s.cm.take())
        });
        if r.is_ok() {
            // The rundown: a call of the previous callback that started
            // before the change returns before this does.
            while self.state.lock(|s| s.cep_running == Some((file, cep))) {
                core::hint::spin_loop();
            }
        }
        self.complete_all(done);
        self.cm_flush(flush);
        r
    }

    /// Takes the CEP's next event (the polling model of kernel ULPs, whose
    /// CEP has a callback: [`Device::set_cep_callback`]); `None` when it has
    /// none, which re-arms the callback. Works on any CEP without a pended
    /// `GET_CEP_EVENT`.
    ///
    /// IRQL: <= DISPATCH_LEVEL (typically from the callback).
    ///
    /// # Errors
    /// `STATUS_INVALID_HANDLE` (no such CEP in the file),
    /// `STATUS_DEVICE_BUSY` (a `GET_CEP_EVENT` is pended on it).
    pub fn poll_cep_event(
        &self,
        file: FileKey,
        cep: IvHandle,
    ) -> Result<Option<IvCepEventOut>, NtStatus> {
        let (r, done, flush) = self.state.lock(|s| {
            let r = (|| {
                let idx = s.file(file)?.objects.lookup(cep, Kind::Cep)?;
                let wait = cep_mut(s, file, idx).and_then(|c| c.wait);
                if wait.is_some_and(|k| s.waits.contains_key(&k)) {
                    return Err(STATUS_DEVICE_BUSY);
                }
                self.cm_route(s, file, idx);
                let c = cep_mut(s, file, idx).ok_or(STATUS_INVALID_HANDLE)?;
                let ev = c.events.pop_front();
                if ev.is_none() {
                    c.armed = true;
                }
                Ok(ev)
            })();
            (r, crate::device::Drain, s.cm.take())
        });
        self.complete_all(done);
        self.cm_flush(flush);
        r
    }

    /// Runs the CEP callbacks that became due (no lock held; from
    /// [`Device::complete_all`]), at DISPATCH_LEVEL under the callbacks'
    /// own lock, one at a time. One caller runs them all: a caller that
    /// finds another running them (or finds itself inside a callback)
    /// leaves its calls to that one, which looks again before it stops.
    pub(crate) fn run_cep_callbacks(&self) {
        use core::sync::atomic::Ordering;
        loop {
            if !self.cep_calls_pending.load(Ordering::SeqCst) {
                return;
            }
            if self
                .cep_draining
                .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
            {
                return;
            }
            self.cep_calls_pending.store(false, Ordering::SeqCst);
            self.cep_gate.lock(|_| {
                // One at a time: the queue keeps its memory (its room is
                // taken when CEPs are made). The CEP's callback is taken
                // when its call is due, so a callback cleared (or a CEP
                // destroyed) since the call was queued is not called.
                while let Some(callback) = self.state.lock(|s| {
                    s.cep_running = None;
                    while let Some(ready) = s.cep_calls.pop_front() {
                        let Ok(idx) = s
                            .file(ready.file)
                            .and_then(|f| f.objects.lookup(ready.cep, Kind::Cep))
                        else {
                            continue;
                        };
                        let Some(cb) = cep_mut(s, ready.file, idx).and_then(|c| c.callback.clone())
                        else {
                            continue;
                        };
                        s.cep_running = Some((ready.file, ready.cep));
                        return Some((cb, ready));
                    }
                    None
                }) {
                    let (callback, ready) = callback;
                    callback.call(ready);
                }
            });
            self.cep_draining.store(false, Ordering::SeqCst);
        }
    }
}

/// The statuses of the CM's refusals.
pub(crate) fn cm_status(e: irpverbs_cm::CmError) -> NtStatus {
    use irpverbs_cm::CmError;
    match e {
        CmError::UnknownCep => STATUS_INVALID_HANDLE,
        CmError::InvalidState(_) => STATUS_INVALID_DEVICE_STATE,
        CmError::InvalidParam(_) => STATUS_INVALID_PARAMETER,
        CmError::ServiceInUse => STATUS_DEVICE_BUSY,
        CmError::TableFull => STATUS_INSUFFICIENT_RESOURCES,
    }
}

/// The CEP object at `idx` of `file`.
fn cep_mut<R>(s: &mut State<R>, file: FileKey, idx: u32) -> Option<&mut crate::object::Cep> {
    match &mut s.files.get_mut(&file)?.objects.get_mut(idx).body {
        Body::Cep(c) => Some(c),
        _ => None,
    }
}

impl<P: Platform, H: Hca> Device<P, H> {
    /// Runs a CEP verb (`CREATE_CEP`, `LISTEN`, `GET_CEP_EVENT`,
    /// `DESTROY_CEP`) under the device lock: answered at once (returned)
    /// or pended (`None`).
    pub(crate) fn cep_start(
        &self,
        s: &mut State<P::Request>,
        file: FileKey,
        verb: Verb,
        mut request: P::Request,
    ) -> Option<Done<P::Request>> {
        let fail = |r: P::Request, st: NtStatus| Some((r, st, Response::None));
        match verb {
            Verb::CreateCep(i) => {
                let id = match s.cm.engine.create(0) {
                    Ok(id) => id,
                    Err(e) => return fail(request, cm_status(e)),
                };
                match self.new_cep(s, file, id, i.user_context, None) {
                    Ok(cep) => {
                        let out = IvCreateCepOut { cep };
                        let response = Response::write(&mut request, out.as_bytes());
                        Some((request, STATUS_SUCCESS, response))
                    }
                    Err(st) => {
                        let _ = s.cm.engine.discard(id, self.platform.now_ns());
                        fail(request, st)
                    }
                }
            }
            Verb::Listen(i) => {
                let idx = match s
                    .file(file)
                    .and_then(|f| f.objects.lookup(i.cep, Kind::Cep))
                {
                    Ok(i) => i,
                    Err(st) => return fail(request, st),
                };
                let Some(id) = cep_mut(s, file, idx).map(|c| c.id) else {
                    return fail(request, STATUS_INVALID_HANDLE);
                };
                if let Err(st) = reserve_backlog(s, file, idx) {
                    return fail(request, st);
                }
                match s.cm.engine.listen(id, i.service_id) {
                    Ok(()) => Some((request, STATUS_SUCCESS, Response::None)),
                    Err(e) => fail(request, cm_status(e)),
                }
            }
            Verb::GetCepEvent(h) => {
                let idx = match s
                    .file(file)
                    .and_then(|f| f.objects.lookup(h.handle, Kind::Cep))
                {
                    Ok(i) => i,
                    Err(st) => return fail(request, st),
                };
                if cep_mut(s, file, idx).is_some_and(|c| c.callback.is_some()) {
                    // A kernel ULP's CEP: its events go to the callback.
                    return fail(request, STATUS_INVALID_DEVICE_STATE);
                }
                let wait = cep_mut(s, file, idx).and_then(|c| c.wait);
                if wait.is_some_and(|k| s.waits.contains_key(&k)) {
                    return fail(request, STATUS_DEVICE_BUSY);
                }
                self.cm_route(s, file, idx);
                if let Some(out) = cep_mut(s, file, idx).and_then(|c| c.events.pop_front()) {
                    let mut request = request;
                    let response = Response::write(&mut request, out.as_bytes());
                    return Some((request, STATUS_SUCCESS, response));
                }
                let key = match pend(s, file, request) {
                    Ok(k) => k,
                    Err((r, st)) => return Some((r, st, Response::None)),
                };
                if let Some(c) = cep_mut(s, file, idx) {
                    c.wait = Some(key);
                }
                None
            }
            Verb::Destroy(h, Kind::Cep) => {
                let idx = match s
                    .file(file)
                    .and_then(|f| f.objects.lookup(h.handle, Kind::Cep))
                {
                    Ok(i) => i,
                    Err(st) => return fail(request, st),
                };
                self.free_object(s, file, idx);
                Some((request, STATUS_SUCCESS, Response::None))
            }
            _ => fail(request, STATUS_INVALID_DEVICE_REQUEST),
        }
    }

    /// A CEP object for the engine's CEP `id` in `file`; its handle.
    fn new_cep(
        &self,
        s: &mut State<P::Request>,
        file: FileKey,
        id: irpverbs_cm::CepId,
        user_context: u64,
        callback: Option<CepCallback>,
    ) -> Result<IvHandle, NtStatus> {
        let mut events = alloc::collections::VecDeque::new();
        events
            .try_reserve_exact(CEP_EVENTS)
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        let body = Body::Cep(crate::object::Cep {
            id,
            user_context,
            wait: None,
            events,
            qp: None,
            callback,
            armed: true,
        });
        s.ceps.reserve_total(s.ceps.len() + 1)?;
        // Room for the CEP's callback call (queued once until it polls).
        let calls = (s.ceps.len() + 1).saturating_sub(s.cep_calls.len());
        s.cep_calls
            .try_reserve(calls)
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        let idx = self.reserve(s, file, body, MAX_CEPS_PER_DEVICE)?;
        let f = s.files.get_mut(&file).ok_or(STATUS_INVALID_HANDLE)?;
        f.objects.get_mut(idx).life = Life::Live;
        let recorded = s.ceps.insert_reserved(id, (file, idx));
        debug_assert!(recorded.is_ok());
        Ok(s.files.get(&file).map_or(0, |f| f.objects.handle_of(idx)))
    }

    /// Ends a CEP object's engine side (from [`Device::free_object`]): the
    /// engine destroys it (sending the REJ or DREQ its state asks for), the
    /// CEPs of the requests it received as a listener and its owner never
    /// polled are destroyed too (rejecting them), and its pended request
    /// completes with `STATUS_CANCELLED`.
    pub(crate) fn cep_freed(&self, s: &mut State<P::Request>, cep: &crate::object::Cep) {
        let file = s.ceps.get(&cep.id).map(|&(f, _)| f);
        if s.ceps.remove(&cep.id).is_some() {
            let _ = s.cm.engine.discard(cep.id, self.platform.now_ns());
        }
        // A listener's requests its owner never polled: their CEPs (made
        // when the requests arrived) go too, rejecting them.
        if let Some(file) = file {
            for ev in &cep.events {
                let child = matches!(
                    ev.event_type,
                    IV_CEP_EVENT_CONNECT_REQUEST | IV_CEP_EVENT_SIDR_REQUEST
                ) && ev.cep != 0;
                let idx = s
                    .files
                    .get(&file)
                    .and_then(|f| f.objects.lookup(ev.cep, Kind::Cep).ok());
                if let Some(idx) = idx.filter(|_| child) {
                    self.free_object(s, file, idx);
                }
            }
        }
        if let Some(r) = cep.wait.and_then(|k| take_wait(s, k)) {
            s.defer(r, STATUS_CANCELLED, Response::None);
        }
        if let Some(r) = s
            .cm_ops
            .remove(&cep.id)
            .and_then(|p| p.wait)
            .and_then(|k| take_wait(s, k))
        {
            s.defer(r, STATUS_CANCELLED, Response::None);
        }
    }

    /// Converts a CEP's engine event for its owner (by reference, as
    /// [`Self::cm_consume`] takes it); `None` for one the
    /// owner never sees (a connect request there is no room for, which the
    /// engine rejects; `Canceled`, which only `destroy` returns).
    // Out of line: its event conversion is not on the stack of
    // `cm_route`'s call into `cm_consume` (docs/stack-budget.md).
    #[inline(never)]
    fn convert(
        &self,
        s: &mut State<P::Request>,
        file: FileKey,
        idx: u32,
        ev: &irpverbs_cm::Event,
    ) -> Option<IvCepEventOut> {
        use irpverbs_cm::Event as E;
        let c = cep_mut(s, file, idx)?;
        let user_context = c.user_context;
        let callback = c.callback.clone();
        let own = c.id;
        let handle = s.files.get(&file)?.objects.handle_of(idx);
        let mut out = IvCepEventOut {
            cep: handle,
            user_context,
            ..IvCepEventOut::default()
        };
        // A new connection's CEP (a connect or SIDR request to a listener),
        // made in the listener's file with its context and callback; with
        // no room for it the engine's CEP is destroyed (which refuses the
        // request) and there is no event.
        let adopt = |s: &mut State<P::Request>, cep| match self.new_cep(
            s,
            file,
            cep,
            user_context,
            callback.clone(),
        ) {
            Ok(h) => Some(h),
            Err(_) => {
                let _ = s.cm.engine.discard(cep, self.platform.now_ns());
                None
            }
        };
        out.event_type = match *ev {
            E::ConnectRequest { cep, src, req } => {
                if cep != own {
                    // No room for it: the engine rejects it.
                    out.cep = adopt(s, cep)?;
                }
                out.service_id = req.service_id;
                out.remote_gid = src.gid;
                out.remote_qpn = req.local_qpn;
                out.remote_ca_guid = req.local_ca_guid;
                out.starting_psn = req.starting_psn;
                out.responder_resources = req.responder_resources;
                out.initiator_depth = req.initiator_depth;
                out.path_mtu = req.path_mtu;
                out.retry_count = req.retry_count;
                out.rnr_retry_count = req.rnr_retry_count;
                out.flags = cm_flags(req.end_to_end_flow_control, req.srq);
                out.service_timeout = req.remote_cm_response_timeout;
                out.pkey = req.pkey;
                out.local_ack_timeout = req.primary.local_ack_timeout;
                set_pdata(&mut out, &req.private_data);
                IV_CEP_EVENT_CONNECT_REQUEST
            }
            E::Reply { rep } => {
                out.remote_qpn = rep.local_qpn;
                out.remote_ca_guid = rep.local_ca_guid;
                out.starting_psn = rep.starting_psn;
                out.responder_resources = rep.responder_resources;
                out.initiator_depth = rep.initiator_depth;
                out.rnr_retry_count = rep.rnr_retry_count;
                out.flags = cm_flags(rep.end_to_end_flow_control, rep.srq);
                set_pdata(&mut out, &rep.private_data);
                IV_CEP_EVENT_REPLY
            }
            E::Established => IV_CEP_EVENT_ESTABLISHED,
            E::Rejected { rej, .. } => {
                out.reason = u32::from(rej.reason.0);
                set_ari(&mut out, rej.ari.as_bytes());
                set_pdata(&mut out, &rej.private_data);
                IV_CEP_EVENT_REJECTED
            }
            E::MraReceived {
                service_timeout, ..
            } => {
                out.service_timeout = service_timeout;
                IV_CEP_EVENT_MRA
            }
            E::Timeout { .. } => IV_CEP_EVENT_TIMEOUT,
            E::DisconnectRequest { dreq } => {
                set_pdata(&mut out, &dreq.private_data);
                IV_CEP_EVENT_DISCONNECT_REQUEST
            }
            E::DisconnectReply { private_data } => {
                if let Some(pd) = private_data {
                    set_pdata(&mut out, &pd);
                }
                IV_CEP_EVENT_DISCONNECT_REPLY
            }
            E::StaleConnection => IV_CEP_EVENT_STALE,
            E::TimewaitExit => IV_CEP_EVENT_TIMEWAIT_EXIT,
            E::LapReceived { lap } => {
                // The proposed alternate path, as this side sees it.
                out.remote_gid = lap.alternate.local_gid;
                out.local_ack_timeout = lap.alternate.local_ack_timeout;
                set_ari(&mut out, &lap.alternate.remote_gid);
                set_pdata(&mut out, &lap.private_data);
                IV_CEP_EVENT_LAP
            }
            E::AprReceived { apr } => {
                out.status = apr.status.0;
                set_ari(&mut out, apr.info.as_bytes());
                set_pdata(&mut out, &apr.private_data);
                IV_CEP_EVENT_APR
            }
            E::SidrRequest { cep, src, req } => {
                // No room for it: the engine answers "rejected".
                out.cep = adopt(s, cep)?;
                out.service_id = req.service_id;
                out.remote_gid = src.gid;
                out.pkey = req.pkey;
                set_pdata(&mut out, &req.private_data);
                IV_CEP_EVENT_SIDR_REQUEST
            }
            E::SidrReply { rep } => {
                out.remote_qpn = rep.qpn;
                out.qkey = rep.qkey;
                out.status = rep.status.0;
                set_ari(&mut out, rep.info.as_bytes());
                set_pdata(&mut out, &rep.private_data);
                IV_CEP_EVENT_SIDR_REPLY
            }
            E::Canceled { .. } => return None,
        };
        Some(out)
    }

    /// Takes every event the engine holds for the CEP at `idx` (which
    /// re-arms it there): a multi-phase request in progress on the CEP
    /// consumes the events it waits for; the rest queue on the CEP for
    /// `GET_CEP_EVENT`, and so do the consumed ones that carry a message
    /// (`REPLY`, `REJECTED`, `DISCONNECT_REPLY` with the DREP's private
    /// data), for their values.
    fn cm_route(&self, s: &mut State<P::Request>, file: FileKey, idx: u32) {
        let Some(id) = cep_mut(s, file, idx).map(|c| c.id) else {
            return;
        };
        while let Some(ev) = s.cm.engine.poll_event(id) {
            // The messages a request consumes are reported too: their
            // values and private data are the owner's.
            use irpverbs_cm::Event as E;
            let report = matches!(
                ev,
                E::Reply { .. }
                    | E::Rejected { .. }
                    | E::AprReceived { .. }
                    | E::DisconnectReply {
                        private_data: Some(_)
                    }
            );
            if !self.cm_consume(s, id, &ev) && !report {
                continue;
            }
            self.cm_queue_event(s, file, idx, &ev);
        }
    }

    /// Queues `ev`, converted, for the owner of the CEP at `idx` of `file`.
    /// Out of line: the converted event (384 bytes) is not on the stack of
    /// [`Self::cm_route`]'s call into [`Self::cm_consume`], which may walk
    /// a QP down to the HCA (docs/stack-budget.md).
    #[inline(never)]
    fn cm_queue_event(
        &self,
        s: &mut State<P::Request>,
        file: FileKey,
        idx: u32,
        ev: &irpverbs_cm::Event,
    ) {
        if let Some(out) = self.convert(s, file, idx, ev) {
            // In the room taken when the CEP was made; past it (an owner
            // that does not poll) the event is dropped and counted.
            match cep_mut(s, file, idx) {
                Some(c) if c.events.len() < c.events.capacity() => c.events.push_back(out),
                Some(_) => s.stats.cep_events_dropped += 1,
                None => {}
            }
        }
    }

    /// Completes the CEP's pended `GET_CEP_EVENT` if it has an event, or
    /// queues its callback's call.
    fn cep_serve(&self, s: &mut State<P::Request>, file: FileKey, idx: u32) {
        let handle = s.files.get(&file).map_or(0, |f| f.objects.handle_of(idx));
        let Some(c) = cep_mut(s, file, idx) else {
            return;
        };
        if c.callback.is_some() {
            // A kernel ULP's CEP: its callback, once until it polls `None`.
            if c.armed && !c.events.is_empty() {
                let call = CepReady {
                    file,
                    cep: handle,
                    user_context: c.user_context,
                };
                // In the room the CEPs took when they were made; without
                // room the CEP stays armed, for its next event.
                if s.cep_calls.try_reserve(1).is_ok() {
                    s.cep_calls.push_back(call);
                    if let Some(c) = cep_mut(s, file, idx) {
                        c.armed = false;
                    }
                    self.cep_calls_pending
                        .store(true, core::sync::atomic::Ordering::Release);
                }
            }
            return;
        }
        let Some(key) = c.wait.filter(|_| !c.events.is_empty()) else {
            return;
        };
        let Some(r) = take_wait(s, key) else {
            return;
        };
        if let Some(c) = cep_mut(s, file, idx) {
            c.wait = None;
            if let Some(out) = c.events.pop_front() {
                let mut r = r;
                let response = Response::write(&mut r, out.as_bytes());
                s.defer(r, STATUS_SUCCESS, response);
            }
        }
    }

    /// Routes the events of every CEP the engine names as having some,
    /// then completes their pended `GET_CEP_EVENT`s (the polling model).
    pub(crate) fn cep_deliver(&self, s: &mut State<P::Request>) {
        while let Some((id, _)) = s.cm.engine.poll_ready() {
            let Some(&(file, idx)) = s.ceps.get(&id) else {
                continue;
            };
            self.cm_route(s, file, idx);
            self.cep_serve(s, file, idx);
        }
    }

    /// Gives `ev` to the multi-phase request in progress on `id`, if it
    /// waits for it: false when it did (the event is consumed), true when
    /// the owner is to see it. By reference: an event is 300 bytes, and
    /// this runs on the MAD path's stack (docs/stack-budget.md).
    fn cm_consume(
        &self,
        s: &mut State<P::Request>,
        id: irpverbs_cm::CepId,
        ev: &irpverbs_cm::Event,
    ) -> bool {
        use irpverbs_cm::Event as E;
        let Some(p) = s.cm_ops.get_mut(&id) else {
            return true;
        };
        let status = match (p.kind, ev) {
            // The caller moves its QP itself: the connect is done (the REP
            // is queued for it; `CM_ESTABLISH` sends the RTU).
            (CmKind::Connect, E::Reply { .. }) if p.qp == 0 => STATUS_SUCCESS,
            (CmKind::Connect, E::Reply { .. }) => {
                let Some(key) = p.wait.take() else {
                    return true;
                };
                let (file, qp) = (p.file, p.qp);
                self.cm_walk_to_rts(s, id, key, file, qp, None);
                return false;
            }
            (CmKind::Connect, E::ConnectRequest { cep, .. }) if *cep == id => {
                // Peer-to-peer: the remote's REQ made this the passive side
                // (IBTA 12.9.8.3.2). The connect goes on as an accept: the
                // QP (in INIT) to RTR and RTS, the REP, until the RTU.
                let Some(key) = p.wait.take() else {
                    return true;
                };
                let (file, qp) = (p.file, p.qp);
                let Some(c) = p.connect else {
                    return true;
                };
                let a = AcceptParams {
                    qpn: c.qpn,
                    starting_psn: c.starting_psn,
                    responder_resources: c.responder_resources,
                    initiator_depth: c.initiator_depth,
                    flow_control: c.flow_control,
                    rnr_retry_count: c.rnr_retry_count,
                    srq: c.srq,
                    min_rnr_timer: c.min_rnr_timer,
                    ..AcceptParams::default()
                };
                p.kind = CmKind::Accept;
                p.accept = Some(a);
                self.cm_walk_to_rts(s, id, key, file, qp, Some(a));
                return false;
            }
            (CmKind::Lap, E::AprReceived { apr }) if apr.status == AprStatus::ACCEPTED => {
                let Some(key) = p.wait.take() else {
                    return true;
                };
                let (file, qp, sgid_index) = (p.file, p.qp, p.alt_sgid_index);
                self.cm_load_alt(s, id, key, (file, qp, sgid_index));
                return false;
            }
            (CmKind::Lap, E::AprReceived { .. }) => STATUS_CONNECTION_REFUSED,
            (CmKind::Sidr, E::SidrReply { rep }) => {
                let wait = p.wait.take();
                self.cm_sidr_replied(s, id, wait, rep);
                return false;
            }
            (CmKind::Accept, E::Established) => STATUS_SUCCESS,
            (CmKind::Disconnect, E::DisconnectReply { .. }) => STATUS_SUCCESS,
            (CmKind::Connect | CmKind::Accept, E::Rejected { .. }) => STATUS_CONNECTION_REFUSED,
            (_, E::Timeout { .. }) => STATUS_IO_TIMEOUT,
            _ => return true,
        };
        match p.wait.take() {
            // A parked accept waits for the RTU with its QP in RTS: a
            // failure moves the QP to ERR before the request completes,
            // so that a connection its owner was told failed does not
            // carry traffic (a REJ or timeout the remote never learns of
            // would leave it half-open otherwise).
            Some(key) if status != STATUS_SUCCESS && p.kind == CmKind::Accept && p.qp != 0 => {
                let (file, qp) = (p.file, p.qp);
                p.result = Some(status);
                if let Some(r) = take_wait(s, key) {
                    if let Err((r, _)) = self.cm_fail_qp(s, file, qp, id, r) {
                        self.cm_end(s, id, r, status, Response::None);
                    }
                } else {
                    s.cm_ops.remove(&id);
                }
            }
            Some(key) => match take_wait(s, key) {
                Some(r) => self.cm_end(s, id, r, status, Response::None),
                // Cancelled meanwhile.
                None => {
                    s.cm_ops.remove(&id);
                }
            },
            // A QP modify is in flight: its completion ends the request.
            None => p.result = Some(status),
        }
        false
    }

    /// Walks the QP of a connect (or of a peer-to-peer connect that the
    /// remote's REQ made an accept: `accept`) to RTR and RTS, for the REP
    /// (or REQ) that reached it; the parked request waits on `key`. A
    /// cancelled request abandons the connection; a failure rejects it and
    /// ends the request. Out of line: the modify steps are not on the
    /// stack of the MAD path's other events (docs/stack-budget.md).
    #[inline(never)]
    fn cm_walk_to_rts(
        &self,
        s: &mut State<P::Request>,
        id: irpverbs_cm::CepId,
        key: u64,
        file: FileKey,
        qp: IvHandle,
        accept: Option<AcceptParams<'static>>,
    ) {
        let Some(r) = take_wait(s, key) else {
            // Cancelled: the connection is abandoned.
            self.cm_reject(s, id);
            s.cm_ops.remove(&id);
            return;
        };
        let to_rts = [(QpTarget::Rtr, Phase::Rtr), (QpTarget::Rts, Phase::Rts)];
        let mut steps: Steps = [(QpModify::default(), Phase::Init); MAX_CHAIN];
        let res = match cm_steps(&s.cm.engine, id, accept.as_ref(), &to_rts, &mut steps) {
            Ok(n) => self.cm_modify_chain(s, file, qp, &steps[..n], id, r),
            Err(e) => Err((r, cm_status(e))),
        };
        if let Err((r, st)) = res {
            self.cm_reject(s, id);
            self.cm_end(s, id, r, st, Response::None);
        }
    }

    /// A SIDR request's reply: completes the parked request waiting on
    /// `wait` with it (or forgets the request, cancelled meanwhile). Out of
    /// line, as [`Self::cm_walk_to_rts`].
    #[inline(never)]
    fn cm_sidr_replied(
        &self,
        s: &mut State<P::Request>,
        id: irpverbs_cm::CepId,
        wait: Option<u64>,
        rep: &irpverbs_cm::msg::SidrRep,
    ) {
        let mut out = IvSidrRequestOut {
            status: u32::from(rep.status.0),
            qpn: rep.qpn,
            qkey: rep.qkey,
            ..IvSidrRequestOut::default()
        };
        let info = rep.info.as_bytes();
        out.info[..info.len()].copy_from_slice(info);
        out.info_len = info.len() as u8;
        out.private_data.copy_from_slice(&rep.private_data);
        out.private_data_len = rep.private_data.len() as u8;
        match wait.and_then(|k| take_wait(s, k)) {
            Some(mut r) => {
                let response = Response::write(&mut r, out.as_bytes());
                self.cm_end(s, id, r, STATUS_SUCCESS, response);
            }
            None => {
                s.cm_ops.remove(&id);
            }
        }
    }

    /// The APR accepted the `CM_LAP` parked on `key`: its QP loads the
    /// alternate path (RTS to RTS, from GID index `sgid_index`); the
    /// request completes when the modify does. Out of line, as
    /// [`Self::cm_walk_to_rts`].
    #[inline(never)]
    fn cm_load_alt(
        &self,
        s: &mut State<P::Request>,
        id: irpverbs_cm::CepId,
        key: u64,
        (file, qp, sgid_index): (FileKey, IvHandle, u8),
    ) {
        let Some(r) = take_wait(s, key) else {
            // Cancelled meanwhile.
            s.cm_ops.remove(&id);
            return;
        };
        let started = match s.cm.engine.qp_attr(id, QpTarget::LoadAlt) {
            Ok(mut m) => {
                m.attr.alt_ah_attr.sgid_index = sgid_index;
                self.cm_modify(s, file, qp, m, id, Phase::LoadAlt, r)
            }
            Err(e) => Err((r, cm_status(e))),
        };
        if let Err((r, st)) = started {
            self.cm_end(s, id, r, st, Response::None);
        }
    }

    /// A connect or accept that failed on this side rejects the
    /// connection, so that the remote does not wait for it (a REJ the
    /// state does not allow is not sent). Out of line: a failure's path,
    /// off the stack of the walk it ends (docs/stack-budget.md).
    #[inline(never)]
    fn cm_reject(&self, s: &mut State<P::Request>, id: irpverbs_cm::CepId) {
        let now = self.platform.now_ns();
        let _ =
            s.cm.engine
                .reject(id, RejReason::CONSUMER_REJECT, &[], &[], now);
    }

    /// Moves the QP of a failed connect or accept to ERR (the request,
    /// whose `result` holds the failure, completes with it when the modify
    /// does). Out of line, as [`Self::cm_walk_to_rts`].
    #[inline(never)]
    fn cm_fail_qp(
        &self,
        s: &mut State<P::Request>,
        file: FileKey,
        qp: IvHandle,
        id: irpverbs_cm::CepId,
        r: P::Request,
    ) -> Result<(), (P::Request, NtStatus)> {
        match s.cm.engine.qp_attr(id, QpTarget::Error) {
            Ok(m) => self.cm_modify(s, file, qp, m, id, Phase::Err, r),
            Err(e) => Err((r, cm_status(e))),
        }
    }

    /// Ends the multi-phase request on `id` with `status`.
    fn cm_end(
        &self,
        s: &mut State<P::Request>,
        id: irpverbs_cm::CepId,
        r: P::Request,
        st: NtStatus,
        response: Response,
    ) {
        s.cm_ops.remove(&id);
        s.defer(r, st, response);
    }

    /// Posts a modify of the QP at `qp` for a multi-phase request, which
    /// travels with the command.
    #[allow(clippy::too_many_arguments)]
    fn cm_modify(
        &self,
        s: &mut State<P::Request>,
        file: FileKey,
        qp_handle: IvHandle,
        m: QpModify,
        cep: irpverbs_cm::CepId,
        phase: Phase,
        request: P::Request,
    ) -> Result<(), (P::Request, NtStatus)> {
        self.cm_modify_chain(s, file, qp_handle, &[(m, phase)], cep, request)
    }

    /// Posts `steps`, modifies of the QP at `qp` one after the other, for
    /// a multi-phase request: all at once, since the HCA runs commands in
    /// the order posted and refuses a modify whose current state is not
    /// the QP's (so the ones after a failed step fail too). The request
    /// travels with the last; the QP stays busy until it completes. One
    /// round trip through the event queue instead of one per step.
    fn cm_modify_chain(
        &self,
        s: &mut State<P::Request>,
        file: FileKey,
        qp_handle: IvHandle,
        steps: &[(QpModify, Phase)],
        cep: irpverbs_cm::CepId,
        request: P::Request,
    ) -> Result<(), (P::Request, NtStatus)> {
        let Some(f) = s.files.get_mut(&file) else {
            return Err((request, STATUS_INVALID_HANDLE));
        };
        // By handle: the QP may have been destroyed since the request began.
        let qp = match f.objects.lookup(qp_handle, Kind::Qp) {
            Ok(i) => i,
            Err(st) => return Err((request, st)),
        };
        let o = f.objects.get_mut(qp);
        if o.busy || o.life != Life::Live {
            return Err((request, STATUS_DEVICE_BUSY));
        }
        let Body::Qp(q) = &o.body else {
            return Err((request, STATUS_INVALID_HANDLE));
        };
        let (qp_type, qpn) = (q.qp_type, q.qpn);
        // A connect or accept walks its QP from RESET (the ABI's
        // precondition), checked again here: it may have moved since the
        // request began (a connect reads its GID entry first).
        if matches!(steps.first(), Some((_, Phase::Init))) && q.state != IV_QPS_RESET {
            return Err((request, STATUS_INVALID_DEVICE_STATE));
        }
        // Every step checked before any is posted, each from the state the
        // one before leaves.
        let mut nexts = [0u32; MAX_CHAIN];
        let mut state = q.state;
        if steps.is_empty() || steps.len() > MAX_CHAIN {
            return Err((request, STATUS_INVALID_PARAMETER));
        }
        for ((m, _), next) in steps.iter().zip(nexts.iter_mut()) {
            *next = match crate::qp_state::check_modify(qp_type, state, m.mask, &m.attr) {
                Ok(n) => n,
                Err(e) => return Err((request, e.status())),
            };
            state = *next;
        }
        o.busy = true;
        let mut cur_state = q.state;
        let mut request = Some(request);
        for (i, ((m, phase), &next)) in steps.iter().zip(nexts.iter()).enumerate() {
            let more = i + 1 < steps.len();
            let cmd = crate::Command::ModifyQp(crate::ModifyQp {
                qpn,
                cur_state,
                mask: m.mask,
                attr: m.attr,
            });
            cur_state = next;
            self.post(
                s,
                file,
                if more { None } else { request.take() },
                crate::verbs::Op::CmStep {
                    qp,
                    next,
                    cep,
                    phase: *phase,
                    more,
                },
                cmd,
            );
        }
        Ok(())
    }

    /// The GID table entry a `CM_CONNECT` or `CM_LAP` names was read: the
    /// connect goes on (its QP to INIT), the LAP leaves, if it is the
    /// request's local GID; otherwise the request fails with
    /// `STATUS_INVALID_ADDRESS` (no such entry, or another address), its
    /// CEP as it was.
    pub(crate) fn cm_gid_checked(
        &self,
        s: &mut State<P::Request>,
        file: FileKey,
        (id, want): (irpverbs_cm::CepId, [u8; 16]),
        status: NtStatus,
        out: &crate::CommandOut,
        request: Option<P::Request>,
    ) -> Option<Done<P::Request>> {
        let r = request?;
        let Some(p) = s.cm_ops.get(&id) else {
            // The CEP was destroyed meanwhile.
            return Some((r, STATUS_CANCELLED, Response::None));
        };
        let found = nt_success(status) && matches!(out, crate::CommandOut::Gid(g) if *g == want);
        let started = match (p.kind, p.connect, p.lap) {
            // The caller moves its QP itself: the REQ goes now.
            (CmKind::Connect, Some(_), _) if found && p.qp == 0 => self.cm_send_req(s, id, r),
            (CmKind::Connect, Some(c), _) if found => {
                let (qp, m) = (p.qp, c.init_attr());
                self.cm_modify(s, file, qp, m, id, Phase::Init, r)
            }
            (CmKind::Lap, _, Some(path)) if found => {
                let now = self.platform.now_ns();
                let pd = s.cm_ops.get_mut(&id).map(|p| core::mem::take(&mut p.pdata));
                let pd = pd.unwrap_or_default();
                match s.cm.engine.load_alternate_path(id, &path, &pd, now) {
                    Ok(()) => park(s, id, r),
                    Err(e) => Err((r, cm_status(e))),
                }
            }
            _ => Err((r, STATUS_INVALID_ADDRESS)),
        };
        match started {
            Ok(()) => None,
            Err((r, st)) => {
                s.cm_ops.remove(&id);
                Some((r, st, Response::None))
            }
        }
    }

    /// A QP modify of a multi-phase request completed: the next phase.
    pub(crate) fn cm_step_done(
        &self,
        s: &mut State<P::Request>,
        file: FileKey,
        (qp, next, id, phase, more): (u32, u32, irpverbs_cm::CepId, Phase, bool),
        status: NtStatus,
        request: Option<P::Request>,
    ) -> Option<Done<P::Request>> {
        if more {
            // A step of a chain with more to come: the QP moved (or the
            // chain's first failure is kept for its last step to report).
            if nt_success(status) {
                crate::verbs::qp::set_qp_state(s, file, qp, next);
            } else if let Some(p) = s.cm_ops.get_mut(&id) {
                p.step_failure.get_or_insert(status);
            }
            return request.map(|r| (r, STATUS_INVALID_DEVICE_STATE, Response::None));
        }
        let status = match s.cm_ops.get_mut(&id).and_then(|p| p.step_failure.take()) {
            Some(first) => first,
            None => status,
        };
        let ok = nt_success(status);
        crate::verbs::qp::modify_qp_done(s, file, qp, next, ok);
        let r = request?;
        let Some(p) = s.cm_ops.get_mut(&id) else {
            // The CEP was destroyed meanwhile.
            return Some((r, STATUS_CANCELLED, Response::None));
        };
        if !ok {
            // A failure the CM reported first stays the request's status
            // (the modify that failed was moving the QP to ERR for it).
            let st = p
                .result
                .filter(|&st| st != STATUS_SUCCESS)
                .unwrap_or(status);
            let kind = p.kind;
            if matches!(kind, CmKind::Connect | CmKind::Accept) && p.result.is_none() {
                self.cm_reject(s, id);
            }
            if kind == CmKind::Apr {
                // The QP could not load the path: the LAP is refused.
                let _ = s.cm.engine.apr(id, AprStatus::REJECTED, &[], &[]);
            }
            s.cm_ops.remove(&id);
            return Some((r, st, Response::None));
        }
        if let Some(st) = p.result {
            // A connect or accept that failed (REJ, timeout) while this
            // modify moved its QP to RTR or RTS: the QP goes to ERR first.
            let past_init = matches!(phase, Phase::Rtr | Phase::Rts);
            if st != STATUS_SUCCESS
                && past_init
                && matches!(p.kind, CmKind::Connect | CmKind::Accept)
            {
                let qp_handle = p.qp;
                return match self.cm_fail_qp(s, file, qp_handle, id, r) {
                    Ok(()) => None,
                    Err((r, _)) => {
                        s.cm_ops.remove(&id);
                        Some((r, st, Response::None))
                    }
                };
            }
            s.cm_ops.remove(&id);
            return Some((r, st, Response::None));
        }
        let now = self.platform.now_ns();
        let (kind, accept) = (p.kind, p.accept);
        // The private data the request brought, for its REQ or REP.
        let take_pdata = |s: &mut State<P::Request>| {
            s.cm_ops
                .get_mut(&id)
                .map(|p| core::mem::take(&mut p.pdata))
                .unwrap_or_default()
        };
        let ended = match (kind, phase) {
            (CmKind::Connect, Phase::Init) => self.cm_send_req(s, id, r),
            (CmKind::Connect, Phase::Rts) => match s.cm.engine.rtu(id, &[]) {
                Ok(()) => Err((r, STATUS_SUCCESS)),
                Err(e) => Err((r, cm_status(e))),
            },
            (CmKind::Accept, Phase::Rts) => {
                let pd = take_pdata(s);
                let res = accept.map_or(Err(irpverbs_cm::CmError::UnknownCep), |a| {
                    let a = AcceptParams {
                        private_data: &pd,
                        ..a
                    };
                    s.cm.engine.accept(id, &a, now)
                });
                match res {
                    Ok(()) => park(s, id, r),
                    Err(e) => Err((r, cm_status(e))),
                }
            }
            (CmKind::Disconnect, _) => park(s, id, r),
            (CmKind::Lap, Phase::LoadAlt) => Err((r, STATUS_SUCCESS)),
            (CmKind::Apr, Phase::LoadAlt) => {
                let pd = take_pdata(s);
                match s.cm.engine.apr(id, AprStatus::ACCEPTED, &[], &pd) {
                    Ok(()) => Err((r, STATUS_SUCCESS)),
                    Err(e) => Err((r, cm_status(e))),
                }
            }
            (CmKind::PassiveDisconnect, _) => match s.cm.engine.drep(
                id,
                &s.cm_ops
                    .get(&id)
                    .map(|p| p.pdata.clone())
                    .unwrap_or_default(),
                now,
            ) {
                Ok(()) => Err((r, STATUS_SUCCESS)),
                Err(e) => Err((r, cm_status(e))),
            },
            _ => Err((r, STATUS_INVALID_DEVICE_STATE)),
        };
        match ended {
            Ok(()) => None,
            Err((r, st)) => {
                if st != STATUS_SUCCESS && matches!(kind, CmKind::Connect | CmKind::Accept) {
                    self.cm_reject(s, id);
                }
                s.cm_ops.remove(&id);
                Some((r, st, Response::None))
            }
        }
    }

    /// A connect's REQ (with the private data the request brought), then
    /// the request waits for the answer.
    fn cm_send_req(
        &self,
        s: &mut State<P::Request>,
        id: irpverbs_cm::CepId,
        r: P::Request,
    ) -> Result<(), (P::Request, NtStatus)> {
        let now = self.platform.now_ns();
        let Some(p) = s.cm_ops.get_mut(&id) else {
            return Err((r, STATUS_CANCELLED));
        };
        let pd = core::mem::take(&mut p.pdata);
        let res = p
            .connect
            .map_or(Err(irpverbs_cm::CmError::UnknownCep), |c| {
                let c = ConnectParams {
                    private_data: &pd,
                    ..c
                };
                s.cm.engine.connect(id, &c, now)
            });
        match res {
            Ok(()) => park(s, id, r),
            Err(e) => Err((r, cm_status(e))),
        }
    }

    /// Starts a multi-phase request (`CM_CONNECT`, `CM_ACCEPT`,
    /// `CM_DISCONNECT`) or a `CM_REJECT`.
    pub(crate) fn cm_request(
        &self,
        s: &mut State<P::Request>,
        file: FileKey,
        op: CmOp,
        request: P::Request,
    ) -> Option<Done<P::Request>> {
        let verb = match CmIn::read(op, request.input()) {
            Ok(v) => v,
            Err(st) => return Some((request, st, Response::None)),
        };
        let now = self.platform.now_ns();
        let cep_handle = match &verb {
            CmIn::CmConnect(i) => i.cep,
            CmIn::CmAccept(i) => i.cep,
            CmIn::CmReject(i) => i.cep,
            CmIn::CmDisconnect(i) => i.cep,
            CmIn::CmMra(i) => i.cep,
            CmIn::SidrRequest(i) => i.cep,
            CmIn::SidrReply(i) => i.cep,
            CmIn::CmLap(i) => i.cep,
            CmIn::CmApr(i) => i.cep,
            CmIn::InitQpAttr(i) => i.cep,
            CmIn::Establish(i) => i.handle,
        };
        let lookup = |s: &mut State<P::Request>, h: IvHandle, k: Kind| {
            s.file(file).and_then(|f| f.objects.lookup(h, k))
        };
        let cep = match lookup(s, cep_handle, Kind::Cep) {
            Ok(i) => i,
            Err(st) => return Some((request, st, Response::None)),
        };
        let Some(id) = cep_mut(s, file, cep).map(|c| c.id) else {
            return Some((request, STATUS_INVALID_HANDLE, Response::None));
        };
        if let CmIn::InitQpAttr(i) = &verb {
            // Answered at once, whatever the CEP has in progress; the
            // attributes are built in a frame of their own, not on the
            // connect's and accept's chain.
            let mut request = request;
            return own_frame(|| {
                Some(match init_qp_attr(&s.cm.engine, id, i) {
                    Ok(out) => {
                        let response = Response::write(&mut request, out.as_bytes());
                        (request, STATUS_SUCCESS, response)
                    }
                    Err(st) => (request, st, Response::None),
                })
            });
        }
        if let Some(p) = s.cm_ops.get(&id) {
            // A parked request that was cancelled is over: its
            // connection (if any) is abandoned.
            if p.wait.is_some_and(|k| !s.waits.contains_key(&k)) {
                let kind = p.kind;
                s.cm_ops.remove(&id);
                if matches!(kind, CmKind::Connect | CmKind::Accept) {
                    self.cm_reject(s, id);
                }
            } else {
                return Some((request, STATUS_DEVICE_BUSY, Response::None));
            }
        }
        // The parked request's room, and its wait's, before anything
        // changes.
        if s.cm_ops.reserve_total(s.cm_ops.len() + 1).is_err()
            || crate::notify::reserve_waits(s).is_err()
        {
            return Some((request, STATUS_INSUFFICIENT_RESOURCES, Response::None));
        }
        let state = s.cm.engine.state(id);
        // The QP of a connect or accept: an RC QP in RESET (the request
        // walks it from there), with no modify in flight.
        let qp_of = |s: &mut State<P::Request>, h: IvHandle| -> Result<(IvHandle, u32), NtStatus> {
            let idx = lookup(s, h, Kind::Qp)?;
            let o = s
                .files
                .get(&file)
                .map(|f| f.objects.get(idx))
                .ok_or(STATUS_INVALID_HANDLE)?;
            match &o.body {
                Body::Qp(q) if q.qp_type != IV_QPT_RC => Err(STATUS_INVALID_PARAMETER),
                Body::Qp(_) if o.busy => Err(STATUS_DEVICE_BUSY),
                Body::Qp(q) if q.state != IV_QPS_RESET => Err(STATUS_INVALID_DEVICE_STATE),
                Body::Qp(q) => Ok((h, q.qpn)),
                _ => Err(STATUS_INVALID_PARAMETER),
            }
        };
        let parked = |kind, qp| Parked::new(kind, file, qp);
        match verb {
            CmIn::CmConnect(i) => own_frame(|| {
                if state != Some(CmState::Idle) {
                    return Some((request, STATUS_INVALID_DEVICE_STATE, Response::None));
                }
                let flags = u32::from(i.flags);
                // No QP handle: the caller moves its QP (numbered `qpn`)
                // itself; a peer-to-peer connect, which would go on as an
                // accept moving the QP, needs one.
                let consumer = i.qp == 0;
                if (consumer && (i.qpn > 0xFF_FFFF || flags & IV_CM_PEER_TO_PEER != 0))
                    || (!consumer && i.qpn != 0)
                {
                    return Some((request, STATUS_INVALID_PARAMETER, Response::None));
                }
                let (qp, qpn) = match consumer {
                    true => (0, i.qpn),
                    false => match qp_of(s, i.qp) {
                        Ok(q) => q,
                        Err(st) => return Some((request, st, Response::None)),
                    },
                };
                let pd = pdata(
                    &i.private_data,
                    usize::from(i.private_data_len),
                    IV_CM_REQ_PDATA,
                );
                if i.cm_response_timeout > 31
                    || i.local_ack_timeout > 31
                    || i.max_cm_retries > 15
                    || i.starting_psn > 0xFF_FFFF
                    || u32::from(i.path_mtu) > IV_MTU_4096
                    || i.retry_count > 7
                    || i.rnr_retry_count > 7
                    || i.min_rnr_timer > 31
                    || flags & !(IV_CM_FLOW_CONTROL | IV_CM_SRQ | IV_CM_PEER_TO_PEER) != 0
                {
                    return Some((request, STATUS_INVALID_PARAMETER, Response::None));
                }
                let Some(pd) = pd else {
                    return Some((request, STATUS_INVALID_PARAMETER, Response::None));
                };
                let pd = match try_to_vec(pd) {
                    Ok(pd) => pd,
                    Err(st) => return Some((request, st, Response::None)),
                };
                // The REQ, and later the QP's packets, leave from the
                // local GID's entry.
                let dest = MadAddr {
                    sgid_index: i.sgid_index,
                    ..gsi_dest(i.remote_gid)
                };
                let mut c = ConnectParams {
                    dest,
                    service_id: i.service_id,
                    qpn,
                    starting_psn: i.starting_psn,
                    remote_cm_response_timeout: i.cm_response_timeout,
                    local_cm_response_timeout: i.cm_response_timeout,
                    max_cm_retries: i.max_cm_retries,
                    responder_resources: i.responder_resources,
                    initiator_depth: i.initiator_depth,
                    retry_count: i.retry_count,
                    rnr_retry_count: i.rnr_retry_count,
                    min_rnr_timer: i.min_rnr_timer,
                    flow_control: flags & IV_CM_FLOW_CONTROL != 0,
                    srq: flags & IV_CM_SRQ != 0,
                    peer_to_peer: flags & IV_CM_PEER_TO_PEER != 0,
                    primary: irpverbs_cm::msg::Path {
                        local_gid: i.local_gid,
                        remote_gid: i.remote_gid,
                        hop_limit: 64,
                        local_ack_timeout: i.local_ack_timeout,
                        ..Default::default()
                    },
                    ..ConnectParams::default()
                };
                if i.path_mtu != 0 {
                    c.path_mtu = i.path_mtu;
                }
                let _ = s.cm_ops.insert_reserved(
                    id,
                    Parked {
                        connect: Some(c),
                        pdata: pd,
                        qpn,
                        ..parked(CmKind::Connect, qp)
                    },
                );
                // The REQ carries `local_gid` as the requester's port GID:
                // the GID table entry it names is read first, whatever the
                // index, and must hold it ([`Device::cm_gid_checked`]), so
                // that no REQ leaves with an address the port does not
                // have.
                let cmd = crate::Command::QueryGid {
                    port: 1,
                    index: u32::from(i.sgid_index),
                };
                let op = crate::verbs::Op::CmCheckGid {
                    cep: id,
                    gid: i.local_gid,
                };
                self.post(s, file, Some(request), op, cmd);
                self.cm_started(s, file, cep, id, Ok(()))
            }),
            CmIn::CmAccept(i) => own_frame(|| {
                let flags = u32::from(i.flags);
                let pd = pdata(
                    &i.private_data,
                    usize::from(i.private_data_len),
                    IV_CM_REP_PDATA,
                );
                let consumer = i.qp == 0;
                if (consumer && i.qpn > 0xFF_FFFF)
                    || (!consumer && i.qpn != 0)
                    || i.reserved2 != 0
                    || i.reserved3 != 0
                    || i.starting_psn > 0xFF_FFFF
                    || i.rnr_retry_count > 7
                    || i.min_rnr_timer > 31
                    || i.target_ack_delay > 31
                    || flags & !(IV_CM_FLOW_CONTROL | IV_CM_SRQ) != 0
                {
                    return Some((request, STATUS_INVALID_PARAMETER, Response::None));
                }
                let Some(pd) = pd else {
                    return Some((request, STATUS_INVALID_PARAMETER, Response::None));
                };
                if consumer {
                    return self.cm_accept_consumer(s, (file, cep, id), &i, pd, request);
                }
                let pd = match try_to_vec(pd) {
                    Ok(pd) => pd,
                    Err(st) => return Some((request, st, Response::None)),
                };
                let (qp, qpn) = match qp_of(s, i.qp) {
                    Ok(q) => q,
                    Err(st) => return Some((request, st, Response::None)),
                };
                let a = accept_params(&i, qpn);
                // INIT, RTR and RTS posted at once (the REP goes when the
                // last completes).
                let to_rts = [
                    (QpTarget::Init, Phase::Init),
                    (QpTarget::Rtr, Phase::Rtr),
                    (QpTarget::Rts, Phase::Rts),
                ];
                let mut steps: Steps = [(QpModify::default(), Phase::Init); MAX_CHAIN];
                let n = match cm_steps(&s.cm.engine, id, Some(&a), &to_rts, &mut steps) {
                    Ok(n) => n,
                    Err(e) => return Some((request, cm_status(e), Response::None)),
                };
                let _ = s.cm_ops.insert_reserved(
                    id,
                    Parked {
                        accept: Some(a),
                        pdata: pd,
                        ..parked(CmKind::Accept, qp)
                    },
                );
                let started = self.cm_modify_chain(s, file, qp, &steps[..n], id, request);
                self.cm_started(s, file, cep, id, started)
            }),
            CmIn::CmReject(i) => own_frame(|| {
                let ari = pdata(&i.ari, usize::from(i.ari_len), IV_CM_ARI_LEN);
                let pd = pdata(
                    &i.private_data,
                    usize::from(i.private_data_len),
                    IV_CM_REJ_PDATA,
                );
                let st = match (u16::try_from(i.reason), ari, pd) {
                    (Ok(reason), Some(ari), Some(pd))
                        if i.reserved == 0 && i.reserved2 == [0; 6] && i.reserved3 == 0 =>
                    {
                        s.cm.engine
                            .reject(id, RejReason(reason), ari, pd, now)
                            .map_or_else(cm_status, |()| STATUS_SUCCESS)
                    }
                    _ => STATUS_INVALID_PARAMETER,
                };
                Some((request, st, Response::None))
            }),
            CmIn::CmMra(i) => own_frame(|| {
                let pd = pdata(
                    &i.private_data,
                    usize::from(i.private_data_len),
                    IV_CM_MRA_PDATA,
                );
                let st = match pd {
                    Some(pd)
                        if i.service_timeout <= 31
                            && i.reserved == [0; 6]
                            && i.reserved2 == [0; 2] =>
                    {
                        s.cm.engine
                            .mra(id, i.service_timeout, pd)
                            .map_or_else(cm_status, |()| STATUS_SUCCESS)
                    }
                    _ => STATUS_INVALID_PARAMETER,
                };
                Some((request, st, Response::None))
            }),
            CmIn::SidrReply(i) => own_frame(|| {
                let info =
                    pdata(&i.info, usize::from(i.info_len), IV_CM_ARI_LEN).and_then(Info::new);
                let pd = pdata(
                    &i.private_data,
                    usize::from(i.private_data_len),
                    IV_CM_SIDR_REP_PDATA,
                );
                let st = match (u8::try_from(i.status), info, pd) {
                    (Ok(status), Some(info), Some(pd)) if i.reserved == 0 && i.qpn <= 0xFF_FFFF => {
                        let p = SidrReplyParams {
                            status: SidrStatus(status),
                            qpn: i.qpn,
                            qkey: i.qkey,
                            info,
                            private_data: pd,
                        };
                        s.cm.engine
                            .sidr_reply(id, &p)
                            .map_or_else(cm_status, |()| STATUS_SUCCESS)
                    }
                    _ => STATUS_INVALID_PARAMETER,
                };
                Some((request, st, Response::None))
            }),
            CmIn::CmLap(i) => own_frame(|| {
                let Some(pd) = pdata(
                    &i.private_data,
                    usize::from(i.private_data_len),
                    IV_CM_LAP_PDATA,
                )
                .filter(|_| i.reserved == [0; 5] && i.alt_local_ack_timeout <= 31) else {
                    return Some((request, STATUS_INVALID_PARAMETER, Response::None));
                };
                let idle = s.cm.engine.lap_state(id) == Some(LapState::Idle);
                let qp = match (state, self.qp_of_cep(s, file, id)) {
                    (Some(CmState::Established), Some(qp)) if idle => qp,
                    _ => return Some((request, STATUS_INVALID_DEVICE_STATE, Response::None)),
                };
                let pd = match try_to_vec(pd) {
                    Ok(pd) => pd,
                    Err(st) => return Some((request, st, Response::None)),
                };
                let path = irpverbs_cm::msg::Path {
                    local_gid: i.alt_local_gid,
                    remote_gid: i.alt_remote_gid,
                    hop_limit: 64,
                    local_ack_timeout: i.alt_local_ack_timeout,
                    ..Default::default()
                };
                let _ = s.cm_ops.insert_reserved(
                    id,
                    Parked {
                        alt_sgid_index: i.alt_sgid_index,
                        lap: Some(path),
                        pdata: pd,
                        ..parked(CmKind::Lap, qp)
                    },
                );
                // The LAP carries `alt_local_gid` as this port's GID on
                // the alternate path: as for a REQ, the GID table entry
                // `alt_sgid_index` names is read first and must hold it
                // ([`Device::cm_gid_checked`]) before the LAP leaves.
                let cmd = crate::Command::QueryGid {
                    port: 1,
                    index: u32::from(i.alt_sgid_index),
                };
                let op = crate::verbs::Op::CmCheckGid {
                    cep: id,
                    gid: i.alt_local_gid,
                };
                self.post(s, file, Some(request), op, cmd);
                self.cm_started(s, file, cep, id, Ok(()))
            }),
            CmIn::CmApr(i) => own_frame(|| {
                let info = pdata(&i.info, usize::from(i.info_len), IV_CM_ARI_LEN);
                let pd = pdata(
                    &i.private_data,
                    usize::from(i.private_data_len),
                    IV_CM_APR_PDATA,
                );
                let (Some(info), Some(pd)) = (info, pd) else {
                    return Some((request, STATUS_INVALID_PARAMETER, Response::None));
                };
                let accepted = i.status == IV_CM_APR_ACCEPTED;
                if i.reserved != 0
                    || i.reserved2 != 0
                    || i.status > IV_CM_APR_MAX_STATUS
                    || (accepted && !info.is_empty())
                {
                    return Some((request, STATUS_INVALID_PARAMETER, Response::None));
                }
                let answering = matches!(
                    s.cm.engine.lap_state(id),
                    Some(LapState::LapRcvd | LapState::MraLapSent)
                );
                let qp = self.qp_of_cep(s, file, id);
                let Some(qp) = qp.filter(|_| answering) else {
                    return Some((request, STATUS_INVALID_DEVICE_STATE, Response::None));
                };
                if !accepted {
                    // A rejection goes at once.
                    let st =
                        s.cm.engine
                            .apr(id, AprStatus(i.status), info, pd)
                            .map_or_else(cm_status, |()| STATUS_SUCCESS);
                    return Some((request, st, Response::None));
                }
                let mut m = match s.cm.engine.qp_attr(id, QpTarget::LoadAlt) {
                    Ok(m) => m,
                    Err(e) => return Some((request, cm_status(e), Response::None)),
                };
                m.attr.alt_ah_attr.sgid_index = i.alt_sgid_index;
                let pd = match try_to_vec(pd) {
                    Ok(pd) => pd,
                    Err(st) => return Some((request, st, Response::None)),
                };
                let _ = s.cm_ops.insert_reserved(
                    id,
                    Parked {
                        pdata: pd,
                        ..parked(CmKind::Apr, qp)
                    },
                );
                let started = self.cm_modify(s, file, qp, m, id, Phase::LoadAlt, request);
                self.cm_started(s, file, cep, id, started)
            }),
            CmIn::Establish(_) => own_frame(|| {
                // A connect whose caller moves its QP, answered by a REP:
                // the RTU. A connect that moved a QP sent its own.
                let moved_qp = cep_mut(s, file, cep).is_some_and(|c| c.qp.is_some());
                let replied = matches!(state, Some(CmState::RepRcvd | CmState::MraRepSent));
                let st = if moved_qp || !replied {
                    STATUS_INVALID_DEVICE_STATE
                } else {
                    s.cm.engine
                        .rtu(id, &[])
                        .map_or_else(cm_status, |()| STATUS_SUCCESS)
                };
                Some((request, st, Response::None))
            }),
            // Answered before any request in progress is looked at.
            CmIn::InitQpAttr(_) => Some((request, STATUS_INVALID_DEVICE_REQUEST, Response::None)),
            CmIn::SidrRequest(i) => own_frame(|| {
                let pd = pdata(
                    &i.private_data,
                    usize::from(i.private_data_len),
                    IV_CM_SIDR_REQ_PDATA,
                );
                let Some(pd) =
                    pd.filter(|_| i.timeout <= 31 && i.max_retries <= 15 && i.reserved == [0; 3])
                else {
                    return Some((request, STATUS_INVALID_PARAMETER, Response::None));
                };
                let p = SidrParams {
                    dest: gsi_dest(i.remote_gid),
                    service_id: i.service_id,
                    pkey: if i.pkey == 0 { 0xFFFF } else { i.pkey },
                    timeout: i.timeout,
                    max_retries: i.max_retries,
                    private_data: pd,
                };
                if let Err(e) = s.cm.engine.sidr_request(id, &p, now) {
                    return Some((request, cm_status(e), Response::None));
                }
                let _ = s.cm_ops.insert_reserved(id, parked(CmKind::Sidr, 0));
                let started = park(s, id, request);
                self.cm_started(s, file, cep, id, started)
            }),
            CmIn::CmDisconnect(i) => own_frame(|| {
                let Some(pd) = pdata(
                    &i.private_data,
                    i.private_data_len as usize,
                    IV_CM_DREP_PDATA,
                )
                .filter(|_| i.reserved == 0) else {
                    return Some((request, STATUS_INVALID_PARAMETER, Response::None));
                };
                let pd = match try_to_vec(pd) {
                    Ok(pd) => pd,
                    Err(st) => return Some((request, st, Response::None)),
                };
                // None: the caller moves its QP itself (to ERR too).
                let qp = self.qp_of_cep(s, file, id);
                let m = match s.cm.engine.qp_attr(id, QpTarget::Error) {
                    Ok(m) => m,
                    Err(e) => return Some((request, cm_status(e), Response::None)),
                };
                let kind = match state {
                    Some(CmState::Established) => {
                        if pd.len() > IV_CM_DREQ_PDATA as usize {
                            return Some((request, STATUS_INVALID_PARAMETER, Response::None));
                        }
                        if let Err(e) = s.cm.engine.disconnect(id, &pd, now) {
                            return Some((request, cm_status(e), Response::None));
                        }
                        CmKind::Disconnect
                    }
                    Some(CmState::DreqRcvd) => CmKind::PassiveDisconnect,
                    _ => return Some((request, STATUS_INVALID_DEVICE_STATE, Response::None)),
                };
                let Some(qp) = qp else {
                    if kind == CmKind::PassiveDisconnect {
                        let st =
                            s.cm.engine
                                .drep(id, &pd, now)
                                .map_or_else(cm_status, |()| STATUS_SUCCESS);
                        return Some((request, st, Response::None));
                    }
                    // The DREQ left: the request waits for the DREP.
                    let _ = s.cm_ops.insert_reserved(id, parked(kind, 0));
                    let started = park(s, id, request);
                    return self.cm_started(s, file, cep, id, started);
                };
                let _ = s.cm_ops.insert_reserved(
                    id,
                    Parked {
                        pdata: pd,
                        ..parked(kind, qp)
                    },
                );
                let started = self.cm_modify(s, file, qp, m, id, Phase::Err, request);
                self.cm_started(s, file, cep, id, started)
            }),
        }
    }

    /// The end of a CM request that started (or failed to): the CEP
    /// learns its QP, or the request completes with the failure.
    fn cm_started(
        &self,
        s: &mut State<P::Request>,
        file: FileKey,
        cep: u32,
        id: irpverbs_cm::CepId,
        started: Result<(), (P::Request, NtStatus)>,
    ) -> Option<Done<P::Request>> {
        match started {
            Ok(()) => {
                let qp = s.cm_ops.get(&id).map(|p| p.qp).filter(|&q| q != 0);
                if let (Some(c), Some(qp)) = (cep_mut(s, file, cep), qp) {
                    c.qp = Some(qp);
                }
                None
            }
            Err((r, st)) => {
                s.cm_ops.remove(&id);
                Some((r, st, Response::None))
            }
        }
    }

    /// A `CM_ACCEPT` without a QP handle (checked; `pd` its private data):
    /// the caller moves its QP itself, so the REP goes at once and the
    /// request waits for the RTU (or the QP's first receive).
    fn cm_accept_consumer(
        &self,
        s: &mut State<P::Request>,
        (file, cep, id): (FileKey, u32, irpverbs_cm::CepId),
        i: &IvCmAcceptIn,
        pd: &[u8],
        request: P::Request,
    ) -> Option<Done<P::Request>> {
        let a = AcceptParams {
            private_data: pd,
            ..accept_params(i, i.qpn)
        };
        if let Err(e) = s.cm.engine.accept(id, &a, self.platform.now_ns()) {
            return Some((request, cm_status(e), Response::None));
        }
        let parked = Parked {
            qpn: i.qpn,
            ..Parked::new(CmKind::Accept, file, 0)
        };
        let _ = s.cm_ops.insert_reserved(id, parked);
        let started = park(s, id, request);
        self.cm_started(s, file, cep, id, started)
    }

    /// The QP at `qp` of `file` received its first message (COMM_EST): an
    /// accept waiting for the RTU on it completes now (the RTU may be
    /// lost or late; IBTA 12.9.6).
    pub(crate) fn cm_comm_established(&self, s: &mut State<P::Request>, file: FileKey, qp: u32) {
        let Some(o) = s
            .files
            .get(&file)
            .map(|f| (f.objects.handle_of(qp), f.objects.get(qp)))
        else {
            return;
        };
        let (qp, qpn) = match &o.1.body {
            Body::Qp(q) => (o.0, q.qpn),
            _ => (o.0, u32::MAX),
        };
        // An accept of this QP, or one whose caller moves this QP itself.
        let id = s
            .cm_ops
            .iter()
            .find(|(_, p)| {
                p.kind == CmKind::Accept
                    && p.file == file
                    && (p.qp == qp || (p.qp == 0 && p.qpn == qpn))
            })
            .map(|(id, _)| *id);
        if let Some(id) = id {
            if s.cm.engine.notify_established(id).is_ok() {
                self.cep_deliver(s);
            }
        }
    }

    /// The QP a connect or accept on the CEP `id` used.
    fn qp_of_cep(
        &self,
        s: &mut State<P::Request>,
        file: FileKey,
        id: irpverbs_cm::CepId,
    ) -> Option<IvHandle> {
        let &(f, idx) = s.ceps.get(&id)?;
        if f != file {
            return None;
        }
        cep_mut(s, file, idx)?.qp
    }
}

/// Parks a multi-phase request on its CEP until the event it waits for:
/// pended, cancelable (a cancelled one abandons the connection at the
/// next event or request on the CEP).
fn park<R: crate::Request>(
    s: &mut State<R>,
    id: irpverbs_cm::CepId,
    r: R,
) -> Result<(), (R, NtStatus)> {
    let Some(file) = s.cm_ops.get(&id).map(|p| p.file) else {
        return Err((r, STATUS_CANCELLED));
    };
    // The room was made when the request started (`reserve_waits`).
    let key = pend_reserved(s, file, r)?;
    if let Some(p) = s.cm_ops.get_mut(&id) {
        p.wait = Some(key);
    }
    Ok(())
}

/// What a multi-phase request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CmKind {
    Connect,
    Accept,
    Disconnect,
    PassiveDisconnect,
    /// `SIDR_REQUEST`: waits for the SIDR_REP.
    Sidr,
    /// `CM_LAP`: waits for the APR, then loads the alternate path.
    Lap,
    /// `CM_APR` accepting: loads the alternate path, then the APR.
    Apr,
}

/// The QP state a multi-phase request's modify moves to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    Init,
    Rtr,
    Rts,
    Err,
    /// RTS to RTS: the alternate path loaded and armed.
    LoadAlt,
}

/// A multi-phase request in progress on a CEP.
pub(crate) struct Parked {
    kind: CmKind,
    file: FileKey,
    /// The QP's handle in `file`; 0 when the caller moves its QP itself
    /// (a connect or accept without a QP handle: no modify is posted).
    qp: IvHandle,
    /// Such a caller's QP number (COMM_EST finds its accept by it).
    qpn: u32,
    /// The request's wait key, while it waits for a CM event (a QP modify
    /// in flight carries it otherwise).
    wait: Option<u64>,
    connect: Option<ConnectParams<'static>>,
    accept: Option<AcceptParams<'static>>,
    /// The private data of the message the request sends next (the REQ
    /// or the REP).
    pdata: Vec<u8>,
    /// How it ends, learnt while a QP modify was in flight.
    result: Option<NtStatus>,
    /// The first failure of a chain of modifies in flight
    /// ([`Device::cm_modify_chain`]), which its last step reports.
    step_failure: Option<NtStatus>,
    /// `CM_LAP`: the GID table index of this port's GID on the
    /// alternate path (the CM's attributes name the primary's).
    alt_sgid_index: u8,
    /// `CM_LAP`: the alternate path its LAP proposes, sent once its GID
    /// is checked.
    lap: Option<irpverbs_cm::msg::Path>,
}

impl Parked {
    /// A request of `kind` from `file` on the QP at `qp` (0: none).
    fn new(kind: CmKind, file: FileKey, qp: IvHandle) -> Self {
        Self {
            kind,
            file,
            qp,
            qpn: 0,
            wait: None,
            connect: None,
            accept: None,
            pdata: Vec::new(),
            result: None,
            step_failure: None,
            alt_sgid_index: 0,
            lap: None,
        }
    }
}

/// Modifies a multi-phase request posts at once at most (INIT, RTR, RTS).
const MAX_CHAIN: usize = 3;

/// The modifies of a chain: room for [`MAX_CHAIN`].
type Steps = [(QpModify, Phase); MAX_CHAIN];

/// The engine's accept parameters of a `CM_ACCEPT` (checked) for the QP
/// numbered `qpn`.
fn accept_params(i: &IvCmAcceptIn, qpn: u32) -> AcceptParams<'static> {
    let flags = u32::from(i.flags);
    AcceptParams {
        qpn,
        starting_psn: i.starting_psn,
        responder_resources: i.responder_resources,
        initiator_depth: i.initiator_depth,
        target_ack_delay: i.target_ack_delay,
        flow_control: flags & IV_CM_FLOW_CONTROL != 0,
        rnr_retry_count: i.rnr_retry_count,
        srq: flags & IV_CM_SRQ != 0,
        min_rnr_timer: i.min_rnr_timer,
        ..AcceptParams::default()
    }
}

/// `CM_INIT_QP_ATTR`: the attributes that move the QP of `id`'s
/// connection to the state `i` asks for, as the IB CM's
/// `ib_cm_init_qp_attr`: a passive CEP that has not accepted yet gets them
/// from the REQ (responder resources and initiator depth as the REQ
/// allows, the send PSN from `i`); otherwise the connection's own
/// ([`Engine::qp_attr`]). Out of line: the attribute temporaries stay off
/// the request path's stack (docs/stack-budget.md).
///
/// # Errors
/// `STATUS_INVALID_PARAMETER` (a state other than INIT, RTR, RTS; a PSN
/// above 24 bits), `STATUS_INVALID_DEVICE_STATE` (the CEP's state does not
/// give them).
#[inline(never)]
fn init_qp_attr(
    engine: &Engine,
    id: irpverbs_cm::CepId,
    i: &IvCmInitQpAttrIn,
) -> Result<IvCmInitQpAttrOut, NtStatus> {
    let target = match i.qp_state {
        IV_QPS_INIT => QpTarget::Init,
        IV_QPS_RTR => QpTarget::Rtr,
        IV_QPS_RTS => QpTarget::Rts,
        _ => return Err(STATUS_INVALID_PARAMETER),
    };
    if i.starting_psn > 0xFF_FFFF {
        return Err(STATUS_INVALID_PARAMETER);
    }
    // The states the IB CM gives them in: from the REQ (INIT also on the
    // active side before the REP) to established; not once a disconnect
    // began.
    let state = engine.state(id);
    let answering = matches!(state, Some(CmState::ReqRcvd | CmState::MraReqSent));
    let connected = matches!(
        state,
        Some(
            CmState::RepRcvd
                | CmState::MraRepSent
                | CmState::RepSent
                | CmState::MraRepRcvd
                | CmState::Established
        )
    );
    let requested = matches!(state, Some(CmState::ReqSent | CmState::MraReqRcvd));
    if !(answering || connected || (requested && target == QpTarget::Init)) {
        return Err(STATUS_INVALID_DEVICE_STATE);
    }
    let m = if answering && target != QpTarget::Init {
        // Not accepted yet: the most the REQ allows (each side's depth is
        // cut to the other's when the accept comes).
        let a = AcceptParams {
            starting_psn: i.starting_psn,
            responder_resources: u8::MAX,
            initiator_depth: u8::MAX,
            ..AcceptParams::default()
        };
        engine.accept_qp_attr(id, &a, target)
    } else {
        engine.qp_attr(id, target)
    }
    .map_err(cm_status)?;
    // The QP's access flags as `MODIFY_QP` takes them (the remote ones,
    // as the IB CM gives them; local write is every QP's).
    let mut attr = m.attr;
    attr.qp_access_flags &=
        IV_ACCESS_REMOTE_WRITE | IV_ACCESS_REMOTE_READ | IV_ACCESS_REMOTE_ATOMIC;
    Ok(IvCmInitQpAttrOut {
        attr_mask: m.mask,
        reserved: 0,
        attr,
    })
}

/// The modifies that move a connect's QP (`accept` is `None`) or an
/// accept's to each of `targets` in turn, from the CM's attributes, written
/// to the front of `steps` (filled in place: a chain is half a KiB);
/// returns how many. Out of line: the CM's attribute temporaries are not
/// on the stack of the chain's posting (docs/stack-budget.md).
#[inline(never)]
fn cm_steps(
    engine: &Engine,
    id: irpverbs_cm::CepId,
    accept: Option<&AcceptParams<'_>>,
    targets: &[(QpTarget, Phase)],
    steps: &mut Steps,
) -> Result<usize, irpverbs_cm::CmError> {
    if targets.len() > MAX_CHAIN {
        return Err(irpverbs_cm::CmError::InvalidParam("modify chain"));
    }
    for (&(t, phase), step) in targets.iter().zip(steps.iter_mut()) {
        let m = match accept {
            Some(a) => engine.accept_qp_attr(id, a, t)?,
            None => engine.qp_attr(id, t)?,
        };
        *step = (m, phase);
    }
    Ok(targets.len())
}

/// CEP objects a device holds at most (the engine's table is larger).
pub const MAX_CEPS_PER_DEVICE: u32 = 1 << 20;

/// `IV_CM_*` flags of a message's flow control and SRQ bits.
fn cm_flags(flow_control: bool, srq: bool) -> u8 {
    let mut f = 0;
    if flow_control {
        f |= IV_CM_FLOW_CONTROL as u8;
    }
    if srq {
        f |= IV_CM_SRQ as u8;
    }
    f
}

/// A message's private data into an event.
fn set_pdata(out: &mut IvCepEventOut, pd: &[u8]) {
    let n = pd.len().min(out.private_data.len());
    out.private_data[..n].copy_from_slice(&pd[..n]);
    out.private_data_len = n as u16;
}

/// A message's additional information into an event.
fn set_ari(out: &mut IvCepEventOut, ari: &[u8]) {
    let n = ari.len().min(out.ari.len());
    out.ari[..n].copy_from_slice(&ari[..n]);
    out.ari_len = n as u8;
}

/// The first `len` bytes of a request's private data (`None` when `len`
/// is beyond both the array and the message's `max`).
fn pdata(bytes: &[u8], len: usize, max: u32) -> Option<&[u8]> {
    if len > max as usize {
        return None;
    }
    bytes.get(..len)
}

/// The GSI of the CM at `gid`, reached from port 1, GID index 0.
fn gsi_dest(gid: [u8; 16]) -> MadAddr {
    MadAddr {
        port_num: 1,
        pkey_index: 0,
        sgid_index: 0,
        gid,
        lid: 0,
        qpn: crate::hca::GSI_QPN,
        sl: 0,
        traffic_class: 0,
        hop_limit: 64,
        flow_label: 0,
    }
}

/// A connection-manager request's kind (`Verb::Cm`). Its input, large with
/// private data, stays in the request's system buffer until
/// [`Device::cm_request`] reads it ([`CmIn::read`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CmOp {
    Connect,
    Accept,
    Reject,
    Disconnect,
    Mra,
    SidrRequest,
    SidrReply,
    Lap,
    Apr,
    InitQpAttr,
    Establish,
}

/// A connection-manager request's input.
enum CmIn {
    CmConnect(IvCmConnectIn),
    CmAccept(IvCmAcceptIn),
    CmReject(IvCmRejectIn),
    CmDisconnect(IvCmDisconnectIn),
    CmMra(IvCmMraIn),
    SidrRequest(IvSidrRequestIn),
    SidrReply(IvSidrReplyIn),
    CmLap(IvCmLapIn),
    CmApr(IvCmAprIn),
    InitQpAttr(IvCmInitQpAttrIn),
    Establish(IvHandleIn),
}

impl CmIn {
    /// Reads the input of an `op` request (its length was checked at
    /// dispatch; another length is `STATUS_INFO_LENGTH_MISMATCH`).
    fn read(op: CmOp, input: &[u8]) -> Result<Self, NtStatus> {
        fn read<T: zerocopy::FromBytes>(input: &[u8]) -> Result<T, NtStatus> {
            T::read_from_bytes(input).map_err(|_| STATUS_INFO_LENGTH_MISMATCH)
        }
        Ok(match op {
            CmOp::Connect => Self::CmConnect(read(input)?),
            CmOp::Accept => Self::CmAccept(read(input)?),
            CmOp::Reject => Self::CmReject(read(input)?),
            CmOp::Disconnect => Self::CmDisconnect(read(input)?),
            CmOp::Mra => Self::CmMra(read(input)?),
            CmOp::SidrRequest => Self::SidrRequest(read(input)?),
            CmOp::SidrReply => Self::SidrReply(read(input)?),
            CmOp::Lap => Self::CmLap(read(input)?),
            CmOp::Apr => Self::CmApr(read(input)?),
            CmOp::InitQpAttr => Self::InitQpAttr(read(input)?),
            CmOp::Establish => Self::Establish(read(input)?),
        })
    }
}

impl<P: Platform, H: Hca> Device<P, H> {
    /// `IOCTL_IV_LISTEN_ADDR`: `IOCTL_IV_LISTEN` for REQs addressed to one
    /// GID (all zero: any), as the CM engine's `listen_on`: listeners on
    /// different GIDs share a service ID, one on any GID shares it with
    /// none. A GID must be one of the device's: the ports' GID tables are
    /// walked first ([`crate::resolve::Resolve::owner`], an asynchronous
    /// command per entry) and the listen happens in the DPC when the walk
    /// finds it ([`Device::listen_addr_checked`]); `STATUS_INVALID_ADDRESS`
    /// when no active port has it.
    ///
    /// IRQL: DISPATCH_LEVEL, under the device lock.
    pub(crate) fn listen_addr(
        &self,
        s: &mut State<P::Request>,
        file: FileKey,
        i: &IvListenAddrIn,
        request: P::Request,
    ) -> Option<Done<P::Request>> {
        let id = match self.listen_cep(s, file, i.cep) {
            Ok(id) => id,
            Err(st) => return Some((request, st, Response::None)),
        };
        if i.gid == [0; 16] {
            return Some((request, listen_on(s, id, i), Response::None));
        }
        match crate::resolve::Resolve::owner(i, self.hca.caps()) {
            Ok((walk, cmd)) => {
                let Ok(walk) = irpverbs_ring::try_box(walk) else {
                    return Some((request, STATUS_INSUFFICIENT_RESOURCES, Response::None));
                };
                let op = crate::verbs::Op::Resolve(walk);
                self.post(s, file, Some(request), op, cmd);
                None
            }
            Err(st) => Some((request, st, Response::None)),
        }
    }

    /// The CEP `LISTEN_ADDR` names, idle.
    fn listen_cep(
        &self,
        s: &mut State<P::Request>,
        file: FileKey,
        cep: IvHandle,
    ) -> Result<irpverbs_cm::CepId, NtStatus> {
        let idx = s
            .file(file)
            .and_then(|f| f.objects.lookup(cep, Kind::Cep))?;
        let id = cep_mut(s, file, idx)
            .map(|c| c.id)
            .ok_or(STATUS_INVALID_HANDLE)?;
        if s.cm.engine.state(id) != Some(CmState::Idle) {
            return Err(STATUS_INVALID_DEVICE_STATE);
        }
        // The listener's backlog room, before it listens.
        reserve_backlog(s, file, idx)?;
        Ok(id)
    }

    /// The GID walk of a `LISTEN_ADDR` ended: found, the listen (its CEP
    /// looked up again: it may be gone or busy by now); else the walk's
    /// status.
    pub(crate) fn listen_addr_checked(
        &self,
        s: &mut State<P::Request>,
        file: FileKey,
        i: &IvListenAddrIn,
        found: Result<(), NtStatus>,
    ) -> NtStatus {
        match found.and_then(|()| self.listen_cep(s, file, i.cep)) {
            Ok(id) => listen_on(s, id, i),
            Err(st) => st,
        }
    }
}

/// The engine's listen for `LISTEN_ADDR` on an idle CEP.
fn listen_on<R>(s: &mut State<R>, id: irpverbs_cm::CepId, i: &IvListenAddrIn) -> NtStatus {
    match s.cm.engine.listen_on(id, i.service_id, i.gid) {
        Ok(()) => STATUS_SUCCESS,
        Err(irpverbs_cm::CmError::ServiceInUse) => STATUS_ADDRESS_ALREADY_EXISTS,
        Err(e) => cm_status(e),
    }
}
