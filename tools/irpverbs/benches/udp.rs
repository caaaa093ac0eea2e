//! `cargo bench -p irpverbs-tools --bench udp`: the UDP wire's figures —
//! 8-byte RC SEND latency between two host devices over UDP on loopback
//! beside a raw UDP ping-pong of the same datagram size, and 1 MiB RDMA
//! WRITE bandwidth beside a raw UDP stream of MTU-sized datagrams, all
//! measured in one run, with the ratios. Prints figures; asserts nothing
//! about speed. `IRPVERBS_BENCH_SCALE` multiplies the iteration counts.

fn main() {
    let scale = std::env::var("IRPVERBS_BENCH_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    match irpverbs_tools::bench::udp_suite(scale) {
        Ok(s) => print!("{s}"),
        Err(e) => {
            eprintln!("udp bench: {e}");
            std::process::exit(1);
        }
    }
}
