//! Automatic path migration in host mode, verifier on: two host devices on
//! the in-process loopback wire, each port with a second address (GID 1).
//! RC QPs connected over the first addresses load the second ones as their
//! alternate path and arm it (`modify_qp` with `IV_QP_ALT_PATH` and
//! `IV_QP_PATH_MIG_STATE`); then the first addresses become unreachable
//! with traffic flowing. The requester runs out its retries, migrates and
//! sends again on the alternate path with MigReq set; the responder,
//! armed, takes that as its peer's migration and migrates too. Both get
//! `PATH_MIG`, every message arrives once and in order, and traffic flows
//! both ways on the new path. A port taken down leaves no path to migrate
//! to: `PATH_MIG_ERR`, and the send fails as without one. Bad alternate
//! path attributes get their statuses and change nothing.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use irpverbs_abi::*;
use irpverbs_host::loopwire::LoopWire;
use irpverbs_host::{Backend, HostDevice, HostDeviceConfig};
use irpverbs_soft::SoftConfig;
use irpverbs_verbs::{Client, IntoClient, av, rts_steps};

mod common;
use common::{End, send};

crate::on_each_backend!(
    a_live_rc_connection_migrates_to_its_alternate_path,
    a_down_port_leaves_no_path_to_migrate_to,
    bad_alternate_paths_are_refused_and_change_nothing,
);

/// Device `last`: GID 0 is 10.0.4.`last`, GID 1 10.0.5.`last`.
fn device(backend: Backend, last: u8) -> Arc<HostDevice> {
    HostDevice::new(HostDeviceConfig {
        backend,
        soft: SoftConfig {
            ip: IpAddr::V4(Ipv4Addr::new(10, 0, 4, last)),
            aliases: vec![IpAddr::V4(Ipv4Addr::new(10, 0, 5, last))],
            node_guid: 0x0200_00FF_FE00_0400 | u64::from(last),
            ..SoftConfig::default()
        },
        ..HostDeviceConfig::default()
    })
    .expect("host device")
}

fn client(dev: &Arc<HostDevice>) -> Client {
    dev.open(FILE_READ_ACCESS | FILE_WRITE_ACCESS)
        .expect("open")
        .into_client()
}

fn finish(devs: [&Arc<HostDevice>; 2]) {
    for d in devs {
        d.quiesce(Duration::from_secs(10)).expect("quiescent");
        assert_eq!(d.platform().pool_stats().live, 0, "pool leaked");
        d.unload();
    }
}

/// The ACK timeout of both paths: 4.096 us * 2^14, about 67 ms (long
/// enough that a loaded machine does not lose a path for a slow thread).
const TIMEOUT: u8 = 14;

/// Walks `e`'s QP to RTS towards `peer` at `dgid` (from GID 0), with the
/// ACK timeout [`TIMEOUT`] and 3 retries.
fn to_rts(e: &End<'_>, peer: u32, dgid: [u8; 16]) {
    for (mask, attr) in rts_steps(IV_QPT_RC, peer, dgid) {
        let attr = IvQpAttr {
            timeout: TIMEOUT,
            retry_cnt: 3,
            ..attr
        };
        e.qp.modify(mask, &attr).unwrap();
    }
}

/// The alternate path to `dgid` from GID 1, armed (REARM).
fn alt_attr(dgid: [u8; 16]) -> IvQpAttr {
    IvQpAttr {
        qp_state: IV_QPS_RTS,
        alt_ah_attr: IvAhAttr {
            sgid_index: 1,
            ..av(dgid)
        },
        alt_port_num: 1,
        alt_pkey_index: 0,
        alt_timeout: TIMEOUT,
        path_mig_state: IV_MIG_REARM,
        ..IvQpAttr::default()
    }
}

const ALT_MASK: u32 = IV_QP_STATE | IV_QP_ALT_PATH | IV_QP_PATH_MIG_STATE;

/// The async event of the QP `e`, the next the file gets (acknowledged,
/// so that the QP can be destroyed).
fn qp_event(c: &Client, e: &End<'_>) -> u32 {
    let ev = c.get_async_event().unwrap();
    assert_eq!(ev.handle, e.qp.handle(), "the event names the QP");
    c.ack_async_event(ev.handle, ev.event_type).unwrap();
    ev.event_type
}

fn a_live_rc_connection_migrates_to_its_alternate_path(backend: Backend) {
    let (da, db) = (device(backend, 1), device(backend, 2));
    let wire = LoopWire::start();
    wire.attach(da.soft()).unwrap();
    wire.attach(db.soft()).unwrap();
    let (ca, cb) = (client(&da), client(&db));
    let (a, b) = (
        End::with(&ca, 1 << 16, 256, Some(64)),
        End::with(&cb, 1 << 16, 256, Some(64)),
    );
    let (a0, a1) = (ca.query_gid(1, 0).unwrap(), ca.query_gid(1, 1).unwrap());
    let (b0, b1) = (cb.query_gid(1, 0).unwrap(), cb.query_gid(1, 1).unwrap());
    to_rts(&a, b.qp.qpn(), b0);
    to_rts(&b, a.qp.qpn(), a0);
    a.qp.modify(ALT_MASK, &alt_attr(b1)).unwrap();
    b.qp.modify(ALT_MASK, &alt_attr(a1)).unwrap();
    for (e, alt) in [(&a, b1), (&b, a1)] {
        let q = e.qp.query().unwrap().attr;
        assert_eq!(q.path_mig_state, IV_MIG_ARMED, "REARM arms at once");
        assert_eq!((q.alt_ah_attr.dgid, q.alt_port_num), (alt, 1));
    }

    // 48 messages of 64 bytes, each its number; B has a receive for each.
    const N: u64 = 48;
    for id in 0..N {
        let at = (id * 64) as usize;
        b.qp.post_recv(id, &[b.sge(at, 64)]).unwrap();
        a.mem.fill(at, &[id as u8; 64]);
    }
    let post = |id: u64| {
        a.qp.post_send(&irpverbs_verbs::SendWr {
            wr_id: id,
            opcode: IV_WR_SEND,
            flags: IV_SEND_SIGNALED,
            sges: &[a.sge((id * 64) as usize, 64)],
            ..irpverbs_verbs::SendWr::default()
        })
        .unwrap();
    };
    for id in 0..16 {
        post(id);
    }
    for id in 0..16 {
        let wc = a.wc();
        assert_eq!((wc.wr_id, wc.status), (id, IV_WC_SUCCESS));
    }
    // The primary addresses go away, with sends in flight.
    for id in 16..32 {
        post(id);
    }
    wire.set_reachable(a0, false);
    wire.set_reachable(b0, false);
    for id in 32..N {
        post(id);
    }
    for id in 16..N {
        let wc = a.wc();
        assert_eq!((wc.wr_id, wc.status), (id, IV_WC_SUCCESS), "{wc:?}");
    }
    // Every message arrived once, in order, intact.
    for id in 0..N {
        let wc = b.wc();
        assert_eq!(
            (wc.wr_id, wc.status, wc.byte_len),
            (id, IV_WC_SUCCESS, 64),
            "{wc:?}"
        );
        assert_eq!(b.mem.read((id * 64) as usize, 64), vec![id as u8; 64]);
    }
    assert_eq!(
        b.cq.poll(&mut [IvCqe::default(); 4]).unwrap(),
        0,
        "no duplicate"
    );
    assert_eq!(qp_event(&ca, &a), IV_EVENT_PATH_MIG);
    assert_eq!(qp_event(&cb, &b), IV_EVENT_PATH_MIG);
    for (e, path) in [(&a, b1), (&b, a1)] {
        let q = e.qp.query().unwrap().attr;
        assert_eq!(q.qp_state, IV_QPS_RTS);
        assert_eq!(q.path_mig_state, IV_MIG_MIGRATED);
        assert_eq!((q.ah_attr.dgid, q.ah_attr.sgid_index), (path, 1));
    }
    // And back from B to A, on the new path.
    a.qp.post_recv(100, &[a.sge(0, 64)]).unwrap();
    b.mem.fill(0, &[0xB7; 64]);
    send(&b, 100, 64);
    let wc = b.wc();
    assert_eq!((wc.wr_id, wc.status), (100, IV_WC_SUCCESS));
    let wc = a.wc();
    assert_eq!((wc.wr_id, wc.status), (100, IV_WC_SUCCESS));
    assert_eq!(a.mem.read(0, 64), vec![0xB7; 64]);

    drop((a, b));
    drop((ca, cb));
    drop(wire);
    finish([&da, &db]);
}

/// With the port down there is no path to migrate to: `PATH_MIG_ERR`, and
/// the send fails with `RETRY_EXC_ERR` as it would without an alternate
/// path (the QP in ERR, still ARMED).
fn a_down_port_leaves_no_path_to_migrate_to(backend: Backend) {
    let (da, db) = (device(backend, 1), device(backend, 2));
    let wire = LoopWire::start();
    wire.attach(da.soft()).unwrap();
    wire.attach(db.soft()).unwrap();
    let (ca, cb) = (client(&da), client(&db));
    let (a, b) = (End::new_rc(&ca), End::new_rc(&cb));
    let (a0, a1) = (ca.query_gid(1, 0).unwrap(), ca.query_gid(1, 1).unwrap());
    let (b0, b1) = (cb.query_gid(1, 0).unwrap(), cb.query_gid(1, 1).unwrap());
    to_rts(&a, b.qp.qpn(), b0);
    to_rts(&b, a.qp.qpn(), a0);
    a.qp.modify(ALT_MASK, &alt_attr(b1)).unwrap();
    b.qp.modify(ALT_MASK, &alt_attr(a1)).unwrap();
    assert!(da.set_port_link(false));
    assert_eq!(ca.get_async_event().unwrap().event_type, IV_EVENT_PORT_ERR);
    b.qp.post_recv(1, &[b.sge(0, 64)]).unwrap();
    send(&a, 1, 64);
    let wc = a.wc();
    assert_eq!((wc.wr_id, wc.status), (1, IV_WC_RETRY_EXC_ERR));
    assert_eq!(qp_event(&ca, &a), IV_EVENT_PATH_MIG_ERR);
    let q = a.qp.query().unwrap().attr;
    assert_eq!((q.qp_state, q.ah_attr.dgid), (IV_QPS_ERR, b0));
    assert_eq!(b.cq.poll(&mut [IvCqe::default(); 1]).unwrap(), 0);
    assert!(da.set_port_link(true));
    drop((a, b));
    drop((ca, cb));
    drop(wire);
    finish([&da, &db]);
}

/// Alternate path attributes are checked as the primary's: on a UD QP
/// (`STATUS_INVALID_PARAMETER_MIX`), a port or P_Key index past the
/// device's, a timeout over 31, a bad address vector, a migration state
/// that is none (`STATUS_INVALID_PARAMETER`), arming with no alternate path
/// (`STATUS_INVALID_DEVICE_STATE`); each leaves the QP as it was. A good
/// one then loads, and MIGRATED by hand migrates.
fn bad_alternate_paths_are_refused_and_change_nothing(backend: Backend) {
    let dev = device(backend, 3);
    let c = client(&dev);
    let (a, b) = (End::new_rc(&c), End::new_rc(&c));
    let g0 = c.query_gid(1, 0).unwrap();
    let g1 = c.query_gid(1, 1).unwrap();
    to_rts(&a, b.qp.qpn(), g0);
    let before = a.qp.query().unwrap();
    let good = alt_attr(g1);
    let cases: [(u32, IvQpAttr, NtStatus); 7] = [
        (
            ALT_MASK,
            IvQpAttr {
                alt_port_num: 2,
                ..good
            },
            STATUS_INVALID_PARAMETER,
        ),
        (
            ALT_MASK,
            IvQpAttr {
                alt_pkey_index: 1,
                ..good
            },
            STATUS_INVALID_PARAMETER,
        ),
        (
            ALT_MASK,
            IvQpAttr {
                alt_timeout: 32,
                ..good
            },
            STATUS_INVALID_PARAMETER,
        ),
        (
            ALT_MASK,
            IvQpAttr {
                alt_ah_attr: IvAhAttr {
                    is_global: 0,
                    ..good.alt_ah_attr
                },
                ..good
            },
            STATUS_INVALID_PARAMETER,
        ),
        (
            ALT_MASK,
            IvQpAttr {
                path_mig_state: 3,
                ..good
            },
            STATUS_INVALID_PARAMETER,
        ),
        (
            IV_QP_STATE | IV_QP_PATH_MIG_STATE,
            good,
            STATUS_INVALID_DEVICE_STATE,
        ),
        (
            IV_QP_STATE | IV_QP_PATH_MIG_STATE,
            IvQpAttr {
                path_mig_state: IV_MIG_ARMED,
                ..good
            },
            STATUS_INVALID_DEVICE_STATE,
        ),
    ];
    for (mask, attr, status) in cases {
        assert_eq!(a.qp.modify(mask, &attr).unwrap_err(), status, "{attr:?}");
        assert_eq!(a.qp.query().unwrap(), before, "changed nothing");
    }
    // A UD QP has no path to migrate.
    let u = End::new_ud(&c);
    for (mask, attr) in rts_steps(IV_QPT_UD, 0, g0) {
        u.qp.modify(mask, &attr).unwrap();
    }
    let ud_before = u.qp.query().unwrap();
    assert_eq!(
        u.qp.modify(ALT_MASK, &good).unwrap_err(),
        STATUS_INVALID_PARAMETER_MIX
    );
    assert_eq!(u.qp.query().unwrap(), ud_before);

    // A good one loads; MIGRATED by hand migrates (no event: asked for).
    a.qp.modify(ALT_MASK, &good).unwrap();
    let migrated = IvQpAttr {
        qp_state: IV_QPS_RTS,
        path_mig_state: IV_MIG_MIGRATED,
        ..IvQpAttr::default()
    };
    a.qp.modify(IV_QP_STATE | IV_QP_PATH_MIG_STATE, &migrated)
        .unwrap();
    let q = a.qp.query().unwrap().attr;
    assert_eq!(q.path_mig_state, IV_MIG_MIGRATED);
    assert_eq!((q.ah_attr.dgid, q.ah_attr.sgid_index), (g1, 1));
    drop((a, b, u));
    drop(c);
    dev.quiesce(Duration::from_secs(10)).expect("quiescent");
    assert_eq!(dev.platform().pool_stats().live, 0, "pool leaked");
    dev.unload();
}
