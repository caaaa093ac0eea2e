//! `include/irpverbs.h` is generated from this crate by cbindgen (configured
//! by `driver/abi/cbindgen.toml`) and checked in. This test regenerates it and
//! fails when the checked-in file differs; run it with `IRPVERBS_BLESS=1` to
//! rewrite the file instead:
//!
//! ```text
//! IRPVERBS_BLESS=1 cargo test -p irpverbs-abi --test header
//! ```
//!
//! The other tests check the generated text itself: everything the ABI
//! defines is in it, in C spelling, and nothing marked `cbindgen:ignore` is.

mod common;

use common::{CONSTS, generate_header, header_fresh, source_consts};
use irpverbs_abi::{IOCTLS, LAYOUTS};

#[test]
fn header_is_fresh() {
    if let Err(msg) = header_fresh() {
        panic!("{msg}");
    }
}

/// The value text of `#define NAME VALUE`, if the header defines NAME.
fn define<'h>(header: &'h str, name: &str) -> Option<&'h str> {
    header.lines().find_map(|l| {
        l.strip_prefix("#define ")?
            .strip_prefix(name)?
            .strip_prefix(' ')
    })
}

#[test]
fn header_is_c_with_guard_and_stdint() {
    let h = generate_header();
    assert!(h.starts_with("/*\n * irpverbs.h:"), "header comment first");
    assert!(h.contains("IRPVERBS_BLESS=1 cargo test -p irpverbs-abi --test header"));
    assert!(h.contains("\n#ifndef IRPVERBS_H\n#define IRPVERBS_H\n"));
    assert!(h.contains("\n#include <stdint.h>\n"));
    assert!(h.trim_end().ends_with("#endif  /* IRPVERBS_H */"));
    assert!(!h.contains("namespace"), "language C, not C++");
}

#[test]
fn every_constant_is_defined() {
    let h = generate_header();
    let mut missing = Vec::new();
    for name in source_consts() {
        if define(&h, &name).is_none() {
            missing.push(name);
        }
    }
    for info in IOCTLS {
        let name = format!("IOCTL_IV_{}", info.name);
        if define(&h, &name).is_none() {
            missing.push(name);
        }
    }
    assert!(missing.is_empty(), "not in the header: {missing:?}");
}

#[test]
fn constant_table_matches_the_source() {
    // CONSTS (used to static-assert values in C) must list every integer
    // constant in the source except the IOCTL codes, which IOCTLS lists.
    let ioctls: Vec<String> = IOCTLS
        .iter()
        .map(|i| format!("IOCTL_IV_{}", i.name))
        .collect();
    let mut in_source = source_consts();
    let mut source_ioctls: Vec<String> = in_source
        .iter()
        .filter(|n| n.starts_with("IOCTL_IV_"))
        .cloned()
        .collect();
    in_source.retain(|n| !n.starts_with("IOCTL_IV_"));
    let mut table: Vec<String> = CONSTS.iter().map(|(n, _)| (*n).to_owned()).collect();
    in_source.sort();
    table.sort();
    assert_eq!(table, in_source, "tests/common/mod.rs CONSTS vs src");
    let mut ioctls_sorted = ioctls;
    ioctls_sorted.sort();
    source_ioctls.sort();
    assert_eq!(
        ioctls_sorted, source_ioctls,
        "IOCTLS vs the IOCTL_IV_* constants"
    );
}

#[test]
fn status_codes_are_plain_int32_literals() {
    // NTSTATUS values must be usable in `#if` and have the `int32_t` value
    // (negative for errors and warnings), not a cast of an unsigned literal.
    let h = generate_header();
    let mut n = 0;
    for (name, value) in CONSTS.iter().filter(|(n, _)| n.starts_with("STATUS_")) {
        let text = define(&h, name).unwrap_or_else(|| panic!("{name} not defined"));
        assert_eq!(text, value.to_string(), "{name}");
        assert!(i32::try_from(*value).is_ok(), "{name}");
        n += 1;
    }
    assert_eq!(n, 28);
    assert_eq!(
        define(&h, "STATUS_INVALID_PARAMETER"),
        Some("-1073741811"),
        "0xC000000D as int32_t"
    );
    assert!(h.contains("typedef int32_t NtStatus;"));
}

#[test]
fn ioctl_codes_are_ctl_code_expressions() {
    let h = generate_header();
    assert_eq!(
        define(&h, "IOCTL_IV_ALLOC_PD"),
        Some(
            "((((FILE_DEVICE_INFINIBAND << 16) | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)) \
             | (2064 << 2)) | METHOD_BUFFERED)"
        )
    );
    assert_eq!(
        define(&h, "IOCTL_IV_GET_VERSION"),
        Some(
            "((((FILE_DEVICE_INFINIBAND << 16) | (FILE_ANY_ACCESS << 14)) | (2048 << 2)) \
             | METHOD_BUFFERED)"
        )
    );
    assert_eq!(define(&h, "FILE_DEVICE_INFINIBAND"), Some("59"));
}

/// The field names declared in `typedef struct NAME { ... } NAME;`.
fn c_fields(header: &str, name: &str) -> Option<Vec<String>> {
    let start = header.find(&format!("\ntypedef struct {name} {{\n"))?;
    let body = &header[start..];
    let end = body.find(&format!("\n}} {name};\n"))?;
    Some(
        body[..end]
            .lines()
            .skip(2)
            .filter(|l| {
                l.starts_with("  ") && !l.trim_start().starts_with(['*', '/']) && l.ends_with(';')
            })
            .map(|l| {
                let decl = l.trim_end_matches(';');
                let last = decl.rsplit(' ').next().unwrap_or_default();
                last.split('[').next().unwrap_or_default().to_owned()
            })
            .collect(),
    )
}

#[test]
fn every_struct_is_a_typedef_with_the_rust_fields_in_order() {
    let h = generate_header();
    for l in LAYOUTS {
        let fields = c_fields(&h, l.name).unwrap_or_else(|| {
            panic!(
                "typedef struct {0} {{ ... }} {0}; not in the header",
                l.name
            )
        });
        let want: Vec<&str> = l.fields.iter().map(|(f, _)| *f).collect();
        assert_eq!(fields, want, "{}", l.name);
    }
    assert!(h.contains("typedef uint64_t IvHandle;"));
    assert_eq!(h.matches("typedef struct ").count(), LAYOUTS.len());
}

#[test]
fn field_docs_are_carried_over() {
    let h = generate_header();
    assert!(
        h.contains("/**\n * Request of `IOCTL_IV_CREATE_QP`.\n */\ntypedef struct IvCreateQpIn {")
    );
    assert!(h.contains("  /**\n   * Send queue depth.\n   */\n  uint32_t max_send_wr;"));
    assert!(h.contains("  uint8_t reserved[7];"));
    assert!(h.contains("  struct IvQpCap cap;"));
}

#[test]
fn ignored_items_are_absent() {
    let h = generate_header();
    for word in [
        "IoctlInfo",
        "IOCTLS",
        "LAYOUTS",
        "Layout ",
        "Layout;",
        "AbiLayout",
        "ctl_code",
        "ioctl_info",
        "status_name",
        "nt_success",
    ] {
        assert!(!h.contains(word), "{word:?} is in the header");
    }
}

#[test]
fn cbindgen_toml_exports_every_struct() {
    // The ABI has no functions, so cbindgen reaches no struct by itself:
    // cbindgen.toml lists them. The list must be exactly LAYOUTS.
    let mut listed = common::cbindgen_config().export.include;
    let mut want: Vec<String> = LAYOUTS.iter().map(|l| l.name.to_owned()).collect();
    listed.sort();
    want.sort();
    assert_eq!(listed, want, "[export] include in driver/abi/cbindgen.toml");
}
