//! User memory over MDLs: the two things the core asks of a process's
//! address space, done the Windows way.
//!
//! - [`UserPin`]: a user-mode memory registration. `IoAllocateMdl` over the
//!   range, `MmProbeAndLockPages(UserMode, IoWriteAccess | IoReadAccess)`
//!   through the SEH shim (`src/seh.c`), then a system mapping
//!   (`MmMapLockedPagesSpecifyCache(KernelMode, MmCached, ..,
//!   NormalPagePriority | MdlMappingNoExecute)`, which is what
//!   `MmGetSystemAddressForMdlSafe` does for an MDL not yet mapped) that the
//!   HCA reaches the pages through. Dropped (the MR's last reference): the
//!   system mapping is undone, the pages unlocked, the MDL freed, at IRQL <=
//!   DISPATCH_LEVEL in any context.
//! - [`UserMapping`]: a ring (or a file's doorbell page) mapped into the
//!   requestor's process. `IoAllocateMdl` + `MmBuildMdlForNonPagedPool`
//!   over its memory (whole pages of nonpaged pool, `Ring::alloc`,
//!   `DoorbellPage::alloc`; or a page of a device's BAR, I/O space the
//!   driver mapped with `MmMapIoSpaceEx`, for which the MDL describes the
//!   BAR's physical page), then
//!   `MmMapLockedPagesSpecifyCache(UserMode, MmCached, NULL, FALSE,
//!   NormalPagePriority | MdlMappingNoExecute)` through the SEH shim
//!   (`MmNonCached` for a BAR's page, as the driver's own mapping of it:
//!   a UAR page as mlx5 maps one).
//!   [`UserMapping::unmap`] undoes it in the process it was made in
//!   (`KeStackAttachProcess` when called from another one), which holds a
//!   reference on that process meanwhile.
//!
//! Both raise exceptions on failure for `UserMode`, which only `__try` /
//! `__except` catches, and an exception through a Rust frame bugchecks:
//! hence the C shim, which turns them into an NTSTATUS.
//!
//! [`FilePins`] counts a file's user pins so that its cleanup can wait for
//! them: a process's locked pages must all be unlocked before it exits
//! (bugcheck 0x76 otherwise), and the last handle's `IRP_MJ_CLEANUP` runs in
//! the exiting process before its address space goes.

use alloc::boxed::Box;
use core::any::Any;
use core::cell::UnsafeCell;
use core::ffi::c_void;
use core::mem::ManuallyDrop;
use core::sync::atomic::{AtomicUsize, Ordering};

use irpverbs_abi::{
    IvRingMap, NtStatus, STATUS_INSUFFICIENT_RESOURCES, STATUS_INVALID_PARAMETER, nt_success,
};
use irpverbs_ring::{Region, Ring, Shared};
use wdk_sys::ntddk::{
    IoAllocateMdl, IoFreeMdl, IoGetCurrentProcess, KeClearEvent, KeInitializeEvent, KeSetEvent,
    KeStackAttachProcess, KeUnstackDetachProcess, KeWaitForSingleObject, MmBuildMdlForNonPagedPool,
    MmMapLockedPagesSpecifyCache, MmUnlockPages, MmUnmapLockedPages, ObfDereferenceObject,
    ObfReferenceObject,
};
use wdk_sys::{
    _EVENT_TYPE, _KWAIT_REASON, _LOCK_OPERATION, _MEMORY_CACHING_TYPE, _MM_PAGE_PRIORITY, _MODE,
    KAPC_STATE, KEVENT, KPROCESSOR_MODE, LARGE_INTEGER, LOCK_OPERATION, MEMORY_CACHING_TYPE,
    MdlMappingNoExecute, PEPROCESS, PMDL, PVOID, ULONG,
};

// The SEH shim, src/seh.c (compiled and linked by build.rs).
unsafe extern "C" {
    /// `MmProbeAndLockPages(mdl, UserMode, operation)` in `__try`: the
    /// exception's status on failure (nothing locked).
    ///
    /// IRQL <= APC_LEVEL, in the context of the process the range is in.
    fn IvProbeAndLockPages(mdl: PMDL, operation: LOCK_OPERATION) -> NtStatus;
    /// `MmMapLockedPagesSpecifyCache(mdl, UserMode, cache, NULL, FALSE,
    /// NormalPagePriority | MdlMappingNoExecute)` in `__try`: the user
    /// address in `*user_address` on success, else the failure's status.
    ///
    /// IRQL <= APC_LEVEL, in the context of the process to map into.
    fn IvMapLockedPagesUser(
        mdl: PMDL,
        cache: MEMORY_CACHING_TYPE,
        user_address: *mut PVOID,
    ) -> NtStatus;
}

/// The priority argument of every mapping: normal priority, not executable.
fn mapping_priority() -> ULONG {
    #[allow(clippy::cast_sign_loss, reason = "NormalPagePriority is 16")]
    let priority = _MM_PAGE_PRIORITY::NormalPagePriority as ULONG;
    priority | MdlMappingNoExecute
}

/// An MDL from `IoAllocateMdl`, freed with `IoFreeMdl` when dropped.
pub(crate) struct Mdl(PMDL);

impl Mdl {
    /// An MDL describing `len` bytes at `address` (no IRP, no quota).
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER` for a length an MDL cannot describe;
    /// `STATUS_INSUFFICIENT_RESOURCES` when pool is short.
    pub(crate) fn new(address: *mut c_void, len: usize) -> Result<Self, NtStatus> {
        let len = ULONG::try_from(len).map_err(|_| STATUS_INVALID_PARAMETER)?;
        // SAFETY: IoAllocateMdl only records the range (it touches none of
        // it) and may be called at IRQL <= DISPATCH_LEVEL; no IRP is given,
        // so the MDL is the caller's alone.
        let mdl = unsafe { IoAllocateMdl(address, len, 0, 0, core::ptr::null_mut()) };
        if mdl.is_null() {
            return Err(STATUS_INSUFFICIENT_RESOURCES);
        }
        Ok(Self(mdl))
    }
}

impl Mdl {
    /// The MDL.
    pub(crate) fn as_ptr(&self) -> PMDL {
        self.0
    }
}

/// The locked MDL of a region [`UserPin::region`] made (a user buffer
/// pinned for a memory registration), for a DMA mapping of it; `None` for
/// any other region.
///
/// IRQL: any.
pub(crate) fn pinned_mdl(region: &Region) -> Option<PMDL> {
    region
        .owner()?
        .downcast_ref::<UserPin>()
        .map(|pin| pin.mdl.0)
}

impl Drop for Mdl {
    /// `IoFreeMdl`. IRQL: <= DISPATCH_LEVEL.
    fn drop(&mut self) {
        // SAFETY: the MDL came from IoAllocateMdl and is freed once; every
        // owner undoes its mappings and locks before letting it go.
        unsafe { IoFreeMdl(self.0) };
    }
}

// SAFETY: an MDL is a plain kernel structure with no thread affinity; every
// call on it here is allowed from any thread (at the IRQL each states).
unsafe impl Send for Mdl {}
// SAFETY: shared references to an `Mdl` give access to nothing (the
// pointer is only used by the owner's `&mut self` / by-value methods).
unsafe impl Sync for Mdl {}

/// A file's user pins, counted so that its cleanup can wait for the last to
/// be released. Lives in an `Arc` shared by the file's context and every
/// pin it made.
pub(crate) struct FilePins {
    count: AtomicUsize,
    /// A notification event, signaled whenever `count` drops to 0.
    idle: UnsafeCell<KEVENT>,
}

// SAFETY: the event is only touched through the kernel's event routines,
// which synchronize internally and may be called from any thread at IRQL <=
// DISPATCH_LEVEL; the count is atomic.
unsafe impl Send for FilePins {}
// SAFETY: as above.
unsafe impl Sync for FilePins {}

impl FilePins {
    /// No pins, the event initialized (not signaled: [`FilePins::wait_idle`]
    /// looks at the count first).
    ///
    /// IRQL: <= DISPATCH_LEVEL (nonpaged pool).
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES` when the pool cannot hold it.
    pub(crate) fn new() -> Result<Shared<Self>, NtStatus> {
        let pins = Shared::try_new(Self {
            count: AtomicUsize::new(0),
            idle: UnsafeCell::new(KEVENT::default()),
        })
        .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        // SAFETY: the event is in nonpaged pool (the Arc), stays there for
        // the Arc's life, and nothing else can reach it yet; a notification
        // event may be initialized at any IRQL.
        unsafe { KeInitializeEvent(pins.idle.get(), _EVENT_TYPE::NotificationEvent, 0) };
        Ok(pins)
    }

    fn pinned(&self) {
        self.count.fetch_add(1, Ordering::AcqRel);
    }

    /// IRQL: <= DISPATCH_LEVEL.
    fn unpinned(&self) {
        if self.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            // SAFETY: an initialized event in nonpaged memory; KeSetEvent
            // with Wait = FALSE may be called at IRQL <= DISPATCH_LEVEL.
            let _ = unsafe { KeSetEvent(self.idle.get(), 0, 0) };
        }
    }

    /// Waits until the file holds no pin, for at most
    /// [`CLEANUP_PIN_TIMEOUT_S`] seconds: the pins left then, 0 when idle. A pin
    /// released after the count was read sets the event after the clear, so
    /// nothing is missed.
    ///
    /// Bounded, so that a pin the driver leaked (a bug) cannot make the
    /// closing process unkillable; the caller logs what is left (the
    /// process then ends with locked pages: bugcheck 0x76, which names the
    /// driver, rather than a hang).
    ///
    /// IRQL: PASSIVE_LEVEL (EvtFileCleanup).
    pub(crate) fn wait_idle(&self) -> usize {
        for _ in 0..CLEANUP_PIN_TIMEOUT_S {
            // SAFETY: an initialized event; KeClearEvent may be called at
            // IRQL <= DISPATCH_LEVEL.
            unsafe { KeClearEvent(self.idle.get()) };
            if self.count.load(Ordering::Acquire) == 0 {
                return 0;
            }
            // A relative timeout of one second, in 100 ns units.
            let mut timeout = LARGE_INTEGER {
                QuadPart: -10_000_000,
            };
            // SAFETY: the event lives as long as `self`; a wait with a
            // timeout is allowed at PASSIVE_LEVEL (the caller), kernel mode,
            // not alertable; the timeout lives across the call.
            let _ = unsafe {
                KeWaitForSingleObject(
                    self.idle.get().cast(),
                    _KWAIT_REASON::Executive,
                    kernel_mode(),
                    0,
                    &raw mut timeout,
                )
            };
        }
        self.count.load(Ordering::Acquire)
    }
}

/// How long a file's cleanup waits for its user pins to be released.
pub(crate) const CLEANUP_PIN_TIMEOUT_S: u32 = 10;

/// `KernelMode` as a `KPROCESSOR_MODE`.
fn kernel_mode() -> KPROCESSOR_MODE {
    #[allow(clippy::cast_possible_truncation, reason = "KernelMode is 0")]
    let mode = _MODE::KernelMode as KPROCESSOR_MODE;
    mode
}

/// A user range probed, locked and mapped for the system: the memory of a
/// user-mode memory registration. The HCA reaches it through the region
/// [`UserPin::region`] builds, which owns the pin.
pub(crate) struct UserPin {
    mdl: Mdl,
    system: *mut c_void,
    pins: Shared<FilePins>,
}

// SAFETY: the pin owns its MDL and system mapping; undoing them is allowed
// from any thread at IRQL <= DISPATCH_LEVEL.
unsafe impl Send for UserPin {}
// SAFETY: a shared `UserPin` exposes nothing (only its drop acts).
unsafe impl Sync for UserPin {}

impl UserPin {
    /// Probes and locks `len` bytes at user address `address` of the
    /// current process (for writing when `write`), maps them for the
    /// system, and returns the region over the system mapping; the region
    /// owns the pin.
    ///
    /// IRQL: <= APC_LEVEL, in the context of the process the range belongs
    /// to (the core calls it from `Device::in_caller_context`).
    ///
    /// # Errors
    /// The probe's exception status (`STATUS_ACCESS_VIOLATION`: not the
    /// process's memory, or not writable when `write`);
    /// `STATUS_INSUFFICIENT_RESOURCES` when the pages cannot be locked or
    /// mapped; `STATUS_INVALID_PARAMETER` for a range an MDL cannot describe.
    pub(crate) fn region(
        address: u64,
        len: usize,
        write: bool,
        pins: Shared<FilePins>,
    ) -> Result<irpverbs_ring::Shared<Region>, NtStatus> {
        let address = usize::try_from(address).map_err(|_| STATUS_INVALID_PARAMETER)?;
        let mdl = Mdl::new(core::ptr::with_exposed_provenance_mut(address), len)?;
        let operation = if write {
            _LOCK_OPERATION::IoWriteAccess
        } else {
            _LOCK_OPERATION::IoReadAccess
        };
        // SAFETY: a fresh MDL describing a user range of the current
        // process, not locked yet; the caller is at IRQL <= APC_LEVEL in
        // that process's context; the shim catches the probe's exception.
        let status = unsafe { IvProbeAndLockPages(mdl.0, operation) };
        if !nt_success(status) {
            return Err(status);
        }
        // SAFETY: the MDL's pages are locked (just above) and not mapped
        // for the system yet; a KernelMode mapping may be made at IRQL <=
        // DISPATCH_LEVEL and returns null (no bugcheck, no exception) on
        // failure.
        let system = unsafe {
            MmMapLockedPagesSpecifyCache(
                mdl.0,
                kernel_mode(),
                _MEMORY_CACHING_TYPE::MmCached,
                core::ptr::null_mut(),
                0,
                mapping_priority(),
            )
        };
        if system.is_null() {
            // SAFETY: locked just above, by this MDL, and not mapped.
            unsafe { MmUnlockPages(mdl.0) };
            return Err(STATUS_INSUFFICIENT_RESOURCES);
        }
        pins.pinned();
        let pin = UserPin { mdl, system, pins };
        // SAFETY: the system mapping covers `len` bytes of locked pages and
        // stays valid until the region's owner (the pin) is dropped with
        // the region; nothing in Rust references the bytes (the user process
        // and the HCA reach them only by copies and atomics).
        let region = unsafe {
            Region::from_raw_parts(
                system.cast(),
                len,
                Some(Box::new(pin) as Box<dyn Any + Send + Sync>),
            )
        };
        let region = region.ok_or(STATUS_INVALID_PARAMETER)?;
        irpverbs_ring::Shared::try_new(region).map_err(|_| STATUS_INSUFFICIENT_RESOURCES)
    }
}

impl Drop for UserPin {
    /// Unmaps the system mapping, unlocks the pages, frees the MDL (its own
    /// drop) and counts the pin out of its file.
    ///
    /// IRQL: <= DISPATCH_LEVEL, any context.
    fn drop(&mut self) {
        // SAFETY: `system` is this MDL's KernelMode mapping, undone once,
        // at IRQL <= DISPATCH_LEVEL (allowed for a system-space mapping).
        unsafe { MmUnmapLockedPages(self.system, self.mdl.0) };
        // SAFETY: the MDL's pages were locked by IvProbeAndLockPages and
        // are unlocked once; allowed at IRQL <= DISPATCH_LEVEL in any
        // process (the MDL records its process).
        unsafe { MmUnlockPages(self.mdl.0) };
        self.pins.unpinned();
    }
}

/// A ring mapped into a user process: the MDL over the ring's nonpaged
/// memory, the user address, and a reference on the process.
///
/// Only [`UserMapping::unmap`] undoes it. Dropped without it (which the
/// core never does), it leaks the MDL and the process reference rather than
/// free an MDL that is still mapped.
pub struct UserMapping {
    mdl: ManuallyDrop<Mdl>,
    user: *mut c_void,
    process: PEPROCESS,
}

// SAFETY: the mapping is plain data (an MDL, an address in another address
// space, a referenced process) undone by `unmap`, which attaches to the
// process it needs; nothing ties it to a thread.
unsafe impl Send for UserMapping {}

impl UserMapping {
    /// Maps all of `ring`'s memory into the current process and returns
    /// where the ring is there.
    ///
    /// IRQL: <= APC_LEVEL, in the context of the process to map into (the
    /// core calls it from `Device::in_caller_context`).
    ///
    /// # Errors
    /// The mapping's exception status, or `STATUS_INSUFFICIENT_RESOURCES`.
    pub(crate) fn map(ring: &Ring) -> Result<(IvRingMap, Self), NtStatus> {
        let region = ring.region();
        let (user, mapping) = Self::map_region(region)?;
        let offset = |kernel: u64| user + (kernel - region.addr());
        let kernel = ring.map();
        let map = IvRingMap {
            entries_addr: offset(kernel.entries_addr),
            control_addr: offset(kernel.control_addr),
            ..kernel
        };
        Ok((map, mapping))
    }

    /// Maps all of `region` (whole pages of nonpaged pool: a ring, or a
    /// doorbell page; or whole pages of a device's BAR,
    /// [`crate::pci::is_io_space`], mapped uncached) into the current
    /// process, writable, and returns its user address.
    ///
    /// IRQL: <= APC_LEVEL, in the context of the process to map into.
    ///
    /// # Errors
    /// The mapping's exception status, or `STATUS_INSUFFICIENT_RESOURCES`.
    pub(crate) fn map_region(region: &Region) -> Result<(u64, Self), NtStatus> {
        // Device memory keeps the attribute of the driver's own mapping
        // (MmMapIoSpaceEx, PAGE_NOCACHE): two mappings of a page with
        // different attributes are not allowed.
        let cache = if crate::pci::is_io_space(region) {
            _MEMORY_CACHING_TYPE::MmNonCached
        } else {
            _MEMORY_CACHING_TYPE::MmCached
        };
        let base = core::ptr::with_exposed_provenance_mut::<c_void>(
            usize::try_from(region.addr()).map_err(|_| STATUS_INVALID_PARAMETER)?,
        );
        let mdl = Mdl::new(base, region.len())?;
        // SAFETY: the MDL describes the region, nonpaged pool (or a BAR's
        // I/O space mapping, for which the MDL is flagged as I/O space)
        // that stays mapped while the core keeps the mapping (it holds
        // the region until after `unmap`); IRQL <= DISPATCH_LEVEL.
        unsafe { MmBuildMdlForNonPagedPool(mdl.0) };
        let mut user: PVOID = core::ptr::null_mut();
        // SAFETY: the MDL describes resident pages (built just above); the
        // caller is at IRQL <= APC_LEVEL in the target process's context;
        // the shim catches the mapping's exception.
        let status = unsafe { IvMapLockedPagesUser(mdl.0, cache, &raw mut user) };
        if !nt_success(status) {
            return Err(status);
        }
        // SAFETY: IoGetCurrentProcess has no preconditions.
        let process = unsafe { IoGetCurrentProcess() };
        // SAFETY: the current process is a live object; the reference keeps
        // it until `unmap` gives it back.
        let _ = unsafe { ObfReferenceObject(process.cast()) };
        Ok((
            user.addr() as u64,
            Self {
                mdl: ManuallyDrop::new(mdl),
                user,
                process,
            },
        ))
    }

    /// Removes the mapping from the process it was made in, attaching to
    /// that process first when the current one is another, and lets the
    /// process go.
    ///
    /// IRQL: <= APC_LEVEL (the core calls it from `in_caller_context` and
    /// the file callbacks).
    pub(crate) fn unmap(mut self) {
        let mut apc = KAPC_STATE::default();
        // SAFETY: IoGetCurrentProcess has no preconditions.
        let attach = unsafe { IoGetCurrentProcess() } != self.process;
        if attach {
            // SAFETY: the process is referenced (taken in `map`); the caller
            // is at IRQL <= APC_LEVEL; the APC state lives on this frame
            // until the detach below.
            unsafe { KeStackAttachProcess(self.process, &raw mut apc) };
        }
        // SAFETY: `user` is this MDL's UserMode mapping in the (now
        // current) process it was made in, undone once, at IRQL <=
        // APC_LEVEL.
        unsafe { MmUnmapLockedPages(self.user, self.mdl.0) };
        if attach {
            // SAFETY: undoes the attach above with its own APC state.
            unsafe { KeUnstackDetachProcess(&raw mut apc) };
        }
        // SAFETY: gives back the reference `map` took, once.
        let _ = unsafe { ObfDereferenceObject(self.process.cast()) };
        // SAFETY: taken once, here, after its mapping was undone; `self`
        // goes away with this call.
        drop(unsafe { ManuallyDrop::take(&mut self.mdl) });
    }
}
