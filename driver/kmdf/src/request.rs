//! [`KmdfRequest`]: the core's [`Request`] over a WDFREQUEST.
//!
//! | core                           | WDF                                            |
//! |--------------------------------|------------------------------------------------|
//! | `ioctl_code`, buffer lengths   | the `EvtIoDeviceControl` / `EvtIoInternalDeviceControl` arguments (what `WdfRequestGetParameters` reports) |
//! | `input` / `output`             | `WdfRequestRetrieveInputBuffer` / `WdfRequestRetrieveOutputBuffer` |
//! | `requestor_mode`               | `WdfRequestGetRequestorMode`                   |
//! | `file`                         | `WdfRequestGetFileObject` and the key in its context |
//! | `complete`                     | `WdfRequestCompleteWithInformation`            |
//! | `mark_cancelable` / `unmark_cancelable` | `WdfRequestMarkCancelableEx` (cancel routine [`evt_request_cancel`] calls `Device::cancel`) / `WdfRequestUnmarkCancelable` |
//! | `address_space`                | the requestor's process (`IoGetCurrentProcess` in `EvtIoInCallerContext`, kept in the request's context) |
//! | `attach_pin` / `take_pin`      | the pinned region's `Shared`, kept in the request's context; the request object's cleanup callback ([`evt_request_cleanup`]) drops one never taken |
//!
//! Every irpverbs IOCTL is `METHOD_BUFFERED`: input and output are one
//! system buffer, the input copied in by the I/O manager. The core copies
//! the whole input out before it writes any output, and writes output only
//! when it completes; here the borrow rules make that the only possible
//! order, since [`Request::input`] borrows the request shared and
//! [`Request::output`] borrows it exclusively.

use core::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use irpverbs_abi::{METHOD_BUFFERED, NtStatus, STATUS_CANCELLED, ioctl_method, nt_success};
use irpverbs_core::{FileKey, MajorFunction, Request, RequestorMode};
use irpverbs_ring::{Region, Shared};
use wdk_sys::ntddk::IoGetCurrentProcess;
use wdk_sys::{
    _WDF_REQUEST_TYPE, KPROCESSOR_MODE, NTSTATUS, PVOID, ULONG_PTR, WDF_REQUEST_PARAMETERS,
    WDFFILEOBJECT, WDFOBJECT, WDFREQUEST, call_unsafe_wdf_function_binding,
};

use crate::context::context_type;
use crate::device;
use crate::mdl::FilePins;

/// `KernelMode` of the kernel's `MODE` enumeration (wdm.h): a
/// `KPROCESSOR_MODE` of 0 is a kernel-mode requestor, anything else user.
pub(crate) const KERNEL_MODE: KPROCESSOR_MODE = 0;

/// The context every WDFREQUEST of the device carries
/// (`WdfDeviceInitSetRequestAttributes`), zero-filled by the framework.
pub(crate) struct RequestContext {
    /// The key given to [`Request::mark_cancelable`], for the cancel routine.
    cancel_key: AtomicU64,
    /// The requestor's process, recorded in `EvtIoInCallerContext` (the
    /// one callback that runs in it); null before.
    process: AtomicPtr<core::ffi::c_void>,
    /// A region pinned in the caller's context ([`Request::attach_pin`]),
    /// from `Shared::into_raw`; null when none.
    pin: AtomicPtr<Region>,
}
context_type!(
    REQUEST_CONTEXT_TYPE,
    RequestContext,
    c"IrpverbsRequestContext"
);

/// Who may complete the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// The driver, and it is not cancelable.
    Owned,
    /// The driver, unless the cancel routine runs first.
    Cancelable,
    /// The cancel routine (`WdfRequestUnmarkCancelable` said it runs).
    CancelOwned,
}

/// An I/O request presented by the device's queue, owned by the driver
/// until it is completed.
pub struct KmdfRequest {
    request: WDFREQUEST,
    code: u32,
    major: MajorFunction,
    mode: RequestorMode,
    file: FileKey,
    file_object: WDFFILEOBJECT,
    input: *const u8,
    input_len: usize,
    output: *mut u8,
    output_len: usize,
    phase: Phase,
}

// SAFETY: a WDFREQUEST owned by the driver may be completed (and its
// buffers used) from any thread at IRQL <= DISPATCH_LEVEL; the buffers are
// nonpaged system memory owned by the request. Nothing here is tied to the
// thread that received it.
unsafe impl Send for KmdfRequest {}

impl core::fmt::Debug for KmdfRequest {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("KmdfRequest")
            .field("request", &self.request)
            .field("code", &self.code)
            .field("file", &self.file)
            .finish_non_exhaustive()
    }
}

impl KmdfRequest {
    /// Wraps a request just presented by the queue's device-control
    /// callback: retrieves its buffers, requestor mode and file.
    ///
    /// For a code that is not `METHOD_BUFFERED` (no irpverbs IOCTL is) the
    /// buffers are left empty: direct and neither-method buffers would need
    /// probing in the caller's context, and the core refuses those codes
    /// (`STATUS_INVALID_DEVICE_REQUEST`) whatever their buffers hold.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    ///
    /// # Errors
    /// The status `WdfRequestRetrieveInputBuffer` / `OutputBuffer` failed
    /// with; the caller still owns the request and completes it with that.
    ///
    /// # Safety
    /// `request` must be a request the framework just presented to the
    /// driver (so the driver owns it), with these parameters.
    pub(crate) unsafe fn new(
        request: WDFREQUEST,
        major: MajorFunction,
        code: u32,
        input_len: usize,
        output_len: usize,
    ) -> Result<Self, NTSTATUS> {
        let buffered = ioctl_method(code) == METHOD_BUFFERED;
        // SAFETY: the caller guarantees `request` is a live, driver-owned request.
        let (input, input_len) = unsafe { retrieve(request, Buffer::Input, input_len, buffered)? };
        // SAFETY: as above.
        let (output, output_len) =
            unsafe { retrieve(request, Buffer::Output, output_len, buffered)? };
        // SAFETY: as above; WdfRequestGetRequestorMode has no other
        // precondition.
        let mode =
            unsafe { call_unsafe_wdf_function_binding!(WdfRequestGetRequestorMode, request) };
        // SAFETY: as above.
        let file_object =
            unsafe { call_unsafe_wdf_function_binding!(WdfRequestGetFileObject, request) };
        // SAFETY: a file object of a live request is live.
        let file = unsafe { device::file_key(file_object) };
        Ok(Self {
            request,
            code,
            major,
            mode: if mode == KERNEL_MODE {
                RequestorMode::Kernel
            } else {
                RequestorMode::User
            },
            file,
            file_object,
            input: input.cast_const(),
            input_len,
            output,
            output_len,
            phase: Phase::Owned,
        })
    }
}

impl KmdfRequest {
    /// Wraps a request in `EvtIoInCallerContext`, before it is queued:
    /// reads its parameters (`WdfRequestGetParameters`) and records the
    /// requestor's process (the current one) in its context. `Ok(None)` for
    /// a request that is not a device control (it is queued untouched).
    ///
    /// IRQL: the requestor's (PASSIVE_LEVEL for user mode).
    ///
    /// # Errors
    /// As [`KmdfRequest::new`].
    ///
    /// # Safety
    /// `request` must be a request the framework just passed to
    /// `EvtIoInCallerContext` (the driver owns it until it enqueues or
    /// completes it).
    pub(crate) unsafe fn in_caller_context(request: WDFREQUEST) -> Result<Option<Self>, NTSTATUS> {
        const SIZE: u16 = {
            assert!(size_of::<WDF_REQUEST_PARAMETERS>() <= u16::MAX as usize);
            #[allow(clippy::cast_possible_truncation, reason = "asserted above")]
            let size = size_of::<WDF_REQUEST_PARAMETERS>() as u16;
            size
        };
        let mut params = WDF_REQUEST_PARAMETERS {
            Size: SIZE,
            ..WDF_REQUEST_PARAMETERS::default()
        };
        // SAFETY: the caller guarantees a live, driver-owned request;
        // `params` is initialized with its Size (WDF_REQUEST_PARAMETERS_INIT).
        unsafe {
            call_unsafe_wdf_function_binding!(WdfRequestGetParameters, request, &raw mut params);
        }
        let major = match params.Type {
            _WDF_REQUEST_TYPE::WdfRequestTypeDeviceControl => MajorFunction::DeviceControl,
            _WDF_REQUEST_TYPE::WdfRequestTypeDeviceControlInternal => {
                MajorFunction::InternalDeviceControl
            }
            _ => return Ok(None),
        };
        // SAFETY: for a device control request the union holds its
        // DeviceIoControl parameters, which the framework filled in.
        let ioctl = unsafe { params.Parameters.DeviceIoControl };
        // SAFETY: IoGetCurrentProcess has no preconditions; this callback
        // runs in the requestor's thread, so it is the requestor's process.
        let process = unsafe { IoGetCurrentProcess() };
        // SAFETY: the request is live; every request of the device has a
        // RequestContext (WdfDeviceInitSetRequestAttributes).
        let context = unsafe { REQUEST_CONTEXT_TYPE.get::<RequestContext>(request.cast()) };
        // SAFETY: the context lives with the request, zero-filled (valid
        // atomics); only atomic accesses touch it.
        unsafe { &*context }
            .process
            .store(process.cast(), Ordering::Release);
        // SAFETY: the caller's guarantee, with the request's parameters.
        let wrapped = unsafe {
            Self::new(
                request,
                major,
                ioctl.IoControlCode,
                ioctl.InputBufferLength,
                ioctl.OutputBufferLength,
            )
        }?;
        Ok(Some(wrapped))
    }

    /// Gives the request back unwrapped, still owned by the driver (to
    /// enqueue it): nothing is completed.
    pub(crate) fn into_handle(self) -> WDFREQUEST {
        let request = self.request;
        core::mem::forget(self);
        request
    }

    /// The pin counter of the request's file.
    pub(crate) fn file_pins(&self) -> Option<Shared<FilePins>> {
        // SAFETY: the file object of a live request is null or live.
        unsafe { device::file_pins(self.file_object) }
    }

    /// The request's context.
    fn context(&self) -> &RequestContext {
        // SAFETY: the request is live (owned by this wrapper); every
        // request of the device has a RequestContext.
        let context = unsafe { REQUEST_CONTEXT_TYPE.get::<RequestContext>(self.request.cast()) };
        // SAFETY: the context lives as long as the request, which outlives
        // this borrow of its wrapper; zero-filled atomics, atomic access only.
        unsafe { &*context }
    }
}

/// Which of a request's buffers.
#[derive(Clone, Copy)]
enum Buffer {
    Input,
    Output,
}

/// Retrieves one buffer of `len` bytes: (null, 0) when `len` is 0 (WDF
/// refuses to retrieve an empty buffer) or the method is not buffered.
///
/// # Safety
/// `request` must be a live, driver-owned request.
unsafe fn retrieve(
    request: WDFREQUEST,
    which: Buffer,
    len: usize,
    buffered: bool,
) -> Result<(*mut u8, usize), NTSTATUS> {
    if len == 0 || !buffered {
        return Ok((core::ptr::null_mut(), 0));
    }
    let mut buffer: PVOID = core::ptr::null_mut();
    let mut got: usize = 0;
    let status = match which {
        // SAFETY: `request` is live and driver-owned (caller); `buffer` and
        // `got` are valid for writes; asking for the whole length.
        Buffer::Input => unsafe {
            call_unsafe_wdf_function_binding!(
                WdfRequestRetrieveInputBuffer,
                request,
                len,
                &raw mut buffer,
                &raw mut got
            )
        },
        // SAFETY: as above, for the output buffer.
        Buffer::Output => unsafe {
            call_unsafe_wdf_function_binding!(
                WdfRequestRetrieveOutputBuffer,
                request,
                len,
                &raw mut buffer,
                &raw mut got
            )
        },
    };
    if !nt_success(status) {
        return Err(status);
    }
    if buffer.is_null() {
        return Ok((core::ptr::null_mut(), 0));
    }
    Ok((buffer.cast(), got.min(len)))
}

/// Completes `request` with `status` and `information` output bytes.
///
/// IRQL: <= DISPATCH_LEVEL.
///
/// # Safety
/// The caller must own `request` (it is not cancelable, or its cancel
/// routine is the caller) and not use it afterwards.
pub(crate) unsafe fn complete_raw(request: WDFREQUEST, status: NTSTATUS, information: usize) {
    // SAFETY: the caller owns the live request and gives it up here.
    unsafe {
        call_unsafe_wdf_function_binding!(
            WdfRequestCompleteWithInformation,
            request,
            status,
            information as ULONG_PTR
        );
    }
}

impl Request for KmdfRequest {
    fn ioctl_code(&self) -> u32 {
        self.code
    }

    fn major_function(&self) -> MajorFunction {
        self.major
    }

    fn requestor_mode(&self) -> RequestorMode {
        self.mode
    }

    fn file(&self) -> FileKey {
        self.file
    }

    fn input(&self) -> &[u8] {
        if self.input.is_null() {
            return &[];
        }
        // SAFETY: WDF returned `input` for `input_len` bytes of the request's
        // system buffer, valid until the request completes (which consumes
        // `self`); while this shared borrow lives no `&mut` to the buffer
        // exists (`output` needs `&mut self`), and nothing else writes it.
        unsafe { core::slice::from_raw_parts(self.input, self.input_len) }
    }

    fn output(&mut self) -> &mut [u8] {
        if self.output.is_null() {
            return &mut [];
        }
        // SAFETY: WDF returned `output` for `output_len` bytes of the
        // request's system buffer, valid until the request completes; the
        // exclusive borrow of `self` excludes any other slice of it (the
        // input slice included, which may alias it for METHOD_BUFFERED).
        unsafe { core::slice::from_raw_parts_mut(self.output, self.output_len) }
    }

    /// `WdfRequestCompleteWithInformation`.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    fn complete(self, status: NtStatus, information: usize) {
        let request = self.request;
        core::mem::forget(self);
        // SAFETY: `self` owned the request (the core completes only requests
        // it owns: not cancelable, or unmarked, or from its cancel routine)
        // and is consumed: the handle is not used again.
        unsafe { complete_raw(request, status, information) };
    }

    /// Stores `cancel_key` in the request's context, then
    /// `WdfRequestMarkCancelableEx` with [`evt_request_cancel`].
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    ///
    /// # Errors
    /// `STATUS_CANCELLED` if the request was already cancelled; the caller
    /// still owns it.
    fn mark_cancelable(&mut self, cancel_key: u64) -> Result<(), NtStatus> {
        if self.phase == Phase::CancelOwned {
            return Err(STATUS_CANCELLED);
        }
        // SAFETY: the request is live; every request of the device has a
        // RequestContext (WdfDeviceInitSetRequestAttributes).
        let context = unsafe { REQUEST_CONTEXT_TYPE.get::<RequestContext>(self.request.cast()) };
        // SAFETY: the context is live with the request and zero-filled (a
        // valid AtomicU64); only atomic accesses touch it.
        let context = unsafe { &*context };
        // Published before the request becomes cancelable: the cancel
        // routine may run as soon as WdfRequestMarkCancelableEx returns.
        context.cancel_key.store(cancel_key, Ordering::Release);
        if self.phase == Phase::Cancelable {
            // Already cancelable: the cancel routine will read the new key.
            return Ok(());
        }
        // SAFETY: the driver owns the request and it is not cancelable
        // (phase Owned), so this marks it once.
        let status = unsafe {
            call_unsafe_wdf_function_binding!(
                WdfRequestMarkCancelableEx,
                self.request,
                Some(evt_request_cancel)
            )
        };
        if nt_success(status) {
            self.phase = Phase::Cancelable;
            Ok(())
        } else {
            Err(status)
        }
    }

    /// The requestor's process as recorded in `EvtIoInCallerContext`.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    fn address_space(&self) -> u64 {
        self.context()
            .process
            .load(Ordering::Acquire)
            .expose_provenance() as u64
    }

    /// Keeps the region in the request's context (`Shared::into_raw`).
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    fn attach_pin(&mut self, region: irpverbs_ring::Shared<Region>) {
        let old = self.context().pin.swap(
            irpverbs_ring::Shared::into_raw(region).cast_mut(),
            Ordering::AcqRel,
        );
        if !old.is_null() {
            // SAFETY: a non-null pin came from `Shared::into_raw` here and
            // was swapped out, so this is its only owner.
            drop(unsafe { irpverbs_ring::Shared::from_raw(old) });
        }
    }

    /// Takes the region out of the request's context.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    fn take_pin(&mut self) -> Option<irpverbs_ring::Shared<Region>> {
        let pin = self
            .context()
            .pin
            .swap(core::ptr::null_mut(), Ordering::AcqRel);
        if pin.is_null() {
            return None;
        }
        // SAFETY: from `Shared::into_raw` in `attach_pin`, swapped out: owned.
        Some(unsafe { irpverbs_ring::Shared::from_raw(pin) })
    }

    /// `WdfRequestUnmarkCancelable`.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    ///
    /// # Errors
    /// `STATUS_CANCELLED` if the cancel routine has run or will run: it owns
    /// the request, and the caller must not complete it.
    fn unmark_cancelable(&mut self) -> Result<(), NtStatus> {
        match self.phase {
            Phase::Owned => return Ok(()),
            Phase::CancelOwned => return Err(STATUS_CANCELLED),
            Phase::Cancelable => {}
        }
        // SAFETY: the request is live and marked cancelable by us.
        let status =
            unsafe { call_unsafe_wdf_function_binding!(WdfRequestUnmarkCancelable, self.request) };
        if nt_success(status) {
            self.phase = Phase::Owned;
            Ok(())
        } else {
            self.phase = Phase::CancelOwned;
            Err(status)
        }
    }
}

impl Drop for KmdfRequest {
    /// Reached only if the core let go of a request without completing it
    /// (a bug: it completes every request it owns, and drops one only after
    /// `unmark_cancelable` told it the cancel routine owns it). An owned
    /// request is completed with `STATUS_CANCELLED` rather than leaked,
    /// which would hang its file's close forever.
    fn drop(&mut self) {
        match self.phase {
            Phase::CancelOwned => {}
            Phase::Cancelable => {
                if self.unmark_cancelable().is_ok() {
                    // SAFETY: unmarked: the driver owns it again.
                    unsafe { complete_raw(self.request, STATUS_CANCELLED, 0) };
                }
            }
            Phase::Owned => {
                // SAFETY: the driver owns the request and drops it now.
                unsafe { complete_raw(self.request, STATUS_CANCELLED, 0) };
            }
        }
    }
}

/// The request objects' `EvtCleanupCallback` (the framework deletes a
/// request it created once the request is completed): drops a pinned region
/// the request still holds, which unpins it (a user `REG_MR` completed
/// before the queue presented it, e.g. cancelled or refused).
///
/// IRQL: <= DISPATCH_LEVEL.
pub(crate) extern "C" fn evt_request_cleanup(object: WDFOBJECT) {
    // SAFETY: the framework passes one of the device's requests, whose
    // context is valid until its cleanup returns.
    let context = unsafe { REQUEST_CONTEXT_TYPE.get::<RequestContext>(object) };
    if context.is_null() {
        return;
    }
    // SAFETY: as above; atomic access only.
    let pin = unsafe { &*context }
        .pin
        .swap(core::ptr::null_mut(), Ordering::AcqRel);
    if !pin.is_null() {
        // SAFETY: from `Shared::into_raw` in `attach_pin`, swapped out: owned.
        drop(unsafe { irpverbs_ring::Shared::from_raw(pin) });
    }
}

/// `EvtRequestCancel` for requests the core marked cancelable: hands the
/// cancel key to `Device::cancel`, which from now on owns the request and
/// completes it.
///
/// IRQL: <= DISPATCH_LEVEL.
pub(crate) extern "C" fn evt_request_cancel(request: WDFREQUEST) {
    // SAFETY: the framework passes a live request marked cancelable by
    // `mark_cancelable`, which stored the key in its context first.
    let context = unsafe { REQUEST_CONTEXT_TYPE.get::<RequestContext>(request.cast()) };
    // SAFETY: the context lives as long as the request; atomic access only.
    let key = unsafe { &*context }.cancel_key.load(Ordering::Acquire);
    // SAFETY: the request is live; it was presented by the device's queue.
    let queue = unsafe { call_unsafe_wdf_function_binding!(WdfRequestGetIoQueue, request) };
    // SAFETY: the queue of a live request is live.
    let device = unsafe { call_unsafe_wdf_function_binding!(WdfIoQueueGetDevice, queue) };
    // SAFETY: the device of a live queue is live, and ours.
    match unsafe { device::state(device) } {
        Some(state) => state.device.cancel(key),
        // No device state (cannot happen while the device has requests):
        // the cancel routine owns the request, so complete it here.
        None => {
            // SAFETY: the cancel routine owns the request.
            unsafe { complete_raw(request, STATUS_CANCELLED, 0) };
        }
    }
}
