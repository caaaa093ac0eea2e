//! The ring views ring the slots `IOCTL_IV_MAP_RINGS` reported, through a
//! file's doorbell page ([`PageDoorbells`]), and the page's mapping is
//! checked before it is used.
#![allow(unsafe_code, reason = "viewing rings and a page the test owns")]

use irpverbs_abi::*;
use irpverbs_kernel_table::{Bell, CqRings, Doorbells, PageDoorbells, QpRings, SendWr, SrqRings};
use irpverbs_ring::DoorbellPage;
use irpverbs_ring::Ring;
use irpverbs_ring::wq::{recv_stride, send_stride};

/// The slots the page holds, taken (what the HCA's scan would ring).
fn taken(page: &DoorbellPage) -> Vec<u32> {
    let mut v = Vec::new();
    page.take(|s| v.push(s));
    v
}

#[test]
fn views_ring_their_slots_in_the_page() {
    let sq = Ring::alloc(8, send_stride(1, 0)).unwrap();
    let rq = Ring::alloc(8, recv_stride(1)).unwrap();
    let cq = Ring::alloc(8, 64).unwrap();
    let srq = Ring::alloc(8, recv_stride(1)).unwrap();
    let cap = IvQpCap {
        max_send_wr: 7,
        max_recv_wr: 7,
        max_send_sge: 1,
        max_recv_sge: 1,
        ..IvQpCap::default()
    };
    let qp_out = IvCreateQpOut {
        qpn: 0x31,
        cap,
        sq: sq.map(),
        rq: rq.map(),
        ..IvCreateQpOut::default()
    };
    let qp_map = IvMapRingsOut {
        ring: sq.map(),
        rq: rq.map(),
        ring_doorbell: 70,
        rq_doorbell: 4095,
    };
    // SAFETY: the rings outlive the views.
    let qp = unsafe { QpRings::from_create(&qp_out) }.unwrap();
    assert_eq!(qp.sq_bell(), Bell::direct(0x31), "no slot from a create");
    let qp = qp.with_doorbells(&qp_map);
    assert_eq!(
        (qp.sq_bell(), qp.rq_bell()),
        (
            Bell {
                number: 0x31,
                slot: 70
            },
            Bell {
                number: 0x31,
                slot: 4095
            }
        )
    );
    // SAFETY: as above.
    let cqv = unsafe { CqRings::from_map(9, &cq.map()) }
        .unwrap()
        .with_doorbells(&IvMapRingsOut {
            ring_doorbell: 0,
            ..IvMapRingsOut::default()
        });
    let srq_out = IvCreateSrqOut {
        srqn: 5,
        max_wr: 7,
        max_sge: 1,
        ring: srq.map(),
        ..IvCreateSrqOut::default()
    };
    // SAFETY: as above.
    let srqv = unsafe { SrqRings::from_create(&srq_out) }
        .unwrap()
        .with_doorbells(&IvMapRingsOut {
            ring_doorbell: 64,
            ..IvMapRingsOut::default()
        });
    assert_eq!(
        srqv.bell(),
        Bell {
            number: 5,
            slot: 64
        }
    );

    let page = DoorbellPage::alloc().unwrap();
    let bells = PageDoorbells::new(page.clone());
    // Receives ring only when the HCA asks (their doorbell requests).
    rq.doorbell_request().set(true);
    srq.doorbell_request().set(true);
    qp.post_send(&bells, &SendWr::default()).unwrap();
    qp.post_recv(&bells, 1, &[]).unwrap();
    cqv.req_notify(&bells, false);
    srqv.post_recv(&bells, 2, &[]).unwrap();
    assert_eq!(taken(&page), [0, 64, 70, 4095]);
    // The WQEs were published before the doorbells.
    assert_eq!(sq.consumer().filled(), Ok(1));
    assert_eq!(rq.consumer().filled(), Ok(1));
    // Not asked: published, not rung.
    rq.doorbell_request().set(false);
    srq.doorbell_request().set(false);
    qp.post_recv(&bells, 3, &[]).unwrap();
    srqv.post_recv(&bells, 4, &[]).unwrap();
    assert!(taken(&page).is_empty(), "not asked");
    assert_eq!(rq.consumer().filled(), Ok(2));
    assert_eq!(srq.consumer().filled(), Ok(2));
    // A refused post rings nothing (the queue's depth is 7: one posted,
    // six more fill it).
    for _ in 0..6 {
        qp.post_send(&bells, &SendWr::default()).unwrap();
    }
    page.take(|_| {});
    assert!(qp.post_send(&bells, &SendWr::default()).is_err(), "full");
    assert!(taken(&page).is_empty());
    // A bell without a slot rings nothing through a page.
    bells.sq(Bell::direct(0x31));
    assert!(taken(&page).is_empty());
}

#[test]
fn a_doorbell_page_map_is_checked() {
    let page = DoorbellPage::alloc().unwrap();
    let good = IvMapDoorbellsOut {
        page_addr: page.region().addr(),
        page_len: IV_DOORBELL_PAGE_SIZE,
        slots: IV_DOORBELL_SLOTS,
    };
    // SAFETY: `page` outlives the view.
    let view = unsafe { PageDoorbells::from_map(&good) }.unwrap();
    assert_eq!(view.page(), &page);
    view.cq_arm(Bell { number: 1, slot: 3 });
    assert_eq!(taken(&page), [3]);
    for bad in [
        IvMapDoorbellsOut { slots: 64, ..good },
        IvMapDoorbellsOut {
            page_len: 64,
            ..good
        },
        IvMapDoorbellsOut {
            page_addr: good.page_addr + 8,
            ..good
        },
        IvMapDoorbellsOut::default(),
    ] {
        // SAFETY: refused before any access.
        let r = unsafe { PageDoorbells::from_map(&bad) };
        assert_eq!(r.err(), Some(STATUS_INVALID_PARAMETER), "{bad:?}");
    }
}

/// Counts its wake-ups.
#[derive(Default)]
struct Wakes(std::sync::atomic::AtomicUsize);

impl irpverbs_kernel_table::WakeHca for Wakes {
    fn wake_hca(&self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A doorbell wakes the HCA (`IOCTL_IV_RING_DOORBELLS`) only when the page
/// says it does not poll; a slot the page does not have wakes nothing.
#[test]
fn a_doorbell_wakes_an_hca_that_does_not_poll() {
    let page = DoorbellPage::alloc().unwrap();
    let wakes = std::sync::Arc::new(Wakes::default());
    let bells = PageDoorbells::new(page.clone()).with_wake(wakes.clone());
    let woken = || wakes.0.load(std::sync::atomic::Ordering::SeqCst);
    bells.sq(Bell { number: 1, slot: 3 });
    assert_eq!(woken(), 1, "a new page: the HCA is asleep");
    page.set_polling(true);
    bells.sq(Bell { number: 1, slot: 3 });
    bells.cq_arm(Bell { number: 2, slot: 4 });
    assert_eq!(woken(), 1, "polling: no system call");
    page.set_polling(false);
    bells.rq(Bell { number: 1, slot: 5 });
    assert_eq!(woken(), 2);
    bells.sq(Bell::direct(1));
    assert_eq!(woken(), 2, "no slot, no ring, no wake-up");
    assert_eq!(taken(&page), [3, 4, 5]);
    assert_eq!(bells, PageDoorbells::new(page));
}
