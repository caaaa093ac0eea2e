//! Event queues with a file descriptor, as the kernel's uverbs event files
//! are: a thread waits on a driver request that completes with one event
//! (`IOCTL_IV_GET_CQ_EVENT` for a completion channel,
//! `IOCTL_IV_GET_ASYNC_EVENT` for a context's `async_fd`), queues the
//! event and counts it on an eventfd (semaphore mode), so the fd works
//! with `poll`, `epoll` and `O_NONBLOCK`; taking an event takes one count.
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
use crate::{Context, errno_of};

/// Events of type `T` from one driver request, repeated.
pub(crate) struct Events<T> {
    /// The eventfd the program polls.
    pub fd: c_int,
    queue: Arc<Mutex<VecDeque<T>>>,
    thread: Option<JoinHandle<()>>,
}

impl<T: FromBytes + IntoBytes + Copy + Send + 'static> Events<T> {
    /// Starts the thread that waits on `code` with `input` on `file`.
    ///
    /// # Errors
    /// `EMFILE` without an eventfd, `ENOMEM` without a thread.
    pub fn start(file: DeviceFile, code: u32, input: Vec<u8>) -> Result<Self, c_int> {
        // SAFETY: no arguments but flags.
        let fd = unsafe { libc::eventfd(0, libc::EFD_SEMAPHORE | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(libc::EMFILE);
        }
        let queue = Arc::new(Mutex::new(VecDeque::new()));
        let q = Arc::clone(&queue);
        let spawned = std::thread::Builder::new()
            .name("ibv-events".into())
            .spawn(move || forward::<T>(&file, code, &input, &q, fd));
        match spawned {
            Ok(t) => Ok(Self {
                fd,
                queue,
                thread: Some(t),
            }),
            Err(_) => {
                // SAFETY: the eventfd, unused.
                unsafe { libc::close(fd) };
                Err(libc::ENOMEM)
            }
        }
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, VecDeque<T>> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The next event: waits while there is none, unless the fd is
    /// non-blocking (then `EAGAIN`).
    ///
    /// # Errors
    /// The errno of reading the fd.
    pub fn take(&self) -> Result<T, c_int> {
        loop {
            let mut count = 0u64;
            // SAFETY: the eventfd; 8 bytes.
            if unsafe { libc::read(self.fd, (&raw mut count).cast(), 8) } != 8 {
                // SAFETY: the calling thread's errno.
                return Err(unsafe { *libc::__errno_location() });
            }
            // None: the event was dropped with its object meanwhile; wait
            // for the next.
            if let Some(e) = self.queue().pop_front() {
                return Ok(e);
            }
        }
    }

    /// Drops the queued events `of` picks (taking their counts off the
    /// fd) and returns them.
    pub fn drop_where(&self, of: impl Fn(&T) -> bool) -> Vec<T> {
        let mut q = self.queue();
        let dropped: Vec<T> = q.iter().filter(|e| of(e)).copied().collect();
        q.retain(|e| !of(e));
        for _ in &dropped {
            let mut p = libc::pollfd {
                fd: self.fd,
                events: libc::POLLIN,
                revents: 0,
            };
            let mut count = 0u64;
            // SAFETY: one pollfd.
            if unsafe { libc::poll(&mut p, 1, 0) } == 1 {
                // SAFETY: the eventfd, readable (so the read does not
                // block); 8 bytes.
                unsafe { libc::read(self.fd, (&raw mut count).cast(), 8) };
            }
        }
        dropped
    }

    /// Waits for the thread, once the driver ended its wait (the channel
    /// destroyed, the file closed), and closes the fd.
    pub fn finish(mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // SAFETY: the eventfd, closed once.
        unsafe { libc::close(self.fd) };
    }
}

/// The thread: each event the driver completes `code` with is queued and
/// counted, until the request fails (its object destroyed, the file
/// closed).
fn forward<T: FromBytes + Copy>(
    file: &DeviceFile,
    code: u32,
    input: &[u8],
    queue: &Mutex<VecDeque<T>>,
    fd: c_int,
) {
    loop {
        let (status, out) = file.ioctl(code, input, size_of::<T>());
        let Ok(event) = T::read_from_bytes(&out) else {
            return;
        };
        if !nt_success(status) {
            return;
        }
        queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push_back(event);
        let one = 1u64;
        // SAFETY: the eventfd, open until this thread was joined.
        unsafe { libc::write(fd, (&raw const one).cast(), 8) };
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
