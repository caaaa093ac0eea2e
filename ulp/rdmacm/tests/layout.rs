//! The ABI structs of the library (`irpverbs_rdma_abi::cma`) against
//! rdma-core's `<rdma/rdma_cma.h>` (Debian's librdmacm-dev; the verbs
//! structures it embeds are checked by `ulp/ibverbs/tests/layout.rs`): a C file of `_Static_assert`s on every size and member
//! offset, compiled with the system C compiler. Without the header the
//! test says it skips, except in CI (`CI=true`), where that is a failure.

mod abi {
    pub use irpverbs_rdma_abi::cma::*;
    pub use irpverbs_rdma_abi::verbs::*;
}

use std::path::PathBuf;
use std::process::Command;

fn compiles(name: &str, source: &str) -> (bool, String) {
    let src = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::write(&src, source).expect("write the C file");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(cc)
        .args(["-std=gnu11", "-fsyntax-only"])
        .arg(&src)
        .output()
        .expect("run the C compiler");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn header_present() -> bool {
    let (ok, _) = compiles("rdmacm_probe.c", "#include <rdma/rdma_cma.h>\n");
    if !ok {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "<rdma/rdma_cma.h> is missing (apt-get install librdmacm-dev)"
        );
        eprintln!("skipping: <rdma/rdma_cma.h> is not installed (librdmacm-dev)");
    }
    ok
}

const HEADERS: &str = "#include <stddef.h>\n#include <rdma/rdma_cma.h>\n";

#[test]
fn abi_structs_match_rdma_cma_h() {
    if !header_present() {
        return;
    }
    let mut c = String::from(HEADERS);
    let mut checks = 0;
    for (ty, size, fields) in irpverbs_rdma_abi::layout::cma() {
        c += &format!("_Static_assert(sizeof({ty}) == {size}, \"sizeof({ty})\");\n");
        checks += 1;
        for (field, offset) in fields {
            c += &format!(
                "_Static_assert(offsetof({ty}, {field}) == {offset}, \"offsetof({ty}, {field})\");\n"
            );
            checks += 1;
        }
    }
    assert!(checks > 60, "only {checks} layout facts");
    let (ok, err) = compiles("rdmacm_layout.c", &c);
    assert!(ok, "the layout differs from <rdma/rdma_cma.h>:\n{err}");
    // The constants programs pass by value.
    let consts = [
        (
            "RDMA_CM_EVENT_ESTABLISHED",
            i64::from(abi::RDMA_CM_EVENT_ESTABLISHED),
        ),
        (
            "RDMA_CM_EVENT_DISCONNECTED",
            i64::from(abi::RDMA_CM_EVENT_DISCONNECTED),
        ),
        (
            "RDMA_CM_EVENT_TIMEWAIT_EXIT",
            i64::from(abi::RDMA_CM_EVENT_TIMEWAIT_EXIT),
        ),
        ("RDMA_PS_TCP", i64::from(abi::RDMA_PS_TCP)),
        ("RDMA_PS_UDP", i64::from(abi::RDMA_PS_UDP)),
        ("RDMA_PS_IB", i64::from(abi::RDMA_PS_IB)),
        ("RDMA_UDP_QKEY", i64::from(abi::RDMA_UDP_QKEY)),
        ("RAI_PASSIVE", i64::from(abi::RAI_PASSIVE)),
        (
            "RDMA_OPTION_ID_ACK_TIMEOUT",
            i64::from(abi::RDMA_OPTION_ID_ACK_TIMEOUT),
        ),
        ("IBV_QPT_UD", i64::from(abi::IBV_QPT_UD)),
        ("IBV_QP_SQ_PSN", i64::from(abi::IBV_QP_SQ_PSN)),
    ];
    let mut c = String::from(HEADERS);
    for (name, value) in consts {
        c += &format!("_Static_assert({name} == {value}, \"{name}\");\n");
    }
    let (ok, err) = compiles("rdmacm_consts.c", &c);
    assert!(ok, "a constant differs from <rdma/rdma_cma.h>:\n{err}");
}

/// The check fails when a layout is wrong.
#[test]
fn a_wrong_offset_fails_the_check() {
    if !header_present() {
        return;
    }
    let (ok, _) = compiles(
        "rdmacm_layout_wrong.c",
        &format!(
            "{HEADERS}_Static_assert(offsetof(struct rdma_cm_id, qp_type) == {}, \"wrong\");\n",
            std::mem::offset_of!(abi::rdma_cm_id, pd)
        ),
    );
    assert!(!ok);
}
