//! [`Shared`]: a reference-counted, thread-safe pointer whose allocation
//! fails with a value instead of aborting.
//!
//! `alloc::sync::Arc` has no fallible constructor on stable Rust
//! (`Arc::try_new` needs the unstable allocator API), so a queue's memory,
//! shared by the HCA's ring, the ULP's mapping and the pin of a request,
//! is counted here: [`Shared::try_new`] gives the value back when the
//! allocation is refused. The counting is `Arc`'s: a strong count (the
//! owners), a weak count (the [`WeakShared`] observers, plus one for all
//! the owners together), release decrements and an acquire fence before
//! the value is dropped or the memory freed.
//!
//! IRQL: any at which the global allocator may be called (<= DISPATCH_LEVEL
//! with nonpaged pool) for [`Shared::try_new`]; any for the rest, and for a
//! drop that does not free (a drop that frees runs the value's drop and
//! frees the block: <= DISPATCH_LEVEL).

use alloc::alloc::{Layout, alloc, dealloc};
use core::fmt;
use core::marker::PhantomData;
use core::ops::Deref;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicUsize, Ordering, fence};

struct Inner<T> {
    strong: AtomicUsize,
    /// Weak references, plus one held by all the strong ones together.
    weak: AtomicUsize,
    value: T,
}

/// Counts beyond this abort the clone (as `Arc`'s do): a count cannot
/// overflow into a use after free, whatever leaks clones.
const MAX_REFCOUNT: usize = isize::MAX as usize;

/// A thread-safe reference-counted pointer, allocated fallibly
/// ([`Shared::try_new`]); otherwise as `Arc`.
pub struct Shared<T> {
    ptr: NonNull<Inner<T>>,
    _owns: PhantomData<Inner<T>>,
}

/// An observer of a [`Shared`] value: it keeps the count block, not the
/// value, alive ([`WeakShared::strong_count`] says whether the value is).
pub struct WeakShared<T> {
    ptr: NonNull<Inner<T>>,
    _owns: PhantomData<Inner<T>>,
}

// SAFETY: as for `Arc<T>`: the value is reached through shared references
// from every thread that holds a clone, and dropped on whichever thread
// drops the last one; the counts are atomic.
unsafe impl<T: Send + Sync> Send for Shared<T> {}
// SAFETY: as above.
unsafe impl<T: Send + Sync> Sync for Shared<T> {}
// SAFETY: a weak reference only reads the counts and frees the block.
unsafe impl<T: Send + Sync> Send for WeakShared<T> {}
// SAFETY: as above.
unsafe impl<T: Send + Sync> Sync for WeakShared<T> {}

impl<T> Shared<T> {
    /// Moves `value` into a new shared allocation (strong count 1).
    ///
    /// # Errors
    /// `value`, unmoved, when the allocation is refused.
    pub fn try_new(value: T) -> Result<Self, T> {
        let layout = Layout::new::<Inner<T>>();
        // SAFETY: the layout is not zero-sized (it holds two counters).
        let raw = unsafe { alloc(layout) }.cast::<Inner<T>>();
        let Some(ptr) = NonNull::new(raw) else {
            return Err(value);
        };
        let inner = Inner {
            strong: AtomicUsize::new(1),
            weak: AtomicUsize::new(1),
            value,
        };
        // SAFETY: `ptr` is non-null, aligned and valid for an `Inner<T>`
        // (allocated with its layout just now), and nothing else refers to it.
        unsafe { ptr.as_ptr().write(inner) };
        Ok(Self {
            ptr,
            _owns: PhantomData,
        })
    }

    fn inner(&self) -> &Inner<T> {
        // SAFETY: a strong reference keeps the block and the value alive.
        unsafe { self.ptr.as_ref() }
    }

    /// Whether `a` and `b` point to the same allocation.
    #[must_use]
    pub fn ptr_eq(a: &Self, b: &Self) -> bool {
        a.ptr == b.ptr
    }

    /// Strong references (racy: other threads may change it at once).
    #[must_use]
    pub fn strong_count(this: &Self) -> usize {
        this.inner().strong.load(Ordering::Acquire)
    }

    /// The value, mutably, when this is its only reference (weak ones
    /// cannot reach the value: there is no upgrade).
    #[must_use]
    pub fn get_mut(this: &mut Self) -> Option<&mut T> {
        // Acquire: the other owners' accesses happen before, as their
        // decrements were releases.
        if this.inner().strong.load(Ordering::Acquire) != 1 {
            return None;
        }
        // SAFETY: the only strong reference, borrowed mutably: nothing
        // else can reach the value until the borrow ends.
        Some(unsafe { &mut (*this.ptr.as_ptr()).value })
    }

    /// A weak reference to the value.
    #[must_use]
    pub fn downgrade(this: &Self) -> WeakShared<T> {
        if this.inner().weak.fetch_add(1, Ordering::Relaxed) > MAX_REFCOUNT {
            panic!("WeakShared count overflow");
        }
        WeakShared {
            ptr: this.ptr,
            _owns: PhantomData,
        }
    }

    /// Gives up the reference as a raw pointer to the value (for a context
    /// slot that holds a pointer); [`Shared::from_raw`] takes it back.
    #[must_use]
    pub fn into_raw(this: Self) -> *const T {
        let this = core::mem::ManuallyDrop::new(this);
        // SAFETY: `ptr` points to a live `Inner<T>`; `addr_of!` makes a
        // pointer to its field without a reference.
        unsafe { core::ptr::addr_of!((*this.ptr.as_ptr()).value) }
    }

    /// Takes back a reference given up by [`Shared::into_raw`].
    ///
    /// # Safety
    /// `ptr` came from [`Shared::into_raw`] of a `Shared<T>` and is taken
    /// back at most once.
    pub unsafe fn from_raw(ptr: *const T) -> Self {
        let offset = core::mem::offset_of!(Inner<T>, value);
        // SAFETY: `ptr` points to the `value` field of a live `Inner<T>`
        // (the caller's contract), `offset` bytes into it.
        let inner = unsafe { ptr.cast::<u8>().sub(offset) }.cast::<Inner<T>>();
        Self {
            // SAFETY: derived from a non-null allocation's address.
            ptr: unsafe { NonNull::new_unchecked(inner.cast_mut()) },
            _owns: PhantomData,
        }
    }
}

impl<T> WeakShared<T> {
    /// Strong references left: 0 once the value is dropped.
    #[must_use]
    pub fn strong_count(&self) -> usize {
        // SAFETY: a weak reference keeps the block (the counts) alive.
        unsafe { self.ptr.as_ref() }.strong.load(Ordering::Acquire)
    }
}

impl<T> Clone for Shared<T> {
    fn clone(&self) -> Self {
        if self.inner().strong.fetch_add(1, Ordering::Relaxed) > MAX_REFCOUNT {
            panic!("Shared count overflow");
        }
        Self {
            ptr: self.ptr,
            _owns: PhantomData,
        }
    }
}

impl<T> Clone for WeakShared<T> {
    fn clone(&self) -> Self {
        // SAFETY: a weak reference keeps the block (the counts) alive.
        let inner = unsafe { self.ptr.as_ref() };
        if inner.weak.fetch_add(1, Ordering::Relaxed) > MAX_REFCOUNT {
            panic!("WeakShared count overflow");
        }
        Self {
            ptr: self.ptr,
            _owns: PhantomData,
        }
    }
}

impl<T> Deref for Shared<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.inner().value
    }
}

/// Releases one weak count of the block at `ptr`; frees the block when it
/// was the last (the value is already dropped then).
///
/// # Safety
/// The caller holds one weak count of a live block, and gives it up.
unsafe fn release_weak<T>(ptr: NonNull<Inner<T>>) {
    // SAFETY: the caller's weak count keeps the block alive until here.
    if unsafe { ptr.as_ref() }.weak.fetch_sub(1, Ordering::Release) != 1 {
        return;
    }
    // Every other reference's accesses happen before the block is freed.
    fence(Ordering::Acquire);
    // SAFETY: allocated by `alloc` with `Inner<T>`'s layout, and the last
    // count is gone: nothing refers to it any more.
    unsafe { dealloc(ptr.as_ptr().cast(), Layout::new::<Inner<T>>()) };
}

impl<T> Drop for Shared<T> {
    fn drop(&mut self) {
        if self.inner().strong.fetch_sub(1, Ordering::Release) != 1 {
            return;
        }
        // Every other owner's accesses to the value happen before its drop.
        fence(Ordering::Acquire);
        // SAFETY: the last strong reference: nothing reaches the value any
        // more (weak references cannot), and it is dropped once, here.
        unsafe { core::ptr::drop_in_place(core::ptr::addr_of_mut!((*self.ptr.as_ptr()).value)) };
        // SAFETY: the strong references' collective weak count, given up.
        unsafe { release_weak(self.ptr) };
    }
}

impl<T> Drop for WeakShared<T> {
    fn drop(&mut self) {
        // SAFETY: this reference's weak count, given up.
        unsafe { release_weak(self.ptr) };
    }
}

impl<T: fmt::Debug> fmt::Debug for Shared<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl<T> fmt::Debug for WeakShared<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("(WeakShared)")
    }
}

/// Shared values are equal when the values are.
impl<T: PartialEq> PartialEq for Shared<T> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl<T: Eq> Eq for Shared<T> {}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;
    use core::sync::atomic::AtomicBool;

    struct Flag<'a>(&'a AtomicBool);
    impl Drop for Flag<'_> {
        fn drop(&mut self) {
            assert!(!self.0.swap(true, Ordering::SeqCst), "dropped twice");
        }
    }

    #[test]
    fn counts_and_drops_once() {
        let dropped = AtomicBool::new(false);
        let a = Shared::try_new(Flag(&dropped)).ok().unwrap();
        let b = a.clone();
        assert!(Shared::ptr_eq(&a, &b));
        assert_eq!(Shared::strong_count(&a), 2);
        let mut a = a;
        assert!(Shared::get_mut(&mut a).is_none(), "shared");
        let w = Shared::downgrade(&a).clone();
        drop(a);
        assert_eq!(w.strong_count(), 1);
        assert!(!dropped.load(Ordering::SeqCst));
        let mut b = b;
        assert!(Shared::get_mut(&mut b).is_some(), "the only owner");
        let raw = Shared::into_raw(b);
        assert_eq!(w.strong_count(), 1, "into_raw keeps the reference");
        // SAFETY: from `into_raw` just above, taken back once.
        let b = unsafe { Shared::from_raw(raw) };
        drop(b);
        assert!(dropped.load(Ordering::SeqCst));
        assert_eq!(w.strong_count(), 0);
        drop(w);
    }

    #[test]
    fn threads_share_it() {
        let v = Shared::try_new(alloc::vec![1u32, 2, 3]).unwrap();
        let sum = std::thread::scope(|s| {
            let hs: alloc::vec::Vec<_> = (0..4)
                .map(|_| {
                    let c = v.clone();
                    s.spawn(move || c.iter().sum::<u32>())
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum::<u32>()
        });
        assert_eq!(sum, 24);
        assert_eq!(Shared::strong_count(&v), 1);
    }
}
