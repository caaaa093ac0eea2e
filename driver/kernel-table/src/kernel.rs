//! The kernel ULPs' direct-call interface: a `#[repr(C)]` function table
//! (`include/irpverbs_kernel.h`) that a kernel ULP obtains with
//! `IRP_MN_QUERY_INTERFACE` for [`IV_KERNEL_INTERFACE_GUID`]
//! (irpverbs.sys registers it with `WdfDeviceAddQueryInterface`; host mode
//! hands it out from `HostDevice::query_interface`).
//!
//! A kernel ULP creates its objects with the same control IOCTLs as user
//! mode, sent as internal device control IRPs; the create responses carry
//! the rings (kernel addresses). It then *opens* each QP, CQ and SRQ in the
//! table (`open_qp` builds a small nonpaged object from the response) and
//! posts and polls through the table: direct calls, no IRP, callable at IRQL
//! <= DISPATCH_LEVEL, never blocking; only `open_*` allocates (the global
//! allocator: nonpaged pool in the kernel). It closes the object in the
//! table before it destroys the driver object.
//!
//! # IRQL
//! Each opened queue (a QP's send queue, its receive queue, an SRQ, a CQ)
//! has a spin lock of the platform's ([`SpeedLock`]: a `KSPIN_LOCK` taken
//! with `KeAcquireSpinLockRaiseToDpc`), and `post_send`, `post_recv`,
//! `post_srq_recv` and `poll_cq` hold it while they touch the ring, at
//! DISPATCH_LEVEL whatever IRQL the caller came in at; `req_notify_cq`
//! writes the arm word at DISPATCH_LEVEL too. So a ULP may post to one
//! queue from a thread at PASSIVE_LEVEL and from a DPC on the same
//! processor: the DPC cannot run while the thread holds the queue (its
//! IRQL keeps the DPC off the processor), where a lock that left IRQL
//! alone would spin forever in the DPC. The doorbell is rung after the
//! lock is released, at the caller's IRQL. The ring's own lock, taken
//! inside, is then never contended on one processor; the platform may
//! give it a check ([`SpeedPlatform::lock_check`]: the host verifier's,
//! which bugchecks 0xC4/0x40 for a kernel queue's lock taken below
//! DISPATCH_LEVEL).
//!
//! The table begins with the `INTERFACE` header Windows defines (`Size`,
//! `Version`, `Context`, `InterfaceReference`, `InterfaceDereference`); the
//! interface is returned referenced, and the ULP dereferences it when done.
//! The context holds the [`Doorbells`] (reference counted, allocated
//! fallibly: a query that cannot get its context fails with
//! `STATUS_INSUFFICIENT_RESOURCES`), so a ULP still holding a reference
//! after the device went away calls into live memory.
//!
//! # CEP callbacks (version 2)
//! A kernel ULP may take a CEP's events through a callback instead of
//! `IOCTL_IV_GET_CEP_EVENT` (seed 003's polling model):
//! `register_cep_callback` names the CEP (by the ULP's file object and the
//! CEP's handle) and a function the device calls at DISPATCH_LEVEL when the
//! CEP has events; the function only says "reap now", and the ULP reaps
//! with `poll_cep_event` until it returns 0 (which re-arms the callback).
//! `unregister_cep_callback` is a rundown: when it returns, the function is
//! not running and is never called again. The device behind the table does
//! the work ([`CepCalls`]: the driver's CM).
//!
//! # Versions
//! [`IV_KERNEL_INTERFACE_VERSION`] is 2; version 1 is the table up to
//! `req_notify_cq` ([`IV_KERNEL_INTERFACE_V1_SIZE`] bytes). Fields are only
//! ever appended, with a new version. A query for version `v` with `Size`
//! bytes is served when `Size` holds that version's table
//! ([`query_layout`], used by [`serve_query`] and by irpverbs.sys): the caller gets that prefix, with `size` and
//! `version` set to what it asked for, so a ULP built against version 1
//! keeps working unchanged.

use alloc::boxed::Box;
use core::ffi::c_void;
use core::mem::{align_of, offset_of, size_of};

use irpverbs_abi::{
    IV_SEND_INLINE, IvCepEventOut, IvCqe, IvCreateQpOut, IvCreateSrqOut, IvHandle, IvRingMap,
    IvSge, Layout, NtStatus, STATUS_INSUFFICIENT_RESOURCES, STATUS_INVALID_PARAMETER,
    STATUS_NOT_SUPPORTED, STATUS_SUCCESS,
};
use irpverbs_ring::Shared;
use irpverbs_ring::wq::{LockCheck, MAX_SGE};

use crate::speed::{AsNtStatus, CqRings, Doorbells, PostError, QpRings, SendWr, SrqRings};

/// `IvKernelInterface::version` of this table.
pub const IV_KERNEL_INTERFACE_VERSION: u16 = 2;

/// The size of version 1's table (up to `req_notify_cq`).
pub const IV_KERNEL_INTERFACE_V1_SIZE: u16 =
    offset_of!(IvKernelInterface, register_cep_callback) as u16;

/// The GUID a kernel ULP passes to `IRP_MN_QUERY_INTERFACE`:
/// `{17EE45AE-E023-4F3B-81FC-6784694953D3}`, as `GUID`'s `Data1`, `Data2`,
/// `Data3` and `Data4`.
pub const IV_KERNEL_INTERFACE_GUID: (u32, u16, u16, [u8; 8]) = (
    0x17EE_45AE,
    0xE023,
    0x4F3B,
    [0x81, 0xFC, 0x67, 0x84, 0x69, 0x49, 0x53, 0xD3],
);

/// A send work request as the table takes it (C: `IvKernelSendWr`, and
/// `IvUserSendWr` in the user-mode library). The fields mirror
/// [`irpverbs_abi::IvSendWqe`]; the gather list or the inline data are pointed to.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct IvKernelSendWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// `IV_WR_*`.
    pub opcode: u8,
    /// `IV_SEND_*`; with `IV_SEND_INLINE` the data is `inline_data`.
    pub flags: u8,
    /// Entries of `sg_list` (at most the QP's `max_send_sge`).
    pub num_sge: u16,
    /// Immediate data, or the rkey to invalidate.
    pub imm_or_inv: u32,
    /// RDMA / atomic: remote address.
    pub remote_addr: u64,
    /// RDMA / atomic: remote key.
    pub rkey: u32,
    /// With `IV_SEND_INLINE`: bytes at `inline_data`.
    pub inline_len: u32,
    /// Atomic: compare or add operand.
    pub compare_add: u64,
    /// Atomic: swap operand.
    pub swap: u64,
    /// UD: address handle number (`IvCreateAhOut::ahn`).
    pub ahn: u32,
    /// UD: destination QP.
    pub remote_qpn: u32,
    /// UD: destination Q_Key.
    pub remote_qkey: u32,
    /// Reserved, zero.
    pub reserved: u32,
    /// The gather list (`num_sge` entries), when not inline.
    pub sg_list: *const IvSge,
    /// The inline data (`inline_len` bytes), with `IV_SEND_INLINE`.
    pub inline_data: *const c_void,
}

impl Default for IvKernelSendWr {
    fn default() -> Self {
        Self {
            wr_id: 0,
            opcode: 0,
            flags: 0,
            num_sge: 0,
            imm_or_inv: 0,
            remote_addr: 0,
            rkey: 0,
            inline_len: 0,
            compare_add: 0,
            swap: 0,
            ahn: 0,
            remote_qpn: 0,
            remote_qkey: 0,
            reserved: 0,
            sg_list: core::ptr::null(),
            inline_data: core::ptr::null(),
        }
    }
}

/// A receive work request (C: `IvKernelRecvWr`, `IvUserRecvWr`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct IvKernelRecvWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The scatter list (`num_sge` entries).
    pub sg_list: *const IvSge,
    /// Entries of `sg_list`.
    pub num_sge: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

impl Default for IvKernelRecvWr {
    fn default() -> Self {
        Self {
            wr_id: 0,
            sg_list: core::ptr::null(),
            num_sge: 0,
            reserved: 0,
        }
    }
}

/// A spin lock of the platform's that raises IRQL: on Windows a
/// `KSPIN_LOCK` acquired with `KeAcquireSpinLockRaiseToDpc` and released
/// with `KeReleaseSpinLock`; in host mode a verifier-checked spin lock.
/// Each queue the table opens has one (see the module's IRQL section).
pub trait SpeedLock: Send + Sync {
    /// Acquires the lock, raising to DISPATCH_LEVEL; returns the IRQL to
    /// give back to [`SpeedLock::release`].
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    fn acquire(&self) -> u8;
    /// Releases the lock and goes back to `old`, what
    /// [`SpeedLock::acquire`] returned.
    ///
    /// IRQL: DISPATCH_LEVEL (the holder's).
    fn release(&self, old: u8);
}

/// What the table takes from the platform besides the doorbells.
pub trait SpeedPlatform: Send + Sync {
    /// A new lock for one queue of an object being opened.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES`: the open fails.
    fn new_lock(&self) -> Result<Box<dyn SpeedLock>, NtStatus>;

    /// A check the rings' own locks run each time they are taken (the host
    /// verifier's: IRQL >= DISPATCH_LEVEL); `None` by default.
    fn lock_check(&self) -> Option<LockCheck> {
        None
    }
}

/// One queue's lock, held for the guard's life.
struct Held<'a> {
    lock: &'a dyn SpeedLock,
    old: u8,
}

impl<'a> Held<'a> {
    #[inline]
    fn new(lock: &'a dyn SpeedLock) -> Self {
        Self {
            old: lock.acquire(),
            lock,
        }
    }
}

impl Drop for Held<'_> {
    #[inline]
    fn drop(&mut self) {
        self.lock.release(self.old);
    }
}

/// An opened QP (opaque to C): its rings and a lock per queue.
pub struct IvKernelQp {
    rings: QpRings,
    sq_lock: Box<dyn SpeedLock>,
    rq_lock: Box<dyn SpeedLock>,
}
/// An opened CQ (opaque to C).
pub struct IvKernelCq {
    rings: CqRings,
    lock: Box<dyn SpeedLock>,
}
/// An opened SRQ (opaque to C).
pub struct IvKernelSrq {
    rings: SrqRings,
    lock: Box<dyn SpeedLock>,
}

macro_rules! opened {
    ($($t:ident($r:ident)),*) => {$(
        impl core::fmt::Debug for $t {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.debug_struct(stringify!($t))
                    .field("rings", &self.rings)
                    .finish_non_exhaustive()
            }
        }
        impl $t {
            /// The ring views.
            #[must_use]
            pub fn rings(&self) -> &$r {
                &self.rings
            }
        }
    )*};
}
opened!(
    IvKernelQp(QpRings),
    IvKernelCq(CqRings),
    IvKernelSrq(SrqRings)
);

/// `PINTERFACE_REFERENCE` / `PINTERFACE_DEREFERENCE`.
pub type IvInterfaceReferenceFn = unsafe extern "C" fn(context: *mut c_void);
/// `open_qp`.
pub type IvKernelOpenQpFn = unsafe extern "C" fn(
    context: *mut c_void,
    create: *const IvCreateQpOut,
    qp: *mut *mut IvKernelQp,
) -> NtStatus;
/// `close_qp`.
pub type IvKernelCloseQpFn = unsafe extern "C" fn(context: *mut c_void, qp: *mut IvKernelQp);
/// `open_cq`.
pub type IvKernelOpenCqFn = unsafe extern "C" fn(
    context: *mut c_void,
    cqn: u32,
    ring: *const IvRingMap,
    cq: *mut *mut IvKernelCq,
) -> NtStatus;
/// `close_cq`.
pub type IvKernelCloseCqFn = unsafe extern "C" fn(context: *mut c_void, cq: *mut IvKernelCq);
/// `open_srq`.
pub type IvKernelOpenSrqFn = unsafe extern "C" fn(
    context: *mut c_void,
    create: *const IvCreateSrqOut,
    srq: *mut *mut IvKernelSrq,
) -> NtStatus;
/// `close_srq`.
pub type IvKernelCloseSrqFn = unsafe extern "C" fn(context: *mut c_void, srq: *mut IvKernelSrq);
/// `post_send`.
pub type IvKernelPostSendFn = unsafe extern "C" fn(
    context: *mut c_void,
    qp: *mut IvKernelQp,
    wr: *const IvKernelSendWr,
) -> NtStatus;
/// `post_recv`.
pub type IvKernelPostRecvFn = unsafe extern "C" fn(
    context: *mut c_void,
    qp: *mut IvKernelQp,
    wr: *const IvKernelRecvWr,
) -> NtStatus;
/// `post_srq_recv`.
pub type IvKernelPostSrqRecvFn = unsafe extern "C" fn(
    context: *mut c_void,
    srq: *mut IvKernelSrq,
    wr: *const IvKernelRecvWr,
) -> NtStatus;
/// `poll_cq`.
pub type IvKernelPollCqFn = unsafe extern "C" fn(
    context: *mut c_void,
    cq: *mut IvKernelCq,
    wc: *mut IvCqe,
    max: u32,
) -> i32;
/// `req_notify_cq`.
pub type IvKernelReqNotifyCqFn = unsafe extern "C" fn(
    context: *mut c_void,
    cq: *mut IvKernelCq,
    solicited_only: i32,
) -> NtStatus;

/// A kernel ULP's CEP callback (C: `IvKernelCepCallbackFn`): the CEP `cep`
/// (whose `user_context` is given too) has events; reap them with
/// `poll_cep_event`. Called at DISPATCH_LEVEL, one at a time per device,
/// with no lock of the driver's held; it must not block.
pub type IvKernelCepCallbackFn =
    unsafe extern "C" fn(callback_context: *mut c_void, cep: IvHandle, user_context: u64);
/// `register_cep_callback`.
pub type IvKernelRegisterCepCallbackFn = unsafe extern "C" fn(
    context: *mut c_void,
    file_object: *mut c_void,
    cep: IvHandle,
    callback: Option<IvKernelCepCallbackFn>,
    callback_context: *mut c_void,
) -> NtStatus;
/// `unregister_cep_callback`.
pub type IvKernelUnregisterCepCallbackFn =
    unsafe extern "C" fn(context: *mut c_void, file_object: *mut c_void, cep: IvHandle) -> NtStatus;
/// `poll_cep_event`.
pub type IvKernelPollCepEventFn = unsafe extern "C" fn(
    context: *mut c_void,
    file_object: *mut c_void,
    cep: IvHandle,
    event: *mut IvCepEventOut,
) -> i32;

/// The direct-call function table (C: `IvKernelInterface`). See
/// `include/irpverbs_kernel.h` for each function's contract.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct IvKernelInterface {
    /// `INTERFACE.Size`: `sizeof(IvKernelInterface)`.
    pub size: u16,
    /// `INTERFACE.Version`: [`IV_KERNEL_INTERFACE_VERSION`].
    pub version: u16,
    /// `INTERFACE.Context`: the first argument of every function.
    pub context: *mut c_void,
    /// `INTERFACE.InterfaceReference`.
    pub interface_reference: IvInterfaceReferenceFn,
    /// `INTERFACE.InterfaceDereference`: the ULP calls it when done.
    pub interface_dereference: IvInterfaceReferenceFn,
    /// Opens a QP from its create response.
    pub open_qp: IvKernelOpenQpFn,
    /// Closes an opened QP (before destroying it).
    pub close_qp: IvKernelCloseQpFn,
    /// Opens a CQ from its number and ring (create or resize response).
    pub open_cq: IvKernelOpenCqFn,
    /// Closes an opened CQ (before destroying or resizing it).
    pub close_cq: IvKernelCloseCqFn,
    /// Opens an SRQ from its create response.
    pub open_srq: IvKernelOpenSrqFn,
    /// Closes an opened SRQ (before destroying it).
    pub close_srq: IvKernelCloseSrqFn,
    /// `post_send`.
    pub post_send: IvKernelPostSendFn,
    /// `post_recv`.
    pub post_recv: IvKernelPostRecvFn,
    /// `post_srq_recv`.
    pub post_srq_recv: IvKernelPostSrqRecvFn,
    /// `poll_cq`: completions taken (>= 0) or a failure NTSTATUS (< 0).
    pub poll_cq: IvKernelPollCqFn,
    /// `req_notify_cq`.
    pub req_notify_cq: IvKernelReqNotifyCqFn,
    /// Version 2: registers a CEP callback.
    pub register_cep_callback: IvKernelRegisterCepCallbackFn,
    /// Version 2: unregisters a CEP callback (a rundown).
    pub unregister_cep_callback: IvKernelUnregisterCepCallbackFn,
    /// Version 2: takes a CEP's next event: 1, 0 (none; re-arms the
    /// callback) or a failure NTSTATUS (< 0).
    pub poll_cep_event: IvKernelPollCepEventFn,
}

// SAFETY: the context is a `Shared<Context>` (Send + Sync) shared by
// design; the table itself is plain data.
unsafe impl Send for IvKernelInterface {}
// SAFETY: as above.
unsafe impl Sync for IvKernelInterface {}

/// A registered CEP callback: the C function and its context, as the ULP
/// gave them to `register_cep_callback`.
#[derive(Clone, Copy, Debug)]
pub struct CepNotify {
    function: IvKernelCepCallbackFn,
    context: *mut c_void,
}

// SAFETY: the ULP's contract for `register_cep_callback`: the function may
// be called on any processor, with its context, until unregistered.
unsafe impl Send for CepNotify {}
// SAFETY: as above (the device only copies and calls it).
unsafe impl Sync for CepNotify {}

impl CepNotify {
    /// The callback as two words, for a device that keeps callbacks
    /// without allocating ([`CepNotify::notify_words`] calls it).
    #[must_use]
    pub fn to_words(self) -> [usize; 2] {
        [self.function as usize, self.context as usize]
    }

    /// Calls the callback `words` holds ([`CepNotify::to_words`]).
    ///
    /// # Safety
    /// `words` came from [`CepNotify::to_words`], and the callback is still
    /// registered (the device's rundown keeps that true).
    pub unsafe fn notify_words(words: [usize; 2], cep: IvHandle, user_context: u64) {
        // SAFETY: the first word is a function of this type (caller).
        let function = unsafe { core::mem::transmute::<usize, IvKernelCepCallbackFn>(words[0]) };
        // SAFETY: a registered callback may be called with its context at
        // DISPATCH_LEVEL (the C contract).
        unsafe { function(words[1] as *mut c_void, cep, user_context) };
    }
}

/// What the table's CEP functions ask of the device: its CM, reached by
/// the kernel ULP's file object (`PFILE_OBJECT` on Windows; the host's
/// stand-in in host mode) and the CEP's handle in that file.
///
/// IRQL: <= DISPATCH_LEVEL, never blocking (but see `set_cep_callback`).
pub trait CepCalls: Send + Sync {
    /// Sets (`Some`) or clears (`None`) the CEP's callback. Returns once
    /// the previous callback is not running and will never be called
    /// again (the rundown).
    ///
    /// # Errors
    /// `STATUS_INVALID_HANDLE` (not a file of the device, or no such CEP
    /// in it), `STATUS_DEVICE_BUSY` (an `IOCTL_IV_GET_CEP_EVENT` is pended
    /// on the CEP).
    fn set_cep_callback(
        &self,
        file_object: *mut c_void,
        cep: IvHandle,
        callback: Option<CepNotify>,
    ) -> Result<(), NtStatus>;

    /// The CEP's next event; `None` re-arms the callback.
    ///
    /// # Errors
    /// As [`CepCalls::set_cep_callback`].
    fn poll_cep_event(
        &self,
        file_object: *mut c_void,
        cep: IvHandle,
    ) -> Result<Option<IvCepEventOut>, NtStatus>;
}

/// What `context` points to: the device's doorbells and the platform's
/// locks, reference counted ([`Shared`]: `Arc`'s counting, allocated
/// fallibly), each boxed fallibly.
struct Context {
    doorbells: Box<dyn Doorbells>,
    platform: Box<dyn SpeedPlatform>,
    /// The device's CM, for the CEP functions (none: they return
    /// `STATUS_NOT_SUPPORTED`).
    ceps: Option<Box<dyn CepCalls>>,
}

/// The table over `doorbells`, with `platform`'s locks, referenced once:
/// the receiver calls `interface_dereference(context)` when it no longer
/// uses it (and no longer uses any object it opened through it). Its CEP
/// functions return `STATUS_NOT_SUPPORTED` ([`interface_with_cm`] gives
/// them a CM).
///
/// IRQL: <= DISPATCH_LEVEL (the context comes from the global allocator:
/// nonpaged pool in the kernel).
///
/// # Errors
/// `STATUS_INSUFFICIENT_RESOURCES` when the context cannot be allocated
/// (`doorbells` and `platform` are dropped; nothing else changes).
pub fn interface<D, P>(doorbells: D, platform: P) -> Result<IvKernelInterface, NtStatus>
where
    D: Doorbells + 'static,
    P: SpeedPlatform + 'static,
{
    build(doorbells, platform, None)
}

/// [`interface`] whose CEP functions reach the device's CM through `ceps`.
///
/// IRQL: <= DISPATCH_LEVEL.
///
/// # Errors
/// As [`interface`].
pub fn interface_with_cm<D, P, C>(
    doorbells: D,
    platform: P,
    ceps: C,
) -> Result<IvKernelInterface, NtStatus>
where
    D: Doorbells + 'static,
    P: SpeedPlatform + 'static,
    C: CepCalls + 'static,
{
    let ceps: Box<dyn CepCalls> =
        irpverbs_ring::try_box(ceps).map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
    build(doorbells, platform, Some(ceps))
}

fn build<D, P>(
    doorbells: D,
    platform: P,
    ceps: Option<Box<dyn CepCalls>>,
) -> Result<IvKernelInterface, NtStatus>
where
    D: Doorbells + 'static,
    P: SpeedPlatform + 'static,
{
    let doorbells: Box<dyn Doorbells> =
        irpverbs_ring::try_box(doorbells).map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
    let platform: Box<dyn SpeedPlatform> =
        irpverbs_ring::try_box(platform).map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
    let context = Shared::try_new(Context {
        doorbells,
        platform,
        ceps,
    })
    .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
    let context = Shared::into_raw(context);
    Ok(IvKernelInterface {
        size: size_of::<IvKernelInterface>() as u16,
        version: IV_KERNEL_INTERFACE_VERSION,
        context: context.cast_mut().cast(),
        interface_reference,
        interface_dereference,
        open_qp,
        close_qp,
        open_cq,
        close_cq,
        open_srq,
        close_srq,
        post_send,
        post_recv,
        post_srq_recv,
        poll_cq,
        req_notify_cq,
        register_cep_callback,
        unregister_cep_callback,
        poll_cep_event,
    })
}

/// The table layouts a query can be served: each version's prefix of
/// [`IvKernelInterface`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableLayout {
    /// Version 1: up to `req_notify_cq` ([`IV_KERNEL_INTERFACE_V1_SIZE`]).
    V1,
    /// Version 2: the whole table (adds the CEP callbacks).
    V2,
}

impl TableLayout {
    /// `INTERFACE.Size` of this layout.
    pub fn size(self) -> u16 {
        match self {
            Self::V1 => IV_KERNEL_INTERFACE_V1_SIZE,
            Self::V2 => size_of::<IvKernelInterface>() as u16,
        }
    }

    /// `INTERFACE.Version` of this layout.
    pub fn version(self) -> u16 {
        match self {
            Self::V1 => 1,
            Self::V2 => IV_KERNEL_INTERFACE_VERSION,
        }
    }
}

/// Which layout a query for `version` with a buffer of `size` bytes is
/// served: the one `version` names, when `size` holds it. The one rule
/// for every way the table is handed out (host mode's query and
/// irpverbs.sys's `IRP_MN_QUERY_INTERFACE`), so that they cannot differ.
///
/// IRQL: any.
///
/// # Errors
/// `STATUS_INVALID_PARAMETER`: a version other than 1 and 2, or a `size`
/// smaller than that version's table.
pub fn query_layout(version: u16, size: u16) -> Result<TableLayout, NtStatus> {
    let layout = match version {
        1 => TableLayout::V1,
        IV_KERNEL_INTERFACE_VERSION => TableLayout::V2,
        _ => return Err(STATUS_INVALID_PARAMETER),
    };
    if size < layout.size() {
        return Err(STATUS_INVALID_PARAMETER);
    }
    Ok(layout)
}

/// Serves an `IRP_MN_QUERY_INTERFACE` for the table: copies the prefix of
/// `table` that `version` defines into `out` (`size` bytes the caller
/// gave), with `size` and `version` set to that version's. The copy holds
/// no reference of its own (the caller takes one for the receiver).
///
/// # Safety
/// `out` is null or valid for `size` bytes of writes.
///
/// # Errors
/// `STATUS_INVALID_PARAMETER`: a null `out`, a version other than 1 and
/// 2, or a `size` smaller than that version's table.
pub unsafe fn serve_query(
    table: &IvKernelInterface,
    size: u16,
    version: u16,
    out: *mut IvKernelInterface,
) -> Result<(), NtStatus> {
    let layout = query_layout(version, size)?;
    if out.is_null() {
        return Err(STATUS_INVALID_PARAMETER);
    }
    let need = layout.size();
    let mut copy = *table;
    copy.size = need;
    copy.version = layout.version();
    // SAFETY: `out` is valid for `size` >= `need` bytes (caller); `copy`
    // is a live table of at least `need` bytes; they do not overlap.
    unsafe {
        core::ptr::copy_nonoverlapping(
            (&raw const copy).cast::<u8>(),
            out.cast::<u8>(),
            usize::from(need),
        );
    }
    Ok(())
}

/// The context behind `context`.
///
/// # Safety
/// `context` is null or came from [`interface`] and is still referenced.
unsafe fn context<'a>(context: *mut c_void) -> Option<&'a Context> {
    // SAFETY: a non-null context points to a live `Context` (caller).
    unsafe { context.cast::<Context>().cast_const().as_ref() }
}

/// The doorbells behind `context`.
///
/// # Safety
/// As [`context`].
unsafe fn doorbells<'a>(ctx: *mut c_void) -> Option<&'a dyn Doorbells> {
    // SAFETY: forwarded from the caller.
    Some(&*unsafe { context(ctx) }?.doorbells)
}

impl Context {
    /// A lock for one queue being opened.
    fn lock(&self) -> Result<Box<dyn SpeedLock>, NtStatus> {
        self.platform.new_lock()
    }
}

unsafe extern "C" fn interface_reference(context: *mut c_void) {
    if !context.is_null() {
        // SAFETY: the context came from `Shared::into_raw` in `interface`
        // and the caller holds a reference, so the count is at least 1;
        // taken back here only to be cloned and given up again.
        let held = core::mem::ManuallyDrop::new(unsafe {
            Shared::from_raw(context.cast::<Context>().cast_const())
        });
        core::mem::forget(Shared::clone(&held));
    }
}

unsafe extern "C" fn interface_dereference(context: *mut c_void) {
    if !context.is_null() {
        // SAFETY: as above; this gives back one reference the caller held.
        drop(unsafe { Shared::from_raw(context.cast::<Context>().cast_const()) });
    }
}

/// Stores a boxed object at `out`; `STATUS_INSUFFICIENT_RESOURCES` (and
/// `out` untouched, `value` dropped) when the box is refused.
///
/// # Safety
/// `out` is valid for a pointer write.
unsafe fn store<T>(out: *mut *mut T, value: T) -> NtStatus {
    let Ok(boxed) = irpverbs_ring::try_box(value) else {
        return STATUS_INSUFFICIENT_RESOURCES;
    };
    // SAFETY: the caller passes a valid out pointer.
    unsafe { out.write(Box::into_raw(boxed)) };
    STATUS_SUCCESS
}

unsafe extern "C" fn open_qp(
    context: *mut c_void,
    create: *const IvCreateQpOut,
    qp: *mut *mut IvKernelQp,
) -> NtStatus {
    // SAFETY: the context is the table's, referenced (C contract).
    let Some(ctx) = (unsafe { self::context(context) }) else {
        return STATUS_INVALID_PARAMETER;
    };
    if qp.is_null() {
        return STATUS_INVALID_PARAMETER;
    }
    // SAFETY: a non-null `create` points to a response (the C contract).
    let Some(create) = (unsafe { create.as_ref() }) else {
        return STATUS_INVALID_PARAMETER;
    };
    // SAFETY: the C contract of open_qp: the response is the caller's,
    // unmodified, and it closes the QP before destroying it.
    let opened = unsafe { QpRings::from_create(create) }.and_then(|mut rings| {
        if let Some(check) = ctx.platform.lock_check() {
            rings.set_lock_check(check);
        }
        Ok(IvKernelQp {
            rings,
            sq_lock: ctx.lock()?,
            rq_lock: ctx.lock()?,
        })
    });
    match opened {
        // SAFETY: `qp` is a valid out pointer (checked non-null; C contract).
        Ok(opened) => unsafe { store(qp, opened) },
        Err(status) => status,
    }
}

unsafe extern "C" fn close_qp(_context: *mut c_void, qp: *mut IvKernelQp) {
    if !qp.is_null() {
        // SAFETY: `qp` came from `open_qp` (Box::into_raw) and is closed once.
        drop(unsafe { Box::from_raw(qp) });
    }
}

unsafe extern "C" fn open_cq(
    context: *mut c_void,
    cqn: u32,
    ring: *const IvRingMap,
    cq: *mut *mut IvKernelCq,
) -> NtStatus {
    // SAFETY: the context is the table's, referenced (C contract).
    let Some(ctx) = (unsafe { self::context(context) }) else {
        return STATUS_INVALID_PARAMETER;
    };
    if cq.is_null() {
        return STATUS_INVALID_PARAMETER;
    }
    // SAFETY: a non-null `ring` points to a ring map (the C contract).
    let Some(ring) = (unsafe { ring.as_ref() }) else {
        return STATUS_INVALID_PARAMETER;
    };
    // SAFETY: the C contract of open_cq: the ring is the CQ's current one,
    // and the caller closes the CQ before destroying or resizing it.
    let opened = unsafe { CqRings::from_map(cqn, ring) }.and_then(|mut rings| {
        if let Some(check) = ctx.platform.lock_check() {
            rings.set_lock_check(check);
        }
        Ok(IvKernelCq {
            rings,
            lock: ctx.lock()?,
        })
    });
    match opened {
        // SAFETY: valid out pointer (checked non-null; C contract).
        Ok(opened) => unsafe { store(cq, opened) },
        Err(status) => status,
    }
}

unsafe extern "C" fn close_cq(_context: *mut c_void, cq: *mut IvKernelCq) {
    if !cq.is_null() {
        // SAFETY: `cq` came from `open_cq` and is closed once.
        drop(unsafe { Box::from_raw(cq) });
    }
}

unsafe extern "C" fn open_srq(
    context: *mut c_void,
    create: *const IvCreateSrqOut,
    srq: *mut *mut IvKernelSrq,
) -> NtStatus {
    // SAFETY: the context is the table's, referenced (C contract).
    let Some(ctx) = (unsafe { self::context(context) }) else {
        return STATUS_INVALID_PARAMETER;
    };
    if srq.is_null() {
        return STATUS_INVALID_PARAMETER;
    }
    // SAFETY: a non-null `create` points to a response (the C contract).
    let Some(create) = (unsafe { create.as_ref() }) else {
        return STATUS_INVALID_PARAMETER;
    };
    // SAFETY: the C contract of open_srq, as for open_qp.
    let opened = unsafe { SrqRings::from_create(create) }.and_then(|mut rings| {
        if let Some(check) = ctx.platform.lock_check() {
            rings.set_lock_check(check);
        }
        Ok(IvKernelSrq {
            rings,
            lock: ctx.lock()?,
        })
    });
    match opened {
        // SAFETY: valid out pointer (checked non-null; C contract).
        Ok(opened) => unsafe { store(srq, opened) },
        Err(status) => status,
    }
}

unsafe extern "C" fn close_srq(_context: *mut c_void, srq: *mut IvKernelSrq) {
    if !srq.is_null() {
        // SAFETY: `srq` came from `open_srq` and is closed once.
        drop(unsafe { Box::from_raw(srq) });
    }
}

/// A C send work request as a [`SendWr`] borrowing the caller's gather list
/// or inline data.
///
/// # Safety
/// `sg_list` is valid for `num_sge` entries (without `IV_SEND_INLINE`), or
/// `inline_data` for `inline_len` bytes (with it), for `'a`.
///
/// # Errors
/// `STATUS_INVALID_PARAMETER` for a non-zero reserved field, more than 32
/// SGEs, or a null pointer with a non-zero count.
pub unsafe fn send_wr_from_c(wr: &IvKernelSendWr) -> Result<SendWr<'_>, NtStatus> {
    if wr.reserved != 0 {
        return Err(STATUS_INVALID_PARAMETER);
    }
    let mut send = SendWr {
        wr_id: wr.wr_id,
        opcode: wr.opcode,
        flags: wr.flags,
        imm_or_inv: wr.imm_or_inv,
        remote_addr: wr.remote_addr,
        rkey: wr.rkey,
        compare_add: wr.compare_add,
        swap: wr.swap,
        // An all-zero UD triple is what a connected QP's request carries:
        // none, so that the ring writes it on its fast path (the WQE's
        // bytes are the same).
        ud: (wr.ahn | wr.remote_qpn | wr.remote_qkey != 0).then_some((
            wr.ahn,
            wr.remote_qpn,
            wr.remote_qkey,
        )),
        ..SendWr::default()
    };
    if wr.flags & IV_SEND_INLINE != 0 {
        let len = wr.inline_len as usize;
        if len == 0 {
            send.inline = Some(&[]);
        } else if wr.inline_data.is_null() {
            return Err(STATUS_INVALID_PARAMETER);
        } else {
            // SAFETY: the caller's inline data is valid for `inline_len`
            // bytes (checked non-null).
            send.inline = Some(unsafe { core::slice::from_raw_parts(wr.inline_data.cast(), len) });
        }
    } else {
        // SAFETY: the caller's gather list is valid for `num_sge` entries.
        send.sges = unsafe { sge_list(wr.sg_list, u32::from(wr.num_sge)) }?;
    }
    Ok(send)
}

/// A C scatter/gather list as a slice.
///
/// # Safety
/// `sg_list` is valid for `num_sge` entries for `'a`.
unsafe fn sge_list<'a>(sg_list: *const IvSge, num_sge: u32) -> Result<&'a [IvSge], NtStatus> {
    if num_sge == 0 {
        return Ok(&[]);
    }
    if sg_list.is_null() || num_sge as usize > MAX_SGE {
        return Err(STATUS_INVALID_PARAMETER);
    }
    // SAFETY: non-null, at most MAX_SGE entries the caller vouches for.
    Ok(unsafe { core::slice::from_raw_parts(sg_list, num_sge as usize) })
}

/// A C receive work request's scatter list.
///
/// # Safety
/// `wr.sg_list` is valid for `wr.num_sge` entries for `'a`.
///
/// # Errors
/// `STATUS_INVALID_PARAMETER` for a non-zero reserved field, more than 32
/// SGEs, or a null list with a non-zero count.
pub unsafe fn recv_sges_from_c(wr: &IvKernelRecvWr) -> Result<&[IvSge], NtStatus> {
    if wr.reserved != 0 {
        return Err(STATUS_INVALID_PARAMETER);
    }
    // SAFETY: forwarded from the caller.
    unsafe { sge_list(wr.sg_list, wr.num_sge) }
}

fn status(r: Result<(), impl AsNtStatus>) -> NtStatus {
    match r {
        Ok(()) => STATUS_SUCCESS,
        Err(e) => e.nt_status(),
    }
}

unsafe extern "C" fn post_send(
    context: *mut c_void,
    qp: *mut IvKernelQp,
    wr: *const IvKernelSendWr,
) -> NtStatus {
    // SAFETY: the context is the table's, referenced (C contract).
    let Some(db) = (unsafe { doorbells(context) }) else {
        return STATUS_INVALID_PARAMETER;
    };
    // SAFETY: a non-null `qp` is an open QP (C contract).
    let Some(qp) = (unsafe { qp.cast_const().as_ref() }) else {
        return STATUS_INVALID_PARAMETER;
    };
    // SAFETY: a non-null `wr` points to a work request (C contract).
    let Some(wr) = (unsafe { wr.as_ref() }) else {
        return STATUS_INVALID_PARAMETER;
    };
    // SAFETY: the work request's list or data is valid (C contract).
    let send = match unsafe { send_wr_from_c(wr) } {
        Ok(send) => send,
        Err(s) => return s,
    };
    let posted = {
        let _held = Held::new(&*qp.sq_lock);
        qp.rings.sq().post(&send)
    };
    if posted.is_ok() {
        db.sq(qp.rings.sq_bell());
    }
    status(posted)
}

unsafe extern "C" fn post_recv(
    context: *mut c_void,
    qp: *mut IvKernelQp,
    wr: *const IvKernelRecvWr,
) -> NtStatus {
    // SAFETY: the context is the table's, referenced (C contract).
    let Some(db) = (unsafe { doorbells(context) }) else {
        return STATUS_INVALID_PARAMETER;
    };
    // SAFETY: a non-null `qp` is an open QP (C contract).
    let Some(qp) = (unsafe { qp.cast_const().as_ref() }) else {
        return STATUS_INVALID_PARAMETER;
    };
    // SAFETY: a non-null `wr` points to a work request (C contract).
    let Some(wr) = (unsafe { wr.as_ref() }) else {
        return STATUS_INVALID_PARAMETER;
    };
    // SAFETY: the scatter list is valid (C contract).
    let sges = match unsafe { recv_sges_from_c(wr) } {
        Ok(sges) => sges,
        Err(s) => return s,
    };
    let Some(rq) = qp.rings.rq() else {
        return PostError::Invalid.nt_status();
    };
    let posted = {
        let _held = Held::new(&*qp.rq_lock);
        rq.post(wr.wr_id, sges)
    };
    if posted.is_ok() && rq.doorbell_wanted() {
        db.rq(qp.rings.rq_bell());
    }
    status(posted)
}

unsafe extern "C" fn post_srq_recv(
    context: *mut c_void,
    srq: *mut IvKernelSrq,
    wr: *const IvKernelRecvWr,
) -> NtStatus {
    // SAFETY: the context is the table's, referenced (C contract).
    let Some(db) = (unsafe { doorbells(context) }) else {
        return STATUS_INVALID_PARAMETER;
    };
    // SAFETY: a non-null `srq` is an open SRQ (C contract).
    let Some(srq) = (unsafe { srq.cast_const().as_ref() }) else {
        return STATUS_INVALID_PARAMETER;
    };
    // SAFETY: a non-null `wr` points to a work request (C contract).
    let Some(wr) = (unsafe { wr.as_ref() }) else {
        return STATUS_INVALID_PARAMETER;
    };
    // SAFETY: the scatter list is valid (C contract).
    let sges = match unsafe { recv_sges_from_c(wr) } {
        Ok(sges) => sges,
        Err(s) => return s,
    };
    let rq = srq.rings.rq();
    let posted = {
        let _held = Held::new(&*srq.lock);
        rq.post(wr.wr_id, sges)
    };
    if posted.is_ok() && rq.doorbell_wanted() {
        db.srq(srq.rings.bell());
    }
    status(posted)
}

/// Polls into a C array: the count, or a failure NTSTATUS (negative).
///
/// # Safety
/// `wc` is null or valid for `max` writes.
pub unsafe fn poll_into_c(cq: &CqRings, wc: *mut IvCqe, max: u32) -> i32 {
    let max = max.min(i32::MAX as u32) as usize;
    if max == 0 {
        return 0;
    }
    if wc.is_null() {
        return STATUS_INVALID_PARAMETER;
    }
    // SAFETY: the caller's array holds `max` entries (checked non-null).
    let out = unsafe { core::slice::from_raw_parts_mut(wc, max) };
    match cq.poll(out) {
        Ok(n) => n as i32,
        Err(e) => e.nt_status(),
    }
}

unsafe extern "C" fn poll_cq(
    _context: *mut c_void,
    cq: *mut IvKernelCq,
    wc: *mut IvCqe,
    max: u32,
) -> i32 {
    // SAFETY: a non-null `cq` is an open CQ (C contract).
    let Some(cq) = (unsafe { cq.cast_const().as_ref() }) else {
        return STATUS_INVALID_PARAMETER;
    };
    let _held = Held::new(&*cq.lock);
    // SAFETY: `wc` holds `max` entries (C contract).
    unsafe { poll_into_c(&cq.rings, wc, max) }
}

unsafe extern "C" fn req_notify_cq(
    context: *mut c_void,
    cq: *mut IvKernelCq,
    solicited_only: i32,
) -> NtStatus {
    // SAFETY: the context is the table's, referenced (C contract).
    let Some(db) = (unsafe { doorbells(context) }) else {
        return STATUS_INVALID_PARAMETER;
    };
    // SAFETY: a non-null `cq` is an open CQ (C contract).
    let Some(cq) = (unsafe { cq.cast_const().as_ref() }) else {
        return STATUS_INVALID_PARAMETER;
    };
    {
        let _held = Held::new(&*cq.lock);
        cq.rings.cq().arm(solicited_only != 0);
    }
    db.cq_arm(cq.rings.bell());
    STATUS_SUCCESS
}

/// The CM behind `context`.
///
/// # Safety
/// As [`context`].
unsafe fn ceps<'a>(ctx: *mut c_void) -> Result<&'a dyn CepCalls, NtStatus> {
    // SAFETY: forwarded from the caller.
    let ctx = unsafe { context(ctx) }.ok_or(STATUS_INVALID_PARAMETER)?;
    ctx.ceps.as_deref().ok_or(STATUS_NOT_SUPPORTED)
}

unsafe extern "C" fn register_cep_callback(
    context: *mut c_void,
    file_object: *mut c_void,
    cep: IvHandle,
    callback: Option<IvKernelCepCallbackFn>,
    callback_context: *mut c_void,
) -> NtStatus {
    // SAFETY: the context is the table's, referenced (C contract).
    let ceps = match unsafe { ceps(context) } {
        Ok(c) => c,
        Err(s) => return s,
    };
    let Some(function) = callback else {
        return STATUS_INVALID_PARAMETER;
    };
    let notify = CepNotify {
        function,
        context: callback_context,
    };
    ceps.set_cep_callback(file_object, cep, Some(notify))
        .map_or_else(|e| e, |()| STATUS_SUCCESS)
}

unsafe extern "C" fn unregister_cep_callback(
    context: *mut c_void,
    file_object: *mut c_void,
    cep: IvHandle,
) -> NtStatus {
    // SAFETY: the context is the table's, referenced (C contract).
    let ceps = match unsafe { ceps(context) } {
        Ok(c) => c,
        Err(s) => return s,
    };
    ceps.set_cep_callback(file_object, cep, None)
        .map_or_else(|e| e, |()| STATUS_SUCCESS)
}

unsafe extern "C" fn poll_cep_event(
    context: *mut c_void,
    file_object: *mut c_void,
    cep: IvHandle,
    event: *mut IvCepEventOut,
) -> i32 {
    // SAFETY: the context is the table's, referenced (C contract).
    let ceps = match unsafe { ceps(context) } {
        Ok(c) => c,
        Err(s) => return s,
    };
    if event.is_null() {
        return STATUS_INVALID_PARAMETER;
    }
    match ceps.poll_cep_event(file_object, cep) {
        Ok(Some(ev)) => {
            // SAFETY: a non-null `event` is valid for a write (C contract).
            unsafe { event.write(ev) };
            1
        }
        Ok(None) => 0,
        Err(s) => s,
    }
}

macro_rules! layout {
    ($t:ident { $($f:ident),* $(,)? }) => {
        Layout {
            name: stringify!($t),
            size: size_of::<$t>(),
            align: align_of::<$t>(),
            fields: &[$((stringify!($f), offset_of!($t, $f))),*],
        }
    };
}

/// The layout of the table's C structs, as Rust lays them out: the C
/// layout test static-asserts `include/irpverbs_kernel.h` (and the user
/// library's `IvUserSendWr` / `IvUserRecvWr`, the same structs) against it.
pub const LAYOUTS: &[Layout] = &[
    layout!(IvKernelSendWr {
        wr_id,
        opcode,
        flags,
        num_sge,
        imm_or_inv,
        remote_addr,
        rkey,
        inline_len,
        compare_add,
        swap,
        ahn,
        remote_qpn,
        remote_qkey,
        reserved,
        sg_list,
        inline_data,
    }),
    layout!(IvKernelRecvWr {
        wr_id,
        sg_list,
        num_sge,
        reserved,
    }),
    layout!(IvKernelInterface {
        size,
        version,
        context,
        interface_reference,
        interface_dereference,
        open_qp,
        close_qp,
        open_cq,
        close_cq,
        open_srq,
        close_srq,
        post_send,
        post_recv,
        post_srq_recv,
        poll_cq,
        req_notify_cq,
        register_cep_callback,
        unregister_cep_callback,
        poll_cep_event,
    }),
];
