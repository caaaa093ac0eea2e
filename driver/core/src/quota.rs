//! Per-file quotas: how many objects of each kind, and how many bytes of
//! ring memory and of pinned (registered) memory, one file (one open of the
//! device, usually one process) may hold, so that one process cannot take
//! every PD, CQ, QP or CEP of the device, or pin its memory away, and
//! starve the others.
//!
//! A create beyond the file's quota fails with `STATUS_QUOTA_EXCEEDED` and
//! changes nothing; the device's own limits (`IOCTL_IV_QUERY_DEVICE`) still
//! apply on top (`STATUS_INSUFFICIENT_RESOURCES`). Destroying an object
//! gives its share back, and the file's cleanup (process exit) gives all of
//! it back as the rundown destroys the objects.
//!
//! Ring memory is counted as the ABI's ring layout (`irpverbs_ring`) needs
//! it for the depths asked: whole pages for each ring's control block and
//! slots (what the soft HCA allocates). Pinned memory is the pages an
//! `IOCTL_IV_REG_MR` region spans. A resize (`RESIZE_CQ`, `MODIFY_SRQ`
//! with `IV_SRQ_MAX_WR`) is checked as if the old ring were already gone,
//! and holds both until it completes.
//!
//! The limits are the device's configuration ([`FileQuota`]), given to
//! [`crate::Device::with_config`]; on Windows they come from the driver's
//! registry parameters (`inf/irpverbs.inx` gives the defaults).

use irpverbs_abi::*;
use irpverbs_ring::Ring;
use irpverbs_ring::wq::{recv_stride, send_stride};

use crate::object::Kind;

/// Per-file limits. [`Default`] is generous: enough for any one
/// application's needs, well below what the soft HCA's device limits allow
/// all files together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileQuota {
    /// Protection domains. Registry: `FileMaxPds`. Default 1024.
    pub max_pd: u32,
    /// Memory regions. Registry: `FileMaxMrs`. Default 16384.
    pub max_mr: u32,
    /// Completion queues. Registry: `FileMaxCqs`. Default 4096.
    pub max_cq: u32,
    /// Queue pairs. Registry: `FileMaxQps`. Default 8192.
    pub max_qp: u32,
    /// Shared receive queues. Registry: `FileMaxSrqs`. Default 1024.
    pub max_srq: u32,
    /// Address handles. Registry: `FileMaxAhs`. Default 16384.
    pub max_ah: u32,
    /// Completion channels. Registry: `FileMaxChannels`. Default 1024.
    pub max_channel: u32,
    /// Connection endpoints (CEPs), counting those a listener's requests
    /// create. Registry: `FileMaxCeps`. Default 8192.
    pub max_cep: u32,
    /// Bytes of ring memory (QP, CQ and SRQ rings). Registry:
    /// `FileMaxRingMiB` (in MiB). Default 1 GiB (32 QPs of the largest
    /// size, 32 MiB of rings each).
    pub max_ring_bytes: u64,
    /// Bytes of memory pinned by `IOCTL_IV_REG_MR`. Registry:
    /// `FileMaxPinnedMiB` (in MiB). Default 16 GiB.
    pub max_pinned_bytes: u64,
}

impl Default for FileQuota {
    fn default() -> Self {
        Self {
            max_pd: 1024,
            max_mr: 16384,
            max_cq: 4096,
            max_qp: 8192,
            max_srq: 1024,
            max_ah: 16384,
            max_channel: 1024,
            max_cep: 8192,
            max_ring_bytes: 1 << 30,
            max_pinned_bytes: 16 << 30,
        }
    }
}

impl FileQuota {
    /// No limits (`u32::MAX` objects and `u64::MAX` bytes of each kind):
    /// only the device's own limits apply.
    pub const UNLIMITED: Self = Self {
        max_pd: u32::MAX,
        max_mr: u32::MAX,
        max_cq: u32::MAX,
        max_qp: u32::MAX,
        max_srq: u32::MAX,
        max_ah: u32::MAX,
        max_channel: u32::MAX,
        max_cep: u32::MAX,
        max_ring_bytes: u64::MAX,
        max_pinned_bytes: u64::MAX,
    };

    /// The registry values (`REG_DWORD`s under the driver's `Parameters`
    /// key) that set the limits, in field order: object counts, then ring
    /// and pinned memory in MiB.
    pub const REGISTRY_NAMES: [&'static str; 10] = [
        "FileMaxPds",
        "FileMaxMrs",
        "FileMaxCqs",
        "FileMaxQps",
        "FileMaxSrqs",
        "FileMaxAhs",
        "FileMaxChannels",
        "FileMaxCeps",
        "FileMaxRingMiB",
        "FileMaxPinnedMiB",
    ];

    /// The limit a registry value of [`FileQuota::REGISTRY_NAMES`] names,
    /// as that value states it (memory in MiB, rounded down).
    #[must_use]
    pub fn registry_value(&self, name: &str) -> Option<u32> {
        let mib = |bytes: u64| u32::try_from(bytes >> 20).unwrap_or(u32::MAX);
        Some(match name {
            "FileMaxPds" => self.max_pd,
            "FileMaxMrs" => self.max_mr,
            "FileMaxCqs" => self.max_cq,
            "FileMaxQps" => self.max_qp,
            "FileMaxSrqs" => self.max_srq,
            "FileMaxAhs" => self.max_ah,
            "FileMaxChannels" => self.max_channel,
            "FileMaxCeps" => self.max_cep,
            "FileMaxRingMiB" => mib(self.max_ring_bytes),
            "FileMaxPinnedMiB" => mib(self.max_pinned_bytes),
            _ => return None,
        })
    }

    /// Sets the limit a registry value names (memory in MiB); `false` for a
    /// name that is not one of [`FileQuota::REGISTRY_NAMES`].
    pub fn set_registry_value(&mut self, name: &str, value: u32) -> bool {
        let bytes = u64::from(value) << 20;
        let slot = match name {
            "FileMaxPds" => &mut self.max_pd,
            "FileMaxMrs" => &mut self.max_mr,
            "FileMaxCqs" => &mut self.max_cq,
            "FileMaxQps" => &mut self.max_qp,
            "FileMaxSrqs" => &mut self.max_srq,
            "FileMaxAhs" => &mut self.max_ah,
            "FileMaxChannels" => &mut self.max_channel,
            "FileMaxCeps" => &mut self.max_cep,
            "FileMaxRingMiB" => {
                self.max_ring_bytes = bytes;
                return true;
            }
            "FileMaxPinnedMiB" => {
                self.max_pinned_bytes = bytes;
                return true;
            }
            _ => return false,
        };
        *slot = value;
        true
    }

    /// The limit on objects of `kind`.
    #[must_use]
    pub fn objects(&self, kind: Kind) -> u32 {
        match kind {
            Kind::Pd => self.max_pd,
            Kind::Mr => self.max_mr,
            Kind::Cq => self.max_cq,
            Kind::Qp => self.max_qp,
            Kind::Srq => self.max_srq,
            Kind::Ah => self.max_ah,
            Kind::Channel => self.max_channel,
            Kind::Cep => self.max_cep,
            // Windows are memory keys as MRs are: as many of each.
            Kind::Mw => self.max_mr,
        }
    }
}

/// What one file holds against its quota.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Live (or being created) objects of each kind, by `Kind::index`.
    pub objects: [u32; 9],
    /// Bytes of ring memory.
    pub ring_bytes: u64,
    /// Bytes of pinned memory.
    pub pinned_bytes: u64,
}

/// Bytes of memory an object holds against its file's quota.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Bytes {
    /// Ring memory.
    pub ring: u64,
    /// Pinned memory.
    pub pinned: u64,
}

impl Usage {
    /// Checks that one more object of `kind` holding `bytes` fits in
    /// `quota`.
    ///
    /// # Errors
    /// `STATUS_QUOTA_EXCEEDED`.
    pub(crate) fn check(
        &self,
        quota: &FileQuota,
        kind: Kind,
        bytes: Bytes,
    ) -> Result<(), NtStatus> {
        if self.objects[kind.index()] >= quota.objects(kind) {
            return Err(STATUS_QUOTA_EXCEEDED);
        }
        self.check_bytes(quota, bytes, Bytes::default())
    }

    /// Checks that `more` bytes fit once `less` are given back (a resize).
    ///
    /// # Errors
    /// `STATUS_QUOTA_EXCEEDED`.
    pub(crate) fn check_bytes(
        &self,
        quota: &FileQuota,
        more: Bytes,
        less: Bytes,
    ) -> Result<(), NtStatus> {
        let ring = self.ring_bytes.saturating_sub(less.ring);
        let pinned = self.pinned_bytes.saturating_sub(less.pinned);
        let fits =
            |used: u64, more: u64, max: u64| used.checked_add(more).is_some_and(|n| n <= max);
        if fits(ring, more.ring, quota.max_ring_bytes)
            && fits(pinned, more.pinned, quota.max_pinned_bytes)
        {
            Ok(())
        } else {
            Err(STATUS_QUOTA_EXCEEDED)
        }
    }

    /// Takes `bytes`.
    pub(crate) fn add(&mut self, bytes: Bytes) {
        self.ring_bytes = self.ring_bytes.saturating_add(bytes.ring);
        self.pinned_bytes = self.pinned_bytes.saturating_add(bytes.pinned);
    }

    /// Gives `bytes` back.
    pub(crate) fn release(&mut self, bytes: Bytes) {
        self.ring_bytes = self.ring_bytes.saturating_sub(bytes.ring);
        self.pinned_bytes = self.pinned_bytes.saturating_sub(bytes.pinned);
    }
}

/// A resize of `o` to a ring of `new` bytes starts: the file holds both
/// rings until it ends.
pub(crate) fn begin_resize(usage: &mut Usage, o: &mut crate::object::Object, new: Bytes) {
    usage.add(new);
    o.resize_bytes = Some(new);
}

/// A modify or resize of `o` ended: if it was a resize, the old ring's
/// bytes are given back if it succeeded, else the new one's.
pub(crate) fn end_resize(usage: &mut Usage, o: &mut crate::object::Object, ok: bool) {
    let Some(new) = o.resize_bytes.take() else {
        return;
    };
    if ok {
        usage.release(o.bytes);
        o.bytes = new;
    } else {
        usage.release(new);
    }
}

/// Bytes of a ring holding `depth` entries of `stride` bytes as the ABI's
/// ring layout allocates it: 2^k >= `depth` + 1 slots, whole pages.
fn ring_bytes(depth: u32, stride: u32) -> u64 {
    let slots = depth
        .saturating_add(1)
        .checked_next_power_of_two()
        .unwrap_or(1 << 31);
    Ring::alloc_len(slots, stride).map_or(u64::MAX, |n| n as u64)
}

/// Ring memory of a QP created with `cap` (no receive queue with an SRQ).
pub(crate) fn qp_rings(cap: &IvQpCap, with_srq: bool) -> Bytes {
    let sq = ring_bytes(
        cap.max_send_wr,
        send_stride(cap.max_send_sge, cap.max_inline_data),
    );
    let rq = if with_srq {
        0
    } else {
        ring_bytes(cap.max_recv_wr, recv_stride(cap.max_recv_sge))
    };
    Bytes {
        ring: sq.saturating_add(rq),
        pinned: 0,
    }
}

/// Ring memory of a CQ of `cqe` entries.
pub(crate) fn cq_ring(cqe: u32) -> Bytes {
    Bytes {
        ring: ring_bytes(cqe, size_of::<IvCqe>() as u32),
        pinned: 0,
    }
}

/// Ring memory of an SRQ of `max_wr` entries of `max_sge` SGEs.
pub(crate) fn srq_ring(max_wr: u32, max_sge: u32) -> Bytes {
    Bytes {
        ring: ring_bytes(max_wr, recv_stride(max_sge)),
        pinned: 0,
    }
}

/// Pinned memory of an MR over `length` bytes from `addr`: the pages it
/// spans.
pub(crate) fn mr_pinned(addr: u64, length: u64) -> Bytes {
    const PAGE: u64 = 4096;
    let first = addr / PAGE;
    let last = addr.saturating_add(length).div_ceil(PAGE);
    Bytes {
        ring: 0,
        pinned: last.saturating_sub(first).saturating_mul(PAGE),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_largest_qp_costs_32_mib_of_rings() {
        let cap = IvQpCap {
            max_send_wr: 0x3FFF,
            max_recv_wr: 0x3FFF,
            max_send_sge: 32,
            max_recv_sge: 32,
            max_inline_data: 0,
            reserved: 0,
        };
        let b = qp_rings(&cap, false).ring;
        assert!((32 << 20..(32 << 20) + 2 * 4096 * 2).contains(&b), "{b}");
        assert!(qp_rings(&cap, true).ring < b);
    }

    #[test]
    fn registry_values_set_and_read_every_limit() {
        let mut q = FileQuota::default();
        for (i, name) in FileQuota::REGISTRY_NAMES.iter().enumerate() {
            let v = 7 + i as u32;
            assert!(q.set_registry_value(name, v), "{name}");
            assert_eq!(q.registry_value(name), Some(v), "{name}");
        }
        assert_eq!(q.max_ring_bytes, 15 << 20);
        assert_eq!(q.max_pinned_bytes, 16 << 20);
        assert_eq!((q.max_pd, q.max_cep), (7, 14));
        assert!(!q.set_registry_value("FileMaxWidgets", 1));
        assert_eq!(q.registry_value("FileMaxWidgets"), None);
    }

    #[test]
    fn pinned_bytes_are_the_pages_spanned() {
        assert_eq!(mr_pinned(4096, 1).pinned, 4096);
        assert_eq!(mr_pinned(4095, 2).pinned, 8192);
        assert_eq!(mr_pinned(0, 8192).pinned, 8192);
        assert_eq!(mr_pinned(u64::MAX - 10, 100).pinned, 4096);
    }

    #[test]
    fn checks_count_objects_and_bytes() {
        let q = FileQuota {
            max_qp: 1,
            max_ring_bytes: 100,
            ..FileQuota::default()
        };
        let mut u = Usage::default();
        let b = Bytes {
            ring: 60,
            pinned: 0,
        };
        assert_eq!(u.check(&q, Kind::Qp, b), Ok(()));
        u.objects[Kind::Qp.index()] = 1;
        u.add(b);
        assert_eq!(
            u.check(&q, Kind::Qp, Bytes::default()),
            Err(STATUS_QUOTA_EXCEEDED)
        );
        assert_eq!(u.check(&q, Kind::Cq, b), Err(STATUS_QUOTA_EXCEEDED));
        assert_eq!(
            u.check(
                &q,
                Kind::Cq,
                Bytes {
                    ring: 40,
                    pinned: 0
                }
            ),
            Ok(())
        );
        // A resize is checked as if the old ring were gone.
        assert_eq!(
            u.check_bytes(
                &q,
                Bytes {
                    ring: 90,
                    pinned: 0
                },
                b
            ),
            Ok(())
        );
        u.release(b);
        assert_eq!(
            u,
            Usage {
                objects: u.objects,
                ..Usage::default()
            }
        );
        assert_eq!(
            u.check_bytes(
                &q,
                Bytes {
                    ring: u64::MAX,
                    pinned: 0
                },
                Bytes::default()
            ),
            Err(STATUS_QUOTA_EXCEEDED)
        );
    }
}
