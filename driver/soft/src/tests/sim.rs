//! Simulation tests: RC traffic of every opcode between two soft HCAs
//! cabled to a [`SimWire`](crate::net::sim::SimWire) that loses, duplicates,
//! reorders, delays and corrupts datagrams, thousands of seeds a run.
//!
//! For each seed: every WQE completes exactly once and in order, with its
//! data intact, or the QP reaches ERR and every WQE after the failed one
//! is flushed; every corrupted datagram is dropped by its receiver; then
//! the wire heals (the QPs are reconnected if they failed) and new traffic
//! must complete. A failure names the seed; `IRPVERBS_SIM_SEED=n` replays
//! it alone, `IRPVERBS_SIM_SEEDS=n` changes how many run.
//!
//! Under attack (`rc_under_attack`), a third host on the wire injects
//! forged responses and requests, blind and nearly right, and replays
//! ([`crate::net::sim`]): the same checks hold, every forgery from its own
//! address is dropped and counted, and on a wire without faults nothing
//! fails at all.

extern crate std;

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use std::panic::{AssertUnwindSafe, catch_unwind};

use irpverbs_abi::*;
use irpverbs_ring::wq::SendWr;

use crate::firmware::qp::QpState;
use crate::net::link::OwnedDatagram;
use crate::net::sim::{SimConfig, SimNet};
use crate::tests::dp::{ALL_ACCESS, Conn, Cq, Ep, Mem, Node, pattern};
use crate::tests::util::TestPlatform;

/// SplitMix64 for the scenario (the wire has its own, from the same seed).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Bytes of each op's slot in the memory areas.
const SLOT: u64 = 4096;
/// Ops of the faulty phase, at most.
const MAX_OPS: u64 = 24;
/// Memory of each side: send/write sources or targets, READ areas,
/// atomics.
const MEM: u64 = 4 * MAX_OPS * SLOT;
const WRITE_AREA: u64 = 0;
const RECV_AREA: u64 = MAX_OPS * SLOT;
const READ_AREA: u64 = 2 * MAX_OPS * SLOT;
const ATOMIC_AREA: u64 = 3 * MAX_OPS * SLOT;
const WORDS: u64 = 4;
/// Virtual time a phase may take.
const PHASE_LIMIT_NS: u64 = 120_000_000_000;

#[derive(Clone, Copy, Debug)]
enum Op {
    Send { len: u32 },
    Write { len: u32 },
    WriteImm { len: u32, imm: u32 },
    Read { len: u32, from: u64 },
    Cas { word: u64, compare: u64, swap: u64 },
    Faa { word: u64, add: u64 },
}

impl Op {
    fn random(r: &mut Rng, mtu: u32, words: &[u64]) -> Op {
        let len = match r.below(4) {
            0 => 0,
            1 => r.below(64) as u32 + 1,
            _ => (r.below(u64::from(2 * mtu) + 100) as u32 + 1).min(SLOT as u32),
        };
        match r.below(6) {
            0 => Op::Send { len },
            1 => Op::Write { len },
            2 => Op::WriteImm {
                len,
                imm: r.next() as u32,
            },
            3 => Op::Read {
                len,
                from: r.below(SLOT * MAX_OPS - u64::from(len)),
            },
            4 => {
                let word = r.below(WORDS);
                let hit = r.below(2) == 0;
                Op::Cas {
                    word,
                    compare: if hit { words[word as usize] } else { r.next() },
                    swap: r.next(),
                }
            }
            _ => Op::Faa {
                word: r.below(WORDS),
                add: r.below(1000),
            },
        }
    }

    fn consumes_recv(self) -> bool {
        matches!(self, Op::Send { .. } | Op::WriteImm { .. })
    }
}

/// Two HCAs on a simulated wire, an RC QP on each, connected.
struct World {
    net: SimNet<TestPlatform>,
    a: Node,
    b: Node,
    qa: Ep,
    qb: Ep,
    cqa: Cq,
    cqb: Cq,
    ma: Mem,
    mb: Mem,
    conn: Conn,
}

impl World {
    fn new(wire: SimConfig, conn: Conn) -> Self {
        Self::of(IV_QPT_RC, wire, conn)
    }

    fn of(qp_type: u32, wire: SimConfig, conn: Conn) -> Self {
        let a = Node::new(1);
        let b = Node::new(2);
        let mut net = SimNet::new(&TestPlatform, wire);
        net.attach(&a.d.hca).unwrap();
        net.attach(&b.d.hca).unwrap();
        let cqa = a.cq(256);
        let cqb = b.cq(256);
        let qa = a.qp(qp_type, &cqa);
        let qb = b.qp(qp_type, &cqb);
        let ma = a.mem(MEM, ALL_ACCESS);
        let mb = b.mem(MEM, ALL_ACCESS);
        let w = Self {
            net,
            a,
            b,
            qa,
            qb,
            cqa,
            cqb,
            ma,
            mb,
            conn,
        };
        w.connect(conn);
        w
    }

    fn connect(&self, conn: Conn) {
        self.a.connect(&self.qa, self.b.gid(), self.qb.qpn, &conn);
        let back = Conn {
            sq_psn: conn.rq_psn,
            rq_psn: conn.sq_psn,
            ..conn
        };
        self.b.connect(&self.qb, self.a.gid(), self.qa.qpn, &back);
    }

    /// Both QPs back to RESET and connected again (new PSNs).
    fn reconnect(&mut self, r: &mut Rng) {
        for (node, ep) in [(&self.a, &self.qa), (&self.b, &self.qb)] {
            let from = QpState::from_abi(node.state(ep)).unwrap();
            node.to_state(ep, from, QpState::Reset);
        }
        self.conn.sq_psn = r.below(0x100_0000) as u32;
        self.conn.rq_psn = r.below(0x100_0000) as u32;
        self.connect(self.conn);
    }

    fn post_recvs(&self, first: u64, n: u64) {
        for k in first..first + n {
            let slot = RECV_AREA + (k % MAX_OPS) * SLOT;
            self.b.recv(&self.qb, k, &[self.mb.sge(slot, SLOT as u32)]);
        }
    }

    /// Posts op `i` (signaled, `wr_id` `i`).
    fn post(&self, i: u64, op: Op) {
        let slot = i % MAX_OPS;
        let src = WRITE_AREA + slot * SLOT;
        let mut wr = SendWr {
            wr_id: i,
            flags: IV_SEND_SIGNALED,
            ..SendWr::default()
        };
        let sges;
        match op {
            Op::Send { len } => {
                wr.opcode = IV_WR_SEND;
                sges = [self.ma.sge(src, len)];
            }
            Op::Write { len } | Op::WriteImm { len, .. } => {
                wr.opcode = IV_WR_RDMA_WRITE;
                if let Op::WriteImm { imm, .. } = op {
                    wr.opcode = IV_WR_RDMA_WRITE_WITH_IMM;
                    wr.imm_or_inv = imm;
                }
                wr.remote_addr = self.mb.addr + WRITE_AREA + slot * SLOT;
                wr.rkey = self.mb.lkey;
                sges = [self.ma.sge(src, len)];
            }
            Op::Read { len, from } => {
                wr.opcode = IV_WR_RDMA_READ;
                wr.remote_addr = self.mb.addr + READ_AREA + from;
                wr.rkey = self.mb.lkey;
                sges = [self.ma.sge(READ_AREA + slot * SLOT, len)];
            }
            Op::Cas {
                word,
                compare,
                swap,
            } => {
                wr.opcode = IV_WR_ATOMIC_CMP_AND_SWP;
                wr.remote_addr = self.mb.addr + ATOMIC_AREA + word * 8;
                wr.rkey = self.mb.lkey;
                wr.compare_add = compare;
                wr.swap = swap;
                sges = [self.ma.sge(ATOMIC_AREA + slot * 8, 8)];
            }
            Op::Faa { word, add } => {
                wr.opcode = IV_WR_ATOMIC_FETCH_AND_ADD;
                wr.remote_addr = self.mb.addr + ATOMIC_AREA + word * 8;
                wr.rkey = self.mb.lkey;
                wr.compare_add = add;
                sges = [self.ma.sge(ATOMIC_AREA + slot * 8, 8)];
            }
        }
        wr.sges = &sges;
        self.a.post(&self.qa, &wr);
    }
}

/// What the ops must have done, replayed in order.
struct Model {
    words: [u64; WORDS as usize],
}

/// Checks the completions of ops `first..first + ops.len()`: every one
/// exactly once, in order; successes carry their data; after a failure
/// only flushes. Returns whether all succeeded.
fn check(
    w: &World,
    first: u64,
    ops: &[Op],
    model: &mut Model,
    recv_base: u64,
) -> Result<bool, String> {
    let cqes = w.cqa.poll();
    if cqes.len() != ops.len() {
        return Err(format!(
            "{} completions for {} WQEs: {cqes:?}",
            cqes.len(),
            ops.len()
        ));
    }
    let recvs = w.cqb.poll();
    let mut recv_k = recv_base;
    let mut recv_i = 0;
    let mut failed = None;
    for (n, (cqe, op)) in cqes.iter().zip(ops).enumerate() {
        let i = first + n as u64;
        if cqe.wr_id != i {
            return Err(format!("completion {n} is wr_id {} (want {i})", cqe.wr_id));
        }
        if let Some(f) = failed {
            if cqe.status != IV_WC_WR_FLUSH_ERR {
                return Err(format!("wr {i} after failed wr {f}: status {}", cqe.status));
            }
            continue;
        }
        if cqe.status != IV_WC_SUCCESS {
            if !matches!(cqe.status, IV_WC_RETRY_EXC_ERR | IV_WC_RNR_RETRY_EXC_ERR) {
                return Err(format!("wr {i} ({op:?}) failed with status {}", cqe.status));
            }
            failed = Some(i);
            continue;
        }
        let slot = i % MAX_OPS;
        let src = (WRITE_AREA + slot * SLOT) as usize;
        match *op {
            Op::Send { len } | Op::WriteImm { len, .. } => {
                let Some(r) = recvs.get(recv_i) else {
                    return Err(format!("wr {i} ({op:?}) done but no receive completion"));
                };
                recv_i += 1;
                if r.wr_id != recv_k || r.status != IV_WC_SUCCESS {
                    return Err(format!("receive for wr {i}: {r:?} (want wr_id {recv_k})"));
                }
                if let Op::Send { .. } = op {
                    let at = (RECV_AREA + (recv_k % MAX_OPS) * SLOT) as usize;
                    if r.byte_len != len
                        || w.mb.read(at, len as usize) != w.ma.read(src, len as usize)
                    {
                        return Err(format!("SEND {i} of {len} bytes arrived damaged"));
                    }
                } else {
                    let Op::WriteImm { imm, .. } = *op else {
                        unreachable!()
                    };
                    if r.imm_or_inv != imm {
                        return Err(format!("WRITE_IMM {i}: immediate {:#x}", r.imm_or_inv));
                    }
                    let at = (WRITE_AREA + slot * SLOT) as usize;
                    if w.mb.read(at, len as usize) != w.ma.read(src, len as usize) {
                        return Err(format!("WRITE_IMM {i} of {len} bytes arrived damaged"));
                    }
                }
                recv_k += 1;
            }
            Op::Write { len } => {
                let at = (WRITE_AREA + slot * SLOT) as usize;
                if w.mb.read(at, len as usize) != w.ma.read(src, len as usize) {
                    return Err(format!("WRITE {i} of {len} bytes arrived damaged"));
                }
            }
            Op::Read { len, from } => {
                let want = w.mb.read((READ_AREA + from) as usize, len as usize);
                let got = w.ma.read((READ_AREA + slot * SLOT) as usize, len as usize);
                if cqe.byte_len != len || got != want {
                    return Err(format!("READ {i} of {len} bytes came back damaged"));
                }
            }
            Op::Cas {
                word,
                compare,
                swap,
            } => {
                let v = &mut model.words[word as usize];
                let orig = w.ma.u64_at((ATOMIC_AREA + slot * 8) as usize);
                if orig != *v {
                    return Err(format!("CAS {i}: original {orig:#x}, want {:#x}", *v));
                }
                if *v == compare {
                    *v = swap;
                }
            }
            Op::Faa { word, add } => {
                let v = &mut model.words[word as usize];
                let orig = w.ma.u64_at((ATOMIC_AREA + slot * 8) as usize);
                if orig != *v {
                    return Err(format!("FAA {i}: original {orig:#x}, want {:#x}", *v));
                }
                *v = v.wrapping_add(add);
            }
        }
    }
    if failed.is_none() {
        for word in 0..WORDS {
            let got = w.mb.u64_at((ATOMIC_AREA + word * 8) as usize);
            if got != model.words[word as usize] {
                return Err(format!(
                    "word {word} is {got:#x}, want {:#x}",
                    model.words[word as usize]
                ));
            }
        }
    }
    Ok(failed.is_none())
}

/// One seed: the faulty phase, the checks, the healed phase.
fn run_seed(seed: u64, harsh: bool, attack: bool) -> Result<(), String> {
    let mut r = Rng(seed ^ 0x5151_5151);
    let mtu = [
        IV_MTU_256,
        IV_MTU_512,
        IV_MTU_1024,
        IV_MTU_2048,
        IV_MTU_4096,
    ][r.below(5) as usize];
    let mtu_bytes = 128u32 << mtu;
    let mut wire = faults(&mut r, seed, harsh);
    // Under attack, one seed in three has a wire without faults (no loss,
    // duplicate, corruption or reordering): then nothing may fail.
    let honest = attack && r.below(3) == 0;
    if attack {
        wire.attack_ppm = 20_000 + r.below(80_000) as u32;
        wire.attacker = ATTACKER;
        if honest {
            wire = SimConfig {
                loss_ppm: 0,
                dup_ppm: 0,
                corrupt_ppm: 0,
                jitter_ns: 0,
                ..wire
            };
        }
    }
    let conn = Conn {
        mtu,
        sq_psn: r.below(0x100_0000) as u32,
        rq_psn: r.below(0x100_0000) as u32,
        rd_atomic: 1 + r.below(16) as u8,
        ..Conn::default()
    };
    let mut w = World::new(wire, conn);
    w.ma.write(0, &pattern(MEM as usize, seed as u8));
    w.mb.write(
        READ_AREA as usize,
        &pattern((SLOT * MAX_OPS) as usize, !seed as u8),
    );
    let mut model = Model {
        words: [0; WORDS as usize],
    };
    for k in 0..WORDS {
        let v = r.next();
        model.words[k as usize] = v;
        w.mb.write((ATOMIC_AREA + k * 8) as usize, &v.to_ne_bytes());
    }
    let n = 1 + r.below(MAX_OPS);
    let mut ops = Vec::new();
    for _ in 0..n {
        ops.push(Op::random(&mut r, mtu_bytes, &model.words));
    }
    let recvs = ops.iter().filter(|o| o.consumes_recv()).count() as u64;
    let late_recvs = r.below(4) == 0;
    if !late_recvs {
        w.post_recvs(0, recvs);
    }
    for (i, &op) in ops.iter().enumerate() {
        w.post(i as u64, op);
    }
    if late_recvs {
        // The responder has no receive: RNR NAKs, the RNR timer, retries.
        let t = w.net.now() + 2_000_000;
        w.net.run(t);
        w.post_recvs(0, recvs);
    }
    w.net.run(PHASE_LIMIT_NS);
    let all_ok = check(&w, 0, &ops, &mut model, 0)?;
    if honest && !all_ok {
        return Err(format!(
            "the forgeries made a WQE fail on a wire without faults: {:?}; requester {:?}, responder {:?}",
            w.net.stats(),
            w.a.d.hca.stats(),
            w.b.d.hca.stats()
        ));
    }
    let stats = w.net.stats();
    let dropped = w.a.d.hca.link_stats().rx_dropped.total_drops()
        + w.b.d.hca.link_stats().rx_dropped.total_drops();
    if dropped != stats.corrupted {
        return Err(format!(
            "{} corrupted datagrams, {dropped} dropped: {stats:?}",
            stats.corrupted
        ));
    }
    // Heal the wire; reconnect if the QP failed; new traffic completes.
    w.net.set_config(SimConfig {
        delay_ns: 5_000,
        ..SimConfig::default()
    });
    let first;
    let recv_base;
    if all_ok {
        first = n;
        recv_base = recvs;
    } else {
        w.reconnect(&mut r);
        let _ = w.cqb.poll();
        first = 0;
        recv_base = 0;
        // The failed phase left the atomic words in an unknown state.
        for k in 0..WORDS {
            model.words[k as usize] = w.mb.u64_at((ATOMIC_AREA + k * 8) as usize);
        }
    }
    let fit = |n: u32| n.min(SLOT as u32);
    let healed = [
        Op::Send {
            len: fit(mtu_bytes + 7),
        },
        Op::Write {
            len: fit(3 * mtu_bytes / 2),
        },
        Op::Read {
            len: fit(mtu_bytes * 2),
            from: 5,
        },
        Op::Faa { word: 1, add: 3 },
        Op::WriteImm {
            len: 9,
            imm: 0xFEED,
        },
    ];
    w.post_recvs(recv_base, 2);
    for (k, &op) in healed.iter().enumerate() {
        w.post(first + k as u64, op);
    }
    w.net.run(w.net.now() + PHASE_LIMIT_NS);
    if !check(&w, first, &healed, &mut model, recv_base)? {
        return Err(String::from("the healed wire did not carry the traffic"));
    }
    if attack {
        // Every forgery from the third host's address was dropped as
        // foreign, and only those.
        let attacks = w.net.stats().attacks;
        let foreign = w.a.d.hca.stats().untrusted.foreign_address
            + w.b.d.hca.stats().untrusted.foreign_address;
        if foreign != attacks.foreign {
            return Err(format!(
                "{} forgeries from a third host, {foreign} dropped as foreign: {attacks:?}",
                attacks.foreign
            ));
        }
    }
    Ok(())
}

/// The third host's address (10.0.0.66).
const ATTACKER: crate::wire::packet::Gid = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 10, 0, 0, 66];

fn seeds(default: u64) -> Vec<u64> {
    if let Ok(s) = std::env::var("IRPVERBS_SIM_SEED") {
        return s.parse().map(|s| alloc::vec![s]).unwrap_or_default();
    }
    let n = std::env::var("IRPVERBS_SIM_SEEDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default);
    (1..=n).collect()
}

fn run_seeds(default: u64, harsh: bool, salt: u64) {
    run_seeds_with(default, harsh, false, salt);
}

fn run_seeds_with(default: u64, harsh: bool, attack: bool, salt: u64) {
    for seed in seeds(default) {
        let seed = seed ^ salt;
        let r = catch_unwind(AssertUnwindSafe(|| run_seed(seed, harsh, attack)));
        match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!(
                "seed {seed} (harsh: {harsh}): {e}; replay: IRPVERBS_SIM_SEED={}",
                seed ^ salt
            ),
            Err(_) => panic!(
                "seed {seed} (harsh: {harsh}) panicked; replay: IRPVERBS_SIM_SEED={}",
                seed ^ salt
            ),
        }
    }
}

/// The wire's faults for a seed (`harsh`: up to 40 % loss).
fn faults(r: &mut Rng, seed: u64, harsh: bool) -> SimConfig {
    let pct = |r: &mut Rng, max: u64| (r.below(max + 1) * 10_000) as u32;
    SimConfig {
        seed,
        loss_ppm: pct(r, if harsh { 40 } else { 8 }),
        dup_ppm: pct(r, 5),
        corrupt_ppm: pct(r, 5),
        delay_ns: 5_000,
        jitter_ns: r.below(3) * 20_000,
        queue_limit: 0,
        ..SimConfig::default()
    }
}

/// UC or UD under faults: every send WQE completes successfully (UC and UD
/// complete once sent); what arrives is intact, in order for UC (a message
/// with a gap is dropped whole), possibly duplicated or reordered for UD;
/// every corrupted datagram is dropped.
fn run_unreliable(seed: u64, qp_type: u32) -> Result<(), String> {
    let mut r = Rng(seed ^ 0x0C0C_0D0D);
    let ud = qp_type == IV_QPT_UD;
    let mtu = [IV_MTU_256, IV_MTU_1024, IV_MTU_4096][r.below(3) as usize];
    let mtu_bytes = 128u32 << mtu;
    let wire = faults(&mut r, seed, false);
    let conn = Conn {
        mtu,
        sq_psn: r.below(0x100_0000) as u32,
        rq_psn: r.below(0x100_0000) as u32,
        ..Conn::default()
    };
    let w = World::of(qp_type, wire, conn);
    let ahn = ud.then(|| crate::tests::dp::ah(&w.a, w.a.pd, w.b.gid()));
    // UD posts a receive for each copy a duplicating wire may deliver.
    let n = 1 + r.below(if ud { MAX_OPS / 2 } else { MAX_OPS });
    w.post_recvs(0, if ud { 2 * n } else { n });
    let mut lens = Vec::new();
    for i in 0..n {
        let max = if ud {
            mtu_bytes.min(1024)
        } else {
            3 * mtu_bytes
        };
        let len = (8 + r.below(u64::from(max) - 8) as u32).min(SLOT as u32);
        lens.push(len);
        let slot = i % MAX_OPS;
        let src = WRITE_AREA + slot * SLOT;
        // Each message starts with its index.
        w.ma.write(src as usize, &i.to_ne_bytes());
        let sges = [w.ma.sge(src, len)];
        let imm = r.below(2) == 0 && !ud;
        let mut wr = SendWr {
            wr_id: i,
            opcode: if imm {
                IV_WR_RDMA_WRITE_WITH_IMM
            } else {
                IV_WR_SEND
            },
            flags: IV_SEND_SIGNALED,
            sges: &sges,
            imm_or_inv: i as u32,
            remote_addr: w.mb.addr + WRITE_AREA + slot * SLOT,
            rkey: w.mb.lkey,
            ..SendWr::default()
        };
        if let Some(ahn) = ahn {
            wr.ud = Some((ahn, w.qb.qpn, conn.qkey));
        }
        w.a.post(&w.qa, &wr);
    }
    w.net.run(PHASE_LIMIT_NS);
    let sent = w.cqa.poll();
    if sent.len() as u64 != n
        || sent
            .iter()
            .enumerate()
            .any(|(i, c)| c.wr_id != i as u64 || c.status != IV_WC_SUCCESS)
    {
        return Err(format!("send completions: {sent:?}"));
    }
    let mut last: Option<u64> = None;
    for c in w.cqb.poll() {
        if c.status != IV_WC_SUCCESS {
            return Err(format!("receive failed: {c:?}"));
        }
        let (i, at, len) = if c.opcode == IV_WC_OP_RECV_RDMA_WITH_IMM {
            let i = u64::from(c.imm_or_inv);
            (
                i,
                WRITE_AREA + (i % MAX_OPS) * SLOT,
                *lens.get(i as usize).unwrap_or(&0),
            )
        } else {
            let grh = if ud { 40 } else { 0 };
            let at = RECV_AREA + (c.wr_id % MAX_OPS) * SLOT + grh;
            let i = w.mb.u64_at(at as usize);
            let Some(&len) = lens.get(i as usize) else {
                return Err(format!("a message with an unknown index {i}"));
            };
            if c.byte_len != len + grh as u32 {
                return Err(format!("message {i}: {} bytes, sent {len}", c.byte_len));
            }
            (i, at, len)
        };
        let src = (WRITE_AREA + (i % MAX_OPS) * SLOT) as usize;
        if w.mb.read(at as usize, len as usize) != w.ma.read(src, len as usize) {
            return Err(format!("message {i} arrived damaged"));
        }
        if !ud && last.is_some_and(|l| i <= l) {
            return Err(format!(
                "UC message {i} after {last:?}: out of order or twice"
            ));
        }
        last = Some(i);
    }
    let stats = w.net.stats();
    let dropped = w.a.d.hca.link_stats().rx_dropped.total_drops()
        + w.b.d.hca.link_stats().rx_dropped.total_drops();
    if dropped != stats.corrupted {
        return Err(format!("{} corrupted, {dropped} dropped", stats.corrupted));
    }
    Ok(())
}

#[test]
fn uc_over_a_faulty_wire() {
    for seed in seeds(400) {
        if let Err(e) = run_unreliable(seed, IV_QPT_UC) {
            panic!("seed {seed}: {e}; replay: IRPVERBS_SIM_SEED={seed}");
        }
    }
}

#[test]
fn ud_over_a_faulty_wire() {
    for seed in seeds(400) {
        if let Err(e) = run_unreliable(seed, IV_QPT_UD) {
            panic!("seed {seed}: {e}; replay: IRPVERBS_SIM_SEED={seed}");
        }
    }
}

#[test]
fn rc_over_a_faulty_wire() {
    run_seeds(1500, false, 0);
}

#[test]
fn rc_over_a_harsh_wire() {
    run_seeds(500, true, 0xA5A5_0000);
}

/// RC with a third host on the wire forging, spoofing and replaying (see
/// the module docs). A failing seed replays alone with
/// `IRPVERBS_SIM_SEED=n cargo test -p irpverbs-soft --lib rc_under_attack`.
#[test]
fn rc_under_attack() {
    run_seeds_with(600, false, true, 0x0BAD_0000);
}

/// A tap sees every datagram its HCA sends and receives, bad ones too.
#[test]
fn the_tap_sees_both_directions() {
    use crate::net::link::{Datagram, Direction, Tap};
    use std::sync::Mutex;
    #[derive(Default)]
    struct Count(Mutex<[u64; 2]>);
    impl Tap for Count {
        fn tap(&self, direction: Direction, _: &Datagram<'_>) {
            self.0.lock().unwrap()[usize::from(direction == Direction::Received)] += 1;
        }
    }
    let wire = SimConfig {
        seed: 7,
        corrupt_ppm: 1_000_000,
        delay_ns: 1_000,
        ..SimConfig::default()
    };
    let w = World::new(wire, Conn::default());
    let tap = alloc::sync::Arc::new(Count::default());
    let tap_b = alloc::sync::Arc::new(Count::default());
    w.a.d.hca.set_tap(Some(tap.clone()));
    w.b.d.hca.set_tap(Some(tap_b.clone()));
    w.post_recvs(0, 1);
    w.post(0, Op::Send { len: 100 });
    // Every copy is corrupted: the SEND is retried until it fails.
    w.net.run(PHASE_LIMIT_NS);
    let [sent, received] = *tap.0.lock().unwrap();
    let stats = w.net.stats();
    assert_eq!(sent, stats.transmitted - received, "every datagram a sent");
    assert_eq!(sent, 8, "the first transmission and 7 retries");
    assert_eq!(received, 0, "b dropped every corrupted request: no ACK");
    assert_eq!(w.b.d.hca.link_stats().rx_dropped.total_drops(), 8);
    assert_eq!(
        *tap_b.0.lock().unwrap(),
        [0, 8],
        "b saw the bad ones arrive"
    );
    assert_eq!(w.cqa.poll()[0].status, IV_WC_RETRY_EXC_ERR);
    w.a.d.hca.set_tap(None);
}

/// On a wire that loses nothing, receives posted one at a time while
/// traffic of every opcode waits on RNR NAKs cost no transport retry:
/// every WQE completes, and only the RNR timer resends.
#[test]
fn rnr_on_a_clean_wire_costs_no_retry() {
    for seed in seeds(300) {
        let mut r = Rng(seed ^ 0x3333);
        let wire = SimConfig {
            seed,
            delay_ns: 2_000 + r.below(3) * 40_000,
            jitter_ns: 0,
            ..SimConfig::default()
        };
        let conn = Conn {
            mtu: [IV_MTU_256, IV_MTU_1024][r.below(2) as usize],
            rd_atomic: 1 + r.below(4) as u8,
            ..Conn::default()
        };
        let w = World::new(wire, conn);
        let mut model = Model {
            words: [0; WORDS as usize],
        };
        let n = 4 + r.below(MAX_OPS - 4);
        let mut ops = Vec::new();
        for i in 0..n {
            let op = Op::random(&mut r, 1024, &model.words);
            ops.push(op);
            w.post(i, op);
        }
        let recvs = ops.iter().filter(|o| o.consumes_recv()).count() as u64;
        for k in 0..recvs {
            let t = w.net.now() + 100_000 + r.below(600_000);
            w.net.run(t);
            w.post_recvs(k, 1);
        }
        w.net.run(PHASE_LIMIT_NS);
        let ok = check(&w, 0, &ops, &mut model, 0);
        let s = w.a.d.hca.stats();
        assert!(
            ok == Ok(true) && s.retries == 0,
            "seed {seed}: {ok:?}, {s:?}; replay: IRPVERBS_SIM_SEED={seed}"
        );
    }
}

/// A link that keeps what it is given, call by call.
#[derive(Default)]
struct Capture(std::sync::Mutex<Vec<Vec<OwnedDatagram>>>);

impl crate::net::link::Link for Capture {
    fn transmit(&self, batch: &crate::net::link::TxBatch) {
        let call = batch
            .iter()
            .map(|d| OwnedDatagram::try_of(&d).unwrap())
            .collect();
        self.0.lock().unwrap().push(call);
    }
    fn now_ns(&self) -> u64 {
        0
    }
}

impl Capture {
    fn take(&self) -> Vec<Vec<OwnedDatagram>> {
        core::mem::take(&mut *self.0.lock().unwrap())
    }
}

fn deliver(to: &Node, d: &OwnedDatagram) {
    to.d.hca.receive_queued(&d.view()).unwrap();
}

/// A busy-polling receiver holds the ACKs it owes (`run_deferred(false)`)
/// and sends them with its answer in one transmit call; otherwise
/// `flush_transmit` sends them.
#[test]
fn deferred_acks_leave_with_the_answer() {
    let (a, b) = (Node::new(1), Node::new(2));
    let (la, lb) = (
        alloc::sync::Arc::new(Capture::default()),
        alloc::sync::Arc::new(Capture::default()),
    );
    a.d.hca.attach_link(la.clone()).unwrap();
    b.d.hca.attach_link(lb.clone()).unwrap();
    let (cqa, cqb) = (a.cq(16), b.cq(16));
    let (qa, qb) = (a.qp(IV_QPT_RC, &cqa), b.qp(IV_QPT_RC, &cqb));
    let c = Conn::default();
    a.connect(&qa, b.gid(), qb.qpn, &c);
    let back = Conn {
        sq_psn: c.rq_psn,
        rq_psn: c.sq_psn,
        ..c
    };
    b.connect(&qb, a.gid(), qa.qpn, &back);
    let ma = a.mem(4096, ALL_ACCESS);
    let mb = b.mem(4096, ALL_ACCESS);
    b.recv(&qb, 1, &[mb.sge(0, 64)]);
    a.recv(&qa, 2, &[ma.sge(0, 64)]);
    let send = |node: &Node, ep: &Ep, wr_id: u64| {
        node.post(
            ep,
            &SendWr {
                inline: Some(b"ping"),
                ..crate::tests::dp::signaled(wr_id, IV_WR_SEND)
            },
        );
    };
    send(&a, &qa, 10);
    let calls = la.take();
    assert_eq!(calls.len(), 1, "the SEND");
    deliver(&b, &calls[0][0]);
    b.d.hca.run_deferred(false);
    assert_eq!(cqb.poll().len(), 1, "b got the SEND");
    assert!(lb.take().is_empty(), "its ACK is held");
    // b answers: the ACK and the answer leave in one call.
    send(&b, &qb, 20);
    let calls = lb.take();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].len(), 2, "the ACK and the SEND together");
    for d in &calls[0] {
        deliver(&a, d);
    }
    a.d.hca.run_deferred(true);
    let done: Vec<u64> = cqa.poll().iter().map(|c| c.wr_id).collect();
    assert_eq!(
        done.len(),
        2,
        "a's SEND acknowledged, b's received: {done:?}"
    );
    // a flushed its ACK for b's SEND right away (run_deferred(true)).
    let calls = la.take();
    assert_eq!(calls.len(), 1);
    deliver(&b, &calls[0][0]);
    b.d.hca.run_deferred(false);
    assert_eq!(cqb.poll().iter().map(|c| c.wr_id).collect::<Vec<_>>(), [20]);
    // Nothing owed, nothing held; flush_transmit with nothing queued is a
    // no-op.
    b.d.hca.flush_transmit();
    assert!(lb.take().is_empty());
    a.d.hca.detach_link();
    b.d.hca.detach_link();
}

/// Delivers everything both captures hold, back and forth, until neither
/// side sends (at most `rounds` rounds); how many datagrams `a` sent.
fn exchange(a: &Node, la: &Capture, b: &Node, lb: &Capture, rounds: usize) -> usize {
    let mut from_a = 0;
    for _ in 0..rounds {
        let (ta, tb) = (la.take(), lb.take());
        if ta.is_empty() && tb.is_empty() {
            break;
        }
        for d in ta.iter().flatten() {
            from_a += 1;
            deliver(b, d);
        }
        b.d.hca.run_deferred(true);
        for d in tb.iter().flatten() {
            deliver(a, d);
        }
        a.d.hca.run_deferred(true);
    }
    from_a
}

/// The ACK timer fires while the responder had every request (its ACKs
/// were lost, or late as under load): the requester goes back to the
/// oldest WRITE and sends again what its window, a quarter of what it was,
/// allows; the responder answers the duplicates with ACKs for the last PSN
/// it has, past what the requester sent again. Those ACKs complete what
/// they cover and count as progress (the retries start again); they are
/// not forgeries ahead of the window. (Dropping them left the requester
/// at its window until the timer fired again, out of retries.)
#[test]
fn an_ack_past_a_rewind_completes_what_it_covers() {
    const LEN: u32 = 64 << 10;
    let (a, b) = (Node::new(1), Node::new(2));
    let (la, lb) = (
        alloc::sync::Arc::new(Capture::default()),
        alloc::sync::Arc::new(Capture::default()),
    );
    a.d.hca.attach_link(la.clone()).unwrap();
    b.d.hca.attach_link(lb.clone()).unwrap();
    let (cqa, cqb) = (a.cq(16), b.cq(16));
    let (qa, qb) = (a.qp(IV_QPT_RC, &cqa), b.qp(IV_QPT_RC, &cqb));
    let conn = Conn {
        mtu: IV_MTU_256,
        retry_cnt: 1,
        ..Conn::default()
    };
    a.connect(&qa, b.gid(), qb.qpn, &conn);
    b.connect(&qb, a.gid(), qa.qpn, &conn);
    let (ma, mb) = (
        a.mem(4 * u64::from(LEN), ALL_ACCESS),
        b.mem(4 * u64::from(LEN), ALL_ACCESS),
    );
    ma.write(0, &pattern(4 * LEN as usize, 3));
    for k in 0..4u64 {
        let src = [ma.sge(k * u64::from(LEN), LEN)];
        a.post(
            &qa,
            &SendWr {
                sges: &src,
                remote_addr: mb.addr + k * u64::from(LEN),
                rkey: mb.lkey,
                ..crate::tests::dp::signaled(k, IV_WR_RDMA_WRITE)
            },
        );
    }
    // Every request arrives; every ACK is lost.
    let sent: Vec<OwnedDatagram> = la.take().into_iter().flatten().collect();
    assert_eq!(sent.len(), 1024, "four WRITEs of 256 packets");
    for d in &sent {
        deliver(&b, d);
    }
    b.d.hca.run_deferred(true);
    assert!(!lb.take().is_empty(), "b ACKed");
    assert!(mb.read(0, 4 * LEN as usize) == pattern(4 * LEN as usize, 3));
    // Two timeouts: the first spends the one retry; each goes back to the
    // first WRITE. Without the ACKs past the rewind believed, the second
    // fails the WRITE with RETRY_EXC_ERR.
    for round in 0..2 {
        let at = a.d.hca.next_deadline().expect("the ACK timer");
        a.d.hca.advance_clock(at);
        exchange(&a, &la, &b, &lb, 64);
        let done: Vec<(u64, u32)> = cqa.poll().iter().map(|c| (c.wr_id, c.status)).collect();
        let s = a.d.hca.stats();
        assert_eq!(s.untrusted.total(), 0, "round {round}: {s:?}");
        assert_eq!(
            done,
            [
                (0, IV_WC_SUCCESS),
                (1, IV_WC_SUCCESS),
                (2, IV_WC_SUCCESS),
                (3, IV_WC_SUCCESS)
            ],
            "round {round}: {s:?}"
        );
        assert_eq!(s.retries, round + 1, "{s:?}");
        if round == 0 {
            // Again: everything arrives, the ACKs are lost.
            for k in 0..4u64 {
                let src = [ma.sge(k * u64::from(LEN), LEN)];
                a.post(
                    &qa,
                    &SendWr {
                        sges: &src,
                        remote_addr: mb.addr + k * u64::from(LEN),
                        rkey: mb.lkey,
                        ..crate::tests::dp::signaled(k, IV_WR_RDMA_WRITE)
                    },
                );
            }
            for d in la.take().iter().flatten() {
                deliver(&b, d);
            }
            b.d.hca.run_deferred(true);
            assert!(!lb.take().is_empty());
        }
    }
    assert_eq!(a.d.hca.next_deadline(), None, "nothing outstanding");
    a.d.hca.detach_link();
    b.d.hca.detach_link();
}

/// A wire that holds at most 512 datagrams in flight, as a receiving
/// socket's buffer does: two 768 KiB WRITEs and a 256 KiB READ at a
/// 256-byte MTU (3,072 packets each WRITE, half again the first congestion
/// window) lose what does not fit at first; the window shrinks and each
/// go-back-N resends no more than it, until what is sent fits. Every WR
/// completes with its data, within the retries (without the window each
/// resend is lost again the same way and the QP fails with
/// RETRY_EXC_ERR).
#[test]
fn a_window_past_the_wire_s_buffer_shrinks_instead_of_collapsing() {
    const WRITE: u64 = 768 << 10;
    const READ: u64 = 256 << 10;
    let wire = SimConfig {
        seed: 7,
        delay_ns: 20_000,
        queue_limit: 512,
        ..SimConfig::default()
    };
    let (a, b) = (Node::new(1), Node::new(2));
    let mut net = SimNet::new(&TestPlatform, wire);
    net.attach(&a.d.hca).unwrap();
    net.attach(&b.d.hca).unwrap();
    let (cqa, cqb) = (a.cq(64), b.cq(64));
    let (qa, qb) = (a.qp(IV_QPT_RC, &cqa), b.qp(IV_QPT_RC, &cqb));
    let (ma, mb) = (a.mem(1 << 20, ALL_ACCESS), b.mem(1 << 20, ALL_ACCESS));
    let conn = Conn {
        mtu: IV_MTU_256,
        ..Conn::default()
    };
    a.connect(&qa, b.gid(), qb.qpn, &conn);
    b.connect(&qb, a.gid(), qa.qpn, &conn);
    ma.write(0, &pattern(WRITE as usize, 1));
    mb.write(WRITE as usize, &pattern(READ as usize, 2));
    let src = [ma.sge(0, WRITE as u32)];
    let dst = [ma.sge(WRITE, READ as u32)];
    for k in 0..2 {
        a.post(
            &qa,
            &SendWr {
                sges: &src,
                remote_addr: mb.addr,
                rkey: mb.lkey,
                ..crate::tests::dp::signaled(k, IV_WR_RDMA_WRITE)
            },
        );
    }
    a.post(
        &qa,
        &SendWr {
            sges: &dst,
            remote_addr: mb.addr + WRITE,
            rkey: mb.lkey,
            ..crate::tests::dp::signaled(2, IV_WR_RDMA_READ)
        },
    );
    net.run(PHASE_LIMIT_NS);
    let done: Vec<(u64, u32)> = cqa.poll().iter().map(|c| (c.wr_id, c.status)).collect();
    let (s, w) = (a.d.hca.stats(), net.stats());
    assert_eq!(
        done,
        [(0, IV_WC_SUCCESS), (1, IV_WC_SUCCESS), (2, IV_WC_SUCCESS)],
        "{s:?} {w:?}"
    );
    assert!(mb.read(0, WRITE as usize) == pattern(WRITE as usize, 1));
    assert!(ma.read(WRITE as usize, READ as usize) == pattern(READ as usize, 2));
    assert!(
        w.overflowed > 0 && s.retries > 0,
        "the first window did not fit: {s:?} {w:?}"
    );
}
