//! Fakes for unit tests of code that runs over the core: a mini-driver (an
//! [`Hca`]) driven by the core's [`Device`] without an OS, or code above
//! the core driven without hardware.
//!
//! Enabled by the `testing` feature (and in the core's own tests); it uses
//! `std` (mutexes, maps) and is never part of a driver build.
//!
//! - [`FakePlatform`]: a [`Platform`] in a test process. Every call runs at
//!   DISPATCH_LEVEL as far as [`Platform::irql`] says; locks are mutexes;
//!   the clock is [`FakePlatform::now`], set by the test; pool charges are
//!   counted ([`FakePlatform::live_charges`]) and can be refused
//!   ([`FakePlatform::fail_pool`]); user pins and ring mappings are
//!   recorded so that a test sees what is pinned or mapped and when it is
//!   let go.
//! - [`FakeRequest`]: a request (an IRP) with its IOCTL code, requestor
//!   mode, file, address space and buffers; completing it stores the
//!   status and output in its [`Outcome`] (completing twice panics).
//! - [`FakeHca`]: an [`Hca`] whose commands wait in a queue until the test
//!   runs them ([`FakeHca::run`]), with a command queue of a given depth,
//!   completion vectors, doorbell pages and a GSI whose MADs the test
//!   feeds and reads. It is for code above the `Hca` trait (the core, a
//!   ULP's use of the device); a mini-driver under test takes its place.
//!
//! A vendor's test of its mini-driver builds a `Device<FakePlatform, H>`
//! over its `H: Hca`, issues requests through [`Device::in_caller_context`]
//! and [`Device::dispatch_ioctl`], lets the device run, calls
//! [`Device::dpc`] as the interrupt's DPC would, and reads each request's
//! [`Outcome`] (docs/hardware-seam.md, "Unit tests of a mini-driver").

extern crate std;

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::sync::Arc;
use alloc::vec;
use alloc::vec::Vec;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use irpverbs_abi::*;
use zerocopy::IntoBytes;

use crate::*;

/// The GID [`FakeHca`] answers for index 0 of its GID table.
pub const FAKE_GID: [u8; 16] = [0xA; 16];

/// A [`Platform`] in a test process.
///
/// [`Platform::irql`] is always DISPATCH_LEVEL; locks are mutexes (a
/// fake checks no lock order: the host platform's verifier does); pool
/// charges are counted, not allocated; a user pin is backed by fresh
/// memory (the pinned buffer's bytes are not the caller's); a user
/// mapping of a ring or doorbell page is recorded and placed at the
/// memory's own address + [`USER_OFFSET`]. Mapping memory for a
/// kernel-mode request panics (the core must never ask for it).
#[derive(Default)]
pub struct FakePlatform {
    /// The clock ([`Platform::now_ns`], nanoseconds), set by the test.
    pub now: AtomicU64,
    /// Pool charges taken and not released: 0 after a test that freed
    /// everything.
    pub live_charges: AtomicU64,
    /// The id of the next charge.
    pub next_id: AtomicU64,
    /// Refuse this many of the next pool charges with
    /// `STATUS_INSUFFICIENT_RESOURCES`.
    pub fail_pool: AtomicU32,
    /// User mappings made and not undone: id -> (the ring's memory, the
    /// address space).
    pub mapped: Mutex<
        std::collections::BTreeMap<u64, (irpverbs_ring::WeakShared<irpverbs_ring::Region>, u64)>,
    >,
    /// Mappings made in all.
    pub maps_made: AtomicU64,
    /// Refuse the next mapping.
    pub fail_map: AtomicBool,
    /// Every pin: the region (to see when it is let go), the mode it was
    /// asked for, and `write`.
    pub pins: Mutex<
        Vec<(
            irpverbs_ring::WeakShared<irpverbs_ring::Region>,
            RequestorMode,
            bool,
        )>,
    >,
}

impl FakePlatform {
    /// Pins whose memory is still held (by an MR or a request).
    pub fn live_pins(&self) -> usize {
        self.pins
            .lock()
            .unwrap()
            .iter()
            .filter(|(w, _, _)| w.strong_count() > 0)
            .count()
    }

    /// User mappings made and not undone.
    pub fn live_mappings(&self) -> usize {
        self.mapped.lock().unwrap().len()
    }

    /// A user mapping of `region` for `request` (refused once after
    /// `fail_map` is set): its id.
    fn record_mapping(
        &self,
        request: &FakeRequest,
        region: &irpverbs_ring::Shared<irpverbs_ring::Region>,
    ) -> Result<u64, NtStatus> {
        assert_eq!(
            request.mode,
            RequestorMode::User,
            "only user memory is mapped"
        );
        if self.fail_map.swap(false, Ordering::SeqCst) {
            return Err(STATUS_INSUFFICIENT_RESOURCES);
        }
        let id = self.maps_made.fetch_add(1, Ordering::SeqCst);
        self.mapped.lock().unwrap().insert(
            id,
            (irpverbs_ring::Shared::downgrade(region), request.space),
        );
        Ok(id)
    }
}

/// Where the fake platform maps user rings: their own address + this.
pub const USER_OFFSET: u64 = 1 << 30;

/// [`FakePlatform`]'s lock: a mutex.
pub struct FakeLock<T>(Mutex<T>);

impl<T: Send> SpinLock<T> for FakeLock<T> {
    fn lock<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        f(&mut self.0.lock().unwrap())
    }
}

/// Where a [`FakeRequest`]'s completion goes: `None` while it is pending,
/// then its status and the output its `information` covers.
pub type Outcome = Arc<Mutex<Option<(NtStatus, Vec<u8>)>>>;

/// Takes a request's completion out of its [`Outcome`], if it completed.
pub fn take_outcome(outcome: &Outcome) -> Option<(NtStatus, Vec<u8>)> {
    outcome.lock().unwrap().take()
}

/// A request (an IRP) as [`FakePlatform`] delivers it: an
/// `IRP_MJ_DEVICE_CONTROL` with its code, requestor mode, file, address
/// space and buffers. Cancel marking always succeeds (a test cancels by
/// the core's own calls). Completing it stores the status and output in
/// [`FakeRequest::outcome`], then runs [`FakeRequest::on_complete`];
/// completing it twice, or attaching two pins, panics.
pub struct FakeRequest {
    /// The IOCTL code.
    pub code: u32,
    /// User or kernel mode.
    pub mode: RequestorMode,
    /// The file object it was sent on.
    pub file: FileKey,
    /// The requestor's address space (process).
    pub space: u64,
    /// The input buffer, 8-byte aligned as an IRP's system buffer is.
    pub input: Vec<u64>,
    /// The input's length in bytes (of `input`).
    pub input_len: usize,
    /// The output buffer.
    pub output: Vec<u8>,
    /// Its completion, shared with the test.
    pub outcome: Outcome,
    /// A pin `in_caller_context` attached.
    pub pin: Option<irpverbs_ring::Shared<irpverbs_ring::Region>>,
    /// Run after the request completed (its completion routine).
    pub on_complete: Option<Hook>,
}

/// A request's completion routine.
pub type Hook = Box<dyn FnOnce() + Send>;

impl FakeRequest {
    /// An IOCTL `code` on `file` from address space `space` in `mode`,
    /// with a copy of `input` and an output buffer of `output_len` zero
    /// bytes. The test keeps a clone of [`FakeRequest::outcome`] to see its
    /// completion.
    pub fn ioctl(
        code: u32,
        mode: RequestorMode,
        file: FileKey,
        space: u64,
        input: &[u8],
        output_len: usize,
    ) -> Self {
        let mut words = vec![0u64; input.len().div_ceil(8)];
        words.as_mut_bytes()[..input.len()].copy_from_slice(input);
        Self {
            code,
            mode,
            file,
            space,
            input: words,
            input_len: input.len(),
            output: vec![0; output_len],
            outcome: Outcome::default(),
            pin: None,
            on_complete: None,
        }
    }
}

impl Request for FakeRequest {
    fn ioctl_code(&self) -> u32 {
        self.code
    }
    fn major_function(&self) -> MajorFunction {
        MajorFunction::DeviceControl
    }
    fn requestor_mode(&self) -> RequestorMode {
        self.mode
    }
    fn file(&self) -> FileKey {
        self.file
    }
    fn input(&self) -> &[u8] {
        &self.input.as_bytes()[..self.input_len]
    }
    fn output(&mut self) -> &mut [u8] {
        &mut self.output
    }
    fn complete(self, status: NtStatus, information: usize) {
        let mut o = self.outcome.lock().unwrap();
        assert!(o.is_none(), "completed twice");
        // The output buffer itself (no allocation: tests count the
        // driver's).
        let mut out = self.output;
        out.truncate(information);
        *o = Some((status, out));
        drop(o);
        if let Some(hook) = self.on_complete {
            hook();
        }
    }
    fn mark_cancelable(&mut self, _: u64) -> Result<(), NtStatus> {
        Ok(())
    }
    fn unmark_cancelable(&mut self) -> Result<(), NtStatus> {
        Ok(())
    }
    fn address_space(&self) -> u64 {
        self.space
    }
    fn attach_pin(&mut self, region: irpverbs_ring::Shared<irpverbs_ring::Region>) {
        assert!(self.pin.replace(region).is_none(), "pinned twice");
    }
    fn take_pin(&mut self) -> Option<irpverbs_ring::Shared<irpverbs_ring::Region>> {
        self.pin.take()
    }
}

impl Platform for FakePlatform {
    type Request = FakeRequest;
    type Lock<T: Send> = FakeLock<T>;
    fn new_lock<T: Send>(&self, _: &'static LockClass, value: T) -> FakeLock<T> {
        FakeLock(Mutex::new(value))
    }
    fn irql(&self) -> Irql {
        DISPATCH_LEVEL
    }
    fn now_ns(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
    fn pool_charge(&self, tag: PoolTag, bytes: usize) -> Result<PoolCharge, NtStatus> {
        if self.fail_pool.load(Ordering::SeqCst) > 0 {
            self.fail_pool.fetch_sub(1, Ordering::SeqCst);
            return Err(STATUS_INSUFFICIENT_RESOURCES);
        }
        self.live_charges.fetch_add(1, Ordering::SeqCst);
        Ok(PoolCharge {
            tag,
            bytes,
            id: self.next_id.fetch_add(1, Ordering::SeqCst),
        })
    }
    fn pool_release(&self, _: PoolCharge) {
        self.live_charges.fetch_sub(1, Ordering::SeqCst);
    }
    type Mapping = u64;
    fn pin_memory(
        &self,
        request: &FakeRequest,
        _: u64,
        length: u64,
        write: bool,
        _: bool,
    ) -> Result<irpverbs_ring::Shared<irpverbs_ring::Region>, NtStatus> {
        // The fake HCA never touches MR memory: back the region with fresh memory.
        let region = irpverbs_ring::Region::alloc(length as usize)
            .and_then(|r| irpverbs_ring::Shared::try_new(r).ok())
            .ok_or(STATUS_INSUFFICIENT_RESOURCES)?;
        self.pins.lock().unwrap().push((
            irpverbs_ring::Shared::downgrade(&region),
            request.mode,
            write,
        ));
        Ok(region)
    }
    fn map_ring(
        &self,
        request: &FakeRequest,
        ring: &irpverbs_ring::Ring,
    ) -> Result<(IvRingMap, u64), NtStatus> {
        let id = self.record_mapping(request, ring.region())?;
        let mut map = ring.map();
        map.control_addr += USER_OFFSET;
        map.entries_addr += USER_OFFSET;
        Ok((map, id))
    }
    fn map_doorbell_page(
        &self,
        request: &FakeRequest,
        page: &irpverbs_ring::Shared<irpverbs_ring::Region>,
    ) -> Result<(u64, u64), NtStatus> {
        let id = self.record_mapping(request, page)?;
        Ok((page.addr() + USER_OFFSET, id))
    }
    fn unmap_ring(&self, mapping: u64) {
        let (region, _) = self
            .mapped
            .lock()
            .unwrap()
            .remove(&mapping)
            .expect("unmapped once");
        assert!(region.strong_count() > 0, "unmapped after its memory went");
    }
}

/// [`FakeHca`]'s doorbell pages: page -> (memory, the target of each slot).
pub type FakePages = std::collections::BTreeMap<
    u32,
    (
        irpverbs_ring::Shared<irpverbs_ring::Region>,
        Vec<DoorbellTarget>,
    ),
>;

/// An HCA that executes commands when the test says so
/// ([`FakeHca::run`]), with a command queue of `depth` entries (a full
/// queue gives the command back).
///
/// Objects get increasing numbers and rings of 4 entries of 64 bytes;
/// `ModifyQp` checks the QP's current state and keeps the new one; a
/// `DeregMr` of an MR with bound windows is `STATUS_DEVICE_BUSY`; GID
/// index 0 is [`FAKE_GID`], others `STATUS_INVALID_PARAMETER`; every other
/// command succeeds. Completions go on [`FakeHca::eq`]; doorbells do
/// nothing; MADs sent are kept in [`FakeHca::mads_out`], MADs to receive
/// are queued by the test in [`FakeHca::mads_in`].
pub struct FakeHca {
    /// What `caps` answers (a small device, one port, one vector).
    pub caps: IvQueryDeviceOut,
    /// The command queue's depth.
    pub depth: usize,
    /// Commands posted and not yet run.
    pub queued: Mutex<VecDeque<(u64, Command)>>,
    /// The event queue: command completions and the test's own events.
    pub eq: Mutex<VecDeque<Event>>,
    /// The next object number.
    pub next: AtomicU32,
    /// `device_removed` was called.
    pub removed: AtomicBool,
    /// Doorbell pages: page -> (memory, the target of each slot).
    pub pages: Mutex<FakePages>,
    /// Doorbell pages allocated in all.
    pub pages_made: AtomicU32,
    /// The HCA has no doorbell pages.
    pub no_doorbells: AtomicBool,
    /// `ring_doorbell_pages` calls.
    pub page_rings: AtomicUsize,
    /// MADs for the GSI to receive (`poll_mad` takes them in order).
    pub mads_in: Mutex<VecDeque<MadIn>>,
    /// MADs the GSI sent.
    pub mads_out: Mutex<Vec<MadOut>>,
    /// QP states by number, as `ModifyQp` left them (absent: RESET). A
    /// modify whose current state is not the QP's fails, as an HCA's does.
    pub qp_states: Mutex<std::collections::HashMap<u32, u32>>,
    /// The next `ModifyQp` to this state fails with
    /// `STATUS_INSUFFICIENT_RESOURCES` (0: none).
    pub fail_modify_to: AtomicU32,
    /// Completion vectors' event queues (none: completion events come on
    /// the async event queue); the test queues a vector's events here.
    pub comp: Mutex<Vec<VecDeque<Event>>>,
    /// How many times each vector's event queue was armed.
    pub comp_arms: Mutex<Vec<usize>>,
    /// Bound memory windows (by rkey index) and the lkey of their MR: an
    /// MR with windows refuses its dereg, as the soft HCA's does.
    pub windows: Mutex<std::collections::HashMap<u32, u32>>,
}

impl FakeHca {
    /// A fake HCA with a command queue of `depth` entries and no
    /// completion vector of its own (completion events come on the event
    /// queue).
    pub fn new(depth: usize) -> Self {
        Self {
            caps: IvQueryDeviceOut {
                max_pd: 4,
                max_cq: 8,
                max_cqe: 1024,
                max_qp: 8,
                max_qp_wr: 64,
                max_sge: 4,
                max_mr: 8,
                max_mw: 4,
                max_fast_reg_page_list_len: 4,
                max_mr_size: 1 << 20,
                max_srq: 4,
                max_srq_wr: 64,
                max_srq_sge: 4,
                max_ah: 4,
                max_pkeys: 1,
                phys_port_cnt: 1,
                num_comp_vectors: 1,
                max_qp_rd_atom: 4,
                max_qp_init_rd_atom: 4,
                ..Default::default()
            },
            depth,
            queued: Mutex::new(VecDeque::new()),
            eq: Mutex::new(VecDeque::new()),
            next: AtomicU32::new(2),
            removed: AtomicBool::new(false),
            pages: Mutex::default(),
            pages_made: AtomicU32::new(0),
            no_doorbells: AtomicBool::new(false),
            page_rings: AtomicUsize::new(0),
            mads_in: Mutex::new(VecDeque::new()),
            mads_out: Mutex::new(Vec::new()),
            qp_states: Mutex::new(std::collections::HashMap::new()),
            fail_modify_to: AtomicU32::new(0),
            comp: Mutex::new(Vec::new()),
            comp_arms: Mutex::new(Vec::new()),
            windows: Mutex::default(),
        }
    }

    /// A fake HCA with `vectors` completion vectors, each its own event
    /// queue.
    pub fn with_vectors(depth: usize, vectors: u32) -> Self {
        let mut hca = Self::new(depth);
        hca.caps.num_comp_vectors = vectors;
        hca.comp = Mutex::new(vec![VecDeque::new(); vectors as usize]);
        hca.comp_arms = Mutex::new(vec![0; vectors as usize]);
        hca
    }

    /// The targets bound to page `page`, by slot.
    pub fn bound(&self, page: u32) -> Vec<DoorbellTarget> {
        self.pages
            .lock()
            .unwrap()
            .get(&page)
            .map(|p| p.1.clone())
            .unwrap_or_default()
    }

    /// Executes every queued command, in order, and queues its completion
    /// on [`FakeHca::eq`].
    pub fn run(&self) {
        let cmds: Vec<_> = self.queued.lock().unwrap().drain(..).collect();
        for (token, cmd) in cmds {
            let n = self.next.fetch_add(1, Ordering::SeqCst);
            if let Command::ModifyQp(ModifyQp {
                qpn,
                cur_state,
                mask,
                attr,
            }) = &cmd
            {
                let mut states = self.qp_states.lock().unwrap();
                let now = states.get(qpn).copied().unwrap_or(IV_QPS_RESET);
                let to = if mask & IV_QP_STATE != 0 {
                    attr.qp_state
                } else {
                    now
                };
                let status = if *cur_state != now {
                    STATUS_INVALID_DEVICE_STATE
                } else if to != 0
                    && self
                        .fail_modify_to
                        .compare_exchange(to, 0, Ordering::SeqCst, Ordering::SeqCst)
                        .is_ok()
                {
                    STATUS_INSUFFICIENT_RESOURCES
                } else {
                    states.insert(*qpn, to);
                    STATUS_SUCCESS
                };
                drop(states);
                self.eq.lock().unwrap().push_back(Event::CommandDone {
                    token,
                    status,
                    out: CommandOut::None,
                });
                continue;
            }
            let busy_mr = matches!(&cmd, Command::DeregMr { lkey }
                if self.windows.lock().unwrap().values().any(|l| l == lkey));
            if busy_mr {
                self.eq.lock().unwrap().push_back(Event::CommandDone {
                    token,
                    status: STATUS_DEVICE_BUSY,
                    out: CommandOut::None,
                });
                continue;
            }
            let out = match cmd {
                Command::AllocMw { .. } => CommandOut::Mw { rkey: n << 8 },
                Command::BindMw(b) => {
                    let mut windows = self.windows.lock().unwrap();
                    if b.length == 0 {
                        windows.remove(&(b.rkey >> 8));
                    } else {
                        windows.insert(b.rkey >> 8, b.lkey);
                    }
                    CommandOut::Mw {
                        rkey: (b.rkey & !0xFF) | (b.rkey.wrapping_add(1) & 0xFF),
                    }
                }
                Command::DeallocMw { rkey } => {
                    self.windows.lock().unwrap().remove(&(rkey >> 8));
                    CommandOut::None
                }
                // A GID table of one entry: the address the connects of
                // these tests leave from.
                Command::QueryGid { index: 0, .. } => CommandOut::Gid(FAKE_GID),
                Command::QueryGid { .. } => {
                    self.eq.lock().unwrap().push_back(Event::CommandDone {
                        token,
                        status: STATUS_INVALID_PARAMETER,
                        out: CommandOut::None,
                    });
                    continue;
                }
                Command::AllocPd => CommandOut::Pd { pdn: n },
                Command::RegMr(_) | Command::AllocMr { .. } => CommandOut::Mr {
                    lkey: n << 8,
                    rkey: n << 8,
                },
                Command::CreateCq(CreateCq { cqe, .. }) => CommandOut::Cq {
                    cqn: n,
                    cqe,
                    ring: ring(),
                },
                Command::ResizeCq { cqn, cqe } => CommandOut::Cq {
                    cqn,
                    cqe,
                    ring: ring(),
                },
                Command::CreateQp(CreateQp { cap, .. }) => CommandOut::Qp {
                    qpn: n,
                    cap,
                    sq: ring(),
                    rq: Some(ring()),
                },
                Command::CreateSrq(CreateSrq {
                    max_wr, max_sge, ..
                }) => CommandOut::Srq {
                    srqn: n,
                    max_wr,
                    max_sge,
                    ring: ring(),
                },
                Command::CreateAh(_) => CommandOut::Ah { ahn: n },
                Command::QueryQp { qpn } => {
                    CommandOut::QpAttr(alloc::boxed::Box::new(IvQueryQpOut {
                        qpn,
                        ..Default::default()
                    }))
                }
                _ => CommandOut::None,
            };
            self.eq.lock().unwrap().push_back(Event::CommandDone {
                token,
                status: STATUS_SUCCESS,
                out,
            });
        }
    }
}

impl Hca for FakeHca {
    fn caps(&self) -> &IvQueryDeviceOut {
        &self.caps
    }
    fn post_command(&self, token: u64, command: Command) -> Result<(), Command> {
        let mut q = self.queued.lock().unwrap();
        if q.len() >= self.depth {
            return Err(command);
        }
        q.push_back((token, command));
        Ok(())
    }
    fn poll_event(&self) -> Option<Event> {
        self.eq.lock().unwrap().pop_front()
    }
    fn arm_event_queue(&self) {}
    fn comp_event_queues(&self) -> u32 {
        self.comp.lock().unwrap().len() as u32
    }
    fn poll_comp_events(&self, vector: u32, out: &mut [Option<Event>]) -> usize {
        let mut comp = self.comp.lock().unwrap();
        let Some(q) = comp.get_mut(vector as usize) else {
            return 0;
        };
        let mut n = 0;
        for slot in out.iter_mut() {
            let Some(e) = q.pop_front() else { break };
            *slot = Some(e);
            n += 1;
        }
        n
    }
    fn arm_comp_event_queue(&self, vector: u32) {
        if let Some(n) = self.comp_arms.lock().unwrap().get_mut(vector as usize) {
            *n += 1;
        }
    }
    fn sq_doorbell(&self, _: u32) {}
    fn rq_doorbell(&self, _: u32) {}
    fn srq_doorbell(&self, _: u32) {}
    fn cq_arm_doorbell(&self, _: u32) {}
    fn device_removed(&self) {
        self.removed.store(true, Ordering::SeqCst);
    }
    fn alloc_doorbell_page(&self) -> Result<DoorbellPageInfo, NtStatus> {
        if self.no_doorbells.load(Ordering::SeqCst) {
            return Err(STATUS_NOT_SUPPORTED);
        }
        let page = self.pages_made.fetch_add(1, Ordering::SeqCst) + 1;
        let region = irpverbs_ring::Region::alloc(4096)
            .and_then(|r| irpverbs_ring::Shared::try_new(r).ok())
            .expect("memory");
        self.pages
            .lock()
            .unwrap()
            .insert(page, (region.clone(), Vec::new()));
        Ok(DoorbellPageInfo { page, region })
    }
    fn ring_doorbell_pages(&self) -> Result<(), NtStatus> {
        self.page_rings.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn free_doorbell_page(&self, page: u32) {
        assert!(
            self.pages.lock().unwrap().remove(&page).is_some(),
            "page {page} freed once"
        );
    }
    fn bind_doorbell(&self, page: u32, target: DoorbellTarget) -> Result<u32, NtStatus> {
        let mut pages = self.pages.lock().unwrap();
        let slots = &mut pages.get_mut(&page).ok_or(STATUS_INVALID_PARAMETER)?.1;
        assert!(!slots.contains(&target), "{target:?} bound twice");
        if slots.len() == 3 {
            return Err(STATUS_INSUFFICIENT_RESOURCES);
        }
        slots.push(target);
        Ok(slots.len() as u32 - 1)
    }
    fn send_mad(&self, mad: &MadOut) -> Result<(), NtStatus> {
        self.mads_out.lock().unwrap().push(*mad);
        Ok(())
    }
    fn poll_mad(&self) -> Option<MadIn> {
        self.mads_in.lock().unwrap().pop_front()
    }
}

/// A ring of 4 entries of 64 bytes, as [`FakeHca`] gives each queue.
pub fn ring() -> irpverbs_ring::Ring {
    irpverbs_ring::Ring::alloc(4, 64).expect("ring")
}
