//! The device: files, the IOCTL dispatcher, pending commands and the DPC
//! that completes them.
//!
//! # Execution model
//! - [`Device::dispatch_ioctl`] is the I/O queue callback; it runs at
//!   DISPATCH_LEVEL, validates the request, posts a command to the HCA and
//!   returns with the request pending (or completes it at once when it fails
//!   validation, or needs no command).
//! - [`Device::dpc`] is the HCA interrupt's DPC; it drains the HCA's event
//!   queue, applies each command's result and completes its request.
//! - [`Device::create_file`], [`Device::cleanup_file`] and
//!   [`Device::close_file`] are the file object callbacks (PASSIVE_LEVEL, but
//!   they neither block nor wait: cleanup starts an asynchronous rundown).
//!
//! One spin lock (rank [`crate::platform::DEVICE_LOCK`]) guards all control
//! state. Requests are completed outside it.

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use irpverbs_abi::*;
use zerocopy::IntoBytes;

use crate::fallible::{SlabMap, VecMap, reserve_total};
use crate::handle::HandleTable;
use crate::hca::{Command, CommandOut, Event, Hca};
use crate::maps::Maps;
use crate::object::{Body, Kind, Life, Object};
use crate::platform::{
    CEP_CALLBACK_LOCK, DEVICE_LOCK, FileKey, MAP_LOCK, Platform, PoolCharge, ProcessKey, Request,
    RequestorMode, SpinLock, pool_tag,
};
use crate::verbs::{Op, Verb};

/// Driver version reported by `IOCTL_IV_GET_VERSION` (major.minor).
pub const DRIVER_VERSION: u32 = 0x0001_0000;

/// What a request's completion reports as written to its output buffer.
///
/// A verb writes its output struct into the request's output where it
/// makes it ([`Response::write`]), so that what moves with a request to its
/// completion (through arrays and the deferred queue) stays two words.
#[derive(Debug)]
pub(crate) enum Response {
    /// No output.
    None,
    /// The output was written already (`Response::write`): this many
    /// bytes.
    Written(usize),
    /// The output buffer could not take the response.
    TooSmall,
}

impl Response {
    /// Writes a verb's output into the request's output buffer now, with a
    /// response that completes it with those bytes (`TooSmall` if the
    /// output cannot take them).
    pub(crate) fn write<R: Request>(request: &mut R, bytes: &[u8]) -> Response {
        match request.output().get_mut(..bytes.len()) {
            Some(dst) => {
                dst.copy_from_slice(bytes);
                Response::Written(bytes.len())
            }
            None => Response::TooSmall,
        }
    }
}

pub(crate) struct Pending<R> {
    pub file: FileKey,
    pub request: Option<R>,
    pub op: Op,
}

pub(crate) struct FileState {
    pub objects: HandleTable,
    pub cleaning_up: bool,
    /// The process that opened the file exited ([`Device::owner_exited`]):
    /// the file is run down and every request fails with
    /// `STATUS_PROCESS_IS_TERMINATING`.
    pub owner_exited: bool,
    pub closed: bool,
    /// Commands in flight on this file's objects.
    pub inflight: usize,
    pub charge: Option<PoolCharge>,
    /// Async events not yet taken.
    pub async_events: alloc::collections::VecDeque<crate::notify::AsyncRecord>,
    /// Pending `GET_ASYNC_EVENT` waits.
    pub async_waits: alloc::collections::VecDeque<u64>,
    /// The file's doorbell page, allocated by its first
    /// `IOCTL_IV_MAP_DOORBELLS` and freed with the file.
    pub doorbell_page: Option<crate::hca::DoorbellPageInfo>,
    /// What the file holds against its quota ([`crate::quota`]).
    pub usage: crate::quota::Usage,
}

/// The device's configuration: what a driver reads from its registry
/// parameters at device add.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceConfig {
    /// The limits each file (open of the device) is held to.
    pub quota: crate::quota::FileQuota,
}

/// Counters for tools and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// Commands posted to the HCA.
    pub commands_posted: u64,
    /// Commands that had to wait because the HCA's command queue was full.
    pub commands_backlogged: u64,
    /// CEP events dropped past the room their CEP took when it was made
    /// (an owner that does not poll).
    pub cep_events_dropped: u64,
    /// Events with a token that names no pending command (ignored).
    pub stray_events: u64,
    /// Rundown destroys the HCA refused (the object was dropped anyway).
    pub rundown_failures: u64,
    /// Requests completed.
    pub requests_completed: u64,
    /// Cancel routine calls for requests that are not cancelable.
    pub cancels_ignored: u64,
    /// Requests completed by their cancel routine.
    pub cancelled: u64,
    /// CQ events delivered (notify waits and channels).
    pub cq_events: u64,
    /// Async events received from the HCA.
    pub async_events: u64,
    /// Async events dropped because a file queued too many (or had no
    /// memory to queue more).
    pub async_events_dropped: u64,
    /// CQ events a completion channel had no memory to queue (dropped,
    /// as a CQ event past the room its channel took at creation).
    pub cq_events_dropped: u64,
    /// MADs taken from the HCA's general services interface.
    pub mads_received: u64,
    /// Received MADs the connection manager refused to parse.
    pub cm_mads_malformed: u64,
    /// MADs of the connection manager the HCA refused to send.
    pub cm_send_failures: u64,
    /// Scans of a cleaned-up file's objects for ones the rundown can
    /// destroy: one per level of the object tree (and per batch of user
    /// commands that were in flight), not one per destroyed object.
    pub rundown_scans: u64,
}

/// A snapshot of what the device holds, for tests and the leak check.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceSnapshot {
    /// Open (or not yet run down) files.
    pub files: usize,
    /// Live objects of each kind, indexed by `Kind as usize - 1`.
    pub objects: [u32; 9],
    /// Pended (cancelable) requests.
    pub waits: usize,
    /// Commands in flight or backlogged (a backlogged command is pending
    /// too, so it counts once).
    pub pending_commands: usize,
    /// Rings mapped into user processes.
    pub user_mappings: usize,
}

pub(crate) struct State<R> {
    pub files: VecMap<FileKey, FileState>,
    pending: Vec<(u32, Option<Pending<R>>)>,
    pending_free: Vec<u32>,
    pending_len: usize,
    backlog: VecDeque<(u64, Command)>,
    next_generation: u32,
    pub counts: [u32; 9],
    /// The per-file limits.
    pub quota: crate::quota::FileQuota,
    pub removed: bool,
    pub stats: DeviceStats,
    /// Pended requests by cancel key.
    pub waits: SlabMap<u64, crate::notify::Wait<R>>,
    pub next_wait: u64,
    /// Requests to complete once the lock is released.
    /// Room for every request the device holds (taken as each is
    /// pended or started): completing one never allocates. Drained one at
    /// a time by [`Device::complete_all`].
    pub deferred: VecDeque<Deferred<R>>,
    /// CQ, QP and SRQ numbers to (file, index), for events.
    /// Room for every CQ, QP and SRQ (taken when each is created), so
    /// that recording one when its create completes never allocates.
    pub by_number: VecMap<(u8, u32), (FileKey, u32)>,
    /// The connection manager.
    pub(crate) cm: crate::cm::Cm,
    /// CEP objects by their engine ID.
    pub(crate) ceps: VecMap<irpverbs_cm::CepId, (FileKey, u32)>,
    /// Multi-phase CM requests in progress, by CEP.
    pub(crate) cm_ops: SlabMap<irpverbs_cm::CepId, crate::cm::Parked>,
    /// CEP callbacks to call once the lock is released.
    pub(crate) cep_calls: VecDeque<crate::cm::CepReady>,
    /// The CEP whose callback is running, if one is.
    pub(crate) cep_running: Option<(FileKey, IvHandle)>,
}

impl<R> State<R> {
    pub(crate) fn generation(&mut self) -> u32 {
        self.next_generation = self.next_generation.wrapping_add(1);
        if self.next_generation == 0 {
            self.next_generation = 1;
        }
        self.next_generation
    }

    /// Makes room for `more` commands beyond those in flight now, so that
    /// posting, backlogging and retiring them never allocates.
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES` when refused (nothing changes that
    /// matters: only capacity grows).
    pub(crate) fn reserve_commands(&mut self, more: usize) -> Result<(), NtStatus> {
        let spare = self.pending_free.len() + (self.pending.capacity() - self.pending.len());
        if spare < more {
            self.pending
                .try_reserve(more - spare)
                .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        }
        reserve_total(&mut self.pending_free, self.pending.capacity())?;
        let backlog = self.pending.capacity().saturating_sub(self.backlog.len());
        self.backlog
            .try_reserve(backlog)
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        self.reserve_deferred()
    }

    /// Room in [`State::deferred`] for every request the device may hold:
    /// the pended waits, the CM's multi-phase requests and the commands
    /// in flight, plus those about to be added.
    /// Queues `request` to complete, with `status` and `response`, by
    /// whoever next completes what the lock collected.
    pub(crate) fn defer(&mut self, request: R, status: NtStatus, response: Response) {
        self.deferred.push_back(Deferred {
            done: (request, status, response),
            vector: None,
        });
    }

    /// [`State::defer`] for completion vector `vector`'s DPC only.
    pub(crate) fn defer_on(
        &mut self,
        vector: Option<u32>,
        request: R,
        status: NtStatus,
        response: Response,
    ) {
        self.deferred.push_back(Deferred {
            done: (request, status, response),
            vector,
        });
    }

    pub(crate) fn reserve_deferred(&mut self) -> Result<(), NtStatus> {
        let total =
            self.waits.len() + self.cm_ops.len() + self.pending_len + 2 * COMMANDS_PER_REQUEST;
        let more = total.saturating_sub(self.deferred.len());
        self.deferred
            .try_reserve(more)
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)
    }

    /// Objects of every kind on the device.
    pub(crate) fn objects(&self) -> usize {
        self.counts.iter().map(|&n| n as usize).sum()
    }

    /// Room for a command per object (its destroy, at rundown) and
    /// [`COMMANDS_PER_REQUEST`] for the request being started.
    pub(crate) fn reserve_request_commands(&mut self) -> Result<(), NtStatus> {
        self.reserve_commands(self.objects() + COMMANDS_PER_REQUEST)
    }

    /// Posts within the room [`reserve_commands`](Self::reserve_commands)
    /// made (a slot is reused, or the vector has the capacity).
    fn add_pending(&mut self, p: Pending<R>) -> u64 {
        let idx = if let Some(i) = self.pending_free.pop() {
            i
        } else {
            self.pending.push((0, None));
            (self.pending.len() - 1) as u32
        };
        let slot = &mut self.pending[idx as usize];
        slot.0 = slot.0.wrapping_add(1);
        slot.1 = Some(p);
        self.pending_len += 1;
        (u64::from(slot.0) << 32) | u64::from(idx)
    }

    fn take_pending(&mut self, token: u64) -> Option<Pending<R>> {
        let idx = (token & 0xFFFF_FFFF) as usize;
        let seq = (token >> 32) as u32;
        let slot = self.pending.get_mut(idx)?;
        if slot.0 != seq {
            return None;
        }
        let p = slot.1.take()?;
        self.pending_free.push(idx as u32);
        self.pending_len -= 1;
        Some(p)
    }

    /// Starts a query of the object `handle` names (a QP or SRQ): counts it
    /// in flight (queries overlap; a destroy waits for them) and returns the
    /// object's index and HCA number.
    pub(crate) fn begin_query(
        &mut self,
        file: FileKey,
        handle: IvHandle,
        kind: Kind,
    ) -> Result<(u32, u32), NtStatus> {
        let f = self.file(file)?;
        let idx = f.objects.lookup(handle, kind)?;
        let o = f.objects.get_mut(idx);
        let (_, number) = o.number_key().ok_or(STATUS_INVALID_HANDLE)?;
        o.queries += 1;
        Ok((idx, number))
    }

    /// Ends a query started with [`State::begin_query`]; the object, if its
    /// file still exists.
    pub(crate) fn end_query(&mut self, file: FileKey, idx: u32) -> Option<&mut Object> {
        let o = self.files.get_mut(&file)?.objects.get_mut(idx);
        o.queries = o.queries.saturating_sub(1);
        Some(o)
    }

    pub(crate) fn file(&mut self, file: FileKey) -> Result<&mut FileState, NtStatus> {
        match self.files.get_mut(&file) {
            Some(f) if f.owner_exited => Err(STATUS_PROCESS_IS_TERMINATING),
            Some(f) if f.cleaning_up => Err(STATUS_DELETE_PENDING),
            Some(f) => Ok(f),
            None => Err(STATUS_INVALID_HANDLE),
        }
    }
}

/// The irpverbs device, generic over the OS and the hardware.
pub struct Device<P: Platform, H: Hca> {
    pub(crate) platform: P,
    pub(crate) hca: H,
    pub(crate) state: P::Lock<State<P::Request>>,
    /// User mappings of rings, by file (see [`crate::maps`]).
    pub(crate) maps: P::Lock<Maps<P::Mapping>>,
    /// A ring was ever mapped into a process: until then a request has no
    /// mapping to sweep and skips the maps' lock.
    pub(crate) any_mapped: core::sync::atomic::AtomicBool,
    /// `State::cep_calls` is not empty.
    pub(crate) cep_calls_pending: core::sync::atomic::AtomicBool,
    /// A caller runs the CEP callbacks (see `Device::run_cep_callbacks`).
    pub(crate) cep_draining: core::sync::atomic::AtomicBool,
    /// Held while CEP callbacks run: they run at DISPATCH_LEVEL.
    pub(crate) cep_gate: P::Lock<()>,
}

impl<P: Platform, H: Hca> core::fmt::Debug for Device<P, H> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Device").finish_non_exhaustive()
    }
}

const FILE_TAG: u32 = pool_tag(b"IvFl");

/// The seed of the CM's communication IDs: the clock at load, so that IDs
/// differ from the last run's.
fn cm_seed<P: Platform>(platform: &P) -> u32 {
    let t = platform.now_ns();
    (t ^ (t >> 32)) as u32
}

/// The first file after `after` (the first of all for `None`), in key
/// order: a walk over the files that lets go of the device lock between
/// steps, without a list of them.
fn next_file<R>(s: &State<R>, after: Option<FileKey>) -> Option<FileKey> {
    s.files
        .keys()
        .copied()
        .find(|&k| after.is_none_or(|a| k > a))
}

/// Requests completed under the device lock wait in [`State::deferred`]
/// for [`Device::complete_all`].
pub(crate) struct Drain;

/// A request waiting in [`State::deferred`] to be completed once the lock
/// is released, with the completion vector whose DPC must complete it:
/// a CQ's notify completes on its vector's processor, never on another
/// DPC that happened to drain the queue first.
pub(crate) struct Deferred<R> {
    pub done: crate::notify::Done<R>,
    /// `Some(v)`: only vector `v`'s DPC completes it.
    pub vector: Option<u32>,
}

/// Commands one request may have in flight at once (a multi-phase CM
/// request's QP modify and its GID query, say), reserved before it starts.
const COMMANDS_PER_REQUEST: usize = 2;

/// Event-queue entries the DPC takes per hold of the device lock.
const DPC_BATCH: usize = 4;

/// Runs `f` in a frame of its own. A verb's handlers are large and one
/// `match` calls each: inlined there, their locals would add up in one
/// frame of several KiB (the kernel stack is 24 KiB; docs/stack-budget.md
/// sets 2 KiB per frame). Out of line, each costs only its own frame.
/// For the control path: one call more per verb.
#[inline(never)]
pub(crate) fn own_frame<R>(f: impl FnOnce() -> R) -> R {
    f()
}

impl<P: Platform, H: Hca> Device<P, H> {
    /// Creates the device over `hca` (EvtDriverDeviceAdd / D0Entry), with
    /// the default configuration.
    ///
    /// IRQL: PASSIVE_LEVEL.
    pub fn new(platform: P, hca: H) -> Self {
        Self::with_config(platform, hca, DeviceConfig::default())
    }

    /// Creates the device over `hca` with `config` (the driver's registry
    /// parameters).
    ///
    /// IRQL: PASSIVE_LEVEL.
    // An entry of the stack budget (docs/stack-budget.md): kept out of
    // line so that the checker finds it by name.
    #[inline(never)]
    pub fn with_config(platform: P, hca: H, config: DeviceConfig) -> Self {
        let state = Self::new_state(&platform, &hca, config);
        let maps = platform.new_lock(&MAP_LOCK, Maps::new());
        let cep_gate = platform.new_lock(&CEP_CALLBACK_LOCK, ());
        hca.arm_event_queue();
        for vector in 0..hca.comp_event_queues() {
            hca.arm_comp_event_queue(vector);
        }
        Self {
            platform,
            hca,
            state,
            maps,
            any_mapped: core::sync::atomic::AtomicBool::new(false),
            cep_calls_pending: core::sync::atomic::AtomicBool::new(false),
            cep_draining: core::sync::atomic::AtomicBool::new(false),
            cep_gate,
        }
    }

    /// The device's state, in its lock. Out of line: the state (1 KiB)
    /// is built in a frame of its own, not beside the device it goes
    /// into (docs/stack-budget.md).
    #[inline(never)]
    fn new_state(platform: &P, hca: &H, config: DeviceConfig) -> P::Lock<State<P::Request>> {
        platform.new_lock(
            &DEVICE_LOCK,
            State {
                files: VecMap::new(),
                pending: Vec::new(),
                pending_free: Vec::new(),
                pending_len: 0,
                backlog: VecDeque::new(),
                next_generation: 0,
                counts: [0; 9],
                quota: config.quota,
                removed: false,
                stats: DeviceStats::default(),
                waits: SlabMap::new(),
                next_wait: 0,
                deferred: VecDeque::new(),
                by_number: VecMap::new(),
                ceps: VecMap::new(),
                cm_ops: SlabMap::new(),
                cep_calls: VecDeque::new(),
                cep_running: None,
                cm: crate::cm::Cm::new(hca.caps().node_guid, cm_seed(platform)),
            },
        )
    }

    /// The HCA.
    pub fn hca(&self) -> &H {
        &self.hca
    }

    /// The platform.
    pub fn platform(&self) -> &P {
        &self.platform
    }

    /// Counters.
    pub fn stats(&self) -> DeviceStats {
        self.state.lock(|s| s.stats)
    }

    /// What the device holds now.
    pub fn snapshot(&self) -> DeviceSnapshot {
        let user_mappings = self.mapping_count();
        self.state.lock(|s| DeviceSnapshot {
            files: s.files.len(),
            objects: s.counts,
            pending_commands: s.pending_len,
            waits: s.waits.len(),
            user_mappings,
        })
    }

    // ------------------------------------------------------------- files

    /// A file was opened (EvtDeviceFileCreate). `owner` is the process
    /// that opened it, for a user-mode open (`None` for a kernel-mode
    /// one): the only process whose user memory the file's requests may
    /// pin or map into (see [`crate::maps`]), and the one whose exit runs
    /// the file down ([`Device::owner_exited`]).
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    ///
    /// # Errors
    /// `STATUS_DEVICE_REMOVED` after removal; `STATUS_INSUFFICIENT_RESOURCES`
    /// when pool is refused; `STATUS_INVALID_PARAMETER` for a key in use.
    pub fn create_file(&self, file: FileKey, owner: Option<ProcessKey>) -> Result<(), NtStatus> {
        let charge = self
            .platform
            .pool_charge(FILE_TAG, size_of::<FileState>())?;
        // The file's entry in the mapping table, taken now so that its
        // cleanup never needs memory (the mapping lock before the device's).
        let mapped = self.maps.lock(|maps| {
            if maps.contains_key(&file) {
                return Ok(false);
            }
            maps.try_insert(file, crate::maps::FileMaps::new(owner))
                .map(|_| true)
                .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)
        });
        let new_maps = match mapped {
            Ok(inserted) => inserted,
            Err(st) => {
                self.platform.pool_release(charge);
                return Err(st);
            }
        };
        let refused = self.state.lock(|s| {
            if s.removed {
                return Some((charge, STATUS_DEVICE_REMOVED));
            }
            if s.files.contains_key(&file) {
                return Some((charge, STATUS_INVALID_PARAMETER));
            }
            let async_events = match crate::notify::new_queue() {
                Ok(q) => q,
                Err(st) => return Some((charge, st)),
            };
            let inserted = s.files.try_insert(
                file,
                FileState {
                    objects: HandleTable::new(),
                    cleaning_up: false,
                    owner_exited: false,
                    closed: false,
                    inflight: 0,
                    charge: Some(charge),
                    async_events,
                    async_waits: alloc::collections::VecDeque::new(),
                    doorbell_page: None,
                    usage: crate::quota::Usage::default(),
                },
            );
            match inserted {
                Ok(_) => None,
                Err((_, f)) => f.charge.map(|c| (c, STATUS_INSUFFICIENT_RESOURCES)),
            }
        });
        match refused {
            Some((charge, status)) => {
                if new_maps {
                    self.maps.lock(|maps| maps.remove(&file));
                }
                self.platform.pool_release(charge);
                Err(status)
            }
            None => Ok(()),
        }
    }

    /// The last handle to a file was closed (EvtFileCleanup): no new verbs
    /// are accepted on it (`STATUS_DELETE_PENDING`), and its objects are
    /// destroyed children first, asynchronously. Requests already pending
    /// complete as their commands do. Every ring mapped into the file's
    /// process is unmapped now (the rings themselves live on with their
    /// objects until the rundown destroys them).
    ///
    /// IRQL: PASSIVE_LEVEL, in the process closing the file (on Windows the
    /// file's own process, or the one it was handed to), when rings are
    /// mapped; <= DISPATCH_LEVEL otherwise. Never blocks.
    pub fn cleanup_file(&self, file: FileKey) {
        self.begin_rundown(file, false);
    }

    /// Starts (or advances) `file`'s rundown: its cleanup, or its opener's
    /// exit (`exited`, which does nothing to a file already run down).
    fn begin_rundown(&self, file: FileKey, exited: bool) {
        let (charge, deferred, cm) = self.state.lock(|s| {
            let known = match s.files.get_mut(&file) {
                Some(f) if exited && f.cleaning_up => None,
                Some(f) => {
                    f.cleaning_up = true;
                    f.owner_exited |= exited;
                    Some(())
                }
                None => None,
            };
            let status = if exited {
                STATUS_PROCESS_IS_TERMINATING
            } else {
                STATUS_CANCELLED
            };
            if known.is_some() || !exited {
                crate::notify::fail_file_waits(s, file, status);
            }
            let charge = known.and_then(|()| self.advance_rundown(s, file));
            // The REJs and DREQs of the CEPs the rundown destroyed.
            (charge, crate::device::Drain, s.cm.take())
        });
        if let Some(c) = charge {
            self.platform.pool_release(c);
        }
        self.complete_all(deferred);
        self.cm_flush(cm);
        self.unmap_file(file, false);
    }

    /// The process that opened `file` is exiting while the file may stay
    /// open in another process (its handle inherited or duplicated): the
    /// platform's process-exit notification (Windows:
    /// `PsSetCreateProcessNotifyRoutineEx`, called with no create
    /// information), for each file that process opened.
    ///
    /// The file is run down as its cleanup would run it down, now, while
    /// the exiting process's address space is still there: every ring and
    /// the doorbell page are unmapped from it, requests waiting on the
    /// file complete with `STATUS_PROCESS_IS_TERMINATING`, and its objects
    /// are destroyed children first (QPs before the MRs they use), whose
    /// deregistrations release the pages its registrations locked (the
    /// platform waits for them, bounded, as after a cleanup: the process
    /// must not end with locked pages). From then on every request on the
    /// file, from whichever process still holds a handle, fails with
    /// `STATUS_PROCESS_IS_TERMINATING`; the cleanup and close of the last
    /// handle free what is left and touch no address space. A second call,
    /// or one after the file's cleanup, changes nothing.
    ///
    /// IRQL: PASSIVE_LEVEL, in the context of the exiting process (the
    /// notification runs in its last thread) or attached to it. Never
    /// blocks.
    pub fn owner_exited(&self, file: FileKey) {
        self.begin_rundown(file, true);
    }

    /// The file object is going away (EvtFileClose). Its state is freed as
    /// soon as its rundown finishes. A mapping still there (a platform that
    /// skipped the cleanup) is undone.
    ///
    /// IRQL: PASSIVE_LEVEL when rings are still mapped; <= DISPATCH_LEVEL
    /// otherwise.
    pub fn close_file(&self, file: FileKey) {
        self.unmap_file(file, true);
        let charge = self.state.lock(|s| {
            let f = s.files.get_mut(&file)?;
            f.cleaning_up = true;
            f.closed = true;
            self.advance_rundown(s, file)
        });
        if let Some(c) = charge {
            self.platform.pool_release(c);
        }
    }

    /// True once a cleaned-up file has no objects and no commands in flight.
    pub fn file_rundown_complete(&self, file: FileKey) -> bool {
        self.state.lock(|s| {
            s.files
                .get(&file)
                .is_none_or(|f| f.cleaning_up && f.objects.len() == 0 && f.inflight == 0)
        })
    }

    /// Destroys what can be destroyed now on a cleaned-up file (objects with
    /// no dependents and nothing in flight), and frees the file when it is
    /// empty and closed. Returns the file's pool charge when it was freed.
    fn advance_rundown(&self, s: &mut State<P::Request>, file: FileKey) -> Option<PoolCharge> {
        loop {
            let f = s.files.get_mut(&file)?;
            if !f.cleaning_up {
                return None;
            }
            if f.inflight > 0 {
                // The objects these commands touch (the destroys posted by
                // the last scan, or the owner's last requests) release
                // their parents as they complete; the completion that
                // leaves none in flight scans again. A scan per completion
                // would make closing a file of n objects O(n^2).
                break;
            }
            s.stats.rundown_scans += 1;
            // The objects ready (nothing depends on them, nothing in
            // flight), in index order, checked in place: no list to
            // allocate. One a destroy below makes ready is taken in this
            // scan if its index is higher, in the next one otherwise.
            let slots = u32::try_from(s.files.get(&file)?.objects.slots_len()).unwrap_or(u32::MAX);
            let mut destroyed = false;
            for idx in 0..slots {
                let f = s.files.get_mut(&file)?;
                // A window may be bound to an MR (the HCA refuses to
                // deregister it then): MRs go after the file's windows.
                let windows = f.usage.objects[Kind::Mw.index()];
                // Free, or freed meanwhile (a listener frees its unpolled
                // requests).
                let Some(o) = f.objects.try_get_mut(idx) else {
                    continue;
                };
                if o.life != Life::Live || o.busy || o.queries != 0 || o.dependents != 0 {
                    continue;
                }
                if windows != 0 && o.kind() == Kind::Mr {
                    continue;
                }
                destroyed = true;
                match o.destroy_command() {
                    Some(cmd) if !s.removed => {
                        o.life = Life::Destroying;
                        self.post(s, file, None, Op::Rundown(idx), cmd);
                    }
                    // The hardware is gone, or a software-only object.
                    _ => self.free_object(s, file, idx),
                }
            }
            if !destroyed {
                break;
            }
        }
        let f = s.files.get(&file)?;
        if f.closed && f.objects.len() == 0 && f.inflight == 0 {
            let f = s.files.remove(&file)?;
            if let Some(page) = f.doorbell_page {
                // Its slots ring nothing from now on; the memory goes when
                // the last holder lets go (the mapping was undone at the
                // file's cleanup).
                self.hca.free_doorbell_page(page.page);
            }
            return f.charge;
        }
        None
    }

    /// Removes an object, releases its pool and its parents' dependent counts.
    pub(crate) fn free_object(&self, s: &mut State<P::Request>, file: FileKey, idx: u32) {
        let Some(f) = s.files.get_mut(&file) else {
            return;
        };
        let o = f.objects.remove(idx);
        if let Body::Cep(c) = &o.body {
            self.cep_freed(s, c);
        }
        if let Some(key) = o.number_key() {
            if s.by_number.get(&key) == Some(&(file, idx)) {
                s.by_number.remove(&key);
            }
        }
        let Some(f) = s.files.get_mut(&file) else {
            return;
        };
        for p in o.parents().into_iter().flatten() {
            let parent = f.objects.get_mut(p);
            parent.dependents = parent.dependents.saturating_sub(1);
        }
        let kind = o.kind();
        let usage = &mut f.usage;
        usage.objects[kind.index()] = usage.objects[kind.index()].saturating_sub(1);
        usage.release(o.bytes);
        usage.release(o.resize_bytes.unwrap_or_default());
        s.counts[kind.index()] = s.counts[kind.index()].saturating_sub(1);
        if let Some(c) = o.charge {
            self.platform.pool_release(c);
        }
    }

    // ------------------------------------------------------------- dispatch

    /// The I/O queue callback for `IRP_MJ_DEVICE_CONTROL` and
    /// `IRP_MJ_INTERNAL_DEVICE_CONTROL`.
    ///
    /// IRQL: DISPATCH_LEVEL (a dispatch-level queue). Never blocks. The
    /// request is either completed before this returns (validation failure,
    /// or a verb that needs no command) or left pending until the command's
    /// completion reaches [`Device::dpc`].
    // An entry of the stack budget (docs/stack-budget.md): kept out of
    // line so that the checker finds it by name.
    #[inline(never)]
    pub fn dispatch_ioctl(&self, mut request: P::Request) {
        let min_out = ioctl_info(request.ioctl_code()).map_or(0, |i| i.output_len);
        if request.output().len() < min_out {
            return self.complete(request, STATUS_BUFFER_TOO_SMALL, &Response::None);
        }
        let mut verb = match crate::verbs::parse(&request) {
            Ok(v) => v,
            Err(status) => return self.complete(request, status, &Response::None),
        };
        let file = request.file();
        match &mut verb {
            Verb::GetVersion | Verb::QueryDevice => return self.answer(request, &verb),
            Verb::MapRings(_) => return self.map_rings(request, false),
            Verb::MapDoorbells => return self.map_doorbells(request, false),
            Verb::RingDoorbells => return self.ring_doorbells(request),
            Verb::RegMr(i, physical, pinned) => {
                match crate::verbs::mr::pinned_region(self, &mut request, i, *physical) {
                    Ok(region) => *pinned = region,
                    Err(status) => return self.complete(request, status, &Response::None),
                }
            }
            _ => {}
        }
        let mut cm_flush = None;
        let (outcome, deferred) = self.state.lock(|s| {
            let outcome = if s.removed
                && !matches!(verb, Verb::GetAsyncEvent | Verb::AckAsyncEvent(_))
            {
                if let Verb::Destroy(h, kind) = &verb {
                    match crate::verbs::destroy::destroy_removed(self, s, file, h.handle, *kind) {
                        Ok(()) => Err((request, STATUS_SUCCESS, Response::None)),
                        Err(st) => Err((request, st, Response::None)),
                    }
                } else {
                    Err((request, STATUS_DEVICE_REMOVED, Response::None))
                }
            } else if let Err(st) = s.reserve_request_commands() {
                Err((request, st, Response::None))
            } else if verb.is_cep() {
                let r = match verb {
                    Verb::Cm(op) => self.cm_request(s, file, op, request),
                    Verb::ListenAddr(i) => self.listen_addr(s, file, &i, request),
                    _ => self.cep_start(s, file, verb, request),
                }
                .map_or(Ok(()), Err);
                let flush = s.cm.take();
                cm_flush = Some(flush);
                r
            } else if verb.is_notification() {
                crate::notify::start(self, s, file, verb, request).map_or(Ok(()), Err)
            } else {
                self.start(s, file, verb, request).map_or(Ok(()), Err)
            };
            (outcome, crate::device::Drain)
        });
        if let Err((req, status, response)) = outcome {
            self.complete(req, status, &response);
        }
        self.complete_all(deferred);
        if let Some(flush) = cm_flush {
            self.cm_flush(flush);
        }
    }

    /// Completes the requests collected under the lock (in
    /// [`State::deferred`]), taking them one at a time: the queue keeps
    /// its room.
    pub(crate) fn complete_all(&self, drain: Drain) {
        self.complete_all_on(drain, None);
    }

    /// [`Device::complete_all`] in completion vector `vector`'s DPC: also
    /// completes the requests kept for that vector (and none kept for
    /// another).
    fn complete_all_on(&self, _: Drain, vector: Option<u32>) {
        let next = |s: &mut State<P::Request>| {
            let i = s
                .deferred
                .iter()
                .position(|d| d.vector.is_none() || d.vector == vector)?;
            s.deferred.remove(i)
        };
        while let Some(d) = self.state.lock(next) {
            let (r, status, response) = d.done;
            self.complete(r, status, &response);
        }
        self.run_cep_callbacks();
    }

    /// [`crate::verbs::parse`] for a verb the caller context handles: the
    /// output buffer's length is checked first.
    pub(crate) fn parse_request(&self, request: &mut P::Request) -> Result<Verb, NtStatus> {
        let min_out = ioctl_info(request.ioctl_code()).map_or(0, |i| i.output_len);
        if request.output().len() < min_out {
            return Err(STATUS_BUFFER_TOO_SMALL);
        }
        crate::verbs::parse(request)
    }

    /// Reserves a slot for an object whose create command is about to be
    /// posted: checks the device limit and the file's quota, charges pool,
    /// counts the parents' new dependent.
    pub(crate) fn reserve(
        &self,
        s: &mut State<P::Request>,
        file: FileKey,
        body: Body,
        limit: u32,
    ) -> Result<u32, NtStatus> {
        self.reserve_with(s, file, body, limit, crate::quota::Bytes::default())
    }

    /// [`Device::reserve`] for an object that holds `bytes` of ring or
    /// pinned memory against the file's quota.
    pub(crate) fn reserve_with(
        &self,
        s: &mut State<P::Request>,
        file: FileKey,
        body: Body,
        limit: u32,
        bytes: crate::quota::Bytes,
    ) -> Result<u32, NtStatus> {
        let probe = Object {
            life: Life::Creating,
            busy: false,
            queries: 0,
            dependents: 0,
            unacked_async: 0,
            doorbells: [None; 2],
            charge: None,
            bytes,
            resize_bytes: None,
            body,
        };
        let kind = probe.kind();
        if s.counts[kind.index()] >= limit {
            return Err(STATUS_INSUFFICIENT_RESOURCES);
        }
        let quota = s.quota;
        s.file(file)?.usage.check(&quota, kind, bytes)?;
        if matches!(kind, Kind::Cq | Kind::Qp | Kind::Srq) {
            let numbered = [Kind::Cq, Kind::Qp, Kind::Srq]
                .iter()
                .map(|k| s.counts[k.index()] as usize)
                .sum::<usize>();
            s.by_number.reserve_total(numbered + 1)?;
        }
        // A command slot for the object's destroy.
        s.reserve_commands(s.objects() + 1 + COMMANDS_PER_REQUEST)?;
        let charge = self.platform.pool_charge(kind.tag(), size_of::<Object>())?;
        let generation = s.generation();
        let f = s.file(file)?;
        let parents = probe.parents();
        let idx = match f.objects.insert(
            generation,
            Object {
                charge: Some(charge),
                ..probe
            },
        ) {
            Ok(i) => i,
            Err(rejected) => {
                if let Some(c) = rejected.charge {
                    self.platform.pool_release(c);
                }
                return Err(STATUS_INSUFFICIENT_RESOURCES);
            }
        };
        for p in parents.into_iter().flatten() {
            f.objects.get_mut(p).dependents += 1;
        }
        f.usage.objects[kind.index()] += 1;
        f.usage.add(bytes);
        s.counts[kind.index()] += 1;
        Ok(idx)
    }

    /// Posts a command (or backlogs it behind earlier ones).
    pub(crate) fn post(
        &self,
        s: &mut State<P::Request>,
        file: FileKey,
        request: Option<P::Request>,
        op: Op,
        cmd: Command,
    ) {
        if let Some(f) = s.files.get_mut(&file) {
            f.inflight += 1;
        }
        let token = s.add_pending(Pending { file, request, op });
        s.stats.commands_posted += 1;
        if !s.backlog.is_empty() {
            s.backlog.push_back((token, cmd));
            s.stats.commands_backlogged += 1;
            return;
        }
        if let Err(cmd) = self.hca.post_command(token, cmd) {
            s.backlog.push_back((token, cmd));
            s.stats.commands_backlogged += 1;
        }
    }

    // Out of line: its locals are not on the stack of the DPC's events
    // (docs/stack-budget.md).
    #[inline(never)]
    fn flush_backlog(&self, s: &mut State<P::Request>) {
        while let Some((token, cmd)) = s.backlog.pop_front() {
            if let Err(cmd) = self.hca.post_command(token, cmd) {
                s.backlog.push_front((token, cmd));
                break;
            }
        }
    }

    /// Completes the request with `status` and the bytes its output took
    /// (none on failure). A success with no output still needs the output
    /// buffer the IOCTL's response struct takes.
    pub(crate) fn complete(&self, mut request: P::Request, status: NtStatus, response: &Response) {
        if !nt_success(status) {
            return request.complete(status, 0);
        }
        match *response {
            Response::Written(n) => request.complete(status, n),
            Response::TooSmall => request.complete(STATUS_BUFFER_TOO_SMALL, 0),
            Response::None => {
                let min = ioctl_info(request.ioctl_code()).map_or(0, |i| i.output_len);
                if request.output().len() < min {
                    request.complete(STATUS_BUFFER_TOO_SMALL, 0);
                } else {
                    request.complete(status, 0);
                }
            }
        }
    }

    /// Posts the commands the HCA gave back (its command queue full, or
    /// its device out of D0) now, in order, as the DPC does after a
    /// completion; the rest stays in the backlog. A backend whose device
    /// comes back to D0 calls it (D0Entry), since no completion is due to
    /// post them.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    pub fn post_backlog(&self) {
        self.state.lock(|s| self.flush_backlog(s));
    }

    // ------------------------------------------------------------- DPC

    /// The HCA interrupt's DPC: drains the event queue, applies every
    /// command result, completes requests, posts backlogged commands, and
    /// re-arms the event queue.
    ///
    /// IRQL: DISPATCH_LEVEL.
    // An entry of the stack budget (docs/stack-budget.md): kept out of
    // line so that the checker finds it by name.
    #[inline(never)]
    pub fn dpc(&self) {
        self.drain(None, |out| self.hca.poll_events(out));
        self.hca.arm_event_queue();
    }

    /// Completion vector `vector`'s DPC (its interrupt's, an MSI-X message
    /// of its own on hardware): drains that vector's event queue — the
    /// completion events of the CQs created on it — delivers them, and
    /// re-arms it. Vectors' DPCs may run concurrently, on different
    /// processors, with each other and with [`Device::dpc`].
    ///
    /// IRQL: DISPATCH_LEVEL.
    // An entry of the stack budget (docs/stack-budget.md): kept out of
    // line so that the checker finds it by name.
    #[inline(never)]
    pub fn comp_dpc(&self, vector: u32) {
        self.drain(Some(vector), |out| self.hca.poll_comp_events(vector, out));
        self.hca.arm_comp_event_queue(vector);
    }

    /// Drains an event queue through `poll` (batches of [`DPC_BATCH`]):
    /// applies every event, completes requests, posts backlogged commands.
    /// `vector`: the completion vector whose queue it is; the requests its
    /// CQ events complete are completed here, not by another DPC.
    fn drain(&self, vector: Option<u32>, poll: impl Fn(&mut [Option<Event>]) -> usize) {
        let mut events: [Option<Event>; DPC_BATCH] = Default::default();
        loop {
            let n = poll(&mut events);
            if n == 0 {
                break;
            }
            let mut done: [Option<(P::Request, NtStatus, Response)>; DPC_BATCH] =
                Default::default();
            let deferred = self.state.lock(|s| {
                for (event, done) in events.iter_mut().zip(done.iter_mut()) {
                    if let Some(event) = event.take() {
                        *done = self.handle_event(s, event, vector);
                    }
                }
                self.flush_backlog(s);
                (crate::device::Drain, s.cm.take())
            });
            let (deferred, cm) = deferred;
            self.cm_flush(cm);
            for (req, status, response) in done.iter_mut().filter_map(Option::take) {
                self.complete(req, status, &response);
            }
            self.complete_all_on(deferred, vector);
            if n < DPC_BATCH {
                // The queue was empty; what arrived since, the caller's
                // arm reports with a new interrupt.
                break;
            }
        }
    }

    fn handle_event(
        &self,
        s: &mut State<P::Request>,
        event: Event,
        vector: Option<u32>,
    ) -> Option<(P::Request, NtStatus, Response)> {
        let (token, status, out) = match event {
            Event::CommandDone { token, status, out } => (token, status, out),
            Event::Completion { cqn } => {
                if let Some(&(file, idx)) = s.by_number.get(&(Kind::Cq as u8, cqn)) {
                    s.stats.cq_events += 1;
                    crate::notify::cq_event(s, file, idx, vector);
                }
                return None;
            }
            Event::Async(ev) => {
                s.stats.async_events += 1;
                self.async_event(s, ev);
                return None;
            }
            Event::Mad => {
                self.cm_receive(s);
                self.cep_deliver(s);
                return None;
            }
        };
        self.command_done(s, token, status, out)
    }

    /// A command's completion: ends the verb that posted it (or takes its
    /// next step). Out of line: its locals are not on the stack of the
    /// other events' paths (a received MAD runs the CM from
    /// [`Self::handle_event`] down to a QP modify; docs/stack-budget.md).
    #[inline(never)]
    fn command_done(
        &self,
        s: &mut State<P::Request>,
        token: u64,
        status: NtStatus,
        out: CommandOut,
    ) -> Option<(P::Request, NtStatus, Response)> {
        let Some(p) = s.take_pending(token) else {
            s.stats.stray_events += 1;
            return None;
        };
        s.stats.requests_completed += u64::from(p.request.is_some());
        if let Some(f) = s.files.get_mut(&p.file) {
            f.inflight = f.inflight.saturating_sub(1);
        }
        // A request-less command (rundown) creates nothing: assume the
        // stricter caller.
        let mode = p
            .request
            .as_ref()
            .map_or(RequestorMode::User, Request::requestor_mode);
        if let Op::CmStep {
            qp,
            next,
            cep,
            phase,
            more,
        } = p.op
        {
            let step = (qp, next, cep, phase, more);
            let done = self.cm_step_done(s, p.file, step, status, p.request);
            if let Some(c) = self.advance_rundown(s, p.file) {
                self.platform.pool_release(c);
            }
            return done;
        }
        if let Op::CmCheckGid { cep, gid } = p.op {
            return self.cm_gid_checked(s, p.file, (cep, gid), status, &out, p.request);
        }
        if let Op::Resolve(r) = p.op {
            let listen = r.listen();
            let done = match r.step(status, out) {
                crate::resolve::Step::Next(r, cmd) => {
                    self.post(s, p.file, p.request, Op::Resolve(r), cmd);
                    None
                }
                // A `LISTEN_ADDR`'s walk: the GID is the device's or not.
                crate::resolve::Step::Done(found) if let Some(i) = listen => {
                    let st = self.listen_addr_checked(s, p.file, &i, found.map(|_| ()));
                    p.request.map(|q| (q, st, Response::None))
                }
                crate::resolve::Step::Done(Ok(route)) => p.request.map(|mut q| {
                    let response = Response::write(&mut q, route.as_bytes());
                    (q, STATUS_SUCCESS, response)
                }),
                crate::resolve::Step::Done(Err(st)) => p.request.map(|q| (q, st, Response::None)),
            };
            if let Some(c) = self.advance_rundown(s, p.file) {
                self.platform.pool_release(c);
            }
            return done;
        }
        let mut request = p.request;
        let (status, response) =
            self.finish(s, p.file, p.op, (status, out), mode, request.as_mut());
        let charge = self.advance_rundown(s, p.file);
        if let Some(c) = charge {
            self.platform.pool_release(c);
        }
        request.map(|r| (r, status, response))
    }

    // ------------------------------------------------------------- removal

    /// The device is being removed (surprise or orderly): every pending
    /// request completes (`STATUS_DEVICE_REMOVED`, destroys succeed), new
    /// verbs fail with `STATUS_DEVICE_REMOVED`, destroys still succeed, and
    /// the HCA drops its references to registered memory
    /// ([`Hca::device_removed`]). Rings mapped into processes stay mapped
    /// (and allocated) until their files' cleanup.
    ///
    /// Allocates nothing: the pending requests complete through the
    /// deferred completions (their room was reserved with them), and the
    /// files are visited one per hold of the device lock.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    pub fn remove(&self) {
        self.state.lock(|s| {
            s.removed = true;
            s.backlog.clear();
            for i in 0..s.pending.len() {
                let Some(p) = s.pending[i].1.take() else {
                    continue;
                };
                s.pending_free.push(i as u32);
                s.pending_len -= 1;
                if let Some(f) = s.files.get_mut(&p.file) {
                    f.inflight = f.inflight.saturating_sub(1);
                }
                let status = self.removed_op(s, p.file, p.op);
                if let Some(r) = p.request {
                    s.stats.requests_completed += 1;
                    // In the room `reserve_deferred` kept for it.
                    s.defer(r, status, Response::None);
                }
            }
            // Every file learns the device is gone; other waits end.
            self.async_event(s, crate::hca::AsyncEvent::DeviceFatal);
            let mut file = None;
            while let Some(k) = next_file(s, file) {
                crate::notify::fail_file_waits(s, k, STATUS_DEVICE_REMOVED);
                file = Some(k);
            }
        });
        // Each file's rundown advances, a file per hold of the lock (the
        // pool charge one frees is released outside it).
        let mut file = None;
        while let Some((k, charge)) = self.state.lock(|s| {
            let k = next_file(s, file)?;
            Some((k, self.advance_rundown(s, k)))
        }) {
            file = Some(k);
            if let Some(c) = charge {
                self.platform.pool_release(c);
            }
        }
        self.complete_all(Drain);
        // The objects are forgotten: the HCA lets go of the memory they
        // pinned (user pages must be unlocked before their process exits).
        self.hca.device_removed();
    }

    /// The cancel routine (EvtRequestCancel) for requests the driver marked
    /// cancelable with `cancel_key`. Control verbs are never cancelable:
    /// their commands cannot be recalled from the HCA and complete promptly;
    /// a cancel of one is remembered by the platform and ignored here.
    ///
    /// IRQL: DISPATCH_LEVEL.
    pub fn cancel(&self, cancel_key: u64) {
        let request = self.state.lock(|s| {
            let w = s.waits.remove(&cancel_key);
            if w.is_some() {
                s.stats.cancelled += 1;
            } else {
                s.stats.cancels_ignored += 1;
            }
            w.map(|w| w.request)
        });
        // The cancel routine owns the request: complete it without unmarking.
        if let Some(r) = request {
            r.complete(STATUS_CANCELLED, 0);
        }
    }

    /// Routes an HCA async event to the file that owns its object (or to
    /// every file for port and device events).
    fn async_event(&self, s: &mut State<P::Request>, ev: crate::hca::AsyncEvent) {
        let (event_type, object, port_num) = crate::notify::classify(ev);
        match object {
            Some((kind, number)) => {
                let Some(&(file, idx)) = s.by_number.get(&(kind as u8, number)) else {
                    return;
                };
                if let crate::hca::AsyncEvent::CommEstablished(_) = ev {
                    self.cm_comm_established(s, file, idx);
                }
                if kind == Kind::Cq {
                    if let Some(Body::Cq(c)) = s
                        .files
                        .get_mut(&file)
                        .map(|f| &mut f.objects.get_mut(idx).body)
                    {
                        c.failed = true;
                    }
                    crate::notify::fail_cq_waits(s, file, idx, STATUS_DATA_OVERRUN);
                }
                let rec = crate::notify::AsyncRecord {
                    event_type,
                    port_num,
                    object: Some(idx),
                };
                crate::notify::async_event(s, file, rec);
            }
            None => {
                let mut after = None;
                while let Some(file) = next_file(s, after) {
                    let rec = crate::notify::AsyncRecord {
                        event_type,
                        port_num,
                        object: None,
                    };
                    crate::notify::async_event(s, file, rec);
                    after = Some(file);
                }
            }
        }
    }

    /// True after [`Device::remove`].
    pub fn is_removed(&self) -> bool {
        self.state.lock(|s| s.removed)
    }
}
