//! Allocation that fails with a value instead of aborting.
//!
//! A Windows driver's pool allocation fails under memory pressure (Driver
//! Verifier's low-resources simulation makes it fail on purpose); Rust's
//! infallible allocation (`Box::new`, `Vec::push` past capacity) then calls
//! `handle_alloc_error`, a bugcheck in the kernel. The driver crates allocate
//! through these helpers, or through `Vec::try_reserve`, instead.
//! `Box::try_new` is not stable, so [`try_box`] does what it would do.
//!
//! IRQL: any at which the global allocator may be called (<= DISPATCH_LEVEL
//! with nonpaged pool).

use alloc::alloc::{Layout, alloc};
use alloc::boxed::Box;
use alloc::collections::TryReserveError;
use alloc::vec::Vec;

/// Moves `value` into a new box, or gives it back when memory is short.
///
/// # Errors
/// `value`, unmoved, when the allocation failed.
pub fn try_box<T>(value: T) -> Result<Box<T>, T> {
    let layout = Layout::new::<T>();
    if layout.size() == 0 {
        // Nothing to allocate: `Box::new` of a zero-sized value only makes
        // a dangling, well-aligned pointer.
        return Ok(Box::new(value));
    }
    // SAFETY: the layout's size is not zero (checked above).
    let ptr = unsafe { alloc(layout) }.cast::<T>();
    if ptr.is_null() {
        return Err(value);
    }
    // SAFETY: `ptr` is non-null, aligned and valid for a `T` (allocated
    // with `T`'s layout just now) and nothing else refers to it.
    unsafe { ptr.write(value) };
    // SAFETY: `ptr` was allocated by the global allocator with `T`'s layout
    // and holds an initialized `T`: what `Box::from_raw` requires (the
    // box frees it with the same layout).
    Ok(unsafe { Box::from_raw(ptr) })
}

/// A new box holding what `init` returns, allocated *before* `init` runs,
/// so that a large value is built in the box instead of on the stack and
/// then moved there (the kernel stack is 24 KiB; docs/stack-budget.md).
/// `init` should be a struct literal of small parts: fallible work (the
/// value's own allocations) belongs before, or after, in place.
///
/// Inlined always, so that the optimizer writes `init`'s value straight
/// through the new pointer. If `init` panics (a bugcheck in the kernel),
/// the allocation leaks.
///
/// # Errors
/// `None`, `init` not called, when the allocation failed.
#[inline(always)]
pub fn try_box_with<T>(init: impl FnOnce() -> T) -> Option<Box<T>> {
    let layout = Layout::new::<T>();
    if layout.size() == 0 {
        // Nothing to allocate (see `try_box`).
        return Some(Box::new(init()));
    }
    // SAFETY: the layout's size is not zero (checked above).
    let ptr = unsafe { alloc(layout) }.cast::<T>();
    if ptr.is_null() {
        return None;
    }
    // SAFETY: `ptr` is non-null, aligned and valid for a `T` (allocated
    // with `T`'s layout just now) and nothing else refers to it.
    unsafe { ptr.write(init()) };
    // SAFETY: as in `try_box`: allocated by the global allocator with `T`'s
    // layout, holding an initialized `T`.
    Some(unsafe { Box::from_raw(ptr) })
}

/// An empty vector with room for exactly `capacity` elements (no more
/// allocation until it holds that many).
///
/// # Errors
/// When the allocation failed (nothing is allocated then).
pub fn try_vec<T>(capacity: usize) -> Result<Vec<T>, TryReserveError> {
    let mut v = Vec::new();
    v.try_reserve_exact(capacity)?;
    Ok(v)
}

/// Appends `value` to `v`, growing it fallibly (amortized, as `push`).
///
/// # Errors
/// `value`, unmoved, when `v` is full and growing it failed; `v` is
/// unchanged then.
pub fn try_push<T>(v: &mut Vec<T>, value: T) -> Result<(), T> {
    if v.try_reserve(1).is_err() {
        return Err(value);
    }
    v.push(value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boxes_and_vectors() {
        let b = try_box([7u64; 40]).unwrap();
        assert_eq!(b[39], 7);
        assert_eq!(*try_box(()).unwrap(), ());
        let b = try_box_with(|| [9u64; 40]).unwrap();
        assert_eq!(b[39], 9);
        assert_eq!(*try_box_with(|| ()).unwrap(), ());
        let mut v = try_vec::<u32>(3).unwrap();
        assert!(v.capacity() >= 3 && v.is_empty());
        for i in 0..10 {
            try_push(&mut v, i).unwrap();
        }
        assert_eq!(v.len(), 10);
        assert!(try_vec::<u64>(usize::MAX / 4).is_err(), "too large fails");
    }
}
