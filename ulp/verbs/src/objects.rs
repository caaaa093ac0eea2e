//! The safe speed-path objects: [`Qp`], [`Cq`] and [`Srq`], created by a
//! [`Client`] over a [`crate::SpeedPath`] transport.
//!
//! Each one maps its rings once, when it is created (`IOCTL_IV_MAP_RINGS`
//! after the create: a user-mode caller's create response carries only the
//! rings' geometry), and borrows the client,
//! which therefore outlives it (the file cannot be closed under it); the
//! client refuses to destroy or resize the driver object any other way while
//! it lives. `destroy` consumes the object and drops its ring views before
//! the destroy IOCTL is sent; a refused destroy (busy) gives the object back,
//! views rebuilt. Dropping an object destroys it the same way, ignoring a
//! refusal (the driver object then lives until the file is closed).
#![allow(
    unsafe_code,
    reason = "viewing a created object's mapped rings (Ring::from_map), under the SpeedPath contract"
)]

use irpverbs_abi::*;

use crate::speed::{CqRings, Doorbells, PostError, QpRings, RecvWr, SendWr, SrqRings};
use crate::{Client, IoctlResult, Kind, call, call_none, rts_steps};

const PRESENT: &str = "a live speed-path object holds its ring views";

impl Client {
    fn bells(&self) -> IoctlResult<&dyn Doorbells> {
        self.doorbells().ok_or(STATUS_NOT_SUPPORTED)
    }

    /// `IOCTL_IV_CREATE_CQ`, returning the speed-path CQ.
    ///
    /// # Errors
    /// The create's status; `STATUS_NOT_SUPPORTED` (nothing sent) without
    /// the speed path; the status of mapping the ring; or
    /// `STATUS_INVALID_PARAMETER` if the ring the driver returned is
    /// malformed (the CQ is destroyed again in both cases).
    pub fn new_cq(&self, i: &IvCreateCqIn) -> IoctlResult<Cq<'_>> {
        let bells = self.bells()?;
        let mut out: IvCreateCqOut = call(self, IOCTL_IV_CREATE_CQ, i)?;
        self.hold(Kind::Cq, out.cq);
        let mut map = IvMapRingsOut::default();
        let mapped = self.map_rings(out.cq).map(|m| {
            out.ring = m.ring;
            map = m;
        });
        // SAFETY: the ring is mapped into this process (IOCTL_IV_MAP_RINGS)
        // until the CQ is destroyed or resized or its file closed (the
        // driver's contract); the file is closed only when the client (which
        // the `Cq` borrows) is dropped (the `SpeedPath` contract), and the
        // client refuses destroys and resizes of a held CQ except through
        // the `Cq`, which drops its view first.
        match mapped.and_then(|()| unsafe { CqRings::from_map(out.cqn, &out.ring) }) {
            Ok(rings) => Ok(Cq {
                client: self,
                bells,
                out,
                map,
                rings: Some(rings.with_doorbells(&map)),
                destroyed: false,
            }),
            Err(status) => {
                self.release(Kind::Cq, out.cq);
                let _ = self.destroy_cq(out.cq);
                Err(status)
            }
        }
    }

    /// `IOCTL_IV_CREATE_QP`, returning the speed-path QP.
    ///
    /// # Errors
    /// As [`Client::new_cq`].
    pub fn new_qp(&self, i: &IvCreateQpIn) -> IoctlResult<Qp<'_>> {
        let bells = self.bells()?;
        let mut out: IvCreateQpOut = call(self, IOCTL_IV_CREATE_QP, i)?;
        self.hold(Kind::Qp, out.qp);
        let mut map = IvMapRingsOut::default();
        let mapped = self.map_rings(out.qp).map(|m| {
            (out.sq, out.rq) = (m.ring, m.rq);
            map = m;
        });
        // SAFETY: as in `new_cq`, for the QP's rings.
        match mapped.and_then(|()| unsafe { QpRings::from_create(&out) }) {
            Ok(rings) => Ok(Qp {
                client: self,
                bells,
                qp_type: i.qp_type,
                out,
                map,
                rings: Some(rings.with_doorbells(&map)),
            }),
            Err(status) => {
                self.release(Kind::Qp, out.qp);
                let _ = self.destroy_qp(out.qp);
                Err(status)
            }
        }
    }

    /// `IOCTL_IV_CREATE_SRQ`, returning the speed-path SRQ.
    ///
    /// # Errors
    /// As [`Client::new_cq`].
    pub fn new_srq(&self, i: &IvCreateSrqIn) -> IoctlResult<Srq<'_>> {
        let bells = self.bells()?;
        let mut out: IvCreateSrqOut = call(self, IOCTL_IV_CREATE_SRQ, i)?;
        self.hold(Kind::Srq, out.srq);
        let mut map = IvMapRingsOut::default();
        let mapped = self.map_rings(out.srq).map(|m| {
            out.ring = m.ring;
            map = m;
        });
        // SAFETY: as in `new_cq`, for the SRQ's ring.
        match mapped.and_then(|()| unsafe { SrqRings::from_create(&out) }) {
            Ok(rings) => Ok(Srq {
                client: self,
                bells,
                out,
                map,
                rings: Some(rings.with_doorbells(&map)),
            }),
            Err(status) => {
                self.release(Kind::Srq, out.srq);
                let _ = self.destroy_srq(out.srq);
                Err(status)
            }
        }
    }
}

/// Sends a destroy for `handle` after the caller dropped its views, and
/// releases the hold when the driver destroyed it.
fn destroy(client: &Client, code: u32, kind: Kind, handle: IvHandle) -> IoctlResult<()> {
    call_none(client.unguarded(), code, &IvHandleIn { handle })?;
    client.release(kind, handle);
    Ok(())
}

/// A CQ with its ring mapped: `poll` and `req_notify` are direct calls.
pub struct Cq<'c> {
    client: &'c Client,
    bells: &'c dyn Doorbells,
    out: IvCreateCqOut,
    /// The last `IOCTL_IV_MAP_RINGS` response: the ring's doorbell slot.
    map: IvMapRingsOut,
    /// `None` inside `destroy`, `resize` and `drop`, and after a resize
    /// whose new ring could not be mapped.
    rings: Option<CqRings>,
    /// `destroy` destroyed the driver's CQ.
    destroyed: bool,
}

impl std::fmt::Debug for Cq<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cq")
            .field("handle", &self.out.cq)
            .field("cqn", &self.out.cqn)
            .field("cqe", &self.out.cqe)
            .finish_non_exhaustive()
    }
}

impl Cq<'_> {
    /// The CQ's handle (for create-QP requests).
    #[must_use]
    pub fn handle(&self) -> IvHandle {
        self.out.cq
    }

    /// The CQ number.
    #[must_use]
    pub fn cqn(&self) -> u32 {
        self.out.cqn
    }

    /// Its entries.
    #[must_use]
    pub fn cqe(&self) -> u32 {
        self.out.cqe
    }

    /// The ring view (what the HCA writes into).
    ///
    /// # Panics
    /// After a [`Cq::resize`] that resized the CQ but could not map its new
    /// ring (it said so): the CQ then has no ring until a resize succeeds.
    #[must_use]
    pub fn rings(&self) -> &CqRings {
        self.rings.as_ref().expect(PRESENT)
    }

    /// `poll_cq`: takes up to `out.len()` completions, oldest first.
    /// Callable at IRQL <= DISPATCH_LEVEL.
    ///
    /// # Errors
    /// [`crate::speed::Corrupt`] if the HCA's producer index is impossible.
    pub fn poll(&self, out: &mut [IvCqe]) -> Result<usize, crate::speed::Corrupt> {
        self.rings().poll(out)
    }

    /// `req_notify_cq`: arms the CQ for its next completion (or the next
    /// solicited one) and rings the arm doorbell. Callable at IRQL <=
    /// DISPATCH_LEVEL.
    pub fn req_notify(&self, solicited_only: bool) {
        self.rings().req_notify(self.bells, solicited_only);
    }

    /// `ibv_ack_cq_events`: acknowledges `count` events of this CQ taken
    /// from its completion channel ([`Client::ack_cq_events`]).
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER` for zero or more events than were
    /// delivered and not yet acknowledged.
    pub fn ack_events(&self, count: u32) -> IoctlResult<()> {
        self.client.ack_cq_events(self.out.cq, count)
    }

    /// `IOCTL_IV_RESIZE_CQ`: the driver moves the CQ to a new ring; the view
    /// follows it.
    ///
    /// # Errors
    /// The resize's status; the CQ is unchanged. Or, the CQ resized, the
    /// status of mapping its new ring: the CQ then has no ring view (see
    /// [`Cq::rings`]) until a later resize maps one.
    pub fn resize(&mut self, cqe: u32) -> IoctlResult<()> {
        drop(self.rings.take());
        let resized: IoctlResult<IvResizeCqOut> = call(
            self.client.unguarded(),
            IOCTL_IV_RESIZE_CQ,
            &IvResizeCqIn {
                cq: self.out.cq,
                cqe,
                reserved: 0,
            },
        );
        let r = resized.inspect_err(|_| {
            // SAFETY: a failed verb changes nothing: the old ring is still
            // mapped for as long as the CQ lives, which is as long as `self`
            // (see `Client::new_cq`).
            self.rings = unsafe { CqRings::from_map(self.out.cqn, &self.out.ring) }
                .ok()
                .map(|r| r.with_doorbells(&self.map));
        })?;
        self.out.cqe = r.cqe;
        // The old ring is gone (unmapped at the next request): only the
        // new one may be viewed.
        self.out.ring = IvRingMap::default();
        let m = self.client.map_rings(self.out.cq)?;
        self.out.ring = m.ring;
        self.map = m;
        // SAFETY: the new ring is mapped for as long as the CQ lives (as in
        // `Client::new_cq`).
        let rings = unsafe { CqRings::from_map(self.out.cqn, &self.out.ring) }?;
        self.rings = Some(rings.with_doorbells(&self.map));
        Ok(())
    }

    /// `IOCTL_IV_DESTROY_CQ`, after dropping the ring view.
    ///
    /// # Errors
    /// The refusal (`STATUS_DEVICE_BUSY` while QPs use it) and the CQ,
    /// unchanged and usable.
    pub fn destroy(mut self) -> Result<(), (Self, NtStatus)> {
        let had_view = self.rings.take().is_some();
        match destroy(self.client, IOCTL_IV_DESTROY_CQ, Kind::Cq, self.out.cq) {
            Ok(()) => {
                self.destroyed = true;
                Ok(())
            }
            Err(status) => {
                if had_view {
                    // SAFETY: the destroy failed, so the CQ and its ring
                    // still exist (a failed verb changes nothing), held as
                    // before.
                    self.rings = unsafe { CqRings::from_map(self.out.cqn, &self.out.ring) }
                        .ok()
                        .map(|r| r.with_doorbells(&self.map));
                }
                Err((self, status))
            }
        }
    }
}

impl Drop for Cq<'_> {
    fn drop(&mut self) {
        if !self.destroyed {
            drop(self.rings.take());
            let _ = destroy(self.client, IOCTL_IV_DESTROY_CQ, Kind::Cq, self.out.cq);
            self.client.release(Kind::Cq, self.out.cq);
        }
    }
}

/// A QP with its rings mapped: `post_send` and `post_recv` are direct calls.
pub struct Qp<'c> {
    client: &'c Client,
    bells: &'c dyn Doorbells,
    qp_type: u32,
    out: IvCreateQpOut,
    /// The `IOCTL_IV_MAP_RINGS` response: the queues' doorbell slots.
    map: IvMapRingsOut,
    /// `None` only inside `destroy` and `drop`.
    rings: Option<QpRings>,
}

impl std::fmt::Debug for Qp<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qp")
            .field("handle", &self.out.qp)
            .field("qpn", &self.out.qpn)
            .field("qp_type", &self.qp_type)
            .finish_non_exhaustive()
    }
}

impl<'c> Qp<'c> {
    /// The QP's handle.
    #[must_use]
    pub fn handle(&self) -> IvHandle {
        self.out.qp
    }

    /// The QP number.
    #[must_use]
    pub fn qpn(&self) -> u32 {
        self.out.qpn
    }

    /// `IV_QPT_*`.
    #[must_use]
    pub fn qp_type(&self) -> u32 {
        self.qp_type
    }

    /// The actual work queue sizes.
    #[must_use]
    pub fn cap(&self) -> IvQpCap {
        self.out.cap
    }

    /// The client that created it.
    #[must_use]
    pub fn client(&self) -> &'c Client {
        self.client
    }

    /// The ring views (what the HCA reads).
    #[must_use]
    pub fn rings(&self) -> &QpRings {
        self.rings.as_ref().expect(PRESENT)
    }

    /// `post_send`: writes `wr` to the send queue and rings the doorbell.
    /// Callable at IRQL <= DISPATCH_LEVEL.
    ///
    /// # Errors
    /// [`PostError`] (see [`crate::AsNtStatus`]); nothing was posted.
    pub fn post_send(&self, wr: &SendWr<'_>) -> Result<(), PostError> {
        self.rings().post_send(self.bells, wr)
    }

    /// Posts `wrs` in order with one doorbell.
    ///
    /// # Errors
    /// The index of the first one not posted, and why.
    pub fn post_send_list(&self, wrs: &[SendWr<'_>]) -> Result<(), (usize, PostError)> {
        self.rings().post_send_list(self.bells, wrs)
    }

    /// `post_recv`: posts a receive buffer (scatter list `sges`) and rings
    /// the receive doorbell. Callable at IRQL <= DISPATCH_LEVEL.
    ///
    /// # Errors
    /// [`PostError`]; [`PostError::Invalid`] on a QP with an SRQ.
    pub fn post_recv(&self, wr_id: u64, sges: &[IvSge]) -> Result<(), PostError> {
        self.rings().post_recv(self.bells, wr_id, sges)
    }

    /// `post_recv` with a chain: posts `wrs` in order with one doorbell.
    /// Callable at IRQL <= DISPATCH_LEVEL.
    ///
    /// # Errors
    /// The index of the first one not posted, and why; those before it
    /// were posted.
    pub fn post_recv_list(&self, wrs: &[RecvWr<'_>]) -> Result<(), (usize, PostError)> {
        self.rings().post_recv_list(self.bells, wrs)
    }

    /// `IOCTL_IV_MODIFY_QP`.
    ///
    /// # Errors
    /// The driver's status.
    pub fn modify(&self, attr_mask: u32, attr: &IvQpAttr) -> IoctlResult<()> {
        self.client.modify_qp(self.out.qp, attr_mask, attr)
    }

    /// `IOCTL_IV_QUERY_QP`.
    ///
    /// # Errors
    /// The driver's status.
    pub fn query(&self) -> IoctlResult<IvQueryQpOut> {
        self.client.query_qp(self.out.qp)
    }

    /// Walks the QP from RESET to RTS against `dest_qpn` at `gid` (ignored
    /// for UD), as [`Client::connect_qp`].
    ///
    /// # Errors
    /// The first failing modify's status.
    pub fn connect(&self, dest_qpn: u32, gid: [u8; 16]) -> IoctlResult<()> {
        for (mask, attr) in rts_steps(self.qp_type, dest_qpn, gid) {
            self.modify(mask, &attr)?;
        }
        Ok(())
    }

    /// `IOCTL_IV_DESTROY_QP`, after dropping the ring views.
    ///
    /// # Errors
    /// The refusal and the QP, unchanged and usable.
    pub fn destroy(mut self) -> Result<(), (Self, NtStatus)> {
        drop(self.rings.take());
        match destroy(self.client, IOCTL_IV_DESTROY_QP, Kind::Qp, self.out.qp) {
            Ok(()) => Ok(()),
            Err(status) => {
                // SAFETY: the destroy failed: the QP and its rings still
                // exist, held as before.
                self.rings = unsafe { QpRings::from_create(&self.out) }
                    .ok()
                    .map(|r| r.with_doorbells(&self.map));
                Err((self, status))
            }
        }
    }
}

impl Drop for Qp<'_> {
    fn drop(&mut self) {
        if let Some(rings) = self.rings.take() {
            drop(rings);
            let _ = destroy(self.client, IOCTL_IV_DESTROY_QP, Kind::Qp, self.out.qp);
            self.client.release(Kind::Qp, self.out.qp);
        }
    }
}

/// An SRQ with its ring mapped: `post_recv` is a direct call.
pub struct Srq<'c> {
    client: &'c Client,
    bells: &'c dyn Doorbells,
    out: IvCreateSrqOut,
    /// The `IOCTL_IV_MAP_RINGS` response: the ring's doorbell slot.
    map: IvMapRingsOut,
    /// `None` only inside `destroy` and `drop`.
    rings: Option<SrqRings>,
}

impl std::fmt::Debug for Srq<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Srq")
            .field("handle", &self.out.srq)
            .field("srqn", &self.out.srqn)
            .finish_non_exhaustive()
    }
}

impl Srq<'_> {
    /// The SRQ's handle (for create-QP requests).
    #[must_use]
    pub fn handle(&self) -> IvHandle {
        self.out.srq
    }

    /// The SRQ number.
    #[must_use]
    pub fn srqn(&self) -> u32 {
        self.out.srqn
    }

    /// The ring view.
    #[must_use]
    pub fn rings(&self) -> &SrqRings {
        self.rings.as_ref().expect(PRESENT)
    }

    /// `post_srq_recv`. Callable at IRQL <= DISPATCH_LEVEL.
    ///
    /// # Errors
    /// [`PostError`]; nothing was posted.
    pub fn post_recv(&self, wr_id: u64, sges: &[IvSge]) -> Result<(), PostError> {
        self.rings().post_recv(self.bells, wr_id, sges)
    }

    /// `post_srq_recv` with a chain: posts `wrs` in order with one
    /// doorbell. Callable at IRQL <= DISPATCH_LEVEL.
    ///
    /// # Errors
    /// The index of the first one not posted, and why; those before it
    /// were posted.
    pub fn post_recv_list(&self, wrs: &[RecvWr<'_>]) -> Result<(), (usize, PostError)> {
        self.rings().post_recv_list(self.bells, wrs)
    }

    /// `IOCTL_IV_MODIFY_SRQ`.
    ///
    /// # Errors
    /// The driver's status.
    pub fn modify(&self, attr_mask: u32, max_wr: u32, srq_limit: u32) -> IoctlResult<()> {
        self.client
            .modify_srq(self.out.srq, attr_mask, max_wr, srq_limit)
    }

    /// `IOCTL_IV_QUERY_SRQ`.
    ///
    /// # Errors
    /// The driver's status.
    pub fn query(&self) -> IoctlResult<IvQuerySrqOut> {
        self.client.query_srq(self.out.srq)
    }

    /// `IOCTL_IV_DESTROY_SRQ`, after dropping the ring view.
    ///
    /// # Errors
    /// The refusal (`STATUS_DEVICE_BUSY` while QPs use it) and the SRQ.
    pub fn destroy(mut self) -> Result<(), (Self, NtStatus)> {
        drop(self.rings.take());
        match destroy(self.client, IOCTL_IV_DESTROY_SRQ, Kind::Srq, self.out.srq) {
            Ok(()) => Ok(()),
            Err(status) => {
                // SAFETY: the destroy failed: the SRQ and its ring still
                // exist, held as before.
                self.rings = unsafe { SrqRings::from_create(&self.out) }
                    .ok()
                    .map(|r| r.with_doorbells(&self.map));
                Err((self, status))
            }
        }
    }
}

impl Drop for Srq<'_> {
    fn drop(&mut self) {
        if let Some(rings) = self.rings.take() {
            drop(rings);
            let _ = destroy(self.client, IOCTL_IV_DESTROY_SRQ, Kind::Srq, self.out.srq);
            self.client.release(Kind::Srq, self.out.srq);
        }
    }
}
