//! Kernel timers (KTIMER + KDPC) on a real or a virtual clock.
//!
//! With [`TimerClock::Real`] one host thread per platform plays the
//! processor whose clock interrupt fires timers: it runs each due timer's
//! DPC at DISPATCH_LEVEL. With [`TimerClock::Virtual`] time stands still
//! until [`HostPlatform::advance`](super::HostPlatform::advance) moves it,
//! firing due timers inline, in deadline order — deterministic tests.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use irpverbs_core::platform::DISPATCH_LEVEL;

use super::bugcheck::{self, BugCheck};
use super::irql::{self, Dpc};

/// Which clock drives timers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TimerClock {
    /// Wall-clock time; a host thread fires timers.
    #[default]
    Real,
    /// Time moves only in `advance`, which fires due timers on the caller's
    /// thread.
    Virtual,
}

/// Nanoseconds as a saturating `u64`.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// One queue entry; stale when its timer was re-set or cancelled since
/// (`generation` no longer matches).
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    deadline: u64,
    seq: u64,
    timer: u64,
    generation: u64,
}

struct Armed {
    generation: u64,
    period: Option<u64>,
    dpc: Dpc,
}

#[derive(Default)]
struct State {
    virtual_now: u64,
    queue: BinaryHeap<Reverse<Entry>>,
    armed: HashMap<u64, Armed>,
    next_seq: u64,
    stop: bool,
    /// Real clock: the deadline the timer thread sleeps until (`u64::MAX`
    /// with nothing armed), `None` while it runs. A timer set later than
    /// that does not wake it (a futex wake and two context switches per
    /// set, and the CM sets its timer on every MAD it sends).
    sleeping_until: Option<u64>,
}

impl State {
    fn push(&mut self, timer: u64, deadline: u64) -> u64 {
        self.next_seq += 1;
        let seq = self.next_seq;
        self.queue.push(Reverse(Entry {
            deadline,
            seq,
            timer,
            generation: seq,
        }));
        seq
    }

    /// Takes the earliest timer due at `now`, re-arming it if periodic.
    /// `catch_up` (real clock): a periodic timer that fell behind is next
    /// due one period from now rather than firing a burst.
    fn pop_due(&mut self, now: u64, catch_up: bool) -> Option<(Dpc, u64)> {
        while let Some(Reverse(top)) = self.queue.peek() {
            if top.deadline > now {
                return None;
            }
            let Reverse(entry) = self.queue.pop()?;
            let Some(armed) = self.armed.get(&entry.timer) else {
                continue;
            };
            if armed.generation != entry.generation {
                continue;
            }
            let dpc = armed.dpc.clone();
            match armed.period {
                Some(period) => {
                    let mut next = entry.deadline.saturating_add(period);
                    if catch_up && next <= now {
                        next = now.saturating_add(period);
                    }
                    let generation = self.push(entry.timer, next);
                    if let Some(armed) = self.armed.get_mut(&entry.timer) {
                        armed.generation = generation;
                    }
                }
                None => {
                    self.armed.remove(&entry.timer);
                }
            }
            return Some((dpc, entry.deadline));
        }
        None
    }

    fn earliest(&self) -> Option<u64> {
        self.queue.peek().map(|Reverse(e)| e.deadline)
    }
}

/// A platform's timer queue.
pub(crate) struct Timers {
    clock: TimerClock,
    epoch: Instant,
    verify: bool,
    state: Mutex<State>,
    wake: Condvar,
    background: Arc<Mutex<Option<BugCheck>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Timers {
    pub(crate) fn new(
        clock: TimerClock,
        verify: bool,
        background: Arc<Mutex<Option<BugCheck>>>,
    ) -> Self {
        Self {
            clock,
            epoch: Instant::now(),
            verify,
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            background,
            thread: Mutex::new(None),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn clock(&self) -> TimerClock {
        self.clock
    }

    fn now_nanos(&self, state: &State) -> u64 {
        match self.clock {
            TimerClock::Real => nanos(self.epoch.elapsed()),
            TimerClock::Virtual => state.virtual_now,
        }
    }

    pub(crate) fn now(&self) -> Duration {
        let state = self.state();
        Duration::from_nanos(self.now_nanos(&state))
    }

    /// Ids of timers still armed.
    pub(crate) fn armed(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.state().armed.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    fn set(
        self: &Arc<Self>,
        timer: u64,
        dpc: &Dpc,
        due: Duration,
        period: Option<Duration>,
    ) -> bool {
        let mut state = self.state();
        let deadline = self.now_nanos(&state).saturating_add(nanos(due));
        let generation = state.push(timer, deadline);
        let period = period.filter(|p| !p.is_zero()).map(nanos);
        let was_armed = state
            .armed
            .insert(
                timer,
                Armed {
                    generation,
                    period,
                    dpc: dpc.clone(),
                },
            )
            .is_some();
        let wake = state.sleeping_until.is_some_and(|s| deadline < s);
        drop(state);
        if self.clock == TimerClock::Real {
            self.ensure_thread();
            if wake {
                self.wake.notify_all();
            }
        }
        was_armed
    }

    fn cancel(&self, timer: u64) -> bool {
        self.state().armed.remove(&timer).is_some()
    }

    fn is_armed(&self, timer: u64) -> bool {
        self.state().armed.contains_key(&timer)
    }

    /// The earliest deadline of an armed timer (stale queue entries of
    /// timers re-set or cancelled since are dropped on the way).
    pub(crate) fn next_deadline(&self) -> Option<Duration> {
        let mut state = self.state();
        while let Some(Reverse(top)) = state.queue.peek() {
            let live = state
                .armed
                .get(&top.timer)
                .is_some_and(|a| a.generation == top.generation);
            if live {
                return Some(Duration::from_nanos(top.deadline));
            }
            state.queue.pop();
        }
        None
    }

    /// Virtual clock: moves time forward by `by`, firing every timer that
    /// comes due, in deadline order, on this thread.
    pub(crate) fn advance(&self, by: Duration) {
        assert_eq!(
            self.clock,
            TimerClock::Virtual,
            "advance() needs TimerClock::Virtual"
        );
        let mut state = self.state();
        let target = state.virtual_now.saturating_add(nanos(by));
        while let Some((dpc, deadline)) = state.pop_due(target, false) {
            state.virtual_now = state.virtual_now.max(deadline);
            drop(state);
            dpc.insert();
            state = self.state();
        }
        state.virtual_now = target;
    }

    fn ensure_thread(self: &Arc<Self>) {
        let mut thread = self.thread.lock().unwrap_or_else(PoisonError::into_inner);
        if thread.is_some() {
            return;
        }
        let timers = Arc::clone(self);
        *thread = Some(
            thread::Builder::new()
                .name("irpverbs-timer".into())
                .spawn(move || timers.run())
                .expect("spawn the timer thread"),
        );
    }

    /// The timer thread: sleeps until the earliest deadline, then runs the
    /// due timer's DPC at DISPATCH_LEVEL.
    fn run(&self) {
        let mut state = self.state();
        loop {
            if state.stop {
                return;
            }
            let now = self.now_nanos(&state);
            if let Some((dpc, _)) = state.pop_due(now, true) {
                drop(state);
                bugcheck::run_guarded(&self.background, "irpverbs-timer", || {
                    let old = irql::current_irql();
                    irql::set_irql(DISPATCH_LEVEL);
                    dpc.insert();
                    irql::lower_to(old);
                });
                state = self.state();
                continue;
            }
            let earliest = state.earliest();
            state.sleeping_until = Some(earliest.unwrap_or(u64::MAX));
            state = match earliest {
                Some(deadline) => {
                    self.wake
                        .wait_timeout(state, Duration::from_nanos(deadline - now))
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
                None => self
                    .wake
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner),
            };
            state.sleeping_until = None;
        }
    }

    /// Disarms everything and stops the timer thread (unload, or the
    /// platform going away).
    pub(crate) fn shutdown(&self) {
        {
            let mut state = self.state();
            state.stop = true;
            state.armed.clear();
            state.queue.clear();
        }
        self.wake.notify_all();
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

/// A kernel timer with its DPC (KTIMER + KDPC, or a WDFTIMER).
///
/// When due, its routine runs at DISPATCH_LEVEL: on the timer thread with
/// the real clock, inline in `advance` with the virtual one. Dropping the
/// handle does not disarm it (as with a freed KTIMER, the verifier reports
/// a timer still armed at unload with 0xC7): call [`cancel`](Self::cancel).
pub struct HostTimer {
    id: u64,
    dpc: Dpc,
    timers: Arc<Timers>,
}

impl std::fmt::Debug for HostTimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostTimer")
            .field("id", &self.id)
            .field("armed", &self.is_armed())
            .finish_non_exhaustive()
    }
}

impl HostTimer {
    pub(crate) fn new(id: u64, dpc: Dpc, timers: Arc<Timers>) -> Self {
        Self { id, dpc, timers }
    }

    /// The timer's id (what bugcheck parameters show as its address).
    #[must_use]
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Arms the timer to fire `due` from now, then every `period` if given
    /// (KeSetTimerEx). Re-setting an armed timer replaces its schedule.
    /// Returns whether it was already armed.
    ///
    /// IRQL: <= DISPATCH_LEVEL (else 0xC4/0xE5).
    #[track_caller]
    pub fn set(&self, due: Duration, period: Option<Duration>) -> bool {
        irql::check_irql_at_most(self.timers.verify, DISPATCH_LEVEL, "HostTimer::set");
        // The kernel's timer table: uncharged.
        super::heap::uncharged(|| self.timers.set(self.id, &self.dpc, due, period))
    }

    /// Disarms the timer (KeCancelTimer); returns whether it was armed. A
    /// DPC already queued or running is not stopped.
    ///
    /// IRQL: <= DISPATCH_LEVEL (else 0xC4/0xE5).
    #[track_caller]
    pub fn cancel(&self) -> bool {
        irql::check_irql_at_most(self.timers.verify, DISPATCH_LEVEL, "HostTimer::cancel");
        self.timers.cancel(self.id)
    }

    /// Whether it is armed (a one-shot timer disarms when it fires).
    #[must_use]
    pub fn is_armed(&self) -> bool {
        self.timers.is_armed(self.id)
    }
}
