//! Allocation that fails with a status instead of aborting.
//!
//! A kernel driver's pool allocation can fail at any time (Driver
//! Verifier's low-resources simulation makes it fail on purpose); `alloc`'s
//! infallible operations (`Vec::push`, `BTreeMap::insert`, `Box::new`)
//! turn a failure into `handle_alloc_error`, a bugcheck. The driver uses
//! these instead:
//!
//! - [`try_push`]: `Vec::push` through `try_reserve`;
//! - [`VecMap`]: an ordered map over a sorted `Vec` whose inserts reserve
//!   fallibly ([`VecMap::try_insert`]), or not at all
//!   ([`VecMap::insert_reserved`], for paths that cannot fail, after
//!   [`VecMap::reserve_total`] took the room when the object that will be
//!   inserted was created). Removal never allocates. For small maps
//!   looked up often (files, object numbers).
//! - [`SlabMap`]: the same ordered map for large values or many entries:
//!   the keys and slot numbers in a sorted ring (`VecDeque`), the values
//!   in a slab of slots that never move. An insert or a removal moves a
//!   few bytes per entry, and only on its shorter side, so keys that come
//!   and go in order (wait keys, deadlines) move nothing at all.
//!
//! `alloc`'s `BTreeMap` has no fallible insert (its nodes are allocated
//! inside `insert`) and the `no_std` crates that fork it
//! (`fallible_collections`) carry a copy of the standard library's B-tree
//! with its unsafe code; the maps here hold at most a few thousand entries
//! (files, CQ/QP/SRQ numbers, CEPs, pended waits) and are touched on the
//! control path only, where a sorted vector's O(n) insert is cheap and its
//! lookups (binary search over contiguous keys) are faster.
//!
//! IRQL: any (no locks; the caller's). Shared by the CM's engine and the
//! driver core (`irpverbs_core::fallible`).

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use core::ops::RangeInclusive;
use irpverbs_abi::{NtStatus, STATUS_INSUFFICIENT_RESOURCES};

/// `v.push(x)`, failing with `STATUS_INSUFFICIENT_RESOURCES` (and giving
/// `x` back) instead of aborting when the vector cannot grow.
///
/// # Errors
/// `(STATUS_INSUFFICIENT_RESOURCES, x)` when the allocation is refused.
pub fn try_push<T>(v: &mut Vec<T>, x: T) -> Result<(), (NtStatus, T)> {
    if v.try_reserve(1).is_err() {
        return Err((STATUS_INSUFFICIENT_RESOURCES, x));
    }
    v.push(x);
    Ok(())
}

/// `bytes.to_vec()`, failing instead of aborting.
///
/// # Errors
/// `STATUS_INSUFFICIENT_RESOURCES` when the allocation is refused.
pub fn try_to_vec(bytes: &[u8]) -> Result<Vec<u8>, NtStatus> {
    let mut v = Vec::new();
    v.try_reserve_exact(bytes.len())
        .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
    v.extend_from_slice(bytes);
    Ok(v)
}

/// A boxed copy of `x`, or `None` when the allocation is refused: the
/// fallible `Box::from(x)` (`Box::try_new` is not stable; a vector's
/// `try_reserve_exact` is).
pub fn try_box_slice<T: Copy>(x: &[T]) -> Option<alloc::boxed::Box<[T]>> {
    let mut v = Vec::new();
    v.try_reserve_exact(x.len()).ok()?;
    v.extend_from_slice(x);
    Some(v.into_boxed_slice())
}

/// Grows `v`'s capacity to at least `total` elements.
///
/// # Errors
/// `STATUS_INSUFFICIENT_RESOURCES` when the allocation is refused (`v` is
/// unchanged).
pub fn reserve_total<T>(v: &mut Vec<T>, total: usize) -> Result<(), NtStatus> {
    let more = total.saturating_sub(v.len());
    v.try_reserve(more)
        .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)
}

/// [`reserve_total`] for a map's sorted entries.
fn reserve_total_deque<T>(v: &mut VecDeque<T>, total: usize) -> Result<(), NtStatus> {
    let more = total.saturating_sub(v.len());
    v.try_reserve(more)
        .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)
}

/// Where `key` is in the sorted ring `entries` (`Ok`), or where it would
/// go (`Err`): a binary search of the one contiguous part that can hold
/// it, inlined into the map's operations.
#[inline]
fn find_in<K: Ord, V>(entries: &VecDeque<(K, V)>, key: &K) -> Result<usize, usize> {
    let (front, back) = entries.as_slices();
    match back.first() {
        Some((first, _)) if first <= key => back
            .binary_search_by(|(k, _)| k.cmp(key))
            .map(|i| i + front.len())
            .map_err(|i| i + front.len()),
        _ => front.binary_search_by(|(k, _)| k.cmp(key)),
    }
}

/// An ordered map over a sorted vector (see the module docs).
#[derive(Debug)]
pub struct VecMap<K, V> {
    entries: Vec<(K, V)>,
}

impl<K, V> Default for VecMap<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K, V> VecMap<K, V> {
    /// An empty map (no allocation).
    #[must_use]
    pub const fn new() -> Self {
        Self {
            entries: Vec::new(),
        }
    }
}

impl<K: Ord, V> VecMap<K, V> {
    /// Entries in the map.
    #[must_use]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Removes every entry, keeping the memory (never allocates).
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    fn find(&self, key: &K) -> Result<usize, usize> {
        self.entries.binary_search_by(|(k, _)| k.cmp(key))
    }

    /// The value under `key`.
    #[must_use]
    pub fn get(&self, key: &K) -> Option<&V> {
        self.find(key).ok().map(|i| &self.entries[i].1)
    }

    /// The value under `key`, mutably.
    pub fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        self.find(key).ok().map(|i| &mut self.entries[i].1)
    }

    /// True if `key` has a value.
    #[must_use]
    pub fn contains_key(&self, key: &K) -> bool {
        self.find(key).is_ok()
    }

    /// Makes room for `total` entries in all, so that inserts up to that
    /// many never allocate.
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES` when refused (nothing changes).
    pub fn reserve_total(&mut self, total: usize) -> Result<(), NtStatus> {
        reserve_total(&mut self.entries, total)
    }

    /// Inserts `value` under `key`, returning the value it replaced.
    ///
    /// # Errors
    /// The pair back when room for a new entry is refused (the map is
    /// unchanged).
    pub fn try_insert(&mut self, key: K, value: V) -> Result<Option<V>, (K, V)> {
        match self.find(&key) {
            Ok(i) => Ok(Some(core::mem::replace(&mut self.entries[i].1, value))),
            Err(i) => {
                if self.entries.try_reserve(1).is_err() {
                    return Err((key, value));
                }
                self.entries.insert(i, (key, value));
                Ok(None)
            }
        }
    }

    /// Inserts without allocating: the room must have been reserved
    /// ([`reserve_total`](Self::reserve_total)).
    ///
    /// # Errors
    /// The pair back if the map is full (a reservation was missed; the
    /// map is unchanged).
    pub fn insert_reserved(&mut self, key: K, value: V) -> Result<Option<V>, (K, V)> {
        match self.find(&key) {
            Ok(i) => Ok(Some(core::mem::replace(&mut self.entries[i].1, value))),
            Err(_) if self.entries.len() == self.entries.capacity() => Err((key, value)),
            Err(i) => {
                self.entries.insert(i, (key, value));
                Ok(None)
            }
        }
    }

    /// Removes `key`'s entry (never allocates; the room stays).
    pub fn remove(&mut self, key: &K) -> Option<V> {
        self.find(key).ok().map(|i| self.entries.remove(i).1)
    }

    /// The keys, in order.
    pub fn keys(&self) -> impl Iterator<Item = &K> + '_ {
        self.entries.iter().map(|(k, _)| k)
    }

    /// The values, in key order.
    pub fn values(&self) -> impl Iterator<Item = &V> + '_ {
        self.entries.iter().map(|(_, v)| v)
    }

    /// The values, mutably, in key order.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> + '_ {
        self.entries.iter_mut().map(|(_, v)| v)
    }

    /// The entries, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> + '_ {
        self.entries.iter().map(|(k, v)| (k, v))
    }

    /// The entries with keys in `range`, in key order.
    pub fn range(&self, range: RangeInclusive<K>) -> impl Iterator<Item = (&K, &V)> + '_ {
        let from = self.find(range.start()).unwrap_or_else(|i| i);
        self.entries[from..]
            .iter()
            .take_while(move |(k, _)| k <= range.end())
            .map(|(k, v)| (k, v))
    }

    /// The first entry (the least key).
    #[must_use]
    pub fn first(&self) -> Option<(&K, &V)> {
        self.entries.first().map(|(k, v)| (k, v))
    }

    /// Takes the first entry (never allocates).
    pub fn pop_first(&mut self) -> Option<(K, V)> {
        (!self.entries.is_empty()).then(|| self.entries.remove(0))
    }
}

/// A slot of a [`SlabMap`]: a value, or the next free slot's number
/// (`NO_SLOT` ends the free list).
#[derive(Debug)]
enum Slot<V> {
    Used(V),
    Free(u32),
}

/// The end of a [`SlabMap`]'s free list.
const NO_SLOT: u32 = u32::MAX;

/// An ordered map for large values (see the module docs): a sorted vector
/// of (key, slot) and the values in slots that never move while they are
/// in the map. Freed slots are reused (a free list through the slots
/// themselves), so removal never allocates and inserts up to the reserved
/// room never do.
#[derive(Debug)]
pub struct SlabMap<K, V> {
    index: VecDeque<(K, u32)>,
    slots: Vec<Slot<V>>,
    free: u32,
}

impl<K, V> Default for SlabMap<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K, V> SlabMap<K, V> {
    /// An empty map (no allocation).
    #[must_use]
    pub const fn new() -> Self {
        Self {
            index: VecDeque::new(),
            slots: Vec::new(),
            free: NO_SLOT,
        }
    }

    fn value(&self, slot: u32) -> Option<&V> {
        match self.slots.get(slot as usize) {
            Some(Slot::Used(v)) => Some(v),
            _ => None,
        }
    }
}

impl<K: Ord, V> SlabMap<K, V> {
    /// Entries in the map.
    #[must_use]
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// True when empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    fn find(&self, key: &K) -> Result<usize, usize> {
        find_in(&self.index, key)
    }

    /// The value under `key`.
    #[must_use]
    pub fn get(&self, key: &K) -> Option<&V> {
        let i = self.find(key).ok()?;
        self.value(self.index[i].1)
    }

    /// The value under `key`, mutably.
    pub fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        let i = self.find(key).ok()?;
        match self.slots.get_mut(self.index[i].1 as usize) {
            Some(Slot::Used(v)) => Some(v),
            _ => None,
        }
    }

    /// True if `key` has a value.
    #[must_use]
    pub fn contains_key(&self, key: &K) -> bool {
        self.find(key).is_ok()
    }

    /// Makes room for `total` entries in all, so that inserts up to that
    /// many never allocate.
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES` when refused (the entries are
    /// unchanged).
    pub fn reserve_total(&mut self, total: usize) -> Result<(), NtStatus> {
        reserve_total_deque(&mut self.index, total)?;
        // Slots free or unused: capacity minus the entries.
        reserve_total(&mut self.slots, total)
    }

    /// Puts `value` in a free slot (there is room: the caller checked).
    fn place(&mut self, value: V) -> u32 {
        if let Some(Slot::Free(next)) = self.slots.get(self.free as usize) {
            let slot = self.free;
            self.free = *next;
            self.slots[slot as usize] = Slot::Used(value);
            slot
        } else {
            // Slot numbers fit in u32: the map is indexed by them, and a
            // table of 2^32 values does not fit a driver's pool.
            let slot = u32::try_from(self.slots.len()).unwrap_or(NO_SLOT);
            self.slots.push(Slot::Used(value));
            slot
        }
    }

    /// Room for one more entry without allocating.
    fn has_room(&self) -> bool {
        self.index.len() < self.index.capacity()
            && (self.free != NO_SLOT || self.slots.len() < self.slots.capacity())
    }

    fn replace_or_insert(&mut self, at: Result<usize, usize>, key: K, value: V) -> Option<V> {
        match at {
            Ok(i) => match &mut self.slots[self.index[i].1 as usize] {
                Slot::Used(v) => Some(core::mem::replace(v, value)),
                Slot::Free(_) => None,
            },
            Err(i) => {
                let slot = self.place(value);
                self.index.insert(i, (key, slot));
                None
            }
        }
    }

    /// Inserts `value` under `key`, returning the value it replaced.
    ///
    /// # Errors
    /// The pair back when room for a new entry is refused (the map is
    /// unchanged).
    pub fn try_insert(&mut self, key: K, value: V) -> Result<Option<V>, (K, V)> {
        let at = self.find(&key);
        if at.is_err() && !self.has_room() && self.reserve_total(self.len() + 1).is_err() {
            return Err((key, value));
        }
        Ok(self.replace_or_insert(at, key, value))
    }

    /// Inserts without allocating: the room must have been reserved
    /// ([`reserve_total`](Self::reserve_total)).
    ///
    /// # Errors
    /// The pair back if the map is full (a reservation was missed; the
    /// map is unchanged).
    pub fn insert_reserved(&mut self, key: K, value: V) -> Result<Option<V>, (K, V)> {
        let at = self.find(&key);
        if at.is_err() && !self.has_room() {
            return Err((key, value));
        }
        Ok(self.replace_or_insert(at, key, value))
    }

    /// Removes `key`'s entry (never allocates; the room stays).
    pub fn remove(&mut self, key: &K) -> Option<V> {
        let i = self.find(key).ok()?;
        let (_, slot) = self.index.remove(i)?;
        self.free_slot(slot)
    }

    /// Takes the value out of `slot` and puts the slot on the free list.
    fn free_slot(&mut self, slot: u32) -> Option<V> {
        let freed = core::mem::replace(self.slots.get_mut(slot as usize)?, Slot::Free(self.free));
        self.free = slot;
        match freed {
            Slot::Used(v) => Some(v),
            Slot::Free(_) => None,
        }
    }

    /// The entries, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> + '_ {
        self.index
            .iter()
            .filter_map(|(k, slot)| self.value(*slot).map(|v| (k, v)))
    }

    /// The keys, in order.
    pub fn keys(&self) -> impl Iterator<Item = &K> + '_ {
        self.index.iter().map(|(k, _)| k)
    }

    /// The values, in key order.
    pub fn values(&self) -> impl Iterator<Item = &V> + '_ {
        self.iter().map(|(_, v)| v)
    }

    /// The first entry (the least key).
    #[must_use]
    pub fn first(&self) -> Option<(&K, &V)> {
        let (k, slot) = self.index.front()?;
        self.value(*slot).map(|v| (k, v))
    }

    /// Takes the first entry (never allocates).
    pub fn pop_first(&mut self) -> Option<(K, V)> {
        let (k, slot) = self.index.pop_front()?;
        self.free_slot(slot).map(|v| (k, v))
    }

    /// Removes every entry, keeping the memory (never allocates).
    pub fn clear(&mut self) {
        self.index.clear();
        self.slots.clear();
        self.free = NO_SLOT;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordered_insert_replace_remove() {
        let mut m = VecMap::new();
        for k in [5, 1, 3, 9, 7] {
            assert_eq!(m.try_insert(k, k * 10).ok(), Some(None));
        }
        assert_eq!(m.keys().copied().collect::<Vec<_>>(), [1, 3, 5, 7, 9]);
        assert_eq!(m.try_insert(3, 33).ok(), Some(Some(30)));
        assert_eq!(m.get(&3), Some(&33));
        assert_eq!(m.remove(&5), Some(50));
        assert_eq!(m.remove(&5), None);
        assert!(!m.contains_key(&5));
        assert_eq!(m.len(), 4);
    }

    #[test]
    fn reserved_inserts_never_allocate_and_refuse_past_the_room() {
        let mut m = VecMap::new();
        m.reserve_total(2).unwrap();
        let cap = m.entries.capacity();
        for k in 0..cap {
            assert!(m.insert_reserved(k, ()).is_ok());
        }
        assert_eq!(m.entries.capacity(), cap);
        assert_eq!(m.insert_reserved(cap, ()), Err((cap, ())));
        // Replacing needs no room.
        assert_eq!(m.insert_reserved(0, ()), Ok(Some(())));
    }

    /// Keys taken from the front and added at the back wrap the ring
    /// around: lookups, inserts and removals still find their place.
    #[test]
    fn a_wrapped_ring_stays_ordered() {
        let mut m = SlabMap::new();
        m.reserve_total(8).unwrap();
        let cap = m.index.capacity().min(m.slots.capacity());
        for k in 0..cap {
            assert!(m.insert_reserved(2 * k, k).is_ok());
        }
        for k in 0..cap / 2 {
            assert_eq!(m.pop_first(), Some((2 * k, k)));
        }
        for k in cap..cap + cap / 2 {
            assert!(m.insert_reserved(2 * k, k).is_ok());
        }
        let (front, back) = m.index.as_slices();
        assert!(!front.is_empty() && !back.is_empty(), "the ring wraps");
        for k in cap / 2..cap + cap / 2 {
            assert_eq!(m.get(&(2 * k)), Some(&k));
            assert!(!m.contains_key(&(2 * k + 1)));
        }
        // An odd key goes between its neighbours, on either side of the wrap.
        let (low, high) = (2 * (cap / 2) + 1, 2 * (cap + 1) + 1);
        assert_eq!(m.remove(&(2 * (cap / 2))), Some(cap / 2));
        assert!(m.insert_reserved(low, 0).is_ok());
        assert_eq!(m.remove(&(2 * cap)), Some(cap));
        assert!(m.insert_reserved(high, 0).is_ok());
        let keys: Vec<usize> = m.keys().copied().collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "{keys:?}");
        let inside = keys.iter().filter(|k| (low..=high).contains(*k));
        assert!(
            m.iter()
                .map(|(k, _)| k)
                .filter(|k| (low..=high).contains(*k))
                .eq(inside)
        );
        assert_eq!(m.pop_first(), Some((low, 0)));
        assert_eq!(m.first().map(|(k, _)| *k), keys.get(1).copied());
        m.clear();
        assert!(m.is_empty() && m.first().is_none());
    }

    #[test]
    fn try_push_gives_the_value_back() {
        let mut v: Vec<u8> = Vec::new();
        assert!(try_push(&mut v, 1).is_ok());
        assert_eq!(v, [1]);
    }
    #[test]
    fn slab_map_orders_replaces_and_reuses_slots() {
        let mut m = SlabMap::new();
        for k in [5, 1, 3, 9, 7] {
            assert_eq!(m.try_insert(k, [k; 64]).ok(), Some(None));
        }
        assert_eq!(m.keys().copied().collect::<Vec<_>>(), [1, 3, 5, 7, 9]);
        assert_eq!(m.try_insert(3, [33; 64]).ok(), Some(Some([3; 64])));
        assert_eq!(m.get(&3), Some(&[33; 64]));
        assert_eq!(m.remove(&5), Some([5; 64]));
        assert_eq!(m.remove(&5), None);
        assert!(!m.contains_key(&5) && m.get(&5).is_none());
        assert_eq!(m.len(), 4);
        // The freed slot is taken again before the slab grows.
        let slots = m.slots.len();
        assert_eq!(m.try_insert(4, [4; 64]).ok(), Some(None));
        assert_eq!(m.slots.len(), slots);
        if let Some(v) = m.get_mut(&4) {
            v[0] = 44;
        }
        assert_eq!(
            m.values().map(|v| v[0]).collect::<Vec<_>>(),
            [1, 33, 44, 7, 9]
        );
        assert_eq!(
            m.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
            [1, 3, 4, 7, 9]
        );
    }

    #[test]
    fn slab_map_reserved_inserts_never_allocate_and_refuse_past_the_room() {
        let mut m = SlabMap::new();
        m.reserve_total(3).unwrap();
        let (icap, scap) = (m.index.capacity(), m.slots.capacity());
        let room = icap.min(scap);
        for k in 0..room {
            assert!(m.insert_reserved(k, k).is_ok());
        }
        assert_eq!(m.insert_reserved(room, room), Err((room, room)));
        // Replacing needs no room; a removal makes room without growing.
        assert_eq!(m.insert_reserved(0, 10), Ok(Some(0)));
        assert_eq!(m.remove(&1), Some(1));
        assert_eq!(m.insert_reserved(room, room), Ok(None));
        assert_eq!((m.index.capacity(), m.slots.capacity()), (icap, scap));
        assert_eq!(m.get(&room), Some(&room));
        assert_eq!(m.len(), room);
    }
}
