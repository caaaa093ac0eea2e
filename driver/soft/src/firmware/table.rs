//! A numbered object table with a free list, as firmware keeps its PDs, CQs,
//! SRQs, AHs and MRs.
//!
//! Numbers start at 1 and freed numbers are reused, most recently freed
//! first. Memory is only allocated when the table grows, fallibly (an
//! allocation failure is `STATUS_INSUFFICIENT_RESOURCES`, never an abort);
//! removing never allocates. Each slot keeps a generation that changes every time the slot is
//! filled; MR keys carry it so that a stale key is detected.

use alloc::vec::Vec;

use irpverbs_abi::{NtStatus, STATUS_INSUFFICIENT_RESOURCES, STATUS_INVALID_HANDLE};

#[derive(Clone, Debug, PartialEq, Eq)]
struct Slot<T> {
    generation: u8,
    value: Option<T>,
}

/// Objects keyed by small numbers from 1, at most `max` live at once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Table<T> {
    slots: Vec<Slot<T>>,
    /// Indices of empty slots; the last one is reused first.
    free: Vec<u32>,
    live: usize,
    max: u32,
}

impl<T> Table<T> {
    /// An empty table holding at most `max` objects.
    pub(crate) const fn new(max: u32) -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
            max,
        }
    }

    /// Live objects.
    pub(crate) const fn len(&self) -> usize {
        self.live
    }

    /// Fails unless one more object fits.
    pub(crate) fn check_room(&self) -> Result<(), NtStatus> {
        if self.live < self.max as usize {
            Ok(())
        } else {
            Err(STATUS_INSUFFICIENT_RESOURCES)
        }
    }

    /// Stores `value` and returns its number.
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES` when `max` objects are live or memory
    /// runs out.
    pub(crate) fn insert(&mut self, value: T) -> Result<u32, NtStatus> {
        self.check_room()?;
        let index = if let Some(index) = self.free.pop() {
            index
        } else {
            let index =
                u32::try_from(self.slots.len()).map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
            // Grow fallibly, and keep room in the free list for every slot so
            // that `remove` never allocates.
            self.slots
                .try_reserve(1)
                .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
            self.free
                .try_reserve(self.slots.len() + 1 - self.free.len())
                .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
            self.slots.push(Slot {
                generation: 0,
                value: None,
            });
            index
        };
        let slot = &mut self.slots[index as usize];
        slot.generation = slot.generation.wrapping_add(1);
        slot.value = Some(value);
        self.live += 1;
        Ok(index + 1)
    }

    /// The slot index of number `n`.
    fn index(n: u32) -> Option<usize> {
        usize::try_from(n.checked_sub(1)?).ok()
    }

    fn slot(&self, n: u32) -> Option<&Slot<T>> {
        self.slots.get(Self::index(n)?)
    }

    /// The object numbered `n`.
    ///
    /// # Errors
    /// `STATUS_INVALID_HANDLE` when there is none.
    pub(crate) fn get(&self, n: u32) -> Result<&T, NtStatus> {
        self.slot(n)
            .and_then(|s| s.value.as_ref())
            .ok_or(STATUS_INVALID_HANDLE)
    }

    /// The object numbered `n`, mutably.
    ///
    /// # Errors
    /// `STATUS_INVALID_HANDLE` when there is none.
    pub(crate) fn get_mut(&mut self, n: u32) -> Result<&mut T, NtStatus> {
        Self::index(n)
            .and_then(|i| self.slots.get_mut(i))
            .and_then(|s| s.value.as_mut())
            .ok_or(STATUS_INVALID_HANDLE)
    }

    /// The generation of live object `n`: it changed when the slot was last
    /// filled.
    ///
    /// # Errors
    /// `STATUS_INVALID_HANDLE` when there is no object `n`.
    pub(crate) fn generation(&self, n: u32) -> Result<u8, NtStatus> {
        match self.slot(n) {
            Some(s) if s.value.is_some() => Ok(s.generation),
            _ => Err(STATUS_INVALID_HANDLE),
        }
    }

    /// Sets live object `n`'s generation (a fast-register MR's key byte,
    /// which its registration chooses).
    ///
    /// # Errors
    /// `STATUS_INVALID_HANDLE` when there is no object `n`.
    pub(crate) fn set_generation(&mut self, n: u32, generation: u8) -> Result<(), NtStatus> {
        let slot = Self::index(n)
            .and_then(|i| self.slots.get_mut(i))
            .filter(|s| s.value.is_some())
            .ok_or(STATUS_INVALID_HANDLE)?;
        slot.generation = generation;
        Ok(())
    }

    /// The number of the first live object numbered `from` or above.
    pub(crate) fn next_live(&self, from: u32) -> Option<u32> {
        let start = Self::index(from.max(1))?;
        let at = self
            .slots
            .get(start..)?
            .iter()
            .position(|s| s.value.is_some())?;
        u32::try_from(start + at + 1).ok()
    }

    /// Removes every object and frees their numbers (generations stay, so
    /// keys of the removed objects never match again), calling `each` on
    /// every one; returns them, or, when memory for the list is short,
    /// drops them here and returns an empty list. Never allocates
    /// infallibly (the free list has room for every slot).
    pub(crate) fn take_all(&mut self, mut each: impl FnMut(&T)) -> Vec<T> {
        let mut taken = irpverbs_ring::try_vec(self.live).unwrap_or_default();
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if let Some(value) = slot.value.take() {
                each(&value);
                if taken.len() < taken.capacity() {
                    taken.push(value);
                }
                self.free.push(i as u32);
            }
        }
        self.live = 0;
        taken
    }

    /// Removes object `n` and frees its number.
    ///
    /// # Errors
    /// `STATUS_INVALID_HANDLE` when there is none.
    pub(crate) fn remove(&mut self, n: u32) -> Result<T, NtStatus> {
        let value = Self::index(n)
            .and_then(|i| self.slots.get_mut(i))
            .and_then(|s| s.value.take())
            .ok_or(STATUS_INVALID_HANDLE)?;
        self.free.push(n - 1);
        self.live -= 1;
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without memory for the list, `take_all` still empties the table
    /// (dropping the objects itself) and visits every object.
    #[test]
    fn take_all_without_memory_drops_in_place() {
        let mut t = Table::new(3);
        let (a, b) = (alloc::sync::Arc::new(1), alloc::sync::Arc::new(2));
        assert_eq!(t.insert(a.clone()), Ok(1));
        assert_eq!(t.insert(b.clone()), Ok(2));
        let mut seen = 0;
        let (taken, failed) = irpverbs_failalloc::failing_nth(0, || t.take_all(|_| seen += 1));
        assert!(failed && taken.is_empty());
        assert_eq!((seen, t.len()), (2, 0));
        assert_eq!(alloc::sync::Arc::strong_count(&a), 1, "dropped");
        assert_eq!(alloc::sync::Arc::strong_count(&b), 1, "dropped");
        let ((), failed) = irpverbs_failalloc::failing_nth(0, || {
            assert_eq!(t.insert(a.clone()), Ok(2), "a free number, no allocation");
        });
        assert!(!failed);
    }

    #[test]
    fn take_all_empties_and_keys_stay_stale() {
        let mut t = Table::new(3);
        assert_eq!(t.insert('a'), Ok(1));
        assert_eq!(t.insert('b'), Ok(2));
        let g = t.generation(1).unwrap();
        assert_eq!(t.take_all(|_| {}), ['a', 'b']);
        assert_eq!(t.len(), 0);
        assert_eq!(t.get(1), Err(STATUS_INVALID_HANDLE));
        let n = t.insert('c').unwrap();
        assert_ne!(
            t.generation(n),
            Ok(g),
            "a refilled slot has a new generation"
        );
        assert!(t.insert('d').is_ok() && t.insert('e').is_ok());
        assert!(t.insert('f').is_err(), "max still holds");
    }

    #[test]
    fn numbers_start_at_one_and_are_reused() {
        let mut t = Table::new(3);
        assert_eq!(t.insert('a'), Ok(1));
        assert_eq!(t.insert('b'), Ok(2));
        assert_eq!(t.generation(2), Ok(1));
        assert_eq!(t.remove(2), Ok('b'));
        assert_eq!(t.get(2), Err(STATUS_INVALID_HANDLE));
        assert_eq!(t.generation(2), Err(STATUS_INVALID_HANDLE));
        assert_eq!(t.insert('c'), Ok(2));
        assert_eq!(t.generation(2), Ok(2));
        assert_eq!(t.get(2), Ok(&'c'));
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn limit_and_unknown_numbers() {
        let mut t = Table::new(1);
        assert_eq!(t.insert(()), Ok(1));
        assert_eq!(t.insert(()), Err(STATUS_INSUFFICIENT_RESOURCES));
        for n in [0, 2, u32::MAX] {
            assert_eq!(t.get(n), Err(STATUS_INVALID_HANDLE));
            assert_eq!(t.get_mut(n), Err(STATUS_INVALID_HANDLE));
            assert_eq!(t.remove(n), Err(STATUS_INVALID_HANDLE));
        }
        assert_eq!(t.remove(1), Ok(()));
        assert_eq!(t.remove(1), Err(STATUS_INVALID_HANDLE));
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn generation_wraps() {
        let mut t = Table::new(1);
        for i in 1..=300u32 {
            assert_eq!(t.insert(()), Ok(1));
            assert_eq!(t.generation(1), Ok((i % 256) as u8));
            t.remove(1).unwrap();
        }
    }
}
