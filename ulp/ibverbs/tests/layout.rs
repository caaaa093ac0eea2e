//! The ABI structs of `irpverbs_rdma_abi::verbs` (the library's `abi`) against rdma-core's
//! `<infiniband/verbs.h>` (Debian's libibverbs-dev): a C file of
//! `_Static_assert`s on every size and member offset, compiled with the
//! system C compiler. Without the header the test says it skips, except in
//! CI (`CI=true`), where that is a failure.

use std::path::PathBuf;
use std::process::Command;

fn header_present() -> bool {
    let probe = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ibverbs_probe.c");
    std::fs::write(&probe, "#include <infiniband/verbs.h>\n").expect("write probe");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    Command::new(cc)
        .args(["-fsyntax-only"])
        .arg(&probe)
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn abi_structs_match_infiniband_verbs_h() {
    if !header_present() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "<infiniband/verbs.h> is missing (apt-get install libibverbs-dev)"
        );
        eprintln!("skipping: <infiniband/verbs.h> is not installed (libibverbs-dev)");
        return;
    }
    let mut c = String::from(
        "#include <stddef.h>\n#include <infiniband/verbs.h>\n#include <infiniband/sa.h>\n\
         #include <rdma/ib_user_verbs.h>\n#include <rdma/ib_user_sa.h>\n",
    );
    let mut checks = 0;
    for (ty, size, fields) in irpverbs_rdma_abi::layout::verbs()
        .into_iter()
        .chain(irpverbs_ibverbs::kern::layout())
    {
        c += &format!("_Static_assert(sizeof({ty}) == {size}, \"sizeof({ty})\");\n");
        checks += 1;
        for (field, offset) in fields {
            c += &format!(
                "_Static_assert(offsetof({ty}, {field}) == {offset}, \"offsetof({ty}, {field})\");\n"
            );
            checks += 1;
        }
    }
    assert!(checks > 250, "only {checks} layout facts");
    let src = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ibverbs_layout.c");
    std::fs::write(&src, c).expect("write the layout check");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(cc)
        .args(["-std=gnu11", "-fsyntax-only"])
        .arg(&src)
        .output()
        .expect("run the C compiler");
    assert!(
        out.status.success(),
        "the layout differs from <infiniband/verbs.h>:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The check fails when a layout is wrong: a struct with a member moved
/// does not pass it.
#[test]
fn a_wrong_offset_fails_the_check() {
    if !header_present() {
        eprintln!("skipping: <infiniband/verbs.h> is not installed (libibverbs-dev)");
        return;
    }
    let src = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ibverbs_layout_wrong.c");
    std::fs::write(
        &src,
        "#include <stddef.h>\n#include <infiniband/verbs.h>\n\
         _Static_assert(offsetof(struct ibv_wc, byte_len) == 16, \"wrong\");\n",
    )
    .expect("write");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(cc)
        .arg("-fsyntax-only")
        .arg(&src)
        .output()
        .expect("run the C compiler");
    assert!(!out.status.success());
}
