//! A memory registration pins only memory the caller can reach: the host's
//! pin probes the range as `MmProbeAndLockPages` does (every page mapped
//! and readable, writable when the registration grants local write) and
//! refuses the rest with `STATUS_ACCESS_VIOLATION`, on both backends, before
//! the device touches a page (the model HCA reads each one).

use irpverbs_abi::*;
use irpverbs_host::{Backend, HostDevice, HostDeviceConfig};
use irpverbs_verbs::IntoClient;

mod common;

/// Read-only memory of this program.
static READ_ONLY: [u8; 8192] = [7; 8192];

fn unreachable_ranges_are_refused_and_reachable_ones_pinned(backend: Backend) {
    let dev = HostDevice::new(HostDeviceConfig {
        backend,
        ..HostDeviceConfig::default()
    })
    .expect("host device");
    let client = dev
        .open(FILE_READ_ACCESS | FILE_WRITE_ACCESS)
        .expect("open")
        .into_client();
    let pd = client.alloc_pd().expect("pd").pd;
    let write = IV_ACCESS_LOCAL_WRITE | IV_ACCESS_REMOTE_WRITE;

    // Page 1 is never mapped; nor is a range that runs off a buffer's end
    // into an unmapped page far away.
    assert_eq!(
        client.reg_mr(pd, 0x1000, 4096, 0).err(),
        Some(STATUS_ACCESS_VIOLATION)
    );
    assert_eq!(
        client.reg_mr(pd, 0x7FF0_0000_0000, 1 << 16, 0).err(),
        Some(STATUS_ACCESS_VIOLATION)
    );
    // Read-only memory: readable, not writable.
    let ro = READ_ONLY.as_ptr() as u64;
    let len = READ_ONLY.len() as u64;
    assert_eq!(
        client.reg_mr(pd, ro, len, write).err(),
        Some(STATUS_ACCESS_VIOLATION)
    );
    let mr = client
        .reg_mr(pd, ro, len, 0)
        .expect("read-only, read access");
    client.dereg_mr(mr.mr).expect("dereg");
    // Heap memory, writable.
    let mut buf = vec![0u8; 3 << 16];
    let mr = client
        .reg_mr(pd, buf.as_mut_ptr() as u64, buf.len() as u64, write)
        .expect("heap, write access");
    client.dereg_mr(mr.mr).expect("dereg");
    // The refusals left nothing behind: the PD has no MR.
    client.dealloc_pd(pd).expect("dealloc pd");
    drop(client);
    dev.quiesce(std::time::Duration::from_secs(10))
        .expect("nothing held");
}

on_each_backend!(unreachable_ranges_are_refused_and_reachable_ones_pinned);
