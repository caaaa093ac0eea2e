//! # irpverbs conformance suite
//!
//! Black-box tests that talk to an irpverbs device only through IOCTLs,
//! behind the small [`Dut`] trait, so the same suite runs against the host
//! device (the driver in-process over the soft HCA) and, on Windows, against
//! the installed `irpverbs.sys` through `DeviceIoControl`.
//!
//! Every test takes a `&dyn Dut`, returns `Result<(), String>` with a message
//! that names what differed, and leaves nothing open. [`SUITE`] lists them.
//!
//! The data-path tests (`dp_*`) open the device with the speed path
//! ([`Dut::open_speed`]): they create QPs, CQs and SRQs whose rings are
//! mapped into the test, post and poll with no IOCTL, and check every
//! completion (status, opcode, length, id, flags), the data byte for byte,
//! the QP state (`QUERY_QP`) and the async events (`GET_ASYNC_EVENT`, then
//! `ACK_ASYNC_EVENT`). They wait for completions by polling with a deadline
//! and for events with a blocking IOCTL, so a DUT's transport should bound
//! every IOCTL (the host runner and the Windows runner cancel one after a
//! timeout).
#![forbid(unsafe_code)]

/// Fails the test with a message when the condition is false.
macro_rules! check {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

mod dp;
mod preconditions;
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

    /// Opens the device with the speed path: a [`Client`] built with
    /// [`Client::with_speed_path`] over a new open of the device, whose
    /// `new_qp`, `new_cq` and `new_srq` map the objects' rings into the
    /// caller and whose doorbells reach the HCA. Dropping it closes the file.
    ///
    /// # Errors
    /// The status the open failed with; `STATUS_NOT_SUPPORTED` when the DUT
    /// cannot map rings into the test (the data-path tests then fail with
    /// that status).
    fn open_speed(&self) -> Result<Client, NtStatus>;

    /// Called after a test closed all its files: `Err` if the device still
    /// holds anything of theirs (objects, pool, pending requests). A device
    /// that cannot tell (the real driver) returns `Ok`.
    ///
    /// # Errors
    /// What leaked.
    fn check_quiescent(&self) -> Result<(), String>;
}
