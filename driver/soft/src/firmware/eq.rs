//! The event queue: command completions, completion events and async
//! events, which the driver drains from its DPC.
//!
//! Bounded, and never loses a command completion: the firmware reserves room
//! for everything a command may produce ([`EVENTS_PER_COMMAND`] entries)
//! before it executes the command. When there is no room the queue records
//! that it stalled the firmware, and the next [`EventQueue::pop`] reports that
//! the firmware should be kicked again. The data path cannot wait: its
//! events use the room not reserved ([`EventQueue::push`]), and one that
//! finds none is lost and counted (`SoftStats::events_lost`; on real HCAs
//! an event queue overrun is device-fatal).
//!
//! Interrupt moderation is the usual arm/fire: an armed queue fires once on
//! its next entry and disarms; the driver drains it and re-arms, and arming
//! a queue that holds entries fires at once. The queue only decides; the
//! caller raises the interrupt after releasing the lock.
//!
//! [`EVENTS_PER_COMMAND`]: crate::config::EVENTS_PER_COMMAND

use alloc::collections::VecDeque;

use irpverbs_abi::{NtStatus, STATUS_INSUFFICIENT_RESOURCES};
use irpverbs_core::Event;

/// The event queue's state, kept under `EQ_LOCK`.
#[derive(Debug)]
pub(crate) struct EventQueue {
    entries: VecDeque<Event>,
    capacity: usize,
    /// Entries promised to a command being executed.
    reserved: usize,
    /// The next entry raises the interrupt.
    armed: bool,
    /// The firmware found no room and waits for a pop.
    stalled: bool,
    /// Most entries ever held at once.
    high_water: usize,
}

impl EventQueue {
    /// An empty, disarmed queue of `capacity` entries (allocated now, so the
    /// command path never allocates for it).
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES`.
    pub(crate) fn new(capacity: usize) -> Result<Self, NtStatus> {
        let mut entries = VecDeque::new();
        entries
            .try_reserve_exact(capacity)
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        Ok(Self {
            entries,
            capacity,
            reserved: 0,
            armed: false,
            stalled: false,
            high_water: 0,
        })
    }

    /// Reserves room for `n` entries. Without room, records the stall and
    /// returns false.
    pub(crate) fn try_reserve(&mut self, n: usize) -> bool {
        if self.entries.len() + self.reserved + n <= self.capacity {
            self.reserved += n;
            true
        } else {
            self.stalled = true;
            false
        }
    }

    /// Gives back `n` reserved entries that were not used.
    pub(crate) fn release(&mut self, n: usize) {
        debug_assert!(n <= self.reserved);
        self.reserved = self.reserved.saturating_sub(n);
    }

    /// Appends an entry into reserved room. Returns true when the queue was
    /// armed: it is now disarmed and the caller must raise the interrupt.
    pub(crate) fn push_reserved(&mut self, event: Event) -> bool {
        debug_assert!(self.reserved > 0);
        self.reserved = self.reserved.saturating_sub(1);
        self.entries.push_back(event);
        self.high_water = self.high_water.max(self.entries.len());
        core::mem::take(&mut self.armed)
    }

    /// Appends a data-path entry (a completion or async event), outside the
    /// room reserved for commands. Returns whether to raise the interrupt,
    /// or `None` when there is no room: the entry is lost (an event queue
    /// overrun, counted by the caller).
    pub(crate) fn push(&mut self, event: Event) -> Option<bool> {
        if self.entries.len() + self.reserved >= self.capacity {
            return None;
        }
        self.entries.push_back(event);
        self.high_water = self.high_water.max(self.entries.len());
        Some(core::mem::take(&mut self.armed))
    }

    /// Takes the oldest entry. The flag is true when the firmware had stalled
    /// for room and should run again.
    pub(crate) fn pop(&mut self) -> (Option<Event>, bool) {
        let event = self.entries.pop_front();
        let kick = event.is_some() && core::mem::take(&mut self.stalled);
        (event, kick)
    }

    /// Arms the interrupt. Returns true when entries are pending: the queue
    /// stays disarmed and the caller must raise the interrupt now.
    pub(crate) fn arm(&mut self) -> bool {
        if self.entries.is_empty() {
            self.armed = true;
            false
        } else {
            self.armed = false;
            true
        }
    }

    /// Most entries ever held at once.
    pub(crate) const fn high_water(&self) -> usize {
        self.high_water
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use irpverbs_core::AsyncEvent;

    fn ev(n: u32) -> Event {
        Event::Async(AsyncEvent::QpFatal(n))
    }

    #[test]
    fn armed_queue_fires_once() {
        let mut q = EventQueue::new(4).unwrap();
        assert!(q.try_reserve(2));
        assert!(!q.push_reserved(ev(1)), "disarmed: no interrupt");
        assert!(q.arm(), "arming with an entry pending fires at once");
        assert!(!q.push_reserved(ev(2)), "firing disarmed it");
        assert_eq!(q.pop(), (Some(ev(1)), false));
        assert_eq!(q.pop(), (Some(ev(2)), false));
        assert_eq!(q.pop(), (None, false));
        assert!(!q.arm());
        assert!(q.try_reserve(1));
        assert!(q.push_reserved(ev(3)), "armed: fires");
        assert!(q.try_reserve(1));
        assert!(!q.push_reserved(ev(4)), "and only once");
        assert_eq!(q.high_water(), 2);
    }

    #[test]
    fn reservation_bounds_the_queue_and_a_pop_unstalls() {
        let mut q = EventQueue::new(3).unwrap();
        assert!(q.try_reserve(2));
        assert!(!q.try_reserve(2), "two reserved, one free");
        q.push_reserved(ev(1));
        q.release(1);
        assert!(q.try_reserve(2));
        q.push_reserved(ev(2));
        q.push_reserved(ev(3));
        assert!(!q.try_reserve(1), "full");
        assert_eq!(
            q.pop(),
            (Some(ev(1)), true),
            "the stalled firmware is kicked"
        );
        assert_eq!(q.pop(), (Some(ev(2)), false), "once");
        assert_eq!(q.high_water(), 3);
    }
}
