//! # irpverbs kernel table
//!
//! The speed path as a ULP sees it, `no_std` + `alloc`, in one copy for
//! every user of it:
//!
//! - [`speed`]: the ring views of one object ([`QpRings`], [`CqRings`],
//!   [`SrqRings`]) over rings mapped into the caller's address space, and the
//!   [`Doorbells`] a post or an arm rings (direct calls, or a user-mode
//!   file's doorbell page: [`PageDoorbells`]);
//! - [`kernel`]: the kernel ULPs' direct-call function table
//!   (`include/irpverbs_kernel.h`), handed out through
//!   `IRP_MN_QUERY_INTERFACE`. Its post, poll and arm hold a lock of the
//!   platform's that raises to DISPATCH_LEVEL ([`kernel::SpeedLock`]);
//! - [`file`](mod@file): an open file as a ULP library reaches it
//!   ([`IoctlTransport`], [`SpeedPath`]), which a driver-side file
//!   implements without depending on a ULP library.
//!
//! Users: `irpverbs-verbs` (the typed user-mode verbs, which re-exports
//! them), the host device (`irpverbs-host`: the table of
//! `HostDevice::query_interface`, its files' transport), the user-mode C
//! library (`irpverbs-host-c`) and irpverbs.sys (`driver/kmdf`, which
//! registers the table with `WdfDeviceAddQueryInterface`).
//!
//! `unsafe` appears where a mapped address becomes a ring (the
//! `from_create` / `from_map` constructors, whose callers vouch for the
//! mapping; `PageDoorbells::from_map` for a doorbell page) and in the
//! table's C ABI. Every `unsafe` block holds one unsafe
//! operation and states why it is sound.
#![no_std]
#![warn(missing_docs)]
#![deny(clippy::multiple_unsafe_ops_per_block)]

extern crate alloc;

pub mod file;
pub mod kernel;
pub mod speed;

pub use file::{IoctlTransport, SpeedPath};

pub use speed::{
    AsNtStatus, Bell, Corrupt, CqRings, Doorbells, PageDoorbells, PostError, QpRings, RecvWr,
    SendWr, SrqRings, WakeHca,
};
