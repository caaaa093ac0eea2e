//! Tagged pool accounting with Driver Verifier's pool tracking and its
//! (seeded) low-resources simulation.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use irpverbs_abi::{NtStatus, STATUS_INSUFFICIENT_RESOURCES};
use irpverbs_core::platform::{DISPATCH_LEVEL, PoolCharge, PoolTag};

use super::FaultInjection;
use super::bugcheck::{bad_pool, codes, stop, verifier};
use super::irql;

/// POOL_TYPE NonPagedPoolNx, what `ExAllocatePool2(POOL_FLAG_NON_PAGED)`
/// gives; shown in bugcheck parameters.
pub const NON_PAGED_POOL_NX: u64 = 512;

/// Live allocations of one tag.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TagUsage {
    /// Allocations not yet released.
    pub count: usize,
    /// Their bytes.
    pub bytes: usize,
}

/// A snapshot of the pool accounting (verifier on; all zeros when off,
/// except `charges` and `injected_failures`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Allocations not yet released.
    pub live: usize,
    /// Their bytes.
    pub live_bytes: usize,
    /// Live allocations per tag.
    pub by_tag: BTreeMap<PoolTag, TagUsage>,
    /// Successful charges so far.
    pub charges: u64,
    /// Charges the low-resources simulation refused.
    pub injected_failures: u64,
    /// Heap blocks charged to the pool (the global allocator's, made by
    /// driver code) not yet freed.
    pub heap_live: usize,
    /// Their bytes.
    pub heap_live_bytes: usize,
    /// Heap blocks charged so far.
    pub heap_charges: u64,
    /// Charges asked for so far (pool and heap, refused ones included):
    /// the numbering [`super::VerifierConfig::fail_nth`] counts in.
    pub attempts: u64,
}

/// A charge (heap or pool) recorded while sites are recorded: its number
/// and the backtrace of the allocation.
#[derive(Clone, Debug)]
pub struct ChargeSite {
    /// The charge's number among all charges asked for (from 1).
    pub attempt: u64,
    /// Bytes asked for.
    pub bytes: usize,
    /// The allocation's backtrace, as `std::backtrace::Backtrace` prints it.
    pub backtrace: String,
}

#[derive(Default)]
struct Live {
    charges: HashMap<u64, (PoolTag, usize)>,
    by_tag: BTreeMap<PoolTag, TagUsage>,
    bytes: usize,
}

/// The pool of one platform.
pub(crate) struct Pool {
    verify: bool,
    fail: Option<FaultInjection>,
    /// Next allocation id; ids below it were handed out.
    next_id: AtomicU64,
    /// Draws taken from the fault-injection stream.
    draws: AtomicU64,
    charges: AtomicU64,
    injected: AtomicU64,
    live: Mutex<Live>,
    /// Refuse exactly this charge attempt (0: none).
    fail_nth: u64,
    /// `fail` applies to heap charges too.
    fail_heap: bool,
    /// Charge attempts so far (pool and heap).
    attempts: AtomicU64,
    heap_live: AtomicU64,
    heap_bytes: AtomicU64,
    heap_charges: AtomicU64,
    /// Bytes of the first heap charge made above DISPATCH_LEVEL (0: none),
    /// and the IRQL.
    heap_above_dispatch: AtomicU64,
    sites: Mutex<Option<Vec<ChargeSite>>>,
}

/// splitmix64's increment (the golden ratio in 64 bits).
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// The splitmix64 output function: mixes one state value into 64
/// well-distributed bits.
const fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The `n`th (from 1) output of splitmix64 seeded with `seed`.
pub(crate) const fn splitmix64_nth(seed: u64, n: u64) -> u64 {
    mix64(seed.wrapping_add(n.wrapping_mul(GAMMA)))
}

impl Pool {
    pub(crate) fn new(
        verify: bool,
        fail: Option<FaultInjection>,
        fail_nth: Option<u64>,
        fail_heap: bool,
    ) -> Self {
        Self {
            fail_heap,
            fail_nth: fail_nth.unwrap_or(0),
            attempts: AtomicU64::new(0),
            heap_live: AtomicU64::new(0),
            heap_bytes: AtomicU64::new(0),
            heap_charges: AtomicU64::new(0),
            heap_above_dispatch: AtomicU64::new(0),
            sites: Mutex::new(None),
            verify,
            fail,
            next_id: AtomicU64::new(1),
            draws: AtomicU64::new(0),
            charges: AtomicU64::new(0),
            injected: AtomicU64::new(0),
            live: Mutex::new(Live::default()),
        }
    }

    fn live(&self) -> std::sync::MutexGuard<'_, Live> {
        self.live.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// True if the low-resources simulation refuses this charge. The nth
    /// charge's fate depends only on the seed and n.
    fn inject_failure(&self, seeded: bool) -> bool {
        let attempt = self.attempts.fetch_add(1, Ordering::Relaxed) + 1;
        if attempt == self.fail_nth {
            return true;
        }
        let Some(f) = self.fail.filter(|_| seeded) else {
            return false;
        };
        if f.one_in == 0 {
            return false;
        }
        let n = self.draws.fetch_add(1, Ordering::Relaxed) + 1;
        splitmix64_nth(f.seed, n) % u64::from(f.one_in) == 0
    }

    #[track_caller]
    pub(crate) fn charge(&self, tag: PoolTag, bytes: usize) -> Result<PoolCharge, NtStatus> {
        if self.verify {
            let now = irql::current_irql();
            if now > DISPATCH_LEVEL {
                stop(
                    codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
                    [
                        verifier::ALLOCATE_ABOVE_DISPATCH,
                        now.into(),
                        NON_PAGED_POOL_NX,
                        bytes as u64,
                    ],
                    format!("pool charge of {bytes} bytes at IRQL {now}"),
                );
            }
            if bytes == 0 {
                stop(
                    codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
                    [
                        verifier::ZERO_BYTE_ALLOCATION,
                        now.into(),
                        NON_PAGED_POOL_NX,
                        0,
                    ],
                    format!("zero-byte pool charge, tag {}", tag_str(tag)),
                );
            }
            if tag == 0 {
                stop(
                    codes::BAD_POOL_CALLER,
                    [bad_pool::ZERO_TAG, NON_PAGED_POOL_NX, bytes as u64, 0],
                    "pool charge with a tag of zero",
                );
            }
        }
        self.charge_checked(tag, bytes, true)
    }

    /// An allocation of the system's own (the I/O manager's): a charge
    /// attempt `fail_nth` may refuse (the seeded simulation does not), not
    /// the driver's memory, so not accounted to it.
    pub(crate) fn charge_os(&self) -> Result<(), NtStatus> {
        if self.inject_failure(false) {
            self.injected.fetch_add(1, Ordering::Relaxed);
            self.record_site(0);
            return Err(STATUS_INSUFFICIENT_RESOURCES);
        }
        self.record_site(0);
        Ok(())
    }

    fn charge_checked(
        &self,
        tag: PoolTag,
        bytes: usize,
        seeded: bool,
    ) -> Result<PoolCharge, NtStatus> {
        if self.inject_failure(seeded) {
            self.injected.fetch_add(1, Ordering::Relaxed);
            return Err(STATUS_INSUFFICIENT_RESOURCES);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.charges.fetch_add(1, Ordering::Relaxed);
        self.record_site(bytes);
        if self.verify {
            let mut live = self.live();
            live.charges.insert(id, (tag, bytes));
            let usage = live.by_tag.entry(tag).or_default();
            usage.count += 1;
            usage.bytes += bytes;
            live.bytes += bytes;
        }
        Ok(PoolCharge { tag, bytes, id })
    }

    #[track_caller]
    pub(crate) fn release(&self, charge: PoolCharge) {
        if !self.verify {
            return;
        }
        let now = irql::current_irql();
        if now > DISPATCH_LEVEL {
            stop(
                codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
                [
                    verifier::FREE_ABOVE_DISPATCH,
                    now.into(),
                    NON_PAGED_POOL_NX,
                    charge.id,
                ],
                format!("pool release at IRQL {now}"),
            );
        }
        let mut live = self.live();
        let Some(&(tag, bytes)) = live.charges.get(&charge.id) else {
            drop(live);
            if charge.id != 0 && charge.id < self.next_id.load(Ordering::Relaxed) {
                stop(
                    codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
                    [verifier::DOUBLE_FREE, 0, charge.id, charge.tag.into()],
                    format!(
                        "pool charge {} ({}) released twice",
                        charge.id,
                        tag_str(charge.tag)
                    ),
                );
            }
            stop(
                codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
                [verifier::FREE_BAD_ADDRESS, charge.id, 0, 0],
                format!("pool charge {} was never charged", charge.id),
            );
        };
        if tag != charge.tag {
            drop(live);
            stop(
                codes::BAD_POOL_CALLER,
                [
                    bad_pool::FREE_WRONG_TAG,
                    charge.id,
                    tag.into(),
                    charge.tag.into(),
                ],
                format!(
                    "pool charge {} of tag {} released with tag {}",
                    charge.id,
                    tag_str(tag),
                    tag_str(charge.tag)
                ),
            );
        }
        if bytes != charge.bytes {
            drop(live);
            stop(
                codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
                [
                    verifier::FREE_WRONG_SIZE,
                    charge.id,
                    charge.bytes as u64,
                    bytes as u64,
                ],
                format!(
                    "pool charge {} of {bytes} bytes released as {} bytes",
                    charge.id, charge.bytes
                ),
            );
        }
        live.charges.remove(&charge.id);
        live.bytes -= bytes;
        if let Some(usage) = live.by_tag.get_mut(&tag) {
            usage.count -= 1;
            usage.bytes -= bytes;
            if usage.count == 0 {
                live.by_tag.remove(&tag);
            }
        }
    }

    /// Charges a heap block of `bytes` made by driver code: false when the
    /// low-resources simulation refuses it. Only atomics, and (while sites
    /// are recorded) the record; the caller runs it uncharged.
    pub(crate) fn charge_heap(&self, bytes: usize) -> bool {
        if self.inject_failure(self.fail_heap) {
            self.injected.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        if self.verify {
            let now = irql::current_irql();
            if now > DISPATCH_LEVEL {
                let first = (bytes as u64) << 8 | u64::from(now);
                let _ = self.heap_above_dispatch.compare_exchange(
                    0,
                    first,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
            }
        }
        self.heap_charges.fetch_add(1, Ordering::Relaxed);
        self.heap_live.fetch_add(1, Ordering::Relaxed);
        self.heap_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        self.record_site(bytes);
        true
    }

    /// Credits a heap block charged with [`Pool::charge_heap`].
    pub(crate) fn release_heap(&self, bytes: usize) {
        self.heap_live.fetch_sub(1, Ordering::Relaxed);
        self.heap_bytes.fetch_sub(bytes as u64, Ordering::Relaxed);
    }

    /// The first heap charge made above DISPATCH_LEVEL: (IRQL, bytes).
    pub(crate) fn heap_above_dispatch(&self) -> Option<(u8, usize)> {
        let v = self.heap_above_dispatch.load(Ordering::Relaxed);
        (v != 0).then_some(((v & 0xFF) as u8, (v >> 8) as usize))
    }

    /// Starts (or stops, returning what was recorded) recording a backtrace
    /// of every heap charge.
    pub(crate) fn record_sites(&self, on: bool) -> Vec<ChargeSite> {
        let mut sites = self.sites.lock().unwrap_or_else(PoisonError::into_inner);
        let was = if on {
            sites.replace(Vec::new())
        } else {
            sites.take()
        };
        was.unwrap_or_default()
    }

    fn record_site(&self, bytes: usize) {
        let mut sites = self.sites.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(sites) = sites.as_mut() {
            sites.push(ChargeSite {
                attempt: self.attempts.load(Ordering::Relaxed),
                bytes,
                backtrace: std::backtrace::Backtrace::force_capture().to_string(),
            });
        }
    }

    pub(crate) fn stats(&self) -> PoolStats {
        let live = self.live();
        PoolStats {
            heap_live: self.heap_live.load(Ordering::Relaxed) as usize,
            heap_live_bytes: self.heap_bytes.load(Ordering::Relaxed) as usize,
            heap_charges: self.heap_charges.load(Ordering::Relaxed),
            attempts: self.attempts.load(Ordering::Relaxed),
            live: live.charges.len(),
            live_bytes: live.bytes,
            by_tag: live.by_tag.clone(),
            charges: self.charges.load(Ordering::Relaxed),
            injected_failures: self.injected.load(Ordering::Relaxed),
        }
    }
}

/// A pool tag as its four characters ("IvPd").
#[must_use]
pub fn tag_str(tag: PoolTag) -> String {
    tag.to_le_bytes()
        .iter()
        .map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                char::from(b)
            } else {
                '?'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use irpverbs_core::platform::pool_tag;

    #[test]
    fn splitmix64_reference_values() {
        // splitmix64 seeded with 0: the published first outputs.
        assert_eq!(splitmix64_nth(0, 1), 0xE220_A839_7B1D_CDAF);
        assert_eq!(splitmix64_nth(0, 2), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn accounting_by_tag() {
        let p = Pool::new(true, None, None, true);
        let a = p.charge(pool_tag(b"IvPd"), 10).unwrap();
        let b = p.charge(pool_tag(b"IvPd"), 5).unwrap();
        let c = p.charge(pool_tag(b"IvQp"), 7).unwrap();
        let s = p.stats();
        assert_eq!((s.live, s.live_bytes), (3, 22));
        assert_eq!(
            s.by_tag[&pool_tag(b"IvPd")],
            TagUsage {
                count: 2,
                bytes: 15
            }
        );
        p.release(a);
        p.release(b);
        p.release(c);
        let s = p.stats();
        assert_eq!((s.live, s.live_bytes, s.charges), (0, 0, 3));
        assert!(s.by_tag.is_empty());
    }

    #[test]
    fn tag_as_text() {
        assert_eq!(tag_str(pool_tag(b"IvPd")), "IvPd");
    }
}
