//! The ring views of one object: [`QpRings`], [`CqRings`] and [`SrqRings`],
//! built once from a create response (or an `IOCTL_IV_MAP_RINGS` response)
//! by an `unsafe` constructor whose caller vouches that the mapping outlives
//! the views, and the [`Doorbells`] a post or an arm rings: the HCA's
//! direct-call doorbells (kernel ULPs, host mode), or a user-mode file's
//! doorbell page ([`PageDoorbells`]). Each view knows its queues' [`Bell`]s,
//! which name a doorbell both ways.
//!
//! Every operation on them is callable at IRQL <= DISPATCH_LEVEL: no
//! allocation, no blocking (a post or poll serializes with concurrent ones
//! on the same queue by a short spin in the ring's queue object). That spin
//! leaves IRQL alone: a user-mode ULP needs no more, but a kernel caller
//! must hold it at DISPATCH_LEVEL (a DPC that preempts a poster on the same
//! processor would spin forever), which is why kernel ULPs post and poll
//! through the direct-call table ([`crate::kernel`]), whose queues take a
//! platform lock that raises to DISPATCH_LEVEL first.

use alloc::boxed::Box;
use alloc::sync::Arc;

use irpverbs_abi::{
    IV_DOORBELL_NONE, IV_DOORBELL_SLOTS, IV_RECV_WQE_HEADER, IV_SEND_WQE_HEADER, IvCqe,
    IvCreateQpOut, IvCreateSrqOut, IvMapDoorbellsOut, IvMapRingsOut, IvRingMap, IvSge, NtStatus,
    STATUS_DEVICE_HARDWARE_ERROR, STATUS_INSUFFICIENT_RESOURCES, STATUS_INVALID_PARAMETER,
};
use irpverbs_ring::wq::{CompletionQueue, RecvQueue, SendQueue};
use irpverbs_ring::{DoorbellPage, MapError, Ring};

pub use irpverbs_ring::{Corrupt, PostError, RecvWr, SendWr};

/// One queue doorbell (a QP's send or receive queue, an SRQ, a CQ's arm),
/// named both ways a ULP can ring it: the queue's number, for the HCA's
/// direct-call doorbells, and its slot in the file's doorbell page, for a
/// user-mode ULP ([`PageDoorbells`]; `IOCTL_IV_MAP_RINGS` reports it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bell {
    /// The QP, SRQ or CQ number.
    pub number: u32,
    /// The slot in the file's doorbell page, or [`IV_DOORBELL_NONE`].
    pub slot: u32,
}

impl Bell {
    /// The doorbell of queue `number`, without a doorbell page slot (what
    /// the views of a kernel ULP, or of a create response, ring).
    #[must_use]
    pub const fn direct(number: u32) -> Self {
        Self {
            number,
            slot: IV_DOORBELL_NONE,
        }
    }
}

/// The doorbells of an HCA: how a ULP tells it that a queue has new work
/// (or that a CQ was armed).
///
/// On real hardware each is a write to a UAR (doorbell) page mapped into the
/// ULP's address space. For the soft HCA, kernel ULPs (and host mode's
/// user files, by default) have the driver call its doorbell methods
/// (`irpverbs_core::Hca::sq_doorbell` and its siblings) directly, by queue
/// number; a user-mode ULP on Windows writes the slot of the queue in its
/// file's doorbell page ([`PageDoorbells`]), which the soft HCA scans.
///
/// IRQL: callable at <= DISPATCH_LEVEL, never blocking.
pub trait Doorbells: Send + Sync {
    /// New WQEs were published on the send queue of QP `qp.number`.
    fn sq(&self, qp: Bell);
    /// New WQEs were published on the receive queue of QP `qp.number`.
    fn rq(&self, qp: Bell);
    /// New WQEs were published on SRQ `srq.number`.
    fn srq(&self, srq: Bell);
    /// The arm word of CQ `cq.number` was written (`req_notify_cq`).
    fn cq_arm(&self, cq: Bell);
}

/// Forwards every doorbell to the pointee.
macro_rules! forward_doorbells {
    ($($ty:ty),*) => {$(
        impl<T: Doorbells + ?Sized> Doorbells for $ty {
            fn sq(&self, qp: Bell) {
                (**self).sq(qp);
            }
            fn rq(&self, qp: Bell) {
                (**self).rq(qp);
            }
            fn srq(&self, srq: Bell) {
                (**self).srq(srq);
            }
            fn cq_arm(&self, cq: Bell) {
                (**self).cq_arm(cq);
            }
        }
    )*};
}
forward_doorbells!(&T, Arc<T>, Box<T>);

/// How a user-mode ULP wakes an HCA that stopped polling its doorbell
/// page: `IOCTL_IV_RING_DOORBELLS` on the file.
///
/// IRQL: PASSIVE_LEVEL (a user-mode system call).
pub trait WakeHca: Send + Sync {
    /// Issues the wake-up (its failure changes nothing: the doorbell stays
    /// rung in the page, for the HCA's next look).
    fn wake_hca(&self);
}

/// The doorbells of a user-mode file: its doorbell page
/// (`IOCTL_IV_MAP_DOORBELLS`), where each doorbell is a bit the ULP sets
/// with release ordering ([`irpverbs_ring::doorbell`]) and the HCA finds
/// with no system call while it polls; when the page says it does not
/// (its `polling` word, read after a full fence), the doorbell also wakes
/// it through [`WakeHca`] (`IOCTL_IV_RING_DOORBELLS`), if one was given. A
/// [`Bell`] without a slot ([`IV_DOORBELL_NONE`]: its rings were mapped
/// before the page) rings nothing.
#[derive(Clone)]
pub struct PageDoorbells {
    page: DoorbellPage,
    wake: Option<Arc<dyn WakeHca>>,
}

impl core::fmt::Debug for PageDoorbells {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PageDoorbells")
            .field("page", &self.page)
            .field("wakes", &self.wake.is_some())
            .finish()
    }
}

/// Doorbells are equal when they ring the same page.
impl PartialEq for PageDoorbells {
    fn eq(&self, other: &Self) -> bool {
        self.page == other.page
    }
}

impl Eq for PageDoorbells {}

impl PageDoorbells {
    /// The doorbell page `out` (an `IOCTL_IV_MAP_DOORBELLS` response issued
    /// in this address space) describes.
    ///
    /// # Safety
    /// `out` is that response, unmodified, and the page stays mapped while
    /// the result lives: drop it before closing the file (the driver unmaps
    /// the page at the file's cleanup).
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER` for a response that does not describe a
    /// doorbell page of [`IV_DOORBELL_SLOTS`] slots;
    /// `STATUS_INSUFFICIENT_RESOURCES` when the view cannot be allocated.
    pub unsafe fn from_map(out: &IvMapDoorbellsOut) -> Result<Self, NtStatus> {
        if out.slots != IV_DOORBELL_SLOTS {
            return Err(STATUS_INVALID_PARAMETER);
        }
        // SAFETY: forwarded from the caller.
        let page = unsafe { DoorbellPage::from_map(out.page_addr, out.page_len) }
            .map_err(MapError::status)?;
        Ok(Self { page, wake: None })
    }

    /// Doorbells over `page` (the HCA's own view, in host mode's tests).
    #[must_use]
    pub fn new(page: DoorbellPage) -> Self {
        Self { page, wake: None }
    }

    /// The same doorbells, waking a sleeping HCA through `wake`.
    #[must_use]
    pub fn with_wake(self, wake: Arc<dyn WakeHca>) -> Self {
        Self {
            wake: Some(wake),
            ..self
        }
    }

    /// The page.
    #[must_use]
    pub fn page(&self) -> &DoorbellPage {
        &self.page
    }

    /// Rings `slot`, then wakes the HCA if it does not poll the page.
    fn ring(&self, slot: u32) {
        if self.page.ring(slot) && self.page.must_wake() {
            if let Some(wake) = &self.wake {
                wake.wake_hca();
            }
        }
    }
}

/// Every doorbell sets its slot's bit in the page (and wakes a sleeping
/// HCA).
impl Doorbells for PageDoorbells {
    fn sq(&self, qp: Bell) {
        self.ring(qp.slot);
    }
    fn rq(&self, qp: Bell) {
        self.ring(qp.slot);
    }
    fn srq(&self, srq: Bell) {
        self.ring(srq.slot);
    }
    fn cq_arm(&self, cq: Bell) {
        self.ring(cq.slot);
    }
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
    unsafe { Ring::from_map(map) }.map_err(MapError::status)
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
    sq_bell: Bell,
    rq_bell: Bell,
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
            sq_bell: Bell::direct(out.qpn),
            rq_bell: Bell::direct(out.qpn),
        })
    }

    /// Runs `check` each time one of the QP's queues is locked
    /// ([`irpverbs_ring::wq::LockCheck`]).
    pub fn set_lock_check(&mut self, check: irpverbs_ring::wq::LockCheck) {
        self.sq.set_lock_check(check);
        if let Some(rq) = &mut self.rq {
            rq.set_lock_check(check);
        }
    }

    /// The views with the doorbell page slots `map` (the QP's
    /// `IOCTL_IV_MAP_RINGS` response) reports.
    #[must_use]
    pub fn with_doorbells(mut self, map: &IvMapRingsOut) -> Self {
        self.sq_bell.slot = map.ring_doorbell;
        self.rq_bell.slot = map.rq_doorbell;
        self
    }

    /// The QP number.
    #[must_use]
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// The send queue's doorbell.
    #[must_use]
    pub fn sq_bell(&self) -> Bell {
        self.sq_bell
    }

    /// The receive queue's doorbell.
    #[must_use]
    pub fn rq_bell(&self) -> Bell {
        self.rq_bell
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
        db.sq(self.sq_bell);
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
        let result = self.sq.post_list(wrs);
        let posted = match result {
            Ok(()) => wrs.len(),
            Err((i, _)) => i,
        };
        if posted > 0 {
            db.sq(self.sq_bell);
        }
        result
    }

    /// `post_recv`: writes a receive WQE (scatter list `sges`) and rings the
    /// receive doorbell if the HCA asks for it ([`RecvQueue::doorbell_wanted`]:
    /// only while the QP is in ERR or waits for a receive after an RNR
    /// NAK; otherwise the HCA finds the receive when it needs it).
    ///
    /// # Errors
    /// [`PostError`]; [`PostError::Invalid`] for a QP that uses an SRQ.
    pub fn post_recv(
        &self,
        db: &dyn Doorbells,
        wr_id: u64,
        sges: &[IvSge],
    ) -> Result<(), PostError> {
        let rq = self.rq.as_ref().ok_or(PostError::Invalid)?;
        rq.post(wr_id, sges)?;
        if rq.doorbell_wanted() {
            db.rq(self.rq_bell);
        }
        Ok(())
    }

    /// `post_recv` with a chain: writes `wrs` in order, publishes them
    /// together and rings the receive doorbell once (when any was posted
    /// and the HCA asks for it, as [`QpRings::post_recv`]).
    ///
    /// # Errors
    /// The index of the first work request not posted and why
    /// ([`PostError::Invalid`] at 0 for a QP that uses an SRQ); the ones
    /// before it were posted (and the doorbell rung for them if asked).
    pub fn post_recv_list(
        &self,
        db: &dyn Doorbells,
        wrs: &[RecvWr<'_>],
    ) -> Result<(), (usize, PostError)> {
        let rq = self.rq.as_ref().ok_or((0, PostError::Invalid))?;
        let result = rq.post_list(wrs);
        if result.as_ref().map_or_else(|&(i, _)| i, |()| wrs.len()) > 0 && rq.doorbell_wanted() {
            db.rq(self.rq_bell);
        }
        result
    }
}

/// The speed-path view of an SRQ.
#[derive(Debug)]
pub struct SrqRings {
    srqn: u32,
    rq: RecvQueue,
    bell: Bell,
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
            bell: Bell::direct(out.srqn),
        })
    }

    /// Runs `check` each time the SRQ is locked
    /// ([`irpverbs_ring::wq::LockCheck`]).
    pub fn set_lock_check(&mut self, check: irpverbs_ring::wq::LockCheck) {
        self.rq.set_lock_check(check);
    }

    /// The view with the doorbell page slot `map` (the SRQ's
    /// `IOCTL_IV_MAP_RINGS` response) reports.
    #[must_use]
    pub fn with_doorbells(mut self, map: &IvMapRingsOut) -> Self {
        self.bell.slot = map.ring_doorbell;
        self
    }

    /// The SRQ number.
    #[must_use]
    pub fn srqn(&self) -> u32 {
        self.srqn
    }

    /// The SRQ's doorbell.
    #[must_use]
    pub fn bell(&self) -> Bell {
        self.bell
    }

    /// The queue.
    #[must_use]
    pub fn rq(&self) -> &RecvQueue {
        &self.rq
    }

    /// `post_srq_recv`: writes a receive WQE and rings the SRQ's doorbell
    /// if the HCA asks for it (while responders of its QPs wait for a
    /// receive after an RNR NAK; see [`RecvQueue::doorbell_wanted`]).
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
        if self.rq.doorbell_wanted() {
            db.srq(self.bell);
        }
        Ok(())
    }

    /// `post_srq_recv` with a chain: writes `wrs` in order, publishes them
    /// together and rings the SRQ's doorbell once (when any was posted and
    /// the HCA asks for it).
    ///
    /// # Errors
    /// The index of the first work request not posted and why; the ones
    /// before it were posted.
    pub fn post_recv_list(
        &self,
        db: &dyn Doorbells,
        wrs: &[RecvWr<'_>],
    ) -> Result<(), (usize, PostError)> {
        let result = self.rq.post_list(wrs);
        if result.as_ref().map_or_else(|&(i, _)| i, |()| wrs.len()) > 0 && self.rq.doorbell_wanted()
        {
            db.srq(self.bell);
        }
        result
    }
}

/// The speed-path view of a CQ.
#[derive(Debug)]
pub struct CqRings {
    cqn: u32,
    cq: CompletionQueue,
    bell: Bell,
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
            bell: Bell::direct(cqn),
        })
    }

    /// Runs `check` each time the CQ is locked
    /// ([`irpverbs_ring::wq::LockCheck`]).
    pub fn set_lock_check(&mut self, check: irpverbs_ring::wq::LockCheck) {
        self.cq.set_lock_check(check);
    }

    /// The view with the doorbell page slot `map` (the CQ's
    /// `IOCTL_IV_MAP_RINGS` response) reports.
    #[must_use]
    pub fn with_doorbells(mut self, map: &IvMapRingsOut) -> Self {
        self.bell.slot = map.ring_doorbell;
        self
    }

    /// The CQ number.
    #[must_use]
    pub fn cqn(&self) -> u32 {
        self.cqn
    }

    /// The CQ's arm doorbell.
    #[must_use]
    pub fn bell(&self) -> Bell {
        self.bell
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
        db.cq_arm(self.bell);
    }
}
