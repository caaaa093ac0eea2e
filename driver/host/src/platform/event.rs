//! Kernel events (KEVENT) and the wait rules Driver Verifier enforces.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use irpverbs_core::platform::DISPATCH_LEVEL;

use super::bugcheck::{codes, stop, verifier};
use super::irql;

/// The two kinds of KEVENT.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// NotificationEvent: stays signaled until reset; wakes every waiter.
    Notification,
    /// SynchronizationEvent: a satisfied wait resets it; wakes one waiter.
    Synchronization,
}

struct EventInner {
    id: u64,
    kind: EventKind,
    verify: bool,
    signaled: Mutex<bool>,
    changed: Condvar,
}

/// A kernel event. Cloning gives another handle to the same event.
#[derive(Clone)]
pub struct HostEvent {
    inner: Arc<EventInner>,
}

impl std::fmt::Debug for HostEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostEvent")
            .field("id", &self.inner.id)
            .field("kind", &self.inner.kind)
            .field("signaled", &self.is_set())
            .finish()
    }
}

/// The timeout as bugcheck parameters show it (nanoseconds, `u64::MAX` for
/// none).
fn timeout_param(timeout: Option<Duration>) -> u64 {
    timeout.map_or(u64::MAX, |t| {
        u64::try_from(t.as_nanos()).unwrap_or(u64::MAX)
    })
}

impl HostEvent {
    pub(crate) fn new(id: u64, kind: EventKind, signaled: bool, verify: bool) -> Self {
        Self {
            inner: Arc::new(EventInner {
                id,
                kind,
                verify,
                signaled: Mutex::new(signaled),
                changed: Condvar::new(),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, bool> {
        self.inner
            .signaled
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The event's kind.
    #[must_use]
    pub fn kind(&self) -> EventKind {
        self.inner.kind
    }

    /// Signals the event (KeSetEvent); returns whether it was already
    /// signaled.
    ///
    /// IRQL: <= DISPATCH_LEVEL (the verifier bugchecks 0xC4/0x80 above).
    #[track_caller]
    pub fn set(&self) -> bool {
        if self.inner.verify {
            let now = irql::current_irql();
            if now > DISPATCH_LEVEL {
                stop(
                    codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
                    [
                        verifier::SET_EVENT_ABOVE_DISPATCH,
                        now.into(),
                        self.inner.id,
                        0,
                    ],
                    format!("event set at IRQL {now}"),
                );
            }
        }
        let mut signaled = self.state();
        let was = std::mem::replace(&mut *signaled, true);
        drop(signaled);
        match self.inner.kind {
            EventKind::Notification => self.inner.changed.notify_all(),
            EventKind::Synchronization => self.inner.changed.notify_one(),
        }
        was
    }

    /// Clears the event (KeResetEvent); returns whether it was signaled.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    pub fn reset(&self) -> bool {
        std::mem::replace(&mut *self.state(), false)
    }

    /// Whether it is signaled (KeReadStateEvent).
    #[must_use]
    pub fn is_set(&self) -> bool {
        *self.state()
    }

    /// Waits until the event is signaled or `timeout` passes
    /// (KeWaitForSingleObject); `None` waits forever. Returns `true` if
    /// signaled (STATUS_SUCCESS), `false` on timeout (STATUS_TIMEOUT). A
    /// satisfied wait on a synchronization event resets it.
    ///
    /// IRQL: <= APC_LEVEL, or DISPATCH_LEVEL with a zero timeout (a poll).
    /// The verifier bugchecks 0xC4 with 0x120 above DISPATCH_LEVEL, 0x121
    /// at DISPATCH_LEVEL without a timeout, 0x122 at DISPATCH_LEVEL with a
    /// non-zero one.
    #[track_caller]
    pub fn wait(&self, timeout: Option<Duration>) -> bool {
        if self.inner.verify {
            self.check_wait(timeout);
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut signaled = self.state();
        loop {
            if *signaled {
                if self.inner.kind == EventKind::Synchronization {
                    *signaled = false;
                }
                return true;
            }
            match deadline {
                None => {
                    signaled = self
                        .inner
                        .changed
                        .wait(signaled)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return false;
                    }
                    signaled = self
                        .inner
                        .changed
                        .wait_timeout(signaled, deadline - now)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
            }
        }
    }

    #[track_caller]
    fn check_wait(&self, timeout: Option<Duration>) {
        let now = irql::current_irql();
        let params = |sub| [sub, now.into(), self.inner.id, timeout_param(timeout)];
        if now > DISPATCH_LEVEL {
            stop(
                codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
                params(verifier::WAIT_ABOVE_DISPATCH),
                format!("wait at IRQL {now}"),
            );
        }
        if now == DISPATCH_LEVEL {
            match timeout {
                None => stop(
                    codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
                    params(verifier::WAIT_AT_DISPATCH_INFINITE),
                    "wait without a timeout at DISPATCH_LEVEL",
                ),
                Some(t) if !t.is_zero() => stop(
                    codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
                    params(verifier::WAIT_AT_DISPATCH_NONZERO),
                    format!("wait of {t:?} at DISPATCH_LEVEL"),
                ),
                Some(_) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    #[test]
    fn notification_event_wakes_waiter_and_stays_set() {
        let e = HostEvent::new(1, EventKind::Notification, false, true);
        let e2 = e.clone();
        let t = thread::spawn(move || e2.wait(None));
        assert!(!e.set());
        assert!(t.join().unwrap());
        assert!(e.is_set());
        assert!(e.wait(Some(Duration::ZERO)));
        assert!(e.reset());
        assert!(!e.wait(Some(Duration::from_millis(5))));
    }

    #[test]
    fn synchronization_event_auto_resets() {
        let e = HostEvent::new(1, EventKind::Synchronization, true, true);
        assert!(e.wait(Some(Duration::ZERO)));
        assert!(!e.is_set());
        assert!(!e.wait(Some(Duration::ZERO)));
    }
}
