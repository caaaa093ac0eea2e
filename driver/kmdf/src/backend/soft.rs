//! The soft HCA as irpverbs.sys's backend (the `soft` feature, the
//! default): root-enumerated (hardware ID `Root\irpverbs`), made at
//! `EvtDriverDeviceAdd` with a completion vector per active processor.
//!
//! It has no interrupt line: its [`SoftBus`] queues the bus's DPCs
//! ([`Bus`]), and its firmware runs inline (`Execution::Inline`, inside
//! `post_command`), so the doorbell is never rung. What hardware would do
//! by itself are its services, run in D0:
//!
//! - its transport's timer ([`clock`]): ACK timeouts, retries, RNR waits;
//! - the doorbell-page poller's thread ([`doorbell`]): the doorbells
//!   user-mode ULPs ring in their pages;
//! - its RoCEv2 wire over a Winsock Kernel socket ([`wsk`]), when the
//!   registry enables it.

mod clock;
mod doorbell;
mod irp;
mod wsk;
mod wsk_sys;

use irpverbs_abi::STATUS_INSUFFICIENT_RESOURCES;
use irpverbs_ring::Shared;
use irpverbs_soft::{SoftBus, SoftConfig, SoftHca, default_comp_vectors};
use wdk_sys::ntddk::KeQueryActiveProcessorCountEx;
use wdk_sys::{
    ALL_PROCESSOR_GROUPS, NTSTATUS, WDFCMRESLIST, WDFDEVICE, call_unsafe_wdf_function_binding,
};

use super::{Backend, Made, STATUS_DEVICE_CONFIGURATION_ERROR};
use crate::device::Bus;
use crate::platform::KmdfPlatform;
use clock::TransportTimer;
use doorbell::{DoorbellThread, PollerEvent};
use wsk::WskWire;

/// The engine: what the soft HCA's own services call.
pub(crate) type Engine = SoftHca<KmdfPlatform>;

/// The HCA the core's device holds: the engine, shared with its services.
pub(crate) type Hw = Shared<Engine>;

/// The soft HCA's bus on Windows: the device's DPCs and the doorbell
/// poller's event.
struct KmdfSoftBus {
    bus: Shared<Bus>,
    poller: Shared<PollerEvent>,
}

impl SoftBus for KmdfSoftBus {
    /// The "ISR": queues the device's DPC.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    fn interrupt(&self) {
        self.bus.interrupt();
    }

    /// Completion vector `vector`'s "ISR": queues that vector's DPC on its
    /// processor.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    fn comp_interrupt(&self, vector: u32) {
        self.bus.comp_interrupt(vector);
    }

    /// Never rung: the firmware runs inline (`Execution::Inline`).
    fn doorbell(&self) {}

    /// The rest of a bounded data-path call: the device's DPC runs
    /// `SoftHca::resume` first ([`Backend::resume`]).
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    fn resume(&self) {
        self.bus.resume();
    }

    /// `IOCTL_IV_RING_DOORBELLS` ran: sets the doorbell thread's event.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    fn wake_doorbell_poller(&self) {
        self.poller.set();
    }
}

/// The soft HCA's services, running in D0.
pub(crate) struct SoftServices {
    /// The transport's timer (ACK timeouts, RNR waits).
    transport_timer: TransportTimer,
    /// The poller of the user-mode doorbell pages: a system thread.
    scanner: DoorbellThread,
    /// The RoCEv2 wire over a WSK socket, when the registry enables it.
    wire: Option<WskWire>,
}

impl Backend for Hw {
    type Services = SoftServices;
    const SOFTWARE_INTERRUPTS: bool = true;

    unsafe fn add(
        device: WDFDEVICE,
        platform: &KmdfPlatform,
        bus: &Shared<Bus>,
    ) -> Result<Option<Made<Self>>, NTSTATUS> {
        // SAFETY: `device` was just created (caller).
        let wire = unsafe { wsk::read_config(device) }?;
        // A completion vector per active processor (at least 2).
        #[allow(clippy::cast_possible_truncation)]
        // SAFETY: no preconditions; callable at any IRQL.
        let processors = unsafe { KeQueryActiveProcessorCountEx(ALL_PROCESSOR_GROUPS as u16) };
        let mut config = SoftConfig {
            num_comp_vectors: default_comp_vectors(processors),
            ..SoftConfig::default()
        };
        if let Some(w) = &wire {
            w.apply(&mut config);
        }
        let poller = PollerEvent::new()?;
        let soft_bus = KmdfSoftBus {
            bus: Shared::clone(bus),
            poller: Shared::clone(&poller),
        };
        let soft = SoftHca::new(platform, config, soft_bus)?;
        let hca = Shared::try_new(soft).map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        let services = SoftServices {
            transport_timer: TransportTimer::new(hca.clone())?,
            scanner: DoorbellThread::new(hca.clone(), poller),
            wire: wire.map(|w| WskWire::new(w, hca.clone())),
        };
        Ok(Some(Made { hca, services }))
    }

    /// A root-enumerated device has no bus resources: resources mean the
    /// INF bound this build to a PCI function (the model build's device),
    /// which it refuses with `STATUS_DEVICE_CONFIGURATION_ERROR`.
    unsafe fn prepare_hardware(
        _device: WDFDEVICE,
        _raw: WDFCMRESLIST,
        translated: WDFCMRESLIST,
    ) -> Result<Option<Made<Self>>, NTSTATUS> {
        // SAFETY: the framework's list of this EvtDevicePrepareHardware
        // (caller).
        let count =
            unsafe { call_unsafe_wdf_function_binding!(WdfCmResourceListGetCount, translated) };
        if count != 0 {
            return Err(STATUS_DEVICE_CONFIGURATION_ERROR);
        }
        Ok(None)
    }

    fn release_hardware(&self) {}

    fn start(&self, services: &SoftServices) -> Result<(), NTSTATUS> {
        services.scanner.start()?;
        if let Err(status) = services.transport_timer.start() {
            services.scanner.stop();
            return Err(status);
        }
        if let Some(Err(status)) = services.wire.as_ref().map(WskWire::start) {
            wdk::println!("irpverbs: the WSK wire did not start: {status:#010x}");
            services.transport_timer.stop();
            services.scanner.stop();
            return Err(status);
        }
        Ok(())
    }

    fn stop(&self, services: &SoftServices) {
        if let Some(wire) = &services.wire {
            wire.stop();
        }
        services.scanner.stop();
        services.transport_timer.stop();
    }

    fn resume(&self) {
        Engine::resume(self);
    }
}
