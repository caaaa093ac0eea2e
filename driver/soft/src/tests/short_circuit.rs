//! The short-circuit against the wire: the same random work on a loopback
//! pair (the send doorbell's fast path, `transport/fast.rs`, and the
//! requester's requests short-circuited to the peer for what the fast
//! path leaves, run by the doorbells, or with deferred firmware by the
//! engine's turns), on a loopback pair without the fast path (the
//! short-circuit alone, [`crate::SoftConfig::fast_path`] off), on a
//! loopback pair whose packets travel as frames through the loopback queue
//! ([`crate::SoftConfig::short_circuit`] off), and on two HCAs (every
//! packet a frame across a fabric) must give the same completions, in the
//! same order, and the same memory. Short-circuited or framed, the
//! requester, the responder and the completer are the same code; what
//! differs is how a packet and its answers travel, and when the coalesced
//! ACK comes. The fast path is a second implementation of their rules
//! for the common WQEs, kept equal to them by this test. Where
//! IBTA leaves an order open the script asks for one, as a ULP would: a
//! WRITE to memory an earlier READ reads is fenced.

use alloc::vec;
use alloc::vec::Vec;

use irpverbs_abi::*;
use irpverbs_core::{AsyncEvent, Command, Hca};
use irpverbs_ring::wq::{RecvWr, SendWr};
use proptest::prelude::*;

use crate::tests::dp::{ALL_ACCESS, Conn, Pair, Topo, pattern, signaled};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Send,
    SendImm,
    /// SEND with invalidate, of a key of its own (a type 2 window on the
    /// responder, bound by the responder QP's `IV_WR_BIND_MW` before the
    /// round).
    SendInv,
    Write,
    WriteImm,
    Read,
    CmpSwap,
    FetchAdd,
}

impl Kind {
    /// A READ or an atomic: writes into its local gather list.
    fn reads(self) -> bool {
        matches!(self, Kind::Read | Kind::CmpSwap | Kind::FetchAdd)
    }

    fn atomic(self) -> bool {
        matches!(self, Kind::CmpSwap | Kind::FetchAdd)
    }

    /// Takes a receive WQE on the responder.
    fn receives(self) -> bool {
        matches!(
            self,
            Kind::Send | Kind::SendImm | Kind::SendInv | Kind::WriteImm
        )
    }
}

/// What a round's remote accesses (WRITE, READ, atomics) name: the same
/// bytes of the responder's memory under three keys, so that each key's
/// checks and translation are compared between the paths.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    /// The responder's MR.
    Mr,
    /// A type 2 window bound over the MR's first [`SPAN`] bytes.
    Window,
    /// A fast-register MR over the MR's first [`SPAN`] bytes, its pages
    /// out of order ([`PAGED`]): mapped page by page, so that every access
    /// across a seam leaves the fast path for the general one.
    Paged,
}

/// The bytes a window or a fast-register MR covers (an access reaches at
/// most 16 KiB + 4 KiB into them).
const SPAN: u64 = 32 * 1024;

/// The fast-register MR's page size and its pages, in list order, as
/// page numbers in the responder's MR.
const PAGE: u64 = 8 * 1024;
const PAGED: [u64; 4] = [2, 0, 3, 1];

/// The fast-register MR's iova.
const IOVA: u64 = 0x7700_0000;

impl Target {
    /// Where the byte at `off` past the target's start lies in the
    /// responder's MR.
    fn offset(self, off: u64) -> usize {
        match self {
            Target::Mr | Target::Window => off as usize,
            Target::Paged => (PAGED[(off / PAGE) as usize] * PAGE + off % PAGE) as usize,
        }
    }
}

/// One work request of a round.
#[derive(Clone, Debug)]
struct Op {
    kind: Kind,
    /// Message length (across the 1024-byte MTU: up to four packets).
    len: u32,
    /// Two SGEs instead of one (local side; a SEND's receive too).
    split: bool,
    /// Inline (SEND and WRITE up to the QPs' 256 bytes).
    inline: bool,
    signaled: bool,
    /// Where in the buffers (a multiple of 8).
    off: u32,
    /// Something wrong with it (now and then): the WQE fails (and the QP
    /// with it), and everything after it is flushed.
    fault: Fault,
}

/// What is wrong with a WR of the script.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    None,
    /// A key the other side does not know (a SEND's local key, the remote
    /// key of the others).
    Key,
    /// The local gather list runs past the end of its MR.
    LocalRange,
    /// The remote range runs past the end of the peer's MR (WRITE, READ,
    /// atomics).
    RemoteRange,
    /// An atomic's remote address not 8-byte aligned.
    Misaligned,
    /// The receive a SEND (or WRITE with immediate) takes is shorter than
    /// the message.
    ShortReceive,
}

fn op() -> impl Strategy<Value = Op> {
    (
        prop_oneof![
            4 => Just(Kind::Send),
            1 => Just(Kind::SendImm),
            1 => Just(Kind::SendInv),
            3 => Just(Kind::Write),
            1 => Just(Kind::WriteImm),
            1 => Just(Kind::Read),
            1 => Just(Kind::CmpSwap),
            1 => Just(Kind::FetchAdd),
        ],
        prop_oneof![Just(0u32), 1u32..64, 64u32..1025, 1025u32..4097],
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        0u32..2048,
        prop_oneof![
            90 => Just(Fault::None),
            3 => Just(Fault::Key),
            2 => Just(Fault::LocalRange),
            2 => Just(Fault::RemoteRange),
            1 => Just(Fault::Misaligned),
            2 => Just(Fault::ShortReceive),
        ],
    )
        .prop_map(|(kind, len, split, inline, signaled, off, fault)| Op {
            kind,
            // An atomic's 8 bytes (in one SGE or two of 4).
            len: if kind.atomic() { 8 } else { len },
            split,
            inline,
            signaled,
            off: off * 8,
            fault,
        })
}

/// A round: its target and its work requests (one target a round, so that
/// the fences the script asks for, which compare the targets' addresses,
/// see every overlap).
type Round = (Target, Vec<Op>);

fn round() -> impl Strategy<Value = Round> {
    (
        prop_oneof![
            2 => Just(Target::Mr),
            1 => Just(Target::Window),
            1 => Just(Target::Paged),
        ],
        prop::collection::vec(op(), 1..9),
    )
}

/// What one run of a script produced: each CQ's completions (what a
/// verbs user reads, less the QP numbers, which differ between the
/// topologies) and both buffers.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Outcome {
    cqa: Vec<(u64, u32, u32, u32, u32, u32)>,
    cqb: Vec<(u64, u32, u32, u32, u32, u32)>,
    /// The buffers, hashed (FNV-1a: equal buffers, equal hashes; a
    /// failure prints two numbers, not two megabytes).
    ma: u64,
    mb: u64,
    /// WQEs the fast path took.
    fast: u64,
    /// Messages short-circuited by the requester.
    short: u64,
    /// SRQ limit events (the responder on an SRQ, armed every round).
    limits: usize,
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Receive buffers start here in `mb`, one 4 KiB slot per receive; WRITEs
/// land below, READs and atomics' original values land in `ma` above
/// `READ_BASE`.
const RECV_BASE: u64 = 256 * 1024;
const READ_BASE: u64 = 512 * 1024;

/// Two SGEs covering `len` bytes from `off` of `mem` when `split` (the
/// first of `len / 2`), else one.
fn sges(mem: &crate::tests::dp::Mem, off: u64, len: u32, split: bool) -> Vec<IvSge> {
    if split && len >= 2 {
        vec![mem.sge(off, len / 2), mem.sge(off + 4096, len - len / 2)]
    } else {
        vec![mem.sge(off, len)]
    }
}

/// Runs the script in `topo`, the responder QP on an SRQ when `srq`.
fn run(topo: Topo, rounds: &[Round], srq: bool) -> Outcome {
    let p = if srq {
        Pair::on_srq(topo)
    } else {
        Pair::new(topo, IV_QPT_RC, Conn::default())
    };
    p.ma.write(0, &pattern(1 << 20, 1));
    p.mb.write(0, &pattern(1 << 20, 2));
    let remote = IV_ACCESS_REMOTE_WRITE | IV_ACCESS_REMOTE_READ | IV_ACCESS_REMOTE_ATOMIC;
    let window = p.window(&p.mb, 0, SPAN, remote);
    let paged = paged(&p, remote);
    let mut out = Outcome {
        cqa: Vec::new(),
        cqb: Vec::new(),
        ma: 0,
        mb: 0,
        fast: p.a.d.hca.stats().fast_path_wqes,
        short: p.a.d.hca.stats().short_circuited,
        limits: 0,
    };
    // The keys SENDs with invalidate name, in order: a completion shows a
    // key's place here (the numbers differ between topologies).
    let mut victims: Vec<u32> = Vec::new();
    let take = |cq: &crate::tests::dp::Cq, v: &mut Vec<_>, victims: &[u32]| {
        for c in cq.poll() {
            let imm = if c.wc_flags & IV_WC_WITH_INV != 0 {
                victims
                    .iter()
                    .position(|&k| k == c.imm_or_inv)
                    .map_or(u32::MAX, |i| 0x8000_0000 | i as u32)
            } else {
                c.imm_or_inv
            };
            v.push((c.wr_id, c.status, c.opcode, c.byte_len, imm, c.wc_flags));
        }
    };
    let mut wr_id = 0u64;
    let mut recv_id = 1000u64;
    for (r, (target, ops)) in rounds.iter().enumerate() {
        let target = *target;
        // The round's remote key, its range's start and end.
        let (rkey, start, end) = match target {
            Target::Mr => (p.mb.lkey, p.mb.addr, p.mb.addr + p.mb.len),
            Target::Window => (window, p.mb.addr, p.mb.addr + SPAN),
            Target::Paged => (paged, IOVA, IOVA + SPAN),
        };
        // A receive for every message that consumes one, posted as a list.
        let recv_sges: Vec<Vec<IvSge>> = ops
            .iter()
            .enumerate()
            .filter(|(_, o)| o.kind.receives())
            .map(|(i, o)| {
                let slot = RECV_BASE + ((r * 8 + i) % 32) as u64 * 8192;
                let room = if o.fault == Fault::ShortReceive {
                    o.len / 2
                } else {
                    4096
                };
                sges(&p.mb, slot, room, o.split)
            })
            .collect();
        let recvs: Vec<RecvWr<'_>> = recv_sges
            .iter()
            .map(|s| {
                recv_id += 1;
                RecvWr {
                    wr_id: recv_id,
                    sges: s,
                }
            })
            .collect();
        if let Some((srqn, srq)) = &p.srq {
            // Armed below what the round posts now and then: the event
            // comes at the same receive in every topology.
            p.b.d.ok(Command::ModifySrq(irpverbs_core::ModifySrq {
                srqn: *srqn,
                mask: IV_SRQ_LIMIT,
                max_wr: 0,
                srq_limit: 1 + r as u32 % 3,
            }));
            if !recvs.is_empty() {
                let _ = srq.post_list(&recvs);
                p.b.d.hca.srq_doorbell(*srqn);
                p.settle();
            }
        } else if !recvs.is_empty() {
            let _ = p.qb.rq.as_ref().unwrap().post_list(&recvs);
            p.b.d.hca.rq_doorbell(p.qb.qpn);
            p.settle();
        }
        // The round's WRs, posted as one list with one doorbell; the last
        // one signaled, so that the round retires the send queue.
        let local: Vec<Vec<IvSge>> = ops
            .iter()
            .map(|o| {
                let base = if o.kind.reads() { READ_BASE } else { 0 };
                let mut s = sges(&p.ma, base + u64::from(o.off), o.len, o.split);
                match o.fault {
                    Fault::Key if matches!(o.kind, Kind::Send | Kind::SendImm) => {
                        s[0].lkey ^= 0x5a00;
                    }
                    Fault::LocalRange => s[0].addr = p.ma.addr + p.ma.len - 4,
                    _ => {}
                }
                s
            })
            .collect();
        let inline: Vec<Vec<u8>> = ops
            .iter()
            .map(|o| p.ma.read(o.off as usize, o.len as usize))
            .collect();
        // A window on the responder for each SEND with invalidate to
        // invalidate (a key one bit off when the fault is the key).
        let victim_mws: Vec<Option<u32>> = ops
            .iter()
            .map(|o| {
                (o.kind == Kind::SendInv).then(|| {
                    let mr = p.b.mem(4096, ALL_ACCESS);
                    p.window(&mr, 0, 4096, IV_ACCESS_REMOTE_WRITE)
                })
            })
            .collect();
        victims.extend(victim_mws.iter().flatten());
        let wrs: Vec<SendWr<'_>> = ops
            .iter()
            .enumerate()
            .map(|(i, o)| {
                wr_id += 1;
                let opcode = match o.kind {
                    Kind::Send => IV_WR_SEND,
                    Kind::SendImm => IV_WR_SEND_WITH_IMM,
                    Kind::SendInv => IV_WR_SEND_WITH_INV,
                    Kind::Write => IV_WR_RDMA_WRITE,
                    Kind::WriteImm => IV_WR_RDMA_WRITE_WITH_IMM,
                    Kind::Read => IV_WR_RDMA_READ,
                    Kind::CmpSwap => IV_WR_ATOMIC_CMP_AND_SWP,
                    Kind::FetchAdd => IV_WR_ATOMIC_FETCH_AND_ADD,
                };
                let use_inline =
                    o.inline && o.len <= 256 && !o.kind.reads() && o.fault == Fault::None;
                // A compare that matches the word as it is now, half the
                // time (whether it still does when the swap runs depends on
                // the WQEs before it: the same in every topology).
                let compare = if o.signaled {
                    p.mb.u64_at(target.offset(u64::from(o.off)))
                } else {
                    0x1234
                };
                let mut wr = SendWr {
                    sges: &local[i],
                    inline: use_inline.then(|| &inline[i][..]),
                    imm_or_inv: match victim_mws[i] {
                        Some(k) if o.fault == Fault::Key => k ^ 0x5a00,
                        Some(k) => k,
                        None => 0x1000 + wr_id as u32,
                    },
                    compare_add: if o.kind == Kind::FetchAdd {
                        wr_id
                    } else {
                        compare
                    },
                    swap: wr_id << 32 | 0xABCD,
                    remote_addr: match o.fault {
                        // (An atomic's 8 aligned bytes: just past the end.)
                        Fault::RemoteRange if o.kind.atomic() => end,
                        Fault::RemoteRange => end - 4,
                        Fault::Misaligned => start + u64::from(o.off) + 4,
                        _ => start + u64::from(o.off),
                    },
                    rkey: if o.fault == Fault::Key {
                        rkey ^ 0x5a00
                    } else {
                        rkey
                    },
                    ..signaled(wr_id, opcode)
                };
                if !o.signaled && i + 1 < ops.len() {
                    wr.flags &= !IV_SEND_SIGNALED;
                }
                // A WRITE or atomic on memory an earlier READ of the round
                // reads may pass the READ unless fenced (IBTA: the responder
                // may run it before the READ's data is fetched, as two HCAs
                // do; a short-circuited READ is done before it starts). Both
                // are right; a ULP that cares fences, and so does this.
                let overlaps_read = |o: &Op| {
                    ops[..i].iter().any(|r| {
                        matches!(r.kind, Kind::Read)
                            && r.off < o.off + o.len
                            && o.off < r.off + r.len
                    })
                };
                if !matches!(
                    o.kind,
                    Kind::Send | Kind::SendImm | Kind::SendInv | Kind::Read
                ) && overlaps_read(o)
                {
                    wr.flags |= IV_SEND_FENCE;
                }
                wr
            })
            .collect();
        if ops.iter().any(|o| o.fault != Fault::None) {
            // A failing WQE: one doorbell each, so that the WQEs before it
            // are acknowledged before it fails. In one list, whether they
            // complete successfully or are flushed with it depends on
            // whether their ACK came back before the requester reached the
            // failing one (both are right; a short-circuited requester has
            // its answers at once, the two HCAs' pipelined one never does).
            for wr in &wrs {
                let _ = p.qa.sq.post(wr);
                p.a.d.hca.sq_doorbell(p.qa.qpn);
                p.settle();
            }
        } else {
            let _ = p.qa.sq.post_list(&wrs);
            p.a.d.hca.sq_doorbell(p.qa.qpn);
            p.settle();
        }
        take(&p.cqa, &mut out.cqa, &victims);
        take(&p.cqb, &mut out.cqb, &victims);
        out.limits +=
            p.b.asyncs()
                .iter()
                .filter(|e| matches!(e, AsyncEvent::SrqLimitReached(_)))
                .count();
    }
    out.ma = fnv(&p.ma.read(0, 1 << 20));
    out.mb = fnv(&p.mb.read(0, 1 << 20));
    out.fast = p.a.d.hca.stats().fast_path_wqes - out.fast;
    out.short = p.a.d.hca.stats().short_circuited - out.short;
    out
}

/// The responder's fast-register MR over the first [`SPAN`] bytes of its
/// MR, pages in [`PAGED`]'s order, registered by its QP's `IV_WR_REG_MR`
/// (unsignaled) with `access`: its key.
fn paged(p: &Pair, access: u32) -> u32 {
    let irpverbs_core::CommandOut::Mr { lkey, .. } = p.b.d.ok(Command::AllocMr {
        pdn: p.b.pd,
        max_pages: PAGED.len() as u32,
    }) else {
        unreachable!()
    };
    let key = (lkey & !0xFF) | (lkey.wrapping_add(0x22) & 0xFF);
    let list: Vec<IvSge> = PAGED
        .iter()
        .map(|&i| IvSge {
            addr: p.mb.addr + i * PAGE,
            length: PAGE as u32,
            lkey: p.mb.lkey,
        })
        .collect();
    p.b.post(
        &p.qb,
        &SendWr {
            opcode: IV_WR_REG_MR,
            sges: &list,
            rkey: key,
            remote_addr: IOVA,
            compare_add: SPAN,
            swap: u64::from(access | IV_ACCESS_LOCAL_WRITE),
            imm_or_inv: PAGE as u32,
            ..SendWr::default()
        },
    );
    p.settle();
    // Unsignaled (as the window's bind before it): a failure alone
    // would complete.
    assert_eq!(p.cqb.poll(), [], "the registration failed");
    key
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Rounds of up to eight WRs (SEND, SEND with immediate, WRITE, WRITE
    /// with immediate, READ, compare-and-swap, fetch-and-add; 0 to 4096
    /// bytes; one or two SGEs; inline or not; signaled or not; now and then
    /// a fault: a bad key, a local or remote range past its MR or window,
    /// a misaligned atomic, a receive too short; the remote accesses
    /// through the responder's MR, a window on it or a fast-register MR
    /// mapping its pages out of order), each posted as one list
    /// with one doorbell, after the receives it needs (on the responder's
    /// RQ, or its SRQ).
    #[test]
    fn short_circuited_and_framed_loopback_give_what_two_hcas_give(
        rounds in prop::collection::vec(round(), 1..7),
        srq in any::<bool>(),
    ) {
        let wire = run(Topo::TwoHca, &rounds, srq);
        prop_assert_eq!((wire.fast, wire.short), (0, 0), "two HCAs never short-circuit");
        // The fast path and the short-circuit on the doorbells (inline)
        // and on the engine's turns (deferred); and frames.
        for topo in [
                Topo::Loopback,
                Topo::LoopbackDeferred,
                Topo::LoopbackShortCircuit,
                Topo::LoopbackFrames,
            ] {
            let local = run(topo, &rounds, srq);
            prop_assert_eq!(&local.cqa, &wire.cqa, "{:?}", topo);
            prop_assert_eq!(&local.cqb, &wire.cqb, "{:?}", topo);
            prop_assert_eq!(local.ma, wire.ma, "{:?}: the requester's buffer", topo);
            prop_assert_eq!(local.mb, wire.mb, "{:?}: the responder's buffer", topo);
            prop_assert_eq!(local.limits, wire.limits, "{:?}: SRQ limit events", topo);
        }
    }
}

/// The script above takes the fast path, and the requester's
/// short-circuit for what the fast path leaves (SENDs with invalidate),
/// every kind of WR of it, on an RQ and on an SRQ (the property would
/// hold trivially if the loopback pair never did), and neither with the
/// switch off; the SRQ's limit event comes.
#[test]
fn the_script_is_short_circuited_unless_switched_off() {
    let kinds = [
        Kind::Send,
        Kind::Write,
        Kind::Read,
        Kind::FetchAdd,
        Kind::SendImm,
        Kind::CmpSwap,
        Kind::WriteImm,
        Kind::SendInv,
    ];
    let ops: Vec<Op> = (0..8)
        .map(|i| Op {
            kind: kinds[i as usize % kinds.len()],
            len: if kinds[i as usize % kinds.len()].atomic() {
                8
            } else {
                8 + 300 * i
            },
            split: i % 3 == 0,
            inline: i % 4 == 0,
            signaled: i % 2 == 1,
            off: 64 * i,
            fault: Fault::None,
        })
        .collect();
    for srq in [false, true] {
        let wire = run(
            Topo::TwoHca,
            &[(Target::Mr, ops.clone()), (Target::Mr, ops.clone())],
            srq,
        );
        assert_eq!(wire.limits, usize::from(srq) * 2, "srq {srq}");
        for (topo, counts) in [
            (Topo::Loopback, (14, 2)),
            (Topo::LoopbackDeferred, (14, 2)),
            (Topo::LoopbackShortCircuit, (0, 16)),
            (Topo::LoopbackFrames, (0, 0)),
        ] {
            let local = run(
                topo,
                &[(Target::Mr, ops.clone()), (Target::Mr, ops.clone())],
                srq,
            );
            assert_eq!((local.fast, local.short), counts, "{topo:?}, srq {srq}");
            let local = Outcome {
                fast: 0,
                short: 0,
                ..local
            };
            assert_eq!(local, wire, "{topo:?}, srq {srq}");
        }
    }
}

/// Each fault of the script fails its WQE with the status IBTA gives it,
/// the same short-circuited, as frames and between two HCAs, whether the
/// remote key is the MR's, a window's or a paged fast-register MR's (so
/// the property above, which draws them, compares failures and not only
/// successes).
#[test]
fn each_fault_completes_with_its_status() {
    let cases = [
        (Kind::Send, Fault::Key, IV_WC_LOC_PROT_ERR, None),
        (
            Kind::SendInv,
            Fault::Key,
            IV_WC_REM_INV_REQ_ERR,
            Some(IV_WC_REM_INV_REQ_ERR),
        ),
        (Kind::Write, Fault::Key, IV_WC_REM_ACCESS_ERR, None),
        (Kind::Read, Fault::Key, IV_WC_REM_ACCESS_ERR, None),
        (Kind::SendImm, Fault::LocalRange, IV_WC_LOC_PROT_ERR, None),
        (Kind::Write, Fault::LocalRange, IV_WC_LOC_PROT_ERR, None),
        (Kind::Read, Fault::LocalRange, IV_WC_LOC_PROT_ERR, None),
        (
            Kind::WriteImm,
            Fault::RemoteRange,
            IV_WC_REM_ACCESS_ERR,
            None,
        ),
        (Kind::Read, Fault::RemoteRange, IV_WC_REM_ACCESS_ERR, None),
        (
            Kind::FetchAdd,
            Fault::RemoteRange,
            IV_WC_REM_ACCESS_ERR,
            None,
        ),
        (
            Kind::CmpSwap,
            Fault::Misaligned,
            IV_WC_REM_INV_REQ_ERR,
            None,
        ),
        (
            Kind::Send,
            Fault::ShortReceive,
            IV_WC_REM_INV_REQ_ERR,
            Some(IV_WC_LOC_LEN_ERR),
        ),
    ];
    for (kind, fault, status, recv_status) in cases {
        let op = Op {
            kind,
            len: if kind.atomic() { 8 } else { 64 },
            split: false,
            inline: false,
            signaled: true,
            off: 64,
            fault,
        };
        // Each through the MR, a window and a fast-register MR mapped
        // page by page (the remote faults at each one's own bound).
        for (target, srq) in [Target::Mr, Target::Window, Target::Paged]
            .into_iter()
            .flat_map(|t| [(t, false), (t, true)])
        {
            let script = [(target, vec![op.clone()])];
            let general = run(Topo::TwoHca, &script, srq);
            assert_eq!(
                general.cqa.iter().map(|c| c.1).collect::<Vec<_>>(),
                [status],
                "{kind:?} {fault:?} {target:?}"
            );
            if let Some(r) = recv_status {
                assert_eq!(
                    general.cqb.first().map(|c| c.1),
                    Some(r),
                    "{kind:?} {fault:?} {target:?}"
                );
            }
            for topo in [
                Topo::Loopback,
                Topo::LoopbackDeferred,
                Topo::LoopbackShortCircuit,
                Topo::LoopbackFrames,
            ] {
                let local = run(topo, &script, srq);
                assert_eq!(
                    Outcome {
                        fast: 0,
                        short: 0,
                        ..local
                    },
                    general.clone(),
                    "{kind:?} {fault:?} {target:?} {topo:?}"
                );
            }
        }
    }
}
