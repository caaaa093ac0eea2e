//! The speed path over the host device (the driver in-process over the soft
//! HCA, verifier on): Rust ULPs through `Client` objects, kernel-style ULPs
//! through internal IOCTLs and the direct-call table from
//! `HostDevice::query_interface`, with the firmware inline and on its own
//! thread.
//!
//! The first tests need no data movement: what a post writes into the
//! driver's rings, what a poll reads, the arm word, the destroy guard. The
//! `loopback_*` tests move data between two RC QPs and need the soft HCA's
//! transport engine.
#![allow(unsafe_code, reason = "calling the kernel table through its C ABI")]

use std::ptr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use irpverbs_abi::*;
use irpverbs_core::{DISPATCH_LEVEL, PASSIVE_LEVEL, RequestorMode};
use irpverbs_host::platform::{catch_bugcheck, current_irql, speed_lock_check};
use irpverbs_host::{Backend, Engine, HostDevice, HostDeviceConfig};
use irpverbs_ring::wq::{push_cqe, read_recv_wqe, read_send_wqe};
use irpverbs_verbs::kernel::{
    IvKernelCq, IvKernelInterface, IvKernelQp, IvKernelRecvWr, IvKernelSendWr,
};
use irpverbs_verbs::{Client, Cq, CqRings, IntoClient, Qp, SendWr, Wc};

mod common;

crate::on_each_backend!(
    posts_land_in_the_drivers_rings,
    poll_and_arm_on_a_driver_cq,
    dropping_the_client_objects_first_runs_everything_down,
    a_kernel_file_speaks_internal_ioctls_with_the_same_objects,
    the_kernel_table_works_at_dispatch_level,
    the_kernel_table_holds_its_queues_at_dispatch_level_from_passive_callers,
    the_verifier_bugchecks_a_kernel_ring_lock_taken_below_dispatch_level,
    loopback_rc_send_write_read_through_the_rust_api,
    loopback_rc_send_through_the_kernel_table,
    an_srq_shared_by_four_qps_under_two_threads,
);

const ENGINES: [Engine; 2] = [Engine::Inline, Engine::Thread];

fn device(backend: Backend, engine: Engine) -> Arc<HostDevice> {
    HostDevice::new(HostDeviceConfig {
        backend,
        engine,
        ..HostDeviceConfig::default()
    })
    .expect("host device")
}

/// A ULP's open of the device (read and write access).
fn client(dev: &Arc<HostDevice>) -> Client {
    dev.open(FILE_READ_ACCESS | FILE_WRITE_ACCESS)
        .unwrap()
        .into_client()
}

fn finish(dev: &HostDevice) {
    dev.quiesce(Duration::from_secs(10)).expect("quiescent");
    assert_eq!(dev.platform().pool_stats().live, 0, "pool leaked");
    dev.unload();
}

fn cq_in(cqe: u32) -> IvCreateCqIn {
    IvCreateCqIn {
        cqe,
        ..IvCreateCqIn::default()
    }
}

fn qp_in(pd: IvHandle, cq: IvHandle, srq: IvHandle) -> IvCreateQpIn {
    IvCreateQpIn {
        pd,
        send_cq: cq,
        recv_cq: cq,
        srq,
        qp_type: IV_QPT_RC,
        cap: IvQpCap {
            max_send_wr: 16,
            max_recv_wr: if srq == 0 { 16 } else { 0 },
            max_send_sge: 2,
            max_recv_sge: if srq == 0 { 2 } else { 0 },
            max_inline_data: 64,
            reserved: 0,
        },
        ..IvCreateQpIn::default()
    }
}

fn sge(addr: u64, length: u32, lkey: u32) -> IvSge {
    IvSge { addr, length, lkey }
}

fn posts_land_in_the_drivers_rings(backend: Backend) {
    for engine in ENGINES {
        let dev = device(backend, engine);
        let c = client(&dev);
        let pd = c.alloc_pd().unwrap().pd;
        let cq = c.new_cq(&cq_in(32)).unwrap();
        let qp = c.new_qp(&qp_in(pd, cq.handle(), 0)).unwrap();
        let cap = qp.cap();
        assert!(cap.max_send_sge >= 2 && cap.max_inline_data >= 64);

        // The QP is in RESET: the HCA does not execute what is posted.
        let sges = [sge(0x1000, 8, 0x11), sge(0x2000, 8, 0x11)];
        qp.post_send(&SendWr {
            wr_id: 7,
            opcode: IV_WR_RDMA_WRITE,
            flags: IV_SEND_SIGNALED,
            sges: &sges,
            remote_addr: 0x9000,
            rkey: 0x22,
            ..SendWr::default()
        })
        .unwrap();
        qp.post_send(&SendWr {
            wr_id: 8,
            inline: Some(&[0xA5; 64]),
            ..SendWr::default()
        })
        .unwrap();
        let sq = qp.rings().sq().ring();
        assert_eq!(sq.producer_word().load(Ordering::Acquire), 2);
        let w = read_send_wqe(sq, 0, cap.max_send_sge, cap.max_inline_data).unwrap();
        assert_eq!((w.header.wr_id, w.header.opcode), (7, IV_WR_RDMA_WRITE));
        assert_eq!(&w.sges[..2], &sges);
        let w = read_send_wqe(sq, 1, cap.max_send_sge, cap.max_inline_data).unwrap();
        assert_eq!(w.header.inline_len, 64);

        qp.post_recv(9, &sges).unwrap();
        let r = read_recv_wqe(qp.rings().rq().unwrap().ring(), 0, cap.max_recv_sge).unwrap();
        assert_eq!((r.wr_id, r.num_sge), (9, 2));

        // An SRQ and a QP on it.
        let srq = c
            .new_srq(&IvCreateSrqIn {
                pd,
                max_wr: 8,
                max_sge: 1,
                ..IvCreateSrqIn::default()
            })
            .unwrap();
        let on_srq = c.new_qp(&qp_in(pd, cq.handle(), srq.handle())).unwrap();
        assert!(on_srq.rings().rq().is_none());
        srq.post_recv(10, &sges[..1]).unwrap();
        let r = read_recv_wqe(srq.rings().rq().ring(), 0, 1).unwrap();
        assert_eq!(r.wr_id, 10);

        // The driver agrees these objects are busy; the client refuses
        // destroys behind the objects' backs before the driver sees them.
        assert_eq!(c.destroy_qp(qp.handle()), Err(STATUS_DEVICE_BUSY));
        let (cq, st) = cq.destroy().unwrap_err();
        assert_eq!(st, STATUS_DEVICE_BUSY, "QPs use the CQ");
        let (srq, st) = srq.destroy().unwrap_err();
        assert_eq!(st, STATUS_DEVICE_BUSY, "a QP uses the SRQ");
        on_srq.destroy().unwrap();
        qp.destroy().unwrap();
        srq.destroy().unwrap();
        cq.destroy().unwrap();
        c.dealloc_pd(pd).unwrap();
        drop(c);
        finish(&dev);
    }
}

fn poll_and_arm_on_a_driver_cq(backend: Backend) {
    for engine in ENGINES {
        let dev = device(backend, engine);
        let c = client(&dev);
        // No QP uses this CQ: the test writes CQEs as the HCA would.
        let mut cq = c.new_cq(&cq_in(8)).unwrap();
        let mut wc = [IvCqe::default(); 4];
        assert_eq!(cq.poll(&mut wc), Ok(0));
        for id in 1..=3 {
            push_cqe(
                cq.rings().cq().ring(),
                &IvCqe {
                    wr_id: id,
                    opcode: IV_WC_OP_RDMA_READ,
                    byte_len: 64,
                    ..IvCqe::default()
                },
            )
            .unwrap();
        }
        assert_eq!(cq.poll(&mut wc), Ok(3));
        assert_eq!(
            Wc::new(&wc[2]).to_string(),
            "wr_id 0x3 qp 0x0: RDMA_READ 64 bytes SUCCESS"
        );
        cq.req_notify(true);
        let arm = cq.rings().cq().ring().arm_word().load(Ordering::Acquire);
        assert_eq!(
            arm & (IV_CQ_ARM_NEXT | IV_CQ_ARM_SOLICITED),
            IV_CQ_ARM_NEXT | IV_CQ_ARM_SOLICITED
        );
        // Resize through the object: the view follows the new ring.
        let before = cq.rings().cq().ring().map();
        cq.resize(100).unwrap();
        assert!(cq.cqe() >= 100);
        assert_ne!(cq.rings().cq().ring().map(), before);
        assert_eq!(cq.poll(&mut wc), Ok(0));
        drop(cq);
        drop(c);
        finish(&dev);
    }
}

fn dropping_the_client_objects_first_runs_everything_down(backend: Backend) {
    let dev = device(backend, Engine::Inline);
    {
        let c = client(&dev);
        let pd = c.alloc_pd().unwrap().pd;
        let cq = c.new_cq(&cq_in(8)).unwrap();
        let _qp = c.new_qp(&qp_in(pd, cq.handle(), 0)).unwrap();
        // The PD is left for file close; the objects destroy themselves on
        // drop (QP first: declared last), then the client closes the file.
    }
    finish(&dev);
}

/// A kernel ULP in Rust: the typed verbs over internal IOCTLs, the same
/// speed-path objects.
fn a_kernel_file_speaks_internal_ioctls_with_the_same_objects(backend: Backend) {
    let dev = device(backend, Engine::Inline);
    let file = dev.open_kernel().unwrap();
    assert_eq!(file.mode(), RequestorMode::Kernel);
    let c = file.into_client();
    let pd = c.alloc_pd().unwrap().pd;
    let cq = c.new_cq(&cq_in(8)).unwrap();
    let qp = c.new_qp(&qp_in(pd, cq.handle(), 0)).unwrap();
    qp.post_send(&SendWr::default()).unwrap();
    assert_eq!(
        qp.rings()
            .sq()
            .ring()
            .producer_word()
            .load(Ordering::Acquire),
        1
    );
    drop(qp);
    drop(cq);
    c.dealloc_pd(pd).unwrap();
    drop(c);
    finish(&dev);
}

/// Calls through the table as a C kernel ULP does.
struct Table(IvKernelInterface);

impl Table {
    fn open_qp(&self, out: &IvCreateQpOut) -> *mut IvKernelQp {
        let mut qp = ptr::null_mut();
        // SAFETY: `out` is a create response of this device; the test closes
        // the QP before destroying it.
        let st = unsafe { (self.0.open_qp)(self.0.context, out, &mut qp) };
        assert_eq!(st, STATUS_SUCCESS);
        qp
    }
    fn open_cq(&self, out: &IvCreateCqOut) -> *mut IvKernelCq {
        let mut cq = ptr::null_mut();
        // SAFETY: as above.
        let st = unsafe { (self.0.open_cq)(self.0.context, out.cqn, &out.ring, &mut cq) };
        assert_eq!(st, STATUS_SUCCESS);
        cq
    }
    fn post_send(&self, qp: *mut IvKernelQp, wr: &IvKernelSendWr) -> NtStatus {
        // SAFETY: an open QP; `wr`'s pointers are valid.
        unsafe { (self.0.post_send)(self.0.context, qp, wr) }
    }
    fn post_recv(&self, qp: *mut IvKernelQp, wr: &IvKernelRecvWr) -> NtStatus {
        // SAFETY: as above.
        unsafe { (self.0.post_recv)(self.0.context, qp, wr) }
    }
    fn poll(&self, cq: *mut IvKernelCq, wc: &mut [IvCqe]) -> i32 {
        // SAFETY: an open CQ; `wc` holds `wc.len()` entries.
        unsafe { (self.0.poll_cq)(self.0.context, cq, wc.as_mut_ptr(), wc.len() as u32) }
    }
    fn arm(&self, cq: *mut IvKernelCq, solicited: bool) -> NtStatus {
        // SAFETY: an open CQ.
        unsafe { (self.0.req_notify_cq)(self.0.context, cq, i32::from(solicited)) }
    }
    fn close_qp(&self, qp: *mut IvKernelQp) {
        // SAFETY: opened above, closed once.
        unsafe { (self.0.close_qp)(self.0.context, qp) };
    }
    fn close_cq(&self, cq: *mut IvKernelCq) {
        // SAFETY: opened above, closed once.
        unsafe { (self.0.close_cq)(self.0.context, cq) };
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        // SAFETY: the reference query_interface returned, given back once.
        unsafe { (self.0.interface_dereference)(self.0.context) };
    }
}

fn the_kernel_table_works_at_dispatch_level(backend: Backend) {
    for engine in ENGINES {
        let dev = device(backend, engine);
        let table = Table(dev.query_interface().expect("the kernel interface"));
        assert_eq!(table.0.size as usize, size_of::<IvKernelInterface>());
        let c = Client::new(Box::new(dev.open_kernel().unwrap()));
        let pd = c.alloc_pd().unwrap().pd;
        let cq_out = c.create_cq(8).unwrap();
        let qp_out = c.create_qp_with(&qp_in(pd, cq_out.cq, 0)).unwrap();
        let qp = table.open_qp(&qp_out);
        let cq = table.open_cq(&cq_out);

        let old = dev.platform().raise_irql(DISPATCH_LEVEL);
        let list = [sge(0x1000, 4, 1)];
        let wr = IvKernelSendWr {
            wr_id: 0x42,
            opcode: IV_WR_SEND,
            flags: IV_SEND_SIGNALED,
            num_sge: 1,
            sg_list: list.as_ptr(),
            ..IvKernelSendWr::default()
        };
        assert_eq!(table.post_send(qp, &wr), STATUS_SUCCESS);
        let rwr = IvKernelRecvWr {
            wr_id: 0x43,
            sg_list: list.as_ptr(),
            num_sge: 1,
            reserved: 0,
        };
        assert_eq!(table.post_recv(qp, &rwr), STATUS_SUCCESS);
        let mut wc = [IvCqe::default(); 2];
        assert_eq!(table.poll(cq, &mut wc), 0);
        assert_eq!(table.arm(cq, false), STATUS_SUCCESS);
        dev.platform().lower_irql(old);

        // SAFETY: the rings are the driver's, alive until the destroys below.
        let sq = unsafe { irpverbs_ring::Ring::from_map(&qp_out.sq) }.unwrap();
        let w = read_send_wqe(&sq, 0, 2, 64).unwrap();
        assert_eq!((w.header.wr_id, w.sges[0]), (0x42, list[0]));
        drop(sq);
        // SAFETY: as above.
        let cq_ring = unsafe { irpverbs_ring::Ring::from_map(&cq_out.ring) }.unwrap();
        assert_ne!(
            cq_ring.arm_word().load(Ordering::Acquire) & IV_CQ_ARM_NEXT,
            0
        );
        drop(cq_ring);

        table.close_qp(qp);
        table.close_cq(cq);
        c.destroy_qp(qp_out.qp).unwrap();
        c.destroy_cq(cq_out.cq).unwrap();
        c.dealloc_pd(pd).unwrap();
        drop(c);
        drop(table);
        finish(&dev);
    }
}

/// A kernel ULP may call the table at PASSIVE_LEVEL (a thread) and from a
/// DPC on the same processor: every post and poll holds its queue's lock at
/// DISPATCH_LEVEL, so the DPC cannot preempt a holder and spin on the same
/// queue forever. The verifier checks the rings' own locks (0xC4/0x40
/// below DISPATCH_LEVEL); a table whose lock left IRQL alone fails here.
fn the_kernel_table_holds_its_queues_at_dispatch_level_from_passive_callers(backend: Backend) {
    let dev = device(backend, Engine::Inline);
    let table = Table(dev.query_interface().expect("the kernel interface"));
    let c = Client::new(Box::new(dev.open_kernel().unwrap()));
    let pd = c.alloc_pd().unwrap().pd;
    let cq_out = c.create_cq(8).unwrap();
    let qp_out = c.create_qp_with(&qp_in(pd, cq_out.cq, 0)).unwrap();
    let qp = table.open_qp(&qp_out);
    let cq = table.open_cq(&cq_out);
    let list = [sge(0x1000, 4, 1)];
    let wr = IvKernelSendWr {
        wr_id: 0x42,
        opcode: IV_WR_SEND,
        flags: IV_SEND_SIGNALED,
        num_sge: 1,
        sg_list: list.as_ptr(),
        ..IvKernelSendWr::default()
    };
    let rwr = IvKernelRecvWr {
        wr_id: 0x43,
        sg_list: list.as_ptr(),
        num_sge: 1,
        reserved: 0,
    };
    assert_eq!(current_irql(), PASSIVE_LEVEL);
    let at_passive = catch_bugcheck(|| {
        let mut wc = [IvCqe::default(); 2];
        (
            table.post_send(qp, &wr),
            table.post_recv(qp, &rwr),
            table.poll(cq, &mut wc),
            table.arm(cq, false),
        )
    });
    assert_eq!(
        at_passive,
        Ok((STATUS_SUCCESS, STATUS_SUCCESS, 0, STATUS_SUCCESS)),
        "the table's calls from PASSIVE_LEVEL"
    );
    assert_eq!(current_irql(), PASSIVE_LEVEL, "back at the caller's IRQL");
    // And from a DPC of this processor, on the same queues.
    let from_dpc = Arc::new(std::sync::Mutex::new(None));
    let (t, out) = (SendTable(&raw const table, qp, cq), Arc::clone(&from_dpc));
    let dpc = dev.platform().new_dpc(move || {
        let list = [sge(0x1000, 4, 1)];
        let rwr = IvKernelRecvWr {
            wr_id: 0x44,
            sg_list: list.as_ptr(),
            num_sge: 1,
            reserved: 0,
        };
        let mut wc = [IvCqe::default(); 2];
        *out.lock().unwrap() = Some((current_irql(), t.post_recv(t.1, &rwr), t.poll(t.2, &mut wc)));
    });
    assert!(dpc.insert(), "runs at once from PASSIVE_LEVEL");
    assert_eq!(
        from_dpc.lock().unwrap().take(),
        Some((DISPATCH_LEVEL, STATUS_SUCCESS, 0))
    );

    table.close_qp(qp);
    table.close_cq(cq);
    c.destroy_qp(qp_out.qp).unwrap();
    c.destroy_cq(cq_out.cq).unwrap();
    c.dealloc_pd(pd).unwrap();
    drop(c);
    drop(table);
    finish(&dev);
}

/// The table and two objects opened through it, for a DPC routine.
struct SendTable(*const Table, *mut IvKernelQp, *mut IvKernelCq);

// SAFETY: the test's table and objects outlive the DPC, which runs on the
// test's own thread (inserted at PASSIVE_LEVEL, it runs before `insert`
// returns).
unsafe impl Send for SendTable {}
// SAFETY: as above.
unsafe impl Sync for SendTable {}

impl std::ops::Deref for SendTable {
    type Target = Table;
    fn deref(&self) -> &Table {
        // SAFETY: see `Send` above.
        unsafe { &*self.0 }
    }
}

/// The verifier's check of a kernel caller's ring lock (the table's rings
/// get it): taken below DISPATCH_LEVEL, it is the same-processor deadlock
/// waiting for a DPC, and bugchecks 0xC4/0x40 (IRQL, lock); at
/// DISPATCH_LEVEL it passes.
fn the_verifier_bugchecks_a_kernel_ring_lock_taken_below_dispatch_level(backend: Backend) {
    let dev = device(backend, Engine::Inline);
    let c = Client::new(Box::new(dev.open_kernel().unwrap()));
    let cq_out = c.create_cq(8).unwrap();
    // SAFETY: the CQ's ring, alive until the destroy below.
    let mut rings = unsafe { CqRings::from_map(cq_out.cqn, &cq_out.ring) }.unwrap();
    rings.set_lock_check(speed_lock_check);
    let mut wc = [IvCqe::default(); 2];
    let check = catch_bugcheck(|| rings.poll(&mut wc)).unwrap_err();
    assert_eq!(
        (check.code, check.params[0], check.params[1]),
        (0xC4, 0x40, u64::from(PASSIVE_LEVEL)),
        "{check:?}"
    );
    let old = dev.platform().raise_irql(DISPATCH_LEVEL);
    assert_eq!(rings.poll(&mut wc), Ok(0));
    dev.platform().lower_irql(old);
    drop(rings);
    c.destroy_cq(cq_out.cq).unwrap();
    drop(c);
    finish(&dev);
}

// ---- data movement: these need the transport engine -------------------

const SRC: usize = 0;
const DST: usize = 1024;
const REMOTE: usize = 2048;
const READ_BACK: usize = 3072;
const BUF: usize = 4096;

/// Polls `cq` until it holds one completion (or the deadline).
fn one(cq: &Cq<'_>, what: &str) -> IvCqe {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut wc = [IvCqe::default(); 1];
    loop {
        if cq.poll(&mut wc).unwrap() == 1 {
            return wc[0];
        }
        assert!(
            Instant::now() < deadline,
            "no completion for {what} (is the transport engine there?)"
        );
        std::thread::yield_now();
    }
}

fn ok(cqe: &IvCqe, opcode: u32, wr_id: u64) {
    let w = Wc::new(cqe);
    assert!(w.is_success(), "{w}");
    assert_eq!((w.opcode(), w.wr_id()), (opcode, wr_id), "{w}");
}

struct Pair<'c> {
    a: Qp<'c>,
    b: Qp<'c>,
    cqa: Cq<'c>,
    cqb: Cq<'c>,
}

fn connected_pair(c: &Client, pd: IvHandle) -> Pair<'_> {
    let cqa = c.new_cq(&cq_in(32)).unwrap();
    let cqb = c.new_cq(&cq_in(32)).unwrap();
    let a = c.new_qp(&qp_in(pd, cqa.handle(), 0)).unwrap();
    let b = c.new_qp(&qp_in(pd, cqb.handle(), 0)).unwrap();
    let gid = c.query_gid(1, 0).unwrap();
    a.connect(b.qpn(), gid).unwrap();
    b.connect(a.qpn(), gid).unwrap();
    Pair { a, b, cqa, cqb }
}

fn loopback_rc_send_write_read_through_the_rust_api(backend: Backend) {
    for engine in ENGINES {
        let dev = device(backend, engine);
        let c = client(&dev);
        let pd = c.alloc_pd().unwrap().pd;
        let mut buf = vec![0u8; BUF];
        for (i, b) in buf[SRC..SRC + 1024].iter_mut().enumerate() {
            *b = (i * 7 + 3) as u8;
        }
        let base = buf.as_mut_ptr() as u64;
        let mr = c
            .reg_mr(
                pd,
                base,
                BUF as u64,
                IV_ACCESS_LOCAL_WRITE | IV_ACCESS_REMOTE_WRITE | IV_ACCESS_REMOTE_READ,
            )
            .unwrap();
        let at = |off: usize, len: u32| sge(base + off as u64, len, mr.lkey);
        let p = connected_pair(&c, pd);

        // SEND / RECV.
        p.b.post_recv(100, &[at(DST, 1024)]).unwrap();
        p.a.post_send(&SendWr {
            wr_id: 1,
            opcode: IV_WR_SEND,
            flags: IV_SEND_SIGNALED,
            sges: &[at(SRC, 100)],
            ..SendWr::default()
        })
        .unwrap();
        ok(&one(&p.cqa, "SEND"), IV_WC_OP_SEND, 1);
        let r = one(&p.cqb, "RECV");
        ok(&r, IV_WC_OP_RECV, 100);
        assert_eq!(r.byte_len, 100);
        assert_eq!(r.qp_num, p.b.qpn());
        assert_eq!(buf[DST..DST + 100], buf[SRC..SRC + 100]);

        // SEND with immediate, inline.
        p.b.post_recv(101, &[at(DST, 1024)]).unwrap();
        p.a.post_send(&SendWr {
            wr_id: 2,
            opcode: IV_WR_SEND_WITH_IMM,
            flags: IV_SEND_SIGNALED,
            inline: Some(b"sixteen bytes!!!"),
            imm_or_inv: 0x0102_0304,
            ..SendWr::default()
        })
        .unwrap();
        ok(&one(&p.cqa, "SEND inline"), IV_WC_OP_SEND, 2);
        let r = one(&p.cqb, "RECV imm");
        ok(&r, IV_WC_OP_RECV, 101);
        assert_eq!(Wc::new(&r).imm(), Some(0x0102_0304));
        assert_eq!(&buf[DST..DST + 16], b"sixteen bytes!!!");

        // RDMA WRITE into B's memory, then RDMA READ it back to A's.
        p.a.post_send(&SendWr {
            wr_id: 3,
            opcode: IV_WR_RDMA_WRITE,
            flags: IV_SEND_SIGNALED,
            sges: &[at(SRC, 512), at(SRC + 512, 256)],
            remote_addr: base + REMOTE as u64,
            rkey: mr.rkey,
            ..SendWr::default()
        })
        .unwrap();
        ok(&one(&p.cqa, "RDMA WRITE"), IV_WC_OP_RDMA_WRITE, 3);
        assert_eq!(buf[REMOTE..REMOTE + 768], buf[SRC..SRC + 768]);
        p.a.post_send(&SendWr {
            wr_id: 4,
            opcode: IV_WR_RDMA_READ,
            flags: IV_SEND_SIGNALED,
            sges: &[at(READ_BACK, 768)],
            remote_addr: base + REMOTE as u64,
            rkey: mr.rkey,
            ..SendWr::default()
        })
        .unwrap();
        let r = one(&p.cqa, "RDMA READ");
        ok(&r, IV_WC_OP_RDMA_READ, 4);
        assert_eq!(r.byte_len, 768);
        assert_eq!(buf[READ_BACK..READ_BACK + 768], buf[SRC..SRC + 768]);

        // A bad rkey completes in error (the QP goes to ERR).
        p.a.post_send(&SendWr {
            wr_id: 5,
            opcode: IV_WR_RDMA_WRITE,
            flags: IV_SEND_SIGNALED,
            sges: &[at(SRC, 8)],
            remote_addr: base + REMOTE as u64,
            rkey: mr.rkey ^ 0xFF00,
            ..SendWr::default()
        })
        .unwrap();
        let e = one(&p.cqa, "bad rkey");
        assert_eq!(
            Wc::new(&e).status_name(),
            "REM_ACCESS_ERR",
            "{}",
            Wc::new(&e)
        );

        // The error left an async event unacknowledged on a QP, which makes
        // its destroy busy: the objects' drops try, and closing the file
        // runs the rest down (the MR too, before its memory goes).
        drop(p);
        drop(c);
        drop(buf);
        finish(&dev);
    }
}

fn loopback_rc_send_through_the_kernel_table(backend: Backend) {
    for engine in ENGINES {
        let dev = device(backend, engine);
        let table = Table(dev.query_interface().expect("the kernel interface"));
        let c = Client::new(Box::new(dev.open_kernel().unwrap()));
        let pd = c.alloc_pd().unwrap().pd;
        let mut buf = vec![0u8; BUF];
        buf[..64].copy_from_slice(&[0x5A; 64]);
        let base = buf.as_mut_ptr() as u64;
        let mr = c
            .reg_mr(pd, base, BUF as u64, IV_ACCESS_LOCAL_WRITE)
            .unwrap();
        let cqa_out = c.create_cq(16).unwrap();
        let cqb_out = c.create_cq(16).unwrap();
        let a_out = c.create_qp_with(&qp_in(pd, cqa_out.cq, 0)).unwrap();
        let b_out = c.create_qp_with(&qp_in(pd, cqb_out.cq, 0)).unwrap();
        let gid = c.query_gid(1, 0).unwrap();
        c.connect_qp(a_out.qp, IV_QPT_RC, b_out.qpn, gid).unwrap();
        c.connect_qp(b_out.qp, IV_QPT_RC, a_out.qpn, gid).unwrap();
        let (a, b) = (table.open_qp(&a_out), table.open_qp(&b_out));
        let (cqa, cqb) = (table.open_cq(&cqa_out), table.open_cq(&cqb_out));

        let old = dev.platform().raise_irql(DISPATCH_LEVEL);
        let dst = [sge(base + DST as u64, 1024, mr.lkey)];
        let src = [sge(base, 64, mr.lkey)];
        let rwr = IvKernelRecvWr {
            wr_id: 9,
            sg_list: dst.as_ptr(),
            num_sge: 1,
            reserved: 0,
        };
        assert_eq!(table.post_recv(b, &rwr), STATUS_SUCCESS);
        let wr = IvKernelSendWr {
            wr_id: 8,
            opcode: IV_WR_SEND,
            flags: IV_SEND_SIGNALED,
            num_sge: 1,
            sg_list: src.as_ptr(),
            ..IvKernelSendWr::default()
        };
        assert_eq!(table.post_send(a, &wr), STATUS_SUCCESS);
        dev.platform().lower_irql(old);

        let deadline = Instant::now() + Duration::from_secs(10);
        let mut wc = [IvCqe::default(); 1];
        let mut got = (None, None);
        while got.0.is_none() || got.1.is_none() {
            assert!(Instant::now() < deadline, "no completion (engine?)");
            if got.0.is_none() && table.poll(cqa, &mut wc) == 1 {
                got.0 = Some(wc[0]);
            }
            if got.1.is_none() && table.poll(cqb, &mut wc) == 1 {
                got.1 = Some(wc[0]);
            }
            std::thread::yield_now();
        }
        ok(&got.0.unwrap(), IV_WC_OP_SEND, 8);
        let r = got.1.unwrap();
        ok(&r, IV_WC_OP_RECV, 9);
        assert_eq!(r.byte_len, 64);
        assert_eq!(buf[DST..DST + 64], [0x5A; 64]);

        table.close_qp(a);
        table.close_qp(b);
        table.close_cq(cqa);
        table.close_cq(cqb);
        c.destroy_qp(a_out.qp).unwrap();
        c.destroy_qp(b_out.qp).unwrap();
        c.destroy_cq(cqa_out.cq).unwrap();
        c.destroy_cq(cqb_out.cq).unwrap();
        c.dereg_mr(mr.mr).unwrap();
        c.dealloc_pd(pd).unwrap();
        drop(c);
        drop(table);
        drop(buf);
        finish(&dev);
    }
}

/// Polls `cq` into `cqes`: how many completed, all successfully; an error
/// naming `what` for a failed one, or for nothing past `deadline`.
fn poll_ok(
    cq: &Cq<'_>,
    cqes: &mut [IvCqe],
    deadline: Instant,
    what: &str,
) -> Result<usize, String> {
    let n = cq.poll(cqes).map_err(|_| "corrupt CQ")?;
    if n == 0 && Instant::now() > deadline {
        return Err(format!("{what} stalled"));
    }
    match cqes[..n].iter().find(|c| c.status != IV_WC_SUCCESS) {
        Some(c) => Err(format!("{what}: status {}", c.status)),
        None => Ok(n),
    }
}

/// Four RC pairs whose responders share one SRQ, verifier on, firmware
/// inline and on its own thread: one thread sends (SENDs and WRITEs with
/// immediate, alternating, each 64 bytes of its own) while another polls
/// the shared receive CQ and reposts each receive buffer on the SRQ once
/// it has checked it, granting the sender a credit per receive posted (a
/// ULP's flow control: no RNR NAK). Every message arrives once, whole and
/// in order per QP; the SRQ's limit event comes (armed at creation above
/// what was posted); the fast path took every message.
fn an_srq_shared_by_four_qps_under_two_threads(backend: Backend) {
    const QPS: usize = 4;
    const MSGS: u64 = 2000;
    /// Sends in flight per QP (and never more than the receives posted).
    const WINDOW: u64 = 12;
    const MSG: usize = 64;
    /// Receive buffers (one per SRQ WQE, reposted after each check).
    const RBUFS: usize = 63;
    const WRITES: usize = RBUFS * MSG;
    const BYTES: usize = WRITES + QPS * MSGS as usize * MSG;
    for engine in ENGINES {
        let dev = device(backend, engine);
        let c = client(&dev);
        let pd = c.alloc_pd().unwrap().pd;
        // Sender's messages (source) and the receiver's memory: one MR of
        // words written and read atomically (the HCA writes behind Rust).
        let src: Vec<u8> = (0..QPS * MSGS as usize * MSG)
            .map(|i| (i * 7 + 3) as u8)
            .collect();
        let mem: Box<[std::sync::atomic::AtomicU8]> = (0..BYTES)
            .map(|_| std::sync::atomic::AtomicU8::new(0))
            .collect();
        let base = mem.as_ptr() as u64;
        let access = IV_ACCESS_LOCAL_WRITE | IV_ACCESS_REMOTE_WRITE;
        let mr = c.reg_mr(pd, base, BYTES as u64, access).unwrap();
        let smr = c
            .reg_mr(pd, src.as_ptr() as u64, src.len() as u64, 0)
            .unwrap();
        let msg_at = |q: usize, k: u64| (q * MSGS as usize + k as usize) * MSG;
        let cqa = c.new_cq(&cq_in(256)).unwrap();
        let cqb = c.new_cq(&cq_in(256)).unwrap();
        let srq = c
            .new_srq(&IvCreateSrqIn {
                pd,
                max_wr: 63,
                max_sge: 1,
                srq_limit: 4,
                ..IvCreateSrqIn::default()
            })
            .unwrap();
        let gid = c.query_gid(1, 0).unwrap();
        let mut senders = Vec::new();
        let mut receivers = Vec::new();
        for _ in 0..QPS {
            let mut a_in = qp_in(pd, cqa.handle(), 0);
            a_in.cap.max_send_wr = WINDOW as u32 * 2;
            let a = c.new_qp(&a_in).unwrap();
            let b = c.new_qp(&qp_in(pd, cqb.handle(), srq.handle())).unwrap();
            a.connect(b.qpn(), gid).unwrap();
            b.connect(a.qpn(), gid).unwrap();
            senders.push(a);
            receivers.push(b);
        }
        let rqpns: Vec<u32> = receivers.iter().map(Qp::qpn).collect();
        let recv_sge = |slot: u64| [sge(base + slot * MSG as u64, MSG as u32, mr.lkey)];
        // The limit (4) is armed: post 4, so that the first message takes
        // the SRQ below it.
        for slot in 0..4 {
            srq.post_recv(slot, &recv_sge(slot)).unwrap();
        }
        // Receives posted and not yet taken by a message sent.
        let credits = std::sync::atomic::AtomicI64::new(4);
        let before = dev.soft().stats();
        let fault = std::thread::scope(|s| {
            let receiver = s.spawn(|| -> Result<(), String> {
                let mut next = [0u64; QPS];
                let mut posted = 4u64;
                let mut cqes = [IvCqe::default(); 32];
                let deadline = Instant::now() + Duration::from_secs(60);
                while next.iter().sum::<u64>() < QPS as u64 * MSGS {
                    // Keep the SRQ topped up to all its buffers, once the
                    // first message has taken it below its limit (topped
                    // up before, it would never go below: a thread that
                    // got a processor before the sender's first post, as
                    // on 2 processors with the firmware thread yielding,
                    // left the test waiting for the limit event forever).
                    while posted < RBUFS as u64 && next.iter().sum::<u64>() > 0 {
                        srq.post_recv(posted, &recv_sge(posted))
                            .map_err(|e| format!("post_srq_recv: {e:?}"))?;
                        credits.fetch_add(1, Ordering::Release);
                        posted += 1;
                    }
                    let n = poll_ok(&cqb, &mut cqes, deadline, "receives")?;
                    for c in &cqes[..n] {
                        let q = rqpns
                            .iter()
                            .position(|&n| n == c.qp_num)
                            .ok_or("a receive on no QP of the test")?;
                        let k = next[q];
                        let slot = c.wr_id as usize;
                        let (data_at, imm) = if k % 2 == 0 {
                            (slot * MSG, None)
                        } else {
                            (WRITES + msg_at(q, k), Some(k as u32))
                        };
                        let got: Vec<u8> = mem[data_at..data_at + MSG]
                            .iter()
                            .map(|b| b.load(Ordering::Relaxed))
                            .collect();
                        let want = &src[msg_at(q, k)..msg_at(q, k) + MSG];
                        if got != want || Wc::new(c).imm() != imm || c.byte_len != MSG as u32 {
                            return Err(format!("QP {q} message {k}: wrong"));
                        }
                        next[q] += 1;
                        // The buffer is checked: back on the SRQ.
                        srq.post_recv(c.wr_id, &recv_sge(c.wr_id))
                            .map_err(|e| format!("post_srq_recv: {e:?}"))?;
                        credits.fetch_add(1, Ordering::Release);
                    }
                }
                Ok(())
            });
            let sent: Result<(), String> = (|| {
                let mut posted = [0u64; QPS];
                let mut done = [0u64; QPS];
                let mut cqes = [IvCqe::default(); 32];
                let deadline = Instant::now() + Duration::from_secs(60);
                while done.iter().sum::<u64>() < QPS as u64 * MSGS {
                    for q in 0..QPS {
                        while posted[q] < MSGS
                            && posted[q] - done[q] < WINDOW
                            && credits.load(Ordering::Acquire) > 0
                        {
                            credits.fetch_sub(1, Ordering::Relaxed);
                            let k = posted[q];
                            let at = msg_at(q, k);
                            let g = [sge(src.as_ptr() as u64 + at as u64, MSG as u32, smr.lkey)];
                            let write = k % 2 == 1;
                            senders[q]
                                .post_send(&SendWr {
                                    wr_id: (q as u64) << 32 | k,
                                    opcode: if write {
                                        IV_WR_RDMA_WRITE_WITH_IMM
                                    } else {
                                        IV_WR_SEND
                                    },
                                    flags: IV_SEND_SIGNALED,
                                    sges: &g,
                                    remote_addr: base + (WRITES + at) as u64,
                                    rkey: mr.rkey,
                                    imm_or_inv: k as u32,
                                    ..SendWr::default()
                                })
                                .map_err(|e| format!("post_send: {e:?}"))?;
                            posted[q] += 1;
                        }
                    }
                    let n = poll_ok(&cqa, &mut cqes, deadline, "sends")?;
                    for c in &cqes[..n] {
                        done[(c.wr_id >> 32) as usize] += 1;
                    }
                }
                Ok(())
            })();
            let received = receiver.join().unwrap();
            sent.and(received)
        });
        assert_eq!(fault, Ok(()), "{engine:?}");
        let after = dev.soft().stats();
        assert_eq!(
            (
                after.fast_path_wqes - before.fast_path_wqes,
                after.rnr_naks - before.rnr_naks
            ),
            (QPS as u64 * MSGS, 0),
            "{engine:?}: {after:?}"
        );
        let e = c.get_async_event().unwrap();
        assert_eq!(
            (e.event_type, e.handle),
            (IV_EVENT_SRQ_LIMIT_REACHED, srq.handle())
        );
        c.ack_async_event(e.handle, e.event_type).unwrap();
        drop((senders, receivers, srq, cqa, cqb));
        c.dereg_mr(mr.mr).unwrap();
        c.dereg_mr(smr.mr).unwrap();
        c.dealloc_pd(pd).unwrap();
        drop(c);
        drop(mem);
        finish(&dev);
    }
}
