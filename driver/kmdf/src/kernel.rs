//! The kernel ULPs' direct-call table (`include/irpverbs_kernel.h`),
//! published with `IRP_MN_QUERY_INTERFACE` for
//! [`GUID_IV_KERNEL_INTERFACE`] (`{17EE45AE-E023-4F3B-81FC-6784694953D3}`).
//!
//! The table is `irpverbs_kernel_table::kernel` (`no_std`, tested on Linux,
//! the same code host mode hands out): this module only gives it the soft
//! HCA's doorbells and keeps the device's reference to it.
//!
//! # Lifetime
//! [`KernelInterface::new`] builds the table over the device's soft HCA with
//! one reference, the device's own. KMDF (`WdfDeviceAddQueryInterface`)
//! copies the table when it is added and, for every `IRP_MN_QUERY_INTERFACE`
//! for the GUID, copies it into the requester's `INTERFACE` and calls
//! `InterfaceReference(Context)`; the ULP calls `InterfaceDereference(Context)`
//! when done. The device drops its reference in its destroy callback. The
//! context (counted and allocated fallibly: a device add that cannot get it
//! fails with `STATUS_INSUFFICIENT_RESOURCES`) holds an `Arc` of the soft HCA, so a ULP that still holds a
//! reference after removal calls into live memory (a removed HCA ignores
//! doorbells for queues it no longer has), and a reference on the WDM
//! device object (`ObReferenceObject`), so that the I/O manager does not
//! unload the driver's image while a ULP can still call its code: the image
//! goes only after the device object's last reference, which the context's
//! drop (the last `InterfaceDereference`) gives back.
//!
//! IRQL: every table function is callable at IRQL <= DISPATCH_LEVEL; none
//! blocks; `open_*` allocate from nonpaged pool (the global allocator).
//! Each opened queue has a `KSPIN_LOCK` ([`KmdfSpeedLock`]): post, poll
//! and arm hold it, acquired with `KeAcquireSpinLockRaiseToDpc`, so a ULP
//! may call from a thread and from a DPC on the same processor.

use alloc::boxed::Box;
use alloc::sync::Arc;
use core::cell::UnsafeCell;

use irpverbs_abi::{NtStatus, STATUS_INSUFFICIENT_RESOURCES};
use irpverbs_core::Hca;
use irpverbs_kernel_table::kernel::{
    IV_KERNEL_INTERFACE_GUID, IvKernelInterface, SpeedLock, SpeedPlatform, interface,
};
use irpverbs_kernel_table::{Bell, Doorbells};
use irpverbs_soft::SoftHca;
use wdk_sys::ntddk::{
    KeAcquireSpinLockRaiseToDpc, KeReleaseSpinLock, ObfDereferenceObject, ObfReferenceObject,
};
use wdk_sys::{GUID, KSPIN_LOCK, PDEVICE_OBJECT};

use crate::platform::KmdfPlatform;

/// The interface type of the table, `{17EE45AE-E023-4F3B-81FC-6784694953D3}`:
/// `IV_KERNEL_INTERFACE_GUID` of `irpverbs_kernel_table::kernel` (and of
/// `include/irpverbs_kernel.h`) as a `GUID`.
pub const GUID_IV_KERNEL_INTERFACE: GUID = GUID {
    Data1: IV_KERNEL_INTERFACE_GUID.0,
    Data2: IV_KERNEL_INTERFACE_GUID.1,
    Data3: IV_KERNEL_INTERFACE_GUID.2,
    Data4: IV_KERNEL_INTERFACE_GUID.3,
};

/// The soft HCA's doorbells, as the table rings them: direct calls of its
/// [`Hca`] doorbell methods, by queue number (a kernel ULP's queues have no
/// doorbell page slot).
///
/// IRQL: <= DISPATCH_LEVEL, never blocking.
struct SoftDoorbells {
    hca: Arc<SoftHca<KmdfPlatform>>,
    /// Keeps the driver's image loaded while the table can be called.
    _device: DeviceObjectReference,
}

impl Doorbells for SoftDoorbells {
    fn sq(&self, qp: Bell) {
        self.hca.sq_doorbell(qp.number);
    }
    fn rq(&self, qp: Bell) {
        self.hca.rq_doorbell(qp.number);
    }
    fn srq(&self, srq: Bell) {
        self.hca.srq_doorbell(srq.number);
    }
    fn cq_arm(&self, cq: Bell) {
        self.hca.cq_arm_doorbell(cq.number);
    }
}

/// A reference on a WDM device object (`ObReferenceObject`), given back on
/// drop (`ObDereferenceObject`).
struct DeviceObjectReference(PDEVICE_OBJECT);

// SAFETY: a referenced device object may be dereferenced from any thread
// at IRQL <= DISPATCH_LEVEL; the pointer is never dereferenced here.
unsafe impl Send for DeviceObjectReference {}
// SAFETY: as above; shared access does nothing with it.
unsafe impl Sync for DeviceObjectReference {}

impl DeviceObjectReference {
    /// References `device`.
    ///
    /// # Safety
    /// `device` must be a live device object.
    unsafe fn new(device: PDEVICE_OBJECT) -> Self {
        // SAFETY: a live object (caller); ObReferenceObject may be called at
        // IRQL <= DISPATCH_LEVEL.
        let _ = unsafe { ObfReferenceObject(device.cast()) };
        Self(device)
    }
}

impl Drop for DeviceObjectReference {
    /// IRQL: <= DISPATCH_LEVEL (a last reference dropped at DISPATCH_LEVEL
    /// has the object manager defer the deletion).
    fn drop(&mut self) {
        // SAFETY: referenced in `new`, given back once.
        let _ = unsafe { ObfDereferenceObject(self.0.cast()) };
    }
}

/// One opened queue's lock: a `KSPIN_LOCK` (free is 0, all that
/// `KeInitializeSpinLock` does), in its own nonpaged allocation so that it
/// stays in place while held.
struct KmdfSpeedLock(UnsafeCell<KSPIN_LOCK>);

// SAFETY: the lock word is only touched by the kernel's spin lock routines,
// which are made for concurrent use from any processor.
unsafe impl Send for KmdfSpeedLock {}
// SAFETY: as above.
unsafe impl Sync for KmdfSpeedLock {}

impl SpeedLock for KmdfSpeedLock {
    /// `KeAcquireSpinLockRaiseToDpc`.
    ///
    /// IRQL: <= DISPATCH_LEVEL (the table's contract).
    fn acquire(&self) -> u8 {
        // SAFETY: a valid KSPIN_LOCK that does not move while held (it is
        // boxed, and the table releases it before the box can be dropped);
        // the caller is at <= DISPATCH_LEVEL.
        unsafe { KeAcquireSpinLockRaiseToDpc(self.0.get()) }
    }

    /// `KeReleaseSpinLock`.
    ///
    /// IRQL: DISPATCH_LEVEL, on the processor that acquired it.
    fn release(&self, old: u8) {
        // SAFETY: releases the hold `acquire` took (the table pairs them
        // within one call, on one processor at DISPATCH_LEVEL), back to
        // the IRQL it returned.
        unsafe { KeReleaseSpinLock(self.0.get(), old) };
    }
}

/// The table's platform: a `KSPIN_LOCK` per opened queue.
struct KmdfSpeed;

impl SpeedPlatform for KmdfSpeed {
    /// IRQL: <= DISPATCH_LEVEL (nonpaged pool, the global allocator).
    fn new_lock(&self) -> Result<Box<dyn SpeedLock>, NtStatus> {
        irpverbs_ring::try_box(KmdfSpeedLock(UnsafeCell::new(0)))
            .map(|b| b as Box<dyn SpeedLock>)
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)
    }
}

/// The device's table and its own reference to the table's context.
pub(crate) struct KernelInterface {
    table: IvKernelInterface,
}

impl KernelInterface {
    /// The table over `hca`'s doorbells, referenced once (by the device);
    /// its context references `device` until the last dereference.
    ///
    /// IRQL: <= DISPATCH_LEVEL (it allocates the context from nonpaged pool).
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES` when the context cannot be allocated
    /// (the device add fails; the device object reference taken for it is
    /// given back).
    ///
    /// # Safety
    /// `device` must be the live WDM device object of the device whose HCA
    /// `hca` is.
    pub(crate) unsafe fn new(
        hca: Arc<SoftHca<KmdfPlatform>>,
        device: PDEVICE_OBJECT,
    ) -> Result<Self, NtStatus> {
        // SAFETY: a live device object (caller).
        let device = unsafe { DeviceObjectReference::new(device) };
        let table = interface(
            SoftDoorbells {
                hca,
                _device: device,
            },
            KmdfSpeed,
        )?;
        Ok(Self { table })
    }

    /// A copy of the table, for `WDF_QUERY_INTERFACE_CONFIG.Interface` (the
    /// framework copies `Size` bytes of it once more; it starts with the
    /// `INTERFACE` header). The copy holds no reference of its own.
    pub(crate) fn table(&self) -> IvKernelInterface {
        self.table
    }
}

impl Drop for KernelInterface {
    /// Gives back the device's reference (ULPs may still hold theirs).
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    fn drop(&mut self) {
        let dereference = self.table.interface_dereference;
        // SAFETY: the context came from `interface`, which took one
        // reference for its caller: this one, given back exactly once (the
        // table is not Clone, and this is its drop).
        unsafe { dereference(self.table.context) };
    }
}
