//! What still passes between the mini-driver and the device model around
//! the hardware seam, in one place so that it can be seen and shrunk.
//!
//! - **doorbell pages** (UAR pages a user-mode ULP rings): the engine's
//!   pages, which it scans, rather than pages of BAR memory
//!   ([`Sideband::soft`]).
//!
//! Commands, their inputs and outputs, event queue entries, MSI-X
//! messages, page lists, doorbells, the GSI's MADs (send and receive rings
//! in a common buffer, [`crate::gsi`]), the work queues' and CQs' rings
//! (the driver's memory, whose page lists a create carries; the device
//! works on its view of them, [`crate::protocol`]) and registered memory
//! (the device's view through the registration's page list) all go
//! through the seam.

use irpverbs_core::Platform;
use irpverbs_soft::SoftHca;

use alloc::sync::Arc;

/// The part of the interface that goes around the seam (see the module
/// docs). One per device; shared by the mini-driver and the device model.
pub struct Sideband<P: Platform> {
    soft: Arc<SoftHca<P>>,
}

impl<P: Platform> Sideband<P> {
    /// The sideband of the device whose engine is `soft`.
    pub fn new(soft: Arc<SoftHca<P>>) -> Self {
        Self { soft }
    }

    /// The device's engine, for its doorbell pages.
    pub fn soft(&self) -> &SoftHca<P> {
        &self.soft
    }
}
