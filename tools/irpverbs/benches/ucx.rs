//! `cargo bench -p irpverbs-tools --bench ucx`: irpverbs beside UCX over
//! shared memory (`ucx_perftest`, `UCX_TLS=shm,self`, server and client as
//! two processes on 127.0.0.1), taking turns, every round printed with its
//! ratios (`irpverbs_tools::ucx`). Without `ucx_perftest` (Debian:
//! `apt-get install ucx-utils`) it says so and prints irpverbs alone.
//! Prints figures; asserts nothing about speed.
//!
//! `IRPVERBS_BENCH_SCALE` multiplies the iteration counts (default 1),
//! `IRPVERBS_UCX_ROUNDS` sets the rounds (default 3), `IRPVERBS_UCX_PORT`
//! the TCP port of UCX's exchange (default 13337).

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let ucx = irpverbs_tools::ucx::ucx_available();
    match irpverbs_tools::ucx::ucx_suite(
        env("IRPVERBS_BENCH_SCALE", 1),
        env("IRPVERBS_UCX_ROUNDS", 3),
        ucx,
        env("IRPVERBS_UCX_PORT", 13337),
    ) {
        Ok(s) => print!("{s}"),
        Err(e) => {
            eprintln!("ucx bench: {e}");
            std::process::exit(1);
        }
    }
}
