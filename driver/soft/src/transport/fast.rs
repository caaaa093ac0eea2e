//! The send doorbell's fast path: RC SEND (with immediate data), RDMA
//! WRITE (with immediate data), RDMA READ and the
//! atomics between two QPs of this HCA (loopback), executed end to end
//! under the one `HCA_LOCK` hold of the doorbell, without building
//! packets. The receive WQE a message takes comes from the peer's receive
//! queue or its SRQ (with the SRQ's limit event).
//!
//! For each new WQE it does what the requester, the responder and the
//! completer would do with the packets of that WQE in one batch — the same
//! PSNs, MSNs, ACK requests and coalesced ACK, the same receive WQE
//! consumption and completions, the same responder resources for READs
//! and atomics, the same counters — but straight from the QPs' state: the
//! WQE is read into the requester's shadow, the payload is copied from the
//! source MR (or the slot, inline) to its destination (a READ's from the
//! peer's MR to the local gather list; an atomic works on the peer's word
//! and writes its original value locally), the receive CQE is written, and
//! at the end the coalesced ACK (or a READ's or atomic's response, which
//! acknowledges as much) goes to the completer ([`completer::acked`]),
//! which retires the WQEs and writes the send CQEs.
//!
//! The transport's rules are the requester's, the responder's and the
//! completer's, called from here, not restated: the PSNs a WQE takes and
//! whether it asks for an ACK ([`requester::issue`],
//! [`requester::wants_ack`]), an atomic's operands
//! ([`requester::atomic_eth`]); the QP's access and responder resources
//! ([`responder::permitted`]), the rkey and lkey checks
//! ([`dma::remote_range`], [`dma::local_range`]), an atomic's alignment
//! and execution, the SRQ's limit
//! ([`responder::srq_taken`]), the receive completion
//! ([`responder::recv_cqe`]), the expected PSN and MSN
//! ([`responder::accepted`]), CommEstablished
//! ([`responder::first_request`]), the responder resources
//! ([`responder::new_resource`]); copies that are not one piece go through
//! [`dma::scatter`] and [`dma::Source`]. What stays here is how the two
//! QPs are joined without packets: which WQEs qualify, the lookups cached
//! for a run, and the one copy.
//!
//! Every check the general path makes is made first, before anything
//! changes; anything unusual (a WQE that would fail or wait, no receive
//! WQE, a receive CQ without room, segmentation state in progress, another HCA, frames waiting)
//! stops the fast path there, and the requester takes the rest of the
//! send queue from the same state (short-circuited to the same peer,
//! [`crate::transport::local`]). With [`crate::SoftConfig::short_circuit`]
//! or [`crate::SoftConfig::fast_path`] off the fast path takes nothing. What changes memory windows is
//! the general path's alone: a SEND with invalidate, `IV_WR_BIND_MW`,
//! `IV_WR_LOCAL_INV` and `IV_WR_REG_MR` (which changes a fast-register
//! MR, `crate::firmware::fast_reg`) stop the fast path, and so does an rkey of a window
//! (its key cache looks keys up in the MR table only, where a window's key
//! names nothing), so that a window's rules are checked in one place
//! (`crate::firmware::mw`). `tests/fast.rs` runs the same
//! random work through both and compares the completions and the memory.
//!
//! [`completer::acked`]: crate::transport::completer::acked
//! [`responder::permitted`]: crate::transport::responder::permitted
//! [`responder::srq_taken`]: crate::transport::responder::srq_taken
//! [`responder::recv_cqe`]: crate::transport::responder::recv_cqe
//! [`responder::accepted`]: crate::transport::responder::accepted
//! [`responder::first_request`]: crate::transport::responder::first_request
//! [`responder::new_resource`]: crate::transport::responder::new_resource

use core::sync::atomic::Ordering;

use irpverbs_abi::{
    IV_ACCESS_REMOTE_ATOMIC, IV_ACCESS_REMOTE_READ, IV_ACCESS_REMOTE_WRITE, IV_QPT_RC,
    IV_SEND_INLINE, IV_SEND_SOLICITED, IV_SEND_WQE_HEADER, IV_WR_ATOMIC_CMP_AND_SWP,
    IV_WR_ATOMIC_FETCH_AND_ADD, IV_WR_RDMA_READ, IV_WR_RDMA_WRITE, IV_WR_RDMA_WRITE_WITH_IMM,
    IV_WR_SEND, IV_WR_SEND_WITH_IMM, IvSendWqe, IvSge,
};
use irpverbs_ring::Region;
use irpverbs_ring::wq::read_recv_wqe_into;

use crate::firmware::Firmware;
use crate::firmware::cq::{Cq, post_cqe, post_cqe_inline};
use crate::firmware::mr::Mr;
use crate::firmware::port::MAX_MSG_SZ;
use crate::firmware::qp::{Qp, QpState};
use crate::firmware::qp_state::Resource;
use crate::firmware::srq::Srq;
use crate::firmware::table::Table;
use crate::transport::dma::{self, Source, check_sges, for_each_piece, local_range, mr_by_key};
use crate::transport::engine::REQUESTER_BUDGET;
use crate::transport::requester::atomic_eth;
use crate::transport::requester::data_opcode;
use crate::transport::requester::{self, packets};
use crate::transport::responder::{
    accepted, atomic_aligned, execute_atomic, first_request, permitted, recv_cqe, srq_taken,
};
use crate::wire::packet::{m, mask, op};

/// How far a fast-path run went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ran {
    /// It took every new WQE: nothing is left.
    All,
    /// It sent its budget of packets ([`REQUESTER_BUDGET`]) and the next
    /// WQE may be the fast path's too: run it again (after releasing the
    /// lock, so that others get their turn).
    Budget,
    /// It stopped at a WQE the general path must take (or could take
    /// none): the general path takes the rest from the same state.
    Stopped,
}

/// Runs QP `qpn`'s new send WQEs on the fast path, as far as it can.
pub(crate) fn run(fw: &mut Firmware, qpn: u32) -> Ran {
    let dp = &fw.dp;
    if !dp.short_circuit
        || !dp.fast_path
        || dp.link_down
        || !dp.loopq.is_empty()
        || !dp.inbound.is_empty()
        || !dp.acks.is_empty()
        || !dp.cq_errors.is_empty()
    {
        return Ran::Stopped;
    }
    let gid = dp.gid;
    let (qps, env) = fw.split();
    let Some((qp, dest)) = qps.with_dest_mut(qpn) else {
        return Ran::Stopped;
    };
    let tx = &qp.tx;
    let req = &tx.req;
    if qp.qp_type != IV_QPT_RC
        || qp.state != QpState::Rts
        || tx.scheduled
        || tx.draining
        || req.cur.is_some()
        || req.rnr_wait
        || req.solicit
        || req.rd_atomic != 0
        || tx.path.dgid != gid
    {
        return Ran::Stopped;
    }
    let dest_qpn = tx.path.dest_qpn;
    let dtx = &dest.tx;
    let resp = &dtx.resp;
    if dest.qp_type != IV_QPT_RC
        || !matches!(
            dest.state,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        )
        || dtx.path.dest_qpn != qpn
        || dtx.path.dgid != gid
        || dtx.mtu != qp.tx.mtu
        || resp.in_msg != 0
        || resp.has_recv
        || resp.ack.is_some()
        || resp.rnr_wait
        || resp.epsn != qp.tx.req.psn
    {
        return Ran::Stopped;
    }
    let pi = qp.sq.0.producer_word().load(Ordering::Acquire);
    let capacity = qp.sq.0.capacity();
    let mut sent = 0usize;
    // The last PSN an ACK acknowledges (one ACK packet, coalesced), and the
    // last a READ's or atomic's response acknowledges (no ACK packet of its
    // own) after it.
    let mut ack: Option<u32> = None;
    let mut responded: Option<u32> = None;
    let mut ran = Ran::Stopped;
    let mrs: &Table<Mr> = &*env.mrs;
    let cqs = env.cqs;
    let dps = env.dp;
    // Keys resolved in this run: the MRs cannot change while it holds the
    // firmware, so a key that named a live MR still does.
    let mut local = KeyCache::new(mrs);
    let mut remote = KeyCache::new(mrs);
    // SENDs (to a receive queue) and WRITEs in the inner loop; anything
    // else (a READ, an atomic, immediate data, a SEND to an SRQ) stops it,
    // and the outer loop takes it out of line (so that the inner loop's
    // code is what it is without them: callgrind counted 40 more
    // instructions per single-post SEND with READs and atomics inside),
    // then goes on.
    'wqes: loop {
        let mut at_wqe = false;
        loop {
            let req = &qp.tx.req;
            if req.next == pi {
                ran = Ran::All;
                break;
            }
            let posted = pi.wrapping_sub(req.ci);
            if posted > capacity || req.next.wrapping_sub(req.ci) > posted {
                break;
            }
            if sent >= REQUESTER_BUDGET {
                ran = Ran::Budget;
                break;
            }
            // Whether `check` read the WQE into the shadow (for the path
            // out of line when it does not take it).
            let mut read = false;
            let Some(step) = check(qp, dest, &mut local, &mut remote, cqs, &mut read) else {
                at_wqe = read;
                break;
            };
            // Committed: nothing below fails.
            let (index, _, last, count) = issue(qp, step.length);
            // The two fields it needs, not a copy of the WQE.
            let (flags, opcode) = {
                let wqe = &qp.tx.req.slot(index).wqe;
                (wqe.flags, wqe.opcode)
            };
            let ack_req = ack_request(qp, flags, count);
            sent += count as usize;
            counted(dest, dest_qpn, count, dps);
            // The payload, from the slot (inline) or the gather list, where it
            // is not one copy.
            let inline = flags & IV_SEND_INLINE != 0;
            let len = step.length;
            if opcode == IV_WR_SEND {
                consume_rq(dest);
                let recv = &dest.tx.resp.recv;
                if let Some((dst, doff, src, soff)) = step.one_copy {
                    // One SGE each side, both checked: one copy.
                    let _ = Region::copy(dst, doff, src, soff, len as usize);
                } else if let (Some((dst, doff)), true) = (step.dst, inline) {
                    // Inline into one receive SGE: one copy from the slot.
                    let ring = &qp.sq.0;
                    let at = ring.slot_offset(index) + IV_SEND_WQE_HEADER;
                    let _ = Region::copy(dst, doff, ring.region(), at, len as usize);
                } else {
                    let mut src = payload(qp, mrs, index, inline);
                    let rsges = &recv.sges[..recv.nsge];
                    let _ = dma::scatter(mrs, dest.pdn, rsges, 0, u64::from(len), &mut src);
                }
                let k = mask(op::RC_SEND_ONLY);
                let cqe = recv_cqe(dest_qpn, qpn, recv.wr_id, k, len, 0);
                post_cqe_inline(
                    cqs,
                    dps,
                    dest.recv_cqn,
                    &cqe,
                    flags & IV_SEND_SOLICITED != 0,
                );
            } else if let Some((dst, doff, src, soff)) = step.one_copy {
                let _ = Region::copy(dst, doff, src, soff, len as usize);
            } else if let (Some((dst, doff)), true) = (step.dst, inline) {
                let ring = &qp.sq.0;
                let at = ring.slot_offset(index) + IV_SEND_WQE_HEADER;
                let _ = Region::copy(dst, doff, ring.region(), at, len as usize);
            } else if len > 0 {
                if let Some((region, base)) = step.dst {
                    let _ = payload(qp, mrs, index, inline).copy_to(region, base, len as usize);
                }
            }
            delivered(dest, last);
            if ack_req {
                ack = Some(last);
            }
        }
        if !at_wqe {
            break;
        }
        // Stopped at a WQE: one the fast path takes out of line?
        let srqs = &mut *env.srqs;
        let Some(done) = out_of_line(qp, dest, dest_qpn, &mut local, &mut remote, srqs, cqs, dps)
        else {
            break;
        };
        match done {
            Done::Message {
                count,
                last,
                ack_req,
            } => {
                sent += count as usize;
                if ack_req {
                    ack = Some(last);
                }
            }
            Done::Response { count, last } => {
                // The responder sent the ACK it owed before the response.
                if ack.take().is_some() {
                    dps.stats.packets_sent += 1;
                    dps.stats.packets_received += 1;
                }
                sent += count as usize;
                responded = Some(last);
            }
        }
        ran = Ran::Stopped;
        continue 'wqes;
    }
    // A coalesced ACK (after any response), or the last response.
    if let Some(psn) = ack.or(responded) {
        if ack.is_some() {
            dps.stats.packets_sent += 1;
            dps.stats.packets_received += 1;
        }
        let mut env = crate::transport::engine::Env {
            mrs: env.mrs,
            mws: env.mws,
            cqs,
            srqs: env.srqs,
            ahs: env.ahs,
            port: env.port,
            dp: dps,
        };
        crate::transport::completer::acked(qpn, qp, &mut env, psn);
    }
    ran
}

/// The requester's side of a checked WQE of `length` bytes at the send
/// queue's next index ([`requester::issue`]). Returns the index, the first
/// and last PSN and the packet count.
#[inline(always)]
fn issue(qp: &mut Qp, length: u32) -> (u32, u32, u32, u32) {
    let index = qp.tx.req.next;
    // An atomic's 8 bytes are one packet, as its request is.
    let count = packets(length, qp.tx.mtu);
    let (first, last) = requester::issue(&mut qp.tx.req, index, length, count);
    (index, first, last, count)
}

/// The responder's side of a message whose last PSN is `last`, executed.
#[inline(always)]
fn delivered(dest: &mut Qp, last: u32) {
    // The expected PSN arrived (a sequence error may be NAKed again).
    dest.tx.resp.nak_sent = false;
    accepted(&mut dest.tx.resp, last, m::END);
}

/// Whether the requester asks for an ACK with a message of `count`
/// packets (its WQE's `flags`), as the requester decides it
/// ([`requester::wants_ack`]), counted ([`requester::asked`]).
#[inline(always)]
fn ack_request(qp: &mut Qp, flags: u8, count: u32) -> bool {
    let ack = requester::wants_ack(qp, flags, count);
    requester::asked(&mut qp.tx.req, ack, count);
    ack
}

/// The counters of a message of `count` packets taken by the fast path,
/// and the peer's first message in RTR.
#[inline(always)]
fn counted(dest: &mut Qp, dest_qpn: u32, count: u32, dp: &mut crate::firmware::datapath::DataPath) {
    dp.stats.packets_sent += u64::from(count);
    dp.stats.packets_received += u64::from(count);
    dp.stats.fast_path_wqes += 1;
    first_request(dest_qpn, dest, dp);
}

/// What a WQE taken out of line did.
enum Done {
    /// A message (SEND, with immediate data; WRITE with
    /// immediate) of `count` packets up to `last`, with an ACK request or
    /// not.
    Message {
        count: u32,
        last: u32,
        ack_req: bool,
    },
    /// A READ or an atomic of `count` response packets up to `last`,
    /// which the response acknowledges.
    Response { count: u32, last: u32 },
}

/// The next WQE of `qp`, read into its shadow by the inner loop's [`check`]
/// which did not take it:
/// a READ or an atomic ([`check_rd_atomic`], [`commit_rd_atomic`]), or a
/// SEND with immediate data or WRITE with immediate, whose receive WQE
/// may come from an SRQ ([`check_message`], [`commit_message`]).
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn out_of_line<'m>(
    qp: &mut Qp,
    dest: &mut Qp,
    dest_qpn: u32,
    local: &mut KeyCache<'m>,
    remote: &mut KeyCache<'m>,
    srqs: &mut Table<Srq>,
    cqs: &mut Table<Cq>,
    dp: &mut crate::firmware::datapath::DataPath,
) -> Option<Done> {
    let mrs = local.mrs;
    let pdn = qp.pdn;
    let index = qp.tx.req.next;
    let opcode = qp.tx.req.slot(index).wqe.opcode;
    match opcode {
        IV_WR_SEND | IV_WR_SEND_WITH_IMM | IV_WR_RDMA_WRITE_WITH_IMM => {
            let (step, from) = check_message(qp, dest, local, remote, srqs, cqs)?;
            Some(commit_message(
                qp, dest, dest_qpn, &step, from, srqs, cqs, mrs, dp,
            ))
        }
        _ => {
            let req = &qp.tx.req;
            let step = check_rd_atomic(
                &req.slot(index).wqe,
                req.sges(index),
                pdn,
                dest,
                local,
                remote,
            )?;
            let (count, last) = commit_rd_atomic(qp, dest, dest_qpn, &step, mrs, dp);
            Some(Done::Response { count, last })
        }
    }
}

#[inline(always)]
fn commit_rd_atomic(
    qp: &mut Qp,
    dest: &mut Qp,
    dest_qpn: u32,
    step: &Step<'_>,
    mrs: &Table<Mr>,
    dp: &mut crate::firmware::datapath::DataPath,
) -> (u32, u32) {
    let (index, first, last, count) = issue(qp, step.length);
    qp.tx.req.unacked = 0;
    counted(dest, dest_qpn, count + 1, dp);
    respond(
        step,
        &qp.tx.req.slot(index).wqe,
        qp.tx.req.sges(index),
        qp.pdn,
        dest,
        mrs,
        first,
        last,
    );
    delivered(dest, last);
    // The response completed it, as the completer's READ response or
    // atomic ACK does.
    let s = qp.tx.req.slot_mut(index);
    s.done = true;
    s.status = irpverbs_abi::IV_WC_SUCCESS;
    (count, last)
}

/// A checked READ or atomic (PSNs `first` to `last`) executed: the peer's
/// memory read into the local gather list `sges` (PD `pdn`), or its word
/// updated and the original value written there; the responder keeps the
/// request among its resources, as for a duplicate of it.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn respond(
    step: &Step<'_>,
    wqe: &IvSendWqe,
    sges: &[IvSge],
    pdn: u32,
    dest: &mut Qp,
    mrs: &Table<Mr>,
    first: u32,
    last: u32,
) {
    let len = step.length;
    let resource = if wqe.opcode != IV_WR_RDMA_READ {
        let orig = step.dst.map_or(0, |(region, off)| {
            region.atomic_u64(off).map_or(0, |word| {
                let cas = wqe.opcode == IV_WR_ATOMIC_CMP_AND_SWP;
                execute_atomic(word, cas, &atomic_eth(wqe))
            })
        });
        let bytes = orig.to_ne_bytes();
        if let Some((dst, doff, _, _)) = step.one_copy {
            let _ = dst.write(doff, &bytes);
        } else {
            let _ = dma::scatter(mrs, pdn, sges, 0, 8, &mut Source::bytes(&bytes));
        }
        Resource::atomic(first, orig)
    } else {
        if let Some((dst, doff, src, soff)) = step.one_copy {
            let _ = Region::copy(dst, doff, src, soff, len as usize);
        } else if let (Some((region, base)), true) = (step.dst, len > 0) {
            let mut src = Source::Region { region, off: base };
            let _ = dma::scatter(mrs, pdn, sges, 0, u64::from(len), &mut src);
        }
        Resource::read(first, last, wqe.remote_addr, wqe.rkey, len)
    };
    crate::transport::responder::new_resource(dest, resource);
}

/// The payload of QP `qp`'s WQE at ring index `index`, where it is not
/// one copy: in its slot (`inline`), or its gather list (checked).
#[cold]
#[inline(never)]
fn payload<'a>(qp: &'a Qp, mrs: &'a Table<Mr>, index: u32, inline: bool) -> Source<'a> {
    if inline {
        let ring = &qp.sq.0;
        let off = ring.slot_offset(index) + IV_SEND_WQE_HEADER;
        Source::Region {
            region: ring.region(),
            off,
        }
    } else {
        Source::gather(mrs, qp.pdn, qp.tx.req.sges(index))
    }
}

/// What a checked WQE needs to execute.
struct Step<'m> {
    /// Message length.
    length: u32,
    /// The peer's end of the message, checked, when that is one piece: a
    /// WRITE's target, a receive's one SGE that holds it, or a READ's
    /// source.
    dst: Option<(&'m Region, usize)>,
    /// The whole message is one copy (one SGE on each side, checked):
    /// destination region and offset, source region and offset (a READ's
    /// destination is local).
    one_copy: Option<(&'m Region, usize, &'m Region, usize)>,
}

/// The last key looked up in the MR table, and the MR it named (see
/// [`mr_by_key`]).
struct KeyCache<'m> {
    mrs: &'m Table<Mr>,
    last: Option<(u32, &'m Mr)>,
}

impl<'m> KeyCache<'m> {
    fn new(mrs: &'m Table<Mr>) -> Self {
        Self { mrs, last: None }
    }

    /// [`mr_by_key`].
    fn get(&mut self, key: u32) -> Option<&'m Mr> {
        if let Some((k, mr)) = self.last
            && k == key
        {
            return Some(mr);
        }
        let mr = mr_by_key(self.mrs, key)?;
        self.last = Some((key, mr));
        Some(mr)
    }

    /// The region and offset of a local SGE, checked as
    /// [`crate::transport::dma`]'s `local_sge` checks it.
    fn local(&mut self, pdn: u32, sge: &IvSge, write: bool) -> Option<(&'m Region, usize)> {
        let mr = self.get(sge.lkey)?;
        let off = local_range(mr, pdn, sge, write)?;
        Some((&**mr.region(), off))
    }
}

/// Reads and checks the next WQE of `qp` (into its shadow) and what it
/// needs at `dest`, changing nothing else; `None` when the general path
/// must take it.
// One caller, once per WQE: inlined, the `Step` it returns stays in
// registers (callgrind: 27 fewer instructions per single-post SEND).
#[inline(always)]
fn check<'m>(
    qp: &mut Qp,
    dest: &mut Qp,
    local: &mut KeyCache<'m>,
    remote: &mut KeyCache<'m>,
    cqs: &mut Table<Cq>,
    read: &mut bool,
) -> Option<Step<'m>> {
    let pdn = qp.pdn;
    let (wqe, shadow) = read_next(qp)?;
    *read = true;
    if wqe.opcode != IV_WR_SEND && wqe.opcode != IV_WR_RDMA_WRITE {
        return None;
    }
    let (length, src) = source(wqe, shadow, pdn, local)?;
    if wqe.opcode == IV_WR_SEND {
        // A receive WQE, well formed, that takes the message; room for
        // its completion.
        read_rq(dest)?;
        let (dst, one_copy) = recv_dst(dest, length, src, remote)?;
        recv_cq_room(dest, cqs)?;
        Some(Step {
            length,
            dst,
            one_copy,
        })
    } else {
        permitted(dest, m::WRITE).ok()?;
        let dst = remote_range(remote, dest, wqe, length, IV_ACCESS_REMOTE_WRITE)?;
        Some(Step {
            length,
            dst,
            one_copy: dst.zip(src).map(|((r, o), (sr, so))| (r, o, sr, so)),
        })
    }
}

/// A SEND's or WRITE's source, checked: its length, and its one piece
/// (`None` inline, or with another number of SGEs than one).
#[inline(always)]
fn source<'m>(
    wqe: &IvSendWqe,
    sges: &[IvSge],
    pdn: u32,
    local: &mut KeyCache<'m>,
) -> Option<(u32, Option<(&'m Region, usize)>)> {
    let mut src = None;
    let length = if wqe.flags & IV_SEND_INLINE != 0 {
        u64::from(wqe.inline_len)
    } else if let [one] = sges
        && one.length != 0
    {
        // One SGE: checked here, and the source of a one-copy message.
        src = Some(local.local(pdn, one, false)?);
        u64::from(one.length)
    } else {
        check_sges(local.mrs, pdn, sges, false).ok()?
    };
    if length > u64::from(MAX_MSG_SZ) {
        return None;
    }
    Some((u32::try_from(length).ok()?, src))
}

/// Reads the receive queue's next WQE into the responder's receive WQE
/// (which holds none: the fast path runs only then), changing nothing
/// else; `None` when there is none, or it is malformed, or the RQ is an
/// SRQ.
#[inline(always)]
fn read_rq(dest: &mut Qp) -> Option<()> {
    let ring = &dest.rq.as_ref()?.0;
    let resp = &mut dest.tx.resp;
    let n = resp.rq_seen.wrapping_sub(resp.rq_ci);
    if n == 0 || n > ring.capacity() {
        resp.rq_seen = ring.producer_word().load(Ordering::Acquire);
        let n = resp.rq_seen.wrapping_sub(resp.rq_ci);
        if n == 0 || n > ring.capacity() {
            return None;
        }
    }
    let (wr_id, rn) =
        read_recv_wqe_into(ring, resp.rq_ci, dest.cap.max_recv_sge, &mut resp.recv.sges).ok()?;
    resp.recv.wr_id = wr_id;
    resp.recv.nsge = rn;
    resp.recv.offset = 0;
    Some(())
}

/// Consumes the receive WQE [`read_rq`] read.
#[inline(always)]
fn consume_rq(dest: &mut Qp) {
    let rq = &dest.rq.as_ref().map(|r| &r.0);
    let resp = &mut dest.tx.resp;
    if let Some(ring) = rq {
        resp.rq_ci = resp.rq_ci.wrapping_add(1);
        ring.consumer().release(resp.rq_ci);
        if resp.rq_seen != resp.rq_ci {
            // The next message's receive WQE, posted long ago (from the
            // ULP's processor): fetched now, it is not waited for then.
            ring.prefetch_slot(resp.rq_ci);
        }
    }
}

/// The receive WQE's scatter list checked for a message of `length` bytes
/// (whose one-piece source is `src`): the destination when the bytes land
/// in its first SGE, and the one copy when the source is one piece too.
#[inline(always)]
#[allow(clippy::type_complexity)]
fn recv_dst<'m>(
    dest: &Qp,
    length: u32,
    src: Option<(&'m Region, usize)>,
    remote: &mut KeyCache<'m>,
) -> Option<(
    Option<(&'m Region, usize)>,
    Option<(&'m Region, usize, &'m Region, usize)>,
)> {
    let recv = &dest.tx.resp.recv;
    let rsge = &recv.sges[..recv.nsge];
    if let [r] = rsge
        && length != 0
        && length <= r.length
    {
        // The bytes land in the first SGE, checked as a whole.
        let (dr, doff) = remote.local(dest.pdn, r, true)?;
        Some((Some((dr, doff)), src.map(|(sr, so)| (dr, doff, sr, so))))
    } else {
        for_each_piece(
            remote.mrs,
            dest.pdn,
            rsge,
            0,
            u64::from(length),
            true,
            |_, _, _| Ok(()),
        )
        .ok()?;
        Some((None, None))
    }
}

/// Room on the peer's receive CQ for a completion.
#[inline(always)]
fn recv_cq_room(dest: &Qp, cqs: &mut Table<Cq>) -> Option<()> {
    let cq = cqs.get_mut(dest.recv_cqn).ok()?;
    (!cq.error && cq.has_room()).then_some(())
}

/// Where a message's receive WQE comes from.
#[derive(Clone, Copy)]
enum RecvFrom {
    /// The QP's receive queue ([`read_rq`]).
    Rq,
    /// SRQ `srqn`, which held `posted` WQEs.
    Srq { srqn: u32, posted: u32 },
}

/// [`check`] for a SEND (with immediate data) or WRITE with
/// immediate (read into the shadow): its source, its receive WQE (from the
/// RQ or an SRQ, read into the responder's receive WQE), the receive
/// buffers or the WRITE's target, room on the
/// receive CQ; changes nothing else.
fn check_message<'m>(
    qp: &mut Qp,
    dest: &mut Qp,
    local: &mut KeyCache<'m>,
    remote: &mut KeyCache<'m>,
    srqs: &mut Table<Srq>,
    cqs: &mut Table<Cq>,
) -> Option<(Step<'m>, RecvFrom)> {
    let index = qp.tx.req.next;
    let wqe = qp.tx.req.slot(index).wqe;
    let (length, src) = source(&wqe, qp.tx.req.sges(index), qp.pdn, local)?;
    let from = match dest.srqn {
        None => {
            read_rq(dest)?;
            RecvFrom::Rq
        }
        Some(srqn) => {
            let srq = srqs.get_mut(srqn).ok()?;
            let ring = &srq.ring.0;
            let posted = ring
                .producer_word()
                .load(Ordering::Acquire)
                .wrapping_sub(srq.ci);
            if posted == 0 || posted > ring.capacity() || srq.error {
                return None;
            }
            let recv = &mut dest.tx.resp.recv;
            let (wr_id, n) = read_recv_wqe_into(ring, srq.ci, srq.max_sge, &mut recv.sges).ok()?;
            recv.wr_id = wr_id;
            recv.nsge = n;
            recv.offset = 0;
            RecvFrom::Srq { srqn, posted }
        }
    };
    let (dst, one_copy) = if wqe.opcode == IV_WR_RDMA_WRITE_WITH_IMM {
        permitted(dest, m::WRITE).ok()?;
        let dst = remote_range(remote, dest, &wqe, length, IV_ACCESS_REMOTE_WRITE)?;
        (dst, dst.zip(src).map(|((r, o), (sr, so))| (r, o, sr, so)))
    } else {
        recv_dst(dest, length, src, remote)?
    };
    recv_cq_room(dest, cqs)?;
    Some((
        Step {
            length,
            dst,
            one_copy,
        },
        from,
    ))
}

/// Executes a message [`check_message`] checked: the requester's side,
/// the receive WQE consumed (an SRQ's limit event), the payload placed,
/// the receive completion with its immediate data.
#[allow(clippy::too_many_arguments)]
fn commit_message(
    qp: &mut Qp,
    dest: &mut Qp,
    dest_qpn: u32,
    step: &Step<'_>,
    from: RecvFrom,
    srqs: &mut Table<Srq>,
    cqs: &mut Table<Cq>,
    mrs: &Table<Mr>,
    dp: &mut crate::firmware::datapath::DataPath,
) -> Done {
    let (index, _, last, count) = issue(qp, step.length);
    let wqe = qp.tx.req.slot(index).wqe;
    let ack_req = ack_request(qp, wqe.flags, count);
    counted(dest, dest_qpn, count, dp);
    match from {
        RecvFrom::Rq => consume_rq(dest),
        RecvFrom::Srq { srqn, posted } => {
            if let Ok(srq) = srqs.get_mut(srqn) {
                srq_taken(srq, srqn, posted, dp);
            }
        }
    }
    let len = step.length;
    let inline = wqe.flags & IV_SEND_INLINE != 0;
    let ring = &qp.sq.0;
    let at = ring.slot_offset(index) + IV_SEND_WQE_HEADER;
    let recv = &dest.tx.resp.recv;
    if let Some((dst, doff, src, soff)) = step.one_copy {
        let _ = Region::copy(dst, doff, src, soff, len as usize);
    } else if let (Some((dst, doff)), true) = (step.dst, inline) {
        let _ = Region::copy(dst, doff, ring.region(), at, len as usize);
    } else if len > 0 {
        let mut src = payload(qp, mrs, index, inline);
        let _ = match step.dst {
            Some((region, base)) if wqe.opcode == IV_WR_RDMA_WRITE_WITH_IMM => {
                src.copy_to(region, base, len as usize)
            }
            _ => {
                let rsges = &recv.sges[..recv.nsge];
                dma::scatter(mrs, dest.pdn, rsges, 0, u64::from(len), &mut src)
            }
        };
    }
    // The responder's completion of the message the requester's one
    // packet (ONLY) of it would carry.
    let k = mask(data_opcode(IV_QPT_RC, wqe.opcode, true, true));
    let src_qp = dest.tx.path.dest_qpn;
    let cqe = recv_cqe(dest_qpn, src_qp, recv.wr_id, k, len, wqe.imm_or_inv);
    post_cqe(
        cqs,
        dp,
        dest.recv_cqn,
        &cqe,
        wqe.flags & IV_SEND_SOLICITED != 0,
    );
    delivered(dest, last);
    Done::Message {
        count,
        last,
        ack_req,
    }
}

/// The peer's `length` bytes at the WQE's remote address, checked as its
/// responder checks them: the rkey names a valid MR of the peer's PD that
/// allows `need` and holds them. `Some(None)` for no bytes (nothing to
/// check); `None` when a check fails.
#[inline(always)]
fn remote_range<'m>(
    remote: &mut KeyCache<'m>,
    dest: &Qp,
    wqe: &IvSendWqe,
    length: u32,
    need: u32,
) -> Option<Option<(&'m Region, usize)>> {
    if length == 0 {
        return Some(None);
    }
    let mr = remote.get(wqe.rkey)?;
    let off = crate::transport::dma::remote_range(
        mr,
        dest.pdn,
        need,
        wqe.remote_addr,
        u64::from(length),
    )?;
    Some(Some((&**mr.region(), off)))
}

/// Reads the send queue's next WQE into the requester's shadow
/// ([`crate::firmware::qp_state::ReqState::read_shadow`]): the header, and the
/// gather list.
#[inline(always)]
fn read_next(qp: &mut Qp) -> Option<(&IvSendWqe, &[IvSge])> {
    let index = qp.tx.req.next;
    qp.tx.req.read_shadow(&qp.sq.0, index, &qp.cap).ok()
}

/// [`check`] for a READ or an atomic (`op`): the local gather list (which
/// it writes), the length, and the responder's checks (access, a
/// responder resource, the rkey; an atomic's alignment and word).
#[inline(always)]
fn check_rd_atomic<'m>(
    wqe: &IvSendWqe,
    sges: &[IvSge],
    pdn: u32,
    dest: &Qp,
    local: &mut KeyCache<'m>,
    remote: &mut KeyCache<'m>,
) -> Option<Step<'m>> {
    let mrs = local.mrs;
    let atomic = match wqe.opcode {
        IV_WR_RDMA_READ => false,
        IV_WR_ATOMIC_CMP_AND_SWP | IV_WR_ATOMIC_FETCH_AND_ADD => true,
        _ => return None,
    };
    if wqe.flags & IV_SEND_INLINE != 0 {
        return None;
    }
    let mut dst = None;
    let length = if let [one] = sges
        && one.length != 0
    {
        dst = Some(local.local(pdn, one, true)?);
        u64::from(one.length)
    } else {
        check_sges(mrs, pdn, sges, true).ok()?
    };
    if length > u64::from(MAX_MSG_SZ) || (atomic && length != 8) {
        return None;
    }
    let length = u32::try_from(length).ok()?;
    let need = if atomic {
        IV_ACCESS_REMOTE_ATOMIC
    } else {
        IV_ACCESS_REMOTE_READ
    };
    permitted(dest, if atomic { m::ATOMIC } else { m::READ }).ok()?;
    if atomic && !atomic_aligned(wqe.remote_addr) {
        return None;
    }
    let remote_end = remote_range(remote, dest, wqe, length, need)?;
    if atomic {
        // Eight bytes: a range; an aligned word in memory.
        let (region, off) = remote_end?;
        region.atomic_u64(off).ok()?;
    }
    // `dst` is the peer's end (the source of a READ, the word of an
    // atomic); `one_copy` has the local end first.
    Some(Step {
        length,
        dst: remote_end,
        one_copy: dst.zip(remote_end).map(|((lr, lo), (r, o))| (lr, lo, r, o)),
    })
}
