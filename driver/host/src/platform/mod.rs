//! The host platform: [`irpverbs_core::Platform`] over threads, emulating
//! KMDF's execution model under a checking verifier.
//!
//! Each host thread is a processor with its own IRQL (thread-local), DPC
//! queue and held spin locks. I/O queue callbacks run inside
//! [`HostPlatform::run_at_dispatch`], interrupts inside
//! [`HostPlatform::interrupt`]; DPCs run when a thread's IRQL drops below
//! DISPATCH_LEVEL; timers fire on a timer thread (or inline, on a virtual
//! clock); work items run at PASSIVE_LEVEL on a worker thread.
//!
//! # The verifier
//!
//! On by default ([`VerifierConfig::enabled`]). A broken rule is a
//! *bugcheck*: a panic carrying a [`BugCheck`] with the Windows code and
//! parameters, which [`catch_bugcheck`] turns back into a value. Object ids
//! stand in for addresses in parameters. With the verifier off none of the
//! checks run (and no tracking tables are touched); the emulation itself
//! behaves the same.
//!
//! | Rule broken | Code | Param 1 | Other params |
//! |---|---|---|---|
//! | `raise_irql` to a lower IRQL (or > HIGH_LEVEL) | 0xC4 | 0x30 | IRQL, requested |
//! | `lower_irql` to a higher IRQL; below DISPATCH inside a DPC | 0xC4 | 0x31 | IRQL, requested, 0 / 1 = in DPC |
//! | spin lock acquired above DISPATCH_LEVEL | 0xC4 | 0x42 | IRQL, lock |
//! | kernel speed-path queue lock taken below DISPATCH_LEVEL | 0xC4 | 0x40 | IRQL, lock |
//! | spin lock released at IRQL != DISPATCH_LEVEL | 0xC4 | 0x32 | IRQL, lock |
//! | spin lock released to an IRQL above DISPATCH_LEVEL | 0xC4 | 0x31 | IRQL, requested |
//! | spin lock acquired recursively (self-deadlock) | 0xC4 | 0x1000 | lock |
//! | lock hierarchy: rank <= a held lock's rank | 0xC4 | 0x1001 | lock, held lock |
//! | spin locks released out of order | 0xC4 | 0x1003 | lock, lock to release first |
//! | spin lock released by a non-owner thread | 0xC4 | 0x1004 | lock, owner, thread |
//! | spin lock released but not held | 0xC4 | 0x1007 | lock |
//! | zero-byte pool charge | 0xC4 | 0x00 | IRQL, pool type |
//! | pool charge above DISPATCH_LEVEL | 0xC4 | 0x02 | IRQL, pool type, bytes |
//! | pool release above DISPATCH_LEVEL | 0xC4 | 0x12 | IRQL, pool type, charge |
//! | release of a charge never made | 0xC4 | 0x10 | charge |
//! | charge released twice | 0xC4 | 0x13 | 0, charge, tag |
//! | charge released with other bytes | 0xC4 | 0x13F | charge, bytes, charged bytes |
//! | charge released with another tag | 0xC2 | 0x0A | charge, tag, free tag |
//! | pool charge with tag 0 | 0xC2 | 0x9B | pool type, bytes |
//! | unload with pool still charged | 0xC4 | 0x62 | 0, bytes, count |
//! | wait above DISPATCH_LEVEL | 0xC4 | 0x120 | IRQL, event, timeout |
//! | wait at DISPATCH_LEVEL, no timeout | 0xC4 | 0x121 | IRQL, event, timeout |
//! | wait at DISPATCH_LEVEL, non-zero timeout | 0xC4 | 0x122 | IRQL, event, timeout |
//! | event set above DISPATCH_LEVEL | 0xC4 | 0x80 | IRQL, event |
//! | an API above its IRQL (timer, work item, cancel, mark) | 0xC4 | 0xE5 | IRQL |
//! | ISR returned at another IRQL | 0xC4 | 0x111 | 0, IRQL before, after |
//! | `paged_code()` above APC_LEVEL | 0xD1 | 0 | IRQL, 8 (execute) |
//! | request completed twice | 0x44 | request | |
//! | request completed while still cancelable | 0xC9 | 0x07 | cancel routine, request |
//! | request completed above DISPATCH_LEVEL | 0xC9 | 0x0E | IRQL, request |
//! | success with information > output length | 0x10D | 0x6 | 0x4, request, information |
//! | marked cancelable twice (host-defined) | 0x10D | 0x6 | 0x1001, request |
//! | unmarked while not cancelable (host-defined) | 0x10D | 0x6 | 0x1002, request |
//! | callback (DPC, cancel routine, I/O callback, work item) returned at another IRQL | 0x10D | 0xE | IRQL called, returned |
//! | request still held when its file closes | 0xC4 | 0x135 | request, 0, file |
//! | user range pinned, ring mapped or unmapped above APC_LEVEL | 0xC4 | 0xE5 | IRQL |
//! | file closes with a ring still mapped into its process | 0x76 | 0x0 | file, count, 0 |
//! | file closes with user pages still pinned in its process | 0x76 | 0x0 | file, count, 1 |
//! | a process exits with a ring still mapped into it | 0x76 | 0x0 | process, count, 2 |
//! | a process exits with user pages still pinned in it | 0x76 | 0x0 | process, count, 3 |
//! | a ring unmapped from, a mapping made in, or memory pinned in an exited process (host-defined) | 0xC4 | 0x2002 | process, mapping, 0 |
//! | a ring mapping undone twice (or never made) | 0x76 | 0x1 | mapping |
//! | unload with a request outstanding | 0xCE | request | 0, 0, count |
//! | unload with a timer armed | 0xC7 | 0x0 | timer, 0, count |
//! | unload with the device object still referenced (a kernel ULP's interface) | 0xCE | 0 | 0, 0, count |
//! | unload with a work item queued or running | 0xCE | work item | 0, 0, count |
//! | the device leaves D0 while the driver holds a request from a power-managed queue | 0x9F | 0x3 | 0, 0, request |
//! | a global allocator's block misaligned for its layout (host-defined, [`expool`]) | 0xC4 | 0x2001 | address, alignment, pool type |
//! | panic on a host thread (timer, worker, soft HCA firmware) | 0x7E | 0 | |
//! | a DPC routine (a timer's too) past the watchdog's allotment ([`DpcWatchdog`]) | 0x133 | 0 | count, allotment, 0 = work units / 1 = ms |
//! | a dispatch-level callback past the watchdog's allotment | 0x133 | 1 | allotment, count, 0 = work units / 1 = ms |
//!
//! Choices where Windows has no exact match: KMDF only traces and breaks
//! into the debugger when a cancelable request is completed, so the host
//! raises what the I/O verifier raises for the same misuse at the IRP level
//! (0xC9/0x07, IoCompleteRequest with the cancel routine still set). A
//! request still held at close would, on Windows, keep the file object
//! alive after the I/O manager cancelled it at cleanup; the host reports it
//! as Driver Verifier's "cancelled IRP not completed in time" (0xC4/0x135).
//! Host mode has one address space, and models processes only as the
//! identities requests carry ([`RequestParams::process`]): each pin and
//! mapping is counted against the process of the request that made it.
//! Windows stops a process that exits with pages a driver locked in it with
//! 0x76; [`HostPlatform::process_exited`] (the address space's teardown)
//! raises the same for what is left in the exiting process, and from then
//! on any touch of that process's address space is a bugcheck. The close
//! of a file is also checked, more strictly: irpverbs undoes a file's
//! pins and mappings by its cleanup.
//!
//! The low-resources simulation ([`VerifierConfig::fail_pool`]) refuses
//! pool charges pseudo-randomly (splitmix64 from a seed): the nth charge's
//! fate depends only on the seed and n, so a single-threaded run replays.

mod bugcheck;
mod event;
pub mod expool;
pub mod heap;
mod irql;
pub mod pci;
mod pool;
pub(crate) mod probe;
mod processor;
mod request;
mod spinlock;
mod timer;
mod work;

#[cfg(test)]
mod tests;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use irpverbs_abi::NtStatus;
use irpverbs_core::platform::{
    APC_LEVEL, DEVICE_LEVEL, DISPATCH_LEVEL, FileKey, Irql, LockClass, PASSIVE_LEVEL, Platform,
    PoolCharge, PoolTag, ProcessKey,
};

pub use bugcheck::{
    BugCheck, bad_pool, bugcheck, catch_bugcheck, code_name, codes, dma, dpc_watchdog, iomanager,
    locked_pages, power, verifier, wdf,
};
pub use event::{EventKind, HostEvent};
pub use irql::{Dpc, HIGH_LEVEL, check_callback_irql, current_irql};
pub use pool::{ChargeSite, NON_PAGED_POOL_NX, PoolStats, TagUsage, tag_str};
pub use processor::TargetedDpc;
pub use request::{
    CancelRoutine, Completion, CompletionRoutine, HOST_PROCESS, HostRequest, KeptNotify,
    RequestHandle, RequestParams, kept_notify,
};
pub use spinlock::{HostSpinLock, RawSpinLock, speed_lock_check};
pub use timer::{HostTimer, TimerClock};
pub use work::WorkItem;

use bugcheck::stop;

/// Driver Verifier's low-resources simulation: refuse about one pool charge
/// in `one_in`, pseudo-randomly from `seed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultInjection {
    /// The seed; the same seed refuses the same charges (by order).
    pub seed: u64,
    /// One charge in this many fails on average; 0 never fails, 1 always.
    pub one_in: u32,
}

/// The DPC watchdog's allotments (Windows: `DPC_WATCHDOG_VIOLATION`,
/// 0x133). Each DPC routine (a timer's too) and each dispatch-level
/// callback ([`HostPlatform::run_at_dispatch`]: I/O queue callbacks, the
/// doorbell scanner's passes) is one slice; the verifier bugchecks when a
/// slice does more work than `max_work` or runs longer than `max_time`.
///
/// Work is what the driver reports with [`HostPlatform::dispatch_work`]
/// (the soft HCA: packets sent and received): a deterministic measure, the
/// same on a loaded two-core machine as on an idle one, so a test can set a
/// tight allotment without flaking. `max_time` is wall-clock time, checked
/// when work is reported and when the slice ends: keep it generous (it
/// measures the machine too).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DpcWatchdog {
    /// Work units one slice may report.
    pub max_work: u64,
    /// Wall-clock time one slice may take (`None`: not checked).
    pub max_time: Option<Duration>,
}

/// What the verifier checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VerifierConfig {
    /// Run the checks (default on). Off, the emulation keeps working and
    /// skips every check and tracking table: cheap, for benchmarks.
    pub enabled: bool,
    /// Fail pool charges on purpose (applies whether or not `enabled`).
    pub fail_pool: Option<FaultInjection>,
    /// The DPC watchdog (with `enabled`); default none.
    pub dpc_watchdog: Option<DpcWatchdog>,
    /// Refuse exactly the nth charge the platform is asked for (from 1;
    /// pool charges and the driver's heap allocations counted together,
    /// [`PoolStats::attempts`]), whether or not `enabled`: what a sweep of
    /// the failure point through a scenario sets.
    pub fail_nth: Option<u64>,
    /// Record the backtrace of every heap charge from the start
    /// ([`HostPlatform::record_charge_sites`]): slow, for a sweep's
    /// counting run.
    pub record_sites: bool,
    /// Let `fail_pool` refuse the driver's heap allocations too (default
    /// on): off, it refuses pool charges only (for a driver whose heap
    /// allocations are not all fallible yet).
    pub fail_heap: bool,
}

impl Default for VerifierConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            fail_pool: None,
            dpc_watchdog: None,
            fail_nth: None,
            record_sites: false,
            fail_heap: true,
        }
    }
}

/// How to build a [`HostPlatform`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostConfig {
    /// The verifier.
    pub verifier: VerifierConfig,
    /// The clock driving timers.
    pub clock: TimerClock,
}

#[derive(Default)]
struct Files {
    open: HashSet<FileKey>,
    /// Outstanding (dispatched, not completed) requests by file.
    outstanding: HashMap<FileKey, BTreeSet<u64>>,
    /// Rings mapped into a process, by mapping id: the file whose request
    /// mapped it, and the process it is mapped into.
    mappings: HashMap<u64, (FileKey, ProcessKey)>,
    /// User pages pinned (`pin_memory` for a user-mode request) and not yet
    /// released, by the file whose request pinned them.
    pins: HashMap<FileKey, usize>,
    /// The same pins, by the process whose pages they lock.
    process_pins: HashMap<ProcessKey, usize>,
    /// Processes whose address space is gone ([`HostPlatform::process_exited`]).
    exited: HashSet<ProcessKey>,
}

/// Counts one pin out of `count`'s entry for `key`, removing it at 0.
fn uncount<K: std::hash::Hash + Eq>(count: &mut HashMap<K, usize>, key: &K) {
    if let Some(n) = count.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            count.remove(key);
        }
    }
}

impl Files {
    /// Requests the driver holds, of every file: how many, and one of them
    /// (0 when none).
    fn held(&self) -> (usize, u64) {
        let count = self.outstanding.values().map(BTreeSet::len).sum();
        let first = self
            .outstanding
            .values()
            .find_map(|ids| ids.first().copied())
            .unwrap_or(0);
        (count, first)
    }
}

/// The owner of a user-mode pin's region: releasing it (the region's last
/// reference) unlocks the pages, which the verifier counts.
struct HostPin {
    shared: std::sync::Weak<Shared>,
    file: FileKey,
    process: ProcessKey,
}

impl Drop for HostPin {
    fn drop(&mut self) {
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        let mut files = shared.files();
        uncount(&mut files.pins, &self.file);
        uncount(&mut files.process_pins, &self.process);
        drop(files);
        shared.unpinned.notify_all();
    }
}

/// A reference on the device object (`ObReferenceObject` of the WDM device
/// object): while one is held the driver's image is not unloaded. Dropping
/// it is `ObDereferenceObject`.
#[derive(Debug)]
pub struct DeviceReference {
    shared: std::sync::Weak<Shared>,
}

impl Drop for DeviceReference {
    fn drop(&mut self) {
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        let files = shared.files();
        shared.device_references.fetch_sub(1, Ordering::AcqRel);
        drop(files);
        shared.unpinned.notify_all();
    }
}

/// A ring "mapped into the caller's process" (host mode: one address space,
/// so the ring's own addresses), tracked by the verifier until unmapped.
#[derive(Debug)]
pub struct HostMapping {
    id: u64,
}

/// State shared by the platform and the objects it creates.
pub(crate) struct Shared {
    verify: bool,
    config: HostConfig,
    next_id: AtomicU64,
    pool: Arc<pool::Pool>,
    files: Mutex<Files>,
    /// Signalled when a user pin is released, or a device reference.
    unpinned: std::sync::Condvar,
    /// References on the device object (`ObReferenceObject`) not yet
    /// released, under `files`' lock.
    device_references: AtomicU64,
    timers: Arc<timer::Timers>,
    worker: Arc<work::Worker>,
    background: Arc<Mutex<Option<BugCheck>>>,
    /// The hardware seam: the IOMMU model, BARs, MSI-X messages.
    pci: pci::Pci,
}

impl Shared {
    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn files(&self) -> MutexGuard<'_, Files> {
        self.files.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn track_request(&self, file: FileKey, id: u64) {
        heap::uncharged(|| self.files().outstanding.entry(file).or_default().insert(id));
    }

    pub(crate) fn untrack_request(&self, file: FileKey, id: u64) {
        let mut files = self.files();
        if let Some(ids) = files.outstanding.get_mut(&file) {
            ids.remove(&id);
            if ids.is_empty() {
                files.outstanding.remove(&file);
            }
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.timers.shutdown();
        self.worker.shutdown();
    }
}

/// The host platform. Cheap to clone (all clones are the same platform).
#[derive(Clone)]
pub struct HostPlatform {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for HostPlatform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostPlatform")
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl Default for HostPlatform {
    /// Verifier on, real clock.
    fn default() -> Self {
        Self::new(HostConfig::default())
    }
}

impl HostPlatform {
    /// A platform with the given configuration. Threads (timer, worker) are
    /// started when first needed and stopped at [`unload`](Self::unload) or
    /// when the last clone is dropped.
    #[must_use]
    pub fn new(config: HostConfig) -> Self {
        let verify = config.verifier.enabled;
        let background = Arc::new(Mutex::new(None));
        let pool = Arc::new(pool::Pool::new(
            verify,
            config.verifier.fail_pool,
            config.verifier.fail_nth,
            config.verifier.fail_heap,
        ));
        if config.verifier.record_sites {
            pool.record_sites(true);
        }
        Self {
            shared: Arc::new(Shared {
                verify,
                config,
                next_id: AtomicU64::new(1),
                pool: Arc::clone(&pool),
                files: Mutex::new(Files::default()),
                unpinned: std::sync::Condvar::new(),
                device_references: AtomicU64::new(0),
                timers: Arc::new(timer::Timers::new(
                    config.clock,
                    verify,
                    Arc::clone(&background),
                )),
                worker: Arc::new(work::Worker::new(
                    verify,
                    Arc::clone(&background),
                    Some(Arc::clone(&pool)),
                )),
                background,
                pci: pci::Pci::default(),
            }),
        }
    }

    /// The configuration it was built with.
    #[must_use]
    pub fn config(&self) -> HostConfig {
        self.shared.config
    }

    /// Whether the verifier checks run.
    #[must_use]
    pub fn verifier_enabled(&self) -> bool {
        self.shared.verify
    }

    // ---- IRQL --------------------------------------------------------

    /// Raises this thread's IRQL to `new` (KeRaiseIrql); returns the old.
    ///
    /// IRQL: `new` >= current. The verifier bugchecks 0xC4/0x30 otherwise
    /// (or if `new` > HIGH_LEVEL).
    #[track_caller]
    pub fn raise_irql(&self, new: Irql) -> Irql {
        let old = current_irql();
        if self.shared.verify && (new < old || new > HIGH_LEVEL) {
            stop(
                codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
                [verifier::RAISE_IRQL_INVALID, old.into(), new.into(), 0],
                format!("KeRaiseIrql from {old} to {new}"),
            );
        }
        irql::set_irql(new);
        old
    }

    /// Lowers this thread's IRQL to `new` (KeLowerIrql); DPCs queued on this
    /// thread run first if `new` is below DISPATCH_LEVEL.
    ///
    /// IRQL: `new` <= current. The verifier bugchecks 0xC4/0x31 otherwise
    /// (param 4 = 0), or when lowering below DISPATCH_LEVEL inside a DPC
    /// (param 4 = 1).
    #[track_caller]
    pub fn lower_irql(&self, new: Irql) {
        let old = current_irql();
        if self.shared.verify {
            if new > old || new > HIGH_LEVEL {
                stop(
                    codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
                    [verifier::LOWER_IRQL_INVALID, old.into(), new.into(), 0],
                    format!("KeLowerIrql from {old} to {new}"),
                );
            }
            if new < DISPATCH_LEVEL && irql::in_dpc() {
                stop(
                    codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
                    [verifier::LOWER_IRQL_INVALID, old.into(), new.into(), 1],
                    format!("KeLowerIrql to {new} inside a DPC"),
                );
            }
        }
        irql::lower_to(new);
    }

    /// Runs `f` at DISPATCH_LEVEL, as an I/O queue callback (or any
    /// dispatch-level callback) is run, then lowers back, which runs the
    /// DPCs `f` queued. `f` runs as driver code
    /// ([`driver_code`](Self::driver_code)).
    ///
    /// IRQL: <= DISPATCH_LEVEL (0xC4/0x30 above). The verifier bugchecks
    /// 0x10D/0xE if `f` returns at another IRQL.
    #[track_caller]
    pub fn run_at_dispatch<R>(&self, f: impl FnOnce() -> R) -> R {
        let old = self.raise_irql(DISPATCH_LEVEL);
        let outer = self.watchdog().map(|w| irql::begin_slice(false, Some(w)));
        let result = self.driver_code(f);
        if let Some(outer) = outer {
            irql::end_slice(outer);
        }
        irql::check_returned_at(
            self.shared.verify,
            DISPATCH_LEVEL,
            "a dispatch-level callback",
        );
        irql::lower_to(old);
        result
    }

    /// Runs `isr` as an interrupt service routine at DEVICE_LEVEL, then
    /// lowers back; DPCs the ISR queued run once IRQL drops below
    /// DISPATCH_LEVEL (at once if the interrupted thread was below it).
    ///
    /// IRQL: <= DEVICE_LEVEL (0xC4/0x30 above). The verifier bugchecks
    /// 0xC4/0x111 if the ISR returns at another IRQL.
    #[track_caller]
    pub fn interrupt<R>(&self, isr: impl FnOnce() -> R) -> R {
        let old = self.raise_irql(DEVICE_LEVEL);
        let result = self.driver_code(isr);
        let now = current_irql();
        if self.shared.verify && now != DEVICE_LEVEL {
            stop(
                codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
                [
                    verifier::ISR_CHANGED_IRQL,
                    0,
                    DEVICE_LEVEL.into(),
                    now.into(),
                ],
                format!("an ISR returned at IRQL {now}"),
            );
        }
        irql::lower_to(old);
        result
    }

    /// PAGED_CODE(): marks code that may be paged out.
    ///
    /// IRQL: <= APC_LEVEL. Above, the verifier bugchecks as paged-out code
    /// touched at raised IRQL does: 0xD1 (0, IRQL, 8 = execute, 0).
    #[track_caller]
    pub fn paged_code(&self) {
        if self.shared.verify {
            let now = current_irql();
            if now > APC_LEVEL {
                let at = std::panic::Location::caller();
                stop(
                    codes::DRIVER_IRQL_NOT_LESS_OR_EQUAL,
                    [0, now.into(), 8, 0],
                    format!("paged code at {at} run at IRQL {now}"),
                );
            }
        }
    }

    // ---- objects -------------------------------------------------------

    /// A DPC running `routine` at DISPATCH_LEVEL (KeInitializeDpc).
    ///
    /// IRQL: any.
    pub fn new_dpc(&self, routine: impl Fn() + Send + Sync + 'static) -> Dpc {
        Dpc::new(
            self.shared.next_id(),
            Arc::new(routine),
            self.shared.verify,
            self.watchdog(),
            Some(Arc::clone(&self.shared.pool)),
        )
    }

    /// The DPC watchdog, when the verifier runs with one.
    fn watchdog(&self) -> Option<DpcWatchdog> {
        self.shared
            .verify
            .then_some(self.shared.config.verifier.dpc_watchdog)
            .flatten()
    }

    /// Reports `units` of work (the soft HCA: packets sent and received)
    /// done in the DPC routine or dispatch-level callback running on this
    /// thread, for the DPC watchdog ([`DpcWatchdog`]). Outside one (a
    /// thread at PASSIVE_LEVEL between spin lock holds), or without a
    /// watchdog, it does nothing.
    ///
    /// IRQL: any. The verifier bugchecks 0x133 when the slice passes its
    /// allotment (parameter 1: 0 in a DPC, 1 in a dispatch-level callback).
    #[track_caller]
    pub fn dispatch_work(&self, units: u64) {
        irql::charge(units);
    }

    /// A kernel event (KeInitializeEvent).
    ///
    /// IRQL: any.
    #[must_use]
    pub fn new_event(&self, kind: EventKind, signaled: bool) -> HostEvent {
        HostEvent::new(self.shared.next_id(), kind, signaled, self.shared.verify)
    }

    /// A spin lock without data, for the explicit acquire/release form.
    ///
    /// IRQL: any.
    #[must_use]
    pub fn new_raw_lock(&self, class: &'static LockClass) -> RawSpinLock {
        RawSpinLock::new(self.shared.next_id(), class, self.shared.verify)
    }

    /// A timer whose DPC runs `routine` at DISPATCH_LEVEL when due.
    ///
    /// While armed, the platform holds `routine`: a routine that captures
    /// the platform keeps it alive until the timer is cancelled, fires
    /// (one-shot) or the driver unloads.
    ///
    /// IRQL: any.
    pub fn new_timer(&self, routine: impl Fn() + Send + Sync + 'static) -> HostTimer {
        let dpc = self.new_dpc(routine);
        HostTimer::new(self.shared.next_id(), dpc, Arc::clone(&self.shared.timers))
    }

    /// The clock timers run on.
    #[must_use]
    pub fn clock(&self) -> TimerClock {
        self.shared.timers.clock()
    }

    /// Time since the platform was created (real clock) or advanced so far
    /// (virtual clock).
    #[must_use]
    pub fn now(&self) -> Duration {
        self.shared.timers.now()
    }

    /// When the earliest armed timer is due, on the clock of
    /// [`now`](Self::now); `None` when no timer is armed. With the
    /// virtual clock, what a driver of simulated time ([`crate::simwire`])
    /// advances to.
    #[must_use]
    pub fn next_timer_deadline(&self) -> Option<Duration> {
        self.shared.timers.next_deadline()
    }

    /// Virtual clock only: moves time forward by `by`, running every timer
    /// that comes due on this thread, in deadline order, at DISPATCH_LEVEL
    /// (deferred until this thread drops below DISPATCH_LEVEL if it is not
    /// already below).
    ///
    /// # Panics
    /// With [`TimerClock::Real`].
    pub fn advance(&self, by: Duration) {
        self.shared.timers.advance(by);
    }

    /// A work item running `routine` at PASSIVE_LEVEL on the worker thread.
    ///
    /// IRQL: any.
    pub fn new_work_item(&self, routine: impl Fn() + Send + Sync + 'static) -> WorkItem {
        WorkItem::new(
            self.shared.next_id(),
            Arc::new(routine),
            Arc::clone(&self.shared.worker),
        )
    }

    /// Queues a one-off closure to run at PASSIVE_LEVEL on the worker thread
    /// (ExQueueWorkItem).
    ///
    /// IRQL: <= DISPATCH_LEVEL (else 0xC4/0xE5).
    #[track_caller]
    pub fn queue_work(&self, f: impl FnOnce() + Send + 'static) {
        self.shared
            .worker
            .queue_once(self.shared.next_id(), Box::new(f));
    }

    /// Waits until no work item is queued or running.
    ///
    /// IRQL: PASSIVE_LEVEL (else 0xC4/0xE5).
    ///
    /// # Panics
    /// When called from a work item (it would wait for itself).
    #[track_caller]
    pub fn flush_work(&self) {
        irql::check_irql_at_most(self.shared.verify, PASSIVE_LEVEL, "flush_work");
        self.shared.worker.flush();
    }

    // ---- requests and files ---------------------------------------------

    /// Creates a request as the I/O manager dispatches it; it counts as
    /// outstanding on its file until completed. `on_complete` runs once, at
    /// completion; `cancel_routine` is what a cancel of the request calls
    /// once it is marked cancelable (without one, a cancel is only
    /// remembered).
    pub fn new_request(
        &self,
        params: RequestParams,
        on_complete: impl FnOnce(NtStatus, usize, &[u8]) + Send + 'static,
        cancel_routine: Option<CancelRoutine>,
    ) -> HostRequest {
        self.new_request_with(
            params,
            Completion::Routine(Box::new(on_complete)),
            cancel_routine,
        )
    }

    /// [`new_request`](Self::new_request) with any [`Completion`]: a
    /// [`Completion::Keep`] request keeps its result for
    /// [`RequestHandle::take_result`].
    ///
    /// # Panics
    /// Aborts the process, as an infallible allocation does, when the
    /// request's memory is refused ([`Self::try_new_request_with`] fails
    /// instead).
    pub fn new_request_with(
        &self,
        params: RequestParams,
        on_complete: Completion,
        cancel_routine: Option<CancelRoutine>,
    ) -> HostRequest {
        self.try_new_request_with(params, on_complete, cancel_routine)
            .unwrap_or_else(|_| std::alloc::handle_alloc_error(request::request_layout()))
    }

    /// [`new_request_with`](Self::new_request_with), fallibly, as
    /// `IoAllocateIrp`: `Err` with the completion, not run, when the
    /// request's memory is refused (nothing is tracked). The system buffer
    /// is `params.input`: give it room for `output_len` bytes, so that
    /// nothing else allocates.
    pub fn try_new_request_with(
        &self,
        params: RequestParams,
        on_complete: Completion,
        cancel_routine: Option<CancelRoutine>,
    ) -> Result<HostRequest, Completion> {
        let id = self.shared.next_id();
        let file = params.file;
        let request = HostRequest::try_new(
            id,
            Arc::clone(&self.shared),
            params,
            on_complete,
            cancel_routine,
        )?;
        if self.shared.verify {
            self.shared.track_request(file, id);
        }
        Ok(request)
    }

    /// A file (open of the device) was created.
    ///
    /// IRQL: PASSIVE_LEVEL (the host's create path; not checked).
    pub fn file_opened(&self, file: FileKey) {
        if self.shared.verify {
            heap::uncharged(|| self.shared.files().open.insert(file));
        }
    }

    /// The host is delivering the file's close: the driver must hold none
    /// of its requests any more, and have unmapped every ring it mapped for
    /// the file (the process's exit, in host mode).
    ///
    /// IRQL: PASSIVE_LEVEL (the host's close path; not checked).
    ///
    /// The verifier bugchecks 0x76/0x0 (file, count, 1) for user pages
    /// still pinned, 0x76/0x0 (file, count, 0) for a ring still mapped,
    /// 0xC4/0x135 (request, 0, file) for a request still outstanding.
    #[track_caller]
    pub fn file_closing(&self, file: FileKey) {
        if !self.shared.verify {
            return;
        }
        let mut files = self.shared.files();
        files.open.remove(&file);
        let held = files
            .outstanding
            .get(&file)
            .map(|ids| (ids.len(), ids.first().copied().unwrap_or(0)));
        let mapped = files.mappings.values().filter(|&&(f, _)| f == file).count();
        let pinned = files.pins.get(&file).copied().unwrap_or(0);
        drop(files);
        if pinned > 0 {
            stop(
                codes::PROCESS_HAS_LOCKED_PAGES,
                [locked_pages::STILL_LOCKED, file, pinned as u64, 1],
                format!(
                    "file {file} closed with {pinned} user range(s) still pinned in its process"
                ),
            );
        }
        if mapped > 0 {
            stop(
                codes::PROCESS_HAS_LOCKED_PAGES,
                [locked_pages::STILL_LOCKED, file, mapped as u64, 0],
                format!("file {file} closed with {mapped} ring(s) still mapped into its process"),
            );
        }
        if let Some((count, first)) = held {
            stop(
                codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
                [verifier::CANCELLED_IRP_NOT_COMPLETED, first, 0, file],
                format!("file {file} closed while the driver holds {count} of its requests"),
            );
        }
    }

    /// The device is leaving D0 and its I/O queue is power-managed: KMDF
    /// waits for every request the driver holds from the queue before
    /// `EvtDeviceD0Exit` (the driver registers no `EvtIoStop` to hand them
    /// back), so the driver must hold none.
    ///
    /// IRQL: PASSIVE_LEVEL (the host's power path; not checked).
    ///
    /// The verifier bugchecks 0x9F/0x3 (0, 0, request) for a request still
    /// held: on Windows the power transition would wait for it until the
    /// power watchdog fires.
    #[track_caller]
    pub fn power_transition_check(&self) {
        if !self.shared.verify {
            return;
        }
        let (count, first) = self.shared.files().held();
        if count > 0 {
            stop(
                codes::DRIVER_POWER_STATE_FAILURE,
                [power::BLOCKED_IRP, 0, 0, first],
                format!(
                    "the device left D0 while the driver held {count} request(s) from its power-managed queue"
                ),
            );
        }
    }

    // ---- processes -------------------------------------------------------

    /// A new process of host mode's model: a fresh [`ProcessKey`] for the
    /// requests of the handles a test opens or duplicates into it (host
    /// mode has one address space; the process is the identity the driver
    /// binds files, pins and mappings to, and what the verifier counts
    /// them against).
    #[must_use]
    pub fn create_process(&self) -> ProcessKey {
        static NEXT: AtomicU64 = AtomicU64::new(HOST_PROCESS + 1);
        NEXT.fetch_add(1, Ordering::Relaxed)
    }

    /// `process`'s address space is torn down (the end of its exit, after
    /// the process-exit notifications and the close of its handles:
    /// `MmCleanProcessAddressSpace`). From now on the driver must not touch
    /// it.
    ///
    /// IRQL: PASSIVE_LEVEL (the host's exit path; not checked).
    ///
    /// The verifier bugchecks 0x76/0x0 (process, count, 3) for user pages
    /// still pinned in the process, 0x76/0x0 (process, count, 2) for a ring
    /// or doorbell page still mapped into it.
    #[track_caller]
    pub fn process_exited(&self, process: ProcessKey) {
        if !self.shared.verify {
            return;
        }
        let mut files = self.shared.files();
        heap::uncharged(|| files.exited.insert(process));
        let pinned = files.process_pins.get(&process).copied().unwrap_or(0);
        let mapped = files
            .mappings
            .values()
            .filter(|&&(_, p)| p == process)
            .count();
        drop(files);
        if pinned > 0 {
            stop(
                codes::PROCESS_HAS_LOCKED_PAGES,
                [locked_pages::STILL_LOCKED, process, pinned as u64, 3],
                format!("process {process} exited with {pinned} user range(s) still pinned"),
            );
        }
        if mapped > 0 {
            stop(
                codes::PROCESS_HAS_LOCKED_PAGES,
                [locked_pages::STILL_LOCKED, process, mapped as u64, 2],
                format!("process {process} exited with {mapped} mapping(s) still in it"),
            );
        }
    }

    /// User ranges pinned in `process` and not yet released (verifier on;
    /// 0 when off).
    #[must_use]
    pub fn process_pinned(&self, process: ProcessKey) -> usize {
        self.shared
            .files()
            .process_pins
            .get(&process)
            .copied()
            .unwrap_or(0)
    }

    /// Rings and doorbell pages mapped into `process` (verifier on; 0 when
    /// off).
    #[must_use]
    pub fn process_mappings(&self, process: ProcessKey) -> usize {
        self.shared
            .files()
            .mappings
            .values()
            .filter(|&&(_, p)| p == process)
            .count()
    }

    /// Bugchecks 0xC4/0x2002 (process, mapping, 0) when `process` has
    /// exited: the driver is about to touch an address space that is gone.
    #[track_caller]
    fn check_alive(&self, process: ProcessKey, mapping: u64, what: &str) {
        if self.shared.verify && self.shared.files().exited.contains(&process) {
            stop(
                codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
                [verifier::HOST_EXITED_PROCESS_TOUCHED, process, mapping, 0],
                format!("{what} in process {process}, which has exited"),
            );
        }
    }

    /// A reference on the device object, held until dropped.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    #[must_use]
    pub fn reference_device(&self) -> DeviceReference {
        self.shared.device_references.fetch_add(1, Ordering::AcqRel);
        DeviceReference {
            shared: Arc::downgrade(&self.shared),
        }
    }

    /// References on the device object not yet released.
    #[must_use]
    pub fn device_references(&self) -> u64 {
        self.shared.device_references.load(Ordering::Acquire)
    }

    /// Waits until the device object is no longer referenced, or until
    /// `deadline`: the I/O manager's deferred unload.
    ///
    /// IRQL: PASSIVE_LEVEL (a wait).
    pub fn wait_device_unreferenced(&self, deadline: std::time::Instant) {
        self.wait_files(deadline, |_| self.device_references() as usize);
    }

    /// Waits, under the files' lock, until `left` is 0 or `deadline`
    /// passed (woken by pin and device-reference releases): `left`'s last
    /// value.
    fn wait_files(&self, deadline: std::time::Instant, left: impl Fn(&Files) -> usize) -> usize {
        let mut files = self.shared.files();
        loop {
            let n = left(&files);
            let now = std::time::Instant::now();
            if n == 0 || now >= deadline {
                return n;
            }
            files = self
                .shared
                .unpinned
                .wait_timeout(files, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// User ranges pinned for `file`'s requests and not yet released
    /// (verifier on; 0 when off).
    #[must_use]
    pub fn pinned(&self, file: FileKey) -> usize {
        self.shared.files().pins.get(&file).copied().unwrap_or(0)
    }

    /// Waits, at most `timeout`, until no user range pinned for `file`'s
    /// requests is held: what irpverbs.sys's `EvtFileCleanup` does before
    /// the closing process may end. The pins still held (0 when idle).
    ///
    /// IRQL: PASSIVE_LEVEL (a wait).
    pub fn wait_unpinned(&self, file: FileKey, timeout: Duration) -> usize {
        self.wait_files(std::time::Instant::now() + timeout, |files| {
            files.pins.get(&file).copied().unwrap_or(0)
        })
    }

    /// Requests of `file` dispatched and not completed (verifier on; 0 when
    /// off).
    #[must_use]
    pub fn outstanding_requests(&self, file: FileKey) -> usize {
        self.shared
            .files()
            .outstanding
            .get(&file)
            .map_or(0, BTreeSet::len)
    }

    /// Files opened and not yet closed (verifier on; 0 when off).
    #[must_use]
    pub fn open_files(&self) -> usize {
        self.shared.files().open.len()
    }

    // ---- pool and lifetime ------------------------------------------------

    /// A new mapping's id, recorded against `request`'s file and process
    /// (the verifier's own table: uncharged), after checking that the
    /// process is still there.
    #[track_caller]
    fn track_mapping(&self, request: &HostRequest, what: &str) -> u64 {
        use irpverbs_core::Request as _;
        let process = request.address_space();
        self.check_alive(process, 0, what);
        let id = self.shared.next_id();
        if self.shared.verify {
            heap::uncharged(|| {
                self.shared
                    .files()
                    .mappings
                    .insert(id, (request.file(), process))
            });
        }
        id
    }

    /// The I/O manager allocates a request (its IRP and system buffer):
    /// an attempt counted with the driver's charges
    /// ([`VerifierConfig::fail_nth`] can refuse it), but neither refused
    /// by the seeded `fail_pool` (Driver Verifier injects faults into the
    /// verified driver's allocations only) nor accounted to the driver.
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES` when refused.
    pub fn io_manager_allocate(&self) -> Result<(), NtStatus> {
        heap::uncharged(|| self.shared.pool.charge_os())
    }

    /// The pool accounting so far.
    #[must_use]
    pub fn pool_stats(&self) -> PoolStats {
        heap::uncharged(|| self.shared.pool.stats())
    }

    /// Runs `f` as driver code: what it allocates through the global
    /// allocator is charged to this platform's pool (see [`heap`]). The
    /// host runs the driver's entry points (I/O callbacks, DPCs, timers,
    /// work items, the firmware and doorbell threads) inside it.
    pub fn driver_code<R>(&self, f: impl FnOnce() -> R) -> R {
        heap::driver(&self.shared.pool, f)
    }

    /// Runs `f` as the platform's own code (what Windows does with its own
    /// memory): nothing it allocates is charged, even when called from
    /// driver code.
    pub fn os_code<R>(&self, f: impl FnOnce() -> R) -> R {
        heap::uncharged(f)
    }

    /// Starts recording a backtrace of every heap charge (`on`), or stops
    /// and returns what was recorded: where a scenario's allocations are
    /// made. Slow; for a sweep's counting run.
    pub fn record_charge_sites(&self, on: bool) -> Vec<ChargeSite> {
        heap::uncharged(|| self.shared.pool.record_sites(on))
    }

    /// Driver Verifier's leak check for the driver's heap: the blocks its
    /// code allocated through the global allocator and has not freed. The
    /// host device runs it once the driver's device object is gone
    /// ([`crate::HostDevice::remove`]), since the device's own memory
    /// lives until then.
    ///
    /// The verifier bugchecks 0xC4/0x62 (0, bytes, count) for any left.
    #[track_caller]
    pub fn check_heap_leaks(&self) {
        let stats = self.pool_stats();
        if self.shared.verify && stats.heap_live > 0 {
            stop(
                codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
                [
                    verifier::POOL_LEAK_AT_UNLOAD,
                    0,
                    stats.heap_live_bytes as u64,
                    stats.heap_live as u64,
                ],
                format!(
                    "driver gone with {} heap block(s) ({} bytes) it allocated still live",
                    stats.heap_live, stats.heap_live_bytes
                ),
            );
        }
    }

    /// Runs `f` on a host-owned thread (the host device's firmware thread):
    /// a bugcheck or panic in it is recorded as the
    /// [`background_bugcheck`](Self::background_bugcheck) (first one wins),
    /// which [`unload`](Self::unload) raises, and the thread goes on.
    pub(crate) fn run_guarded(&self, thread: &str, f: impl FnOnce()) {
        bugcheck::run_guarded(&self.shared.background, thread, f);
    }

    /// The first bugcheck raised on a host thread (timer, worker, soft HCA
    /// firmware), if any.
    #[must_use]
    pub fn background_bugcheck(&self) -> Option<BugCheck> {
        self.shared
            .background
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The driver unloads: checks that it left nothing behind, then disarms
    /// timers, drops queued work and stops the platform's threads. Nothing
    /// should be used after it (timers would no longer fire, nor work items
    /// run).
    ///
    /// IRQL: PASSIVE_LEVEL (else 0xC4/0xE5). The verifier first re-raises a
    /// bugcheck a host thread hit, then bugchecks 0xCE for an outstanding
    /// request, 0xC7/0x0 for an armed timer, 0xCE for a queued or running
    /// work item, and 0xC4/0x62 for pool still charged.
    #[track_caller]
    pub fn unload(&self) {
        let shared = &self.shared;
        if shared.verify {
            irql::check_irql_at_most(true, PASSIVE_LEVEL, "unload");
            if let Some(check) = self.background_bugcheck() {
                bugcheck(check);
            }
            let (count, first) = shared.files().held();
            if count > 0 {
                stop(
                    codes::DRIVER_UNLOADED_WITHOUT_CANCELLING_PENDING_OPERATIONS,
                    [first, 0, 0, count as u64],
                    format!("unload with {count} request(s) outstanding"),
                );
            }
            let references = self.device_references();
            if references > 0 {
                stop(
                    codes::DRIVER_UNLOADED_WITHOUT_CANCELLING_PENDING_OPERATIONS,
                    [0, 0, 0, references],
                    format!(
                        "unload with the device object referenced {references} time(s): \
                         a kernel ULP still holds the interface into the driver's code"
                    ),
                );
            }
            let armed = shared.timers.armed();
            if let Some(&first) = armed.first() {
                stop(
                    codes::TIMER_OR_DPC_INVALID,
                    [0, first, 0, armed.len() as u64],
                    format!("unload with {} timer(s) armed", armed.len()),
                );
            }
            self.check_dma_released();
            let (pending, first) = shared.worker.pending();
            if pending > 0 {
                stop(
                    codes::DRIVER_UNLOADED_WITHOUT_CANCELLING_PENDING_OPERATIONS,
                    [first, 0, 0, pending as u64],
                    format!("unload with {pending} work item(s) queued or running"),
                );
            }
            if let Some((irql, bytes)) = shared.pool.heap_above_dispatch() {
                stop(
                    codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
                    [
                        verifier::ALLOCATE_ABOVE_DISPATCH,
                        irql.into(),
                        NON_PAGED_POOL_NX,
                        bytes as u64,
                    ],
                    format!("the driver allocated {bytes} bytes of heap at IRQL {irql}"),
                );
            }
            let stats = self.pool_stats();
            if stats.live > 0 {
                let tags: Vec<String> = stats
                    .by_tag
                    .iter()
                    .map(|(&tag, u)| format!("{} x{} ({} bytes)", tag_str(tag), u.count, u.bytes))
                    .collect();
                stop(
                    codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
                    [
                        verifier::POOL_LEAK_AT_UNLOAD,
                        0,
                        stats.live_bytes as u64,
                        stats.live as u64,
                    ],
                    format!(
                        "unload with {} pool charge(s) live: {}",
                        stats.live,
                        tags.join(", ")
                    ),
                );
            }
        }
        shared.timers.shutdown();
        shared.worker.shutdown();
    }
}

impl Platform for HostPlatform {
    type Request = HostRequest;
    type Lock<T: Send> = HostSpinLock<T>;

    fn new_lock<T: Send>(&self, class: &'static LockClass, value: T) -> HostSpinLock<T> {
        HostSpinLock::new(self.new_raw_lock(class), value)
    }

    fn irql(&self) -> Irql {
        current_irql()
    }

    /// [`HostPlatform::now`] in nanoseconds: the real or virtual clock
    /// timers run on.
    ///
    /// IRQL: any.
    fn now_ns(&self) -> u64 {
        u64::try_from(self.now().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Charges tagged nonpaged pool.
    ///
    /// IRQL: <= DISPATCH_LEVEL. The verifier bugchecks 0xC4/0x02 above,
    /// 0xC4/0x00 for zero bytes, 0xC2/0x9B for a zero tag.
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES` when the low-resources simulation
    /// refuses it.
    #[track_caller]
    fn pool_charge(&self, tag: PoolTag, bytes: usize) -> Result<PoolCharge, NtStatus> {
        heap::uncharged(|| self.shared.pool.charge(tag, bytes))
    }

    /// Gives a charge back.
    ///
    /// IRQL: <= DISPATCH_LEVEL. The verifier bugchecks 0xC4/0x12 above,
    /// 0xC4/0x10 for a charge never made, 0xC4/0x13 for one already
    /// released, 0xC4/0x13F for other bytes, 0xC2/0x0A for another tag.
    #[track_caller]
    fn pool_release(&self, charge: PoolCharge) {
        heap::uncharged(|| self.shared.pool.release(charge));
    }

    /// Host mode has one address space and no paging to pin against: the
    /// region is the caller's own memory, and a "physical" address (kernel
    /// callers) is an identity-mapped one. The caller's promise — the
    /// registration contract — is that the memory stays allocated until the
    /// MR is deregistered. The range is probed first, as
    /// `MmProbeAndLockPages` does ([`probe`]): mapped, readable, and
    /// writable when `write`.
    ///
    /// IRQL: a user-mode range at <= APC_LEVEL, as `MmProbeAndLockPages`
    /// requires (the verifier bugchecks 0xC4/0xE5 above); a kernel range at
    /// <= DISPATCH_LEVEL.
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER` for address 0 or a length the host cannot
    /// address; `STATUS_ACCESS_VIOLATION` for a range that is not mapped
    /// with the access asked for.
    #[allow(unsafe_code)]
    #[track_caller]
    fn pin_memory(
        &self,
        request: &HostRequest,
        addr: u64,
        length: u64,
        write: bool,
        _physical: bool,
    ) -> Result<irpverbs_ring::Shared<irpverbs_ring::Region>, NtStatus> {
        use irpverbs_core::Request as _;
        let max = match request.requestor_mode() {
            irpverbs_core::RequestorMode::User => APC_LEVEL,
            irpverbs_core::RequestorMode::Kernel => DISPATCH_LEVEL,
        };
        irql::check_irql_at_most(self.shared.verify, max, "pin_memory");
        let len = usize::try_from(length).map_err(|_| irpverbs_abi::STATUS_INVALID_PARAMETER)?;
        if addr == 0 {
            return Err(irpverbs_abi::STATUS_INVALID_PARAMETER);
        }
        // What MmProbeAndLockPages checks: every page mapped, readable, and
        // writable when the HCA may write. One address space: a kernel
        // ULP's range (and an identity-mapped "physical" one) is probed the
        // same way, so that a device that reads the pages cannot fault.
        probe::probe_range(addr, length, write)?;
        // A user range is locked in its process until the region goes: the
        // verifier counts it against the request's file.
        let owner: Option<Box<dyn std::any::Any + Send + Sync>> = if self.shared.verify
            && request.requestor_mode() == irpverbs_core::RequestorMode::User
        {
            let process = request.address_space();
            self.check_alive(process, 0, "user memory pinned");
            // The lock's bookkeeping is the system's memory, as the MDL:
            // the count's table is the platform's, never charged to the
            // driver's heap.
            heap::uncharged(|| {
                let mut files = self.shared.files();
                *files.pins.entry(request.file()).or_default() += 1;
                *files.process_pins.entry(process).or_default() += 1;
            });
            Some(heap::uncharged(|| {
                Box::new(HostPin {
                    shared: Arc::downgrade(&self.shared),
                    file: request.file(),
                    process,
                }) as Box<dyn std::any::Any + Send + Sync>
            }))
        } else {
            None
        };
        // SAFETY: in host mode the ULP registering memory shares this address
        // space; by registering it promises the range is valid, and stays
        // so until deregistration, and is accessed by the HCA only through
        // this region (the contract `Region::from_raw_parts` states).
        let region = unsafe { irpverbs_ring::Region::from_raw_parts(addr as *mut u8, len, owner) };
        // The MDL is the system's memory.
        let region = region.ok_or(irpverbs_abi::STATUS_INVALID_PARAMETER)?;
        heap::uncharged(|| irpverbs_ring::Shared::try_new(region))
            .map_err(|_| irpverbs_abi::STATUS_INSUFFICIENT_RESOURCES)
    }

    type Mapping = HostMapping;

    /// One address space: the ring is "mapped" at its own addresses. The
    /// verifier records the mapping against the request's file until
    /// [`Platform::unmap_ring`], and checks it is gone when the file closes.
    ///
    /// IRQL: <= APC_LEVEL (the verifier bugchecks 0xC4/0xE5 above), as a
    /// user mapping (`MmMapLockedPagesSpecifyCache(UserMode)`) requires.
    ///
    /// # Errors
    /// None in host mode.
    #[track_caller]
    fn map_ring(
        &self,
        request: &HostRequest,
        ring: &irpverbs_ring::Ring,
    ) -> Result<(irpverbs_abi::IvRingMap, HostMapping), NtStatus> {
        irql::check_irql_at_most(self.shared.verify, APC_LEVEL, "map_ring");
        let id = self.track_mapping(request, "a ring mapped");
        Ok((ring.map(), HostMapping { id }))
    }

    /// One address space: the doorbell page is "mapped" at its own address,
    /// recorded by the verifier as a ring mapping is.
    ///
    /// IRQL: <= APC_LEVEL (the verifier bugchecks 0xC4/0xE5 above).
    ///
    /// # Errors
    /// None in host mode.
    #[track_caller]
    fn map_doorbell_page(
        &self,
        request: &HostRequest,
        page: &irpverbs_ring::Shared<irpverbs_ring::Region>,
    ) -> Result<(u64, HostMapping), NtStatus> {
        irql::check_irql_at_most(self.shared.verify, APC_LEVEL, "map_doorbell_page");
        let id = self.track_mapping(request, "a doorbell page mapped");
        Ok((page.addr(), HostMapping { id }))
    }

    /// Forgets the mapping.
    ///
    /// IRQL: <= APC_LEVEL (else 0xC4/0xE5). The verifier bugchecks 0x76/0x1
    /// for a mapping it does not know (undone twice), 0xC4/0x2002 for one
    /// in a process that has exited (whose address space is gone).
    #[track_caller]
    fn unmap_ring(&self, mapping: HostMapping) {
        irql::check_irql_at_most(self.shared.verify, APC_LEVEL, "unmap_ring");
        if !self.shared.verify {
            return;
        }
        let Some((_, process)) = self.shared.files().mappings.remove(&mapping.id) else {
            stop(
                codes::PROCESS_HAS_LOCKED_PAGES,
                [locked_pages::NOT_LOCKED, mapping.id, 0, 0],
                format!("ring mapping {} undone but not mapped", mapping.id),
            );
        };
        self.check_alive(process, mapping.id, "a mapping undone");
    }
}
