//! The driver's global allocator: `ExAllocatePool2` nonpaged pool, every
//! `Layout`'s alignment honoured ([`irpverbs_kalloc::Aligned`]).
//!
//! `ExAllocatePool2` aligns a block below a page to 16 bytes
//! (`MEMORY_ALLOCATION_ALIGNMENT`) and no more, while the rings' queues and
//! CQs and the transport's state are 128-byte aligned types: the wrapper
//! over-allocates those and aligns inside the block (host mode runs the same
//! wrapper over a model of the pool that bugchecks a misaligned result,
//! `irpverbs_host::platform::expool`).
//!
//! IRQL: <= DISPATCH_LEVEL (nonpaged pool).

use irpverbs_kalloc::{Aligned, RawPool};
use wdk_sys::ntddk::{ExAllocatePool2, ExFreePoolWithTag};
use wdk_sys::{POOL_FLAG_NON_PAGED, SIZE_T, ULONG};

/// The tag of the driver's heap (Box, Vec, Arc): `IvRs`.
const HEAP_TAG: ULONG = u32::from_le_bytes(*b"IvRs");

/// Nonpaged pool as a [`RawPool`].
pub(crate) struct NonPagedPool;

// SAFETY: ExAllocatePool2 returns null or a block of the size asked for,
// aligned to MEMORY_ALLOCATION_ALIGNMENT (16 on x64, the pointer alignment
// at least everywhere) and valid until freed with ExFreePoolWithTag.
unsafe impl RawPool for NonPagedPool {
    const ALIGN: usize = 16;

    fn allocate(&self, size: usize) -> *mut u8 {
        // SAFETY: callable at IRQL <= DISPATCH_LEVEL for nonpaged pool; with
        // no POOL_FLAG_RAISE_ON_FAILURE it returns null on failure.
        let block = unsafe { ExAllocatePool2(POOL_FLAG_NON_PAGED, size as SIZE_T, HEAP_TAG) };
        block.cast()
    }

    unsafe fn free(&self, block: *mut u8) {
        // SAFETY: the caller gives back a block `allocate` made with this
        // tag, once; nonpaged pool is freed at IRQL <= DISPATCH_LEVEL.
        unsafe { ExFreePoolWithTag(block.cast(), HEAP_TAG) };
    }
}

/// The global allocator.
pub(crate) type DriverAllocator = Aligned<NonPagedPool>;
