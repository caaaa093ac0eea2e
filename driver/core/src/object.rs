//! The driver's objects and what they have in common: a life state, an
//! operation-in-flight flag, a count of dependents, and a pool charge.

use irpverbs_abi::IvQpCap;
use irpverbs_ring::Ring;

use crate::hca::DoorbellTarget;
use crate::platform::{PoolCharge, PoolTag, pool_tag};

/// Object kinds; the value is stored in the handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Kind {
    /// Protection domain.
    Pd = 1,
    /// Memory region.
    Mr = 2,
    /// Completion queue.
    Cq = 3,
    /// Queue pair.
    Qp = 4,
    /// Shared receive queue.
    Srq = 5,
    /// Address handle.
    Ah = 6,
    /// Completion channel.
    Channel = 7,
    /// Connection endpoint of the connection manager.
    Cep = 8,
    /// Memory window.
    Mw = 9,
}

impl Kind {
    /// All kinds, for statistics.
    pub const ALL: [Kind; 9] = [
        Kind::Pd,
        Kind::Mr,
        Kind::Cq,
        Kind::Qp,
        Kind::Srq,
        Kind::Ah,
        Kind::Channel,
        Kind::Cep,
        Kind::Mw,
    ];

    pub(crate) const fn tag(self) -> PoolTag {
        match self {
            Kind::Pd => pool_tag(b"IvPd"),
            Kind::Mr => pool_tag(b"IvMr"),
            Kind::Cq => pool_tag(b"IvCq"),
            Kind::Qp => pool_tag(b"IvQp"),
            Kind::Srq => pool_tag(b"IvSr"),
            Kind::Ah => pool_tag(b"IvAh"),
            Kind::Channel => pool_tag(b"IvCh"),
            Kind::Cep => pool_tag(b"IvCe"),
            Kind::Mw => pool_tag(b"IvMw"),
        }
    }

    pub(crate) const fn index(self) -> usize {
        self as usize - 1
    }
}

/// Where an object is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Life {
    /// Its create command is in flight; the handle is not usable yet.
    Creating,
    /// Usable.
    Live,
    /// Its destroy command is in flight; the handle is no longer usable.
    Destroying,
}

#[derive(Debug)]
pub(crate) struct Pd {
    pub pdn: u32,
}

#[derive(Debug)]
pub(crate) struct Mr {
    pub pd: u32,
    pub lkey: u32,
}

/// A memory window: its PD, its type, and the rkey the HCA gave it (a
/// type 1 bind changes it; a type 2 window's binds are work requests the
/// driver does not see).
#[derive(Debug)]
pub(crate) struct Mw {
    pub pd: u32,
    pub mw_type: u32,
    pub rkey: u32,
}

#[derive(Debug)]
pub(crate) struct Cq {
    pub cqn: u32,
    pub cqe: u32,
    /// The ring, once created (the speed path's kernel context uses it).
    pub ring: Option<Ring>,
    /// The completion channel it is bound to.
    pub channel: Option<u32>,
    /// Events delivered through the channel and not acknowledged.
    pub unacked_events: u32,
    /// Pending `CQ_NOTIFY` waits (keys into the wait table).
    pub notify_waits: alloc::vec::Vec<u64>,
    /// The CQ overran: waits complete with `STATUS_DATA_OVERRUN`.
    pub failed: bool,
    /// Sequence of the driver's own arms (`CQ_NOTIFY` with arming).
    pub arm_seq: u32,
    pub user_context: u64,
}

#[derive(Debug)]
pub(crate) struct Qp {
    pub pd: u32,
    pub send_cq: u32,
    pub recv_cq: u32,
    pub srq: Option<u32>,
    pub qpn: u32,
    pub qp_type: u32,
    pub cap: IvQpCap,
    /// The state as of the last completed modify; the HCA may have moved
    /// the QP to ERR or SQE since (the modify command then fails).
    pub state: u32,
    pub user_context: u64,
    /// The send queue ring, once created.
    pub sq: Option<Ring>,
    /// The receive queue ring (none with an SRQ).
    pub rq: Option<Ring>,
}

#[derive(Debug)]
pub(crate) struct Srq {
    pub pd: u32,
    pub srqn: u32,
    pub max_wr: u32,
    /// SGEs per WR, as asked (a resize's ring is counted with them).
    pub max_sge: u32,
    pub user_context: u64,
    /// The ring, once created.
    pub ring: Option<Ring>,
}

#[derive(Debug)]
pub(crate) struct Ah {
    pub pd: u32,
    pub ahn: u32,
}

/// A completion channel: CQ events in arrival order, and the waits that
/// take them.
#[derive(Debug, Default)]
pub(crate) struct Channel {
    /// CQs (indices) with an event not yet taken.
    pub events: alloc::collections::VecDeque<u32>,
    /// Pending `GET_CQ_EVENT` waits.
    pub waits: alloc::collections::VecDeque<u64>,
}

/// A connection endpoint: its ID in the device's CM engine.
#[derive(Debug)]
pub(crate) struct Cep {
    pub id: irpverbs_cm::CepId,
    pub user_context: u64,
    /// The pended `GET_CEP_EVENT` (its wait key), if any.
    pub wait: Option<u64>,
    /// Events for the owner, oldest first.
    pub events: alloc::collections::VecDeque<irpverbs_abi::IvCepEventOut>,
    /// The QP (its handle) a connect or accept used.
    pub qp: Option<irpverbs_abi::IvHandle>,
    /// A kernel ULP's callback, called instead of completing `wait`.
    pub callback: Option<crate::cm::CepCallback>,
    /// The callback is called when events arrive (until the owner polls
    /// them all, once it was called).
    pub armed: bool,
}

#[derive(Debug)]
pub(crate) enum Body {
    Pd(Pd),
    Mr(Mr),
    Mw(Mw),
    Cq(Cq),
    Qp(Qp),
    Srq(Srq),
    Ah(Ah),
    Channel(Channel),
    Cep(Cep),
}

#[derive(Debug)]
pub(crate) struct Object {
    pub life: Life,
    /// A modify or resize command is in flight (one at a time).
    pub busy: bool,
    /// Query commands in flight (they may overlap each other and a modify).
    pub queries: u32,
    /// Objects that reference this one (QPs on a CQ, MRs on a PD, ...).
    pub dependents: u32,
    /// Async events about this object not yet acknowledged.
    pub unacked_async: u32,
    /// The doorbell page slots its rings' doorbells are bound to (see
    /// [`Object::doorbell_targets`]), once a user-mode `MAP_RINGS` bound
    /// them.
    pub doorbells: [Option<u32>; 2],
    pub charge: Option<PoolCharge>,
    /// Ring and pinned memory it holds against its file's quota.
    pub bytes: crate::quota::Bytes,
    /// The new ring of a resize in flight, held against the quota too.
    pub resize_bytes: Option<crate::quota::Bytes>,
    pub body: Body,
}

impl Object {
    pub(crate) fn kind(&self) -> Kind {
        match self.body {
            Body::Pd(_) => Kind::Pd,
            Body::Mr(_) => Kind::Mr,
            Body::Mw(_) => Kind::Mw,
            Body::Cq(_) => Kind::Cq,
            Body::Qp(_) => Kind::Qp,
            Body::Srq(_) => Kind::Srq,
            Body::Ah(_) => Kind::Ah,
            Body::Channel(_) => Kind::Channel,
            Body::Cep(_) => Kind::Cep,
        }
    }

    /// Indices (in the same file's table) of the objects this one depends on.
    pub(crate) fn parents(&self) -> [Option<u32>; 4] {
        match &self.body {
            Body::Pd(_) | Body::Channel(_) | Body::Cep(_) => [None; 4],
            Body::Cq(c) => [c.channel, None, None, None],
            Body::Mr(m) => [Some(m.pd), None, None, None],
            Body::Mw(m) => [Some(m.pd), None, None, None],
            Body::Srq(s) => [Some(s.pd), None, None, None],
            Body::Ah(a) => [Some(a.pd), None, None, None],
            Body::Qp(q) => [Some(q.pd), Some(q.send_cq), Some(q.recv_cq), q.srq],
        }
    }

    /// The command that destroys this object in the HCA (`None` for
    /// software-only objects: completion channels).
    pub(crate) fn destroy_command(&self) -> Option<crate::Command> {
        use crate::Command;
        Some(match &self.body {
            Body::Pd(p) => Command::DeallocPd { pdn: p.pdn },
            Body::Mr(m) => Command::DeregMr { lkey: m.lkey },
            Body::Mw(m) => Command::DeallocMw { rkey: m.rkey },
            Body::Cq(c) => Command::DestroyCq { cqn: c.cqn },
            Body::Qp(q) => Command::DestroyQp { qpn: q.qpn },
            Body::Srq(s) => Command::DestroySrq { srqn: s.srqn },
            Body::Ah(a) => Command::DestroyAh { ahn: a.ahn },
            Body::Channel(_) | Body::Cep(_) => return None,
        })
    }

    /// The (kind, HCA number) key events name this object by.
    pub(crate) fn number_key(&self) -> Option<(u8, u32)> {
        match &self.body {
            Body::Cq(c) => Some((Kind::Cq as u8, c.cqn)),
            Body::Qp(q) => Some((Kind::Qp as u8, q.qpn)),
            Body::Srq(s) => Some((Kind::Srq as u8, s.srqn)),
            _ => None,
        }
    }

    /// The rings a ULP maps for this object: a CQ's or an SRQ's ring, a
    /// QP's send and receive queues. `None` where there is none (yet).
    pub(crate) fn rings(&self) -> [Option<&Ring>; 2] {
        match &self.body {
            Body::Cq(c) => [c.ring.as_ref(), None],
            Body::Srq(s) => [s.ring.as_ref(), None],
            Body::Qp(q) => [q.sq.as_ref(), q.rq.as_ref()],
            _ => [None, None],
        }
    }

    /// The doorbells of [`Object::rings`], in the same order: a CQ's arm
    /// doorbell, an SRQ's doorbell, a QP's send and receive queue
    /// doorbells. `None` where there is no ring.
    pub(crate) fn doorbell_targets(&self) -> [Option<DoorbellTarget>; 2] {
        match &self.body {
            Body::Cq(c) if c.ring.is_some() => [Some(DoorbellTarget::CqArm(c.cqn)), None],
            Body::Srq(s) if s.ring.is_some() => [Some(DoorbellTarget::Srq(s.srqn)), None],
            Body::Qp(q) => [
                q.sq.as_ref().map(|_| DoorbellTarget::Sq(q.qpn)),
                q.rq.as_ref().map(|_| DoorbellTarget::Rq(q.qpn)),
            ],
            _ => [None, None],
        }
    }

    /// The user context events report for this object.
    pub(crate) fn user_context(&self) -> u64 {
        match &self.body {
            Body::Cq(c) => c.user_context,
            Body::Qp(q) => q.user_context,
            Body::Srq(s) => s.user_context,
            Body::Cep(c) => c.user_context,
            _ => 0,
        }
    }
}
