//! The backends a host device runs the driver over ([`Backend`]): the soft
//! HCA itself, or the model HCA (`irpverbs-model`), whose mini-driver
//! reaches its device only through the host's [`PciPlatform`] — BAR 0, DMA
//! through the IOMMU model, MSI-X — while the device model
//! ([`Silicon`]) runs the soft HCA as its engine.
//!
//! Host wiring of the model: the device model's BAR is installed on the
//! platform ([`HostPlatform::install_bar`]), its DMA goes through
//! [`HostPlatform::dma_read`] / [`HostPlatform::dma_write`], its messages
//! through [`HostPlatform::raise_msix`], and its work runs in a DPC of its
//! own (the engine's interrupts and the registers that ask for work queue
//! it). The driver connects one interrupt per event queue; message 0's DPC
//! runs `Device::dpc`, message `1 + v`'s `Device::comp_dpc(v)`.

use std::sync::{Arc, OnceLock, Weak};

use irpverbs_abi::{IvQueryDeviceOut, NtStatus};
use irpverbs_core::Hca;
use irpverbs_core::hca::{Command, DoorbellPageInfo, DoorbellTarget, Event, MadIn, MadOut};
use irpverbs_core::platform::{InterruptHandler, LogicalAddress};
use irpverbs_model::{DeviceBus, ModelHca, Silicon};
use irpverbs_ring::{Region, Shared};
use irpverbs_soft::SoftHca;

use crate::device::SoftDevice;
use crate::platform::pci::BarModel;
use crate::platform::{Dpc, HostPlatform};

/// Which HCA the host device's driver runs over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Backend {
    /// The soft HCA, called directly.
    #[default]
    Soft,
    /// The model HCA: a mini-driver over the PCI seam, a device model
    /// behind the IOMMU.
    Model,
}

/// The model's mini-driver on the host platform.
pub type HostModelHca = ModelHca<HostPlatform>;
/// The model's device on the host platform.
pub type HostSilicon = Silicon<HostPlatform, SiliconBus>;

/// The HCA of a host device: one of the [`Backend`]s.
pub enum HostHca {
    /// The soft HCA.
    Soft(Arc<SoftHca<HostPlatform>>),
    /// The model HCA's mini-driver.
    Model(Arc<HostModelHca>),
}

macro_rules! each {
    ($self:ident, $h:ident => $e:expr) => {
        match $self {
            HostHca::Soft($h) => $e,
            HostHca::Model($h) => $e,
        }
    };
}

impl Hca for HostHca {
    fn caps(&self) -> &IvQueryDeviceOut {
        each!(self, h => h.caps())
    }
    fn post_command(&self, token: u64, command: Command) -> Result<(), Command> {
        each!(self, h => h.post_command(token, command))
    }
    fn poll_event(&self) -> Option<Event> {
        each!(self, h => h.poll_event())
    }
    fn poll_events(&self, out: &mut [Option<Event>]) -> usize {
        each!(self, h => h.poll_events(out))
    }
    fn arm_event_queue(&self) {
        each!(self, h => h.arm_event_queue());
    }
    fn comp_event_queues(&self) -> u32 {
        each!(self, h => h.comp_event_queues())
    }
    fn poll_comp_events(&self, vector: u32, out: &mut [Option<Event>]) -> usize {
        each!(self, h => h.poll_comp_events(vector, out))
    }
    fn arm_comp_event_queue(&self, vector: u32) {
        each!(self, h => h.arm_comp_event_queue(vector));
    }
    #[inline]
    fn sq_doorbell(&self, qpn: u32) {
        each!(self, h => h.sq_doorbell(qpn));
    }
    #[inline]
    fn rq_doorbell(&self, qpn: u32) {
        each!(self, h => h.rq_doorbell(qpn));
    }
    #[inline]
    fn srq_doorbell(&self, srqn: u32) {
        each!(self, h => h.srq_doorbell(srqn));
    }
    #[inline]
    fn cq_arm_doorbell(&self, cqn: u32) {
        each!(self, h => h.cq_arm_doorbell(cqn));
    }
    fn alloc_doorbell_page(&self) -> Result<DoorbellPageInfo, NtStatus> {
        each!(self, h => h.alloc_doorbell_page())
    }
    fn free_doorbell_page(&self, page: u32) {
        each!(self, h => h.free_doorbell_page(page));
    }
    fn bind_doorbell(&self, page: u32, target: DoorbellTarget) -> Result<u32, NtStatus> {
        each!(self, h => h.bind_doorbell(page, target))
    }
    fn ring_doorbell_pages(&self) -> Result<(), NtStatus> {
        each!(self, h => h.ring_doorbell_pages())
    }
    fn device_removed(&self) {
        each!(self, h => h.device_removed());
    }
    fn send_mad(&self, mad: &MadOut) -> Result<(), NtStatus> {
        each!(self, h => h.send_mad(mad))
    }
    fn poll_mad(&self) -> Option<MadIn> {
        each!(self, h => h.poll_mad())
    }
}

/// The device model's bus on the host: the IOMMU model, MSI-X, and the
/// DPC its work runs in.
pub struct SiliconBus {
    platform: HostPlatform,
    dpc: OnceLock<Dpc>,
}

impl SiliconBus {
    /// A bus on `platform`; its DPC is set once the device exists.
    pub(crate) fn new(platform: HostPlatform) -> Self {
        Self {
            platform,
            dpc: OnceLock::new(),
        }
    }

    pub(crate) fn set_dpc(&self, dpc: Dpc) {
        let _ = self.dpc.set(dpc);
    }
}

impl DeviceBus for SiliconBus {
    fn dma_read(&self, at: LogicalAddress, buf: &mut [u8]) -> Result<(), NtStatus> {
        self.platform.dma_read(at, buf)
    }
    fn dma_write(&self, at: LogicalAddress, buf: &[u8]) -> Result<(), NtStatus> {
        self.platform.dma_write(at, buf)
    }
    fn dma_view(
        &self,
        first_offset: usize,
        len: usize,
        write: bool,
        next_page: &mut dyn FnMut(usize) -> Result<LogicalAddress, NtStatus>,
    ) -> Result<Shared<Region>, NtStatus> {
        self.platform.dma_view(first_offset, len, write, next_page)
    }
    fn raise_msix(&self, message: u16) {
        self.platform.raise_msix(message);
    }
    /// Queues the device's DPC from an interrupt (at DEVICE_LEVEL, so it
    /// runs once this thread drops below DISPATCH_LEVEL, never inside the
    /// register access).
    fn kick(&self) {
        self.platform.interrupt(|| {
            if let Some(d) = self.dpc.get() {
                d.insert();
            }
        });
    }
}

/// BAR 0 of the model, as the platform calls it: the device model's
/// registers.
impl BarModel for HostSilicon {
    fn read(&self, offset: usize, width: usize) -> u64 {
        Silicon::read(self, offset, width)
    }
    fn write(&self, offset: usize, width: usize, value: u64) {
        Silicon::write(self, offset, width, value);
    }
    fn power(&self, d0: bool) {
        Silicon::power(self, d0);
    }
}

/// The driver's MSI-X handler: the mini-driver's ISR, then the device's
/// DPC of the message's event queue.
pub(crate) struct MsixHandler {
    pub(crate) hca: Arc<HostModelHca>,
    pub(crate) device: Arc<OnceLock<Weak<SoftDevice>>>,
}

impl InterruptHandler for MsixHandler {
    fn isr(&self, message: u16) -> bool {
        self.hca.isr(message)
    }
    fn dpc(&self, message: u16) {
        let Some(device) = self.device.get().and_then(Weak::upgrade) else {
            return;
        };
        if message == 0 {
            device.dpc();
        } else {
            device.comp_dpc(u32::from(message) - 1);
        }
    }
}
