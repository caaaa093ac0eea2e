//! The device file under a context: `\\.\irpverbs0` opened for
//! overlapped I/O, each control verb an `IOCTL_IV_*` through
//! `DeviceIoControl` whose NTSTATUS is read from the `OVERLAPPED`, as a
//! Windows ULP does ([`crate::os`]: kernel32 on Windows; on a non-Windows
//! host `irpverbs-host-c`'s Win32 subset, over the host-mode driver it
//! loads in-process).

use irpverbs_abi::*;
use irpverbs_verbs::IoctlTransport;

use crate::os::{self, HANDLE};

/// An open device file (the HANDLE, as an address so that threads share
/// it). Closing is explicit ([`DeviceFile::close`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceFile(usize);

impl DeviceFile {
    /// Opens `\\.\irpverbs0` for overlapped I/O, with what its speed path
    /// needs (on Windows its doorbell page).
    ///
    /// # Errors
    /// The Win32 error of opening it (`ERROR_NO_SYSTEM_RESOURCES` when the
    /// speed path cannot be set up).
    pub fn open() -> Result<Self, u32> {
        let h = os::open_device()?;
        if os::open_speed_path(h).is_err() {
            os::close_device(h);
            return Err(os::win32_error::NO_SYSTEM_RESOURCES);
        }
        Ok(Self(h as usize))
    }

    /// The HANDLE.
    #[must_use]
    pub fn handle(self) -> HANDLE {
        self.0 as HANDLE
    }

    /// `CloseHandle`: the driver runs the file's objects down.
    pub fn close(self) {
        os::close_speed_path(self.handle());
        os::close_device(self.handle());
    }
}

impl IoctlTransport for DeviceFile {
    /// The request's NTSTATUS and the output it returned (`os::ioctl`).
    fn ioctl(&self, code: u32, input: &[u8], output_len: usize) -> (NtStatus, Vec<u8>) {
        os::ioctl(self.handle(), code, input, output_len)
    }
}
