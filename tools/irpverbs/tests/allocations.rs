//! The data path allocates nothing per message once it runs: posts, polls,
//! doorbells, the soft HCA's transport (the loopback fast path, the packet
//! engine inline and on its own thread) and the UDP wire between two host
//! devices. In a Windows driver every allocation at DISPATCH_LEVEL can fail
//! (Driver Verifier's low-resources simulation makes it fail), so steady
//! traffic must run on what setup allocated: buffers that grow to their
//! high-water mark and are reused.
//!
//! Each case runs `irpverbs perf` with 5,000 and with 50,000 messages,
//! counting every allocation and reallocation of the process (the host
//! library's global allocator counts them). Setup and teardown are the same in both
//! runs, so the difference is what 45,000 more messages cost; it must stay
//! under [`SLACK`]: buffers growing to a new high-water mark (a burst
//! larger than any before, or transmit batches merged into a longer run
//! than before), which timing moves. Before the wire's transmit batches
//! were reused, 8-byte SENDs over UDP made 2 allocations per message and
//! 64 KiB WRITEs 8.5; before the port fallback (a datagram whose source
//! port another socket holds, which happens under load) resealed in a
//! buffer of the link's, each datagram through it allocated its copy.

use std::sync::Mutex;

use irpverbs_host::Engine;
use irpverbs_host::platform::heap::process_allocations;
use irpverbs_tools::perf::{PerfConfig, Test, run};

/// The count is process-wide: one case at a time (the test harness runs
/// tests on several threads).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// More allocations 45,000 more messages may make (growth to new
/// high-water marks): one per 100 messages. Measured: 0 on loopback,
/// 0 to 24 over UDP.
const SLACK: u64 = 450;

/// Allocations made by `f`, anywhere in the process.
fn allocations(f: impl FnOnce()) -> u64 {
    let before = process_allocations();
    f();
    process_allocations() - before
}

/// Allocations of `go` with 50,000 messages less those with 5,000: what
/// 45,000 more messages cost. `go` returns how many buffers its runs grew
/// to (the UDP wire's receive buffers, a pool that grows to the most
/// datagrams in flight at once: two allocations each, which a burst in
/// one run and not the other moves). Asserts the difference, less the
/// longer run's extra buffers, is under [`SLACK`].
fn assert_none_per_message(what: &str, cfg: &PerfConfig, go: impl Fn(&PerfConfig) -> u64) {
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let with = |iters| {
        let cfg = PerfConfig {
            iters,
            ..cfg.clone()
        };
        let mut buffers = 0;
        let n = allocations(|| buffers = go(&cfg));
        (n, buffers)
    };
    // A first run grows every lazily sized buffer of the process (thread
    // locals, the harness's) to what a run needs.
    with(5_000);
    let (short, short_buffers) = with(5_000);
    let (long, long_buffers) = with(50_000);
    let grown = 2 * long_buffers.saturating_sub(short_buffers);
    let more = long.saturating_sub(short).saturating_sub(grown);
    println!(
        "{what}: {short} allocations in 5,000 messages, {long} in 50,000 \
         ({long_buffers} receive buffers, {short_buffers} in the shorter run)"
    );
    assert!(
        more <= SLACK,
        "{what}: 45,000 more messages made {more} more allocations besides \
         {grown} for receive buffers ({short} in 5,000, {long} in 50,000)"
    );
}

fn loopback(cfg: &PerfConfig) -> u64 {
    run(cfg).unwrap_or_else(|e| panic!("{}: {e}", cfg.test.name()));
    0
}

fn over_udp(cfg: &PerfConfig) -> u64 {
    let (client, server) = irpverbs_tools::bench::udp_perf_runs(cfg)
        .unwrap_or_else(|e| panic!("{}: {e}", cfg.test.name()));
    // Datagrams sent from the listening socket because their source port
    // was taken (under load, by another process's socket): resealed in the
    // link's own buffer, allocating nothing either
    // (`the_port_fallback_reseals_in_place_and_allocates_nothing`).
    let fallbacks = client.udp.port_fallbacks + server.udp.port_fallbacks;
    if fallbacks > 0 {
        println!("  {fallbacks} datagrams left through the port fallback");
    }
    client.link.rx_buffers + server.link.rx_buffers
}

fn config(test: Test, size: u64) -> PerfConfig {
    PerfConfig {
        sizes: vec![size],
        ..PerfConfig::new(test)
    }
}

/// One device, two QPs: the fast path with the firmware inline, and with
/// the firmware on its own thread with the verifier on.
#[test]
fn loopback_traffic_allocates_nothing_per_message() {
    for engine in [Engine::Inline, Engine::Thread] {
        for (test, size) in [
            (Test::SendBw, 8),
            (Test::SendBw, 5000),
            (Test::WriteBw, 65536),
            (Test::ReadBw, 4096),
            (Test::AtomicBw, 8),
            (Test::SendLat, 8),
            (Test::WriteLat, 8),
        ] {
            if engine == Engine::Thread && test.is_latency() {
                // A wake-up of the firmware's thread per message: slow,
                // and the same code as the bandwidth tests.
                continue;
            }
            let cfg = PerfConfig {
                engine,
                verifier: engine == Engine::Thread,
                // 256-byte MTU: 5000-byte SENDs and 64 KiB WRITEs are
                // messages of many packets.
                mtu: 1,
                ..config(test, size)
            };
            assert_none_per_message(
                &format!("{} {size} bytes, {engine:?} engine", test.name()),
                &cfg,
                loopback,
            );
        }
    }
    // SENDs to an SRQ, and WRITEs with immediate data, which consume
    // receives the server reposts.
    let srq = PerfConfig {
        use_srq: true,
        qps: 2,
        ..config(Test::SendBw, 64)
    };
    assert_none_per_message("send_bw to an SRQ", &srq, loopback);
    let imm = PerfConfig {
        write_with_imm: true,
        ..config(Test::WriteBw, 64)
    };
    assert_none_per_message("write_bw with immediate", &imm, loopback);
}

/// Two host devices on 127.0.0.1 and 127.0.0.2, each with its UDP wire:
/// every packet serialized, sent, received, parsed and acknowledged.
#[test]
fn udp_traffic_allocates_nothing_per_message() {
    for (test, size) in [
        (Test::SendBw, 8),
        (Test::WriteBw, 4096),
        (Test::ReadBw, 4096),
        (Test::AtomicBw, 8),
        (Test::SendLat, 8),
    ] {
        let cfg = config(test, size);
        assert_none_per_message(
            &format!("{} {size} bytes over UDP", test.name()),
            &cfg,
            over_udp,
        );
    }
}
