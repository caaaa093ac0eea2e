//! The data path's state (under `HCA_LOCK`, beside the object tables):
//! the ready list, the frames in flight between the transport's roles and
//! to other HCAs, the events for the event queue, the timers, the link's
//! buffers and the counters. The firmware creates it and keeps its lists
//! room for every object (so that the data path never grows them); the
//! transport (`crate::transport::engine`) runs it.

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::sync::{Arc, Weak};
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU32, Ordering};

use irpverbs_abi::{NtStatus, STATUS_INSUFFICIENT_RESOURCES};
use irpverbs_core::{AsyncEvent, Event, MadIn};
use irpverbs_ring::{Region, Shared};

use crate::net::fabric::{Peer, Router};
use crate::net::link::{LinkStats, RxPool, TxBatch};
use crate::wire::packet::{Batch, Gid};

/// Packets for one destination HCA.
#[derive(Clone, Debug)]
pub(crate) struct OutQueue {
    /// Its GID.
    pub(crate) dgid: Gid,
    /// The router generation `peer` was resolved in.
    pub(crate) generation: u64,
    /// The HCA (`None`: no HCA has the GID).
    pub(crate) peer: Option<Weak<dyn Peer>>,
    /// The frames.
    pub(crate) batch: Batch,
}

/// Counters, written for every message by whichever processor runs the
/// data path: on cache lines of their own, away from the state the fast
/// path only reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(align(128))]
pub(crate) struct DpStats {
    /// Packets built by requesters and responders.
    pub(crate) packets_sent: u64,
    /// WQEs the loopback fast path executed end to end.
    pub(crate) fast_path_wqes: u64,
    /// Messages short-circuited between two QPs of this HCA
    /// ([`crate::transport::local`]).
    pub(crate) short_circuited: u64,
    /// Packets processed.
    pub(crate) packets_received: u64,
    /// Packets dropped: no route, no such QP, wrong state or transport,
    /// Q_Key mismatch, UC/UD without a receive WQE, PSN out of sequence.
    pub(crate) packets_dropped: u64,
    /// RNR NAKs sent.
    pub(crate) rnr_naks: u64,
    /// Retransmissions after an RNR NAK.
    pub(crate) rnr_retries: u64,
    /// Retransmissions after a NAK (sequence error) or a missing response.
    pub(crate) retries: u64,
    /// Retries by cause (see `completer::retry_by`).
    pub(crate) retry_causes: [u64; 4],
    /// Completions not written: their CQ had overrun.
    pub(crate) cqes_lost: u64,
    /// Events lost before the event queue: more in one step than the
    /// event list had room for, and no memory to grow it.
    pub(crate) events_lost: u64,
    /// Packets dropped as untrusted, by reason.
    pub(crate) trust: crate::firmware::datapath::TrustStats,
}

/// The data path's state, beside the firmware's tables (under `HCA_LOCK`).
#[derive(Clone)]
pub(crate) struct DataPath {
    /// The port's GID: frames to it are loopback.
    pub(crate) gid: Gid,
    /// The port's link is down ([`crate::SoftHca::set_port_link`]): the
    /// port transmits nothing and drops what it receives.
    pub(crate) link_down: bool,
    /// A firmware error made the device fatal
    /// ([`crate::SoftHca::inject_fatal_error`]): commands other than
    /// destroys fail, nothing is transmitted or received.
    pub(crate) fatal: bool,
    /// QPs whose requester has work.
    pub(crate) ready: VecDeque<u32>,
    /// Frames for this HCA, from its own QPs.
    pub(crate) loopq: Batch,
    /// The other loopback batch (double buffering).
    pub(crate) loop_spare: Batch,
    /// Whether RC requests between two QPs of this HCA are short-circuited
    /// ([`crate::SoftConfig::short_circuit`]).
    pub(crate) short_circuit: bool,
    /// Whether the send doorbell's fast path runs
    /// ([`crate::SoftConfig::fast_path`]).
    pub(crate) fast_path: bool,
    /// While a request is short-circuited to a responder of this HCA
    /// ([`crate::transport::local`]): the requester QP whose responses
    /// the responder's packets are, taken into [`Self::replies`] instead
    /// of `loopq`.
    pub(crate) capture: Option<u32>,
    /// The responses of a short-circuited request, for its requester's
    /// completer.
    pub(crate) replies: Batch,
    /// Frames from other HCAs, taken from the inbox.
    pub(crate) inbound: Batch,
    /// Frames for other HCAs, by destination.
    pub(crate) outbox: Vec<OutQueue>,
    /// Completion and async events for the event queue.
    pub(crate) events: Vec<Event>,
    /// The fabric, when attached.
    pub(crate) router: Option<Arc<dyn Router>>,
    /// The wire, when attached: destinations neither loopback nor on the
    /// fabric.
    pub(crate) link: Option<crate::net::link::SharedLink>,
    /// Frames for the link, serialized at the end of a step.
    pub(crate) wireq: Batch,
    /// What sees the link's datagrams, if anything.
    pub(crate) tap: Option<Arc<dyn crate::net::link::Tap>>,
    /// The link's UDP destination port.
    pub(crate) udp_port: u16,
    /// The link's clock, as of the start of this step (ns).
    pub(crate) now: u64,
    /// QPs with a timer armed (each once, see [`crate::firmware::qp_state::QpTx::timed`]).
    pub(crate) timed: Vec<u32>,
    /// The platform's clock and timer, when attached: every RC QP keeps
    /// its timers on it (see [`crate::net::link::Clock`]).
    pub(crate) clock: Option<Shared<Box<dyn crate::net::link::Clock>>>,
    /// The deadline the platform's timer is armed for (`None`: not armed,
    /// or fired).
    pub(crate) clock_armed: Option<u64>,
    /// Receive buffers for datagrams from the link.
    pub(crate) rx: RxPool,
    /// Wire counters.
    pub(crate) link_stats: LinkStats,
    /// A message's payload, gathered to be cut into packets.
    pub(crate) scratch: Vec<u8>,
    /// The batch the next step's datagrams for the link are serialized
    /// into: a transmitted one, given back with its capacity.
    pub(crate) tx: TxBatch,
    /// Responder QPs with a coalesced ACK to send.
    pub(crate) acks: Vec<u32>,
    /// CQs that overran: their QPs go to ERR.
    pub(crate) cq_errors: Vec<u32>,
    /// Counters.
    pub(crate) stats: DpStats,
    /// The general services interface (QP1).
    pub(crate) gsi: Gsi,
    /// How many reasons a receive doorbell has to take the lock: QPs in
    /// ERR (their new receives are flushed) and responders waiting for a
    /// receive after an RNR NAK (their requesters get a retry). While it
    /// is 0 the RQ and SRQ doorbells return at once. Changed only under
    /// `HCA_LOCK`; read by the doorbells without it (see
    /// [`DataPath::attend`]).
    pub(crate) attention: irpverbs_ring::Shared<AtomicU32>,
}

impl core::fmt::Debug for DataPath {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("DataPath")
            .field("ready", &self.ready.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl PartialEq for DataPath {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for DataPath {}

impl DataPath {
    /// An idle data path for a port whose GID is `gid`, counting its
    /// reasons for attention in `attention` (0), with `events` for the
    /// events of a step (room for the event queue's depth), its link's
    /// datagrams to `udp_port`; in a box, built there (out of line: the
    /// data path is 1 KiB, docs/stack-budget.md).
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES`.
    #[inline(never)]
    pub(crate) fn new_boxed(
        gid: Gid,
        attention: irpverbs_ring::Shared<AtomicU32>,
        events: Vec<Event>,
        udp_port: u16,
    ) -> Result<Box<Self>, NtStatus> {
        irpverbs_ring::try_box_with(|| Self {
            gid,
            link_down: false,
            fatal: false,
            ready: VecDeque::new(),
            loopq: Batch::default(),
            loop_spare: Batch::default(),
            short_circuit: true,
            fast_path: true,
            capture: None,
            replies: Batch::default(),
            inbound: Batch::default(),
            outbox: Vec::new(),
            events,
            router: None,
            link: None,
            wireq: Batch::default(),
            tap: None,
            udp_port,
            now: 0,
            timed: Vec::new(),
            clock: None,
            clock_armed: None,
            rx: RxPool::default(),
            link_stats: LinkStats::default(),
            scratch: Vec::new(),
            tx: TxBatch::default(),
            acks: Vec::new(),
            cq_errors: Vec::new(),
            stats: DpStats::default(),
            gsi: crate::firmware::datapath::Gsi::default(),
            attention,
        })
        .ok_or(STATUS_INSUFFICIENT_RESOURCES)
    }

    /// One more reason for receive doorbells to come in. Sequentially
    /// consistent with the doorbell's fence: after this, either the
    /// doorbell sees it, or the caller's re-read of the ring sees the
    /// receive the doorbell announced.
    pub(crate) fn attend(&self) {
        self.attention.fetch_add(1, Ordering::SeqCst);
        core::sync::atomic::fence(Ordering::SeqCst);
    }

    /// One reason fewer.
    pub(crate) fn unattend(&self) {
        let _ = self
            .attention
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    }

    /// An async event.
    pub(crate) fn raise(&mut self, event: AsyncEvent) {
        self.event(Event::Async(event));
    }

    /// Queues `event` for the event queue. The list has room for a full
    /// event queue from the start (more in one step would overrun it); past
    /// that it grows fallibly, and an event it has no memory for is lost
    /// and counted, as an event queue overrun is. Returns whether it was
    /// queued.
    pub(crate) fn event(&mut self, event: Event) -> bool {
        let queued = crate::firmware::shared::push(&mut self.events, event);
        if !queued {
            self.stats.events_lost += 1;
        }
        queued
    }
}

/// The GSI's state (part of the data path, under `HCA_LOCK`).
#[derive(Clone, Debug, Default)]
pub(crate) struct Gsi {
    /// MADs received, oldest first.
    pub(crate) queue: VecDeque<MadIn>,
    /// [`Event::Mad`] was raised and the driver has not found the queue
    /// empty since.
    pub(crate) announced: bool,
    /// The PSN of the next MAD sent.
    pub(crate) psn: u32,
    /// MADs sent.
    pub(crate) sent: u64,
    /// MADs queued for the driver.
    pub(crate) received: u64,
    /// Packets to QP 1 dropped: not a valid MAD, or the queue was full
    /// (or had no memory to grow).
    pub(crate) dropped: u64,
    /// Buffers of MADs sent, reused once their packet let go of them.
    pub(crate) spare: VecDeque<Shared<Region>>,
}

/// Packets a QP dropped because it does not believe them, by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrustStats {
    /// Packets to an RC or UC QP from other than its peer's GID, or to
    /// other than its own (an off-path sender, or a QP not connected).
    pub foreign_address: u64,
    /// Responses (ACK, NAK, READ response, atomic ACK) whose PSN is past
    /// every request the requester has outstanding: never sent, or sent
    /// before a rewind and sent again since.
    pub response_psn_ahead: u64,
    /// Responses whose opcode is not what the request at their PSN calls
    /// for (a READ response to a SEND, an atomic ACK to a READ).
    pub response_opcode: u64,
    /// READ responses out of sequence (opcode order) or of the wrong
    /// length for the READ they answer.
    pub response_malformed: u64,
    /// ACKs with a reserved AETH type, NAKs with a code IBTA does not
    /// define.
    pub unknown_syndrome: u64,
    /// NAKs (sequence error, RNR, invalid request, remote access, remote
    /// operation) whose PSN is not that of a request outstanding.
    pub nak_psn_invalid: u64,
}

impl TrustStats {
    /// Every packet dropped, all reasons.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.foreign_address
            .wrapping_add(self.response_psn_ahead)
            .wrapping_add(self.response_opcode)
            .wrapping_add(self.response_malformed)
            .wrapping_add(self.unknown_syndrome)
            .wrapping_add(self.nak_psn_invalid)
    }
}
