//! Windows x64: the real driver. The device file is `\\.\irpverbs0` (the
//! symbolic link `irpverbs.sys` creates beside its device interface
//! `GUID_DEVINTERFACE_IRPVERBS`), opened with `CreateFileW` for overlapped
//! I/O; each control verb is a `DeviceIoControl` with an `OVERLAPPED`
//! whose event is the calling thread's, waited for with
//! `GetOverlappedResult`. The speed path posts and polls on the rings
//! `IOCTL_IV_MAP_RINGS` mapped into the process and rings the file's
//! doorbell page (`IOCTL_IV_MAP_DOORBELLS`, mapped when the file is
//! opened), waking the HCA with `IOCTL_IV_RING_DOORBELLS` when the page
//! says it does not poll. Event sources are manual-reset event HANDLEs.
//!
//! The kernel32 functions are declared here with their documented
//! signatures (`fileapi.h`, `ioapiset.h`, `synchapi.h`, `errhandlingapi.h`,
//! `handleapi.h`); the C runtime's `_errno` is MinGW's and MSVC's.
#![allow(non_snake_case, non_camel_case_types, clippy::upper_case_acronyms)]
// A HANDLE is a pointer type that names a kernel object and is never
// dereferenced: passing a bad one to kernel32 is an error return.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use std::ffi::c_void;
use std::sync::{Mutex, PoisonError};

use irpverbs_abi::*;
use irpverbs_verbs::kernel::{IvKernelRecvWr, poll_into_c, recv_sges_from_c};
use irpverbs_verbs::{
    AsNtStatus, CqRings, Doorbells, PageDoorbells, QpRings, SendWr, SrqRings, WakeHca,
};
use zerocopy::{FromBytes, IntoBytes};

use super::{Fd, nt_status_of_win32, win32_error};

/// `HANDLE`.
pub type HANDLE = *mut c_void;
/// `BOOL`.
type BOOL = i32;

/// `OVERLAPPED` (`minwinbase.h`; the `Offset`/`OffsetHigh` pair is the
/// union's structure member, `Pointer` its other view).
#[repr(C)]
pub struct OVERLAPPED {
    pub Internal: usize,
    pub InternalHigh: usize,
    pub Offset: u32,
    pub OffsetHigh: u32,
    pub hEvent: HANDLE,
}

const _: () = assert!(size_of::<OVERLAPPED>() == 32);
const _: () = assert!(std::mem::offset_of!(OVERLAPPED, hEvent) == 24);

#[link(name = "kernel32")]
unsafe extern "system" {
    fn CreateFileW(
        lpFileName: *const u16,
        dwDesiredAccess: u32,
        dwShareMode: u32,
        lpSecurityAttributes: *mut c_void,
        dwCreationDisposition: u32,
        dwFlagsAndAttributes: u32,
        hTemplateFile: HANDLE,
    ) -> HANDLE;
    fn DeviceIoControl(
        hDevice: HANDLE,
        dwIoControlCode: u32,
        lpInBuffer: *const c_void,
        nInBufferSize: u32,
        lpOutBuffer: *mut c_void,
        nOutBufferSize: u32,
        lpBytesReturned: *mut u32,
        lpOverlapped: *mut OVERLAPPED,
    ) -> BOOL;
    fn GetOverlappedResult(
        hFile: HANDLE,
        lpOverlapped: *mut OVERLAPPED,
        lpNumberOfBytesTransferred: *mut u32,
        bWait: BOOL,
    ) -> BOOL;
    fn CloseHandle(hObject: HANDLE) -> BOOL;
    fn GetLastError() -> u32;
    fn CreateEventW(
        lpEventAttributes: *mut c_void,
        bManualReset: BOOL,
        bInitialState: BOOL,
        lpName: *const u16,
    ) -> HANDLE;
}

const GENERIC_READ: u32 = 0x8000_0000;
const GENERIC_WRITE: u32 = 0x4000_0000;
const OPEN_EXISTING: u32 = 3;
const FILE_FLAG_OVERLAPPED: u32 = 0x4000_0000;
const INVALID_HANDLE_VALUE: HANDLE = usize::MAX as HANDLE;

/// winpthreads' `pthread_mutex_t` (`intptr_t`).
pub type pthread_mutex_t = isize;
/// winpthreads' `pthread_cond_t` (`intptr_t`).
pub type pthread_cond_t = isize;
/// winpthreads' `PTHREAD_MUTEX_INITIALIZER` (`GENERIC_INITIALIZER`, -1).
pub const MUTEX: pthread_mutex_t = -1;
/// winpthreads' `PTHREAD_COND_INITIALIZER` (-1).
pub const COND: pthread_cond_t = -1;

/// The `cmd_fd` of a context: its device file (as an `int`, see
/// [`super::handle_fd`]).
#[must_use]
pub fn cmd_fd(device: HANDLE) -> Fd {
    super::handle_fd(device)
}

/// A C string as a path component: UTF-8, or none.
#[must_use]
pub fn os_str(s: &std::ffi::CStr) -> Option<&std::ffi::OsStr> {
    s.to_str().ok().map(std::ffi::OsStr::new)
}

/// `GetLastError`.
fn last_error() -> u32 {
    // SAFETY: no arguments.
    unsafe { GetLastError() }
}

/// Opens `\\.\irpverbs0` for overlapped I/O.
///
/// # Errors
/// The Win32 error of `CreateFileW`.
pub fn open_device() -> Result<HANDLE, u32> {
    let name: Vec<u16> = "\\\\.\\irpverbs0\0".encode_utf16().collect();
    // SAFETY: a NUL-terminated UTF-16 name; no security attributes or
    // template.
    let h = unsafe {
        CreateFileW(
            name.as_ptr(),
            GENERIC_READ | GENERIC_WRITE,
            0,
            std::ptr::null_mut(),
            OPEN_EXISTING,
            FILE_FLAG_OVERLAPPED,
            std::ptr::null_mut(),
        )
    };
    if h == INVALID_HANDLE_VALUE {
        return Err(last_error());
    }
    Ok(h)
}

/// `CloseHandle`: the driver runs the file's objects down (and unmaps
/// their rings and the doorbell page).
pub fn close_device(device: HANDLE) {
    // SAFETY: a handle of `open_device`, closed once (caller).
    unsafe { CloseHandle(device) };
}

/// The calling thread's event for its requests' `OVERLAPPED`s (a
/// manual-reset event, as `GetOverlappedResult` requires; the I/O manager
/// resets it when a request is issued).
struct ThreadEvent(HANDLE);

impl Drop for ThreadEvent {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: the thread's event, closed once as the thread ends.
            unsafe { CloseHandle(self.0) };
        }
    }
}

thread_local! {
    static EVENT: ThreadEvent = ThreadEvent(
        // SAFETY: no name, no security attributes.
        unsafe { CreateEventW(std::ptr::null_mut(), 1, 0, std::ptr::null()) },
    );
}

/// `DeviceIoControl` with an OVERLAPPED and the thread's event, waited for
/// with `GetOverlappedResult`. The status is the request's NTSTATUS
/// (`OVERLAPPED.Internal`) when it was pended or succeeded; a request the
/// driver failed at once reports only a Win32 error, turned back into the
/// NTSTATUS ([`nt_status_of_win32`]).
pub fn ioctl(device: HANDLE, code: u32, input: &[u8], output_len: usize) -> (NtStatus, Vec<u8>) {
    let (Ok(in_len), Ok(out_len)) = (u32::try_from(input.len()), u32::try_from(output_len)) else {
        return (STATUS_INVALID_PARAMETER, Vec::new());
    };
    let event = EVENT.with(|e| e.0);
    if event.is_null() {
        return (STATUS_INSUFFICIENT_RESOURCES, Vec::new());
    }
    let mut out = vec![0u8; output_len];
    let mut ov = OVERLAPPED {
        Internal: 0,
        InternalHigh: 0,
        Offset: 0,
        OffsetHigh: 0,
        hEvent: event,
    };
    let mut bytes = 0u32;
    // SAFETY: the buffers are valid for their lengths and, with the
    // OVERLAPPED, live until the request completed (waited for below).
    let done = unsafe {
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
    if done == 0 {
        let err = last_error();
        if err != win32_error::IO_PENDING {
            // Failed without being pended: nothing was written to `ov`.
            return (nt_status_of_win32(err), Vec::new());
        }
        // SAFETY: `ov` is the OVERLAPPED of the pended request; waiting
        // for its event.
        unsafe { GetOverlappedResult(device, &mut ov, &mut bytes, 1) };
        // A wait that failed must still not let `ov` and `out` go before
        // the request completed (closing the file completes it).
        // SAFETY: `Internal` is an aligned word the I/O manager writes.
        while unsafe { std::ptr::read_volatile(&raw const ov.Internal) }
            == STATUS_PENDING as u32 as usize
        {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    let status = ov.Internal as u32 as NtStatus;
    out.truncate(ov.InternalHigh.min(output_len));
    (status, out)
}

/// Wakes the HCA through `IOCTL_IV_RING_DOORBELLS` on the file.
struct Wake(usize);

impl WakeHca for Wake {
    fn wake_hca(&self) {
        let _ = ioctl(self.0 as HANDLE, IOCTL_IV_RING_DOORBELLS, &[], 0);
    }
}

/// The doorbell page of each open device file, by its HANDLE.
static FILES: Mutex<Vec<(usize, PageDoorbells)>> = Mutex::new(Vec::new());

fn files() -> std::sync::MutexGuard<'static, Vec<(usize, PageDoorbells)>> {
    FILES.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Maps the file's doorbell page (`IOCTL_IV_MAP_DOORBELLS`) before any of
/// its rings, so that each ring gets a slot in it.
///
/// # Errors
/// The driver's status, or `STATUS_INVALID_PARAMETER` for a response that
/// does not describe a doorbell page.
pub fn open_speed_path(device: HANDLE) -> Result<(), NtStatus> {
    let (status, out) = ioctl(
        device,
        IOCTL_IV_MAP_DOORBELLS,
        &[],
        size_of::<IvMapDoorbellsOut>(),
    );
    if !nt_success(status) {
        return Err(status);
    }
    let out = IvMapDoorbellsOut::read_from_bytes(&out).map_err(|_| STATUS_INVALID_PARAMETER)?;
    // SAFETY: the unmodified response, issued in this process; the page
    // stays mapped until the file is closed, and `close_speed_path` drops
    // this view first.
    let bells = unsafe { PageDoorbells::from_map(&out) }?
        .with_wake(std::sync::Arc::new(Wake(device as usize)));
    files().push((device as usize, bells));
    Ok(())
}

/// Drops the file's doorbell page view (before `close_device`).
pub fn close_speed_path(device: HANDLE) {
    files().retain(|(h, _)| *h != device as usize);
}

fn bells_of(device: HANDLE) -> Option<PageDoorbells> {
    files()
        .iter()
        .find(|(h, _)| *h == device as usize)
        .map(|(_, b)| b.clone())
}

/// `IOCTL_IV_MAP_RINGS` for `handle`: its rings in this process.
fn map_rings(device: HANDLE, handle: IvHandle) -> Result<IvMapRingsOut, NtStatus> {
    let (status, out) = ioctl(
        device,
        IOCTL_IV_MAP_RINGS,
        IvHandleIn { handle }.as_bytes(),
        size_of::<IvMapRingsOut>(),
    );
    if !nt_success(status) {
        return Err(status);
    }
    IvMapRingsOut::read_from_bytes(&out).map_err(|_| STATUS_INVALID_PARAMETER)
}

/// An opened object: its rings and its file's doorbells.
pub struct Opened<R> {
    rings: R,
    bells: PageDoorbells,
}

/// A QP's speed path.
pub type IvUserQp = Opened<QpRings>;
/// A CQ's speed path.
pub type IvUserCq = Opened<CqRings>;
/// An SRQ's speed path.
pub type IvUserSrq = Opened<SrqRings>;
/// A receive work request in the speed path's C form.
pub type IvUserRecvWr = IvKernelRecvWr;

/// Maps `handle`'s rings and views them with `view`; NULL when the file
/// has no doorbell page, the driver refuses or the rings are not what a
/// create response promised.
fn open<R>(
    device: HANDLE,
    handle: IvHandle,
    view: impl FnOnce(IvMapRingsOut) -> Result<R, NtStatus>,
) -> *mut Opened<R> {
    let Some(bells) = bells_of(device) else {
        return std::ptr::null_mut();
    };
    match map_rings(device, handle).and_then(view) {
        Ok(rings) => Box::into_raw(Box::new(Opened { rings, bells })),
        Err(_) => std::ptr::null_mut(),
    }
}

/// Opens a QP's speed path.
///
/// # Safety
/// `qp` is NULL or the unmodified `IOCTL_IV_CREATE_QP` response of a QP
/// created on `device`; the result is closed before the QP is destroyed
/// and before the file is closed (the driver unmaps the rings then).
pub unsafe fn IvUserQpOpen(device: HANDLE, qp: *const IvCreateQpOut) -> *mut IvUserQp {
    // SAFETY: a non-null `qp` is a response (caller).
    let Some(&out) = (unsafe { qp.as_ref() }) else {
        return std::ptr::null_mut();
    };
    open(device, out.qp, |m| {
        let mapped = IvCreateQpOut {
            sq: m.ring,
            rq: m.rq,
            ..out
        };
        // SAFETY: the rings IOCTL_IV_MAP_RINGS mapped stay mapped in this
        // process until the QP is destroyed or its file closed, after the
        // view is closed (caller).
        unsafe { QpRings::from_create(&mapped) }.map(|r| r.with_doorbells(&m))
    })
}

/// Opens a CQ's speed path.
///
/// # Safety
/// As for [`IvUserQpOpen`], with the CQ's create (or last resize)
/// response; closed before a resize too.
pub unsafe fn IvUserCqOpen(device: HANDLE, cq: *const IvCreateCqOut) -> *mut IvUserCq {
    // SAFETY: a non-null `cq` is a response (caller).
    let Some(&out) = (unsafe { cq.as_ref() }) else {
        return std::ptr::null_mut();
    };
    open(device, out.cq, |m| {
        // SAFETY: as for the QP; resizes are refused while the view is
        // open (caller).
        unsafe { CqRings::from_map(out.cqn, &m.ring) }.map(|r| r.with_doorbells(&m))
    })
}

/// Opens an SRQ's speed path.
///
/// # Safety
/// As for [`IvUserQpOpen`], with the SRQ's create response.
pub unsafe fn IvUserSrqOpen(device: HANDLE, srq: *const IvCreateSrqOut) -> *mut IvUserSrq {
    // SAFETY: a non-null `srq` is a response (caller).
    let Some(&out) = (unsafe { srq.as_ref() }) else {
        return std::ptr::null_mut();
    };
    open(device, out.srq, |m| {
        let mapped = IvCreateSrqOut {
            ring: m.ring,
            ..out
        };
        // SAFETY: as for the QP.
        unsafe { SrqRings::from_create(&mapped) }.map(|r| r.with_doorbells(&m))
    })
}

/// Closes a speed path of [`open`].
///
/// # Safety
/// `p` is NULL or from one of the opens, closed once.
unsafe fn close<R>(p: *mut Opened<R>) {
    if !p.is_null() {
        // SAFETY: from `Box::into_raw` in `open`, closed once (caller).
        drop(unsafe { Box::from_raw(p) });
    }
}

/// Closes a QP's speed path.
///
/// # Safety
/// `qp` is NULL or from [`IvUserQpOpen`], closed once.
pub unsafe fn IvUserQpClose(qp: *mut IvUserQp) {
    // SAFETY: forwarded (caller).
    unsafe { close(qp) }
}

/// Closes a CQ's speed path.
///
/// # Safety
/// `cq` is NULL or from [`IvUserCqOpen`], closed once.
pub unsafe fn IvUserCqClose(cq: *mut IvUserCq) {
    // SAFETY: forwarded (caller).
    unsafe { close(cq) }
}

/// Closes an SRQ's speed path.
///
/// # Safety
/// `srq` is NULL or from [`IvUserSrqOpen`], closed once.
pub unsafe fn IvUserSrqClose(srq: *mut IvUserSrq) {
    // SAFETY: forwarded (caller).
    unsafe { close(srq) }
}

fn status(r: Result<(), impl AsNtStatus>) -> NtStatus {
    match r {
        Ok(()) => STATUS_SUCCESS,
        Err(e) => e.nt_status(),
    }
}

/// Posts a send work request: the speed path's own, built by the caller
/// (`ibv_post_send` builds it from the program's `ibv_send_wr`).
///
/// # Safety
/// `qp` is NULL or open; the request's list or data is valid.
pub unsafe fn post_send_wr(qp: *mut IvUserQp, send: &SendWr<'_>) -> NtStatus {
    // SAFETY: NULL or open (caller).
    let Some(qp) = (unsafe { qp.cast_const().as_ref() }) else {
        return STATUS_INVALID_PARAMETER;
    };
    status(qp.rings.post_send(&qp.bells as &dyn Doorbells, send))
}

/// Posts a receive work request on a QP.
///
/// # Safety
/// `qp` is NULL or open; `wr` is NULL or a work request whose scatter list
/// is valid.
pub unsafe fn IvUserPostRecv(qp: *mut IvUserQp, wr: *const IvUserRecvWr) -> NtStatus {
    // SAFETY: as for `IvUserPostSend`.
    let (Some(qp), Some(wr)) = (unsafe { qp.cast_const().as_ref() }, unsafe { wr.as_ref() }) else {
        return STATUS_INVALID_PARAMETER;
    };
    // SAFETY: its scatter list is valid (caller).
    match unsafe { recv_sges_from_c(wr) } {
        Ok(sges) => status(qp.rings.post_recv(&qp.bells, wr.wr_id, sges)),
        Err(s) => s,
    }
}

/// Posts a receive work request on an SRQ.
///
/// # Safety
/// As for [`IvUserPostRecv`].
pub unsafe fn IvUserPostSrqRecv(srq: *mut IvUserSrq, wr: *const IvUserRecvWr) -> NtStatus {
    // SAFETY: as for `IvUserPostSend`.
    let (Some(srq), Some(wr)) = (unsafe { srq.cast_const().as_ref() }, unsafe { wr.as_ref() })
    else {
        return STATUS_INVALID_PARAMETER;
    };
    // SAFETY: its scatter list is valid (caller).
    match unsafe { recv_sges_from_c(wr) } {
        Ok(sges) => status(srq.rings.post_recv(&srq.bells, wr.wr_id, sges)),
        Err(s) => s,
    }
}

/// Polls up to `max` completions into `wc`: their number, or a negative
/// NTSTATUS.
///
/// # Safety
/// `cq` is NULL or open; `wc` is NULL or valid for `max` entries.
pub unsafe fn IvUserPollCq(cq: *mut IvUserCq, wc: *mut IvCqe, max: u32) -> i32 {
    // SAFETY: NULL or open (caller).
    let Some(cq) = (unsafe { cq.cast_const().as_ref() }) else {
        return STATUS_INVALID_PARAMETER;
    };
    // SAFETY: `wc` holds `max` entries (caller).
    unsafe { poll_into_c(&cq.rings, wc, max) }
}

/// Arms a CQ.
///
/// # Safety
/// `cq` is NULL or open.
pub unsafe fn IvUserReqNotifyCq(cq: *mut IvUserCq, solicited_only: i32) -> NtStatus {
    // SAFETY: NULL or open (caller).
    let Some(cq) = (unsafe { cq.cast_const().as_ref() }) else {
        return STATUS_INVALID_PARAMETER;
    };
    cq.rings.req_notify(&cq.bells, solicited_only != 0);
    STATUS_SUCCESS
}
