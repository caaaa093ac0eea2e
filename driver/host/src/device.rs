//! The host device: the driver (`irpverbs-core`) over a soft HCA on the host
//! platform, wired as PnP and the I/O manager wire it on Windows.
//!
//! - The soft HCA's async interrupt (EQ 0: command completions, async
//!   events, MADs) runs an ISR at DEVICE_LEVEL that queues the device's
//!   DPC; the DPC runs [`Device::dpc`] when the processor (the host thread)
//!   drops below DISPATCH_LEVEL.
//! - Each completion vector ([`SoftConfig::num_comp_vectors`]; by default
//!   one per processor, at least 2) has its own interrupt, whose ISR
//!   queues that vector's DPC, targeted to a processor of its own
//!   ([`TargetedDpc`]: a host thread per vector), where it runs
//!   [`Device::comp_dpc`]. Two vectors' DPCs run concurrently, each under
//!   the verifier's DPC checks (IRQL, the DPC watchdog's budget).
//! - [`Engine::Inline`]: the firmware executes a command when its doorbell
//!   is written, on the posting thread (deterministic, fast).
//!   [`Engine::Thread`]: the firmware runs on its own thread, like hardware,
//!   and interrupts that thread's "processor".
//! - [`HostFile::submit`] is `IoCallDriver` for a `DeviceIoControl`: access
//!   check against the file's granted access, a request, the in-caller-context
//!   callback on the caller's thread at PASSIVE_LEVEL
//!   ([`Device::in_caller_context`]), the I/O queue callback at
//!   DISPATCH_LEVEL, and "pended" if the driver did not complete it inside
//!   the callbacks.
//! - Dropping a [`HostFile`] is `CloseHandle`: when it is the file's last
//!   handle, cleanup (with a bounded wait for the user pages its
//!   registrations pinned), then close once the driver has completed every
//!   request of the file (the verifier bugchecks if it still holds one
//!   after [`CLOSE_TIMEOUT`]).
//! - Processes ([`crate::process`]): each handle belongs to a process
//!   (`HOST_PROCESS` unless a test creates another), whose key its
//!   requests carry; a handle can be duplicated into another process, and
//!   a process's exit delivers the driver's process-exit notification,
//!   closes the process's handles and tears its address space down under
//!   the verifier's checks.
//! - The speed path: the rings are the driver's memory in the same process
//!   (`IOCTL_IV_MAP_RINGS` "maps" them at their own addresses, under the
//!   verifier's mapping checks), and the doorbells ([`Doorbells`] for
//!   [`HostDevice`] and [`HostFile`]) call the soft HCA's. A [`HostFile`] is
//!   a [`SpeedPath`] (the typed verbs' `file.into_client()`);
//!   kernel-style callers open a kernel-mode file
//!   ([`HostDevice::open_kernel`]) and get the direct-call table from
//!   [`HostDevice::query_interface`].
//! - [`UserDoorbells::Page`]: user-mode files ring their doorbells the way
//!   they must on Windows, through their doorbell page
//!   (`IOCTL_IV_MAP_DOORBELLS`, mapped when the file is opened), and a
//!   "doorbell thread" runs the soft HCA's doorbell poller
//!   ([`SoftHca::poll_doorbells_step`]) at DISPATCH_LEVEL, sleeping on an
//!   event when the pages are quiet until `IOCTL_IV_RING_DOORBELLS` wakes
//!   it, as irpverbs.sys's system thread does: the same code path,
//!   exercised on any OS. Kernel-mode files keep the direct calls.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use irpverbs_abi::*;
use irpverbs_core::cm::{CepCallback, CepFunction, CepReady};
use irpverbs_core::platform::LockClass;
use irpverbs_core::{
    DISPATCH_LEVEL, Device, DeviceSnapshot, FileKey, Hca, MajorFunction, ProcessKey, RequestorMode,
};
use irpverbs_kernel_table::kernel::{
    CepCalls, CepNotify, IvKernelInterface, SpeedLock, SpeedPlatform,
};
use irpverbs_kernel_table::speed::{Bell, Doorbells, PageDoorbells};
use irpverbs_kernel_table::{IoctlTransport, SpeedPath};
use irpverbs_ring::Shared;
use irpverbs_ring::wq::LockCheck;
use irpverbs_soft::{Datagram, Execution, SoftBus, SoftConfig, SoftHca};
use zerocopy::FromBytes;

use crate::backend::{Backend, HostHca, HostModelHca, HostSilicon, MsixHandler, SiliconBus};
use crate::platform::{
    CancelRoutine, Completion, Dpc, HOST_PROCESS, HostConfig, HostPlatform, KeptNotify,
    RawSpinLock, RequestHandle, RequestParams, TargetedDpc, check_callback_irql, kept_notify,
};
use crate::udp::{Endpoint, UdpConfig, UdpStats, UdpWire};

/// The driver over the host device's HCA ([`Backend`]) on the host
/// platform.
pub type SoftDevice = Device<HostPlatform, HostHca>;

/// How long a closing file waits for the driver to complete its requests
/// before the verifier calls it a hang.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the soft HCA's firmware runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Engine {
    /// On the thread that writes the doorbell.
    #[default]
    Inline,
    /// On its own thread, like hardware.
    Thread,
}

/// How user-mode files ring their queues' doorbells.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UserDoorbells {
    /// Direct calls of the soft HCA's doorbells (one process: the fastest).
    #[default]
    Direct,
    /// Through the file's doorbell page, scanned by the device's doorbell
    /// thread: what a user-mode ULP does on Windows.
    Page,
}

/// How to build a [`HostDevice`].
///
/// Its default is every part's default, but for the soft HCA's completion
/// vectors: one per processor of the host, at least 2
/// ([`irpverbs_soft::default_comp_vectors`]).
#[derive(Clone, Debug)]
pub struct HostDeviceConfig {
    /// The platform (verifier, clock).
    pub platform: HostConfig,
    /// Where the firmware runs.
    pub engine: Engine,
    /// The soft HCA.
    pub soft: SoftConfig,
    /// How user-mode files ring their doorbells.
    pub user_doorbells: UserDoorbells,
    /// With [`UserDoorbells::Page`]: how long the doorbell thread polls
    /// the pages after the last doorbell it found before it sleeps (and
    /// user-mode doorbells cost an `IOCTL_IV_RING_DOORBELLS`). `None`:
    /// [`irpverbs_soft::DEFAULT_POLL_WINDOW_NS`]; zero: it sleeps after
    /// every quiet scan.
    pub doorbell_poll_window: Option<Duration>,
    /// The I/O queue is power-managed (KMDF's default): the framework then
    /// waits, before `EvtDeviceD0Exit`, for every request the driver holds
    /// from it, and the verifier bugchecks 0x9F when the driver holds one
    /// there ([`HostDevice::d0_exit`]). irpverbs.sys's queue is not (the
    /// driver holds event waits indefinitely, and the soft HCA needs no
    /// power for a request to be presented), and neither is the host
    /// device's by default.
    pub power_managed_queue: bool,
    /// How long a closing file waits for the user pages its registrations
    /// pinned to be released ([`CLEANUP_PIN_TIMEOUT`] when `None`), as
    /// irpverbs.sys's `EvtFileCleanup` does.
    pub cleanup_pin_timeout: Option<Duration>,
    /// Deliver no process-exit notification to the driver (as a driver
    /// that never registered `PsSetCreateProcessNotifyRoutineEx` gets
    /// none): what a file that outlives its opener then costs shows in the
    /// verifier's checks (`tests/process.rs`). Off by default.
    pub no_process_notify: bool,
    /// The driver's configuration (its registry parameters on Windows):
    /// the per-file quotas.
    pub device: irpverbs_core::DeviceConfig,
    /// The HCA the driver runs over. With [`Backend::Model`] the soft HCA
    /// ([`Self::soft`]) is the device model's engine, which executes
    /// commands inline in the device's own DPC whatever [`Self::engine`]
    /// says.
    pub backend: Backend,
}

impl Default for HostDeviceConfig {
    fn default() -> Self {
        let processors = std::thread::available_parallelism()
            .map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX));
        Self {
            platform: HostConfig::default(),
            engine: Engine::default(),
            soft: SoftConfig {
                num_comp_vectors: irpverbs_soft::default_comp_vectors(processors),
                ..SoftConfig::default()
            },
            user_doorbells: UserDoorbells::default(),
            doorbell_poll_window: None,
            power_managed_queue: false,
            cleanup_pin_timeout: None,
            no_process_notify: false,
            device: irpverbs_core::DeviceConfig::default(),
            backend: Backend::default(),
        }
    }
}

/// How long a closing file waits, at most, for its user pins (irpverbs.sys
/// waits as long, then logs what is left and lets the process go).
pub const CLEANUP_PIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Access a file was opened with (`GENERIC_READ` / `GENERIC_WRITE`), as
/// `FILE_READ_ACCESS | FILE_WRITE_ACCESS` bits.
pub type GrantedAccess = u32;

struct Bus {
    platform: HostPlatform,
    dpc: OnceLock<Dpc>,
    /// With [`Backend::Model`]: the device model's DPC, which the engine's
    /// interrupts queue (instead of the driver's).
    silicon: OnceLock<Dpc>,
    /// The completion vectors' DPCs, each on a processor of its own.
    comp: OnceLock<Vec<TargetedDpc>>,
    /// The data path's DPC: the rest of a call that used its budget
    /// ([`SoftHca::resume`]).
    resume: OnceLock<Dpc>,
    doorbell: Arc<Doorbell>,
    /// The doorbell thread's event.
    poller: Arc<PollerEvent>,
}

impl SoftBus for Bus {
    fn interrupt(&self) {
        self.platform.interrupt(|| {
            if let Some(dpc) = self.silicon.get().or_else(|| self.dpc.get()) {
                dpc.insert();
            }
        });
    }

    /// The vector's ISR queues its DPC on the vector's processor.
    fn comp_interrupt(&self, vector: u32) {
        self.platform.interrupt(|| {
            if let Some(dpc) = self.silicon.get() {
                dpc.insert();
            } else if let Some(dpc) = self.comp.get().and_then(|c| c.get(vector as usize)) {
                dpc.insert();
            }
        });
    }

    fn doorbell(&self) {
        self.doorbell.ring();
    }

    /// Queues the data path's DPC on this processor: it runs when IRQL
    /// drops below DISPATCH_LEVEL (at once from below it; after the
    /// running DPC, from a DPC), each run a slice of its own for the DPC
    /// watchdog.
    fn resume(&self) {
        if let Some(dpc) = self.resume.get() {
            dpc.insert();
        }
    }

    /// Charged to the DPC watchdog's slice running on this thread.
    fn work(&self, packets: u64) {
        self.platform.dispatch_work(packets);
    }

    fn wake_doorbell_poller(&self) {
        self.poller.set();
    }
}

/// The doorbell thread's event (irpverbs.sys's `KEVENT`, a synchronization
/// event): set by `IOCTL_IV_RING_DOORBELLS`, taken by the thread's wait.
#[derive(Default)]
struct PollerEvent {
    set: Mutex<bool>,
    cv: Condvar,
}

impl PollerEvent {
    /// Sets the event (wakes the waiter, or the next wait returns at once).
    fn set(&self) {
        *self.set.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.cv.notify_one();
    }

    /// Waits until the event is set, and resets it.
    fn wait(&self) {
        let mut set = self.set.lock().unwrap_or_else(PoisonError::into_inner);
        while !*set {
            set = self.cv.wait(set).unwrap_or_else(PoisonError::into_inner);
        }
        *set = false;
    }
}

/// The firmware thread's doorbell ([`Engine::Thread`]): like an HCA's
/// processor, the thread polls for doorbells for a while after its last
/// work ([`ENGINE_SPIN`]), then sleeps until one rings. A ring while it
/// polls is one atomic exchange and one load (no lock, no system call);
/// only a ring that finds it asleep takes the lock and wakes it.
#[derive(Default)]
struct Doorbell {
    rung: AtomicBool,
    /// The thread is (about to be) blocked on `cv`.
    sleeping: AtomicBool,
    lock: Mutex<()>,
    cv: Condvar,
    stop: AtomicBool,
}

/// How long the firmware thread polls for a doorbell after its last work
/// before it sleeps.
pub const ENGINE_SPIN: Duration = Duration::from_micros(50);

impl Doorbell {
    fn ring(&self) {
        // Sequentially consistent with the sleeper's store of `sleeping`
        // and load of `rung`: either it sees this ring, or this sees it
        // asleep (and wakes it under the lock it holds until it waits).
        if self.rung.swap(true, Ordering::SeqCst) {
            return;
        }
        if self.sleeping.load(Ordering::SeqCst) {
            let _g = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
            self.cv.notify_one();
        }
    }

    /// Waits for a ring (or stop), polling for [`ENGINE_SPIN`] first;
    /// false when stopping.
    fn wait(&self) -> bool {
        let start = Instant::now();
        let mut polls = 0u32;
        loop {
            if self.rung.swap(false, Ordering::SeqCst) {
                return !self.stop.load(Ordering::Acquire);
            }
            if self.stop.load(Ordering::Acquire) {
                return false;
            }
            polls += 1;
            if polls % 64 == 0 && start.elapsed() >= ENGINE_SPIN {
                break;
            }
            // Polling, it leaves the processor to any thread that wants it
            // (a ULP on the same processor that this HCA must answer).
            std::thread::yield_now();
        }
        let mut g = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        self.sleeping.store(true, Ordering::SeqCst);
        while !self.rung.swap(false, Ordering::SeqCst) && !self.stop.load(Ordering::Acquire) {
            g = self.cv.wait(g).unwrap_or_else(PoisonError::into_inner);
        }
        self.sleeping.store(false, Ordering::SeqCst);
        drop(g);
        !self.stop.load(Ordering::Acquire)
    }
}

/// Wakes threads waiting for a completion. A completion with nobody
/// waiting costs one atomic load (no lock, no futex system call).
#[derive(Default)]
struct Completions {
    waiters: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Completions {
    /// Called after a completion's result is published.
    fn notify(&self) {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            let _g = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
            self.cv.notify_all();
        }
    }

    /// Waits until `done()` or the deadline; true if `done()`.
    fn wait_until(&self, deadline: Instant, mut done: impl FnMut() -> bool) -> bool {
        if done() {
            return true;
        }
        let mut g = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let result = loop {
            if done() {
                break true;
            }
            let now = Instant::now();
            if now >= deadline {
                break false;
            }
            let step = (deadline - now).min(Duration::from_millis(50));
            g = self
                .cv
                .wait_timeout(g, step)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        };
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        drop(g);
        result
    }
}

/// The doorbell thread: a stop flag, its event, and the thread.
#[derive(Default)]
struct Scanner {
    stop: Arc<AtomicBool>,
    event: Arc<PollerEvent>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Scanner {
    /// Starts the thread: it runs the soft HCA's doorbell poller
    /// ([`SoftHca::poll_doorbells_step`]) at DISPATCH_LEVEL, as
    /// irpverbs.sys's system thread does: polling (yielding between scans)
    /// while doorbells come, waiting on its event once a window of
    /// `window_ns` passed without one, until `IOCTL_IV_RING_DOORBELLS` sets
    /// it.
    fn start(
        &self,
        platform: HostPlatform,
        soft: Arc<SoftHca<HostPlatform>>,
        window_ns: u64,
    ) -> Result<(), NtStatus> {
        self.stop.store(false, Ordering::Release);
        let stop = Arc::clone(&self.stop);
        let event = Arc::clone(&self.event);
        let handle = std::thread::Builder::new()
            .name("irpverbs-doorbells".into())
            .spawn(move || {
                let mut poller = irpverbs_soft::DoorbellPoller::new(window_ns);
                while !stop.load(Ordering::Acquire) {
                    let mut step = irpverbs_soft::PollerStep::Again;
                    // A bugcheck in the scan (or the DPCs it queued) is
                    // recorded for unload, and the thread goes on.
                    platform.run_guarded("irpverbs-doorbells", || {
                        let now = irpverbs_core::Platform::now_ns(&platform);
                        step =
                            platform.run_at_dispatch(|| soft.poll_doorbells_step(&mut poller, now));
                    });
                    match step {
                        irpverbs_soft::PollerStep::Again => std::thread::yield_now(),
                        irpverbs_soft::PollerStep::Sleep => event.wait(),
                    }
                }
            })
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        *self.thread.lock().unwrap_or_else(PoisonError::into_inner) = Some(handle);
        Ok(())
    }

    /// Stops the thread and waits for it.
    fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let thread = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(t) = thread {
            self.event.set();
            let _ = t.join();
        }
    }
}

/// The driver in-process over a soft HCA.
pub struct HostDevice {
    platform: HostPlatform,
    pub(crate) device: Arc<SoftDevice>,
    soft: Arc<SoftHca<HostPlatform>>,
    doorbell: Arc<Doorbell>,
    engine: Mutex<Option<JoinHandle<()>>>,
    user_doorbells: UserDoorbells,
    scanner: Scanner,
    next_file: AtomicU64,
    cancel: CancelRoutine,
    completions: Arc<Completions>,
    unloaded: AtomicBool,
    udp: Mutex<Option<UdpWire>>,
    udp_port: u16,
    /// The connection manager's timer (its DPC: [`Device::cm_timer`]).
    cm_timer: Arc<crate::platform::HostTimer>,
    /// The soft HCA's bus (its interrupt queues the DPC).
    bus: Arc<Bus>,
    /// Where the firmware runs.
    engine_kind: Engine,
    /// See [`HostDeviceConfig::power_managed_queue`].
    power_managed_queue: bool,
    /// In D0 (from [`HostDevice::new`] until [`HostDevice::d0_exit`], and
    /// again from [`HostDevice::d0_entry`]).
    in_d0: Mutex<bool>,
    /// See [`HostDeviceConfig::doorbell_poll_window`].
    poll_window_ns: u64,
    /// See [`HostDeviceConfig::cleanup_pin_timeout`].
    cleanup_pin_timeout: Duration,
    /// File cleanups that gave up waiting for pins.
    cleanup_timeouts: AtomicU64,
    /// See [`HostDeviceConfig::no_process_notify`].
    pub(crate) no_process_notify: bool,
    /// The opener of each user-mode file still open (its key and process
    /// handed to `Device::create_file`): where the process-exit
    /// notification finds the files of the exiting process, as irpverbs.sys
    /// finds them in its list of opened files.
    pub(crate) owners: Mutex<std::collections::HashMap<FileKey, ProcessKey>>,
    /// Open handles by process.
    pub(crate) handles: Mutex<std::collections::HashMap<ProcessKey, usize>>,
    /// The transport's timer (its DPC: [`SoftHca::advance_clock`]).
    transport_timer: Arc<crate::platform::HostTimer>,
    /// With [`Backend::Model`]: the device model, the mini-driver and its
    /// connected interrupts.
    model: Option<ModelParts>,
}

/// The parts of a host device over the model HCA. Dropping them stops
/// the model ([`ModelParts::release`]), so that an add failing after the
/// model started leaves neither its BAR (which holds the device model) nor
/// its queues behind.
struct ModelParts {
    platform: HostPlatform,
    silicon: Arc<HostSilicon>,
    hca: Arc<HostModelHca>,
    interrupts: Mutex<Vec<crate::platform::pci::HostInterrupt>>,
    released: AtomicBool,
}

impl ModelParts {
    /// Stops the model HCA (`EvtDeviceReleaseHardware`), once: disconnects
    /// its interrupts, resets the device, frees its queues and mappings,
    /// and removes its BAR.
    fn release(&self) {
        if self.released.swap(true, Ordering::AcqRel) {
            return;
        }
        let interrupts = std::mem::take(
            &mut *self
                .interrupts
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        drop(interrupts);
        self.platform.driver_code(|| self.hca.release());
        self.platform.remove_bar(0);
        self.platform.remove_bar(irpverbs_model::uar::UAR_BAR);
    }
}

impl Drop for ModelParts {
    fn drop(&mut self) {
        self.release();
    }
}

/// The platform's clock and the transport's timer, as the soft HCA sees
/// them ([`irpverbs_soft::Clock`]): a one-shot kernel timer whose DPC
/// advances the transport's clock, armed for the deadline it asks for.
struct TransportClock {
    platform: HostPlatform,
    timer: Arc<crate::platform::HostTimer>,
}

impl irpverbs_soft::Clock for TransportClock {
    fn now_ns(&self) -> u64 {
        irpverbs_core::Platform::now_ns(&self.platform)
    }

    fn arm(&self, deadline_ns: u64) {
        let due = deadline_ns.saturating_sub(self.now_ns());
        self.timer.set(Duration::from_nanos(due), None);
    }
}

impl std::fmt::Debug for HostDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostDevice")
            .field("platform", &self.platform)
            .finish_non_exhaustive()
    }
}

impl HostDevice {
    /// Builds the platform, the soft HCA and the driver, and starts the
    /// firmware thread in [`Engine::Thread`] mode and the doorbell thread
    /// with [`UserDoorbells::Page`].
    ///
    /// # Errors
    /// The soft HCA's refusal of an inconsistent configuration;
    /// `STATUS_INSUFFICIENT_RESOURCES` when an allocation of the add is
    /// refused (the verifier's low-resources simulation).
    ///
    /// # Panics
    /// With a verifier bugcheck when a failed add leaves anything behind
    /// (pool, heap, an armed timer, a reference to the device object).
    pub fn new(config: HostDeviceConfig) -> Result<Arc<Self>, NtStatus> {
        let platform = HostPlatform::new(config.platform);
        match Self::add(platform.clone(), config) {
            Ok(device) => Ok(device),
            Err(status) => {
                // A failed AddDevice gives back everything it took: with
                // its parts dropped, the verifier's unload checks and the
                // heap's leak check run as at any unload.
                platform.unload();
                platform.check_heap_leaks();
                Err(status)
            }
        }
    }

    /// AddDevice and D0Entry on `platform`; what failed is dropped.
    fn add(platform: HostPlatform, config: HostDeviceConfig) -> Result<Arc<Self>, NtStatus> {
        let doorbell = Arc::new(Doorbell::default());
        let scanner = Scanner::default();
        let bus = Arc::new(Bus {
            platform: platform.clone(),
            dpc: OnceLock::new(),
            comp: OnceLock::new(),
            resume: OnceLock::new(),
            silicon: OnceLock::new(),
            doorbell: Arc::clone(&doorbell),
            poller: Arc::clone(&scanner.event),
        });
        let mut soft_config = config.soft;
        let udp_port = soft_config.udp_port;
        let model = config.backend == Backend::Model;
        soft_config.execution = match config.engine {
            Engine::Inline => Execution::Inline,
            Engine::Thread if model => Execution::Inline,
            Engine::Thread => Execution::Deferred,
        };
        // AddDevice: the driver's code, charged to the pool (the device
        // objects' own blocks, the `Arc`s, stand for what the framework
        // allocates in WdfDeviceCreate).
        let soft =
            Arc::new(platform.driver_code(|| SoftHca::new(&platform, soft_config, bus.clone()))?);
        let (hca, model) = if model {
            let parts = Self::start_model(&platform, &soft, &bus)?;
            (HostHca::Model(Arc::clone(&parts.hca)), Some(parts))
        } else {
            (HostHca::Soft(Arc::clone(&soft)), None)
        };
        let device = Arc::new(
            platform.driver_code(|| Device::with_config(platform.clone(), hca, config.device)),
        );
        let msix_device: Arc<OnceLock<Weak<SoftDevice>>> = Arc::new(OnceLock::new());
        let _ = msix_device.set(Arc::downgrade(&device));
        if let Some(parts) = &model {
            Self::connect_model(&platform, parts, &msix_device)?;
        }
        let weak: Weak<SoftDevice> = Arc::downgrade(&device);
        let dpc = platform.new_dpc(move || {
            if let Some(d) = weak.upgrade() {
                d.dpc();
            }
        });
        let _ = bus.dpc.set(dpc);
        // The completion vectors' DPCs: vector v on processor v (the
        // model's vectors have their MSI-X messages' DPCs instead).
        let mut comp = Vec::new();
        let vectors = if model.is_some() {
            0
        } else {
            irpverbs_core::Hca::comp_event_queues(&*soft)
        };
        for vector in 0..vectors {
            let weak: Weak<SoftDevice> = Arc::downgrade(&device);
            comp.push(
                platform.new_targeted_dpc("irpverbs-vector", vector, move || {
                    if let Some(d) = weak.upgrade() {
                        d.comp_dpc(vector);
                    }
                })?,
            );
        }
        let _ = bus.comp.set(comp);
        // What a vector's EQ got before its DPC existed interrupts now.
        for vector in 0..vectors {
            irpverbs_core::Hca::arm_comp_event_queue(&*soft, vector);
        }
        let weak_soft = Arc::downgrade(&soft);
        let _ = bus.resume.set(platform.new_dpc(move || {
            if let Some(soft) = weak_soft.upgrade() {
                soft.resume();
            }
        }));
        // The CM's timer: a one-shot kernel timer whose DPC runs the CM's
        // timers, armed by the device at the CM's next deadline.
        let weak: Weak<SoftDevice> = Arc::downgrade(&device);
        let cm_timer = Arc::new(platform.new_timer(move || {
            if let Some(d) = weak.upgrade() {
                d.cm_timer();
            }
        }));
        platform.driver_code(|| arm_cm_timer(&device, &cm_timer, &platform))?;
        // The transport's timer: its DPC fires the soft HCA's timers (ACK
        // timeouts, RNR waits) on the platform's clock; the HCA arms it
        // for its next deadline, with or without a wire.
        let weak = Arc::downgrade(&soft);
        let p = platform.clone();
        let transport_timer = Arc::new(platform.new_timer(move || {
            if let Some(soft) = weak.upgrade() {
                soft.advance_clock(irpverbs_core::Platform::now_ns(&p));
            }
        }));
        let clock = TransportClock {
            platform: platform.clone(),
            timer: Arc::clone(&transport_timer),
        };
        platform.driver_code(|| {
            let clock = irpverbs_ring::try_box(clock).map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
            soft.attach_clock(clock)
        })?;
        let weak: Weak<SoftDevice> = Arc::downgrade(&device);
        let p = platform.clone();
        let cancel: CancelRoutine = Arc::new(move |key| {
            if let Some(d) = weak.upgrade() {
                p.driver_code(|| d.cancel(key));
            }
        });
        let this = Arc::new(Self {
            platform,
            device,
            soft,
            doorbell,
            engine: Mutex::new(None),
            user_doorbells: config.user_doorbells,
            scanner,
            next_file: AtomicU64::new(1),
            cancel,
            completions: Arc::default(),
            unloaded: AtomicBool::new(false),
            udp: Mutex::new(None),
            udp_port,
            cm_timer,
            bus,
            transport_timer,
            engine_kind: config.engine,
            power_managed_queue: config.power_managed_queue,
            in_d0: Mutex::new(true),
            poll_window_ns: config
                .doorbell_poll_window
                .map_or(irpverbs_soft::DEFAULT_POLL_WINDOW_NS, |w| {
                    u64::try_from(w.as_nanos()).unwrap_or(u64::MAX)
                }),
            cleanup_pin_timeout: config.cleanup_pin_timeout.unwrap_or(CLEANUP_PIN_TIMEOUT),
            cleanup_timeouts: AtomicU64::new(0),
            no_process_notify: config.no_process_notify,
            owners: Mutex::default(),
            handles: Mutex::default(),
            model,
        });
        this.start_engine()?;
        if config.user_doorbells == UserDoorbells::Page {
            this.scanner.start(
                this.platform.clone(),
                Arc::clone(&this.soft),
                this.poll_window_ns,
            )?;
        }
        Ok(this)
    }

    /// The model HCA over `soft` (its engine): the device model with its
    /// BAR installed and its MSI-X messages granted, the engine's
    /// interrupts queueing the device model's DPC, and the mini-driver
    /// started (`EvtDevicePrepareHardware`).
    fn start_model(
        platform: &HostPlatform,
        soft: &Arc<SoftHca<HostPlatform>>,
        bus: &Arc<Bus>,
    ) -> Result<ModelParts, NtStatus> {
        let silicon = Arc::new(HostSilicon::new(
            Arc::clone(soft),
            SiliconBus::new(platform.clone()),
        )?);
        let weak = Arc::downgrade(&silicon);
        let dpc = platform.new_dpc(move || {
            if let Some(s) = weak.upgrade() {
                s.run();
            }
        });
        silicon.bus().set_dpc(dpc.clone());
        let _ = bus.silicon.set(dpc);
        platform.install_bar(0, irpverbs_model::protocol::BAR_LEN, silicon.clone())?;
        if let Err(status) =
            platform.install_bar_pages(irpverbs_model::uar::UAR_BAR, silicon.uar_memory().clone())
        {
            platform.remove_bar(0);
            return Err(status);
        }
        platform.grant_msix(silicon.messages());
        let hca = platform.driver_code(|| irpverbs_model::ModelHca::start(platform.clone()));
        let hca = match hca {
            Ok(h) => Arc::new(h),
            Err(status) => {
                platform.remove_bar(0);
                platform.remove_bar(irpverbs_model::uar::UAR_BAR);
                return Err(status);
            }
        };
        Ok(ModelParts {
            platform: platform.clone(),
            silicon,
            hca,
            interrupts: Mutex::new(Vec::new()),
            released: AtomicBool::new(false),
        })
    }

    /// Connects one MSI-X message per event queue of the model
    /// (`WdfInterruptCreate` at device add) and arms the queues.
    fn connect_model(
        platform: &HostPlatform,
        parts: &ModelParts,
        device: &Arc<OnceLock<Weak<SoftDevice>>>,
    ) -> Result<(), NtStatus> {
        use irpverbs_core::platform::PciPlatform;
        let mut interrupts = Vec::new();
        for message in 0..parts.hca.event_queues() {
            let handler = MsixHandler {
                hca: Arc::clone(&parts.hca),
                device: Arc::clone(device),
            };
            interrupts.push(platform.driver_code(|| platform.connect_interrupt(message, handler))?);
        }
        *parts
            .interrupts
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = interrupts;
        platform.driver_code(|| {
            parts.hca.arm_event_queue();
            for v in 0..parts.hca.comp_event_queues() {
                parts.hca.arm_comp_event_queue(v);
            }
        });
        Ok(())
    }

    /// The model HCA's mini-driver and device model, with
    /// [`Backend::Model`].
    #[must_use]
    pub fn model(&self) -> Option<(&Arc<HostModelHca>, &Arc<HostSilicon>)> {
        self.model.as_ref().map(|m| (&m.hca, &m.silicon))
    }

    /// The backend the driver runs over.
    #[must_use]
    pub fn backend(&self) -> Backend {
        if self.model.is_some() {
            Backend::Model
        } else {
            Backend::Soft
        }
    }

    /// Stops the model HCA (`EvtDeviceReleaseHardware`): disconnects its
    /// interrupts, resets the device, frees its queues and mappings.
    fn release_model(&self) {
        if let Some(parts) = &self.model {
            // Removed while asleep: the function is reset to D0 for its
            // release (the driver's reset and unmapping need the device
            // to listen), as a bus driver's removal of a function in D3
            // does.
            if !self.platform.device_in_d0() {
                self.platform.set_device_power(true);
            }
            parts.release();
        }
    }

    /// Starts the firmware thread ([`Engine::Thread`]; nothing inline).
    fn start_engine(&self) -> Result<(), NtStatus> {
        if self.engine_kind != Engine::Thread || self.model.is_some() {
            return Ok(());
        }
        self.doorbell.stop.store(false, Ordering::Release);
        let soft = Arc::clone(&self.soft);
        let bell = Arc::clone(&self.doorbell);
        let platform = self.platform.clone();
        let handle = std::thread::Builder::new()
            .name("irpverbs-soft-hca".into())
            .spawn(move || {
                while bell.wait() {
                    // The DPCs the firmware's interrupts queue run here: a
                    // bugcheck in one is recorded for unload rather than
                    // ending the thread unseen.
                    platform.run_guarded("irpverbs-soft-hca", || {
                        platform.driver_code(|| while soft.run_firmware() > 0 {});
                    });
                }
            })
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        *self.engine.lock().unwrap_or_else(PoisonError::into_inner) = Some(handle);
        Ok(())
    }

    /// Stops the firmware thread and waits for it. A doorbell rung while it
    /// is stopped stays rung: the next thread runs it.
    fn stop_engine(&self) {
        let thread = self
            .engine
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(t) = thread {
            self.doorbell.stop.store(true, Ordering::Release);
            // Wakes it (a ring that was not pending before is taken back:
            // `wait` sees the stop first and leaves `rung` as it found it).
            {
                let _g = self
                    .doorbell
                    .lock
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                self.doorbell.cv.notify_one();
            }
            let _ = t.join();
        }
    }

    /// The device leaves D0 for a sleep state (system sleep or hibernate),
    /// as KMDF delivers it: the framework stops the I/O queue and, when the
    /// queue is power-managed ([`HostDeviceConfig::power_managed_queue`]),
    /// waits for every request the driver holds from it; then
    /// `EvtDeviceD0Exit` stops the soft HCA's own work: the doorbell thread,
    /// the CM timer, the firmware thread. The driver's state stays in
    /// memory; requests keep being presented (the queue is not
    /// power-managed), and what they ask of the HCA waits for
    /// [`Self::d0_entry`] on the firmware thread (inline, the posting
    /// thread runs it). Out of D0 already: nothing happens.
    ///
    /// IRQL: PASSIVE_LEVEL.
    ///
    /// The verifier bugchecks 0x9F DRIVER_POWER_STATE_FAILURE (0x3, device,
    /// 0, request) when the queue is power-managed and the driver holds a
    /// request from it: on Windows the power IRP would wait for it until
    /// the power watchdog fires.
    #[track_caller]
    pub fn d0_exit(&self) {
        let mut in_d0 = self.in_d0.lock().unwrap_or_else(PoisonError::into_inner);
        if !*in_d0 {
            return;
        }
        if self.power_managed_queue {
            self.platform.power_transition_check();
        }
        self.scanner.stop();
        self.device.stop_cm_timer();
        self.cm_timer.cancel();
        self.stop_engine();
        // The model HCA: the mini-driver stops touching its device
        // (`EvtDeviceD0Exit`), then the bus driver puts the function in
        // D3hot: from now on a register access or a DMA is a bugcheck.
        if let Some(parts) = &self.model {
            self.platform.driver_code(|| parts.hca.suspend());
            self.platform.set_device_power(false);
        }
        *in_d0 = false;
    }

    /// The device is back in D0 (`EvtDeviceD0Entry`): the firmware thread,
    /// the doorbell thread and the CM timer start again, and the DPC runs
    /// (what the event queue gathered meanwhile is delivered). In D0
    /// already: nothing happens.
    ///
    /// IRQL: PASSIVE_LEVEL.
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES` when a thread cannot start (the
    /// device stays out of D0).
    pub fn d0_entry(&self) -> Result<(), NtStatus> {
        let mut in_d0 = self.in_d0.lock().unwrap_or_else(PoisonError::into_inner);
        if *in_d0 {
            return Ok(());
        }
        // The model HCA: the bus driver puts the function back in D0
        // (its state kept), then `EvtDeviceD0Entry` rings what was rung
        // meanwhile, re-arms the event queues and posts the commands that
        // waited.
        if let Some(parts) = &self.model {
            self.platform.set_device_power(true);
            self.platform.driver_code(|| {
                parts.hca.resume();
                parts.hca.arm_event_queue();
                for v in 0..parts.hca.comp_event_queues() {
                    parts.hca.arm_comp_event_queue(v);
                }
                self.device.post_backlog();
            });
        }
        self.start_engine()?;
        if self.user_doorbells == UserDoorbells::Page {
            if let Err(status) = self.scanner.start(
                self.platform.clone(),
                Arc::clone(&self.soft),
                self.poll_window_ns,
            ) {
                self.stop_engine();
                return Err(status);
            }
        }
        if let Err(status) = self
            .platform
            .driver_code(|| arm_cm_timer(&self.device, &self.cm_timer, &self.platform))
        {
            self.scanner.stop();
            self.stop_engine();
            return Err(status);
        }
        // Doorbells rung out of D0 wait in their queues: the firmware
        // thread looks (inline, the next post runs them all).
        if self.engine_kind == Engine::Thread {
            self.doorbell.ring();
        }
        self.bus.interrupt();
        *in_d0 = true;
        Ok(())
    }

    /// File cleanups that gave up waiting for their user pins (each one
    /// logged): a pin leaked.
    pub fn cleanup_timeouts(&self) -> u64 {
        self.cleanup_timeouts.load(Ordering::Relaxed)
    }

    /// In D0 (not between [`Self::d0_exit`] and [`Self::d0_entry`]).
    pub fn in_d0(&self) -> bool {
        *self.in_d0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A device with the default configuration (verifier on, inline engine).
    ///
    /// # Panics
    /// Never: the default configuration is consistent.
    #[must_use]
    pub fn with_defaults() -> Arc<Self> {
        Self::new(HostDeviceConfig::default()).expect("the default configuration is valid")
    }

    /// The platform.
    pub fn platform(&self) -> &HostPlatform {
        &self.platform
    }

    /// The driver.
    pub fn device(&self) -> &Arc<SoftDevice> {
        &self.device
    }

    /// The soft HCA.
    pub fn soft(&self) -> &Arc<SoftHca<HostPlatform>> {
        &self.soft
    }

    /// Opens the device (`CreateFile`): a new file object, created in the
    /// driver at PASSIVE_LEVEL. With [`UserDoorbells::Page`] the file's
    /// doorbell page is mapped too ([`HostFile::map_doorbells`]), as a
    /// user-mode library on Windows maps it before it maps any ring.
    ///
    /// # Errors
    /// What the driver's file-create callback returned; the doorbell page's
    /// mapping failure (the file is closed again).
    pub fn open(self: &Arc<Self>, access: GrantedAccess) -> Result<HostFile, NtStatus> {
        self.open_in(HOST_PROCESS, access)
    }

    /// [`Self::open`] from `process` ([`Self::create_process`]): the file
    /// belongs to it (the driver is told its opener).
    ///
    /// # Errors
    /// As [`Self::open`].
    pub fn open_in(
        self: &Arc<Self>,
        process: ProcessKey,
        access: GrantedAccess,
    ) -> Result<HostFile, NtStatus> {
        let file = self.open_as(access, RequestorMode::User, process)?;
        if self.user_doorbells == UserDoorbells::Page {
            file.map_doorbells()?;
        }
        Ok(file)
    }

    /// How user-mode files ring their doorbells.
    pub fn user_doorbells(&self) -> UserDoorbells {
        self.user_doorbells
    }

    /// Opens the device for a kernel ULP (the file object a kernel driver
    /// gets from `IoGetDeviceObjectPointer`): its IOCTLs are internal device
    /// control requests from kernel mode.
    ///
    /// # Errors
    /// What the driver's file-create callback returned.
    pub fn open_kernel(self: &Arc<Self>) -> Result<HostFile, NtStatus> {
        self.open_as(
            FILE_READ_ACCESS | FILE_WRITE_ACCESS,
            RequestorMode::Kernel,
            HOST_PROCESS,
        )
    }

    fn open_as(
        self: &Arc<Self>,
        access: GrantedAccess,
        mode: RequestorMode,
        process: ProcessKey,
    ) -> Result<HostFile, NtStatus> {
        let key: FileKey = self.next_file.fetch_add(1, Ordering::Relaxed);
        // A user-mode open belongs to its process; a kernel-mode one (a
        // kernel ULP's, in whatever process it runs) to none.
        let owner = (mode == RequestorMode::User).then_some(process);
        // The file object's memory (IoCreateFile's), taken before the
        // driver sees the create: refused, the open fails with
        // STATUS_INSUFFICIENT_RESOURCES and the driver never knows.
        let no_memory = |_| STATUS_INSUFFICIENT_RESOURCES;
        let outstanding = Shared::try_new(AtomicUsize::new(0)).map_err(no_memory)?;
        let handles = Shared::try_new(AtomicUsize::new(1)).map_err(no_memory)?;
        let kept_notify: KeptNotify = {
            let outstanding = outstanding.clone();
            let completions = Arc::clone(&self.completions);
            kept_notify(move || {
                outstanding.fetch_sub(1, Ordering::AcqRel);
                completions.notify();
            })
            .ok_or(STATUS_INSUFFICIENT_RESOURCES)?
        };
        lock(&self.owners)
            .try_reserve(1)
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        lock(&self.handles)
            .try_reserve(1)
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        self.platform
            .driver_code(|| self.device.create_file(key, owner))?;
        self.platform.file_opened(key);
        if let Some(owner) = owner {
            lock(&self.owners).insert(key, owner);
        }
        *lock(&self.handles).entry(process).or_default() += 1;
        Ok(HostFile {
            dev: Arc::clone(self),
            key,
            access,
            mode,
            outstanding,
            kept_notify,
            page: OnceLock::new(),
            process,
            handles,
        })
    }

    /// `IRP_MN_QUERY_INTERFACE` for the kernel ULPs' direct-call table
    /// (`include/irpverbs_kernel.h`): post, poll and arm over the soft HCA's
    /// doorbells. Returned referenced: call `interface_dereference(context)`
    /// when done. Until then the table holds the device's memory and a
    /// reference on the device object ([`HostPlatform::reference_device`]),
    /// as irpverbs.sys's does: the driver does not unload
    /// ([`Self::unload`] waits) while a kernel ULP can still call into it.
    ///
    /// Every post, poll and arm holds its queue's lock, a verifier-checked
    /// spin lock of the platform ([`SPEED_LOCK`]) that raises to
    /// DISPATCH_LEVEL; with the verifier on, the rings' own locks check
    /// that they are taken at DISPATCH_LEVEL
    /// ([`crate::platform::speed_lock_check`]).
    ///
    /// Its CEP functions (version 2) name a kernel file by its file object:
    /// in host mode [`HostFile::file_object`]. The device calls a
    /// registered CEP callback at DISPATCH_LEVEL, and the verifier checks
    /// that it does (0xC4/0xE5) and that the callback returns at it.
    ///
    /// IRQL: <= DISPATCH_LEVEL. The table's context is allocated as driver
    /// code (charged to the pool; the low-resources simulation may refuse
    /// it).
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES` when the context cannot be
    /// allocated: nothing is referenced (the device reference taken for it
    /// is released).
    pub fn query_interface(self: &Arc<Self>) -> Result<IvKernelInterface, NtStatus> {
        let doorbells = InterfaceDoorbells {
            device: Arc::clone(self),
            _reference: self.platform.reference_device(),
        };
        let speed = HostSpeed(self.platform.clone());
        let ceps = InterfaceCeps(Arc::clone(self));
        self.platform.driver_code(|| {
            irpverbs_kernel_table::kernel::interface_with_cm(doorbells, speed, ceps)
        })
    }

    /// Puts the soft HCA on a UDP wire ([`crate::udp`]): a socket bound to
    /// its IP address and UDP port ([`SoftConfig::ip`],
    /// [`SoftConfig::udp_port`]), with a receive and a timer thread. GIDs that are not the HCA's own (nor on an
    /// in-process fabric) are reached through it. Returns the address bound.
    ///
    /// # Errors
    /// The socket's (address taken, not this host's), a thread that could
    /// not start, or a wire attached already (`AddrInUse`).
    pub fn attach_udp(&self, config: &UdpConfig) -> std::io::Result<std::net::SocketAddr> {
        let mut slot = self.udp.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_some() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                "a UDP wire is attached already",
            ));
        }
        let endpoint = Arc::new(DeviceEndpoint {
            soft: Arc::clone(&self.soft),
            platform: self.platform.clone(),
        });
        let addr = std::net::SocketAddr::new(crate::udp::gid_ip(&self.soft.gid()), self.udp_port);
        let wire = UdpWire::start(endpoint, addr, config)?;
        if let Err(status) = self.soft.attach_link(wire.link().clone()) {
            return Err(std::io::Error::other(format!(
                "attach_link: {}",
                status_name(status)
            )));
        }
        let addr = wire.local_addr();
        *slot = Some(wire);
        Ok(addr)
    }

    /// Takes the port's link down (`up` false) or up, as the host does
    /// with `ip link set dev .. down|up` under rxe: the soft HCA's link
    /// model ([`SoftHca::set_port_link`]). The driver gets `PORT_ERR` or
    /// `PORT_ACTIVE` through its event queue and delivers it to every
    /// file; `QueryPort` reports the state. Returns whether it changed.
    ///
    /// IRQL: <= DISPATCH_LEVEL (run as driver code).
    pub fn set_port_link(&self, up: bool) -> bool {
        self.platform.driver_code(|| self.soft.set_port_link(up))
    }

    /// Injects a firmware error ([`SoftHca::inject_fatal_error`]): the
    /// device becomes fatal, apart from removal. Every file gets
    /// `DEVICE_FATAL`, every QP goes to ERR with its work flushed, and
    /// every verb but the destroys fails with
    /// `STATUS_DEVICE_HARDWARE_ERROR`; files still close and the driver
    /// still unloads without a leak. Returns false if it was fatal already.
    ///
    /// IRQL: <= DISPATCH_LEVEL (run as driver code).
    pub fn inject_fatal_error(&self) -> bool {
        self.platform.driver_code(|| self.soft.inject_fatal_error())
    }

    /// Takes the soft HCA off its UDP wire and stops the wire's threads;
    /// its last counters, if one was attached.
    pub fn detach_udp(&self) -> Option<UdpStats> {
        let wire = self
            .udp
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()?;
        self.soft.detach_link();
        Some(wire.stop())
    }

    /// The address the UDP wire is bound to, if one is attached.
    pub fn udp_addr(&self) -> Option<std::net::SocketAddr> {
        self.udp
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(UdpWire::local_addr)
    }

    /// Busy-poll receive on the UDP wire ([`UdpWire::poll_rx`]): for a
    /// thread that spins on a CQ, between polls that found nothing. How
    /// many datagrams it delivered; 0 without a wire. The ACKs owed for
    /// what it delivered wait for this thread's next send (one system call
    /// for both) or its next call that finds nothing.
    pub fn poll_wire(&self) -> usize {
        let n = self
            .udp
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map_or(0, UdpWire::poll_rx);
        if n == 0 {
            // Nothing new: the ACKs the last poll held go now (an answer
            // posted meanwhile took them along).
            self.soft().flush_transmit();
        }
        n
    }

    /// The UDP wire's counters, if one is attached.
    pub fn udp_stats(&self) -> Option<UdpStats> {
        self.udp
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(UdpWire::stats)
    }

    /// Waits (up to `timeout`) until the driver holds no file, object or
    /// command and the soft HCA holds no object.
    ///
    /// # Errors
    /// What is still held.
    pub fn quiesce(&self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        let idle = || {
            self.device.snapshot() == DeviceSnapshot::default()
                && self.soft.live_objects() == 0
                && self.soft.stats().doorbell_pages == 0
        };
        if self.completions.wait_until(deadline, idle) {
            return Ok(());
        }
        Err(format!(
            "device not quiescent: {:?}, soft HCA objects {}, doorbell pages {}",
            self.device.snapshot(),
            self.soft.live_objects(),
            self.soft.stats().doorbell_pages
        ))
    }

    /// Surprise removal (the device is pulled out), as PnP and KMDF deliver
    /// it: `EvtDeviceSurpriseRemoval` ([`Device::remove`]: every pending
    /// request completes, new verbs fail with `STATUS_DEVICE_REMOVED`,
    /// destroys still succeed, every file gets `DEVICE_FATAL`, the HCA
    /// lets go of its objects), then `EvtDeviceD0Exit` to D3Final (the
    /// doorbell thread and the CM timer stop). Files stay open until their
    /// handles are closed; the driver unloads after that ([`Self::unload`]).
    /// A second call changes nothing.
    ///
    /// IRQL: PASSIVE_LEVEL.
    pub fn surprise_remove(&self) {
        self.device.remove();
        self.scanner.stop();
        self.device.stop_cm_timer();
        self.cm_timer.cancel();
    }

    /// Unloads the driver: waits (up to [`CLOSE_TIMEOUT`]) until no kernel
    /// ULP holds the direct-call interface (the device object is still
    /// referenced: the I/O manager defers the unload), stops the doorbell
    /// and firmware threads and runs the verifier's unload checks (pool
    /// leaks, outstanding requests, armed timers, the device object still
    /// referenced). Files must be closed first, as on Windows.
    ///
    /// # Panics
    /// With a verifier bugcheck when something leaked.
    pub fn unload(&self) {
        if self.unloaded.swap(true, Ordering::AcqRel) {
            return;
        }
        // The I/O manager unloads the image only once the device object's
        // last reference is gone (a kernel ULP's interface holds one).
        self.platform
            .wait_device_unreferenced(Instant::now() + CLOSE_TIMEOUT);
        self.detach_udp();
        self.scanner.stop();
        self.platform.driver_code(|| self.device.stop_cm_timer());
        self.cm_timer.cancel();
        self.soft.detach_clock();
        self.transport_timer.cancel();
        self.doorbell.stop.store(true, Ordering::Release);
        self.doorbell.ring();
        if let Some(h) = self
            .engine
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            let _ = h.join();
        }
        // KeFlushQueuedDpcs: a completion vector's DPC still running holds
        // the device, which must be gone when the leak check runs.
        for dpc in self.bus.comp.get().into_iter().flatten() {
            dpc.stop();
        }
        self.release_model();
        self.platform.unload();
    }
}

impl HostDevice {
    /// Device removal and unload, with every check: [`unload`](Self::unload)'s,
    /// then, once the driver's device object is gone (this must be the last
    /// reference to the device, files closed), the leak check of the
    /// driver's heap ([`HostPlatform::check_heap_leaks`]): every block the
    /// driver's code allocated must be freed.
    ///
    /// # Panics
    /// With a verifier bugcheck when something leaked.
    pub fn remove(this: Arc<Self>) {
        this.unload();
        let platform = this.platform.clone();
        drop(this);
        platform.check_heap_leaks();
    }
}

impl Drop for HostDevice {
    fn drop(&mut self) {
        self.detach_udp();
        self.scanner.stop();
        self.doorbell.stop.store(true, Ordering::Release);
        self.doorbell.ring();
        if let Some(h) = self
            .engine
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            let _ = h.join();
        }
    }
}

/// Gives the device the function that arms its CM timer (a one-shot
/// platform timer whose DPC runs [`Device::cm_timer`]) at the CM's next
/// deadline.
///
/// # Errors
/// `STATUS_INSUFFICIENT_RESOURCES` ([`irpverbs_core::cm::cm_timer_arm`]).
fn arm_cm_timer(
    device: &SoftDevice,
    cm_timer: &Arc<crate::platform::HostTimer>,
    platform: &HostPlatform,
) -> Result<(), NtStatus> {
    let (t, p) = (Arc::clone(cm_timer), platform.clone());
    device.set_cm_timer(irpverbs_core::cm::cm_timer_arm(move |deadline| {
        let due = deadline.saturating_sub(irpverbs_core::Platform::now_ns(&p));
        t.set(std::time::Duration::from_nanos(due), None);
    })?);
    Ok(())
}

/// The soft HCA as a UDP wire's endpoint; the wire's threads run under the
/// verifier's guard, so a bugcheck on them is raised at unload.
struct DeviceEndpoint {
    soft: Arc<SoftHca<HostPlatform>>,
    platform: HostPlatform,
}

impl Endpoint for DeviceEndpoint {
    fn receive(&self, d: &Datagram<'_>) {
        // A dropped datagram is counted by the HCA.
        let _ = self.platform.driver_code(|| self.soft.receive(d));
    }

    fn receive_queued(&self, d: &Datagram<'_>) {
        // A dropped datagram is counted by the HCA.
        let _ = self.platform.driver_code(|| self.soft.receive_queued(d));
    }

    fn end_batch(&self, flush: bool) {
        self.platform.driver_code(|| self.soft.run_deferred(flush));
    }

    fn advance_clock(&self, now_ns: u64) -> Option<u64> {
        self.platform
            .driver_code(|| self.soft.advance_clock(now_ns))
    }

    fn run_thread(&self, name: &str, body: &mut dyn FnMut()) {
        self.platform.run_guarded(name, body);
    }
}

/// One IOCTL to submit.
#[derive(Clone, Copy, Debug)]
pub struct Ioctl<'a> {
    /// The code.
    pub code: u32,
    /// The input buffer.
    pub input: &'a [u8],
    /// The output buffer's length.
    pub output_len: usize,
    /// Who calls.
    pub mode: RequestorMode,
    /// The major function.
    pub major: MajorFunction,
}

impl<'a> Ioctl<'a> {
    /// A user-mode `DeviceIoControl`.
    #[must_use]
    pub fn user(code: u32, input: &'a [u8], output_len: usize) -> Self {
        Self {
            code,
            input,
            output_len,
            mode: RequestorMode::User,
            major: MajorFunction::DeviceControl,
        }
    }

    /// A kernel ULP's internal device control.
    #[must_use]
    pub fn kernel(code: u32, input: &'a [u8], output_len: usize) -> Self {
        Self {
            code,
            input,
            output_len,
            mode: RequestorMode::Kernel,
            major: MajorFunction::InternalDeviceControl,
        }
    }
}

/// What [`HostFile::submit`] did.
#[derive(Debug)]
pub struct Submitted {
    /// The driver returned with the request pending (`STATUS_PENDING`): a
    /// Win32 caller sees `ERROR_IO_PENDING`. It may have completed since.
    pub pended: bool,
    /// The request, for cancel (`CancelIoEx`). `None` when the I/O manager
    /// refused it before the driver saw it.
    pub handle: Option<RequestHandle>,
}

/// An open of the device.
pub struct HostFile {
    pub(crate) dev: Arc<HostDevice>,
    pub(crate) key: FileKey,
    pub(crate) access: GrantedAccess,
    pub(crate) mode: RequestorMode,
    pub(crate) outstanding: Shared<AtomicUsize>,
    /// What a synchronous call's completion runs ([`Completion::Keep`]):
    /// the request stops counting as outstanding and waiters wake.
    pub(crate) kept_notify: KeptNotify,
    /// The file's doorbell page, once this handle mapped it: its doorbells
    /// ring through it.
    pub(crate) page: OnceLock<PageDoorbells>,
    /// The process this handle belongs to: its requests come from it.
    pub(crate) process: ProcessKey,
    /// The file object's handles (this one and its duplicates): the last
    /// one's close is the file's cleanup and close.
    pub(crate) handles: Shared<AtomicUsize>,
}

impl std::fmt::Debug for HostFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostFile")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl HostFile {
    /// The file's stand-in for the `FILE_OBJECT` a kernel ULP names it by
    /// in the direct-call table's CEP functions
    /// ([`HostDevice::query_interface`]): its key, as a pointer.
    pub fn file_object(&self) -> *mut std::ffi::c_void {
        std::ptr::without_provenance_mut(self.key as usize)
    }

    /// The file's key.
    pub fn key(&self) -> FileKey {
        self.key
    }

    /// The device.
    pub fn device(&self) -> &Arc<HostDevice> {
        &self.dev
    }

    /// Issues an IOCTL. `on_complete(status, information, output)` runs
    /// exactly once, at completion (possibly before this returns, possibly
    /// on another thread at DISPATCH_LEVEL); with
    /// `STATUS_INSUFFICIENT_RESOURCES` before this returns when the I/O
    /// manager's memory for the request is refused (the driver never sees
    /// it, and [`Submitted::handle`] is `None`).
    ///
    /// IRQL: PASSIVE_LEVEL (the caller's thread).
    pub fn submit(
        &self,
        io: Ioctl<'_>,
        on_complete: impl FnOnce(NtStatus, usize, &[u8]) + Send + 'static,
    ) -> Submitted {
        self.submit_or(io, on_complete, true).unwrap_or(Submitted {
            pended: false,
            handle: None,
        })
    }

    /// [`Self::submit`], except that when the I/O manager's memory for the
    /// request (the IRP, the system buffer, the completion routine's) is
    /// refused it fails with `STATUS_INSUFFICIENT_RESOURCES` and
    /// `on_complete` is dropped without running, as `DeviceIoControl`
    /// fails when `IoAllocateIrp` does: no completion, nothing queued.
    ///
    /// IRQL: PASSIVE_LEVEL (the caller's thread).
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES`, before the driver sees anything.
    pub fn try_submit(
        &self,
        io: Ioctl<'_>,
        on_complete: impl FnOnce(NtStatus, usize, &[u8]) + Send + 'static,
    ) -> Result<Submitted, NtStatus> {
        self.submit_or(io, on_complete, false)
    }

    /// [`Self::submit`]; a request refused before the driver runs
    /// `on_complete` with the status (`run_refused`) or drops it.
    fn submit_or(
        &self,
        io: Ioctl<'_>,
        on_complete: impl FnOnce(NtStatus, usize, &[u8]) + Send + 'static,
        run_refused: bool,
    ) -> Result<Submitted, NtStatus> {
        if !self.may_issue(io.code) {
            on_complete(STATUS_ACCESS_DENIED, 0, &[]);
            return Ok(Submitted {
                pended: false,
                handle: None,
            });
        }
        let outstanding = self.outstanding.clone();
        let completions = Arc::clone(&self.dev.completions);
        let routine = move |status, info, out: &[u8]| {
            on_complete(status, info, out);
            outstanding.fetch_sub(1, Ordering::AcqRel);
            completions.notify();
        };
        // Refused: counted outstanding until its completion runs, as any
        // request, if it runs.
        let refused = |run: &mut dyn FnMut()| {
            if run_refused {
                self.outstanding.fetch_add(1, Ordering::AcqRel);
                run();
            }
            Err(STATUS_INSUFFICIENT_RESOURCES)
        };
        match irpverbs_ring::try_box(routine) {
            Ok(routine) => match self.dispatch(io, Completion::Routine(routine)) {
                Ok(submitted) => Ok(submitted),
                Err(completion) => {
                    let mut completion = Some(completion);
                    refused(&mut || match completion.take() {
                        Some(Completion::Routine(r)) => r(STATUS_INSUFFICIENT_RESOURCES, 0, &[]),
                        Some(Completion::Keep(notify)) => (*notify)(),
                        None => {}
                    })
                }
            },
            Err(routine) => {
                let mut routine = Some(routine);
                refused(&mut || {
                    if let Some(r) = routine.take() {
                        r(STATUS_INSUFFICIENT_RESOURCES, 0, &[]);
                    }
                })
            }
        }
    }

    /// Whether the file's granted access allows `code`.
    fn may_issue(&self, code: u32) -> bool {
        let required = ioctl_access(code);
        ioctl_device_type(code) != FILE_DEVICE_INFINIBAND || required & !self.access == 0
    }

    /// Builds the request (counted outstanding until `on_complete` ends),
    /// runs EvtIoInCallerContext, and dispatches it at DISPATCH_LEVEL.
    /// `Err` with the completion, not run, when the I/O manager's memory
    /// for the request (the IRP and the system buffer) is refused: the
    /// driver never sees it.
    fn dispatch(&self, io: Ioctl<'_>, on_complete: Completion) -> Result<Submitted, Completion> {
        // IoAllocateIrp and the system buffer: the I/O manager's pool,
        // which can be refused; the call then fails with
        // STATUS_INSUFFICIENT_RESOURCES (`ERROR_NO_SYSTEM_RESOURCES` from
        // `DeviceIoControl`) before the driver sees it.
        if self.dev.platform.io_manager_allocate().is_err() {
            return Err(on_complete);
        }
        // The system buffer: input and output share it, sized for the
        // larger (one allocation, no regrowth).
        let mut input = Vec::new();
        if input
            .try_reserve_exact(io.input.len().max(io.output_len))
            .is_err()
        {
            return Err(on_complete);
        }
        input.extend_from_slice(io.input);
        let params = RequestParams {
            ioctl_code: io.code,
            major_function: io.major,
            requestor_mode: io.mode,
            file: self.key,
            process: self.process,
            input,
            output_len: io.output_len,
        };
        let request = self.dev.platform.try_new_request_with(
            params,
            on_complete,
            Some(Arc::clone(&self.dev.cancel)),
        )?;
        self.outstanding.fetch_add(1, Ordering::AcqRel);
        let handle = request.handle();
        // EvtIoInCallerContext: on the caller's thread, at its IRQL
        // (PASSIVE_LEVEL), before the request is queued.
        let platform = &self.dev.platform;
        let Some(request) = platform.driver_code(|| self.dev.device.in_caller_context(request))
        else {
            return Ok(Submitted {
                pended: !handle.is_completed(),
                handle: Some(handle),
            });
        };
        let old = self.dev.platform.raise_irql(DISPATCH_LEVEL);
        platform.driver_code(|| self.dev.device.dispatch_ioctl(request));
        let pended = !handle.is_completed();
        self.dev.platform.lower_irql(old);
        Ok(Submitted {
            pended,
            handle: Some(handle),
        })
    }

    /// Issues an IOCTL and waits for its completion (a synchronous
    /// `DeviceIoControl`): the status and the output bytes. The result
    /// stays in the request ([`Completion::Keep`]): no completion routine
    /// and no output copy.
    pub fn call(&self, io: Ioctl<'_>) -> (NtStatus, Vec<u8>) {
        if !self.may_issue(io.code) {
            return (STATUS_ACCESS_DENIED, Vec::new());
        }
        // No request: the I/O manager refused its memory.
        let Ok(submitted) = self.dispatch(io, Completion::Keep(self.kept_notify.clone())) else {
            return (STATUS_INSUFFICIENT_RESOURCES, Vec::new());
        };
        let Some(handle) = submitted.handle else {
            return (STATUS_INSUFFICIENT_RESOURCES, Vec::new());
        };
        if let Some(r) = handle.take_result() {
            return r;
        }
        let mut result = None;
        self.dev
            .completions
            .wait_until(Instant::now() + Duration::from_secs(3600), || {
                result = handle.take_result();
                result.is_some()
            });
        result.unwrap_or((STATUS_CANCELLED, Vec::new()))
    }

    /// Who the file's requests come from: user mode (`CreateFile`), or a
    /// kernel ULP ([`HostDevice::open_kernel`]).
    pub fn mode(&self) -> RequestorMode {
        self.mode
    }

    /// An IOCTL as this file issues it: `IRP_MJ_DEVICE_CONTROL` from user
    /// mode, or `IRP_MJ_INTERNAL_DEVICE_CONTROL` from a kernel-mode file.
    pub fn request<'a>(&self, code: u32, input: &'a [u8], output_len: usize) -> Ioctl<'a> {
        match self.mode {
            RequestorMode::User => Ioctl::user(code, input, output_len),
            RequestorMode::Kernel => Ioctl::kernel(code, input, output_len),
        }
    }

    /// A synchronous IOCTL (user mode, or internal from a kernel file).
    pub fn ioctl(&self, code: u32, input: &[u8], output_len: usize) -> (NtStatus, Vec<u8>) {
        self.call(self.request(code, input, output_len))
    }

    /// This file, shared with a [`CmSubmitter`] that issues the connection
    /// manager's requests on it asynchronously ([`HostFile::submit`]): the
    /// [`SharedFile`] carries the typed verbs (`into_client()`, with the
    /// speed path), and a test can then run a connect, an accept and the
    /// wire on one thread, deterministically (the CM's requests name the
    /// client's QPs, so they must be the same file). The file closes when
    /// both are dropped.
    pub fn with_cm_submitter(self) -> (SharedFile, CmSubmitter) {
        let file = Arc::new(self);
        (SharedFile(Arc::clone(&file)), CmSubmitter(file))
    }

    /// Requests of this file not yet completed.
    pub fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::Acquire)
    }

    /// Maps the file's doorbell page (`IOCTL_IV_MAP_DOORBELLS`; once, later
    /// calls return the same page): from now on the file's doorbells are
    /// bits in the page, which the device's doorbell thread finds (rings
    /// must be mapped after it to have slots in it).
    ///
    /// # Errors
    /// The IOCTL's status (`STATUS_NOT_SUPPORTED` for a kernel-mode file,
    /// which rings the direct-call doorbells); `STATUS_INVALID_PARAMETER`
    /// for a response that is no doorbell page.
    #[allow(unsafe_code, reason = "viewing the mapped doorbell page")]
    pub fn map_doorbells(&self) -> Result<&PageDoorbells, NtStatus> {
        if let Some(page) = self.page.get() {
            return Ok(page);
        }
        let (status, out) = self.ioctl(IOCTL_IV_MAP_DOORBELLS, &[], size_of::<IvMapDoorbellsOut>());
        if !nt_success(status) {
            return Err(status);
        }
        let out = IvMapDoorbellsOut::read_from_bytes(&out).map_err(|_| STATUS_INVALID_PARAMETER)?;
        // SAFETY: `out` is this file's IOCTL_IV_MAP_DOORBELLS response in
        // this (the only) address space; the page stays mapped and
        // allocated until the file's cleanup, which runs when the file is
        // dropped, after which nothing can ring through it (the doorbells
        // are reached only through `&self`).
        let page = unsafe { PageDoorbells::from_map(&out) }?;
        Ok(self.page.get_or_init(|| page))
    }

    /// The file's doorbell page, if [`HostFile::map_doorbells`] mapped it.
    pub fn doorbell_page(&self) -> Option<&PageDoorbells> {
        self.page.get()
    }
}

impl IoctlTransport for HostFile {
    fn ioctl(&self, code: u32, input: &[u8], output_len: usize) -> (NtStatus, Vec<u8>) {
        HostFile::ioctl(self, code, input, output_len)
    }
}

impl HostDevice {
    /// A bounded wait for the pages `file`'s registrations locked (its
    /// rundown's deregistrations release them), as irpverbs.sys waits in
    /// `EvtFileCleanup` and in its process-exit notification: what is left
    /// is counted and logged, and the caller goes on (the verifier then
    /// sees the process end with locked pages).
    pub(crate) fn wait_file_pins(&self, file: FileKey, what: &str) {
        let left = self.platform.wait_unpinned(file, self.cleanup_pin_timeout);
        if left != 0 {
            self.cleanup_timeouts.fetch_add(1, Ordering::Relaxed);
            eprintln!(
                "irpverbs: {what}: {left} user pin(s) still held after {:?}",
                self.cleanup_pin_timeout
            );
        }
    }
}

/// Locks a host-side table (poisoning ignored: a bugcheck caught by a test
/// may unwind through a holder).
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Drop for HostFile {
    /// `CloseHandle`: the handle goes; the last handle's close is the
    /// file's cleanup at PASSIVE_LEVEL, in this handle's process, then its
    /// close once every request of the file is complete.
    fn drop(&mut self) {
        let dev = &self.dev;
        if let Some(n) = lock(&dev.handles).get_mut(&self.process) {
            *n -= 1;
        }
        if self.handles.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        dev.platform
            .driver_code(|| dev.device.cleanup_file(self.key));
        // EvtFileCleanup: a bounded wait for the file's pins.
        dev.wait_file_pins(self.key, "file cleanup");
        let outstanding = self.outstanding.clone();
        dev.completions
            .wait_until(Instant::now() + CLOSE_TIMEOUT, || {
                outstanding.load(Ordering::Acquire) == 0
            });
        dev.platform.file_closing(self.key);
        dev.platform.driver_code(|| dev.device.close_file(self.key));
        lock(&dev.owners).remove(&self.key);
    }
}

/// A file shared with a [`CmSubmitter`] ([`HostFile::with_cm_submitter`]):
/// the typed verbs' side of it.
pub struct SharedFile(Arc<HostFile>);

impl std::fmt::Debug for SharedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SharedFile").field(&self.0.key()).finish()
    }
}

impl IoctlTransport for SharedFile {
    fn ioctl(&self, code: u32, input: &[u8], output_len: usize) -> (NtStatus, Vec<u8>) {
        self.0.ioctl(code, input, output_len)
    }
}

// SAFETY: the only other holder of the file is the `CmSubmitter` made with
// this value, which submits the connection manager's IOCTLs only
// (`CmSubmitter::ISSUES`): none of them destroys, resizes or unmaps a QP,
// CQ or SRQ (a CM request modifies its QP, as `IOCTL_IV_MODIFY_QP` through
// the client would). The file is run down only when both are dropped, so
// never while this value (and the client and objects over it) lives.
#[allow(unsafe_code, reason = "the SpeedPath contract, justified above")]
unsafe impl SpeedPath for SharedFile {
    fn doorbells(&self) -> &dyn Doorbells {
        &*self.0
    }
}

/// Issues the connection manager's requests asynchronously on a file the
/// typed verbs own ([`HostFile::with_cm_submitter`]).
pub struct CmSubmitter(Arc<HostFile>);

impl std::fmt::Debug for CmSubmitter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("CmSubmitter").field(&self.0.key()).finish()
    }
}

impl CmSubmitter {
    /// The IOCTLs it issues: the CEPs' and the CM's requests.
    pub const ISSUES: [u32; 13] = [
        IOCTL_IV_CREATE_CEP,
        IOCTL_IV_LISTEN,
        IOCTL_IV_GET_CEP_EVENT,
        IOCTL_IV_DESTROY_CEP,
        IOCTL_IV_CM_CONNECT,
        IOCTL_IV_CM_ACCEPT,
        IOCTL_IV_CM_REJECT,
        IOCTL_IV_CM_DISCONNECT,
        IOCTL_IV_CM_MRA,
        IOCTL_IV_CM_LAP,
        IOCTL_IV_CM_APR,
        IOCTL_IV_SIDR_REQUEST,
        IOCTL_IV_SIDR_REPLY,
    ];

    /// [`HostFile::submit`] of a user-mode request (`on_complete` runs
    /// exactly once, possibly before this returns).
    ///
    /// IRQL: PASSIVE_LEVEL.
    ///
    /// # Errors
    /// `STATUS_INVALID_DEVICE_REQUEST`, without reaching the driver, for a
    /// code not in [`CmSubmitter::ISSUES`] (`on_complete` is not run).
    pub fn submit(
        &self,
        code: u32,
        input: &[u8],
        output_len: usize,
        on_complete: impl FnOnce(NtStatus, usize, &[u8]) + Send + 'static,
    ) -> Result<Submitted, NtStatus> {
        if !Self::ISSUES.contains(&code) {
            return Err(STATUS_INVALID_DEVICE_REQUEST);
        }
        Ok(self
            .0
            .submit(self.0.request(code, input, output_len), on_complete))
    }

    /// A synchronous CM request ([`HostFile::ioctl`]); the same refusal as
    /// [`CmSubmitter::submit`].
    pub fn ioctl(&self, code: u32, input: &[u8], output_len: usize) -> (NtStatus, Vec<u8>) {
        if !Self::ISSUES.contains(&code) {
            return (STATUS_INVALID_DEVICE_REQUEST, Vec::new());
        }
        self.0.ioctl(code, input, output_len)
    }

    /// The file's key.
    pub fn key(&self) -> FileKey {
        self.0.key()
    }
}

/// The class of the kernel table's queue locks: a leaf (nothing is taken
/// under it; the doorbell is rung after it is released).
pub static SPEED_LOCK: LockClass = LockClass {
    name: "irpverbs.speed",
    rank: 100,
};

/// The platform's side of the kernel table: a verifier-checked spin lock
/// per queue, and the verifier's check of the rings' own locks.
struct HostSpeed(HostPlatform);

impl SpeedPlatform for HostSpeed {
    fn new_lock(&self) -> Result<Box<dyn SpeedLock>, NtStatus> {
        irpverbs_ring::try_box(self.0.new_raw_lock(&SPEED_LOCK))
            .map(|b| b as Box<dyn SpeedLock>)
            .map_err(|_| irpverbs_abi::STATUS_INSUFFICIENT_RESOURCES)
    }

    fn lock_check(&self) -> Option<LockCheck> {
        self.0
            .verifier_enabled()
            .then_some(crate::platform::speed_lock_check as LockCheck)
    }
}

/// `KeAcquireSpinLockRaiseToDpc` / `KeReleaseSpinLock`.
impl SpeedLock for RawSpinLock {
    fn acquire(&self) -> u8 {
        RawSpinLock::acquire(self)
    }

    fn release(&self, old: u8) {
        RawSpinLock::release(self, old);
    }
}

/// The doorbells of the soft HCA: on hardware, writes to a UAR page; here
/// direct calls of its [`Hca`] doorbell methods, by queue number (IRQL <=
/// DISPATCH_LEVEL, no blocking).
impl Doorbells for HostDevice {
    fn sq(&self, qp: Bell) {
        let hca = self.device.hca();
        self.platform.driver_code(|| hca.sq_doorbell(qp.number));
    }
    fn rq(&self, qp: Bell) {
        let hca = self.device.hca();
        self.platform.driver_code(|| hca.rq_doorbell(qp.number));
    }
    fn srq(&self, srq: Bell) {
        let hca = self.device.hca();
        self.platform.driver_code(|| hca.srq_doorbell(srq.number));
    }
    fn cq_arm(&self, cq: Bell) {
        let hca = self.device.hca();
        self.platform.driver_code(|| hca.cq_arm_doorbell(cq.number));
    }
}

/// What a kernel ULP's direct-call table rings: the device's doorbells,
/// holding the device and a reference on its device object.
struct InterfaceDoorbells {
    device: Arc<HostDevice>,
    _reference: crate::platform::DeviceReference,
}

impl Doorbells for InterfaceDoorbells {
    fn sq(&self, qp: Bell) {
        self.device.sq(qp);
    }
    fn rq(&self, qp: Bell) {
        self.device.rq(qp);
    }
    fn srq(&self, srq: Bell) {
        self.device.srq(srq);
    }
    fn cq_arm(&self, cq: Bell) {
        self.device.cq_arm(cq);
    }
}

/// The kernel table's CEP functions over the device's CM.
struct InterfaceCeps(Arc<HostDevice>);

/// The file a file object names (host mode: [`HostFile::file_object`]).
fn file_of_object(file_object: *mut std::ffi::c_void) -> Result<FileKey, NtStatus> {
    match file_object.addr() as FileKey {
        0 => Err(STATUS_INVALID_HANDLE),
        key => Ok(key),
    }
}

impl CepCalls for InterfaceCeps {
    fn set_cep_callback(
        &self,
        file_object: *mut std::ffi::c_void,
        cep: IvHandle,
        callback: Option<CepNotify>,
    ) -> Result<(), NtStatus> {
        let file = file_of_object(file_object)?;
        let call = if self.0.platform.verifier_enabled() {
            notify_verified
        } else {
            notify
        };
        let callback = callback.map(|n| {
            CepCallback::Function(CepFunction {
                call,
                words: n.to_words(),
            })
        });
        let dev = &self.0.device;
        self.0
            .platform
            .driver_code(|| dev.set_cep_callback(file, cep, callback))
    }

    fn poll_cep_event(
        &self,
        file_object: *mut std::ffi::c_void,
        cep: IvHandle,
    ) -> Result<Option<IvCepEventOut>, NtStatus> {
        let file = file_of_object(file_object)?;
        let dev = &self.0.device;
        self.0
            .platform
            .driver_code(|| dev.poll_cep_event(file, cep))
    }
}

/// Calls a C kernel ULP's CEP callback.
fn notify(words: [usize; 2], ready: CepReady) {
    #[allow(unsafe_code)]
    // SAFETY: the words are a registered callback's (`CepNotify::to_words`
    // in `InterfaceCeps::set_cep_callback`), and the device calls only the
    // CEP's current callback: unregistering waits for a running call.
    unsafe {
        CepNotify::notify_words(words, ready.cep, ready.user_context);
    }
}

/// [`notify`] under the verifier: the callback is called at DISPATCH_LEVEL
/// (its contract) and returns at it.
fn notify_verified(words: [usize; 2], ready: CepReady) {
    check_callback_irql(true, DISPATCH_LEVEL, "a kernel ULP's CEP callback");
    notify(words, ready);
    check_callback_irql(
        true,
        DISPATCH_LEVEL,
        "a kernel ULP's CEP callback (on return)",
    );
}

/// The doorbells of the file: its doorbell page once mapped
/// ([`HostFile::map_doorbells`]; a [`Bell`] without a slot then rings
/// nothing), else the device's direct calls.
/// A file with its doorbell page mapped rings through it, and wakes the
/// device's doorbell thread with `IOCTL_IV_RING_DOORBELLS` when the page
/// says that it sleeps; other files call the device's doorbells.
impl Doorbells for HostFile {
    fn sq(&self, qp: Bell) {
        match self.page.get() {
            Some(page) => self.ring_page(page, qp),
            None => self.dev.sq(qp),
        }
    }
    fn rq(&self, qp: Bell) {
        match self.page.get() {
            Some(page) => self.ring_page(page, qp),
            None => self.dev.rq(qp),
        }
    }
    fn srq(&self, srq: Bell) {
        match self.page.get() {
            Some(page) => self.ring_page(page, srq),
            None => self.dev.srq(srq),
        }
    }
    fn cq_arm(&self, cq: Bell) {
        match self.page.get() {
            Some(page) => self.ring_page(page, cq),
            None => self.dev.cq_arm(cq),
        }
    }
}

impl HostFile {
    /// Rings `bell`'s slot in the page; if the HCA does not poll the page,
    /// wakes it (`IOCTL_IV_RING_DOORBELLS`, as a Windows ULP would).
    fn ring_page(&self, page: &PageDoorbells, bell: Bell) {
        let page = page.page();
        if page.ring(bell.slot) && page.must_wake() {
            let _ = self.ioctl(IOCTL_IV_RING_DOORBELLS, &[], 0);
        }
    }
}

// SAFETY: a `HostFile` is one open of the device, owned (not `Clone`): the
// objects created through it are destroyed or resized only by IOCTLs it
// submits, and run down only when it is dropped (`CloseHandle`). Nothing
// else issues requests on its file key except the driver itself (the core
// `Device` reachable through `device()`, which is the kernel's side).
#[allow(unsafe_code, reason = "the SpeedPath contract, justified above")]
unsafe impl SpeedPath for HostFile {
    fn doorbells(&self) -> &dyn Doorbells {
        self
    }
}

/// Helper for tests and tools: the HCA's device attributes.
pub fn caps(dev: &HostDevice) -> IvQueryDeviceOut {
    *dev.soft.caps()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::{catch_bugcheck, codes};

    /// No ring is lost, whether it finds the firmware thread polling or
    /// asleep: every ring is followed by a return of `wait`, and `stop`
    /// ends the thread either way.
    #[test]
    fn the_firmware_doorbell_loses_no_ring() {
        let bell = Arc::new(Doorbell::default());
        let seen = Arc::new(AtomicU64::new(0));
        let thread = {
            let (bell, seen) = (Arc::clone(&bell), Arc::clone(&seen));
            std::thread::spawn(move || {
                while bell.wait() {
                    seen.fetch_add(1, Ordering::SeqCst);
                }
            })
        };
        for round in 0..400u64 {
            let before = seen.load(Ordering::SeqCst);
            // Some rings land while the thread polls, some (after a pause
            // past ENGINE_SPIN) while it sleeps.
            if round % 40 == 0 {
                std::thread::sleep(ENGINE_SPIN * 3);
            }
            bell.ring();
            let deadline = Instant::now() + Duration::from_secs(10);
            while seen.load(Ordering::SeqCst) == before {
                assert!(Instant::now() < deadline, "ring {round} was lost");
                std::thread::yield_now();
            }
        }
        // Rings from several threads at once all end in a wake-up.
        let before = seen.load(Ordering::SeqCst);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..1000 {
                        bell.ring();
                    }
                });
            }
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while seen.load(Ordering::SeqCst) == before {
            assert!(Instant::now() < deadline, "concurrent rings lost");
            std::thread::yield_now();
        }
        std::thread::sleep(ENGINE_SPIN * 3);
        bell.stop.store(true, Ordering::Release);
        bell.ring();
        thread.join().unwrap();
    }

    /// A bugcheck in a DPC that runs on the firmware thread (here: the
    /// completion routine of a request that DPC completes touches paged
    /// code at DISPATCH_LEVEL) is the platform's background bugcheck, and
    /// unload raises it, as for the timer and worker threads.
    #[test]
    fn bugcheck_on_the_firmware_thread_is_raised_at_unload() {
        let dev = HostDevice::new(HostDeviceConfig {
            engine: Engine::Thread,
            ..HostDeviceConfig::default()
        })
        .expect("host device");
        let file = dev.open(FILE_READ_ACCESS).expect("open");
        let platform = dev.platform().clone();
        let port_1 = [1u32.to_ne_bytes(), 0u32.to_ne_bytes()].concat();
        file.submit(
            Ioctl::user(IOCTL_IV_QUERY_PORT, &port_1, size_of::<IvQueryPortOut>()),
            move |_, _, _| platform.paged_code(),
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while dev.platform().background_bugcheck().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let check = dev
            .platform()
            .background_bugcheck()
            .expect("the bugcheck on the firmware thread is recorded");
        assert_eq!(check.code, codes::DRIVER_IRQL_NOT_LESS_OR_EQUAL, "{check}");
        // The request's completion routine never returned: the file would
        // wait for it at close.
        std::mem::forget(file);
        let at_unload = catch_bugcheck(|| dev.unload()).expect_err("unload raises it");
        assert_eq!(at_unload, check);
    }
}
