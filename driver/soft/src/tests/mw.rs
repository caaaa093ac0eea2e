//! Memory windows end to end (docs/memory-windows.md): type 1 bound by
//! command, type 2 by work request; RDMA through them, outside them, after
//! their invalidation; the busy MR; the bind rules; SEND with invalidate
//! and local invalidate of an MR refused.

use irpverbs_abi::*;
use irpverbs_core::{BindMw, Command, CommandOut};
use irpverbs_ring::wq::SendWr;

use crate::tests::dp::{ALL_ACCESS, BIG, Conn, Mem, Pair, TOPOS, one, signaled};

fn alloc(p: &Pair, mw_type: u32) -> u32 {
    let CommandOut::Mw { rkey } = p.b.d.ok(Command::AllocMw {
        pdn: p.b.pd,
        mw_type,
    }) else {
        unreachable!()
    };
    rkey
}

fn bind1(mw: u32, mr: &Mem, off: u64, length: u64, access: u32) -> Command {
    Command::BindMw(BindMw {
        rkey: mw,
        lkey: mr.lkey,
        addr: mr.addr + off,
        length,
        access,
    })
}

/// RDMA WRITE of 8 bytes from `p.ma` to `addr` through `rkey`; its
/// completion's status.
fn write(p: &Pair, wr_id: u64, addr: u64, rkey: u32) -> u32 {
    let s = [p.ma.sge(0, 8)];
    p.send(&SendWr {
        sges: &s,
        remote_addr: addr,
        rkey,
        ..signaled(wr_id, IV_WR_RDMA_WRITE)
    });
    one(&p.cqa).status
}

/// RDMA READ of 8 bytes at `addr` through `rkey` into `p.ma` at 64.
fn read(p: &Pair, wr_id: u64, addr: u64, rkey: u32) -> u32 {
    let s = [p.ma.sge(64, 8)];
    p.send(&SendWr {
        sges: &s,
        remote_addr: addr,
        rkey,
        ..signaled(wr_id, IV_WR_RDMA_READ)
    });
    one(&p.cqa).status
}

#[test]
fn type_1_window_grants_its_range_and_access_only() {
    for topo in TOPOS {
        let p = Pair::new(topo, IV_QPT_RC, Conn::default());
        let mr = p.b.mem(8192, ALL_ACCESS);
        let mw = alloc(&p, IV_MW_TYPE_1);
        let CommandOut::Mw { rkey } = p.b.d.ok(bind1(mw, &mr, 4096, 64, ALL_REMOTE)) else {
            unreachable!()
        };
        assert_ne!(rkey, mw, "a bind gives a new key");
        p.ma.write(0, b"through!");
        assert_eq!(
            write(&p, 1, mr.addr + 4096, rkey),
            IV_WC_SUCCESS,
            "{topo:?}"
        );
        assert_eq!(mr.read(4096, 8), b"through!");
        mr.write(4096 + 56, b"readback");
        assert_eq!(read(&p, 2, mr.addr + 4096 + 56, rkey), IV_WC_SUCCESS);
        assert_eq!(p.ma.read(64, 8), b"readback");
        // The MR refuses deregistration while the window is bound.
        p.b.d
            .fails(Command::DeregMr { lkey: mr.lkey }, STATUS_DEVICE_BUSY);
        // One byte past the window (inside the MR): refused, the QP in ERR.
        assert_eq!(
            write(&p, 3, mr.addr + 4096 + 57, rkey),
            IV_WC_REM_ACCESS_ERR,
            "{topo:?}"
        );
        assert_eq!(mr.read(4096 + 56, 8), b"readback", "nothing written");
    }
    // Access the window does not grant; the old key after a rebind; an
    // unbound window.
    let p = Pair::new(crate::tests::dp::Topo::Loopback, IV_QPT_RC, Conn::default());
    let mr = p.b.mem(8192, ALL_ACCESS);
    let mw = alloc(&p, IV_MW_TYPE_1);
    let CommandOut::Mw { rkey } = p.b.d.ok(bind1(mw, &mr, 0, 64, IV_ACCESS_REMOTE_READ)) else {
        unreachable!()
    };
    assert_eq!(read(&p, 1, mr.addr, rkey), IV_WC_SUCCESS);
    assert_eq!(write(&p, 2, mr.addr, rkey), IV_WC_REM_ACCESS_ERR);
    for case in 0..2 {
        let p = Pair::new(crate::tests::dp::Topo::Loopback, IV_QPT_RC, Conn::default());
        let mr = p.b.mem(8192, ALL_ACCESS);
        let mw = alloc(&p, IV_MW_TYPE_1);
        let CommandOut::Mw { rkey: old } = p.b.d.ok(bind1(mw, &mr, 0, 64, ALL_REMOTE)) else {
            unreachable!()
        };
        let CommandOut::Mw { rkey: new } = p.b.d.ok(bind1(
            old,
            &mr,
            0,
            if case == 0 { 64 } else { 0 },
            ALL_REMOTE,
        )) else {
            unreachable!()
        };
        assert_ne!(new, old);
        if case == 1 {
            // Unbound (length 0): the MR goes.
            p.b.d.ok(Command::DeregMr { lkey: mr.lkey });
        }
        assert_eq!(
            write(&p, 3, mr.addr, old),
            IV_WC_REM_ACCESS_ERR,
            "case {case}"
        );
    }
}

const ALL_REMOTE: u32 = IV_ACCESS_MW_ALL;

/// A bad bind command gets its status and changes nothing (the window
/// stays unbound, the MR counts no window).
#[test]
fn type_1_bind_rules() {
    let p = Pair::new(crate::tests::dp::Topo::Loopback, IV_QPT_RC, Conn::default());
    let mr = p.b.mem(8192, ALL_ACCESS);
    let no_bind =
        p.b.mem(8192, IV_ACCESS_LOCAL_WRITE | IV_ACCESS_REMOTE_WRITE);
    let read_only = p.b.mem(8192, IV_ACCESS_MW_BIND | IV_ACCESS_REMOTE_READ);
    let other_pd = p.b.d.pd();
    let other = p.b.mem_in(other_pd, 8192, ALL_ACCESS);
    let mw = alloc(&p, IV_MW_TYPE_1);
    let mw2 = alloc(&p, IV_MW_TYPE_2);
    let cases = [
        (
            bind1(mw, &no_bind, 0, 8, IV_ACCESS_REMOTE_READ),
            STATUS_ACCESS_DENIED,
        ),
        (
            bind1(mw, &read_only, 0, 8, IV_ACCESS_REMOTE_WRITE),
            STATUS_ACCESS_DENIED,
        ),
        (
            bind1(mw, &read_only, 0, 8, IV_ACCESS_REMOTE_ATOMIC),
            STATUS_ACCESS_DENIED,
        ),
        (
            bind1(mw, &mr, 0, 8, IV_ACCESS_LOCAL_WRITE),
            STATUS_INVALID_PARAMETER,
        ),
        (
            bind1(mw, &mr, 0, 8, IV_ACCESS_MW_BIND),
            STATUS_INVALID_PARAMETER,
        ),
        (
            bind1(mw, &mr, 8190, 8, IV_ACCESS_REMOTE_READ),
            STATUS_INVALID_PARAMETER,
        ),
        (
            bind1(mw, &mr, 0, u64::MAX, IV_ACCESS_REMOTE_READ),
            STATUS_INVALID_PARAMETER,
        ),
        (
            bind1(mw, &other, 0, 8, IV_ACCESS_REMOTE_READ),
            STATUS_INVALID_PARAMETER_MIX,
        ),
        (
            bind1(mw2, &mr, 0, 8, IV_ACCESS_REMOTE_READ),
            STATUS_INVALID_PARAMETER,
        ),
        (
            bind1(mr.lkey, &mr, 0, 8, IV_ACCESS_REMOTE_READ),
            STATUS_INVALID_HANDLE,
        ),
        (
            bind1(mw ^ 0x100, &mr, 0, 8, IV_ACCESS_REMOTE_READ),
            STATUS_INVALID_HANDLE,
        ),
    ];
    let before = p.b.d.snapshot();
    for (cmd, status) in cases {
        p.b.d.fails(cmd.clone(), status);
        assert!(p.b.d.snapshot() == before, "{cmd:?} changed nothing");
    }
    // Allocation rules; a window holds its PD.
    p.b.d.fails(
        Command::AllocMw {
            pdn: p.b.pd,
            mw_type: 3,
        },
        STATUS_INVALID_PARAMETER,
    );
    p.b.d.fails(
        Command::AllocMw { pdn: 0, mw_type: 1 },
        STATUS_INVALID_HANDLE,
    );
    p.b.d
        .fails(Command::DeallocPd { pdn: other_pd }, STATUS_DEVICE_BUSY);
    // Deallocating a bound window unbinds it: its MR goes then.
    p.b.d.ok(bind1(mw, &mr, 0, 8, IV_ACCESS_REMOTE_READ));
    p.b.d
        .fails(Command::DeregMr { lkey: mr.lkey }, STATUS_DEVICE_BUSY);
    p.b.d.ok(Command::DeallocMw { rkey: mw });
    p.b.d
        .fails(Command::DeallocMw { rkey: mw }, STATUS_INVALID_HANDLE);
    p.b.d.ok(Command::DeregMr { lkey: mr.lkey });
}

/// A type 2 window: bound by the responder QP's work request, honoured
/// for that QP's peer, gone after a local invalidate or a SEND with
/// invalidate; a new bind with a new key works again.
#[test]
fn type_2_window_bound_and_invalidated_by_work_requests() {
    for topo in TOPOS {
        let p = Pair::new(topo, IV_QPT_RC, Conn::default());
        let mr = p.b.mem(8192, ALL_ACCESS);
        let rkey = p.window(&mr, 128, 64, ALL_REMOTE);
        assert!(
            p.cqb.poll().is_empty(),
            "an unsignaled bind completes silently"
        );
        p.ma.write(0, b"window 2");
        assert_eq!(write(&p, 1, mr.addr + 128, rkey), IV_WC_SUCCESS, "{topo:?}");
        assert_eq!(mr.read(128, 8), b"window 2");
        p.b.d
            .fails(Command::DeregMr { lkey: mr.lkey }, STATUS_DEVICE_BUSY);
        // Local invalidate by the responder QP, signaled.
        p.b.post(
            &p.qb,
            &SendWr {
                imm_or_inv: rkey,
                ..signaled(50, IV_WR_LOCAL_INV)
            },
        );
        p.settle();
        let c = one(&p.cqb);
        assert_eq!(
            (c.wr_id, c.status, c.opcode),
            (50, IV_WC_SUCCESS, IV_WC_OP_LOCAL_INV)
        );
        // Its MR counts no window now.
        p.b.d.ok(Command::DeregMr { lkey: mr.lkey });
        assert_eq!(
            write(&p, 2, mr.addr + 128, rkey),
            IV_WC_REM_ACCESS_ERR,
            "{topo:?}"
        );
    }
    // SEND with invalidate, then a bind of the same window with a new key.
    let p = Pair::new(crate::tests::dp::Topo::TwoHca, IV_QPT_RC, Conn::default());
    let mr = p.b.mem(8192, ALL_ACCESS);
    let rkey = p.window(&mr, 0, 64, ALL_REMOTE);
    assert_eq!(write(&p, 1, mr.addr, rkey), IV_WC_SUCCESS);
    p.recv(7, &[p.mb.sge(0, 64)]);
    p.send(&SendWr {
        inline: Some(b"bye"),
        imm_or_inv: rkey,
        ..signaled(2, IV_WR_SEND_WITH_INV)
    });
    assert_eq!(one(&p.cqa).status, IV_WC_SUCCESS);
    let r = one(&p.cqb);
    assert_eq!(
        (r.status, r.wc_flags, r.imm_or_inv),
        (IV_WC_SUCCESS, IV_WC_WITH_INV, rkey)
    );
    assert_eq!(write(&p, 3, mr.addr, rkey), IV_WC_REM_ACCESS_ERR);
}

/// The bind rules of `IV_WR_BIND_MW`, each a `MW_BIND_ERR` completion;
/// a local invalidate of an MR's key is a `LOC_QP_OP_ERR`.
#[test]
fn type_2_bind_rules() {
    let cases: [fn(&Pair, &Mem, u32) -> SendWr<'static>; 6] = [
        // A type 1 window.
        |p, mr, _| {
            bind_wr(
                alloc(p, IV_MW_TYPE_1),
                mr.lkey,
                mr.addr,
                8,
                IV_ACCESS_REMOTE_READ,
            )
        },
        // Zero length.
        |_, mr, mw| bind_wr(mw, mr.lkey, mr.addr, 0, IV_ACCESS_REMOTE_READ),
        // Past the MR.
        |_, mr, mw| bind_wr(mw, mr.lkey, mr.addr + 8190, 8, IV_ACCESS_REMOTE_READ),
        // A local access flag.
        |_, mr, mw| bind_wr(mw, mr.lkey, mr.addr, 8, IV_ACCESS_LOCAL_WRITE),
        // An MR without MW_BIND.
        |p, _, mw| {
            let m = p.b.mem(8192, IV_ACCESS_LOCAL_WRITE | IV_ACCESS_REMOTE_READ);
            bind_wr(mw, m.lkey, m.addr, 8, IV_ACCESS_REMOTE_READ)
        },
        // An MR of another PD.
        |p, _, mw| {
            let pd = p.b.d.pd();
            let m = p.b.mem_in(pd, 8192, ALL_ACCESS);
            bind_wr(mw, m.lkey, m.addr, 8, IV_ACCESS_REMOTE_READ)
        },
    ];
    for (i, case) in cases.iter().enumerate() {
        let p = Pair::new(crate::tests::dp::Topo::Loopback, IV_QPT_RC, Conn::default());
        let mr = p.b.mem(8192, ALL_ACCESS);
        let mw = alloc(&p, IV_MW_TYPE_2);
        p.b.post(&p.qb, &case(&p, &mr, mw));
        p.settle();
        let c = one(&p.cqb);
        assert_eq!(
            (c.status, c.opcode),
            (IV_WC_MW_BIND_ERR, IV_WC_OP_BIND_MW),
            "case {i}"
        );
        p.b.d.ok(Command::DeregMr { lkey: mr.lkey });
    }
    // A window bound already.
    let p = Pair::new(crate::tests::dp::Topo::Loopback, IV_QPT_RC, Conn::default());
    let mr = p.b.mem(8192, ALL_ACCESS);
    let rkey = p.window(&mr, 0, 64, ALL_REMOTE);
    p.b.post(
        &p.qb,
        &bind_wr(rkey ^ 1, mr.lkey, mr.addr, 8, IV_ACCESS_REMOTE_READ),
    );
    assert_eq!(one(&p.cqb).status, IV_WC_MW_BIND_ERR);
    // Local invalidate of an MR's key.
    let p = Pair::new(crate::tests::dp::Topo::Loopback, IV_QPT_RC, Conn::default());
    p.b.post(
        &p.qb,
        &SendWr {
            imm_or_inv: p.mb.lkey,
            ..signaled(9, IV_WR_LOCAL_INV)
        },
    );
    assert_eq!(one(&p.cqb).status, IV_WC_LOC_QP_OP_ERR);
}

fn bind_wr(rkey: u32, lkey: u32, addr: u64, len: u64, access: u32) -> SendWr<'static> {
    SendWr {
        rkey: (rkey & !0xFF) | (rkey.wrapping_add(7) & 0xFF),
        imm_or_inv: lkey,
        remote_addr: addr,
        compare_add: len,
        swap: u64::from(access),
        ..signaled(40, IV_WR_BIND_MW)
    }
}

/// A SEND with invalidate naming an ordinary MR is refused (the requester
/// completes with REM_INV_REQ_ERR, the responder's receive too) and the
/// MR keeps working: remote invalidation does not kill it.
#[test]
fn send_with_invalidate_of_an_mr_is_refused_and_the_mr_lives() {
    for topo in TOPOS {
        let p = Pair::new(topo, IV_QPT_RC, Conn::default());
        let victim = p.b.mem(4096, ALL_ACCESS);
        p.recv(7, &[p.mb.sge(0, 64)]);
        p.send(&SendWr {
            inline: Some(b"no"),
            imm_or_inv: victim.lkey,
            ..signaled(1, IV_WR_SEND_WITH_INV)
        });
        assert_eq!(one(&p.cqa).status, IV_WC_REM_INV_REQ_ERR, "{topo:?}");
        assert_eq!(one(&p.cqb).status, IV_WC_REM_INV_REQ_ERR, "{topo:?}");
        // A second connection between the same HCAs: the MR still takes a
        // WRITE through its rkey.
        let c = Conn::default();
        let qa =
            p.a.qp_full(p.a.pd, IV_QPT_RC, &p.cqa, &p.cqa, None, false, BIG);
        let qb =
            p.b.qp_full(p.b.pd, IV_QPT_RC, &p.cqb, &p.cqb, None, false, BIG);
        p.a.connect(&qa, p.b.gid(), qb.qpn, &c);
        p.b.connect(&qb, p.a.gid(), qa.qpn, &c);
        p.settle();
        p.a.events();
        p.b.events();
        p.ma.write(0, b"survives");
        let s = [p.ma.sge(0, 8)];
        p.a.post(
            &qa,
            &SendWr {
                sges: &s,
                remote_addr: victim.addr,
                rkey: victim.lkey,
                ..signaled(2, IV_WR_RDMA_WRITE)
            },
        );
        p.settle();
        assert_eq!(one(&p.cqa).status, IV_WC_SUCCESS, "{topo:?}");
        assert_eq!(victim.read(0, 8), b"survives", "{topo:?}");
    }
}

/// Two more QPs between the same HCAs as `p`'s, `b`'s on PD `pdb`
/// (sharing `p`'s CQs): `(requester, responder)`.
fn second_pair(p: &Pair, pdb: u32) -> (crate::tests::dp::Ep, crate::tests::dp::Ep) {
    let c = Conn::default();
    let qa =
        p.a.qp_full(p.a.pd, IV_QPT_RC, &p.cqa, &p.cqa, None, false, BIG);
    let qb =
        p.b.qp_full(pdb, IV_QPT_RC, &p.cqb, &p.cqb, None, false, BIG);
    p.a.connect(&qa, p.b.gid(), qb.qpn, &c);
    p.b.connect(&qb, p.a.gid(), qa.qpn, &c);
    p.settle();
    p.a.events();
    p.b.events();
    (qa, qb)
}

/// A WRITE of 8 bytes from `p.ma` on `qa` to `addr` through `rkey`.
fn write_on(p: &Pair, qa: &crate::tests::dp::Ep, wr_id: u64, addr: u64, rkey: u32) -> u32 {
    let s = [p.ma.sge(0, 8)];
    p.a.post(
        qa,
        &SendWr {
            sges: &s,
            remote_addr: addr,
            rkey,
            ..signaled(wr_id, IV_WR_RDMA_WRITE)
        },
    );
    p.settle();
    one(&p.cqa).status
}

/// A type 2 window is honoured by the responder of the QP that bound it
/// only: another QP of the same PD gets REM_ACCESS_ERR through its rkey.
/// A type 1 window is honoured by any QP of its PD, and by no QP of
/// another PD.
#[test]
fn windows_are_honoured_by_their_qp_or_pd_only() {
    for topo in TOPOS {
        let p = Pair::new(topo, IV_QPT_RC, Conn::default());
        let mr = p.b.mem(8192, ALL_ACCESS);
        let rkey = p.window(&mr, 0, 64, ALL_REMOTE);
        let (qa2, _qb2) = second_pair(&p, p.b.pd);
        assert_eq!(
            write_on(&p, &qa2, 1, mr.addr, rkey),
            IV_WC_REM_ACCESS_ERR,
            "{topo:?}: another QP"
        );
        assert_eq!(
            write(&p, 2, mr.addr, rkey),
            IV_WC_SUCCESS,
            "{topo:?}: its QP"
        );
    }
    for topo in TOPOS {
        let p = Pair::new(topo, IV_QPT_RC, Conn::default());
        let mr = p.b.mem(8192, ALL_ACCESS);
        let mw = alloc(&p, IV_MW_TYPE_1);
        let CommandOut::Mw { rkey } = p.b.d.ok(bind1(mw, &mr, 0, 64, ALL_REMOTE)) else {
            unreachable!()
        };
        let (same_pd, _q) = second_pair(&p, p.b.pd);
        assert_eq!(
            write_on(&p, &same_pd, 1, mr.addr, rkey),
            IV_WC_SUCCESS,
            "{topo:?}"
        );
        let other_pd = p.b.d.pd();
        let (other, _q) = second_pair(&p, other_pd);
        assert_eq!(
            write_on(&p, &other, 2, mr.addr, rkey),
            IV_WC_REM_ACCESS_ERR,
            "{topo:?}: a QP of another PD"
        );
    }
}
