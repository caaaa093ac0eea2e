//! What the OS gives a driver, as the core sees it.
//!
//! On Windows `irpverbs-kmdf` implements [`Platform`] over KMDF (WDFREQUEST,
//! WDFSPINLOCK / KSPIN_LOCK, tagged pool); in host mode `irpverbs-host`
//! implements it over threads and a verifier that checks every rule below and
//! bugchecks (panics with the Windows bugcheck code) when one is broken.
//!
//! The core never assumes a thread exists: it runs inside I/O queue callbacks
//! (DISPATCH_LEVEL), DPCs (DISPATCH_LEVEL) and cancel routines (DISPATCH_LEVEL),
//! and file callbacks (PASSIVE_LEVEL).

use irpverbs_abi::NtStatus;

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

    /// Pins `length` bytes at `addr` for the HCA (a memory registration):
    /// probes and locks a caller's pages (MDL) and maps them for the device,
    /// or describes a physical range (kernel callers). The HCA reaches the
    /// memory only through the returned region; the pin lasts as long as it.
    ///
    /// IRQL: <= DISPATCH_LEVEL. A user-mode range is probed in the caller's
    /// context before the request reaches the dispatch-level queue (KMDF:
    /// EvtIoInCallerContext); this call then only wraps it.
    ///
    /// # Errors
    /// `STATUS_ACCESS_DENIED` / `STATUS_INVALID_PARAMETER` for a range the
    /// caller may not use; `STATUS_INSUFFICIENT_RESOURCES`.
    fn pin_memory(
        &self,
        addr: u64,
        length: u64,
        mode: RequestorMode,
        physical: bool,
    ) -> Result<alloc::sync::Arc<irpverbs_ring::Region>, NtStatus>;

    /// Where the caller of a create verb finds a ring, in its own address
    /// space. The default is the ring's own addresses: right for kernel
    /// callers, and for user callers in host mode (one address space). A
    /// platform that maps rings into user processes returns the user
    /// mapping; one that cannot yet returns an empty map (zero addresses),
    /// never a kernel address, to a user-mode caller.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    fn ring_map(&self, ring: &irpverbs_ring::Ring, mode: RequestorMode) -> irpverbs_abi::IvRingMap {
        let _ = mode;
        ring.map()
    }
}
