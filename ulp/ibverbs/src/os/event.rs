//! Event sources and `errno`, for both libraries: `ulp/ibverbs` and
//! `ulp/rdmacm` each include this file in their platform module (`os`).
//!
//! A [`Signal`] is what rdma-core's structures call an event file
//! descriptor ([`Fd`], an `int`): off Windows an eventfd in semaphore
//! mode, one count per queued event, so that it works with `poll`, `epoll`
//! and `O_NONBLOCK` as the kernel's event files do; on Windows a
//! manual-reset event HANDLE, signaled while events are queued, for
//! `WaitForSingleObject` / `WaitForMultipleObjects` (waiting on it takes
//! no event; taking the last one resets it). The `int` holds the HANDLE
//! ([`handle_fd`]): 64-bit Windows keeps handles to 32 significant bits
//! so that they can be truncated and sign-extended (as between 32- and
//! 64-bit processes), and a program gets it back with
//! `(HANDLE)(intptr_t)fd`. rdma-core's structures keep their layout.
//!
//! The queue's owner calls [`Signal::post`] after queueing an event,
//! [`Signal::wait`] before taking one and [`Signal::taken`] after (or
//! [`Signal::dropped`] for an event it drops), each under the queue's lock
//! except `wait`.

pub use imp::*;

#[cfg(not(windows))]
mod imp {
    use std::ffi::c_int;

    /// What rdma-core's structures call a file descriptor: one.
    pub type Fd = c_int;

    /// Sets `errno`.
    pub fn set_errno(e: c_int) {
        // SAFETY: the calling thread's errno.
        unsafe { *libc::__errno_location() = e };
    }

    /// `errno`.
    #[must_use]
    pub fn errno() -> c_int {
        // SAFETY: the calling thread's errno.
        unsafe { *libc::__errno_location() }
    }

    /// An event source programs wait on: an eventfd in semaphore mode, one
    /// count per queued event, so that it works with `poll`, `epoll` and
    /// `O_NONBLOCK` as the kernel's uverbs event files do.
    pub struct Signal(c_int);

    impl Signal {
        /// A new source with nothing signaled.
        ///
        /// # Errors
        /// `EMFILE` without an eventfd.
        pub fn new() -> Result<Self, c_int> {
            // SAFETY: no arguments but flags.
            let fd = unsafe { libc::eventfd(0, libc::EFD_SEMAPHORE | libc::EFD_CLOEXEC) };
            if fd < 0 {
                return Err(libc::EMFILE);
            }
            Ok(Self(fd))
        }

        /// What the C structure shows the program.
        #[must_use]
        pub fn raw(&self) -> Fd {
            self.0
        }

        /// One event more was queued (called under the queue's lock).
        pub fn post(&self) {
            let one = 1u64;
            // SAFETY: the eventfd, open while `self` lives; 8 bytes.
            unsafe { libc::write(self.0, (&raw const one).cast(), 8) };
        }

        /// Waits for an event and takes its count (or `EAGAIN` at once when
        /// the program made the fd non-blocking).
        ///
        /// # Errors
        /// The errno of reading the fd.
        pub fn wait(&self) -> Result<(), c_int> {
            let mut count = 0u64;
            // SAFETY: the eventfd; 8 bytes.
            if unsafe { libc::read(self.0, (&raw mut count).cast(), 8) } != 8 {
                return Err(errno());
            }
            Ok(())
        }

        /// An event was taken off the queue (under its lock) after
        /// [`Signal::wait`]: its count is gone already.
        pub fn taken(&self, _now_empty: bool) {}

        /// A queued event was dropped (under the queue's lock): takes its
        /// count, without blocking.
        pub fn dropped(&self, _now_empty: bool) {
            let mut p = libc::pollfd {
                fd: self.0,
                events: libc::POLLIN,
                revents: 0,
            };
            let mut count = 0u64;
            // SAFETY: one pollfd.
            if unsafe { libc::poll(&mut p, 1, 0) } == 1 {
                // SAFETY: the eventfd, readable (so the read does not block);
                // 8 bytes.
                unsafe { libc::read(self.0, (&raw mut count).cast(), 8) };
            }
        }

        /// Closes the fd.
        pub fn close(self) {
            // SAFETY: the eventfd, closed once.
            unsafe { libc::close(self.0) };
        }
    }
}

#[cfg(windows)]
mod imp {
    #![allow(non_snake_case)]

    use std::ffi::{c_int, c_void};

    /// What rdma-core's structures call a file descriptor: an `int`
    /// holding a HANDLE on Windows ([`handle_fd`]).
    pub type Fd = c_int;

    /// A HANDLE.
    type Handle = *mut c_void;

    /// The `int` rdma-core's structures hold for the HANDLE `h`: its low
    /// 32 bits, all that 64-bit Windows gives a handle (a program
    /// sign-extends it back: `(HANDLE)(intptr_t)fd`).
    #[must_use]
    pub fn handle_fd(h: Handle) -> Fd {
        h as isize as Fd
    }

    #[link(name = "kernel32")]
    unsafe extern "system" {
        fn CreateEventW(
            lpEventAttributes: *mut c_void,
            bManualReset: i32,
            bInitialState: i32,
            lpName: *const u16,
        ) -> Handle;
        fn SetEvent(hEvent: Handle) -> i32;
        fn ResetEvent(hEvent: Handle) -> i32;
        fn WaitForSingleObject(hHandle: Handle, dwMilliseconds: u32) -> u32;
        fn CloseHandle(hObject: Handle) -> i32;
    }

    unsafe extern "C" {
        /// The C runtime's `errno` of the calling thread (`<errno.h>`).
        fn _errno() -> *mut c_int;
    }

    const INFINITE: u32 = u32::MAX;
    const WAIT_OBJECT_0: u32 = 0;

    /// Sets `errno`.
    pub fn set_errno(e: c_int) {
        // SAFETY: the calling thread's errno, which the CRT keeps per thread.
        unsafe { *_errno() = e };
    }

    /// `errno`.
    #[must_use]
    pub fn errno() -> c_int {
        // SAFETY: as in `set_errno`.
        unsafe { *_errno() }
    }

    /// An event source programs wait on: a manual-reset event, signaled while
    /// events are queued (`WaitForSingleObject` on it does not take one;
    /// taking the last one resets it).
    pub struct Signal(Handle);

    // SAFETY: an event HANDLE is usable from any thread.
    unsafe impl Send for Signal {}
    // SAFETY: as above; every operation on it is a kernel32 call.
    unsafe impl Sync for Signal {}

    impl Signal {
        /// A new source with nothing signaled.
        ///
        /// # Errors
        /// `ENOMEM` without an event.
        pub fn new() -> Result<Self, c_int> {
            // SAFETY: no name, no security attributes.
            let h = unsafe { CreateEventW(std::ptr::null_mut(), 1, 0, std::ptr::null()) };
            if h.is_null() {
                return Err(libc::ENOMEM);
            }
            Ok(Self(h))
        }

        /// What the C structure shows the program.
        #[must_use]
        pub fn raw(&self) -> Fd {
            handle_fd(self.0)
        }

        /// One event more was queued (called under the queue's lock).
        pub fn post(&self) {
            // SAFETY: the event, open while `self` lives.
            unsafe { SetEvent(self.0) };
        }

        /// Waits until an event is queued (taking none: the caller takes it
        /// off the queue, then calls [`Signal::taken`]).
        ///
        /// # Errors
        /// `EIO` when the wait fails.
        pub fn wait(&self) -> Result<(), c_int> {
            // SAFETY: the event, open while `self` lives.
            if unsafe { WaitForSingleObject(self.0, INFINITE) } != WAIT_OBJECT_0 {
                return Err(libc::EIO);
            }
            Ok(())
        }

        /// An event was taken off the queue (under its lock): with none left
        /// the event is reset.
        pub fn taken(&self, now_empty: bool) {
            if now_empty {
                // SAFETY: the event, open while `self` lives.
                unsafe { ResetEvent(self.0) };
            }
        }

        /// A queued event was dropped (under the queue's lock): as taken.
        pub fn dropped(&self, now_empty: bool) {
            self.taken(now_empty);
        }

        /// Closes the event.
        pub fn close(self) {
            // SAFETY: the event, closed once.
            unsafe { CloseHandle(self.0) };
        }
    }
}
