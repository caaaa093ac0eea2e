//! The kernel ULPs' direct-call table (`include/irpverbs_kernel.h`),
//! published with `IRP_MN_QUERY_INTERFACE` for
//! [`GUID_IV_KERNEL_INTERFACE`] (`{17EE45AE-E023-4F3B-81FC-6784694953D3}`).
//!
//! # Why a transcription of `ulp/verbs/src/kernel.rs`
//! Host mode builds the table with `irpverbs_verbs::kernel::interface`. That
//! crate is `std`-only (its `Client` holds a `std::sync::Mutex`, its
//! transports return `Vec`s, its `Wc` implements `std::fmt::Display`), and
//! its kernel module uses the std-only speed-path types (`QpRings`,
//! `CqRings`, `SrqRings`), so a `no_std` driver cannot link it. Everything
//! those functions do is in `irpverbs-ring` (`no_std`): the table below is
//! `ulp/verbs/src/kernel.rs` function for function over
//! `irpverbs_ring::{SendQueue, RecvQueue, CompletionQueue}`, with the same
//! argument checks, the same geometry checks on open (`fits`) and the same
//! status mapping. The layout is the same `#[repr(C)]` struct, field for
//! field (the Linux-side test `tests/tests/windows_package.rs` compares the
//! field lists and the GUID with `ulp/verbs` and the header). Making
//! `ulp/verbs`'s speed-path and kernel modules a `no_std` + `alloc` piece
//! would remove the copy; it is a change outside this crate.
//!
//! # Lifetime
//! [`KernelInterface::new`] builds the table over the device's soft HCA
//! (the doorbells) with one reference, the device's own. KMDF
//! (`WdfDeviceAddQueryInterface`) copies the table when it is added and, for
//! every `IRP_MN_QUERY_INTERFACE` for the GUID, copies it into the
//! requester's `INTERFACE` and calls `InterfaceReference(Context)`; the ULP
//! calls `InterfaceDereference(Context)` when done. The device drops its
//! reference in its destroy callback. The context holds an `Arc` of the soft
//! HCA, so a ULP that still holds a reference after removal calls into live
//! memory (a removed HCA ignores doorbells).
//!
//! IRQL: every table function is callable at IRQL <= DISPATCH_LEVEL; none
//! allocates except `open_*` (nonpaged pool, `STATUS_INSUFFICIENT_RESOURCES`
//! is not reachable: the global allocator aborts, as `alloc` does), none
//! blocks.

use alloc::boxed::Box;
use alloc::sync::Arc;
use core::ffi::c_void;

use irpverbs_abi::{
    IV_RECV_WQE_HEADER, IV_SEND_INLINE, IV_SEND_WQE_HEADER, IvCqe, IvCreateQpOut, IvCreateSrqOut,
    IvRingMap, IvSge, NtStatus, STATUS_DEVICE_HARDWARE_ERROR, STATUS_INSUFFICIENT_RESOURCES,
    STATUS_INVALID_PARAMETER, STATUS_SUCCESS,
};
use irpverbs_core::Hca;
use irpverbs_ring::wq::MAX_SGE;
use irpverbs_ring::{CompletionQueue, PostError, RecvQueue, Ring, SendQueue, SendWr};
use irpverbs_soft::SoftHca;
use wdk_sys::GUID;

use crate::platform::KmdfPlatform;

/// `IvKernelInterface::version` of this table (`IV_KERNEL_INTERFACE_VERSION`).
pub const IV_KERNEL_INTERFACE_VERSION: u16 = 1;

/// The interface type of the table, `{17EE45AE-E023-4F3B-81FC-6784694953D3}`
/// (`GUID_IV_KERNEL_INTERFACE` of `include/irpverbs_kernel.h`,
/// `IV_KERNEL_INTERFACE_GUID` of `irpverbs_verbs::kernel`).
pub const GUID_IV_KERNEL_INTERFACE: GUID = GUID {
    Data1: 0x17EE_45AE,
    Data2: 0xE023,
    Data3: 0x4F3B,
    Data4: [0x81, 0xFC, 0x67, 0x84, 0x69, 0x49, 0x53, 0xD3],
};

/// A send work request (C: `IvKernelSendWr`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct IvKernelSendWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// `IV_WR_*`.
    pub opcode: u8,
    /// `IV_SEND_*`; with `IV_SEND_INLINE` the data is `inline_data`.
    pub flags: u8,
    /// Entries of `sg_list`.
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
    /// UD: address handle number.
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

/// A receive work request (C: `IvKernelRecvWr`).
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

/// An opened QP (opaque to C): its send queue and, without an SRQ, its
/// receive queue.
#[derive(Debug)]
pub struct IvKernelQp {
    qpn: u32,
    sq: SendQueue,
    rq: Option<RecvQueue>,
}
/// An opened CQ (opaque to C).
#[derive(Debug)]
pub struct IvKernelCq {
    cqn: u32,
    cq: CompletionQueue,
}
/// An opened SRQ (opaque to C).
#[derive(Debug)]
pub struct IvKernelSrq {
    srqn: u32,
    rq: RecvQueue,
}

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

/// The direct-call function table (C: `IvKernelInterface`), an `INTERFACE`
/// (wdm.h) followed by the functions.
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
    /// `INTERFACE.InterfaceDereference`.
    pub interface_dereference: IvInterfaceReferenceFn,
    /// Opens a QP from its create response.
    pub open_qp: IvKernelOpenQpFn,
    /// Closes an opened QP.
    pub close_qp: IvKernelCloseQpFn,
    /// Opens a CQ from its number and ring.
    pub open_cq: IvKernelOpenCqFn,
    /// Closes an opened CQ.
    pub close_cq: IvKernelCloseCqFn,
    /// Opens an SRQ from its create response.
    pub open_srq: IvKernelOpenSrqFn,
    /// Closes an opened SRQ.
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
}

/// The soft HCA whose doorbells the table rings.
type Doorbells = Arc<SoftHca<KmdfPlatform>>;

/// What `context` points to, reference counted (`Arc::into_raw`).
struct Context {
    hca: Doorbells,
}

/// The device's table and its own reference to the context.
pub(crate) struct KernelInterface {
    table: IvKernelInterface,
}

// SAFETY: the table is plain data plus a pointer to an `Arc<Context>`
// (Context is Send + Sync: an Arc of the Send + Sync soft HCA).
unsafe impl Send for KernelInterface {}
// SAFETY: as above; shared access only reads the table.
unsafe impl Sync for KernelInterface {}

impl KernelInterface {
    /// The table over `hca`'s doorbells, referenced once (by the device).
    pub(crate) fn new(hca: Doorbells) -> Self {
        let context = Arc::into_raw(Arc::new(Context { hca }));
        #[allow(clippy::cast_possible_truncation, reason = "a small struct")]
        let size = size_of::<IvKernelInterface>() as u16;
        Self {
            table: IvKernelInterface {
                size,
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
            },
        }
    }

    /// A copy of the table, for `WDF_QUERY_INTERFACE_CONFIG.Interface`
    /// (the framework copies `Size` bytes of it once more; it starts with
    /// the `INTERFACE` header). The copy holds no reference of its own.
    pub(crate) fn table(&self) -> IvKernelInterface {
        self.table
    }
}

impl Drop for KernelInterface {
    /// Gives back the device's reference (ULPs may still hold theirs).
    fn drop(&mut self) {
        // SAFETY: the context came from `Arc::into_raw` in `new`, and this is
        // the reference `new` took.
        unsafe { interface_dereference(self.table.context) };
    }
}

/// The doorbells behind `context`.
///
/// # Safety
/// `context` is null or the table's context, still referenced.
unsafe fn doorbells<'a>(context: *mut c_void) -> Option<&'a Doorbells> {
    // SAFETY: a non-null context points to a live `Context` (caller).
    let ctx = unsafe { context.cast::<Context>().cast_const().as_ref() }?;
    Some(&ctx.hca)
}

/// `InterfaceReference`. IRQL: any <= DISPATCH_LEVEL.
unsafe extern "C" fn interface_reference(context: *mut c_void) {
    if !context.is_null() {
        // SAFETY: the context came from `Arc::into_raw` and the caller holds
        // a reference, so the count is at least 1.
        unsafe { Arc::increment_strong_count(context.cast::<Context>().cast_const()) };
    }
}

/// `InterfaceDereference`. IRQL: <= DISPATCH_LEVEL.
unsafe extern "C" fn interface_dereference(context: *mut c_void) {
    if !context.is_null() {
        // SAFETY: as above; this gives back one reference the caller held.
        unsafe { Arc::decrement_strong_count(context.cast::<Context>().cast_const()) };
    }
}

/// Stores a boxed object at `out`.
///
/// # Safety
/// `out` is valid for a pointer write.
unsafe fn store<T>(out: *mut *mut T, value: T) -> NtStatus {
    // SAFETY: the caller passes a valid out pointer.
    unsafe { out.write(Box::into_raw(Box::new(value))) };
    STATUS_SUCCESS
}

/// Checks that a slot of `stride` bytes holds a `header` and `body` bytes.
fn fits(stride: u32, header: usize, body: u64) -> Result<(), NtStatus> {
    if header as u64 + body <= u64::from(stride) {
        Ok(())
    } else {
        Err(STATUS_INVALID_PARAMETER)
    }
}

/// A ring view of a mapped ring.
///
/// # Safety
/// As `Ring::from_map`: `map` describes a ring mapped in this (system)
/// address space that stays mapped while the view lives.
unsafe fn map_ring(map: &IvRingMap) -> Result<Ring, NtStatus> {
    // SAFETY: forwarded from the caller.
    unsafe { Ring::from_map(map) }.map_err(|_| STATUS_INVALID_PARAMETER)
}

fn post_status(r: Result<(), PostError>) -> NtStatus {
    match r {
        Ok(()) => STATUS_SUCCESS,
        Err(PostError::Full) => STATUS_INSUFFICIENT_RESOURCES,
        Err(PostError::TooManySge | PostError::InlineTooLong | PostError::Invalid) => {
            STATUS_INVALID_PARAMETER
        }
    }
}

unsafe extern "C" fn open_qp(
    _context: *mut c_void,
    create: *const IvCreateQpOut,
    qp: *mut *mut IvKernelQp,
) -> NtStatus {
    if qp.is_null() {
        return STATUS_INVALID_PARAMETER;
    }
    // SAFETY: a non-null `create` points to a response (the C contract).
    let Some(out) = (unsafe { create.as_ref() }) else {
        return STATUS_INVALID_PARAMETER;
    };
    // SAFETY: the C contract of open_qp: the response is the caller's,
    // unmodified (kernel addresses), and it closes the QP before destroying
    // it.
    match unsafe { qp_from_create(out) } {
        // SAFETY: `qp` is a valid out pointer (checked non-null; C contract).
        Ok(opened) => unsafe { store(qp, opened) },
        Err(status) => status,
    }
}

/// `QpRings::from_create` of `ulp/verbs`.
///
/// # Safety
/// `out` is an unmodified create response of a kernel caller whose rings
/// stay mapped while the result lives.
unsafe fn qp_from_create(out: &IvCreateQpOut) -> Result<IvKernelQp, NtStatus> {
    let cap = &out.cap;
    fits(
        out.sq.stride,
        IV_SEND_WQE_HEADER,
        (16 * u64::from(cap.max_send_sge)).max(u64::from(cap.max_inline_data)),
    )?;
    if out.rq.entries != 0 {
        fits(
            out.rq.stride,
            IV_RECV_WQE_HEADER,
            16 * u64::from(cap.max_recv_sge),
        )?;
    }
    // SAFETY: the caller vouches for the send queue's mapping.
    let sq = unsafe { map_ring(&out.sq) }?;
    let rq = if out.rq.entries == 0 {
        None
    } else {
        // SAFETY: the caller vouches for the receive queue's mapping.
        Some(unsafe { map_ring(&out.rq) }?)
    };
    Ok(IvKernelQp {
        qpn: out.qpn,
        sq: SendQueue::new(sq, cap.max_send_sge, cap.max_inline_data),
        rq: rq.map(|r| RecvQueue::new(r, cap.max_recv_sge)),
    })
}

unsafe extern "C" fn close_qp(_context: *mut c_void, qp: *mut IvKernelQp) {
    if !qp.is_null() {
        // SAFETY: `qp` came from `open_qp` (Box::into_raw) and is closed once.
        drop(unsafe { Box::from_raw(qp) });
    }
}

unsafe extern "C" fn open_cq(
    _context: *mut c_void,
    cqn: u32,
    ring: *const IvRingMap,
    cq: *mut *mut IvKernelCq,
) -> NtStatus {
    if cq.is_null() {
        return STATUS_INVALID_PARAMETER;
    }
    // SAFETY: a non-null `ring` points to a ring map (the C contract).
    let Some(ring) = (unsafe { ring.as_ref() }) else {
        return STATUS_INVALID_PARAMETER;
    };
    if let Err(status) = fits(ring.stride, size_of::<IvCqe>(), 0) {
        return status;
    }
    // SAFETY: the C contract of open_cq: the ring is the CQ's current one,
    // and the caller closes the CQ before destroying or resizing it.
    match unsafe { map_ring(ring) } {
        // SAFETY: valid out pointer (checked non-null; C contract).
        Ok(r) => unsafe {
            store(
                cq,
                IvKernelCq {
                    cqn,
                    cq: CompletionQueue::new(r),
                },
            )
        },
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
    _context: *mut c_void,
    create: *const IvCreateSrqOut,
    srq: *mut *mut IvKernelSrq,
) -> NtStatus {
    if srq.is_null() {
        return STATUS_INVALID_PARAMETER;
    }
    // SAFETY: a non-null `create` points to a response (the C contract).
    let Some(out) = (unsafe { create.as_ref() }) else {
        return STATUS_INVALID_PARAMETER;
    };
    if let Err(status) = fits(
        out.ring.stride,
        IV_RECV_WQE_HEADER,
        16 * u64::from(out.max_sge),
    ) {
        return status;
    }
    // SAFETY: the C contract of open_srq, as for open_qp.
    match unsafe { map_ring(&out.ring) } {
        // SAFETY: valid out pointer (checked non-null; C contract).
        Ok(r) => unsafe {
            store(
                srq,
                IvKernelSrq {
                    srqn: out.srqn,
                    rq: RecvQueue::new(r, out.max_sge),
                },
            )
        },
        Err(status) => status,
    }
}

unsafe extern "C" fn close_srq(_context: *mut c_void, srq: *mut IvKernelSrq) {
    if !srq.is_null() {
        // SAFETY: `srq` came from `open_srq` and is closed once.
        drop(unsafe { Box::from_raw(srq) });
    }
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

/// `send_wr_from_c` of `ulp/verbs`.
///
/// # Safety
/// The work request's gather list or inline data is valid for `'a`.
unsafe fn send_wr_from_c(wr: &IvKernelSendWr) -> Result<SendWr<'_>, NtStatus> {
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
        ud: Some((wr.ahn, wr.remote_qpn, wr.remote_qkey)),
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

/// A receive work request's scatter list.
///
/// # Safety
/// `wr.sg_list` is valid for `wr.num_sge` entries.
unsafe fn recv_sges_from_c(wr: &IvKernelRecvWr) -> Result<&[IvSge], NtStatus> {
    if wr.reserved != 0 {
        return Err(STATUS_INVALID_PARAMETER);
    }
    // SAFETY: forwarded from the caller.
    unsafe { sge_list(wr.sg_list, wr.num_sge) }
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
        Err(status) => return status,
    };
    let posted = qp.sq.post(&send);
    if posted.is_ok() {
        db.sq_doorbell(qp.qpn);
    }
    post_status(posted)
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
        Err(status) => return status,
    };
    let Some(rq) = qp.rq.as_ref() else {
        return post_status(Err(PostError::Invalid));
    };
    let posted = rq.post(wr.wr_id, sges);
    if posted.is_ok() {
        db.rq_doorbell(qp.qpn);
    }
    post_status(posted)
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
        Err(status) => return status,
    };
    let posted = srq.rq.post(wr.wr_id, sges);
    if posted.is_ok() {
        db.srq_doorbell(srq.srqn);
    }
    post_status(posted)
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
    let max = max.min(i32::MAX as u32) as usize;
    if max == 0 {
        return 0;
    }
    if wc.is_null() {
        return STATUS_INVALID_PARAMETER;
    }
    // SAFETY: the caller's array holds `max` entries (checked non-null).
    let out = unsafe { core::slice::from_raw_parts_mut(wc, max) };
    match cq.cq.poll(out) {
        #[allow(clippy::cast_possible_truncation, reason = "n <= max <= i32::MAX")]
        Ok(n) => n as i32,
        Err(_) => STATUS_DEVICE_HARDWARE_ERROR,
    }
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
    cq.cq.arm(solicited_only != 0);
    db.cq_arm_doorbell(cq.cqn);
    STATUS_SUCCESS
}
