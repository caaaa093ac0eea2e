//! A QP's transport state, as a hardware HCA keeps it in its QP context:
//! the requester's and completer's ([`ReqState`], with the shadow of the
//! send queue and the congestion [`Window`]), the responder's
//! ([`RespState`]) and the path ([`Path`]). The firmware creates it with
//! the QP and resets it; the transport (`crate::transport`) is what reads
//! and changes it, and its rules are documented there.

use alloc::boxed::Box;
use alloc::vec::Vec;

use irpverbs_abi::{IV_SEND_WQE_HEADER, IvSendWqe, IvSge, NtStatus, STATUS_INSUFFICIENT_RESOURCES};
use irpverbs_ring::Ring;
use irpverbs_ring::wq::MAX_SGE;

use crate::wire::packet::Gid;

/// Where a connected QP's packets go: its primary address vector.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Path {
    /// Source GID (the port's GID at the AV's index).
    pub(crate) sgid: Gid,
    /// Destination GID.
    pub(crate) dgid: Gid,
    /// Destination QP.
    pub(crate) dest_qpn: u32,
    /// Traffic class.
    pub(crate) traffic_class: u8,
    /// Flow label.
    pub(crate) flow_label: u32,
    /// Hop limit.
    pub(crate) hop_limit: u8,
    /// The BTH MigReq bit of its packets (`crate::transport::apm`).
    pub(crate) mig_req: bool,
}

/// A QP's transport state. Not part of what firmware snapshots compare
/// (`PartialEq` is always true): tests compare configuration, not traffic.
#[derive(Clone, Debug)]
pub(crate) struct QpTx {
    /// Requester and completer.
    pub(crate) req: ReqState,
    /// Responder.
    pub(crate) resp: RespState,
    /// RC/UC: where packets go (set on RTR).
    pub(crate) path: Path,
    /// Path MTU in bytes (RC/UC), the port's active MTU (UD).
    pub(crate) mtu: u32,
    /// On the ready list.
    pub(crate) scheduled: bool,
    /// SQD: WQEs in flight when it entered SQD; raise SqDrained when done.
    pub(crate) draining: bool,
    /// Raise SqDrained when draining ends.
    pub(crate) drain_notify: bool,
    /// CommEstablished was raised since entering RTR.
    pub(crate) comm_est: bool,
    /// LastWqeReached was raised since entering ERR.
    pub(crate) last_wqe: bool,
    /// The local ACK timer's deadline (wire destinations only).
    pub(crate) rto_at: Option<u64>,
    /// The RNR timer's deadline (wire destinations only).
    pub(crate) rnr_at: Option<u64>,
    /// On [`crate::firmware::datapath::DataPath::timed`].
    pub(crate) timed: bool,
}

impl PartialEq for QpTx {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for QpTx {}

impl QpTx {
    /// A new QP's state, with no shadow yet (see [`QpTx::new_boxed`]).
    const FRESH: Self = Self {
        req: ReqState::EMPTY,
        resp: RespState::FRESH,
        path: Path {
            sgid: [0; 16],
            dgid: [0; 16],
            dest_qpn: 0,
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 0,
            mig_req: false,
        },
        mtu: 1024,
        scheduled: false,
        draining: false,
        drain_notify: false,
        comm_est: false,
        last_wqe: false,
        rto_at: None,
        rnr_at: None,
        timed: false,
    };

    /// Fresh state for a QP whose send queue is `sq`, in a box; the
    /// requester's shadow of the send queue is allocated now.
    ///
    /// A `QpTx` is 1.5 KiB: the box is filled from a constant (a copy
    /// from read-only memory, no stack temporary) and then given the
    /// shadow, so that creating a QP, which a DPC may do (a backlogged
    /// command, a CM step), takes little stack (docs/stack-budget.md).
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES`.
    #[inline(never)]
    pub(crate) fn new_boxed(sq: &Ring) -> Result<Box<Self>, NtStatus> {
        let shadow = ReqState::shadow(sq)?;
        let mut tx =
            irpverbs_ring::try_box_with(|| Self::FRESH).ok_or(STATUS_INSUFFICIENT_RESOURCES)?;
        tx.req.attach(shadow);
        Ok(tx)
    }
}

/// The requester's shadow of one send queue slot, from when the WQE is
/// started until it is retired.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SendSlot {
    /// The WQE header as read (once) from the ring.
    pub(crate) wqe: IvSendWqe,
    /// SGEs in the shadow list.
    pub(crate) nsge: u8,
    /// Message length in bytes.
    pub(crate) length: u32,
    /// PSN of its first packet.
    pub(crate) first_psn: u32,
    /// Last PSN it uses (READ: of its last response).
    pub(crate) last_psn: u32,
    /// READ: PSN of the next response expected.
    pub(crate) resp_next: u32,
    /// Complete (successfully, or failed with `status`).
    pub(crate) done: bool,
    /// `IV_WC_*` when done.
    pub(crate) status: u32,
    /// A local operation (`IV_WR_BIND_MW`, `IV_WR_LOCAL_INV`, `IV_WR_REG_MR`) that was
    /// executed: a rewind of the WQEs before it does not execute it again.
    /// Kept when the slot is read again, cleared when it retires.
    pub(crate) local: bool,
}

/// Where the requester is in the WQE it packetizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Progress {
    /// Ring index of the WQE.
    pub(crate) index: u32,
    /// Message bytes sent (READ: bytes already received, when retried).
    pub(crate) offset: u32,
    /// PSN of the next packet.
    pub(crate) psn: u32,
}

/// Requester and completer state of a QP, on cache lines of its own (see
/// [`crate::firmware::qp_state::RespState`]).
#[derive(Clone, Debug)]
#[repr(align(128))]
pub(crate) struct ReqState {
    pub(crate) slots: Vec<SendSlot>,
    pub(crate) sges: Vec<IvSge>,
    pub(crate) sge_per_slot: usize,
    /// Consumer index: WQEs before it are retired (the ring's consumer
    /// word is this, published; the ULP can't move it).
    pub(crate) ci: u32,
    /// Ring index of the next WQE to start.
    pub(crate) next: u32,
    /// Next PSN.
    pub(crate) psn: u32,
    /// The WQE being packetized.
    pub(crate) cur: Option<Progress>,
    /// RC: the PSN after the last packet sent before the latest rewind (a
    /// go-back-N does not unsend what had left): responses up to it
    /// answer requests the responder may have received.
    pub(crate) sent_end: u32,
    /// READs and atomics started and not retired.
    pub(crate) rd_atomic: u32,
    /// Transport retries left (`retry_cnt`).
    pub(crate) retry_left: u8,
    /// The PSN the requester went back to (a retry or an RNR NAK) with no
    /// progress since: a sequence-error NAK for it belongs to the same
    /// episode (the responder NAKed the packets that were in flight) and
    /// starts no new retry.
    pub(crate) rewound_to: Option<u32>,
    /// RNR retries left (`rnr_retry`, 7: unlimited).
    pub(crate) rnr_left: u8,
    /// Stopped after an RNR NAK until the responder can take it.
    pub(crate) rnr_wait: bool,
    /// RC: packets sent since the last one that asked for an ACK.
    pub(crate) unacked: u32,
    /// SQD: ask for an ACK of what is in flight (send the last packet
    /// again, asking for one).
    pub(crate) solicit: bool,
    /// RC: the congestion window ([`Window`]).
    pub(crate) window: Window,
}

/// An RC requester's congestion window, in packets: how many PSNs past the
/// last one acknowledged it may have sent. A burst is cut at the window
/// (and asks for an ACK); the requester then waits for an ACK to open it.
/// The window grows as ACKs come (doubling per round trip up to the
/// threshold, then one packet per window acknowledged) and shrinks on a
/// retry: halved for a NAK or an implicit NAK, quartered for a timeout
/// (the threshold follows). Without it a requester with more in flight
/// than the path holds (a UDP socket's buffer) loses most of it and goes
/// back N until its retries run out.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Window {
    /// Every PSN before this one is acknowledged.
    pub(crate) acked: u32,
    /// The window (packets).
    pub(crate) cwnd: u32,
    /// Up to here the window grows by what is acknowledged.
    pub(crate) threshold: u32,
    /// Packets acknowledged toward the next one-packet growth.
    pub(crate) grown: u32,
    /// The requester stopped at the window: the next ACK schedules it.
    pub(crate) waiting: bool,
}

impl Window {
    /// The first window: 2,048 packets (8 MiB at a 4096-byte MTU).
    pub(crate) const INITIAL: u32 = 2048;
    /// 4,096 packets (16 MiB at 4096 bytes): half a UDP socket's buffer,
    /// which drains within the usual local ACK timeout (67 ms at timeout
    /// 14) at the wire's few hundred MiB/s; a larger window only queues
    /// longer, until the timer fires for packets that were not lost.
    pub(crate) const MAX: u32 = 1 << 12;

    /// A window starting at `psn` (nothing in flight).
    pub(crate) const fn at(psn: u32) -> Self {
        Self {
            acked: psn,
            cwnd: Self::INITIAL,
            threshold: Self::MAX,
            grown: 0,
            waiting: false,
        }
    }
}

/// A send queue's shadow: its slots and their gather lists.
#[derive(Debug)]
pub(crate) struct Shadow {
    pub(crate) slots: Vec<SendSlot>,
    pub(crate) sges: Vec<IvSge>,
    pub(crate) sge_per_slot: usize,
}

impl ReqState {
    /// The shadow of the send queue `sq` (see [`ReqState::attach`]),
    /// allocated now.
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES`.
    pub(crate) fn shadow(sq: &Ring) -> Result<Shadow, NtStatus> {
        let entries = sq.entries() as usize;
        let sge_per_slot =
            ((sq.stride() as usize).saturating_sub(IV_SEND_WQE_HEADER) / 16).min(MAX_SGE);
        let mut slots = Vec::new();
        slots
            .try_reserve_exact(entries)
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        slots.resize(entries, SendSlot::default());
        let mut sges = Vec::new();
        sges.try_reserve_exact(entries * sge_per_slot)
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        sges.resize(entries * sge_per_slot, IvSge::default());
        Ok(Shadow {
            slots,
            sges,
            sge_per_slot,
        })
    }

    /// State with no shadow yet, as a constant: a QP's transport state is
    /// written from constants into its box, never built on the stack
    /// (`QpTx::new_boxed`; docs/stack-budget.md), and then given its
    /// shadow ([`ReqState::attach`]).
    pub(crate) const EMPTY: Self = Self {
        slots: Vec::new(),
        sges: Vec::new(),
        sge_per_slot: 0,
        ci: 0,
        next: 0,
        psn: 0,
        cur: None,
        sent_end: 0,
        rd_atomic: 0,
        retry_left: 0,
        rewound_to: None,
        rnr_left: 0,
        rnr_wait: false,
        unacked: 0,
        solicit: false,
        window: Window::at(0),
    };

    /// Gives the state its send queue's shadow. Allocates nothing.
    pub(crate) fn attach(&mut self, shadow: Shadow) {
        let Shadow {
            slots,
            sges,
            sge_per_slot,
        } = shadow;
        self.slots = slots;
        self.sges = sges;
        self.sge_per_slot = sge_per_slot;
    }
}

/// Responder resources remembered for duplicate READs and atomics.
pub(crate) const RESOURCES: usize = 16;

/// A receive WQE being filled.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RecvWqe {
    /// Its work request id.
    pub(crate) wr_id: u64,
    /// SGEs.
    pub(crate) nsge: usize,
    /// The scatter list (read once from the ring).
    pub(crate) sges: [IvSge; MAX_SGE],
    /// Bytes placed so far.
    pub(crate) offset: u32,
}

/// The RDMA WRITE in progress.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct WriteState {
    /// Its rkey (checked again for every packet: the MR may go).
    pub(crate) rkey: u32,
    /// Address of the next byte.
    pub(crate) va: u64,
    /// Bytes still expected.
    pub(crate) resid: u32,
    /// The RETH length.
    pub(crate) length: u32,
}

/// A READ or atomic executed, kept to answer its duplicates.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Resource {
    /// 0 (free), `m::READ` or `m::ATOMIC`.
    pub(crate) kind: u32,
    /// PSN of the request.
    pub(crate) first_psn: u32,
    /// Last PSN of its responses.
    pub(crate) last_psn: u32,
    /// READ: address, rkey and length.
    pub(crate) va: u64,
    /// READ: rkey.
    pub(crate) rkey: u32,
    /// READ: length.
    pub(crate) len: u32,
    /// Atomic: the original value returned.
    pub(crate) orig: u64,
}

/// Responder state of a QP. On cache lines of its own: in loopback the
/// peer's requester (on the peer's processor) writes it, while this QP's
/// own requester writes [`crate::firmware::qp_state::ReqState`] beside it.
#[derive(Clone, Debug)]
#[repr(align(128))]
pub(crate) struct RespState {
    /// Expected PSN.
    pub(crate) epsn: u32,
    /// Message sequence number (24 bits).
    pub(crate) msn: u32,
    /// Receive queue consumer index (published to the ring).
    pub(crate) rq_ci: u32,
    /// The receive queue's producer index as the fast path last read it:
    /// the WQEs before it were posted, so while `rq_ci` is behind it the
    /// fast path takes the next one without reading the ULP's index (a
    /// cache line the ULP's processor writes with every post). Stale when
    /// another path moves `rq_ci` past it; the fast path then reads the
    /// index again.
    pub(crate) rq_seen: u32,
    /// `m::SEND` or `m::WRITE` while a multi-packet message is in
    /// progress, 0 between messages.
    pub(crate) in_msg: u32,
    /// The receive WQE taken for the message in progress (valid with
    /// `has_recv`; read in place, never moved).
    pub(crate) recv: RecvWqe,
    /// `recv` holds a WQE.
    pub(crate) has_recv: bool,
    /// The WRITE in progress.
    pub(crate) write: WriteState,
    /// A PSN sequence error NAK was sent; no other until the expected PSN.
    pub(crate) nak_sent: bool,
    /// UC: drop packets until the next first packet.
    pub(crate) drop_msg: bool,
    /// Responder resources (a ring).
    pub(crate) res: [Resource; RESOURCES],
    /// Next resource to use.
    pub(crate) res_next: usize,
    /// A coalesced ACK to send, for this PSN.
    pub(crate) ack: Option<u32>,
    /// An RNR NAK was sent: tell the requester when a receive is posted.
    pub(crate) rnr_wait: bool,
}

impl RespState {
    /// Fresh state, as a constant: a QP's transport state is written from
    /// constants into its box, never built on the stack
    /// (`QpTx::new_boxed`; docs/stack-budget.md).
    pub(crate) const FRESH: Self = Self {
        epsn: 0,
        msn: 0,
        rq_ci: 0,
        rq_seen: 0,
        in_msg: 0,
        recv: RecvWqe {
            wr_id: 0,
            nsge: 0,
            sges: [IvSge {
                addr: 0,
                length: 0,
                lkey: 0,
            }; MAX_SGE],
            offset: 0,
        },
        has_recv: false,
        write: WriteState {
            rkey: 0,
            va: 0,
            resid: 0,
            length: 0,
        },
        nak_sent: false,
        drop_msg: false,
        res: [Resource {
            kind: 0,
            first_psn: 0,
            last_psn: 0,
            va: 0,
            rkey: 0,
            len: 0,
            orig: 0,
        }; RESOURCES],
        res_next: 0,
        ack: None,
        rnr_wait: false,
    };
}
