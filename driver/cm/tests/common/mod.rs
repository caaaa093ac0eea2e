//! Two CM engines over a simulated GSI wire: a virtual clock, and seeded
//! loss, duplication and delay (so reordering). Every run replays from its
//! seed; a failure prints it.
#![allow(dead_code)]

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use irpverbs_cm::msg::{MAD_SIZE, Path};
use irpverbs_cm::{
    AcceptParams, CepId, Config, ConnectParams, Engine, Event, Gid, MadAddr, Nanos, QpTarget,
    Transmit,
};

/// The CA GUIDs of node 0 and node 1.
pub const GUID: [u64; 2] = [0x0002_C903_0000_00A1, 0x0002_C903_0000_00B2];
/// The primary path's local ACK timeout: 4.096 us * 2^10, about 4.2 ms.
pub const ACK: u8 = 10;
/// The CM response timeout exponent the tests use: about 4.2 ms.
pub const RESP: u8 = 10;
/// Retries the tests use.
pub const RETRIES: u8 = 15;
/// Service IDs.
pub const SID: u64 = 0x0000_0000_0106_4D2A;

/// Node `n`'s port GID (IPv4-mapped, as on RoCE).
pub fn gid(n: usize) -> Gid {
    let mut g = [0u8; 16];
    g[10] = 0xFF;
    g[11] = 0xFF;
    g[12] = 10;
    g[15] = n as u8 + 1;
    g
}

/// Node `n`'s GSI as the other node addresses it (and sees MADs from it).
pub fn gsi(n: usize) -> MadAddr {
    MadAddr {
        port_num: 1,
        pkey_index: 0,
        sgid_index: 0,
        gid: gid(n),
        lid: 0,
        qpn: 1,
        sl: 0,
        traffic_class: 0,
        hop_limit: 64,
        flow_label: 0,
    }
}

/// The path from node `from` to node `to`.
pub fn path(from: usize, to: usize) -> Path {
    Path {
        local_gid: gid(from),
        remote_gid: gid(to),
        hop_limit: 64,
        local_ack_timeout: ACK,
        ..Path::default()
    }
}

/// A REQ from node `from` to node `to` for QP `qpn`.
pub fn connect_params(from: usize, to: usize, qpn: u32) -> ConnectParams<'static> {
    ConnectParams {
        dest: gsi(to),
        service_id: SID,
        qpn,
        starting_psn: qpn ^ 0x5A5A,
        remote_cm_response_timeout: RESP,
        local_cm_response_timeout: RESP,
        max_cm_retries: RETRIES,
        primary: path(from, to),
        ..ConnectParams::default()
    }
}

/// A REP for QP `qpn`.
pub fn accept_params(qpn: u32) -> AcceptParams<'static> {
    AcceptParams {
        qpn,
        starting_psn: qpn ^ 0xA5A5,
        ..AcceptParams::default()
    }
}

/// An engine of node `n` with `timewait` as its least time wait.
pub fn engine(n: usize, seed: u32, timewait: Nanos) -> Engine {
    Engine::new(Config {
        id_seed: seed,
        min_timewait: timewait,
        ..Config::new(GUID[n])
    })
}

/// The wire's faults, per thousand MADs.
#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    pub loss: u32,
    pub dup: u32,
    /// Delays are uniform in 0..=max_delay (so MADs reorder).
    pub max_delay: Nanos,
}

/// What the owner does with events.
pub trait Owner {
    fn event(&mut self, e: &mut Engine, node: usize, now: Nanos, cep: CepId, ev: Event);
}

/// An event log, for owners that only watch.
#[derive(Default)]
pub struct Log(pub Vec<(usize, CepId, Event)>);

impl Owner for Log {
    fn event(&mut self, _: &mut Engine, node: usize, _: Nanos, cep: CepId, ev: Event) {
        self.0.push((node, cep, ev));
    }
}

/// A MAD on the wire: (arrival, sequence, from, to, bytes).
type InFlight = (Nanos, u64, usize, usize, [u8; MAD_SIZE]);

pub struct Sim {
    pub now: Nanos,
    pub e: [Engine; 2],
    pub faults: Faults,
    rng: u64,
    seq: u64,
    queue: BinaryHeap<Reverse<InFlight>>,
    pub sent: u64,
    pub lost: u64,
    /// Drop everything sent to this node (a dead host).
    pub cut: [bool; 2],
}

impl Sim {
    pub fn new(seed: u64, faults: Faults, timewait: Nanos) -> Self {
        let s = seed as u32;
        Self {
            now: 0,
            e: [
                engine(0, s.rotate_left(7), timewait),
                engine(1, !s, timewait),
            ],
            faults,
            rng: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            seq: 0,
            queue: BinaryHeap::new(),
            sent: 0,
            lost: 0,
            cut: [false; 2],
        }
    }

    fn rand(&mut self) -> u64 {
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn chance(&mut self, per_mille: u32) -> bool {
        (self.rand() % 1000) < u64::from(per_mille)
    }

    fn node_of(dest: &MadAddr) -> usize {
        usize::from(dest.gid == gid(1))
    }

    fn put(&mut self, from: usize, t: Transmit) {
        self.sent += 1;
        let to = Self::node_of(&t.dest);
        if self.cut[to] || self.chance(self.faults.loss) {
            self.lost += 1;
            return;
        }
        let copies = if self.chance(self.faults.dup) { 2 } else { 1 };
        for _ in 0..copies {
            let delay = if self.faults.max_delay == 0 {
                0
            } else {
                self.rand() % (self.faults.max_delay + 1)
            };
            self.seq += 1;
            self.queue
                .push(Reverse((self.now + delay, self.seq, from, to, t.mad)));
        }
    }

    /// Moves every MAD the engines queued onto the wire.
    pub fn flush(&mut self) {
        for n in 0..2 {
            while let Some(t) = self.e[n].poll_transmit() {
                self.put(n, t);
            }
        }
    }

    /// Hands every event to the owner until none is left.
    pub fn poll_owner(&mut self, o: &mut impl Owner) {
        loop {
            let mut any = false;
            for n in 0..2 {
                while let Some((id, _)) = self.e[n].poll_ready() {
                    while let Some(ev) = self.e[n].poll_event(id) {
                        any = true;
                        o.event(&mut self.e[n], n, self.now, id, ev);
                    }
                }
            }
            self.flush();
            if !any {
                break;
            }
        }
    }

    /// Runs until nothing is in flight or armed (true), or until `until`
    /// (false).
    pub fn run(&mut self, o: &mut impl Owner, until: Nanos) -> bool {
        loop {
            self.poll_owner(o);
            let next = [
                self.queue.peek().map(|Reverse(m)| m.0),
                self.e[0].next_deadline(),
                self.e[1].next_deadline(),
            ]
            .into_iter()
            .flatten()
            .min();
            let Some(t) = next else {
                return true;
            };
            if t > until {
                self.now = self.now.max(until);
                return false;
            }
            self.now = self.now.max(t);
            while let Some(Reverse(m)) = self.queue.peek() {
                if m.0 > self.now {
                    break;
                }
                let Some(Reverse((_, _, from, to, mad))) = self.queue.pop() else {
                    break;
                };
                let _ = self.e[to].receive(self.now, &gsi(from), &mad);
            }
            for n in 0..2 {
                self.e[n].on_timer(self.now);
            }
            self.flush();
        }
    }

    /// Runs for `d` more nanoseconds.
    pub fn run_for(&mut self, o: &mut impl Owner, d: Nanos) -> bool {
        let until = self.now + d;
        self.run(o, until)
    }

    /// Delivers every MAD in flight now, without timers and without
    /// polling the owners (their events stay queued).
    pub fn deliver_raw(&mut self) {
        self.flush();
        while let Some(Reverse((_, _, from, to, mad))) = self.queue.pop() {
            let _ = self.e[to].receive(self.now, &gsi(from), &mad);
        }
    }

    /// Delivers the MADs in flight now (no faults), without running timers.
    pub fn deliver_now(&mut self, o: &mut impl Owner) {
        self.flush();
        while let Some(Reverse((_, _, from, to, mad))) = self.queue.pop() {
            let _ = self.e[to].receive(self.now, &gsi(from), &mad);
            self.poll_owner(o);
        }
    }
}

/// Owner that accepts every request, answers every REP with RTU and every
/// DREQ with DREP, moving an imaginary QP through the attributes the
/// engine gives (which must exist at each step).
#[derive(Default)]
pub struct Auto {
    pub log: Vec<(usize, CepId, Event)>,
    /// Next QPN each node's passive side takes.
    pub next_qpn: [u32; 2],
    /// Reject requests instead of accepting.
    pub reject: bool,
}

impl Auto {
    pub fn new() -> Self {
        Self {
            log: Vec::new(),
            next_qpn: [0x10_0000, 0x20_0000],
            reject: false,
        }
    }

    pub fn count(&self, node: usize, f: impl Fn(&Event) -> bool) -> usize {
        self.log
            .iter()
            .filter(|(n, _, e)| *n == node && f(e))
            .count()
    }
}

impl Owner for Auto {
    fn event(&mut self, e: &mut Engine, node: usize, now: Nanos, cep: CepId, ev: Event) {
        match ev {
            Event::ConnectRequest { cep: child, .. } => {
                if self.reject {
                    let r = irpverbs_cm::msg::RejReason::CONSUMER_REJECT;
                    e.reject(child, r, &[], &[], now).unwrap();
                } else {
                    let qpn = self.next_qpn[node];
                    self.next_qpn[node] += 1;
                    let p = accept_params(qpn);
                    for t in [QpTarget::Init, QpTarget::Rtr, QpTarget::Rts] {
                        e.accept_qp_attr(child, &p, t).unwrap();
                    }
                    e.accept(child, &p, now).unwrap();
                }
            }
            Event::Reply { .. } => {
                e.qp_attr(cep, QpTarget::Rtr).unwrap();
                e.qp_attr(cep, QpTarget::Rts).unwrap();
                e.rtu(cep, &[]).unwrap();
            }
            Event::DisconnectRequest { .. } => {
                e.qp_attr(cep, QpTarget::Error).unwrap();
                e.drep(cep, &[], now).unwrap();
            }
            _ => {}
        }
        self.log.push((node, cep, ev));
    }
}
