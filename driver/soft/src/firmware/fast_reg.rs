//! Fast-register MRs: allocated free by `Command::AllocMr`
//! (`IOCTL_IV_ALLOC_MR`), made valid by an `IV_WR_REG_MR` work request
//! with a key and a page list, made free again by `IV_WR_LOCAL_INV` or a
//! SEND with invalidate (docs/fast-registration.md).
//!
//! A fast-register MR is an [`Mr`] of the MR table, so that its keys are
//! looked up as every MR's (one table index, the slot's generation as the
//! key byte: a registration sets the generation to the key the work
//! request chose). While free it reaches nothing: its range is empty and it
//! grants no access. A registration maps its page list, pages of an MR of
//! the QP's PD (its backing MR: the soft HCA reaches memory only through
//! regions the platform pinned or wrapped, as `IOCTL_IV_REG_MR` and
//! `IOCTL_IV_REG_PHYS_MR` made them), onto `iova..iova + length`; the
//! backing MR counts it as a dependent (no deregistration while mapped).
//! The pages lie in one backing MR, in any order: a list whose pages
//! follow each other maps one piece of the backing region (the MR is then
//! reached as any registered MR), and any other list maps page by page
//! through the page table the MR took at `AllocMr` ([`Pages`]; the data
//! path splits each access at the pages' seams).

use core::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use irpverbs_abi::{
    IV_ACCESS_LOCAL_WRITE, IV_WC_LOC_PROT_ERR, IV_WC_LOC_QP_OP_ERR, IvSendWqe, IvSge, NtStatus,
    STATUS_INSUFFICIENT_RESOURCES, STATUS_INVALID_PARAMETER,
};

use irpverbs_core::CommandOut;
use irpverbs_ring::Shared;

use crate::firmware::Firmware;
use crate::firmware::mr::{Mr, make_key, mr_by_key};
use crate::firmware::shared::RegionRef;
use crate::firmware::table::Table;

/// What a fast-register MR has that a registered one has not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FastReg {
    /// The longest page list a registration may map.
    pub(crate) max_pages: u32,
    /// The key `AllocMr` returned: the driver deregisters the MR by it,
    /// whatever key a registration gave it since.
    pub(crate) alloc_key: u32,
    /// While valid: the index of the MR its pages lie in.
    pub(crate) backing: Option<u32>,
    /// A region of its own, which a free MR holds in place of its backing
    /// MR's (so that a free MR keeps no registered memory alive).
    pub(crate) idle: RegionRef,
    /// Its page table: `max_pages` entries, taken at `AllocMr` so that a
    /// registration allocates nothing.
    pub(crate) table: Pages,
}

/// A fast-register MR's page table: how a registration whose pages do not
/// follow each other maps its range (page `i` covers `base + i * 2^shift`
/// and lies at `entries[i]` in the backing region). Written by a
/// registration, while the MR is free (so no access and no window reads
/// it), and read by the data path under the same lock; atomics, so that
/// the MR and its windows' views share the table without a copy.
#[derive(Debug)]
pub(crate) struct PageTable {
    /// log2 of the page size.
    shift: AtomicU32,
    /// Pages mapped.
    count: AtomicU32,
    /// The iova of page 0's first byte.
    base: AtomicU64,
    /// The region offset of each page (`max_pages` of them).
    entries: alloc::vec::Vec<AtomicUsize>,
}

/// A shared page table, compared by identity.
#[derive(Clone, Debug)]
pub(crate) struct Pages(Shared<PageTable>);

impl PartialEq for Pages {
    fn eq(&self, other: &Self) -> bool {
        Shared::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Pages {}

impl Pages {
    /// A table of `entries` pages, or `STATUS_INSUFFICIENT_RESOURCES`.
    fn alloc(entries: u32) -> Result<Self, NtStatus> {
        let mut v = crate::firmware::shared::vec_with_capacity(entries as usize)?;
        v.extend((0..entries).map(|_| AtomicUsize::new(0)));
        Shared::try_new(PageTable {
            shift: AtomicU32::new(0),
            count: AtomicU32::new(0),
            base: AtomicU64::new(0),
            entries: v,
        })
        .map(Self)
        .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)
    }

    /// Maps pages of `2^shift` bytes from `base` (page 0's first byte) to
    /// the region offsets `offsets`. The MR is free: nothing reads the
    /// table meanwhile.
    fn map(&self, shift: u32, base: u64, offsets: impl Iterator<Item = usize>) {
        let t = &self.0;
        let mut count = 0u32;
        for (entry, at) in t.entries.iter().zip(offsets) {
            entry.store(at, Ordering::Relaxed);
            count += 1;
        }
        t.shift.store(shift, Ordering::Relaxed);
        t.base.store(base, Ordering::Relaxed);
        t.count.store(count, Ordering::Relaxed);
    }

    /// The region offset of `addr` (inside the mapped range, checked by
    /// the caller) and the bytes from there, up to `len`, that lie in one
    /// piece of the region (the following pages joined while each lies
    /// right after the one before).
    #[inline]
    pub(crate) fn piece(&self, addr: u64, len: u64) -> Option<(usize, u64)> {
        let t = &self.0;
        let entries = &t.entries;
        let shift = t.shift.load(Ordering::Relaxed);
        let count = t.count.load(Ordering::Relaxed) as usize;
        let page = 1u64.checked_shl(shift)?;
        let rel = addr.checked_sub(t.base.load(Ordering::Relaxed))?;
        let mut i = usize::try_from(rel >> shift).ok()?;
        let within = rel & (page - 1);
        if i >= count {
            return None;
        }
        let first = entries.get(i)?.load(Ordering::Relaxed);
        let offset = first.checked_add(usize::try_from(within).ok()?)?;
        let mut run = page - within;
        let mut at = first;
        while run < len && i + 1 < count {
            let next = entries.get(i + 1)?.load(Ordering::Relaxed);
            if Some(next) != at.checked_add(usize::try_from(page).ok()?) {
                break;
            }
            (i, at, run) = (i + 1, next, run + page);
        }
        Some((offset, run.min(len)))
    }
}

/// A free MR's range: empty, so that every access fails its range check.
fn set_free(mr: &mut Mr, idle: RegionRef) {
    mr.addr = 0;
    mr.start = u64::MAX;
    mr.length = 0;
    mr.end = 0;
    mr.access = 0;
    mr.physical = false;
    mr.region = idle;
    mr.pages = None;
}

/// Where a registration's range lies in its backing region.
enum Mapped {
    /// One piece: region offset `va - addr` (the value is `addr`).
    Piece(u64),
    /// Page by page, through the MR's table (mapped).
    Pages(Pages),
}

/// An `IV_WR_REG_MR` of a QP of PD `pdn` with page list `pages`: the MR
/// its `rkey` names takes that key, the access, range and pages, and is
/// valid.
///
/// # Errors
/// The completion status: `IV_WC_LOC_QP_OP_ERR` for a key that names no
/// fast-register MR of PD `pdn`, an MR that is valid already (it must be
/// invalidated first), bad access flags, a page size that is not a power
/// of two of `page_size_cap`, an empty page list or one longer than the
/// MR's `max_num_sg`, a range that wraps or that the pages do not hold, a
/// page of another size or not aligned to it; `IV_WC_LOC_PROT_ERR` for a
/// page its lkey's MR does not hold (no such MR, another PD, a
/// fast-register MR, without local write when the registration grants a
/// write) or pages of more than one MR.
pub(crate) fn reg_wr(
    mrs: &mut Table<Mr>,
    pdn: u32,
    page_size_cap: u64,
    wqe: &IvSendWqe,
    pages: &[IvSge],
) -> Result<(), u32> {
    let index = wqe.rkey >> 8;
    let mr = mrs.get(index).map_err(|_| IV_WC_LOC_QP_OP_ERR)?;
    let Some(fast) = mr.fast.as_ref() else {
        return Err(IV_WC_LOC_QP_OP_ERR);
    };
    let access = u32::try_from(wqe.swap).map_err(|_| IV_WC_LOC_QP_OP_ERR)?;
    let page = u64::from(wqe.imm_or_inv);
    let (iova, length) = (wqe.remote_addr, wqe.compare_add);
    let offset = iova & page.wrapping_sub(1);
    let npages = u64::try_from(pages.len()).unwrap_or(u64::MAX);
    let ok = mr.pdn == pdn
        && fast.backing.is_none()
        && crate::firmware::mr::check_access(access).is_ok()
        && page.is_power_of_two()
        && page & page_size_cap != 0
        && npages != 0
        && npages <= u64::from(fast.max_pages)
        && iova.checked_add(length).is_some()
        && u128::from(offset) + u128::from(length) <= u128::from(npages) * u128::from(page)
        && pages
            .iter()
            .all(|p| u64::from(p.length) == page && p.addr & (page - 1) == 0);
    if !ok {
        return Err(IV_WC_LOC_QP_OP_ERR);
    }
    // Every page in the backing MR; one piece of its region if they
    // follow each other there, else mapped page by page.
    let table = fast.table.clone();
    let first = &pages[0];
    let backing_index = first.lkey >> 8;
    let backing = mr_by_key(mrs, first.lkey).ok_or(IV_WC_LOC_PROT_ERR)?;
    let writes = crate::firmware::mr::writable(access);
    if backing.pdn != pdn
        || backing.fast.is_some()
        || (writes && backing.access & IV_ACCESS_LOCAL_WRITE == 0)
    {
        return Err(IV_WC_LOC_PROT_ERR);
    }
    let mut contiguous = true;
    let mut next = first.addr;
    for p in pages {
        if p.lkey != first.lkey || backing.offset_of(p.addr, page).is_none() {
            return Err(IV_WC_LOC_PROT_ERR);
        }
        contiguous &= p.addr == next;
        next = p.addr.wrapping_add(page);
    }
    let mapped = if contiguous {
        let base = backing
            .offset_of(first.addr, page)
            .ok_or(IV_WC_LOC_PROT_ERR)?;
        let view_base = u64::try_from(base).map_err(|_| IV_WC_LOC_PROT_ERR)? + offset;
        // Region offsets: `va - addr` (wrapping: the iova may lie below
        // the backing region's offset), inside the range checked above.
        Mapped::Piece(iova.wrapping_sub(view_base))
    } else {
        // Each page's offset, checked above; the list is at most
        // `max_pages` long (checked above), as the table is.
        table.map(
            page.trailing_zeros(),
            iova - offset,
            pages.iter().filter_map(|p| backing.offset_of(p.addr, page)),
        );
        Mapped::Pages(table)
    };
    let (region, physical) = (backing.region.clone(), backing.physical);
    mrs.set_generation(index, wqe.rkey as u8)
        .map_err(|_| IV_WC_LOC_QP_OP_ERR)?;
    if let Ok(b) = mrs.get_mut(backing_index) {
        b.windows.get();
    }
    let mr = mrs.get_mut(index).map_err(|_| IV_WC_LOC_QP_OP_ERR)?;
    match mapped {
        Mapped::Piece(addr) => mr.addr = addr,
        Mapped::Pages(p) => {
            mr.addr = 0;
            mr.pages = Some(p);
        }
    }
    mr.start = iova;
    mr.length = length;
    // Page by page: no range is one piece (`Mr::offset_of`).
    mr.end = if mr.pages.is_some() { 0 } else { iova + length };
    mr.access = access;
    mr.physical = physical;
    mr.region = region;
    if let Some(f) = mr.fast.as_mut() {
        f.backing = Some(backing_index);
    }
    Ok(())
}

/// Invalidates the valid fast-register MR `rkey` names (its current key),
/// for a QP of PD `pdn` (an `IV_WR_LOCAL_INV`, or a SEND with invalidate
/// at the responder): it is free, its key names nothing, and its backing
/// MR has one dependent fewer. An MR registered by `REG_MR`, a free MR,
/// one of another PD or with windows bound to it is refused.
///
/// # Errors
/// When `rkey` names no such MR.
pub(crate) fn invalidate(mrs: &mut Table<Mr>, pdn: u32, rkey: u32) -> Result<(), ()> {
    let index = rkey >> 8;
    let mr = mr_by_key(mrs, rkey).ok_or(())?;
    let Some(FastReg {
        backing: Some(backing),
        idle,
        ..
    }) = mr.fast.as_ref()
    else {
        return Err(());
    };
    if mr.pdn != pdn || mr.windows.count() != 0 {
        return Err(());
    }
    let (backing, idle) = (*backing, idle.clone());
    if let Ok(b) = mrs.get_mut(backing) {
        b.windows.put();
    }
    let mr = mrs.get_mut(index).map_err(|_| ())?;
    set_free(mr, idle);
    if let Some(f) = mr.fast.as_mut() {
        f.backing = None;
    }
    Ok(())
}

impl Firmware {
    /// `AllocMr`: a free fast-register MR of PD `pdn` whose page lists
    /// hold up to `max_pages` pages. Returns its lkey and rkey (equal).
    ///
    /// # Errors
    /// `STATUS_INVALID_HANDLE` for an unknown PD; `STATUS_INVALID_PARAMETER`
    /// for `max_pages` 0 or above `max_fast_reg_page_list_len` (the send
    /// queue's SGEs carry the page list: `max_sge`);
    /// `STATUS_INSUFFICIENT_RESOURCES` when `max_mr` MRs exist or memory is
    /// short.
    pub(crate) fn alloc_mr(&mut self, pdn: u32, max_pages: u32) -> Result<CommandOut, NtStatus> {
        self.pds.get(pdn)?;
        if max_pages == 0 || max_pages > self.config.max_sge {
            return Err(STATUS_INVALID_PARAMETER);
        }
        self.mrs.check_room()?;
        let idle = irpverbs_ring::Region::alloc(1).ok_or(STATUS_INSUFFICIENT_RESOURCES)?;
        let idle = RegionRef(
            irpverbs_ring::Shared::try_new(idle).map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?,
        );
        let table = Pages::alloc(max_pages)?;
        let mut mr = Mr {
            pdn,
            addr: 0,
            start: 0,
            length: 0,
            end: 0,
            access: 0,
            physical: false,
            region: idle.clone(),
            windows: crate::firmware::Refs::default(),
            fast: None,
            pages: None,
        };
        set_free(&mut mr, idle.clone());
        let index = self.mrs.insert(mr)?;
        let key = make_key(index, self.mrs.generation(index)?);
        self.mrs.get_mut(index)?.fast = Some(FastReg {
            max_pages,
            alloc_key: key,
            backing: None,
            idle,
            table,
        });
        self.pds.get_mut(pdn)?.refs.get();
        Ok(CommandOut::Mr {
            lkey: key,
            rkey: key,
        })
    }

    /// The MR slot `lkey` names for `DeregMr`: its current key or, for a
    /// fast-register MR, the key `AllocMr` gave it.
    pub(crate) fn dereg_index(&self, lkey: u32) -> Option<u32> {
        let index = lkey >> 8;
        let current = make_key(index, self.mrs.generation(index).ok()?);
        let fast = self.mrs.get(index).ok()?.fast.as_ref();
        (current == lkey || fast.is_some_and(|f| f.alloc_key == lkey)).then_some(index)
    }

    /// A deregistered MR's mapping ends: a valid fast-register MR's
    /// backing MR has one dependent fewer.
    pub(crate) fn unmap(&mut self, mr: &Mr) {
        if let Some(backing) = mr.fast.as_ref().and_then(|f| f.backing) {
            if let Ok(b) = self.mrs.get_mut(backing) {
                b.windows.put();
            }
        }
    }
}
