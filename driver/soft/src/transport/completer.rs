//! The completer: matches responses to the WQEs in flight and retires
//! WQEs in order, writing their completions.
//!
//! RC: an ACK with PSN `p` completes every SEND and WRITE whose last packet
//! is at or before `p` (ACKs may be coalesced). A READ completes with its
//! last response, an atomic with its atomic ACK; a READ response or atomic
//! ACK also acknowledges every earlier request. An ACK covering a READ or
//! atomic whose responses never came is an implicit NAK: the requester
//! retries from the first missing PSN. NAKs:
//! - PSN sequence error: go back to the NAKed PSN and send again (a retry:
//!   `retry_cnt` of them, then `RETRY_EXC_ERR`);
//! - RNR: `rnr_retry` 0 fails the WQE with `RNR_RETRY_EXC_ERR` at once;
//!   otherwise the requester goes back to the NAKed PSN and waits for the
//!   RNR timer — in-process, the responder's [`Frame::RetryHint`] when a
//!   receive is posted (`rnr_retry` 7: no limit);
//! - invalid request, remote access, remote operational error: the WQE
//!   completes with `REM_INV_REQ_ERR`, `REM_ACCESS_ERR`, `REM_OP_ERR` and
//!   the QP goes to ERR (the rest is flushed).
//!
//! Only what answers a request outstanding acts (see [`crate::transport::trust`]): a
//! response whose PSN is past every request sent, that does not fit the
//! WQE it answers (a READ response to a SEND, an atomic ACK to a READ, the
//! wrong response opcode in sequence, a wrong length), an ACK with the
//! reserved AETH type, a NAK with a code IBTA does not define, or a NAK
//! whose PSN is no request's in flight, is dropped and counted
//! ([`crate::TrustStats`]): it neither completes nor fails a WQE (a peer
//! that answers so is one that stops answering: the local ACK timer
//! retries, then `RETRY_EXC_ERR`). Stale responses (duplicates, PSNs
//! before the oldest WQE in flight, answers to requests sent before a
//! rewind) are dropped.
//!
//! UC and UD have no responses: a WQE completes when the fabric reports
//! its last packet consumed ([`Frame::Sent`]).
//!
//! Completions are written in WQE order: signaled WQEs (all with
//! `sq_sig_all`) and every error; unsignaled WQEs retire silently.
//!
//! [`Frame::RetryHint`]: crate::wire::packet::Frame::RetryHint
//! [`Frame::Sent`]: crate::wire::packet::Frame::Sent

use core::sync::atomic::Ordering;

use irpverbs_abi::{
    IV_QPT_RC, IV_SEND_SIGNALED, IV_WC_LOC_LEN_ERR, IV_WC_LOC_PROT_ERR, IV_WC_REM_ACCESS_ERR,
    IV_WC_REM_INV_REQ_ERR, IV_WC_REM_OP_ERR, IV_WC_RETRY_EXC_ERR, IV_WC_RNR_RETRY_EXC_ERR,
    IV_WC_SUCCESS, IV_WR_ATOMIC_CMP_AND_SWP, IV_WR_ATOMIC_FETCH_AND_ADD, IV_WR_RDMA_READ,
};
use irpverbs_core::AsyncEvent;

use crate::firmware::cq::post_cqe;
use crate::firmware::qp::{Qp, QpState};
use crate::firmware::qp_state::Progress;
use crate::transport::dma::{DmaError, Payload, Source, scatter};
use crate::transport::engine::{Env, enter_error, send_cqe};
use crate::transport::requester::is_rd_atomic;
use crate::wire::packet::{Burst, Packet, aeth, op, psn_add, psn_diff};

/// A response packet (or burst of READ responses) for QP `qpn`'s
/// requester.
pub(crate) fn handle(
    qpn: u32,
    qp: &mut Qp,
    env: &mut Env<'_>,
    pkt: &Packet,
    burst: Burst,
    payload: Payload<'_>,
) {
    let rc = pkt.opcode & op::TRANSPORT_MASK == op::RC;
    if qp.qp_type != IV_QPT_RC || !rc || !matches!(qp.state, QpState::Rts | QpState::Sqd) {
        env.dp.stats.packets_dropped += 1;
        return;
    }
    // A response answers a request sent: its PSNs (a burst's last too)
    // before the next PSN the requester will send, or before the last it
    // had sent when it went back (the responder may have had those).
    let frontier = sent_frontier(qp);
    if psn_diff(frontier, qp.tx.req.sent_end) > 0 {
        // Kept within the window, so that it never reads as ahead of the
        // frontier once PSNs wrap.
        qp.tx.req.sent_end = frontier;
    }
    let last = burst.last_psn(pkt.psn);
    if psn_diff(last, frontier) >= 0 {
        if psn_diff(last, qp.tx.req.sent_end) >= 0 {
            untrusted(env).response_psn_ahead += u64::from(burst.count.max(1));
        } else if pkt.opcode == op::RC_ACKNOWLEDGE
            && pkt.aeth.syndrome & aeth::TYPE_MASK == aeth::ACK
        {
            acked_past_rewind(qpn, qp, env, pkt.psn);
        } else {
            // A NAK or a response to a request sent before the rewind: the
            // request is sent again and answered again.
            env.dp.stats.packets_dropped += u64::from(burst.count.max(1));
        }
        return;
    }
    // What the response acknowledges: an ACK (or an atomic's) its PSN, a
    // NAK the PSNs before it, READ responses theirs.
    let through = match pkt.opcode {
        op::RC_ACKNOWLEDGE if pkt.aeth.syndrome & aeth::TYPE_MASK != aeth::ACK => pkt.psn,
        op::RC_ACKNOWLEDGE | op::RC_ATOMIC_ACKNOWLEDGE => psn_add(pkt.psn, 1),
        _ => psn_add(pkt.psn, burst.count.max(1)),
    };
    match pkt.opcode {
        op::RC_ACKNOWLEDGE => ack(qpn, qp, env, pkt.psn, pkt.aeth.syndrome),
        op::RC_ATOMIC_ACKNOWLEDGE => atomic_ack(qpn, qp, env, pkt),
        _ => read_response(qpn, qp, env, pkt, burst, payload),
    }
    if qp.state != QpState::Err {
        window_acknowledged(qpn, qp, env, through);
        retire(qpn, qp, env);
    }
}

/// An ACK for `psn` from a responder QP of this HCA, handed over without a
/// packet (the engine does so only when nothing else is on its way to this
/// requester: responses stay in order).
pub(crate) fn acked(qpn: u32, qp: &mut Qp, env: &mut Env<'_>, psn: u32) {
    if qp.qp_type != IV_QPT_RC || !matches!(qp.state, QpState::Rts | QpState::Sqd) {
        return;
    }
    // What `ack` and then `retire` do, in one pass over the send queue:
    // the SEND and WRITE WQEs the ACK covers retire as they are reached.
    let start = qp.tx.req.ci;
    let (nak, ok) = retire_head(qpn, qp, env, Some(psn));
    if let Some((i, missing)) = nak {
        retry_by(qpn, qp, env, i, missing, 1);
    }
    if qp.state != QpState::Err {
        if ok {
            restore_retries(qp);
        }
        window_acknowledged(qpn, qp, env, psn_add(psn, 1));
        retired(qpn, qp, env, start);
    }
}

/// The PSNs before `through` are acknowledged: the congestion window
/// slides (and grows); a requester waiting at it runs again.
fn window_acknowledged(qpn: u32, qp: &mut Qp, env: &mut Env<'_>, through: u32) {
    if qp.tx.req.window.acknowledge(through) {
        env.dp.schedule(qpn, &mut qp.tx);
    }
}

/// The PSN the requester sends next: responses must be for PSNs before it
/// (the current WQE's next packet, else the one after the last WQE
/// started).
fn sent_frontier(qp: &Qp) -> u32 {
    let req = &qp.tx.req;
    req.cur.map_or(req.psn, |c| c.psn)
}

/// The counters of what the transport does not believe; one more packet
/// dropped.
fn untrusted<'e>(env: &'e mut Env<'_>) -> &'e mut crate::firmware::datapath::TrustStats {
    env.dp.stats.packets_dropped += 1;
    &mut env.dp.stats.trust
}

/// The first WQE in flight not done yet.
fn head(qp: &Qp) -> Option<u32> {
    let req = &qp.tx.req;
    let mut i = req.ci;
    while i != req.next {
        if !req.slot(i).done {
            return Some(i);
        }
        i = i.wrapping_add(1);
    }
    None
}

/// The WQE in flight whose PSNs include `psn`.
fn containing(qp: &Qp, psn: u32) -> Option<u32> {
    let req = &qp.tx.req;
    let mut i = req.ci;
    while i != req.next {
        let s = req.slot(i);
        if !s.done && psn_diff(psn, s.first_psn) >= 0 && psn_diff(psn, s.last_psn) <= 0 {
            return Some(i);
        }
        i = i.wrapping_add(1);
    }
    None
}

/// WQE `i` is being sent again after a rewind (it is the requester's
/// current WQE): a response past its PSNs answers a request sent before
/// the rewind, which is sent again and answered again.
fn resending(qp: &Qp, i: u32) -> bool {
    qp.tx.req.cur.is_some_and(|c| c.index == i)
}

/// Marks done every SEND and WRITE whose PSNs are all at or before `psn`.
/// A READ or atomic there without its response is an implicit NAK: returns
/// it and the first PSN missing.
fn ack_upto(qp: &mut Qp, psn: u32) -> Option<(u32, u32)> {
    let req = &mut qp.tx.req;
    let cur = req.cur.map(|c| c.index);
    let mask = req.slots.len().max(1) - 1;
    let mut i = req.ci;
    while i != req.next {
        let s = &mut req.slots[i as usize & mask];
        if !s.done {
            if psn_diff(s.last_psn, psn) > 0 || cur == Some(i) {
                return None;
            }
            if is_rd_atomic(s.wqe.opcode) {
                return Some((i, s.resp_next));
            }
            s.done = true;
            s.status = IV_WC_SUCCESS;
        }
        i = i.wrapping_add(1);
    }
    None
}

fn ack(qpn: u32, qp: &mut Qp, env: &mut Env<'_>, psn: u32, syndrome: u8) {
    match syndrome & aeth::TYPE_MASK {
        aeth::ACK => {
            if let Some((i, missing)) = ack_upto(qp, psn) {
                retry_by(qpn, qp, env, i, missing, 1);
            }
        }
        aeth::RNR_NAK => {
            if let Some((i, missing)) = ack_upto(qp, psn_add(psn, 0xFF_FFFF)) {
                retry_by(qpn, qp, env, i, missing, 1);
                return;
            }
            let Some(i) = containing(qp, psn) else {
                untrusted(env).nak_psn_invalid += 1;
                return;
            };
            if qp.tx.req.rnr_wait {
                return;
            }
            if qp.tx.req.rnr_left == 0 {
                retire(qpn, qp, env);
                fail(qpn, qp, env, i, IV_WC_RNR_RETRY_EXC_ERR);
                return;
            }
            rewind(qpn, qp, env, i, psn);
            qp.tx.req.rnr_wait = true;
            crate::transport::engine::arm_rnr(qpn, qp, env, syndrome & !aeth::TYPE_MASK);
        }
        aeth::NAK => {
            let code = syndrome & !aeth::TYPE_MASK;
            if !matches!(
                code,
                aeth::NAK_PSN_SEQ_ERR
                    | aeth::NAK_INVALID_REQ
                    | aeth::NAK_INVALID_RD_REQ
                    | aeth::NAK_REM_ACCESS
                    | aeth::NAK_REM_OP
            ) {
                untrusted(env).unknown_syndrome += 1;
                return;
            }
            if let Some((i, missing)) = ack_upto(qp, psn_add(psn, 0xFF_FFFF)) {
                retry_by(qpn, qp, env, i, missing, 1);
                return;
            }
            let Some(i) = containing(qp, psn) else {
                untrusted(env).nak_psn_invalid += 1;
                return;
            };
            let status = match code {
                aeth::NAK_PSN_SEQ_ERR => {
                    let req = &qp.tx.req;
                    if !req.rnr_wait && req.rewound_to != Some(psn) {
                        retry(qpn, qp, env, i, psn);
                    }
                    return;
                }
                aeth::NAK_INVALID_REQ | aeth::NAK_INVALID_RD_REQ => IV_WC_REM_INV_REQ_ERR,
                aeth::NAK_REM_ACCESS => IV_WC_REM_ACCESS_ERR,
                _ => IV_WC_REM_OP_ERR,
            };
            retire(qpn, qp, env);
            fail(qpn, qp, env, i, status);
        }
        // The reserved AETH type: no response IBTA defines.
        _ => untrusted(env).unknown_syndrome += 1,
    }
}

fn atomic_ack(qpn: u32, qp: &mut Qp, env: &mut Env<'_>, pkt: &Packet) {
    let psn = pkt.psn;
    if let Some((i, missing)) = ack_upto(qp, psn_add(psn, 0xFF_FFFF)) {
        retry_by(qpn, qp, env, i, missing, 1);
        return;
    }
    let Some(i) = head(qp) else { return };
    let s = *qp.tx.req.slot(i);
    if psn_diff(psn, s.first_psn) < 0 {
        return; // stale
    }
    if psn_diff(psn, s.last_psn) > 0 {
        if !resending(qp, i) {
            retry_by(qpn, qp, env, i, s.resp_next, 2);
        }
        return;
    }
    if !is_atomic(s.wqe.opcode) {
        untrusted(env).response_opcode += 1;
        return;
    }
    let orig = pkt.atomic_orig.to_ne_bytes();
    let sges = qp.tx.req.sges(i);
    if let Err(e) = scatter(env.mrs, qp.pdn, sges, 0, 8, &mut Source::bytes(&orig)) {
        retire(qpn, qp, env);
        fail(qpn, qp, env, i, local_status(e));
        return;
    }
    let s = qp.tx.req.slot_mut(i);
    s.done = true;
    s.status = IV_WC_SUCCESS;
}

fn read_response(
    qpn: u32,
    qp: &mut Qp,
    env: &mut Env<'_>,
    pkt: &Packet,
    burst: Burst,
    payload: Payload<'_>,
) {
    let psn = pkt.psn;
    if let Some((i, missing)) = ack_upto(qp, psn_add(psn, 0xFF_FFFF)) {
        retry_by(qpn, qp, env, i, missing, 1);
        return;
    }
    let Some(i) = head(qp) else { return };
    let s = *qp.tx.req.slot(i);
    if psn_diff(psn, s.first_psn) < 0 || (psn_diff(psn, s.last_psn) > 0 && resending(qp, i)) {
        return; // stale
    }
    if s.wqe.opcode != IV_WR_RDMA_READ {
        untrusted(env).response_opcode += 1;
        return;
    }
    let d = psn_diff(psn, s.resp_next);
    if d < 0 {
        return; // duplicate
    }
    let end_psn = burst.last_psn(psn);
    if d > 0 || psn_diff(psn, s.last_psn) > 0 {
        retry_by(qpn, qp, env, i, s.resp_next, 2);
        return;
    }
    let last = end_psn == s.last_psn;
    let n = burst.count;
    // The opcodes of a burst at `psn`, in a response stream that starts at
    // `psn` (`first`) or continues through it.
    let expect = |first: bool| {
        let f = match (first, last && n == 1) {
            (true, true) => op::RC_READ_RESPONSE_ONLY,
            (true, false) => op::RC_READ_RESPONSE_FIRST,
            (false, false) => op::RC_READ_RESPONSE_MIDDLE,
            (false, true) => op::RC_READ_RESPONSE_LAST,
        };
        let l = match (last, first && n == 1) {
            (true, true) => op::RC_READ_RESPONSE_ONLY,
            (true, false) => op::RC_READ_RESPONSE_LAST,
            (false, _) if n == 1 => f,
            (false, _) => op::RC_READ_RESPONSE_MIDDLE,
        };
        (f, l)
    };
    // A READ sent again from `resp_next` (after a loss) is answered by a
    // new stream starting there; a late response of the first stream at
    // the same PSN carries the same bytes: either is accepted.
    let ops = (pkt.opcode, burst.last_opcode);
    let ops_ok = expect(true) == ops || (psn != s.first_psn && expect(false) == ops);
    let mtu = qp.tx.mtu;
    // Within the message: at most 2^31 bytes.
    let offset = psn_diff(psn, s.first_psn).unsigned_abs() * mtu;
    let room = s.length.saturating_sub(offset);
    let len = if last { room } else { n.saturating_mul(mtu) };
    let carried = payload.len();
    let beyond = psn_diff(end_psn, s.last_psn) > 0 || len > room;
    if !ops_ok || beyond || pkt.payload_len != len || carried != len as usize {
        untrusted(env).response_malformed += 1;
        return;
    }
    let sges = qp.tx.req.sges(i);
    if let Err(e) = scatter(
        env.mrs,
        qp.pdn,
        sges,
        u64::from(offset),
        u64::from(len),
        &mut payload.source(env.mrs),
    ) {
        retire(qpn, qp, env);
        fail(qpn, qp, env, i, local_status(e));
        return;
    }
    let s = qp.tx.req.slot_mut(i);
    s.resp_next = psn_add(end_psn, 1);
    if last {
        s.done = true;
        s.status = IV_WC_SUCCESS;
    }
    qp.tx.req.rewound_to = None;
    crate::transport::engine::rearm_rto(qpn, qp, env);
}

fn is_atomic(wr: u8) -> bool {
    matches!(wr, IV_WR_ATOMIC_CMP_AND_SWP | IV_WR_ATOMIC_FETCH_AND_ADD)
}

fn local_status(e: DmaError) -> u32 {
    match e {
        DmaError::Len => IV_WC_LOC_LEN_ERR,
        // (A copy never grows a segment list: no `NoMemory` here.)
        DmaError::Prot | DmaError::NoMemory => IV_WC_LOC_PROT_ERR,
    }
}

/// Fails WQE `i` with `status` (earlier WQEs were retired) and moves the
/// QP to ERR, flushing the rest.
fn fail(qpn: u32, qp: &mut Qp, env: &mut Env<'_>, i: u32, status: u32) {
    let s = qp.tx.req.slot_mut(i);
    s.done = true;
    s.status = status;
    qp.tx.req.cur = None;
    enter_error(qpn, qp, env, None);
}

/// A NAK for a sequence error, or a missing response: send again from
/// `psn`, unless the retries are used up.
fn retry(qpn: u32, qp: &mut Qp, env: &mut Env<'_>, i: u32, psn: u32) {
    retry_by(qpn, qp, env, i, psn, 0);
}

/// [`retry`], counting its cause: 0 a NAK (sequence error), 1 a response
/// past a READ or atomic that had none (implicit NAK), 2 a READ response
/// out of sequence, 3 the local ACK timeout.
fn retry_by(qpn: u32, qp: &mut Qp, env: &mut Env<'_>, i: u32, psn: u32, cause: usize) {
    env.dp.stats.retry_causes[cause] += 1;
    if qp.tx.req.retry_left == 0 {
        if crate::transport::apm::retries_exhausted(qpn, qp, env) {
            // Migrated: sent again on the alternate path, its retries
            // all left.
            qp.tx.req.window.shrink(cause == 3);
            rewind(qpn, qp, env, i, psn);
            return;
        }
        retire(qpn, qp, env);
        fail(qpn, qp, env, i, IV_WC_RETRY_EXC_ERR);
        return;
    }
    qp.tx.req.retry_left -= 1;
    env.dp.stats.retries += 1;
    qp.tx.req.window.shrink(cause == 3);
    rewind(qpn, qp, env, i, psn);
}

/// An ACK for `psn`, past what the requester has sent again since it went
/// back (a timeout that ACKs lost or late caused, while the responder had
/// the requests): the responder has every request through `psn`. The WQEs
/// it covers are done, and the current one goes on after `psn` rather than
/// sending again what arrived; the WQEs the requester forgot when it went
/// back start again, and their duplicates are ACKed the same way.
fn acked_past_rewind(qpn: u32, qp: &mut Qp, env: &mut Env<'_>, psn: u32) {
    if let Some((i, missing)) = ack_upto(qp, psn) {
        retry_by(qpn, qp, env, i, missing, 1);
        return;
    }
    let mtu = qp.tx.mtu;
    let req = &mut qp.tx.req;
    let Some(c) = req.cur else {
        return;
    };
    let s = req.slot_mut(c.index);
    if is_rd_atomic(s.wqe.opcode) {
        // Its responses, not an ACK, answer a READ or an atomic.
        return;
    }
    if psn_diff(psn, s.last_psn) >= 0 {
        s.done = true;
        s.status = IV_WC_SUCCESS;
        req.cur = None;
    } else {
        let next = psn_add(psn, 1);
        let sent = u32::try_from(psn_diff(next, s.first_psn).max(0)).unwrap_or(0);
        req.cur = Some(Progress {
            index: c.index,
            offset: sent.saturating_mul(mtu),
            psn: next,
        });
    }
    req.rewound_to = None;
    req.retry_left = qp.attr.retry_cnt;
    req.rnr_left = qp.attr.rnr_retry;
    window_acknowledged(qpn, qp, env, psn_add(psn, 1));
    retire(qpn, qp, env);
    crate::transport::engine::rearm_rto(qpn, qp, env);
}

/// Go back N: WQE `i` is sent again from `psn`, and every later WQE after
/// it.
fn rewind(qpn: u32, qp: &mut Qp, env: &mut Env<'_>, i: u32, psn: u32) {
    let mtu = qp.tx.mtu;
    let frontier = sent_frontier(qp);
    let req = &mut qp.tx.req;
    if psn_diff(frontier, req.sent_end) > 0 {
        req.sent_end = frontier;
    }
    req.rewound_to = Some(psn);
    let (first, last) = (req.slot(i).first_psn, req.slot(i).last_psn);
    let offset = u32::try_from(psn_diff(psn, first).max(0))
        .unwrap_or(0)
        .saturating_mul(mtu);
    let mut k = i;
    while k != req.next {
        let s = req.slot_mut(k);
        if !s.local {
            // A local operation is not executed again.
            s.done = false;
            s.status = IV_WC_SUCCESS;
        }
        k = k.wrapping_add(1);
    }
    // WQE `i` keeps its PSNs; the WQEs after it get theirs again when
    // they start again.
    req.next = i.wrapping_add(1);
    req.psn = psn_add(last, 1);
    req.cur = Some(Progress {
        index: i,
        offset,
        psn,
    });
    let mut n = 0;
    let mut k = req.ci;
    while k != req.next {
        if is_rd_atomic(req.slot(k).wqe.opcode) {
            n += 1;
        }
        k = k.wrapping_add(1);
    }
    req.rd_atomic = n;
    env.dp.schedule(qpn, &mut qp.tx);
}

/// The fabric consumed packet `psn` of UC/UD QP `qpn`: the WQE whose last
/// packet it is has left.
pub(crate) fn sent(qpn: u32, qp: &mut Qp, env: &mut Env<'_>, psn: u32) {
    if qp.qp_type == IV_QPT_RC {
        return;
    }
    let req = &mut qp.tx.req;
    let cur = req.cur;
    let mut i = req.ci;
    while i != req.next {
        let s = req.slot_mut(i);
        if !s.done && s.last_psn == psn && cur.is_none_or(|c| c.index != i) {
            s.done = true;
            s.status = IV_WC_SUCCESS;
            break;
        }
        i = i.wrapping_add(1);
    }
    retire(qpn, qp, env);
}

/// The retransmit (local ACK) timer of QP `qpn` expired: nothing answered
/// the oldest request in flight. Go back to its first unacknowledged PSN
/// (ACKs come at message boundaries: its first PSN; a READ's next
/// response), one retry used; `RETRY_EXC_ERR` when none is left.
///
/// The seam for the wire stage's timers: in-process delivery loses
/// nothing, so nothing here arms a timer.
pub(crate) fn retransmit_timeout(qpn: u32, qp: &mut Qp, env: &mut Env<'_>) {
    if !matches!(qp.state, QpState::Rts | QpState::Sqd) || qp.tx.req.rnr_wait {
        return;
    }
    let Some(i) = head(qp) else { return };
    let s = qp.tx.req.slot(i);
    let psn = if s.wqe.opcode == IV_WR_RDMA_READ {
        s.resp_next
    } else {
        s.first_psn
    };
    retry_by(qpn, qp, env, i, psn, 3);
}

/// The RNR timer of QP `qpn` expired (in-process: its responder can take
/// the message now): send again from the NAKed PSN, one RNR retry used.
pub(crate) fn rnr_timer_expired(qpn: u32, qp: &mut Qp, env: &mut Env<'_>) {
    let req = &mut qp.tx.req;
    if !req.rnr_wait {
        return;
    }
    qp.tx.rnr_at = None;
    let req = &mut qp.tx.req;
    if req.rnr_left != 7 {
        req.rnr_left = req.rnr_left.saturating_sub(1);
    }
    req.rnr_wait = false;
    env.dp.stats.rnr_retries += 1;
    env.dp.schedule(qpn, &mut qp.tx);
}

/// Retires done WQEs from the head, in order: writes the completions of
/// signaled and failed ones, publishes the consumer index. Raises
/// SqDrained when a draining SQD QP has nothing left in flight, and
/// reschedules the requester if WQEs wait.
pub(crate) fn retire(qpn: u32, qp: &mut Qp, env: &mut Env<'_>) {
    let start = qp.tx.req.ci;
    if retire_head(qpn, qp, env, None).1 {
        restore_retries(qp);
    }
    retired(qpn, qp, env, start);
}

/// Retires WQEs from the head, in order, writing the completions of
/// signaled and failed ones: the done ones and, with `acked` (an ACK for
/// that PSN), the SEND and WRITE WQEs it covers, which it completes. Stops
/// at the first WQE that is neither, at the one being sent, or at a READ
/// or atomic the ACK covers without its response: an implicit NAK,
/// returned with the first PSN missing. Also returns whether a WQE
/// succeeded. The caller publishes what retired ([`retired`]).
#[inline(always)]
fn retire_head(
    qpn: u32,
    qp: &mut Qp,
    env: &mut Env<'_>,
    acked: Option<u32>,
) -> (Option<(u32, u32)>, bool) {
    let (sig_all, send_cqn) = (qp.sq_sig_all, qp.send_cqn);
    let sq = &qp.sq.0;
    let req = &mut qp.tx.req;
    let cur = req.cur.map(|c| c.index);
    let mask = req.slots.len().max(1) - 1;
    let mut ci = req.ci;
    let mut ok = false;
    let mut nak = None;
    while ci != req.next && cur != Some(ci) {
        let s = &mut req.slots[ci as usize & mask];
        if !s.done {
            match acked {
                Some(psn) if psn_diff(s.last_psn, psn) <= 0 => {
                    if is_rd_atomic(s.wqe.opcode) {
                        nak = Some((ci, s.resp_next));
                        break;
                    }
                    s.done = true;
                    s.status = IV_WC_SUCCESS;
                }
                _ => break,
            }
        }
        if completes(s.status, sig_all, s.wqe.flags) {
            // The slots up to this WQE go back to the ULP before its
            // completion is seen: a ULP that polls the CQE on another
            // processor may post again at once into a queue it filled
            // (the completion is built from the HCA's own copy of the
            // WQE, not from the ring).
            sq.consumer().release(ci.wrapping_add(1));
            let cqe = send_cqe(qpn, &s.wqe, s.status, s.length);
            post_cqe(env.cqs, env.dp, send_cqn, &cqe, false);
        }
        ok |= s.status == IV_WC_SUCCESS;
        s.local = false;
        if is_rd_atomic(s.wqe.opcode) {
            req.rd_atomic = req.rd_atomic.saturating_sub(1);
        }
        ci = ci.wrapping_add(1);
    }
    req.ci = ci;
    (nak, ok)
}

/// A WQE succeeded: the retry counts start again.
fn restore_retries(qp: &mut Qp) {
    qp.tx.req.retry_left = qp.attr.retry_cnt;
    qp.tx.req.rnr_left = qp.attr.rnr_retry;
}

/// Whether retiring a done WQE writes its completion: when it failed, or
/// it is signaled (every WQE is, with `sq_sig_all`); an unsignaled WQE
/// retires silently.
#[inline(always)]
fn completes(status: u32, sig_all: bool, flags: u8) -> bool {
    status != IV_WC_SUCCESS || sig_all || flags & IV_SEND_SIGNALED != 0
}

/// After WQEs from `start` were retired: hands their slots back to the
/// ULP and rearms or stops the retransmission timer, ends a drain, and
/// schedules the QP if it has new WQEs. Inlined into its two callers; what
/// is rarely needed after a retire is in [`retired_rest`].
#[inline(always)]
fn retired(qpn: u32, qp: &mut Qp, env: &mut Env<'_>, start: u32) {
    let req = &mut qp.tx.req;
    if req.ci == start {
        return;
    }
    qp.sq.0.consumer().release(req.ci);
    req.rewound_to = None;
    let pi = qp.sq.0.producer_word().load(Ordering::Acquire);
    if qp.tx.rto_at.is_some()
        || qp.tx.draining
        || (qp.state == QpState::Rts && pi != qp.tx.req.next)
    {
        retired_rest(qpn, qp, env, pi);
    }
}

/// [`retired`]'s work when a timer runs, a drain is on, or new WQEs (up
/// to producer index `pi`) wait.
#[inline(never)]
fn retired_rest(qpn: u32, qp: &mut Qp, env: &mut Env<'_>, pi: u32) {
    crate::transport::engine::rearm_rto(qpn, qp, env);
    if qp.tx.draining && !qp.tx.req.in_flight() {
        qp.tx.draining = false;
        if qp.tx.drain_notify {
            env.dp.raise(AsyncEvent::SqDrained(qpn));
        }
    }
    if qp.state == QpState::Rts && pi != qp.tx.req.next {
        env.dp.schedule(qpn, &mut qp.tx);
    }
}
