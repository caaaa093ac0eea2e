//! [`Region`]: a range of memory shared with the HCA — queue memory the
//! driver allocates, or a registered memory region (MR) the ULP owns — with
//! bounds-checked, race-tolerant access.
//!
//! Every access copies bytes in or out with volatile-free `copy_nonoverlapping`
//! after a bounds check, or goes through an aligned atomic. Readers never hand
//! out references to shared bytes, so a ULP scribbling on its own ring while
//! the HCA reads it can corrupt only the values read (which the HCA then
//! validates), never the HCA's memory safety.

use alloc::alloc::{Layout, alloc_zeroed, dealloc};
use alloc::boxed::Box;
use core::any::Any;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU32, AtomicU64};

use zerocopy::{FromBytes, Immutable, IntoBytes};

use crate::Shared;

/// An access outside the region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutOfBounds;

/// Alignment of memory [`Region::alloc`] returns.
pub const REGION_ALIGN: usize = 4096;

enum Owner {
    /// Allocated by [`Region::alloc`]: freed with this layout.
    Heap(Layout),
    /// Owned elsewhere: held to keep whatever owns it alive until the
    /// region is dropped (and read only by the platform that made it:
    /// [`Region::owner`]).
    External {
        keep_alive: Option<Box<dyn Any + Send + Sync>>,
    },
}

/// A shared memory range.
pub struct Region {
    ptr: NonNull<u8>,
    len: usize,
    owner: Owner,
}

impl core::fmt::Debug for Region {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Region")
            .field("addr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

// SAFETY: a Region is a pointer to memory valid for its lifetime (the
// constructor's contract); every access through it is by copy or atomic, so
// sharing it between threads is as sound as sharing the memory itself.
unsafe impl Send for Region {}
// SAFETY: as above; `&Region` only permits copies and atomic operations.
unsafe impl Sync for Region {}

impl Region {
    /// Allocates `len` zeroed bytes aligned to [`REGION_ALIGN`] (queue memory).
    ///
    /// Returns `None` when `len` is 0 or the allocation fails.
    #[must_use]
    pub fn alloc(len: usize) -> Option<Self> {
        if len == 0 {
            return None;
        }
        let layout = Layout::from_size_align(len, REGION_ALIGN).ok()?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        Some(Self {
            ptr: NonNull::new(ptr)?,
            len,
            owner: Owner::Heap(layout),
        })
    }

    /// Describes memory owned elsewhere (a registered MR; an MDL mapping).
    /// `owner` is dropped with the region.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be valid for reads and writes, by this and other
    /// threads, for as long as the region lives, and must not be accessed by
    /// Rust code through references while the region lives (only through raw
    /// pointers or other regions). For a ULP's memory this is the contract
    /// of memory registration: the memory stays allocated until the MR is
    /// deregistered.
    pub unsafe fn from_raw_parts(
        ptr: *mut u8,
        len: usize,
        owner: Option<Box<dyn Any + Send + Sync>>,
    ) -> Option<Self> {
        Some(Self {
            ptr: NonNull::new(ptr)?,
            len,
            owner: Owner::External { keep_alive: owner },
        })
    }

    /// `len` bytes of `parent` from `offset`, as a region of their own that
    /// keeps `parent` (and `guard`, dropped with it) alive: a device's view
    /// of part of a mapping.
    ///
    /// Returns `None` for an empty or out-of-bounds range, or when the
    /// owner's box cannot be allocated (`guard` and the reference to
    /// `parent` are dropped then).
    #[must_use]
    pub fn sub(
        parent: Shared<Region>,
        offset: usize,
        len: usize,
        guard: Option<Box<dyn Any + Send + Sync>>,
    ) -> Option<Self> {
        if len == 0 {
            return None;
        }
        let ptr = parent.range(offset, len).ok()?;
        let owner: Box<dyn Any + Send + Sync> = crate::try_box((parent, guard)).ok()?;
        Some(Self {
            ptr: NonNull::new(ptr)?,
            len,
            owner: Owner::External {
                keep_alive: Some(owner),
            },
        })
    }

    /// The region a [`Region::sub`] was cut from (the platform that made
    /// the parent finds its owner there: a page of a device's BAR is
    /// device memory); `None` for any other region.
    #[must_use]
    pub fn parent(&self) -> Option<&Shared<Region>> {
        self.owner()?
            .downcast_ref::<(Shared<Region>, Option<Box<dyn Any + Send + Sync>>)>()
            .map(|(parent, _)| parent)
    }

    /// What keeps memory owned elsewhere alive (the `owner` given to
    /// [`Region::from_raw_parts`]), for the platform that made the region
    /// to find its own by downcasting (the MDL of a user pin, which a DMA
    /// mapping of the region uses); `None` for memory the region allocated.
    #[must_use]
    pub fn owner(&self) -> Option<&(dyn Any + Send + Sync)> {
        match &self.owner {
            Owner::External {
                keep_alive: Some(owner),
            } => Some(&**owner),
            _ => None,
        }
    }

    /// Length in bytes.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length region (never, for allocated ones).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of the first byte, as the ULP (in host mode) sees it.
    #[must_use]
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    fn range(&self, offset: usize, len: usize) -> Result<*mut u8, OutOfBounds> {
        self.window().range(offset, len)
    }

    /// The region's bounds as a value: the same checked accessors, for a
    /// loop that makes many accesses (its start and length stay in
    /// registers, where through `&Region` they are loaded again after every
    /// write into the region, which might have changed them as far as the
    /// compiler knows).
    #[must_use]
    #[inline(always)]
    pub fn window(&self) -> Window<'_> {
        Window {
            ptr: self.ptr,
            len: self.len,
            _region: core::marker::PhantomData,
        }
    }

    /// Copies `dst.len()` bytes at `offset` out of the region.
    ///
    /// # Errors
    /// [`OutOfBounds`]; nothing is copied.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), OutOfBounds> {
        self.window().read(offset, dst)
    }

    /// Copies `src` into the region at `offset`.
    ///
    /// # Errors
    /// [`OutOfBounds`]; nothing is written.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<(), OutOfBounds> {
        self.window().write(offset, src)
    }

    /// Fills `len` bytes at `offset` with `byte`.
    ///
    /// # Errors
    /// [`OutOfBounds`]; nothing is written.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<(), OutOfBounds> {
        let dst = self.range(offset, len)?;
        // SAFETY: `dst` is valid for `len` bytes (checked).
        unsafe { core::ptr::write_bytes(dst, byte, len) };
        Ok(())
    }

    /// Reads a plain struct at `offset` (by copy: a snapshot, safe to
    /// validate even if the ULP rewrites the bytes meanwhile).
    ///
    /// # Errors
    /// [`OutOfBounds`].
    pub fn read_obj<T: FromBytes + IntoBytes>(&self, offset: usize) -> Result<T, OutOfBounds> {
        self.window().read_obj(offset)
    }

    /// Writes a plain struct at `offset`.
    ///
    /// # Errors
    /// [`OutOfBounds`].
    pub fn write_obj<T: IntoBytes + Immutable>(
        &self,
        offset: usize,
        v: &T,
    ) -> Result<(), OutOfBounds> {
        self.window().write(offset, v.as_bytes())
    }

    /// Copies `len` bytes from `src` at `src_offset` to `dst` at
    /// `dst_offset` (the HCA's DMA between two registered regions): one
    /// memory copy, no bounce buffer. Overlapping ranges (the same memory
    /// registered twice) are handled. The copy is [`crate::copy`]'s, whose
    /// speed does not depend on how the two ranges are placed.
    ///
    /// # Errors
    /// [`OutOfBounds`] if either range is outside its region; nothing is copied.
    pub fn copy(
        dst: &Region,
        dst_offset: usize,
        src: &Region,
        src_offset: usize,
        len: usize,
    ) -> Result<(), OutOfBounds> {
        let d = dst.range(dst_offset, len)?;
        let s = src.range(src_offset, len)?;
        // SAFETY: both ranges are valid for `len` bytes (checked);
        // `move_bytes` is correct even if they overlap.
        unsafe { crate::copy::move_bytes(d, s, len) };
        Ok(())
    }

    /// The aligned `u32` at `offset` as an atomic.
    ///
    /// # Errors
    /// [`OutOfBounds`] if outside the region or not 4-byte aligned.
    pub fn atomic_u32(&self, offset: usize) -> Result<&AtomicU32, OutOfBounds> {
        self.window().atomic_u32(offset)
    }

    /// The `u32` at `offset` as an atomic, without the checks of
    /// [`Region::atomic_u32`] (for the ring's control words, checked once
    /// when the ring was built).
    ///
    /// # Safety
    /// `offset + 4` is at most the region's length, and the address at
    /// `offset` is 4-byte aligned.
    pub(crate) unsafe fn atomic_u32_unchecked(&self, offset: usize) -> &AtomicU32 {
        debug_assert!(offset + 4 <= self.len && (self.addr() as usize + offset) % 4 == 0);
        // SAFETY: in bounds and aligned (the caller's contract); valid for
        // the region's lifetime, which bounds the reference; all concurrent
        // accesses to index words are atomic (the ring protocol).
        unsafe { AtomicU32::from_ptr(self.ptr.as_ptr().add(offset).cast::<u32>()) }
    }

    /// Asks the processor to bring the cache line at `offset` into its
    /// cache, ahead of a read (a hint: it changes nothing, cannot fault,
    /// and does nothing for an offset outside the region or on a target
    /// without a prefetch instruction).
    ///
    /// IRQL: any.
    pub fn prefetch(&self, offset: usize) {
        if offset >= self.len {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        {
            use core::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
            let p = self.ptr.as_ptr().wrapping_add(offset);
            // SAFETY: SSE is in the x86_64 baseline, and a prefetch reads
            // nothing a program can observe (no fault, no value); `p` is
            // inside the region in any case.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>()) };
        }
    }

    /// The aligned `u64` at `offset` as an atomic (for RDMA atomics).
    ///
    /// # Errors
    /// [`OutOfBounds`] if outside the region or not 8-byte aligned.
    pub fn atomic_u64(&self, offset: usize) -> Result<&AtomicU64, OutOfBounds> {
        let p = self.range(offset, 8)?;
        if (p as usize) % 8 != 0 {
            return Err(OutOfBounds);
        }
        // SAFETY: as in `atomic_u32`, for 8 aligned bytes.
        Ok(unsafe { AtomicU64::from_ptr(p.cast::<u64>()) })
    }
}

/// A [`Region`]'s bounds held by value ([`Region::window`]), for the
/// duration of a borrow of the region: the same bounds-checked, race-
/// tolerant accessors.
#[derive(Clone, Copy)]
pub struct Window<'a> {
    ptr: NonNull<u8>,
    len: usize,
    _region: core::marker::PhantomData<&'a Region>,
}

impl<'a> Window<'a> {
    #[inline(always)]
    fn range(&self, offset: usize, len: usize) -> Result<*mut u8, OutOfBounds> {
        let end = offset.checked_add(len).ok_or(OutOfBounds)?;
        if end > self.len {
            return Err(OutOfBounds);
        }
        // SAFETY: offset + len <= self.len, the region's length, so the
        // result stays inside (or one past) the region, which the borrow
        // keeps alive.
        Ok(unsafe { self.ptr.as_ptr().add(offset) })
    }

    /// Whether `len` bytes at `offset` are inside the region.
    ///
    /// # Errors
    /// [`OutOfBounds`].
    #[inline(always)]
    pub fn check(&self, offset: usize, len: usize) -> Result<(), OutOfBounds> {
        self.range(offset, len).map(|_| ())
    }

    /// [`Region::read`].
    ///
    /// # Errors
    /// [`OutOfBounds`]; nothing is copied.
    #[inline(always)]
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), OutOfBounds> {
        let src = self.range(offset, dst.len())?;
        // SAFETY: `src` is valid for `dst.len()` bytes (checked), and `dst`
        // is a distinct Rust buffer, so the ranges don't overlap.
        unsafe { core::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// [`Region::write`].
    ///
    /// # Errors
    /// [`OutOfBounds`]; nothing is written.
    #[inline(always)]
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<(), OutOfBounds> {
        let dst = self.range(offset, src.len())?;
        // SAFETY: `dst` is valid for `src.len()` bytes (checked); `src` is a
        // Rust buffer, not part of any region, so they don't overlap.
        unsafe { core::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        Ok(())
    }

    /// [`Region::read_obj`].
    ///
    /// # Errors
    /// [`OutOfBounds`].
    #[inline(always)]
    pub fn read_obj<T: FromBytes + IntoBytes>(&self, offset: usize) -> Result<T, OutOfBounds> {
        let src = self.range(offset, size_of::<T>())?;
        // SAFETY: `src` is valid for `size_of::<T>()` bytes (checked);
        // `read_unaligned` assumes no alignment and copies them out, and
        // every byte pattern is a valid `T` (`FromBytes`).
        Ok(unsafe { src.cast::<T>().read_unaligned() })
    }

    /// [`Region::atomic_u32`], for as long as the region is borrowed.
    ///
    /// # Errors
    /// [`OutOfBounds`] if outside the region or not 4-byte aligned.
    #[inline(always)]
    pub fn atomic_u32(&self, offset: usize) -> Result<&'a AtomicU32, OutOfBounds> {
        let p = self.range(offset, 4)?;
        if (p as usize) % 4 != 0 {
            return Err(OutOfBounds);
        }
        // SAFETY: `p` is in bounds, 4-byte aligned and valid while the
        // region is borrowed ('a), which bounds the returned reference; all
        // concurrent accesses to index words are atomic (the ring protocol).
        Ok(unsafe { AtomicU32::from_ptr(p.cast::<u32>()) })
    }

    /// [`Region::write_obj`].
    ///
    /// # Errors
    /// [`OutOfBounds`].
    #[inline(always)]
    pub fn write_obj<T: IntoBytes + Immutable>(
        &self,
        offset: usize,
        v: &T,
    ) -> Result<(), OutOfBounds> {
        self.write(offset, v.as_bytes())
    }
}

/// Regions are equal when they are the same memory (same start and length).
impl PartialEq for Region {
    fn eq(&self, other: &Self) -> bool {
        self.ptr == other.ptr && self.len == other.len
    }
}

impl Eq for Region {}

impl Drop for Region {
    fn drop(&mut self) {
        if let Owner::Heap(layout) = self.owner {
            // SAFETY: allocated by `alloc` with exactly this layout.
            unsafe { dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The platform that made a region over memory owned elsewhere finds
    /// its owner again; a region's own memory has none.
    #[test]
    fn the_owner_of_external_memory_is_found_by_its_type() {
        let backing = Region::alloc(64).unwrap();
        // SAFETY: inside `backing`, which outlives the view.
        let view =
            unsafe { Region::from_raw_parts(backing.ptr.as_ptr(), 64, Some(Box::new(7u32))) }
                .unwrap();
        assert_eq!(view.owner().and_then(|o| o.downcast_ref::<u32>()), Some(&7));
        assert!(view.owner().and_then(|o| o.downcast_ref::<u8>()).is_none());
        assert!(backing.owner().is_none());
    }

    /// A sub-region names the region it was cut from, whatever its guard;
    /// other regions name none.
    #[test]
    fn a_sub_region_names_its_parent() {
        let parent = Shared::try_new(Region::alloc(8192).unwrap()).unwrap();
        let page = Region::sub(parent.clone(), 4096, 4096, None).unwrap();
        assert_eq!(page.parent().map(|p| p.addr()), Some(parent.addr()));
        let guarded = Region::sub(parent.clone(), 0, 16, Some(Box::new(1u8))).unwrap();
        assert_eq!(guarded.parent().map(|p| p.addr()), Some(parent.addr()));
        assert!(parent.parent().is_none());
        // SAFETY: inside `parent`, which outlives the view.
        let view = unsafe {
            Region::from_raw_parts(parent.range(0, 64).unwrap(), 64, Some(Box::new(7u32)))
        }
        .unwrap();
        assert!(view.parent().is_none());
    }

    /// A sub-region is the parent's memory, keeps it and its guard alive,
    /// and drops the guard with it; a range outside the parent is refused.
    #[test]
    fn a_sub_region_views_its_parent() {
        use core::sync::atomic::{AtomicBool, Ordering};
        static DROPPED: AtomicBool = AtomicBool::new(false);
        struct Guard;
        impl Drop for Guard {
            fn drop(&mut self) {
                DROPPED.store(true, Ordering::SeqCst);
            }
        }
        let parent = Shared::try_new(Region::alloc(8192).unwrap()).unwrap();
        assert!(Region::sub(parent.clone(), 4096, 4097, None).is_none());
        assert!(Region::sub(parent.clone(), 0, 0, None).is_none());
        let view = Region::sub(parent.clone(), 4096, 4096, Some(Box::new(Guard))).unwrap();
        view.write(8, &[9; 4]).unwrap();
        let mut b = [0u8; 4];
        parent.read(4096 + 8, &mut b).unwrap();
        assert_eq!(b, [9; 4]);
        assert_eq!(view.addr(), parent.addr() + 4096);
        assert!(view.write(4093, &[1; 4]).is_err());
        drop(parent);
        assert!(!DROPPED.load(Ordering::SeqCst));
        drop(view);
        assert!(DROPPED.load(Ordering::SeqCst));
    }

    /// A prefetch anywhere, the region's end and past it included, changes
    /// nothing and never faults.
    #[test]
    fn prefetch_is_only_a_hint() {
        let r = Region::alloc(256).unwrap();
        r.write(0, &[5; 256]).unwrap();
        for off in [0, 63, 64, 255, 256, 4096, usize::MAX] {
            r.prefetch(off);
        }
        let mut b = [0u8; 256];
        r.read(0, &mut b).unwrap();
        assert_eq!(b, [5; 256]);
    }

    #[test]
    fn bounds_are_checked() {
        let r = Region::alloc(64).unwrap();
        assert_eq!(r.addr() % REGION_ALIGN as u64, 0);
        let mut b = [0u8; 8];
        assert!(r.read(56, &mut b).is_ok());
        assert_eq!(r.read(57, &mut b), Err(OutOfBounds));
        assert_eq!(r.read(usize::MAX, &mut b), Err(OutOfBounds));
        assert_eq!(r.write(60, &[1; 8]), Err(OutOfBounds));
        r.write(8, &[7; 8]).unwrap();
        r.read(8, &mut b).unwrap();
        assert_eq!(b, [7; 8]);
        assert!(r.atomic_u32(2).is_err());
        assert!(r.atomic_u64(4).is_err());
        assert!(r.atomic_u64(64).is_err());
        r.atomic_u64(8)
            .unwrap()
            .fetch_add(1, core::sync::atomic::Ordering::SeqCst);
        assert!(Region::alloc(0).is_none());
    }

    #[test]
    fn copies_between_regions_and_overlapping() {
        let a = Region::alloc(4096).unwrap();
        let b = Region::alloc(4096).unwrap();
        a.write(0, &[1, 2, 3, 4]).unwrap();
        Region::copy(&b, 100, &a, 0, 4).unwrap();
        let mut out = [0; 4];
        b.read(100, &mut out).unwrap();
        assert_eq!(out, [1, 2, 3, 4]);
        Region::copy(&a, 2, &a, 0, 4).unwrap();
        let mut out = [0; 6];
        a.read(0, &mut out).unwrap();
        assert_eq!(out, [1, 2, 1, 2, 3, 4]);
        assert_eq!(Region::copy(&a, 4094, &b, 0, 4), Err(OutOfBounds));
    }

    /// Every length up to 24, between regions and within one, overlapping
    /// forwards and backwards by every distance: what a copy through a
    /// buffer gives (the same memory registered twice, as DMA sees it).
    #[test]
    fn small_copies_match_a_reference_at_every_length_and_overlap() {
        let pattern: alloc::vec::Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37) ^ 0x5A).collect();
        for len in 0..=24usize {
            for (dst_off, src_off) in (0..=24usize).flat_map(|d| [(d, 8), (8, d)]) {
                let a = Region::alloc(4096).unwrap();
                a.write(0, &pattern).unwrap();
                let mut want = pattern.clone();
                let moved = want[src_off..src_off + len].to_vec();
                want[dst_off..dst_off + len].copy_from_slice(&moved);
                Region::copy(&a, dst_off, &a, src_off, len).unwrap();
                let mut got = alloc::vec![0u8; 64];
                a.read(0, &mut got).unwrap();
                assert_eq!(got, want, "len {len}, {src_off} -> {dst_off}");
                let b = Region::alloc(4096).unwrap();
                Region::copy(&b, dst_off, &a, 0, len).unwrap();
                let mut got = alloc::vec![0u8; len];
                b.read(dst_off, &mut got).unwrap();
                assert_eq!(got, want[..len], "between regions, len {len}");
            }
        }
        let a = Region::alloc(4096).unwrap();
        assert_eq!(Region::copy(&a, 4090, &a, 0, 8), Err(OutOfBounds));
        assert_eq!(Region::copy(&a, 0, &a, 4090, 8), Err(OutOfBounds));
    }

    #[test]
    fn external_memory() {
        let mut buf = alloc::vec![0u8; 32];
        // SAFETY: `buf` outlives the region and is not touched through
        // references while the region lives.
        let r = unsafe { Region::from_raw_parts(buf.as_mut_ptr(), 32, None) }.unwrap();
        r.write(0, b"hi").unwrap();
        drop(r);
        assert_eq!(&buf[..2], b"hi");
    }
}
