//! `cargo bench -p irpverbs-tools --bench cm`: RC connections established
//! per second through the whole driver in host mode (two host devices;
//! `CM_CONNECT` and `CM_ACCEPT` requests, many in flight): on one thread
//! over the simulated wire (the path's CPU cost, both sides), and as two
//! hosts with a thread each on a cable (the pair's rate). Prints figures;
//! it asserts nothing about speed.
//!
//! `IRPVERBS_BENCH_CONNECTIONS` (default 20,000) and
//! `IRPVERBS_BENCH_WINDOW` (default 1,000 and 100) set the sizes;
//! `IRPVERBS_BENCH_CM=one` (or `two`) runs only the one-thread (or the
//! two-host) form.

use irpverbs_tools::bench::{cm_connect_rate, cm_connect_rate_one_thread};

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn main() {
    let connections = env("IRPVERBS_BENCH_CONNECTIONS").unwrap_or(20_000);
    let windows = env("IRPVERBS_BENCH_WINDOW").map_or(vec![1_000, 100], |w| vec![w]);
    println!(
        "{:<48} {:>8} {:>12} {:>16}",
        "benchmark", "window", "connections", "connections/s"
    );
    type Run = fn(u64, u64) -> Result<irpverbs_tools::bench::CmRate, String>;
    let runs: [(&str, Run); 2] = [
        (
            "one thread, simulated wire (no faults)",
            cm_connect_rate_one_thread,
        ),
        ("two hosts, a thread each, cable", cm_connect_rate),
    ];
    let only = std::env::var("IRPVERBS_BENCH_CM").ok();
    for (i, (name, run)) in runs.into_iter().enumerate() {
        // IRPVERBS_BENCH_CM=one or =two runs one of the two.
        if only.as_deref().is_some_and(|o| o != ["one", "two"][i]) {
            continue;
        }
        for &window in &windows {
            match run(connections, window) {
                Ok(r) => println!(
                    "{:<48} {:>8} {:>12} {:>16.0}",
                    name,
                    r.window,
                    r.connections,
                    r.per_second()
                ),
                Err(e) => println!("{name}, window {window}: failed: {e}"),
            }
        }
    }
}
