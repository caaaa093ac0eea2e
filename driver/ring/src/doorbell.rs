//! The doorbell page: how a user-mode ULP rings its queues' doorbells with
//! no system call, and how the HCA finds what was rung
//! ([`irpverbs_abi::IvDoorbellPage`] states the layout).
//!
//! Each queue doorbell of a file (a QP's send or receive queue, an SRQ, a
//! CQ's arm) is a *slot*: a bit of the page's `rung` words. The ULP, after
//! publishing its producer index (or arm word) with release ordering, sets
//! the slot's bit, then the bit of its word in `summary`, both with atomic
//! ORs and release ordering ([`ring`]). The HCA takes `summary` (an
//! exchange with 0, acquire), then each `rung` word it names (exchange with
//! 0, acquire) ([`take`]): whatever the ULP published before ringing is
//! visible to the HCA once it took the slot. A slot rung twice before it
//! is taken is taken once; a doorbell only says "look at this queue".
//!
//! The summary word is what keeps a scan of an idle page cheap (one load,
//! as a generation counter would) and tells the HCA which `rung` words to
//! take, so a scan touches only the words that were rung.
//!
//! No doorbell is lost: the slot's bit is set before its summary bit, so a
//! taker that finds the summary bit finds the slot bit (or an earlier take
//! already found it), and a summary bit set after a take is found by the
//! next one.
//!
//! The protocol is written against [`BellWord`] and [`BellWords`] so that
//! the same code runs on the shared page's atomics ([`DoorbellPage`]) and,
//! in loom tests, on loom's.
//!
//! Everything in the page is written by an untrusted ULP: [`take`] and
//! [`peek`] accept any contents (a summary bit for a word that has no bits,
//! bits in the reserved words) and only ever report slots below
//! [`IV_DOORBELL_SLOTS`]; which slots mean something is the HCA's business.

use core::sync::atomic::{AtomicU64, Ordering};

use irpverbs_abi::{IV_DOORBELL_PAGE_SIZE, IV_DOORBELL_SLOTS, IV_DOORBELL_WORDS, IvDoorbellPage};

use crate::region::{OutOfBounds, REGION_ALIGN, Region};
use crate::ring::MapError;
use crate::shared::Shared;

/// A 64-bit word of a doorbell page.
pub trait BellWord {
    /// Loads the word.
    fn load(&self, order: Ordering) -> u64;
    /// ORs `bits` in; returns the previous value.
    fn fetch_or(&self, bits: u64, order: Ordering) -> u64;
    /// Replaces the word; returns the previous value.
    fn swap(&self, value: u64, order: Ordering) -> u64;
}

impl BellWord for AtomicU64 {
    fn load(&self, order: Ordering) -> u64 {
        AtomicU64::load(self, order)
    }
    fn fetch_or(&self, bits: u64, order: Ordering) -> u64 {
        AtomicU64::fetch_or(self, bits, order)
    }
    fn swap(&self, value: u64, order: Ordering) -> u64 {
        AtomicU64::swap(self, value, order)
    }
}

/// The words of a doorbell page: the summary and the `rung` words.
pub trait BellWords {
    /// The word type.
    type Word: BellWord;
    /// The summary word.
    fn summary(&self) -> &Self::Word;
    /// `rung` word `index`, `None` past the last.
    fn rung(&self, index: u32) -> Option<&Self::Word>;
    /// The HCA's `polling` word (written by the HCA, read by the ULP).
    fn polling(&self) -> &Self::Word;
    /// A full (sequentially consistent) fence, of the same memory model as
    /// the words (loom's in loom tests).
    fn full_fence(&self) {
        core::sync::atomic::fence(Ordering::SeqCst);
    }
}

/// The ULP's side: rings `slot` (its `rung` bit, then its summary bit,
/// both with release ordering). Returns false, writing nothing, for a slot
/// the page does not have (such as [`irpverbs_abi::IV_DOORBELL_NONE`]).
pub fn ring<B: BellWords + ?Sized>(page: &B, slot: u32) -> bool {
    let word = slot / 64;
    if word >= IV_DOORBELL_WORDS {
        return false;
    }
    let Some(rung) = page.rung(word) else {
        return false;
    };
    rung.fetch_or(1 << (slot % 64), Ordering::Release);
    page.summary().fetch_or(1 << word, Ordering::Release);
    true
}

/// The ULP's side, after [`ring`]: true when the HCA is not polling the
/// page (its `polling` word is 0), so the ULP must wake it
/// (`IOCTL_IV_RING_DOORBELLS`). A full fence first orders the ring before
/// the read: the HCA clears the word and then looks at the summary with a
/// fence between, so either it sees this ring or this read sees its 0.
pub fn must_wake<B: BellWords + ?Sized>(page: &B) -> bool {
    page.full_fence();
    page.polling().load(Ordering::Relaxed) == 0
}

/// The HCA's side: publishes whether it polls the page (it never reads the
/// word back: the ULP may write anything there and only fools itself).
/// Before the last look at a page it stops polling ([`peek`] after
/// [`stopped_polling`]).
pub fn set_polling<B: BellWords + ?Sized>(page: &B, polling: bool) {
    page.polling().swap(u64::from(polling), Ordering::Relaxed);
}

/// The HCA's side, between clearing the `polling` words ([`set_polling`])
/// and its last look at the summaries ([`peek`]): a full fence (the other
/// half of [`must_wake`]'s), of `page`'s memory model.
pub fn stopped_polling<B: BellWords + ?Sized>(page: &B) {
    page.full_fence();
}

/// The HCA's first look: true when a summary bit is set (a relaxed load: a
/// slot rung just now may be missed, and is found by the next look).
pub fn peek<B: BellWords + ?Sized>(page: &B) -> bool {
    page.summary().load(Ordering::Relaxed) != 0
}

/// The HCA's side: takes the summary (exchange with 0, acquire). Bit `w`:
/// `rung` word `w` may have slots ([`take_word`]).
pub fn take_summary<B: BellWords + ?Sized>(page: &B) -> u64 {
    page.summary().swap(0, Ordering::Acquire)
}

/// The HCA's side: takes `rung` word `word` (exchange with 0, acquire).
/// Bit `b`: slot `64 * word + b` was rung. 0 for a word the page does not
/// have.
pub fn take_word<B: BellWords + ?Sized>(page: &B, word: u32) -> u64 {
    page.rung(word).map_or(0, |w| w.swap(0, Ordering::Acquire))
}

/// The HCA's side: takes every rung slot and calls `f` with each, word by
/// word, lowest first; returns how many.
pub fn take<B: BellWords + ?Sized>(page: &B, mut f: impl FnMut(u32)) -> usize {
    let mut n = 0;
    for_each_bit(take_summary(page), |word| {
        for_each_bit(take_word(page, word), |bit| {
            f(word * 64 + bit);
            n += 1;
        });
    });
    n
}

/// Calls `f` with the index of every set bit of `bits`, lowest first.
pub fn for_each_bit(mut bits: u64, mut f: impl FnMut(u32)) {
    while bits != 0 {
        f(bits.trailing_zeros());
        bits &= bits - 1;
    }
}

const SUMMARY_OFFSET: usize = core::mem::offset_of!(IvDoorbellPage, summary);
const RUNG_OFFSET: usize = core::mem::offset_of!(IvDoorbellPage, rung);
const POLLING_OFFSET: usize = core::mem::offset_of!(IvDoorbellPage, polling);

/// A doorbell page in shared memory: the HCA's (allocated, whole page) or
/// the ULP's view of its mapping. Pages are equal when they are the same
/// memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DoorbellPage {
    region: Shared<Region>,
}

impl DoorbellPage {
    /// Allocates a zeroed page (page-aligned, one whole page, so that it can
    /// be mapped into a user process without exposing anything else).
    /// `None` if an allocation (the page, its reference count) is refused;
    /// nothing stays allocated then.
    #[must_use]
    pub fn alloc() -> Option<Self> {
        let page = Region::alloc(IV_DOORBELL_PAGE_SIZE as usize)?;
        Self::new(Shared::try_new(page).ok()?).ok()
    }

    /// A page over `region`.
    ///
    /// # Errors
    /// [`OutOfBounds`] if the region is smaller than a doorbell page or not
    /// 8-byte aligned.
    pub fn new(region: Shared<Region>) -> Result<Self, OutOfBounds> {
        if region.len() < size_of::<IvDoorbellPage>() || region.addr() % 8 != 0 {
            return Err(OutOfBounds);
        }
        Ok(Self { region })
    }

    /// The page `IOCTL_IV_MAP_DOORBELLS` mapped at `addr`, `len` bytes, in
    /// this address space (the ULP's side).
    ///
    /// # Safety
    /// `addr..addr+len` is a doorbell page the driver mapped into this
    /// address space, and stays mapped while the result (or a clone) lives.
    ///
    /// # Errors
    /// [`MapError::Invalid`] for a length shorter than a page or an address
    /// that is not page-aligned; [`MapError::NoMemory`] when the view's
    /// reference count cannot be allocated.
    pub unsafe fn from_map(addr: u64, len: u32) -> Result<Self, MapError> {
        if len < IV_DOORBELL_PAGE_SIZE || addr % REGION_ALIGN as u64 != 0 {
            return Err(MapError::Invalid);
        }
        let ptr = addr as *mut u8;
        // SAFETY: the caller guarantees the mapping covers `len` bytes for
        // the region's lifetime; the page is reached only by atomics.
        let region =
            unsafe { Region::from_raw_parts(ptr, len as usize, None) }.ok_or(MapError::Invalid)?;
        let region = Shared::try_new(region).map_err(|_| MapError::NoMemory)?;
        Ok(Self::new(region)?)
    }

    /// The memory.
    #[must_use]
    pub fn region(&self) -> &Shared<Region> {
        &self.region
    }

    /// Rings `slot` ([`ring`]); false for a slot the page does not have.
    pub fn ring(&self, slot: u32) -> bool {
        ring(self, slot)
    }

    /// [`peek`].
    #[must_use]
    pub fn peek(&self) -> bool {
        peek(self)
    }

    /// [`must_wake`].
    #[must_use]
    pub fn must_wake(&self) -> bool {
        must_wake(self)
    }

    /// [`set_polling`].
    pub fn set_polling(&self, polling: bool) {
        set_polling(self, polling);
    }

    /// [`take_summary`].
    #[must_use]
    pub fn take_summary(&self) -> u64 {
        take_summary(self)
    }

    /// [`take_word`].
    #[must_use]
    pub fn take_word(&self, word: u32) -> u64 {
        take_word(self, word)
    }

    /// [`take`].
    pub fn take(&self, f: impl FnMut(u32)) -> usize {
        take(self, f)
    }
}

impl BellWords for DoorbellPage {
    type Word = AtomicU64;

    fn summary(&self) -> &AtomicU64 {
        self.region
            .atomic_u64(SUMMARY_OFFSET)
            .expect("the page's size and alignment are checked in DoorbellPage::new")
    }

    fn polling(&self) -> &AtomicU64 {
        self.region
            .atomic_u64(POLLING_OFFSET)
            .expect("the page's size and alignment are checked in DoorbellPage::new")
    }

    fn rung(&self, index: u32) -> Option<&AtomicU64> {
        if index >= IV_DOORBELL_WORDS {
            return None;
        }
        self.region
            .atomic_u64(RUNG_OFFSET + 8 * index as usize)
            .ok()
    }
}

const _: () = assert!(IV_DOORBELL_SLOTS == 64 * IV_DOORBELL_WORDS);

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;
    use irpverbs_abi::IV_DOORBELL_NONE;

    fn taken(page: &DoorbellPage) -> Vec<u32> {
        let mut v = Vec::new();
        page.take(|s| v.push(s));
        v
    }

    #[test]
    fn ring_then_take_reports_each_slot_once() {
        let page = DoorbellPage::alloc().unwrap();
        assert_eq!(page.region().len(), 4096);
        assert_eq!(page.region().addr() % 4096, 0);
        assert!(!page.peek());
        for slot in [0, 63, 64, 4095, 700, 700] {
            assert!(page.ring(slot));
        }
        assert!(page.peek());
        assert_eq!(taken(&page), [0, 63, 64, 700, 4095]);
        assert!(!page.peek());
        assert!(taken(&page).is_empty());
    }

    #[test]
    fn the_polling_word_tells_the_ulp_whether_to_wake_the_hca() {
        let page = DoorbellPage::alloc().unwrap();
        assert!(page.must_wake(), "a new page: the HCA is asleep");
        page.set_polling(true);
        assert!(page.ring(5));
        assert!(!page.must_wake());
        page.set_polling(false);
        assert!(page.must_wake());
        let mut word = [0u8; 8];
        page.region().read(POLLING_OFFSET, &mut word).unwrap();
        assert_eq!(word, [0; 8]);
        assert_eq!(
            POLLING_OFFSET, 576,
            "its own cache line, after the rung words"
        );
    }

    #[test]
    fn slots_the_page_does_not_have_write_nothing() {
        let page = DoorbellPage::alloc().unwrap();
        assert!(!page.ring(IV_DOORBELL_SLOTS));
        assert!(!page.ring(IV_DOORBELL_NONE));
        assert!(!page.peek());
        assert_eq!(page.take_word(IV_DOORBELL_WORDS), 0);
    }

    #[test]
    fn any_contents_are_taken_without_harm() {
        let page = DoorbellPage::alloc().unwrap();
        page.region().fill(0, 4096, 0xFF).unwrap();
        let slots = taken(&page);
        assert_eq!(slots.len(), IV_DOORBELL_SLOTS as usize);
        assert!(slots.iter().all(|&s| s < IV_DOORBELL_SLOTS));
        // The reserved words are never touched.
        let mut tail = [0u8; 8];
        page.region().read(4088, &mut tail).unwrap();
        assert_eq!(tail, [0xFF; 8]);
        // A summary bit for an empty word reports nothing.
        page.region().fill(0, 4096, 0).unwrap();
        page.region().write(0, &u64::MAX.to_ne_bytes()).unwrap();
        assert!(taken(&page).is_empty());
    }

    #[test]
    fn a_mapped_view_is_the_same_memory() {
        let page = DoorbellPage::alloc().unwrap();
        // SAFETY: `page` keeps the memory allocated and outlives `view`.
        let view = unsafe { DoorbellPage::from_map(page.region().addr(), 4096) }.unwrap();
        assert_eq!(view, page);
        view.ring(9);
        assert_eq!(taken(&page), [9]);
        // SAFETY: rejected before any access.
        assert!(unsafe { DoorbellPage::from_map(page.region().addr() + 8, 4096) }.is_err());
        // SAFETY: as above.
        assert!(unsafe { DoorbellPage::from_map(page.region().addr(), 4095) }.is_err());
        let small = Shared::try_new(Region::alloc(64).unwrap()).unwrap();
        assert!(DoorbellPage::new(small).is_err());
    }

    #[test]
    fn bits_in_order() {
        let mut v = Vec::new();
        for_each_bit(0x8000_0000_0000_0005, |b| v.push(b));
        assert_eq!(v, [0, 2, 63]);
    }
}
