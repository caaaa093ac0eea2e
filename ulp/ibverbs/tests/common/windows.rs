//! The Windows x64 layout of the libraries' C structures: rdma-core's
//! headers as MinGW-w64 lays them out (`long` is 32-bit, `pthread_mutex_t`
//! and `pthread_cond_t` are winpthreads' pointer-sized words), read from an
//! object file MinGW compiles (nothing runs Windows code here), written as
//! `const` assertions into the library's `src/os/windows_layout.rs`, which
//! the library compiles for `x86_64-pc-windows-gnu` (`link.sh --windows`,
//! `.ci/run`). So the Rust structures of the Windows build equal the C
//! header's, member by member, without running either.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A C type's layout: (the type, its size, [(member, offset)]).
pub type Layout = (&'static str, usize, Vec<(&'static str, usize)>);

const MINGW_CC: &str = "x86_64-w64-mingw32-gcc";
const MINGW_OBJCOPY: &str = "x86_64-w64-mingw32-objcopy";

/// Whether MinGW-w64 and rdma-core's headers are here; without them the
/// check skips, except in CI (`CI=true`), where that is a failure.
pub fn can_check() -> bool {
    let have = Command::new(MINGW_CC)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
        && Path::new("/usr/include/infiniband/verbs.h").exists()
        && Path::new("/usr/include/rdma/rdma_cma.h").exists();
    if !have {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "MinGW-w64 (gcc-mingw-w64-x86-64) or rdma-core's headers (libibverbs-dev, \
             librdmacm-dev) are missing"
        );
        eprintln!("skipping: no MinGW-w64 or no rdma-core headers");
    }
    have
}

/// The sizes and offsets of `layouts`' types and members as MinGW-w64
/// lays them out for Windows x64, with `includes` (C `#include` lines)
/// resolved against rdma-core's headers and `include/mingw`.
pub fn mingw_layout(name: &str, includes: &str, layouts: &[Layout]) -> Vec<u64> {
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("windows_layout_{name}"));
    let headers = tmp.join("rdma-core");
    std::fs::create_dir_all(&headers).expect("temporary directory");
    // rdma-core's headers alone: the rest of /usr/include is glibc's.
    for dir in ["infiniband", "rdma"] {
        let status = Command::new("cp")
            .arg("-r")
            .arg(Path::new("/usr/include").join(dir))
            .arg(&headers)
            .status()
            .expect("cp");
        assert!(status.success(), "copy /usr/include/{dir}");
    }
    let mut c = format!("#include <stddef.h>\n{includes}\nconst unsigned long long facts[] = {{\n");
    for (ty, _, fields) in layouts {
        c += &format!("    sizeof({ty}),\n");
        for (field, _) in fields {
            c += &format!("    offsetof({ty}, {field}),\n");
        }
    }
    c += "};\n";
    let src = tmp.join("layout.c");
    let obj = tmp.join("layout.o");
    let data = tmp.join("layout.bin");
    std::fs::write(&src, c).expect("write the C file");
    let repo = super::repo();
    let out = Command::new(MINGW_CC)
        .args(["-std=gnu11", "-O0", "-c", "-I"])
        .arg(repo.join("include/mingw"))
        .arg("-I")
        .arg(&headers)
        .arg("-o")
        .arg(&obj)
        .arg(&src)
        .output()
        .expect("run MinGW");
    assert!(
        out.status.success(),
        "MinGW cannot compile the layout file:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(MINGW_OBJCOPY)
        .args(["-O", "binary", "--only-section=.rdata"])
        .arg(&obj)
        .arg(&data)
        .output()
        .expect("run objcopy");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bytes = std::fs::read(&data).expect("read the data");
    let want: usize = layouts.iter().map(|(_, _, f)| 1 + f.len()).sum();
    // The table, then at most the section's alignment padding.
    assert!(
        bytes.len() >= want * 8
            && bytes.len() - want * 8 < 32
            && bytes[want * 8..].iter().all(|&b| b == 0),
        "the object's data is not the table alone ({} bytes for {want} facts)",
        bytes.len()
    );
    bytes[..want * 8]
        .chunks_exact(8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .collect()
}

/// The Rust source asserting `facts` of `parts` (each a module path and
/// its layouts). `renames` names the Rust type or member of a C type or
/// member designator whose name differs (a structure's head, a member in
/// an anonymous union); a size the layout gives as 0 is not
/// checked (it is only a head's).
pub fn assertions(
    library: &str,
    parts: &[(&str, Vec<Layout>)],
    renames: &[(&str, &str)],
    facts: &[u64],
) -> String {
    let mut s = format!(
        "//! The Windows x64 layout of {library}'s C structures: rdma-core's headers\n\
         //! as MinGW-w64 lays them out, asserted on the Rust structures when the\n\
         //! library is built for `x86_64-pc-windows-gnu`. Generated by\n\
         //! `ulp/ibverbs/tests/common/windows.rs` (`IRPVERBS_BLESS=1 cargo test\n\
         //! --test windows_layout` in the library's directory writes it anew).\n\
         \n\
         use core::mem::{{offset_of, size_of}};\n"
    );
    let mut next = facts.iter();
    for (module, layouts) in parts {
        for (ty, checked_size, fields) in layouts {
            let c = ty
                .trim_start_matches("struct ")
                .trim_start_matches("union ");
            let rust = renames
                .iter()
                .find(|(from, _)| *from == c)
                .map_or(c, |(_, to)| to);
            let size = next.next().expect("a fact per size");
            if *checked_size != 0 {
                s += &format!("const _: () = assert!(size_of::<{module}::{rust}>() == {size});\n");
            }
            for (c_field, _) in fields {
                let field = renames
                    .iter()
                    .find(|(from, _)| from == c_field)
                    .map_or(*c_field, |(_, to)| to);
                let off = next.next().expect("a fact per member");
                s += &format!(
                    "const _: () = assert!(offset_of!({module}::{rust}, {field}) == {off});\n"
                );
            }
        }
    }
    s
}

/// Compares `text` with the library's `generated` file (relative to the
/// library's directory), writing it when `IRPVERBS_BLESS=1`.
pub fn compare(generated: &str, text: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(generated);
    if std::env::var("IRPVERBS_BLESS").as_deref() == Ok("1") {
        std::fs::write(&path, text).expect("write the assertions");
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == text,
        "{generated} does not state the Windows x64 layout of rdma-core's headers any more; \
         run `IRPVERBS_BLESS=1 cargo test --test windows_layout` in the library's directory \
         and check the change. It should be:\n{text}"
    );
}
