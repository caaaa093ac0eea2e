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
//! `rdma_listen` starts (perftest's second: it listens once to check the
//! port, then again).

#[path = "../../ibverbs/tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::{command, finish, program};

/// The thread IDs of the process `pid`'s listeners (the threads the
/// library's `rdma_listen` starts, named `rdma-cm-listen`).
fn listeners(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task")).map_or_else(
        |_| Vec::new(),
        |tasks| {
            tasks
                .flatten()
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.trim() == "rdma-cm-listen")
                })
                .map(|t| t.file_name().to_string_lossy().into_owned())
                .collect()
        },
    )
}

/// Waits until the process `pid` listens: until its `nth` listener
/// thread is up (perftest listens once to check the port, closes that
/// listener, and listens again: its second), or one has been up for 2 s
/// (a listener too short-lived to be seen), or it exited (its output
/// then tells why).
fn wait_listening(child: &mut std::process::Child, what: &str, nth: usize) {
    let pid = child.id();
    let start = Instant::now();
    let mut distinct: Vec<String> = Vec::new();
    let mut since = Instant::now();
    loop {
        match listeners(pid).first() {
            Some(t) if !distinct.contains(t) => {
                distinct.push(t.clone());
                since = Instant::now();
                if distinct.len() >= nth {
                    return;
                }
            }
            Some(_) if since.elapsed() >= Duration::from_secs(2) => return,
            Some(_) => {}
            None => since = Instant::now(),
        }
        if child.try_wait().is_ok_and(|s| s.is_some()) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{what} never listened"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Runs `server` on `<net>.1` with `server_args` and `client` on
/// `<net>.2` with `client_args` (which name the server); asserts both
/// succeed, print to stderr nothing but `notices`, and print `done.0`
/// (client) and `done.1` (server). The client starts when the server's
/// `listens`-th listener is up ([`wait_listening`]). Returns the server's and the client's
/// output.
fn cm_pair(
    names: (&str, &str),
    net: &str,
    server_args: &[&str],
    client_args: &[&str],
    done: (&str, &str),
    notices: &[&str],
    listens: usize,
) -> Option<(String, String)> {
    cm_pair_retried(
        names,
        net,
        (server_args, client_args),
        done,
        notices,
        listens,
        None,
    )
}

/// [`cm_pair`], run again (at most twice more) while the client failed
/// printing `retry_on`.
fn cm_pair_retried(
    (server, client): (&str, &str),
    net: &str,
    (server_args, client_args): (&[&str], &[&str]),
    done: (&str, &str),
    notices: &[&str],
    listens: usize,
    retry_on: Option<&str>,
) -> Option<(String, String)> {
    let server_exe = program(server)?;
    let client_exe = program(client)?;
    let (server_ip, client_ip) = (format!("{net}.1"), format!("{net}.2"));
    let limit = Duration::from_secs(60);
    let mut runs = 0;
    let (c_ok, c_out, c_err, s_ok, s_out, s_err) = loop {
        runs += 1;
        let mut child = command(&server_exe, Some(&server_ip))
            .args(server_args)
            .spawn()
            .expect("spawn server");
        wait_listening(&mut child, server, listens);
        let c = command(&client_exe, Some(&client_ip))
            .args(client_args)
            .spawn()
            .expect("spawn client");
        let (c_ok, c_out, c_err) = finish(c, "client", limit);
        // A client that failed leaves its server waiting: not for long.
        let server_limit = if c_ok { limit } else { Duration::from_secs(5) };
        let (s_ok, s_out, s_err) = finish(child, "server", server_limit);
        let again = retry_on.is_some_and(|r| !c_ok && (c_out.contains(r) || c_err.contains(r)));
        if !again || runs == 3 {
            break (c_ok, c_out, c_err, s_ok, s_out, s_err);
        }
    };
    let report = format!(
        "{server} {server_args:?} / {client} {client_args:?} (run {runs})\n-- server:\n{s_out}{s_err}\n-- client:\n{c_out}{c_err}"
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
        1,
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
        1,
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
        1,
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
        1,
    );
}

/// What perftest prints to stderr that is no error: it does not know the
/// device's inline support and turns inline sends off.
const PERFTEST_NOTICE: &str = "Device not recognized to implement inline feature. Disabling it";

/// A perftest test connected through rdma_cm (`-R`) on `irpverbs0` with
/// GID index 0, 100 iterations, port `port`.
///
/// perftest's client connects its test QP as soon as the server's
/// handshake reaches it, while the server is still making the listener
/// for it: if the REQ comes first it is rejected (no listener, reason 8)
/// and perftest's own retry of the connect then fails (it does not reset
/// its connection index). Two processes sharing two cores with other work
/// can lose that race: such a run (the client reports that REJECTED) is
/// run again, at most twice.
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
    cm_pair_retried(
        (name, name),
        net,
        (&args, &client),
        ("#bytes", ""),
        &[PERFTEST_NOTICE],
        2,
        Some("Event: RDMA_CM_EVENT_REJECTED; error: 8."),
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
