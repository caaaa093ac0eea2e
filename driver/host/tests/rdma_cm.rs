//! IP addressing for RoCE, as rdma_cm offers it, in host mode:
//! `IOCTL_IV_RESOLVE_ADDR` against the soft HCAs' GID tables (IPv4, IPv6,
//! aliases, refusals that change nothing), and `irpverbs_verbs::rdma_cm`
//! connections by address — over the in-process loopback wire (IPv4 and
//! IPv6) and over UDP on 127.0.0.1 / 127.0.0.2 — with data moved,
//! disconnects, a listener bound to one address refusing a REQ for
//! another of its device's addresses, a port listened on twice, and a
//! malformed IP CM header rejected. The verifier is on.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use irpverbs_abi::*;
use irpverbs_host::loopwire::LoopWire;
use irpverbs_host::udp::UdpConfig;
use irpverbs_host::{Backend, Engine, HostDevice, HostDeviceConfig};
use irpverbs_soft::SoftConfig;
use irpverbs_verbs::rdma_cm::{
    CmEvent, CmId, ConnParam, IpCmHeader, PortSpace, gid_ip, ip_gid, resolve,
};
use irpverbs_verbs::{Client, IntoClient, SendWr};
use zerocopy::{FromBytes, IntoBytes};

mod common;
use common::End;

crate::on_each_backend!(
    resolution_answers_from_the_gid_tables_and_refusals_change_nothing,
    connect_by_address_over_the_loopback_wire_ipv4_and_ipv6,
    connect_from_an_alias_address_leaves_from_the_alias,
    connect_by_address_over_udp_on_127_0_0_1,
    listeners_bound_to_addresses_share_a_port_and_take_their_own_connects,
    a_malformed_ip_cm_header_is_rejected_not_accepted,
);

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn device(
    backend: Backend,
    addr: &str,
    aliases: &[&str],
    guid: u64,
    udp_port: Option<u16>,
) -> Arc<HostDevice> {
    HostDevice::new(HostDeviceConfig {
        backend,
        engine: Engine::Inline,
        soft: SoftConfig {
            ip: ip(addr),
            aliases: aliases.iter().map(|a| ip(a)).collect(),
            node_guid: 0x0200_00FF_FE00_0000 | guid,
            udp_port: udp_port.unwrap_or(irpverbs_soft::link::DEFAULT_PORT),
            ..SoftConfig::default()
        },
        ..HostDeviceConfig::default()
    })
    .expect("host device")
}

fn open(d: &Arc<HostDevice>) -> Client {
    d.open(FILE_READ_ACCESS | FILE_WRITE_ACCESS)
        .expect("open")
        .into_client()
}

fn finish(devices: &[&Arc<HostDevice>]) {
    for d in devices {
        d.quiesce(Duration::from_secs(10)).expect("quiescent");
        assert_eq!(d.platform().pool_stats().live, 0, "pool leaked");
        d.unload();
    }
}

fn one(e: &End<'_>) -> IvCqe {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut buf = [IvCqe::default(); 1];
    while Instant::now() < deadline {
        if e.cq.poll(&mut buf).unwrap() == 1 {
            return buf[0];
        }
        std::thread::yield_now();
    }
    panic!("no completion");
}

fn resolution_answers_from_the_gid_tables_and_refusals_change_nothing(backend: Backend) {
    let d4 = device(backend, "10.0.0.1", &["10.0.0.7", "fd00::1"], 1, None);
    let c = open(&d4);
    // IPv4: the first IPv4-mapped GID, the destination mapped.
    let r = resolve(&c, None, ip("10.0.0.9")).unwrap();
    assert_eq!((r.port_num, r.sgid_index), (1, 0));
    assert_eq!(
        (gid_ip(&r.sgid), gid_ip(&r.dgid)),
        (ip("10.0.0.1"), ip("10.0.0.9"))
    );
    assert_eq!(r.dgid, ip_gid(ip("10.0.0.9")));
    assert_eq!(
        (r.path_mtu, r.hop_limit, r.pkey, r.pkey_index),
        (IV_MTU_1024 as u8, 64, 0xFFFF, 0)
    );
    // A source: the alias's index; the destination on this device: itself.
    let r = resolve(&c, Some(ip("10.0.0.7")), ip("10.0.0.9")).unwrap();
    assert_eq!((r.sgid_index, gid_ip(&r.sgid)), (1, ip("10.0.0.7")));
    let r = resolve(&c, None, ip("10.0.0.7")).unwrap();
    assert_eq!(r.sgid_index, 1, "loopback to the alias");
    // IPv6: the IPv6 GID.
    let r = resolve(&c, None, ip("fd00::9")).unwrap();
    assert_eq!((r.sgid_index, gid_ip(&r.sgid)), (2, ip("fd00::1")));
    assert_eq!(r.dgid, ip("fd00::9").to_canonical().pipe(ip_gid));

    let before = (d4.device().snapshot(), d4.platform().pool_stats().live);
    // A source no port owns, a family no port has.
    assert_eq!(
        resolve(&c, Some(ip("10.0.0.2")), ip("10.0.0.9")),
        Err(STATUS_INVALID_ADDRESS)
    );
    let only_v4 = device(backend, "10.0.0.2", &[], 2, None);
    let c4 = open(&only_v4);
    assert_eq!(
        resolve(&c4, None, ip("fd00::9")),
        Err(STATUS_NETWORK_UNREACHABLE)
    );
    // Bad input.
    let good = IvResolveAddrIn {
        dst_addr: [10, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        dst_family: IV_ADDR_IPV4,
        ..IvResolveAddrIn::default()
    };
    let bad = [
        IvResolveAddrIn {
            reserved: 1,
            ..good
        },
        IvResolveAddrIn {
            dst_family: 7,
            ..good
        },
        IvResolveAddrIn {
            dst_family: IV_ADDR_NONE,
            ..good
        },
        IvResolveAddrIn {
            dst_addr: [10, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
            ..good
        },
        IvResolveAddrIn {
            dst_addr: [224, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            ..good
        },
        IvResolveAddrIn {
            dst_addr: [0; 16],
            ..good
        },
        IvResolveAddrIn {
            src_family: IV_ADDR_IPV6,
            src_addr: ip_gid(ip("fd00::1")),
            ..good
        },
        IvResolveAddrIn {
            src_addr: [10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            ..good
        },
    ];
    for (k, i) in bad.iter().enumerate() {
        let (st, out) = c.raw(
            IOCTL_IV_RESOLVE_ADDR,
            zerocopy::IntoBytes::as_bytes(i),
            size_of::<IvResolveAddrOut>(),
        );
        assert_eq!(
            st,
            STATUS_INVALID_PARAMETER,
            "case {k}: {}",
            status_name(st)
        );
        assert!(out.is_empty());
    }
    // Short buffers are refused at the door.
    let (st, _) = c.raw(
        IOCTL_IV_RESOLVE_ADDR,
        &[0; 8],
        size_of::<IvResolveAddrOut>(),
    );
    assert_eq!(st, STATUS_INFO_LENGTH_MISMATCH);
    assert_eq!(
        (d4.device().snapshot(), d4.platform().pool_stats().live),
        before,
        "refusals change nothing"
    );
    drop((c, c4));
    finish(&[&d4, &only_v4]);
}

/// `x.pipe(f)` is `f(x)`.
trait Pipe: Sized {
    fn pipe<T>(self, f: impl FnOnce(Self) -> T) -> T {
        f(self)
    }
}
impl<T> Pipe for T {}

/// The server binds `listen_on` and port 7471, the client connects to
/// `to` (with `src`, if given): data both ways, then a disconnect from the
/// client. Returns the peer address the server saw.
fn connect_move_data_disconnect(
    server: &Client,
    client: &Client,
    listen_on: IpAddr,
    to: IpAddr,
    src: Option<IpAddr>,
) -> SocketAddr {
    let (a, b) = (
        End::with(client, 1 << 16, 64, None),
        End::with(server, 1 << 16, 64, None),
    );
    let mut listener = CmId::new(server, PortSpace::Tcp).unwrap();
    listener
        .bind_addr(SocketAddr::new(listen_on, 7471))
        .unwrap();
    listener.listen().unwrap();
    let mut active = CmId::new(client, PortSpace::Tcp).unwrap();
    active.resolve_addr(src, SocketAddr::new(to, 7471)).unwrap();
    assert_eq!(
        active.connect(a.qp.handle(), &ConnParam::default()),
        Err(STATUS_INVALID_DEVICE_STATE),
        "the route is not resolved yet"
    );
    active.resolve_route().unwrap();
    let local = active.local_addr().unwrap();
    let mut conn = std::thread::scope(|s| {
        let t = s.spawn(|| {
            let p = ConnParam {
                private_data: b"hello from the client".to_vec(),
                ..ConnParam::default()
            };
            active.connect(a.qp.handle(), &p)
        });
        let mut conn = listener.get_request().unwrap();
        // Fixed-size, zero-padded, as on the wire: the REQ's 92 bytes
        // less the 36 of the IP CM header.
        assert!(conn.private_data().starts_with(b"hello from the client\0"));
        assert_eq!(conn.private_data().len(), 56);
        assert_eq!(conn.remote_qpn(), a.qp.qpn());
        assert_eq!(conn.peer_addr(), Some(local), "the IP CM header's source");
        let p = ConnParam {
            private_data: b"and from the server".to_vec(),
            ..ConnParam::default()
        };
        conn.accept(b.qp.handle(), &p).unwrap();
        assert_eq!(t.join().unwrap(), Ok(()));
        conn
    });
    // The connection's packets leave from the route's source GID.
    assert_eq!(
        a.qp.query().unwrap().attr.ah_attr.sgid_index,
        active.route().unwrap().sgid_index
    );
    assert!(active.private_data().starts_with(b"and from the server\0"));
    assert_eq!(active.private_data().len(), 196);
    assert_eq!(active.remote_qpn(), b.qp.qpn());
    assert_eq!(
        a.qp.query().unwrap().attr.rq_psn,
        active.remote_psn(),
        "the REP's starting PSN"
    );
    let peer = conn.peer_addr().unwrap();
    // Data both ways.
    b.qp.post_recv(1, &[b.sge(0, 64)]).unwrap();
    a.mem.fill(0, b"by address");
    let send = |e: &End<'_>, at: usize, len: usize| {
        e.qp.post_send(&SendWr {
            wr_id: 9,
            opcode: IV_WR_SEND,
            flags: IV_SEND_SIGNALED,
            sges: &[e.sge(at, len)],
            ..SendWr::default()
        })
        .unwrap();
    };
    send(&a, 0, 10);
    assert_eq!(one(&a).status, IV_WC_SUCCESS);
    assert_eq!(one(&b).byte_len, 10);
    assert_eq!(b.mem.read(0, 10), b"by address");
    a.qp.post_recv(2, &[a.sge(100, 64)]).unwrap();
    b.mem.fill(100, b"back");
    send(&b, 100, 4);
    assert_eq!(one(&b).status, IV_WC_SUCCESS);
    assert_eq!(one(&a).status, IV_WC_SUCCESS);
    assert_eq!(a.mem.read(100, 4), b"back");
    // An alternate path (the same addresses again: each side has one
    // route), proposed by the client and accepted: both QPs armed.
    let route = *active.route().unwrap();
    std::thread::scope(|s| {
        let t =
            s.spawn(|| active.load_alternate_path(route.sgid, route.sgid_index, route.dgid, 14));
        assert_eq!(conn.get_event(), Ok(CmEvent::Other(IV_CEP_EVENT_LAP)));
        // The server's address is its GID 0.
        assert_eq!(conn.answer_lap(IV_CM_APR_ACCEPTED, 0), Ok(()));
        assert_eq!(t.join().unwrap(), Ok(()));
    });
    assert_eq!(active.get_event(), Ok(CmEvent::Other(IV_CEP_EVENT_APR)));
    for e in [&a, &b] {
        assert_eq!(e.qp.query().unwrap().attr.path_mig_state, IV_MIG_ARMED);
    }
    // The client disconnects; the server answers the DREQ.
    std::thread::scope(|s| {
        let t = s.spawn(|| active.disconnect());
        assert_eq!(conn.get_event(), Ok(CmEvent::DisconnectRequest));
        assert_eq!(conn.disconnect(), Ok(()));
        assert_eq!(t.join().unwrap(), Ok(()));
    });
    assert_eq!(a.qp.query().unwrap().attr.qp_state, IV_QPS_ERR);
    assert_eq!(b.qp.query().unwrap().attr.qp_state, IV_QPS_ERR);
    drop((conn, active, listener));
    drop((a, b));
    peer
}

fn connect_by_address_over_the_loopback_wire_ipv4_and_ipv6(backend: Backend) {
    for (sa, sb, wildcard) in [
        ("10.0.0.1", "10.0.0.2", "0.0.0.0"),
        ("fd00::1", "fd00::2", "::"),
    ] {
        let wire = LoopWire::start();
        let (da, db) = (
            device(backend, sa, &[], 1, None),
            device(backend, sb, &[], 2, None),
        );
        wire.attach(da.soft()).unwrap();
        wire.attach(db.soft()).unwrap();
        let (ca, cb) = (open(&da), open(&db));
        // Bound to the address, then to any.
        let peer = connect_move_data_disconnect(&cb, &ca, ip(sb), ip(sb), None);
        assert_eq!(peer.ip(), ip(sa));
        assert!(peer.port() >= 49152, "an ephemeral port: {peer}");
        let peer = connect_move_data_disconnect(&cb, &ca, ip(wildcard), ip(sb), None);
        assert_eq!(peer.ip(), ip(sa));
        drop((ca, cb));
        finish(&[&da, &db]);
        drop(wire);
    }
}

/// A client with two addresses connects from its second (an alias, GID
/// index 1): the REQ, the IP CM header and the connection's packets all
/// leave from the alias, which the server sees as the peer.
fn connect_from_an_alias_address_leaves_from_the_alias(backend: Backend) {
    for (sa, alias, sb) in [
        ("10.0.0.1", "10.0.0.11", "10.0.0.2"),
        ("fd00::1", "fd00::11", "fd00::2"),
    ] {
        let wire = LoopWire::start();
        let (da, db) = (
            device(backend, sa, &[alias], 1, None),
            device(backend, sb, &[], 2, None),
        );
        wire.attach(da.soft()).unwrap();
        wire.attach(db.soft()).unwrap();
        let (ca, cb) = (open(&da), open(&db));
        let peer = connect_move_data_disconnect(&cb, &ca, ip(sb), ip(sb), Some(ip(alias)));
        assert_eq!(peer.ip(), ip(alias));
        // The alias's index with another address as the local GID: not
        // this entry's address, refused before the QP moves.
        let e = End::with(&ca, 4096, 4, None);
        let (st, out) = ca.raw(
            IOCTL_IV_CREATE_CEP,
            IvCreateCepIn::default().as_bytes(),
            size_of::<IvCreateCepOut>(),
        );
        assert_eq!(st, STATUS_SUCCESS);
        let cep = IvCreateCepOut::read_from_bytes(&out).unwrap().cep;
        let wrong = IvCmConnectIn {
            cep,
            qp: e.qp.handle(),
            service_id: PortSpace::Tcp.service_id(7471),
            local_gid: ip_gid(ip(sa)),
            sgid_index: 1,
            remote_gid: ip_gid(ip(sb)),
            ..IvCmConnectIn::default()
        };
        assert_eq!(
            ca.raw(IOCTL_IV_CM_CONNECT, wrong.as_bytes(), 0).0,
            STATUS_INVALID_ADDRESS
        );
        assert_eq!(e.qp.query().unwrap().attr.qp_state, IV_QPS_RESET);
        drop(e);
        drop((ca, cb));
        finish(&[&da, &db]);
        drop(wire);
    }
}

fn connect_by_address_over_udp_on_127_0_0_1(backend: Backend) {
    let mut pair = None;
    for _ in 0..20 {
        let port = UdpSocket::bind("127.0.0.1:0")
            .and_then(|s| s.local_addr())
            .expect("a free port")
            .port();
        let (a, b) = (
            device(backend, "127.0.0.1", &[], 1, Some(port)),
            device(backend, "127.0.0.2", &[], 2, Some(port)),
        );
        if a.attach_udp(&UdpConfig::default()).is_ok()
            && b.attach_udp(&UdpConfig::default()).is_ok()
        {
            pair = Some((a, b));
            break;
        }
        a.unload();
        b.unload();
    }
    let Some((da, db)) = pair else {
        panic!("no UDP port free on both 127.0.0.1 and 127.0.0.2");
    };
    let (ca, cb) = (open(&da), open(&db));
    let peer = connect_move_data_disconnect(&cb, &ca, ip("127.0.0.2"), ip("127.0.0.2"), None);
    assert_eq!(peer.ip(), ip("127.0.0.1"));
    assert!(
        da.udp_stats().unwrap().sent > 0,
        "the MADs and data went over UDP"
    );
    drop((ca, cb));
    finish(&[&da, &db]);
}

/// A listener bound to one address refuses a connect to another of the
/// device's addresses (invalid service ID); listeners bound to different
/// addresses share a port, each taking the connects to its own; a listener
/// on any address shares the port with none; another port space is another
/// service ID.
fn listeners_bound_to_addresses_share_a_port_and_take_their_own_connects(backend: Backend) {
    let wire = LoopWire::start();
    let da = device(backend, "10.0.0.1", &[], 1, None);
    let db = device(backend, "10.0.0.2", &["10.0.0.3"], 2, None);
    wire.attach(da.soft()).unwrap();
    wire.attach(db.soft()).unwrap();
    let (ca, cb) = (open(&da), open(&db));
    let mut listener = CmId::new(&cb, PortSpace::Tcp).unwrap();
    // Not the device's address: refused at bind.
    assert_eq!(
        listener.bind_addr("10.0.0.9:80".parse().unwrap()),
        Err(STATUS_INVALID_ADDRESS)
    );
    listener.bind_addr("10.0.0.2:80".parse().unwrap()).unwrap();
    listener.listen().unwrap();
    // The port on any address, or on the same one: in use.
    for addr in ["0.0.0.0:80", "10.0.0.2:80"] {
        let mut again = CmId::new(&cb, PortSpace::Tcp).unwrap();
        again.bind_addr(addr.parse().unwrap()).unwrap();
        assert_eq!(again.listen(), Err(STATUS_ADDRESS_ALREADY_EXISTS), "{addr}");
    }
    // Another port space is another service ID.
    let mut udp_ps = CmId::new(&cb, PortSpace::Udp).unwrap();
    udp_ps.bind_addr("10.0.0.2:80".parse().unwrap()).unwrap();
    udp_ps.listen().unwrap();

    // A connect to the alias reaches the device, and is rejected by the
    // driver (invalid service ID): the listener is bound to the other
    // address, and never sees it.
    let p = ConnParam {
        cm_response_timeout: 14,
        max_cm_retries: 2,
        ..ConnParam::default()
    };
    let connect = |to: &str, end: &End<'_>, param: &ConnParam| {
        let mut active = CmId::new(&ca, PortSpace::Tcp).unwrap();
        active.resolve_addr(None, to.parse().unwrap()).unwrap();
        active.resolve_route().unwrap();
        let r = active.connect(end.qp.handle(), param);
        (active, r)
    };
    let a = End::with(&ca, 4096, 16, None);
    let (active, r) = connect("10.0.0.3:80", &a, &p);
    assert_eq!(r, Err(STATUS_CONNECTION_REFUSED));
    assert_eq!(
        active.get_event(),
        Ok(CmEvent::Rejected(8)),
        "invalid service ID"
    );

    // A second listener, on the alias, shares the port.
    let mut on_alias = CmId::new(&cb, PortSpace::Tcp).unwrap();
    on_alias.bind_addr("10.0.0.3:80".parse().unwrap()).unwrap();
    on_alias.listen().unwrap();
    // Each listener takes the connects to its own address, and nothing
    // else (the first request either sees is the one for it).
    for (to, l) in [
        ("10.0.0.3:80", &mut on_alias),
        ("10.0.0.2:80", &mut listener),
    ] {
        let b = End::with(&cb, 4096, 16, None);
        let a2 = End::with(&ca, 4096, 16, None);
        std::thread::scope(|s| {
            let t = s.spawn(|| connect(to, &a2, &ConnParam::default()).1);
            let mut conn = l.get_request().unwrap();
            assert_eq!(conn.remote_qpn(), a2.qp.qpn());
            assert_eq!(conn.local_addr(), Some(to.parse().unwrap()));
            conn.accept(b.qp.handle(), &ConnParam::default()).unwrap();
            assert_eq!(t.join().unwrap(), Ok(()));
        });
    }
    drop((active, listener, on_alias, udp_ps));
    drop(a);
    drop((ca, cb));
    finish(&[&da, &db]);
    drop(wire);
}

/// A REQ whose IP CM header is malformed is rejected by the listener's
/// `get_request` (REJ consumer reject), which goes on to the next one.
fn a_malformed_ip_cm_header_is_rejected_not_accepted(backend: Backend) {
    let wire = LoopWire::start();
    let (da, db) = (
        device(backend, "10.0.0.1", &[], 1, None),
        device(backend, "10.0.0.2", &[], 2, None),
    );
    wire.attach(da.soft()).unwrap();
    wire.attach(db.soft()).unwrap();
    let (ca, cb) = (open(&da), open(&db));
    let mut listener = CmId::new(&cb, PortSpace::Tcp).unwrap();
    listener
        .bind_addr("10.0.0.2:5000".parse().unwrap())
        .unwrap();
    listener.listen().unwrap();
    let (a2, b) = (
        End::with(&ca, 4096, 16, None),
        End::with(&cb, 4096, 16, None),
    );
    let raw_connect = |pd: &[u8]| {
        // A QP of its own for each attempt.
        let a = End::with(&ca, 4096, 16, None);
        let cep: IvCreateCepOut = {
            let (st, out) = ca.raw(
                IOCTL_IV_CREATE_CEP,
                zerocopy::IntoBytes::as_bytes(&IvCreateCepIn { user_context: 0 }),
                size_of::<IvCreateCepOut>(),
            );
            assert_eq!(st, STATUS_SUCCESS);
            zerocopy::FromBytes::read_from_bytes(&out[..]).unwrap()
        };
        let mut i = IvCmConnectIn {
            cep: cep.cep,
            qp: a.qp.handle(),
            service_id: PortSpace::Tcp.service_id(5000),
            local_gid: da.soft().gid(),
            remote_gid: db.soft().gid(),
            starting_psn: 1,
            private_data_len: pd.len() as u8,
            ..common::connect_defaults()
        };
        i.private_data[..pd.len()].copy_from_slice(pd);
        let st = ca
            .raw(IOCTL_IV_CM_CONNECT, zerocopy::IntoBytes::as_bytes(&i), 0)
            .0;
        let destroyed = ca.raw(
            IOCTL_IV_DESTROY_CEP,
            zerocopy::IntoBytes::as_bytes(&IvHandleIn { handle: cep.cep }),
            0,
        );
        assert_eq!(destroyed.0, STATUS_SUCCESS);
        st
    };
    let good = IpCmHeader {
        src: "10.0.0.1:40000".parse().unwrap(),
        dst: ip("10.0.0.2"),
    }
    .to_bytes();
    let mut wrong_version = good;
    wrong_version[1] = 0x50;
    let mut other_dst = good;
    other_dst[32..].copy_from_slice(&[10, 0, 0, 77]);
    std::thread::scope(|s| {
        let server = s.spawn(|| {
            let mut conn = listener.get_request().unwrap();
            conn.accept(b.qp.handle(), &ConnParam::default()).unwrap();
            conn
        });
        for bad in [&[][..], &good[..20], &wrong_version[..], &other_dst[..]] {
            assert_eq!(raw_connect(bad), STATUS_CONNECTION_REFUSED, "{bad:?}");
        }
        let mut active = CmId::new(&ca, PortSpace::Tcp).unwrap();
        active
            .resolve_addr(Some(ip("10.0.0.1")), "10.0.0.2:5000".parse().unwrap())
            .unwrap();
        active.resolve_route().unwrap();
        assert_eq!(
            active.connect(a2.qp.handle(), &ConnParam::default()),
            Ok(())
        );
        let conn = server.join().unwrap();
        assert_eq!(conn.remote_qpn(), a2.qp.qpn(), "the well-formed one");
        drop((conn, active));
    });
    drop(listener);
    drop((a2, b));
    drop((ca, cb));
    finish(&[&da, &db]);
    drop(wire);
}
