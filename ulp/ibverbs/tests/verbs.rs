//! The library from C: `tests/c/verbs.c`, built against rdma-core's
//! `<infiniband/verbs.h>` and linked with `libibverbs.so.1`, in one process
//! (rdma-core's errno for bad input and busy objects, the extended verbs'
//! fallbacks, the GID type, a send between two RC QPs reported through a
//! non-blocking, polled completion channel); and the library's symbol
//! versions against `libibverbs.map` and what Debian's programs import.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn header_present() -> bool {
    let present = Path::new("/usr/include/infiniband/verbs.h").exists();
    if !present {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "<infiniband/verbs.h> is missing (apt-get install libibverbs-dev)"
        );
        eprintln!("skipping: <infiniband/verbs.h> is not installed (libibverbs-dev)");
    }
    present
}

#[test]
fn verbs_from_c_keep_rdma_core_semantics() {
    if !header_present() {
        return;
    }
    let lib = common::lib_dir();
    let exe = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ibverbs_verbs_c");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-std=gnu11", "-Wall", "-Wextra", "-Werror", "-O1", "-o"])
        .arg(&exe)
        .arg(common::repo().join("ulp/ibverbs/tests/c/verbs.c"))
        .arg(lib.join("libibverbs.so.1"))
        .status()
        .expect("run the C compiler");
    assert!(status.success(), "{cc} failed to build verbs.c");
    let out = Command::new(&exe)
        .env("LD_LIBRARY_PATH", &lib)
        .env_remove("IRPVERBS_ADDR")
        .output()
        .expect("run verbs.c");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "verbs.c failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains(" passed, 0 failed"), "no summary: {stdout}");
}

#[test]
fn every_symbol_has_rdma_cores_version() {
    if !common::have("objdump", "binutils") {
        return;
    }
    let exported =
        common::dynamic_symbols(&common::lib_dir().join("libibverbs.so.1"), false, "VERBS");
    // Every symbol the version script names, under its node.
    let map = std::fs::read_to_string(common::repo().join("ulp/ibverbs/libibverbs.map"))
        .expect("read libibverbs.map");
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
    assert!(named > 60, "only {named} symbols in the map");
    // Nothing else leaks out under a version (the Win32 subset stays local).
    assert_eq!(exported.len(), named, "{exported:?}");
    // What Debian's programs bind to, when they are installed: from
    // libibverbs, and (perftest) from the stand-ins for libmlx5 and libefa.
    let dir = common::lib_dir();
    let mut provided = exported;
    for standin in ["libmlx5.so.1", "libefa.so.1"] {
        provided.extend(common::dynamic_symbols(&dir.join(standin), false, "_"));
    }
    for program in [
        "ibv_devices",
        "ibv_devinfo",
        "ibv_rc_pingpong",
        "ibv_uc_pingpong",
        "ibv_ud_pingpong",
        "ibv_srq_pingpong",
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
        for node in ["IBVERBS", "MLX5_", "EFA_"] {
            for import in common::dynamic_symbols(&path, true, node) {
                assert!(provided.contains(&import), "{program} needs {import:?}");
            }
        }
    }
}
