//! The sans-IO CM engine: the CEP table, the lookups, the state machine.
//!
//! Inputs: received MADs ([`Engine::receive`]), the owner's calls
//! (`create`, `listen`, `connect`, `accept`, `reject`, `mra`, `rtu`,
//! `disconnect`, `drep`, `load_alternate_path`, `apr`, `sidr_request`,
//! `sidr_reply`, `destroy`) and the clock ([`Engine::on_timer`]).
//! Outputs: MADs to send ([`Engine::poll_transmit`]), CEPs with events
//! ([`Engine::poll_ready`]) and their events ([`Engine::poll_event`]), and
//! the next deadline ([`Engine::next_deadline`]).

mod api;
mod recv;
mod timer;

use alloc::collections::VecDeque;

use crate::fallible::{SlabMap, VecMap};

/// Transmits one CEP may have queued at once (its MAD and an answer to
/// a duplicate), reserved when it is made.
const TX_PER_CEP: usize = 2;

/// Transmits queued at once that belong to no CEP (answers to MADs for
/// unknown connections), taken when the engine is made.
const TX_SHARED: usize = 16;

/// The transmit queue with its shared room (answers that belong to no
/// CEP: a REJ or DREP to an unknown connection, ClassPortInfo). Refused,
/// the engine starts without it: those answers are dropped (as the wire
/// may drop them) until CEPs bring room.
fn shared_tx() -> VecDeque<Transmit> {
    let mut tx = VecDeque::new();
    let _ = tx.try_reserve_exact(TX_SHARED);
    tx
}

/// Events one CEP may have queued for its owner (a connection's REP,
/// established, DREQ, DREP and time wait; a listener's requests are
/// counted on the CEPs they made), reserved when it is made.
const EVENTS_PER_CEP: usize = 4;
use core::fmt;

use crate::Gid;

/// The GID a listener on any of the device's GIDs is keyed by.
pub const ANY_GID: Gid = [0; 16];
use crate::cep::{
    CONN_READY, Cep, IN_LISTEN, IN_PEER, IN_QPN, IN_REMOTE, IN_SIDR, MAX_CEPS, ORPHAN, QUEUED,
    SIGNALED, Table,
};
use crate::event::{Event, Events};
use crate::msg::{CmMsg, Info, MAD_SIZE, Mad, REJ_PDATA, Rej, RejReason, RejectedMsg};
use crate::qp::{self, QpModify, QpTarget};
use crate::types::{CepId, LapState, MadAddr, Nanos, State, Transmit, cm_time};

/// The largest timeout exponent the engine takes from a remote CM (its
/// response timeouts, an MRA's service timeout, the path's local ACK
/// timeout): 4.096 us * 2^24, about 69 s.
pub const MAX_REMOTE_EXP: u8 = 24;

/// The engine's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// This CA's GUID (the node GUID): sent in REQ and REP, and the ARI of
    /// a timeout REJ.
    pub ca_guid: u64,
    /// XORed into every local communication ID: take it from a random
    /// source when the driver loads, so that IDs differ from the last
    /// run's.
    pub id_seed: u32,
    /// Most CEPs at once (at most 2^24).
    pub max_ceps: u32,
    /// Least time wait. The time wait is the primary path's local ACK
    /// timeout (the longest a stale packet of the QP may live) or this,
    /// whichever is longer.
    pub min_timewait: Nanos,
    /// RespTimeValue of this CM's ClassPortInfo (5 bits).
    pub resp_time_value: u8,
}

impl Config {
    /// A configuration for the CA `ca_guid`: seed 0, 2^24 CEPs, no time
    /// wait floor, RespTimeValue 18 (about 1 s).
    #[must_use]
    pub const fn new(ca_guid: u64) -> Self {
        Self {
            ca_guid,
            id_seed: 0,
            max_ceps: MAX_CEPS,
            min_timewait: 0,
            resp_time_value: 18,
        }
    }
}

/// Counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// MADs received and parsed.
    pub received: u64,
    /// MADs dropped by the parser.
    pub malformed: u64,
    /// MADs that matched no CEP or came in a state that ignores them.
    pub unmatched: u64,
    /// Duplicates answered or ignored (REQ, REP, DREQ, LAP, MRA,
    /// SIDR_REQ).
    pub duplicates: u64,
    /// MADs queued to send.
    pub sent: u64,
    /// Retransmissions after a timeout.
    pub retransmits: u64,
    /// Exchanges that gave up.
    pub timeouts: u64,
    /// REJs sent.
    pub rejects: u64,
    /// Stale connections detected.
    pub stale: u64,
    /// Events dropped past the room reserved for them.
    pub events_dropped: u64,
    /// MADs dropped past the room reserved for them.
    pub tx_dropped: u64,
}

/// Why a call was refused. Nothing changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CmError {
    /// No such CEP (never created, destroyed, or a stale ID).
    UnknownCep,
    /// The call does not apply in the CEP's state.
    InvalidState(State),
    /// A parameter is out of range (named).
    InvalidParam(&'static str),
    /// The service ID is already listened on.
    ServiceInUse,
    /// The CEP table is full.
    TableFull,
}

impl fmt::Display for CmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CmError::UnknownCep => f.write_str("unknown CEP"),
            CmError::InvalidState(s) => write!(f, "not valid in state {s:?}"),
            CmError::InvalidParam(p) => write!(f, "invalid parameter: {p}"),
            CmError::ServiceInUse => f.write_str("service ID already listened on"),
            CmError::TableFull => f.write_str("CEP table full"),
        }
    }
}

/// Memory the engine uses, by part (bytes; the maps' nodes are estimated
/// from their entry counts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Footprint {
    /// Live CEPs.
    pub ceps: u32,
    /// Bytes of one CEP slot.
    pub slot_bytes: usize,
    /// Entries in the ordered maps (remote ID, remote QPN, listens, peers,
    /// SIDR, timers).
    pub map_entries: usize,
    /// Events queued.
    pub events: usize,
    /// Bytes of one queued event.
    pub event_bytes: usize,
    /// MADs waiting in the transmit queue.
    pub transmits: usize,
}

/// The connection manager of one CA.
pub struct Engine {
    cfg: Config,
    table: Table,
    /// (remote CA GUID, remote communication ID) -> CEP: duplicate REQs,
    /// REJ by ARI.
    by_remote: VecMap<(u64, u32), u32>,
    /// (remote CA GUID, remote QPN) -> CEP: stale connections.
    by_qpn: VecMap<(u64, u32), u32>,
    /// (service ID, GID) -> listening CEP: REQs for the service ID whose
    /// primary path names that GID as the passive side's; the all-zero GID
    /// ([`ANY_GID`]) takes any the others do not.
    listens: VecMap<(u64, Gid), u32>,
    /// (service ID, remote port GID, CEP) of peer-to-peer connects.
    peers: VecMap<(u64, Gid, u32), ()>,
    /// (remote port GID, request ID) -> CEP answering a SIDR_REQ.
    sidr: VecMap<(Gid, u32), u32>,
    /// (deadline, CEP).
    timers: SlabMap<(Nanos, u32), ()>,
    events: Events,
    ready: VecDeque<CepId>,
    tx: VecDeque<Transmit>,
    tid_seq: u32,
    stats: Stats,
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("cfg", &self.cfg)
            .field("ceps", &self.table.live())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// A REJ for the CEP's connection, without private data.
pub(crate) fn rej_of(c: &Cep, msg: RejectedMsg, reason: RejReason, ari: &[u8]) -> Rej {
    Rej {
        local_comm_id: c.id.0,
        remote_comm_id: c.remote_id,
        msg_rejected: msg,
        reason,
        ari: Info::new(ari).unwrap_or_default(),
        private_data: [0; REJ_PDATA],
    }
}

/// Zero-pads `pd` to the message's private data size.
pub(crate) fn pad<const N: usize>(pd: &[u8], what: &'static str) -> Result<[u8; N], CmError> {
    let mut out = [0; N];
    out.get_mut(..pd.len())
        .ok_or(CmError::InvalidParam(what))?
        .copy_from_slice(pd);
    Ok(out)
}

impl Engine {
    /// An engine with no CEPs.
    #[must_use]
    pub fn new(cfg: Config) -> Self {
        Self {
            table: Table::new(cfg.max_ceps, cfg.id_seed),
            cfg,
            by_remote: VecMap::new(),
            by_qpn: VecMap::new(),
            listens: VecMap::new(),
            peers: VecMap::new(),
            sidr: VecMap::new(),
            timers: SlabMap::new(),
            events: Events::default(),
            ready: VecDeque::new(),
            tx: shared_tx(),
            tid_seq: 0,
            stats: Stats::default(),
        }
    }

    /// Back to the state [`Engine::new`] gives (no CEP, listen, timer,
    /// event or MAD to send), keeping the memory of the CEP table: what a
    /// fuzzer does between inputs, at a fraction of a new engine's cost.
    pub fn reset(&mut self) {
        self.table.reset();
        self.by_remote.clear();
        self.by_qpn.clear();
        self.listens.clear();
        self.peers.clear();
        self.sidr.clear();
        self.timers.clear();
        self.events = Events::default();
        self.ready.clear();
        self.tx.clear();
        self.tid_seq = 0;
        self.stats = Stats::default();
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The counters.
    #[must_use]
    pub fn stats(&self) -> Stats {
        self.stats
    }

    // ------------------------------------------------------------ outputs

    /// The next MAD to send, oldest first.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.tx.pop_front()
    }

    /// The next CEP that has events for its owner, with its context: it is
    /// signaled once, and again only after the owner polled its queue
    /// empty (the polling model: signal, then poll until none).
    pub fn poll_ready(&mut self) -> Option<(CepId, u64)> {
        while let Some(id) = self.ready.pop_front() {
            let Some(idx) = self.table.lookup(id) else {
                continue;
            };
            let Some(cep) = self.table.get_mut(idx) else {
                continue;
            };
            cep.flags &= !QUEUED;
            if cep.has(SIGNALED) && !cep.events.is_empty() {
                return Some((id, cep.context));
            }
        }
        None
    }

    /// The next event of `id`, oldest first; `None` when there is none
    /// (which re-arms the CEP's signal) or `id` is unknown.
    pub fn poll_event(&mut self, id: CepId) -> Option<Event> {
        let idx = self.owned(id).ok()?;
        let cep = self.table.get_mut(idx)?;
        let ev = self.events.pop(&mut cep.events);
        if cep.events.is_empty() {
            cep.flags &= !SIGNALED;
        }
        ev
    }

    /// The earliest armed deadline: call [`Engine::on_timer`] then.
    #[must_use]
    pub fn next_deadline(&self) -> Option<Nanos> {
        self.timers.first().map(|(&(t, _), ())| t)
    }

    // ------------------------------------------------------------ queries

    /// The state of `id`.
    #[must_use]
    pub fn state(&self, id: CepId) -> Option<State> {
        self.owned_cep(id).map(|c| c.state)
    }

    /// The alternate path loading state of `id`.
    #[must_use]
    pub fn lap_state(&self, id: CepId) -> Option<LapState> {
        self.owned_cep(id).map(|c| c.lap)
    }

    /// The owner's context of `id`.
    #[must_use]
    pub fn context(&self, id: CepId) -> Option<u64> {
        self.owned_cep(id).map(|c| c.context)
    }

    /// Sets the owner's context of `id` (a CEP created by a REQ starts
    /// with its listener's).
    ///
    /// # Errors
    /// [`CmError::UnknownCep`].
    pub fn set_context(&mut self, id: CepId, context: u64) -> Result<(), CmError> {
        let idx = self.owned(id)?;
        if let Some(c) = self.table.get_mut(idx) {
            c.context = context;
        }
        Ok(())
    }

    /// The remote's communication ID and CA GUID, once known.
    #[must_use]
    pub fn remote(&self, id: CepId) -> Option<(u32, u64)> {
        self.owned_cep(id)
            .filter(|c| c.remote_id != 0)
            .map(|c| (c.remote_id, c.remote_ca_guid))
    }

    /// The CEP connected (or connecting) to the remote communication ID
    /// `remote_id` of CA `ca_guid`.
    #[must_use]
    pub fn lookup_remote(&self, ca_guid: u64, remote_id: u32) -> Option<CepId> {
        let idx = *self.by_remote.get(&(ca_guid, remote_id))?;
        self.table.get(idx).map(|c| c.id)
    }

    /// Whether `id` is a live CEP of an owner.
    #[must_use]
    pub fn contains(&self, id: CepId) -> bool {
        self.owned_cep(id).is_some()
    }

    /// Live CEPs, destroyed ones still in time wait included.
    #[must_use]
    pub fn len(&self) -> usize {
        self.table.live() as usize
    }

    /// Whether there are no CEPs.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.table.live() == 0
    }

    /// The CEP listening for `service_id` on `gid` (the passive side's GID
    /// a REQ's primary path names), or on any GID; with no GID (a SIDR
    /// request, which names none), the one on any GID, else the first bound
    /// to one.
    pub(crate) fn listener(&self, service_id: u64, gid: Option<Gid>) -> Option<u32> {
        if let Some(g) = gid
            && let Some(&l) = self.listens.get(&(service_id, g))
        {
            return Some(l);
        }
        if let Some(&l) = self.listens.get(&(service_id, ANY_GID)) {
            return Some(l);
        }
        if gid.is_some() {
            return None;
        }
        self.listens
            .range((service_id, ANY_GID)..=(service_id, [0xFF; 16]))
            .next()
            .map(|(_, &l)| l)
    }

    /// What the engine holds.
    #[must_use]
    pub fn footprint(&self) -> Footprint {
        Footprint {
            ceps: self.table.live(),
            slot_bytes: Table::SLOT_SIZE,
            map_entries: self.by_remote.len()
                + self.by_qpn.len()
                + self.listens.len()
                + self.peers.len()
                + self.sidr.len()
                + self.timers.len(),
            events: self.events.len(),
            event_bytes: Events::NODE_SIZE,
            transmits: self.tx.len(),
        }
    }

    /// The QP attributes of `target` for `id`'s connection: `Init` once the
    /// CEP connects or received a REQ; `Rtr` and `Rts` once the REP arrived
    /// (active) or the CEP accepted (passive); `LoadAlt` while a LAP is
    /// answered or after an accepted APR; `Error` always.
    ///
    /// # Errors
    /// [`CmError::UnknownCep`]; [`CmError::InvalidState`] when the values
    /// are not known yet.
    pub fn qp_attr(&self, id: CepId, target: QpTarget) -> Result<QpModify, CmError> {
        let cep = self.owned_cep(id).ok_or(CmError::UnknownCep)?;
        let ready = match target {
            QpTarget::Init => cep.conn.transport.is_some(),
            QpTarget::Rtr | QpTarget::Rts => cep.has(CONN_READY),
            QpTarget::LoadAlt => cep.alt_pending.is_some() || cep.conn.alternate.is_some(),
            QpTarget::Error => true,
        };
        if !ready {
            return Err(CmError::InvalidState(cep.state));
        }
        let alt = cep
            .alt_pending
            .as_deref()
            .and_then(<[crate::msg::Path]>::first)
            .or(cep.conn.alternate.as_ref());
        Ok(qp::modify(&cep.conn, &cep.addr, target, alt))
    }

    // ------------------------------------------------------------ helpers

    /// The slot of an owner's CEP (not a destroyed one in time wait).
    fn owned(&self, id: CepId) -> Result<u32, CmError> {
        let idx = self.table.lookup(id).ok_or(CmError::UnknownCep)?;
        match self.table.get(idx) {
            Some(c) if !c.has(ORPHAN) => Ok(idx),
            _ => Err(CmError::UnknownCep),
        }
    }

    fn owned_cep(&self, id: CepId) -> Option<&Cep> {
        self.table.get(self.owned(id).ok()?)
    }

    /// A transaction ID: the CEP's ID above a sequence number.
    fn new_tid(&mut self, id: CepId) -> u64 {
        self.tid_seq = self.tid_seq.wrapping_add(1);
        (u64::from(id.0) << 32) | u64::from(self.tid_seq)
    }

    /// Queues `msg` to `dest` and returns its bytes.
    fn send(&mut self, dest: MadAddr, tid: u64, msg: CmMsg) -> [u8; MAD_SIZE] {
        let mad = Mad::new(tid, msg).to_bytes();
        self.queue(Transmit { dest, mad });
        if matches!(msg, CmMsg::Rej(_)) {
            self.stats.rejects += 1;
        }
        mad
    }

    /// Queues a MAD in the room [`Engine::reserve_cep`] made (a few per
    /// CEP); past it the MAD is dropped, as the wire may drop it (the CM's
    /// retries cover both).
    fn queue(&mut self, t: Transmit) {
        if self.tx.len() < self.tx.capacity() {
            self.tx.push_back(t);
            self.stats.sent += 1;
        } else {
            self.stats.tx_dropped += 1;
        }
    }

    /// Room for one more CEP in every table a CEP may enter later, on a
    /// path that cannot fail (a received MAD, a timer): taken when a CEP is
    /// made, so that those paths never allocate.
    ///
    /// # Errors
    /// [`CmError::TableFull`] when the memory is refused (nothing else
    /// changes: only capacities grow).
    pub(crate) fn reserve_cep(&mut self) -> Result<(), CmError> {
        let n = self.table.live() as usize + 1;
        let full = |_| CmError::TableFull;
        self.by_remote.reserve_total(n).map_err(full)?;
        self.by_qpn.reserve_total(n).map_err(full)?;
        self.timers.reserve_total(n).map_err(full)?;
        self.sidr.reserve_total(n).map_err(full)?;
        self.peers.reserve_total(n).map_err(full)?;
        let ready = n.saturating_sub(self.ready.len());
        self.ready
            .try_reserve(ready)
            .map_err(|_| CmError::TableFull)?;
        let tx = (TX_SHARED + TX_PER_CEP * n).saturating_sub(self.tx.len());
        self.tx.try_reserve(tx).map_err(|_| CmError::TableFull)?;
        self.events
            .reserve_total(EVENTS_PER_CEP * n)
            .map_err(|()| CmError::TableFull)
    }

    /// A new CEP (and its room everywhere: [`Engine::reserve_cep`]), or
    /// `None` when the table is full or the memory is refused.
    pub(crate) fn alloc_cep(&mut self, context: u64) -> Option<(u32, CepId)> {
        self.reserve_cep().ok()?;
        self.table.alloc(context)
    }

    /// Queues `msg` to the CEP's address and keeps it to send again.
    fn send_kept(&mut self, idx: u32, tid: u64, msg: CmMsg) {
        let Some(dest) = self.table.get(idx).map(|c| c.addr) else {
            return;
        };
        let mad = self.send(dest, tid, msg);
        if let Some(c) = self.table.get_mut(idx) {
            match &mut c.sent {
                Some(b) => b.copy_from_slice(&mad),
                // Refused: sent, not kept (a timeout then gives up on it,
                // as on a lost answer).
                None => c.sent = crate::fallible::try_box_slice(&mad),
            }
        }
    }

    /// Sends a REJ for the CEP's connection, in its transaction.
    fn send_rej(&mut self, idx: u32, msg: RejectedMsg, reason: RejReason, ari: &[u8]) {
        if let Some(c) = self.table.get(idx) {
            let (rej, dest, tid) = (rej_of(c, msg, reason, ari), c.addr, c.tid);
            self.send(dest, tid, CmMsg::Rej(rej));
        }
    }

    /// Queues `msg`, keeps it, and arms the wait for its answer (see
    /// [`Engine::wait`]).
    fn send_awaiting(&mut self, idx: u32, tid: u64, msg: CmMsg, now: Nanos) {
        self.send_kept(idx, tid, msg);
        if let Some(c) = self.table.get(idx) {
            let wait = Self::wait(c, c.resp_timeout);
            self.arm(idx, now.saturating_add(wait));
        }
    }

    /// Sends the kept MAD again.
    fn resend(&mut self, idx: u32) {
        if let Some(c) = self.table.get(idx)
            && let Some(mad) = c
                .sent
                .as_deref()
                .and_then(|m| <[u8; MAD_SIZE]>::try_from(m).ok())
        {
            let dest = c.addr;
            self.queue(Transmit { dest, mad });
        }
    }

    /// Queues `ev` for the owner of the CEP at `idx` (dropped for a
    /// destroyed CEP) and signals it if it was not.
    fn push_event(&mut self, idx: u32, ev: Event) {
        let Some(cep) = self.table.get_mut(idx) else {
            return;
        };
        if cep.has(ORPHAN) {
            return;
        }
        // Past the room reserved for it the event is dropped (and counted).
        if !self.events.push(&mut cep.events, ev) {
            self.stats.events_dropped += 1;
            return;
        }
        if !cep.has(SIGNALED) {
            cep.flags |= SIGNALED;
            if !cep.has(QUEUED) {
                cep.flags |= QUEUED;
                self.ready.push_back(cep.id);
            }
        }
    }

    /// How long to wait for an answer from a remote that takes up to
    /// 4.096 us * 2^`exp`: that, plus a packet lifetime each way (together
    /// the path's local ACK timeout, 2 * 2^(t - 1); 4.096 us for SIDR,
    /// which has no path).
    ///
    /// Both exponents come from the remote (its REQ, REP or MRA): each is
    /// capped at [`MAX_REMOTE_EXP`], so a broken or hostile peer can hold
    /// a CEP for about 69 s per attempt, not hours.
    fn wait(cep: &Cep, exp: u8) -> Nanos {
        cm_time(exp.min(MAX_REMOTE_EXP))
            + cm_time(cep.conn.primary.local_ack_timeout.min(MAX_REMOTE_EXP))
    }

    fn arm(&mut self, idx: u32, at: Nanos) {
        self.disarm(idx);
        if let Some(c) = self.table.get_mut(idx) {
            c.deadline = at;
            let armed = self.timers.insert_reserved((at, idx), ());
            debug_assert!(armed.is_ok());
        }
    }

    fn disarm(&mut self, idx: u32) {
        if let Some(c) = self.table.get_mut(idx)
            && c.deadline != 0
        {
            self.timers.remove(&(c.deadline, idx));
            c.deadline = 0;
        }
    }

    /// Enters the CEP's remote IDs in the lookups.
    fn link_remote(&mut self, idx: u32) {
        let Some(c) = self.table.get_mut(idx) else {
            return;
        };
        // The room was reserved when the CEP was made.
        let _ = self
            .by_remote
            .insert_reserved((c.remote_ca_guid, c.remote_id), idx);
        let _ = self
            .by_qpn
            .insert_reserved((c.remote_ca_guid, c.conn.remote_qpn), idx);
        c.flags |= IN_REMOTE | IN_QPN;
    }

    /// Takes the CEP out of every lookup but the local ID's.
    fn unlink(&mut self, idx: u32) {
        let Some(c) = self.table.get_mut(idx) else {
            return;
        };
        let mine = |v: Option<&u32>| v == Some(&idx);
        if c.has(IN_REMOTE) && mine(self.by_remote.get(&(c.remote_ca_guid, c.remote_id))) {
            self.by_remote.remove(&(c.remote_ca_guid, c.remote_id));
        }
        if c.has(IN_QPN) && mine(self.by_qpn.get(&(c.remote_ca_guid, c.conn.remote_qpn))) {
            self.by_qpn.remove(&(c.remote_ca_guid, c.conn.remote_qpn));
        }
        if c.has(IN_PEER) {
            self.peers
                .remove(&(c.service_id, c.conn.primary.remote_gid, idx));
        }
        if c.has(IN_LISTEN) {
            let sid = c.service_id;
            let key = self
                .listens
                .range((sid, ANY_GID)..=(sid, [0xFF; 16]))
                .find(|&(_, &l)| l == idx)
                .map(|(&k, _)| k);
            if let Some(k) = key {
                self.listens.remove(&k);
            }
        }
        if c.has(IN_SIDR) && mine(self.sidr.get(&(c.addr.gid, c.remote_id))) {
            self.sidr.remove(&(c.addr.gid, c.remote_id));
        }
        c.flags &= !(IN_REMOTE | IN_QPN | IN_PEER | IN_LISTEN | IN_SIDR);
    }

    /// Back to `Idle`: out of the lookups, nothing armed or kept.
    fn reset_idle(&mut self, idx: u32) {
        self.disarm(idx);
        self.unlink(idx);
        if let Some(c) = self.table.get_mut(idx) {
            c.state = State::Idle;
            c.end_lap();
            c.flags &= !CONN_READY;
            c.remote_id = 0;
            c.sent = None;
            c.pdata = None;
        }
    }

    /// Into `Timewait` until the QP's stale packets are gone; the remote
    /// IDs stay in the lookups (duplicates get answered, new REQs reusing
    /// the remote QP are stale).
    fn enter_timewait(&mut self, idx: u32, now: Nanos) {
        let Some(c) = self.table.get_mut(idx) else {
            return;
        };
        c.state = State::Timewait;
        c.end_lap();
        c.sent = None;
        let tw = cm_time(c.conn.primary.local_ack_timeout.min(MAX_REMOTE_EXP))
            .max(self.cfg.min_timewait);
        self.arm(idx, now.saturating_add(tw));
    }

    /// Frees the CEP at `idx` and its queued events.
    fn release(&mut self, idx: u32) {
        self.disarm(idx);
        self.unlink(idx);
        if let Some(c) = self.table.get_mut(idx) {
            while self.events.pop(&mut c.events).is_some() {}
        }
        self.table.free(idx);
    }
}
