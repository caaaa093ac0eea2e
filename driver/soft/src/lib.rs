//! # irpverbs soft HCA
//!
//! A software HCA, like Linux rdma_rxe: everything the framework needs from
//! hardware, without hardware. [`SoftHca`] implements [`irpverbs_core::Hca`]:
//! its command interface, the "firmware", keeps tables of PDs, MRs, CQs,
//! SRQs, QPs and AHs, validates every command (it never trusts the driver)
//! and reports completions on its event queue; its data path executes the
//! work queues the ULP posts to (RC, UC, UD), in one HCA (loopback) or
//! between soft HCAs in one process ([`Fabric`]).
//!
//! ## Model
//!
//! The driver posts a [`Command`] with a token; it lands in a bounded command
//! queue ([`SoftConfig::cmd_queue_depth`]). The firmware executes queued
//! commands in order, each producing an [`Event::CommandDone`] on the event
//! queue; an armed event queue then disarms and raises the interrupt through
//! the [`SoftBus`]. The driver's DPC drains the queue with
//! [`Hca::poll_event`] and re-arms it with [`Hca::arm_event_queue`].
//!
//! ## Event queues and completion vectors
//!
//! As on mlx5, the HCA has an *async* event queue (EQ 0: command
//! completions, async events — port, QP, SRQ, CQ error, device — and MAD
//! arrivals) and one *completion* event queue per completion vector
//! ([`SoftConfig::num_comp_vectors`], reported as `num_comp_vectors`), each
//! with its own interrupt ([`SoftBus::interrupt`] for EQ 0,
//! [`SoftBus::comp_interrupt`] for vector `v`), armed and drained on its
//! own ([`Hca::arm_comp_event_queue`], [`Hca::poll_comp_events`]). A CQ's
//! [`Event::Completion`] goes to the EQ of the vector it was created on,
//! and never to another. Every queue is allocated when the HCA is made.
//!
//! Where the firmware runs is [`SoftConfig::execution`]: [`Execution::Inline`]
//! runs it inside `post_command` (deterministic), [`Execution::Deferred`]
//! rings [`SoftBus::doorbell`] and leaves it to the host's "hardware" thread,
//! which calls [`SoftHca::run_firmware`].
//!
//! No command completion is ever lost: a command only executes when the
//! event queue has room for what it produces, so a full event queue holds
//! commands in the command queue (and `post_command` eventually gives
//! commands back) until the driver polls; that poll kicks the firmware again.
//!
//! ## Statuses
//!
//! A failed command changes nothing. Statuses, from `irpverbs_abi::status`:
//! - `STATUS_INVALID_HANDLE`: an object number (PDN, CQN, SRQN, QPN, AHN,
//!   MR key) names no live object.
//! - `STATUS_INVALID_PARAMETER`: a value out of its range, a non-zero
//!   reserved field, an inconsistent combination (SRQ of another PD, remote
//!   write without local write, ...).
//! - `STATUS_INSUFFICIENT_RESOURCES`: a device limit: object counts
//!   (`max_qp`, ...) and sizes (`max_cqe`, `max_qp_wr`, `max_sge`,
//!   `max_inline_data`, `max_mr_size`, ...).
//! - `STATUS_DEVICE_BUSY`: destroying a PD, CQ or SRQ another object uses.
//! - `STATUS_INVALID_DEVICE_STATE`: a QP not in the state the driver
//!   believed, or a transition the state machine lacks.
//! - `STATUS_NOT_SUPPORTED`: alternate paths and path migration.
//!
//! ## Data path
//!
//! CQs, SRQs and QPs own their rings (shared with the ULP); MRs their
//! pinned regions. The doorbells ([`Hca::sq_doorbell`], ...) schedule work
//! for the transport engine (`engine.rs`): the requester turns send WQEs
//! into packets, the responder executes them at the destination QP, the
//! completer matches the responses and writes the send completions
//! (`requester.rs`, `responder.rs`, `completer.rs`; [`packet`] is the
//! packet, [`fabric`] the delivery between HCAs). In [`Execution::Inline`]
//! mode the work runs to quiescence on the thread that rang the doorbell,
//! before the doorbell returns — including the work of the other inline
//! HCAs it sends to (a work list, never recursion); in
//! [`Execution::Deferred`] mode the doorbell marks the work and rings
//! [`SoftBus::doorbell`], and [`SoftHca::run_firmware`] runs it.
//!
//! What the transport does, in short (each module says it in full):
//! - IBTA opcodes, PSNs, MTU segmentation, RETH/AETH/AtomicETH/ImmDt/IETH/
//!   DETH fields in every packet; in-process, a message's consecutive
//!   packets travel as one [`packet::Burst`] (validated and copied once).
//! - RC: ACKs (coalesced; asked for by signaled WQEs, every 16 packets and
//!   when half the send queue is in flight), NAKs, RNR NAKs, go-back-N,
//!   duplicate detection with READ and atomic replay. The RNR timer and
//!   the retransmit timer are the wire stage's: in-process the loss-free
//!   fabric needs none, and a responder that sent an RNR NAK tells its
//!   requester when a receive is posted. A packet with no route is lost.
//! - Errors complete with the IBTA status a verbs user expects; RC QPs go
//!   to ERR, UC and UD send-side errors to SQE; responder errors raise
//!   `QpRequestError`, `QpAccessError` or `QpFatal`. A QP in ERR (or SQE,
//!   for its send queue) completes every outstanding WQE with
//!   `WR_FLUSH_ERR`, exactly once, including WQEs posted later.
//! - RESET empties both work queues without completions (the HCA moves
//!   its consumer indices up to the producers'; WQEs posted later are kept
//!   until the QP can run them).
//! - UC and UD send completions are written when the packet has left the
//!   source buffers: when the receiving HCA consumed (or dropped) it.
//!
//! User-mode ULPs cannot call the doorbell methods: they ring through their
//! file's doorbell page, the soft HCA's UAR page ([`Hca::alloc_doorbell_page`],
//! [`Hca::bind_doorbell`]; one page per file, a slot per queue doorbell). With
//! no MMIO to trap the writes, the soft HCA scans the pages when the
//! platform calls [`SoftHca::poll_doorbells`] (a poller thread while the
//! pages are busy, [`SoftHca::poll_doorbells_step`]; the ring IOCTL when the
//! poller sleeps) and rings the
//! queue bound to each slot found, as the direct call would. The slot table
//! is the HCA's, under `HCA_LOCK` with the queues: whatever user mode writes
//! into its page makes the HCA look, at worst, at that page's own queues.
//!
//! Two soft HCAs in one process reach each other through a [`Fabric`]:
//!
//! ```ignore
//! let fabric = Fabric::new(&platform);
//! let a = Arc::new(SoftHca::new(&platform, config_a, bus_a)?); // ip 10.0.0.1
//! let b = Arc::new(SoftHca::new(&platform, config_b, bus_b)?); // ip 10.0.0.2
//! fabric.attach(&a)?;
//! fabric.attach(&b)?;
//! // A QP on `a` whose address vector names b.gid() now talks to `b`;
//! // an address vector naming a.gid() is loopback (no fabric needed).
//! ```
//!
//! The data path allocates nothing per message: WQEs are read once into the
//! QP's shadow of the slot, payloads travel as references to the source
//! region and are copied once, from MR to MR ([`Region::copy`]), and the
//! batches packets travel in are reused.
//!
//! [`Region::copy`]: irpverbs_ring::Region::copy
//!
//! ## Locks
//!
//! Per HCA, in this order only:
//! - `HCA_LOCK` (rank 20): the firmware — object tables, command queue and
//!   the whole data path (transport state of every QP, CQ and SRQ
//!   consumption). Commands and data path share it, so a command sees (and
//!   changes) the data path consistently: a modify to ERR flushes under it,
//!   a destroy stops the QP's work at once.
//! - [`FABRIC_LOCK`] (rank 22): a fabric's registry, taken to resolve a
//!   GID not seen before.
//! - [`INBOX_LOCK`] (rank 25): an HCA's inbox. The *sender* takes the
//!   receiver's inbox lock, holding its own `HCA_LOCK`, to append frames
//!   (this keeps a QP's packets in order whichever thread sends); the
//!   receiver takes it under its own `HCA_LOCK` to drain it. It is a leaf.
//! - [`DOORBELL_LOCK`] (rank 27): the list of doorbell pages the scanner
//!   looks at first; taken alone, or under `HCA_LOCK` to add and remove a
//!   page. A leaf.
//! - `EQ_LOCK` (rank 30): the event queue.
//!
//! An HCA never holds two `HCA_LOCK`s: it never calls into another HCA's
//! firmware holding its own, only appends to the other's inbox, then kicks
//! it after releasing everything. Every method may be called holding the
//! driver's `DEVICE_LOCK` (rank 10). The [`SoftBus`] is only called with no
//! soft HCA lock held.
#![no_std]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

extern crate alloc;
#[cfg(test)]
extern crate std;

mod config;
mod firmware;
pub mod net;
mod poller;
mod scheduler;
#[cfg(test)]
mod tests;
mod transport;
pub mod wire;

pub use net::{fabric, link, sim, sockwire};
pub use wire::packet;

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicBool, Ordering};

use irpverbs_abi::{
    IvQueryDeviceOut, NtStatus, STATUS_INSUFFICIENT_RESOURCES, STATUS_INVALID_PARAMETER, nt_success,
};
use irpverbs_core::platform::{EQ_LOCK, HCA_LOCK, LockClass};
use irpverbs_core::{
    Command, DoorbellPageInfo, DoorbellTarget, Event, Hca, MadIn, MadOut, Platform, SpinLock,
};
use irpverbs_ring::{DoorbellPage, Shared};

pub use fabric::{FABRIC_LOCK, Fabric, INBOX_LOCK};
pub use poller::{DEFAULT_POLL_WINDOW_NS, DoorbellPoller, PollerStep};
pub use transport::gsi::MAD_QUEUE_DEPTH;

pub use config::{
    DEFAULT_DPC_BUDGET, Execution, MAX_COMP_VECTORS, SoftConfig, default_comp_vectors,
};
pub use firmware::ah::{MAX_FLOW_LABEL, MAX_SL};
pub use firmware::datapath::TrustStats;
pub use firmware::port::{
    ACTIVE_SPEED_EDR, ACTIVE_WIDTH_4X, GID_TBL_LEN, MAX_MSG_SZ, PHYS_STATE_LINK_UP, PKEY_TBL_LEN,
    PORT_CAP_CM_SUP, PORT_NUM,
};
pub use firmware::qp::{MAX_PSN, MAX_RETRY, MAX_TIMER};
pub use firmware::{SOFT_FW_VER, SOFT_LOCAL_CA_ACK_DELAY, SOFT_PAGE_SIZE_CAP, SOFT_VENDOR_ID};
pub use link::{Clock, Datagram, Direction, Link, LinkStats, Tap, TxBatch};

use config::EVENTS_PER_COMMAND;
use fabric::{Peer, Router, Todo};
use firmware::eq::EventQueue;
use firmware::{Executed, Firmware};
use packet::{Batch, Frame, Gid};

/// What the host bus gives the device: its interrupt line and the command
/// doorbell's signal.
///
/// The soft HCA calls these with none of its locks held, but possibly from
/// inside a driver call that holds the driver's own locks (in
/// [`Execution::Inline`] mode `post_command`, `poll_event` and
/// `arm_event_queue` may all interrupt). So, like a real interrupt that only
/// queues a DPC, an implementation must not call back into the driver
/// synchronously.
pub trait SoftBus: Send + Sync {
    /// Raises the async event queue's interrupt (EQ 0: command
    /// completions, async events, MADs): it has entries and was armed.
    ///
    /// IRQL: called at <= DISPATCH_LEVEL.
    fn interrupt(&self);

    /// Raises completion vector `vector`'s interrupt: its event queue has
    /// entries and was armed. `vector` < [`SoftConfig::num_comp_vectors`].
    /// Like an MSI-X message of its own, it queues that vector's DPC
    /// (on the processor the vector is targeted to), never another's.
    ///
    /// IRQL: called at <= DISPATCH_LEVEL.
    fn comp_interrupt(&self, vector: u32);

    /// The command doorbell was written: in [`Execution::Deferred`] mode the
    /// host should call [`SoftHca::run_firmware`] soon.
    ///
    /// IRQL: called at <= DISPATCH_LEVEL.
    fn doorbell(&self);

    /// A ULP woke the doorbell poller (`IOCTL_IV_RING_DOORBELLS`): set the
    /// event the poller's thread sleeps on ([`PollerStep::Sleep`]). The
    /// default does nothing: right for a platform without a poller thread
    /// (every doorbell then costs the IOCTL, which scans the pages itself).
    ///
    /// IRQL: called at <= DISPATCH_LEVEL.
    fn wake_doorbell_poller(&self) {}

    /// [`Execution::Inline`]: a call ran its budget of data-path work
    /// ([`SoftConfig::dpc_budget`]) and work is left. The host calls
    /// [`SoftHca::resume`] soon, at DISPATCH_LEVEL, from a DPC of its own
    /// (queued here; never synchronously), as a driver requeues the rest of
    /// a bounded DPC.
    ///
    /// IRQL: called at <= DISPATCH_LEVEL.
    fn resume(&self);

    /// The data path did `packets` of work (sent and received) in the
    /// call running on this processor: what the host's DPC watchdog
    /// measures. Nothing by default.
    ///
    /// IRQL: called at <= DISPATCH_LEVEL.
    fn work(&self, packets: u64) {
        let _ = packets;
    }
}

/// A bus shared with the host that owns it: `Arc`, and
/// `irpverbs_ring::Shared` (a reference count allocated fallibly).
macro_rules! shared_bus {
    ($([$($generics:tt)*] $pointer:ty),*) => {$(
        impl<$($generics)*> SoftBus for $pointer {
            fn interrupt(&self) {
                (**self).interrupt();
            }
            fn comp_interrupt(&self, vector: u32) {
                (**self).comp_interrupt(vector);
            }
            fn doorbell(&self) {
                (**self).doorbell();
            }
            fn wake_doorbell_poller(&self) {
                (**self).wake_doorbell_poller();
            }
            fn resume(&self) {
                (**self).resume();
            }
            fn work(&self, packets: u64) {
                (**self).work(packets);
            }
        }
    )*};
}

shared_bus!([T: SoftBus + ?Sized] Arc<T>, [T: SoftBus] Shared<T>);

/// Completion vectors whose event queue's high water mark
/// [`SoftStats::comp_eq_high_water`] reports.
pub const COMP_EQ_STATS: usize = 8;

/// Counters for tools and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SoftStats {
    /// Commands executed (successful or not).
    pub commands_executed: u64,
    /// Commands executed that failed.
    pub commands_failed: u64,
    /// `post_command` calls refused because the command queue was full.
    pub commands_refused: u64,
    /// Commands waiting in the command queue now.
    pub commands_queued: usize,
    /// Most event queue entries ever held at once.
    pub eq_high_water: usize,
    /// Most entries ever held at once by each completion vector's event
    /// queue (the first [`COMP_EQ_STATS`] vectors).
    pub comp_eq_high_water: [usize; COMP_EQ_STATS],
    /// Packets the transport built (requests, responses, ACKs).
    pub packets_sent: u64,
    /// WQEs the loopback fast path executed (RC SEND, WRITE, READ and
    /// atomics to a QP of this HCA, nothing unusual in flight); the rest
    /// take the general engine.
    pub fast_path_wqes: u64,
    /// RC messages (SENDs, WRITEs, READ and atomic requests) the requester
    /// short-circuited to a QP of this HCA, without frames
    /// ([`SoftConfig::short_circuit`]).
    pub short_circuited: u64,
    /// Packets the transport processed.
    pub packets_received: u64,
    /// Packets dropped: no route, no such QP, wrong state or transport,
    /// Q_Key mismatch, no receive WQE (UC, UD), PSN out of sequence.
    pub packets_dropped: u64,
    /// RNR NAKs sent.
    pub rnr_naks: u64,
    /// Requests sent again after an RNR NAK.
    pub rnr_retries: u64,
    /// Requests sent again after a NAK or a missing response.
    pub retries: u64,
    /// Retries by cause: a sequence-error NAK, an implicit NAK (an ACK
    /// past a READ or atomic without its response), a READ response out of
    /// sequence, the local ACK timeout.
    pub retry_causes: [u64; 4],
    /// Completions not written because their CQ had overrun.
    pub cqes_lost: u64,
    /// Completion and async events lost to a full event queue.
    pub events_lost: u64,
    /// Doorbell pages allocated and not freed.
    pub doorbell_pages: usize,
    /// Doorbell page slots the scanner took that rang a queue.
    pub page_doorbells: u64,
    /// Doorbell page slots the scanner took that were bound to no queue
    /// (a stale slot, or garbage user mode wrote): ignored.
    pub stray_doorbells: u64,
    /// MADs the GSI (QP1) sent.
    pub mads_sent: u64,
    /// MADs the GSI received and queued for the driver.
    pub mads_received: u64,
    /// Packets to QP1 dropped: not a valid MAD (see [`MAD_QUEUE_DEPTH`]'s
    /// module: UD SEND ONLY, 256 bytes, the GSI Q_Key, base version 1), or
    /// the MAD queue was full.
    pub mads_dropped: u64,
    /// Packets dropped because the QP they were for does not believe them
    /// (not from its peer, a response to no request outstanding), by
    /// reason; also in `packets_dropped`.
    pub untrusted: TrustStats,
}

/// Datagrams for a link, and the tap that sees them.
type Transmit = (link::SharedLink, link::TxBatch, Option<Arc<dyn link::Tap>>);

/// The queue of datagram batches for links (under [`TX_LOCK`]).
#[derive(Default)]
struct TxQueue {
    batches: VecDeque<Transmit>,
    /// A thread is handing batches over.
    draining: bool,
    /// Transmitted batches, cleared with their capacity kept (at most
    /// [`TX_SPARES`]): the next serialization reuses one, so that a
    /// steady stream of packets allocates nothing.
    spare: Vec<link::TxBatch>,
}

/// How many transmitted batches [`TxQueue`] keeps for reuse (besides the
/// one the data path fills under `HCA_LOCK`): batches of other links, or
/// of another tap, may wait between them.
const TX_SPARES: usize = 16;

impl TxQueue {
    /// Queues `tx` for `link`: appended to the last batch queued when that
    /// is for the same link and tap and no thread has taken it yet (the
    /// batch is then recycled), so that however far the link falls behind,
    /// a few batches wait, each grown to its high-water mark. Growing is
    /// fallible: with no memory for it, `tx`'s datagrams are dropped (RC
    /// retransmits them) and their count returned.
    fn queue(
        &mut self,
        link: link::SharedLink,
        mut tx: link::TxBatch,
        tap: Option<Arc<dyn link::Tap>>,
    ) -> usize {
        let same_tap = |t: &Option<Arc<dyn link::Tap>>| match (t, &tap) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (a, b) => a.is_none() && b.is_none(),
        };
        if let Some((l, last, t)) = self.batches.back_mut() {
            if Shared::ptr_eq(l, &link) && same_tap(t) && last.append(&mut tx) {
                self.recycle(tx);
                return 0;
            }
        }
        if self.batches.try_reserve(1).is_err() {
            let lost = tx.len();
            self.recycle(tx);
            return lost;
        }
        self.batches.push_back((link, tx, tap));
        0
    }

    /// The largest spare batch, if any.
    fn spare(&mut self) -> Option<link::TxBatch> {
        let (at, _) = self
            .spare
            .iter()
            .enumerate()
            .max_by_key(|(_, b)| b.capacity())?;
        Some(self.spare.swap_remove(at))
    }

    /// Keeps `tx` (cleared) for reuse: while there is room, or in place
    /// of a smaller spare, so that the spares grow to the largest batches
    /// and stop reallocating. Never allocates (the spares' room is taken
    /// at device add).
    fn recycle(&mut self, mut tx: link::TxBatch) {
        tx.clear();
        if self.spare.len() < self.spare.capacity().min(TX_SPARES) {
            self.spare.push(tx);
        } else if let Some(small) = self
            .spare
            .iter_mut()
            .min_by_key(|b| b.capacity())
            .filter(|b| b.capacity() < tx.capacity())
        {
            *small = tx;
        }
    }
}

/// The queue of serialized datagrams (taken under `HCA_LOCK` to append,
/// alone to take; a leaf).
pub static TX_LOCK: LockClass = LockClass {
    name: "irpverbs.soft.tx",
    rank: 26,
};

/// The doorbell pages, for the scanner's first look (taken alone, and
/// under `HCA_LOCK` to add or remove a page; a leaf).
pub static DOORBELL_LOCK: LockClass = LockClass {
    name: "irpverbs.soft.doorbells",
    rank: 27,
};

/// The firmware and its command queue, under `HCA_LOCK`.
struct HcaState {
    queue: VecDeque<(u64, Command)>,
    depth: usize,
    /// In a box: 2 KiB, built there (see [`Firmware::new_boxed`]).
    firmware: alloc::boxed::Box<Firmware>,
    stats: SoftStats,
}

/// The software HCA's device: command interface, firmware, data path,
/// event queue.
pub struct SoftHca<P: Platform> {
    caps: IvQueryDeviceOut,
    execution: Execution,
    bus: Box<dyn SoftBus>,
    gid: Gid,
    /// The port's GID table, as configured (it never changes).
    port: firmware::port::Port,
    state: P::Lock<HcaState>,
    eq: P::Lock<EventQueue>,
    /// The completion event queues, one per completion vector.
    comp_eqs: Vec<P::Lock<EventQueue>>,
    /// Completion vectors whose interrupt is due (bit `v`): set under
    /// `HCA_LOCK` when an armed completion EQ gets an entry, taken and
    /// raised with no lock held ([`SoftHca::raise`]).
    comp_raise: core::sync::atomic::AtomicU64,
    inbox: P::Lock<Batch>,
    inbox_pending: AtomicBool,
    /// Datagrams serialized for links, in order, waiting to be handed over
    /// (see [`SoftHca::flush_tx`]).
    txq: P::Lock<TxQueue>,
    /// Batches may wait in `txq` (set after appending, cleared under its
    /// lock when found empty): a data-path step with nothing for a link
    /// skips the lock.
    tx_pending: AtomicBool,
    /// The data path's [`firmware::datapath::DataPath::attention`].
    attention: irpverbs_ring::Shared<core::sync::atomic::AtomicU32>,
    /// Every doorbell page, for [`SoftHca::poll_doorbells`]'s first look
    /// (the firmware's copy, with the slot bindings, is under `HCA_LOCK`).
    doorbell_pages: P::Lock<Vec<DoorbellPage>>,
    /// The poller polls the pages: what their `polling` words say (changed
    /// under `DOORBELL_LOCK`, see the `poller` module).
    pages_polled: AtomicBool,
    /// [`SoftConfig::dpc_budget`].
    budget: u64,
}

impl<P: Platform> core::fmt::Debug for SoftHca<P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SoftHca")
            .field("execution", &self.execution)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl<P: Platform> SoftHca<P> {
    /// A device described by `config`, attached to `bus` (which it owns,
    /// in a box allocated fallibly), with locks from `platform`. Allocates
    /// its queues now.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER` when [`SoftConfig::validate`] refuses
    /// `config`; `STATUS_INSUFFICIENT_RESOURCES` when memory for the bus's
    /// box, the queues and the tables is short (nothing is left allocated
    /// then).
    // An entry of the stack budget (docs/stack-budget.md): kept out of
    // line so that the checker finds it by name.
    #[inline(never)]
    pub fn new(
        platform: &P,
        config: SoftConfig,
        bus: impl SoftBus + 'static,
    ) -> Result<Self, NtStatus> {
        let bus: Box<dyn SoftBus> =
            irpverbs_ring::try_box(bus).map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        Self::with_bus(platform, config, bus)
    }

    /// [`Self::new`] with the bus boxed.
    fn with_bus(platform: &P, config: SoftConfig, bus: Box<dyn SoftBus>) -> Result<Self, NtStatus> {
        config.validate()?;
        let attention = irpverbs_ring::Shared::try_new(core::sync::atomic::AtomicU32::new(0))
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        let caps = firmware::device_caps(&config);
        let (execution, cmd_queue_depth, eq_depth, budget) = (
            config.execution,
            config.cmd_queue_depth,
            config.eq_depth,
            u64::from(config.dpc_budget),
        );
        let mut queue = VecDeque::new();
        queue
            .try_reserve_exact(cmd_queue_depth)
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        let eq = EventQueue::new(eq_depth)?;
        let mut comp_eqs = Vec::new();
        comp_eqs
            .try_reserve_exact(config.num_comp_vectors as usize)
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        for _ in 0..config.num_comp_vectors {
            comp_eqs.push(platform.new_lock(&EQ_LOCK, EventQueue::new(eq_depth)?));
        }
        let state = HcaState {
            queue,
            depth: cmd_queue_depth,
            firmware: Firmware::new_boxed(config, attention)?,
            stats: SoftStats::default(),
        };
        Ok(Self {
            caps,
            execution,
            bus,
            gid: state.firmware.dp.gid,
            port: state.firmware.port.clone(),
            attention: state.firmware.dp.attention.clone(),
            state: platform.new_lock(&HCA_LOCK, state),
            eq: platform.new_lock(&EQ_LOCK, eq),
            comp_eqs,
            comp_raise: core::sync::atomic::AtomicU64::new(0),
            inbox: platform.new_lock(&INBOX_LOCK, Batch::default()),
            inbox_pending: AtomicBool::new(false),
            txq: platform.new_lock(
                &TX_LOCK,
                TxQueue {
                    spare: firmware::shared::vec_with_capacity(TX_SPARES)?,
                    ..TxQueue::default()
                },
            ),
            tx_pending: AtomicBool::new(false),
            doorbell_pages: platform.new_lock(&DOORBELL_LOCK, Vec::new()),
            pages_polled: AtomicBool::new(false),
            budget,
        })
    }

    /// The port's GID 0 (from [`SoftConfig::ip`]): how a [`Fabric`] and
    /// address vectors name this HCA.
    ///
    /// IRQL: any.
    pub fn gid(&self) -> [u8; 16] {
        self.gid
    }

    /// True if `gid` is one of the port's GIDs: [`SoftHca::gid`] or an
    /// alias ([`SoftConfig::aliases`]).
    ///
    /// IRQL: any.
    pub fn owns_gid(&self, gid: &[u8; 16]) -> bool {
        self.port.owns(gid)
    }

    /// Cables the port to a datagram wire: packets for GIDs that are
    /// neither this HCA's nor an HCA's on its fabric go to `link`, as
    /// RoCEv2 UDP datagrams (see [`link`]). QPs talking over it keep their
    /// local ACK and RNR timers on `link`'s clock.
    ///
    /// The HCA owns `link` until [`Self::detach_link`] or its drop, in a
    /// box and a reference count it allocates fallibly; refused, `link` is
    /// dropped.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES`; `STATUS_INVALID_PARAMETER` when a
    /// link is attached already.
    pub fn attach_link(&self, link: impl Link + 'static) -> Result<(), NtStatus> {
        let link: Box<dyn Link> =
            irpverbs_ring::try_box(link).map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        let link = Shared::try_new(link).map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        self.state.lock(|st| {
            let dp = &mut st.firmware.dp;
            if dp.link.is_some() {
                return Err(STATUS_INVALID_PARAMETER);
            }
            dp.now = dp.now.max(link.now_ns());
            dp.link = Some(link);
            Ok(())
        })
    }

    /// Gives the transport the platform's clock and timer ([`Clock`]):
    /// from now on every RC QP keeps its local ACK and RNR timers, whatever
    /// its destination, so that a request nothing answers (a QP that does
    /// not exist, a lost packet, a peer gone) or an RNR wait with a finite
    /// `rnr_retry` ends as IBTA says, with or without a link. The platform's
    /// timer calls [`Self::advance_clock`] at the deadlines [`Clock::arm`]
    /// asks for.
    ///
    /// The HCA owns `clock` (a box the caller allocated fallibly, counted
    /// here in an `irpverbs_ring::Shared` allocated fallibly too) until
    /// [`Self::detach_clock`] or its drop; refused, `clock` is dropped.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES`; `STATUS_INVALID_PARAMETER` when a
    /// clock is attached already.
    pub fn attach_clock(&self, clock: Box<dyn Clock>) -> Result<(), NtStatus> {
        let clock = Shared::try_new(clock).map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        self.state.lock(|st| {
            let dp = &mut st.firmware.dp;
            if dp.clock.is_some() {
                return Err(STATUS_INVALID_PARAMETER);
            }
            dp.clock = Some(clock);
            dp.clock_armed = None;
            Ok(())
        })
    }

    /// Takes the platform's clock away again (before the platform's timer
    /// goes): timers keep running only for destinations on a link.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    pub fn detach_clock(&self) {
        self.state.lock(|st| {
            st.firmware.dp.clock = None;
            st.firmware.dp.clock_armed = None;
        });
    }

    /// Sets (or clears) what sees every datagram sent to and received
    /// from the link.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    pub fn set_tap(&self, tap: Option<Arc<dyn link::Tap>>) {
        self.state.lock(|st| st.firmware.dp.tap = tap);
    }

    /// Takes the port's link down (`up` false) or brings it up: the link
    /// model of [`firmware::port`]. A change raises `PORT_ERR` (down) or
    /// `PORT_ACTIVE` (up) through the event queue, and `QueryPort` reports
    /// the state. Down, nothing is transmitted and what arrives is
    /// dropped; RC QPs with work run out their retries. Returns whether the
    /// state changed (taking a down port down raises nothing, and a fatal
    /// device's port stays down).
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    pub fn set_port_link(&self, up: bool) -> bool {
        self.run(0, true, |st| {
            let dp = &mut st.firmware.dp;
            if dp.link_down != up || dp.fatal {
                // No change (a fatal device's port stays down).
                return (false, false);
            }
            dp.link_down = !up;
            dp.raise(if up {
                irpverbs_core::AsyncEvent::PortActive(firmware::port::PORT_NUM)
            } else {
                irpverbs_core::AsyncEvent::PortError(firmware::port::PORT_NUM)
            });
            (true, false)
        })
    }

    /// A doorbell page on `memory`, a page of the device's own (the model
    /// HCA's BAR 2: its UAR pages), which the firmware zeroes and then
    /// scans like a page of its own; the driver maps the same memory into
    /// the process. Freed with `Hca::free_doorbell_page`; the memory is the
    /// caller's again once the page is freed and every view of it let go.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER` for memory smaller than a doorbell page
    /// or not 8-byte aligned; `STATUS_INSUFFICIENT_RESOURCES`.
    pub fn alloc_doorbell_page_on(
        &self,
        memory: Shared<irpverbs_ring::Region>,
    ) -> Result<DoorbellPageInfo, NtStatus> {
        self.open_doorbell_page(Some(memory))
    }

    /// A doorbell page, on `memory` when given; watched by the poller.
    fn open_doorbell_page(
        &self,
        memory: Option<Shared<irpverbs_ring::Region>>,
    ) -> Result<DoorbellPageInfo, NtStatus> {
        self.state.lock(|st| {
            let (page, memory) = st.firmware.doorbells.alloc_on(memory)?;
            let watched = self.doorbell_pages.lock(|pages| {
                memory.set_polling(self.pages_polled.load(Ordering::Relaxed));
                pages
                    .try_reserve(1)
                    .map(|()| pages.push(memory.clone()))
                    .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)
            });
            if let Err(status) = watched {
                st.firmware.doorbells.free(page);
                return Err(status);
            }
            Ok(DoorbellPageInfo {
                page,
                region: memory.region().clone(),
            })
        })
    }

    /// Executes `command` on queue memory the caller gives instead of
    /// memory the firmware allocates: `rings[0]` for a CQ's ring (create
    /// or resize), an SRQ's or a QP's send queue, `rings[1]` for a QP's
    /// receive queue. This is a device whose engine the firmware is,
    /// running on queues its driver allocated (the model HCA): the memory
    /// is the device's view of the driver's. A create or resize given no
    /// memory for a ring it makes, or too little, fails with
    /// `STATUS_INVALID_PARAMETER` (after the firmware's own checks of the
    /// command); memory given and not used is dropped before this returns,
    /// and the firmware lets go of a queue's memory when the queue is
    /// destroyed or resized away from it, never keeping it for reuse. The
    /// command's [`Event::CommandDone`] carries `token`.
    ///
    /// In [`Execution::Inline`] mode only, and with no command queued
    /// before it: it executes now or not at all.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    ///
    /// # Errors
    /// Gives `command` back (and drops `rings`) when it cannot execute
    /// now: the engine is deferred, a command waits before it, or the event
    /// queue has no room for its events.
    pub fn post_command_on_rings(
        &self,
        token: u64,
        command: Command,
        rings: [Option<Shared<irpverbs_ring::Region>>; 2],
    ) -> Result<(), Command> {
        if self.execution != Execution::Inline {
            return Err(command);
        }
        self.run(0, true, |st| {
            if !st.queue.is_empty() {
                return (Err(command), false);
            }
            st.firmware.rings.given = Some(rings);
            let executed = self.execute_command(st, token, command);
            st.firmware.rings.given = None;
            match executed {
                Ok(raise) => {
                    let (_, r) = self.execute_queued(st);
                    (Ok(()), raise | r)
                }
                Err((_, back)) => (Err(back), false),
            }
        })
    }

    /// A firmware error, injected: the device becomes fatal, as a real
    /// HCA in internal error. Every QP goes to ERR and its outstanding
    /// work requests complete with `WR_FLUSH_ERR` (later ones too, as on
    /// any QP in ERR); `DEVICE_FATAL` is raised; from then on every command
    /// but the destroys (`DeallocPd`, `DeregMr`, `DestroyCq`, `DestroySrq`,
    /// `DestroyQp`, `DestroyAh`, which succeed, so that files close and the
    /// driver unloads cleanly) fails with `STATUS_DEVICE_HARDWARE_ERROR`,
    /// and the port neither transmits nor receives. Returns false if the
    /// device was fatal already (nothing is raised again).
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    pub fn inject_fatal_error(&self) -> bool {
        self.run(0, true, |st| {
            let fw = &mut st.firmware;
            if fw.dp.fatal {
                return (false, false);
            }
            fw.dp.fatal = true;
            fw.dp.link_down = true;
            let (qps, mut env) = fw.split();
            for (qpn, qp) in qps.iter_mut() {
                transport::engine::enter_error(qpn, qp, &mut env, None);
            }
            fw.dp.raise(irpverbs_core::AsyncEvent::DeviceFatal);
            (true, false)
        })
    }

    /// Whether the port's link is up ([`SoftHca::set_port_link`]).
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    pub fn port_link_up(&self) -> bool {
        self.state.lock(|st| !st.firmware.dp.link_down)
    }

    /// Uncables the port: packets for the wire are lost from now on (RC
    /// QPs time out).
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    pub fn detach_link(&self) {
        self.state.lock(|st| st.firmware.dp.link = None);
    }

    /// [`Self::receive`] without running the data path: the datagram waits
    /// for [`Self::run_deferred`] (or any other run), so that a batch of
    /// datagrams is processed in one go.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    ///
    /// # Errors
    /// As [`Self::receive`].
    pub fn receive_queued(&self, d: &Datagram<'_>) -> Result<(), wire::WireError> {
        let ip = d.ip();
        let parsed = wire::parse_transport(d.payload, &ip);
        let mut tap = None;
        let queued = self.state.lock(|st| {
            let dp = &mut st.firmware.dp;
            if dp.link_down {
                // A port whose link is down receives nothing.
                dp.stats.packets_dropped += 1;
                return Ok(());
            }
            tap.clone_from(&dp.tap);
            // A datagram to another UDP port than the one it serves is not
            // this HCA's (a socket bound to the port never sees one).
            let parsed = if d.dst_port == dp.udp_port {
                parsed
            } else {
                Err(wire::WireError::NotRoce)
            };
            let (pkt, payload) = match parsed {
                Ok(p) => p,
                Err(e) => {
                    dp.link_stats.rx_dropped.count(e);
                    return Err(e);
                }
            };
            // Straight onto the inbound batch (its vectors keep their
            // capacity between runs: no allocation per datagram; growing to
            // a new high-water mark is fallible, and without memory the
            // datagram is dropped as without a receive buffer).
            if !dp.inbound.room_for(1, 1) {
                dp.link_stats.rx_no_buffer += 1;
                return Err(wire::WireError::Truncated);
            }
            let seg = u32::try_from(dp.inbound.segs.len()).unwrap_or(u32::MAX);
            if !payload.is_empty() {
                let Some(region) = dp.rx.take(payload) else {
                    dp.link_stats.rx_no_buffer += 1;
                    return Err(wire::WireError::Truncated);
                };
                dp.inbound.segs.push(packet::Seg {
                    region,
                    offset: 0,
                    len: payload.len(),
                });
            }
            dp.link_stats.rx_datagrams += 1;
            dp.link_stats.rx_dropped.accepted += 1;
            dp.inbound.frames.push(Frame::Packet {
                pkt,
                burst: packet::Burst::one(pkt.opcode),
                seg,
                nsegs: u32::from(!payload.is_empty()),
                notify: None,
            });
            Ok(())
        });
        if let Some(tap) = tap {
            tap.tap(link::Direction::Received, d);
        }
        queued
    }

    /// Hands every datagram waiting for the link to it now.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    pub fn flush_transmit(&self) {
        self.flush_tx();
    }

    /// The earliest armed timer's deadline (on the link's clock).
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    pub fn next_deadline(&self) -> Option<u64> {
        self.state.lock(|st| st.firmware.next_deadline())
    }

    /// The wire's counters.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    pub fn link_stats(&self) -> LinkStats {
        self.state.lock(|st| {
            let dp = &st.firmware.dp;
            LinkStats {
                rx_buffers: dp.rx.len() as u64,
                ..dp.link_stats
            }
        })
    }

    /// Gives the data path a router (a fabric), or takes it away.
    fn set_router(&self, router: Option<Arc<dyn Router>>) -> Result<(), NtStatus> {
        self.state.lock(|st| {
            let dp = &st.firmware.dp;
            if router.is_some() && dp.router.is_some() {
                return Err(STATUS_INVALID_PARAMETER);
            }
            st.firmware.set_router(router);
            Ok(())
        })
    }

    /// Executes the oldest queued command if the event queue has room for
    /// its events; `None` when the queue is empty or the event queue full.
    /// The command is taken, executed and its events queued (with the data
    /// path's events it caused) under one hold of `HCA_LOCK`, so
    /// completions keep the commands' order whoever runs the firmware.
    /// `Some(raise the interrupt)`.
    fn execute_one(&self, st: &mut HcaState) -> Option<bool> {
        let (token, command) = st.queue.pop_front()?;
        match self.execute_command(st, token, command) {
            Ok(raise) => Some(raise),
            Err(back) => {
                st.queue.push_front(back);
                None
            }
        }
    }

    /// Executes `command` if the event queue has room for its events (else
    /// gives it back), queueing its events and the data path's it caused;
    /// `Ok(raise the interrupt)`.
    fn execute_command(
        &self,
        st: &mut HcaState,
        token: u64,
        command: Command,
    ) -> Result<bool, (u64, Command)> {
        if !self.eq.lock(|eq| eq.try_reserve(EVENTS_PER_COMMAND)) {
            return Err((token, command));
        }
        let Executed { status, out, event } =
            st.firmware.execute::<transport::engine::Engine>(command);
        let stats = &mut st.stats;
        stats.commands_executed += 1;
        if !nt_success(status) {
            stats.commands_failed += 1;
        }
        let raise = self.eq.lock(|eq| {
            let mut raise = eq.push_reserved(Event::CommandDone { token, status, out });
            let mut used = 1;
            if let Some(event) = event {
                raise |= eq.push_reserved(Event::Async(event));
                used += 1;
            }
            eq.release(EVENTS_PER_COMMAND - used);
            raise
        });
        Ok(raise | self.queue_events(&mut st.firmware, stats))
    }

    /// The doorbell scanner: takes every slot rung on every doorbell page
    /// since the last call and rings the doorbell of the queue each is bound
    /// to, as the direct-call doorbells would: inline, the work runs now, on
    /// this thread; deferred, the hardware thread is woken. Returns how many
    /// slots rang a queue. The doorbell poller calls it
    /// ([`SoftHca::poll_doorbells_step`], from a platform thread), and so
    /// does `IOCTL_IV_RING_DOORBELLS`: user-mode ULPs ring through their
    /// doorbell page with no system call, and this is how the soft HCA,
    /// which has no MMIO to trap the writes, notices. See the `doorbell`
    /// and `poller` modules.
    ///
    /// Cheap when nothing was rung: one spin lock and one load per page.
    /// Callable concurrently (the poller and an IOCTL on two processors).
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    pub fn poll_doorbells(&self) -> usize {
        if !self
            .doorbell_pages
            .lock(|pages| pages.iter().any(DoorbellPage::peek))
        {
            return 0;
        }
        let (scan, raise, work) = self.state.lock(|st| {
            let before = st.firmware.dp.work_done();
            let fast = matches!(self.execution, Execution::Inline)
                && !self.inbox_pending.load(Ordering::Acquire);
            let mut scan = st
                .firmware
                .scan_doorbells(|fw, target| fw.ring_target(target, fast));
            // What the fast path left for the engine, as after the direct
            // doorbell.
            scan.work |= st.firmware.dp.left_for_engine();
            // An armed CQ with completions: its event goes out now.
            let raise = self.push_events(&mut st.firmware, &mut st.stats);
            (scan, raise, st.firmware.dp.work_done() - before)
        });
        self.bus.work(work);
        self.raise(raise);
        if scan.work {
            match self.execution {
                Execution::Inline => self.run_after(work),
                Execution::Deferred => self.bus.doorbell(),
            }
        }
        scan.rung
    }

    /// Counters.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    pub fn stats(&self) -> SoftStats {
        let mut stats = self.state.lock(|st| {
            let d = st.firmware.dp.stats;
            SoftStats {
                commands_queued: st.queue.len(),
                packets_sent: d.packets_sent,
                fast_path_wqes: d.fast_path_wqes,
                short_circuited: d.short_circuited,
                packets_received: d.packets_received,
                packets_dropped: d.packets_dropped,
                rnr_naks: d.rnr_naks,
                rnr_retries: d.rnr_retries,
                retries: d.retries,
                retry_causes: d.retry_causes,
                cqes_lost: d.cqes_lost,
                events_lost: st.stats.events_lost + d.events_lost,
                untrusted: d.trust,
                doorbell_pages: st.firmware.doorbells.len(),
                page_doorbells: st.firmware.doorbells.rung,
                stray_doorbells: st.firmware.doorbells.stray,
                mads_sent: st.firmware.dp.gsi.sent,
                mads_received: st.firmware.dp.gsi.received,
                mads_dropped: st.firmware.dp.gsi.dropped,
                ..st.stats
            }
        });
        stats.eq_high_water = self.eq.lock(|eq| eq.high_water());
        for (v, eq) in self.comp_eqs.iter().enumerate() {
            let high = eq.lock(|eq| eq.high_water());
            if let Some(slot) = stats.comp_eq_high_water.get_mut(v) {
                *slot = high;
            }
        }
        stats
    }

    /// PDs, MRs, CQs, SRQs, QPs and AHs alive in the firmware: 0 once the
    /// driver destroyed everything, or something leaked.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    pub fn live_objects(&self) -> usize {
        self.state.lock(|st| st.firmware.live_objects())
    }

    /// Work is waiting: commands, frames in the inbox or the engine, ready
    /// send queues (tests only).
    #[cfg(test)]
    pub(crate) fn busy(&self) -> bool {
        self.inbox_pending.load(Ordering::Acquire)
            || self
                .state
                .lock(|st| !st.queue.is_empty() || st.firmware.dp.has_work())
    }

    /// Moves the data path's events to their event queues (under
    /// `HCA_LOCK`): a CQ's [`Event::Completion`] to its vector's EQ, the
    /// rest to EQ 0. Returns whether to raise EQ 0's interrupt; the
    /// completion vectors due are marked for [`SoftHca::raise`]. A lost
    /// [`Event::Mad`] clears `gsi.announced`, so that the next MAD
    /// announces again. Allocates nothing.
    pub(crate) fn queue_events(&self, fw: &mut Firmware, stats: &mut SoftStats) -> bool {
        let mut raise = false;
        let mut comp = 0u64;
        let Firmware { dp, cqs, .. } = fw;
        for e in dp.events.drain(..) {
            let mad = e == Event::Mad;
            let pushed = match e {
                Event::Completion { cqn } => {
                    // A CQ destroyed since has nobody to tell (the driver
                    // ignores an unknown CQN): EQ 0 then.
                    let vector = cqs.get(cqn).map_or(None, |cq| {
                        self.comp_eqs
                            .get(cq.comp_vector as usize)
                            .map(|q| (cq.comp_vector, q))
                    });
                    match vector {
                        Some((v, q)) => q.lock(|q| q.push(e)).map(|r| {
                            if r {
                                comp |= 1 << v;
                            }
                        }),
                        None => self.eq.lock(|q| q.push(e)).map(|r| raise |= r),
                    }
                }
                _ => self.eq.lock(|q| q.push(e)).map(|r| raise |= r),
            };
            if pushed.is_none() {
                stats.events_lost += 1;
                if mad {
                    dp.gsi.announced = false;
                }
            }
        }
        if comp != 0 {
            self.comp_raise.fetch_or(comp, Ordering::AcqRel);
        }
        raise
    }

    /// Raises the interrupts due, with no soft HCA lock held: EQ 0's when
    /// `eq0`, and every completion vector's marked by
    /// [`SoftHca::queue_events`] (whoever marked it).
    pub(crate) fn raise(&self, eq0: bool) {
        if eq0 {
            self.bus.interrupt();
        }
        if self.comp_raise.load(Ordering::Acquire) != 0 {
            let mut due = self.comp_raise.swap(0, Ordering::AcqRel);
            while due != 0 {
                let v = due.trailing_zeros();
                due &= due - 1;
                self.bus.comp_interrupt(v);
            }
        }
    }

    /// Runs `f` on the firmware state (tests only).
    #[cfg(test)]
    pub(crate) fn with_firmware<R>(&self, f: impl FnOnce(&mut Firmware) -> R) -> R {
        self.state.lock(|st| f(&mut st.firmware))
    }
}

impl<P: Platform> Hca for SoftHca<P> {
    /// Device attributes from the [`SoftConfig`].
    ///
    /// IRQL: any.
    fn caps(&self) -> &IvQueryDeviceOut {
        &self.caps
    }

    /// Queues `command`; in [`Execution::Inline`] mode executes it (and
    /// anything queued before it) before returning unless the event queue
    /// is full (then the poll that makes room executes it), in
    /// [`Execution::Deferred`] mode rings the doorbell. Its
    /// [`Event::CommandDone`] carries `token`.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    ///
    /// # Errors
    /// Gives `command` back when `cmd_queue_depth` commands are queued.
    fn post_command(&self, token: u64, command: Command) -> Result<(), Command> {
        if self.execution == Execution::Deferred {
            self.state.lock(|st| {
                if st.queue.len() >= st.depth {
                    st.stats.commands_refused += 1;
                    return Err(command);
                }
                st.queue.push_back((token, command));
                Ok(())
            })?;
            self.bus.doorbell();
            return Ok(());
        }
        // Inline, the firmware runs now, under the same hold: this command
        // straight away when none waits before it.
        self.run(0, true, |st| {
            if st.queue.len() >= st.depth {
                st.stats.commands_refused += 1;
                return (Err(command), false);
            }
            let mut raise = false;
            if st.queue.is_empty() {
                match self.execute_command(st, token, command) {
                    Ok(r) => raise = r,
                    Err(back) => st.queue.push_back(back),
                }
            } else {
                st.queue.push_back((token, command));
            }
            let (_, r) = self.execute_queued(st);
            (Ok(()), raise | r)
        })
    }

    /// Takes the oldest event. If the firmware had stalled for room, kicks
    /// it again (so in [`Execution::Inline`] mode this may execute commands
    /// and interrupt).
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    fn poll_event(&self) -> Option<Event> {
        let (event, kick) = self.eq.lock(EventQueue::pop);
        if kick {
            self.kick();
        }
        event
    }

    /// [`Self::poll_event`] for a batch, in one hold of the event queue's
    /// lock.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    fn poll_events(&self, out: &mut [Option<Event>]) -> usize {
        let (n, kick) = self.eq.lock(|eq| {
            let mut n = 0;
            let mut kick = false;
            for slot in out.iter_mut() {
                let (event, k) = eq.pop();
                kick |= k;
                let Some(event) = event else { break };
                *slot = Some(event);
                n += 1;
            }
            (n, kick)
        });
        if kick {
            self.kick();
        }
        n
    }

    /// Arms the event queue: its next entry raises the interrupt. With
    /// entries pending, interrupts at once instead (and stays disarmed).
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    fn arm_event_queue(&self) {
        if self.eq.lock(EventQueue::arm) {
            self.bus.interrupt();
        }
    }

    /// The completion vectors: one event queue each.
    ///
    /// IRQL: any.
    fn comp_event_queues(&self) -> u32 {
        self.caps.num_comp_vectors
    }

    /// [`Self::poll_events`] for completion vector `vector`'s event queue
    /// (only [`Event::Completion`]s of CQs on that vector). 0 for a vector
    /// the HCA does not have.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    fn poll_comp_events(&self, vector: u32, out: &mut [Option<Event>]) -> usize {
        let Some(q) = self.comp_eqs.get(vector as usize) else {
            return 0;
        };
        q.lock(|eq| {
            let mut n = 0;
            for slot in out.iter_mut() {
                let Some(event) = eq.pop().0 else { break };
                *slot = Some(event);
                n += 1;
            }
            n
        })
    }

    /// Arms completion vector `vector`'s event queue: its next entry
    /// raises [`SoftBus::comp_interrupt`]; with entries pending, interrupts
    /// at once instead. A vector the HCA does not have is ignored.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    fn arm_comp_event_queue(&self, vector: u32) {
        let Some(q) = self.comp_eqs.get(vector as usize) else {
            return;
        };
        if q.lock(EventQueue::arm) {
            self.bus.comp_interrupt(vector);
        }
    }

    /// Schedules QP `qpn`'s send queue: inline, its new WQEs run (and their
    /// responses, and every completion they cause) before this returns;
    /// deferred, the hardware thread runs them. A doorbell for no QP is
    /// ignored.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    fn sq_doorbell(&self, qpn: u32) {
        match self.execution {
            // One lock hold runs the QP's WQEs (the fast path, then the
            // requester for what it leaves: with a peer of this HCA its
            // responder and completer too, short-circuited) and queues
            // their events; the engine runs only for what they leave
            // (frames, a QP that used up its budget on the ready list).
            Execution::Inline => {
                let quick = self.state.lock(|st| {
                    if self.inbox_pending.load(Ordering::Acquire) {
                        return None;
                    }
                    let before = st.firmware.dp.work_done();
                    st.firmware.ring_sq_now(qpn);
                    let more = st.firmware.dp.left_for_engine();
                    let raise = self.push_events(&mut st.firmware, &mut st.stats);
                    Some((raise, more, st.firmware.dp.work_done() - before))
                });
                match quick {
                    Some((raise, more, work)) => {
                        self.bus.work(work);
                        self.raise(raise);
                        if more {
                            self.run_after(work);
                        }
                    }
                    None => self.run(0, true, |st| (st.firmware.ring_sq_now(qpn), false)),
                }
            }
            Execution::Deferred => self.doorbell(|fw| fw.ring_sq(qpn)),
        }
    }

    /// QP `qpn` got receive WQEs: a QP in ERR flushes them; a responder
    /// that sent an RNR NAK lets its requester retry.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    fn rq_doorbell(&self, qpn: u32) {
        if self.quiet() {
            return;
        }
        self.doorbell(|fw| fw.ring_rq(qpn));
    }

    /// SRQ `srqn` got WQEs: requesters that got an RNR NAK from its QPs
    /// may retry.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    fn srq_doorbell(&self, srqn: u32) {
        if self.quiet() {
            return;
        }
        self.doorbell(|fw| fw.ring_srq(srqn));
    }

    /// A zeroed page of [`irpverbs_abi::IV_DOORBELL_SLOTS`] slots, scanned
    /// by [`SoftHca::poll_doorbells`] from now on.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES` when memory is short.
    fn alloc_doorbell_page(&self) -> Result<DoorbellPageInfo, NtStatus> {
        self.open_doorbell_page(None)
    }

    /// Scans the doorbell pages now and wakes the doorbell poller (see
    /// the `poller` module).
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    fn ring_doorbell_pages(&self) -> Result<(), NtStatus> {
        self.wake_doorbells();
        Ok(())
    }

    /// Stops scanning page `page` and forgets its bindings.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    fn free_doorbell_page(&self, page: u32) {
        self.state.lock(|st| {
            if let Some(memory) = st.firmware.doorbells.free(page) {
                self.doorbell_pages
                    .lock(|pages| pages.retain(|p| *p != memory));
            }
        });
    }

    /// Binds a live queue to a free slot of `page` (see the `doorbell`
    /// module); the queue's destroy ends the binding.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    ///
    /// # Errors
    /// `STATUS_INVALID_HANDLE` for a queue that does not exist;
    /// `STATUS_INVALID_PARAMETER` for a page that does not exist or a queue
    /// bound to another page; `STATUS_INSUFFICIENT_RESOURCES` when the page
    /// is full.
    fn bind_doorbell(&self, page: u32, target: DoorbellTarget) -> Result<u32, NtStatus> {
        self.state
            .lock(|st| st.firmware.bind_doorbell(page, target))
    }

    /// The driver removed the device: every object goes without a command
    /// (the driver forgot them), and with them the commands not yet
    /// executed (which may carry a registration's region), so every pin of
    /// registered memory ends now and no ring is touched again (a doorbell
    /// or a packet for a QP that is gone is ignored); inbound packets not
    /// yet processed go too. Rings mapped into processes or viewed by
    /// kernel ULPs stay allocated while those hold them.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    fn device_removed(&self) {
        let (mut queued, mrs) = self.state.lock(|st| {
            let queued = core::mem::take(&mut st.queue);
            (queued, st.firmware.drop_all())
        });
        let inbound = self.inbox.lock(core::mem::take);
        self.inbox_pending.store(false, Ordering::Release);
        queued.clear();
        drop((mrs, inbound));
        // The command queue's room goes back (the destroys that follow a
        // removal are queued in it, and must not allocate).
        self.state.lock(|st| {
            if st.queue.is_empty() {
                core::mem::swap(&mut st.queue, &mut queued);
            }
        });
    }

    /// CQ `cqn` was armed: when completions it would fire for wait
    /// unpolled, fires at once (and disarms).
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    fn cq_arm_doorbell(&self, cqn: u32) {
        let raise = self.state.lock(|st| {
            st.firmware.arm_cq(cqn);
            self.push_events(&mut st.firmware, &mut st.stats)
        });
        self.raise(raise);
    }

    /// Sends a MAD from QP1 (see the `gsi` module in the crate's source:
    /// a RoCEv2 UD SEND ONLY with a DETH, Q_Key 0x80010000, source QP 1).
    /// Inline, the data path carries it now; deferred, the hardware
    /// thread is woken.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    fn send_mad(&self, mad: &MadOut) -> Result<(), NtStatus> {
        self.state.lock(|st| st.firmware.send_mad(mad))?;
        self.run_deferred(true);
        Ok(())
    }

    /// The oldest MAD QP1 received ([`Event::Mad`] announced it).
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    fn poll_mad(&self) -> Option<MadIn> {
        self.state.lock(|st| st.firmware.dp.gsi.poll())
    }
}

impl<P: Platform> Peer for SoftHca<P> {
    fn accept(&self, batch: &mut Batch) -> bool {
        self.inbox.lock(|ib| {
            let taken = if ib.is_empty() {
                // The sender's vectors move in (no allocation), the
                // inbox's empty ones out.
                core::mem::swap(ib, batch);
                true
            } else {
                ib.append(batch)
            };
            self.inbox_pending.store(true, Ordering::Release);
            taken
        })
    }

    fn inline(&self) -> bool {
        self.execution == Execution::Inline
    }

    fn ring(&self) {
        self.bus.doorbell();
    }

    fn requeue(&self) {
        SoftHca::requeue(self);
    }

    fn step(&self, todo: &mut Todo) -> (bool, u64) {
        let ((), more, work) = SoftHca::step(self, todo, true, |_| ((), false));
        (more, work)
    }

    fn id(&self) -> usize {
        core::ptr::from_ref(self).addr()
    }
}
