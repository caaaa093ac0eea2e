//! Fast-register MRs end to end (docs/fast-registration.md): allocated
//! free, registered by the responder QP's `IV_WR_REG_MR` with a key and a
//! page list, used remotely with that key, invalidated locally or by a
//! SEND with invalidate, registered again with another key; the rules of
//! each, and the busy rules.

use alloc::vec::Vec;

use irpverbs_abi::*;
use irpverbs_core::{Command, CommandOut};
use irpverbs_ring::wq::SendWr;

use crate::tests::dp::{ALL_ACCESS, BIG, Conn, Mem, Pair, TOPOS, Topo, one, pattern, signaled};

const PAGE: u64 = 4096;

/// A free fast-register MR of `p.b`'s PD for `max` pages: its key.
fn alloc(p: &Pair, max: u32) -> u32 {
    let CommandOut::Mr { lkey, rkey } = p.b.d.ok(Command::AllocMr {
        pdn: p.b.pd,
        max_pages: max,
    }) else {
        unreachable!()
    };
    assert_eq!(lkey, rkey);
    lkey
}

/// The page list of `n` pages of `mem` from page `first`.
fn pages(mem: &Mem, first: u64, n: u64) -> Vec<IvSge> {
    (first..first + n)
        .map(|i| IvSge {
            addr: mem.addr + i * PAGE,
            length: PAGE as u32,
            lkey: mem.lkey,
        })
        .collect()
}

/// An `IV_WR_REG_MR` of the MR `key` names, with key byte `byte`:
/// `length` bytes at `iova` with `access`, over `list`.
fn reg_wr(key: u32, byte: u8, iova: u64, length: u64, access: u32, list: &[IvSge]) -> SendWr<'_> {
    SendWr {
        sges: list,
        rkey: (key & !0xFF) | u32::from(byte),
        remote_addr: iova,
        compare_add: length,
        swap: u64::from(access),
        imm_or_inv: PAGE as u32,
        ..signaled(60, IV_WR_REG_MR)
    }
}

/// Posts `wr` on the responder QP and returns its completion's status and
/// opcode.
fn post_b(p: &Pair, wr: &SendWr<'_>) -> (u32, u32) {
    p.b.post(&p.qb, wr);
    p.settle();
    let c = one(&p.cqb);
    (c.status, c.opcode)
}

/// RDMA WRITE of `bytes` from `p.ma` to `addr` through `rkey`.
fn write(p: &Pair, wr_id: u64, addr: u64, rkey: u32, bytes: &[u8]) -> u32 {
    p.ma.write(0, bytes);
    let s = [p.ma.sge(0, bytes.len() as u32)];
    p.send(&SendWr {
        sges: &s,
        remote_addr: addr,
        rkey,
        ..signaled(wr_id, IV_WR_RDMA_WRITE)
    });
    one(&p.cqa).status
}

/// RDMA READ of `len` bytes at `addr` through `rkey` into `p.ma` at 256.
fn read(p: &Pair, wr_id: u64, addr: u64, rkey: u32, len: u32) -> (u32, Vec<u8>) {
    let s = [p.ma.sge(256, len)];
    p.send(&SendWr {
        sges: &s,
        remote_addr: addr,
        rkey,
        ..signaled(wr_id, IV_WR_RDMA_READ)
    });
    (one(&p.cqa).status, p.ma.read(256, len as usize))
}

/// A `topo` pair whose responder holds a 4-page MR and a fast-register
/// MR (for 2 pages) registered with key byte `byte` over its page 0, at
/// `iova` for `len` bytes with `access`: the pair, the backing MR and the
/// fast-register MR's `ALLOC_MR` key.
fn registered(topo: Topo, byte: u8, (iova, len): (u64, u64), access: u32) -> (Pair, Mem, u32) {
    let p = Pair::new(topo, IV_QPT_RC, Conn::default());
    let mem = p.b.mem(4 * PAGE, ALL_ACCESS);
    let key = alloc(&p, 2);
    let list = pages(&mem, 0, 1);
    let st = post_b(&p, &reg_wr(key, byte, iova, len, access, &list));
    assert_eq!(st, (IV_WC_SUCCESS, IV_WC_OP_REG_MR), "{topo:?}");
    (p, mem, key)
}

/// A window of `p`'s responder QP over bytes 16..48 of the fast-register
/// MR registered at 0x8000 with key `lkey` over `mem`'s page 0.
fn window_over(p: &Pair, mem: &Mem, lkey: u32) -> u32 {
    let view = Mem {
        lkey,
        addr: 0x8000,
        len: 256,
        region: mem.region.clone(),
    };
    p.window(&view, 16, 32, IV_ACCESS_REMOTE_WRITE)
}

fn local_inv(rkey: u32) -> SendWr<'static> {
    SendWr {
        imm_or_inv: rkey,
        ..signaled(70, IV_WR_LOCAL_INV)
    }
}

/// The access flags of the registrations below.
const RW: u32 = IV_ACCESS_LOCAL_WRITE | IV_ACCESS_REMOTE_WRITE | IV_ACCESS_REMOTE_READ;

/// The MR `key` names with key byte `byte`.
const fn rekey(key: u32, byte: u8) -> u32 {
    (key & !0xFF) | byte as u32
}

/// Allocated, registered with a key, written and read remotely at an
/// iova of the ULP's choosing (across a page boundary), invalidated
/// locally, registered again with another key over other pages: the old
/// key grants nothing, the new one does; the backing MR is busy while
/// mapped, and free again once the MR is deregistered (by its handle's
/// key, whatever its key is now).
#[test]
fn register_use_invalidate_and_register_again() {
    for topo in TOPOS {
        let p = Pair::new(topo, IV_QPT_RC, Conn::default());
        let mem = p.b.mem(8 * PAGE, ALL_ACCESS);
        let key = alloc(&p, 4);
        let iova = 0x7000_0000_0F00;
        let list = pages(&mem, 2, 2);
        let st = post_b(&p, &reg_wr(key, 0x5A, iova, 512, RW, &list));
        assert_eq!(st, (IV_WC_SUCCESS, IV_WC_OP_REG_MR), "{topo:?}");
        let first = rekey(key, 0x5A);
        assert_ne!(first, key);
        // Across the page boundary at iova + 0x100: page 0 holds the
        // iova's offset 0xF00.
        let data = *b"0123456789abcdefFEDCBA9876543210";
        assert_eq!(write(&p, 2, iova + 0xF0, first, &data), IV_WC_SUCCESS);
        assert_eq!(mem.read(2 * PAGE as usize + 0xFF0, 32), data);
        let (st, back) = read(&p, 3, iova + 0xF0, first, 32);
        assert_eq!((st, back), (IV_WC_SUCCESS, data.to_vec()), "{topo:?}");
        p.b.d
            .fails(Command::DeregMr { lkey: mem.lkey }, STATUS_DEVICE_BUSY);
        // Invalidated, then registered again with another key over pages
        // 5 and 6.
        let st = post_b(&p, &local_inv(first));
        assert_eq!(st, (IV_WC_SUCCESS, IV_WC_OP_LOCAL_INV), "{topo:?}");
        let list = pages(&mem, 5, 2);
        let st = post_b(&p, &reg_wr(key, 0xA5, 0x2000, 2 * PAGE, RW, &list));
        assert_eq!(st.0, IV_WC_SUCCESS, "{topo:?}");
        let second = rekey(key, 0xA5);
        assert_eq!(
            write(&p, 4, 0x2000 + PAGE, second, b"page six"),
            IV_WC_SUCCESS
        );
        assert_eq!(mem.read(6 * PAGE as usize, 8), b"page six");
        // Deregistered by the key ALLOC_MR gave: the backing MR is free.
        p.b.d.ok(Command::DeregMr { lkey: key });
        p.b.d.ok(Command::DeregMr { lkey: mem.lkey });
        // The old key, after the re-registration: nothing.
        let p = Pair::new(topo, IV_QPT_RC, Conn::default());
        let mem = p.b.mem(8 * PAGE, ALL_ACCESS);
        let key = alloc(&p, 4);
        let list = pages(&mem, 0, 1);
        assert_eq!(
            post_b(&p, &reg_wr(key, 1, 0, 64, RW, &list)).0,
            IV_WC_SUCCESS
        );
        assert_eq!(post_b(&p, &local_inv(rekey(key, 1))).0, IV_WC_SUCCESS);
        assert_eq!(
            post_b(&p, &reg_wr(key, 2, 0, 64, RW, &list)).0,
            IV_WC_SUCCESS
        );
        assert_eq!(
            write(&p, 5, 0, rekey(key, 1), b"old key!"),
            IV_WC_REM_ACCESS_ERR,
            "{topo:?}"
        );
        assert_eq!(mem.read(0, 8), [0; 8], "nothing written");
    }
}

/// A free MR's key names nothing, remotely or locally.
#[test]
fn a_free_mr_grants_nothing() {
    for topo in TOPOS {
        let p = Pair::new(topo, IV_QPT_RC, Conn::default());
        let key = alloc(&p, 4);
        assert_eq!(
            write(&p, 1, 0, key, b"free"),
            IV_WC_REM_ACCESS_ERR,
            "{topo:?}"
        );
    }
    let p = Pair::new(Topo::Loopback, IV_QPT_RC, Conn::default());
    let key = alloc(&p, 4);
    // As a local SGE of the responder QP's SEND.
    let s = [IvSge {
        addr: 0,
        length: 8,
        lkey: key,
    }];
    let st = post_b(
        &p,
        &SendWr {
            sges: &s,
            ..signaled(80, IV_WR_SEND)
        },
    );
    assert_eq!(st.0, IV_WC_LOC_PROT_ERR);
}

/// Each rule of `IV_WR_REG_MR`: the completion's status, on a pair of its
/// own (the QP goes to ERR); the MR stays free.
#[test]
fn registration_rules() {
    type Case = fn(&Pair, &Mem, u32) -> (u32, u8, u64, u64, u32, Vec<IvSge>, u32);
    let cases: [(&str, Case, u32); 12] = [
        (
            "a page list longer than max_num_sg",
            |_, m, k| (k, 1, 0, 64, RW, pages(m, 0, 3), PAGE as u32),
            IV_WC_LOC_QP_OP_ERR,
        ),
        (
            "pages that do not hold the length",
            |_, m, k| (k, 1, 0, PAGE + 1, RW, pages(m, 0, 1), PAGE as u32),
            IV_WC_LOC_QP_OP_ERR,
        ),
        (
            "the iova's offset pushes the length past the pages",
            |_, m, k| (k, 1, 8, PAGE, RW, pages(m, 0, 1), PAGE as u32),
            IV_WC_LOC_QP_OP_ERR,
        ),
        (
            "a page size that is not a power of two",
            |_, m, k| (k, 1, 0, 64, RW, pages(m, 0, 1), 3000),
            IV_WC_LOC_QP_OP_ERR,
        ),
        (
            "a page not aligned",
            |_, m, k| {
                let mut l = pages(m, 0, 1);
                l[0].addr += 8;
                (k, 1, 0, 64, RW, l, PAGE as u32)
            },
            IV_WC_LOC_QP_OP_ERR,
        ),
        (
            "remote write without local write",
            |_, m, k| {
                (
                    k,
                    1,
                    0,
                    64,
                    IV_ACCESS_REMOTE_WRITE,
                    pages(m, 0, 1),
                    PAGE as u32,
                )
            },
            IV_WC_LOC_QP_OP_ERR,
        ),
        (
            "an MR's key that is not a fast-register MR's",
            |_, m, _| (m.lkey, 1, 0, 64, RW, pages(m, 0, 1), PAGE as u32),
            IV_WC_LOC_QP_OP_ERR,
        ),
        (
            "a fast-register MR of another PD",
            |p, m, _| {
                let pd = p.b.d.pd();
                let CommandOut::Mr { lkey, .. } = p.b.d.ok(Command::AllocMr {
                    pdn: pd,
                    max_pages: 2,
                }) else {
                    unreachable!()
                };
                (lkey, 1, 0, 64, RW, pages(m, 0, 1), PAGE as u32)
            },
            IV_WC_LOC_QP_OP_ERR,
        ),
        (
            "pages of two MRs",
            |p, m, k| {
                let other = p.b.mem(2 * PAGE, ALL_ACCESS);
                let mut l = pages(m, 0, 1);
                l.extend(pages(&other, 0, 1));
                (k, 1, 0, 2 * PAGE, RW, l, PAGE as u32)
            },
            IV_WC_LOC_PROT_ERR,
        ),
        (
            "a page outside its MR",
            |_, m, k| (k, 1, 0, 64, RW, pages(m, 8, 1), PAGE as u32),
            IV_WC_LOC_PROT_ERR,
        ),
        (
            "a page of an MR of another PD",
            |p, _, k| {
                let pd = p.b.d.pd();
                let other = p.b.mem_in(pd, 2 * PAGE, ALL_ACCESS);
                (k, 1, 0, 64, RW, pages(&other, 0, 1), PAGE as u32)
            },
            IV_WC_LOC_PROT_ERR,
        ),
        (
            "a writing registration over a read-only MR",
            |p, _, k| {
                let ro = p.b.mem(2 * PAGE, IV_ACCESS_REMOTE_READ);
                (k, 1, 0, 64, RW, pages(&ro, 0, 1), PAGE as u32)
            },
            IV_WC_LOC_PROT_ERR,
        ),
    ];
    for (what, case, status) in cases {
        let p = Pair::new(Topo::Loopback, IV_QPT_RC, Conn::default());
        let mem = p.b.mem(8 * PAGE, ALL_ACCESS);
        let key = alloc(&p, 2);
        let (k, byte, iova, len, access, list, page) = case(&p, &mem, key);
        let wr = SendWr {
            imm_or_inv: page,
            ..reg_wr(k, byte, iova, len, access, &list)
        };
        let st = post_b(&p, &wr);
        assert_eq!(st, (status, IV_WC_OP_REG_MR), "{what}");
        // Nothing mapped: the backing MR goes, the MR is free.
        p.b.d.ok(Command::DeregMr { lkey: mem.lkey });
        let snapshot = p.b.d.snapshot();
        let mr = snapshot.mrs.get(key >> 8).unwrap();
        assert_eq!(
            (mr.fast.as_ref().unwrap().backing, mr.access),
            (None, 0),
            "{what}"
        );
    }
    // A registration of a valid MR (it must be invalidated first).
    let p = Pair::new(Topo::Loopback, IV_QPT_RC, Conn::default());
    let mem = p.b.mem(8 * PAGE, ALL_ACCESS);
    let key = alloc(&p, 2);
    let list = pages(&mem, 0, 1);
    assert_eq!(
        post_b(&p, &reg_wr(key, 1, 0, 64, RW, &list)).0,
        IV_WC_SUCCESS
    );
    let st = post_b(&p, &reg_wr(key, 2, 0, 64, RW, &list));
    assert_eq!(st, (IV_WC_LOC_QP_OP_ERR, IV_WC_OP_REG_MR));
    let snapshot = p.b.d.snapshot();
    assert_eq!(
        snapshot.mrs.generation(key >> 8),
        Ok(1),
        "the refused key was not taken"
    );
}

/// Accesses the registration does not grant: beyond its length, below its
/// iova, an access right it lacks.
#[test]
fn accesses_beyond_the_registration_are_refused() {
    type Case = fn(&Pair, u32) -> u32;
    let cases: [(&str, Case); 3] = [
        ("past the length", |p, k| {
            write(p, 1, 0x1_0000 + 60, k, b"12345678")
        }),
        ("below the iova", |p, k| write(p, 1, 0x1_0000 - 1, k, b"12")),
        ("a right it lacks", |p, k| read(p, 1, 0x1_0000, k, 8).0),
    ];
    for (what, case) in cases {
        let p = Pair::new(Topo::Loopback, IV_QPT_RC, Conn::default());
        let mem = p.b.mem(2 * PAGE, ALL_ACCESS);
        let key = alloc(&p, 2);
        let list = pages(&mem, 0, 1);
        let access = IV_ACCESS_LOCAL_WRITE | IV_ACCESS_REMOTE_WRITE;
        let st = post_b(&p, &reg_wr(key, 9, 0x1_0000, 64, access, &list));
        assert_eq!(st.0, IV_WC_SUCCESS);
        assert_eq!(case(&p, rekey(key, 9)), IV_WC_REM_ACCESS_ERR, "{what}");
        assert_eq!(mem.read(0, 80), [0; 80], "{what}: nothing written");
    }
}

/// A SEND with invalidate of a valid fast-register MR frees it (the
/// receive completion names it); its key grants nothing afterwards, and
/// the MR takes a registration again.
#[test]
fn send_with_invalidate_frees_a_fast_register_mr() {
    for topo in TOPOS {
        let p = Pair::new(topo, IV_QPT_RC, Conn::default());
        let mem = p.b.mem(4 * PAGE, ALL_ACCESS);
        let key = alloc(&p, 2);
        let list = pages(&mem, 1, 1);
        assert_eq!(
            post_b(&p, &reg_wr(key, 3, 0, 64, RW, &list)).0,
            IV_WC_SUCCESS
        );
        let k = rekey(key, 3);
        assert_eq!(write(&p, 1, 0, k, b"before!!"), IV_WC_SUCCESS);
        p.recv(7, &[p.mb.sge(0, 64)]);
        p.send(&SendWr {
            inline: Some(b"done"),
            imm_or_inv: k,
            ..signaled(2, IV_WR_SEND_WITH_INV)
        });
        assert_eq!(one(&p.cqa).status, IV_WC_SUCCESS, "{topo:?}");
        let r = one(&p.cqb);
        assert_eq!(
            (r.status, r.wc_flags, r.imm_or_inv),
            (IV_WC_SUCCESS, IV_WC_WITH_INV, k),
            "{topo:?}"
        );
        // Free: the backing MR may go; registered again, it works.
        let snapshot = p.b.d.snapshot();
        assert_eq!(snapshot.mrs.get(mem.lkey >> 8).unwrap().windows.count(), 0);
        assert_eq!(
            post_b(&p, &reg_wr(key, 4, 0, 64, RW, &list)).0,
            IV_WC_SUCCESS
        );
        assert_eq!(write(&p, 3, 0, rekey(key, 4), b"again!!!"), IV_WC_SUCCESS);
        assert_eq!(mem.read(PAGE as usize, 8), b"again!!!");
        assert_eq!(
            write(&p, 4, 0, k, b"old one!"),
            IV_WC_REM_ACCESS_ERR,
            "{topo:?}"
        );
    }
    // With a key byte that is not its current one: refused (class J), the
    // MR stays valid.
    let (p, _mem, key) = registered(Topo::TwoHca, 3, (0, 64), RW);
    p.recv(7, &[p.mb.sge(0, 64)]);
    p.send(&SendWr {
        inline: Some(b"no"),
        imm_or_inv: rekey(key, 4),
        ..signaled(2, IV_WR_SEND_WITH_INV)
    });
    assert_eq!(one(&p.cqa).status, IV_WC_REM_INV_REQ_ERR);
    assert_eq!(one(&p.cqb).status, IV_WC_REM_INV_REQ_ERR);
    let snapshot = p.b.d.snapshot();
    let mr = snapshot.mrs.get(key >> 8).unwrap();
    assert!(mr.fast.as_ref().unwrap().backing.is_some(), "still valid");
}

/// Local invalidation of a free MR or with an old key: `LOC_QP_OP_ERR`.
#[test]
fn local_invalidate_rules() {
    for case in 0..2 {
        let p = Pair::new(Topo::Loopback, IV_QPT_RC, Conn::default());
        let mem = p.b.mem(4 * PAGE, ALL_ACCESS);
        let key = alloc(&p, 2);
        let target = if case == 0 {
            key
        } else {
            let list = pages(&mem, 0, 1);
            assert_eq!(
                post_b(&p, &reg_wr(key, 3, 0, 64, RW, &list)).0,
                IV_WC_SUCCESS
            );
            rekey(key, 2)
        };
        let st = post_b(&p, &local_inv(target));
        assert_eq!(st, (IV_WC_LOC_QP_OP_ERR, IV_WC_OP_LOCAL_INV), "case {case}");
    }
}

/// A window bound to a valid fast-register MR makes it busy: no
/// deregistration, no invalidation; once the window is invalidated, both
/// work.
#[test]
fn a_fast_register_mr_with_a_window_is_busy() {
    let (p, mem, key) = registered(Topo::Loopback, 3, (0x8000, 256), ALL_ACCESS);
    let rkey = window_over(&p, &mem, rekey(key, 3));
    assert_eq!(write(&p, 1, 0x8000 + 16, rkey, b"via a mw"), IV_WC_SUCCESS);
    assert_eq!(mem.read(16, 8), b"via a mw");
    p.b.d
        .fails(Command::DeregMr { lkey: key }, STATUS_DEVICE_BUSY);
    assert_eq!(post_b(&p, &local_inv(rekey(key, 3))).0, IV_WC_LOC_QP_OP_ERR);
    // The same again on a fresh pair, then the window goes first.
    let (p, mem, key) = registered(Topo::Loopback, 3, (0x8000, 256), ALL_ACCESS);
    let rkey = window_over(&p, &mem, rekey(key, 3));
    assert_eq!(post_b(&p, &local_inv(rkey)).0, IV_WC_SUCCESS);
    assert_eq!(post_b(&p, &local_inv(rekey(key, 3))).0, IV_WC_SUCCESS);
    p.b.d.ok(Command::DeregMr { lkey: key });
    p.b.d.ok(Command::DeregMr { lkey: mem.lkey });
}

/// `ALLOC_MR`'s limits: `max_pages` 1 to `max_sge` (the device's
/// `max_fast_reg_page_list_len`: the page list rides in a send WR's
/// SGEs), a known PD, each refused with its status and nothing changed.
/// (`driver/host/tests/fast_reg.rs` registers a list at the limit.)
#[test]
fn alloc_limits() {
    let p = Pair::new(Topo::Loopback, IV_QPT_RC, Conn::default());
    let caps = *irpverbs_core::Hca::caps(&*p.b.d.hca);
    let max = caps.max_fast_reg_page_list_len;
    assert_eq!(max, caps.max_sge);
    assert_ne!(caps.device_cap_flags & IV_DEVICE_MEM_MGT_EXTENSIONS, 0);
    let before = p.b.d.snapshot();
    for (pdn, n, st) in [
        (p.b.pd, 0, STATUS_INVALID_PARAMETER),
        (p.b.pd, max + 1, STATUS_INVALID_PARAMETER),
        (0, 1, STATUS_INVALID_HANDLE),
    ] {
        p.b.d.fails(Command::AllocMr { pdn, max_pages: n }, st);
        assert!(p.b.d.snapshot() == before, "changed nothing");
    }
    let key = alloc(&p, max);
    p.b.d.ok(Command::DeregMr { lkey: key });
    p.b.d
        .fails(Command::DeregMr { lkey: key }, STATUS_INVALID_HANDLE);
}

/// `IV_WR_REG_MR` with inline data, or on a UD QP (which has no
/// registration work requests): `LOC_QP_OP_ERR`, the MR stays free.
#[test]
fn registration_on_ud_or_inline_is_refused() {
    for (qpt, inline) in [(IV_QPT_RC, true), (IV_QPT_UD, false)] {
        let p = Pair::new(Topo::TwoHca, qpt, Conn::default());
        let mem = p.b.mem(4 * PAGE, ALL_ACCESS);
        let key = alloc(&p, 2);
        let list = pages(&mem, 0, 1);
        let wr = SendWr {
            sges: if inline { &[] } else { &list },
            inline: inline.then_some(&b"inline"[..]),
            ud: (qpt == IV_QPT_UD).then_some((1, p.qa.qpn, 0x1111_1111)),
            ..reg_wr(key, 1, 0, 64, RW, &list)
        };
        let st = post_b(&p, &wr);
        assert_eq!(st, (IV_WC_LOC_QP_OP_ERR, IV_WC_OP_REG_MR), "type {qpt}");
        let snapshot = p.b.d.snapshot();
        let mr = snapshot.mrs.get(key >> 8).unwrap();
        assert_eq!(mr.fast.as_ref().unwrap().backing, None, "type {qpt}");
    }
}

/// The backing memory's offset of byte `x` of a registration at an iova
/// `offset` bytes into its first page, over the backing pages `list`.
fn backing_offset(list: &[u64], offset: u64, x: u64) -> usize {
    let at = offset + x;
    (list[(at / PAGE) as usize] * PAGE + at % PAGE) as usize
}

/// The bytes `x..x + len` of such a registration, read from the backing
/// memory page by page.
fn mapped(mem: &Mem, list: &[u64], offset: u64, x: u64, len: u64) -> Vec<u8> {
    (x..x + len)
        .map(|y| mem.read(backing_offset(list, offset, y), 1)[0])
        .collect()
}

/// A page list whose pages do not follow each other (backing pages 5, 2,
/// 3, 0: one seam joined, two not), at an iova 0x100 into its first page,
/// maps page by page on every path: remote WRITE, READ and atomic through
/// its rkey; a SEND received into it and an RDMA WRITE gathered from it
/// through its lkey; a window bound across a seam. Every access that crosses a seam lands on the right
/// backing page, and nothing else of the backing memory changes.
#[test]
fn a_page_list_with_gaps_maps_page_by_page() {
    let topos = [
        Topo::Loopback,
        Topo::LoopbackFrames,
        Topo::LoopbackDeferred,
        Topo::TwoHca,
        Topo::TwoHcaDeferred,
    ];
    let backing = [5u64, 2, 3, 0];
    let offset = 0x100u64;
    let length = 4 * PAGE - offset;
    for topo in topos {
        let p = Pair::new(topo, IV_QPT_RC, Conn::default());
        let mem = p.b.mem(8 * PAGE, ALL_ACCESS);
        let key = alloc(&p, 4);
        let iova = 0x40_0000 + offset;
        let list: Vec<IvSge> = backing.iter().map(|&i| pages(&mem, i, 1)[0]).collect();
        let access = RW | IV_ACCESS_REMOTE_ATOMIC | IV_ACCESS_MW_BIND;
        let st = post_b(&p, &reg_wr(key, 0x77, iova, length, access, &list));
        assert_eq!(st, (IV_WC_SUCCESS, IV_WC_OP_REG_MR), "{topo:?}");
        let k = rekey(key, 0x77);
        let untouched = mem.read(PAGE as usize, PAGE as usize);

        // Remote WRITE of the whole range, READ back.
        let data = pattern(length as usize, 3);
        assert_eq!(write(&p, 1, iova, k, &data), IV_WC_SUCCESS, "{topo:?}");
        assert_eq!(mapped(&mem, &backing, offset, 0, length), data, "{topo:?}");
        let (st, back) = read(&p, 2, iova + 0x10, k, (length - 0x20) as u32);
        assert_eq!(st, IV_WC_SUCCESS, "{topo:?}");
        assert_eq!(back, &data[0x10..(length - 0x10) as usize], "{topo:?}");

        // An atomic in the second page (backing page 2).
        let at = PAGE - offset + 8;
        let before = mem.u64_at(backing_offset(&backing, offset, at));
        p.ma.write(512, &[0; 8]);
        let s = [p.ma.sge(512, 8)];
        p.send(&SendWr {
            sges: &s,
            remote_addr: iova + at,
            rkey: k,
            compare_add: 5,
            ..signaled(3, IV_WR_ATOMIC_FETCH_AND_ADD)
        });
        assert_eq!(one(&p.cqa).status, IV_WC_SUCCESS, "{topo:?}");
        assert_eq!(p.ma.u64_at(512), before, "{topo:?}");
        assert_eq!(
            mem.u64_at(backing_offset(&backing, offset, at)),
            before.wrapping_add(5),
            "{topo:?}"
        );

        // A SEND received into it through its lkey.
        let sent = pattern(3 * PAGE as usize, 9);
        p.recv(
            4,
            &[IvSge {
                addr: iova + 0x80,
                length: 3 * PAGE as u32,
                lkey: k,
            }],
        );
        p.ma.write(0, &sent);
        let s = [p.ma.sge(0, sent.len() as u32)];
        p.send(&SendWr {
            sges: &s,
            ..signaled(5, IV_WR_SEND)
        });
        assert_eq!(one(&p.cqa).status, IV_WC_SUCCESS, "{topo:?}");
        let c = one(&p.cqb);
        assert_eq!((c.status, c.byte_len), (IV_WC_SUCCESS, 3 * PAGE as u32));
        assert_eq!(
            mapped(&mem, &backing, offset, 0x80, 3 * PAGE),
            sent,
            "{topo:?}"
        );

        // An RDMA WRITE gathered from it (two SGEs, each across seams).
        let whole = mapped(&mem, &backing, offset, 0, length);
        let sges = [
            IvSge {
                addr: iova + 0x40,
                length: 2 * PAGE as u32,
                lkey: k,
            },
            IvSge {
                addr: iova + 2 * PAGE,
                length: (PAGE + 0x10) as u32,
                lkey: k,
            },
        ];
        let wr = SendWr {
            sges: &sges,
            remote_addr: p.ma.addr + 0x10_000,
            rkey: p.ma.lkey,
            ..signaled(6, IV_WR_RDMA_WRITE)
        };
        assert_eq!(post_b(&p, &wr), (IV_WC_SUCCESS, IV_WC_OP_RDMA_WRITE));
        let mut expect = whole[0x40..0x40 + 2 * PAGE as usize].to_vec();
        expect.extend_from_slice(&whole[2 * PAGE as usize..(3 * PAGE + 0x10) as usize]);
        assert_eq!(p.ma.read(0x10_000, expect.len()), expect, "{topo:?}");

        // Backing page 1 is not mapped: untouched.
        assert_eq!(mem.read(PAGE as usize, PAGE as usize), untouched);
        // A window bound across the first seam, written through.
        let view = Mem {
            lkey: k,
            addr: iova,
            len: length,
            region: mem.region.clone(),
        };
        let at = PAGE - offset - 16;
        let w = p.window(&view, at, 32, IV_ACCESS_REMOTE_WRITE);
        let bytes = b"through a window, across a seam!";
        assert_eq!(write(&p, 8, iova + at, w, bytes), IV_WC_SUCCESS, "{topo:?}");
        assert_eq!(mapped(&mem, &backing, offset, at, 32), bytes, "{topo:?}");

        // Beyond the registration: refused.
        assert_eq!(
            write(&p, 7, iova + length - 4, k, b"12345678"),
            IV_WC_REM_ACCESS_ERR,
            "{topo:?}"
        );
    }
}

/// An RDMA WRITE gathered from a registration whose 32 pages are mapped
/// in reverse order, 32 SGEs each across a seam: its frame has 64
/// payload pieces, more than the room a frame reserves (32), and its
/// segment list grows past that room, fallibly. With that growth refused
/// the frame is lost, as a frame whose batch cannot grow is: nothing
/// aborts, the retransmission timer sends it again, and the bytes arrive.
#[test]
fn a_frame_of_many_pieces_grows_its_segments_or_is_lost_and_sent_again() {
    const N: u64 = 32;
    let cap = IvQpCap {
        max_send_sge: N as u32,
        ..BIG
    };
    // The pair, its clock, the gather list and the bytes it names.
    let setup = || {
        let p = Pair::with_caps(Topo::LoopbackFrames, IV_QPT_RC, Conn::default(), cap, false);
        let clock = crate::tests::dp::ManualClock::attach(&p.b);
        let mem = p.b.mem(N * PAGE, ALL_ACCESS);
        let backing: Vec<u64> = (0..N).rev().collect();
        mem.write(0, &pattern((N * PAGE) as usize, 11));
        let key = alloc(&p, N as u32);
        let list: Vec<IvSge> = backing.iter().map(|&i| pages(&mem, i, 1)[0]).collect();
        let st = post_b(&p, &reg_wr(key, 9, 0, N * PAGE, RW, &list));
        assert_eq!(st, (IV_WC_SUCCESS, IV_WC_OP_REG_MR));
        let k = rekey(key, 9);
        let sges: Vec<IvSge> = (1..=N)
            .map(|i| IvSge {
                addr: i * PAGE - 0x40,
                length: if i == N { 0x40 } else { 0x80 },
                lkey: k,
            })
            .collect();
        let expect: Vec<u8> = sges
            .iter()
            .flat_map(|s| mapped(&mem, &backing, 0, s.addr, u64::from(s.length)))
            .collect();
        // A write of one piece first: the frame batch has its usual room.
        let one_piece = [IvSge {
            addr: 0,
            length: 64,
            lkey: k,
        }];
        let wr = SendWr {
            sges: &one_piece,
            remote_addr: p.ma.addr + 0x10_000,
            rkey: p.ma.lkey,
            ..signaled(0, IV_WR_RDMA_WRITE)
        };
        assert_eq!(post_b(&p, &wr).0, IV_WC_SUCCESS);
        (p, clock, sges, expect)
    };
    let write = |p: &Pair, sges: &[IvSge]| {
        p.b.post(
            &p.qb,
            &SendWr {
                sges,
                remote_addr: p.ma.addr,
                rkey: p.ma.lkey,
                ..signaled(1, IV_WR_RDMA_WRITE)
            },
        );
    };
    // Grown (the frame's segment list first, then the queues the frame
    // passes through, each past its room), and the write completes at once.
    let (p, _clock, sges, expect) = setup();
    let ((), n) = irpverbs_failalloc::counting(|| write(&p, &sges));
    assert!(n >= 1, "the segment list grows");
    let c = one(&p.cqb);
    assert_eq!((c.status, c.opcode), (IV_WC_SUCCESS, IV_WC_OP_RDMA_WRITE));
    assert_eq!(p.ma.read(0, expect.len()), expect);
    // Each of those refused in turn: the frame is lost (where its
    // segments or a queue could not grow), then sent again by the timer.
    for i in 0..n {
        let (p, clock, sges, expect) = setup();
        let dropped = p.b.d.hca.stats().packets_dropped;
        let ((), failed) = irpverbs_failalloc::failing_nth(i, || write(&p, &sges));
        assert!(failed, "allocation {i} refused");
        assert!(
            p.b.d.hca.stats().packets_dropped > dropped,
            "{i}: counted lost"
        );
        let (got, _) = clock.until_completion(&p.b, &p.cqb, 8);
        assert_eq!(got.len(), 1, "{i}");
        assert_eq!(got[0].status, IV_WC_SUCCESS, "{i}");
        assert_eq!(p.ma.read(0, expect.len()), expect, "{i}");
    }
}
