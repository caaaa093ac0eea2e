//! The user-mode speed-path library for C ULPs (`include/irpverbs_user.h`):
//! `IvUserQpOpen` and friends over a device HANDLE of [`crate::win32`]: an
//! open maps the object's rings into the process (`IOCTL_IV_MAP_RINGS`; the
//! create IOCTLs return only their geometry to user mode), then posts and
//! polls on them with no IOCTL. The doorbells go to the in-process soft HCA
//! by direct call, or (`IRPVERBS_DOORBELLS=page`, as on Windows) through the
//! file's doorbell page, which the device maps when the file is opened and
//! its doorbell thread scans. Also the host-only stand-in
//! for a kernel ULP's `IRP_MN_QUERY_INTERFACE`
//! ([`IrpverbsHostQueryInterface`], `include/irpverbs_host.h`).
//!
//! Every object keeps its device file alive and takes the file's read lock
//! around each ring access, so a speed-path call after `CloseHandle` (which
//! runs the file's objects down, freeing their rings, under the write lock)
//! fails with `STATUS_INVALID_HANDLE` instead of touching freed memory. An
//! open object is "held": destroying or resizing it through
//! `DeviceIoControl` is refused with `ERROR_BUSY`.
#![allow(unsafe_code)]
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::c_void;
use std::sync::PoisonError;
use std::sync::atomic::Ordering;

use irpverbs_abi::*;
use irpverbs_verbs::kernel::{
    IV_KERNEL_INTERFACE_GUID, IvKernelInterface, IvKernelRecvWr, IvKernelSendWr, poll_into_c,
    recv_sges_from_c, send_wr_from_c, serve_query,
};
use irpverbs_verbs::{AsNtStatus, CqRings, QpRings, SendWr, SrqRings};
use zerocopy::{FromBytes, IntoBytes};

use crate::win32::{HANDLE, Win32File, error, fail, file_of};
use irpverbs_host::device::HostFile;
use irpverbs_ring::Shared;

/// `IvUserSendWr`: the layout of `IvKernelSendWr`.
pub type IvUserSendWr = IvKernelSendWr;
/// `IvUserRecvWr`: the layout of `IvKernelRecvWr`.
pub type IvUserRecvWr = IvKernelRecvWr;

/// An opened object: the rings, the file it lives on, and its hold.
struct Opened<R> {
    file: Shared<Win32File>,
    held: (u32, IvHandle),
    rings: R,
}

impl<R> Opened<R> {
    /// Runs `f` with the open device file, under its read lock (the rings
    /// stay mapped meanwhile).
    fn with<T>(&self, closed: T, f: impl FnOnce(&HostFile, &R) -> T) -> T {
        let guard = self
            .file
            .file
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        match guard.as_ref() {
            Some(file) => f(file, &self.rings),
            None => closed,
        }
    }
}

impl<R> Drop for Opened<R> {
    fn drop(&mut self) {
        self.file.release(self.held);
    }
}

/// `IvUserQp`.
pub struct IvUserQp(Opened<QpRings>);
/// `IvUserCq`.
pub struct IvUserCq(Opened<CqRings>);
/// `IvUserSrq`.
pub struct IvUserSrq(Opened<SrqRings>);

/// `IOCTL_IV_MAP_RINGS` for `handle` on `file`: its rings in this process.
fn map_rings(file: &HostFile, handle: IvHandle) -> Result<IvMapRingsOut, NtStatus> {
    let (status, out) = file.ioctl(
        IOCTL_IV_MAP_RINGS,
        IvHandleIn { handle }.as_bytes(),
        size_of::<IvMapRingsOut>(),
    );
    if !nt_success(status) {
        return Err(status);
    }
    IvMapRingsOut::read_from_bytes(&out).map_err(|_| STATUS_INVALID_PARAMETER)
}

/// Opens an object on `device`: holds it (under the file's read lock, so
/// the file is open), maps its rings (`IOCTL_IV_MAP_RINGS`) and views them
/// with `map`.
fn open<R, T>(
    device: HANDLE,
    held: (u32, IvHandle),
    map: impl FnOnce(IvMapRingsOut) -> Result<R, NtStatus>,
    wrap: impl FnOnce(Opened<R>) -> T,
) -> *mut T {
    let Some(file) = file_of(device) else {
        return fail(error::INVALID_HANDLE, std::ptr::null_mut());
    };
    let guard = file.file.read().unwrap_or_else(PoisonError::into_inner);
    if guard.is_none() {
        return fail(error::INVALID_HANDLE, std::ptr::null_mut());
    }
    if !file.hold(held) {
        return fail(error::NO_SYSTEM_RESOURCES, std::ptr::null_mut());
    }
    let mapped = guard
        .as_ref()
        .map_or(Err(STATUS_INVALID_HANDLE), |f| map_rings(f, held.1));
    let rings = match mapped.and_then(map) {
        Ok(r) => r,
        Err(status) => {
            file.release(held);
            // A refused allocation says so; anything else is a bad object.
            let err = if status == STATUS_INSUFFICIENT_RESOURCES {
                error::NO_SYSTEM_RESOURCES
            } else {
                error::INVALID_PARAMETER
            };
            return fail(err, std::ptr::null_mut());
        }
    };
    drop(guard);
    // Refused, the opened object is dropped: its hold is released.
    match irpverbs_ring::try_box(wrap(Opened { file, held, rings })) {
        Ok(opened) => Box::into_raw(opened),
        Err(_) => fail(error::NO_SYSTEM_RESOURCES, std::ptr::null_mut()),
    }
}

/// `IvUserQpOpen`.
///
/// # Safety
/// `qp` is NULL or the unmodified `IOCTL_IV_CREATE_QP` response of a QP
/// created on `device`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn IvUserQpOpen(device: HANDLE, qp: *const IvCreateQpOut) -> *mut IvUserQp {
    // SAFETY: a non-null `qp` is a response (C contract).
    let Some(&out) = (unsafe { qp.as_ref() }) else {
        return fail(error::INVALID_PARAMETER, std::ptr::null_mut());
    };
    open(
        device,
        (IOCTL_IV_DESTROY_QP, out.qp),
        |m| {
            let mapped = IvCreateQpOut {
                sq: m.ring,
                rq: m.rq,
                ..out
            };
            // SAFETY: the rings IOCTL_IV_MAP_RINGS mapped stay mapped in
            // this process until the QP is destroyed or its file closed; the
            // destroy is refused while the QP is held, and every ring access
            // takes the file's read lock and checks the file is still open.
            unsafe { QpRings::from_create(&mapped) }.map(|r| r.with_doorbells(&m))
        },
        IvUserQp,
    )
}

/// `IvUserCqOpen`.
///
/// # Safety
/// `cq` is NULL or the unmodified `IOCTL_IV_CREATE_CQ` response of a CQ
/// created on `device` (with the ring of its last resize).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn IvUserCqOpen(device: HANDLE, cq: *const IvCreateCqOut) -> *mut IvUserCq {
    // SAFETY: a non-null `cq` is a response (C contract).
    let Some(&out) = (unsafe { cq.as_ref() }) else {
        return fail(error::INVALID_PARAMETER, std::ptr::null_mut());
    };
    open(
        device,
        (IOCTL_IV_DESTROY_CQ, out.cq),
        // SAFETY: as for the QP; resizes are refused while held too.
        |m| unsafe { CqRings::from_map(out.cqn, &m.ring) }.map(|r| r.with_doorbells(&m)),
        IvUserCq,
    )
}

/// `IvUserSrqOpen`.
///
/// # Safety
/// `srq` is NULL or the unmodified `IOCTL_IV_CREATE_SRQ` response of an SRQ
/// created on `device`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn IvUserSrqOpen(
    device: HANDLE,
    srq: *const IvCreateSrqOut,
) -> *mut IvUserSrq {
    // SAFETY: a non-null `srq` is a response (C contract).
    let Some(&out) = (unsafe { srq.as_ref() }) else {
        return fail(error::INVALID_PARAMETER, std::ptr::null_mut());
    };
    open(
        device,
        (IOCTL_IV_DESTROY_SRQ, out.srq),
        |m| {
            let mapped = IvCreateSrqOut {
                ring: m.ring,
                ..out
            };
            // SAFETY: as for the QP.
            unsafe { SrqRings::from_create(&mapped) }.map(|r| r.with_doorbells(&m))
        },
        IvUserSrq,
    )
}

/// `IvUserQpClose`.
///
/// # Safety
/// `qp` is NULL or from `IvUserQpOpen`, closed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn IvUserQpClose(qp: *mut IvUserQp) {
    if !qp.is_null() {
        // SAFETY: from `Box::into_raw` in `open`, closed once (C contract).
        drop(unsafe { Box::from_raw(qp) });
    }
}

/// `IvUserCqClose`.
///
/// # Safety
/// `cq` is NULL or from `IvUserCqOpen`, closed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn IvUserCqClose(cq: *mut IvUserCq) {
    if !cq.is_null() {
        // SAFETY: from `Box::into_raw` in `open`, closed once (C contract).
        drop(unsafe { Box::from_raw(cq) });
    }
}

/// `IvUserSrqClose`.
///
/// # Safety
/// `srq` is NULL or from `IvUserSrqOpen`, closed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn IvUserSrqClose(srq: *mut IvUserSrq) {
    if !srq.is_null() {
        // SAFETY: from `Box::into_raw` in `open`, closed once (C contract).
        drop(unsafe { Box::from_raw(srq) });
    }
}

fn status(r: Result<(), impl AsNtStatus>) -> NtStatus {
    match r {
        Ok(()) => STATUS_SUCCESS,
        Err(e) => e.nt_status(),
    }
}

/// `IvUserPostSend`.
///
/// # Safety
/// `qp` is NULL or open; `wr` is NULL or a work request whose gather list
/// or inline data is valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn IvUserPostSend(qp: *mut IvUserQp, wr: *const IvUserSendWr) -> NtStatus {
    // SAFETY: a non-null `qp` is open (C contract).
    let Some(qp) = (unsafe { qp.cast_const().as_ref() }) else {
        return STATUS_INVALID_PARAMETER;
    };
    // SAFETY: a non-null `wr` is a work request (C contract).
    let Some(wr) = (unsafe { wr.as_ref() }) else {
        return STATUS_INVALID_PARAMETER;
    };
    // SAFETY: its list or data is valid (C contract).
    match unsafe { send_wr_from_c(wr) } {
        Ok(send) => post_send_wr(qp, &send),
        Err(s) => s,
    }
}

/// [`IvUserPostSend`] for a library built on this one that builds the
/// speed path's work request itself (libibverbs' `ibv_post_send`): no C
/// work request between the two.
#[must_use]
pub fn post_send_wr(qp: &IvUserQp, send: &SendWr<'_>) -> NtStatus {
    qp.0.with(STATUS_INVALID_HANDLE, |file, rings| {
        status(rings.post_send(file, send))
    })
}

/// `IvUserPostRecv`.
///
/// # Safety
/// `qp` is NULL or open; `wr` is NULL or a work request whose scatter list
/// is valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn IvUserPostRecv(qp: *mut IvUserQp, wr: *const IvUserRecvWr) -> NtStatus {
    // SAFETY: a non-null `qp` is open (C contract).
    let Some(qp) = (unsafe { qp.cast_const().as_ref() }) else {
        return STATUS_INVALID_PARAMETER;
    };
    // SAFETY: a non-null `wr` is a work request (C contract).
    let Some(wr) = (unsafe { wr.as_ref() }) else {
        return STATUS_INVALID_PARAMETER;
    };
    // SAFETY: its scatter list is valid (C contract).
    let sges = match unsafe { recv_sges_from_c(wr) } {
        Ok(s) => s,
        Err(s) => return s,
    };
    qp.0.with(STATUS_INVALID_HANDLE, |file, rings| {
        status(rings.post_recv(file, wr.wr_id, sges))
    })
}

/// `IvUserPostSrqRecv`.
///
/// # Safety
/// `srq` is NULL or open; `wr` as for `IvUserPostRecv`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn IvUserPostSrqRecv(
    srq: *mut IvUserSrq,
    wr: *const IvUserRecvWr,
) -> NtStatus {
    // SAFETY: a non-null `srq` is open (C contract).
    let Some(srq) = (unsafe { srq.cast_const().as_ref() }) else {
        return STATUS_INVALID_PARAMETER;
    };
    // SAFETY: a non-null `wr` is a work request (C contract).
    let Some(wr) = (unsafe { wr.as_ref() }) else {
        return STATUS_INVALID_PARAMETER;
    };
    // SAFETY: its scatter list is valid (C contract).
    let sges = match unsafe { recv_sges_from_c(wr) } {
        Ok(s) => s,
        Err(s) => return s,
    };
    srq.0.with(STATUS_INVALID_HANDLE, |file, rings| {
        status(rings.post_recv(file, wr.wr_id, sges))
    })
}

/// `IvUserPollCq`. On a device with a UDP wire (`IRPVERBS_ADDR`), a poll
/// that finds nothing also busy-polls the wire's receive.
///
/// # Safety
/// `cq` is NULL or open; `wc` is NULL or valid for `max` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn IvUserPollCq(cq: *mut IvUserCq, wc: *mut IvCqe, max: u32) -> i32 {
    // SAFETY: a non-null `cq` is open (C contract).
    let Some(cq) = (unsafe { cq.cast_const().as_ref() }) else {
        return STATUS_INVALID_PARAMETER;
    };
    cq.0.with(STATUS_INVALID_HANDLE, |file, rings| {
        // SAFETY: `wc` holds `max` entries (C contract).
        let n = unsafe { poll_into_c(rings, wc, max) };
        if n == 0 && crate::win32::UDP_WIRE.load(Ordering::Relaxed) {
            // A poller that spins gets its datagrams itself, as a NIC's
            // poller needs no thread of the host to be woken (irpverbs
            // perf's busy-poll loops do the same): on 2 processors the
            // wire's receive thread otherwise waits for a spinning one to
            // be preempted.
            file.device().poll_wire();
        }
        n
    })
}

/// `IvUserReqNotifyCq`.
///
/// # Safety
/// `cq` is NULL or open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn IvUserReqNotifyCq(cq: *mut IvUserCq, solicited_only: i32) -> NtStatus {
    // SAFETY: a non-null `cq` is open (C contract).
    let Some(cq) = (unsafe { cq.cast_const().as_ref() }) else {
        return STATUS_INVALID_PARAMETER;
    };
    cq.0.with(STATUS_INVALID_HANDLE, |file, rings| {
        rings.req_notify(file, solicited_only != 0);
        STATUS_SUCCESS
    })
}

/// `IvUserQpNumber` (0 for NULL).
///
/// # Safety
/// `qp` is NULL or open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn IvUserQpNumber(qp: *const IvUserQp) -> u32 {
    // SAFETY: a non-null `qp` is open (C contract).
    unsafe { qp.as_ref() }.map_or(0, |q| q.0.rings.qpn())
}

/// `IvUserCqNumber` (0 for NULL).
///
/// # Safety
/// `cq` is NULL or open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn IvUserCqNumber(cq: *const IvUserCq) -> u32 {
    // SAFETY: a non-null `cq` is open (C contract).
    unsafe { cq.as_ref() }.map_or(0, |c| c.0.rings.cqn())
}

/// `IvUserSrqNumber` (0 for NULL).
///
/// # Safety
/// `srq` is NULL or open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn IvUserSrqNumber(srq: *const IvUserSrq) -> u32 {
    // SAFETY: a non-null `srq` is open (C contract).
    unsafe { srq.as_ref() }.map_or(0, |s| s.0.rings.srqn())
}

/// A GUID (`IvGuid` / `GUID`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IvGuid {
    /// `Data1`.
    pub data1: u32,
    /// `Data2`.
    pub data2: u16,
    /// `Data3`.
    pub data3: u16,
    /// `Data4`.
    pub data4: [u8; 8],
}

/// Host only: `IRP_MN_QUERY_INTERFACE` sent to the device `device` is open
/// on. For `GUID_IV_KERNEL_INTERFACE`, version 1 or 2, with `size` holding
/// that version's table, fills `*out` with the referenced direct-call table
/// (the prefix of it that version defines: a ULP built against version 1
/// gets version 1). `STATUS_NOT_SUPPORTED` for another interface type, as a
/// driver that does not export it answers; `STATUS_INVALID_PARAMETER` for a
/// size or version it cannot serve or a NULL pointer;
/// `STATUS_INVALID_HANDLE` for a handle that is not an open device;
/// `STATUS_INSUFFICIENT_RESOURCES` when the table's context cannot be
/// allocated (nothing is referenced).
///
/// # Safety
/// `guid` and `out` are NULL or valid (`out` for `size` bytes).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn IrpverbsHostQueryInterface(
    device: HANDLE,
    guid: *const IvGuid,
    size: u16,
    version: u16,
    out: *mut IvKernelInterface,
) -> NtStatus {
    let Some(f) = file_of(device) else {
        return STATUS_INVALID_HANDLE;
    };
    // SAFETY: a non-null `guid` is valid (C contract).
    let Some(guid) = (unsafe { guid.as_ref() }) else {
        return STATUS_INVALID_PARAMETER;
    };
    let (d1, d2, d3, d4) = IV_KERNEL_INTERFACE_GUID;
    if (guid.data1, guid.data2, guid.data3, guid.data4) != (d1, d2, d3, d4) {
        return STATUS_NOT_SUPPORTED;
    }
    let guard = f.file.read().unwrap_or_else(PoisonError::into_inner);
    let Some(file) = guard.as_ref() else {
        return STATUS_INVALID_HANDLE;
    };
    let table = match file.device().query_interface() {
        Ok(table) => table,
        Err(status) => return status,
    };
    // SAFETY: `out` is NULL or valid for `size` bytes (C contract).
    match unsafe { serve_query(&table, size, version, out) } {
        Ok(()) => STATUS_SUCCESS,
        Err(status) => {
            // Not handed out: give back the table's reference.
            // SAFETY: the context is the new table's, referenced once.
            unsafe { (table.interface_dereference)(table.context) };
            status
        }
    }
}

/// Host only: the stand-in for the `FILE_OBJECT` a kernel ULP names its
/// file by in the direct-call table's CEP functions (what
/// `IoGetDeviceObjectPointer` returns with the device object); NULL for a
/// handle that is not an open file of the device.
#[unsafe(no_mangle)]
pub extern "C" fn IrpverbsHostGetFileObject(file: HANDLE) -> *mut c_void {
    let Some(f) = file_of(file) else {
        return std::ptr::null_mut();
    };
    let guard = f.file.read().unwrap_or_else(PoisonError::into_inner);
    guard
        .as_ref()
        .map_or(std::ptr::null_mut(), |file| file.file_object())
}

/// Host only: the calling thread's IRQL as the host platform tracks it
/// (`KeGetCurrentIrql`), for kernel-ULP tests to check where they are
/// called.
#[unsafe(no_mangle)]
pub extern "C" fn IrpverbsHostGetCurrentIrql() -> u8 {
    irpverbs_host::platform::current_irql()
}
