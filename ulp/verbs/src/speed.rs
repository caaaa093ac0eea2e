//! The speed path: post send, post receive, poll CQ and arm CQ as direct
//! calls on the rings a create verb mapped into the caller's address space,
//! plus a doorbell. No IOCTL.
//!
//! Three layers use what is here:
//! - the safe Rust objects ([`crate::Qp`], [`crate::Cq`], [`crate::Srq`])
//!   that [`crate::Client`] creates over a [`SpeedPath`] transport;
//! - the kernel ULPs' direct-call function table ([`crate::kernel`]);
//! - the user-mode C library (`include/irpverbs_user.h`, in the host crate).
//!
//! [`QpRings`], [`CqRings`] and [`SrqRings`] are the lifetime-free core they
//! share: the ring views of one object, built once from its create response
//! by an `unsafe` constructor (the caller vouches that the mapping outlives
//! the views). Every operation on them is callable at IRQL <= DISPATCH_LEVEL:
//! no allocation, no blocking (a post or poll serializes with concurrent ones
//! on the same queue by a short spin in the ULP-side object).
#![allow(
    unsafe_code,
    reason = "turning a mapped ring into a view (Ring::from_map), and the SpeedPath contract"
)]

use irpverbs_abi::*;
use irpverbs_ring::Ring;
use irpverbs_ring::wq::{CompletionQueue, RecvQueue, SendQueue};

use crate::IoctlTransport;

pub use irpverbs_ring::{Corrupt, PostError, SendWr};

/// The doorbells of an HCA: how a ULP tells it that a queue has new work
/// (or that a CQ was armed).
///
/// On real hardware each is a write to a UAR (doorbell) page mapped into the
/// ULP's address space; in host mode the host device calls the soft HCA's
/// doorbell methods (`irpverbs_core::Hca::sq_doorbell` and its siblings)
/// directly.
/// Callable at IRQL <= DISPATCH_LEVEL, never blocking.
pub trait Doorbells: Send + Sync {
    /// New WQEs were published on the send queue of `qpn`.
    fn sq(&self, qpn: u32);
    /// New WQEs were published on the receive queue of `qpn`.
    fn rq(&self, qpn: u32);
    /// New WQEs were published on SRQ `srqn`.
    fn srq(&self, srqn: u32);
    /// The arm word of CQ `cqn` was written (`req_notify_cq`).
    fn cq_arm(&self, cqn: u32);
}

impl<T: Doorbells + ?Sized> Doorbells for &T {
    fn sq(&self, qpn: u32) {
        (**self).sq(qpn);
    }
    fn rq(&self, qpn: u32) {
        (**self).rq(qpn);
    }
    fn srq(&self, srqn: u32) {
        (**self).srq(srqn);
    }
    fn cq_arm(&self, cqn: u32) {
        (**self).cq_arm(cqn);
    }
}

impl<T: Doorbells + ?Sized> Doorbells for std::sync::Arc<T> {
    fn sq(&self, qpn: u32) {
        (**self).sq(qpn);
    }
    fn rq(&self, qpn: u32) {
        (**self).rq(qpn);
    }
    fn srq(&self, srqn: u32) {
        (**self).srq(srqn);
    }
    fn cq_arm(&self, cqn: u32) {
        (**self).cq_arm(cqn);
    }
}

/// An open of the device whose rings the speed path may use: an IOCTL
/// transport that also reaches the HCA's doorbells.
///
/// # Safety
/// Implementing this promises that the driver objects created through this
/// value are destroyed, resized or run down (file close) only through IOCTLs
/// issued by this value or by dropping it: nothing else holds the same open
/// of the device. [`crate::Client`] relies on it to keep every ring a
/// speed-path object views mapped for as long as the object lives (it
/// refuses destroys of such objects through itself, and its objects borrow
/// it, so it cannot be dropped under them).
pub unsafe trait SpeedPath: IoctlTransport {
    /// The doorbells of the device this file is open on.
    fn doorbells(&self) -> &dyn Doorbells;
}

/// An NTSTATUS for a speed-path failure, as the kernel table and the C
/// library return them.
pub trait AsNtStatus {
    /// The status.
    fn nt_status(&self) -> NtStatus;
}

impl AsNtStatus for PostError {
    /// [`PostError::Full`] is `STATUS_INSUFFICIENT_RESOURCES` (libibverbs'
    /// `ENOMEM`); a work request the queue cannot take (too many SGEs, too
    /// much inline data, an unknown opcode or flag, a QP without a receive
    /// queue) is `STATUS_INVALID_PARAMETER`.
    fn nt_status(&self) -> NtStatus {
        match self {
            PostError::Full => STATUS_INSUFFICIENT_RESOURCES,
            PostError::TooManySge | PostError::InlineTooLong | PostError::Invalid => {
                STATUS_INVALID_PARAMETER
            }
        }
    }
}

impl AsNtStatus for Corrupt {
    /// The HCA published an impossible producer index:
    /// `STATUS_DEVICE_HARDWARE_ERROR`.
    fn nt_status(&self) -> NtStatus {
        STATUS_DEVICE_HARDWARE_ERROR
    }
}

/// Turns a mapped ring into a ring view.
///
/// # Safety
/// As [`Ring::from_map`]: `map` describes a ring mapped into this address
/// space that stays mapped while the view lives.
unsafe fn map_ring(map: &IvRingMap) -> Result<Ring, NtStatus> {
    // SAFETY: forwarded from the caller.
    unsafe { Ring::from_map(map) }.map_err(|_| STATUS_INVALID_PARAMETER)
}

/// Checks that a slot of `stride` bytes holds a `header` and `body` bytes.
fn fits(stride: u32, header: usize, body: u64) -> Result<(), NtStatus> {
    if header as u64 + body <= u64::from(stride) {
        Ok(())
    } else {
        Err(STATUS_INVALID_PARAMETER)
    }
}

/// The speed-path view of a QP: its send queue and (without an SRQ) its
/// receive queue.
#[derive(Debug)]
pub struct QpRings {
    qpn: u32,
    sq: SendQueue,
    rq: Option<RecvQueue>,
}

impl QpRings {
    /// The rings of the QP `out` describes.
    ///
    /// # Safety
    /// `out` is the response of `IOCTL_IV_CREATE_QP` issued in this address
    /// space (unmodified), and the QP's rings stay mapped while the result
    /// lives: drop it before the QP is destroyed or its file closed.
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER` if a ring's geometry is not a ring or its
    /// slots cannot hold the WQEs `out.cap` allows.
    pub unsafe fn from_create(out: &IvCreateQpOut) -> Result<Self, NtStatus> {
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
        Ok(Self {
            qpn: out.qpn,
            sq: SendQueue::new(sq, cap.max_send_sge, cap.max_inline_data),
            rq: rq.map(|r| RecvQueue::new(r, cap.max_recv_sge)),
        })
    }

    /// The QP number.
    #[must_use]
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// The send queue.
    #[must_use]
    pub fn sq(&self) -> &SendQueue {
        &self.sq
    }

    /// The receive queue (`None` with an SRQ).
    #[must_use]
    pub fn rq(&self) -> Option<&RecvQueue> {
        self.rq.as_ref()
    }

    /// `post_send`: writes `wr` to the send queue and rings its doorbell.
    ///
    /// # Errors
    /// [`PostError`]; nothing was posted and no doorbell rung.
    pub fn post_send(&self, db: &dyn Doorbells, wr: &SendWr<'_>) -> Result<(), PostError> {
        self.sq.post(wr)?;
        db.sq(self.qpn);
        Ok(())
    }

    /// Posts `wrs` in order and rings the doorbell once.
    ///
    /// # Errors
    /// The index of the first work request not posted and why; the ones
    /// before it were posted (and the doorbell rung for them).
    pub fn post_send_list(
        &self,
        db: &dyn Doorbells,
        wrs: &[SendWr<'_>],
    ) -> Result<(), (usize, PostError)> {
        let mut result = Ok(());
        let mut posted = 0;
        for wr in wrs {
            if let Err(e) = self.sq.post(wr) {
                result = Err((posted, e));
                break;
            }
            posted += 1;
        }
        if posted > 0 {
            db.sq(self.qpn);
        }
        result
    }

    /// `post_recv`: writes a receive WQE (scatter list `sges`) and rings the
    /// receive doorbell.
    ///
    /// # Errors
    /// [`PostError`]; [`PostError::Invalid`] for a QP that uses an SRQ.
    pub fn post_recv(
        &self,
        db: &dyn Doorbells,
        wr_id: u64,
        sges: &[IvSge],
    ) -> Result<(), PostError> {
        self.rq
            .as_ref()
            .ok_or(PostError::Invalid)?
            .post(wr_id, sges)?;
        db.rq(self.qpn);
        Ok(())
    }
}

/// The speed-path view of an SRQ.
#[derive(Debug)]
pub struct SrqRings {
    srqn: u32,
    rq: RecvQueue,
}

impl SrqRings {
    /// The ring of the SRQ `out` describes.
    ///
    /// # Safety
    /// As [`QpRings::from_create`], for `IOCTL_IV_CREATE_SRQ`.
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER` for a geometry that is not a ring or slots
    /// too small for `out.max_sge` SGEs.
    pub unsafe fn from_create(out: &IvCreateSrqOut) -> Result<Self, NtStatus> {
        fits(
            out.ring.stride,
            IV_RECV_WQE_HEADER,
            16 * u64::from(out.max_sge),
        )?;
        // SAFETY: the caller vouches for the mapping.
        let ring = unsafe { map_ring(&out.ring) }?;
        Ok(Self {
            srqn: out.srqn,
            rq: RecvQueue::new(ring, out.max_sge),
        })
    }

    /// The SRQ number.
    #[must_use]
    pub fn srqn(&self) -> u32 {
        self.srqn
    }

    /// The queue.
    #[must_use]
    pub fn rq(&self) -> &RecvQueue {
        &self.rq
    }

    /// `post_srq_recv`: writes a receive WQE and rings the SRQ's doorbell.
    ///
    /// # Errors
    /// [`PostError`]; nothing was posted.
    pub fn post_recv(
        &self,
        db: &dyn Doorbells,
        wr_id: u64,
        sges: &[IvSge],
    ) -> Result<(), PostError> {
        self.rq.post(wr_id, sges)?;
        db.srq(self.srqn);
        Ok(())
    }
}

/// The speed-path view of a CQ.
#[derive(Debug)]
pub struct CqRings {
    cqn: u32,
    cq: CompletionQueue,
}

impl CqRings {
    /// The ring of the CQ `cqn` as `ring` maps it (from
    /// `IOCTL_IV_CREATE_CQ`, or a new ring from `IOCTL_IV_RESIZE_CQ`).
    ///
    /// # Safety
    /// As [`QpRings::from_create`]: `ring` is as the driver returned it in
    /// this address space, and stays mapped while the result lives (until
    /// the CQ is destroyed or resized, or its file closed).
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER` for a geometry that is not a ring of CQEs.
    pub unsafe fn from_map(cqn: u32, ring: &IvRingMap) -> Result<Self, NtStatus> {
        fits(ring.stride, size_of::<IvCqe>(), 0)?;
        // SAFETY: the caller vouches for the mapping.
        let ring = unsafe { map_ring(ring) }?;
        Ok(Self {
            cqn,
            cq: CompletionQueue::new(ring),
        })
    }

    /// The CQ number.
    #[must_use]
    pub fn cqn(&self) -> u32 {
        self.cqn
    }

    /// The queue.
    #[must_use]
    pub fn cq(&self) -> &CompletionQueue {
        &self.cq
    }

    /// `poll_cq`: takes up to `out.len()` completions, oldest first, and
    /// returns how many.
    ///
    /// # Errors
    /// [`Corrupt`] if the HCA's producer index is impossible.
    pub fn poll(&self, out: &mut [IvCqe]) -> Result<usize, Corrupt> {
        self.cq.poll(out)
    }

    /// `req_notify_cq`: arms the CQ for its next completion (or next
    /// solicited one) and rings its arm doorbell. The HCA raises one
    /// completion event (an `IOCTL_IV_CQ_NOTIFY` or completion-channel event)
    /// and disarms; if completions newer than the consumer index exist it
    /// raises it at once, so "arm, then poll once more" loses nothing.
    pub fn req_notify(&self, db: &dyn Doorbells, solicited_only: bool) {
        self.cq.arm(solicited_only);
        db.cq_arm(self.cqn);
    }
}

/// The name of a completion status (`IV_WC_*` without the prefix), as
/// `ibv_wc_status_str` names them.
#[must_use]
pub fn wc_status_name(status: u32) -> &'static str {
    match status {
        IV_WC_SUCCESS => "SUCCESS",
        IV_WC_LOC_LEN_ERR => "LOC_LEN_ERR",
        IV_WC_LOC_QP_OP_ERR => "LOC_QP_OP_ERR",
        IV_WC_LOC_PROT_ERR => "LOC_PROT_ERR",
        IV_WC_WR_FLUSH_ERR => "WR_FLUSH_ERR",
        IV_WC_BAD_RESP_ERR => "BAD_RESP_ERR",
        IV_WC_LOC_ACCESS_ERR => "LOC_ACCESS_ERR",
        IV_WC_REM_INV_REQ_ERR => "REM_INV_REQ_ERR",
        IV_WC_REM_ACCESS_ERR => "REM_ACCESS_ERR",
        IV_WC_REM_OP_ERR => "REM_OP_ERR",
        IV_WC_RETRY_EXC_ERR => "RETRY_EXC_ERR",
        IV_WC_RNR_RETRY_EXC_ERR => "RNR_RETRY_EXC_ERR",
        IV_WC_FATAL_ERR => "FATAL_ERR",
        IV_WC_GENERAL_ERR => "GENERAL_ERR",
        _ => "unknown status",
    }
}

/// The name of a completion opcode (`IV_WC_OP_*` without the prefix).
#[must_use]
pub fn wc_opcode_name(opcode: u32) -> &'static str {
    match opcode {
        IV_WC_OP_SEND => "SEND",
        IV_WC_OP_RDMA_WRITE => "RDMA_WRITE",
        IV_WC_OP_RDMA_READ => "RDMA_READ",
        IV_WC_OP_COMP_SWAP => "COMP_SWAP",
        IV_WC_OP_FETCH_ADD => "FETCH_ADD",
        IV_WC_OP_RECV => "RECV",
        IV_WC_OP_RECV_RDMA_WITH_IMM => "RECV_RDMA_WITH_IMM",
        _ => "unknown opcode",
    }
}

/// A work completion: a read-only view of a polled [`IvCqe`] with names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wc<'a>(&'a IvCqe);

impl<'a> From<&'a IvCqe> for Wc<'a> {
    fn from(cqe: &'a IvCqe) -> Self {
        Self(cqe)
    }
}

impl<'a> Wc<'a> {
    /// The view of `cqe`.
    #[must_use]
    pub fn new(cqe: &'a IvCqe) -> Self {
        Self(cqe)
    }

    /// The CQE itself.
    #[must_use]
    pub fn cqe(&self) -> &'a IvCqe {
        self.0
    }

    /// The work request's id.
    #[must_use]
    pub fn wr_id(&self) -> u64 {
        self.0.wr_id
    }

    /// `IV_WC_*`.
    #[must_use]
    pub fn status(&self) -> u32 {
        self.0.status
    }

    /// True for `IV_WC_SUCCESS`.
    #[must_use]
    pub fn is_success(&self) -> bool {
        self.0.status == IV_WC_SUCCESS
    }

    /// The status' name, e.g. `"REM_ACCESS_ERR"`.
    #[must_use]
    pub fn status_name(&self) -> &'static str {
        wc_status_name(self.0.status)
    }

    /// `IV_WC_OP_*`. Meaningful only on success (as in libibverbs).
    #[must_use]
    pub fn opcode(&self) -> u32 {
        self.0.opcode
    }

    /// The opcode's name, e.g. `"RDMA_READ"`.
    #[must_use]
    pub fn opcode_name(&self) -> &'static str {
        wc_opcode_name(self.0.opcode)
    }

    /// True for a receive completion (`RECV`, `RECV_RDMA_WITH_IMM`).
    #[must_use]
    pub fn is_recv(&self) -> bool {
        self.0.opcode & IV_WC_OP_RECV != 0
    }

    /// Bytes received (receives, RDMA READ) or transferred.
    #[must_use]
    pub fn byte_len(&self) -> u32 {
        self.0.byte_len
    }

    /// Immediate data, if the completion carries some.
    #[must_use]
    pub fn imm(&self) -> Option<u32> {
        (self.0.wc_flags & IV_WC_WITH_IMM != 0).then_some(self.0.imm_or_inv)
    }

    /// The rkey a SEND with invalidate invalidated, if any.
    #[must_use]
    pub fn invalidated_rkey(&self) -> Option<u32> {
        (self.0.wc_flags & IV_WC_WITH_INV != 0).then_some(self.0.imm_or_inv)
    }

    /// True when a GRH precedes the data in the receive buffer (UD).
    #[must_use]
    pub fn has_grh(&self) -> bool {
        self.0.wc_flags & IV_WC_GRH != 0
    }

    /// The local QP number.
    #[must_use]
    pub fn qp_num(&self) -> u32 {
        self.0.qp_num
    }

    /// UD receives: the source QP.
    #[must_use]
    pub fn src_qp(&self) -> u32 {
        self.0.src_qp
    }

    /// The vendor's error detail (0 on success).
    #[must_use]
    pub fn vendor_err(&self) -> u32 {
        self.0.vendor_err
    }
}

impl std::fmt::Display for Wc<'_> {
    /// `wr_id 0x7 qp 0x12: RECV 100 bytes imm 0x1 SUCCESS`, or with an
    /// error status `wr_id 0x7 qp 0x12: REM_ACCESS_ERR (vendor 0x0)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "wr_id {:#x} qp {:#x}: ", self.wr_id(), self.qp_num())?;
        if !self.is_success() {
            return write!(
                f,
                "{} (vendor {:#x})",
                self.status_name(),
                self.vendor_err()
            );
        }
        write!(f, "{} {} bytes", self.opcode_name(), self.byte_len())?;
        if let Some(imm) = self.imm() {
            write!(f, " imm {imm:#x}")?;
        }
        if let Some(rkey) = self.invalidated_rkey() {
            write!(f, " invalidated {rkey:#x}")?;
        }
        write!(f, " {}", self.status_name())
    }
}
