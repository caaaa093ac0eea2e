//! The Win32 view of the driver's statuses: the Win32 error codes
//! `RtlNtStatusToDosError` turns them into (what `GetLastError` reports
//! after `DeviceIoControl` fails), both directions of that conversion for
//! the statuses irpverbs completes with. Shared by the host Win32 subset
//! (which plays the I/O manager) and the user-mode libraries on Windows
//! (which undo it).

use crate::status::*;

/// Win32 error codes (`winerror.h`) as irpverbs' clients see them.
pub mod error {
    /// `ERROR_SUCCESS`.
    pub const SUCCESS: u32 = 0;
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
    /// `WAIT_TIMEOUT`.
    pub const WAIT_TIMEOUT: u32 = 258;
    /// `ERROR_ABANDONED_WAIT_0`.
    pub const ABANDONED_WAIT_0: u32 = 735;
    /// `ERROR_OPERATION_ABORTED`.
    pub const OPERATION_ABORTED: u32 = 995;
    /// `ERROR_IO_INCOMPLETE`.
    pub const IO_INCOMPLETE: u32 = 996;
    /// `ERROR_IO_PENDING`.
    pub const IO_PENDING: u32 = 997;
    /// `ERROR_NOACCESS`.
    pub const NOACCESS: u32 = 998;
    /// `ERROR_IO_DEVICE`.
    pub const IO_DEVICE: u32 = 1117;
    /// `ERROR_NOT_FOUND`.
    pub const NOT_FOUND: u32 = 1168;
    /// `ERROR_NO_SYSTEM_RESOURCES`.
    pub const NO_SYSTEM_RESOURCES: u32 = 1450;
    /// `ERROR_DEVICE_REMOVED`.
    pub const DEVICE_REMOVED: u32 = 1617;
}

/// `RtlNtStatusToDosError` for the statuses irpverbs completes with.
#[must_use]
pub fn nt_status_to_win32(status: NtStatus) -> u32 {
    match status {
        STATUS_SUCCESS => error::SUCCESS,
        STATUS_PENDING => error::IO_PENDING,
        STATUS_INVALID_HANDLE => error::INVALID_HANDLE,
        STATUS_INVALID_PARAMETER | STATUS_INVALID_PARAMETER_MIX => error::INVALID_PARAMETER,
        STATUS_INVALID_DEVICE_REQUEST => error::INVALID_FUNCTION,
        STATUS_ACCESS_DENIED | STATUS_DELETE_PENDING | STATUS_PROCESS_IS_TERMINATING => {
            error::ACCESS_DENIED
        }
        STATUS_BUFFER_TOO_SMALL => error::INSUFFICIENT_BUFFER,
        STATUS_INFO_LENGTH_MISMATCH => error::BAD_LENGTH,
        STATUS_DEVICE_BUSY => error::BUSY,
        STATUS_INSUFFICIENT_RESOURCES => error::NO_SYSTEM_RESOURCES,
        STATUS_NOT_SUPPORTED => error::NOT_SUPPORTED,
        STATUS_CANCELLED => error::OPERATION_ABORTED,
        STATUS_INVALID_DEVICE_STATE => error::BAD_COMMAND,
        STATUS_DEVICE_REMOVED => error::DEV_NOT_EXIST,
        STATUS_DATATYPE_MISALIGNMENT_ERROR => error::NOACCESS,
        _ => error::IO_DEVICE,
    }
}

/// The NTSTATUS behind the Win32 error `DeviceIoControl` failed with at
/// once: a request the driver completed with an error without pending it
/// does not write its status into the `OVERLAPPED` (the I/O manager only
/// reports it, converted, through `GetLastError`). Inverts
/// [`nt_status_to_win32`] up to the errno a status gives (statuses that
/// share an error give the same errno); any other error is
/// [`STATUS_UNSUCCESSFUL`].
#[must_use]
pub fn nt_status_of_win32(err: u32) -> NtStatus {
    use error as e;
    match err {
        e::SUCCESS => STATUS_SUCCESS,
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
