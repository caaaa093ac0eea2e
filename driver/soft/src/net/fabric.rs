//! Delivery between soft HCAs in one process.
//!
//! A [`Fabric`] is a registry of soft HCAs by GID (their port's GID 0).
//! [`Fabric::attach`] registers an HCA (by a weak reference: the fabric
//! never keeps an HCA alive) and gives the HCA the fabric to route by; a QP
//! whose address vector names another attached HCA's GID then reaches it. A
//! GID that is the HCA's own is loopback and never goes through the fabric.
//!
//! Delivery never calls into another HCA while holding the sender's locks
//! beyond one leaf lock: the sender, holding its own `HCA_LOCK`, appends
//! frames to the receiver's *inbox* (its own lock, [`INBOX_LOCK`], a leaf),
//! which keeps each QP's packets in order whoever sends them. After it
//! released its locks the sender *kicks* the receiver: an
//! [`Execution::Inline`](crate::Execution::Inline) receiver is run on the
//! sender's thread (from a work list, never by recursion), a
//! [`Execution::Deferred`](crate::Execution::Deferred) one gets its
//! doorbell rung and runs on its own hardware thread.

use alloc::sync::{Arc, Weak};
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU64, Ordering};

use irpverbs_abi::{NtStatus, STATUS_INSUFFICIENT_RESOURCES, STATUS_INVALID_PARAMETER};
use irpverbs_core::platform::LockClass;
use irpverbs_core::{Platform, SpinLock};

use crate::SoftHca;
use crate::wire::packet::{Batch, Gid};

/// The fabric's registry (taken under an HCA's `HCA_LOCK`, rank 20, to
/// resolve a GID; nothing is taken under it).
pub static FABRIC_LOCK: LockClass = LockClass {
    name: "irpverbs.soft.fabric",
    rank: 22,
};

/// An HCA's inbox of frames from other HCAs (taken under the *sender's*
/// `HCA_LOCK`, and under the receiver's own to drain it; a leaf).
pub static INBOX_LOCK: LockClass = LockClass {
    name: "irpverbs.soft.inbox",
    rank: 25,
};

/// What an HCA is to the others on a fabric.
pub(crate) trait Peer: Send + Sync {
    /// Appends `batch`'s frames to the inbox (the inbox lock only; called
    /// holding the sender's `HCA_LOCK`). `batch` is left empty; or, when
    /// the inbox has no memory to grow, unchanged, and false is returned
    /// (the sender tries again on its next step).
    fn accept(&self, batch: &mut Batch) -> bool;

    /// Its work runs on the thread that sends to it
    /// ([`crate::Execution::Inline`]); otherwise [`Peer::ring`] wakes its
    /// hardware thread.
    fn inline(&self) -> bool;

    /// Rings the (deferred) HCA's doorbell: frames wait in its inbox. Only
    /// signals its bus ([`crate::SoftBus::doorbell`]): callable with a
    /// soft HCA lock held.
    fn ring(&self);

    /// Its work is left after the sender's call used its budget: requeued
    /// to its own bus (another DPC; [`crate::SoftBus::resume`] never runs
    /// it synchronously): callable with a soft HCA lock held.
    fn requeue(&self);

    /// Has its own bus run it: [`Peer::requeue`] inline, [`Peer::ring`]
    /// deferred (both only queue a DPC or signal the firmware: never run
    /// the peer on this call, so a soft HCA lock may be held).
    fn wake(&self) {
        if self.inline() {
            self.requeue();
        } else {
            self.ring();
        }
    }

    /// Runs one data-path step on this thread: (work is left, packets of
    /// work done).
    fn step(&self, todo: &mut Todo) -> (bool, u64);

    /// Identity, to compare peers.
    fn id(&self) -> usize;
}

/// How a [`crate::firmware::Firmware`] finds other HCAs.
pub(crate) trait Router: Send + Sync {
    /// The HCA whose GID is `gid`.
    fn resolve(&self, gid: &Gid) -> Option<Weak<dyn Peer>>;
    /// Changes whenever an HCA is attached or detached (routes cached
    /// under an older generation are resolved again).
    fn generation(&self) -> u64;
}

/// HCAs that got frames and must run (inline ones, on this thread) or be
/// woken (deferred ones), without duplicates: the work list of a drive
/// loop. Holds two inline and spills to the heap beyond (a fabric of many
/// HCAs talking at once), growing fallibly: an HCA the list has no memory
/// for is woken on its own bus instead ([`Peer::wake`]), and runs its
/// frames there.
pub(crate) struct Todo {
    first: Option<Arc<dyn Peer>>,
    second: Option<Arc<dyn Peer>>,
    spill: Vec<Arc<dyn Peer>>,
}

impl Todo {
    /// An empty list.
    pub(crate) const fn new() -> Self {
        Self {
            first: None,
            second: None,
            spill: Vec::new(),
        }
    }

    /// Adds `peer` unless it is on the list; wakes it on its own bus when
    /// the list has no memory to grow.
    pub(crate) fn push(&mut self, peer: Arc<dyn Peer>) {
        let id = peer.id();
        let listed = self.first.as_ref().is_some_and(|p| p.id() == id)
            || self.second.as_ref().is_some_and(|p| p.id() == id)
            || self.spill.iter().any(|p| p.id() == id);
        if listed {
            return;
        }
        if self.first.is_none() {
            self.first = Some(peer);
        } else if self.second.is_none() {
            self.second = Some(peer);
        } else if let Err(peer) = irpverbs_ring::try_push(&mut self.spill, peer) {
            peer.wake();
        }
    }

    /// Takes one.
    pub(crate) fn pop(&mut self) -> Option<Arc<dyn Peer>> {
        if let Some(p) = self.spill.pop() {
            return Some(p);
        }
        self.second.take().or_else(|| self.first.take())
    }
}

struct Attached<P: Platform> {
    gid: Gid,
    hca: Weak<SoftHca<P>>,
}

/// A registry of soft HCAs by GID: packets between its HCAs are delivered
/// in-process. See the [module documentation](self).
pub struct Fabric<P: Platform> {
    ports: P::Lock<Vec<Attached<P>>>,
    generation: AtomicU64,
}

impl<P: Platform> core::fmt::Debug for Fabric<P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Fabric")
            .field("attached", &self.len())
            .finish_non_exhaustive()
    }
}

impl<P: Platform> Fabric<P> {
    /// An empty fabric, its lock from `platform`.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    pub fn new(platform: &P) -> Arc<Self> {
        Arc::new(Self {
            ports: platform.new_lock(&FABRIC_LOCK, Vec::new()),
            generation: AtomicU64::new(0),
        })
    }

    /// Attaches `hca`: packets from the fabric's HCAs to its GID reach it,
    /// and its packets to their GIDs reach them.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER` when `hca` is attached to a fabric
    /// already, or another live HCA of this fabric has its GID;
    /// `STATUS_INSUFFICIENT_RESOURCES` when memory runs out.
    pub fn attach(self: &Arc<Self>, hca: &Arc<SoftHca<P>>) -> Result<(), NtStatus> {
        let router: Arc<dyn Router> = self.clone();
        hca.set_router(Some(router))?;
        let gid = hca.gid();
        let added = self.ports.lock(|ports| {
            ports.retain(|p| p.hca.strong_count() > 0);
            if ports.iter().any(|p| p.gid == gid) {
                return Err(STATUS_INVALID_PARAMETER);
            }
            ports
                .try_reserve(1)
                .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
            ports.push(Attached {
                gid,
                hca: Arc::downgrade(hca),
            });
            Ok(())
        });
        if let Err(status) = added {
            let _ = hca.set_router(None);
            return Err(status);
        }
        self.generation.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// Detaches `hca` (if attached here): packets to its GID are dropped
    /// from now on, and it reaches nothing but itself.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    pub fn detach(&self, hca: &SoftHca<P>) {
        let me = core::ptr::from_ref(hca);
        self.ports.lock(|ports| {
            ports.retain(|p| p.hca.strong_count() > 0 && !core::ptr::eq(p.hca.as_ptr(), me));
        });
        self.generation.fetch_add(1, Ordering::AcqRel);
        let _ = hca.set_router(None);
    }

    /// Live HCAs attached.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    pub fn len(&self) -> usize {
        self.ports
            .lock(|ports| ports.iter().filter(|p| p.hca.strong_count() > 0).count())
    }

    /// No live HCA attached.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<P: Platform> Router for Fabric<P> {
    fn resolve(&self, gid: &Gid) -> Option<Weak<dyn Peer>> {
        self.ports.lock(|ports| {
            ports.iter().find(|p| p.gid == *gid).map(|p| {
                let w: Weak<dyn Peer> = p.hca.clone();
                w
            })
        })
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::sync::atomic::AtomicUsize;

    /// A peer that counts its wakes.
    struct Counted {
        inline: bool,
        rings: AtomicUsize,
        requeues: AtomicUsize,
    }

    impl Peer for Counted {
        fn accept(&self, _: &mut Batch) -> bool {
            true
        }
        fn inline(&self) -> bool {
            self.inline
        }
        fn ring(&self) {
            self.rings.fetch_add(1, Ordering::SeqCst);
        }
        fn requeue(&self) {
            self.requeues.fetch_add(1, Ordering::SeqCst);
        }
        fn step(&self, _: &mut Todo) -> (bool, u64) {
            (false, 0)
        }
        fn id(&self) -> usize {
            core::ptr::from_ref(self).addr()
        }
    }

    fn peer(inline: bool) -> Arc<Counted> {
        Arc::new(Counted {
            inline,
            rings: AtomicUsize::new(0),
            requeues: AtomicUsize::new(0),
        })
    }

    /// Past two HCAs the list grows fallibly: an HCA it has no memory for
    /// is woken on its own bus (a DPC inline, its doorbell deferred), not
    /// an abort; listed ones are not woken, and nothing is listed twice.
    #[test]
    fn a_peer_the_list_cannot_hold_is_woken_on_its_bus() {
        let (a, b, c, d) = (peer(true), peer(true), peer(true), peer(false));
        let mut todo = Todo::new();
        for p in [&a, &b, &a] {
            let ((), n) = irpverbs_failalloc::counting(|| todo.push(p.clone()));
            assert_eq!(n, 0, "two peers are held inline");
        }
        let ((), failed) = irpverbs_failalloc::failing_nth(0, || todo.push(c.clone()));
        assert!(failed);
        assert_eq!(c.requeues.load(Ordering::SeqCst), 1, "inline: requeued");
        let ((), failed) = irpverbs_failalloc::failing_nth(0, || todo.push(d.clone()));
        assert!(failed);
        assert_eq!(d.rings.load(Ordering::SeqCst), 1, "deferred: rung");
        let mut listed = 0;
        while todo.pop().is_some() {
            listed += 1;
        }
        assert_eq!(listed, 2);
        for p in [&a, &b] {
            assert_eq!(p.requeues.load(Ordering::SeqCst), 0);
        }
        // With memory, the list holds them all.
        for p in [&a, &b, &c, &d, &c] {
            todo.push(p.clone());
        }
        let mut listed = 0;
        while todo.pop().is_some() {
            listed += 1;
        }
        assert_eq!(listed, 4);
        assert_eq!(c.requeues.load(Ordering::SeqCst), 1);
    }
}
