//! Core tests over a fake platform and a fake HCA: the dispatch, pending,
//! busy and rundown rules, independent of the soft HCA.

extern crate std;

use alloc::boxed::Box;
use alloc::sync::Arc;
use alloc::vec::Vec;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use irpverbs_abi::*;
use zerocopy::{FromBytes, IntoBytes};

use crate::testing::*;
use crate::*;

/// Forwards to the system allocator; a test arms it to count or refuse
/// the allocations of its thread.
#[global_allocator]
static ALLOC: irpverbs_failalloc::FailAlloc = irpverbs_failalloc::FailAlloc;

struct Rig {
    dev: Arc<Device<FakePlatform, Arc<FakeHca>>>,
    hca: Arc<FakeHca>,
}

impl Rig {
    fn new(depth: usize) -> Self {
        Self::over(FakeHca::new(depth))
    }

    fn over(hca: FakeHca) -> Self {
        let hca = Arc::new(hca);
        let dev = Arc::new(Device::new(FakePlatform::default(), hca.clone()));
        dev.create_file(1, Some(1)).unwrap();
        dev.create_file(2, Some(1)).unwrap();
        Self { dev, hca }
    }

    /// The platform the device owns.
    fn platform(&self) -> &FakePlatform {
        self.dev.platform()
    }

    /// A user-mode request from address space 1, through the caller
    /// context and the queue, as a platform delivers it.
    fn issue<I: IntoBytes + zerocopy::Immutable>(
        &self,
        file: FileKey,
        code: u32,
        input: &I,
        out: usize,
    ) -> Outcome {
        self.issue_as(file, code, input, out, Via::Caller(RequestorMode::User, 1))
    }

    fn issue_as<I: IntoBytes + zerocopy::Immutable>(
        &self,
        file: FileKey,
        code: u32,
        input: &I,
        out: usize,
        via: Via,
    ) -> Outcome {
        self.issue_with(file, code, input, out, via, None)
    }

    /// [`Rig::issue_as`] with a completion routine.
    fn issue_with<I: IntoBytes + zerocopy::Immutable>(
        &self,
        file: FileKey,
        code: u32,
        input: &I,
        out: usize,
        via: Via,
        on_complete: Option<Hook>,
    ) -> Outcome {
        let (mode, space) = match via {
            Via::Caller(mode, space) | Via::QueueOnly(mode, space) => (mode, space),
        };
        let mut request = FakeRequest::ioctl(code, mode, file, space, input.as_bytes(), out);
        request.on_complete = on_complete;
        let outcome = request.outcome.clone();
        let queued = match via {
            Via::Caller(..) => self.dev.in_caller_context(request),
            Via::QueueOnly(..) => Some(request),
        };
        if let Some(request) = queued {
            self.dev.dispatch_ioctl(request);
        }
        outcome
    }

    fn call_as<I: IntoBytes + zerocopy::Immutable, O: FromBytes>(
        &self,
        file: FileKey,
        code: u32,
        input: &I,
        via: Via,
    ) -> Result<O, NtStatus> {
        let o = self.issue_as(file, code, input, size_of::<O>().max(1), via);
        self.settle();
        let (status, bytes) = o.lock().unwrap().take().expect("request completed");
        if nt_success(status) {
            O::read_from_bytes(&bytes[..size_of::<O>()]).map_err(|_| -1)
        } else {
            Err(status)
        }
    }

    /// Runs the HCA and the DPC until nothing is left.
    fn settle(&self) {
        loop {
            self.hca.run();
            self.dev.dpc();
            if self.hca.queued.lock().unwrap().is_empty() && self.hca.eq.lock().unwrap().is_empty()
            {
                break;
            }
        }
    }

    fn call<I: IntoBytes + zerocopy::Immutable, O: FromBytes>(
        &self,
        file: FileKey,
        code: u32,
        input: &I,
    ) -> Result<O, NtStatus> {
        let o = self.issue(file, code, input, size_of::<O>().max(1));
        self.settle();
        let (status, bytes) = o.lock().unwrap().take().expect("request completed");
        if nt_success(status) {
            O::read_from_bytes(&bytes[..size_of::<O>()]).map_err(|_| -1)
        } else {
            Err(status)
        }
    }
}

/// `IOCTL_IV_MAP_RINGS` of `handle` on `file`, as [`Rig::issue`] sends it.
fn map(r: &Rig, file: FileKey, handle: IvHandle) -> Result<IvMapRingsOut, NtStatus> {
    r.call(file, IOCTL_IV_MAP_RINGS, &IvHandleIn { handle })
}

/// How a request reaches the device.
#[derive(Clone, Copy, Debug)]
enum Via {
    /// Through `in_caller_context` (mode, address space), then the queue.
    Caller(RequestorMode, u64),
    /// Straight to the queue, as a platform that skipped the caller context.
    QueueOnly(RequestorMode, u64),
}

fn pd(r: &Rig, file: FileKey) -> IvHandle {
    r.call::<_, IvAllocPdOut>(file, IOCTL_IV_ALLOC_PD, &IvAllocPdIn::default())
        .unwrap()
        .pd
}

#[test]
fn a_verb_stays_pending_until_the_dpc_completes_it() {
    let r = Rig::new(16);
    let o = r.issue(1, IOCTL_IV_ALLOC_PD, &IvAllocPdIn::default(), 16);
    assert!(o.lock().unwrap().is_none(), "completed before the HCA ran");
    r.hca.run();
    assert!(o.lock().unwrap().is_none(), "completed before the DPC ran");
    r.dev.dpc();
    let (status, out) = o.lock().unwrap().take().unwrap();
    assert_eq!(status, STATUS_SUCCESS);
    assert_ne!(IvAllocPdOut::read_from_bytes(&out).unwrap().pd, 0);
}

#[test]
fn a_full_command_queue_backlogs_in_order() {
    let r = Rig::new(1);
    let outs: Vec<_> = (0..4)
        .map(|_| r.issue(1, IOCTL_IV_ALLOC_PD, &IvAllocPdIn::default(), 16))
        .collect();
    assert_eq!(r.dev.stats().commands_backlogged, 3);
    // One in flight and three backlogged are four commands, each once.
    assert_eq!(r.dev.snapshot().pending_commands, 4);
    r.settle();
    assert_eq!(r.dev.snapshot().pending_commands, 0);
    let pdns: Vec<u32> = outs
        .iter()
        .map(|o| {
            IvAllocPdOut::read_from_bytes(&o.lock().unwrap().take().unwrap().1)
                .unwrap()
                .pdn
        })
        .collect();
    assert!(
        pdns.windows(2).all(|w| w[0] < w[1]),
        "out of order: {pdns:?}"
    );
    // Over the device's max_pd (4): refused at once, nothing posted.
    let posted = r.dev.stats().commands_posted;
    assert_eq!(
        r.call::<_, IvAllocPdOut>(1, IOCTL_IV_ALLOC_PD, &IvAllocPdIn::default()),
        Err(STATUS_INSUFFICIENT_RESOURCES)
    );
    assert_eq!(r.dev.stats().commands_posted, posted);
}

#[test]
fn destroy_with_an_operation_in_flight_is_busy() {
    let r = Rig::new(16);
    let cq = r
        .call::<_, IvCreateCqOut>(
            1,
            IOCTL_IV_CREATE_CQ,
            &IvCreateCqIn {
                cqe: 8,
                ..Default::default()
            },
        )
        .unwrap()
        .cq;
    let resize = r.issue(
        1,
        IOCTL_IV_RESIZE_CQ,
        &IvResizeCqIn {
            cq,
            cqe: 32,
            reserved: 0,
        },
        size_of::<IvResizeCqOut>(),
    );
    let destroy = r.issue(1, IOCTL_IV_DESTROY_CQ, &IvHandleIn { handle: cq }, 0);
    assert_eq!(
        destroy.lock().unwrap().take().unwrap().0,
        STATUS_DEVICE_BUSY
    );
    r.settle();
    assert_eq!(resize.lock().unwrap().take().unwrap().0, STATUS_SUCCESS);
    assert_eq!(
        r.call::<_, ()>(1, IOCTL_IV_DESTROY_CQ, &IvHandleIn { handle: cq }),
        Ok(())
    );
}

#[test]
fn cleanup_runs_down_children_first_and_frees_everything() {
    let r = Rig::new(2);
    let p = pd(&r, 1);
    let cq = r
        .call::<_, IvCreateCqOut>(
            1,
            IOCTL_IV_CREATE_CQ,
            &IvCreateCqIn {
                cqe: 8,
                ..Default::default()
            },
        )
        .unwrap()
        .cq;
    let qp_in = qp_in(p, cq);
    r.call::<_, IvCreateQpOut>(1, IOCTL_IV_CREATE_QP, &qp_in)
        .unwrap();
    r.call::<_, IvRegMrOut>(
        1,
        IOCTL_IV_REG_MR,
        &IvRegMrIn {
            pd: p,
            addr: 4096,
            length: 4096,
            access: 0,
            reserved: 0,
        },
    )
    .unwrap();
    // One create still in flight when the file is cleaned up.
    let late = r.issue(
        1,
        IOCTL_IV_CREATE_CQ,
        &IvCreateCqIn {
            cqe: 8,
            ..Default::default()
        },
        size_of::<IvCreateCqOut>(),
    );
    r.dev.cleanup_file(1);
    assert_eq!(
        r.issue(1, IOCTL_IV_ALLOC_PD, &IvAllocPdIn::default(), 16)
            .lock()
            .unwrap()
            .take()
            .unwrap()
            .0,
        STATUS_DELETE_PENDING
    );
    r.settle();
    assert_eq!(late.lock().unwrap().take().unwrap().0, STATUS_SUCCESS);
    assert!(r.dev.file_rundown_complete(1));
    r.dev.close_file(1);
    r.dev.cleanup_file(2);
    r.dev.close_file(2);
    assert_eq!(r.dev.snapshot(), DeviceSnapshot::default());
    assert_eq!(r.platform().live_charges.load(Ordering::SeqCst), 0);
}

#[test]
fn pool_failure_changes_nothing() {
    let r = Rig::new(16);
    r.platform().fail_pool.store(1, Ordering::SeqCst);
    assert_eq!(
        r.call::<_, IvAllocPdOut>(1, IOCTL_IV_ALLOC_PD, &IvAllocPdIn::default()),
        Err(STATUS_INSUFFICIENT_RESOURCES)
    );
    assert_eq!(r.dev.snapshot().objects, [0; 9]);
    pd(&r, 1);
}

#[test]
fn removal_completes_pending_requests_and_destroys_still_succeed() {
    let r = Rig::new(16);
    let p = pd(&r, 1);
    let pending = r.issue(
        1,
        IOCTL_IV_CREATE_CQ,
        &IvCreateCqIn {
            cqe: 8,
            ..Default::default()
        },
        size_of::<IvCreateCqOut>(),
    );
    let waits = [1, 2].map(|file| {
        r.issue(
            file,
            IOCTL_IV_GET_ASYNC_EVENT,
            &(),
            size_of::<IvAsyncEventOut>(),
        )
    });
    // Removal needs no memory (it cannot fail): nothing is allocated.
    let ((), allocated) = irpverbs_failalloc::counting(|| r.dev.remove());
    assert_eq!(allocated, 0, "removal allocates");
    assert_eq!(
        pending.lock().unwrap().take().unwrap().0,
        STATUS_DEVICE_REMOVED
    );
    for w in waits {
        let (status, _) = w.lock().unwrap().take().expect("the wait completed");
        assert!(
            status == STATUS_DEVICE_REMOVED || status == STATUS_SUCCESS,
            "{status:#x}"
        );
    }
    assert_eq!(
        r.call::<_, IvAllocPdOut>(1, IOCTL_IV_ALLOC_PD, &IvAllocPdIn::default()),
        Err(STATUS_DEVICE_REMOVED)
    );
    assert_eq!(
        r.call::<_, ()>(1, IOCTL_IV_DEALLOC_PD, &IvHandleIn { handle: p }),
        Ok(())
    );
    r.settle(); // the HCA's late answers name no pending command
    r.dev.cleanup_file(1);
    r.dev.close_file(1);
    r.dev.close_file(2);
    assert_eq!(r.dev.snapshot(), DeviceSnapshot::default());
    assert_eq!(r.platform().live_charges.load(Ordering::SeqCst), 0);
}

#[test]
fn short_output_changes_nothing() {
    let r = Rig::new(16);
    let o = r.issue(1, IOCTL_IV_ALLOC_PD, &IvAllocPdIn::default(), 15);
    assert_eq!(o.lock().unwrap().take().unwrap().0, STATUS_BUFFER_TOO_SMALL);
    assert_eq!(r.dev.stats().commands_posted, 0);
}

#[test]
fn the_driver_itself_refuses_destroying_a_pd_with_dependents() {
    // The fake HCA would destroy anything: the busy answer must come from
    // the driver, before any command is posted.
    let r = Rig::new(16);
    let p = pd(&r, 1);
    r.call::<_, IvRegMrOut>(
        1,
        IOCTL_IV_REG_MR,
        &IvRegMrIn {
            pd: p,
            addr: 4096,
            length: 64,
            access: 0,
            reserved: 0,
        },
    )
    .unwrap();
    let posted = r.dev.stats().commands_posted;
    assert_eq!(
        r.call::<_, ()>(1, IOCTL_IV_DEALLOC_PD, &IvHandleIn { handle: p }),
        Err(STATUS_DEVICE_BUSY)
    );
    assert_eq!(r.dev.stats().commands_posted, posted);
    assert_eq!(r.dev.snapshot().objects[Kind::Pd.index()], 1);
}

fn cq_on(r: &Rig, file: FileKey, channel: IvHandle) -> IvCreateCqOut {
    r.call(
        file,
        IOCTL_IV_CREATE_CQ,
        &IvCreateCqIn {
            cqe: 8,
            channel,
            ..Default::default()
        },
    )
    .unwrap()
}

/// With completion vectors, a CQ's event is delivered by its vector's DPC
/// (`Device::comp_dpc`), which drains that vector's queue only and re-arms
/// it; the device arms every vector's queue when it starts.
#[test]
fn a_vector_s_dpc_delivers_its_own_queue_and_re_arms_it() {
    let r = Rig::over(FakeHca::with_vectors(16, 2));
    assert_eq!(*r.hca.comp_arms.lock().unwrap(), [1, 1], "armed at start");
    let cq: IvCreateCqOut = r
        .call(
            1,
            IOCTL_IV_CREATE_CQ,
            &IvCreateCqIn {
                cqe: 8,
                comp_vector: 1,
                ..Default::default()
            },
        )
        .unwrap();
    let arm = IvCqNotifyIn {
        cq: cq.cq,
        arm: IV_NOTIFY_NEXT,
        reserved: 0,
    };
    let w = r.issue(1, IOCTL_IV_CQ_NOTIFY, &arm, size_of::<IvCqEventOut>());
    r.settle();
    r.hca.comp.lock().unwrap()[1].push_back(Event::Completion { cqn: cq.cqn });
    r.dev.dpc();
    r.dev.comp_dpc(0);
    assert!(
        take_outcome(&w).is_none(),
        "another vector's DPC does not see it"
    );
    assert_eq!(*r.hca.comp_arms.lock().unwrap(), [2, 1]);
    r.dev.comp_dpc(1);
    let (st, out) = take_outcome(&w).unwrap();
    assert_eq!(st, STATUS_SUCCESS);
    assert_eq!(IvCqEventOut::read_from_bytes(&out).unwrap().cq, cq.cq);
    assert!(r.hca.comp.lock().unwrap()[1].is_empty());
    assert_eq!(*r.hca.comp_arms.lock().unwrap(), [2, 2], "re-armed");
    // A vector the HCA does not have: nothing to drain, nothing armed.
    r.dev.comp_dpc(7);
    assert_eq!(*r.hca.comp_arms.lock().unwrap(), [2, 2]);
}

/// A CQ's notify is completed by its own vector's DPC even when another
/// vector's DPC completes what it collected in between: the first of two
/// notifies on vector 0's CQ, completed by vector 0's DPC, runs vector 1's
/// DPC from its completion routine (as another processor would run it
/// while vector 0's DPC is between its lock and its completions). Vector
/// 1's DPC must leave the second notify to vector 0's.
#[test]
fn another_vector_s_dpc_never_completes_a_cq_s_notify() {
    let r = Rig::over(FakeHca::with_vectors(16, 2));
    let cq_on_vector = |comp_vector| -> IvCreateCqOut {
        r.call(
            1,
            IOCTL_IV_CREATE_CQ,
            &IvCreateCqIn {
                cqe: 8,
                comp_vector,
                ..Default::default()
            },
        )
        .unwrap()
    };
    let (a, b) = (cq_on_vector(0), cq_on_vector(1));
    let arm = IvCqNotifyIn {
        cq: a.cq,
        arm: IV_NOTIFY_NEXT,
        reserved: 0,
    };
    let in_vector_1 = Arc::new(AtomicBool::new(false));
    let second_in_vector_1 = Arc::new(Mutex::new(None));
    let via = Via::Caller(RequestorMode::User, 1);
    let out = size_of::<IvCqEventOut>();
    let (dev, hca, flag) = (
        Arc::downgrade(&r.dev),
        Arc::clone(&r.hca),
        Arc::clone(&in_vector_1),
    );
    let first = r.issue_with(
        1,
        IOCTL_IV_CQ_NOTIFY,
        &arm,
        out,
        via,
        Some(Box::new(move || {
            // Vector 1 has an event of its own (CQ b) and its DPC runs.
            hca.comp.lock().unwrap()[1].push_back(Event::Completion { cqn: b.cqn });
            flag.store(true, Ordering::SeqCst);
            dev.upgrade().unwrap().comp_dpc(1);
            flag.store(false, Ordering::SeqCst);
        })),
    );
    let (seen, flag) = (Arc::clone(&second_in_vector_1), Arc::clone(&in_vector_1));
    let second = r.issue_with(
        1,
        IOCTL_IV_CQ_NOTIFY,
        &arm,
        out,
        via,
        Some(Box::new(move || {
            *seen.lock().unwrap() = Some(flag.load(Ordering::SeqCst));
        })),
    );
    r.settle();
    assert!(take_outcome(&first).is_none() && take_outcome(&second).is_none());
    r.hca.comp.lock().unwrap()[0].push_back(Event::Completion { cqn: a.cqn });
    r.dev.comp_dpc(0);
    assert_eq!(take_outcome(&first).unwrap().0, STATUS_SUCCESS);
    assert_eq!(take_outcome(&second).unwrap().0, STATUS_SUCCESS);
    assert_eq!(
        *second_in_vector_1.lock().unwrap(),
        Some(false),
        "vector 1's DPC completed vector 0's CQ's notify"
    );
    assert!(r.hca.comp.lock().unwrap()[1].is_empty(), "vector 1 drained");
}

#[test]
fn cq_notify_pends_until_the_cq_gets_an_event() {
    let r = Rig::new(16);
    let cq = cq_on(&r, 1, 0);
    let arm = IvCqNotifyIn {
        cq: cq.cq,
        arm: IV_NOTIFY_NEXT,
        reserved: 0,
    };
    let w = r.issue(1, IOCTL_IV_CQ_NOTIFY, &arm, size_of::<IvCqEventOut>());
    r.settle();
    assert!(take_outcome(&w).is_none(), "completed without an event");
    assert_eq!(r.dev.snapshot().waits, 1);
    // The HCA reports a completion on the CQ.
    r.hca
        .eq
        .lock()
        .unwrap()
        .push_back(Event::Completion { cqn: cq.cqn });
    r.dev.dpc();
    let (st, out) = take_outcome(&w).unwrap();
    assert_eq!(st, STATUS_SUCCESS);
    let ev = IvCqEventOut::read_from_bytes(&out).unwrap();
    assert_eq!((ev.cq, ev.user_context), (cq.cq, 0));
    assert_eq!(r.dev.snapshot().waits, 0);
    // Bad arm value, bad handle.
    let bad = r.issue(1, IOCTL_IV_CQ_NOTIFY, &IvCqNotifyIn { arm: 3, ..arm }, 16);
    assert_eq!(take_outcome(&bad).unwrap().0, STATUS_INVALID_PARAMETER);
    let bad = r.issue(1, IOCTL_IV_CQ_NOTIFY, &IvCqNotifyIn { cq: 77, ..arm }, 16);
    assert_eq!(take_outcome(&bad).unwrap().0, STATUS_INVALID_HANDLE);
}

#[test]
fn cq_notify_ends_distinctly_on_destroy_error_and_cancel() {
    let r = Rig::new(16);
    let a = cq_on(&r, 1, 0);
    let b = cq_on(&r, 1, 0);
    let c = cq_on(&r, 1, 0);
    let wait = |cq: &IvCreateCqOut| {
        r.issue(
            1,
            IOCTL_IV_CQ_NOTIFY,
            &IvCqNotifyIn {
                cq: cq.cq,
                arm: 0,
                reserved: 0,
            },
            16,
        )
    };
    let (wa, wb, wc) = (wait(&a), wait(&b), wait(&c));
    assert_eq!(r.dev.snapshot().waits, 3);
    // Destroyed: the wait ends with STATUS_DELETE_PENDING.
    assert_eq!(
        r.call::<_, ()>(1, IOCTL_IV_DESTROY_CQ, &IvHandleIn { handle: a.cq }),
        Ok(())
    );
    assert_eq!(take_outcome(&wa).unwrap().0, STATUS_DELETE_PENDING);
    // Overrun: STATUS_DATA_OVERRUN, later waits too, and a CQ_ERR async event.
    r.hca
        .eq
        .lock()
        .unwrap()
        .push_back(Event::Async(AsyncEvent::CqError(b.cqn)));
    r.dev.dpc();
    assert_eq!(take_outcome(&wb).unwrap().0, STATUS_DATA_OVERRUN);
    assert_eq!(take_outcome(&wait(&b)).unwrap().0, STATUS_DATA_OVERRUN);
    // Cancel: the cancel routine (key 3, the third wait) completes it.
    r.dev.cancel(3);
    assert_eq!(take_outcome(&wc).unwrap().0, STATUS_CANCELLED);
    assert_eq!(r.dev.stats().cancelled, 1);
    r.dev.cancel(3);
    assert_eq!(
        r.dev.stats().cancels_ignored,
        1,
        "a second cancel finds nothing"
    );
    // The CQ with an unacknowledged async event is busy until acked.
    assert_eq!(
        r.call::<_, ()>(1, IOCTL_IV_DESTROY_CQ, &IvHandleIn { handle: b.cq }),
        Err(STATUS_DEVICE_BUSY)
    );
    let ev: IvAsyncEventOut = r.call(1, IOCTL_IV_GET_ASYNC_EVENT, &()).unwrap();
    assert_eq!((ev.event_type, ev.handle), (IV_EVENT_CQ_ERR, b.cq));
    let ack = IvAckIn {
        handle: b.cq,
        count: 1,
        event_type: IV_EVENT_CQ_ERR,
    };
    assert_eq!(
        r.call::<_, ()>(1, IOCTL_IV_ACK_ASYNC_EVENT, &IvAckIn { count: 2, ..ack }),
        Err(STATUS_INVALID_PARAMETER)
    );
    assert_eq!(r.call::<_, ()>(1, IOCTL_IV_ACK_ASYNC_EVENT, &ack), Ok(()));
    assert_eq!(
        r.call::<_, ()>(1, IOCTL_IV_DESTROY_CQ, &IvHandleIn { handle: b.cq }),
        Ok(())
    );
}

#[test]
fn completion_channels_deliver_events_and_keep_their_busy_rules() {
    let r = Rig::new(16);
    let ch: IvCreateChannelOut = r
        .call(1, IOCTL_IV_CREATE_CHANNEL, &IvAllocPdIn::default())
        .unwrap();
    let cq1 = cq_on(&r, 1, ch.channel);
    let cq2 = cq_on(&r, 1, ch.channel);
    // A channel with CQs bound is busy.
    assert_eq!(
        r.call::<_, ()>(
            1,
            IOCTL_IV_DESTROY_CHANNEL,
            &IvHandleIn { handle: ch.channel }
        ),
        Err(STATUS_DEVICE_BUSY)
    );
    // An event before anyone asks is queued; one asked before an event waits.
    r.hca
        .eq
        .lock()
        .unwrap()
        .push_back(Event::Completion { cqn: cq2.cqn });
    r.dev.dpc();
    let got: IvCqEventOut = r
        .call(1, IOCTL_IV_GET_CQ_EVENT, &IvHandleIn { handle: ch.channel })
        .unwrap();
    assert_eq!(got.cq, cq2.cq);
    let w = r.issue(
        1,
        IOCTL_IV_GET_CQ_EVENT,
        &IvHandleIn { handle: ch.channel },
        16,
    );
    assert!(take_outcome(&w).is_none());
    r.hca
        .eq
        .lock()
        .unwrap()
        .push_back(Event::Completion { cqn: cq1.cqn });
    r.dev.dpc();
    let (st, out) = take_outcome(&w).unwrap();
    assert_eq!(st, STATUS_SUCCESS);
    assert_eq!(IvCqEventOut::read_from_bytes(&out).unwrap().cq, cq1.cq);
    // Unacknowledged events make the CQ busy.
    assert_eq!(
        r.call::<_, ()>(1, IOCTL_IV_DESTROY_CQ, &IvHandleIn { handle: cq1.cq }),
        Err(STATUS_DEVICE_BUSY)
    );
    let ack = IvAckIn {
        handle: cq1.cq,
        count: 1,
        event_type: 0,
    };
    assert_eq!(
        r.call::<_, ()>(1, IOCTL_IV_ACK_CQ_EVENTS, &IvAckIn { count: 2, ..ack }),
        Err(STATUS_INVALID_PARAMETER)
    );
    assert_eq!(r.call::<_, ()>(1, IOCTL_IV_ACK_CQ_EVENTS, &ack), Ok(()));
    assert_eq!(
        r.call::<_, ()>(
            1,
            IOCTL_IV_ACK_CQ_EVENTS,
            &IvAckIn {
                handle: cq2.cq,
                ..ack
            }
        ),
        Ok(())
    );
    for cq in [cq1.cq, cq2.cq] {
        assert_eq!(
            r.call::<_, ()>(1, IOCTL_IV_DESTROY_CQ, &IvHandleIn { handle: cq }),
            Ok(())
        );
    }
    // A wait on the channel ends when the channel is destroyed.
    let w = r.issue(
        1,
        IOCTL_IV_GET_CQ_EVENT,
        &IvHandleIn { handle: ch.channel },
        16,
    );
    assert_eq!(
        r.call::<_, ()>(
            1,
            IOCTL_IV_DESTROY_CHANNEL,
            &IvHandleIn { handle: ch.channel }
        ),
        Ok(())
    );
    assert_eq!(take_outcome(&w).unwrap().0, STATUS_DELETE_PENDING);
    // A channel handle from the other file, or a CQ handle, is not a channel.
    let other: IvCreateChannelOut = r
        .call(2, IOCTL_IV_CREATE_CHANNEL, &IvAllocPdIn::default())
        .unwrap();
    assert_eq!(
        r.call::<_, IvCreateCqOut>(
            1,
            IOCTL_IV_CREATE_CQ,
            &IvCreateCqIn {
                cqe: 4,
                channel: other.channel,
                ..Default::default()
            }
        )
        .err(),
        Some(STATUS_INVALID_HANDLE)
    );
}

/// A CQ event for a completion channel goes into room the CQ took in the
/// channel's queue when it was created: the DPC delivering it allocates
/// nothing (refusing its allocations changes nothing). An event past that
/// room (a second one of the CQ, the first not yet taken) is dropped and
/// counted (`cq_events_dropped`), the CQ owes no acknowledgement for it,
/// nothing panics, and the channel delivers the next event.
#[test]
fn a_channel_event_goes_into_room_its_cq_took_and_past_it_is_dropped() {
    let r = Rig::new(16);
    let ch: IvCreateChannelOut = r
        .call(1, IOCTL_IV_CREATE_CHANNEL, &IvAllocPdIn::default())
        .unwrap();
    let cq = cq_on(&r, 1, ch.channel);
    let event = || {
        r.hca
            .eq
            .lock()
            .unwrap()
            .push_back(Event::Completion { cqn: cq.cqn });
    };
    event();
    let ((), failed) = irpverbs_failalloc::failing_nth(0, || r.dev.dpc());
    assert!(!failed, "the DPC allocated");
    assert_eq!(r.dev.stats().cq_events_dropped, 0);
    // Past the room: dropped and counted.
    event();
    r.dev.dpc();
    assert_eq!(r.dev.stats().cq_events_dropped, 1);
    let wait = IvHandleIn { handle: ch.channel };
    let got: IvCqEventOut = r.call(1, IOCTL_IV_GET_CQ_EVENT, &wait).unwrap();
    assert_eq!(got.cq, cq.cq);
    // No second event.
    let w = r.issue(1, IOCTL_IV_GET_CQ_EVENT, &wait, 16);
    r.settle();
    assert!(take_outcome(&w).is_none(), "a dropped event was delivered");
    // The next event arrives.
    event();
    r.dev.dpc();
    let (st, out) = take_outcome(&w).expect("the next event");
    assert_eq!(st, STATUS_SUCCESS);
    assert_eq!(IvCqEventOut::read_from_bytes(&out).unwrap().cq, cq.cq);
    let ack = IvAckIn {
        handle: cq.cq,
        count: 2,
        event_type: 0,
    };
    assert_eq!(r.call::<_, ()>(1, IOCTL_IV_ACK_CQ_EVENTS, &ack), Ok(()));
    assert_eq!(
        r.call::<_, ()>(1, IOCTL_IV_DESTROY_CQ, &IvHandleIn { handle: cq.cq }),
        Ok(())
    );
}

/// Address resolution walks the ports in a boxed state taken in the
/// dispatch: with any allocation of that dispatch refused, the request
/// fails with `STATUS_INSUFFICIENT_RESOURCES` and nothing changes (no
/// object, no command, no charge); otherwise it ends as it does with
/// memory to spare.
#[test]
fn address_resolution_fails_cleanly_when_its_walk_cannot_be_boxed() {
    let r = Rig::new(16);
    let input = IvResolveAddrIn {
        dst_addr: [10, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        dst_family: IV_ADDR_IPV4,
        ..IvResolveAddrIn::default()
    };
    let out = size_of::<IvResolveAddrOut>();
    let baseline = r.issue(1, IOCTL_IV_RESOLVE_ADDR, &input, out);
    r.settle();
    let baseline = take_outcome(&baseline).expect("resolved");
    let before = (
        r.dev.snapshot(),
        r.platform().live_charges.load(Ordering::SeqCst),
    );
    let mut refused = 0;
    for n in 0.. {
        let request = FakeRequest::ioctl(
            IOCTL_IV_RESOLVE_ADDR,
            RequestorMode::User,
            1,
            1,
            input.as_bytes(),
            out,
        );
        let o = request.outcome.clone();
        let ((), failed) = irpverbs_failalloc::failing_nth(n, || r.dev.dispatch_ioctl(request));
        r.settle();
        let got = take_outcome(&o).expect("completed");
        if failed {
            refused += 1;
            assert_eq!(got.0, STATUS_INSUFFICIENT_RESOURCES, "allocation {n}");
            assert!(got.1.is_empty());
        } else {
            assert_eq!(got, baseline);
        }
        assert_eq!(
            (
                r.dev.snapshot(),
                r.platform().live_charges.load(Ordering::SeqCst)
            ),
            before,
            "allocation {n}: something changed"
        );
        if !failed {
            break;
        }
    }
    assert!(refused >= 1, "the walk's box was never refused");
}

#[test]
fn async_events_reach_the_owning_file_and_port_events_reach_all() {
    let r = Rig::new(16);
    let p = pd(&r, 1);
    let cq = cq_on(&r, 1, 0);
    let qp_in = IvCreateQpIn {
        pd: p,
        send_cq: cq.cq,
        recv_cq: cq.cq,
        qp_type: IV_QPT_RC,
        user_context: 0xABCD,
        cap: IvQpCap {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            ..Default::default()
        },
        ..Default::default()
    };
    let qp: IvCreateQpOut = r.call(1, IOCTL_IV_CREATE_QP, &qp_in).unwrap();
    let w1 = r.issue(
        1,
        IOCTL_IV_GET_ASYNC_EVENT,
        &(),
        size_of::<IvAsyncEventOut>(),
    );
    let w2 = r.issue(
        2,
        IOCTL_IV_GET_ASYNC_EVENT,
        &(),
        size_of::<IvAsyncEventOut>(),
    );
    r.hca
        .eq
        .lock()
        .unwrap()
        .push_back(Event::Async(AsyncEvent::QpFatal(qp.qpn)));
    r.dev.dpc();
    let (st, out) = take_outcome(&w1).unwrap();
    assert_eq!(st, STATUS_SUCCESS);
    let ev = IvAsyncEventOut::read_from_bytes(&out).unwrap();
    assert_eq!(
        (ev.event_type, ev.handle, ev.user_context),
        (IV_EVENT_QP_FATAL, qp.qp, 0xABCD)
    );
    assert!(take_outcome(&w2).is_none(), "file 2 does not own the QP");
    assert_eq!(
        r.call::<_, ()>(1, IOCTL_IV_DESTROY_QP, &IvHandleIn { handle: qp.qp }),
        Err(STATUS_DEVICE_BUSY)
    );
    r.hca
        .eq
        .lock()
        .unwrap()
        .push_back(Event::Async(AsyncEvent::PortActive(1)));
    r.dev.dpc();
    let ev = IvAsyncEventOut::read_from_bytes(&take_outcome(&w2).unwrap().1).unwrap();
    assert_eq!(
        (ev.event_type, ev.port_num, ev.handle),
        (IV_EVENT_PORT_ACTIVE, 1, 0)
    );
    let ev: IvAsyncEventOut = r.call(1, IOCTL_IV_GET_ASYNC_EVENT, &()).unwrap();
    assert_eq!(ev.event_type, IV_EVENT_PORT_ACTIVE);
    let ack = IvAckIn {
        handle: qp.qp,
        count: 1,
        event_type: IV_EVENT_QP_FATAL,
    };
    assert_eq!(r.call::<_, ()>(1, IOCTL_IV_ACK_ASYNC_EVENT, &ack), Ok(()));
    assert_eq!(
        r.call::<_, ()>(1, IOCTL_IV_DESTROY_QP, &IvHandleIn { handle: qp.qp }),
        Ok(())
    );
}

#[test]
fn cleanup_cancels_waits_and_removal_delivers_device_fatal() {
    let r = Rig::new(16);
    let cq = cq_on(&r, 1, 0);
    let n = r.issue(
        1,
        IOCTL_IV_CQ_NOTIFY,
        &IvCqNotifyIn {
            cq: cq.cq,
            arm: 0,
            reserved: 0,
        },
        16,
    );
    let a = r.issue(
        1,
        IOCTL_IV_GET_ASYNC_EVENT,
        &(),
        size_of::<IvAsyncEventOut>(),
    );
    r.dev.cleanup_file(1);
    assert_eq!(take_outcome(&n).unwrap().0, STATUS_CANCELLED);
    assert_eq!(take_outcome(&a).unwrap().0, STATUS_CANCELLED);
    r.settle();
    r.dev.close_file(1);
    // File 2: removal completes its async wait with DEVICE_FATAL.
    let a2 = r.issue(
        2,
        IOCTL_IV_GET_ASYNC_EVENT,
        &(),
        size_of::<IvAsyncEventOut>(),
    );
    let a3 = r.issue(
        2,
        IOCTL_IV_GET_ASYNC_EVENT,
        &(),
        size_of::<IvAsyncEventOut>(),
    );
    r.dev.remove();
    let ev = IvAsyncEventOut::read_from_bytes(&take_outcome(&a2).unwrap().1).unwrap();
    assert_eq!(ev.event_type, IV_EVENT_DEVICE_FATAL);
    assert_eq!(take_outcome(&a3).unwrap().0, STATUS_DEVICE_REMOVED);
    let after: Result<IvAsyncEventOut, _> = r.call(2, IOCTL_IV_GET_ASYNC_EVENT, &());
    assert_eq!(after.err(), Some(STATUS_DEVICE_REMOVED));
    r.dev.cleanup_file(2);
    r.dev.close_file(2);
    assert_eq!(r.dev.snapshot(), DeviceSnapshot::default());
    assert_eq!(r.platform().live_charges.load(Ordering::SeqCst), 0);
}

#[test]
fn ring_addresses_reach_a_user_caller_only_through_map_rings() {
    let r = Rig::new(16);
    let cq = cq_on(&r, 1, 0);
    assert_eq!(
        (cq.ring.control_addr, cq.ring.entries_addr),
        (0, 0),
        "no kernel address to a user-mode caller"
    );
    assert_eq!((cq.ring.entries, cq.ring.stride), (4, 64), "the geometry");
    let kernel = Via::Caller(RequestorMode::Kernel, 0);
    let kcq: IvCreateCqOut = r
        .call_as(
            1,
            IOCTL_IV_CREATE_CQ,
            &IvCreateCqIn {
                cqe: 8,
                ..Default::default()
            },
            kernel,
        )
        .unwrap();
    assert_ne!(kcq.ring.control_addr, 0, "kernel callers: kernel addresses");
    let h = IvHandleIn { handle: kcq.cq };
    let km: IvMapRingsOut = r.call_as(1, IOCTL_IV_MAP_RINGS, &h, kernel).unwrap();
    assert_eq!(
        km.ring, kcq.ring,
        "MAP_RINGS from a kernel caller: the same"
    );
    assert_eq!(r.platform().live_mappings(), 0, "and no mapping");
}

#[test]
fn map_rings_maps_each_ring_once_and_answers_the_same_addresses() {
    let r = Rig::new(16);
    let p = pd(&r, 1);
    let cq = cq_on(&r, 1, 0);
    let m: IvMapRingsOut = map(&r, 1, cq.cq).unwrap();
    assert_ne!(m.ring.control_addr, 0);
    assert_eq!(m.ring.entries_addr, m.ring.control_addr + 192);
    assert_eq!(
        (m.ring.entries, m.ring.stride),
        (cq.ring.entries, cq.ring.stride)
    );
    assert_eq!(m.rq, IvRingMap::default());
    let again: IvMapRingsOut = map(&r, 1, cq.cq).unwrap();
    assert_eq!(again, m, "the same addresses");
    assert_eq!(
        r.platform().maps_made.load(Ordering::SeqCst),
        1,
        "mapped once"
    );
    let qp = qp_on(&r, 1, p, cq.cq);
    assert_eq!(qp.sq.control_addr, 0);
    let m: IvMapRingsOut = map(&r, 1, qp.qp).unwrap();
    assert!(
        m.ring.control_addr != 0 && m.rq.control_addr != 0,
        "sq and rq"
    );
    assert_eq!(r.dev.snapshot().user_mappings, 3);
    // Not a ring object, stale, foreign: refused, nothing mapped.
    for handle in [p, 0, qp.qp ^ (1 << 40)] {
        let bad: Result<IvMapRingsOut, _> = map(&r, 1, handle);
        assert_eq!(bad, Err(STATUS_INVALID_HANDLE), "{handle:#x}");
    }
    let foreign: Result<IvMapRingsOut, _> = map(&r, 2, cq.cq);
    assert_eq!(foreign, Err(STATUS_INVALID_HANDLE));
    assert_eq!(r.platform().live_mappings(), 3);
    finish(&r);
}

#[test]
fn a_user_map_rings_from_the_queue_is_refused() {
    let r = Rig::new(16);
    let cq = cq_on(&r, 1, 0);
    let m: Result<IvMapRingsOut, _> = r.call_as(
        1,
        IOCTL_IV_MAP_RINGS,
        &IvHandleIn { handle: cq.cq },
        Via::QueueOnly(RequestorMode::User, 1),
    );
    assert_eq!(m, Err(STATUS_INVALID_DEVICE_STATE));
    let short = r.issue(
        1,
        IOCTL_IV_MAP_RINGS,
        &IvHandleIn { handle: cq.cq },
        size_of::<IvMapRingsOut>() - 1,
    );
    assert_eq!(take_outcome(&short).unwrap().0, STATUS_BUFFER_TOO_SMALL);
    r.platform().fail_map.store(true, Ordering::SeqCst);
    let failed: Result<IvMapRingsOut, _> = map(&r, 1, cq.cq);
    assert_eq!(failed, Err(STATUS_INSUFFICIENT_RESOURCES));
    assert_eq!(r.platform().live_mappings(), 0);
    finish(&r);
}

#[test]
fn a_destroyed_objects_rings_stay_mapped_and_allocated_until_the_next_request() {
    let r = Rig::new(16);
    let cq = cq_on(&r, 1, 0);
    let h = IvHandleIn { handle: cq.cq };
    let _: IvMapRingsOut = map(&r, 1, h.handle).unwrap();
    let memory = r
        .platform()
        .mapped
        .lock()
        .unwrap()
        .values()
        .next()
        .unwrap()
        .0
        .clone();
    assert_eq!(r.call::<_, ()>(1, IOCTL_IV_DESTROY_CQ, &h), Ok(()));
    // The destroy completed in the DPC: nothing could be unmapped there.
    assert_eq!(r.platform().live_mappings(), 1);
    assert!(memory.strong_count() > 0, "mapped memory is never freed");
    // A request from another process does not unmap (nor is it served).
    let _ = r.call_as::<_, IvQueryDeviceOut>(
        1,
        IOCTL_IV_QUERY_DEVICE,
        &(),
        Via::Caller(RequestorMode::User, 7),
    );
    assert_eq!(r.platform().live_mappings(), 1);
    // The next request from the file's process sweeps it.
    let _: IvQueryDeviceOut = r.call(1, IOCTL_IV_QUERY_DEVICE, &()).unwrap();
    assert_eq!(r.platform().live_mappings(), 0);
    assert_eq!(memory.strong_count(), 0, "unmapped, then freed");
    finish(&r);
}

#[test]
fn a_failed_destroy_keeps_the_mapping_and_a_resize_replaces_it() {
    let r = Rig::new(16);
    let p = pd(&r, 1);
    let cq = cq_on(&r, 1, 0);
    let h = IvHandleIn { handle: cq.cq };
    let first: IvMapRingsOut = map(&r, 1, h.handle).unwrap();
    let _qp = qp_on(&r, 1, p, cq.cq);
    assert_eq!(
        r.call::<_, ()>(1, IOCTL_IV_DESTROY_CQ, &h),
        Err(STATUS_DEVICE_BUSY)
    );
    let same: IvMapRingsOut = map(&r, 1, h.handle).unwrap();
    assert_eq!(same, first, "a busy CQ keeps its mapping");
    let resized: IvResizeCqOut = r
        .call(
            1,
            IOCTL_IV_RESIZE_CQ,
            &IvResizeCqIn {
                cq: cq.cq,
                cqe: 16,
                reserved: 0,
            },
        )
        .unwrap();
    assert_eq!(resized.ring.control_addr, 0, "geometry only");
    let new: IvMapRingsOut = map(&r, 1, h.handle).unwrap();
    assert_ne!(new.ring.control_addr, first.ring.control_addr);
    assert_eq!(r.platform().live_mappings(), 1, "the old ring was unmapped");
    finish(&r);
}

#[test]
fn cleanup_unmaps_everything_and_nothing_maps_after_it() {
    let r = Rig::new(16);
    let cq = cq_on(&r, 1, 0);
    let h = IvHandleIn { handle: cq.cq };
    let _: IvMapRingsOut = map(&r, 1, h.handle).unwrap();
    r.dev.cleanup_file(1);
    assert_eq!(r.platform().live_mappings(), 0);
    assert_eq!(r.dev.snapshot().user_mappings, 0);
    let late: Result<IvMapRingsOut, _> = map(&r, 1, h.handle);
    assert_eq!(late, Err(STATUS_DELETE_PENDING));
    r.settle();
    r.dev.close_file(1);
    finish(&r);
}

/// `IOCTL_IV_MAP_DOORBELLS` on `file`, as [`Rig::issue`] sends it.
fn map_doorbells(r: &Rig, file: FileKey) -> Result<IvMapDoorbellsOut, NtStatus> {
    r.call(file, IOCTL_IV_MAP_DOORBELLS, &())
}

#[test]
fn map_doorbells_maps_one_page_per_file_once() {
    let r = Rig::new(16);
    let m = map_doorbells(&r, 1).unwrap();
    assert_eq!((m.page_len, m.slots), (4096, 4096));
    assert_eq!(m.page_addr % 4096, 0);
    assert_eq!(map_doorbells(&r, 1), Ok(m), "the same address");
    assert_eq!(r.hca.pages_made.load(Ordering::SeqCst), 1, "one page");
    assert_eq!(
        r.platform().maps_made.load(Ordering::SeqCst),
        1,
        "mapped once"
    );
    let other = map_doorbells(&r, 2).unwrap();
    assert_ne!(other.page_addr, m.page_addr, "a page per file");
    assert_eq!(r.dev.snapshot().user_mappings, 2);
    // The mapping holds the page's memory past the HCA's free.
    let memory = irpverbs_ring::Shared::downgrade(&r.hca.pages.lock().unwrap()[&1].0);
    r.dev.cleanup_file(1);
    assert_eq!(r.platform().live_mappings(), 1, "cleanup unmaps");
    assert_eq!(map_doorbells(&r, 1), Err(STATUS_DELETE_PENDING));
    assert_eq!(
        r.hca.pages.lock().unwrap().len(),
        2,
        "kept until the file closes"
    );
    r.dev.close_file(1);
    assert_eq!(r.hca.pages.lock().unwrap().len(), 1, "freed at close");
    assert_eq!(memory.strong_count(), 0);
    finish(&r);
}

/// `IOCTL_IV_RING_DOORBELLS`: a user-mode file with a doorbell page wakes
/// the HCA, from its context or from the queue; a kernel caller, a file
/// without a page and a removed device are refused, and the HCA is not
/// called.
#[test]
fn ring_doorbells_wakes_the_hca_for_a_file_with_a_page() {
    let r = Rig::new(16);
    let rings = || r.hca.page_rings.load(Ordering::SeqCst);
    let ring = |file, via| r.call_as::<(), ()>(file, IOCTL_IV_RING_DOORBELLS, &(), via);
    let user = Via::Caller(RequestorMode::User, 1);
    assert_eq!(ring(1, user), Err(STATUS_INVALID_DEVICE_STATE), "no page");
    assert_eq!(rings(), 0);
    let _ = map_doorbells(&r, 1).unwrap();
    assert_eq!(ring(1, user), Ok(()));
    assert_eq!(
        ring(1, Via::QueueOnly(RequestorMode::User, 1)),
        Ok(()),
        "from the queue too: it needs no address space"
    );
    assert_eq!(rings(), 2);
    assert_eq!(
        ring(1, Via::Caller(RequestorMode::Kernel, 0)),
        Err(STATUS_NOT_SUPPORTED)
    );
    assert_eq!(ring(77, user), Err(STATUS_INVALID_HANDLE), "no such file");
    r.dev.remove();
    assert_eq!(ring(1, user), Err(STATUS_DEVICE_REMOVED));
    assert_eq!(rings(), 2);
    r.dev.cleanup_file(1);
    r.dev.close_file(1);
    finish(&r);
}

#[test]
fn map_doorbells_is_refused_where_it_cannot_be_served() {
    let r = Rig::new(16);
    let kernel = Via::Caller(RequestorMode::Kernel, 0);
    let queued = Via::QueueOnly(RequestorMode::User, 1);
    let from_kernel: Result<IvMapDoorbellsOut, _> =
        r.call_as(1, IOCTL_IV_MAP_DOORBELLS, &(), kernel);
    assert_eq!(
        from_kernel,
        Err(STATUS_NOT_SUPPORTED),
        "kernel ULPs ring directly"
    );
    let from_queue: Result<IvMapDoorbellsOut, _> =
        r.call_as(1, IOCTL_IV_MAP_DOORBELLS, &(), queued);
    assert_eq!(from_queue, Err(STATUS_INVALID_DEVICE_STATE));
    let short = r.issue(
        1,
        IOCTL_IV_MAP_DOORBELLS,
        &(),
        size_of::<IvMapDoorbellsOut>() - 1,
    );
    assert_eq!(take_outcome(&short).unwrap().0, STATUS_BUFFER_TOO_SMALL);
    // Another process: the file belongs to the first one.
    let _ = map_doorbells(&r, 1).unwrap();
    let denied: Result<IvMapDoorbellsOut, _> = r.call_as(
        1,
        IOCTL_IV_MAP_DOORBELLS,
        &(),
        Via::Caller(RequestorMode::User, 9),
    );
    assert_eq!(denied, Err(STATUS_ACCESS_DENIED));
    // A failed mapping maps nothing; the next request maps.
    r.platform().fail_map.store(true, Ordering::SeqCst);
    assert_eq!(map_doorbells(&r, 2), Err(STATUS_INSUFFICIENT_RESOURCES));
    assert_eq!(r.platform().live_mappings(), 1);
    assert!(map_doorbells(&r, 2).is_ok());
    // An HCA without doorbell pages.
    r.hca.no_doorbells.store(true, Ordering::SeqCst);
    r.dev.create_file(3, Some(1)).unwrap();
    assert_eq!(map_doorbells(&r, 3), Err(STATUS_NOT_SUPPORTED));
    r.dev.cleanup_file(3);
    r.dev.close_file(3);
    r.dev.remove();
    assert_eq!(map_doorbells(&r, 1), Err(STATUS_DEVICE_REMOVED));
    finish(&r);
}

#[test]
fn rings_mapped_after_the_page_report_their_doorbell_slots() {
    let r = Rig::new(16);
    let p = pd(&r, 1);
    let cq = cq_on(&r, 1, 0);
    let early = map(&r, 1, cq.cq).unwrap();
    assert_eq!(
        (early.ring_doorbell, early.rq_doorbell),
        (IV_DOORBELL_NONE, IV_DOORBELL_NONE),
        "no page yet"
    );
    let _ = map_doorbells(&r, 1).unwrap();
    let m = map(&r, 1, cq.cq).unwrap();
    assert_eq!((m.ring_doorbell, m.rq_doorbell), (0, IV_DOORBELL_NONE));
    let qp = qp_on(&r, 1, p, cq.cq);
    let qm = map(&r, 1, qp.qp).unwrap();
    assert_eq!((qm.ring_doorbell, qm.rq_doorbell), (1, 2));
    assert_eq!(map(&r, 1, qp.qp), Ok(qm), "bound once, the same slots");
    let cqn = cq.cqn;
    let qpn = qp.qpn;
    assert_eq!(
        r.hca.bound(1),
        [
            DoorbellTarget::CqArm(cqn),
            DoorbellTarget::Sq(qpn),
            DoorbellTarget::Rq(qpn)
        ]
    );
    // A kernel caller's MAP_RINGS binds nothing.
    let kernel = Via::Caller(RequestorMode::Kernel, 0);
    let km: IvMapRingsOut = r
        .call_as(1, IOCTL_IV_MAP_RINGS, &IvHandleIn { handle: qp.qp }, kernel)
        .unwrap();
    assert_eq!(
        (km.ring_doorbell, km.rq_doorbell),
        (IV_DOORBELL_NONE, IV_DOORBELL_NONE)
    );
    // The page is full (the fake has 3 slots): mapping another ring fails.
    let cq2 = cq_on(&r, 1, 0);
    assert_eq!(map(&r, 1, cq2.cq), Err(STATUS_INSUFFICIENT_RESOURCES));
    finish(&r);
}

#[test]
fn a_files_mappings_and_pins_belong_to_one_process() {
    let r = Rig::new(16);
    let p = pd(&r, 1);
    let cq = cq_on(&r, 1, 0);
    let h = IvHandleIn { handle: cq.cq };
    let other = Via::Caller(RequestorMode::User, 2);
    let _: IvMapRingsOut = map(&r, 1, h.handle).unwrap();
    let denied: Result<IvMapRingsOut, _> = r.call_as(1, IOCTL_IV_MAP_RINGS, &h, other);
    assert_eq!(denied, Err(STATUS_ACCESS_DENIED));
    let mr_in = IvRegMrIn {
        pd: p,
        addr: 4096,
        length: 4096,
        access: IV_ACCESS_LOCAL_WRITE,
        reserved: 0,
    };
    let denied: Result<IvRegMrOut, _> = r.call_as(1, IOCTL_IV_REG_MR, &mr_in, other);
    assert_eq!(denied, Err(STATUS_ACCESS_DENIED));
    assert_eq!(r.platform().pins.lock().unwrap().len(), 0, "nothing pinned");
    // Its doorbell page: refused before the page is allocated.
    let denied: Result<IvMapDoorbellsOut, _> = r.call_as(1, IOCTL_IV_MAP_DOORBELLS, &(), other);
    assert_eq!(denied, Err(STATUS_ACCESS_DENIED));
    assert_eq!(r.hca.pages_made.load(Ordering::SeqCst), 0, "no page");
    assert_eq!(r.platform().live_mappings(), 1, "only the opener's ring");
    // Control verbs from another process are fine.
    let _: IvQueryDeviceOut = r.call_as(1, IOCTL_IV_QUERY_DEVICE, &(), other).unwrap();
    // A file opened by process 2 belongs to process 2, even before it maps.
    r.dev.create_file(3, Some(2)).unwrap();
    let p3 = pd(&r, 3);
    let denied: Result<IvRegMrOut, _> = r.call(3, IOCTL_IV_REG_MR, &IvRegMrIn { pd: p3, ..mr_in });
    assert_eq!(denied, Err(STATUS_ACCESS_DENIED));
    let _: IvRegMrOut = r
        .call_as(3, IOCTL_IV_REG_MR, &IvRegMrIn { pd: p3, ..mr_in }, other)
        .unwrap();
    // A kernel-mode open has no process: user-mode memory requests on it
    // are refused from every process.
    r.dev.create_file(4, None).unwrap();
    let p4 = pd(&r, 4);
    let denied: Result<IvRegMrOut, _> = r.call(4, IOCTL_IV_REG_MR, &IvRegMrIn { pd: p4, ..mr_in });
    assert_eq!(denied, Err(STATUS_ACCESS_DENIED));
    for file in [3, 4] {
        r.dev.cleanup_file(file);
        r.settle();
        r.dev.close_file(file);
    }
    finish(&r);
}

/// The opener of file 1 exits while process 2 still holds a handle: the
/// file is run down at once (its mappings undone, in the exiting process,
/// its objects destroyed, its waits completed), every later request on it
/// fails with `STATUS_PROCESS_IS_TERMINATING`, and the last handle's
/// cleanup and close find nothing left to unmap. The other file is
/// untouched.
#[test]
fn the_openers_exit_runs_its_file_down() {
    let r = Rig::new(16);
    let p = pd(&r, 1);
    let cq = cq_on(&r, 1, 0);
    let qp = qp_on(&r, 1, p, cq.cq);
    let _ = map_doorbells(&r, 1).unwrap();
    let _ = map(&r, 1, cq.cq).unwrap();
    let _ = map(&r, 1, qp.qp).unwrap();
    let mr_in = IvRegMrIn {
        pd: p,
        addr: 4096,
        length: 4096,
        access: IV_ACCESS_LOCAL_WRITE,
        reserved: 0,
    };
    let _: IvRegMrOut = r.call(1, IOCTL_IV_REG_MR, &mr_in).unwrap();
    let other = Via::Caller(RequestorMode::User, 2);
    // Process 2 waits on the file's async events through its handle.
    let wait = r.issue_as(
        1,
        IOCTL_IV_GET_ASYNC_EVENT,
        &(),
        size_of::<IvAsyncEventOut>(),
        other,
    );
    let _ = pd(&r, 2);
    assert!(take_outcome(&wait).is_none(), "pending");
    assert_eq!(
        r.platform().live_mappings(),
        4,
        "the page, the CQ, the SQ and RQ"
    );

    r.dev.owner_exited(1);
    r.settle();
    assert_eq!(
        take_outcome(&wait).map(|o| o.0),
        Some(STATUS_PROCESS_IS_TERMINATING)
    );
    assert_eq!(r.platform().live_mappings(), 0, "unmapped in the opener");
    assert_eq!(r.platform().live_pins(), 0);
    assert!(r.dev.file_rundown_complete(1), "objects destroyed");
    for via in [other, Via::Caller(RequestorMode::User, 1)] {
        let late: Result<IvAllocPdOut, _> =
            r.call_as(1, IOCTL_IV_ALLOC_PD, &IvAllocPdIn::default(), via);
        assert_eq!(late, Err(STATUS_PROCESS_IS_TERMINATING));
        let late: Result<IvRegMrOut, _> = r.call_as(1, IOCTL_IV_REG_MR, &mr_in, via);
        assert_eq!(late, Err(STATUS_PROCESS_IS_TERMINATING));
        let late: Result<IvMapDoorbellsOut, _> = r.call_as(1, IOCTL_IV_MAP_DOORBELLS, &(), via);
        assert_eq!(late, Err(STATUS_PROCESS_IS_TERMINATING));
    }
    let late: Result<IvMapRingsOut, _> =
        r.call_as(1, IOCTL_IV_MAP_RINGS, &IvHandleIn { handle: cq.cq }, other);
    assert_eq!(late, Err(STATUS_PROCESS_IS_TERMINATING));
    // Again: nothing changes.
    let made = r.platform().maps_made.load(Ordering::SeqCst);
    r.dev.owner_exited(1);
    assert_eq!(r.platform().maps_made.load(Ordering::SeqCst), made);
    // File 2 lives on.
    let _ = pd(&r, 2);
    // The last handle closes (process 2): cleanup and close.
    finish(&r);
}

#[test]
fn a_user_registration_is_pinned_in_the_callers_context() {
    let r = Rig::new(16);
    let p = pd(&r, 1);
    let mr_in = |access| IvRegMrIn {
        pd: p,
        addr: 4096,
        length: 8192,
        access,
        reserved: 0,
    };
    let _: IvRegMrOut = r
        .call(1, IOCTL_IV_REG_MR, &mr_in(IV_ACCESS_LOCAL_WRITE))
        .unwrap();
    let _: IvRegMrOut = r
        .call(1, IOCTL_IV_REG_MR, &mr_in(IV_ACCESS_REMOTE_READ))
        .unwrap();
    {
        let pins = r.platform().pins.lock().unwrap();
        let asked: Vec<(RequestorMode, bool)> = pins.iter().map(|(_, m, w)| (*m, *w)).collect();
        assert_eq!(
            asked,
            [(RequestorMode::User, true), (RequestorMode::User, false)],
            "pinned for writing only with local write"
        );
    }
    // The fake HCA drops registered regions at once; a real one holds them.
    // A registration that reached the queue without its pin is refused.
    let skipped: Result<IvRegMrOut, _> = r.call_as(
        1,
        IOCTL_IV_REG_MR,
        &mr_in(0),
        Via::QueueOnly(RequestorMode::User, 1),
    );
    assert_eq!(skipped, Err(STATUS_INVALID_DEVICE_STATE));
    // Refused in the caller's context: nothing pinned.
    let before = r.platform().pins.lock().unwrap().len();
    for (bad, status) in [
        (
            IvRegMrIn {
                length: 0,
                ..mr_in(0)
            },
            STATUS_INVALID_PARAMETER,
        ),
        (
            IvRegMrIn {
                addr: USER_ADDRESS_LIMIT - 4096,
                ..mr_in(0)
            },
            STATUS_ACCESS_DENIED,
        ),
        (mr_in(IV_ACCESS_REMOTE_WRITE), STATUS_INVALID_PARAMETER),
    ] {
        let refused: Result<IvRegMrOut, _> = r.call(1, IOCTL_IV_REG_MR, &bad);
        assert_eq!(refused, Err(status));
    }
    assert_eq!(r.platform().pins.lock().unwrap().len(), before);
    // Pinned, then refused at dispatch (a bad PD): the pin is let go.
    let bad_pd: Result<IvRegMrOut, _> =
        r.call(1, IOCTL_IV_REG_MR, &IvRegMrIn { pd: 5, ..mr_in(0) });
    assert_eq!(bad_pd, Err(STATUS_INVALID_HANDLE));
    assert_eq!(r.platform().pins.lock().unwrap().len(), before + 1);
    assert_eq!(r.platform().live_pins(), 0);
    // A kernel caller's range is wrapped at dispatch.
    let _: IvRegMrOut = r
        .call_as(
            1,
            IOCTL_IV_REG_MR,
            &mr_in(0),
            Via::QueueOnly(RequestorMode::Kernel, 0),
        )
        .unwrap();
    assert_eq!(
        r.platform().pins.lock().unwrap().last().map(|p| p.1),
        Some(RequestorMode::Kernel)
    );
    finish(&r);
}

#[test]
fn removal_tells_the_hca_and_pins_nothing_more() {
    let r = Rig::new(16);
    let p = pd(&r, 1);
    r.dev.remove();
    assert!(r.hca.removed.load(Ordering::SeqCst));
    let refused: Result<IvRegMrOut, _> = r.call(
        1,
        IOCTL_IV_REG_MR,
        &IvRegMrIn {
            pd: p,
            addr: 4096,
            length: 4096,
            access: 0,
            reserved: 0,
        },
    );
    assert_eq!(refused, Err(STATUS_DEVICE_REMOVED));
    assert!(r.platform().pins.lock().unwrap().is_empty());
    finish(&r);
}

/// Closes both files and checks that nothing is left.
fn finish(r: &Rig) {
    for file in [1, 2] {
        r.dev.cleanup_file(file);
        r.settle();
        r.dev.close_file(file);
    }
    assert_eq!(r.dev.snapshot(), DeviceSnapshot::default());
    assert_eq!(r.platform().live_charges.load(Ordering::SeqCst), 0);
    assert_eq!(r.platform().live_mappings(), 0);
}

/// An RC QP with 4 WRs and 1 SGE each way, on `cq` for both queues.
fn qp_in(pd: IvHandle, cq: IvHandle) -> IvCreateQpIn {
    IvCreateQpIn {
        pd,
        send_cq: cq,
        recv_cq: cq,
        qp_type: IV_QPT_RC,
        cap: IvQpCap {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            ..Default::default()
        },
        ..Default::default()
    }
}

fn qp_on(r: &Rig, file: FileKey, pd: IvHandle, cq: IvHandle) -> IvCreateQpOut {
    r.call(file, IOCTL_IV_CREATE_QP, &qp_in(pd, cq)).unwrap()
}

#[test]
fn queries_overlap_and_a_destroy_waits_for_them() {
    let r = Rig::new(16);
    let p = pd(&r, 1);
    let cq = cq_on(&r, 1, 0);
    let qp_in = qp_in(p, cq.cq);
    let qp: IvCreateQpOut = r.call(1, IOCTL_IV_CREATE_QP, &qp_in).unwrap();
    let q = IvHandleIn { handle: qp.qp };
    let q1 = r.issue(1, IOCTL_IV_QUERY_QP, &q, size_of::<IvQueryQpOut>());
    let q2 = r.issue(1, IOCTL_IV_QUERY_QP, &q, size_of::<IvQueryQpOut>());
    let init = IvModifyQpIn {
        qp: qp.qp,
        attr_mask: IV_QP_STATE | IV_QP_PKEY_INDEX | IV_QP_PORT | IV_QP_ACCESS_FLAGS,
        reserved: 0,
        attr: IvQpAttr {
            qp_state: IV_QPS_INIT,
            port_num: 1,
            ..Default::default()
        },
    };
    let m = r.issue(1, IOCTL_IV_MODIFY_QP, &init, 0);
    assert!(
        take_outcome(&q1).is_none() && take_outcome(&q2).is_none() && take_outcome(&m).is_none(),
        "all pending together"
    );
    let d = r.issue(1, IOCTL_IV_DESTROY_QP, &q, 0);
    assert_eq!(
        take_outcome(&d).unwrap().0,
        STATUS_DEVICE_BUSY,
        "destroy waits for queries in flight"
    );
    r.settle();
    for o in [&q1, &q2] {
        assert_eq!(take_outcome(o).unwrap().0, STATUS_SUCCESS);
    }
    assert_eq!(take_outcome(&m).unwrap().0, STATUS_SUCCESS);
    assert_eq!(r.call::<_, ()>(1, IOCTL_IV_DESTROY_QP, &q), Ok(()));
}

#[test]
fn the_dpc_takes_every_mad_an_event_announces() {
    let r = Rig::new(8);
    let m = MadIn {
        port: 1,
        pkey_index: 0,
        dgid_index: 0,
        sgid: [1; 16],
        src_qpn: GSI_QPN,
        traffic_class: 0,
        flow_label: 0,
        hop_limit: 64,
        mad: [0; MAD_SIZE],
    };
    r.hca.mads_in.lock().unwrap().extend([m, m, m]);
    r.hca.eq.lock().unwrap().push_back(Event::Mad);
    r.dev.dpc();
    assert!(r.hca.mads_in.lock().unwrap().is_empty());
    assert_eq!(r.dev.stats().mads_received, 3);
}

/// The GSI of a remote CM engine, as the device's HCA sees it.
fn remote_gsi() -> irpverbs_cm::MadAddr {
    irpverbs_cm::MadAddr {
        port_num: 1,
        pkey_index: 0,
        sgid_index: 0,
        gid: [7; 16],
        lid: 0,
        qpn: GSI_QPN,
        sl: 0,
        traffic_class: 0,
        hop_limit: 64,
        flow_label: 0,
    }
}

/// `t` as the device's GSI receives it from [`remote_gsi`].
fn mad_in(t: &irpverbs_cm::Transmit) -> MadIn {
    MadIn {
        port: 1,
        pkey_index: 0,
        dgid_index: 0,
        sgid: [7; 16],
        src_qpn: GSI_QPN,
        traffic_class: 0,
        flow_label: 0,
        hop_limit: 64,
        mad: t.mad,
    }
}

#[test]
fn the_dpc_feeds_mads_to_the_cm_and_sends_its_answers() {
    let r = Rig::new(8);
    // A REQ from a remote CM for a service nobody listens on.
    let mut remote = irpverbs_cm::Engine::new(irpverbs_cm::Config::new(0xB2));
    let cep = remote.create(0).unwrap();
    let mut dest = remote_gsi();
    dest.gid = [9; 16];
    let p = irpverbs_cm::ConnectParams {
        dest,
        service_id: 0x1234,
        qpn: 0x99,
        max_cm_retries: 3,
        primary: irpverbs_cm::msg::Path {
            local_gid: [7; 16],
            remote_gid: [9; 16],
            hop_limit: 64,
            local_ack_timeout: 10,
            ..Default::default()
        },
        ..Default::default()
    };
    remote.connect(cep, &p, 0).unwrap();
    let req = remote.poll_transmit().unwrap();
    let mut garbage = req.mad;
    garbage[1] = 0x42; // not the CM class
    r.hca.mads_in.lock().unwrap().push_back(mad_in(&req));
    r.hca.mads_in.lock().unwrap().push_back(MadIn {
        mad: garbage,
        ..mad_in(&req)
    });
    r.hca.eq.lock().unwrap().push_back(Event::Mad);
    r.dev.dpc();
    let st = r.dev.stats();
    assert_eq!((st.mads_received, st.cm_mads_malformed), (2, 1));
    // The device's CM rejected it (no listener), through the HCA's GSI.
    let out = core::mem::take(&mut *r.hca.mads_out.lock().unwrap());
    assert_eq!(out.len(), 1);
    assert_eq!((out[0].dgid, out[0].dest_qpn, out[0].port), ([7; 16], 1, 1));
    remote.receive(0, &dest, &out[0].mad).unwrap();
    assert_eq!(remote.poll_ready().map(|(id, _)| id), Some(cep));
    assert!(matches!(
        remote.poll_event(cep),
        Some(irpverbs_cm::Event::Rejected { .. })
    ));
    assert_eq!(r.dev.cm_stats().rejects, 1);
}

#[test]
fn the_cm_timer_is_armed_at_the_next_deadline_and_retransmits() {
    let r = Rig::new(8);
    let armed: Arc<Mutex<Vec<u64>>> = Arc::default();
    let a = Arc::clone(&armed);
    r.dev
        .set_cm_timer(crate::cm::cm_timer_arm(move |d| a.lock().unwrap().push(d)).unwrap());
    assert!(armed.lock().unwrap().is_empty(), "nothing to wait for");
    // A connect from the device's CM (as the connect request will do).
    r.platform().now.store(1_000, Ordering::SeqCst);
    let flush = r.dev.state.lock(|s| {
        let cep = s.cm.engine.create(0).unwrap();
        let p = irpverbs_cm::ConnectParams {
            dest: remote_gsi(),
            service_id: 0x1234,
            qpn: 0x99,
            max_cm_retries: 1,
            remote_cm_response_timeout: 4,
            primary: irpverbs_cm::msg::Path {
                local_gid: [9; 16],
                remote_gid: [7; 16],
                hop_limit: 64,
                local_ack_timeout: 10,
                ..Default::default()
            },
            ..Default::default()
        };
        s.cm.engine.connect(cep, &p, 1_000).unwrap();
        s.cm.take()
    });
    r.dev.cm_flush(flush);
    assert_eq!(r.hca.mads_out.lock().unwrap().len(), 1, "the REQ");
    let deadline = *armed.lock().unwrap().last().expect("armed");
    assert!(deadline > 1_000);
    // The timer fires: the REQ again, and the timer re-armed.
    r.platform().now.store(deadline, Ordering::SeqCst);
    r.dev.cm_timer();
    assert_eq!(r.hca.mads_out.lock().unwrap().len(), 2, "retransmitted");
    assert_eq!(r.dev.cm_stats().retransmits, 1);
    let next = *armed.lock().unwrap().last().unwrap();
    assert!(next > deadline);
    // Stopped: no more arming.
    r.dev.stop_cm_timer();
    let n = armed.lock().unwrap().len();
    r.platform().now.store(next, Ordering::SeqCst);
    r.dev.cm_timer();
    assert_eq!(armed.lock().unwrap().len(), n);
}

/// A remote CM's REQ for `service_id` to the device's GSI ([9; 16]).
fn remote_req(remote: &mut irpverbs_cm::Engine, service_id: u64) -> irpverbs_cm::Transmit {
    let cep = remote.create(0).unwrap();
    let mut dest = remote_gsi();
    dest.gid = [9; 16];
    let p = irpverbs_cm::ConnectParams {
        dest,
        service_id,
        qpn: 0x99,
        max_cm_retries: 3,
        primary: irpverbs_cm::msg::Path {
            local_gid: [7; 16],
            remote_gid: [9; 16],
            hop_limit: 64,
            local_ack_timeout: 10,
            ..Default::default()
        },
        ..Default::default()
    };
    remote.connect(cep, &p, 0).unwrap();
    remote.poll_transmit().unwrap()
}

/// Calls of the callback `a_cep_callback_is_called_from_room_its_cep_took`
/// registers.
static CEP_CALLS: AtomicU32 = AtomicU32::new(0);

fn count_cep_call(_: [usize; 2], _: crate::cm::CepReady) {
    CEP_CALLS.fetch_add(1, Ordering::SeqCst);
}

/// A kernel CEP's callback call is queued in room the CEP took when it was
/// made: with any one allocation of the DPC that delivers a REQ to a
/// listener refused in turn, nothing panics, the listener's callback is
/// called at most once and then has the request to poll, or the REQ was
/// refused (no call, no event); with none refused, it is called once.
#[test]
fn a_cep_callback_is_called_from_room_its_cep_took() {
    let mut refused = 0;
    for n in 0.. {
        let r = Rig::new(8);
        let cep: IvCreateCepOut = r
            .call(1, IOCTL_IV_CREATE_CEP, &IvCreateCepIn { user_context: 5 })
            .unwrap();
        let listen = IvListenIn {
            cep: cep.cep,
            service_id: 0x1234,
        };
        assert_eq!(r.call::<_, ()>(1, IOCTL_IV_LISTEN, &listen), Ok(()));
        let callback = crate::cm::CepCallback::Function(crate::cm::CepFunction {
            call: count_cep_call,
            words: [0; 2],
        });
        r.dev.set_cep_callback(1, cep.cep, Some(callback)).unwrap();
        let mut remote = irpverbs_cm::Engine::new(irpverbs_cm::Config::new(0xB2));
        let req = remote_req(&mut remote, 0x1234);
        r.hca.mads_in.lock().unwrap().push_back(mad_in(&req));
        r.hca.eq.lock().unwrap().push_back(Event::Mad);
        CEP_CALLS.store(0, Ordering::SeqCst);
        let ((), failed) = irpverbs_failalloc::failing_nth(n, || r.dev.dpc());
        let calls = CEP_CALLS.load(Ordering::SeqCst);
        assert!(calls <= 1, "allocation {n}: {calls} calls");
        let polled = r.dev.poll_cep_event(1, cep.cep).unwrap();
        if calls == 1 {
            let ev = polled.expect("the call's event");
            assert_eq!(
                ev.event_type, IV_CEP_EVENT_CONNECT_REQUEST,
                "allocation {n}"
            );
        } else {
            assert!(failed, "no call with nothing refused");
            assert!(
                polled.is_none(),
                "allocation {n}: an event without its call"
            );
        }
        if !failed {
            assert_eq!(calls, 1);
            break;
        }
        refused += 1;
    }
    assert!(refused > 0, "the DPC allocated nothing to refuse");
}

#[test]
fn a_listening_cep_gets_connect_requests_through_its_pended_request() {
    let r = Rig::new(8);
    let cep: IvCreateCepOut = r
        .call(
            1,
            IOCTL_IV_CREATE_CEP,
            &IvCreateCepIn { user_context: 0x77 },
        )
        .unwrap();
    let listen = IvListenIn {
        cep: cep.cep,
        service_id: 0x1234,
    };
    assert_eq!(r.call::<_, ()>(1, IOCTL_IV_LISTEN, &listen), Ok(()));
    // A second listener on the service, a listen on no CEP, another file's.
    let other: IvCreateCepOut = r
        .call(1, IOCTL_IV_CREATE_CEP, &IvCreateCepIn { user_context: 0 })
        .unwrap();
    assert_eq!(
        r.call::<_, ()>(
            1,
            IOCTL_IV_LISTEN,
            &IvListenIn {
                cep: other.cep,
                ..listen
            }
        ),
        Err(STATUS_DEVICE_BUSY)
    );
    assert_eq!(
        r.call::<_, ()>(2, IOCTL_IV_LISTEN, &listen),
        Err(STATUS_INVALID_HANDLE)
    );
    assert_eq!(
        r.call::<_, ()>(1, IOCTL_IV_LISTEN, &IvListenIn { cep: 0, ..listen }),
        Err(STATUS_INVALID_HANDLE)
    );
    let get = IvHandleIn { handle: cep.cep };
    let w = r.issue(1, IOCTL_IV_GET_CEP_EVENT, &get, size_of::<IvCepEventOut>());
    assert!(take_outcome(&w).is_none(), "pended");
    assert_eq!(
        r.call::<_, IvCepEventOut>(1, IOCTL_IV_GET_CEP_EVENT, &get),
        Err(STATUS_DEVICE_BUSY),
        "one request per CEP"
    );
    // The REQ arrives: the pended request completes in the DPC.
    let mut remote = irpverbs_cm::Engine::new(irpverbs_cm::Config::new(0xB2));
    let req = remote_req(&mut remote, 0x1234);
    r.hca.mads_in.lock().unwrap().push_back(mad_in(&req));
    r.hca.eq.lock().unwrap().push_back(Event::Mad);
    r.dev.dpc();
    let (st, out) = take_outcome(&w).expect("completed");
    assert_eq!(st, STATUS_SUCCESS);
    let ev = IvCepEventOut::read_from_bytes(&out).unwrap();
    assert_eq!(ev.event_type, IV_CEP_EVENT_CONNECT_REQUEST);
    assert_eq!((ev.service_id, ev.remote_qpn), (0x1234, 0x99));
    assert_eq!((ev.remote_gid, ev.user_context), ([7; 16], 0x77));
    assert_ne!(ev.cep, cep.cep);
    assert_eq!(r.dev.snapshot().objects[Kind::Cep.index()], 3);
    // The listener has no more events: its next request pends.
    let w2 = r.issue(1, IOCTL_IV_GET_CEP_EVENT, &get, size_of::<IvCepEventOut>());
    assert!(take_outcome(&w2).is_none());
    // Destroying the new CEP rejects the REQ; destroying the listener
    // completes its pended request with STATUS_CANCELLED.
    let conn = IvHandleIn { handle: ev.cep };
    assert_eq!(r.call::<_, ()>(1, IOCTL_IV_DESTROY_CEP, &conn), Ok(()));
    let out = core::mem::take(&mut *r.hca.mads_out.lock().unwrap());
    assert_eq!(out.len(), 1, "the REJ");
    let mut dest = remote_gsi();
    dest.gid = [9; 16];
    remote.receive(0, &dest, &out[0].mad).unwrap();
    let (id, _) = remote.poll_ready().unwrap();
    assert!(matches!(
        remote.poll_event(id),
        Some(irpverbs_cm::Event::Rejected { .. })
    ));
    assert_eq!(r.call::<_, ()>(1, IOCTL_IV_DESTROY_CEP, &get), Ok(()));
    assert_eq!(take_outcome(&w2).map(|o| o.0), Some(STATUS_CANCELLED));
    assert_eq!(
        r.call::<_, ()>(1, IOCTL_IV_DESTROY_CEP, &get),
        Err(STATUS_INVALID_HANDLE)
    );
    assert_eq!(r.dev.snapshot().objects[Kind::Cep.index()], 1);
    assert_eq!(r.dev.cm_stats().rejects, 1);
}

#[test]
fn a_cep_event_waiting_completes_the_next_request_at_once_and_cleanup_frees_ceps() {
    let r = Rig::new(8);
    let cep: IvCreateCepOut = r
        .call(1, IOCTL_IV_CREATE_CEP, &IvCreateCepIn { user_context: 1 })
        .unwrap();
    let listen = IvListenIn {
        cep: cep.cep,
        service_id: 0x55,
    };
    r.call::<_, ()>(1, IOCTL_IV_LISTEN, &listen).unwrap();
    let mut remote = irpverbs_cm::Engine::new(irpverbs_cm::Config::new(0xB2));
    let req = remote_req(&mut remote, 0x55);
    r.hca.mads_in.lock().unwrap().push_back(mad_in(&req));
    r.hca.eq.lock().unwrap().push_back(Event::Mad);
    r.dev.dpc();
    // No request was pended: the event waits for one.
    let ev: IvCepEventOut = r
        .call(1, IOCTL_IV_GET_CEP_EVENT, &IvHandleIn { handle: cep.cep })
        .unwrap();
    assert_eq!(ev.event_type, IV_CEP_EVENT_CONNECT_REQUEST);
    // A pended request is cancelable.
    let w = r.issue(
        1,
        IOCTL_IV_GET_CEP_EVENT,
        &IvHandleIn { handle: ev.cep },
        size_of::<IvCepEventOut>(),
    );
    assert!(take_outcome(&w).is_none());
    r.dev.cleanup_file(1);
    assert_eq!(take_outcome(&w).map(|o| o.0), Some(STATUS_CANCELLED));
    assert_eq!(r.dev.snapshot().objects[Kind::Cep.index()], 0);
}

const GID_A: [u8; 16] = FAKE_GID;
const GID_B: [u8; 16] = [0xB; 16];

/// Moves the MADs `from` sent (it has GID `sgid`) to `to`'s GSI, and lets
/// both settle.
fn shuttle(from: &Rig, sgid: [u8; 16], to: &Rig) -> usize {
    let out = core::mem::take(&mut *from.hca.mads_out.lock().unwrap());
    let n = out.len();
    for m in out {
        to.hca.mads_in.lock().unwrap().push_back(MadIn {
            port: 1,
            pkey_index: 0,
            dgid_index: 0,
            sgid,
            src_qpn: GSI_QPN,
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 64,
            mad: m.mad,
        });
    }
    if n > 0 {
        to.hca.eq.lock().unwrap().push_back(Event::Mad);
    }
    to.settle();
    from.settle();
    n
}

/// An RC QP (RESET) on file 1.
fn rc_qp(r: &Rig) -> IvCreateQpOut {
    let p = pd(r, 1);
    let cq = r
        .call::<_, IvCreateCqOut>(
            1,
            IOCTL_IV_CREATE_CQ,
            &IvCreateCqIn {
                cqe: 8,
                ..Default::default()
            },
        )
        .unwrap()
        .cq;
    qp_on(r, 1, p, cq)
}

/// The driver's view of a QP's state.
fn qp_state(r: &Rig, qp: IvHandle) -> u32 {
    r.dev.state.lock(|s| {
        let f = s.files.get(&1).unwrap();
        let idx = f.objects.lookup(qp, Kind::Qp).unwrap();
        match &f.objects.get(idx).body {
            crate::object::Body::Qp(q) => q.state,
            _ => unreachable!(),
        }
    })
}

fn cep(r: &Rig) -> IvHandle {
    r.call::<_, IvCreateCepOut>(1, IOCTL_IV_CREATE_CEP, &IvCreateCepIn { user_context: 0 })
        .unwrap()
        .cep
}

fn connect_in(cep: IvHandle, qp: IvHandle, service_id: u64) -> IvCmConnectIn {
    IvCmConnectIn {
        cep,
        qp,
        service_id,
        local_gid: GID_A,
        remote_gid: GID_B,
        starting_psn: 100,
        cm_response_timeout: 16,
        max_cm_retries: 3,
        local_ack_timeout: 14,
        path_mtu: IV_MTU_1024 as u8,
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        min_rnr_timer: 12,
        flags: IV_CM_FLOW_CONTROL as u8,
        ..IvCmConnectIn::default()
    }
}

fn disc(cep: IvHandle) -> IvCmDisconnectIn {
    IvCmDisconnectIn {
        cep,
        ..IvCmDisconnectIn::default()
    }
}

fn cep_event(o: &Outcome) -> IvCepEventOut {
    let (st, out) = take_outcome(o).expect("completed");
    assert_eq!(st, STATUS_SUCCESS);
    IvCepEventOut::read_from_bytes(&out).unwrap()
}

#[test]
fn connect_accept_and_disconnect_are_each_one_request_moving_the_qps() {
    let (a, b) = (Rig::new(8), Rig::new(8));
    // B listens.
    let listener = cep(&b);
    b.call::<_, ()>(
        1,
        IOCTL_IV_LISTEN,
        &IvListenIn {
            cep: listener,
            service_id: 0x42,
        },
    )
    .unwrap();
    let get = |r: &Rig, cep| {
        r.issue(
            1,
            IOCTL_IV_GET_CEP_EVENT,
            &IvHandleIn { handle: cep },
            size_of::<IvCepEventOut>(),
        )
    };
    let wl = get(&b, listener);
    // A connects: its QP to INIT, then the REQ.
    let (ca, qa) = (cep(&a), rc_qp(&a));
    let wc = a.issue(1, IOCTL_IV_CM_CONNECT, &connect_in(ca, qa.qp, 0x42), 1);
    a.settle();
    assert_eq!(qp_state(&a, qa.qp), IV_QPS_INIT);
    assert!(take_outcome(&wc).is_none());
    assert_eq!(
        a.call::<_, ()>(1, IOCTL_IV_CM_CONNECT, &connect_in(ca, qa.qp, 0x42)),
        Err(STATUS_DEVICE_BUSY),
        "one request per CEP"
    );
    assert_eq!(shuttle(&a, GID_A, &b), 1, "the REQ");
    let req = cep_event(&wl);
    assert_eq!(req.event_type, IV_CEP_EVENT_CONNECT_REQUEST);
    assert_eq!(req.remote_qpn, qa.qpn);
    // B accepts: its QP to INIT, RTR and RTS, then the REP.
    let qb = rc_qp(&b);
    let wa = b.issue(
        1,
        IOCTL_IV_CM_ACCEPT,
        &IvCmAcceptIn {
            cep: req.cep,
            qp: qb.qp,
            starting_psn: 200,
            qpn: 0,
            ..IvCmAcceptIn::default()
        },
        1,
    );
    b.settle();
    assert_eq!(qp_state(&b, qb.qp), IV_QPS_RTS);
    assert!(take_outcome(&wa).is_none(), "waits for the RTU");
    // The REP: A's QP to RTR and RTS, the RTU; the connect completes.
    assert_eq!(shuttle(&b, GID_B, &a), 1, "the REP");
    assert_eq!(qp_state(&a, qa.qp), IV_QPS_RTS);
    assert_eq!(take_outcome(&wc).map(|o| o.0), Some(STATUS_SUCCESS));
    assert_eq!(shuttle(&a, GID_A, &b), 1, "the RTU");
    assert_eq!(take_outcome(&wa).map(|o| o.0), Some(STATUS_SUCCESS));
    // A disconnects: the DREQ, its QP to ERR; B sees the request and
    // disconnects too (its QP to ERR, the DREP); A's request completes.
    let wb = get(&b, req.cep);
    let wd = a.issue(1, IOCTL_IV_CM_DISCONNECT, &disc(ca), 1);
    a.settle();
    assert_eq!(qp_state(&a, qa.qp), IV_QPS_ERR);
    assert!(take_outcome(&wd).is_none(), "waits for the DREP");
    assert_eq!(shuttle(&a, GID_A, &b), 1, "the DREQ");
    assert_eq!(cep_event(&wb).event_type, IV_CEP_EVENT_DISCONNECT_REQUEST);
    assert_eq!(
        b.call::<_, ()>(1, IOCTL_IV_CM_DISCONNECT, &disc(req.cep)),
        Ok(())
    );
    assert_eq!(qp_state(&b, qb.qp), IV_QPS_ERR);
    assert_eq!(shuttle(&b, GID_B, &a), 1, "the DREP");
    assert_eq!(take_outcome(&wd).map(|o| o.0), Some(STATUS_SUCCESS));
}

#[test]
fn a_rejected_connect_fails_and_a_destroyed_cep_cancels_its_request() {
    let (a, b) = (Rig::new(8), Rig::new(8));
    let listener = cep(&b);
    b.call::<_, ()>(
        1,
        IOCTL_IV_LISTEN,
        &IvListenIn {
            cep: listener,
            service_id: 7,
        },
    )
    .unwrap();
    let (ca, qa) = (cep(&a), rc_qp(&a));
    let wc = a.issue(1, IOCTL_IV_CM_CONNECT, &connect_in(ca, qa.qp, 7), 1);
    a.settle();
    shuttle(&a, GID_A, &b);
    let req: IvCepEventOut = b
        .call(1, IOCTL_IV_GET_CEP_EVENT, &IvHandleIn { handle: listener })
        .unwrap();
    assert_eq!(
        b.call::<_, ()>(
            1,
            IOCTL_IV_CM_REJECT,
            &IvCmRejectIn {
                cep: req.cep,
                reason: 28,
                reserved: 0,
                ..IvCmRejectIn::default()
            },
        ),
        Ok(())
    );
    assert_eq!(shuttle(&b, GID_B, &a), 1, "the REJ");
    assert_eq!(
        take_outcome(&wc).map(|o| o.0),
        Some(STATUS_CONNECTION_REFUSED)
    );
    // A connect to nobody, its CEP destroyed while it waits for the REP.
    let (c2, q2) = (cep(&a), rc_qp(&a));
    let w2 = a.issue(1, IOCTL_IV_CM_CONNECT, &connect_in(c2, q2.qp, 9), 1);
    a.settle();
    assert!(take_outcome(&w2).is_none());
    assert_eq!(
        a.call::<_, ()>(1, IOCTL_IV_DESTROY_CEP, &IvHandleIn { handle: c2 }),
        Ok(())
    );
    assert_eq!(take_outcome(&w2).map(|o| o.0), Some(STATUS_CANCELLED));
    // Requests on the wrong objects.
    let c3 = cep(&a);
    assert_eq!(
        a.call::<_, ()>(1, IOCTL_IV_CM_CONNECT, &connect_in(c3, c3, 9)),
        Err(STATUS_INVALID_HANDLE)
    );
    assert_eq!(
        a.call::<_, ()>(1, IOCTL_IV_CM_DISCONNECT, &disc(c3)),
        Err(STATUS_INVALID_DEVICE_STATE)
    );
    assert_eq!(
        a.call::<_, ()>(
            1,
            IOCTL_IV_CM_REJECT,
            &IvCmRejectIn {
                cep: c3,
                reason: 0x1_0000,
                reserved: 0,
                ..IvCmRejectIn::default()
            },
        ),
        Err(STATUS_INVALID_PARAMETER)
    );
}

#[test]
fn an_accept_completes_on_the_first_receive_when_the_rtu_is_lost() {
    let (a, b) = (Rig::new(8), Rig::new(8));
    let listener = cep(&b);
    b.call::<_, ()>(
        1,
        IOCTL_IV_LISTEN,
        &IvListenIn {
            cep: listener,
            service_id: 3,
        },
    )
    .unwrap();
    let (ca, qa) = (cep(&a), rc_qp(&a));
    let wc = a.issue(1, IOCTL_IV_CM_CONNECT, &connect_in(ca, qa.qp, 3), 1);
    a.settle();
    shuttle(&a, GID_A, &b);
    let req: IvCepEventOut = b
        .call(1, IOCTL_IV_GET_CEP_EVENT, &IvHandleIn { handle: listener })
        .unwrap();
    let qb = rc_qp(&b);
    let wa = b.issue(
        1,
        IOCTL_IV_CM_ACCEPT,
        &IvCmAcceptIn {
            cep: req.cep,
            qp: qb.qp,
            starting_psn: 1,
            qpn: 0,
            ..IvCmAcceptIn::default()
        },
        1,
    );
    b.settle();
    shuttle(&b, GID_B, &a);
    assert_eq!(take_outcome(&wc).map(|o| o.0), Some(STATUS_SUCCESS));
    // The RTU is lost; B's QP gets its first message.
    a.hca.mads_out.lock().unwrap().clear();
    assert!(take_outcome(&wa).is_none());
    b.hca
        .eq
        .lock()
        .unwrap()
        .push_back(Event::Async(AsyncEvent::CommEstablished(qb.qpn)));
    b.settle();
    assert_eq!(take_outcome(&wa).map(|o| o.0), Some(STATUS_SUCCESS));
}

#[test]
fn closing_a_file_ends_its_connections_and_their_requests() {
    let (a, b) = (Rig::new(8), Rig::new(8));
    let listener = cep(&b);
    b.call::<_, ()>(
        1,
        IOCTL_IV_LISTEN,
        &IvListenIn {
            cep: listener,
            service_id: 4,
        },
    )
    .unwrap();
    let (ca, qa) = (cep(&a), rc_qp(&a));
    let wc = a.issue(1, IOCTL_IV_CM_CONNECT, &connect_in(ca, qa.qp, 4), 1);
    a.settle();
    shuttle(&a, GID_A, &b);
    // B's file goes away with the connect request unanswered: its CEPs are
    // destroyed, the REQ rejected at once.
    b.dev.cleanup_file(1);
    b.settle();
    assert_eq!(b.dev.snapshot().objects[Kind::Cep.index()], 0);
    assert_eq!(shuttle(&b, GID_B, &a), 1, "the REJ");
    assert_eq!(
        take_outcome(&wc).map(|o| o.0),
        Some(STATUS_CONNECTION_REFUSED)
    );
    // A's file goes away with a connect waiting for its REP.
    let (c2, q2) = (cep(&a), rc_qp(&a));
    let w2 = a.issue(1, IOCTL_IV_CM_CONNECT, &connect_in(c2, q2.qp, 4), 1);
    a.settle();
    a.dev.cleanup_file(1);
    a.settle();
    assert_eq!(take_outcome(&w2).map(|o| o.0), Some(STATUS_CANCELLED));
    assert_eq!(a.dev.snapshot().objects[Kind::Cep.index()], 0);
}

#[test]
fn a_qp_destroyed_under_a_connection_fails_its_requests_cleanly() {
    let (a, b) = (Rig::new(8), Rig::new(8));
    let listener = cep(&b);
    b.call::<_, ()>(
        1,
        IOCTL_IV_LISTEN,
        &IvListenIn {
            cep: listener,
            service_id: 6,
        },
    )
    .unwrap();
    let (ca, qa) = (cep(&a), rc_qp(&a));
    let wc = a.issue(1, IOCTL_IV_CM_CONNECT, &connect_in(ca, qa.qp, 6), 1);
    a.settle();
    // The QP goes while the connect waits for the REP.
    assert_eq!(
        a.call::<_, ()>(1, IOCTL_IV_DESTROY_QP, &IvHandleIn { handle: qa.qp }),
        Ok(())
    );
    shuttle(&a, GID_A, &b);
    let req: IvCepEventOut = b
        .call(1, IOCTL_IV_GET_CEP_EVENT, &IvHandleIn { handle: listener })
        .unwrap();
    let qb = rc_qp(&b);
    let wa = b.issue(
        1,
        IOCTL_IV_CM_ACCEPT,
        &IvCmAcceptIn {
            cep: req.cep,
            qp: qb.qp,
            starting_psn: 1,
            qpn: 0,
            ..IvCmAcceptIn::default()
        },
        1,
    );
    b.settle();
    shuttle(&b, GID_B, &a);
    assert_eq!(take_outcome(&wc).map(|o| o.0), Some(STATUS_INVALID_HANDLE));
    // A rejected the connection it could not finish: B's accept fails.
    assert_eq!(shuttle(&a, GID_A, &b), 1, "the REJ");
    assert_eq!(
        take_outcome(&wa).map(|o| o.0),
        Some(STATUS_CONNECTION_REFUSED)
    );
    // B's QP goes too: a disconnect then fails, and nothing panics.
    assert_eq!(
        b.call::<_, ()>(1, IOCTL_IV_DESTROY_QP, &IvHandleIn { handle: qb.qp }),
        Ok(())
    );
    let st = b.call::<_, ()>(1, IOCTL_IV_CM_DISCONNECT, &disc(req.cep));
    assert!(st.is_err());
}

/// An accept posts its QP's INIT, RTR and RTS modifies at once: when the
/// RTR fails at the HCA, the RTS after it fails too (its current state is
/// not the QP's), the accept completes with the RTR's status (not the
/// RTS's), the QP stays in INIT and is not left busy, and the requester is
/// rejected.
#[test]
fn an_accept_whose_rtr_fails_reports_that_failure_and_frees_the_qp() {
    let (a, b) = (Rig::new(8), Rig::new(8));
    let listener = cep(&b);
    b.call::<_, ()>(
        1,
        IOCTL_IV_LISTEN,
        &IvListenIn {
            cep: listener,
            service_id: 9,
        },
    )
    .unwrap();
    let (ca, qa) = (cep(&a), rc_qp(&a));
    let wc = a.issue(1, IOCTL_IV_CM_CONNECT, &connect_in(ca, qa.qp, 9), 1);
    a.settle();
    shuttle(&a, GID_A, &b);
    let req: IvCepEventOut = b
        .call(1, IOCTL_IV_GET_CEP_EVENT, &IvHandleIn { handle: listener })
        .unwrap();
    let qb = rc_qp(&b);
    b.hca.fail_modify_to.store(IV_QPS_RTR, Ordering::SeqCst);
    let modifies = |r: &Rig| r.dev.stats().commands_posted;
    let before = modifies(&b);
    let wa = b.issue(
        1,
        IOCTL_IV_CM_ACCEPT,
        &IvCmAcceptIn {
            cep: req.cep,
            qp: qb.qp,
            starting_psn: 1,
            ..IvCmAcceptIn::default()
        },
        1,
    );
    assert_eq!(modifies(&b) - before, 3, "INIT, RTR and RTS posted at once");
    b.settle();
    assert_eq!(
        take_outcome(&wa).map(|o| o.0),
        Some(STATUS_INSUFFICIENT_RESOURCES),
        "the RTR's status, not the RTS's"
    );
    assert_eq!(
        b.hca.qp_states.lock().unwrap().get(&qb.qpn).copied(),
        Some(IV_QPS_INIT),
        "the HCA left the QP in INIT"
    );
    // Not busy: the QP takes a modify (back to RESET) and a destroy.
    let reset = IvModifyQpIn {
        qp: qb.qp,
        attr_mask: IV_QP_STATE,
        attr: IvQpAttr {
            qp_state: IV_QPS_RESET,
            ..IvQpAttr::default()
        },
        ..IvModifyQpIn::default()
    };
    assert_eq!(b.call::<_, ()>(1, IOCTL_IV_MODIFY_QP, &reset), Ok(()));
    // The requester hears a REJ: its connect fails.
    assert_eq!(shuttle(&b, GID_B, &a), 1, "the REJ");
    a.settle();
    assert_eq!(
        take_outcome(&wc).map(|o| o.0),
        Some(STATUS_CONNECTION_REFUSED)
    );
    assert_eq!(
        b.call::<_, ()>(1, IOCTL_IV_DESTROY_QP, &IvHandleIn { handle: qb.qp }),
        Ok(())
    );
}

#[test]
fn a_connect_waiting_for_its_reply_is_cancelable() {
    let (a, b) = (Rig::new(8), Rig::new(8));
    let listener = cep(&b);
    b.call::<_, ()>(
        1,
        IOCTL_IV_LISTEN,
        &IvListenIn {
            cep: listener,
            service_id: 8,
        },
    )
    .unwrap();
    let (ca, qa) = (cep(&a), rc_qp(&a));
    let wc = a.issue(1, IOCTL_IV_CM_CONNECT, &connect_in(ca, qa.qp, 8), 1);
    a.settle();
    assert!(take_outcome(&wc).is_none());
    // The first wait of A's device: the parked connect.
    a.dev.cancel(1);
    assert_eq!(take_outcome(&wc).map(|o| o.0), Some(STATUS_CANCELLED));
    // The REP comes anyway: the abandoned connection is rejected.
    shuttle(&a, GID_A, &b);
    let req: IvCepEventOut = b
        .call(1, IOCTL_IV_GET_CEP_EVENT, &IvHandleIn { handle: listener })
        .unwrap();
    let qb = rc_qp(&b);
    let wa = b.issue(
        1,
        IOCTL_IV_CM_ACCEPT,
        &IvCmAcceptIn {
            cep: req.cep,
            qp: qb.qp,
            starting_psn: 1,
            qpn: 0,
            ..IvCmAcceptIn::default()
        },
        1,
    );
    b.settle();
    shuttle(&b, GID_B, &a);
    assert_eq!(shuttle(&a, GID_A, &b), 1, "the REJ");
    assert_eq!(
        take_outcome(&wa).map(|o| o.0),
        Some(STATUS_CONNECTION_REFUSED)
    );
}

/// A memory window: allocated on a PD, bound by `BIND_MW` (type 1), its
/// MR refuses deregistration while bound and the window stays live; bad
/// inputs get their statuses and change nothing; the file's rundown
/// deallocates windows before the MRs they are bound to.
#[test]
fn memory_windows_alloc_bind_busy_and_rundown() {
    let r = Rig::new(16);
    let p = pd(&r, 1);
    let mr_in = IvRegMrIn {
        pd: p,
        addr: 4096,
        length: 4096,
        access: IV_ACCESS_LOCAL_WRITE | IV_ACCESS_MW_BIND,
        reserved: 0,
    };
    let mr = r
        .call::<_, IvRegMrOut>(1, IOCTL_IV_REG_MR, &mr_in)
        .unwrap()
        .mr;
    let alloc = |mw_type| {
        r.call::<_, IvAllocMwOut>(
            1,
            IOCTL_IV_ALLOC_MW,
            &IvAllocMwIn {
                pd: p,
                mw_type,
                reserved: 0,
            },
        )
    };
    for bad in [0, 3, u32::MAX] {
        assert_eq!(alloc(bad), Err(STATUS_INVALID_PARAMETER));
    }
    assert_eq!(
        r.call::<_, IvAllocMwOut>(
            1,
            IOCTL_IV_ALLOC_MW,
            &IvAllocMwIn {
                pd: mr,
                mw_type: IV_MW_TYPE_1,
                reserved: 0
            }
        ),
        Err(STATUS_INVALID_HANDLE)
    );
    assert_eq!(r.dev.snapshot().objects[Kind::Mw.index()], 0);
    let mw = alloc(IV_MW_TYPE_1).unwrap();
    let mw2 = alloc(IV_MW_TYPE_2).unwrap();
    assert_eq!(r.dev.snapshot().objects[Kind::Mw.index()], 2);
    let bind = |mw, mr, access, length| {
        r.call::<_, IvBindMwOut>(
            1,
            IOCTL_IV_BIND_MW,
            &IvBindMwIn {
                mw,
                mr,
                addr: 4096,
                length,
                access,
                reserved: 0,
            },
        )
    };
    // Bad inputs: a local access flag, a wrapping range, a type 2 window,
    // handles of the wrong kind, an MR of another PD.
    assert_eq!(
        bind(mw.mw, mr, IV_ACCESS_LOCAL_WRITE, 8),
        Err(STATUS_INVALID_PARAMETER)
    );
    assert_eq!(
        bind(mw.mw, mr, IV_ACCESS_REMOTE_READ, u64::MAX),
        Err(STATUS_INVALID_PARAMETER)
    );
    assert_eq!(
        bind(mw2.mw, mr, IV_ACCESS_REMOTE_READ, 8),
        Err(STATUS_INVALID_PARAMETER)
    );
    assert_eq!(
        bind(mr, mr, IV_ACCESS_REMOTE_READ, 8),
        Err(STATUS_INVALID_HANDLE)
    );
    assert_eq!(
        bind(mw.mw, mw.mw, IV_ACCESS_REMOTE_READ, 8),
        Err(STATUS_INVALID_HANDLE)
    );
    let p2 = pd(&r, 1);
    let other = r
        .call::<_, IvRegMrOut>(1, IOCTL_IV_REG_MR, &IvRegMrIn { pd: p2, ..mr_in })
        .unwrap()
        .mr;
    assert_eq!(
        bind(mw.mw, other, IV_ACCESS_REMOTE_READ, 8),
        Err(STATUS_INVALID_PARAMETER_MIX)
    );
    assert!(
        r.dev.hca().windows.lock().unwrap().is_empty(),
        "nothing bound"
    );
    let bound = bind(mw.mw, mr, IV_ACCESS_REMOTE_READ, 8).unwrap();
    assert_ne!(bound.rkey, mw.rkey, "a bind changes the key");
    let dereg = |mr| r.call::<_, ()>(1, IOCTL_IV_DEREG_MR, &IvHandleIn { handle: mr });
    assert_eq!(dereg(mr), Err(STATUS_DEVICE_BUSY));
    // Still live: the window unbinds and the MR goes.
    assert_eq!(bind(mw.mw, mr, 0, 0).map(|_| ()), Ok(()));
    assert_eq!(dereg(mr), Ok(()));
    // A PD with windows is busy too.
    assert_eq!(
        r.call::<_, ()>(1, IOCTL_IV_DEALLOC_PD, &IvHandleIn { handle: p }),
        Err(STATUS_DEVICE_BUSY)
    );
    // Rundown with a bound window: the window goes first, then its MR,
    // with no refused destroy.
    let mr = r
        .call::<_, IvRegMrOut>(1, IOCTL_IV_REG_MR, &mr_in)
        .unwrap()
        .mr;
    bind(mw.mw, mr, IV_ACCESS_REMOTE_READ, 8).unwrap();
    r.dev.cleanup_file(1);
    r.settle();
    assert!(r.dev.file_rundown_complete(1));
    assert_eq!(r.dev.stats().rundown_failures, 0);
    r.dev.close_file(1);
    r.dev.cleanup_file(2);
    r.dev.close_file(2);
    assert_eq!(r.dev.snapshot(), DeviceSnapshot::default());
}

/// `ALLOC_MR`: kernel callers only (as `REG_PHYS_MR`); `max_num_sg` 1 to
/// `max_fast_reg_page_list_len`, a PD handle, reserved fields zero, each
/// refused with its status and nothing changed; the MR holds its PD and
/// is deregistered by its handle.
#[test]
fn alloc_mr_for_fast_registration() {
    let r = Rig::new(16);
    let p = pd(&r, 1);
    let kernel = Via::Caller(RequestorMode::Kernel, 0);
    let max = r.hca.caps.max_fast_reg_page_list_len;
    assert!(max >= 1);
    let input = |pd, max_num_sg, reserved| IvAllocMrIn {
        pd,
        max_num_sg,
        reserved,
    };
    let alloc = |i: &IvAllocMrIn| r.call_as::<_, IvRegMrOut>(1, IOCTL_IV_ALLOC_MR, i, kernel);
    assert_eq!(
        r.call::<_, IvRegMrOut>(1, IOCTL_IV_ALLOC_MR, &input(p, 1, 0)),
        Err(STATUS_ACCESS_DENIED),
        "user mode"
    );
    for bad in [input(p, 0, 0), input(p, max + 1, 0), input(p, 1, 1)] {
        assert_eq!(alloc(&bad), Err(STATUS_INVALID_PARAMETER), "{bad:?}");
    }
    assert_eq!(r.dev.snapshot().objects[Kind::Mr.index()], 0);
    let mr = alloc(&input(p, max, 0)).unwrap();
    assert_eq!(mr.lkey, mr.rkey);
    assert_eq!(alloc(&input(mr.mr, 1, 0)), Err(STATUS_INVALID_HANDLE));
    assert_eq!(r.dev.snapshot().objects[Kind::Mr.index()], 1);
    assert_eq!(
        r.call::<_, ()>(1, IOCTL_IV_DEALLOC_PD, &IvHandleIn { handle: p }),
        Err(STATUS_DEVICE_BUSY)
    );
    r.call::<_, ()>(1, IOCTL_IV_DEREG_MR, &IvHandleIn { handle: mr.mr })
        .unwrap();
    assert_eq!(r.dev.snapshot().objects[Kind::Mr.index()], 0);
}
