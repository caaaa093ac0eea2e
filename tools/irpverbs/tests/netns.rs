//! Two hosts: network namespaces joined by a veth pair (10.77.N.1/24 and
//! 10.77.N.2/24, fd77:N::1/64 and fd77:N::2/64), `irpverbs perf --server`
//! in one and the client in the other, over the UDP wire; with 1 % loss on
//! the link where netem is available. Each run must complete and report
//! figures on both sides.
//!
//! Needs root and iproute2 (`ip`); where namespaces cannot be made, each
//! test says why and passes without running. The namespaces are removed
//! whatever happens (their veth ends go with them).

use std::io::Read;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_irpverbs");

/// A veth pair between two namespaces, deleted on drop.
struct Hosts {
    ns: [String; 2],
    v4: [String; 2],
    v6: [String; 2],
    /// netem loss is on the link.
    lossy: bool,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Hosts {
    /// Two namespaces and a veth pair; `Err(why)` where that cannot be
    /// done here.
    fn new(loss: bool) -> Result<Self, String> {
        static NEXT: AtomicU32 = AtomicU32::new(1);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let tag = format!("iv{}n{n}", std::process::id() % 100_000);
        let hosts = Self {
            ns: [format!("{tag}a"), format!("{tag}b")],
            v4: [format!("10.77.{n}.1"), format!("10.77.{n}.2")],
            v6: [format!("fd77:{n}::1"), format!("fd77:{n}::2")],
            lossy: false,
        };
        ip(&["netns", "add", &hosts.ns[0]])?;
        // From here on, drop removes what was made.
        let mut hosts = hosts;
        ip(&["netns", "add", &hosts.ns[1]])?;
        let veth = [format!("{tag}x"), format!("{tag}y")];
        ip(&[
            "link", "add", &veth[0], "type", "veth", "peer", "name", &veth[1],
        ])?;
        for (i, dev) in veth.iter().enumerate() {
            let ns = &hosts.ns[i];
            ip(&["link", "set", dev, "netns", ns])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{}/24", hosts.v4[i]),
                "dev",
                dev,
            ])?;
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{}/64", hosts.v6[i]),
                "dev",
                dev,
                "nodad",
            ])?;
        }
        if loss {
            let netem = Command::new("tc")
                .args(["-n", &hosts.ns[0], "qdisc", "add", "dev", &veth[0]])
                .args(["root", "netem", "loss", "1%"])
                .output();
            match netem {
                Ok(o) if o.status.success() => hosts.lossy = true,
                Ok(o) => eprintln!(
                    "note: no netem here ({}): the link runs without loss",
                    String::from_utf8_lossy(&o.stderr).trim()
                ),
                Err(e) => eprintln!("note: no tc here ({e}): the link runs without loss"),
            }
        }
        Ok(hosts)
    }

    /// `irpverbs ARGS` in namespace `i`.
    fn spawn(&self, i: usize, args: &[&str]) -> Child {
        Command::new("ip")
            .args(["netns", "exec", &self.ns[i], BIN])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("ip netns exec")
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for ns in &self.ns {
            let _ = Command::new("ip")
                .args(["netns", "del", ns])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// Waits for `child` (a watchdog of `limit`: a hung run is killed and
/// fails the test; the time is not what is tested).
fn finish(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                break;
            }
        }
    }
    let status = child.wait().expect("wait");
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
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

/// Why namespaces cannot be made here, if they cannot.
fn unavailable() -> Option<String> {
    match Command::new("ip").arg("-V").output() {
        Ok(o) if o.status.success() => None,
        Ok(_) => Some("`ip -V` failed".into()),
        Err(e) => Some(format!("no `ip` (iproute2): {e}")),
    }
}

/// Runs `test` (with `extra` options) between the namespaces, the client
/// given the server's IPv4 or (`v6`) IPv6 address; both must
/// succeed and print a figures row; returns the client's output.
fn run(test: &str, extra: &[&str], v6: bool, loss: bool) -> Option<String> {
    // One pair of hosts at a time: four busy-polling processes are already
    // two per core here.
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(why) = unavailable() {
        eprintln!("skipped: {why}");
        return None;
    }
    let hosts = match Hosts::new(loss) {
        Ok(h) => h,
        Err(why) => {
            eprintln!("skipped: network namespaces cannot be made here: {why}");
            return None;
        }
    };
    let server_ip = if v6 { &hosts.v6[0] } else { &hosts.v4[0] };
    let mut sargs = vec!["perf", test, "--server"];
    sargs.extend_from_slice(extra);
    let server = hosts.spawn(0, &sargs);
    let mut cargs = vec!["perf", test, server_ip.as_str()];
    cargs.extend_from_slice(extra);
    let client = hosts.spawn(1, &cargs);
    let limit = Duration::from_secs(120);
    let c = finish(client, limit);
    let s = finish(server, Duration::from_secs(10));
    let text = |o: &Output| {
        format!(
            "status {}\nstdout:\n{}\nstderr:\n{}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    assert!(
        c.status.success(),
        "client:\n{}\nserver:\n{}",
        text(&c),
        text(&s)
    );
    assert!(s.status.success(), "server:\n{}", text(&s));
    let out = String::from_utf8_lossy(&c.stdout).to_string();
    for o in [&out, &String::from_utf8_lossy(&s.stdout).to_string()] {
        assert!(o.contains(&format!("irpverbs perf {test}")), "{o}");
        assert!(o.contains("remote address"), "{o}");
        // The figures row: the size first, then numbers.
        let row = o
            .lines()
            .skip_while(|l| !l.trim_start().starts_with("#bytes"))
            .nth(1)
            .unwrap_or_default();
        let nums: Vec<f64> = row
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        assert!(nums.len() >= 5 && nums.iter().all(|n| *n >= 0.0), "{o}");
    }
    // A 1500-byte veth: RoCE's 1024-byte MTU.
    assert!(out.contains("| mtu 1024 |"), "{out}");
    if hosts.lossy {
        eprintln!("ran with 1 % loss on the link");
    }
    Some(out)
}

#[test]
fn send_latency_between_two_namespaces_with_loss() {
    run("send_lat", &["-s", "8", "-n", "300"], false, true);
}

#[test]
fn write_bandwidth_between_two_namespaces_over_ipv6() {
    run("write_bw", &["-s", "65536", "-n", "300"], true, false);
}

#[test]
fn read_and_atomic_latency_between_two_namespaces() {
    run("read_lat", &["-s", "4096", "-n", "200"], false, false);
    run("atomic_lat", &["-n", "200"], false, false);
}

/// The QPs connected through the CM by address (`--cm`, perftest's `-R`):
/// the server listens on its address, the client resolves and connects;
/// QPN, PSN, GID and the buffer's rkey and address travel in the CM's
/// messages.
#[test]
fn write_bandwidth_and_send_latency_through_the_cm_between_two_namespaces() {
    run(
        "write_bw",
        &["-s", "65536", "-n", "300", "--cm"],
        false,
        false,
    );
    run("send_lat", &["-s", "8", "-n", "300", "-R"], true, false);
}
