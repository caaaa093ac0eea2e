//! # irpverbs.sys
//!
//! The KMDF layer of irpverbs: it does on Windows exactly what the host
//! device (`irpverbs-host`, `driver/host/src/device.rs`) does in host mode,
//! and nothing more. Every decision lives in `irpverbs-core` and the
//! backend's crate (`irpverbs-soft`, `irpverbs-model`), where it is tested;
//! this crate only maps. It drives one backend, chosen by a cargo feature
//! ([`backend`]): `soft` (the default: the soft HCA, root-enumerated) or
//! `model` (the model's mini-driver over a PCI device that speaks its
//! protocol, started from its bus resources).
//!
//!
//! | Windows (KMDF)                                  | irpverbs-core                     |
//! |-------------------------------------------------|-----------------------------------|
//! | `EvtDriverDeviceAdd` (a software HCA) or `EvtDevicePrepareHardware` (a PCI HCA, from its translated resources) | [`irpverbs_core::Device::with_config`] over the backend's HCA ([`backend`]), with the per-file quotas of the driver's `Parameters` registry key ([`registry`]) |
//! | `EvtDeviceReleaseHardware`                      | the backend's `release_hardware` (a PCI HCA: device reset, DMA mappings dropped) |
//! | `EvtDeviceFileCreate` / `EvtFileCleanup` / `EvtFileClose` | `Device::create_file` (with the opener of a user-mode open, referenced) / `cleanup_file` / `close_file` |
//! | the process-notify routine (`PsSetCreateProcessNotifyRoutineEx`, registered in `DriverEntry`, removed in `EvtDriverUnload`): a process exits | `Device::owner_exited` for each file it opened ([`process`]) |
//! | `EvtIoInCallerContext` (the requestor's thread and process)     | `Device::in_caller_context` |
//! | `EvtIoDeviceControl`, `EvtIoInternalDeviceControl` (dispatch-level parallel queue) | `Device::dispatch_ioctl` |
//! | `WDFREQUEST`                                    | [`irpverbs_core::Request`] ([`request::KmdfRequest`]) |
//! | `EvtRequestCancel`                              | `Device::cancel`                  |
//! | the HCA's interrupt: a `WDFDPC` (a software HCA), an MSI-X message's `EvtInterruptDpc` (a PCI HCA) | `Device::dpc`, `Device::comp_dpc` |
//! | `EvtDeviceSurpriseRemoval`, `EvtDeviceD0Exit` to D3Final | `Device::remove`         |
//! | the global allocator: `ExAllocatePool2` nonpaged pool, every alignment honoured | `irpverbs_kalloc::Aligned` ([`heap`]) |
//! | `KSPIN_LOCK` (in-stack queued), `KeGetCurrentIrql`, `ExAllocatePool2`; MDLs for user pins and ring mappings | [`irpverbs_core::Platform`] ([`platform::KmdfPlatform`], [`mdl`]) |
//! | a DMA enabler, its common buffers and transactions; `MmMapIoSpaceEx`; `WdfInterruptCreate` per MSI-X message | [`irpverbs_core::PciPlatform`], for a PCI HCA's backend ([`pci::KmdfPci`]) |
//!
//! The device is reachable as `\\.\irpverbs0` (a symbolic link, the name
//! host mode uses) and through the device interface
//! [`GUID_DEVINTERFACE_IRPVERBS`].
//!
//! | `IRP_MN_QUERY_INTERFACE` for `GUID_IV_KERNEL_INTERFACE` (`WdfDeviceAddQueryInterface`; version 1 queries by `WdfDeviceInitAssignWdmIrpPreprocessCallback`) | the kernel ULPs' direct-call table (`irpverbs_kernel_table::kernel`, see [`kernel`]) over the HCA's doorbells |
//! | the soft backend: a system thread (`PsCreateSystemThread`) started in D0Entry, ended in D0Exit, sleeping on a `KEVENT` that `IOCTL_IV_RING_DOORBELLS` sets | `SoftHca::poll_doorbells_step`: the doorbells user-mode ULPs ring in their doorbell pages (`backend/soft/doorbell.rs`) |
//!
//! # User memory
//! A user-mode ULP's rings and memory registrations need the requestor's
//! process at PASSIVE_LEVEL, which only `EvtIoInCallerContext` gives (the
//! queue's callbacks and the DPC run at DISPATCH_LEVEL in whatever process).
//! The core decides there what to pin, map and unmap
//! ([`irpverbs_core::Device::in_caller_context`]); this crate only does it
//! ([`mdl`]): `MmProbeAndLockPages` and `MmMapLockedPagesSpecifyCache(UserMode)`
//! report failure by raising an exception, so both go through `src/seh.c`,
//! a `__try` / `__except` shim compiled by `build.rs` with the WDK. KMDF's
//! own SEH-safe probe (`WdfRequestProbeAndLockUserBufferForWrite`) unlocks
//! when the request completes, too early for an MR. A file's cleanup waits
//! for the pages its registrations locked to be unlocked (the exiting
//! process must not keep locked pages). Only the process that opened a
//! file pins or maps through it, and its exit runs the file down even
//! while another process holds a handle ([`process`]).
//!
//! # User-mode doorbells
//! A user-mode ULP rings its queues' doorbells by setting bits in its file's
//! doorbell page (`IOCTL_IV_MAP_DOORBELLS`, mapped like a ring). The soft
//! HCA has no MMIO to trap those writes: a system thread polls the pages
//! while doorbells come and sleeps on an event once they stop, and the page
//! tells the ULP which (its `polling` word): while the HCA polls, a
//! doorbell costs no system call and is seen within microseconds; while it
//! sleeps, the ULP follows the doorbell with `IOCTL_IV_RING_DOORBELLS`,
//! which runs the doorbell in that call and wakes the thread
//! (`backend/soft/doorbell.rs`; the logic is `irpverbs_soft`'s poller,
//! tested in host mode). No timer, no raised clock rate. Kernel ULPs keep
//! the direct-call doorbells. The model's doorbell pages are pages of its
//! device's BAR 2, whose writes the device sees itself.
//!
//! # The wire
//! With `RoceEnable` set in the device's hardware key (the INF's default is
//! off), the soft HCA's RoCEv2 datagrams leave over a Winsock Kernel
//! datagram socket bound to `RoceAddress` on `RocePort`
//! (`backend/soft/wsk.rs`), opened in D0Entry and closed in D0Exit; the
//! logic is `irpverbs_soft::sockwire`, tested in host mode. A PCI HCA's
//! wire is its own port.
//!
//! # The connection manager's timer
//! A one-shot kernel timer ([`cmtimer`]) the core arms at the CM's next
//! deadline (`Device::set_cm_timer`); its callback runs `Device::cm_timer`
//! at DISPATCH_LEVEL. Allocated in D0Entry, deleted in D0Exit.
//!
//! Not here yet: work items, which the core's `Platform` does not ask for
//! yet; physical (bus address) registrations.
//!
//! Every `unsafe` block holds one unsafe operation and states why it is
//! sound; every WDF call goes through wdk-sys's
//! `call_unsafe_wdf_function_binding!`, which type-checks the arguments
//! against the WDK's own function-pointer typedefs.
#![no_std]

extern crate alloc;
#[cfg(not(test))]
extern crate wdk_panic;

mod backend;
pub mod cmtimer;
mod context;
mod device;
mod heap;
pub mod kernel;
pub mod mdl;
pub mod pci;
pub mod platform;
mod process;
mod registry;
pub mod request;

use wdk_sys::{
    GUID, NTSTATUS, PCUNICODE_STRING, PDRIVER_OBJECT, ULONG, WDF_DRIVER_CONFIG, WDF_NO_HANDLE,
    WDF_NO_OBJECT_ATTRIBUTES, WDFDRIVER, call_unsafe_wdf_function_binding,
};

/// Nonpaged pool, every alignment honoured ([`heap`]).
#[cfg(not(test))]
#[global_allocator]
static GLOBAL_ALLOCATOR: heap::DriverAllocator = irpverbs_kalloc::Aligned(heap::NonPagedPool);

/// The irpverbs device interface class,
/// `{4d203802-bd94-47b2-9797-1a3955432793}`. User-mode ULPs find the device
/// with `CM_Get_Device_Interface_List` (or SetupAPI) on this GUID; the
/// README and `inf/irpverbs.inx` name the same value.
pub const GUID_DEVINTERFACE_IRPVERBS: GUID = GUID {
    Data1: 0x4d20_3802,
    Data2: 0xbd94,
    Data3: 0x47b2,
    Data4: [0x97, 0x97, 0x1a, 0x39, 0x55, 0x43, 0x27, 0x93],
};

/// The tag KMDF puts on the allocations it makes for this driver.
const WDF_POOL_TAG: ULONG = u32::from_le_bytes(*b"IvWd");

/// `DriverEntry`: registers the process-notify routine
/// ([`process::register_notify`]), then creates the WDF driver object with
/// [`device::evt_driver_device_add`] as its `EvtDriverDeviceAdd` and
/// [`evt_driver_unload`] as its `EvtDriverUnload`.
///
/// IRQL: PASSIVE_LEVEL.
///
/// # Errors
/// What `PsSetCreateProcessNotifyRoutineEx` returns (`STATUS_ACCESS_DENIED`
/// for an image linked without `/INTEGRITYCHECK`): without the routine a
/// process that exits while another holds its file open would end with
/// locked pages, so the driver does not load. What `WdfDriverCreate`
/// returns. The driver is then unloaded.
///
/// # Safety
/// Called only by the I/O manager, with the driver object and registry path
/// it created for this driver.
#[unsafe(export_name = "DriverEntry")]
pub unsafe extern "system" fn driver_entry(
    driver: PDRIVER_OBJECT,
    registry_path: PCUNICODE_STRING,
) -> NTSTATUS {
    if let Err(status) = process::register_notify() {
        wdk::println!(
            "irpverbs: PsSetCreateProcessNotifyRoutineEx failed: {status:#010x} \
             (is the image linked with /INTEGRITYCHECK?)"
        );
        return status;
    }
    let mut config = WDF_DRIVER_CONFIG {
        Size: context::struct_size::<WDF_DRIVER_CONFIG>(),
        EvtDriverDeviceAdd: Some(device::evt_driver_device_add),
        EvtDriverUnload: Some(evt_driver_unload),
        DriverPoolTag: WDF_POOL_TAG,
        ..WDF_DRIVER_CONFIG::default()
    };
    // SAFETY: `driver` and `registry_path` are the I/O manager's, valid for
    // this call; no driver attributes are needed (null is allowed);
    // `config` is a fully initialized WDF_DRIVER_CONFIG with its Size set;
    // the driver handle output is optional and null.
    let status = unsafe {
        call_unsafe_wdf_function_binding!(
            WdfDriverCreate,
            driver,
            registry_path,
            WDF_NO_OBJECT_ATTRIBUTES,
            &raw mut config,
            WDF_NO_HANDLE.cast::<WDFDRIVER>(),
        )
    };
    if !irpverbs_abi::nt_success(status) {
        // No EvtDriverUnload will follow: the routine goes now.
        process::unregister_notify();
    }
    status
}

/// `EvtDriverUnload`: removes the process-notify routine (waiting for a
/// call in progress) before the image goes. Every device is gone by now,
/// and with it every file the routine could have run down.
///
/// IRQL: PASSIVE_LEVEL.
extern "C" fn evt_driver_unload(_driver: WDFDRIVER) {
    process::unregister_notify();
}
