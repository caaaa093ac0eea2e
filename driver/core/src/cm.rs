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
//! [`DeviceStats::cm_mads_malformed`]: crate::DeviceStats::cm_mads_malformed
//! [`DeviceStats::cm_send_failures`]: crate::DeviceStats::cm_send_failures

use alloc::sync::Arc;
use alloc::vec::Vec;

use irpverbs_cm::{Config, Engine, MadAddr, Transmit};

use irpverbs_abi::*;

use crate::device::{Response, State, Verb};
use crate::hca::{MadIn, MadOut};
use crate::notify::{Done, WaitKind, pend, take_wait};
use crate::object::{Body, Life};
use crate::{Device, FileKey, Hca, Kind, Platform, SpinLock};

/// Arms the CM's platform timer to fire at an absolute time (ns on the
/// clock of [`Platform::now_ns`]), replacing any earlier arming. Called
/// with no driver lock held, at IRQL <= DISPATCH_LEVEL.
pub type CmTimerArm = Arc<dyn Fn(u64) + Send + Sync>;

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
    transmits: Vec<Transmit>,
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

    /// The engine's transmits, and the timer to arm if its deadline
    /// changed.
    pub(crate) fn take(&mut self) -> CmFlush {
        let mut transmits = Vec::new();
        while let Some(t) = self.engine.poll_transmit() {
            transmits.push(t);
        }
        let next = self.engine.next_deadline();
        let arm = match (&self.arm, next) {
            (Some(f), Some(d)) if self.armed != Some(d) => {
                self.armed = Some(d);
                Some((Arc::clone(f), d))
            }
            _ => None,
        };
        CmFlush { transmits, arm }
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
    /// [`crate::Event::Mad`], under the device lock).
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
        for t in &flush.transmits {
            if self.hca.send_mad(&mad_out(t)).is_err() {
                failed += 1;
            }
        }
        if failed != 0 {
            self.state.lock(|s| s.stats.cm_send_failures += failed);
        }
        if let Some((arm, deadline)) = flush.arm {
            arm(deadline);
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
    pub fn cm_timer(&self) {
        let now = self.platform.now_ns();
        let (flush, done) = self.state.lock(|s| {
            s.cm.armed = None;
            s.cm.engine.on_timer(now);
            self.cep_deliver(s);
            (s.cm.take(), core::mem::take(&mut s.deferred))
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
        request: P::Request,
    ) -> Option<Done<P::Request>> {
        let fail = |r: P::Request, st: NtStatus| Some((r, st, Response::None));
        match verb {
            Verb::CreateCep(i) => {
                let id = match s.cm.engine.create(0) {
                    Ok(id) => id,
                    Err(e) => return fail(request, cm_status(e)),
                };
                match self.new_cep(s, file, id, i.user_context) {
                    Ok(cep) => Some((
                        request,
                        STATUS_SUCCESS,
                        Response::Cep(IvCreateCepOut { cep }),
                    )),
                    Err(st) => {
                        let _ = s.cm.engine.destroy(id, self.platform.now_ns());
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
                let wait = cep_mut(s, file, idx).and_then(|c| c.wait);
                if wait.is_some_and(|k| s.waits.contains_key(&k)) {
                    return fail(request, STATUS_DEVICE_BUSY);
                }
                if let Some(out) = self.next_cep_event(s, file, idx) {
                    return Some((request, STATUS_SUCCESS, Response::CepEvent(out)));
                }
                let key = match pend(s, file, WaitKind::CepEvent(idx), request) {
                    Ok(k) => k,
                    Err(r) => return Some((r, STATUS_CANCELLED, Response::None)),
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
    ) -> Result<IvHandle, NtStatus> {
        let body = Body::Cep(crate::object::Cep {
            id,
            user_context,
            wait: None,
        });
        let idx = self.reserve(s, file, body, MAX_CEPS_PER_DEVICE)?;
        let f = s.files.get_mut(&file).ok_or(STATUS_INVALID_HANDLE)?;
        f.objects.get_mut(idx).life = Life::Live;
        s.ceps.insert(id, (file, idx));
        Ok(s.files.get(&file).map_or(0, |f| f.objects.handle_of(idx)))
    }

    /// Ends a CEP object's engine side (from [`Device::free_object`]): the
    /// engine destroys it (sending the REJ or DREQ its state asks for) and
    /// its pended request completes with `STATUS_CANCELLED`.
    pub(crate) fn cep_freed(&self, s: &mut State<P::Request>, cep: &crate::object::Cep) {
        if s.ceps.remove(&cep.id).is_some() {
            let _ = s.cm.engine.destroy(cep.id, self.platform.now_ns());
        }
        if let Some(r) = cep.wait.and_then(|k| take_wait(s, k)) {
            s.deferred.push((r, STATUS_CANCELLED, Response::None));
        }
    }

    /// The next event of the CEP at `idx` the owner should see, converted;
    /// `None` when it has none (which re-arms it in the engine).
    fn next_cep_event(
        &self,
        s: &mut State<P::Request>,
        file: FileKey,
        idx: u32,
    ) -> Option<IvCepEventOut> {
        let c = cep_mut(s, file, idx)?;
        let (id, user_context) = (c.id, c.user_context);
        let handle = s.files.get(&file)?.objects.handle_of(idx);
        loop {
            let ev = s.cm.engine.poll_event(id)?;
            let mut out = IvCepEventOut {
                cep: handle,
                user_context,
                ..IvCepEventOut::default()
            };
            use irpverbs_cm::Event as E;
            out.event_type = match ev {
                E::ConnectRequest { cep, src, req } => {
                    match self.new_cep(s, file, cep, user_context) {
                        Ok(h) => out.cep = h,
                        Err(_) => {
                            // No room for it: the engine rejects it.
                            let _ = s.cm.engine.destroy(cep, self.platform.now_ns());
                            continue;
                        }
                    }
                    out.service_id = req.service_id;
                    out.remote_gid = src.gid;
                    out.remote_qpn = req.local_qpn;
                    IV_CEP_EVENT_CONNECT_REQUEST
                }
                E::Reply { rep } => {
                    out.remote_qpn = rep.local_qpn;
                    IV_CEP_EVENT_REPLY
                }
                E::Established => IV_CEP_EVENT_ESTABLISHED,
                E::Rejected { rej, .. } => {
                    out.reason = u32::from(rej.reason.0);
                    IV_CEP_EVENT_REJECTED
                }
                E::MraReceived { .. } => IV_CEP_EVENT_MRA,
                E::Timeout { .. } => IV_CEP_EVENT_TIMEOUT,
                E::DisconnectRequest { .. } => IV_CEP_EVENT_DISCONNECT_REQUEST,
                E::DisconnectReply { .. } => IV_CEP_EVENT_DISCONNECT_REPLY,
                E::StaleConnection => IV_CEP_EVENT_STALE,
                E::TimewaitExit => IV_CEP_EVENT_TIMEWAIT_EXIT,
                E::LapReceived { .. } => IV_CEP_EVENT_LAP,
                E::AprReceived { .. } => IV_CEP_EVENT_APR,
                E::SidrRequest { .. } => IV_CEP_EVENT_SIDR_REQUEST,
                E::SidrReply { .. } => IV_CEP_EVENT_SIDR_REPLY,
                // Only `destroy` returns it, never `poll_event`.
                E::Canceled { .. } => continue,
            };
            return Some(out);
        }
    }

    /// Completes the pended `GET_CEP_EVENT` of every CEP the engine names
    /// as having events (the polling model); a CEP with no request pended
    /// keeps its events for the next one.
    pub(crate) fn cep_deliver(&self, s: &mut State<P::Request>) {
        while let Some((id, _)) = s.cm.engine.poll_ready() {
            let Some(&(file, idx)) = s.ceps.get(&id) else {
                continue;
            };
            let Some(key) = cep_mut(s, file, idx).and_then(|c| c.wait) else {
                continue;
            };
            let Some(r) = take_wait(s, key) else {
                continue;
            };
            if let Some(c) = cep_mut(s, file, idx) {
                c.wait = None;
            }
            match self.next_cep_event(s, file, idx) {
                Some(out) => s
                    .deferred
                    .push((r, STATUS_SUCCESS, Response::CepEvent(out))),
                None => {
                    if let Ok(k) = pend(s, file, WaitKind::CepEvent(idx), r).map_err(|r| {
                        s.deferred.push((r, STATUS_CANCELLED, Response::None));
                    }) {
                        if let Some(c) = cep_mut(s, file, idx) {
                            c.wait = Some(k);
                        }
                    }
                }
            }
        }
    }
}

/// CEP objects a device holds at most (the engine's table is larger).
pub const MAX_CEPS_PER_DEVICE: u32 = 1 << 20;
