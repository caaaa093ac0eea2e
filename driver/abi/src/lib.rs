//! # irpverbs ABI
//!
//! The contract between irpverbs and its clients (user-mode ULPs through
//! `DeviceIoControl`, kernel ULPs through internal device control IRPs): IOCTL
//! codes built the way `CTL_CODE` builds them, `#[repr(C)]` request and
//! response structs made only of fixed-width fields with explicit reserved
//! padding, and the NTSTATUS values the driver completes requests with.
//!
//! Every struct derives zerocopy's `FromBytes`, so any byte string of the right
//! length is a valid value: the driver reads requests out of untrusted buffers
//! by copy (`read_from_bytes`) and then validates fields, never by casting a
//! pointer. Reserved fields must be zero; the driver rejects anything else with
//! [`status::STATUS_INVALID_PARAMETER`] so that they can be given a meaning later.
//!
//! `include/irpverbs.h` is generated from this crate by cbindgen and checked
//! in; a test fails when it is stale, and C tests static-assert every struct's
//! size and field offsets against the values here (native and MinGW x64).
#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod ioctl;
pub mod ring;
pub mod status;
mod types;
/// Not part of the C header (Win32 clients have `winerror.h`).
///
/// cbindgen:ignore
pub mod win32;

pub use ioctl::*;
pub use ring::*;
pub use status::*;
pub use types::*;

/// ABI version reported by [`IOCTL_IV_QUERY_DEVICE`] and
/// [`IOCTL_IV_GET_VERSION`]. Major in the high 16 bits, minor in the low 16 bits.
/// A client must refuse a device whose major differs from the one it was built
/// against; minor versions only add IOCTLs or give reserved fields a meaning.
pub const IV_ABI_VERSION: u32 = (IV_ABI_MAJOR << 16) | IV_ABI_MINOR;
/// ABI major version: it changes when a struct's layout does (2:
/// `IvQueryDeviceOut` reports `max_fast_reg_page_list_len`).
pub const IV_ABI_MAJOR: u32 = 2;
/// ABI minor version: IOCTLs added, or reserved fields given a meaning,
/// within the major version.
pub const IV_ABI_MINOR: u32 = 0;

/// A handle to a driver object, valid only on the file (open of the device)
/// that created it. Zero is never a valid handle.
pub type IvHandle = u64;
