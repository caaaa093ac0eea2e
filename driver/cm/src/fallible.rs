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
//!   inserted was created). Removal never allocates.
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

    #[test]
    fn try_push_gives_the_value_back() {
        let mut v: Vec<u8> = Vec::new();
        assert!(try_push(&mut v, 1).is_ok());
        assert_eq!(v, [1]);
    }
}
