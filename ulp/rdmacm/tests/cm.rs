//! The library from C: `tests/c/cm.c` and `tests/c/own_qp.c`, built
//! against rdma-core's
//! `<rdma/rdma_cma.h>` and linked with `librdmacm.so.1` and
//! `libibverbs.so.1`, in one process (rdma-core's errno for bad arguments
//! and calls out of sequence, a connection's events in order with private
//! data and the peer's address, a reject, a connect with no listener, a
//! disconnect); and the library's symbol versions against
//! `librdmacm.map`, what Debian's programs import from it, and its
//! `DT_NEEDED` on this repository's `libibverbs.so.1`.

#[path = "../../ibverbs/tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn header_present() -> bool {
    let present = Path::new("/usr/include/rdma/rdma_cma.h").exists();
    if !present {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "<rdma/rdma_cma.h> is missing (apt-get install librdmacm-dev)"
        );
        eprintln!("skipping: <rdma/rdma_cma.h> is not installed (librdmacm-dev)");
    }
    present
}

#[test]
fn rdma_cm_from_c_keeps_rdma_core_semantics() {
    run_c("cm");
}

/// `tests/c/own_qp.c`: QPs the program creates with `ibv_create_qp` and
/// moves with `rdma_init_qp_attr` and `ibv_modify_qp`, connected by ids
/// without a QP (`rdma_establish` on the active side), data both ways, a
/// disconnect, and the errno of both calls out of sequence.
#[test]
fn rdma_cm_connects_qps_the_program_moves() {
    run_c("own_qp");
}

/// Builds `tests/c/<name>.c` against rdma-core's header and this
/// repository's libraries, runs it, and checks its summary.
fn run_c(name: &str) {
    if !header_present() {
        return;
    }
    let lib = common::lib_dir();
    let exe = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("rdmacm_{name}_c"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-std=gnu11", "-Wall", "-Wextra", "-Werror", "-O1", "-o"])
        .arg(&exe)
        .arg(common::repo().join(format!("ulp/rdmacm/tests/c/{name}.c")))
        .arg(lib.join("librdmacm.so.1"))
        .arg(lib.join("libibverbs.so.1"))
        .status()
        .expect("run the C compiler");
    assert!(status.success(), "{cc} failed to build {name}.c");
    let out = Command::new(&exe)
        .env("LD_LIBRARY_PATH", &lib)
        .env_remove("IRPVERBS_ADDR")
        .output()
        .expect("run the C program");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{name}.c failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains(" passed, 0 failed"), "no summary: {stdout}");
}

#[test]
fn every_symbol_has_rdma_cores_version_and_libibverbs_is_needed() {
    if !common::have("objdump", "binutils") {
        return;
    }
    let so = common::lib_dir().join("librdmacm.so.1");
    let exported = common::dynamic_symbols(&so, false, "RDMACM");
    let map = std::fs::read_to_string(common::repo().join("ulp/rdmacm/librdmacm.map"))
        .expect("read librdmacm.map");
    let mut node = String::new();
    let mut named = 0;
    for line in map.lines().map(str::trim) {
        if let Some(n) = line.strip_suffix(" {") {
            node = n.to_owned();
        } else if let Some(sym) = line.strip_suffix(';') {
            if !sym.contains(':') && !sym.starts_with('}') && sym != "*" {
                named += 1;
                assert!(
                    exported.contains(&(sym.to_owned(), node.clone())),
                    "{sym} is not exported as {sym}@{node}"
                );
            }
        }
    }
    assert!(named > 25, "only {named} symbols in the map");
    assert_eq!(exported.len(), named, "{exported:?}");
    // It calls libibverbs' functions through the libibverbs.so.1 built
    // beside it, with their versions.
    let d = Command::new("objdump")
        .arg("-p")
        .arg(&so)
        .output()
        .expect("run objdump");
    let dynamic = String::from_utf8_lossy(&d.stdout);
    assert!(
        dynamic
            .lines()
            .any(|l| l.contains("NEEDED") && l.contains("libibverbs.so.1")),
        "{dynamic}"
    );
    let calls = common::dynamic_symbols(&so, true, "VERBS");
    assert!(
        calls.contains(&("ibv_create_qp".into(), "IBVERBS_1.1".into()))
            && calls.contains(&("irpverbs_ioctl".into(), "IRPVERBS_PRIVATE_1".into())),
        "{calls:?}"
    );
    // What Debian's programs import from librdmacm, when installed.
    for program in [
        "rping",
        "ucmatose",
        "udaddy",
        "rdma_server",
        "rdma_client",
        "ib_send_bw",
        "ib_send_lat",
        "ib_write_bw",
        "ib_write_lat",
        "ib_read_bw",
        "ib_read_lat",
        "ib_atomic_bw",
        "ib_atomic_lat",
    ] {
        let path = Path::new("/usr/bin").join(program);
        if !path.exists() {
            continue;
        }
        for import in common::dynamic_symbols(&path, true, "RDMACM") {
            assert!(exported.contains(&import), "{program} needs {import:?}");
        }
    }
}
