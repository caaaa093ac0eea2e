//! Loom model checks of the ring protocol, the doorbell handshake of the
//! deferred engine, the doorbell page protocol and the receive queues'
//! doorbell request.
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

use irpverbs_ring::ring::{Consumer, DoorbellRequest, IndexWord, Producer};

struct Word(AtomicU32);

impl IndexWord for Word {
    fn load(&self, order: Ordering) -> u32 {
        self.0.load(order)
    }
    fn store(&self, value: u32, order: Ordering) {
        self.0.store(value, order);
    }
    fn fence_seq_cst(&self) {
        loom::sync::atomic::fence(Ordering::SeqCst);
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

/// The consumer's side of the ring tests: takes `count` items, in order,
/// releasing each slot after reading it.
fn consume(m: &Model<2>, count: usize) -> Vec<u32> {
    let mut got = Vec::new();
    while got.len() < count {
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
    got
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
        let got = consume(&m, 3);
        producer.join().unwrap();
        assert_eq!(got, [100, 101, 102]);
    });
}

/// As [`ring_passes_every_item_once_in_order`], with the producer posting
/// as `SendQueue` and `RecvQueue` do: it reads the consumer index only when
/// the free slots it last saw are used up, and writes into those slots
/// without looking again. A count that was not a lower bound would write a
/// slot the consumer still reads (a race loom reports).
#[test]
fn posting_into_known_free_slots_never_overwrites_a_filled_one() {
    loom::model(|| {
        let m = Arc::new(Model::<2>::new(u32::MAX - 1));
        let p = Arc::clone(&m);
        let producer = thread::spawn(move || {
            let (mut sent, mut known) = (0u32, 0u32);
            while sent < 3 {
                let pr = p.producer();
                if known == 0 {
                    known = pr.free();
                    if known == 0 {
                        thread::yield_now();
                        continue;
                    }
                }
                let i = pr.producer.load(Ordering::Relaxed);
                p.slots[(i as usize) % 2].with_mut(|s| {
                    // SAFETY: a free slot is the producer's until published.
                    unsafe { *s = 100 + sent }
                });
                pr.publish(i.wrapping_add(1));
                known -= 1;
                sent += 1;
            }
        });
        let got = consume(&m, 3);
        producer.join().unwrap();
        assert_eq!(got, [100, 101, 102]);
    });
}

/// A CQ polled by its entries' sequence words (`CompletionQueue::poll` as
/// `push_cqe` writes them): the HCA writes an entry's body, then its
/// sequence word (release), then the producer index; the poller takes the
/// entry it expects once its sequence word says so (acquire), without the
/// producer index, and releases the slot. Over two laps of a 2-slot ring,
/// every entry arrives once, in order, and no body is read while written;
/// the producer index the poller falls back on is at worst behind it by
/// the ring.
#[test]
fn cqe_sequence_words_publish_each_entry_once() {
    struct Cq {
        m: Model<2>,
        seq: [AtomicU32; 2],
    }
    // SAFETY: as for `Model`: the bodies are loom cells.
    unsafe impl Sync for Cq {}
    loom::model(|| {
        let cq = Arc::new(Cq {
            m: Model::<2>::new(0),
            seq: [AtomicU32::new(0), AtomicU32::new(0)],
        });
        let hca = Arc::clone(&cq);
        let writer = thread::spawn(move || {
            let mut sent = 0u32;
            while sent < 3 {
                let pr = hca.m.producer();
                match pr.next_free() {
                    Some(i) => {
                        let k = (i as usize) % 2;
                        hca.m.slots[k].with_mut(|s| {
                            // SAFETY: a free slot is the HCA's until its
                            // sequence word is stored.
                            unsafe { *s = 100 + sent }
                        });
                        hca.seq[k].store(i.wrapping_add(1), Ordering::Release);
                        pr.publish(i.wrapping_add(1));
                        sent += 1;
                    }
                    None => thread::yield_now(),
                }
            }
        });
        let mut got = Vec::new();
        while got.len() < 3 {
            let c = cq.m.consumer();
            let i = c.consumer.load(Ordering::Relaxed);
            let k = (i as usize) % 2;
            if cq.seq[k].load(Ordering::Acquire) == i.wrapping_add(1) {
                got.push(cq.m.slots[k].with(|s| {
                    // SAFETY: the entry is the poller's until released.
                    unsafe { *s }
                }));
                c.release(i.wrapping_add(1));
            } else {
                // The fallback reads the producer index, which may still be
                // behind entries taken by their sequence words: by at most
                // the ring, never a corruption.
                let p = cq.m.producer.load(Ordering::Acquire);
                assert!(
                    c.filled().is_ok() || i.wrapping_sub(p) <= 2,
                    "producer {p} consumer {i}"
                );
                thread::yield_now();
            }
        }
        writer.join().unwrap();
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

/// A doorbell page of two `rung` words over loom's atomics.
struct Page {
    summary: Bits,
    rung: [Bits; 2],
    polling: Bits,
}

struct Bits(loom::sync::atomic::AtomicU64);

impl Bits {
    fn new() -> Self {
        Self(loom::sync::atomic::AtomicU64::new(0))
    }
}

impl irpverbs_ring::doorbell::BellWord for Bits {
    fn load(&self, order: Ordering) -> u64 {
        self.0.load(order)
    }
    fn fetch_or(&self, bits: u64, order: Ordering) -> u64 {
        self.0.fetch_or(bits, order)
    }
    fn swap(&self, value: u64, order: Ordering) -> u64 {
        self.0.swap(value, order)
    }
}

impl irpverbs_ring::doorbell::BellWords for Page {
    type Word = Bits;
    fn summary(&self) -> &Self::Word {
        &self.summary
    }
    fn rung(&self, index: u32) -> Option<&Self::Word> {
        self.rung.get(index as usize)
    }
    fn polling(&self) -> &Self::Word {
        &self.polling
    }
    fn full_fence(&self) {
        loom::sync::atomic::fence(Ordering::SeqCst);
    }
}

/// The poller going to sleep while a ULP rings: the HCA clears `polling`,
/// fences and looks at the summary once more; the ULP rings, fences and
/// reads `polling`. However they interleave, the doorbell is not lost: the
/// HCA's last look finds it, or the ULP reads 0 and wakes the HCA (both may
/// happen; neither missing is the bug the fences prevent).
#[test]
fn a_doorbell_rung_while_the_poller_stops_is_found_or_wakes_it() {
    use irpverbs_ring::doorbell::{must_wake, peek, ring, set_polling, stopped_polling};
    loom::model(|| {
        let page = Arc::new(Page {
            summary: Bits::new(),
            rung: [Bits::new(), Bits::new()],
            polling: Bits::new(),
        });
        set_polling(&*page, true);
        let p = Arc::clone(&page);
        let ulp = thread::spawn(move || {
            assert!(ring(&*p, 3));
            must_wake(&*p)
        });
        set_polling(&*page, false);
        stopped_polling(&*page);
        let found = peek(&*page);
        let woke = ulp.join().unwrap();
        assert!(
            found || woke,
            "the doorbell was neither seen nor woke the HCA"
        );
    });
}

/// The doorbell page protocol: two ULP threads each publish an entry on
/// their own queue and ring its slot; the HCA takes slots until it has seen
/// both and reads each queue's entry when it takes its slot. However they
/// interleave, the HCA sees every slot (no lost doorbell), reads the entry
/// the ULP published before ringing (a slot taken before its summary bit
/// was set too: loom reports a race on the entry, or the entry is left
/// unread, otherwise), and takes nothing twice once both were rung. Slots
/// in one `rung` word, then in two.
#[test]
fn doorbell_page_delivers_every_slot_after_its_entry() {
    doorbell_page_model([3, 5]);
    doorbell_page_model([3, 69]);
}

fn doorbell_page_model(slots: [u32; 2]) {
    use irpverbs_ring::doorbell::{ring, take};
    loom::model(move || {
        let page = Arc::new(Page {
            summary: Bits::new(),
            rung: [Bits::new(), Bits::new()],
            polling: Bits::new(),
        });
        let queues = Arc::new([Model::<2>::new(0), Model::<2>::new(0)]);
        let ulps: Vec<_> = (0..2)
            .map(|q| {
                let (page, queues) = (Arc::clone(&page), Arc::clone(&queues));
                thread::spawn(move || {
                    let m = &queues[q];
                    let pr = m.producer();
                    let i = pr.next_free().expect("room");
                    m.slots[i as usize % 2].with_mut(|s| {
                        // SAFETY: the producer's slot until published.
                        unsafe { *s = 10 + q as u32 }
                    });
                    pr.publish(i + 1);
                    assert!(ring(&*page, slots[q]));
                })
            })
            .collect();
        let mut seen = [false; 2];
        while seen != [true, true] {
            let mut any = false;
            take(&*page, |slot| {
                any = true;
                let q = slots.iter().position(|&s| s == slot).expect("a rung slot");
                let m = &queues[q];
                let c = m.consumer();
                // The entry published before the ring is visible.
                if let Some(i) = c.next_filled().unwrap() {
                    let v = m.slots[i as usize % 2].with(|s| {
                        // SAFETY: the consumer's slot until released.
                        unsafe { *s }
                    });
                    assert_eq!(v, 10 + q as u32);
                    c.release(i + 1);
                }
                assert!(
                    !seen[q] || c.filled() == Ok(0),
                    "nothing new for a queue seen"
                );
                seen[q] = true;
            });
            if !any {
                thread::yield_now();
            }
        }
        for u in ulps {
            u.join().unwrap();
        }
        assert_eq!(queues[0].consumer().filled(), Ok(0));
        assert_eq!(queues[1].consumer().filled(), Ok(0));
        assert_eq!(take(&*page, |_| {}), 0, "nothing rung twice");
    });
}

/// The receive queue's doorbell request: the ULP posts a receive and rings
/// only if the HCA asks; the HCA starts asking (its responder found nothing
/// to receive into) and reads the producer index again. However the two
/// interleave, the receive is never lost: it is rung, or the HCA's read
/// finds it, and what the HCA reads of it is what the ULP wrote.
#[test]
fn a_receive_posted_while_the_hca_starts_asking_is_rung_or_found() {
    use loom::sync::atomic::AtomicBool;
    loom::model(|| {
        let m = Arc::new(Model::<2>::new(0));
        let request = Arc::new(Word(AtomicU32::new(0)));
        let rung = Arc::new(AtomicBool::new(false));
        let (p, r, bell) = (Arc::clone(&m), Arc::clone(&request), Arc::clone(&rung));
        let ulp = thread::spawn(move || {
            let pr = p.producer();
            let i = pr.next_free().expect("room");
            p.slots[0].with_mut(|s| {
                // SAFETY: the producer's slot until published.
                unsafe { *s = 7 }
            });
            pr.publish(i + 1);
            if (DoorbellRequest { word: &*r }).wanted() {
                bell.store(true, Ordering::Relaxed);
            }
        });
        DoorbellRequest { word: &*request }.set(true);
        let found = m.consumer().next_filled().unwrap().is_some();
        if found {
            let v = m.slots[0].with(|s| {
                // SAFETY: the consumer's slot until released.
                unsafe { *s }
            });
            assert_eq!(v, 7);
        }
        ulp.join().unwrap();
        assert!(
            found || rung.load(Ordering::Relaxed),
            "a receive neither rung nor found"
        );
    });
}
