//! An open file of the device as a ULP library reaches it: the
//! [`IoctlTransport`] every control verb goes through, and the
//! [`SpeedPath`] a file that also reaches the HCA's doorbells promises.
//!
//! Implemented by whatever carries a ULP's IOCTLs (`DeviceIoControl` on
//! Windows, a host-mode file, a test double); used by the typed verbs
//! (`irpverbs-verbs`, which re-exports both). The driver side depends on
//! this crate, not on a ULP library, to implement them.

use alloc::boxed::Box;
use alloc::vec::Vec;

use irpverbs_abi::NtStatus;

use crate::speed::Doorbells;

/// Carries one IOCTL to the driver and waits for its completion.
pub trait IoctlTransport: Send + Sync {
    /// Issues `code` with `input`, an output buffer of `output_len` bytes,
    /// and returns the completion status and the `information` output bytes.
    fn ioctl(&self, code: u32, input: &[u8], output_len: usize) -> (NtStatus, Vec<u8>);
}

impl<T: IoctlTransport + ?Sized> IoctlTransport for Box<T> {
    fn ioctl(&self, code: u32, input: &[u8], output_len: usize) -> (NtStatus, Vec<u8>) {
        (**self).ioctl(code, input, output_len)
    }
}

/// An open of the device whose rings the speed path may use: an IOCTL
/// transport that also reaches the HCA's doorbells (direct calls, or the
/// file's doorbell page, [`PageDoorbells`](crate::speed::PageDoorbells), mapped before any ring so that
/// `IOCTL_IV_MAP_RINGS` reports each queue's slot in it).
///
/// # Safety
/// Implementing this promises that the driver objects created through this
/// value are destroyed, resized or run down (file close) only through IOCTLs
/// issued by this value or by dropping it: nothing else holds the same open
/// of the device. The typed verbs' client (`irpverbs_verbs::Client`) relies
/// on it to keep every ring a speed-path object views mapped for as long as
/// the object lives (it refuses destroys of such objects through itself,
/// and its objects borrow it, so it cannot be dropped under them).
pub unsafe trait SpeedPath: IoctlTransport {
    /// The doorbells of the device this file is open on.
    fn doorbells(&self) -> &dyn Doorbells;
}
