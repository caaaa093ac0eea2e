//! Event queues with a file descriptor, as the kernel's uverbs event files
//! are: a thread waits on a driver request that completes with one event
//! (`IOCTL_IV_GET_CQ_EVENT` for a completion channel,
//! `IOCTL_IV_GET_ASYNC_EVENT` for a context's `async_fd`), queues the
//! event and signals it on the platform's event source ([`Signal`]: an
//! eventfd in semaphore mode, so the fd works with `poll`, `epoll` and
//! `O_NONBLOCK`; on Windows an event HANDLE, signaled while events are
//! queued); taking an event takes it off the source.
//! Events of an object being destroyed that the program has not taken are
//! dropped (the kernel drops them too), and acknowledged to the driver by
//! the caller.

use std::collections::VecDeque;
use std::ffi::c_int;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use irpverbs_abi::*;
use irpverbs_verbs::IoctlTransport;
use zerocopy::{FromBytes, IntoBytes};

use crate::file::DeviceFile;
use crate::os::{Fd, Signal};
use crate::{Context, errno_of};

/// Events of type `T` from one driver request, repeated.
pub(crate) struct Events<T> {
    signal: Arc<Signal>,
    queue: Arc<Mutex<VecDeque<T>>>,
    thread: Option<JoinHandle<()>>,
}

impl<T: FromBytes + IntoBytes + Copy + Send + 'static> Events<T> {
    /// Starts the thread that waits on `code` with `input` on `file`.
    ///
    /// # Errors
    /// The errno of making the event source, `ENOMEM` without a thread.
    pub fn start(file: DeviceFile, code: u32, input: Vec<u8>) -> Result<Self, c_int> {
        let signal = Arc::new(Signal::new()?);
        let queue = Arc::new(Mutex::new(VecDeque::new()));
        let q = Arc::clone(&queue);
        let s = Arc::clone(&signal);
        let spawned = std::thread::Builder::new()
            .name("ibv-events".into())
            .spawn(move || forward::<T>(&file, code, &input, &q, &s));
        match spawned {
            Ok(t) => Ok(Self {
                signal,
                queue,
                thread: Some(t),
            }),
            Err(_) => {
                if let Ok(s) = Arc::try_unwrap(signal) {
                    s.close();
                }
                Err(libc::ENOMEM)
            }
        }
    }

    /// The event source the program waits on (`fd`, `async_fd`).
    pub fn fd(&self) -> Fd {
        self.signal.raw()
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, VecDeque<T>> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The next event: waits while there is none, unless the fd is
    /// non-blocking (then `EAGAIN`).
    ///
    /// # Errors
    /// The errno of waiting on the event source.
    pub fn take(&self) -> Result<T, c_int> {
        loop {
            self.signal.wait()?;
            // None: the event was dropped with its object meanwhile; wait
            // for the next.
            let mut q = self.queue();
            if let Some(e) = q.pop_front() {
                self.signal.taken(q.is_empty());
                return Ok(e);
            }
        }
    }

    /// Drops the queued events `of` picks (taking them off the event
    /// source) and returns them.
    pub fn drop_where(&self, of: impl Fn(&T) -> bool) -> Vec<T> {
        let mut q = self.queue();
        let dropped: Vec<T> = q.iter().filter(|e| of(e)).copied().collect();
        q.retain(|e| !of(e));
        for _ in &dropped {
            self.signal.dropped(q.is_empty());
        }
        dropped
    }

    /// Waits for the thread, once the driver ended its wait (the channel
    /// destroyed, the file closed), and closes the event source.
    pub fn finish(mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Ok(s) = Arc::try_unwrap(self.signal) {
            s.close();
        }
    }
}

/// The thread: each event the driver completes `code` with is queued and
/// signaled, until the request fails (its object destroyed, the file
/// closed).
fn forward<T: FromBytes + Copy>(
    file: &DeviceFile,
    code: u32,
    input: &[u8],
    queue: &Mutex<VecDeque<T>>,
    signal: &Signal,
) {
    loop {
        let (status, out) = file.ioctl(code, input, size_of::<T>());
        let Ok(event) = T::read_from_bytes(&out) else {
            return;
        };
        if !nt_success(status) {
            return;
        }
        let mut q = queue.lock().unwrap_or_else(PoisonError::into_inner);
        q.push_back(event);
        signal.post();
    }
}

/// Tries `destroy` of an object while the driver finds it busy because of
/// events the threads are still handing over: before each try, `settle`
/// drops (and acknowledges) the object's events not taken. Up to 200 tries
/// a millisecond apart; then the driver's answer stands.
pub(crate) fn destroy_settled(
    mut settle: impl FnMut(),
    mut destroy: impl FnMut() -> Result<(), NtStatus>,
) -> Result<(), NtStatus> {
    let mut r = Err(STATUS_DEVICE_BUSY);
    for _ in 0..200 {
        settle();
        r = destroy();
        if r != Err(STATUS_DEVICE_BUSY) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    r
}

/// An object whose rings the speed path maps (a QP, SRQ or CQ): what
/// its destroy does around the driver's.
pub(crate) trait Mapped {
    /// Drops the object's events not taken (see [`destroy_settled`]).
    fn settle(&self, c: &Context);
    /// The driver's destroy.
    fn destroy(&self, c: &Context) -> Result<(), NtStatus>;
    /// The speed path lets go of the rings.
    ///
    /// # Safety
    /// Once, before the destroy; nothing posts or polls on the object meanwhile.
    unsafe fn close(&mut self);
    /// The speed path opens the rings again (the destroy failed).
    ///
    /// # Safety
    /// After [`Mapped::close`], on the object the driver kept.
    unsafe fn reopen(&mut self, c: &Context);
    /// The driver destroyed the object: what else it held goes.
    fn destroyed(&mut self) {}
}

/// The destroy of a mapped object at `obj` (from `leak`, a `Box`): the
/// speed path lets go, the driver destroys it (settled), the memory goes;
/// if the driver keeps it (`EBUSY` while in use, ...), the speed path
/// opens it again and nothing changed. 0 or the errno.
///
/// # Safety
/// `obj` is a live object of this library, made with `leak`, that the
/// program does not use meanwhile.
pub(crate) unsafe fn destroy_mapped<T: Mapped>(obj: *mut T, c: &Context) -> c_int {
    // SAFETY: live and not in use (caller).
    let o = unsafe { &mut *obj };
    // SAFETY: before the destroy (the caller's object is not in use).
    unsafe { o.close() };
    match destroy_settled(|| o.settle(c), || o.destroy(c)) {
        Ok(()) => {
            o.destroyed();
            // SAFETY: from `leak` (caller), destroyed once.
            drop(unsafe { Box::from_raw(obj) });
            0
        }
        Err(s) => {
            // SAFETY: the object lives on, closed above.
            unsafe { o.reopen(c) };
            errno_of(s)
        }
    }
}
