//! `irpverbs perf --pcap FILE`: a server and a client on the loopback
//! interface (127.0.0.3 and 127.0.0.4, port 4791) over the UDP wire; the client
//! records every packet it sends and receives. The capture reads back with
//! pcap-file, every frame parses as RoCEv2 with a good ICRC, and tshark
//! (when installed; required when IRPVERBS_REQUIRE_TSHARK is set, as CI
//! does) decodes it as InfiniBand.

use std::io::Read;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use irpverbs_soft::wire;
use pcap_file::pcap::PcapReader;

/// Waits for `child`, killing it after `limit` (a watchdog: a hung run
/// fails the test; the time is not what is tested).
fn finish(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let status = child.wait().expect("wait");
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_end(&mut stdout);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_end(&mut stderr);
    }
    Output {
        status,
        stdout,
        stderr,
    }
}

fn perf(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_irpverbs"))
        .arg("perf")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn irpverbs")
}

#[test]
fn perf_client_captures_the_wire() {
    let dir = std::env::temp_dir();
    let path = dir.join(format!("irpverbs-perf-{}.pcap", std::process::id()));
    let (udp, oob) = ("4791", "18561");
    let common = [
        "send_lat",
        "-s",
        "64",
        "-n",
        "50",
        "-Q",
        "5",
        "--port",
        udp,
        "--oob-port",
        oob,
    ];
    let server = perf(&[&common[..], &["--server", "--bind", "127.0.0.3"]].concat());
    std::thread::sleep(Duration::from_millis(300));
    let pcap = path.to_str().expect("path");
    let client = perf(
        &[
            &common[..],
            &[
                "--connect",
                "127.0.0.3",
                "--bind",
                "127.0.0.4",
                "--pcap",
                pcap,
            ],
        ]
        .concat(),
    );
    let c = finish(client, Duration::from_secs(120));
    let s = finish(server, Duration::from_secs(30));
    let text = |o: &Output| {
        format!(
            "{}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    assert!(c.status.success(), "client: {}", text(&c));
    assert!(s.status.success(), "server: {}", text(&s));

    let file = std::fs::read(&path).expect("the capture");
    let mut r = PcapReader::new(&file[..]).expect("a pcap file");
    let (mut sent, mut received) = (0, 0);
    while let Some(p) = r.next_packet() {
        let p = p.expect("a record");
        let parsed = wire::parse_frame(&p.data).expect("a good RoCEv2 frame");
        if parsed.ip.src[12..] == [127, 0, 0, 4] {
            sent += 1;
        } else {
            received += 1;
        }
    }
    // 50 pings out and 50 pongs in; with -Q 5 every fifth send of each
    // side is signaled, so it asks for an ACK: 10 ACKs each way.
    assert!(
        sent >= 60 && received >= 60,
        "{sent} sent, {received} received"
    );

    let tshark = Command::new("tshark").arg("--version").output();
    if tshark.is_err() {
        assert!(
            std::env::var_os("IRPVERBS_REQUIRE_TSHARK").is_none(),
            "tshark is required (IRPVERBS_REQUIRE_TSHARK) but not installed"
        );
        println!("tshark is not installed: the dissector check is skipped");
    } else {
        let out = Command::new("tshark")
            .arg("-r")
            .arg(&path)
            .args(["-d", &format!("udp.port=={udp},infiniband")])
            .args(["-Y", "infiniband.bth"])
            .args(["-T", "fields", "-e", "infiniband.bth.opcode"])
            .output()
            .expect("tshark");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let opcodes: Vec<u8> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        assert_eq!(opcodes.len(), sent + received, "tshark decoded every frame");
        assert!(opcodes.contains(&4), "RC SEND ONLY");
        assert!(opcodes.contains(&17), "RC ACKNOWLEDGE");
    }
    let _ = std::fs::remove_file(&path);
}
