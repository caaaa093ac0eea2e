//! What the OS gives a driver, as the core sees it.
//!
//! On Windows `irpverbs-kmdf` implements [`Platform`] over KMDF (WDFREQUEST,
//! WDFSPINLOCK / KSPIN_LOCK, tagged pool); in host mode `irpverbs-host`
//! implements it over threads and a verifier that checks every rule below and
//! bugchecks (panics with the Windows bugcheck code) when one is broken.
//!
//! The core never assumes a thread exists: it runs inside I/O queue callbacks
//! (DISPATCH_LEVEL), DPCs (DISPATCH_LEVEL) and cancel routines (DISPATCH_LEVEL),
//! the in-caller-context callback (the requestor's thread and process, before
//! the request is queued: PASSIVE_LEVEL for user-mode callers) and file
//! callbacks (PASSIVE_LEVEL).
//!
//! # User memory: pins and ring mappings
//! Two services touch a user process's address space, and both need its
//! context at PASSIVE_LEVEL (at most APC_LEVEL): pinning a range for a
//! memory registration ([`Platform::pin_memory`]) and mapping a ring (or a
//! file's doorbell page) into the process ([`Platform::map_ring`],
//! [`Platform::map_doorbell_page`]). The core calls them only from
//! [`crate::Device::in_caller_context`] (the request's own context) and
//! unmaps ([`Platform::unmap_ring`]) only from there and from the file
//! callbacks; which ring is mapped, for how long, and when it is unmapped
//! is the core's decision, the platform only maps.
//!
//! # The hardware seam
//! A PCI HCA's mini-driver needs more than the core does: DMA common
//! buffers with logical addresses, scatter/gather lists of registered
//! memory, its BAR registers and an interrupt per MSI-X message.
//! [`PciPlatform`] gives them (with each call's IRQL and errors);
//! `docs/hardware-seam.md` shows how a backend uses them.

use irpverbs_abi::{IvRingMap, NtStatus};
use irpverbs_ring::{Region, Ring, Shared};

/// An interrupt request level.
pub type Irql = u8;
/// PASSIVE_LEVEL: threads; waits allowed.
pub const PASSIVE_LEVEL: Irql = 0;
/// APC_LEVEL.
pub const APC_LEVEL: Irql = 1;
/// DISPATCH_LEVEL: DPCs, spin locks, dispatch-level I/O queues. No waits,
/// no paged code or memory.
pub const DISPATCH_LEVEL: Irql = 2;
/// The lowest device IRQL (an interrupt service routine runs at DIRQL).
pub const DEVICE_LEVEL: Irql = 3;

/// Who issued a request: the I/O manager's `RequestorMode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RequestorMode {
    /// A kernel-mode caller (a kernel ULP); trusted with kernel-only IOCTLs.
    Kernel,
    /// A user-mode caller; its buffers and handles are untrusted.
    User,
}

/// The major function a request arrived on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MajorFunction {
    /// `IRP_MJ_DEVICE_CONTROL`: `DeviceIoControl` from user mode, or a kernel caller.
    DeviceControl,
    /// `IRP_MJ_INTERNAL_DEVICE_CONTROL`: kernel callers only.
    InternalDeviceControl,
}

/// Identifies one open of the device (a WDFFILEOBJECT on Windows). Objects
/// and handles belong to the file that created them.
pub type FileKey = u64;

/// Identifies a user process to the core: the platform's non-zero key for
/// it, which must stay unique among processes for as long as a file the
/// process opened is open (KMDF: the address of the `EPROCESS`, which the
/// file's context keeps referenced with `ObReferenceObject` from
/// `EvtDeviceFileCreate` to `EvtFileClose`, so that no later process can be
/// given the same address meanwhile). The core only compares keys.
pub type ProcessKey = u64;

/// A four-character pool tag, as `ExAllocatePool2` takes it
/// (`u32::from_le_bytes(*b"IvPd")` shows as "IvPd" in pool tools).
pub type PoolTag = u32;

/// Builds a pool tag from four ASCII bytes.
#[must_use]
pub const fn pool_tag(tag: &[u8; 4]) -> PoolTag {
    u32::from_le_bytes(*tag)
}

/// A tagged pool allocation the core made for one of its objects. It must be
/// given back with [`Platform::pool_release`]; the verifier bugchecks at
/// unload if any is still out (Driver Verifier's leak check, 0xC4/0x62).
#[derive(Debug, PartialEq, Eq)]
pub struct PoolCharge {
    /// The tag.
    pub tag: PoolTag,
    /// Bytes charged.
    pub bytes: usize,
    /// Platform-private identity of the allocation.
    pub id: u64,
}

/// Where a lock sits in the driver's lock hierarchy. Locks must be acquired
/// in increasing rank; the verifier bugchecks on an out-of-order acquisition
/// (a potential deadlock), as Driver Verifier's deadlock detection does.
#[derive(Debug, PartialEq, Eq)]
pub struct LockClass {
    /// For diagnostics.
    pub name: &'static str,
    /// Position in the hierarchy; acquire lower ranks first.
    pub rank: u16,
}

/// Held while the device runs kernel ULPs' CEP callbacks (so that they run
/// at DISPATCH_LEVEL), taken before any other driver lock: a callback may
/// call back into the device.
pub static CEP_CALLBACK_LOCK: LockClass = LockClass {
    name: "irpverbs.cep_callbacks",
    rank: 1,
};
/// The user mappings of rings (taken before the device lock, never under it).
pub static MAP_LOCK: LockClass = LockClass {
    name: "irpverbs.maps",
    rank: 5,
};
/// The device lock: files, handle tables, pending commands.
pub static DEVICE_LOCK: LockClass = LockClass {
    name: "irpverbs.device",
    rank: 10,
};
/// The HCA's command queue and firmware state (taken under the device lock).
pub static HCA_LOCK: LockClass = LockClass {
    name: "irpverbs.hca",
    rank: 20,
};
/// The HCA's event queue (taken under the HCA lock).
pub static EQ_LOCK: LockClass = LockClass {
    name: "irpverbs.eq",
    rank: 30,
};

/// A spin lock: acquiring raises to DISPATCH_LEVEL, releasing restores the
/// previous IRQL.
///
/// The closure form makes it impossible to release at the wrong IRQL or keep
/// a guard across a return to the caller.
pub trait SpinLock<T>: Send + Sync {
    /// Acquires the lock at DISPATCH_LEVEL, runs `f`, releases.
    ///
    /// IRQL: caller at <= DISPATCH_LEVEL. Must not be called recursively on
    /// the same lock (a self-deadlock the verifier reports).
    fn lock<R>(&self, f: impl FnOnce(&mut T) -> R) -> R;
}

/// An I/O request (a WDFREQUEST): an IOCTL with its buffers, owned by the
/// driver from dispatch until it is completed, exactly once.
///
/// For `METHOD_BUFFERED` the input and the output share one system buffer:
/// the core copies the whole input out first, and writes output only when it
/// completes the request.
pub trait Request: Send + 'static {
    /// The IOCTL code.
    fn ioctl_code(&self) -> u32;
    /// The major function it arrived on.
    fn major_function(&self) -> MajorFunction;
    /// Kernel or user caller.
    fn requestor_mode(&self) -> RequestorMode;
    /// The file the request was issued on.
    fn file(&self) -> FileKey;
    /// The input buffer.
    fn input(&self) -> &[u8];
    /// The output buffer.
    fn output(&mut self) -> &mut [u8];
    /// Completes the request with `status`, reporting `information` output
    /// bytes. Consumes the request: it can't be completed twice.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    fn complete(self, status: NtStatus, information: usize);
    /// Makes the request cancelable. When it is cancelled the platform calls
    /// the driver's cancel routine with `cancel_key`, and from then on the
    /// cancel routine owns it.
    ///
    /// # Errors
    /// `STATUS_CANCELLED` if it was already cancelled: the caller still owns
    /// it and must complete it.
    fn mark_cancelable(&mut self, cancel_key: u64) -> Result<(), NtStatus>;
    /// Makes the request not cancelable again before completing it.
    ///
    /// # Errors
    /// `STATUS_CANCELLED` if the cancel routine has run or is about to run:
    /// it owns the request, and the caller must not complete it.
    fn unmark_cancelable(&mut self) -> Result<(), NtStatus>;
    /// The process the request was issued from ([`ProcessKey`]): the core
    /// serves a file's user-memory requests (pins, ring and doorbell
    /// mappings) only for the process that opened it. KMDF: the
    /// requestor's process, recorded in `EvtIoInCallerContext`.
    ///
    /// IRQL: <= DISPATCH_LEVEL, in any context.
    fn address_space(&self) -> ProcessKey;
    /// Keeps `region`, pinned by [`crate::Device::in_caller_context`] in the
    /// requestor's context, with the request until the I/O queue presents it
    /// to [`crate::Device::dispatch_ioctl`], which takes it back with
    /// [`Request::take_pin`]. If the request is completed first, the
    /// platform drops the region then (which unpins it).
    fn attach_pin(&mut self, region: Shared<Region>);
    /// Takes back what [`Request::attach_pin`] kept, if anything.
    fn take_pin(&mut self) -> Option<Shared<Region>>;
}

/// What the OS gives the driver. Implemented by the KMDF glue on Windows and
/// the host platform (with its verifier) everywhere else.
pub trait Platform: Send + Sync + 'static {
    /// The request type (a WDFREQUEST wrapper).
    type Request: Request;
    /// The spin lock type.
    type Lock<T: Send>: SpinLock<T>;

    /// Creates a spin lock of the given class.
    fn new_lock<T: Send>(&self, class: &'static LockClass, value: T) -> Self::Lock<T>;

    /// The current processor's IRQL.
    fn irql(&self) -> Irql;

    /// A monotonic clock in nanoseconds (Windows: the interrupt time,
    /// `KeQueryInterruptTimePrecise`, times 100): the time base of the
    /// connection manager's timers.
    ///
    /// IRQL: any.
    fn now_ns(&self) -> u64;

    /// Charges a tagged nonpaged pool allocation for a driver object.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES` when the pool (or the verifier's
    /// low-resources simulation) refuses it.
    fn pool_charge(&self, tag: PoolTag, bytes: usize) -> Result<PoolCharge, NtStatus>;

    /// Gives back a charge taken with [`Platform::pool_charge`].
    fn pool_release(&self, charge: PoolCharge);

    /// Pins `length` bytes at `addr` for the HCA (a memory registration)
    /// and returns the region the HCA reaches them through; the pin lasts as
    /// long as the region (the MR's last reference: the HCA's, once the
    /// registration succeeded), and dropping it unpins, at IRQL <=
    /// DISPATCH_LEVEL in any context.
    ///
    /// - A user-mode `request`: the core calls this only from
    ///   [`crate::Device::in_caller_context`], in the requestor's process at
    ///   IRQL <= APC_LEVEL. The platform probes and locks the caller's pages
    ///   (KMDF: an MDL, `MmProbeAndLockPages(UserMode, IoWriteAccess` when
    ///   `write`, else `IoReadAccess)`) and maps them for the system.
    /// - A kernel-mode `request` (from the I/O queue, IRQL <= DISPATCH_LEVEL):
    ///   the range is the kernel ULP's own nonpaged memory, valid until it
    ///   deregisters; `physical` ranges are bus addresses.
    ///
    /// `write`: the HCA may write the memory (the registration asked for
    /// local write access).
    ///
    /// # Errors
    /// `STATUS_ACCESS_DENIED` / `STATUS_INVALID_PARAMETER` for a range the
    /// caller may not use (a probe that faults reports the exception's
    /// status); `STATUS_INSUFFICIENT_RESOURCES`; `STATUS_NOT_SUPPORTED` for a
    /// kind of range the platform cannot pin.
    fn pin_memory(
        &self,
        request: &Self::Request,
        addr: u64,
        length: u64,
        write: bool,
        physical: bool,
    ) -> Result<Shared<Region>, NtStatus>;

    /// A ring mapped into a user process: what [`Platform::unmap_ring`]
    /// takes back (KMDF: the MDL, the user address and the process).
    type Mapping: Send + 'static;

    /// Maps `ring`'s memory (all of its region) into the address space of
    /// `request`'s requestor, a user-mode caller, and returns where the ring
    /// is there (`IvRingMap` with user addresses) and the mapping. The core
    /// keeps the ring's memory allocated until it has unmapped it.
    ///
    /// IRQL: <= APC_LEVEL, in the requestor's process: the core calls this
    /// only from [`crate::Device::in_caller_context`].
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES` when the process has no room (or the
    /// system no memory) for the mapping.
    fn map_ring(
        &self,
        request: &Self::Request,
        ring: &Ring,
    ) -> Result<(IvRingMap, Self::Mapping), NtStatus>;

    /// Maps a doorbell page (`page`: one whole page of nonpaged memory the
    /// HCA allocated, or a page of the device's memory, a BAR of pages'
    /// [`Bar::pages`], as a UAR page is) into the address space of
    /// `request`'s requestor, a user-mode caller, writable, and returns its
    /// address there and the mapping ([`Platform::unmap_ring`] undoes it,
    /// at the latest when the file is cleaned up). The core keeps the
    /// page (and so the memory, or the BAR's mapping) until it has
    /// unmapped it.
    ///
    /// Device memory is mapped uncached, as the driver's own mapping of
    /// the BAR is: KMDF builds an MDL over the BAR's physical page
    /// (`MmBuildMdlForNonPagedPool` on its `MmMapIoSpaceEx` mapping) and
    /// maps it with `MmMapLockedPagesSpecifyCache(UserMode, MmNonCached)`;
    /// host mode hands out the device model's memory.
    ///
    /// IRQL: <= APC_LEVEL, in the requestor's process: the core calls this
    /// only from [`crate::Device::in_caller_context`].
    ///
    /// # Errors
    /// As [`Platform::map_ring`].
    fn map_doorbell_page(
        &self,
        request: &Self::Request,
        page: &Shared<Region>,
    ) -> Result<(u64, Self::Mapping), NtStatus>;

    /// Removes a mapping [`Platform::map_ring`] or
    /// [`Platform::map_doorbell_page`] made, from the process it was made in
    /// (attaching to that process if the current one is another).
    ///
    /// IRQL: <= APC_LEVEL: the core calls this from
    /// [`crate::Device::in_caller_context`] and from the file callbacks
    /// ([`crate::Device::cleanup_file`], [`crate::Device::close_file`]).
    fn unmap_ring(&self, mapping: Self::Mapping);
}

// ------------------------------------------------------------ the hardware seam

/// A logical (bus) address: what a device puts on the bus to reach host
/// memory by DMA. KMDF: a common buffer's
/// `WdfCommonBufferGetAlignedLogicalAddress`, or a `SCATTER_GATHER_ELEMENT`'s
/// `Address`. Behind an IOMMU (Windows' DMA remapping) it is not a physical
/// address, and only what is mapped is reachable.
pub type LogicalAddress = u64;

/// The page of a scatter/gather page list ([`page_list`]): the x64
/// `PAGE_SIZE`, the granule the HCA's page tables (MTTs) describe.
pub const DMA_PAGE_SIZE: u64 = 4096;

/// Which way the device moves the bytes of a DMA mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DmaDirection {
    /// The device only reads the memory (a send buffer, a WQE ring). KMDF:
    /// `WdfDmaDirectionWriteToDevice`.
    ToDevice,
    /// The device only writes it (a receive buffer, a CQ ring). KMDF:
    /// `WdfDmaDirectionReadFromDevice`.
    FromDevice,
    /// Both (an MR with local write access that is also read; a queue the
    /// device reads and writes back).
    Bidirectional,
}

impl DmaDirection {
    /// Whether the device may read the memory.
    #[must_use]
    pub const fn device_reads(self) -> bool {
        matches!(self, Self::ToDevice | Self::Bidirectional)
    }

    /// Whether the device may write the memory.
    #[must_use]
    pub const fn device_writes(self) -> bool {
        matches!(self, Self::FromDevice | Self::Bidirectional)
    }
}

/// One element of a scatter/gather list (`SCATTER_GATHER_ELEMENT`): a run
/// of `length` bytes the device reaches at `address`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SgElement {
    /// Where the run starts, on the bus.
    pub address: LogicalAddress,
    /// Its bytes.
    pub length: u32,
}

/// A DMA common buffer (`WDFCOMMONBUFFER`): memory the driver and the
/// device share for as long as it lives — queues, event queues, doorbell
/// records, a command mailbox. The driver reaches it through
/// [`CommonBuffer::region`] (bounds-checked copies and atomics), the device
/// at [`CommonBuffer::logical_address`]. Dropping it unmaps and frees it
/// (IRQL: PASSIVE_LEVEL, as `WdfObjectDelete` of a common buffer), after
/// the device was told to stop using it.
pub trait CommonBuffer: Send + Sync + 'static {
    /// The driver's view (its virtual address: `Region::addr`).
    fn region(&self) -> &Shared<Region>;
    /// Where the device reaches its first byte (page-aligned).
    fn logical_address(&self) -> LogicalAddress;
    /// Its bytes.
    fn len(&self) -> usize {
        self.region().len()
    }
    /// True for an empty buffer (never: [`PciPlatform::alloc_common_buffer`]
    /// refuses a zero length).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A registered region mapped for the device (a DMA transaction's
/// scatter/gather list, kept for the life of a memory registration): its
/// elements cover the region's bytes in order. Dropping it unmaps it; the
/// device must not touch the addresses afterwards (the host's IOMMU model
/// bugchecks if it does).
///
/// IRQL of the drop: <= DISPATCH_LEVEL.
pub trait DmaMapping: Send + Sync + 'static {
    /// The direction it was mapped for.
    fn direction(&self) -> DmaDirection;
    /// The scatter/gather list, in the region's byte order.
    fn elements(&self) -> &[SgElement];
    /// Bytes mapped (the region's length).
    fn len(&self) -> u64 {
        self.elements().iter().map(|e| u64::from(e.length)).sum()
    }
    /// True for an empty mapping (never: regions are not empty).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The logical address of each [`DMA_PAGE_SIZE`] page `elements` touch,
/// in order, into `out` (an HCA's page table for a memory registration:
/// the first entry is the page holding the first byte, rounded down);
/// returns how many.
///
/// # Errors
/// `STATUS_INVALID_PARAMETER` when the list is not a page list: an element
/// other than the first starts inside a page, or one other than the last
/// ends inside one; `STATUS_BUFFER_TOO_SMALL` when `out` cannot hold them
/// (`out` then holds the first ones).
pub fn page_list(elements: &[SgElement], out: &mut [LogicalAddress]) -> Result<usize, NtStatus> {
    let mask = DMA_PAGE_SIZE - 1;
    let last = elements.len().saturating_sub(1);
    let mut n = 0;
    for (i, e) in elements.iter().enumerate() {
        let end = e
            .address
            .checked_add(u64::from(e.length))
            .ok_or(irpverbs_abi::STATUS_INVALID_PARAMETER)?;
        if (i > 0 && e.address & mask != 0) || (i < last && end & mask != 0) {
            return Err(irpverbs_abi::STATUS_INVALID_PARAMETER);
        }
        let mut page = e.address & !mask;
        while page < end {
            let slot = out
                .get_mut(n)
                .ok_or(irpverbs_abi::STATUS_BUFFER_TOO_SMALL)?;
            *slot = page;
            n += 1;
            page += DMA_PAGE_SIZE;
        }
    }
    Ok(n)
}

/// A memory BAR of the device, mapped for the driver (`MmMapIoSpaceEx`,
/// uncached): its registers, read and written with single, naturally
/// aligned accesses (`READ_REGISTER_ULONG`, `WRITE_REGISTER_ULONG64`, ...).
/// Dropping it unmaps it (`MmUnmapIoSpace`; IRQL <= DISPATCH_LEVEL).
///
/// IRQL of the accesses: any (an ISR reads its cause register at DIRQL).
///
/// # Errors
/// Each access: `STATUS_INVALID_PARAMETER` for an offset past the BAR or
/// not aligned to the access's width (nothing is read or written).
pub trait Bar: Send + Sync + 'static {
    /// Its bytes.
    fn len(&self) -> usize;
    /// True for an empty BAR (never: a BAR has registers).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The 32-bit register at `offset`.
    fn read32(&self, offset: usize) -> Result<u32, NtStatus>;
    /// Writes the 32-bit register at `offset`.
    fn write32(&self, offset: usize, value: u32) -> Result<(), NtStatus>;
    /// The 64-bit register at `offset`.
    fn read64(&self, offset: usize) -> Result<u64, NtStatus>;
    /// Writes the 64-bit register at `offset` (one access: a doorbell that
    /// carries a queue number and an index together).
    fn write64(&self, offset: usize, value: u64) -> Result<(), NtStatus>;
    /// The BAR's memory as a region, for a BAR of pages the driver maps
    /// into processes (UAR pages: doorbells a user-mode ULP writes with no
    /// system call); `None` for a BAR of registers only. Host mode: the
    /// device model's memory (`HostPlatform::install_bar_pages`). KMDF:
    /// the BAR's `MmMapIoSpaceEx` mapping, for a BAR the backend named as
    /// pages; a page of it is mapped into a process uncached
    /// ([`Platform::map_doorbell_page`]).
    ///
    /// IRQL: any.
    fn pages(&self) -> Option<&Shared<Region>> {
        None
    }
}

/// What runs when an MSI-X message arrives: the ISR
/// (`EvtInterruptIsr`) and the DPC (`EvtInterruptDpc`) of one message.
/// A message is not shared: the ISR need not ask the device whether it
/// interrupted.
pub trait InterruptHandler: Send + Sync + 'static {
    /// The ISR: message `message` arrived. Returns whether to queue the
    /// message's DPC (false: a spurious or already-handled message).
    ///
    /// IRQL: DIRQL. No allocation, no spin lock but the interrupt's own,
    /// as little work as possible (read or acknowledge a register).
    fn isr(&self, message: u16) -> bool;
    /// The DPC the ISR queued: the work of the message (poll the event
    /// queue it signals, complete what it names, re-arm it).
    ///
    /// IRQL: DISPATCH_LEVEL. Bounded work; the rest requeued.
    fn dpc(&self, message: u16);
}

/// An MSI-X message connected to its handler ([`PciPlatform::connect_interrupt`]).
/// Dropping it disconnects it: its ISR and DPC are not called afterwards
/// (the drop waits for one in progress; IRQL: PASSIVE_LEVEL).
pub trait Interrupt: Send + Sync + 'static {
    /// The message (MSI-X table entry) it is.
    fn message(&self) -> u16;
}

/// What a PCI HCA's mini-driver needs from the OS besides [`Platform`]:
/// DMA (common buffers, scatter/gather mappings of registered memory),
/// its BARs and its MSI-X messages. KMDF implements it with a DMA enabler
/// (`WdfDmaEnablerCreate`, scatter/gather 64-bit profile) and its common
/// buffers and transactions, `MmMapIoSpaceEx` and `WdfInterruptCreate`;
/// host mode over an IOMMU model that bugchecks any device access outside
/// a live mapping (`irpverbs_host::platform::pci`). `docs/hardware-seam.md`
/// shows how a backend uses each call.
///
/// Every call is fallible; none blocks but where its IRQL says PASSIVE_LEVEL.
pub trait PciPlatform: Platform {
    /// A common buffer.
    type CommonBuffer: CommonBuffer;
    /// A scatter/gather mapping.
    type DmaMapping: DmaMapping;
    /// A mapped BAR.
    type Bar: Bar;
    /// A connected MSI-X message.
    type Interrupt: Interrupt;

    /// A common buffer of `length` bytes (rounded up to whole pages),
    /// zeroed, mapped for the device both ways, page-aligned on both sides.
    ///
    /// IRQL: PASSIVE_LEVEL (`WdfCommonBufferCreate`): allocate queues when
    /// the device starts or from the in-caller-context callback, never in
    /// a DPC.
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER` for a length of 0 or one that overflows;
    /// `STATUS_INSUFFICIENT_RESOURCES` when memory (or the verifier's
    /// low-resources simulation) refuses it.
    fn alloc_common_buffer(&self, length: usize) -> Result<Self::CommonBuffer, NtStatus>;

    /// Maps `region` for the device in `direction` and returns its
    /// scatter/gather list (the DMA enabler's transaction, kept for the
    /// mapping's life): kernel memory (a queue the driver allocated, a
    /// kernel ULP's nonpaged buffer) or a user buffer
    /// [`Platform::pin_memory`] pinned through an MDL. The mapping keeps
    /// the region alive.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER` for an empty region;
    /// `STATUS_INSUFFICIENT_RESOURCES` when the list or the mapping
    /// resources (map registers, IOMMU entries) are refused.
    fn map_dma(
        &self,
        region: &Shared<Region>,
        direction: DmaDirection,
    ) -> Result<Self::DmaMapping, NtStatus>;

    /// Memory BAR `index` (0-5, in the order of the device's memory
    /// resources), mapped uncached.
    ///
    /// IRQL: PASSIVE_LEVEL (from the device's start:
    /// `EvtDevicePrepareHardware`).
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER` for a BAR the device does not have;
    /// `STATUS_INSUFFICIENT_RESOURCES` when no system address space is
    /// left for the mapping.
    fn map_bar(&self, index: u8) -> Result<Self::Bar, NtStatus>;

    /// The MSI-X messages the device was granted (0: none).
    ///
    /// IRQL: any.
    fn msix_messages(&self) -> u16;

    /// Connects MSI-X message `message` to `handler`: from now on the
    /// message runs `handler.isr` at DIRQL and, when it says so,
    /// `handler.dpc` at DISPATCH_LEVEL.
    ///
    /// IRQL: PASSIVE_LEVEL (`WdfInterruptCreate`, at device add).
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER` for a message at or past
    /// [`Self::msix_messages`]; `STATUS_DEVICE_BUSY` for a message already
    /// connected; `STATUS_INSUFFICIENT_RESOURCES`.
    fn connect_interrupt<H: InterruptHandler>(
        &self,
        message: u16,
        handler: H,
    ) -> Result<Self::Interrupt, NtStatus>;
}

/// A shared handler handles: the device and the driver's state can hold the
/// same one.
impl<T: InterruptHandler> InterruptHandler for Shared<T> {
    fn isr(&self, message: u16) -> bool {
        (**self).isr(message)
    }
    fn dpc(&self, message: u16) {
        (**self).dpc(message);
    }
}
