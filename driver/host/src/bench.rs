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
