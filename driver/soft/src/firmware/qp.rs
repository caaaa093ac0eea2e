//! Queue pairs: numbers, the IBTA state machine, attributes.
//!
//! QP numbers are 24 bits, handed out in increasing order from 2 (QP0 and
//! QP1 are reserved), wrapping back to 2 and skipping numbers in use, so a
//! number is not reused until the whole space went round: a late packet or
//! event for a destroyed QP does not hit its successor.
//!
//! The firmware keeps each QP's state and attributes. `ModifyQp` checks the
//! transition ([`transition_allowed`]) and the value of every attribute in
//! the mask, and only then applies them; which attributes a transition
//! requires or allows is the driver's check (the IBTA tables), not repeated
//! here.

use core::cell::Cell;

use alloc::boxed::Box;
use alloc::vec::Vec;

use irpverbs_abi::{
    IV_ACCESS_ALL, IV_MIG_ARMED, IV_MIG_MIGRATED, IV_QP_ACCESS_FLAGS, IV_QP_ALT_PATH,
    IV_QP_ATTR_ALL, IV_QP_AV, IV_QP_CAP, IV_QP_CUR_STATE, IV_QP_DEST_QPN,
    IV_QP_EN_SQD_ASYNC_NOTIFY, IV_QP_MAX_DEST_RD_ATOMIC, IV_QP_MAX_QP_RD_ATOMIC,
    IV_QP_MIN_RNR_TIMER, IV_QP_PATH_MIG_STATE, IV_QP_PATH_MTU, IV_QP_PKEY_INDEX, IV_QP_PORT,
    IV_QP_QKEY, IV_QP_RETRY_CNT, IV_QP_RNR_RETRY, IV_QP_RQ_PSN, IV_QP_SQ_PSN, IV_QP_STATE,
    IV_QP_TIMEOUT, IV_QPS_ERR, IV_QPS_INIT, IV_QPS_RESET, IV_QPS_RTR, IV_QPS_RTS, IV_QPS_SQD,
    IV_QPS_SQE, IV_QPT_RC, IV_QPT_UC, IV_QPT_UD, IvQpAttr, IvQpCap, IvQueryQpOut, NtStatus,
    STATUS_INSUFFICIENT_RESOURCES, STATUS_INVALID_DEVICE_STATE, STATUS_INVALID_HANDLE,
    STATUS_INVALID_PARAMETER,
};
use irpverbs_core::{AsyncEvent, CommandOut, CreateQp, ModifyQp};

use crate::config::{FIRST_QPN, MAX_QPN, ring_entries};
use crate::firmware::Firmware;
use crate::firmware::port::{PKEY_TBL_LEN, check_port};
use crate::firmware::shared::boxed;

/// Largest PSN (24 bits).
pub const MAX_PSN: u32 = 0xFF_FFFF;
/// Largest `retry_cnt` and `rnr_retry`.
pub const MAX_RETRY: u8 = 7;
/// Largest `timeout` and `min_rnr_timer` (5-bit IBTA encodings).
pub const MAX_TIMER: u8 = 31;

/// A QP state (IBTA 10.3.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum QpState {
    /// Just created, or reset.
    Reset,
    /// Initialized: receives may be posted.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Send queue drained.
    Sqd,
    /// Send queue error (UC, UD).
    Sqe,
    /// Error.
    Err,
}

impl QpState {
    /// Every state, in `IV_QPS_*` order.
    #[cfg(test)]
    pub(crate) const ALL: [Self; 7] = [
        Self::Reset,
        Self::Init,
        Self::Rtr,
        Self::Rts,
        Self::Sqd,
        Self::Sqe,
        Self::Err,
    ];

    /// The state an `IV_QPS_*` value names.
    pub(crate) const fn from_abi(value: u32) -> Option<Self> {
        Some(match value {
            IV_QPS_RESET => Self::Reset,
            IV_QPS_INIT => Self::Init,
            IV_QPS_RTR => Self::Rtr,
            IV_QPS_RTS => Self::Rts,
            IV_QPS_SQD => Self::Sqd,
            IV_QPS_SQE => Self::Sqe,
            IV_QPS_ERR => Self::Err,
            _ => return None,
        })
    }

    /// Its `IV_QPS_*` value.
    pub(crate) const fn to_abi(self) -> u32 {
        match self {
            Self::Reset => IV_QPS_RESET,
            Self::Init => IV_QPS_INIT,
            Self::Rtr => IV_QPS_RTR,
            Self::Rts => IV_QPS_RTS,
            Self::Sqd => IV_QPS_SQD,
            Self::Sqe => IV_QPS_SQE,
            Self::Err => IV_QPS_ERR,
        }
    }
}

/// Whether `ModifyQp` may move a QP from `from` to `to` (IBTA 10.3.1, the
/// transitions a consumer can ask for): RESET->INIT, INIT->INIT, INIT->RTR,
/// RTR->RTS, RTS->RTS, RTS->SQD, SQD->SQD, SQD->RTS, SQE->RTS, and from any
/// state to RESET or ERR.
pub(crate) const fn transition_allowed(from: QpState, to: QpState) -> bool {
    use QpState::{Err, Init, Reset, Rtr, Rts, Sqd, Sqe};
    matches!(
        (from, to),
        (_, Reset | Err)
            | (Reset | Init, Init)
            | (Init, Rtr)
            | (Rtr | Rts | Sqd | Sqe, Rts)
            | (Rts | Sqd, Sqd)
    )
}

/// A queue pair: its configuration, its rings and its transport state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Qp {
    /// Its PD.
    pub(crate) pdn: u32,
    /// `IV_QPT_*`.
    pub(crate) qp_type: u32,
    /// Send CQ.
    pub(crate) send_cqn: u32,
    /// Receive CQ.
    pub(crate) recv_cqn: u32,
    /// SRQ, if any.
    pub(crate) srqn: Option<u32>,
    /// Every send WR completes.
    pub(crate) sq_sig_all: bool,
    /// Current state.
    pub(crate) state: QpState,
    /// Actual work queue sizes.
    pub(crate) cap: IvQpCap,
    /// Attributes set by `ModifyQp` (its `qp_state`, `cur_qp_state`, `cap`
    /// and `sq_draining` are not used: `state`, `cap` and the transport
    /// state are authoritative).
    pub(crate) attr: IvQpAttr,
    /// The send queue ring.
    pub(crate) sq: crate::firmware::shared::RingRef,
    /// The receive queue ring (none with an SRQ).
    pub(crate) rq: Option<crate::firmware::shared::RingRef>,
    /// Transport state (requester, completer, responder).
    pub(crate) tx: alloc::boxed::Box<crate::firmware::qp_state::QpTx>,
}

/// QPs by number: a vector sorted by QPN (a binary search finds one; the
/// data path looks up two per doorbell), each QP boxed so that inserting
/// moves only the (number, pointer) entries. A removed QP leaves its entry
/// empty until empty entries are half the vector, which is then compacted:
/// removal costs no shift of the later entries (O(1) amortized, where a
/// shift was O(n) per destroy with many QPs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct QpTable {
    qps: Vec<(u32, Option<Box<Qp>>)>,
    /// Empty entries in `qps`.
    dead: usize,
    /// The next number to try.
    pub(crate) next: u32,
    max: u32,
    /// Where the last two lookups found their QPs.
    hints: Hints,
}

/// The positions of the last two QPs found (a doorbell's QP and its peer,
/// or the two QPs of a ping-pong), tried before the binary search. A
/// position counts only while its entry still has that number, so inserts
/// and compaction, which move entries, need not update them. Not part of
/// the table's value (equal tables may have different hints).
#[derive(Clone, Debug, Default)]
struct Hints([Cell<u32>; 2]);

impl PartialEq for Hints {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Hints {}

/// Empty entries a [`QpTable`] keeps at least before compacting.
const QP_TABLE_SLACK: usize = 64;

impl QpTable {
    /// An empty table of at most `max` QPs (`max` <= 0xFF_FFFE).
    pub(crate) const fn new(max: u32) -> Self {
        Self {
            qps: Vec::new(),
            dead: 0,
            next: FIRST_QPN,
            max,
            hints: Hints([Cell::new(0), Cell::new(0)]),
        }
    }

    /// Live QPs.
    pub(crate) fn len(&self) -> usize {
        self.qps.len() - self.dead
    }

    /// The position of QP `qpn`'s entry (live or empty), or where it would
    /// go.
    fn find(&self, qpn: u32) -> Result<usize, usize> {
        let [h0, h1] = &self.hints.0;
        for h in [h0, h1] {
            let i = h.get() as usize;
            if self.qps.get(i).is_some_and(|(n, _)| *n == qpn) {
                return Ok(i);
            }
        }
        let found = self.qps.binary_search_by_key(&qpn, |(n, _)| *n);
        if let Ok(i) = found {
            h1.set(h0.get());
            h0.set(i as u32);
        }
        found
    }

    /// The position of live QP `qpn`.
    fn find_live(&self, qpn: u32) -> Option<usize> {
        self.find(qpn).ok().filter(|&i| self.qps[i].1.is_some())
    }

    /// QP `qpn`.
    ///
    /// # Errors
    /// `STATUS_INVALID_HANDLE` when there is none.
    pub(crate) fn get(&self, qpn: u32) -> Result<&Qp, NtStatus> {
        match self.find(qpn) {
            Ok(i) => self.qps[i].1.as_deref().ok_or(STATUS_INVALID_HANDLE),
            Err(_) => Err(STATUS_INVALID_HANDLE),
        }
    }

    /// QP `qpn`, mutably.
    ///
    /// # Errors
    /// `STATUS_INVALID_HANDLE` when there is none.
    pub(crate) fn get_mut(&mut self, qpn: u32) -> Result<&mut Qp, NtStatus> {
        match self.find(qpn) {
            Ok(i) => self.qps[i].1.as_deref_mut().ok_or(STATUS_INVALID_HANDLE),
            Err(_) => Err(STATUS_INVALID_HANDLE),
        }
    }

    /// QP `a` and the QP its path names (`tx.path.dest_qpn`: a loopback
    /// RC QP's peer), both mutably, in two lookups; `None` when either is
    /// missing or the QP names itself.
    pub(crate) fn with_dest_mut(&mut self, a: u32) -> Option<(&mut Qp, &mut Qp)> {
        let i = self.find(a).ok()?;
        let b = self.qps.get(i)?.1.as_deref()?.tx.path.dest_qpn;
        let j = self.find(b).ok()?;
        // Two different live entries, each checked once (this is every
        // loopback doorbell's lookup).
        let (lo, hi) = (i.min(j), i.max(j));
        if lo == hi || hi >= self.qps.len() {
            return None;
        }
        // In bounds, as just checked: no further checks.
        let (head, tail) = self.qps.split_at_mut(hi);
        let lo = head[lo].1.as_deref_mut()?;
        let hi = tail[0].1.as_deref_mut()?;
        Some(if i < j { (lo, hi) } else { (hi, lo) })
    }

    /// QP `a`, and, when `local` says of it that its peer is on this HCA,
    /// the QP its path names (`tx.path.dest_qpn`) too, mutably: one lookup
    /// for a QP whose peer is elsewhere, two for a loopback pair. The peer
    /// is `None` when `local` says no, or it is missing or `a` itself.
    pub(crate) fn with_peer_mut(
        &mut self,
        a: u32,
        local: impl FnOnce(&Qp) -> bool,
    ) -> Option<(&mut Qp, Option<&mut Qp>)> {
        let i = self.find(a).ok()?;
        let qp = self.qps.get(i)?.1.as_deref()?;
        let j = if local(qp) {
            let b = qp.tx.path.dest_qpn;
            self.find(b).ok().filter(|&j| j != i)
        } else {
            None
        };
        let Some(j) = j else {
            return Some((self.qps.get_mut(i)?.1.as_deref_mut()?, None));
        };
        let (lo, hi) = (i.min(j), i.max(j));
        let (head, tail) = self.qps.split_at_mut(hi);
        let (x, y) = (head.get_mut(lo)?, tail.first_mut()?);
        let (x, y) = if i < j { (x, y) } else { (y, x) };
        let qp = x.1.as_deref_mut()?;
        Some((qp, y.1.as_deref_mut()))
    }

    /// Stores the QP `qp` makes (in its box, once there is room) under the
    /// next free number.
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES` when `max` QPs exist or memory
    /// runs out.
    pub(crate) fn insert(&mut self, qp: impl FnOnce() -> Qp) -> Result<u32, NtStatus> {
        if self.len() >= self.max as usize {
            return Err(STATUS_INSUFFICIENT_RESOURCES);
        }
        self.qps
            .try_reserve(1)
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        // Built in its box (docs/stack-budget.md: a DPC can create a QP).
        let qp = irpverbs_ring::try_box_with(qp).ok_or(STATUS_INSUFFICIENT_RESOURCES)?;
        // Fewer than max <= 0xFF_FFFE QPs exist, so a free number exists and
        // this ends within one trip round the number space.
        loop {
            let qpn = self.next;
            self.next = if qpn >= MAX_QPN { FIRST_QPN } else { qpn + 1 };
            match self.find(qpn) {
                Err(at) => {
                    self.qps.insert(at, (qpn, Some(qp)));
                    return Ok(qpn);
                }
                Ok(i) if self.qps[i].1.is_none() => {
                    self.qps[i].1 = Some(qp);
                    self.dead -= 1;
                    return Ok(qpn);
                }
                Ok(_) => {}
            }
        }
    }

    /// Every QP, mutably, by number.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (u32, &mut Qp)> {
        self.qps
            .iter_mut()
            .filter_map(|(k, v)| Some((*k, &mut **v.as_mut()?)))
    }

    /// Removes QP `qpn`.
    ///
    /// # Errors
    /// `STATUS_INVALID_HANDLE` when there is none.
    pub(crate) fn remove(&mut self, qpn: u32) -> Result<Qp, NtStatus> {
        let i = self.find_live(qpn).ok_or(STATUS_INVALID_HANDLE)?;
        let qp = self.qps[i].1.take().ok_or(STATUS_INVALID_HANDLE)?;
        self.dead += 1;
        if self.dead > QP_TABLE_SLACK && self.dead * 2 > self.qps.len() {
            self.qps.retain(|(_, q)| q.is_some());
            self.dead = 0;
        }
        Ok(*qp)
    }

    /// The first live QPN `from` or above.
    pub(crate) fn next_live(&self, from: u32) -> Option<u32> {
        let start = self.qps.partition_point(|(n, _)| *n < from);
        self.qps
            .get(start..)?
            .iter()
            .find(|(_, q)| q.is_some())
            .map(|(n, _)| *n)
    }

    /// Entries the vector holds, live and empty (tests: compaction).
    #[cfg(test)]
    fn entries(&self) -> usize {
        self.qps.len()
    }
}

impl Firmware {
    /// The actual sizes of work queues asked as `cap`: WR counts rounded up
    /// to 2^k - 1, SGEs and inline data as asked; with an SRQ the receive
    /// sizes are ignored and reported 0.
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER` for a non-zero reserved field;
    /// `STATUS_INSUFFICIENT_RESOURCES` for a size above the device's limit.
    fn qp_cap(&self, cap: &IvQpCap, has_srq: bool) -> Result<IvQpCap, NtStatus> {
        if cap.reserved != 0 {
            return Err(STATUS_INVALID_PARAMETER);
        }
        let (recv_wr, recv_sge) = if has_srq {
            (0, 0)
        } else {
            (cap.max_recv_wr, cap.max_recv_sge)
        };
        let c = &self.config;
        if cap.max_send_wr > c.max_qp_wr
            || recv_wr > c.max_qp_wr
            || cap.max_send_sge > c.max_sge
            || recv_sge > c.max_sge
            || cap.max_inline_data > c.max_inline_data
        {
            return Err(STATUS_INSUFFICIENT_RESOURCES);
        }
        Ok(IvQpCap {
            max_send_wr: ring_entries(cap.max_send_wr),
            max_recv_wr: ring_entries(recv_wr),
            max_send_sge: cap.max_send_sge,
            max_recv_sge: recv_sge,
            max_inline_data: cap.max_inline_data,
            reserved: 0,
        })
    }

    /// `CreateQp`: a QP in RESET; returns its number and actual sizes.
    ///
    /// # Errors
    /// `STATUS_INVALID_HANDLE` for an unknown PD, CQ or SRQ;
    /// `STATUS_INVALID_PARAMETER` for an SRQ of another PD, an unknown QP
    /// type or a non-zero reserved field; `STATUS_INSUFFICIENT_RESOURCES` for
    /// sizes above the device's limits or when `max_qp` QPs exist.
    pub(crate) fn create_qp(&mut self, init: &CreateQp) -> Result<CommandOut, NtStatus> {
        self.pds.get(init.pdn)?;
        self.cqs.get(init.send_cqn)?;
        self.cqs.get(init.recv_cqn)?;
        if let Some(srqn) = init.srqn {
            if self.srqs.get(srqn)?.pdn != init.pdn {
                return Err(STATUS_INVALID_PARAMETER);
            }
        }
        if !matches!(init.qp_type, IV_QPT_RC | IV_QPT_UC | IV_QPT_UD) {
            return Err(STATUS_INVALID_PARAMETER);
        }
        let cap = self.qp_cap(&init.cap, init.srqn.is_some())?;
        let sq = self.rings.alloc(
            0,
            (cap.max_send_wr + 1).next_power_of_two(),
            irpverbs_ring::wq::send_stride(cap.max_send_sge, cap.max_inline_data),
        )?;
        let rq = match init.srqn {
            Some(_) => None,
            None => {
                let rq = self.rings.alloc(
                    1,
                    (cap.max_recv_wr + 1).next_power_of_two(),
                    irpverbs_ring::wq::recv_stride(cap.max_recv_sge),
                );
                match rq {
                    Ok(rq) => Some(rq),
                    Err(status) => {
                        self.rings.retire(sq);
                        return Err(status);
                    }
                }
            }
        };
        let qpn = match self.insert_qp(init, cap, &sq, rq.as_ref()) {
            Ok(qpn) => qpn,
            Err(status) => {
                // The rings go back to the pool: a create refused for
                // memory leaves the pool as it found it.
                self.rings.retire(sq);
                if let Some(rq) = rq {
                    self.rings.retire(rq);
                }
                return Err(status);
            }
        };
        self.pds.get_mut(init.pdn)?.refs.get();
        self.cqs.get_mut(init.send_cqn)?.refs.get();
        self.cqs.get_mut(init.recv_cqn)?.refs.get();
        if let Some(srqn) = init.srqn {
            self.srqs.get_mut(srqn)?.refs.get();
        }
        Ok(CommandOut::Qp {
            qpn,
            cap,
            sq: sq.0,
            rq: rq.map(|r| r.0),
        })
    }

    /// The allocations of [`Firmware::create_qp`] after its rings: the
    /// transport state and the table entry.
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES` when memory is short or `max_qp`
    /// QPs exist.
    fn insert_qp(
        &mut self,
        init: &CreateQp,
        cap: IvQpCap,
        sq: &crate::firmware::shared::RingRef,
        rq: Option<&crate::firmware::shared::RingRef>,
    ) -> Result<u32, NtStatus> {
        // Room for this QP in the data path's lists of QPs (each holds a
        // QP at most once), so that the data path never grows them.
        let n = self.qps.len() + 1;
        let dp = &mut self.dp;
        crate::firmware::shared::room_for(&mut dp.timed, n)?;
        crate::firmware::shared::room_for(&mut dp.acks, n)?;
        dp.ready
            .try_reserve(n.saturating_sub(dp.ready.len()))
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        if let Some(srqn) = init.srqn {
            let srq = self.srqs.get_mut(srqn)?;
            crate::firmware::shared::room_for(&mut srq.rnr_waiters, srq.refs.count() + 1)?;
        }
        let tx = crate::firmware::qp_state::QpTx::new_boxed(&sq.0)?;
        self.qps.insert(|| Qp {
            pdn: init.pdn,
            qp_type: init.qp_type,
            send_cqn: init.send_cqn,
            recv_cqn: init.recv_cqn,
            srqn: init.srqn,
            sq_sig_all: init.sq_sig_all,
            state: QpState::Reset,
            cap,
            attr: IvQpAttr::default(),
            sq: sq.clone(),
            rq: rq.cloned(),
            tx,
        })
    }

    /// Checks the value of every attribute in `mask`.
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER` for a value out of range (see
    /// [`Firmware::modify_qp`]); the alternate path is checked as the
    /// primary.
    fn check_qp_attr(&self, mask: u32, attr: &IvQpAttr) -> Result<(), NtStatus> {
        let has = |bit: u32| mask & bit != 0;
        if has(IV_QP_PATH_MIG_STATE) && attr.path_mig_state > IV_MIG_ARMED {
            return Err(STATUS_INVALID_PARAMETER);
        }
        if has(IV_QP_PORT) {
            check_port(attr.port_num)?;
        }
        if has(IV_QP_AV) {
            self.check_av(&attr.ah_attr)?;
        }
        if has(IV_QP_ALT_PATH) {
            // The alternate path is checked as the primary is.
            check_port(attr.alt_port_num)?;
            self.check_av(&attr.alt_ah_attr)?;
            if u32::from(attr.alt_pkey_index) >= PKEY_TBL_LEN || attr.alt_timeout > MAX_TIMER {
                return Err(STATUS_INVALID_PARAMETER);
            }
        }
        let c = &self.config;
        let bad = (has(IV_QP_EN_SQD_ASYNC_NOTIFY) && attr.en_sqd_async_notify > 1)
            || (has(IV_QP_ACCESS_FLAGS) && attr.qp_access_flags & !IV_ACCESS_ALL != 0)
            || (has(IV_QP_PKEY_INDEX) && u32::from(attr.pkey_index) >= PKEY_TBL_LEN)
            || (has(IV_QP_PATH_MTU) && !(1..=self.port.max_mtu()).contains(&attr.path_mtu))
            || (has(IV_QP_TIMEOUT) && attr.timeout > MAX_TIMER)
            || (has(IV_QP_RETRY_CNT) && attr.retry_cnt > MAX_RETRY)
            || (has(IV_QP_RNR_RETRY) && attr.rnr_retry > MAX_RETRY)
            || (has(IV_QP_MIN_RNR_TIMER) && attr.min_rnr_timer > MAX_TIMER)
            || (has(IV_QP_RQ_PSN) && attr.rq_psn > MAX_PSN)
            || (has(IV_QP_SQ_PSN) && attr.sq_psn > MAX_PSN)
            || (has(IV_QP_DEST_QPN) && attr.dest_qp_num > MAX_QPN)
            || (has(IV_QP_MAX_QP_RD_ATOMIC)
                && u32::from(attr.max_rd_atomic) > c.max_qp_init_rd_atom)
            || (has(IV_QP_MAX_DEST_RD_ATOMIC)
                && u32::from(attr.max_dest_rd_atomic) > c.max_qp_rd_atom);
        if bad {
            Err(STATUS_INVALID_PARAMETER)
        } else {
            Ok(())
        }
    }

    /// `ModifyQp`: moves QP `qpn` from `cur_state` to `attr.qp_state` (or
    /// stays in `cur_state` without `IV_QP_STATE` in `mask`) and applies the
    /// attributes in `mask`. Then the data path follows
    /// ([`Firmware::on_modify`]):
    /// - RESET clears every attribute but the sizes and empties both work
    ///   queues without completions (IBTA 10.3.1): the HCA moves its
    ///   consumer indices up to the producers (it never writes the ULP's
    ///   producer index); WQEs posted later are kept;
    /// - RTR sets the responder's expected PSN and path (the first packet
    ///   received in RTR raises CommEstablished); RTS the requester's PSN
    ///   and retry counts, and starts the WQEs posted meanwhile;
    /// - SQD stops starting WQEs; with `en_sqd_async_notify`
    ///   [`AsyncEvent::SqDrained`] is raised at once if nothing is in flight
    ///   (after the command's completion), else when the last WQE in flight
    ///   completes;
    /// - ERR flushes both work queues (every outstanding WQE completes with
    ///   `WR_FLUSH_ERR`; a QP on an SRQ raises LastWqeReached).
    ///
    /// # Errors
    /// - `STATUS_INVALID_HANDLE`: unknown QPN.
    /// - `STATUS_INVALID_PARAMETER`: unknown mask bits, non-zero reserved
    ///   fields, a state value that is no state, or an attribute value out
    ///   of range: path MTU outside 1..=port max, port not 1, P_Key index
    ///   past the table, PSN or destination QPN over 24 bits, `retry_cnt` or
    ///   `rnr_retry` over 7, `timeout` or `min_rnr_timer` over 31,
    ///   `max_rd_atomic` over `max_qp_init_rd_atom`, `max_dest_rd_atomic`
    ///   over `max_qp_rd_atom`, unknown access flags,
    ///   `en_sqd_async_notify` over 1, an address vector
    ///   [`Firmware::check_av`] refuses.
    /// - `STATUS_INSUFFICIENT_RESOURCES`: resized work queues over the
    ///   device's limits, or a `max_dest_rd_atomic` that would take the
    ///   QPs' responder resources together past `max_res_rd_atom`.
    ///   The alternate path (`IV_QP_ALT_PATH`) is checked as the primary
    ///   (port, P_Key index, timeout, address vector); a path migration
    ///   state past ARMED, and either on a UD QP, are refused too.
    /// - `STATUS_INVALID_DEVICE_STATE`: the QP is not in `cur_state` (or in
    ///   `attr.cur_qp_state` with `IV_QP_CUR_STATE`), or the state machine
    ///   has no such transition; REARM or ARMED with no alternate path
    ///   loaded (before or in this modify).
    ///
    /// Path migration (`crate::transport::apm`): `IV_QP_ALT_PATH` loads
    /// the alternate path; REARM or ARMED arms it (at once: the state reads
    /// ARMED); MIGRATED from ARMED migrates now (the alternate path becomes
    /// the primary), from MIGRATED changes nothing.
    pub(crate) fn modify_qp<D: crate::firmware::DataPathOps>(
        &mut self,
        c: &ModifyQp,
    ) -> Result<CommandOut, NtStatus> {
        let ModifyQp {
            qpn,
            cur_state,
            mask,
            ref attr,
        } = *c;
        let qp = self.qps.get(qpn)?;
        if mask & !IV_QP_ATTR_ALL != 0 || attr.reserved0 != 0 || attr.reserved1 != 0 {
            return Err(STATUS_INVALID_PARAMETER);
        }
        let from = QpState::from_abi(cur_state).ok_or(STATUS_INVALID_PARAMETER)?;
        let to = if mask & IV_QP_STATE != 0 {
            QpState::from_abi(attr.qp_state).ok_or(STATUS_INVALID_PARAMETER)?
        } else {
            from
        };
        if mask & IV_QP_CUR_STATE != 0 {
            QpState::from_abi(attr.cur_qp_state).ok_or(STATUS_INVALID_PARAMETER)?;
        }
        let believed_ok = mask & IV_QP_CUR_STATE == 0 || attr.cur_qp_state == qp.state.to_abi();
        if qp.state != from || !believed_ok || !transition_allowed(from, to) {
            return Err(STATUS_INVALID_DEVICE_STATE);
        }
        self.check_qp_attr(mask, attr)?;
        let alt_mask = IV_QP_ALT_PATH | IV_QP_PATH_MIG_STATE;
        if mask & alt_mask != 0 && qp.qp_type == IV_QPT_UD {
            // A datagram QP has no path to migrate.
            return Err(STATUS_INVALID_PARAMETER);
        }
        if mask & IV_QP_PATH_MIG_STATE != 0
            && attr.path_mig_state != IV_MIG_MIGRATED
            && mask & IV_QP_ALT_PATH == 0
            && !alt_loaded(&qp.attr)
        {
            // Nothing to arm.
            return Err(STATUS_INVALID_DEVICE_STATE);
        }
        let cap = if mask & IV_QP_CAP != 0 {
            Some(self.qp_cap(&attr.cap, qp.srqn.is_some())?)
        } else {
            None
        };
        // The device's responder resources: what this QP holds now goes
        // back, what it asks for comes out of what is left.
        let held = u32::from(qp.attr.max_dest_rd_atomic);
        let wants = if to == QpState::Reset {
            0
        } else if mask & IV_QP_MAX_DEST_RD_ATOMIC != 0 {
            u32::from(attr.max_dest_rd_atomic)
        } else {
            held
        };
        let reserved = self
            .rd_atom_reserved
            .saturating_sub(held)
            .saturating_add(wants);
        if reserved > self.config.max_res_rd_atom {
            return Err(STATUS_INSUFFICIENT_RESOURCES);
        }
        self.rd_atom_reserved = reserved;

        let qp = self.qps.get_mut(qpn)?;
        qp.state = to;
        if let Some(cap) = cap {
            qp.cap = cap;
        }
        if to == QpState::Reset {
            qp.attr = IvQpAttr::default();
        } else {
            apply_attr(&mut qp.attr, mask, attr);
        }
        D::on_modify(self, qpn, from, mask);
        let drained = !self.qps.get(qpn)?.tx.draining;
        if from == QpState::Rts
            && to == QpState::Sqd
            && mask & IV_QP_EN_SQD_ASYNC_NOTIFY != 0
            && attr.en_sqd_async_notify != 0
            && drained
        {
            self.raised = Some(AsyncEvent::SqDrained(qpn));
        }
        Ok(CommandOut::None)
    }

    /// `QueryQp`: the QP's current state, sizes and attributes.
    ///
    /// # Errors
    /// `STATUS_INVALID_HANDLE` for an unknown QPN.
    pub(crate) fn query_qp(&self, qpn: u32) -> Result<CommandOut, NtStatus> {
        let qp = self.qps.get(qpn)?;
        let mut attr = qp.attr;
        attr.qp_state = qp.state.to_abi();
        attr.cur_qp_state = qp.state.to_abi();
        attr.cap = qp.cap;
        attr.sq_draining = u8::from(qp.tx.draining);
        Ok(CommandOut::QpAttr(boxed(IvQueryQpOut {
            attr,
            qp_type: qp.qp_type,
            sq_sig_all: u32::from(qp.sq_sig_all),
            qpn,
            reserved: 0,
        })?))
    }

    /// `DestroyQp`, in any state.
    ///
    /// # Errors
    /// `STATUS_INVALID_HANDLE` for an unknown QPN.
    pub(crate) fn destroy_qp(&mut self, qpn: u32) -> Result<CommandOut, NtStatus> {
        let qp = self.qps.remove(qpn)?;
        self.rd_atom_reserved = self
            .rd_atom_reserved
            .saturating_sub(u32::from(qp.attr.max_dest_rd_atomic));
        self.doorbells
            .unbind(irpverbs_core::DoorbellTarget::Sq(qpn));
        self.doorbells
            .unbind(irpverbs_core::DoorbellTarget::Rq(qpn));
        if qp.state == QpState::Err {
            self.dp.unattend();
        }
        if qp.tx.resp.rnr_wait {
            self.dp.unattend();
        }
        // The data path's lists hold live QPs only: their room is
        // reserved per QP.
        let dp = &mut self.dp;
        if qp.tx.scheduled {
            dp.ready.retain(|&q| q != qpn);
        }
        if qp.tx.timed {
            dp.timed.retain(|&q| q != qpn);
        }
        dp.acks.retain(|&q| q != qpn);
        if let Some(srqn) = qp.srqn {
            self.srqs.get_mut(srqn)?.rnr_waiters.retain(|&q| q != qpn);
        }
        self.pds.get_mut(qp.pdn)?.refs.put();
        self.cqs.get_mut(qp.send_cqn)?.refs.put();
        self.cqs.get_mut(qp.recv_cqn)?.refs.put();
        if let Some(srqn) = qp.srqn {
            self.srqs.get_mut(srqn)?.refs.put();
        }
        let Qp { sq, rq, .. } = qp;
        self.rings.retire(sq);
        if let Some(rq) = rq {
            self.rings.retire(rq);
        }
        Ok(CommandOut::None)
    }
}

/// Whether `attr` has an alternate path loaded (its port is never 0 once
/// loaded; RESET clears it).
pub(crate) const fn alt_loaded(attr: &IvQpAttr) -> bool {
    attr.alt_port_num != 0
}

/// Makes the alternate path of `attr` its primary one (address vector,
/// port, P_Key index, ACK timeout) and the state MIGRATED; the alternate
/// path stays loaded.
pub(crate) fn migrate_attr(attr: &mut IvQpAttr) {
    attr.ah_attr = attr.alt_ah_attr;
    attr.port_num = attr.alt_port_num;
    attr.pkey_index = attr.alt_pkey_index;
    attr.timeout = attr.alt_timeout;
    attr.path_mig_state = IV_MIG_MIGRATED;
}

/// Copies the attributes in `mask` (but state and sizes) from `new` to
/// `attr`; a path migration state moves as [`Firmware::modify_qp`] says.
fn apply_attr(attr: &mut IvQpAttr, mask: u32, new: &IvQpAttr) {
    let has = |bit: u32| mask & bit != 0;
    if has(IV_QP_EN_SQD_ASYNC_NOTIFY) {
        attr.en_sqd_async_notify = new.en_sqd_async_notify;
    }
    if has(IV_QP_ACCESS_FLAGS) {
        attr.qp_access_flags = new.qp_access_flags;
    }
    if has(IV_QP_PKEY_INDEX) {
        attr.pkey_index = new.pkey_index;
    }
    if has(IV_QP_PORT) {
        attr.port_num = new.port_num;
    }
    if has(IV_QP_QKEY) {
        attr.qkey = new.qkey;
    }
    if has(IV_QP_AV) {
        attr.ah_attr = new.ah_attr;
    }
    if has(IV_QP_PATH_MTU) {
        attr.path_mtu = new.path_mtu;
    }
    if has(IV_QP_TIMEOUT) {
        attr.timeout = new.timeout;
    }
    if has(IV_QP_RETRY_CNT) {
        attr.retry_cnt = new.retry_cnt;
    }
    if has(IV_QP_RNR_RETRY) {
        attr.rnr_retry = new.rnr_retry;
    }
    if has(IV_QP_RQ_PSN) {
        attr.rq_psn = new.rq_psn;
    }
    if has(IV_QP_MAX_QP_RD_ATOMIC) {
        attr.max_rd_atomic = new.max_rd_atomic;
    }
    if has(IV_QP_MIN_RNR_TIMER) {
        attr.min_rnr_timer = new.min_rnr_timer;
    }
    if has(IV_QP_SQ_PSN) {
        attr.sq_psn = new.sq_psn;
    }
    if has(IV_QP_MAX_DEST_RD_ATOMIC) {
        attr.max_dest_rd_atomic = new.max_dest_rd_atomic;
    }
    if has(IV_QP_ALT_PATH) {
        attr.alt_ah_attr = new.alt_ah_attr;
        attr.alt_port_num = new.alt_port_num;
        attr.alt_pkey_index = new.alt_pkey_index;
        attr.alt_timeout = new.alt_timeout;
    }
    if has(IV_QP_PATH_MIG_STATE) {
        match new.path_mig_state {
            // Armed from MIGRATED: migrate now (the owner's manual
            // migration); from MIGRATED, nothing changes.
            IV_MIG_MIGRATED if attr.path_mig_state == IV_MIG_ARMED => migrate_attr(attr),
            IV_MIG_MIGRATED => {}
            // REARM: this HCA arms at once.
            _ => attr.path_mig_state = IV_MIG_ARMED,
        }
    }
    if has(IV_QP_DEST_QPN) {
        attr.dest_qp_num = new.dest_qp_num;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::firmware::port::PORT_NUM;
    use crate::tests::util::{Dev, av, bad_avs, cap};
    use alloc::vec::Vec;
    use irpverbs_abi::{
        IV_ACCESS_REMOTE_READ, IV_ACCESS_REMOTE_WRITE, IV_MIG_REARM, IV_MTU_4096,
        STATUS_DEVICE_BUSY,
    };
    use irpverbs_core::{Command, Event};

    use QpState::{Err as E, Init as I, Reset as R, Rtr as Rr, Rts as Rs, Sqd as D, Sqe as Q};

    fn modify(qpn: u32, from: QpState, mask: u32, attr: IvQpAttr) -> Command {
        Command::ModifyQp(ModifyQp {
            qpn,
            cur_state: from.to_abi(),
            mask,
            attr,
        })
    }

    fn to(state: QpState) -> IvQpAttr {
        IvQpAttr {
            qp_state: state.to_abi(),
            ..IvQpAttr::default()
        }
    }

    fn query(d: &Dev, qpn: u32) -> IvQueryQpOut {
        let CommandOut::QpAttr(q) = d.ok(Command::QueryQp { qpn }) else {
            panic!()
        };
        *q
    }

    fn force(d: &Dev, qpn: u32, state: QpState) {
        d.hca
            .with_firmware(|fw| fw.qps.get_mut(qpn).unwrap().state = state);
    }

    /// A device with a PD, a CQ and an RC QP in RESET.
    fn setup() -> (Dev, u32, u32, u32) {
        let d = Dev::inline();
        let pdn = d.pd();
        let cqn = d.cq(16);
        let qpn = d.qp(pdn, cqn, None);
        (d, pdn, cqn, qpn)
    }

    #[test]
    fn state_values_round_trip() {
        for (i, s) in QpState::ALL.iter().enumerate() {
            assert_eq!(s.to_abi(), i as u32);
            assert_eq!(QpState::from_abi(i as u32), Some(*s));
        }
        assert_eq!(QpState::from_abi(7), None);
        assert_eq!(QpState::from_abi(u32::MAX), None);
    }

    #[test]
    fn transition_table() {
        // Rows: from; columns: to; in the order R I Rr Rs D Q E.
        const T: bool = true;
        const F: bool = false;
        let table = [
            (R, [T, T, F, F, F, F, T]),
            (I, [T, T, T, F, F, F, T]),
            (Rr, [T, F, F, T, F, F, T]),
            (Rs, [T, F, F, T, T, F, T]),
            (D, [T, F, F, T, T, F, T]),
            (Q, [T, F, F, T, F, F, T]),
            (E, [T, F, F, F, F, F, T]),
        ];
        for (from, row) in table {
            for (to, allowed) in QpState::ALL.into_iter().zip(row) {
                assert_eq!(transition_allowed(from, to), allowed, "{from:?} -> {to:?}");
            }
        }
    }

    #[test]
    fn every_transition_through_the_firmware() {
        let (d, _, _, qpn) = setup();
        let mut allowed = 0;
        for from in QpState::ALL {
            for target in QpState::ALL {
                force(&d, qpn, from);
                for believed in QpState::ALL.into_iter().filter(|&b| b != from) {
                    d.fails(
                        modify(qpn, believed, IV_QP_STATE, to(target)),
                        STATUS_INVALID_DEVICE_STATE,
                    );
                }
                let cmd = modify(qpn, from, IV_QP_STATE, to(target));
                if transition_allowed(from, target) {
                    allowed += 1;
                    d.ok(cmd);
                    assert_eq!(query(&d, qpn).attr.qp_state, target.to_abi());
                } else {
                    d.fails(cmd, STATUS_INVALID_DEVICE_STATE);
                    assert_eq!(query(&d, qpn).attr.qp_state, from.to_abi());
                }
            }
        }
        assert_eq!(allowed, 23);
    }

    #[test]
    fn modify_without_state_stays() {
        let (d, _, _, qpn) = setup();
        d.ok(modify(qpn, R, IV_QP_STATE, to(I)));
        let attr = IvQpAttr {
            qkey: 0x1234,
            ..IvQpAttr::default()
        };
        d.ok(modify(qpn, I, IV_QP_QKEY, attr));
        let q = query(&d, qpn);
        assert_eq!((q.attr.qp_state, q.attr.qkey), (IV_QPS_INIT, 0x1234));
        d.ok(modify(qpn, I, IV_QP_STATE, to(Rr)));
        d.fails(
            modify(qpn, Rr, IV_QP_QKEY, attr),
            STATUS_INVALID_DEVICE_STATE,
        );
    }

    #[test]
    fn cur_state_attribute_must_match() {
        let (d, _, _, qpn) = setup();
        d.ok(modify(qpn, R, IV_QP_STATE, to(I)));
        let mut attr = to(Rr);
        attr.cur_qp_state = IV_QPS_RESET;
        d.fails(
            modify(qpn, I, IV_QP_STATE | IV_QP_CUR_STATE, attr),
            STATUS_INVALID_DEVICE_STATE,
        );
        attr.cur_qp_state = 9;
        d.fails(
            modify(qpn, I, IV_QP_STATE | IV_QP_CUR_STATE, attr),
            STATUS_INVALID_PARAMETER,
        );
        attr.cur_qp_state = IV_QPS_INIT;
        d.ok(modify(qpn, I, IV_QP_STATE | IV_QP_CUR_STATE, attr));
    }

    #[test]
    fn bad_state_values() {
        let (d, _, _, qpn) = setup();
        d.fails(
            Command::ModifyQp(ModifyQp {
                qpn,
                cur_state: 7,
                mask: IV_QP_STATE,
                attr: to(I),
            }),
            STATUS_INVALID_PARAMETER,
        );
        let mut attr = to(I);
        attr.qp_state = 7;
        d.fails(modify(qpn, R, IV_QP_STATE, attr), STATUS_INVALID_PARAMETER);
        d.fails(
            modify(qpn + 1, R, IV_QP_STATE, to(I)),
            STATUS_INVALID_HANDLE,
        );
        d.fails(modify(0, R, IV_QP_STATE, to(I)), STATUS_INVALID_HANDLE);
    }

    /// RESET -> INIT -> RTR -> RTS with every attribute an RC QP takes, at
    /// the edges of their ranges.
    fn connect(d: &Dev, qpn: u32) {
        let mut a = to(I);
        a.pkey_index = 0;
        a.port_num = 1;
        a.qp_access_flags = IV_ACCESS_REMOTE_WRITE | IV_ACCESS_REMOTE_READ;
        d.ok(modify(
            qpn,
            R,
            IV_QP_STATE | IV_QP_PKEY_INDEX | IV_QP_PORT | IV_QP_ACCESS_FLAGS,
            a,
        ));
        let mut a = to(Rr);
        a.ah_attr = av();
        a.path_mtu = IV_MTU_4096;
        a.dest_qp_num = MAX_QPN;
        a.rq_psn = MAX_PSN;
        a.max_dest_rd_atomic = 128;
        a.min_rnr_timer = 31;
        d.ok(modify(
            qpn,
            I,
            IV_QP_STATE
                | IV_QP_AV
                | IV_QP_PATH_MTU
                | IV_QP_DEST_QPN
                | IV_QP_RQ_PSN
                | IV_QP_MAX_DEST_RD_ATOMIC
                | IV_QP_MIN_RNR_TIMER,
            a,
        ));
        let mut a = to(Rs);
        a.timeout = 31;
        a.retry_cnt = 7;
        a.rnr_retry = 7;
        a.sq_psn = 0x12_3456;
        a.max_rd_atomic = 128;
        a.path_mig_state = IV_MIG_MIGRATED;
        d.ok(modify(
            qpn,
            Rr,
            IV_QP_STATE
                | IV_QP_TIMEOUT
                | IV_QP_RETRY_CNT
                | IV_QP_RNR_RETRY
                | IV_QP_SQ_PSN
                | IV_QP_MAX_QP_RD_ATOMIC
                | IV_QP_PATH_MIG_STATE,
            a,
        ));
    }

    #[test]
    fn connect_and_query() {
        let (d, _, _, qpn) = setup();
        connect(&d, qpn);
        let q = query(&d, qpn);
        assert_eq!(q.qpn, qpn);
        assert_eq!(q.qp_type, IV_QPT_RC);
        assert_eq!(q.sq_sig_all, 0);
        let a = q.attr;
        assert_eq!((a.qp_state, a.cur_qp_state), (IV_QPS_RTS, IV_QPS_RTS));
        assert_eq!(a.port_num, 1);
        assert_eq!(
            a.qp_access_flags,
            IV_ACCESS_REMOTE_WRITE | IV_ACCESS_REMOTE_READ
        );
        assert_eq!(a.ah_attr, av());
        assert_eq!(a.path_mtu, IV_MTU_4096);
        assert_eq!(a.dest_qp_num, MAX_QPN);
        assert_eq!(a.rq_psn, MAX_PSN);
        assert_eq!(a.sq_psn, 0x12_3456);
        assert_eq!((a.max_rd_atomic, a.max_dest_rd_atomic), (128, 128));
        assert_eq!((a.timeout, a.retry_cnt, a.rnr_retry), (31, 7, 7));
        assert_eq!(a.min_rnr_timer, 31);
        assert_eq!(a.sq_draining, 0);
        assert_eq!(
            a.cap,
            IvQpCap {
                max_send_wr: 31,
                max_recv_wr: 31,
                ..cap()
            }
        );
        assert!(d.take_events().is_empty());
    }

    #[test]
    fn error_keeps_attributes_and_reset_clears_them() {
        let (d, _, _, qpn) = setup();
        connect(&d, qpn);
        let connected = query(&d, qpn).attr;
        d.ok(modify(qpn, Rs, IV_QP_STATE, to(E)));
        let q = query(&d, qpn).attr;
        assert_eq!(q.qp_state, IV_QPS_ERR);
        assert_eq!(
            IvQpAttr {
                qp_state: connected.qp_state,
                cur_qp_state: connected.cur_qp_state,
                ..q
            },
            connected
        );
        d.ok(modify(qpn, E, IV_QP_STATE, to(R)));
        let q = query(&d, qpn).attr;
        assert_eq!(
            q,
            IvQpAttr {
                cap: connected.cap,
                ..to(R)
            }
        );
        connect(&d, qpn);
        assert_eq!(query(&d, qpn).attr, connected, "and it connects again");
    }

    #[test]
    fn sq_drained_event() {
        let (d, _, _, qpn) = setup();
        connect(&d, qpn);
        let mut a = to(D);
        a.en_sqd_async_notify = 1;
        d.ok(modify(qpn, Rs, IV_QP_STATE | IV_QP_EN_SQD_ASYNC_NOTIFY, a));
        assert_eq!(
            d.take_events(),
            [Event::Async(AsyncEvent::SqDrained(qpn))],
            "after the completion"
        );
        d.ok(modify(qpn, D, IV_QP_STATE, to(Rs)));
        d.ok(modify(qpn, Rs, IV_QP_STATE, to(D)));
        d.ok(modify(qpn, D, IV_QP_STATE, to(Rs)));
        a.en_sqd_async_notify = 0;
        d.ok(modify(qpn, Rs, IV_QP_STATE | IV_QP_EN_SQD_ASYNC_NOTIFY, a));
        assert!(d.take_events().is_empty(), "only when asked");
    }

    /// The alternate path: loaded and armed on an RTS QP (REARM reads
    /// ARMED), MIGRATED from ARMED makes it the primary (the transport's
    /// path too, with MigReq), MIGRATED again changes nothing.
    #[test]
    fn an_alternate_path_loads_arms_and_migrates() {
        let (d, _, _, qpn) = setup();
        connect(&d, qpn);
        let before = query(&d, qpn).attr;
        assert_eq!(before.path_mig_state, IV_MIG_MIGRATED);
        let mut alt_av = av();
        alt_av.dgid[15] ^= 1;
        let mut a = to(Rs);
        a.alt_ah_attr = alt_av;
        a.alt_port_num = PORT_NUM;
        a.alt_timeout = 9;
        a.path_mig_state = IV_MIG_REARM;
        d.ok(modify(
            qpn,
            Rs,
            IV_QP_STATE | IV_QP_ALT_PATH | IV_QP_PATH_MIG_STATE,
            a,
        ));
        let q = query(&d, qpn).attr;
        assert_eq!(q.path_mig_state, IV_MIG_ARMED);
        assert_eq!(
            (q.alt_ah_attr, q.alt_port_num, q.alt_timeout),
            (alt_av, 1, 9)
        );
        assert_eq!(q.ah_attr, before.ah_attr, "the primary is still the path");
        let path = |d: &Dev| d.hca.with_firmware(|fw| fw.qps.get(qpn).unwrap().tx.path);
        assert!(!path(&d).mig_req, "armed: MigReq clear");

        let mut m = to(Rs);
        m.path_mig_state = IV_MIG_MIGRATED;
        d.ok(modify(qpn, Rs, IV_QP_STATE | IV_QP_PATH_MIG_STATE, m));
        let q = query(&d, qpn).attr;
        assert_eq!(
            (q.path_mig_state, q.ah_attr, q.timeout),
            (IV_MIG_MIGRATED, alt_av, 9)
        );
        let p = path(&d);
        assert_eq!(p.dgid, alt_av.dgid);
        assert!(p.mig_req, "migrated: MigReq set");
        d.ok(modify(qpn, Rs, IV_QP_STATE | IV_QP_PATH_MIG_STATE, m));
        assert_eq!(query(&d, qpn).attr, q, "MIGRATED again: no change");
        // Armed again (the alternate path stays loaded).
        let mut r = to(Rs);
        r.path_mig_state = IV_MIG_ARMED;
        d.ok(modify(qpn, Rs, IV_QP_STATE | IV_QP_PATH_MIG_STATE, r));
        assert_eq!(query(&d, qpn).attr.path_mig_state, IV_MIG_ARMED);
        // RESET forgets it: nothing to arm.
        d.ok(modify(qpn, Rs, IV_QP_STATE, to(R)));
        connect(&d, qpn);
        d.fails(
            modify(qpn, Rs, IV_QP_STATE | IV_QP_PATH_MIG_STATE, r),
            STATUS_INVALID_DEVICE_STATE,
        );
    }

    #[test]
    fn attribute_values_are_checked() {
        let (d, _, _, qpn) = setup();
        d.ok(modify(qpn, R, IV_QP_STATE, to(I)));
        let mut cases: Vec<(u32, IvQpAttr, NtStatus)> = Vec::new();
        let mut case = |mask: u32, f: &dyn Fn(&mut IvQpAttr), status: NtStatus| {
            let mut a = to(I);
            f(&mut a);
            cases.push((mask, a, status));
        };
        let inval = STATUS_INVALID_PARAMETER;
        case(IV_QP_PATH_MTU, &|a| a.path_mtu = 0, inval);
        case(IV_QP_PATH_MTU, &|a| a.path_mtu = IV_MTU_4096 + 1, inval);
        case(IV_QP_PORT, &|a| a.port_num = 0, inval);
        case(IV_QP_PORT, &|a| a.port_num = 2, inval);
        case(IV_QP_PKEY_INDEX, &|a| a.pkey_index = 1, inval);
        case(IV_QP_RQ_PSN, &|a| a.rq_psn = MAX_PSN + 1, inval);
        case(IV_QP_SQ_PSN, &|a| a.sq_psn = MAX_PSN + 1, inval);
        case(IV_QP_DEST_QPN, &|a| a.dest_qp_num = MAX_QPN + 1, inval);
        case(IV_QP_RETRY_CNT, &|a| a.retry_cnt = 8, inval);
        case(IV_QP_RNR_RETRY, &|a| a.rnr_retry = 8, inval);
        case(IV_QP_MIN_RNR_TIMER, &|a| a.min_rnr_timer = 32, inval);
        case(IV_QP_TIMEOUT, &|a| a.timeout = 32, inval);
        case(IV_QP_MAX_QP_RD_ATOMIC, &|a| a.max_rd_atomic = 129, inval);
        case(
            IV_QP_MAX_DEST_RD_ATOMIC,
            &|a| a.max_dest_rd_atomic = 129,
            inval,
        );
        case(IV_QP_ACCESS_FLAGS, &|a| a.qp_access_flags = 1 << 5, inval);
        case(
            IV_QP_EN_SQD_ASYNC_NOTIFY,
            &|a| a.en_sqd_async_notify = 2,
            inval,
        );
        case(IV_QP_PATH_MIG_STATE, &|a| a.path_mig_state = 3, inval);
        // Nothing to arm.
        case(
            IV_QP_PATH_MIG_STATE,
            &|a| a.path_mig_state = IV_MIG_REARM,
            STATUS_INVALID_DEVICE_STATE,
        );
        case(
            IV_QP_PATH_MIG_STATE,
            &|a| a.path_mig_state = IV_MIG_ARMED,
            STATUS_INVALID_DEVICE_STATE,
        );
        // The alternate path, checked as the primary.
        let alt = |a: &mut IvQpAttr| {
            a.alt_ah_attr = av();
            a.alt_port_num = PORT_NUM;
        };
        case(
            IV_QP_ALT_PATH,
            &|a| {
                alt(a);
                a.alt_port_num = 2;
            },
            inval,
        );
        case(
            IV_QP_ALT_PATH,
            &|a| {
                alt(a);
                a.alt_pkey_index = 1;
            },
            inval,
        );
        case(
            IV_QP_ALT_PATH,
            &|a| {
                alt(a);
                a.alt_timeout = 32;
            },
            inval,
        );
        for bad in bad_avs() {
            case(
                IV_QP_ALT_PATH,
                &move |a| {
                    alt(a);
                    a.alt_ah_attr = bad;
                },
                inval,
            );
        }
        case(1 << 21, &|_| {}, inval);
        case(u32::MAX, &|_| {}, inval);
        case(0, &|a| a.reserved0 = 1, inval);
        case(0, &|a| a.reserved1 = 1, inval);
        let insuff = STATUS_INSUFFICIENT_RESOURCES;
        case(
            IV_QP_CAP,
            &|a| {
                a.cap = IvQpCap {
                    reserved: 1,
                    ..cap()
                }
            },
            inval,
        );
        case(
            IV_QP_CAP,
            &|a| {
                a.cap = IvQpCap {
                    max_send_wr: 0x4000,
                    ..cap()
                }
            },
            insuff,
        );
        case(
            IV_QP_CAP,
            &|a| {
                a.cap = IvQpCap {
                    max_recv_wr: 0x4000,
                    ..cap()
                }
            },
            insuff,
        );
        case(
            IV_QP_CAP,
            &|a| {
                a.cap = IvQpCap {
                    max_send_sge: 33,
                    ..cap()
                }
            },
            insuff,
        );
        case(
            IV_QP_CAP,
            &|a| {
                a.cap = IvQpCap {
                    max_recv_sge: 33,
                    ..cap()
                }
            },
            insuff,
        );
        case(
            IV_QP_CAP,
            &|a| {
                a.cap = IvQpCap {
                    max_inline_data: 401,
                    ..cap()
                }
            },
            insuff,
        );
        for bad in bad_avs() {
            cases.push((
                IV_QP_AV,
                IvQpAttr {
                    ah_attr: bad,
                    ..to(I)
                },
                inval,
            ));
        }
        for (mask, attr, status) in cases {
            d.fails(modify(qpn, I, IV_QP_STATE | mask, attr), status);
        }
        let q = query(&d, qpn).attr;
        assert_eq!(
            q,
            IvQpAttr {
                cur_qp_state: IV_QPS_INIT,
                cap: q.cap,
                ..to(I)
            },
            "all of that changed nothing"
        );
    }

    #[test]
    fn resize_work_queues() {
        let (d, pdn, cqn, qpn) = setup();
        let mut a = to(I);
        a.cap = IvQpCap {
            max_send_wr: 100,
            max_recv_wr: 0x3FFF,
            max_send_sge: 32,
            max_recv_sge: 0,
            max_inline_data: 400,
            reserved: 0,
        };
        d.ok(modify(qpn, R, IV_QP_STATE | IV_QP_CAP, a));
        assert_eq!(
            query(&d, qpn).attr.cap,
            IvQpCap {
                max_send_wr: 127,
                ..a.cap
            }
        );
        let srqn = d.srq(pdn);
        let with_srq = d.qp(pdn, cqn, Some(srqn));
        d.ok(modify(with_srq, R, IV_QP_STATE | IV_QP_CAP, a));
        assert_eq!(
            query(&d, with_srq).attr.cap,
            IvQpCap {
                max_send_wr: 127,
                max_recv_wr: 0,
                max_recv_sge: 0,
                ..a.cap
            },
            "an SRQ's QP has no receive queue"
        );
    }

    #[test]
    fn create_outputs() {
        let d = Dev::inline();
        let pdn = d.pd();
        let cqn = d.cq(1);
        let srqn = d.srq(pdn);
        let create = |qp_type, srqn, cap| {
            Command::CreateQp(CreateQp {
                pdn,
                qp_type,
                send_cqn: cqn,
                recv_cqn: cqn,
                srqn,
                sq_sig_all: true,
                cap,
            })
        };
        let CommandOut::Qp { qpn, cap: got, .. } = d.ok(create(IV_QPT_UD, None, cap())) else {
            panic!()
        };
        assert_eq!(
            got,
            IvQpCap {
                max_send_wr: 31,
                max_recv_wr: 31,
                ..cap()
            }
        );
        let q = query(&d, qpn);
        assert_eq!((q.qp_type, q.sq_sig_all), (IV_QPT_UD, 1));
        assert_eq!(q.attr, IvQpAttr { cap: got, ..to(R) });
        let CommandOut::Qp { cap: got, .. } = d.ok(create(IV_QPT_UC, Some(srqn), cap())) else {
            panic!()
        };
        assert_eq!(
            got,
            IvQpCap {
                max_send_wr: 31,
                max_recv_wr: 0,
                max_recv_sge: 0,
                ..cap()
            },
            "receive sizes are ignored with an SRQ"
        );
        let zero = IvQpCap::default();
        let CommandOut::Qp { cap: got, .. } = d.ok(create(IV_QPT_RC, None, zero)) else {
            panic!()
        };
        assert_eq!(got, zero);
        let max = IvQpCap {
            max_send_wr: 0x3FFF,
            max_recv_wr: 0x3FFF,
            max_send_sge: 32,
            max_recv_sge: 32,
            max_inline_data: 400,
            reserved: 0,
        };
        let CommandOut::Qp { cap: got, .. } = d.ok(create(IV_QPT_RC, None, max)) else {
            panic!()
        };
        assert_eq!(got, max);
        assert_eq!(d.hca.live_objects(), 3 + 4);
    }

    #[test]
    fn create_validation() {
        let d = Dev::with(|c| c.max_qp = 1);
        let pdn = d.pd();
        let other_pd = d.pd();
        let cqn = d.cq(1);
        let srqn = d.srq(pdn);
        let foreign_srq = d.srq(other_pd);
        let base = CreateQp {
            pdn,
            qp_type: IV_QPT_RC,
            send_cqn: cqn,
            recv_cqn: cqn,
            srqn: Some(srqn),
            sq_sig_all: false,
            cap: cap(),
        };
        let spoil = |f: fn(&mut CreateQp, u32)| {
            let mut i = base;
            f(&mut i, foreign_srq);
            Command::CreateQp(i)
        };
        let handle = STATUS_INVALID_HANDLE;
        let inval = STATUS_INVALID_PARAMETER;
        let insuff = STATUS_INSUFFICIENT_RESOURCES;
        let cases = [
            (spoil(|i, _| i.pdn = 0), handle),
            (spoil(|i, _| i.pdn = 99), handle),
            (spoil(|i, _| i.send_cqn = 99), handle),
            (spoil(|i, _| i.recv_cqn = 0), handle),
            (spoil(|i, _| i.srqn = Some(99)), handle),
            (spoil(|i, foreign| i.srqn = Some(foreign)), inval),
            (spoil(|i, _| i.qp_type = 0), inval),
            (spoil(|i, _| i.qp_type = 1), inval),
            (spoil(|i, _| i.qp_type = 5), inval),
            (spoil(|i, _| i.cap.reserved = 1), inval),
            (spoil(|i, _| i.cap.max_send_wr = 0x4000), insuff),
            (spoil(|i, _| i.cap.max_send_sge = 33), insuff),
            (spoil(|i, _| i.cap.max_inline_data = 401), insuff),
            (
                spoil(|i, _| {
                    i.srqn = None;
                    i.cap.max_recv_wr = 0x4000;
                }),
                insuff,
            ),
            (
                spoil(|i, _| {
                    i.srqn = None;
                    i.cap.max_recv_sge = 33;
                }),
                insuff,
            ),
        ];
        for (c, status) in cases {
            d.fails(c, status);
        }
        d.ok(Command::CreateQp(base));
        d.fails(Command::CreateQp(base), insuff);
    }

    #[test]
    fn qpns_are_24_bit_never_0_or_1_and_not_reused_at_once() {
        let (d, pdn, cqn, first) = setup();
        assert!(first >= 2);
        d.ok(Command::DestroyQp { qpn: first });
        let second = d.qp(pdn, cqn, None);
        assert_ne!(second, first, "not reused at once");
        // Wrap round the 24-bit space: skips 0, 1 and numbers in use.
        let kept = d.qp(pdn, cqn, None);
        d.hca.with_firmware(|fw| fw.qps.next = MAX_QPN);
        assert_eq!(d.qp(pdn, cqn, None), MAX_QPN);
        let wrapped = d.qp(pdn, cqn, None);
        assert_eq!(wrapped, FIRST_QPN, "wraps to 2: {first} was freed");
        assert_eq!(first, FIRST_QPN);
        let next = d.qp(pdn, cqn, None);
        assert!(next != second && next != kept && next > FIRST_QPN);
        assert_eq!(next, kept + 1, "skips {second} and {kept}, in use");
    }

    /// Destroying QPs empties their entries (no shift of the others): a
    /// destroyed number is gone, the rest stay found, its number can be
    /// taken again on the next trip round the space, the limit counts live
    /// QPs only, and the empty entries are compacted away when they are
    /// half of the table.
    #[test]
    fn destroyed_qps_leave_empty_entries_that_are_compacted() {
        let d = Dev::with(|c| c.max_qp = 300);
        let pdn = d.pd();
        let cqn = d.cq(1);
        let qpns: Vec<u32> = (0..300).map(|_| d.qp(pdn, cqn, None)).collect();
        for &q in qpns.iter().step_by(2) {
            d.ok(Command::DestroyQp { qpn: q });
        }
        let (len, entries) = d.hca.with_firmware(|fw| (fw.qps.len(), fw.qps.entries()));
        assert_eq!((len, entries), (150, 300), "150 empty entries kept");
        for (i, &q) in qpns.iter().enumerate() {
            let found = d.exec(Command::QueryQp { qpn: q }).0 == irpverbs_abi::STATUS_SUCCESS;
            assert_eq!(found, i % 2 == 1, "QP {q}");
        }
        // Room again below the limit; a destroyed number is taken again once
        // the numbers wrap round.
        d.hca.with_firmware(|fw| fw.qps.next = qpns[0]);
        assert_eq!(d.qp(pdn, cqn, None), qpns[0], "an empty entry reused");
        let entries = d.hca.with_firmware(|fw| fw.qps.entries());
        assert_eq!(entries, 300);
        // Destroying most of the rest compacts the table.
        for &q in qpns.iter().skip(1).step_by(2).take(100) {
            d.ok(Command::DestroyQp { qpn: q });
        }
        let (len, entries) = d.hca.with_firmware(|fw| (fw.qps.len(), fw.qps.entries()));
        assert_eq!(len, 51);
        assert!(entries < 300, "compacted: {entries} entries");
        for &q in qpns.iter().skip(201).step_by(2) {
            assert_eq!(
                d.exec(Command::QueryQp { qpn: q }).0,
                irpverbs_abi::STATUS_SUCCESS
            );
        }
    }

    /// The fast path's lookup of a QP and the QP its path names: both, in
    /// either table order; nothing for a missing or destroyed peer, or a
    /// QP that names itself.
    #[test]
    fn with_dest_mut_and_with_peer_mut_find_the_qp_and_its_peer() {
        let d = Dev::with(|_| {});
        let pdn = d.pd();
        let cqn = d.cq(1);
        let (a, b, c) = (
            d.qp(pdn, cqn, None),
            d.qp(pdn, cqn, None),
            d.qp(pdn, cqn, None),
        );
        d.hca.with_firmware(|fw| {
            let name = |fw: &mut Firmware, q: u32, dest: u32| {
                fw.qps.get_mut(q).unwrap().tx.path.dest_qpn = dest;
            };
            name(fw, a, c);
            name(fw, c, a);
            let (x, y) = fw.qps.with_dest_mut(a).expect("a and c");
            assert_eq!((x.tx.path.dest_qpn, y.tx.path.dest_qpn), (c, a));
            let (x, y) = fw.qps.with_dest_mut(c).expect("c and a");
            assert_eq!((x.tx.path.dest_qpn, y.tx.path.dest_qpn), (a, c));
            name(fw, b, b);
            assert!(fw.qps.with_dest_mut(b).is_none(), "names itself");
            name(fw, b, 0xAB_CDEF);
            assert!(fw.qps.with_dest_mut(b).is_none(), "no such peer");
            assert!(fw.qps.with_dest_mut(0xAB_CDEE).is_none(), "no such QP");
            // The requester's lookup: the peer only when asked for.
            let both = |fw: &mut Firmware, q: u32, local: bool| {
                let (x, y) = fw.qps.with_peer_mut(q, |_| local).expect("the QP");
                (x.tx.path.dest_qpn, y.map(|y| y.tx.path.dest_qpn))
            };
            assert_eq!(both(fw, b, true), (0xAB_CDEF, None), "no such peer");
            name(fw, b, b);
            assert_eq!(both(fw, b, true), (b, None), "names itself");
            assert_eq!(both(fw, a, true), (c, Some(a)), "a and c");
            assert_eq!(both(fw, c, true), (a, Some(c)), "c and a");
            assert_eq!(both(fw, a, false), (c, None), "not asked for");
            assert!(fw.qps.with_peer_mut(0xAB_CDEE, |_| true).is_none());
        });
        d.ok(Command::DestroyQp { qpn: c });
        d.hca.with_firmware(|fw| {
            assert!(fw.qps.with_dest_mut(a).is_none(), "peer destroyed");
            let (_, y) = fw.qps.with_peer_mut(a, |_| true).expect("a");
            assert!(y.is_none(), "peer destroyed");
        });
    }

    /// Lookups stay right when the entries their hints point at move: an
    /// insert before them (after the numbers wrap) and a compaction.
    #[test]
    fn lookup_hints_follow_entries_that_move() {
        let d = Dev::with(|c| c.max_qp = 300);
        let pdn = d.pd();
        let cqn = d.cq(1);
        let qpns: Vec<u32> = (0..200).map(|_| d.qp(pdn, cqn, None)).collect();
        let found = |q: u32| d.exec(Command::QueryQp { qpn: q }).0 == irpverbs_abi::STATUS_SUCCESS;
        assert!(found(qpns[150]) && found(qpns[199]), "hints set");
        // A QP numbered below all of them: every entry moves one place.
        d.ok(Command::DestroyQp { qpn: qpns[0] });
        for &q in &qpns[1..100] {
            d.ok(Command::DestroyQp { qpn: q });
        }
        assert!(found(qpns[150]) && found(qpns[199]), "after compaction");
        d.hca.with_firmware(|fw| fw.qps.next = qpns[0]);
        assert_eq!(d.qp(pdn, cqn, None), qpns[0]);
        for &q in &qpns[100..] {
            assert!(found(q), "QP {q}");
        }
        assert!(found(qpns[0]));
        assert!(!found(qpns[1]), "destroyed");
    }

    #[test]
    fn qp_limit() {
        let d = Dev::with(|c| c.max_qp = 3);
        let pdn = d.pd();
        let cqn = d.cq(1);
        let qpns: Vec<u32> = (0..3).map(|_| d.qp(pdn, cqn, None)).collect();
        assert!(qpns.iter().all(|&q| (2..=MAX_QPN).contains(&q)));
        d.fails(
            Command::CreateQp(CreateQp {
                pdn,
                qp_type: IV_QPT_RC,
                send_cqn: cqn,
                recv_cqn: cqn,
                srqn: None,
                sq_sig_all: false,
                cap: cap(),
            }),
            STATUS_INSUFFICIENT_RESOURCES,
        );
        d.ok(Command::DestroyQp { qpn: qpns[1] });
        d.qp(pdn, cqn, None);
    }

    /// Every allocation `CreateQp` and `QueryQp` make can fail: the command
    /// then fails with `STATUS_INSUFFICIENT_RESOURCES` and changes nothing,
    /// and the HCA goes on working.
    #[test]
    fn create_and_query_fail_cleanly_at_every_allocation() {
        let d = Dev::inline();
        let pdn = d.pd();
        let cqn = d.cq(1);
        let create = |srqn| {
            Command::CreateQp(CreateQp {
                pdn,
                qp_type: IV_QPT_RC,
                send_cqn: cqn,
                recv_cqn: cqn,
                srqn,
                sq_sig_all: false,
                cap: cap(),
            })
        };
        // A QP created and destroyed leaves its rings in the pool, so that
        // the sweep's creates reuse them: allocating a new ring's `Arc` is
        // the ring crate's and cannot fail cleanly on stable Rust.
        let first = d.qp(pdn, cqn, None);
        let live = d.qp(pdn, cqn, None);
        d.ok(Command::DestroyQp { qpn: first });
        let destroy = |d: &Dev, out| {
            let CommandOut::Qp { qpn, .. } = out else {
                panic!("{out:?}")
            };
            d.ok(Command::DestroyQp { qpn });
        };
        let runs = d.sweep(&create(None), destroy);
        assert!(
            runs >= 3,
            "the transport state, its box and the QP's: {runs}"
        );
        let srqn = d.srq(pdn);
        d.ok(Command::DestroyQp {
            qpn: d.qp(pdn, cqn, Some(srqn)),
        });
        assert!(d.sweep(&create(Some(srqn)), destroy) >= 3);
        let runs = d.sweep(&Command::QueryQp { qpn: live }, |_, out| {
            assert!(matches!(out, CommandOut::QpAttr(_)));
        });
        assert_eq!(runs, 1, "the attributes' box");
        connect(&d, live);
        assert_eq!(query(&d, live).attr.qp_state, IV_QPS_RTS, "still working");
    }

    /// A create reserves the QP's room in the data path's lists of QPs
    /// (ready, timed, ACKs to send, RNR waiters of its SRQ), so that the
    /// data path only pushes into room; a destroy takes the QP off them.
    #[test]
    fn create_reserves_room_in_the_data_paths_lists() {
        let d = Dev::inline();
        let pdn = d.pd();
        let cqn = d.cq(1);
        let srqn = d.srq(pdn);
        let qpns: Vec<u32> = (0..5).map(|_| d.qp(pdn, cqn, Some(srqn))).collect();
        d.hca.with_firmware(|fw| {
            let dp = &fw.dp;
            assert!(dp.ready.capacity() >= 5, "{}", dp.ready.capacity());
            assert!(dp.timed.capacity() >= 5 && dp.acks.capacity() >= 5);
            assert!(dp.cq_errors.capacity() >= 1);
            assert!(fw.srqs.get(srqn).unwrap().rnr_waiters.capacity() >= 5);
            let ((), allocated) = irpverbs_failalloc::counting(|| {
                for &q in &qpns {
                    let qp = fw.qps.get_mut(q).unwrap();
                    fw.dp.schedule(q, &mut qp.tx);
                    fw.dp.time(q, &mut qp.tx);
                    assert!(crate::firmware::shared::push(&mut fw.dp.acks, q));
                    let srq = fw.srqs.get_mut(srqn).unwrap();
                    assert!(crate::firmware::shared::push(&mut srq.rnr_waiters, q));
                }
            });
            assert_eq!(allocated, 0, "every QP fits");
            assert_eq!((fw.dp.ready.len(), fw.dp.timed.len()), (5, 5));
        });
        d.ok(Command::DestroyQp { qpn: qpns[2] });
        d.hca.with_firmware(|fw| {
            assert!(!fw.dp.ready.contains(&qpns[2]));
            assert!(!fw.dp.timed.contains(&qpns[2]));
            assert!(!fw.dp.acks.contains(&qpns[2]));
            let srq = fw.srqs.get(srqn).unwrap();
            assert!(!srq.rnr_waiters.contains(&qpns[2]));
        });
    }

    #[test]
    fn destroy_releases_everything() {
        let d = Dev::inline();
        let pdn = d.pd();
        let scq = d.cq(1);
        let rcq = d.cq(1);
        let srqn = d.srq(pdn);
        let qpn = d.qp_with(pdn, scq, rcq, Some(srqn));
        connect(&d, qpn);
        for busy in [
            Command::DeallocPd { pdn },
            Command::DestroyCq { cqn: scq },
            Command::DestroyCq { cqn: rcq },
            Command::DestroySrq { srqn },
        ] {
            d.fails(busy, STATUS_DEVICE_BUSY);
        }
        d.ok(Command::DestroyQp { qpn });
        d.fails(Command::DestroyQp { qpn }, STATUS_INVALID_HANDLE);
        d.fails(Command::QueryQp { qpn }, STATUS_INVALID_HANDLE);
        d.ok(Command::DestroySrq { srqn });
        d.ok(Command::DestroyCq { cqn: scq });
        d.ok(Command::DestroyCq { cqn: rcq });
        d.ok(Command::DeallocPd { pdn });
        assert_eq!(d.hca.live_objects(), 0);
    }

    #[test]
    fn mtu_below_the_port_max() {
        let (d, _, _, qpn) = setup();
        d.ok(modify(qpn, R, IV_QP_STATE, to(I)));
        for mtu in 1..=IV_MTU_4096 {
            let mut a = to(I);
            a.path_mtu = mtu;
            d.ok(modify(qpn, I, IV_QP_STATE | IV_QP_PATH_MTU, a));
        }
        assert_eq!(query(&d, qpn).attr.path_mtu, IV_MTU_4096);
    }
}
