//! The hardware seam on Windows: [`PciPlatform`] over KMDF, for a PCI
//! HCA's backend.
//!
//! | seam | KMDF |
//! |------|------|
//! | the device's DMA | a DMA enabler, `WdfDmaEnablerCreate` with the 64-bit scatter/gather profile ([`KmdfPci::new`], at device add) |
//! | `alloc_common_buffer` | `WdfCommonBufferCreate`; `WdfCommonBufferGetAlignedVirtualAddress` / `...LogicalAddress`; `WdfObjectDelete` when dropped |
//! | `map_dma` | a DMA transaction per [`MAX_TRANSFER`] bytes of the region (`WdfDmaTransactionCreate`, `WdfDmaTransactionInitialize` over the region's MDL, `WdfDmaTransactionExecute`), its scatter/gather list copied out of `EvtProgramDma`; when dropped `WdfDmaTransactionDmaCompletedFinal`, `WdfDmaTransactionRelease`, `WdfObjectDelete` |
//! | `map_bar` | `MmMapIoSpaceEx(PAGE_READWRITE \| PAGE_NOCACHE)` of the memory resource; `MmUnmapIoSpace` when dropped; registers read and written volatile |
//! | `connect_interrupt` | `WdfInterruptCreate` with `EvtInterruptIsr` (which calls `WdfInterruptQueueDpcForIsr` when the handler asks) and `EvtInterruptDpc` |
//!
//! The region's MDL: a user buffer pinned for a registration has its own
//! (locked by `MmProbeAndLockPages`, [`crate::mdl::pinned_mdl`]); kernel
//! memory (the driver's queues, a kernel ULP's nonpaged buffer) gets one
//! built with `MmBuildMdlForNonPagedPool`, kept with the mapping.
//!
//! The bus resources (memory BARs, MSI-X messages) are the translated
//! resources `EvtDevicePrepareHardware` receives ([`PciResources::from_lists`]),
//! which the backend's glue gives [`KmdfPci::new`]. A backend connects its
//! messages there too ([`KmdfPci::prepare_hardware`]): an interrupt object
//! created in `EvtDevicePrepareHardware` names its message's raw and
//! translated descriptors (`WDF_INTERRUPT_CONFIG`'s `InterruptRaw`,
//! `InterruptTranslated`), found by the message's place among the
//! message-signalled interrupt descriptors; one created at device add
//! names none, and the framework assigns messages in creation order.
//! KMDF deletes a device's interrupts with the device: dropping an
//! [`KmdfInterrupt`] disconnects its handler (the ISR then claims nothing),
//! and the handler is freed with the interrupt object.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::ffi::c_void;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

use irpverbs_abi::{
    IvRingMap, NtStatus, STATUS_DEVICE_BUSY, STATUS_INSUFFICIENT_RESOURCES,
    STATUS_INVALID_PARAMETER, nt_success,
};
use irpverbs_core::platform::{
    Bar, CommonBuffer, DMA_PAGE_SIZE, DmaDirection, DmaMapping, Interrupt, InterruptHandler,
    LogicalAddress, PciPlatform, SgElement,
};
use irpverbs_core::{Irql, LockClass, Platform, PoolCharge, PoolTag};
use irpverbs_ring::{Region, Ring, Shared};
use wdk_sys::ntddk::{
    MmBuildMdlForNonPagedPool, MmMapIoSpaceEx, MmUnmapIoSpace, RtlCMDecodeMemIoResource,
};
use wdk_sys::{
    _WDF_DMA_DIRECTION, _WDF_DMA_PROFILE, _WDF_TRI_STATE, BOOLEAN, CM_RESOURCE_INTERRUPT_MESSAGE,
    CmResourceTypeInterrupt, CmResourceTypeMemory, CmResourceTypeMemoryLarge, LARGE_INTEGER,
    NTSTATUS, PAGE_NOCACHE, PAGE_READWRITE, PCM_PARTIAL_RESOURCE_DESCRIPTOR, PMDL,
    PSCATTER_GATHER_LIST, ULONG, WDF_DMA_DIRECTION, WDF_DMA_ENABLER_CONFIG, WDF_INTERRUPT_CONFIG,
    WDFCMRESLIST, WDFCOMMONBUFFER, WDFCONTEXT, WDFDEVICE, WDFDMAENABLER, WDFDMATRANSACTION,
    WDFINTERRUPT, WDFOBJECT, call_unsafe_wdf_function_binding,
};

use crate::context::{context_type, object_attributes, struct_size};
use crate::mdl::{Mdl, UserMapping, pinned_mdl};
use crate::platform::{KmdfPlatform, KmdfSpinLock};
use crate::request::KmdfRequest;

/// The longest DMA transfer the enabler is configured for; a longer
/// region is mapped as several transactions.
pub const MAX_TRANSFER: usize = 64 << 20;

/// Most MSI-X messages the glue connects (its bookkeeping is one word).
pub const MAX_MESSAGES: u16 = 64;

/// Memory BARs a function has.
const BARS: usize = 6;

/// The device's bus resources, from the translated resource list of
/// `EvtDevicePrepareHardware`.
#[derive(Clone, Copy, Debug, Default)]
pub struct PciResources {
    /// Each memory BAR's physical address and length (0: none), by BAR
    /// number.
    pub bars: [(i64, usize); BARS],
    /// The MSI-X messages granted (the message-signalled interrupt
    /// descriptors: one per MSI-X message).
    pub messages: u16,
    /// The BARs of pages the driver maps into processes (bit `n`: BAR
    /// `n`; a device's doorbell (UAR) pages): [`Bar::pages`] gives their
    /// memory, and a page of it is mapped into a process uncached.
    pub pages: u8,
}

/// Whether `d` is a message-signalled interrupt descriptor.
///
/// # Safety
/// `d` is null or a live descriptor of a resource list.
unsafe fn is_message(d: PCM_PARTIAL_RESOURCE_DESCRIPTOR) -> bool {
    // SAFETY: null or live (caller).
    let Some(d) = (unsafe { d.as_ref() }) else {
        return false;
    };
    u32::from(d.Type) == CmResourceTypeInterrupt
        && u32::from(d.Flags) & CM_RESOURCE_INTERRUPT_MESSAGE != 0
}

impl PciResources {
    /// The memory BARs and MSI-X messages of `translated`: the `n`th
    /// memory resource (`CmResourceTypeMemory` or
    /// `CmResourceTypeMemoryLarge`, decoded by `RtlCMDecodeMemIoResource`)
    /// is BAR `bar_numbers[n]` (the device's layout says which: a 64-bit
    /// BAR takes two numbers, and the list does not carry them); further
    /// memory resources are ignored. Each message-signalled interrupt
    /// descriptor is a message.
    ///
    /// IRQL: PASSIVE_LEVEL (`EvtDevicePrepareHardware`).
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER` for a BAR number past 5 or a BAR longer
    /// than the address space.
    ///
    /// # Safety
    /// `translated` must be the framework's translated resource list of
    /// the current `EvtDevicePrepareHardware`.
    pub unsafe fn from_lists(
        translated: WDFCMRESLIST,
        bar_numbers: &[u8],
    ) -> Result<Self, NtStatus> {
        let mut resources = Self::default();
        let mut memory = 0;
        // SAFETY: the live list (caller).
        let count =
            unsafe { call_unsafe_wdf_function_binding!(WdfCmResourceListGetCount, translated) };
        for i in 0..count {
            // SAFETY: as above; `i` is below its count.
            let d = unsafe {
                call_unsafe_wdf_function_binding!(WdfCmResourceListGetDescriptor, translated, i)
            };
            // SAFETY: null or a live descriptor of the list.
            if unsafe { is_message(d) } {
                resources.messages = resources.messages.saturating_add(1);
                continue;
            }
            // SAFETY: as above.
            let Some(kind) = (unsafe { d.as_ref() }).map(|d| u32::from(d.Type)) else {
                continue;
            };
            if kind != CmResourceTypeMemory && kind != CmResourceTypeMemoryLarge {
                continue;
            }
            let Some(&bar) = bar_numbers.get(memory) else {
                continue;
            };
            memory += 1;
            let mut start = 0u64;
            // SAFETY: a live memory descriptor; `start` is ours to fill.
            let len = unsafe { RtlCMDecodeMemIoResource(d, &raw mut start) };
            let slot = resources
                .bars
                .get_mut(usize::from(bar))
                .ok_or(STATUS_INVALID_PARAMETER)?;
            *slot = (
                i64::try_from(start).map_err(|_| STATUS_INVALID_PARAMETER)?,
                usize::try_from(len).map_err(|_| STATUS_INVALID_PARAMETER)?,
            );
        }
        Ok(resources)
    }
}

/// What the seam's clones share: the connected messages and, during
/// `EvtDevicePrepareHardware`, its resource lists.
struct PciShared {
    /// Connected messages, one bit each.
    connected: AtomicU64,
    /// The raw and translated lists (`WDFCMRESLIST`) while
    /// `EvtDevicePrepareHardware` runs; null otherwise.
    raw: AtomicPtr<c_void>,
    translated: AtomicPtr<c_void>,
}

/// The seam for one device: its DMA enabler and resources. The rest of
/// [`Platform`] is [`KmdfPlatform`]'s. Clones are the same device's seam
/// (a backend keeps one in its HCA).
#[derive(Clone)]
pub struct KmdfPci {
    device: WDFDEVICE,
    enabler: WDFDMAENABLER,
    resources: PciResources,
    shared: Shared<PciShared>,
}

// SAFETY: the handles are framework objects, usable from any thread at the
// IRQL each call allows; the shared state is atomic.
unsafe impl Send for KmdfPci {}
// SAFETY: as above.
unsafe impl Sync for KmdfPci {}

fn check(status: NTSTATUS) -> Result<(), NtStatus> {
    if nt_success(status) {
        Ok(())
    } else {
        Err(status)
    }
}

impl KmdfPci {
    /// Creates `device`'s DMA enabler (64-bit scatter/gather, transfers up
    /// to [`MAX_TRANSFER`]) and keeps `resources`.
    ///
    /// IRQL: PASSIVE_LEVEL (`WdfDmaEnablerCreate`: device add or prepare
    /// hardware).
    ///
    /// # Errors
    /// `WdfDmaEnablerCreate`'s (`STATUS_INSUFFICIENT_RESOURCES`, ...);
    /// `STATUS_INVALID_PARAMETER` for more than [`MAX_MESSAGES`] messages.
    ///
    /// # Safety
    /// `device` must be the live device the resources are for; the enabler
    /// is its child and lives as long as it.
    pub unsafe fn new(device: WDFDEVICE, resources: PciResources) -> Result<Self, NtStatus> {
        if resources.messages > MAX_MESSAGES {
            return Err(STATUS_INVALID_PARAMETER);
        }
        let shared = Shared::try_new(PciShared {
            connected: AtomicU64::new(0),
            raw: AtomicPtr::new(core::ptr::null_mut()),
            translated: AtomicPtr::new(core::ptr::null_mut()),
        })
        .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        let mut config = WDF_DMA_ENABLER_CONFIG {
            Size: struct_size::<WDF_DMA_ENABLER_CONFIG>(),
            Profile: _WDF_DMA_PROFILE::WdfDmaProfileScatterGather64,
            MaximumLength: MAX_TRANSFER,
            ..WDF_DMA_ENABLER_CONFIG::default()
        };
        let mut attributes = object_attributes();
        attributes.ParentObject = device.cast();
        let mut enabler: WDFDMAENABLER = core::ptr::null_mut();
        // SAFETY: a live device (caller); the configuration is initialized
        // as WDF_DMA_ENABLER_CONFIG_INIT does; PASSIVE_LEVEL.
        check(unsafe {
            call_unsafe_wdf_function_binding!(
                WdfDmaEnablerCreate,
                device,
                &raw mut config,
                &raw mut attributes,
                &raw mut enabler
            )
        })?;
        Ok(Self {
            device,
            enabler,
            resources,
            shared,
        })
    }

    /// Runs `start` (a backend's start: it connects its messages) with the
    /// resource lists of the current `EvtDevicePrepareHardware` known to
    /// [`PciPlatform::connect_interrupt`], and forgets them afterwards.
    ///
    /// IRQL: PASSIVE_LEVEL.
    ///
    /// # Safety
    /// `raw` and `translated` must be the framework's lists of the current
    /// `EvtDevicePrepareHardware` of this seam's device, valid for the
    /// call.
    pub unsafe fn prepare_hardware<T>(
        &self,
        raw: WDFCMRESLIST,
        translated: WDFCMRESLIST,
        start: impl FnOnce() -> T,
    ) -> T {
        self.shared.raw.store(raw.cast(), Ordering::Release);
        self.shared
            .translated
            .store(translated.cast(), Ordering::Release);
        let result = start();
        self.shared
            .translated
            .store(core::ptr::null_mut(), Ordering::Release);
        self.shared
            .raw
            .store(core::ptr::null_mut(), Ordering::Release);
        result
    }

    /// The raw and translated descriptors of message `message` (its place
    /// among the translated list's message-signalled interrupt
    /// descriptors; the raw list has the same entries in the same order),
    /// while [`Self::prepare_hardware`] runs; nulls otherwise.
    fn message_descriptors(
        &self,
        message: u16,
    ) -> (
        PCM_PARTIAL_RESOURCE_DESCRIPTOR,
        PCM_PARTIAL_RESOURCE_DESCRIPTOR,
    ) {
        let none = (core::ptr::null_mut(), core::ptr::null_mut());
        let raw: WDFCMRESLIST = self.shared.raw.load(Ordering::Acquire).cast();
        let translated: WDFCMRESLIST = self.shared.translated.load(Ordering::Acquire).cast();
        if raw.is_null() || translated.is_null() {
            return none;
        }
        // SAFETY: lists of the running EvtDevicePrepareHardware
        // (prepare_hardware's contract).
        let count =
            unsafe { call_unsafe_wdf_function_binding!(WdfCmResourceListGetCount, translated) };
        let mut seen = 0u16;
        for i in 0..count {
            // SAFETY: as above; `i` below the count.
            let d = unsafe {
                call_unsafe_wdf_function_binding!(WdfCmResourceListGetDescriptor, translated, i)
            };
            // SAFETY: null or a live descriptor of the list.
            if !unsafe { is_message(d) } {
                continue;
            }
            if seen == message {
                // SAFETY: as above; the raw list has the same entries.
                let r = unsafe {
                    call_unsafe_wdf_function_binding!(WdfCmResourceListGetDescriptor, raw, i)
                };
                return (r, d);
            }
            seen += 1;
        }
        none
    }
}

impl Platform for KmdfPci {
    type Request = KmdfRequest;
    type Lock<T: Send> = KmdfSpinLock<T>;
    type Mapping = UserMapping;

    fn new_lock<T: Send>(&self, class: &'static LockClass, value: T) -> KmdfSpinLock<T> {
        KmdfPlatform.new_lock(class, value)
    }
    fn irql(&self) -> Irql {
        KmdfPlatform.irql()
    }
    fn now_ns(&self) -> u64 {
        KmdfPlatform.now_ns()
    }
    fn pool_charge(&self, tag: PoolTag, bytes: usize) -> Result<PoolCharge, NtStatus> {
        KmdfPlatform.pool_charge(tag, bytes)
    }
    fn pool_release(&self, charge: PoolCharge) {
        KmdfPlatform.pool_release(charge);
    }
    fn pin_memory(
        &self,
        request: &KmdfRequest,
        addr: u64,
        length: u64,
        write: bool,
        physical: bool,
    ) -> Result<Shared<Region>, NtStatus> {
        KmdfPlatform.pin_memory(request, addr, length, write, physical)
    }
    fn map_ring(
        &self,
        request: &KmdfRequest,
        ring: &Ring,
    ) -> Result<(IvRingMap, UserMapping), NtStatus> {
        KmdfPlatform.map_ring(request, ring)
    }
    fn map_doorbell_page(
        &self,
        request: &KmdfRequest,
        page: &Shared<Region>,
    ) -> Result<(u64, UserMapping), NtStatus> {
        KmdfPlatform.map_doorbell_page(request, page)
    }
    fn unmap_ring(&self, mapping: UserMapping) {
        KmdfPlatform.unmap_ring(mapping);
    }
}

// ------------------------------------------------------------ common buffers

/// A `WDFCOMMONBUFFER` and the region over its virtual address.
pub struct KmdfCommonBuffer {
    region: Shared<Region>,
    logical: LogicalAddress,
    buffer: WDFCOMMONBUFFER,
}

// SAFETY: the buffer handle is only deleted, once, in the drop; the region
// is Send + Sync.
unsafe impl Send for KmdfCommonBuffer {}
// SAFETY: as above.
unsafe impl Sync for KmdfCommonBuffer {}

impl CommonBuffer for KmdfCommonBuffer {
    fn region(&self) -> &Shared<Region> {
        &self.region
    }
    fn logical_address(&self) -> LogicalAddress {
        self.logical
    }
}

impl Drop for KmdfCommonBuffer {
    /// `WdfObjectDelete`. IRQL: PASSIVE_LEVEL.
    fn drop(&mut self) {
        // SAFETY: the buffer this object created, deleted once; the
        // region over it is this object's (the core drops its users first:
        // the common buffer's owner holds the only reference that reaches
        // the memory past the device, which was told to stop).
        unsafe { call_unsafe_wdf_function_binding!(WdfObjectDelete, self.buffer.cast()) };
    }
}

// ------------------------------------------------------------ DMA mappings

/// What `EvtProgramDma` fills: the list's room (taken before), and whether
/// it ran.
struct Capture {
    elements: *mut Vec<SgElement>,
    programmed: AtomicBool,
    overflow: AtomicBool,
}

/// `EvtProgramDma`: copies the transfer's scatter/gather list into the
/// mapping's list (whose room was taken before the transaction ran: no
/// allocation here) and "programs" nothing: the device gets the list from
/// the backend (an MTT).
///
/// IRQL: DISPATCH_LEVEL.
///
/// # Safety
/// Called by the framework with the context [`map_transfer`] gave
/// `WdfDmaTransactionExecute`.
unsafe extern "C" fn evt_program_dma(
    _transaction: WDFDMATRANSACTION,
    _device: WDFDEVICE,
    context: WDFCONTEXT,
    _direction: WDF_DMA_DIRECTION,
    list: PSCATTER_GATHER_LIST,
) -> BOOLEAN {
    // SAFETY: the context is the Capture `map_transfer` keeps alive until
    // this callback has run or was cancelled.
    let capture = unsafe { &*context.cast_const().cast::<Capture>() };
    // SAFETY: the list vector is the mapping's, not touched elsewhere while
    // the transfer runs (the caller waits for `programmed`).
    let elements = unsafe { &mut *capture.elements };
    // SAFETY: the framework passes a valid list for this callback's
    // duration.
    let count = unsafe { (*list).NumberOfElements } as usize;
    // SAFETY: as above: `Elements` holds `NumberOfElements` entries.
    let first = unsafe { (*list).Elements.as_ptr() };
    for i in 0..count {
        if elements.len() == elements.capacity() {
            capture.overflow.store(true, Ordering::Release);
            break;
        }
        // SAFETY: `i < NumberOfElements`: inside the list.
        let at = unsafe { first.add(i) };
        // SAFETY: an initialized element of the list.
        let e = unsafe { *at };
        elements.push(SgElement {
            // SAFETY: PHYSICAL_ADDRESS is a LARGE_INTEGER; QuadPart is the
            // whole 64-bit value.
            address: unsafe { e.Address.QuadPart } as u64,
            length: e.Length,
        });
    }
    capture.programmed.store(true, Ordering::Release);
    1
}

/// A scatter/gather mapping: its transactions and the list they gave.
pub struct KmdfDmaMapping {
    elements: Vec<SgElement>,
    direction: DmaDirection,
    transactions: Vec<WDFDMATRANSACTION>,
    /// The MDL built over kernel memory (none for a user pin's own).
    _built: Option<Mdl>,
    /// Keeps the memory (and a pin's MDL) alive while mapped.
    region: Shared<Region>,
}

// SAFETY: the transactions are only completed and deleted, once, in the
// drop; the rest is plain data and a Send + Sync region.
unsafe impl Send for KmdfDmaMapping {}
// SAFETY: as above.
unsafe impl Sync for KmdfDmaMapping {}

impl DmaMapping for KmdfDmaMapping {
    fn direction(&self) -> DmaDirection {
        self.direction
    }
    fn elements(&self) -> &[SgElement] {
        &self.elements
    }
}

/// Completes, releases and deletes a transaction that ran.
///
/// # Safety
/// `transaction` is a live transaction of ours whose `EvtProgramDma` ran,
/// finished with once.
unsafe fn finish(transaction: WDFDMATRANSACTION, length: usize) {
    let mut status: NTSTATUS = 0;
    // SAFETY: the caller's contract; the whole transfer is reported done.
    let _ = unsafe {
        call_unsafe_wdf_function_binding!(
            WdfDmaTransactionDmaCompletedFinal,
            transaction,
            length,
            &raw mut status
        )
    };
    // SAFETY: completed just above; the map registers and list go back.
    unsafe { call_unsafe_wdf_function_binding!(WdfDmaTransactionRelease, transaction) };
    // SAFETY: released; deleted once.
    unsafe { call_unsafe_wdf_function_binding!(WdfObjectDelete, transaction.cast()) };
}

impl Drop for KmdfDmaMapping {
    /// Each transaction completed, released, deleted.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    fn drop(&mut self) {
        let total = self.region.len();
        for (i, &t) in self.transactions.iter().enumerate() {
            let length = total.saturating_sub(i * MAX_TRANSFER).min(MAX_TRANSFER);
            // SAFETY: each transaction of this mapping ran its EvtProgramDma
            // (map_dma keeps only those) and is finished once, here.
            unsafe { finish(t, length) };
        }
    }
}

impl KmdfPci {
    /// Runs one transaction over `length` bytes at `va` of `mdl`, its list
    /// appended to `elements`.
    ///
    /// # Safety
    /// `mdl` describes `va..va + length`, locked or nonpaged, alive while
    /// the transaction is.
    unsafe fn map_transfer(
        &self,
        mdl: PMDL,
        va: *mut c_void,
        length: usize,
        direction: WDF_DMA_DIRECTION,
        elements: &mut Vec<SgElement>,
    ) -> Result<WDFDMATRANSACTION, NtStatus> {
        let mut transaction: WDFDMATRANSACTION = core::ptr::null_mut();
        // SAFETY: our live enabler; no attributes (parent: the enabler);
        // IRQL <= DISPATCH_LEVEL.
        check(unsafe {
            call_unsafe_wdf_function_binding!(
                WdfDmaTransactionCreate,
                self.enabler,
                core::ptr::null_mut(),
                &raw mut transaction
            )
        })?;
        let delete = |t: WDFDMATRANSACTION| {
            // SAFETY: created above, not executed (or cancelled): deleted once.
            unsafe { call_unsafe_wdf_function_binding!(WdfObjectDelete, t.cast()) };
        };
        // SAFETY: the transaction is new; the MDL covers the range (caller);
        // the length is not zero.
        let status = unsafe {
            call_unsafe_wdf_function_binding!(
                WdfDmaTransactionInitialize,
                transaction,
                Some(evt_program_dma),
                direction,
                mdl,
                va,
                length
            )
        };
        if let Err(status) = check(status) {
            delete(transaction);
            return Err(status);
        }
        let capture = Capture {
            elements: core::ptr::from_mut(elements),
            programmed: AtomicBool::new(false),
            overflow: AtomicBool::new(false),
        };
        // SAFETY: initialized above; the context outlives the callback
        // (waited for or cancelled below).
        let status = unsafe {
            call_unsafe_wdf_function_binding!(
                WdfDmaTransactionExecute,
                transaction,
                (&raw const capture).cast_mut().cast()
            )
        };
        if !capture.programmed.load(Ordering::Acquire) {
            // Not programmed yet (no map registers now, or a failure): a
            // mapping is synchronous, so cancel it; if the cancel comes too
            // late the callback runs now, elsewhere: wait for it.
            // SAFETY: our transaction.
            let cancelled =
                unsafe { call_unsafe_wdf_function_binding!(WdfDmaTransactionCancel, transaction) };
            if cancelled != 0 || !nt_success(status) {
                // SAFETY: cancelled (or never started): released once.
                unsafe { call_unsafe_wdf_function_binding!(WdfDmaTransactionRelease, transaction) };
                delete(transaction);
                return Err(if nt_success(status) {
                    STATUS_INSUFFICIENT_RESOURCES
                } else {
                    status
                });
            }
            while !capture.programmed.load(Ordering::Acquire) {
                core::hint::spin_loop();
            }
        }
        if capture.overflow.load(Ordering::Acquire) {
            // SAFETY: it ran; finished once.
            unsafe { finish(transaction, length) };
            return Err(STATUS_INSUFFICIENT_RESOURCES);
        }
        Ok(transaction)
    }
}

// ------------------------------------------------------------ BARs

/// A BAR's mapping of I/O space (`MmMapIoSpaceEx`), unmapped
/// (`MmUnmapIoSpace`) when the last holder lets it go: the [`KmdfBar`]
/// and, for a BAR of pages, the region over it and every page of it the
/// core keeps (a doorbell page mapped into a process holds it until the
/// file's cleanup unmaps the page).
pub(crate) struct IoSpace {
    base: *mut u8,
    len: usize,
}

// SAFETY: a range of the system address space mapped over device memory,
// accessed only by volatile reads and writes (or through regions), which
// any thread may make; unmapped once, by its last holder.
unsafe impl Send for IoSpace {}
// SAFETY: as above.
unsafe impl Sync for IoSpace {}

impl Drop for IoSpace {
    /// `MmUnmapIoSpace`. IRQL: <= DISPATCH_LEVEL.
    fn drop(&mut self) {
        // SAFETY: the mapping MmMapIoSpaceEx made, of `len` bytes, unmapped
        // once, by its last holder: no access outlives it.
        unsafe { MmUnmapIoSpace(self.base.cast(), self.len as _) };
    }
}

/// Whether `region` is device memory (a BAR's pages, or a part of them):
/// a mapping of it into a process is made uncached over the BAR's
/// physical pages ([`crate::mdl::UserMapping::map_region`]).
///
/// IRQL: any.
pub(crate) fn is_io_space(region: &Region) -> bool {
    let Some(owner) = region.owner() else {
        return false;
    };
    if owner.is::<Shared<IoSpace>>() {
        return true;
    }
    // A part of another region (`Region::sub`): its parent decides.
    region.parent().is_some_and(|parent| is_io_space(parent))
}

/// A memory BAR mapped uncached; for a BAR of pages
/// ([`PciResources::pages`]) also a region over its memory
/// ([`Bar::pages`]).
pub struct KmdfBar {
    base: *mut u8,
    len: usize,
    /// Keeps the mapping while the BAR (or its pages) are used.
    _io: Shared<IoSpace>,
    pages: Option<Shared<Region>>,
}

// SAFETY: device registers, accessed only by single volatile reads and
// writes, which any thread may make.
unsafe impl Send for KmdfBar {}
// SAFETY: as above.
unsafe impl Sync for KmdfBar {}

impl KmdfBar {
    fn at(&self, offset: usize, width: usize) -> Result<*mut u8, NtStatus> {
        if !offset.is_multiple_of(width)
            || offset.checked_add(width).is_none_or(|end| end > self.len)
        {
            return Err(STATUS_INVALID_PARAMETER);
        }
        // SAFETY: inside the mapping (checked above).
        Ok(unsafe { self.base.add(offset) })
    }
}

impl Bar for KmdfBar {
    fn len(&self) -> usize {
        self.len
    }
    fn read32(&self, offset: usize) -> Result<u32, NtStatus> {
        let at = self.at(offset, 4)?.cast::<u32>();
        // SAFETY: an aligned register of the live mapping (READ_REGISTER_ULONG).
        Ok(unsafe { at.read_volatile() })
    }
    fn write32(&self, offset: usize, value: u32) -> Result<(), NtStatus> {
        let at = self.at(offset, 4)?.cast::<u32>();
        // SAFETY: as above (WRITE_REGISTER_ULONG).
        unsafe { at.write_volatile(value) };
        Ok(())
    }
    fn read64(&self, offset: usize) -> Result<u64, NtStatus> {
        let at = self.at(offset, 8)?.cast::<u64>();
        // SAFETY: as above (READ_REGISTER_ULONG64).
        Ok(unsafe { at.read_volatile() })
    }
    fn write64(&self, offset: usize, value: u64) -> Result<(), NtStatus> {
        let at = self.at(offset, 8)?.cast::<u64>();
        // SAFETY: as above (WRITE_REGISTER_ULONG64).
        unsafe { at.write_volatile(value) };
        Ok(())
    }
    /// A BAR of pages' memory: the region the model's mini-driver takes
    /// doorbell pages from, each mapped into a process uncached.
    fn pages(&self) -> Option<&Shared<Region>> {
        self.pages.as_ref()
    }
}

// ------------------------------------------------------------ interrupts

/// A message's handler, shared by the interrupt object's context and the
/// [`KmdfInterrupt`].
struct Slot {
    handler: Box<dyn InterruptHandler>,
    message: u16,
    connected: AtomicBool,
}

/// The interrupt object's context: the slot (`Shared::into_raw`), released
/// by the object's cleanup.
struct InterruptContext {
    slot: *const Slot,
}
context_type!(
    INTERRUPT_CONTEXT_TYPE,
    InterruptContext,
    c"IrpverbsInterruptContext"
);

/// The slot of `interrupt`, if set.
///
/// # Safety
/// `interrupt` is one of ours, alive.
unsafe fn slot<'a>(interrupt: WDFINTERRUPT) -> Option<&'a Slot> {
    // SAFETY: our interrupt, created with the context type.
    let context = unsafe { INTERRUPT_CONTEXT_TYPE.get::<InterruptContext>(interrupt.cast()) };
    // SAFETY: a non-null context of ours, zero-filled or set by
    // connect_interrupt.
    let context = unsafe { context.as_ref() }?;
    // SAFETY: the slot is null or a live Shared released only by the
    // cleanup callback, after the last ISR and DPC.
    unsafe { context.slot.as_ref() }
}

/// `EvtInterruptIsr`. IRQL: DIRQL.
unsafe extern "C" fn evt_interrupt_isr(interrupt: WDFINTERRUPT, message_id: ULONG) -> BOOLEAN {
    // SAFETY: called by the framework for our interrupt.
    let Some(slot) = (unsafe { slot(interrupt) }) else {
        return 0;
    };
    if !slot.connected.load(Ordering::Acquire) {
        return 0;
    }
    let message = u16::try_from(message_id).unwrap_or(slot.message);
    if !slot.handler.isr(message) {
        return 0;
    }
    // SAFETY: our interrupt, from its ISR.
    let _ = unsafe { call_unsafe_wdf_function_binding!(WdfInterruptQueueDpcForIsr, interrupt) };
    1
}

/// `EvtInterruptDpc`. IRQL: DISPATCH_LEVEL.
unsafe extern "C" fn evt_interrupt_dpc(interrupt: WDFINTERRUPT, _associated: WDFOBJECT) {
    // SAFETY: called by the framework for our interrupt.
    if let Some(slot) = unsafe { slot(interrupt) }
        && slot.connected.load(Ordering::Acquire)
    {
        slot.handler.dpc(slot.message);
    }
}

/// The interrupt object's cleanup: the slot's reference goes.
unsafe extern "C" fn evt_interrupt_cleanup(object: WDFOBJECT) {
    // SAFETY: our interrupt, created with the context type.
    let context = unsafe { INTERRUPT_CONTEXT_TYPE.get::<InterruptContext>(object) };
    // SAFETY: a non-null context of ours.
    if let Some(context) = unsafe { context.as_mut() } {
        let slot = core::mem::replace(&mut context.slot, core::ptr::null());
        if !slot.is_null() {
            // SAFETY: from Shared::into_raw in connect_interrupt, taken
            // back once (the pointer is cleared).
            drop(unsafe { Shared::from_raw(slot) });
        }
    }
}

/// A connected message; dropping it disconnects the handler.
pub struct KmdfInterrupt {
    slot: Shared<Slot>,
}

impl Interrupt for KmdfInterrupt {
    fn message(&self) -> u16 {
        self.slot.message
    }
}

impl Drop for KmdfInterrupt {
    fn drop(&mut self) {
        self.slot.connected.store(false, Ordering::Release);
    }
}

// ------------------------------------------------------------ the seam

impl PciPlatform for KmdfPci {
    type CommonBuffer = KmdfCommonBuffer;
    type DmaMapping = KmdfDmaMapping;
    type Bar = KmdfBar;
    type Interrupt = KmdfInterrupt;

    fn alloc_common_buffer(&self, length: usize) -> Result<KmdfCommonBuffer, NtStatus> {
        let page = DMA_PAGE_SIZE as usize;
        if length == 0 {
            return Err(STATUS_INVALID_PARAMETER);
        }
        let length = length
            .checked_next_multiple_of(page)
            .ok_or(STATUS_INVALID_PARAMETER)?;
        let mut buffer: WDFCOMMONBUFFER = core::ptr::null_mut();
        // SAFETY: our live enabler; no attributes (parent: the enabler);
        // PASSIVE_LEVEL (the trait's contract).
        check(unsafe {
            call_unsafe_wdf_function_binding!(
                WdfCommonBufferCreate,
                self.enabler,
                length,
                core::ptr::null_mut(),
                &raw mut buffer
            )
        })?;
        let delete = || {
            // SAFETY: created above, deleted once.
            unsafe { call_unsafe_wdf_function_binding!(WdfObjectDelete, buffer.cast()) };
        };
        // SAFETY: a live common buffer.
        let va = unsafe {
            call_unsafe_wdf_function_binding!(WdfCommonBufferGetAlignedVirtualAddress, buffer)
        };
        // SAFETY: as above.
        let logical: LARGE_INTEGER = unsafe {
            call_unsafe_wdf_function_binding!(WdfCommonBufferGetAlignedLogicalAddress, buffer)
        };
        // SAFETY: as above.
        let len = unsafe { call_unsafe_wdf_function_binding!(WdfCommonBufferGetLength, buffer) };
        // SAFETY: the common buffer's nonpaged memory, `len` bytes, valid
        // until the buffer is deleted, which the returned object does only
        // after the region's users are gone (it holds the region).
        let region = unsafe { Region::from_raw_parts(va.cast(), len, None) };
        let Some(region) = region.and_then(|r| Shared::try_new(r).ok()) else {
            delete();
            return Err(STATUS_INSUFFICIENT_RESOURCES);
        };
        Ok(KmdfCommonBuffer {
            region,
            // SAFETY: PHYSICAL_ADDRESS is a LARGE_INTEGER; QuadPart is the
            // whole value.
            logical: unsafe { logical.QuadPart } as u64,
            buffer,
        })
    }

    fn map_dma(
        &self,
        region: &Shared<Region>,
        direction: DmaDirection,
    ) -> Result<KmdfDmaMapping, NtStatus> {
        if region.is_empty() {
            return Err(STATUS_INVALID_PARAMETER);
        }
        let wdf_direction = if direction == DmaDirection::ToDevice {
            _WDF_DMA_DIRECTION::WdfDmaDirectionWriteToDevice
        } else {
            // A device that reads and writes the memory: the transaction
            // is mapped for its writes (on x64 the same mapping serves
            // both).
            _WDF_DMA_DIRECTION::WdfDmaDirectionReadFromDevice
        };
        // The MDL and the address the transaction is relative to.
        let (mdl, va, built) = match pinned_mdl(region) {
            Some(mdl) => {
                // SAFETY: a user pin's MDL, locked while the region lives.
                let mdl_ref = unsafe { &*mdl };
                // MmGetMdlVirtualAddress: its start plus byte offset.
                let va = mdl_ref.StartVa as usize + mdl_ref.ByteOffset as usize;
                (mdl, va as *mut c_void, None)
            }
            None => {
                let va = region.addr() as usize as *mut c_void;
                let built = Mdl::new(va, region.len())?;
                // SAFETY: an MDL over the region's nonpaged memory (the
                // driver's queues, a kernel ULP's buffer), just allocated.
                unsafe { MmBuildMdlForNonPagedPool(built.as_ptr()) };
                (built.as_ptr(), va, Some(built))
            }
        };
        // Room for the lists: one element per page touched, at most.
        let first = region.addr() % DMA_PAGE_SIZE;
        let pages = (first + region.len() as u64).div_ceil(DMA_PAGE_SIZE);
        let mut elements = Vec::new();
        elements
            .try_reserve_exact(usize::try_from(pages).map_err(|_| STATUS_INVALID_PARAMETER)?)
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        let mut transactions = Vec::new();
        transactions
            .try_reserve_exact(region.len().div_ceil(MAX_TRANSFER))
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        let mut mapping = KmdfDmaMapping {
            elements: Vec::new(),
            direction,
            transactions,
            _built: built,
            region: region.clone(),
        };
        let mut offset = 0;
        while offset < region.len() {
            let length = (region.len() - offset).min(MAX_TRANSFER);
            // SAFETY: the MDL describes the whole region, alive with the
            // mapping (which holds the region and the built MDL).
            let t = unsafe {
                self.map_transfer(
                    mdl,
                    va.cast::<u8>().wrapping_add(offset).cast(),
                    length,
                    wdf_direction,
                    &mut elements,
                )
            }?;
            // Within the room taken above.
            mapping.transactions.push(t);
            offset += length;
        }
        mapping.elements = elements;
        Ok(mapping)
    }

    fn map_bar(&self, index: u8) -> Result<KmdfBar, NtStatus> {
        let (physical, len) = *self
            .resources
            .bars
            .get(usize::from(index))
            .ok_or(STATUS_INVALID_PARAMETER)?;
        if len == 0 {
            return Err(STATUS_INVALID_PARAMETER);
        }
        let address = LARGE_INTEGER { QuadPart: physical };
        // SAFETY: the BAR's translated memory resource, `len` bytes; read
        // and write, uncached (device registers); PASSIVE_LEVEL.
        let base = unsafe { MmMapIoSpaceEx(address, len as _, PAGE_READWRITE | PAGE_NOCACHE) };
        if base.is_null() {
            return Err(STATUS_INSUFFICIENT_RESOURCES);
        }
        let base = base.cast::<u8>();
        // Unmapped by its drop from here on.
        let io = Shared::try_new(IoSpace { base, len }).map_err(|io| {
            drop(io);
            STATUS_INSUFFICIENT_RESOURCES
        })?;
        let pages = if self.resources.pages & (1 << index) != 0 {
            let owner: Box<dyn core::any::Any + Send + Sync> =
                irpverbs_ring::try_box(io.clone()).map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
            // SAFETY: the mapping, `len` bytes of device memory, valid for
            // volatile reads and writes by any thread while the IoSpace the
            // region holds keeps it; nothing references it.
            let region = unsafe { Region::from_raw_parts(base, len, Some(owner)) }
                .ok_or(STATUS_INSUFFICIENT_RESOURCES)?;
            Some(Shared::try_new(region).map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?)
        } else {
            None
        };
        Ok(KmdfBar {
            base,
            len,
            _io: io,
            pages,
        })
    }

    fn msix_messages(&self) -> u16 {
        self.resources.messages
    }

    fn connect_interrupt<H: InterruptHandler>(
        &self,
        message: u16,
        handler: H,
    ) -> Result<KmdfInterrupt, NtStatus> {
        if message >= self.msix_messages() {
            return Err(STATUS_INVALID_PARAMETER);
        }
        let bit = 1u64 << message;
        if self.shared.connected.fetch_or(bit, Ordering::AcqRel) & bit != 0 {
            return Err(STATUS_DEVICE_BUSY);
        }
        let result = self.create_interrupt(message, handler);
        if result.is_err() {
            self.shared.connected.fetch_and(!bit, Ordering::AcqRel);
        }
        result
    }
}

impl KmdfPci {
    /// `WdfInterruptCreate` for `message`, its context holding the slot.
    fn create_interrupt<H: InterruptHandler>(
        &self,
        message: u16,
        handler: H,
    ) -> Result<KmdfInterrupt, NtStatus> {
        let handler: Box<dyn InterruptHandler> =
            irpverbs_ring::try_box(handler).map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        let slot = Shared::try_new(Slot {
            handler,
            message,
            connected: AtomicBool::new(true),
        })
        .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        let (raw, translated) = self.message_descriptors(message);
        let mut config = WDF_INTERRUPT_CONFIG {
            Size: struct_size::<WDF_INTERRUPT_CONFIG>(),
            ShareVector: _WDF_TRI_STATE::WdfUseDefault,
            EvtInterruptIsr: Some(evt_interrupt_isr),
            EvtInterruptDpc: Some(evt_interrupt_dpc),
            InterruptRaw: raw,
            InterruptTranslated: translated,
            ReportInactiveOnPowerDown: _WDF_TRI_STATE::WdfUseDefault,
            ..WDF_INTERRUPT_CONFIG::default()
        };
        let mut attributes = INTERRUPT_CONTEXT_TYPE.attributes();
        attributes.EvtCleanupCallback = Some(evt_interrupt_cleanup);
        let mut interrupt: WDFINTERRUPT = core::ptr::null_mut();
        // SAFETY: our live device; the configuration is initialized as
        // WDF_INTERRUPT_CONFIG_INIT does, with the message's descriptors in
        // EvtDevicePrepareHardware (live for the call) or none at device
        // add (the framework assigns messages in creation order);
        // PASSIVE_LEVEL; the interrupt is the device's child.
        check(unsafe {
            call_unsafe_wdf_function_binding!(
                WdfInterruptCreate,
                self.device,
                &raw mut config,
                &raw mut attributes,
                &raw mut interrupt
            )
        })?;
        // SAFETY: just created with the context type.
        let context = unsafe { INTERRUPT_CONTEXT_TYPE.get::<InterruptContext>(interrupt.cast()) };
        // SAFETY: the framework zero-filled context; no ISR runs before the
        // framework enables the interrupt, after D0Entry.
        if let Some(context) = unsafe { context.as_mut() } {
            context.slot = Shared::into_raw(slot.clone());
        }
        Ok(KmdfInterrupt { slot })
    }
}
