//! Capabilities stay honest: every limit `query_device` reports is used at
//! the limit, and the limit + 1 is refused with its status. Counts
//! (`max_qp`, `max_cq`, `max_mr`, `max_mw`, `max_pd`, `max_srq`, `max_ah`) on a
//! device configured small, so that reaching them is cheap; per-object
//! limits (`max_qp_wr`, `max_sge`, `max_inline_data`, `max_cqe`,
//! `max_srq_wr`, `max_srq_sge`, `num_comp_vectors`) at the defaults, with
//! data moved through a QP created at its limits; the READ limits
//! (`max_qp_rd_atom`, `max_qp_init_rd_atom`, `max_sge_rd`) with that many
//! READs in flight; the device-wide ones (`max_mr_size`, `max_pkeys`,
//! `max_res_rd_atom`, the responder resources of all QPs together, with
//! that many READs in flight) on a device configured small, since no host
//! has the memory to register the default `max_mr_size` (1 TiB).

use std::sync::Arc;

use irpverbs_abi::*;
use irpverbs_host::{Backend, HostDevice, HostDeviceConfig};
use irpverbs_soft::SoftConfig;
use irpverbs_verbs::{Client, IntoClient, SendWr, av, qp_request};

mod common;
use common::Mem;

crate::on_each_backend!(
    count_limits_are_reached_exactly_and_one_more_is_refused,
    per_object_limits_are_usable_at_the_limit,
    read_limits_are_usable_at_the_limit,
    device_wide_limits_are_usable_at_the_limit,
);

fn client(dev: &Arc<HostDevice>) -> Client {
    dev.open(FILE_READ_ACCESS | FILE_WRITE_ACCESS)
        .expect("open")
        .into_client()
}

fn finish(dev: &Arc<HostDevice>) {
    dev.quiesce(std::time::Duration::from_secs(10))
        .expect("quiescent");
    assert_eq!(dev.platform().pool_stats().live, 0, "pool leaked");
    dev.unload();
}

/// Every count limit can be reached exactly, and one more is refused with
/// `STATUS_INSUFFICIENT_RESOURCES`; a freed one can be made again.
fn count_limits_are_reached_exactly_and_one_more_is_refused(backend: Backend) {
    let dev = HostDevice::new(HostDeviceConfig {
        backend,
        soft: SoftConfig {
            max_qp: 3,
            max_cq: 3,
            max_mr: 3,
            max_pd: 3,
            max_srq: 2,
            max_ah: 2,
            max_mw: 3,
            ..SoftConfig::default()
        },
        ..HostDeviceConfig::default()
    })
    .expect("device");
    let c = client(&dev);
    let d = c.query_device().unwrap();
    assert_eq!(
        (
            d.max_qp, d.max_cq, d.max_mr, d.max_mw, d.max_pd, d.max_srq, d.max_ah
        ),
        (3, 3, 3, 3, 3, 2, 2)
    );
    let full = STATUS_INSUFFICIENT_RESOURCES;

    let pds: Vec<_> = (0..d.max_pd).map(|_| c.alloc_pd().unwrap().pd).collect();
    assert_eq!(c.alloc_pd().unwrap_err(), full, "max_pd + 1");
    let pd = pds[0];

    let mem = Mem::new(4096);
    let mrs: Vec<_> = (0..d.max_mr)
        .map(|_| {
            c.reg_mr(pd, mem.addr(), 4096, IV_ACCESS_LOCAL_WRITE)
                .unwrap()
        })
        .collect();
    assert_eq!(
        c.reg_mr(pd, mem.addr(), 4096, IV_ACCESS_LOCAL_WRITE)
            .unwrap_err(),
        full,
        "max_mr + 1"
    );

    // Windows of both types count together against max_mw.
    let mws: Vec<_> = (0..d.max_mw)
        .map(|i| {
            let ty = [IV_MW_TYPE_1, IV_MW_TYPE_2][i as usize % 2];
            c.alloc_mw(pd, ty).unwrap().mw
        })
        .collect();
    for ty in [IV_MW_TYPE_1, IV_MW_TYPE_2] {
        assert_eq!(c.alloc_mw(pd, ty).unwrap_err(), full, "max_mw + 1");
    }
    c.dealloc_mw(mws[0]).unwrap();
    let mw_again = c.alloc_mw(pd, IV_MW_TYPE_2).unwrap().mw;

    let cqs: Vec<_> = (0..d.max_cq).map(|_| c.create_cq(4).unwrap().cq).collect();
    assert_eq!(c.create_cq(4).unwrap_err(), full, "max_cq + 1");

    let qps: Vec<_> = (0..d.max_qp)
        .map(|_| {
            c.create_qp_with(&qp_request(pd, cqs[0], 0, IV_QPT_RC))
                .unwrap()
                .qp
        })
        .collect();
    assert_eq!(
        c.create_qp_with(&qp_request(pd, cqs[0], 0, IV_QPT_RC))
            .unwrap_err(),
        full,
        "max_qp + 1"
    );

    let srqs: Vec<_> = (0..d.max_srq)
        .map(|_| c.create_srq(pd, 4, 0).unwrap().srq)
        .collect();
    assert_eq!(c.create_srq(pd, 4, 0).unwrap_err(), full, "max_srq + 1");

    let gid = dev.soft().gid();
    let attr = av(gid);
    let ahs: Vec<_> = (0..d.max_ah)
        .map(|_| c.create_ah(pd, &attr).unwrap().ah)
        .collect();
    assert_eq!(c.create_ah(pd, &attr).unwrap_err(), full, "max_ah + 1");

    // A freed one can be made again.
    c.destroy_qp(qps[0]).unwrap();
    let again = c
        .create_qp_with(&qp_request(pd, cqs[0], 0, IV_QPT_RC))
        .unwrap()
        .qp;

    for ah in ahs {
        c.destroy_ah(ah).unwrap();
    }
    for srq in srqs {
        c.destroy_srq(srq).unwrap();
    }
    for qp in qps.into_iter().skip(1).chain([again]) {
        c.destroy_qp(qp).unwrap();
    }
    for cq in cqs {
        c.destroy_cq(cq).unwrap();
    }
    for mw in mws.into_iter().skip(1).chain([mw_again]) {
        c.dealloc_mw(mw).unwrap();
    }
    for mr in mrs {
        c.dereg_mr(mr.mr).unwrap();
    }
    for pd in pds {
        c.dealloc_pd(pd).unwrap();
    }
    drop(c);
    finish(&dev);
}

/// Per-object limits at the defaults: a CQ of `max_cqe`, an SRQ of
/// `max_srq_wr` x `max_srq_sge`, a CQ on the last completion vector, and
/// two RC QPs of `max_qp_wr` x `max_sge` with `max_inline_data` that move
/// a message gathered from `max_sge` pieces into `max_sge` pieces, and an
/// inline message of `max_inline_data` bytes; each limit + 1 refused with
/// `STATUS_INVALID_PARAMETER`.
fn per_object_limits_are_usable_at_the_limit(backend: Backend) {
    let dev = HostDevice::new(HostDeviceConfig {
        backend,
        ..HostDeviceConfig::default()
    })
    .expect("host device");
    let c = client(&dev);
    let d = c.query_device().unwrap();
    let pd = c.alloc_pd().unwrap().pd;
    let bad = STATUS_INVALID_PARAMETER;

    // CQ depth and completion vectors.
    let big = c.create_cq(d.max_cqe).unwrap();
    assert!(big.cqe >= d.max_cqe);
    assert_eq!(c.create_cq(d.max_cqe + 1).unwrap_err(), bad, "max_cqe + 1");
    assert!(d.num_comp_vectors >= 1);
    let last = c
        .new_cq(&IvCreateCqIn {
            cqe: 64,
            comp_vector: d.num_comp_vectors - 1,
            ..IvCreateCqIn::default()
        })
        .unwrap();
    assert_eq!(
        c.new_cq(&IvCreateCqIn {
            cqe: 4,
            comp_vector: d.num_comp_vectors,
            ..IvCreateCqIn::default()
        })
        .err(),
        Some(bad),
        "num_comp_vectors"
    );

    // SRQ depth and SGEs.
    let srq_in = IvCreateSrqIn {
        pd,
        max_wr: d.max_srq_wr,
        max_sge: d.max_srq_sge,
        ..IvCreateSrqIn::default()
    };
    let srq = c.new_srq(&srq_in).unwrap();
    for (what, i) in [
        (
            "max_srq_wr + 1",
            IvCreateSrqIn {
                max_wr: d.max_srq_wr + 1,
                ..srq_in
            },
        ),
        (
            "max_srq_sge + 1",
            IvCreateSrqIn {
                max_sge: d.max_srq_sge + 1,
                ..srq_in
            },
        ),
    ] {
        assert_eq!(c.new_srq(&i).err(), Some(bad), "{what}");
    }
    drop(srq);

    // QPs at every limit.
    let mut req = qp_request(pd, last.handle(), 0, IV_QPT_RC);
    req.cap = IvQpCap {
        max_send_wr: d.max_qp_wr,
        max_recv_wr: d.max_qp_wr,
        max_send_sge: d.max_sge,
        max_recv_sge: d.max_sge,
        max_inline_data: d.max_inline_data,
        ..req.cap
    };
    for (what, cap) in [
        (
            "max_qp_wr + 1",
            IvQpCap {
                max_send_wr: d.max_qp_wr + 1,
                ..req.cap
            },
        ),
        (
            "max_qp_wr + 1 (receive)",
            IvQpCap {
                max_recv_wr: d.max_qp_wr + 1,
                ..req.cap
            },
        ),
        (
            "max_sge + 1 (receive)",
            IvQpCap {
                max_recv_sge: d.max_sge + 1,
                ..req.cap
            },
        ),
        (
            "max_inline_data + 1",
            IvQpCap {
                max_inline_data: d.max_inline_data + 1,
                ..req.cap
            },
        ),
    ] {
        let i = IvCreateQpIn { cap, ..req };
        assert_eq!(c.create_qp_with(&i).unwrap_err(), bad, "{what}");
    }
    let (a, b) = (c.new_qp(&req).unwrap(), c.new_qp(&req).unwrap());
    for q in [&a, &b] {
        let cap = q.cap();
        assert!(
            cap.max_send_wr >= d.max_qp_wr
                && cap.max_recv_wr >= d.max_qp_wr
                && cap.max_send_sge >= d.max_sge
                && cap.max_recv_sge >= d.max_sge
                && cap.max_inline_data >= d.max_inline_data,
            "{cap:?}"
        );
    }
    let gid = dev.soft().gid();
    a.connect(b.qpn(), gid).unwrap();
    b.connect(a.qpn(), gid).unwrap();

    // A message of max_sge pieces into max_sge pieces.
    let n = d.max_sge as usize;
    let mem = Mem::new(4 * n * 8 + 2 * d.max_inline_data as usize);
    let mr = c
        .reg_mr(
            pd,
            mem.addr(),
            4 * n as u64 * 8 + 2 * u64::from(d.max_inline_data),
            IV_ACCESS_LOCAL_WRITE,
        )
        .unwrap();
    let sge = |at: usize, len: usize| IvSge {
        addr: mem.addr() + at as u64,
        length: len as u32,
        lkey: mr.lkey,
    };
    let src: Vec<u8> = (0..n * 8).map(|i| (i * 7 + 1) as u8).collect();
    mem.fill(0, &src);
    // Gathered from n pieces of 8 bytes, scattered into n pieces in
    // reverse order.
    let gather: Vec<IvSge> = (0..n).map(|i| sge(i * 8, 8)).collect();
    let scatter: Vec<IvSge> = (0..n)
        .map(|i| sge(2 * n * 8 + (n - 1 - i) * 8, 8))
        .collect();
    b.post_recv(1, &scatter).unwrap();
    a.post_send(&SendWr {
        wr_id: 2,
        opcode: IV_WR_SEND,
        flags: IV_SEND_SIGNALED,
        sges: &gather,
        ..SendWr::default()
    })
    .unwrap();
    let wcs = wait(&last, 2);
    assert!(wcs.iter().all(|w| w.status == IV_WC_SUCCESS), "{wcs:?}");
    let recv = wcs.iter().find(|w| w.wr_id == 1).unwrap();
    assert_eq!(recv.byte_len as usize, n * 8);
    for i in 0..n {
        assert_eq!(
            mem.read(2 * n * 8 + (n - 1 - i) * 8, 8),
            src[i * 8..i * 8 + 8].to_vec(),
            "piece {i}"
        );
    }

    // An inline message of max_inline_data bytes.
    let len = d.max_inline_data as usize;
    let at = 4 * n * 8;
    let payload: Vec<u8> = (0..len).map(|i| (i * 3 + 5) as u8).collect();
    b.post_recv(3, &[sge(at, len)]).unwrap();
    a.post_send(&SendWr {
        wr_id: 4,
        opcode: IV_WR_SEND,
        flags: IV_SEND_SIGNALED | IV_SEND_INLINE,
        inline: Some(&payload),
        ..SendWr::default()
    })
    .unwrap();
    let wcs = wait(&last, 2);
    assert!(wcs.iter().all(|w| w.status == IV_WC_SUCCESS), "{wcs:?}");
    assert_eq!(mem.read(at, len), payload);
    // One byte more is refused at the post.
    let over = vec![0u8; len + 1];
    assert!(
        a.post_send(&SendWr {
            wr_id: 5,
            opcode: IV_WR_SEND,
            flags: IV_SEND_SIGNALED | IV_SEND_INLINE,
            inline: Some(&over),
            ..SendWr::default()
        })
        .is_err(),
        "max_inline_data + 1 bytes posted"
    );

    drop((a, b));
    c.dereg_mr(mr.mr).unwrap();
    drop((big, last));
    drop(c);
    finish(&dev);
}

/// `count` completions from `cq` (a minute at most).
fn wait(cq: &irpverbs_verbs::Cq<'_>, count: usize) -> Vec<IvCqe> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut out = Vec::new();
    let mut buf = [IvCqe::default(); 4];
    while out.len() < count {
        assert!(std::time::Instant::now() < deadline, "no completion");
        let k = cq.poll(&mut buf).unwrap();
        out.extend_from_slice(&buf[..k]);
    }
    out
}

/// The RDMA READ limits: an RC pair walked to RTS with
/// `max_dest_rd_atomic = max_qp_rd_atom` and `max_rd_atomic =
/// max_qp_init_rd_atom` (each + 1 refused with `STATUS_INVALID_PARAMETER`,
/// the QP left where it was), then that many READs in flight at once, each
/// scattering into `max_sge_rd` pieces.
fn read_limits_are_usable_at_the_limit(backend: Backend) {
    let dev = HostDevice::new(HostDeviceConfig {
        backend,
        ..HostDeviceConfig::default()
    })
    .expect("host device");
    let c = client(&dev);
    let d = c.query_device().unwrap();
    let pd = c.alloc_pd().unwrap().pd;
    let depth = d.max_qp_init_rd_atom.max(d.max_qp_rd_atom);
    let cq = c
        .new_cq(&IvCreateCqIn {
            cqe: 2 * depth + 8,
            ..IvCreateCqIn::default()
        })
        .unwrap();
    let mut req = qp_request(pd, cq.handle(), 0, IV_QPT_RC);
    req.cap.max_send_wr = depth;
    req.cap.max_send_sge = d.max_sge_rd;
    let (a, b) = (c.new_qp(&req).unwrap(), c.new_qp(&req).unwrap());
    let gid = dev.soft().gid();
    // The attributes are bytes: the limits (at most 255) fit, with room
    // for one more.
    let ra = u8::try_from(d.max_qp_rd_atom).unwrap();
    let ia = u8::try_from(d.max_qp_init_rd_atom).unwrap();
    assert!(ra < 255 && ia < 255, "no byte value past the limit");
    for (q, peer) in [(&a, &b), (&b, &a)] {
        for (mask, attr) in irpverbs_verbs::rts_steps(IV_QPT_RC, peer.qpn(), gid) {
            let attr = IvQpAttr {
                max_dest_rd_atomic: ra,
                max_rd_atomic: ia,
                ..attr
            };
            if attr.qp_state == IV_QPS_RTR {
                let over = IvQpAttr {
                    max_dest_rd_atomic: ra + 1,
                    ..attr
                };
                assert_eq!(
                    q.modify(mask, &over).unwrap_err(),
                    STATUS_INVALID_PARAMETER,
                    "max_qp_rd_atom + 1"
                );
            }
            if attr.qp_state == IV_QPS_RTS {
                let over = IvQpAttr {
                    max_rd_atomic: ia + 1,
                    ..attr
                };
                assert_eq!(
                    q.modify(mask, &over).unwrap_err(),
                    STATUS_INVALID_PARAMETER,
                    "max_qp_init_rd_atom + 1"
                );
            }
            q.modify(mask, &attr).unwrap();
        }
        let got = q.query().unwrap().attr;
        assert_eq!((got.max_dest_rd_atomic, got.max_rd_atomic), (ra, ia));
    }

    // max_qp_init_rd_atom READs in flight, each into max_sge_rd pieces of
    // 4 bytes, from B's memory.
    let n = d.max_sge_rd as usize;
    let reads = d.max_qp_init_rd_atom as usize;
    let len = n * 4;
    let src = Mem::new(len);
    let bytes: Vec<u8> = (0..len).map(|i| (i * 11 + 3) as u8).collect();
    src.fill(0, &bytes);
    let src_mr = c
        .reg_mr(pd, src.addr(), len as u64, IV_ACCESS_REMOTE_READ)
        .unwrap();
    let dst = Mem::new(reads * len);
    let dst_mr = c
        .reg_mr(pd, dst.addr(), (reads * len) as u64, IV_ACCESS_LOCAL_WRITE)
        .unwrap();
    for r in 0..reads {
        let pieces: Vec<IvSge> = (0..n)
            .map(|i| IvSge {
                addr: dst.addr() + (r * len + i * 4) as u64,
                length: 4,
                lkey: dst_mr.lkey,
            })
            .collect();
        a.post_send(&SendWr {
            wr_id: r as u64,
            opcode: IV_WR_RDMA_READ,
            flags: IV_SEND_SIGNALED,
            sges: &pieces,
            remote_addr: src.addr(),
            rkey: src_mr.rkey,
            ..SendWr::default()
        })
        .unwrap();
    }
    let wcs = wait(&cq, reads);
    assert!(wcs.iter().all(|w| w.status == IV_WC_SUCCESS), "{wcs:?}");
    for r in 0..reads {
        assert_eq!(dst.read(r * len, len), bytes, "read {r}");
    }
    drop((a, b));
    c.dereg_mr(src_mr.mr).unwrap();
    c.dereg_mr(dst_mr.mr).unwrap();
    drop(cq);
    drop(c);
    finish(&dev);
}

/// Walks `q` to RTS towards `peer` (loopback), with `rr` responder
/// resources and `depth` READs in flight as requester.
fn to_rts(q: &irpverbs_verbs::Qp<'_>, peer: u32, gid: [u8; 16], rr: u8, depth: u8) {
    for (mask, attr) in irpverbs_verbs::rts_steps(IV_QPT_RC, peer, gid) {
        let attr = IvQpAttr {
            max_dest_rd_atomic: rr,
            max_rd_atomic: depth,
            ..attr
        };
        q.modify(mask, &attr).unwrap();
    }
}

/// The device-wide limits on a device configured small: `max_mr_size`
/// registered exactly (one byte more refused), a P_Key index of
/// `max_pkeys - 1` taken (`max_pkeys` refused, the QP left in RESET), and
/// `max_res_rd_atom` responder resources held by two QPs together, with
/// that many READs in flight at once against them; a third QP asking for
/// one more is refused with `STATUS_INSUFFICIENT_RESOURCES` (left in
/// INIT), and gets them once a holder is destroyed.
fn device_wide_limits_are_usable_at_the_limit(backend: Backend) {
    const MR_SIZE: u64 = 64 << 10;
    let dev = HostDevice::new(HostDeviceConfig {
        backend,
        soft: SoftConfig {
            max_mr_size: MR_SIZE,
            max_qp_rd_atom: 4,
            max_qp_init_rd_atom: 4,
            max_res_rd_atom: 6,
            ..SoftConfig::default()
        },
        ..HostDeviceConfig::default()
    })
    .expect("device");
    let c = client(&dev);
    let d = c.query_device().unwrap();
    assert_eq!(
        (
            d.max_mr_size,
            d.max_qp_rd_atom,
            d.max_res_rd_atom,
            d.max_pkeys
        ),
        (MR_SIZE, 4, 6, 1)
    );
    let pd = c.alloc_pd().unwrap().pd;

    // max_mr_size.
    let big = Mem::new(MR_SIZE as usize + 1);
    let mr = c
        .reg_mr(pd, big.addr(), d.max_mr_size, IV_ACCESS_LOCAL_WRITE)
        .unwrap();
    assert_eq!(
        c.reg_mr(pd, big.addr(), d.max_mr_size + 1, IV_ACCESS_LOCAL_WRITE)
            .unwrap_err(),
        STATUS_INVALID_PARAMETER,
        "max_mr_size + 1"
    );
    c.dereg_mr(mr.mr).unwrap();

    let cq = c
        .new_cq(&IvCreateCqIn {
            cqe: 32,
            ..IvCreateCqIn::default()
        })
        .unwrap();
    let mut req = qp_request(pd, cq.handle(), 0, IV_QPT_RC);
    req.cap.max_send_wr = 8;
    let qp = || c.new_qp(&req).unwrap();

    // max_pkeys: the last index is taken, the next refused.
    let p = qp();
    let init = |pkey_index: u16| IvQpAttr {
        qp_state: IV_QPS_INIT,
        port_num: 1,
        pkey_index,
        qp_access_flags: IV_ACCESS_REMOTE_READ,
        ..IvQpAttr::default()
    };
    let init_mask = IV_QP_STATE | IV_QP_PKEY_INDEX | IV_QP_PORT | IV_QP_ACCESS_FLAGS;
    assert_eq!(
        p.modify(init_mask, &init(d.max_pkeys)).unwrap_err(),
        STATUS_INVALID_PARAMETER,
        "max_pkeys"
    );
    assert_eq!(p.query().unwrap().attr.qp_state, IV_QPS_RESET);
    p.modify(init_mask, &init(d.max_pkeys - 1)).unwrap();
    assert_eq!(p.query().unwrap().attr.pkey_index, d.max_pkeys - 1);
    drop(p);

    // max_res_rd_atom: responders holding 4 + 2, requesters none.
    let gid = dev.soft().gid();
    let (a1, a2, b1, b2, b3) = (qp(), qp(), qp(), qp(), qp());
    let ra = u8::try_from(d.max_qp_rd_atom).unwrap();
    let rest = u8::try_from(d.max_res_rd_atom - d.max_qp_rd_atom).unwrap();
    to_rts(&a1, b1.qpn(), gid, 0, ra);
    to_rts(&b1, a1.qpn(), gid, ra, 0);
    to_rts(&a2, b2.qpn(), gid, 0, rest);
    to_rts(&b2, a2.qpn(), gid, rest, 0);
    let steps = irpverbs_verbs::rts_steps(IV_QPT_RC, a1.qpn(), gid);
    let (init_mask, init_attr) = steps[0];
    b3.modify(init_mask, &init_attr).unwrap();
    let (rtr_mask, rtr) = steps[1];
    let one_more = IvQpAttr {
        max_dest_rd_atomic: 1,
        ..rtr
    };
    assert_eq!(
        b3.modify(rtr_mask, &one_more).unwrap_err(),
        STATUS_INSUFFICIENT_RESOURCES,
        "max_res_rd_atom + 1"
    );
    assert_eq!(b3.query().unwrap().attr.qp_state, IV_QPS_INIT);

    // max_res_rd_atom READs in flight at once, against both responders.
    let reads = d.max_res_rd_atom as usize;
    let src = Mem::new(64);
    src.fill(0, &[0x5A; 64]);
    let src_mr = c.reg_mr(pd, src.addr(), 64, IV_ACCESS_REMOTE_READ).unwrap();
    let dst = Mem::new(reads * 64);
    let dst_mr = c
        .reg_mr(pd, dst.addr(), (reads * 64) as u64, IV_ACCESS_LOCAL_WRITE)
        .unwrap();
    for r in 0..reads {
        let q = if r < usize::from(ra) { &a1 } else { &a2 };
        q.post_send(&SendWr {
            wr_id: r as u64,
            opcode: IV_WR_RDMA_READ,
            flags: IV_SEND_SIGNALED,
            sges: &[IvSge {
                addr: dst.addr() + (r * 64) as u64,
                length: 64,
                lkey: dst_mr.lkey,
            }],
            remote_addr: src.addr(),
            rkey: src_mr.rkey,
            ..SendWr::default()
        })
        .unwrap();
    }
    let wcs = wait(&cq, reads);
    assert!(wcs.iter().all(|w| w.status == IV_WC_SUCCESS), "{wcs:?}");
    assert_eq!(dst.read(0, reads * 64), vec![0x5A; reads * 64]);

    // A holder gone, its resources are there for the third QP.
    drop(b2);
    b3.modify(
        rtr_mask,
        &IvQpAttr {
            max_dest_rd_atomic: rest,
            ..rtr
        },
    )
    .unwrap();
    drop((a1, a2, b1, b3));
    c.dereg_mr(src_mr.mr).unwrap();
    c.dereg_mr(dst_mr.mr).unwrap();
    drop(cq);
    drop(c);
    finish(&dev);
}
