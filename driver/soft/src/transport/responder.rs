//! The responder: validates request packets and executes them.
//!
//! A QP's responder takes packets in RTR, RTS, SQD and SQE (in RTR the
//! first one raises CommEstablished, on RC and UC). Checks in order, as IBTA 9.7 and
//! Linux rxe do: transport, PSN, opcode sequence, the QP's access flags and
//! responder resources, packet length, receive WQE, rkey; then execution:
//! SEND scatters into the receive WQE (from the RQ or the SRQ), RDMA WRITE
//! copies into the MR the rkey names, RDMA READ sends responses from it,
//! atomics run on it with `Region::atomic_u64`. Payload bytes are copied
//! once, from the sender's segments to their destination.
//!
//! RC errors (the responder QP goes to ERR, the requester gets a NAK):
//! - invalid request (NAK invalid request, `QpRequestError`): opcode out
//!   of sequence, READ or atomic with no responder resources
//!   (`max_dest_rd_atomic` 0), a bad packet length, a message beyond its
//!   RETH length or `max_msg_sz`, a misaligned atomic, an IETH rkey naming
//!   no MR of the PD; a message too long for the receive WQE (the WQE
//!   completes `LOC_LEN_ERR`);
//! - access (NAK remote access error, `QpAccessError`): an rkey naming no
//!   valid MR, an MR of another PD or without the remote right, a range
//!   outside it, the QP's own access flags lacking the right;
//! - the responder's own trouble (NAK remote operational error,
//!   `QpFatal`): a malformed receive WQE (`LOC_QP_OP_ERR`), a receive SGE
//!   that fails protection (`LOC_PROT_ERR`), a receive queue ring with
//!   impossible indices; its receive CQ overrunning (`CqError`, and every
//!   QP on that CQ goes to ERR).
//!
//! No receive WQE for a SEND (or a WRITE with immediate) is an RNR NAK
//! (RC; the packet is not executed). PSNs ahead of the expected one get one
//! PSN sequence error NAK until the expected one arrives; PSNs behind it
//! are duplicates: SEND and WRITE are ACKed again, READ is executed again
//! from the responder resource that holds it, an atomic's saved result is
//! sent again. ACKs are coalesced: one per QP per batch of packets.
//!
//! UC drops what RC NAKs (the message is lost; the receive WQE is reused
//! for the next message), and has no ACKs. UD checks the Q_Key, writes a
//! 40-byte GRH before the payload and reports the source QP.

use core::sync::atomic::{AtomicU64, Ordering};

use irpverbs_abi::{
    IV_ACCESS_REMOTE_ATOMIC, IV_ACCESS_REMOTE_READ, IV_ACCESS_REMOTE_WRITE, IV_GRH_LEN, IV_QPT_RC,
    IV_QPT_UC, IV_WC_GRH, IV_WC_LOC_LEN_ERR, IV_WC_LOC_PROT_ERR, IV_WC_LOC_QP_OP_ERR,
    IV_WC_OP_RECV, IV_WC_OP_RECV_RDMA_WITH_IMM, IV_WC_REM_ACCESS_ERR, IV_WC_REM_INV_REQ_ERR,
    IV_WC_SUCCESS, IV_WC_WITH_IMM, IV_WC_WITH_INV, IvCqe, IvQpAttr, IvRecvWqe,
};
use irpverbs_core::AsyncEvent;
use irpverbs_ring::Ring;
use irpverbs_ring::wq::read_recv_wqe_into;

use crate::firmware::cq::post_cqe;
use crate::firmware::datapath::DataPath;
use crate::firmware::mr::Mr;
use crate::firmware::port::MAX_MSG_SZ;
use crate::firmware::qp::{Qp, QpState};
use crate::firmware::qp_state::{RecvWqe, Resource, RespState, WriteState};
use crate::firmware::srq::Srq;
use crate::transport::dma::{
    DmaError, Payload, Source, mr_segs, remote_ok, rkey_mr, scatter, write_mr,
};
use crate::transport::engine::{Env, enter_error};
use crate::wire::packet::{
    Aeth, AtomicEth, BTH_LEN, Burst, DETH_LEN, Frame, IMMDT_LEN, Packet, aeth, m, op, psn_add,
    psn_diff,
};

impl RespState {
    /// Entering RTR.
    pub(crate) fn configure(&mut self, attr: &IvQpAttr) {
        self.epsn = attr.rq_psn;
        self.msn = 0;
        self.in_msg = 0;
        self.nak_sent = false;
        self.drop_msg = false;
        self.ack = None;
    }

    /// Takes the receive WQE in progress, for a flush: its wr_id.
    pub(crate) fn take_recv(&mut self) -> Option<u64> {
        core::mem::take(&mut self.has_recv).then_some(self.recv.wr_id)
    }

    /// The receive WQE in progress.
    pub(crate) fn recv_mut(&mut self) -> Option<&mut RecvWqe> {
        self.has_recv.then_some(&mut self.recv)
    }
}

/// Why a request failed, and what it costs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fail {
    /// NAK invalid request, `QpRequestError`; the receive WQE in progress
    /// completes with the status.
    Invalid(u32),
    /// NAK remote access error, `QpAccessError`.
    Access,
    /// NAK remote operational error, `QpFatal`; the receive WQE completes
    /// with the status.
    Local(u32),
    /// The receive CQ overran: NAK remote operational error (the CQ error
    /// moves the QP to ERR).
    CqOverrun,
    /// No receive WQE: RNR NAK.
    Rnr,
}

const INVALID: Fail = Fail::Invalid(IV_WC_REM_INV_REQ_ERR);

/// A request packet (or burst) for QP `qpn`.
pub(crate) fn handle(
    qpn: u32,
    qp: &mut Qp,
    env: &mut Env<'_>,
    pkt: &Packet,
    burst: Burst,
    payload: Payload<'_>,
) {
    if !matches!(
        qp.state,
        QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
    ) {
        env.dp.stats.packets_dropped += 1;
        return;
    }
    let transport = pkt.opcode & op::TRANSPORT_MASK;
    let expected = match qp.qp_type {
        IV_QPT_RC => op::RC,
        IV_QPT_UC => op::UC,
        _ => op::UD,
    };
    if transport != expected {
        env.dp.stats.packets_dropped += 1;
        return;
    }
    first_request(qpn, qp, env.dp);
    match qp.qp_type {
        IV_QPT_RC => rc(qpn, qp, env, pkt, burst, payload),
        IV_QPT_UC => uc(qpn, qp, env, pkt, burst, payload),
        _ => ud(qpn, qp, env, pkt, payload),
    }
}

/// Sends the coalesced ACK of `qp`, if one waits.
pub(crate) fn send_pending_ack(qp: &mut Qp, env: &mut Env<'_>) {
    if let Some(psn) = qp.tx.resp.ack.take() {
        let msn = qp.tx.resp.msn;
        send_ack(qp, env, aeth::ACK | aeth::ACK_UNLIMITED, psn, msn);
    }
}

// Out of line: its packet is not in the frames of the responder's
// operations that send one before their responses (`read`, `atomic`,
// docs/stack-budget.md).
#[inline(never)]
fn send_ack(qp: &Qp, env: &mut Env<'_>, syndrome: u8, psn: u32, msn: u32) {
    let mut pkt = qp.tx.path.packet(op::RC_ACKNOWLEDGE, psn);
    pkt.aeth = Aeth { syndrome, msn };
    env.dp.emit_bare(pkt);
}

/// Queues an ACK for `psn` (sent at the end of the batch).
fn queue_ack(qpn: u32, qp: &mut Qp, env: &mut Env<'_>, psn: u32) {
    // Room for every QP was reserved at its create; without it (no
    // memory) the ACK goes now.
    // A short-circuited request's requester takes it at the end of its
    // run (`crate::transport::local::ack`).
    if qp.tx.resp.ack.replace(psn).is_none()
        && env.dp.capture != Some(qp.tx.path.dest_qpn)
        && !crate::firmware::shared::push(&mut env.dp.acks, qpn)
    {
        send_pending_ack(qp, env);
    }
}

/// A receive was posted (RQ or SRQ doorbell): a requester that got an RNR
/// NAK from this QP may retry.
pub(crate) fn receive_posted(qp: &mut Qp, env: &mut Env<'_>) -> bool {
    let waiting = core::mem::take(&mut qp.tx.resp.rnr_wait);
    if waiting {
        crate::transport::engine::ask_rq_doorbells(qp);
        env.dp.unattend();
        let path = qp.tx.path;
        env.dp
            .signal(&path.dgid, Frame::RetryHint { qpn: path.dest_qpn });
    }
    waiting
}

/// After an RNR NAK: remember to tell the requester when a receive is
/// posted. A receive posted meanwhile (its doorbell may have seen nothing
/// to do) is found by the re-read after [`crate::firmware::datapath::DataPath::attend`].
#[cold]
#[inline(never)]
fn wait_for_receive(qpn: u32, qp: &mut Qp, env: &mut Env<'_>) {
    if !qp.tx.resp.rnr_wait {
        qp.tx.resp.rnr_wait = true;
        env.dp.attend();
        crate::transport::engine::ask_rq_doorbells(qp);
    }
    let posted = if let Some(srqn) = qp.srqn {
        match env.srqs.get_mut(srqn) {
            Ok(srq) => {
                // Room for every QP on the SRQ was reserved at its create.
                if !srq.rnr_waiters.contains(&qpn) {
                    crate::firmware::shared::push(&mut srq.rnr_waiters, qpn);
                }
                srq.ring.0.doorbell_request().set(true);
                srq.ring.0.producer_word().load(Ordering::SeqCst) != srq.ci
            }
            Err(_) => false,
        }
    } else {
        qp.rq
            .as_ref()
            .is_some_and(|rq| rq.0.producer_word().load(Ordering::SeqCst) != qp.tx.resp.rq_ci)
    };
    if posted {
        receive_posted(qp, env);
    }
}

/// The next receive WQE, taken from the RQ or SRQ into `qp.tx.resp.recv`
/// (read straight there). `Ok(false)`: none posted.
fn take_recv(qpn: u32, qp: &mut Qp, env: &mut Env<'_>) -> Result<bool, Fail> {
    let resp = &mut qp.tx.resp;
    if resp.has_recv {
        return Ok(true);
    }
    let wqe = &mut resp.recv;
    wqe.offset = 0;
    let read = if let Some(srqn) = qp.srqn {
        let Ok(srq) = env.srqs.get_mut(srqn) else {
            return Ok(false);
        };
        if srq.error {
            return Err(Fail::Local(IV_WC_LOC_QP_OP_ERR));
        }
        let ring = &srq.ring.0;
        let pi = ring.producer_word().load(Ordering::Acquire);
        let n = pi.wrapping_sub(srq.ci);
        if n == 0 {
            return Ok(false);
        }
        if n > ring.capacity() {
            // The SRQ is in error: this QP and every one that takes from
            // it after fails (their requesters learn it from the NAK).
            srq.ci = pi;
            srq.error = true;
            ring.consumer().release(pi);
            env.dp.raise(AsyncEvent::SrqError(srqn));
            return Err(Fail::Local(IV_WC_LOC_QP_OP_ERR));
        }
        let index = srq.ci;
        let read = read_recv_wqe_into(ring, index, srq.max_sge, &mut wqe.sges);
        if read.is_err() {
            wqe.wr_id = raw_wr_id(ring, index);
        }
        // Read before the slot is handed back to the ULP.
        srq_taken(srq, srqn, n, env.dp);
        read
    } else {
        let Some(rq) = qp.rq.as_ref() else {
            return Ok(false);
        };
        let ring = &rq.0;
        let pi = ring.producer_word().load(Ordering::Acquire);
        let n = pi.wrapping_sub(resp.rq_ci);
        if n == 0 {
            return Ok(false);
        }
        if n > ring.capacity() {
            resp.rq_ci = pi;
            ring.consumer().release(pi);
            enter_error(qpn, qp, env, Some(AsyncEvent::QpFatal(qpn)));
            return Err(Fail::Local(IV_WC_LOC_QP_OP_ERR));
        }
        let index = resp.rq_ci;
        let read = read_recv_wqe_into(ring, index, qp.cap.max_recv_sge, &mut wqe.sges);
        if read.is_err() {
            wqe.wr_id = raw_wr_id(ring, index);
        }
        // Read before the slot is handed back to the ULP.
        resp.rq_ci = index.wrapping_add(1);
        ring.consumer().release(resp.rq_ci);
        read
    };
    let resp = &mut qp.tx.resp;
    resp.has_recv = true;
    match read {
        Ok((wr_id, nsge)) => {
            resp.recv.wr_id = wr_id;
            resp.recv.nsge = nsge;
            Ok(true)
        }
        Err(_) => {
            resp.recv.nsge = 0;
            Err(Fail::Local(IV_WC_LOC_QP_OP_ERR))
        }
    }
}

fn raw_wr_id(ring: &Ring, index: u32) -> u64 {
    ring.region()
        .read_obj::<IvRecvWqe>(ring.slot_offset(index))
        .map(|w| w.wr_id)
        .unwrap_or(0)
}

/// Completes the receive WQE in progress successfully: `cqe` makes its
/// completion from its wr_id and the bytes placed in it; `solicited`
/// (the message's SE bit) for the CQ's solicited arming.
fn complete_recv(
    qp: &mut Qp,
    env: &mut Env<'_>,
    solicited: bool,
    cqe: impl FnOnce(u64, u32) -> IvCqe,
) -> bool {
    let Some(recv) = qp.tx.resp.recv_mut() else {
        return true;
    };
    let (wr_id, offset) = (recv.wr_id, recv.offset);
    qp.tx.resp.has_recv = false;
    post_cqe(env.cqs, env.dp, qp.recv_cqn, &cqe(wr_id, offset), solicited)
}

/// The completion of receive WQE `wr_id` on QP `qpn` for a message from
/// QP `src_qp` of `byte_len` bytes whose (last) packets' header mask is
/// `k`: a SEND's (with the ImmDt or the IETH key, `imm_or_inv`, when it
/// has one), or a WRITE with immediate data's.
#[inline(always)]
pub(crate) fn recv_cqe(
    qpn: u32,
    src_qp: u32,
    wr_id: u64,
    k: u32,
    byte_len: u32,
    imm_or_inv: u32,
) -> IvCqe {
    let wc_flags = if k & m::IMMDT != 0 {
        IV_WC_WITH_IMM
    } else if k & m::IETH != 0 {
        IV_WC_WITH_INV
    } else {
        0
    };
    IvCqe {
        wr_id,
        status: IV_WC_SUCCESS,
        opcode: if k & m::WRITE != 0 {
            IV_WC_OP_RECV_RDMA_WITH_IMM
        } else {
            IV_WC_OP_RECV
        },
        wc_flags,
        imm_or_inv: if wc_flags != 0 { imm_or_inv } else { 0 },
        byte_len,
        qp_num: qpn,
        src_qp,
        ..IvCqe::default()
    }
}

/// A receive WQE was taken from SRQ `srqn`, which held `posted` (it was
/// read): the slot goes back to the ULP, and a limit above what is left
/// raises SrqLimitReached, once (the limit is disarmed).
#[inline(always)]
pub(crate) fn srq_taken(srq: &mut Srq, srqn: u32, posted: u32, dp: &mut DataPath) {
    srq.ci = srq.ci.wrapping_add(1);
    srq.ring.0.consumer().release(srq.ci);
    if srq.srq_limit > 0 && posted - 1 < srq.srq_limit {
        srq.srq_limit = 0;
        dp.raise(AsyncEvent::SrqLimitReached(srqn));
    }
}

/// A request for connected QP `qpn`: the first one in RTR establishes
/// communication (once per RTR).
#[inline(always)]
pub(crate) fn first_request(qpn: u32, qp: &mut Qp, dp: &mut DataPath) {
    if qp.state == QpState::Rtr && !qp.tx.comm_est && qp.qp_type != irpverbs_abi::IV_QPT_UD {
        comm_established(qpn, qp, dp);
    }
}

#[cold]
#[inline(never)]
fn comm_established(qpn: u32, qp: &mut Qp, dp: &mut DataPath) {
    qp.tx.comm_est = true;
    dp.raise(AsyncEvent::CommEstablished(qpn));
}

/// The responder executed the packets of a request up to PSN `last`
/// (header mask `k`): the next PSN is expected; a message that ended
/// (`m::END`) is counted, else the operation continues.
#[inline(always)]
pub(crate) fn accepted(resp: &mut RespState, last: u32, k: u32) {
    resp.epsn = psn_add(last, 1);
    if k & m::END != 0 {
        resp.in_msg = 0;
        resp.msn = psn_add(resp.msn, 1);
    } else {
        resp.in_msg = k & (m::SEND | m::WRITE);
    }
}

/// Checks the length of a packet (or burst) against the MTU and its
/// carried bytes (rxe's `check_length`, per packet): FIRST and MIDDLE
/// packets carry one MTU, LAST 1 to MTU bytes, ONLY at most an MTU.
fn length_ok(k: u32, pkt: &Packet, burst: Burst, payload: &Payload<'_>, mtu: u32) -> bool {
    let carried = payload.len();
    if carried != pkt.payload_len as usize {
        return false;
    }
    let len = u64::from(pkt.payload_len);
    if k & m::PAYLOAD == 0 {
        return len == 0;
    }
    let (n, mtu) = (u64::from(burst.count), u64::from(mtu));
    let only = k & m::START != 0 && n == 1;
    let ok = match (only, k & m::END != 0) {
        (true, true) => len <= mtu,
        (_, false) => len == n * mtu,
        (false, true) => len > (n - 1) * mtu && len <= n * mtu,
    };
    ok && (k & m::RETH == 0 || pkt.reth.len <= MAX_MSG_SZ)
}

/// The MR an rkey names for `access` on `len` bytes at `va` (which may
/// lie in more than one piece of its region).
#[allow(clippy::too_many_arguments)]
fn remote_mr<'m>(
    mrs: &'m crate::firmware::table::Table<Mr>,
    mws: &'m crate::firmware::table::Table<crate::firmware::mw::Mw>,
    qpn: u32,
    qp: &Qp,
    rkey: u32,
    access: u32,
    va: u64,
    len: u64,
) -> Result<&'m Mr, Fail> {
    let mr = rkey_mr(mrs, mws, rkey, qpn).ok_or(Fail::Access)?;
    if remote_ok(mr, qp.pdn, access, va, len) {
        Ok(mr)
    } else {
        Err(Fail::Access)
    }
}

fn rc(qpn: u32, qp: &mut Qp, env: &mut Env<'_>, pkt: &Packet, burst: Burst, payload: Payload<'_>) {
    let resp = &mut qp.tx.resp;
    let d = psn_diff(pkt.psn, resp.epsn);
    if d > 0 {
        env.dp.stats.packets_dropped += 1;
        if !resp.nak_sent {
            resp.nak_sent = true;
            let (epsn, msn) = (resp.epsn, resp.msn);
            send_pending_ack(qp, env);
            send_ack(qp, env, aeth::NAK | aeth::NAK_PSN_SEQ_ERR, epsn, msn);
        }
        return;
    }
    if d < 0 {
        duplicate(qpn, qp, env, pkt);
        return;
    }
    resp.nak_sent = false;
    match execute(qpn, qp, env, pkt, burst, payload) {
        Ok(()) => {}
        Err(Fail::Rnr) => {
            env.dp.stats.rnr_naks += u64::from(burst.count);
            env.dp.stats.packets_dropped += u64::from(burst.count);
            send_pending_ack(qp, env);
            let syndrome = aeth::RNR_NAK | (qp.attr.min_rnr_timer & 0x1F);
            send_ack(qp, env, syndrome, pkt.psn, qp.tx.resp.msn);
            wait_for_receive(qpn, qp, env);
        }
        Err(fail) => rc_error(qpn, qp, env, pkt.psn, fail),
    }
}

/// A class C/A error on RC: NAK, the receive WQE in progress completes in
/// error, the QP goes to ERR with the matching event.
#[cold]
#[inline(never)]
fn rc_error(qpn: u32, qp: &mut Qp, env: &mut Env<'_>, psn: u32, fail: Fail) {
    send_pending_ack(qp, env);
    let (code, status, event) = match fail {
        Fail::Invalid(s) => (
            aeth::NAK_INVALID_REQ,
            s,
            Some(AsyncEvent::QpRequestError(qpn)),
        ),
        Fail::Access => (
            aeth::NAK_REM_ACCESS,
            IV_WC_REM_ACCESS_ERR,
            Some(AsyncEvent::QpAccessError(qpn)),
        ),
        Fail::Local(s) => (aeth::NAK_REM_OP, s, Some(AsyncEvent::QpFatal(qpn))),
        Fail::CqOverrun | Fail::Rnr => (aeth::NAK_REM_OP, IV_WC_LOC_QP_OP_ERR, None),
    };
    let msn = qp.tx.resp.msn;
    send_ack(qp, env, aeth::NAK | code, psn, msn);
    fail_recv(qpn, qp, env, status);
    enter_error(qpn, qp, env, event);
}

/// Completes the receive WQE in progress with `status`.
fn fail_recv(qpn: u32, qp: &mut Qp, env: &mut Env<'_>, status: u32) {
    if let Some(wr_id) = qp.tx.resp.take_recv() {
        let cqe = IvCqe {
            wr_id,
            status,
            opcode: IV_WC_OP_RECV,
            qp_num: qpn,
            ..IvCqe::default()
        };
        post_cqe(env.cqs, env.dp, qp.recv_cqn, &cqe, false);
    }
}

/// How far an operation's header mask bit ([`m::WRITE`], [`m::READ`],
/// [`m::ATOMIC`]) lies above the remote access right it needs.
const RIGHT_SHIFT: u32 = m::WRITE.trailing_zeros() - IV_ACCESS_REMOTE_WRITE.trailing_zeros();
const _: () = assert!(
    m::WRITE >> RIGHT_SHIFT == IV_ACCESS_REMOTE_WRITE
        && m::READ >> RIGHT_SHIFT == IV_ACCESS_REMOTE_READ
        && m::ATOMIC >> RIGHT_SHIFT == IV_ACCESS_REMOTE_ATOMIC
        // No other mask bit lands on a right.
        && (m::SEND | m::RWR | m::COMP | m::START | m::MIDDLE | m::END | m::REQ | m::RESP
            | m::PAYLOAD | m::DETH | m::IETH | m::IMMDT | m::ATMACK | m::ATMETH | m::AETH | m::RETH)
            >> RIGHT_SHIFT
            & (IV_ACCESS_REMOTE_WRITE | IV_ACCESS_REMOTE_READ | IV_ACCESS_REMOTE_ATOMIC)
            == 0
);

/// Whether QP `qp` takes requests of header mask `k` at all: its own
/// access flags grant the remote right a WRITE, READ or atomic needs
/// (else remote access error), and a READ or atomic has responder
/// resources (`max_dest_rd_atomic`; else invalid request).
#[inline(always)]
pub(crate) fn permitted(qp: &Qp, k: u32) -> Result<(), Fail> {
    // The operation bits line up with the rights they need, one shift
    // apart (checked at compile time above).
    let need = (k >> RIGHT_SHIFT)
        & (IV_ACCESS_REMOTE_WRITE | IV_ACCESS_REMOTE_READ | IV_ACCESS_REMOTE_ATOMIC);
    if qp.attr.qp_access_flags & need != need {
        return Err(Fail::Access);
    }
    if k & (m::READ | m::ATOMIC) != 0 && qp.attr.max_dest_rd_atomic == 0 {
        return Err(INVALID);
    }
    Ok(())
}

/// Executes a request (or burst) with the expected PSN (RC and UC).
fn execute(
    qpn: u32,
    qp: &mut Qp,
    env: &mut Env<'_>,
    pkt: &Packet,
    burst: Burst,
    payload: Payload<'_>,
) -> Result<(), Fail> {
    let k = pkt.mask() | crate::wire::packet::mask(burst.last_opcode);
    let rc = qp.qp_type == IV_QPT_RC;
    let resp = &qp.tx.resp;
    let cont = k & (m::MIDDLE | m::END) != 0 && k & m::START == 0;
    let in_sequence = match resp.in_msg {
        m::SEND => cont && k & m::SEND != 0,
        m::WRITE => cont && k & m::WRITE != 0,
        _ => !cont,
    };
    if !in_sequence {
        return Err(INVALID);
    }
    permitted(qp, k)?;
    if !length_ok(k, pkt, burst, &payload, qp.tx.mtu) {
        return Err(INVALID);
    }
    if k & m::RWR != 0 && !take_recv(qpn, qp, env)? {
        return Err(Fail::Rnr);
    }
    if k & m::SEND != 0 {
        send(qpn, qp, env, pkt, k, payload)?;
    } else if k & m::WRITE != 0 {
        write(qpn, qp, env, pkt, k, payload)?;
    } else if k & m::READ != 0 {
        read(qpn, qp, env, pkt)?;
        return Ok(());
    } else {
        atomic(qpn, qp, env, pkt)?;
        return Ok(());
    }
    let last = burst.last_psn(pkt.psn);
    accepted(&mut qp.tx.resp, last, k);
    if rc && pkt.ack_req {
        queue_ack(qpn, qp, env, last);
    }
    Ok(())
}

fn dma_fail(e: DmaError) -> Fail {
    match e {
        DmaError::Len => Fail::Invalid(IV_WC_LOC_LEN_ERR),
        // (A copy never grows a segment list: no `NoMemory` here.)
        DmaError::Prot | DmaError::NoMemory => Fail::Local(IV_WC_LOC_PROT_ERR),
    }
}

// Out of line, as `write`: `execute`'s frame is on the deepest chain (a
// READ's responses), docs/stack-budget.md.
#[inline(never)]
fn send(
    qpn: u32,
    qp: &mut Qp,
    env: &mut Env<'_>,
    pkt: &Packet,
    k: u32,
    payload: Payload<'_>,
) -> Result<(), Fail> {
    let pdn = qp.pdn;
    let recv = qp.tx.resp.recv_mut().ok_or(INVALID)?;
    let len = pkt.payload_len;
    scatter(
        env.mrs,
        pdn,
        &recv.sges[..recv.nsge],
        u64::from(recv.offset),
        u64::from(len),
        &mut payload.source(env.mrs),
    )
    .map_err(dma_fail)?;
    recv.offset += len;
    if k & m::END == 0 {
        return Ok(());
    }
    let imm_or_inv = if k & m::IETH != 0 {
        // A bound type 2 window or a valid fast-register MR of the QP's
        // PD; a registered MR's key is refused (docs/memory-windows.md,
        // docs/fast-registration.md).
        crate::firmware::mr::invalidate(env.mrs, env.mws, pdn, pkt.ieth).map_err(|()| INVALID)?;
        pkt.ieth
    } else {
        pkt.imm
    };
    let src_qp = qp.tx.path.dest_qpn;
    if complete_recv(qp, env, pkt.solicited, |wr_id, placed| {
        recv_cqe(qpn, src_qp, wr_id, k, placed, imm_or_inv)
    }) {
        Ok(())
    } else {
        Err(Fail::CqOverrun)
    }
}

#[inline(never)]
fn write(
    qpn: u32,
    qp: &mut Qp,
    env: &mut Env<'_>,
    pkt: &Packet,
    k: u32,
    payload: Payload<'_>,
) -> Result<(), Fail> {
    if k & m::RETH != 0 {
        let r = pkt.reth;
        if r.len != 0 {
            remote_mr(
                env.mrs,
                env.mws,
                qpn,
                qp,
                r.rkey,
                IV_ACCESS_REMOTE_WRITE,
                r.va,
                u64::from(r.len),
            )?;
        }
        qp.tx.resp.write = WriteState {
            rkey: r.rkey,
            va: r.va,
            resid: r.len,
            length: r.len,
        };
    }
    let w = qp.tx.resp.write;
    let len = pkt.payload_len;
    if len > w.resid || (k & m::END != 0 && len != w.resid) {
        return Err(INVALID);
    }
    if len > 0 {
        let mr = remote_mr(
            env.mrs,
            env.mws,
            qpn,
            qp,
            w.rkey,
            IV_ACCESS_REMOTE_WRITE,
            w.va,
            u64::from(len),
        )?;
        write_mr(&mut payload.source(env.mrs), mr, w.va, u64::from(len))
            .map_err(|_| Fail::Access)?;
    }
    let w = &mut qp.tx.resp.write;
    w.va = w.va.wrapping_add(u64::from(len));
    w.resid -= len;
    if k & m::COMP != 0 {
        let (src_qp, length) = (qp.tx.path.dest_qpn, w.length);
        let cqe = |wr_id, _| recv_cqe(qpn, src_qp, wr_id, k, length, pkt.imm);
        if !complete_recv(qp, env, pkt.solicited, cqe) {
            return Err(Fail::CqOverrun);
        }
    }
    Ok(())
}

/// Takes the next responder resource.
/// Keeps `r` (a READ or atomic executed) among the responder's resources,
/// for a duplicate of its request.
pub(crate) fn new_resource(qp: &mut Qp, r: Resource) {
    let resp = &mut qp.tx.resp;
    resp.res[resp.res_next] = r;
    resp.res_next = (resp.res_next + 1) % resp.res.len();
}

fn read(qpn: u32, qp: &mut Qp, env: &mut Env<'_>, pkt: &Packet) -> Result<(), Fail> {
    let r = pkt.reth;
    if r.len != 0 {
        remote_mr(
            env.mrs,
            env.mws,
            qpn,
            qp,
            r.rkey,
            IV_ACCESS_REMOTE_READ,
            r.va,
            u64::from(r.len),
        )?;
    }
    let npkts = crate::transport::requester::packets(r.len, qp.tx.mtu);
    let last = psn_add(pkt.psn, npkts - 1);
    new_resource(qp, Resource::read(pkt.psn, last, r.va, r.rkey, r.len));
    send_pending_ack(qp, env);
    accepted(&mut qp.tx.resp, last, m::END);
    read_responses(qpn, qp, env, pkt.psn, r.va, r.rkey, r.len);
    Ok(())
}

/// Sends the responses of a READ of `len` bytes at `va`, from `psn`.
fn read_responses(qpn: u32, qp: &Qp, env: &mut Env<'_>, psn: u32, va: u64, rkey: u32, len: u32) {
    let mtu = qp.tx.mtu;
    let npkts = crate::transport::requester::packets(len, mtu);
    let msn = qp.tx.resp.msn;
    let (mrs, mws) = (&*env.mrs, &*env.mws);
    let mr = (len != 0)
        .then(|| {
            remote_mr(
                mrs,
                mws,
                qpn,
                qp,
                rkey,
                IV_ACCESS_REMOTE_READ,
                va,
                u64::from(len),
            )
            .ok()
        })
        .flatten();
    if len != 0 && mr.is_none() {
        return;
    }
    let (first, last) = if npkts == 1 {
        (op::RC_READ_RESPONSE_ONLY, op::RC_READ_RESPONSE_ONLY)
    } else {
        (op::RC_READ_RESPONSE_FIRST, op::RC_READ_RESPONSE_LAST)
    };
    let mut pkt = qp.tx.path.packet(first, psn);
    pkt.aeth = Aeth {
        syndrome: aeth::ACK | aeth::ACK_UNLIMITED,
        msn,
    };
    pkt.payload_len = len;
    let burst = Burst {
        count: npkts,
        last_opcode: last,
    };
    // Not sent when its segments find no memory: lost, as on the wire (the
    // requester asks again).
    let _ = env.dp.emit(pkt, burst, None, |segs| match mr {
        Some(mr) => mr_segs(mr, va, u64::from(len), segs),
        None => Ok(()),
    });
}

fn atomic(qpn: u32, qp: &mut Qp, env: &mut Env<'_>, pkt: &Packet) -> Result<(), Fail> {
    let a = pkt.atomic;
    if !atomic_aligned(a.va) {
        return Err(INVALID);
    }
    let (mrs, mws) = (&*env.mrs, &*env.mws);
    let mr = remote_mr(mrs, mws, qpn, qp, a.rkey, IV_ACCESS_REMOTE_ATOMIC, a.va, 8)?;
    // Eight aligned bytes lie in one page: one piece.
    let off = match mr.piece(a.va, 8) {
        Some((off, 8)) => off,
        _ => return Err(Fail::Access),
    };
    let word = mr.region().atomic_u64(off).map_err(|_| INVALID)?;
    let orig = execute_atomic(word, pkt.opcode == op::RC_COMPARE_SWAP, &a);
    new_resource(qp, Resource::atomic(pkt.psn, orig));
    send_pending_ack(qp, env);
    accepted(&mut qp.tx.resp, pkt.psn, m::END);
    atomic_ack(qp, env, pkt.psn, orig);
    Ok(())
}

/// An atomic's target address is 8-byte aligned (else invalid request).
#[inline(always)]
pub(crate) const fn atomic_aligned(va: u64) -> bool {
    va % 8 == 0
}

/// Executes an atomic on its (checked, aligned) word: compare and swap
/// (`cas`: `a.swap_add` where the word is `a.compare`) or fetch and add
/// (`a.swap_add`). Returns the word's original value.
#[inline(always)]
pub(crate) fn execute_atomic(word: &AtomicU64, cas: bool, a: &AtomicEth) -> u64 {
    if cas {
        match word.compare_exchange(a.compare, a.swap_add, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(v) | Err(v) => v,
        }
    } else {
        word.fetch_add(a.swap_add, Ordering::SeqCst)
    }
}

impl Resource {
    /// A READ of `len` bytes at `va` (`rkey`), PSNs `first_psn` to
    /// `last_psn` (of its responses).
    #[inline(always)]
    pub(crate) fn read(first_psn: u32, last_psn: u32, va: u64, rkey: u32, len: u32) -> Self {
        Self {
            kind: m::READ,
            first_psn,
            last_psn,
            va,
            rkey,
            len,
            orig: 0,
        }
    }

    /// An atomic at PSN `psn` that found `orig`.
    #[inline(always)]
    pub(crate) fn atomic(psn: u32, orig: u64) -> Self {
        Self {
            kind: m::ATOMIC,
            first_psn: psn,
            last_psn: psn,
            orig,
            ..Self::default()
        }
    }
}

fn atomic_ack(qp: &Qp, env: &mut Env<'_>, psn: u32, orig: u64) {
    let mut ack = qp.tx.path.packet(op::RC_ATOMIC_ACKNOWLEDGE, psn);
    ack.aeth = Aeth {
        syndrome: aeth::ACK | aeth::ACK_UNLIMITED,
        msn: qp.tx.resp.msn,
    };
    ack.atomic_orig = orig;
    env.dp.emit_bare(ack);
}

/// A request with a PSN already executed (RC).
#[cold]
#[inline(never)]
fn duplicate(qpn: u32, qp: &mut Qp, env: &mut Env<'_>, pkt: &Packet) {
    let k = pkt.mask();
    send_pending_ack(qp, env);
    let resp = &qp.tx.resp;
    if k & (m::SEND | m::WRITE) != 0 {
        let psn = psn_add(resp.epsn, 0xFF_FFFF);
        send_ack(qp, env, aeth::ACK | aeth::ACK_UNLIMITED, psn, resp.msn);
        return;
    }
    let found = resp.res.iter().copied().find(|r| {
        r.kind != 0
            && r.kind & k != 0
            && psn_diff(pkt.psn, r.first_psn) >= 0
            && psn_diff(pkt.psn, r.last_psn) <= 0
    });
    let Some(r) = found else {
        env.dp.stats.packets_dropped += 1;
        return;
    };
    if k & m::READ != 0 {
        let (va, len) = (pkt.reth.va, pkt.reth.len);
        let inside = va >= r.va
            && va
                .checked_add(u64::from(len))
                .is_some_and(|end| end <= r.va + u64::from(r.len));
        if pkt.reth.rkey != r.rkey || !inside {
            env.dp.stats.packets_dropped += 1;
            return;
        }
        read_responses(qpn, qp, env, pkt.psn, va, r.rkey, len);
    } else if pkt.psn == r.first_psn {
        atomic_ack(qp, env, pkt.psn, r.orig);
    }
}

// Out of line, as `ud`: `handle`'s frame is on the RC chains
// (docs/stack-budget.md).
#[inline(never)]
fn uc(qpn: u32, qp: &mut Qp, env: &mut Env<'_>, pkt: &Packet, burst: Burst, payload: Payload<'_>) {
    let k = pkt.mask() | crate::wire::packet::mask(burst.last_opcode);
    let resp = &mut qp.tx.resp;
    let start = k & m::START != 0;
    if psn_diff(pkt.psn, resp.epsn) < 0 {
        // Before the expected PSN: a duplicate or a late packet (the wire
        // reordered it), of a message delivered or given up: dropped with
        // no effect on the message in progress.
        env.dp.stats.packets_dropped += u64::from(burst.count);
        return;
    }
    if resp.drop_msg || pkt.psn != resp.epsn || (start && resp.in_msg != 0) {
        if start {
            // A new message: whatever was in progress is lost; its receive
            // WQE is kept for this one.
            resp.drop_msg = false;
            resp.in_msg = 0;
            if let Some(r) = resp.recv_mut() {
                r.offset = 0;
            }
        } else {
            resp.drop_msg = k & m::END == 0;
            resp.epsn = psn_add(burst.last_psn(pkt.psn), 1);
            env.dp.stats.packets_dropped += u64::from(burst.count);
            return;
        }
    }
    match execute(qpn, qp, env, pkt, burst, payload) {
        Ok(()) => {}
        Err(Fail::Local(status)) => {
            fail_recv(qpn, qp, env, status);
            enter_error(qpn, qp, env, Some(AsyncEvent::QpFatal(qpn)));
        }
        Err(Fail::CqOverrun) => {}
        Err(_) => {
            // Class D: the message is dropped, the receive WQE reused.
            env.dp.stats.packets_dropped += u64::from(burst.count);
            let resp = &mut qp.tx.resp;
            resp.drop_msg = k & m::END == 0;
            resp.in_msg = 0;
            resp.epsn = psn_add(burst.last_psn(pkt.psn), 1);
            if let Some(r) = resp.recv_mut() {
                r.offset = 0;
            }
        }
    }
}

/// The 40 bytes a UD receive buffer gets before the payload: the IPv6
/// header, or for IPv4-mapped GIDs 20 zero bytes and the IPv4 header (the
/// RoCEv2 convention, as Linux rxe writes it).
pub(crate) fn grh(pkt: &Packet) -> [u8; 40] {
    let mut g = [0u8; 40];
    let k = pkt.mask();
    let mut transport = BTH_LEN + DETH_LEN + pkt.payload_len as usize + pkt.pad() as usize + 4;
    if k & m::IMMDT != 0 {
        transport += IMMDT_LEN;
    }
    let udp = transport + 8;
    let mapped = |gid: &[u8; 16]| gid[..10] == [0; 10] && gid[10..12] == [0xFF, 0xFF];
    if mapped(&pkt.sgid) && mapped(&pkt.dgid) {
        let total = u16::try_from(udp + 20).unwrap_or(u16::MAX);
        let h = &mut g[20..];
        h[0] = 0x45;
        h[1] = pkt.traffic_class;
        h[2..4].copy_from_slice(&total.to_be_bytes());
        h[6] = 0x40; // don't fragment
        h[8] = pkt.hop_limit;
        h[9] = 17; // UDP
        h[12..16].copy_from_slice(&pkt.sgid[12..]);
        h[16..20].copy_from_slice(&pkt.dgid[12..]);
        let mut sum = 0u32;
        for w in h.chunks(2) {
            sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
        }
        while sum > 0xFFFF {
            sum = (sum & 0xFFFF) + (sum >> 16);
        }
        #[allow(clippy::cast_possible_truncation)]
        let csum = !(sum as u16);
        h[10..12].copy_from_slice(&csum.to_be_bytes());
    } else {
        let flow = pkt.flow_label & 0xF_FFFF;
        let word = (6u32 << 28) | (u32::from(pkt.traffic_class) << 20) | flow;
        g[0..4].copy_from_slice(&word.to_be_bytes());
        let len = u16::try_from(udp).unwrap_or(u16::MAX);
        g[4..6].copy_from_slice(&len.to_be_bytes());
        g[6] = 17; // UDP
        g[7] = pkt.hop_limit;
        g[8..24].copy_from_slice(&pkt.sgid);
        g[24..40].copy_from_slice(&pkt.dgid);
    }
    g
}

#[inline(never)]
fn ud(qpn: u32, qp: &mut Qp, env: &mut Env<'_>, pkt: &Packet, payload: Payload<'_>) {
    let carried = payload.len();
    if pkt.deth.qkey != qp.attr.qkey
        || pkt.payload_len > qp.tx.mtu
        || carried != pkt.payload_len as usize
    {
        env.dp.stats.packets_dropped += 1;
        return;
    }
    match take_recv(qpn, qp, env) {
        Ok(true) => {}
        Ok(false) => {
            env.dp.stats.packets_dropped += 1;
            return;
        }
        Err(Fail::Local(status)) => {
            fail_recv(qpn, qp, env, status);
            enter_error(qpn, qp, env, Some(AsyncEvent::QpFatal(qpn)));
            return;
        }
        Err(_) => return,
    }
    let header = grh(pkt);
    let pdn = qp.pdn;
    let Some(recv) = qp.tx.resp.recv_mut() else {
        return;
    };
    let sges = &recv.sges[..recv.nsge];
    let placed = scatter(
        env.mrs,
        pdn,
        sges,
        0,
        u64::from(IV_GRH_LEN),
        &mut Source::bytes(&header),
    )
    .and_then(|()| {
        scatter(
            env.mrs,
            pdn,
            sges,
            u64::from(IV_GRH_LEN),
            u64::from(pkt.payload_len),
            &mut payload.source(env.mrs),
        )
    });
    if let Err(e) = placed {
        let (status, event) = match e {
            DmaError::Len => (IV_WC_LOC_LEN_ERR, None),
            DmaError::Prot | DmaError::NoMemory => {
                (IV_WC_LOC_PROT_ERR, Some(AsyncEvent::QpFatal(qpn)))
            }
        };
        fail_recv(qpn, qp, env, status);
        enter_error(qpn, qp, env, event);
        return;
    }
    let (src_qp, len, k) = (pkt.deth.src_qpn, IV_GRH_LEN + pkt.payload_len, pkt.mask());
    complete_recv(qp, env, pkt.solicited, |wr_id, _| {
        let mut cqe = recv_cqe(qpn, src_qp, wr_id, k, len, pkt.imm);
        cqe.wc_flags |= IV_WC_GRH;
        cqe
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grh_ipv4_header_checksums() {
        let mut pkt = Packet {
            opcode: op::UD_SEND_ONLY,
            payload_len: 8,
            hop_limit: 64,
            ..Packet::default()
        };
        pkt.sgid[10..].copy_from_slice(&[0xFF, 0xFF, 10, 0, 0, 1]);
        pkt.dgid[10..].copy_from_slice(&[0xFF, 0xFF, 10, 0, 0, 2]);
        let g = grh(&pkt);
        assert_eq!(&g[..20], &[0; 20]);
        let h = &g[20..];
        assert_eq!(h[0], 0x45);
        assert_eq!(u16::from_be_bytes([h[2], h[3]]), 20 + 8 + 12 + 8 + 8 + 4);
        assert_eq!((h[8], h[9]), (64, 17));
        assert_eq!(&h[12..20], &[10, 0, 0, 1, 10, 0, 0, 2]);
        let mut sum = 0u32;
        for w in h.chunks(2) {
            sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
        }
        while sum > 0xFFFF {
            sum = (sum & 0xFFFF) + (sum >> 16);
        }
        assert_eq!(sum, 0xFFFF, "a valid IPv4 header checksum");

        pkt.sgid = [0xFD; 16];
        let g = grh(&pkt);
        assert_eq!(g[0] >> 4, 6);
        assert_eq!(&g[8..24], &[0xFD; 16]);
        assert_eq!(&g[24..40], &pkt.dgid);
    }
}
