//! The kernel ULPs' function table, called through its C function pointers
//! as a C kernel ULP calls it: objects opened from create responses, posts
//! that land in the rings with their doorbells, polls, arms, and the
//! interface's reference count.
#![allow(unsafe_code, reason = "calling the C ABI as a C ULP does")]

use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use irpverbs_abi::*;
use irpverbs_kernel_table::kernel::{
    IV_KERNEL_INTERFACE_VERSION, IvKernelCq, IvKernelInterface, IvKernelQp, IvKernelRecvWr,
    IvKernelSendWr, IvKernelSrq, SpeedLock, SpeedPlatform, interface,
};
use irpverbs_kernel_table::{Bell as QueueBell, Doorbells};
use irpverbs_ring::Ring;
use irpverbs_ring::wq::{
    LockCheck, push_cqe, read_recv_wqe, read_send_wqe, recv_stride, send_stride,
};

/// Forwards to the system allocator; a test arms it to refuse one
/// allocation of its thread.
#[global_allocator]
static ALLOC: irpverbs_failalloc::FailAlloc = irpverbs_failalloc::FailAlloc;

/// A doorbell as recorded: which one and the queue number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bell {
    Sq(u32),
    Rq(u32),
    Srq(u32),
    CqArm(u32),
}

/// Doorbells that record.
#[derive(Debug, Default)]
struct Bells(Mutex<Vec<Bell>>);

impl Bells {
    fn take(&self) -> Vec<Bell> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

impl Bells {
    /// Records `bell`: a kernel ULP's views ring by number, with no
    /// doorbell page slot.
    fn record(&self, bell: Bell, rung: QueueBell) {
        assert_eq!(rung.slot, IV_DOORBELL_NONE, "{bell:?}");
        assert_eq!(HELD.get(), 0, "{bell:?} rung with the queue's lock held");
        self.0.lock().unwrap().push(bell);
    }
}

impl Doorbells for Bells {
    fn sq(&self, qp: QueueBell) {
        self.record(Bell::Sq(qp.number), qp);
    }
    fn rq(&self, qp: QueueBell) {
        self.record(Bell::Rq(qp.number), qp);
    }
    fn srq(&self, srq: QueueBell) {
        self.record(Bell::Srq(srq.number), srq);
    }
    fn cq_arm(&self, cq: QueueBell) {
        self.record(Bell::CqArm(cq.number), cq);
    }
}

thread_local! {
    /// The table's queue locks this thread holds (a stand-in for "raised
    /// to DISPATCH_LEVEL").
    static HELD: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// A platform whose locks count holds on the thread and in total, and
/// whose ring-lock check asserts that the table's lock is held around it.
#[derive(Debug, Default)]
struct Locks {
    holds: Arc<AtomicU32>,
}

struct CountingLock(Arc<AtomicU32>);

impl SpeedLock for CountingLock {
    fn acquire(&self) -> u8 {
        HELD.set(HELD.get() + 1);
        self.0.fetch_add(1, Ordering::Relaxed);
        2
    }
    fn release(&self, old: u8) {
        assert_eq!(old, 2, "released to what acquire returned");
        HELD.set(HELD.get() - 1);
    }
}

fn ring_lock_check(_lock: usize) {
    assert!(HELD.get() > 0, "a ring locked outside the table's lock");
}

impl SpeedPlatform for Locks {
    fn new_lock(&self) -> Result<Box<dyn SpeedLock>, NtStatus> {
        irpverbs_ring::try_box(CountingLock(Arc::clone(&self.holds)))
            .map(|b| b as Box<dyn SpeedLock>)
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)
    }
    fn lock_check(&self) -> Option<LockCheck> {
        Some(ring_lock_check)
    }
}

/// The table over `bells`, with counting locks.
fn table(bells: &Arc<Bells>) -> IvKernelInterface {
    interface(Arc::clone(bells), Locks::default()).expect("memory for the context")
}

/// What the driver would have returned from the internal-IOCTL creates,
/// with the rings kept alive by the test.
struct Created {
    rings: Vec<Ring>,
    qp: IvCreateQpOut,
    cq: IvCreateCqOut,
    srq: IvCreateSrqOut,
}

fn created() -> Created {
    let cap = IvQpCap {
        max_send_wr: 7,
        max_recv_wr: 7,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
        reserved: 0,
    };
    let sq = Ring::alloc(8, send_stride(2, 64)).unwrap();
    let rq = Ring::alloc(8, recv_stride(2)).unwrap();
    let cq = Ring::alloc(16, 64).unwrap();
    let srq = Ring::alloc(4, recv_stride(1)).unwrap();
    Created {
        qp: IvCreateQpOut {
            qp: 1,
            qpn: 0x21,
            cap,
            sq: sq.map(),
            rq: rq.map(),
            ..IvCreateQpOut::default()
        },
        cq: IvCreateCqOut {
            cq: 2,
            cqn: 0x31,
            cqe: 15,
            ring: cq.map(),
        },
        srq: IvCreateSrqOut {
            srq: 3,
            srqn: 0x41,
            max_wr: 3,
            max_sge: 1,
            reserved: 0,
            ring: srq.map(),
        },
        rings: vec![sq, rq, cq, srq],
    }
}

struct Opened {
    qp: *mut IvKernelQp,
    cq: *mut IvKernelCq,
    srq: *mut IvKernelSrq,
}

fn open(t: &IvKernelInterface, c: &Created) -> Opened {
    let mut o = Opened {
        qp: ptr::null_mut(),
        cq: ptr::null_mut(),
        srq: ptr::null_mut(),
    };
    // SAFETY: the responses describe rings `c` keeps alive past `close`.
    let st = unsafe { (t.open_qp)(t.context, &c.qp, &mut o.qp) };
    assert_eq!(st, STATUS_SUCCESS);
    // SAFETY: as above.
    let st = unsafe { (t.open_cq)(t.context, c.cq.cqn, &c.cq.ring, &mut o.cq) };
    assert_eq!(st, STATUS_SUCCESS);
    // SAFETY: as above.
    let st = unsafe { (t.open_srq)(t.context, &c.srq, &mut o.srq) };
    assert_eq!(st, STATUS_SUCCESS);
    assert!(!o.qp.is_null() && !o.cq.is_null() && !o.srq.is_null());
    o
}

fn close(t: &IvKernelInterface, o: Opened) {
    // SAFETY: opened by `open`, closed once.
    unsafe { (t.close_qp)(t.context, o.qp) };
    // SAFETY: as above.
    unsafe { (t.close_cq)(t.context, o.cq) };
    // SAFETY: as above.
    unsafe { (t.close_srq)(t.context, o.srq) };
}

#[test]
fn the_table_posts_polls_and_arms_through_its_function_pointers() {
    let bells = Arc::new(Bells::default());
    let t = table(&bells);
    assert_eq!(t.size as usize, size_of::<IvKernelInterface>());
    assert_eq!(t.version, IV_KERNEL_INTERFACE_VERSION);
    let c = created();
    let o = open(&t, &c);

    // post_send with a gather list.
    let sges = [
        IvSge {
            addr: 0x1000,
            length: 4,
            lkey: 9,
        },
        IvSge {
            addr: 0x2000,
            length: 4,
            lkey: 9,
        },
    ];
    let wr = IvKernelSendWr {
        wr_id: 0x51,
        opcode: IV_WR_RDMA_READ,
        flags: IV_SEND_SIGNALED,
        num_sge: 2,
        remote_addr: 0xAB00,
        rkey: 0x66,
        sg_list: sges.as_ptr(),
        ..IvKernelSendWr::default()
    };
    // SAFETY: a valid open QP and work request.
    let st = unsafe { (t.post_send)(t.context, o.qp, &wr) };
    assert_eq!(st, STATUS_SUCCESS);
    let w = read_send_wqe(&c.rings[0], 0, 2, 64).unwrap();
    assert_eq!(
        (w.header.wr_id, w.header.opcode, w.header.num_sge),
        (0x51, IV_WR_RDMA_READ, 2)
    );
    assert_eq!((w.header.remote_addr, w.header.rkey), (0xAB00, 0x66));
    assert_eq!(&w.sges[..2], &sges);

    // post_send with inline data.
    let data = *b"kernel inline";
    let wr = IvKernelSendWr {
        wr_id: 0x52,
        opcode: IV_WR_SEND_WITH_IMM,
        flags: IV_SEND_INLINE | IV_SEND_SOLICITED,
        imm_or_inv: 0xCAFE,
        inline_len: data.len() as u32,
        inline_data: data.as_ptr().cast::<c_void>(),
        ..IvKernelSendWr::default()
    };
    // SAFETY: as above.
    let st = unsafe { (t.post_send)(t.context, o.qp, &wr) };
    assert_eq!(st, STATUS_SUCCESS);
    let w = read_send_wqe(&c.rings[0], 1, 2, 64).unwrap();
    assert_eq!(w.header.inline_len as usize, data.len());
    let (off, len) = irpverbs_ring::wq::inline_data(&c.rings[0], 1, &w);
    let mut got = [0u8; 13];
    c.rings[0].region().read(off, &mut got[..len]).unwrap();
    assert_eq!(got, data);

    // post_recv and post_srq_recv, with the HCA asking for their
    // doorbells (the rings' doorbell requests).
    c.rings[1].doorbell_request().set(true);
    c.rings[3].doorbell_request().set(true);
    let rwr = IvKernelRecvWr {
        wr_id: 0x61,
        sg_list: sges.as_ptr(),
        num_sge: 2,
        reserved: 0,
    };
    // SAFETY: as above.
    let st = unsafe { (t.post_recv)(t.context, o.qp, &rwr) };
    assert_eq!(st, STATUS_SUCCESS);
    let w = read_recv_wqe(&c.rings[1], 0, 2).unwrap();
    assert_eq!((w.wr_id, w.num_sge), (0x61, 2));
    let swr = IvKernelRecvWr {
        wr_id: 0x71,
        num_sge: 1,
        ..rwr
    };
    // SAFETY: as above.
    let st = unsafe { (t.post_srq_recv)(t.context, o.srq, &swr) };
    assert_eq!(st, STATUS_SUCCESS);
    assert_eq!(read_recv_wqe(&c.rings[3], 0, 1).unwrap().wr_id, 0x71);
    assert_eq!(
        bells.take(),
        [
            Bell::Sq(0x21),
            Bell::Sq(0x21),
            Bell::Rq(0x21),
            Bell::Srq(0x41)
        ]
    );
    // Not asked: posted, not rung.
    c.rings[1].doorbell_request().set(false);
    c.rings[3].doorbell_request().set(false);
    // SAFETY: as above.
    let st = unsafe { (t.post_recv)(t.context, o.qp, &rwr) };
    assert_eq!(st, STATUS_SUCCESS);
    // SAFETY: as above.
    let st = unsafe { (t.post_srq_recv)(t.context, o.srq, &swr) };
    assert_eq!(st, STATUS_SUCCESS);
    assert_eq!(read_recv_wqe(&c.rings[1], 1, 2).unwrap().wr_id, 0x61);
    assert_eq!(read_recv_wqe(&c.rings[3], 1, 1).unwrap().wr_id, 0x71);
    assert_eq!(bells.take(), []);

    // poll_cq: what the HCA wrote, oldest first; max 0 needs no array.
    let mut wc = [IvCqe::default(); 4];
    // SAFETY: `wc` holds 4 entries.
    let st = unsafe { (t.poll_cq)(t.context, o.cq, wc.as_mut_ptr(), 4) };
    assert_eq!(st, 0);
    for id in [1, 2, 3] {
        push_cqe(
            &c.rings[2],
            &IvCqe {
                wr_id: id,
                ..IvCqe::default()
            },
        )
        .unwrap();
    }
    // SAFETY: as above.
    let st = unsafe { (t.poll_cq)(t.context, o.cq, wc.as_mut_ptr(), 2) };
    assert_eq!(st, 2);
    assert_eq!((wc[0].wr_id, wc[1].wr_id), (1, 2));
    // SAFETY: max 0: the array is not touched.
    let st = unsafe { (t.poll_cq)(t.context, o.cq, ptr::null_mut(), 0) };
    assert_eq!(st, 0);
    // SAFETY: as above.
    let st = unsafe { (t.poll_cq)(t.context, o.cq, wc.as_mut_ptr(), 4) };
    assert_eq!(st, 1);
    assert_eq!(wc[0].wr_id, 3);

    // req_notify_cq writes the arm word and rings the arm doorbell.
    // SAFETY: a valid open CQ.
    let st = unsafe { (t.req_notify_cq)(t.context, o.cq, 1) };
    assert_eq!(st, STATUS_SUCCESS);
    let arm = c.rings[2].arm_word().load(Ordering::Acquire);
    assert_eq!(
        arm & (IV_CQ_ARM_NEXT | IV_CQ_ARM_SOLICITED),
        IV_CQ_ARM_NEXT | IV_CQ_ARM_SOLICITED
    );
    assert_eq!(bells.take(), [Bell::CqArm(0x31)]);

    close(&t, o);
    // SAFETY: the reference `interface` returned, given back once.
    unsafe { (t.interface_dereference)(t.context) };
    assert_eq!(Arc::strong_count(&bells), 1, "the context is gone");
}

#[test]
fn bad_arguments_are_refused_with_a_status() {
    let bells = Arc::new(Bells::default());
    let t = table(&bells);
    let c = created();
    let o = open(&t, &c);
    let three = [IvSge::default(); 3];
    let long = [0u8; 65];
    let cases = [
        // More SGEs than the QP allows.
        IvKernelSendWr {
            num_sge: 3,
            sg_list: three.as_ptr(),
            ..IvKernelSendWr::default()
        },
        // A gather list missing.
        IvKernelSendWr {
            num_sge: 1,
            ..IvKernelSendWr::default()
        },
        // More than any WQE holds: refused before the list is looked at.
        IvKernelSendWr {
            num_sge: 1000,
            sg_list: ptr::dangling(),
            ..IvKernelSendWr::default()
        },
        // Inline data missing, or too long.
        IvKernelSendWr {
            flags: IV_SEND_INLINE,
            inline_len: 4,
            ..IvKernelSendWr::default()
        },
        IvKernelSendWr {
            flags: IV_SEND_INLINE,
            inline_len: 65,
            inline_data: long.as_ptr().cast(),
            ..IvKernelSendWr::default()
        },
        // An unknown opcode; a reserved field set.
        IvKernelSendWr {
            opcode: 99,
            ..IvKernelSendWr::default()
        },
        IvKernelSendWr {
            reserved: 1,
            ..IvKernelSendWr::default()
        },
    ];
    for (i, wr) in cases.iter().enumerate() {
        // SAFETY: every pointer is valid for what it claims, or null, or
        // refused before use.
        let st = unsafe { (t.post_send)(t.context, o.qp, wr) };
        assert_eq!(st, STATUS_INVALID_PARAMETER, "case {i}");
    }
    // Null pointers are refused.
    let refused = |st: NtStatus| assert_eq!(st, STATUS_INVALID_PARAMETER);
    // SAFETY: the null QP is refused.
    refused(unsafe { (t.post_send)(t.context, ptr::null_mut(), &cases[0]) });
    // SAFETY: the null request is refused.
    refused(unsafe { (t.post_send)(t.context, o.qp, ptr::null()) });
    // SAFETY: the null context is refused.
    refused(unsafe { (t.post_send)(ptr::null_mut(), o.qp, &IvKernelSendWr::default()) });
    // SAFETY: the null request is refused.
    refused(unsafe { (t.post_recv)(t.context, o.qp, ptr::null()) });
    // SAFETY: the null array (with max 1) is refused.
    refused(unsafe { (t.poll_cq)(t.context, o.cq, ptr::null_mut(), 1) });
    // SAFETY: the null CQ is refused.
    refused(unsafe { (t.poll_cq)(t.context, ptr::null_mut(), ptr::null_mut(), 0) });
    // SAFETY: the null CQ is refused.
    refused(unsafe { (t.req_notify_cq)(t.context, ptr::null_mut(), 0) });
    let mut q = ptr::null_mut();
    // SAFETY: the null response is refused.
    refused(unsafe { (t.open_qp)(t.context, ptr::null(), &mut q) });
    // SAFETY: the null out pointer is refused.
    refused(unsafe { (t.open_qp)(t.context, &c.qp, ptr::null_mut()) });
    // SAFETY: closing null does nothing.
    unsafe { (t.close_qp)(t.context, ptr::null_mut()) };
    // A full send queue: STATUS_INSUFFICIENT_RESOURCES, no doorbell.
    bells.take();
    let mut n = 0;
    loop {
        // SAFETY: valid QP and work request.
        let st = unsafe { (t.post_send)(t.context, o.qp, &IvKernelSendWr::default()) };
        if st != STATUS_SUCCESS {
            assert_eq!(st, STATUS_INSUFFICIENT_RESOURCES);
            break;
        }
        n += 1;
    }
    // The QP's depth (max_send_wr 7), not the ring's 8 slots.
    assert_eq!(n, c.qp.cap.max_send_wr);
    assert_eq!(bells.take().len(), 7);
    // Geometry a QP's caps do not fit in is refused at open.
    let mut bad = c.qp;
    bad.cap.max_send_sge = 16;
    let mut q = ptr::null_mut();
    // SAFETY: refused before the rings are touched.
    let st = unsafe { (t.open_qp)(t.context, &bad, &mut q) };
    assert_eq!(st, STATUS_INVALID_PARAMETER);
    assert!(q.is_null());
    close(&t, o);
    // SAFETY: the one reference.
    unsafe { (t.interface_dereference)(t.context) };
}

#[test]
fn the_interface_is_reference_counted() {
    let bells = Arc::new(Bells::default());
    let t = table(&bells);
    assert_eq!(Arc::strong_count(&bells), 2);
    // SAFETY: a live context.
    unsafe { (t.interface_reference)(t.context) };
    // SAFETY: one of the two references.
    unsafe { (t.interface_dereference)(t.context) };
    assert_eq!(Arc::strong_count(&bells), 2, "still referenced once");
    // The table can be copied (QUERY_INTERFACE copies it into the caller's
    // buffer); the copy calls the same context.
    let copy = t;
    let c = created();
    let o = open(&copy, &c);
    // SAFETY: valid QP and request.
    unsafe { (copy.post_send)(copy.context, o.qp, &IvKernelSendWr::default()) };
    assert_eq!(bells.take(), [Bell::Sq(0x21)]);
    close(&copy, o);
    // SAFETY: the last reference.
    unsafe { (t.interface_dereference)(t.context) };
    assert_eq!(Arc::strong_count(&bells), 1);
}

/// Every post, poll and arm holds its queue's lock (the platform's, which
/// raises to DISPATCH_LEVEL) once, around the ring only: the ring's own
/// lock is taken inside it, the doorbell after it (both checked by
/// [`Locks`] and [`Bells`]), and the caller's IRQL comes back.
#[test]
fn each_call_holds_its_queue_lock_around_the_ring() {
    let bells = Arc::new(Bells::default());
    let locks = Locks::default();
    let holds = Arc::clone(&locks.holds);
    let t = interface(Arc::clone(&bells), locks).expect("memory for the context");
    let c = created();
    let o = open(&t, &c);
    let sges = [IvSge {
        addr: 0x1000,
        length: 4,
        lkey: 9,
    }];
    let wr = IvKernelSendWr {
        wr_id: 1,
        opcode: IV_WR_SEND,
        num_sge: 1,
        sg_list: sges.as_ptr(),
        ..IvKernelSendWr::default()
    };
    let rwr = IvKernelRecvWr {
        wr_id: 2,
        sg_list: sges.as_ptr(),
        num_sge: 1,
        reserved: 0,
    };
    let mut wc = [IvCqe::default(); 4];
    let wc_ptr = wc.as_mut_ptr();
    // Each: an open object, a valid work request or array (SAFETY
    // comments below).
    let post_send = || {
        // SAFETY: an open QP and a valid work request.
        unsafe { (t.post_send)(t.context, o.qp, &wr) }
    };
    let post_recv = || {
        // SAFETY: as above.
        unsafe { (t.post_recv)(t.context, o.qp, &rwr) }
    };
    let post_srq_recv = || {
        // SAFETY: an open SRQ and a valid work request.
        unsafe { (t.post_srq_recv)(t.context, o.srq, &rwr) }
    };
    let poll_cq = || {
        // SAFETY: an open CQ; the array holds 4 entries.
        unsafe { (t.poll_cq)(t.context, o.cq, wc_ptr, 4) }
    };
    let req_notify_cq = || {
        // SAFETY: an open CQ.
        unsafe { (t.req_notify_cq)(t.context, o.cq, 0) }
    };
    let calls: [(&str, &dyn Fn() -> NtStatus); 5] = [
        ("post_send", &post_send),
        ("post_recv", &post_recv),
        ("post_srq_recv", &post_srq_recv),
        ("poll_cq", &poll_cq),
        ("req_notify_cq", &req_notify_cq),
    ];
    for (name, call) in calls {
        let before = holds.load(Ordering::Relaxed);
        assert_eq!(call(), STATUS_SUCCESS, "{name}");
        assert_eq!(holds.load(Ordering::Relaxed), before + 1, "{name}");
        assert_eq!(HELD.get(), 0, "{name} released its lock");
    }
    assert_eq!(bells.take(), [Bell::Sq(c.qp.qpn), Bell::CqArm(c.cq.cqn)]);
    close(&t, o);
    // SAFETY: the table's own reference, given back once.
    unsafe { (t.interface_dereference)(t.context) };
}

/// Every allocation an open makes (the rings' views, the queues' locks,
/// the opened object's box) can be refused: the open then fails with
/// `STATUS_INSUFFICIENT_RESOURCES`, stores nothing and leaks nothing.
#[test]
fn opens_fail_cleanly_when_memory_is_short() {
    let bells = Arc::new(Bells::default());
    let t = table(&bells);
    let c = created();
    let check = |what: &str, n: u64, st: NtStatus, failed: bool, out: bool| {
        if failed {
            assert_eq!(st, STATUS_INSUFFICIENT_RESOURCES, "{what}: allocation {n}");
            assert!(!out, "{what}: allocation {n} refused, an object stored");
        } else {
            assert_eq!(st, STATUS_SUCCESS, "{what}");
            assert!(out);
        }
    };
    let qp = std::cell::Cell::new(ptr::null_mut::<IvKernelQp>());
    let runs = irpverbs_failalloc::sweep(
        || {
            let mut q = ptr::null_mut();
            // SAFETY: the response describes rings `c` keeps alive.
            let st = unsafe { (t.open_qp)(t.context, &c.qp, &mut q) };
            qp.set(q);
            st
        },
        |n, st, failed| {
            check("open_qp", n, st, failed, !qp.get().is_null());
            // SAFETY: opened just now (or null), closed once.
            unsafe { (t.close_qp)(t.context, qp.replace(ptr::null_mut())) };
        },
    );
    assert!(runs >= 5, "two ring views, two locks and the box: {runs}");
    let cq = std::cell::Cell::new(ptr::null_mut::<IvKernelCq>());
    let runs = irpverbs_failalloc::sweep(
        || {
            let mut q = ptr::null_mut();
            // SAFETY: as above.
            let st = unsafe { (t.open_cq)(t.context, c.cq.cqn, &c.cq.ring, &mut q) };
            cq.set(q);
            st
        },
        |n, st, failed| {
            check("open_cq", n, st, failed, !cq.get().is_null());
            // SAFETY: as above.
            unsafe { (t.close_cq)(t.context, cq.replace(ptr::null_mut())) };
        },
    );
    assert!(runs >= 3, "the ring's view, the lock and the box: {runs}");
    let srq = std::cell::Cell::new(ptr::null_mut::<IvKernelSrq>());
    let runs = irpverbs_failalloc::sweep(
        || {
            let mut q = ptr::null_mut();
            // SAFETY: as above.
            let st = unsafe { (t.open_srq)(t.context, &c.srq, &mut q) };
            srq.set(q);
            st
        },
        |n, st, failed| {
            check("open_srq", n, st, failed, !srq.get().is_null());
            // SAFETY: as above.
            unsafe { (t.close_srq)(t.context, srq.replace(ptr::null_mut())) };
        },
    );
    assert!(runs >= 3, "the ring's view, the lock and the box: {runs}");
    // SAFETY: the reference `interface` returned, given back once.
    unsafe { (t.interface_dereference)(t.context) };
    assert_eq!(Arc::strong_count(&bells), 1, "the context is gone");
}

/// Every allocation the table's context takes (the doorbells' box, the
/// platform's box, the counted context) can be refused: `interface` then
/// fails with `STATUS_INSUFFICIENT_RESOURCES` and drops what it was given
/// (no reference to the doorbells is left behind); otherwise the table
/// works and its last dereference frees the context.
#[test]
fn the_interface_fails_cleanly_when_memory_is_short() {
    let bells = Arc::new(Bells::default());
    // Made outside the armed runs (its counter is an `Arc`).
    let locks = std::cell::Cell::new(Some(Locks::default()));
    let runs = irpverbs_failalloc::sweep(
        || interface(Arc::clone(&bells), locks.take().expect("a lock maker")),
        |n, made, failed| {
            locks.set(Some(Locks::default()));
            if failed {
                assert_eq!(
                    made.err(),
                    Some(STATUS_INSUFFICIENT_RESOURCES),
                    "allocation {n}"
                );
            } else {
                let t = made.expect("no allocation refused");
                let c = created();
                let o = open(&t, &c);
                close(&t, o);
                // SAFETY: the one reference `interface` returned.
                unsafe { (t.interface_dereference)(t.context) };
            }
            assert_eq!(
                Arc::strong_count(&bells),
                1,
                "allocation {n}: a reference left"
            );
        },
    );
    assert_eq!(runs, 3, "the two boxes and the context");
}

/// The one rule for which table a query gets (host mode's query and
/// irpverbs.sys's `IRP_MN_QUERY_INTERFACE` both use it): version 1 with
/// version 1's size gets version 1's table, version 2 with the whole
/// table's size gets it, a buffer too small for the version it names and
/// an unknown version are refused.
#[test]
fn a_query_gets_the_layout_its_version_and_size_name() {
    use irpverbs_kernel_table::kernel::{IV_KERNEL_INTERFACE_V1_SIZE, TableLayout, query_layout};
    let v1 = IV_KERNEL_INTERFACE_V1_SIZE;
    let v2 = size_of::<IvKernelInterface>() as u16;
    assert!(v1 < v2);
    assert_eq!(query_layout(1, v1), Ok(TableLayout::V1));
    assert_eq!(query_layout(1, v2), Ok(TableLayout::V1), "a larger buffer");
    assert_eq!(query_layout(2, v2), Ok(TableLayout::V2));
    assert_eq!(query_layout(2, v1), Err(STATUS_INVALID_PARAMETER));
    assert_eq!(query_layout(2, v2 - 1), Err(STATUS_INVALID_PARAMETER));
    assert_eq!(query_layout(1, v1 - 1), Err(STATUS_INVALID_PARAMETER));
    for version in [0, 3, u16::MAX] {
        assert_eq!(
            query_layout(version, u16::MAX),
            Err(STATUS_INVALID_PARAMETER),
            "version {version}"
        );
    }
    assert_eq!((TableLayout::V1.size(), TableLayout::V1.version()), (v1, 1));
    assert_eq!(
        (TableLayout::V2.size(), TableLayout::V2.version()),
        (v2, IV_KERNEL_INTERFACE_VERSION)
    );
}

/// A connected QP's request (all-zero UD triple) carries no UD address, so
/// the ring writes it on its single-SGE fast path; a UD request keeps its
/// own.
#[test]
fn c_send_wr_carries_a_ud_address_only_when_set() {
    let sge = IvSge {
        addr: 0x1000,
        length: 8,
        lkey: 1,
    };
    let mut wr = IvKernelSendWr {
        opcode: IV_WR_SEND,
        num_sge: 1,
        sg_list: &sge,
        ..IvKernelSendWr::default()
    };
    // SAFETY: the gather list is `sge`, alive for the call.
    let send = unsafe { irpverbs_kernel_table::kernel::send_wr_from_c(&wr) }.unwrap();
    assert_eq!(send.ud, None);
    assert_eq!(send.sges, &[sge]);
    for (ahn, qpn, qkey) in [(3, 0, 0), (0, 9, 0), (0, 0, 0x1111_1111), (3, 9, 7)] {
        (wr.ahn, wr.remote_qpn, wr.remote_qkey) = (ahn, qpn, qkey);
        // SAFETY: as above.
        let send = unsafe { irpverbs_kernel_table::kernel::send_wr_from_c(&wr) }.unwrap();
        assert_eq!(send.ud, Some((ahn, qpn, qkey)));
    }
}
