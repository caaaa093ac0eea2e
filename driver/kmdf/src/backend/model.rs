//! The model HCA's mini-driver as irpverbs.sys's backend (the `model`
//! feature): [`irpverbs_model::ModelHca`] over the hardware seam on KMDF
//! ([`KmdfPci`]), for a PCI function that speaks the model's protocol
//! (`irpverbs_model::protocol`, docs/hardware-seam.md). On hardware the
//! device is the silicon: no device model is built into the driver.
//!
//! - `EvtDevicePrepareHardware`: the translated resources give the BARs
//!   (the first memory resource is BAR 0, the registers; the second BAR 2,
//!   the doorbell (UAR) pages, mapped into processes uncached by
//!   `IOCTL_IV_MAP_DOORBELLS`: both are 64-bit BARs) and the MSI-X
//!   messages; the DMA enabler is made, the device started
//!   ([`ModelHca::start`]: its command queue, a polled QUERY_DEVICE, its
//!   event queues and MAD rings), and one interrupt connected per event
//!   queue (message `n` for EQ `n`), with the message's descriptors.
//! - Interrupts: the ISR is [`ModelHca::isr`]; the DPC of message 0 runs
//!   `Device::dpc`, that of message `1 + v` `Device::comp_dpc(v)`, through
//!   the device's state (none yet: nothing to deliver, and D0Entry re-arms).
//! - D0Exit ([`ModelHca::suspend`]): the mini-driver stops touching the
//!   device (its interrupts are disabled already): commands wait in the
//!   core's backlog, doorbells are remembered. D0Entry
//!   ([`ModelHca::resume`]) rings what was rung meanwhile and re-arms
//!   every event queue, so what arrived before the interrupts were
//!   enabled raises its message; the glue then posts the backlog. The
//!   device's timers and ports are its own.
//! - D0Exit to D3Final (removal, disable, stop) and
//!   `EvtDeviceReleaseHardware`: [`ModelHca::release`] resets the device
//!   and frees its queues and mappings, in D0Exit while the device still
//!   listens (the release of `EvtDeviceReleaseHardware` then finds
//!   nothing to do).
//!
//! The services a software HCA runs (a transport timer, a doorbell
//! poller, a wire) are the device's own work here.

use irpverbs_core::Hca;
use irpverbs_core::platform::{InterruptHandler, PciPlatform};
use irpverbs_model::ModelHca;
use irpverbs_model::uar::UAR_BAR;
use irpverbs_ring::Shared;
use wdk_sys::{NTSTATUS, WDFCMRESLIST, WDFDEVICE};

use super::{Backend, Made, STATUS_DEVICE_CONFIGURATION_ERROR};
use crate::device::{Bus, state};
use crate::pci::{KmdfInterrupt, KmdfPci, PciResources};
use crate::platform::KmdfPlatform;
use irpverbs_abi::STATUS_INSUFFICIENT_RESOURCES;

/// The HCA the core's device holds: the mini-driver over the seam.
pub(crate) type Hw = Shared<ModelHca<KmdfPci>>;

/// The BAR number of each memory resource, in the list's order.
const BAR_NUMBERS: [u8; 2] = [0, UAR_BAR];

/// One MSI-X message's handler: the mini-driver's ISR, and the DPC of the
/// event queue it signals, reached through the device's state.
struct Message {
    hca: Hw,
    device: WDFDEVICE,
}

// SAFETY: a WDFDEVICE is a framework handle, usable from any thread; the
// interrupt (a child of the device) is deleted before the device.
unsafe impl Send for Message {}
// SAFETY: as above; shared access only reads the handle.
unsafe impl Sync for Message {}

impl InterruptHandler for Message {
    /// IRQL: DIRQL.
    fn isr(&self, message: u16) -> bool {
        self.hca.isr(message)
    }

    /// IRQL: DISPATCH_LEVEL.
    fn dpc(&self, message: u16) {
        // SAFETY: the interrupt is a child of `device`, which is alive
        // while its children's callbacks run.
        let Some(state) = (unsafe { state(self.device) }) else {
            return;
        };
        match message {
            0 => state.device.dpc(),
            m => state.device.comp_dpc(u32::from(m) - 1),
        }
    }
}

/// The connected messages, kept until the device object goes (KMDF
/// deletes the interrupt objects with it; dropping these disconnects the
/// handlers first).
pub(crate) struct ModelServices {
    _interrupts: alloc::vec::Vec<KmdfInterrupt>,
}

impl Backend for Hw {
    type Services = ModelServices;
    const SOFTWARE_INTERRUPTS: bool = false;

    unsafe fn add(
        _device: WDFDEVICE,
        _platform: &KmdfPlatform,
        _bus: &Shared<Bus>,
    ) -> Result<Option<Made<Self>>, NTSTATUS> {
        Ok(None)
    }

    unsafe fn prepare_hardware(
        device: WDFDEVICE,
        raw: WDFCMRESLIST,
        translated: WDFCMRESLIST,
    ) -> Result<Option<Made<Self>>, NTSTATUS> {
        let resources = PciResources {
            // BAR 2's pages are mapped into processes, uncached.
            pages: 1 << UAR_BAR,
            // SAFETY: the framework's list of this EvtDevicePrepareHardware
            // (caller).
            ..unsafe { PciResources::from_lists(translated, &BAR_NUMBERS) }?
        };
        if resources.bars[0].1 == 0 {
            return Err(STATUS_DEVICE_CONFIGURATION_ERROR);
        }
        // SAFETY: our live device, whose resources these are (caller).
        let pci = unsafe { KmdfPci::new(device, resources) }?;
        let start = || -> Result<Made<Self>, NTSTATUS> {
            let hca = ModelHca::start(pci.clone())?;
            let hca = Shared::try_new(hca).map_err(|hca| {
                hca.release();
                STATUS_INSUFFICIENT_RESOURCES
            })?;
            let mut interrupts = alloc::vec::Vec::new();
            let connected = interrupts
                .try_reserve_exact(usize::from(hca.event_queues()))
                .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)
                .and_then(|()| {
                    for message in 0..hca.event_queues() {
                        let handler = Message {
                            hca: hca.clone(),
                            device,
                        };
                        interrupts.push(pci.connect_interrupt(message, handler)?);
                    }
                    Ok(())
                });
            if let Err(status) = connected {
                drop(interrupts);
                hca.release();
                return Err(status);
            }
            Ok(Made {
                hca,
                services: ModelServices {
                    _interrupts: interrupts,
                },
            })
        };
        // SAFETY: the lists of this EvtDevicePrepareHardware, of `pci`'s
        // device (caller).
        unsafe { pci.prepare_hardware(raw, translated, start) }.map(Some)
    }

    fn release_hardware(&self) {
        self.release();
    }

    /// D0Entry: what was rung out of D0 is rung ([`ModelHca::resume`]),
    /// then every event queue is re-armed (the glue posts the core's
    /// backlog next).
    fn start(&self, _services: &ModelServices) -> Result<(), NTSTATUS> {
        self.resume();
        self.arm_event_queue();
        for v in 0..self.comp_event_queues() {
            self.arm_comp_event_queue(v);
        }
        Ok(())
    }

    /// D0Exit: the mini-driver stops touching the device
    /// ([`ModelHca::suspend`]); commands wait in the core's backlog,
    /// doorbells are remembered, until D0Entry.
    fn stop(&self, _services: &ModelServices) {
        self.suspend();
    }

    /// Never asked for: the model's data path is the device's.
    fn resume(&self) {}
}
