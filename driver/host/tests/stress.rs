//! Multi-threaded data-path stress over the host device, verifier on.
//!
//! Soft HCA only: each side registers one region of about 16 MiB, more
//! than the model HCA's `max_mr_size` (its page list travels in the
//! command mailbox; docs/hardware-seam.md).
//!
//! Sixteen RC pairs, half of them sending each way, on CQs shared by four
//! QPs each (both directions' QPs: every CQ gets send and receive
//! completions of pairs owned by every thread). Four threads post — each
//! owns four pairs' requesters — and every thread polls every CQ, so a
//! completion is often reaped (and a receive reposted) by a thread that
//! did not post it. Each pair runs a fixed mix of SEND (gathered, inline,
//! with immediate), RDMA WRITE, WRITE with immediate, RDMA READ,
//! compare-and-swap and fetch-and-add, every work request signaled, each
//! with data derived from the pair and its sequence number, in buffers used
//! once. Few receives are kept posted, so RNR NAKs and retries happen
//! under load. Meanwhile a fifth thread waits on each CQ in turn with
//! `CQ_NOTIFY` (next completion: interrupt, DPC, request completion while
//! the rings are busy) and queries QPs.
//!
//! Checked, whatever the timing: every work request completes exactly once
//! (counted per `wr_id`) with success and the right opcode, QP and length;
//! every receive matches the message the sender logged for its position in
//! the receive queue, byte for byte; WRITE targets and READ destinations
//! hold their patterns; each pair's compare-and-swaps all succeed in order;
//! the fetch-and-adds on one shared counter per responder HCA return every
//! value from 0 to n-1 once and leave n. At the end the responders are
//! moved to ERR and their posted receives must flush exactly once; then
//! everything is destroyed (nothing busy: no async event was raised),
//! `quiesce`, pool back to zero, `unload` without a bugcheck.
//!
//! Runs with the firmware inline and on its own thread, over loopback (one
//! device, the pairs' sides on two files) and between two host devices
//! whose soft HCAs share a fabric.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use irpverbs_abi::*;
use irpverbs_host::loopwire::LoopWire;
use irpverbs_host::{Backend, Engine, HostDevice, HostDeviceConfig};
use irpverbs_soft::Fabric;
use irpverbs_verbs::{Client, Cq, IntoClient, Qp, SendWr, Wc, rts_steps};
use zerocopy::{FromBytes, IntoBytes};

const PAIRS: usize = 16;
const THREADS: usize = 4;
/// CQs per side; pair `p` uses CQ `p / (PAIRS / CQS)` on both sides.
const CQS: usize = 4;
/// Work requests each pair posts.
const OPS: u32 = 2000;
/// Send work requests a pair has outstanding at most.
const WINDOW: u32 = 12;
/// Receives each responder keeps posted (few: RNR NAKs happen).
const RQ_DEPTH: u32 = 4;
/// Bytes of one buffer slot (a message is at most this long).
const SLOT: u64 = 256;
/// Per-side header: the fetch-and-add counter, then one CAS word per pair.
const COUNTER: u64 = 0;
const CAS_WORDS: u64 = 64;
const HEADER: u64 = 4096;
const PAIR_SPAN: u64 = (OPS as u64 + OPS as u64 + RQ_DEPTH as u64) * SLOT;
const MEM_BYTES: u64 = HEADER + PAIRS as u64 * PAIR_SPAN;
/// A receive's `wr_id` has this bit set.
const RECV: u64 = 1 << 63;
/// A WR posted to end the notifier's wait has this bit set.
const WAKE: u64 = 1 << 62;
/// How long one scenario may take before it is called a hang.
const HANG: Duration = Duration::from_secs(60);

// ---- memory -------------------------------------------------------------

/// A buffer the HCA reads and writes: 8-byte words of atomics (shared
/// mutability without `unsafe`; writes never share a word with a buffer the
/// HCA is writing, since every buffer is slot-aligned).
struct Mem {
    words: Box<[AtomicU64]>,
}

impl Mem {
    fn new(len: u64) -> Self {
        Self {
            words: (0..len.div_ceil(8)).map(|_| AtomicU64::new(0)).collect(),
        }
    }
    fn addr(&self) -> u64 {
        self.words.as_ptr() as u64
    }
    fn len(&self) -> u64 {
        self.words.len() as u64 * 8
    }
    fn read(&self, off: u64, len: usize) -> Vec<u8> {
        let (first, last) = (off as usize / 8, (off as usize + len).div_ceil(8));
        let bytes: Vec<u8> = self.words[first..last]
            .iter()
            .flat_map(|w| w.load(Ordering::Acquire).to_ne_bytes())
            .collect();
        let at = off as usize - first * 8;
        bytes[at..at + len].to_vec()
    }
    fn write(&self, off: u64, data: &[u8]) {
        let (first, last) = (off as usize / 8, (off as usize + data.len()).div_ceil(8));
        let mut bytes: Vec<u8> = self.words[first..last]
            .iter()
            .flat_map(|w| w.load(Ordering::Acquire).to_ne_bytes())
            .collect();
        let at = off as usize - first * 8;
        bytes[at..at + data.len()].copy_from_slice(data);
        for (w, chunk) in self.words[first..last].iter().zip(bytes.chunks_exact(8)) {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            w.store(u64::from_ne_bytes(b), Ordering::Release);
        }
    }
    fn u64_at(&self, off: u64) -> u64 {
        self.words[off as usize / 8].load(Ordering::Acquire)
    }
}

/// The bytes of message `k` of pair `p`.
fn pattern(p: usize, k: u32, len: u32) -> Vec<u8> {
    (0..len as usize)
        .map(|i| ((p * 7919 + k as usize * 1031 + i * 31) % 251) as u8 ^ 0xA5)
        .collect()
}

// ---- the operation mix ----------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    /// Gathered from two pieces.
    Send,
    SendInline,
    SendImm,
    Write,
    WriteImm,
    Read,
    FetchAdd,
    CmpSwap,
}

/// Op `k` of every pair, and its length.
fn op(k: u32) -> (Op, u32) {
    match k % 10 {
        0 => (Op::Send, 64 + (k * 7) % 192),
        1 => (Op::SendInline, 1 + k % 64),
        2 | 6 => (Op::Write, 1 + (k * 13) % 255),
        3 => (Op::WriteImm, (k * 5) % 256),
        4 | 8 => (Op::Read, 1 + (k * 11) % 255),
        5 => (Op::SendImm, 2 + (k * 3) % 200),
        7 => (Op::FetchAdd, 8),
        _ => (Op::CmpSwap, 8),
    }
}

impl Op {
    fn consumes_receive(self) -> bool {
        matches!(self, Op::Send | Op::SendInline | Op::SendImm | Op::WriteImm)
    }
    fn wr_opcode(self) -> u8 {
        match self {
            Op::Send | Op::SendInline => IV_WR_SEND,
            Op::SendImm => IV_WR_SEND_WITH_IMM,
            Op::Write => IV_WR_RDMA_WRITE,
            Op::WriteImm => IV_WR_RDMA_WRITE_WITH_IMM,
            Op::Read => IV_WR_RDMA_READ,
            Op::FetchAdd => IV_WR_ATOMIC_FETCH_AND_ADD,
            Op::CmpSwap => IV_WR_ATOMIC_CMP_AND_SWP,
        }
    }
    fn wc_opcode(self) -> u32 {
        match self {
            Op::Send | Op::SendInline | Op::SendImm => IV_WC_OP_SEND,
            Op::Write | Op::WriteImm => IV_WC_OP_RDMA_WRITE,
            Op::Read => IV_WC_OP_RDMA_READ,
            Op::FetchAdd => IV_WC_OP_FETCH_ADD,
            Op::CmpSwap => IV_WC_OP_COMP_SWAP,
        }
    }
}

fn imm(p: usize, k: u32) -> u32 {
    ((p as u32) << 24) | k
}

// ---- the rig ------------------------------------------------------------

/// One side: an open of a device with the speed path, its PD and memory.
struct Side {
    c: Client,
    pd: IvHandle,
    gid: [u8; 16],
    mem: Mem,
    lkey: u32,
    rkey: u32,
}

impl Side {
    fn open(dev: &Arc<HostDevice>) -> Self {
        let c = dev
            .open(FILE_READ_ACCESS | FILE_WRITE_ACCESS)
            .expect("open")
            .into_client();
        let pd = c.alloc_pd().expect("alloc_pd").pd;
        let gid = c.query_gid(1, 0).expect("query_gid");
        let mem = Mem::new(MEM_BYTES);
        let mr = c
            .reg_mr(pd, mem.addr(), mem.len(), IV_ACCESS_ALL)
            .expect("reg_mr");
        Self {
            c,
            pd,
            gid,
            mem,
            lkey: mr.lkey,
            rkey: mr.rkey,
        }
    }

    fn at(&self, off: u64) -> u64 {
        self.mem.addr() + off
    }

    fn sge(&self, off: u64, length: u32) -> IvSge {
        IvSge {
            addr: self.at(off),
            length,
            lkey: self.lkey,
        }
    }
}

/// Op slot `k` of pair `p` (in either side's memory).
fn op_slot(p: usize, k: u32) -> u64 {
    HEADER + p as u64 * PAIR_SPAN + u64::from(k) * SLOT
}

/// Receive slot `j` of pair `p` (in the responder's memory).
fn recv_slot(p: usize, j: u32) -> u64 {
    HEADER + p as u64 * PAIR_SPAN + (u64::from(OPS) + u64::from(j)) * SLOT
}

/// Which side (0 or 1) pair `p`'s requester is on.
fn req_side(p: usize) -> usize {
    p % 2
}

/// A receive-consuming message as its sender logged it.
#[derive(Clone, Copy, Debug)]
struct Logged {
    k: u32,
    op: Op,
    len: u32,
}

/// What every thread shares about one pair.
struct PairState {
    /// Send WRs posted and not yet reaped.
    outstanding: AtomicU32,
    /// Completions per send `wr_id` (by sequence).
    send_done: Vec<AtomicU8>,
    /// Completions per receive `wr_id` (by receive sequence).
    recv_done: Vec<AtomicU8>,
    /// Receive-consuming messages in the order they were posted.
    log: Mutex<Vec<Logged>>,
    /// Receives posted (the next receive sequence), under its lock so
    /// receives go on the queue in sequence order.
    recvs_posted: Mutex<u32>,
}

struct Totals {
    sends_done: AtomicU64,
    recvs_done: AtomicU64,
    bytes: AtomicU64,
    errors: Mutex<Vec<String>>,
    stop: AtomicBool,
}

impl Totals {
    fn fail(&self, e: String) {
        let mut errors = self.errors.lock().unwrap_or_else(PoisonError::into_inner);
        if errors.len() < 20 {
            errors.push(e);
        }
        self.stop.store(true, Ordering::Release);
    }
}

struct Rig<'c> {
    sides: [&'c Side; 2],
    /// `qps[p] = (requester, responder)`.
    qps: Vec<(Qp<'c>, Qp<'c>)>,
    /// `cqs[side][i]`.
    cqs: [Vec<Cq<'c>>; 2],
    pairs: Vec<PairState>,
    totals: Totals,
    recvs_expected: u64,
    /// The notifier may query QPs (until the flush).
    queries: Mutex<bool>,
}

fn qp_in(pd: IvHandle, cq: IvHandle) -> IvCreateQpIn {
    IvCreateQpIn {
        pd,
        send_cq: cq,
        recv_cq: cq,
        srq: 0,
        user_context: 0,
        qp_type: IV_QPT_RC,
        sq_sig_all: 0,
        cap: IvQpCap {
            max_send_wr: 32,
            max_recv_wr: 32,
            max_send_sge: 2,
            max_recv_sge: 1,
            max_inline_data: 64,
            reserved: 0,
        },
    }
}

fn connect(qp: &Qp<'_>, dest_qpn: u32, dgid: [u8; 16]) {
    for (mask, mut attr) in rts_steps(IV_QPT_RC, dest_qpn, dgid) {
        if attr.qp_state == IV_QPS_INIT {
            attr.qp_access_flags =
                IV_ACCESS_REMOTE_WRITE | IV_ACCESS_REMOTE_READ | IV_ACCESS_REMOTE_ATOMIC;
        }
        qp.modify(mask, &attr).expect("modify QP");
    }
}

impl<'c> Rig<'c> {
    fn new(a: &'c Side, b: &'c Side) -> Self {
        let sides = [a, b];
        let cqs = sides.map(|s| {
            (0..CQS)
                .map(|_| {
                    s.c.new_cq(&IvCreateCqIn {
                        cqe: 256,
                        ..IvCreateCqIn::default()
                    })
                    .expect("create CQ")
                })
                .collect::<Vec<_>>()
        });
        let mut qps = Vec::new();
        for p in 0..PAIRS {
            let (rs, ps) = (req_side(p), 1 - req_side(p));
            let ci = p / (PAIRS / CQS);
            let req = sides[rs]
                .c
                .new_qp(&qp_in(sides[rs].pd, cqs[rs][ci].handle()))
                .expect("create QP");
            let resp = sides[ps]
                .c
                .new_qp(&qp_in(sides[ps].pd, cqs[ps][ci].handle()))
                .expect("create QP");
            connect(&req, resp.qpn(), sides[ps].gid);
            connect(&resp, req.qpn(), sides[rs].gid);
            qps.push((req, resp));
        }
        let recvs_expected = (0..OPS).filter(|&k| op(k).0.consumes_receive()).count() as u64;
        let pairs = (0..PAIRS)
            .map(|_| PairState {
                outstanding: AtomicU32::new(0),
                send_done: (0..OPS).map(|_| AtomicU8::new(0)).collect(),
                recv_done: (0..recvs_expected as u32 + RQ_DEPTH)
                    .map(|_| AtomicU8::new(0))
                    .collect(),
                log: Mutex::new(Vec::new()),
                recvs_posted: Mutex::new(0),
            })
            .collect();
        let rig = Self {
            sides,
            qps,
            cqs,
            pairs,
            totals: Totals {
                sends_done: AtomicU64::new(0),
                recvs_done: AtomicU64::new(0),
                bytes: AtomicU64::new(0),
                errors: Mutex::new(Vec::new()),
                stop: AtomicBool::new(false),
            },
            recvs_expected: recvs_expected * PAIRS as u64,
            queries: Mutex::new(true),
        };
        for p in 0..PAIRS {
            for _ in 0..RQ_DEPTH {
                rig.post_recv(p);
            }
        }
        rig
    }

    fn req(&self, p: usize) -> &Side {
        self.sides[req_side(p)]
    }

    fn resp(&self, p: usize) -> &Side {
        self.sides[1 - req_side(p)]
    }

    /// Posts the responder's next receive, in sequence order.
    fn post_recv(&self, p: usize) {
        let mut next = self.pairs[p]
            .recvs_posted
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let j = *next;
        if j as usize >= self.pairs[p].recv_done.len() {
            return; // every receive the run needs (and RQ_DEPTH more) posted
        }
        let sge = self.resp(p).sge(recv_slot(p, j), SLOT as u32);
        match self.qps[p]
            .1
            .post_recv(RECV | (p as u64) << 32 | u64::from(j), &[sge])
        {
            Ok(()) => *next += 1,
            Err(e) => self.totals.fail(format!("pair {p}: post_recv {j}: {e:?}")),
        }
    }

    /// Posts op `k` of pair `p`.
    fn post(&self, p: usize, k: u32) {
        let (o, len) = op(k);
        let (req, resp) = (self.req(p), self.resp(p));
        let (mine, theirs) = (op_slot(p, k), op_slot(p, k));
        let data = pattern(p, k, len);
        let gather;
        let mut wr = SendWr {
            wr_id: (p as u64) << 32 | u64::from(k),
            opcode: o.wr_opcode(),
            flags: IV_SEND_SIGNALED,
            ..SendWr::default()
        };
        match o {
            Op::Send | Op::SendImm | Op::Write | Op::WriteImm => {
                req.mem.write(mine, &data);
                let half = len / 2;
                gather = [
                    req.sge(mine, half),
                    req.sge(mine + u64::from(half), len - half),
                ];
                wr.sges = if len == 0 { &[] } else { &gather };
            }
            Op::SendInline => wr.inline = Some(&data),
            Op::Read => {
                resp.mem.write(theirs, &data);
                gather = [req.sge(mine, len), IvSge::default()];
                wr.sges = &gather[..1];
            }
            Op::FetchAdd | Op::CmpSwap => {
                gather = [req.sge(mine, 8), IvSge::default()];
                wr.sges = &gather[..1];
            }
        }
        match o {
            Op::SendImm | Op::WriteImm => wr.imm_or_inv = imm(p, k),
            _ => {}
        }
        match o {
            Op::Write | Op::WriteImm | Op::Read => {
                wr.remote_addr = resp.at(theirs);
                wr.rkey = resp.rkey;
            }
            Op::FetchAdd => {
                wr.remote_addr = resp.at(COUNTER);
                wr.rkey = resp.rkey;
                wr.compare_add = 1;
            }
            Op::CmpSwap => {
                // Each pair's CAS ops run in order on its own word: the
                // k/10-th one finds k/10 there.
                wr.remote_addr = resp.at(CAS_WORDS + 8 * p as u64);
                wr.rkey = resp.rkey;
                wr.compare_add = u64::from(k / 10);
                wr.swap = u64::from(k / 10) + 1;
            }
            _ => {}
        }
        if o.consumes_receive() {
            self.pairs[p]
                .log
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(Logged { k, op: o, len });
        }
        self.pairs[p].outstanding.fetch_add(1, Ordering::AcqRel);
        if let Err(e) = self.qps[p].0.post_send(&wr) {
            self.totals
                .fail(format!("pair {p}: post_send {k} ({o:?}): {e:?}"));
        }
    }

    /// Checks and counts one completion reaped from CQ `ci` of `side`.
    fn reap(&self, side: usize, ci: usize, c: &IvCqe) {
        let w = Wc::new(c);
        let p = ((c.wr_id >> 32) & 0xFF) as usize;
        let seq = c.wr_id as u32;
        let fail = |m: String| self.totals.fail(format!("side {side} CQ {ci}: [{w}]: {m}"));
        if p >= PAIRS || p / (PAIRS / CQS) != ci {
            return fail("a wr_id of no QP on this CQ".into());
        }
        if !w.is_success() {
            return fail("failed".into());
        }
        let st = &self.pairs[p];
        if c.wr_id & RECV == 0 {
            if req_side(p) != side || c.qp_num != self.qps[p].0.qpn() {
                return fail("a send completion for another QP".into());
            }
            let Some(done) = st.send_done.get(seq as usize) else {
                return fail("no such send".into());
            };
            if done.fetch_add(1, Ordering::AcqRel) != 0 {
                return fail("completed twice".into());
            }
            let (o, len) = op(seq);
            if c.opcode != o.wc_opcode() {
                return fail(format!("opcode of a {o:?}"));
            }
            if matches!(o, Op::Read | Op::FetchAdd | Op::CmpSwap) && c.byte_len != len {
                return fail(format!("byte_len, want {len}"));
            }
            if o == Op::Read {
                let got = self.req(p).mem.read(op_slot(p, seq), len as usize);
                if got != pattern(p, seq, len) {
                    return fail("READ data differs".into());
                }
            }
            if o == Op::CmpSwap {
                let old = self.req(p).mem.u64_at(op_slot(p, seq));
                if old != u64::from(seq / 10) {
                    return fail(format!("CAS returned {old}, want {}", seq / 10));
                }
            }
            self.totals
                .bytes
                .fetch_add(u64::from(len), Ordering::Relaxed);
            st.outstanding.fetch_sub(1, Ordering::AcqRel);
            self.totals.sends_done.fetch_add(1, Ordering::AcqRel);
        } else {
            if req_side(p) == side || c.qp_num != self.qps[p].1.qpn() {
                return fail("a receive completion for another QP".into());
            }
            let Some(done) = st.recv_done.get(seq as usize) else {
                return fail("no such receive".into());
            };
            if done.fetch_add(1, Ordering::AcqRel) != 0 {
                return fail("completed twice".into());
            }
            let logged = st
                .log
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(seq as usize)
                .copied();
            let Some(m) = logged else {
                return fail("a receive with no message sent for it".into());
            };
            let resp = self.resp(p);
            let want_data = pattern(p, m.k, m.len);
            let (opcode, flags, landed) = match m.op {
                Op::WriteImm => (
                    IV_WC_OP_RECV_RDMA_WITH_IMM,
                    IV_WC_WITH_IMM,
                    resp.mem.read(op_slot(p, m.k), m.len as usize),
                ),
                o => (
                    IV_WC_OP_RECV,
                    if o == Op::SendImm { IV_WC_WITH_IMM } else { 0 },
                    resp.mem.read(recv_slot(p, seq), m.len as usize),
                ),
            };
            if c.opcode != opcode || c.wc_flags != flags || c.byte_len != m.len {
                return fail(format!("for message {} ({:?}, {} bytes)", m.k, m.op, m.len));
            }
            if flags != 0 && c.imm_or_inv != imm(p, m.k) {
                return fail(format!("immediate of message {}", m.k));
            }
            if landed != want_data {
                return fail(format!("data of message {} ({:?}) differs", m.k, m.op));
            }
            self.totals.recvs_done.fetch_add(1, Ordering::AcqRel);
            self.post_recv(p);
        }
    }

    /// Polls every CQ once, starting at `first`; the number reaped.
    fn poll_all(&self, first: usize) -> usize {
        let mut buf = [IvCqe::default(); 16];
        let mut n = 0;
        for i in 0..2 * CQS {
            let i = (first + i) % (2 * CQS);
            let (side, ci) = (i / CQS, i % CQS);
            match self.cqs[side][ci].poll(&mut buf) {
                Ok(k) => {
                    for c in &buf[..k] {
                        self.reap(side, ci, c);
                    }
                    n += k;
                }
                Err(_) => self.totals.fail(format!("side {side} CQ {ci}: corrupt")),
            }
        }
        n
    }

    fn finished(&self) -> bool {
        self.totals.sends_done.load(Ordering::Acquire) == (PAIRS as u64) * u64::from(OPS)
            && self.totals.recvs_done.load(Ordering::Acquire) == self.recvs_expected
    }

    /// One worker: posts its pairs' ops within their windows and reaps
    /// from every CQ until every completion of the run has been reaped.
    fn worker(&self, t: usize, deadline: Instant) {
        let mine: Vec<usize> = (t..PAIRS).step_by(THREADS).collect();
        let mut next = vec![0u32; mine.len()];
        while !self.totals.stop.load(Ordering::Acquire) && !self.finished() {
            let mut progress = 0;
            for (i, &p) in mine.iter().enumerate() {
                while next[i] < OPS && self.pairs[p].outstanding.load(Ordering::Acquire) < WINDOW {
                    self.post(p, next[i]);
                    next[i] += 1;
                    progress += 1;
                }
            }
            progress += self.poll_all(t * 2);
            if progress == 0 {
                if Instant::now() > deadline {
                    self.totals.fail(format!(
                        "thread {t}: no progress before the deadline: {} of {} sends, {} of {} \
                         receives reaped; posted {next:?}",
                        self.totals.sends_done.load(Ordering::Acquire),
                        PAIRS as u64 * u64::from(OPS),
                        self.totals.recvs_done.load(Ordering::Acquire),
                        self.recvs_expected,
                    ));
                    return;
                }
                std::thread::yield_now();
            }
        }
    }

    /// After the run: responders to ERR, their posted receives flushed
    /// exactly once; requesters to ERR, nothing to flush.
    fn flush(&self, deadline: Instant) -> Result<(), String> {
        *self.queries.lock().unwrap_or_else(PoisonError::into_inner) = false;
        let to_err = IvQpAttr {
            qp_state: IV_QPS_ERR,
            ..IvQpAttr::default()
        };
        for (req, resp) in &self.qps {
            resp.modify(IV_QP_STATE, &to_err)
                .map_err(|s| status_name(s).to_owned())?;
            req.modify(IV_QP_STATE, &to_err)
                .map_err(|s| status_name(s).to_owned())?;
        }
        let want = (PAIRS as u32 * RQ_DEPTH) as usize;
        let mut flushed = 0;
        let mut buf = [IvCqe::default(); 16];
        while flushed < want {
            let mut n = 0;
            for side in 0..2 {
                for (ci, cq) in self.cqs[side].iter().enumerate() {
                    let k = cq.poll(&mut buf).map_err(|_| "corrupt CQ")?;
                    for c in &buf[..k] {
                        let w = Wc::new(c);
                        let p = ((c.wr_id >> 32) & 0xFF) as usize;
                        if c.status != IV_WC_WR_FLUSH_ERR
                            || c.wr_id & RECV == 0
                            || p >= PAIRS
                            || p / (PAIRS / CQS) != ci
                            || c.qp_num != self.qps[p].1.qpn()
                        {
                            return Err(format!("at the flush: [{w}]"));
                        }
                        let Some(done) = self.pairs[p].recv_done.get(c.wr_id as u32 as usize)
                        else {
                            return Err(format!("flushed a receive never posted: [{w}]"));
                        };
                        if done.fetch_add(1, Ordering::AcqRel) != 0 {
                            return Err(format!("completed twice: [{w}]"));
                        }
                    }
                    n += k;
                }
            }
            flushed += n;
            if n == 0 {
                if Instant::now() > deadline {
                    return Err(format!("{flushed} of {want} receives flushed"));
                }
                std::thread::yield_now();
            }
        }
        std::thread::sleep(Duration::from_millis(20));
        for side in 0..2 {
            for cq in &self.cqs[side] {
                let k = cq.poll(&mut buf).map_err(|_| "corrupt CQ")?;
                if k != 0 {
                    return Err(format!("after the flush: {}", Wc::new(&buf[0])));
                }
            }
        }
        Ok(())
    }

    /// Every WR completed exactly once; the data in place; the atomics add
    /// up.
    fn verify(&self) -> Result<(), String> {
        for (p, st) in self.pairs.iter().enumerate() {
            let posted = *st
                .recvs_posted
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            for (k, d) in st.send_done.iter().enumerate() {
                let n = d.load(Ordering::Acquire);
                if n != 1 {
                    return Err(format!("pair {p} send {k}: {n} completions"));
                }
            }
            for (j, d) in st.recv_done.iter().enumerate() {
                let n = d.load(Ordering::Acquire);
                let want = u8::from((j as u32) < posted);
                if n != want {
                    return Err(format!(
                        "pair {p} receive {j}: {n} completions, want {want}"
                    ));
                }
            }
            let resp = self.resp(p);
            for k in 0..OPS {
                let (o, len) = op(k);
                if matches!(o, Op::Write | Op::WriteImm)
                    && resp.mem.read(op_slot(p, k), len as usize) != pattern(p, k, len)
                {
                    return Err(format!("pair {p}: WRITE {k} did not land"));
                }
            }
            let cas = (0..OPS).filter(|&k| op(k).0 == Op::CmpSwap).count() as u64;
            let word = resp.mem.u64_at(CAS_WORDS + 8 * p as u64);
            if word != cas {
                return Err(format!("pair {p}: CAS word {word}, want {cas}"));
            }
        }
        // Fetch-and-add: per responder side, the returned old values are
        // 0..n, each once, and the counter is n.
        for side in 0..2 {
            let mut old: Vec<u64> = Vec::new();
            for p in (0..PAIRS).filter(|&p| 1 - req_side(p) == side) {
                for k in (0..OPS).filter(|&k| op(k).0 == Op::FetchAdd) {
                    old.push(self.req(p).mem.u64_at(op_slot(p, k)));
                }
            }
            old.sort_unstable();
            let n = old.len() as u64;
            if let Some((i, v)) = (0..n).zip(&old).find(|(i, v)| i != *v) {
                return Err(format!(
                    "side {side}: the {i}-th smallest value fetch-and-add returned is {v}"
                ));
            }
            let counter = self.sides[side].mem.u64_at(COUNTER);
            if counter != n {
                return Err(format!("side {side}: counter {counter}, want {n}"));
            }
        }
        Ok(())
    }

    /// Meanwhile, on the control path: a `CQ_NOTIFY` for the next
    /// completion on each CQ in turn (it completes through the HCA's event,
    /// interrupt and DPC while the workers post and poll), and a `QUERY_QP`.
    /// Until the run is over; the last wait is ended by [`Rig::wake`].
    fn notifier(&self) -> u64 {
        let mut events = 0;
        let mut i = 0;
        while !self.finished() && !self.totals.stop.load(Ordering::Acquire) {
            let (side, ci) = (i % 2, (i / 2) % CQS);
            i += 1;
            let cq = self.cqs[side][ci].handle();
            let (st, out) = self.sides[side].c.raw(
                IOCTL_IV_CQ_NOTIFY,
                IvCqNotifyIn {
                    cq,
                    arm: IV_NOTIFY_NEXT,
                    reserved: 0,
                }
                .as_bytes(),
                size_of::<IvCqEventOut>(),
            );
            let event = IvCqEventOut::read_from_bytes(&out).ok();
            if st != STATUS_SUCCESS || event.is_none_or(|e| e.cq != cq) {
                self.totals.fail(format!(
                    "CQ_NOTIFY on side {side} CQ {ci}: {} {event:?}",
                    status_name(st)
                ));
                break;
            }
            events += 1;
            // The driver runs one command per object at a time (a QUERY_QP
            // racing the flush's MODIFY_QP on the same QP would be refused
            // as busy): queries stop before the flush starts.
            let queries = self.queries.lock().unwrap_or_else(PoisonError::into_inner);
            if *queries {
                let (req, _) = &self.qps[i % PAIRS];
                match req.query() {
                    Ok(q) if q.attr.qp_state == IV_QPS_RTS => {}
                    other => self
                        .totals
                        .fail(format!("QUERY_QP during the run: {other:?}")),
                }
            }
        }
        events
    }

    /// After the flush: ends the notifier's last wait by giving every CQ a
    /// completion (a WR posted on a requester in ERR is flushed at once)
    /// until the notifier is done; checks and counts those completions.
    fn wake(&self, done: impl Fn() -> bool, deadline: Instant) -> Result<u64, String> {
        let (mut posted, mut reaped) = (0u64, 0u64);
        let mut buf = [IvCqe::default(); 16];
        loop {
            let finished = done();
            if !finished {
                for p in (0..PAIRS).step_by(PAIRS / CQS) {
                    for q in [p, p + 1] {
                        self.qps[q]
                            .0
                            .post_send(&SendWr {
                                wr_id: WAKE | (q as u64) << 32,
                                opcode: IV_WR_SEND,
                                flags: IV_SEND_SIGNALED,
                                ..SendWr::default()
                            })
                            .map_err(|e| format!("wake post: {e:?}"))?;
                        posted += 1;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(1));
            for side in 0..2 {
                for cq in &self.cqs[side] {
                    let k = cq.poll(&mut buf).map_err(|_| "corrupt CQ")?;
                    for c in &buf[..k] {
                        let q = ((c.wr_id >> 32) & 0xFF) as usize;
                        if c.wr_id & WAKE == 0
                            || c.status != IV_WC_WR_FLUSH_ERR
                            || q >= PAIRS
                            || c.qp_num != self.qps[q].0.qpn()
                        {
                            return Err(format!("waking the notifier: [{}]", Wc::new(c)));
                        }
                    }
                    reaped += k as u64;
                }
            }
            if finished && reaped == posted {
                return Ok(posted);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the notifier did not finish: {reaped} of {posted} wake-ups reaped"
                ));
            }
        }
    }

    /// Destroys everything: no object may be busy.
    fn close(self) -> Result<(), String> {
        let Rig { qps, cqs, .. } = self;
        for (req, resp) in qps {
            for q in [req, resp] {
                let qpn = q.qpn();
                q.destroy()
                    .map_err(|(_, s)| format!("destroy QP {qpn:#x}: {}", status_name(s)))?;
            }
        }
        for cq in cqs.into_iter().flatten() {
            cq.destroy()
                .map_err(|(_, s)| format!("destroy CQ: {}", status_name(s)))?;
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Topo {
    /// One device; the two sides are two files.
    Loopback,
    /// Two devices whose soft HCAs share a fabric.
    TwoHca,
    /// Two devices whose soft HCAs exchange RoCEv2 datagrams over the
    /// in-process loopback wire.
    TwoHcaWire,
}

fn device(backend: Backend, engine: Engine, n: u8) -> Arc<HostDevice> {
    let mut config = HostDeviceConfig {
        backend,
        engine,
        ..HostDeviceConfig::default()
    };
    assert!(config.platform.verifier.enabled, "the verifier is on");
    config.soft.ip = IpAddr::V4(Ipv4Addr::new(127, 0, 0, n));
    config.soft.node_guid = 0x0200_00FF_FE00_0000 | u64::from(n);
    HostDevice::new(config).expect("host device")
}

fn finish(dev: &HostDevice) {
    dev.quiesce(Duration::from_secs(10)).expect("quiescent");
    assert_eq!(dev.platform().pool_stats().live, 0, "pool leaked");
    dev.unload();
}

fn stress(backend: Backend, engine: Engine, topo: Topo) {
    let start = Instant::now();
    let deadline = start + HANG;
    let dev_a = device(backend, engine, 1);
    let (dev_b, fabric, wire) = match topo {
        Topo::Loopback => (Arc::clone(&dev_a), None, None),
        Topo::TwoHca => {
            let dev_b = device(backend, engine, 2);
            let fabric = Fabric::new(dev_a.platform());
            fabric.attach(dev_a.soft()).expect("attach");
            fabric.attach(dev_b.soft()).expect("attach");
            (dev_b, Some(fabric), None)
        }
        Topo::TwoHcaWire => {
            let dev_b = device(backend, engine, 2);
            let wire = LoopWire::start();
            wire.attach(dev_a.soft()).expect("attach");
            wire.attach(dev_b.soft()).expect("attach");
            (dev_b, None, Some(wire))
        }
    };
    let (a, b) = (Side::open(&dev_a), Side::open(&dev_b));
    let rig = Rig::new(&a, &b);
    let (run, notified, wakes) = std::thread::scope(|n| {
        let notifier = std::thread::Builder::new()
            .name("stress-notify".into())
            .spawn_scoped(n, || rig.notifier())
            .expect("spawn");
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let rig = &rig;
                std::thread::Builder::new()
                    .name(format!("stress-{t}"))
                    .spawn_scoped(s, move || rig.worker(t, deadline))
                    .expect("spawn");
            }
        });
        let run = start.elapsed();
        let flushed = rig.flush(deadline);
        let wakes = rig.wake(|| notifier.is_finished(), deadline);
        let notified = notifier.join().expect("the notifier");
        let errors = rig
            .totals
            .errors
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        assert!(
            errors.is_empty(),
            "{engine:?} {topo:?}:\n{}\nlinks: {:?} {:?}\nsoft: {:?} {:?}",
            errors.join("\n"),
            dev_a.soft().link_stats(),
            dev_b.soft().link_stats(),
            dev_a.soft().stats(),
            dev_b.soft().stats(),
        );
        flushed.unwrap_or_else(|e| panic!("{engine:?} {topo:?}: flush: {e}"));
        let wakes = wakes.unwrap_or_else(|e| panic!("{engine:?} {topo:?}: {e}"));
        (run, notified, wakes)
    });
    rig.verify()
        .unwrap_or_else(|e| panic!("{engine:?} {topo:?}: {e}"));
    let messages = rig.totals.sends_done.load(Ordering::Acquire);
    let recvs = rig.totals.recvs_done.load(Ordering::Acquire);
    let bytes = rig.totals.bytes.load(Ordering::Acquire);
    let soft = [dev_a.soft().stats(), dev_b.soft().stats()];
    rig.close()
        .unwrap_or_else(|e| panic!("{engine:?} {topo:?}: teardown: {e}"));
    drop((a, b));
    if let Some(f) = fabric {
        f.detach(dev_a.soft());
        f.detach(dev_b.soft());
    }
    if let Some(w) = wire {
        let stats = w.stop();
        assert!(stats.delivered > 0, "{stats:?}");
        assert_eq!(stats.unroutable, 0);
        let link = dev_a.soft().link_stats();
        assert_eq!(link.rx_dropped.total_drops(), 0, "{link:?}");
    }
    finish(&dev_a);
    if topo != Topo::Loopback {
        finish(&dev_b);
    }
    let hcas = if topo == Topo::Loopback { 1 } else { 2 };
    let rnr: u64 = soft[..hcas].iter().map(|s| s.rnr_naks).sum();
    println!(
        "stress {engine:?} {topo:?}: {PAIRS} RC pairs, {THREADS} threads, {messages} work \
         requests + {recvs} receives, {bytes} bytes, {rnr} RNR NAKs, {notified} CQ events \
         ({wakes} wake-ups), in {run:?} (total {:?})",
        start.elapsed()
    );
}

#[test]
fn stress_loopback_firmware_inline() {
    stress(Backend::Soft, Engine::Inline, Topo::Loopback);
}

#[test]
fn stress_loopback_firmware_thread() {
    stress(Backend::Soft, Engine::Thread, Topo::Loopback);
}

#[test]
fn stress_two_hcas_firmware_inline() {
    stress(Backend::Soft, Engine::Inline, Topo::TwoHca);
}

#[test]
fn stress_two_hcas_firmware_thread() {
    stress(Backend::Soft, Engine::Thread, Topo::TwoHca);
}

#[test]
fn stress_two_hcas_loopback_wire_firmware_inline() {
    stress(Backend::Soft, Engine::Inline, Topo::TwoHcaWire);
}

#[test]
fn stress_two_hcas_loopback_wire_firmware_thread() {
    stress(Backend::Soft, Engine::Thread, Topo::TwoHcaWire);
}

/// The model HCA: every registration (about 16 MiB a side) and every
/// queue's ring is the driver's memory the device views through the IOMMU
/// model. Its engine runs in the device's DPC (no firmware thread).
#[test]
fn stress_loopback_model() {
    stress(Backend::Model, Engine::Inline, Topo::Loopback);
}

#[test]
fn stress_two_hcas_model() {
    stress(Backend::Model, Engine::Inline, Topo::TwoHca);
}

#[test]
fn stress_two_hcas_loopback_wire_model() {
    stress(Backend::Model, Engine::Inline, Topo::TwoHcaWire);
}
