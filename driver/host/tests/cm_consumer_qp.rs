//! Connections whose QPs their owners move (rdma_cm's ids without a QP):
//! `CM_CONNECT` and `CM_ACCEPT` without a QP handle, the QP number in the
//! request; `CM_INIT_QP_ATTR` for the attributes of each state, applied
//! with `MODIFY_QP` by the test; `CM_ESTABLISH` for the RTU. Two host
//! devices over the in-process loopback wire, the verifier on; the
//! states that refuse each request, and a CEP destroyed or busy while its
//! connect waits.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use irpverbs_abi::*;
use irpverbs_host::loopwire::LoopWire;
use irpverbs_host::{Backend, Engine, HostDevice, HostDeviceConfig};
use irpverbs_soft::SoftConfig;
use irpverbs_verbs::{Client, IntoClient, SendWr};
use zerocopy::{FromBytes, IntoBytes};

mod common;
use common::End;

crate::on_each_backend!(
    a_connection_whose_qps_their_owners_move,
    a_connect_without_a_qp_is_busy_then_cancelled,
);

fn device(backend: Backend, last: u8) -> Arc<HostDevice> {
    HostDevice::new(HostDeviceConfig {
        backend,
        engine: Engine::Inline,
        soft: SoftConfig {
            ip: IpAddr::V4(Ipv4Addr::new(10, 0, 1, last)),
            node_guid: 0x0200_00FF_FE00_0100 | u64::from(last),
            ..SoftConfig::default()
        },
        ..HostDeviceConfig::default()
    })
    .expect("host device")
}

const SERVICE: u64 = 0x0106_1F90;

fn open(d: &Arc<HostDevice>) -> Client {
    d.open(FILE_READ_ACCESS | FILE_WRITE_ACCESS)
        .expect("open")
        .into_client()
}

fn raw<I: IntoBytes + zerocopy::Immutable>(
    c: &Client,
    code: u32,
    i: &I,
    out: usize,
) -> (NtStatus, Vec<u8>) {
    c.raw(code, i.as_bytes(), out)
}

fn status<I: IntoBytes + zerocopy::Immutable>(c: &Client, code: u32, i: &I) -> NtStatus {
    raw(c, code, i, 0).0
}

fn cep(c: &Client) -> IvHandle {
    let (st, out) = raw(
        c,
        IOCTL_IV_CREATE_CEP,
        &IvCreateCepIn { user_context: 9 },
        8,
    );
    assert_eq!(st, STATUS_SUCCESS);
    IvCreateCepOut::read_from_bytes(&out[..8]).unwrap().cep
}

fn event(c: &Client, cep: IvHandle) -> IvCepEventOut {
    let n = size_of::<IvCepEventOut>();
    let (st, out) = raw(c, IOCTL_IV_GET_CEP_EVENT, &IvHandleIn { handle: cep }, n);
    assert_eq!(st, STATUS_SUCCESS, "{}", status_name(st));
    IvCepEventOut::read_from_bytes(&out[..n]).unwrap()
}

/// `CM_INIT_QP_ATTR` of `cep` for `qp_state`: the status, and the answer
/// when it succeeded.
fn init_qp_attr(
    c: &Client,
    cep: IvHandle,
    qp_state: u32,
    psn: u32,
) -> Result<IvCmInitQpAttrOut, NtStatus> {
    let n = size_of::<IvCmInitQpAttrOut>();
    let i = IvCmInitQpAttrIn {
        cep,
        qp_state,
        starting_psn: psn,
    };
    match raw(c, IOCTL_IV_CM_INIT_QP_ATTR, &i, n) {
        (STATUS_SUCCESS, out) => Ok(IvCmInitQpAttrOut::read_from_bytes(&out[..n]).unwrap()),
        (st, _) => Err(st),
    }
}

/// Moves `e`'s QP to `qp_state` with the CEP's attributes.
fn move_qp(e: &End<'_>, cep: IvHandle, qp_state: u32, psn: u32) -> IvQpAttr {
    let a = init_qp_attr(e.c, cep, qp_state, psn).expect("attributes");
    assert_eq!(a.attr.qp_state, qp_state);
    assert_ne!(a.attr_mask & IV_QP_STATE, 0);
    if let Err(st) = e.qp.modify(a.attr_mask, &a.attr) {
        panic!("modify to {qp_state}: {} {a:?}", status_name(st));
    }
    assert_eq!(e.qp.query().unwrap().attr.qp_state, qp_state);
    a.attr
}

fn connect_in(cep: IvHandle, qpn: u32, local: [u8; 16], remote: [u8; 16]) -> IvCmConnectIn {
    IvCmConnectIn {
        cep,
        qp: 0,
        qpn,
        service_id: SERVICE,
        local_gid: local,
        remote_gid: remote,
        starting_psn: 0x100,
        cm_response_timeout: 16,
        max_cm_retries: 5,
        local_ack_timeout: 14,
        path_mtu: IV_MTU_1024 as u8,
        ..common::connect_defaults()
    }
}

fn listen(c: &Client) -> IvHandle {
    let listener = cep(c);
    let l = IvListenIn {
        cep: listener,
        service_id: SERVICE,
    };
    assert_eq!(status(c, IOCTL_IV_LISTEN, &l), STATUS_SUCCESS);
    listener
}

fn finish(devices: [&Arc<HostDevice>; 2]) {
    for d in devices {
        d.quiesce(Duration::from_secs(10)).expect("quiescent");
        assert_eq!(d.platform().pool_stats().live, 0, "pool leaked");
        d.unload();
    }
}

/// Both sides own their QPs: the connect completes on the REP with the
/// active QP untouched, the passive side moves its QP from the REQ's
/// attributes before it accepts, the active side from the REP's, then
/// `CM_ESTABLISH` sends the RTU that completes the accept; data both
/// ways; a disconnect that leaves the QPs to their owners.
fn a_connection_whose_qps_their_owners_move(backend: Backend) {
    let (da, db) = (device(backend, 1), device(backend, 2));
    let wire = LoopWire::start();
    wire.attach(da.soft()).unwrap();
    wire.attach(db.soft()).unwrap();
    let (ca, cb) = (open(&da), open(&db));
    let (a, b) = (End::new_rc(&ca), End::new_rc(&cb));
    let listener = listen(&cb);
    let acep = cep(&ca);
    // Nothing to give before a REQ, nor on a listener; no RTU to send.
    for (c, id) in [(&ca, acep), (&cb, listener)] {
        assert_eq!(
            init_qp_attr(c, id, IV_QPS_INIT, 0),
            Err(STATUS_INVALID_DEVICE_STATE)
        );
        let h = IvHandleIn { handle: id };
        assert_eq!(
            status(c, IOCTL_IV_CM_ESTABLISH, &h),
            STATUS_INVALID_DEVICE_STATE
        );
    }
    // Bad values: a state with no attributes, a PSN past 24 bits.
    for (state, psn) in [
        (IV_QPS_RESET, 0),
        (IV_QPS_ERR, 0),
        (7, 0),
        (IV_QPS_RTS, 1 << 24),
    ] {
        assert_eq!(
            init_qp_attr(&ca, acep, state, psn),
            Err(STATUS_INVALID_PARAMETER)
        );
    }
    let (ga, gb) = (da.soft().gid(), db.soft().gid());
    // A QP number past 24 bits, a number beside a QP handle, a
    // peer-to-peer connect (it would go on as an accept moving a QP):
    // refused, the CEP still idle.
    let bad = [
        connect_in(acep, 1 << 24, ga, gb),
        IvCmConnectIn {
            qp: a.qp.handle(),
            ..connect_in(acep, a.qp.qpn(), ga, gb)
        },
        IvCmConnectIn {
            flags: (IV_CM_FLOW_CONTROL | IV_CM_PEER_TO_PEER) as u8,
            ..connect_in(acep, a.qp.qpn(), ga, gb)
        },
    ];
    for i in bad {
        assert_eq!(
            status(&ca, IOCTL_IV_CM_CONNECT, &i),
            STATUS_INVALID_PARAMETER
        );
    }
    let connect = connect_in(acep, a.qp.qpn(), ga, gb);
    let (bcep, accept_status) = std::thread::scope(|s| {
        let active = s.spawn(|| status(&ca, IOCTL_IV_CM_CONNECT, &connect));
        let req = event(&cb, listener);
        assert_eq!(req.event_type, IV_CEP_EVENT_CONNECT_REQUEST);
        assert_eq!((req.remote_qpn, req.starting_psn), (a.qp.qpn(), 0x100));
        // The passive side's QP, from the REQ, before it accepts.
        let init = move_qp(&b, req.cep, IV_QPS_INIT, 0);
        assert_eq!(init.port_num, 1);
        let rtr = move_qp(&b, req.cep, IV_QPS_RTR, 0);
        assert_eq!((rtr.dest_qp_num, rtr.rq_psn), (a.qp.qpn(), 0x100));
        assert_eq!(rtr.path_mtu, IV_MTU_1024);
        assert_eq!(rtr.ah_attr.dgid, ga);
        let rts = move_qp(&b, req.cep, IV_QPS_RTS, 0x200);
        assert_eq!((rts.sq_psn, rts.timeout), (0x200, 14));
        // An accept beside a QP handle with a number: refused.
        let accept = IvCmAcceptIn {
            cep: req.cep,
            qp: 0,
            qpn: b.qp.qpn(),
            starting_psn: 0x200,
            responder_resources: 2,
            initiator_depth: 2,
            rnr_retry_count: 7,
            min_rnr_timer: 12,
            ..IvCmAcceptIn::default()
        };
        let both = IvCmAcceptIn {
            qp: b.qp.handle(),
            ..accept
        };
        assert_eq!(
            status(&cb, IOCTL_IV_CM_ACCEPT, &both),
            STATUS_INVALID_PARAMETER
        );
        let cb = &cb;
        let passive = s.spawn(move || status(cb, IOCTL_IV_CM_ACCEPT, &accept));
        // The connect completes on the REP, its QP untouched.
        assert_eq!(active.join().unwrap(), STATUS_SUCCESS);
        assert_eq!(a.qp.query().unwrap().attr.qp_state, IV_QPS_RESET);
        let rep = event(&ca, acep);
        assert_eq!(rep.event_type, IV_CEP_EVENT_REPLY);
        assert_eq!((rep.remote_qpn, rep.starting_psn), (b.qp.qpn(), 0x200));
        move_qp(&a, acep, IV_QPS_INIT, 0);
        let rtr = move_qp(&a, acep, IV_QPS_RTR, 0);
        assert_eq!((rtr.dest_qp_num, rtr.rq_psn), (b.qp.qpn(), 0x200));
        assert_eq!(rtr.max_dest_rd_atomic, 4);
        let rts = move_qp(&a, acep, IV_QPS_RTS, 0);
        assert_eq!((rts.sq_psn, rts.max_rd_atomic), (0x100, 2));
        // The accept waits for the RTU, which `CM_ESTABLISH` sends once.
        assert!(!passive.is_finished());
        let h = IvHandleIn { handle: acep };
        assert_eq!(status(&ca, IOCTL_IV_CM_ESTABLISH, &h), STATUS_SUCCESS);
        assert_eq!(
            status(&ca, IOCTL_IV_CM_ESTABLISH, &h),
            STATUS_INVALID_DEVICE_STATE
        );
        (req.cep, passive.join().unwrap())
    });
    assert_eq!(accept_status, STATUS_SUCCESS);
    // Established, the attributes are still there (RTS's PSN the
    // accept's, whatever the request says now).
    let rts = init_qp_attr(&cb, bcep, IV_QPS_RTS, 0x999).unwrap();
    assert_eq!(rts.attr.sq_psn, 0x200);
    // Data both ways.
    let msg = b"owner-moved QPs".as_slice();
    b.qp.post_recv(1, &[b.sge(0, 64)]).unwrap();
    a.mem.fill(0, msg);
    a.qp.post_send(&SendWr {
        wr_id: 2,
        opcode: IV_WR_SEND,
        flags: IV_SEND_SIGNALED,
        sges: &[a.sge(0, msg.len())],
        ..SendWr::default()
    })
    .unwrap();
    assert_eq!(a.wc().status, IV_WC_SUCCESS);
    let r = b.wc();
    assert_eq!((r.status, r.byte_len as usize), (IV_WC_SUCCESS, msg.len()));
    assert_eq!(b.mem.read(0, msg.len()), msg);
    a.qp.post_recv(3, &[a.sge(100, 64)]).unwrap();
    b.mem.fill(100, b"back");
    b.qp.post_send(&SendWr {
        wr_id: 4,
        opcode: IV_WR_SEND,
        flags: IV_SEND_SIGNALED,
        sges: &[b.sge(100, 4)],
        ..SendWr::default()
    })
    .unwrap();
    assert_eq!(b.wc().status, IV_WC_SUCCESS);
    assert_eq!(a.wc().status, IV_WC_SUCCESS);
    assert_eq!(a.mem.read(100, 4), b"back");
    // A disconnects (DREQ, until the DREP), B answers (DREP at once);
    // neither QP is moved: their owners do that.
    let dis = |cep| IvCmDisconnectIn {
        cep,
        ..IvCmDisconnectIn::default()
    };
    std::thread::scope(|s| {
        let active = s.spawn(|| status(&ca, IOCTL_IV_CM_DISCONNECT, &dis(acep)));
        let dreq = event(&cb, bcep);
        assert_eq!(dreq.event_type, IV_CEP_EVENT_DISCONNECT_REQUEST);
        assert_eq!(
            status(&cb, IOCTL_IV_CM_DISCONNECT, &dis(bcep)),
            STATUS_SUCCESS
        );
        assert_eq!(active.join().unwrap(), STATUS_SUCCESS);
    });
    assert_eq!(event(&ca, acep).event_type, IV_CEP_EVENT_DISCONNECT_REPLY);
    assert_eq!(a.qp.query().unwrap().attr.qp_state, IV_QPS_RTS);
    assert_eq!(b.qp.query().unwrap().attr.qp_state, IV_QPS_RTS);
    // Disconnected: no more attributes; no second disconnect.
    for (c, id) in [(&ca, acep), (&cb, bcep)] {
        assert_eq!(
            init_qp_attr(c, id, IV_QPS_RTS, 0),
            Err(STATUS_INVALID_DEVICE_STATE)
        );
        assert_eq!(
            status(c, IOCTL_IV_CM_DISCONNECT, &dis(id)),
            STATUS_INVALID_DEVICE_STATE
        );
    }
    for (c, id) in [(&ca, acep), (&cb, bcep), (&cb, listener)] {
        let h = IvHandleIn { handle: id };
        assert_eq!(status(c, IOCTL_IV_DESTROY_CEP, &h), STATUS_SUCCESS);
    }
    drop((a, b));
    drop((ca, cb));
    finish([&da, &db]);
    drop(wire);
}

/// A connect without a QP waiting for its REP: the CEP's other requests
/// are busy (`CM_ESTABLISH` too), its attributes are answered; the QP,
/// which the CEP does not hold, is destroyed meanwhile; then the CEP is
/// destroyed: the connect ends with `STATUS_CANCELLED` and the remote's
/// request is rejected. The passive CEP has no RTU to send.
fn a_connect_without_a_qp_is_busy_then_cancelled(backend: Backend) {
    let (da, db) = (device(backend, 3), device(backend, 4));
    let wire = LoopWire::start();
    wire.attach(da.soft()).unwrap();
    wire.attach(db.soft()).unwrap();
    let (ca, cb) = (open(&da), open(&db));
    let End { cq, qp, mem, .. } = End::new_rc(&ca);
    let listener = listen(&cb);
    let acep = cep(&ca);
    let connect = connect_in(acep, qp.qpn(), da.soft().gid(), db.soft().gid());
    std::thread::scope(|s| {
        let active = s.spawn(|| status(&ca, IOCTL_IV_CM_CONNECT, &connect));
        let req = event(&cb, listener);
        assert_eq!(req.event_type, IV_CEP_EVENT_CONNECT_REQUEST);
        let h = IvHandleIn { handle: req.cep };
        assert_eq!(
            status(&cb, IOCTL_IV_CM_ESTABLISH, &h),
            STATUS_INVALID_DEVICE_STATE
        );
        // The REQ left: the connect is in progress.
        let h = IvHandleIn { handle: acep };
        assert_eq!(status(&ca, IOCTL_IV_CM_ESTABLISH, &h), STATUS_DEVICE_BUSY);
        assert_eq!(
            status(&ca, IOCTL_IV_CM_CONNECT, &connect),
            STATUS_DEVICE_BUSY
        );
        let init = init_qp_attr(&ca, acep, IV_QPS_INIT, 0).expect("INIT");
        assert_eq!(init.attr.qp_state, IV_QPS_INIT);
        assert_eq!(
            init_qp_attr(&ca, acep, IV_QPS_RTR, 0),
            Err(STATUS_INVALID_DEVICE_STATE)
        );
        // The caller's QP is its own: destroying it is not busy.
        assert_eq!(qp.destroy().map_err(|(_, st)| st), Ok(()));
        assert_eq!(status(&ca, IOCTL_IV_DESTROY_CEP, &h), STATUS_SUCCESS);
        assert_eq!(active.join().unwrap(), STATUS_CANCELLED);
        assert_eq!(event(&cb, req.cep).event_type, IV_CEP_EVENT_REJECTED);
        let h = IvHandleIn { handle: req.cep };
        assert_eq!(status(&cb, IOCTL_IV_DESTROY_CEP, &h), STATUS_SUCCESS);
    });
    let h = IvHandleIn { handle: listener };
    assert_eq!(status(&cb, IOCTL_IV_DESTROY_CEP, &h), STATUS_SUCCESS);
    drop((cq, mem));
    drop((ca, cb));
    finish([&da, &db]);
    drop(wire);
}
