//! The verifier's view of the Rust heap: while driver code runs on a
//! thread, every allocation it makes through the global allocator is
//! charged to the platform's pool, as if taken with `ExAllocatePool2`.
//!
//! # How
//!
//! [`DriverHeap`] is the process's global allocator (the crate installs it
//! with the default feature `global-allocator`). Every block it hands out
//! carries a one-word header in front of it holding the pool it is charged
//! to (null: uncharged). The thread-local "charge to" pool is set while
//! driver code runs ([`driver`]: I/O callbacks, DPCs and timers, work
//! items, the firmware and doorbell threads, the wire's receive; set by the
//! host platform and device) and cleared again while the platform's own
//! bookkeeping runs ([`uncharged`]), so what stands in for Windows is never
//! charged to the driver.
//!
//! - Allocation: one thread-local read when no pool is set. With one set,
//!   the pool is asked first (the low-resources simulation may refuse:
//!   the allocation returns null, which `try_reserve` and the fallible
//!   constructors turn into an error and anything infallible into an
//!   abort), then the header records the pool (holding a reference on it).
//! - Free: the header says which pool to credit, whatever thread frees it
//!   and whether or not it runs driver code.
//! - Reallocation: the old block's charge is credited and the new size is
//!   charged to the pool of the context that grows it (uncharged outside
//!   driver code); a refused charge leaves the old block untouched.
//!
//! A black-box injection for the whole process ([`arm_process_injection`])
//! counts every allocation through the global allocator, on any thread and
//! in any code but the platform's own bookkeeping ([`uncharged`] scopes),
//! and refuses the Nth: what a sweep of a C ULP's scenario drives
//! (`IRPVERBS_FAIL_NTH_ALLOC` in the host C library).
//!
//! Allocating above DISPATCH_LEVEL cannot bugcheck from inside the
//! allocator (unwinding out of it is undefined behaviour): the pool
//! records it and [`super::HostPlatform::unload`] raises it (0xC4/0x02).
#![allow(unsafe_code, reason = "a global allocator")]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::pool::Pool;

/// A thread's allocation context.
struct Context {
    /// The pool this thread's allocations are charged to (null: none).
    charge_to: Cell<*const Pool>,
    /// The platform's own bookkeeping runs ([`uncharged`]): the
    /// process-wide injection ([`arm_process_injection`]) neither counts
    /// nor refuses its allocations.
    exempt: Cell<bool>,
}

thread_local! {
    static CONTEXT: Context = const {
        Context {
            charge_to: Cell::new(ptr::null()),
            exempt: Cell::new(false),
        }
    };
}

/// Allocations and reallocations of the process so far.
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

/// Allocations and reallocations the process made so far through the
/// global allocator (all threads, charged or not). Zero if the crate's
/// `global-allocator` feature is off.
#[must_use]
pub fn process_allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}

/// Sets this thread's context for its lifetime, then puts back the
/// previous one.
struct Scope {
    previous: *const Pool,
    was_exempt: bool,
}

impl Scope {
    fn enter(pool: *const Pool, exempt: bool) -> Self {
        CONTEXT.with(|c| Self {
            previous: c.charge_to.replace(pool),
            was_exempt: c.exempt.replace(exempt),
        })
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        CONTEXT.with(|c| {
            c.charge_to.set(self.previous);
            c.exempt.set(self.was_exempt);
        });
    }
}

/// Runs `f` as driver code: what it allocates through the global allocator
/// is charged to `pool` (and may be refused by its low-resources
/// simulation). Nests; the previous context comes back when `f` returns or
/// unwinds.
pub(crate) fn driver<R>(pool: &Arc<Pool>, f: impl FnOnce() -> R) -> R {
    let _scope = Scope::enter(Arc::as_ptr(pool), false);
    f()
}

/// Runs `f` uncharged: the platform's own bookkeeping (what Windows does
/// with its own memory, or without any: timer and DPC queues, request
/// tracking, the verifier's tables) called from driver code. Exempt from
/// the process-wide injection ([`arm_process_injection`]): the verifier's
/// own work never fails.
#[inline]
pub(crate) fn uncharged<R>(f: impl FnOnce() -> R) -> R {
    let _scope = Scope::enter(ptr::null(), true);
    f()
}

/// Runs `f` as code that is neither the driver's nor the platform's
/// bookkeeping (the issuer's completion routine, called by the I/O
/// manager's completion): uncharged, and subject to the process-wide
/// injection like any code outside the driver.
#[inline]
pub(crate) fn outside<R>(f: impl FnOnce() -> R) -> R {
    let _scope = Scope::enter(ptr::null(), false);
    f()
}

/// True while this thread runs driver code.
#[must_use]
pub fn in_driver_code() -> bool {
    !CONTEXT.with(|c| c.charge_to.get()).is_null()
}

/// The process-wide injection is counting (armed, with or without an
/// allocation to refuse).
static COUNTING: AtomicBool = AtomicBool::new(false);
/// The allocation to refuse (from 1; 0: none, counting only).
static REFUSE: AtomicU64 = AtomicU64::new(0);
/// Allocations counted since the injection was armed.
static COUNTED: AtomicU64 = AtomicU64::new(0);
/// The refused allocation, once refused.
static REFUSED: Mutex<Option<Refusal>> = Mutex::new(None);

/// The allocation the process-wide injection refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Its index among the allocations counted since arming (from 1).
    pub index: u64,
    /// Its size in bytes.
    pub bytes: usize,
    /// Where it was made: the first function of irpverbs above the
    /// allocator and the fallible-allocation helpers (`crate::path::fn
    /// (file.rs:line)`), or `?` when the backtrace has none.
    pub site: String,
}

/// What the process-wide injection saw.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InjectionReport {
    /// Allocations counted since it was armed.
    pub counted: u64,
    /// The one it refused, if it did.
    pub refused: Option<Refusal>,
}

/// Arms a black-box failure injection for the whole process: from now on
/// every allocation and reallocation through the global allocator, on any
/// thread, charged to a driver or not (the driver, the host device, the
/// Win32 subset, a ULP's Rust code), is counted, and the `refuse`-th (from
/// 1; `None`: count only) returns null — a fallible allocation reports it,
/// an infallible one aborts the process. The platform's own bookkeeping
/// ([`uncharged`] scopes: the verifier's and the pool's tables, timer and
/// DPC queues, request tracking) is exempt: neither counted nor refused.
///
/// The refusal is reported on stderr at once (`irpverbs: allocation N
/// refused (B bytes) at SITE`), so that a run that then aborts still names
/// its site, and kept for [`disarm_process_injection`]. Re-arming starts
/// the count again. Without the `global-allocator` feature nothing is
/// counted.
pub fn arm_process_injection(refuse: Option<u64>) {
    COUNTING.store(false, Ordering::SeqCst);
    *REFUSED.lock().unwrap_or_else(PoisonError::into_inner) = None;
    COUNTED.store(0, Ordering::SeqCst);
    REFUSE.store(refuse.unwrap_or(0), Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
}

/// Stops the process-wide injection and reports what it saw.
pub fn disarm_process_injection() -> InjectionReport {
    COUNTING.store(false, Ordering::SeqCst);
    REFUSE.store(0, Ordering::SeqCst);
    InjectionReport {
        counted: COUNTED.load(Ordering::SeqCst),
        refused: REFUSED
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone(),
    }
}

/// Counts an allocation for the process-wide injection: true if it is the
/// one to refuse.
#[inline]
fn injected(bytes: usize) -> bool {
    if !COUNTING.load(Ordering::Relaxed) || CONTEXT.with(|c| c.exempt.get()) {
        return false;
    }
    let index = COUNTED.fetch_add(1, Ordering::Relaxed) + 1;
    if index != REFUSE.load(Ordering::Relaxed) {
        return false;
    }
    // The record's own allocations (the backtrace, its text) are exempt.
    uncharged(|| record_refusal(index, bytes));
    true
}

#[cold]
fn record_refusal(index: u64, bytes: usize) {
    let backtrace = std::backtrace::Backtrace::force_capture().to_string();
    let site = site_of(&backtrace).unwrap_or_else(|| "?".to_owned());
    eprintln!("irpverbs: allocation {index} refused ({bytes} bytes) at {site}");
    *REFUSED.lock().unwrap_or_else(PoisonError::into_inner) = Some(Refusal { index, bytes, site });
}

/// The first frame of a backtrace's text that is irpverbs code (a crate of
/// it, or a file of the workspace) and not the allocator, the reference
/// counts or the fallible-allocation helpers: `path::fn (file.rs:line)`.
#[must_use]
pub fn site_of(backtrace: &str) -> Option<String> {
    let mut lines = backtrace.lines().peekable();
    while let Some(line) = lines.next() {
        let Some((_, symbol)) = line.trim_start().split_once(": ") else {
            continue;
        };
        let name = symbol.trim_start_matches('<');
        let path = lines
            .peek()
            .and_then(|l| l.trim_start().strip_prefix("at "))
            .unwrap_or_default();
        // The C library's exports have unmangled names: known by their file.
        let export = !name.contains("::") && path.contains("ulp/host-c/");
        // A frame of the workspace (its files are named relative to it).
        let file = path.split(':').next().unwrap_or_default();
        let ours =
            name.starts_with("irpverbs") || (file.starts_with("./") && file.ends_with(".rs"));
        let helper = name.starts_with("irpverbs_host::platform::heap::")
            || name.starts_with("irpverbs_ring::shared::")
            || name.contains("::fallible::");
        if !ours || helper {
            continue;
        }
        let file = path.rsplit('/').next().unwrap_or(path);
        let mut parts = file.split(':');
        let at = match (parts.next(), parts.next()) {
            (Some(f), Some(l)) => format!("{f}:{l}"),
            _ => String::new(),
        };
        let name = if export {
            format!("irpverbs_host_c::{name}")
        } else {
            name.to_owned()
        };
        return Some(format!("{name} ({at})"));
    }
    None
}

/// The header in front of every block: the pool it is charged to.
const WORD: usize = size_of::<usize>();

/// Bytes in front of a block of `layout`: one word, or the alignment if
/// larger (the block stays aligned).
#[inline]
fn header(layout: Layout) -> usize {
    layout.align().max(WORD)
}

/// The underlying layout: header plus block.
#[inline]
fn outer(layout: Layout) -> Option<Layout> {
    let size = layout.size().checked_add(header(layout))?;
    Layout::from_size_align(size, header(layout)).ok()
}

/// Charges `bytes` to the current pool, if any: `Ok(pool)` (null when
/// uncharged), `Err(())` when the pool refuses.
#[inline]
fn charge(bytes: usize) -> Result<*const Pool, ()> {
    let pool = CONTEXT.with(|c| c.charge_to.get());
    if pool.is_null() {
        return Ok(pool);
    }
    // SAFETY: a non-null charge-to pool is set only by `driver`, whose
    // `Arc` outlives the scope; `Pool` is `Sync`.
    let p = unsafe { &*pool };
    // The pool's own work (site records) is uncharged.
    let ok = uncharged(|| p.charge_heap(bytes));
    if !ok {
        return Err(());
    }
    // SAFETY: `pool` comes from `Arc::as_ptr` of a live `Arc<Pool>`
    // (above); the reference taken here is given back in `credit`.
    unsafe { Arc::increment_strong_count(pool) };
    Ok(pool)
}

/// Credits `bytes` back to `pool` (null: nothing) and drops the reference
/// the charge took.
#[inline]
fn credit(pool: *const Pool, bytes: usize) {
    if pool.is_null() {
        return;
    }
    // SAFETY: `pool` holds the reference `charge` took, so it is live.
    unsafe { &*pool }.release_heap(bytes);
    // The pool may go here (its last reference): its own frees are
    // uncharged blocks.
    // SAFETY: gives back the reference `charge` took.
    uncharged(|| unsafe { Arc::decrement_strong_count(pool) });
}

/// Writes the header of the block at `block` (one word before it).
///
/// # Safety
/// `block` is a block of ours: a word-aligned header precedes it.
#[inline]
unsafe fn set_pool(block: *mut u8, pool: *const Pool) {
    // SAFETY: the caller's contract: the word before `block` is ours.
    let header = unsafe { block.sub(WORD) }.cast::<*const Pool>();
    // SAFETY: in our block, aligned (the header is a multiple of the word
    // size, the block at least word-aligned).
    unsafe { header.write(pool) };
}

/// Reads the header of the block at `block`.
///
/// # Safety
/// As [`set_pool`], with the header written.
#[inline]
unsafe fn pool_of(block: *mut u8) -> *const Pool {
    // SAFETY: the caller's contract: the word before `block` is ours.
    let header = unsafe { block.sub(WORD) }.cast::<*const Pool>();
    // SAFETY: written by `set_pool` when the block was made; aligned.
    unsafe { header.read() }
}

/// The host's global allocator: the system allocator, with the driver's
/// allocations charged to its platform's pool (see the module docs).
#[derive(Debug, Default)]
pub struct DriverHeap;

impl DriverHeap {
    /// `alloc` or `alloc_zeroed` through `get`.
    ///
    /// # Safety
    /// `GlobalAlloc::alloc`'s contract.
    #[inline]
    unsafe fn allocate(&self, layout: Layout, get: impl FnOnce(Layout) -> *mut u8) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        let Some(outer) = outer(layout) else {
            return ptr::null_mut();
        };
        if injected(layout.size()) {
            return ptr::null_mut();
        }
        let Ok(pool) = charge(layout.size()) else {
            return ptr::null_mut();
        };
        let base = get(outer);
        if base.is_null() {
            credit(pool, layout.size());
            return base;
        }
        // SAFETY: `outer` has room for the header before the block.
        let block = unsafe { base.add(header(layout)) };
        // SAFETY: `block` is ours, the header in front of it.
        unsafe { set_pool(block, pool) };
        block
    }
}

// SAFETY: every block is a system allocation of the outer layout (header +
// block, aligned to at least the block's alignment), handed out at the
// header's end, so it has the caller's size and alignment; `dealloc` and
// `realloc` undo the offset with the same layout the caller passes back.
// Charging only touches atomics and the thread-local, and never unwinds.
unsafe impl GlobalAlloc for DriverHeap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded contract; `System.alloc` gets a non-zero size.
        unsafe { self.allocate(layout, |o| System.alloc(o)) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        unsafe { self.allocate(layout, |o| System.alloc_zeroed(o)) }
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        // SAFETY: `block` came from this allocator with `layout`.
        let pool = unsafe { pool_of(block) };
        credit(pool, layout.size());
        let h = header(layout);
        // SAFETY: `block` is `h` bytes into the system block.
        let base = unsafe { block.sub(h) };
        // SAFETY: the outer layout `outer` computed (successfully) when the
        // block was made: size + h does not overflow, h is a power of two.
        let outer = unsafe { Layout::from_size_align_unchecked(layout.size() + h, h) };
        // SAFETY: `base` was allocated by `System` with `outer`.
        unsafe { System.dealloc(base, outer) };
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        let h = header(layout);
        let Some(new_outer) = new_size.checked_add(h) else {
            return ptr::null_mut();
        };
        if Layout::from_size_align(new_outer, h).is_err() || injected(new_size) {
            return ptr::null_mut();
        }
        // SAFETY: `block` came from this allocator with `layout`.
        let old_pool = unsafe { pool_of(block) };
        let Ok(new_pool) = charge(new_size) else {
            return ptr::null_mut();
        };
        // SAFETY: `block` is `h` bytes into the system block.
        let old_base = unsafe { block.sub(h) };
        // SAFETY: the outer layout the block was made with (see `dealloc`).
        let old_outer = unsafe { Layout::from_size_align_unchecked(layout.size() + h, h) };
        // SAFETY: `old_base` was allocated by `System` with `old_outer`;
        // the new outer size was checked above, with the same alignment.
        let base = unsafe { System.realloc(old_base, old_outer, new_outer) };
        if base.is_null() {
            credit(new_pool, new_size);
            return base;
        }
        credit(old_pool, layout.size());
        // SAFETY: the new system block has the header's room in front.
        let block = unsafe { base.add(h) };
        // SAFETY: as in `allocate`.
        unsafe { set_pool(block, new_pool) };
        block
    }
}

#[cfg(all(test, feature = "global-allocator"))]
mod tests {
    use std::time::Duration;

    use super::super::{
        HostConfig, HostPlatform, TimerClock, VerifierConfig, catch_bugcheck, codes, verifier,
    };
    use super::in_driver_code;

    fn failing_nth(n: u64) -> HostPlatform {
        HostPlatform::new(HostConfig {
            verifier: VerifierConfig {
                fail_nth: Some(n),
                ..VerifierConfig::default()
            },
            clock: TimerClock::Virtual,
        })
    }

    #[test]
    fn driver_allocations_are_charged_and_credited_wherever_freed() {
        let p = HostPlatform::default();
        assert!(!in_driver_code());
        let (a, b) = p.driver_code(|| {
            assert!(in_driver_code());
            (vec![1u8; 100], Box::new([7u64; 4]))
        });
        assert!(!in_driver_code());
        let s = p.pool_stats();
        assert_eq!(
            (s.heap_live, s.heap_live_bytes, s.heap_charges),
            (2, 132, 2)
        );
        // Freed outside driver code, and on another thread.
        drop(a);
        std::thread::spawn(move || drop(b)).join().unwrap();
        let s = p.pool_stats();
        assert_eq!((s.heap_live, s.heap_live_bytes), (0, 0));
        // Outside driver code nothing is charged.
        let c = vec![0u8; 64];
        assert_eq!(p.pool_stats().heap_charges, 2);
        drop(c);
        p.check_heap_leaks();
    }

    #[test]
    fn reallocation_moves_the_charge() {
        let p = HostPlatform::default();
        // Grown by driver code: charged at its new size.
        let mut v: Vec<u8> = Vec::with_capacity(8);
        p.driver_code(|| v.reserve_exact(100));
        let cap = v.capacity();
        let s = p.pool_stats();
        assert_eq!((s.heap_live, s.heap_live_bytes), (1, cap));
        // Grown outside: the charge is credited, the block uncharged.
        v.reserve_exact(cap + 50);
        let s = p.pool_stats();
        assert_eq!((s.heap_live, s.heap_live_bytes), (0, 0));
        drop(v);
    }

    #[test]
    fn the_nth_charge_is_refused_and_nothing_else() {
        let p = failing_nth(3);
        let (first, second, third, fourth) = p.driver_code(|| {
            let mut v: Vec<u8> = Vec::new();
            let mut w: Vec<u8> = Vec::new();
            let mut x: Vec<u8> = Vec::new();
            let mut y: Vec<u8> = Vec::new();
            (
                v.try_reserve(10).map(|()| v),
                w.try_reserve(10).map(|()| w),
                x.try_reserve(10).map(|()| x),
                y.try_reserve(10).map(|()| y),
            )
        });
        assert!(first.is_ok() && second.is_ok() && fourth.is_ok());
        assert!(third.is_err(), "the third charge is refused");
        let s = p.pool_stats();
        assert_eq!((s.attempts, s.injected_failures, s.heap_live), (4, 1, 3));
        drop((first, second, fourth));
        p.check_heap_leaks();
    }

    #[test]
    fn a_refused_reallocation_keeps_the_block() {
        let p = failing_nth(2);
        let mut v: Vec<u8> = Vec::new();
        let grown = p.driver_code(|| {
            v.try_reserve_exact(4).unwrap();
            v.extend_from_slice(b"abcd");
            v.try_reserve_exact(1000)
        });
        assert!(grown.is_err());
        assert_eq!(v, b"abcd");
        assert_eq!(p.pool_stats().heap_live_bytes, 4);
        drop(v);
        p.check_heap_leaks();
    }

    #[test]
    fn a_block_kept_past_the_driver_is_a_leak() {
        let p = HostPlatform::default();
        let kept = p.driver_code(|| vec![0u32; 10]);
        let check = catch_bugcheck(|| p.check_heap_leaks()).expect_err("a leak");
        assert_eq!(check.code, codes::DRIVER_VERIFIER_DETECTED_VIOLATION);
        assert_eq!(check.params[0], verifier::POOL_LEAK_AT_UNLOAD);
        assert_eq!((check.params[2], check.params[3]), (40, 1));
        drop(kept);
        p.check_heap_leaks();
    }

    #[test]
    fn the_platforms_own_work_is_not_charged() {
        let p = HostPlatform::new(HostConfig {
            clock: TimerClock::Virtual,
            ..HostConfig::default()
        });
        let timer = p.new_timer(|| {});
        let dpc = p.new_dpc(|| {});
        p.driver_code(|| {
            // The kernel's timer table, DPC queue and work queue.
            for i in 0..100 {
                timer.set(Duration::from_millis(i), None);
                dpc.insert();
            }
            p.queue_work(|| {});
        });
        p.flush_work();
        timer.cancel();
        // The work item's closure is the driver's (a `Box` it made) and
        // has been freed.
        let s = p.pool_stats();
        assert_eq!(s.heap_live, 0, "{s:?}");
    }

    #[test]
    fn dpcs_and_work_items_run_as_driver_code() {
        let p = HostPlatform::default();
        let dpc = p.new_dpc(|| assert!(in_driver_code()));
        dpc.insert();
        p.queue_work(|| assert!(in_driver_code()));
        p.flush_work();
        assert!(p.background_bugcheck().is_none());
    }
}
