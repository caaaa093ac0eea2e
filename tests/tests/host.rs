//! Runs the conformance suite against the host device: the driver in-process
//! over the soft HCA, with the verifier on, firmware inline and on its own
//! thread, and user-mode doorbells as direct calls and (as on Windows)
//! through each file's doorbell page, scanned by the device's doorbell
//! thread. After every test the device must hold nothing of it.
//!
//! Every IOCTL goes through [`TimedFile`], which cancels a request the
//! driver has not completed after [`IOCTL_TIMEOUT`] (as the Windows runner
//! does): a test waiting for an event that never comes fails with
//! `STATUS_CANCELLED` instead of hanging.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use irpverbs_abi::{FILE_READ_ACCESS, FILE_WRITE_ACCESS, NtStatus};
use irpverbs_conformance::{Client, Dut, DutFile, IoctlTransport, SUITE};
use irpverbs_host::{Backend, Engine, HostDevice, HostDeviceConfig, HostFile, UserDoorbells};
use irpverbs_verbs::{Bell, Doorbells, SpeedPath};

/// How long one IOCTL may take before it is cancelled.
const IOCTL_TIMEOUT: Duration = Duration::from_secs(10);

/// A host file whose IOCTLs are cancelled when they take too long.
struct TimedFile(HostFile);

type Slot = Arc<(Mutex<Option<(NtStatus, Vec<u8>)>>, Condvar)>;

fn wait(slot: &Slot, until: Option<Instant>) -> Option<(NtStatus, Vec<u8>)> {
    let (lock, cv) = &**slot;
    let mut g = lock.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        if let Some(r) = g.take() {
            return Some(r);
        }
        match until {
            None => g = cv.wait(g).unwrap_or_else(PoisonError::into_inner),
            Some(t) => {
                let now = Instant::now();
                if now >= t {
                    return None;
                }
                g = cv
                    .wait_timeout(g, t - now)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
        }
    }
}

impl IoctlTransport for TimedFile {
    fn ioctl(&self, code: u32, input: &[u8], output_len: usize) -> (NtStatus, Vec<u8>) {
        let slot: Slot = Arc::default();
        let s = Arc::clone(&slot);
        let sub = self.0.submit(
            self.0.request(code, input, output_len),
            move |st, _, out| {
                let (lock, cv) = &*s;
                *lock.lock().unwrap_or_else(PoisonError::into_inner) = Some((st, out.to_vec()));
                cv.notify_all();
            },
        );
        if let Some(r) = wait(&slot, Some(Instant::now() + IOCTL_TIMEOUT)) {
            return r;
        }
        // CancelIoEx, then the completion (the driver must complete it).
        if let Some(h) = &sub.handle {
            h.cancel();
        }
        wait(&slot, None).expect("a completion")
    }
}

impl Doorbells for TimedFile {
    fn sq(&self, qp: Bell) {
        self.0.sq(qp);
    }
    fn rq(&self, qp: Bell) {
        self.0.rq(qp);
    }
    fn srq(&self, srq: Bell) {
        self.0.srq(srq);
    }
    fn cq_arm(&self, cq: Bell) {
        self.0.cq_arm(cq);
    }
}

// SAFETY: a `TimedFile` owns its `HostFile` (one open of the device, not
// shared): the objects created through it are destroyed or resized only by
// IOCTLs it submits, and run down only when it is dropped.
#[allow(unsafe_code, reason = "the SpeedPath contract, justified above")]
unsafe impl SpeedPath for TimedFile {
    fn doorbells(&self) -> &dyn Doorbells {
        self
    }
}

struct HostDut(Arc<HostDevice>);

impl HostDut {
    fn file(&self) -> Result<TimedFile, NtStatus> {
        Ok(TimedFile(
            self.0.open(FILE_READ_ACCESS | FILE_WRITE_ACCESS)?,
        ))
    }
}

impl Dut for HostDut {
    fn open(&self) -> Result<Box<DutFile>, NtStatus> {
        Ok(Box::new(self.file()?))
    }

    fn open_speed(&self) -> Result<Client, NtStatus> {
        Ok(Client::with_speed_path(Box::new(self.file()?)))
    }

    fn check_quiescent(&self) -> Result<(), String> {
        self.0.quiesce(Duration::from_secs(10))?;
        let pool = self.0.platform().pool_stats();
        if pool.live != 0 {
            return Err(format!("pool still charged: {pool:?}"));
        }
        Ok(())
    }
}

fn run_suite(engine: Engine, user_doorbells: UserDoorbells) {
    run_suite_on(Backend::Soft, engine, user_doorbells);
}

fn run_suite_on(backend: Backend, engine: Engine, user_doorbells: UserDoorbells) {
    let mut failures = Vec::new();
    let start = Instant::now();
    let mut slowest = (Duration::ZERO, "");
    let mut page_doorbells = 0;
    let (mut device_commands, mut messages) = (0, 0);
    for (name, test) in SUITE {
        let t = Instant::now();
        let dev = HostDevice::new(HostDeviceConfig {
            engine,
            user_doorbells,
            backend,
            ..HostDeviceConfig::default()
        })
        .expect("host device");
        let dut = HostDut(Arc::clone(&dev));
        let result = test(&dut).and_then(|()| dut.check_quiescent());
        if let Err(e) = result {
            failures.push(format!("{name}: {e}"));
        }
        page_doorbells += dev.soft().stats().page_doorbells;
        if let Some((hca, silicon)) = dev.model() {
            device_commands += silicon.stats().commands;
            messages += (0..usize::from(hca.event_queues()))
                .map(|eq| hca.interrupts(eq))
                .sum::<u64>();
        }
        dev.unload();
        slowest = slowest.max((t.elapsed(), name));
    }
    println!(
        "{backend:?}, {engine:?}, {user_doorbells:?} doorbells: {} tests in {:?} (slowest {} {:?})",
        SUITE.len(),
        start.elapsed(),
        slowest.1,
        slowest.0
    );
    assert!(
        failures.is_empty(),
        "{} of {} failed:\n{}",
        failures.len(),
        SUITE.len(),
        failures.join("\n")
    );
    // Over the model, the commands went through its command queue and
    // their completions came back on MSI-X messages.
    assert_eq!(
        device_commands > SUITE.len() as u64 && messages > SUITE.len() as u64,
        backend == Backend::Model,
        "{device_commands} commands read by the device, {messages} MSI-X messages"
    );
    println!("{device_commands} commands read by the device, {messages} MSI-X messages");
    // The data-path tests rang their doorbells the way the mode says.
    assert_eq!(
        page_doorbells > 0,
        user_doorbells == UserDoorbells::Page,
        "{page_doorbells} doorbells rung through pages"
    );
}

#[test]
fn conformance_inline_engine() {
    run_suite(Engine::Inline, UserDoorbells::Direct);
}

#[test]
fn conformance_thread_engine() {
    run_suite(Engine::Thread, UserDoorbells::Direct);
}

#[test]
fn conformance_inline_engine_doorbell_page() {
    run_suite(Engine::Inline, UserDoorbells::Page);
}

#[test]
fn conformance_thread_engine_doorbell_page() {
    run_suite(Engine::Thread, UserDoorbells::Page);
}

/// The suite against the model HCA: the mini-driver reaches its device
/// only through the PCI seam (commands in a command queue in host memory,
/// event queues and MSI-X, page lists through the IOMMU model).
#[test]
fn conformance_model_backend() {
    run_suite_on(Backend::Model, Engine::Inline, UserDoorbells::Direct);
}

/// The suite against the model HCA with user-mode doorbells rung through
/// each file's doorbell page.
#[test]
fn conformance_model_backend_doorbell_page() {
    run_suite_on(Backend::Model, Engine::Inline, UserDoorbells::Page);
}
