//! # irpverbs conformance suite
//!
//! Black-box tests that talk to an irpverbs device only through IOCTLs,
//! behind the small [`Dut`] trait, so the same suite runs against the host
//! device (the driver in-process over the soft HCA) and, on Windows, against
//! the installed `irpverbs.sys` through `DeviceIoControl`.
//!
//! Every test takes a `&dyn Dut`, returns `Result<(), String>` with a message
//! that names what differed, and leaves nothing open. [`SUITE`] lists them.
#![forbid(unsafe_code)]

mod suite;

pub use irpverbs_verbs::{Client, IoctlResult, IoctlTransport};
pub use suite::{SUITE, Test};

use irpverbs_abi::NtStatus;

/// One open of the device under test (a file handle): carries IOCTLs and
/// closes the file when dropped.
pub type DutFile = dyn IoctlTransport;

/// The device under test.
pub trait Dut: Send + Sync {
    /// Opens the device (`CreateFile`).
    ///
    /// # Errors
    /// The status the open failed with.
    fn open(&self) -> Result<Box<DutFile>, NtStatus>;

    /// Called after a test closed all its files: `Err` if the device still
    /// holds anything of theirs (objects, pool, pending requests). A device
    /// that cannot tell (the real driver) returns `Ok`.
    ///
    /// # Errors
    /// What leaked.
    fn check_quiescent(&self) -> Result<(), String>;
}
