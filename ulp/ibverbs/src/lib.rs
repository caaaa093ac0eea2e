//! # irpverbs libibverbs
//!
//! `libibverbs.so.1` over irpverbs: rdma-core's libibverbs ABI — the
//! structures of `<infiniband/verbs.h>` ([`abi`]), the exported functions
//! with rdma-core's symbol versions (`libibverbs.map`), and the inline
//! speed path programs call through `context->ops` — implemented over the
//! driver's interface only:
//! - control verbs are `IOCTL_IV_*` requests through `DeviceIoControl` on
//!   `\\.\irpverbs0` ([`file`]), typed by `irpverbs-verbs`' [`Client`];
//! - post and poll are the user-mode speed path (`include/irpverbs_user.h`:
//!   rings the driver maps into the process with `IOCTL_IV_MAP_RINGS`, and
//!   doorbells), no IOCTL per message;
//! - completion channels are real file descriptors fed by the driver's
//!   `IOCTL_IV_GET_CQ_EVENT`.
//!
//! On a non-Windows host the Win32 subset and the speed-path library are
//! `irpverbs-host-c`'s, over a host-mode driver loaded in each process
//! (`IRPVERBS_ADDR` gives it an address and a UDP wire, so two processes
//! are two hosts). `link.sh` links the staticlib into `libibverbs.so.1`;
//! `docs/ibverbs.md` says how to use it, which variables it reads, and
//! what it does not support.
//!
//! Errors follow rdma-core: functions returning `int` return 0 or an errno
//! (or -1 with `errno` where rdma-core does), functions returning a
//! pointer return NULL with `errno` set; bad pointers rdma-core checks get
//! `EINVAL`, destroying an object in use `EBUSY`.
#![allow(unsafe_code, clippy::missing_safety_doc)]

/// rdma-core's verbs structures (`irpverbs-rdma-abi`, shared with librdmacm).
pub use irpverbs_rdma_abi::verbs as abi;
mod cq;
mod device;
mod events;
pub mod file;
pub mod kern;
mod misc;
pub mod os;
mod pd;
pub mod private;
mod qp;
pub mod standin;

use std::ffi::c_int;

use irpverbs_abi::*;
use irpverbs_verbs::Client;

use abi::ibv_context;
use file::DeviceFile;

/// The errno rdma-core would give for a verb the driver completed with
/// `status`.
#[must_use]
pub fn errno_of(status: NtStatus) -> c_int {
    match status {
        STATUS_SUCCESS => 0,
        STATUS_DEVICE_BUSY => libc::EBUSY,
        STATUS_INSUFFICIENT_RESOURCES => libc::ENOMEM,
        STATUS_NOT_SUPPORTED | STATUS_INVALID_DEVICE_REQUEST => libc::EOPNOTSUPP,
        STATUS_ACCESS_DENIED => libc::EACCES,
        STATUS_ACCESS_VIOLATION => libc::EFAULT,
        STATUS_DEVICE_REMOVED => libc::ENODEV,
        STATUS_INVALID_HANDLE
        | STATUS_INVALID_PARAMETER
        | STATUS_INVALID_PARAMETER_MIX
        | STATUS_INVALID_DEVICE_STATE
        | STATUS_BUFFER_TOO_SMALL
        | STATUS_INFO_LENGTH_MISMATCH => libc::EINVAL,
        _ => libc::EIO,
    }
}

pub(crate) use os::set_errno;

/// NULL with `errno` = `e`.
pub(crate) fn null_with<T>(e: c_int) -> *mut T {
    set_errno(e);
    std::ptr::null_mut()
}

/// A context: the `ibv_context` programs see, then the open device file.
#[repr(C)]
pub(crate) struct Context {
    pub ibv: ibv_context,
    pub file: DeviceFile,
    pub client: Client,
    /// The asynchronous events behind `async_fd`.
    pub async_events: Option<events::Events<IvAsyncEventOut>>,
}

impl Context {
    /// Drops the asynchronous events of the object `handle` the program
    /// has not taken, acknowledging them to the driver (before a destroy).
    pub fn drop_async_of(&self, handle: IvHandle) {
        if let Some(ev) = &self.async_events {
            for e in ev.drop_where(|e| e.handle == handle) {
                let _ = self.client.ack_async_event(e.handle, e.event_type);
            }
        }
    }
}

/// The context behind `ctx`.
///
/// # Safety
/// `ctx` is NULL or from `ibv_open_device`, not closed.
pub(crate) unsafe fn context<'a>(ctx: *mut ibv_context) -> Option<&'a Context> {
    // SAFETY: a context's `ibv_context` is the first field of its
    // `Context` (C contract: it came from `ibv_open_device`).
    unsafe { ctx.cast::<Context>().as_ref() }
}

/// A library object whose C struct (the pointer programs hold) is its
/// first field and names its context.
pub(crate) trait Object {
    /// The `context` member of the C struct.
    fn context_ptr(&self) -> *mut ibv_context;
}

/// The object of type `T` behind the program's pointer `p`, and its
/// context.
///
/// # Safety
/// `p` is NULL or a live object of type `T` handed out by this library
/// (whose context is open).
pub(crate) unsafe fn object_of<'a, T: Object, C>(p: *mut C) -> Option<(&'a T, &'a Context)> {
    // SAFETY: the C struct is the first field of `T` (caller).
    let o = unsafe { p.cast::<T>().as_ref() }?;
    // SAFETY: its context is open (caller).
    let c = unsafe { context(o.context_ptr()) }?;
    Some((o, c))
}

/// A boxed object as the pointer programs hold (the C struct is its first
/// field).
pub(crate) fn leak<T>(object: T) -> *mut T {
    Box::into_raw(Box::new(object))
}

use os::{COND, MUTEX};
