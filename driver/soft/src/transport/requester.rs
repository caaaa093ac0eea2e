//! The requester: turns send WQEs into request packets.
//!
//! A QP's requester runs when its send queue doorbell was rung (or its
//! completer made room). In RTS it takes each new WQE from the ring once,
//! straight into its shadow of the slot ([`SendSlot`], the WQE header and
//! its gather list), validates it, gives it its PSNs and packetizes it by
//! the path MTU (FIRST / MIDDLE / LAST, or ONLY). In SQD it only finishes
//! the WQE it is in the middle of. Posts in RESET, INIT and RTR stay on the
//! ring until RTS; in ERR and SQE the send queue is flushed.
//!
//! A payload is never copied here: a packet's payload is a list of
//! segments of the source MRs (or of the send queue slot, for inline data)
//! that the receiver copies from.
//!
//! Local errors complete the WQE in error and stop the QP: RC goes to ERR,
//! UC and UD to SQE (IBTA 10.3.1; their receive side keeps working).
//! - `LOC_QP_OP_ERR`: a WQE the ring reader refuses (unknown opcode or
//!   flags, too many SGEs, inline data too long, non-zero reserved field),
//!   an opcode the QP type does not have (UC: READ, atomics, SEND with
//!   invalidate; UD: all but SEND and SEND with immediate), inline data on
//!   a READ or atomic, a UD WQE naming no AH.
//! - `LOC_PROT_ERR`: an SGE whose lkey names no valid MR, an MR of another
//!   PD, an SGE outside its MR, a READ or atomic target without
//!   LOCAL_WRITE; a UD AH of another PD.
//! - `LOC_LEN_ERR`: a message over the port's `max_msg_sz`, a UD message
//!   over the MTU, an atomic whose local buffer is not 8 bytes.
//! - `MW_BIND_ERR`: an `IV_WR_BIND_MW` the window rules refuse;
//!   `LOC_QP_OP_ERR` also for an `IV_WR_LOCAL_INV` of anything but a bound
//!   type 2 window or a valid fast-register MR of the QP's PD
//!   (docs/memory-windows.md), and for an `IV_WR_REG_MR` the registration
//!   rules refuse, `LOC_PROT_ERR` for one whose pages its MRs do not hold
//!   (docs/fast-registration.md). These local operations send nothing:
//!   they run when the requester reaches them and complete in order after
//!   the WQEs before them.

use alloc::vec::Vec;
use core::sync::atomic::Ordering;

use irpverbs_abi::{
    IV_QPT_RC, IV_QPT_UC, IV_QPT_UD, IV_SEND_FENCE, IV_SEND_INLINE, IV_SEND_SIGNALED,
    IV_SEND_SOLICITED, IV_SEND_WQE_HEADER, IV_WC_LOC_LEN_ERR, IV_WC_LOC_PROT_ERR,
    IV_WC_LOC_QP_OP_ERR, IV_WC_MW_BIND_ERR, IV_WC_OP_BIND_MW, IV_WC_OP_COMP_SWAP,
    IV_WC_OP_FETCH_ADD, IV_WC_OP_LOCAL_INV, IV_WC_OP_RDMA_READ, IV_WC_OP_RDMA_WRITE,
    IV_WC_OP_REG_MR, IV_WC_OP_SEND, IV_WC_SUCCESS, IV_WR_ATOMIC_CMP_AND_SWP,
    IV_WR_ATOMIC_FETCH_AND_ADD, IV_WR_BIND_MW, IV_WR_LOCAL_INV, IV_WR_RDMA_READ, IV_WR_RDMA_WRITE,
    IV_WR_RDMA_WRITE_WITH_IMM, IV_WR_REG_MR, IV_WR_SEND, IV_WR_SEND_WITH_IMM, IV_WR_SEND_WITH_INV,
    IvSendWqe, IvSge,
};
use irpverbs_core::AsyncEvent;

use crate::firmware::SOFT_PAGE_SIZE_CAP;
use irpverbs_ring::Ring;
use irpverbs_ring::wq::{WqeError, read_send_wqe_into};

use crate::firmware::port::MAX_MSG_SZ;
use crate::firmware::qp::{Qp, QpState};
use crate::firmware::qp_state::{Progress, ReqState, SendSlot, Window};
use crate::transport::dma::{
    DmaError, Payload, check_sges, for_each_piece, gather, mr_index, resolve_sge,
};
use crate::transport::engine::{DEFAULT_PKEY, Env, enter_error, send_error};
use crate::wire::packet::{AtomicEth, Burst, Deth, Packet, Reth, Seg, op, psn_add};

/// RC: a packet asks for an ACK at least this often (unsignaled WQEs retire
/// when an ACK covers them).
pub(crate) const ACK_EVERY: u32 = 64;

/// The IBTA rule of the Q_Key: a WR Q_Key with the high bit set means "use
/// the QP's own" (a controlled Q_Key).
pub(crate) const QKEY_CONTROLLED: u32 = 0x8000_0000;

impl Window {
    /// Never below two ACK requests' worth of packets: a full window always
    /// has an ACK on its way (a requester asks every [`ACK_EVERY`] packets,
    /// and at a full window).
    pub(crate) const MIN: u32 = 2 * ACK_EVERY;

    /// Packets the requester may still send from `next` (the PSN it sends
    /// next).
    pub(crate) fn room(&self, next: u32) -> u32 {
        let out =
            u32::try_from(crate::wire::packet::psn_diff(next, self.acked).max(0)).unwrap_or(0);
        self.cwnd.saturating_sub(out)
    }

    /// Everything before `psn` is acknowledged: the window slides and
    /// grows. Returns true when the requester was waiting for it.
    pub(crate) fn acknowledge(&mut self, psn: u32) -> bool {
        let n = crate::wire::packet::psn_diff(psn, self.acked);
        if n <= 0 {
            return false;
        }
        self.acked = psn;
        let n = u32::try_from(n).unwrap_or(0);
        if self.cwnd < self.threshold {
            self.cwnd = self.cwnd.saturating_add(n).min(self.threshold);
        } else {
            self.grown = self.grown.saturating_add(n);
            if self.grown >= self.cwnd {
                self.grown = 0;
                self.cwnd = (self.cwnd + 1).min(Self::MAX);
            }
        }
        core::mem::take(&mut self.waiting)
    }

    /// A retry: the window shrinks (to a quarter after a timeout, else
    /// half), and the threshold with it.
    pub(crate) fn shrink(&mut self, timeout: bool) {
        let cwnd = if timeout {
            self.cwnd / 4
        } else {
            self.cwnd / 2
        };
        self.cwnd = cwnd.max(Self::MIN);
        self.threshold = self.cwnd;
        self.grown = 0;
    }
}

impl ReqState {
    pub(crate) fn slot_index(&self, i: u32) -> usize {
        (i as usize) & (self.slots.len().max(1) - 1)
    }

    /// The shadow of ring index `i`.
    pub(crate) fn slot(&self, i: u32) -> &SendSlot {
        &self.slots[self.slot_index(i)]
    }

    /// The shadow of ring index `i`, mutably.
    pub(crate) fn slot_mut(&mut self, i: u32) -> &mut SendSlot {
        let k = self.slot_index(i);
        &mut self.slots[k]
    }

    /// Reads the WQE at ring index `i` of `ring` into its shadow (the slot,
    /// cleared first, and the gather list), checked as
    /// [`read_send_wqe_into`] checks it with the QP's `cap`: the header and
    /// the gather list. On an error the slot holds what was read.
    ///
    /// # Errors
    /// [`WqeError`], as the reader reports it.
    #[inline(always)]
    pub(crate) fn read_shadow(
        &mut self,
        ring: &Ring,
        i: u32,
        cap: &irpverbs_abi::IvQpCap,
    ) -> Result<(&IvSendWqe, &[IvSge]), WqeError> {
        let k = self.slot_index(i);
        let per = self.sge_per_slot;
        let slot = &mut self.slots[k];
        let shadow = &mut self.sges[k * per..(k + 1) * per];
        *slot = SendSlot {
            local: slot.local,
            ..SendSlot::default()
        };
        let nsge = read_send_wqe_into(
            ring,
            i,
            cap.max_send_sge,
            cap.max_inline_data,
            &mut slot.wqe,
            shadow,
        )?;
        // At most 32, checked by the reader.
        slot.nsge = u8::try_from(nsge).unwrap_or(0);
        Ok((&slot.wqe, &shadow[..nsge]))
    }

    /// The gather list of ring index `i`.
    pub(crate) fn sges(&self, i: u32) -> &[IvSge] {
        let k = self.slot_index(i);
        let n = usize::from(self.slots[k].nsge);
        &self.sges[k * self.sge_per_slot..k * self.sge_per_slot + n]
    }

    /// Back to a new QP's state (RESET), keeping the shadow.
    pub(crate) fn reset(&mut self) {
        self.resync(0);
        self.set_psn(0);
        self.retry_left = 0;
        self.rewound_to = None;
        self.rnr_left = 0;
    }

    /// The next PSN is `psn`, nothing in flight (a new window).
    pub(crate) fn set_psn(&mut self, psn: u32) {
        self.psn = psn;
        self.sent_end = psn;
        self.window = Window::at(psn);
    }

    /// Nothing outstanding from `pi` on: every WQE before it is retired.
    pub(crate) fn resync(&mut self, pi: u32) {
        for s in &mut self.slots {
            s.local = false;
        }
        self.ci = pi;
        self.next = pi;
        self.cur = None;
        self.rd_atomic = 0;
        self.rnr_wait = false;
        self.unacked = 0;
        self.solicit = false;
    }

    /// WQEs started and not retired.
    pub(crate) fn in_flight(&self) -> bool {
        self.ci != self.next
    }
}

/// The completion opcode of a send WQE opcode.
pub(crate) const fn wc_opcode(wr: u8) -> u32 {
    match wr {
        IV_WR_RDMA_WRITE | IV_WR_RDMA_WRITE_WITH_IMM => IV_WC_OP_RDMA_WRITE,
        IV_WR_RDMA_READ => IV_WC_OP_RDMA_READ,
        IV_WR_ATOMIC_CMP_AND_SWP => IV_WC_OP_COMP_SWAP,
        IV_WR_ATOMIC_FETCH_AND_ADD => IV_WC_OP_FETCH_ADD,
        IV_WR_BIND_MW => IV_WC_OP_BIND_MW,
        IV_WR_LOCAL_INV => IV_WC_OP_LOCAL_INV,
        IV_WR_REG_MR => IV_WC_OP_REG_MR,
        _ => IV_WC_OP_SEND,
    }
}

/// A READ or an atomic (needs a response, counts against `max_rd_atomic`).
pub(crate) const fn is_rd_atomic(wr: u8) -> bool {
    matches!(
        wr,
        IV_WR_RDMA_READ | IV_WR_ATOMIC_CMP_AND_SWP | IV_WR_ATOMIC_FETCH_AND_ADD
    )
}

/// Whether QP type `qpt` has send opcode `wr`.
const fn opcode_allowed(qpt: u32, wr: u8) -> bool {
    match qpt {
        IV_QPT_RC => true,
        IV_QPT_UC => matches!(
            wr,
            IV_WR_SEND
                | IV_WR_SEND_WITH_IMM
                | IV_WR_RDMA_WRITE
                | IV_WR_RDMA_WRITE_WITH_IMM
                | IV_WR_BIND_MW
                | IV_WR_LOCAL_INV
                | IV_WR_REG_MR
        ),
        IV_QPT_UD => matches!(wr, IV_WR_SEND | IV_WR_SEND_WITH_IMM),
        _ => false,
    }
}

/// Packets in a message of `len` bytes at `mtu` (a power of two).
pub(crate) const fn packets(len: u32, mtu: u32) -> u32 {
    if len == 0 {
        1
    } else {
        // A shift, not a division: this is on every message's path.
        ((len as u64 + mtu as u64 - 1) >> mtu.trailing_zeros()) as u32
    }
}

/// Runs QP `qpn`'s requester: at most `budget` packets. Returns the
/// packets emitted; a QP with work left is put back on the ready list.
/// With `peer` (an RC QP whose peer is a QP of this HCA) its requests are
/// short-circuited to the peer ([`crate::transport::local`]) while the
/// wire allows it, and the peer's coalesced ACK is taken at the end.
pub(crate) fn run(
    qpn: u32,
    qp: &mut Qp,
    mut peer: Option<&mut Qp>,
    env: &mut Env<'_>,
    budget: usize,
) -> usize {
    match qp.state {
        QpState::Err | QpState::Sqe => {
            crate::transport::engine::flush_sq(qpn, qp, env);
            return 0;
        }
        QpState::Rts | QpState::Sqd => {}
        QpState::Reset | QpState::Init | QpState::Rtr => return 0,
    }
    let mut sent = 0;
    loop {
        // (A short-circuited RNR NAK stops it at once.)
        if qp.tx.req.rnr_wait {
            break;
        }
        if let Some(p) = qp.tx.req.cur {
            if sent >= budget {
                env.dp.schedule(qpn, &mut qp.tx);
                break;
            }
            match emit_next(qpn, qp, peer.as_deref_mut(), env, p) {
                // The window is full: an ACK schedules the requester.
                Ok(0) => break,
                Ok(n) => sent += n as usize,
                Err(status) => {
                    fail(qpn, qp, env, p.index, status);
                    break;
                }
            }
            continue;
        }
        if qp.state != QpState::Rts {
            break;
        }
        let ring = &qp.sq.0;
        let pi = ring.producer_word().load(Ordering::Acquire);
        let req = &qp.tx.req;
        if req.next == pi {
            break;
        }
        let posted = pi.wrapping_sub(req.ci);
        if posted > ring.capacity() || req.next.wrapping_sub(req.ci) > posted {
            // The ULP published an impossible producer index.
            enter_error(qpn, qp, env, Some(AsyncEvent::QpFatal(qpn)));
            break;
        }
        if sent >= budget {
            env.dp.schedule(qpn, &mut qp.tx);
            break;
        }
        match start(qpn, qp, env) {
            Ok(true) => {}
            Ok(false) => break,
            Err(status) => {
                let index = qp.tx.req.next.wrapping_sub(1);
                fail(qpn, qp, env, index, status);
                break;
            }
        }
        if qp.tx.req.cur.is_none() {
            // UD: its one packet went out from `start`.
            sent += 1;
        }
    }
    if let Some(dest) = peer {
        crate::transport::local::ack(qpn, qp, dest, env);
    }
    if sent > 0 {
        crate::transport::engine::arm_rto(qpn, qp, env);
    }
    sent
}

/// Fails WQE `index` with `status` and stops the QP (RC: ERR; UC, UD: SQE).
fn fail(qpn: u32, qp: &mut Qp, env: &mut Env<'_>, index: u32, status: u32) {
    let slot = qp.tx.req.slot_mut(index);
    slot.done = true;
    slot.status = status;
    qp.tx.req.cur = None;
    crate::transport::completer::retire(qpn, qp, env);
    send_error(qpn, qp, env);
}

/// Takes the next WQE from the ring. `Ok(false)`: it must wait (fence, or
/// too many READs / atomics outstanding); `Err`: it completes in error
/// (it counts as started).
#[inline(never)]
fn start(qpn: u32, qp: &mut Qp, env: &mut Env<'_>) -> Result<bool, u32> {
    let index = qp.tx.req.next;
    if qp.tx.req.slot(index).local {
        // Executed before a rewind: done already.
        qp.tx.req.next = index.wrapping_add(1);
        return Ok(true);
    }
    let (wqe, shadow) = match qp.tx.req.read_shadow(&qp.sq.0, index, &qp.cap) {
        Ok((wqe, shadow)) => (*wqe, shadow),
        Err(_) => {
            qp.tx.req.next = index.wrapping_add(1);
            return Err(IV_WC_LOC_QP_OP_ERR);
        }
    };
    let nsge = shadow.len();
    let inline = wqe.flags & IV_SEND_INLINE != 0;
    if matches!(wqe.opcode, IV_WR_BIND_MW | IV_WR_LOCAL_INV | IV_WR_REG_MR) {
        return local_op(qpn, qp, env, index, &wqe, nsge);
    }
    let rd_atomic = is_rd_atomic(wqe.opcode);
    let check = (|| {
        if !opcode_allowed(qp.qp_type, wqe.opcode) || (inline && rd_atomic) {
            return Err(IV_WC_LOC_QP_OP_ERR);
        }
        let length = if inline {
            u64::from(wqe.inline_len)
        } else {
            shadow[..nsge].iter().map(|s| u64::from(s.length)).sum()
        };
        if length > u64::from(MAX_MSG_SZ) {
            return Err(IV_WC_LOC_LEN_ERR);
        }
        // READ and atomic targets are written later: checked now. Other
        // gather lists are checked as their packets are built, at once.
        if !inline && (rd_atomic || qp.qp_type == IV_QPT_UD) {
            check_sges(env.mrs, qp.pdn, &shadow[..nsge], rd_atomic)
                .map_err(|_| IV_WC_LOC_PROT_ERR)?;
        }
        let atomic = matches!(
            wqe.opcode,
            IV_WR_ATOMIC_CMP_AND_SWP | IV_WR_ATOMIC_FETCH_AND_ADD
        );
        if atomic && length != 8 {
            return Err(IV_WC_LOC_LEN_ERR);
        }
        if qp.qp_type == IV_QPT_UD {
            let ah = env.ahs.get(wqe.ahn).map_err(|_| IV_WC_LOC_QP_OP_ERR)?;
            if ah.pdn != qp.pdn {
                return Err(IV_WC_LOC_PROT_ERR);
            }
            if length > u64::from(qp.tx.mtu) {
                return Err(IV_WC_LOC_LEN_ERR);
            }
        }
        // Below 2^31, checked.
        Ok(u32::try_from(length).unwrap_or(u32::MAX))
    })();
    let length = match check {
        Ok(l) => l,
        Err(status) => {
            qp.tx.req.next = index.wrapping_add(1);
            return Err(status);
        }
    };
    let req = &mut qp.tx.req;
    if rd_atomic && req.rd_atomic >= u32::from(qp.attr.max_rd_atomic).max(1) {
        return Ok(false);
    }
    if wqe.flags & IV_SEND_FENCE != 0 && req.rd_atomic > 0 {
        return Ok(false);
    }
    let npkts = match wqe.opcode {
        IV_WR_ATOMIC_CMP_AND_SWP | IV_WR_ATOMIC_FETCH_AND_ADD => 1,
        _ => packets(length, qp.tx.mtu),
    };
    let (first, _) = issue(req, index, length, npkts);
    if rd_atomic {
        req.rd_atomic += 1;
    }
    if qp.qp_type == IV_QPT_UD {
        send_ud(qpn, qp, env, index)?;
    } else {
        qp.tx.req.cur = Some(Progress {
            index,
            offset: 0,
            psn: first,
        });
    }
    Ok(true)
}

/// A local operation at ring index `index` (read into its shadow), executed
/// now, in order with the WQEs before it: a type 2 window's bind or a
/// local invalidate (`crate::firmware::mw`). It sends nothing; its slot is
/// done, and it completes when the WQEs before it have.
///
/// # Errors
/// `IV_WC_LOC_QP_OP_ERR` for an opcode the QP type does not have, SGEs
/// or inline data, and a local invalidate `crate::firmware::mw::invalidate`
/// refuses; `IV_WC_MW_BIND_ERR` for a bind
/// `crate::firmware::mw::bind_wr` refuses.
fn local_op(
    qpn: u32,
    qp: &mut Qp,
    env: &mut Env<'_>,
    index: u32,
    wqe: &IvSendWqe,
    nsge: usize,
) -> Result<bool, u32> {
    qp.tx.req.next = index.wrapping_add(1);
    // Only a registration has SGEs: its page list.
    let sges_ok = nsge == 0 || wqe.opcode == IV_WR_REG_MR;
    if !opcode_allowed(qp.qp_type, wqe.opcode) || !sges_ok || wqe.flags & IV_SEND_INLINE != 0 {
        return Err(IV_WC_LOC_QP_OP_ERR);
    }
    let (mrs, mws) = (&mut *env.mrs, &mut *env.mws);
    match wqe.opcode {
        IV_WR_BIND_MW => crate::firmware::mw::bind_wr(mrs, mws, qpn, qp.pdn, wqe)
            .map_err(|()| IV_WC_MW_BIND_ERR)?,
        IV_WR_REG_MR => {
            let pages = qp.tx.req.sges(index);
            crate::firmware::fast_reg::reg_wr(mrs, qp.pdn, SOFT_PAGE_SIZE_CAP, wqe, pages)?;
        }
        _ => crate::firmware::mr::invalidate(mrs, mws, qp.pdn, wqe.imm_or_inv)
            .map_err(|()| IV_WC_LOC_QP_OP_ERR)?,
    }
    let req = &mut qp.tx.req;
    let psn = req.psn;
    let slot = req.slot_mut(index);
    slot.first_psn = psn;
    slot.last_psn = psn_add(psn, crate::wire::packet::PSN_MASK);
    slot.resp_next = psn;
    slot.done = true;
    slot.status = IV_WC_SUCCESS;
    slot.local = true;
    crate::transport::completer::retire(qpn, qp, env);
    Ok(true)
}

/// Gives the WQE at ring index `index` (the next to start, of `length`
/// bytes) its PSNs, `npkts` from the next PSN, and moves the send queue
/// past it. Returns its first and last PSN.
#[inline(always)]
pub(crate) fn issue(req: &mut ReqState, index: u32, length: u32, npkts: u32) -> (u32, u32) {
    let first = req.psn;
    let last = psn_add(first, npkts - 1);
    req.psn = psn_add(first, npkts);
    req.next = index.wrapping_add(1);
    let slot = req.slot_mut(index);
    slot.length = length;
    slot.first_psn = first;
    slot.last_psn = last;
    slot.resp_next = first;
    (first, last)
}

/// Whether an RC message of `count` packets from a WQE with `flags` asks
/// for an ACK for what the ULP waits for: a signaled WQE (every WQE with
/// `sq_sig_all`), every [`ACK_EVERY`] packets, half the send queue in
/// flight (ACKs are what retires unsignaled WQEs and frees their slots).
#[inline(always)]
pub(crate) fn wants_ack(qp: &Qp, flags: u8, count: u32) -> bool {
    let req = &qp.tx.req;
    let in_flight = req.next.wrapping_sub(req.ci);
    flags & IV_SEND_SIGNALED != 0
        || qp.sq_sig_all
        || req.unacked + count >= ACK_EVERY
        || in_flight > qp.sq.0.entries() / 2
}

/// A message of `count` packets was sent, asking for an ACK (`ack`) or
/// not: the packets not yet asked for.
#[inline(always)]
pub(crate) fn asked(req: &mut ReqState, ack: bool, count: u32) {
    req.unacked = if ack { 0 } else { req.unacked + count };
}

/// The payload of message bytes `offset..offset + len` of WQE `index`.
fn fill_payload(
    qp: &Qp,
    env_mrs: &crate::firmware::table::Table<crate::firmware::mr::Mr>,
    index: u32,
    offset: u32,
    len: u32,
    segs: &mut Vec<Seg>,
) -> Result<(), DmaError> {
    if len == 0 {
        return Ok(());
    }
    let slot = qp.tx.req.slot(index);
    if slot.wqe.flags & IV_SEND_INLINE != 0 {
        let ring = &qp.sq.0;
        segs.push(Seg {
            region: ring.region().clone(),
            offset: ring.slot_offset(index) + IV_SEND_WQE_HEADER + offset as usize,
            len: len as usize,
        });
        Ok(())
    } else {
        gather(
            env_mrs,
            qp.pdn,
            qp.tx.req.sges(index),
            u64::from(offset),
            u64::from(len),
            segs,
        )
    }
}

fn dma_status(e: DmaError) -> u32 {
    match e {
        DmaError::Len => IV_WC_LOC_LEN_ERR,
        DmaError::Prot => IV_WC_LOC_PROT_ERR,
        // Not an error of the WQE's (a frame is lost, `send_frame`).
        DmaError::NoMemory => IV_WC_LOC_QP_OP_ERR,
    }
}

/// The one packet of a UD WQE.
fn send_ud(qpn: u32, qp: &Qp, env: &mut Env<'_>, index: u32) -> Result<(), u32> {
    let slot = *qp.tx.req.slot(index);
    let wqe = slot.wqe;
    let ah = env.ahs.get(wqe.ahn).map_err(|_| IV_WC_LOC_QP_OP_ERR)?.attr;
    let imm = wqe.opcode == IV_WR_SEND_WITH_IMM;
    let pkt = Packet {
        opcode: if imm {
            op::UD_SEND_ONLY_IMM
        } else {
            op::UD_SEND_ONLY
        },
        solicited: wqe.flags & IV_SEND_SOLICITED != 0,
        pkey: DEFAULT_PKEY,
        dest_qpn: wqe.remote_qpn & crate::wire::packet::PSN_MASK,
        psn: slot.first_psn,
        sgid: env.port.gid(u32::from(ah.sgid_index)).unwrap_or(env.dp.gid),
        dgid: ah.dgid,
        traffic_class: ah.traffic_class,
        flow_label: ah.flow_label,
        hop_limit: ah.hop_limit,
        imm: if imm { wqe.imm_or_inv } else { 0 },
        deth: Deth {
            qkey: if wqe.remote_qkey & QKEY_CONTROLLED != 0 {
                qp.attr.qkey
            } else {
                wqe.remote_qkey
            },
            src_qpn: qpn,
        },
        payload_len: slot.length,
        ..Packet::default()
    };
    let mrs = &*env.mrs;
    env.dp
        .emit(pkt, Burst::one(pkt.opcode), Some(qpn), |segs| {
            fill_payload(qp, mrs, index, 0, slot.length, segs)
        })
        .map_err(dma_status)
}

/// The opcode of a SEND or WRITE packet: an RC opcode of
/// [`DATA_OPCODES`] (UC's has the UC transport bits).
#[inline(always)]
pub(crate) fn data_opcode(qpt: u32, wr: u8, first: bool, last: bool) -> u8 {
    // A table, not a match: this is on every message's path.
    let row = DATA_OPCODES
        .get(usize::from(wr))
        .unwrap_or(&DATA_OPCODES[usize::from(IV_WR_RDMA_WRITE)]);
    let rc = row[usize::from(first) << 1 | usize::from(last)];
    if qpt == IV_QPT_UC { rc | op::UC } else { rc }
}

/// The RC opcode of a SEND or WRITE packet of each send opcode, by
/// `first << 1 | last` ([`rc_data_opcode`]).
const DATA_OPCODES: [[u8; 4]; 8] = {
    let mut t = [[0u8; 4]; 8];
    let mut wr = 0;
    while wr < t.len() {
        let mut k = 0;
        while k < 4 {
            t[wr][k] = rc_data_opcode(wr as u8, k & 2 != 0, k & 1 != 0);
            k += 1;
        }
        wr += 1;
    }
    t
};

/// The RC opcode of a SEND or WRITE packet (anything but a SEND is a
/// WRITE's).
const fn rc_data_opcode(wr: u8, first: bool, last: bool) -> u8 {
    use op::*;
    match (wr, first, last) {
        (IV_WR_SEND | IV_WR_SEND_WITH_IMM | IV_WR_SEND_WITH_INV, true, false) => RC_SEND_FIRST,
        (IV_WR_SEND | IV_WR_SEND_WITH_IMM | IV_WR_SEND_WITH_INV, false, false) => RC_SEND_MIDDLE,
        (IV_WR_SEND, true, true) => RC_SEND_ONLY,
        (IV_WR_SEND, false, true) => RC_SEND_LAST,
        (IV_WR_SEND_WITH_IMM, true, true) => RC_SEND_ONLY_IMM,
        (IV_WR_SEND_WITH_IMM, false, true) => RC_SEND_LAST_IMM,
        (IV_WR_SEND_WITH_INV, true, true) => RC_SEND_ONLY_INV,
        (IV_WR_SEND_WITH_INV, false, true) => RC_SEND_LAST_INV,
        (_, true, false) => RC_WRITE_FIRST,
        (_, false, false) => RC_WRITE_MIDDLE,
        (IV_WR_RDMA_WRITE_WITH_IMM, true, true) => RC_WRITE_ONLY_IMM,
        (IV_WR_RDMA_WRITE_WITH_IMM, false, true) => RC_WRITE_LAST_IMM,
        (_, true, true) => RC_WRITE_ONLY,
        (_, false, true) => RC_WRITE_LAST,
    }
}

/// Emits the rest of the WQE in progress: a READ request, an atomic, or
/// the remaining packets of a SEND or WRITE as one burst. Returns the
/// packets emitted.
// Out of line, as `start`: the frames of the requester's loop, of the WQE
// it starts and of the packet it sends are not on the stack together
// below a short-circuited request's responder (docs/stack-budget.md).
#[inline(never)]
fn emit_next(
    qpn: u32,
    qp: &mut Qp,
    peer: Option<&mut Qp>,
    env: &mut Env<'_>,
    p: Progress,
) -> Result<u32, u32> {
    // The WQE and its length, not a copy of the whole slot (this frame is
    // under a short-circuited request's responder).
    let (wqe, length) = {
        let slot = qp.tx.req.slot(p.index);
        (slot.wqe, slot.length)
    };
    let rc = qp.qp_type == IV_QPT_RC;
    let path = &qp.tx.path;
    // The peer's responder takes the packet now, if the wire would
    // deliver it now ([`crate::transport::local`]).
    let peer = peer.filter(|_| crate::transport::local::open(env.dp));
    // RC: no further than the congestion window (a READ's or atomic's
    // request too: its PSNs, a READ's responses, count in it); an ACK
    // schedules the requester when it opens.
    let room = if rc {
        qp.tx.req.window.room(p.psn)
    } else {
        u32::MAX
    };
    if room == 0 {
        qp.tx.req.window.waiting = true;
        return Ok(0);
    }
    // One packet for every case (one slot in this frame).
    let mut pkt = path.packet(op::RC_READ_REQUEST, p.psn);
    match wqe.opcode {
        IV_WR_RDMA_READ => {
            pkt.ack_req = true;
            pkt.reth = Reth {
                va: wqe.remote_addr.wrapping_add(u64::from(p.offset)),
                rkey: wqe.rkey,
                len: length - p.offset.min(length),
            };
            Ok(emit_request(qpn, qp, peer, env, &pkt))
        }
        IV_WR_ATOMIC_CMP_AND_SWP | IV_WR_ATOMIC_FETCH_AND_ADD => {
            let cas = wqe.opcode == IV_WR_ATOMIC_CMP_AND_SWP;
            pkt.opcode = if cas {
                op::RC_COMPARE_SWAP
            } else {
                op::RC_FETCH_ADD
            };
            pkt.ack_req = true;
            pkt.atomic = atomic_eth(&wqe);
            Ok(emit_request(qpn, qp, peer, env, &pkt))
        }
        _ => {
            let mtu = qp.tx.mtu;
            let mut rest = length - p.offset.min(length);
            let mut count = packets(rest, mtu);
            // A burst cut at the window ends mid-message and asks for the
            // ACK that opens it again.
            let cut = count > room;
            if cut {
                count = room;
                rest = room * mtu;
            }
            let first = p.offset == 0;
            let opcode = data_opcode(qp.qp_type, wqe.opcode, first, count == 1 && !cut);
            let last_opcode = data_opcode(qp.qp_type, wqe.opcode, count == 1 && first, !cut);
            let (kf, kl) = (
                crate::wire::packet::mask(opcode),
                crate::wire::packet::mask(last_opcode),
            );
            pkt.opcode = opcode;
            // SQD's solicitation and a burst cut at the window ask too.
            pkt.ack_req = rc && (wants_ack(qp, wqe.flags, count) || qp.tx.req.solicit || cut);
            pkt.solicited = wqe.flags & IV_SEND_SOLICITED != 0
                && matches!(
                    wqe.opcode,
                    IV_WR_SEND
                        | IV_WR_SEND_WITH_IMM
                        | IV_WR_SEND_WITH_INV
                        | IV_WR_RDMA_WRITE_WITH_IMM
                );
            if kf & crate::wire::packet::m::RETH != 0 {
                pkt.reth = Reth {
                    va: wqe.remote_addr,
                    rkey: wqe.rkey,
                    len: length,
                };
            }
            if kl & crate::wire::packet::m::IMMDT != 0 {
                pkt.imm = wqe.imm_or_inv;
            }
            if kl & crate::wire::packet::m::IETH != 0 {
                pkt.ieth = wqe.imm_or_inv;
            }
            pkt.payload_len = rest;
            let burst = Burst { count, last_opcode };
            let notify = (!rc).then_some(qpn);
            let ack_req = pkt.ack_req;
            match peer {
                Some(dest) => {
                    // The payload where it lies, checked as its segments
                    // would be.
                    let piece =
                        check_payload(qp, env.mrs, p.index, p.offset, rest).map_err(dma_status)?;
                    sent_data(qp, p, ack_req, count, rest, cut);
                    let payload = local_payload(qp, p.index, p.offset, rest, piece);
                    crate::transport::local::request(qpn, dest, env, &pkt, burst, payload);
                    crate::transport::local::responses(qp, env);
                }
                None => {
                    send_frame(qp, env, &pkt, burst, notify, p, rest)?;
                    sent_data(qp, p, ack_req, count, rest, cut);
                }
            }
            Ok(count)
        }
    }
}

/// Sends a SEND's or WRITE's burst `pkt` as a frame, its payload the
/// message bytes `p.offset..p.offset + rest` of WQE `p.index` (segments of
/// its memory, checked as they are made).
// Out of line: the frame's building is not on the stack under a
// short-circuited request's responder (docs/stack-budget.md).
#[inline(never)]
fn send_frame(
    qp: &Qp,
    env: &mut Env<'_>,
    pkt: &Packet,
    burst: Burst,
    notify: Option<u32>,
    p: Progress,
    rest: u32,
) -> Result<(), u32> {
    let mrs = &*env.mrs;
    let sent = env.dp.emit(*pkt, burst, notify, |segs| {
        fill_payload(qp, mrs, p.index, p.offset, rest, segs)
    });
    match sent {
        // More pieces than the frame's room, and no memory to grow it:
        // lost, as a frame whose batch cannot grow is.
        Err(DmaError::NoMemory) => {
            env.dp.lost(pkt, burst, notify);
            Ok(())
        }
        sent => sent.map_err(dma_status),
    }
}

/// The requester's state after a SEND's or WRITE's burst of `count`
/// packets (`rest` bytes, cut at the window or not) from `p` was sent.
#[inline(always)]
fn sent_data(qp: &mut Qp, p: Progress, ack_req: bool, count: u32, rest: u32, cut: bool) {
    let req = &mut qp.tx.req;
    asked(req, ack_req, count);
    req.solicit = false;
    req.cur = cut.then(|| {
        // The rest of the message when the window opens.
        Progress {
            index: p.index,
            offset: p.offset + rest,
            psn: psn_add(p.psn, count),
        }
    });
}

/// Sends a READ request or an atomic (`pkt`, no payload): to the peer's
/// responder when it is at hand, else as a frame. Returns the packets
/// sent (one).
#[inline(always)]
fn emit_request(
    qpn: u32,
    qp: &mut Qp,
    peer: Option<&mut Qp>,
    env: &mut Env<'_>,
    pkt: &Packet,
) -> u32 {
    qp.tx.req.cur = None;
    match peer {
        Some(dest) => {
            let burst = Burst::one(pkt.opcode);
            crate::transport::local::request(qpn, dest, env, pkt, burst, Payload::NONE);
            crate::transport::local::responses(qp, env);
        }
        None => env.dp.emit_bare(*pkt),
    }
    1
}

/// Checks the message bytes `offset..offset + len` of WQE `index` as
/// [`fill_payload`] checks them (a gather list's keys and ranges).
/// Returns, when they lie in one piece of one MR, its index and the
/// region offset (resolved once, for [`local_payload`]).
///
/// # Errors
/// As [`for_each_piece`].
#[inline(always)]
fn check_payload(
    qp: &Qp,
    mrs: &crate::firmware::table::Table<crate::firmware::mr::Mr>,
    index: u32,
    offset: u32,
    len: u32,
) -> Result<Option<(u32, usize)>, DmaError> {
    if len == 0 || qp.tx.req.slot(index).wqe.flags & IV_SEND_INLINE != 0 {
        return Ok(None);
    }
    let sges = qp.tx.req.sges(index);
    let (offset, len) = (u64::from(offset), u64::from(len));
    if let [one] = sges
        && let Some((_, off)) = resolve_sge(mrs, qp.pdn, one, offset, len, false)
    {
        return Ok(Some((mr_index(one.lkey), off)));
    }
    for_each_piece(mrs, qp.pdn, sges, offset, len, false, |_, _, _| Ok(()))?;
    Ok(None)
}

/// The message bytes `offset..offset + len` of WQE `index` where they
/// lie, for a short-circuited packet: the slot's inline data, the one
/// piece of an MR [`check_payload`] found them in (`piece`), or the
/// gather list (checked).
#[inline(always)]
fn local_payload(
    qp: &Qp,
    index: u32,
    offset: u32,
    len: u32,
    piece: Option<(u32, usize)>,
) -> Payload<'_> {
    if len == 0 {
        return Payload::NONE;
    }
    if let Some((mr, off)) = piece {
        return Payload::Mr {
            index: mr,
            off,
            len: len as usize,
        };
    }
    if qp.tx.req.slot(index).wqe.flags & IV_SEND_INLINE != 0 {
        let ring = &qp.sq.0;
        Payload::Region {
            region: ring.region(),
            off: ring.slot_offset(index) + IV_SEND_WQE_HEADER + offset as usize,
            len: len as usize,
        }
    } else {
        Payload::Gather {
            pdn: qp.pdn,
            sges: qp.tx.req.sges(index),
            offset: u64::from(offset),
            len,
        }
    }
}

/// The AtomicETH of an atomic WQE: its target, and its operands as the
/// responder applies them (compare and swap: swap `swap`, compare
/// `compare_add`; fetch and add: add `compare_add`).
#[inline(always)]
pub(crate) fn atomic_eth(wqe: &IvSendWqe) -> AtomicEth {
    let cas = wqe.opcode == IV_WR_ATOMIC_CMP_AND_SWP;
    AtomicEth {
        va: wqe.remote_addr,
        rkey: wqe.rkey,
        swap_add: if cas { wqe.swap } else { wqe.compare_add },
        compare: if cas { wqe.compare_add } else { 0 },
    }
}

/// SQD with WQEs in flight that asked for no ACK: sends the last packet
/// sent again, asking for one (the responder answers a duplicate with an
/// ACK of everything it has), so that the send queue drains.
pub(crate) fn solicit_ack(qp: &mut Qp) {
    let req = &mut qp.tx.req;
    if req.cur.is_some() || !req.in_flight() || req.unacked == 0 {
        return;
    }
    let last = req.next.wrapping_sub(1);
    let s = req.slot(last);
    if is_rd_atomic(s.wqe.opcode) {
        return;
    }
    let n = psn_sub(s.last_psn, s.first_psn);
    req.cur = Some(Progress {
        index: last,
        offset: n.saturating_mul(qp.tx.mtu),
        psn: s.last_psn,
    });
    req.solicit = true;
}

fn psn_sub(a: u32, b: u32) -> u32 {
    u32::try_from(crate::wire::packet::psn_diff(a, b).max(0)).unwrap_or(0)
}

#[cfg(test)]
mod opcode_tests {
    use super::{data_opcode, rc_data_opcode};
    use crate::wire::packet::op;
    use irpverbs_abi::{IV_QPT_RC, IV_QPT_UC};

    #[test]
    fn data_opcode_table_matches_the_rule_for_every_send_opcode() {
        for wr in 0..=u8::MAX {
            for k in 0..4 {
                let (first, last) = (k & 2 != 0, k & 1 != 0);
                let rc = rc_data_opcode(wr, first, last);
                assert_eq!(data_opcode(IV_QPT_RC, wr, first, last), rc, "{wr} {k}");
                assert_eq!(data_opcode(IV_QPT_UC, wr, first, last), rc | op::UC);
            }
        }
        assert_eq!(rc_data_opcode(0, true, true), op::RC_SEND_ONLY);
        assert_eq!(rc_data_opcode(200, false, true), op::RC_WRITE_LAST);
    }
}

#[cfg(test)]
mod window_tests {
    use super::Window;

    #[test]
    fn room_counts_from_the_last_acknowledged_psn_across_the_wrap() {
        let w = Window::at(0xFF_FFF0);
        assert_eq!(w.room(0xFF_FFF0), Window::INITIAL);
        // 0x20 PSNs sent, across the 24-bit wrap.
        assert_eq!(w.room(0x10), Window::INITIAL - 0x20);
        // A PSN before the acknowledged one (a resend): the whole window.
        assert_eq!(w.room(0xFF_FF00), Window::INITIAL);
        assert_eq!(w.room(0xFF_FFF0 + Window::INITIAL - 0x100_0000), 0);
    }

    #[test]
    fn acknowledgements_slide_and_grow_it_and_wake_a_waiting_requester() {
        let mut w = Window::at(100);
        w.waiting = true;
        assert!(!w.acknowledge(100), "nothing new");
        assert!(!w.acknowledge(50), "old");
        assert!(w.acknowledge(164), "64 new: wakes");
        assert!(!w.waiting);
        // Below the threshold: grows by what is acknowledged.
        assert_eq!((w.acked, w.cwnd), (164, Window::INITIAL + 64));
        w.shrink(false);
        let half = (Window::INITIAL + 64) / 2;
        assert_eq!((w.cwnd, w.threshold), (half, half));
        // At the threshold: one packet per window acknowledged.
        assert!(!w.acknowledge(164 + half - 1));
        assert_eq!(w.cwnd, half);
        w.acknowledge(164 + half);
        assert_eq!(w.cwnd, half + 1);
    }

    #[test]
    fn retries_shrink_it_down_to_its_floor() {
        let mut w = Window::at(0);
        w.shrink(true);
        assert_eq!(w.cwnd, Window::INITIAL / 4);
        for _ in 0..20 {
            w.shrink(false);
        }
        assert_eq!(w.cwnd, Window::MIN);
        let mut big = Window::at(0);
        for k in 0..200 {
            big.acknowledge(k * 4096);
        }
        assert!(big.cwnd <= Window::MAX);
    }
}
