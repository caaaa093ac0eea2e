//! The HCA irpverbs.sys drives, chosen when the driver is built: the one
//! place the glue names a backend.
//!
//! A backend is a module of this one that implements [`Backend`] and is
//! selected by a cargo feature of the same name (`soft`, the default, or
//! `model`; exactly one). The rest of the glue takes [`Hw`], the HCA the
//! core's device holds (`Device<KmdfPlatform, Hw>`), and knows it only
//! through `irpverbs_core::Hca` and this trait. Adding a backend is a file
//! here (`backend/NAME.rs`), a `cfg` line below and a feature in
//! `Cargo.toml`.
//!
//! Two kinds, as Windows sees them:
//!
//! - a **software HCA** (`soft`): root-enumerated, no bus resources. It is
//!   made at `EvtDriverDeviceAdd` ([`Backend::add`]); its interrupts are
//!   the bus's DPCs ([`Bus`], [`Backend::SOFTWARE_INTERRUPTS`]), and what
//!   hardware would do on its own (the transport's timer, watching the
//!   doorbell pages, the wire) are its services, run in D0.
//! - a **PCI HCA** (`model`): started at `EvtDevicePrepareHardware` from
//!   its translated resources ([`Backend::prepare_hardware`]), stopped at
//!   `EvtDeviceReleaseHardware`; its interrupts are its MSI-X messages,
//!   its services none but what D0Entry asks of the device (re-arming its
//!   event queues).

use irpverbs_ring::Shared;
use wdk_sys::{NTSTATUS, WDFCMRESLIST, WDFDEVICE};

use crate::device::Bus;
use crate::platform::KmdfPlatform;

#[cfg(all(feature = "soft", feature = "model"))]
compile_error!("irpverbs.sys drives one backend: enable either `soft` or `model`");
#[cfg(not(any(feature = "soft", feature = "model")))]
compile_error!("irpverbs.sys needs a backend: enable the `soft` or the `model` feature");

#[cfg(feature = "model")]
mod model;
#[cfg(feature = "model")]
pub(crate) use model::Hw;
#[cfg(all(feature = "soft", not(feature = "model")))]
mod soft;
#[cfg(all(feature = "soft", not(feature = "model")))]
pub(crate) use soft::Hw;

/// ntstatus.h's `STATUS_DEVICE_CONFIGURATION_ERROR`: the device's
/// resources are not the backend's (a PCI HCA without its register BAR, a
/// software HCA given bus resources: the other build's device).
#[allow(clippy::cast_possible_wrap)]
pub(crate) const STATUS_DEVICE_CONFIGURATION_ERROR: NTSTATUS = 0xC000_0182_u32 as NTSTATUS;

/// The HCA a backend made, and its services.
pub(crate) struct Made<H: Backend> {
    /// The HCA the core's device drives (and the kernel ULPs' doorbells
    /// ring).
    pub(crate) hca: H,
    /// What the backend runs in D0 besides the core ([`Backend::start`]).
    pub(crate) services: H::Services,
}

/// How the glue makes, starts and stops the HCA the core drives.
///
/// Every method runs at PASSIVE_LEVEL but [`Backend::resume`].
pub(crate) trait Backend:
    irpverbs_core::Hca + Clone + Send + Sync + Sized + 'static
{
    /// The backend's own work while the device is in D0 (a software HCA's
    /// timers, threads and sockets; a PCI HCA's device does that work
    /// itself). Dropped with the device state, after the core's device.
    type Services: Send + Sync;

    /// Whether the HCA's interrupts are the bus's DPCs (a software HCA
    /// queues them itself: [`Bus::interrupt`], [`Bus::comp_interrupt`],
    /// [`Bus::resume`]). A PCI HCA's are its MSI-X messages, connected in
    /// [`Backend::prepare_hardware`], and the glue makes no bus DPC.
    const SOFTWARE_INTERRUPTS: bool;

    /// `EvtDriverDeviceAdd`: a software HCA is made here, its interrupts
    /// queueing `bus`'s DPCs; a PCI HCA returns `None` (it is made when
    /// its resources are known).
    ///
    /// IRQL: PASSIVE_LEVEL.
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES`; the registry's or the HCA's
    /// refusal of its configuration. The device add fails.
    ///
    /// # Safety
    /// `device` must be the live device just created.
    unsafe fn add(
        device: WDFDEVICE,
        platform: &KmdfPlatform,
        bus: &Shared<Bus>,
    ) -> Result<Option<Made<Self>>, NTSTATUS>;

    /// `EvtDevicePrepareHardware` of a device that has no HCA yet: a PCI
    /// HCA maps its BARs, starts its device and connects its MSI-X
    /// messages (their DPCs reach the core's device through `device`'s
    /// state, once it is made); a software HCA (made at device add)
    /// returns `None`.
    ///
    /// IRQL: PASSIVE_LEVEL.
    ///
    /// # Errors
    /// The device's refusal (`STATUS_NOT_SUPPORTED` for a device that is
    /// not one the backend drives, `STATUS_IO_TIMEOUT`, ...), missing
    /// resources (`STATUS_DEVICE_CONFIGURATION_ERROR`),
    /// `STATUS_INSUFFICIENT_RESOURCES`: the device does not start.
    ///
    /// # Safety
    /// `device` must be our live device; `raw` and `translated` its
    /// resource lists, valid for this call.
    unsafe fn prepare_hardware(
        device: WDFDEVICE,
        raw: WDFCMRESLIST,
        translated: WDFCMRESLIST,
    ) -> Result<Option<Made<Self>>, NTSTATUS>;

    /// `EvtDeviceReleaseHardware` (after D0Exit): a PCI HCA resets its
    /// device, takes its queues back and drops every DMA mapping; the
    /// core's device was removed already. A software HCA: nothing.
    ///
    /// IRQL: PASSIVE_LEVEL.
    fn release_hardware(&self);

    /// `EvtDeviceD0Entry`: starts the services; what the HCA's event
    /// queues hold is delivered afterwards (a software HCA's bus DPCs are
    /// queued by the glue; a PCI HCA re-arms its queues here).
    ///
    /// IRQL: PASSIVE_LEVEL.
    ///
    /// # Errors
    /// A service that cannot start (a thread, a timer, a socket): what
    /// was started is stopped again, and the device does not enter D0.
    fn start(&self, services: &Self::Services) -> Result<(), NTSTATUS>;

    /// `EvtDeviceD0Exit`: stops the services, waiting for a callback or
    /// a thread in progress. Stopped already: nothing.
    ///
    /// IRQL: PASSIVE_LEVEL.
    fn stop(&self, services: &Self::Services);

    /// The rest of a bounded data-path call, which the HCA asked for with
    /// [`Bus::resume`]; run by the device's DPC before it drains the event
    /// queue.
    ///
    /// IRQL: DISPATCH_LEVEL.
    fn resume(&self);
}
