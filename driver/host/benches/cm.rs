//! `cargo bench -p irpverbs-host --bench cm`: RC connections established
//! per second through the whole driver in host mode (two host devices on
//! the loopback wire; `CM_CONNECT` and `CM_ACCEPT` requests, many in
//! flight). Prints figures; it asserts nothing about speed.
//!
//! `IRPVERBS_BENCH_CONNECTIONS` (default 20,000) and
//! `IRPVERBS_BENCH_WINDOW` (default 1,000 and 100) set the sizes.

use irpverbs_host::bench::cm_connect_rate;

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
    for window in windows {
        match cm_connect_rate(connections, window) {
            Ok(r) => println!(
                "{:<48} {:>8} {:>12} {:>16.0}",
                "connect + accept through the driver (LoopWire)",
                r.window,
                r.connections,
                r.per_second()
            ),
            Err(e) => println!("connect + accept, window {window}: failed: {e}"),
        }
    }
}
