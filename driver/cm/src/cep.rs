//! Connection endpoints and their table.
//!
//! The table is a slab of slots in fixed chunks (it never moves a CEP or
//! copies the whole table to grow). A CEP's local communication ID is its
//! slot index (24 bits) and the slot's generation (8 bits), XORed with the
//! engine's seed: looking an ID up is an index and a generation check.
//! Freed slots are reused oldest first, once 1024 are free, and their
//! generation is bumped, so an ID comes back only after its slot has been
//! reused 256 times, each time after at least 1024 other allocations; the seed makes IDs differ
//! between engine instances (a restarted host does not reuse its previous
//! life's IDs).

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::vec::Vec;

use crate::event::Queue;
use crate::msg::{Path, TransportType};
use crate::types::{CepId, LapState, MadAddr, Nanos, State};

/// Most CEPs an engine can hold: the 24-bit index space.
pub const MAX_CEPS: u32 = 1 << 24;

const CHUNK: usize = 1024;
/// A freed slot is reused only once this many are free (or the table is
/// full): a local ID then waits at least this many allocations before its
/// slot comes back, and 256 times that before the ID itself does.
const REUSE_AFTER: usize = 1024;
const INDEX_MASK: u32 = MAX_CEPS - 1;

/// The CEP is in `Engine::by_remote`.
pub(crate) const IN_REMOTE: u16 = 1 << 0;
/// The CEP is in `Engine::by_qpn`.
pub(crate) const IN_QPN: u16 = 1 << 1;
/// The CEP is in `Engine::peers`.
pub(crate) const IN_PEER: u16 = 1 << 2;
/// The CEP is in `Engine::listens`.
pub(crate) const IN_LISTEN: u16 = 1 << 3;
/// The CEP is in `Engine::sidr`.
pub(crate) const IN_SIDR: u16 = 1 << 4;
/// Destroyed by its owner, kept until its time wait ends.
pub(crate) const ORPHAN: u16 = 1 << 5;
/// Events are queued and the owner was signaled (re-armed when it polls
/// the queue empty).
pub(crate) const SIGNALED: u16 = 1 << 6;
/// In the engine's ready queue.
pub(crate) const QUEUED: u16 = 1 << 7;
/// The QP parameters are complete (REP received, or accepted).
pub(crate) const CONN_READY: u16 = 1 << 8;
/// The last LAP received was answered with an APR (resent on a
/// duplicate LAP).
pub(crate) const APR_SENT: u16 = 1 << 9;

/// What the QP needs from the connection, from this side's view.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Conn {
    pub transport: Option<TransportType>,
    pub local_qpn: u32,
    pub remote_qpn: u32,
    /// This side's starting send PSN.
    pub sq_psn: u32,
    /// The remote's starting send PSN: this side's receive PSN.
    pub rq_psn: u32,
    pub pkey: u16,
    pub mtu: u8,
    /// Responder resources this side offers (its max_dest_rd_atomic).
    pub rr: u8,
    /// Initiator depth this side wants.
    pub id: u8,
    /// The remote's responder resources.
    pub peer_rr: u8,
    /// The remote's initiator depth.
    pub peer_id: u8,
    pub retry_count: u8,
    /// The RNR retry count this side's QP uses (the remote asked for it).
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub flow_control: bool,
    pub srq: bool,
    /// Primary path, local = this side.
    pub primary: Path,
    /// Alternate path, local = this side.
    pub alternate: Option<Path>,
}

/// A connection endpoint.
#[derive(Debug)]
pub(crate) struct Cep {
    pub id: CepId,
    pub state: State,
    pub lap: LapState,
    pub flags: u16,
    /// Retransmissions left for the message awaiting an answer.
    pub retries: u8,
    /// Max CM retries of the connection.
    pub max_retries: u8,
    /// How long the remote takes to answer this side's messages (5-bit
    /// exponent).
    pub resp_timeout: u8,
    /// How long this side takes to answer (advertised).
    pub local_resp_timeout: u8,
    /// The status of the last APR sent.
    pub apr_status: u8,
    pub remote_id: u32,
    pub context: u64,
    pub remote_ca_guid: u64,
    pub service_id: u64,
    /// The transaction of the connection (REQ, MRA, REP, RTU, REJ).
    pub tid: u64,
    /// The transaction of the last DREQ, LAP or SIDR exchange.
    pub aux_tid: u64,
    /// The armed deadline, 0 for none.
    pub deadline: Nanos,
    /// The remote CM's address.
    pub addr: MadAddr,
    pub conn: Conn,
    /// The last MAD sent that may be sent again: retransmitted on timeout
    /// or answered again on a duplicate.
    /// (Allocated fallibly: when refused, the MAD is sent but not kept.)
    pub sent: Option<Box<[u8]>>,
    /// Private data of the last RTU or DREP sent, when not all zero: they
    /// are rebuilt to answer duplicates (allocated fallibly: when refused,
    /// a duplicate is answered with zeros).
    pub pdata: Option<Box<[u8]>>,
    /// An alternate path being loaded (LAP sent or received), this side's
    /// view.
    /// (Allocated fallibly: see [`crate::fallible::try_box_slice`].)
    pub alt_pending: Option<Box<[Path]>>,
    pub events: Queue,
}

impl Cep {
    fn new(id: CepId, context: u64) -> Self {
        Self {
            id,
            state: State::Idle,
            lap: LapState::Idle,
            flags: 0,
            retries: 0,
            max_retries: 0,
            resp_timeout: 0,
            local_resp_timeout: 0,
            apr_status: 0,
            remote_id: 0,
            context,
            remote_ca_guid: 0,
            service_id: 0,
            tid: 0,
            aux_tid: 0,
            deadline: 0,
            addr: MadAddr::default(),
            conn: Conn::default(),
            sent: None,
            pdata: None,
            alt_pending: None,
            events: Queue::default(),
        }
    }

    pub(crate) fn has(&self, flag: u16) -> bool {
        self.flags & flag != 0
    }

    /// Keeps the private data of an RTU or DREP sent, to build it again
    /// for a duplicate (nothing kept when it is all zero).
    pub(crate) fn keep_pdata(&mut self, pd: &[u8]) {
        self.pdata = if pd.iter().any(|&b| b != 0) {
            crate::fallible::try_box_slice(pd)
        } else {
            None
        };
    }

    /// The kept private data, zero-padded.
    pub(crate) fn kept_pdata<const N: usize>(&self) -> [u8; N] {
        let mut out = [0; N];
        if let Some(pd) = self.pdata.as_deref() {
            let n = pd.len().min(N);
            out[..n].copy_from_slice(&pd[..n]);
        }
        out
    }

    /// Ends an alternate path load, if one was in progress.
    pub(crate) fn end_lap(&mut self) {
        self.lap = LapState::Idle;
        self.alt_pending = None;
    }
}

#[derive(Debug, Default)]
struct Slot {
    gen_: u8,
    cep: Option<Cep>,
}

/// The CEP table.
pub(crate) struct Table {
    chunks: Vec<Box<[Slot]>>,
    /// Slots ever used.
    used: u32,
    free: VecDeque<u32>,
    live: u32,
    max: u32,
    seed: u32,
}

impl Table {
    pub(crate) fn new(max: u32, seed: u32) -> Self {
        Self {
            chunks: Vec::new(),
            used: 0,
            free: VecDeque::new(),
            live: 0,
            max: max.clamp(1, MAX_CEPS),
            seed,
        }
    }

    /// Back to a table no CEP was ever taken from, keeping its memory
    /// (the chunks stay; the slots ever used are cleared).
    pub(crate) fn reset(&mut self) {
        for idx in 0..self.used {
            if let Some(slot) = self.slot_mut(idx) {
                *slot = Slot::default();
            }
        }
        self.used = 0;
        self.free.clear();
        self.live = 0;
    }

    fn id_of(&self, idx: u32, gen_: u8) -> u32 {
        ((u32::from(gen_) << 24) | idx) ^ self.seed
    }

    fn slot(&self, idx: u32) -> Option<&Slot> {
        let i = idx as usize;
        self.chunks.get(i / CHUNK)?.get(i % CHUNK)
    }

    fn slot_mut(&mut self, idx: u32) -> Option<&mut Slot> {
        let i = idx as usize;
        self.chunks.get_mut(i / CHUNK)?.get_mut(i % CHUNK)
    }

    /// A new CEP in `Idle`, or `None` when the table is full or the memory
    /// for a new chunk of slots is refused.
    pub(crate) fn alloc(&mut self, context: u64) -> Option<(u32, CepId)> {
        let reuse = self.free.len() >= REUSE_AFTER || self.used >= self.max;
        let idx = if reuse && let Some(idx) = self.free.pop_front() {
            idx
        } else if self.used < self.max {
            // A new chunk when the slots run out (after a reset the chunks
            // are there already).
            if self.used as usize / CHUNK >= self.chunks.len() {
                // A new chunk, its room in the chunk list and in the free
                // list (so that `free` never allocates): all or nothing.
                let mut chunk = Vec::new();
                if chunk.try_reserve_exact(CHUNK).is_err()
                    || self.chunks.try_reserve(1).is_err()
                    || self
                        .free
                        .try_reserve((self.used as usize + CHUNK).saturating_sub(self.free.len()))
                        .is_err()
                {
                    return None;
                }
                chunk.extend((0..CHUNK).map(|_| Slot::default()));
                self.chunks.push(chunk.into_boxed_slice());
            }
            self.used += 1;
            self.used - 1
        } else {
            return None;
        };
        let seed = self.seed;
        let slot = self.slot_mut(idx)?;
        // ID 0 means "none" in REJ and MRA: skip the generation that
        // would give it.
        if ((u32::from(slot.gen_) << 24) | idx) ^ seed == 0 {
            slot.gen_ = slot.gen_.wrapping_add(1);
        }
        let id = CepId(((u32::from(slot.gen_) << 24) | idx) ^ seed);
        slot.cep = Some(Cep::new(id, context));
        self.live += 1;
        Some((idx, id))
    }

    /// Frees the CEP at `idx`: its ID stops resolving. Never allocates (the
    /// free list has room for every slot).
    pub(crate) fn free(&mut self, idx: u32) {
        if let Some(slot) = self.slot_mut(idx)
            && slot.cep.take().is_some()
        {
            slot.gen_ = slot.gen_.wrapping_add(1);
            self.live -= 1;
            self.free.push_back(idx);
        }
    }

    /// The slot index of a live CEP's ID.
    pub(crate) fn lookup(&self, id: CepId) -> Option<u32> {
        let raw = id.0 ^ self.seed;
        let idx = raw & INDEX_MASK;
        let slot = self.slot(idx)?;
        (slot.cep.is_some() && self.id_of(idx, slot.gen_) == id.0).then_some(idx)
    }

    pub(crate) fn get(&self, idx: u32) -> Option<&Cep> {
        self.slot(idx)?.cep.as_ref()
    }

    pub(crate) fn get_mut(&mut self, idx: u32) -> Option<&mut Cep> {
        self.slot_mut(idx)?.cep.as_mut()
    }

    /// Live CEPs.
    pub(crate) fn live(&self) -> u32 {
        self.live
    }

    /// Bytes of one slot.
    pub(crate) const SLOT_SIZE: usize = size_of::<Slot>();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_resolve_until_freed_and_do_not_come_back_soon() {
        let mut t = Table::new(4, 0x5A5A_1234);
        let (a, ida) = t.alloc(1).unwrap();
        let (b, idb) = t.alloc(2).unwrap();
        assert_ne!(ida, idb);
        assert_eq!(t.lookup(ida), Some(a));
        assert_eq!(t.lookup(idb), Some(b));
        t.free(a);
        assert_eq!(t.lookup(ida), None);
        // The freed slot is reused last: the two never-used slots first.
        let (c, _) = t.alloc(3).unwrap();
        let (d, _) = t.alloc(4).unwrap();
        assert!(c != a && d != a);
        let (e, ide) = t.alloc(5).unwrap();
        assert_eq!(e, a);
        assert_ne!(ide, ida, "a reused slot has a new generation");
        assert!(t.alloc(6).is_none(), "full");
        assert_eq!(t.live(), 4);
    }

    #[test]
    fn a_slot_gives_256_distinct_ids_and_never_zero() {
        for seed in [0, 1, 0xFFFF_FFFF, 0x0100_0000] {
            let mut t = Table::new(1, seed);
            let mut seen = alloc::collections::BTreeSet::new();
            for _ in 0..256 {
                let (i, id) = t.alloc(0).unwrap();
                assert_ne!(id.0, 0);
                seen.insert(id);
                t.free(i);
            }
            assert!(seen.len() >= 255, "seed {seed:#x}: {}", seen.len());
        }
    }

    #[test]
    fn foreign_ids_do_not_resolve() {
        let mut t = Table::new(8, 7);
        let (_, id) = t.alloc(0).unwrap();
        assert_eq!(
            t.lookup(CepId(id.0 ^ 0x0100_0000)),
            None,
            "other generation"
        );
        assert_eq!(t.lookup(CepId(id.0 ^ 0x0000_0005)), None, "unused slot");
        assert_eq!(t.lookup(CepId(0x00FF_FFFF ^ 7)), None, "beyond the table");
    }
}
