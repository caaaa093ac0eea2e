//! The doorbell scanner: how the soft HCA notices the doorbells user-mode
//! ULPs ring in their files' doorbell pages (`IOCTL_IV_MAP_DOORBELLS`) with
//! no system call.
//!
//! A real HCA traps a write to its doorbell (UAR) page in hardware; the soft
//! HCA's pages are ordinary nonpaged memory, so something must look at
//! them. Here that is a periodic high-resolution kernel timer
//! (`ExAllocateTimer(.., EX_TIMER_HIGH_RESOLUTION)`, Windows 8.1 and later)
//! whose callback, at DISPATCH_LEVEL, runs the soft HCA's scanner
//! ([`SoftHca::poll_doorbells`]): it takes every slot rung since the last
//! expiration and rings the queue bound to it, running the work inline
//! (the soft HCA's firmware runs inline on Windows) — in the timer's DPC,
//! like any doorbell rung at DISPATCH_LEVEL.
//!
//! The timer is armed at [`SCAN_PERIOD`] (100 µs) in D0Entry and deleted
//! in D0Exit. What it costs and gives:
//!
//! - **Latency**: a user-mode doorbell waits for the next expiration. A
//!   high-resolution timer expires at the system clock's finest rate
//!   (typically 0.5 ms; Windows raises the clock rate while the timer is
//!   set), so a doorbell is seen within about half a millisecond, and a
//!   round trip that needs two user doorbells (send, then the reply's) takes
//!   about a millisecond. Kernel ULPs are not affected: they keep the
//!   direct-call doorbells of the kernel table.
//! - **CPU**: one DPC per expiration; with nothing rung it takes one spin
//!   lock and reads one word per mapped page, a fraction of a microsecond.
//!   The larger cost is the system clock kept at its highest rate while the
//!   device is in D0 (more timer interrupts, less idle power).
//! - Rejected: a `KTIMER` (`KeSetCoalescableTimer`) fires at the default
//!   clock rate, every 15.6 ms; a system thread spinning on the pages gives
//!   microsecond latency but burns a processor (and would need an adaptive
//!   back-off to a wait, whose wake-up latency is again the clock's).
//!
//! The callback may run on two processors at once (two expirations); the
//! scanner is reentrant.

use alloc::sync::Arc;
use core::ffi::c_void;
use core::sync::atomic::{AtomicPtr, Ordering};

use irpverbs_abi::STATUS_INSUFFICIENT_RESOURCES;
use irpverbs_soft::SoftHca;
use wdk_sys::ntddk::{ExAllocateTimer, ExDeleteTimer, ExSetTimer};
use wdk_sys::{_EX_TIMER, BOOLEAN, EX_TIMER_HIGH_RESOLUTION, LONGLONG, NTSTATUS, PEX_TIMER, PVOID};

use crate::platform::KmdfPlatform;

/// The timer's period, in 100 ns units: 100 µs. The system rounds it up to
/// the clock's finest resolution (see the module docs).
pub const SCAN_PERIOD: LONGLONG = 1_000;

/// `TRUE` as a `BOOLEAN`.
const TRUE: BOOLEAN = 1;
/// `FALSE` as a `BOOLEAN`.
const FALSE: BOOLEAN = 0;

/// The device's doorbell scanner: its soft HCA and, while the device is in
/// D0, the timer.
pub(crate) struct DoorbellScanner {
    hca: Arc<SoftHca<KmdfPlatform>>,
    /// The armed timer (null while stopped) and the HCA reference its
    /// callback context holds.
    armed: AtomicPtr<_EX_TIMER>,
    context: AtomicPtr<SoftHca<KmdfPlatform>>,
}

impl DoorbellScanner {
    /// A stopped scanner for `hca`.
    pub(crate) fn new(hca: Arc<SoftHca<KmdfPlatform>>) -> Self {
        Self {
            hca,
            armed: AtomicPtr::new(core::ptr::null_mut()),
            context: AtomicPtr::new(core::ptr::null_mut()),
        }
    }

    /// D0Entry: allocates the high-resolution timer and sets it to expire
    /// every [`SCAN_PERIOD`]. Started already: nothing to do.
    ///
    /// IRQL: PASSIVE_LEVEL.
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES` when the timer cannot be allocated.
    pub(crate) fn start(&self) -> Result<(), NTSTATUS> {
        if !self.armed.load(Ordering::Acquire).is_null() {
            return Ok(());
        }
        // The callback's reference to the HCA, given back in `stop` once
        // no callback can run.
        let context = Arc::into_raw(Arc::clone(&self.hca)).cast_mut();
        // SAFETY: `scan` has the EXT_CALLBACK signature; its context is a
        // live reference to the HCA (just taken) that outlives the timer
        // (`stop` releases it after the waited delete); high resolution is
        // a valid attribute on its own; IRQL <= DISPATCH_LEVEL (PASSIVE).
        let timer = unsafe {
            ExAllocateTimer(
                Some(scan),
                context.cast::<c_void>(),
                EX_TIMER_HIGH_RESOLUTION,
            )
        };
        if timer.is_null() {
            // SAFETY: the reference taken above, never handed to a timer.
            drop(unsafe { Arc::from_raw(context) });
            return Err(STATUS_INSUFFICIENT_RESOURCES);
        }
        self.context.store(context, Ordering::Release);
        self.armed.store(timer, Ordering::Release);
        // SAFETY: `timer` is the live timer just allocated; a
        // high-resolution timer takes a relative (negative) due time; the
        // period is below MAXLONG; no set parameters (optional); IRQL <=
        // DISPATCH_LEVEL.
        let _ = unsafe { ExSetTimer(timer, -SCAN_PERIOD, SCAN_PERIOD, core::ptr::null_mut()) };
        Ok(())
    }

    /// D0Exit: cancels and deletes the timer, waiting for a callback that
    /// is running to return, then lets go of the callback's reference.
    /// Stopped already: nothing to do.
    ///
    /// IRQL: PASSIVE_LEVEL (the wait needs <= APC_LEVEL).
    pub(crate) fn stop(&self) {
        let timer = self.armed.swap(core::ptr::null_mut(), Ordering::AcqRel);
        if timer.is_null() {
            return;
        }
        // SAFETY: `timer` is the live timer `start` armed, swapped out so
        // that it is deleted once; Cancel and Wait are both TRUE (Wait
        // requires Cancel), allowed at PASSIVE_LEVEL; no delete parameters
        // (optional). After it returns no callback runs.
        let _ = unsafe { ExDeleteTimer(timer, TRUE, TRUE, core::ptr::null_mut()) };
        let context = self.context.swap(core::ptr::null_mut(), Ordering::AcqRel);
        if !context.is_null() {
            // SAFETY: the reference `start` gave the timer, which is gone:
            // no callback can use it any more.
            drop(unsafe { Arc::from_raw(context.cast_const()) });
        }
    }
}

impl Drop for DoorbellScanner {
    /// The device is destroyed: D0Exit stopped the scanner before. Should
    /// the timer still be armed, it is cancelled without waiting (the
    /// destroy callback may run at DISPATCH_LEVEL), and the callback's
    /// reference to the HCA is leaked rather than freed under a callback
    /// that may still run.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    fn drop(&mut self) {
        let timer = self.armed.swap(core::ptr::null_mut(), Ordering::AcqRel);
        if timer.is_null() {
            return;
        }
        // SAFETY: the live timer `start` armed, swapped out (deleted once);
        // Cancel without Wait may be called at IRQL <= DISPATCH_LEVEL; no
        // delete parameters.
        let _ = unsafe { ExDeleteTimer(timer, TRUE, FALSE, core::ptr::null_mut()) };
    }
}

/// The timer's callback (`EXT_CALLBACK`): scans the doorbell pages.
///
/// IRQL: DISPATCH_LEVEL.
///
/// # Safety
/// Called by the kernel with the context `DoorbellScanner::start` gave
/// `ExAllocateTimer`.
unsafe extern "C" fn scan(_timer: PEX_TIMER, context: PVOID) {
    // SAFETY: the context is the HCA reference the scanner handed to the
    // timer; it is released only after the timer is deleted with Wait (no
    // callback runs then), or never.
    let hca = unsafe { &*context.cast_const().cast::<SoftHca<KmdfPlatform>>() };
    hca.poll_doorbells();
}
