//! Loom model checks of the ring protocol and the doorbell handshake.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p irpverbs-ring --test loom
//! --release` (`.ci/run` does). Loom explores every interleaving of the two
//! threads (and every allowed reordering of their relaxed/acquire/release
//! accesses) and fails on a data race on a slot, a lost or duplicated entry,
//! or a lost wake-up.
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::sync::atomic::{AtomicU32, Ordering};
use loom::thread;

use irpverbs_ring::ring::{Consumer, IndexWord, Producer};

struct Word(AtomicU32);

impl IndexWord for Word {
    fn load(&self, order: Ordering) -> u32 {
        self.0.load(order)
    }
    fn store(&self, value: u32, order: Ordering) {
        self.0.store(value, order);
    }
}

/// A ring of `N` slots whose slots are loom cells, so that a slot read while
/// the other side writes it is reported as a data race.
struct Model<const N: usize> {
    producer: Word,
    consumer: Word,
    slots: [UnsafeCell<u32>; N],
}

// SAFETY: slots are only accessed under the ring protocol being checked;
// loom's UnsafeCell detects any access that protocol fails to order.
unsafe impl<const N: usize> Sync for Model<N> {}

impl<const N: usize> Model<N> {
    fn new(start: u32) -> Self {
        Self {
            producer: Word(AtomicU32::new(start)),
            consumer: Word(AtomicU32::new(start)),
            slots: std::array::from_fn(|_| UnsafeCell::new(0)),
        }
    }
    fn producer(&self) -> Producer<'_, Word> {
        Producer {
            producer: &self.producer,
            consumer: &self.consumer,
            entries: N as u32,
        }
    }
    fn consumer(&self) -> Consumer<'_, Word> {
        Consumer {
            producer: &self.producer,
            consumer: &self.consumer,
            entries: N as u32,
        }
    }
}

/// Items pass through a 2-slot ring in order, each exactly once, with no
/// race on a slot, also across the 2^32 index wrap.
#[test]
fn ring_passes_every_item_once_in_order() {
    loom::model(|| {
        let m = Arc::new(Model::<2>::new(u32::MAX - 1));
        let p = Arc::clone(&m);
        let producer = thread::spawn(move || {
            let mut sent = 0u32;
            while sent < 3 {
                let pr = p.producer();
                match pr.next_free() {
                    Some(i) => {
                        p.slots[(i as usize) % 2].with_mut(|s| {
                            // SAFETY: the slot is the producer's until published.
                            unsafe { *s = 100 + sent }
                        });
                        pr.publish(i.wrapping_add(1));
                        sent += 1;
                    }
                    None => thread::yield_now(),
                }
            }
        });
        let mut got = Vec::new();
        while got.len() < 3 {
            let c = m.consumer();
            match c.next_filled().expect("indices stay consistent") {
                Some(i) => {
                    let v = m.slots[(i as usize) % 2].with(|s| {
                        // SAFETY: the slot is the consumer's until released.
                        unsafe { *s }
                    });
                    got.push(v);
                    c.release(i.wrapping_add(1));
                }
                None => thread::yield_now(),
            }
        }
        producer.join().unwrap();
        assert_eq!(got, [100, 101, 102]);
    });
}

/// The doorbell handshake of the deferred engine, as the host device does
/// it: the ULP publishes, then sets the bell under the bell's mutex and
/// signals; the engine sleeps on the condition variable until the bell is
/// set, clears it, then drains the ring. However the two interleave, no
/// published entry is left with the engine asleep (loom reports a deadlock).
#[test]
fn doorbell_never_loses_a_wakeup() {
    use loom::sync::{Condvar, Mutex};
    loom::model(|| {
        let m = Arc::new(Model::<4>::new(0));
        let bell = Arc::new((Mutex::new(false), Condvar::new()));
        let (p, b) = (Arc::clone(&m), Arc::clone(&bell));
        let ulp = thread::spawn(move || {
            for n in 0..2u32 {
                let pr = p.producer();
                let i = pr.next_free().expect("room");
                p.slots[i as usize % 4].with_mut(|s| {
                    // SAFETY: the producer's slot until published.
                    unsafe { *s = n }
                });
                pr.publish(i + 1);
                *b.0.lock().unwrap() = true; // the doorbell write
                b.1.notify_one();
            }
        });
        let mut consumed = 0;
        while consumed < 2 {
            {
                let mut rung = bell.0.lock().unwrap();
                while !*rung {
                    rung = bell.1.wait(rung).unwrap();
                }
                *rung = false;
            }
            let c = m.consumer();
            while let Some(i) = c.next_filled().unwrap() {
                let v = m.slots[i as usize % 4].with(|s| {
                    // SAFETY: the consumer's slot until released.
                    unsafe { *s }
                });
                assert_eq!(v, consumed);
                consumed += 1;
                c.release(i + 1);
            }
        }
        ulp.join().unwrap();
        assert_eq!(m.consumer().filled(), Ok(0));
    });
}
