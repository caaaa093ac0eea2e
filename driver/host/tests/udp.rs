//! Two host devices in one process over real UDP sockets (127.0.0.1 and
//! 127.0.0.2, one free port): RC SEND, RDMA WRITE, RDMA READ and both
//! atomics through the verbs speed path, the data checked, with the
//! firmware inline and on its thread, the verifier on; a peer that goes
//! away makes the requester's timer exhaust its retries; a thread
//! busy-polling the wires beside their receive threads; unload stops the
//! wire and passes the verifier's checks.

use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use irpverbs_abi::*;
use irpverbs_host::udp::UdpConfig;
use irpverbs_host::{Backend, Engine, HostDevice, HostDeviceConfig};
use irpverbs_soft::SoftConfig;
use irpverbs_verbs::{Client, IntoClient, SendWr, rts_steps};

mod common;
use common::End;

crate::on_each_backend!(
    every_rc_opcode_between_two_devices_firmware_inline,
    every_rc_opcode_between_two_devices_busy_polled_beside_the_receive_threads,
    a_silent_peer_exhausts_the_retries,
    a_device_has_one_wire_and_its_address_must_be_free,
);

fn ip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

fn device(backend: Backend, engine: Engine, last: u8, port: u16) -> Arc<HostDevice> {
    HostDevice::new(HostDeviceConfig {
        backend,
        engine,
        soft: SoftConfig {
            ip: ip(last),
            udp_port: port,
            node_guid: 0x0200_00FF_FE00_0000 | u64::from(last),
            ..SoftConfig::default()
        },
        ..HostDeviceConfig::default()
    })
    .expect("host device")
}

/// Two devices on 127.0.0.1 and 127.0.0.2, each on a UDP wire of one port
/// free on both addresses.
fn pair(backend: Backend, engine: Engine) -> (Arc<HostDevice>, Arc<HostDevice>) {
    for _ in 0..20 {
        let port = UdpSocket::bind((ip(1), 0))
            .and_then(|s| s.local_addr())
            .expect("a free port")
            .port();
        let (a, b) = (
            device(backend, engine, 1, port),
            device(backend, engine, 2, port),
        );
        if a.attach_udp(&UdpConfig::default()).is_ok()
            && b.attach_udp(&UdpConfig::default()).is_ok()
        {
            return (a, b);
        }
        a.unload();
        b.unload();
    }
    panic!("no UDP port free on both 127.0.0.1 and 127.0.0.2");
}

fn client(dev: &Arc<HostDevice>) -> Client {
    dev.open(FILE_READ_ACCESS | FILE_WRITE_ACCESS)
        .expect("open")
        .into_client()
}

fn finish(dev: &HostDevice) {
    dev.quiesce(Duration::from_secs(10)).expect("quiescent");
    assert_eq!(dev.platform().pool_stats().live, 0, "pool leaked");
    dev.unload();
    assert!(dev.udp_stats().is_none(), "unload stops the wire");
}

const MEM: usize = 1 << 20;

impl<'c> End<'c> {
    /// One side: a PD, memory, a CQ and an RC QP.
    fn new(c: &'c Client) -> Self {
        Self::with(c, MEM, 256, Some(64))
    }

    /// To RTS against `peer` on `gid`, with the local ACK timeout and
    /// retry count given.
    fn connect(&self, peer_qpn: u32, gid: [u8; 16], timeout: u8, retry_cnt: u8) {
        for (mask, mut attr) in rts_steps(IV_QPT_RC, peer_qpn, gid) {
            if attr.qp_state == IV_QPS_INIT {
                attr.qp_access_flags =
                    IV_ACCESS_REMOTE_WRITE | IV_ACCESS_REMOTE_READ | IV_ACCESS_REMOTE_ATOMIC;
            }
            if attr.qp_state == IV_QPS_RTS {
                attr.timeout = timeout;
                attr.retry_cnt = retry_cnt;
            }
            self.qp.modify(mask, &attr).unwrap();
        }
    }

    /// Waits for `n` completions (a minute at most: the condition is what
    /// is tested, not the time).
    fn wait(&self, n: usize) -> Vec<IvCqe> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut got = Vec::new();
        let mut buf = [IvCqe::default(); 16];
        while got.len() < n && Instant::now() < deadline {
            let k = self.cq.poll(&mut buf).unwrap();
            got.extend_from_slice(&buf[..k]);
            if k == 0 {
                std::thread::yield_now();
            }
        }
        assert_eq!(got.len(), n, "completions");
        got
    }

    fn teardown(self) {
        let End { c, mr, cq, qp, .. } = self;
        drop(qp);
        drop(cq);
        c.dereg_mr(mr.mr).unwrap();
    }
}

fn ok(cqes: &[IvCqe]) {
    for c in cqes {
        assert_eq!(c.status, IV_WC_SUCCESS, "{c:?}");
    }
}

/// Every opcode between two devices; with `busy_poll`, a thread also
/// busy-polls both wires ([`HostDevice::poll_wire`]) throughout, beside
/// their receive threads.
fn every_opcode(backend: Backend, engine: Engine, busy_poll: bool) {
    let (da, db) = pair(backend, engine);
    let stop = Arc::new(AtomicBool::new(false));
    let poller = busy_poll.then(|| {
        let (da, db, stop) = (Arc::clone(&da), Arc::clone(&db), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut polled = 0;
            while !stop.load(Ordering::Relaxed) {
                polled += da.poll_wire() + db.poll_wire();
            }
            polled
        })
    });
    let (ca, cb) = (client(&da), client(&db));
    let (a, b) = (End::new(&ca), End::new(&cb));
    a.connect(b.qp.qpn(), db.soft().gid(), 14, 7);
    b.connect(a.qp.qpn(), da.soft().gid(), 14, 7);

    // SEND of 200 KiB (many MTU-sized datagrams), both ways.
    let msg: Vec<u8> = (0..200 * 1024).map(|i| (i * 7 % 251) as u8).collect();
    a.mem.fill(0, &msg);
    b.mem.fill(0, &msg);
    b.qp.post_recv(1, &[b.sge(512 * 1024, msg.len())]).unwrap();
    a.qp.post_recv(1, &[a.sge(512 * 1024, msg.len())]).unwrap();
    let send = |from: &End<'_>| {
        let sge = [from.sge(0, msg.len())];
        from.qp
            .post_send(&SendWr {
                wr_id: 10,
                opcode: IV_WR_SEND,
                flags: IV_SEND_SIGNALED,
                sges: &sge,
                ..SendWr::default()
            })
            .unwrap();
    };
    send(&a);
    send(&b);
    for e in [&a, &b] {
        let c = e.wait(2);
        ok(&c);
        let recv = c.iter().find(|c| c.opcode == IV_WC_OP_RECV).expect("recv");
        assert_eq!(recv.byte_len as usize, msg.len());
        assert_eq!(e.mem.read(512 * 1024, msg.len()), msg);
    }

    // RDMA WRITE of 64 KiB into b, then READ it back into a.
    a.mem.fill(0, &[0x5A; 65536]);
    let sge = [a.sge(0, 65536)];
    a.qp.post_send(&SendWr {
        wr_id: 20,
        opcode: IV_WR_RDMA_WRITE,
        flags: IV_SEND_SIGNALED,
        sges: &sge,
        remote_addr: b.mem.addr() + 128 * 1024,
        rkey: b.mr.rkey,
        ..SendWr::default()
    })
    .unwrap();
    ok(&a.wait(1));
    assert_eq!(b.mem.read(128 * 1024, 65536), vec![0x5A; 65536]);
    b.mem.fill(300 * 1024, &msg[..40_000]);
    let sge = [a.sge(700 * 1024, 40_000)];
    a.qp.post_send(&SendWr {
        wr_id: 21,
        opcode: IV_WR_RDMA_READ,
        flags: IV_SEND_SIGNALED,
        sges: &sge,
        remote_addr: b.mem.addr() + 300 * 1024,
        rkey: b.mr.rkey,
        ..SendWr::default()
    })
    .unwrap();
    ok(&a.wait(1));
    assert_eq!(a.mem.read(700 * 1024, 40_000), msg[..40_000]);

    // Fetch-and-add, then compare-and-swap, on a word of b.
    let word = 900 * 1024;
    b.mem.fill(word, &40u64.to_le_bytes());
    let sge = [a.sge(800 * 1024, 8)];
    let atomic = |opcode, compare_add, swap| {
        a.qp.post_send(&SendWr {
            wr_id: 30,
            opcode,
            flags: IV_SEND_SIGNALED,
            sges: &sge,
            remote_addr: b.mem.addr() + word as u64,
            rkey: b.mr.rkey,
            compare_add,
            swap,
            ..SendWr::default()
        })
        .unwrap();
        ok(&a.wait(1));
        u64::from_le_bytes(a.mem.read(800 * 1024, 8).try_into().unwrap())
    };
    assert_eq!(atomic(IV_WR_ATOMIC_FETCH_AND_ADD, 2, 0), 40);
    assert_eq!(atomic(IV_WR_ATOMIC_CMP_AND_SWP, 42, 7), 42);
    assert_eq!(b.mem.read(word, 8), 7u64.to_le_bytes());

    // Both wires carried it all, and the HCAs took every datagram.
    for d in [&da, &db] {
        let s = d.udp_stats().expect("wire");
        assert!(s.sent > 50 && s.received > 50, "{s:?}");
        assert_eq!(s.send_failed + s.truncated + s.recv_errors, 0, "{s:?}");
        let l = d.soft().link_stats();
        assert!(l.rx_datagrams > 50, "{l:?}");
    }
    if let Some(p) = poller {
        stop.store(true, Ordering::Relaxed);
        let polled = p.join().expect("poller");
        let received: u64 = [&da, &db]
            .iter()
            .map(|d| d.udp_stats().expect("wire").received)
            .sum();
        assert!(polled as u64 <= received);
    }
    a.teardown();
    b.teardown();
    drop(ca);
    drop(cb);
    finish(&da);
    finish(&db);
}

fn every_rc_opcode_between_two_devices_firmware_inline(backend: Backend) {
    every_opcode(backend, Engine::Inline, false);
}

/// Soft HCA only: the model HCA has no firmware thread.
#[test]
fn every_rc_opcode_between_two_devices_firmware_on_its_thread() {
    every_opcode(Backend::Soft, Engine::Thread, false);
}

fn every_rc_opcode_between_two_devices_busy_polled_beside_the_receive_threads(backend: Backend) {
    every_opcode(backend, Engine::Inline, true);
    every_opcode(backend, Engine::Thread, true);
}

/// The peer's wire is taken away: nothing answers, the requester's ACK
/// timer (the wire's timer thread) fires until the retries are exhausted,
/// and the WQE completes with `RETRY_EXC_ERR`.
fn a_silent_peer_exhausts_the_retries(backend: Backend) {
    let (da, db) = pair(backend, Engine::Inline);
    let (ca, cb) = (client(&da), client(&db));
    let (a, b) = (End::new(&ca), End::new(&cb));
    // 4.096 us * 2^8 = 1 ms per try, two retries.
    a.connect(b.qp.qpn(), db.soft().gid(), 8, 2);
    b.connect(a.qp.qpn(), da.soft().gid(), 8, 2);
    let stats = db.detach_udp().expect("b had a wire");
    assert_eq!(stats.received, 0);
    let sge = [a.sge(0, 8)];
    a.qp.post_send(&SendWr {
        wr_id: 40,
        opcode: IV_WR_RDMA_WRITE,
        flags: IV_SEND_SIGNALED,
        sges: &sge,
        remote_addr: b.mem.addr(),
        rkey: b.mr.rkey,
        ..SendWr::default()
    })
    .unwrap();
    let c = a.wait(1);
    assert_eq!(c[0].status, IV_WC_RETRY_EXC_ERR, "{c:?}");
    assert!(da.soft().link_stats().ack_timeouts >= 3);
    // Every try left on the wire. Which clock fired each timeout is not
    // this test's business: the device's transport timer and the wire's
    // timer thread both advance the HCA's clock, whichever comes first (the
    // wire's clock alone is tested in the UDP module). The counts are read
    // once the wire has stopped: its threads count after they act.
    let s = da.detach_udp().expect("a had a wire");
    assert!(s.sent >= 3, "{s:?}");
    a.teardown();
    b.teardown();
    drop(ca);
    drop(cb);
    finish(&da);
    finish(&db);
}

fn a_device_has_one_wire_and_its_address_must_be_free(backend: Backend) {
    let (da, db) = pair(backend, Engine::Inline);
    let again = da.attach_udp(&UdpConfig::default()).unwrap_err();
    assert_eq!(again.kind(), std::io::ErrorKind::AddrInUse);
    // A third device on b's address cannot bind it.
    let taken = db.udp_addr().expect("b's wire");
    assert_eq!(taken.ip(), ip(2));
    let dc = HostDevice::new(HostDeviceConfig {
        soft: SoftConfig {
            ip: ip(2),
            udp_port: taken.port(),
            ..SoftConfig::default()
        },
        ..HostDeviceConfig::default()
    })
    .unwrap();
    assert!(dc.attach_udp(&UdpConfig::default()).is_err());
    assert!(dc.udp_stats().is_none());
    dc.unload();
    // Nothing queued: a busy poll delivers nothing; without a wire, 0.
    assert_eq!(da.poll_wire(), 0);
    assert!(da.detach_udp().is_some());
    assert!(da.detach_udp().is_none());
    assert_eq!(da.poll_wire(), 0);
    finish(&da);
    finish(&db);
}
