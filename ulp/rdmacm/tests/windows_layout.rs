//! The Windows x64 layout of the library's structures against rdma-core's
//! `<rdma/rdma_cma.h>` as MinGW-w64 compiles it
//! (`ulp/ibverbs/tests/common/windows.rs`): `src/os/windows_layout.rs` must
//! assert exactly that layout, and the Windows build
//! (`ulp/ibverbs/link.sh --windows`) checks the assertions.

#[path = "../../ibverbs/tests/common/mod.rs"]
mod common;
// The structures are plain data (see tests/layout.rs).
#[allow(dead_code)]
#[path = "../src/abi.rs"]
mod abi;
#[allow(dead_code, unused_imports)]
#[path = "../src/os/mod.rs"]
mod os;

use common::windows::{assertions, can_check, compare, mingw_layout};

#[test]
fn windows_layout_assertions_match_mingw() {
    if !can_check() {
        return;
    }
    let parts = [("crate::abi", abi::layout())];
    let facts = mingw_layout("rdmacm", "#include <rdma/rdma_cma.h>", &parts[0].1);
    assert!(facts.len() > 100, "only {} layout facts", facts.len());
    compare(
        "src/os/windows_layout.rs",
        &assertions(
            "librdmacm.dll",
            &parts,
            &[
                ("ibv_qp", "ibv_qp_head"),
                ("ibv_pd", "ibv_pd_head"),
                ("addr.ibaddr", "ibaddr"),
            ],
            &facts,
        ),
    );
}
