//! The wire between two QPs of this HCA, short-circuited.
//!
//! An RC requester whose peer is a QP of this HCA (its path's destination
//! GID is the port's own) runs with that QP at hand (both looked up once
//! per requester run, [`crate::firmware::qp::QpTable::with_peer_mut`]).
//! Each request it emits — the packet's header fields, and its payload as
//! the sender's memory where it lies (the send queue slot's inline bytes,
//! or the gather list, checked as the packet's segments would be) — goes
//! straight to the peer's responder ([`request`]), as a looped-back frame
//! would, through the same checks ([`crate::transport::engine::deliver`]).
//! What the responder answers — a READ's responses, an atomic's ACK, a
//! NAK — is taken for the requester's completer ([`responses`]); its
//! coalesced ACK is taken once, at the end of the requester's run
//! ([`ack`]). Same PSNs, same state machines, same ACK coalescing; no
//! frame, no queue, no copy but the one into the destination.
//!
//! Packets are short-circuited only when the wire would deliver them at
//! once and in order: the link is up and no looped-back frame waits
//! ([`open`]); otherwise they take the frame path (`DataPath::loopq`), as
//! does everything with [`crate::SoftConfig::short_circuit`] off.
//!
//! The send doorbell's fast path ([`crate::transport::fast`]) runs in
//! front of the requester and takes the common WQEs (it restates the
//! three roles' walk for them, in fewer instructions than this
//! path); the requester, short-circuited, takes what it stops at: SENDs
//! with invalidate, window binds and local invalidations, WQEs that fail,
//! no receive WQE (RNR), a receive CQ without room.

use crate::firmware::datapath::DataPath;
use crate::firmware::qp::Qp;
use crate::transport::dma::Payload;
use crate::transport::engine::Env;
use crate::wire::packet::{Burst, Frame, Packet, m, mask};

/// Whether a request to a QP of this HCA goes to its responder now:
/// nothing looped back waits to be delivered before it, and the link is
/// up (a port whose link is down delivers nothing, loopback included).
#[inline(always)]
pub(crate) fn open(dp: &DataPath) -> bool {
    !dp.link_down && dp.loopq.is_empty()
}

/// Hands request `pkt` (a `burst` of packets carrying `payload`) of QP
/// `qpn` to its peer `dest`, as the frame would be received; the
/// responder's answers to `qpn` are kept for [`responses`].
#[inline(always)]
pub(crate) fn request(
    qpn: u32,
    dest: &mut Qp,
    env: &mut Env<'_>,
    pkt: &Packet,
    burst: Burst,
    payload: Payload<'_>,
) {
    let dp = &mut *env.dp;
    let n = u64::from(burst.count);
    dp.stats.packets_sent += n;
    dp.stats.packets_received += n;
    if mask(burst.last_opcode) & m::END != 0 {
        dp.stats.short_circuited += 1;
    }
    dp.capture = Some(qpn);
    crate::transport::engine::deliver(dest, env, pkt, burst, payload);
    env.dp.capture = None;
}

/// Hands what the responder answered the last [`request`] (a READ's
/// responses, an atomic's ACK, an ACK and a NAK) to the requester `qp`'s
/// completer, in order.
#[inline(always)]
pub(crate) fn responses(qp: &mut Qp, env: &mut Env<'_>) {
    if !env.dp.replies.is_empty() {
        responses_rest(qp, env);
    }
}

#[inline(never)]
fn responses_rest(qp: &mut Qp, env: &mut Env<'_>) {
    let mut b = core::mem::take(&mut env.dp.replies);
    for frame in &b.frames {
        if let Frame::Packet {
            ref pkt,
            burst,
            seg,
            nsegs,
            ..
        } = *frame
        {
            env.dp.stats.packets_received += u64::from(burst.count);
            // Responses only (the responder sends nothing else to its
            // requester): the completer's, after the checks every packet
            // meets.
            if crate::transport::engine::accepts(qp, env, pkt, burst) {
                let payload = Payload::Segs(b.payload(seg, nsegs));
                crate::transport::completer::handle(pkt.dest_qpn, qp, env, pkt, burst, payload);
            }
        }
    }
    b.clear();
    env.dp.replies = b;
}

/// The peer's coalesced ACK, if it owes one, to QP `qpn`'s completer
/// (the end of a requester run: one ACK for what the run sent).
#[inline(always)]
pub(crate) fn ack(qpn: u32, qp: &mut Qp, dest: &mut Qp, env: &mut Env<'_>) {
    if dest.tx.resp.ack.is_some() && dest.tx.path.dest_qpn == qpn && dest.tx.path.dgid == env.dp.gid
    {
        let Some(psn) = dest.tx.resp.ack.take() else {
            return;
        };
        env.dp.stats.packets_sent += 1;
        env.dp.stats.packets_received += 1;
        crate::transport::completer::acked(qpn, qp, env, psn);
    }
}
