//! Debian's unmodified rdma-core programs (`ibverbs-utils`) over this
//! library: `ibv_devices`, `ibv_devinfo -v`, and the ping-pong tests as a
//! server and a client process, each process a host of its own
//! (`IRPVERBS_ADDR`, a UDP wire on a loopback address). A test fails when a
//! program exits non-zero, prints to stderr or does not finish in time.
//! Without the programs it says it skips, except in CI (`CI=true`).
//!

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The program's path, or None (the test skips) when `ibverbs-utils` is
/// not installed; in CI its absence is a failure.
fn program(name: &str) -> Option<PathBuf> {
    let path = PathBuf::from("/usr/bin").join(name);
    if path.exists() {
        return Some(path);
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{name} is missing (apt-get install ibverbs-utils)"
    );
    eprintln!("skipping: {name} is not installed (ibverbs-utils)");
    None
}

fn command(exe: &Path, addr: Option<&str>) -> Command {
    let mut cmd = Command::new(exe);
    cmd.env("LD_LIBRARY_PATH", common::lib_dir())
        .env_remove("IRPVERBS_ENGINE")
        .env_remove("IRPVERBS_BACKEND")
        .env_remove("IRPVERBS_DOORBELLS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    match addr {
        Some(a) => cmd.env("IRPVERBS_ADDR", a),
        None => cmd.env_remove("IRPVERBS_ADDR"),
    };
    cmd
}

/// Waits for `child` at most `limit` (killing it then): (success, stdout,
/// stderr).
fn finish(mut child: Child, what: &str, limit: Duration) -> (bool, String, String) {
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    let mut err = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    if status.is_none() {
        err += &format!("\n{what}: no exit within {limit:?} (killed)");
    }
    (status.is_some_and(|s| s.success()), out, err)
}

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

/// Runs `name` as a server on `<net>.1` and a client on `<net>.2` (TCP
/// port `port` for their exchange) with `args`; asserts both succeed,
/// print nothing to stderr and report their iterations.
fn pingpong(name: &str, net: &str, port: u16, args: &[&str]) {
    let Some(exe) = program(name) else {
        return;
    };
    let (server_ip, client_ip) = (format!("{net}.1"), format!("{net}.2"));
    let port_s = port.to_string();
    let mut common: Vec<&str> = vec!["-g", "0", "-n", "100", "-p", &port_s];
    common.extend_from_slice(args);
    let server = command(&exe, Some(&server_ip))
        .args(&common)
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
        .args(&common)
        .arg(&server_ip)
        .spawn()
        .expect("spawn client");
    let limit = Duration::from_secs(60);
    let (c_ok, c_out, c_err) = finish(client, "client", limit);
    let (s_ok, s_out, s_err) = finish(server, "server", limit);
    let report = format!("{name} {args:?}\n-- server:\n{s_out}{s_err}\n-- client:\n{c_out}{c_err}");
    assert!(c_ok && s_ok, "a side failed: {report}");
    assert!(
        c_err.is_empty() && s_err.is_empty(),
        "a side printed an error: {report}"
    );
    assert!(
        c_out.contains("100 iters in") && s_out.contains("100 iters in"),
        "no iterations reported: {report}"
    );
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
