//! The connection manager's scenarios in host mode, verifier on: two host
//! devices over the in-process loopback wire, their CM timers on virtual
//! clocks (a test moves time; nothing here is timed). Bad input; MRA
//! extending the requester's wait; SIDR finding a UD QP that then carries
//! a datagram; a kernel ULP accepting from its CEP callback at
//! DISPATCH_LEVEL; REJ reasons reaching the consumer; peer-to-peer
//! connects; disconnects from both sides at once; a CEP destroyed while it
//! connects; a listener destroyed with requests arriving.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use irpverbs_abi::*;
use irpverbs_core::platform::DISPATCH_LEVEL;
use irpverbs_host::loopwire::LoopWire;
use irpverbs_host::platform::{HostConfig, TimerClock, current_irql};
use irpverbs_host::{Backend, Engine, HostDevice, HostDeviceConfig, HostFile};
use irpverbs_soft::SoftConfig;
use irpverbs_verbs::{Client, IntoClient, SendWr, qp_request};
use zerocopy::{FromBytes, IntoBytes};

mod common;
use common::{End, SharedFile as Shared, connect_defaults};

crate::on_each_backend!(
    bad_cm_input_is_refused_and_changes_nothing,
    mra_extends_the_requesters_wait_past_its_req_timeout,
    sidr_finds_a_ud_qp_that_then_receives_a_datagram,
    a_kernel_ulp_accepts_from_its_cep_callback_at_dispatch_level,
    unregistering_a_cep_callback_waits_for_a_running_call_and_ends_the_calls,
    rej_reasons_reach_the_consumer,
    simultaneous_peer_to_peer_connects_make_one_connection,
    disconnects_from_both_sides_at_once_both_complete,
    destroying_a_cep_during_connect_cancels_it_and_rejects,
    a_listener_destroyed_with_requests_arriving_rejects_them,
    connect_accept_and_listen_check_gid_and_qp_state,
);

fn device(backend: Backend, last: u8) -> Arc<HostDevice> {
    HostDevice::new(HostDeviceConfig {
        backend,
        engine: Engine::Inline,
        platform: HostConfig {
            clock: TimerClock::Virtual,
            ..HostConfig::default()
        },
        soft: SoftConfig {
            ip: IpAddr::V4(Ipv4Addr::new(10, 0, 1, last)),
            node_guid: 0x0200_00FF_FE00_0100 | u64::from(last),
            ..SoftConfig::default()
        },
        ..HostDeviceConfig::default()
    })
    .expect("host device")
}

/// Two devices on one loopback wire, virtual CM clocks.
struct Net {
    a: Arc<HostDevice>,
    b: Arc<HostDevice>,
    wire: LoopWire,
}

impl Net {
    fn new(backend: Backend) -> Self {
        let (a, b) = (device(backend, 1), device(backend, 2));
        let wire = LoopWire::start();
        wire.attach(a.soft()).unwrap();
        wire.attach(b.soft()).unwrap();
        Self { a, b, wire }
    }

    fn client(d: &Arc<HostDevice>) -> Client {
        d.open(FILE_READ_ACCESS | FILE_WRITE_ACCESS)
            .expect("open")
            .into_client()
    }

    /// Moves both CM clocks by `ms` milliseconds.
    fn advance(&self, ms: u64) {
        for d in [&self.a, &self.b] {
            d.platform().advance(Duration::from_millis(ms));
        }
    }

    /// Waits (a bounded number of yields) until the wire delivered every
    /// datagram the HCAs sent and that stays so for a while: what is in
    /// flight arrives before the virtual clock moves on.
    fn settle(&self) {
        let quiet = || {
            let tx =
                self.a.soft().link_stats().tx_datagrams + self.b.soft().link_stats().tx_datagrams;
            let w = self.wire.stats();
            w.delivered + w.unroutable >= tx
        };
        let mut calm = 0;
        for _ in 0..1_000_000 {
            if quiet() {
                calm += 1;
                if calm == 64 {
                    return;
                }
            } else {
                calm = 0;
            }
            std::thread::yield_now();
        }
    }

    /// Moves time in 1 ms steps, letting the wire settle before each,
    /// until `done`, at most `steps` times.
    fn run_until(&self, steps: u32, done: impl Fn() -> bool) {
        for _ in 0..steps {
            self.settle();
            if done() {
                return;
            }
            self.advance(1);
        }
    }

    /// [`Net::run_until`] for exchanges that need no timer: real time
    /// first (up to 30 s), the virtual clock standing still, so that a
    /// thread that submits late on a loaded machine, or a device whose DPC
    /// runs late, does not find a clock moved meanwhile that expired the
    /// other side's message before it was answered; then the clock moves,
    /// so that a message left unanswered times out (and fails the test).
    fn run_untimed_until(&self, steps: u32, done: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !done() && Instant::now() < deadline {
            self.settle();
            std::thread::sleep(Duration::from_millis(1));
        }
        self.run_until(steps, done);
    }

    /// Quiesces, checks for leaks and unloads both devices.
    fn finish(self) {
        for d in [&self.a, &self.b] {
            d.quiesce(Duration::from_secs(10)).expect("quiescent");
            assert_eq!(d.platform().pool_stats().live, 0, "pool leaked");
            d.unload();
        }
        drop(self.wire);
    }
}

fn cep(c: &Client, ctx: u64) -> IvHandle {
    let (st, out) = c.raw(
        IOCTL_IV_CREATE_CEP,
        IvCreateCepIn { user_context: ctx }.as_bytes(),
        size_of::<IvCreateCepOut>(),
    );
    assert_eq!(st, STATUS_SUCCESS, "{}", status_name(st));
    IvCreateCepOut::read_from_bytes(&out).unwrap().cep
}

fn status(c: &Client, code: u32, i: &(impl IntoBytes + zerocopy::Immutable)) -> NtStatus {
    c.raw(code, i.as_bytes(), 0).0
}

fn listen(c: &Client, cep: IvHandle, service_id: u64) {
    let st = status(c, IOCTL_IV_LISTEN, &IvListenIn { cep, service_id });
    assert_eq!(st, STATUS_SUCCESS, "{}", status_name(st));
}

/// The CEP's next event (waits for it).
fn event(c: &Client, cep: IvHandle) -> IvCepEventOut {
    let (st, out) = c.raw(
        IOCTL_IV_GET_CEP_EVENT,
        IvHandleIn { handle: cep }.as_bytes(),
        size_of::<IvCepEventOut>(),
    );
    assert_eq!(st, STATUS_SUCCESS, "{}", status_name(st));
    IvCepEventOut::read_from_bytes(&out).unwrap()
}

fn destroy(c: &Client, cep: IvHandle) {
    let st = status(c, IOCTL_IV_DESTROY_CEP, &IvHandleIn { handle: cep });
    assert_eq!(st, STATUS_SUCCESS, "{}", status_name(st));
}

fn connect_in(net: &Net, cep: IvHandle, qp: IvHandle, service_id: u64) -> IvCmConnectIn {
    IvCmConnectIn {
        cep,
        qp,
        service_id,
        local_gid: net.a.soft().gid(),
        remote_gid: net.b.soft().gid(),
        starting_psn: 0x10,
        // 4.096 us * 2^12 ~ 17 ms each way: a wait of about 34 ms.
        cm_response_timeout: 12,
        max_cm_retries: 3,
        local_ack_timeout: 12,
        path_mtu: IV_MTU_1024 as u8,
        ..connect_defaults()
    }
}

fn accept_in(cep: IvHandle, qp: IvHandle) -> IvCmAcceptIn {
    IvCmAcceptIn {
        cep,
        qp,
        starting_psn: 0x20,
        responder_resources: 4,
        initiator_depth: 4,
        rnr_retry_count: 7,
        min_rnr_timer: 12,
        flags: IV_CM_FLOW_CONTROL as u8,
        ..IvCmAcceptIn::default()
    }
}

fn qp_state(e: &End<'_>) -> u32 {
    e.qp.query().unwrap().attr.qp_state
}

/// Bad input to every CM request gets its status and changes nothing: the
/// QP stays in RESET, the CEP idle (a good request afterwards works).
fn bad_cm_input_is_refused_and_changes_nothing(backend: Backend) {
    let net = Net::new(backend);
    let (ca, cb) = (Net::client(&net.a), Net::client(&net.b));
    let (a, b) = (End::new_rc(&ca), End::new_rc(&cb));
    let l = cep(&cb, 1);
    listen(&cb, l, 7);
    let c = cep(&ca, 2);
    let good = connect_in(&net, c, a.qp.handle(), 7);
    let bad = [
        IvCmConnectIn {
            private_data_len: IV_CM_REQ_PDATA as u8 + 1,
            ..good
        },
        IvCmConnectIn { qpn: 1, ..good },
        IvCmConnectIn {
            retry_count: 8,
            ..good
        },
        IvCmConnectIn {
            rnr_retry_count: 8,
            ..good
        },
        IvCmConnectIn {
            min_rnr_timer: 32,
            ..good
        },
        IvCmConnectIn { flags: 8, ..good },
    ];
    for (i, input) in bad.iter().enumerate() {
        assert_eq!(
            status(&ca, IOCTL_IV_CM_CONNECT, input),
            STATUS_INVALID_PARAMETER,
            "connect {i}"
        );
        assert_eq!(qp_state(&a), IV_QPS_RESET);
    }
    // A source GID index the port does not have: no such address. The
    // QP stays in RESET and the CEP idle (it connects below).
    assert_eq!(
        status(
            &ca,
            IOCTL_IV_CM_CONNECT,
            &IvCmConnectIn {
                sgid_index: 7,
                ..good
            }
        ),
        STATUS_INVALID_ADDRESS
    );
    assert_eq!(qp_state(&a), IV_QPS_RESET);
    // Other requests on the idle CEP: bad input first, then state.
    let mut rej = IvCmRejectIn {
        cep: c,
        reason: 28,
        ari_len: IV_CM_ARI_LEN as u8 + 1,
        ..IvCmRejectIn::default()
    };
    assert_eq!(
        status(&ca, IOCTL_IV_CM_REJECT, &rej),
        STATUS_INVALID_PARAMETER
    );
    rej.ari_len = 0;
    rej.private_data_len = IV_CM_REJ_PDATA as u8 + 1;
    assert_eq!(
        status(&ca, IOCTL_IV_CM_REJECT, &rej),
        STATUS_INVALID_PARAMETER
    );
    rej.private_data_len = 0;
    rej.reserved2[3] = 1;
    assert_eq!(
        status(&ca, IOCTL_IV_CM_REJECT, &rej),
        STATUS_INVALID_PARAMETER
    );
    let disc = IvCmDisconnectIn {
        cep: c,
        private_data_len: IV_CM_DREP_PDATA + 1,
        ..IvCmDisconnectIn::default()
    };
    assert_eq!(
        status(&ca, IOCTL_IV_CM_DISCONNECT, &disc),
        STATUS_INVALID_PARAMETER
    );
    let mra = IvCmMraIn {
        cep: c,
        service_timeout: 32,
        ..IvCmMraIn::default()
    };
    assert_eq!(status(&ca, IOCTL_IV_CM_MRA, &mra), STATUS_INVALID_PARAMETER);
    let mra = IvCmMraIn {
        service_timeout: 10,
        ..mra
    };
    assert_eq!(
        status(&ca, IOCTL_IV_CM_MRA, &mra),
        STATUS_INVALID_DEVICE_STATE,
        "no connect request to answer"
    );
    let sidr = IvSidrRequestIn {
        cep: c,
        private_data_len: IV_CM_SIDR_REQ_PDATA as u8 + 1,
        ..IvSidrRequestIn::default()
    };
    let (st, _) = ca.raw(
        IOCTL_IV_SIDR_REQUEST,
        sidr.as_bytes(),
        size_of::<IvSidrRequestOut>(),
    );
    assert_eq!(st, STATUS_INVALID_PARAMETER);
    // Its output buffer too small.
    let (st, _) = ca.raw(IOCTL_IV_SIDR_REQUEST, sidr.as_bytes(), 8);
    assert_eq!(st, STATUS_BUFFER_TOO_SMALL);
    let rep = IvSidrReplyIn {
        cep: c,
        qpn: 1 << 24,
        ..IvSidrReplyIn::default()
    };
    assert_eq!(
        status(&ca, IOCTL_IV_SIDR_REPLY, &rep),
        STATUS_INVALID_PARAMETER
    );
    // The CEP is still idle: the good connect works.
    let st = std::thread::scope(|s| {
        let t = s.spawn(|| status(&ca, IOCTL_IV_CM_CONNECT, &good));
        let req = event(&cb, l);
        assert_eq!(req.event_type, IV_CEP_EVENT_CONNECT_REQUEST);
        let acc = accept_in(req.cep, b.qp.handle());
        assert_eq!(status(&cb, IOCTL_IV_CM_ACCEPT, &acc), STATUS_SUCCESS);
        t.join().unwrap()
    });
    assert_eq!(st, STATUS_SUCCESS, "{}", status_name(st));
    assert_eq!(qp_state(&a), IV_QPS_RTS);
    drop((a, b));
    drop((ca, cb));
    net.finish();
}

/// The listener sends an MRA with a long service timeout, then accepts
/// long after the REQ's own retries would have run out: the connection is
/// established (the MRA extended the requester's wait).
fn mra_extends_the_requesters_wait_past_its_req_timeout(backend: Backend) {
    let net = Net::new(backend);
    let (ca, cb) = (Net::client(&net.a), Net::client(&net.b));
    let (a, b) = (End::new_rc(&ca), End::new_rc(&cb));
    let l = cep(&cb, 1);
    listen(&cb, l, 0x3A);
    let c = cep(&ca, 2);
    // Without the MRA: about 34 ms per try, 4 tries.
    let input = connect_in(&net, c, a.qp.handle(), 0x3A);
    let st = std::thread::scope(|s| {
        let t = s.spawn(|| status(&ca, IOCTL_IV_CM_CONNECT, &input));
        let req = event(&cb, l);
        assert_eq!(req.event_type, IV_CEP_EVENT_CONNECT_REQUEST);
        let mut mra = IvCmMraIn {
            cep: req.cep,
            // 4.096 us * 2^18 ~ 1.07 s.
            service_timeout: 18,
            private_data_len: 4,
            ..IvCmMraIn::default()
        };
        mra.private_data[..4].copy_from_slice(b"wait");
        assert_eq!(status(&cb, IOCTL_IV_CM_MRA, &mra), STATUS_SUCCESS);
        // A second MRA: the CEP already sent one.
        assert_eq!(
            status(&cb, IOCTL_IV_CM_MRA, &mra),
            STATUS_INVALID_DEVICE_STATE
        );
        let ev = event(&ca, c);
        assert_eq!(ev.event_type, IV_CEP_EVENT_MRA);
        assert_eq!(ev.service_timeout, 18);
        // 400 ms of virtual time: three times all the REQ's tries.
        for _ in 0..400 {
            net.settle();
            net.advance(1);
        }
        let acc = accept_in(req.cep, b.qp.handle());
        assert_eq!(status(&cb, IOCTL_IV_CM_ACCEPT, &acc), STATUS_SUCCESS);
        t.join().unwrap()
    });
    assert_eq!(st, STATUS_SUCCESS, "{}", status_name(st));
    assert_eq!((qp_state(&a), qp_state(&b)), (IV_QPS_RTS, IV_QPS_RTS));
    drop((a, b));
    drop((ca, cb));
    net.finish();
}

/// A UD QP on B and its listener; A resolves the service with SIDR
/// (private data both ways) and sends a datagram to the QPN and Q_Key it
/// learnt; B receives it.
fn sidr_finds_a_ud_qp_that_then_receives_a_datagram(backend: Backend) {
    let net = Net::new(backend);
    let (ca, cb) = (Net::client(&net.a), Net::client(&net.b));
    let (a, b) = (End::new_ud(&ca), End::new_ud(&cb));
    for (e, d) in [(&a, &net.a), (&b, &net.b)] {
        for (mask, attr) in irpverbs_verbs::rts_steps(IV_QPT_UD, 0, d.soft().gid()) {
            e.qp.modify(mask, &attr).unwrap();
        }
    }
    let qkey = b.qp.query().unwrap().attr.qkey;
    let l = cep(&cb, 1);
    listen(&cb, l, 0x51D4);
    let c = cep(&ca, 2);
    let mut req = IvSidrRequestIn {
        cep: c,
        service_id: 0x51D4,
        remote_gid: net.b.soft().gid(),
        timeout: 8,
        max_retries: 3,
        private_data_len: 3,
        ..IvSidrRequestIn::default()
    };
    req.private_data[..3].copy_from_slice(b"who");
    let out = std::thread::scope(|s| {
        let t = s.spawn(|| {
            ca.raw(
                IOCTL_IV_SIDR_REQUEST,
                req.as_bytes(),
                size_of::<IvSidrRequestOut>(),
            )
        });
        let ev = event(&cb, l);
        assert_eq!(ev.event_type, IV_CEP_EVENT_SIDR_REQUEST);
        assert_eq!(ev.service_id, 0x51D4);
        assert_eq!(ev.remote_gid, net.a.soft().gid());
        assert_eq!(
            usize::from(ev.private_data_len),
            IV_CM_SIDR_REQ_PDATA as usize
        );
        assert_eq!(&ev.private_data[..3], b"who");
        let mut rep = IvSidrReplyIn {
            cep: ev.cep,
            status: 0,
            qpn: b.qp.qpn(),
            qkey,
            private_data_len: 2,
            ..IvSidrReplyIn::default()
        };
        rep.private_data[..2].copy_from_slice(b"me");
        assert_eq!(status(&cb, IOCTL_IV_SIDR_REPLY, &rep), STATUS_SUCCESS);
        // Answered: the CEP is idle, a second answer is refused.
        assert_eq!(
            status(&cb, IOCTL_IV_SIDR_REPLY, &rep),
            STATUS_INVALID_DEVICE_STATE
        );
        destroy(&cb, ev.cep);
        t.join().unwrap()
    });
    assert_eq!(out.0, STATUS_SUCCESS, "{}", status_name(out.0));
    let rep = IvSidrRequestOut::read_from_bytes(&out.1).unwrap();
    assert_eq!((rep.status, rep.qpn, rep.qkey), (0, b.qp.qpn(), qkey));
    assert_eq!(&rep.private_data[..3], b"me\0");
    // The datagram.
    let ah = ca
        .create_ah(a.pd, &irpverbs_verbs::av(net.b.soft().gid()))
        .unwrap()
        .ahn;
    b.qp.post_recv(1, &[b.sge(0, 40 + 64)]).unwrap();
    a.mem.fill(0, b"found by SIDR");
    a.qp.post_send(&SendWr {
        wr_id: 2,
        opcode: IV_WR_SEND,
        flags: IV_SEND_SIGNALED,
        sges: &[a.sge(0, 13)],
        ud: Some((ah, rep.qpn, rep.qkey)),
        ..SendWr::default()
    })
    .unwrap();
    assert_eq!(a.wc().status, IV_WC_SUCCESS);
    let r = b.wc();
    assert_eq!((r.status, r.byte_len), (IV_WC_SUCCESS, 40 + 13));
    assert_eq!(b.mem.read(40, 13), b"found by SIDR");
    // A SIDR_REQ for a service nobody listens to: the SIDR_REP says so.
    let req2 = IvSidrRequestIn {
        service_id: 0xDEAD,
        private_data_len: 0,
        ..req
    };
    let (st, out) = ca.raw(
        IOCTL_IV_SIDR_REQUEST,
        req2.as_bytes(),
        size_of::<IvSidrRequestOut>(),
    );
    assert_eq!(st, STATUS_SUCCESS, "{}", status_name(st));
    let rep = IvSidrRequestOut::read_from_bytes(&out).unwrap();
    assert_ne!(rep.status, 0, "not a valid answer");
    drop((a, b));
    drop((ca, cb));
    net.finish();
}

/// A kernel ULP listens with a CEP callback: the device calls it at
/// DISPATCH_LEVEL (the verifier's IRQL) with no lock held, and the ULP
/// polls the events and accepts from the callback (an internal device
/// control request, completing later). The connection is established.
fn a_kernel_ulp_accepts_from_its_cep_callback_at_dispatch_level(backend: Backend) {
    let net = Net::new(backend);
    let ca = Net::client(&net.a);
    let kfile = Arc::new(net.b.open_kernel().expect("open kernel"));
    let kc = Client::new(Box::new(Shared(Arc::clone(&kfile))));
    let pd = kc.alloc_pd().unwrap().pd;
    let cq = kc.create_cq(16).unwrap().cq;
    let kqp = kc
        .create_qp_with(&qp_request(pd, cq, 0, IV_QPT_RC))
        .unwrap();
    let a = End::new_rc(&ca);
    let l = cep(&kc, 9);
    listen(&kc, l, 0x4B);
    let calls = Arc::new(AtomicU32::new(0));
    let accepted: Arc<Mutex<Vec<NtStatus>>> = Arc::default();
    let seen: Arc<Mutex<Vec<(u32, IvHandle)>>> = Arc::default();
    let dev = Arc::clone(net.b.device());
    let cb: irpverbs_core::cm::CepCallback = {
        let (calls, accepted, seen, kfile, dev) = (
            Arc::clone(&calls),
            Arc::clone(&accepted),
            Arc::clone(&seen),
            Arc::clone(&kfile),
            Arc::clone(&dev),
        );
        irpverbs_core::cm::CepCallback::Closure(Arc::new(
            move |ready: irpverbs_core::cm::CepReady| {
                assert_eq!(current_irql(), DISPATCH_LEVEL, "callback IRQL");
                calls.fetch_add(1, Ordering::SeqCst);
                while let Some(ev) = dev.poll_cep_event(ready.file, ready.cep).unwrap() {
                    seen.lock().unwrap().push((ev.event_type, ev.cep));
                    if ev.event_type == IV_CEP_EVENT_CONNECT_REQUEST {
                        let acc = accept_in(ev.cep, kqp.qp);
                        let accepted = Arc::clone(&accepted);
                        kfile.submit(
                            irpverbs_host::Ioctl::kernel(IOCTL_IV_CM_ACCEPT, acc.as_bytes(), 0),
                            move |st, _, _| accepted.lock().unwrap().push(st),
                        );
                    }
                }
            },
        ))
    };
    net.b
        .device()
        .set_cep_callback(kfile.key(), l, Some(cb))
        .unwrap();
    // A CEP with a callback takes no GET_CEP_EVENT.
    let (st, _) = kc.raw(
        IOCTL_IV_GET_CEP_EVENT,
        IvHandleIn { handle: l }.as_bytes(),
        size_of::<IvCepEventOut>(),
    );
    assert_eq!(st, STATUS_INVALID_DEVICE_STATE);
    let c = cep(&ca, 2);
    let st = status(
        &ca,
        IOCTL_IV_CM_CONNECT,
        &connect_in(&net, c, a.qp.handle(), 0x4B),
    );
    assert_eq!(st, STATUS_SUCCESS, "{}", status_name(st));
    // The accept completes on the RTU (already sent when the connect
    // completed); wait for its completion callback.
    let deadline = Instant::now() + Duration::from_secs(60);
    while accepted.lock().unwrap().is_empty() && Instant::now() < deadline {
        std::thread::yield_now();
    }
    assert_eq!(*accepted.lock().unwrap(), vec![STATUS_SUCCESS]);
    assert!(calls.load(Ordering::SeqCst) >= 1);
    let (first, conn) = seen.lock().unwrap()[0];
    assert_eq!(first, IV_CEP_EVENT_CONNECT_REQUEST);
    assert_eq!(kc.query_qp(kqp.qp).unwrap().attr.qp_state, IV_QPS_RTS);
    assert_eq!(qp_state(&a), IV_QPS_RTS);
    // The CEPs hold their callbacks (and the callback the file): destroy
    // them.
    destroy(&kc, conn);
    destroy(&kc, l);
    destroy(&ca, c);
    drop(a);
    drop(ca);
    drop(kc);
    drop(kfile);
    net.finish();
}

/// What [`blocking_callback`] shares with the test.
#[derive(Default)]
struct Gate {
    calls: AtomicU32,
    entered: std::sync::atomic::AtomicBool,
    release: std::sync::atomic::AtomicBool,
    returned: std::sync::atomic::AtomicBool,
    irql: AtomicU32,
}

/// A C kernel ULP's CEP callback (through the table) that stays inside
/// until the test releases it.
unsafe extern "C" fn blocking_callback(context: *mut std::ffi::c_void, _cep: IvHandle, _uc: u64) {
    // SAFETY: the context is the test's `Gate`, alive until the test
    // unregistered the callback (which is what it tests).
    let gate = unsafe { &*context.cast::<Gate>() };
    gate.irql.store(u32::from(current_irql()), Ordering::SeqCst);
    gate.calls.fetch_add(1, Ordering::SeqCst);
    gate.entered.store(true, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !gate.release.load(Ordering::SeqCst) && Instant::now() < deadline {
        std::hint::spin_loop();
    }
    gate.returned.store(true, Ordering::SeqCst);
}

/// The table's CEP callbacks (version 2) with the rundown: a C callback
/// runs at DISPATCH_LEVEL on the thread that received the REQ; while it
/// runs, `unregister_cep_callback` from another thread does not return;
/// once the callback returned it does, and the CEP's later events never
/// call it again (they go to `GET_CEP_EVENT`).
fn unregistering_a_cep_callback_waits_for_a_running_call_and_ends_the_calls(backend: Backend) {
    let net = Net::new(backend);
    let ca = Net::client(&net.a);
    let kfile = net.b.open_kernel().expect("open kernel");
    let fo = kfile.file_object();
    let (st, out) = kfile.ioctl(
        IOCTL_IV_CREATE_CEP,
        IvCreateCepIn { user_context: 5 }.as_bytes(),
        size_of::<IvCreateCepOut>(),
    );
    assert_eq!(st, STATUS_SUCCESS);
    let l = IvCreateCepOut::read_from_bytes(&out).unwrap().cep;
    let st = kfile
        .ioctl(
            IOCTL_IV_LISTEN,
            IvListenIn {
                cep: l,
                service_id: 0x7D,
            }
            .as_bytes(),
            0,
        )
        .0;
    assert_eq!(st, STATUS_SUCCESS);
    let t = net.b.query_interface().expect("query interface");
    let gate = Arc::new(Gate::default());
    let ctx = Arc::as_ptr(&gate).cast_mut().cast();
    // SAFETY: the table's functions with its context; the gate outlives
    // the registration.
    let reg = unsafe { (t.register_cep_callback)(t.context, fo, l, Some(blocking_callback), ctx) };
    assert_eq!(reg, STATUS_SUCCESS);
    // Another file's CEP, or no file: refused.
    // SAFETY: as above.
    let other = unsafe {
        (t.register_cep_callback)(
            t.context,
            std::ptr::null_mut(),
            l,
            Some(blocking_callback),
            ctx,
        )
    };
    assert_eq!(other, STATUS_INVALID_HANDLE);

    let a = End::new_rc(&ca);
    let c = cep(&ca, 2);
    let input = connect_in(&net, c, a.qp.handle(), 0x7D);
    let (early, returned) = std::thread::scope(|s| {
        let connect = s.spawn(|| status(&ca, IOCTL_IV_CM_CONNECT, &input));
        // The REQ arrives; the callback runs (somewhere else) and stays.
        // This thread waits without taking a lock of the devices: a
        // thread that lowers its IRQL may run a DPC its processor has
        // queued (as on Windows), and the callback it ran here would then
        // wait for the release this thread is to give.
        let deadline = Instant::now() + Duration::from_secs(60);
        while !gate.entered.load(Ordering::SeqCst) {
            assert!(Instant::now() < deadline, "the callback never ran");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(gate.irql.load(Ordering::SeqCst), u32::from(DISPATCH_LEVEL));
        let (tr, kf, g) = (&t, &kfile, &gate);
        let unregister = s.spawn(move || {
            // SAFETY: as above.
            let st = unsafe { (tr.unregister_cep_callback)(tr.context, kf.file_object(), l) };
            (st, g.returned.load(Ordering::SeqCst))
        });
        std::thread::sleep(Duration::from_millis(100));
        let early = unregister.is_finished();
        gate.release.store(true, Ordering::SeqCst);
        let (st, returned) = unregister.join().unwrap();
        assert_eq!(st, STATUS_SUCCESS);
        // The request is the owner's again, through GET_CEP_EVENT.
        reject_next(&net, &kfile, l, connect);
        (early, returned)
    });
    assert!(!early, "unregister returned while the callback ran");
    assert!(returned, "unregister returned before the callback did");
    // A second connect: the listener's events never call the callback.
    let c2 = cep(&ca, 3);
    let a2 = End::new_rc(&ca);
    let input = connect_in(&net, c2, a2.qp.handle(), 0x7D);
    std::thread::scope(|s| {
        let connect = s.spawn(|| status(&ca, IOCTL_IV_CM_CONNECT, &input));
        reject_next(&net, &kfile, l, connect);
    });
    assert_eq!(
        gate.calls.load(Ordering::SeqCst),
        1,
        "called after unregister"
    );
    // SAFETY: the table's context, referenced once by query_interface.
    unsafe { (t.interface_dereference)(t.context) };
    destroy_in(&kfile, l);
    destroy(&ca, c);
    destroy(&ca, c2);
    drop((a, a2));
    drop(ca);
    drop(kfile);
    net.finish();
}

/// Takes the listener `l`'s next connect request with `GET_CEP_EVENT`,
/// rejects it and waits for the `connect` it answers to be refused.
fn reject_next(
    net: &Net,
    kfile: &HostFile,
    l: IvHandle,
    connect: std::thread::ScopedJoinHandle<'_, NtStatus>,
) {
    let (st, out) = kfile.ioctl(
        IOCTL_IV_GET_CEP_EVENT,
        IvHandleIn { handle: l }.as_bytes(),
        size_of::<IvCepEventOut>(),
    );
    assert_eq!(st, STATUS_SUCCESS, "{}", status_name(st));
    let req = IvCepEventOut::read_from_bytes(&out).unwrap();
    assert_eq!(req.event_type, IV_CEP_EVENT_CONNECT_REQUEST);
    let rej = IvCmRejectIn {
        cep: req.cep,
        reason: 28,
        ..IvCmRejectIn::default()
    };
    assert_eq!(
        kfile.ioctl(IOCTL_IV_CM_REJECT, rej.as_bytes(), 0).0,
        STATUS_SUCCESS
    );
    net.run_untimed_until(10_000, || connect.is_finished());
    assert_eq!(connect.join().unwrap(), STATUS_CONNECTION_REFUSED);
    destroy_in(kfile, req.cep);
}

fn destroy_in(f: &HostFile, cep: IvHandle) {
    let st = f
        .ioctl(
            IOCTL_IV_DESTROY_CEP,
            IvHandleIn { handle: cep }.as_bytes(),
            0,
        )
        .0;
    assert_eq!(st, STATUS_SUCCESS, "{}", status_name(st));
}

/// A listener rejects with reason 28 (consumer reject), ARI and private
/// data: the connect fails with `STATUS_CONNECTION_REFUSED` and the
/// requester's CEP reports the REJ with all three. A connect to a service
/// nobody listens to gets reason 8 (invalid service ID); one to a GID
/// nobody has times out (`STATUS_IO_TIMEOUT`) after its retries.
fn rej_reasons_reach_the_consumer(backend: Backend) {
    let net = Net::new(backend);
    let (ca, cb) = (Net::client(&net.a), Net::client(&net.b));
    let (a, b) = (End::new_rc(&ca), End::new_rc(&cb));
    let l = cep(&cb, 1);
    listen(&cb, l, 0x28);
    let c = cep(&ca, 2);
    let input = connect_in(&net, c, a.qp.handle(), 0x28);
    let st = std::thread::scope(|s| {
        let t = s.spawn(|| status(&ca, IOCTL_IV_CM_CONNECT, &input));
        let req = event(&cb, l);
        let mut rej = IvCmRejectIn {
            cep: req.cep,
            reason: 28,
            ari_len: 2,
            private_data_len: 7,
            ..IvCmRejectIn::default()
        };
        rej.ari[..2].copy_from_slice(b"no");
        rej.private_data[..7].copy_from_slice(b"go away");
        assert_eq!(status(&cb, IOCTL_IV_CM_REJECT, &rej), STATUS_SUCCESS);
        destroy(&cb, req.cep);
        t.join().unwrap()
    });
    assert_eq!(st, STATUS_CONNECTION_REFUSED, "{}", status_name(st));
    let ev = event(&ca, c);
    assert_eq!((ev.event_type, ev.reason), (IV_CEP_EVENT_REJECTED, 28));
    assert_eq!(&ev.ari[..usize::from(ev.ari_len)], b"no");
    assert_eq!(usize::from(ev.private_data_len), IV_CM_REJ_PDATA as usize);
    assert_eq!(&ev.private_data[..8], b"go away\0");
    destroy(&ca, c);

    // No listener for the service: reason 8, invalid service ID.
    let a2 = End::new_rc(&ca);
    let c2 = cep(&ca, 3);
    let bad = connect_in(&net, c2, a2.qp.handle(), 0xBAD);
    let st = std::thread::scope(|s| {
        let t = s.spawn(|| status(&ca, IOCTL_IV_CM_CONNECT, &bad));
        net.run_untimed_until(10_000, || t.is_finished());
        t.join().unwrap()
    });
    assert_eq!(st, STATUS_CONNECTION_REFUSED, "{}", status_name(st));
    let ev = event(&ca, c2);
    assert_eq!((ev.event_type, ev.reason), (IV_CEP_EVENT_REJECTED, 8));
    destroy(&ca, c2);

    // A silent peer: the retries run out.
    let a3 = End::new_rc(&ca);
    let c3 = cep(&ca, 4);
    let silent = IvCmConnectIn {
        remote_gid: [0xFE; 16],
        ..connect_in(&net, c3, a3.qp.handle(), 0x28)
    };
    let st = std::thread::scope(|s| {
        let t = s.spawn(|| status(&ca, IOCTL_IV_CM_CONNECT, &silent));
        net.run_until(10_000, || t.is_finished());
        t.join().unwrap()
    });
    assert_eq!(st, STATUS_IO_TIMEOUT, "{}", status_name(st));
    destroy(&ca, c3);
    drop((a, a2, a3, b));
    drop((ca, cb));
    net.finish();
}

/// Both sides connect to each other at once, peer-to-peer, on the same
/// service ID: when the REQs cross, one side becomes the passive side
/// (IBTA 12.9.8.3.2) and both requests complete with one connection
/// between the two QPs (its connect goes on as an accept).
fn simultaneous_peer_to_peer_connects_make_one_connection(backend: Backend) {
    let net = Net::new(backend);
    let (ca, cb) = (Net::client(&net.a), Net::client(&net.b));
    let (a, b) = (End::new_rc(&ca), End::new_rc(&cb));
    let (xa, xb) = (cep(&ca, 1), cep(&cb, 2));
    let p2p = IV_CM_PEER_TO_PEER as u8;
    let ia = IvCmConnectIn {
        flags: p2p | IV_CM_FLOW_CONTROL as u8,
        ..connect_in(&net, xa, a.qp.handle(), 0x9292)
    };
    let ib = IvCmConnectIn {
        local_gid: net.b.soft().gid(),
        remote_gid: net.a.soft().gid(),
        ..IvCmConnectIn {
            cep: xb,
            qp: b.qp.handle(),
            ..ia
        }
    };
    let (sa, sb) = std::thread::scope(|s| {
        let ta = s.spawn(|| status(&ca, IOCTL_IV_CM_CONNECT, &ia));
        let tb = s.spawn(|| status(&cb, IOCTL_IV_CM_CONNECT, &ib));
        net.run_untimed_until(5_000, || ta.is_finished() && tb.is_finished());
        (ta.join().unwrap(), tb.join().unwrap())
    });
    // The REQs crossed (each side was connecting when the other's REQ
    // came): one connection, both requests succeed. Or one REQ arrived
    // before its peer's CEP was connecting (the wire is not forced here):
    // no listener, REJ with reason 8 (invalid service ID), which ends the
    // other attempt too. Never one side connected and the other not.
    match (sa, sb) {
        (STATUS_SUCCESS, STATUS_SUCCESS) => {
            assert_eq!((qp_state(&a), qp_state(&b)), (IV_QPS_RTS, IV_QPS_RTS));
            assert_eq!(a.qp.query().unwrap().attr.dest_qp_num, b.qp.qpn());
            assert_eq!(b.qp.query().unwrap().attr.dest_qp_num, a.qp.qpn());
        }
        (STATUS_CONNECTION_REFUSED, STATUS_CONNECTION_REFUSED) => {
            let reasons = [event(&ca, xa), event(&cb, xb)].map(|e| (e.event_type, e.reason));
            assert!(reasons.contains(&(IV_CEP_EVENT_REJECTED, 8)), "{reasons:?}");
        }
        _ => panic!("{} {}", status_name(sa), status_name(sb)),
    }
    destroy(&ca, xa);
    destroy(&cb, xb);
    drop((a, b));
    drop((ca, cb));
    net.finish();
}

/// Connects `a` to `b` (listening on `sid`): the two connection CEPs.
fn connected(
    net: &Net,
    (ca, a): (&Client, &End<'_>),
    (cb, b): (&Client, &End<'_>),
    sid: u64,
) -> (IvHandle, IvHandle, IvHandle) {
    let l = cep(cb, 1);
    listen(cb, l, sid);
    let c = cep(ca, 2);
    let input = connect_in(net, c, a.qp.handle(), sid);
    std::thread::scope(|s| {
        let t = s.spawn(|| status(ca, IOCTL_IV_CM_CONNECT, &input));
        let req = event(cb, l);
        let acc = accept_in(req.cep, b.qp.handle());
        assert_eq!(status(cb, IOCTL_IV_CM_ACCEPT, &acc), STATUS_SUCCESS);
        assert_eq!(t.join().unwrap(), STATUS_SUCCESS);
        assert_eq!(event(ca, c).event_type, IV_CEP_EVENT_REPLY);
        (c, req.cep, l)
    })
}

/// Both sides disconnect at once: their DREQs cross, each answers the
/// other's, both requests complete, both QPs are in ERR with their posted
/// receives flushed.
fn disconnects_from_both_sides_at_once_both_complete(backend: Backend) {
    let net = Net::new(backend);
    let (ca, cb) = (Net::client(&net.a), Net::client(&net.b));
    let (a, b) = (End::new_rc(&ca), End::new_rc(&cb));
    let (xa, xb, l) = connected(&net, (&ca, &a), (&cb, &b), 0xD1);
    a.qp.post_recv(7, &[a.sge(0, 16)]).unwrap();
    b.qp.post_recv(8, &[b.sge(0, 16)]).unwrap();
    let d = |cep| IvCmDisconnectIn {
        cep,
        ..IvCmDisconnectIn::default()
    };
    let (sa, sb) = std::thread::scope(|s| {
        let ta = s.spawn(|| status(&ca, IOCTL_IV_CM_DISCONNECT, &d(xa)));
        let tb = s.spawn(|| status(&cb, IOCTL_IV_CM_DISCONNECT, &d(xb)));
        // Crossed DREQs need no timer; a DREQ left unanswered times out
        // and fails the test.
        net.run_untimed_until(5_000, || ta.is_finished() && tb.is_finished());
        (ta.join().unwrap(), tb.join().unwrap())
    });
    // Each completes on the other's DREP, or (crossed) on answering the
    // other's DREQ; a timeout would mean a DREQ went unanswered.
    assert_eq!(
        (sa, sb),
        (STATUS_SUCCESS, STATUS_SUCCESS),
        "{} {}",
        status_name(sa),
        status_name(sb)
    );
    assert_eq!((qp_state(&a), qp_state(&b)), (IV_QPS_ERR, IV_QPS_ERR));
    for (e, id) in [(&a, 7), (&b, 8)] {
        let wc = e.wc();
        assert_eq!((wc.wr_id, wc.status), (id, IV_WC_WR_FLUSH_ERR));
    }
    for (c, x) in [(&ca, xa), (&cb, xb), (&cb, l)] {
        destroy(c, x);
    }
    drop((a, b));
    drop((ca, cb));
    net.finish();
}

/// A CEP destroyed while its connect waits for the REP: the connect
/// completes with `STATUS_CANCELLED`, the listener's side learns of it (a
/// REJ), nothing leaks.
fn destroying_a_cep_during_connect_cancels_it_and_rejects(backend: Backend) {
    let net = Net::new(backend);
    let (ca, cb) = (Net::client(&net.a), Net::client(&net.b));
    let (a, b) = (End::new_rc(&ca), End::new_rc(&cb));
    let l = cep(&cb, 1);
    listen(&cb, l, 0xDC);
    let c = cep(&ca, 2);
    let input = connect_in(&net, c, a.qp.handle(), 0xDC);
    std::thread::scope(|s| {
        let t = s.spawn(|| status(&ca, IOCTL_IV_CM_CONNECT, &input));
        let req = event(&cb, l);
        assert_eq!(req.event_type, IV_CEP_EVENT_CONNECT_REQUEST);
        // The REQ arrived: the connect waits for the REP.
        destroy(&ca, c);
        assert_eq!(t.join().unwrap(), STATUS_CANCELLED);
        // The listener's connection hears the REJ (timeout from an active
        // side whose REP never came, IBTA 12.6.7).
        let ev = event(&cb, req.cep);
        assert_eq!(ev.event_type, IV_CEP_EVENT_REJECTED, "{ev:?}");
        let acc = accept_in(req.cep, b.qp.handle());
        assert_eq!(
            status(&cb, IOCTL_IV_CM_ACCEPT, &acc),
            STATUS_INVALID_DEVICE_STATE
        );
        destroy(&cb, req.cep);
    });
    destroy(&cb, l);
    drop((a, b));
    drop((ca, cb));
    net.finish();
}

/// A listener destroyed while REQs arrive for it: each connect fails with
/// a REJ (requests the owner never took) or is rejected as for a service
/// nobody listens to; no panic, nothing leaks.
fn a_listener_destroyed_with_requests_arriving_rejects_them(backend: Backend) {
    let net = Net::new(backend);
    let (ca, cb) = (Net::client(&net.a), Net::client(&net.b));
    let ends: Vec<End<'_>> = (0..4).map(|_| End::new_rc(&ca)).collect();
    let _b = End::new_rc(&cb);
    let l = cep(&cb, 1);
    listen(&cb, l, 0x1D);
    let ceps: Vec<IvHandle> = (0..4).map(|i| cep(&ca, 10 + i)).collect();
    let results = std::thread::scope(|s| {
        let threads: Vec<_> = ends
            .iter()
            .zip(&ceps)
            .map(|(e, &c)| {
                let input = connect_in(&net, c, e.qp.handle(), 0x1D);
                let ca = &ca;
                s.spawn(move || status(ca, IOCTL_IV_CM_CONNECT, &input))
            })
            .collect();
        // The first request reached the listener (the others are on their
        // way or queued, unpolled): destroy it.
        let req = event(&cb, l);
        assert_eq!(req.event_type, IV_CEP_EVENT_CONNECT_REQUEST);
        destroy(&cb, l);
        // The polled one is the owner's: it rejects it.
        let rej = IvCmRejectIn {
            cep: req.cep,
            reason: 28,
            ..IvCmRejectIn::default()
        };
        assert_eq!(status(&cb, IOCTL_IV_CM_REJECT, &rej), STATUS_SUCCESS);
        destroy(&cb, req.cep);
        // Each REQ is rejected on arrival (the owner's REJ, or no
        // listener): no timer is needed, so none may expire first.
        net.run_untimed_until(10_000, || threads.iter().all(|t| t.is_finished()));
        threads
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect::<Vec<_>>()
    });
    for st in results {
        assert_eq!(st, STATUS_CONNECTION_REFUSED, "{}", status_name(st));
    }
    for c in ceps {
        destroy(&ca, c);
    }
    drop(ends);
    drop(_b);
    drop((ca, cb));
    net.finish();
}

/// The preconditions of `CM_CONNECT`, `CM_ACCEPT` and `LISTEN_ADDR` that
/// name the device's state: the local GID must be the entry `sgid_index`
/// names (index 0 too: a REQ must not leave with a forged GID), the QP
/// must be in RESET, a listen address must be one of the device's. Each
/// refusal sends nothing and changes nothing; the good request after it
/// works.
fn connect_accept_and_listen_check_gid_and_qp_state(backend: Backend) {
    let net = Net::new(backend);
    let (ca, cb) = (Net::client(&net.a), Net::client(&net.b));
    let (a, b) = (End::new_rc(&ca), End::new_rc(&cb));
    let sent = |d: &Arc<HostDevice>| d.soft().link_stats().tx_datagrams;
    // LISTEN_ADDR: only the device's addresses.
    let l = cep(&cb, 1);
    let foreign = Ipv4Addr::new(10, 0, 1, 99).to_ipv6_mapped().octets();
    let listen_addr = |cep, gid| {
        status(
            &cb,
            IOCTL_IV_LISTEN_ADDR,
            &IvListenAddrIn {
                cep,
                service_id: 7,
                gid,
            },
        )
    };
    assert_eq!(listen_addr(l, foreign), STATUS_INVALID_ADDRESS);
    assert_eq!(
        listen_addr(l, net.a.soft().gid()),
        STATUS_INVALID_ADDRESS,
        "the other device's address"
    );
    assert_eq!(listen_addr(l, net.b.soft().gid()), STATUS_SUCCESS);
    assert_eq!(
        listen_addr(l, net.b.soft().gid()),
        STATUS_INVALID_DEVICE_STATE,
        "the CEP listens already"
    );
    let c = cep(&ca, 2);
    let good = connect_in(&net, c, a.qp.handle(), 7);
    let before = sent(&net.a);
    // A QP that is not RC.
    let ud = End::new_ud(&ca);
    assert_eq!(
        status(
            &ca,
            IOCTL_IV_CM_CONNECT,
            &IvCmConnectIn {
                qp: ud.qp.handle(),
                ..good
            }
        ),
        STATUS_INVALID_PARAMETER
    );
    drop(ud);
    // A forged local GID at index 0.
    let forged = IvCmConnectIn {
        local_gid: foreign,
        sgid_index: 0,
        ..good
    };
    assert_eq!(
        status(&ca, IOCTL_IV_CM_CONNECT, &forged),
        STATUS_INVALID_ADDRESS
    );
    assert_eq!(qp_state(&a), IV_QPS_RESET);
    // A QP in INIT (the header says RESET).
    let (init_mask, init) = irpverbs_verbs::rts_steps(IV_QPT_RC, 0, [0; 16])[0];
    a.qp.modify(init_mask, &init).unwrap();
    assert_eq!(
        status(&ca, IOCTL_IV_CM_CONNECT, &good),
        STATUS_INVALID_DEVICE_STATE
    );
    assert_eq!(
        qp_state(&a),
        IV_QPS_INIT,
        "the refused connect moved the QP"
    );
    net.settle();
    assert_eq!(sent(&net.a), before, "a refused connect sent a REQ");
    let reset = IvQpAttr {
        qp_state: IV_QPS_RESET,
        ..IvQpAttr::default()
    };
    a.qp.modify(IV_QP_STATE, &reset).unwrap();
    // The good connect; the accept with a QP in INIT is refused first.
    b.qp.modify(init_mask, &init).unwrap();
    let st = std::thread::scope(|s| {
        let t = s.spawn(|| status(&ca, IOCTL_IV_CM_CONNECT, &good));
        let req = event(&cb, l);
        assert_eq!(req.event_type, IV_CEP_EVENT_CONNECT_REQUEST);
        let acc = accept_in(req.cep, b.qp.handle());
        assert_eq!(
            status(&cb, IOCTL_IV_CM_ACCEPT, &acc),
            STATUS_INVALID_DEVICE_STATE
        );
        assert_eq!(qp_state(&b), IV_QPS_INIT);
        b.qp.modify(IV_QP_STATE, &reset).unwrap();
        assert_eq!(status(&cb, IOCTL_IV_CM_ACCEPT, &acc), STATUS_SUCCESS);
        t.join().unwrap()
    });
    assert_eq!(st, STATUS_SUCCESS, "{}", status_name(st));
    assert_eq!((qp_state(&a), qp_state(&b)), (IV_QPS_RTS, IV_QPS_RTS));
    drop((a, b));
    drop((ca, cb));
    net.finish();
}
