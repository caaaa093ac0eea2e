//! # irpverbs rdma-abi
//!
//! rdma-core's application ABI as plain `#[repr(C)]` Rust data: the
//! structures, unions and constants of `<infiniband/verbs.h>` ([`verbs`])
//! and `<rdma/rdma_cma.h>` ([`cma`]) that programs share with
//! `libibverbs.so.1` (`ulp/ibverbs`) and `librdmacm.so.1` (`ulp/rdmacm`),
//! defined once for both. Nothing here exports a symbol or calls anything.
//!
//! [`layout`] lists the modules' layout facts (every size and member
//! offset); the libraries' `tests/layout.rs` compile them as
//! `_Static_assert`s against the system headers (Debian's libibverbs-dev and
//! librdmacm-dev), so a layout that differs from rdma-core's fails there.
#![no_std]
#![forbid(unsafe_code)]
#![allow(non_camel_case_types, missing_docs)]

extern crate alloc;

use alloc::vec::Vec;

/// A C type's layout: (the type, its size, [(member designator, offset)]).
pub type Layout = (&'static str, usize, Vec<(&'static str, usize)>);

/// One [`Layout`]: `l!("struct c_name", rust_type { member, member.sub })`.
macro_rules! l {
    ($c:literal, $t:ty { $($f:ident $(. $g:ident)*),* $(,)? }) => {
        ($c, size_of::<$t>(), vec![$((concat!(stringify!($f) $(, ".", stringify!($g))*), offset_of!($t, $f $(. $g)*))),*])
    };
}

pub mod cma;
pub mod layout;
pub mod verbs;
