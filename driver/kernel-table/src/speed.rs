//! The ring views of one object: [`QpRings`], [`CqRings`] and [`SrqRings`],
//! built once from a create response (or an `IOCTL_IV_MAP_RINGS` response)
//! by an `unsafe` constructor whose caller vouches that the mapping outlives
//! the views, and the [`Doorbells`] a post or an arm rings.
//!
//! Every operation on them is callable at IRQL <= DISPATCH_LEVEL: no
//! allocation, no blocking (a post or poll serializes with concurrent ones
//! on the same queue by a short spin in the ring's queue object).

use alloc::boxed::Box;
use alloc::sync::Arc;

use irpverbs_abi::{
    IV_RECV_WQE_HEADER, IV_SEND_WQE_HEADER, IvCqe, IvCreateQpOut, IvCreateSrqOut, IvRingMap, IvSge,
    NtStatus, STATUS_DEVICE_HARDWARE_ERROR, STATUS_INSUFFICIENT_RESOURCES,
    STATUS_INVALID_PARAMETER,
};
use irpverbs_ring::Ring;
use irpverbs_ring::wq::{CompletionQueue, RecvQueue, SendQueue};

pub use irpverbs_ring::{Corrupt, PostError, SendWr};

/// The doorbells of an HCA: how a ULP tells it that a queue has new work
/// (or that a CQ was armed).
///
/// On real hardware each is a write to a UAR (doorbell) page mapped into the
/// ULP's address space; for the soft HCA the driver (host device, or
/// irpverbs.sys for kernel ULPs) calls its doorbell methods
/// (`irpverbs_core::Hca::sq_doorbell` and its siblings) directly.
///
/// IRQL: callable at <= DISPATCH_LEVEL, never blocking.
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

/// Forwards every doorbell to the pointee.
macro_rules! forward_doorbells {
    ($($ty:ty),*) => {$(
        impl<T: Doorbells + ?Sized> Doorbells for $ty {
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
    )*};
}
forward_doorbells!(&T, Arc<T>, Box<T>);

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
    /// `out` is the response of `IOCTL_IV_CREATE_QP` (a kernel caller's), or
    /// one whose `sq` and `rq` a `IOCTL_IV_MAP_RINGS` issued in this address
    /// space filled in, otherwise unmodified; and the QP's rings stay mapped
    /// while the result lives: drop it before the QP is destroyed or its
    /// file closed.
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
    /// `IOCTL_IV_CREATE_CQ` or `IOCTL_IV_RESIZE_CQ` for a kernel caller, or
    /// from `IOCTL_IV_MAP_RINGS`).
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
