//! The hardware seam in host mode ([`PciPlatform`]): an IOMMU model between
//! the driver's memory and a device model, BARs the device model owns, and
//! MSI-X messages delivered to their ISR and DPC.
//!
//! # The IOMMU model
//! The device side never sees a host address. It reaches host memory only
//! with [`HostPlatform::dma_read`] and [`HostPlatform::dma_write`] at a
//! logical address, which the model translates through its mappings:
//!
//! - a common buffer ([`PciPlatform::alloc_common_buffer`]) is one run of
//!   logical pages, mapped both ways;
//! - a scatter/gather mapping ([`PciPlatform::map_dma`]) gives every page
//!   of the region a logical page of its own, each followed by an unmapped
//!   guard page, so the list has one element per page, as a physically
//!   scattered buffer's has: a device that treats the list as contiguous
//!   runs into a guard page;
//! - after each run of a mapping comes an unmapped guard page, and logical
//!   addresses are never reused, so an access after an unmap still names
//!   the mapping (the most recent [`DEAD_KEPT`] unmapped ones are
//!   remembered).
//!
//! A device that works on host memory in place (its engine reads queues
//! and registered memory as they are) asks for a view
//! ([`HostPlatform::dma_view`]): the whole range, given as a page list, is
//! translated and checked once, and the view is counted against its
//! mapping until the device drops it. Unmapping a mapping the device still
//! views (freeing a common buffer, putting back a scatter/gather list
//! before the device let go of the queue or registration on it) is a
//! bugcheck 0xE6 ([`dma::FAULT_UNMAPPED_WHILE_VIEWED`]) naming the mapping.
//!
//! An access outside a live mapping is a bugcheck 0xE6
//! DRIVER_VERIFIER_DMA_VIOLATION ([`dma::IOMMU_VIOLATION`]: parameter 2
//! the mapping's id, 3 the logical address, 4 the fault type), whose
//! reason names the mapping: an address never mapped
//! ([`dma::FAULT_UNMAPPED`]), an access past the end of its mapping's run
//! ([`dma::FAULT_PAST_END`]), after the mapping was unmapped
//! ([`dma::FAULT_AFTER_UNMAP`]), or against its direction
//! ([`dma::FAULT_DIRECTION`]: a read of memory mapped for the device to
//! write only, or the reverse). With the verifier off the same accesses
//! fail with `STATUS_INVALID_ADDRESS` instead.
//!
//! # BARs and messages
//! The device model installs its BARs ([`HostPlatform::install_bar`]):
//! each register access the driver makes through a mapped [`HostBar`]
//! calls the model. It is granted a number of MSI-X messages
//! ([`HostPlatform::grant_msix`]) and raises one with
//! [`HostPlatform::raise_msix`]: the message's ISR runs at DEVICE_LEVEL on
//! the raising thread, and its DPC, if the ISR queued it, at
//! DISPATCH_LEVEL once the interrupt returns.
//!
//! The model's bookkeeping is the platform's (uncharged); what the driver
//! holds (a common buffer's memory, a mapping's list, the handler's boxes)
//! is the driver's, charged and fallible.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use irpverbs_abi::{
    NtStatus, STATUS_DEVICE_BUSY, STATUS_INSUFFICIENT_RESOURCES, STATUS_INVALID_ADDRESS,
    STATUS_INVALID_DEVICE_STATE, STATUS_INVALID_PARAMETER,
};
use irpverbs_core::platform::{
    Bar, CommonBuffer, DISPATCH_LEVEL, DMA_PAGE_SIZE, DmaDirection, DmaMapping, Interrupt,
    InterruptHandler, LogicalAddress, PASSIVE_LEVEL, PciPlatform, SgElement,
};
use irpverbs_ring::{Region, Shared};

use super::bugcheck::{codes, dma, stop, verifier};
use super::{HostPlatform, heap, irql};

/// Where logical addresses start: far from any host address, so that a
/// device model handed a virtual address by mistake faults at once.
const IOVA_BASE: u64 = 0x0000_7E00_0000_0000;

/// Unmapped mappings remembered, to name them when the device touches
/// them late.
pub const DEAD_KEPT: usize = 4096;

/// Memory BARs a function has.
const BARS: u8 = 6;

/// A BAR's registers, as the device model implements them. Called with the
/// driver's access (offset aligned to its width, inside the BAR), at the
/// driver's IRQL (any, up to DEVICE_LEVEL).
pub trait BarModel: Send + Sync + 'static {
    /// A read of `width` bytes (4 or 8) at `offset`.
    fn read(&self, offset: usize, width: usize) -> u64;
    /// A write of `width` bytes (4 or 8) at `offset`.
    fn write(&self, offset: usize, width: usize, value: u64);
    /// The function's power state changes ([`HostPlatform::set_device_power`]):
    /// `false` before it leaves D0 (from then on the device does no DMA
    /// and raises no message; it returns once work in progress is done),
    /// `true` once it is back in D0. Nothing by default.
    fn power(&self, d0: bool) {
        let _ = d0;
    }
}

/// One run of logical pages of a mapping.
#[derive(Clone, Copy, Debug)]
struct Span {
    mapping: u64,
    /// Where in the mapping's region the run starts.
    offset: usize,
    len: u64,
}

/// A mapping the IOMMU knows.
struct Mapping {
    kind: &'static str,
    direction: DmaDirection,
    bytes: u64,
    /// Its memory; `None` once unmapped.
    region: Option<Shared<Region>>,
    /// The logical address of each of its runs.
    spans: Vec<u64>,
    /// Views the device holds ([`HostPlatform::dma_view`]).
    views: usize,
}

impl Mapping {
    fn describe(&self, id: u64) -> String {
        let state = if self.region.is_some() {
            "live"
        } else {
            "unmapped"
        };
        format!(
            "{} #{id} ({} bytes, {:?}, {state})",
            self.kind, self.bytes, self.direction
        )
    }
}

/// Where a checked access lands: its run, the run's logical start, the
/// live region.
type Landing = (Span, LogicalAddress, Shared<Region>);

/// A refused access: the fault type ([`dma`]), the mapping's id (0: none)
/// and what it was, for people.
type Fault = (u64, u64, String);

/// A BAR the device model installed: its length, its registers, and its
/// memory for a BAR of pages.
type BarEntry = (usize, Arc<dyn BarModel>, Option<Shared<Region>>);

/// A BAR of pages: its registers are its memory's words.
struct PagesBar(Shared<Region>);

impl BarModel for PagesBar {
    fn read(&self, offset: usize, width: usize) -> u64 {
        if width == 8 {
            self.0
                .atomic_u64(offset)
                .map_or(u64::MAX, |w| w.load(Ordering::Acquire))
        } else {
            self.0.atomic_u32(offset).map_or(u64::from(u32::MAX), |w| {
                u64::from(w.load(Ordering::Acquire))
            })
        }
    }
    fn write(&self, offset: usize, width: usize, value: u64) {
        if width == 8 {
            if let Ok(w) = self.0.atomic_u64(offset) {
                w.store(value, Ordering::Release);
            }
        } else if let Ok(w) = self.0.atomic_u32(offset) {
            w.store(value as u32, Ordering::Release);
        }
    }
}

#[derive(Default)]
struct Iommu {
    next_iova: u64,
    next_id: u64,
    spans: BTreeMap<LogicalAddress, Span>,
    mappings: BTreeMap<u64, Mapping>,
    dead: VecDeque<u64>,
}

impl Iommu {
    /// Reserves `pages` logical pages and the guard page after them.
    fn reserve(&mut self, pages: u64) -> LogicalAddress {
        if self.next_iova == 0 {
            self.next_iova = IOVA_BASE;
        }
        let at = self.next_iova;
        self.next_iova += (pages + 1) * DMA_PAGE_SIZE;
        at
    }

    /// Unmaps mapping `id`; the views the device still holds of it, and
    /// what it is.
    fn unmap(&mut self, id: u64) -> (usize, String) {
        let Some(m) = self.mappings.get_mut(&id) else {
            return (0, String::new());
        };
        let viewed = (m.views, m.describe(id));
        m.region = None;
        self.dead.push_back(id);
        while self.dead.len() > DEAD_KEPT {
            let Some(old) = self.dead.pop_front() else {
                break;
            };
            if let Some(m) = self.mappings.remove(&old) {
                for iova in m.spans {
                    self.spans.remove(&iova);
                }
            }
        }
        viewed
    }

    /// The span `[at, at + len)` lies in, checked: its start, the span,
    /// and the live region; or the fault (type, mapping id, description).
    fn translate(&self, at: LogicalAddress, len: usize, write: bool) -> Result<Landing, Fault> {
        let found = self.spans.range(..=at).next_back();
        let Some((&start, &span)) = found else {
            return Err((dma::FAULT_UNMAPPED, 0, "no mapping".into()));
        };
        let Some(m) = self.mappings.get(&span.mapping) else {
            return Err((dma::FAULT_UNMAPPED, 0, "no mapping".into()));
        };
        let end = start + span.len;
        // Described only for a fault: every DMA access translates.
        let name = || m.describe(span.mapping);
        if at >= end {
            // Past a run: its guard page, or beyond anything mapped.
            let (fault, what) = if at < end + DMA_PAGE_SIZE {
                (
                    dma::FAULT_PAST_END,
                    format!("the guard page after {}", name()),
                )
            } else {
                (dma::FAULT_UNMAPPED, "no mapping".into())
            };
            return Err((fault, span.mapping, what));
        }
        let Some(region) = m.region.clone() else {
            return Err((dma::FAULT_AFTER_UNMAP, span.mapping, name()));
        };
        if at + len as u64 > end {
            return Err((
                dma::FAULT_PAST_END,
                span.mapping,
                format!(
                    "{}: {len} bytes at offset {} of a {}-byte run",
                    name(),
                    at - start,
                    span.len
                ),
            ));
        }
        let allowed = if write {
            m.direction.device_writes()
        } else {
            m.direction.device_reads()
        };
        if !allowed {
            return Err((dma::FAULT_DIRECTION, span.mapping, name()));
        }
        Ok((span, start, region))
    }
}

/// A connected message.
#[derive(Clone)]
struct Vector {
    id: u64,
    handler: Shared<Box<dyn InterruptHandler>>,
    dpc: super::Dpc,
}

/// The hardware side of a platform.
#[derive(Default)]
pub(crate) struct Pci {
    iommu: Mutex<Iommu>,
    bars: Mutex<BTreeMap<u8, BarEntry>>,
    messages: AtomicU16,
    vectors: Mutex<BTreeMap<u16, Vector>>,
    /// Messages raised while not connected (dropped).
    stray: AtomicU64,
    next_vector: AtomicU64,
    /// Out of D0 ([`HostPlatform::set_device_power`]); shared with every
    /// mapped BAR.
    asleep: Arc<AtomicBool>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the IOMMU model has seen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IommuStats {
    /// Mappings live now (common buffers and scatter/gather mappings).
    pub live: usize,
    /// Views the device holds ([`HostPlatform::dma_view`]).
    pub views: usize,
    /// Messages raised that no handler was connected to.
    pub stray_messages: u64,
}

impl HostPlatform {
    fn pci(&self) -> &Pci {
        &self.shared.pci
    }

    /// Registers a mapping of `region` for the device, runs of at most
    /// `run` bytes each; its runs' logical addresses and the mapping id.
    fn iommu_map(
        &self,
        kind: &'static str,
        region: &Shared<Region>,
        direction: DmaDirection,
        scattered: bool,
        elements: &mut Vec<SgElement>,
    ) -> u64 {
        heap::uncharged(|| {
            let mut iommu = lock(&self.pci().iommu);
            iommu.next_id += 1;
            let id = iommu.next_id;
            let len = region.len() as u64;
            let mut spans = Vec::new();
            if scattered {
                // The region's pages, each on a logical page of its own
                // (the first at the region's offset in its page).
                let first = region.addr() % DMA_PAGE_SIZE;
                let mut offset = 0u64;
                while offset < len {
                    let in_page = if offset == 0 { first } else { 0 };
                    let n = (DMA_PAGE_SIZE - in_page).min(len - offset);
                    let iova = iommu.reserve(1) + in_page;
                    iommu.spans.insert(
                        iova,
                        Span {
                            mapping: id,
                            offset: offset as usize,
                            len: n,
                        },
                    );
                    spans.push(iova);
                    elements.push(SgElement {
                        address: iova,
                        length: n as u32,
                    });
                    offset += n;
                }
            } else {
                let iova = iommu.reserve(len.div_ceil(DMA_PAGE_SIZE));
                iommu.spans.insert(
                    iova,
                    Span {
                        mapping: id,
                        offset: 0,
                        len,
                    },
                );
                spans.push(iova);
            }
            iommu.mappings.insert(
                id,
                Mapping {
                    kind,
                    direction,
                    bytes: len,
                    region: Some(region.clone()),
                    spans,
                    views: 0,
                },
            );
            id
        })
    }

    /// Unmaps mapping `id`: a bugcheck 0xE6 while the device views it.
    fn iommu_unmap(&self, id: u64) {
        let (views, what) = heap::uncharged(|| lock(&self.pci().iommu).unmap(id));
        if views > 0 && self.shared.verify {
            stop(
                codes::DRIVER_VERIFIER_DMA_VIOLATION,
                [
                    dma::IOMMU_VIOLATION,
                    id,
                    0,
                    dma::FAULT_UNMAPPED_WHILE_VIEWED,
                ],
                format!("{what} unmapped while the device holds {views} view(s) of it"),
            );
        }
    }

    /// The bugcheck (or, verifier off, the status) of a refused access.
    #[track_caller]
    fn dma_fault(&self, at: LogicalAddress, len: usize, write: bool, fault: Fault) -> NtStatus {
        let (fault, mapping, what) = fault;
        if self.shared.verify {
            let dir = if write { "write" } else { "read" };
            stop(
                codes::DRIVER_VERIFIER_DMA_VIOLATION,
                [dma::IOMMU_VIOLATION, mapping, at, fault],
                format!("device DMA {dir} of {len} bytes at {at:#x}: {what}"),
            );
        }
        STATUS_INVALID_ADDRESS
    }

    /// The device's view of `len` bytes of host memory through a page
    /// list (its MMU translating a queue's or a registration's page
    /// table): the first byte `first_offset` bytes into the first page,
    /// `next_page(i)` the logical address of page `i` (page-aligned; the
    /// device reads its page table there). Every page is translated and
    /// checked as a DMA of its bytes in `write`'s direction (and for
    /// reading), and must be the next page of the same mapping (a view is
    /// one piece of host memory). The view is counted against the mapping
    /// until it is dropped: unmapping a mapping the device views is a
    /// bugcheck 0xE6 ([`dma::FAULT_UNMAPPED_WHILE_VIEWED`]).
    ///
    /// Device side; any thread, any IRQL.
    ///
    /// # Errors
    /// An access the IOMMU refuses: a bugcheck 0xE6 with the verifier on,
    /// `STATUS_INVALID_ADDRESS` with it off; `STATUS_INVALID_PARAMETER`
    /// for an empty range, an offset past the first page, a page that is
    /// not page-aligned or does not follow the one before it in the same
    /// mapping; `next_page`'s error.
    #[track_caller]
    pub fn dma_view(
        &self,
        first_offset: usize,
        len: usize,
        write: bool,
        next_page: &mut dyn FnMut(usize) -> Result<LogicalAddress, NtStatus>,
    ) -> Result<Shared<Region>, NtStatus> {
        let page = DMA_PAGE_SIZE as usize;
        if len == 0 || first_offset >= page {
            return Err(STATUS_INVALID_PARAMETER);
        }
        self.check_powered(0, len, write)?;
        let pages = (first_offset + len).div_ceil(page);
        let mut start: Option<(u64, Shared<Region>, usize)> = None;
        for i in 0..pages {
            let base = next_page(i)?;
            if base % DMA_PAGE_SIZE != 0 {
                return Err(STATUS_INVALID_PARAMETER);
            }
            let skip = if i == 0 { first_offset } else { 0 };
            let n = (page - skip).min(first_offset + len - i * page - skip);
            let at = base + skip as u64;
            let found = heap::uncharged(|| {
                let iommu = lock(&self.pci().iommu);
                let landing = iommu.translate(at, n, write)?;
                if write {
                    // A view is read as well.
                    iommu.translate(at, n, false)?;
                }
                Ok(landing)
            });
            let (span, run_start, region) =
                found.map_err(|fault| self.dma_fault(at, n, write, fault))?;
            let offset = span.offset + (at - run_start) as usize;
            match &start {
                None => start = Some((span.mapping, region, offset)),
                Some((mapping, _, first)) => {
                    if *mapping != span.mapping || offset != first + i * page - first_offset {
                        return Err(STATUS_INVALID_PARAMETER);
                    }
                }
            }
        }
        let (mapping, region, offset) = start.ok_or(STATUS_INVALID_PARAMETER)?;
        // Counted before the view exists: its guard uncounts it.
        let counted = heap::uncharged(|| {
            let mut iommu = lock(&self.pci().iommu);
            match iommu.mappings.get_mut(&mapping) {
                Some(m) if m.region.is_some() => {
                    m.views += 1;
                    true
                }
                _ => false,
            }
        });
        if !counted {
            return Err(self.dma_fault(
                first_offset as u64,
                len,
                write,
                (
                    dma::FAULT_AFTER_UNMAP,
                    mapping,
                    format!("mapping #{mapping}"),
                ),
            ));
        }
        let guard = ViewGuard {
            platform: self.clone(),
            mapping,
        };
        let view = heap::uncharged(|| {
            let guard: Box<dyn std::any::Any + Send + Sync> = Box::new(guard);
            let view = Region::sub(region, offset, len, Some(guard))?;
            Shared::try_new(view).ok()
        });
        view.ok_or(STATUS_INSUFFICIENT_RESOURCES)
    }

    /// Checks a device access and returns where it lands, or bugchecks.
    #[track_caller]
    fn dma_target(
        &self,
        at: LogicalAddress,
        len: usize,
        write: bool,
    ) -> Result<(Shared<Region>, usize), NtStatus> {
        self.check_powered(at, len, write)?;
        let found = heap::uncharged(|| lock(&self.pci().iommu).translate(at, len, write));
        match found {
            Ok((span, start, region)) => Ok((region, span.offset + (at - start) as usize)),
            Err(fault) => Err(self.dma_fault(at, len, write, fault)),
        }
    }

    /// The device reads `buf.len()` bytes at logical address `at` (a DMA
    /// from host memory): through the IOMMU model, which bugchecks 0xE6 if
    /// the range is not inside one live mapping the device may read.
    ///
    /// Device side; any thread, any IRQL.
    ///
    /// # Errors
    /// With the verifier off, `STATUS_INVALID_ADDRESS` where it would
    /// bugcheck (nothing is read).
    #[track_caller]
    pub fn dma_read(&self, at: LogicalAddress, buf: &mut [u8]) -> Result<(), NtStatus> {
        let (region, offset) = self.dma_target(at, buf.len(), false)?;
        region.read(offset, buf).map_err(|_| STATUS_INVALID_ADDRESS)
    }

    /// The device writes `buf` at logical address `at` (a DMA into host
    /// memory); as [`Self::dma_read`], for a mapping the device may write.
    ///
    /// # Errors
    /// As [`Self::dma_read`].
    #[track_caller]
    pub fn dma_write(&self, at: LogicalAddress, buf: &[u8]) -> Result<(), NtStatus> {
        let (region, offset) = self.dma_target(at, buf.len(), true)?;
        region
            .write(offset, buf)
            .map_err(|_| STATUS_INVALID_ADDRESS)
    }

    /// The IOMMU model's counts.
    #[must_use]
    pub fn iommu_stats(&self) -> IommuStats {
        heap::uncharged(|| {
            let iommu = lock(&self.pci().iommu);
            IommuStats {
                live: iommu
                    .mappings
                    .values()
                    .filter(|m| m.region.is_some())
                    .count(),
                views: iommu.mappings.values().map(|m| m.views).sum(),
                stray_messages: self.pci().stray.load(Ordering::Relaxed),
            }
        })
    }

    /// The unload's check: every common buffer freed and every
    /// scatter/gather mapping dropped, or a bugcheck 0xE6
    /// ([`dma::RELEASED_WITH_OUTSTANDING`]) naming the first one left.
    pub(crate) fn check_dma_released(&self) {
        let left = heap::uncharged(|| {
            let iommu = lock(&self.pci().iommu);
            let mut live = iommu.mappings.iter().filter(|(_, m)| m.region.is_some());
            let first = live.next().map(|(&id, m)| (id, m.describe(id)));
            first.map(|(id, what)| (id, what, 1 + live.count()))
        });
        if let Some((id, what, count)) = left {
            stop(
                codes::DRIVER_VERIFIER_DMA_VIOLATION,
                [dma::RELEASED_WITH_OUTSTANDING, 0, count as u64, id],
                format!("unload with {count} DMA mapping(s) still out, the first {what}"),
            );
        }
    }

    /// Gives the function memory BAR `index` of `len` bytes whose
    /// registers `model` implements (the device model's side; before the
    /// driver maps it).
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER` for an index past 5, an empty BAR or
    /// one that is there already.
    pub fn install_bar(
        &self,
        index: u8,
        len: usize,
        model: Arc<dyn BarModel>,
    ) -> Result<(), NtStatus> {
        if index >= BARS || len == 0 {
            return Err(STATUS_INVALID_PARAMETER);
        }
        heap::uncharged(|| {
            let mut bars = lock(&self.pci().bars);
            if bars.contains_key(&index) {
                return Err(STATUS_INVALID_PARAMETER);
            }
            bars.insert(index, (len, model, None));
            Ok(())
        })
    }

    /// Gives the function memory BAR `index` of pages: `memory`, the
    /// device model's own (UAR pages a driver maps into processes and the
    /// device scans). The driver reaches it as registers (32/64-bit
    /// accesses of its words) and as memory (`Bar::pages`).
    ///
    /// # Errors
    /// As [`Self::install_bar`]; `STATUS_INVALID_PARAMETER` for memory
    /// that is not whole pages.
    pub fn install_bar_pages(&self, index: u8, memory: Shared<Region>) -> Result<(), NtStatus> {
        let len = memory.len();
        if len == 0 || len % DMA_PAGE_SIZE as usize != 0 || index >= BARS {
            return Err(STATUS_INVALID_PARAMETER);
        }
        heap::uncharged(|| {
            let mut bars = lock(&self.pci().bars);
            if bars.contains_key(&index) {
                return Err(STATUS_INVALID_PARAMETER);
            }
            let model: Arc<dyn BarModel> = Arc::new(PagesBar(memory.clone()));
            bars.insert(index, (len, model, Some(memory)));
            Ok(())
        })
    }

    /// Takes BAR `index` away (the device model's side, when the function
    /// is gone): later `map_bar` calls fail; a BAR already mapped keeps
    /// its registers until it is dropped. Returns whether it was there.
    pub fn remove_bar(&self, index: u8) -> bool {
        let model = heap::uncharged(|| lock(&self.pci().bars).remove(&index));
        model.is_some()
    }

    /// The function's power state, as the PCI bus driver sets it (its
    /// power management control register) after the driver's D0Exit and
    /// before its D0Entry: `false` puts it in D3hot, `true` back in D0.
    /// Each BAR's model is told ([`BarModel::power`]: before the change
    /// going down, after it coming up). Out of D0:
    ///
    /// - a register access of the driver (a mapped BAR's read or write)
    ///   is a bugcheck 0xC4 ([`verifier::HOST_REGISTER_ACCESS_OUT_OF_D0`]):
    ///   a device in D3hot answers configuration cycles only, so the
    ///   write is lost and the read is all ones;
    /// - a DMA of the device ([`Self::dma_read`], [`Self::dma_write`],
    ///   [`Self::dma_view`]) or an MSI-X message is a bugcheck 0xE6
    ///   ([`dma::FAULT_POWERED_DOWN`]): a device in D3hot does not master
    ///   the bus.
    ///
    /// With the verifier off the access fails instead
    /// (`STATUS_INVALID_DEVICE_STATE`, a message is dropped).
    ///
    /// IRQL: PASSIVE_LEVEL (a power IRP's completion).
    pub fn set_device_power(&self, d0: bool) {
        let models: Vec<Arc<dyn BarModel>> = heap::uncharged(|| {
            lock(&self.pci().bars)
                .values()
                .map(|b| b.1.clone())
                .collect()
        });
        if d0 {
            self.pci().asleep.store(false, Ordering::SeqCst);
            for m in &models {
                m.power(true);
            }
        } else {
            for m in &models {
                m.power(false);
            }
            self.pci().asleep.store(true, Ordering::SeqCst);
        }
    }

    /// Whether the function is in D0 ([`Self::set_device_power`]).
    #[must_use]
    pub fn device_in_d0(&self) -> bool {
        !self.pci().asleep.load(Ordering::SeqCst)
    }

    /// A DMA (or a message) of the device: refused out of D0.
    fn check_powered(&self, at: LogicalAddress, len: usize, write: bool) -> Result<(), NtStatus> {
        if !self.pci().asleep.load(Ordering::SeqCst) {
            return Ok(());
        }
        if self.shared.verify {
            let dir = if write { "write" } else { "read" };
            stop(
                codes::DRIVER_VERIFIER_DMA_VIOLATION,
                [dma::IOMMU_VIOLATION, 0, at, dma::FAULT_POWERED_DOWN],
                format!(
                    "device DMA {dir} of {len} bytes at {at:#x} while the function is in D3 \
                     (a device out of D0 does not master the bus: it was not quiesced)"
                ),
            );
        }
        Err(STATUS_INVALID_DEVICE_STATE)
    }

    /// Grants the function `messages` MSI-X messages (the device model's
    /// side: what its MSI-X table holds).
    pub fn grant_msix(&self, messages: u16) {
        self.pci().messages.store(messages, Ordering::Release);
    }

    /// The device signals MSI-X message `message`: its ISR runs now at
    /// DEVICE_LEVEL on this thread and, if it asks, its DPC at
    /// DISPATCH_LEVEL once the interrupt returns. A message no handler is
    /// connected to is dropped (counted in [`IommuStats::stray_messages`]).
    /// Returns whether a handler ran. A message is a DMA write: out of D0
    /// it is a bugcheck 0xE6 ([`dma::FAULT_POWERED_DOWN`]).
    ///
    /// Device side; IRQL: <= DEVICE_LEVEL.
    pub fn raise_msix(&self, message: u16) -> bool {
        if self.check_powered(u64::from(message), 0, true).is_err() {
            return false;
        }
        let vector = heap::uncharged(|| lock(&self.pci().vectors).get(&message).cloned());
        let Some(vector) = vector else {
            self.pci().stray.fetch_add(1, Ordering::Relaxed);
            return false;
        };
        self.interrupt(|| {
            if vector.handler.isr(message) {
                vector.dpc.insert();
            }
        });
        true
    }
}

/// What a device's view holds besides the memory: its count on the
/// mapping, given back when the view is dropped.
struct ViewGuard {
    platform: HostPlatform,
    mapping: u64,
}

impl Drop for ViewGuard {
    fn drop(&mut self) {
        heap::uncharged(|| {
            let mut iommu = lock(&self.platform.pci().iommu);
            if let Some(m) = iommu.mappings.get_mut(&self.mapping) {
                m.views = m.views.saturating_sub(1);
            }
        });
    }
}

/// A common buffer: page-rounded zeroed memory and its run of logical
/// pages.
pub struct HostCommonBuffer {
    region: Shared<Region>,
    logical: LogicalAddress,
    id: u64,
    platform: HostPlatform,
}

impl std::fmt::Debug for HostCommonBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostCommonBuffer")
            .field("logical", &format_args!("{:#x}", self.logical))
            .field("len", &self.region.len())
            .finish_non_exhaustive()
    }
}

impl CommonBuffer for HostCommonBuffer {
    fn region(&self) -> &Shared<Region> {
        &self.region
    }
    fn logical_address(&self) -> LogicalAddress {
        self.logical
    }
}

impl Drop for HostCommonBuffer {
    /// Unmaps it (the memory goes with the region's last reference).
    fn drop(&mut self) {
        irql::check_irql_at_most(
            self.platform.shared.verify,
            PASSIVE_LEVEL,
            "WdfObjectDelete(WDFCOMMONBUFFER)",
        );
        self.platform.iommu_unmap(self.id);
    }
}

/// A scatter/gather mapping: one element per page of the region.
pub struct HostDmaMapping {
    elements: Vec<SgElement>,
    direction: DmaDirection,
    id: u64,
    platform: HostPlatform,
}

impl std::fmt::Debug for HostDmaMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostDmaMapping")
            .field("direction", &self.direction)
            .field("elements", &self.elements.len())
            .finish_non_exhaustive()
    }
}

impl DmaMapping for HostDmaMapping {
    fn direction(&self) -> DmaDirection {
        self.direction
    }
    fn elements(&self) -> &[SgElement] {
        &self.elements
    }
}

impl Drop for HostDmaMapping {
    fn drop(&mut self) {
        irql::check_irql_at_most(
            self.platform.shared.verify,
            DISPATCH_LEVEL,
            "PutScatterGatherList",
        );
        self.platform.iommu_unmap(self.id);
    }
}

/// A mapped BAR: each access calls the device model.
pub struct HostBar {
    index: u8,
    len: usize,
    model: Arc<dyn BarModel>,
    pages: Option<Shared<Region>>,
    /// The function's power state (the platform's).
    asleep: Arc<AtomicBool>,
    verify: bool,
}

impl std::fmt::Debug for HostBar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBar")
            .field("index", &self.index)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl HostBar {
    /// An access of `width` bytes at `offset`: inside the BAR, aligned,
    /// and to a function in D0 ([`HostPlatform::set_device_power`]).
    #[track_caller]
    fn check(&self, offset: usize, width: usize) -> Result<(), NtStatus> {
        if offset % width != 0 || offset.checked_add(width).is_none_or(|end| end > self.len) {
            return Err(STATUS_INVALID_PARAMETER);
        }
        if self.asleep.load(Ordering::SeqCst) {
            if self.verify {
                stop(
                    codes::DRIVER_VERIFIER_DETECTED_VIOLATION,
                    [
                        verifier::HOST_REGISTER_ACCESS_OUT_OF_D0,
                        u64::from(self.index),
                        offset as u64,
                        width as u64,
                    ],
                    format!(
                        "register access of {width} bytes at {offset:#x} of BAR {} while the \
                         function is in D3 (after D0Exit, before D0Entry)",
                        self.index
                    ),
                );
            }
            return Err(STATUS_INVALID_DEVICE_STATE);
        }
        Ok(())
    }
}

impl Bar for HostBar {
    fn len(&self) -> usize {
        self.len
    }
    fn read32(&self, offset: usize) -> Result<u32, NtStatus> {
        self.check(offset, 4)?;
        Ok(self.model.read(offset, 4) as u32)
    }
    fn write32(&self, offset: usize, value: u32) -> Result<(), NtStatus> {
        self.check(offset, 4)?;
        self.model.write(offset, 4, value.into());
        Ok(())
    }
    fn read64(&self, offset: usize) -> Result<u64, NtStatus> {
        self.check(offset, 8)?;
        Ok(self.model.read(offset, 8))
    }
    fn write64(&self, offset: usize, value: u64) -> Result<(), NtStatus> {
        self.check(offset, 8)?;
        self.model.write(offset, 8, value);
        Ok(())
    }
    fn pages(&self) -> Option<&Shared<Region>> {
        self.pages.as_ref()
    }
}

/// A connected MSI-X message; dropping it disconnects it.
pub struct HostInterrupt {
    message: u16,
    id: u64,
    platform: HostPlatform,
}

impl std::fmt::Debug for HostInterrupt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostInterrupt")
            .field("message", &self.message)
            .finish_non_exhaustive()
    }
}

impl Interrupt for HostInterrupt {
    fn message(&self) -> u16 {
        self.message
    }
}

impl Drop for HostInterrupt {
    fn drop(&mut self) {
        heap::uncharged(|| {
            let mut vectors = lock(&self.platform.pci().vectors);
            if vectors.get(&self.message).is_some_and(|v| v.id == self.id) {
                vectors.remove(&self.message);
            }
        });
    }
}

impl PciPlatform for HostPlatform {
    type CommonBuffer = HostCommonBuffer;
    type DmaMapping = HostDmaMapping;
    type Bar = HostBar;
    type Interrupt = HostInterrupt;

    fn alloc_common_buffer(&self, length: usize) -> Result<HostCommonBuffer, NtStatus> {
        irql::check_irql_at_most(self.shared.verify, PASSIVE_LEVEL, "WdfCommonBufferCreate");
        let page = DMA_PAGE_SIZE as usize;
        if length == 0 {
            return Err(STATUS_INVALID_PARAMETER);
        }
        let bytes = length
            .checked_next_multiple_of(page)
            .ok_or(STATUS_INVALID_PARAMETER)?;
        let region = Region::alloc(bytes).ok_or(STATUS_INSUFFICIENT_RESOURCES)?;
        let region = Shared::try_new(region).map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        let mut none = Vec::new();
        let id = self.iommu_map(
            "common buffer",
            &region,
            DmaDirection::Bidirectional,
            false,
            &mut none,
        );
        let logical = heap::uncharged(|| {
            let iommu = lock(&self.pci().iommu);
            iommu
                .mappings
                .get(&id)
                .and_then(|m| m.spans.first().copied())
        })
        .unwrap_or_default();
        Ok(HostCommonBuffer {
            region,
            logical,
            id,
            platform: self.clone(),
        })
    }

    fn map_dma(
        &self,
        region: &Shared<Region>,
        direction: DmaDirection,
    ) -> Result<HostDmaMapping, NtStatus> {
        irql::check_irql_at_most(self.shared.verify, DISPATCH_LEVEL, "GetScatterGatherList");
        if region.is_empty() {
            return Err(STATUS_INVALID_PARAMETER);
        }
        // One element per page touched: the list is the driver's memory.
        let first = region.addr() % DMA_PAGE_SIZE;
        let pages = (first + region.len() as u64).div_ceil(DMA_PAGE_SIZE);
        let mut elements = Vec::new();
        elements
            .try_reserve_exact(pages as usize)
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        // Within the room just taken: the IOMMU's pushes do not allocate.
        let id = self.iommu_map(
            "scatter/gather mapping",
            region,
            direction,
            true,
            &mut elements,
        );
        Ok(HostDmaMapping {
            elements,
            direction,
            id,
            platform: self.clone(),
        })
    }

    fn map_bar(&self, index: u8) -> Result<HostBar, NtStatus> {
        irql::check_irql_at_most(self.shared.verify, PASSIVE_LEVEL, "MmMapIoSpaceEx");
        let bar = heap::uncharged(|| lock(&self.pci().bars).get(&index).cloned());
        let (len, model, pages) = bar.ok_or(STATUS_INVALID_PARAMETER)?;
        Ok(HostBar {
            index,
            len,
            model,
            pages,
            asleep: Arc::clone(&self.pci().asleep),
            verify: self.shared.verify,
        })
    }

    fn msix_messages(&self) -> u16 {
        self.pci().messages.load(Ordering::Acquire)
    }

    fn connect_interrupt<H: InterruptHandler>(
        &self,
        message: u16,
        handler: H,
    ) -> Result<HostInterrupt, NtStatus> {
        irql::check_irql_at_most(self.shared.verify, PASSIVE_LEVEL, "WdfInterruptCreate");
        if message >= self.msix_messages() {
            return Err(STATUS_INVALID_PARAMETER);
        }
        if heap::uncharged(|| lock(&self.pci().vectors).contains_key(&message)) {
            return Err(STATUS_DEVICE_BUSY);
        }
        let boxed: Box<dyn InterruptHandler> =
            irpverbs_ring::try_box(handler).map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        let handler = Shared::try_new(boxed).map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        let id = self.pci().next_vector.fetch_add(1, Ordering::Relaxed);
        let for_dpc = handler.clone();
        let vector = heap::uncharged(|| Vector {
            id,
            handler,
            dpc: self.new_dpc(move || for_dpc.dpc(message)),
        });
        let connected = heap::uncharged(|| {
            let mut vectors = lock(&self.pci().vectors);
            if vectors.contains_key(&message) {
                return false;
            }
            vectors.insert(message, vector);
            true
        });
        if !connected {
            return Err(STATUS_DEVICE_BUSY);
        }
        Ok(HostInterrupt {
            message,
            id,
            platform: self.clone(),
        })
    }
}
