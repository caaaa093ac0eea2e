//! NTSTATUS values the driver completes requests with.
//!
//! Values are the Windows ones (`ntstatus.h`); they are `i32` as `NTSTATUS` is
//! (`LONG`). A request completes with exactly one of these.

/// An NTSTATUS value.
pub type NtStatus = i32;

/// The operation completed successfully.
pub const STATUS_SUCCESS: NtStatus = 0x0000_0000;
/// The operation is in progress; the request completes later.
pub const STATUS_PENDING: NtStatus = 0x0000_0103;
/// The object has dependents, an operation in flight or unacknowledged
/// events; nothing was changed. Also: one request already outstanding.
pub const STATUS_DEVICE_BUSY: NtStatus = 0x8000_0011_u32 as i32;
/// Input buffer length does not match the request struct's size.
pub const STATUS_INFO_LENGTH_MISMATCH: NtStatus = 0xC000_0004_u32 as i32;
/// A handle is stale, belongs to another file, or names an object of the
/// wrong type.
pub const STATUS_INVALID_HANDLE: NtStatus = 0xC000_0008_u32 as i32;
/// A field is out of range, or a reserved field is not zero.
pub const STATUS_INVALID_PARAMETER: NtStatus = 0xC000_000D_u32 as i32;
/// Unknown IOCTL code (or one sent through the wrong major function).
pub const STATUS_INVALID_DEVICE_REQUEST: NtStatus = 0xC000_0010_u32 as i32;
/// A user-mode caller used a kernel-only IOCTL, or the handle lacks access.
pub const STATUS_ACCESS_DENIED: NtStatus = 0xC000_0022_u32 as i32;
/// The output buffer is smaller than the response struct.
pub const STATUS_BUFFER_TOO_SMALL: NtStatus = 0xC000_0023_u32 as i32;
/// A combination of attributes (an attribute mask) is not valid for the
/// requested transition.
pub const STATUS_INVALID_PARAMETER_MIX: NtStatus = 0xC000_0030_u32 as i32;
/// The file is being cleaned up; no new verbs are accepted on it.
pub const STATUS_DELETE_PENDING: NtStatus = 0xC000_0056_u32 as i32;
/// A device limit (max QPs, CQEs, ...) or a pool allocation failed.
pub const STATUS_INSUFFICIENT_RESOURCES: NtStatus = 0xC000_009A_u32 as i32;
/// The device does not support this feature (e.g. alternate paths).
pub const STATUS_NOT_SUPPORTED: NtStatus = 0xC000_00BB_u32 as i32;
/// The request was cancelled.
pub const STATUS_CANCELLED: NtStatus = 0xC000_0120_u32 as i32;
/// The object is not in a state that allows this operation (e.g. a QP state
/// transition the IBTA state machine does not have).
pub const STATUS_INVALID_DEVICE_STATE: NtStatus = 0xC000_0184_u32 as i32;
/// The device is gone (surprise or orderly removal).
pub const STATUS_DEVICE_REMOVED: NtStatus = 0xC000_02B6_u32 as i32;
/// A buffer is not aligned as the request struct requires (8 bytes).
pub const STATUS_DATATYPE_MISALIGNMENT_ERROR: NtStatus = 0xC000_02C5_u32 as i32;
/// The hardware reported an internal error executing a command.
pub const STATUS_DEVICE_HARDWARE_ERROR: NtStatus = 0xC000_0483_u32 as i32;

/// True for success and informational values (NT_SUCCESS).
#[must_use]
pub const fn nt_success(status: NtStatus) -> bool {
    status >= 0
}

/// The symbolic name of a status this crate defines, for logs and tools.
#[must_use]
pub const fn status_name(status: NtStatus) -> &'static str {
    match status {
        STATUS_SUCCESS => "STATUS_SUCCESS",
        STATUS_PENDING => "STATUS_PENDING",
        STATUS_DEVICE_BUSY => "STATUS_DEVICE_BUSY",
        STATUS_INFO_LENGTH_MISMATCH => "STATUS_INFO_LENGTH_MISMATCH",
        STATUS_INVALID_HANDLE => "STATUS_INVALID_HANDLE",
        STATUS_INVALID_PARAMETER => "STATUS_INVALID_PARAMETER",
        STATUS_INVALID_DEVICE_REQUEST => "STATUS_INVALID_DEVICE_REQUEST",
        STATUS_ACCESS_DENIED => "STATUS_ACCESS_DENIED",
        STATUS_BUFFER_TOO_SMALL => "STATUS_BUFFER_TOO_SMALL",
        STATUS_INVALID_PARAMETER_MIX => "STATUS_INVALID_PARAMETER_MIX",
        STATUS_DELETE_PENDING => "STATUS_DELETE_PENDING",
        STATUS_INSUFFICIENT_RESOURCES => "STATUS_INSUFFICIENT_RESOURCES",
        STATUS_NOT_SUPPORTED => "STATUS_NOT_SUPPORTED",
        STATUS_CANCELLED => "STATUS_CANCELLED",
        STATUS_INVALID_DEVICE_STATE => "STATUS_INVALID_DEVICE_STATE",
        STATUS_DEVICE_REMOVED => "STATUS_DEVICE_REMOVED",
        STATUS_DATATYPE_MISALIGNMENT_ERROR => "STATUS_DATATYPE_MISALIGNMENT_ERROR",
        STATUS_DEVICE_HARDWARE_ERROR => "STATUS_DEVICE_HARDWARE_ERROR",
        _ => "STATUS_<unknown>",
    }
}
