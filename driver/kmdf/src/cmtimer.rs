//! The connection manager's timer: a one-shot kernel timer
//! (`ExAllocateTimer`, Windows 8.1 and later) that the core arms at the
//! CM's next deadline ([`Device::set_cm_timer`]) and whose callback, at
//! DISPATCH_LEVEL, runs [`Device::cm_timer`] (retransmissions, giving up,
//! time wait), which re-arms it.
//!
//! The timer is allocated and handed to the core in D0Entry, and taken
//! back and deleted in D0Exit ([`Device::stop_cm_timer`] first, so the core
//! stops arming it). The core calls the arming function with no lock held,
//! possibly on another processor while D0Exit runs: an arming counts
//! itself in `users` and backs off once `stopping` is set, and D0Exit
//! waits for the count to drop to zero before it deletes the timer, so
//! `ExSetTimer` never meets a deleted timer.
//!
//! Millisecond-scale CM timeouts need no high resolution: the timer fires
//! at the default clock rate (up to 15.6 ms late), which the CM's timeouts
//! (4.096 us * 2^t, usually t >= 14, 67 ms) absorb.
//!
//! [`OneShot`] is that timer without the CM: the transport's timer
//! (`backend/soft/clock.rs`) is one too.

use core::ffi::c_void;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};

use irpverbs_abi::STATUS_INSUFFICIENT_RESOURCES;
use irpverbs_core::Platform;
use irpverbs_ring::Shared;
use wdk_sys::ntddk::{ExAllocateTimer, ExDeleteTimer, ExSetTimer};
use wdk_sys::{_EX_TIMER, BOOLEAN, LONGLONG, NTSTATUS, PEX_TIMER, PVOID};

use crate::device::KmdfDevice;
use crate::platform::KmdfPlatform;

/// `TRUE` as a `BOOLEAN`.
const TRUE: BOOLEAN = 1;
/// `FALSE` as a `BOOLEAN`.
const FALSE: BOOLEAN = 0;

/// What the arming function and D0Exit share.
pub(crate) struct Arming {
    /// The allocated timer (null while stopped).
    timer: AtomicPtr<_EX_TIMER>,
    /// Armings in progress.
    users: AtomicUsize,
    /// D0Exit is deleting the timer: no new arming.
    stopping: AtomicBool,
}

// SAFETY: the timer pointer is only used through atomics and the kernel's
// timer calls, which are thread-safe.
unsafe impl Send for Arming {}
// SAFETY: as above.
unsafe impl Sync for Arming {}

impl Arming {
    /// The arming function: the timer to expire at `deadline` (ns on
    /// [`KmdfPlatform::now_ns`]'s clock), replacing an earlier arming.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    pub(crate) fn arm(&self, deadline: u64) {
        self.users.fetch_add(1, Ordering::SeqCst);
        let timer = self.timer.load(Ordering::SeqCst);
        if !self.stopping.load(Ordering::SeqCst) && !timer.is_null() {
            let now = KmdfPlatform.now_ns();
            // Relative due time in 100 ns units, at least one.
            let due = (deadline.saturating_sub(now) / 100).clamp(1, i64::MAX as u64);
            let due = LONGLONG::try_from(due).unwrap_or(LONGLONG::MAX);
            // SAFETY: `timer` is live: D0Exit deletes it only once `users`
            // is zero, and this arming is counted; a negative due time is
            // relative; period 0 makes it one-shot; no parameters
            // (optional); IRQL <= DISPATCH_LEVEL.
            let _ = unsafe { ExSetTimer(timer, -due, 0, core::ptr::null_mut()) };
        }
        self.users.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A one-shot, default-resolution kernel timer that its users arm for
/// absolute deadlines ([`Arming::arm`]), allocated in D0Entry and deleted
/// in D0Exit.
pub(crate) struct OneShot {
    shared: Shared<Arming>,
}

impl OneShot {
    /// A stopped timer: its state, shared with the arming side, allocated
    /// fallibly (the timer itself is allocated by [`OneShot::start`]).
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES`.
    pub(crate) fn new() -> Result<Self, NTSTATUS> {
        let shared = Shared::try_new(Arming {
            timer: AtomicPtr::new(core::ptr::null_mut()),
            users: AtomicUsize::new(0),
            stopping: AtomicBool::new(false),
        })
        .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        Ok(Self { shared })
    }

    /// Whether it is allocated.
    pub(crate) fn started(&self) -> bool {
        !self.shared.timer.load(Ordering::Acquire).is_null()
    }

    /// Allocates the timer, `callback` running with `context` when it
    /// expires; the arming side to hand out.
    ///
    /// IRQL: PASSIVE_LEVEL.
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES` when the timer cannot be allocated.
    ///
    /// # Safety
    /// `context` must stay valid for `callback` until [`OneShot::stop`] (or
    /// the drop) deleted the timer.
    pub(crate) unsafe fn start(
        &self,
        callback: unsafe extern "C" fn(PEX_TIMER, PVOID),
        context: PVOID,
    ) -> Result<Shared<Arming>, NTSTATUS> {
        // SAFETY: `callback` has the EXT_CALLBACK signature; its context
        // outlives the timer (caller); no attributes (a default-resolution
        // timer); IRQL PASSIVE_LEVEL.
        let timer = unsafe { ExAllocateTimer(Some(callback), context, 0) };
        if timer.is_null() {
            return Err(STATUS_INSUFFICIENT_RESOURCES);
        }
        self.shared.stopping.store(false, Ordering::SeqCst);
        self.shared.timer.store(timer, Ordering::SeqCst);
        Ok(Shared::clone(&self.shared))
    }

    /// No new arming; once none is in progress the timer is cancelled and
    /// deleted, waiting for a callback that is running. Stopped already:
    /// nothing to do. Its users stop arming it first.
    ///
    /// IRQL: PASSIVE_LEVEL (the wait needs <= APC_LEVEL).
    pub(crate) fn stop(&self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        while self.shared.users.load(Ordering::SeqCst) != 0 {
            core::hint::spin_loop();
        }
        let timer = self
            .shared
            .timer
            .swap(core::ptr::null_mut(), Ordering::SeqCst);
        if timer.is_null() {
            return;
        }
        // SAFETY: the live timer `start` allocated, swapped out so that it
        // is deleted once, with no arming in progress or to come; Cancel
        // and Wait both TRUE at PASSIVE_LEVEL; no parameters. No callback
        // runs after it returns.
        let _ = unsafe { ExDeleteTimer(timer, TRUE, TRUE, core::ptr::null_mut()) };
    }
}

impl Drop for OneShot {
    /// The device is destroyed: D0Exit stopped the timer before. Should it
    /// still be allocated, it is cancelled without waiting (the destroy
    /// callback may run at DISPATCH_LEVEL).
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        let timer = self
            .shared
            .timer
            .swap(core::ptr::null_mut(), Ordering::SeqCst);
        if timer.is_null() {
            return;
        }
        // SAFETY: the live timer, swapped out (deleted once); Cancel without
        // Wait may be called at IRQL <= DISPATCH_LEVEL; no parameters.
        let _ = unsafe { ExDeleteTimer(timer, TRUE, FALSE, core::ptr::null_mut()) };
    }
}

/// The device's CM timer.
pub(crate) struct CmTimer {
    timer: OneShot,
}

impl CmTimer {
    /// A stopped timer.
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES` ([`OneShot::new`]).
    pub(crate) fn new() -> Result<Self, NTSTATUS> {
        Ok(Self {
            timer: OneShot::new()?,
        })
    }

    /// D0Entry: allocates the timer, its callback running
    /// [`KmdfDevice::cm_timer`] on `device`, and gives the core its arming
    /// function. Started already: nothing to do.
    ///
    /// IRQL: PASSIVE_LEVEL.
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES` when the timer or the arming
    /// function cannot be allocated (the timer is deleted again).
    ///
    /// # Safety
    /// `device` must outlive the timer: [`CmTimer::stop`] (or the drop of
    /// the state holding both) runs before it goes.
    pub(crate) unsafe fn start(&self, device: &KmdfDevice) -> Result<(), NTSTATUS> {
        if self.timer.started() {
            return Ok(());
        }
        let context = core::ptr::from_ref(device).cast_mut().cast::<c_void>();
        // SAFETY: the context is the device, which outlives the timer
        // (caller).
        let shared = unsafe { self.timer.start(fire, context) }?;
        match irpverbs_core::cm::cm_timer_arm(move |deadline| shared.arm(deadline)) {
            Ok(arm) => {
                device.set_cm_timer(arm);
                Ok(())
            }
            Err(status) => {
                self.timer.stop();
                Err(status)
            }
        }
    }

    /// D0Exit: the core stops arming the timer; then it is deleted
    /// ([`OneShot::stop`]). Stopped already: nothing to do.
    ///
    /// IRQL: PASSIVE_LEVEL (the wait needs <= APC_LEVEL).
    pub(crate) fn stop(&self, device: &KmdfDevice) {
        if !self.timer.started() {
            return;
        }
        device.stop_cm_timer();
        self.timer.stop();
    }
}

/// The timer's callback (`EXT_CALLBACK`): the CM's timers.
///
/// IRQL: DISPATCH_LEVEL.
///
/// # Safety
/// Called by the kernel with the context [`CmTimer::start`] gave
/// `ExAllocateTimer`.
unsafe extern "C" fn fire(_timer: PEX_TIMER, context: PVOID) {
    // SAFETY: the context is the device, which outlives the timer (the
    // timer is deleted with Wait before the device goes).
    let device = unsafe { &*context.cast_const().cast::<KmdfDevice>() };
    device.cm_timer();
}
