//! NTSTATUS values the driver completes requests with.
//!
//! Values are the Windows ones (`ntstatus.h`); they are `i32` as `NTSTATUS` is
//! (`LONG`). A request completes with exactly one of these.
//!
//! Error and warning values are written as negative literals, the `i32` value
//! of the `ntstatus.h` hex spelling each one's documentation gives, rather
//! than as `0xC000_0004_u32 as i32`: cbindgen renders that cast as
//! `(int32_t)3221225476u`, an implementation-defined conversion that is not
//! usable in `#if`, while a negative literal becomes a plain `int` constant.
//! A test checks every value against its `ntstatus.h` spelling.

/// An NTSTATUS value.
pub type NtStatus = i32;

/// The operation completed successfully.
pub const STATUS_SUCCESS: NtStatus = 0x0000_0000;
/// The operation is in progress; the request completes later.
pub const STATUS_PENDING: NtStatus = 0x0000_0103;
/// The object has dependents, an operation in flight or unacknowledged
/// events; nothing was changed. Also: one request already outstanding.
/// `ntstatus.h`: `0x80000011`.
pub const STATUS_DEVICE_BUSY: NtStatus = -0x7FFF_FFEF;
/// An error the driver does not complete with: what a client reports for a
/// failure it cannot name (an unknown Win32 error turned back, for one).
/// `ntstatus.h`: `0xC0000001`.
pub const STATUS_UNSUCCESSFUL: NtStatus = -0x3FFF_FFFF;
/// Input buffer length does not match the request struct's size.
/// `ntstatus.h`: `0xC0000004`.
pub const STATUS_INFO_LENGTH_MISMATCH: NtStatus = -0x3FFF_FFFC;
/// A handle is stale, belongs to another file, or names an object of the
/// wrong type.
/// `ntstatus.h`: `0xC0000008`.
pub const STATUS_INVALID_HANDLE: NtStatus = -0x3FFF_FFF8;
/// A memory registration names user memory the caller cannot access (the
/// exception `MmProbeAndLockPages` raises for an unmapped page, or a
/// read-only page pinned for write).
/// `ntstatus.h`: `0xC0000005`.
pub const STATUS_ACCESS_VIOLATION: NtStatus = -0x3FFF_FFFB;
/// A field is out of range, or a reserved field is not zero.
/// `ntstatus.h`: `0xC000000D`.
pub const STATUS_INVALID_PARAMETER: NtStatus = -0x3FFF_FFF3;
/// Unknown IOCTL code (or one sent through the wrong major function).
/// `ntstatus.h`: `0xC0000010`.
pub const STATUS_INVALID_DEVICE_REQUEST: NtStatus = -0x3FFF_FFF0;
/// A user-mode caller used a kernel-only IOCTL, or the handle lacks access.
/// `ntstatus.h`: `0xC0000022`.
pub const STATUS_ACCESS_DENIED: NtStatus = -0x3FFF_FFDE;
/// The output buffer is smaller than the response struct.
/// `ntstatus.h`: `0xC0000023`.
pub const STATUS_BUFFER_TOO_SMALL: NtStatus = -0x3FFF_FFDD;
/// A combination of attributes (an attribute mask) is not valid for the
/// requested transition.
/// `ntstatus.h`: `0xC0000030`.
pub const STATUS_INVALID_PARAMETER_MIX: NtStatus = -0x3FFF_FFD0;
/// The file is being cleaned up; no new verbs are accepted on it.
/// `ntstatus.h`: `0xC0000056`.
pub const STATUS_DELETE_PENDING: NtStatus = -0x3FFF_FFAA;
/// A device limit (max QPs, CQEs, ...) or a pool allocation failed.
/// `ntstatus.h`: `0xC000009A`.
pub const STATUS_INSUFFICIENT_RESOURCES: NtStatus = -0x3FFF_FF66;
/// The device does not support this feature (e.g. alternate paths).
/// `ntstatus.h`: `0xC00000BB`.
pub const STATUS_NOT_SUPPORTED: NtStatus = -0x3FFF_FF45;
/// The request was cancelled.
/// `ntstatus.h`: `0xC0000120`.
pub const STATUS_CANCELLED: NtStatus = -0x3FFF_FEE0;
/// The object is not in a state that allows this operation (e.g. a QP state
/// transition the IBTA state machine does not have).
/// `ntstatus.h`: `0xC0000184`.
pub const STATUS_INVALID_DEVICE_STATE: NtStatus = -0x3FFF_FE7C;
/// A connect or accept ended with a REJ from the remote.
/// `ntstatus.h`: `0xC0000236`.
pub const STATUS_CONNECTION_REFUSED: NtStatus = -0x3FFF_FDCA;
/// A connection exchange gave up after its retries.
/// `ntstatus.h`: `0xC00000B5`.
pub const STATUS_IO_TIMEOUT: NtStatus = -0x3FFF_FF4B;
/// The device is gone (surprise or orderly removal).
/// `ntstatus.h`: `0xC00002B6`.
pub const STATUS_DEVICE_REMOVED: NtStatus = -0x3FFF_FD4A;
/// A buffer is not aligned as the request struct requires (8 bytes).
/// `ntstatus.h`: `0xC00002C5`.
pub const STATUS_DATATYPE_MISALIGNMENT_ERROR: NtStatus = -0x3FFF_FD3B;
/// A CQ overran (its waiters complete with this when it fails).
/// `ntstatus.h`: `0xC000003C`.
pub const STATUS_DATA_OVERRUN: NtStatus = -0x3FFF_FFC4;
/// The hardware reported an internal error executing a command.
/// `ntstatus.h`: `0xC0000483`.
pub const STATUS_DEVICE_HARDWARE_ERROR: NtStatus = -0x3FFF_FB7D;

/// `STATUS_INVALID_ADDRESS` (0xC0000141): an address no port of the
/// device owns (a source address given to `IOCTL_IV_RESOLVE_ADDR`).
pub const STATUS_INVALID_ADDRESS: NtStatus = -0x3FFF_FEBF;

/// `STATUS_ADDRESS_ALREADY_EXISTS` (0xC000020A): the service ID (an IP
/// port of a port space) already has a listener.
pub const STATUS_ADDRESS_ALREADY_EXISTS: NtStatus = -0x3FFF_FDF6;

/// `STATUS_NETWORK_UNREACHABLE` (0xC000023C): no active port has an
/// address of the destination's family.
pub const STATUS_NETWORK_UNREACHABLE: NtStatus = -0x3FFF_FDC4;

/// `STATUS_QUOTA_EXCEEDED` (0xC0000044): the file (one open of the
/// device) holds as many objects of the kind, or as many bytes of ring or
/// pinned memory, as its per-file quota allows; nothing was created. Other
/// files are not affected, and destroying the file's objects frees quota.
pub const STATUS_QUOTA_EXCEEDED: NtStatus = -0x3FFF_FFBC;

/// `STATUS_PROCESS_IS_TERMINATING` (0xC000010A): the process that opened
/// the file has exited while another process still holds a handle to it
/// (inherited or duplicated). The driver ran the file down when its opener
/// exited: its objects are destroyed, its rings and doorbell page unmapped,
/// the pages its registrations locked unlocked. Every request on the file
/// fails with this status (and waits pending on it complete with it) until
/// its last handle is closed.
pub const STATUS_PROCESS_IS_TERMINATING: NtStatus = -0x3FFF_FEF6;

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
        STATUS_UNSUCCESSFUL => "STATUS_UNSUCCESSFUL",
        STATUS_INFO_LENGTH_MISMATCH => "STATUS_INFO_LENGTH_MISMATCH",
        STATUS_INVALID_HANDLE => "STATUS_INVALID_HANDLE",
        STATUS_ACCESS_VIOLATION => "STATUS_ACCESS_VIOLATION",
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
        STATUS_DATA_OVERRUN => "STATUS_DATA_OVERRUN",
        STATUS_CONNECTION_REFUSED => "STATUS_CONNECTION_REFUSED",
        STATUS_IO_TIMEOUT => "STATUS_IO_TIMEOUT",
        STATUS_INVALID_ADDRESS => "STATUS_INVALID_ADDRESS",
        STATUS_ADDRESS_ALREADY_EXISTS => "STATUS_ADDRESS_ALREADY_EXISTS",
        STATUS_NETWORK_UNREACHABLE => "STATUS_NETWORK_UNREACHABLE",
        STATUS_QUOTA_EXCEEDED => "STATUS_QUOTA_EXCEEDED",
        STATUS_PROCESS_IS_TERMINATING => "STATUS_PROCESS_IS_TERMINATING",
        _ => "STATUS_<unknown>",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each status with its `ntstatus.h` spelling.
    const NTSTATUS_H: &[(NtStatus, u32)] = &[
        (STATUS_SUCCESS, 0x0000_0000),
        (STATUS_PENDING, 0x0000_0103),
        (STATUS_DEVICE_BUSY, 0x8000_0011),
        (STATUS_UNSUCCESSFUL, 0xC000_0001),
        (STATUS_INFO_LENGTH_MISMATCH, 0xC000_0004),
        (STATUS_INVALID_HANDLE, 0xC000_0008),
        (STATUS_ACCESS_VIOLATION, 0xC000_0005),
        (STATUS_CONNECTION_REFUSED, 0xC000_0236),
        (STATUS_IO_TIMEOUT, 0xC000_00B5),
        (STATUS_INVALID_PARAMETER, 0xC000_000D),
        (STATUS_INVALID_DEVICE_REQUEST, 0xC000_0010),
        (STATUS_ACCESS_DENIED, 0xC000_0022),
        (STATUS_BUFFER_TOO_SMALL, 0xC000_0023),
        (STATUS_INVALID_PARAMETER_MIX, 0xC000_0030),
        (STATUS_DELETE_PENDING, 0xC000_0056),
        (STATUS_INSUFFICIENT_RESOURCES, 0xC000_009A),
        (STATUS_NOT_SUPPORTED, 0xC000_00BB),
        (STATUS_CANCELLED, 0xC000_0120),
        (STATUS_INVALID_DEVICE_STATE, 0xC000_0184),
        (STATUS_DEVICE_REMOVED, 0xC000_02B6),
        (STATUS_DATATYPE_MISALIGNMENT_ERROR, 0xC000_02C5),
        (STATUS_DEVICE_HARDWARE_ERROR, 0xC000_0483),
        (STATUS_DATA_OVERRUN, 0xC000_003C),
        (STATUS_INVALID_ADDRESS, 0xC000_0141),
        (STATUS_ADDRESS_ALREADY_EXISTS, 0xC000_020A),
        (STATUS_NETWORK_UNREACHABLE, 0xC000_023C),
        (STATUS_QUOTA_EXCEEDED, 0xC000_0044),
        (STATUS_PROCESS_IS_TERMINATING, 0xC000_010A),
    ];

    #[test]
    fn values_are_the_ntstatus_h_ones() {
        for &(status, hex) in NTSTATUS_H {
            let name = status_name(status);
            assert_ne!(name, "STATUS_<unknown>", "{hex:#010X}");
            assert_eq!(
                u32::from_ne_bytes(status.to_ne_bytes()),
                hex,
                "{name} is {status:#010X} (as i32: {status})"
            );
            assert_eq!(nt_success(status), hex < 0x8000_0000, "{name}");
        }
    }
}
