//! Event channels: `rdma_create_event_channel`,
//! `rdma_destroy_event_channel`. A channel's `fd` is an eventfd in
//! semaphore mode that counts the queued events (so `poll`, `epoll` and
//! `O_NONBLOCK` work on it); taking an event takes one count.

use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::abi::*;
use crate::id::Id;
use crate::os::Signal;
use crate::set_errno;

/// An event as the library allocates it: the `rdma_cm_event` programs
/// see, the id it is counted on, and the private data it points to.
#[repr(C)]
pub(crate) struct Event {
    pub ev: rdma_cm_event,
    /// The id the event is counted on until acknowledged (a connect
    /// request's listener, else the event's id).
    pub owner: *mut Id,
    /// The private data `ev.param` points to.
    pub pdata: Vec<u8>,
}

impl Event {
    /// An event of `kind` with `status` on `id`, with no parameters.
    pub fn new(id: *mut Id, kind: c_int, status: c_int) -> Box<Self> {
        Box::new(Event {
            ev: rdma_cm_event {
                id: id.cast(),
                listen_id: std::ptr::null_mut(),
                event: kind,
                status,
                param: rdma_cm_event_param {
                    conn: rdma_conn_param {
                        private_data: std::ptr::null(),
                        private_data_len: 0,
                        responder_resources: 0,
                        initiator_depth: 0,
                        flow_control: 0,
                        retry_count: 0,
                        rnr_retry_count: 0,
                        srq: 0,
                        qp_num: 0,
                    },
                },
            },
            owner: id,
            pdata: Vec::new(),
        })
    }

    /// Sets the private data (the pointer in the parameters follows the
    /// boxed bytes, which do not move).
    pub fn with_pdata(mut self: Box<Self>, pdata: &[u8]) -> Box<Self> {
        self.pdata = pdata.to_vec();
        let p = if self.pdata.is_empty() {
            std::ptr::null()
        } else {
            self.pdata.as_ptr().cast::<c_void>()
        };
        let n = self.pdata.len().min(255) as u8;
        // Both parameter forms start with the private data's pointer and
        // length; writing through `conn` covers `ud`'s too.
        self.ev.param.conn.private_data = p;
        self.ev.param.conn.private_data_len = n;
        self
    }
}

/// A boxed event crossing threads.
pub(crate) struct Queued(pub Box<Event>);
// SAFETY: the raw pointers in an event name ids that outlive their queued
// events (destroying an id drops them first).
unsafe impl Send for Queued {}

/// An event channel: the C struct first.
#[repr(C)]
pub(crate) struct Channel {
    pub ch: rdma_event_channel,
    signal: Signal,
    queue: Mutex<VecDeque<Queued>>,
    /// The private channel of a synchronous id (one made without a
    /// channel): destroyed with it.
    pub sync: bool,
}

impl Channel {
    /// A new channel with its event source (an eventfd; on Windows an
    /// event HANDLE).
    ///
    /// # Errors
    /// The errno of making the event source.
    pub fn new(sync: bool) -> Result<*mut Channel, c_int> {
        let signal = Signal::new()?;
        Ok(Box::into_raw(Box::new(Channel {
            ch: rdma_event_channel { fd: signal.raw() },
            signal,
            queue: Mutex::new(VecDeque::new()),
            sync,
        })))
    }

    fn queue(&self) -> MutexGuard<'_, VecDeque<Queued>> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `ev` and signals it.
    pub fn push(&self, ev: Box<Event>) {
        let mut q = self.queue();
        q.push_back(Queued(ev));
        self.signal.post();
    }

    /// The next event: waits while there is none, unless the fd is
    /// non-blocking (then `EAGAIN`).
    ///
    /// # Errors
    /// The errno of reading the fd.
    pub fn take(&self) -> Result<Box<Event>, c_int> {
        loop {
            self.signal.wait()?;
            let mut q = self.queue();
            if let Some(Queued(e)) = q.pop_front() {
                self.signal.taken(q.is_empty());
                return Ok(e);
            }
        }
    }

    /// Removes the queued events `of` picks (and their counts).
    #[allow(
        clippy::vec_box,
        reason = "an event's address is what the program holds; boxes move between channels"
    )]
    pub fn drop_where(&self, of: impl Fn(&Event) -> bool) -> Vec<Box<Event>> {
        let mut q = self.queue();
        let mut dropped = Vec::new();
        let mut kept = VecDeque::new();
        for Queued(e) in q.drain(..) {
            if of(&e) {
                dropped.push(e);
            } else {
                kept.push_back(Queued(e));
            }
        }
        *q = kept;
        for _ in &dropped {
            self.signal.dropped(q.is_empty());
        }
        dropped
    }

    /// Closes the fd and frees the channel.
    ///
    /// # Safety
    /// `ch` came from [`Channel::new`] and no id uses it.
    pub unsafe fn destroy(ch: *mut Channel) {
        // SAFETY: from Channel::new, not used any more (caller).
        let c = unsafe { Box::from_raw(ch) };
        c.signal.close();
    }
}

/// `rdma_create_event_channel`: NULL with `errno` on failure.
#[unsafe(no_mangle)]
pub extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    if let Err(e) = crate::device::device() {
        set_errno(e);
        return std::ptr::null_mut();
    }
    match Channel::new(false) {
        Ok(c) => c.cast(),
        Err(e) => {
            set_errno(e);
            std::ptr::null_mut()
        }
    }
}

/// `rdma_destroy_event_channel`: the channel must have no ids (as
/// rdma-core requires); NULL is ignored.
///
/// # Safety
/// `channel` is NULL or from `rdma_create_event_channel`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    if channel.is_null() {
        return;
    }
    // Events still queued (of ids already destroyed there are none) go
    // with it.
    // SAFETY: a channel of this library (caller), not used any more.
    let c = unsafe { &*channel.cast::<Channel>() };
    drop(c.drop_where(|_| true));
    // SAFETY: as above.
    unsafe { Channel::destroy(channel.cast()) };
}
