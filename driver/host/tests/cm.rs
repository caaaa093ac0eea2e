//! The connection manager in host mode: two host devices over the
//! in-process loopback wire (real RoCEv2 datagrams, the CM's MADs on the
//! soft HCAs' GSI), one listening; an RC connection made with one
//! `CM_CONNECT` and one `CM_ACCEPT` request, data moved over it, then
//! disconnected from one side with the other answering; a connect nobody
//! answers timing out on the CM's platform timer (virtual clock); the
//! verifier on.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use irpverbs_abi::*;
use irpverbs_host::loopwire::LoopWire;
use irpverbs_host::platform::{HostConfig, TimerClock};
use irpverbs_host::{Backend, Engine, HostDevice, HostDeviceConfig};
use irpverbs_soft::SoftConfig;
use irpverbs_verbs::{Client, IntoClient, SendWr};
use zerocopy::{FromBytes, IntoBytes};

mod common;
use common::End;

crate::on_each_backend!(
    an_rc_connection_through_the_cm_firmware_inline,
    a_connect_nobody_answers_times_out_on_the_cm_timer,
);

fn device(backend: Backend, engine: Engine, last: u8) -> Arc<HostDevice> {
    device_on(backend, engine, last, TimerClock::Real)
}

fn device_on(backend: Backend, engine: Engine, last: u8, clock: TimerClock) -> Arc<HostDevice> {
    HostDevice::new(HostDeviceConfig {
        backend,
        engine,
        platform: HostConfig {
            clock,
            ..HostConfig::default()
        },
        soft: SoftConfig {
            ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, last)),
            node_guid: 0x0200_00FF_FE00_0000 | u64::from(last),
            ..SoftConfig::default()
        },
        ..HostDeviceConfig::default()
    })
    .expect("host device")
}

const MEM: usize = 1 << 16;

impl<'c> End<'c> {
    /// A PD, memory, a CQ and an RC QP (left in RESET: the CM moves it).
    fn new(c: &'c Client) -> Self {
        Self::with(c, MEM, 64, None)
    }

    /// Waits for one completion (a minute at most: the condition is what
    /// is tested, not the time).
    fn one(&self) -> IvCqe {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut buf = [IvCqe::default(); 1];
        while Instant::now() < deadline {
            if self.cq.poll(&mut buf).unwrap() == 1 {
                return buf[0];
            }
            std::thread::yield_now();
        }
        panic!("no completion");
    }

    fn cep(&self) -> IvHandle {
        let out: IvCreateCepOut = self.call(IOCTL_IV_CREATE_CEP, IvCreateCepIn { user_context: 5 });
        out.cep
    }

    fn call<I: IntoBytes + zerocopy::Immutable, O: FromBytes>(&self, code: u32, i: I) -> O {
        let (st, out) = self.c.raw(code, i.as_bytes(), size_of::<O>());
        assert_eq!(st, STATUS_SUCCESS, "{}", status_name(st));
        O::read_from_bytes(&out[..size_of::<O>()]).unwrap()
    }

    fn status(&self, code: u32, i: impl IntoBytes + zerocopy::Immutable) -> NtStatus {
        self.c.raw(code, i.as_bytes(), 0).0
    }

    fn event(&self, cep: IvHandle) -> IvCepEventOut {
        self.call(IOCTL_IV_GET_CEP_EVENT, IvHandleIn { handle: cep })
    }
}

fn connect_and_move_data(backend: Backend, engine: Engine) {
    let (da, db) = (device(backend, engine, 1), device(backend, engine, 2));
    let wire = LoopWire::start();
    wire.attach(da.soft()).unwrap();
    wire.attach(db.soft()).unwrap();
    let open = |d: &Arc<HostDevice>| {
        d.open(FILE_READ_ACCESS | FILE_WRITE_ACCESS)
            .expect("open")
            .into_client()
    };
    let (ca, cb) = (open(&da), open(&db));
    let (a, b) = (End::new(&ca), End::new(&cb));
    let listener = b.cep();
    assert_eq!(
        b.status(
            IOCTL_IV_LISTEN,
            IvListenIn {
                cep: listener,
                service_id: 0x0106_4D2A,
            },
        ),
        STATUS_SUCCESS
    );
    let ca_cep = a.cep();
    let connect = IvCmConnectIn {
        cep: ca_cep,
        qp: a.qp.handle(),
        service_id: 0x0106_4D2A,
        local_gid: da.soft().gid(),
        remote_gid: db.soft().gid(),
        starting_psn: 0x100,
        cm_response_timeout: 16,
        max_cm_retries: 5,
        local_ack_timeout: 14,
        path_mtu: IV_MTU_1024 as u8,
        private_data_len: 5,
        ..common::connect_defaults()
    };
    let mut connect = connect;
    connect.private_data[..5].copy_from_slice(b"hello");
    // A's connect and B's accept are each one request, at once.
    let conn = std::thread::scope(|s| {
        let active = s.spawn(|| a.status(IOCTL_IV_CM_CONNECT, connect));
        let req = b.event(listener);
        assert_eq!(req.event_type, IV_CEP_EVENT_CONNECT_REQUEST);
        assert_eq!((req.remote_qpn, req.user_context), (a.qp.qpn(), 5));
        // The REQ's values and private data (all 92 bytes: the REQ's
        // private data has a fixed size).
        assert_eq!(usize::from(req.private_data_len), IV_CM_REQ_PDATA as usize);
        assert_eq!(&req.private_data[..6], b"hello\0");
        assert_eq!(req.remote_ca_guid, 0x0200_00FF_FE00_0001);
        assert_eq!(req.remote_gid, da.soft().gid());
        assert_eq!(req.starting_psn, 0x100);
        assert_eq!((req.responder_resources, req.initiator_depth), (4, 4));
        assert_eq!(u32::from(req.path_mtu), IV_MTU_1024);
        assert_eq!((req.retry_count, req.rnr_retry_count), (7, 7));
        assert_eq!(u32::from(req.flags), IV_CM_FLOW_CONTROL);
        let mut accept = IvCmAcceptIn {
            cep: req.cep,
            qp: b.qp.handle(),
            starting_psn: 0x200,
            responder_resources: 2,
            initiator_depth: 2,
            rnr_retry_count: 7,
            min_rnr_timer: 12,
            private_data_len: 3,
            ..IvCmAcceptIn::default()
        };
        accept.private_data[..3].copy_from_slice(b"rep");
        assert_eq!(b.status(IOCTL_IV_CM_ACCEPT, accept), STATUS_SUCCESS);
        assert_eq!(active.join().unwrap(), STATUS_SUCCESS);
        req.cep
    });
    // The REP the connect consumed is reported too, with its values.
    let rep = a.event(ca_cep);
    assert_eq!(rep.event_type, IV_CEP_EVENT_REPLY);
    assert_eq!(usize::from(rep.private_data_len), IV_CM_REP_PDATA as usize);
    assert_eq!(&rep.private_data[..4], b"rep\0");
    assert_eq!((rep.remote_qpn, rep.starting_psn), (b.qp.qpn(), 0x200));
    assert_eq!((rep.responder_resources, rep.initiator_depth), (2, 2));
    assert_eq!(rep.remote_ca_guid, 0x0200_00FF_FE00_0002);
    assert_eq!(a.qp.query().unwrap().attr.qp_state, IV_QPS_RTS);
    assert_eq!(b.qp.query().unwrap().attr.qp_state, IV_QPS_RTS);
    // Data both ways over the connection.
    let msg = b"over a CM connection".as_slice();
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
    assert_eq!(a.one().status, IV_WC_SUCCESS);
    let r = b.one();
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
    assert_eq!(b.one().status, IV_WC_SUCCESS);
    assert_eq!(a.one().status, IV_WC_SUCCESS);
    assert_eq!(a.mem.read(100, 4), b"back");
    // A disconnects (one request: DREQ, QP to ERR, until the DREP); B
    // sees the request and answers (QP to ERR, DREP).
    // Private data both ways: the DREQ's and the DREP's.
    std::thread::scope(|s| {
        let active = s.spawn(|| a.status(IOCTL_IV_CM_DISCONNECT, disconnect(ca_cep, b"bye")));
        let dreq = b.event(conn);
        assert_eq!(dreq.event_type, IV_CEP_EVENT_DISCONNECT_REQUEST);
        assert_eq!(
            usize::from(dreq.private_data_len),
            IV_CM_DREQ_PDATA as usize
        );
        assert_eq!(&dreq.private_data[..3], b"bye");
        assert_eq!(
            b.status(IOCTL_IV_CM_DISCONNECT, disconnect(conn, b"ok")),
            STATUS_SUCCESS
        );
        assert_eq!(active.join().unwrap(), STATUS_SUCCESS);
    });
    let drep = a.event(ca_cep);
    assert_eq!(drep.event_type, IV_CEP_EVENT_DISCONNECT_REPLY);
    assert_eq!(
        usize::from(drep.private_data_len),
        IV_CM_DREP_PDATA as usize
    );
    assert_eq!(&drep.private_data[..3], b"ok\0");
    assert_eq!(a.qp.query().unwrap().attr.qp_state, IV_QPS_ERR);
    assert_eq!(b.qp.query().unwrap().attr.qp_state, IV_QPS_ERR);
    for (e, cep) in [(&a, ca_cep), (&b, conn), (&b, listener)] {
        assert_eq!(
            e.status(IOCTL_IV_DESTROY_CEP, IvHandleIn { handle: cep }),
            STATUS_SUCCESS
        );
    }
    drop((a, b));
    drop((ca, cb));
    for d in [&da, &db] {
        d.quiesce(Duration::from_secs(10)).expect("quiescent");
        assert_eq!(d.platform().pool_stats().live, 0, "pool leaked");
        d.unload();
    }
    drop(wire);
}

fn an_rc_connection_through_the_cm_firmware_inline(backend: Backend) {
    connect_and_move_data(backend, Engine::Inline);
}

/// Soft HCA only: the model HCA has no firmware thread.
#[test]
fn an_rc_connection_through_the_cm_firmware_on_its_thread() {
    connect_and_move_data(Backend::Soft, Engine::Thread);
}

/// A connect to a GID nobody has: the CM's timer (a platform timer, here
/// on the virtual clock) retransmits the REQ, then gives up, and the
/// request fails with `STATUS_IO_TIMEOUT`.
fn a_connect_nobody_answers_times_out_on_the_cm_timer(backend: Backend) {
    let d = device_on(backend, Engine::Inline, 1, TimerClock::Virtual);
    let c = d
        .open(FILE_READ_ACCESS | FILE_WRITE_ACCESS)
        .expect("open")
        .into_client();
    let e = End::new(&c);
    let cep = e.cep();
    let connect = IvCmConnectIn {
        cep,
        qp: e.qp.handle(),
        service_id: 1,
        local_gid: d.soft().gid(),
        remote_gid: [0xFE; 16],
        starting_psn: 1,
        cm_response_timeout: 10,
        max_cm_retries: 2,
        local_ack_timeout: 14,
        path_mtu: 0,
        ..common::connect_defaults()
    };
    let st = std::thread::scope(|s| {
        let t = s.spawn(|| e.status(IOCTL_IV_CM_CONNECT, connect));
        // Virtual time: each step passes every CM timeout (4.096 us * 2^10).
        // It goes on until the connect has ended, however late its thread
        // and the DPC worker run on a loaded machine (a count of steps can
        // run out before the REQ is even sent, and the join then waits
        // forever); the wall clock only bounds a connect that never ends.
        let give_up = std::time::Instant::now() + Duration::from_secs(120);
        while !t.is_finished() && std::time::Instant::now() < give_up {
            d.platform().advance(Duration::from_millis(10));
            std::thread::sleep(Duration::from_micros(100));
        }
        assert!(t.is_finished(), "the connect did not end");
        t.join().unwrap()
    });
    assert_eq!(st, STATUS_IO_TIMEOUT, "{}", status_name(st));
    assert_eq!(
        d.soft().stats().mads_sent,
        4,
        "the REQ, two retries, and the REJ (timeout) that gives up"
    );
    drop(e);
    drop(c);
    d.quiesce(Duration::from_secs(10)).expect("quiescent");
    d.unload();
}

/// A disconnect request with private data.
fn disconnect(cep: IvHandle, pd: &[u8]) -> IvCmDisconnectIn {
    let mut d = IvCmDisconnectIn {
        cep,
        private_data_len: pd.len() as u32,
        ..IvCmDisconnectIn::default()
    };
    d.private_data[..pd.len()].copy_from_slice(pd);
    d
}
