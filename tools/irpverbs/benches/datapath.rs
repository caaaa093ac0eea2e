//! `cargo bench -p irpverbs-tools --bench datapath`: the data path's figures
//! (latency, message rate, bandwidth beside memcpy, CQ-event wake-up), all
//! measured in one run. Prints figures; asserts nothing about speed.
//! `IRPVERBS_BENCH_SCALE` multiplies the iteration counts (default 1).

fn main() {
    let scale = std::env::var("IRPVERBS_BENCH_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    match irpverbs_tools::bench::datapath_suite(scale) {
        Ok(s) => print!("{s}"),
        Err(e) => {
            eprintln!("datapath bench: {e}");
            std::process::exit(1);
        }
    }
}
