//! Every allocation of the ring crate's constructors can be refused: the
//! constructor then reports it (no abort) and leaves nothing allocated.

use irpverbs_failalloc::{FailAlloc, counting, sweep};
use irpverbs_ring::{DoorbellPage, MapError, Region, Ring, Shared};

#[global_allocator]
static ALLOC: FailAlloc = FailAlloc;

/// A path's allocations, swept: each refused in turn gives `None`, and
/// the run that refuses nothing succeeds; the path allocates `want` times.
fn sweep_path<T>(want: u64, mut path: impl FnMut() -> Option<T>) {
    let runs = sweep(&mut path, |n, got, failed| {
        assert_eq!(got.is_none(), failed, "allocation {n} refused: {failed}");
    });
    assert_eq!(runs, want, "allocations");
}

#[test]
fn ring_alloc_fails_cleanly_at_each_allocation() {
    // The memory and its reference count.
    sweep_path(2, || Ring::alloc(64, 64));
}

#[test]
fn doorbell_page_alloc_fails_cleanly_at_each_allocation() {
    sweep_path(2, DoorbellPage::alloc);
}

#[test]
fn a_mapped_view_reports_no_memory() {
    let ring = Ring::alloc(16, 64).unwrap();
    let map = irpverbs_abi::IvRingMap {
        control_addr: ring.region().addr(),
        entries_addr: ring.region().addr() + irpverbs_ring::ring::ENTRIES_OFFSET as u64,
        entries: 16,
        stride: 64,
    };
    let view = || {
        // SAFETY: `ring` keeps the memory alive and outlives every view.
        unsafe { Ring::from_map(&map) }
    };
    let (r, n) = counting(view);
    assert_eq!(n, 1, "a view allocates its reference count only");
    drop(r.unwrap());
    let (r, failed) = irpverbs_failalloc::failing_nth(0, view);
    assert!(failed);
    assert_eq!(r.unwrap_err(), MapError::NoMemory);
    assert_eq!(
        MapError::NoMemory.status(),
        irpverbs_abi::STATUS_INSUFFICIENT_RESOURCES
    );
    let page = DoorbellPage::alloc().unwrap();
    let addr = page.region().addr();
    let len = page.region().len() as u32;
    let (r, failed) = irpverbs_failalloc::failing_nth(0, || {
        // SAFETY: `page` keeps the memory alive and outlives the view.
        unsafe { DoorbellPage::from_map(addr, len) }
    });
    assert!(failed);
    assert_eq!(r.unwrap_err(), MapError::NoMemory);
}

#[test]
fn shared_try_new_gives_the_value_back() {
    let region = Region::alloc(64).unwrap();
    let addr = region.addr();
    let (r, failed) = irpverbs_failalloc::failing_nth(0, || Shared::try_new(region));
    assert!(failed);
    let back = r.unwrap_err();
    assert_eq!(back.addr(), addr, "the same region, unmoved");
}
