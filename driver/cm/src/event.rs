//! Events for a CEP's owner, and the store of queued events.
//!
//! Every CEP has a FIFO of events, kept as a linked list through one slab
//! shared by all CEPs: queueing an event takes a free slab slot (the slab
//! only grows to the peak of events queued at once) and costs no
//! allocation per CEP.

use alloc::vec::Vec;

use crate::msg::{Apr, DREP_PDATA, Dreq, Lap, MraedMsg, Rej, Rep, Req, SidrRep, SidrReq};
use crate::types::{CepId, MadAddr, Op};

/// What happened on a CEP. The owner polls them in order
/// ([`Engine::poll_event`](crate::Engine::poll_event)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A REQ for the listened service (on the listening CEP), or from the
    /// peer of a peer-to-peer connect that made this CEP the passive side
    /// (on that CEP itself). `cep` is in `ReqRcvd`: the owner accepts,
    /// rejects or sends MRA on it. The path in `req` is the sender's view.
    ConnectRequest {
        /// The CEP of the new connection, now the owner's.
        cep: CepId,
        /// Where the REQ came from.
        src: MadAddr,
        /// The REQ.
        req: Req,
    },
    /// Active side: the REP arrived (`RepRcvd`). The owner moves its QP to
    /// RTR and RTS ([`QpTarget`](crate::QpTarget)) and calls `rtu`, or
    /// rejects.
    Reply {
        /// The REP.
        rep: Rep,
    },
    /// Passive side: the RTU arrived, or the owner reported the QP's first
    /// receive (`notify_established`): `Established`.
    Established,
    /// The connection attempt ended with a REJ: the CEP is `Idle`, or in
    /// `Timewait` for a stale connection or once the QP may have carried
    /// traffic.
    Rejected {
        /// The REJ.
        rej: Rej,
        /// Whether this engine sent it (a stale REP); else the remote did.
        sent: bool,
    },
    /// The remote needs more time (the wait is extended).
    MraReceived {
        /// The message acknowledged.
        msg: MraedMsg,
        /// Its service timeout (4.096 us * 2^t).
        service_timeout: u8,
    },
    /// An exchange gave up after its retries. The CEP is `Idle` (connect,
    /// SIDR), in `Timewait` (accept, disconnect), or still `Established`
    /// (load path).
    Timeout {
        /// The operation.
        op: Op,
    },
    /// The remote disconnects (`DreqRcvd`): the owner moves the QP to ERR
    /// (flushing it) and calls `drep`.
    DisconnectRequest {
        /// The DREQ.
        dreq: Dreq,
    },
    /// The disconnect completed (`Timewait`): the DREP arrived, or `None`
    /// when both sides' DREQs crossed (this engine answered the remote's).
    DisconnectReply {
        /// The DREP's private data.
        private_data: Option<[u8; DREP_PDATA]>,
    },
    /// A new REQ or REP from the remote CA reuses this connection's remote
    /// QP: the connection is stale. The engine sent DREQ (`DreqSent`); a
    /// `DisconnectReply` or `Timeout` follows.
    StaleConnection,
    /// Time wait is over: the CEP is `Idle` again.
    TimewaitExit,
    /// The remote asks to load an alternate path (`LapRcvd`): the owner
    /// loads it into the QP ([`QpTarget::LoadAlt`](crate::QpTarget)) and
    /// answers with `apr`.
    LapReceived {
        /// The LAP (the path is the sender's view).
        lap: Lap,
    },
    /// The answer to `load_alternate_path`.
    AprReceived {
        /// The APR.
        apr: Apr,
    },
    /// A SIDR_REQ for the listened service (on the listening CEP); `cep`
    /// is in `SidrReqRcvd`: the owner answers with `sidr_reply`.
    SidrRequest {
        /// The CEP that answers.
        cep: CepId,
        /// Where the request came from.
        src: MadAddr,
        /// The SIDR_REQ.
        req: SidrReq,
    },
    /// The answer to `sidr_request` (`Idle`).
    SidrReply {
        /// The SIDR_REP.
        rep: SidrRep,
    },
    /// Only from `destroy`: the operation was pending and will not
    /// complete otherwise.
    Canceled {
        /// The operation.
        op: Op,
    },
}

/// No slot.
pub(crate) const NIL: u32 = u32::MAX;

struct Node {
    ev: Option<Event>,
    next: u32,
}

/// The slab of queued events.
#[derive(Default)]
pub(crate) struct Events {
    nodes: Vec<Node>,
    free: Vec<u32>,
}

/// The head and tail of one CEP's queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Queue {
    head: u32,
    tail: u32,
}

impl Default for Queue {
    fn default() -> Self {
        Self {
            head: NIL,
            tail: NIL,
        }
    }
}

impl Queue {
    pub(crate) fn is_empty(&self) -> bool {
        self.head == NIL
    }
}

impl Events {
    /// Room for `total` queued events in all (and their free-list
    /// entries), so that [`Events::push`] and [`Events::pop`] never
    /// allocate.
    pub(crate) fn reserve_total(&mut self, total: usize) -> Result<(), ()> {
        let more = total.saturating_sub(self.nodes.len());
        self.nodes.try_reserve(more).map_err(drop)?;
        let free = self.nodes.capacity().saturating_sub(self.free.len());
        self.free.try_reserve(free).map_err(drop)
    }

    /// Appends `ev` to `q`, in the room [`Events::reserve_total`] made:
    /// false (`ev` dropped) when there is none.
    pub(crate) fn push(&mut self, q: &mut Queue, ev: Event) -> bool {
        let node = Node {
            ev: Some(ev),
            next: NIL,
        };
        let n = if let Some(n) = self.free.pop() {
            if let Some(slot) = self.nodes.get_mut(n as usize) {
                *slot = node;
            }
            n
        } else if self.nodes.len() < self.nodes.capacity() {
            self.nodes.push(node);
            u32::try_from(self.nodes.len() - 1).unwrap_or(NIL)
        } else {
            return false;
        };
        if let Some(tail) = self.nodes.get_mut(q.tail as usize) {
            tail.next = n;
        } else {
            q.head = n;
        }
        q.tail = n;
        true
    }

    /// Takes the first event of `q`.
    pub(crate) fn pop(&mut self, q: &mut Queue) -> Option<Event> {
        let n = q.head;
        let node = self.nodes.get_mut(n as usize)?;
        let ev = node.ev.take();
        q.head = node.next;
        if q.head == NIL {
            q.tail = NIL;
        }
        self.free.push(n);
        ev
    }

    /// Events queued, on all CEPs.
    pub(crate) fn len(&self) -> usize {
        self.nodes.len() - self.free.len()
    }

    /// Bytes of one queued event.
    pub(crate) const NODE_SIZE: usize = size_of::<Node>();
}
