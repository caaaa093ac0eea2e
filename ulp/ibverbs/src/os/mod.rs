//! The platform under the library, in one place: everything else is the
//! same code on every target.
//!
//! | what                     | a non-Windows host (`host.rs`)                  | Windows x64 (`windows.rs`)                                   |
//! |--------------------------|-------------------------------------------------|--------------------------------------------------------------|
//! | the device file          | `irpverbs-host-c`'s Win32 subset over the host-mode driver loaded in-process | `CreateFileW(\\.\irpverbs0)`, `DeviceIoControl` with an `OVERLAPPED` and an event (kernel32) |
//! | the speed path           | `irpverbs-host-c`'s `IvUser*` functions         | the rings `IOCTL_IV_MAP_RINGS` mapped and the file's doorbell page (`IOCTL_IV_MAP_DOORBELLS`), woken by `IOCTL_IV_RING_DOORBELLS` |
//! | an event source ([`Fd`]) | an eventfd (semaphore mode): `poll`, `epoll`, `O_NONBLOCK` | a manual-reset event HANDLE, signaled while events are queued (`WaitForSingleObject`, `WaitForMultipleObjects`), in the `int` (`(HANDLE)(intptr_t)fd`) |
//! | `errno`                  | `__errno_location`                              | the CRT's (msvcrt) `_errno`                                  |
//! | `cmd_fd`                 | -1                                              | the device file's HANDLE, in the `int`                       |
//! | `pthread_mutex_t` / `pthread_cond_t` in the C structs | glibc's                 | winpthreads' (MinGW-w64): one pointer-sized word each        |
//!
//! `docs/ibverbs.md` (Windows) states the resulting C layout.

use irpverbs_abi::*;

mod event;
pub use event::*;

#[cfg(not(windows))]
mod host;
#[cfg(not(windows))]
pub use host::*;

#[cfg(windows)]
mod windows;
#[cfg(windows)]
pub use windows::*;

/// Win32 error codes the driver's NTSTATUSes become (`RtlNtStatusToDosError`).
pub mod win32_error {
    /// `ERROR_INVALID_FUNCTION`.
    pub const INVALID_FUNCTION: u32 = 1;
    /// `ERROR_FILE_NOT_FOUND`.
    pub const FILE_NOT_FOUND: u32 = 2;
    /// `ERROR_ACCESS_DENIED`.
    pub const ACCESS_DENIED: u32 = 5;
    /// `ERROR_INVALID_HANDLE`.
    pub const INVALID_HANDLE: u32 = 6;
    /// `ERROR_NOT_ENOUGH_MEMORY`.
    pub const NOT_ENOUGH_MEMORY: u32 = 8;
    /// `ERROR_BAD_COMMAND`.
    pub const BAD_COMMAND: u32 = 22;
    /// `ERROR_BAD_LENGTH`.
    pub const BAD_LENGTH: u32 = 24;
    /// `ERROR_NOT_SUPPORTED`.
    pub const NOT_SUPPORTED: u32 = 50;
    /// `ERROR_DEV_NOT_EXIST`.
    pub const DEV_NOT_EXIST: u32 = 55;
    /// `ERROR_INVALID_PARAMETER`.
    pub const INVALID_PARAMETER: u32 = 87;
    /// `ERROR_INSUFFICIENT_BUFFER`.
    pub const INSUFFICIENT_BUFFER: u32 = 122;
    /// `ERROR_BUSY`.
    pub const BUSY: u32 = 170;
    /// `ERROR_OPERATION_ABORTED`.
    pub const OPERATION_ABORTED: u32 = 995;
    /// `ERROR_IO_PENDING`.
    pub const IO_PENDING: u32 = 997;
    /// `ERROR_NOACCESS`.
    pub const NOACCESS: u32 = 998;
    /// `ERROR_DEVICE_REMOVED`.
    pub const DEVICE_REMOVED: u32 = 1617;
    /// `ERROR_NO_SYSTEM_RESOURCES`.
    pub const NO_SYSTEM_RESOURCES: u32 = 1450;
}

/// `STATUS_UNSUCCESSFUL`.
pub const STATUS_UNSUCCESSFUL: NtStatus = 0xC000_0001_u32 as NtStatus;

/// The NTSTATUS behind the Win32 error `DeviceIoControl` failed with at
/// once: a request the driver completed with an error without pending it
/// does not write its status into the `OVERLAPPED` (the I/O manager only
/// reports it, converted, through `GetLastError`). Inverts the conversion
/// for every status whose errno differs ([`crate::errno_of`]); any other
/// error is `STATUS_UNSUCCESSFUL` (`EIO`).
#[must_use]
pub fn nt_status_of_win32(error: u32) -> NtStatus {
    use win32_error as e;
    match error {
        0 => STATUS_SUCCESS,
        e::INVALID_FUNCTION => STATUS_INVALID_DEVICE_REQUEST,
        e::FILE_NOT_FOUND | e::DEV_NOT_EXIST | e::DEVICE_REMOVED => STATUS_DEVICE_REMOVED,
        e::ACCESS_DENIED => STATUS_ACCESS_DENIED,
        e::INVALID_HANDLE => STATUS_INVALID_HANDLE,
        e::NOT_ENOUGH_MEMORY | e::NO_SYSTEM_RESOURCES => STATUS_INSUFFICIENT_RESOURCES,
        e::BAD_COMMAND => STATUS_INVALID_DEVICE_STATE,
        e::BAD_LENGTH => STATUS_INFO_LENGTH_MISMATCH,
        e::NOT_SUPPORTED => STATUS_NOT_SUPPORTED,
        e::INVALID_PARAMETER => STATUS_INVALID_PARAMETER,
        e::INSUFFICIENT_BUFFER => STATUS_BUFFER_TOO_SMALL,
        e::BUSY => STATUS_DEVICE_BUSY,
        e::OPERATION_ABORTED => STATUS_CANCELLED,
        e::NOACCESS => STATUS_ACCESS_VIOLATION,
        _ => STATUS_UNSUCCESSFUL,
    }
}

#[cfg(all(test, not(windows)))]
mod tests {
    use super::*;
    use crate::errno_of;
    use irpverbs_host_c::win32::nt_status_to_win32;

    /// A request the driver fails at once on Windows reports only the Win32
    /// error the I/O manager made of its status: turned back, it gives the
    /// program the errno the status itself gives (host mode's
    /// `RtlNtStatusToDosError` is the forward table).
    #[test]
    fn win32_errors_give_back_the_errno_of_their_status() {
        for status in [
            STATUS_SUCCESS,
            STATUS_DEVICE_BUSY,
            STATUS_INSUFFICIENT_RESOURCES,
            STATUS_NOT_SUPPORTED,
            STATUS_INVALID_DEVICE_REQUEST,
            STATUS_ACCESS_DENIED,
            STATUS_DEVICE_REMOVED,
            STATUS_INVALID_HANDLE,
            STATUS_INVALID_PARAMETER,
            STATUS_INVALID_PARAMETER_MIX,
            STATUS_INVALID_DEVICE_STATE,
            STATUS_BUFFER_TOO_SMALL,
            STATUS_INFO_LENGTH_MISMATCH,
            STATUS_CANCELLED,
            STATUS_IO_TIMEOUT,
        ] {
            let error = nt_status_to_win32(status);
            assert_eq!(
                errno_of(nt_status_of_win32(error)),
                errno_of(status),
                "status {status:#x} (Win32 error {error})"
            );
        }
        assert_eq!(
            nt_status_of_win32(win32_error::NOACCESS),
            STATUS_ACCESS_VIOLATION
        );
        assert_eq!(nt_status_of_win32(win32_error::BUSY), STATUS_DEVICE_BUSY);
        assert_eq!(errno_of(nt_status_of_win32(0xdead)), libc::EIO);
    }
}
