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
    /// HCA allocated) into the address space of `request`'s requestor, a
    /// user-mode caller, writable, and returns its address there and the
    /// mapping ([`Platform::unmap_ring`] undoes it). The core keeps the
    /// page's memory allocated until it has unmapped it.
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
