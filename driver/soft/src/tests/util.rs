//! Test support: a minimal [`Platform`] whose locks check the lock order, a
//! [`SoftBus`] that counts and checks it is called with no soft HCA lock
//! held, and helpers that run commands.

use core::net::{IpAddr, Ipv6Addr};
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::cell::RefCell;
use std::sync::Mutex;
use std::vec::Vec;

use alloc::sync::Arc;

use irpverbs_abi::{
    IV_QPT_RC, IvAhAttr, IvQpCap, NtStatus, STATUS_SUCCESS, nt_success, status_name,
};
use irpverbs_core::platform::HCA_LOCK;
use irpverbs_core::{
    Command, CommandOut, DISPATCH_LEVEL, Event, Hca, Irql, LockClass, MajorFunction, PASSIVE_LEVEL,
    Platform, PoolCharge, PoolTag, Request, RequestorMode, SpinLock,
};

use crate::firmware::Firmware;
use crate::{Execution, SoftBus, SoftConfig, SoftHca};

/// Tests can fail any one allocation of their thread
/// ([`irpverbs_failalloc::failing_nth`]); other threads' go through.
#[global_allocator]
static ALLOC: irpverbs_failalloc::FailAlloc = irpverbs_failalloc::FailAlloc;

std::thread_local! {
    /// Ranks of the test locks this thread holds, in acquisition order.
    static HELD: RefCell<Vec<u16>> = const { RefCell::new(Vec::new()) };
}

/// Ranks of the locks the current thread holds.
pub(crate) fn held_ranks() -> Vec<u16> {
    HELD.with(|h| h.borrow().clone())
}

/// A std mutex that panics when taken out of rank order (as the verifier
/// bugchecks).
pub(crate) struct TestLock<T> {
    class: &'static LockClass,
    inner: Mutex<T>,
}

impl<T: Send> SpinLock<T> for TestLock<T> {
    fn lock<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            if let Some(&top) = h.last() {
                assert!(
                    top < self.class.rank,
                    "{} (rank {}) taken holding rank {top}",
                    self.class.name,
                    self.class.rank
                );
            }
            h.push(self.class.rank);
        });
        let r = f(&mut self.inner.lock().unwrap());
        HELD.with(|h| h.borrow_mut().pop());
        r
    }
}

/// No requests in these tests.
pub(crate) struct NoRequest;

impl Request for NoRequest {
    fn ioctl_code(&self) -> u32 {
        unreachable!()
    }
    fn major_function(&self) -> MajorFunction {
        unreachable!()
    }
    fn requestor_mode(&self) -> RequestorMode {
        unreachable!()
    }
    fn file(&self) -> u64 {
        unreachable!()
    }
    fn input(&self) -> &[u8] {
        unreachable!()
    }
    fn output(&mut self) -> &mut [u8] {
        unreachable!()
    }
    fn complete(self, _: NtStatus, _: usize) {
        unreachable!()
    }
    fn mark_cancelable(&mut self, _: u64) -> Result<(), NtStatus> {
        unreachable!()
    }
    fn unmark_cancelable(&mut self) -> Result<(), NtStatus> {
        unreachable!()
    }
    fn address_space(&self) -> u64 {
        unreachable!()
    }
    fn attach_pin(&mut self, _: irpverbs_ring::Shared<irpverbs_ring::Region>) {
        unreachable!()
    }
    fn take_pin(&mut self) -> Option<irpverbs_ring::Shared<irpverbs_ring::Region>> {
        unreachable!()
    }
}

/// The test platform: checked locks, nothing else.
pub(crate) struct TestPlatform;

impl Platform for TestPlatform {
    type Request = NoRequest;
    type Lock<T: Send> = TestLock<T>;

    fn new_lock<T: Send>(&self, class: &'static LockClass, value: T) -> TestLock<T> {
        TestLock {
            class,
            inner: Mutex::new(value),
        }
    }

    /// Time stands still: the soft HCA's tests drive no CM.
    fn now_ns(&self) -> u64 {
        0
    }

    fn irql(&self) -> Irql {
        if held_ranks().is_empty() {
            PASSIVE_LEVEL
        } else {
            DISPATCH_LEVEL
        }
    }

    fn pool_charge(&self, tag: PoolTag, bytes: usize) -> Result<PoolCharge, NtStatus> {
        Ok(PoolCharge { tag, bytes, id: 0 })
    }

    fn pool_release(&self, _: PoolCharge) {}

    fn pin_memory(
        &self,
        _: &NoRequest,
        _addr: u64,
        length: u64,
        _write: bool,
        _physical: bool,
    ) -> Result<irpverbs_ring::Shared<irpverbs_ring::Region>, NtStatus> {
        Ok(region(length))
    }

    type Mapping = ();

    fn map_ring(
        &self,
        _: &NoRequest,
        _: &irpverbs_ring::Ring,
    ) -> Result<(irpverbs_abi::IvRingMap, ()), NtStatus> {
        unreachable!("no requests")
    }

    fn map_doorbell_page(
        &self,
        _: &NoRequest,
        _: &irpverbs_ring::Shared<irpverbs_ring::Region>,
    ) -> Result<(u64, ()), NtStatus> {
        unreachable!("no requests")
    }

    fn unmap_ring(&self, (): ()) {}
}

/// Fresh memory standing in for a pinned MR (at most 1 MiB is backed).
pub(crate) fn region(length: u64) -> irpverbs_ring::Shared<irpverbs_ring::Region> {
    irpverbs_ring::Shared::try_new(
        irpverbs_ring::Region::alloc(length.clamp(1, 1 << 20) as usize).expect("memory"),
    )
    .expect("memory")
}

/// Counts interrupts and doorbells; panics if called under a soft HCA lock.
#[derive(Debug, Default)]
pub(crate) struct CountingBus {
    interrupts: AtomicUsize,
    /// Completion vector interrupts, per vector (the first 4).
    comp_interrupts: [AtomicUsize; 4],
    doorbells: AtomicUsize,
    poller_wakes: AtomicUsize,
    resumes: AtomicUsize,
}

impl CountingBus {
    fn check_unlocked() {
        assert!(
            held_ranks().iter().all(|&r| r < HCA_LOCK.rank),
            "bus called holding soft HCA locks: {:?}",
            held_ranks()
        );
    }

    pub(crate) fn interrupts(&self) -> usize {
        self.interrupts.load(Ordering::SeqCst)
    }

    /// Completion vector `vector`'s interrupts.
    pub(crate) fn comp_interrupts(&self, vector: usize) -> usize {
        self.comp_interrupts[vector].load(Ordering::SeqCst)
    }

    pub(crate) fn doorbells(&self) -> usize {
        self.doorbells.load(Ordering::SeqCst)
    }

    pub(crate) fn poller_wakes(&self) -> usize {
        self.poller_wakes.load(Ordering::SeqCst)
    }

    /// [`SoftBus::resume`] calls: work left after a call's budget.
    pub(crate) fn resumes(&self) -> usize {
        self.resumes.load(Ordering::SeqCst)
    }
}

impl SoftBus for CountingBus {
    fn interrupt(&self) {
        Self::check_unlocked();
        self.interrupts.fetch_add(1, Ordering::SeqCst);
    }

    fn comp_interrupt(&self, vector: u32) {
        Self::check_unlocked();
        if let Some(n) = self.comp_interrupts.get(vector as usize) {
            n.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn doorbell(&self) {
        Self::check_unlocked();
        self.doorbells.fetch_add(1, Ordering::SeqCst);
    }

    fn wake_doorbell_poller(&self) {
        Self::check_unlocked();
        self.poller_wakes.fetch_add(1, Ordering::SeqCst);
    }

    fn resume(&self) {
        Self::check_unlocked();
        self.resumes.fetch_add(1, Ordering::SeqCst);
    }
}

/// An IPv6 port address for tests.
pub(crate) const IP6: IpAddr = IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 7));

/// A valid RoCE address vector to 10.0.0.2.
pub(crate) fn av() -> IvAhAttr {
    IvAhAttr {
        dgid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 10, 0, 0, 2],
        is_global: 1,
        port_num: 1,
        hop_limit: 64,
        ..IvAhAttr::default()
    }
}

/// Every way to spoil a valid address vector.
pub(crate) fn bad_avs() -> Vec<IvAhAttr> {
    let spoil: [fn(&mut IvAhAttr); 11] = [
        |a| a.is_global = 0,
        |a| a.is_global = 2,
        |a| a.dgid = [0; 16],
        |a| a.port_num = 0,
        |a| a.port_num = 2,
        |a| a.sgid_index = 1,
        |a| a.sgid_index = 16,
        |a| a.sl = 16,
        |a| a.flow_label = 0x10_0000,
        |a| a.reserved = [0, 1],
        |a| a.sgid_index = 255,
    ];
    spoil
        .iter()
        .map(|f| {
            let mut a = av();
            f(&mut a);
            a
        })
        .collect()
}

/// Modest work queue sizes.
pub(crate) fn cap() -> IvQpCap {
    IvQpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
        reserved: 0,
    }
}

/// A soft HCA on the test platform and a counting bus, with helpers that
/// run one command and return its completion.
pub(crate) struct Dev {
    pub(crate) hca: Arc<SoftHca<TestPlatform>>,
    pub(crate) bus: Arc<CountingBus>,
    next_token: AtomicU64,
    /// Events that came after a command's completion.
    extra: Mutex<Vec<Event>>,
}

impl Dev {
    /// Default configuration, inline.
    pub(crate) fn inline() -> Self {
        Self::with(|_| {})
    }

    /// Default configuration, deferred.
    pub(crate) fn deferred() -> Self {
        Self::with(|c| c.execution = Execution::Deferred)
    }

    /// Default configuration changed by `f`.
    pub(crate) fn with(f: impl FnOnce(&mut SoftConfig)) -> Self {
        let mut config = SoftConfig::default();
        f(&mut config);
        let bus = Arc::new(CountingBus::default());
        let hca = SoftHca::new(&TestPlatform, config, bus.clone()).unwrap();
        Self {
            hca: Arc::new(hca),
            bus,
            next_token: AtomicU64::new(1),
            extra: Mutex::new(Vec::new()),
        }
    }

    /// A fresh token.
    pub(crate) fn token(&self) -> u64 {
        self.next_token.fetch_add(1, Ordering::SeqCst)
    }

    /// Posts `command`, runs the firmware if deferred, and returns its
    /// completion. Later events are kept for [`Dev::take_events`].
    pub(crate) fn exec(&self, command: Command) -> (NtStatus, CommandOut) {
        let token = self.token();
        self.hca.post_command(token, command).unwrap();
        self.hca.run_firmware();
        let done = loop {
            match self.hca.poll_event() {
                Some(e @ (Event::Completion { .. } | Event::Async(_) | Event::Mad)) => {
                    self.extra.lock().unwrap().push(e);
                }
                other => break other,
            }
        };
        let Some(Event::CommandDone {
            token: t,
            status,
            out,
        }) = done
        else {
            panic!("expected a command completion, got {done:?}");
        };
        assert_eq!(t, token);
        if !nt_success(status) {
            assert_eq!(out, CommandOut::None);
        }
        while let Some(e) = self.hca.poll_event() {
            self.extra.lock().unwrap().push(e);
        }
        (status, out)
    }

    /// Events seen after completions since the last call, and those still
    /// in the event queue.
    pub(crate) fn take_events(&self) -> Vec<Event> {
        let mut events = core::mem::take(&mut *self.extra.lock().unwrap());
        while let Some(e) = self.hca.poll_event() {
            events.push(e);
        }
        events.extend(self.take_comp_events().into_iter().map(|(_, e)| e));
        events
    }

    /// The completion vectors' event queues' entries, each with its
    /// vector.
    pub(crate) fn take_comp_events(&self) -> Vec<(u32, Event)> {
        let mut events = Vec::new();
        for v in 0..self.hca.comp_event_queues() {
            let mut out: [Option<Event>; 8] = Default::default();
            loop {
                let n = self.hca.poll_comp_events(v, &mut out);
                events.extend(out[..n].iter_mut().filter_map(Option::take).map(|e| (v, e)));
                if n < out.len() {
                    break;
                }
            }
        }
        events
    }

    /// Sweeps an allocation failure through `command` (inline): runs it with
    /// its first, second, ... allocation failing until a run fails none,
    /// and checks that each run either succeeded or failed with
    /// `STATUS_INSUFFICIENT_RESOURCES`, changing nothing (no object, no
    /// firmware state, no event). `undo` gets each success's output and
    /// must destroy what it made, so that every run starts alike. Returns
    /// how many runs failed an allocation.
    #[track_caller]
    pub(crate) fn sweep(&self, command: &Command, mut undo: impl FnMut(&Self, CommandOut)) -> u64 {
        let mut n = 0;
        loop {
            let command = command.clone();
            let before = self.snapshot();
            let live = self.hca.live_objects();
            let token = self.token();
            let (posted, failed) =
                irpverbs_failalloc::failing_nth(n, || self.hca.post_command(token, command));
            assert!(posted.is_ok(), "run {n}: the command was refused");
            let Some(Event::CommandDone {
                token: t,
                status,
                out,
            }) = self.hca.poll_event()
            else {
                panic!("run {n}: no completion");
            };
            assert_eq!(t, token);
            if nt_success(status) {
                undo(self, out);
            } else {
                assert!(
                    failed,
                    "run {n}: {} with no allocation failed",
                    status_name(status)
                );
                assert_eq!(
                    status,
                    irpverbs_abi::STATUS_INSUFFICIENT_RESOURCES,
                    "run {n}: {}",
                    status_name(status)
                );
                assert_eq!(out, CommandOut::None);
                assert_eq!(self.hca.live_objects(), live, "run {n} changed the objects");
                assert!(self.snapshot() == before, "run {n} changed the firmware");
            }
            assert!(self.take_events().is_empty(), "run {n} raised an event");
            if !failed {
                return n;
            }
            n += 1;
        }
    }

    /// Runs `command`, which must succeed.
    #[track_caller]
    pub(crate) fn ok(&self, command: Command) -> CommandOut {
        let c = command.clone();
        let (status, out) = self.exec(command);
        assert_eq!(
            status,
            STATUS_SUCCESS,
            "{c:?} failed: {}",
            status_name(status)
        );
        out
    }

    /// Runs `command`, which must fail with `status` and change nothing.
    #[track_caller]
    pub(crate) fn fails(&self, command: Command, status: NtStatus) {
        let c = command.clone();
        let before = self.snapshot();
        let live = self.hca.live_objects();
        let (got, _) = self.exec(command);
        assert_eq!(
            got,
            status,
            "{c:?}: got {}, expected {}",
            status_name(got),
            status_name(status)
        );
        assert_eq!(self.hca.live_objects(), live, "{c:?} changed the objects");
        assert!(self.snapshot() == before, "{c:?} changed the firmware");
        assert!(self.take_events().is_empty(), "{c:?} raised an event");
    }

    /// The firmware state.
    pub(crate) fn snapshot(&self) -> Firmware {
        self.hca.with_firmware(|f| f.clone())
    }

    /// A new PD.
    pub(crate) fn pd(&self) -> u32 {
        let CommandOut::Pd { pdn } = self.ok(Command::AllocPd) else {
            unreachable!()
        };
        pdn
    }

    /// A new CQ of at least `cqe` entries, vector 0.
    pub(crate) fn cq(&self, cqe: u32) -> u32 {
        let CommandOut::Cq { cqn, .. } = self.ok(Command::CreateCq(irpverbs_core::CreateCq {
            cqe,
            comp_vector: 0,
        })) else {
            unreachable!()
        };
        cqn
    }

    /// A new MR of one page with every access; its (lkey, rkey).
    pub(crate) fn mr(&self, pdn: u32) -> (u32, u32) {
        let CommandOut::Mr { lkey, rkey } = self.ok(Command::RegMr(irpverbs_core::RegMr {
            pdn,
            addr: 0x10_0000,
            length: 4096,
            access: irpverbs_abi::IV_ACCESS_ALL,
            physical: false,
            region: region(4096),
        })) else {
            unreachable!()
        };
        (lkey, rkey)
    }

    /// A new SRQ: 10 WRs (15 actual), 1 SGE, no limit.
    pub(crate) fn srq(&self, pdn: u32) -> u32 {
        let CommandOut::Srq { srqn, .. } = self.ok(Command::CreateSrq(irpverbs_core::CreateSrq {
            pdn,
            max_wr: 10,
            max_sge: 1,
            srq_limit: 0,
        })) else {
            unreachable!()
        };
        srqn
    }

    /// A new AH to [`av`].
    pub(crate) fn ah(&self, pdn: u32) -> u32 {
        let CommandOut::Ah { ahn } = self.ok(Command::CreateAh(irpverbs_core::CreateAh {
            pdn,
            attr: av(),
        })) else {
            unreachable!()
        };
        ahn
    }

    /// A new RC QP completing on `cqn`, sizes [`cap`].
    pub(crate) fn qp(&self, pdn: u32, cqn: u32, srqn: Option<u32>) -> u32 {
        self.qp_with(pdn, cqn, cqn, srqn)
    }

    /// A new RC QP with separate CQs, sizes [`cap`].
    pub(crate) fn qp_with(&self, pdn: u32, send_cqn: u32, recv_cqn: u32, srqn: Option<u32>) -> u32 {
        let CommandOut::Qp { qpn, .. } = self.ok(Command::CreateQp(irpverbs_core::CreateQp {
            pdn,
            qp_type: IV_QPT_RC,
            send_cqn,
            recv_cqn,
            srqn,
            sq_sig_all: false,
            cap: cap(),
        })) else {
            unreachable!()
        };
        qpn
    }
}
