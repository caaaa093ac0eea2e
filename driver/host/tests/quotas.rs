//! Per-file quotas (`irpverbs_core::FileQuota`), with two files of one
//! device, verifier on: a file that reaches its quota of a kind gets
//! `STATUS_QUOTA_EXCEEDED` and nothing changes, while the other file still
//! creates; destroying an object gives its share back; a file's cleanup
//! gives everything back; ring and pinned memory are counted in bytes.

use std::sync::Arc;
use std::time::Duration;

use irpverbs_abi::*;
use irpverbs_core::{DeviceConfig, FileQuota};
use irpverbs_host::{Backend, HostDevice, HostDeviceConfig};
use irpverbs_soft::SoftConfig;
use irpverbs_verbs::{Client, IntoClient, av};
use zerocopy::{FromBytes, IntoBytes};

mod common;

crate::on_each_backend!(
    each_kind_is_held_to_its_per_file_quota,
    cleanup_gives_the_quota_back,
    ring_memory_is_held_to_its_quota,
    pinned_memory_is_held_to_its_quota,
);

fn device(backend: Backend, quota: FileQuota, soft: SoftConfig) -> Arc<HostDevice> {
    HostDevice::new(HostDeviceConfig {
        backend,
        soft,
        device: DeviceConfig { quota },
        ..HostDeviceConfig::default()
    })
    .expect("host device")
}

fn client(d: &Arc<HostDevice>) -> Client {
    d.open(FILE_READ_ACCESS | FILE_WRITE_ACCESS)
        .expect("open")
        .into_client()
}

fn finish(d: &Arc<HostDevice>) {
    d.quiesce(Duration::from_secs(10)).expect("quiescent");
    assert_eq!(d.platform().pool_stats().live, 0, "pool leaked");
    d.unload();
}

/// `want` from a create, with the device's objects unchanged by it.
fn refused<T: std::fmt::Debug>(
    d: &Arc<HostDevice>,
    what: &str,
    create: impl FnOnce() -> Result<T, NtStatus>,
    want: NtStatus,
) {
    let before = d.device().snapshot();
    let objects = d.soft().live_objects();
    match create() {
        Err(st) => assert_eq!(st, want, "{what}: {}", status_name(st)),
        Ok(v) => panic!("{what}: created {v:?}, want {}", status_name(want)),
    }
    assert_eq!(d.device().snapshot(), before, "{what} changed the driver");
    assert_eq!(d.soft().live_objects(), objects, "{what} changed the HCA");
}

fn create_channel(c: &Client) -> Result<IvHandle, NtStatus> {
    let (st, out) = c.raw(
        IOCTL_IV_CREATE_CHANNEL,
        IvAllocPdIn::default().as_bytes(),
        size_of::<IvCreateChannelOut>(),
    );
    if st != STATUS_SUCCESS {
        return Err(st);
    }
    Ok(IvCreateChannelOut::read_from_bytes(&out).unwrap().channel)
}

fn create_cep(c: &Client) -> Result<IvHandle, NtStatus> {
    let (st, out) = c.raw(
        IOCTL_IV_CREATE_CEP,
        IvCreateCepIn { user_context: 1 }.as_bytes(),
        size_of::<IvCreateCepOut>(),
    );
    if st != STATUS_SUCCESS {
        return Err(st);
    }
    Ok(IvCreateCepOut::read_from_bytes(&out).unwrap().cep)
}

/// The objects of each kind a test file makes: a create of the kind on
/// `c` (PDs, CQs, the buffer and GID its dependents use come from `pd`).
struct Maker<'a> {
    c: &'a Client,
    pd: IvHandle,
    cq: IvHandle,
    buf: &'a [u8],
    gid: [u8; 16],
}

impl Maker<'_> {
    /// One object of `kind` (a `Kind` name), and how to destroy it.
    fn make(&self, kind: &str) -> Result<Box<dyn FnOnce() + '_>, NtStatus> {
        let c = self.c;
        Ok(match kind {
            "pd" => {
                let h = c.alloc_pd()?.pd;
                Box::new(move || c.dealloc_pd(h).unwrap())
            }
            "mr" => {
                let h = c.reg_mr(self.pd, self.buf.as_ptr() as u64, 4096, 0)?.mr;
                Box::new(move || c.dereg_mr(h).unwrap())
            }
            "cq" => {
                let h = c.create_cq(4)?.cq;
                Box::new(move || c.destroy_cq(h).unwrap())
            }
            "qp" => {
                let h = c.create_qp(self.pd, self.cq, IV_QPT_RC)?.qp;
                Box::new(move || c.destroy_qp(h).unwrap())
            }
            "srq" => {
                let h = c.create_srq(self.pd, 4, 0)?.srq;
                Box::new(move || c.destroy_srq(h).unwrap())
            }
            "ah" => {
                let h = c.create_ah(self.pd, &av(self.gid))?.ah;
                Box::new(move || c.destroy_ah(h).unwrap())
            }
            "channel" => {
                let h = create_channel(c)?;
                Box::new(move || {
                    let (st, _) = c.raw(
                        IOCTL_IV_DESTROY_CHANNEL,
                        IvHandleIn { handle: h }.as_bytes(),
                        0,
                    );
                    assert_eq!(st, STATUS_SUCCESS);
                })
            }
            _ => {
                let h = create_cep(c)?;
                Box::new(move || {
                    let (st, _) =
                        c.raw(IOCTL_IV_DESTROY_CEP, IvHandleIn { handle: h }.as_bytes(), 0);
                    assert_eq!(st, STATUS_SUCCESS);
                })
            }
        })
    }
}

const KINDS: [&str; 8] = ["pd", "mr", "cq", "qp", "srq", "ah", "channel", "cep"];

/// Each kind: file A creates up to its quota (the maker's own PD and CQ
/// count), the next create is `STATUS_QUOTA_EXCEEDED` and changes nothing,
/// file B still creates one, and A creates again once it destroyed one.
fn each_kind_is_held_to_its_per_file_quota(backend: Backend) {
    let quota = FileQuota {
        max_pd: 3,
        max_mr: 3,
        max_cq: 3,
        max_qp: 3,
        max_srq: 3,
        max_ah: 3,
        max_channel: 3,
        max_cep: 3,
        ..FileQuota::default()
    };
    let d = device(backend, quota, SoftConfig::default());
    let (a, b) = (client(&d), client(&d));
    let buf = vec![0u8; 4096];
    let gid = a.query_gid(1, 0).unwrap();
    let maker = |c| {
        let pd = Client::alloc_pd(c).unwrap().pd;
        let cq = Client::create_cq(c, 8).unwrap().cq;
        Maker {
            c,
            pd,
            cq,
            buf: &buf,
            gid,
        }
    };
    let (ma, mb) = (maker(&a), maker(&b));
    for kind in KINDS {
        // The maker's PD and CQ are one of each already.
        let have = usize::from(matches!(kind, "pd" | "cq"));
        let mut made: Vec<_> = (have..3)
            .map(|i| {
                ma.make(kind)
                    .unwrap_or_else(|st| panic!("{kind} {i}: {st:#x}"))
            })
            .collect();
        refused(
            &d,
            kind,
            || ma.make(kind).map(|_| ()),
            STATUS_QUOTA_EXCEEDED,
        );
        // The other file is not starved.
        let theirs = mb.make(kind).expect("the other file creates");
        // A destroy gives the share back.
        made.pop().expect("one made")();
        made.push(ma.make(kind).expect("created again after a destroy"));
        refused(
            &d,
            kind,
            || ma.make(kind).map(|_| ()),
            STATUS_QUOTA_EXCEEDED,
        );
        for destroy in made {
            destroy();
        }
        theirs();
    }
    drop((a, b));
    drop(buf);
    finish(&d);
}

/// A file's cleanup gives its quota back: with the device's own limit
/// just above one file's quota, the other file gets what is left, and
/// after the first file closes, a new file gets a whole quota again.
fn cleanup_gives_the_quota_back(backend: Backend) {
    let quota = FileQuota {
        max_pd: 4,
        ..FileQuota::default()
    };
    let d = device(
        backend,
        quota,
        SoftConfig {
            max_pd: 5,
            ..SoftConfig::default()
        },
    );
    let a = client(&d);
    let b = client(&d);
    for _ in 0..4 {
        a.alloc_pd().unwrap();
    }
    refused(&d, "a's fifth PD", || a.alloc_pd(), STATUS_QUOTA_EXCEEDED);
    b.alloc_pd().expect("the device's last PD");
    refused(
        &d,
        "b beyond the device",
        || b.alloc_pd(),
        STATUS_INSUFFICIENT_RESOURCES,
    );
    drop(a);
    let c = client(&d);
    for i in 0..4 {
        c.alloc_pd()
            .unwrap_or_else(|st| panic!("PD {i} after a's cleanup: {st:#x}"));
    }
    refused(
        &d,
        "the device is full again",
        || c.alloc_pd(),
        STATUS_INSUFFICIENT_RESOURCES,
    );
    drop((b, c));
    finish(&d);
}

/// Ring memory: a QP of the largest size costs 32 MiB of rings; with a
/// quota of 32.25 MiB a file holds one, not two, nor a CQ (2 MiB) or SRQ
/// (512 KiB) that would pass the quota, nor a resize that would; the other
/// file still creates one; destroying it gives the bytes back.
fn ring_memory_is_held_to_its_quota(backend: Backend) {
    let quota = FileQuota {
        max_ring_bytes: (32 << 20) + (256 << 10),
        ..FileQuota::default()
    };
    let d = device(backend, quota, SoftConfig::default());
    let (a, b) = (client(&d), client(&d));
    let dev = a.query_device().unwrap();
    let big = |c: &Client| {
        let pd = c.alloc_pd().unwrap().pd;
        let cq = c.create_cq(16).unwrap().cq;
        let mut i = irpverbs_verbs::qp_request(pd, cq, 0, IV_QPT_RC);
        i.cap.max_send_wr = dev.max_qp_wr;
        i.cap.max_recv_wr = dev.max_qp_wr;
        i.cap.max_send_sge = dev.max_sge;
        i.cap.max_recv_sge = dev.max_sge;
        i.cap.max_inline_data = 0;
        (pd, cq, i)
    };
    let (pd, cq, req) = big(&a);
    let qp = a.create_qp_with(&req).expect("one large QP").qp;
    refused(
        &d,
        "a second",
        || a.create_qp_with(&req),
        STATUS_QUOTA_EXCEEDED,
    );
    refused(
        &d,
        "a large CQ",
        || a.create_cq(dev.max_cqe),
        STATUS_QUOTA_EXCEEDED,
    );
    refused(
        &d,
        "a large SRQ",
        || a.create_srq(pd, dev.max_srq_wr, 0),
        STATUS_QUOTA_EXCEEDED,
    );
    refused(
        &d,
        "a CQ resized past it",
        || a.resize_cq(cq, dev.max_cqe),
        STATUS_QUOTA_EXCEEDED,
    );
    // A resize within it works, and shrinking back too.
    a.resize_cq(cq, 1024).expect("a resize within the quota");
    a.resize_cq(cq, 16).expect("shrinking");
    let (bpd, bcq, breq) = big(&b);
    let bqp = b
        .create_qp_with(&breq)
        .expect("the other file's large QP")
        .qp;
    a.destroy_qp(qp).unwrap();
    let qp = a.create_qp_with(&req).expect("again after the destroy").qp;
    for (c, qp, cq, pd) in [(&a, qp, cq, pd), (&b, bqp, bcq, bpd)] {
        c.destroy_qp(qp).unwrap();
        c.destroy_cq(cq).unwrap();
        c.dealloc_pd(pd).unwrap();
    }
    drop((a, b));
    finish(&d);
}

/// Pinned memory: the pages `REG_MR` regions span, per file.
fn pinned_memory_is_held_to_its_quota(backend: Backend) {
    let quota = FileQuota {
        max_pinned_bytes: 64 << 10,
        ..FileQuota::default()
    };
    let d = device(backend, quota, SoftConfig::default());
    let (a, b) = (client(&d), client(&d));
    let buf = vec![0u8; 256 << 10];
    // Page-aligned, so that 64 KiB spans 16 pages.
    let base = (buf.as_ptr() as u64).next_multiple_of(4096);
    let (pa, pb) = (a.alloc_pd().unwrap().pd, b.alloc_pd().unwrap().pd);
    let mr = a.reg_mr(pa, base, 64 << 10, 0).expect("64 KiB").mr;
    refused(
        &d,
        "one byte more",
        || a.reg_mr(pa, base, 1, 0),
        STATUS_QUOTA_EXCEEDED,
    );
    let theirs = b.reg_mr(pb, base, 64 << 10, 0).expect("the other file").mr;
    a.dereg_mr(mr).unwrap();
    // Unaligned: 2 bytes across a page boundary are two pages.
    let two = a.reg_mr(pa, base + 4095, 2, 0).unwrap().mr;
    refused(
        &d,
        "past the quota by a page",
        || a.reg_mr(pa, base, 60 << 10, 0),
        STATUS_QUOTA_EXCEEDED,
    );
    a.reg_mr(pa, base, 56 << 10, 0).expect("what is left");
    a.dereg_mr(two).unwrap();
    b.dereg_mr(theirs).unwrap();
    drop((a, b));
    drop(buf);
    finish(&d);
}
