//! Process lifetime: a user-mode file belongs to the process that opened
//! it, and that process's exit runs the file down, even while another
//! process holds a handle to it (inherited, or duplicated).
//!
//! Windows sends `IRP_MJ_CLEANUP` only when a file's last handle closes. A
//! handle inherited by a child or duplicated into another process keeps the
//! file open after its opener has exited; the pages its registrations
//! locked would then still be locked when the opener's address space goes
//! (bugcheck 0x76, PROCESS_HAS_LOCKED_PAGES), and the last handle's cleanup
//! would unmap rings from a process that no longer exists. So:
//!
//! - `EvtDeviceFileCreate` (in the opener's context) records the opener of
//!   every user-mode file ([`Opener::register`]): the current process,
//!   referenced (`ObfReferenceObject`) until `EvtFileClose`, so that its
//!   address, the core's [`ProcessKey`] for it, names no other process while
//!   the file is open. The core serves user-memory requests (pins, ring
//!   and doorbell-page mappings) only for that process.
//! - `DriverEntry` registers [`process_notify`] with
//!   `PsSetCreateProcessNotifyRoutineEx` (the image must be linked with
//!   `/INTEGRITYCHECK`, or the call fails with `STATUS_ACCESS_DENIED`; the
//!   driver then does not load), `EvtDriverUnload` removes it (which waits
//!   for a call in progress). On a process's exit the routine, running in
//!   the exiting process's last thread at PASSIVE_LEVEL (address space
//!   still there), takes each file the process opened off the list and runs
//!   it down (`Device::owner_exited`: its rings unmapped there, its objects
//!   destroyed), then waits, bounded, for the pages its registrations
//!   locked, as `EvtFileCleanup` does.
//! - `EvtFileClose` takes its file off the list ([`Opener::unregister`]);
//!   if the exit routine took it first, it waits for the routine to be done
//!   with it, so the file object and its device outlive that use.
//!
//! The list is one for the driver (every device's files: one notification
//! reaches them all), under a spin lock; its room and each opener's memory
//! are taken at the open, fallibly.

use alloc::vec::Vec;
use core::cell::UnsafeCell;

use irpverbs_abi::{NtStatus, STATUS_INSUFFICIENT_RESOURCES};
use irpverbs_core::{ProcessKey, SpinLock};
use irpverbs_ring::Shared;
use wdk_sys::ntddk::{
    IoGetCurrentProcess, KeInitializeEvent, KeSetEvent, KeWaitForSingleObject,
    ObfDereferenceObject, ObfReferenceObject, PsSetCreateProcessNotifyRoutineEx,
};
use wdk_sys::{
    _EVENT_TYPE, _KWAIT_REASON, _MODE, HANDLE, KEVENT, KPROCESSOR_MODE, NTSTATUS, PEPROCESS,
    PPS_CREATE_NOTIFY_INFO, WDFFILEOBJECT,
};

use crate::device::{file_pins, file_state};
use crate::platform::KmdfSpinLock;

/// The opener of a user-mode file: the process, referenced, and the event
/// the exit routine sets once it is done with the file.
pub(crate) struct Opener {
    /// The file object: live until `EvtFileClose` returns, which waits for
    /// `done` when the exit routine took this entry.
    file: WDFFILEOBJECT,
    /// The process that opened the file, referenced for this value's life.
    process: PEPROCESS,
    /// A notification event, set by the exit routine when it is done with
    /// the file.
    done: UnsafeCell<KEVENT>,
}

// SAFETY: the file object handle and the referenced process are plain
// kernel object pointers, usable from any thread; the event is touched only
// through the kernel's event routines, which synchronize internally.
unsafe impl Send for Opener {}
// SAFETY: as above; nothing else is mutable.
unsafe impl Sync for Opener {}

/// The user-mode files open on every device of the driver, with their
/// openers. An entry leaves it at `EvtFileClose`, or when the exit routine
/// takes it.
static OPENED: KmdfSpinLock<Vec<Shared<Opener>>> = KmdfSpinLock::new(Vec::new());

impl Opener {
    /// Records the current process as the opener of `file` and lists the
    /// file for the exit routine.
    ///
    /// IRQL: PASSIVE_LEVEL, in the opener's context (`EvtDeviceFileCreate`
    /// for a user-mode open).
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES` when the pool refuses the opener's
    /// memory or the list's room.
    pub(crate) fn register(file: WDFFILEOBJECT) -> Result<Shared<Self>, NtStatus> {
        // SAFETY: IoGetCurrentProcess (PsGetCurrentProcess) has no
        // preconditions.
        let process = unsafe { IoGetCurrentProcess() };
        // SAFETY: the current process is a live object; the reference is
        // given back when the opener is dropped.
        let _ = unsafe { ObfReferenceObject(process.cast()) };
        // A refused allocation drops the value: the reference goes.
        let opener = Shared::try_new(Self {
            file,
            process,
            done: UnsafeCell::new(KEVENT::default()),
        })
        .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        // SAFETY: the event is in the opener's nonpaged memory, stays there
        // for its life, and nothing else can reach it yet; a notification
        // event may be initialized at any IRQL.
        unsafe { KeInitializeEvent(opener.done.get(), _EVENT_TYPE::NotificationEvent, 0) };
        OPENED.lock(|list| {
            list.try_reserve(1)
                .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
            list.push(Shared::clone(&opener));
            Ok::<(), NtStatus>(())
        })?;
        Ok(opener)
    }

    /// The opener's key for the core: the process's address, which no
    /// other process can have while this value holds its reference.
    pub(crate) fn key(&self) -> ProcessKey {
        self.process.expose_provenance() as u64
    }

    /// Takes the file off the list (`EvtFileClose`, or an open that failed
    /// after [`Opener::register`]); when the exit routine took it first,
    /// waits until the routine is done with it.
    ///
    /// IRQL: PASSIVE_LEVEL.
    pub(crate) fn unregister(opener: &Shared<Self>) {
        let removed = OPENED.lock(|list| {
            let at = list.iter().position(|o| Shared::ptr_eq(o, opener))?;
            // Not the last reference (the caller holds one): no free
            // under the lock.
            Some(list.swap_remove(at))
        });
        if removed.is_some() {
            return;
        }
        // SAFETY: an initialized event that lives as long as `opener`; an
        // untimed kernel-mode wait is allowed at PASSIVE_LEVEL, and the
        // routine sets the event after a bounded run-down.
        let _ = unsafe {
            KeWaitForSingleObject(
                opener.done.get().cast(),
                _KWAIT_REASON::Executive,
                kernel_mode(),
                0,
                core::ptr::null_mut(),
            )
        };
    }
}

impl Drop for Opener {
    /// Gives back the reference on the process.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    fn drop(&mut self) {
        // SAFETY: the reference `register` took, given back once.
        let _ = unsafe { ObfDereferenceObject(self.process.cast()) };
    }
}

/// `KernelMode` as a `KPROCESSOR_MODE`.
fn kernel_mode() -> KPROCESSOR_MODE {
    #[allow(clippy::cast_possible_truncation, reason = "KernelMode is 0")]
    let mode = _MODE::KernelMode as KPROCESSOR_MODE;
    mode
}

/// The driver's process-notify routine (`PCREATE_PROCESS_NOTIFY_ROUTINE_EX`):
/// on an exit (`create_info` null), every file `process` opened is taken off
/// the list and run down while its address space is still there
/// (`Device::owner_exited`), then the routine waits, bounded, for the pages
/// the file's registrations locked ([`crate::mdl::FilePins::wait_idle`]),
/// logging what is left. Creations are ignored.
///
/// IRQL: PASSIVE_LEVEL, in the exiting process's last thread, inside a
/// critical region (normal kernel APCs disabled): waits are allowed.
///
/// # Safety
/// Called only by the process manager, with the process it is notifying
/// about.
pub(crate) unsafe extern "C" fn process_notify(
    process: PEPROCESS,
    _process_id: HANDLE,
    create_info: PPS_CREATE_NOTIFY_INFO,
) {
    if !create_info.is_null() {
        return;
    }
    while let Some(opener) = OPENED.lock(|list| {
        let at = list.iter().position(|o| o.process == process)?;
        Some(list.swap_remove(at))
    }) {
        // SAFETY: the file object lives until its EvtFileClose returns,
        // which waits for `done`, set below.
        if let Some((state, key)) = unsafe { file_state(opener.file) } {
            state.device.owner_exited(key);
        }
        // SAFETY: as above.
        if let Some(pins) = unsafe { file_pins(opener.file) } {
            let left = pins.wait_idle();
            if left != 0 {
                wdk::println!(
                    "irpverbs: process exit: {left} user pin(s) still held after {} s; \
                     the process may end with locked pages (0x76)",
                    crate::mdl::CLEANUP_PIN_TIMEOUT_S
                );
            }
        }
        // SAFETY: an initialized event that lives as long as `opener`
        // (held here across the call); KeSetEvent with Wait = FALSE at
        // PASSIVE_LEVEL.
        let _ = unsafe { KeSetEvent(opener.done.get(), 0, 0) };
    }
}

/// Registers [`process_notify`] (`DriverEntry`).
///
/// IRQL: PASSIVE_LEVEL.
///
/// # Errors
/// `STATUS_ACCESS_DENIED` for an image not linked with `/INTEGRITYCHECK`
/// (`IMAGE_DLLCHARACTERISTICS_FORCE_INTEGRITY`); `STATUS_INVALID_PARAMETER`
/// when the system has no room for another routine.
pub(crate) fn register_notify() -> Result<(), NTSTATUS> {
    // SAFETY: a routine of this image with the PCREATE_PROCESS_NOTIFY_ROUTINE_EX
    // signature, removed by `unregister_notify` before the image unloads.
    let status = unsafe { PsSetCreateProcessNotifyRoutineEx(Some(process_notify), 0) };
    if irpverbs_abi::nt_success(status) {
        Ok(())
    } else {
        Err(status)
    }
}

/// Removes [`process_notify`] (`EvtDriverUnload`, or a `DriverEntry` that
/// fails after registering it); returns once no call of it is in progress.
///
/// IRQL: PASSIVE_LEVEL.
pub(crate) fn unregister_notify() {
    // SAFETY: the routine `register_notify` registered; Remove = TRUE also
    // waits for calls in progress, and is never called from the routine.
    let _ = unsafe { PsSetCreateProcessNotifyRoutineEx(Some(process_notify), 1) };
}
