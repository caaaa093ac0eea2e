//! The driver's global allocator over a kernel pool: every `Layout`'s
//! alignment honoured.
//!
//! `ExAllocatePool2` guarantees 16 bytes of alignment for blocks below a
//! page (`MEMORY_ALLOCATION_ALIGNMENT` on x64), while the driver's types ask
//! for more: the rings' queues and CQs, the transport's requester and
//! responder state are `#[repr(align(128))]` (a cache-line pair each, so
//! that the producer and the consumer never share one). An allocator that
//! passes `Layout::size` to the pool and ignores `Layout::align` hands out
//! misaligned references: undefined behaviour.
//!
//! [`Aligned`] wraps a [`RawPool`] (what the pool guarantees, and its
//! allocate / free): a layout the pool's alignment covers goes through
//! unchanged; a larger alignment is over-allocated by the alignment, the
//! result aligned up inside the block past one pointer, and the pool's own
//! pointer kept in the word just below it, where `dealloc` finds it to give
//! the original block back.
//!
//! irpverbs.sys's global allocator is `Aligned` over `wdk-alloc`'s
//! allocator (`driver/kmdf/src/lib.rs`); host mode models
//! `ExAllocatePool2`'s guarantee with a pool that gives *only* 16 bytes
//! (`irpverbs_host::platform::ExPool`) and bugchecks a result that does not
//! meet its layout, so that the bug cannot come back unseen.
//!
//! IRQL: whatever the pool's allocate and free allow (nonpaged pool:
//! <= DISPATCH_LEVEL).
#![no_std]

use core::alloc::{GlobalAlloc, Layout};

/// A kernel pool: blocks of any size, aligned to [`RawPool::ALIGN`].
///
/// # Safety
/// Every non-null pointer `allocate` returns must be aligned to `ALIGN`,
/// valid for reads and writes of `size` bytes, and stay so until it is given
/// to `free`. `ALIGN` must be a power of two, at least the alignment of a
/// pointer.
pub unsafe trait RawPool {
    /// The alignment of every block.
    const ALIGN: usize;

    /// A block of `size` bytes (`size > 0`), or null when the pool is out of
    /// memory.
    fn allocate(&self, size: usize) -> *mut u8;

    /// Gives a block back.
    ///
    /// # Safety
    /// `block` must have come from this pool's `allocate` and not have been
    /// freed since.
    unsafe fn free(&self, block: *mut u8);
}

/// A global allocator over a [`RawPool`] that honours every alignment.
#[derive(Debug, Default)]
pub struct Aligned<R>(pub R);

/// The word below an over-aligned result that holds the pool's pointer.
const HEADER: usize = size_of::<*mut u8>();

impl<R: RawPool> Aligned<R> {
    /// Whether `layout` needs more alignment than the pool gives.
    const fn over_aligned(layout: &Layout) -> bool {
        layout.align() > R::ALIGN
    }

    /// The bytes to ask the pool for, for an over-aligned `layout`: the
    /// size and the alignment. The result is the first `align`-aligned
    /// address at least one header past the pool's block; the block being
    /// `ALIGN`-aligned (`ALIGN >= HEADER`), that is at most `align` bytes
    /// into it (when the block itself is `align`-aligned). `None` when that
    /// overflows.
    fn padded_size(layout: &Layout) -> Option<usize> {
        layout.size().checked_add(layout.align())
    }
}

// SAFETY: `alloc` returns null or a block of at least `layout.size()` bytes
// aligned to `layout.align()`, valid until `dealloc` (which is called with
// the same layout, so takes the same branch as `alloc` did and frees the
// pool's own block exactly once).
unsafe impl<R: RawPool> GlobalAlloc for Aligned<R> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !Self::over_aligned(&layout) {
            return self.0.allocate(layout.size());
        }
        let Some(size) = Self::padded_size(&layout) else {
            return core::ptr::null_mut();
        };
        let block = self.0.allocate(size);
        if block.is_null() {
            return block;
        }
        // Past the header, then up to the alignment: at most `align` bytes
        // into the block (see `padded_size`).
        let first = block.wrapping_add(HEADER);
        let skip = first.align_offset(layout.align());
        if HEADER + skip > layout.align() {
            // Never with a pool that keeps its contract; refuse rather than
            // overrun the block.
            // SAFETY: `block` came from this pool just now.
            unsafe { self.0.free(block) };
            return core::ptr::null_mut();
        }
        // SAFETY: `HEADER + skip <= align`, the block's bytes beyond
        // `layout.size()`: the result and its `layout.size()` bytes are
        // inside the block.
        let result = unsafe { first.add(skip) };
        // SAFETY: the header word `[result - HEADER, result)` is inside the
        // block (`result >= block + HEADER`) and pointer-aligned (`result`
        // is aligned to more than `ALIGN >= HEADER`).
        unsafe { result.cast::<*mut u8>().sub(1).write(block) };
        result
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if !Self::over_aligned(&layout) {
            // SAFETY: `alloc` returned the pool's block itself for this
            // layout; the caller gives it back once.
            unsafe { self.0.free(ptr) };
            return;
        }
        // SAFETY: `alloc` stored the pool's block in the word below `ptr`
        // for this layout; it is inside that block and aligned.
        let block = unsafe { ptr.cast::<*mut u8>().sub(1).read() };
        // SAFETY: the pool's block, given back once (the caller's
        // contract on `ptr`).
        unsafe { self.0.free(block) };
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;
    use std::alloc::System;
    use std::cell::RefCell;
    use std::vec::Vec;

    /// A pool that gives exactly 16 bytes of alignment and never more (every
    /// block at an odd multiple of 16), as `ExAllocatePool2` may, and keeps
    /// the blocks it handed out to check frees.
    #[derive(Default)]
    struct Pool16 {
        live: RefCell<Vec<(usize, usize)>>,
        /// Every allocation fails.
        exhausted: bool,
    }

    // SAFETY: blocks are System allocations aligned to 32, offset by 16
    // (16-aligned), of the size asked for.
    unsafe impl RawPool for Pool16 {
        const ALIGN: usize = 16;

        fn allocate(&self, size: usize) -> *mut u8 {
            if self.exhausted {
                return core::ptr::null_mut();
            }
            let layout = Layout::from_size_align(size + 16, 32).unwrap();
            // SAFETY: a non-zero size.
            let base = unsafe { System.alloc(layout) };
            assert!(!base.is_null());
            let block = base.wrapping_add(16);
            self.live.borrow_mut().push((block as usize, size));
            block
        }

        unsafe fn free(&self, block: *mut u8) {
            let mut live = self.live.borrow_mut();
            let at = live
                .iter()
                .position(|&(b, _)| b == block as usize)
                .expect("a block this pool handed out, freed once");
            let (_, size) = live.swap_remove(at);
            let layout = Layout::from_size_align(size + 16, 32).unwrap();
            // SAFETY: allocated above with this layout, 16 bytes lower.
            unsafe { System.dealloc(block.wrapping_sub(16), layout) };
        }
    }

    #[repr(C, align(128))]
    struct Ring {
        head: u64,
        _pad: [u8; 120],
    }

    /// What the pool alone gives (today's allocator passes it through) is
    /// misaligned for a 128-byte type.
    #[test]
    fn the_raw_pool_does_not_align_to_128() {
        let pool = Pool16::default();
        let block = pool.allocate(size_of::<Ring>());
        assert_ne!(block as usize % 128, 0);
        // SAFETY: just allocated.
        unsafe { pool.free(block) };
    }

    /// Every alignment from 1 to two pages, with sizes around it, comes
    /// back aligned, writable over its whole size, and freed to the pool.
    #[test]
    fn every_alignment_is_honoured() {
        let a = Aligned(Pool16::default());
        let mut held = Vec::new();
        for shift in 0..=13 {
            let align = 1usize << shift;
            for size in [
                1,
                align.saturating_sub(1).max(1),
                align,
                align + 1,
                3 * align,
            ] {
                let layout = Layout::from_size_align(size, align).unwrap();
                // SAFETY: non-zero size.
                let p = unsafe { a.alloc(layout) };
                assert!(!p.is_null());
                assert_eq!(p as usize % align, 0, "size {size} align {align}");
                // SAFETY: `size` bytes at `p` are ours.
                unsafe { p.write_bytes(0xA5, size) };
                held.push((p, layout));
            }
        }
        // The blocks do not overlap (a write into one would show in another).
        for &(p, layout) in &held {
            // SAFETY: still allocated.
            let bytes = unsafe { core::slice::from_raw_parts(p, layout.size()) };
            assert!(bytes.iter().all(|&b| b == 0xA5));
        }
        for (p, layout) in held {
            // SAFETY: allocated above with this layout.
            unsafe { a.dealloc(p, layout) };
        }
        assert!(a.0.live.borrow().is_empty(), "every pool block was freed");
    }

    /// A pool out of memory: null, for an over-aligned layout too.
    #[test]
    fn an_exhausted_pool_gives_null() {
        let a = Aligned(Pool16 {
            exhausted: true,
            ..Pool16::default()
        });
        for align in [8, 128] {
            let layout = Layout::from_size_align(64, align).unwrap();
            // SAFETY: non-zero size.
            assert!(unsafe { a.alloc(layout) }.is_null());
        }
        assert!(a.0.live.borrow().is_empty());
    }

    /// Realloc (the trait's default: allocate, copy, free) keeps the data
    /// and the alignment.
    #[test]
    fn realloc_keeps_alignment_and_bytes() {
        let a = Aligned(Pool16::default());
        let layout = Layout::from_size_align(200, 256).unwrap();
        // SAFETY: non-zero size.
        let p = unsafe { a.alloc(layout) };
        // SAFETY: 200 bytes are ours.
        unsafe { p.write_bytes(7, 200) };
        // SAFETY: `p` was allocated with `layout`; the new size is non-zero.
        let q = unsafe { a.realloc(p, layout, 1000) };
        assert_eq!(q as usize % 256, 0);
        // SAFETY: the first 200 bytes were copied.
        let copied = unsafe { core::slice::from_raw_parts(q, 200) };
        assert!(copied.iter().all(|&b| b == 7));
        // SAFETY: reallocated with this alignment and size.
        unsafe { a.dealloc(q, Layout::from_size_align(1000, 256).unwrap()) };
        assert!(a.0.live.borrow().is_empty());
    }
}
