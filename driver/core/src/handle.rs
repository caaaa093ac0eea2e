//! Per-file, generation-checked handle tables.
//!
//! A handle is `generation << 32 | kind << 24 | index`. The generation is
//! drawn from a device-wide counter for every object created, so a handle
//! from another file, a destroyed object (stale), or an object of another
//! kind never matches: all three get `STATUS_INVALID_HANDLE`.

use alloc::vec::Vec;

use irpverbs_abi::{IvHandle, NtStatus, STATUS_INVALID_HANDLE};

use crate::fallible::reserve_total;
use crate::object::{Kind, Life, Object};

const INDEX_BITS: u32 = 24;
/// Largest number of objects one file can hold.
pub const MAX_OBJECTS_PER_FILE: usize = 1 << INDEX_BITS;

/// The kind field of a handle (`Kind as u8`; not checked).
pub(crate) const fn kind_of(handle: IvHandle) -> u8 {
    ((handle >> INDEX_BITS) & 0xFF) as u8
}

struct Slot {
    generation: u32,
    object: Option<Object>,
}

/// The objects one file owns.
pub(crate) struct HandleTable {
    slots: Vec<Slot>,
    free: Vec<u32>,
    len: usize,
}

impl HandleTable {
    pub(crate) const fn new() -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
            len: 0,
        }
    }

    /// Number of objects (in any life state).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Stores `object` under a new handle with `generation` (never 0).
    /// A new slot takes its room in the free list at once, so that
    /// [`remove`](Self::remove) never allocates.
    ///
    /// # Errors
    /// Gives the object back when the file holds [`MAX_OBJECTS_PER_FILE`]
    /// objects, or when the memory for a new slot is refused.
    pub(crate) fn insert(&mut self, generation: u32, object: Object) -> Result<u32, Object> {
        debug_assert_ne!(generation, 0);
        let index = if let Some(i) = self.free.pop() {
            i
        } else {
            if self.slots.len() >= MAX_OBJECTS_PER_FILE
                || self.slots.try_reserve(1).is_err()
                || reserve_total(&mut self.free, self.slots.len() + 1).is_err()
            {
                return Err(object);
            }
            self.slots.push(Slot {
                generation: 0,
                object: None,
            });
            (self.slots.len() - 1) as u32
        };
        let slot = &mut self.slots[index as usize];
        slot.generation = generation;
        slot.object = Some(object);
        self.len += 1;
        Ok(index)
    }

    /// The handle of the object at `index`.
    pub(crate) fn handle_of(&self, index: u32) -> IvHandle {
        let slot = &self.slots[index as usize];
        let kind = slot.object.as_ref().map_or(0, |o| o.kind() as u64);
        (u64::from(slot.generation) << 32) | (kind << INDEX_BITS) | u64::from(index)
    }

    /// Resolves a caller's handle to a live object of `kind`.
    ///
    /// # Errors
    /// `STATUS_INVALID_HANDLE` for zero, stale, foreign or wrongly-typed
    /// handles, and for objects still being created or already being destroyed.
    pub(crate) fn lookup(&self, handle: IvHandle, kind: Kind) -> Result<u32, NtStatus> {
        let index = (handle & ((1 << INDEX_BITS) - 1)) as u32;
        let hkind = ((handle >> INDEX_BITS) & 0xFF) as u8;
        let generation = (handle >> 32) as u32;
        if generation == 0 || hkind != kind as u8 {
            return Err(STATUS_INVALID_HANDLE);
        }
        match self.slots.get(index as usize) {
            Some(Slot {
                generation: g,
                object: Some(o),
            }) if *g == generation && o.kind() == kind && o.life == Life::Live => Ok(index),
            _ => Err(STATUS_INVALID_HANDLE),
        }
    }

    /// The index of the object `handle` names, in whatever life state
    /// (creating, live or being destroyed): `None` once it is freed (the
    /// handle is stale) or for a handle of another kind.
    pub(crate) fn find(&self, handle: IvHandle) -> Option<u32> {
        let index = (handle & ((1 << INDEX_BITS) - 1)) as u32;
        let hkind = kind_of(handle);
        let generation = (handle >> 32) as u32;
        match self.slots.get(index as usize) {
            Some(Slot {
                generation: g,
                object: Some(o),
            }) if generation != 0 && *g == generation && o.kind() as u8 == hkind => Some(index),
            _ => None,
        }
    }

    pub(crate) fn get(&self, index: u32) -> &Object {
        self.slots[index as usize]
            .object
            .as_ref()
            .expect("index refers to a live slot")
    }

    pub(crate) fn get_mut(&mut self, index: u32) -> &mut Object {
        self.slots[index as usize]
            .object
            .as_mut()
            .expect("index refers to a live slot")
    }

    /// The object at `index`, if the slot is live.
    pub(crate) fn try_get_mut(&mut self, index: u32) -> Option<&mut Object> {
        self.slots.get_mut(index as usize)?.object.as_mut()
    }

    /// Removes the object at `index`; the handle becomes stale. Never
    /// allocates: the free list has room for every slot.
    pub(crate) fn remove(&mut self, index: u32) -> Object {
        let slot = &mut self.slots[index as usize];
        let object = slot.object.take().expect("index refers to a live slot");
        slot.generation = 0;
        debug_assert!(self.free.len() < self.free.capacity());
        self.free.push(index);
        self.len -= 1;
        object
    }

    /// Slots in the table (live or free): indices are below it.
    pub(crate) fn slots_len(&self) -> usize {
        self.slots.len()
    }
}
