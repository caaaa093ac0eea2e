//! I/O requests (WDFREQUEST) with exactly-once completion and KMDF's
//! race-free cancel ownership.
//!
//! A request's state lives behind one mutex shared by the driver's
//! [`HostRequest`] and any number of [`RequestHandle`]s, so a cancel racing
//! a completion (or an unmark) resolves to exactly one owner:
//!
//! ```text
//!            mark_cancelable            cancel()
//!   Owned ───────────────────▶ Cancelable ───────▶ CancelOwned ──┐
//!     ▲  ◀─────────────────────    │ (routine invoked)           │
//!     │      unmark_cancelable     │                             │ complete
//!     │                            │ complete: bugcheck 0xC9/0x7 ▼
//!     └──────────── complete ───────────────────────────────▶ Completed
//! ```
//!
//! A cancel while `Owned` is remembered: the next `mark_cancelable` fails
//! with STATUS_CANCELLED and the driver completes the request itself.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use irpverbs_abi::{NtStatus, STATUS_CANCELLED, nt_success};
use irpverbs_core::platform::{
    DISPATCH_LEVEL, FileKey, MajorFunction, ProcessKey, Request, RequestorMode,
};

use super::Shared;
use super::bugcheck::{codes, iomanager, stop, wdf};
use super::irql;

/// Called once when the request completes, at the completer's IRQL, with
/// the status, the information value and the first `information` bytes of
/// the output buffer.
pub type CompletionRoutine = Box<dyn FnOnce(NtStatus, usize, &[u8]) + Send>;

/// Runs after a kept result ([`Completion::Keep`]) is stored. Shared by
/// every synchronous call of a file, taken fallibly when the file is opened
/// ([`kept_notify`]).
pub type KeptNotify = irpverbs_ring::Shared<Box<dyn Fn() + Send + Sync>>;

/// A [`KeptNotify`] running `f`, or `None` when its memory is refused.
pub fn kept_notify(f: impl Fn() + Send + Sync + 'static) -> Option<KeptNotify> {
    let f: Box<dyn Fn() + Send + Sync> = irpverbs_ring::try_box(f).ok()?;
    irpverbs_ring::Shared::try_new(f).ok()
}

/// What happens when a request completes.
pub enum Completion {
    /// A routine is called with the status, the information value and the
    /// first `information` bytes of the output buffer.
    Routine(CompletionRoutine),
    /// The status and the system buffer (truncated to `information` bytes)
    /// stay in the request for its issuer to take
    /// ([`RequestHandle::take_result`]): a synchronous call, with no
    /// routine to allocate and no output copy. Then the notify runs.
    Keep(KeptNotify),
}

/// The driver's cancel routine, called at DISPATCH_LEVEL with the key given
/// to `mark_cancelable`; from then on it owns the request.
pub type CancelRoutine = Arc<dyn Fn(u64) + Send + Sync>;

/// What a request carries when the host dispatches it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestParams {
    /// The IOCTL code.
    pub ioctl_code: u32,
    /// The major function it arrives on.
    pub major_function: MajorFunction,
    /// Kernel or user caller.
    pub requestor_mode: RequestorMode,
    /// The file (open) it was issued on.
    pub file: FileKey,
    /// The process it was issued from (its handle's): [`HOST_PROCESS`]
    /// unless a test models another ([`super::HostPlatform::create_process`]).
    pub process: ProcessKey,
    /// The input buffer (copied into the system buffer).
    pub input: Vec<u8>,
    /// The output buffer's length.
    pub output_len: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// The driver owns it and it is not cancelable.
    Owned,
    /// Marked cancelable with this key.
    Cancelable { key: u64 },
    /// Cancelled while cancelable: the cancel routine owns it.
    CancelOwned,
    /// Completed.
    Completed,
}

struct State {
    phase: Phase,
    /// A cancel was requested (CancelIoEx) at some point.
    cancel_requested: bool,
    on_complete: Option<Completion>,
    /// A [`Completion::Keep`] request's result, until taken.
    result: Option<(NtStatus, Vec<u8>)>,
}

struct RequestShared {
    id: u64,
    file: FileKey,
    output_len: usize,
    platform: Arc<Shared>,
    cancel_routine: Option<CancelRoutine>,
    state: Mutex<State>,
}

impl RequestShared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn verify(&self) -> bool {
        self.platform.verify
    }

    /// The cancel routine's "address" for bugcheck parameters.
    fn cancel_routine_addr(&self) -> u64 {
        self.cancel_routine
            .as_ref()
            .map_or(0, |r| Arc::as_ptr(r).cast::<()>() as usize as u64)
    }

    /// Completes the request (the I/O manager's work: uncharged, even when
    /// the driver completes it).
    fn complete(&self, status: NtStatus, information: usize, output: Option<Vec<u8>>) {
        super::heap::uncharged(|| self.complete_uncharged(status, information, output));
    }

    fn complete_uncharged(&self, status: NtStatus, information: usize, output: Option<Vec<u8>>) {
        let verify = self.verify();
        if verify {
            let now = irql::current_irql();
            if now > DISPATCH_LEVEL {
                stop(
                    codes::DRIVER_VERIFIER_IOMANAGER_VIOLATION,
                    [iomanager::COMPLETE_ABOVE_DISPATCH, now.into(), self.id, 0],
                    format!("request {} completed at IRQL {now}", self.id),
                );
            }
        }
        let mut state = self.state();
        match state.phase {
            Phase::Completed => {
                drop(state);
                if verify {
                    stop(
                        codes::MULTIPLE_IRP_COMPLETE_REQUESTS,
                        [self.id, 0, 0, 0],
                        format!("request {} completed twice", self.id),
                    );
                }
                return;
            }
            Phase::Cancelable { key } if verify => {
                drop(state);
                stop(
                    codes::DRIVER_VERIFIER_IOMANAGER_VIOLATION,
                    [
                        iomanager::COMPLETE_WITH_CANCEL_ROUTINE,
                        self.cancel_routine_addr(),
                        self.id,
                        0,
                    ],
                    format!(
                        "request {} (cancel key {key}) completed while still marked \
                         cancelable: unmark_cancelable first; if it fails, the cancel \
                         routine owns the request",
                        self.id
                    ),
                );
            }
            _ => {}
        }
        if verify && nt_success(status) && information > self.output_len {
            drop(state);
            stop(
                codes::WDF_VIOLATION,
                [
                    wdf::REQUEST_FATAL_ERROR,
                    wdf::INFORMATION_LENGTH_MISMATCH,
                    self.id,
                    information as u64,
                ],
                format!(
                    "request {} completed with information {information} > output length {}",
                    self.id, self.output_len
                ),
            );
        }
        state.phase = Phase::Completed;
        let on_complete = state.on_complete.take();
        let information = information.min(self.output_len);
        let notify = match on_complete {
            Some(Completion::Keep(notify)) => {
                let mut buffer = output.unwrap_or_default();
                buffer.resize(information, 0);
                state.result = Some((status, buffer));
                drop(state);
                Some(notify)
            }
            Some(Completion::Routine(routine)) => {
                drop(state);
                if verify {
                    self.platform.untrack_request(self.file, self.id);
                }
                // The routine is the issuer's code, not the I/O manager's
                // bookkeeping: the process-wide injection reaches it.
                match output {
                    Some(buffer) => super::heap::outside(|| {
                        routine(status, information, &buffer[..information]);
                    }),
                    None => {
                        let zeros = vec![0; information];
                        super::heap::outside(|| routine(status, information, &zeros));
                    }
                }
                return;
            }
            None => {
                drop(state);
                None
            }
        };
        if verify {
            self.platform.untrack_request(self.file, self.id);
        }
        if let Some(notify) = notify {
            notify();
        }
    }

    /// CancelIoEx: see [`RequestHandle::cancel`].
    fn cancel(&self) -> bool {
        irql::check_irql_at_most(self.verify(), DISPATCH_LEVEL, "cancel");
        let mut state = self.state();
        if state.phase == Phase::Completed {
            return false;
        }
        state.cancel_requested = true;
        let Phase::Cancelable { key } = state.phase else {
            return true;
        };
        let Some(routine) = self.cancel_routine.clone() else {
            return true;
        };
        state.phase = Phase::CancelOwned;
        drop(state);
        let old = irql::current_irql();
        if old < DISPATCH_LEVEL {
            irql::set_irql(DISPATCH_LEVEL);
        }
        routine(key);
        irql::check_returned_at(self.verify(), DISPATCH_LEVEL, "a cancel routine");
        irql::lower_to(old);
        true
    }
}

/// The layout of a request's own memory (what refusing it reports).
pub(crate) fn request_layout() -> std::alloc::Layout {
    std::alloc::Layout::new::<RequestShared>()
}

/// A request the driver owns (the [`Request`] the core sees).
///
/// The system buffer is `max(input, output)` bytes (METHOD_BUFFERED):
/// [`input`](Request::input) is its first `input.len()` bytes,
/// [`output`](Request::output) its first `output_len` bytes.
pub struct HostRequest {
    shared: irpverbs_ring::Shared<RequestShared>,
    ioctl_code: u32,
    major_function: MajorFunction,
    requestor_mode: RequestorMode,
    process: ProcessKey,
    input_len: usize,
    buffer: Vec<u8>,
    /// A region pinned in the caller's context, until dispatch takes it
    /// (dropped with the request otherwise).
    pin: Option<irpverbs_ring::Shared<irpverbs_ring::Region>>,
}

impl std::fmt::Debug for HostRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostRequest")
            .field("id", &self.shared.id)
            .field("ioctl_code", &format_args!("{:#x}", self.ioctl_code))
            .field("file", &self.shared.file)
            .field("input_len", &self.input_len)
            .field("output_len", &self.shared.output_len)
            .finish_non_exhaustive()
    }
}

impl HostRequest {
    /// The request, or its completion back (not run) when its memory (the
    /// IRP's) is refused. The system buffer is `params.input`, which must
    /// have room for `output_len` bytes already (nothing else allocates).
    pub(crate) fn try_new(
        id: u64,
        platform: Arc<Shared>,
        params: RequestParams,
        on_complete: Completion,
        cancel_routine: Option<CancelRoutine>,
    ) -> Result<Self, Completion> {
        let RequestParams {
            ioctl_code,
            major_function,
            requestor_mode,
            file,
            process,
            mut input,
            output_len,
        } = params;
        let input_len = input.len();
        input.resize(input_len.max(output_len), 0);
        let shared = irpverbs_ring::Shared::try_new(RequestShared {
            id,
            file,
            output_len,
            platform,
            cancel_routine,
            state: Mutex::new(State {
                phase: Phase::Owned,
                cancel_requested: false,
                on_complete: None,
                result: None,
            }),
        });
        let Ok(shared) = shared else {
            return Err(on_complete);
        };
        shared.state().on_complete = Some(on_complete);
        Ok(Self {
            shared,
            ioctl_code,
            major_function,
            requestor_mode,
            process,
            input_len,
            buffer: input,
            pin: None,
        })
    }

    /// A handle to this request (like the WDFREQUEST handle value).
    #[must_use]
    pub fn handle(&self) -> RequestHandle {
        RequestHandle {
            shared: self.shared.clone(),
        }
    }

    /// The request's id (what bugcheck parameters show as its address).
    #[must_use]
    pub fn id(&self) -> u64 {
        self.shared.id
    }

    /// Whether a cancel was requested (WdfRequestIsCanceled).
    #[must_use]
    pub fn is_cancel_requested(&self) -> bool {
        self.shared.state().cancel_requested
    }
}

impl Request for HostRequest {
    fn ioctl_code(&self) -> u32 {
        self.ioctl_code
    }

    fn major_function(&self) -> MajorFunction {
        self.major_function
    }

    fn requestor_mode(&self) -> RequestorMode {
        self.requestor_mode
    }

    fn file(&self) -> FileKey {
        self.shared.file
    }

    fn input(&self) -> &[u8] {
        &self.buffer[..self.input_len]
    }

    fn output(&mut self) -> &mut [u8] {
        &mut self.buffer[..self.shared.output_len]
    }

    /// Completes the request: the completion routine runs now, on this
    /// thread, at this IRQL.
    ///
    /// IRQL: <= DISPATCH_LEVEL (else 0xC9/0x0E). The verifier bugchecks
    /// 0x44 if it was already completed (through a handle), 0xC9/0x07 if it
    /// is still marked cancelable, and 0x10D/0x6/0x4 if a successful
    /// completion reports more information bytes than the output buffer
    /// has. With the verifier off those are ignored (a second completion
    /// does nothing; information is clamped).
    #[track_caller]
    fn complete(self, status: NtStatus, information: usize) {
        let Self { shared, buffer, .. } = self;
        shared.complete(status, information, Some(buffer));
    }

    /// Makes the request cancelable with `cancel_key`
    /// (WdfRequestMarkCancelable).
    ///
    /// IRQL: <= DISPATCH_LEVEL (else 0xC4/0xE5).
    ///
    /// # Errors
    /// `STATUS_CANCELLED` if a cancel was already requested (or the request
    /// was completed behind the driver's back): the driver must complete it.
    /// The verifier bugchecks 0x10D/0x6/0x1001 (host-defined) if it is
    /// already cancelable or owned by its cancel routine.
    #[track_caller]
    fn mark_cancelable(&mut self, cancel_key: u64) -> Result<(), NtStatus> {
        let shared = &self.shared;
        irql::check_irql_at_most(shared.verify(), DISPATCH_LEVEL, "mark_cancelable");
        let mut state = shared.state();
        if state.cancel_requested || state.phase == Phase::Completed {
            return Err(STATUS_CANCELLED);
        }
        if state.phase != Phase::Owned && shared.verify() {
            drop(state);
            stop(
                codes::WDF_VIOLATION,
                [
                    wdf::REQUEST_FATAL_ERROR,
                    wdf::HOST_MARK_CANCELABLE_TWICE,
                    shared.id,
                    0,
                ],
                format!(
                    "request {} marked cancelable while already cancelable",
                    shared.id
                ),
            );
        }
        state.phase = Phase::Cancelable { key: cancel_key };
        Ok(())
    }

    /// Makes the request not cancelable (WdfRequestUnmarkCancelable).
    ///
    /// IRQL: <= DISPATCH_LEVEL (else 0xC4/0xE5).
    ///
    /// # Errors
    /// `STATUS_CANCELLED` if the cancel routine has run or is running: it
    /// owns the request and the caller must not complete it. The verifier
    /// bugchecks 0x10D/0x6/0x1002 (host-defined) if it was not cancelable.
    #[track_caller]
    fn unmark_cancelable(&mut self) -> Result<(), NtStatus> {
        let shared = &self.shared;
        irql::check_irql_at_most(shared.verify(), DISPATCH_LEVEL, "unmark_cancelable");
        let mut state = shared.state();
        match state.phase {
            Phase::Cancelable { .. } => {
                state.phase = Phase::Owned;
                Ok(())
            }
            Phase::CancelOwned | Phase::Completed => Err(STATUS_CANCELLED),
            Phase::Owned => {
                drop(state);
                if shared.verify() {
                    stop(
                        codes::WDF_VIOLATION,
                        [
                            wdf::REQUEST_FATAL_ERROR,
                            wdf::HOST_UNMARK_NOT_CANCELABLE,
                            shared.id,
                            0,
                        ],
                        format!("request {} unmarked but not cancelable", shared.id),
                    );
                }
                Ok(())
            }
        }
    }

    /// The process the request was issued from ([`RequestParams::process`]).
    fn address_space(&self) -> ProcessKey {
        self.process
    }

    /// Kept in the request, dropped with it if dispatch never takes it.
    fn attach_pin(&mut self, region: irpverbs_ring::Shared<irpverbs_ring::Region>) {
        self.pin = Some(region);
    }

    fn take_pin(&mut self) -> Option<irpverbs_ring::Shared<irpverbs_ring::Region>> {
        self.pin.take()
    }
}

/// The process host-mode callers run in unless a test models another
/// ([`super::HostPlatform::create_process`]): host mode runs the driver and
/// its callers in one address space, and models processes only as the
/// identities the driver binds files, pins and mappings to.
pub const HOST_PROCESS: ProcessKey = 1;

/// A cloneable reference to a request, for the host side (the I/O manager)
/// and tests: cancel it, or complete it behind the driver's back.
#[derive(Clone)]
pub struct RequestHandle {
    shared: irpverbs_ring::Shared<RequestShared>,
}

impl std::fmt::Debug for RequestHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestHandle")
            .field("id", &self.shared.id)
            .field("phase", &self.shared.state().phase)
            .finish()
    }
}

impl RequestHandle {
    /// The request's id.
    #[must_use]
    pub fn id(&self) -> u64 {
        self.shared.id
    }

    /// The file it was issued on.
    #[must_use]
    pub fn file(&self) -> FileKey {
        self.shared.file
    }

    /// Requests cancellation (what CancelIoEx triggers). If the request is
    /// marked cancelable, the cancel routine now owns it and is called at
    /// DISPATCH_LEVEL on this thread before `cancel` returns; otherwise the
    /// cancel is remembered (the next `mark_cancelable` fails). Returns
    /// `false` if it was already completed.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    pub fn cancel(&self) -> bool {
        self.shared.cancel()
    }

    /// Completes the request through the handle, with an all-zero output of
    /// `information` bytes: how a test plays a second owner. Same checks
    /// as [`Request::complete`].
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    #[track_caller]
    pub fn complete(&self, status: NtStatus, information: usize) {
        self.shared.complete(status, information, None);
    }

    /// Whether it has completed.
    #[must_use]
    pub fn is_completed(&self) -> bool {
        self.shared.state().phase == Phase::Completed
    }

    /// Whether a cancel was requested.
    #[must_use]
    pub fn is_cancel_requested(&self) -> bool {
        self.shared.state().cancel_requested
    }

    /// A [`Completion::Keep`] request's status and output bytes, once it
    /// has completed (then `None`: the result is taken once).
    #[must_use]
    pub fn take_result(&self) -> Option<(NtStatus, Vec<u8>)> {
        self.shared.state().result.take()
    }
}
