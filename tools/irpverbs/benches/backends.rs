//! `cargo bench -p irpverbs-tools --bench backends`: the soft HCA and the
//! model HCA side by side in one run (control commands per second, SEND
//! latency, WRITE message rate). Prints figures; asserts nothing about
//! speed. `IRPVERBS_BENCH_SCALE` multiplies the iteration counts (default
//! 1).

fn main() {
    let scale = std::env::var("IRPVERBS_BENCH_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    match irpverbs_tools::bench::backends_suite(scale) {
        Ok(s) => print!("{s}"),
        Err(e) => {
            eprintln!("backends bench: {e}");
            std::process::exit(1);
        }
    }
}
