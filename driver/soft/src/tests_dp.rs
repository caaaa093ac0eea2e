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
use irpverbs_ring::{Region, Ring};

use crate::Execution;
use crate::fabric::Fabric;
use crate::qp::QpState;
use crate::testutil::{Dev, TestPlatform, region};

/// An HCA with a PD.
pub(crate) struct Node {
    pub(crate) d: Dev,
    pub(crate) pd: u32,
}

/// A registered MR and the memory behind it.
#[derive(Clone)]
pub(crate) struct Mem {
    pub(crate) lkey: u32,
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) region: Arc<Region>,
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

    pub(crate) fn ring(&self) -> &Ring {
        self.q.ring()
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
        let CommandOut::Mr { lkey, .. } = self.d.ok(Command::RegMr {
            pdn,
            addr,
            length: len,
            access,
            physical: false,
            region: r.clone(),
        }) else {
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
        let CommandOut::Cq { cqn, ring, .. } = self.d.ok(Command::CreateCq {
            cqe: n,
            comp_vector: 0,
        }) else {
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
        } = self.d.ok(Command::CreateSrq {
            pdn: self.pd,
            max_wr,
            max_sge,
            srq_limit: limit,
        })
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
        let CommandOut::Qp { qpn, cap, sq, rq } = self.d.ok(Command::CreateQp {
            pdn,
            qp_type,
            send_cqn: scq.cqn,
            recv_cqn: rcq.cqn,
            srqn,
            sq_sig_all,
            cap,
        }) else {
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
        self.d.ok(Command::ModifyQp {
            qpn,
            cur_state: from.to_abi(),
            mask,
            attr,
        });
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
    }

    pub(crate) fn recv(&self, ep: &Ep, wr_id: u64, sges: &[IvSge]) {
        ep.rq.as_ref().unwrap().post(wr_id, sges).unwrap();
        self.d.hca.rq_doorbell(ep.qpn);
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
    pub(crate) _fabric: Option<Arc<Fabric<TestPlatform>>>,
}

pub(crate) fn nodes(topo: Topo) -> (Arc<Node>, Arc<Node>, Option<Arc<Fabric<TestPlatform>>>) {
    match topo {
        Topo::Loopback => {
            let a = Arc::new(Node::new(1));
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
        let (a, b, fabric) = nodes(topo);
        let cqa = a.cq(64);
        let cqb = b.cq(64);
        let qa = a.qp_full(a.pd, qp_type, &cqa, &cqa, None, sig_all, cap);
        let qb = b.qp_full(b.pd, qp_type, &cqb, &cqb, None, sig_all, cap);
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
            _fabric: fabric,
        };
        p.settle();
        p.a.events();
        p.b.events();
        p
    }

    /// Deferred: runs both HCAs' firmware until nothing is left.
    pub(crate) fn settle(&self) {
        if self.topo == Topo::TwoHcaDeferred {
            for _ in 0..1000 {
                let before = (self.a.d.hca.stats(), self.b.d.hca.stats());
                self.a.d.hca.run_firmware();
                self.b.d.hca.run_firmware();
                if (self.a.d.hca.stats(), self.b.d.hca.stats()) == before {
                    return;
                }
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

        // SEND with invalidate.
        let victim = p.b.mem(4096, ALL_ACCESS);
        p.recv(3, &[mb.sge(0, 64)]);
        let s = [ma.sge(0, 4)];
        p.send(&SendWr {
            sges: &s,
            imm_or_inv: victim.lkey,
            ..signaled(17, IV_WR_SEND_WITH_INV)
        });
        let r = one(&p.cqb);
        assert_eq!(
            (r.wr_id, r.status, r.wc_flags, r.imm_or_inv),
            (3, IV_WC_SUCCESS, IV_WC_WITH_INV, victim.lkey)
        );
        assert_eq!(one(&p.cqa).status, IV_WC_SUCCESS);
        // The invalidated rkey no longer works.
        let s = [ma.sge(0, 4)];
        p.send(&SendWr {
            sges: &s,
            remote_addr: victim.addr,
            rkey: victim.lkey,
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
