//! The owner's calls.

use crate::Gid;
use crate::fallible::try_box_slice;
use alloc::vec::Vec;

use super::{CmError, Engine, pad, rej_of};
use crate::cep::{APR_SENT, CONN_READY, Conn, IN_LISTEN, IN_PEER, ORPHAN, SIGNALED};
use crate::event::Event;
use crate::msg::{
    Apr, AprStatus, CmMsg, Drep, Dreq, Info, Lap, Mra, MraedMsg, Path, Rej, RejReason, RejectedMsg,
    Rep, Req, Rtu, SidrRep, SidrReq, SidrStatus, TransportType,
};
use crate::params::{AcceptParams, ConnectParams, SidrParams, SidrReplyParams};
use crate::qp::{self, QpModify, QpTarget};
use crate::types::{CepId, LapState, Nanos, Op, State};

const MASK24: u32 = 0xFF_FFFF;

fn check(ok: bool, what: &'static str) -> Result<(), CmError> {
    if ok {
        Ok(())
    } else {
        Err(CmError::InvalidParam(what))
    }
}

impl Engine {
    /// A new CEP in `Idle`, with the owner's `context`.
    ///
    /// # Errors
    /// [`CmError::TableFull`].
    pub fn create(&mut self, context: u64) -> Result<CepId, CmError> {
        self.alloc_cep(context)
            .map(|(_, id)| id)
            .ok_or(CmError::TableFull)
    }

    /// `Idle` to `Listen` on `service_id`: REQs and SIDR_REQs for it make
    /// new CEPs, announced on this one. [`Engine::listen_on`] any GID.
    ///
    /// # Errors
    /// [`CmError::UnknownCep`], [`CmError::InvalidState`],
    /// [`CmError::ServiceInUse`].
    pub fn listen(&mut self, id: CepId, service_id: u64) -> Result<(), CmError> {
        self.listen_on(id, service_id, super::ANY_GID)
    }

    /// `Idle` to `Listen` on `service_id` for REQs whose primary path names
    /// `gid` as the passive side's ([`super::ANY_GID`]: any GID no other
    /// listener of the service ID is bound to), as rdma_cm listens on a
    /// bound address. Several listeners may share a service ID on
    /// different GIDs; one on any GID shares it with none (as a socket
    /// bound to the wildcard address and one bound to a specific address
    /// conflict). A REQ for a GID nobody listens on is rejected (invalid
    /// service ID). A SIDR_REQ, which names no GID, goes to the listener
    /// on any GID, else to the first bound to one.
    ///
    /// # Errors
    /// [`CmError::UnknownCep`], [`CmError::InvalidState`],
    /// [`CmError::ServiceInUse`] (the same GID, or any GID against any
    /// listener of the service ID).
    pub fn listen_on(&mut self, id: CepId, service_id: u64, gid: Gid) -> Result<(), CmError> {
        let idx = self.idle(id)?;
        let any = super::ANY_GID;
        let taken = if gid == any {
            self.listens
                .range((service_id, any)..=(service_id, [0xFF; 16]))
                .next()
                .is_some()
        } else {
            self.listens.contains_key(&(service_id, any))
                || self.listens.contains_key(&(service_id, gid))
        };
        if taken {
            return Err(CmError::ServiceInUse);
        }
        self.listens
            .try_insert((service_id, gid), idx)
            .map_err(|_| CmError::TableFull)?;
        if let Some(c) = self.table.get_mut(idx) {
            c.state = State::Listen;
            c.service_id = service_id;
            c.flags |= IN_LISTEN;
        }
        Ok(())
    }

    /// `Idle` to `ReqSent`: sends the REQ and waits for the answer,
    /// retransmitting it up to `max_cm_retries` times. The QP must be in
    /// INIT ([`QpTarget::Init`] of the CEP gives its attributes after this
    /// call; compute them before with the same values if the driver moves
    /// the QP first).
    ///
    /// # Errors
    /// [`CmError::UnknownCep`], [`CmError::InvalidState`],
    /// [`CmError::InvalidParam`].
    pub fn connect(&mut self, id: CepId, p: &ConnectParams<'_>, now: Nanos) -> Result<(), CmError> {
        let idx = self.idle(id)?;
        check(p.qpn <= MASK24, "qpn")?;
        check(p.starting_psn <= MASK24, "starting_psn")?;
        check(
            matches!(p.transport, TransportType::Rc | TransportType::Uc),
            "transport",
        )?;
        check((1..=5).contains(&p.path_mtu), "path_mtu")?;
        check(
            p.remote_cm_response_timeout <= 31,
            "remote_cm_response_timeout",
        )?;
        check(
            p.local_cm_response_timeout <= 31,
            "local_cm_response_timeout",
        )?;
        check(p.retry_count <= 7, "retry_count")?;
        check(p.rnr_retry_count <= 7, "rnr_retry_count")?;
        check(p.max_cm_retries <= 15, "max_cm_retries")?;
        check(p.min_rnr_timer <= 31, "min_rnr_timer")?;
        check(p.primary == p.primary.masked(), "primary")?;
        check(
            p.alternate.is_none_or(|a| a == a.masked() && !a.is_zero()),
            "alternate",
        )?;
        let private_data = pad(p.private_data, "private_data")?;
        let tid = self.new_tid(id);
        let req = Req {
            local_comm_id: id.0,
            vendor_id: 0,
            service_id: p.service_id,
            local_ca_guid: self.cfg.ca_guid,
            local_qkey: 0,
            local_qpn: p.qpn,
            responder_resources: p.responder_resources,
            local_eecn: 0,
            initiator_depth: p.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: p.remote_cm_response_timeout,
            transport: p.transport,
            end_to_end_flow_control: p.flow_control,
            starting_psn: p.starting_psn,
            local_cm_response_timeout: p.local_cm_response_timeout,
            retry_count: p.retry_count,
            pkey: p.pkey,
            path_mtu: p.path_mtu,
            rdc_exists: false,
            rnr_retry_count: p.rnr_retry_count,
            max_cm_retries: p.max_cm_retries,
            srq: p.srq,
            extended_transport_type: 0,
            primary: p.primary,
            alternate: p.alternate,
            sap_supported: false,
            private_data,
        };
        let Some(c) = self.table.get_mut(idx) else {
            return Err(CmError::UnknownCep);
        };
        c.state = State::ReqSent;
        c.service_id = p.service_id;
        c.tid = tid;
        c.addr = p.dest;
        c.retries = p.max_cm_retries;
        c.max_retries = p.max_cm_retries;
        c.resp_timeout = p.remote_cm_response_timeout;
        c.local_resp_timeout = p.local_cm_response_timeout;
        c.conn = Conn {
            transport: Some(p.transport),
            local_qpn: p.qpn,
            remote_qpn: 0,
            sq_psn: p.starting_psn,
            rq_psn: 0,
            pkey: p.pkey,
            mtu: p.path_mtu,
            rr: p.responder_resources,
            id: p.initiator_depth,
            peer_rr: 0,
            peer_id: 0,
            retry_count: p.retry_count,
            rnr_retry: 0,
            min_rnr_timer: p.min_rnr_timer,
            flow_control: p.flow_control,
            srq: p.srq,
            primary: p.primary,
            alternate: p.alternate,
        };
        if p.peer_to_peer {
            c.flags |= IN_PEER;
            // The room was reserved when the CEP was made.
            let _ = self
                .peers
                .insert_reserved((p.service_id, p.primary.remote_gid, idx), ());
        }
        self.send_awaiting(idx, tid, CmMsg::Req(req), now);
        Ok(())
    }

    /// The QP attributes `accept` with `p` will give (see
    /// [`Engine::qp_attr`]): the passive side moves its QP to RTR and RTS
    /// before it accepts.
    ///
    /// # Errors
    /// [`CmError::UnknownCep`], [`CmError::InvalidState`] outside
    /// `ReqRcvd` and `MraReqSent`.
    pub fn accept_qp_attr(
        &self,
        id: CepId,
        p: &AcceptParams<'_>,
        target: QpTarget,
    ) -> Result<QpModify, CmError> {
        let idx = self.owned(id)?;
        let c = self.table.get(idx).ok_or(CmError::UnknownCep)?;
        if !matches!(c.state, State::ReqRcvd | State::MraReqSent) {
            return Err(CmError::InvalidState(c.state));
        }
        let conn = Self::accepted(&c.conn, p);
        Ok(qp::modify(&conn, &c.addr, target, conn.alternate.as_ref()))
    }

    /// The connection as accepting with `p` makes it.
    fn accepted(conn: &Conn, p: &AcceptParams<'_>) -> Conn {
        Conn {
            local_qpn: p.qpn,
            sq_psn: p.starting_psn,
            rr: p.responder_resources.min(conn.peer_id),
            id: p.initiator_depth.min(conn.peer_rr),
            min_rnr_timer: p.min_rnr_timer,
            srq: p.srq,
            alternate: conn.alternate.filter(|_| p.accept_alternate),
            ..*conn
        }
    }

    /// `ReqRcvd` or `MraReqSent` to `RepSent`: sends the REP (responder
    /// resources and initiator depth cut to what the REQ allows) and waits
    /// for the RTU, retransmitting. The QP should be in RTR (or RTS)
    /// already.
    ///
    /// # Errors
    /// [`CmError::UnknownCep`], [`CmError::InvalidState`],
    /// [`CmError::InvalidParam`].
    pub fn accept(&mut self, id: CepId, p: &AcceptParams<'_>, now: Nanos) -> Result<(), CmError> {
        let idx = self.owned(id)?;
        check(p.qpn <= MASK24, "qpn")?;
        check(p.starting_psn <= MASK24, "starting_psn")?;
        check(p.rnr_retry_count <= 7, "rnr_retry_count")?;
        check(p.min_rnr_timer <= 31, "min_rnr_timer")?;
        check(p.target_ack_delay <= 31, "target_ack_delay")?;
        let private_data = pad(p.private_data, "private_data")?;
        let guid = self.cfg.ca_guid;
        let c = self.table.get_mut(idx).ok_or(CmError::UnknownCep)?;
        if !matches!(c.state, State::ReqRcvd | State::MraReqSent) {
            return Err(CmError::InvalidState(c.state));
        }
        let had_alt = c.conn.alternate.is_some();
        c.conn = Self::accepted(&c.conn, p);
        c.state = State::RepSent;
        c.flags |= CONN_READY;
        c.retries = c.max_retries;
        let rep = Rep {
            local_comm_id: id.0,
            remote_comm_id: c.remote_id,
            local_qkey: 0,
            local_qpn: p.qpn,
            local_eecn: 0,
            starting_psn: p.starting_psn,
            vendor_id: 0,
            responder_resources: c.conn.rr,
            initiator_depth: c.conn.id,
            target_ack_delay: p.target_ack_delay,
            failover_accepted: u8::from(had_alt && !p.accept_alternate),
            end_to_end_flow_control: p.flow_control,
            rnr_retry_count: p.rnr_retry_count,
            srq: p.srq,
            local_ca_guid: guid,
            private_data,
        };
        let tid = c.tid;
        self.send_awaiting(idx, tid, CmMsg::Rep(rep), now);
        Ok(())
    }

    /// Rejects the connection: the REQ (`ReqRcvd`, `MraReqSent`), the REP
    /// (`RepRcvd`, `MraRepSent`), or this side's own attempt (`ReqSent`,
    /// `MraReqRcvd`; `RepSent`, `MraRepRcvd`, which go to `Timewait`).
    /// `ari` (up to 72 bytes) goes with `reason`, except from an active side
    /// that has not heard from the passive side (no MRA): the passive side
    /// can match only a REJ with reason Timeout and this CA's GUID as ARI
    /// (IBTA 12.6.7), which is sent instead.
    ///
    /// # Errors
    /// [`CmError::UnknownCep`], [`CmError::InvalidState`],
    /// [`CmError::InvalidParam`].
    pub fn reject(
        &mut self,
        id: CepId,
        reason: RejReason,
        ari: &[u8],
        private_data: &[u8],
        now: Nanos,
    ) -> Result<(), CmError> {
        let idx = self.owned(id)?;
        let ari = Info::new(ari).ok_or(CmError::InvalidParam("ari"))?;
        let private_data = pad(private_data, "private_data")?;
        let c = self.table.get(idx).ok_or(CmError::UnknownCep)?;
        let guid = self.cfg.ca_guid.to_be_bytes();
        let (reason, ari) =
            if matches!(c.state, State::ReqSent | State::MraReqRcvd) && c.remote_id == 0 {
                // The passive side's ID is unknown: only a REJ(Timeout) naming
                // this CA can reach its CEP.
                (RejReason::TIMEOUT, Info::new(&guid).unwrap_or_default())
            } else {
                (reason, ari)
            };
        let (msg, timewait) = match c.state {
            State::ReqSent | State::MraReqRcvd => (RejectedMsg::Other, false),
            State::ReqRcvd | State::MraReqSent => (RejectedMsg::Req, false),
            State::RepRcvd | State::MraRepSent => (RejectedMsg::Rep, false),
            State::RepSent | State::MraRepRcvd => (RejectedMsg::Other, true),
            s => return Err(CmError::InvalidState(s)),
        };
        let rej = Rej {
            ari,
            private_data,
            ..rej_of(c, msg, reason, &[])
        };
        let (dest, tid) = (c.addr, c.tid);
        self.send(dest, tid, CmMsg::Rej(rej));
        if timewait {
            self.enter_timewait(idx, now);
        } else {
            self.reset_idle(idx);
        }
        Ok(())
    }

    /// Sends an MRA: the answer to the REQ (`ReqRcvd` to `MraReqSent`), the
    /// REP (`RepRcvd` to `MraRepSent`) or the LAP (`LapRcvd` to
    /// `MraLapSent`) takes up to 4.096 us * 2^`service_timeout` more. Sent
    /// again when the message comes again.
    ///
    /// # Errors
    /// [`CmError::UnknownCep`], [`CmError::InvalidState`],
    /// [`CmError::InvalidParam`].
    pub fn mra(
        &mut self,
        id: CepId,
        service_timeout: u8,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let idx = self.owned(id)?;
        check(service_timeout <= 31, "service_timeout")?;
        let private_data = pad(private_data, "private_data")?;
        let c = self.table.get_mut(idx).ok_or(CmError::UnknownCep)?;
        let (msg, tid) = match (c.state, c.lap) {
            (State::ReqRcvd, _) => {
                c.state = State::MraReqSent;
                (MraedMsg::Req, c.tid)
            }
            (State::RepRcvd, _) => {
                c.state = State::MraRepSent;
                (MraedMsg::Rep, c.tid)
            }
            (State::Established, LapState::LapRcvd) => {
                c.lap = LapState::MraLapSent;
                (MraedMsg::Lap, c.aux_tid)
            }
            (s, _) => return Err(CmError::InvalidState(s)),
        };
        let mra = Mra {
            local_comm_id: id.0,
            remote_comm_id: c.remote_id,
            msg_mraed: msg,
            service_timeout,
            private_data,
        };
        self.send_kept(idx, tid, CmMsg::Mra(mra));
        Ok(())
    }

    /// `RepRcvd` or `MraRepSent` to `Established`: sends the RTU (after
    /// the QP reached RTS).
    ///
    /// # Errors
    /// [`CmError::UnknownCep`], [`CmError::InvalidState`],
    /// [`CmError::InvalidParam`].
    pub fn rtu(&mut self, id: CepId, private_data: &[u8]) -> Result<(), CmError> {
        let idx = self.owned(id)?;
        let pd = pad(private_data, "private_data")?;
        let c = self.table.get_mut(idx).ok_or(CmError::UnknownCep)?;
        if !matches!(c.state, State::RepRcvd | State::MraRepSent) {
            return Err(CmError::InvalidState(c.state));
        }
        c.state = State::Established;
        c.sent = None;
        c.keep_pdata(private_data);
        let rtu = Rtu {
            local_comm_id: id.0,
            remote_comm_id: c.remote_id,
            private_data: pd,
        };
        let (dest, tid) = (c.addr, c.tid);
        self.send(dest, tid, CmMsg::Rtu(rtu));
        Ok(())
    }

    /// The passive side's QP received its first packet (the COMM_EST async
    /// event) before the RTU: `RepSent` or `MraRepRcvd` to `Established`,
    /// with an `Established` event. Nothing to do when already
    /// established.
    ///
    /// # Errors
    /// [`CmError::UnknownCep`], [`CmError::InvalidState`].
    pub fn notify_established(&mut self, id: CepId) -> Result<(), CmError> {
        let idx = self.owned(id)?;
        let c = self.table.get_mut(idx).ok_or(CmError::UnknownCep)?;
        match c.state {
            State::Established => Ok(()),
            State::RepSent | State::MraRepRcvd => {
                c.state = State::Established;
                c.sent = None;
                self.disarm(idx);
                self.push_event(idx, Event::Established);
                Ok(())
            }
            s => Err(CmError::InvalidState(s)),
        }
    }

    /// `Established` to `DreqSent`: sends the DREQ (an alternate path load
    /// in progress is abandoned) and waits for the DREP, retransmitting;
    /// then `Timewait`. The driver moves the QP to ERR
    /// ([`QpTarget::Error`]) meanwhile.
    ///
    /// # Errors
    /// [`CmError::UnknownCep`], [`CmError::InvalidState`],
    /// [`CmError::InvalidParam`].
    pub fn disconnect(
        &mut self,
        id: CepId,
        private_data: &[u8],
        now: Nanos,
    ) -> Result<(), CmError> {
        let idx = self.owned(id)?;
        let pd = pad(private_data, "private_data")?;
        let state = self.table.get(idx).map_or(State::Idle, |c| c.state);
        if state != State::Established {
            return Err(CmError::InvalidState(state));
        }
        self.send_dreq(idx, pd, now);
        Ok(())
    }

    /// Sends a DREQ and enters `DreqSent`.
    pub(super) fn send_dreq(
        &mut self,
        idx: u32,
        private_data: [u8; crate::msg::DREQ_PDATA],
        now: Nanos,
    ) {
        let Some(id) = self.table.get(idx).map(|c| c.id) else {
            return;
        };
        let tid = self.new_tid(id);
        let Some(c) = self.table.get_mut(idx) else {
            return;
        };
        c.state = State::DreqSent;
        c.end_lap();
        c.aux_tid = tid;
        c.retries = c.max_retries;
        let dreq = Dreq {
            local_comm_id: id.0,
            remote_comm_id: c.remote_id,
            remote_qpn: c.conn.remote_qpn,
            private_data,
        };
        self.send_awaiting(idx, tid, CmMsg::Dreq(dreq), now);
    }

    /// `DreqRcvd` to `Timewait`: sends the DREP (after the QP was moved to
    /// ERR and flushed).
    ///
    /// # Errors
    /// [`CmError::UnknownCep`], [`CmError::InvalidState`],
    /// [`CmError::InvalidParam`].
    pub fn drep(&mut self, id: CepId, private_data: &[u8], now: Nanos) -> Result<(), CmError> {
        let idx = self.owned(id)?;
        let pd = pad(private_data, "private_data")?;
        let c = self.table.get_mut(idx).ok_or(CmError::UnknownCep)?;
        if c.state != State::DreqRcvd {
            return Err(CmError::InvalidState(c.state));
        }
        c.keep_pdata(private_data);
        let drep = Drep {
            local_comm_id: id.0,
            remote_comm_id: c.remote_id,
            private_data: pd,
        };
        let (dest, tid) = (c.addr, c.aux_tid);
        self.send(dest, tid, CmMsg::Drep(drep));
        self.enter_timewait(idx, now);
        Ok(())
    }

    /// Established, no load in progress: sends a LAP proposing `path`
    /// (this side's view) as the alternate path, and waits for the APR,
    /// retransmitting.
    ///
    /// # Errors
    /// [`CmError::UnknownCep`], [`CmError::InvalidState`],
    /// [`CmError::InvalidParam`].
    pub fn load_alternate_path(
        &mut self,
        id: CepId,
        path: &Path,
        private_data: &[u8],
        now: Nanos,
    ) -> Result<(), CmError> {
        let idx = self.owned(id)?;
        check(*path == path.masked(), "path")?;
        let pd = pad(private_data, "private_data")?;
        let c = self.table.get(idx).ok_or(CmError::UnknownCep)?;
        if c.state != State::Established || c.lap != LapState::Idle {
            return Err(CmError::InvalidState(c.state));
        }
        let alt = try_box_slice(core::slice::from_ref(path)).ok_or(CmError::TableFull)?;
        let tid = self.new_tid(id);
        let Some(c) = self.table.get_mut(idx) else {
            return Err(CmError::UnknownCep);
        };
        c.lap = LapState::LapSent;
        c.aux_tid = tid;
        c.retries = c.max_retries;
        c.alt_pending = Some(alt);
        let lap = Lap {
            local_comm_id: id.0,
            remote_comm_id: c.remote_id,
            remote_qpn: c.conn.remote_qpn,
            remote_cm_response_timeout: c.resp_timeout,
            alternate: *path,
            private_data: pd,
        };
        self.send_awaiting(idx, tid, CmMsg::Lap(lap), now);
        Ok(())
    }

    /// Answers the LAP (`LapRcvd` or `MraLapSent`): with
    /// [`AprStatus::ACCEPTED`] the proposed path becomes the connection's
    /// alternate path (load it into the QP first, [`QpTarget::LoadAlt`]).
    ///
    /// # Errors
    /// [`CmError::UnknownCep`], [`CmError::InvalidState`],
    /// [`CmError::InvalidParam`].
    pub fn apr(
        &mut self,
        id: CepId,
        status: AprStatus,
        info: &[u8],
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let idx = self.owned(id)?;
        let info = Info::new(info).ok_or(CmError::InvalidParam("info"))?;
        let private_data = pad(private_data, "private_data")?;
        let c = self.table.get_mut(idx).ok_or(CmError::UnknownCep)?;
        if c.state != State::Established
            || !matches!(c.lap, LapState::LapRcvd | LapState::MraLapSent)
        {
            return Err(CmError::InvalidState(c.state));
        }
        let path = c.alt_pending.take();
        if status == AprStatus::ACCEPTED {
            c.conn.alternate = path.and_then(|p| p.first().copied());
        }
        c.lap = LapState::Idle;
        c.sent = None;
        c.apr_status = status.0;
        c.flags |= APR_SENT;
        let apr = Apr {
            local_comm_id: id.0,
            remote_comm_id: c.remote_id,
            status,
            info,
            private_data,
        };
        let (dest, tid) = (c.addr, c.aux_tid);
        self.send(dest, tid, CmMsg::Apr(apr));
        Ok(())
    }

    /// `Idle` to `SidrReqSent`: asks which UD QP serves a service ID,
    /// retransmitting up to `max_retries` times.
    ///
    /// # Errors
    /// [`CmError::UnknownCep`], [`CmError::InvalidState`],
    /// [`CmError::InvalidParam`].
    pub fn sidr_request(
        &mut self,
        id: CepId,
        p: &SidrParams<'_>,
        now: Nanos,
    ) -> Result<(), CmError> {
        let idx = self.idle(id)?;
        check(p.timeout <= 31, "timeout")?;
        check(p.max_retries <= 15, "max_retries")?;
        let private_data = pad(p.private_data, "private_data")?;
        let tid = self.new_tid(id);
        let Some(c) = self.table.get_mut(idx) else {
            return Err(CmError::UnknownCep);
        };
        c.state = State::SidrReqSent;
        c.addr = p.dest;
        c.service_id = p.service_id;
        c.aux_tid = tid;
        c.retries = p.max_retries;
        c.max_retries = p.max_retries;
        c.resp_timeout = p.timeout;
        let req = SidrReq {
            request_id: id.0,
            pkey: p.pkey,
            service_id: p.service_id,
            private_data,
        };
        self.send_awaiting(idx, tid, CmMsg::SidrReq(req), now);
        Ok(())
    }

    /// `SidrReqRcvd` to `Idle`: answers the SIDR_REQ.
    ///
    /// # Errors
    /// [`CmError::UnknownCep`], [`CmError::InvalidState`],
    /// [`CmError::InvalidParam`].
    pub fn sidr_reply(&mut self, id: CepId, p: &SidrReplyParams<'_>) -> Result<(), CmError> {
        let idx = self.owned(id)?;
        check(p.qpn <= MASK24, "qpn")?;
        let private_data = pad(p.private_data, "private_data")?;
        let c = self.table.get(idx).ok_or(CmError::UnknownCep)?;
        if c.state != State::SidrReqRcvd {
            return Err(CmError::InvalidState(c.state));
        }
        let rep = SidrRep {
            request_id: c.remote_id,
            status: p.status,
            vendor_id: 0,
            qpn: p.qpn,
            service_id: c.service_id,
            qkey: p.qkey,
            info: p.info,
            private_data,
        };
        let (dest, tid) = (c.addr, c.tid);
        self.send(dest, tid, CmMsg::SidrRep(rep));
        self.reset_idle(idx);
        Ok(())
    }

    /// Destroys `id`. Returns the events its owner had not polled and, if
    /// an operation was pending, its completion ([`Event::Canceled`]).
    /// What the remote is told depends on the state (as Linux's
    /// `ib_destroy_cm_id`): a connecting CEP sends REJ (Timeout from the
    /// active side, consumer reject from the passive side), an established
    /// one sends DREQ, one in `DreqRcvd` sends DREP; those whose QP may
    /// have carried traffic stay in time wait, unreachable by the owner,
    /// before their ID is freed. A listener's connection requests that its
    /// owner had not polled are rejected and freed, not returned.
    ///
    /// # Errors
    /// [`CmError::UnknownCep`].
    pub fn destroy(&mut self, id: CepId, now: Nanos) -> Result<Vec<Event>, CmError> {
        let mut out = Vec::new();
        self.destroy_with(id, now, &mut |ev| out.push(ev))?;
        Ok(out)
    }

    /// [`Engine::destroy`], dropping the events: allocates nothing (what a
    /// driver's object destroy, which cannot fail, calls).
    ///
    /// # Errors
    /// [`CmError::UnknownCep`].
    pub fn discard(&mut self, id: CepId, now: Nanos) -> Result<(), CmError> {
        self.destroy_with(id, now, &mut drop)
    }

    /// [`Engine::destroy`], handing each event to `out`.
    fn destroy_with(
        &mut self,
        id: CepId,
        now: Nanos,
        out: &mut dyn FnMut(Event),
    ) -> Result<(), CmError> {
        let idx = self.owned(id)?;
        loop {
            let ev = match self.table.get_mut(idx) {
                Some(c) => self.events.pop(&mut c.events),
                None => None,
            };
            let Some(ev) = ev else { break };
            match ev {
                // A request its owner never polled: rejected and freed.
                Event::ConnectRequest { cep, .. } | Event::SidrRequest { cep, .. } if cep != id => {
                    if let Ok(cidx) = self.owned(cep) {
                        self.abandon(cidx, now);
                    }
                }
                ev => out(ev),
            }
        }
        if let Some(c) = self.table.get_mut(idx) {
            c.flags &= !SIGNALED;
        }
        let Some(c) = self.table.get(idx) else {
            return Ok(());
        };
        let pending = match (c.state, c.lap) {
            (State::Listen, _) => Some(Op::Listen),
            (State::ReqSent | State::MraReqRcvd | State::RepRcvd | State::MraRepSent, _) => {
                Some(Op::Connect)
            }
            (State::RepSent | State::MraRepRcvd, _) => Some(Op::Accept),
            (State::DreqSent, _) => Some(Op::Disconnect),
            (State::SidrReqSent, _) => Some(Op::Sidr),
            (State::Established, LapState::LapSent | LapState::MraLapRcvd) => Some(Op::LoadAltPath),
            _ => None,
        };
        if let Some(op) = pending {
            out(Event::Canceled { op });
        }
        self.abandon(idx, now);
        Ok(())
    }

    /// Ends a CEP no owner will see again: tells the remote what its state
    /// requires and frees it, or keeps it in time wait.
    fn abandon(&mut self, idx: u32, now: Nanos) {
        let Some(c) = self.table.get_mut(idx) else {
            return;
        };
        c.flags |= ORPHAN;
        let guid = self.cfg.ca_guid.to_be_bytes();
        let consumer = RejReason::CONSUMER_REJECT;
        match c.state {
            State::ReqSent | State::MraReqRcvd => {
                self.send_rej(idx, RejectedMsg::Other, RejReason::TIMEOUT, &guid);
                self.release(idx);
            }
            State::ReqRcvd | State::MraReqSent => {
                self.send_rej(idx, RejectedMsg::Req, consumer, &[]);
                self.release(idx);
            }
            State::RepRcvd | State::MraRepSent => {
                self.send_rej(idx, RejectedMsg::Rep, consumer, &[]);
                self.release(idx);
            }
            State::RepSent | State::MraRepRcvd => {
                self.send_rej(idx, RejectedMsg::Other, consumer, &[]);
                self.enter_timewait(idx, now);
            }
            State::Established => {
                self.send_dreq(idx, [0; crate::msg::DREQ_PDATA], now);
                self.enter_timewait(idx, now);
            }
            State::DreqSent => self.enter_timewait(idx, now),
            State::DreqRcvd => {
                self.send_reply(idx, super::recv::Reply::Drep);
                self.enter_timewait(idx, now);
            }
            State::Timewait => {}
            State::SidrReqRcvd => {
                let rep = SidrRep {
                    request_id: c.remote_id,
                    status: SidrStatus::REJECTED,
                    vendor_id: 0,
                    qpn: 0,
                    service_id: c.service_id,
                    qkey: 0,
                    info: Info::EMPTY,
                    private_data: [0; crate::msg::SIDR_REP_PDATA],
                };
                let (dest, tid) = (c.addr, c.tid);
                self.send(dest, tid, CmMsg::SidrRep(rep));
                self.release(idx);
            }
            State::Idle | State::Listen | State::SidrReqSent => self.release(idx),
        }
    }

    /// The slot of an owner's CEP in `Idle`.
    fn idle(&self, id: CepId) -> Result<u32, CmError> {
        let idx = self.owned(id)?;
        match self.table.get(idx).map(|c| c.state) {
            Some(State::Idle) => Ok(idx),
            Some(s) => Err(CmError::InvalidState(s)),
            None => Err(CmError::UnknownCep),
        }
    }
}
