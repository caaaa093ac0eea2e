//! The `irpverbs` tool, run as a user runs it.

use std::process::Command;

fn run(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_irpverbs"))
        .args(args)
        .output()
        .expect("run irpverbs");
    assert!(
        out.status.success(),
        "irpverbs {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn devinfo_prints_the_device_and_port_like_ibv_devinfo() {
    let s = run(&["devinfo"]);
    assert!(s.starts_with("hca_id:\tirpverbs0\n"), "{s}");
    for want in [
        "phys_port_cnt:\t\t\t1",
        "port:\t1",
        "state:\t\t\tPORT_ACTIVE (4)",
        "link_layer:\t\tEthernet",
        "active_mtu:\t\t1024 (3)",
    ] {
        assert!(s.contains(want), "missing {want:?} in\n{s}");
    }
    assert!(!s.contains("max_qp:"), "limits shown without -v");
    let v = run(&["devinfo", "-v", "--engine", "thread"]);
    for want in [
        "max_qp:",
        "max_cqe:",
        "\tmax_mw:\t\t\t\t65536\n",
        "\tmax_fast_reg_page_list_len:\t32\n",
        "gid_tbl_len:\t\t16",
        "GID[  0]:\t\t::ffff:127.0.0.1, RoCE v2",
    ] {
        assert!(v.contains(want), "missing {want:?} in\n{v}");
    }
}

/// devinfo reports the completion vectors the soft HCA has: by default one
/// per processor (at least 2), or as many as `--comp-vectors` asks; a count
/// the HCA cannot have is refused.
#[test]
fn devinfo_reports_the_completion_vectors() {
    let v = run(&["devinfo", "-v", "--comp-vectors", "5"]);
    assert!(v.contains("\tnum_comp_vectors:\t\t5\n"), "{v}");
    let processors = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    let want = irpverbs_soft::default_comp_vectors(processors);
    let d = run(&["devinfo", "-v"]);
    assert!(
        d.contains(&format!("\tnum_comp_vectors:\t\t{want}\n")),
        "{d}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_irpverbs"))
        .args(["devinfo", "--comp-vectors", "1"])
        .output()
        .expect("run irpverbs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("STATUS_INVALID_PARAMETER"), "{err}");
}

/// `irpverbs port down|up`: the link taken down raises PORT_ERR and the
/// port reads down; brought up again, PORT_ACTIVE and an active port.
#[test]
fn port_down_and_up_report_the_events_and_the_state() {
    let d = run(&["port", "down"]);
    for want in [
        "port 1 link down: changed; async event PORT_ERR (10) on port 1",
        "PORT_DOWN (1)",
        "DISABLED (3)",
    ] {
        assert!(d.contains(want), "missing {want:?} in\n{d}");
    }
    let u = run(&["port", "up", "--engine", "thread"]);
    for want in [
        "async event PORT_ERR (10)",
        "port 1 link up: changed; async event PORT_ACTIVE (9) on port 1",
        "PORT_ACTIVE (4)",
        "LINK_UP (5)",
    ] {
        assert!(u.contains(want), "missing {want:?} in\n{u}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_irpverbs"))
        .args(["port", "sideways"])
        .output()
        .expect("run irpverbs");
    assert!(!out.status.success(), "an unknown action is refused");
}

#[test]
fn demo_runs_the_control_path_and_unloads_clean() {
    let s = run(&["demo", "--pairs", "3"]);
    for want in [
        "6 RC QPs connected in pairs, 6 in RTS",
        "RTS->RTR refused: STATUS_INVALID_DEVICE_STATE",
        "dealloc_pd with dependents: STATUS_DEVICE_BUSY",
        "every byte checked",
        "(live 0), verifier clean",
        "connection manager: 256 RC connections",
        "all established, verifier clean",
    ] {
        assert!(s.contains(want), "missing {want:?} in\n{s}");
    }
}

#[test]
fn perf_runs_perftest_style_tests() {
    let s = run(&["perf", "send_lat", "-n", "200", "-s", "64"]);
    assert!(
        s.contains("t_typical[usec]") && s.contains("99.9% percentile"),
        "{s}"
    );
    assert!(
        s.lines().last().unwrap().trim_start().starts_with("64 "),
        "{s}"
    );
    let s = run(&[
        "perf", "write_bw", "-n", "500", "-s", "4096", "-q", "2", "--engine", "thread",
    ]);
    assert!(s.contains("MsgRate[Mpps]") && s.contains("qps 2"), "{s}");
    // perftest's -e through a completion channel.
    let s = run(&["perf", "read_lat", "-n", "100", "-s", "64", "--use-channel"]);
    assert!(
        s.contains("events (completion channel)") && s.contains("t_typical[usec]"),
        "{s}"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_irpverbs"))
        .args(["perf", "nosuch_bw"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown test"));
}
