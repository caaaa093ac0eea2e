//! IRPs the driver allocates for the calls it makes (Winsock Kernel's):
//! the two `wdm.h` inline helpers windows-drivers-rs does not bind
//! (`IoSetCompletionRoutine`, reading the I/O status block), written over
//! wdk-sys's `IRP` and `IO_STACK_LOCATION`.
//!
//! An IRP from `IoAllocateIrp(1, FALSE)` has one stack location, for the
//! driver it is sent to; the completion routine goes into that location
//! (the "next" one, as `IoSetCompletionRoutine` puts it) and returns
//! `STATUS_MORE_PROCESSING_REQUIRED`, so the I/O manager leaves the IRP to
//! its owner, which reuses it (`IoReuseIrp`) or frees it (`IoFreeIrp`).

use wdk_sys::{NTSTATUS, PIO_COMPLETION_ROUTINE, PIRP, PVOID, ULONG_PTR};

/// `SL_INVOKE_ON_SUCCESS | SL_INVOKE_ON_ERROR | SL_INVOKE_ON_CANCEL`
/// (wdm.h: 0x40, 0x80, 0x20).
const SL_INVOKE_ALWAYS: u8 = 0x40 | 0x80 | 0x20;

/// `IoSetCompletionRoutine(irp, routine, context, TRUE, TRUE, TRUE)`:
/// `routine` runs with `context` whenever the IRP completes.
///
/// IRQL: <= DISPATCH_LEVEL.
///
/// # Safety
/// `irp` is a live IRP the caller owns, not yet sent, with a stack
/// location below its current one (`IoAllocateIrp` with a stack count of
/// at least 1, or after `IoReuseIrp`).
pub(crate) unsafe fn set_completion(irp: PIRP, routine: PIO_COMPLETION_ROUTINE, context: PVOID) {
    // SAFETY: `irp` is live (caller); a place expression, no read of the
    // union yet.
    let tail = unsafe { &raw mut (*irp).Tail };
    // SAFETY: the tail of a driver-allocated IRP is its Overlay member
    // until it is completed to the I/O manager; a field's address.
    let overlay = unsafe { &raw mut (*tail).Overlay };
    // SAFETY: as above; the stack location pointer is set by
    // IoAllocateIrp / IoReuseIrp.
    let entry = unsafe { &raw mut (*overlay).__bindgen_anon_2.__bindgen_anon_1 };
    // SAFETY: a copy of the live union (a pointer-sized value).
    let entry = unsafe { *entry };
    // SAFETY: the union's stack-location member, which IoAllocateIrp /
    // IoReuseIrp set.
    let current = unsafe { entry.CurrentStackLocation };
    // SAFETY: the next stack location is the one below the current, inside
    // the IRP's array (the caller's precondition).
    let next = unsafe { current.sub(1) };
    // SAFETY: `next` is the IRP's stack location, the caller's until the
    // IRP is sent.
    unsafe {
        (*next).CompletionRoutine = routine;
    }
    // SAFETY: as above.
    unsafe {
        (*next).Context = context;
    }
    // SAFETY: as above.
    unsafe {
        (*next).Control = SL_INVOKE_ALWAYS;
    }
}

/// The IRP's I/O status: its status and information.
///
/// IRQL: any.
///
/// # Safety
/// `irp` is a live IRP the caller owns, completed.
pub(crate) unsafe fn status(irp: PIRP) -> (NTSTATUS, ULONG_PTR) {
    // SAFETY: `irp` is live (caller); a field's address.
    let io = unsafe { &raw const (*irp).IoStatus };
    // SAFETY: a field's address in the live status block.
    let union = unsafe { &raw const (*io).__bindgen_anon_1 };
    // SAFETY: a copy of the live union (a pointer-sized value).
    let union = unsafe { *union };
    // SAFETY: the status block is written by the completer; Status is the
    // member the I/O manager writes.
    let status = unsafe { union.Status };
    // SAFETY: as above.
    let information = unsafe { (*io).Information };
    (status, information)
}
