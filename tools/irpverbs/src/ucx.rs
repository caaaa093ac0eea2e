//! The peer a user would pick for one machine, beside irpverbs in one run:
//! UCX's `ucx_perftest` over shared memory (`UCX_TLS=shm,self`), server and
//! client as two processes on 127.0.0.1, taking turns with `irpverbs perf`
//! (in process) for the same figures, each run printed with its ratio
//! (`cargo bench -p irpverbs-tools --bench ucx`).
//!
//! When `ucx_perftest` is not installed (Debian: `apt-get install
//! ucx-utils`) the suite says so and prints irpverbs' figures alone.

use std::fmt::Write as _;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::perf::{PerfConfig, Report, Test, memcpy_mib, run};

/// The program that runs UCX's side.
pub const UCX_PERFTEST: &str = "ucx_perftest";

/// What `ucx_perftest` prints last for a run (its `Final:` line).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UcxFinal {
    /// Iterations.
    pub iters: u64,
    /// Median latency (µs).
    pub typical_us: f64,
    /// Bandwidth over the whole run, MB/s (UCX's MB: 2^20 bytes).
    pub mib_per_s: f64,
    /// Messages per second over the whole run.
    pub msg_per_s: f64,
}

/// Parses the `Final:` line of `ucx_perftest`'s output: iterations, then
/// latency (50th percentile, average, overall), bandwidth (average,
/// overall) and message rate (average, overall).
#[must_use]
pub fn parse_final(output: &str) -> Option<UcxFinal> {
    let line = output.lines().rev().find(|l| l.starts_with("Final:"))?;
    let f: Vec<&str> = line["Final:".len()..].split_whitespace().collect();
    if f.len() != 8 {
        return None;
    }
    let num = |i: usize| f[i].parse::<f64>().ok().filter(|v| v.is_finite());
    Some(UcxFinal {
        iters: f[0].parse().ok()?,
        typical_us: num(1)?,
        mib_per_s: num(5)?,
        msg_per_s: num(7)?,
    })
}

/// Whether `ucx_perftest` can be started.
#[must_use]
pub fn ucx_available() -> bool {
    Command::new(UCX_PERFTEST)
        .arg("-h")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// A child killed (and reaped) when dropped.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One `ucx_perftest` run: a server process, then a client process that
/// connects to it on 127.0.0.1:`port`, with `args` (`-t TEST -s SIZE -n
/// ITERS`), both over shared memory.
///
/// # Errors
/// A process that could not start, failed, or printed no result.
pub fn ucx_run(port: u16, args: &[&str]) -> Result<UcxFinal, String> {
    let cmd = || {
        let mut c = Command::new(UCX_PERFTEST);
        c.env("UCX_TLS", "shm,self")
            .env("UCX_WARN_UNUSED_ENV_VARS", "n")
            .stdin(Stdio::null());
        c
    };
    let port_s = port.to_string();
    let server = cmd()
        .args(["-p", &port_s])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("{UCX_PERFTEST} (server): {e}"))?;
    let _server = Reaped(server);
    // The server listens within milliseconds; the client retries its
    // connection for a few seconds.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let client = cmd()
            .args(["127.0.0.1", "-p", &port_s])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{UCX_PERFTEST} (client): {e}"))?;
        let out = client
            .wait_with_output()
            .map_err(|e| format!("{UCX_PERFTEST} (client): {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        if let Some(f) = parse_final(&text) {
            return Ok(f);
        }
        if Instant::now() > deadline {
            let err = String::from_utf8_lossy(&out.stderr);
            return Err(format!(
                "{UCX_PERFTEST} {}: no result ({}): {}",
                args.join(" "),
                out.status,
                err.lines().last().unwrap_or("")
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Iteration counts of one round (`scale` multiplies them).
fn counts(scale: u64) -> [u64; 4] {
    [
        50_000 * scale,  // 8 B latency
        500_000 * scale, // 8 B message rate
        20_000 * scale,  // 64 KiB
        1_000 * scale,   // 1 MiB
    ]
}

fn irpverbs_lat(iters: u64, one_thread: bool) -> Result<f64, String> {
    let cfg = PerfConfig {
        sizes: vec![8],
        iters,
        one_thread,
        ..PerfConfig::new(Test::SendLat)
    };
    match run(&cfg)?.remove(0) {
        Report::Latency(l) => Ok(l.typical),
        Report::Bandwidth(_) => Err("not a latency".into()),
    }
}

fn irpverbs_bw(test: Test, size: u64, iters: u64, depth: u32) -> Result<(f64, f64), String> {
    let cfg = PerfConfig {
        sizes: vec![size],
        iters,
        tx_depth: depth,
        cq_mod: (depth / 4).max(1),
        ..PerfConfig::new(test)
    };
    match run(&cfg)?.remove(0) {
        Report::Bandwidth(b) => Ok((b.avg_mib, b.mpps)),
        Report::Latency(_) => Err("not a bandwidth".into()),
    }
}

/// `rounds` rounds, each running every figure once for irpverbs and once
/// for UCX (when `ucx` is set), in turns; every round's figures printed.
///
/// - 8 B one-way latency (µs, median): `irpverbs perf send_lat` with two
///   polling threads (and on one thread), against `ucx_perftest -t tag_lat`
///   between two processes;
/// - 8 B message rate with single posts (M msg/s): `send_bw` (tx depth
///   128, one post per message), against `-t tag_bw`;
/// - 64 KiB and 1 MiB bandwidth (MiB/s): `write_bw` (tx depth 32 and 8)
///   against `-t ucp_put_bw`, each beside `memcpy` of the same working set
///   (as many buffers as the tx depth).
///
/// # Errors
/// A run that failed.
pub fn ucx_suite(scale: u64, rounds: u32, ucx: bool, port: u16) -> Result<String, String> {
    let mut s = String::new();
    if !ucx {
        let _ = writeln!(
            s,
            "{UCX_PERFTEST} not found (Debian: apt-get install ucx-utils): the peer is skipped"
        );
    }
    let [lat_n, rate_n, bw64_n, bw1m_n] = counts(scale);
    let lat_n_s = lat_n.to_string();
    let rate_n_s = rate_n.to_string();
    let peer = |args: &[&str]| -> Result<Option<UcxFinal>, String> {
        if ucx {
            ucx_run(port, args).map(Some)
        } else {
            Ok(None)
        }
    };
    let fmt_peer = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.3}"));
    let ratio =
        |a: f64, b: Option<f64>| b.map_or_else(|| "-".to_string(), |b| format!("{:.2}", a / b));
    let _ = writeln!(
        s,
        "{:<7} {:<44} {:>10} {:>10} {:>9}",
        "round", "figure", "irpverbs", "UCX shm", "ratio"
    );
    for round in 1..=rounds {
        let mut row = |name: &str, ours: f64, theirs: Option<f64>, r: String| {
            let _ = writeln!(
                s,
                "{round:<7} {name:<44} {ours:>10.3} {:>10} {r:>9}",
                fmt_peer(theirs)
            );
        };
        // Latency: irpverbs / UCX (below 1: irpverbs is faster).
        let two = irpverbs_lat(lat_n, false)?;
        let one = irpverbs_lat(lat_n, true)?;
        let u = peer(&["-t", "tag_lat", "-s", "8", "-n", &lat_n_s])?.map(|f| f.typical_us);
        row(
            "8 B one-way latency, us (two threads)",
            two,
            u,
            ratio(two, u),
        );
        row(
            "8 B one-way latency, us (one thread)",
            one,
            u,
            ratio(one, u),
        );
        // Message rate: irpverbs / UCX (above 1: irpverbs is faster).
        let (_, mpps) = irpverbs_bw(Test::SendBw, 8, rate_n, 128)?;
        let u = peer(&["-t", "tag_bw", "-s", "8", "-n", &rate_n_s])?.map(|f| f.msg_per_s / 1e6);
        row(
            "8 B message rate, single posts, M msg/s",
            mpps,
            u,
            ratio(mpps, u),
        );
        for (size, iters, depth) in [(65536u64, bw64_n, 32u32), (1 << 20, bw1m_n, 8)] {
            let (mib, _) = irpverbs_bw(Test::WriteBw, size, iters, depth)?;
            let m = memcpy_mib(size, iters, u64::from(depth));
            let (size_s, iters_s) = (size.to_string(), iters.to_string());
            let u =
                peer(&["-t", "ucp_put_bw", "-s", &size_s, "-n", &iters_s])?.map(|f| f.mib_per_s);
            let k = size / 1024;
            row(&format!("{k} KiB bandwidth, MiB/s"), mib, u, ratio(mib, u));
            row(&format!("{k} KiB memcpy, MiB/s"), m, None, "-".into());
            row(
                &format!("{k} KiB bandwidth / memcpy"),
                mib / m,
                u.map(|u| u / m),
                "-".into(),
            );
        }
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_final_line_is_parsed_and_a_truncated_one_is_not() {
        let out = "\
[thread 0]             78923      0.276    26.737    52.202        0.29       0.15       37401       19156
Final:                100000      0.276    11.601    43.644        0.66       0.17       86200       22913
| Message size: 8 |
";
        assert_eq!(
            parse_final(out),
            Some(UcxFinal {
                iters: 100_000,
                typical_us: 0.276,
                mib_per_s: 0.17,
                msg_per_s: 22913.0,
            })
        );
        assert_eq!(parse_final("Final:  100000  0.276  11.601"), None);
        assert_eq!(parse_final("no result"), None);
        assert_eq!(
            parse_final("Final: 1 x 1 1 1 1 1 1"),
            None,
            "a field that is not a number"
        );
    }
}
