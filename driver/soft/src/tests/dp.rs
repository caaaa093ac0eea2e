//! Data-path tests: the transport end to end through rings and doorbells,
//! in loopback (one HCA) and between two HCAs on a fabric.

use alloc::sync::Arc;
use alloc::vec;
use alloc::vec::Vec;
use core::net::{IpAddr, Ipv4Addr};
use core::sync::atomic::Ordering;

use irpverbs_abi::*;
use irpverbs_core::{AsyncEvent, Command, CommandOut, Event, Hca};
use irpverbs_ring::wq::{CompletionQueue, RecvQueue, SendQueue, SendWr};
use irpverbs_ring::{Region, Ring, Shared};

use crate::Execution;
use crate::firmware::qp::QpState;
use crate::net::fabric::Fabric;
use crate::tests::util::{Dev, TestPlatform, region};

/// An HCA with a PD.
pub(crate) struct Node {
    pub(crate) d: Dev,
    pub(crate) pd: u32,
}

impl Drop for Node {
    /// Every test checks the receive doorbells' attention count (exactly
    /// the QPs in ERR plus the responders waiting for a receive) and each
    /// receive queue's doorbell request (asking exactly while its QP is in
    /// ERR or its responder waits for a receive).
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        self.d.hca.with_firmware(|fw| {
            let mut want = 0;
            for (qpn, qp) in fw.qps.iter_mut() {
                let asks = qp.state == QpState::Err || qp.tx.resp.rnr_wait;
                want += u32::from(qp.state == QpState::Err) + u32::from(qp.tx.resp.rnr_wait);
                if let Some(rq) = &qp.rq {
                    assert_eq!(
                        rq.0.doorbell_request().asking(),
                        asks,
                        "QP {qpn:#x}'s receive doorbell request"
                    );
                }
            }
            assert_eq!(
                fw.dp.attention.load(Ordering::SeqCst),
                want,
                "attention count"
            );
        });
    }
}

/// A registered MR and the memory behind it.
#[derive(Clone)]
pub(crate) struct Mem {
    pub(crate) lkey: u32,
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) region: Shared<Region>,
}

impl Mem {
    pub(crate) fn sge(&self, off: u64, len: u32) -> IvSge {
        IvSge {
            addr: self.addr + off,
            length: len,
            lkey: self.lkey,
        }
    }

    pub(crate) fn write(&self, off: usize, bytes: &[u8]) {
        self.region.write(off, bytes).unwrap();
    }

    pub(crate) fn read(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.region.read(off, &mut v).unwrap();
        v
    }

    pub(crate) fn u64_at(&self, off: usize) -> u64 {
        u64::from_ne_bytes(self.read(off, 8).try_into().unwrap())
    }
}

/// A CQ and the ULP's view of its ring.
pub(crate) struct Cq {
    pub(crate) cqn: u32,
    pub(crate) q: CompletionQueue,
}

impl Cq {
    pub(crate) fn poll(&self) -> Vec<IvCqe> {
        let mut all = Vec::new();
        let mut out = [IvCqe::default(); 16];
        loop {
            let n = self.q.poll(&mut out).unwrap();
            all.extend_from_slice(&out[..n]);
            if n < out.len() {
                return all;
            }
        }
    }
}

/// A QP and the ULP's views of its queues.
pub(crate) struct Ep {
    pub(crate) qpn: u32,
    pub(crate) sq: SendQueue,
    pub(crate) rq: Option<RecvQueue>,
    pub(crate) qp_type: u32,
}

/// Connection attributes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Conn {
    pub(crate) mtu: u32,
    pub(crate) access: u32,
    pub(crate) rd_atomic: u8,
    pub(crate) rnr_retry: u8,
    pub(crate) retry_cnt: u8,
    pub(crate) sq_psn: u32,
    pub(crate) rq_psn: u32,
    pub(crate) qkey: u32,
}

impl Default for Conn {
    fn default() -> Self {
        Self {
            mtu: IV_MTU_1024,
            access: IV_ACCESS_REMOTE_WRITE | IV_ACCESS_REMOTE_READ | IV_ACCESS_REMOTE_ATOMIC,
            rd_atomic: 16,
            rnr_retry: 7,
            retry_cnt: 7,
            sq_psn: 0x10,
            rq_psn: 0x10,
            qkey: 0x1111_1111,
        }
    }
}

pub(crate) const BIG: IvQpCap = IvQpCap {
    max_send_wr: 64,
    max_recv_wr: 64,
    max_send_sge: 4,
    max_recv_sge: 4,
    max_inline_data: 256,
    reserved: 0,
};

impl Node {
    pub(crate) fn new(last_octet: u8) -> Self {
        Self::with(last_octet, |_| {})
    }

    pub(crate) fn with(last_octet: u8, f: impl FnOnce(&mut crate::SoftConfig)) -> Self {
        let d = Dev::with(|c| {
            c.ip = IpAddr::V4(Ipv4Addr::new(10, 0, 0, last_octet));
            f(c);
        });
        let pd = d.pd();
        Self { d, pd }
    }

    pub(crate) fn gid(&self) -> [u8; 16] {
        self.d.hca.gid()
    }

    pub(crate) fn mem(&self, len: u64, access: u32) -> Mem {
        self.mem_in(self.pd, len, access)
    }

    pub(crate) fn mem_in(&self, pdn: u32, len: u64, access: u32) -> Mem {
        let r = region(len);
        let addr = 0x1_0000_0000 + u64::from(self.d.token() as u32) * 0x100_0000;
        let CommandOut::Mr { lkey, .. } = self.d.ok(Command::RegMr(irpverbs_core::RegMr {
            pdn,
            addr,
            length: len,
            access,
            physical: false,
            region: r.clone(),
        })) else {
            unreachable!()
        };
        Mem {
            lkey,
            addr,
            len,
            region: r,
        }
    }

    pub(crate) fn cq(&self, n: u32) -> Cq {
        self.cq_on(n, 0)
    }

    /// A CQ of `n` entries on completion vector `comp_vector`.
    pub(crate) fn cq_on(&self, n: u32, comp_vector: u32) -> Cq {
        let CommandOut::Cq { cqn, ring, .. } =
            self.d.ok(Command::CreateCq(irpverbs_core::CreateCq {
                cqe: n,
                comp_vector,
            }))
        else {
            unreachable!()
        };
        Cq {
            cqn,
            q: CompletionQueue::new(ring),
        }
    }

    pub(crate) fn srq(&self, max_wr: u32, max_sge: u32, limit: u32) -> (u32, RecvQueue) {
        let CommandOut::Srq {
            srqn,
            max_sge: sge,
            ring,
            ..
        } = self.d.ok(Command::CreateSrq(irpverbs_core::CreateSrq {
            pdn: self.pd,
            max_wr,
            max_sge,
            srq_limit: limit,
        }))
        else {
            unreachable!()
        };
        (srqn, RecvQueue::new(ring, sge))
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn qp_full(
        &self,
        pdn: u32,
        qp_type: u32,
        scq: &Cq,
        rcq: &Cq,
        srqn: Option<u32>,
        sq_sig_all: bool,
        cap: IvQpCap,
    ) -> Ep {
        let CommandOut::Qp { qpn, cap, sq, rq } =
            self.d.ok(Command::CreateQp(irpverbs_core::CreateQp {
                pdn,
                qp_type,
                send_cqn: scq.cqn,
                recv_cqn: rcq.cqn,
                srqn,
                sq_sig_all,
                cap,
            }))
        else {
            unreachable!()
        };
        Ep {
            qpn,
            sq: SendQueue::new(sq, cap.max_send_sge, cap.max_inline_data),
            rq: rq.map(|r| RecvQueue::new(r, cap.max_recv_sge)),
            qp_type,
        }
    }

    pub(crate) fn qp(&self, qp_type: u32, cq: &Cq) -> Ep {
        self.qp_full(self.pd, qp_type, cq, cq, None, false, BIG)
    }

    pub(crate) fn modify(&self, qpn: u32, from: QpState, mask: u32, attr: IvQpAttr) {
        self.d.ok(Command::ModifyQp(irpverbs_core::ModifyQp {
            qpn,
            cur_state: from.to_abi(),
            mask,
            attr,
        }));
    }

    pub(crate) fn to_state(&self, ep: &Ep, from: QpState, to: QpState) {
        self.modify(
            ep.qpn,
            from,
            IV_QP_STATE,
            IvQpAttr {
                qp_state: to.to_abi(),
                ..IvQpAttr::default()
            },
        );
    }

    pub(crate) fn state(&self, ep: &Ep) -> u32 {
        let CommandOut::QpAttr(q) = self.d.ok(Command::QueryQp { qpn: ep.qpn }) else {
            unreachable!()
        };
        q.attr.qp_state
    }

    pub(crate) fn init(&self, ep: &Ep, c: &Conn) {
        let mut a = IvQpAttr {
            qp_state: IV_QPS_INIT,
            port_num: 1,
            qp_access_flags: c.access,
            qkey: c.qkey,
            ..IvQpAttr::default()
        };
        let mask = if ep.qp_type == IV_QPT_UD {
            IV_QP_STATE | IV_QP_PKEY_INDEX | IV_QP_PORT | IV_QP_QKEY
        } else {
            IV_QP_STATE | IV_QP_PKEY_INDEX | IV_QP_PORT | IV_QP_ACCESS_FLAGS
        };
        a.pkey_index = 0;
        self.modify(ep.qpn, QpState::Reset, mask, a);
    }

    pub(crate) fn rtr(&self, ep: &Ep, dgid: [u8; 16], dest_qpn: u32, c: &Conn) {
        let a = IvQpAttr {
            qp_state: IV_QPS_RTR,
            path_mtu: c.mtu,
            dest_qp_num: dest_qpn,
            rq_psn: c.rq_psn,
            max_dest_rd_atomic: c.rd_atomic,
            min_rnr_timer: 12,
            ah_attr: IvAhAttr {
                dgid,
                is_global: 1,
                port_num: 1,
                hop_limit: 64,
                ..IvAhAttr::default()
            },
            ..IvQpAttr::default()
        };
        let mask = if ep.qp_type == IV_QPT_UD {
            IV_QP_STATE
        } else {
            IV_QP_STATE
                | IV_QP_AV
                | IV_QP_PATH_MTU
                | IV_QP_DEST_QPN
                | IV_QP_RQ_PSN
                | IV_QP_MAX_DEST_RD_ATOMIC
                | IV_QP_MIN_RNR_TIMER
        };
        self.modify(ep.qpn, QpState::Init, mask, a);
    }

    pub(crate) fn rts(&self, ep: &Ep, c: &Conn) {
        let a = IvQpAttr {
            qp_state: IV_QPS_RTS,
            sq_psn: c.sq_psn,
            timeout: 14,
            retry_cnt: c.retry_cnt,
            rnr_retry: c.rnr_retry,
            max_rd_atomic: c.rd_atomic,
            ..IvQpAttr::default()
        };
        let mask = IV_QP_STATE
            | IV_QP_SQ_PSN
            | IV_QP_TIMEOUT
            | IV_QP_RETRY_CNT
            | IV_QP_RNR_RETRY
            | IV_QP_MAX_QP_RD_ATOMIC;
        self.modify(ep.qpn, QpState::Rtr, mask, a);
    }

    /// RESET to RTS, connected to `dest_qpn` at `dgid`.
    pub(crate) fn connect(&self, ep: &Ep, dgid: [u8; 16], dest_qpn: u32, c: &Conn) {
        self.init(ep, c);
        self.rtr(ep, dgid, dest_qpn, c);
        self.rts(ep, c);
    }

    pub(crate) fn post(&self, ep: &Ep, wr: &SendWr<'_>) {
        ep.sq.post(wr).unwrap();
        self.d.hca.sq_doorbell(ep.qpn);
        self.run();
    }

    pub(crate) fn recv(&self, ep: &Ep, wr_id: u64, sges: &[IvSge]) {
        ep.rq.as_ref().unwrap().post(wr_id, sges).unwrap();
        self.d.hca.rq_doorbell(ep.qpn);
        self.run();
    }

    /// Deferred: runs the firmware until this HCA is idle (the "hardware
    /// thread").
    pub(crate) fn run(&self) {
        while self.d.hca.busy() {
            self.d.hca.run_firmware();
        }
    }

    pub(crate) fn events(&self) -> Vec<Event> {
        self.d.take_events()
    }

    pub(crate) fn asyncs(&self) -> Vec<AsyncEvent> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                Event::Async(a) => Some(a),
                _ => None,
            })
            .collect()
    }
}

/// Where the two ends of a connection live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Topo {
    /// Both QPs on one HCA.
    Loopback,
    /// One QP on each of two HCAs on a fabric.
    TwoHca,
    /// Two HCAs, firmware on "hardware threads" (run by hand here).
    TwoHcaDeferred,
    /// Both QPs on one HCA whose firmware runs on its "hardware thread"
    /// (run by hand here): the engine's turns, not the doorbells, run the
    /// requester with its peer.
    LoopbackDeferred,
    /// Both QPs on one HCA that short-circuits nothing
    /// ([`crate::SoftConfig::short_circuit`] off): every packet travels as
    /// a frame through the loopback queue.
    LoopbackFrames,
    /// Both QPs on one HCA without the send doorbell's fast path
    /// ([`crate::SoftConfig::fast_path`] off): the requester takes every
    /// WQE, short-circuited to the peer.
    LoopbackShortCircuit,
}

/// A requester QP on `a` connected to a responder QP on `b` (the same
/// node for loopback), each with its own CQ.
pub(crate) struct Pair {
    pub(crate) a: Arc<Node>,
    pub(crate) b: Arc<Node>,
    pub(crate) qa: Ep,
    pub(crate) qb: Ep,
    pub(crate) cqa: Cq,
    pub(crate) cqb: Cq,
    pub(crate) ma: Mem,
    pub(crate) mb: Mem,
    pub(crate) topo: Topo,
    /// `qb`'s SRQ, when it has one instead of a receive queue.
    pub(crate) srq: Option<(u32, RecvQueue)>,
    pub(crate) _fabric: Option<Arc<Fabric<TestPlatform>>>,
}

pub(crate) fn nodes(topo: Topo) -> (Arc<Node>, Arc<Node>, Option<Arc<Fabric<TestPlatform>>>) {
    match topo {
        Topo::Loopback => {
            let a = Arc::new(Node::new(1));
            (a.clone(), a, None)
        }
        Topo::LoopbackDeferred => {
            let a = Arc::new(Node::with(1, |c| c.execution = Execution::Deferred));
            (a.clone(), a, None)
        }
        Topo::LoopbackFrames => {
            let a = Arc::new(Node::with(1, |c| c.short_circuit = false));
            (a.clone(), a, None)
        }
        Topo::LoopbackShortCircuit => {
            let a = Arc::new(Node::with(1, |c| c.fast_path = false));
            (a.clone(), a, None)
        }
        Topo::TwoHca | Topo::TwoHcaDeferred => {
            let deferred = topo == Topo::TwoHcaDeferred;
            let mk = |n| {
                Arc::new(Node::with(n, |c| {
                    if deferred {
                        c.execution = Execution::Deferred;
                    }
                }))
            };
            let (a, b) = (mk(1), mk(2));
            let f = Fabric::new(&TestPlatform);
            f.attach(&a.d.hca).unwrap();
            f.attach(&b.d.hca).unwrap();
            (a, b, Some(f))
        }
    }
}

pub(crate) const ALL_ACCESS: u32 = IV_ACCESS_ALL;

impl Pair {
    pub(crate) fn new(topo: Topo, qp_type: u32, c: Conn) -> Self {
        Self::with_caps(topo, qp_type, c, BIG, false)
    }

    pub(crate) fn with_caps(
        topo: Topo,
        qp_type: u32,
        c: Conn,
        cap: IvQpCap,
        sig_all: bool,
    ) -> Self {
        Self::build(topo, qp_type, c, cap, sig_all, None)
    }

    /// An RC pair whose responder QP takes its receives from an SRQ of 63
    /// WRs of two SGEs (limit unarmed).
    pub(crate) fn on_srq(topo: Topo) -> Self {
        Self::build(topo, IV_QPT_RC, Conn::default(), BIG, false, Some((63, 2)))
    }

    fn build(
        topo: Topo,
        qp_type: u32,
        c: Conn,
        cap: IvQpCap,
        sig_all: bool,
        srq: Option<(u32, u32)>,
    ) -> Self {
        let (a, b, fabric) = nodes(topo);
        // On two completion vectors: loopback, the two CQs share the HCA.
        let cqa = a.cq(64);
        let cqb = b.cq_on(64, 1);
        let srq = srq.map(|(max_wr, max_sge)| b.srq(max_wr, max_sge, 0));
        let qa = a.qp_full(a.pd, qp_type, &cqa, &cqa, None, sig_all, cap);
        let qb = b.qp_full(
            b.pd,
            qp_type,
            &cqb,
            &cqb,
            srq.as_ref().map(|s| s.0),
            sig_all,
            cap,
        );
        a.connect(&qa, b.gid(), qb.qpn, &c);
        b.connect(&qb, a.gid(), qa.qpn, &c);
        let ma = a.mem(1 << 20, ALL_ACCESS);
        let mb = b.mem(1 << 20, ALL_ACCESS);
        let p = Self {
            a,
            b,
            qa,
            qb,
            cqa,
            cqb,
            ma,
            mb,
            topo,
            srq,
            _fabric: fabric,
        };
        p.settle();
        p.a.events();
        p.b.events();
        p
    }

    /// Deferred: runs both HCAs' firmware until nothing is left.
    pub(crate) fn settle(&self) {
        if matches!(self.topo, Topo::TwoHcaDeferred | Topo::LoopbackDeferred) {
            for _ in 0..1000 {
                if !self.a.d.hca.busy() && !self.b.d.hca.busy() {
                    return;
                }
                self.a.d.hca.run_firmware();
                self.b.d.hca.run_firmware();
            }
            panic!("the deferred HCAs never settled");
        }
    }

    pub(crate) fn send(&self, wr: &SendWr<'_>) {
        self.a.post(&self.qa, wr);
        self.settle();
    }

    pub(crate) fn recv(&self, wr_id: u64, sges: &[IvSge]) {
        self.b.recv(&self.qb, wr_id, sges);
        self.settle();
    }

    /// A type 2 memory window on `b`, bound by an unsignaled
    /// `IV_WR_BIND_MW` of `qb` to `len` bytes at `off` of `mem` (an MR of
    /// `b`) with `access`. Returns its rkey.
    pub(crate) fn window(&self, mem: &Mem, off: u64, len: u64, access: u32) -> u32 {
        let CommandOut::Mw { rkey } = self.b.d.ok(Command::AllocMw {
            pdn: self.b.pd,
            mw_type: IV_MW_TYPE_2,
        }) else {
            unreachable!()
        };
        let rkey = (rkey & !0xFF) | (rkey.wrapping_add(0x11) & 0xFF);
        self.b.post(
            &self.qb,
            &SendWr {
                opcode: IV_WR_BIND_MW,
                rkey,
                imm_or_inv: mem.lkey,
                remote_addr: mem.addr + off,
                compare_add: len,
                swap: u64::from(access),
                ..SendWr::default()
            },
        );
        self.settle();
        rkey
    }
}

pub(crate) const TOPOS: [Topo; 3] = [Topo::Loopback, Topo::TwoHca, Topo::TwoHcaDeferred];

pub(crate) fn signaled(wr_id: u64, opcode: u8) -> SendWr<'static> {
    SendWr {
        wr_id,
        opcode,
        flags: IV_SEND_SIGNALED,
        ..SendWr::default()
    }
}

pub(crate) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[track_caller]
pub(crate) fn one(cq: &Cq) -> IvCqe {
    let v = cq.poll();
    assert_eq!(v.len(), 1, "one completion expected: {v:?}");
    v[0]
}

// ---------------------------------------------------------------------------

#[test]
fn rc_send_8_bytes() {
    for topo in TOPOS {
        let p = Pair::new(topo, IV_QPT_RC, Conn::default());
        p.ma.write(0, b"8 bytes!");
        p.recv(7, &[p.mb.sge(100, 64)]);
        let sges = [p.ma.sge(0, 8)];
        p.send(&SendWr {
            sges: &sges,
            ..signaled(1, IV_WR_SEND)
        });
        let r = one(&p.cqb);
        assert_eq!(
            (r.wr_id, r.status, r.opcode, r.byte_len, r.qp_num, r.src_qp),
            (7, IV_WC_SUCCESS, IV_WC_OP_RECV, 8, p.qb.qpn, p.qa.qpn),
            "{topo:?}"
        );
        assert_eq!(p.mb.read(100, 8), b"8 bytes!");
        let s = one(&p.cqa);
        assert_eq!(
            (s.wr_id, s.status, s.opcode, s.qp_num),
            (1, IV_WC_SUCCESS, IV_WC_OP_SEND, p.qa.qpn)
        );
        assert!(p.cqa.poll().is_empty() && p.cqb.poll().is_empty());
        assert_eq!(p.qa.sq.ring().consumer().filled(), Ok(0), "retired");
    }
}

#[test]
fn loopback_rc_sends_writes_reads_and_atomics_take_the_fast_path_and_the_rest_is_short_circuited() {
    let p = Pair::new(Topo::Loopback, IV_QPT_RC, Conn::default());
    p.ma.write(0, b"fast");
    let before = p.a.d.hca.stats().fast_path_wqes;
    p.recv(1, &[p.mb.sge(0, 64)]);
    let sges = [p.ma.sge(0, 4)];
    p.send(&SendWr {
        sges: &sges,
        ..signaled(2, IV_WR_SEND)
    });
    p.send(&SendWr {
        sges: &sges,
        remote_addr: p.mb.addr + 100,
        rkey: p.mb.lkey,
        ..signaled(3, IV_WR_RDMA_WRITE)
    });
    assert_eq!(one(&p.cqb).status, IV_WC_SUCCESS);
    assert_eq!(statuses(&p.cqa), [(2, IV_WC_SUCCESS), (3, IV_WC_SUCCESS)]);
    assert_eq!(
        (p.mb.read(0, 4), p.mb.read(100, 4)),
        (b"fast".to_vec(), b"fast".to_vec())
    );
    assert_eq!(
        p.a.d.hca.stats().fast_path_wqes,
        before + 2,
        "both on the fast path"
    );
    // A READ too.
    let rd = [p.ma.sge(200, 4)];
    p.send(&SendWr {
        sges: &rd,
        remote_addr: p.mb.addr + 100,
        rkey: p.mb.lkey,
        ..signaled(4, IV_WR_RDMA_READ)
    });
    assert_eq!(statuses(&p.cqa), [(4, IV_WC_SUCCESS)]);
    assert_eq!(p.ma.read(200, 4), b"fast");
    assert_eq!(p.a.d.hca.stats().fast_path_wqes, before + 3, "the READ too");
    // And an atomic.
    let old = [p.ma.sge(208, 8)];
    p.send(&SendWr {
        sges: &old,
        remote_addr: p.mb.addr + 104,
        rkey: p.mb.lkey,
        compare_add: 1,
        ..signaled(5, IV_WR_ATOMIC_FETCH_AND_ADD)
    });
    assert_eq!(statuses(&p.cqa), [(5, IV_WC_SUCCESS)]);
    assert_eq!(p.ma.u64_at(208), 0, "the original value");
    assert_eq!(p.mb.u64_at(104), 1);
    assert_eq!(
        p.a.d.hca.stats().fast_path_wqes,
        before + 4,
        "the atomic too"
    );
    // A WRITE with immediate and a SEND with immediate, with
    // their receive completions' immediate data; the bytes land at `at`
    // (the WRITE's target, the SEND's receive buffer).
    let with_imm = |wr: SendWr<'_>, recv_at: u64, at: usize, opcode: u32| {
        p.recv(wr.wr_id, &[p.mb.sge(recv_at, 64)]);
        p.send(&wr);
        assert_eq!(statuses(&p.cqa), [(wr.wr_id, IV_WC_SUCCESS)]);
        let r = one(&p.cqb);
        assert_eq!(
            (r.wr_id, r.opcode, r.byte_len, r.imm_or_inv, r.wc_flags),
            (wr.wr_id, opcode, 4, wr.imm_or_inv, IV_WC_WITH_IMM)
        );
        assert_eq!(p.mb.read(at, 4), b"fast");
    };
    let write_imm = SendWr {
        sges: &sges,
        remote_addr: p.mb.addr + 300,
        rkey: p.mb.lkey,
        imm_or_inv: 0xfeed,
        ..signaled(6, IV_WR_RDMA_WRITE_WITH_IMM)
    };
    with_imm(write_imm, 512, 300, IV_WC_OP_RECV_RDMA_WITH_IMM);
    let send_imm = SendWr {
        sges: &sges,
        imm_or_inv: 0xbeef,
        ..signaled(7, IV_WR_SEND_WITH_IMM)
    };
    with_imm(send_imm, 600, 600, IV_WC_OP_RECV);
    assert_eq!(
        p.a.d.hca.stats().fast_path_wqes,
        before + 6,
        "both with immediate"
    );
    // A SEND with invalidate of a window, and in the same list a WRITE
    // with the key it invalidated: the SEND lands in the window's MR
    // itself, the WRITE after it must not get through. Both past the fast
    // path (what changes a window is the responder's alone), short-
    // circuited to it, the WRITE refused (REM_ACCESS_ERR), the QP in ERR.
    let victim = p.b.mem(4096, ALL_ACCESS);
    let rkey = p.window(&victim, 0, 4096, IV_ACCESS_REMOTE_WRITE);
    p.recv(8, &[victim.sge(0, 64)]);
    let after = p.a.d.hca.stats().fast_path_wqes;
    let short = p.a.d.hca.stats().short_circuited;
    p.qa.sq
        .post_list(&[
            SendWr {
                inline: Some(b"last"),
                imm_or_inv: rkey,
                ..signaled(8, IV_WR_SEND_WITH_INV)
            },
            SendWr {
                sges: &sges,
                remote_addr: victim.addr + 64,
                rkey,
                ..signaled(9, IV_WR_RDMA_WRITE)
            },
        ])
        .unwrap();
    p.a.d.hca.sq_doorbell(p.qa.qpn);
    p.settle();
    assert_eq!(
        statuses(&p.cqa),
        [(8, IV_WC_SUCCESS), (9, IV_WC_REM_ACCESS_ERR)]
    );
    assert_eq!(victim.read(0, 4), b"last");
    assert_eq!(victim.read(64, 4), [0; 4], "nothing written after");
    let r = one(&p.cqb);
    assert_eq!(
        (r.wr_id, r.imm_or_inv, r.wc_flags),
        (8, rkey, IV_WC_WITH_INV)
    );
    assert_eq!(p.a.d.hca.stats().fast_path_wqes, after);
    assert_eq!(p.a.d.hca.stats().short_circuited, short + 2);
    // Two HCAs never take the fast path nor short-circuit, nor does an
    // HCA told not to.
    for topo in [Topo::TwoHca, Topo::LoopbackFrames] {
        let two = Pair::new(topo, IV_QPT_RC, Conn::default());
        two.recv(1, &[two.mb.sge(0, 64)]);
        let s2 = [two.ma.sge(0, 4)];
        two.send(&SendWr {
            sges: &s2,
            ..signaled(2, IV_WR_SEND)
        });
        assert_eq!(one(&two.cqb).status, IV_WC_SUCCESS, "{topo:?}");
        assert_eq!(statuses(&two.cqa), [(2, IV_WC_SUCCESS)], "{topo:?}");
        let stats = two.a.d.hca.stats();
        assert_eq!(
            (stats.fast_path_wqes, stats.short_circuited),
            (0, 0),
            "{topo:?}"
        );
    }
}

/// A doorbell for more packets than one fast-path run sends (its budget)
/// stays on the fast path: the engine's next turn continues it, lock
/// released in between, instead of the general path taking the rest.
#[test]
fn a_doorbell_past_the_fast_path_budget_stays_on_the_fast_path() {
    let p = Pair::new(Topo::Loopback, IV_QPT_RC, Conn::default());
    // 40 WRITEs of 16 packets each (MTU 1024): 640 packets, past two
    // budgets of 256.
    let len = 16 * 1024u32;
    for i in 0..40u64 {
        p.ma.write(
            (u64::from(len) * i) as usize,
            &pattern(len as usize, i as u8),
        );
    }
    let sges: Vec<[IvSge; 1]> = (0..40u64)
        .map(|i| [p.ma.sge(u64::from(len) * i, len)])
        .collect();
    let wrs: Vec<SendWr<'_>> = (0..40u64)
        .map(|i| SendWr {
            sges: &sges[i as usize],
            remote_addr: p.mb.addr + u64::from(len) * i,
            rkey: p.mb.lkey,
            ..signaled(i, IV_WR_RDMA_WRITE)
        })
        .collect();
    let before = p.a.d.hca.stats().fast_path_wqes;
    p.qa.sq.post_list(&wrs).unwrap();
    p.a.d.hca.sq_doorbell(p.qa.qpn);
    let want: Vec<_> = (0..40).map(|i| (i, IV_WC_SUCCESS)).collect();
    assert_eq!(statuses(&p.cqa), want);
    assert_eq!(
        p.a.d.hca.stats().fast_path_wqes,
        before + 40,
        "all on the fast path"
    );
    for i in 0..40u64 {
        let at = (u64::from(len) * i) as usize;
        assert_eq!(p.mb.read(at, len as usize), pattern(len as usize, i as u8));
    }
}

/// The fast path remembers the receive queue's producer index and takes
/// the receives it saw posted without reading it again; once a flush and a
/// reset move the consumer index past what it saw, it reads the index
/// again and takes only what was posted since (a SEND with nothing posted
/// waits for a receive, RNR, instead of taking an old slot).
#[test]
fn fast_path_reads_the_receive_index_again_after_a_flush_and_reset() {
    let p = Pair::new(Topo::Loopback, IV_QPT_RC, Conn::default());
    let sge = [p.mb.sge(0, 8)];
    for i in 0..4 {
        p.b.recv(&p.qb, i, &sge);
    }
    p.send(&SendWr {
        inline: Some(b"one"),
        ..signaled(10, IV_WR_SEND)
    });
    assert_eq!(statuses(&p.cqb), [(0, IV_WC_SUCCESS)]);
    for i in 4..8 {
        p.b.recv(&p.qb, i, &sge);
    }
    p.b.to_state(&p.qb, QpState::Rts, QpState::Err);
    p.settle();
    let flushed: Vec<_> = (1..8).map(|i| (i, IV_WC_WR_FLUSH_ERR)).collect();
    assert_eq!(statuses(&p.cqb), flushed);
    assert_eq!(statuses(&p.cqa), [(10, IV_WC_SUCCESS)]);
    p.b.to_state(&p.qb, QpState::Err, QpState::Reset);
    p.a.to_state(&p.qa, QpState::Rts, QpState::Reset);
    let c = Conn::default();
    p.a.connect(&p.qa, p.b.gid(), p.qb.qpn, &c);
    p.b.connect(&p.qb, p.a.gid(), p.qa.qpn, &c);
    let fast = p.a.d.hca.stats().fast_path_wqes;
    for i in 20..22 {
        p.b.recv(&p.qb, i, &sge);
    }
    for i in 11..13 {
        p.send(&SendWr {
            inline: Some(b"two"),
            ..signaled(i, IV_WR_SEND)
        });
    }
    assert_eq!(statuses(&p.cqb), [(20, IV_WC_SUCCESS), (21, IV_WC_SUCCESS)]);
    assert_eq!(p.a.d.hca.stats().fast_path_wqes, fast + 2, "fast path");
    // Zero bytes: any slot would take it, the stale ones included.
    p.send(&signaled(13, IV_WR_SEND));
    assert!(p.cqb.poll().is_empty(), "nothing posted: RNR");
    p.recv(22, &sge);
    assert_eq!(statuses(&p.cqb), [(22, IV_WC_SUCCESS)]);
    assert_eq!(
        statuses(&p.cqa),
        [
            (11, IV_WC_SUCCESS),
            (12, IV_WC_SUCCESS),
            (13, IV_WC_SUCCESS)
        ]
    );
}

/// A key the fast path took changes between doorbells: a key whose slot
/// was registered again over the same memory (a new generation), a
/// deregistered key and an rkey a SEND with invalidate invalidated each
/// fail as the general path fails them, after a doorbell that took the
/// same key on the fast path (nothing the fast path knew of the key may
/// outlive the change).
#[test]
fn keys_the_fast_path_took_fail_once_their_mrs_change() {
    let access = IV_ACCESS_LOCAL_WRITE | IV_ACCESS_REMOTE_WRITE;
    // `old`'s range registered again, over the same memory: everything
    // a remembered check looked at is as it was, but the key.
    let reg_at = |n: &Node, old: &Mem, access: u32| {
        let CommandOut::Mr { lkey, .. } = n.d.ok(Command::RegMr(irpverbs_core::RegMr {
            pdn: n.pd,
            addr: old.addr,
            length: old.len,
            access,
            physical: false,
            region: old.region.clone(),
        })) else {
            unreachable!()
        };
        Mem {
            lkey,
            ..old.clone()
        }
    };
    let write = |p: &Pair, wr_id: u64, src: &Mem, dst: &Mem| {
        let s = [src.sge(0, 8)];
        p.send(&SendWr {
            sges: &s,
            remote_addr: dst.addr,
            rkey: dst.lkey,
            ..signaled(wr_id, IV_WR_RDMA_WRITE)
        });
    };

    // The destination's slot registered again: the old rkey names nothing.
    let p = Pair::new(Topo::Loopback, IV_QPT_RC, Conn::default());
    let dst = p.b.mem(4096, access);
    p.ma.write(0, b"12345678");
    let fast = p.a.d.hca.stats().fast_path_wqes;
    write(&p, 1, &p.ma, &dst);
    assert_eq!(statuses(&p.cqa), [(1, IV_WC_SUCCESS)]);
    assert_eq!(p.a.d.hca.stats().fast_path_wqes, fast + 1, "fast path");
    p.b.d.ok(Command::DeregMr { lkey: dst.lkey });
    let again = reg_at(&p.b, &dst, access);
    assert_eq!(again.lkey >> 8, dst.lkey >> 8, "the same slot");
    assert_ne!(again.lkey, dst.lkey, "a new generation");
    again.write(0, &[0; 8]);
    write(&p, 2, &p.ma, &dst);
    assert_eq!(statuses(&p.cqa), [(2, IV_WC_REM_ACCESS_ERR)]);
    assert_eq!(again.read(0, 8), [0; 8], "nothing written");

    // The source deregistered after a WRITE from it.
    let p = Pair::new(Topo::Loopback, IV_QPT_RC, Conn::default());
    let src = p.a.mem(4096, IV_ACCESS_LOCAL_WRITE);
    write(&p, 3, &src, &p.mb);
    assert_eq!(statuses(&p.cqa), [(3, IV_WC_SUCCESS)]);
    p.a.d.ok(Command::DeregMr { lkey: src.lkey });
    let again = reg_at(&p.a, &src, IV_ACCESS_LOCAL_WRITE);
    assert_eq!(again.lkey >> 8, src.lkey >> 8, "the same slot");
    write(&p, 4, &src, &p.mb);
    assert_eq!(statuses(&p.cqa), [(4, IV_WC_LOC_PROT_ERR)]);

    // A window's rkey invalidated by a SEND with invalidate after a
    // WRITE through it.
    let p = Pair::new(Topo::Loopback, IV_QPT_RC, Conn::default());
    let mr = p.b.mem(4096, access | IV_ACCESS_MW_BIND);
    let rkey = p.window(&mr, 0, 4096, IV_ACCESS_REMOTE_WRITE);
    let dst = Mem { lkey: rkey, ..mr };
    write(&p, 5, &p.ma, &dst);
    assert_eq!(statuses(&p.cqa), [(5, IV_WC_SUCCESS)]);
    p.recv(6, &[p.mb.sge(0, 64)]);
    p.send(&SendWr {
        inline: Some(b"inv"),
        imm_or_inv: rkey,
        ..signaled(6, IV_WR_SEND_WITH_INV)
    });
    assert_eq!(statuses(&p.cqa), [(6, IV_WC_SUCCESS)]);
    assert_eq!(one(&p.cqb).status, IV_WC_SUCCESS);
    dst.write(0, &[0; 8]);
    write(&p, 7, &p.ma, &dst);
    assert_eq!(statuses(&p.cqa), [(7, IV_WC_REM_ACCESS_ERR)]);
    assert_eq!(dst.read(0, 8), [0; 8], "nothing written");
}

#[test]
fn rc_every_opcode() {
    for topo in TOPOS {
        let p = Pair::new(topo, IV_QPT_RC, Conn::default());
        let (ma, mb) = (&p.ma, &p.mb);

        // SEND with immediate.
        p.recv(1, &[mb.sge(0, 4096)]);
        ma.write(0, &pattern(100, 1));
        let s = [ma.sge(0, 100)];
        p.send(&SendWr {
            sges: &s,
            imm_or_inv: 0xDEAD_BEEF,
            ..signaled(10, IV_WR_SEND_WITH_IMM)
        });
        let r = one(&p.cqb);
        assert_eq!(
            (r.wr_id, r.opcode, r.byte_len, r.wc_flags, r.imm_or_inv),
            (1, IV_WC_OP_RECV, 100, IV_WC_WITH_IMM, 0xDEAD_BEEF),
            "{topo:?}"
        );
        assert_eq!(mb.read(0, 100), pattern(100, 1));
        assert_eq!(one(&p.cqa).opcode, IV_WC_OP_SEND);

        // RDMA WRITE: no receive consumed.
        ma.write(1000, &pattern(3000, 2));
        let s = [ma.sge(1000, 3000)];
        p.send(&SendWr {
            sges: &s,
            remote_addr: mb.addr + 5000,
            rkey: mb.lkey,
            ..signaled(11, IV_WR_RDMA_WRITE)
        });
        assert_eq!(mb.read(5000, 3000), pattern(3000, 2));
        let c = one(&p.cqa);
        assert_eq!(
            (c.wr_id, c.status, c.opcode),
            (11, IV_WC_SUCCESS, IV_WC_OP_RDMA_WRITE)
        );
        assert!(p.cqb.poll().is_empty());

        // RDMA WRITE with immediate: consumes a receive.
        p.recv(2, &[mb.sge(0, 16)]);
        ma.write(9000, b"0123456789");
        let s = [ma.sge(9000, 10)];
        p.send(&SendWr {
            sges: &s,
            remote_addr: mb.addr + 9100,
            rkey: mb.lkey,
            imm_or_inv: 77,
            ..signaled(12, IV_WR_RDMA_WRITE_WITH_IMM)
        });
        let r = one(&p.cqb);
        assert_eq!(
            (r.wr_id, r.opcode, r.byte_len, r.wc_flags, r.imm_or_inv),
            (2, IV_WC_OP_RECV_RDMA_WITH_IMM, 10, IV_WC_WITH_IMM, 77)
        );
        assert_eq!(mb.read(9100, 10), b"0123456789");
        assert_eq!(one(&p.cqa).opcode, IV_WC_OP_RDMA_WRITE);

        // RDMA READ.
        mb.write(20000, &pattern(5000, 3));
        let s = [ma.sge(30000, 5000)];
        p.send(&SendWr {
            sges: &s,
            remote_addr: mb.addr + 20000,
            rkey: mb.lkey,
            ..signaled(13, IV_WR_RDMA_READ)
        });
        assert_eq!(ma.read(30000, 5000), pattern(5000, 3));
        let c = one(&p.cqa);
        assert_eq!(
            (c.wr_id, c.status, c.opcode, c.byte_len),
            (13, IV_WC_SUCCESS, IV_WC_OP_RDMA_READ, 5000)
        );

        // Atomics.
        mb.write(40000, &5u64.to_ne_bytes());
        let s = [ma.sge(41000, 8)];
        let cas = |wr_id, compare, swap| SendWr {
            sges: &s,
            remote_addr: mb.addr + 40000,
            rkey: mb.lkey,
            compare_add: compare,
            swap,
            ..signaled(wr_id, IV_WR_ATOMIC_CMP_AND_SWP)
        };
        p.send(&cas(14, 5, 9));
        assert_eq!((ma.u64_at(41000), mb.u64_at(40000)), (5, 9), "swapped");
        assert_eq!(one(&p.cqa).opcode, IV_WC_OP_COMP_SWAP);
        p.send(&cas(15, 5, 11));
        assert_eq!((ma.u64_at(41000), mb.u64_at(40000)), (9, 9), "not swapped");
        one(&p.cqa);
        p.send(&SendWr {
            sges: &s,
            remote_addr: mb.addr + 40000,
            rkey: mb.lkey,
            compare_add: 3,
            ..signaled(16, IV_WR_ATOMIC_FETCH_AND_ADD)
        });
        assert_eq!((ma.u64_at(41000), mb.u64_at(40000)), (9, 12));
        let c = one(&p.cqa);
        assert_eq!((c.wr_id, c.opcode), (16, IV_WC_OP_FETCH_ADD));

        // SEND with invalidate, of a type 2 window.
        let victim = p.b.mem(4096, ALL_ACCESS);
        let rkey = p.window(&victim, 0, 4096, IV_ACCESS_REMOTE_WRITE);
        p.recv(3, &[mb.sge(0, 64)]);
        let s = [ma.sge(0, 4)];
        p.send(&SendWr {
            sges: &s,
            imm_or_inv: rkey,
            ..signaled(17, IV_WR_SEND_WITH_INV)
        });
        let r = one(&p.cqb);
        assert_eq!(
            (r.wr_id, r.status, r.wc_flags, r.imm_or_inv),
            (3, IV_WC_SUCCESS, IV_WC_WITH_INV, rkey)
        );
        assert_eq!(one(&p.cqa).status, IV_WC_SUCCESS);
        // The invalidated rkey no longer works.
        let s = [ma.sge(0, 4)];
        p.send(&SendWr {
            sges: &s,
            remote_addr: victim.addr,
            rkey,
            ..signaled(18, IV_WR_RDMA_WRITE)
        });
        let c = one(&p.cqa);
        assert_eq!((c.wr_id, c.status), (18, IV_WC_REM_ACCESS_ERR), "{topo:?}");
        assert_eq!(p.a.state(&p.qa), IV_QPS_ERR);
        assert_eq!(p.b.state(&p.qb), IV_QPS_ERR);
        assert_eq!(
            p.b.asyncs(),
            [AsyncEvent::QpAccessError(p.qb.qpn)],
            "{topo:?}"
        );
    }
}

#[test]
fn sgl_and_inline() {
    for topo in TOPOS {
        let p = Pair::new(topo, IV_QPT_RC, Conn::default());
        let (ma, mb) = (&p.ma, &p.mb);
        ma.write(0, b"abc");
        ma.write(100, b"defgh");
        ma.write(200, b"ij");
        // Scatter into three pieces, the middle one of length 0.
        p.recv(1, &[mb.sge(1000, 4), mb.sge(0, 0), mb.sge(2000, 100)]);
        let s = [ma.sge(0, 3), ma.sge(100, 5), ma.sge(200, 2)];
        p.send(&SendWr {
            sges: &s,
            ..signaled(1, IV_WR_SEND)
        });
        assert_eq!(one(&p.cqb).byte_len, 10);
        assert_eq!(mb.read(1000, 4), b"abcd");
        assert_eq!(mb.read(2000, 6), b"efghij");
        one(&p.cqa);

        // Inline: the data lives in the WQE.
        p.recv(2, &[mb.sge(3000, 256)]);
        let data = pattern(200, 9);
        p.send(&SendWr {
            inline: Some(&data),
            ..signaled(2, IV_WR_SEND)
        });
        assert_eq!(one(&p.cqb).byte_len, 200);
        assert_eq!(mb.read(3000, 200), data);
        one(&p.cqa);
        p.send(&SendWr {
            inline: Some(b"inline write"),
            remote_addr: mb.addr + 4000,
            rkey: mb.lkey,
            ..signaled(3, IV_WR_RDMA_WRITE)
        });
        assert_eq!(mb.read(4000, 12), b"inline write");
        one(&p.cqa);

        // READ into a scatter list.
        mb.write(5000, &pattern(3000, 4));
        let s = [ma.sge(10_000, 1000), ma.sge(20_000, 2000)];
        p.send(&SendWr {
            sges: &s,
            remote_addr: mb.addr + 5000,
            rkey: mb.lkey,
            ..signaled(4, IV_WR_RDMA_READ)
        });
        let want = pattern(3000, 4);
        assert_eq!(ma.read(10_000, 1000), want[..1000]);
        assert_eq!(ma.read(20_000, 2000), want[1000..]);
        one(&p.cqa);
    }
}

#[test]
fn segmentation_across_mtus() {
    for topo in [Topo::Loopback, Topo::TwoHca] {
        for mtu in IV_MTU_256..=IV_MTU_4096 {
            let bytes = 128u32 << mtu;
            let p = Pair::new(
                topo,
                IV_QPT_RC,
                Conn {
                    mtu,
                    ..Conn::default()
                },
            );
            let (ma, mb) = (&p.ma, &p.mb);
            for (n, len) in [0, 1, bytes - 1, bytes, bytes + 1, 3 * bytes + 5, 65536]
                .into_iter()
                .enumerate()
            {
                let seed = (n as u8) ^ (mtu as u8);
                let data = pattern(len as usize, seed);
                ma.write(0, &data);
                // SEND across two receive SGEs.
                p.recv(1, &[mb.sge(0, len / 2), mb.sge(100_000, len - len / 2 + 7)]);
                let s = [ma.sge(0, len)];
                let before = p.a.d.hca.stats().packets_sent;
                p.send(&SendWr {
                    sges: &s,
                    ..signaled(1, IV_WR_SEND)
                });
                let r = one(&p.cqb);
                assert_eq!(
                    (r.status, r.byte_len),
                    (IV_WC_SUCCESS, len),
                    "{topo:?} mtu {bytes} len {len}"
                );
                let mut got = mb.read(0, (len / 2) as usize);
                got.extend(mb.read(100_000, (len - len / 2) as usize));
                assert_eq!(got, data, "SEND {len} at MTU {bytes}");
                assert_eq!(one(&p.cqa).status, IV_WC_SUCCESS);
                let packets = u64::from(len.div_ceil(bytes).max(1));
                let sent = p.a.d.hca.stats().packets_sent - before;
                if topo == Topo::TwoHca {
                    assert_eq!(sent, packets, "{len} bytes in {packets} packets of {bytes}");
                }
                // WRITE, then READ it back elsewhere.
                let s = [ma.sge(0, len)];
                p.send(&SendWr {
                    sges: &s,
                    remote_addr: mb.addr + 200_000,
                    rkey: mb.lkey,
                    ..signaled(2, IV_WR_RDMA_WRITE)
                });
                assert_eq!(mb.read(200_000, len as usize), data, "WRITE {len}");
                one(&p.cqa);
                let s = [ma.sge(300_000, len)];
                p.send(&SendWr {
                    sges: &s,
                    remote_addr: mb.addr + 200_000,
                    rkey: mb.lkey,
                    ..signaled(3, IV_WR_RDMA_READ)
                });
                assert_eq!(ma.read(300_000, len as usize), data, "READ {len}");
                let c = one(&p.cqa);
                assert_eq!((c.status, c.byte_len), (IV_WC_SUCCESS, len));
            }
        }
    }
}

#[test]
fn unsignaled_retire_silently_and_sq_sig_all_signals_all() {
    let p = Pair::new(Topo::TwoHca, IV_QPT_RC, Conn::default());
    for i in 0..5 {
        p.a.post(
            &p.qa,
            &SendWr {
                wr_id: i,
                opcode: IV_WR_RDMA_WRITE,
                flags: if i == 4 { IV_SEND_SIGNALED } else { 0 },
                inline: Some(b"x"),
                remote_addr: p.mb.addr,
                rkey: p.mb.lkey,
                ..SendWr::default()
            },
        );
    }
    assert_eq!(one(&p.cqa).wr_id, 4);
    assert_eq!(p.qa.sq.ring().consumer().filled(), Ok(0));

    let p = Pair::with_caps(Topo::TwoHca, IV_QPT_RC, Conn::default(), BIG, true);
    for i in 0..3 {
        p.a.post(
            &p.qa,
            &SendWr {
                wr_id: i,
                opcode: IV_WR_RDMA_WRITE,
                inline: Some(b"x"),
                remote_addr: p.mb.addr,
                rkey: p.mb.lkey,
                ..SendWr::default()
            },
        );
    }
    let ids: Vec<u64> = p.cqa.poll().iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, [0, 1, 2], "sq_sig_all");
}

/// Writes a send WQE straight into the ring (no validation: what a buggy or
/// hostile ULP can do), publishes it and rings the doorbell.
pub(crate) fn post_raw(node: &Node, ep: &Ep, wqe: &IvSendWqe, body: &[u8]) {
    let ring = ep.sq.ring();
    let p = ring.producer();
    let i = p.next_free().unwrap();
    let at = ring.slot_offset(i);
    ring.region().write_obj(at, wqe).unwrap();
    ring.region().write(at + IV_SEND_WQE_HEADER, body).unwrap();
    p.publish(i.wrapping_add(1));
    node.d.hca.sq_doorbell(ep.qpn);
}

/// Writes a receive WQE straight into the ring.
pub(crate) fn post_recv_raw(node: &Node, ep: &Ep, wqe: &IvRecvWqe, body: &[u8]) {
    let ring = ep.rq.as_ref().unwrap().ring();
    let p = ring.producer();
    let i = p.next_free().unwrap();
    let at = ring.slot_offset(i);
    ring.region().write_obj(at, wqe).unwrap();
    ring.region().write(at + IV_RECV_WQE_HEADER, body).unwrap();
    p.publish(i.wrapping_add(1));
    node.d.hca.rq_doorbell(ep.qpn);
}

fn statuses(cq: &Cq) -> Vec<(u64, u32)> {
    cq.poll().iter().map(|c| (c.wr_id, c.status)).collect()
}

#[test]
fn receive_buffer_too_small() {
    for topo in TOPOS {
        let p = Pair::new(topo, IV_QPT_RC, Conn::default());
        p.recv(1, &[p.mb.sge(0, 4)]);
        p.recv(2, &[p.mb.sge(0, 4)]);
        let s = [p.ma.sge(0, 8)];
        p.a.post(
            &p.qa,
            &SendWr {
                sges: &s,
                ..signaled(10, IV_WR_SEND)
            },
        );
        p.a.post(
            &p.qa,
            &SendWr {
                sges: &s,
                ..signaled(11, IV_WR_SEND)
            },
        );
        p.settle();
        assert_eq!(
            statuses(&p.cqb),
            [(1, IV_WC_LOC_LEN_ERR), (2, IV_WC_WR_FLUSH_ERR)],
            "{topo:?}"
        );
        assert_eq!(
            statuses(&p.cqa),
            [(10, IV_WC_REM_INV_REQ_ERR), (11, IV_WC_WR_FLUSH_ERR)]
        );
        assert_eq!(p.a.state(&p.qa), IV_QPS_ERR);
        assert_eq!(p.b.state(&p.qb), IV_QPS_ERR);
        let b_events = p.b.asyncs();
        assert!(
            b_events.contains(&AsyncEvent::QpRequestError(p.qb.qpn)),
            "{b_events:?}"
        );
        assert!(!p.a.asyncs().contains(&AsyncEvent::QpRequestError(p.qa.qpn)));
    }
}

#[test]
fn requester_length_errors() {
    // An atomic's local buffer must be 8 bytes.
    let p = Pair::new(Topo::TwoHca, IV_QPT_RC, Conn::default());
    let s = [p.ma.sge(0, 4)];
    p.send(&SendWr {
        sges: &s,
        remote_addr: p.mb.addr,
        rkey: p.mb.lkey,
        ..signaled(1, IV_WR_ATOMIC_FETCH_AND_ADD)
    });
    assert_eq!(statuses(&p.cqa), [(1, IV_WC_LOC_LEN_ERR)]);
    assert_eq!(p.a.state(&p.qa), IV_QPS_ERR);
    assert_eq!(p.b.state(&p.qb), IV_QPS_RTS, "never reached the responder");

    // A message over max_msg_sz (2^31), whatever its keys.
    let p = Pair::new(Topo::Loopback, IV_QPT_RC, Conn::default());
    let huge = IvSge {
        addr: 0,
        length: 1 << 30,
        lkey: 0xBAD,
    };
    let s = [huge, huge, IvSge { length: 1, ..huge }];
    p.send(&SendWr {
        sges: &s,
        ..signaled(2, IV_WR_SEND)
    });
    assert_eq!(statuses(&p.cqa), [(2, IV_WC_LOC_LEN_ERR)]);
}

#[test]
fn local_protection_errors() {
    for topo in [Topo::Loopback, Topo::TwoHca] {
        type Case = fn(&Pair) -> (u8, Vec<IvSge>);
        let cases: [Case; 6] = [
            // No MR has this key.
            |p| {
                (
                    IV_WR_SEND,
                    vec![IvSge {
                        lkey: p.ma.lkey ^ 0x100,
                        ..p.ma.sge(0, 8)
                    }],
                )
            },
            // A stale key: right index, wrong generation.
            |p| {
                (
                    IV_WR_SEND,
                    vec![IvSge {
                        lkey: p.ma.lkey ^ 1,
                        ..p.ma.sge(0, 8)
                    }],
                )
            },
            // Past the end of the MR.
            |p| (IV_WR_SEND, vec![p.ma.sge(p.ma.len - 4, 8)]),
            // An MR of another PD.
            |p| {
                let other = p.a.d.pd();
                let m = p.a.mem_in(other, 4096, ALL_ACCESS);
                (IV_WR_SEND, vec![m.sge(0, 8)])
            },
            // READ into an MR without LOCAL_WRITE.
            |p| {
                let m = p.a.mem(4096, IV_ACCESS_REMOTE_READ);
                (IV_WR_RDMA_READ, vec![m.sge(0, 8)])
            },
            // An atomic's result into an MR without LOCAL_WRITE.
            |p| {
                let m = p.a.mem(4096, 0);
                (IV_WR_ATOMIC_FETCH_AND_ADD, vec![m.sge(0, 8)])
            },
        ];
        for (i, case) in cases.iter().enumerate() {
            let p = Pair::new(topo, IV_QPT_RC, Conn::default());
            p.recv(1, &[p.mb.sge(0, 64)]);
            let (opcode, sges) = case(&p);
            p.send(&SendWr {
                sges: &sges,
                remote_addr: p.mb.addr,
                rkey: p.mb.lkey,
                ..signaled(5, opcode)
            });
            assert_eq!(
                statuses(&p.cqa),
                [(5, IV_WC_LOC_PROT_ERR)],
                "{topo:?} case {i}"
            );
            assert_eq!(p.a.state(&p.qa), IV_QPS_ERR);
            assert_eq!(p.b.state(&p.qb), IV_QPS_RTS, "case {i}");
            assert!(p.cqb.poll().is_empty(), "nothing sent");
        }
    }
}

#[test]
fn local_qp_operation_errors() {
    // Garbage WQEs on RC.
    type Garbage = fn(&Mem) -> (IvSendWqe, Vec<u8>);
    let garbage: [Garbage; 5] = [
        |_| {
            (
                IvSendWqe {
                    opcode: 99,
                    ..IvSendWqe::default()
                },
                vec![],
            )
        },
        |_| {
            (
                IvSendWqe {
                    flags: 0x80,
                    ..IvSendWqe::default()
                },
                vec![],
            )
        },
        |_| {
            (
                IvSendWqe {
                    reserved: 1,
                    ..IvSendWqe::default()
                },
                vec![],
            )
        },
        |_| {
            (
                IvSendWqe {
                    num_sge: 33,
                    ..IvSendWqe::default()
                },
                vec![],
            )
        },
        |_| {
            (
                IvSendWqe {
                    flags: IV_SEND_INLINE,
                    inline_len: 10_000,
                    ..IvSendWqe::default()
                },
                vec![],
            )
        },
    ];
    for (i, g) in garbage.iter().enumerate() {
        let p = Pair::new(Topo::TwoHca, IV_QPT_RC, Conn::default());
        let (mut wqe, body) = g(&p.ma);
        wqe.wr_id = 0x1234;
        post_raw(&p.a, &p.qa, &wqe, &body);
        assert_eq!(
            statuses(&p.cqa),
            [(0x1234, IV_WC_LOC_QP_OP_ERR)],
            "garbage {i}"
        );
        assert_eq!(p.a.state(&p.qa), IV_QPS_ERR);
    }
    // Inline data on a READ.
    let p = Pair::new(Topo::Loopback, IV_QPT_RC, Conn::default());
    p.send(&SendWr {
        inline: Some(b"12345678"),
        remote_addr: p.mb.addr,
        rkey: p.mb.lkey,
        ..signaled(3, IV_WR_RDMA_READ)
    });
    assert_eq!(statuses(&p.cqa), [(3, IV_WC_LOC_QP_OP_ERR)]);

    // Opcodes UC and UD do not have: the QP goes to SQE (send side only).
    for (qpt, opcode) in [
        (IV_QPT_UC, IV_WR_RDMA_READ),
        (IV_QPT_UC, IV_WR_ATOMIC_CMP_AND_SWP),
        (IV_QPT_UC, IV_WR_SEND_WITH_INV),
        (IV_QPT_UD, IV_WR_RDMA_WRITE),
        (IV_QPT_UD, IV_WR_RDMA_READ),
    ] {
        let p = Pair::new(Topo::TwoHca, qpt, Conn::default());
        let s = [p.ma.sge(0, 8)];
        p.a.post(
            &p.qa,
            &SendWr {
                sges: &s,
                remote_addr: p.mb.addr,
                rkey: p.mb.lkey,
                ud: Some((1, p.qb.qpn, 0x1111_1111)),
                ..signaled(4, opcode)
            },
        );
        p.a.post(&p.qa, &signaled(5, IV_WR_SEND));
        assert_eq!(
            statuses(&p.cqa),
            [(4, IV_WC_LOC_QP_OP_ERR), (5, IV_WC_WR_FLUSH_ERR)],
            "type {qpt} opcode {opcode}"
        );
        assert_eq!(p.a.state(&p.qa), IV_QPS_SQE);
        // Posts in SQE are flushed too.
        p.a.post(&p.qa, &signaled(6, IV_WR_SEND));
        assert_eq!(statuses(&p.cqa), [(6, IV_WC_WR_FLUSH_ERR)]);
        // SQE -> RTS recovers.
        p.a.to_state(&p.qa, QpState::Sqe, QpState::Rts);
        assert_eq!(p.a.state(&p.qa), IV_QPS_RTS);
    }
}

#[test]
fn remote_access_errors() {
    for topo in TOPOS {
        type Case = fn(&Pair) -> (u8, u64, u32);
        let cases: [Case; 6] = [
            // No MR has this rkey.
            |p| (IV_WR_RDMA_WRITE, p.mb.addr, p.mb.lkey ^ 0x300),
            // Past the end of the MR.
            |p| (IV_WR_RDMA_WRITE, p.mb.addr + p.mb.len - 4, p.mb.lkey),
            // An MR without REMOTE_WRITE.
            |p| {
                let m = p.b.mem(4096, IV_ACCESS_LOCAL_WRITE | IV_ACCESS_REMOTE_READ);
                (IV_WR_RDMA_WRITE, m.addr, m.lkey)
            },
            // An MR without REMOTE_READ.
            |p| {
                let m =
                    p.b.mem(4096, IV_ACCESS_LOCAL_WRITE | IV_ACCESS_REMOTE_WRITE);
                (IV_WR_RDMA_READ, m.addr, m.lkey)
            },
            // An MR without REMOTE_ATOMIC.
            |p| {
                let m =
                    p.b.mem(4096, IV_ACCESS_LOCAL_WRITE | IV_ACCESS_REMOTE_WRITE);
                (IV_WR_ATOMIC_CMP_AND_SWP, m.addr, m.lkey)
            },
            // An MR of another PD.
            |p| {
                let other = p.b.d.pd();
                let m = p.b.mem_in(other, 4096, ALL_ACCESS);
                (IV_WR_RDMA_WRITE, m.addr, m.lkey)
            },
        ];
        for (i, case) in cases.iter().enumerate() {
            let p = Pair::new(topo, IV_QPT_RC, Conn::default());
            let (opcode, addr, rkey) = case(&p);
            let s = [p.ma.sge(0, 8)];
            p.a.post(
                &p.qa,
                &SendWr {
                    sges: &s,
                    remote_addr: addr,
                    rkey,
                    ..signaled(1, opcode)
                },
            );
            p.a.post(&p.qa, &signaled(2, IV_WR_SEND));
            p.settle();
            assert_eq!(
                statuses(&p.cqa),
                [(1, IV_WC_REM_ACCESS_ERR), (2, IV_WC_WR_FLUSH_ERR)],
                "{topo:?} case {i}"
            );
            assert_eq!(p.b.state(&p.qb), IV_QPS_ERR);
            assert_eq!(p.b.asyncs(), [AsyncEvent::QpAccessError(p.qb.qpn)]);
        }
    }
    // The responder QP's own access flags.
    for (access, opcode) in [
        (IV_ACCESS_REMOTE_READ, IV_WR_RDMA_WRITE),
        (IV_ACCESS_REMOTE_WRITE, IV_WR_RDMA_READ),
        (IV_ACCESS_REMOTE_WRITE, IV_WR_ATOMIC_FETCH_AND_ADD),
    ] {
        let p = Pair::new(
            Topo::TwoHca,
            IV_QPT_RC,
            Conn {
                access,
                ..Conn::default()
            },
        );
        let s = [p.ma.sge(0, 8)];
        p.send(&SendWr {
            sges: &s,
            remote_addr: p.mb.addr,
            rkey: p.mb.lkey,
            ..signaled(1, opcode)
        });
        assert_eq!(statuses(&p.cqa), [(1, IV_WC_REM_ACCESS_ERR)], "{opcode}");
        assert_eq!(p.b.asyncs(), [AsyncEvent::QpAccessError(p.qb.qpn)]);
    }
}

#[test]
fn remote_invalid_requests() {
    // No responder resources for READ / atomics.
    let p = Pair::new(
        Topo::TwoHca,
        IV_QPT_RC,
        Conn {
            rd_atomic: 0,
            ..Conn::default()
        },
    );
    let s = [p.ma.sge(0, 8)];
    p.send(&SendWr {
        sges: &s,
        remote_addr: p.mb.addr,
        rkey: p.mb.lkey,
        ..signaled(1, IV_WR_RDMA_READ)
    });
    assert_eq!(statuses(&p.cqa), [(1, IV_WC_REM_INV_REQ_ERR)]);
    assert_eq!(p.b.asyncs(), [AsyncEvent::QpRequestError(p.qb.qpn)]);
    assert_eq!(p.b.state(&p.qb), IV_QPS_ERR);

    // A misaligned atomic.
    let p = Pair::new(Topo::Loopback, IV_QPT_RC, Conn::default());
    let s = [p.ma.sge(0, 8)];
    p.send(&SendWr {
        sges: &s,
        remote_addr: p.mb.addr + 4,
        rkey: p.mb.lkey,
        ..signaled(2, IV_WR_ATOMIC_CMP_AND_SWP)
    });
    assert_eq!(statuses(&p.cqa), [(2, IV_WC_REM_INV_REQ_ERR)]);
    assert!(p.b.asyncs().contains(&AsyncEvent::QpRequestError(p.qb.qpn)));

    // SEND with invalidate of an rkey that names nothing.
    let p = Pair::new(Topo::TwoHca, IV_QPT_RC, Conn::default());
    p.recv(9, &[p.mb.sge(0, 64)]);
    p.send(&SendWr {
        inline: Some(b"x"),
        imm_or_inv: 0xFFFF_FF00,
        ..signaled(3, IV_WR_SEND_WITH_INV)
    });
    assert_eq!(statuses(&p.cqa), [(3, IV_WC_REM_INV_REQ_ERR)]);
    assert_eq!(statuses(&p.cqb), [(9, IV_WC_REM_INV_REQ_ERR)]);
}

#[test]
fn remote_operational_errors() {
    for topo in TOPOS {
        // The responder's receive SGE fails protection.
        let p = Pair::new(topo, IV_QPT_RC, Conn::default());
        p.recv(
            1,
            &[IvSge {
                lkey: 0xBAD00,
                ..p.mb.sge(0, 64)
            }],
        );
        p.send(&SendWr {
            inline: Some(b"hello"),
            ..signaled(1, IV_WR_SEND)
        });
        assert_eq!(statuses(&p.cqa), [(1, IV_WC_REM_OP_ERR)], "{topo:?}");
        assert_eq!(statuses(&p.cqb), [(1, IV_WC_LOC_PROT_ERR)]);
        assert_eq!(p.b.asyncs(), [AsyncEvent::QpFatal(p.qb.qpn)]);

        // A receive buffer without LOCAL_WRITE.
        let p = Pair::new(topo, IV_QPT_RC, Conn::default());
        let ro = p.b.mem(4096, IV_ACCESS_REMOTE_READ);
        p.recv(2, &[ro.sge(0, 64)]);
        p.send(&SendWr {
            inline: Some(b"hello"),
            ..signaled(2, IV_WR_SEND)
        });
        assert_eq!(statuses(&p.cqa), [(2, IV_WC_REM_OP_ERR)]);
        assert_eq!(statuses(&p.cqb), [(2, IV_WC_LOC_PROT_ERR)]);

        // A malformed receive WQE.
        let p = Pair::new(topo, IV_QPT_RC, Conn::default());
        post_recv_raw(
            &p.b,
            &p.qb,
            &IvRecvWqe {
                wr_id: 3,
                num_sge: 30,
                reserved: 0,
            },
            &[],
        );
        p.send(&SendWr {
            inline: Some(b"hello"),
            ..signaled(3, IV_WR_SEND)
        });
        assert_eq!(statuses(&p.cqa), [(3, IV_WC_REM_OP_ERR)]);
        assert_eq!(statuses(&p.cqb), [(3, IV_WC_LOC_QP_OP_ERR)]);
        assert_eq!(p.b.asyncs(), [AsyncEvent::QpFatal(p.qb.qpn)]);
    }
}

#[test]
fn rnr_retry_exceeded_at_once_with_rnr_retry_0() {
    for topo in TOPOS {
        let p = Pair::new(
            topo,
            IV_QPT_RC,
            Conn {
                rnr_retry: 0,
                ..Conn::default()
            },
        );
        p.a.post(
            &p.qa,
            &SendWr {
                inline: Some(b"a"),
                ..signaled(1, IV_WR_SEND)
            },
        );
        p.a.post(
            &p.qa,
            &SendWr {
                inline: Some(b"b"),
                ..signaled(2, IV_WR_SEND)
            },
        );
        p.settle();
        assert_eq!(
            statuses(&p.cqa),
            [(1, IV_WC_RNR_RETRY_EXC_ERR), (2, IV_WC_WR_FLUSH_ERR)],
            "{topo:?}"
        );
        assert_eq!(p.a.state(&p.qa), IV_QPS_ERR);
        assert_eq!(p.b.state(&p.qb), IV_QPS_RTS, "RNR is no responder error");
        assert!(p.b.d.hca.stats().rnr_naks >= 1);
    }
}

#[test]
fn rnr_retries_when_a_receive_is_posted() {
    for topo in TOPOS {
        let p = Pair::new(
            topo,
            IV_QPT_RC,
            Conn {
                rnr_retry: 2,
                ..Conn::default()
            },
        );
        p.send(&SendWr {
            inline: Some(b"first"),
            ..signaled(1, IV_WR_SEND)
        });
        p.send(&SendWr {
            inline: Some(b"second"),
            ..signaled(2, IV_WR_SEND)
        });
        assert!(p.cqa.poll().is_empty(), "waiting for the RNR timer");
        assert_eq!(p.a.state(&p.qa), IV_QPS_RTS);
        // One receive: the first message goes, the second gets RNR again.
        p.recv(10, &[p.mb.sge(0, 64)]);
        assert_eq!(statuses(&p.cqb), [(10, IV_WC_SUCCESS)], "{topo:?}");
        assert_eq!(p.mb.read(0, 5), b"first");
        assert_eq!(statuses(&p.cqa), [(1, IV_WC_SUCCESS)]);
        p.recv(11, &[p.mb.sge(100, 64)]);
        assert_eq!(statuses(&p.cqb), [(11, IV_WC_SUCCESS)]);
        assert_eq!(p.mb.read(100, 6), b"second");
        assert_eq!(statuses(&p.cqa), [(2, IV_WC_SUCCESS)]);
        assert_eq!(p.a.d.hca.stats().rnr_retries, 2, "one retry per message");

        // rnr_retry 2 is two retries; the third RNR fails the WQE.
        p.send(&SendWr {
            inline: Some(b"third"),
            ..signaled(3, IV_WR_SEND)
        });
        // Post receives that never match: an empty SRQ-less RQ retry hint
        // without a WQE (a receive for the wrong QP is not enough), so
        // force the retries through the RNR timer seam.
        for _ in 0..3 {
            let hca = &p.a.d.hca;
            hca.with_firmware(|fw| fw.rnr_timeout(p.qa.qpn));
            hca.sq_doorbell(p.qa.qpn);
            p.settle();
        }
        assert_eq!(statuses(&p.cqa), [(3, IV_WC_RNR_RETRY_EXC_ERR)], "{topo:?}");
    }
}

#[test]
fn modify_to_error_flushes_everything_exactly_once() {
    for topo in TOPOS {
        let (a, b, _f) = nodes(topo);
        let cq = a.cq(64);
        let qa = a.qp_full(a.pd, IV_QPT_RC, &cq, &cq, None, false, BIG);
        // Posted in RESET and INIT: kept.
        a.post(&qa, &signaled(1, IV_WR_SEND));
        a.init(&qa, &Conn::default());
        a.post(
            &qa,
            &SendWr {
                wr_id: 2,
                opcode: IV_WR_SEND,
                ..SendWr::default()
            },
        );
        let m = a.mem(4096, ALL_ACCESS);
        a.recv(&qa, 100, &[m.sge(0, 8)]);
        a.recv(&qa, 101, &[m.sge(8, 8)]);
        assert!(cq.poll().is_empty(), "nothing runs before RTS");
        a.to_state(&qa, QpState::Init, QpState::Err);
        let mut got = statuses(&cq);
        got.sort_unstable();
        assert_eq!(
            got,
            [
                (1, IV_WC_WR_FLUSH_ERR),
                (2, IV_WC_WR_FLUSH_ERR),
                (100, IV_WC_WR_FLUSH_ERR),
                (101, IV_WC_WR_FLUSH_ERR)
            ],
            "{topo:?}: unsignaled too"
        );
        // Posted after the QP entered ERR: flushed at once.
        a.post(&qa, &signaled(3, IV_WR_RDMA_WRITE));
        a.recv(&qa, 102, &[m.sge(0, 8)]);
        assert_eq!(
            statuses(&cq),
            [(3, IV_WC_WR_FLUSH_ERR), (102, IV_WC_WR_FLUSH_ERR)]
        );
        // Doorbells again: nothing twice.
        a.d.hca.sq_doorbell(qa.qpn);
        a.d.hca.rq_doorbell(qa.qpn);
        a.to_state(&qa, QpState::Err, QpState::Err);
        assert!(cq.poll().is_empty());
        drop(b);
    }
}

#[test]
fn error_flushes_wqes_in_flight_and_waiting_in_order() {
    let p = Pair::new(
        Topo::TwoHca,
        IV_QPT_RC,
        Conn {
            rnr_retry: 7,
            ..Conn::default()
        },
    );
    // Three SENDs stuck on RNR (in flight), then the QP is moved to ERR.
    for i in 1..=3 {
        p.a.post(
            &p.qa,
            &SendWr {
                inline: Some(b"x"),
                ..signaled(i, IV_WR_SEND)
            },
        );
    }
    p.a.post(
        &p.qa,
        &SendWr {
            wr_id: 4,
            opcode: IV_WR_SEND,
            ..SendWr::default()
        },
    );
    assert!(p.cqa.poll().is_empty());
    p.a.to_state(&p.qa, QpState::Rts, QpState::Err);
    assert_eq!(
        statuses(&p.cqa),
        [
            (1, IV_WC_WR_FLUSH_ERR),
            (2, IV_WC_WR_FLUSH_ERR),
            (3, IV_WC_WR_FLUSH_ERR),
            (4, IV_WC_WR_FLUSH_ERR)
        ]
    );
    // A receive posted to the responder now lets no retry through.
    p.recv(9, &[p.mb.sge(0, 8)]);
    assert!(p.cqa.poll().is_empty() && p.cqb.poll().is_empty());
}

#[test]
fn cq_overrun_raises_cq_error_and_stops_its_qps() {
    for topo in [Topo::Loopback, Topo::TwoHca] {
        let (a, b, _f) = nodes(topo);
        // A CQ of one entry shared by two QPs on `a`; the responders on `b`.
        let small = a.cq(1);
        let other = a.cq(16);
        let q1 = a.qp_full(a.pd, IV_QPT_RC, &small, &other, None, false, BIG);
        let q2 = a.qp_full(a.pd, IV_QPT_RC, &other, &small, None, false, BIG);
        let bcq = b.cq(16);
        let r1 = b.qp(IV_QPT_RC, &bcq);
        let r2 = b.qp(IV_QPT_RC, &bcq);
        let c = Conn::default();
        for (q, r) in [(&q1, &r1), (&q2, &r2)] {
            a.connect(q, b.gid(), r.qpn, &c);
            b.connect(r, a.gid(), q.qpn, &c);
        }
        let mb = b.mem(4096, ALL_ACCESS);
        let write = |wr_id| SendWr {
            inline: Some(b"x"),
            remote_addr: mb.addr,
            rkey: mb.lkey,
            ..signaled(wr_id, IV_WR_RDMA_WRITE)
        };
        a.post(&q1, &write(1));
        a.events();
        a.post(&q1, &write(2));
        assert_eq!(
            statuses(&small),
            [(1, IV_WC_SUCCESS)],
            "the second did not fit"
        );
        let ev = a.asyncs();
        assert_eq!(ev, [AsyncEvent::CqError(small.cqn)], "{topo:?}");
        assert_eq!(a.state(&q1), IV_QPS_ERR);
        assert_eq!(a.state(&q2), IV_QPS_ERR, "its receive CQ overran");
        assert!(a.d.hca.stats().cqes_lost >= 1);
        // Nothing more is written to the CQ in error.
        a.post(&q1, &write(3));
        assert!(small.poll().is_empty());
        // The other CQ still works: q2's flushed send.
        a.post(&q2, &write(4));
        assert_eq!(statuses(&other), [(4, IV_WC_WR_FLUSH_ERR)]);
    }
}

#[test]
fn responder_cq_overrun_is_a_remote_operational_error() {
    for topo in [Topo::Loopback, Topo::TwoHca] {
        let (a, b, _f) = nodes(topo);
        let acq = a.cq(16);
        let bcq = b.cq(1);
        let qa = a.qp(IV_QPT_RC, &acq);
        let qb = b.qp(IV_QPT_RC, &bcq);
        let c = Conn::default();
        a.connect(&qa, b.gid(), qb.qpn, &c);
        b.connect(&qb, a.gid(), qa.qpn, &c);
        let mb = b.mem(4096, ALL_ACCESS);
        b.recv(&qb, 1, &[mb.sge(0, 8)]);
        b.recv(&qb, 2, &[mb.sge(8, 8)]);
        a.post(
            &qa,
            &SendWr {
                inline: Some(b"1"),
                ..signaled(1, IV_WR_SEND)
            },
        );
        a.post(
            &qa,
            &SendWr {
                inline: Some(b"2"),
                ..signaled(2, IV_WR_SEND)
            },
        );
        assert_eq!(
            statuses(&acq),
            [(1, IV_WC_SUCCESS), (2, IV_WC_REM_OP_ERR)],
            "{topo:?}"
        );
        assert_eq!(statuses(&bcq), [(1, IV_WC_SUCCESS)]);
        assert!(b.asyncs().contains(&AsyncEvent::CqError(bcq.cqn)));
        assert_eq!(b.state(&qb), IV_QPS_ERR);
        assert_eq!(mb.read(8, 1), b"2", "the data had landed");
    }
}

#[test]
fn srq_shared_by_two_qps_with_its_limit_event() {
    for topo in TOPOS {
        let (a, b, _f) = nodes(topo);
        let (srqn, srq) = b.srq(15, 2, 3);
        let acq = a.cq(32);
        let bcq = b.cq(32);
        let c = Conn::default();
        let mut pairs = Vec::new();
        for _ in 0..2 {
            let qa = a.qp(IV_QPT_RC, &acq);
            let qb = b.qp_full(b.pd, IV_QPT_RC, &bcq, &bcq, Some(srqn), false, BIG);
            assert!(qb.rq.is_none());
            a.connect(&qa, b.gid(), qb.qpn, &c);
            b.connect(&qb, a.gid(), qa.qpn, &c);
            pairs.push((qa, qb));
        }
        let mb = b.mem(4096, ALL_ACCESS);
        for i in 0..5u64 {
            srq.post(i, &[mb.sge(i * 100, 100)]).unwrap();
        }
        b.d.hca.srq_doorbell(srqn);
        b.run();
        b.events();
        // Five WQEs, limit 3: the event when fewer than 3 are left.
        for (n, (qa, qb)) in [&pairs[0], &pairs[1], &pairs[0]].into_iter().enumerate() {
            a.post(
                qa,
                &SendWr {
                    inline: Some(&[n as u8; 5]),
                    ..signaled(n as u64, IV_WR_SEND)
                },
            );
            a.run();
            b.run();
            a.run();
            let r = one(&bcq);
            assert_eq!(
                (r.wr_id, r.qp_num),
                (n as u64, qb.qpn),
                "{topo:?}: in SRQ order"
            );
            let ev = b.asyncs();
            if n == 2 {
                assert_eq!(ev, [AsyncEvent::SrqLimitReached(srqn)], "{topo:?}");
            } else {
                assert!(ev.is_empty(), "{ev:?}");
            }
        }
        assert_eq!(mb.read(200, 5), [2; 5]);
        // Disarmed: no second event.
        a.post(&pairs[1].0, &signaled(9, IV_WR_SEND));
        a.run();
        b.run();
        a.run();
        one(&bcq);
        assert!(b.asyncs().is_empty());
        let CommandOut::SrqAttr(attr) = b.d.ok(Command::QuerySrq { srqn }) else {
            unreachable!()
        };
        assert_eq!(attr.srq_limit, 0, "the event disarms the limit");
        // A QP on the SRQ moving to ERR: last WQE reached, the SRQ's WQEs stay.
        b.to_state(&pairs[0].1, QpState::Rts, QpState::Err);
        assert_eq!(b.asyncs(), [AsyncEvent::LastWqeReached(pairs[0].1.qpn)]);
        assert!(bcq.poll().is_empty(), "nothing flushed from the SRQ");
        assert_eq!(srq.ring().consumer().filled(), Ok(1));
        // RNR on an empty SRQ, retried when the SRQ gets a WQE.
        let (qa, _) = &pairs[1];
        a.post(
            qa,
            &SendWr {
                inline: Some(b"late"),
                ..signaled(20, IV_WR_SEND)
            },
        );
        a.run();
        b.run();
        a.run();
        one(&bcq);
        a.post(
            qa,
            &SendWr {
                inline: Some(b"later"),
                ..signaled(21, IV_WR_SEND)
            },
        );
        a.run();
        b.run();
        a.run();
        acq.poll();
        assert!(bcq.poll().is_empty(), "RNR: the SRQ is empty");
        srq.post(30, &[mb.sge(1000, 100)]).unwrap();
        b.d.hca.srq_doorbell(srqn);
        for _ in 0..4 {
            b.run();
            a.run();
        }
        assert_eq!(one(&bcq).wr_id, 30, "{topo:?}");
        assert_eq!(mb.read(1000, 5), b"later");
        assert_eq!(statuses(&acq), [(21, IV_WC_SUCCESS)]);
    }
}

/// Each CQ's completion events go to the event queue of its completion
/// vector, and interrupt that vector only: the requester's CQ is on vector
/// 0, the responder's on vector 1 (loopback: of the same HCA).
#[test]
fn cq_events_go_to_their_vector_only() {
    for topo in TOPOS {
        let p = Pair::new(topo, IV_QPT_RC, Conn::default());
        p.a.events();
        p.b.events();
        for node in [&p.a, &p.b] {
            node.d.hca.arm_comp_event_queue(0);
            node.d.hca.arm_comp_event_queue(1);
        }
        let ints = |n: &Node| (n.d.bus.comp_interrupts(0), n.d.bus.comp_interrupts(1));
        let (a0, b0) = (ints(&p.a), ints(&p.b));
        for round in 0..3u64 {
            for (cq, node) in [(&p.cqa, &p.a), (&p.cqb, &p.b)] {
                cq.q.arm(false);
                node.d.hca.cq_arm_doorbell(cq.cqn);
            }
            p.recv(round, &[p.mb.sge(0, 64)]);
            p.send(&SendWr {
                inline: Some(b"v"),
                ..signaled(round, IV_WR_SEND)
            });
            p.settle();
            let mut seen = p.a.d.take_comp_events();
            if !Arc::ptr_eq(&p.a, &p.b) {
                seen.extend(p.b.d.take_comp_events());
            }
            seen.sort_by_key(|(v, _)| *v);
            assert_eq!(
                seen,
                [
                    (0, Event::Completion { cqn: p.cqa.cqn }),
                    (1, Event::Completion { cqn: p.cqb.cqn })
                ],
                "{topo:?}"
            );
            assert!(
                !p.a.events()
                    .into_iter()
                    .any(|e| matches!(e, Event::Completion { .. })),
                "{topo:?}: nothing on the async EQ"
            );
            assert_eq!(one(&p.cqa).status, IV_WC_SUCCESS);
            assert_eq!(one(&p.cqb).status, IV_WC_SUCCESS);
            for node in [&p.a, &p.b] {
                node.d.hca.arm_comp_event_queue(0);
                node.d.hca.arm_comp_event_queue(1);
            }
        }
        // Each vector interrupted once a round, on its own HCA.
        let (a1, b1) = (ints(&p.a), ints(&p.b));
        if Arc::ptr_eq(&p.a, &p.b) {
            assert_eq!((a1.0 - a0.0, a1.1 - a0.1), (3, 3), "{topo:?}");
        } else {
            assert_eq!((a1.0 - a0.0, a1.1 - a0.1), (3, 0), "{topo:?}");
            assert_eq!((b1.0 - b0.0, b1.1 - b0.1), (0, 3), "{topo:?}");
            // Each vector's queue held only its own CQ's events.
            let high = |n: &Node| n.d.hca.stats().comp_eq_high_water;
            assert_eq!(high(&p.a)[..2], [1, 0], "{topo:?}");
            assert_eq!(high(&p.b)[..2], [0, 1], "{topo:?}");
        }
    }
}

#[test]
fn cq_events_next_and_solicited() {
    for topo in TOPOS {
        let p = Pair::new(topo, IV_QPT_RC, Conn::default());
        let armed = |cq: &Cq, solicited: bool, node: &Node| {
            cq.q.arm(solicited);
            node.d.hca.cq_arm_doorbell(cq.cqn);
        };
        let completion_events = |node: &Node, cqn: u32| {
            node.events()
                .into_iter()
                .filter(|e| *e == Event::Completion { cqn })
                .count()
        };
        // Not armed: no event.
        p.recv(1, &[p.mb.sge(0, 64)]);
        p.send(&SendWr {
            inline: Some(b"a"),
            ..signaled(1, IV_WR_SEND)
        });
        assert_eq!(completion_events(&p.b, p.cqb.cqn), 0);
        // Armed with a completion unpolled: fires at once.
        armed(&p.cqb, false, &p.b);
        assert_eq!(completion_events(&p.b, p.cqb.cqn), 1, "{topo:?}");
        p.cqb.poll();
        p.cqa.poll();
        // Armed for the next one: exactly one event for two completions.
        armed(&p.cqb, false, &p.b);
        assert_eq!(completion_events(&p.b, p.cqb.cqn), 0);
        for i in 0..2 {
            p.recv(i, &[p.mb.sge(0, 64)]);
            p.send(&SendWr {
                inline: Some(b"b"),
                ..signaled(i, IV_WR_SEND)
            });
        }
        assert_eq!(completion_events(&p.b, p.cqb.cqn), 1);
        assert_eq!(p.cqb.poll().len(), 2);
        p.cqa.poll();
        // Solicited only: an unsolicited receive does not fire, a solicited one does.
        armed(&p.cqb, true, &p.b);
        p.recv(5, &[p.mb.sge(0, 64)]);
        p.send(&SendWr {
            inline: Some(b"c"),
            ..signaled(5, IV_WR_SEND)
        });
        assert_eq!(completion_events(&p.b, p.cqb.cqn), 0, "not solicited");
        p.recv(6, &[p.mb.sge(0, 64)]);
        p.send(&SendWr {
            inline: Some(b"d"),
            flags: IV_SEND_SIGNALED | IV_SEND_SOLICITED,
            ..signaled(6, IV_WR_SEND)
        });
        assert_eq!(completion_events(&p.b, p.cqb.cqn), 1, "solicited");
        // Arming solicited-only with only unsolicited CQEs unpolled: no event.
        p.cqb.poll();
        p.recv(7, &[p.mb.sge(0, 64)]);
        p.send(&SendWr {
            inline: Some(b"e"),
            ..signaled(7, IV_WR_SEND)
        });
        armed(&p.cqb, true, &p.b);
        assert_eq!(completion_events(&p.b, p.cqb.cqn), 0);
        // ...but with an unpolled solicited one it fires.
        p.recv(8, &[p.mb.sge(0, 64)]);
        p.send(&SendWr {
            inline: Some(b"f"),
            flags: IV_SEND_SOLICITED,
            ..signaled(8, IV_WR_SEND)
        });
        assert_eq!(completion_events(&p.b, p.cqb.cqn), 1);
        armed(&p.cqb, true, &p.b);
        assert_eq!(completion_events(&p.b, p.cqb.cqn), 1, "fires at once");
        p.cqb.poll();
        // Errors qualify for solicited-only.
        armed(&p.cqa, true, &p.a);
        p.send(&SendWr {
            inline: Some(b"g"),
            remote_addr: 0,
            rkey: 0,
            ..signaled(9, IV_WR_RDMA_WRITE)
        });
        assert_eq!(completion_events(&p.a, p.cqa.cqn), 1, "{topo:?}: an error");
        // The event interrupts its vector when that vector's EQ is armed.
        assert_eq!(p.b.state(&p.qb), IV_QPS_ERR);
        p.b.events();
        let before = p.b.d.bus.comp_interrupts(1);
        p.b.d.hca.arm_comp_event_queue(1);
        armed(&p.cqb, false, &p.b);
        assert_eq!(p.b.d.bus.comp_interrupts(1), before);
        p.recv(10, &[p.mb.sge(0, 8)]);
        assert_eq!(p.b.d.bus.comp_interrupts(1), before + 1, "{topo:?}");
        assert_eq!(completion_events(&p.b, p.cqb.cqn), 1);
    }
}

#[test]
fn comm_established_on_the_first_packet_in_rtr() {
    let (a, b, _f) = nodes(Topo::TwoHca);
    let acq = a.cq(8);
    let bcq = b.cq(8);
    let qa = a.qp(IV_QPT_RC, &acq);
    let qb = b.qp(IV_QPT_RC, &bcq);
    let c = Conn::default();
    a.connect(&qa, b.gid(), qb.qpn, &c);
    b.init(&qb, &c);
    b.rtr(&qb, a.gid(), qa.qpn, &c);
    b.events();
    let mb = b.mem(4096, ALL_ACCESS);
    b.recv(&qb, 1, &[mb.sge(0, 8)]);
    b.recv(&qb, 2, &[mb.sge(0, 8)]);
    for i in 1..=2 {
        a.post(
            &qa,
            &SendWr {
                inline: Some(b"hi"),
                ..signaled(i, IV_WR_SEND)
            },
        );
    }
    assert_eq!(
        statuses(&bcq),
        [(1, IV_WC_SUCCESS), (2, IV_WC_SUCCESS)],
        "RTR receives"
    );
    assert_eq!(b.asyncs(), [AsyncEvent::CommEstablished(qb.qpn)], "once");
    // The ACKs could not go back through a QP in RTR? They do: RTR
    // responds; the requester got its completions.
    assert_eq!(statuses(&acq), [(1, IV_WC_SUCCESS), (2, IV_WC_SUCCESS)]);
    b.rts(&qb, &c);
    b.recv(&qb, 3, &[mb.sge(0, 8)]);
    a.post(&qa, &signaled(3, IV_WR_SEND));
    assert!(b.asyncs().is_empty(), "only in RTR");
}

#[test]
fn sq_drained_when_the_last_wqe_in_flight_completes() {
    for topo in TOPOS {
        let p = Pair::new(topo, IV_QPT_RC, Conn::default());
        // A SEND stuck on RNR is in flight.
        p.send(&SendWr {
            inline: Some(b"x"),
            ..signaled(1, IV_WR_SEND)
        });
        let attr = IvQpAttr {
            qp_state: IV_QPS_SQD,
            en_sqd_async_notify: 1,
            ..IvQpAttr::default()
        };
        p.a.modify(
            p.qa.qpn,
            QpState::Rts,
            IV_QP_STATE | IV_QP_EN_SQD_ASYNC_NOTIFY,
            attr,
        );
        let CommandOut::QpAttr(q) = p.a.d.ok(Command::QueryQp { qpn: p.qa.qpn }) else {
            unreachable!()
        };
        assert_eq!((q.attr.qp_state, q.attr.sq_draining), (IV_QPS_SQD, 1));
        assert!(p.a.asyncs().is_empty(), "{topo:?}: still in flight");
        // New WQEs wait in SQD.
        p.a.post(
            &p.qa,
            &SendWr {
                inline: Some(b"y"),
                ..signaled(2, IV_WR_SEND)
            },
        );
        p.recv(10, &[p.mb.sge(0, 8)]);
        p.settle();
        assert_eq!(statuses(&p.cqa), [(1, IV_WC_SUCCESS)]);
        assert_eq!(p.a.asyncs(), [AsyncEvent::SqDrained(p.qa.qpn)], "{topo:?}");
        p.recv(11, &[p.mb.sge(8, 8)]);
        assert!(p.cqa.poll().is_empty(), "WQE 2 waits in SQD");
        p.a.to_state(&p.qa, QpState::Sqd, QpState::Rts);
        p.settle();
        assert_eq!(statuses(&p.cqa), [(2, IV_WC_SUCCESS)]);
        assert_eq!(p.mb.read(8, 1), b"y");
    }
}

#[test]
fn uc_sends_and_writes_and_drops_what_rc_would_nak() {
    for topo in TOPOS {
        let p = Pair::new(topo, IV_QPT_UC, Conn::default());
        let (ma, mb) = (&p.ma, &p.mb);
        // A multi-packet SEND and a WRITE with immediate.
        let data = pattern(5000, 7);
        ma.write(0, &data);
        p.recv(1, &[mb.sge(0, 8192)]);
        let s = [ma.sge(0, 5000)];
        p.send(&SendWr {
            sges: &s,
            ..signaled(1, IV_WR_SEND)
        });
        assert_eq!(statuses(&p.cqa), [(1, IV_WC_SUCCESS)], "{topo:?}");
        let r = one(&p.cqb);
        assert_eq!((r.wr_id, r.byte_len), (1, 5000));
        assert_eq!(mb.read(0, 5000), data);
        p.recv(2, &[mb.sge(0, 8)]);
        p.send(&SendWr {
            sges: &s,
            remote_addr: mb.addr + 10_000,
            rkey: mb.lkey,
            imm_or_inv: 5,
            ..signaled(2, IV_WR_RDMA_WRITE_WITH_IMM)
        });
        assert_eq!(statuses(&p.cqa), [(2, IV_WC_SUCCESS)]);
        let r = one(&p.cqb);
        assert_eq!(
            (r.opcode, r.byte_len, r.imm_or_inv),
            (IV_WC_OP_RECV_RDMA_WITH_IMM, 5000, 5)
        );
        assert_eq!(mb.read(10_000, 5000), data);

        // No receive WQE: the message is dropped; the sender completes.
        p.send(&SendWr {
            inline: Some(b"lost"),
            ..signaled(3, IV_WR_SEND)
        });
        assert_eq!(statuses(&p.cqa), [(3, IV_WC_SUCCESS)]);
        // A bad rkey: dropped too.
        p.send(&SendWr {
            inline: Some(b"lost"),
            remote_addr: mb.addr,
            rkey: 0,
            ..signaled(4, IV_WR_RDMA_WRITE)
        });
        assert_eq!(statuses(&p.cqa), [(4, IV_WC_SUCCESS)]);
        // A receive too small: dropped, the WQE stays for the next one.
        p.recv(5, &[mb.sge(0, 4)]);
        p.send(&SendWr {
            inline: Some(b"too long"),
            ..signaled(5, IV_WR_SEND)
        });
        p.send(&SendWr {
            inline: Some(b"fits"),
            ..signaled(6, IV_WR_SEND)
        });
        assert_eq!(statuses(&p.cqa), [(5, IV_WC_SUCCESS), (6, IV_WC_SUCCESS)]);
        let r = one(&p.cqb);
        assert_eq!((r.wr_id, r.status, r.byte_len), (5, IV_WC_SUCCESS, 4));
        assert_eq!(mb.read(0, 4), b"fits");
        assert_eq!(p.b.state(&p.qb), IV_QPS_RTS, "{topo:?}");
        assert!(p.b.d.hca.stats().packets_dropped >= 3);
        assert!(p.b.asyncs().is_empty());
    }
}

pub(crate) fn ah(node: &Node, pdn: u32, dgid: [u8; 16]) -> u32 {
    let CommandOut::Ah { ahn } = node.d.ok(Command::CreateAh(irpverbs_core::CreateAh {
        pdn,
        attr: IvAhAttr {
            dgid,
            is_global: 1,
            port_num: 1,
            hop_limit: 64,
            traffic_class: 0x28,
            ..IvAhAttr::default()
        },
    })) else {
        unreachable!()
    };
    ahn
}

#[test]
fn ud_datagrams() {
    for topo in TOPOS {
        let p = Pair::new(topo, IV_QPT_UD, Conn::default());
        let (ma, mb) = (&p.ma, &p.mb);
        let ahn = ah(&p.a, p.a.pd, p.b.gid());
        let qkey = Conn::default().qkey;
        let ud = |qkey| Some((ahn, p.qb.qpn, qkey));

        ma.write(0, &pattern(1024, 3));
        p.recv(1, &[mb.sge(0, 40), mb.sge(1000, 2000)]);
        let s = [ma.sge(0, 1024)];
        p.send(&SendWr {
            sges: &s,
            ud: ud(qkey),
            imm_or_inv: 0x0102_0304,
            ..signaled(1, IV_WR_SEND_WITH_IMM)
        });
        assert_eq!(statuses(&p.cqa), [(1, IV_WC_SUCCESS)], "{topo:?}");
        let r = one(&p.cqb);
        assert_eq!(
            (
                r.wr_id,
                r.opcode,
                r.byte_len,
                r.src_qp,
                r.wc_flags,
                r.imm_or_inv
            ),
            (
                1,
                IV_WC_OP_RECV,
                40 + 1024,
                p.qa.qpn,
                IV_WC_GRH | IV_WC_WITH_IMM,
                0x0102_0304
            )
        );
        assert_eq!(mb.read(1000, 1024), pattern(1024, 3));
        let grh = mb.read(0, 40);
        assert_eq!(
            &grh[..20],
            &[0; 20],
            "IPv4: the header in the last 20 bytes"
        );
        assert_eq!(grh[20], 0x45);
        assert_eq!(grh[21], 0x28, "traffic class");
        assert_eq!(&grh[32..36], &p.a.gid()[12..], "source address");
        assert_eq!(&grh[36..40], &p.b.gid()[12..], "destination address");

        // The wrong Q_Key: dropped. A controlled Q_Key: the QP's own.
        p.recv(2, &[mb.sge(0, 2048)]);
        p.send(&SendWr {
            inline: Some(b"no"),
            ud: ud(0x1234),
            ..signaled(2, IV_WR_SEND)
        });
        assert_eq!(statuses(&p.cqa), [(2, IV_WC_SUCCESS)]);
        assert!(p.cqb.poll().is_empty());
        p.send(&SendWr {
            inline: Some(b"yes"),
            ud: ud(0x8000_0000),
            ..signaled(3, IV_WR_SEND)
        });
        assert_eq!(statuses(&p.cqa), [(3, IV_WC_SUCCESS)]);
        assert_eq!(one(&p.cqb).byte_len, 43);
        assert_eq!(mb.read(40, 3), b"yes");

        // To a QP that does not exist, or with no receive posted: dropped.
        p.send(&SendWr {
            inline: Some(b"x"),
            ud: Some((ahn, 0xAB_CDEF, qkey)),
            ..signaled(4, IV_WR_SEND)
        });
        p.send(&SendWr {
            inline: Some(b"x"),
            ud: ud(qkey),
            ..signaled(5, IV_WR_SEND)
        });
        assert_eq!(statuses(&p.cqa), [(4, IV_WC_SUCCESS), (5, IV_WC_SUCCESS)]);
        assert!(p.cqb.poll().is_empty());

        // A receive too small for GRH + payload: LOC_LEN_ERR, the QP stops.
        p.recv(6, &[mb.sge(0, 41)]);
        p.send(&SendWr {
            inline: Some(b"xy"),
            ud: ud(qkey),
            ..signaled(6, IV_WR_SEND)
        });
        assert_eq!(statuses(&p.cqb), [(6, IV_WC_LOC_LEN_ERR)], "{topo:?}");
        assert_eq!(p.b.state(&p.qb), IV_QPS_ERR);
        assert_eq!(
            statuses(&p.cqa),
            [(6, IV_WC_SUCCESS)],
            "UD: the sender never knows"
        );

        // Over the MTU (the port's active MTU, 1024): LOC_LEN_ERR, SQE.
        let s = [ma.sge(0, 1025)];
        p.send(&SendWr {
            sges: &s,
            ud: ud(qkey),
            ..signaled(7, IV_WR_SEND)
        });
        assert_eq!(statuses(&p.cqa), [(7, IV_WC_LOC_LEN_ERR)]);
        assert_eq!(p.a.state(&p.qa), IV_QPS_SQE);
        p.a.to_state(&p.qa, QpState::Sqe, QpState::Rts);

        // An AH of another PD: LOC_PROT_ERR; no AH at all: LOC_QP_OP_ERR.
        let other = p.a.d.pd();
        let foreign = ah(&p.a, other, p.b.gid());
        p.send(&SendWr {
            inline: Some(b"x"),
            ud: Some((foreign, p.qb.qpn, qkey)),
            ..signaled(8, IV_WR_SEND)
        });
        assert_eq!(statuses(&p.cqa), [(8, IV_WC_LOC_PROT_ERR)]);
        p.a.to_state(&p.qa, QpState::Sqe, QpState::Rts);
        p.send(&SendWr {
            inline: Some(b"x"),
            ud: Some((999, p.qb.qpn, qkey)),
            ..signaled(9, IV_WR_SEND)
        });
        assert_eq!(statuses(&p.cqa), [(9, IV_WC_LOC_QP_OP_ERR)]);
    }
}

#[test]
fn ud_over_ipv6_gets_an_ipv6_grh() {
    let ip6 = |n| IpAddr::V6(core::net::Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, n));
    let a = Node::with(1, |c| c.ip = ip6(1));
    let b = Node::with(2, |c| c.ip = ip6(2));
    let f = Fabric::new(&TestPlatform);
    f.attach(&a.d.hca).unwrap();
    f.attach(&b.d.hca).unwrap();
    let acq = a.cq(8);
    let bcq = b.cq(8);
    let qa = a.qp(IV_QPT_UD, &acq);
    let qb = b.qp(IV_QPT_UD, &bcq);
    let c = Conn::default();
    a.connect(&qa, [0; 16], 0, &c);
    b.connect(&qb, [0; 16], 0, &c);
    let mb = b.mem(4096, ALL_ACCESS);
    b.recv(&qb, 1, &[mb.sge(0, 100)]);
    let ahn = ah(&a, a.pd, b.gid());
    a.post(
        &qa,
        &SendWr {
            inline: Some(b"six"),
            ud: Some((ahn, qb.qpn, c.qkey)),
            ..signaled(1, IV_WR_SEND)
        },
    );
    assert_eq!(one(&bcq).byte_len, 43);
    let grh = mb.read(0, 40);
    assert_eq!(grh[0] >> 4, 6);
    assert_eq!(grh[6], 17, "next header: UDP");
    assert_eq!(grh[7], 64, "hop limit");
    assert_eq!(&grh[8..24], &a.gid());
    assert_eq!(&grh[24..40], &b.gid());
    assert_eq!(mb.read(40, 3), b"six");
}

/// On the in-process fabric a port whose link is down receives nothing:
/// frames a peer (its own link up) puts in its inbox are dropped and
/// counted, not delivered; after up the next datagram arrives.
#[test]
fn a_down_port_drops_what_the_fabric_brings() {
    let a = Node::new(1);
    let b = Node::new(2);
    let f = Fabric::new(&TestPlatform);
    f.attach(&a.d.hca).unwrap();
    f.attach(&b.d.hca).unwrap();
    let (acq, bcq) = (a.cq(8), b.cq(8));
    let qa = a.qp(IV_QPT_UD, &acq);
    let qb = b.qp(IV_QPT_UD, &bcq);
    let c = Conn::default();
    a.connect(&qa, [0; 16], 0, &c);
    b.connect(&qb, [0; 16], 0, &c);
    let mb = b.mem(4096, ALL_ACCESS);
    b.recv(&qb, 1, &[mb.sge(0, 100)]);
    let ahn = ah(&a, a.pd, b.gid());
    let send = |id: u64| {
        a.post(
            &qa,
            &SendWr {
                inline: Some(b"down"),
                ud: Some((ahn, qb.qpn, c.qkey)),
                ..signaled(id, IV_WR_SEND)
            },
        );
        b.run();
        assert_eq!(one(&acq).status, IV_WC_SUCCESS, "the sender's port is up");
    };
    assert!(b.d.hca.set_port_link(false));
    let dropped = b.d.hca.stats().packets_dropped;
    send(1);
    assert!(bcq.poll().is_empty(), "a down port received a datagram");
    assert!(b.d.hca.stats().packets_dropped > dropped);
    assert!(b.d.hca.set_port_link(true));
    send(2);
    let wc = one(&bcq);
    assert_eq!((wc.wr_id, wc.status, wc.byte_len), (1, IV_WC_SUCCESS, 44));
}

/// Feeds `pkt` to `node`'s transport as if it came off the wire, then lets
/// the node deliver what it produced.
fn inject(node: &Node, pkt: Packet, payload: &[crate::wire::packet::Seg]) {
    node.d.hca.with_firmware(|fw| {
        fw.receive(&pkt, crate::wire::packet::Burst::one(pkt.opcode), payload);
        fw.flush_acks();
    });
    node.d.hca.sq_doorbell(0);
    node.run();
}

use crate::firmware::datapath::TrustStats;
use crate::wire::packet::{Aeth, Packet, aeth, op};

/// A requester QP on `a` whose packets reach a QP on `c` that stays in
/// INIT (and drops them, counted): its WQEs stay in flight until the test
/// answers for the responder.
struct Stuck {
    a: Node,
    c: Node,
    qa: Ep,
    qc: Ep,
    cqa: Cq,
    ma: Mem,
    _f: Arc<Fabric<TestPlatform>>,
}

impl Stuck {
    fn new(conn: Conn) -> Self {
        let a = Node::new(1);
        let c = Node::new(3);
        let f = Fabric::new(&TestPlatform);
        f.attach(&a.d.hca).unwrap();
        f.attach(&c.d.hca).unwrap();
        let cqa = a.cq(32);
        let ccq = c.cq(32);
        let qa = a.qp(IV_QPT_RC, &cqa);
        let qc = c.qp(IV_QPT_RC, &ccq);
        c.init(&qc, &conn);
        a.connect(&qa, c.gid(), qc.qpn, &conn);
        let ma = a.mem(1 << 16, ALL_ACCESS);
        Self {
            a,
            c,
            qa,
            qc,
            cqa,
            ma,
            _f: f,
        }
    }

    fn received(&self) -> u64 {
        self.c.d.hca.stats().packets_received
    }

    /// A response packet from the responder to the requester.
    fn response(&self, opcode: u8, psn: u32, syndrome: u8) -> Packet {
        Packet {
            opcode,
            dest_qpn: self.qa.qpn,
            psn,
            sgid: self.c.gid(),
            dgid: self.a.gid(),
            aeth: Aeth { syndrome, msn: 0 },
            ..Packet::default()
        }
    }

    fn answer(&self, pkt: Packet) {
        inject(&self.a, pkt, &[]);
    }
}

const PSN0: u32 = 0x10;
const ACK: u8 = aeth::ACK | aeth::ACK_UNLIMITED;

/// Responses that answer no request outstanding are dropped and counted
/// (`crate::transport::trust`): the WQEs stay in flight, the QP in RTS, and the
/// genuine answer still completes them.
#[test]
fn bad_responses_are_dropped_and_counted() {
    type Case = fn(&Stuck) -> (u8, Packet, fn(&TrustStats) -> u64);
    let cases: [Case; 8] = [
        // A READ response to a SEND.
        |s| {
            (
                IV_WR_SEND,
                s.response(op::RC_READ_RESPONSE_ONLY, PSN0, ACK),
                |t| t.response_opcode,
            )
        },
        // An atomic ACK to a READ.
        |s| {
            (
                IV_WR_RDMA_READ,
                s.response(op::RC_ATOMIC_ACKNOWLEDGE, PSN0, ACK),
                |t| t.response_opcode,
            )
        },
        // A READ response out of sequence (MIDDLE first).
        |s| {
            (
                IV_WR_RDMA_READ,
                s.response(op::RC_READ_RESPONSE_MIDDLE, PSN0, ACK),
                |t| t.response_malformed,
            )
        },
        // A reserved AETH type.
        |s| {
            (
                IV_WR_SEND,
                s.response(op::RC_ACKNOWLEDGE, PSN0, 0x40),
                |t| t.unknown_syndrome,
            )
        },
        // A NAK code IBTA does not define.
        |s| {
            (
                IV_WR_SEND,
                s.response(op::RC_ACKNOWLEDGE, PSN0, aeth::NAK | 0x1F),
                |t| t.unknown_syndrome,
            )
        },
        // An ACK past every PSN sent (it would complete both SENDs).
        |s| {
            (
                IV_WR_SEND,
                s.response(op::RC_ACKNOWLEDGE, PSN0 + 7, ACK),
                |t| t.response_psn_ahead,
            )
        },
        // An ACK half the PSN space ahead.
        |s| {
            (
                IV_WR_SEND,
                s.response(op::RC_ACKNOWLEDGE, (PSN0 + 0x7F_FFFF) & 0xFF_FFFF, ACK),
                |t| t.response_psn_ahead,
            )
        },
        // A remote access NAK for a PSN not sent.
        |s| {
            (
                IV_WR_SEND,
                s.response(
                    op::RC_ACKNOWLEDGE,
                    PSN0 + 2,
                    aeth::NAK | aeth::NAK_REM_ACCESS,
                ),
                |t| t.response_psn_ahead,
            )
        },
    ];
    for (i, case) in cases.iter().enumerate() {
        let s = Stuck::new(Conn::default());
        let (opcode, pkt, counter) = case(&s);
        let sges = [s.ma.sge(0, 8)];
        s.a.post(
            &s.qa,
            &SendWr {
                sges: &sges,
                remote_addr: 0x1000,
                rkey: 0x100,
                ..signaled(1, opcode)
            },
        );
        s.a.post(&s.qa, &signaled(2, IV_WR_SEND));
        assert!(s.cqa.poll().is_empty(), "case {i}: in flight");
        let before = s.a.d.hca.stats().untrusted;
        s.answer(pkt);
        assert_eq!(statuses(&s.cqa), [], "case {i}: nothing completes");
        assert_eq!(s.a.state(&s.qa), IV_QPS_RTS, "case {i}");
        let after = s.a.d.hca.stats().untrusted;
        assert_eq!(counter(&after), counter(&before) + 1, "case {i}: {after:?}");
        assert_eq!(after.total(), before.total() + 1, "case {i}");
        // The genuine answers complete both.
        if opcode == IV_WR_SEND {
            s.answer(s.response(op::RC_ACKNOWLEDGE, PSN0 + 1, ACK));
            assert_eq!(
                statuses(&s.cqa),
                [(1, IV_WC_SUCCESS), (2, IV_WC_SUCCESS)],
                "case {i}"
            );
        }
    }
}

/// A NAK IBTA defines acts only when its PSN is a request's in flight: a
/// remote access NAK before the oldest WQE (its WQE done) fails nothing.
#[test]
fn a_nak_for_a_psn_not_in_flight_is_dropped() {
    let s = Stuck::new(Conn::default());
    s.a.post(&s.qa, &signaled(1, IV_WR_SEND));
    s.answer(s.response(op::RC_ACKNOWLEDGE, PSN0, ACK));
    assert_eq!(statuses(&s.cqa), [(1, IV_WC_SUCCESS)]);
    s.a.post(&s.qa, &signaled(2, IV_WR_SEND));
    for code in [aeth::NAK | aeth::NAK_REM_ACCESS, aeth::RNR_NAK | 3] {
        s.answer(s.response(op::RC_ACKNOWLEDGE, PSN0, code));
    }
    assert_eq!(s.a.d.hca.stats().untrusted.nak_psn_invalid, 2);
    assert_eq!(s.a.state(&s.qa), IV_QPS_RTS);
    s.answer(s.response(op::RC_ACKNOWLEDGE, PSN0 + 1, ACK));
    assert_eq!(statuses(&s.cqa), [(2, IV_WC_SUCCESS)]);
}

/// A connected QP takes packets only from its peer's GID, to its own: a
/// SEND from a third GID with the right PSN, or to another GID, is dropped
/// and counted; the ACK the requester waits for likewise.
#[test]
fn a_connected_qp_believes_only_its_peer() {
    let s = Stuck::new(Conn::default());
    s.a.post(&s.qa, &signaled(1, IV_WR_SEND));
    let third = Node::new(5).gid();
    let mut forged = s.response(op::RC_ACKNOWLEDGE, PSN0, ACK);
    forged.sgid = third;
    s.answer(forged);
    let mut forged = s.response(op::RC_ACKNOWLEDGE, PSN0, ACK);
    forged.dgid = third;
    s.answer(forged);
    assert_eq!(statuses(&s.cqa), []);
    assert_eq!(s.a.d.hca.stats().untrusted.foreign_address, 2);
    // A request from a third GID at the responder's expected PSN.
    let (b, qb, bcq) = {
        let b = Node::new(7);
        let cq = b.cq(8);
        let q = b.qp(IV_QPT_RC, &cq);
        b.connect(&q, s.a.gid(), s.qa.qpn, &Conn::default());
        (b, q, cq)
    };
    let mb = b.mem(64, ALL_ACCESS);
    b.recv(&qb, 1, &[mb.sge(0, 64)]);
    let request = |sgid| Packet {
        opcode: op::RC_SEND_ONLY,
        dest_qpn: qb.qpn,
        psn: Conn::default().rq_psn,
        sgid,
        dgid: b.gid(),
        ..Packet::default()
    };
    inject(&b, request(third), &[]);
    assert!(bcq.poll().is_empty(), "a third host's SEND is dropped");
    assert_eq!(b.d.hca.stats().untrusted.foreign_address, 1);
    inject(&b, request(s.a.gid()), &[]);
    assert_eq!(bcq.poll().len(), 1, "the peer's is taken");
    // The genuine ACK completes the SEND.
    s.answer(s.response(op::RC_ACKNOWLEDGE, PSN0, ACK));
    assert_eq!(statuses(&s.cqa), [(1, IV_WC_SUCCESS)]);
}

/// Found by the host stress test (`driver/host/tests/stress.rs`, two HCAs,
/// firmware thread): a SEND got RNR-NAKed, the RNR retry re-sent it and the
/// READ after it, and the responder executed both; then a PSN sequence NAK
/// the responder had sent before the retry arrived and rewound the
/// requester to the SEND again. The READ response to the retried READ,
/// arriving while the SEND was being sent again, was taken for an answer to
/// the SEND: BAD_RESP_ERR, QP in ERR. It answers a request from before the
/// rewind: stale, dropped (everything from the SEND on is sent again and
/// answered again). Likewise for an atomic ACK.
#[test]
fn a_response_from_before_a_rewind_is_stale() {
    for second in [IV_WR_RDMA_READ, IV_WR_ATOMIC_FETCH_AND_ADD] {
        let s = Stuck::new(Conn::default());
        let read_to = [s.ma.sge(0, 8)];
        s.a.post(
            &s.qa,
            &SendWr {
                inline: Some(b"x"),
                ..signaled(1, IV_WR_SEND)
            },
        );
        s.a.post(
            &s.qa,
            &SendWr {
                sges: &read_to,
                remote_addr: 0x1000,
                rkey: 0x100,
                compare_add: 1,
                ..signaled(2, second)
            },
        );
        // RNR NAK for the SEND; the RNR timer fires: both are sent again.
        s.answer(s.response(op::RC_ACKNOWLEDGE, PSN0, aeth::RNR_NAK | 12));
        let before = s.received();
        s.a.d.hca.with_firmware(|fw| {
            let (qps, mut env) = fw.split();
            let qp = qps.get_mut(s.qa.qpn).unwrap();
            crate::transport::completer::rnr_timer_expired(s.qa.qpn, qp, &mut env);
        });
        s.a.d.hca.sq_doorbell(s.qa.qpn);
        s.a.run();
        assert_eq!(s.received() - before, 2, "SEND and {second} sent again");
        // The responder's stale sequence NAK (sent before it saw the retry)
        // is of the same episode: it starts no retry. Then the ACK timer
        // fires and the requester goes back to the SEND; the response to
        // the retried second request arrives after that: it predates the
        // rewind.
        let data = irpverbs_ring::Region::alloc(8).unwrap();
        data.write(0, &77u64.to_ne_bytes()).unwrap();
        let data = Shared::try_new(data).unwrap();
        let (resp, payload) = if second == IV_WR_RDMA_READ {
            let mut r = s.response(op::RC_READ_RESPONSE_ONLY, PSN0 + 1, ACK);
            r.payload_len = 8;
            (
                r,
                vec![crate::wire::packet::Seg {
                    region: data.clone(),
                    offset: 0,
                    len: 8,
                }],
            )
        } else {
            let mut r = s.response(op::RC_ATOMIC_ACKNOWLEDGE, PSN0 + 1, ACK);
            r.atomic_orig = 77;
            (r, vec![])
        };
        let nak = s.response(op::RC_ACKNOWLEDGE, PSN0, aeth::NAK | aeth::NAK_PSN_SEQ_ERR);
        let retries = s.a.d.hca.stats().retries;
        s.a.d.hca.with_firmware(|fw| {
            fw.receive(&nak, crate::wire::packet::Burst::one(nak.opcode), &[]);
        });
        assert_eq!(s.a.d.hca.stats().retries, retries, "a stale NAK");
        s.a.d.hca.with_firmware(|fw| {
            fw.retransmit_timeout(s.qa.qpn);
            fw.receive(
                &resp,
                crate::wire::packet::Burst::one(resp.opcode),
                &payload,
            );
        });
        s.a.d.hca.sq_doorbell(s.qa.qpn);
        s.a.run();
        assert_eq!(statuses(&s.cqa), [], "{second}: nothing completed");
        assert_eq!(s.a.state(&s.qa), IV_QPS_RTS, "{second}");
        assert_eq!(
            s.a.d.hca.stats().retries,
            retries + 1,
            "one retry: the timeout's"
        );
        // The answers to the requests sent again complete both.
        s.answer(s.response(op::RC_ACKNOWLEDGE, PSN0, ACK));
        inject(&s.a, resp, &payload);
        assert_eq!(
            statuses(&s.cqa),
            [(1, IV_WC_SUCCESS), (2, IV_WC_SUCCESS)],
            "{second}"
        );
        assert_eq!(s.ma.u64_at(0), 77);
    }
}

#[test]
fn acks_naks_and_retries_in_shape() {
    // Coalesced ACK: one ACK completes every WQE up to its PSN.
    let s = Stuck::new(Conn::default());
    for i in 0..3 {
        s.a.post(
            &s.qa,
            &SendWr {
                inline: Some(b"x"),
                ..signaled(i, IV_WR_SEND)
            },
        );
    }
    s.answer(s.response(op::RC_ACKNOWLEDGE, PSN0 + 1, ACK));
    assert_eq!(statuses(&s.cqa), [(0, IV_WC_SUCCESS), (1, IV_WC_SUCCESS)]);
    // A stale ACK changes nothing.
    s.answer(s.response(op::RC_ACKNOWLEDGE, PSN0, ACK));
    assert!(s.cqa.poll().is_empty());

    // PSN sequence error NAK: go back to that PSN, once per NAK.
    let before = s.received();
    s.answer(s.response(
        op::RC_ACKNOWLEDGE,
        PSN0 + 2,
        aeth::NAK | aeth::NAK_PSN_SEQ_ERR,
    ));
    assert_eq!(s.received() - before, 1, "WQE 2 sent again");
    assert_eq!(s.a.d.hca.stats().retries, 1);
    s.answer(s.response(op::RC_ACKNOWLEDGE, PSN0 + 2, ACK));
    assert_eq!(statuses(&s.cqa), [(2, IV_WC_SUCCESS)]);

    // Retries are counted: retry_cnt 1 allows one.
    let s = Stuck::new(Conn {
        retry_cnt: 1,
        ..Conn::default()
    });
    s.a.post(&s.qa, &signaled(1, IV_WR_SEND));
    let nak = s.response(op::RC_ACKNOWLEDGE, PSN0, aeth::NAK | aeth::NAK_PSN_SEQ_ERR);
    s.answer(nak);
    assert!(s.cqa.poll().is_empty());
    // The same NAK again, with no progress since: the same episode (a
    // duplicate, or one sent before the retry arrived), no retry.
    s.answer(nak);
    assert!(s.cqa.poll().is_empty());
    assert_eq!(s.a.d.hca.stats().retries, 1);
    s.a.d
        .hca
        .with_firmware(|fw| fw.retransmit_timeout(s.qa.qpn));
    s.a.run();
    assert_eq!(statuses(&s.cqa), [(1, IV_WC_RETRY_EXC_ERR)]);

    // An ACK past a READ whose responses never came: an implicit NAK, the
    // READ is asked again.
    let s = Stuck::new(Conn::default());
    let sges = [s.ma.sge(0, 8)];
    s.a.post(
        &s.qa,
        &SendWr {
            sges: &sges,
            remote_addr: 0x1000,
            rkey: 0x100,
            ..signaled(1, IV_WR_RDMA_READ)
        },
    );
    let before = s.received();
    s.answer(s.response(op::RC_ACKNOWLEDGE, PSN0, ACK));
    assert_eq!(s.received() - before, 1, "READ request again");
    assert!(s.cqa.poll().is_empty());

    // Remote NAKs complete with the matching status.
    for (code, status) in [
        (aeth::NAK_INVALID_REQ, IV_WC_REM_INV_REQ_ERR),
        (aeth::NAK_REM_ACCESS, IV_WC_REM_ACCESS_ERR),
        (aeth::NAK_REM_OP, IV_WC_REM_OP_ERR),
        (aeth::NAK_INVALID_RD_REQ, IV_WC_REM_INV_REQ_ERR),
    ] {
        let s = Stuck::new(Conn::default());
        s.a.post(&s.qa, &signaled(1, IV_WR_SEND));
        s.answer(s.response(op::RC_ACKNOWLEDGE, PSN0, aeth::NAK | code));
        assert_eq!(statuses(&s.cqa), [(1, status)], "NAK {code}");
        assert!(
            s.a.asyncs().is_empty(),
            "requester errors are in the CQE only"
        );
    }
    let _ = Stuck::new(Conn::default()).qc.qpn;
}

#[test]
fn responder_psn_checks_and_duplicates() {
    for topo in [Topo::Loopback, Topo::TwoHca] {
        let p = Pair::new(topo, IV_QPT_RC, Conn::default());
        let (ma, mb) = (&p.ma, &p.mb);
        let request = |opcode, psn| Packet {
            opcode,
            dest_qpn: p.qb.qpn,
            psn,
            sgid: p.a.gid(),
            dgid: p.b.gid(),
            ..Packet::default()
        };
        let sent = |n: &Node| n.d.hca.stats().packets_sent;

        // A SEND, then the same packet again: ACKed again, not executed.
        p.recv(1, &[mb.sge(0, 8)]);
        p.recv(2, &[mb.sge(8, 8)]);
        p.send(&signaled(1, IV_WR_SEND));
        assert_eq!(one(&p.cqb).wr_id, 1);
        one(&p.cqa);
        let b0 = sent(&p.b);
        inject(&p.b, request(op::RC_SEND_ONLY, PSN0), &[]);
        assert_eq!(sent(&p.b) - b0, 1, "{topo:?}: one ACK");
        assert!(p.cqb.poll().is_empty(), "the duplicate used no receive");
        assert!(p.cqa.poll().is_empty(), "a stale ACK for the requester");

        // Ahead of the expected PSN: one NAK, then silence until in order.
        let b0 = sent(&p.b);
        inject(&p.b, request(op::RC_SEND_ONLY, PSN0 + 5), &[]);
        inject(&p.b, request(op::RC_SEND_ONLY, PSN0 + 6), &[]);
        assert_eq!(sent(&p.b) - b0, 1, "one PSN sequence error NAK");
        assert_eq!(p.b.state(&p.qb), IV_QPS_RTS);
        p.send(&signaled(2, IV_WR_SEND));
        assert_eq!(one(&p.cqb).wr_id, 2, "the expected PSN still works");
        one(&p.cqa);

        // A duplicate READ is executed again from its responder resource.
        mb.write(100, &pattern(3000, 5));
        let s = [ma.sge(0, 3000)];
        p.send(&SendWr {
            sges: &s,
            remote_addr: mb.addr + 100,
            rkey: mb.lkey,
            ..signaled(3, IV_WR_RDMA_READ)
        });
        one(&p.cqa);
        let read_psn = PSN0 + 2;
        let mut dup = request(op::RC_READ_REQUEST, read_psn);
        dup.reth = crate::wire::packet::Reth {
            va: mb.addr + 100,
            rkey: mb.lkey,
            len: 3000,
        };
        let b0 = sent(&p.b);
        inject(&p.b, dup, &[]);
        assert_eq!(sent(&p.b) - b0, 3, "{topo:?}: three responses again");
        assert!(p.cqa.poll().is_empty(), "stale responses are dropped");

        // A duplicate atomic returns the saved result without running twice.
        mb.write(4096, &100u64.to_ne_bytes());
        let s = [ma.sge(8000, 8)];
        p.send(&SendWr {
            sges: &s,
            remote_addr: mb.addr + 4096,
            rkey: mb.lkey,
            compare_add: 1,
            ..signaled(4, IV_WR_ATOMIC_FETCH_AND_ADD)
        });
        one(&p.cqa);
        assert_eq!(mb.u64_at(4096), 101);
        let atomic_psn = read_psn + 3;
        let mut dup = request(op::RC_FETCH_ADD, atomic_psn);
        dup.atomic = crate::wire::packet::AtomicEth {
            va: mb.addr + 4096,
            rkey: mb.lkey,
            swap_add: 1,
            compare: 0,
        };
        let b0 = sent(&p.b);
        inject(&p.b, dup, &[]);
        assert_eq!(sent(&p.b) - b0, 1);
        assert_eq!(mb.u64_at(4096), 101, "not added twice");
        // Still in order afterwards.
        p.recv(5, &[mb.sge(0, 8)]);
        p.send(&SendWr {
            inline: Some(b"end"),
            ..signaled(5, IV_WR_SEND)
        });
        assert_eq!(one(&p.cqb).wr_id, 5);
        assert_eq!(one(&p.cqa).status, IV_WC_SUCCESS);
    }
}

/// xorshift64*: a seeded, reproducible stream.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// Random bytes in a victim's send queue and receive queue (or SRQ), and
/// doorbells for objects that do not exist, between two HCAs (the packet
/// path) and within one (the fast path, from the doorbell or the engine):
/// memory nobody named stays as it was, and a healthy pair beside the
/// victim still works.
#[test]
fn garbage_from_the_ulp_stays_on_its_own_qp() {
    let runs = [
        (1u64, Topo::TwoHca, false),
        (2, Topo::TwoHca, true),
        (3, Topo::Loopback, false),
        (4, Topo::Loopback, true),
        (5, Topo::LoopbackDeferred, false),
        (0xDEAD_BEEF, Topo::LoopbackDeferred, true),
    ];
    for (seed, topo, on_srq) in runs {
        let mut rng = Rng(seed);
        let (a, b, _f) = nodes(topo);
        let settle = || {
            if topo == Topo::LoopbackDeferred {
                for _ in 0..100 {
                    if !a.d.hca.busy() {
                        break;
                    }
                    a.d.hca.run_firmware();
                }
            }
        };
        // A healthy pair, and a victim pair the ULP scribbles on (its
        // responder on an SRQ of its own when `on_srq`).
        let acq = a.cq(256);
        let bcq = b.cq(256);
        let c = Conn::default();
        let srq = on_srq.then(|| b.srq(63, 2, 4));
        let mk = |srqn: Option<u32>| {
            let qa = a.qp(IV_QPT_RC, &acq);
            let qb = b.qp_full(b.pd, IV_QPT_RC, &bcq, &bcq, srqn, false, BIG);
            a.connect(&qa, b.gid(), qb.qpn, &c);
            b.connect(&qb, a.gid(), qa.qpn, &c);
            (qa, qb)
        };
        let (good_a, good_b) = mk(None);
        let (bad_a, bad_b) = mk(srq.as_ref().map(|s| s.0));
        let ma = a.mem(4096, ALL_ACCESS);
        let mb = b.mem(4096, ALL_ACCESS);
        let guard = a.mem(4096, ALL_ACCESS);
        guard.write(0, &[0x5A; 4096]);
        for round in 0..200 {
            // Random WQE bytes, sometimes with plausible keys to tempt it.
            let ring = bad_a.sq.ring();
            let i = ring.producer_word().load(Ordering::Relaxed);
            let at = ring.slot_offset(i);
            let mut slot = rng.bytes(ring.stride() as usize);
            if round % 3 == 0 {
                slot[0x1C..0x20].copy_from_slice(&mb.lkey.to_ne_bytes());
                slot[0x4C..0x50].copy_from_slice(&guard.lkey.to_ne_bytes());
            }
            ring.region().write(at, &slot).unwrap();
            let next = match rng.next() % 8 {
                0 => rng.next() as u32,
                _ => i.wrapping_add(1),
            };
            ring.producer_word().store(next, Ordering::Release);
            a.d.hca.sq_doorbell(bad_a.qpn);
            // And the responder's receive ring (or SRQ).
            let rring = match &srq {
                Some((_, q)) => q.ring(),
                None => bad_b.rq.as_ref().unwrap().ring(),
            };
            let j = rring.producer_word().load(Ordering::Relaxed);
            let mut rslot = rng.bytes(rring.stride() as usize);
            if round % 3 == 1 {
                // A well-formed receive naming the guard's address with
                // another MR's key: refused, never a way into the guard.
                rslot[8..12].copy_from_slice(&1u32.to_ne_bytes());
                rslot[12..16].fill(0);
                rslot[16..24].copy_from_slice(&guard.addr.to_ne_bytes());
                rslot[24..28].copy_from_slice(&64u32.to_ne_bytes());
                rslot[28..32].copy_from_slice(&mb.lkey.to_ne_bytes());
            }
            rring.region().write(rring.slot_offset(j), &rslot).unwrap();
            rring
                .producer_word()
                .store(j.wrapping_add(1), Ordering::Release);
            match &srq {
                Some((srqn, _)) => b.d.hca.srq_doorbell(*srqn),
                None => b.d.hca.rq_doorbell(bad_b.qpn),
            }
            // Random doorbells for QPs, SRQs and CQs that don't exist.
            a.d.hca.sq_doorbell(rng.next() as u32);
            a.d.hca.rq_doorbell(rng.next() as u32);
            a.d.hca.srq_doorbell(rng.next() as u32);
            a.d.hca.cq_arm_doorbell(rng.next() as u32);
            settle();
        }
        assert_eq!(
            guard.read(0, 4096),
            [0x5A; 4096],
            "seed {seed}, {topo:?}: memory not touched"
        );
        // The healthy pair still works.
        acq.poll();
        bcq.poll();
        b.recv(&good_b, 1, &[mb.sge(0, 64)]);
        ma.write(0, b"still fine");
        let s = [ma.sge(0, 10)];
        a.post(
            &good_a,
            &SendWr {
                sges: &s,
                ..signaled(42, IV_WR_SEND)
            },
        );
        let got: Vec<(u64, u32, u32)> = bcq
            .poll()
            .iter()
            .map(|c| (c.wr_id, c.qp_num, c.status))
            .collect();
        assert_eq!(
            got,
            [(1, good_b.qpn, IV_WC_SUCCESS)],
            "seed {seed}, {topo:?}"
        );
        let got: Vec<(u64, u32)> = acq.poll().iter().map(|c| (c.wr_id, c.qp_num)).collect();
        assert_eq!(got, [(42, good_a.qpn)]);
        assert_eq!(mb.read(0, 10), b"still fine");
        assert_eq!(a.state(&good_a), IV_QPS_RTS);
        assert_eq!(b.state(&good_b), IV_QPS_RTS);
    }
}

#[test]
fn fuzz_the_wqe_reader() {
    // Random slots through the ring reader alone: never a panic, every
    // answer within the limits.
    let mut rng = Rng(7);
    for stride in [64u32, 128, 256, 1024] {
        let ring = Ring::alloc(8, stride).unwrap();
        let mut header = IvSendWqe::default();
        let mut sges = [IvSge::default(); 32];
        for _ in 0..2000 {
            let i = rng.next() as u32;
            ring.region()
                .write(ring.slot_offset(i), &rng.bytes(stride as usize))
                .unwrap();
            let max_sge = (rng.next() % 40) as u32;
            let max_inline = (rng.next() % 2000) as u32;
            if let Ok(n) = irpverbs_ring::wq::read_send_wqe_into(
                &ring,
                i,
                max_sge,
                max_inline,
                &mut header,
                &mut sges,
            ) {
                assert!(n <= max_sge as usize && n * 16 + 64 <= stride as usize);
                assert!(header.opcode <= IV_WR_ATOMIC_FETCH_AND_ADD);
            }
            let _ = irpverbs_ring::wq::read_recv_wqe_into(&ring, i, max_sge, &mut sges);
        }
    }
}

#[test]
fn reset_empties_the_work_queues_without_completions() {
    let p = Pair::new(Topo::TwoHca, IV_QPT_RC, Conn::default());
    // In flight (RNR) and waiting.
    for i in 0..3 {
        p.a.post(
            &p.qa,
            &SendWr {
                inline: Some(b"x"),
                ..signaled(i, IV_WR_SEND)
            },
        );
    }
    p.a.recv(&p.qa, 7, &[p.ma.sge(0, 8)]);
    p.a.to_state(&p.qa, QpState::Rts, QpState::Reset);
    assert!(p.cqa.poll().is_empty(), "RESET: no completions");
    let sq = p.qa.sq.ring();
    assert_eq!(sq.consumer().filled(), Ok(0), "the SQ is empty");
    assert_eq!(p.qa.rq.as_ref().unwrap().ring().consumer().filled(), Ok(0));
    // Connected again (with a fresh responder), it works from scratch.
    p.b.to_state(&p.qb, QpState::Rts, QpState::Reset);
    let c = Conn::default();
    p.a.connect(&p.qa, p.b.gid(), p.qb.qpn, &c);
    p.b.connect(&p.qb, p.a.gid(), p.qa.qpn, &c);
    p.recv(1, &[p.mb.sge(0, 8)]);
    p.send(&SendWr {
        inline: Some(b"again"),
        ..signaled(9, IV_WR_SEND)
    });
    assert_eq!(statuses(&p.cqa), [(9, IV_WC_SUCCESS)]);
    assert_eq!(statuses(&p.cqb), [(1, IV_WC_SUCCESS)]);
    assert_eq!(p.mb.read(0, 5), b"again");
}

#[test]
fn destroying_a_qp_stops_its_work() {
    // Deferred HCAs: the packet waits in the responder's inbox while the
    // requester QP is destroyed.
    let p = Pair::new(Topo::TwoHcaDeferred, IV_QPT_RC, Conn::default());
    p.b.recv(&p.qb, 1, &[p.mb.sge(0, 8)]);
    p.a.post(
        &p.qa,
        &SendWr {
            inline: Some(b"x"),
            ..signaled(1, IV_WR_SEND)
        },
    );
    p.a.d.ok(Command::DestroyQp { qpn: p.qa.qpn });
    let dropped = p.a.d.hca.stats().packets_dropped;
    p.settle();
    assert!(p.cqa.poll().is_empty(), "no completion for a destroyed QP");
    assert_eq!(one(&p.cqb).status, IV_WC_SUCCESS, "the message had left");
    assert!(
        p.a.d.hca.stats().packets_dropped > dropped,
        "its ACK was dropped"
    );
    // Doorbells for it are ignored.
    p.a.d.hca.sq_doorbell(p.qa.qpn);
    p.a.d.hca.rq_doorbell(p.qa.qpn);
    p.settle();
    // A new QP on the same CQ works.
    let qa2 = p.a.qp(IV_QPT_RC, &p.cqa);
    p.b.to_state(&p.qb, QpState::Rts, QpState::Reset);
    let c = Conn::default();
    p.a.connect(&qa2, p.b.gid(), p.qb.qpn, &c);
    p.b.connect(&p.qb, p.a.gid(), qa2.qpn, &c);
    p.b.recv(&p.qb, 2, &[p.mb.sge(0, 8)]);
    p.a.post(
        &qa2,
        &SendWr {
            inline: Some(b"y"),
            ..signaled(2, IV_WR_SEND)
        },
    );
    p.settle();
    assert_eq!(statuses(&p.cqa), [(2, IV_WC_SUCCESS)]);
    assert_eq!(statuses(&p.cqb), [(2, IV_WC_SUCCESS)]);
}

#[test]
fn unsignaled_wqes_retire_without_signaled_ones() {
    for topo in TOPOS {
        // A tiny send queue: only unsignaled WRITEs, never stuck full.
        let cap = IvQpCap {
            max_send_wr: 3,
            ..BIG
        };
        let p = Pair::with_caps(topo, IV_QPT_RC, Conn::default(), cap, false);
        for i in 0..40u64 {
            p.qa.sq
                .post(&SendWr {
                    wr_id: i,
                    opcode: IV_WR_RDMA_WRITE,
                    inline: Some(&[i as u8]),
                    remote_addr: p.mb.addr + i,
                    rkey: p.mb.lkey,
                    ..SendWr::default()
                })
                .unwrap_or_else(|e| panic!("{topo:?}: post {i}: {e:?}"));
            p.a.d.hca.sq_doorbell(p.qa.qpn);
            p.a.run();
            p.settle();
        }
        assert_eq!(p.mb.read(0, 40), (0..40u8).collect::<Vec<_>>());
        assert!(p.cqa.poll().is_empty());
        assert!(
            p.a.d.hca.stats().packets_sent < 40 + 40,
            "{topo:?}: not an ACK per WRITE"
        );
    }
}

#[test]
fn sq_drains_with_unsignaled_wqes_in_flight() {
    for topo in TOPOS {
        let p = Pair::new(topo, IV_QPT_RC, Conn::default());
        for i in 0..3u64 {
            p.a.post(
                &p.qa,
                &SendWr {
                    wr_id: i,
                    opcode: IV_WR_RDMA_WRITE,
                    inline: Some(b"z"),
                    remote_addr: p.mb.addr,
                    rkey: p.mb.lkey,
                    ..SendWr::default()
                },
            );
        }
        p.settle();
        assert_eq!(
            p.qa.sq.ring().consumer().filled(),
            Ok(3),
            "{topo:?}: no ACK asked yet"
        );
        let attr = IvQpAttr {
            qp_state: IV_QPS_SQD,
            en_sqd_async_notify: 1,
            ..IvQpAttr::default()
        };
        p.a.modify(
            p.qa.qpn,
            QpState::Rts,
            IV_QP_STATE | IV_QP_EN_SQD_ASYNC_NOTIFY,
            attr,
        );
        p.a.run();
        p.settle();
        assert_eq!(
            p.qa.sq.ring().consumer().filled(),
            Ok(0),
            "{topo:?}: drained"
        );
        assert_eq!(p.a.asyncs(), [AsyncEvent::SqDrained(p.qa.qpn)]);
        assert!(p.cqa.poll().is_empty(), "unsignaled");
    }
}

#[test]
fn reads_and_atomics_within_max_rd_atomic_and_fence() {
    for topo in TOPOS {
        let p = Pair::new(
            topo,
            IV_QPT_RC,
            Conn {
                rd_atomic: 1,
                ..Conn::default()
            },
        );
        p.mb.write(0, &pattern(4096, 1));
        let mut posted = Vec::new();
        for i in 0..4u64 {
            let s = [p.ma.sge(i * 1000, 1000)];
            p.qa.sq
                .post(&SendWr {
                    sges: &s,
                    remote_addr: p.mb.addr + i * 1000,
                    rkey: p.mb.lkey,
                    ..signaled(i, IV_WR_RDMA_READ)
                })
                .unwrap();
            posted.push(i);
        }
        // A fenced WRITE waits for the READs before it.
        p.qa.sq
            .post(&SendWr {
                inline: Some(b"fenced"),
                flags: IV_SEND_SIGNALED | IV_SEND_FENCE,
                remote_addr: p.mb.addr + 5000,
                rkey: p.mb.lkey,
                ..signaled(9, IV_WR_RDMA_WRITE)
            })
            .unwrap();
        p.a.d.hca.sq_doorbell(p.qa.qpn);
        p.a.run();
        p.settle();
        assert_eq!(
            statuses(&p.cqa),
            [(0, 0), (1, 0), (2, 0), (3, 0), (9, 0)],
            "{topo:?}"
        );
        assert_eq!(p.ma.read(0, 4000), pattern(4096, 1)[..4000]);
        assert_eq!(p.mb.read(5000, 6), b"fenced");
    }
}

#[test]
fn resize_keeps_unpolled_completions() {
    let p = Pair::new(Topo::Loopback, IV_QPT_RC, Conn::default());
    for i in 0..3 {
        p.send(&SendWr {
            inline: Some(b"w"),
            remote_addr: p.mb.addr,
            rkey: p.mb.lkey,
            ..signaled(i, IV_WR_RDMA_WRITE)
        });
    }
    let CommandOut::Cq { ring, cqe, .. } = p.a.d.ok(Command::ResizeCq {
        cqn: p.cqa.cqn,
        cqe: 200,
    }) else {
        unreachable!()
    };
    assert_eq!(cqe, 255);
    let cq = CompletionQueue::new(ring);
    let mut out = [IvCqe::default(); 8];
    assert_eq!(cq.poll(&mut out), Ok(3));
    assert_eq!([out[0].wr_id, out[1].wr_id, out[2].wr_id], [0, 1, 2]);
    // Too small for what it holds: refused.
    p.send(&SendWr {
        inline: Some(b"w"),
        remote_addr: p.mb.addr,
        rkey: p.mb.lkey,
        ..signaled(3, IV_WR_RDMA_WRITE)
    });
    p.send(&SendWr {
        inline: Some(b"w"),
        remote_addr: p.mb.addr,
        rkey: p.mb.lkey,
        ..signaled(4, IV_WR_RDMA_WRITE)
    });
    p.a.d.fails(
        Command::ResizeCq {
            cqn: p.cqa.cqn,
            cqe: 1,
        },
        STATUS_INVALID_PARAMETER,
    );
}

#[test]
fn threads_post_concurrently_between_two_hcas() {
    use core::sync::atomic::AtomicU64;
    use std::collections::BTreeMap;
    for execution in [Execution::Inline, Execution::Deferred] {
        let mk = |n| {
            Arc::new(Node::with(n, |c| {
                c.execution = execution;
            }))
        };
        let (a, b) = (mk(1), mk(2));
        let f = Fabric::new(&TestPlatform);
        f.attach(&a.d.hca).unwrap();
        f.attach(&b.d.hca).unwrap();
        // Shared CQs: one send CQ and one receive CQ per HCA.
        let cqs = [
            (Arc::new(a.cq(4095)), Arc::new(a.cq(4095))),
            (Arc::new(b.cq(4095)), Arc::new(b.cq(4095))),
        ];
        let n: u64 = 1500;
        let c = Conn::default();
        // Four flows: two A->B, two B->A.
        let mut flows = Vec::new();
        for k in 0..4usize {
            let (src, dst, si, di) = if k < 2 {
                (&a, &b, 0, 1)
            } else {
                (&b, &a, 1, 0)
            };
            let cap = IvQpCap {
                max_send_wr: 255,
                max_recv_wr: 2047,
                ..BIG
            };
            let q = src.qp_full(src.pd, IV_QPT_RC, &cqs[si].0, &cqs[si].1, None, false, cap);
            let r = dst.qp_full(dst.pd, IV_QPT_RC, &cqs[di].0, &cqs[di].1, None, false, cap);
            src.connect(&q, dst.gid(), r.qpn, &c);
            dst.connect(&r, src.gid(), q.qpn, &c);
            let m = dst.mem(n * 8, ALL_ACCESS);
            flows.push((
                src.clone(),
                dst.clone(),
                Arc::new(q),
                Arc::new(r),
                m,
                si,
                di,
            ));
        }
        // Completions by (HCA, QP): QP numbers repeat across HCAs.
        let counts: Arc<std::sync::Mutex<BTreeMap<(usize, u32), u64>>> = Arc::default();
        let stop = Arc::new(core::sync::atomic::AtomicBool::new(false));
        let polled = Arc::new(AtomicU64::new(0));
        std::thread::scope(|scope| {
            if execution == Execution::Deferred {
                for node in [a.clone(), b.clone()] {
                    let stop = stop.clone();
                    scope.spawn(move || {
                        while !stop.load(Ordering::SeqCst) {
                            if !node.d.hca.busy() {
                                std::thread::yield_now();
                            }
                            node.d.hca.run_firmware();
                        }
                    });
                }
            }
            let mut handles = Vec::new();
            for (src, dst, q, r, m, si, di) in &flows {
                let counts = counts.clone();
                let cqs = &cqs;
                let polled = polled.clone();
                handles.push(scope.spawn(move || {
                    let poll = |cq: &Cq, hca: usize| {
                        for c in cq.poll() {
                            assert_eq!(c.status, IV_WC_SUCCESS, "{c:?}");
                            *counts.lock().unwrap().entry((hca, c.qp_num)).or_default() += 1;
                            polled.fetch_add(1, Ordering::Relaxed);
                        }
                    };
                    for i in 0..n {
                        let rq = r.rq.as_ref().unwrap();
                        while rq.post(i, &[m.sge(i * 8, 8)]).is_err() {
                            poll(&cqs[*di].1, *di);
                        }
                        dst.d.hca.rq_doorbell(r.qpn);
                        let wr = SendWr {
                            wr_id: i,
                            opcode: IV_WR_SEND,
                            flags: if i % 50 == 49 || i + 1 == n {
                                IV_SEND_SIGNALED
                            } else {
                                0
                            },
                            inline: Some(&i.to_ne_bytes()),
                            ..SendWr::default()
                        };
                        while q.sq.post(&wr).is_err() {
                            poll(&cqs[*si].0, *si);
                            std::thread::yield_now();
                        }
                        src.d.hca.sq_doorbell(q.qpn);
                        if i % 16 == 0 {
                            poll(&cqs[*si].0, *si);
                            poll(&cqs[*di].1, *di);
                        }
                    }
                    // Wait for every receive and the last send completion.
                    let want_recv = n;
                    let want_send = n / 50 + u64::from(n % 50 != 0);
                    loop {
                        poll(&cqs[*si].0, *si);
                        poll(&cqs[*di].1, *di);
                        let c = counts.lock().unwrap();
                        let got_recv = c.get(&(*di, r.qpn)).copied().unwrap_or(0);
                        let got_send = c.get(&(*si, q.qpn)).copied().unwrap_or(0);
                        drop(c);
                        if got_recv == want_recv && got_send == want_send {
                            break;
                        }
                        std::thread::yield_now();
                    }
                }));
            }
            for h in handles {
                h.join().unwrap();
            }
            stop.store(true, Ordering::SeqCst);
        });
        // Every message landed, in order, in its own buffer.
        for (_, _, _, _, m, _, _) in &flows {
            for i in 0..n {
                assert_eq!(m.u64_at((i * 8) as usize), i, "{execution:?}");
            }
        }
        assert!(polled.load(Ordering::Relaxed) >= 4 * n);
    }
}

#[test]
fn responder_invalid_requests_from_the_wire() {
    // Packets no soft requester builds, as a peer on a wire could send them.
    type Case = fn(&Pair) -> Packet;
    let cases: [Case; 4] = [
        // A WRITE longer than max_msg_sz.
        |p| Packet {
            opcode: op::RC_WRITE_ONLY,
            reth: crate::wire::packet::Reth {
                va: p.mb.addr,
                rkey: p.mb.lkey,
                len: (1 << 31) + 1,
            },
            ..Packet::default()
        },
        // A MIDDLE without a FIRST.
        |_| Packet {
            opcode: op::RC_SEND_MIDDLE,
            ..Packet::default()
        },
        // A payload longer than the MTU in an ONLY packet.
        |_| Packet {
            opcode: op::RC_SEND_ONLY,
            payload_len: 4096,
            ..Packet::default()
        },
        // A WRITE whose payload differs from its RETH length.
        |p| Packet {
            opcode: op::RC_WRITE_ONLY,
            reth: crate::wire::packet::Reth {
                va: p.mb.addr,
                rkey: p.mb.lkey,
                len: 100,
            },
            payload_len: 10,
            ..Packet::default()
        },
    ];
    for (i, case) in cases.iter().enumerate() {
        let p = Pair::new(Topo::TwoHca, IV_QPT_RC, Conn::default());
        p.recv(1, &[p.mb.sge(0, 8192)]);
        let mut pkt = case(&p);
        pkt.dest_qpn = p.qb.qpn;
        pkt.psn = PSN0;
        pkt.sgid = p.a.gid();
        pkt.dgid = p.b.gid();
        let src = Shared::try_new(Region::alloc(8192).unwrap()).unwrap();
        let payload = [crate::wire::packet::Seg {
            region: src,
            offset: 0,
            len: pkt.payload_len as usize,
        }];
        let n = usize::from(pkt.payload_len > 0);
        inject(&p.b, pkt, &payload[..n]);
        assert_eq!(p.b.state(&p.qb), IV_QPS_ERR, "case {i}");
        let ev = p.b.asyncs();
        assert_eq!(ev, [AsyncEvent::QpRequestError(p.qb.qpn)], "case {i}");
    }
}

#[test]
fn an_impossible_producer_index_is_fatal_to_its_qp_only() {
    let p = Pair::new(Topo::Loopback, IV_QPT_RC, Conn::default());
    let ring = p.qa.sq.ring();
    let c = ring.consumer_word().load(Ordering::SeqCst);
    ring.producer_word()
        .store(c.wrapping_add(ring.entries() + 5), Ordering::SeqCst);
    p.a.d.hca.sq_doorbell(p.qa.qpn);
    assert_eq!(p.a.state(&p.qa), IV_QPS_ERR);
    assert!(p.a.asyncs().contains(&AsyncEvent::QpFatal(p.qa.qpn)));
    assert!(p.cqa.poll().is_empty(), "no completions for a broken ring");
    assert_eq!(p.b.state(&p.qb), IV_QPS_RTS);
    // The receive ring too.
    let rring = p.qb.rq.as_ref().unwrap().ring();
    rring.producer_word().store(1000, Ordering::SeqCst);
    inject(
        &p.b,
        Packet {
            opcode: op::RC_SEND_ONLY,
            dest_qpn: p.qb.qpn,
            psn: PSN0,
            sgid: p.a.gid(),
            dgid: p.b.gid(),
            ..Packet::default()
        },
        &[],
    );
    assert_eq!(p.b.state(&p.qb), IV_QPS_ERR);
    assert!(p.b.asyncs().contains(&AsyncEvent::QpFatal(p.qb.qpn)));
}

/// A work queue holds its reported depth, one less than its ring's slots:
/// a producer index that publishes every slot (one work request past the
/// depth, which the ULP's post refuses) is a corrupt ring, fatal to the
/// QP, and none of its work requests runs.
#[test]
fn a_producer_index_past_the_queue_depth_is_fatal() {
    let p = Pair::new(Topo::Loopback, IV_QPT_RC, Conn::default());
    let ring = p.qa.sq.ring();
    assert_eq!(ring.capacity(), ring.entries() - 1);
    let c = ring.consumer_word().load(Ordering::SeqCst);
    ring.producer_word()
        .store(c.wrapping_add(ring.entries()), Ordering::SeqCst);
    p.a.d.hca.sq_doorbell(p.qa.qpn);
    assert_eq!(p.a.state(&p.qa), IV_QPS_ERR);
    assert!(p.a.asyncs().contains(&AsyncEvent::QpFatal(p.qa.qpn)));
    assert!(p.cqa.poll().is_empty(), "no completions for a broken ring");
    assert_eq!(p.b.d.hca.stats().packets_received, 0, "nothing was sent");
    let rring = p.qb.rq.as_ref().unwrap().ring();
    let c = rring.consumer_word().load(Ordering::SeqCst);
    rring
        .producer_word()
        .store(c.wrapping_add(rring.entries()), Ordering::SeqCst);
    inject(
        &p.b,
        Packet {
            opcode: op::RC_SEND_ONLY,
            dest_qpn: p.qb.qpn,
            psn: PSN0,
            sgid: p.a.gid(),
            dgid: p.b.gid(),
            ..Packet::default()
        },
        &[],
    );
    assert_eq!(p.b.state(&p.qb), IV_QPS_ERR);
    assert!(p.b.asyncs().contains(&AsyncEvent::QpFatal(p.qb.qpn)));
    assert!(p.cqb.poll().is_empty(), "no receive completed");
}

#[test]
fn retransmit_timeout_seam() {
    let s = Stuck::new(Conn {
        retry_cnt: 2,
        ..Conn::default()
    });
    let sges = [s.ma.sge(0, 3000)];
    s.a.post(
        &s.qa,
        &SendWr {
            sges: &sges,
            ..signaled(1, IV_WR_SEND)
        },
    );
    let timeout = |s: &Stuck| {
        s.a.d
            .hca
            .with_firmware(|fw| fw.retransmit_timeout(s.qa.qpn));
        s.a.d.hca.sq_doorbell(s.qa.qpn);
    };
    let before = s.received();
    timeout(&s);
    assert_eq!(s.received() - before, 3, "the whole message again");
    timeout(&s);
    assert!(s.cqa.poll().is_empty());
    timeout(&s);
    assert_eq!(statuses(&s.cqa), [(1, IV_WC_RETRY_EXC_ERR)], "two retries");
    assert_eq!(s.a.d.hca.stats().retries, 2);
}

/// A call does at most its budget of work ([`crate::SoftConfig::dpc_budget`])
/// and requeues the rest ([`crate::SoftBus::resume`]); each
/// [`crate::SoftHca::resume`] does one more budget, and the QPs with work
/// take turns: two QPs with eight 64 KiB WRITEs each both make progress
/// before either is done, and nothing is lost.
#[test]
fn a_bounded_call_requeues_the_rest_and_the_qps_take_turns() {
    const BUDGET: u32 = 64;
    const WRS: u64 = 8;
    const LEN: u32 = 64 * 1024;
    let node = Node::with(1, |c| c.dpc_budget = BUDGET);
    let cq = node.cq(64);
    let eps: Vec<(Ep, Ep)> = (0..2)
        .map(|_| {
            let a = node.qp(IV_QPT_RC, &cq);
            let b = node.qp(IV_QPT_RC, &cq);
            let c = Conn::default();
            node.connect(&a, node.gid(), b.qpn, &c);
            node.connect(&b, node.gid(), a.qpn, &c);
            (a, b)
        })
        .collect();
    let mem = node.mem(1 << 20, ALL_ACCESS);
    for (i, (a, _)) in eps.iter().enumerate() {
        for k in 0..WRS {
            let wr = SendWr {
                wr_id: (i as u64) << 8 | k,
                opcode: IV_WR_RDMA_WRITE,
                flags: IV_SEND_SIGNALED,
                sges: &[mem.sge(k * u64::from(LEN), LEN)],
                remote_addr: mem.addr + (WRS + k) * u64::from(LEN) % (1 << 19),
                rkey: mem.lkey,
                ..SendWr::default()
            };
            a.sq.post(&wr).unwrap();
        }
    }
    let sent = |n: &Node| n.d.hca.stats().packets_sent;
    let before = sent(&node);
    node.d.hca.sq_doorbell(eps[0].0.qpn);
    node.d.hca.sq_doorbell(eps[1].0.qpn);
    let first = sent(&node) - before;
    assert!(node.d.bus.resumes() >= 1, "the rest was requeued");
    // The two doorbells: a budget each, and a step may cross it by one turn
    // of the requester (four 64 KiB WRITEs on the fast path).
    assert!(first <= 2 * (u64::from(BUDGET) + 4 * 64), "{first} packets");
    let mut done = [0u64; 2];
    let mut both_partly = false;
    let mut resumes = 0;
    while done != [WRS; 2] {
        for c in cq.poll() {
            assert_eq!(c.status, IV_WC_SUCCESS, "{c:?}");
            done[(c.wr_id >> 8) as usize] += 1;
        }
        both_partly |= done.iter().all(|&d| d > 0 && d < WRS);
        let requeued = node.d.bus.resumes();
        node.d.hca.resume();
        resumes += 1;
        assert!(resumes < 1000, "stuck at {done:?}");
        if done != [WRS; 2] {
            assert!(
                node.d.bus.resumes() > requeued || !node.d.hca.busy(),
                "lost work at {done:?}"
            );
        }
    }
    assert!(both_partly, "the QPs took turns");
    assert!(resumes >= 2, "{resumes} resumes");
    assert!(!node.d.hca.busy());
}

/// A platform clock under the test's hand: time moves only to the deadline
/// the transport armed the timer for.
#[derive(Default)]
pub(crate) struct ManualClock {
    now: core::sync::atomic::AtomicU64,
    armed: std::sync::Mutex<Option<u64>>,
}

impl crate::net::link::Clock for ManualClock {
    fn now_ns(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }

    fn arm(&self, deadline_ns: u64) {
        *self.armed.lock().unwrap() = Some(deadline_ns);
    }
}

impl ManualClock {
    pub(crate) fn attach(node: &Node) -> Arc<Self> {
        let clock = Arc::new(Self::default());
        node.d
            .hca
            .attach_clock(alloc::boxed::Box::new(Arc::clone(&clock)))
            .unwrap();
        clock
    }

    /// Moves time to the armed deadline and lets the timer fire; `false`
    /// when no timer is armed.
    fn fire(&self, node: &Node) -> bool {
        let Some(at) = self.armed.lock().unwrap().take() else {
            return false;
        };
        self.now.fetch_max(at, Ordering::SeqCst);
        node.d.hca.advance_clock(at);
        node.run();
        true
    }

    /// Fires timers until `cq` has a completion (at most `max` times):
    /// the completions and the time they took.
    pub(crate) fn until_completion(&self, node: &Node, cq: &Cq, max: usize) -> (Vec<IvCqe>, u64) {
        let start = self.now_ns_();
        for _ in 0..max {
            let got = cq.poll();
            if !got.is_empty() {
                return (got, self.now_ns_() - start);
            }
            if !self.fire(node) {
                break;
            }
        }
        (cq.poll(), self.now_ns_() - start)
    }

    fn now_ns_(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
}

/// With the platform's clock attached, an RC SEND to a QP that does not
/// exist (loopback: no wire) times out `retry_cnt` + 1 times, then
/// completes with RETRY_EXC_ERR, the rest flushed.
#[test]
fn a_send_to_a_missing_qp_ends_with_retry_exc_err_without_a_wire() {
    for retry_cnt in [0u8, 3, 7] {
        let a = Node::new(1);
        let clock = ManualClock::attach(&a);
        let cq = a.cq(8);
        let q = a.qp(IV_QPT_RC, &cq);
        let conn = Conn {
            retry_cnt,
            ..Conn::default()
        };
        a.connect(&q, a.gid(), 0x7777, &conn);
        a.post(&q, &signaled(1, IV_WR_SEND));
        a.post(&q, &signaled(2, IV_WR_SEND));
        let (got, took) = clock.until_completion(&a, &cq, 64);
        let got: Vec<_> = got.iter().map(|c| (c.wr_id, c.status)).collect();
        assert_eq!(
            got,
            [(1, IV_WC_RETRY_EXC_ERR), (2, IV_WC_WR_FLUSH_ERR)],
            "retry_cnt {retry_cnt}"
        );
        let t = crate::net::link::ack_timeout_ns(14).unwrap();
        assert_eq!(
            took,
            (u64::from(retry_cnt) + 1) * t,
            "retry_cnt {retry_cnt}"
        );
        assert_eq!(a.state(&q), IV_QPS_ERR);
        assert!(!clock.fire(&a), "no timer left armed");
    }
}

/// With the platform's clock attached, a SEND that meets RNR NAKs with
/// `rnr_retry` 0–6 completes RNR_RETRY_EXC_ERR after that many RNR waits;
/// with 7 it waits until a receive is posted, then succeeds.
#[test]
fn rnr_retries_end_without_a_wire() {
    for rnr_retry in 0u8..=7 {
        let a = Node::new(1);
        let clock = ManualClock::attach(&a);
        let cq = a.cq(8);
        let rcq = a.cq(8);
        let q = a.qp(IV_QPT_RC, &cq);
        let r = a.qp(IV_QPT_RC, &rcq);
        let conn = Conn {
            rnr_retry,
            ..Conn::default()
        };
        a.connect(&q, a.gid(), r.qpn, &conn);
        a.connect(&r, a.gid(), q.qpn, &conn);
        let before = a.d.hca.stats().rnr_naks;
        a.post(
            &q,
            &SendWr {
                inline: Some(b"hello"),
                ..signaled(1, IV_WR_SEND)
            },
        );
        let (got, took) = clock.until_completion(&a, &cq, 32);
        let rnr = crate::net::link::rnr_timer_ns(12);
        if rnr_retry < 7 {
            assert_eq!(got.len(), 1, "rnr_retry {rnr_retry}");
            assert_eq!(
                got[0].status, IV_WC_RNR_RETRY_EXC_ERR,
                "rnr_retry {rnr_retry}"
            );
            assert_eq!(took, u64::from(rnr_retry) * rnr, "rnr_retry {rnr_retry}");
            assert_eq!(a.d.hca.stats().rnr_naks - before, u64::from(rnr_retry) + 1);
            continue;
        }
        assert!(got.is_empty(), "rnr_retry 7 waits");
        assert!(a.d.hca.stats().rnr_naks - before >= 30);
        let m = a.mem(64, ALL_ACCESS);
        a.recv(&r, 9, &[m.sge(0, 64)]);
        let (got, _) = clock.until_completion(&a, &cq, 4);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].status, IV_WC_SUCCESS);
        assert_eq!(m.read(0, 5), b"hello");
        assert_eq!(one(&rcq).status, IV_WC_SUCCESS);
    }
}

/// An SRQ found in error (its producer index out of range) raises
/// SrqError; each QP that takes from it fails, goes to ERR with QpFatal,
/// and NAKs with a remote operational error: the senders complete
/// REM_OP_ERR — also one that was waiting on an RNR NAK from it (with the
/// platform's clock: its RNR timer ends the wait).
#[test]
fn an_srq_error_surfaces_to_the_senders() {
    let a = Node::new(1);
    let clock = ManualClock::attach(&a);
    let (srqn, _srq) = a.srq(16, 1, 0);
    let scq = a.cq(16);
    let rcq = a.cq(16);
    let conn = Conn {
        rnr_retry: 7,
        ..Conn::default()
    };
    let mut pairs = Vec::new();
    for _ in 0..2 {
        let s = a.qp(IV_QPT_RC, &scq);
        let r = a.qp_full(a.pd, IV_QPT_RC, &rcq, &rcq, Some(srqn), false, BIG);
        a.connect(&s, a.gid(), r.qpn, &conn);
        a.connect(&r, a.gid(), s.qpn, &conn);
        pairs.push((s, r));
    }
    // The first sender meets an empty SRQ: RNR, it waits.
    a.post(&pairs[0].0, &signaled(1, IV_WR_SEND));
    assert!(scq.poll().is_empty());
    // The ULP breaks the SRQ's producer index.
    a.d.hca.with_firmware(|fw| {
        let srq = fw.srqs.get_mut(srqn).unwrap();
        let bad = srq.ci.wrapping_add(1000);
        srq.ring.0.producer_word().store(bad, Ordering::SeqCst);
    });
    let (got, _) = clock.until_completion(&a, &scq, 8);
    assert_eq!(
        got.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [(1, IV_WC_REM_OP_ERR)]
    );
    // The second sender's first SEND meets the SRQ in error.
    a.post(&pairs[1].0, &signaled(2, IV_WR_SEND));
    let (got, _) = clock.until_completion(&a, &scq, 8);
    assert_eq!(
        got.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [(2, IV_WC_REM_OP_ERR)]
    );
    for (s, r) in &pairs {
        assert_eq!(a.state(s), IV_QPS_ERR);
        assert_eq!(a.state(r), IV_QPS_ERR);
    }
    let asyncs = a.asyncs();
    assert!(asyncs.contains(&AsyncEvent::SrqError(srqn)), "{asyncs:?}");
    for (_, r) in &pairs {
        assert!(asyncs.contains(&AsyncEvent::QpFatal(r.qpn)), "{asyncs:?}");
    }
}
