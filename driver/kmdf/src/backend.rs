//! The HCA irpverbs.sys drives: the one place the glue names it, and how
//! it is made at device add ([`Backend::add`]).
//!
//! The rest of the glue takes [`Hw`]: the core's device
//! (`Device<KmdfPlatform, Hw>`) and the kernel interface's doorbells (the
//! `Hca` trait's). The soft HCA's own services — its transport timer
//! ([`crate::clock`]), its doorbell-page poller ([`crate::doorbell`]) and
//! its WSK wire ([`crate::wsk`]) — call the engine's own methods; a PCI
//! backend has none of them (docs/hardware-seam.md, "irpverbs.sys and the
//! model backend").

use irpverbs_abi::STATUS_INSUFFICIENT_RESOURCES;
use irpverbs_ring::Shared;
use irpverbs_soft::{SoftConfig, SoftHca, default_comp_vectors};
use wdk_sys::NTSTATUS;

use crate::device::Bus;
use crate::platform::KmdfPlatform;
use irpverbs_soft::sockwire::WireConfig;

/// How the glue makes the HCA the core drives.
pub(crate) trait Backend: irpverbs_core::Hca + Sized {
    /// Makes the HCA at `EvtDriverDeviceAdd`: a completion vector per
    /// active processor (`processors`, at least 2), its interrupts queueing
    /// `bus`'s DPCs, its wire at `wire` when the registry configures one.
    ///
    /// IRQL: PASSIVE_LEVEL.
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES`; the HCA's refusal of its
    /// configuration.
    fn add(
        platform: &KmdfPlatform,
        bus: Shared<Bus>,
        processors: u32,
        wire: Option<&WireConfig>,
    ) -> Result<Self, NTSTATUS>;
}

/// The engine this build drives: the soft HCA.
pub(crate) type Engine = SoftHca<KmdfPlatform>;

/// The HCA the core's device holds: the engine, shared with its services.
pub(crate) type Hw = Shared<Engine>;

impl Backend for Hw {
    fn add(
        platform: &KmdfPlatform,
        bus: Shared<Bus>,
        processors: u32,
        wire: Option<&WireConfig>,
    ) -> Result<Self, NTSTATUS> {
        let mut config = SoftConfig {
            num_comp_vectors: default_comp_vectors(processors),
            ..SoftConfig::default()
        };
        if let Some(w) = wire {
            w.apply(&mut config);
        }
        let soft = SoftHca::new(platform, config, bus)?;
        let soft = Shared::try_new(soft).map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        Ok(soft)
    }
}
