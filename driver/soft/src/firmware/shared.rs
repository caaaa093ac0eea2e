//! Handles to memory shared with the driver and the ULP, compared by
//! identity (so firmware state snapshots can be compared in tests).

use irpverbs_abi::{NtStatus, STATUS_INSUFFICIENT_RESOURCES, STATUS_INVALID_PARAMETER};
use irpverbs_ring::{Region, Ring, Shared};

/// A queue's ring, and whether its memory was given to the firmware
/// (a device's view of the driver's memory, [`RingPool::given`]) rather
/// than allocated by it.
#[derive(Clone, Debug)]
pub(crate) struct RingRef(pub(crate) Ring, pub(crate) bool);

impl PartialEq for RingRef {
    fn eq(&self, other: &Self) -> bool {
        Shared::ptr_eq(self.0.region(), other.0.region())
    }
}

impl Eq for RingRef {}

impl RingRef {
    /// Allocates a ring of `entries` (a power of two) slots of `stride`.
    pub(crate) fn alloc(entries: u32, stride: u32) -> Result<Self, NtStatus> {
        Ring::alloc(entries, stride)
            .map(|r| Self(r, false))
            .ok_or(STATUS_INSUFFICIENT_RESOURCES)
    }
}

/// Ring memory of destroyed queues, kept for reuse: creating and
/// destroying queues (a control-path benchmark, a ULP that churns QPs)
/// then neither allocates nor frees queue memory.
///
/// A retired region is reused only once the pool holds its only reference
/// (the driver dropped its view of the ring, and any mapping of it holds a
/// reference until unmapped), and is zeroed before its new ring starts.
/// A cache, not state: pools always compare equal.
///
/// It also holds the memory a device gives the command executing for its
/// queues ([`RingPool::given`]): a firmware that runs on queues the driver
/// allocated (the model HCA's device) takes rings from there instead, and
/// never keeps such memory for reuse.
#[derive(Debug, Default)]
pub(crate) struct RingPool {
    retired: alloc::vec::Vec<Shared<Region>>,
    /// The rings' memory the executing command was given (`None`: the
    /// firmware allocates its own): its first ring (a CQ's, an SRQ's, a
    /// QP's send queue) and its second (a QP's receive queue).
    pub(crate) given: Option<[Option<Shared<Region>>; 2]>,
}

/// A snapshot of the firmware starts with an empty pool (sharing regions
/// would only keep them from being reused).
impl Clone for RingPool {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl PartialEq for RingPool {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for RingPool {}

impl RingPool {
    /// Regions kept at most.
    const MAX: usize = 32;

    /// An empty pool with room for [`Self::MAX`] regions (allocated now, so
    /// that retiring a ring never allocates).
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES`.
    pub(crate) fn new() -> Result<Self, NtStatus> {
        Ok(Self {
            retired: vec_with_capacity(Self::MAX)?,
            given: None,
        })
    }

    /// A zeroed ring of `entries` (a power of two) slots of `stride`: a
    /// retired region of the same size if one is free, else a new one.
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES` when the allocation fails.
    /// With rings given ([`RingPool::given`]), the command's ring `which`
    /// (0 or 1) over the memory given for it instead, which must hold the
    /// ring: `STATUS_INVALID_PARAMETER` when none was given or it is too
    /// small.
    pub(crate) fn alloc(
        &mut self,
        which: usize,
        entries: u32,
        stride: u32,
    ) -> Result<RingRef, NtStatus> {
        if let Some(given) = &mut self.given {
            let region = given
                .get_mut(which)
                .and_then(Option::take)
                .ok_or(STATUS_INVALID_PARAMETER)?;
            let ring = Ring::new(region, entries, stride).map_err(|_| STATUS_INVALID_PARAMETER)?;
            return Ok(RingRef(ring, true));
        }
        let Some(bytes) = Ring::alloc_len(entries, stride) else {
            return Err(STATUS_INSUFFICIENT_RESOURCES);
        };
        let free = self
            .retired
            .iter_mut()
            .position(|r| r.len() == bytes && Shared::get_mut(r).is_some());
        if let Some(i) = free {
            let region = self.retired.swap_remove(i);
            if region.fill(0, bytes, 0).is_ok() {
                if let Ok(ring) = Ring::new(region, entries, stride) {
                    return Ok(RingRef(ring, false));
                }
            }
        }
        RingRef::alloc(entries, stride)
    }

    /// Keeps a destroyed queue's ring memory for reuse (or frees it when
    /// the pool is full). Never allocates. Memory the firmware was given
    /// is let go of at once.
    pub(crate) fn retire(&mut self, ring: RingRef) {
        if ring.1 {
            return;
        }
        if self.retired.len() < self.retired.capacity().min(Self::MAX) {
            self.retired.push(ring.0.region().clone());
        }
    }
}

/// A registered memory region's pinned memory.
#[derive(Clone, Debug)]
pub(crate) struct RegionRef(pub(crate) Shared<Region>);

impl PartialEq for RegionRef {
    fn eq(&self, other: &Self) -> bool {
        Shared::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for RegionRef {}

/// `value` in a new box, or `STATUS_INSUFFICIENT_RESOURCES` (and `value`
/// dropped) when memory is short: a command that needs a box fails
/// cleanly instead of aborting.
pub(crate) fn boxed<T>(value: T) -> Result<alloc::boxed::Box<T>, NtStatus> {
    irpverbs_ring::try_box(value).map_err(|_| STATUS_INSUFFICIENT_RESOURCES)
}

/// An empty vector with room for `capacity` elements, or
/// `STATUS_INSUFFICIENT_RESOURCES`.
pub(crate) fn vec_with_capacity<T>(capacity: usize) -> Result<alloc::vec::Vec<T>, NtStatus> {
    irpverbs_ring::try_vec(capacity).map_err(|_| STATUS_INSUFFICIENT_RESOURCES)
}

/// Makes room in `v` for `n` elements in all (`STATUS_INSUFFICIENT_RESOURCES`
/// when memory is short): a create reserves room for every object a data
/// path list may hold, so that the data path only pushes into room.
pub(crate) fn room_for<T>(v: &mut alloc::vec::Vec<T>, n: usize) -> Result<(), NtStatus> {
    v.try_reserve(n.saturating_sub(v.len()))
        .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)
}

/// Appends `value` to `v` in the room a create reserved, growing it
/// fallibly past that; false (and `value` dropped) when there is no memory.
pub(crate) fn push<T>(v: &mut alloc::vec::Vec<T>, value: T) -> bool {
    if v.len() == v.capacity() && v.try_reserve(1).is_err() {
        return false;
    }
    v.push(value);
    true
}
