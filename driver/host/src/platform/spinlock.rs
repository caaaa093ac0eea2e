//! Spin locks (KSPIN_LOCK / WDFSPINLOCK) with Driver Verifier's IRQL and
//! deadlock-detection checks.

use std::cell::UnsafeCell;
use std::hint;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;

use irpverbs_core::platform::{DISPATCH_LEVEL, Irql, LockClass, SpinLock};

use super::bugcheck::{codes, stop, verifier};
use super::irql::{self, Held};

/// Busy-wait iterations before a waiter starts yielding its (host) CPU: the
/// holder may have been preempted, which a real processor at
/// DISPATCH_LEVEL never is.
const SPINS_BEFORE_YIELD: u32 = 64;

/// A spin lock with no data: the explicit KeAcquireSpinLock /
/// KeReleaseSpinLock interface.
#[derive(Debug)]
pub struct RawSpinLock {
    locked: AtomicBool,
    /// Owning thread's token while held (verifier only).
    owner: AtomicU64,
    id: u64,
    class: &'static LockClass,
    verify: bool,
}

impl RawSpinLock {
    pub(crate) const fn new(id: u64, class: &'static LockClass, verify: bool) -> Self {
        Self {
            locked: AtomicBool::new(false),
            owner: AtomicU64::new(0),
            id,
            class,
            verify,
        }
    }

    /// The lock's id (what bugcheck parameters show as its address).
    #[must_use]
    pub const fn id(&self) -> u64 {
        self.id
    }

    /// Its class in the lock hierarchy.
    #[must_use]
    pub const fn class(&self) -> &'static LockClass {
        self.class
    }

    /// Acquires the lock, raising to DISPATCH_LEVEL (KeAcquireSpinLock);
    /// returns the IRQL to give back to [`release`](Self::release).
    ///
    /// IRQL: <= DISPATCH_LEVEL. The verifier bugchecks (0xC4) above
    /// DISPATCH_LEVEL (0x42), on a recursive acquisition (0x1000) and on
    /// one that breaks the lock hierarchy: a lock whose rank is not greater
    /// than every rank this thread holds (0x1001).
    // Inlined, with the verifier's work out of line: every lock of the
    // driver comes through here (callgrind: 40 instructions fewer per
    // lock hold than as calls).
    #[inline]
    #[track_caller]
    pub fn acquire(&self) -> Irql {
        let old = irql::current_irql();
        if self.verify {
            self.check_acquire(old);
        }
        if old < DISPATCH_LEVEL {
            irql::set_irql(DISPATCH_LEVEL);
        }
        self.spin();
        if self.verify {
            self.note_acquired();
        }
        old
    }

    /// The verifier's record of this thread holding the lock.
    #[cold]
    #[inline(never)]
    fn note_acquired(&self) {
        self.owner.store(irql::thread_token(), Ordering::Relaxed);
        irql::with_held(|held| {
            held.push(Held {
                id: self.id,
                rank: self.class.rank,
                name: self.class.name,
            });
        });
    }

    /// Releases the lock and goes back to `old` (KeReleaseSpinLock); DPCs
    /// queued meanwhile run if `old` is below DISPATCH_LEVEL.
    ///
    /// IRQL: DISPATCH_LEVEL. The verifier bugchecks (0xC4) when this thread
    /// does not hold the lock (0x1007, or 0x1004 if another thread does),
    /// when IRQL is not DISPATCH_LEVEL (0x32), when `old` is above
    /// DISPATCH_LEVEL (0x31), when a lock acquired later is still held
    /// (0x1003), and inside a DPC when `old` is below DISPATCH_LEVEL (0x31).
    #[inline]
    #[track_caller]
    pub fn release(&self, old: Irql) {
        if self.verify {
            self.check_release(old);
            self.note_released();
        }
        self.locked.store(false, Ordering::Release);
        irql::lower_to(old);
    }

    /// The verifier's record of the release.
    #[cold]
    #[inline(never)]
    fn note_released(&self) {
        self.owner.store(0, Ordering::Relaxed);
        irql::with_held(|held| {
            held.pop();
        });
    }

    /// Releases without checks and without running DPCs: used when a
    /// bugcheck unwinds through a closure-form lock, so tests can go on.
    fn force_release(&self, old: Irql) {
        if self.verify {
            irql::with_held(|held| {
                if let Some(pos) = held.iter().rposition(|h| h.id == self.id) {
                    held.remove(pos);
                }
            });
            self.owner.store(0, Ordering::Relaxed);
        }
        self.locked.store(false, Ordering::Release);
        irql::set_irql(old);
    }

    #[inline]
    fn spin(&self) {
        if self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.contended();
        }
    }

    /// [`Self::spin`] when the lock was taken (or the weak exchange failed).
    #[cold]
    #[inline(never)]
    fn contended(&self) {
        let mut spins = 0u32;
        while self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            while self.locked.load(Ordering::Relaxed) {
                if spins < SPINS_BEFORE_YIELD {
                    spins += 1;
                    hint::spin_loop();
                } else {
                    thread::yield_now();
                }
            }
        }
    }

    #[cold]
    #[inline(never)]
    #[track_caller]
    fn check_acquire(&self, irql: Irql) {
        if irql > DISPATCH_LEVEL {
            stop(
                codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
                [
                    verifier::SPIN_LOCK_ACQUIRE_ABOVE_DISPATCH,
                    irql.into(),
                    self.id,
                    0,
                ],
                format!("spin lock {} acquired at IRQL {irql}", self.class.name),
            );
        }
        let (recursive, above) = irql::with_held(|held| {
            (
                held.iter().any(|h| h.id == self.id),
                held.iter().find(|h| self.class.rank <= h.rank).copied(),
            )
        });
        if recursive {
            stop(
                codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
                [verifier::DEADLOCK_SELF, self.id, 0, 0],
                format!(
                    "spin lock {} acquired recursively (self-deadlock)",
                    self.class.name
                ),
            );
        }
        if let Some(h) = above {
            stop(
                codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
                [verifier::DEADLOCK_HIERARCHY, self.id, h.id, 0],
                format!(
                    "lock hierarchy violation: {} (rank {}) acquired while holding {} (rank {})",
                    self.class.name, self.class.rank, h.name, h.rank
                ),
            );
        }
    }

    #[cold]
    #[inline(never)]
    #[track_caller]
    fn check_release(&self, old: Irql) {
        let now = irql::current_irql();
        let (mine, last) =
            irql::with_held(|held| (held.iter().any(|h| h.id == self.id), held.last().copied()));
        if !mine {
            let owner = self.owner.load(Ordering::Relaxed);
            if self.locked.load(Ordering::Relaxed) && owner != 0 {
                stop(
                    codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
                    [
                        verifier::DEADLOCK_WRONG_THREAD,
                        self.id,
                        owner,
                        irql::thread_token(),
                    ],
                    format!(
                        "spin lock {} released by a thread that does not own it",
                        self.class.name
                    ),
                );
            }
            stop(
                codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
                [verifier::DEADLOCK_UNACQUIRED, self.id, 0, 0],
                format!("spin lock {} released but not held", self.class.name),
            );
        }
        if now != DISPATCH_LEVEL {
            stop(
                codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
                [
                    verifier::SPIN_LOCK_RELEASE_NOT_DISPATCH,
                    now.into(),
                    self.id,
                    0,
                ],
                format!(
                    "spin lock {} released at IRQL {now}, not DISPATCH_LEVEL",
                    self.class.name
                ),
            );
        }
        if old > DISPATCH_LEVEL {
            stop(
                codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
                [verifier::LOWER_IRQL_INVALID, now.into(), old.into(), 0],
                format!(
                    "spin lock {} released to IRQL {old}, above DISPATCH_LEVEL",
                    self.class.name
                ),
            );
        }
        if let Some(last) = last.filter(|h| h.id != self.id) {
            stop(
                codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
                [verifier::DEADLOCK_RELEASE_ORDER, self.id, last.id, 0],
                format!(
                    "spin lock {} released while {} (acquired after it) is still held",
                    self.class.name, last.name
                ),
            );
        }
        if old < DISPATCH_LEVEL && irql::in_dpc() {
            stop(
                codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
                [verifier::LOWER_IRQL_INVALID, now.into(), old.into(), 1],
                format!(
                    "spin lock {} released to IRQL {old} inside a DPC",
                    self.class.name
                ),
            );
        }
    }
}

/// A spin lock guarding a `T`: [`SpinLock::lock`] acquires at
/// DISPATCH_LEVEL, runs the closure on the data and releases.
///
/// Built on [`RawSpinLock`]: the data is reached only inside
/// [`SpinLock::lock`], while this thread holds the raw lock, and the raw
/// lock is never released from outside `lock` (its explicit form is not
/// exposed for a lock that guards data), so holding it is exclusive access.
pub struct HostSpinLock<T> {
    raw: RawSpinLock,
    data: UnsafeCell<T>,
}

impl<T> core::fmt::Debug for HostSpinLock<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("HostSpinLock")
            .field("raw", &self.raw)
            .finish_non_exhaustive()
    }
}

// SAFETY: the `T` is only reached through `lock`, by the one thread that
// holds the raw spin lock (see the type's documentation), so sharing the
// lock between threads hands the `T` from thread to thread, never to two
// at once: `T: Send` suffices.
#[allow(unsafe_code)]
unsafe impl<T: Send> Sync for HostSpinLock<T> {}

impl<T> HostSpinLock<T> {
    pub(crate) const fn new(raw: RawSpinLock, value: T) -> Self {
        Self {
            raw,
            data: UnsafeCell::new(value),
        }
    }

    /// The lock's id (what bugcheck parameters show as its address).
    #[must_use]
    pub const fn id(&self) -> u64 {
        self.raw.id()
    }

    /// The raw lock, for the verifier's own tests of the explicit form.
    #[cfg(test)]
    pub(crate) const fn raw(&self) -> &RawSpinLock {
        &self.raw
    }

    /// Takes the data out (the lock is being destroyed).
    pub fn into_inner(self) -> T {
        self.data.into_inner()
    }
}

/// Releases the raw lock if the closure unwinds (a bugcheck caught by a
/// test), so the lock is usable afterwards.
struct UnwindRelease<'a> {
    raw: &'a RawSpinLock,
    old: Irql,
}

impl Drop for UnwindRelease<'_> {
    fn drop(&mut self) {
        if thread::panicking() {
            self.raw.force_release(self.old);
        }
    }
}

impl<T: Send> SpinLock<T> for HostSpinLock<T> {
    /// Acquires at DISPATCH_LEVEL, runs `f`, releases.
    ///
    /// IRQL: <= DISPATCH_LEVEL; see [`RawSpinLock::acquire`] and
    /// [`RawSpinLock::release`] for the verifier's checks.
    #[track_caller]
    fn lock<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let old = self.raw.acquire();
        let guard = UnwindRelease {
            raw: &self.raw,
            old,
        };
        #[allow(unsafe_code)]
        // SAFETY: this thread holds the raw lock (acquired above, released
        // below or by `guard` on unwind), and nothing else reaches the data
        // without holding it, so this is the only reference to it.
        let data = unsafe { &mut *self.data.get() };
        let result = f(data);
        self.raw.release(old);
        std::mem::forget(guard);
        result
    }
}

/// The verifier's check of a kernel caller's speed-path queue lock (the
/// ring's own spin, `irpverbs_ring::wq::LockCheck`), run each time it is
/// taken: a lock that does not raise IRQL must be taken at DISPATCH_LEVEL
/// or above, as `KeAcquireSpinLockAtDpcLevel` must (0xC4/0x40 otherwise).
/// Below DISPATCH_LEVEL a DPC on the same processor could preempt the
/// holder and spin on the same queue forever.
#[track_caller]
pub fn speed_lock_check(lock: usize) {
    let now = irql::current_irql();
    if now < DISPATCH_LEVEL {
        stop(
            codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
            [
                verifier::SPIN_LOCK_AT_DPC_BELOW_DISPATCH,
                now.into(),
                lock as u64,
                0,
            ],
            format!(
                "a kernel speed-path queue lock taken at IRQL {now}: a DPC on this \
                 processor posting to the same queue would deadlock"
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::catch_bugcheck;
    use irpverbs_core::platform::{DEVICE_LEVEL, DEVICE_LOCK, EQ_LOCK, HCA_LOCK, PASSIVE_LEVEL};
    use std::sync::Arc;

    fn lock(id: u64, class: &'static LockClass) -> HostSpinLock<u32> {
        HostSpinLock::new(RawSpinLock::new(id, class, true), 0)
    }

    #[test]
    fn lock_raises_and_restores() {
        let l = lock(1, &DEVICE_LOCK);
        l.lock(|v| {
            assert_eq!(irql::current_irql(), DISPATCH_LEVEL);
            *v += 1;
        });
        assert_eq!(irql::current_irql(), PASSIVE_LEVEL);
        assert_eq!(l.into_inner(), 1);
    }

    #[test]
    fn nested_in_rank_order_is_fine() {
        let a = lock(1, &DEVICE_LOCK);
        let b = lock(2, &HCA_LOCK);
        let c = lock(3, &EQ_LOCK);
        a.lock(|_| b.lock(|_| c.lock(|v| *v = 1)));
        assert_eq!(irql::current_irql(), PASSIVE_LEVEL);
    }

    #[test]
    fn contended_lock_excludes() {
        let l = Arc::new(lock(1, &DEVICE_LOCK));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let l = Arc::clone(&l);
                thread::spawn(move || {
                    for _ in 0..20_000 {
                        l.lock(|v| *v += 1);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(l.lock(|v| *v), 40_000);
    }

    #[test]
    fn lock_is_usable_after_a_caught_bugcheck_inside() {
        let l = lock(1, &DEVICE_LOCK);
        let b = catch_bugcheck(|| l.lock(|_| l.lock(|_| ()))).unwrap_err();
        assert_eq!(b.param1(), verifier::DEADLOCK_SELF);
        assert_eq!(irql::current_irql(), PASSIVE_LEVEL);
        l.lock(|v| *v = 5);
        assert_eq!(l.into_inner(), 5);
    }

    #[test]
    fn release_order_violation() {
        let a = lock(1, &DEVICE_LOCK);
        let b = lock(2, &HCA_LOCK);
        let b_check = catch_bugcheck(|| {
            let old_a = a.raw().acquire();
            let _old_b = b.raw().acquire();
            a.raw().release(old_a);
        })
        .unwrap_err();
        assert_eq!(b_check.params[..2], [verifier::DEADLOCK_RELEASE_ORDER, 1]);
    }

    #[test]
    fn release_of_unheld_lock() {
        let a = lock(9, &DEVICE_LOCK);
        let b = catch_bugcheck(|| a.raw().release(PASSIVE_LEVEL)).unwrap_err();
        assert_eq!(b.code, codes::DRIVER_VERIFIER_DETECTED_VIOLATION);
        assert_eq!(b.params[..2], [verifier::DEADLOCK_UNACQUIRED, 9]);
    }

    #[test]
    fn acquire_above_dispatch() {
        let a = lock(1, &DEVICE_LOCK);
        irql::set_irql(DEVICE_LEVEL);
        let b = catch_bugcheck(|| a.lock(|_| ())).unwrap_err();
        irql::set_irql(PASSIVE_LEVEL);
        assert_eq!(
            b.params,
            [
                verifier::SPIN_LOCK_ACQUIRE_ABOVE_DISPATCH,
                DEVICE_LEVEL.into(),
                1,
                0
            ]
        );
    }
}
