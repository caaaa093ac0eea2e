//! Benchmarks of the control path through the whole stack: a synchronous
//! `DeviceIoControl`-equivalent from one thread, through the I/O manager
//! emulation, the dispatch-level queue callback, the driver, the soft HCA's
//! command interface, its event queue, the interrupt, the DPC and the
//! completion. Figures are rates measured in one run, never asserted.

use std::time::{Duration, Instant};

use irpverbs_abi::*;
use irpverbs_verbs::{Client, qp_request, rts_steps};

use crate::device::{Engine, HostDevice, HostDeviceConfig};
use crate::platform::{HostConfig, VerifierConfig};

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
}

impl ControlRate {
    /// IOCTLs per second.
    #[must_use]
    pub fn per_second(&self) -> f64 {
        self.ioctls as f64 / self.elapsed.as_secs_f64()
    }
}

fn device(verifier: bool, engine: Engine) -> std::sync::Arc<HostDevice> {
    HostDevice::new(HostDeviceConfig {
        platform: HostConfig {
            verifier: VerifierConfig {
                enabled: verifier,
                fail_pool: None,
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
    let dev = device(verifier, engine);
    let c = Client::new(Box::new(
        dev.open(FILE_READ_ACCESS | FILE_WRITE_ACCESS)
            .expect("open"),
    ));
    let start = Instant::now();
    for _ in 0..rounds {
        let cq = check(c.create_cq(64), "create_cq");
        check(c.destroy_cq(cq.cq), "destroy_cq");
    }
    let elapsed = start.elapsed();
    drop(c);
    dev.unload();
    ControlRate {
        name: "create+destroy CQ",
        verifier,
        engine,
        ioctls: rounds * 2,
        elapsed,
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
    let start = Instant::now();
    for _ in 0..rounds {
        let qp = check(c.create_qp_with(&req), "create_qp").qp;
        for (mask, attr) in &steps {
            check(c.modify_qp(qp, *mask, attr), "modify_qp");
        }
        check(c.destroy_qp(qp), "destroy_qp");
    }
    let elapsed = start.elapsed();
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
    }
}

/// Runs both benchmarks with the verifier off and on (and the threaded
/// engine), `ioctls` IOCTLs each.
#[must_use]
pub fn control_suite(ioctls: u64, engines: &[Engine]) -> Vec<ControlRate> {
    let mut out = Vec::new();
    for &engine in engines {
        for verifier in [false, true] {
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
        "{:<34} {:<8} {:<9} {:>10} {:>16}",
        "benchmark", "engine", "verifier", "ioctls", "ioctls/s"
    );
    for r in rates {
        let _ = writeln!(
            s,
            "{:<34} {:<8} {:<9} {:>10} {:>16.0}",
            r.name,
            format!("{:?}", r.engine).to_lowercase(),
            if r.verifier { "on" } else { "off" },
            r.ioctls,
            r.per_second()
        );
    }
    s
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
    let lat = |one_thread: bool, test: Test| -> Result<crate::perf::Latency, String> {
        let cfg = PerfConfig {
            sizes: vec![8],
            iters: 100_000 * scale,
            one_thread,
            ..PerfConfig::new(test)
        };
        match run(&cfg)?.remove(0) {
            Report::Latency(l) => Ok(l),
            Report::Bandwidth(_) => Err("not a latency".into()),
        }
    };
    let bw =
        |test: Test, size: u64, iters: u64, depth: u32| -> Result<crate::perf::Bandwidth, String> {
            let cfg = PerfConfig {
                sizes: vec![size],
                iters,
                tx_depth: depth,
                cq_mod: depth / 4,
                ..PerfConfig::new(test)
            };
            match run(&cfg)?.remove(0) {
                Report::Bandwidth(b) => Ok(b),
                Report::Latency(_) => Err("not a bandwidth".into()),
            }
        };
    let _ = writeln!(
        s,
        "{:<52} {:>10} {:>10} {:>10}",
        "latency, 8 bytes (us)", "typical", "99%", "99.9%"
    );
    for (name, one, test) in [
        ("RC SEND one-way, two polling threads", false, Test::SendLat),
        ("RC SEND one-way, one thread", true, Test::SendLat),
        (
            "RC WRITE one-way, two polling threads",
            false,
            Test::WriteLat,
        ),
        ("RC WRITE one-way, one thread", true, Test::WriteLat),
        ("RC READ round trip", false, Test::ReadLat),
        ("atomic fetch-and-add round trip", false, Test::AtomicLat),
    ] {
        let l = lat(one, test)?;
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
    let _ = writeln!(s, "\n{:<52} {:>12}", "message rate, 8 bytes", "Mmsg/s");
    for (name, test) in [("RC SEND", Test::SendBw), ("RC WRITE", Test::WriteBw)] {
        let b = bw(test, 8, 3_000_000 * scale, 128)?;
        let _ = writeln!(s, "{name:<52} {:>12.3}", b.mpps);
    }
    let _ = writeln!(
        s,
        "\n{:<52} {:>12} {:>12} {:>8}",
        "bandwidth", "MiB/s", "memcpy", "ratio"
    );
    for (size, iters, depth) in [
        (65536u64, 100_000 * scale, 32u32),
        (1 << 20, 6_000 * scale, 8),
    ] {
        let b = bw(Test::WriteBw, size, iters, depth)?;
        let m = memcpy_mib(size, iters, u64::from(depth));
        let _ = writeln!(
            s,
            "{:<52} {:>12.0} {:>12.0} {:>8.3}",
            format!("RC RDMA WRITE {} KiB", size / 1024),
            b.avg_mib,
            m,
            b.avg_mib / m
        );
    }
    Ok(s)
}
