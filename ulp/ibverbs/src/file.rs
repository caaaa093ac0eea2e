//! The device file under a context: `CreateFileA` on `\\.\irpverbs0`
//! (overlapped), each control verb an `IOCTL_IV_*` through
//! `DeviceIoControl` whose NTSTATUS is read from the `OVERLAPPED`, as a
//! Windows ULP does. On a non-Windows host the Win32 subset is
//! `irpverbs-host-c`'s, over the host-mode driver it loads in-process.

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};

use irpverbs_abi::*;
use irpverbs_host_c::win32::{
    CloseHandle, CreateFileA, DeviceIoControl, GetOverlappedResult, HANDLE, OVERLAPPED,
};
use irpverbs_verbs::IoctlTransport;

const GENERIC_READ: u32 = 0x8000_0000;
const GENERIC_WRITE: u32 = 0x4000_0000;
const OPEN_EXISTING: u32 = 3;
const FILE_FLAG_OVERLAPPED: u32 = 0x4000_0000;
const INVALID_HANDLE_VALUE: usize = usize::MAX;

/// An open device file (the HANDLE, as an address so that threads share
/// it). Closing is explicit ([`DeviceFile::close`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceFile(usize);

impl DeviceFile {
    /// Opens `\\.\irpverbs0` for overlapped I/O.
    ///
    /// # Errors
    /// The Win32 error of `CreateFileA`.
    pub fn open() -> Result<Self, u32> {
        // SAFETY: a NUL-terminated name; no security attributes or template.
        let h = unsafe {
            CreateFileA(
                c"\\\\.\\irpverbs0".as_ptr(),
                GENERIC_READ | GENERIC_WRITE,
                0,
                std::ptr::null_mut(),
                OPEN_EXISTING,
                FILE_FLAG_OVERLAPPED,
                std::ptr::null_mut(),
            )
        };
        if h as usize == INVALID_HANDLE_VALUE {
            return Err(irpverbs_host_c::win32::GetLastError());
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
        CloseHandle(self.handle());
    }
}

impl IoctlTransport for DeviceFile {
    /// `DeviceIoControl` with an OVERLAPPED, waited for with
    /// `GetOverlappedResult`; the status is the request's NTSTATUS
    /// (`OVERLAPPED.Internal`), the output what it returned.
    fn ioctl(&self, code: u32, input: &[u8], output_len: usize) -> (NtStatus, Vec<u8>) {
        let mut out = vec![0u8; output_len];
        // `Internal` starts at a value no request completes with: still
        // there after the call, the request was never issued.
        const NOT_ISSUED: usize = usize::MAX;
        let mut ov = OVERLAPPED {
            Internal: NOT_ISSUED,
            InternalHigh: 0,
            Offset: 0,
            OffsetHigh: 0,
            hEvent: std::ptr::null_mut(),
        };
        let (Ok(in_len), Ok(out_len)) = (u32::try_from(input.len()), u32::try_from(output_len))
        else {
            return (STATUS_INVALID_PARAMETER, Vec::new());
        };
        let mut bytes = 0u32;
        // SAFETY: the buffers are valid for their lengths and, with the
        // OVERLAPPED, live until the request completed (waited for below).
        unsafe {
            DeviceIoControl(
                self.handle(),
                code,
                input.as_ptr().cast::<c_void>(),
                in_len,
                out.as_mut_ptr().cast::<c_void>(),
                out_len,
                &mut bytes,
                &mut ov,
            )
        };
        if ov.Internal == NOT_ISSUED {
            return (STATUS_INVALID_HANDLE, Vec::new());
        }
        // SAFETY: `ov` is the OVERLAPPED of the request just issued.
        unsafe { GetOverlappedResult(self.handle(), &mut ov, &mut bytes, 1) };
        // A wait that failed (the file closed by another thread meanwhile)
        // still must not let `ov` and `out` go before the request
        // completed: closing the file completes it.
        while internal(&ov).load(Ordering::Acquire) == STATUS_PENDING as u32 as usize {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let status = ov.Internal as u32 as NtStatus;
        out.truncate(ov.InternalHigh.min(output_len));
        (status, out)
    }
}

/// `OVERLAPPED.Internal` as the atomic the completion stores into.
fn internal(ov: &OVERLAPPED) -> &AtomicUsize {
    // SAFETY: `Internal` is an aligned usize; AtomicUsize has the same
    // size and alignment, and every write to it while the request is in
    // flight is atomic (the Win32 subset's completion).
    unsafe { &*std::ptr::from_ref(&ov.Internal).cast::<AtomicUsize>() }
}
