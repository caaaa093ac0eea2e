//! The ring protocol: one producer and one consumer share a ring of
//! `entries` slots through two free-running indices.
//!
//! - The producer owns the slots from `producer` up to `consumer + entries`:
//!   it writes a slot, then publishes `producer + 1` with release ordering.
//! - The consumer owns the slots from `consumer` up to `producer`: it loads
//!   `producer` with acquire ordering, reads the slot, then publishes
//!   `consumer + 1` with release ordering, handing the slot back.
//!
//! Each side writes only its own index. A consumer that does not trust the
//! producer (the HCA reading a ULP's ring) checks `producer - consumer <=
//! entries` and treats anything else as a corrupt ring.
//!
//! The protocol is written against [`IndexWord`] so that the same code runs
//! on the shared memory's atomics and, in loom tests, on loom's.

use core::sync::atomic::{AtomicU32, Ordering};

use irpverbs_abi::{IV_CACHE_LINE, IvRingControl, IvRingMap};

use crate::region::{OutOfBounds, REGION_ALIGN, Region, Window};
use crate::shared::Shared;

/// An index word shared between producer and consumer.
pub trait IndexWord {
    /// Loads the index.
    fn load(&self, order: Ordering) -> u32;
    /// Stores the index.
    fn store(&self, value: u32, order: Ordering);
    /// A sequentially consistent fence, of the memory model these words
    /// live in (loom's, in its tests).
    fn fence_seq_cst(&self) {
        core::sync::atomic::fence(Ordering::SeqCst);
    }
}

impl IndexWord for AtomicU32 {
    fn load(&self, order: Ordering) -> u32 {
        AtomicU32::load(self, order)
    }
    fn store(&self, value: u32, order: Ordering) {
        AtomicU32::store(self, value, order);
    }
}

/// A receive queue's (or SRQ's) doorbell request: the ring's arm word,
/// which the HCA sets while it must hear of new receives at once
/// ([`IvRingControl::arm`] states the protocol). Posting receives rings
/// the doorbell only when [`DoorbellRequest::wanted`] says so, as posting
/// to a hardware HCA only writes its doorbell record.
///
/// The handshake is Dekker's: the ULP publishes its producer index, fences
/// and reads the request; the HCA sets the request, fences and reads the
/// producer index. The two fences are sequentially consistent, so at
/// least one side sees the other's write: a receive published while the
/// HCA starts asking is either rung or found by the HCA's read.
#[derive(Debug)]
pub struct DoorbellRequest<'a, W: IndexWord> {
    /// The request word (the ring's arm word).
    pub word: &'a W,
}

impl<W: IndexWord> DoorbellRequest<'_, W> {
    /// The ULP's side, after publishing its producer index: whether the
    /// HCA asks for the doorbell.
    #[must_use]
    pub fn wanted(&self) -> bool {
        self.word.fence_seq_cst();
        self.word.load(Ordering::Relaxed) != 0
    }

    /// The HCA's side: asks for doorbells (`true`) or stops asking. After
    /// asking, the caller reads the producer index again: receives
    /// published by a poster that saw no request are visible to that read.
    pub fn set(&self, ask: bool) {
        self.word.store(u32::from(ask), Ordering::Relaxed);
        if ask {
            self.word.fence_seq_cst();
        }
    }

    /// Whether the HCA is asking (its own last [`DoorbellRequest::set`]).
    #[must_use]
    pub fn asking(&self) -> bool {
        self.word.load(Ordering::Relaxed) != 0
    }
}

/// Why a mapping could not be viewed (`Ring::from_map`,
/// `DoorbellPage::from_map`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapError {
    /// The map does not describe a ring (or a doorbell page).
    Invalid,
    /// The view's reference count could not be allocated.
    NoMemory,
}

impl MapError {
    /// The status a verb returns for it: `STATUS_INVALID_PARAMETER` or
    /// `STATUS_INSUFFICIENT_RESOURCES`.
    #[must_use]
    pub fn status(self) -> irpverbs_abi::NtStatus {
        match self {
            Self::Invalid => irpverbs_abi::STATUS_INVALID_PARAMETER,
            Self::NoMemory => irpverbs_abi::STATUS_INSUFFICIENT_RESOURCES,
        }
    }
}

impl From<OutOfBounds> for MapError {
    fn from(_: OutOfBounds) -> Self {
        Self::Invalid
    }
}

/// The ring's indices are inconsistent: `producer - consumer > entries`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Corrupt;

/// The producer's half of the protocol.
#[derive(Debug)]
pub struct Producer<'a, W: IndexWord> {
    /// The producer index (written by this side).
    pub producer: &'a W,
    /// The consumer index (read by this side).
    pub consumer: &'a W,
    /// Slots (a power of two).
    pub entries: u32,
}

impl<W: IndexWord> Producer<'_, W> {
    /// The index of the next free slot, or `None` when the ring is full.
    pub fn next_free(&self) -> Option<u32> {
        let p = self.producer.load(Ordering::Relaxed);
        let c = self.consumer.load(Ordering::Acquire);
        (p.wrapping_sub(c) < self.entries).then_some(p)
    }

    /// Free slots.
    pub fn free(&self) -> u32 {
        let p = self.producer.load(Ordering::Relaxed);
        let c = self.consumer.load(Ordering::Acquire);
        self.entries.saturating_sub(p.wrapping_sub(c))
    }

    /// Publishes every slot before `next`: the consumer may read them now.
    pub fn publish(&self, next: u32) {
        self.producer.store(next, Ordering::Release);
    }
}

/// The consumer's half of the protocol.
#[derive(Debug)]
pub struct Consumer<'a, W: IndexWord> {
    /// The producer index (read by this side).
    pub producer: &'a W,
    /// The consumer index (written by this side).
    pub consumer: &'a W,
    /// Slots (a power of two).
    pub entries: u32,
}

impl<W: IndexWord> Consumer<'_, W> {
    /// The index of the next filled slot, `Ok(None)` when the ring is empty.
    ///
    /// # Errors
    /// [`Corrupt`] when the producer published more than the ring holds.
    pub fn next_filled(&self) -> Result<Option<u32>, Corrupt> {
        let c = self.consumer.load(Ordering::Relaxed);
        let p = self.producer.load(Ordering::Acquire);
        let n = p.wrapping_sub(c);
        if n > self.entries {
            return Err(Corrupt);
        }
        Ok((n != 0).then_some(c))
    }

    /// Filled slots.
    ///
    /// # Errors
    /// [`Corrupt`] as above.
    pub fn filled(&self) -> Result<u32, Corrupt> {
        let c = self.consumer.load(Ordering::Relaxed);
        let p = self.producer.load(Ordering::Acquire);
        let n = p.wrapping_sub(c);
        if n > self.entries {
            Err(Corrupt)
        } else {
            Ok(n)
        }
    }

    /// Hands every slot before `next` back to the producer.
    pub fn release(&self, next: u32) {
        self.consumer.store(next, Ordering::Release);
    }
}

/// Byte offset of the first slot: after the [`IvRingControl`].
pub const ENTRIES_OFFSET: usize = size_of::<IvRingControl>();
const PRODUCER_OFFSET: usize = 0;
const CONSUMER_OFFSET: usize = IV_CACHE_LINE;
const ARM_OFFSET: usize = 2 * IV_CACHE_LINE;

/// A ring in shared memory: the control block, then `entries` slots of
/// `stride` bytes. Rings are equal when they are the same memory with the
/// same geometry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ring {
    region: Shared<Region>,
    entries: u32,
    stride: u32,
}

impl Ring {
    /// Bytes of shared memory a ring of `entries` slots of `stride` needs.
    #[must_use]
    pub fn bytes(entries: u32, stride: u32) -> usize {
        ENTRIES_OFFSET + entries as usize * stride as usize
    }

    /// Allocates a zeroed ring: whole pages ([`REGION_ALIGN`] bytes each),
    /// page-aligned, so that the ring can be mapped into a user process
    /// (which maps whole pages) without exposing any other allocation's
    /// bytes, and so that a kernel allocator that aligns only allocations of
    /// at least a page (`ExAllocatePool2`) still returns aligned memory.
    ///
    /// Returns `None` if `entries` or `stride` is not a power of two, or an
    /// allocation (the memory, its reference count) is refused; nothing
    /// stays allocated then.
    #[must_use]
    pub fn alloc(entries: u32, stride: u32) -> Option<Self> {
        let bytes = Self::alloc_len(entries, stride)?;
        let region = Shared::try_new(Region::alloc(bytes)?).ok()?;
        Self::new(region, entries, stride).ok()
    }

    /// Bytes [`Ring::alloc`] allocates for such a ring: [`Ring::bytes`]
    /// rounded up to whole pages, so that mapping the ring into a process
    /// exposes nothing else. `None` on overflow.
    #[must_use]
    pub fn alloc_len(entries: u32, stride: u32) -> Option<usize> {
        Self::bytes(entries, stride).checked_next_multiple_of(REGION_ALIGN)
    }

    /// A ring over `region`.
    ///
    /// # Errors
    /// [`OutOfBounds`] if the region is too small or the geometry invalid.
    pub fn new(region: Shared<Region>, entries: u32, stride: u32) -> Result<Self, OutOfBounds> {
        if !entries.is_power_of_two()
            || !stride.is_power_of_two()
            || region.len() < Self::bytes(entries, stride)
        {
            return Err(OutOfBounds);
        }
        if region.addr() % IV_CACHE_LINE as u64 != 0 {
            return Err(OutOfBounds);
        }
        Ok(Self {
            region,
            entries,
            stride,
        })
    }

    /// The ring a create verb reported, in the caller's address space (the
    /// ULP's side of the speed path).
    ///
    /// # Safety
    /// `map` must describe a ring the driver mapped into this address space
    /// and that stays mapped while the returned ring (or a clone) lives: the
    /// ULP must drop its rings before destroying the object (or closing the
    /// file) that owns them.
    ///
    /// # Errors
    /// [`MapError::Invalid`] for a map whose geometry is not a ring;
    /// [`MapError::NoMemory`] when the view's reference count cannot be
    /// allocated.
    pub unsafe fn from_map(map: &IvRingMap) -> Result<Self, MapError> {
        if map.entries_addr != map.control_addr + ENTRIES_OFFSET as u64 {
            return Err(MapError::Invalid);
        }
        let bytes = Self::bytes(map.entries, map.stride);
        // SAFETY: the caller guarantees the mapping covers the control block
        // and the slots (`bytes`) for the region's lifetime, and the ring
        // protocol (copies and atomics only) is the only access to it.
        let region = unsafe { Region::from_raw_parts(map.control_addr as *mut u8, bytes, None) }
            .ok_or(MapError::Invalid)?;
        let region = Shared::try_new(region).map_err(|_| MapError::NoMemory)?;
        Ok(Self::new(region, map.entries, map.stride)?)
    }

    /// Slots.
    #[must_use]
    pub fn entries(&self) -> u32 {
        self.entries
    }

    /// Work requests a work queue (send, receive or shared receive queue)
    /// over this ring holds at most: one less than its slots, the depth the
    /// verbs report for it (2^k - 1 for 2^k slots), so that a queue
    /// created with a depth of 0 (one slot) holds nothing. The ULP's post
    /// refuses a work request beyond it ([`crate::wq`]) and the HCA treats
    /// a producer index beyond it as a corrupt ring.
    #[must_use]
    pub fn capacity(&self) -> u32 {
        self.entries - 1
    }

    /// Bytes per slot.
    #[must_use]
    pub fn stride(&self) -> u32 {
        self.stride
    }

    /// The memory.
    #[must_use]
    pub fn region(&self) -> &Shared<Region> {
        &self.region
    }

    /// A control word: `offset` is one of the control block's word
    /// offsets.
    fn word(&self, offset: usize) -> &AtomicU32 {
        const { assert!(ARM_OFFSET + 4 <= ENTRIES_OFFSET) };
        debug_assert!(offset <= ARM_OFFSET && offset % 4 == 0);
        // SAFETY: `Ring::new` checked that the region holds the control
        // block (`ENTRIES_OFFSET` bytes, past every word offset, asserted
        // above) and starts on a cache line, so every word offset (a
        // multiple of 4) is in bounds and 4-byte aligned.
        unsafe { self.region.atomic_u32_unchecked(offset) }
    }

    /// The producer index.
    #[must_use]
    pub fn producer_word(&self) -> &AtomicU32 {
        self.word(PRODUCER_OFFSET)
    }

    /// The consumer index.
    #[must_use]
    pub fn consumer_word(&self) -> &AtomicU32 {
        self.word(CONSUMER_OFFSET)
    }

    /// The arm word (CQs).
    #[must_use]
    pub fn arm_word(&self) -> &AtomicU32 {
        self.word(ARM_OFFSET)
    }

    /// The doorbell request (receive queues and SRQs: the arm word).
    #[must_use]
    pub fn doorbell_request(&self) -> DoorbellRequest<'_, AtomicU32> {
        DoorbellRequest {
            word: self.arm_word(),
        }
    }

    /// The producer's view.
    #[must_use]
    pub fn producer(&self) -> Producer<'_, AtomicU32> {
        Producer {
            producer: self.producer_word(),
            consumer: self.consumer_word(),
            entries: self.entries,
        }
    }

    /// The consumer's view.
    #[must_use]
    pub fn consumer(&self) -> Consumer<'_, AtomicU32> {
        Consumer {
            producer: self.producer_word(),
            consumer: self.consumer_word(),
            entries: self.entries,
        }
    }

    /// Byte offset (in the region) of the slot of `index`.
    #[must_use]
    pub fn slot_offset(&self, index: u32) -> usize {
        self.slots().offset(index)
    }

    /// The slots' geometry and the region's bounds as a value, for a loop
    /// over many slots ([`Region::window`]).
    #[must_use]
    #[inline(always)]
    pub fn slots(&self) -> Slots<'_> {
        Slots {
            window: self.region.window(),
            mask: self.entries - 1,
            stride: self.stride,
        }
    }

    /// Brings the slot of `index` into this processor's cache ahead of a
    /// read ([`Region::prefetch`]: a hint, no effect on the contents).
    pub fn prefetch_slot(&self, index: u32) {
        self.region.prefetch(self.slot_offset(index));
    }

    /// Where the ring is, as the create verbs report it (host mode: the
    /// ULP's addresses are the kernel's).
    #[must_use]
    pub fn map(&self) -> IvRingMap {
        IvRingMap {
            entries_addr: self.region.addr() + ENTRIES_OFFSET as u64,
            control_addr: self.region.addr(),
            entries: self.entries,
            stride: self.stride,
        }
    }
}

/// A ring's slots as a value ([`Ring::slots`]): where each slot is, and the
/// region's checked accessors.
#[derive(Clone, Copy)]
pub struct Slots<'a> {
    /// The region's bounds.
    pub window: Window<'a>,
    mask: u32,
    stride: u32,
}

impl Slots<'_> {
    /// Byte offset (in the region) of the slot of `index`
    /// ([`Ring::slot_offset`]).
    #[must_use]
    #[inline(always)]
    pub fn offset(&self, index: u32) -> usize {
        ENTRIES_OFFSET + (index & self.mask) as usize * self.stride as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fills_and_drains_with_wrapping_indices() {
        let r = Ring::alloc(4, 64).unwrap();
        // Start near the wrap point.
        r.producer_word().store(u32::MAX - 1, Ordering::Relaxed);
        r.consumer_word().store(u32::MAX - 1, Ordering::Relaxed);
        let (p, c) = (r.producer(), r.consumer());
        assert_eq!(c.next_filled(), Ok(None));
        let mut next = p.next_free().unwrap();
        for _ in 0..4 {
            assert_eq!(p.next_free(), Some(next));
            next = next.wrapping_add(1);
            p.publish(next);
        }
        assert_eq!(p.next_free(), None);
        assert_eq!(p.free(), 0);
        assert_eq!(c.filled(), Ok(4));
        let first = c.next_filled().unwrap().unwrap();
        c.release(first.wrapping_add(1));
        assert_eq!(p.free(), 1);
        assert_eq!(r.slot_offset(first), ENTRIES_OFFSET + 2 * 64);
    }

    #[test]
    fn a_lying_producer_is_detected() {
        let r = Ring::alloc(4, 64).unwrap();
        r.producer_word().store(5, Ordering::Relaxed);
        assert_eq!(r.consumer().next_filled(), Err(Corrupt));
        assert_eq!(r.consumer().filled(), Err(Corrupt));
    }

    #[test]
    fn a_ring_from_its_map_is_the_same_memory() {
        let r = Ring::alloc(8, 64).unwrap();
        // SAFETY: `r` keeps the memory alive and outlives `view`.
        let view = unsafe { Ring::from_map(&r.map()) }.unwrap();
        view.producer().publish(3);
        assert_eq!(r.consumer().filled(), Ok(3));
        let mut bad = r.map();
        bad.entries_addr += 64;
        // SAFETY: rejected before any access.
        assert!(unsafe { Ring::from_map(&bad) }.is_err());
    }

    #[test]
    fn rings_are_whole_pages() {
        for (entries, stride) in [(1, 64), (4, 64), (64, 64), (16, 256)] {
            let r = Ring::alloc(entries, stride).unwrap();
            assert_eq!(r.region().addr() % REGION_ALIGN as u64, 0);
            assert_eq!(r.region().len() % REGION_ALIGN, 0);
            assert!(r.region().len() >= Ring::bytes(entries, stride));
        }
    }

    #[test]
    fn geometry_is_checked() {
        assert!(Ring::alloc(3, 64).is_none());
        assert!(Ring::alloc(4, 48).is_none());
        let small = Shared::try_new(Region::alloc(100).unwrap()).unwrap();
        assert!(Ring::new(small, 4, 64).is_err());
        let m = Ring::alloc(8, 64).unwrap().map();
        assert_eq!(m.entries_addr - m.control_addr, ENTRIES_OFFSET as u64);
    }
}
