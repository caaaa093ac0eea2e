//! The emulated processor: each host thread is one processor with its own
//! IRQL, DPC queue and list of spin locks held.
//!
//! Everything here is thread-local, so the hot paths (`current_irql`, the
//! raise/lower inside a spin lock) are a `Cell` read or write.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use irpverbs_core::platform::{DISPATCH_LEVEL, Irql};

use super::DpcWatchdog;
use super::bugcheck::{codes, dpc_watchdog, stop, verifier, wdf};
use super::heap;
use super::pool::Pool;

/// HIGH_LEVEL on x64: the highest IRQL there is.
pub const HIGH_LEVEL: Irql = 15;

/// A spin lock this thread holds (tracked only for verifier-enabled locks).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Held {
    pub id: u64,
    pub rank: u16,
    pub name: &'static str,
}

/// One emulated processor (its IRQL and the count of its queued DPCs
/// are [`IRQL`] and [`QUEUED`]).
struct Cpu {
    /// DPCs queued on this processor, run when IRQL drops below DISPATCH.
    dpcs: RefCell<VecDeque<Dpc>>,
    /// How many DPC routines are running on this thread (nesting).
    dpc_depth: Cell<u32>,
    /// Verifier-tracked spin locks held, in acquisition order.
    held: RefCell<Vec<Held>>,
    /// A process-unique thread number (0 = not assigned yet).
    token: Cell<u64>,
}

thread_local! {
    /// This processor's IRQL. Apart from [`CPU`]: a thread-local without a
    /// destructor is one load or store (every spin lock raises and lowers
    /// it; `CPU`'s collections make each access of it check that its
    /// destructor is registered).
    static IRQL: Cell<Irql> = const { Cell::new(0) };
    /// How many DPCs `CPU.dpcs` holds (lowering IRQL looks only at this).
    static QUEUED: Cell<usize> = const { Cell::new(0) };
    static CPU: Cpu = const {
        Cpu {
            dpcs: RefCell::new(VecDeque::new()),
            dpc_depth: Cell::new(0),
            held: RefCell::new(Vec::new()),
            token: Cell::new(0),
        }
    };
}

static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

/// The DPC watchdog's measure of the slice (a DPC routine, or a
/// dispatch-level callback) running on this thread.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Meter {
    /// The allotment; `None`: no slice, or no watchdog.
    watchdog: Option<DpcWatchdog>,
    /// A DPC routine (else a dispatch-level callback).
    dpc: bool,
    /// Work reported so far.
    work: u64,
    /// When the slice began (with a time allotment).
    start: Option<std::time::Instant>,
}

impl Meter {
    const IDLE: Self = Self {
        watchdog: None,
        dpc: false,
        work: 0,
        start: None,
    };

    /// Bugchecks 0x133 when the slice passed its allotment of work or
    /// time.
    #[track_caller]
    fn check(&self) {
        let Some(w) = self.watchdog else { return };
        let kind = if self.dpc {
            dpc_watchdog::SINGLE_DPC
        } else {
            dpc_watchdog::CUMULATIVE
        };
        let what = if self.dpc {
            "a DPC routine"
        } else {
            "a dispatch-level callback"
        };
        let over = |count: u64, allotted: u64, unit: u64, name: &str| {
            let (p2, p3) = if self.dpc {
                (count, allotted)
            } else {
                (allotted, count)
            };
            stop(
                codes::DPC_WATCHDOG_VIOLATION,
                [kind, p2, p3, unit],
                format!("{what} ran {count} {name}, past the DPC watchdog's {allotted}"),
            );
        };
        if self.work > w.max_work {
            over(self.work, w.max_work, dpc_watchdog::UNIT_WORK, "work units");
        }
        if let (Some(max), Some(start)) = (w.max_time, self.start) {
            let ran = start.elapsed();
            if ran > max {
                let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
                over(ms(ran), ms(max), dpc_watchdog::UNIT_MS, "ms");
            }
        }
    }
}

thread_local! {
    /// The slice running on this thread, for the DPC watchdog.
    static METER: Cell<Meter> = const { Cell::new(Meter::IDLE) };
}

/// Begins a slice (a DPC routine when `dpc`, else a dispatch-level
/// callback) measured against `watchdog`; returns the enclosing slice's
/// meter, for [`end_slice`].
#[inline]
pub(crate) fn begin_slice(dpc: bool, watchdog: Option<DpcWatchdog>) -> Meter {
    let start = watchdog
        .and_then(|w| w.max_time)
        .map(|_| std::time::Instant::now());
    METER.replace(Meter {
        watchdog,
        dpc,
        work: 0,
        start,
    })
}

/// Ends the slice running on this thread (checking its time) and goes
/// back to the enclosing one, `outer`.
#[inline]
#[track_caller]
pub(crate) fn end_slice(outer: Meter) {
    let done = METER.replace(outer);
    if done.watchdog.is_some() {
        done.check();
    }
}

/// Adds `units` of work to the slice running on this thread, and checks
/// its allotment.
#[inline]
#[track_caller]
pub(crate) fn charge(units: u64) {
    let mut m = METER.get();
    if m.watchdog.is_none() {
        return;
    }
    m.work = m.work.saturating_add(units);
    METER.set(m);
    m.check();
}

/// The calling thread's (processor's) IRQL.
///
/// IRQL: any.
#[must_use]
#[inline]
pub fn current_irql() -> Irql {
    IRQL.with(Cell::get)
}

/// Sets this thread's IRQL without any check and without running DPCs.
#[inline]
pub(crate) fn set_irql(new: Irql) {
    IRQL.with(|i| i.set(new));
}

/// Lowers (or sets) this thread's IRQL to `new`; if that is below
/// DISPATCH_LEVEL, runs this processor's queued DPCs first, at
/// DISPATCH_LEVEL. No checks.
#[inline]
pub(crate) fn lower_to(new: Irql) {
    if new < DISPATCH_LEVEL && QUEUED.with(Cell::get) != 0 {
        drain_dpcs();
    }
    set_irql(new);
}

/// True if a DPC routine is running on this thread.
pub(crate) fn in_dpc() -> bool {
    CPU.with(|c| c.dpc_depth.get() > 0)
}

/// This thread's token (for lock-owner checks).
pub(crate) fn thread_token() -> u64 {
    CPU.with(|c| {
        let t = c.token.get();
        if t != 0 {
            return t;
        }
        let t = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
        c.token.set(t);
        t
    })
}

/// Runs `f` with this thread's held-lock list.
pub(crate) fn with_held<R>(f: impl FnOnce(&mut Vec<Held>) -> R) -> R {
    heap::uncharged(|| CPU.with(|c| f(&mut c.held.borrow_mut())))
}

/// Runs every queued DPC at DISPATCH_LEVEL, including ones they queue.
#[inline(never)]
fn drain_dpcs() {
    set_irql(DISPATCH_LEVEL);
    loop {
        let next = CPU.with(|c| c.dpcs.borrow_mut().pop_front());
        let Some(dpc) = next else { break };
        QUEUED.with(|q| q.set(q.get() - 1));
        dpc.run_now();
    }
}

/// What [`catch_bugcheck`](super::catch_bugcheck) puts back.
pub(crate) struct SavedState {
    irql: Irql,
    held: usize,
    dpc_depth: u32,
    meter: Meter,
}

pub(crate) fn save_state() -> SavedState {
    CPU.with(|c| SavedState {
        irql: current_irql(),
        held: c.held.borrow().len(),
        dpc_depth: c.dpc_depth.get(),
        meter: METER.get(),
    })
}

pub(crate) fn restore_state(saved: SavedState) {
    set_irql(saved.irql);
    METER.set(saved.meter);
    CPU.with(|c| {
        c.held.borrow_mut().truncate(saved.held);
        c.dpc_depth.set(saved.dpc_depth);
    });
}

/// Checks a callback came back at the IRQL it was called at (KMDF's
/// WDF_VIOLATION 0xE check).
#[track_caller]
pub(crate) fn check_returned_at(verify: bool, called_at: Irql, what: &str) {
    if verify {
        let now = current_irql();
        if now != called_at {
            stop(
                codes::WDF_VIOLATION,
                [wdf::VERIFIER_IRQL_MISMATCH, called_at.into(), now.into(), 0],
                format!("{what} was called at IRQL {called_at} and returned at IRQL {now}"),
            );
        }
    }
}

/// Checks that a callback into another driver (a kernel ULP's) is called
/// at the IRQL its contract states, `want` (0xC4/0xE5 otherwise). IRQL: any.
#[track_caller]
pub fn check_callback_irql(verify: bool, want: Irql, what: &str) {
    if verify {
        let now = current_irql();
        if now != want {
            stop(
                codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
                [verifier::API_AT_WRONG_IRQL, now.into(), want.into(), 0],
                format!("{what} called at IRQL {now}; its contract is IRQL {want}"),
            );
        }
    }
}

/// Checks a kernel API allowed at <= `max` IRQL (0xC4/0xE5 otherwise).
#[track_caller]
pub(crate) fn check_irql_at_most(verify: bool, max: Irql, api: &str) {
    if verify {
        let now = current_irql();
        if now > max {
            stop(
                codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
                [verifier::API_AT_WRONG_IRQL, now.into(), 0, 0],
                format!("{api} called at IRQL {now}; allowed at <= {max}"),
            );
        }
    }
}

struct DpcInner {
    id: u64,
    queued: AtomicBool,
    routine: Arc<dyn Fn() + Send + Sync>,
    verify: bool,
    watchdog: Option<DpcWatchdog>,
    /// The pool the routine's allocations are charged to (a driver's DPC).
    pool: Option<Arc<Pool>>,
}

/// A deferred procedure call (KDPC): a routine run once at DISPATCH_LEVEL
/// each time it is queued.
///
/// Queued on the processor (thread) that inserts it; it runs when that
/// thread's IRQL drops below DISPATCH_LEVEL, or at once if it already is
/// below. Cloning gives another handle to the same DPC object.
#[derive(Clone)]
pub struct Dpc {
    inner: Arc<DpcInner>,
}

impl std::fmt::Debug for Dpc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dpc")
            .field("id", &self.inner.id)
            .field("queued", &self.is_queued())
            .finish_non_exhaustive()
    }
}

impl Dpc {
    pub(crate) fn new(
        id: u64,
        routine: Arc<dyn Fn() + Send + Sync>,
        verify: bool,
        watchdog: Option<DpcWatchdog>,
        pool: Option<Arc<Pool>>,
    ) -> Self {
        Self {
            inner: Arc::new(DpcInner {
                id,
                queued: AtomicBool::new(false),
                routine,
                verify,
                watchdog,
                pool,
            }),
        }
    }

    /// Queues the DPC on the current processor (KeInsertQueueDpc).
    ///
    /// Returns `false` if it was already queued (it will run once). If the
    /// caller is below DISPATCH_LEVEL it runs before `insert` returns
    /// (raise, run, lower); otherwise when this thread's IRQL next drops
    /// below DISPATCH_LEVEL.
    ///
    /// IRQL: any.
    pub fn insert(&self) -> bool {
        if self.inner.queued.swap(true, Ordering::AcqRel) {
            return false;
        }
        // The processor's DPC queue is the kernel's, not the driver's.
        heap::uncharged(|| CPU.with(|c| c.dpcs.borrow_mut().push_back(self.clone())));
        QUEUED.with(|q| q.set(q.get() + 1));
        let irql = current_irql();
        if irql < DISPATCH_LEVEL {
            lower_to(irql);
        }
        true
    }

    /// True while queued and not yet started.
    #[must_use]
    pub fn is_queued(&self) -> bool {
        self.inner.queued.load(Ordering::Acquire)
    }

    /// Runs the routine now; the caller is at DISPATCH_LEVEL.
    fn run_now(&self) {
        self.inner.queued.store(false, Ordering::Release);
        CPU.with(|c| c.dpc_depth.set(c.dpc_depth.get() + 1));
        // Without a watchdog the slice is not measured (nothing to do).
        let outer = self.inner.watchdog.map(|w| begin_slice(true, Some(w)));
        match &self.inner.pool {
            Some(pool) => heap::driver(pool, || (self.inner.routine)()),
            None => (self.inner.routine)(),
        }
        if let Some(outer) = outer {
            end_slice(outer);
        }
        CPU.with(|c| c.dpc_depth.set(c.dpc_depth.get() - 1));
        check_returned_at(self.inner.verify, DISPATCH_LEVEL, "a DPC routine");
        // A DPC that (with the verifier off) left IRQL elsewhere is put
        // back at DISPATCH_LEVEL for the next one.
        set_irql(DISPATCH_LEVEL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use irpverbs_core::platform::PASSIVE_LEVEL;
    use std::sync::atomic::AtomicUsize;

    fn counting_dpc(count: &Arc<AtomicUsize>) -> Dpc {
        let c = Arc::clone(count);
        Dpc::new(
            1,
            Arc::new(move || {
                assert_eq!(current_irql(), DISPATCH_LEVEL);
                c.fetch_add(1, Ordering::SeqCst);
            }),
            true,
            None,
            None,
        )
    }

    #[test]
    fn dpc_runs_at_once_below_dispatch() {
        let count = Arc::new(AtomicUsize::new(0));
        let dpc = counting_dpc(&count);
        assert!(dpc.insert());
        assert_eq!(count.load(Ordering::SeqCst), 1);
        assert_eq!(current_irql(), PASSIVE_LEVEL);
    }

    #[test]
    fn dpc_waits_for_irql_to_drop_and_coalesces() {
        let count = Arc::new(AtomicUsize::new(0));
        let dpc = counting_dpc(&count);
        set_irql(DISPATCH_LEVEL);
        assert!(dpc.insert());
        assert!(!dpc.insert(), "already queued");
        assert!(dpc.is_queued());
        assert_eq!(count.load(Ordering::SeqCst), 0);
        lower_to(PASSIVE_LEVEL);
        assert_eq!(count.load(Ordering::SeqCst), 1);
        assert!(!dpc.is_queued());
    }
}
