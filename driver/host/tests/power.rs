//! Sleep and resume (D0Exit to a sleep state, D0Entry) with requests
//! pending and traffic, the verifier on, in both engines, user-mode
//! doorbells through the doorbell page as on Windows.
//!
//! irpverbs.sys's queue is not power-managed: the event waits the driver
//! holds indefinitely (CQ notify, async events, CEP events, CM requests)
//! do not hold up the power transition (with a power-managed queue they
//! would: 0x9F, which the verifier raises), D0Exit stops the soft HCA's
//! work (a doorbell rung while asleep is not served), and after D0Entry
//! the traffic resumes and the waits complete as the events come.
//!
//! The model HCA's function goes to D3hot between D0Exit and D0Entry:
//! its mini-driver stops touching it (commands wait in the core's
//! backlog, doorbells are remembered and rung at D0Entry), the device
//! does no DMA, and the verifier stops a register access or a DMA out of
//! D0 (`model_*` tests).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use irpverbs_abi::*;
use irpverbs_core::platform::{Bar, PciPlatform};
use irpverbs_host::platform::{catch_bugcheck, codes, dma, power, verifier};
use irpverbs_host::{Backend, Engine, HostDevice, HostDeviceConfig, Ioctl, UserDoorbells};
use irpverbs_verbs::IntoClient;
use zerocopy::{FromBytes, IntoBytes};

mod common;
use common::{End, send, wait_for};

crate::on_each_backend!(
    sleep_and_resume_with_waits_and_traffic_inline,
    a_wait_held_from_a_power_managed_queue_blocks_sleep,
);

const RW: u32 = FILE_READ_ACCESS | FILE_WRITE_ACCESS;

fn device(backend: Backend, engine: Engine, power_managed_queue: bool) -> Arc<HostDevice> {
    HostDevice::new(HostDeviceConfig {
        backend,
        engine,
        user_doorbells: UserDoorbells::Page,
        power_managed_queue,
        ..HostDeviceConfig::default()
    })
    .expect("host device")
}

type Outcome = Arc<Mutex<Option<NtStatus>>>;

fn sleep_and_resume_with_waits_and_traffic(backend: Backend, engine: Engine) {
    let dev = device(backend, engine, false);
    let (ca, cb) = (
        dev.open(RW).unwrap().into_client(),
        dev.open(RW).unwrap().into_client(),
    );
    let (a, b) = (End::new_rc(&ca), End::new_rc(&cb));
    let gid = dev.soft().gid();
    ca.connect_qp(a.qp.handle(), IV_QPT_RC, b.qp.qpn(), gid)
        .unwrap();
    cb.connect_qp(b.qp.handle(), IV_QPT_RC, a.qp.qpn(), gid)
        .unwrap();
    for i in 0..8 {
        b.qp.post_recv(100 + i, &[b.sge(0, 256)]).unwrap();
    }
    // Traffic before the sleep.
    send(&a, 1, 256);
    assert_eq!(a.wc().status, IV_WC_SUCCESS);
    assert_eq!(b.wc().status, IV_WC_SUCCESS);

    // Pending waits: an async-event wait on a third file, and a CQ notify
    // on B's CQ (a synchronous call on its own thread).
    let fc = dev.open(RW).unwrap();
    let async_event: Outcome = Arc::default();
    let slot = Arc::clone(&async_event);
    assert!(
        fc.submit(
            Ioctl::user(IOCTL_IV_GET_ASYNC_EVENT, &[], size_of::<IvAsyncEventOut>()),
            move |st, _, _| *slot.lock().unwrap() = Some(st),
        )
        .pended
    );
    std::thread::scope(|s| {
        let notify = s.spawn(|| {
            let arm = IvCqNotifyIn {
                cq: b.cq.handle(),
                arm: IV_NOTIFY_NEXT,
                reserved: 0,
            };
            let (st, out) = cb.raw(
                IOCTL_IV_CQ_NOTIFY,
                arm.as_bytes(),
                size_of::<IvCqEventOut>(),
            );
            (st, IvCqEventOut::read_from_bytes(&out).ok())
        });
        wait_for("both waits pending", || dev.device().snapshot().waits == 2);

        // Sleep: the waits stay with the driver, and the transition is
        // not held up (the verifier would raise 0x9F).
        dev.d0_exit();
        assert!(!dev.in_d0());
        assert_eq!(dev.device().snapshot().waits, 2);
        // Asleep, the HCA does no work of its own: on the firmware thread a
        // send rung through the doorbell page is not served (inline, a
        // doorbell the ULP hands over with IOCTL_IV_RING_DOORBELLS runs in
        // that call, as the queue still presents requests).
        send(&a, 2, 256);
        if engine == Engine::Thread {
            std::thread::sleep(Duration::from_millis(20));
            let mut wc = [IvCqe::default(); 1];
            assert_eq!(b.cq.poll(&mut wc).unwrap(), 0, "no work while asleep");
            assert!(!notify.is_finished(), "the notify is still waiting");
        }

        // Resume: the send is served, the notify fires, traffic flows.
        dev.d0_entry().unwrap();
        assert!(dev.in_d0());
        assert_eq!(a.wc().status, IV_WC_SUCCESS);
        let (st, event) = notify.join().unwrap();
        assert_eq!(st, STATUS_SUCCESS, "{}", status_name(st));
        assert_eq!(event.unwrap().cq, b.cq.handle());
        assert_eq!(b.wc().status, IV_WC_SUCCESS);
    });
    for i in 3..8 {
        send(&a, i, 256);
        assert_eq!(a.wc().status, IV_WC_SUCCESS);
        assert_eq!(b.wc().status, IV_WC_SUCCESS);
    }
    // A second sleep and resume with nothing pending but the async wait.
    dev.d0_exit();
    dev.d0_entry().unwrap();
    assert_eq!(*async_event.lock().unwrap(), None, "still waiting");
    drop(fc);
    assert_eq!(*async_event.lock().unwrap(), Some(STATUS_CANCELLED));
    drop((a, b));
    drop((ca, cb));
    dev.quiesce(Duration::from_secs(10)).unwrap();
    dev.unload();
}

fn sleep_and_resume_with_waits_and_traffic_inline(backend: Backend) {
    sleep_and_resume_with_waits_and_traffic(backend, Engine::Inline);
}

/// Soft HCA only: the model HCA has no firmware thread (its engine runs in the
/// device's DPC whatever the engine says).
#[test]
fn sleep_and_resume_with_waits_and_traffic_on_the_firmware_thread() {
    sleep_and_resume_with_waits_and_traffic(Backend::Soft, Engine::Thread);
}

/// With a power-managed queue (KMDF's default) and no `EvtIoStop`, a wait
/// the driver holds keeps the device from leaving D0: the verifier raises
/// what Windows raises when the power watchdog fires.
fn a_wait_held_from_a_power_managed_queue_blocks_sleep(backend: Backend) {
    let dev = device(backend, Engine::Inline, true);
    let f = dev.open(RW).unwrap();
    // Nothing held: the device sleeps and resumes.
    dev.d0_exit();
    dev.d0_entry().unwrap();
    let done: Outcome = Arc::default();
    let slot = Arc::clone(&done);
    assert!(
        f.submit(
            Ioctl::user(IOCTL_IV_GET_ASYNC_EVENT, &[], size_of::<IvAsyncEventOut>()),
            move |st, _, _| *slot.lock().unwrap() = Some(st),
        )
        .pended
    );
    let check = catch_bugcheck(|| dev.d0_exit()).expect_err("0x9F");
    assert_eq!(check.code, codes::DRIVER_POWER_STATE_FAILURE, "{check}");
    assert_eq!(check.param1(), power::BLOCKED_IRP);
    drop(f);
    assert_eq!(*done.lock().unwrap(), Some(STATUS_CANCELLED));
    dev.quiesce(Duration::from_secs(10)).unwrap();
    dev.unload();
}

fn model_device() -> Arc<HostDevice> {
    HostDevice::new(HostDeviceConfig {
        backend: Backend::Model,
        ..HostDeviceConfig::default()
    })
    .expect("host device")
}

fn alloc_pd(f: &irpverbs_host::HostFile) -> Outcome {
    let done: Outcome = Arc::default();
    alloc_pd_into(f, &done);
    done
}

fn alloc_pd_into(f: &irpverbs_host::HostFile, done: &Outcome) {
    let slot = Arc::clone(done);
    let input = IvAllocPdIn::default();
    f.submit(
        Ioctl::user(
            IOCTL_IV_ALLOC_PD,
            input.as_bytes(),
            size_of::<IvAllocPdOut>(),
        ),
        move |st, _, _| *slot.lock().unwrap() = Some(st),
    );
}

/// Out of D0 the model's mini-driver posts no command: verbs wait in the
/// core's backlog (their requests pending), the device executes nothing
/// and does no DMA; at D0Entry they are posted in order and complete,
/// none lost. Doorbells rung directly (a kernel ULP's, or a user ULP's
/// speed path without a doorbell page) are remembered per queue and rung
/// at D0Entry: a SEND and its RECV posted while asleep complete after it.
#[test]
fn model_commands_and_doorbells_out_of_d0_wait_for_d0_entry() {
    let dev = model_device();
    let (ca, cb) = (
        dev.open(RW).unwrap().into_client(),
        dev.open(RW).unwrap().into_client(),
    );
    let (a, b) = (End::new_rc(&ca), End::new_rc(&cb));
    let gid = dev.soft().gid();
    ca.connect_qp(a.qp.handle(), IV_QPT_RC, b.qp.qpn(), gid)
        .unwrap();
    cb.connect_qp(b.qp.handle(), IV_QPT_RC, a.qp.qpn(), gid)
        .unwrap();
    b.qp.post_recv(1, &[b.sge(0, 256)]).unwrap();
    send(&a, 1, 256);
    assert_eq!(a.wc().status, IV_WC_SUCCESS);
    assert_eq!(b.wc().status, IV_WC_SUCCESS);

    let (hca, silicon) = dev.model().unwrap();
    dev.d0_exit();
    assert!(!dev.platform().device_in_d0());
    assert!(!hca.in_d0() && !silicon.in_d0());
    let executed = silicon.stats().commands;
    let messages = silicon.stats().messages;

    // Three verbs while asleep: pending, backlogged, not executed.
    let f = dev.open(RW).unwrap();
    let backlogged = dev.device().stats().commands_backlogged;
    let pds: Vec<Outcome> = (0..3).map(|_| alloc_pd(&f)).collect();
    assert_eq!(dev.device().stats().commands_backlogged, backlogged + 3);
    for pd in &pds {
        assert_eq!(*pd.lock().unwrap(), None, "pending while asleep");
    }
    // A RECV and a SEND posted while asleep: their doorbells wait.
    b.qp.post_recv(2, &[b.sge(0, 256)]).unwrap();
    send(&a, 2, 256);
    std::thread::sleep(Duration::from_millis(20));
    let mut wc = [IvCqe::default(); 1];
    assert_eq!(a.cq.poll(&mut wc).unwrap(), 0, "no work while asleep");
    assert_eq!(b.cq.poll(&mut wc).unwrap(), 0, "no work while asleep");
    assert_eq!(silicon.stats().commands, executed);
    assert_eq!(silicon.stats().messages, messages);

    dev.d0_entry().unwrap();
    assert!(dev.platform().device_in_d0() && hca.in_d0() && silicon.in_d0());
    wait_for("the backlog completes", || {
        pds.iter().all(|pd| pd.lock().unwrap().is_some())
    });
    for pd in &pds {
        assert_eq!(*pd.lock().unwrap(), Some(STATUS_SUCCESS));
    }
    assert_eq!(silicon.stats().commands, executed + 3);
    let w = a.wc();
    assert_eq!((w.wr_id, w.status), (2, IV_WC_SUCCESS));
    let w = b.wc();
    assert_eq!((w.wr_id, w.status), (2, IV_WC_SUCCESS));
    // And on as before.
    b.qp.post_recv(3, &[b.sge(0, 256)]).unwrap();
    send(&a, 3, 256);
    assert_eq!(a.wc().status, IV_WC_SUCCESS);
    assert_eq!(b.wc().status, IV_WC_SUCCESS);
    drop(f);
    drop((a, b));
    drop((ca, cb));
    dev.quiesce(Duration::from_secs(10)).unwrap();
    dev.unload();
}

/// A mini-driver that lets its function go to D3hot without quiescing it
/// (no `suspend`): its next register access is a verifier stop (on
/// hardware the doorbell would be lost and the command never complete).
#[test]
fn model_a_register_access_out_of_d0_is_a_verifier_stop() {
    let dev = model_device();
    let f = dev.open(RW).unwrap();
    // The bus driver powers the function down behind the driver's back.
    dev.platform().set_device_power(false);
    let bar = dev.platform().map_bar(0).unwrap();
    let check = catch_bugcheck(|| bar.write32(0, 0)).expect_err("0xC4");
    assert_eq!(
        check.code,
        codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
        "{check}"
    );
    assert_eq!(check.params[0], verifier::HOST_REGISTER_ACCESS_OUT_OF_D0);
    assert_eq!(check.params[1..], [0, 0, 4]);
    // A verb: the mini-driver, not told, rings the command doorbell.
    let pd: Outcome = Arc::default();
    let check = catch_bugcheck(|| alloc_pd_into(&f, &pd)).expect_err("the doorbell out of D0");
    assert_eq!(check.params[0], verifier::HOST_REGISTER_ACCESS_OUT_OF_D0);
    assert_eq!(
        check.params[2],
        irpverbs_model::protocol::REG_CMD_DOORBELL as u64
    );
    // Back in D0, the lost doorbell rung again (slot 0, the only one
    // filled): the command completes.
    dev.platform().set_device_power(true);
    bar.write32(irpverbs_model::protocol::REG_CMD_DOORBELL, 1)
        .unwrap();
    wait_for("the command completes", || pd.lock().unwrap().is_some());
    assert_eq!(*pd.lock().unwrap(), Some(STATUS_SUCCESS));
    drop(bar);
    drop(f);
    dev.quiesce(Duration::from_secs(10)).unwrap();
    dev.unload();
}

/// Out of D0 a device does no DMA and raises no message: the IOMMU model
/// stops one (0xE6, a host-defined fault type naming the power state).
#[test]
fn model_a_dma_out_of_d0_is_a_dma_violation() {
    let dev = model_device();
    dev.d0_exit();
    let mut buf = [0u8; 8];
    let check = catch_bugcheck(|| dev.platform().dma_read(0x1000, &mut buf))
        .expect_err("a DMA read out of D0");
    assert_eq!(check.code, codes::DRIVER_VERIFIER_DMA_VIOLATION, "{check}");
    assert_eq!(check.params[0], dma::IOMMU_VIOLATION);
    assert_eq!(check.params[3], dma::FAULT_POWERED_DOWN);
    let check = catch_bugcheck(|| dev.platform().dma_write(0x1000, &buf))
        .expect_err("a DMA write out of D0");
    assert_eq!(check.params[3], dma::FAULT_POWERED_DOWN);
    let check = catch_bugcheck(|| {
        dev.platform().raise_msix(0);
    })
    .expect_err("a message out of D0");
    assert_eq!(check.params[3], dma::FAULT_POWERED_DOWN);
    dev.d0_entry().unwrap();
    dev.quiesce(Duration::from_secs(10)).unwrap();
    dev.unload();
}
