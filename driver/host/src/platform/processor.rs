//! DPCs targeted to a processor of their own (`KeSetTargetProcessorDpcEx`,
//! or an MSI-X message's interrupt affinity): host threads stand in for
//! processors, and a [`TargetedDpc`]'s processor is a thread that runs
//! only that DPC. Two targeted DPCs therefore run concurrently, as two
//! interrupt vectors' DPCs do on two processors.
//!
//! Inserting it ([`TargetedDpc::insert`], from an ISR at DIRQL or from any
//! IRQL) marks it queued on its processor and wakes that thread; the thread
//! runs the DPC routine at DISPATCH_LEVEL under the same verifier checks as
//! any [`Dpc`] (the IRQL it returns at, the DPC watchdog's time and work
//! budget — per DPC, so per vector), and a bugcheck in it is recorded for
//! unload ([`HostPlatform::background_bugcheck`]). A DPC inserted while it
//! is queued runs once; inserted while it runs, it runs again after.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::{self, JoinHandle, ThreadId};

use irpverbs_abi::{NtStatus, STATUS_INSUFFICIENT_RESOURCES};

use super::{Dpc, HostPlatform, heap};

struct Inner {
    dpc: Dpc,
    /// Queued on the processor and not yet started.
    queued: Mutex<bool>,
    wake: Condvar,
    stop: AtomicBool,
    /// Runs started (tests and tools).
    runs: AtomicU64,
}

/// A DPC bound to a processor (a host thread) of its own. Dropping it
/// stops the thread after a run in progress (IRQL: PASSIVE_LEVEL).
pub struct TargetedDpc {
    inner: Arc<Inner>,
    processor: u32,
    thread: Mutex<Option<JoinHandle<()>>>,
    thread_id: ThreadId,
}

impl std::fmt::Debug for TargetedDpc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TargetedDpc")
            .field("processor", &self.processor)
            .field("runs", &self.runs())
            .finish_non_exhaustive()
    }
}

impl HostPlatform {
    /// A DPC running `routine` at DISPATCH_LEVEL, targeted to processor
    /// `processor` (KeInitializeDpc + KeSetTargetProcessorDpcEx): a host
    /// thread of its own, named after `name` and the processor.
    ///
    /// IRQL: PASSIVE_LEVEL (it starts the processor's thread).
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES` when the thread cannot be started.
    pub fn new_targeted_dpc(
        &self,
        name: &str,
        processor: u32,
        routine: impl Fn() + Send + Sync + 'static,
    ) -> Result<TargetedDpc, NtStatus> {
        let inner = heap::uncharged(|| {
            Arc::new(Inner {
                dpc: self.new_dpc(routine),
                queued: Mutex::new(false),
                wake: Condvar::new(),
                stop: AtomicBool::new(false),
                runs: AtomicU64::new(0),
            })
        });
        let for_thread = Arc::clone(&inner);
        let platform = self.clone();
        let label = format!("{name}-cpu{processor}");
        let thread = heap::uncharged(|| {
            thread::Builder::new()
                .name(label.clone())
                .spawn(move || run(&platform, &label, &for_thread))
        })
        .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        Ok(TargetedDpc {
            inner,
            processor,
            thread_id: thread.thread().id(),
            thread: Mutex::new(Some(thread)),
        })
    }
}

/// The processor's loop: waits until its DPC is queued, runs it.
fn run(platform: &HostPlatform, label: &str, inner: &Inner) {
    loop {
        {
            let mut queued = inner.queued.lock().unwrap_or_else(PoisonError::into_inner);
            while !*queued && !inner.stop.load(Ordering::Acquire) {
                queued = inner
                    .wake
                    .wait(queued)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            if inner.stop.load(Ordering::Acquire) {
                return;
            }
            *queued = false;
        }
        inner.runs.fetch_add(1, Ordering::Relaxed);
        // At PASSIVE_LEVEL on its own processor, the insert runs it at
        // once (raise to DISPATCH_LEVEL, run, checks, lower).
        platform.run_guarded(label, || {
            inner.dpc.insert();
        });
    }
}

impl TargetedDpc {
    /// Queues the DPC on its processor (KeInsertQueueDpc). Returns false
    /// if it was already queued and not yet started (it runs once).
    ///
    /// IRQL: any (an ISR inserts it at DIRQL). Allocates nothing.
    pub fn insert(&self) -> bool {
        let mut queued = self
            .inner
            .queued
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if *queued {
            return false;
        }
        *queued = true;
        self.inner.wake.notify_one();
        true
    }

    /// The processor it is targeted to.
    #[must_use]
    pub const fn processor(&self) -> u32 {
        self.processor
    }

    /// How many times it started.
    #[must_use]
    pub fn runs(&self) -> u64 {
        self.inner.runs.load(Ordering::Relaxed)
    }
}

impl TargetedDpc {
    /// Takes its processor away: waits for the DPC it is running, if any,
    /// and ends its thread (a DPC queued but not started is not run), as a
    /// driver's unload flushes its DPCs (`KeFlushQueuedDpcs`) before its
    /// memory goes. Later calls, and `insert`s, do nothing.
    ///
    /// IRQL: PASSIVE_LEVEL (it waits).
    pub fn stop(&self) {
        {
            let _g = self
                .inner
                .queued
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            self.inner.stop.store(true, Ordering::Release);
            self.inner.wake.notify_one();
        }
        let thread = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(t) = thread {
            // Stopped from its own routine (the last reference to the
            // device went there): it ends when the routine returns.
            if thread::current().id() != self.thread_id {
                let _ = t.join();
            }
        }
    }
}

impl Drop for TargetedDpc {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::{HostConfig, current_irql};
    use irpverbs_core::platform::DISPATCH_LEVEL;
    use std::sync::atomic::AtomicUsize;
    use std::time::{Duration, Instant};

    /// Two targeted DPCs run at the same time: each waits, at
    /// DISPATCH_LEVEL, until it sees the other started.
    #[test]
    fn two_processors_run_their_dpcs_concurrently() {
        let platform = HostPlatform::new(HostConfig::default());
        let started = Arc::new([AtomicBool::new(false), AtomicBool::new(false)]);
        let met = Arc::new(AtomicUsize::new(0));
        let dpcs: Vec<TargetedDpc> = (0..2)
            .map(|i| {
                let (started, met) = (Arc::clone(&started), Arc::clone(&met));
                platform
                    .new_targeted_dpc("test", i as u32, move || {
                        assert_eq!(current_irql(), DISPATCH_LEVEL);
                        started[i].store(true, Ordering::SeqCst);
                        let deadline = Instant::now() + Duration::from_secs(10);
                        while !started[1 - i].load(Ordering::SeqCst) {
                            assert!(Instant::now() < deadline, "the other DPC never ran");
                            std::hint::spin_loop();
                        }
                        met.fetch_add(1, Ordering::SeqCst);
                    })
                    .unwrap()
            })
            .collect();
        assert!(dpcs[0].insert());
        assert!(dpcs[1].insert());
        let deadline = Instant::now() + Duration::from_secs(20);
        while met.load(Ordering::SeqCst) < 2 && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(met.load(Ordering::SeqCst), 2, "both met the other");
        assert_eq!(platform.background_bugcheck(), None);
        assert_eq!((dpcs[0].runs(), dpcs[1].runs()), (1, 1));
        assert_eq!((dpcs[0].processor(), dpcs[1].processor()), (0, 1));
    }
}
