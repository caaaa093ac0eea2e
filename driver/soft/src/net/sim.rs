//! A seeded, simulated wire on a virtual clock: the [`Link`] the
//! simulation tests cable soft HCAs to.
//!
//! Every datagram a soft HCA transmits may be lost, duplicated, delayed by
//! a random amount (which reorders it behind later ones) or get one bit
//! flipped, each decided by a pseudo-random generator seeded once: the same
//! seed replays the same run, byte for byte. Time is virtual: a
//! [`SimNet`] delivers the earliest datagram or fires the earliest HCA
//! timer, whichever comes first, and moves the clock to it, so a run that
//! spans seconds of retransmission timeouts takes microseconds.
//!
//! An adversary can share the wire ([`SimConfig::attack_ppm`]): a third
//! host that sees every datagram delivered and, after some of them, injects
//! one of its own, drawn from the same seed:
//! - from its own address ([`SimConfig::attacker`]): forged ACKs, NAKs
//!   (every code, reserved ones too), RNR NAKs, READ responses and atomic
//!   ACKs to the QP a response it saw went to, and blind SENDs and RDMA
//!   WRITEs to the QP a request it saw went to, with a PSN at random or
//!   within a few of the one it saw;
//! - from the peer's address but another UDP source port: the same
//!   forgeries with a PSN it guessed blind (at least 2^21 from any it
//!   saw), and the datagrams it saw sent again from that port;
//! - replays: datagrams it saw, sent again unchanged, later.
//!
//! A connected QP must drop all of it ([`crate::TrustStats`]) or treat it
//! as the duplicate it is: the legitimate traffic completes exactly once,
//! with its data, or fails only as the wire's own faults make it fail.
//! (A forger who can see the traffic and send from the peer's address can
//! take a connection over by guessing a PSN inside the window: RoCE has no
//! authentication; the adversary does not do that.)
//!
//! Nothing here is specific to a platform: the wire only needs a lock from
//! the HCAs' [`Platform`].

use alloc::collections::BinaryHeap;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::cmp::{Ordering as CmpOrdering, Reverse};
use core::sync::atomic::{AtomicU64, Ordering};

use irpverbs_core::platform::LockClass;
use irpverbs_core::{Platform, SpinLock};

use crate::SoftHca;
use crate::net::link::{Datagram, Link, OwnedDatagram, TxBatch};
use crate::wire;
use crate::wire::packet::{Gid, Packet, aeth, m, op, psn_add};

/// Datagrams the adversary remembers (the latest).
const SEEN: usize = 32;

/// The simulated wire's state (a leaf: taken by a transmitting HCA with no
/// HCA lock held, and by [`SimNet`] to take the next datagram).
pub static SIM_WIRE_LOCK: LockClass = LockClass {
    name: "irpverbs.soft.simwire",
    rank: 40,
};

/// What the wire does to datagrams. Probabilities are in parts per
/// million.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimConfig {
    /// The seed of every decision.
    pub seed: u64,
    /// A datagram is lost.
    pub loss_ppm: u32,
    /// A datagram arrives twice (each copy with its own delay).
    pub dup_ppm: u32,
    /// A copy arrives with one bit flipped (never in the bits the ICRC
    /// masks, which change nothing the receiver reads).
    pub corrupt_ppm: u32,
    /// Every copy's delay: `delay_ns` plus up to `jitter_ns` more, drawn
    /// per copy (jitter wider than the gap between datagrams reorders
    /// them).
    pub delay_ns: u64,
    /// See `delay_ns`.
    pub jitter_ns: u64,
    /// Datagrams the wire holds in flight at most (0: no limit): one sent
    /// while it holds this many is dropped, as a receiving socket's full
    /// buffer drops it.
    pub queue_limit: usize,
    /// After each datagram delivered, the adversary injects one of its own
    /// with this probability (see the module docs; 0: no adversary).
    pub attack_ppm: u32,
    /// The adversary's own GID (its IP address).
    pub attacker: Gid,
}

/// What the adversary injected, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AttackStats {
    /// Forged responses and requests from the adversary's own GID.
    pub foreign: u64,
    /// Forged responses and requests from the peer's GID and another UDP
    /// source port, with blind PSNs.
    pub spoofed: u64,
    /// Datagrams seen, sent again from the peer's GID and another UDP
    /// source port.
    pub moved: u64,
    /// Datagrams seen, sent again unchanged.
    pub replayed: u64,
}

impl AttackStats {
    /// Every datagram injected.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.foreign + self.spoofed + self.moved + self.replayed
    }
}

/// Counters of the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Datagrams transmitted by the HCAs.
    pub transmitted: u64,
    /// Lost (at random, past the queue limit, or for want of memory).
    pub lost: u64,
    /// Of those, lost past the queue limit or for want of memory.
    pub overflowed: u64,
    /// Extra copies made.
    pub duplicated: u64,
    /// Copies with a flipped bit.
    pub corrupted: u64,
    /// Copies delivered to an HCA.
    pub delivered: u64,
    /// Copies for a GID no HCA on the net has.
    pub unroutable: u64,
    /// What the adversary injected.
    pub attacks: AttackStats,
}

/// SplitMix64: a small, well-mixed generator (the seed is the whole
/// state, so a failing seed replays).
#[derive(Clone, Debug)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// True with probability `ppm` / 1e6.
    fn chance(&mut self, ppm: u32) -> bool {
        ppm != 0 && self.next() % 1_000_000 < u64::from(ppm)
    }

    /// Uniform in `0..=max`.
    fn upto(&mut self, max: u64) -> u64 {
        if max == 0 { 0 } else { self.next() % (max + 1) }
    }
}

/// A datagram on its way.
#[derive(Debug)]
struct InFlight {
    at: u64,
    seq: u64,
    d: OwnedDatagram,
}

impl PartialEq for InFlight {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for InFlight {}

impl PartialOrd for InFlight {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}

impl Ord for InFlight {
    fn cmp(&self, other: &Self) -> CmpOrdering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

struct WireState {
    config: SimConfig,
    rng: Rng,
    seq: u64,
    queue: BinaryHeap<Reverse<InFlight>>,
    stats: SimStats,
    /// The adversary's latest datagrams seen (a ring of [`SEEN`]).
    seen: Vec<OwnedDatagram>,
    seen_next: usize,
}

impl WireState {
    /// Queues `d` to arrive at `at`.
    fn inject(&mut self, d: OwnedDatagram, at: u64) {
        self.seq += 1;
        let seq = self.seq;
        self.queue.push(Reverse(InFlight { at, seq, d }));
    }

    /// The adversary saw `d` delivered at `now`: remembers it (unless it
    /// is its own), and may inject a datagram.
    fn adversary(&mut self, d: OwnedDatagram, now: u64) {
        let c = self.config;
        if c.attack_ppm == 0 || d.sgid == c.attacker {
            return;
        }
        if self.seen.len() < SEEN {
            self.seen.push(d);
        } else {
            self.seen[self.seen_next] = d;
        }
        self.seen_next = (self.seen_next + 1) % SEEN;
        if !self.rng.chance(c.attack_ppm) {
            return;
        }
        let pick = self.rng.upto(self.seen.len() as u64 - 1) as usize;
        let seen = self.seen[pick].clone();
        let at = now + c.delay_ns + self.rng.upto(c.jitter_ns + 50_000);
        let Ok((pkt, _)) = wire::parse_transport(&seen.bytes, &seen.view().ip()) else {
            return;
        };
        match self.rng.upto(9) {
            0 | 1 => {
                self.stats.attacks.replayed += 1;
                self.inject(seen, at);
            }
            2 => {
                // Sent again from another source port: sealed again for it.
                let mut moved = seen.clone();
                moved.src_port = other_port(seen.src_port, &mut self.rng);
                let payload = wire::parse_transport(&seen.bytes, &seen.view().ip())
                    .map(|(_, p)| p.to_vec())
                    .unwrap_or_default();
                if let Some(bytes) = emit(&pkt, &payload, &moved) {
                    moved.bytes = bytes;
                    self.stats.attacks.moved += 1;
                    self.inject(moved, at);
                }
            }
            k => {
                let own = k < 6;
                let mut forged = self.forge(&pkt, own);
                let mut out = seen;
                out.src_port = other_port(out.src_port, &mut self.rng);
                if own {
                    out.sgid = c.attacker;
                }
                forged.sgid = out.sgid;
                forged.dgid = out.dgid;
                let payload = alloc::vec![0xEE; forged.payload_len as usize];
                if let Some(bytes) = emit(&forged, &payload, &out) {
                    out.bytes = bytes;
                    if own {
                        self.stats.attacks.foreign += 1;
                    } else {
                        self.stats.attacks.spoofed += 1;
                    }
                    self.inject(out, at);
                }
            }
        }
    }

    /// A packet forged from `seen`: a response to the QP a response went
    /// to, or a request to the QP a request went to. `near`: its PSN within
    /// a few of the one seen, or at random; else at least 2^21 away.
    fn forge(&mut self, seen: &Packet, near: bool) -> Packet {
        let r = &mut self.rng;
        let psn = if near && r.upto(1) == 0 {
            psn_add(seen.psn, (r.upto(6) as u32).wrapping_sub(3) & 0xFF_FFFF)
        } else if near {
            r.next() as u32 & 0xFF_FFFF
        } else {
            psn_add(seen.psn, (1 << 21) + r.upto((1 << 23) - (1 << 22)) as u32)
        };
        let mut p = Packet {
            opcode: seen.opcode,
            pkey: seen.pkey,
            dest_qpn: seen.dest_qpn,
            psn,
            ..Packet::default()
        };
        if seen.mask() & m::REQ != 0 {
            // A blind SEND or RDMA WRITE.
            if r.upto(1) == 0 {
                p.opcode = op::RC_SEND_ONLY;
            } else {
                p.opcode = op::RC_WRITE_ONLY;
                p.reth = seen.reth;
                p.reth.len = 16;
            }
            p.payload_len = 16;
            p.ack_req = true;
            return p;
        }
        match r.upto(5) {
            0 => {
                p.opcode = op::RC_ACKNOWLEDGE;
                p.aeth.syndrome = aeth::ACK | 0x1F;
            }
            1 => {
                p.opcode = op::RC_ACKNOWLEDGE;
                p.aeth.syndrome = aeth::NAK | (r.upto(31) as u8);
            }
            2 => {
                p.opcode = op::RC_ACKNOWLEDGE;
                p.aeth.syndrome = aeth::RNR_NAK | (r.upto(31) as u8);
            }
            3 => {
                // The reserved AETH type.
                p.opcode = op::RC_ACKNOWLEDGE;
                p.aeth.syndrome = 0x40 | (r.upto(31) as u8);
            }
            4 => {
                p.opcode = op::RC_READ_RESPONSE_ONLY;
                p.aeth.syndrome = aeth::ACK | 0x1F;
                p.payload_len = 8;
            }
            _ => {
                p.opcode = op::RC_ATOMIC_ACKNOWLEDGE;
                p.aeth.syndrome = aeth::ACK | 0x1F;
                p.atomic_orig = r.next();
            }
        }
        p.aeth.msn = seen.aeth.msn;
        p
    }
}

/// A UDP source port other than `port`.
fn other_port(port: u16, r: &mut Rng) -> u16 {
    let p = 0xC000 | (r.upto(0x3FFF) as u16);
    if p == port { p ^ 1 } else { p }
}

/// The UDP payload of `pkt` with `payload` as `to`'s addresses and ports
/// carry it (ICRC sealed for them).
fn emit(pkt: &Packet, payload: &[u8], to: &OwnedDatagram) -> Option<Vec<u8>> {
    let mut buf = alloc::vec![0; wire::transport_len(pkt).ok()?];
    let n = wire::emit_transport(pkt, &[payload], &to.view().ip(), &mut buf).ok()?;
    buf.truncate(n);
    Some(buf)
}

/// The simulated wire: a [`Link`] every HCA of a [`SimNet`] shares.
pub struct SimWire<P: Platform> {
    state: P::Lock<WireState>,
    clock: AtomicU64,
}

impl<P: Platform> core::fmt::Debug for SimWire<P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SimWire")
            .field("now", &self.clock.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// The BTH byte the ICRC masks (FECN, BECN, reserved): a flip there
/// changes nothing the receiver reads, so corruption avoids it.
const MASKED_BTH_BYTE: usize = 4;

impl<P: Platform> SimWire<P> {
    fn new(platform: &P, config: SimConfig) -> Self {
        Self {
            state: platform.new_lock(
                &SIM_WIRE_LOCK,
                WireState {
                    config,
                    rng: Rng(config.seed),
                    seq: 0,
                    queue: BinaryHeap::new(),
                    stats: SimStats::default(),
                    seen: Vec::new(),
                    seen_next: 0,
                },
            ),
            clock: AtomicU64::new(0),
        }
    }

    fn send(&self, d: &Datagram<'_>) {
        let now = self.clock.load(Ordering::Acquire);
        self.state.lock(|w| {
            w.stats.transmitted += 1;
            let c = w.config;
            if c.queue_limit != 0 && w.queue.len() >= c.queue_limit {
                w.stats.lost += 1;
                w.stats.overflowed += 1;
                return;
            }
            if w.rng.chance(c.loss_ppm) {
                w.stats.lost += 1;
                return;
            }
            let copies = if w.rng.chance(c.dup_ppm) {
                w.stats.duplicated += 1;
                2
            } else {
                1
            };
            for _ in 0..copies {
                // A copy the wire has no memory for is lost, as in a full
                // switch buffer.
                let copy = OwnedDatagram::try_of(d).filter(|_| w.queue.try_reserve(1).is_ok());
                let Some(mut copy) = copy else {
                    w.stats.lost += 1;
                    w.stats.overflowed += 1;
                    continue;
                };
                let bytes = &mut copy.bytes;
                if w.rng.chance(c.corrupt_ppm) && bytes.len() > MASKED_BTH_BYTE + 1 {
                    let mut byte = w.rng.upto(bytes.len() as u64 - 1) as usize;
                    if byte == MASKED_BTH_BYTE {
                        byte += 1;
                    }
                    let bit = w.rng.upto(7) as u8;
                    bytes[byte] ^= 1 << bit;
                    w.stats.corrupted += 1;
                }
                let at = now + c.delay_ns + w.rng.upto(c.jitter_ns);
                w.seq += 1;
                w.queue.push(Reverse(InFlight {
                    at,
                    seq: w.seq,
                    d: copy,
                }));
            }
        });
    }
}

impl<P: Platform> Link for SimWire<P> {
    fn transmit(&self, batch: &TxBatch) {
        for d in batch.iter() {
            self.send(&d);
        }
    }

    fn now_ns(&self) -> u64 {
        self.clock.load(Ordering::Acquire)
    }
}

/// Soft HCAs cabled to one [`SimWire`], and the loop that runs them.
pub struct SimNet<P: Platform> {
    wire: Arc<SimWire<P>>,
    hcas: Vec<Arc<SoftHca<P>>>,
}

impl<P: Platform> core::fmt::Debug for SimNet<P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SimNet")
            .field("hcas", &self.hcas.len())
            .field("wire", &self.wire)
            .finish()
    }
}

impl<P: Platform> SimNet<P> {
    /// A net with no HCAs, its wire configured by `config`.
    pub fn new(platform: &P, config: SimConfig) -> Self {
        Self {
            wire: Arc::new(SimWire::new(platform, config)),
            hcas: Vec::new(),
        }
    }

    /// Cables `hca` to the wire.
    ///
    /// # Errors
    /// As [`SoftHca::attach_link`].
    pub fn attach(&mut self, hca: &Arc<SoftHca<P>>) -> Result<(), irpverbs_abi::NtStatus> {
        let link: Arc<dyn Link> = self.wire.clone();
        hca.attach_link(link)?;
        self.hcas.push(Arc::clone(hca));
        Ok(())
    }

    /// The virtual time, in ns.
    #[must_use]
    pub fn now(&self) -> u64 {
        self.wire.now_ns()
    }

    /// The wire's counters.
    #[must_use]
    pub fn stats(&self) -> SimStats {
        self.wire.state.lock(|w| w.stats)
    }

    /// Changes what the wire does from now on (datagrams on their way
    /// keep their fate): e.g. heals it.
    pub fn set_config(&self, config: SimConfig) {
        self.wire.state.lock(|w| {
            w.config = SimConfig {
                seed: w.config.seed,
                ..config
            }
        });
    }

    /// When the next event is due: the earliest datagram's arrival or HCA
    /// timer, whichever comes first (`None`: neither exists). For a
    /// driver that merges other timers into the net's time (the host
    /// platform's virtual clock).
    #[must_use]
    pub fn next_event(&self) -> Option<u64> {
        let next_timer = self.hcas.iter().filter_map(|h| h.next_deadline()).min();
        let next_datagram = self.wire.state.lock(|w| w.queue.peek().map(|r| r.0.at));
        next_timer.into_iter().chain(next_datagram).min()
    }

    /// Moves the virtual clock forward to `t` (never back) without running
    /// an event: for a driver that runs other timers due before the net's
    /// next event ([`SimNet::next_event`]), so that what they transmit
    /// leaves at their time.
    pub fn set_now(&self, t: u64) {
        self.wire.clock.fetch_max(t, Ordering::AcqRel);
    }

    /// Runs one event: delivers the earliest datagram or fires the
    /// earliest timer, moving the clock to it. False when neither exists,
    /// or the next is after `limit` (the clock then stays).
    pub fn step(&self, limit: u64) -> bool {
        let next_timer = self.hcas.iter().filter_map(|h| h.next_deadline()).min();
        let next_datagram = self.wire.state.lock(|w| w.queue.peek().map(|r| r.0.at));
        let t = match (next_timer, next_datagram) {
            (None, None) => return false,
            (a, b) => a.into_iter().chain(b).min().unwrap_or(u64::MAX),
        };
        if t > limit {
            return false;
        }
        let now = self.wire.clock.load(Ordering::Acquire).max(t);
        self.wire.clock.store(now, Ordering::Release);
        if next_datagram == Some(t) {
            let Some(Reverse(InFlight { d, .. })) = self.wire.state.lock(|w| w.queue.pop()) else {
                return true;
            };
            match self.hcas.iter().find(|h| h.gid() == d.dgid) {
                Some(h) => {
                    self.wire.state.lock(|w| w.stats.delivered += 1);
                    let _ = h.receive(&d.view());
                }
                None => self.wire.state.lock(|w| w.stats.unroutable += 1),
            }
            self.wire.state.lock(|w| w.adversary(d, now));
        } else {
            for h in &self.hcas {
                h.advance_clock(now);
            }
        }
        true
    }

    /// Runs events until none is left or the clock would pass `limit`;
    /// returns the events run.
    pub fn run(&self, limit: u64) -> usize {
        let mut n = 0;
        while self.step(limit) {
            n += 1;
        }
        n
    }
}
