//! User-mode doorbells through the doorbell page, over the host device with
//! the verifier on: the page each user file maps (`IOCTL_IV_MAP_DOORBELLS`),
//! the slots `IOCTL_IV_MAP_RINGS` reports, the scanner the device's doorbell
//! thread drives ([`UserDoorbells::Page`]) or a test drives by hand (a
//! [`UserDoorbells::Direct`] device whose files map their pages
//! explicitly), garbage in a page, isolation between files, concurrent
//! ringing from several threads, teardown.

use std::sync::Arc;
use std::time::{Duration, Instant};

use irpverbs_abi::*;
use irpverbs_host::{Backend, Engine, HostDevice, HostDeviceConfig, HostFile, UserDoorbells};
use irpverbs_verbs::{Client, Cq, Doorbells, IntoClient, PageDoorbells, Qp, SendWr};

mod common;

crate::on_each_backend!(
    page_mode_user_files_ring_through_their_page_and_kernel_files_directly,
    receives_ring_their_doorbell_only_when_the_hca_asks,
    a_files_page_reaches_only_its_own_queues,
    rings_mapped_before_the_page_have_no_slot_and_ring_nothing_through_it,
    concurrent_files_ringing_through_their_pages,
    teardown_with_doorbells_rung_and_pages_mapped,
    a_sleeping_doorbell_thread_is_woken_by_the_ring_ioctl,
    a_polling_doorbell_thread_needs_no_ioctl,
);

const ENGINES: [Engine; 2] = [Engine::Inline, Engine::Thread];

fn device(backend: Backend, engine: Engine, user_doorbells: UserDoorbells) -> Arc<HostDevice> {
    HostDevice::new(HostDeviceConfig {
        backend,
        engine,
        user_doorbells,
        ..HostDeviceConfig::default()
    })
    .expect("host device")
}

fn open(dev: &Arc<HostDevice>) -> HostFile {
    dev.open(FILE_READ_ACCESS | FILE_WRITE_ACCESS)
        .expect("open")
}

fn finish(dev: &HostDevice) {
    dev.quiesce(Duration::from_secs(10)).expect("quiescent");
    assert_eq!(dev.platform().pool_stats().live, 0, "pool leaked");
    assert_eq!(dev.soft().stats().doorbell_pages, 0, "pages freed");
    dev.unload();
}

/// Runs the soft HCA's scanner as the doorbell thread does: at
/// DISPATCH_LEVEL (the DPCs it queues run when it returns).
fn scan(dev: &HostDevice) -> usize {
    dev.platform()
        .run_at_dispatch(|| dev.soft().poll_doorbells())
}

/// Scans until a scan finds nothing (the firmware thread, if any, may still
/// be running what the scans found).
fn scan_all(dev: &HostDevice) -> usize {
    let mut n = 0;
    loop {
        let found = scan(dev);
        if found == 0 {
            return n;
        }
        n += found;
    }
}

fn cq_in(cqe: u32) -> IvCreateCqIn {
    IvCreateCqIn {
        cqe,
        ..IvCreateCqIn::default()
    }
}

fn qp_in(pd: IvHandle, cq: IvHandle) -> IvCreateQpIn {
    let mut i = irpverbs_verbs::qp_request(pd, cq, 0, IV_QPT_RC);
    i.cap.max_inline_data = 64;
    i
}

/// Polls `cq` for `n` completions, scanning `dev`'s doorbells in between
/// when `by_hand` (up to a deadline: a lost doorbell fails, not hangs).
fn completions(dev: &HostDevice, by_hand: bool, cq: &Cq<'_>, n: usize) -> Vec<IvCqe> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut got = Vec::new();
    let mut wc = [IvCqe::default(); 16];
    while got.len() < n {
        if by_hand {
            scan(dev);
        }
        let k = cq.poll(&mut wc).unwrap();
        got.extend_from_slice(&wc[..k]);
        if k == 0 {
            assert!(
                Instant::now() < deadline,
                "{} of {n} completions",
                got.len()
            );
            std::thread::yield_now();
        }
    }
    got
}

/// Memory registered on `c`'s `pd` for remote writes.
struct Mem {
    buf: Vec<u8>,
    lkey: u32,
    rkey: u32,
}

impl Mem {
    fn new(c: &Client, pd: IvHandle, len: usize) -> Self {
        let mut buf = vec![0u8; len];
        let mr = c
            .reg_mr(
                pd,
                buf.as_mut_ptr() as u64,
                len as u64,
                IV_ACCESS_LOCAL_WRITE | IV_ACCESS_REMOTE_WRITE,
            )
            .unwrap();
        Self {
            buf,
            lkey: mr.lkey,
            rkey: mr.rkey,
        }
    }

    fn addr(&self, off: usize) -> u64 {
        self.buf.as_ptr() as u64 + off as u64
    }

    fn sge(&self, off: usize, len: u32) -> IvSge {
        IvSge {
            addr: self.addr(off),
            length: len,
            lkey: self.lkey,
        }
    }
}

/// Two RC QPs connected to each other, one CQ each.
struct Pair<'c> {
    a: Qp<'c>,
    b: Qp<'c>,
    cqa: Cq<'c>,
    cqb: Cq<'c>,
}

fn pair(c: &Client, pd: IvHandle) -> Pair<'_> {
    let cqa = c.new_cq(&cq_in(64)).unwrap();
    let cqb = c.new_cq(&cq_in(64)).unwrap();
    let a = c.new_qp(&qp_in(pd, cqa.handle())).unwrap();
    let b = c.new_qp(&qp_in(pd, cqb.handle())).unwrap();
    let gid = c.query_gid(1, 0).unwrap();
    a.connect(b.qpn(), gid).unwrap();
    b.connect(a.qpn(), gid).unwrap();
    Pair { a, b, cqa, cqb }
}

/// An RDMA WRITE of `len` bytes of `m` at `from` to `m` at `to`, inline.
fn write(wr_id: u64, m: &Mem, from: usize, to: usize, len: u32) -> SendWr<'_> {
    SendWr {
        wr_id,
        opcode: IV_WR_RDMA_WRITE,
        flags: IV_SEND_SIGNALED | IV_SEND_INLINE,
        inline: Some(&m.buf[from..from + len as usize]),
        remote_addr: m.addr(to),
        rkey: m.rkey,
        ..SendWr::default()
    }
}

fn page_mode_user_files_ring_through_their_page_and_kernel_files_directly(backend: Backend) {
    for engine in ENGINES {
        let dev = device(backend, engine, UserDoorbells::Page);
        let file = open(&dev);
        let page = file.doorbell_page().expect("mapped at open").clone();
        assert_eq!(page.page().region().len(), 4096);
        // The same page on every request.
        let again = file.map_doorbells().unwrap();
        assert_eq!(again, &page);
        let c = file.into_client();
        let pd = c.alloc_pd().unwrap().pd;
        let m = Mem::new(&c, pd, 4096);
        let p = pair(&c, pd);
        // Every queue rings a slot of its own.
        let slots = [
            p.a.rings().sq_bell().slot,
            p.a.rings().rq_bell().slot,
            p.b.rings().sq_bell().slot,
            p.b.rings().rq_bell().slot,
            p.cqa.rings().bell().slot,
            p.cqb.rings().bell().slot,
        ];
        let mut sorted = slots.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 6, "{slots:?}");
        assert!(slots.iter().all(|&s| s < IV_DOORBELL_SLOTS));
        // SEND / RECV and a WRITE, the doorbells found by the thread.
        p.b.post_recv(7, &[m.sge(1024, 64)]).unwrap();
        p.a.post_send(&SendWr {
            wr_id: 1,
            opcode: IV_WR_SEND,
            flags: IV_SEND_SIGNALED | IV_SEND_INLINE,
            inline: Some(b"rung through a page"),
            ..SendWr::default()
        })
        .unwrap();
        let r = completions(&dev, false, &p.cqb, 1)[0];
        assert_eq!((r.wr_id, r.status, r.byte_len), (7, IV_WC_SUCCESS, 19));
        assert_eq!(completions(&dev, false, &p.cqa, 1)[0].wr_id, 1);
        assert_eq!(&m.buf[1024..1043], b"rung through a page");
        p.a.post_send(&write(2, &m, 0, 2048, 8)).unwrap();
        assert_eq!(completions(&dev, false, &p.cqa, 1)[0].wr_id, 2);
        // The two sends'; the receive needs none (nothing asked for it).
        let rung = dev.soft().stats().page_doorbells;
        assert!(rung >= 2, "{engine:?}: {rung}");
        assert_eq!(dev.soft().stats().doorbell_pages, 1);

        // A kernel-mode file keeps the direct calls: no page.
        let k = dev.open_kernel().unwrap();
        assert!(k.doorbell_page().is_none());
        assert_eq!(k.map_doorbells().err(), Some(STATUS_NOT_SUPPORTED));
        drop(k);
        drop(p);
        drop(m);
        drop(c);
        finish(&dev);
    }
}

/// Posting receives rings the receive doorbell only when the HCA asks for
/// it (the ring's doorbell request: a QP in ERR, or a responder waiting for
/// a receive after an RNR NAK); otherwise the HCA finds the receives when a
/// message needs one. Doorbells scanned by hand, so every page ring counts
/// (the page says the HCA polls: no ring IOCTL takes them first).
fn receives_ring_their_doorbell_only_when_the_hca_asks(backend: Backend) {
    let dev = device(backend, Engine::Inline, UserDoorbells::Direct);
    let file = open(&dev);
    let page = file.map_doorbells().unwrap().clone();
    page.page().set_polling(true);
    let c = file.into_client();
    let pd = c.alloc_pd().unwrap().pd;
    let m = Mem::new(&c, pd, 4096);
    let p = pair(&c, pd);
    let rung = || dev.soft().stats().page_doorbells;
    let send = |wr_id: u64| {
        p.a.post_send(&SendWr {
            wr_id,
            opcode: IV_WR_SEND,
            flags: IV_SEND_SIGNALED | IV_SEND_INLINE,
            inline: Some(b"hello"),
            ..SendWr::default()
        })
        .unwrap();
    };
    // Nothing asked: the receive is found by the SEND, not rung.
    p.b.post_recv(1, &[m.sge(1024, 64)]).unwrap();
    assert!(!page.page().peek(), "no receive doorbell");
    assert!(!p.b.rings().rq().unwrap().doorbell_wanted());
    send(10);
    scan_all(&dev);
    assert_eq!(completions(&dev, true, &p.cqb, 1)[0].wr_id, 1);
    assert_eq!(completions(&dev, true, &p.cqa, 1)[0].wr_id, 10);
    assert_eq!(rung(), 1, "the send queue's only");

    // A SEND with nothing to receive it: RNR NAK, and the responder asks.
    send(11);
    scan_all(&dev);
    let mut wc = [IvCqe::default(); 4];
    assert_eq!(p.cqa.poll(&mut wc).unwrap(), 0, "waiting for a receive");
    assert!(p.b.rings().rq().unwrap().doorbell_wanted(), "asked");
    assert!(dev.soft().stats().rnr_naks >= 1);
    // The receive is rung, and the requester retries at once.
    let before = rung();
    p.b.post_recv(2, &[m.sge(2048, 64)]).unwrap();
    assert!(page.page().peek(), "rung");
    scan_all(&dev);
    assert_eq!(rung(), before + 1);
    assert_eq!(completions(&dev, true, &p.cqb, 1)[0].wr_id, 2);
    assert_eq!(completions(&dev, true, &p.cqa, 1)[0].wr_id, 11);
    assert!(!p.b.rings().rq().unwrap().doorbell_wanted(), "no longer");

    // In ERR every new receive is flushed: rung, since nothing else would
    // look at the queue again.
    p.b.modify(
        IV_QP_STATE,
        &IvQpAttr {
            qp_state: IV_QPS_ERR,
            ..IvQpAttr::default()
        },
    )
    .unwrap();
    assert!(p.b.rings().rq().unwrap().doorbell_wanted());
    p.b.post_recv(3, &[m.sge(0, 64)]).unwrap();
    let r = completions(&dev, true, &p.cqb, 1)[0];
    assert_eq!((r.wr_id, r.status), (3, IV_WC_WR_FLUSH_ERR));
    drop((p, m));
    drop(c);
    finish(&dev);
}

fn a_files_page_reaches_only_its_own_queues(backend: Backend) {
    let dev = device(backend, Engine::Inline, UserDoorbells::Direct);
    let fa = open(&dev);
    let fb = open(&dev);
    let page_a = fa.map_doorbells().unwrap().clone();
    let page_b = fb.map_doorbells().unwrap().clone();
    assert_ne!(page_a, page_b, "a page per file");
    let ca = fa.into_client();
    let cb = fb.into_client();
    let pda = ca.alloc_pd().unwrap().pd;
    let pdb = cb.alloc_pd().unwrap().pd;
    let ma = Mem::new(&ca, pda, 4096);
    let pa = pair(&ca, pda);
    let pb = pair(&cb, pdb);
    // The receives of both files, rung through their pages and scanned.
    pa.b.post_recv(70, &[ma.sge(1024, 64)]).unwrap();
    scan_all(&dev);
    // A's WQE is written and published, but not rung.
    pa.a.rings()
        .sq()
        .post(&SendWr {
            wr_id: 1,
            opcode: IV_WR_SEND,
            flags: IV_SEND_SIGNALED | IV_SEND_INLINE,
            inline: Some(b"not yet"),
            ..SendWr::default()
        })
        .unwrap();
    // File B writes every bit of its page, reserved words too: the soft
    // HCA looks at B's queues only (each slot bound to nothing is stray).
    let before = dev.soft().stats();
    page_b.page().region().fill(0, 4096, 0xFF).unwrap();
    let rung = scan_all(&dev);
    let after = dev.soft().stats();
    assert_eq!(rung, 6, "B's six doorbells");
    assert_eq!(
        after.stray_doorbells - before.stray_doorbells,
        u64::from(IV_DOORBELL_SLOTS) - 6
    );
    let mut wc = [IvCqe::default(); 4];
    assert_eq!(pa.cqa.poll(&mut wc).unwrap(), 0, "A's send did not run");
    assert_eq!(pa.cqb.poll(&mut wc).unwrap(), 0, "nothing arrived");
    assert_eq!(pb.cqa.poll(&mut wc).unwrap(), 0, "B had nothing to run");
    // A's own doorbell runs it.
    assert!(page_a.page().ring(pa.a.rings().sq_bell().slot));
    let r = completions(&dev, true, &pa.cqb, 1)[0];
    assert_eq!((r.wr_id, r.byte_len), (70, 7));
    assert_eq!(completions(&dev, true, &pa.cqa, 1)[0].wr_id, 1);
    drop((pa, pb, ma));
    drop((ca, cb));
    finish(&dev);
}

fn rings_mapped_before_the_page_have_no_slot_and_ring_nothing_through_it(backend: Backend) {
    let dev = device(backend, Engine::Inline, UserDoorbells::Direct);
    let file = open(&dev);
    let c = file.into_client();
    let pd = c.alloc_pd().unwrap().pd;
    let cq = c.new_cq(&cq_in(8)).unwrap();
    let qp = c.new_qp(&qp_in(pd, cq.handle())).unwrap();
    assert_eq!(qp.rings().sq_bell().slot, IV_DOORBELL_NONE, "no page yet");
    assert_eq!(cq.rings().bell().slot, IV_DOORBELL_NONE);
    // The raw IOCTLs: the page, then MAP_RINGS binds and reports slots.
    let (st, out) = c.raw(IOCTL_IV_MAP_DOORBELLS, &[], size_of::<IvMapDoorbellsOut>());
    assert_eq!(st, STATUS_SUCCESS);
    let m = c.map_rings(qp.handle()).unwrap();
    assert!(m.ring_doorbell < IV_DOORBELL_SLOTS && m.rq_doorbell < IV_DOORBELL_SLOTS);
    assert_ne!(m.ring_doorbell, m.rq_doorbell);
    assert_eq!(c.map_rings(qp.handle()), Ok(m), "the same slots");
    assert_eq!(out.len(), size_of::<IvMapDoorbellsOut>());
    // A kernel file's MAP_RINGS reports none: it rings directly.
    let k = dev.open_kernel().unwrap();
    let kc = k.into_client();
    let kpd = kc.alloc_pd().unwrap().pd;
    let kcq = kc.create_cq(8).unwrap();
    let kqp = kc.create_qp(kpd, kcq.cq, IV_QPT_RC).unwrap();
    let km = kc.map_rings(kqp.qp).unwrap();
    assert_eq!(
        (km.ring_doorbell, km.rq_doorbell),
        (IV_DOORBELL_NONE, IV_DOORBELL_NONE)
    );
    drop(kc);
    drop((qp, cq));
    drop(c);
    finish(&dev);
}

/// Several threads, each with its own file and QPs, post RDMA WRITEs and
/// ring through their pages while the device's doorbell thread scans:
/// every WQE completes, once, with the verifier watching the scanner at
/// DISPATCH_LEVEL.
fn concurrent_files_ringing_through_their_pages(backend: Backend) {
    const THREADS: usize = 3;
    const PER_THREAD: u64 = 150;
    for engine in ENGINES {
        let dev = device(backend, engine, UserDoorbells::Page);
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let dev = &dev;
                s.spawn(move || {
                    let c = open(dev).into_client();
                    let pd = c.alloc_pd().unwrap().pd;
                    let m = Mem::new(&c, pd, 4096);
                    let p = pair(&c, pd);
                    let mut done = 0;
                    for i in 0..PER_THREAD {
                        // At most 8 in flight (the send queue holds 16).
                        while i - done >= 8 {
                            done += completions(dev, false, &p.cqa, 1).len() as u64;
                        }
                        p.a.post_send(&write(t as u64 * 1000 + i, &m, 0, 2048, 16))
                            .unwrap();
                    }
                    let rest = (PER_THREAD - done) as usize;
                    let tail = completions(dev, false, &p.cqa, rest);
                    assert!(tail.iter().all(|c| c.status == IV_WC_SUCCESS));
                    let mut wc = [IvCqe::default(); 4];
                    assert_eq!(p.cqa.poll(&mut wc).unwrap(), 0, "each once");
                    drop(p);
                    drop(m);
                });
            }
        });
        let rung = dev.soft().stats().page_doorbells;
        println!(
            "{engine:?}: {rung} doorbells taken for {} WQEs",
            THREADS as u64 * PER_THREAD
        );
        assert!(rung > 0, "{engine:?}");
        finish(&dev);
    }
}

fn teardown_with_doorbells_rung_and_pages_mapped(backend: Backend) {
    for engine in ENGINES {
        let dev = device(backend, engine, UserDoorbells::Direct);
        let file = open(&dev);
        let page: PageDoorbells = file.map_doorbells().unwrap().clone();
        let c = file.into_client();
        let pd = c.alloc_pd().unwrap().pd;
        let p = pair(&c, pd);
        let slot = p.a.rings().sq_bell().slot;
        p.a.rings()
            .sq()
            .post(&SendWr {
                wr_id: 9,
                opcode: IV_WR_SEND,
                flags: IV_SEND_INLINE,
                inline: Some(b"x"),
                ..SendWr::default()
            })
            .unwrap();
        page.sq(p.a.rings().sq_bell());
        assert_eq!(
            dev.device().snapshot().user_mappings,
            7,
            "6 rings + the page"
        );
        // The file closes with a doorbell rung and not yet scanned: its
        // objects run down (unbinding their slots), the page is unmapped at
        // the cleanup and freed at the close.
        drop(p);
        drop(c);
        dev.quiesce(Duration::from_secs(10)).expect("quiescent");
        assert_eq!(dev.soft().stats().doorbell_pages, 0);
        assert_eq!(dev.device().snapshot().user_mappings, 0);
        assert_eq!(scan(&dev), 0, "nothing left to scan");
        assert!(slot < IV_DOORBELL_SLOTS);
        finish(&dev);
    }
}

/// Waits until the device's doorbell thread sleeps (the page says so).
fn until_asleep(page: &PageDoorbells) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !page.page().must_wake() {
        assert!(Instant::now() < deadline, "the doorbell thread never slept");
        std::thread::yield_now();
    }
}

/// The doorbell thread sleeps once its window passed without a doorbell;
/// a post then wakes the HCA with `IOCTL_IV_RING_DOORBELLS`, which runs the
/// doorbell before the post returns (inline engine: the completion is
/// there at once, not a tick later), and the thread polls again. Many
/// sleeps and wake-ups in a row lose nothing, with the verifier watching
/// the IOCTL and the thread.
fn a_sleeping_doorbell_thread_is_woken_by_the_ring_ioctl(backend: Backend) {
    let dev = HostDevice::new(HostDeviceConfig {
        backend,
        user_doorbells: UserDoorbells::Page,
        doorbell_poll_window: Some(Duration::ZERO),
        ..HostDeviceConfig::default()
    })
    .expect("host device");
    let file = open(&dev);
    let page = file.doorbell_page().expect("mapped at open").clone();
    let c = file.into_client();
    let pd = c.alloc_pd().unwrap().pd;
    let m = Mem::new(&c, pd, 4096);
    let p = pair(&c, pd);
    let mut wc = [IvCqe::default(); 4];
    for i in 0..50 {
        until_asleep(&page);
        p.a.post_send(&write(i, &m, 0, 2048, 8)).unwrap();
        // Run in the IOCTL, or by another context that held the HCA at
        // that moment (the transport's timer DPC): never lost.
        let deadline = Instant::now() + Duration::from_secs(10);
        while p.cqa.poll(&mut wc).unwrap() == 0 {
            assert!(Instant::now() < deadline, "the doorbell was lost");
            std::thread::yield_now();
        }
        assert_eq!((wc[0].wr_id, wc[0].status), (i, IV_WC_SUCCESS));
    }
    assert!(dev.soft().stats().page_doorbells >= 50);
    drop(p);
    drop(m);
    drop(c);
    finish(&dev);
}

/// While the doorbell thread polls (its window open), doorbells cost no
/// system call: the page says "polling" and the HCA finds them.
fn a_polling_doorbell_thread_needs_no_ioctl(backend: Backend) {
    let dev = HostDevice::new(HostDeviceConfig {
        backend,
        user_doorbells: UserDoorbells::Page,
        doorbell_poll_window: Some(Duration::from_secs(3600)),
        ..HostDeviceConfig::default()
    })
    .expect("host device");
    let file = open(&dev);
    let page = file.doorbell_page().expect("mapped at open").clone();
    let c = file.into_client();
    let pd = c.alloc_pd().unwrap().pd;
    let m = Mem::new(&c, pd, 4096);
    let p = pair(&c, pd);
    let deadline = Instant::now() + Duration::from_secs(10);
    while page.page().must_wake() {
        assert!(Instant::now() < deadline, "never polled");
        std::thread::yield_now();
    }
    for i in 0..20 {
        p.a.post_send(&write(i, &m, 0, 2048, 8)).unwrap();
        assert_eq!(completions(&dev, false, &p.cqa, 1)[0].wr_id, i);
    }
    assert!(!page.page().must_wake(), "still polling");
    drop(p);
    drop(m);
    drop(c);
    finish(&dev);
}
