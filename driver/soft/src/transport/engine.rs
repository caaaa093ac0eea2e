//! The data-path engine: what a doorbell schedules and how the work runs.
//!
//! Work is of three kinds: send queues with WQEs to execute (a QP on the
//! `ready` list, at most once), frames to process (from other HCAs through
//! the inbox, or looped back from this HCA's own QPs), and CQ arms to check
//! (done at once by the arm doorbell). [`Firmware::run_datapath`] runs
//! them under `HCA_LOCK`: frames first (responses free requesters), then
//! requesters within a packet budget. Frames for another HCA collect in
//! per-destination batches ([`DataPath::outbox`]) that the caller hands to
//! the destination's inbox before releasing the lock (see [`crate::net::fabric`]);
//! frames for this HCA's own GID go to `loopq` and are processed in the
//! same run, with no other lock.
//!
//! Completions and async events produced meanwhile collect in
//! [`DataPath::events`]; the caller moves them to the event queue and
//! raises the interrupt after releasing every lock.
//!
//! The transport roles are in [`crate::transport::requester`], [`crate::transport::responder`] and
//! [`crate::transport::completer`]; what they share (QP error transitions, flushing,
//! CQEs) is here.

use alloc::sync::Arc;
use alloc::vec::Vec;
use core::sync::atomic::Ordering;

use irpverbs_abi::{
    IV_QPT_RC, IV_QPT_UD, IV_WC_OP_RECV, IV_WC_WR_FLUSH_ERR, IvCqe, IvRecvWqe, IvSendWqe,
};
use irpverbs_core::{AsyncEvent, DoorbellTarget, Event};

use crate::firmware::Firmware;
use crate::firmware::ah::Ah;
use crate::firmware::cq::{Cq, post_cqe};
use crate::firmware::datapath::{DataPath, OutQueue};
use crate::firmware::mr::Mr;
use crate::firmware::port::Port;
use crate::firmware::qp::{Qp, QpState, QpTable};
use crate::firmware::qp_state::{Path, QpTx, RespState};
use crate::firmware::srq::Srq;
use crate::firmware::table::Table;
use crate::net::fabric::Router;
use crate::transport::dma::Payload;
use crate::transport::requester::wc_opcode;
use crate::transport::{completer, requester, responder};
use crate::wire::packet::{Batch, Burst, Frame, Gid, Packet, m};

/// Packets the requesters may emit in one run before the caller delivers
/// what they produced (bounds the batches; a QP with more work stays
/// ready).
pub(crate) const REQUESTER_BUDGET: usize = 256;

/// The default P_Key (the only one in the table).
pub(crate) const DEFAULT_PKEY: u16 = 0xFFFF;

impl Path {
    /// A packet on this path.
    pub(crate) fn packet(&self, opcode: u8, psn: u32) -> Packet {
        Packet {
            opcode,
            pkey: DEFAULT_PKEY,
            dest_qpn: self.dest_qpn,
            psn,
            sgid: self.sgid,
            dgid: self.dgid,
            traffic_class: self.traffic_class,
            flow_label: self.flow_label,
            hop_limit: self.hop_limit,
            mig_req: self.mig_req,
            ..Packet::default()
        }
    }
}

impl QpTx {
    /// Back to the state of a new QP (RESET), keeping the allocations and
    /// the ready-list mark.
    fn reset(&mut self) {
        self.req.reset();
        self.resp = RespState::FRESH;
        self.path = Path::default();
        self.mtu = 1024;
        self.draining = false;
        self.drain_notify = false;
        self.comm_est = false;
        self.last_wqe = false;
        self.rto_at = None;
        self.rnr_at = None;
    }
}

impl DataPath {
    /// The batch frames for `dgid` go to: loopback, a fabric peer's, or
    /// the link's; `None` when none reaches it.
    fn batch_for(&mut self, dgid: &Gid) -> Option<&mut Batch> {
        if self.link_down {
            // A port whose link is down transmits nothing (loopback too).
            return None;
        }
        self.route(dgid)
    }

    /// Whether packets to `dgid` have somewhere to go: the link is up
    /// and loopback, a fabric peer or the link takes them.
    pub(crate) fn reaches(&mut self, dgid: &Gid) -> bool {
        self.batch_for(dgid).is_some()
    }

    /// [`Self::batch_for`] whatever the link's state: where the fabric's
    /// signals go, which stand for what the sender knows by itself (that
    /// its bytes left), not for packets.
    fn route(&mut self, dgid: &Gid) -> Option<&mut Batch> {
        if *dgid == self.gid {
            return Some(&mut self.loopq);
        }
        if self.router.is_some() {
            if let Some(i) = self.fabric_queue(dgid) {
                return Some(&mut self.outbox[i].batch);
            }
        }
        self.link.as_ref()?;
        Some(&mut self.wireq)
    }

    /// Whether a QP whose packets go to `dgid` keeps timers: every one
    /// with the platform's clock attached; without, those whose packets go
    /// to the link.
    pub(crate) fn clocked(&self, dgid: &Gid) -> bool {
        self.clock.is_some()
            || self.link.is_some()
                && *dgid != self.gid
                && !self
                    .outbox
                    .iter()
                    .any(|q| q.dgid == *dgid && q.peer.is_some())
    }

    /// The time on the transport's clock: the platform's when attached,
    /// else the link's as of this step.
    pub(crate) fn timer_now(&self) -> u64 {
        self.clock.as_ref().map_or(self.now, |c| c.now_ns())
    }

    /// A timer of some QP was armed for `deadline`: the platform's timer
    /// is armed for it if it is earlier than what that timer waits for.
    pub(crate) fn timer_armed(&mut self, deadline: u64) {
        if let Some(clock) = &self.clock {
            if self.clock_armed.is_none_or(|a| deadline < a) {
                self.clock_armed = Some(deadline);
                clock.arm(deadline);
            }
        }
    }

    /// Puts QP `qpn` on the timer list (once).
    pub(crate) fn time(&mut self, qpn: u32, tx: &mut QpTx) {
        if !tx.timed {
            // Room for every QP was reserved at its create.
            tx.timed = crate::firmware::shared::push(&mut self.timed, qpn);
        }
    }

    /// The outbox queue of the fabric peer with `dgid`, if one has it.
    fn fabric_queue(&mut self, dgid: &Gid) -> Option<usize> {
        let router = self.router.as_ref()?;
        let generation = router.generation();
        let i = match self.outbox.iter().position(|q| q.dgid == *dgid) {
            Some(i) => {
                let q = &mut self.outbox[i];
                if q.generation != generation {
                    q.peer = router.resolve(dgid);
                    q.generation = generation;
                }
                i
            }
            None => {
                // A destination not seen before: the list grows fallibly,
                // and without memory the packets take the link (or are
                // lost) as for a GID no fabric HCA has.
                self.outbox.try_reserve(1).ok()?;
                self.outbox.push(OutQueue {
                    dgid: *dgid,
                    generation,
                    peer: router.resolve(dgid),
                    batch: Batch::default(),
                });
                self.outbox.len() - 1
            }
        };
        self.outbox[i].peer.as_ref()?;
        Some(i)
    }

    /// Sends `pkt` (the first of a `burst`) to its destination GID, its
    /// payload segments appended by `fill` (at most [`MAX_SGE`] of them).
    /// Without a route, or without memory for the batch to grow to a new
    /// high-water mark, the packets are lost (and a `notify` is answered at
    /// once: the bytes left). On a `fill` error nothing is sent.
    ///
    /// [`MAX_SGE`]: irpverbs_ring::wq::MAX_SGE
    pub(crate) fn emit<E>(
        &mut self,
        pkt: Packet,
        burst: Burst,
        notify: Option<u32>,
        fill: impl FnOnce(&mut Vec<crate::wire::packet::Seg>) -> Result<(), E>,
    ) -> Result<(), E> {
        self.stats.packets_sent += u64::from(burst.count);
        let batch = if self.capture == Some(pkt.dest_qpn) && pkt.dgid == self.gid {
            // A response to a short-circuited request: to its requester,
            // in order with anything else the responder answers.
            Some(&mut self.replies)
        } else {
            self.batch_for(&pkt.dgid)
        }
        .and_then(|b| b.room_for(1, irpverbs_ring::wq::MAX_SGE).then_some(b));
        match batch {
            Some(b) => {
                let start = b.segs.len();
                if let Err(e) = fill(&mut b.segs) {
                    b.segs.truncate(start);
                    self.stats.packets_sent -= u64::from(burst.count);
                    return Err(e);
                }
                let nsegs = b.segs.len() - start;
                b.frames.push(Frame::Packet {
                    pkt,
                    burst,
                    seg: u32::try_from(start).unwrap_or(u32::MAX),
                    nsegs: u32::try_from(nsegs).unwrap_or(0),
                    notify,
                });
            }
            None => self.lost(&pkt, burst, notify),
        }
        Ok(())
    }

    /// Counts a burst that could not be sent as lost (as the wire may lose
    /// it); a sender that asked to be told when it left (`notify`) is told.
    pub(crate) fn lost(&mut self, pkt: &Packet, burst: Burst, notify: Option<u32>) {
        self.stats.packets_dropped += u64::from(burst.count);
        if let Some(qpn) = notify {
            let _ = self.loopq.push_signal(Frame::Sent {
                qpn,
                psn: burst.last_psn(pkt.psn),
            });
        }
    }

    /// Sends a packet without payload.
    pub(crate) fn emit_bare(&mut self, pkt: Packet) {
        let _ = self.emit::<()>(pkt, Burst::one(pkt.opcode), None, |_| Ok(()));
    }

    /// Sends a fabric signal to `dgid` (lost without a route; a down link
    /// does not stop it: see [`Self::route`]).
    pub(crate) fn signal(&mut self, dgid: &Gid, frame: Frame) {
        let sent = match self.route(dgid) {
            Some(b) => b.push_signal(frame),
            None => false,
        };
        if !sent {
            self.stats.packets_dropped += 1;
        }
    }

    /// Puts QP `qpn` on the ready list (once).
    pub(crate) fn schedule(&mut self, qpn: u32, tx: &mut QpTx) {
        if !tx.scheduled {
            // Room for every QP was reserved at its create; without it
            // (no memory) the QP waits for its next doorbell.
            if self.ready.len() < self.ready.capacity() || self.ready.try_reserve(1).is_ok() {
                tx.scheduled = true;
                self.ready.push_back(qpn);
            }
        }
    }

    /// Packets sent and received so far (short-circuited ones too): the measure of the data path's work that
    /// [`crate::SoftConfig::dpc_budget`] bounds per call.
    pub(crate) fn work_done(&self) -> u64 {
        self.stats.packets_sent + self.stats.packets_received
    }

    /// What a send queue's run on its doorbell can leave for the engine:
    /// a requester on the ready list, frames (looped back, or for the link
    /// or another HCA), an overrun CQ.
    pub(crate) fn left_for_engine(&self) -> bool {
        !self.ready.is_empty()
            || !self.loopq.is_empty()
            || !self.cq_errors.is_empty()
            || !self.wireq.is_empty()
            || self.outbox.iter().any(|q| !q.batch.is_empty())
    }

    /// True when frames or requesters wait.
    pub(crate) fn has_work(&self) -> bool {
        !self.ready.is_empty()
            || !self.loopq.is_empty()
            || !self.inbound.is_empty()
            || !self.cq_errors.is_empty()
            || !self.events.is_empty()
            || !self.wireq.is_empty()
            || self.outbox.iter().any(|q| !q.batch.is_empty())
    }
}

/// What the transport roles may touch besides the QP they work on.
pub(crate) struct Env<'a> {
    /// Memory regions (mutable: their counts of bound windows).
    pub(crate) mrs: &'a mut Table<Mr>,
    /// Memory windows (mutable: binds and invalidations).
    pub(crate) mws: &'a mut Table<crate::firmware::mw::Mw>,
    /// Completion queues.
    pub(crate) cqs: &'a mut Table<Cq>,
    /// Shared receive queues.
    pub(crate) srqs: &'a mut Table<Srq>,
    /// Address handles.
    pub(crate) ahs: &'a Table<Ah>,
    /// The port.
    pub(crate) port: &'a Port,
    /// The data path.
    pub(crate) dp: &'a mut DataPath,
}

/// A completion for a send WQE.
pub(crate) fn send_cqe(qpn: u32, wqe: &IvSendWqe, status: u32, byte_len: u32) -> IvCqe {
    IvCqe {
        wr_id: wqe.wr_id,
        status,
        opcode: wc_opcode(wqe.opcode),
        byte_len,
        qp_num: qpn,
        ..IvCqe::default()
    }
}

/// Arms QP `qpn`'s local ACK timer if it has requests in flight to a wire
/// destination and none is armed (the requester sent something).
// The test inline: after most requester runs between two QPs of this
// HCA nothing is in flight (the peer's ACK came in the run).
#[inline(always)]
pub(crate) fn arm_rto(qpn: u32, qp: &mut Qp, env: &mut Env<'_>) {
    if qp.qp_type != IV_QPT_RC || qp.tx.rto_at.is_some() || !qp.tx.req.in_flight() {
        return;
    }
    arm_rto_now(qpn, qp, env);
}

#[inline(never)]
fn arm_rto_now(qpn: u32, qp: &mut Qp, env: &mut Env<'_>) {
    let Some(t) = crate::net::link::ack_timeout_ns(qp.attr.timeout) else {
        return;
    };
    if env.dp.clocked(&qp.tx.path.dgid) {
        let at = env.dp.timer_now().saturating_add(t);
        qp.tx.rto_at = Some(at);
        env.dp.time(qpn, &mut qp.tx);
        env.dp.timer_armed(at);
    }
}

/// The requester made progress (an ACK or a response): the local ACK
/// timer starts again if requests remain in flight, else stops.
pub(crate) fn rearm_rto(qpn: u32, qp: &mut Qp, env: &mut Env<'_>) {
    if qp.tx.rto_at.is_some() {
        qp.tx.rto_at = None;
        arm_rto(qpn, qp, env);
    }
}

/// An RNR NAK: the requester waits for the RNR timer of `code` (wire
/// destinations; in-process the responder's hint ends the wait).
pub(crate) fn arm_rnr(qpn: u32, qp: &mut Qp, env: &mut Env<'_>, code: u8) {
    if env.dp.clocked(&qp.tx.path.dgid) {
        let at = env
            .dp
            .timer_now()
            .saturating_add(crate::net::link::rnr_timer_ns(code));
        qp.tx.rto_at = None;
        qp.tx.rnr_at = Some(at);
        env.dp.time(qpn, &mut qp.tx);
        env.dp.timer_armed(at);
    }
}

/// Moves QP `qpn` to ERR (unless it is there), raising `event`, and
/// flushes both its work queues: every outstanding WQE completes, with
/// `WR_FLUSH_ERR` unless it already has an error status.
pub(crate) fn enter_error(qpn: u32, qp: &mut Qp, env: &mut Env<'_>, event: Option<AsyncEvent>) {
    if qp.state == QpState::Err {
        return;
    }
    qp.state = QpState::Err;
    env.dp.attend();
    // Before the flush reads the producer index: a receive posted by a ULP
    // that saw no request is flushed now, any later one is rung.
    ask_rq_doorbells(qp);
    qp.tx.last_wqe = false;
    if let Some(e) = event {
        env.dp.raise(e);
    }
    flush_sq(qpn, qp, env);
    flush_rq(qpn, qp, env);
}

/// Sets QP `qp`'s receive doorbell request ([`irpverbs_ring::ring::DoorbellRequest`])
/// to what its state needs: asking while the QP is in ERR (its new
/// receives are flushed) or its responder waits for a receive after an RNR
/// NAK (its requester gets a retry), not otherwise. A caller that made it
/// ask reads the producer index afterwards.
pub(crate) fn ask_rq_doorbells(qp: &Qp) {
    if let Some(rq) = &qp.rq {
        let want = qp.state == QpState::Err || qp.tx.resp.rnr_wait;
        let request = rq.0.doorbell_request();
        if request.asking() != want {
            request.set(want);
        }
    }
}

/// A send-side error on a UC or UD QP: the QP goes to SQE (its receive
/// side keeps working) and the send queue is flushed; on RC, to ERR.
pub(crate) fn send_error(qpn: u32, qp: &mut Qp, env: &mut Env<'_>) {
    if qp.qp_type == IV_QPT_RC {
        enter_error(qpn, qp, env, None);
    } else if matches!(qp.state, QpState::Rts | QpState::Sqd) {
        qp.state = QpState::Sqe;
        flush_sq(qpn, qp, env);
    } else {
        flush_sq(qpn, qp, env);
    }
}

/// Completes every outstanding send WQE (started or not) of a QP in ERR or
/// SQE: `WR_FLUSH_ERR`, or the error status a WQE was failed with. A ring
/// whose indices are impossible is resynchronized without completions (the
/// ULP broke it; only its own QP suffers).
pub(crate) fn flush_sq(qpn: u32, qp: &mut Qp, env: &mut Env<'_>) {
    let ring = &qp.sq.0;
    let req = &mut qp.tx.req;
    let pi = ring.producer_word().load(Ordering::Acquire);
    let ci = req.ci;
    let n = pi.wrapping_sub(ci);
    if n > ring.capacity() {
        req.resync(pi);
        ring.consumer().release(pi);
        return;
    }
    let started = req.next.wrapping_sub(ci);
    for k in 0..n {
        let i = ci.wrapping_add(k);
        let (wqe, status, len) = if k < started {
            let slot = req.slot(i);
            let status = if slot.done && slot.status != 0 {
                slot.status
            } else {
                IV_WC_WR_FLUSH_ERR
            };
            (slot.wqe, status, slot.length)
        } else {
            let wqe: IvSendWqe = ring
                .region()
                .read_obj(ring.slot_offset(i))
                .unwrap_or_default();
            (wqe, IV_WC_WR_FLUSH_ERR, 0)
        };
        // Its slot goes back before its completion is seen (as a retire
        // does): the WQE was copied out of the ring.
        ring.consumer().release(i.wrapping_add(1));
        let cqe = send_cqe(qpn, &wqe, status, len);
        post_cqe(env.cqs, env.dp, qp.send_cqn, &cqe, false);
    }
    req.resync(pi);
    ring.consumer().release(pi);
    if qp.tx.draining {
        qp.tx.draining = false;
    }
}

/// Completes every outstanding receive WQE of a QP in ERR with
/// `WR_FLUSH_ERR`: the one in progress, then the posted ones. A QP on an
/// SRQ leaves the SRQ's WQEs alone and raises LastWqeReached (once).
pub(crate) fn flush_rq(qpn: u32, qp: &mut Qp, env: &mut Env<'_>) {
    if let Some(wr_id) = qp.tx.resp.take_recv() {
        let cqe = recv_flush_cqe(qpn, wr_id);
        post_cqe(env.cqs, env.dp, qp.recv_cqn, &cqe, false);
    }
    let Some(rq) = qp.rq.as_ref() else {
        if qp.srqn.is_some() && !qp.tx.last_wqe {
            qp.tx.last_wqe = true;
            env.dp.raise(AsyncEvent::LastWqeReached(qpn));
        }
        return;
    };
    let ring = &rq.0;
    let resp = &mut qp.tx.resp;
    let pi = ring.producer_word().load(Ordering::Acquire);
    let n = pi.wrapping_sub(resp.rq_ci);
    if n <= ring.capacity() {
        for k in 0..n {
            let i = resp.rq_ci.wrapping_add(k);
            let wqe: IvRecvWqe = ring
                .region()
                .read_obj(ring.slot_offset(i))
                .unwrap_or_default();
            ring.consumer().release(i.wrapping_add(1));
            let cqe = recv_flush_cqe(qpn, wqe.wr_id);
            post_cqe(env.cqs, env.dp, qp.recv_cqn, &cqe, false);
        }
    }
    resp.rq_ci = pi;
    ring.consumer().release(pi);
}

fn recv_flush_cqe(qpn: u32, wr_id: u64) -> IvCqe {
    IvCqe {
        wr_id,
        status: IV_WC_WR_FLUSH_ERR,
        opcode: IV_WC_OP_RECV,
        qp_num: qpn,
        ..IvCqe::default()
    }
}

impl Firmware {
    /// The QP table and everything else, borrowed apart.
    pub(crate) fn split(&mut self) -> (&mut QpTable, Env<'_>) {
        (
            &mut self.qps,
            Env {
                mrs: &mut self.mrs,
                mws: &mut self.mws,
                cqs: &mut self.cqs,
                srqs: &mut self.srqs,
                ahs: &self.ahs,
                port: &self.port,
                dp: &mut self.dp,
            },
        )
    }

    /// The send queue doorbell: QP `qpn` has new WQEs. Unknown QPs are
    /// ignored (a doorbell can't fail).
    pub(crate) fn ring_sq(&mut self, qpn: u32) -> bool {
        if let Ok(qp) = self.qps.get_mut(qpn) {
            self.dp.schedule(qpn, &mut qp.tx);
        }
        true
    }

    /// The send queue doorbell, inline: the fast path first, then QP
    /// `qpn`'s requester for what it left, unless it already waits on the
    /// ready list.
    pub(crate) fn ring_sq_now(&mut self, qpn: u32) {
        if self.ring_sq_fast(qpn) {
            return;
        }
        self.run_requester(qpn, REQUESTER_BUDGET, true);
    }

    /// Runs QP `qpn`'s new WQEs on the fast path ([`crate::transport::fast::run`]); a
    /// QP that used up the fast path's budget is scheduled, and the
    /// engine's next turn runs the fast path again. False when the fast
    /// path stopped at a WQE the requester must take.
    pub(crate) fn ring_sq_fast(&mut self, qpn: u32) -> bool {
        match crate::transport::fast::run(self, qpn) {
            crate::transport::fast::Ran::All => true,
            crate::transport::fast::Ran::Budget => {
                self.ring_sq(qpn);
                true
            }
            crate::transport::fast::Ran::Stopped => false,
        }
    }

    /// Runs QP `qpn`'s requester for at most `budget` packets: on its
    /// `doorbell` (not when it waits on the ready list: its turn there
    /// comes), or its turn on the ready list. An RC QP whose peer is a QP of this HCA runs with the peer
    /// at hand, its requests short-circuited to it
    /// ([`crate::transport::local`]). Returns the packets sent.
    pub(crate) fn run_requester(&mut self, qpn: u32, budget: usize, doorbell: bool) -> usize {
        let (gid, short) = (self.dp.gid, self.dp.short_circuit);
        let (qps, mut env) = self.split();
        let local = |qp: &Qp| short && qp.qp_type == IV_QPT_RC && qp.tx.path.dgid == gid;
        let Some((qp, peer)) = qps.with_peer_mut(qpn, local) else {
            return 0;
        };
        if !doorbell {
            qp.tx.scheduled = false;
        } else if qp.tx.scheduled {
            return 0;
        }
        requester::run(qpn, qp, peer, &mut env, budget)
    }

    /// Rings `target`'s doorbell, as a doorbell page's slot bound to it
    /// rings it ([`Firmware::scan_doorbells`]): with `fast` (an inline HCA
    /// whose inbox is empty) a send queue runs at once, as the direct-call
    /// doorbell runs it ([`Firmware::ring_sq_now`]); else it is
    /// scheduled. True when the data path has work.
    pub(crate) fn ring_target(&mut self, target: DoorbellTarget, fast: bool) -> bool {
        match target {
            DoorbellTarget::Sq(qpn) if fast => {
                self.ring_sq_now(qpn);
                self.dp.left_for_engine()
            }
            DoorbellTarget::Sq(qpn) => self.ring_sq(qpn),
            DoorbellTarget::Rq(qpn) => self.ring_rq(qpn),
            DoorbellTarget::Srq(srqn) => self.ring_srq(srqn),
            DoorbellTarget::CqArm(cqn) => {
                self.arm_cq(cqn);
                false
            }
        }
    }

    /// The receive queue doorbell: a QP in ERR flushes the new WQEs; a
    /// responder that sent an RNR NAK lets its requester retry.
    pub(crate) fn ring_rq(&mut self, qpn: u32) -> bool {
        let (qps, mut env) = self.split();
        let Ok(qp) = qps.get_mut(qpn) else {
            return false;
        };
        if qp.state == QpState::Err {
            flush_rq(qpn, qp, &mut env);
            true
        } else {
            responder::receive_posted(qp, &mut env)
        }
    }

    /// The SRQ doorbell: every QP that sent an RNR NAK for want of one of
    /// its WQEs may have its requester retry.
    pub(crate) fn ring_srq(&mut self, srqn: u32) -> bool {
        let waiters = match self.srqs.get_mut(srqn) {
            Ok(srq) if !srq.rnr_waiters.is_empty() => core::mem::take(&mut srq.rnr_waiters),
            _ => return false,
        };
        let (qps, mut env) = self.split();
        for &qpn in &waiters {
            if let Ok(qp) = qps.get_mut(qpn) {
                responder::receive_posted(qp, &mut env);
            }
        }
        if let Ok(srq) = self.srqs.get_mut(srqn) {
            if srq.rnr_waiters.is_empty() {
                let mut waiters = waiters;
                waiters.clear();
                srq.rnr_waiters = waiters;
                srq.ring.0.doorbell_request().set(false);
            }
        }
        true
    }

    /// Runs the data path: inbound and loopback frames, then requesters
    /// within `budget` packets. Returns true when work is left (the budget
    /// ran out, or frames arrived meanwhile from this run).
    pub(crate) fn run_datapath(&mut self, budget: usize) -> bool {
        let mut budget = budget;
        loop {
            let mut progressed = false;
            if !self.dp.inbound.is_empty() {
                let mut b = core::mem::take(&mut self.dp.inbound);
                self.process_batch(&b);
                b.clear();
                self.dp.inbound = b;
                progressed = true;
            }
            while !self.dp.loopq.is_empty() {
                let spare = core::mem::take(&mut self.dp.loop_spare);
                let mut b = core::mem::replace(&mut self.dp.loopq, spare);
                self.process_batch(&b);
                b.clear();
                self.dp.loop_spare = b;
                progressed = true;
            }
            if !self.dp.cq_errors.is_empty() {
                self.handle_cq_errors();
                progressed = true;
            }
            if !self.dp.loopq.is_empty() {
                continue;
            }
            if budget == 0 {
                return self.dp.has_work();
            }
            if let Some(qpn) = self.dp.ready.pop_front() {
                if let Ok(qp) = self.qps.get_mut(qpn) {
                    qp.tx.scheduled = false;
                    // The fast path first, as the doorbells run it, for a
                    // QP whose peer is on this HCA (the only one it can
                    // take: the packet path's QPs skip its lookups); the
                    // requester takes what it leaves.
                    let loopback = qp.tx.path.dgid == self.dp.gid;
                    let ran = if loopback {
                        crate::transport::fast::run(self, qpn)
                    } else {
                        crate::transport::fast::Ran::Stopped
                    };
                    match ran {
                        crate::transport::fast::Ran::All => {}
                        crate::transport::fast::Ran::Budget => {
                            budget = 0;
                            self.ring_sq(qpn);
                        }
                        crate::transport::fast::Ran::Stopped => {
                            let used = self.run_requester(qpn, budget, false);
                            budget = budget.saturating_sub(used);
                        }
                    }
                }
                progressed = true;
            }
            if !progressed {
                return false;
            }
        }
    }

    /// Processes every frame of `batch`, then sends the coalesced ACKs.
    fn process_batch(&mut self, batch: &Batch) {
        for frame in &batch.frames {
            match *frame {
                Frame::Packet {
                    ref pkt,
                    burst,
                    seg,
                    nsegs,
                    notify,
                } => {
                    if self.dp.link_down {
                        // A port whose link is down receives nothing,
                        // whichever way a frame came (the link, a fabric
                        // peer's inbox, loopback queued before it went
                        // down).
                        self.dp.stats.packets_dropped += u64::from(burst.count);
                    } else {
                        self.receive(pkt, burst, batch.payload(seg, nsegs));
                    }
                    if let Some(qpn) = notify {
                        let psn = burst.last_psn(pkt.psn);
                        self.dp.signal(&pkt.sgid, Frame::Sent { qpn, psn });
                    }
                }
                Frame::Sent { qpn, psn } => {
                    let (qps, mut env) = self.split();
                    if let Ok(qp) = qps.get_mut(qpn) {
                        completer::sent(qpn, qp, &mut env, psn);
                    }
                }
                Frame::RetryHint { qpn } => {
                    let (qps, mut env) = self.split();
                    if let Ok(qp) = qps.get_mut(qpn) {
                        completer::rnr_timer_expired(qpn, qp, &mut env);
                    }
                }
            }
        }
        self.flush_acks();
    }

    /// One inbound packet (or burst): to its QP's responder (requests) or
    /// completer (responses), [`deliver`]. Packets for no QP are dropped.
    pub(crate) fn receive(
        &mut self,
        pkt: &Packet,
        burst: Burst,
        payload: &[crate::wire::packet::Seg],
    ) {
        self.dp.stats.packets_received += u64::from(burst.count);
        if pkt.dest_qpn == irpverbs_core::GSI_QPN {
            crate::transport::gsi::receive(&mut self.dp, &self.port, pkt, burst, payload);
            return;
        }
        let (qps, mut env) = self.split();
        let Ok(qp) = qps.get_mut(pkt.dest_qpn) else {
            env.dp.stats.packets_dropped += u64::from(burst.count);
            return;
        };
        deliver(qp, &mut env, pkt, burst, Payload::Segs(payload));
    }

    /// Fires the timers due at `now` (the link's clock, ns): local ACK
    /// timeouts and RNR timers; with a platform clock, arms it for the
    /// next deadline.
    pub(crate) fn fire_timers(&mut self, now: u64) {
        self.dp.now = self.dp.now.max(now);
        let now = self.dp.timer_now();
        // In place (QPs a timer arms meanwhile are appended, and looked at
        // too), so that the list keeps its room.
        let mut i = 0;
        while i < self.dp.timed.len() {
            let qpn = self.dp.timed[i];
            let Ok(qp) = self.qps.get_mut(qpn) else {
                self.dp.timed.swap_remove(i);
                continue;
            };
            let (rto, rnr) = (qp.tx.rto_at, qp.tx.rnr_at);
            if rnr.is_some_and(|t| t <= now) {
                qp.tx.rnr_at = None;
                self.dp.link_stats.rnr_timeouts += 1;
                self.rnr_timeout(qpn);
            }
            if rto.is_some_and(|t| t <= now) {
                if let Ok(qp) = self.qps.get_mut(qpn) {
                    qp.tx.rto_at = None;
                }
                self.dp.link_stats.ack_timeouts += 1;
                self.retransmit_timeout(qpn);
            }
            match self.qps.get_mut(qpn) {
                Ok(qp) if qp.tx.rto_at.is_some() || qp.tx.rnr_at.is_some() => i += 1,
                Ok(qp) => {
                    qp.tx.timed = false;
                    self.dp.timed.swap_remove(i);
                }
                Err(_) => {
                    self.dp.timed.swap_remove(i);
                }
            }
        }
        // With the timers armed while these fired (only a platform clock
        // needs the deadline; a link asks for it after the data path ran).
        if let Some(clock) = &self.dp.clock {
            let next = self.next_deadline();
            // Armed again only when it fired (its deadline passed) or must
            // fire earlier: a link's timer thread calls in often, and a
            // timer that fires early arms itself again then.
            let armed = self.dp.clock_armed;
            let keep = armed.is_some_and(|a| a > now && next.is_none_or(|n| a <= n));
            if !keep {
                self.dp.clock_armed = next;
                if let Some(n) = next {
                    clock.arm(n);
                }
            }
        }
    }

    /// The earliest armed timer's deadline.
    pub(crate) fn next_deadline(&self) -> Option<u64> {
        self.dp
            .timed
            .iter()
            .filter_map(|&qpn| self.qps.get(qpn).ok())
            .flat_map(|qp| [qp.tx.rto_at, qp.tx.rnr_at])
            .flatten()
            .min()
    }

    /// The retransmit timer of QP `qpn` expired (see
    /// [`completer::retransmit_timeout`]).
    pub(crate) fn retransmit_timeout(&mut self, qpn: u32) {
        let (qps, mut env) = self.split();
        if let Ok(qp) = qps.get_mut(qpn) {
            completer::retransmit_timeout(qpn, qp, &mut env);
        }
    }

    /// The RNR timer of QP `qpn` expired (in-process the responder's retry
    /// hint calls [`completer::rnr_timer_expired`] instead).
    pub(crate) fn rnr_timeout(&mut self, qpn: u32) {
        let (qps, mut env) = self.split();
        if let Ok(qp) = qps.get_mut(qpn) {
            completer::rnr_timer_expired(qpn, qp, &mut env);
        }
    }

    /// Sends the ACKs responders coalesced while processing a batch.
    pub(crate) fn flush_acks(&mut self) {
        if self.dp.acks.is_empty() {
            return;
        }
        // In place, so that the list keeps its room (an ACK queued
        // meanwhile is sent in this pass).
        let mut i = 0;
        while i < self.dp.acks.len() {
            let qpn = self.dp.acks[i];
            i += 1;
            let (qps, mut env) = self.split();
            let Ok(qp) = qps.get_mut(qpn) else { continue };
            // Loopback with nothing else on its way back: the requester
            // takes the ACK at once, without a packet.
            let local = qp.tx.path.dgid == env.dp.gid && env.dp.loopq.is_empty();
            match qp.tx.resp.ack {
                Some(psn) if local => {
                    qp.tx.resp.ack = None;
                    let dest = qp.tx.path.dest_qpn;
                    env.dp.stats.packets_sent += 1;
                    env.dp.stats.packets_received += 1;
                    if let Ok(req) = qps.get_mut(dest) {
                        completer::acked(dest, req, &mut env, psn);
                    }
                }
                _ => responder::send_pending_ack(qp, &mut env),
            }
        }
        self.dp.acks.clear();
    }

    /// Moves every QP that completes on an overrun CQ to ERR.
    fn handle_cq_errors(&mut self) {
        while let Some(cqn) = self.dp.cq_errors.pop() {
            let (qps, mut env) = self.split();
            for (qpn, qp) in qps.iter_mut() {
                if qp.send_cqn == cqn || qp.recv_cqn == cqn {
                    enter_error(qpn, qp, &mut env, None);
                }
            }
        }
    }

    /// Consequences of a successful `ModifyQp` from `from` to `qp.state`
    /// for the data path (the attributes are applied already).
    pub(crate) fn on_modify(&mut self, qpn: u32, from: QpState, mask: u32) {
        let gid0 = self.port.gid(0).unwrap_or_default();
        let (qps, mut env) = self.split();
        let Ok(qp) = qps.get_mut(qpn) else { return };
        let to = qp.state;
        match to {
            QpState::Reset => {
                if from == QpState::Err {
                    env.dp.unattend();
                }
                if qp.tx.resp.rnr_wait {
                    env.dp.unattend();
                }
                let sq_pi = qp.sq.0.producer_word().load(Ordering::Acquire);
                qp.sq.0.consumer().release(sq_pi);
                qp.tx.reset();
                ask_rq_doorbells(qp);
                qp.tx.req.resync(sq_pi);
                if let Some(rq) = qp.rq.as_ref().map(|r| &r.0) {
                    let pi = rq.producer_word().load(Ordering::Acquire);
                    rq.consumer().release(pi);
                    qp.tx.resp.rq_ci = pi;
                }
            }
            QpState::Err => {
                qp.state = from;
                enter_error(qpn, qp, &mut env, None);
            }
            QpState::Sqe => {}
            QpState::Init | QpState::Rtr | QpState::Rts | QpState::Sqd => {
                configure(qpn, qp, &mut env, from, mask, gid0);
            }
        }
    }

    /// `cq_arm_doorbell`: fires the armed CQ at once when completions it
    /// would fire for wait unpolled.
    pub(crate) fn arm_cq(&mut self, cqn: u32) {
        if let Ok(cq) = self.cqs.get_mut(cqn) {
            if cq.check_armed() {
                self.dp.event(Event::Completion { cqn });
            }
        }
    }

    /// Attaches the data path to a fabric (or detaches it).
    pub(crate) fn set_router(&mut self, router: Option<Arc<dyn Router>>) {
        self.dp.router = router;
        for q in &mut self.dp.outbox {
            q.generation = u64::MAX;
        }
    }
}

/// The transport, as the firmware's commands see it.
pub(crate) struct Engine;

impl crate::firmware::DataPathOps for Engine {
    fn on_modify(fw: &mut Firmware, qpn: u32, from: QpState, mask: u32) {
        fw.on_modify(qpn, from, mask);
    }
}

/// Applies a transition into INIT, RTR, RTS or SQD to the transport state.
fn configure(qpn: u32, qp: &mut Qp, env: &mut Env<'_>, from: QpState, mask: u32, gid0: Gid) {
    use irpverbs_abi::{IV_QP_RETRY_CNT, IV_QP_RNR_RETRY, IV_QP_RQ_PSN, IV_QP_SQ_PSN};
    let to = qp.state;
    let a = qp.attr;
    let tx = &mut qp.tx;
    tx.mtu = if qp.qp_type == IV_QPT_UD {
        env.port.active_mtu_bytes()
    } else {
        crate::wire::mtu_bytes(a.path_mtu)
    };
    if qp.qp_type != IV_QPT_UD {
        tx.path = crate::transport::apm::path(&a, env.port, false, gid0);
    }
    if to == QpState::Rtr && from == QpState::Init {
        tx.comm_est = false;
        tx.resp.configure(&a);
    }
    if mask & IV_QP_RQ_PSN != 0 && to == QpState::Rtr {
        tx.resp.epsn = a.rq_psn;
    }
    if mask & IV_QP_SQ_PSN != 0 && to != QpState::Rtr {
        tx.req.set_psn(a.sq_psn);
    }
    if mask & IV_QP_RETRY_CNT != 0 || from == QpState::Rtr {
        tx.req.retry_left = a.retry_cnt;
    }
    if mask & IV_QP_RNR_RETRY != 0 || from == QpState::Rtr {
        tx.req.rnr_left = a.rnr_retry;
    }
    match to {
        QpState::Rts => {
            tx.draining = false;
            env.dp.schedule(qpn, tx);
        }
        QpState::Sqd if from == QpState::Rts => {
            tx.drain_notify = a.en_sqd_async_notify != 0;
            tx.draining = tx.req.in_flight();
            if tx.draining {
                requester::solicit_ack(qp);
                env.dp.schedule(qpn, &mut qp.tx);
            }
        }
        _ => {}
    }
}

/// A packet (or burst) for QP `qp` (`pkt.dest_qpn`), received or
/// short-circuited ([`crate::transport::local`]): to its responder
/// (requests) or completer (responses). Packets of an unknown opcode, a
/// burst whose ends do not belong together, or from another than a
/// connected QP's peer, are dropped.
#[inline(always)]
pub(crate) fn deliver(
    qp: &mut Qp,
    env: &mut Env<'_>,
    pkt: &Packet,
    burst: Burst,
    payload: Payload<'_>,
) {
    if !accepts(qp, env, pkt, burst) {
        return;
    }
    if pkt.mask() & m::REQ != 0 {
        responder::handle(pkt.dest_qpn, qp, env, pkt, burst, payload);
    } else {
        completer::handle(pkt.dest_qpn, qp, env, pkt, burst, payload);
    }
}

/// Whether QP `qp` takes packet (or burst) `pkt` at all: a known opcode,
/// a burst whose ends belong together, from a connected QP's peer (or an
/// armed QP's alternate path, which migrates it). What it does not take
/// is counted dropped.
#[inline(always)]
pub(crate) fn accepts(qp: &mut Qp, env: &mut Env<'_>, pkt: &Packet, burst: Burst) -> bool {
    if pkt.mask() == 0 || !burst_ok(pkt.opcode, burst) {
        env.dp.stats.packets_dropped += u64::from(burst.count);
        return false;
    }
    // A connected QP believes only its peer (see `crate::transport::trust`): the
    // GIDs it cached at RTR, compared as they are.
    // An armed QP also takes a migration request from its alternate
    // path (`crate::transport::apm`), and migrates.
    if qp.qp_type != IV_QPT_UD
        && (pkt.sgid != qp.tx.path.dgid || pkt.dgid != qp.tx.path.sgid)
        && !crate::transport::apm::migration_request(pkt.dest_qpn, qp, env, pkt)
    {
        env.dp.stats.trust.foreign_address += u64::from(burst.count);
        env.dp.stats.packets_dropped += u64::from(burst.count);
        return false;
    }
    true
}

/// Whether a burst from `first` to `burst.last_opcode` is packets of one
/// message: one packet, or FIRST/MIDDLE then MIDDLE/LAST of the same
/// operation and transport.
pub(crate) fn burst_ok(first: u8, burst: Burst) -> bool {
    let last = burst.last_opcode;
    if burst.count <= 1 {
        return burst.count == 1 && first == last;
    }
    let (kf, kl) = (
        crate::wire::packet::mask(first),
        crate::wire::packet::mask(last),
    );
    let kind = m::SEND | m::WRITE | m::READ;
    first & crate::wire::packet::op::TRANSPORT_MASK
        == last & crate::wire::packet::op::TRANSPORT_MASK
        && kf & kind == kl & kind
        && kf & kind != 0
        && kf & m::END == 0
        && kl & m::START == 0
        && kf & (m::REQ | m::RESP) == kl & (m::REQ | m::RESP)
}
