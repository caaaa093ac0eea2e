//! Work items run at PASSIVE_LEVEL on a system worker thread
//! (IO_WORKITEM / WDFWORKITEM).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};

use irpverbs_core::platform::{DISPATCH_LEVEL, PASSIVE_LEVEL};

use super::bugcheck::{self, BugCheck};
use super::irql;
use super::{heap, pool::Pool};

struct ItemInner {
    id: u64,
    queued: AtomicBool,
    routine: Arc<dyn Fn() + Send + Sync>,
}

enum Job {
    Item(Arc<ItemInner>),
    Once(u64, Box<dyn FnOnce() + Send>),
}

impl Job {
    fn id(&self) -> u64 {
        match self {
            Self::Item(item) => item.id,
            Self::Once(id, _) => *id,
        }
    }
}

#[derive(Default)]
struct State {
    queue: VecDeque<Job>,
    /// Queued plus running.
    pending: usize,
    /// The id of the job running, for diagnostics.
    running: Option<u64>,
    stop: bool,
}

/// A platform's system worker.
pub(crate) struct Worker {
    verify: bool,
    state: Mutex<State>,
    wake: Condvar,
    idle: Condvar,
    background: Arc<Mutex<Option<BugCheck>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The pool the driver's work items charge their allocations to.
    pool: Option<Arc<Pool>>,
}

impl Worker {
    pub(crate) fn new(
        verify: bool,
        background: Arc<Mutex<Option<BugCheck>>>,
        pool: Option<Arc<Pool>>,
    ) -> Self {
        Self {
            pool,
            verify,
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            idle: Condvar::new(),
            background,
            thread: Mutex::new(None),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queued or running jobs, and the id of one of them.
    pub(crate) fn pending(&self) -> (usize, u64) {
        let state = self.state();
        let id = state
            .running
            .or_else(|| state.queue.front().map(Job::id))
            .unwrap_or(0);
        (state.pending, id)
    }

    /// Queues `job` (the system's own memory: uncharged).
    fn push(self: &Arc<Self>, job: Job) {
        heap::uncharged(|| self.push_uncharged(job));
    }

    fn push_uncharged(self: &Arc<Self>, job: Job) {
        let mut state = self.state();
        state.queue.push_back(job);
        state.pending += 1;
        drop(state);
        self.ensure_thread();
        self.wake.notify_one();
    }

    pub(crate) fn queue_once(self: &Arc<Self>, id: u64, f: Box<dyn FnOnce() + Send>) {
        irql::check_irql_at_most(self.verify, DISPATCH_LEVEL, "queue_work");
        self.push(Job::Once(id, f));
    }

    /// Waits until nothing is queued or running.
    pub(crate) fn flush(&self) {
        let on_worker = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .is_some_and(|h| h.thread().id() == thread::current().id());
        assert!(!on_worker, "flush_work() from a work item would deadlock");
        let mut state = self.state();
        while state.pending > 0 {
            state = self
                .idle
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn ensure_thread(self: &Arc<Self>) {
        let mut thread = self.thread.lock().unwrap_or_else(PoisonError::into_inner);
        if thread.is_some() {
            return;
        }
        let worker = Arc::clone(self);
        *thread = Some(
            thread::Builder::new()
                .name("irpverbs-worker".into())
                .spawn(move || worker.run())
                .expect("spawn the worker thread"),
        );
    }

    fn run(&self) {
        let mut state = self.state();
        loop {
            if state.stop {
                return;
            }
            let Some(job) = state.queue.pop_front() else {
                state = self
                    .wake
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
                continue;
            };
            state.running = Some(job.id());
            drop(state);
            bugcheck::run_guarded(&self.background, "irpverbs-worker", || {
                let run = || match job {
                    Job::Item(item) => {
                        item.queued.store(false, Ordering::Release);
                        (item.routine)();
                    }
                    Job::Once(_, f) => f(),
                };
                match &self.pool {
                    Some(pool) => heap::driver(pool, run),
                    None => run(),
                }
                irql::check_returned_at(self.verify, PASSIVE_LEVEL, "a work item");
            });
            state = self.state();
            state.running = None;
            state.pending -= 1;
            if state.pending == 0 {
                self.idle.notify_all();
            }
        }
    }

    /// Drops queued jobs and stops the thread (after the one running).
    pub(crate) fn shutdown(&self) {
        {
            let mut state = self.state();
            state.stop = true;
            let dropped = state.queue.len();
            state.queue.clear();
            state.pending -= dropped;
        }
        self.wake.notify_all();
        self.idle.notify_all();
        let handle = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(handle) = handle {
            if handle.thread().id() != thread::current().id() {
                let _ = handle.join();
            }
        }
    }
}

/// A work item (WDFWORKITEM): its routine runs at PASSIVE_LEVEL on the
/// platform's worker thread each time it is enqueued. Cloning gives another
/// handle to the same item.
#[derive(Clone)]
pub struct WorkItem {
    inner: Arc<ItemInner>,
    worker: Arc<Worker>,
}

impl std::fmt::Debug for WorkItem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkItem")
            .field("id", &self.inner.id)
            .field("queued", &self.is_queued())
            .finish_non_exhaustive()
    }
}

impl WorkItem {
    pub(crate) fn new(id: u64, routine: Arc<dyn Fn() + Send + Sync>, worker: Arc<Worker>) -> Self {
        Self {
            inner: Arc::new(ItemInner {
                id,
                queued: AtomicBool::new(false),
                routine,
            }),
            worker,
        }
    }

    /// The item's id.
    #[must_use]
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// Queues the item (WdfWorkItemEnqueue); returns `false` if it was
    /// already queued and not yet started (it will run once).
    ///
    /// IRQL: <= DISPATCH_LEVEL (else 0xC4/0xE5).
    #[track_caller]
    pub fn enqueue(&self) -> bool {
        irql::check_irql_at_most(self.worker.verify, DISPATCH_LEVEL, "WorkItem::enqueue");
        if self.inner.queued.swap(true, Ordering::AcqRel) {
            return false;
        }
        self.worker.push(Job::Item(Arc::clone(&self.inner)));
        true
    }

    /// Whether it is queued and not yet started.
    #[must_use]
    pub fn is_queued(&self) -> bool {
        self.inner.queued.load(Ordering::Acquire)
    }
}
