//! Pended notification requests through the host platform, with the
//! verifier on: cancel (CancelIoEx) takes the platform's cancel path into
//! the driver's cancel routine; closing a file completes its waits; a cancel
//! racing a destroy completes each request exactly once.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use irpverbs_abi::*;
use irpverbs_host::{Backend, Engine, HostDevice, HostDeviceConfig, HostFile, Ioctl};
use zerocopy::{FromBytes, IntoBytes};

mod common;

crate::on_each_backend!(
    cancel_io_completes_a_pended_notify_with_cancelled,
    closing_a_file_completes_its_waits,
    cancel_racing_destroy_completes_each_request_exactly_once,
);

fn dev(backend: Backend, engine: Engine) -> Arc<HostDevice> {
    HostDevice::new(HostDeviceConfig {
        backend,
        engine,
        ..HostDeviceConfig::default()
    })
    .unwrap()
}

fn call<O: FromBytes>(f: &HostFile, code: u32, input: &[u8]) -> O {
    let (st, out) = f.ioctl(code, input, size_of::<O>());
    assert_eq!(st, STATUS_SUCCESS, "{}", status_name(st));
    O::read_from_bytes(&out).unwrap()
}

/// Waits (up to 10 s) for a completion that may run on another thread.
fn wait_for(done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !done() && std::time::Instant::now() < deadline {
        std::thread::yield_now();
    }
}

type Slot = Arc<std::sync::Mutex<Vec<NtStatus>>>;

fn pend(
    f: &HostFile,
    code: u32,
    input: &[u8],
    out: usize,
    slot: &Slot,
) -> irpverbs_host::Submitted {
    let s = Arc::clone(slot);
    f.submit(Ioctl::user(code, input, out), move |st, _, _| {
        s.lock().unwrap().push(st)
    })
}

fn cancel_io_completes_a_pended_notify_with_cancelled(backend: Backend) {
    for engine in [Engine::Inline, Engine::Thread] {
        let d = dev(backend, engine);
        let f = d.open(FILE_READ_ACCESS | FILE_WRITE_ACCESS).unwrap();
        let cq: IvCreateCqOut = call(
            &f,
            IOCTL_IV_CREATE_CQ,
            IvCreateCqIn {
                cqe: 16,
                ..Default::default()
            }
            .as_bytes(),
        );
        let slot: Slot = Arc::default();
        let arm = IvCqNotifyIn {
            cq: cq.cq,
            arm: IV_NOTIFY_NEXT,
            reserved: 0,
        };
        let sub = pend(
            &f,
            IOCTL_IV_CQ_NOTIFY,
            arm.as_bytes(),
            size_of::<IvCqEventOut>(),
            &slot,
        );
        assert!(sub.pended);
        assert!(slot.lock().unwrap().is_empty());
        assert!(sub.handle.as_ref().unwrap().cancel());
        wait_for(|| !slot.lock().unwrap().is_empty());
        assert_eq!(*slot.lock().unwrap(), vec![STATUS_CANCELLED]);
        assert_eq!(d.device().stats().cancelled, 1);
        drop(f);
        d.quiesce(std::time::Duration::from_secs(5)).unwrap();
        d.unload();
    }
}

fn closing_a_file_completes_its_waits(backend: Backend) {
    let d = dev(backend, Engine::Inline);
    let f = d.open(FILE_READ_ACCESS | FILE_WRITE_ACCESS).unwrap();
    let ch: IvCreateChannelOut = call(
        &f,
        IOCTL_IV_CREATE_CHANNEL,
        IvAllocPdIn::default().as_bytes(),
    );
    let cq: IvCreateCqOut = call(
        &f,
        IOCTL_IV_CREATE_CQ,
        IvCreateCqIn {
            cqe: 16,
            channel: ch.channel,
            ..Default::default()
        }
        .as_bytes(),
    );
    let slot: Slot = Arc::default();
    pend(
        &f,
        IOCTL_IV_GET_ASYNC_EVENT,
        &[],
        size_of::<IvAsyncEventOut>(),
        &slot,
    );
    pend(
        &f,
        IOCTL_IV_GET_CQ_EVENT,
        IvHandleIn { handle: ch.channel }.as_bytes(),
        16,
        &slot,
    );
    pend(
        &f,
        IOCTL_IV_CQ_NOTIFY,
        IvCqNotifyIn {
            cq: cq.cq,
            arm: 0,
            reserved: 0,
        }
        .as_bytes(),
        16,
        &slot,
    );
    assert_eq!(d.device().snapshot().waits, 3);
    drop(f); // CloseHandle: the verifier bugchecks if a request is still held at close
    assert_eq!(*slot.lock().unwrap(), vec![STATUS_CANCELLED; 3]);
    d.quiesce(std::time::Duration::from_secs(5)).unwrap();
    d.unload();
}

fn cancel_racing_destroy_completes_each_request_exactly_once(backend: Backend) {
    let d = dev(backend, Engine::Thread);
    let f = Arc::new(d.open(FILE_READ_ACCESS | FILE_WRITE_ACCESS).unwrap());
    let completions = Arc::new(AtomicUsize::new(0));
    let rounds = 300;
    for _ in 0..rounds {
        let cq: IvCreateCqOut = call(
            &f,
            IOCTL_IV_CREATE_CQ,
            IvCreateCqIn {
                cqe: 4,
                ..Default::default()
            }
            .as_bytes(),
        );
        let c = Arc::clone(&completions);
        let sub = f.submit(
            Ioctl::user(
                IOCTL_IV_CQ_NOTIFY,
                IvCqNotifyIn {
                    cq: cq.cq,
                    arm: 0,
                    reserved: 0,
                }
                .as_bytes(),
                16,
            ),
            move |st, _, _| {
                assert!(
                    st == STATUS_CANCELLED || st == STATUS_DELETE_PENDING,
                    "{}",
                    status_name(st)
                );
                c.fetch_add(1, Ordering::SeqCst);
            },
        );
        let h = sub.handle.unwrap();
        let canceller = std::thread::spawn(move || {
            h.cancel();
        });
        let (st, _) = f.ioctl(
            IOCTL_IV_DESTROY_CQ,
            IvHandleIn { handle: cq.cq }.as_bytes(),
            0,
        );
        assert_eq!(st, STATUS_SUCCESS);
        canceller.join().unwrap();
    }
    wait_for(|| completions.load(Ordering::SeqCst) >= rounds);
    assert_eq!(completions.load(Ordering::SeqCst), rounds);
    drop(f);
    d.quiesce(std::time::Duration::from_secs(10)).unwrap();
    d.unload();
}
