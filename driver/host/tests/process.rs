//! A file outlives the process that opened it: its handle was duplicated
//! into (or inherited by) a second process. The file's pins and mappings
//! belong to its opener, and the opener's exit runs the file down through
//! the driver's process-exit notification, while the exiting address space
//! is still there; the other process's requests are refused, before and
//! after, with documented statuses; both orders of exit are clean under the
//! verifier (0x76 for a process that ends with locked pages or mappings,
//! 0xC4/0x2002 for a touch of an exited process's address space), and
//! nothing leaks at removal.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use irpverbs_abi::*;
use irpverbs_host::platform::{catch_bugcheck, codes, locked_pages, verifier};
use irpverbs_host::{
    Backend, Engine, HostDevice, HostDeviceConfig, HostFile, Ioctl, UserDoorbells,
};
use irpverbs_verbs::IntoClient;
use zerocopy::IntoBytes;

mod common;
use common::{End, Mem, send, wait_for};

crate::on_each_backend!(
    opener_exits_first_inline,
    the_other_process_exits_first_then_the_opener_closes,
    the_other_process_is_refused_user_memory_and_changes_nothing,
    without_the_exit_notification_the_verifier_stops_both_errors,
);

const RW: u32 = FILE_READ_ACCESS | FILE_WRITE_ACCESS;

fn device(backend: Backend, engine: Engine, no_process_notify: bool) -> Arc<HostDevice> {
    HostDevice::new(HostDeviceConfig {
        backend,
        engine,
        user_doorbells: UserDoorbells::Page,
        no_process_notify,
        ..HostDeviceConfig::default()
    })
    .expect("host device")
}

type Outcome = Arc<Mutex<Option<NtStatus>>>;

/// An `IOCTL_IV_GET_ASYNC_EVENT` pending on `file`: its status once it
/// completes.
fn async_wait(file: &HostFile) -> Outcome {
    let slot: Outcome = Arc::default();
    let s = Arc::clone(&slot);
    let submitted = file.submit(
        Ioctl::user(IOCTL_IV_GET_ASYNC_EVENT, &[], size_of::<IvAsyncEventOut>()),
        move |st, _, _| *s.lock().unwrap() = Some(st),
    );
    assert!(submitted.pended);
    slot
}

/// The user-memory requests of `file`'s handle for the objects of `end`,
/// its registration's memory `mem`: `REG_MR`, `MAP_RINGS` of the CQ and the
/// QP, `MAP_DOORBELLS`; each one's status.
fn user_memory_requests(file: &HostFile, end: &End<'_>, mem: &Mem) -> [NtStatus; 4] {
    let reg = IvRegMrIn {
        pd: end.pd,
        addr: mem.addr(),
        length: 4096,
        access: IV_ACCESS_LOCAL_WRITE,
        reserved: 0,
    };
    let map = |handle| {
        file.ioctl(
            IOCTL_IV_MAP_RINGS,
            IvHandleIn { handle }.as_bytes(),
            size_of::<IvMapRingsOut>(),
        )
        .0
    };
    [
        file.ioctl(IOCTL_IV_REG_MR, reg.as_bytes(), size_of::<IvRegMrOut>())
            .0,
        map(end.cq.handle()),
        map(end.qp.handle()),
        file.ioctl(IOCTL_IV_MAP_DOORBELLS, &[], size_of::<IvMapDoorbellsOut>())
            .0,
    ]
}

/// (a) The opener A exits first, with an RC QP that moved data, its MR
/// pinned, its rings and doorbell page mapped, receives posted; B holds a
/// duplicate with an async-event wait pending. A's exit runs the file
/// down: nothing is left pinned or mapped in A when its address space goes
/// (else 0x76), B's wait completes and B's requests fail with
/// `STATUS_PROCESS_IS_TERMINATING`, B's close touches nothing of A (else
/// 0xC4/0x2002), and the device is removed with nothing leaked.
fn opener_exits_first(backend: Backend, engine: Engine) {
    let dev = device(backend, engine, false);
    let (a, b) = (dev.create_process(), dev.create_process());
    let fa = dev.open_in(a, RW).unwrap();
    let key = fa.key();
    let fb = fa.duplicate(b);
    assert_eq!((fa.process(), fb.process()), (a, b));
    let ca = fa.into_client();
    let ea = End::new_rc(&ca);
    let cp = dev.open(RW).unwrap().into_client();
    let peer = End::new_rc(&cp);
    let gid = dev.soft().gid();
    ca.connect_qp(ea.qp.handle(), IV_QPT_RC, peer.qp.qpn(), gid)
        .unwrap();
    cp.connect_qp(peer.qp.handle(), IV_QPT_RC, ea.qp.qpn(), gid)
        .unwrap();
    for i in 0..4 {
        ea.qp.post_recv(100 + i, &[ea.sge(0, 256)]).unwrap();
        peer.qp.post_recv(200 + i, &[peer.sge(0, 256)]).unwrap();
    }
    send(&ea, 1, 256);
    send(&peer, 2, 256);
    for end in [&ea, &peer] {
        assert_eq!(end.wc().status, IV_WC_SUCCESS);
        assert_eq!(end.wc().status, IV_WC_SUCCESS);
    }
    let wait = async_wait(&fb);
    let platform = dev.platform();
    assert!(platform.process_pinned(a) > 0);
    assert!(
        platform.process_mappings(a) >= 4,
        "the page, the CQ, the SQ and the RQ"
    );
    let objects = dev.soft().live_objects();

    // A dies without cleaning up: it never destroys its objects.
    std::mem::forget(ea);
    dev.exit_process(a, || drop(ca));
    assert_eq!(platform.process_pinned(a), 0);
    assert_eq!(platform.process_mappings(a), 0);
    assert_eq!(dev.cleanup_timeouts(), 0, "the pins went in time");
    wait_for("the rundown", || dev.device().file_rundown_complete(key));
    assert_eq!(
        dev.soft().live_objects(),
        objects - 4,
        "A's PD, MR, CQ and QP are gone"
    );
    assert_eq!(*wait.lock().unwrap(), Some(STATUS_PROCESS_IS_TERMINATING));

    // B: every request fails, memory requests included.
    let (st, _) = fb.ioctl(
        IOCTL_IV_ALLOC_PD,
        IvAllocPdIn::default().as_bytes(),
        size_of::<IvAllocPdOut>(),
    );
    assert_eq!(st, STATUS_PROCESS_IS_TERMINATING, "{}", status_name(st));
    let mem = Mem::new(4096);
    let reg = IvRegMrIn {
        pd: peer.pd,
        addr: mem.addr(),
        length: 4096,
        access: IV_ACCESS_LOCAL_WRITE,
        reserved: 0,
    };
    for (code, input, out) in [
        (IOCTL_IV_REG_MR, reg.as_bytes(), size_of::<IvRegMrOut>()),
        (
            IOCTL_IV_MAP_DOORBELLS,
            &[][..],
            size_of::<IvMapDoorbellsOut>(),
        ),
    ] {
        let (st, _) = fb.ioctl(code, input, out);
        assert_eq!(st, STATUS_PROCESS_IS_TERMINATING, "{}", status_name(st));
    }
    assert_eq!(platform.process_pinned(b), 0);
    // B closes the last handle, then exits: nothing of A is touched.
    dev.exit_process(b, || drop(fb));

    // The peer goes on without A.
    drop(peer);
    drop(cp);
    dev.quiesce(Duration::from_secs(10)).unwrap();
    HostDevice::remove(dev);
}

fn opener_exits_first_inline(backend: Backend) {
    opener_exits_first(backend, Engine::Inline);
}

/// Soft HCA only: the model HCA has no firmware thread (its engine runs in the
/// device's DPC whatever the engine says).
#[test]
fn opener_exits_first_on_the_firmware_thread() {
    opener_exits_first(Backend::Soft, Engine::Thread);
}

/// (b) B exits first (after its memory requests were refused), then A
/// goes on moving data and closes its file normally; a second file of A's
/// is still open when A exits, and A's exit runs that one down.
fn the_other_process_exits_first_then_the_opener_closes(backend: Backend) {
    for engine in [Engine::Inline, Engine::Thread] {
        let dev = device(backend, engine, false);
        let (a, b) = (dev.create_process(), dev.create_process());
        let fa = dev.open_in(a, RW).unwrap();
        let fb = fa.duplicate(b);
        let ca = fa.into_client();
        let (ca2, cb2) = (
            dev.open_in(a, RW).unwrap().into_client(),
            dev.open_in(a, RW).unwrap().into_client(),
        );
        let ea = End::new_rc(&ca);
        let e2 = End::new_rc(&ca2);
        let e3 = End::new_rc(&cb2);
        let gid = dev.soft().gid();
        ca.connect_qp(ea.qp.handle(), IV_QPT_RC, e2.qp.qpn(), gid)
            .unwrap();
        ca2.connect_qp(e2.qp.handle(), IV_QPT_RC, ea.qp.qpn(), gid)
            .unwrap();
        let mem = Mem::new(4096);
        let refused = user_memory_requests(&fb, &ea, &mem);
        assert_eq!(refused, [STATUS_ACCESS_DENIED; 4]);
        let (st, _) = fb.ioctl(IOCTL_IV_QUERY_DEVICE, &[], size_of::<IvQueryDeviceOut>());
        assert_eq!(st, STATUS_SUCCESS, "control verbs work from B");
        dev.exit_process(b, || drop(fb));

        // A is unaffected: traffic, then a normal close.
        for i in 0..4 {
            e2.qp.post_recv(i, &[e2.sge(0, 128)]).unwrap();
            send(&ea, 10 + i, 128);
            assert_eq!(ea.wc().status, IV_WC_SUCCESS);
            assert_eq!(e2.wc().status, IV_WC_SUCCESS);
        }
        drop(ea);
        drop(ca);
        // A dies holding two files with objects alive.
        std::mem::forget((e2, e3));
        dev.exit_process(a, || drop((ca2, cb2)));
        assert_eq!(dev.cleanup_timeouts(), 0);
        dev.quiesce(Duration::from_secs(10)).unwrap();
        HostDevice::remove(dev);
    }
}

/// (c) B's user-memory requests are refused with `STATUS_ACCESS_DENIED`
/// and change nothing: nothing pinned or mapped anywhere, no doorbell page
/// allocated, no object made; A's own requests go on as before.
fn the_other_process_is_refused_user_memory_and_changes_nothing(backend: Backend) {
    let dev = HostDevice::new(HostDeviceConfig {
        backend,
        ..HostDeviceConfig::default()
    })
    .expect("host device");
    let (a, b) = (dev.create_process(), dev.create_process());
    let fa = dev.open_in(a, RW).unwrap();
    let key = fa.key();
    let fb = fa.duplicate(b);
    let ca = fa.into_client();
    let ea = End::new_rc(&ca);
    let platform = dev.platform();
    let before = (
        platform.pinned(key),
        platform.process_mappings(a),
        dev.device().snapshot(),
        dev.soft().stats().doorbell_pages,
    );
    assert_eq!(before.3, 0, "direct doorbells: no page yet");
    let mem = Mem::new(4096);
    for _ in 0..2 {
        let refused = user_memory_requests(&fb, &ea, &mem);
        assert_eq!(refused, [STATUS_ACCESS_DENIED; 4]);
    }
    assert_eq!(
        (
            platform.pinned(key),
            platform.process_mappings(a),
            dev.device().snapshot(),
            dev.soft().stats().doorbell_pages,
        ),
        before
    );
    assert_eq!(
        (platform.process_pinned(b), platform.process_mappings(b)),
        (0, 0)
    );
    // A itself may: a second registration of the same memory.
    let mr = ca
        .reg_mr(ea.pd, mem.addr(), 4096, IV_ACCESS_LOCAL_WRITE)
        .unwrap();
    assert_eq!(platform.process_pinned(a), before.0 + 1);
    ca.dereg_mr(mr.mr).unwrap();
    drop(ea);
    drop(ca);
    dev.exit_process(a, || {});
    dev.exit_process(b, || drop(fb));
    dev.quiesce(Duration::from_secs(10)).unwrap();
    HostDevice::remove(dev);
}

/// Without the process-exit notification (a driver that never registered
/// it) the same exit is what the verifier exists for: A ends with its
/// pages locked and its rings mapped (0x76, naming A), and B's later close
/// unmaps them from A's dead address space (0xC4/0x2002).
fn without_the_exit_notification_the_verifier_stops_both_errors(backend: Backend) {
    let dev = device(backend, Engine::Inline, true);
    let (a, b) = (dev.create_process(), dev.create_process());
    let fa = dev.open_in(a, RW).unwrap();
    let fb = fa.duplicate(b);
    let ca = fa.into_client();
    let ea = End::new_rc(&ca);
    std::mem::forget(ea);
    let check = catch_bugcheck(|| dev.exit_process(a, || drop(ca))).expect_err("0x76 at A's exit");
    assert_eq!(check.code, codes::PROCESS_HAS_LOCKED_PAGES, "{check}");
    assert_eq!(check.param1(), locked_pages::STILL_LOCKED);
    assert_eq!(check.params[1], a);
    let check = catch_bugcheck(|| drop(fb)).expect_err("B's close touches A");
    assert_eq!(
        check.code,
        codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
        "{check}"
    );
    assert_eq!(check.param1(), verifier::HOST_EXITED_PROCESS_TOUCHED);
    assert_eq!(check.params[1], a);
}
