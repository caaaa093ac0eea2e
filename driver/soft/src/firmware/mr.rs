//! Memory regions and their keys.
//!
//! A key is `(index << 8) | key`: the MR's slot index (23 bits, from 1:
//! the index's top bit marks a memory window's key, `crate::firmware::mw`)
//! and an 8-bit key that changes every time the slot is reused, so a key
//! kept after its MR was deregistered no longer matches. The rkey equals
//! the lkey.

use irpverbs_abi::{
    IV_ACCESS_ALL, IV_ACCESS_LOCAL_WRITE, IV_ACCESS_REMOTE_ATOMIC, IV_ACCESS_REMOTE_WRITE,
    NtStatus, STATUS_INSUFFICIENT_RESOURCES, STATUS_INVALID_HANDLE, STATUS_INVALID_PARAMETER,
};
use irpverbs_core::{CommandOut, RegMr};

use crate::firmware::Firmware;

/// A registered memory region. The data path will translate through it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Mr {
    /// Its PD.
    pub(crate) pdn: u32,
    /// Start address: region offset 0.
    pub(crate) addr: u64,
    /// The lowest address an access may reach: `addr`, or a memory
    /// window's start (a window's view of its MR, `crate::firmware::mw`).
    pub(crate) start: u64,
    /// Length in bytes.
    pub(crate) length: u64,
    /// The end of what the HCA may reach: `addr` plus the length or the
    /// pinned region's, whichever is less (computed at registration, so
    /// that checking an access reads neither the region nor a sum); 0 for
    /// an MR mapped page by page (`pages`), whose pages were checked
    /// against the region at registration.
    pub(crate) end: u64,
    /// `IV_ACCESS_*`.
    pub(crate) access: u32,
    /// `addr` is physical.
    pub(crate) physical: bool,
    /// The pinned memory: the only way the HCA reaches it.
    pub(crate) region: crate::firmware::shared::RegionRef,
    /// Memory windows bound to it, and valid fast-register MRs whose pages
    /// lie in it: it cannot be deregistered while there are any.
    pub(crate) windows: crate::firmware::Refs,
    /// A fast-register MR's state (`crate::firmware::fast_reg`); `None`
    /// for an MR that `RegMr` registered, and for a window's view.
    pub(crate) fast: Option<crate::firmware::fast_reg::FastReg>,
    /// The page table of a fast registration whose pages do not follow
    /// each other in the region (and of a window's view of one): `None`
    /// when the range is one piece of the region at `addr`.
    pub(crate) pages: Option<crate::firmware::fast_reg::Pages>,
}

/// The key of slot `index` filled for the `generation`th time.
pub(crate) const fn make_key(index: u32, generation: u8) -> u32 {
    (index << 8) | generation as u32
}

/// The MR table slot of `key` (whose generation it names or not).
#[inline(always)]
pub(crate) const fn mr_index(key: u32) -> u32 {
    key >> 8
}

/// The live MR `key` names (its index, and the key of the index's
/// current generation: a fast-register MR's key byte is its slot's
/// generation too).
#[inline(always)]
pub(crate) fn mr_by_key(mrs: &crate::firmware::table::Table<Mr>, key: u32) -> Option<&Mr> {
    let index = mr_index(key);
    let mr = mrs.get(index).ok()?;
    let generation = mrs.generation(index).ok()?;
    (make_key(index, generation) == key).then_some(mr)
}

/// Whether an MR with `access` lets the HCA write it (local write, which
/// remote write and atomics require).
pub(crate) const fn writable(access: u32) -> bool {
    access & (IV_ACCESS_LOCAL_WRITE | IV_ACCESS_REMOTE_WRITE | IV_ACCESS_REMOTE_ATOMIC) != 0
}

/// Checks `IV_ACCESS_*` flags: only defined bits, and remote write or
/// atomic only with local write (IBTA 10.6.3.1 / o10-33).
///
/// # Errors
/// `STATUS_INVALID_PARAMETER`.
pub(crate) fn check_access(access: u32) -> Result<(), NtStatus> {
    let needs_local_write = access & (IV_ACCESS_REMOTE_WRITE | IV_ACCESS_REMOTE_ATOMIC) != 0;
    if access & !IV_ACCESS_ALL != 0 || (needs_local_write && access & IV_ACCESS_LOCAL_WRITE == 0) {
        Err(STATUS_INVALID_PARAMETER)
    } else {
        Ok(())
    }
}

/// Invalidates what `rkey` names for a QP of PD `pdn` (an
/// `IV_WR_LOCAL_INV`, or a SEND with invalidate at the responder): a bound
/// type 2 window (`crate::firmware::mw::invalidate`) or a valid
/// fast-register MR (`crate::firmware::fast_reg::invalidate`). An MR that
/// `RegMr` registered is refused.
///
/// # Errors
/// When neither takes it.
pub(crate) fn invalidate(
    mrs: &mut crate::firmware::table::Table<Mr>,
    mws: &mut crate::firmware::table::Table<crate::firmware::mw::Mw>,
    pdn: u32,
    rkey: u32,
) -> Result<(), ()> {
    if crate::firmware::mw::mw_index(rkey).is_some() {
        crate::firmware::mw::invalidate(mrs, mws, pdn, rkey)
    } else {
        crate::firmware::fast_reg::invalidate(mrs, pdn, rkey)
    }
}

impl Firmware {
    /// `RegMr`: returns the lkey and rkey (equal).
    ///
    /// # Errors
    /// `STATUS_INVALID_HANDLE` for an unknown PD; `STATUS_INVALID_PARAMETER`
    /// for a zero length, a range that wraps past 2^64 or bad access flags;
    /// `STATUS_INSUFFICIENT_RESOURCES` for a length above `max_mr_size` or
    /// when `max_mr` MRs exist.
    pub(crate) fn reg_mr(&mut self, c: RegMr) -> Result<CommandOut, NtStatus> {
        let RegMr {
            pdn,
            addr,
            length,
            access,
            physical,
            region,
        } = c;
        self.pds.get(pdn)?;
        check_access(access)?;
        if length == 0 || addr.checked_add(length).is_none() {
            return Err(STATUS_INVALID_PARAMETER);
        }
        if length > self.config.max_mr_size {
            return Err(STATUS_INSUFFICIENT_RESOURCES);
        }
        // No wrap: `addr + length` was checked above.
        let end = addr + length.min(u64::try_from(region.len()).unwrap_or(u64::MAX));
        let index = self.mrs.insert(Mr {
            pdn,
            addr,
            start: addr,
            length,
            end,
            access,
            physical,
            region: crate::firmware::shared::RegionRef(region),
            windows: crate::firmware::Refs::default(),
            fast: None,
            pages: None,
        })?;
        let key = make_key(index, self.mrs.generation(index)?);
        self.pds.get_mut(pdn)?.refs.get();
        Ok(CommandOut::Mr {
            lkey: key,
            rkey: key,
        })
    }

    /// The device was removed: every MR goes, without a command, and with
    /// it the firmware's references to registered memory. Returns them, to
    /// be dropped (unpinned) outside the HCA lock; when memory for that
    /// list is short they are dropped here, as `DeregMr` drops one.
    pub(crate) fn drop_mrs(&mut self) -> alloc::vec::Vec<Mr> {
        let pds = &mut self.pds;
        self.mrs.take_all(|mr| {
            if let Ok(pd) = pds.get_mut(mr.pdn) {
                pd.refs.put();
            }
        })
    }

    /// The device was removed: every object goes, without a command (QPs
    /// first, then what they held), so that nothing of the firmware's
    /// touches a ring or a registered page again. A ring mapped into a
    /// process or viewed by a kernel ULP stays allocated while its mapping
    /// or view holds it. Returns the MRs, to be dropped (unpinned) outside
    /// the HCA lock.
    pub(crate) fn drop_all(&mut self) -> alloc::vec::Vec<Mr> {
        let mut next = 0;
        while let Some(qpn) = self.qps.next_live(next) {
            // Cannot fail for a live QP; a failure would only leave it.
            let _ = self.destroy_qp(qpn);
            next = qpn.saturating_add(1);
        }
        macro_rules! drop_table {
            ($table:ident, $destroy:ident) => {
                let mut next = 0;
                while let Some(n) = self.$table.next_live(next) {
                    let _ = self.$destroy(n);
                    next = n.saturating_add(1);
                }
            };
        }
        drop_table!(ahs, destroy_ah);
        drop_table!(srqs, destroy_srq);
        drop_table!(cqs, destroy_cq);
        drop_table!(mws, dealloc_mw_index);
        let mrs = self.drop_mrs();
        drop_table!(pds, dealloc_pd);
        mrs
    }

    /// `DeregMr` (a fast-register MR by the key `AllocMr` gave it too,
    /// valid or free).
    ///
    /// # Errors
    /// `STATUS_INVALID_HANDLE` when `lkey` names no live MR (unknown index,
    /// or a stale key of a reused index); `STATUS_DEVICE_BUSY` while memory
    /// windows are bound to it or valid fast-register MRs map its pages.
    pub(crate) fn dereg_mr(&mut self, lkey: u32) -> Result<CommandOut, NtStatus> {
        let index = self.dereg_index(lkey).ok_or(STATUS_INVALID_HANDLE)?;
        self.mrs.get(index)?.windows.check_idle()?;
        let mr = self.mrs.remove(index)?;
        self.unmap(&mr);
        self.pds.get_mut(mr.pdn)?.refs.put();
        Ok(CommandOut::None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::util::Dev;
    use irpverbs_abi::IV_ACCESS_REMOTE_READ;
    use irpverbs_core::Command;

    fn reg(pdn: u32, addr: u64, length: u64, access: u32) -> Command {
        Command::RegMr(RegMr {
            pdn,
            addr,
            length,
            access,
            physical: false,
            region: crate::tests::util::region(length),
        })
    }

    #[test]
    fn register_and_deregister() {
        let d = Dev::inline();
        let pdn = d.pd();
        let CommandOut::Mr { lkey, rkey } = d.ok(reg(pdn, 0x1000, 4096, IV_ACCESS_ALL)) else {
            panic!()
        };
        assert_eq!(lkey, rkey);
        assert_eq!(lkey >> 8, 1, "first index");
        assert_eq!(d.snapshot().mrs.get(1).unwrap().length, 4096);
        assert_eq!(d.hca.live_objects(), 2);
        d.ok(Command::DeregMr { lkey });
        assert_eq!(d.hca.live_objects(), 1);
        d.fails(Command::DeregMr { lkey }, STATUS_INVALID_HANDLE);
        d.ok(Command::RegMr(RegMr {
            pdn,
            addr: 0x8000_0000,
            length: 1,
            access: 0,
            physical: true,
            region: crate::tests::util::region(4096),
        }));
    }

    /// An access is checked against the MR and against the memory pinned
    /// for it: an MR longer than its region reaches the region only.
    #[test]
    fn accesses_stay_inside_the_mr_and_its_region() {
        let d = Dev::inline();
        let pdn = d.pd();
        let CommandOut::Mr { lkey, .. } = d.ok(Command::RegMr(RegMr {
            pdn,
            addr: 0x1000,
            length: 8192,
            access: IV_ACCESS_ALL,
            physical: false,
            region: crate::tests::util::region(4096),
        })) else {
            panic!()
        };
        let snapshot = d.snapshot();
        let mr = snapshot.mrs.get(lkey >> 8).unwrap();
        assert_eq!(mr.end, 0x2000, "the region's end, not the MR's");
        assert_eq!(mr.offset_of(0x1000, 4096), Some(0));
        assert_eq!(mr.offset_of(0x1ff8, 8), Some(0xff8));
        assert_eq!(
            mr.offset_of(0x2000, 0),
            Some(0x1000),
            "an empty access at the end"
        );
        assert_eq!(mr.offset_of(0x1ff8, 9), None, "past the region");
        assert_eq!(
            mr.offset_of(0x2000, 1),
            None,
            "inside the MR, past the region"
        );
        assert_eq!(mr.offset_of(0xfff, 1), None, "below the MR");
        assert_eq!(mr.offset_of(u64::MAX, 2), None, "wraps");
        let CommandOut::Mr { lkey, .. } = d.ok(reg(pdn, 0x1000, 4096, IV_ACCESS_ALL)) else {
            panic!()
        };
        let snapshot = d.snapshot();
        let mr = snapshot.mrs.get(lkey >> 8).unwrap();
        assert_eq!(mr.end, 0x2000, "the MR's end");
        assert_eq!(mr.offset_of(0x1800, 0x800), Some(0x800));
        assert_eq!(mr.offset_of(0x1800, 0x801), None);
    }

    #[test]
    fn device_removal_lets_go_of_registered_memory() {
        let d = Dev::inline();
        let pdn = d.pd();
        let region = crate::tests::util::region(4096);
        let CommandOut::Mr { lkey, .. } = d.ok(Command::RegMr(RegMr {
            pdn,
            addr: 0x1000,
            length: 4096,
            access: IV_ACCESS_ALL,
            physical: false,
            region: region.clone(),
        })) else {
            panic!()
        };
        assert_eq!(
            irpverbs_ring::Shared::strong_count(&region),
            2,
            "the HCA holds it"
        );
        irpverbs_core::Hca::device_removed(&d.hca);
        assert_eq!(irpverbs_ring::Shared::strong_count(&region), 1, "unpinned");
        assert_eq!(d.hca.live_objects(), 0, "the PD goes too");
        d.fails(Command::DeregMr { lkey }, STATUS_INVALID_HANDLE);
        d.fails(Command::DeallocPd { pdn }, STATUS_INVALID_HANDLE);
    }

    #[test]
    fn reuse_changes_the_key() {
        let d = Dev::inline();
        let pdn = d.pd();
        let (first, _) = d.mr(pdn);
        let mut seen = alloc::vec![first];
        let mut stale = first;
        for _ in 0..300 {
            d.ok(Command::DeregMr { lkey: stale });
            let (key, _) = d.mr(pdn);
            assert_eq!(key >> 8, first >> 8, "the index is reused");
            assert_ne!(key, stale, "with another key");
            d.fails(Command::DeregMr { lkey: stale }, STATUS_INVALID_HANDLE);
            seen.push(key);
            stale = key;
        }
        seen.truncate(256);
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(
            seen.len(),
            256,
            "all 256 keys of the index are used in turn"
        );
    }

    #[test]
    fn bad_keys() {
        let d = Dev::inline();
        let pdn = d.pd();
        let (lkey, _) = d.mr(pdn);
        for key in [0, lkey ^ 1, lkey + 0x100, u32::MAX] {
            d.fails(Command::DeregMr { lkey: key }, STATUS_INVALID_HANDLE);
        }
    }

    #[test]
    fn validation() {
        let d = Dev::with(|c| {
            c.max_mr = 1;
            c.max_mr_size = 1 << 20;
        });
        let pdn = d.pd();
        d.fails(reg(pdn + 1, 0, 1, 0), STATUS_INVALID_HANDLE);
        d.fails(reg(0, 0, 1, 0), STATUS_INVALID_HANDLE);
        d.fails(reg(pdn, 0, 0, 0), STATUS_INVALID_PARAMETER);
        d.fails(reg(pdn, u64::MAX, 1, 0), STATUS_INVALID_PARAMETER);
        d.fails(reg(pdn, u64::MAX - 9, 10, 0), STATUS_INVALID_PARAMETER);
        d.fails(reg(pdn, 0, (1 << 20) + 1, 0), STATUS_INSUFFICIENT_RESOURCES);
        for access in [
            IV_ACCESS_REMOTE_WRITE,
            IV_ACCESS_REMOTE_ATOMIC,
            IV_ACCESS_REMOTE_READ | IV_ACCESS_REMOTE_WRITE,
            1 << 5,
            u32::MAX,
        ] {
            d.fails(reg(pdn, 0, 1, access), STATUS_INVALID_PARAMETER);
        }
        d.ok(reg(pdn, u64::MAX - 9, 9, IV_ACCESS_REMOTE_READ));
        d.fails(reg(pdn, 0, 1 << 20, 0), STATUS_INSUFFICIENT_RESOURCES);
    }

    #[test]
    fn access_rule() {
        for access in 0..=IV_ACCESS_ALL {
            let remote_w_or_a = access & (IV_ACCESS_REMOTE_WRITE | IV_ACCESS_REMOTE_ATOMIC) != 0;
            let local_w = access & IV_ACCESS_LOCAL_WRITE != 0;
            assert_eq!(check_access(access).is_ok(), !remote_w_or_a || local_w);
        }
    }
}
