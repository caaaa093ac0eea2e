//! The Rust speed path over a fake device: what `post_send`, `post_recv`,
//! `poll`, `req_notify` write and read, which doorbells they ring, and how
//! the objects' lifetimes keep every ring view inside its mapping.

mod common;

use std::sync::atomic::Ordering;

use common::{Bell, client, cq_in, qp_in, sge};
use irpverbs_abi::*;
use irpverbs_ring::wq::{push_cqe, read_recv_wqe, read_send_wqe};
use irpverbs_verbs::{AsNtStatus, Client, PostError, SendWr, Wc};

#[test]
fn post_send_writes_the_wqe_and_rings_the_send_doorbell() {
    let (c, state) = client();
    let cq = c.new_cq(&cq_in(16)).unwrap();
    let qp = c.new_qp(&qp_in(cq.handle(), 0, 2, 32)).unwrap();
    let sges = [sge(0x1000, 8), sge(0x2000, 16)];
    qp.post_send(&SendWr {
        wr_id: 0xAB,
        opcode: IV_WR_RDMA_WRITE_WITH_IMM,
        flags: IV_SEND_SIGNALED | IV_SEND_SOLICITED,
        sges: &sges,
        imm_or_inv: 0x1234_5678,
        remote_addr: 0xFEED_0000,
        rkey: 0x99,
        ..SendWr::default()
    })
    .unwrap();
    assert_eq!(state.bells.take(), [Bell::Sq(qp.qpn())]);

    let ring = qp.rings().sq().ring();
    assert_eq!(ring.producer_word().load(Ordering::Acquire), 1);
    let w = read_send_wqe(ring, 0, 2, 32).unwrap();
    assert_eq!(w.header.wr_id, 0xAB);
    assert_eq!(w.header.opcode, IV_WR_RDMA_WRITE_WITH_IMM);
    assert_eq!(w.header.flags, IV_SEND_SIGNALED | IV_SEND_SOLICITED);
    assert_eq!(w.header.num_sge, 2);
    assert_eq!(w.header.imm_or_inv, 0x1234_5678);
    assert_eq!((w.header.remote_addr, w.header.rkey), (0xFEED_0000, 0x99));
    assert_eq!(&w.sges[..2], &sges);

    // Inline data, then a UD-addressed SEND.
    qp.post_send(&SendWr {
        wr_id: 2,
        inline: Some(b"inline!"),
        ..SendWr::default()
    })
    .unwrap();
    let w = read_send_wqe(ring, 1, 2, 32).unwrap();
    assert_eq!(w.header.flags & IV_SEND_INLINE, IV_SEND_INLINE);
    assert_eq!(w.header.inline_len, 7);
    let (off, len) = irpverbs_ring::wq::inline_data(ring, 1, &w);
    let mut data = [0u8; 7];
    ring.region().read(off, &mut data[..len]).unwrap();
    assert_eq!(&data, b"inline!");
    qp.post_send(&SendWr {
        wr_id: 3,
        ud: Some((5, 0x33, 0x1111_1111)),
        ..SendWr::default()
    })
    .unwrap();
    let w = read_send_wqe(ring, 2, 2, 32).unwrap();
    assert_eq!(
        (w.header.ahn, w.header.remote_qpn, w.header.remote_qkey),
        (5, 0x33, 0x1111_1111)
    );
    assert_eq!(state.bells.take(), [Bell::Sq(qp.qpn()), Bell::Sq(qp.qpn())]);
}

#[test]
fn a_refused_post_writes_nothing_and_rings_nothing() {
    let (c, state) = client();
    let cq = c.new_cq(&cq_in(16)).unwrap();
    let qp = c.new_qp(&qp_in(cq.handle(), 0, 1, 8)).unwrap();
    let two = [sge(1, 1), sge(2, 2)];
    let too_many = SendWr {
        sges: &two,
        ..SendWr::default()
    };
    assert_eq!(qp.post_send(&too_many), Err(PostError::TooManySge));
    let long = SendWr {
        inline: Some(&[0; 9]),
        ..SendWr::default()
    };
    assert_eq!(qp.post_send(&long), Err(PostError::InlineTooLong));
    let bad = SendWr {
        opcode: 42,
        ..SendWr::default()
    };
    assert_eq!(qp.post_send(&bad), Err(PostError::Invalid));
    assert_eq!(qp.post_recv(1, &two), Err(PostError::TooManySge));
    assert!(state.bells.take().is_empty());
    assert_eq!(
        qp.rings()
            .sq()
            .ring()
            .producer_word()
            .load(Ordering::Acquire),
        0
    );

    // The queue holds its depth (`max_send_wr`, one less than the ring's
    // slots); the next one is refused as full.
    let entries = qp.cap().max_send_wr;
    assert_eq!(entries, qp.rings().sq().ring().capacity());
    for i in 0..entries {
        qp.post_send(&SendWr {
            wr_id: u64::from(i),
            ..SendWr::default()
        })
        .unwrap();
    }
    let full = qp.post_send(&SendWr::default()).unwrap_err();
    assert_eq!(full, PostError::Full);
    assert_eq!(full.nt_status(), STATUS_INSUFFICIENT_RESOURCES);
    assert_eq!(PostError::TooManySge.nt_status(), STATUS_INVALID_PARAMETER);
    assert_eq!(state.bells.take().len(), entries as usize);
}

#[test]
fn a_post_list_rings_once_and_reports_the_first_refusal() {
    let (c, state) = client();
    let cq = c.new_cq(&cq_in(16)).unwrap();
    let qp = c.new_qp(&qp_in(cq.handle(), 0, 1, 0)).unwrap();
    let wrs: Vec<SendWr<'_>> = (0..3)
        .map(|i| SendWr {
            wr_id: i,
            ..SendWr::default()
        })
        .collect();
    qp.post_send_list(&wrs).unwrap();
    assert_eq!(state.bells.take(), [Bell::Sq(qp.qpn())]);
    let mut bad = wrs.clone();
    bad[1].opcode = 200;
    assert_eq!(qp.post_send_list(&bad), Err((1, PostError::Invalid)));
    assert_eq!(state.bells.take(), [Bell::Sq(qp.qpn())], "one was posted");
    assert_eq!(qp.post_send_list(&bad[1..]), Err((0, PostError::Invalid)));
    assert!(state.bells.take().is_empty(), "none posted, no doorbell");
}

#[test]
fn post_recv_on_the_rq_and_on_an_srq() {
    let (c, state) = client();
    let cq = c.new_cq(&cq_in(16)).unwrap();
    let qp = c.new_qp(&qp_in(cq.handle(), 0, 2, 0)).unwrap();
    let sges = [sge(0x4000, 64), sge(0x5000, 32)];
    // The HCA asked for the doorbell (the ring's doorbell request): rung.
    let rq = qp.rings().rq().unwrap().ring();
    rq.doorbell_request().set(true);
    qp.post_recv(0x77, &sges).unwrap();
    assert_eq!(state.bells.take(), [Bell::Rq(qp.qpn())]);
    let w = read_recv_wqe(rq, 0, 2).unwrap();
    assert_eq!((w.wr_id, w.num_sge), (0x77, 2));
    assert_eq!(&w.sges[..2], &sges);
    // Not asked: posted, not rung.
    rq.doorbell_request().set(false);
    qp.post_recv(0x78, &sges).unwrap();
    assert!(state.bells.take().is_empty());
    assert_eq!(read_recv_wqe(rq, 1, 2).unwrap().wr_id, 0x78);

    let srq = c
        .new_srq(&IvCreateSrqIn {
            max_wr: 4,
            max_sge: 1,
            ..IvCreateSrqIn::default()
        })
        .unwrap();
    let on_srq = c.new_qp(&qp_in(cq.handle(), srq.handle(), 1, 0)).unwrap();
    assert!(on_srq.rings().rq().is_none());
    assert_eq!(on_srq.post_recv(1, &sges[..1]), Err(PostError::Invalid));
    srq.post_recv(0x87, &sges[..1]).unwrap();
    assert!(state.bells.take().is_empty(), "not asked");
    srq.rings().rq().ring().doorbell_request().set(true);
    srq.post_recv(0x88, &sges[..1]).unwrap();
    assert_eq!(state.bells.take(), [Bell::Srq(srq.srqn())]);
    let w = read_recv_wqe(srq.rings().rq().ring(), 1, 1).unwrap();
    assert_eq!((w.wr_id, w.sges[0]), (0x88, sges[0]));
}

#[test]
fn poll_reads_what_the_hca_wrote_and_req_notify_arms() {
    let (c, state) = client();
    let cq = c.new_cq(&cq_in(4)).unwrap();
    let mut wc = [IvCqe::default(); 8];
    assert_eq!(cq.poll(&mut wc), Ok(0));
    let ring = cq.rings().cq().ring();
    push_cqe(
        ring,
        &IvCqe {
            wr_id: 1,
            opcode: IV_WC_OP_RECV,
            byte_len: 100,
            wc_flags: IV_WC_WITH_IMM,
            imm_or_inv: 0xBEEF,
            qp_num: 0x12,
            ..IvCqe::default()
        },
    )
    .unwrap();
    push_cqe(
        ring,
        &IvCqe {
            wr_id: 2,
            status: IV_WC_REM_ACCESS_ERR,
            ..IvCqe::default()
        },
    )
    .unwrap();
    assert_eq!(cq.poll(&mut wc[..1]), Ok(1));
    let w = Wc::new(&wc[0]);
    assert!(w.is_success() && w.is_recv());
    assert_eq!((w.wr_id(), w.byte_len(), w.imm()), (1, 100, Some(0xBEEF)));
    assert_eq!(w.opcode_name(), "RECV");
    assert_eq!(w.invalidated_rkey(), None);
    assert_eq!(
        w.to_string(),
        "wr_id 0x1 qp 0x12: RECV 100 bytes imm 0xbeef SUCCESS"
    );
    assert_eq!(cq.poll(&mut wc), Ok(1));
    let w = Wc::from(&wc[0]);
    assert!(!w.is_success());
    assert_eq!(w.status_name(), "REM_ACCESS_ERR");
    assert_eq!(
        w.to_string(),
        "wr_id 0x2 qp 0x0: REM_ACCESS_ERR (vendor 0x0)"
    );
    assert_eq!(cq.poll(&mut wc), Ok(0));
    assert_eq!(ring.consumer_word().load(Ordering::Acquire), 2);

    cq.req_notify(false);
    let arm = ring.arm_word().load(Ordering::Acquire);
    assert_eq!(arm & (IV_CQ_ARM_NEXT | IV_CQ_ARM_SOLICITED), IV_CQ_ARM_NEXT);
    cq.req_notify(true);
    let arm2 = ring.arm_word().load(Ordering::Acquire);
    assert_eq!(
        arm2 & (IV_CQ_ARM_NEXT | IV_CQ_ARM_SOLICITED),
        IV_CQ_ARM_NEXT | IV_CQ_ARM_SOLICITED
    );
    assert_ne!(arm & 0x3FFF_FFFF, arm2 & 0x3FFF_FFFF, "the sequence moves");
    assert_eq!(
        state.bells.take(),
        [Bell::CqArm(cq.cqn()), Bell::CqArm(cq.cqn())]
    );

    // A producer index the ring cannot hold is a corrupt CQ.
    ring.producer_word().store(1000, Ordering::Release);
    let e = cq.poll(&mut wc).unwrap_err();
    assert_eq!(e.nt_status(), STATUS_DEVICE_HARDWARE_ERROR);
    ring.producer_word().store(2, Ordering::Release);
}

#[test]
fn held_objects_cannot_be_destroyed_behind_their_backs() {
    let (c, state) = client();
    let cq = c.new_cq(&cq_in(16)).unwrap();
    let qp = c.new_qp(&qp_in(cq.handle(), 0, 1, 0)).unwrap();
    let h = qp.handle();
    assert_eq!(c.destroy_qp(h), Err(STATUS_DEVICE_BUSY));
    let (st, _) = c.raw(IOCTL_IV_DESTROY_QP, &h.to_ne_bytes(), 0);
    assert_eq!(st, STATUS_DEVICE_BUSY);
    let (st, _) = c.file().ioctl(IOCTL_IV_DESTROY_QP, &h.to_ne_bytes(), 0);
    assert_eq!(st, STATUS_DEVICE_BUSY);
    assert_eq!(c.destroy_cq(cq.handle()), Err(STATUS_DEVICE_BUSY));
    assert_eq!(c.resize_cq(cq.handle(), 64).err(), Some(STATUS_DEVICE_BUSY));
    assert_eq!(
        state.received(IOCTL_IV_DESTROY_QP),
        0,
        "refused before the driver"
    );
    assert_eq!(state.received(IOCTL_IV_RESIZE_CQ), 0);
    // The QP still works.
    qp.post_send(&SendWr::default()).unwrap();

    qp.destroy().unwrap();
    assert_eq!(state.received(IOCTL_IV_DESTROY_QP), 1);
    // Its handle is no longer held: a raw destroy reaches the driver (which
    // no longer knows it).
    assert_eq!(c.destroy_qp(h), Err(STATUS_INVALID_HANDLE));
    cq.destroy().unwrap();
    assert_eq!(state.live(), 0);
}

#[test]
fn a_busy_destroy_gives_the_object_back_usable() {
    let (c, state) = client();
    let cq = c.new_cq(&cq_in(16)).unwrap();
    let qp = c.new_qp(&qp_in(cq.handle(), 0, 1, 0)).unwrap();
    let (cq, status) = cq.destroy().unwrap_err();
    assert_eq!(status, STATUS_DEVICE_BUSY);
    assert_eq!(
        state.received(IOCTL_IV_DESTROY_CQ),
        1,
        "the driver said busy"
    );
    push_cqe(
        cq.rings().cq().ring(),
        &IvCqe {
            wr_id: 9,
            ..IvCqe::default()
        },
    )
    .unwrap();
    let mut wc = [IvCqe::default(); 2];
    assert_eq!(cq.poll(&mut wc), Ok(1));
    assert_eq!(wc[0].wr_id, 9);
    assert_eq!(
        c.destroy_cq(cq.handle()),
        Err(STATUS_DEVICE_BUSY),
        "still held"
    );
    drop(qp);
    cq.destroy().unwrap();
    assert_eq!(state.live(), 0);
}

#[test]
fn dropping_objects_destroys_them() {
    let (c, state) = client();
    {
        let cq = c.new_cq(&cq_in(16)).unwrap();
        let srq = c
            .new_srq(&IvCreateSrqIn {
                max_wr: 4,
                max_sge: 1,
                ..IvCreateSrqIn::default()
            })
            .unwrap();
        let _qp = c.new_qp(&qp_in(cq.handle(), srq.handle(), 1, 0)).unwrap();
        assert_eq!(state.live(), 3);
    }
    assert_eq!(state.live(), 0, "QP, then SRQ and CQ, destroyed on drop");
    // A CQ dropped while a QP (created raw) still uses it: the destroy is
    // refused, the view is gone, and the handle is free for a raw destroy.
    let cq = c.new_cq(&cq_in(16)).unwrap();
    let h = cq.handle();
    let raw_qp = c.create_qp_with(&qp_in(h, 0, 1, 0)).unwrap();
    drop(cq);
    assert_eq!(state.live(), 2);
    c.destroy_qp(raw_qp.qp).unwrap();
    c.destroy_cq(h).unwrap();
    assert_eq!(state.live(), 0);
}

#[test]
fn resize_moves_the_view_to_the_new_ring() {
    let (c, state) = client();
    let mut cq = c.new_cq(&cq_in(4)).unwrap();
    let old = cq.rings().cq().ring().map();
    cq.resize(100).unwrap();
    assert_eq!(cq.cqe(), 127);
    let ring = cq.rings().cq().ring();
    assert_ne!(ring.map(), old);
    assert_eq!(ring.entries(), 128);
    push_cqe(
        ring,
        &IvCqe {
            wr_id: 5,
            ..IvCqe::default()
        },
    )
    .unwrap();
    let mut wc = [IvCqe::default(); 1];
    assert_eq!(cq.poll(&mut wc), Ok(1));
    assert_eq!(wc[0].wr_id, 5);
    // A refused resize keeps the current ring.
    let now = cq.rings().cq().ring().map();
    assert_eq!(cq.resize(0), Err(STATUS_INVALID_PARAMETER));
    assert_eq!(cq.rings().cq().ring().map(), now);
    assert_eq!(cq.poll(&mut wc), Ok(0));
    drop(cq);
    assert_eq!(state.live(), 0);
}

#[test]
fn without_the_speed_path_nothing_is_created() {
    let state = std::sync::Arc::new(common::State::default());
    let c = Client::new(Box::new(common::FakeFile(std::sync::Arc::clone(&state))));
    assert!(c.doorbells().is_none());
    assert_eq!(c.new_cq(&cq_in(4)).err(), Some(STATUS_NOT_SUPPORTED));
    assert_eq!(state.ioctls.lock().unwrap().len(), 0);
    // The raw verbs still work.
    let cq = c.create_cq(4).unwrap();
    c.destroy_cq(cq.cq).unwrap();
}

#[test]
fn objects_connect_and_modify_through_the_client() {
    let (c, state) = client();
    let cq = c.new_cq(&cq_in(4)).unwrap();
    let qp = c.new_qp(&qp_in(cq.handle(), 0, 1, 0)).unwrap();
    qp.connect(0x99, [0; 16]).unwrap();
    assert_eq!(state.received(IOCTL_IV_MODIFY_QP), 3);
    assert_eq!(qp.qp_type(), IV_QPT_RC);
    assert!(std::ptr::eq(qp.client(), &c));
    assert_eq!(qp.cap().max_send_sge, 1);
}

#[test]
fn wc_names_every_status_and_opcode() {
    use irpverbs_verbs::speed::{wc_opcode_name, wc_status_name};
    for (s, n) in [
        (IV_WC_SUCCESS, "SUCCESS"),
        (IV_WC_LOC_LEN_ERR, "LOC_LEN_ERR"),
        (IV_WC_LOC_QP_OP_ERR, "LOC_QP_OP_ERR"),
        (IV_WC_LOC_PROT_ERR, "LOC_PROT_ERR"),
        (IV_WC_WR_FLUSH_ERR, "WR_FLUSH_ERR"),
        (IV_WC_BAD_RESP_ERR, "BAD_RESP_ERR"),
        (IV_WC_LOC_ACCESS_ERR, "LOC_ACCESS_ERR"),
        (IV_WC_REM_INV_REQ_ERR, "REM_INV_REQ_ERR"),
        (IV_WC_REM_ACCESS_ERR, "REM_ACCESS_ERR"),
        (IV_WC_REM_OP_ERR, "REM_OP_ERR"),
        (IV_WC_RETRY_EXC_ERR, "RETRY_EXC_ERR"),
        (IV_WC_RNR_RETRY_EXC_ERR, "RNR_RETRY_EXC_ERR"),
        (IV_WC_FATAL_ERR, "FATAL_ERR"),
        (IV_WC_GENERAL_ERR, "GENERAL_ERR"),
        (999, "unknown status"),
    ] {
        assert_eq!(wc_status_name(s), n);
    }
    for (o, n) in [
        (IV_WC_OP_SEND, "SEND"),
        (IV_WC_OP_RDMA_WRITE, "RDMA_WRITE"),
        (IV_WC_OP_RDMA_READ, "RDMA_READ"),
        (IV_WC_OP_COMP_SWAP, "COMP_SWAP"),
        (IV_WC_OP_FETCH_ADD, "FETCH_ADD"),
        (IV_WC_OP_RECV, "RECV"),
        (IV_WC_OP_RECV_RDMA_WITH_IMM, "RECV_RDMA_WITH_IMM"),
        (77, "unknown opcode"),
    ] {
        assert_eq!(wc_opcode_name(o), n);
    }
    let inv = IvCqe {
        opcode: IV_WC_OP_RECV,
        wc_flags: IV_WC_WITH_INV | IV_WC_GRH,
        imm_or_inv: 0x55,
        src_qp: 3,
        ..IvCqe::default()
    };
    let w = Wc::new(&inv);
    assert_eq!((w.invalidated_rkey(), w.imm()), (Some(0x55), None));
    assert!(w.has_grh());
    assert_eq!(w.src_qp(), 3);
    assert_eq!(
        w.to_string(),
        "wr_id 0x0 qp 0x0: RECV 0 bytes invalidated 0x55 SUCCESS"
    );
}

#[test]
fn speed_objects_are_send_and_sync() {
    fn both<T: Send + Sync>() {}
    both::<irpverbs_verbs::Qp<'static>>();
    both::<irpverbs_verbs::Cq<'static>>();
    both::<irpverbs_verbs::Srq<'static>>();
    both::<Client>();
}

#[test]
fn posts_from_several_threads_each_land_once() {
    let (c, state) = client();
    let cq = c.new_cq(&cq_in(16)).unwrap();
    let mut i = qp_in(cq.handle(), 0, 1, 0);
    i.cap.max_send_wr = 255;
    let qp = c.new_qp(&i).unwrap();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let qp = &qp;
            s.spawn(move || {
                for n in 0..50 {
                    qp.post_send(&SendWr {
                        wr_id: t << 32 | n,
                        ..SendWr::default()
                    })
                    .unwrap();
                }
            });
        }
    });
    let ring = qp.rings().sq().ring();
    assert_eq!(ring.producer_word().load(Ordering::Acquire), 200);
    let mut ids: Vec<u64> = (0..200)
        .map(|i| read_send_wqe(ring, i, 1, 0).unwrap().header.wr_id)
        .collect();
    ids.sort_unstable();
    let mut want: Vec<u64> = (0..4u64)
        .flat_map(|t| (0..50).map(move |n| t << 32 | n))
        .collect();
    want.sort_unstable();
    assert_eq!(ids, want);
    assert_eq!(state.bells.take().len(), 200);
}
