//! Debian's unmodified rdma-core programs (`ibverbs-utils`) and perftest
//! over this library (and its stand-ins for `libmlx5.so.1` and
//! `libefa.so.1`): `ibv_devices`, `ibv_devinfo -v`, the ping-pong tests and
//! perftest's send, write, read and atomic tests as a server and a client
//! process, each process a host of its own (`IRPVERBS_ADDR`, a UDP wire on
//! a loopback address). A test fails when a program exits non-zero, prints
//! an error to stderr or does not finish in time. Without the programs it
//! says it skips, except in CI (`CI=true`).
//!

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{command, finish, program};

/// Runs a program to its end; asserts it succeeded silently on stderr.
fn run_ok(exe: &Path, args: &[&str]) -> String {
    let child = command(exe, None).args(args).spawn().expect("spawn");
    let (ok, out, err) = finish(child, &exe.display().to_string(), Duration::from_secs(60));
    assert!(
        ok && err.is_empty(),
        "{} {args:?} failed:\n{out}\n{err}",
        exe.display()
    );
    out
}

/// True once a socket listens on TCP `port` (any address).
fn listening(port: u16) -> bool {
    let want = format!(":{port:04X} ");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                l.split_whitespace()
                    .nth(1)
                    .is_some_and(|a| format!("{a} ").ends_with(&want))
                    && l.split_whitespace().nth(3) == Some("0A")
            })
        })
    })
}

/// What perftest prints to stderr that is no error: it does not know the
/// device's inline support and turns inline sends off.
const PERFTEST_NOTICE: &str = "Device not recognized to implement inline feature. Disabling it";

/// Runs `name` as a server on `<net>.1` and a client on `<net>.2` with
/// `args` (the client also gets the server's address); asserts both
/// succeed and print to stderr nothing but `notice` lines, and the client
/// prints `done` (perftest's latency tests of reads and atomics report on
/// the client only). Returns the server's output.
fn pair(
    name: &str,
    net: &str,
    port: u16,
    args: &[String],
    done: &str,
    notice: Option<&str>,
) -> String {
    let Some(exe) = program(name) else {
        return String::new();
    };
    let (server_ip, client_ip) = (format!("{net}.1"), format!("{net}.2"));
    let server = command(&exe, Some(&server_ip))
        .args(args)
        .spawn()
        .expect("spawn server");
    let start = Instant::now();
    while !listening(port) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{name} server never listened"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let client = command(&exe, Some(&client_ip))
        .args(args)
        .arg(&server_ip)
        .spawn()
        .expect("spawn client");
    let limit = Duration::from_secs(60);
    let (c_ok, c_out, c_err) = finish(client, "client", limit);
    let (s_ok, s_out, s_err) = finish(server, "server", limit);
    let report = format!("{name} {args:?}\n-- server:\n{s_out}{s_err}\n-- client:\n{c_out}{c_err}");
    assert!(c_ok && s_ok, "a side failed: {report}");
    let quiet = |err: &str| {
        err.lines()
            .all(|l| l.is_empty() || notice == Some(l.trim()))
    };
    assert!(
        quiet(&c_err) && quiet(&s_err),
        "a side printed an error: {report}"
    );
    assert!(c_out.contains(done), "no result reported: {report}");
    s_out
}

/// A ping-pong test (`-g 0 -n 100`, TCP port `port`) with `args`.
fn pingpong(name: &str, net: &str, port: u16, args: &[&str]) {
    if program(name).is_none() {
        return;
    }
    let mut all: Vec<String> = ["-g", "0", "-n", "100", "-p", &port.to_string()]
        .iter()
        .map(ToString::to_string)
        .collect();
    all.extend(args.iter().map(ToString::to_string));
    let server = pair(name, net, port, &all, "100 iters in", None);
    assert!(server.contains("100 iters in"), "{name}: server:\n{server}");
}

/// A perftest test on `irpverbs0` with GID index 0 (`-d irpverbs0 -x 0
/// -F -n 100`, TCP port `port`) with `args`.
fn perftest(name: &str, net: &str, port: u16, args: &[&str]) {
    let mut all: Vec<String> = ["-d", "irpverbs0", "-x", "0", "-F", "-n", "100", "-p"]
        .iter()
        .map(ToString::to_string)
        .collect();
    all.push(port.to_string());
    all.extend(args.iter().map(ToString::to_string));
    pair(name, net, port, &all, "#bytes", Some(PERFTEST_NOTICE));
}

#[test]
fn ibv_devices_lists_irpverbs0() {
    let Some(exe) = program("ibv_devices") else {
        return;
    };
    let out = run_ok(&exe, &[]);
    assert!(
        out.lines().any(|l| l.trim_start().starts_with("irpverbs0")),
        "{out}"
    );
}

#[test]
fn ibv_devinfo_verbose_describes_the_device_and_its_roce_v2_gid() {
    let Some(exe) = program("ibv_devinfo") else {
        return;
    };
    let out = run_ok(&exe, &["-v"]);
    for want in [
        "hca_id:\tirpverbs0",
        "PORT_ACTIVE (4)",
        "link_layer:\t\tEthernet",
        "GID[  0]:\t\t::ffff:127.0.0.1, RoCE v2",
        "max_qp_wr:",
    ] {
        assert!(out.contains(want), "no {want:?} in:\n{out}");
    }
    let out = run_ok(&exe, &["-d", "irpverbs0", "-i", "1"]);
    assert!(out.contains("irpverbs0"), "{out}");
}

#[test]
fn irpverbs_addr_is_the_ports_address_and_a_bad_one_fails_the_open() {
    let Some(exe) = program("ibv_devinfo") else {
        return;
    };
    let child = command(&exe, Some("127.21.20.1"))
        .arg("-v")
        .spawn()
        .expect("spawn");
    let (ok, out, err) = finish(child, "ibv_devinfo", Duration::from_secs(60));
    assert!(ok && err.is_empty(), "{out}\n{err}");
    assert!(
        out.contains("GID[  0]:\t\t::ffff:127.21.20.1, RoCE v2"),
        "{out}"
    );
    let child = command(&exe, Some("not-an-address"))
        .spawn()
        .expect("spawn");
    let (ok, out, err) = finish(child, "ibv_devinfo", Duration::from_secs(60));
    assert!(!ok, "{out}\n{err}");
    assert!(
        err.contains("IRPVERBS_ADDR=not-an-address is not an IPv4 or IPv6 address"),
        "{err}"
    );
}

#[test]
fn ibv_rc_pingpong_between_two_processes() {
    pingpong("ibv_rc_pingpong", "127.21.1", 28611, &[]);
}

#[test]
fn ibv_rc_pingpong_with_completion_events() {
    pingpong("ibv_rc_pingpong", "127.21.2", 28612, &["-e"]);
}

#[test]
fn ibv_uc_pingpong_between_two_processes() {
    pingpong("ibv_uc_pingpong", "127.21.3", 28613, &[]);
}

#[test]
fn ibv_uc_pingpong_with_completion_events() {
    pingpong("ibv_uc_pingpong", "127.21.4", 28614, &["-e"]);
}

#[test]
fn ibv_ud_pingpong_between_two_processes() {
    pingpong("ibv_ud_pingpong", "127.21.5", 28615, &[]);
}

#[test]
fn ibv_ud_pingpong_with_completion_events() {
    pingpong("ibv_ud_pingpong", "127.21.6", 28616, &["-e"]);
}

#[test]
fn ibv_srq_pingpong_between_two_processes() {
    pingpong("ibv_srq_pingpong", "127.21.7", 28617, &[]);
}

#[test]
fn ibv_srq_pingpong_with_completion_events() {
    pingpong("ibv_srq_pingpong", "127.21.8", 28618, &["-e"]);
}

#[test]
fn ib_send_bw_between_two_processes() {
    perftest("ib_send_bw", "127.21.11", 28621, &[]);
}

#[test]
fn ib_send_bw_with_events_srq_and_four_qps() {
    perftest(
        "ib_send_bw",
        "127.21.12",
        28622,
        &["-e", "--use-srq", "-q", "4"],
    );
}

#[test]
fn ib_send_lat_between_two_processes() {
    perftest("ib_send_lat", "127.21.13", 28623, &[]);
}

#[test]
fn ib_write_bw_between_two_processes() {
    perftest("ib_write_bw", "127.21.14", 28624, &[]);
}

#[test]
fn ib_write_lat_between_two_processes() {
    perftest("ib_write_lat", "127.21.15", 28625, &[]);
}

#[test]
fn ib_read_bw_between_two_processes() {
    perftest("ib_read_bw", "127.21.16", 28626, &[]);
}

#[test]
fn ib_read_lat_between_two_processes() {
    perftest("ib_read_lat", "127.21.17", 28627, &[]);
}

#[test]
fn ib_atomic_bw_between_two_processes() {
    perftest("ib_atomic_bw", "127.21.18", 28628, &[]);
}

#[test]
fn ib_atomic_lat_between_two_processes() {
    perftest("ib_atomic_lat", "127.21.19", 28629, &[]);
}
