//! `tools/irpverbs/callgrind_layers.py` (the split of `ibverbs_cost.sh`) on
//! a callgrind profile written here: each function's own instructions go
//! to its layer, the C library's to its caller's, `main` below
//! `__libc_start_main` to the program, and the empty polls are those whose
//! wire poll received nothing.

use std::path::PathBuf;
use std::process::Command;

/// A client's profile: perftest's loop posts (the library's post rings the
/// soft HCA's doorbell and zeroes a buffer through libc) and polls four
/// times; three polls find no completion and poll the wire, which delivers
/// one datagram once and finds nothing twice.
const PROFILE: &str = "\
# callgrind format
version: 1
positions: line
events: Ir
summary: 960

ob=/usr/lib/x86_64-linux-gnu/libc.so.6
fl=???
fn=(below main)
0 10
cob=/usr/bin/ib_send_bw
cfn=0x0000000000005ae0
calls=1 0
0 950

ob=/usr/bin/ib_send_bw
fn=0x0000000000005ae0
0 100
cob=/work/target/release/libibverbs.so.1
cfn=irpverbs_ibverbs::qp::post_send
calls=10 0
0 500
cob=/usr/lib/x86_64-linux-gnu/libc.so.6
cfn=__gettimeofday_syscall
calls=5 0
0 50
cob=/work/target/release/libibverbs.so.1
cfn=irpverbs_ibverbs::cq::poll_cq
calls=4 0
0 300

ob=/usr/lib/x86_64-linux-gnu/libc.so.6
fn=__gettimeofday_syscall
0 50

fn=__memset_avx2_unaligned_erms
0 40

ob=/work/target/release/libibverbs.so.1
fn=irpverbs_ibverbs::qp::post_send
0 60
cob=/usr/lib/x86_64-linux-gnu/libc.so.6
cfn=__memset_avx2_unaligned_erms
calls=10 0
0 40
cfn=<irpverbs_soft::SoftHca<P> as irpverbs_core::hca::Hca>::sq_doorbell
calls=10 0
0 400

fn=<irpverbs_soft::SoftHca<P> as irpverbs_core::hca::Hca>::sq_doorbell
0 400

fn=irpverbs_ibverbs::cq::poll_cq
0 20
cfn=IvUserPollCq
calls=4 0
0 280

fn=IvUserPollCq
0 40
cfn=irpverbs_host::device::HostDevice::poll_wire
calls=3 0
0 240

fn=irpverbs_host::device::HostDevice::poll_wire
0 30
cfn=irpverbs_soft::scheduler::<impl irpverbs_soft::SoftHca<P>>::flush_tx
calls=2 0
0 10
cfn=irpverbs_host::udp::UdpWire::poll_rx
calls=3 0
0 200

fn=irpverbs_soft::scheduler::<impl irpverbs_soft::SoftHca<P>>::flush_tx
0 10

fn=irpverbs_host::udp::UdpWire::poll_rx
0 100
cfn=<irpverbs_host::device::DeviceEndpoint as irpverbs_host::udp::Endpoint>::receive_queued
calls=1 0
0 100

fn=<irpverbs_host::device::DeviceEndpoint as irpverbs_host::udp::Endpoint>::receive_queued
0 100

totals: 960
";

#[test]
fn layers_of_a_profile() {
    if Command::new("python3").arg("--version").output().is_err() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "python3 is missing"
        );
        eprintln!("skipping: no python3");
        return;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let file = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("callgrind_layers.out");
    std::fs::write(&file, PROFILE).unwrap();
    let out = Command::new("python3")
        .arg(root.join("callgrind_layers.py"))
        .arg(&file)
        .output()
        .expect("run callgrind_layers.py");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8(out.stdout).unwrap();
    // Program: its loop (100) and its gettimeofday (50). Layer: post (60)
    // with its memset (40), poll_cq (20), IvUserPollCq (40). Driver: the
    // doorbell (400) and the wire poll (30 + 10 + 100 + 100). System:
    // below main (10). Empty: two wire polls that received nothing, each
    // an average poll without its wire poll ((300 - 240) / 4 = 15) and an
    // average wire poll without the datagram it delivered
    // ((240 - 100) / 3 = 46.67).
    assert_eq!(
        line.trim(),
        "total=960 program=150 layer=160 driver=640 system=10 polls=4 empty=2 empty_ir=123"
    );
}
