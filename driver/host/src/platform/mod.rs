//! The host platform: KMDF's execution model emulated over threads, under
//! a checking verifier.
//!
//! This first part holds the building blocks: bugchecks, the per-thread
//! IRQL with DPC queues, spin locks with Driver Verifier's IRQL and
//! deadlock-detection checks, tagged pool accounting with its seeded
//! low-resources simulation, and kernel events with the wait rules.

// The crate-private constructors are used by `HostPlatform` (next commit).
#![allow(dead_code)]

mod bugcheck;
mod event;
mod irql;
mod pool;
mod spinlock;

pub use bugcheck::{
    BugCheck, bad_pool, bugcheck, catch_bugcheck, code_name, codes, iomanager, verifier, wdf,
};
pub use event::{EventKind, HostEvent};
pub use irql::{Dpc, HIGH_LEVEL, current_irql};
pub use pool::{NON_PAGED_POOL_NX, PoolStats, TagUsage, tag_str};
pub use spinlock::{HostSpinLock, RawSpinLock};

/// Driver Verifier's low-resources simulation: refuse about one pool charge
/// in `one_in`, pseudo-randomly from `seed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultInjection {
    /// The seed; the same seed refuses the same charges (by order).
    pub seed: u64,
    /// One charge in this many fails on average; 0 never fails, 1 always.
    pub one_in: u32,
}
