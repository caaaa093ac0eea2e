//! The doorbell poller: how a platform thread watches the doorbell pages
//! while they are busy, and sleeps while they are not.
//!
//! The soft HCA has no MMIO to trap a user-mode doorbell, so something must
//! look at the pages ([`SoftHca::poll_doorbells`]). Periodic scans cost a
//! timer tick of latency (0.5 ms at the highest clock rate on Windows) and
//! keep the clock at that rate. Instead the HCA runs like a polling NIC
//! driver (NAPI, DPDK's interrupt mode):
//!
//! - **Polling**: a platform thread (a system thread on Windows, a host
//!   thread in host mode) scans the pages back to back, yielding between
//!   scans, for [`DoorbellPoller::window_ns`] after the last scan that found
//!   a doorbell. Every page's `polling` word reads nonzero: a ULP rings with
//!   no system call.
//! - **Going to sleep**: the window passed with nothing rung. The HCA
//!   writes 0 to every page's `polling` word, issues a full fence and scans
//!   once more (`irpverbs_ring::doorbell::stopped_polling`, modelled with
//!   loom). A doorbell
//!   rung meanwhile is found by that scan (polling resumes), or its ULP,
//!   reading `polling` after its own fence, sees the 0.
//! - **Asleep**: the thread waits on an event. A ULP that rang and read 0
//!   issues `IOCTL_IV_RING_DOORBELLS` ([`Hca::ring_doorbell_pages`]): the
//!   driver scans the pages at once, in that call (the doorbell costs one
//!   cheap system call, not a tick), and sets the event through
//!   [`SoftBus::wake_doorbell_poller`]. The woken thread sets the `polling`
//!   words again and polls for a window.
//!
//! A page allocated while the HCA polls starts polled; one allocated while
//! it sleeps reads 0. The HCA only writes the `polling` words (under
//! `DOORBELL_LOCK`), never reads them: a ULP that writes its own page's
//! word only fools itself (it then rings without a wake-up, and its
//! doorbell waits for a scan made for someone else, or its next call).
//!
//! The logic is sans-IO: [`SoftHca::poll_doorbells_step`] takes the time
//! and says whether to scan again or sleep; the platform owns the thread,
//! the clock and the event. Host mode and irpverbs.sys run the same steps.
//!
//! [`Hca::ring_doorbell_pages`]: irpverbs_core::Hca::ring_doorbell_pages
//! [`SoftBus::wake_doorbell_poller`]: crate::SoftBus::wake_doorbell_poller

use core::sync::atomic::Ordering;

use irpverbs_core::{Platform, SpinLock};

use crate::SoftHca;

/// How long the poller keeps polling after the last doorbell it found, by
/// default: 200 µs, several round trips of a ping-pong between two
/// processes, so that a conversation keeps the HCA polling and a quiet
/// spell puts it to sleep.
pub const DEFAULT_POLL_WINDOW_NS: u64 = 200_000;

/// What the poller's thread does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PollerStep {
    /// Scan again (after yielding the processor).
    Again,
    /// Wait on the poller's event until
    /// [`crate::SoftBus::wake_doorbell_poller`] sets it, then step again.
    Sleep,
}

/// The poller thread's state: owned by that thread, passed to every
/// [`SoftHca::poll_doorbells_step`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DoorbellPoller {
    /// How long to poll after the last doorbell found, in ns.
    pub window_ns: u64,
    /// When the last doorbell was found (or polling started).
    last_found_ns: u64,
    /// The pages say "polling".
    polling: bool,
    /// Scans made, in all.
    pub scans: u64,
    /// Times the poller went to sleep.
    pub sleeps: u64,
}

impl DoorbellPoller {
    /// A poller that polls for `window_ns` after each doorbell it finds (0:
    /// it sleeps as soon as a scan finds nothing, so every doorbell after a
    /// quiet scan is an `IOCTL_IV_RING_DOORBELLS`).
    #[must_use]
    pub const fn new(window_ns: u64) -> Self {
        Self {
            window_ns,
            last_found_ns: 0,
            polling: false,
            scans: 0,
            sleeps: 0,
        }
    }

    /// True while the pages say the HCA polls.
    #[must_use]
    pub const fn polling(&self) -> bool {
        self.polling
    }
}

impl Default for DoorbellPoller {
    fn default() -> Self {
        Self::new(DEFAULT_POLL_WINDOW_NS)
    }
}

impl<P: Platform> SoftHca<P> {
    /// One step of the doorbell poller's thread at `now_ns` (any monotonic
    /// clock): scans the pages; returns [`PollerStep::Again`] while the
    /// window since the last doorbell found is open, else clears the
    /// pages' `polling` words, scans once more, and returns
    /// [`PollerStep::Sleep`] if that found nothing. The step after a sleep
    /// sets the words again. See the module documentation.
    ///
    /// IRQL: <= DISPATCH_LEVEL (the platform calls it at DISPATCH_LEVEL, as
    /// a DPC would run the scan; bounded like one scan).
    // An entry of the stack budget (docs/stack-budget.md): kept out of
    // line so that the checker finds it by name.
    #[inline(never)]
    pub fn poll_doorbells_step(&self, poller: &mut DoorbellPoller, now_ns: u64) -> PollerStep {
        if !poller.polling {
            self.set_pages_polling(true);
            poller.polling = true;
            poller.last_found_ns = now_ns;
        }
        poller.scans += 1;
        if self.poll_doorbells() > 0 {
            poller.last_found_ns = now_ns;
            return PollerStep::Again;
        }
        if now_ns.saturating_sub(poller.last_found_ns) < poller.window_ns {
            return PollerStep::Again;
        }
        self.set_pages_polling(false);
        poller.polling = false;
        // `irpverbs_ring::doorbell::stopped_polling`'s fence (the pages are
        // ordinary memory: a plain full fence), the other half of the one
        // a ULP issues before it reads `polling`.
        core::sync::atomic::fence(Ordering::SeqCst);
        poller.scans += 1;
        if self.poll_doorbells() > 0 {
            // Rung while it was stopping: poll on.
            return PollerStep::Again;
        }
        poller.sleeps += 1;
        PollerStep::Sleep
    }

    /// Writes `polling` into every page's `polling` word and remembers it
    /// for pages allocated from now on (under `DOORBELL_LOCK`).
    fn set_pages_polling(&self, polling: bool) {
        self.doorbell_pages.lock(|pages| {
            self.pages_polled.store(polling, Ordering::Relaxed);
            for page in pages.iter() {
                page.set_polling(polling);
            }
        });
    }

    /// `IOCTL_IV_RING_DOORBELLS`: scans the pages now, on the caller's
    /// thread, then wakes the poller (it polls for a window from now on).
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    pub(crate) fn wake_doorbells(&self) {
        self.poll_doorbells();
        self.bus.wake_doorbell_poller();
    }
}
