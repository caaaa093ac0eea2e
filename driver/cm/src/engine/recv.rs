//! Received MADs: the passive and active halves of the state machine,
//! duplicates, stale connections, peer-to-peer matching.

use super::{Engine, rej_of};
use crate::cep::{APR_SENT, CONN_READY, IN_PEER, IN_SIDR};
use crate::event::Event;
use crate::msg::{
    self, Apr, AprStatus, CM_CLASS_VERSION, ClassPortInfo, CmMsg, Drep, Dreq, Info, Lap,
    METHOD_GET, METHOD_SEND, MadHeader, Mra, MraedMsg, ParseError, Rej, RejReason, RejectedMsg,
    Rep, Req, Rtu, SidrRep, SidrReq, SidrStatus, TransportType, attr,
};
use crate::types::{CepId, LapState, MadAddr, Nanos, State};

/// The answers rebuilt from a CEP's fields.
#[derive(Clone, Copy)]
pub(super) enum Reply {
    /// The RTU of the connection.
    Rtu,
    /// The DREP of the last DREQ.
    Drep,
}

impl Engine {
    /// A MAD received on the GSI from `src`. Runs in the receive
    /// completion path: no blocking, no allocation but the CEP's own (a new
    /// CEP, its lookup entries, the MAD it keeps to send again).
    ///
    /// # Errors
    /// The [`ParseError`] of a MAD that is dropped (counted). A REQ of
    /// another class version is answered with a REJ first.
    pub fn receive(&mut self, now: Nanos, src: &MadAddr, bytes: &[u8]) -> Result<(), ParseError> {
        let (hdr, data) = msg::parse_header(bytes).inspect_err(|_| self.stats.malformed += 1)?;
        if hdr.class_version != CM_CLASS_VERSION
            && hdr.attr_id == attr::REQ
            && hdr.method == METHOD_SEND
        {
            // The REQ's local communication ID is its first 4 bytes in
            // every class version.
            let their = u32::from_be_bytes([data[0], data[1], data[2], data[3]]);
            self.reject_unmatched(
                &hdr,
                src,
                their,
                RejectedMsg::Req,
                RejReason::UNSUPPORTED_CLASS_VERSION,
                &[CM_CLASS_VERSION],
            );
        }
        let m = msg::parse_msg(&hdr, data).inspect_err(|_| self.stats.malformed += 1)?;
        self.stats.received += 1;
        match m {
            CmMsg::ClassPortInfo(_) => self.on_class_port_info(&hdr, src),
            CmMsg::Req(m) => self.on_req(now, &hdr, src, &m),
            CmMsg::Mra(m) => self.on_mra(now, &m),
            CmMsg::Rej(m) => self.on_rej(now, &m),
            CmMsg::Rep(m) => self.on_rep(now, &hdr, src, &m),
            CmMsg::Rtu(m) => self.on_rtu(&m),
            CmMsg::Dreq(m) => self.on_dreq(now, &hdr, src, &m),
            CmMsg::Drep(m) => self.on_drep(now, &m),
            CmMsg::Lap(m) => self.on_lap(&hdr, &m),
            CmMsg::Apr(m) => self.on_apr(&m),
            CmMsg::SidrReq(m) => self.on_sidr_req(&hdr, src, &m),
            CmMsg::SidrRep(m) => self.on_sidr_rep(&m),
        }
        Ok(())
    }

    fn unmatched(&mut self) {
        self.stats.unmatched += 1;
    }

    /// The slot of the CEP a message addresses: its "remote communication
    /// ID" is the CEP's ID, and its "local communication ID" the remote's
    /// ID the CEP knows (when it knows one).
    fn addressed(&self, ours: u32, theirs: u32) -> Option<u32> {
        let idx = self.table.lookup(CepId(ours))?;
        let c = self.table.get(idx)?;
        (c.remote_id == 0 || theirs == 0 || c.remote_id == theirs).then_some(idx)
    }

    /// Answers a message that has no CEP with a REJ.
    fn reject_unmatched(
        &mut self,
        hdr: &MadHeader,
        src: &MadAddr,
        their_id: u32,
        msg: RejectedMsg,
        reason: RejReason,
        ari: &[u8],
    ) {
        let rej = Rej {
            local_comm_id: 0,
            remote_comm_id: their_id,
            msg_rejected: msg,
            reason,
            ari: Info::new(ari).unwrap_or_default(),
            private_data: [0; msg::REJ_PDATA],
        };
        self.send(*src, hdr.tid, CmMsg::Rej(rej));
    }

    fn on_class_port_info(&mut self, hdr: &MadHeader, src: &MadAddr) {
        if hdr.method != METHOD_GET {
            return self.unmatched();
        }
        let cpi = ClassPortInfo {
            base_version: msg::BASE_VERSION,
            class_version: CM_CLASS_VERSION,
            resp_time_value: self.cfg.resp_time_value & 0x1F,
            ..ClassPortInfo::default()
        };
        self.send(*src, hdr.tid, CmMsg::ClassPortInfo(cpi));
    }

    // -------------------------------------------------------------- REQ

    fn on_req(&mut self, now: Nanos, hdr: &MadHeader, src: &MadAddr, req: &Req) {
        if let Some(&idx) = self.by_remote.get(&(req.local_ca_guid, req.local_comm_id)) {
            return self.dup_req(idx);
        }
        let theirs = req.local_comm_id;
        if !matches!(req.transport, TransportType::Rc | TransportType::Uc) {
            let m = RejectedMsg::Req;
            return self.reject_unmatched(
                hdr,
                src,
                theirs,
                m,
                RejReason::INVALID_TRANSPORT_TYPE,
                &[],
            );
        }
        if !(1..=5).contains(&req.path_mtu) {
            return self.reject_unmatched(
                hdr,
                src,
                theirs,
                RejectedMsg::Req,
                RejReason::INVALID_MTU,
                &[5],
            );
        }
        if let Some(&old) = self.by_qpn.get(&(req.local_ca_guid, req.local_qpn)) {
            self.reject_unmatched(
                hdr,
                src,
                theirs,
                RejectedMsg::Req,
                RejReason::STALE_CONNECTION,
                &[],
            );
            return self.stale(old, now);
        }
        if let Some(idx) = self.find_peer(req) {
            let (guid, qpn) = match self.table.get(idx) {
                Some(c) => (self.cfg.ca_guid, c.conn.local_qpn),
                None => return,
            };
            if (guid, qpn) > (req.local_ca_guid, req.local_qpn) {
                // This side stays active: the remote becomes passive when
                // it gets this side's REQ.
                return self.unmatched();
            }
            self.disarm(idx);
            self.unlink(idx);
            if let Some(c) = self.table.get_mut(idx) {
                c.sent = None;
                c.flags &= !IN_PEER;
            }
            self.init_passive(idx, hdr.tid, src, req);
            let id = self.table.get(idx).map_or(CepId(0), |c| c.id);
            return self.push_event(
                idx,
                Event::ConnectRequest {
                    cep: id,
                    src: *src,
                    req: *req,
                },
            );
        }
        let Some((lidx, ctx)) = self
            .listener(req.service_id, Some(req.primary.remote_gid))
            .and_then(|l| Some((l, self.table.get(l)?.context)))
        else {
            let m = RejectedMsg::Req;
            return self.reject_unmatched(hdr, src, theirs, m, RejReason::INVALID_SERVICE_ID, &[]);
        };
        let Some((idx, id)) = self.alloc_cep(ctx) else {
            return self.reject_unmatched(
                hdr,
                src,
                theirs,
                RejectedMsg::Req,
                RejReason::NO_RESOURCES,
                &[],
            );
        };
        self.init_passive(idx, hdr.tid, src, req);
        self.push_event(
            lidx,
            Event::ConnectRequest {
                cep: id,
                src: *src,
                req: *req,
            },
        );
    }

    /// A peer-to-peer CEP waiting for the answer to its REQ for the REQ's
    /// service from the REQ's sender port (not the REQ's own sender).
    fn find_peer(&self, req: &Req) -> Option<u32> {
        let sid = req.service_id;
        let gid = req.primary.local_gid;
        self.peers
            .range((sid, gid, 0)..=(sid, gid, u32::MAX))
            .map(|(&(_, _, idx), ())| idx)
            .find(|&idx| {
                self.table.get(idx).is_some_and(|c| {
                    matches!(c.state, State::ReqSent | State::MraReqRcvd)
                        && !(c.id.0 == req.local_comm_id && self.cfg.ca_guid == req.local_ca_guid)
                })
            })
    }

    /// Makes the CEP the passive side of `req`: `ReqRcvd`, in the remote
    /// lookups.
    fn init_passive(&mut self, idx: u32, tid: u64, src: &MadAddr, req: &Req) {
        let Some(c) = self.table.get_mut(idx) else {
            return;
        };
        c.state = State::ReqRcvd;
        c.remote_id = req.local_comm_id;
        c.remote_ca_guid = req.local_ca_guid;
        c.service_id = req.service_id;
        c.tid = tid;
        c.addr = *src;
        c.retries = req.max_cm_retries;
        c.max_retries = req.max_cm_retries;
        c.resp_timeout = req.local_cm_response_timeout;
        c.local_resp_timeout = req.remote_cm_response_timeout;
        c.conn.transport = Some(req.transport);
        c.conn.remote_qpn = req.local_qpn;
        c.conn.rq_psn = req.starting_psn;
        c.conn.pkey = req.pkey;
        c.conn.mtu = req.path_mtu;
        c.conn.peer_rr = req.responder_resources;
        c.conn.peer_id = req.initiator_depth;
        c.conn.retry_count = req.retry_count;
        c.conn.rnr_retry = req.rnr_retry_count;
        c.conn.flow_control = req.end_to_end_flow_control;
        c.conn.primary = req.primary.reversed();
        c.conn.alternate = req.alternate.map(|a| a.reversed());
        c.flags &= !CONN_READY;
        self.link_remote(idx);
    }

    /// A REQ again (IBTA 12.9.6): the MRA or REP sent is sent again; in
    /// time wait the REQ is stale.
    fn dup_req(&mut self, idx: u32) {
        self.stats.duplicates += 1;
        let Some(c) = self.table.get(idx) else {
            return;
        };
        match c.state {
            State::MraReqSent | State::RepSent | State::MraRepRcvd => self.resend(idx),
            State::Timewait => {
                self.send_rej(idx, RejectedMsg::Req, RejReason::STALE_CONNECTION, &[]);
            }
            _ => {}
        }
    }

    /// A REQ or REP reuses the remote QP of the CEP at `old`: an
    /// established connection is stale and is disconnected.
    fn stale(&mut self, old: u32, now: Nanos) {
        self.stats.stale += 1;
        if self
            .table
            .get(old)
            .is_some_and(|c| c.state == State::Established)
        {
            self.send_dreq(old, [0; msg::DREQ_PDATA], now);
            self.push_event(old, Event::StaleConnection);
        }
    }

    // -------------------------------------------------------------- REP

    fn on_rep(&mut self, now: Nanos, hdr: &MadHeader, src: &MadAddr, rep: &Rep) {
        let Some(idx) = self.addressed(rep.remote_comm_id, rep.local_comm_id) else {
            // No such connection (any more): tell the passive side.
            let m = RejectedMsg::Rep;
            return self.reject_unmatched(
                hdr,
                src,
                rep.local_comm_id,
                m,
                RejReason::INVALID_COMM_ID,
                &[],
            );
        };
        let Some(state) = self.table.get(idx).map(|c| c.state) else {
            return;
        };
        match state {
            State::ReqSent | State::MraReqRcvd => self.rep_for_req(now, idx, hdr, rep),
            State::RepRcvd => self.stats.duplicates += 1,
            State::MraRepSent => {
                self.stats.duplicates += 1;
                self.resend(idx);
            }
            State::Established => {
                self.stats.duplicates += 1;
                self.send_reply(idx, Reply::Rtu);
            }
            _ => self.unmatched(),
        }
    }

    fn rep_for_req(&mut self, now: Nanos, idx: u32, hdr: &MadHeader, rep: &Rep) {
        let remote = (rep.local_ca_guid, rep.local_comm_id);
        let taken = self.by_remote.get(&remote).is_some_and(|&o| o != idx);
        let old = self
            .by_qpn
            .get(&(rep.local_ca_guid, rep.local_qpn))
            .copied();
        if taken || old.is_some() {
            // The remote's ID or QP belongs to another connection: stale.
            let Some(c) = self.table.get(idx) else {
                return;
            };
            let rej = Rej {
                remote_comm_id: rep.local_comm_id,
                ..rej_of(c, RejectedMsg::Rep, RejReason::STALE_CONNECTION, &[])
            };
            let dest = c.addr;
            self.send(dest, hdr.tid, CmMsg::Rej(rej));
            self.disarm(idx);
            self.unlink(idx);
            self.enter_timewait(idx, now);
            self.push_event(idx, Event::Rejected { rej, sent: true });
            if let Some(old) = old {
                self.stale(old, now);
            }
            return;
        }
        self.disarm(idx);
        self.unlink(idx);
        let Some(c) = self.table.get_mut(idx) else {
            return;
        };
        c.sent = None;
        c.state = State::RepRcvd;
        c.remote_id = rep.local_comm_id;
        c.remote_ca_guid = rep.local_ca_guid;
        c.conn.remote_qpn = rep.local_qpn;
        c.conn.rq_psn = rep.starting_psn;
        c.conn.peer_rr = rep.responder_resources;
        c.conn.peer_id = rep.initiator_depth;
        c.conn.rnr_retry = rep.rnr_retry_count;
        if rep.failover_accepted != 0 {
            c.conn.alternate = None;
        }
        c.flags |= CONN_READY;
        self.link_remote(idx);
        self.push_event(idx, Event::Reply { rep: *rep });
    }

    /// The RTU again, for a REP again; or the DREP of the CEP's last DREQ.
    /// Both with the private data kept when they were first sent.
    pub(super) fn send_reply(&mut self, idx: u32, reply: Reply) {
        let Some(c) = self.table.get(idx) else {
            return;
        };
        let (local_comm_id, remote_comm_id) = (c.id.0, c.remote_id);
        let (msg, tid) = match reply {
            Reply::Rtu => {
                let private_data = c.kept_pdata();
                let rtu = Rtu {
                    local_comm_id,
                    remote_comm_id,
                    private_data,
                };
                (CmMsg::Rtu(rtu), c.tid)
            }
            Reply::Drep => {
                let private_data = c.kept_pdata();
                let drep = Drep {
                    local_comm_id,
                    remote_comm_id,
                    private_data,
                };
                (CmMsg::Drep(drep), c.aux_tid)
            }
        };
        let dest = c.addr;
        self.send(dest, tid, msg);
    }

    // -------------------------------------------------------------- MRA, REJ, RTU

    fn on_mra(&mut self, now: Nanos, mra: &Mra) {
        let Some(idx) = self.addressed(mra.remote_comm_id, mra.local_comm_id) else {
            return self.unmatched();
        };
        let Some(c) = self.table.get_mut(idx) else {
            return;
        };
        let first = match (mra.msg_mraed, c.state, c.lap) {
            (MraedMsg::Req, State::ReqSent, _) => {
                c.state = State::MraReqRcvd;
                // The passive side's ID, for a REJ before its REP.
                c.remote_id = mra.local_comm_id;
                true
            }
            (MraedMsg::Rep, State::RepSent, _) => {
                c.state = State::MraRepRcvd;
                true
            }
            (MraedMsg::Lap, State::Established, LapState::LapSent) => {
                c.lap = LapState::MraLapRcvd;
                true
            }
            (MraedMsg::Req, State::MraReqRcvd, _)
            | (MraedMsg::Rep, State::MraRepRcvd, _)
            | (MraedMsg::Lap, State::Established, LapState::MraLapRcvd) => false,
            _ => return self.unmatched(),
        };
        let wait = Self::wait(c, mra.service_timeout);
        self.arm(idx, now.saturating_add(wait));
        if first {
            let ev = Event::MraReceived {
                msg: mra.msg_mraed,
                service_timeout: mra.service_timeout,
            };
            self.push_event(idx, ev);
        } else {
            self.stats.duplicates += 1;
        }
    }

    fn on_rej(&mut self, now: Nanos, rej: &Rej) {
        let found = self
            .addressed(rej.remote_comm_id, rej.local_comm_id)
            .or_else(|| {
                // A timeout REJ before the sender learned this side's ID
                // names the sender's CA in the ARI.
                let ari = rej.ari.as_bytes();
                let guid: [u8; 8] = ari.get(..8)?.try_into().ok()?;
                (rej.reason == RejReason::TIMEOUT)
                    .then(|| {
                        self.by_remote
                            .get(&(u64::from_be_bytes(guid), rej.local_comm_id))
                    })
                    .flatten()
                    .copied()
            });
        let Some(idx) = found else {
            return self.unmatched();
        };
        let Some(state) = self.table.get(idx).map(|c| c.state) else {
            return;
        };
        let stale = rej.reason == RejReason::STALE_CONNECTION;
        match state {
            State::ReqSent
            | State::MraReqRcvd
            | State::ReqRcvd
            | State::MraReqSent
            | State::RepSent
            | State::MraRepRcvd => {
                if stale {
                    self.enter_timewait(idx, now);
                } else {
                    self.reset_idle(idx);
                }
            }
            State::RepRcvd | State::MraRepSent | State::Established | State::DreqSent => {
                self.enter_timewait(idx, now);
            }
            _ => return self.unmatched(),
        }
        self.push_event(
            idx,
            Event::Rejected {
                rej: *rej,
                sent: false,
            },
        );
    }

    fn on_rtu(&mut self, rtu: &Rtu) {
        let Some(idx) = self.addressed(rtu.remote_comm_id, rtu.local_comm_id) else {
            return self.unmatched();
        };
        match self.table.get_mut(idx) {
            Some(c) if matches!(c.state, State::RepSent | State::MraRepRcvd) => {
                c.state = State::Established;
                c.sent = None;
                self.disarm(idx);
                self.push_event(idx, Event::Established);
            }
            _ => self.unmatched(),
        }
    }

    // -------------------------------------------------------------- DREQ, DREP

    fn on_dreq(&mut self, now: Nanos, hdr: &MadHeader, src: &MadAddr, dreq: &Dreq) {
        let found = self
            .addressed(dreq.remote_comm_id, dreq.local_comm_id)
            .filter(|&i| {
                self.table
                    .get(i)
                    .is_some_and(|c| c.remote_id == dreq.local_comm_id)
            });
        let Some(idx) = found else {
            // No such connection (any more): the remote's disconnect is
            // complete.
            let drep = Drep {
                local_comm_id: dreq.remote_comm_id,
                remote_comm_id: dreq.local_comm_id,
                private_data: [0; msg::DREP_PDATA],
            };
            self.unmatched();
            self.send(*src, hdr.tid, CmMsg::Drep(drep));
            return;
        };
        let Some(c) = self.table.get_mut(idx) else {
            return;
        };
        if dreq.remote_qpn != c.conn.local_qpn {
            return self.unmatched();
        }
        match c.state {
            State::Established | State::RepSent | State::MraRepRcvd => {
                // A DREQ before the RTU: the remote got the REP and was
                // established, so this side was too.
                let accepting = c.state != State::Established;
                c.state = State::DreqRcvd;
                c.end_lap();
                c.sent = None;
                c.aux_tid = hdr.tid;
                self.disarm(idx);
                if accepting {
                    self.push_event(idx, Event::Established);
                }
                self.push_event(idx, Event::DisconnectRequest { dreq: *dreq });
            }
            State::DreqSent => {
                // Both sides disconnect: answer, and this side's disconnect
                // is complete too.
                c.aux_tid = hdr.tid;
                c.pdata = None;
                self.send_reply(idx, Reply::Drep);
                self.enter_timewait(idx, now);
                self.push_event(idx, Event::DisconnectReply { private_data: None });
            }
            State::Timewait => {
                self.stats.duplicates += 1;
                c.aux_tid = hdr.tid;
                self.send_reply(idx, Reply::Drep);
            }
            State::DreqRcvd => self.stats.duplicates += 1,
            _ => self.unmatched(),
        }
    }

    fn on_drep(&mut self, now: Nanos, drep: &Drep) {
        let Some(idx) = self.addressed(drep.remote_comm_id, drep.local_comm_id) else {
            return self.unmatched();
        };
        if self
            .table
            .get(idx)
            .is_some_and(|c| c.state == State::DreqSent)
        {
            self.enter_timewait(idx, now);
            let ev = Event::DisconnectReply {
                private_data: Some(drep.private_data),
            };
            self.push_event(idx, ev);
        } else {
            self.unmatched();
        }
    }

    // -------------------------------------------------------------- LAP, APR

    fn on_lap(&mut self, hdr: &MadHeader, lap: &Lap) {
        let Some(idx) = self.addressed(lap.remote_comm_id, lap.local_comm_id) else {
            return self.unmatched();
        };
        let Some(c) = self.table.get_mut(idx) else {
            return;
        };
        if c.state != State::Established || lap.remote_qpn != c.conn.local_qpn {
            return self.unmatched();
        }
        let status = match c.lap {
            LapState::Idle if c.has(APR_SENT) && c.aux_tid == hdr.tid => {
                // The APR was lost: the same answer again.
                self.stats.duplicates += 1;
                AprStatus(c.apr_status)
            }
            LapState::Idle => {
                c.lap = LapState::LapRcvd;
                c.aux_tid = hdr.tid;
                c.flags &= !APR_SENT;
                // Refused: no alternate pending, and loading it fails
                // (`qp_attr(LoadAlt)`) for the owner to answer the LAP.
                c.alt_pending = crate::fallible::try_box_slice(&[lap.alternate.reversed()]);
                return self.push_event(idx, Event::LapReceived { lap: *lap });
            }
            LapState::MraLapSent => {
                self.stats.duplicates += 1;
                return self.resend(idx);
            }
            LapState::LapRcvd => {
                self.stats.duplicates += 1;
                return;
            }
            // Both sides load a path at once: this side's goes first.
            LapState::LapSent | LapState::MraLapRcvd => AprStatus::REJECTED,
        };
        let apr = Apr {
            local_comm_id: c.id.0,
            remote_comm_id: c.remote_id,
            status,
            info: Info::EMPTY,
            private_data: [0; msg::APR_PDATA],
        };
        let dest = c.addr;
        self.send(dest, hdr.tid, CmMsg::Apr(apr));
    }

    fn on_apr(&mut self, apr: &Apr) {
        let Some(idx) = self.addressed(apr.remote_comm_id, apr.local_comm_id) else {
            return self.unmatched();
        };
        match self.table.get_mut(idx) {
            Some(c)
                if c.state == State::Established
                    && matches!(c.lap, LapState::LapSent | LapState::MraLapRcvd) =>
            {
                let path = c.alt_pending.take();
                if apr.status == AprStatus::ACCEPTED {
                    c.conn.alternate = path.and_then(|p| p.first().copied());
                }
                c.lap = LapState::Idle;
                c.sent = None;
                self.disarm(idx);
                self.push_event(idx, Event::AprReceived { apr: *apr });
            }
            _ => self.unmatched(),
        }
    }

    // -------------------------------------------------------------- SIDR

    fn on_sidr_req(&mut self, hdr: &MadHeader, src: &MadAddr, req: &SidrReq) {
        if self.sidr.contains_key(&(src.gid, req.request_id)) {
            self.stats.duplicates += 1;
            return;
        }
        let listener = self
            .listener(req.service_id, None)
            .and_then(|l| Some((l, self.table.get(l)?.context)));
        let alloc = listener.and_then(|(l, ctx)| Some((l, self.alloc_cep(ctx)?)));
        let Some((lidx, (idx, id))) = alloc else {
            let status = if listener.is_some() {
                SidrStatus::NO_QP
            } else {
                SidrStatus::UNSUPPORTED_SERVICE_ID
            };
            let rep = SidrRep {
                request_id: req.request_id,
                status,
                vendor_id: 0,
                qpn: 0,
                service_id: req.service_id,
                qkey: 0,
                info: Info::EMPTY,
                private_data: [0; msg::SIDR_REP_PDATA],
            };
            self.send(*src, hdr.tid, CmMsg::SidrRep(rep));
            return;
        };
        if let Some(c) = self.table.get_mut(idx) {
            c.state = State::SidrReqRcvd;
            c.remote_id = req.request_id;
            c.service_id = req.service_id;
            c.tid = hdr.tid;
            c.addr = *src;
            c.flags |= IN_SIDR;
            // The room was reserved when the CEP was made.
            let _ = self.sidr.insert_reserved((src.gid, req.request_id), idx);
        }
        self.push_event(
            lidx,
            Event::SidrRequest {
                cep: id,
                src: *src,
                req: *req,
            },
        );
    }

    fn on_sidr_rep(&mut self, rep: &SidrRep) {
        let idx = self.table.lookup(CepId(rep.request_id));
        match idx.and_then(|i| Some((i, self.table.get(i)?.state))) {
            Some((idx, State::SidrReqSent)) => {
                self.reset_idle(idx);
                self.push_event(idx, Event::SidrReply { rep: *rep });
            }
            _ => self.unmatched(),
        }
    }
}
