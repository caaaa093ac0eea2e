//! The kernel ULPs' direct-call table (`include/irpverbs_kernel.h`),
//! published with `IRP_MN_QUERY_INTERFACE` for
//! [`GUID_IV_KERNEL_INTERFACE`] (`{17EE45AE-E023-4F3B-81FC-6784694953D3}`).
//!
//! The table is `irpverbs_kernel_table::kernel` (`no_std`, tested on Linux,
//! the same code host mode hands out): this module only gives it the
//! HCA's doorbells (the `Hca` trait's) and keeps the device's reference to it.
//!
//! # Lifetime
//! [`KernelInterface::new`] builds the table over the device's HCA with
//! one reference, the device's own. KMDF (`WdfDeviceAddQueryInterface`)
//! copies the table when it is added and, for every `IRP_MN_QUERY_INTERFACE`
//! for the GUID, copies it into the requester's `INTERFACE` and calls
//! `InterfaceReference(Context)`; the ULP calls `InterfaceDereference(Context)`
//! when done. The device drops its reference in its destroy callback. The
//! context (counted and allocated fallibly: a device add that cannot get it
//! fails with `STATUS_INSUFFICIENT_RESOURCES`) holds a reference (`Shared`) to the HCA, so a ULP that still holds a
//! reference after removal calls into live memory (a removed HCA ignores
//! doorbells for queues it no longer has), and a reference on the WDM
//! device object (`ObReferenceObject`), so that the I/O manager does not
//! unload the driver's image while a ULP can still call its code: the image
//! goes only after the device object's last reference, which the context's
//! drop (the last `InterfaceDereference`) gives back.
//!
//! # CEP callbacks
//! The table's CEP functions (version 2) reach the device's CM through
//! [`KmdfCeps`]: the ULP's `PFILE_OBJECT` becomes the framework's file
//! object (`WdfDeviceGetFileObject`) and its key; a registered C callback
//! is kept as two words (no allocation). The device's state is reachable
//! from the table only while the device lives: its destroy callback
//! detaches it ([`KmdfCeps::detach`], a rundown of the calls in progress),
//! after which the CEP functions return `STATUS_DEVICE_REMOVED`.
//!
//! # Versions
//! KMDF serves `IRP_MN_QUERY_INTERFACE` from the table registered with
//! `WdfDeviceAddQueryInterface` only when the query's `Size` and `Version`
//! are at least the table's; the device registers the whole (version 2)
//! table. So that a ULP built against version 1 still gets its table, the
//! device also preprocesses `IRP_MJ_PNP`/`IRP_MN_QUERY_INTERFACE`
//! (`WdfDeviceInitAssignWdmIrpPreprocessCallback`): a query for the GUID
//! that [`irpverbs_kernel_table::kernel::query_layout`] (host mode's rule)
//! gives version 1's layout is served by [`KernelInterface::serve_query`]
//! and completed there; every other query goes on to KMDF
//! (`WdfDeviceWdmDispatchPreprocessedIrp`).
//!
//! IRQL: every table function is callable at IRQL <= DISPATCH_LEVEL; none
//! blocks (but `unregister_cep_callback` spins while a callback runs on
//! another processor); `open_*` allocate from nonpaged pool (the global
//! allocator).
//! Each opened queue has a `KSPIN_LOCK` ([`KmdfSpeedLock`]): post, poll
//! and arm hold it, acquired with `KeAcquireSpinLockRaiseToDpc`, so a ULP
//! may call from a thread and from a DPC on the same processor.

use alloc::boxed::Box;
use core::cell::UnsafeCell;
use core::ffi::c_void;
use core::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use irpverbs_abi::{
    IvCepEventOut, IvHandle, NtStatus, STATUS_DEVICE_REMOVED, STATUS_INSUFFICIENT_RESOURCES,
    STATUS_INVALID_HANDLE, STATUS_SUCCESS, nt_success,
};
use irpverbs_core::Hca;
use irpverbs_core::cm::{CepCallback, CepFunction, CepReady};
use irpverbs_kernel_table::kernel::{
    CepCalls, CepNotify, IV_KERNEL_INTERFACE_GUID, IvKernelInterface, SpeedLock, SpeedPlatform,
    TableLayout, interface_with_cm, query_layout, serve_query,
};
use irpverbs_kernel_table::{Bell, Doorbells};
use irpverbs_ring::Shared;
use wdk_sys::ntddk::{
    IofCompleteRequest, KeAcquireSpinLockRaiseToDpc, KeReleaseSpinLock, ObfDereferenceObject,
    ObfReferenceObject,
};
use wdk_sys::{
    GUID, IO_NO_INCREMENT, IRP_MJ_PNP, IRP_MN_QUERY_INTERFACE, KSPIN_LOCK, NTSTATUS,
    PDEVICE_OBJECT, PIRP, PWDFDEVICE_INIT, WDFDEVICE, call_unsafe_wdf_function_binding,
};

use crate::backend::Hw;
use crate::device::{DeviceState, file_key};

/// The interface type of the table, `{17EE45AE-E023-4F3B-81FC-6784694953D3}`:
/// `IV_KERNEL_INTERFACE_GUID` of `irpverbs_kernel_table::kernel` (and of
/// `include/irpverbs_kernel.h`) as a `GUID`.
pub const GUID_IV_KERNEL_INTERFACE: GUID = GUID {
    Data1: IV_KERNEL_INTERFACE_GUID.0,
    Data2: IV_KERNEL_INTERFACE_GUID.1,
    Data3: IV_KERNEL_INTERFACE_GUID.2,
    Data4: IV_KERNEL_INTERFACE_GUID.3,
};

/// The minor functions of `IRP_MJ_PNP` the device preprocesses.
static PREPROCESSED_PNP: [u8; 1] = [IRP_MN_QUERY_INTERFACE as u8];

/// Registers [`evt_device_wdm_irp_preprocess`] for `IRP_MJ_PNP` /
/// `IRP_MN_QUERY_INTERFACE`, so that a version 1 query for the table is
/// served (KMDF's own handling refuses a `Size` below the registered
/// version 2 table's).
///
/// IRQL: PASSIVE_LEVEL (EvtDriverDeviceAdd, before `WdfDeviceCreate`).
///
/// # Errors
/// `WdfDeviceInitAssignWdmIrpPreprocessCallback`'s failure
/// (`STATUS_INSUFFICIENT_RESOURCES`); the device add fails with it.
///
/// # Safety
/// `device_init` must be the framework's, before `WdfDeviceCreate`.
pub(crate) unsafe fn assign_query_interface_preprocess(
    device_init: PWDFDEVICE_INIT,
) -> Result<(), NtStatus> {
    // SAFETY: `device_init` is valid (caller); the callback has the
    // EVT_WDFDEVICE_WDM_IRP_PREPROCESS signature; the minor function list
    // is a 'static of the length given (the framework copies it).
    let status = unsafe {
        call_unsafe_wdf_function_binding!(
            WdfDeviceInitAssignWdmIrpPreprocessCallback,
            device_init,
            Some(evt_device_wdm_irp_preprocess),
            IRP_MJ_PNP as u8,
            PREPROCESSED_PNP.as_ptr().cast_mut(),
            PREPROCESSED_PNP.len() as u32
        )
    };
    if nt_success(status) {
        Ok(())
    } else {
        Err(status)
    }
}

/// Whether `guid` (an `IRP_MN_QUERY_INTERFACE`'s `InterfaceType`) is the
/// table's.
///
/// # Safety
/// `guid` is null or points to a GUID.
unsafe fn is_table_guid(guid: *const GUID) -> bool {
    // SAFETY: null or a GUID (caller).
    let Some(guid) = (unsafe { guid.as_ref() }) else {
        return false;
    };
    let ours = &GUID_IV_KERNEL_INTERFACE;
    (guid.Data1, guid.Data2, guid.Data3, guid.Data4)
        == (ours.Data1, ours.Data2, ours.Data3, ours.Data4)
}

/// `EvtDeviceWdmIrpPreprocess` for `IRP_MJ_PNP` / `IRP_MN_QUERY_INTERFACE`:
/// a query for [`GUID_IV_KERNEL_INTERFACE`] that
/// [`irpverbs_kernel_table::kernel::query_layout`] gives version 1's layout
/// is served here ([`KernelInterface::serve_query`]: the version 1 table,
/// referenced for the requester) and the IRP completed with
/// `STATUS_SUCCESS`; every other IRP goes on to the framework
/// (`WdfDeviceWdmDispatchPreprocessedIrp`), which serves version 2 from
/// the table `WdfDeviceAddQueryInterface` registered, as without this
/// callback.
///
/// IRQL: PASSIVE_LEVEL (PnP IRPs); nothing here blocks.
extern "C" fn evt_device_wdm_irp_preprocess(device: WDFDEVICE, irp: PIRP) -> NTSTATUS {
    // SAFETY: the framework's IRP for our device, live for the callback.
    if let Some(status) = unsafe { serve_version_1(device, irp) } {
        // SAFETY: as above; not yet completed.
        let io_status = unsafe { &mut (*irp).IoStatus };
        io_status.__bindgen_anon_1.Status = status;
        // SAFETY: our IRP to complete (not passed on), completed once, at
        // PASSIVE_LEVEL.
        unsafe { IofCompleteRequest(irp, IO_NO_INCREMENT as i8) };
        return status;
    }
    // SAFETY: the IRP the framework gave this callback, not completed here.
    unsafe { call_unsafe_wdf_function_binding!(WdfDeviceWdmDispatchPreprocessedIrp, device, irp) }
}

/// Serves `irp` when it is a query for the table that gets version 1's
/// layout: the status to complete it with, or `None` for the framework.
///
/// # Safety
/// `irp` is a live `IRP_MJ_PNP` IRP of `device` (ours, live), with its
/// current stack location set.
unsafe fn serve_version_1(device: WDFDEVICE, irp: PIRP) -> Option<NTSTATUS> {
    // SAFETY: a live IRP (caller).
    let irp = unsafe { &*irp };
    // SAFETY: the union member the I/O manager sets for an IRP on its way
    // through a driver stack.
    let overlay = unsafe { irp.Tail.Overlay };
    // SAFETY: as above (a driver-bound IRP is not a packet).
    let stack = unsafe {
        overlay
            .__bindgen_anon_2
            .__bindgen_anon_1
            .CurrentStackLocation
    };
    // SAFETY: the current stack location of a live IRP (caller).
    let stack = unsafe { &*stack };
    if stack.MinorFunction != IRP_MN_QUERY_INTERFACE as u8 {
        return None;
    }
    // SAFETY: an IRP_MN_QUERY_INTERFACE's parameters are QueryInterface.
    let query = unsafe { stack.Parameters.QueryInterface };
    // SAFETY: the requester's InterfaceType, null or a GUID.
    if !unsafe { is_table_guid(query.InterfaceType) }
        || query_layout(query.Version, query.Size) != Ok(TableLayout::V1)
    {
        return None;
    }
    // SAFETY: `device` is ours, live for the callback (caller).
    let state = unsafe { crate::device::state(device) }?;
    let out = query.Interface.cast::<IvKernelInterface>();
    // SAFETY: the requester's Interface buffer holds `Size` bytes (the
    // IRP_MN_QUERY_INTERFACE contract).
    Some(
        match unsafe { state.kernel.serve_query(query.Size, query.Version, out) } {
            Ok(()) => STATUS_SUCCESS,
            Err(status) => status,
        },
    )
}

/// The HCA's doorbells, as the table rings them: direct calls of its
/// [`Hca`] doorbell methods, by queue number (a kernel ULP's queues have no
/// doorbell page slot).
///
/// IRQL: <= DISPATCH_LEVEL, never blocking.
struct HcaDoorbells {
    hca: Hw,
    /// Keeps the driver's image loaded while the table can be called.
    _device: DeviceObjectReference,
}

impl Doorbells for HcaDoorbells {
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

/// The device's CM as the table's CEP functions reach it: the device and
/// its state while it lives (null before `EvtDriverDeviceAdd` set them and
/// after the destroy callback detached them), and the calls in progress.
pub(crate) struct KmdfCeps {
    device: AtomicPtr<c_void>,
    state: AtomicPtr<DeviceState>,
    /// Calls that may be using `state` (the rundown [`KmdfCeps::detach`]
    /// waits for).
    active: AtomicUsize,
}

impl KmdfCeps {
    /// Runs `f` with the live device and its state, or
    /// `STATUS_DEVICE_REMOVED` once detached.
    fn with_device<R>(
        &self,
        f: impl FnOnce(WDFDEVICE, &DeviceState) -> Result<R, NtStatus>,
    ) -> Result<R, NtStatus> {
        self.active.fetch_add(1, Ordering::SeqCst);
        let state = self.state.load(Ordering::SeqCst);
        let device: WDFDEVICE = self.device.load(Ordering::SeqCst).cast();
        // SAFETY: a non-null state is the device's, not freed before
        // `detach` returned, which waits for this call (counted in
        // `active`, incremented before the load).
        let r = match unsafe { state.as_ref() } {
            Some(state) if !device.is_null() => f(device, state),
            _ => Err(STATUS_DEVICE_REMOVED),
        };
        self.active.fetch_sub(1, Ordering::SeqCst);
        r
    }

    /// The core's key for a kernel ULP's file object of `device`.
    fn file(
        device: WDFDEVICE,
        file_object: *mut c_void,
    ) -> Result<irpverbs_core::FileKey, NtStatus> {
        if file_object.is_null() {
            return Err(STATUS_INVALID_HANDLE);
        }
        // SAFETY: `device` is live (the caller holds the rundown); the file
        // object is the ULP's (the C contract: one it opened on the
        // device); WdfDeviceGetFileObject may be called at <= DISPATCH_LEVEL
        // and returns NULL for a file object that is not the device's.
        let file = unsafe {
            call_unsafe_wdf_function_binding!(
                WdfDeviceGetFileObject,
                device,
                file_object.cast::<wdk_sys::FILE_OBJECT>()
            )
        };
        // SAFETY: null or a live file object of the device.
        match unsafe { file_key(file) } {
            0 => Err(STATUS_INVALID_HANDLE),
            key => Ok(key),
        }
    }

    /// Makes the table's CEP functions reach `state` of `device`.
    ///
    /// # Safety
    /// `state` is `device`'s and lives until [`KmdfCeps::detach`] returned.
    pub(crate) unsafe fn attach(&self, device: WDFDEVICE, state: *mut DeviceState) {
        self.device.store(device.cast(), Ordering::SeqCst);
        self.state.store(state, Ordering::SeqCst);
    }

    /// Ends the table's access to the device: when this returns, no CEP
    /// function uses its state (it waited for those in progress).
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    pub(crate) fn detach(&self) {
        self.state.store(core::ptr::null_mut(), Ordering::SeqCst);
        self.device.store(core::ptr::null_mut(), Ordering::SeqCst);
        while self.active.load(Ordering::SeqCst) != 0 {
            core::hint::spin_loop();
        }
    }
}

/// Calls a C kernel ULP's CEP callback (at DISPATCH_LEVEL: the core runs
/// them under a spin lock).
fn notify(words: [usize; 2], ready: CepReady) {
    // SAFETY: the words are a registered callback's (`CepNotify::to_words`
    // in `KmdfCeps::set_cep_callback`), and the core calls only a CEP's
    // current callback: unregistering waits for a running call.
    unsafe { CepNotify::notify_words(words, ready.cep, ready.user_context) };
}

/// The table's reference to the device's [`KmdfCeps`].
struct TableCeps(Shared<KmdfCeps>);

impl CepCalls for TableCeps {
    fn set_cep_callback(
        &self,
        file_object: *mut c_void,
        cep: IvHandle,
        callback: Option<CepNotify>,
    ) -> Result<(), NtStatus> {
        self.0.with_device(|device, state| {
            let file = KmdfCeps::file(device, file_object)?;
            let callback = callback.map(|n| {
                CepCallback::Function(CepFunction {
                    call: notify,
                    words: n.to_words(),
                })
            });
            state.device.set_cep_callback(file, cep, callback)
        })
    }

    fn poll_cep_event(
        &self,
        file_object: *mut c_void,
        cep: IvHandle,
    ) -> Result<Option<IvCepEventOut>, NtStatus> {
        self.0.with_device(|device, state| {
            let file = KmdfCeps::file(device, file_object)?;
            state.device.poll_cep_event(file, cep)
        })
    }
}

/// The device's table and its own reference to the table's context.
pub(crate) struct KernelInterface {
    table: IvKernelInterface,
    /// The CM behind the table's CEP functions.
    pub(crate) ceps: Shared<KmdfCeps>,
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
    pub(crate) unsafe fn new(hca: Hw, device: PDEVICE_OBJECT) -> Result<Self, NtStatus> {
        // SAFETY: a live device object (caller).
        let device = unsafe { DeviceObjectReference::new(device) };
        let ceps = Shared::try_new(KmdfCeps {
            device: AtomicPtr::new(core::ptr::null_mut()),
            state: AtomicPtr::new(core::ptr::null_mut()),
            active: AtomicUsize::new(0),
        })
        .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        let table = interface_with_cm(
            HcaDoorbells {
                hca,
                _device: device,
            },
            KmdfSpeed,
            TableCeps(ceps.clone()),
        )?;
        Ok(Self { table, ceps })
    }

    /// Serves an `IRP_MN_QUERY_INTERFACE` for the table into the requester's
    /// `out` (`size` bytes, asking for `version`): the layout
    /// [`irpverbs_kernel_table::kernel::query_layout`] names (the same rule
    /// as host mode's), referenced once for the requester, who calls
    /// `InterfaceDereference(Context)` when done.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER`: a null `out`, a version other than 1
    /// and 2, or a `size` smaller than that version's table (nothing is
    /// written or referenced).
    ///
    /// # Safety
    /// `out` is null or valid for `size` bytes of writes.
    pub(crate) unsafe fn serve_query(
        &self,
        size: u16,
        version: u16,
        out: *mut IvKernelInterface,
    ) -> Result<(), NtStatus> {
        // SAFETY: forwarded from the caller.
        unsafe { serve_query(&self.table, size, version, out) }?;
        let reference = self.table.interface_reference;
        // SAFETY: the context is the device's table's, referenced (by the
        // device) while `self` lives; this reference is the requester's.
        unsafe { reference(self.table.context) };
        Ok(())
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
