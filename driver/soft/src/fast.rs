//! The send doorbell's fast path: RC SEND, RDMA WRITE and RDMA READ
//! between two QPs of this HCA (loopback), executed end to end under the
//! one `HCA_LOCK` hold of the doorbell, without building packets.
//!
//! For each new WQE it does what the requester, the responder and the
//! completer would do with the packets of that WQE in one batch — the same
//! PSNs, MSNs, ACK requests and coalesced ACK, the same receive WQE
//! consumption and completions, the same responder resources for READs,
//! the same counters — but straight from the QPs' state: the WQE is read
//! into the requester's shadow, the payload is copied from the source MR
//! (or the slot, inline) to its destination (a READ's from the peer's MR
//! to the local gather list), the receive CQE is written, and at the end
//! the coalesced ACK (or a READ's response, which acknowledges as much)
//! goes to the completer, which retires the WQEs and writes the send CQEs.
//!
//! Every check the general path makes is made first, before anything
//! changes; anything unusual (a WQE that would fail or wait, no receive
//! WQE, a receive CQ without room, another opcode, segmentation state in
//! progress, an SRQ, another HCA, frames waiting) stops the fast path
//! there, and the general engine takes the rest of the send queue from
//! the same state.

use core::sync::atomic::Ordering;

use irpverbs_abi::{
    IV_ACCESS_LOCAL_WRITE, IV_ACCESS_REMOTE_READ, IV_ACCESS_REMOTE_WRITE, IV_QPT_RC,
    IV_SEND_INLINE, IV_SEND_SIGNALED, IV_SEND_SOLICITED, IV_SEND_WQE_HEADER, IV_WC_OP_RECV,
    IV_WC_SUCCESS, IV_WR_RDMA_READ, IV_WR_RDMA_WRITE, IV_WR_SEND, IvCqe, IvSge,
};
use irpverbs_core::AsyncEvent;
use irpverbs_ring::Region;
use irpverbs_ring::wq::{read_recv_wqe_into, read_send_wqe_into};

use crate::cq::{Cq, post_cqe};
use crate::dma::{DmaError, Source, check_sges, for_each_piece, mr_by_key};
use crate::engine::REQUESTER_BUDGET;
use crate::firmware::Firmware;
use crate::mr::Mr;
use crate::packet::psn_add;
use crate::port::MAX_MSG_SZ;
use crate::qp::{Qp, QpState};
use crate::requester::{ACK_EVERY, SendSlot, packets};
use crate::table::Table;

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
    if !dp.loopq.is_empty()
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
        || dest.srqn.is_some()
        || dest.rq.is_none()
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
    let entries = qp.sq.0.entries();
    let mut sent = 0usize;
    // The last PSN acknowledged so far, and whether that takes an ACK
    // packet (a READ's response acknowledges without one).
    let mut ack: Option<u32> = None;
    let mut ack_packet = false;
    let mut ran = Ran::Stopped;
    let mrs: &Table<Mr> = &*env.mrs;
    let cqs = env.cqs;
    let dps = env.dp;
    // Keys resolved in this run: the MRs cannot change while it holds the
    // firmware, so a key that named a live MR still does.
    let mut local = KeyCache::new(mrs);
    let mut remote = KeyCache::new(mrs);
    loop {
        let req = &qp.tx.req;
        if req.next == pi {
            ran = Ran::All;
            break;
        }
        let posted = pi.wrapping_sub(req.ci);
        if posted > entries || req.next.wrapping_sub(req.ci) > posted {
            break;
        }
        if sent >= REQUESTER_BUDGET {
            ran = Ran::Budget;
            break;
        }
        let Some(step) = check(qp, dest, &mut local, &mut remote, cqs) else {
            break;
        };
        // Committed: nothing below fails.
        let index = qp.tx.req.next;
        let count = packets(step.length, qp.tx.mtu);
        let req = &mut qp.tx.req;
        let first = req.psn;
        let last = psn_add(first, count - 1);
        req.psn = psn_add(first, count);
        req.next = index.wrapping_add(1);
        let slot = req.slot_mut(index);
        slot.length = step.length;
        slot.first_psn = first;
        slot.last_psn = last;
        slot.resp_next = first;
        let wqe = slot.wqe;
        let read = wqe.opcode == IV_WR_RDMA_READ;
        let in_flight = req.next.wrapping_sub(req.ci);
        let ack_req = read
            || wqe.flags & IV_SEND_SIGNALED != 0
            || qp.sq_sig_all
            || req.unacked + count >= ACK_EVERY
            || in_flight > entries / 2;
        req.unacked = if ack_req { 0 } else { req.unacked + count };
        sent += count as usize;
        // A READ is one request packet and `count` responses.
        let packets = u64::from(count) + u64::from(read);
        dps.stats.packets_sent += packets;
        dps.stats.packets_received += packets;
        dps.stats.fast_path_wqes += 1;
        if dest.state == QpState::Rtr && !dest.tx.comm_est {
            comm_established(dest, dest_qpn, dps);
        }
        // The payload, from the slot (inline) or the gather list, where it
        // is not one copy.
        let inline = wqe.flags & IV_SEND_INLINE != 0;
        let src = || {
            if inline {
                let ring = &qp.sq.0;
                Src::Inline(ring.region(), ring.slot_offset(index) + IV_SEND_WQE_HEADER)
            } else {
                Src::Sges(qp.tx.req.sges(index))
            }
        };
        let len = step.length;
        if wqe.opcode == IV_WR_SEND {
            let rq = &dest.rq.as_ref().map(|r| &r.0);
            let resp = &mut dest.tx.resp;
            if let Some(ring) = rq {
                resp.rq_ci = resp.rq_ci.wrapping_add(1);
                ring.consumer().release(resp.rq_ci);
                if resp.rq_seen != resp.rq_ci {
                    // The next message's receive WQE, posted long ago
                    // (from the ULP's processor): fetched now, it is not
                    // waited for then.
                    ring.prefetch_slot(resp.rq_ci);
                }
            }
            let recv = &resp.recv;
            if let Some((dst, doff, src, soff)) = step.one_copy {
                // One SGE each side, both checked: one copy.
                let _ = Region::copy(dst, doff, src, soff, len as usize);
            } else if let (Some((dst, doff)), true) = (step.dst, inline) {
                // Inline into one receive SGE: one copy from the slot.
                let ring = &qp.sq.0;
                let at = ring.slot_offset(index) + IV_SEND_WQE_HEADER;
                let _ = Region::copy(dst, doff, ring.region(), at, len as usize);
            } else {
                scatter(mrs, qp.pdn, &src(), len, dest.pdn, &recv.sges[..recv.nsge]);
            }
            let cqe = IvCqe {
                wr_id: recv.wr_id,
                status: IV_WC_SUCCESS,
                opcode: IV_WC_OP_RECV,
                byte_len: len,
                qp_num: dest_qpn,
                src_qp: qpn,
                ..IvCqe::default()
            };
            post_cqe(
                cqs,
                dps,
                dest.recv_cqn,
                &cqe,
                wqe.flags & IV_SEND_SOLICITED != 0,
            );
        } else if read {
            if let Some((dst, doff, src, soff)) = step.one_copy {
                let _ = Region::copy(dst, doff, src, soff, len as usize);
            } else if let (Some((region, base)), true) = (step.dst, len > 0) {
                read_scatter(mrs, qp.pdn, qp.tx.req.sges(index), len, region, base);
            }
            // As the responder keeps it, for a duplicate of the request.
            crate::responder::new_resource(
                dest,
                crate::responder::Resource {
                    kind: crate::packet::m::READ,
                    first_psn: first,
                    last_psn: last,
                    va: wqe.remote_addr,
                    rkey: wqe.rkey,
                    len,
                    orig: 0,
                },
            );
        } else if let Some((dst, doff, src, soff)) = step.one_copy {
            let _ = Region::copy(dst, doff, src, soff, len as usize);
        } else if let (Some((dst, doff)), true) = (step.dst, inline) {
            let ring = &qp.sq.0;
            let at = ring.slot_offset(index) + IV_SEND_WQE_HEADER;
            let _ = Region::copy(dst, doff, ring.region(), at, len as usize);
        } else if len > 0 {
            if let Some((region, base)) = step.dst {
                gather(mrs, qp.pdn, &src(), len, region, base);
            }
        }
        let resp = &mut dest.tx.resp;
        resp.epsn = psn_add(last, 1);
        resp.msn = psn_add(resp.msn, 1);
        resp.nak_sent = false;
        if read {
            // The responder sends the ACK it owes before the response.
            if ack_packet {
                dps.stats.packets_sent += 1;
                dps.stats.packets_received += 1;
            }
            ack = Some(last);
            ack_packet = false;
        } else if ack_req {
            ack = Some(last);
            ack_packet = true;
        }
    }
    if let Some(psn) = ack {
        if ack_packet {
            dps.stats.packets_sent += 1;
            dps.stats.packets_received += 1;
        }
        let mut env = crate::engine::Env {
            mrs: env.mrs,
            cqs,
            srqs: env.srqs,
            ahs: env.ahs,
            port: env.port,
            dp: dps,
        };
        crate::completer::acked_fast(qpn, qp, &mut env, psn);
    }
    ran
}

/// The first message to a QP in RTR: communication established.
#[cold]
#[inline(never)]
fn comm_established(dest: &mut Qp, dest_qpn: u32, dp: &mut crate::engine::DataPath) {
    dest.tx.comm_est = true;
    dp.raise(AsyncEvent::CommEstablished(dest_qpn));
}

/// A SEND's payload where it is not one copy: gathered from `src` (PD
/// `spdn`) and scattered over the receive SGEs `sges` (PD `dpdn`), all
/// checked before.
#[cold]
#[inline(never)]
fn scatter(mrs: &Table<Mr>, spdn: u32, src: &Src<'_>, len: u32, dpdn: u32, sges: &[IvSge]) {
    let _ = copy(mrs, spdn, src, len, |start, n, s| {
        let mut done = 0;
        for_each_piece(
            mrs,
            dpdn,
            sges,
            start as u64,
            n as u64,
            true,
            |mr, doff, k| {
                s.copy(mr.region(), doff, done, k)?;
                done += k;
                Ok(())
            },
        )
    });
}

/// A WRITE's payload where it is not one copy: gathered from `src` (PD
/// `spdn`, checked) into `region` from `base`.
#[cold]
#[inline(never)]
fn gather(mrs: &Table<Mr>, spdn: u32, src: &Src<'_>, len: u32, region: &Region, base: usize) {
    let _ = copy(mrs, spdn, src, len, |start, n, s| {
        s.copy(region, base + start, 0, n)
    });
}

/// A READ's payload where it is not one copy: from `region` at `base` (the
/// peer's, checked) scattered over the local gather list `sges` (PD `pdn`,
/// checked for local write).
#[cold]
#[inline(never)]
fn read_scatter(mrs: &Table<Mr>, pdn: u32, sges: &[IvSge], len: u32, region: &Region, base: usize) {
    let mut pos = 0usize;
    let _ = for_each_piece(mrs, pdn, sges, 0, u64::from(len), true, |mr, off, n| {
        Region::copy(mr.region(), off, region, base + pos, n).map_err(|_| DmaError::Prot)?;
        pos += n;
        Ok(())
    });
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
    /// [`crate::dma`]'s `local_sge` checks it.
    fn local(&mut self, pdn: u32, sge: &IvSge, write: bool) -> Option<(&'m Region, usize)> {
        let mr = self.get(sge.lkey)?;
        if mr.pdn != pdn || (write && mr.access & IV_ACCESS_LOCAL_WRITE == 0) {
            return None;
        }
        let off = mr.offset_of(sge.addr, u64::from(sge.length))?;
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
) -> Option<Step<'m>> {
    let mrs = local.mrs;
    let index = qp.tx.req.next;
    let req = &mut qp.tx.req;
    let k = req.slot_index(index);
    let per = req.sge_per_slot;
    let slot = &mut req.slots[k];
    let shadow = &mut req.sges[k * per..(k + 1) * per];
    *slot = SendSlot::default();
    let nsge = read_send_wqe_into(
        &qp.sq.0,
        index,
        qp.cap.max_send_sge,
        qp.cap.max_inline_data,
        &mut slot.wqe,
        shadow,
    )
    .ok()?;
    slot.nsge = u8::try_from(nsge).ok()?;
    let wqe = slot.wqe;
    let read = wqe.opcode == IV_WR_RDMA_READ;
    if wqe.opcode != IV_WR_SEND && wqe.opcode != IV_WR_RDMA_WRITE && !read {
        return None;
    }
    let inline = wqe.flags & IV_SEND_INLINE != 0;
    if inline && read {
        return None;
    }
    // One SGE: checked here, and the local end of a one-copy message (a
    // READ writes into it).
    let mut src = None;
    let length = if inline {
        u64::from(wqe.inline_len)
    } else if nsge == 1 && shadow[0].length != 0 {
        src = Some(local.local(qp.pdn, &shadow[0], read)?);
        u64::from(shadow[0].length)
    } else {
        check_sges(mrs, qp.pdn, &shadow[..nsge], read).ok()?
    };
    if length > u64::from(MAX_MSG_SZ) {
        return None;
    }
    let length = u32::try_from(length).ok()?;
    if wqe.opcode == IV_WR_SEND {
        // A receive WQE, well formed, that takes the message; room for
        // its completion.
        let ring = &dest.rq.as_ref()?.0;
        let resp = &mut dest.tx.resp;
        let n = resp.rq_seen.wrapping_sub(resp.rq_ci);
        if n == 0 || n > ring.entries() {
            resp.rq_seen = ring.producer_word().load(Ordering::Acquire);
            let n = resp.rq_seen.wrapping_sub(resp.rq_ci);
            if n == 0 || n > ring.entries() {
                return None;
            }
        }
        let (wr_id, rn) =
            read_recv_wqe_into(ring, resp.rq_ci, dest.cap.max_recv_sge, &mut resp.recv.sges)
                .ok()?;
        resp.recv.wr_id = wr_id;
        resp.recv.nsge = rn;
        resp.recv.offset = 0;
        let (mut dst, mut one_copy) = (None, None);
        let rsge = &resp.recv.sges[..rn];
        if let [r] = rsge
            && length != 0
            && length <= r.length
        {
            // The bytes land in the first SGE, checked as a whole.
            let (dr, doff) = remote.local(dest.pdn, r, true)?;
            dst = Some((dr, doff));
            one_copy = src.map(|(sr, so)| (dr, doff, sr, so));
        } else {
            for_each_piece(
                mrs,
                dest.pdn,
                rsge,
                0,
                u64::from(length),
                true,
                |_, _, _| Ok(()),
            )
            .ok()?;
        }
        let cq = cqs.get_mut(dest.recv_cqn).ok()?;
        if cq.error || !cq.has_room() {
            return None;
        }
        Some(Step {
            length,
            dst,
            one_copy,
        })
    } else if read {
        // The responder's checks of a READ request: access, a responder
        // resource, the rkey.
        if dest.attr.qp_access_flags & IV_ACCESS_REMOTE_READ == 0
            || dest.attr.max_dest_rd_atomic == 0
        {
            return None;
        }
        if length == 0 {
            return Some(Step {
                length,
                dst: None,
                one_copy: None,
            });
        }
        let mr = remote.get(wqe.rkey)?;
        if mr.pdn != dest.pdn || mr.access & IV_ACCESS_REMOTE_READ == 0 {
            return None;
        }
        let off = mr.offset_of(wqe.remote_addr, u64::from(length))?;
        let region = &**mr.region();
        Some(Step {
            length,
            dst: Some((region, off)),
            one_copy: src.map(|(lr, lo)| (lr, lo, region, off)),
        })
    } else {
        if dest.attr.qp_access_flags & IV_ACCESS_REMOTE_WRITE == 0 {
            return None;
        }
        if length == 0 {
            return Some(Step {
                length,
                dst: None,
                one_copy: None,
            });
        }
        let mr = remote.get(wqe.rkey)?;
        if mr.pdn != dest.pdn || mr.access & IV_ACCESS_REMOTE_WRITE == 0 {
            return None;
        }
        let off = mr.offset_of(wqe.remote_addr, u64::from(length))?;
        let region = &**mr.region();
        Some(Step {
            length,
            dst: Some((region, off)),
            one_copy: src.map(|(sr, so)| (region, off, sr, so)),
        })
    }
}

/// Where a message's bytes are.
enum Src<'a> {
    /// Inline, in the send queue slot at this offset.
    Inline(&'a alloc::sync::Arc<Region>, usize),
    /// A checked gather list.
    Sges(&'a [IvSge]),
}

/// A contiguous piece of the source: a region from an offset.
struct Piece<'a> {
    region: &'a Region,
    base: usize,
}

impl Piece<'_> {
    /// Copies `n` bytes of this piece, from `skip` bytes into it, to `dst`
    /// at `dst_off`.
    fn copy(&self, dst: &Region, dst_off: usize, skip: usize, n: usize) -> Result<(), DmaError> {
        Source::Region {
            region: self.region,
            off: self.base + skip,
        }
        .copy_to(dst, dst_off, n)
    }
}

/// Visits the source pieces of a `len`-byte message: `f(message offset,
/// length, piece)`, the piece positioned at that message offset.
fn copy(
    mrs: &Table<Mr>,
    pdn: u32,
    src: &Src<'_>,
    len: u32,
    mut f: impl FnMut(usize, usize, &Piece<'_>) -> Result<(), DmaError>,
) -> Result<(), DmaError> {
    let len = len as usize;
    match *src {
        Src::Inline(region, at) => f(0, len, &Piece { region, base: at }),
        Src::Sges(sges) => {
            let mut pos = 0usize;
            for_each_piece(mrs, pdn, sges, 0, len as u64, false, |mr, off, n| {
                f(
                    pos,
                    n,
                    &Piece {
                        region: mr.region(),
                        base: off,
                    },
                )?;
                pos += n;
                Ok(())
            })
        }
    }
}
