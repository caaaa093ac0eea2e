//! The Windows x64 layout of the library's structures against rdma-core's
//! `<infiniband/verbs.h>` as MinGW-w64 compiles it (tests/common/windows.rs):
//! `src/os/windows_layout.rs` must assert exactly that layout, and the
//! Windows build (`link.sh --windows`) checks the assertions.

mod common;

use common::windows::{assertions, can_check, compare, mingw_layout};

#[test]
fn windows_layout_assertions_match_mingw() {
    if !can_check() {
        return;
    }
    let parts = [
        ("crate::abi", irpverbs_ibverbs::abi::layout()),
        ("crate::kern", irpverbs_ibverbs::kern::layout()),
    ];
    let all: Vec<_> = parts.iter().flat_map(|(_, l)| l.iter().cloned()).collect();
    let facts = mingw_layout(
        "ibverbs",
        "#include <infiniband/verbs.h>\n#include <infiniband/sa.h>\n\
         #include <rdma/ib_user_verbs.h>\n#include <rdma/ib_user_sa.h>",
        &all,
    );
    assert!(facts.len() > 250, "only {} layout facts", facts.len());
    compare(
        "src/os/windows_layout.rs",
        &assertions("libibverbs.dll", &parts, &[], &facts),
    );
}
