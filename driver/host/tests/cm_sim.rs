//! The connection manager in the driver on the seeded, faulty simulated
//! wire (`irpverbs_soft::sim`, through `irpverbs_host::simwire`): two host
//! devices whose soft HCAs lose, duplicate, reorder (delay past the CM's
//! retransmission timeouts: late MADs) and corrupt datagrams; the CM's
//! platform timers and the wire on one virtual clock; everything on the
//! test's thread, so a seed replays exactly. Verifier on.
//!
//! Per seed: listen, `CM_CONNECT` and `CM_ACCEPT` (async), a SEND each way,
//! `CM_DISCONNECT`. Each request ends either in `STATUS_SUCCESS` (and then
//! data moves intact) or in a clear failure (`STATUS_IO_TIMEOUT`,
//! `STATUS_CONNECTION_REFUSED`), and the two sides end consistent: an
//! accept succeeds only if the connect did; a side whose connection the
//! other no longer has learns it (a REJ or DREQ event, or its disconnect
//! completes) and its QP ends in ERR. Every pended request completes, and
//! nothing leaks at unload. Then the wire heals and a fresh connection
//! must work.
//!
//! A failure names the seed; `IRPVERBS_SIM_SEED=n` replays it alone,
//! `IRPVERBS_SIM_SEEDS=n` changes how many run (default 500).

use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use irpverbs_abi::*;
use irpverbs_host::platform::{HostConfig, TimerClock};
use irpverbs_host::simwire::SimHosts;
use irpverbs_host::{Backend, CmSubmitter, Engine, HostDevice, HostDeviceConfig};
use irpverbs_soft::SoftConfig;
use irpverbs_soft::sim::SimConfig;
use irpverbs_verbs::{Client, IntoClient, SendWr};
use zerocopy::{FromBytes, IntoBytes};

mod common;
use common::{End, connect_defaults};

crate::on_each_backend!(
    cm_over_a_faulty_wire_recovers_or_fails_cleanly,
    a_req_reusing_an_established_remote_qp_is_stale,
    a_sidr_request_to_a_silent_peer_times_out,
    reqs_with_values_the_cm_refuses_are_rejected_with_their_reasons,
);

/// SplitMix64 for the scenario's choices (the wire has its own, from the
/// same seed).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn pick<T: Copy>(&mut self, of: &[T]) -> T {
        of[(self.next() % of.len() as u64) as usize]
    }
}

const MS: u64 = 1_000_000;
/// Virtual time a phase may take (far past every retry: a request not
/// complete by then is a hang).
const PHASE_LIMIT: u64 = 60_000 * MS;
/// Virtual time after a phase's requests complete for late MADs to land.
const SETTLE: u64 = 2_000 * MS;

fn device(backend: Backend, last: u8) -> Arc<HostDevice> {
    HostDevice::new(HostDeviceConfig {
        backend,
        engine: Engine::Inline,
        platform: HostConfig {
            clock: TimerClock::Virtual,
            ..HostConfig::default()
        },
        soft: SoftConfig {
            ip: IpAddr::V4(Ipv4Addr::new(10, 0, 2, last)),
            node_guid: 0x0200_00FF_FE00_0200 | u64::from(last),
            ..SoftConfig::default()
        },
        ..HostDeviceConfig::default()
    })
    .expect("host device")
}

fn open(d: &Arc<HostDevice>) -> (Client, CmSubmitter) {
    let (file, cm) = d
        .open(FILE_READ_ACCESS | FILE_WRITE_ACCESS)
        .expect("open")
        .with_cm_submitter();
    (file.into_client(), cm)
}

/// A request's result, once it completed.
type Slot = Arc<Mutex<Option<(NtStatus, Vec<u8>)>>>;

fn submit(s: &CmSubmitter, code: u32, input: &[u8], out: usize) -> Slot {
    let slot: Slot = Arc::default();
    let done = Arc::clone(&slot);
    s.submit(code, input, out, move |st, info, bytes| {
        *done.lock().unwrap() = Some((st, bytes[..info.min(bytes.len())].to_vec()));
    })
    .expect("a CM request");
    slot
}

fn status_of(slot: &Slot) -> Option<NtStatus> {
    slot.lock().unwrap().as_ref().map(|r| r.0)
}

fn sync<O: FromBytes>(s: &CmSubmitter, code: u32, input: &[u8]) -> O {
    let (st, out) = s.ioctl(code, input, size_of::<O>());
    assert_eq!(st, STATUS_SUCCESS, "{}", status_name(st));
    O::read_from_bytes(&out[..size_of::<O>()]).unwrap()
}

fn sync_status(s: &CmSubmitter, code: u32, input: &[u8]) -> NtStatus {
    s.ioctl(code, input, 0).0
}

fn new_cep(s: &CmSubmitter, ctx: u64) -> IvHandle {
    sync::<IvCreateCepOut>(
        s,
        IOCTL_IV_CREATE_CEP,
        IvCreateCepIn { user_context: ctx }.as_bytes(),
    )
    .cep
}

fn destroy(s: &CmSubmitter, cep: IvHandle) {
    let st = sync_status(
        s,
        IOCTL_IV_DESTROY_CEP,
        IvHandleIn { handle: cep }.as_bytes(),
    );
    assert_eq!(st, STATUS_SUCCESS, "{}", status_name(st));
}

fn get_event(s: &CmSubmitter, cep: IvHandle) -> Slot {
    submit(
        s,
        IOCTL_IV_GET_CEP_EVENT,
        IvHandleIn { handle: cep }.as_bytes(),
        size_of::<IvCepEventOut>(),
    )
}

/// A CEP's events as they come (a `GET_CEP_EVENT` kept pended), and its
/// answer to a DREQ (a `CM_DISCONNECT`, once).
struct Watch<'s> {
    sub: &'s CmSubmitter,
    cep: IvHandle,
    pending: Option<Slot>,
    events: Vec<IvCepEventOut>,
    disconnect: Option<Slot>,
    answer_dreq: bool,
    /// Every request it submitted (all must complete).
    all: Vec<Slot>,
}

impl<'s> Watch<'s> {
    fn new(sub: &'s CmSubmitter, cep: IvHandle) -> Self {
        Self {
            sub,
            cep,
            pending: None,
            events: Vec::new(),
            disconnect: None,
            answer_dreq: true,
            all: Vec::new(),
        }
    }

    fn pump(&mut self) {
        loop {
            if let Some(p) = &self.pending {
                let Some((st, out)) = p.lock().unwrap().clone() else {
                    return;
                };
                if st != STATUS_SUCCESS {
                    // Cancelled: the CEP was destroyed (the slot stays).
                    assert_eq!(st, STATUS_CANCELLED, "{}", status_name(st));
                    return;
                }
                self.pending = None;
                let ev = IvCepEventOut::read_from_bytes(&out).unwrap();
                if ev.event_type == IV_CEP_EVENT_DISCONNECT_REQUEST
                    && self.answer_dreq
                    && self.disconnect.is_none()
                {
                    self.disconnect();
                }
                self.events.push(ev);
            }
            let p = get_event(self.sub, self.cep);
            self.all.push(Arc::clone(&p));
            self.pending = Some(p);
        }
    }

    fn disconnect(&mut self) {
        let d = IvCmDisconnectIn {
            cep: self.cep,
            ..IvCmDisconnectIn::default()
        };
        let slot = submit(self.sub, IOCTL_IV_CM_DISCONNECT, d.as_bytes(), 0);
        self.all.push(Arc::clone(&slot));
        self.disconnect = Some(slot);
    }

    fn saw(&self, event_type: u32) -> bool {
        self.events.iter().any(|e| e.event_type == event_type)
    }

    /// The CM told this side its connection is gone.
    fn told_gone(&self) -> bool {
        [
            IV_CEP_EVENT_REJECTED,
            IV_CEP_EVENT_DISCONNECT_REQUEST,
            IV_CEP_EVENT_STALE,
        ]
        .iter()
        .any(|&t| self.saw(t))
    }

    fn disconnect_status(&self) -> Option<NtStatus> {
        self.disconnect.as_ref().and_then(status_of)
    }
}

/// The listener's side: accepts the first connect request with `qp`,
/// rejects later ones (late or duplicated REQs of attempts given up).
struct Passive<'s> {
    sub: &'s CmSubmitter,
    listener: IvHandle,
    qp: IvHandle,
    pending: Slot,
    accepted: Option<(IvHandle, Slot)>,
    rejected: u32,
    all: Vec<Slot>,
}

impl<'s> Passive<'s> {
    fn new(sub: &'s CmSubmitter, listener: IvHandle, qp: IvHandle) -> Self {
        let pending = get_event(sub, listener);
        Self {
            sub,
            listener,
            qp,
            pending: Arc::clone(&pending),
            accepted: None,
            rejected: 0,
            all: vec![pending],
        }
    }

    fn pump(&mut self) {
        loop {
            let Some((st, out)) = self.pending.lock().unwrap().clone() else {
                return;
            };
            if st != STATUS_SUCCESS {
                assert_eq!(st, STATUS_CANCELLED, "{}", status_name(st));
                return;
            }
            let ev = IvCepEventOut::read_from_bytes(&out).unwrap();
            assert_eq!(ev.event_type, IV_CEP_EVENT_CONNECT_REQUEST, "{ev:?}");
            if self.accepted.is_none() {
                let acc = IvCmAcceptIn {
                    cep: ev.cep,
                    qp: self.qp,
                    starting_psn: 0x20,
                    responder_resources: 4,
                    initiator_depth: 4,
                    rnr_retry_count: 7,
                    min_rnr_timer: 12,
                    flags: IV_CM_FLOW_CONTROL as u8,
                    ..IvCmAcceptIn::default()
                };
                let slot = submit(self.sub, IOCTL_IV_CM_ACCEPT, acc.as_bytes(), 0);
                self.all.push(Arc::clone(&slot));
                self.accepted = Some((ev.cep, slot));
            } else {
                let rej = IvCmRejectIn {
                    cep: ev.cep,
                    reason: 28,
                    ..IvCmRejectIn::default()
                };
                // A REJ the CEP's state does not allow any more (the
                // remote rejected it meanwhile) is refused; either way the
                // CEP goes.
                let _ = sync_status(self.sub, IOCTL_IV_CM_REJECT, rej.as_bytes());
                destroy(self.sub, ev.cep);
                self.rejected += 1;
            }
            self.pending = get_event(self.sub, self.listener);
            self.all.push(Arc::clone(&self.pending));
        }
    }

    fn accept_status(&self) -> Option<NtStatus> {
        self.accepted.as_ref().and_then(|(_, s)| status_of(s))
    }
}

/// Steps the net, running `pump` (which reacts to what completed and
/// says whether the phase is done) after each step, until it is done, then
/// `SETTLE` more; panics if it never is.
fn drive(net: &SimHosts, what: &str, mut pump: impl FnMut() -> bool) {
    let limit = net.now() + PHASE_LIMIT;
    let reached = net.run_until(limit, &mut pump);
    assert!(
        reached,
        "{what}: not done after {PHASE_LIMIT} ns of virtual time"
    );
    let settle = net.now() + SETTLE;
    while net.step(settle) {
        pump();
    }
    pump();
}

fn qp_state(e: &End<'_>) -> u32 {
    e.qp.query().unwrap().attr.qp_state
}

/// Sends `msg` from `from` to `to` (a receive posted first) and runs the
/// net until both complete; the receiver's bytes.
fn send(net: &SimHosts, from: &End<'_>, to: &End<'_>, msg: &[u8], id: u64) -> Vec<u8> {
    to.qp.post_recv(id, &[to.sge(4096, 256)]).unwrap();
    from.mem.fill(0, msg);
    from.qp
        .post_send(&SendWr {
            wr_id: id,
            opcode: IV_WR_SEND,
            flags: IV_SEND_SIGNALED,
            sges: &[from.sge(0, msg.len())],
            ..SendWr::default()
        })
        .unwrap();
    let mut wcs = [None, None];
    let poll = |e: &End<'_>, slot: &mut Option<IvCqe>| {
        if slot.is_none() {
            let mut buf = [IvCqe::default(); 1];
            if e.cq.poll(&mut buf).unwrap() == 1 {
                *slot = Some(buf[0]);
            }
        }
    };
    let limit = net.now() + PHASE_LIMIT;
    let done = net.run_until(limit, || {
        let [s, r] = &mut wcs;
        poll(from, s);
        poll(to, r);
        s.is_some() && r.is_some()
    });
    assert!(done, "SEND {id}: no completions {wcs:?}");
    let [s, r] = wcs.map(Option::unwrap);
    assert_eq!((s.wr_id, s.status), (id, IV_WC_SUCCESS), "send {s:?}");
    assert_eq!((r.wr_id, r.status), (id, IV_WC_SUCCESS), "recv {r:?}");
    assert_eq!(r.byte_len as usize, msg.len());
    to.mem.read(4096, msg.len())
}

/// What a seed did (for the run's summary).
#[derive(Clone, Copy, Debug, Default)]
struct Outcome {
    connected: bool,
    connect_failed: bool,
    half_open: bool,
    late_requests: u32,
    disconnect_timeouts: u32,
}

/// The wire and the CM's knobs of a seed.
fn config(seed: u64) -> (SimConfig, u8) {
    let mut r = Rng(seed ^ 0x5EED_C0FF_EE00_0000);
    let wire = SimConfig {
        seed,
        loss_ppm: r.pick(&[0, 20_000, 100_000, 250_000]),
        dup_ppm: r.pick(&[0, 50_000, 200_000]),
        corrupt_ppm: r.pick(&[0, 10_000, 50_000]),
        delay_ns: 2_000,
        // Up to 40 ms: past the CM's 17 ms response timeout, so MADs
        // arrive after their retransmissions (late) and out of order.
        jitter_ns: r.pick(&[0, 50_000, 5 * MS, 40 * MS]),
        ..SimConfig::default()
    };
    let retries = r.pick(&[1, 2, 4, 6]);
    (wire, retries)
}

fn one_seed(backend: Backend, seed: u64) -> Outcome {
    let (wire, max_cm_retries) = config(seed);
    let (da, db) = (device(backend, 1), device(backend, 2));
    let net = SimHosts::new(wire, &[&da, &db]).expect("sim net");
    let (ca, sa) = open(&da);
    let (cb, sb) = open(&db);
    let mut out = Outcome::default();
    {
        let (a, b) = (End::new_rc(&ca), End::new_rc(&cb));
        let listener = new_cep(&sb, 1);
        let st = sync_status(
            &sb,
            IOCTL_IV_LISTEN,
            IvListenIn {
                cep: listener,
                service_id: 0x51_0000 + seed,
            }
            .as_bytes(),
        );
        assert_eq!(st, STATUS_SUCCESS);
        let ccep = new_cep(&sa, 2);
        let connect = IvCmConnectIn {
            cep: ccep,
            qp: a.qp.handle(),
            service_id: 0x51_0000 + seed,
            local_gid: da.soft().gid(),
            remote_gid: db.soft().gid(),
            starting_psn: 0x10,
            // 4.096 us * 2^12 ~ 17 ms each way.
            cm_response_timeout: 12,
            max_cm_retries,
            local_ack_timeout: 12,
            path_mtu: IV_MTU_1024 as u8,
            ..connect_defaults()
        };
        let conn = submit(&sa, IOCTL_IV_CM_CONNECT, connect.as_bytes(), 0);
        let mut passive = Passive::new(&sb, listener, b.qp.handle());
        let mut wa = Watch::new(&sa, ccep);
        let mut wb: Option<Watch<'_>> = None;
        // Connect phase: both requests complete (the accept if the REQ
        // ever arrived).
        drive(&net, "connect", || {
            passive.pump();
            if status_of(&conn).is_some() {
                wa.pump();
            }
            if let (None, Some((cep, slot))) = (&wb, &passive.accepted) {
                if status_of(slot).is_some() {
                    wb = Some(Watch::new(&sb, *cep));
                }
            }
            if let Some(w) = &mut wb {
                w.pump();
            }
            status_of(&conn).is_some()
                && passive
                    .accepted
                    .as_ref()
                    .is_none_or(|(_, s)| status_of(s).is_some())
        });
        out.late_requests = passive.rejected;
        let sc = status_of(&conn).unwrap();
        let sacc = passive.accept_status();
        for st in [Some(sc), sacc].into_iter().flatten() {
            assert!(
                [STATUS_SUCCESS, STATUS_IO_TIMEOUT, STATUS_CONNECTION_REFUSED].contains(&st),
                "a connect or accept ended with {}",
                status_name(st)
            );
        }
        // The passive side completes on the RTU, which the active side
        // sends only once its connect succeeded.
        if sacc == Some(STATUS_SUCCESS) {
            assert_eq!(sc, STATUS_SUCCESS, "accepted, but the connect failed");
        }
        let a_up = sc == STATUS_SUCCESS && !wa.told_gone();
        let b_up = sacc == Some(STATUS_SUCCESS) && !wb.as_ref().is_some_and(Watch::told_gone);
        out.connected = a_up && b_up;
        out.connect_failed = sc != STATUS_SUCCESS;
        out.half_open = a_up != b_up;
        if a_up && b_up {
            assert_eq!((qp_state(&a), qp_state(&b)), (IV_QPS_RTS, IV_QPS_RTS));
            assert_eq!(
                send(&net, &a, &b, b"over a faulty wire", 1),
                b"over a faulty wire"
            );
            assert_eq!(send(&net, &b, &a, b"and back", 2), b"and back");
        }
        // Disconnect phase: each side that thinks it is connected
        // disconnects (A first; B answers A's DREQ, or disconnects itself
        // if it never heard it). Every disconnect completes, with its DREP
        // or a timeout.
        if a_up {
            wa.disconnect();
        }
        drive(&net, "disconnect", || {
            wa.pump();
            passive.pump();
            if let Some(w) = wb.as_mut() {
                w.pump();
            }
            let over = |w: &Watch<'_>| w.disconnect.is_none() || w.disconnect_status().is_some();
            over(&wa) && wb.as_ref().is_none_or(over)
        });
        if let Some(w) = wb.as_mut() {
            if b_up && w.disconnect.is_none() && !w.told_gone() {
                // B never learnt of A's DREQ: it disconnects now.
                w.disconnect();
                drive(&net, "B's disconnect", || {
                    w.pump();
                    w.disconnect_status().is_some()
                });
            }
        }
        for st in [
            wa.disconnect_status(),
            wb.as_ref().and_then(Watch::disconnect_status),
        ]
        .into_iter()
        .flatten()
        {
            assert!(
                [STATUS_SUCCESS, STATUS_IO_TIMEOUT].contains(&st),
                "a disconnect ended with {}",
                status_name(st)
            );
            out.disconnect_timeouts += u32::from(st == STATUS_IO_TIMEOUT);
        }
        // Consistent ends: a side that was connected has its QP in ERR now
        // (disconnected, or moved there on learning the connection gone).
        // A side whose request failed has no QP that carries traffic.
        if sc != STATUS_SUCCESS {
            assert!(
                ![IV_QPS_RTR, IV_QPS_RTS].contains(&qp_state(&a)),
                "A's QP after a failed connect"
            );
        }
        if sacc.is_some_and(|st| st != STATUS_SUCCESS) {
            assert_eq!(qp_state(&b), IV_QPS_ERR, "B's QP after a failed accept");
        }
        if a_up {
            assert_eq!(qp_state(&a), IV_QPS_ERR, "A's QP after its disconnect");
        }
        if b_up {
            assert_eq!(qp_state(&b), IV_QPS_ERR, "B's QP after the disconnect");
        }
        // Every request completes once its CEP is destroyed.
        let mut all: Vec<Slot> = vec![conn];
        destroy(&sa, ccep);
        if let Some((cep, _)) = passive.accepted {
            destroy(&sb, cep);
        }
        destroy(&sb, listener);
        wa.pump();
        passive.pump();
        if let Some(w) = wb.as_mut() {
            w.pump();
        }
        all.extend(wa.all);
        all.extend(passive.all);
        all.extend(wb.map(|w| w.all).unwrap_or_default());
        for (i, s) in all.iter().enumerate() {
            assert!(status_of(s).is_some(), "request {i} never completed");
        }
    }
    // The wire heals: a fresh connection works.
    net.set_config(SimConfig::default());
    {
        let (a, b) = (End::new_rc(&ca), End::new_rc(&cb));
        let listener = new_cep(&sb, 3);
        let sid = 0x52_0000 + seed;
        let st = sync_status(
            &sb,
            IOCTL_IV_LISTEN,
            IvListenIn {
                cep: listener,
                service_id: sid,
            }
            .as_bytes(),
        );
        assert_eq!(st, STATUS_SUCCESS);
        let ccep = new_cep(&sa, 4);
        let connect = IvCmConnectIn {
            cep: ccep,
            qp: a.qp.handle(),
            service_id: sid,
            local_gid: da.soft().gid(),
            remote_gid: db.soft().gid(),
            starting_psn: 0x30,
            cm_response_timeout: 12,
            max_cm_retries: 2,
            local_ack_timeout: 12,
            path_mtu: IV_MTU_1024 as u8,
            ..connect_defaults()
        };
        let conn = submit(&sa, IOCTL_IV_CM_CONNECT, connect.as_bytes(), 0);
        let mut passive = Passive::new(&sb, listener, b.qp.handle());
        drive(&net, "healed connect", || {
            passive.pump();
            status_of(&conn).is_some() && passive.accept_status().is_some()
        });
        assert_eq!(status_of(&conn), Some(STATUS_SUCCESS));
        assert_eq!(passive.accept_status(), Some(STATUS_SUCCESS));
        assert_eq!(passive.rejected, 0);
        assert_eq!(send(&net, &a, &b, b"healed", 3), b"healed");
        let (bcep, _) = passive.accepted.clone().unwrap();
        let mut wa = Watch::new(&sa, ccep);
        let mut wb = Watch::new(&sb, bcep);
        wa.disconnect();
        drive(&net, "healed disconnect", || {
            wa.pump();
            wb.pump();
            wa.disconnect_status().is_some() && wb.disconnect_status().is_some()
        });
        assert_eq!(wa.disconnect_status(), Some(STATUS_SUCCESS));
        assert_eq!(wb.disconnect_status(), Some(STATUS_SUCCESS));
        assert_eq!((qp_state(&a), qp_state(&b)), (IV_QPS_ERR, IV_QPS_ERR));
        for (s, c) in [(&sa, ccep), (&sb, bcep), (&sb, listener)] {
            destroy(s, c);
        }
        wa.pump();
        wb.pump();
        passive.pump();
        for s in wa
            .all
            .iter()
            .chain(&wb.all)
            .chain(&passive.all)
            .chain([&conn])
        {
            assert!(status_of(s).is_some(), "a request never completed");
        }
    }
    drop((ca, sa, cb, sb));
    drop(net);
    for d in [&da, &db] {
        d.quiesce(Duration::from_secs(10)).expect("quiescent");
        assert_eq!(d.platform().pool_stats().live, 0, "pool leaked");
        d.unload();
    }
    out
}

/// Names the seed of a failing run (also when the failure aborts).
struct SeedGuard(u64);

impl Drop for SeedGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "seed {0} failed ({1:?}): replay it with IRPVERBS_SIM_SEED={0} cargo test -p irpverbs-host --test cm_sim",
                self.0,
                config(self.0)
            );
        }
    }
}

fn cm_over_a_faulty_wire_recovers_or_fails_cleanly(backend: Backend) {
    let seeds: Vec<u64> = match std::env::var("IRPVERBS_SIM_SEED") {
        Ok(s) => vec![s.parse().expect("IRPVERBS_SIM_SEED: a number")],
        Err(_) => {
            let n: u64 = std::env::var("IRPVERBS_SIM_SEEDS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(500);
            (0..n).collect()
        }
    };
    let mut total = Outcome::default();
    let (mut connected, mut failed, mut half_open) = (0, 0, 0);
    for &seed in &seeds {
        let guard = SeedGuard(seed);
        let o = one_seed(backend, seed);
        drop(guard);
        connected += u32::from(o.connected);
        failed += u32::from(o.connect_failed);
        half_open += u32::from(o.half_open);
        total.late_requests += o.late_requests;
        total.disconnect_timeouts += o.disconnect_timeouts;
    }
    eprintln!(
        "{} seeds: {connected} connected, {failed} connects failed, {half_open} half-open \
         resolved, {} late requests rejected, {} disconnects timed out",
        seeds.len(),
        total.late_requests,
        total.disconnect_timeouts
    );
    if seeds.len() >= 100 {
        // The faults are real: some seeds connect, some fail.
        assert!(connected > 0 && failed > 0, "{connected} {failed}");
    }
}

/// Two devices on a healthy simulated wire (the same harness, no faults).
fn healthy(backend: Backend) -> (Arc<HostDevice>, Arc<HostDevice>, SimHosts) {
    let (da, db) = (device(backend, 1), device(backend, 2));
    let net = SimHosts::new(SimConfig::default(), &[&da, &db]).expect("sim net");
    (da, db, net)
}

fn finish(net: SimHosts, devices: [&Arc<HostDevice>; 2]) {
    drop(net);
    for d in devices {
        d.quiesce(Duration::from_secs(10)).expect("quiescent");
        assert_eq!(d.platform().pool_stats().live, 0, "pool leaked");
        d.unload();
    }
}

fn connect_in(
    da: &HostDevice,
    db: &HostDevice,
    cep: IvHandle,
    qp: IvHandle,
    sid: u64,
) -> IvCmConnectIn {
    IvCmConnectIn {
        cep,
        qp,
        service_id: sid,
        local_gid: da.soft().gid(),
        remote_gid: db.soft().gid(),
        starting_psn: 0x10,
        cm_response_timeout: 12,
        max_cm_retries: 2,
        local_ack_timeout: 12,
        path_mtu: IV_MTU_1024 as u8,
        ..connect_defaults()
    }
}

/// IBTA 12.9.8.3: a REQ that reuses the remote QP of a connection the
/// passive side holds established is stale. The passive side rejects it
/// (reason 10, stale connection) and disconnects the old connection (a
/// DREQ, and a STALE event for its owner). At driver level: A's QP, still
/// connected to B in B's view, is reset by A and connected again; A's
/// connect fails with `STATUS_CONNECTION_REFUSED` and a REJECTED event of
/// reason 10; B's old CEP reports STALE; A's old CEP gets B's DREQ; B's
/// listener sees no request.
fn a_req_reusing_an_established_remote_qp_is_stale(backend: Backend) {
    let (da, db, net) = healthy(backend);
    let (ca, sa) = open(&da);
    let (cb, sb) = open(&db);
    let (a, b) = (End::new_rc(&ca), End::new_rc(&cb));
    let listener = new_cep(&sb, 1);
    let st = sync_status(
        &sb,
        IOCTL_IV_LISTEN,
        IvListenIn {
            cep: listener,
            service_id: 0x57A1E,
        }
        .as_bytes(),
    );
    assert_eq!(st, STATUS_SUCCESS);
    let old = new_cep(&sa, 2);
    let c1 = connect_in(&da, &db, old, a.qp.handle(), 0x57A1E);
    let conn = submit(&sa, IOCTL_IV_CM_CONNECT, c1.as_bytes(), 0);
    let mut passive = Passive::new(&sb, listener, b.qp.handle());
    drive(&net, "connect", || {
        passive.pump();
        status_of(&conn).is_some() && passive.accept_status().is_some()
    });
    assert_eq!(status_of(&conn), Some(STATUS_SUCCESS));
    assert_eq!(passive.accept_status(), Some(STATUS_SUCCESS));
    let (b_old, _) = passive.accepted.clone().unwrap();
    let mut wa = Watch::new(&sa, old);
    let mut wb = Watch::new(&sb, b_old);
    // Neither answers the DREQ that comes: the test looks at the events.
    wa.answer_dreq = false;
    wb.answer_dreq = false;
    // A forgets the connection (its QP reset, a new CEP) and connects the
    // same QP again.
    let reset = IvQpAttr {
        qp_state: IV_QPS_RESET,
        ..IvQpAttr::default()
    };
    a.c.modify_qp(a.qp.handle(), IV_QP_STATE, &reset).unwrap();
    let again = new_cep(&sa, 3);
    let c2 = connect_in(&da, &db, again, a.qp.handle(), 0x57A1E);
    let conn2 = submit(&sa, IOCTL_IV_CM_CONNECT, c2.as_bytes(), 0);
    let mut w2 = Watch::new(&sa, again);
    drive(&net, "stale connect", || {
        passive.pump();
        wa.pump();
        wb.pump();
        if status_of(&conn2).is_some() {
            w2.pump();
        }
        status_of(&conn2).is_some()
    });
    assert_eq!(
        status_of(&conn2),
        Some(STATUS_CONNECTION_REFUSED),
        "{:?}",
        status_of(&conn2).map(status_name)
    );
    let rej = w2.events.first().expect("the REJ is reported");
    assert_eq!((rej.event_type, rej.reason), (IV_CEP_EVENT_REJECTED, 10));
    assert!(wb.saw(IV_CEP_EVENT_STALE), "B's old CEP: {:?}", wb.events);
    assert!(
        wa.saw(IV_CEP_EVENT_DISCONNECT_REQUEST),
        "A's old CEP: {:?}",
        wa.events
    );
    assert_eq!(passive.rejected, 0, "the stale REQ reaches no listener");
    assert!(status_of(passive.all.last().unwrap()).is_none());
    for (s, c) in [(&sa, old), (&sa, again), (&sb, b_old), (&sb, listener)] {
        destroy(s, c);
    }
    wa.pump();
    wb.pump();
    w2.pump();
    passive.pump();
    for s in wa
        .all
        .iter()
        .chain(&wb.all)
        .chain(&w2.all)
        .chain(&passive.all)
    {
        assert!(status_of(s).is_some(), "a request never completed");
    }
    drop((a, b));
    drop((ca, sa, cb, sb));
    finish(net, [&da, &db]);
}

/// A SIDR request to a peer that never answers: the SIDR_REQ is sent
/// again after each timeout, then the request fails with
/// `STATUS_IO_TIMEOUT` (on the CM's platform timer, virtual clock).
fn a_sidr_request_to_a_silent_peer_times_out(backend: Backend) {
    let (da, db, net) = healthy(backend);
    let (ca, sa) = open(&da);
    let cep = new_cep(&sa, 1);
    let req = IvSidrRequestIn {
        cep,
        service_id: 0x51D7,
        // Nobody has this GID: the wire drops what is sent there.
        remote_gid: [0xFE; 16],
        // 4.096 us * 2^8 ~ 1 ms per try.
        timeout: 8,
        max_retries: 2,
        ..IvSidrRequestIn::default()
    };
    let sent = da.soft().stats().mads_sent;
    let slot = submit(
        &sa,
        IOCTL_IV_SIDR_REQUEST,
        req.as_bytes(),
        size_of::<IvSidrRequestOut>(),
    );
    let start = net.now();
    drive(&net, "SIDR", || status_of(&slot).is_some());
    assert_eq!(
        status_of(&slot),
        Some(STATUS_IO_TIMEOUT),
        "{:?}",
        status_of(&slot).map(status_name)
    );
    assert_eq!(
        da.soft().stats().mads_sent - sent,
        3,
        "the SIDR_REQ and two retries"
    );
    assert!(net.now() > start, "virtual time passed");
    // The CEP is idle again: a second request on it is accepted (and
    // times out the same way).
    let again = submit(
        &sa,
        IOCTL_IV_SIDR_REQUEST,
        req.as_bytes(),
        size_of::<IvSidrRequestOut>(),
    );
    drive(&net, "SIDR again", || status_of(&again).is_some());
    assert_eq!(status_of(&again), Some(STATUS_IO_TIMEOUT));
    destroy(&sa, cep);
    drop((ca, sa));
    finish(net, [&da, &db]);
}

/// What A's soft HCA receives (the REJs B's CM answers with).
#[derive(Default)]
struct Received(Mutex<Vec<Vec<u8>>>);

impl irpverbs_soft::Tap for Received {
    fn tap(&self, direction: irpverbs_soft::Direction, d: &irpverbs_soft::Datagram<'_>) {
        if direction == irpverbs_soft::Direction::Received {
            self.0.lock().unwrap().push(d.payload.to_vec());
        }
    }
}

/// REQs whose values the passive side's CM refuses, sent raw from A's GSI
/// to B's listener: a path MTU outside 1..=5 (REJ reason 26, invalid MTU,
/// with the largest supported MTU as its ARI) and the reliable datagram
/// transport (reason 9, invalid transport type). Each gets its REJ back,
/// addressed to the REQ's communication ID; B's listener never sees them;
/// a good connect afterwards is B's first request.
fn reqs_with_values_the_cm_refuses_are_rejected_with_their_reasons(backend: Backend) {
    use irpverbs_cm::msg::{CmMsg, Mad, Path, Req, TransportType, parse_header, parse_msg};
    let (da, db, net) = healthy(backend);
    let (cb, sb) = open(&db);
    let listener = new_cep(&sb, 1);
    let sid = 0xBAD_0000;
    let st = sync_status(
        &sb,
        IOCTL_IV_LISTEN,
        IvListenIn {
            cep: listener,
            service_id: sid,
        }
        .as_bytes(),
    );
    assert_eq!(st, STATUS_SUCCESS);
    let pending = get_event(&sb, listener);
    let tap = Arc::new(Received::default());
    da.soft()
        .set_tap(Some(Arc::clone(&tap) as Arc<dyn irpverbs_soft::Tap>));
    let req = |id: u32, transport, path_mtu| Req {
        local_comm_id: id,
        vendor_id: 0,
        service_id: sid,
        local_ca_guid: 0x0200_00FF_FE00_0201,
        local_qkey: 0,
        local_qpn: 0x99 + id,
        responder_resources: 1,
        local_eecn: 0,
        initiator_depth: 1,
        remote_eecn: 0,
        remote_cm_response_timeout: 12,
        transport,
        end_to_end_flow_control: true,
        starting_psn: 1,
        local_cm_response_timeout: 12,
        retry_count: 7,
        pkey: 0xFFFF,
        path_mtu,
        rdc_exists: false,
        rnr_retry_count: 7,
        max_cm_retries: 2,
        srq: false,
        extended_transport_type: 0,
        primary: Path {
            local_gid: da.soft().gid(),
            remote_gid: db.soft().gid(),
            hop_limit: 64,
            local_ack_timeout: 12,
            ..Path::default()
        },
        alternate: None,
        sap_supported: false,
        private_data: [0; irpverbs_cm::msg::REQ_PDATA],
    };
    let cases = [
        (0x0101, TransportType::Rc, 0, 26, vec![5u8]),
        (0x0102, TransportType::Rc, 6, 26, vec![5]),
        (0x0103, TransportType::Rd, 3, 9, vec![]),
    ];
    for (id, transport, mtu, reason, ari) in cases {
        let mut mad = [0u8; 256];
        Mad::new(u64::from(id), CmMsg::Req(req(id, transport, mtu))).emit(&mut mad);
        let out = irpverbs_core::hca::MadOut {
            port: 1,
            sgid_index: 0,
            dgid: db.soft().gid(),
            dest_qpn: 1,
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 64,
            mad,
        };
        tap.0.lock().unwrap().clear();
        irpverbs_core::Hca::send_mad(&**da.soft(), &out).expect("the raw REQ is sent");
        net.run(net.now() + 100 * MS);
        let got = tap.0.lock().unwrap().clone();
        let rejs: Vec<_> = got
            .iter()
            .filter(|p| p.len() >= 20 + 256)
            .filter_map(|p| {
                let (hdr, data) = parse_header(&p[20..20 + 256]).ok()?;
                match parse_msg(&hdr, data).ok()? {
                    CmMsg::Rej(r) => Some(r),
                    _ => None,
                }
            })
            .collect();
        assert_eq!(rejs.len(), 1, "REQ {id:#x}: {rejs:?}");
        assert_eq!(rejs[0].remote_comm_id, id);
        assert_eq!(rejs[0].reason.0, reason, "REQ {id:#x}");
        assert_eq!(rejs[0].ari.as_bytes(), &ari[..], "REQ {id:#x}");
        assert!(
            status_of(&pending).is_none(),
            "the listener saw REQ {id:#x}"
        );
    }
    da.soft().set_tap(None);
    // A good connect is the listener's first request.
    let (ca, sa) = open(&da);
    let (a, b) = (End::new_rc(&ca), End::new_rc(&cb));
    let c = new_cep(&sa, 2);
    let conn = submit(
        &sa,
        IOCTL_IV_CM_CONNECT,
        connect_in(&da, &db, c, a.qp.handle(), sid).as_bytes(),
        0,
    );
    let mut passive = Passive {
        sub: &sb,
        listener,
        qp: b.qp.handle(),
        pending: Arc::clone(&pending),
        accepted: None,
        rejected: 0,
        all: vec![pending],
    };
    drive(&net, "good connect", || {
        passive.pump();
        status_of(&conn).is_some() && passive.accept_status().is_some()
    });
    assert_eq!(status_of(&conn), Some(STATUS_SUCCESS));
    assert_eq!(passive.accept_status(), Some(STATUS_SUCCESS));
    assert_eq!(passive.rejected, 0);
    let (bc, _) = passive.accepted.clone().unwrap();
    for (s, x) in [(&sa, c), (&sb, bc), (&sb, listener)] {
        destroy(s, x);
    }
    passive.pump();
    for s in passive.all.iter().chain([&conn]) {
        assert!(status_of(s).is_some(), "a request never completed");
    }
    drop((a, b));
    drop((ca, sa, cb, sb));
    finish(net, [&da, &db]);
}
