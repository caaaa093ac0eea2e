//! Doorbell pages: binding, the scanner, untrusted contents, isolation
//! between pages, concurrent ringing, teardown.

use alloc::sync::Arc;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicBool, Ordering};

use irpverbs_abi::*;
use irpverbs_core::{Command, DoorbellTarget, Event, Hca};
use irpverbs_ring::DoorbellPage;
use irpverbs_ring::wq::SendWr;

use crate::tests::dp::{Conn, Node, Pair, TOPOS, Topo, one, signaled};

/// A doorbell page of `node`'s HCA, as the driver gets it, and the user's
/// view of it.
fn page(node: &Node) -> (u32, DoorbellPage) {
    let info = node.d.hca.alloc_doorbell_page().expect("a page");
    (info.page, DoorbellPage::new(info.region).expect("a page"))
}

/// Binds `target` on `page`.
fn bind(node: &Node, page: u32, target: DoorbellTarget) -> u32 {
    node.d.hca.bind_doorbell(page, target).expect("bound")
}

/// Writes and publishes a signaled SEND of `len` bytes of `p.ma` on the
/// requester's send queue, without ringing anything.
fn publish_send(p: &Pair, wr_id: u64, len: u32) {
    let sges = [p.ma.sge(0, len)];
    p.qa.sq
        .post(&SendWr {
            sges: &sges,
            ..signaled(wr_id, IV_WR_SEND)
        })
        .unwrap();
}

/// Scans until nothing is rung, settling a deferred pair in between;
/// returns the slots that rang a queue.
fn scan(p: &Pair) -> usize {
    let mut n = 0;
    loop {
        let a = p.a.d.hca.poll_doorbells();
        let b = if Arc::ptr_eq(&p.a, &p.b) {
            0
        } else {
            p.b.d.hca.poll_doorbells()
        };
        p.settle();
        if a + b == 0 {
            return n;
        }
        n += a + b;
    }
}

#[test]
fn a_bound_slot_rings_its_queue_like_the_direct_doorbell() {
    for topo in TOPOS {
        let p = Pair::new(topo, IV_QPT_RC, Conn::default());
        let (pa, ua) = page(&p.a);
        let (pb, ub) = if Arc::ptr_eq(&p.a, &p.b) {
            (pa, ua.clone())
        } else {
            page(&p.b)
        };
        let sq = bind(&p.a, pa, DoorbellTarget::Sq(p.qa.qpn));
        let rq = bind(&p.b, pb, DoorbellTarget::Rq(p.qb.qpn));
        let arm = bind(&p.b, pb, DoorbellTarget::CqArm(p.cqb.cqn));
        // A SEND before any receive: the responder RNR-NAKs and waits.
        p.ma.write(0, b"paged!");
        publish_send(&p, 1, 6);
        assert!(ua.ring(sq));
        assert_eq!(scan(&p), 1, "{topo:?}");
        assert!(p.cqb.poll().is_empty() && p.cqa.poll().is_empty());
        // The receive, rung through the page, lets the requester retry;
        // the arm, rung too, raises the event for the receive completion.
        p.cqb.q.arm(false);
        p.qb.rq
            .as_ref()
            .unwrap()
            .post(9, &[p.mb.sge(0, 64)])
            .unwrap();
        assert!(ub.ring(rq) && ub.ring(arm));
        assert!(scan(&p) >= 2, "{topo:?}");
        let r = one(&p.cqb);
        assert_eq!((r.wr_id, r.status, r.byte_len), (9, IV_WC_SUCCESS, 6));
        assert_eq!(p.mb.read(0, 6), b"paged!");
        assert_eq!(one(&p.cqa).status, IV_WC_SUCCESS);
        assert!(
            p.b.events().contains(&Event::Completion { cqn: p.cqb.cqn }),
            "{topo:?}: the arm rung through the page"
        );
        let stats = p.a.d.hca.stats();
        assert!(stats.page_doorbells >= 1 && stats.stray_doorbells == 0);
    }
}

#[test]
fn an_srq_slot_rings_the_srq() {
    let n = Node::new(1);
    let cq = n.cq(16);
    let (srqn, srq) = n.srq(8, 1, 0);
    let qa = n.qp_full(
        n.pd,
        IV_QPT_RC,
        &cq,
        &cq,
        None,
        false,
        crate::tests::dp::BIG,
    );
    let qb = n.qp_full(
        n.pd,
        IV_QPT_RC,
        &cq,
        &cq,
        Some(srqn),
        false,
        crate::tests::dp::BIG,
    );
    let c = Conn::default();
    n.connect(&qa, n.gid(), qb.qpn, &c);
    n.connect(&qb, n.gid(), qa.qpn, &c);
    let (id, user) = page(&n);
    let slot = bind(&n, id, DoorbellTarget::Srq(srqn));
    assert_eq!(
        n.d.hca.bind_doorbell(id, DoorbellTarget::Rq(qb.qpn)),
        Err(STATUS_INVALID_HANDLE),
        "a QP with an SRQ has no receive queue to ring"
    );
    let m = n.mem(4096, IV_ACCESS_ALL);
    n.post(
        &qa,
        &SendWr {
            sges: &[m.sge(0, 4)],
            ..signaled(1, IV_WR_SEND)
        },
    );
    assert!(cq.poll().is_empty(), "RNR: no receive yet");
    // A responder of the SRQ waits: the SRQ asks for its doorbell.
    srq.post(5, &[m.sge(64, 64)]).unwrap();
    assert!(srq.doorbell_wanted(), "asked");
    assert!(user.ring(slot));
    assert_eq!(n.d.hca.poll_doorbells(), 1);
    let mut got: Vec<u64> = cq.poll().iter().map(|c| c.wr_id).collect();
    got.sort_unstable();
    assert_eq!(got, [1, 5]);
    assert!(!srq.doorbell_wanted(), "nobody waits: no longer asked");
}

#[test]
fn binding_rules() {
    let n = Node::new(1);
    let cq = n.cq(16);
    let qp = n.qp(IV_QPT_RC, &cq);
    let (p1, _) = page(&n);
    let (p2, _) = page(&n);
    assert_ne!(p1, p2);
    let s = bind(&n, p1, DoorbellTarget::Sq(qp.qpn));
    assert_eq!(s, 0, "the lowest free slot");
    assert_eq!(bind(&n, p1, DoorbellTarget::Sq(qp.qpn)), s, "bound once");
    let hca = &n.d.hca;
    assert_eq!(
        hca.bind_doorbell(p2, DoorbellTarget::Sq(qp.qpn)),
        Err(STATUS_INVALID_PARAMETER),
        "a queue rings through one page"
    );
    assert_eq!(
        hca.bind_doorbell(999, DoorbellTarget::CqArm(cq.cqn)),
        Err(STATUS_INVALID_PARAMETER),
        "no such page"
    );
    for missing in [
        DoorbellTarget::Sq(qp.qpn + 100),
        DoorbellTarget::Rq(qp.qpn + 100),
        DoorbellTarget::Srq(77),
        DoorbellTarget::CqArm(cq.cqn + 100),
    ] {
        assert_eq!(
            hca.bind_doorbell(p1, missing),
            Err(STATUS_INVALID_HANDLE),
            "{missing:?}"
        );
    }
    assert_eq!(bind(&n, p1, DoorbellTarget::Rq(qp.qpn)), 1);
    assert_eq!(bind(&n, p1, DoorbellTarget::CqArm(cq.cqn)), 2);
    // A destroy unbinds: the slots are free again.
    n.d.ok(Command::DestroyQp { qpn: qp.qpn });
    let qp2 = n.qp(IV_QPT_RC, &cq);
    assert_eq!(bind(&n, p1, DoorbellTarget::Rq(qp2.qpn)), 0);
    assert_eq!(bind(&n, p1, DoorbellTarget::Sq(qp2.qpn)), 1);
    assert_eq!(hca.stats().doorbell_pages, 2);
    // Freeing a page frees its bindings; its number is not reused.
    hca.free_doorbell_page(p1);
    hca.free_doorbell_page(p1);
    assert_eq!(hca.stats().doorbell_pages, 1);
    let (p3, _) = page(&n);
    assert!(p3 != p1 && p3 != p2);
    assert_eq!(
        bind(&n, p3, DoorbellTarget::Sq(qp2.qpn)),
        0,
        "unbound with p1"
    );
}

#[test]
fn a_full_page_refuses_more_bindings() {
    let n = Node::with(1, |c| c.max_cq = 5000);
    let (id, _) = page(&n);
    for slot in 0..IV_DOORBELL_SLOTS {
        let cqn = n.d.cq(1);
        assert_eq!(bind(&n, id, DoorbellTarget::CqArm(cqn)), slot);
    }
    let cqn = n.d.cq(1);
    assert_eq!(
        n.d.hca.bind_doorbell(id, DoorbellTarget::CqArm(cqn)),
        Err(STATUS_INSUFFICIENT_RESOURCES)
    );
}

#[test]
fn garbage_in_a_page_reaches_only_its_own_queues() {
    for topo in [Topo::Loopback, Topo::TwoHcaDeferred] {
        let p = Pair::new(topo, IV_QPT_RC, Conn::default());
        // Two "files" on HCA a: page 1 has the requester's send queue,
        // page 2 a CQ of its own.
        let (p1, u1) = page(&p.a);
        let (p2, u2) = page(&p.a);
        let sq = bind(&p.a, p1, DoorbellTarget::Sq(p.qa.qpn));
        let cq2 = p.a.cq(4);
        bind(&p.a, p2, DoorbellTarget::CqArm(cq2.cqn));
        // A WQE written and published, not rung.
        p.b.recv(&p.qb, 3, &[p.mb.sge(0, 64)]);
        p.settle();
        publish_send(&p, 1, 8);
        // Page 2 is all ones, reserved words too: only its CQ is looked
        // at; every other slot is stray, and nothing panics.
        u2.region().fill(0, 4096, 0xFF).unwrap();
        assert_eq!(scan(&p), 1, "{topo:?}: page 2's one queue");
        let stats = p.a.d.hca.stats();
        assert_eq!(stats.stray_doorbells, u64::from(IV_DOORBELL_SLOTS) - 1);
        assert!(p.cqa.poll().is_empty(), "{topo:?}: page 1's queue not run");
        assert!(p.cqb.poll().is_empty(), "{topo:?}: nothing sent");
        // Garbage in page 1's reserved words and in unbound slots only:
        // still nothing runs.
        u1.region().fill(1024, 3072, 0xA5).unwrap();
        u1.ring(sq + 1);
        u1.ring(4000);
        scan(&p);
        assert!(p.cqa.poll().is_empty(), "{topo:?}");
        // Its own slot runs it.
        u1.ring(sq);
        assert_eq!(scan(&p), 1);
        assert_eq!(one(&p.cqb).wr_id, 3);
        assert_eq!(one(&p.cqa).wr_id, 1);
    }
}

#[test]
fn nothing_rung_is_cheap_and_does_nothing() {
    let n = Node::new(1);
    assert_eq!(n.d.hca.poll_doorbells(), 0, "no page");
    let (id, user) = page(&n);
    let before = n.d.snapshot();
    assert_eq!(n.d.hca.poll_doorbells(), 0);
    assert_eq!(n.d.snapshot(), before, "the firmware is untouched");
    // A summary bit with no slot behind it: looked at, nothing found.
    user.region().write(0, &1u64.to_ne_bytes()).unwrap();
    assert_eq!(n.d.hca.poll_doorbells(), 0);
    assert_eq!(n.d.hca.stats().stray_doorbells, 0);
    assert!(!user.peek(), "taken");
    n.d.hca.free_doorbell_page(id);
    assert_eq!(n.d.hca.poll_doorbells(), 0);
}

#[test]
fn teardown_a_destroyed_queue_or_freed_page_rings_nothing() {
    let p = Pair::new(Topo::Loopback, IV_QPT_RC, Conn::default());
    let n = &p.a;
    let (id, user) = page(n);
    let cq = n.cq(4);
    let arm = bind(n, id, DoorbellTarget::CqArm(cq.cqn));
    let qp = n.qp(IV_QPT_RC, &cq);
    let sq = bind(n, id, DoorbellTarget::Sq(qp.qpn));
    // Rung, then destroyed before the scan: the slots are stale.
    user.ring(sq);
    user.ring(arm);
    n.d.ok(Command::DestroyQp { qpn: qp.qpn });
    n.d.ok(Command::DestroyCq { cqn: cq.cqn });
    assert_eq!(n.d.hca.poll_doorbells(), 0);
    assert_eq!(n.d.hca.stats().stray_doorbells, 2);
    // A slot rung on a freed page is never looked at.
    let s = bind(n, id, DoorbellTarget::Sq(p.qa.qpn));
    p.qa.sq.post(&signaled(1, IV_WR_RDMA_WRITE)).unwrap();
    user.ring(s);
    n.d.hca.free_doorbell_page(id);
    assert_eq!(n.d.hca.poll_doorbells(), 0);
    assert!(p.cqa.poll().is_empty());
    assert_eq!(n.d.hca.stats().doorbell_pages, 0);
    // The direct doorbell still works (the kernel path).
    n.d.hca.sq_doorbell(p.qa.qpn);
    assert_eq!(one(&p.cqa).wr_id, 1);
}

/// Several threads post on their own QPs and ring through one page while
/// a scanner thread polls (and, deferred, a hardware thread runs the
/// firmware): every WQE completes, once.
#[test]
fn concurrent_ringers_and_a_scanner_lose_nothing() {
    const THREADS: usize = 4;
    const PER_THREAD: u64 = 200;
    for execution in [crate::Execution::Inline, crate::Execution::Deferred] {
        let n = Node::with(1, |c| c.execution = execution);
        let (id, user) = page(&n);
        let cq = n.cq(1024);
        let m = n.mem(4096, IV_ACCESS_ALL);
        let c = Conn::default();
        let eps: Vec<_> = (0..THREADS)
            .map(|_| {
                let a = n.qp(IV_QPT_RC, &cq);
                let b = n.qp(IV_QPT_RC, &cq);
                n.connect(&a, n.gid(), b.qpn, &c);
                n.connect(&b, n.gid(), a.qpn, &c);
                let slot = bind(&n, id, DoorbellTarget::Sq(a.qpn));
                (a, b, slot)
            })
            .collect();
        n.run();
        n.events();
        let stop = AtomicBool::new(false);
        let mut done = Vec::new();
        std::thread::scope(|s| {
            let scanner = s.spawn(|| {
                while !stop.load(Ordering::Acquire) {
                    if n.d.hca.poll_doorbells() == 0 {
                        if execution == crate::Execution::Deferred {
                            n.d.hca.run_firmware();
                        }
                        std::thread::yield_now();
                    }
                }
            });
            let posters: Vec<_> = eps
                .iter()
                .enumerate()
                .map(|(t, (a, _, slot))| {
                    let (user, m) = (&user, &m);
                    s.spawn(move || {
                        for i in 0..PER_THREAD {
                            let wr = SendWr {
                                remote_addr: m.addr,
                                rkey: m.lkey,
                                sges: &[m.sge(8, 8)],
                                ..signaled(t as u64 * 1000 + i, IV_WR_RDMA_WRITE)
                            };
                            while a.sq.post(&wr).is_err() {
                                std::thread::yield_now();
                            }
                            assert!(user.ring(*slot));
                        }
                    })
                })
                .collect();
            for p in posters {
                p.join().unwrap();
            }
            let want = THREADS * PER_THREAD as usize;
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while done.len() < want {
                let got = cq.poll();
                if got.is_empty() {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "{execution:?}: {} of {want} completions",
                        done.len()
                    );
                    std::thread::yield_now();
                }
                done.extend(got.iter().map(|c| (c.wr_id, c.status)));
            }
            stop.store(true, Ordering::Release);
            scanner.join().unwrap();
        });
        assert!(done.iter().all(|&(_, st)| st == IV_WC_SUCCESS));
        let mut ids: Vec<u64> = done.iter().map(|&(id, _)| id).collect();
        ids.sort_unstable();
        let want: Vec<u64> = (0..THREADS as u64)
            .flat_map(|t| (0..PER_THREAD).map(move |i| t * 1000 + i))
            .collect();
        assert_eq!(ids, want, "{execution:?}: each once");
        assert!(n.d.hca.stats().page_doorbells > 0);
        drop(eps);
    }
}

/// An inline HCA runs the send queues its scan finds rung on the fast
/// path, as the direct doorbell does, and leaves the engine the WQEs the
/// fast path does not take (a WRITE with immediate here), in order.
#[test]
fn a_scan_runs_rung_send_queues_on_the_fast_path() {
    let p = Pair::new(Topo::Loopback, IV_QPT_RC, Conn::default());
    let (pa, ua) = page(&p.a);
    let sq = bind(&p.a, pa, DoorbellTarget::Sq(p.qa.qpn));
    let rq = p.qb.rq.as_ref().unwrap();
    for i in 0..3 {
        rq.post(i, &[p.mb.sge(64 * i, 64)]).unwrap();
    }
    p.ma.write(0, b"quick");
    p.mb.write(512, b"remote");
    let before = p.a.d.hca.stats().fast_path_wqes;
    for i in 10..13 {
        publish_send(&p, i, 5);
    }
    assert!(ua.ring(sq));
    assert_eq!(scan(&p), 1);
    assert_eq!(p.a.d.hca.stats().fast_path_wqes, before + 3, "fast path");
    let recvs: Vec<_> = p.cqb.poll().iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(
        recvs,
        [(0, IV_WC_SUCCESS), (1, IV_WC_SUCCESS), (2, IV_WC_SUCCESS)]
    );
    assert_eq!(p.mb.read(128, 5), b"quick");
    // A SEND, then a WRITE with immediate (out of line): both the fast
    // path's.
    rq.post(3, &[p.mb.sge(256, 64)]).unwrap();
    rq.post(4, &[p.mb.sge(320, 64)]).unwrap();
    publish_send(&p, 13, 5);
    let src = [p.ma.sge(0, 5)];
    p.qa.sq
        .post(&SendWr {
            sges: &src,
            remote_addr: p.mb.addr + 600,
            rkey: p.mb.lkey,
            imm_or_inv: 0xfeed,
            ..signaled(14, IV_WR_RDMA_WRITE_WITH_IMM)
        })
        .unwrap();
    assert!(ua.ring(sq));
    assert_eq!(scan(&p), 1);
    assert_eq!(p.a.d.hca.stats().fast_path_wqes, before + 5);
    let recvs: Vec<_> = p
        .cqb
        .poll()
        .iter()
        .map(|c| (c.wr_id, c.imm_or_inv))
        .collect();
    assert_eq!(recvs, [(3, 0), (4, 0xfeed)]);
    let sends: Vec<_> = p.cqa.poll().iter().map(|c| (c.wr_id, c.status)).collect();
    let want: Vec<_> = (10..15).map(|i| (i, IV_WC_SUCCESS)).collect();
    assert_eq!(sends, want);
    assert_eq!(p.mb.read(600, 5), b"quick");
}

/// The doorbell poller: it polls (the pages say so) for its window after
/// the last doorbell it found, then clears the pages' `polling` words and
/// sleeps; a ULP that then finds 0 wakes it with the ring IOCTL, which
/// runs the doorbell at once and wakes the poller, whose next step polls
/// again. The work is done exactly as a scan does it.
#[test]
fn the_poller_polls_for_its_window_then_sleeps_until_woken() {
    use crate::{DoorbellPoller, PollerStep};
    let p = Pair::new(Topo::Loopback, IV_QPT_RC, Conn::default());
    let (pa, ua) = page(&p.a);
    let sq = bind(&p.a, pa, DoorbellTarget::Sq(p.qa.qpn));
    let rq = p.qb.rq.as_ref().unwrap();
    rq.post(1, &[p.mb.sge(0, 64)]).unwrap();
    rq.post(2, &[p.mb.sge(64, 64)]).unwrap();
    let hca = &p.a.d.hca;
    let mut poller = DoorbellPoller::new(1_000);
    assert!(ua.must_wake(), "asleep before the first step");
    assert_eq!(hca.poll_doorbells_step(&mut poller, 0), PollerStep::Again);
    assert!(poller.polling() && !ua.must_wake(), "polling: no IOCTL");
    publish_send(&p, 10, 8);
    assert!(ua.ring(sq));
    assert_eq!(hca.poll_doorbells_step(&mut poller, 500), PollerStep::Again);
    assert_eq!(one(&p.cqa).wr_id, 10, "found by the poll");
    assert_eq!(
        hca.poll_doorbells_step(&mut poller, 1_400),
        PollerStep::Again
    );
    assert_eq!(
        hca.poll_doorbells_step(&mut poller, 1_500),
        PollerStep::Sleep
    );
    assert!(!poller.polling() && ua.must_wake(), "asleep: wake it");
    assert_eq!(poller.sleeps, 1);
    // Asleep: the ULP rings, reads 0, and issues the IOCTL.
    publish_send(&p, 11, 8);
    assert!(ua.ring(sq) && ua.must_wake());
    assert_eq!(p.a.d.bus.poller_wakes(), 0);
    assert_eq!(hca.ring_doorbell_pages(), Ok(()));
    assert_eq!(one(&p.cqa).wr_id, 11, "run in the IOCTL, not a tick later");
    assert_eq!(p.a.d.bus.poller_wakes(), 1);
    // Woken: it polls again, for a window from now.
    assert_eq!(
        hca.poll_doorbells_step(&mut poller, 9_000),
        PollerStep::Again
    );
    assert!(!ua.must_wake());
    assert_eq!(
        hca.poll_doorbells_step(&mut poller, 9_999),
        PollerStep::Again
    );
    assert_eq!(
        hca.poll_doorbells_step(&mut poller, 10_000),
        PollerStep::Sleep
    );
    assert_eq!(p.cqb.poll().len(), 2);
}

/// A doorbell rung before the poller's last look is found by it: the
/// poller polls on instead of sleeping. A window of 0 sleeps at the first
/// quiet scan.
#[test]
fn a_doorbell_found_by_the_last_look_keeps_the_poller_polling() {
    use crate::{DoorbellPoller, PollerStep};
    let p = Pair::new(Topo::Loopback, IV_QPT_RC, Conn::default());
    let (pa, ua) = page(&p.a);
    let sq = bind(&p.a, pa, DoorbellTarget::Sq(p.qa.qpn));
    p.qb.rq
        .as_ref()
        .unwrap()
        .post(1, &[p.mb.sge(0, 64)])
        .unwrap();
    let hca = &p.a.d.hca;
    let mut poller = DoorbellPoller::new(0);
    assert_eq!(hca.poll_doorbells_step(&mut poller, 0), PollerStep::Sleep);
    publish_send(&p, 7, 8);
    assert!(ua.ring(sq));
    assert_eq!(hca.poll_doorbells_step(&mut poller, 1), PollerStep::Again);
    assert_eq!(one(&p.cqa).wr_id, 7);
    assert_eq!(hca.poll_doorbells_step(&mut poller, 2), PollerStep::Sleep);
    assert_eq!(poller.sleeps, 2);
}

/// A page made while the HCA polls reads "polling"; one made while it
/// sleeps reads 0 (its ULP wakes the HCA).
#[test]
fn new_pages_say_what_the_poller_does() {
    use crate::{DoorbellPoller, PollerStep};
    let n = Node::new(1);
    let mut poller = DoorbellPoller::new(10);
    let (_, asleep) = page(&n);
    assert!(asleep.must_wake());
    assert_eq!(
        n.d.hca.poll_doorbells_step(&mut poller, 0),
        PollerStep::Again
    );
    let (_, polled) = page(&n);
    assert!(!polled.must_wake() && !asleep.must_wake());
    assert_eq!(
        n.d.hca.poll_doorbells_step(&mut poller, 10),
        PollerStep::Sleep
    );
    let (_, later) = page(&n);
    assert!(later.must_wake() && polled.must_wake() && asleep.must_wake());
}
