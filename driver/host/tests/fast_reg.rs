//! Fast registration through the Rust verbs library, as a kernel ULP uses
//! it (docs/fast-registration.md), over both backends (the soft HCA and
//! the model HCA): `alloc_mr` at the device's `max_fast_reg_page_list_len`
//! (one more refused, and a user-mode caller refused), a `reg_mr_wr` of
//! that many pages under a new key, an RDMA WRITE and READ through the key
//! at the last page, a SEND with invalidate that frees the MR, the old key
//! refused, a registration again with another key, and one over the pages
//! in reverse order (mapped page by page) written and read across a seam;
//! and a list with gaps (pages of the backing MR skipped and out of order)
//! reached across its seams by every kind of access: WRITE, READ, an
//! atomic, a receive's scatter list and a send's gather list. The
//! verifier on; on the model HCA every byte goes through the device's
//! IOMMU view of the backing MR.

use std::sync::Arc;

use irpverbs_abi::*;
use irpverbs_host::{Backend, HostDevice, HostDeviceConfig};
use irpverbs_verbs::{
    Client, Cq, IntoClient, Qp, SendWr, local_inv_wr, next_rkey, reg_mr_wr, rts_steps,
};

mod common;
use common::Mem;

const PAGE: u64 = 4096;

fn device(backend: Backend) -> Arc<HostDevice> {
    HostDevice::new(HostDeviceConfig {
        backend,
        ..HostDeviceConfig::default()
    })
    .expect("host device")
}

fn one(cq: &Cq<'_>) -> IvCqe {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut wc = [IvCqe::default(); 1];
    while std::time::Instant::now() < deadline {
        if cq.poll(&mut wc).unwrap() == 1 {
            return wc[0];
        }
        std::thread::yield_now();
    }
    panic!("no completion");
}

/// Two connected RC QPs of `pd` on this device, each with a CQ of its own
/// and room for `sges` SGEs per send; remote WRITE, READ and atomics
/// allowed.
fn pair(c: &Client, pd: IvHandle, sges: u32) -> (Qp<'_>, Cq<'_>, Qp<'_>, Cq<'_>) {
    let cq_in = IvCreateCqIn {
        cqe: 32,
        ..IvCreateCqIn::default()
    };
    let (cqa, cqb) = (c.new_cq(&cq_in).unwrap(), c.new_cq(&cq_in).unwrap());
    let qp_in = |cq: IvHandle| IvCreateQpIn {
        pd,
        send_cq: cq,
        recv_cq: cq,
        qp_type: IV_QPT_RC,
        cap: IvQpCap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: sges,
            max_recv_sge: 2,
            max_inline_data: 64,
            ..IvQpCap::default()
        },
        ..IvCreateQpIn::default()
    };
    let a = c.new_qp(&qp_in(cqa.handle())).unwrap();
    let b = c.new_qp(&qp_in(cqb.handle())).unwrap();
    let gid = c.query_gid(1, 0).unwrap();
    for (qp, peer) in [(&a, b.qpn()), (&b, a.qpn())] {
        for (mask, mut attr) in rts_steps(IV_QPT_RC, peer, gid) {
            if attr.qp_state == IV_QPS_INIT {
                attr.qp_access_flags =
                    IV_ACCESS_REMOTE_WRITE | IV_ACCESS_REMOTE_READ | IV_ACCESS_REMOTE_ATOMIC;
            }
            qp.modify(mask, &attr).unwrap();
        }
    }
    (a, cqa, b, cqb)
}

crate::on_each_backend!(
    fast_registration_at_the_page_list_limit,
    a_page_list_with_gaps_maps_page_by_page,
);

fn fast_registration_at_the_page_list_limit(backend: Backend) {
    let dev = device(backend);
    let user = dev
        .open(FILE_READ_ACCESS | FILE_WRITE_ACCESS)
        .unwrap()
        .into_client();
    let c = dev.open_kernel().unwrap().into_client();
    let caps = c.query_device().unwrap();
    assert_ne!(caps.device_cap_flags & IV_DEVICE_MEM_MGT_EXTENSIONS, 0);
    let max = caps.max_fast_reg_page_list_len;
    assert!(max >= 1, "{backend:?}");
    let pd = c.alloc_pd().unwrap().pd;
    let upd = user.alloc_pd().unwrap().pd;
    assert_eq!(
        user.alloc_mr(upd, 1).err(),
        Some(STATUS_ACCESS_DENIED),
        "{backend:?}: kernel callers only"
    );
    assert_eq!(
        c.alloc_mr(pd, max + 1).err(),
        Some(STATUS_INVALID_PARAMETER),
        "{backend:?}"
    );
    let fmr = c.alloc_mr(pd, max).unwrap();

    // The backing memory: a registered MR whose pages the list names
    // (page-aligned addresses inside it).
    let n = u64::from(max);
    let mem = Mem::new(((n + 2) * PAGE) as usize);
    let backing = c
        .reg_mr(pd, mem.addr(), (n + 2) * PAGE, IV_ACCESS_ALL)
        .unwrap();
    let first = (mem.addr() + PAGE - 1) & !(PAGE - 1);
    let off = (first - mem.addr()) as usize;
    let pages: Vec<IvSge> = (0..n)
        .map(|i| IvSge {
            addr: first + i * PAGE,
            length: PAGE as u32,
            lkey: backing.lkey,
        })
        .collect();
    let (a, cqa, b, cqb) = pair(&c, pd, max);
    let key = next_rkey(fmr.lkey);
    let iova = 0x4000_0000;
    let len = n * PAGE;
    let access = IV_ACCESS_LOCAL_WRITE | IV_ACCESS_REMOTE_WRITE | IV_ACCESS_REMOTE_READ;
    b.post_send(&reg_mr_wr(1, key, (iova, len), access, PAGE as u32, &pages))
        .unwrap();
    let wc = one(&cqb);
    assert_eq!(
        (wc.status, wc.opcode),
        (IV_WC_SUCCESS, IV_WC_OP_REG_MR),
        "{backend:?}"
    );
    // A WRITE to the last page and a READ back, through the new key.
    let src = Mem::new(64);
    src.fill(0, b"the last page!!!");
    let src_mr = c.reg_mr(pd, src.addr(), 64, IV_ACCESS_ALL).unwrap();
    let sge = |at: u64, l: u32| IvSge {
        addr: src.addr() + at,
        length: l,
        lkey: src_mr.lkey,
    };
    a.post_send(&SendWr {
        wr_id: 2,
        opcode: IV_WR_RDMA_WRITE,
        flags: IV_SEND_SIGNALED,
        sges: &[sge(0, 16)],
        remote_addr: iova + len - 16,
        rkey: key,
        ..SendWr::default()
    })
    .unwrap();
    assert_eq!(one(&cqa).status, IV_WC_SUCCESS, "{backend:?}");
    let at = off + (len as usize) - 16;
    assert_eq!(mem.read(at, 16), b"the last page!!!", "{backend:?}");
    a.post_send(&SendWr {
        wr_id: 3,
        opcode: IV_WR_RDMA_READ,
        flags: IV_SEND_SIGNALED,
        sges: &[sge(32, 16)],
        remote_addr: iova + len - 16,
        rkey: key,
        ..SendWr::default()
    })
    .unwrap();
    assert_eq!(one(&cqa).status, IV_WC_SUCCESS, "{backend:?}");
    assert_eq!(src.read(32, 16), b"the last page!!!");
    // The backing MR is busy while mapped.
    assert_eq!(c.dereg_mr(backing.mr).err(), Some(STATUS_DEVICE_BUSY));
    // A SEND with invalidate frees it.
    b.post_recv(4, &[sge(48, 16)]).unwrap();
    a.post_send(&SendWr {
        wr_id: 5,
        opcode: IV_WR_SEND_WITH_INV,
        flags: IV_SEND_SIGNALED,
        inline: Some(b"inv"),
        imm_or_inv: key,
        ..SendWr::default()
    })
    .unwrap();
    assert_eq!(one(&cqa).status, IV_WC_SUCCESS, "{backend:?}");
    let r = one(&cqb);
    assert_eq!(
        (r.status, r.wc_flags & IV_WC_WITH_INV, r.imm_or_inv),
        (IV_WC_SUCCESS, IV_WC_WITH_INV, key),
        "{backend:?}"
    );
    // Registered again with another key over one page: the new key
    // writes, the old one is refused (and the connection ends).
    let key2 = next_rkey(key);
    b.post_send(&reg_mr_wr(
        6,
        key2,
        (0, PAGE),
        access,
        PAGE as u32,
        &pages[..1],
    ))
    .unwrap();
    assert_eq!(one(&cqb).status, IV_WC_SUCCESS, "{backend:?}");
    src.fill(0, b"second key");
    a.post_send(&SendWr {
        wr_id: 7,
        opcode: IV_WR_RDMA_WRITE,
        flags: IV_SEND_SIGNALED,
        sges: &[sge(0, 10)],
        remote_addr: 0,
        rkey: key2,
        ..SendWr::default()
    })
    .unwrap();
    assert_eq!(one(&cqa).status, IV_WC_SUCCESS, "{backend:?}");
    assert_eq!(mem.read(off, 10), b"second key");
    a.post_send(&SendWr {
        wr_id: 8,
        opcode: IV_WR_RDMA_WRITE,
        flags: IV_SEND_SIGNALED,
        sges: &[sge(0, 10)],
        remote_addr: 0,
        rkey: key,
        ..SendWr::default()
    })
    .unwrap();
    assert_eq!(one(&cqa).status, IV_WC_REM_ACCESS_ERR, "{backend:?}");
    drop((a, b, cqa, cqb));
    // On a new connection: invalidated, then registered over the pages
    // in reverse order (page by page); a WRITE across the first seam
    // lands at the end of the list's first page and the start of its
    // second, and reads back across it.
    let (a, cqa, b, cqb) = pair(&c, pd, max);
    b.post_send(&local_inv_wr(9, key2)).unwrap();
    assert_eq!(one(&cqb).status, IV_WC_SUCCESS, "{backend:?}");
    let reversed: Vec<IvSge> = pages.iter().rev().copied().collect();
    let key3 = next_rkey(key2);
    b.post_send(&reg_mr_wr(
        10,
        key3,
        (iova, len),
        access,
        PAGE as u32,
        &reversed,
    ))
    .unwrap();
    assert_eq!(one(&cqb).status, IV_WC_SUCCESS, "{backend:?}");
    src.fill(0, b"before the seam, after the seam!");
    a.post_send(&SendWr {
        wr_id: 11,
        opcode: IV_WR_RDMA_WRITE,
        flags: IV_SEND_SIGNALED,
        sges: &[sge(0, 32)],
        remote_addr: iova + PAGE - 16,
        rkey: key3,
        ..SendWr::default()
    })
    .unwrap();
    assert_eq!(one(&cqa).status, IV_WC_SUCCESS, "{backend:?}");
    assert!(n >= 2, "{backend:?}: a list of two pages at least");
    let last = off + ((n - 1) * PAGE) as usize;
    let second = off + ((n - 2) * PAGE) as usize;
    assert_eq!(mem.read(last + PAGE as usize - 16, 16), b"before the seam,");
    assert_eq!(mem.read(second, 16), b" after the seam!");
    a.post_send(&SendWr {
        wr_id: 12,
        opcode: IV_WR_RDMA_READ,
        flags: IV_SEND_SIGNALED,
        sges: &[sge(32, 32)],
        remote_addr: iova + PAGE - 16,
        rkey: key3,
        ..SendWr::default()
    })
    .unwrap();
    assert_eq!(one(&cqa).status, IV_WC_SUCCESS, "{backend:?}");
    assert_eq!(src.read(32, 32), b"before the seam, after the seam!");
    drop((a, b, cqa, cqb));
    // Deregistered valid: the backing MR may go then.
    c.dereg_mr(fmr.mr).unwrap();
    c.dereg_mr(backing.mr).unwrap();
    drop((c, user));
    dev.quiesce(std::time::Duration::from_secs(10))
        .expect("quiescent");
    assert_eq!(dev.platform().pool_stats().live, 0, "pool leaked");
    dev.unload();
}

/// The backing pages a list with gaps names, in list order: holes before,
/// between and after them, out of order, and one pair that follows each
/// other in the backing MR (joined into one piece of it).
const GAPS: [u64; 4] = [5, 6, 1, 3];

/// The byte of the pattern at `i`.
fn pattern(i: usize) -> u8 {
    (i % 251) as u8 ^ 0x5A
}

fn a_page_list_with_gaps_maps_page_by_page(backend: Backend) {
    let dev = device(backend);
    let c = dev.open_kernel().unwrap().into_client();
    let caps = c.query_device().unwrap();
    let n = GAPS.len() as u64;
    assert!(u64::from(caps.max_fast_reg_page_list_len) >= n);
    let pd = c.alloc_pd().unwrap().pd;
    let fmr = c.alloc_mr(pd, n as u32).unwrap();
    // Eight pages of backing memory (page-aligned inside `mem`).
    let mem = Mem::new((9 * PAGE) as usize);
    let first = (mem.addr() + PAGE - 1) & !(PAGE - 1);
    let off = (first - mem.addr()) as usize;
    let backing = c.reg_mr(pd, first, 8 * PAGE, IV_ACCESS_ALL).unwrap();
    let pages: Vec<IvSge> = GAPS
        .iter()
        .map(|p| IvSge {
            addr: first + p * PAGE,
            length: PAGE as u32,
            lkey: backing.lkey,
        })
        .collect();
    // Where the byte at `x` past the iova lies in `mem`.
    let at = |x: u64| off + (GAPS[(x / PAGE) as usize] * PAGE + x % PAGE) as usize;
    let (a, cqa, b, cqb) = pair(&c, pd, n as u32);
    let key = next_rkey(fmr.lkey);
    let iova = 0x7000_0000;
    let len = n * PAGE;
    let access = IV_ACCESS_LOCAL_WRITE
        | IV_ACCESS_REMOTE_WRITE
        | IV_ACCESS_REMOTE_READ
        | IV_ACCESS_REMOTE_ATOMIC;
    b.post_send(&reg_mr_wr(1, key, (iova, len), access, PAGE as u32, &pages))
        .unwrap();
    let wc = one(&cqb);
    assert_eq!((wc.status, wc.opcode), (IV_WC_SUCCESS, IV_WC_OP_REG_MR));

    // The initiator's memory: 12 KiB of pattern, room to read it into
    // and a little more.
    let span = 3 * PAGE as usize;
    let src = Mem::new(2 * span + 64);
    let bytes: Vec<u8> = (0..span).map(pattern).collect();
    src.fill(0, &bytes);
    let src_mr = c
        .reg_mr(pd, src.addr(), (2 * span + 64) as u64, IV_ACCESS_ALL)
        .unwrap();
    let sge = |at: usize, l: usize| IvSge {
        addr: src.addr() + at as u64,
        length: l as u32,
        lkey: src_mr.lkey,
    };

    // A WRITE of three pages from 100 bytes into the list: four pieces of
    // the backing MR (pages 5 and 6 joined, then 1, then 3).
    let start = 100u64;
    a.post_send(&SendWr {
        wr_id: 2,
        opcode: IV_WR_RDMA_WRITE,
        flags: IV_SEND_SIGNALED,
        sges: &[sge(0, span)],
        remote_addr: iova + start,
        rkey: key,
        ..SendWr::default()
    })
    .unwrap();
    assert_eq!(one(&cqa).status, IV_WC_SUCCESS);
    for (i, want) in bytes.iter().enumerate() {
        let x = at(start + i as u64);
        assert_eq!(mem.read(x, 1)[0], *want, "byte {i} of the WRITE");
    }
    // The holes stay untouched.
    for hole in [0u64, 2, 4, 7] {
        let h = off + (hole * PAGE) as usize;
        assert!(
            mem.read(h, PAGE as usize).iter().all(|b| *b == 0),
            "page {hole}"
        );
    }
    // A READ of the same bytes back, across the same seams.
    a.post_send(&SendWr {
        wr_id: 3,
        opcode: IV_WR_RDMA_READ,
        flags: IV_SEND_SIGNALED,
        sges: &[sge(span, span)],
        remote_addr: iova + start,
        rkey: key,
        ..SendWr::default()
    })
    .unwrap();
    assert_eq!(one(&cqa).status, IV_WC_SUCCESS);
    assert_eq!(src.read(span, span), bytes);

    // An atomic on the list's third page (backing page 1).
    let word = iova + 2 * PAGE + 8;
    let x = at(2 * PAGE + 8);
    mem.fill(x, &40u64.to_le_bytes());
    a.post_send(&SendWr {
        wr_id: 4,
        opcode: IV_WR_ATOMIC_FETCH_AND_ADD,
        flags: IV_SEND_SIGNALED,
        sges: &[sge(2 * span, 8)],
        remote_addr: word,
        rkey: key,
        compare_add: 2,
        ..SendWr::default()
    })
    .unwrap();
    assert_eq!(one(&cqa).status, IV_WC_SUCCESS);
    assert_eq!(src.read(2 * span, 8), 40u64.to_le_bytes());
    assert_eq!(mem.read(x, 8), 42u64.to_le_bytes());

    // A receive scattered through the lkey across the seam between the
    // list's second and third pages (backing pages 6 and 1).
    let seam = iova + 2 * PAGE - 20;
    b.post_recv(
        5,
        &[IvSge {
            addr: seam,
            length: 40,
            lkey: key,
        }],
    )
    .unwrap();
    a.post_send(&SendWr {
        wr_id: 6,
        opcode: IV_WR_SEND,
        flags: IV_SEND_SIGNALED,
        sges: &[sge(0, 40)],
        ..SendWr::default()
    })
    .unwrap();
    assert_eq!(one(&cqa).status, IV_WC_SUCCESS);
    let r = one(&cqb);
    assert_eq!((r.status, r.byte_len), (IV_WC_SUCCESS, 40));
    let landed: Vec<u8> = (0..40)
        .map(|i| mem.read(at(2 * PAGE - 20 + i), 1)[0])
        .collect();
    assert_eq!(landed, &bytes[..40]);

    // A send gathered through the lkey across the seam between the list's
    // third and fourth pages (backing pages 1 and 3).
    let x = 3 * PAGE - 24;
    for i in 0..48 {
        mem.fill(at(x + i), &[0xA0 ^ i as u8]);
    }
    a.post_recv(7, &[sge(2 * span + 16, 48)]).unwrap();
    b.post_send(&SendWr {
        wr_id: 8,
        opcode: IV_WR_SEND,
        flags: IV_SEND_SIGNALED,
        sges: &[IvSge {
            addr: iova + x,
            length: 48,
            lkey: key,
        }],
        ..SendWr::default()
    })
    .unwrap();
    assert_eq!(one(&cqb).status, IV_WC_SUCCESS);
    let r = one(&cqa);
    assert_eq!((r.status, r.byte_len), (IV_WC_SUCCESS, 48));
    let want: Vec<u8> = (0..48u8).map(|i| 0xA0 ^ i).collect();
    assert_eq!(src.read(2 * span + 16, 48), want);

    // Past the list's end: refused as any MR's bound is.
    a.post_send(&SendWr {
        wr_id: 9,
        opcode: IV_WR_RDMA_WRITE,
        flags: IV_SEND_SIGNALED,
        sges: &[sge(0, 16)],
        remote_addr: iova + len - 8,
        rkey: key,
        ..SendWr::default()
    })
    .unwrap();
    assert_eq!(one(&cqa).status, IV_WC_REM_ACCESS_ERR);
    drop((a, b, cqa, cqb));
    c.dereg_mr(fmr.mr).unwrap();
    c.dereg_mr(backing.mr).unwrap();
    c.dereg_mr(src_mr.mr).unwrap();
    drop(c);
    dev.quiesce(std::time::Duration::from_secs(10))
        .expect("quiescent");
    assert_eq!(dev.platform().pool_stats().live, 0, "pool leaked");
    dev.unload();
}
