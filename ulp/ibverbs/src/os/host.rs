//! A non-Windows host: the Win32 subset and the speed path of
//! `irpverbs-host-c` (over the host-mode driver it loads in-process),
//! and glibc's pthread types.

// A HANDLE is a pointer type that names an object and is never
// dereferenced: passing a bad one to the Win32 subset is an error return.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};

use irpverbs_abi::*;

use super::Fd;
pub use irpverbs_host_c::user::{
    IvUserCq, IvUserCqClose, IvUserCqOpen, IvUserPollCq, IvUserPostRecv, IvUserPostSrqRecv,
    IvUserQp, IvUserQpClose, IvUserQpOpen, IvUserRecvWr, IvUserReqNotifyCq, IvUserSrq,
    IvUserSrqClose, IvUserSrqOpen,
};
pub use irpverbs_host_c::win32::HANDLE;
use irpverbs_verbs::SendWr;

/// Posts a send work request: the speed path's own, built by the caller
/// (`ibv_post_send` builds it from the program's `ibv_send_wr`).
///
/// # Safety
/// `qp` is NULL or open; the request's list or data is valid.
pub unsafe fn post_send_wr(qp: *mut IvUserQp, send: &SendWr<'_>) -> NtStatus {
    // SAFETY: NULL or open (caller).
    match unsafe { qp.cast_const().as_ref() } {
        Some(qp) => irpverbs_host_c::user::post_send_wr(qp, send),
        None => STATUS_INVALID_PARAMETER,
    }
}
use irpverbs_host_c::win32::{
    CloseHandle, CreateFileA, DeviceIoControl, GetLastError, GetOverlappedResult, OVERLAPPED,
};

pub use libc::{pthread_cond_t, pthread_mutex_t};

/// `PTHREAD_MUTEX_INITIALIZER`.
pub const MUTEX: pthread_mutex_t = libc::PTHREAD_MUTEX_INITIALIZER;
/// `PTHREAD_COND_INITIALIZER`.
pub const COND: pthread_cond_t = libc::PTHREAD_COND_INITIALIZER;

/// The `cmd_fd` of a context: none (the device file is not a descriptor).
#[must_use]
pub fn cmd_fd(_device: HANDLE) -> Fd {
    -1
}

/// A C string as a path component: its bytes.
#[must_use]
pub fn os_str(s: &std::ffi::CStr) -> Option<&std::ffi::OsStr> {
    use std::os::unix::ffi::OsStrExt;
    Some(std::ffi::OsStr::from_bytes(s.to_bytes()))
}

const GENERIC_READ: u32 = 0x8000_0000;
const GENERIC_WRITE: u32 = 0x4000_0000;
const OPEN_EXISTING: u32 = 3;
const FILE_FLAG_OVERLAPPED: u32 = 0x4000_0000;
const INVALID_HANDLE_VALUE: usize = usize::MAX;

/// Opens `\\.\irpverbs0` for overlapped I/O.
///
/// # Errors
/// The Win32 error of `CreateFileA`.
pub fn open_device() -> Result<HANDLE, u32> {
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
        return Err(GetLastError());
    }
    Ok(h)
}

/// `CloseHandle`: the driver runs the file's objects down.
pub fn close_device(device: HANDLE) {
    CloseHandle(device);
}

/// `DeviceIoControl` with an OVERLAPPED, waited for with
/// `GetOverlappedResult`; the status is the request's NTSTATUS
/// (`OVERLAPPED.Internal`, which the Win32 subset always writes), the
/// output what it returned.
pub fn ioctl(device: HANDLE, code: u32, input: &[u8], output_len: usize) -> (NtStatus, Vec<u8>) {
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
    let (Ok(in_len), Ok(out_len)) = (u32::try_from(input.len()), u32::try_from(output_len)) else {
        return (STATUS_INVALID_PARAMETER, Vec::new());
    };
    let mut bytes = 0u32;
    // SAFETY: the buffers are valid for their lengths and, with the
    // OVERLAPPED, live until the request completed (waited for below).
    unsafe {
        DeviceIoControl(
            device,
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
    unsafe { GetOverlappedResult(device, &mut ov, &mut bytes, 1) };
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

/// `OVERLAPPED.Internal` as the atomic the completion stores into.
fn internal(ov: &OVERLAPPED) -> &AtomicUsize {
    // SAFETY: `Internal` is an aligned usize; AtomicUsize has the same
    // size and alignment, and every write to it while the request is in
    // flight is atomic (the Win32 subset's completion).
    unsafe { &*std::ptr::from_ref(&ov.Internal).cast::<AtomicUsize>() }
}

/// The file's speed path needs nothing beyond the file on the host: the
/// Win32 subset rings the in-process HCA's doorbells itself.
///
/// # Errors
/// None here.
pub fn open_speed_path(_device: HANDLE) -> Result<(), NtStatus> {
    Ok(())
}

/// Nothing to let go of (see [`open_speed_path`]).
pub fn close_speed_path(_device: HANDLE) {}
