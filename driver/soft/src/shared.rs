//! Handles to memory shared with the driver and the ULP, compared by
//! identity (so firmware state snapshots can be compared in tests).

use alloc::sync::Arc;

use irpverbs_abi::{NtStatus, STATUS_INSUFFICIENT_RESOURCES};
use irpverbs_ring::{Region, Ring};

/// A queue's ring.
#[derive(Clone, Debug)]
pub(crate) struct RingRef(pub(crate) Ring);

impl PartialEq for RingRef {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(self.0.region(), other.0.region())
    }
}

impl Eq for RingRef {}

impl RingRef {
    /// Allocates a ring of `entries` (a power of two) slots of `stride`.
    pub(crate) fn alloc(entries: u32, stride: u32) -> Result<Self, NtStatus> {
        Ring::alloc(entries, stride)
            .map(Self)
            .ok_or(STATUS_INSUFFICIENT_RESOURCES)
    }
}

/// A registered memory region's pinned memory.
#[derive(Clone, Debug)]
pub(crate) struct RegionRef(pub(crate) Arc<Region>);

impl PartialEq for RegionRef {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for RegionRef {}
