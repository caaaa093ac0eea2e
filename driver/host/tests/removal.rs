//! Surprise removal under traffic, on the real stack: two host devices on
//! the loopback wire, the one removed with rings mapped into its files,
//! QPs moving data both ways, a CM connection mid-handshake, pending CQ
//! notify, async-event and CEP-event requests, and a kernel ULP holding
//! the direct-call interface; in both engines, the verifier on.
//!
//! Every pending request completes (with an error, but the async-event
//! wait, which delivers `DEVICE_FATAL`), new verbs fail with
//! `STATUS_DEVICE_REMOVED`, destroys still succeed, every file learns
//! `DEVICE_FATAL`, the removed HCA touches no ring again, and the driver
//! unloads with nothing leaked.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use irpverbs_abi::*;
use irpverbs_host::loopwire::LoopWire;
use irpverbs_host::{Backend, Engine, HostDevice, HostDeviceConfig, Ioctl};
use irpverbs_soft::SoftConfig;
use irpverbs_verbs::{IntoClient, SendWr};
use zerocopy::{FromBytes, IntoBytes};

mod common;
use common::End;

crate::on_each_backend!(
    surprise_removal_under_traffic_inline,
    an_outstanding_kernel_interface_defers_the_unload,
);

const RW: u32 = FILE_READ_ACCESS | FILE_WRITE_ACCESS;
const SERVICE: u64 = 0x0106_4D2B;

fn device(backend: Backend, engine: Engine, last: u8) -> Arc<HostDevice> {
    HostDevice::new(HostDeviceConfig {
        backend,
        engine,
        soft: SoftConfig {
            ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, last)),
            node_guid: 0x0200_00FF_FE00_0000 | u64::from(last),
            ..SoftConfig::default()
        },
        ..HostDeviceConfig::default()
    })
    .expect("host device")
}

/// What an asynchronous request completed with.
type Outcome = Arc<Mutex<Option<(NtStatus, Vec<u8>)>>>;

fn outcome() -> Outcome {
    Arc::default()
}

/// Records a completion in `slot`.
fn into(slot: &Outcome) -> impl FnOnce(NtStatus, usize, &[u8]) + Send + 'static {
    let slot = Arc::clone(slot);
    move |status, info, out| *slot.lock().unwrap() = Some((status, out[..info].to_vec()))
}

/// Waits (a minute at most: the condition is what is tested) for `done`.
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn status_of(slot: &Outcome) -> Option<NtStatus> {
    slot.lock().unwrap().as_ref().map(|(s, _)| *s)
}

fn create_cep<I: zerocopy::IntoBytes + zerocopy::Immutable>(
    c: &irpverbs_verbs::Client,
    i: I,
) -> IvHandle {
    let (st, out) = c.raw(
        IOCTL_IV_CREATE_CEP,
        i.as_bytes(),
        size_of::<IvCreateCepOut>(),
    );
    assert_eq!(st, STATUS_SUCCESS, "{}", status_name(st));
    IvCreateCepOut::read_from_bytes(&out).unwrap().cep
}

fn sends(end: &End<'_>, first_id: u64, count: u64, len: usize) {
    for i in 0..count {
        end.qp
            .post_send(&SendWr {
                wr_id: first_id + i,
                opcode: IV_WR_SEND,
                flags: IV_SEND_SIGNALED,
                sges: &[end.sge(0, len)],
                ..SendWr::default()
            })
            .unwrap();
    }
}

fn recvs(end: &End<'_>, first_id: u64, count: u64, len: usize) {
    for i in 0..count {
        end.qp.post_recv(first_id + i, &[end.sge(0, len)]).unwrap();
    }
}

fn drain(end: &End<'_>) -> usize {
    let mut buf = [IvCqe::default(); 16];
    let mut n = 0;
    loop {
        let got = end.cq.poll(&mut buf).unwrap();
        if got == 0 {
            return n;
        }
        n += got;
    }
}

/// Destroys an end's objects, each destroy succeeding.
fn destroy(c: &irpverbs_verbs::Client, end: End<'_>) {
    let End { qp, cq, mr, pd, .. } = end;
    qp.destroy().map_err(|(_, st)| st).unwrap();
    cq.destroy().map_err(|(_, st)| st).unwrap();
    c.dereg_mr(mr.mr).unwrap();
    c.dealloc_pd(pd).unwrap();
}

fn surprise_removal_under_traffic(backend: Backend, engine: Engine) {
    let (da, db) = (device(backend, engine, 1), device(backend, engine, 2));
    let wire = LoopWire::start();
    wire.attach(da.soft()).unwrap();
    wire.attach(db.soft()).unwrap();
    let (fa, sa) = da.open(RW).unwrap().with_cm_submitter();
    let ca = fa.into_client();
    let cb = db.open(RW).unwrap().into_client();
    // A second file on the removed device, with nothing but an async-event
    // wait.
    let fa2 = da.open(RW).unwrap();
    // A kernel ULP holds the direct-call interface across the removal.
    let kernel = da.query_interface().expect("the kernel interface");

    // A connected pair, moving data both ways.
    let (a, b) = (End::new_rc(&ca), End::new_rc(&cb));
    ca.connect_qp(a.qp.handle(), IV_QPT_RC, b.qp.qpn(), db.soft().gid())
        .unwrap();
    cb.connect_qp(b.qp.handle(), IV_QPT_RC, a.qp.qpn(), da.soft().gid())
        .unwrap();
    recvs(&a, 100, 24, 4096);
    recvs(&b, 200, 24, 4096);
    sends(&a, 1, 4, 4096);
    sends(&b, 11, 4, 4096);
    // The first messages arrive (the pair works) ...
    wait_for("traffic before the removal", || {
        da.soft().stats().packets_received > 0 && db.soft().stats().packets_received > 0
    });
    // ... and more are in flight when the device goes.
    sends(&a, 21, 16, 4096);
    sends(&b, 31, 16, 4096);

    // A CM connection mid-handshake: B listens and sees the REQ, never
    // answers; A's CM_CONNECT stays pending.
    let listener = create_cep(&cb, IvCreateCepIn { user_context: 1 });
    let (st, _) = cb.raw(
        IOCTL_IV_LISTEN,
        IvListenIn {
            cep: listener,
            service_id: SERVICE,
        }
        .as_bytes(),
        0,
    );
    assert_eq!(st, STATUS_SUCCESS);
    let a2 = End::new_rc(&ca);
    let cep = create_cep(&ca, IvCreateCepIn { user_context: 2 });
    let connecting = outcome();
    let connect = IvCmConnectIn {
        cep,
        qp: a2.qp.handle(),
        service_id: SERVICE,
        local_gid: da.soft().gid(),
        remote_gid: db.soft().gid(),
        starting_psn: 0x100,
        path_mtu: IV_MTU_1024 as u8,
        ..common::connect_defaults()
    };
    let submitted = sa
        .submit(
            IOCTL_IV_CM_CONNECT,
            connect.as_bytes(),
            0,
            into(&connecting),
        )
        .unwrap();
    assert!(submitted.pended);
    let (st, out) = cb.raw(
        IOCTL_IV_GET_CEP_EVENT,
        IvHandleIn { handle: listener }.as_bytes(),
        size_of::<IvCepEventOut>(),
    );
    assert_eq!(st, STATUS_SUCCESS, "{}", status_name(st));
    let req = IvCepEventOut::read_from_bytes(&out).unwrap();
    assert_eq!(req.event_type, IV_CEP_EVENT_CONNECT_REQUEST);
    assert_eq!(status_of(&connecting), None, "the handshake is not over");

    // Pending waits: a CQ notify, a CEP event on a listener of A's, an
    // async event on the second file.
    let (st, out) = fa2.ioctl(
        IOCTL_IV_CREATE_CQ,
        IvCreateCqIn {
            cqe: 8,
            ..IvCreateCqIn::default()
        }
        .as_bytes(),
        size_of::<IvCreateCqOut>(),
    );
    assert_eq!(st, STATUS_SUCCESS);
    let cq2 = IvCreateCqOut::read_from_bytes(&out).unwrap().cq;
    let notify = outcome();
    let arm = IvCqNotifyIn {
        cq: cq2,
        arm: IV_NOTIFY_NEXT,
        reserved: 0,
    };
    assert!(
        fa2.submit(
            Ioctl::user(
                IOCTL_IV_CQ_NOTIFY,
                arm.as_bytes(),
                size_of::<IvCqEventOut>()
            ),
            into(&notify),
        )
        .pended
    );
    let a_listener = create_cep(&ca, IvCreateCepIn { user_context: 3 });
    let (st, _) = ca.raw(
        IOCTL_IV_LISTEN,
        IvListenIn {
            cep: a_listener,
            service_id: SERVICE + 1,
        }
        .as_bytes(),
        0,
    );
    assert_eq!(st, STATUS_SUCCESS);
    let cep_event = outcome();
    assert!(
        sa.submit(
            IOCTL_IV_GET_CEP_EVENT,
            IvHandleIn { handle: a_listener }.as_bytes(),
            size_of::<IvCepEventOut>(),
            into(&cep_event),
        )
        .unwrap()
        .pended
    );
    let async_event = outcome();
    assert!(
        fa2.submit(
            Ioctl::user(IOCTL_IV_GET_ASYNC_EVENT, &[], size_of::<IvAsyncEventOut>()),
            into(&async_event),
        )
        .pended
    );
    // The removal.
    da.surprise_remove();

    // Every pending request completed: with an error, but the async-event
    // wait, which carries DEVICE_FATAL.
    wait_for("the pending requests complete", || {
        status_of(&connecting).is_some()
            && status_of(&notify).is_some()
            && status_of(&cep_event).is_some()
            && status_of(&async_event).is_some()
    });
    for (what, slot) in [
        ("CM_CONNECT", &connecting),
        ("CQ_NOTIFY", &notify),
        ("GET_CEP_EVENT", &cep_event),
    ] {
        let st = status_of(slot).unwrap();
        assert!(!nt_success(st), "{what} completed with {}", status_name(st));
    }
    let (st, out) = async_event.lock().unwrap().take().unwrap();
    assert_eq!(st, STATUS_SUCCESS, "{}", status_name(st));
    let ev = IvAsyncEventOut::read_from_bytes(&out).unwrap();
    assert_eq!(ev.event_type, IV_EVENT_DEVICE_FATAL);

    // DEVICE_FATAL reaches the other file too.
    let ev = ca.get_async_event().expect("the first file's event");
    assert_eq!(ev.event_type, IV_EVENT_DEVICE_FATAL);

    // New verbs fail; opening fails.
    assert_eq!(ca.alloc_pd().unwrap_err(), STATUS_DEVICE_REMOVED);
    assert_eq!(ca.create_cq(8).unwrap_err(), STATUS_DEVICE_REMOVED);
    assert_eq!(da.open(RW).unwrap_err(), STATUS_DEVICE_REMOVED);

    // The removed HCA touches no ring: what it wrote before the removal is
    // polled, then a post's doorbell and B's retransmissions change
    // nothing on A.
    drain(&a);
    drain(&a2);
    let sent = da.soft().stats().packets_sent;
    sends(&a, 41, 4, 64);
    recvs(&a, 300, 4, 64);
    sends(&b, 51, 4, 64);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(drain(&a), 0, "no completion after the removal");
    assert_eq!(da.soft().stats().packets_sent, sent, "nothing sent");
    assert_eq!(da.soft().live_objects(), 0, "the HCA holds nothing");

    // Destroys still succeed.
    destroy(&ca, a);
    destroy(&ca, a2);
    let (st, _) = fa2.ioctl(
        IOCTL_IV_DESTROY_CQ,
        IvHandleIn { handle: cq2 }.as_bytes(),
        0,
    );
    assert_eq!(st, STATUS_SUCCESS, "{}", status_name(st));

    // The kernel ULP lets go; the files close; nothing leaked.
    // SAFETY: the context came from query_interface, referenced once for
    // this holder, given back once.
    #[allow(unsafe_code, reason = "the kernel interface's dereference")]
    unsafe {
        (kernel.interface_dereference)(kernel.context)
    };
    drop(sa);
    drop(ca);
    drop(fa2);
    da.quiesce(Duration::from_secs(10)).unwrap();
    da.unload();
    drop(b);
    drop(cb);
    db.quiesce(Duration::from_secs(10)).unwrap();
    db.unload();
    drop(wire);
}

fn surprise_removal_under_traffic_inline(backend: Backend) {
    surprise_removal_under_traffic(backend, Engine::Inline);
}

/// Soft HCA only: the model HCA has no firmware thread (its engine runs in the
/// device's DPC whatever the engine says).
#[test]
fn surprise_removal_under_traffic_on_the_firmware_thread() {
    surprise_removal_under_traffic(Backend::Soft, Engine::Thread);
}

/// A kernel ULP that still holds the direct-call interface after the
/// device was removed keeps the driver loaded: the unload waits for its
/// last dereference (the interface holds a reference on the device
/// object), the ULP's calls meanwhile reach live code, and the unload then
/// finishes with nothing leaked.
fn an_outstanding_kernel_interface_defers_the_unload(backend: Backend) {
    let dev = device(backend, Engine::Inline, 1);
    let kernel = dev.query_interface().expect("the kernel interface");
    assert_eq!(dev.platform().device_references(), 1);
    dev.surprise_remove();
    std::thread::scope(|s| {
        let unload = s.spawn(|| dev.unload());
        std::thread::sleep(Duration::from_millis(20));
        assert!(!unload.is_finished(), "the unload waits for the interface");
        // The ULP still calls into the driver: a reference and its
        // dereference through the table.
        #[allow(unsafe_code, reason = "the kernel interface's functions")]
        // SAFETY: the context is referenced (this holder's reference).
        unsafe {
            (kernel.interface_reference)(kernel.context);
        };
        #[allow(unsafe_code, reason = "the kernel interface's functions")]
        // SAFETY: the reference just taken, given back.
        unsafe {
            (kernel.interface_dereference)(kernel.context);
        };
        assert!(!unload.is_finished());
        #[allow(unsafe_code, reason = "the kernel interface's functions")]
        // SAFETY: the holder's own reference, given back once.
        unsafe {
            (kernel.interface_dereference)(kernel.context);
        };
        unload
            .join()
            .expect("the unload finishes once the ULP let go");
    });
    assert_eq!(dev.platform().device_references(), 0);
}
