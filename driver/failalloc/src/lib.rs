//! # irpverbs failalloc (tests only)
//!
//! A global allocator that forwards to the system's and, when armed, fails
//! one chosen allocation of the current thread: what Driver Verifier's
//! low-resources simulation does to a driver, made exact so that a test can
//! sweep the failure point through a path, one allocation at a time.
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOC: irpverbs_failalloc::FailAlloc = irpverbs_failalloc::FailAlloc;
//!
//! for n in 0.. {
//!     let (result, failed) = irpverbs_failalloc::failing_nth(n, || create_something());
//!     // `result` must be a clean failure when `failed`, else a success;
//!     if !failed { break } // the path makes fewer than n + 1 allocations
//! }
//! ```
//!
//! Only the armed thread sees failures (tests run on several threads);
//! allocations of other threads are untouched. An allocation or
//! reallocation that fails returns null, as the kernel's pool does: code
//! that allocates infallibly then aborts the test process (Rust's
//! allocation error handler), which is how a sweep finds it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The allocator. Install it with `#[global_allocator]` in a test crate.
pub struct FailAlloc;

/// The current thread's state: allocations left before the one that fails
/// (`None`: disarmed), allocations counted while armed, and whether the
/// chosen one failed.
struct Arm {
    left: Cell<Option<u64>>,
    counted: Cell<u64>,
    failed: Cell<bool>,
}

thread_local! {
    static ARM: Arm = const {
        Arm {
            left: Cell::new(None),
            counted: Cell::new(0),
            failed: Cell::new(false),
        }
    };
}

/// Counts an allocation; true when it is the one to fail.
fn should_fail() -> bool {
    // `try_with`: during the thread's teardown the state may be gone; its
    // allocations then go through.
    ARM.try_with(|a| {
        let Some(left) = a.left.get() else {
            return false;
        };
        a.counted.set(a.counted.get() + 1);
        if left == 0 {
            a.left.set(None);
            a.failed.set(true);
            true
        } else {
            a.left.set(Some(left - 1));
            false
        }
    })
    .unwrap_or(false)
}

// SAFETY: every method forwards to `System` with the caller's arguments,
// which carry `GlobalAlloc`'s contract unchanged, or returns null (a failed
// allocation, which the contract allows) without touching memory.
unsafe impl GlobalAlloc for FailAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if should_fail() {
            return core::ptr::null_mut();
        }
        // SAFETY: forwarded (see the impl).
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if should_fail() {
            return core::ptr::null_mut();
        }
        // SAFETY: forwarded (see the impl).
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded (see the impl).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if should_fail() {
            return core::ptr::null_mut();
        }
        // SAFETY: forwarded (see the impl).
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Runs `f` armed with `left` allocations before the one to fail; returns
/// what `f` returned, the allocations counted and whether one failed.
fn armed<R>(left: u64, f: impl FnOnce() -> R) -> (R, u64, bool) {
    ARM.with(|a| {
        a.left.set(Some(left));
        a.counted.set(0);
        a.failed.set(false);
    });
    let r = f();
    let (counted, failed) = ARM.with(|a| {
        a.left.set(None);
        (a.counted.get(), a.failed.get())
    });
    (r, counted, failed)
}

/// Runs `f` with the current thread's allocation number `n` (from 0,
/// counting allocations and reallocations) failing, and only that one.
/// Returns what `f` returned, and whether the failure happened (false: `f`
/// made at most `n` allocations, so a sweep from 0 is complete).
///
/// Only meaningful with [`FailAlloc`] installed as the global allocator.
pub fn failing_nth<R>(n: u64, f: impl FnOnce() -> R) -> (R, bool) {
    let (r, _, failed) = armed(n, f);
    (r, failed)
}

/// Runs `f` counting the current thread's allocations (none fails);
/// returns what `f` returned and the count.
///
/// Only meaningful with [`FailAlloc`] installed as the global allocator.
pub fn counting<R>(f: impl FnOnce() -> R) -> (R, u64) {
    let (r, counted, _) = armed(u64::MAX, f);
    (r, counted)
}

/// Sweeps the failure point through `f`: runs `f` with allocation `n`
/// failing for n = 0, 1, ... until a run's allocations all succeed (the
/// path makes fewer than n + 1), then returns n: how many runs had an
/// allocation fail.
///
/// `f` runs armed, so it should do only the work under test; `check` runs
/// disarmed after each run, with n, what `f` returned and whether an
/// allocation failed, to check the outcome (and repair state for the next
/// run).
pub fn sweep<R>(mut f: impl FnMut() -> R, mut check: impl FnMut(u64, R, bool)) -> u64 {
    let mut n = 0;
    loop {
        let (r, failed) = failing_nth(n, &mut f);
        check(n, r, failed);
        if !failed {
            return n;
        }
        n += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[global_allocator]
    static ALLOC: FailAlloc = FailAlloc;

    #[test]
    fn fails_exactly_the_chosen_allocation() {
        let try_three = || {
            let mut got = [false; 3];
            for g in &mut got {
                let mut v: Vec<u8> = Vec::new();
                *g = v.try_reserve_exact(16).is_ok();
            }
            got
        };
        let (got, failed) = failing_nth(1, try_three);
        assert!(failed);
        assert_eq!(got, [true, false, true]);
        let (got, failed) = failing_nth(3, try_three);
        assert!(!failed);
        assert_eq!(got, [true; 3]);
        let (_, n) = counting(try_three);
        assert_eq!(n, 3);
        let runs = sweep(try_three, |n, got, failed| {
            assert_eq!(failed, n < 3);
            assert_eq!(got.iter().filter(|ok| !**ok).count(), usize::from(failed));
        });
        assert_eq!(runs, 3);
    }

    #[test]
    fn other_threads_are_untouched() {
        use std::sync::atomic::{AtomicBool, Ordering};
        static GO: AtomicBool = AtomicBool::new(false);
        static DONE: AtomicBool = AtomicBool::new(false);
        let other = std::thread::spawn(|| {
            while !GO.load(Ordering::Acquire) {
                std::hint::spin_loop();
            }
            let mut v: Vec<u8> = Vec::new();
            let ok = v.try_reserve_exact(16).is_ok();
            DONE.store(true, Ordering::Release);
            ok
        });
        // This thread is armed to fail its next allocation, and makes none
        // while the other thread allocates.
        let ((), failed) = failing_nth(0, || {
            GO.store(true, Ordering::Release);
            while !DONE.load(Ordering::Acquire) {
                std::hint::spin_loop();
            }
        });
        assert!(!failed);
        assert!(other.join().unwrap_or(false));
    }
}
