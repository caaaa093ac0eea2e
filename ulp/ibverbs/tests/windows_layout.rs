//! The Windows x64 layout of the libraries' structures against rdma-core's
//! headers as MinGW-w64 compiles them (tests/common/windows.rs):
//! `irpverbs-rdma-abi`'s `src/windows_layout.rs` (the structures of
//! `<infiniband/verbs.h>` and `<rdma/rdma_cma.h>`) and this library's
//! `src/os/windows_layout.rs` (the kernel and SA structures of `kern`) must
//! assert exactly that layout; building for `x86_64-pc-windows-gnu`
//! (`link.sh --windows`) checks the assertions.

mod common;

use common::windows::{assertions, can_check, compare, mingw_layout};

#[test]
fn rdma_abi_windows_layout_matches_mingw() {
    if !can_check() {
        return;
    }
    let parts = [
        ("crate::verbs", irpverbs_rdma_abi::layout::verbs()),
        ("crate::cma", irpverbs_rdma_abi::layout::cma()),
    ];
    let all: Vec<_> = parts.iter().flat_map(|(_, l)| l.iter().cloned()).collect();
    let facts = mingw_layout(
        "rdma_abi",
        "#include <infiniband/verbs.h>\n#include <infiniband/sa.h>\n#include <rdma/rdma_cma.h>",
        &all,
    );
    assert!(facts.len() > 300, "only {} layout facts", facts.len());
    compare(
        "../rdma-abi/src/windows_layout.rs",
        &assertions(
            "irpverbs-rdma-abi",
            &parts,
            &[("addr.ibaddr", "ibaddr")],
            &facts,
        ),
    );
}

#[test]
fn kern_windows_layout_matches_mingw() {
    if !can_check() {
        return;
    }
    let parts = [("crate::kern", irpverbs_ibverbs::kern::layout())];
    let facts = mingw_layout(
        "kern",
        "#include <infiniband/sa.h>\n#include <rdma/ib_user_verbs.h>\n#include <rdma/ib_user_sa.h>",
        &parts[0].1,
    );
    assert!(facts.len() > 40, "only {} layout facts", facts.len());
    compare(
        "src/os/windows_layout.rs",
        &assertions("libibverbs.dll", &parts, &[], &facts),
    );
}
