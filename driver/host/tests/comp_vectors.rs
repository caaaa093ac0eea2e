//! Completion vectors through the host device (verifier on): each vector
//! has its own event queue, interrupt and DPC, the DPC on a processor (a
//! host thread) of its own. Two vectors' DPCs run at the same time; a CQ's
//! events are delivered by its vector's DPC only; `query_device` reports
//! the vectors there are, and a CQ on a vector past them is refused.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use irpverbs_abi::*;
use irpverbs_core::DISPATCH_LEVEL;
use irpverbs_host::platform::{
    DpcWatchdog, HostConfig, VerifierConfig, catch_bugcheck, codes, current_irql, dpc_watchdog,
};
use irpverbs_host::{Backend, Engine, HostDevice, HostDeviceConfig, HostFile, Ioctl};
use irpverbs_soft::SoftConfig;
use irpverbs_verbs::{Client, Cq, Qp, SendWr};
use zerocopy::{FromBytes, IntoBytes};

mod common;
use common::SharedFile as Shared;

crate::on_each_backend!(query_device_reports_the_vectors_and_cq_creation_checks_them,);

const ENGINES: [Engine; 2] = [Engine::Inline, Engine::Thread];

fn device(backend: Backend, engine: Engine, vectors: u32, platform: HostConfig) -> Arc<HostDevice> {
    HostDevice::new(HostDeviceConfig {
        backend,
        engine,
        platform,
        soft: SoftConfig {
            num_comp_vectors: vectors,
            ..SoftConfig::default()
        },
        ..HostDeviceConfig::default()
    })
    .expect("host device")
}

fn query_device(f: &HostFile) -> IvQueryDeviceOut {
    let (st, out) = f.ioctl(IOCTL_IV_QUERY_DEVICE, &[], size_of::<IvQueryDeviceOut>());
    assert_eq!(st, STATUS_SUCCESS, "{}", status_name(st));
    IvQueryDeviceOut::read_from_bytes(&out).unwrap()
}

fn cq_on(c: &Client, comp_vector: u32) -> Cq<'_> {
    c.new_cq(&IvCreateCqIn {
        cqe: 32,
        comp_vector,
        ..IvCreateCqIn::default()
    })
    .unwrap()
}

fn qp_in(pd: IvHandle, cq: IvHandle) -> IvCreateQpIn {
    IvCreateQpIn {
        pd,
        send_cq: cq,
        recv_cq: cq,
        srq: 0,
        qp_type: IV_QPT_RC,
        sq_sig_all: 0,
        cap: IvQpCap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 2,
            max_recv_sge: 2,
            max_inline_data: 64,
            ..IvQpCap::default()
        },
        ..IvCreateQpIn::default()
    }
}

/// What a CQ_NOTIFY's completion routine saw.
#[derive(Debug)]
struct Seen {
    cq: usize,
    status: NtStatus,
    thread: String,
    irql: u8,
    /// It saw the other routine start while it ran.
    met: bool,
}

/// Pends a CQ_NOTIFY on `cq` whose completion routine (in the DPC that
/// delivers the CQ's event) marks `started[me]`, then waits, up to
/// `rendezvous`, for `started[1 - me]`, and records what it saw.
fn pend_notify(
    f: &HostFile,
    cq: IvHandle,
    me: usize,
    started: &Arc<[AtomicBool; 2]>,
    rendezvous: Duration,
    seen: &Arc<Mutex<Vec<Seen>>>,
) {
    let arm = IvCqNotifyIn {
        cq,
        arm: IV_NOTIFY_NEXT,
        reserved: 0,
    };
    let (started, seen) = (Arc::clone(started), Arc::clone(seen));
    let sub = f.submit(
        Ioctl::user(
            IOCTL_IV_CQ_NOTIFY,
            arm.as_bytes(),
            size_of::<IvCqEventOut>(),
        ),
        move |status, _, _| {
            let irql = current_irql();
            started[me].store(true, Ordering::SeqCst);
            let deadline = Instant::now() + rendezvous;
            let mut met = started[1 - me].load(Ordering::SeqCst);
            while !met && Instant::now() < deadline {
                std::hint::spin_loop();
                met = started[1 - me].load(Ordering::SeqCst);
            }
            let thread = std::thread::current().name().unwrap_or("").to_owned();
            seen.lock().unwrap().push(Seen {
                cq: me,
                status,
                thread,
                irql,
                met,
            });
        },
    );
    assert!(sub.pended, "the notify waits for an event");
}

fn wait_for(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn drain(cq: &Cq<'_>, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = 0;
    let mut wc = [IvCqe::default(); 4];
    while got < n {
        assert!(Instant::now() < deadline, "{got} of {n} completions");
        got += cq.poll(&mut wc).unwrap();
    }
}

/// A loopback RC pair: `a` completes on vector 0's CQ, `b` on vector 1's;
/// `b` receives into `buf`.
struct Setup<'c> {
    cqa: Cq<'c>,
    cqb: Cq<'c>,
    a: Qp<'c>,
    b: Qp<'c>,
    recv: IvSge,
}

fn setup<'c>(c: &'c Client, buf: &mut [u8]) -> Setup<'c> {
    let pd = c.alloc_pd().unwrap().pd;
    let addr = buf.as_mut_ptr() as u64;
    let length = buf.len() as u32;
    let mr = c
        .reg_mr(pd, addr, u64::from(length), IV_ACCESS_LOCAL_WRITE)
        .unwrap();
    let recv = IvSge {
        addr,
        length,
        lkey: mr.lkey,
    };
    let cqa = cq_on(c, 0);
    let cqb = cq_on(c, 1);
    let a = c.new_qp(&qp_in(pd, cqa.handle())).unwrap();
    let b = c.new_qp(&qp_in(pd, cqb.handle())).unwrap();
    let gid = c.query_gid(1, 0).unwrap();
    a.connect(b.qpn(), gid).unwrap();
    b.connect(a.qpn(), gid).unwrap();
    Setup {
        cqa,
        cqb,
        a,
        b,
        recv,
    }
}

/// A SEND from `a` to `b`: one completion on each CQ.
fn send(s: &Setup<'_>, wr_id: u64) {
    s.b.post_recv(wr_id, &[s.recv]).unwrap();
    s.a.post_send(&SendWr {
        wr_id,
        opcode: IV_WR_SEND,
        flags: IV_SEND_SIGNALED | IV_SEND_INLINE,
        inline: Some(b"vector"),
        ..SendWr::default()
    })
    .unwrap();
}

/// The CQs on vectors 0 and 1 get their events from two DPCs that run at
/// the same time, each on its vector's processor: each completion routine
/// (run by the DPC, at DISPATCH_LEVEL) waits until it sees the other one
/// started. One DPC for every vector would run them one after the other,
/// and neither would see the other. Every round, each CQ's event comes
/// from its own vector's processor, never the other's.
/// Soft HCA only: the host runs an MSI-X message's DPC on the platform's
/// DPC thread, not on a processor of the message's own, so the model's
/// vectors' DPCs do not run concurrently.
#[test]
fn two_vectors_dpcs_run_concurrently_and_each_cq_signals_on_its_own() {
    for engine in ENGINES {
        let dev = device(Backend::Soft, engine, 2, HostConfig::default());
        let file = Arc::new(dev.open(FILE_READ_ACCESS | FILE_WRITE_ACCESS).unwrap());
        let c = Client::with_speed_path(Box::new(Shared(Arc::clone(&file))));
        let mut buf = vec![0u8; 64];
        let s = setup(&c, &mut buf);
        for round in 0..3u64 {
            let started = Arc::new([AtomicBool::new(false), AtomicBool::new(false)]);
            let seen = Arc::new(Mutex::new(Vec::new()));
            let rendezvous = Duration::from_secs(10);
            pend_notify(&file, s.cqa.handle(), 0, &started, rendezvous, &seen);
            pend_notify(&file, s.cqb.handle(), 1, &started, rendezvous, &seen);
            send(&s, round);
            wait_for("both notifies", || seen.lock().unwrap().len() == 2);
            let mut seen = std::mem::take(&mut *seen.lock().unwrap());
            seen.sort_by_key(|s| s.cq);
            for (v, s) in seen.iter().enumerate() {
                assert_eq!(s.status, STATUS_SUCCESS, "{engine:?} {s:?}");
                assert_eq!(s.irql, DISPATCH_LEVEL, "{engine:?} {s:?}");
                assert!(
                    s.met,
                    "{engine:?} round {round}: the DPCs ran one after the other: {seen:?}"
                );
                assert_eq!(
                    s.thread,
                    format!("irpverbs-vector-cpu{v}"),
                    "{engine:?}: CQ on vector {v} signalled elsewhere"
                );
            }
            drain(&s.cqa, 1);
            drain(&s.cqb, 1);
        }
        drop(s);
        drop(c);
        drop(file);
        dev.quiesce(Duration::from_secs(10)).expect("quiescent");
        assert_eq!(dev.platform().pool_stats().live, 0, "pool leaked");
        dev.unload();
    }
}

/// The verifier's DPC watchdog measures each vector's DPC on its own: a
/// completion routine that keeps vector 1's DPC past the time budget
/// bugchecks DPC_WATCHDOG_VIOLATION (single DPC) on vector 1's processor,
/// recorded for unload, while vector 0's DPC, short, passes.
/// Soft HCA only, as the test above.
#[test]
fn the_dpc_watchdog_times_each_vector_s_dpc() {
    let budget = Duration::from_secs(1);
    let platform = HostConfig {
        verifier: VerifierConfig {
            dpc_watchdog: Some(DpcWatchdog {
                max_work: u64::MAX,
                max_time: Some(budget),
            }),
            ..VerifierConfig::default()
        },
        ..HostConfig::default()
    };
    let dev = device(Backend::Soft, Engine::Inline, 2, platform);
    let file = Arc::new(dev.open(FILE_READ_ACCESS | FILE_WRITE_ACCESS).unwrap());
    let c = Client::with_speed_path(Box::new(Shared(Arc::clone(&file))));
    let mut buf = vec![0u8; 64];
    let s = setup(&c, &mut buf);
    // Vector 0's routine returns at once; vector 1's stays past the budget.
    let started = Arc::new([AtomicBool::new(false), AtomicBool::new(false)]);
    let seen = Arc::new(Mutex::new(Vec::new()));
    pend_notify(&file, s.cqa.handle(), 0, &started, Duration::ZERO, &seen);
    let arm = IvCqNotifyIn {
        cq: s.cqb.handle(),
        arm: IV_NOTIFY_NEXT,
        reserved: 0,
    };
    let slow_thread = Arc::new(Mutex::new(String::new()));
    let t = Arc::clone(&slow_thread);
    let slow = file.submit(
        Ioctl::user(
            IOCTL_IV_CQ_NOTIFY,
            arm.as_bytes(),
            size_of::<IvCqEventOut>(),
        ),
        move |_, _, _| {
            *t.lock().unwrap() = std::thread::current().name().unwrap_or("").to_owned();
            std::thread::sleep(budget * 3);
        },
    );
    assert!(slow.pended);
    send(&s, 1);
    wait_for("the watchdog", || {
        dev.platform().background_bugcheck().is_some()
    });
    let check = dev.platform().background_bugcheck().unwrap();
    assert_eq!(
        (check.code, check.params[0]),
        (codes::DPC_WATCHDOG_VIOLATION, dpc_watchdog::SINGLE_DPC),
        "{check}"
    );
    assert_eq!(*slow_thread.lock().unwrap(), "irpverbs-vector-cpu1");
    wait_for("vector 0's notify", || seen.lock().unwrap().len() == 1);
    assert_eq!(seen.lock().unwrap()[0].thread, "irpverbs-vector-cpu0");
    drain(&s.cqa, 1);
    drain(&s.cqb, 1);
    drop(s);
    drop(c);
    drop(file);
    let at_unload = catch_bugcheck(|| dev.unload()).expect_err("unload raises it");
    assert_eq!(at_unload, check);
}

/// `query_device` reports the vectors the HCA has; a CQ on the last one is
/// made, one past it is refused with STATUS_INVALID_PARAMETER (and nothing
/// made), as before vectors were real.
fn query_device_reports_the_vectors_and_cq_creation_checks_them(backend: Backend) {
    for n in [2u32, 3, 7] {
        let dev = device(backend, Engine::Inline, n, HostConfig::default());
        let f = dev.open(FILE_READ_ACCESS | FILE_WRITE_ACCESS).unwrap();
        assert_eq!(query_device(&f).num_comp_vectors, n);
        let create = |comp_vector| {
            f.ioctl(
                IOCTL_IV_CREATE_CQ,
                IvCreateCqIn {
                    cqe: 8,
                    comp_vector,
                    ..IvCreateCqIn::default()
                }
                .as_bytes(),
                size_of::<IvCreateCqOut>(),
            )
        };
        for bad in [n, n + 1, u32::MAX] {
            let (st, _) = create(bad);
            assert_eq!(st, STATUS_INVALID_PARAMETER, "vector {bad} of {n}");
        }
        let (st, out) = create(n - 1);
        assert_eq!(st, STATUS_SUCCESS, "{}", status_name(st));
        let cq = IvCreateCqOut::read_from_bytes(&out).unwrap().cq;
        let (st, _) = f.ioctl(IOCTL_IV_DESTROY_CQ, cq.as_bytes(), 0);
        assert_eq!(st, STATUS_SUCCESS);
        drop(f);
        dev.quiesce(Duration::from_secs(10)).expect("quiescent");
        dev.unload();
    }
    // The default: a vector per processor, at least 2.
    let processors = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    let dev = HostDevice::new(HostDeviceConfig {
        backend,
        ..HostDeviceConfig::default()
    })
    .unwrap();
    let f = dev.open(FILE_READ_ACCESS).unwrap();
    assert_eq!(
        query_device(&f).num_comp_vectors,
        irpverbs_soft::default_comp_vectors(processors)
    );
    assert!(query_device(&f).num_comp_vectors >= 2);
    drop(f);
    dev.unload();
}
