//! `ExAllocatePool2` as a driver's global allocator sees it: blocks aligned
//! to 16 bytes (`MEMORY_ALLOCATION_ALIGNMENT`) and to nothing more, and the
//! verifier's check that what a global allocator hands out meets its
//! `Layout`.
//!
//! [`ExPool`] gives every block at an odd multiple of 16 (the worst the
//! real pool may do below a page), so a type that needs more alignment than
//! the pool guarantees is misaligned every time, not by chance.
//! [`Checked`] wraps a global allocator and bugchecks (0xC4, parameter 1
//! [`verifier::HOST_MISALIGNED_POOL`](super::verifier::HOST_MISALIGNED_POOL))
//! on a result that is not aligned to its layout's alignment: irpverbs.sys's
//! allocator is `irpverbs_kalloc::Aligned` over the pool, and host mode runs
//! the same wrapper over this model under the check
//! ([`HostPoolAllocator`]).

use std::alloc::{GlobalAlloc, Layout, System};

use irpverbs_kalloc::{Aligned, RawPool};

use super::bugcheck::{codes, stop, verifier};
use super::pool::NON_PAGED_POOL_NX;

/// The alignment `ExAllocatePool2` guarantees below a page on x64.
pub const MEMORY_ALLOCATION_ALIGNMENT: usize = 16;

/// The bytes in front of a block that hold its size: 16, so that a block
/// at this offset into a 32-aligned allocation is 16-aligned and never
/// 32-aligned.
const SIZE_HEADER: usize = 16;

/// A model of `ExAllocatePool2(POOL_FLAG_NON_PAGED, ..)`: every block is
/// 16-aligned and never 32-aligned.
#[derive(Clone, Copy, Debug, Default)]
pub struct ExPool;

impl ExPool {
    /// The system allocation behind a block of `size` bytes: the size
    /// header, then the block.
    fn backing(size: usize) -> Option<Layout> {
        let total = size.checked_add(SIZE_HEADER)?;
        Layout::from_size_align(total, 2 * MEMORY_ALLOCATION_ALIGNMENT).ok()
    }
}

// SAFETY: a block is `SIZE_HEADER` (16) bytes into a 32-aligned system
// allocation (so 16-aligned), with `size` bytes behind it inside that
// allocation; `free` rebuilds the same layout from the size kept in front.
#[allow(unsafe_code, reason = "a model of the kernel pool's allocator")]
unsafe impl RawPool for ExPool {
    const ALIGN: usize = MEMORY_ALLOCATION_ALIGNMENT;

    fn allocate(&self, size: usize) -> *mut u8 {
        let Some(layout) = Self::backing(size) else {
            return std::ptr::null_mut();
        };
        // SAFETY: a non-zero size.
        let base = unsafe { System.alloc(layout) };
        if base.is_null() {
            return base;
        }
        // SAFETY: the header is the allocation's first word, aligned.
        unsafe { base.cast::<usize>().write(size) };
        // SAFETY: inside the allocation (`SIZE_HEADER + size` bytes).
        unsafe { base.add(SIZE_HEADER) }
    }

    #[allow(unsafe_code, reason = "a model of the kernel pool's allocator")]
    unsafe fn free(&self, block: *mut u8) {
        // SAFETY: `block` came from `allocate`: the allocation starts
        // `SIZE_HEADER` bytes lower.
        let base = unsafe { block.sub(SIZE_HEADER) };
        // SAFETY: `allocate` wrote the size there.
        let size = unsafe { base.cast::<usize>().read() };
        if let Some(layout) = Self::backing(size) {
            // SAFETY: allocated by `allocate` with this layout.
            unsafe { System.dealloc(base, layout) };
        }
    }
}

/// The host's model of irpverbs.sys's global allocator: the same
/// `Aligned` wrapper over the pool's model, under the verifier's check.
pub type HostPoolAllocator = Checked<Aligned<ExPool>>;

/// A global allocator whose every result the verifier checks against its
/// layout's alignment.
#[derive(Debug, Default)]
pub struct Checked<A>(pub A);

/// Bugchecks (0xC4, [`verifier::HOST_MISALIGNED_POOL`]) when `block`, a
/// non-null result of a global allocator for `layout`, is not aligned to
/// `layout.align()`: the driver would build a reference to a misaligned
/// value on it (undefined behaviour).
#[track_caller]
pub fn check_alignment(block: *const u8, layout: Layout) {
    if block.is_null() || block.addr() % layout.align() == 0 {
        return;
    }
    stop(
        codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
        [
            verifier::HOST_MISALIGNED_POOL,
            block.addr() as u64,
            layout.align() as u64,
            NON_PAGED_POOL_NX,
        ],
        format!(
            "pool block {block:p} of {} bytes is not aligned to its layout's {} bytes",
            layout.size(),
            layout.align()
        ),
    );
}

// SAFETY: the inner allocator's results, checked and passed through
// unchanged (a misaligned one never reaches the caller).
#[allow(unsafe_code, reason = "a checking global allocator")]
unsafe impl<A: GlobalAlloc> GlobalAlloc for Checked<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is the inner allocator's.
        let block = unsafe { self.0.alloc(layout) };
        check_alignment(block, layout);
        block
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { self.0.dealloc(ptr, layout) };
    }
}

#[cfg(test)]
#[allow(unsafe_code, reason = "driving global allocators by hand")]
mod tests {
    use super::*;
    use crate::platform::catch_bugcheck;
    use irpverbs_ring::{CompletionQueue, RecvQueue, SendQueue};

    /// The pool's own alignment for a plain layout: what `wdk-alloc`'s
    /// allocator returns whatever the layout asks.
    struct PassThrough;

    // SAFETY: the pool's blocks, passed through.
    unsafe impl GlobalAlloc for PassThrough {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            ExPool.allocate(layout.size())
        }
        unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
            // SAFETY: from `allocate`.
            unsafe { ExPool.free(ptr) };
        }
    }

    fn ring_layouts() -> [Layout; 3] {
        [
            Layout::new::<SendQueue>(),
            Layout::new::<RecvQueue>(),
            Layout::new::<CompletionQueue>(),
        ]
    }

    #[test]
    fn the_pool_model_guarantees_16_bytes_and_no_more() {
        for size in [1, 16, 100, 4096] {
            let block = ExPool.allocate(size);
            assert_eq!(block.addr() % 16, 0);
            assert_eq!(block.addr() % 32, 16);
            // SAFETY: from `allocate`.
            unsafe { ExPool.free(block) };
        }
    }

    /// An allocator that ignores `Layout::align` (today's `wdk-alloc`)
    /// hands a ring a misaligned block: the verifier stops it.
    #[test]
    fn a_misaligned_ring_is_a_bugcheck() {
        let allocator = Checked(PassThrough);
        for layout in ring_layouts() {
            assert!(layout.align() >= 128, "{layout:?}");
            let check = catch_bugcheck(|| {
                // SAFETY: a non-zero size; the block leaks if the check
                // lets it through (it does not).
                unsafe { allocator.alloc(layout) };
            })
            .expect_err("a misaligned ring");
            assert_eq!(check.code, codes::DRIVER_VERIFIER_DETECTED_VIOLATION);
            assert_eq!(check.param1(), verifier::HOST_MISALIGNED_POOL);
        }
    }

    /// The driver's allocator over the same pool aligns every ring, and
    /// gives every block back.
    #[test]
    fn the_drivers_allocator_aligns_every_ring() {
        let allocator = HostPoolAllocator::default();
        for layout in ring_layouts() {
            // SAFETY: a non-zero size.
            let block = unsafe { allocator.alloc(layout) };
            assert!(!block.is_null());
            assert_eq!(block.addr() % layout.align(), 0);
            // SAFETY: allocated just now with this layout.
            unsafe { allocator.dealloc(block, layout) };
        }
    }
}
