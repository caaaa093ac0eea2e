//! Debian's unmodified rdma_cm programs (`rdmacm-utils`: `rdma_server` /
//! `rdma_client`, `ucmatose`, `rping`, `udaddy`; perftest's tests with
//! `-R`) over this repository's `librdmacm.so.1` and `libibverbs.so.1`,
//! server and client as two processes, each a host of its own
//! (`IRPVERBS_ADDR`, a UDP wire on its loopback address). A test fails
//! when a program exits non-zero, prints an error to stderr (anything but
//! the lines the program prints on every successful run) or does not
//! finish in time. Without the programs it says it skips, except in CI
//! (`CI=true`).
//!
//! The server listens through the driver's CM, not on a socket: the
//! client starts once the server has the thread the library's
//! `rdma_listen` starts.

#[path = "../../ibverbs/tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::{command, finish, program};

/// True once the process `pid` listens through the library: it has the
/// thread `rdma_listen` starts (named `rdma-cm-listen`).
fn listens(pid: u32) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/task")).is_ok_and(|tasks| {
        tasks.flatten().any(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|c| c.trim() == "rdma-cm-listen")
        })
    })
}

/// Runs `server` on `<net>.1` with `server_args` and `client` on
/// `<net>.2` with `client_args` (which name the server); asserts both
/// succeed, print to stderr nothing but `notices`, and print `done.0`
/// (client) and `done.1` (server). Returns the server's and the client's
/// output.
fn cm_pair(
    (server, client): (&str, &str),
    net: &str,
    server_args: &[&str],
    client_args: &[&str],
    done: (&str, &str),
    notices: &[&str],
) -> Option<(String, String)> {
    let server_exe = program(server)?;
    let client_exe = program(client)?;
    let (server_ip, client_ip) = (format!("{net}.1"), format!("{net}.2"));
    let child = command(&server_exe, Some(&server_ip))
        .args(server_args)
        .spawn()
        .expect("spawn server");
    let limit = Duration::from_secs(60);
    let start = Instant::now();
    while !listens(child.id()) {
        assert!(start.elapsed() < limit, "{server} never listened");
        std::thread::sleep(Duration::from_millis(20));
    }
    let c = command(&client_exe, Some(&client_ip))
        .args(client_args)
        .spawn()
        .expect("spawn client");
    let (c_ok, c_out, c_err) = finish(c, "client", limit);
    let (s_ok, s_out, s_err) = finish(child, "server", limit);
    let report = format!(
        "{server} {server_args:?} / {client} {client_args:?}\n-- server:\n{s_out}{s_err}\n-- client:\n{c_out}{c_err}"
    );
    assert!(c_ok && s_ok, "a side failed: {report}");
    let quiet = |err: &str| {
        err.lines()
            .all(|l| l.trim().is_empty() || notices.contains(&l.trim()))
    };
    assert!(
        quiet(&c_err) && quiet(&s_err),
        "a side printed an error: {report}"
    );
    assert!(
        c_out.contains(done.0),
        "the client did not finish: {report}"
    );
    assert!(
        s_out.contains(done.1),
        "the server did not finish: {report}"
    );
    Some((s_out, c_out))
}

#[test]
fn rdma_server_and_rdma_client() {
    cm_pair(
        ("rdma_server", "rdma_client"),
        "127.22.1",
        &["-s", "127.22.1.1", "-p", "7471"],
        &["-s", "127.22.1.1", "-p", "7471"],
        ("rdma_client: end 0", "rdma_server: end 0"),
        &[],
    );
}

#[test]
fn ucmatose_connects_exchanges_and_disconnects() {
    cm_pair(
        ("ucmatose", "ucmatose"),
        "127.22.2",
        &["-b", "127.22.2.1", "-p", "7472"],
        &["-s", "127.22.2.1", "-p", "7472"],
        ("return status 0", "return status 0"),
        &[],
    );
}

/// rping prints these to stderr on every successful run (its
/// DISCONNECTED event and the server's loop ending on it).
const RPING_NOTICES: [&str; 3] = [
    "server DISCONNECT EVENT...",
    "client DISCONNECT EVENT...",
    "wait for RDMA_READ_ADV state 10",
];

#[test]
fn rping_server_and_client_with_100_verified_pings() {
    let Some((_, client)) = cm_pair(
        ("rping", "rping"),
        "127.22.3",
        &["-s", "-a", "127.22.3.1", "-p", "7473"],
        &["-c", "-a", "127.22.3.1", "-p", "7473", "-C", "100", "-v"],
        ("rdma-ping-99: ", ""),
        &RPING_NOTICES,
    ) else {
        return;
    };
    assert_eq!(
        client
            .lines()
            .filter(|l| l.starts_with("ping data: rdma-ping-"))
            .count(),
        100,
        "{client}"
    );
}

#[test]
fn udaddy_resolves_the_service_and_exchanges_datagrams() {
    // udaddy's port is fixed (7174); -p would be its port space.
    cm_pair(
        ("udaddy", "udaddy"),
        "127.22.4",
        &["-b", "127.22.4.1"],
        &["-s", "127.22.4.1"],
        ("return status 0", "return status 0"),
        &[],
    );
}

/// What perftest prints to stderr that is no error: it does not know the
/// device's inline support and turns inline sends off.
const PERFTEST_NOTICE: &str = "Device not recognized to implement inline feature. Disabling it";

/// A perftest test connected through rdma_cm (`-R`) on `irpverbs0` with
/// GID index 0, 100 iterations, port `port`.
fn perftest_cm(name: &str, net: &str, port: &str) {
    let args = [
        "-d",
        "irpverbs0",
        "-x",
        "0",
        "-F",
        "-n",
        "100",
        "-R",
        "-p",
        port,
    ];
    let server = format!("{net}.1");
    let mut client = args.to_vec();
    client.push(&server);
    cm_pair(
        (name, name),
        net,
        &args,
        &client,
        ("#bytes", ""),
        &[PERFTEST_NOTICE],
    );
}

#[test]
fn ib_send_bw_through_rdma_cm() {
    perftest_cm("ib_send_bw", "127.22.11", "7481");
}

#[test]
fn ib_send_lat_through_rdma_cm() {
    perftest_cm("ib_send_lat", "127.22.12", "7482");
}

#[test]
fn ib_write_bw_through_rdma_cm() {
    perftest_cm("ib_write_bw", "127.22.13", "7483");
}

#[test]
fn ib_write_lat_through_rdma_cm() {
    perftest_cm("ib_write_lat", "127.22.14", "7484");
}

#[test]
fn ib_read_bw_through_rdma_cm() {
    perftest_cm("ib_read_bw", "127.22.15", "7485");
}

#[test]
fn ib_read_lat_through_rdma_cm() {
    perftest_cm("ib_read_lat", "127.22.16", "7486");
}

#[test]
fn ib_atomic_bw_through_rdma_cm() {
    perftest_cm("ib_atomic_bw", "127.22.17", "7487");
}

#[test]
fn ib_atomic_lat_through_rdma_cm() {
    perftest_cm("ib_atomic_lat", "127.22.18", "7488");
}
