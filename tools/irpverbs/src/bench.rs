//! Benchmarks of the control path through the whole stack: a synchronous
//! `DeviceIoControl`-equivalent from one thread, through the I/O manager
//! emulation, the dispatch-level queue callback, the driver, the soft HCA's
//! command interface, its event queue, the interrupt, the DPC and the
//! completion. Figures are rates measured in one run, never asserted.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use irpverbs_abi::*;
use irpverbs_verbs::{Client, qp_request, rts_steps};

use irpverbs_host::device::{Engine, HostDevice, HostDeviceConfig};
use irpverbs_host::platform::{HostConfig, VerifierConfig};

/// One benchmark's result.
#[derive(Clone, Debug)]
pub struct ControlRate {
    /// What was measured.
    pub name: &'static str,
    /// Verifier on or off.
    pub verifier: bool,
    /// Where the firmware ran.
    pub engine: Engine,
    /// IOCTLs issued.
    pub ioctls: u64,
    /// Wall time.
    pub elapsed: Duration,
    /// CPU time of the issuing thread (which runs the whole path: the
    /// firmware is inline and DPCs run on it), where the OS reports it.
    pub cpu: Option<Duration>,
}

impl ControlRate {
    /// IOCTLs per second.
    #[must_use]
    pub fn per_second(&self) -> f64 {
        self.ioctls as f64 / self.elapsed.as_secs_f64()
    }

    /// IOCTLs per second of the issuing thread's CPU time: the rate
    /// without the time other processes took the CPU away (a shared
    /// machine's noise), still with their cache interference.
    #[must_use]
    pub fn per_cpu_second(&self) -> Option<f64> {
        self.cpu.map(|c| self.ioctls as f64 / c.as_secs_f64())
    }
}

/// This thread's CPU time so far (Linux: `/proc/thread-self/schedstat`,
/// nanoseconds on the CPU; `None` elsewhere).
#[must_use]
pub fn thread_cpu_time() -> Option<Duration> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = s.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

/// Wall and CPU time of `f` on this thread.
fn timed(f: impl FnOnce()) -> (Duration, Option<Duration>) {
    let cpu0 = thread_cpu_time();
    let start = Instant::now();
    f();
    let elapsed = start.elapsed();
    let cpu = cpu0
        .zip(thread_cpu_time())
        .map(|(a, b)| b.saturating_sub(a));
    (elapsed, cpu)
}

fn device(verifier: bool, engine: Engine) -> std::sync::Arc<HostDevice> {
    device_on(irpverbs_host::Backend::Soft, verifier, engine)
}

fn device_on(
    backend: irpverbs_host::Backend,
    verifier: bool,
    engine: Engine,
) -> std::sync::Arc<HostDevice> {
    HostDevice::new(HostDeviceConfig {
        backend,
        platform: HostConfig {
            verifier: VerifierConfig {
                enabled: verifier,
                fail_pool: None,
                ..VerifierConfig::default()
            },
            ..HostConfig::default()
        },
        engine,
        ..HostDeviceConfig::default()
    })
    .expect("host device")
}

fn check<T>(r: Result<T, NtStatus>, what: &str) -> T {
    r.unwrap_or_else(|s| panic!("{what} failed: {}", status_name(s)))
}

/// Creates and destroys a CQ `rounds` times (2 IOCTLs a round).
#[must_use]
pub fn cq_create_destroy(rounds: u64, verifier: bool, engine: Engine) -> ControlRate {
    cq_create_destroy_on(irpverbs_host::Backend::Soft, rounds, verifier, engine)
}

/// [`cq_create_destroy`] over `backend`.
#[must_use]
pub fn cq_create_destroy_on(
    backend: irpverbs_host::Backend,
    rounds: u64,
    verifier: bool,
    engine: Engine,
) -> ControlRate {
    let dev = device_on(backend, verifier, engine);
    let c = Client::new(Box::new(
        dev.open(FILE_READ_ACCESS | FILE_WRITE_ACCESS)
            .expect("open"),
    ));
    let (elapsed, cpu) = timed(|| {
        for _ in 0..rounds {
            let cq = check(c.create_cq(64), "create_cq");
            check(c.destroy_cq(cq.cq), "destroy_cq");
        }
    });
    drop(c);
    dev.unload();
    ControlRate {
        name: "create+destroy CQ",
        verifier,
        engine,
        ioctls: rounds * 2,
        elapsed,
        cpu,
    }
}

/// Creates a QP, walks it RESET -> INIT -> RTR -> RTS, destroys it,
/// `rounds` times (5 IOCTLs a round).
#[must_use]
pub fn qp_lifecycle(rounds: u64, verifier: bool, engine: Engine) -> ControlRate {
    let dev = device(verifier, engine);
    let c = Client::new(Box::new(
        dev.open(FILE_READ_ACCESS | FILE_WRITE_ACCESS)
            .expect("open"),
    ));
    let pd = check(c.alloc_pd(), "alloc_pd").pd;
    let cq = check(c.create_cq(256), "create_cq").cq;
    let gid = check(c.query_gid(1, 0), "query_gid");
    let steps = rts_steps(IV_QPT_RC, 0x42, gid);
    let req = qp_request(pd, cq, 0, IV_QPT_RC);
    let (elapsed, cpu) = timed(|| {
        for _ in 0..rounds {
            let qp = check(c.create_qp_with(&req), "create_qp").qp;
            for (mask, attr) in &steps {
                check(c.modify_qp(qp, *mask, attr), "modify_qp");
            }
            check(c.destroy_qp(qp), "destroy_qp");
        }
    });
    check(c.destroy_cq(cq), "destroy_cq");
    check(c.dealloc_pd(pd), "dealloc_pd");
    drop(c);
    dev.unload();
    ControlRate {
        name: "create QP, 3 modifies, destroy",
        verifier,
        engine,
        ioctls: rounds * 5,
        elapsed,
        cpu,
    }
}

/// Runs both benchmarks with the verifier off and on (and the threaded
/// engine), `ioctls` IOCTLs each.
#[must_use]
pub fn control_suite(ioctls: u64, engines: &[Engine], verifier: &[bool]) -> Vec<ControlRate> {
    let mut out = Vec::new();
    for &engine in engines {
        for &verifier in verifier {
            let rounds = if engine == Engine::Thread {
                ioctls / 20
            } else {
                ioctls
            };
            out.push(cq_create_destroy(rounds / 2, verifier, engine));
            out.push(qp_lifecycle(rounds / 5, verifier, engine));
        }
    }
    out
}

/// Formats results as a table.
#[must_use]
pub fn format_rates(rates: &[ControlRate]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<34} {:<8} {:<9} {:>10} {:>16} {:>18}",
        "benchmark", "engine", "verifier", "ioctls", "ioctls/s", "ioctls/CPU-s"
    );
    for r in rates {
        let cpu = r
            .per_cpu_second()
            .map_or_else(|| "-".to_string(), |v| format!("{v:.0}"));
        let _ = writeln!(
            s,
            "{:<34} {:<8} {:<9} {:>10} {:>16.0} {:>18}",
            r.name,
            format!("{:?}", r.engine).to_lowercase(),
            if r.verifier { "on" } else { "off" },
            r.ioctls,
            r.per_second(),
            cpu
        );
    }
    s
}

/// One-way latency of an 8-byte RC SEND (two polling threads, inline
/// engine) by the path its doorbells take, in one run, each measured three
/// times in turn and its best kept: direct calls (a kernel ULP's, the
/// transport on the posting thread); the doorbell page with the doorbell
/// thread polling (what a user-mode ULP does on Windows while traffic
/// flows: no system call); and the page with the thread asleep between
/// doorbells (a poll window of 0: each doorbell is an
/// `IOCTL_IV_RING_DOORBELLS`, what a ULP meets after a quiet spell).
///
/// # Errors
/// A verb that failed.
pub fn doorbell_latency(iters: u64) -> Result<String, String> {
    use crate::perf::{Latency, PerfConfig, Report, Test, run};
    use irpverbs_host::device::UserDoorbells;
    use std::fmt::Write as _;
    let paths: [(&str, UserDoorbells, Option<Duration>); 3] = [
        ("direct doorbells", UserDoorbells::Direct, None),
        ("doorbell page, thread polling", UserDoorbells::Page, None),
        (
            "doorbell page, thread asleep (ring IOCTL)",
            UserDoorbells::Page,
            Some(Duration::ZERO),
        ),
    ];
    let mut best: [Option<Latency>; 3] = [None, None, None];
    for _ in 0..3 {
        for (slot, &(_, doorbells, window)) in best.iter_mut().zip(&paths) {
            let cfg = PerfConfig {
                sizes: vec![8],
                iters,
                doorbells,
                doorbell_poll_window: window,
                ..PerfConfig::new(Test::SendLat)
            };
            let Report::Latency(l) = run(&cfg)?.remove(0) else {
                return Err("not a latency".into());
            };
            if slot.as_ref().is_none_or(|b| l.typical < b.typical) {
                *slot = Some(l);
            }
        }
    }
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<48} {:>10} {:>10} {:>10}",
        "RC SEND one-way, 8 bytes (us, best of 3)", "typical", "99%", "99.9%"
    );
    for ((name, _, _), l) in paths.iter().zip(best.iter().flatten()) {
        let _ = writeln!(
            s,
            "{name:<48} {:>10.3} {:>10.3} {:>10.3}",
            l.typical, l.p99, l.p999
        );
    }
    Ok(s)
}

/// The data path's figures the issue asks for, measured in one run:
/// 8-byte RC SEND one-way latency (two polling threads, and one thread),
/// 8-byte message rate, 64 KiB and 1 MiB RDMA WRITE bandwidth beside memcpy
/// bandwidth of the same sizes, and CQ-event wake-up latency.
///
/// # Errors
/// A verb that failed.
pub fn datapath_suite(scale: u64) -> Result<String, String> {
    use crate::perf::{PerfConfig, Report, Test, event_wakeup, memcpy_mib, run};
    use std::fmt::Write as _;
    let mut s = String::new();
    use irpverbs_host::device::UserDoorbells;
    // Where the soft HCA's transport runs: on the posting thread (direct
    // doorbells, the firmware inline), or on a thread of its own (the
    // firmware thread; the doorbell thread that scans doorbell pages).
    #[derive(Clone, Copy)]
    enum Hca {
        Posting,
        FirmwareThread,
        DoorbellPage,
        /// The doorbell page with the doorbell thread asleep between
        /// doorbells (a poll window of 0): each doorbell is the ring IOCTL.
        DoorbellIoctl,
    }
    let lat = |one_thread: bool, test: Test, hca: Hca| -> Result<crate::perf::Latency, String> {
        let (engine, doorbells, iters) = match hca {
            Hca::Posting => (Engine::Inline, UserDoorbells::Direct, 100_000),
            // A few microseconds each: fewer of them.
            Hca::FirmwareThread => (Engine::Thread, UserDoorbells::Direct, 20_000),
            Hca::DoorbellPage | Hca::DoorbellIoctl => (Engine::Inline, UserDoorbells::Page, 20_000),
        };
        let cfg = PerfConfig {
            sizes: vec![8],
            iters: iters * scale,
            one_thread,
            engine,
            doorbells,
            doorbell_poll_window: matches!(hca, Hca::DoorbellIoctl)
                .then_some(std::time::Duration::ZERO),
            ..PerfConfig::new(test)
        };
        match run(&cfg)?.remove(0) {
            Report::Latency(l) => Ok(l),
            Report::Bandwidth(_) => Err("not a latency".into()),
        }
    };
    let bw_with = |test: Test,
                   size: u64,
                   iters: u64,
                   depth: u32,
                   post_list: u32,
                   doorbells: irpverbs_host::device::UserDoorbells,
                   (use_srq, write_with_imm): (bool, bool)|
     -> Result<crate::perf::Bandwidth, String> {
        // The receiver reposts its receives in lists as long as the
        // sender's (perftest's --recv_post_list beside --post_list).
        let cfg = PerfConfig {
            sizes: vec![size],
            iters,
            tx_depth: depth,
            cq_mod: depth / 4,
            post_list,
            recv_post_list: post_list,
            doorbells,
            use_srq,
            write_with_imm,
            ..PerfConfig::new(test)
        };
        match run(&cfg)?.remove(0) {
            Report::Bandwidth(b) => Ok(b),
            Report::Latency(_) => Err("not a bandwidth".into()),
        }
    };
    let bw = |test: Test, size: u64, iters: u64, depth: u32, post_list: u32| {
        bw_with(
            test,
            size,
            iters,
            depth,
            post_list,
            irpverbs_host::device::UserDoorbells::Direct,
            (false, false),
        )
    };
    // Every row keeps its best of three runs, the tests taking turns (as
    // the bandwidth rows below): on a shared machine a single run of any
    // of them can land in a slow moment of its neighbours.
    let lat_tests = [
        (
            "RC SEND one-way, two polling threads",
            false,
            Test::SendLat,
            Hca::Posting,
        ),
        (
            "RC SEND one-way, one thread",
            true,
            Test::SendLat,
            Hca::Posting,
        ),
        (
            "RC WRITE one-way, two polling threads",
            false,
            Test::WriteLat,
            Hca::Posting,
        ),
        (
            "RC WRITE one-way, one thread",
            true,
            Test::WriteLat,
            Hca::Posting,
        ),
        ("RC READ round trip", false, Test::ReadLat, Hca::Posting),
        (
            "atomic fetch-and-add round trip",
            false,
            Test::AtomicLat,
            Hca::Posting,
        ),
        (
            "RC SEND one-way, two threads, firmware thread",
            false,
            Test::SendLat,
            Hca::FirmwareThread,
        ),
        (
            "RC SEND one-way, two threads, doorbell page",
            false,
            Test::SendLat,
            Hca::DoorbellPage,
        ),
        (
            "RC SEND one-way, doorbell page, poller asleep (IOCTL)",
            false,
            Test::SendLat,
            Hca::DoorbellIoctl,
        ),
    ];
    let mut best: Vec<Option<crate::perf::Latency>> = vec![None; lat_tests.len() + 1];
    let keep = |slot: &mut Option<crate::perf::Latency>, l: crate::perf::Latency| {
        if slot.as_ref().is_none_or(|b| l.typical < b.typical) {
            *slot = Some(l);
        }
    };
    for _ in 0..3 {
        for (i, &(_, one, test, hca)) in lat_tests.iter().enumerate() {
            keep(&mut best[i], lat(one, test, hca)?);
        }
        keep(
            &mut best[lat_tests.len()],
            cross_core_one_way(100_000 * scale),
        );
    }
    let _ = writeln!(
        s,
        "{:<52} {:>10} {:>10} {:>10}",
        "latency, 8 bytes (us, best of 3 alternating runs)", "typical", "99%", "99.9%"
    );
    let names = lat_tests
        .iter()
        .map(|&(name, _, _, _)| name)
        .chain(["reference: a cache line each way, two threads"]);
    for (name, l) in names.zip(best.iter().flatten()) {
        let _ = writeln!(
            s,
            "{name:<52} {:>10.3} {:>10.3} {:>10.3}",
            l.typical, l.p99, l.p999
        );
    }
    let w = event_wakeup(2000 * scale, Engine::Inline)?;
    let _ = writeln!(
        s,
        "{:<52} {:>10.3} {:>10.3} {:>10.3}",
        "CQ-event wake-up (notify IOCTL, blocked thread)", w.typical, w.p99, w.p999
    );
    let _ = writeln!(
        s,
        "\n{:<52} {:>12}",
        "message rate, 8 bytes (tx depth 128, best of 3)", "Mmsg/s"
    );
    // Direct doorbells run the soft HCA's transport on the posting thread
    // (a kernel ULP's call); page doorbells leave it to the device's
    // doorbell thread on another processor, as hardware would take it (a
    // user-mode ULP's doorbell page, scanned by a spinning thread in host
    // mode).
    use irpverbs_host::device::UserDoorbells::{Direct, Page};
    // (use_srq, write_with_imm)
    let plain = (false, false);
    let rate_tests = [
        ("RC SEND", Test::SendBw, 1, Direct, plain),
        ("RC SEND", Test::SendBw, 32, Direct, plain),
        ("RC WRITE", Test::WriteBw, 1, Direct, plain),
        ("RC WRITE", Test::WriteBw, 32, Direct, plain),
        ("RC SEND, doorbell page", Test::SendBw, 1, Page, plain),
        ("RC WRITE, doorbell page", Test::WriteBw, 1, Page, plain),
        ("RC SEND to an SRQ", Test::SendBw, 1, Direct, (true, false)),
        (
            "RC WRITE with immediate",
            Test::WriteBw,
            1,
            Direct,
            (false, true),
        ),
    ];
    let mut rates = [0f64; 8];
    for _ in 0..3 {
        for (r, &(_, test, list, bells, opts)) in rates.iter_mut().zip(&rate_tests) {
            *r = r.max(bw_with(test, 8, 3_000_000 * scale, 128, list, bells, opts)?.mpps);
        }
    }
    for (&(name, _, list, _, _), r) in rate_tests.iter().zip(rates) {
        let label = format!("{name}, post list {list}");
        let _ = writeln!(s, "{label:<52} {r:>12.3}");
    }
    let _ = writeln!(
        s,
        "\n{:<52} {:>12} {:>12} {:>8}",
        "bandwidth (best of 3 alternating runs)", "MiB/s", "memcpy", "ratio"
    );
    for (size, iters, depth) in [
        (65536u64, 100_000 * scale, 32u32),
        (1 << 20, 6_000 * scale, 8),
    ] {
        // The WRITE tests (single posts, and lists of 8 with one doorbell
        // each) and memcpy take turns, three times each, and each keeps its
        // best run: on a shared machine a single run of any of them can
        // land in a slow moment of its neighbours.
        let (mut b, mut bl, mut m) = (0f64, 0f64, 0f64);
        for _ in 0..3 {
            b = b.max(bw(Test::WriteBw, size, iters, depth, 1)?.avg_mib);
            bl = bl.max(bw(Test::WriteBw, size, iters, depth, 8)?.avg_mib);
            m = m.max(memcpy_mib(size, iters, u64::from(depth)));
        }
        for (list, b) in [(1, b), (8, bl)] {
            let _ = writeln!(
                s,
                "{:<52} {:>12.0} {:>12.0} {:>8.3}",
                format!("RC RDMA WRITE {} KiB, post list {list}", size / 1024),
                b,
                m,
                b / m
            );
        }
    }
    Ok(s)
}

/// `cargo bench -p irpverbs-tools --bench backends`: the soft HCA and the
/// model HCA (a mini-driver over the PCI seam, the soft HCA as its
/// device's engine) side by side in one run, the two taking turns, each
/// row the best of 3: control commands per second (create + destroy CQ,
/// verifier off, firmware inline), RC SEND one-way latency on one thread,
/// and the RC WRITE message rate of 8-byte messages. `scale` multiplies
/// the iteration counts.
///
/// # Errors
/// A run that failed.
pub fn backends_suite(scale: u64) -> Result<String, String> {
    use crate::perf::{PerfConfig, Report, Test, run};
    use irpverbs_host::Backend;
    use std::fmt::Write as _;
    const BACKENDS: [Backend; 2] = [Backend::Soft, Backend::Model];
    let (mut ioctls, mut lat, mut rate) = ([0f64; 2], [f64::MAX; 2], [0f64; 2]);
    for _ in 0..3 {
        for (i, &backend) in BACKENDS.iter().enumerate() {
            let c = cq_create_destroy_on(backend, 100_000 * scale, false, Engine::Inline);
            ioctls[i] = ioctls[i].max(c.per_second());
            let cfg = PerfConfig {
                sizes: vec![8],
                iters: 100_000 * scale,
                one_thread: true,
                backend,
                ..PerfConfig::new(Test::SendLat)
            };
            if let Report::Latency(l) = run(&cfg)?.remove(0) {
                lat[i] = lat[i].min(l.typical);
            }
            let cfg = PerfConfig {
                sizes: vec![8],
                iters: 1_000_000 * scale,
                tx_depth: 128,
                cq_mod: 32,
                backend,
                ..PerfConfig::new(Test::WriteBw)
            };
            if let Report::Bandwidth(b) = run(&cfg)?.remove(0) {
                rate[i] = rate[i].max(b.mpps);
            }
        }
    }
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<52} {:>10} {:>10} {:>8}",
        "backend (best of 3 alternating runs)", "soft", "model", "ratio"
    );
    for (name, [soft, model]) in [
        ("create+destroy CQ, IOCTLs/s", ioctls),
        ("RC SEND one-way, one thread, 8 bytes (us)", lat),
        ("RC WRITE message rate, 8 bytes (Mmsg/s)", rate),
    ] {
        let _ = writeln!(
            s,
            "{name:<52} {soft:>10.3} {model:>10.3} {:>8.3}",
            model / soft
        );
    }
    Ok(s)
}

/// The floor under any two-thread ping-pong on this machine, measured the
/// way the latency tests measure theirs: two threads pass a counter back
/// and forth through two cache lines (one written by each), and each
/// sample is half a round trip (microseconds). No driver, no rings: what
/// one message costs in cache-line transfers alone between the two
/// processors.
#[must_use]
pub fn cross_core_one_way(iters: u64) -> crate::perf::Latency {
    use std::sync::atomic::AtomicU64;
    #[repr(align(128))]
    struct Line(AtomicU64);
    let (ping, pong) = (Line(AtomicU64::new(0)), Line(AtomicU64::new(0)));
    let mut samples = Vec::with_capacity(iters as usize);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for i in 1..=iters {
                while ping.0.load(Ordering::Acquire) != i {
                    std::hint::spin_loop();
                }
                pong.0.store(i, Ordering::Release);
            }
        });
        for i in 1..=iters {
            let t0 = Instant::now();
            ping.0.store(i, Ordering::Release);
            while pong.0.load(Ordering::Acquire) != i {
                std::hint::spin_loop();
            }
            samples.push(t0.elapsed().as_secs_f64() * 1e6 / 2.0);
        }
    });
    crate::perf::latency_stats(samples, 8)
}

/// A server (a thread) and a client (this thread) of `irpverbs perf`'s
/// remote mode on 127.0.0.1 and 127.0.0.2, each with its own host device
/// and UDP wire, on free ports; the client's one figure.
///
/// # Errors
/// Either side's, as text.
pub fn udp_perf(cfg: &crate::perf::PerfConfig) -> Result<crate::perf::Report, String> {
    let (mut client, _) = udp_perf_runs(cfg)?;
    Ok(client.reports.remove(0))
}

/// [`udp_perf`], with both endpoints' whole results: the client's, then
/// the server's.
///
/// # Errors
/// Either side's, as text.
pub fn udp_perf_runs(
    cfg: &crate::perf::PerfConfig,
) -> Result<(crate::perf::RemoteRun, crate::perf::RemoteRun), String> {
    use crate::perf::{RemoteConfig, connect, serve};
    let (server, client) = loopback_pair()?;
    let s_cfg = cfg.clone();
    let s_rc = RemoteConfig {
        bind: Some(server),
        ..udp_ports(server, client)?
    };
    let c_rc = RemoteConfig {
        bind: Some(client),
        ..s_rc.clone()
    };
    let srv = std::thread::spawn(move || serve(&s_cfg, &s_rc));
    let run = connect(cfg, server, &c_rc);
    let served = srv.join().map_err(|_| "server panicked".to_string())?;
    Ok((run?, served?))
}

fn loopback_pair() -> Result<(std::net::IpAddr, std::net::IpAddr), String> {
    let a = "127.0.0.1".parse().map_err(|_| "address")?;
    let b = "127.0.0.2".parse().map_err(|_| "address")?;
    Ok((a, b))
}

/// An out-of-band TCP port and a UDP port free on both addresses.
fn udp_ports(
    a: std::net::IpAddr,
    b: std::net::IpAddr,
) -> Result<crate::perf::RemoteConfig, String> {
    use std::net::{TcpListener, UdpSocket};
    for _ in 0..20 {
        let port = |r: std::io::Result<std::net::SocketAddr>| r.map(|a| a.port());
        let oob = port(TcpListener::bind((a, 0)).and_then(|l| l.local_addr()))
            .map_err(|e| e.to_string())?;
        let udp = port(UdpSocket::bind((a, 0)).and_then(|s| s.local_addr()))
            .map_err(|e| e.to_string())?;
        if UdpSocket::bind((b, udp)).is_ok() {
            return Ok(crate::perf::RemoteConfig {
                udp_port: udp,
                oob_port: oob,
                ..crate::perf::RemoteConfig::default()
            });
        }
    }
    Err("no UDP port free on both loopback addresses".into())
}

/// Raw UDP ping-pong of `bytes`-byte datagrams between two threads with
/// blocking sockets on 127.0.0.1 and 127.0.0.2: half the round trip, in
/// microseconds, per iteration.
///
/// # Errors
/// A socket's.
pub fn udp_ping_pong(bytes: usize, iters: u64) -> Result<crate::perf::Latency, String> {
    use std::net::UdpSocket;
    let (a, b) = loopback_pair()?;
    let sa = UdpSocket::bind((a, 0)).map_err(|e| e.to_string())?;
    let sb = UdpSocket::bind((b, 0)).map_err(|e| e.to_string())?;
    let (to_a, to_b) = (
        sa.local_addr().map_err(|e| e.to_string())?,
        sb.local_addr().map_err(|e| e.to_string())?,
    );
    for s in [&sa, &sb] {
        s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .map_err(|e| e.to_string())?;
    }
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let mut buf = vec![0u8; 65536];
        for _ in 0..iters {
            let n = sb.recv(&mut buf)?;
            sb.send_to(&buf[..n], to_a)?;
        }
        Ok(())
    });
    let msg = vec![0x5Au8; bytes];
    let mut buf = vec![0u8; 65536];
    let mut samples = Vec::with_capacity(iters as usize);
    let mut result = Ok(());
    for _ in 0..iters {
        let t0 = std::time::Instant::now();
        if let Err(e) = sa.send_to(&msg, to_b).and_then(|_| sa.recv(&mut buf)) {
            result = Err(e.to_string());
            break;
        }
        samples.push(t0.elapsed().as_secs_f64() * 1e6 / 2.0);
    }
    let echoed = echo
        .join()
        .map_err(|_| "echo thread panicked".to_string())?;
    result?;
    echoed.map_err(|e| e.to_string())?;
    Ok(crate::perf::latency_stats(samples, 8))
}

/// Counts what a raw UDP wire receives (bytes, and when the last came).
#[derive(Default)]
struct Sink {
    bytes: std::sync::atomic::AtomicU64,
    last_ns: std::sync::atomic::AtomicU64,
    start: std::sync::OnceLock<std::time::Instant>,
}

impl irpverbs_host::udp::Endpoint for Sink {
    fn receive(&self, d: &irpverbs_host::udp::Datagram<'_>) {
        use std::sync::atomic::Ordering;
        let start = self.start.get_or_init(std::time::Instant::now);
        self.bytes
            .fetch_add(d.payload.len() as u64, Ordering::Relaxed);
        self.last_ns
            .store(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    fn advance_clock(&self, _now_ns: u64) -> Option<u64> {
        None
    }
}

/// A raw UDP stream of `bytes`-byte datagrams between two UDP wires on
/// 127.0.0.1 and 127.0.0.2, with the same batched system calls as the HCA's
/// (`sendmmsg` of 32, `recvmmsg`): the receiver's rate in MiB/s, from its
/// first datagram to its last, and the share of datagrams that arrived.
///
/// # Errors
/// A socket's.
pub fn udp_stream(bytes: usize, datagrams: u64) -> Result<(f64, f64), String> {
    use irpverbs_host::udp::{Datagram, UdpConfig, UdpWire, ip_gid};
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    let (a, b) = loopback_pair()?;
    let sink = Arc::new(Sink::default());
    let config = UdpConfig::default();
    let rx = UdpWire::start(sink.clone(), (b, 0).into(), &config).map_err(|e| e.to_string())?;
    let tx = UdpWire::start(Arc::new(Sink::default()), (a, 0).into(), &config)
        .map_err(|e| e.to_string())?;
    let payload = vec![0xA5u8; bytes];
    let to = rx.local_addr();
    let d = Datagram {
        sgid: ip_gid(a),
        dgid: ip_gid(b),
        src_port: 0,
        dst_port: to.port(),
        traffic_class: 0,
        flow_label: 0,
        hop_limit: 64,
        payload: &payload,
    };
    // Paced in batches of 32 so that the receiver can keep up (what is
    // dropped is not counted as received).
    let mut sent = 0;
    while sent < datagrams {
        let n = 32.min(datagrams - sent);
        tx.link().send(std::iter::repeat_n(d, n as usize));
        sent += n;
        let want = sent.saturating_sub(256) * bytes as u64;
        let wait = std::time::Instant::now();
        while sink.bytes.load(Ordering::Relaxed) < want
            && wait.elapsed() < std::time::Duration::from_millis(50)
        {
            std::hint::spin_loop();
        }
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(500);
    while sink.bytes.load(Ordering::Relaxed) < datagrams * bytes as u64
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let got = sink.bytes.load(Ordering::Relaxed);
    let secs = sink.last_ns.load(Ordering::Relaxed) as f64 / 1e9;
    tx.stop();
    rx.stop();
    if secs <= 0.0 {
        return Err("nothing arrived".into());
    }
    Ok((
        got as f64 / secs / f64::from(1 << 20),
        got as f64 / (datagrams * bytes as u64) as f64,
    ))
}

/// The UDP wire's figures (issue 4): 8-byte RC SEND latency between two
/// host devices over UDP on loopback beside a raw UDP ping-pong of the same
/// datagram size, and 1 MiB RDMA WRITE bandwidth beside a raw UDP stream of
/// MTU-sized datagrams, all measured in one run, with the ratios.
///
/// # Errors
/// A verb or a socket that failed.
pub fn udp_suite(scale: u64) -> Result<String, String> {
    use crate::perf::{PerfConfig, Report, Test};
    use std::fmt::Write as _;
    let mut s = String::new();
    // An 8-byte SEND only: BTH (12), payload (8), ICRC (4).
    let send_datagram = 12 + 8 + 4;
    // A middle packet of a WRITE at MTU 4096: BTH, 4096 bytes, ICRC.
    let write_datagram = 12 + 4096 + 4;
    let lat = match udp_perf(&PerfConfig {
        sizes: vec![8],
        iters: 20_000 * scale,
        ..PerfConfig::new(Test::SendLat)
    })? {
        Report::Latency(l) => l,
        Report::Bandwidth(_) => return Err("not a latency".into()),
    };
    let raw = udp_ping_pong(send_datagram, 20_000 * scale)?;
    let _ = writeln!(
        s,
        "{:<56} {:>9} {:>9} {:>9}",
        "latency over UDP on loopback (us)", "typical", "99%", "99.9%"
    );
    for (name, l) in [
        ("RC SEND 8 bytes one-way, two devices", &lat),
        ("raw UDP ping-pong one-way, 24-byte datagrams", &raw),
    ] {
        let _ = writeln!(
            s,
            "{name:<56} {:>9.2} {:>9.2} {:>9.2}",
            l.typical, l.p99, l.p999
        );
    }
    let _ = writeln!(
        s,
        "{:<56} {:>9.2}   (target <= 1.3)",
        "ratio (typical)",
        lat.typical / raw.typical
    );
    let bw = udp_perf(&PerfConfig {
        sizes: vec![1 << 20],
        iters: 500 * scale,
        // 2 MiB in flight: the soft HCA has no congestion control, and a
        // window the receiving thread cannot absorb on 2 cores is lost and
        // retried by go-back-N until the retries run out.
        tx_depth: 2,
        cq_mod: 1,
        ..PerfConfig::new(Test::WriteBw)
    });
    let (stream, arrived) = udp_stream(write_datagram, 131_072 * scale)?;
    let _ = writeln!(
        s,
        "\n{:<56} {:>9}",
        "bandwidth over UDP on loopback", "MiB/s"
    );
    // A failed run is a figure too: said, not hidden behind an exit.
    let bw_mib = match bw {
        Ok(Report::Bandwidth(b)) => {
            let _ = writeln!(
                s,
                "{:<56} {:>9.0}",
                "RC RDMA WRITE 1 MiB, two devices (MTU 4096)", b.avg_mib
            );
            Some(b.avg_mib)
        }
        Ok(Report::Latency(_)) => return Err("not a bandwidth".into()),
        Err(e) => {
            let _ = writeln!(s, "RC RDMA WRITE 1 MiB, two devices: failed: {e}");
            None
        }
    };
    let _ = writeln!(
        s,
        "{:<56} {:>9.0}   ({:.1} % arrived)",
        "raw UDP stream, 4112-byte datagrams, sendmmsg/recvmmsg",
        stream,
        arrived * 100.0
    );
    if let Some(mib) = bw_mib {
        let _ = writeln!(s, "{:<56} {:>9.2}   (target >= 0.7)", "ratio", mib / stream);
    }
    Ok(s)
}

/// Connections established through the driver's connection manager.
#[derive(Clone, Debug)]
pub struct CmRate {
    /// Connections established.
    pub connections: u64,
    /// Connects in flight at a time.
    pub window: u64,
    /// Wall time from the first connect to the last accept's completion.
    pub elapsed: Duration,
}

impl CmRate {
    /// Connections per second.
    #[must_use]
    pub fn per_second(&self) -> f64 {
        self.connections as f64 / self.elapsed.as_secs_f64()
    }
}

/// One side of [`cm_connect_rate`]: a device on the wire, a file,
/// and `n` RC QPs (RESET) with a CEP each.
struct CmSide {
    dev: std::sync::Arc<HostDevice>,
    file: irpverbs_host::device::HostFile,
    qps: Vec<IvHandle>,
    ceps: Vec<IvHandle>,
}

fn cm_call<O: zerocopy::FromBytes>(
    f: &irpverbs_host::device::HostFile,
    code: u32,
    input: &[u8],
) -> Result<O, String> {
    let (st, out) = f.ioctl(code, input, size_of::<O>());
    if st != STATUS_SUCCESS {
        return Err(format!("IOCTL {code:#x}: {}", status_name(st)));
    }
    O::read_from_bytes(&out[..size_of::<O>().min(out.len())])
        .map_err(|_| format!("IOCTL {code:#x}: short output"))
}

impl CmSide {
    fn new(
        last: u8,
        n: usize,
        clock: irpverbs_host::platform::TimerClock,
        verifier: bool,
    ) -> Result<Self, String> {
        use zerocopy::IntoBytes;
        let dev = HostDevice::new(HostDeviceConfig {
            platform: HostConfig {
                verifier: VerifierConfig {
                    enabled: verifier,
                    fail_pool: None,
                    ..VerifierConfig::default()
                },
                clock,
            },
            engine: Engine::Inline,
            soft: irpverbs_soft::SoftConfig {
                ip: std::net::IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, last)),
                node_guid: 0x0200_00FF_FE00_0000 | u64::from(last),
                max_qp: u32::try_from(n + 16).unwrap_or(u32::MAX),
                ..irpverbs_soft::SoftConfig::default()
            },
            ..HostDeviceConfig::default()
        })
        .map_err(|s| format!("host device: {}", status_name(s)))?;
        let file = dev
            .open(FILE_READ_ACCESS | FILE_WRITE_ACCESS)
            .map_err(|s| format!("open: {}", status_name(s)))?;
        let pd: IvAllocPdOut =
            cm_call(&file, IOCTL_IV_ALLOC_PD, IvAllocPdIn::default().as_bytes())?;
        let cq_in = IvCreateCqIn {
            cqe: 64,
            ..IvCreateCqIn::default()
        };
        let cq: IvCreateCqOut = cm_call(&file, IOCTL_IV_CREATE_CQ, cq_in.as_bytes())?;
        let req = qp_request(pd.pd, cq.cq, 0, IV_QPT_RC);
        let (mut qps, mut ceps) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for _ in 0..n {
            let qp: IvCreateQpOut = cm_call(&file, IOCTL_IV_CREATE_QP, req.as_bytes())?;
            qps.push(qp.qp);
            let cep: IvCreateCepOut = cm_call(
                &file,
                IOCTL_IV_CREATE_CEP,
                IvCreateCepIn::default().as_bytes(),
            )?;
            ceps.push(cep.cep);
        }
        Ok(Self {
            dev,
            file,
            qps,
            ceps,
        })
    }
}

/// Ends a connection benchmark: closes both sides' files (their
/// connections are abandoned as the CM's state asks), runs `unplug` (the
/// wire's last deliveries, then its removal), and unloads both devices
/// once idle.
///
/// # Errors
/// A device that did not go idle.
fn finish_pair(a: CmSide, b: CmSide, unplug: impl FnOnce()) -> Result<(), String> {
    drop((a.file, b.file));
    unplug();
    for d in [&a.dev, &b.dev] {
        d.quiesce(Duration::from_secs(30))?;
        d.unload();
    }
    Ok(())
}

/// The service the connection benchmarks listen on.
const BENCH_SERVICE: u64 = 0x0000_0000_0106_4D2A;

/// The benchmarks' connect request for connection `i`.
fn bench_connect(
    cep: IvHandle,
    qp: IvHandle,
    i: usize,
    local_gid: [u8; 16],
    remote_gid: [u8; 16],
) -> IvCmConnectIn {
    IvCmConnectIn {
        cep,
        qp,
        service_id: BENCH_SERVICE,
        local_gid,
        remote_gid,
        starting_psn: (0x100 + i as u32) & 0xFF_FFFF,
        cm_response_timeout: 18,
        max_cm_retries: 5,
        local_ack_timeout: 14,
        path_mtu: IV_MTU_1024 as u8,
        responder_resources: 4,
        initiator_depth: 4,
        retry_count: 7,
        rnr_retry_count: 7,
        min_rnr_timer: 12,
        flags: IV_CM_FLOW_CONTROL as u8,
        ..IvCmConnectIn::default()
    }
}

/// The benchmarks' accept of connect request `cep` with `qp`.
fn bench_accept(cep: IvHandle, qp: IvHandle) -> IvCmAcceptIn {
    IvCmAcceptIn {
        cep,
        qp,
        starting_psn: 0x200,
        responder_resources: 4,
        initiator_depth: 4,
        rnr_retry_count: 7,
        min_rnr_timer: 12,
        ..IvCmAcceptIn::default()
    }
}

/// The status of the first request a connection benchmark saw fail.
static FIRST_FAILURE: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// [`FIRST_FAILURE`]'s name.
fn first_failure() -> String {
    status_name(FIRST_FAILURE.load(std::sync::atomic::Ordering::Relaxed)).to_string()
}

/// A completion routine that counts the request in `done`, and in `failed`
/// unless it succeeded.
fn count_into(
    done: &std::sync::Arc<std::sync::atomic::AtomicU64>,
    failed: &std::sync::Arc<std::sync::atomic::AtomicU64>,
) -> impl FnOnce(NtStatus, usize, &[u8]) + Send + 'static {
    use std::sync::atomic::Ordering;
    let (done, failed) = (std::sync::Arc::clone(done), std::sync::Arc::clone(failed));
    move |st, _, _| {
        if st != STATUS_SUCCESS {
            // The first failure's status, for the error message.
            let _ = FIRST_FAILURE.compare_exchange(
                STATUS_SUCCESS,
                st,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            failed.fetch_add(1, Ordering::Relaxed);
        }
        done.fetch_add(1, Ordering::Release);
    }
}

/// Creates `b`'s listener on [`BENCH_SERVICE`].
fn bench_listen(b: &CmSide) -> Result<IvHandle, String> {
    use zerocopy::IntoBytes;
    let listener: IvCreateCepOut = cm_call(
        &b.file,
        IOCTL_IV_CREATE_CEP,
        IvCreateCepIn::default().as_bytes(),
    )?;
    let listen = IvListenIn {
        cep: listener.cep,
        service_id: BENCH_SERVICE,
    };
    cm_call::<()>(&b.file, IOCTL_IV_LISTEN, listen.as_bytes())?;
    Ok(listener.cep)
}

/// Connections per second through the whole driver in host mode: two host
/// devices, each driven by its own thread as two machines would be, cabled
/// back to back ([`irpverbs_host::pairwire::PairWire`]: RoCEv2 datagrams, ICRC and
/// all, the CM's MADs on their GSIs). Each thread runs its device's whole
/// receive path (datagrams, firmware, interrupts, DPCs) and its requests:
/// the connecting side keeps `window` `CM_CONNECT` requests in flight (QP
/// to INIT, REQ; on the REP QP to RTR and RTS, RTU), the accepting side
/// takes the listener's connect requests with asynchronous
/// `GET_CEP_EVENT`s and answers each with a `CM_ACCEPT` (QP to INIT, RTR,
/// RTS, REP; completes on the RTU). QPs and CEPs are created before the
/// clock starts; the clock stops when both sides' requests have completed.
/// Verifier off.
///
/// # Errors
/// A request that failed, a device that could not be built, or no
/// progress for 60 s.
pub fn cm_connect_rate(connections: u64, window: u64) -> Result<CmRate, String> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    let n = usize::try_from(connections).map_err(|e| e.to_string())?;
    let window = usize::try_from(window.clamp(1, connections.max(1))).unwrap_or(n);
    let real = irpverbs_host::platform::TimerClock::Real;
    let (a, b) = (
        CmSide::new(1, n, real, false)?,
        CmSide::new(2, n, real, false)?,
    );
    let wire = Arc::new(
        irpverbs_host::pairwire::PairWire::new(a.dev.soft(), b.dev.soft())
            .map_err(|s| format!("cable: {}", status_name(s)))?,
    );
    let listener = bench_listen(&b)?;
    let gids = (a.dev.soft().gid(), b.dev.soft().gid());
    // Either side's failure stops both.
    let stop = Arc::new(AtomicBool::new(false));
    let ready = Arc::new(std::sync::Barrier::new(2));
    let start = Arc::new(std::sync::OnceLock::<Instant>::new());
    let accepting = {
        let (wire, stop, ready, start) = (
            Arc::clone(&wire),
            Arc::clone(&stop),
            Arc::clone(&ready),
            Arc::clone(&start),
        );
        std::thread::Builder::new()
            .name("cm-bench-accept".into())
            .spawn(move || {
                ready.wait();
                let _ = start.set(Instant::now());
                let r = accept_side(&b, &wire, listener, n, &stop);
                if r.is_err() {
                    stop.store(true, Ordering::Relaxed);
                }
                (b, r)
            })
            .map_err(|e| e.to_string())?
    };
    ready.wait();
    let _ = start.set(Instant::now());
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let connected = connect_side(&a, &wire, gids, (n, window), (&done, &failed), &stop);
    if connected.is_err() {
        stop.store(true, Ordering::Relaxed);
    }
    let (b, accepted) = accepting
        .join()
        .map_err(|_| "the accepting thread panicked".to_string())?;
    let elapsed = start.get().map_or(Duration::ZERO, Instant::elapsed);
    connected?;
    accepted?;
    finish_pair(a, b, || drop(wire))?;
    Ok(CmRate {
        connections,
        window: window as u64,
        elapsed,
    })
}

/// How long a side of [`cm_connect_rate`] waits with no progress.
const CM_BENCH_STALL: Duration = Duration::from_secs(60);

/// A listener's connect requests, taken with one asynchronous
/// `GET_CEP_EVENT` at a time (the connection benchmarks' accepting side).
#[derive(Default)]
struct ListenerEvents {
    /// Events the completed requests returned, oldest first.
    got: std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<IvCepEventOut>>>,
    /// A request is pending.
    pending: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// The first request that failed: its status.
    failure: std::sync::Arc<std::sync::atomic::AtomicI32>,
}

impl ListenerEvents {
    /// Issues a `GET_CEP_EVENT` on `listener` unless one is pending.
    fn pend(&self, file: &irpverbs_host::device::HostFile, listener: IvHandle) {
        use std::sync::atomic::Ordering;
        use std::sync::{Arc, PoisonError};
        use zerocopy::{FromBytes, IntoBytes};

        if self.pending.swap(true, Ordering::AcqRel) {
            return;
        }
        let (got, pending, failure) = (
            Arc::clone(&self.got),
            Arc::clone(&self.pending),
            Arc::clone(&self.failure),
        );
        file.submit(
            irpverbs_host::device::Ioctl::user(
                IOCTL_IV_GET_CEP_EVENT,
                IvHandleIn { handle: listener }.as_bytes(),
                size_of::<IvCepEventOut>(),
            ),
            move |st, _, out| {
                match IvCepEventOut::read_from_prefix(out) {
                    Ok((e, _)) if st == STATUS_SUCCESS => got
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push_back(e),
                    _ => {
                        let st = if st == STATUS_SUCCESS {
                            STATUS_BUFFER_TOO_SMALL
                        } else {
                            st
                        };
                        let _ = failure.compare_exchange(
                            STATUS_SUCCESS,
                            st,
                            Ordering::Relaxed,
                            Ordering::Relaxed,
                        );
                    }
                }
                pending.store(false, Ordering::Release);
            },
        );
    }

    /// The oldest event got, if any.
    ///
    /// # Errors
    /// A request failed (its status named).
    fn next(&self) -> Result<Option<IvCepEventOut>, String> {
        let failed = self.failure.load(std::sync::atomic::Ordering::Relaxed);
        if failed != STATUS_SUCCESS {
            return Err(format!(
                "GET_CEP_EVENT on the listener: {}",
                status_name(failed)
            ));
        }
        Ok(self
            .got
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop_front())
    }
}

/// [`cm_connect_rate`]'s connecting side: `window` connects in flight,
/// polling its end of the cable, until all `n` completed.
fn connect_side(
    a: &CmSide,
    wire: &irpverbs_host::pairwire::PairWire,
    (gid_a, gid_b): ([u8; 16], [u8; 16]),
    (n, window): (usize, usize),
    (done, failed): (
        &std::sync::Arc<std::sync::atomic::AtomicU64>,
        &std::sync::Arc<std::sync::atomic::AtomicU64>,
    ),
    stop: &std::sync::atomic::AtomicBool,
) -> Result<(), String> {
    use std::sync::atomic::Ordering;
    use zerocopy::IntoBytes;

    use irpverbs_host::device::Ioctl;

    let mut next = 0usize;
    let (mut seen, mut since) = (0u64, Instant::now());
    loop {
        let completed = done.load(Ordering::Acquire);
        if failed.load(Ordering::Relaxed) > 0 {
            return Err(format!(
                "{} connects failed: {}",
                failed.load(Ordering::Relaxed),
                first_failure()
            ));
        }
        if completed >= n as u64 {
            return Ok(());
        }
        let in_flight = next - usize::try_from(completed).unwrap_or(next);
        let upto = (next + window.saturating_sub(in_flight)).min(n);
        for i in next..upto {
            let connect = bench_connect(a.ceps[i], a.qps[i], i, gid_a, gid_b);
            a.file.submit(
                Ioctl::user(IOCTL_IV_CM_CONNECT, connect.as_bytes(), 0),
                count_into(done, failed),
            );
        }
        next = next.max(upto);
        wire.poll(0);
        if completed != seen {
            (seen, since) = (completed, Instant::now());
        } else if stop.load(Ordering::Relaxed) {
            return Err("the accepting side failed".into());
        } else if since.elapsed() > CM_BENCH_STALL {
            return Err(format!("{completed} of {n} connects completed, then none"));
        }
    }
}

/// [`cm_connect_rate`]'s accepting side: one `GET_CEP_EVENT` pending on
/// the listener at a time, a `CM_ACCEPT` for each connect request, its
/// end of the cable polled, until all `n` accepts completed.
fn accept_side(
    b: &CmSide,
    wire: &irpverbs_host::pairwire::PairWire,
    listener: IvHandle,
    n: usize,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<(), String> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use zerocopy::IntoBytes;

    use irpverbs_host::device::Ioctl;

    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let events = ListenerEvents::default();
    let mut accepted = 0usize;
    let (mut seen, mut since) = (0u64, Instant::now());
    loop {
        let completed = done.load(Ordering::Acquire);
        if failed.load(Ordering::Relaxed) > 0 {
            return Err(format!("an accept failed: {}", first_failure()));
        }
        if completed >= n as u64 {
            return Ok(());
        }
        if accepted < n {
            events.pend(&b.file, listener);
        }
        let got = events.next()?;
        if let Some(req) = got {
            if req.event_type != IV_CEP_EVENT_CONNECT_REQUEST {
                return Err(format!("listener event {}", req.event_type));
            }
            let qp = *b
                .qps
                .get(accepted)
                .ok_or("more connect requests than QPs")?;
            let accept = bench_accept(req.cep, qp);
            b.file.submit(
                Ioctl::user(IOCTL_IV_CM_ACCEPT, accept.as_bytes(), 0),
                count_into(&done, &failed),
            );
            accepted += 1;
            continue;
        }
        wire.poll(1);
        let progress = completed + accepted as u64;
        if progress != seen {
            (seen, since) = (progress, Instant::now());
        } else if stop.load(Ordering::Relaxed) {
            return Err("the connecting side failed".into());
        } else if since.elapsed() > CM_BENCH_STALL {
            return Err(format!(
                "{accepted} accepted, {completed} completed, then nothing"
            ));
        }
    }
}

/// [`cm_connect_rate`] on one thread: the two devices on a fault-free
/// simulated wire ([`irpverbs_host::simwire::SimHosts`], no delay), firmware
/// inline, every DPC and MAD delivery on the benchmark's thread, so the
/// figure is the CPU cost of the whole path (driver, CM, QP modify
/// commands, RoCEv2 datagrams with their ICRC) without thread hand-offs.
/// The listener's events are taken with asynchronous `GET_CEP_EVENT`
/// requests.
///
/// # Errors
/// A request that failed, a device that could not be built, or a wire
/// with nothing left to deliver before every connection was made.
pub fn cm_connect_rate_one_thread(connections: u64, window: u64) -> Result<CmRate, String> {
    cm_connect_one_thread(connections, window, false)
}

/// [`cm_connect_rate_one_thread`] with the verifier on or off (the demo
/// runs it on; both devices unload under its leak checks).
///
/// # Errors
/// As [`cm_connect_rate_one_thread`].
pub fn cm_connect_one_thread(
    connections: u64,
    window: u64,
    verifier: bool,
) -> Result<CmRate, String> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    let n = usize::try_from(connections).map_err(|e| e.to_string())?;
    let window = usize::try_from(window.clamp(1, connections.max(1))).unwrap_or(n);
    let virt = irpverbs_host::platform::TimerClock::Virtual;
    let (a, b) = (
        CmSide::new(1, n, virt, verifier)?,
        CmSide::new(2, n, virt, verifier)?,
    );
    let net = irpverbs_host::simwire::SimHosts::new(
        irpverbs_soft::sim::SimConfig::default(),
        &[&a.dev, &b.dev],
    )
    .map_err(|s| format!("simulated wire: {}", status_name(s)))?;
    let listener = bench_listen(&b)?;
    let (gid_a, gid_b) = (a.dev.soft().gid(), b.dev.soft().gid());
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    one_thread_connects(
        &a,
        &b,
        &net,
        listener,
        (gid_a, gid_b),
        (n, window),
        &done,
        &failed,
    )?;
    let elapsed = start.elapsed();
    let failures = failed.load(Ordering::Relaxed);
    if failures > 0 {
        return Err(format!("{failures} connects or accepts failed"));
    }
    finish_pair(a, b, || {
        net.run(net.now());
        drop(net);
    })?;
    Ok(CmRate {
        connections,
        window: window as u64,
        elapsed,
    })
}

/// The timed part of [`cm_connect_one_thread`] (not inlined, so a profiler
/// can tell it from the set-up and the teardown).
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn one_thread_connects(
    a: &CmSide,
    b: &CmSide,
    net: &irpverbs_host::simwire::SimHosts,
    listener: IvHandle,
    (gid_a, gid_b): ([u8; 16], [u8; 16]),
    (n, window): (usize, usize),
    done: &std::sync::Arc<std::sync::atomic::AtomicU64>,
    failed: &std::sync::Arc<std::sync::atomic::AtomicU64>,
) -> Result<(), String> {
    use std::sync::atomic::Ordering;
    use zerocopy::IntoBytes;

    use irpverbs_host::device::Ioctl;

    let events = ListenerEvents::default();
    let (mut next, mut accepted) = (0usize, 0usize);
    while next < n {
        let batch = (n - next).min(window);
        for i in next..next + batch {
            let connect = bench_connect(a.ceps[i], a.qps[i], i, gid_a, gid_b);
            a.file.submit(
                Ioctl::user(IOCTL_IV_CM_CONNECT, connect.as_bytes(), 0),
                count_into(done, failed),
            );
        }
        next += batch;
        while accepted < next {
            events.pend(&b.file, listener);
            let got = events.next()?;
            match got {
                Some(req) if req.event_type == IV_CEP_EVENT_CONNECT_REQUEST => {
                    let accept = bench_accept(req.cep, b.qps[accepted]);
                    b.file.submit(
                        Ioctl::user(IOCTL_IV_CM_ACCEPT, accept.as_bytes(), 0),
                        count_into(done, failed),
                    );
                    accepted += 1;
                }
                Some(req) => return Err(format!("listener event {}", req.event_type)),
                None => {
                    if !net.step(u64::MAX) {
                        return Err(format!("the wire went idle after {accepted} accepts"));
                    }
                }
            }
        }
        let want = 2 * next as u64;
        if !net.run_until(u64::MAX, || done.load(Ordering::Relaxed) >= want) {
            return Err(format!(
                "{} of {want} requests completed",
                done.load(Ordering::Relaxed)
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// The cross-core reference passes every round trip (a lost one would
    /// hang) and reports one sample per round trip.
    #[test]
    fn cross_core_reference_runs_every_round_trip() {
        let l = super::cross_core_one_way(2000);
        assert_eq!(l.iters, 2000);
        assert!(
            l.min > 0.0 && l.min <= l.typical && l.typical <= l.max,
            "{l:?}"
        );
    }

    /// The connection benchmark's path works: every connect and accept
    /// succeeds, both devices unload clean (a figure is printed by the
    /// bench, not checked here).
    #[test]
    fn cm_connect_rate_connects_everything() {
        let r = super::cm_connect_rate(40, 16).expect("connections");
        assert_eq!((r.connections, r.window), (40, 16));
    }

    /// The same on one thread over the simulated wire.
    #[test]
    fn cm_connect_rate_one_thread_connects_everything() {
        let r = super::cm_connect_rate_one_thread(40, 16).expect("connections");
        assert_eq!((r.connections, r.window), (40, 16));
    }
}
