//! [`KmdfPlatform`]: the core's [`Platform`] over the Windows kernel.
//!
//! | core                  | here                                               |
//! |-----------------------|----------------------------------------------------|
//! | `Platform::Lock<T>`   | [`KmdfSpinLock`]: a `KSPIN_LOCK`, acquired in-stack queued (raises to DISPATCH_LEVEL) |
//! | `Platform::irql`      | `KeGetCurrentIrql`                                 |
//! | `Platform::pool_charge` / `pool_release` | a real `ExAllocatePool2(POOL_FLAG_NON_PAGED, bytes, tag)` per charge, freed with `ExFreePoolWithTag` |
//! | `Platform::Request`   | [`KmdfRequest`]                                    |
//! | `Platform::pin_memory` | user mode: [`crate::mdl::UserPin`] (an MDL, `MmProbeAndLockPages` through the SEH shim, a system mapping); kernel mode: the ULP's own nonpaged memory, wrapped |
//! | `Platform::map_ring`, `map_doorbell_page` / `unmap_ring` | [`crate::mdl::UserMapping`] (an MDL over the ring's or doorbell page's nonpaged pool, `MmMapLockedPagesSpecifyCache(UserMode)` through the SEH shim; unmapped in its process) |
//!
//! What the host platform's verifier checks (IRQL rules, lock order, pool
//! leaks, request ownership) Driver Verifier checks here: the charges are
//! real tagged allocations, so `verifier /standard` tracks them and reports
//! any still out at unload (bugcheck 0xC4/0x62), and its deadlock detection
//! watches the spin locks. The core's [`LockClass`] ranks are therefore not
//! needed at run time; they document the order Driver Verifier enforces.

use core::cell::UnsafeCell;
use core::ffi::c_void;

use irpverbs_abi::{
    IvRingMap, NtStatus, STATUS_INSUFFICIENT_RESOURCES, STATUS_INVALID_PARAMETER,
    STATUS_NOT_SUPPORTED,
};
use irpverbs_core::{
    Irql, LockClass, Platform, PoolCharge, PoolTag, Request, RequestorMode, SpinLock,
};
use irpverbs_ring::{Region, Ring};
use wdk_sys::ntddk::{
    ExAllocatePool2, ExFreePoolWithTag, KeAcquireInStackQueuedSpinLock, KeGetCurrentIrql,
    KeQueryInterruptTimePrecise, KeReleaseInStackQueuedSpinLock,
};
use wdk_sys::{KLOCK_QUEUE_HANDLE, KSPIN_LOCK, POOL_FLAG_NON_PAGED, SIZE_T};

use crate::mdl::{UserMapping, UserPin};
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

    /// `KeQueryInterruptTimePrecise`, in 100 ns units, as nanoseconds.
    ///
    /// IRQL: any.
    fn now_ns(&self) -> u64 {
        let mut qpc = 0u64;
        // SAFETY: KeQueryInterruptTimePrecise writes the performance
        // counter to the valid u64 it is given and reads the interrupt
        // time; callable at any IRQL.
        let t = unsafe { KeQueryInterruptTimePrecise(&raw mut qpc) };
        t.saturating_mul(100)
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

    /// A user-mode range (the core asks from `in_caller_context`: PASSIVE
    /// level, the requestor's process): probed and locked for the access
    /// the registration needs, mapped for the system, counted in the
    /// request's file (whose cleanup waits for its pins to be released).
    /// A kernel caller's range is its own nonpaged memory, valid until it
    /// deregisters: wrapped as is. Physical (bus address) ranges are not
    /// supported yet.
    ///
    /// IRQL: <= APC_LEVEL for a user range, <= DISPATCH_LEVEL otherwise.
    ///
    /// # Errors
    /// See [`UserPin::region`]; `STATUS_NOT_SUPPORTED` for a physical range;
    /// `STATUS_INVALID_PARAMETER` for a range this machine cannot address
    /// or a user request without a file.
    fn pin_memory(
        &self,
        request: &KmdfRequest,
        addr: u64,
        length: u64,
        write: bool,
        physical: bool,
    ) -> Result<irpverbs_ring::Shared<Region>, NtStatus> {
        if physical {
            return Err(STATUS_NOT_SUPPORTED);
        }
        let len = usize::try_from(length).map_err(|_| STATUS_INVALID_PARAMETER)?;
        if request.requestor_mode() == RequestorMode::User {
            let pins = request.file_pins().ok_or(STATUS_INVALID_PARAMETER)?;
            return UserPin::region(addr, len, write, pins);
        }
        let ptr = core::ptr::with_exposed_provenance_mut::<u8>(
            usize::try_from(addr).map_err(|_| STATUS_INVALID_PARAMETER)?,
        );
        // SAFETY: a kernel ULP registering memory promises it is nonpaged,
        // valid for `length` bytes and stays allocated until deregistration
        // (the registration contract `Region::from_raw_parts` states).
        let region = unsafe { Region::from_raw_parts(ptr, len, None) };
        let region = region.ok_or(STATUS_INVALID_PARAMETER)?;
        irpverbs_ring::Shared::try_new(region).map_err(|_| STATUS_INSUFFICIENT_RESOURCES)
    }

    type Mapping = UserMapping;

    /// An MDL over the ring's nonpaged memory mapped into the requestor's
    /// process (see [`UserMapping::map`]).
    ///
    /// IRQL: <= APC_LEVEL, in the requestor's process.
    ///
    /// # Errors
    /// The mapping's exception status, or `STATUS_INSUFFICIENT_RESOURCES`.
    fn map_ring(
        &self,
        _request: &KmdfRequest,
        ring: &Ring,
    ) -> Result<(IvRingMap, UserMapping), NtStatus> {
        UserMapping::map(ring)
    }

    /// An MDL over the doorbell page mapped into the requestor's process,
    /// as a ring is (see [`UserMapping::map_region`]): the page's nonpaged
    /// memory, cached, or (a page of a device's BAR of pages, the model's
    /// UAR pages) the BAR's physical page, uncached. Unmapped by
    /// [`Platform::unmap_ring`], at the latest at the file's cleanup.
    ///
    /// IRQL: <= APC_LEVEL, in the requestor's process.
    ///
    /// # Errors
    /// The mapping's exception status, or `STATUS_INSUFFICIENT_RESOURCES`.
    fn map_doorbell_page(
        &self,
        _request: &KmdfRequest,
        page: &irpverbs_ring::Shared<Region>,
    ) -> Result<(u64, UserMapping), NtStatus> {
        UserMapping::map_region(page)
    }

    /// Undone in the process it was made in (see [`UserMapping::unmap`]).
    ///
    /// IRQL: <= APC_LEVEL.
    fn unmap_ring(&self, mapping: UserMapping) {
        mapping.unmap();
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
