//! What still passes between the mini-driver and the device model around
//! the hardware seam, in one place so that it can be seen and shrunk.
//!
//! The device model executes commands and moves data with the soft HCA's
//! firmware and transport, which reach queues and registered memory
//! through [`Region`]s (virtual addresses), not through DMA. So:
//!
//! - **rings**: the WQE, CQE and SRQ rings a create returns are the soft
//!   firmware's memory; the device hands them to the driver here, by the
//!   command slot whose completion reports the object
//!   ([`Sideband::put_rings`], [`Sideband::take_rings`]), while the
//!   object's numbers and sizes come back by DMA in the output mailbox;
//! - **registered memory**: the device reads a registration's page table
//!   by DMA and touches every page of it once through the IOMMU (a bad
//!   page list faults there), but the transport then moves the MR's data
//!   through the pinned region the driver leaves here
//!   ([`Sideband::put_region`], [`Sideband::take_region`]);
//! - **doorbell pages** (UAR pages a user-mode ULP rings): the engine's
//!   pages, which it scans, rather than pages of BAR memory
//!   ([`Sideband::soft`]).
//!
//! Commands, their inputs and outputs, event queue entries, MSI-X
//! messages, page tables, doorbells and the GSI's MADs (send and receive
//! rings in a common buffer, [`crate::gsi`]) all go through the seam.

use irpverbs_abi::{NtStatus, STATUS_INSUFFICIENT_RESOURCES};
use irpverbs_core::Platform;
use irpverbs_core::platform::{LockClass, SpinLock};
use irpverbs_ring::{Region, Ring, Shared};
use irpverbs_soft::SoftHca;

use alloc::sync::Arc;
use alloc::vec::Vec;

/// The sideband's per-slot lock: taken under the mini-driver's command
/// lock, and by the device with no lock held; a leaf.
pub static SIDEBAND_LOCK: LockClass = LockClass {
    name: "irpverbs.model.sideband",
    rank: 25,
};

/// What one command slot carries around the seam.
#[derive(Default)]
struct Side {
    region: Option<Shared<Region>>,
    rings: [Option<Ring>; 2],
}

/// The part of the interface that goes around the seam (see the module
/// docs). One per device; shared by the mini-driver and the device model.
pub struct Sideband<P: Platform> {
    slots: Vec<P::Lock<Side>>,
    soft: Arc<SoftHca<P>>,
}

impl<P: Platform> Sideband<P> {
    /// A sideband of `slots` command slots over the device's engine.
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES`.
    pub fn new(platform: &P, slots: usize, soft: Arc<SoftHca<P>>) -> Result<Self, NtStatus> {
        let mut v = Vec::new();
        v.try_reserve_exact(slots)
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        for _ in 0..slots {
            v.push(platform.new_lock(&SIDEBAND_LOCK, Side::default()));
        }
        Ok(Self { slots: v, soft })
    }

    /// The driver leaves the pinned memory of the registration in `slot`.
    pub fn put_region(&self, slot: usize, region: Shared<Region>) {
        if let Some(s) = self.slots.get(slot) {
            s.lock(|s| s.region = Some(region));
        }
    }

    /// The device takes the memory of the registration in `slot`.
    pub fn take_region(&self, slot: usize) -> Option<Shared<Region>> {
        self.slots.get(slot)?.lock(|s| s.region.take())
    }

    /// The device leaves the rings of the object the command in `slot`
    /// created.
    pub fn put_rings(&self, slot: usize, rings: [Option<Ring>; 2]) {
        if let Some(s) = self.slots.get(slot) {
            s.lock(|s| s.rings = rings);
        }
    }

    /// The driver takes them.
    pub fn take_rings(&self, slot: usize) -> [Option<Ring>; 2] {
        self.slots.get(slot).map_or([None, None], |s| {
            s.lock(|s| [s.rings[0].take(), s.rings[1].take()])
        })
    }

    /// Drops whatever a slot holds (a reset: the pins end).
    pub fn clear(&self) {
        for s in &self.slots {
            let _ = s.lock(|s| (s.region.take(), s.rings[0].take(), s.rings[1].take()));
        }
    }

    /// The device's engine, for its doorbell pages.
    pub fn soft(&self) -> &SoftHca<P> {
        &self.soft
    }
}
