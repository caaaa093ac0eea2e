//! `cargo bench -p irpverbs-tools --bench control`: control IOCTLs per
//! second through the whole path, verifier off and on. Prints figures; it
//! asserts nothing about speed.

use irpverbs_host::Engine;
use irpverbs_tools::bench::{control_suite, format_rates};

fn main() {
    let ioctls = std::env::var("IRPVERBS_BENCH_IOCTLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000_000);
    let engines: &[Engine] = match std::env::var("IRPVERBS_BENCH_ENGINE").as_deref() {
        Ok("inline") => &[Engine::Inline],
        Ok("thread") => &[Engine::Thread],
        _ => &[Engine::Inline, Engine::Thread],
    };
    let verifier: &[bool] = match std::env::var("IRPVERBS_BENCH_VERIFIER").as_deref() {
        Ok("off") => &[false],
        Ok("on") => &[true],
        _ => &[false, true],
    };
    let rates = control_suite(ioctls, engines, verifier);
    print!("{}", format_rates(&rates));
}
