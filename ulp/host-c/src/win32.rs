//! The Win32 subset a C ULP uses, over the host device, with Win32 types and
//! semantics: `CreateFileA`, `DeviceIoControl` (synchronous and OVERLAPPED),
//! `CreateIoCompletionPort`, `GetQueuedCompletionStatus`,
//! `PostQueuedCompletionStatus`, `GetOverlappedResult`, `CancelIoEx`,
//! `CreateEventA`, `SetEvent`, `ResetEvent`, `WaitForSingleObject`,
//! `CloseHandle`, `GetLastError`, `SetLastError`. Declared for C in
//! `include/irpverbs_host.h`; on Windows the same C code uses `<windows.h>`.
//!
//! Opening `\\.\irpverbs0` loads the driver in-process over a soft HCA (once
//! per process). The speed-path library over these handles
//! (`include/irpverbs_user.h`) is [`crate::user`]; the host-only stand-ins
//! for a kernel ULP's file object and `IRP_MN_QUERY_INTERFACE` are
//! [`IrpverbsHostCreateKernelFile`] and [`crate::user::IrpverbsHostQueryInterface`]. `IRPVERBS_ENGINE=thread` runs the soft HCA's firmware on
//! its own thread; `IRPVERBS_VERIFIER=0` turns the verifier off;
//! `IRPVERBS_BACKEND=model` runs the driver over the model HCA (a
//! mini-driver over the PCI seam) instead of the soft HCA;
//! `IRPVERBS_DOORBELLS=page` has user-mode files ring their doorbells
//! through their doorbell page, as on Windows
//! ([`irpverbs_host::UserDoorbells::Page`]); `IRPVERBS_ADDR=<IPv4 or IPv6>`
//! gives the soft HCA's port that address (its GID 0) and a UDP wire on it
//! (RoCEv2, port 4791), so that two processes on one machine are two hosts
//! (without it the port is 127.0.0.1 and has no wire).
//!
//! Semantics kept from Windows: a pended overlapped call returns FALSE with
//! `GetLastError() == ERROR_IO_PENDING`; `OVERLAPPED.Internal` holds
//! `STATUS_PENDING` until completion, then the NTSTATUS, and `InternalHigh`
//! the byte count; every completion of a file associated with a port is
//! queued to the port (unless `hEvent`'s low bit is set), into room taken
//! when the request was issued (a completion allocates nothing; a request
//! issued before its file was associated with a port is not queued to
//! it); a request refused before the driver sees it for lack of memory
//! returns FALSE with `ERROR_NO_SYSTEM_RESOURCES`, leaves its OVERLAPPED
//! pending and queues nothing, as `DeviceIoControl` does when the I/O
//! manager cannot allocate an IRP (every call of this subset takes its
//! memory fallibly, see `docs/kernel-resources.md`); an overlapped
//! call resets its `hEvent` (low bits masked off, as the kernel ignores a
//! handle's two tag bits) when issued and sets it at completion, port or
//! not; a synchronous call on a file opened without `FILE_FLAG_OVERLAPPED`
//! waits.
#![allow(unsafe_code)]
#![allow(non_snake_case, non_camel_case_types, clippy::missing_safety_doc)]

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::ffi::{CStr, c_char, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};

use irpverbs_host::platform::{catch_bugcheck, heap};
use irpverbs_ring::Shared;
use std::time::{Duration, Instant};

use irpverbs_abi::*;

use irpverbs_host::device::{Engine, HostDevice, HostDeviceConfig, HostFile, Ioctl, UserDoorbells};
use irpverbs_host::platform::{HostConfig, RequestHandle, VerifierConfig};
use irpverbs_host::udp::UdpConfig;

/// `HANDLE`.
pub type HANDLE = *mut c_void;
/// `BOOL`.
pub type BOOL = i32;
/// `DWORD`.
pub type DWORD = u32;
/// `ULONG_PTR`.
pub type ULONG_PTR = usize;

/// `OVERLAPPED` (x64 layout).
#[repr(C)]
#[derive(Debug)]
pub struct OVERLAPPED {
    /// The request's NTSTATUS (`STATUS_PENDING` while in flight).
    pub Internal: ULONG_PTR,
    /// Bytes transferred.
    pub InternalHigh: ULONG_PTR,
    /// File offset (unused for IOCTLs).
    pub Offset: DWORD,
    /// File offset high (unused for IOCTLs).
    pub OffsetHigh: DWORD,
    /// Event; its low bit set means "don't queue to the completion port".
    pub hEvent: HANDLE,
}

const TRUE: BOOL = 1;
const FALSE: BOOL = 0;
const INVALID_HANDLE_VALUE: usize = usize::MAX;
const INFINITE: DWORD = 0xFFFF_FFFF;
const GENERIC_READ: DWORD = 0x8000_0000;
const GENERIC_WRITE: DWORD = 0x4000_0000;
const OPEN_EXISTING: DWORD = 3;
const FILE_FLAG_OVERLAPPED: DWORD = 0x4000_0000;

/// Win32 error codes, and `RtlNtStatusToDosError` for the statuses
/// irpverbs completes with (shared with the user-mode libraries).
pub use irpverbs_abi::win32::{error, nt_status_to_win32};

thread_local! {
    static LAST_ERROR: Cell<u32> = const { Cell::new(0) };
}

pub(crate) fn fail<T>(err: u32, value: T) -> T {
    LAST_ERROR.with(|e| e.set(err));
    value
}

/// `GetLastError`.
#[unsafe(no_mangle)]
pub extern "C" fn GetLastError() -> DWORD {
    LAST_ERROR.with(Cell::get)
}

/// `SetLastError`.
#[unsafe(no_mangle)]
pub extern "C" fn SetLastError(err: DWORD) {
    LAST_ERROR.with(|e| e.set(err));
}

/// A raw address that crosses to the completion (which may run on another
/// thread). The Win32 contract keeps the memory valid until completion.
#[derive(Clone, Copy)]
struct Addr(usize);

struct Packet {
    bytes: u32,
    key: usize,
    overlapped: usize,
    status: NtStatus,
}

/// A completion port's queue: its packets, and the room taken for the
/// packets of requests in flight.
#[derive(Default)]
struct Queue {
    packets: VecDeque<Packet>,
    /// Packets the queue has room for beyond `packets`: one per request in
    /// flight on a file associated with the port, taken when the request
    /// is issued (the IRP is the packet on Windows), so that a completion
    /// never allocates.
    reserved: usize,
}

#[derive(Default)]
struct Port {
    queue: Mutex<Queue>,
    cv: Condvar,
    closed: AtomicBool,
}

impl Port {
    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes room for one packet, fallibly.
    fn reserve(&self) -> Result<(), u32> {
        let mut q = self.queue();
        let more = q.reserved + 1;
        q.packets
            .try_reserve(more)
            .map_err(|_| error::NO_SYSTEM_RESOURCES)?;
        q.reserved = more;
        Ok(())
    }

    /// Gives back room [`Self::reserve`] took.
    fn unreserve(&self) {
        let mut q = self.queue();
        q.reserved = q.reserved.saturating_sub(1);
    }

    /// Queues a packet into room [`Self::reserve`] took: allocates nothing.
    fn post_reserved(&self, p: Packet) {
        let mut q = self.queue();
        q.reserved = q.reserved.saturating_sub(1);
        q.packets.push_back(p);
        drop(q);
        self.cv.notify_one();
    }

    /// Queues a packet, fallibly.
    fn post(&self, p: Packet) -> Result<(), u32> {
        self.reserve()?;
        self.post_reserved(p);
        Ok(())
    }
}

/// An overlapped request in flight, for `CancelIoEx`.
#[derive(Default)]
struct Cancel {
    /// The request, once the I/O manager has made it.
    handle: Mutex<Option<RequestHandle>>,
    /// The last `CancelIoEx` call that visited it.
    pass: AtomicU64,
}

type CancelCell = Shared<Cancel>;

/// A port a file is associated with, and its completion key.
type PortKey = (Shared<Port>, usize);

/// Numbers `CancelIoEx` calls.
static CANCEL_PASS: AtomicU64 = AtomicU64::new(1);

pub(crate) struct Win32File {
    /// Taken out (and dropped: cleanup, close) by `CloseHandle`. The
    /// speed-path library holds the read lock while it touches rings.
    pub(crate) file: std::sync::RwLock<Option<HostFile>>,
    /// Objects the speed-path library has open, as (destroy code, handle):
    /// destroying (or resizing) one of them is refused with busy.
    pub(crate) held: Mutex<Vec<(u32, IvHandle)>>,
    overlapped: bool,
    port: Mutex<Option<PortKey>>,
    /// In-flight overlapped requests by OVERLAPPED address, for CancelIoEx.
    inflight: Mutex<HashMap<usize, CancelCell>>,
    done: Condvar,
    done_lock: Mutex<()>,
}

enum Object {
    File(Shared<Win32File>),
    Port(Shared<Port>),
    Event(Event),
}

/// An event object, held in the handle table itself (creating one allocates
/// only the table's slot, fallibly).
struct Event {
    manual: bool,
    signalled: bool,
}

/// Woken whenever an event is set or closed; waiters recheck their event
/// under the handle table's lock.
static EVENTS_CHANGED: Condvar = Condvar::new();

/// `WAIT_OBJECT_0`.
pub const WAIT_OBJECT_0: DWORD = 0;
/// `WAIT_FAILED`.
pub const WAIT_FAILED: DWORD = 0xFFFF_FFFF;

/// The table key of a handle whose two low (tag) bits the kernel ignores,
/// as it does for a wait or an OVERLAPPED's `hEvent`.
fn untagged(h: HANDLE) -> usize {
    h as usize & !3
}

#[derive(Default)]
struct Handles {
    next: usize,
    map: HashMap<usize, Object>,
}

fn handles() -> std::sync::MutexGuard<'static, Handles> {
    static H: OnceLock<Mutex<Handles>> = OnceLock::new();
    H.get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// Test hook: the next `n` handle-table reservations are refused, as an
/// exhausted pool would refuse them.
#[cfg(test)]
pub(crate) static REFUSE_RESERVATIONS: AtomicUsize = AtomicUsize::new(0);

/// Makes room for one more handle, fallibly (a refused allocation is
/// `ERROR_NO_SYSTEM_RESOURCES`, as `STATUS_INSUFFICIENT_RESOURCES` from a
/// full handle table is on Windows).
fn reserve_slot(h: &mut Handles) -> Result<(), u32> {
    #[cfg(test)]
    if REFUSE_RESERVATIONS
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
        .is_ok()
    {
        return Err(error::NO_SYSTEM_RESOURCES);
    }
    h.map.try_reserve(1).map_err(|_| error::NO_SYSTEM_RESOURCES)
}

/// Enters `o` in the handle table; `Err` with the Win32 error when the
/// table cannot grow.
fn insert(o: Object) -> Result<HANDLE, u32> {
    let mut h = handles();
    reserve_slot(&mut h)?;
    h.next += 4;
    let v = 0x1000 + h.next;
    h.map.insert(v, o);
    Ok(v as HANDLE)
}

pub(crate) fn file_of(h: HANDLE) -> Option<Shared<Win32File>> {
    match handles().map.get(&(h as usize)) {
        Some(Object::File(f)) => Some(f.clone()),
        _ => None,
    }
}

fn port_of(h: HANDLE) -> Option<Shared<Port>> {
    match handles().map.get(&(h as usize)) {
        Some(Object::Port(p)) => Some(p.clone()),
        _ => None,
    }
}

/// The loaded device: none until the first open, and none again after
/// [`IrpverbsHostUnload`].
static DEV: Mutex<Option<Arc<HostDevice>>> = Mutex::new(None);

/// [`IrpverbsHostUnload`] ran: the device is gone for good.
static UNLOADED: AtomicBool = AtomicBool::new(false);

/// `IRPVERBS_FAIL_NTH_ALLOC` armed the process-wide injection.
static INJECTING: AtomicBool = AtomicBool::new(false);

/// The device, loaded by the first call (a load that fails is tried again
/// by the next). Once it is loaded, `IRPVERBS_FAIL_NTH_ALLOC=N` arms the
/// process-wide allocation failure injection
/// ([`irpverbs_host::platform::heap::arm_process_injection`]): the Nth
/// allocation the process makes from then on is refused (0: none, count
/// only). On Windows the driver is loaded before any ULP runs, so the
/// count starts with the ULP's first call.
fn device() -> Result<Arc<HostDevice>, NtStatus> {
    let mut dev = DEV.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(d) = dev.as_ref() {
        return Ok(Arc::clone(d));
    }
    if UNLOADED.load(Ordering::Acquire) {
        return Err(STATUS_DEVICE_REMOVED);
    }
    let inject = match std::env::var("IRPVERBS_FAIL_NTH_ALLOC") {
        Ok(v) => match v.parse::<u64>() {
            Ok(n) => Some(n),
            Err(_) => {
                eprintln!("irpverbs: IRPVERBS_FAIL_NTH_ALLOC={v} is not a number");
                return Err(STATUS_INVALID_PARAMETER);
            }
        },
        Err(_) => None,
    };
    let d = load()?;
    *dev = Some(Arc::clone(&d));
    if let Some(n) = inject {
        INJECTING.store(true, Ordering::Release);
        heap::arm_process_injection((n != 0).then_some(n));
    }
    Ok(d)
}

/// Loads the driver over a new host device, as the environment says.
fn load() -> Result<Arc<HostDevice>, NtStatus> {
    {
        let engine = match std::env::var("IRPVERBS_ENGINE").as_deref() {
            Ok("thread") => Engine::Thread,
            _ => Engine::Inline,
        };
        let enabled = std::env::var("IRPVERBS_VERIFIER").map_or(true, |v| v != "0");
        let user_doorbells = match std::env::var("IRPVERBS_DOORBELLS").as_deref() {
            Ok("page") => UserDoorbells::Page,
            _ => UserDoorbells::Direct,
        };
        let backend = match std::env::var("IRPVERBS_BACKEND").as_deref() {
            Ok("model") => irpverbs_host::Backend::Model,
            _ => irpverbs_host::Backend::Soft,
        };
        let addr = match std::env::var("IRPVERBS_ADDR") {
            Ok(a) => match a.parse::<std::net::IpAddr>() {
                Ok(ip) => Some(ip),
                Err(_) => {
                    eprintln!("irpverbs: IRPVERBS_ADDR={a} is not an IPv4 or IPv6 address");
                    return Err(STATUS_INVALID_ADDRESS);
                }
            },
            Err(_) => None,
        };
        let mut config = HostDeviceConfig {
            platform: HostConfig {
                verifier: VerifierConfig {
                    enabled,
                    fail_pool: None,
                    ..VerifierConfig::default()
                },
                ..HostConfig::default()
            },
            engine,
            user_doorbells,
            backend,
            ..HostDeviceConfig::default()
        };
        if let Some(ip) = addr {
            config.soft.ip = ip;
        }
        let dev = HostDevice::new(config)?;
        if let Some(ip) = addr {
            // The port's address is its own: GID 0 and a UDP wire on it
            // (RoCEv2, port 4791), so that processes are hosts.
            if let Err(e) = dev.attach_udp(&UdpConfig::default()) {
                eprintln!("irpverbs: IRPVERBS_ADDR={ip}: UDP wire: {e}");
                dev.unload();
                return Err(STATUS_INVALID_ADDRESS);
            }
            UDP_WIRE.store(true, Ordering::Release);
        }
        Ok(dev)
    }
}

/// The device has a UDP wire (`IRPVERBS_ADDR`): a speed-path poll that
/// finds nothing busy-polls its receive ([`crate::user::IvUserPollCq`]).
pub(crate) static UDP_WIRE: AtomicBool = AtomicBool::new(false);

/// The device name `CreateFileA` opens.
pub const DEVICE_NAME: &str = r"\\.\irpverbs0";

/// `CreateFileA` for `\\.\irpverbs0`.
///
/// # Safety
/// `name` is a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn CreateFileA(
    name: *const c_char,
    access: DWORD,
    _share: DWORD,
    _security: *mut c_void,
    disposition: DWORD,
    flags: DWORD,
    _template: HANDLE,
) -> HANDLE {
    let invalid = INVALID_HANDLE_VALUE as HANDLE;
    if name.is_null() {
        return fail(error::INVALID_PARAMETER, invalid);
    }
    // SAFETY: the caller passes a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(name) };
    if !name.to_bytes().eq_ignore_ascii_case(DEVICE_NAME.as_bytes()) {
        return fail(error::FILE_NOT_FOUND, invalid);
    }
    if disposition != OPEN_EXISTING {
        return fail(error::INVALID_PARAMETER, invalid);
    }
    let mut granted = 0;
    if access & GENERIC_READ != 0 {
        granted |= FILE_READ_ACCESS;
    }
    if access & GENERIC_WRITE != 0 {
        granted |= FILE_WRITE_ACCESS;
    }
    let dev = match device() {
        Ok(d) => d,
        Err(s) => return fail(nt_status_to_win32(s), invalid),
    };
    open_file(flags, || dev.open(granted))
}

/// Opens a file with `open` and enters it in the handle table. The
/// handle's memory (its object and table slot) is taken first: refused, the
/// call fails with `ERROR_NO_SYSTEM_RESOURCES` before the driver sees a
/// create.
fn open_file(flags: DWORD, open: impl FnOnce() -> Result<HostFile, NtStatus>) -> HANDLE {
    let invalid = INVALID_HANDLE_VALUE as HANDLE;
    let Ok(f) = Shared::try_new(Win32File {
        file: std::sync::RwLock::new(None),
        held: Mutex::new(Vec::new()),
        overlapped: flags & FILE_FLAG_OVERLAPPED != 0,
        port: Mutex::new(None),
        inflight: Mutex::new(HashMap::new()),
        done: Condvar::new(),
        done_lock: Mutex::new(()),
    }) else {
        return fail(error::NO_SYSTEM_RESOURCES, invalid);
    };
    if let Err(e) = reserve_slot(&mut handles()) {
        return fail(e, invalid);
    }
    match open() {
        Ok(file) => *f.file.write().unwrap_or_else(PoisonError::into_inner) = Some(file),
        Err(s) => return fail(nt_status_to_win32(s), invalid),
    }
    // A slot taken meanwhile by another thread, and none left: the file
    // is dropped, and the driver runs it down (close).
    insert(Object::File(f)).unwrap_or_else(|e| fail(e, invalid))
}

/// Host only: the stand-in for a kernel ULP's file object (what
/// `IoGetDeviceObjectPointer` gives a driver). `DeviceIoControl` on it sends
/// internal device control requests from kernel mode, as
/// `IoBuildDeviceIoControlRequest(..., InternalDeviceIoControl = TRUE)` does.
/// `flags` may hold `FILE_FLAG_OVERLAPPED` (asynchronous requests, reaped
/// from a completion port like a completion routine would run).
#[unsafe(no_mangle)]
pub extern "C" fn IrpverbsHostCreateKernelFile(flags: DWORD) -> HANDLE {
    let invalid = INVALID_HANDLE_VALUE as HANDLE;
    let dev = match device() {
        Ok(d) => d,
        Err(s) => return fail(nt_status_to_win32(s), invalid),
    };
    open_file(flags, || dev.open_kernel())
}

impl Win32File {
    /// The speed-path library opens `object`: false when the list of held
    /// objects cannot grow (nothing is held).
    pub(crate) fn hold(&self, object: (u32, IvHandle)) -> bool {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if held.try_reserve(1).is_err() {
            return false;
        }
        held.push(object);
        true
    }

    /// The speed-path library closed `object`.
    pub(crate) fn release(&self, object: (u32, IvHandle)) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(i) = held.iter().position(|o| *o == object) {
            held.swap_remove(i);
        }
    }

    /// True when `code` would destroy or re-map an object the speed-path
    /// library has open.
    fn unmaps_held(&self, code: DWORD, input: &[u8]) -> bool {
        let kind = match code {
            IOCTL_IV_RESIZE_CQ => IOCTL_IV_DESTROY_CQ,
            IOCTL_IV_DESTROY_QP | IOCTL_IV_DESTROY_CQ | IOCTL_IV_DESTROY_SRQ => code,
            _ => return false,
        };
        let Some(bytes) = input.get(..8) else {
            return false;
        };
        let handle = IvHandle::from_ne_bytes(bytes.try_into().unwrap_or_default());
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&(kind, handle))
    }
}

/// The `Internal` field as an atomic, so a waiter sees the completion.
///
/// # Safety
/// `ov` points to a live, aligned OVERLAPPED.
unsafe fn internal<'a>(ov: usize) -> &'a AtomicUsize {
    // SAFETY: `Internal` is the first field of an aligned OVERLAPPED, a
    // usize; AtomicUsize has the same size and alignment.
    unsafe { &*(ov as *const AtomicUsize) }
}

/// `DeviceIoControl`.
///
/// # Safety
/// Buffers are valid for their lengths; `overlapped` (if not NULL) and the
/// output buffer stay valid until the request completes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn DeviceIoControl(
    h: HANDLE,
    code: DWORD,
    in_buf: *const c_void,
    in_len: DWORD,
    out_buf: *mut c_void,
    out_len: DWORD,
    returned: *mut DWORD,
    overlapped: *mut OVERLAPPED,
) -> BOOL {
    let Some(f) = file_of(h) else {
        return fail(error::INVALID_HANDLE, FALSE);
    };
    if (in_buf.is_null() && in_len != 0) || (out_buf.is_null() && out_len != 0) {
        return fail(error::NOACCESS, FALSE);
    }
    let input: &[u8] = if in_len == 0 {
        &[]
    } else {
        // SAFETY: the caller's input buffer is valid for `in_len` bytes.
        unsafe { std::slice::from_raw_parts(in_buf.cast::<u8>(), in_len as usize) }
    };
    let out = Addr(out_buf as usize);
    let guard = f.file.read().unwrap_or_else(PoisonError::into_inner);
    let Some(file) = guard.as_ref() else {
        return fail(error::INVALID_HANDLE, FALSE);
    };
    let io: Ioctl<'_> = file.request(code, input, out_len as usize);
    if f.unmaps_held(code, input) {
        // An object the speed-path library still has open: its rings must
        // stay mapped. Refused as a driver refuses a destroy with
        // dependents, completed at once.
        drop(guard);
        // SAFETY: the caller's OVERLAPPED (if any) and `returned` are valid.
        return unsafe { complete_at_once(&f, overlapped, returned, STATUS_DEVICE_BUSY) };
    }
    if !f.overlapped {
        let (status, bytes) = file.call(io);
        let n = bytes.len().min(out_len as usize);
        if n > 0 {
            // SAFETY: the output buffer is valid for `out_len` >= n bytes.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.0 as *mut u8, n) };
        }
        if !returned.is_null() {
            // SAFETY: `returned` is a valid DWORD pointer.
            unsafe { returned.write(n as DWORD) };
        }
        if nt_success(status) {
            SetLastError(error::SUCCESS);
            return TRUE;
        }
        return fail(nt_status_to_win32(status), FALSE);
    }
    if overlapped.is_null() {
        return fail(error::INVALID_PARAMETER, FALSE);
    }
    let ov = Addr(overlapped as usize);
    // SAFETY: `overlapped` is valid until completion (Win32 contract).
    let event = unsafe { (*overlapped).hEvent } as usize;
    if !reset_for_io(event) {
        return fail(error::INVALID_HANDLE, FALSE);
    }
    // As kernel32 does before the system call: a request refused before
    // the driver sees it leaves it pending, with no completion.
    // SAFETY: as above.
    unsafe { internal(ov.0) }.store(STATUS_PENDING as usize, Ordering::Release);
    // SAFETY: as above.
    unsafe { (*overlapped).InternalHigh = 0 };
    // What the request's completion needs, taken now (the IRP is the
    // completion packet on Windows): its cancel cell, its entry among the
    // requests in flight, room for its packet on the port.
    let Some((cell, port)) = take_request_room(&f, ov.0, event) else {
        return fail(error::NO_SYSTEM_RESOURCES, FALSE);
    };
    let fc = f.clone();
    let cell2 = cell.clone();
    let port2 = port.clone();
    let submitted = file.try_submit(io, move |status, info, bytes| {
        let n = bytes.len().min(info);
        if n > 0 {
            // SAFETY: the output buffer stays valid until completion and
            // holds `out_len` >= n bytes (the driver never reports more).
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.0 as *mut u8, n) };
        }
        // SAFETY: the OVERLAPPED stays valid until completion.
        unsafe { (*(ov.0 as *mut OVERLAPPED)).InternalHigh = n };
        // SAFETY: as above; the status is published last.
        unsafe { internal(ov.0) }.store(status as u32 as usize, Ordering::Release);
        fc.forget_request(ov.0, &cell2);
        if let Some((port, key)) = port2 {
            port.post_reserved(Packet {
                bytes: n as u32,
                key,
                overlapped: ov.0,
                status,
            });
        }
        signal_event(event);
        let _g = fc.done_lock.lock().unwrap_or_else(PoisonError::into_inner);
        fc.done.notify_all();
    });
    let submitted = match submitted {
        Ok(s) => s,
        Err(status) => {
            f.forget_request(ov.0, &cell);
            if let Some((port, _)) = port {
                port.unreserve();
            }
            return fail(nt_status_to_win32(status), FALSE);
        }
    };
    if let Some(handle) = submitted.handle {
        *cell.handle.lock().unwrap_or_else(PoisonError::into_inner) = Some(handle);
    }
    if submitted.pended {
        return fail(error::IO_PENDING, FALSE);
    }
    // Completed inside the dispatch routine: the completion already ran.
    // SAFETY: the OVERLAPPED is valid (the caller still owns it).
    let status = unsafe { internal(ov.0) }.load(Ordering::Acquire) as u32 as NtStatus;
    if !returned.is_null() {
        // SAFETY: `returned` is a valid DWORD pointer; the OVERLAPPED is valid.
        unsafe { returned.write((*overlapped).InternalHigh as DWORD) };
    }
    if nt_success(status) {
        SetLastError(error::SUCCESS);
        TRUE
    } else {
        fail(nt_status_to_win32(status), FALSE)
    }
}

/// Takes what an overlapped request at `ov` on `f` needs before it is
/// issued: its cancel cell, entered among the file's requests in flight,
/// and room for its packet on the file's port (`None` when the file has no
/// port or `event`'s low bit keeps the completion off it). `None` when the
/// memory is refused; nothing is then kept.
fn take_request_room(
    f: &Win32File,
    ov: usize,
    event: usize,
) -> Option<(CancelCell, Option<PortKey>)> {
    let cell = Shared::try_new(Cancel::default()).ok()?;
    let port = port_for(f, event).map_or(Ok(None), |(port, key)| {
        port.reserve().map(|()| Some((port, key)))
    });
    let port = port.ok()?;
    let mut inflight = f.inflight.lock().unwrap_or_else(PoisonError::into_inner);
    if inflight.try_reserve(1).is_err() {
        drop(inflight);
        if let Some((port, _)) = port {
            port.unreserve();
        }
        return None;
    }
    inflight.insert(ov, cell.clone());
    Some((cell, port))
}

/// The port a completion of `f` is queued to: its port, unless `event`'s
/// low bit is set.
fn port_for(f: &Win32File, event: usize) -> Option<PortKey> {
    if event & 1 != 0 {
        return None;
    }
    f.port
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

impl Win32File {
    /// The request at `ov` with `cell` is no longer in flight.
    fn forget_request(&self, ov: usize, cell: &CancelCell) {
        let mut inflight = self.inflight.lock().unwrap_or_else(PoisonError::into_inner);
        if inflight.get(&ov).is_some_and(|c| Shared::ptr_eq(c, cell)) {
            inflight.remove(&ov);
        }
    }
}

/// Completes a request without the driver, as a request the driver
/// completed inside its dispatch routine: the status in the OVERLAPPED, a
/// packet to the file's completion port, FALSE with the Win32 error.
///
/// # Safety
/// `overlapped` and `returned` are NULL or valid.
unsafe fn complete_at_once(
    f: &Win32File,
    overlapped: *mut OVERLAPPED,
    returned: *mut DWORD,
    status: NtStatus,
) -> BOOL {
    if f.overlapped && !overlapped.is_null() {
        // SAFETY: the caller's OVERLAPPED is valid.
        let event = unsafe { (*overlapped).hEvent } as usize;
        if !reset_for_io(event) {
            return fail(error::INVALID_HANDLE, FALSE);
        }
        // The packet's room first: refused, the request is not issued.
        let port = port_for(f, event);
        if let Some((port, _)) = &port {
            if let Err(e) = port.reserve() {
                return fail(e, FALSE);
            }
        }
        // SAFETY: as above.
        unsafe { (*overlapped).InternalHigh = 0 };
        // SAFETY: as above.
        unsafe { internal(overlapped as usize) }.store(status as u32 as usize, Ordering::Release);
        if let Some((port, key)) = port {
            port.post_reserved(Packet {
                bytes: 0,
                key,
                overlapped: overlapped as usize,
                status,
            });
        }
        signal_event(event);
    }
    if !returned.is_null() {
        // SAFETY: a valid DWORD pointer.
        unsafe { returned.write(0) };
    }
    fail(nt_status_to_win32(status), FALSE)
}

/// `GetOverlappedResult`.
///
/// # Safety
/// `overlapped` is the one passed to the I/O; `bytes` is valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn GetOverlappedResult(
    h: HANDLE,
    overlapped: *mut OVERLAPPED,
    bytes: *mut DWORD,
    wait: BOOL,
) -> BOOL {
    let Some(f) = file_of(h) else {
        return fail(error::INVALID_HANDLE, FALSE);
    };
    if overlapped.is_null() {
        return fail(error::INVALID_PARAMETER, FALSE);
    }
    let ov = overlapped as usize;
    // SAFETY: the caller's OVERLAPPED is valid.
    let pending = || unsafe { internal(ov) }.load(Ordering::Acquire) == STATUS_PENDING as usize;
    if pending() {
        if wait == FALSE {
            return fail(error::IO_INCOMPLETE, FALSE);
        }
        let mut g = f.done_lock.lock().unwrap_or_else(PoisonError::into_inner);
        while pending() {
            g = f
                .done
                .wait_timeout(g, Duration::from_millis(50))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
    // SAFETY: as above.
    let status = unsafe { internal(ov) }.load(Ordering::Acquire) as u32 as NtStatus;
    if !bytes.is_null() {
        // SAFETY: `bytes` is valid; the OVERLAPPED is valid.
        unsafe { bytes.write((*overlapped).InternalHigh as DWORD) };
    }
    if nt_success(status) {
        SetLastError(error::SUCCESS);
        TRUE
    } else {
        fail(nt_status_to_win32(status), FALSE)
    }
}

/// `CreateIoCompletionPort`: a new port (`file` = INVALID_HANDLE_VALUE,
/// `existing` = NULL), or associates `file` with a port under `key`.
#[unsafe(no_mangle)]
pub extern "C" fn CreateIoCompletionPort(
    file: HANDLE,
    existing: HANDLE,
    key: ULONG_PTR,
    _threads: DWORD,
) -> HANDLE {
    let port_handle = if existing.is_null() {
        let Ok(port) = Shared::try_new(Port::default()) else {
            return fail(error::NO_SYSTEM_RESOURCES, std::ptr::null_mut());
        };
        match insert(Object::Port(port)) {
            Ok(h) => h,
            Err(e) => return fail(e, std::ptr::null_mut()),
        }
    } else {
        existing
    };
    let Some(port) = port_of(port_handle) else {
        return fail(error::INVALID_PARAMETER, std::ptr::null_mut());
    };
    if file as usize == INVALID_HANDLE_VALUE {
        return port_handle;
    }
    let Some(f) = file_of(file) else {
        if existing.is_null() {
            handles().map.remove(&(port_handle as usize));
        }
        return fail(error::INVALID_PARAMETER, std::ptr::null_mut());
    };
    let mut slot = f.port.lock().unwrap_or_else(PoisonError::into_inner);
    if slot.is_some() {
        return fail(error::INVALID_PARAMETER, std::ptr::null_mut());
    }
    *slot = Some((port, key));
    port_handle
}

/// `GetQueuedCompletionStatus`.
///
/// # Safety
/// The out pointers are valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn GetQueuedCompletionStatus(
    port: HANDLE,
    bytes: *mut DWORD,
    key: *mut ULONG_PTR,
    overlapped: *mut *mut OVERLAPPED,
    millis: DWORD,
) -> BOOL {
    let Some(p) = port_of(port) else {
        return fail(error::INVALID_HANDLE, FALSE);
    };
    let deadline =
        (millis != INFINITE).then(|| Instant::now() + Duration::from_millis(millis.into()));
    let mut q = p.queue();
    let packet = loop {
        if let Some(pk) = q.packets.pop_front() {
            break Some(pk);
        }
        if p.closed.load(Ordering::Acquire) {
            break None;
        }
        let step = match deadline {
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    break None;
                }
                (d - now).min(Duration::from_millis(50))
            }
            None => Duration::from_millis(50),
        };
        q =
            p.cv.wait_timeout(q, step)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
    };
    drop(q);
    let Some(pk) = packet else {
        if !overlapped.is_null() {
            // SAFETY: valid out pointer.
            unsafe { overlapped.write(std::ptr::null_mut()) };
        }
        let err = if p.closed.load(Ordering::Acquire) {
            error::ABANDONED_WAIT_0
        } else {
            error::WAIT_TIMEOUT
        };
        return fail(err, FALSE);
    };
    // SAFETY: valid out pointers (checked for NULL).
    unsafe {
        if !bytes.is_null() {
            bytes.write(pk.bytes);
        }
    }
    // SAFETY: as above.
    unsafe {
        if !key.is_null() {
            key.write(pk.key);
        }
    }
    // SAFETY: as above.
    unsafe {
        if !overlapped.is_null() {
            overlapped.write(pk.overlapped as *mut OVERLAPPED);
        }
    }
    if nt_success(pk.status) {
        SetLastError(error::SUCCESS);
        TRUE
    } else {
        fail(nt_status_to_win32(pk.status), FALSE)
    }
}

/// `PostQueuedCompletionStatus`.
#[unsafe(no_mangle)]
pub extern "C" fn PostQueuedCompletionStatus(
    port: HANDLE,
    bytes: DWORD,
    key: ULONG_PTR,
    overlapped: *mut OVERLAPPED,
) -> BOOL {
    let Some(p) = port_of(port) else {
        return fail(error::INVALID_HANDLE, FALSE);
    };
    match p.post(Packet {
        bytes,
        key,
        overlapped: overlapped as usize,
        status: STATUS_SUCCESS,
    }) {
        Ok(()) => TRUE,
        Err(e) => fail(e, FALSE),
    }
}

/// `CancelIoEx`: cancels the request issued with `overlapped` on `h`, or
/// every overlapped request of `h` when `overlapped` is NULL.
#[unsafe(no_mangle)]
pub extern "C" fn CancelIoEx(h: HANDLE, overlapped: *mut OVERLAPPED) -> BOOL {
    let Some(f) = file_of(h) else {
        return fail(error::INVALID_HANDLE, FALSE);
    };
    // One request at a time, taken under the lock and cancelled outside
    // it (a cancel may complete the request, whose completion takes the
    // lock): a list of them would allocate.
    let pass = CANCEL_PASS.fetch_add(1, Ordering::Relaxed);
    let mut any = false;
    loop {
        let next = {
            let inflight = f.inflight.lock().unwrap_or_else(PoisonError::into_inner);
            let visit = |c: &CancelCell| c.pass.swap(pass, Ordering::AcqRel) != pass;
            if overlapped.is_null() {
                inflight.values().find(|c| visit(c)).cloned()
            } else {
                inflight
                    .get(&(overlapped as usize))
                    .filter(|c| visit(c))
                    .cloned()
            }
        };
        let Some(c) = next else {
            break;
        };
        let handle = c
            .handle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(h) = handle {
            if !h.is_completed() {
                h.cancel();
                any = true;
            }
        }
    }
    if any {
        TRUE
    } else {
        fail(error::NOT_FOUND, FALSE)
    }
}

/// Sets the event named by an OVERLAPPED's `hEvent` (tag bits ignored), as
/// the I/O manager does at completion; NULL or a closed event: nothing.
fn signal_event(event: usize) {
    if event & !3 == 0 {
        return;
    }
    let mut h = handles();
    if let Some(Object::Event(e)) = h.map.get_mut(&(event & !3)) {
        e.signalled = true;
        EVENTS_CHANGED.notify_all();
    }
}

/// Resets an OVERLAPPED's event as an overlapped call does when issued.
/// False when `event` is neither NULL nor an event.
fn reset_for_io(event: usize) -> bool {
    if event & !3 == 0 {
        return true;
    }
    match handles().map.get_mut(&(event & !3)) {
        Some(Object::Event(e)) => {
            e.signalled = false;
            true
        }
        _ => false,
    }
}

/// `CreateEventA`: a manual-reset (`manual_reset` TRUE) or auto-reset event,
/// signalled at once when `initial_state` is TRUE. Security attributes and
/// names are not supported: a name is `ERROR_NOT_SUPPORTED`. A refused
/// allocation is NULL with `ERROR_NO_SYSTEM_RESOURCES`.
#[unsafe(no_mangle)]
pub extern "C" fn CreateEventA(
    _security: *mut c_void,
    manual_reset: BOOL,
    initial_state: BOOL,
    name: *const c_char,
) -> HANDLE {
    if !name.is_null() {
        return fail(error::NOT_SUPPORTED, std::ptr::null_mut());
    }
    match insert(Object::Event(Event {
        manual: manual_reset != FALSE,
        signalled: initial_state != FALSE,
    })) {
        Ok(h) => {
            SetLastError(error::SUCCESS);
            h
        }
        Err(e) => fail(e, std::ptr::null_mut()),
    }
}

/// `SetEvent`: signals the event; a manual-reset event releases every
/// waiter and stays signalled, an auto-reset one releases one waiter.
#[unsafe(no_mangle)]
pub extern "C" fn SetEvent(event: HANDLE) -> BOOL {
    set_state(event, true)
}

/// Sets or resets an event: TRUE, or FALSE with `ERROR_INVALID_HANDLE`.
fn set_state(event: HANDLE, signalled: bool) -> BOOL {
    let mut h = handles();
    let Some(Object::Event(e)) = h.map.get_mut(&untagged(event)) else {
        return fail(error::INVALID_HANDLE, FALSE);
    };
    e.signalled = signalled;
    if signalled {
        EVENTS_CHANGED.notify_all();
    }
    TRUE
}

/// `ResetEvent`: makes the event non-signalled.
#[unsafe(no_mangle)]
pub extern "C" fn ResetEvent(event: HANDLE) -> BOOL {
    set_state(event, false)
}

/// `WaitForSingleObject` on an event: `WAIT_OBJECT_0` once it is signalled
/// (an auto-reset event is reset by the wait that takes it),
/// `WAIT_TIMEOUT` after `millis` (`INFINITE`: never; 0: a poll), or
/// `WAIT_FAILED` with `ERROR_INVALID_HANDLE` for a handle that is not an
/// event (or an event closed during the wait).
#[unsafe(no_mangle)]
pub extern "C" fn WaitForSingleObject(handle: HANDLE, millis: DWORD) -> DWORD {
    let key = untagged(handle);
    let deadline =
        (millis != INFINITE).then(|| Instant::now() + Duration::from_millis(millis.into()));
    let mut h = handles();
    loop {
        let Some(Object::Event(e)) = h.map.get_mut(&key) else {
            return fail(error::INVALID_HANDLE, WAIT_FAILED);
        };
        if e.signalled {
            if !e.manual {
                e.signalled = false;
            }
            return WAIT_OBJECT_0;
        }
        let step = match deadline {
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    return error::WAIT_TIMEOUT;
                }
                d - now
            }
            None => Duration::from_secs(3600),
        };
        h = EVENTS_CHANGED
            .wait_timeout(h, step)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}

/// `CloseHandle`: a file runs down (cleanup, then close once its requests
/// completed); a port wakes its waiters with `ERROR_ABANDONED_WAIT_0`; an
/// event is gone (a wait on it ends with `WAIT_FAILED`).
#[unsafe(no_mangle)]
pub extern "C" fn CloseHandle(h: HANDLE) -> BOOL {
    let removed = handles().map.remove(&(h as usize));
    match removed {
        Some(Object::File(f)) => {
            let file = f
                .file
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            drop(file);
            TRUE
        }
        Some(Object::Port(p)) => {
            p.closed.store(true, Ordering::Release);
            p.cv.notify_all();
            TRUE
        }
        Some(Object::Event(_)) => {
            EVENTS_CHANGED.notify_all();
            TRUE
        }
        None => fail(error::INVALID_HANDLE, FALSE),
    }
}

/// Host-only: the driver unloads, as at the device's removal, with every
/// check of the verifier: its unload checks (requests, timers, work items,
/// pool charges still live) and, once its device object is gone, the leak
/// check of its heap ([`HostDevice::remove`]). Every handle must be closed
/// first. TRUE when nothing was found; FALSE with `ERROR_BUSY` while
/// handles are open (nothing is unloaded), `ERROR_DEV_NOT_EXIST` when no
/// device is loaded, `ERROR_IO_DEVICE` when the verifier found something
/// (the bugcheck is printed on stderr). After it the device is gone:
/// `CreateFileA` fails with `ERROR_DEV_NOT_EXIST`.
///
/// It first stops the process-wide injection `IRPVERBS_FAIL_NTH_ALLOC`
/// armed and prints on stderr how many allocations it counted
/// (`irpverbs: N allocations counted`), and which it refused.
#[unsafe(no_mangle)]
pub extern "C" fn IrpverbsHostUnload() -> BOOL {
    if INJECTING.swap(false, Ordering::AcqRel) {
        let report = heap::disarm_process_injection();
        eprintln!("irpverbs: {} allocations counted", report.counted);
    }
    let mut slot = DEV.lock().unwrap_or_else(PoisonError::into_inner);
    let Some(dev) = slot.take() else {
        return fail(error::DEV_NOT_EXIST, FALSE);
    };
    if Arc::strong_count(&dev) != 1 {
        *slot = Some(dev);
        return fail(error::BUSY, FALSE);
    }
    UNLOADED.store(true, Ordering::Release);
    drop(slot);
    match catch_bugcheck(|| HostDevice::remove(dev)) {
        Ok(()) => TRUE,
        Err(check) => {
            eprintln!("irpverbs: unload: {check}");
            fail(error::IO_DEVICE, FALSE)
        }
    }
}

/// Host-only: waits up to `millis` until the driver holds nothing (no file,
/// object, command or pool) and returns TRUE, or FALSE with
/// `ERROR_BUSY`. Lets a C test prove that closing its handles leaked nothing.
#[unsafe(no_mangle)]
pub extern "C" fn IrpverbsHostQuiesce(millis: DWORD) -> BOOL {
    let Ok(dev) = device() else {
        return fail(error::DEV_NOT_EXIST, FALSE);
    };
    match dev.quiesce(Duration::from_millis(millis.into())) {
        Ok(()) if dev.platform().pool_stats().live == 0 => TRUE,
        _ => fail(error::BUSY, FALSE),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One test: the refusal hook is process-wide, and nothing else in this
    /// binary creates handles meanwhile.
    #[test]
    fn events_keep_win32_semantics_and_refuse_without_aborting() {
        let manual = CreateEventA(std::ptr::null_mut(), TRUE, FALSE, std::ptr::null());
        let auto = CreateEventA(std::ptr::null_mut(), FALSE, TRUE, std::ptr::null());
        assert!(!manual.is_null() && !auto.is_null());
        // Initial state: the auto-reset one starts signalled, and a wait takes it.
        assert_eq!(WaitForSingleObject(manual, 0), error::WAIT_TIMEOUT);
        assert_eq!(WaitForSingleObject(auto, 0), WAIT_OBJECT_0);
        assert_eq!(WaitForSingleObject(auto, 10), error::WAIT_TIMEOUT);
        // Manual reset stays signalled for every wait until ResetEvent.
        assert_eq!(SetEvent(manual), TRUE);
        assert_eq!(WaitForSingleObject(manual, 0), WAIT_OBJECT_0);
        assert_eq!(WaitForSingleObject(manual, INFINITE), WAIT_OBJECT_0);
        assert_eq!(ResetEvent(manual), TRUE);
        assert_eq!(WaitForSingleObject(manual, 0), error::WAIT_TIMEOUT);
        // A tagged handle (low bits set) names the same event.
        assert_eq!(SetEvent((auto as usize | 1) as HANDLE), TRUE);
        assert_eq!(
            WaitForSingleObject((auto as usize | 3) as HANDLE, 0),
            WAIT_OBJECT_0
        );
        // An INFINITE wait ends when another thread sets the event, and one
        // SetEvent of an auto-reset event releases exactly one wait.
        let a = auto as usize;
        let waiter = std::thread::spawn(move || WaitForSingleObject(a as HANDLE, INFINITE));
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(SetEvent(auto), TRUE);
        assert_eq!(waiter.join().unwrap(), WAIT_OBJECT_0);
        assert_eq!(WaitForSingleObject(auto, 0), error::WAIT_TIMEOUT);
        // Not an event: WAIT_FAILED and ERROR_INVALID_HANDLE.
        SetLastError(0);
        assert_eq!(WaitForSingleObject(0x7770 as HANDLE, 0), WAIT_FAILED);
        assert_eq!(GetLastError(), error::INVALID_HANDLE);
        let port =
            CreateIoCompletionPort(INVALID_HANDLE_VALUE as HANDLE, std::ptr::null_mut(), 0, 1);
        assert_eq!(WaitForSingleObject(port, 0), WAIT_FAILED);
        assert_eq!(SetEvent(port), FALSE);
        assert_eq!(GetLastError(), error::INVALID_HANDLE);
        // Named events are not supported, and say so.
        let named = CreateEventA(std::ptr::null_mut(), TRUE, FALSE, c"n".as_ptr());
        assert!(named.is_null());
        assert_eq!(GetLastError(), error::NOT_SUPPORTED);
        // A wait on an event closed under it fails rather than hanging.
        let m = manual as usize;
        let waiter = std::thread::spawn(move || WaitForSingleObject(m as HANDLE, INFINITE));
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(CloseHandle(manual), TRUE);
        assert_eq!(waiter.join().unwrap(), WAIT_FAILED);
        assert_eq!(CloseHandle(manual), FALSE);
        assert_eq!(ResetEvent(manual), FALSE);
        assert_eq!(GetLastError(), error::INVALID_HANDLE);
        // A refused allocation fails the call, as Windows does.
        REFUSE_RESERVATIONS.store(2, Ordering::Release);
        let refused = CreateEventA(std::ptr::null_mut(), TRUE, FALSE, std::ptr::null());
        assert!(refused.is_null());
        assert_eq!(GetLastError(), error::NO_SYSTEM_RESOURCES);
        let refused =
            CreateIoCompletionPort(INVALID_HANDLE_VALUE as HANDLE, std::ptr::null_mut(), 0, 1);
        assert!(refused.is_null());
        assert_eq!(GetLastError(), error::NO_SYSTEM_RESOURCES);
        let again = CreateEventA(std::ptr::null_mut(), FALSE, FALSE, std::ptr::null());
        assert!(!again.is_null());
        for h in [again, auto, port] {
            assert_eq!(CloseHandle(h), TRUE);
        }
    }
}
