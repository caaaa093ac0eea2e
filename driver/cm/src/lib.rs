//! # irpverbs-cm
//!
//! The InfiniBand connection manager (IBTA chapter 12): the CM MADs.
#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod msg;

/// A port GID (16 bytes, network order).
pub type Gid = [u8; 16];
