//! The device: `EvtDriverDeviceAdd` and every callback that reaches the
//! core, wired as the host device wires them (`driver/host/src/device.rs`).
//!
//! - The HCA is the backend's ([`crate::backend`]): a software HCA is made
//!   at device add and its interrupts queue the [`Bus`]'s DPCs, which run
//!   [`Device::dpc`] and `Device::comp_dpc` at DISPATCH_LEVEL; a PCI HCA
//!   is started in `EvtDevicePrepareHardware` from its resources (the
//!   state is made then: until it is, files and requests are refused with
//!   `STATUS_INVALID_DEVICE_STATE`), its MSI-X messages' DPCs run the same,
//!   and it is reset in `EvtDeviceReleaseHardware`.
//! - Files: a per-device counter gives each file object its [`FileKey`], kept
//!   in the file object's context (as host mode numbers its opens). Handle
//!   values are not used as keys: a file's state outlives `EvtFileClose`
//!   while its rundown destroys are in flight, and a new file object could
//!   reuse a freed handle value meanwhile.
//! - I/O: one default parallel queue at dispatch execution level, not
//!   power-managed (the core holds event waits indefinitely), takes
//!   `IRP_MJ_DEVICE_CONTROL` and `IRP_MJ_INTERNAL_DEVICE_CONTROL`.
//!   (`WdfExecutionLevelDispatch` means the callbacks may run at any IRQL up
//!   to DISPATCH_LEVEL; the core never blocks, and host mode runs the same
//!   callback at DISPATCH_LEVEL, the strictest case.)
//! - Kernel ULPs: `IRP_MN_QUERY_INTERFACE` for
//!   [`GUID_IV_KERNEL_INTERFACE`] returns the direct-call table
//!   ([`crate::kernel`]), registered with `WdfDeviceAddQueryInterface`: KMDF
//!   answers the IRP itself, copying the table and calling its
//!   `InterfaceReference`; a query for version 1 (whose `Size` KMDF would
//!   refuse) is answered by the device's `IRP_MN_QUERY_INTERFACE`
//!   preprocess callback (see [`crate::kernel`]'s versions).
//! - PnP/power: surprise removal and D0Exit to D3Final (the device is going
//!   away) run [`Device::remove`]. D0Entry starts the CM timer
//!   ([`crate::cmtimer`]) and the backend's services (a software HCA's
//!   doorbell poller, transport timer and wire), and delivers what the
//!   event queues hold; D0Exit stops them.
//! - Caller context: `EvtIoInCallerContext` runs every request through
//!   [`Device::in_caller_context`] in the requestor's thread and process
//!   (PASSIVE_LEVEL for user mode) before queueing what it returns: the one
//!   place where a user range can be pinned and a ring or doorbell page
//!   mapped into the process (`IOCTL_IV_MAP_RINGS` and
//!   `IOCTL_IV_MAP_DOORBELLS` are completed there).
//! - Process lifetime ([`crate::process`]): a user-mode file belongs to
//!   the process that opened it, referenced from `EvtDeviceFileCreate` to
//!   `EvtFileClose` and handed to [`Device::create_file`] as its owner;
//!   that process's exit runs the file down through the driver's
//!   process-notify routine, even while another process holds a handle.
//! - File cleanup (the last handle closed, in the closing process, before a
//!   process exit tears its address space down): [`Device::cleanup_file`]
//!   unmaps the file's rings and starts its rundown, then the callback
//!   waits (bounded, logging what is left) until every page the file's
//!   registrations locked is unlocked ([`FilePins::wait_idle`]).

use alloc::boxed::Box;
use core::ffi::c_void;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

use irpverbs_abi::{
    FILE_DEVICE_INFINIBAND, STATUS_INSUFFICIENT_RESOURCES, STATUS_INVALID_DEVICE_STATE,
    STATUS_SUCCESS, nt_success,
};
use irpverbs_core::{Device, DeviceConfig, FileKey, Hca, MajorFunction};
use irpverbs_ring::Shared;
use wdk_sys::ntddk::{
    KeGetProcessorNumberFromIndex, KeQueryActiveProcessorCountEx, KeSetTargetProcessorDpcEx,
};
use wdk_sys::{
    _WDF_EXECUTION_LEVEL, _WDF_FILEOBJECT_CLASS, _WDF_IO_QUEUE_DISPATCH_TYPE,
    _WDF_POWER_DEVICE_STATE, _WDF_TRI_STATE, ALL_PROCESSOR_GROUPS, FILE_DEVICE_SECURE_OPEN,
    NTSTATUS, PROCESSOR_NUMBER, PWDFDEVICE_INIT, ULONG, WDF_DPC_CONFIG, WDF_FILEOBJECT_CONFIG,
    WDF_IO_QUEUE_CONFIG, WDF_PNPPOWER_EVENT_CALLBACKS, WDF_POWER_DEVICE_STATE,
    WDF_QUERY_INTERFACE_CONFIG, WDFCMRESLIST, WDFDEVICE, WDFDPC, WDFDRIVER, WDFFILEOBJECT,
    WDFOBJECT, WDFQUEUE, WDFREQUEST, call_unsafe_wdf_function_binding,
};

use crate::GUID_DEVINTERFACE_IRPVERBS;
use crate::backend::{Backend, Hw, Made};
use crate::cmtimer::CmTimer;
use crate::context::{context_type, object_attributes, struct_size};
use crate::kernel::{GUID_IV_KERNEL_INTERFACE, KernelInterface};
use crate::mdl::FilePins;
use crate::platform::KmdfPlatform;
use crate::process::Opener;
use crate::request::{KmdfRequest, REQUEST_CONTEXT_TYPE, complete_raw, evt_request_cleanup};

/// The driver on Windows: the core's device over the backend's HCA
/// ([`crate::backend`]), over [`KmdfPlatform`].
pub(crate) type KmdfDevice = Device<KmdfPlatform, Hw>;

/// Completion vectors the bus has a DPC slot for (a software HCA's
/// vectors; a PCI HCA's are its MSI-X messages).
pub(crate) const MAX_BUS_VECTORS: usize = 64;

/// Everything one device instance holds once its HCA is made (at
/// `EvtDriverDeviceAdd` for a software HCA, at `EvtDevicePrepareHardware`
/// for a PCI one), owned by its WDFDEVICE's context until the device
/// object is destroyed.
pub(crate) struct DeviceState {
    /// The connection manager's timer (first, so that a drop cancels it
    /// before the device it calls goes): armed by the core in D0.
    cm_timer: CmTimer,
    /// The driver.
    pub(crate) device: KmdfDevice,
    /// The backend's services, running in D0 (after the device: they hold
    /// references to the HCA, not to the device).
    services: <Hw as Backend>::Services,
    /// The bus whose DPCs stand for a software HCA's interrupts.
    bus: Shared<Bus>,
    /// The next file key (host mode numbers its opens the same way).
    next_file: AtomicU64,
    /// The kernel ULPs' table, holding the device's reference to its
    /// context (dropped with the state, after the device is gone).
    pub(crate) kernel: KernelInterface,
}

/// The device's context: its instance number (`N` of
/// `\DosDevices\irpverbsN`, claimed at device add, released in the
/// destroy callback) and its state, published (release) once the HCA is
/// made and taken back in the destroy callback. Null before (the
/// framework zero-fills contexts).
struct DeviceContext {
    /// `u32::MAX` until device add claimed a number.
    instance: u32,
    /// The registry's configuration, read at device add.
    config: DeviceConfig,
    state: AtomicPtr<DeviceState>,
}
context_type!(DEVICE_CONTEXT_TYPE, DeviceContext, c"IrpverbsDeviceContext");

/// A file object's context: its key, 0 until `EvtDeviceFileCreate` accepted
/// the open (keys start at 1), its pin counter and its opener.
struct FileContext {
    key: FileKey,
    /// From `Shared::into_raw`, set in `EvtDeviceFileCreate`, released in the
    /// file object's cleanup callback; null before.
    pins: AtomicPtr<FilePins>,
    /// The process that opened the file, for a user-mode open: from
    /// `Shared::into_raw`, set in `EvtDeviceFileCreate`, released in
    /// `EvtFileClose`; null for a kernel-mode open.
    opener: AtomicPtr<Opener>,
}
context_type!(FILE_CONTEXT_TYPE, FileContext, c"IrpverbsFileContext");

/// The DPCs that stand for a software HCA's interrupts
/// ([`Backend::SOFTWARE_INTERRUPTS`]): the device's and one per completion
/// vector. A PCI HCA's interrupts are its MSI-X messages' own DPCs.
pub(crate) struct Bus {
    /// The device's WDFDPC; null before it exists and once it is being
    /// deleted.
    dpc: AtomicPtr<c_void>,
    /// The data path left work after a call used its budget: the DPC runs
    /// [`Backend::resume`] first.
    resume: AtomicBool,
    /// The completion vectors' WDFDPCs (vector `v` at `v`, targeted to
    /// processor `v` modulo the active processors); null before each
    /// exists and once it is being deleted.
    comp: [AtomicPtr<c_void>; MAX_BUS_VECTORS],
}

/// A completion vector's DPC's context: its vector.
struct VectorContext {
    vector: u32,
}
context_type!(VECTOR_CONTEXT_TYPE, VectorContext, c"IrpverbsVectorContext");

impl Bus {
    /// The HCA's "ISR": queues the device's DPC (`WdfDpcEnqueue`; a DPC
    /// already queued stays queued once).
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    pub(crate) fn interrupt(&self) {
        let dpc: WDFDPC = self.dpc.load(Ordering::Acquire).cast();
        if dpc.is_null() {
            return;
        }
        // SAFETY: a non-null pointer here is the device's live WDFDPC: it is
        // stored after WdfDpcCreate succeeded and cleared by the DPC's own
        // cleanup callback before the framework deletes it (after which only
        // Device::remove'd devices remain, which post no commands and so
        // raise no interrupts). WdfDpcEnqueue may be called at any IRQL up
        // to HIGH_LEVEL.
        let _queued = unsafe { call_unsafe_wdf_function_binding!(WdfDpcEnqueue, dpc) };
    }

    /// Completion vector `vector`'s "ISR": queues that vector's DPC on its
    /// processor (`WdfDpcEnqueue`).
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    pub(crate) fn comp_interrupt(&self, vector: u32) {
        let Some(slot) = self.comp.get(vector as usize) else {
            return;
        };
        let dpc: WDFDPC = slot.load(Ordering::Acquire).cast();
        if dpc.is_null() {
            return;
        }
        // SAFETY: a non-null pointer here is the vector's live WDFDPC:
        // stored after WdfDpcCreate succeeded, cleared by its cleanup
        // callback before the framework deletes it. WdfDpcEnqueue may be
        // called at any IRQL up to HIGH_LEVEL.
        let _queued = unsafe { call_unsafe_wdf_function_binding!(WdfDpcEnqueue, dpc) };
    }

    /// The rest of a bounded data-path call: the device's DPC, flagged to
    /// run [`Backend::resume`] (one budget, requeueing what is still left),
    /// as a driver requeues the rest of its DPC's work for the DPC
    /// watchdog.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    #[allow(dead_code, reason = "asked for by a software HCA's data path only")]
    pub(crate) fn resume(&self) {
        self.resume.store(true, Ordering::Release);
        self.interrupt();
    }
}

/// The device state of `device`, if `EvtDriverDeviceAdd` got that far.
///
/// # Safety
/// `device` must be a live WDFDEVICE created by [`evt_driver_device_add`].
/// The reference is valid while the device object lives, that is, for the
/// duration of any framework callback on the device or its children.
pub(crate) unsafe fn state<'a>(device: WDFDEVICE) -> Option<&'a DeviceState> {
    // SAFETY: the caller guarantees a live device of ours, which has a
    // DeviceContext.
    let context = unsafe { DEVICE_CONTEXT_TYPE.get::<DeviceContext>(device.cast()) };
    if context.is_null() {
        return None;
    }
    // SAFETY: the context is live with the device; the pointer is
    // published once (release) when the HCA is made, and cleared only in
    // the destroy callback, after every other callback.
    let state = unsafe { &(*context).state }.load(Ordering::Acquire);
    // SAFETY: non-null means Box::into_raw of a DeviceState, freed only in
    // the destroy callback; shared access only.
    unsafe { state.as_ref() }
}

/// The core's key for a request's file object: 0 (no such file) when the
/// request has none, such as an internal IOCTL built without a file object.
///
/// # Safety
/// `file` must be null or a live WDFFILEOBJECT of the device.
pub(crate) unsafe fn file_key(file: WDFFILEOBJECT) -> FileKey {
    if file.is_null() {
        return 0;
    }
    // SAFETY: a live file object of the device has a FileContext.
    let context = unsafe { FILE_CONTEXT_TYPE.get::<FileContext>(file.cast()) };
    if context.is_null() {
        return 0;
    }
    // SAFETY: the context lives with the file object; the key is written in
    // EvtDeviceFileCreate before any request can name the file.
    unsafe { (*context).key }
}

/// The pin counter of a file: a new reference to it (the pins a user-mode
/// registration through the file makes count in it).
///
/// # Safety
/// `file` must be null or a live WDFFILEOBJECT of the device.
pub(crate) unsafe fn file_pins(file: WDFFILEOBJECT) -> Option<Shared<FilePins>> {
    if file.is_null() {
        return None;
    }
    // SAFETY: a live file object of the device has a FileContext.
    let context = unsafe { FILE_CONTEXT_TYPE.get::<FileContext>(file.cast()) };
    if context.is_null() {
        return None;
    }
    // SAFETY: the context lives with the file object; atomic access only.
    let pins = unsafe { &(*context).pins }.load(Ordering::Acquire);
    if pins.is_null() {
        return None;
    }
    // SAFETY: a non-null pointer is the context's `Shared::into_raw`
    // reference, given back only in the file object's cleanup callback,
    // which cannot run while the file has a request (the caller's). It is
    // borrowed here, and not dropped (`ManuallyDrop`).
    let context_ref = core::mem::ManuallyDrop::new(unsafe { Shared::from_raw(pins) });
    Some(Shared::clone(&context_ref))
}

// ------------------------------------------------------------- device add

/// `EvtDriverDeviceAdd`: creates the device, its symbolic link, device
/// interface and default queue, and (a software HCA) the HCA and the
/// driver state with its DPCs.
///
/// IRQL: PASSIVE_LEVEL.
pub(crate) extern "C" fn evt_driver_device_add(
    driver: WDFDRIVER,
    device_init: PWDFDEVICE_INIT,
) -> NTSTATUS {
    match add_device(driver, device_init) {
        Ok(()) => STATUS_SUCCESS,
        Err(status) => {
            wdk::println!("irpverbs: EvtDriverDeviceAdd failed: {status:#010x}");
            status
        }
    }
}

fn add_device(driver: WDFDRIVER, device_init: PWDFDEVICE_INIT) -> Result<(), NTSTATUS> {
    let config = crate::registry::device_config(driver);
    // SAFETY: the framework's device_init, valid until WdfDeviceCreate.
    unsafe { configure_init(device_init) };
    // SAFETY: as above.
    unsafe { crate::kernel::assign_query_interface_preprocess(device_init)? };
    // SAFETY: as above; configured.
    let (device, instance) = unsafe { create_device(device_init, config)? };
    // From here on a failure deletes the device, and its destroy callback
    // frees whatever its context holds.
    // SAFETY: `device` is our live device.
    unsafe { create_names(device, instance)? };
    // SAFETY: as above.
    unsafe { create_queue(device)? };
    let bus = new_bus()?;
    // SAFETY: as above, just created.
    if let Some(made) = unsafe { Hw::add(device, &KmdfPlatform, &bus) }? {
        // SAFETY: as above; no state yet.
        unsafe { publish(device, config, bus, made)? };
    }
    Ok(())
}

/// Registers the device's callbacks and object attributes on its init
/// structure: PnP/power, file objects (with a file context), the request
/// context, in-caller-context I/O; device type and secure open.
///
/// # Safety
/// `device_init` must be the framework's, before `WdfDeviceCreate`.
unsafe fn configure_init(device_init: PWDFDEVICE_INIT) {
    let mut pnp_power = WDF_PNPPOWER_EVENT_CALLBACKS {
        Size: struct_size::<WDF_PNPPOWER_EVENT_CALLBACKS>(),
        EvtDeviceD0Entry: Some(evt_device_d0_entry),
        EvtDeviceD0Exit: Some(evt_device_d0_exit),
        EvtDevicePrepareHardware: Some(evt_device_prepare_hardware),
        EvtDeviceReleaseHardware: Some(evt_device_release_hardware),
        EvtDeviceSurpriseRemoval: Some(evt_device_surprise_removal),
        EvtDeviceQueryStop: Some(evt_device_query_stop),
        ..WDF_PNPPOWER_EVENT_CALLBACKS::default()
    };
    // SAFETY: `device_init` is valid (caller); the callbacks structure is
    // initialized with its Size and is copied.
    unsafe {
        call_unsafe_wdf_function_binding!(
            WdfDeviceInitSetPnpPowerEventCallbacks,
            device_init,
            &raw mut pnp_power
        );
    }
    // SAFETY: as above; a plain value.
    unsafe {
        call_unsafe_wdf_function_binding!(
            WdfDeviceInitSetDeviceType,
            device_init,
            FILE_DEVICE_INFINIBAND
        );
    }
    // SAFETY: as above; FILE_DEVICE_SECURE_OPEN makes the device's security
    // descriptor apply to opens of names beneath it too.
    unsafe {
        call_unsafe_wdf_function_binding!(
            WdfDeviceInitSetCharacteristics,
            device_init,
            FILE_DEVICE_SECURE_OPEN,
            u8::from(true)
        );
    }

    let mut file_config = WDF_FILEOBJECT_CONFIG {
        Size: struct_size::<WDF_FILEOBJECT_CONFIG>(),
        EvtDeviceFileCreate: Some(evt_device_file_create),
        EvtFileClose: Some(evt_file_close),
        EvtFileCleanup: Some(evt_file_cleanup),
        AutoForwardCleanupClose: _WDF_TRI_STATE::WdfUseDefault,
        FileObjectClass: _WDF_FILEOBJECT_CLASS::WdfFileObjectWdfCannotUseFsContexts,
    };
    let mut file_attributes = FILE_CONTEXT_TYPE.attributes();
    file_attributes.EvtCleanupCallback = Some(evt_file_object_cleanup);
    // SAFETY: as above; both structures are initialized with their Size and
    // are copied.
    unsafe {
        call_unsafe_wdf_function_binding!(
            WdfDeviceInitSetFileObjectConfig,
            device_init,
            &raw mut file_config,
            &raw mut file_attributes
        );
    }
    let mut request_attributes = REQUEST_CONTEXT_TYPE.attributes();
    request_attributes.EvtCleanupCallback = Some(evt_request_cleanup);
    // SAFETY: as above.
    unsafe {
        call_unsafe_wdf_function_binding!(
            WdfDeviceInitSetRequestAttributes,
            device_init,
            &raw mut request_attributes
        );
    }
    // SAFETY: as above; the callback has the EVT_WDF_IO_IN_CALLER_CONTEXT
    // signature.
    unsafe {
        call_unsafe_wdf_function_binding!(
            WdfDeviceInitSetIoInCallerContextCallback,
            device_init,
            Some(evt_io_in_caller_context)
        );
    }
}

/// `WdfDeviceCreate` with a device context and destroy callback; an
/// instance number and the registry's configuration in the context.
///
/// # Errors
/// `WdfDeviceCreate`'s failure; `STATUS_INVALID_DEVICE_STATE` when all 64
/// instance numbers are taken (the device is deleted by the framework when
/// device add fails).
///
/// # Safety
/// `device_init` must be the framework's, configured, before
/// `WdfDeviceCreate`.
unsafe fn create_device(
    mut device_init: PWDFDEVICE_INIT,
    config: DeviceConfig,
) -> Result<(WDFDEVICE, u32), NTSTATUS> {
    let mut device_attributes = DEVICE_CONTEXT_TYPE.attributes();
    device_attributes.EvtDestroyCallback = Some(evt_device_destroy);
    let mut device: WDFDEVICE = core::ptr::null_mut();
    // SAFETY: `device_init` is the framework's (it takes it and nulls our
    // copy); the attributes are initialized; `device` receives the handle.
    let status = unsafe {
        call_unsafe_wdf_function_binding!(
            WdfDeviceCreate,
            &raw mut device_init,
            &raw mut device_attributes,
            &raw mut device
        )
    };
    check(status)?;
    // SAFETY: `device` was just created with a DeviceContext.
    let context = unsafe { DEVICE_CONTEXT_TYPE.get::<DeviceContext>(device.cast()) };
    if context.is_null() {
        return Err(STATUS_INVALID_DEVICE_STATE);
    }
    // SAFETY: the context is the framework's zero-filled one; no callback
    // reads it yet (none runs before EvtDriverDeviceAdd returns).
    let context = unsafe { &mut *context };
    context.instance = u32::MAX;
    context.config = config;
    let instance = claim_instance().ok_or(STATUS_INVALID_DEVICE_STATE)?;
    // Released by the destroy callback.
    context.instance = instance;
    Ok((device, instance))
}

/// A bus with no DPC yet.
///
/// # Errors
/// `STATUS_INSUFFICIENT_RESOURCES`.
fn new_bus() -> Result<Shared<Bus>, NTSTATUS> {
    Shared::try_new(Bus {
        dpc: AtomicPtr::new(core::ptr::null_mut()),
        resume: AtomicBool::new(false),
        comp: [const { AtomicPtr::new(core::ptr::null_mut()) }; MAX_BUS_VECTORS],
    })
    .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)
}

/// The state of `device` over the HCA the backend made: the core's device
/// (which arms the HCA's event queues), the CM timer, the kernel ULPs'
/// table; then the bus's DPCs (a software HCA's interrupts) and the
/// table's query interface, and the state is published in the context.
/// Each part the driver allocates itself is taken fallibly; a refusal
/// drops what was made (the backend's services stopped: they start in
/// D0Entry).
///
/// IRQL: PASSIVE_LEVEL (EvtDriverDeviceAdd, EvtDevicePrepareHardware).
///
/// # Errors
/// `STATUS_INSUFFICIENT_RESOURCES`; `WdfDpcCreate`'s and
/// `WdfDeviceAddQueryInterface`'s failures.
///
/// # Safety
/// `device` must be our live device, with no state yet.
unsafe fn publish(
    device: WDFDEVICE,
    config: DeviceConfig,
    bus: Shared<Bus>,
    made: Made<Hw>,
) -> Result<(), NTSTATUS> {
    let Made { hca, services } = made;
    // SAFETY: `device` is live (caller): its WDM device object too.
    let device_object =
        unsafe { call_unsafe_wdf_function_binding!(WdfDeviceWdmGetDeviceObject, device) };
    // SAFETY: the live device object of the device whose HCA `hca` is.
    let kernel = unsafe { KernelInterface::new(hca.clone(), device_object) }?;
    let cm_timer = CmTimer::new()?;
    // Built in the box, not on the stack and moved (it is large).
    let state = irpverbs_ring::try_box_with(move || DeviceState {
        cm_timer,
        device: Device::with_config(KmdfPlatform, hca, config),
        services,
        bus,
        next_file: AtomicU64::new(1),
        kernel,
    })
    .ok_or(STATUS_INSUFFICIENT_RESOURCES)?;
    // SAFETY: `device` is our live device (caller), with a DeviceContext.
    let context = unsafe { DEVICE_CONTEXT_TYPE.get::<DeviceContext>(device.cast()) };
    if context.is_null() {
        return Err(STATUS_INVALID_DEVICE_STATE);
    }
    let state = Box::into_raw(state);
    // SAFETY: the context is valid; no state was published (caller), so
    // this is the only writer; readers see it from now on (release).
    unsafe { &(*context).state }.store(state, Ordering::Release);
    // SAFETY: just made by Box::into_raw: live until the destroy callback,
    // which takes it back from the context; shared access only.
    let state_ref = unsafe { &*state };
    // SAFETY: `state` is `device`'s, freed only in its destroy callback,
    // which detaches it first.
    unsafe { state_ref.kernel.ceps.attach(device, state) };
    let state = state_ref;
    // From here on a failure leaves the state to the destroy callback.
    if <Hw as Backend>::SOFTWARE_INTERRUPTS {
        // SAFETY: `device` is our live device.
        unsafe { create_dpc(device, state)? };
    }
    // SAFETY: as above.
    unsafe { add_kernel_interface(device, state) }
}

/// The DPC that stands for the HCA's interrupt, a child of the device; the
/// bus queues it from then on.
///
/// # Safety
/// `device` must be our live device, `state` its state.
unsafe fn create_dpc(device: WDFDEVICE, state: &DeviceState) -> Result<(), NTSTATUS> {
    // SAFETY: our live device (caller).
    let dpc = unsafe { new_dpc(device, evt_dpc, evt_dpc_cleanup, object_attributes()) }?;
    state.bus.dpc.store(dpc.cast(), Ordering::Release);
    let vectors = state
        .device
        .hca()
        .comp_event_queues()
        .min(MAX_BUS_VECTORS as u32);
    for vector in 0..vectors {
        // SAFETY: as above.
        unsafe { create_comp_dpc(device, state, vector)? };
    }
    Ok(())
}

/// A WDFDPC, child of `device`, running `func`, with `cleanup` and the
/// context `attributes` give it; no framework serialization (the core
/// takes its own locks).
///
/// # Safety
/// `device` must be our live device.
unsafe fn new_dpc(
    device: WDFDEVICE,
    func: extern "C" fn(WDFDPC),
    cleanup: extern "C" fn(WDFOBJECT),
    mut attributes: wdk_sys::WDF_OBJECT_ATTRIBUTES,
) -> Result<WDFDPC, NTSTATUS> {
    let mut dpc_config = WDF_DPC_CONFIG {
        Size: struct_size::<WDF_DPC_CONFIG>(),
        EvtDpcFunc: Some(func),
        AutomaticSerialization: u8::from(false),
    };
    attributes.ParentObject = device.cast();
    attributes.EvtCleanupCallback = Some(cleanup);
    let mut dpc: WDFDPC = core::ptr::null_mut();
    // SAFETY: the configuration and attributes are initialized, the parent
    // is our live device (caller); `dpc` receives the handle.
    let status = unsafe {
        call_unsafe_wdf_function_binding!(
            WdfDpcCreate,
            &raw mut dpc_config,
            &raw mut attributes,
            &raw mut dpc
        )
    };
    check(status)?;
    Ok(dpc)
}

/// Completion vector `vector`'s DPC, a child of the device, targeted to
/// processor `vector` (modulo the active processors: `KeGetProcessorNumberFromIndex`,
/// `KeSetTargetProcessorDpcEx` on its KDPC before it is ever queued); the
/// bus queues it from then on.
///
/// # Safety
/// `device` must be our live device, `state` its state.
unsafe fn create_comp_dpc(
    device: WDFDEVICE,
    state: &DeviceState,
    vector: u32,
) -> Result<(), NTSTATUS> {
    // SAFETY: our live device (caller).
    let dpc = unsafe {
        new_dpc(
            device,
            evt_comp_dpc,
            evt_comp_dpc_cleanup,
            VECTOR_CONTEXT_TYPE.attributes(),
        )
    }?;
    // SAFETY: the DPC was just created with this context type.
    let context = unsafe { VECTOR_CONTEXT_TYPE.get::<VectorContext>(dpc.cast()) };
    // SAFETY: a context of ours, zero-filled by the framework, not yet
    // read by anyone (the DPC is not queued before it is stored below).
    if let Some(context) = unsafe { context.as_mut() } {
        context.vector = vector;
    }
    // SAFETY: no preconditions; callable at any IRQL.
    let processors = unsafe { KeQueryActiveProcessorCountEx(ALL_PROCESSOR_GROUPS as u16) }.max(1);
    let mut processor = PROCESSOR_NUMBER::default();
    // SAFETY: `processor` is ours to fill; the index is below the count of
    // active processors.
    let status = unsafe { KeGetProcessorNumberFromIndex(vector % processors, &raw mut processor) };
    if nt_success(status) {
        // SAFETY: our live DPC, not yet queued.
        let kdpc = unsafe { call_unsafe_wdf_function_binding!(WdfDpcWdmGetDpc, dpc) };
        // SAFETY: the framework's initialized KDPC of our DPC, not queued;
        // a valid processor number. Failing (a processor gone), the DPC
        // runs where it is queued.
        let _ = unsafe { KeSetTargetProcessorDpcEx(kdpc, &raw mut processor) };
    }
    state.bus.comp[vector as usize].store(dpc.cast(), Ordering::Release);
    Ok(())
}

/// The vector of a completion vector's DPC.
///
/// # Safety
/// `dpc` must be one of ours made by [`create_comp_dpc`], alive.
unsafe fn dpc_vector(dpc: WDFDPC) -> Option<u32> {
    // SAFETY: our DPC, created with the context type (caller).
    let context = unsafe { VECTOR_CONTEXT_TYPE.get::<VectorContext>(dpc.cast()) };
    // SAFETY: a live context of ours, set before the DPC was published.
    unsafe { context.as_ref() }.map(|c| c.vector)
}

/// A completion vector DPC's `EvtCleanupCallback`: the bus stops queueing
/// it (the framework then waits for a run in flight).
///
/// IRQL: PASSIVE_LEVEL.
extern "C" fn evt_comp_dpc_cleanup(object: WDFOBJECT) {
    let dpc: WDFDPC = object.cast();
    // SAFETY: the framework passes our live DPC.
    let parent = unsafe { call_unsafe_wdf_function_binding!(WdfDpcGetParentObject, dpc) };
    // SAFETY: our live DPC, made by create_comp_dpc.
    let vector = unsafe { dpc_vector(dpc) };
    // SAFETY: its parent is our device, alive until after its children.
    if let (Some(state), Some(v)) = (unsafe { state(parent.cast()) }, vector)
        && let Some(slot) = state.bus.comp.get(v as usize)
    {
        slot.store(core::ptr::null_mut(), Ordering::Release);
    }
}

/// A completion vector's DPC (`EvtDpcFunc`), on the vector's processor:
/// [`Device::comp_dpc`] drains the vector's event queue (the completion
/// events of its CQs), delivers them and re-arms it.
///
/// IRQL: DISPATCH_LEVEL.
extern "C" fn evt_comp_dpc(dpc: WDFDPC) {
    // SAFETY: the framework passes our live DPC.
    let parent = unsafe { call_unsafe_wdf_function_binding!(WdfDpcGetParentObject, dpc) };
    // SAFETY: our live DPC, made by create_comp_dpc.
    let vector = unsafe { dpc_vector(dpc) };
    // SAFETY: its parent is our live device.
    if let (Some(state), Some(v)) = (unsafe { state(parent.cast()) }, vector) {
        state.device.comp_dpc(v);
    }
}

/// The device interface class, in a static for its address.
static INTERFACE_GUID: wdk_sys::GUID = GUID_DEVINTERFACE_IRPVERBS;

/// `\DosDevices\irpverbsN` (what host mode and the runner open as
/// `\\.\irpverbsN`) and the device interface.
///
/// # Safety
/// `device` must be our live device.
unsafe fn create_names(device: WDFDEVICE, instance: u32) -> Result<(), NTSTATUS> {
    let mut link = link_name(instance);
    let link_name = link.unicode_string();
    // SAFETY: `device` is live (caller); the name is a valid UNICODE_STRING
    // over `link`, which outlives the call (the framework copies it).
    let status = unsafe {
        call_unsafe_wdf_function_binding!(WdfDeviceCreateSymbolicLink, device, &raw const link_name)
    };
    check(status)?;
    // SAFETY: as above; the GUID is a 'static; no reference string.
    let status = unsafe {
        call_unsafe_wdf_function_binding!(
            WdfDeviceCreateDeviceInterface,
            device,
            &raw const INTERFACE_GUID,
            core::ptr::null()
        )
    };
    check(status)
}

/// The default queue: parallel, dispatch execution level, device control
/// and internal device control, not power-managed.
///
/// Not power-managed: the core holds requests indefinitely (CQ notify, CQ
/// and async event waits, CEP waits, CM requests waiting for the peer).
/// From a power-managed queue without `EvtIoStop`, KMDF would wait for
/// every one of them before D0Exit, and a sleep or hibernate with an
/// application waiting on events would end in bugcheck 0x9F. A software
/// HCA needs no power for a request to be presented (its commands are
/// software), and its own work stops in D0Exit ([`evt_device_d0_exit`]):
/// held requests wait across the sleep and complete as their events come
/// after D0Entry. Host mode models both queue kinds and raises 0x9F for a
/// request held from a power-managed one (`HostDevice::d0_exit`).
///
/// # Safety
/// `device` must be our live device.
unsafe fn create_queue(device: WDFDEVICE) -> Result<(), NTSTATUS> {
    let mut queue_config = WDF_IO_QUEUE_CONFIG {
        Size: struct_size::<WDF_IO_QUEUE_CONFIG>(),
        DispatchType: _WDF_IO_QUEUE_DISPATCH_TYPE::WdfIoQueueDispatchParallel,
        PowerManaged: _WDF_TRI_STATE::WdfFalse,
        DefaultQueue: u8::from(true),
        EvtIoDeviceControl: Some(evt_io_device_control),
        EvtIoInternalDeviceControl: Some(evt_io_internal_device_control),
        ..WDF_IO_QUEUE_CONFIG::default()
    };
    // As WDF_IO_QUEUE_CONFIG_INIT_DEFAULT_QUEUE sets it for parallel queues:
    // no limit on requests presented at once.
    queue_config.Settings.Parallel.NumberOfPresentedRequests = ULONG::MAX;
    let mut queue_attributes = object_attributes();
    queue_attributes.ExecutionLevel = _WDF_EXECUTION_LEVEL::WdfExecutionLevelDispatch;
    // SAFETY: `device` is live (caller); configuration and attributes
    // initialized; the queue handle output is optional (the device owns the
    // queue).
    let status = unsafe {
        call_unsafe_wdf_function_binding!(
            WdfIoQueueCreate,
            device,
            &raw mut queue_config,
            &raw mut queue_attributes,
            core::ptr::null_mut()
        )
    };
    check(status)
}

/// The interface type, in a static for its address.
static KERNEL_INTERFACE_GUID: wdk_sys::GUID = GUID_IV_KERNEL_INTERFACE;

/// Publishes the kernel ULPs' direct-call table for
/// `IRP_MN_QUERY_INTERFACE` (`WDF_QUERY_INTERFACE_CONFIG_INIT(config,
/// table, &GUID_IV_KERNEL_INTERFACE, NULL)`): KMDF copies the table now,
/// and for each query for the GUID copies it into the requester's buffer
/// and calls `InterfaceReference`; the query is not sent down the stack
/// (the HCA's driver is the bottom of it), no import, no per-query
/// callback.
///
/// IRQL: PASSIVE_LEVEL (EvtDriverDeviceAdd or EvtDevicePrepareHardware).
///
/// # Errors
/// `WdfDeviceAddQueryInterface`'s failure (`STATUS_INSUFFICIENT_RESOURCES`,
/// `STATUS_INVALID_PARAMETER`); the device is then deleted, and with it the
/// state and its reference to the table's context.
///
/// # Safety
/// `device` must be our live device, `state` its state.
unsafe fn add_kernel_interface(device: WDFDEVICE, state: &DeviceState) -> Result<(), NTSTATUS> {
    let mut table = state.kernel.table();
    let mut config = WDF_QUERY_INTERFACE_CONFIG {
        Size: struct_size::<WDF_QUERY_INTERFACE_CONFIG>(),
        Interface: (&raw mut table).cast(),
        InterfaceType: &raw const KERNEL_INTERFACE_GUID,
        SendQueryToParentStack: u8::from(false),
        EvtDeviceProcessQueryInterfaceRequest: None,
        ImportInterface: u8::from(false),
    };
    // SAFETY: `device` is live (caller), in EvtDriverDeviceAdd at
    // PASSIVE_LEVEL; the configuration is initialized with its Size; the
    // table starts with an INTERFACE whose Size is sizeof(IvKernelInterface)
    // and lives on this frame for the call (the framework copies it); the
    // GUID is a 'static. The context the table names is held by `state`
    // until the device is destroyed, after KMDF stopped answering queries.
    let status = unsafe {
        call_unsafe_wdf_function_binding!(WdfDeviceAddQueryInterface, device, &raw mut config)
    };
    check(status)
}

fn check(status: NTSTATUS) -> Result<(), NTSTATUS> {
    if nt_success(status) {
        Ok(())
    } else {
        Err(status)
    }
}

/// Instance numbers in use (bit N: `\DosDevices\irpverbsN`).
static INSTANCES: AtomicU64 = AtomicU64::new(0);

/// The lowest free instance number.
fn claim_instance() -> Option<u32> {
    let mut used = INSTANCES.load(Ordering::Relaxed);
    loop {
        let free = (!used).trailing_zeros();
        if free >= u64::BITS {
            return None;
        }
        match INSTANCES.compare_exchange_weak(
            used,
            used | (1 << free),
            Ordering::AcqRel,
            Ordering::Relaxed,
        ) {
            Ok(_) => return Some(free),
            Err(now) => used = now,
        }
    }
}

fn release_instance(instance: u32) {
    INSTANCES.fetch_and(!(1u64 << instance), Ordering::AcqRel);
}

/// `\DosDevices\irpverbsN` in UTF-16, for `WdfDeviceCreateSymbolicLink`
/// (KMDF links it to the PDO's name: the FDO stays unnamed).
fn link_name(instance: u32) -> crate::registry::WideName {
    let mut name = crate::registry::WideName::new(r"\DosDevices\irpverbs");
    let mut digits = [0u16; 10];
    let mut n = instance;
    let mut count = 0;
    loop {
        digits[count] = u16::from(b'0') + (n % 10) as u16;
        count += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for &d in digits[..count].iter().rev() {
        name.push(d);
    }
    name
}

// ------------------------------------------------------------- lifetime

/// The device object's `EvtDestroyCallback`: every child (queue, file
/// objects, DPC) is gone and no callback can run; frees the state.
///
/// IRQL: <= DISPATCH_LEVEL.
extern "C" fn evt_device_destroy(object: WDFOBJECT) {
    // SAFETY: the framework passes our device, whose context is still valid
    // in its destroy callback.
    let context = unsafe { DEVICE_CONTEXT_TYPE.get::<DeviceContext>(object) };
    if context.is_null() {
        return;
    }
    // SAFETY: the context is valid, and no other callback of the device
    // runs any more: this is the only reference to it.
    let context = unsafe { &mut *context };
    if context.instance != u32::MAX {
        release_instance(context.instance);
        context.instance = u32::MAX;
    }
    let state = context.state.swap(core::ptr::null_mut(), Ordering::AcqRel);
    if state.is_null() {
        return;
    }
    // SAFETY: the pointer came from Box::into_raw in publish and is still
    // live: the table's CEP functions stop using it here.
    unsafe { (*state).kernel.ceps.detach() };
    // SAFETY: the pointer came from Box::into_raw in publish and was taken
    // out of the context just now, so it is freed once.
    drop(unsafe { Box::from_raw(state) });
}

/// The DPC object's `EvtCleanupCallback`: the framework is deleting it, so
/// the bus stops queueing it (the framework then waits for a DPC in flight).
///
/// IRQL: PASSIVE_LEVEL.
extern "C" fn evt_dpc_cleanup(object: WDFOBJECT) {
    let dpc: WDFDPC = object.cast();
    // SAFETY: the framework passes our live DPC.
    let parent = unsafe { call_unsafe_wdf_function_binding!(WdfDpcGetParentObject, dpc) };
    // SAFETY: its parent is our device, alive until after its children.
    if let Some(state) = unsafe { state(parent.cast()) } {
        state
            .bus
            .dpc
            .store(core::ptr::null_mut(), Ordering::Release);
    }
}

// ------------------------------------------------------------- PnP, power

/// `EvtDevicePrepareHardware`: a PCI backend starts its device from the
/// resources ([`Backend::prepare_hardware`]) and the state is made over
/// it ([`publish`]); a software HCA's state exists since device add.
///
/// A device whose state exists already and whose backend is a PCI HCA is
/// being restarted after a stop (a resource rebalance, which
/// [`evt_device_query_stop`] vetoes; a stop without a query): its core
/// device was removed in D0Exit, so the restart is refused
/// (`STATUS_INVALID_DEVICE_STATE`); disabling and enabling the device
/// makes a new one.
///
/// IRQL: PASSIVE_LEVEL.
extern "C" fn evt_device_prepare_hardware(
    device: WDFDEVICE,
    raw: WDFCMRESLIST,
    translated: WDFCMRESLIST,
) -> NTSTATUS {
    // SAFETY: the framework passes our live device.
    if unsafe { state(device) }.is_some() {
        return if <Hw as Backend>::SOFTWARE_INTERRUPTS {
            STATUS_SUCCESS
        } else {
            STATUS_INVALID_DEVICE_STATE
        };
    }
    // SAFETY: our live device; the lists are the framework's, valid for
    // this callback.
    let made = match unsafe { Hw::prepare_hardware(device, raw, translated) } {
        Ok(Some(made)) => made,
        Ok(None) => return STATUS_SUCCESS,
        Err(status) => {
            wdk::println!("irpverbs: the HCA did not start: {status:#010x}");
            return status;
        }
    };
    // SAFETY: our live device, with a context.
    let context = unsafe { DEVICE_CONTEXT_TYPE.get::<DeviceContext>(device.cast()) };
    if context.is_null() {
        made.hca.release_hardware();
        return STATUS_INVALID_DEVICE_STATE;
    }
    // SAFETY: written at device add, read only since.
    let config = unsafe { (*context).config };
    let published = new_bus().and_then(|bus| {
        let hca = made.hca.clone();
        // SAFETY: our live device, with no state (checked above; PnP
        // callbacks of a device do not run concurrently).
        unsafe { publish(device, config, bus, made) }.inspect_err(|_| hca.release_hardware())
    });
    match published {
        Ok(()) => STATUS_SUCCESS,
        Err(status) => status,
    }
}

/// `EvtDeviceQueryStop`: may the device stop so that the PnP manager
/// rebalances its resources (new BARs, other MSI-X messages) and restarts
/// it? A software HCA: yes (it has no resources; its restart keeps its
/// state). A PCI HCA: no (`STATUS_UNSUCCESSFUL`), and the PnP manager
/// leaves the device running on its resources. Its restart would need
/// the device's state re-created on the new resources, which a live
/// process cannot follow: its doorbell pages are mapped at the old BAR's
/// physical address, and its queues and registrations are pinned and
/// mapped through the old DMA adapter. A restart after a stop is refused
/// anyway ([`evt_device_prepare_hardware`]), so a stop would leave the
/// device stopped.
///
/// IRQL: PASSIVE_LEVEL.
extern "C" fn evt_device_query_stop(_device: WDFDEVICE) -> NTSTATUS {
    if <Hw as Backend>::SOFTWARE_INTERRUPTS {
        STATUS_SUCCESS
    } else {
        irpverbs_abi::STATUS_UNSUCCESSFUL
    }
}

/// `EvtDeviceReleaseHardware` (after D0Exit, which removed the core's
/// device): a PCI backend resets its device and drops its DMA mappings
/// ([`Backend::release_hardware`]). The state stays until the device
/// object is destroyed (files may still be open after a surprise
/// removal).
///
/// IRQL: PASSIVE_LEVEL.
extern "C" fn evt_device_release_hardware(
    device: WDFDEVICE,
    _translated: WDFCMRESLIST,
) -> NTSTATUS {
    // SAFETY: the framework passes our live device.
    if let Some(state) = unsafe { state(device) } {
        state.device.remove();
        state.device.hca().release_hardware();
    }
    STATUS_SUCCESS
}

/// `EvtDeviceD0Entry`: starts the CM timer ([`crate::cmtimer`]) and the
/// backend's services ([`Backend::start`]: a software HCA's doorbell
/// poller, transport timer and wire; a PCI HCA re-arms its event queues),
/// then queues the bus's DPCs of a software HCA, which drain whatever its
/// event queues hold and re-arm them (the host's "interrupt on power-up").
///
/// IRQL: PASSIVE_LEVEL.
///
/// # Errors
/// The CM timer's or a service's failure to start: the device does not
/// enter D0.
extern "C" fn evt_device_d0_entry(
    device: WDFDEVICE,
    _previous_state: WDF_POWER_DEVICE_STATE,
) -> NTSTATUS {
    // SAFETY: the framework passes our live device.
    if let Some(state) = unsafe { state(device) } {
        // SAFETY: the device lives in the state with the timer, which D0Exit
        // stops (or the state's drop cancels, first) before the device goes.
        if let Err(status) = unsafe { state.cm_timer.start(&state.device) } {
            return status;
        }
        let hca = state.device.hca();
        if let Err(status) = hca.start(&state.services) {
            state.cm_timer.stop(&state.device);
            return status;
        }
        // Commands the HCA gave back while out of D0 (a PCI HCA's device
        // asleep) are posted now: no completion is due to post them.
        state.device.post_backlog();
        if <Hw as Backend>::SOFTWARE_INTERRUPTS {
            state.bus.interrupt();
            // Each vector's DPC too: what its event queue got before the
            // DPC existed is drained, and the queue re-armed.
            for vector in 0..hca.comp_event_queues() {
                state.bus.comp_interrupt(vector);
            }
        }
    }
    STATUS_SUCCESS
}

/// `EvtDeviceD0Exit`: stops the backend's services ([`Backend::stop`]) and
/// the CM timer (waiting for a thread to end and for a timer callback in
/// progress); leaving D0 for good (D3Final: removal, disable, shutdown,
/// stop) is also the core's device removal, while a sleep transition
/// keeps the HCA's state in memory (D0Entry starts the services and the
/// timer again).
/// The default queue is not power-managed ([`create_queue`]): the requests
/// the driver holds stay held across the sleep, and requests keep being
/// presented (a software HCA's commands run inline, as does a doorbell
/// rung through `IOCTL_IV_RING_DOORBELLS`).
///
/// IRQL: PASSIVE_LEVEL.
extern "C" fn evt_device_d0_exit(
    device: WDFDEVICE,
    target_state: WDF_POWER_DEVICE_STATE,
) -> NTSTATUS {
    // SAFETY: the framework passes our live device.
    if let Some(state) = unsafe { state(device) } {
        state.device.hca().stop(&state.services);
        state.cm_timer.stop(&state.device);
        if target_state == _WDF_POWER_DEVICE_STATE::WdfPowerDeviceD3Final {
            state.device.remove();
            // The device leaves D0 for good: a PCI HCA is reset and its
            // mappings dropped now, while it still listens
            // (EvtDeviceReleaseHardware runs after the power-down).
            state.device.hca().release_hardware();
        }
    }
    STATUS_SUCCESS
}

/// `EvtDeviceSurpriseRemoval`: [`Device::remove`] (pending requests
/// complete, new verbs fail with `STATUS_DEVICE_REMOVED`, destroys still
/// succeed). D0Exit follows and calls it again, which changes nothing.
///
/// IRQL: PASSIVE_LEVEL.
extern "C" fn evt_device_surprise_removal(device: WDFDEVICE) {
    // SAFETY: the framework passes our live device.
    if let Some(state) = unsafe { state(device) } {
        state.device.remove();
    }
}

// ------------------------------------------------------------- files

/// `EvtDeviceFileCreate`: a new key, the opener of a user-mode open
/// ([`Opener::register`], in the opener's context), [`Device::create_file`],
/// and the request completed with its result.
///
/// IRQL: PASSIVE_LEVEL.
extern "C" fn evt_device_file_create(device: WDFDEVICE, request: WDFREQUEST, file: WDFFILEOBJECT) {
    // SAFETY: the create request was just presented: live.
    let mode = unsafe { call_unsafe_wdf_function_binding!(WdfRequestGetRequestorMode, request) };
    let user = mode != crate::request::KERNEL_MODE;
    // SAFETY: the framework passes our live device.
    let status = match unsafe { state(device) } {
        Some(state) => open_file(state, file, user),
        None => STATUS_INVALID_DEVICE_STATE,
    };
    // SAFETY: the create request is ours to complete, once.
    unsafe { complete_raw(request, status, 0) };
}

fn open_file(state: &DeviceState, file: WDFFILEOBJECT, user: bool) -> NTSTATUS {
    // SAFETY: the framework passes a live file object, created with a
    // FileContext.
    let context = unsafe { FILE_CONTEXT_TYPE.get::<FileContext>(file.cast()) };
    if context.is_null() {
        return STATUS_INVALID_DEVICE_STATE;
    }
    // The file's pin counter first: nothing to undo when the pool cannot
    // hold it.
    let pins = match FilePins::new() {
        Ok(pins) => pins,
        Err(status) => return status,
    };
    let opener = if user {
        match Opener::register(file) {
            Ok(opener) => Some(opener),
            Err(status) => return status,
        }
    } else {
        None
    };
    let key = state.next_file.fetch_add(1, Ordering::Relaxed);
    let owner = opener.as_ref().map(|o| o.key());
    if let Err(status) = state.device.create_file(key, owner) {
        if let Some(opener) = &opener {
            Opener::unregister(opener);
        }
        return status;
    }
    if let Some(opener) = opener {
        // SAFETY: the context is valid; atomic access only. The pointer is
        // released by EvtFileClose (or the file object's cleanup callback).
        unsafe { &(*context).opener }.store(Shared::into_raw(opener).cast_mut(), Ordering::Release);
    }
    let pins = Shared::into_raw(pins).cast_mut();
    // SAFETY: the context is valid for writes; no request can name the file
    // before its create completes.
    unsafe { (*context).key = key };
    // SAFETY: as above; the pointer is released by the file object's
    // cleanup callback.
    unsafe { &(*context).pins }.store(pins, Ordering::Release);
    STATUS_SUCCESS
}

/// The file objects' `EvtCleanupCallback` (the framework deletes the file
/// object, after `EvtFileClose`): releases the context's pin counter.
///
/// IRQL: <= DISPATCH_LEVEL.
extern "C" fn evt_file_object_cleanup(object: WDFOBJECT) {
    // SAFETY: the framework passes one of the device's file objects, whose
    // context is valid until its cleanup returns.
    let context = unsafe { FILE_CONTEXT_TYPE.get::<FileContext>(object) };
    if context.is_null() {
        return;
    }
    // SAFETY: as above; atomic access only.
    let pins = unsafe { &(*context).pins }.swap(core::ptr::null_mut(), Ordering::AcqRel);
    if !pins.is_null() {
        // SAFETY: the context's `Shared::into_raw` reference, swapped out:
        // owned.
        drop(unsafe { Shared::from_raw(pins) });
    }
    // An opener EvtFileClose did not release (it always does for an open
    // that succeeded).
    // SAFETY: as above.
    if let Some(opener) = unsafe { take_opener(context) } {
        Opener::unregister(&opener);
    }
}

/// Takes the context's opener out, if it holds one.
///
/// # Safety
/// `context` must be a live file object's context.
unsafe fn take_opener(context: *mut FileContext) -> Option<Shared<Opener>> {
    // SAFETY: the caller guarantees a live context; atomic access only.
    let opener = unsafe { &(*context).opener }.swap(core::ptr::null_mut(), Ordering::AcqRel);
    // SAFETY: a non-null pointer is the context's `Shared::into_raw`
    // reference, swapped out: owned.
    (!opener.is_null()).then(|| unsafe { Shared::from_raw(opener) })
}

/// `EvtFileCleanup` (the last handle closed, in the closing thread: when a
/// process exits, the exiting process, its address space still there):
/// [`Device::cleanup_file`] unmaps the file's rings from its process and
/// starts the rundown, whose deregistrations release the file's user pins;
/// this waits for the last of them, so that no page stays locked in a
/// process that is about to end (bugcheck 0x76). The rundown needs no
/// passive-level thread (its commands complete in the DPC), and a removed
/// device's HCA has let go of its MRs already. The wait is bounded
/// ([`FilePins::wait_idle`]): a pin still held after it (a leak) is logged
/// and the cleanup returns, so the process can still end.
///
/// IRQL: PASSIVE_LEVEL.
extern "C" fn evt_file_cleanup(file: WDFFILEOBJECT) {
    // SAFETY: the framework passes our live file object.
    if let Some((state, key)) = unsafe { file_state(file) } {
        state.device.cleanup_file(key);
    }
    // SAFETY: as above.
    if let Some(pins) = unsafe { file_pins(file) } {
        let left = pins.wait_idle();
        if left != 0 {
            wdk::println!(
                "irpverbs: file cleanup: {left} user pin(s) still held after {} s; \
                 the closing process may end with locked pages (0x76)",
                crate::mdl::CLEANUP_PIN_TIMEOUT_S
            );
        }
    }
}

/// `EvtFileClose` (every request of the file completed): the file leaves
/// the openers' list (waiting for the process-notify routine, if the
/// opener's exit is running it down), [`Device::close_file`], and the
/// reference on the opener goes.
///
/// IRQL: PASSIVE_LEVEL.
extern "C" fn evt_file_close(file: WDFFILEOBJECT) {
    // SAFETY: the framework passes a live file object, created with a
    // FileContext.
    let context = unsafe { FILE_CONTEXT_TYPE.get::<FileContext>(file.cast()) };
    let opener = if context.is_null() {
        None
    } else {
        // SAFETY: a live file object's context.
        unsafe { take_opener(context) }
    };
    if let Some(opener) = &opener {
        Opener::unregister(opener);
    }
    // SAFETY: the framework passes our live file object.
    if let Some((state, key)) = unsafe { file_state(file) } {
        state.device.close_file(key);
    }
    // ObDereferenceObject of the opener (the last reference, unless the
    // notify routine is just letting go of its own).
    drop(opener);
}

/// The device state and key of an opened file.
///
/// # Safety
/// `file` must be a live file object of our device.
pub(crate) unsafe fn file_state<'a>(file: WDFFILEOBJECT) -> Option<(&'a DeviceState, FileKey)> {
    // SAFETY: the caller guarantees a live file object of ours.
    let key = unsafe { file_key(file) };
    if key == 0 {
        return None;
    }
    // SAFETY: as above.
    let device = unsafe { call_unsafe_wdf_function_binding!(WdfFileObjectGetDevice, file) };
    // SAFETY: the device of a live file object is live, and ours.
    unsafe { state(device) }.map(|state| (state, key))
}

// ------------------------------------------------------------- I/O

/// `EvtIoInCallerContext`: runs in the requestor's thread and process
/// before the request is queued. A device control goes through
/// [`Device::in_caller_context`] (which pins a user registration's pages,
/// maps rings for `IOCTL_IV_MAP_RINGS` and completes it, and unmaps the
/// rings of destroyed objects); whatever it returns, and any other request,
/// is queued.
///
/// IRQL: the requestor's (PASSIVE_LEVEL for user mode; <= DISPATCH_LEVEL
/// for kernel callers).
extern "C" fn evt_io_in_caller_context(device: WDFDEVICE, request: WDFREQUEST) {
    // SAFETY: the framework passes our live device.
    let Some(state) = (unsafe { state(device) }) else {
        // SAFETY: the driver owns the request until it enqueues or completes it.
        unsafe { complete_raw(request, STATUS_INVALID_DEVICE_STATE, 0) };
        return;
    };
    // SAFETY: the framework just passed the request to this callback.
    let queued = match unsafe { KmdfRequest::in_caller_context(request) } {
        Ok(Some(wrapped)) => match state.device.in_caller_context(wrapped) {
            Some(wrapped) => wrapped.into_handle(),
            // Completed in the caller's context.
            None => return,
        },
        Ok(None) => request,
        Err(status) => {
            // SAFETY: not wrapped: the driver still owns the request.
            unsafe { complete_raw(request, status, 0) };
            return;
        }
    };
    // SAFETY: our live device, and a request the driver owns and has not
    // queued yet.
    let status =
        unsafe { call_unsafe_wdf_function_binding!(WdfDeviceEnqueueRequest, device, queued) };
    if !nt_success(status) {
        // SAFETY: not enqueued: the driver still owns the request (a pin it
        // carries is dropped by the request's cleanup callback).
        unsafe { complete_raw(queued, status, 0) };
    }
}

/// `EvtIoDeviceControl`: [`Device::dispatch_ioctl`].
///
/// IRQL: <= DISPATCH_LEVEL (dispatch execution level).
extern "C" fn evt_io_device_control(
    queue: WDFQUEUE,
    request: WDFREQUEST,
    output_len: usize,
    input_len: usize,
    code: ULONG,
) {
    dispatch(
        queue,
        request,
        MajorFunction::DeviceControl,
        code,
        input_len,
        output_len,
    );
}

/// `EvtIoInternalDeviceControl` (kernel ULPs): [`Device::dispatch_ioctl`].
///
/// IRQL: <= DISPATCH_LEVEL (dispatch execution level).
extern "C" fn evt_io_internal_device_control(
    queue: WDFQUEUE,
    request: WDFREQUEST,
    output_len: usize,
    input_len: usize,
    code: ULONG,
) {
    dispatch(
        queue,
        request,
        MajorFunction::InternalDeviceControl,
        code,
        input_len,
        output_len,
    );
}

fn dispatch(
    queue: WDFQUEUE,
    request: WDFREQUEST,
    major: MajorFunction,
    code: ULONG,
    input_len: usize,
    output_len: usize,
) {
    // SAFETY: the framework passes the live queue presenting the request.
    let device = unsafe { call_unsafe_wdf_function_binding!(WdfIoQueueGetDevice, queue) };
    // SAFETY: the queue's device is our live device.
    let Some(state) = (unsafe { state(device) }) else {
        // SAFETY: the request was just presented: the driver owns it.
        unsafe { complete_raw(request, STATUS_INVALID_DEVICE_STATE, 0) };
        return;
    };
    // SAFETY: the request was just presented with these parameters.
    match unsafe { KmdfRequest::new(request, major, code, input_len, output_len) } {
        Ok(request) => state.device.dispatch_ioctl(request),
        Err(status) => {
            // SAFETY: not wrapped: the driver still owns the request.
            unsafe { complete_raw(request, status, 0) };
        }
    }
}

/// The DPC (`EvtDpcFunc`): first the rest of a bounded data-path call when
/// the HCA asked for it ([`Bus::resume`]: one more budget of packets), then [`Device::dpc`] drains the HCA's event queue, completes
/// requests and re-arms the event queue.
///
/// IRQL: DISPATCH_LEVEL.
extern "C" fn evt_dpc(dpc: WDFDPC) {
    // SAFETY: the framework passes our live DPC.
    let parent = unsafe { call_unsafe_wdf_function_binding!(WdfDpcGetParentObject, dpc) };
    // SAFETY: its parent is our live device.
    if let Some(state) = unsafe { state(parent.cast()) } {
        if state.bus.resume.swap(false, Ordering::AcqRel) {
            Backend::resume(state.device.hca());
        }
        state.device.dpc();
    }
}
