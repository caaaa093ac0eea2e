//! The transport's clock: the soft HCA's local ACK and RNR timers run on
//! the interrupt time ([`KmdfPlatform::now_ns`]) and fire from a one-shot
//! kernel timer ([`OneShot`]) that the transport arms for its next
//! deadline ([`irpverbs_soft::Clock::arm`], called under the HCA's lock at
//! DISPATCH_LEVEL: `ExSetTimer` may be). Its callback, at DISPATCH_LEVEL,
//! runs [`irpverbs_soft::SoftHca::advance_clock`], which fires what is due and arms the
//! timer again. So ACK timeouts, retries and RNR waits end with or without
//! a wire.
//!
//! Started in D0Entry (the clock attached to the HCA), stopped in D0Exit:
//! the HCA stops arming it ([`irpverbs_soft::SoftHca::detach_clock`]), then the timer is
//! deleted, waiting for a callback that runs.
//!
//! The default timer resolution (up to 15.6 ms late) lengthens short
//! timeouts; IBTA's are lower bounds.

use core::ffi::c_void;

use irpverbs_abi::STATUS_INSUFFICIENT_RESOURCES;
use irpverbs_core::Platform;
use irpverbs_ring::Shared;
use wdk_sys::{NTSTATUS, PEX_TIMER, PVOID};

use super::{Engine, Hw};
use crate::cmtimer::{Arming, OneShot};
use crate::platform::KmdfPlatform;

/// The clock the HCA owns while attached: the interrupt time, and the
/// arming side of the transport's timer.
struct TransportClock(Shared<Arming>);

impl irpverbs_soft::Clock for TransportClock {
    fn now_ns(&self) -> u64 {
        KmdfPlatform.now_ns()
    }

    fn arm(&self, deadline_ns: u64) {
        self.0.arm(deadline_ns);
    }
}

/// The soft HCA's transport timer.
pub(crate) struct TransportTimer {
    /// First: a drop deletes the timer before the HCA reference goes.
    timer: OneShot,
    soft: Hw,
}

impl TransportTimer {
    /// A stopped timer for `soft`.
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES` ([`OneShot::new`]).
    pub(crate) fn new(soft: Hw) -> Result<Self, NTSTATUS> {
        Ok(Self {
            timer: OneShot::new()?,
            soft,
        })
    }

    /// D0Entry: allocates the timer and attaches the clock to the HCA.
    /// Started already: nothing to do.
    ///
    /// IRQL: PASSIVE_LEVEL.
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES` when the timer or the clock's box
    /// cannot be allocated; the HCA's refusal of a second clock (the timer
    /// is deleted again).
    pub(crate) fn start(&self) -> Result<(), NTSTATUS> {
        if self.timer.started() {
            return Ok(());
        }
        let context = core::ptr::from_ref::<Engine>(&self.soft)
            .cast_mut()
            .cast::<c_void>();
        // SAFETY: the context is the HCA this timer holds a reference to;
        // the timer is deleted (stop, or the drop, first field) before it.
        let shared = unsafe { self.timer.start(fire, context) }?;
        let attached = irpverbs_ring::try_box(TransportClock(shared))
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)
            .and_then(|clock| self.soft.attach_clock(clock));
        if let Err(status) = attached {
            self.timer.stop();
            return Err(status);
        }
        Ok(())
    }

    /// D0Exit: the HCA stops arming the timer, which is deleted (waiting
    /// for a callback in progress). Stopped already: nothing to do.
    ///
    /// IRQL: PASSIVE_LEVEL.
    pub(crate) fn stop(&self) {
        if !self.timer.started() {
            return;
        }
        self.soft.detach_clock();
        self.timer.stop();
    }
}

/// The timer's callback (`EXT_CALLBACK`): the transport's timers.
///
/// IRQL: DISPATCH_LEVEL.
///
/// # Safety
/// Called by the kernel with the context [`TransportTimer::start`] gave
/// `ExAllocateTimer`.
unsafe extern "C" fn fire(_timer: PEX_TIMER, context: PVOID) {
    // SAFETY: the context is the HCA, referenced by the TransportTimer that
    // deletes the timer (waiting for this callback) before letting it go.
    let soft = unsafe { &*context.cast_const().cast::<Engine>() };
    let _ = soft.advance_clock(KmdfPlatform.now_ns());
}
