//! [`KmdfPlatform`]: the core's [`Platform`] over the Windows kernel.
//!
//! | core                  | here                                               |
//! |-----------------------|----------------------------------------------------|
//! | `Platform::Lock<T>`   | [`KmdfSpinLock`]: a `KSPIN_LOCK`, acquired in-stack queued (raises to DISPATCH_LEVEL) |
//! | `Platform::irql`      | `KeGetCurrentIrql`                                 |
//! | `Platform::pool_charge` / `pool_release` | a real `ExAllocatePool2(POOL_FLAG_NON_PAGED, bytes, tag)` per charge, freed with `ExFreePoolWithTag` |
//! | `Platform::Request`   | [`KmdfRequest`]                                    |
//!
//! What the host platform's verifier checks (IRQL rules, lock order, pool
//! leaks, request ownership) Driver Verifier checks here: the charges are
//! real tagged allocations, so `verifier /standard` tracks them and reports
//! any still out at unload (bugcheck 0xC4/0x62), and its deadlock detection
//! watches the spin locks. The core's [`LockClass`] ranks are therefore not
//! needed at run time; they document the order Driver Verifier enforces.

use core::cell::UnsafeCell;
use core::ffi::c_void;

use irpverbs_abi::{NtStatus, STATUS_INSUFFICIENT_RESOURCES};
use irpverbs_core::{Irql, LockClass, Platform, PoolCharge, PoolTag, SpinLock};
use wdk_sys::ntddk::{
    ExAllocatePool2, ExFreePoolWithTag, KeAcquireInStackQueuedSpinLock, KeGetCurrentIrql,
    KeReleaseInStackQueuedSpinLock,
};
use wdk_sys::{KLOCK_QUEUE_HANDLE, KSPIN_LOCK, POOL_FLAG_NON_PAGED, SIZE_T};

use crate::request::KmdfRequest;

/// The Windows kernel, as the core sees it. Stateless: every service is a
/// kernel routine.
#[derive(Debug, Default, Clone, Copy)]
pub struct KmdfPlatform;

impl Platform for KmdfPlatform {
    type Request = KmdfRequest;
    type Lock<T: Send> = KmdfSpinLock<T>;

    /// A new, unheld spin lock. The class is not needed at run time (see the
    /// module docs).
    fn new_lock<T: Send>(&self, _class: &'static LockClass, value: T) -> KmdfSpinLock<T> {
        KmdfSpinLock::new(value)
    }

    /// `KeGetCurrentIrql`.
    ///
    /// IRQL: any.
    fn irql(&self) -> Irql {
        // SAFETY: KeGetCurrentIrql has no preconditions; it reads the
        // current processor's IRQL at any IRQL.
        unsafe { KeGetCurrentIrql() }
    }

    /// A nonpaged allocation of `bytes` (at least 1) tagged `tag`; its address
    /// is the charge's id. The memory itself is not used: the charge exists
    /// so that Driver Verifier's pool tracking sees every object the driver
    /// holds, under the object's tag.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES` when the pool (or Driver Verifier's
    /// low-resources simulation) refuses it.
    fn pool_charge(&self, tag: PoolTag, bytes: usize) -> Result<PoolCharge, NtStatus> {
        let size = bytes.max(1) as SIZE_T;
        // SAFETY: ExAllocatePool2 may be called at IRQL <= DISPATCH_LEVEL for
        // nonpaged pool (the core calls the platform at most at
        // DISPATCH_LEVEL); no other flag is set, so it returns null on
        // failure rather than raising.
        let memory = unsafe { ExAllocatePool2(POOL_FLAG_NON_PAGED, size, tag) };
        if memory.is_null() {
            return Err(STATUS_INSUFFICIENT_RESOURCES);
        }
        Ok(PoolCharge {
            tag,
            bytes,
            id: memory.expose_provenance() as u64,
        })
    }

    /// Frees the charge's allocation with its tag.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    fn pool_release(&self, charge: PoolCharge) {
        let Ok(address) = usize::try_from(charge.id) else {
            return;
        };
        if address == 0 {
            return;
        }
        let memory = core::ptr::with_exposed_provenance_mut::<c_void>(address);
        // SAFETY: a PoolCharge is only made by `pool_charge` above, which
        // put the address of a live nonpaged allocation tagged `charge.tag`
        // in `id`; the core gives each charge back exactly once (it is not
        // Clone), so this frees that allocation once, with its tag, at IRQL
        // <= DISPATCH_LEVEL.
        unsafe { ExFreePoolWithTag(memory, charge.tag) };
    }

    /// Kernel callers pass nonpaged kernel memory (their own, valid until
    /// they deregister): it is wrapped as is. User-mode ranges must be
    /// probed and locked in the caller's context (EvtIoInCallerContext, an
    /// MDL with `MmProbeAndLockPages`) before the request reaches the
    /// dispatch-level queue; that step is not built yet, so user-mode and
    /// physical registrations are refused with `STATUS_NOT_SUPPORTED` rather
    /// than touching unpinned memory.
    /// Kernel callers get the rings' kernel addresses. User-mode callers
    /// get an empty map until rings are MDL-mapped into their process (see
    /// the crate docs): a kernel address must never reach user mode.
    fn ring_map(&self, ring: &irpverbs_ring::Ring, mode: irpverbs_core::RequestorMode) -> irpverbs_abi::IvRingMap {
        match mode {
            irpverbs_core::RequestorMode::Kernel => ring.map(),
            irpverbs_core::RequestorMode::User => irpverbs_abi::IvRingMap::default(),
        }
    }

    fn pin_memory(
        &self,
        addr: u64,
        length: u64,
        mode: irpverbs_core::RequestorMode,
        physical: bool,
    ) -> Result<alloc::sync::Arc<irpverbs_ring::Region>, NtStatus> {
        if mode == irpverbs_core::RequestorMode::User || physical {
            return Err(irpverbs_abi::STATUS_NOT_SUPPORTED);
        }
        let len = usize::try_from(length).map_err(|_| irpverbs_abi::STATUS_INVALID_PARAMETER)?;
        let ptr = core::ptr::with_exposed_provenance_mut::<u8>(
            usize::try_from(addr).map_err(|_| irpverbs_abi::STATUS_INVALID_PARAMETER)?,
        );
        // SAFETY: a kernel ULP registering memory promises it is nonpaged,
        // valid for `length` bytes and stays allocated until deregistration
        // (the registration contract `Region::from_raw_parts` states).
        let region = unsafe { irpverbs_ring::Region::from_raw_parts(ptr, len, None) };
        region
            .map(alloc::sync::Arc::new)
            .ok_or(irpverbs_abi::STATUS_INVALID_PARAMETER)
    }
}

/// A spin lock over a `KSPIN_LOCK`, acquired with
/// `KeAcquireInStackQueuedSpinLock` (a fair queued lock; acquiring raises the
/// processor to DISPATCH_LEVEL, releasing restores the previous IRQL).
///
/// The lock word is 0 whenever the lock is free (that is all
/// `KeInitializeSpinLock` does on x64 and ARM64), so a free lock may be
/// moved; the borrow in [`SpinLock::lock`] keeps it in place while held.
pub struct KmdfSpinLock<T> {
    lock: UnsafeCell<KSPIN_LOCK>,
    value: UnsafeCell<T>,
}

// SAFETY: the lock owns its value; sending the lock sends the value, which
// is Send.
unsafe impl<T: Send> Send for KmdfSpinLock<T> {}
// SAFETY: the value is only reached through `lock`, which holds the kernel
// spin lock for the whole access: one processor at a time, so sharing the
// lock between threads shares no unsynchronized access to the value (T:
// Send suffices, as for std's Mutex).
unsafe impl<T: Send> Sync for KmdfSpinLock<T> {}

impl<T> KmdfSpinLock<T> {
    /// A free lock holding `value`.
    pub const fn new(value: T) -> Self {
        Self {
            lock: UnsafeCell::new(0),
            value: UnsafeCell::new(value),
        }
    }
}

impl<T: Send> SpinLock<T> for KmdfSpinLock<T> {
    /// Acquires the lock (raising to DISPATCH_LEVEL), runs `f`, releases.
    ///
    /// IRQL: caller at <= DISPATCH_LEVEL; `f` runs at DISPATCH_LEVEL.
    /// Recursive acquisition deadlocks (Driver Verifier reports it).
    fn lock<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let mut handle = KLOCK_QUEUE_HANDLE::default();
        // SAFETY: `self.lock` is a valid KSPIN_LOCK that stays in place while
        // held (`self` is borrowed until release below); `handle` is a
        // fresh queue handle on this stack frame, which outlives the hold;
        // the caller is at <= DISPATCH_LEVEL.
        unsafe { KeAcquireInStackQueuedSpinLock(self.lock.get(), &raw mut handle) };
        // SAFETY: the spin lock is held, so this is the only reference to
        // the value until it is released (the closure form keeps the
        // reference from escaping the hold); panics abort the system
        // (panic = "abort", wdk-panic bugchecks), so no unwind can leave the
        // lock held with the reference alive.
        let result = f(unsafe { &mut *self.value.get() });
        // SAFETY: releases the hold taken above with its own queue handle,
        // on the same processor at DISPATCH_LEVEL (a spin lock holder
        // cannot be rescheduled), restoring the caller's IRQL.
        unsafe { KeReleaseInStackQueuedSpinLock(&raw mut handle) };
        result
    }
}
