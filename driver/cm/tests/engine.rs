//! The CM state machine, transition by transition, over a fault-free wire
//! delivered step by step.

mod common;

use common::*;
use irpverbs_abi::{IV_QPS_INIT, IV_QPS_RESET, IV_QPS_RTR, IV_QPS_RTS, IV_QPT_RC, IV_QPT_UC};
use irpverbs_cm::msg::{
    self, AprStatus, CmMsg, Info, Mad, MraedMsg, Path, RejReason, Rep, Req, SidrStatus,
    TransportType,
};
use irpverbs_cm::{
    AcceptParams, CepId, CmError, Config, ConnectParams, Engine, Event, LapState, MadAddr, Op,
    QpTarget, SidrParams, SidrReplyParams, State, Transmit, cm_time,
};
use irpverbs_core::qp_state::check_modify;

fn take(log: &mut Log) -> Vec<(usize, CepId, Event)> {
    std::mem::take(&mut log.0)
}

/// The only event of the log, checked to be on `node`.
fn only(log: &mut Log, node: usize) -> (CepId, Event) {
    let evs = take(log);
    assert_eq!(evs.len(), 1, "{evs:#?}");
    let (n, c, e) = evs[0];
    assert_eq!(n, node, "{evs:#?}");
    (c, e)
}

fn sim() -> Sim {
    Sim::new(1, Faults::default(), 0)
}

fn listener(s: &mut Sim) -> CepId {
    let l = s.e[1].create(77).unwrap();
    s.e[1].listen(l, SID).unwrap();
    l
}

/// Node 0 connects to node 1's listener; returns (active, passive) once
/// the passive side has the request (`ReqRcvd`).
fn requested(s: &mut Sim, log: &mut Log, qpn: u32) -> (CepId, CepId) {
    let (a, b, _) = request_with(s, log, &connect_params(0, 1, qpn));
    (a, b)
}

/// Node 0 connects with `p` to node 1's listener; returns (active,
/// passive, REQ) once the passive side has the request (`ReqRcvd`).
fn request_with(s: &mut Sim, log: &mut Log, p: &ConnectParams<'_>) -> (CepId, CepId, Req) {
    let a = s.e[0].create(1).unwrap();
    s.e[0].connect(a, p, s.now).unwrap();
    assert_eq!(s.e[0].state(a), Some(State::ReqSent));
    s.deliver_now(log);
    let (_, ev) = only(log, 1);
    let Event::ConnectRequest { cep: b, req, src } = ev else {
        panic!("{ev:?}");
    };
    assert_eq!(req.local_qpn, p.qpn);
    assert_eq!(src, gsi(0));
    assert_eq!(s.e[1].state(b), Some(State::ReqRcvd));
    assert_eq!(
        s.e[1].context(b),
        Some(77),
        "a new CEP has its listener's context"
    );
    (a, b, req)
}

/// The CEP's INIT, RTR and RTS attributes are valid modifies of the
/// driver's QP state machine for a QP of `qp_type`.
fn walks_to_rts(e: &Engine, id: CepId, qp_type: u32) {
    let steps = [
        (QpTarget::Init, IV_QPS_RESET, IV_QPS_INIT),
        (QpTarget::Rtr, IV_QPS_INIT, IV_QPS_RTR),
        (QpTarget::Rts, IV_QPS_RTR, IV_QPS_RTS),
    ];
    for (target, from, to) in steps {
        let m = e.qp_attr(id, target).unwrap();
        assert_eq!(
            check_modify(qp_type, from, m.mask, &m.attr),
            Ok(to),
            "{target:?}"
        );
    }
}

/// A connection from node 0 (QP `qpn`) to node 1 (QP `qpn + 1`).
fn established(s: &mut Sim, log: &mut Log, qpn: u32) -> (CepId, CepId) {
    let (a, b) = requested(s, log, qpn);
    s.e[1].accept(b, &accept_params(qpn + 1), s.now).unwrap();
    s.deliver_now(log);
    assert!(matches!(only(log, 0), (c, Event::Reply { .. }) if c == a));
    s.e[0].rtu(a, &[]).unwrap();
    s.deliver_now(log);
    assert_eq!(only(log, 1), (b, Event::Established));
    assert_eq!(s.e[0].state(a), Some(State::Established));
    assert_eq!(s.e[1].state(b), Some(State::Established));
    (a, b)
}

fn sent(e: &mut Engine) -> Vec<Transmit> {
    std::iter::from_fn(|| e.poll_transmit()).collect()
}

fn parsed(t: &Transmit) -> CmMsg {
    msg::parse(&t.mad).unwrap().msg
}

fn rej_of(t: &Transmit) -> msg::Rej {
    match parsed(t) {
        CmMsg::Rej(r) => r,
        m => panic!("not a REJ: {m:?}"),
    }
}

// ------------------------------------------------------------ establishment

#[test]
fn connect_accept_rtu_with_qp_attributes_both_sides_agree_on() {
    let mut s = sim();
    let mut log = Log::default();
    listener(&mut s);
    let (a, b) = requested(&mut s, &mut log, 0x111);
    assert_eq!(
        connect_params(0, 1, 0x111).init_attr(),
        s.e[0].qp_attr(a, QpTarget::Init).unwrap()
    );
    let p = AcceptParams {
        responder_resources: 9,
        initiator_depth: 4,
        ..accept_params(0x222)
    };
    // The passive side moves its QP before it accepts.
    let init = s.e[1].accept_qp_attr(b, &p, QpTarget::Init).unwrap();
    let rtr = s.e[1].accept_qp_attr(b, &p, QpTarget::Rtr).unwrap();
    let rts = s.e[1].accept_qp_attr(b, &p, QpTarget::Rts).unwrap();
    assert_eq!(
        s.e[1].qp_attr(b, QpTarget::Rtr),
        Err(CmError::InvalidState(State::ReqRcvd))
    );
    s.e[1].accept(b, &p, s.now).unwrap();
    assert_eq!(s.e[1].state(b), Some(State::RepSent));
    assert_eq!(
        s.e[1].qp_attr(b, QpTarget::Rtr).unwrap(),
        rtr,
        "accept applied the same values"
    );
    assert_eq!(rtr.attr.dest_qp_num, 0x111);
    assert_eq!(rtr.attr.rq_psn, 0x111 ^ 0x5A5A);
    assert_eq!(rtr.attr.ah_attr.dgid, gid(0));
    assert_eq!(rtr.attr.ah_attr.is_global, 1);
    assert_eq!(rtr.attr.path_mtu, 5);
    assert_eq!(
        rtr.attr.max_dest_rd_atomic, 1,
        "cut to the REQ's initiator depth"
    );
    assert_eq!(rts.attr.sq_psn, 0x222 ^ 0xA5A5);
    assert_eq!(
        rts.attr.max_rd_atomic, 1,
        "cut to the REQ's responder resources"
    );
    assert_eq!(rts.attr.timeout, ACK);
    assert_eq!(rts.attr.retry_cnt, 7);

    s.deliver_now(&mut log);
    let (c, ev) = only(&mut log, 0);
    assert_eq!(c, a);
    let Event::Reply { rep } = ev else {
        panic!("{ev:?}")
    };
    assert_eq!(
        (rep.local_qpn, rep.responder_resources, rep.initiator_depth),
        (0x222, 1, 1)
    );
    assert_eq!(s.e[0].state(a), Some(State::RepRcvd));
    let artr = s.e[0].qp_attr(a, QpTarget::Rtr).unwrap();
    let arts = s.e[0].qp_attr(a, QpTarget::Rts).unwrap();
    assert_eq!(artr.attr.dest_qp_num, 0x222);
    assert_eq!(
        artr.attr.rq_psn, rts.attr.sq_psn,
        "each side receives what the other sends"
    );
    assert_eq!(arts.attr.sq_psn, rtr.attr.rq_psn);
    assert_eq!(artr.attr.ah_attr.dgid, gid(1));
    assert_eq!(s.e[0].remote(a), Some((b.0, GUID[1])));
    assert_eq!(s.e[1].remote(b), Some((a.0, GUID[0])));

    // Every set of attributes is a valid modify of the driver's QP state
    // machine.
    walks_to_rts(&s.e[0], a, IV_QPT_RC);
    walks_to_rts(&s.e[1], b, IV_QPT_RC);
    assert_eq!(init.attr.port_num, 1);

    s.e[0].rtu(a, b"hello").unwrap();
    assert_eq!(s.e[0].state(a), Some(State::Established));
    s.deliver_now(&mut log);
    assert_eq!(only(&mut log, 1), (b, Event::Established));
    assert_eq!(s.e[1].state(b), Some(State::Established));
    assert!(s.e[0].next_deadline().is_none() && s.e[1].next_deadline().is_none());
}

#[test]
fn uc_connections_get_uc_attributes() {
    let mut s = sim();
    let mut log = Log::default();
    listener(&mut s);
    let p = ConnectParams {
        transport: TransportType::Uc,
        ..connect_params(0, 1, 5)
    };
    let (a, b, _) = request_with(&mut s, &mut log, &p);
    s.e[1].accept(b, &accept_params(6), 0).unwrap();
    s.deliver_now(&mut log);
    walks_to_rts(&s.e[0], a, IV_QPT_UC);
    walks_to_rts(&s.e[1], b, IV_QPT_UC);
}

#[test]
fn alternate_path_from_the_req_is_loaded_unless_refused() {
    for accept_alternate in [true, false] {
        let mut s = sim();
        let mut log = Log::default();
        listener(&mut s);
        let alt = Path {
            traffic_class: 8,
            ..path(0, 1)
        };
        let p = ConnectParams {
            alternate: Some(alt),
            ..connect_params(0, 1, 5)
        };
        let (a, b, req) = request_with(&mut s, &mut log, &p);
        assert_eq!(req.alternate, Some(alt));
        let ap = AcceptParams {
            accept_alternate,
            ..accept_params(6)
        };
        s.e[1].accept(b, &ap, 0).unwrap();
        s.deliver_now(&mut log);
        let (_, Event::Reply { rep }) = only(&mut log, 0) else {
            panic!()
        };
        assert_eq!(rep.failover_accepted, u8::from(!accept_alternate));
        for (e, id) in [(&s.e[0], a), (&s.e[1], b)] {
            let rtr = e.qp_attr(id, QpTarget::Rtr).unwrap();
            let rts = e.qp_attr(id, QpTarget::Rts).unwrap();
            let has = rtr.mask & irpverbs_abi::IV_QP_ALT_PATH != 0;
            assert_eq!(has, accept_alternate);
            if has {
                assert_eq!(rtr.attr.alt_ah_attr.traffic_class, 8);
                assert_eq!(rts.attr.path_mig_state, irpverbs_abi::IV_MIG_REARM);
            }
            walks_to_rts(e, id, IV_QPT_RC);
        }
    }
}

#[test]
fn mra_for_req_and_rep_extend_the_waits() {
    let mut s = sim();
    let mut log = Log::default();
    listener(&mut s);
    let (a, b) = requested(&mut s, &mut log, 0x10);
    // The passive side needs time: MRA with 2^16 * 4.096 us (268 ms).
    s.e[1].mra(b, 16, b"wait").unwrap();
    assert_eq!(s.e[1].state(b), Some(State::MraReqSent));
    s.deliver_now(&mut log);
    let ev = only(&mut log, 0);
    assert_eq!(
        ev,
        (
            a,
            Event::MraReceived {
                msg: MraedMsg::Req,
                service_timeout: 16
            }
        )
    );
    assert_eq!(s.e[0].state(a), Some(State::MraReqRcvd));
    // No retransmission within the extended wait.
    let before = s.e[0].stats().retransmits;
    assert!(!s.run_for(&mut log, cm_time(16)));
    assert_eq!(s.e[0].stats().retransmits, before);
    assert!(take(&mut log).is_empty());
    s.e[1].accept(b, &accept_params(0x11), s.now).unwrap();
    s.deliver_now(&mut log);
    assert!(matches!(only(&mut log, 0), (_, Event::Reply { .. })));
    // The active side needs time before its RTU.
    s.e[0].mra(a, 17, &[]).unwrap();
    assert_eq!(s.e[0].state(a), Some(State::MraRepSent));
    s.deliver_now(&mut log);
    let ev = only(&mut log, 1);
    assert_eq!(
        ev,
        (
            b,
            Event::MraReceived {
                msg: MraedMsg::Rep,
                service_timeout: 17
            }
        )
    );
    assert_eq!(s.e[1].state(b), Some(State::MraRepRcvd));
    s.e[0].rtu(a, &[]).unwrap();
    s.deliver_now(&mut log);
    assert_eq!(only(&mut log, 1), (b, Event::Established));
}

#[test]
fn comm_established_completes_accept_before_the_rtu() {
    let mut s = sim();
    let mut log = Log::default();
    listener(&mut s);
    let (a, b) = requested(&mut s, &mut log, 0x10);
    s.e[1].accept(b, &accept_params(0x11), 0).unwrap();
    s.e[1].notify_established(b).unwrap();
    assert_eq!(s.e[1].state(b), Some(State::Established));
    s.e[1].notify_established(b).unwrap();
    s.deliver_now(&mut log);
    let evs = take(&mut log);
    assert_eq!(evs.len(), 2, "{evs:?}");
    assert!(evs.contains(&(1, b, Event::Established)));
    s.e[0].rtu(a, &[]).unwrap();
    s.deliver_now(&mut log);
    assert!(take(&mut log).is_empty(), "the late RTU changes nothing");
    assert_eq!(
        s.e[1].next_deadline(),
        None,
        "the REP is no longer retransmitted"
    );
}

// ------------------------------------------------------------ disconnection

#[test]
fn disconnect_from_either_side_through_timewait_to_idle() {
    for (from, to) in [(0, 1), (1, 0)] {
        let mut s = sim();
        let mut log = Log::default();
        listener(&mut s);
        let ids = established(&mut s, &mut log, 0x40);
        let ids = [ids.0, ids.1];
        s.e[from].disconnect(ids[from], b"bye", s.now).unwrap();
        assert_eq!(s.e[from].state(ids[from]), Some(State::DreqSent));
        s.deliver_now(&mut log);
        let (c, ev) = only(&mut log, to);
        assert_eq!(c, ids[to]);
        let Event::DisconnectRequest { dreq } = ev else {
            panic!("{ev:?}")
        };
        assert_eq!(&dreq.private_data[..3], b"bye");
        assert_eq!(s.e[to].state(ids[to]), Some(State::DreqRcvd));
        assert_eq!(
            s.e[to]
                .qp_attr(ids[to], QpTarget::Error)
                .unwrap()
                .attr
                .qp_state,
            irpverbs_abi::IV_QPS_ERR
        );
        s.e[to].drep(ids[to], b"ok", s.now).unwrap();
        assert_eq!(s.e[to].state(ids[to]), Some(State::Timewait));
        s.deliver_now(&mut log);
        let (c, ev) = only(&mut log, from);
        assert_eq!(c, ids[from]);
        let Event::DisconnectReply {
            private_data: Some(pd),
        } = ev
        else {
            panic!("{ev:?}")
        };
        assert_eq!(&pd[..2], b"ok");
        assert_eq!(s.e[from].state(ids[from]), Some(State::Timewait));
        assert!(s.run(&mut log, u64::MAX));
        let evs = take(&mut log);
        assert_eq!(evs.len(), 2);
        assert!(evs.iter().all(|e| e.2 == Event::TimewaitExit));
        assert_eq!(s.e[0].state(ids[0]), Some(State::Idle));
        assert_eq!(s.e[1].state(ids[1]), Some(State::Idle));
        // An idle CEP connects again.
        s.e[0]
            .connect(ids[0], &connect_params(0, 1, 0x90), s.now)
            .unwrap();
    }
}

#[test]
fn disconnect_from_both_sides_at_once() {
    let mut s = sim();
    let mut log = Log::default();
    listener(&mut s);
    let (a, b) = established(&mut s, &mut log, 0x40);
    s.e[0].disconnect(a, &[], s.now).unwrap();
    s.e[1].disconnect(b, &[], s.now).unwrap();
    s.deliver_now(&mut log);
    let evs = take(&mut log);
    assert!(
        evs.contains(&(0, a, Event::DisconnectReply { private_data: None })),
        "{evs:?}"
    );
    assert!(
        evs.contains(&(1, b, Event::DisconnectReply { private_data: None })),
        "{evs:?}"
    );
    assert_eq!(
        evs.len(),
        2,
        "the DREPs that follow find both in time wait: {evs:?}"
    );
    assert_eq!(s.e[0].state(a), Some(State::Timewait));
    assert_eq!(s.e[1].state(b), Some(State::Timewait));
    assert!(s.run(&mut log, u64::MAX));
    assert_eq!(s.e[0].state(a), Some(State::Idle));
    assert_eq!(s.e[1].state(b), Some(State::Idle));
}

#[test]
fn dreq_before_the_rtu_establishes_then_disconnects() {
    let mut s = sim();
    let mut log = Log::default();
    listener(&mut s);
    let (a, b) = requested(&mut s, &mut log, 0x10);
    s.e[1].accept(b, &accept_params(0x11), 0).unwrap();
    s.deliver_now(&mut log);
    take(&mut log);
    s.e[0].rtu(a, &[]).unwrap();
    let _rtu_lost = sent(&mut s.e[0]);
    s.e[0].disconnect(a, &[], 0).unwrap();
    s.deliver_now(&mut log);
    let evs = take(&mut log);
    assert_eq!(evs[0], (1, b, Event::Established));
    assert!(matches!(evs[1], (1, c, Event::DisconnectRequest { .. }) if c == b));
}

#[test]
fn dreq_for_no_connection_gets_a_drep() {
    let mut s = sim();
    let dreq = msg::Dreq {
        local_comm_id: 5,
        remote_comm_id: 0x1234,
        remote_qpn: 9,
        private_data: [0; msg::DREQ_PDATA],
    };
    let bytes = Mad::new(42, CmMsg::Dreq(dreq)).to_bytes();
    s.e[1].receive(0, &gsi(0), &bytes).unwrap();
    let out = sent(&mut s.e[1]);
    assert_eq!(out.len(), 1);
    let m = msg::parse(&out[0].mad).unwrap();
    assert_eq!(m.hdr.tid, 42);
    assert!(matches!(m.msg, CmMsg::Drep(d) if d.local_comm_id == 0x1234 && d.remote_comm_id == 5));
    assert_eq!(out[0].dest, gsi(0));
}

// ------------------------------------------------------------ timeouts

#[test]
fn unanswered_req_retries_then_times_out_with_a_rej() {
    let mut s = sim();
    let mut log = Log::default();
    s.cut[1] = true;
    let a = s.e[0].create(0).unwrap();
    s.e[0].connect(a, &connect_params(0, 1, 1), 0).unwrap();
    assert!(s.run(&mut log, u64::MAX));
    assert_eq!(
        take(&mut log),
        vec![(0, a, Event::Timeout { op: Op::Connect })]
    );
    assert_eq!(s.e[0].state(a), Some(State::Idle));
    let st = s.e[0].stats();
    assert_eq!((st.retransmits, st.timeouts), (u64::from(RETRIES), 1));
    // 16 waits of (response time + ACK timeout).
    assert_eq!(s.now, 16 * (cm_time(RESP) + cm_time(ACK)));
    // REQ, 15 retransmissions, REJ(Timeout) carrying this CA's GUID.
    assert_eq!(s.sent, 17);
}

#[test]
fn timeout_rej_reaches_the_passive_side_by_its_ari() {
    let mut s = sim();
    let mut log = Log::default();
    listener(&mut s);
    let (a, b) = requested(&mut s, &mut log, 0x10);
    s.cut[1] = false;
    // The passive side never answers: the active side gives up and tells it.
    assert!(s.run(&mut log, u64::MAX));
    let evs = take(&mut log);
    assert!(evs.contains(&(0, a, Event::Timeout { op: Op::Connect })));
    let rej = evs.iter().find_map(|e| match e {
        (1, c, Event::Rejected { rej, sent: false }) if *c == b => Some(*rej),
        _ => None,
    });
    let rej = rej.expect("the passive side learns of the timeout");
    assert_eq!(rej.reason, RejReason::TIMEOUT);
    assert_eq!(rej.ari.as_bytes(), GUID[0].to_be_bytes());
    assert_eq!(s.e[1].state(b), Some(State::Idle));
}

#[test]
fn unanswered_rep_dreq_lap_and_sidr_time_out() {
    // REP: the RTU never comes; the passive side rejects with Timeout.
    let mut s = sim();
    let mut log = Log::default();
    listener(&mut s);
    let (a, b) = requested(&mut s, &mut log, 0x10);
    s.cut[0] = true;
    s.e[1].accept(b, &accept_params(0x11), s.now).unwrap();
    s.run(&mut log, u64::MAX);
    let evs = take(&mut log);
    assert!(
        evs.contains(&(1, b, Event::Timeout { op: Op::Accept })),
        "{evs:?}"
    );
    assert!(evs.contains(&(1, b, Event::TimewaitExit)), "{evs:?}");
    assert_eq!(s.e[1].state(b), Some(State::Idle));
    let _ = a;

    // DREQ: no DREP.
    let mut s = sim();
    listener(&mut s);
    let (a, _) = established(&mut s, &mut log, 0x20);
    s.cut[1] = true;
    s.e[0].disconnect(a, &[], s.now).unwrap();
    s.run(&mut log, u64::MAX);
    let evs = take(&mut log);
    assert_eq!(
        evs,
        vec![
            (0, a, Event::Timeout { op: Op::Disconnect }),
            (0, a, Event::TimewaitExit)
        ]
    );

    // LAP: no APR; the connection stays.
    let mut s = sim();
    listener(&mut s);
    let (a, _) = established(&mut s, &mut log, 0x30);
    s.cut[1] = true;
    s.e[0]
        .load_alternate_path(a, &path(0, 1), &[], s.now)
        .unwrap();
    assert_eq!(s.e[0].lap_state(a), Some(LapState::LapSent));
    s.run(&mut log, u64::MAX);
    assert_eq!(
        take(&mut log),
        vec![(
            0,
            a,
            Event::Timeout {
                op: Op::LoadAltPath
            }
        )]
    );
    assert_eq!(s.e[0].state(a), Some(State::Established));
    assert_eq!(s.e[0].lap_state(a), Some(LapState::Idle));

    // SIDR: no SIDR_REP.
    let mut s = sim();
    s.cut[1] = true;
    let c = s.e[0].create(0).unwrap();
    let p = SidrParams {
        dest: gsi(1),
        service_id: SID,
        pkey: 0xFFFF,
        timeout: 12,
        max_retries: 3,
        private_data: &[],
    };
    s.e[0].sidr_request(c, &p, 0).unwrap();
    s.run(&mut log, u64::MAX);
    assert_eq!(
        take(&mut log),
        vec![(0, c, Event::Timeout { op: Op::Sidr })]
    );
    assert_eq!(
        s.now,
        4 * (cm_time(12) + cm_time(0)),
        "no path: 4.096 us each way"
    );
    assert_eq!(s.e[0].state(c), Some(State::Idle));
}

// ------------------------------------------------------------ rejects

#[test]
fn every_reject_reason_reaches_the_active_side_with_its_ari_and_data() {
    let mut s = sim();
    let mut log = Log::default();
    listener(&mut s);
    for (i, reason) in RejReason::ALL.into_iter().enumerate() {
        let (a, b) = requested(&mut s, &mut log, 0x100 + i as u32);
        let ari = [reason.0 as u8; 5];
        s.e[1].reject(b, reason, &ari, b"no thanks", s.now).unwrap();
        assert_eq!(s.e[1].state(b), Some(State::Idle));
        s.deliver_now(&mut log);
        let (c, ev) = only(&mut log, 0);
        assert_eq!(c, a);
        let Event::Rejected { rej, sent: false } = ev else {
            panic!("{ev:?}")
        };
        assert_eq!(rej.reason, reason);
        assert_eq!(rej.msg_rejected, msg::RejectedMsg::Req);
        assert_eq!(rej.ari.as_bytes(), ari);
        assert_eq!(&rej.private_data[..9], b"no thanks");
        let after = if reason == RejReason::STALE_CONNECTION {
            State::Timewait
        } else {
            State::Idle
        };
        assert_eq!(s.e[0].state(a), Some(after), "{reason:?}");
        s.e[0].destroy(a, s.now).unwrap();
        s.e[1].destroy(b, s.now).unwrap();
    }
}

#[test]
fn reject_from_every_rejectable_state() {
    let mut s = sim();
    let mut log = Log::default();
    listener(&mut s);
    let r = RejReason::CONSUMER_REJECT;
    // Active side withdraws its REQ before hearing from the passive side:
    // the passive side can only match a REJ(Timeout) naming this CA.
    let (a, b) = requested(&mut s, &mut log, 0x10);
    s.e[0].reject(a, r, &[], &[], 0).unwrap();
    assert_eq!(s.e[0].state(a), Some(State::Idle));
    s.deliver_now(&mut log);
    let (c, Event::Rejected { rej, .. }) = only(&mut log, 1) else {
        panic!()
    };
    assert_eq!((c, rej.reason), (b, RejReason::TIMEOUT));
    assert_eq!(s.e[1].state(b), Some(State::Idle));
    // After an MRA it knows the passive side's ID: the reason goes as is.
    let (a, b) = requested(&mut s, &mut log, 0x18);
    s.e[1].mra(b, 10, &[]).unwrap();
    s.deliver_now(&mut log);
    take(&mut log);
    s.e[0].reject(a, r, &[], &[], 0).unwrap();
    s.deliver_now(&mut log);
    let (c, Event::Rejected { rej, .. }) = only(&mut log, 1) else {
        panic!()
    };
    assert_eq!((c, rej.reason), (b, r));
    // Active side rejects the REP.
    let (a, b) = requested(&mut s, &mut log, 0x20);
    s.e[1].accept(b, &accept_params(0x21), 0).unwrap();
    s.deliver_now(&mut log);
    take(&mut log);
    s.e[0].reject(a, r, &[], &[], 0).unwrap();
    s.deliver_now(&mut log);
    let (c, Event::Rejected { rej, .. }) = only(&mut log, 1) else {
        panic!()
    };
    assert_eq!((c, rej.msg_rejected), (b, msg::RejectedMsg::Rep));
    assert_eq!(s.e[1].state(b), Some(State::Idle));
    // Passive side withdraws its REP: time wait on both sides.
    let (a, b) = requested(&mut s, &mut log, 0x30);
    s.e[1].accept(b, &accept_params(0x31), 0).unwrap();
    s.deliver_now(&mut log);
    take(&mut log);
    s.e[1].reject(b, r, &[], &[], 0).unwrap();
    assert_eq!(s.e[1].state(b), Some(State::Timewait));
    s.deliver_now(&mut log);
    assert!(matches!(only(&mut log, 0), (c, Event::Rejected { .. }) if c == a));
    assert_eq!(s.e[0].state(a), Some(State::Timewait));
    // Nothing to reject when established.
    let (a, _) = established(&mut s, &mut log, 0x40);
    assert_eq!(
        s.e[0].reject(a, r, &[], &[], 0),
        Err(CmError::InvalidState(State::Established))
    );
}

#[test]
fn rejects_the_engine_sends_by_itself() {
    let mut s = sim();
    let mut log = Log::default();
    // No listener: invalid service ID.
    let a = s.e[0].create(0).unwrap();
    s.e[0].connect(a, &connect_params(0, 1, 1), 0).unwrap();
    s.deliver_now(&mut log);
    let (_, Event::Rejected { rej, .. }) = only(&mut log, 0) else {
        panic!()
    };
    assert_eq!(rej.reason, RejReason::INVALID_SERVICE_ID);
    assert_eq!(s.e[0].state(a), Some(State::Idle));

    // A REQ the engine cannot take.
    let base = Req::parse(&zerocopy::FromZeros::new_zeroed());
    let req = Req {
        local_comm_id: 0x77,
        service_id: SID,
        local_ca_guid: GUID[0],
        path_mtu: 5,
        primary: path(0, 1),
        ..base
    };
    let cases = [
        (
            Req {
                transport: TransportType::Rd,
                ..req
            },
            RejReason::INVALID_TRANSPORT_TYPE,
            vec![],
        ),
        (Req { path_mtu: 0, ..req }, RejReason::INVALID_MTU, vec![5]),
        (Req { path_mtu: 6, ..req }, RejReason::INVALID_MTU, vec![5]),
    ];
    listener(&mut s);
    for (r, reason, ari) in cases {
        s.e[1]
            .receive(0, &gsi(0), &Mad::new(9, CmMsg::Req(r)).to_bytes())
            .unwrap();
        let out = sent(&mut s.e[1]);
        assert_eq!(out.len(), 1);
        let rej = rej_of(&out[0]);
        assert_eq!(
            (rej.reason, rej.ari.as_bytes(), rej.remote_comm_id),
            (reason, &ari[..], 0x77)
        );
    }
    // Another class version: unsupported, ARI the version this CM speaks.
    let mut b = Mad::new(9, CmMsg::Req(req)).to_bytes();
    b[2] = 1;
    assert_eq!(
        s.e[1].receive(0, &gsi(0), &b),
        Err(msg::ParseError::ClassVersion)
    );
    let rej = rej_of(&sent(&mut s.e[1])[0]);
    assert_eq!(
        (rej.reason, rej.ari.as_bytes()),
        (RejReason::UNSUPPORTED_CLASS_VERSION, &[2][..])
    );

    // A REP for no connection: invalid communication ID.
    let rep = Rep::parse(&zerocopy::FromZeros::new_zeroed());
    let rep = Rep {
        local_comm_id: 0x55,
        remote_comm_id: 0xDEAD,
        ..rep
    };
    s.e[0]
        .receive(0, &gsi(1), &Mad::new(9, CmMsg::Rep(rep)).to_bytes())
        .unwrap();
    let rej = rej_of(&sent(&mut s.e[0])[0]);
    assert_eq!(
        (rej.reason, rej.remote_comm_id),
        (RejReason::INVALID_COMM_ID, 0x55)
    );
    assert_eq!(rej.msg_rejected, msg::RejectedMsg::Rep);

    // No room for the new CEP.
    let mut full = Engine::new(Config {
        max_ceps: 1,
        ..Config::new(GUID[1])
    });
    let l = full.create(0).unwrap();
    full.listen(l, SID).unwrap();
    full.receive(0, &gsi(0), &Mad::new(9, CmMsg::Req(req)).to_bytes())
        .unwrap();
    assert_eq!(rej_of(&sent(&mut full)[0]).reason, RejReason::NO_RESOURCES);
    assert_eq!(full.create(0), Err(CmError::TableFull));
}

// ------------------------------------------------------------ duplicates

#[test]
fn duplicates_are_answered_from_state() {
    let mut a_e = engine(0, 1, 0);
    let mut b_e = engine(1, 2, cm_time(20));
    let l = b_e.create(0).unwrap();
    b_e.listen(l, SID).unwrap();
    let a = a_e.create(0).unwrap();
    a_e.connect(a, &connect_params(0, 1, 0x10), 0).unwrap();
    let req = sent(&mut a_e).remove(0);
    b_e.receive(0, &gsi(0), &req.mad).unwrap();
    let (_, _) = b_e.poll_ready().unwrap();
    let Some(Event::ConnectRequest { cep: b, .. }) = b_e.poll_event(l) else {
        panic!()
    };
    // REQ again while the owner decides: nothing.
    b_e.receive(0, &gsi(0), &req.mad).unwrap();
    assert!(sent(&mut b_e).is_empty());
    assert!(b_e.poll_event(l).is_none(), "no second request");
    // MRA sent: a REQ again gets the MRA again.
    b_e.mra(b, 10, &[]).unwrap();
    let mra = sent(&mut b_e).remove(0);
    b_e.receive(0, &gsi(0), &req.mad).unwrap();
    assert_eq!(sent(&mut b_e), vec![mra]);
    // REP sent: a REQ again gets the REP again.
    b_e.accept(b, &accept_params(0x11), 0).unwrap();
    let rep = sent(&mut b_e).remove(0);
    b_e.receive(0, &gsi(0), &req.mad).unwrap();
    assert_eq!(sent(&mut b_e), vec![rep]);
    assert_eq!(b_e.stats().duplicates, 3);
    // The REP again, established: the RTU again (same bytes).
    a_e.receive(0, &gsi(1), &rep.mad).unwrap();
    a_e.rtu(a, b"rtu data").unwrap();
    let rtu = sent(&mut a_e).remove(0);
    a_e.receive(0, &gsi(1), &rep.mad).unwrap();
    assert_eq!(sent(&mut a_e), vec![rtu]);
    b_e.receive(0, &gsi(0), &rtu.mad).unwrap();
    assert_eq!(b_e.state(b), Some(State::Established));
    // A DREQ again in time wait: the DREP again.
    a_e.disconnect(a, &[], 0).unwrap();
    let dreq = sent(&mut a_e).remove(0);
    b_e.receive(0, &gsi(0), &dreq.mad).unwrap();
    b_e.drep(b, b"drep data", 0).unwrap();
    let drep = sent(&mut b_e).remove(0);
    b_e.receive(0, &gsi(0), &dreq.mad).unwrap();
    assert_eq!(sent(&mut b_e), vec![drep]);
    // A REQ again in time wait: stale.
    b_e.receive(0, &gsi(0), &req.mad).unwrap();
    assert_eq!(
        rej_of(&sent(&mut b_e)[0]).reason,
        RejReason::STALE_CONNECTION
    );
}

// ------------------------------------------------------------ peer to peer

#[test]
fn simultaneous_connect_to_each_other_makes_one_connection() {
    for seed in 0..50u64 {
        let mut s = Sim::new(seed, Faults::default(), 0);
        let mut auto = Auto::new();
        let a = s.e[0].create(0).unwrap();
        let b = s.e[1].create(0).unwrap();
        let pa = ConnectParams {
            peer_to_peer: true,
            ..connect_params(0, 1, 0x300 + seed as u32)
        };
        let pb = ConnectParams {
            peer_to_peer: true,
            ..connect_params(1, 0, 0x400)
        };
        // Both REQs are on the wire before either arrives.
        s.e[0].connect(a, &pa, 0).unwrap();
        s.e[1].connect(b, &pb, 0).unwrap();
        assert!(s.run(&mut auto, u64::MAX));
        assert_eq!(s.e[0].state(a), Some(State::Established));
        assert_eq!(s.e[1].state(b), Some(State::Established));
        assert_eq!(s.e[0].remote(a), Some((b.0, GUID[1])));
        assert_eq!(s.e[1].remote(b), Some((a.0, GUID[0])));
        // The side with the smaller CA GUID became passive, on its own CEP.
        assert_eq!(
            auto.count(
                0,
                |e| matches!(e, Event::ConnectRequest { cep, .. } if *cep == a)
            ),
            1
        );
        assert_eq!(auto.count(1, |e| matches!(e, Event::Reply { .. })), 1);
        assert_eq!((s.e[0].len(), s.e[1].len()), (1, 1), "no other CEP");
    }
}

#[test]
fn peer_to_peer_in_one_engine_and_with_a_late_peer() {
    // Two CEPs of one CA: the QPNs decide.
    let mut e = engine(0, 3, 0);
    let x = e.create(0).unwrap();
    let y = e.create(0).unwrap();
    let p = |qpn| ConnectParams {
        peer_to_peer: true,
        dest: gsi(0),
        primary: path(0, 0),
        ..connect_params(0, 0, qpn)
    };
    e.connect(x, &p(0x50), 0).unwrap();
    e.connect(y, &p(0x60), 0).unwrap();
    let mut log = Vec::new();
    for _ in 0..10 {
        while let Some(t) = e.poll_transmit() {
            e.receive(0, &gsi(0), &t.mad).unwrap();
        }
        while let Some((id, _)) = e.poll_ready() {
            while let Some(ev) = e.poll_event(id) {
                match ev {
                    Event::ConnectRequest { cep, .. } => {
                        e.accept(cep, &accept_params(0x50), 0).unwrap()
                    }
                    Event::Reply { .. } => e.rtu(id, &[]).unwrap(),
                    _ => {}
                }
                log.push((id, ev));
            }
        }
    }
    assert_eq!(e.state(x), Some(State::Established));
    assert_eq!(e.state(y), Some(State::Established));
    assert!(
        matches!(log[0], (c, Event::ConnectRequest { cep, .. }) if c == x && cep == x),
        "the lower QPN is passive: {log:?}"
    );
    assert_eq!(e.remote(x), Some((y.0, GUID[0])));

    // A peer REQ that finds no peer waiting (the other side has not
    // connected yet) and no listener is rejected.
    let mut s = sim();
    let mut log = Log::default();
    let a = s.e[0].create(0).unwrap();
    let pa = ConnectParams {
        peer_to_peer: true,
        ..connect_params(0, 1, 1)
    };
    s.e[0].connect(a, &pa, 0).unwrap();
    s.deliver_now(&mut log);
    let (_, Event::Rejected { rej, .. }) = only(&mut log, 0) else {
        panic!()
    };
    assert_eq!(rej.reason, RejReason::INVALID_SERVICE_ID);
}

// ------------------------------------------------------------ destroy

#[test]
fn destroy_during_connect_completes_the_pending_operation() {
    // Active side destroyed with its REQ out: REJ(Timeout) to the passive.
    let mut s = sim();
    let mut log = Log::default();
    listener(&mut s);
    let (a, b) = requested(&mut s, &mut log, 0x10);
    assert_eq!(
        s.e[0].destroy(a, 0),
        Ok(vec![Event::Canceled { op: Op::Connect }])
    );
    assert_eq!(s.e[0].state(a), None);
    assert_eq!(s.e[0].destroy(a, 0), Err(CmError::UnknownCep));
    s.deliver_now(&mut log);
    let (c, Event::Rejected { rej, .. }) = only(&mut log, 1) else {
        panic!()
    };
    assert_eq!((c, rej.reason), (b, RejReason::TIMEOUT));
    assert!(s.e[0].is_empty());

    // Passive side destroyed before it answers: consumer reject.
    let (a, b) = requested(&mut s, &mut log, 0x20);
    assert_eq!(s.e[1].destroy(b, 0), Ok(vec![]));
    s.deliver_now(&mut log);
    let (c, Event::Rejected { rej, .. }) = only(&mut log, 0) else {
        panic!()
    };
    assert_eq!((c, rej.reason), (a, RejReason::CONSUMER_REJECT));

    // Passive side destroyed after its REP: reject, and time wait out of
    // the owner's reach.
    let (a, b) = requested(&mut s, &mut log, 0x30);
    s.e[1].accept(b, &accept_params(0x31), 0).unwrap();
    s.deliver_now(&mut log);
    take(&mut log);
    let before = s.e[1].len();
    assert_eq!(
        s.e[1].destroy(b, s.now),
        Ok(vec![Event::Canceled { op: Op::Accept }])
    );
    assert_eq!(s.e[1].state(b), None);
    assert_eq!(s.e[1].len(), before, "kept in time wait");
    s.deliver_now(&mut log);
    assert!(matches!(only(&mut log, 0), (c, Event::Rejected { .. }) if c == a));
    s.run(&mut log, u64::MAX);
    take(&mut log);
    assert_eq!(s.e[1].len(), before - 1, "freed after time wait");

    // Active side destroyed with the REP unanswered and its events unpolled.
    let mut s = sim();
    listener(&mut s);
    let (a, b) = requested(&mut s, &mut log, 0x40);
    s.e[1].accept(b, &accept_params(0x41), 0).unwrap();
    s.deliver_raw();
    // (the Reply is queued on node 0 but not polled)
    let evs = s.e[0].destroy(a, s.now).unwrap();
    assert!(
        matches!(
            evs.as_slice(),
            [Event::Reply { .. }, Event::Canceled { op: Op::Connect }]
        ),
        "{evs:?}"
    );
    s.deliver_now(&mut log);
    assert!(matches!(only(&mut log, 1), (c, Event::Rejected { .. }) if c == b));

    // Established, destroyed: the remote is asked to disconnect.
    let mut s = sim();
    listener(&mut s);
    let (a, b) = established(&mut s, &mut log, 0x50);
    assert_eq!(s.e[0].destroy(a, s.now), Ok(vec![]));
    s.deliver_now(&mut log);
    assert!(matches!(only(&mut log, 1), (c, Event::DisconnectRequest { .. }) if c == b));
    s.e[1].drep(b, &[], s.now).unwrap();
    s.run(&mut log, u64::MAX);
    assert_eq!(take(&mut log), vec![(1, b, Event::TimewaitExit)]);
    assert_eq!(
        s.e[0].len(),
        0,
        "the destroyed CEP left after its time wait"
    );
    // Disconnecting, destroyed: the operation completes.
    let (a, _) = established(&mut s, &mut log, 0x60);
    s.e[0].disconnect(a, &[], s.now).unwrap();
    assert_eq!(
        s.e[0].destroy(a, s.now),
        Ok(vec![Event::Canceled { op: Op::Disconnect }])
    );
}

#[test]
fn listener_destroyed_with_requests_arriving() {
    let mut s = sim();
    let mut log = Log::default();
    let l = listener(&mut s);
    let actives: Vec<CepId> = (0..3)
        .map(|i| {
            let a = s.e[0].create(i).unwrap();
            s.e[0]
                .connect(a, &connect_params(0, 1, 0x10 + i as u32), 0)
                .unwrap();
            a
        })
        .collect();
    s.deliver_raw();
    // Three requests wait unpolled on the listener.
    assert_eq!(s.e[1].len(), 4);
    assert_eq!(
        s.e[1].destroy(l, s.now),
        Ok(vec![Event::Canceled { op: Op::Listen }])
    );
    assert_eq!(s.e[1].len(), 0, "the unclaimed requests went with it");
    // A REQ arriving now finds no service.
    let late = s.e[0].create(9).unwrap();
    s.e[0]
        .connect(late, &connect_params(0, 1, 0x20), s.now)
        .unwrap();
    s.deliver_now(&mut log);
    let evs = take(&mut log);
    for a in &actives {
        assert!(evs.iter().any(|(n, c, e)| *n == 0 && c == a && matches!(e, Event::Rejected { rej, .. } if rej.reason == RejReason::CONSUMER_REJECT)), "{evs:?}");
    }
    assert!(evs.iter().any(|(_, c, e)| *c == late && matches!(e, Event::Rejected { rej, .. } if rej.reason == RejReason::INVALID_SERVICE_ID)));
    assert_eq!(evs.len(), 4);
    // Listening again works.
    let l2 = s.e[1].create(0).unwrap();
    s.e[1].listen(l2, SID).unwrap();
}

// ------------------------------------------------------------ stale

#[test]
fn a_restarted_peer_reusing_its_qp_finds_the_connection_stale() {
    let mut s = sim();
    let mut log = Log::default();
    let l = s.e[0].create(0).unwrap();
    s.e[0].listen(l, SID).unwrap();
    // Node 1 connects to node 0 with QP 0x77.
    let b = s.e[1].create(0).unwrap();
    s.e[1].connect(b, &connect_params(1, 0, 0x77), 0).unwrap();
    s.deliver_now(&mut log);
    let (_, Event::ConnectRequest { cep: a, .. }) = only(&mut log, 0) else {
        panic!()
    };
    s.e[0].accept(a, &accept_params(0x88), 0).unwrap();
    s.deliver_now(&mut log);
    s.e[1].rtu(b, &[]).unwrap();
    s.deliver_now(&mut log);
    take(&mut log);
    assert_eq!(s.e[0].state(a), Some(State::Established));
    // Node 1 restarts (new IDs) and connects again from the same QP.
    s.e[1] = engine(1, 0xBAD, 0);
    let b2 = s.e[1].create(0).unwrap();
    s.e[1]
        .connect(b2, &connect_params(1, 0, 0x77), s.now)
        .unwrap();
    s.deliver_now(&mut log);
    s.run(&mut log, u64::MAX);
    let evs = take(&mut log);
    assert!(evs.contains(&(0, a, Event::StaleConnection)), "{evs:?}");
    assert!(evs.iter().any(|(n, c, e)| *n == 1 && *c == b2 && matches!(e, Event::Rejected { rej, .. } if rej.reason == RejReason::STALE_CONNECTION)), "{evs:?}");
    assert!(evs.contains(&(1, b2, Event::TimewaitExit)), "{evs:?}");
    // The old connection's DREQ finds nothing on node 1, which answers
    // DREP: node 0's disconnect completes.
    assert!(
        evs.contains(&(
            0,
            a,
            Event::DisconnectReply {
                private_data: Some([0; msg::DREP_PDATA])
            }
        )),
        "{evs:?}"
    );
    assert_eq!(s.e[0].state(a), Some(State::Idle));
    assert_eq!(s.e[0].stats().stale, 1);
    // After the time waits the QP connects.
    s.e[1].destroy(b2, s.now).unwrap();
    let b3 = s.e[1].create(0).unwrap();
    s.e[1]
        .connect(b3, &connect_params(1, 0, 0x77), s.now)
        .unwrap();
    s.deliver_now(&mut log);
    assert!(
        take(&mut log)
            .iter()
            .any(|(n, _, e)| *n == 0 && matches!(e, Event::ConnectRequest { .. }))
    );
}

// ------------------------------------------------------------ LAP, SIDR, CPI

#[test]
fn load_alternate_path_with_mra_and_duplicates() {
    let mut s = sim();
    let mut log = Log::default();
    listener(&mut s);
    let (a, b) = established(&mut s, &mut log, 0x10);
    let alt = Path {
        sl: 3,
        flow_label: 0x12345,
        ..path(0, 1)
    };
    s.e[0].load_alternate_path(a, &alt, b"lap", s.now).unwrap();
    assert_eq!(
        s.e[0].load_alternate_path(a, &alt, &[], s.now),
        Err(CmError::InvalidState(State::Established))
    );
    s.deliver_now(&mut log);
    let (c, Event::LapReceived { lap }) = only(&mut log, 1) else {
        panic!()
    };
    assert_eq!(
        (c, lap.alternate, &lap.private_data[..3]),
        (b, alt, &b"lap"[..])
    );
    assert_eq!(s.e[1].lap_state(b), Some(LapState::LapRcvd));
    let load = s.e[1].qp_attr(b, QpTarget::LoadAlt).unwrap();
    assert_eq!(load.attr.alt_ah_attr.dgid, gid(0), "the receiver's view");
    assert_eq!(load.attr.alt_ah_attr.sl, 3);
    assert_eq!(
        check_modify(IV_QPT_RC, IV_QPS_RTS, load.mask, &load.attr),
        Ok(IV_QPS_RTS)
    );
    s.e[1].mra(b, 12, &[]).unwrap();
    assert_eq!(s.e[1].lap_state(b), Some(LapState::MraLapSent));
    s.deliver_now(&mut log);
    assert_eq!(
        only(&mut log, 0),
        (
            a,
            Event::MraReceived {
                msg: MraedMsg::Lap,
                service_timeout: 12
            }
        )
    );
    assert_eq!(s.e[0].lap_state(a), Some(LapState::MraLapRcvd));
    s.e[1].apr(b, AprStatus::ACCEPTED, &[], b"apr").unwrap();
    s.deliver_now(&mut log);
    let (c, Event::AprReceived { apr }) = only(&mut log, 0) else {
        panic!()
    };
    assert_eq!((c, apr.status), (a, AprStatus::ACCEPTED));
    assert_eq!(s.e[0].lap_state(a), Some(LapState::Idle));
    assert_eq!(
        s.e[0]
            .qp_attr(a, QpTarget::LoadAlt)
            .unwrap()
            .attr
            .alt_ah_attr
            .dgid,
        gid(1)
    );
    assert_eq!(
        s.e[0]
            .qp_attr(a, QpTarget::Rtr)
            .unwrap()
            .attr
            .alt_ah_attr
            .sl,
        3
    );
    // The same LAP again (its APR lost): the same answer.
    let lap_tid = s.e[0].stats();
    let _ = lap_tid;
    s.e[0].load_alternate_path(a, &alt, &[], s.now).unwrap();
    let lap_mad = sent(&mut s.e[0]).remove(0);
    s.e[1].receive(s.now, &gsi(0), &lap_mad.mad).unwrap();
    s.poll_owner(&mut log);
    take(&mut log);
    s.e[1].apr(b, AprStatus::REJECTED, &[], &[]).unwrap();
    let apr1 = sent(&mut s.e[1]).remove(0);
    s.e[1].receive(s.now, &gsi(0), &lap_mad.mad).unwrap();
    let again = sent(&mut s.e[1]);
    assert_eq!(again.len(), 1);
    assert!(matches!(parsed(&again[0]), CmMsg::Apr(x) if x.status == AprStatus::REJECTED));
    assert_eq!(
        msg::parse(&again[0].mad).unwrap().hdr.tid,
        msg::parse(&apr1.mad).unwrap().hdr.tid
    );
    // LAPs crossing: the one received is rejected.
    s.e[0].receive(s.now, &gsi(1), &apr1.mad).unwrap();
    s.poll_owner(&mut log);
    take(&mut log);
    s.e[0].load_alternate_path(a, &alt, &[], s.now).unwrap();
    s.e[1]
        .load_alternate_path(b, &alt.reversed(), &[], s.now)
        .unwrap();
    s.deliver_now(&mut log);
    let evs = take(&mut log);
    assert!(
        evs.iter()
            .filter(
                |e| matches!(e.2, Event::AprReceived { apr } if apr.status == AprStatus::REJECTED)
            )
            .count()
            == 2,
        "{evs:?}"
    );
}

#[test]
fn sidr_resolves_a_service() {
    let mut s = sim();
    let mut log = Log::default();
    let l = listener(&mut s);
    let c = s.e[0].create(0).unwrap();
    let p = SidrParams {
        dest: gsi(1),
        service_id: SID,
        pkey: 0xFFFF,
        timeout: 14,
        max_retries: 3,
        private_data: b"who",
    };
    s.e[0].sidr_request(c, &p, 0).unwrap();
    assert_eq!(s.e[0].state(c), Some(State::SidrReqSent));
    s.deliver_now(&mut log);
    let (on, Event::SidrRequest { cep, req, src }) = only(&mut log, 1) else {
        panic!()
    };
    assert_eq!(
        (on, req.service_id, &req.private_data[..3], src),
        (l, SID, &b"who"[..], gsi(0))
    );
    assert_eq!(s.e[1].state(cep), Some(State::SidrReqRcvd));
    let rp = SidrReplyParams {
        status: SidrStatus::VALID,
        qpn: 0x4242,
        qkey: 0x1111_2222,
        info: Info::EMPTY,
        private_data: b"me",
    };
    s.e[1].sidr_reply(cep, &rp).unwrap();
    assert_eq!(s.e[1].state(cep), Some(State::Idle));
    s.deliver_now(&mut log);
    let (on, Event::SidrReply { rep }) = only(&mut log, 0) else {
        panic!()
    };
    assert_eq!(
        (on, rep.status, rep.qpn, rep.qkey, rep.service_id),
        (c, SidrStatus::VALID, 0x4242, 0x1111_2222, SID)
    );
    assert_eq!(s.e[0].state(c), Some(State::Idle));

    // No listener: not supported.
    let c2 = s.e[0].create(0).unwrap();
    s.e[0]
        .sidr_request(
            c2,
            &SidrParams {
                service_id: SID + 1,
                ..p
            },
            s.now,
        )
        .unwrap();
    s.deliver_now(&mut log);
    let (_, Event::SidrReply { rep }) = only(&mut log, 0) else {
        panic!()
    };
    assert_eq!(rep.status, SidrStatus::UNSUPPORTED_SERVICE_ID);

    // The listener goes away with a request unpolled: rejected.
    let c3 = s.e[0].create(0).unwrap();
    s.e[0].sidr_request(c3, &p, s.now).unwrap();
    s.deliver_raw();
    s.e[1].destroy(l, s.now).unwrap();
    s.deliver_now(&mut log);
    let (_, Event::SidrReply { rep }) = only(&mut log, 0) else {
        panic!()
    };
    assert_eq!(rep.status, SidrStatus::REJECTED);
}

#[test]
fn class_port_info_get_is_answered() {
    let mut e = engine(1, 0, 0);
    let mut get = Mad::new(0x99, CmMsg::ClassPortInfo(Default::default()));
    get.hdr.method = msg::METHOD_GET;
    e.receive(0, &gsi(0), &get.to_bytes()).unwrap();
    let out = sent(&mut e);
    let m = msg::parse(&out[0].mad).unwrap();
    assert_eq!((m.hdr.method, m.hdr.tid), (msg::METHOD_GET_RESP, 0x99));
    let CmMsg::ClassPortInfo(cpi) = m.msg else {
        panic!()
    };
    assert_eq!(
        (cpi.base_version, cpi.class_version, cpi.resp_time_value),
        (1, 2, 18)
    );
    // A GetResp is not answered.
    e.receive(0, &gsi(0), &out[0].mad).unwrap();
    assert!(sent(&mut e).is_empty());
}

// ------------------------------------------------------------ polling, API

#[test]
fn a_cep_is_signaled_once_until_polled_empty() {
    let mut s = sim();
    let l = listener(&mut s);
    for i in 0..2 {
        let a = s.e[0].create(0).unwrap();
        s.e[0]
            .connect(a, &connect_params(0, 1, 0x10 + i), 0)
            .unwrap();
    }
    s.deliver_raw();
    let e = &mut s.e[1];
    assert_eq!(e.poll_ready(), Some((l, 77)));
    assert_eq!(e.poll_ready(), None, "one signal for two events");
    assert!(matches!(
        e.poll_event(l),
        Some(Event::ConnectRequest { .. })
    ));
    // A third request while the owner polls: no new signal yet.
    let a = s.e[0].create(0).unwrap();
    s.e[0].connect(a, &connect_params(0, 1, 0x20), 0).unwrap();
    let req = sent(&mut s.e[0]).remove(0);
    let e = &mut s.e[1];
    e.receive(0, &gsi(0), &req.mad).unwrap();
    assert_eq!(e.poll_ready(), None);
    assert!(e.poll_event(l).is_some());
    assert!(e.poll_event(l).is_some());
    assert!(e.poll_event(l).is_none(), "drained: re-armed");
    let a = s.e[0].create(0).unwrap();
    s.e[0].connect(a, &connect_params(0, 1, 0x30), 0).unwrap();
    let req = sent(&mut s.e[0]).remove(0);
    s.e[1].receive(0, &gsi(0), &req.mad).unwrap();
    assert_eq!(s.e[1].poll_ready(), Some((l, 77)));
}

#[test]
fn calls_in_the_wrong_state_or_with_bad_values_change_nothing() {
    let mut e = engine(0, 0, 0);
    let ghost = CepId(0x1234_5678);
    assert_eq!(e.listen(ghost, 1), Err(CmError::UnknownCep));
    assert_eq!(e.poll_event(ghost), None);
    let c = e.create(5).unwrap();
    assert_eq!(
        e.accept(c, &accept_params(1), 0),
        Err(CmError::InvalidState(State::Idle))
    );
    assert_eq!(e.rtu(c, &[]), Err(CmError::InvalidState(State::Idle)));
    assert_eq!(e.mra(c, 1, &[]), Err(CmError::InvalidState(State::Idle)));
    assert_eq!(
        e.disconnect(c, &[], 0),
        Err(CmError::InvalidState(State::Idle))
    );
    assert_eq!(e.drep(c, &[], 0), Err(CmError::InvalidState(State::Idle)));
    assert_eq!(
        e.notify_established(c),
        Err(CmError::InvalidState(State::Idle))
    );
    assert_eq!(
        e.apr(c, AprStatus::ACCEPTED, &[], &[]),
        Err(CmError::InvalidState(State::Idle))
    );
    assert_eq!(
        e.sidr_reply(c, &SidrReplyParams::default()),
        Err(CmError::InvalidState(State::Idle))
    );
    assert_eq!(
        e.qp_attr(c, QpTarget::Init),
        Err(CmError::InvalidState(State::Idle))
    );
    let bad = [
        ConnectParams {
            qpn: 1 << 24,
            ..connect_params(0, 1, 1)
        },
        ConnectParams {
            path_mtu: 0,
            ..connect_params(0, 1, 1)
        },
        ConnectParams {
            transport: TransportType::Rd,
            ..connect_params(0, 1, 1)
        },
        ConnectParams {
            max_cm_retries: 16,
            ..connect_params(0, 1, 1)
        },
        ConnectParams {
            private_data: &[1; 93],
            ..connect_params(0, 1, 1)
        },
        ConnectParams {
            primary: Path {
                sl: 16,
                ..path(0, 1)
            },
            ..connect_params(0, 1, 1)
        },
    ];
    for p in bad {
        assert!(
            matches!(e.connect(c, &p, 0), Err(CmError::InvalidParam(_))),
            "{p:?}"
        );
        assert_eq!(e.state(c), Some(State::Idle));
    }
    assert!(e.poll_transmit().is_none());
    e.listen(c, 7).unwrap();
    let d = e.create(0).unwrap();
    assert_eq!(e.listen(d, 7), Err(CmError::ServiceInUse));
    assert_eq!(
        e.connect(c, &connect_params(0, 1, 1), 0),
        Err(CmError::InvalidState(State::Listen))
    );
    e.set_context(d, 99).unwrap();
    assert_eq!(e.context(d), Some(99));
    assert_eq!(e.destroy(d, 0), Ok(vec![]));
    assert_eq!(e.set_context(d, 1), Err(CmError::UnknownCep));
    // An ID of the freed slot does not resolve.
    assert!(!e.contains(d));
    let _ = MadAddr::default();
}

#[test]
fn a_rej_after_the_rtu_or_during_disconnect_enters_time_wait() {
    // The passive side gave up on its REP after the active side sent RTU
    // (all RTUs lost): its REJ(Timeout) ends the active side's connection.
    for disconnecting in [false, true] {
        let mut s = sim();
        let mut log = Log::default();
        listener(&mut s);
        let (a, b) = established(&mut s, &mut log, 0x10);
        if disconnecting {
            s.e[0].disconnect(a, &[], s.now).unwrap();
            let _lost = sent(&mut s.e[0]);
        }
        let rej = msg::Rej {
            local_comm_id: b.0,
            remote_comm_id: a.0,
            msg_rejected: msg::RejectedMsg::Other,
            reason: RejReason::TIMEOUT,
            ari: Info::new(&GUID[1].to_be_bytes()).unwrap(),
            private_data: [0; msg::REJ_PDATA],
        };
        let bytes = Mad::new(5, CmMsg::Rej(rej)).to_bytes();
        s.e[0].receive(s.now, &gsi(1), &bytes).unwrap();
        s.poll_owner(&mut log);
        assert_eq!(only(&mut log, 0), (a, Event::Rejected { rej, sent: false }));
        assert_eq!(s.e[0].state(a), Some(State::Timewait));
        // Again: nothing more.
        s.e[0].receive(s.now, &gsi(1), &bytes).unwrap();
        s.poll_owner(&mut log);
        assert!(take(&mut log).is_empty());
    }
}

/// Listeners bound to GIDs share a service ID: a REQ goes to the one bound
/// to the GID its primary path names as the passive side's, else to the
/// one on any GID; a REQ for a GID nobody listens on is rejected (invalid
/// service ID). Any GID and a bound GID conflict, as a wildcard and a
/// specific socket address do; a listener's destroy frees its GID alone.
#[test]
fn listeners_bound_to_gids_share_a_service_id() {
    let mut s = sim();
    let mut log = Log::default();
    let mut alias = gid(1);
    alias[15] = 0x77;
    let on_gid = s.e[1].create(10).unwrap();
    s.e[1].listen_on(on_gid, SID, gid(1)).unwrap();
    let on_alias = s.e[1].create(20).unwrap();
    s.e[1].listen_on(on_alias, SID, alias).unwrap();
    let again = s.e[1].create(30).unwrap();
    assert_eq!(
        s.e[1].listen_on(again, SID, alias),
        Err(CmError::ServiceInUse),
        "the same GID"
    );
    assert_eq!(
        s.e[1].listen(again, SID),
        Err(CmError::ServiceInUse),
        "any GID beside bound ones"
    );
    s.e[1].listen_on(again, SID + 1, alias).unwrap();

    // Each REQ reaches the listener of the GID it names.
    for (to, context) in [(gid(1), 10), (alias, 20)] {
        let mut p = connect_params(0, 1, 0x100 + context as u32);
        p.primary.remote_gid = to;
        let a = s.e[0].create(1).unwrap();
        s.e[0].connect(a, &p, s.now).unwrap();
        s.deliver_now(&mut log);
        let (_, ev) = only(&mut log, 1);
        let Event::ConnectRequest { cep, .. } = ev else {
            panic!("{ev:?}");
        };
        assert_eq!(s.e[1].context(cep), Some(context), "{to:?}");
    }

    // A GID nobody listens on: rejected before any listener sees it.
    let mut other = gid(1);
    other[15] = 0x78;
    let mut p = connect_params(0, 1, 0x300);
    p.primary.remote_gid = other;
    let a = s.e[0].create(1).unwrap();
    s.e[0].connect(a, &p, s.now).unwrap();
    s.deliver_now(&mut log);
    let evs = take(&mut log);
    assert!(
        evs.iter()
            .all(|&(n, c, e)| n == 0 && c == a && matches!(e, Event::Rejected { .. })),
        "{evs:#?}"
    );
    let Some(&(_, _, Event::Rejected { rej, .. })) = evs.first() else {
        panic!("no REJ: {evs:#?}");
    };
    assert_eq!(rej.reason, RejReason::INVALID_SERVICE_ID);

    // Destroying the alias's listener frees the alias only; then any GID
    // still conflicts with the one left, and is free once it goes too.
    s.e[1].destroy(on_alias, s.now).unwrap();
    let l = s.e[1].create(40).unwrap();
    s.e[1].listen_on(l, SID, alias).unwrap();
    s.e[1].destroy(l, s.now).unwrap();
    s.e[1].destroy(on_alias, s.now).unwrap_err();
    let any = s.e[1].create(50).unwrap();
    assert_eq!(s.e[1].listen(any, SID), Err(CmError::ServiceInUse));
    s.e[1].destroy(on_gid, s.now).unwrap();
    s.e[1].listen(any, SID).unwrap();
}
