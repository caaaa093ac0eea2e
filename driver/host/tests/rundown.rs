//! Closing a file with many objects: the rundown destroys them children
//! first and scans the file's objects once per level of the object tree
//! (QPs; then the CQ and PD), not once per destroyed object, which made
//! the rundown of n objects O(n^2) (a file of 30,000 QPs and CEPs took
//! seconds of DPC time to close). Verifier on.

use irpverbs_abi::*;
use irpverbs_host::{Backend, HostDevice, HostDeviceConfig};
use irpverbs_soft::SoftConfig;
use irpverbs_verbs::{IntoClient, qp_request};
use std::time::Duration;

mod common;

crate::on_each_backend!(the_rundown_of_many_objects_scans_once_per_level);

fn the_rundown_of_many_objects_scans_once_per_level(backend: Backend) {
    const QPS: u32 = 500;
    let dev = HostDevice::new(HostDeviceConfig {
        backend,
        soft: SoftConfig {
            max_qp: QPS + 8,
            ..SoftConfig::default()
        },
        ..HostDeviceConfig::default()
    })
    .expect("host device");
    let c = dev
        .open(FILE_READ_ACCESS | FILE_WRITE_ACCESS)
        .expect("open")
        .into_client();
    let pd = c.alloc_pd().unwrap().pd;
    let cq = c.create_cq(64).unwrap().cq;
    let req = qp_request(pd, cq, 0, IV_QPT_RC);
    for _ in 0..QPS {
        c.create_qp_with(&req).unwrap();
    }
    let before = dev.device().stats().rundown_scans;
    drop(c);
    dev.quiesce(Duration::from_secs(60)).expect("quiescent");
    let scans = dev.device().stats().rundown_scans - before;
    // QPs; the CQ and PD; the empty file; plus slack for completions that
    // reach zero in flight more than once (separate DPCs).
    assert!(scans <= 8, "{scans} scans to run down {QPS} QPs");
    assert_eq!(dev.platform().pool_stats().live, 0, "pool leaked");
    dev.unload();
}
