//! Tests of the platform as a whole: every verifier check fires with its
//! code and parameter 1, the emulation works, and with the verifier off the
//! same misuse goes unreported.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::Duration;

use irpverbs_abi::{NtStatus, STATUS_CANCELLED, STATUS_INSUFFICIENT_RESOURCES, STATUS_SUCCESS};
use irpverbs_core::platform::{
    APC_LEVEL, DEVICE_LEVEL, DEVICE_LOCK, DISPATCH_LEVEL, EQ_LOCK, HCA_LOCK, MajorFunction,
    PASSIVE_LEVEL, Platform, Request, RequestorMode, SpinLock, pool_tag,
};

use super::*;

type Log = Arc<Mutex<Vec<(NtStatus, usize, Vec<u8>)>>>;

fn verified() -> HostPlatform {
    HostPlatform::default()
}

fn unverified() -> HostPlatform {
    HostPlatform::new(HostConfig {
        verifier: VerifierConfig {
            enabled: false,
            fail_pool: None,
            ..VerifierConfig::default()
        },
        clock: TimerClock::Real,
    })
}

fn virtual_clock() -> HostPlatform {
    HostPlatform::new(HostConfig {
        clock: TimerClock::Virtual,
        ..HostConfig::default()
    })
}

fn params(file: FileKey, input: &[u8], output_len: usize) -> RequestParams {
    RequestParams {
        ioctl_code: 0x0022_2000,
        major_function: MajorFunction::DeviceControl,
        requestor_mode: RequestorMode::User,
        file,
        process: HOST_PROCESS,
        input: input.to_vec(),
        output_len,
    }
}

fn request(
    p: &HostPlatform,
    file: FileKey,
    output_len: usize,
    cancel: Option<CancelRoutine>,
) -> (HostRequest, Log) {
    let log: Log = Arc::default();
    let l = Arc::clone(&log);
    let req = p.new_request(
        params(file, b"in", output_len),
        move |status, info, out| l.lock().unwrap().push((status, info, out.to_vec())),
        cancel,
    );
    (req, log)
}

#[track_caller]
fn expect(check: Result<impl std::fmt::Debug, BugCheck>, code: u32, param1: u64) -> BugCheck {
    let b = check.expect_err("expected a bugcheck");
    assert_eq!((b.code, b.params[0]), (code, param1), "{b}");
    b
}

const TAG: u32 = pool_tag(b"IvTs");

// ---- IRQL and DPCs ----------------------------------------------------------

#[test]
fn raise_to_a_lower_irql_bugchecks() {
    let p = verified();
    let old = p.raise_irql(DISPATCH_LEVEL);
    let b = expect(
        catch_bugcheck(|| p.raise_irql(APC_LEVEL)),
        codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
        verifier::RAISE_IRQL_INVALID,
    );
    assert_eq!(b.params, [0x30, 2, 1, 0]);
    p.lower_irql(old);
}

#[test]
fn lower_to_a_higher_irql_bugchecks() {
    let p = verified();
    let b = expect(
        catch_bugcheck(|| p.lower_irql(DISPATCH_LEVEL)),
        codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
        verifier::LOWER_IRQL_INVALID,
    );
    assert_eq!(b.params, [0x31, 0, 2, 0]);
    assert_eq!(current_irql(), PASSIVE_LEVEL);
}

#[test]
fn lowering_below_dispatch_inside_a_dpc_bugchecks() {
    let p = verified();
    let p2 = p.clone();
    let dpc = p.new_dpc(move || p2.lower_irql(PASSIVE_LEVEL));
    let b = expect(
        catch_bugcheck(|| dpc.insert()),
        codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
        verifier::LOWER_IRQL_INVALID,
    );
    assert_eq!(b.params[3], 1, "in a DPC");
    assert_eq!(current_irql(), PASSIVE_LEVEL);
}

#[test]
fn dpc_returning_at_another_irql_bugchecks() {
    let p = verified();
    let p2 = p.clone();
    let dpc = p.new_dpc(move || {
        p2.raise_irql(DEVICE_LEVEL);
    });
    let b = expect(
        catch_bugcheck(|| dpc.insert()),
        codes::WDF_VIOLATION,
        wdf::VERIFIER_IRQL_MISMATCH,
    );
    assert_eq!(b.params[1..3], [2, 3]);
}

#[test]
fn dpc_runs_when_irql_drops_not_before() {
    let p = verified();
    let ran = Arc::new(AtomicUsize::new(0));
    let at = Arc::new(AtomicU8::new(0xFF));
    let dpc = {
        let (ran, at) = (Arc::clone(&ran), Arc::clone(&at));
        p.new_dpc(move || {
            at.store(current_irql(), Ordering::SeqCst);
            ran.fetch_add(1, Ordering::SeqCst);
        })
    };
    // Queued from a dispatch-level callback: runs as the callback returns.
    p.run_at_dispatch(|| {
        assert!(dpc.insert());
        assert!(!dpc.insert(), "already queued");
        assert_eq!(ran.load(Ordering::SeqCst), 0);
    });
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    assert_eq!(at.load(Ordering::SeqCst), DISPATCH_LEVEL);

    // Still pending at DEVICE_LEVEL and back at DISPATCH_LEVEL.
    let old = p.raise_irql(DISPATCH_LEVEL);
    dpc.insert();
    p.raise_irql(DEVICE_LEVEL);
    p.lower_irql(DISPATCH_LEVEL);
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    p.lower_irql(old);
    assert_eq!(ran.load(Ordering::SeqCst), 2);

    // Below DISPATCH_LEVEL: at once.
    assert!(dpc.insert());
    assert_eq!(ran.load(Ordering::SeqCst), 3);
    assert_eq!(current_irql(), PASSIVE_LEVEL);
}

#[test]
fn interrupt_runs_at_device_level_and_its_dpc_after() {
    let p = verified();
    let ran = Arc::new(AtomicBool::new(false));
    let dpc = {
        let ran = Arc::clone(&ran);
        p.new_dpc(move || ran.store(true, Ordering::SeqCst))
    };
    // Interrupting a dispatch-level callback: the DPC waits for it.
    p.run_at_dispatch(|| {
        let irql = p.interrupt(|| {
            dpc.insert();
            current_irql()
        });
        assert_eq!(irql, DEVICE_LEVEL);
        assert!(!ran.load(Ordering::SeqCst));
    });
    assert!(ran.load(Ordering::SeqCst));
    // Interrupting a passive thread: runs on the way down.
    ran.store(false, Ordering::SeqCst);
    p.interrupt(|| {
        dpc.insert();
    });
    assert!(ran.load(Ordering::SeqCst));
}

#[test]
fn isr_returning_at_another_irql_bugchecks() {
    let p = verified();
    expect(
        catch_bugcheck(|| p.interrupt(|| p.lower_irql(DISPATCH_LEVEL))),
        codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
        verifier::ISR_CHANGED_IRQL,
    );
}

#[test]
fn callback_returning_at_another_irql_bugchecks() {
    let p = verified();
    let l = p.new_raw_lock(&DEVICE_LOCK);
    expect(
        catch_bugcheck(|| p.run_at_dispatch(|| p.raise_irql(DEVICE_LEVEL))),
        codes::WDF_VIOLATION,
        wdf::VERIFIER_IRQL_MISMATCH,
    );
    // A lock acquired (and kept) at DISPATCH_LEVEL doesn't change IRQL.
    p.run_at_dispatch(|| {
        let old = l.acquire();
        l.release(old);
    });
}

// ---- waits and paged code -----------------------------------------------------

#[test]
fn wait_at_dispatch_bugchecks() {
    let p = verified();
    let e = p.new_event(EventKind::Notification, false);
    let b = expect(
        catch_bugcheck(|| p.run_at_dispatch(|| e.wait(None))),
        codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
        verifier::WAIT_AT_DISPATCH_INFINITE,
    );
    assert_eq!(b.params[1], 2);
    expect(
        catch_bugcheck(|| p.run_at_dispatch(|| e.wait(Some(Duration::from_millis(1))))),
        codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
        verifier::WAIT_AT_DISPATCH_NONZERO,
    );
    expect(
        catch_bugcheck(|| p.interrupt(|| e.wait(Some(Duration::ZERO)))),
        codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
        verifier::WAIT_ABOVE_DISPATCH,
    );
    // A zero-timeout poll at DISPATCH_LEVEL is allowed.
    assert!(!p.run_at_dispatch(|| e.wait(Some(Duration::ZERO))));
    assert_eq!(current_irql(), PASSIVE_LEVEL);
}

#[test]
fn paged_code_at_dispatch_bugchecks() {
    let p = verified();
    p.paged_code();
    p.raise_irql(APC_LEVEL);
    p.paged_code();
    p.lower_irql(PASSIVE_LEVEL);
    let b = expect(
        catch_bugcheck(|| p.run_at_dispatch(|| p.paged_code())),
        codes::DRIVER_IRQL_NOT_LESS_OR_EQUAL,
        0,
    );
    assert_eq!(b.params[1..3], [2, 8]);
}

/// A callback into a kernel ULP whose contract is DISPATCH_LEVEL (a CEP
/// callback) called at another IRQL bugchecks 0xC4/0xE5, with the IRQLs.
#[test]
fn a_callback_at_the_wrong_irql_bugchecks() {
    let p = verified();
    assert!(p.run_at_dispatch(|| {
        irql::check_callback_irql(true, DISPATCH_LEVEL, "a callback");
        true
    }));
    let b = expect(
        catch_bugcheck(|| irql::check_callback_irql(true, DISPATCH_LEVEL, "a callback")),
        codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
        verifier::API_AT_WRONG_IRQL,
    );
    assert_eq!(
        b.params[1..3],
        [u64::from(PASSIVE_LEVEL), u64::from(DISPATCH_LEVEL)]
    );
    // Without the verifier, no check.
    irql::check_callback_irql(false, DISPATCH_LEVEL, "a callback");
}

#[test]
fn set_event_above_dispatch_bugchecks() {
    let p = verified();
    let e = p.new_event(EventKind::Synchronization, false);
    expect(
        catch_bugcheck(|| p.interrupt(|| e.set())),
        codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
        verifier::SET_EVENT_ABOVE_DISPATCH,
    );
    assert!(!p.run_at_dispatch(|| e.set()));
}

// ---- spin locks ----------------------------------------------------------------

#[test]
fn spin_lock_released_at_the_wrong_irql_bugchecks() {
    let p = verified();
    let l = p.new_raw_lock(&DEVICE_LOCK);
    let b = expect(
        catch_bugcheck(|| {
            let old = l.acquire();
            p.raise_irql(DEVICE_LEVEL);
            l.release(old);
        }),
        codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
        verifier::SPIN_LOCK_RELEASE_NOT_DISPATCH,
    );
    assert_eq!(b.params[1..3], [DEVICE_LEVEL.into(), l.id()]);

    let l = p.new_raw_lock(&DEVICE_LOCK);
    let b = expect(
        catch_bugcheck(|| {
            let _old = l.acquire();
            l.release(DEVICE_LEVEL);
        }),
        codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
        verifier::LOWER_IRQL_INVALID,
    );
    assert_eq!(b.params[2], DEVICE_LEVEL.into());
}

#[test]
fn lock_order_violation_bugchecks() {
    let p = verified();
    let dev = p.new_lock(&DEVICE_LOCK, ());
    let hca = p.new_lock(&HCA_LOCK, ());
    let eq = p.new_lock(&EQ_LOCK, ());
    dev.lock(|()| hca.lock(|()| eq.lock(|()| ())));
    let b = expect(
        catch_bugcheck(|| hca.lock(|()| dev.lock(|()| ()))),
        codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
        verifier::DEADLOCK_HIERARCHY,
    );
    assert_eq!(b.params[1..3], [dev.id(), hca.id()]);
    // Two locks of one class can't nest either.
    let hca2 = p.new_lock(&HCA_LOCK, ());
    expect(
        catch_bugcheck(|| hca.lock(|()| hca2.lock(|()| ()))),
        codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
        verifier::DEADLOCK_HIERARCHY,
    );
    // Nothing is left held.
    hca.lock(|()| ());
    dev.lock(|()| ());
    assert_eq!(current_irql(), PASSIVE_LEVEL);
}

#[test]
fn recursive_acquire_bugchecks() {
    let p = verified();
    let l = p.new_lock(&DEVICE_LOCK, 1u32);
    let b = expect(
        catch_bugcheck(|| l.lock(|_| l.lock(|_| ()))),
        codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
        verifier::DEADLOCK_SELF,
    );
    assert_eq!(b.params[1], l.id());
    assert_eq!(l.lock(|v| *v), 1);
}

#[test]
fn spin_lock_released_by_another_thread_bugchecks() {
    let p = verified();
    let l = Arc::new(p.new_raw_lock(&DEVICE_LOCK));
    let old = l.acquire();
    let l2 = Arc::clone(&l);
    let b = thread::spawn(move || catch_bugcheck(|| l2.release(PASSIVE_LEVEL)))
        .join()
        .unwrap();
    expect(
        b,
        codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
        verifier::DEADLOCK_WRONG_THREAD,
    );
    l.release(old);
}

// ---- pool ------------------------------------------------------------------------

#[test]
fn pool_leak_at_unload_bugchecks() {
    let p = verified();
    let a = p.pool_charge(TAG, 100).unwrap();
    let _b = p.pool_charge(TAG, 28).unwrap();
    let _c = p.pool_charge(pool_tag(b"IvXx"), 2).unwrap();
    p.pool_release(a);
    let stats = p.pool_stats();
    assert_eq!((stats.live, stats.live_bytes), (2, 30));
    let b = expect(
        catch_bugcheck(|| p.unload()),
        codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
        verifier::POOL_LEAK_AT_UNLOAD,
    );
    assert_eq!(b.params[2..], [30, 2]);
    assert!(
        b.reason.contains("IvTs") && b.reason.contains("IvXx"),
        "{b}"
    );
}

#[test]
fn pool_misuse_bugchecks() {
    let p = verified();
    expect(
        catch_bugcheck(|| p.pool_charge(TAG, 0)),
        codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
        verifier::ZERO_BYTE_ALLOCATION,
    );
    expect(
        catch_bugcheck(|| p.interrupt(|| p.pool_charge(TAG, 8))),
        codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
        verifier::ALLOCATE_ABOVE_DISPATCH,
    );
    expect(
        catch_bugcheck(|| p.pool_charge(0, 8)),
        codes::BAD_POOL_CALLER,
        bad_pool::ZERO_TAG,
    );
    let c = p.run_at_dispatch(|| p.pool_charge(TAG, 8)).unwrap();
    let forged = |tag, bytes| PoolCharge {
        tag,
        bytes,
        id: c.id,
    };
    let (copy, stale) = (forged(c.tag, c.bytes), forged(c.tag, c.bytes));
    expect(
        catch_bugcheck(|| p.pool_release(forged(pool_tag(b"Oops"), c.bytes))),
        codes::BAD_POOL_CALLER,
        bad_pool::FREE_WRONG_TAG,
    );
    expect(
        catch_bugcheck(|| p.pool_release(forged(c.tag, 9))),
        codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
        verifier::FREE_WRONG_SIZE,
    );
    p.run_at_dispatch(|| p.pool_release(copy));
    let b = expect(
        catch_bugcheck(|| p.pool_release(stale)),
        codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
        verifier::DOUBLE_FREE,
    );
    assert_eq!(b.params[2], c.id);
    expect(
        catch_bugcheck(|| {
            p.pool_release(PoolCharge {
                tag: TAG,
                bytes: 8,
                id: 1 << 40,
            });
        }),
        codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
        verifier::FREE_BAD_ADDRESS,
    );
    p.unload();
}

fn failure_pattern(seed: u64) -> Vec<bool> {
    let p = HostPlatform::new(HostConfig {
        verifier: VerifierConfig {
            enabled: true,
            fail_pool: Some(FaultInjection { seed, one_in: 4 }),
            ..VerifierConfig::default()
        },
        clock: TimerClock::Virtual,
    });
    let pattern: Vec<bool> = (0..256)
        .map(|_| match p.pool_charge(TAG, 16) {
            Ok(charge) => {
                p.pool_release(charge);
                false
            }
            Err(status) => {
                assert_eq!(status, STATUS_INSUFFICIENT_RESOURCES);
                true
            }
        })
        .collect();
    let failures = pattern.iter().filter(|&&f| f).count();
    assert_eq!(p.pool_stats().injected_failures, failures as u64);
    p.unload();
    pattern
}

#[test]
fn seeded_pool_failures_replay_from_the_seed() {
    let a = failure_pattern(0x5EED);
    assert_eq!(a, failure_pattern(0x5EED), "same seed, same failures");
    assert_ne!(a, failure_pattern(0x5EEE), "another seed, other failures");
    let failures = a.iter().filter(|&&f| f).count();
    assert!((32..=96).contains(&failures), "about 1 in 4: {failures}");
}

// ---- requests ------------------------------------------------------------------

#[test]
fn request_buffers_and_completion() {
    let p = verified();
    let (mut req, log) = request(&p, 1, 6, None);
    assert_eq!(req.input(), b"in");
    assert_eq!(req.output().len(), 6);
    assert_eq!(req.ioctl_code(), 0x0022_2000);
    assert_eq!(req.file(), 1);
    assert_eq!(p.outstanding_requests(1), 1);
    req.output()[..3].copy_from_slice(b"out");
    p.run_at_dispatch(|| req.complete(STATUS_SUCCESS, 3));
    assert_eq!(*log.lock().unwrap(), [(STATUS_SUCCESS, 3, b"out".to_vec())]);
    assert_eq!(p.outstanding_requests(1), 0);
    // Input longer than output.
    let (req, _) = {
        let log: Log = Arc::default();
        let req = p.new_request(params(2, b"a long input", 2), |_, _, _| (), None);
        (req, log)
    };
    assert_eq!(req.input(), b"a long input");
    req.complete(STATUS_SUCCESS, 0);
    p.unload();
}

#[test]
fn double_completion_bugchecks() {
    let p = verified();
    let (req, log) = request(&p, 1, 8, None);
    let handle = req.handle();
    p.run_at_dispatch(|| req.complete(STATUS_SUCCESS, 0));
    let b = expect(
        catch_bugcheck(|| handle.complete(STATUS_SUCCESS, 0)),
        codes::MULTIPLE_IRP_COMPLETE_REQUESTS,
        handle.id(),
    );
    assert_eq!(b.name, "MULTIPLE_IRP_COMPLETE_REQUESTS");
    assert_eq!(log.lock().unwrap().len(), 1);
}

#[test]
fn completing_a_cancelable_request_bugchecks() {
    let p = verified();
    let (mut req, log) = request(&p, 1, 8, Some(Arc::new(|_| ())));
    let id = req.id();
    req.mark_cancelable(5).unwrap();
    let b = expect(
        catch_bugcheck(move || req.complete(STATUS_SUCCESS, 0)),
        codes::DRIVER_VERIFIER_IOMANAGER_VIOLATION,
        iomanager::COMPLETE_WITH_CANCEL_ROUTINE,
    );
    assert_ne!(b.params[1], 0, "the cancel routine");
    assert_eq!(b.params[2], id);
    assert!(log.lock().unwrap().is_empty());
}

#[test]
fn completing_a_request_its_cancel_routine_owns_bugchecks() {
    let p = verified();
    let slot: Arc<Mutex<Option<RequestHandle>>> = Arc::default();
    let keys = Arc::new(Mutex::new(Vec::new()));
    let routine: CancelRoutine = {
        let (slot, keys) = (Arc::clone(&slot), Arc::clone(&keys));
        Arc::new(move |key| {
            assert_eq!(current_irql(), DISPATCH_LEVEL);
            keys.lock().unwrap().push(key);
            let handle = slot.lock().unwrap().clone().unwrap();
            handle.complete(STATUS_CANCELLED, 0);
        })
    };
    let (mut req, log) = request(&p, 1, 8, Some(routine));
    let handle = req.handle();
    *slot.lock().unwrap() = Some(req.handle());
    p.run_at_dispatch(|| req.mark_cancelable(42)).unwrap();
    assert!(handle.cancel());
    assert_eq!(*keys.lock().unwrap(), [42]);
    assert!(handle.is_completed());
    // The driver's own path is told it doesn't own the request...
    assert_eq!(req.unmark_cancelable(), Err(STATUS_CANCELLED));
    // ...and completing it anyway is a second completion.
    expect(
        catch_bugcheck(move || req.complete(STATUS_SUCCESS, 0)),
        codes::MULTIPLE_IRP_COMPLETE_REQUESTS,
        handle.id(),
    );
    assert_eq!(*log.lock().unwrap(), [(STATUS_CANCELLED, 0, vec![])]);
}

#[test]
fn cancel_before_mark_is_remembered() {
    let p = verified();
    let (mut req, log) = request(&p, 1, 8, Some(Arc::new(|_| panic!("not called"))));
    assert!(req.handle().cancel());
    assert!(req.is_cancel_requested());
    assert_eq!(req.mark_cancelable(1), Err(STATUS_CANCELLED));
    req.complete(STATUS_CANCELLED, 0);
    assert_eq!(log.lock().unwrap()[0].0, STATUS_CANCELLED);
    p.unload();
}

#[test]
fn mark_and_unmark_misuse_bugchecks() {
    let p = verified();
    let (mut req, _) = request(&p, 1, 8, None);
    let b = expect(
        catch_bugcheck(|| req.unmark_cancelable()),
        codes::WDF_VIOLATION,
        wdf::REQUEST_FATAL_ERROR,
    );
    assert_eq!(b.params[1], wdf::HOST_UNMARK_NOT_CANCELABLE);
    req.mark_cancelable(1).unwrap();
    let b = expect(
        catch_bugcheck(|| req.mark_cancelable(2)),
        codes::WDF_VIOLATION,
        wdf::REQUEST_FATAL_ERROR,
    );
    assert_eq!(b.params[1], wdf::HOST_MARK_CANCELABLE_TWICE);
    req.unmark_cancelable().unwrap();
    req.complete(STATUS_SUCCESS, 0);
}

#[test]
fn information_beyond_the_output_buffer_bugchecks() {
    let p = verified();
    let (req, _) = request(&p, 1, 4, None);
    let handle = req.handle();
    let b = expect(
        catch_bugcheck(move || req.complete(STATUS_SUCCESS, 5)),
        codes::WDF_VIOLATION,
        wdf::REQUEST_FATAL_ERROR,
    );
    assert_eq!(
        b.params[1..],
        [wdf::INFORMATION_LENGTH_MISMATCH, handle.id(), 5]
    );
    // An error status may report more (it is clamped).
    let (req, log) = request(&p, 1, 4, None);
    req.complete(STATUS_INSUFFICIENT_RESOURCES, 9);
    assert_eq!(log.lock().unwrap()[0].1, 4);
}

#[test]
fn completing_above_dispatch_bugchecks() {
    let p = verified();
    let (req, _) = request(&p, 1, 4, None);
    expect(
        catch_bugcheck(move || p.interrupt(|| req.complete(STATUS_SUCCESS, 0))),
        codes::DRIVER_VERIFIER_IOMANAGER_VIOLATION,
        iomanager::COMPLETE_ABOVE_DISPATCH,
    );
}

/// A cancel racing the driver's completion, many times: exactly one
/// completion each time, whoever wins.
#[test]
fn cancel_racing_completion_completes_exactly_once() {
    const ROUNDS: usize = 2000;
    let p = verified();
    let by_driver = Arc::new(AtomicUsize::new(0));
    let by_cancel = Arc::new(AtomicUsize::new(0));
    for round in 0..ROUNDS {
        // The driver parks the cancelable request in a table under a spin
        // lock; its cancel routine looks it up by key.
        let table: Arc<HostSpinLock<Option<HostRequest>>> =
            Arc::new(p.new_lock(&DEVICE_LOCK, None));
        let routine: CancelRoutine = {
            let table = Arc::clone(&table);
            Arc::new(move |_key| {
                if let Some(req) = table.lock(Option::take) {
                    req.complete(STATUS_CANCELLED, 0);
                }
            })
        };
        let completions = Arc::new(AtomicUsize::new(0));
        let req = {
            let (completions, by_driver, by_cancel) = (
                Arc::clone(&completions),
                Arc::clone(&by_driver),
                Arc::clone(&by_cancel),
            );
            p.new_request(
                params(7, b"", 0),
                move |status, _, _| {
                    completions.fetch_add(1, Ordering::SeqCst);
                    let which = if status == STATUS_SUCCESS {
                        &by_driver
                    } else {
                        &by_cancel
                    };
                    which.fetch_add(1, Ordering::SeqCst);
                },
                Some(routine),
            )
        };
        let handle = req.handle();
        p.run_at_dispatch(|| {
            let mut req = req;
            match req.mark_cancelable(round as u64) {
                Ok(()) => table.lock(|slot| *slot = Some(req)),
                Err(_) => req.complete(STATUS_CANCELLED, 0),
            }
        });
        let barrier = Arc::new(Barrier::new(2));
        let canceller = {
            let (barrier, handle) = (Arc::clone(&barrier), handle.clone());
            thread::spawn(move || {
                barrier.wait();
                handle.cancel();
            })
        };
        barrier.wait();
        // The driver's completion path: unmark under the table lock, take
        // the request only if that worked.
        let mine = p.run_at_dispatch(|| {
            table.lock(|slot| match slot.as_mut().map(Request::unmark_cancelable) {
                Some(Ok(())) => slot.take(),
                _ => None,
            })
        });
        if let Some(req) = mine {
            p.run_at_dispatch(|| req.complete(STATUS_SUCCESS, 0));
        }
        canceller.join().unwrap();
        assert_eq!(completions.load(Ordering::SeqCst), 1, "round {round}");
        assert!(handle.is_completed());
    }
    assert_eq!(
        by_driver.load(Ordering::SeqCst) + by_cancel.load(Ordering::SeqCst),
        ROUNDS
    );
    assert_eq!(p.outstanding_requests(7), 0);
    p.unload();
}

// ---- files and unload -------------------------------------------------------------

#[test]
fn request_held_at_file_close_bugchecks() {
    let p = verified();
    p.file_opened(3);
    p.file_opened(4);
    let (req, _) = request(&p, 3, 0, None);
    let (other, _) = request(&p, 4, 0, None);
    other.complete(STATUS_SUCCESS, 0);
    p.file_closing(4);
    let b = expect(
        catch_bugcheck(|| p.file_closing(3)),
        codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
        verifier::CANCELLED_IRP_NOT_COMPLETED,
    );
    assert_eq!((b.params[1], b.params[3]), (req.id(), 3));
    req.complete(STATUS_CANCELLED, 0);
    p.file_closing(3);
    assert_eq!(p.open_files(), 0);
    p.unload();
}

#[test]
fn request_outstanding_at_unload_bugchecks() {
    let p = verified();
    let (req, _) = request(&p, 1, 0, None);
    let b = expect(
        catch_bugcheck(|| p.unload()),
        codes::DRIVER_UNLOADED_WITHOUT_CANCELLING_PENDING_OPERATIONS,
        req.id(),
    );
    assert_eq!(b.params[3], 1);
}

#[test]
fn timer_armed_at_unload_bugchecks() {
    let p = virtual_clock();
    let t = p.new_timer(|| ());
    t.set(Duration::from_secs(1), None);
    let b = expect(
        catch_bugcheck(|| p.unload()),
        codes::TIMER_OR_DPC_INVALID,
        0,
    );
    assert_eq!(b.params[1], t.id());
    t.cancel();
    p.unload();
}

#[test]
fn work_pending_at_unload_bugchecks() {
    let p = verified();
    let gate = p.new_event(EventKind::Notification, false);
    let item = {
        let gate = gate.clone();
        p.new_work_item(move || {
            gate.wait(None);
        })
    };
    item.enqueue();
    let b = expect(
        catch_bugcheck(|| p.unload()),
        codes::DRIVER_UNLOADED_WITHOUT_CANCELLING_PENDING_OPERATIONS,
        item.id(),
    );
    assert_eq!(b.params[3], 1);
    gate.set();
    p.flush_work();
    p.unload();
}

#[test]
fn clean_unload_passes() {
    let p = verified();
    p.file_opened(1);
    let c = p.pool_charge(TAG, 64).unwrap();
    let (req, _) = request(&p, 1, 0, None);
    req.complete(STATUS_SUCCESS, 0);
    p.pool_release(c);
    p.file_closing(1);
    p.unload();
}

// ---- timers and work items ---------------------------------------------------------

#[test]
fn timer_fires_on_the_timer_thread_at_dispatch() {
    let p = verified();
    let fired = p.new_event(EventKind::Notification, false);
    let at = Arc::new(AtomicU8::new(0xFF));
    let name = Arc::new(Mutex::new(String::new()));
    let t = {
        let (fired, at, name) = (fired.clone(), Arc::clone(&at), Arc::clone(&name));
        p.new_timer(move || {
            at.store(current_irql(), Ordering::SeqCst);
            *name.lock().unwrap() = thread::current().name().unwrap_or("").to_owned();
            fired.set();
        })
    };
    assert!(!t.set(Duration::from_millis(5), None));
    assert!(fired.wait(Some(Duration::from_secs(10))), "timer fired");
    assert_eq!(at.load(Ordering::SeqCst), DISPATCH_LEVEL);
    assert_eq!(*name.lock().unwrap(), "irpverbs-timer");
    assert!(!t.is_armed(), "one-shot disarms");
    assert!(!t.cancel());
    p.unload();
}

/// The timer thread, asleep until a far deadline (or with none), is woken
/// by a timer set to fire sooner: the near timer fires long before the far
/// one (a later one does not wake it, and need not).
#[test]
fn a_nearer_timer_wakes_the_sleeping_timer_thread() {
    let p = verified();
    let far_fired = p.new_event(EventKind::Notification, false);
    let near_fired = p.new_event(EventKind::Notification, false);
    let far = {
        let e = far_fired.clone();
        p.new_timer(move || {
            e.set();
        })
    };
    let near = {
        let e = near_fired.clone();
        p.new_timer(move || {
            e.set();
        })
    };
    far.set(Duration::from_secs(3_600), None);
    // The thread is started and asleep until the far deadline.
    thread::sleep(Duration::from_millis(20));
    near.set(Duration::from_millis(5), None);
    assert!(
        near_fired.wait(Some(Duration::from_secs(60))),
        "the near timer fired"
    );
    assert!(!far_fired.wait(Some(Duration::ZERO)), "the far one did not");
    assert!(far.cancel());
    p.unload();
}

#[test]
fn periodic_timer_repeats_until_cancelled() {
    let p = verified();
    let count = Arc::new(AtomicUsize::new(0));
    let third = p.new_event(EventKind::Notification, false);
    let t = {
        let (count, third) = (Arc::clone(&count), third.clone());
        p.new_timer(move || {
            if count.fetch_add(1, Ordering::SeqCst) + 1 == 3 {
                third.set();
            }
        })
    };
    t.set(Duration::from_millis(1), Some(Duration::from_millis(1)));
    assert!(third.wait(Some(Duration::from_secs(10))));
    assert!(t.cancel());
    assert!(!t.is_armed());
    p.unload();
    assert!(count.load(Ordering::SeqCst) >= 3);
}

#[test]
fn virtual_clock_fires_due_timers_in_order() {
    let p = virtual_clock();
    let log = Arc::new(Mutex::new(Vec::new()));
    let timer = |name: &'static str| {
        let log = Arc::clone(&log);
        p.new_timer(move || {
            assert_eq!(current_irql(), DISPATCH_LEVEL);
            log.lock().unwrap().push(name);
        })
    };
    let a = timer("a");
    let b = timer("b");
    assert!(!a.set(Duration::from_millis(10), None));
    b.set(Duration::from_millis(5), Some(Duration::from_millis(4)));
    p.advance(Duration::from_millis(4));
    assert!(log.lock().unwrap().is_empty());
    p.advance(Duration::from_millis(6));
    assert_eq!(*log.lock().unwrap(), ["b", "b", "a"]);
    assert_eq!(p.now(), Duration::from_millis(10));
    assert!(!a.is_armed());
    assert!(b.is_armed());
    p.advance(Duration::from_millis(3));
    assert_eq!(log.lock().unwrap().len(), 4);
    // Re-setting replaces the schedule.
    assert!(b.set(Duration::from_millis(100), None));
    p.advance(Duration::from_millis(99));
    assert_eq!(log.lock().unwrap().len(), 4);
    // At DISPATCH_LEVEL the DPC waits for IRQL to drop.
    p.run_at_dispatch(|| {
        p.advance(Duration::from_millis(1));
        assert_eq!(log.lock().unwrap().len(), 4);
    });
    assert_eq!(*log.lock().unwrap(), ["b", "b", "a", "b", "b"]);
    assert!(!b.cancel());
    p.unload();
}

#[test]
fn timer_set_above_dispatch_bugchecks() {
    let p = virtual_clock();
    let t = p.new_timer(|| ());
    expect(
        catch_bugcheck(|| p.interrupt(|| t.set(Duration::ZERO, None))),
        codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
        verifier::API_AT_WRONG_IRQL,
    );
}

#[test]
fn work_items_run_at_passive_on_the_worker() {
    let p = verified();
    let runs = Arc::new(Mutex::new(Vec::new()));
    let item = {
        let runs = Arc::clone(&runs);
        p.new_work_item(move || {
            runs.lock().unwrap().push((
                current_irql(),
                thread::current().name().unwrap_or("").to_owned(),
            ));
        })
    };
    p.run_at_dispatch(|| assert!(item.enqueue()));
    p.flush_work();
    assert!(item.enqueue());
    p.flush_work();
    let once = Arc::new(AtomicBool::new(false));
    let o = Arc::clone(&once);
    p.queue_work(move || o.store(true, Ordering::SeqCst));
    p.flush_work();
    assert!(once.load(Ordering::SeqCst));
    let runs = runs.lock().unwrap();
    assert_eq!(runs.len(), 2);
    assert!(
        runs.iter()
            .all(|(irql, name)| *irql == PASSIVE_LEVEL && name == "irpverbs-worker")
    );
    p.unload();
}

#[test]
fn bugcheck_on_a_host_thread_is_reraised_at_unload() {
    let p = verified();
    let p2 = p.clone();
    p.queue_work(move || {
        let e = p2.new_event(EventKind::Notification, false);
        p2.run_at_dispatch(|| e.wait(None));
    });
    p.flush_work();
    let stored = p.background_bugcheck().expect("recorded");
    assert_eq!(stored.params[0], verifier::WAIT_AT_DISPATCH_INFINITE);
    expect(
        catch_bugcheck(|| p.unload()),
        codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
        verifier::WAIT_AT_DISPATCH_INFINITE,
    );
}

// ---- verifier off ------------------------------------------------------------------

#[test]
fn with_the_verifier_off_misuse_is_not_reported() {
    let p = unverified();
    assert!(!p.verifier_enabled());
    let ok = |what: &str, f: &dyn Fn()| {
        if let Err(b) = catch_bugcheck(f) {
            panic!("{what}: {b}");
        }
        assert_eq!(current_irql(), PASSIVE_LEVEL, "{what}");
    };
    ok("bad raise", &|| {
        p.raise_irql(DISPATCH_LEVEL);
        p.raise_irql(PASSIVE_LEVEL);
    });
    ok("bad lower", &|| {
        p.lower_irql(DISPATCH_LEVEL);
        p.lower_irql(PASSIVE_LEVEL);
    });
    ok("wait at dispatch", &|| {
        let e = p.new_event(EventKind::Notification, true);
        p.run_at_dispatch(|| e.wait(None));
    });
    ok("paged code at dispatch", &|| {
        p.run_at_dispatch(|| p.paged_code())
    });
    ok("lock order", &|| {
        let hca = p.new_lock(&HCA_LOCK, ());
        let dev = p.new_lock(&DEVICE_LOCK, ());
        hca.lock(|()| dev.lock(|()| ()));
    });
    ok("release at the wrong IRQL", &|| {
        let l = p.new_raw_lock(&DEVICE_LOCK);
        let old = l.acquire();
        p.raise_irql(DEVICE_LEVEL);
        l.release(old);
    });
    ok("double completion", &|| {
        let (req, log) = request(&p, 1, 0, None);
        let h = req.handle();
        req.complete(STATUS_SUCCESS, 0);
        h.complete(STATUS_SUCCESS, 0);
        assert_eq!(log.lock().unwrap().len(), 1);
    });
    ok("complete while cancelable", &|| {
        let (mut req, _) = request(&p, 1, 0, Some(Arc::new(|_| ())));
        req.mark_cancelable(1).unwrap();
        req.complete(STATUS_SUCCESS, 0);
    });
    ok("information too long", &|| {
        let (req, log) = request(&p, 1, 2, None);
        req.complete(STATUS_SUCCESS, 9);
        assert_eq!(log.lock().unwrap()[0].1, 2);
    });
    ok("zero-byte and leaked pool", &|| {
        let _leak = p.pool_charge(TAG, 0).unwrap();
    });
    let (held, _) = request(&p, 5, 0, None);
    ok("request held at close", &|| {
        p.file_opened(5);
        p.file_closing(5);
    });
    ok("unload with leaks", &|| p.unload());
    drop(held);
    // Recursive acquisition is not tried: without the verifier it really
    // deadlocks, as on Windows.
}

#[test]
fn verifier_off_keeps_no_tables() {
    let p = unverified();
    let (_req, _) = request(&p, 1, 0, None);
    let _c = p.pool_charge(TAG, 8).unwrap();
    assert_eq!(p.outstanding_requests(1), 0);
    assert_eq!(p.pool_stats().live, 0);
    assert_eq!(p.pool_stats().charges, 1);
}

// ---- user memory: ring mappings and pins ------------------------------------

#[test]
fn ring_mappings_are_made_and_undone_at_passive_level_and_gone_by_close() {
    let p = verified();
    p.file_opened(9);
    let (req, _log) = request(&p, 9, 0, None);
    let ring = irpverbs_ring::Ring::alloc(4, 64).unwrap();
    let (map, mapping) = p.map_ring(&req, &ring).unwrap();
    assert_eq!(
        map,
        ring.map(),
        "one address space: the ring's own addresses"
    );
    // Closing the file (the process's exit, in host mode) with the ring
    // still mapped is 0x76.
    let b = expect(
        catch_bugcheck(|| p.file_closing(9)),
        codes::PROCESS_HAS_LOCKED_PAGES,
        locked_pages::STILL_LOCKED,
    );
    assert_eq!(b.params[1..3], [9, 1]);
    p.unmap_ring(mapping);
    req.complete(STATUS_SUCCESS, 0);
    p.file_closing(9);
    // At DISPATCH_LEVEL a user mapping cannot be made.
    let (req, _log) = request(&p, 9, 0, None);
    let old = p.raise_irql(DISPATCH_LEVEL);
    expect(
        catch_bugcheck(|| p.map_ring(&req, &ring).map(|(m, _)| m)),
        codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
        verifier::API_AT_WRONG_IRQL,
    );
    p.lower_irql(old);
    req.complete(STATUS_SUCCESS, 0);
}

#[test]
fn a_mapping_undone_twice_bugchecks() {
    let p = verified();
    let (req, _log) = request(&p, 3, 0, None);
    let ring = irpverbs_ring::Ring::alloc(4, 64).unwrap();
    let (_, mapping) = p.map_ring(&req, &ring).unwrap();
    let id = mapping.id;
    p.unmap_ring(mapping);
    expect(
        catch_bugcheck(|| p.unmap_ring(HostMapping { id })),
        codes::PROCESS_HAS_LOCKED_PAGES,
        locked_pages::NOT_LOCKED,
    );
    req.complete(STATUS_SUCCESS, 0);
}

/// A process's exit tears its address space down: pages still pinned or
/// a ring still mapped in it are 0x76 (naming the process), and the
/// driver touching it afterwards (unmapping, mapping, pinning) is
/// 0xC4/0x2002. Other processes are not affected.
#[test]
fn an_exited_process_must_hold_nothing_and_is_never_touched_again() {
    let p = verified();
    let a = p.create_process();
    let b = p.create_process();
    assert_ne!(a, b);
    let in_process = |process| {
        p.new_request(
            RequestParams {
                process,
                ..params(4, b"in", 0)
            },
            |_, _, _| {},
            None,
        )
    };
    let req = in_process(a);
    let ring = irpverbs_ring::Ring::alloc(4, 64).unwrap();
    let mut buf = vec![0u8; 64];
    let addr = buf.as_mut_ptr() as u64;
    let pin = p.pin_memory(&req, addr, 64, true, false).unwrap();
    let (_, mapping) = p.map_ring(&req, &ring).unwrap();
    let id = mapping.id;
    assert_eq!((p.process_pinned(a), p.process_mappings(a)), (1, 1));
    assert_eq!((p.process_pinned(b), p.process_mappings(b)), (0, 0));
    let b76 = expect(
        catch_bugcheck(|| p.process_exited(a)),
        codes::PROCESS_HAS_LOCKED_PAGES,
        locked_pages::STILL_LOCKED,
    );
    assert_eq!(b76.params[1..], [a, 1, 3], "pinned");
    drop(pin);
    let b76 = expect(
        catch_bugcheck(|| p.process_exited(a)),
        codes::PROCESS_HAS_LOCKED_PAGES,
        locked_pages::STILL_LOCKED,
    );
    assert_eq!(b76.params[1..], [a, 1, 2], "mapped");
    let touched = expect(
        catch_bugcheck(|| p.unmap_ring(mapping)),
        codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
        verifier::HOST_EXITED_PROCESS_TOUCHED,
    );
    assert_eq!(touched.params[1..], [a, id, 0]);
    for touch in [
        Box::new(|| drop(p.pin_memory(&req, addr, 64, true, false))) as Box<dyn Fn()>,
        Box::new(|| drop(p.map_ring(&req, &ring))),
    ] {
        expect(
            catch_bugcheck(touch),
            codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
            verifier::HOST_EXITED_PROCESS_TOUCHED,
        );
    }
    req.complete(STATUS_SUCCESS, 0);
    // Process b holds nothing: its exit is clean.
    p.process_exited(b);
    drop(buf);
}

#[test]
fn a_user_range_is_pinned_at_passive_level_only() {
    let p = verified();
    let (req, _log) = request(&p, 3, 0, None);
    let mut buf = vec![0u8; 64];
    let addr = buf.as_mut_ptr() as u64;
    let region = p.pin_memory(&req, addr, 64, true, false).unwrap();
    assert_eq!((region.addr(), region.len()), (addr, 64));
    drop(region);
    let old = p.raise_irql(DISPATCH_LEVEL);
    expect(
        catch_bugcheck(|| p.pin_memory(&req, addr, 64, true, false).map(drop)),
        codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
        verifier::API_AT_WRONG_IRQL,
    );
    p.lower_irql(old);
    req.complete(STATUS_SUCCESS, 0);
    drop(buf);
}

/// A kept-result request (a synchronous call): the driver's completion
/// leaves the status and the output bytes (the system buffer, cut to the
/// information value) for the issuer to take once, and the notify runs
/// exactly once; a second completion bugchecks as for any request.
#[test]
fn kept_result_is_taken_once_and_notifies_once() {
    let p = verified();
    let notified = Arc::new(AtomicUsize::new(0));
    let notify: KeptNotify = {
        let notified = Arc::clone(&notified);
        kept_notify(move || {
            notified.fetch_add(1, Ordering::SeqCst);
        })
        .expect("memory")
    };
    let mut req = p.new_request_with(
        params(3, b"abcdef", 8),
        Completion::Keep(notify.clone()),
        None,
    );
    let handle = req.handle();
    assert_eq!(handle.take_result(), None);
    req.output()[..3].copy_from_slice(b"xyz");
    p.run_at_dispatch(|| req.complete(STATUS_SUCCESS, 3));
    assert_eq!(notified.load(Ordering::SeqCst), 1);
    assert_eq!(
        handle.take_result(),
        Some((STATUS_SUCCESS, b"xyz".to_vec()))
    );
    assert_eq!(handle.take_result(), None);
    expect(
        catch_bugcheck(|| p.run_at_dispatch(|| handle.complete(STATUS_SUCCESS, 0))),
        codes::MULTIPLE_IRP_COMPLETE_REQUESTS,
        handle.id(),
    );
    assert_eq!(notified.load(Ordering::SeqCst), 1);

    // Completed through a handle (no system buffer): zeroed output bytes.
    let req = p.new_request_with(params(3, b"", 4), Completion::Keep(notify), None);
    let handle = req.handle();
    p.run_at_dispatch(|| handle.complete(STATUS_CANCELLED, 2));
    assert_eq!(handle.take_result(), Some((STATUS_CANCELLED, vec![0, 0])));
    assert_eq!(notified.load(Ordering::SeqCst), 2);
    drop(req);
}

#[test]
fn the_probe_wants_every_byte_mapped_with_the_access_asked_for() {
    use super::probe::covered;
    let maps = "\
1000-3000 r--p 00000000 00:00 0
3000-5000 rw-p 00000000 00:00 0 [heap]
6000-7000 rw-p 00000000 00:00 0
7000-8000 ---p 00000000 00:00 0
";
    assert!(
        covered(maps, 0x1000, 0x4000, false),
        "two adjacent mappings"
    );
    assert!(
        !covered(maps, 0x1000, 0x4000, true),
        "the first is read-only"
    );
    assert!(covered(maps, 0x3800, 0x1000, true));
    assert!(!covered(maps, 0x4800, 0x1000, false), "a gap at 0x5000");
    assert!(!covered(maps, 0x6800, 0x1000, false), "no access at 0x7000");
    assert!(!covered(maps, 0x8000, 1, false), "past every mapping");
    assert!(!covered(maps, 0x800, 0x1000, false), "before the first");
    assert!(!covered(maps, u64::MAX, 2, false), "wraps");
    assert!(
        !covered(maps, 0x2FFF, 2, true),
        "starts in read-only memory"
    );
}
