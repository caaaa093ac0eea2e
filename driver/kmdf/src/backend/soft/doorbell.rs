//! The doorbell poller's system thread: how the soft HCA notices the
//! doorbells user-mode ULPs ring in their files' doorbell pages
//! (`IOCTL_IV_MAP_DOORBELLS`).
//!
//! A real HCA traps a write to its doorbell (UAR) page in hardware; the soft
//! HCA's pages are ordinary nonpaged memory, so something must look at
//! them. Here that is a system thread (`PsCreateSystemThread`) running the
//! soft HCA's poller ([`irpverbs_soft::SoftHca::poll_doorbells_step`], the logic host mode
//! tests; see `irpverbs_soft`'s `poller` module):
//!
//! - while doorbells come, it scans the pages back to back, yielding the
//!   processor between scans (`KeDelayExecutionThread` with a zero
//!   interval), and every page's `polling` word says so: a ULP rings with
//!   no system call, seen within a scan (microseconds);
//! - once [`DEFAULT_POLL_WINDOW_NS`] passed without a doorbell, it clears
//!   the `polling` words, looks once more, and waits on a synchronization
//!   `KEVENT` (no timer, no CPU, no raised clock rate);
//! - a ULP that rang and read `polling` 0 issues `IOCTL_IV_RING_DOORBELLS`:
//!   the core runs the doorbell at once, in that call
//!   (`Hca::ring_doorbell_pages`), and the bus's
//!   [`SoftBus::wake_doorbell_poller`] sets the event (`KeSetEvent`, at
//!   <= DISPATCH_LEVEL): the thread polls again.
//!
//! The thread starts in D0Entry and is stopped in D0Exit (the stop flag,
//! the event set, then a wait on the thread object, referenced with
//! `ObReferenceObjectByHandle` when it was created). It runs at
//! PASSIVE_LEVEL; the scan takes the soft HCA's spin locks (raising to
//! DISPATCH_LEVEL) and queues the device's DPC for what it completes, as a
//! doorbell rung at PASSIVE_LEVEL does.
//!
//! [`SoftBus::wake_doorbell_poller`]: irpverbs_soft::SoftBus::wake_doorbell_poller

use alloc::boxed::Box;
use core::cell::UnsafeCell;
use core::ffi::c_void;
use core::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

use irpverbs_abi::{STATUS_INSUFFICIENT_RESOURCES, nt_success};
use irpverbs_core::Platform;
use irpverbs_ring::Shared;
use irpverbs_soft::{DEFAULT_POLL_WINDOW_NS, DoorbellPoller, PollerStep};
use wdk_sys::ntddk::{
    KeDelayExecutionThread, KeInitializeEvent, KeSetEvent, KeWaitForSingleObject,
    ObReferenceObjectByHandle, ObfDereferenceObject, PsCreateSystemThread, PsTerminateSystemThread,
    ZwClose,
};
use wdk_sys::{
    _EVENT_TYPE, _KWAIT_REASON, HANDLE, KEVENT, KPROCESSOR_MODE, LARGE_INTEGER, NTSTATUS,
    OBJECT_ATTRIBUTES, PVOID, ULONG,
};

use super::Hw;
use crate::platform::KmdfPlatform;

/// `THREAD_ALL_ACCESS` (wdm.h: `STANDARD_RIGHTS_REQUIRED | SYNCHRONIZE |
/// 0xFFFF`): what the driver asks of its own thread's handle.
const THREAD_ALL_ACCESS: ULONG = 0x000F_0000 | 0x0010_0000 | 0xFFFF;
/// `OBJ_KERNEL_HANDLE` (wdm.h): the handle lives in the kernel's table,
/// whatever process D0Entry runs in.
const OBJ_KERNEL_HANDLE: ULONG = 0x0000_0200;
/// `KernelMode` (`MODE`, 0) as a `KPROCESSOR_MODE`.
const KERNEL_MODE: KPROCESSOR_MODE = 0;
/// `STATUS_SUCCESS`.
const STATUS_SUCCESS: NTSTATUS = 0;

/// What the thread, the device and the bus share: the event the thread
/// sleeps on and its stop flag. Lives in a [`Shared`] (nonpaged pool,
/// allocated fallibly) for as long as anyone may set the event.
pub(crate) struct PollerEvent {
    /// A synchronization event: a set wakes one wait and resets.
    event: UnsafeCell<KEVENT>,
    stop: AtomicBool,
}

// SAFETY: the event is only touched through the kernel's event routines,
// which synchronize internally and may be called from any thread at IRQL <=
// DISPATCH_LEVEL; the flag is atomic.
unsafe impl Send for PollerEvent {}
// SAFETY: as above.
unsafe impl Sync for PollerEvent {}

impl PollerEvent {
    /// The event, initialized not signaled.
    ///
    /// IRQL: <= DISPATCH_LEVEL (nonpaged pool).
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES` when the pool refuses it.
    pub(crate) fn new() -> Result<Shared<Self>, NTSTATUS> {
        let this = Shared::try_new(Self {
            event: UnsafeCell::new(KEVENT::default()),
            stop: AtomicBool::new(false),
        })
        .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        // SAFETY: the event is in nonpaged pool (the Shared block), stays
        // there for its life, and nothing else can reach it yet; an event
        // may be initialized at any IRQL.
        unsafe {
            KeInitializeEvent(this.event.get(), _EVENT_TYPE::SynchronizationEvent, 0);
        };
        Ok(this)
    }

    /// Sets the event: the sleeping thread wakes (or its next wait returns
    /// at once).
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    pub(crate) fn set(&self) {
        // SAFETY: an initialized event in nonpaged memory; KeSetEvent with
        // Wait = FALSE may be called at IRQL <= DISPATCH_LEVEL.
        let _ = unsafe { KeSetEvent(self.event.get(), 0, 0) };
    }

    /// Waits for the event.
    ///
    /// IRQL: PASSIVE_LEVEL (the thread).
    fn wait(&self) {
        // SAFETY: the event lives as long as `self`; a wait with no timeout
        // is allowed at PASSIVE_LEVEL, kernel mode, not alertable.
        let _ = unsafe {
            KeWaitForSingleObject(
                self.event.get().cast(),
                _KWAIT_REASON::Executive,
                KERNEL_MODE,
                0,
                core::ptr::null_mut(),
            )
        };
    }
}

/// The thread's context: the HCA it polls and the event it sleeps on (one
/// reference each, given back when the thread ends).
struct ThreadContext {
    hca: Hw,
    event: Shared<PollerEvent>,
}

/// The device's doorbell poller: its soft HCA, its event and, while the
/// device is in D0, the thread.
pub(crate) struct DoorbellThread {
    hca: Hw,
    event: Shared<PollerEvent>,
    /// The running thread's object (referenced), null while stopped.
    thread: AtomicPtr<c_void>,
}

impl DoorbellThread {
    /// A stopped poller for `hca`, sleeping on `event` (the bus's).
    pub(crate) fn new(hca: Hw, event: Shared<PollerEvent>) -> Self {
        Self {
            hca,
            event,
            thread: AtomicPtr::new(core::ptr::null_mut()),
        }
    }

    /// D0Entry: creates the system thread. Started already: nothing to do.
    ///
    /// IRQL: PASSIVE_LEVEL.
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES` when the thread's context cannot be
    /// allocated; `PsCreateSystemThread`'s or `ObReferenceObjectByHandle`'s
    /// failure: the device does not start.
    pub(crate) fn start(&self) -> Result<(), NTSTATUS> {
        if !self.thread.load(Ordering::Acquire).is_null() {
            return Ok(());
        }
        self.event.stop.store(false, Ordering::Release);
        let context = irpverbs_ring::try_box(ThreadContext {
            hca: Shared::clone(&self.hca),
            event: Shared::clone(&self.event),
        })
        .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        let context = Box::into_raw(context);
        let mut attributes = OBJECT_ATTRIBUTES {
            Length: size_of::<OBJECT_ATTRIBUTES>() as ULONG,
            RootDirectory: core::ptr::null_mut(),
            ObjectName: core::ptr::null_mut(),
            Attributes: OBJ_KERNEL_HANDLE,
            SecurityDescriptor: core::ptr::null_mut(),
            SecurityQualityOfService: core::ptr::null_mut(),
        };
        let mut handle: HANDLE = core::ptr::null_mut();
        // SAFETY: the attributes are initialized (InitializeObjectAttributes
        // with no name and a kernel handle); no process handle (the system
        // process) and no client id, as for any driver thread; `poll` has
        // the KSTART_ROUTINE signature and owns `context` (a live
        // boxed ThreadContext) from now on; PASSIVE_LEVEL.
        let status = unsafe {
            PsCreateSystemThread(
                &raw mut handle,
                THREAD_ALL_ACCESS,
                &raw mut attributes,
                core::ptr::null_mut(),
                core::ptr::null_mut(),
                Some(poll),
                context.cast(),
            )
        };
        if !nt_success(status) {
            // SAFETY: no thread was created: the context reference is still
            // ours.
            drop(unsafe { Box::from_raw(context) });
            return Err(status);
        }
        let mut object: PVOID = core::ptr::null_mut();
        // SAFETY: `handle` is the kernel handle just returned; kernel-mode
        // access needs no object type; the object pointer is written to
        // `object` with a reference, released in `stop`; PASSIVE_LEVEL.
        let status = unsafe {
            ObReferenceObjectByHandle(
                handle,
                THREAD_ALL_ACCESS,
                core::ptr::null_mut(),
                KERNEL_MODE,
                &raw mut object,
                core::ptr::null_mut(),
            )
        };
        // SAFETY: the handle is ours (a kernel handle) and closed once; the
        // thread lives on (its object is referenced, or it ends below).
        let _ = unsafe { ZwClose(handle) };
        if !nt_success(status) {
            // The thread cannot be waited for: tell it to end, and let it
            // release its context itself.
            self.event.stop.store(true, Ordering::Release);
            self.event.set();
            return Err(status);
        }
        self.thread.store(object, Ordering::Release);
        Ok(())
    }

    /// D0Exit: stops the thread and waits for it to end. Stopped already:
    /// nothing to do.
    ///
    /// IRQL: PASSIVE_LEVEL (the wait).
    pub(crate) fn stop(&self) {
        let thread = self.thread.swap(core::ptr::null_mut(), Ordering::AcqRel);
        if thread.is_null() {
            return;
        }
        self.event.stop.store(true, Ordering::Release);
        self.event.set();
        // SAFETY: `thread` is the referenced thread object `start` stored,
        // swapped out (waited for and released once); a thread object is a
        // dispatcher object, signaled when the thread ends; no timeout at
        // PASSIVE_LEVEL.
        let _ = unsafe {
            KeWaitForSingleObject(
                thread,
                _KWAIT_REASON::Executive,
                KERNEL_MODE,
                0,
                core::ptr::null_mut(),
            )
        };
        // SAFETY: the reference `start` took; the object is not used again.
        let _ = unsafe { ObfDereferenceObject(thread) };
    }
}

impl Drop for DoorbellThread {
    /// The device is destroyed: D0Exit stopped the thread before. Should it
    /// still run, it is told to stop without waiting (the destroy callback
    /// may run at DISPATCH_LEVEL); it holds its own references to the HCA
    /// and the event, and the thread object's reference is leaked rather
    /// than released under a running thread.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    fn drop(&mut self) {
        if !self.thread.load(Ordering::Acquire).is_null() {
            self.event.stop.store(true, Ordering::Release);
            self.event.set();
        }
    }
}

/// The thread (`KSTART_ROUTINE`): poller steps, yielding between scans and
/// sleeping on the event when the poller says so, until stopped; then it
/// releases its context and terminates.
///
/// IRQL: PASSIVE_LEVEL.
///
/// # Safety
/// Called by the kernel with the context `DoorbellThread::start` gave
/// `PsCreateSystemThread`, once.
unsafe extern "C" fn poll(context: PVOID) {
    // SAFETY: the context is the boxed ThreadContext `start` handed to
    // this thread; it is ours to free.
    let context = unsafe { Box::from_raw(context.cast::<ThreadContext>()) };
    let mut poller = DoorbellPoller::new(DEFAULT_POLL_WINDOW_NS);
    // A zero relative interval: give the processor to any ready thread.
    let mut yield_now = LARGE_INTEGER { QuadPart: 0 };
    while !context.event.stop.load(Ordering::Acquire) {
        let now = KmdfPlatform.now_ns();
        match context.hca.poll_doorbells_step(&mut poller, now) {
            PollerStep::Again => {
                // SAFETY: a kernel-mode, non-alertable delay of a valid
                // interval at PASSIVE_LEVEL.
                let _ = unsafe { KeDelayExecutionThread(KERNEL_MODE, 0, &raw mut yield_now) };
            }
            PollerStep::Sleep => context.event.wait(),
        }
    }
    drop(context);
    // SAFETY: called by a system thread on itself, at PASSIVE_LEVEL; it
    // does not return.
    let _ = unsafe { PsTerminateSystemThread(STATUS_SUCCESS) };
}
