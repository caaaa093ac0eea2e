//! The model HCA: a mini-driver that reaches its device only through the
//! PCI seam (BAR registers, common buffers, DMA through the IOMMU model,
//! MSI-X), over the host device.

use std::sync::Arc;

use irpverbs_host::{Backend, HostDevice, HostDeviceConfig};

fn model_device() -> Arc<HostDevice> {
    HostDevice::new(HostDeviceConfig {
        backend: Backend::Model,
        ..HostDeviceConfig::default()
    })
    .expect("a host device over the model HCA")
}

#[test]
fn the_model_device_starts_and_unloads() {
    let dev = model_device();
    let (hca, silicon) = dev.model().expect("the model backend");
    assert!(hca.event_queues() >= 2);
    assert!(silicon.stats().commands >= 1);
    HostDevice::remove(dev);
}
