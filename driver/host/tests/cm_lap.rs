//! LAP and APR through the CM's IOCTLs in host mode, verifier on: two host
//! devices on the in-process loopback wire, each port with a second
//! address (GID 1), connected with `CM_CONNECT` / `CM_ACCEPT` over the
//! first. `CM_LAP` proposes the second addresses as the alternate path; the
//! remote sees `IV_CEP_EVENT_LAP` and answers with `CM_APR`: accepted, both
//! QPs load and arm the path, and a migration by hand (`modify_qp` with
//! MIGRATED) moves the connection onto it, which then carries traffic with
//! the first addresses unreachable; rejected, the LAP fails with
//! `STATUS_CONNECTION_REFUSED` and the QPs are unchanged. Bad input gets
//! its status and changes nothing.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use irpverbs_abi::*;
use irpverbs_host::loopwire::LoopWire;
use irpverbs_host::platform::{HostConfig, TimerClock};
use irpverbs_host::{Backend, Engine, HostDevice, HostDeviceConfig};
use irpverbs_soft::SoftConfig;
use irpverbs_verbs::{Client, IntoClient};
use zerocopy::{FromBytes, IntoBytes};

mod common;
use common::{End, connect_defaults, send};

crate::on_each_backend!(
    lap_and_apr_load_an_alternate_path_that_then_carries_the_connection,
    a_lap_nobody_answers_times_out,
);

/// Device `last`: GID 0 is 10.0.6.`last`, GID 1 10.0.7.`last`; a virtual
/// CM clock.
fn device(backend: Backend, last: u8) -> Arc<HostDevice> {
    HostDevice::new(HostDeviceConfig {
        backend,
        engine: Engine::Inline,
        platform: HostConfig {
            clock: TimerClock::Virtual,
            ..HostConfig::default()
        },
        soft: SoftConfig {
            ip: IpAddr::V4(Ipv4Addr::new(10, 0, 6, last)),
            aliases: vec![IpAddr::V4(Ipv4Addr::new(10, 0, 7, last))],
            node_guid: 0x0200_00FF_FE00_0600 | u64::from(last),
            ..SoftConfig::default()
        },
        ..HostDeviceConfig::default()
    })
    .expect("host device")
}

fn client(d: &Arc<HostDevice>) -> Client {
    d.open(FILE_READ_ACCESS | FILE_WRITE_ACCESS)
        .expect("open")
        .into_client()
}

fn cep(c: &Client, ctx: u64) -> IvHandle {
    let (st, out) = c.raw(
        IOCTL_IV_CREATE_CEP,
        IvCreateCepIn { user_context: ctx }.as_bytes(),
        size_of::<IvCreateCepOut>(),
    );
    assert_eq!(st, STATUS_SUCCESS, "{}", status_name(st));
    IvCreateCepOut::read_from_bytes(&out).unwrap().cep
}

fn status(c: &Client, code: u32, i: &(impl IntoBytes + zerocopy::Immutable)) -> NtStatus {
    c.raw(code, i.as_bytes(), 0).0
}

/// The CEP's next event (waits for it).
fn event(c: &Client, cep: IvHandle) -> IvCepEventOut {
    let (st, out) = c.raw(
        IOCTL_IV_GET_CEP_EVENT,
        IvHandleIn { handle: cep }.as_bytes(),
        size_of::<IvCepEventOut>(),
    );
    assert_eq!(st, STATUS_SUCCESS, "{}", status_name(st));
    IvCepEventOut::read_from_bytes(&out).unwrap()
}

/// A LAP proposing `local` (GID index 1) to `remote`.
fn lap_in(cep: IvHandle, local: [u8; 16], remote: [u8; 16]) -> IvCmLapIn {
    let mut i = IvCmLapIn {
        cep,
        alt_local_gid: local,
        alt_remote_gid: remote,
        alt_sgid_index: 1,
        alt_local_ack_timeout: 12,
        private_data_len: 3,
        ..IvCmLapIn::default()
    };
    i.private_data[..3].copy_from_slice(b"lap");
    i
}

fn apr_in(cep: IvHandle, status: u8) -> IvCmAprIn {
    IvCmAprIn {
        cep,
        status,
        alt_sgid_index: if status == IV_CM_APR_ACCEPTED { 1 } else { 0 },
        ..IvCmAprIn::default()
    }
}

/// Connects `a`'s QP (from `a_gid`) to `b`'s (at `b_gid`) with
/// `CM_CONNECT` and `CM_ACCEPT`: the two CEPs (the REPLY event taken).
fn connect(
    ca: &Client,
    cb: &Client,
    (a, a_gid): (&End<'_>, [u8; 16]),
    (b, b_gid): (&End<'_>, [u8; 16]),
) -> (IvHandle, IvHandle) {
    let l = cep(cb, 1);
    let st = status(
        cb,
        IOCTL_IV_LISTEN,
        &IvListenIn {
            cep: l,
            service_id: 0x1A9,
        },
    );
    assert_eq!(st, STATUS_SUCCESS);
    let c = cep(ca, 2);
    let input = IvCmConnectIn {
        cep: c,
        qp: a.qp.handle(),
        service_id: 0x1A9,
        local_gid: a_gid,
        remote_gid: b_gid,
        starting_psn: 0x10,
        path_mtu: IV_MTU_1024 as u8,
        ..connect_defaults()
    };
    let bc = std::thread::scope(|s| {
        let t = s.spawn(|| status(ca, IOCTL_IV_CM_CONNECT, &input));
        let req = event(cb, l);
        assert_eq!(req.event_type, IV_CEP_EVENT_CONNECT_REQUEST);
        let acc = IvCmAcceptIn {
            cep: req.cep,
            qp: b.qp.handle(),
            starting_psn: 0x20,
            responder_resources: 4,
            initiator_depth: 4,
            rnr_retry_count: 7,
            min_rnr_timer: 12,
            ..IvCmAcceptIn::default()
        };
        assert_eq!(status(cb, IOCTL_IV_CM_ACCEPT, &acc), STATUS_SUCCESS);
        assert_eq!(t.join().unwrap(), STATUS_SUCCESS);
        req.cep
    });
    assert_eq!(event(ca, c).event_type, IV_CEP_EVENT_REPLY);
    (c, bc)
}

fn finish(devs: [&Arc<HostDevice>; 2]) {
    for d in devs {
        d.quiesce(Duration::from_secs(10)).expect("quiescent");
        assert_eq!(d.platform().pool_stats().live, 0, "pool leaked");
        d.unload();
    }
}

fn lap_and_apr_load_an_alternate_path_that_then_carries_the_connection(backend: Backend) {
    let (da, db) = (device(backend, 1), device(backend, 2));
    let wire = LoopWire::start();
    wire.attach(da.soft()).unwrap();
    wire.attach(db.soft()).unwrap();
    let (ca, cb) = (client(&da), client(&db));
    let (a, b) = (End::new_rc(&ca), End::new_rc(&cb));
    let (a0, a1) = (ca.query_gid(1, 0).unwrap(), ca.query_gid(1, 1).unwrap());
    let (b0, b1) = (cb.query_gid(1, 0).unwrap(), cb.query_gid(1, 1).unwrap());

    // Bad input before any connection: a LAP on an idle CEP, an APR with
    // no LAP to answer.
    let idle = cep(&ca, 9);
    assert_eq!(
        status(&ca, IOCTL_IV_CM_LAP, &lap_in(idle, a1, b1)),
        STATUS_INVALID_DEVICE_STATE
    );
    assert_eq!(
        status(&ca, IOCTL_IV_CM_APR, &apr_in(idle, IV_CM_APR_ACCEPTED)),
        STATUS_INVALID_DEVICE_STATE
    );

    // Connected over the first addresses.
    let (c, bc) = connect(&ca, &cb, (&a, a0), (&b, b0));

    // Bad LAPs and APRs change nothing.
    let (qa, qb) = (a.qp.query().unwrap(), b.qp.query().unwrap());
    let bad_laps = [
        IvCmLapIn {
            alt_local_ack_timeout: 32,
            ..lap_in(c, a1, b1)
        },
        IvCmLapIn {
            private_data_len: IV_CM_LAP_PDATA as u8 + 1,
            ..lap_in(c, a1, b1)
        },
        IvCmLapIn {
            reserved: [1, 0, 0, 0, 0],
            ..lap_in(c, a1, b1)
        },
    ];
    for i in bad_laps {
        assert_eq!(status(&ca, IOCTL_IV_CM_LAP, &i), STATUS_INVALID_PARAMETER);
    }
    // A GID index that names no GID of the port, or another GID than the
    // LAP's local one: refused before any LAP leaves (B sees none: the
    // next LAP event it gets is the one answered below).
    let wrong_gids = [
        IvCmLapIn {
            alt_sgid_index: 7,
            ..lap_in(c, a1, b1)
        },
        IvCmLapIn {
            alt_sgid_index: 0,
            ..lap_in(c, a1, b1)
        },
        IvCmLapIn {
            alt_sgid_index: 1,
            ..lap_in(c, b1, a1)
        },
    ];
    for i in wrong_gids {
        let st = status(&ca, IOCTL_IV_CM_LAP, &i);
        assert_eq!(st, STATUS_INVALID_ADDRESS, "{}", status_name(st));
    }
    let bad_aprs = [
        apr_in(bc, IV_CM_APR_MAX_STATUS + 1),
        IvCmAprIn {
            info_len: 1,
            ..apr_in(bc, IV_CM_APR_ACCEPTED)
        },
        IvCmAprIn {
            private_data_len: IV_CM_APR_PDATA as u8 + 1,
            ..apr_in(bc, 3)
        },
        IvCmAprIn {
            reserved2: 1,
            ..apr_in(bc, 3)
        },
    ];
    for i in bad_aprs {
        assert_eq!(status(&cb, IOCTL_IV_CM_APR, &i), STATUS_INVALID_PARAMETER);
    }
    assert_eq!(
        status(&cb, IOCTL_IV_CM_APR, &apr_in(bc, IV_CM_APR_ACCEPTED)),
        STATUS_INVALID_DEVICE_STATE,
        "no LAP to answer"
    );
    assert_eq!((a.qp.query().unwrap(), b.qp.query().unwrap()), (qa, qb));

    // Rejected: the LAP fails, the APR's status reaches A, nothing loads.
    let st = std::thread::scope(|s| {
        let t = s.spawn(|| status(&ca, IOCTL_IV_CM_LAP, &lap_in(c, a1, b1)));
        let ev = event(&cb, bc);
        assert_eq!(ev.event_type, IV_CEP_EVENT_LAP);
        assert_eq!(ev.remote_gid, a1, "the LAP with the right GID");
        let mut apr = apr_in(bc, 3);
        apr.info_len = 2;
        apr.info[..2].copy_from_slice(b"no");
        assert_eq!(status(&cb, IOCTL_IV_CM_APR, &apr), STATUS_SUCCESS);
        t.join().unwrap()
    });
    assert_eq!(st, STATUS_CONNECTION_REFUSED, "{}", status_name(st));
    let ev = event(&ca, c);
    assert_eq!((ev.event_type, ev.status), (IV_CEP_EVENT_APR, 3));
    assert_eq!(&ev.ari[..usize::from(ev.ari_len)][..2], b"no");
    assert_eq!((a.qp.query().unwrap(), b.qp.query().unwrap()), (qa, qb));

    // Accepted: both QPs load the alternate path and arm it.
    let st = std::thread::scope(|s| {
        let t = s.spawn(|| status(&ca, IOCTL_IV_CM_LAP, &lap_in(c, a1, b1)));
        let ev = event(&cb, bc);
        assert_eq!(ev.event_type, IV_CEP_EVENT_LAP);
        assert_eq!(ev.remote_gid, a1, "the remote's address on the path");
        assert_eq!(&ev.ari[..usize::from(ev.ari_len)], &b1, "this side's");
        assert_eq!(ev.local_ack_timeout, 12);
        assert_eq!(&ev.private_data[..3], b"lap");
        // A LAP of B's own while it has one to answer: refused.
        assert_eq!(
            status(&cb, IOCTL_IV_CM_LAP, &lap_in(bc, b1, a1)),
            STATUS_INVALID_DEVICE_STATE
        );
        let apr = apr_in(bc, IV_CM_APR_ACCEPTED);
        assert_eq!(status(&cb, IOCTL_IV_CM_APR, &apr), STATUS_SUCCESS);
        t.join().unwrap()
    });
    assert_eq!(st, STATUS_SUCCESS, "{}", status_name(st));
    let ev = event(&ca, c);
    assert_eq!(
        (ev.event_type, ev.status),
        (IV_CEP_EVENT_APR, IV_CM_APR_ACCEPTED)
    );
    for (e, alt) in [(&a, b1), (&b, a1)] {
        let q = e.qp.query().unwrap().attr;
        assert_eq!(q.path_mig_state, IV_MIG_ARMED);
        assert_eq!(
            (q.alt_ah_attr.dgid, q.alt_ah_attr.sgid_index, q.alt_port_num),
            (alt, 1, 1)
        );
        assert_eq!(q.alt_timeout, 12);
    }

    // Migrated by hand, both sides; the first addresses go away and the
    // connection carries traffic both ways on the second.
    let migrated = IvQpAttr {
        qp_state: IV_QPS_RTS,
        path_mig_state: IV_MIG_MIGRATED,
        ..IvQpAttr::default()
    };
    for e in [&a, &b] {
        e.qp.modify(IV_QP_STATE | IV_QP_PATH_MIG_STATE, &migrated)
            .unwrap();
    }
    wire.set_reachable(a0, false);
    wire.set_reachable(b0, false);
    for (from, to, id) in [(&a, &b, 1u64), (&b, &a, 2)] {
        to.qp.post_recv(id, &[to.sge(0, 64)]).unwrap();
        from.mem.fill(0, &[id as u8; 64]);
        send(from, id, 64);
        let wc = from.wc();
        assert_eq!((wc.wr_id, wc.status), (id, IV_WC_SUCCESS));
        let wc = to.wc();
        assert_eq!((wc.wr_id, wc.status), (id, IV_WC_SUCCESS));
        assert_eq!(to.mem.read(0, 64), vec![id as u8; 64]);
    }
    for (e, path) in [(&a, b1), (&b, a1)] {
        let q = e.qp.query().unwrap().attr;
        assert_eq!((q.path_mig_state, q.ah_attr.dgid), (IV_MIG_MIGRATED, path));
    }

    drop((a, b));
    drop((ca, cb));
    drop(wire);
    finish([&da, &db]);
}

/// A LAP nobody answers (the peer's address unreachable): its retries run
/// out on the CM's clock and it fails with `STATUS_IO_TIMEOUT`, the QP
/// unchanged; the CEP is still established and takes a LAP again.
fn a_lap_nobody_answers_times_out(backend: Backend) {
    let (da, db) = (device(backend, 3), device(backend, 4));
    let wire = LoopWire::start();
    wire.attach(da.soft()).unwrap();
    wire.attach(db.soft()).unwrap();
    let (ca, cb) = (client(&da), client(&db));
    let (a, b) = (End::new_rc(&ca), End::new_rc(&cb));
    let (a0, a1) = (ca.query_gid(1, 0).unwrap(), ca.query_gid(1, 1).unwrap());
    let (b0, b1) = (cb.query_gid(1, 0).unwrap(), cb.query_gid(1, 1).unwrap());
    let (c, bc) = connect(&ca, &cb, (&a, a0), (&b, b0));
    let before = a.qp.query().unwrap();
    wire.set_reachable(b0, false);
    let st = std::thread::scope(|s| {
        let t = s.spawn(|| status(&ca, IOCTL_IV_CM_LAP, &lap_in(c, a1, b1)));
        // The connection's CM timeouts (2^16 * 4.096 us both ways, 5
        // retries) are seconds of the virtual clock: moved in 10 ms
        // steps, a minute at most.
        for _ in 0..6000 {
            if t.is_finished() {
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
            da.platform().advance(Duration::from_millis(10));
        }
        t.join().unwrap()
    });
    assert_eq!(st, STATUS_IO_TIMEOUT, "{}", status_name(st));
    assert_eq!(a.qp.query().unwrap(), before);
    // B never saw it; a LAP goes again once the address is back.
    wire.set_reachable(b0, true);
    let st = std::thread::scope(|s| {
        let t = s.spawn(|| status(&ca, IOCTL_IV_CM_LAP, &lap_in(c, a1, b1)));
        assert_eq!(event(&cb, bc).event_type, IV_CEP_EVENT_LAP);
        let apr = apr_in(bc, IV_CM_APR_ACCEPTED);
        assert_eq!(status(&cb, IOCTL_IV_CM_APR, &apr), STATUS_SUCCESS);
        t.join().unwrap()
    });
    assert_eq!(st, STATUS_SUCCESS, "{}", status_name(st));
    assert_eq!(a.qp.query().unwrap().attr.path_mig_state, IV_MIG_ARMED);
    drop((a, b));
    drop((ca, cb));
    drop(wire);
    finish([&da, &db]);
}
