use std::collections::VecDeque;

use super::*;

/// A received datagram, owned.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Got {
    sgid: Gid,
    dgid: Gid,
    src_port: u16,
    traffic_class: u8,
    hop_limit: u8,
    payload: Vec<u8>,
}

/// Records what arrives; its clock hands out the deadlines of `deadlines`
/// (relative to the call) one per call, then none.
#[derive(Default)]
struct Recorder {
    got: Mutex<Vec<Got>>,
    clock_calls: AtomicU64,
    deadlines: Mutex<VecDeque<u64>>,
    cv: Condvar,
}

impl Endpoint for Recorder {
    fn receive(&self, d: &Datagram<'_>) {
        self.got
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Got {
                sgid: d.sgid,
                dgid: d.dgid,
                src_port: d.src_port,
                traffic_class: d.traffic_class,
                hop_limit: d.hop_limit,
                payload: d.payload.to_vec(),
            });
        self.cv.notify_all();
    }

    /// Counts the call once it has taken its deadline, so that a test that
    /// saw the count queues deadlines for the calls after it, not this one.
    fn advance_clock(&self, now_ns: u64) -> Option<u64> {
        let next = self
            .deadlines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop_front()
            .map(|d| now_ns + d);
        self.clock_calls.fetch_add(1, Ordering::SeqCst);
        self.cv.notify_all();
        next
    }
}

impl Recorder {
    /// Waits (up to a minute: the condition, not the time, is tested) until
    /// `n` datagrams arrived.
    fn wait_for(&self, n: usize) -> Vec<Got> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut g = self.got.lock().unwrap_or_else(PoisonError::into_inner);
        while g.len() < n && Instant::now() < deadline {
            g = self
                .cv
                .wait_timeout(g, Duration::from_millis(50))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        g.clone()
    }

    fn wait_clock_calls(&self, n: u64) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut g = self.got.lock().unwrap_or_else(PoisonError::into_inner);
        while self.clock_calls.load(Ordering::SeqCst) < n && Instant::now() < deadline {
            g = self
                .cv
                .wait_timeout(g, Duration::from_millis(50))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        drop(g);
        self.clock_calls.load(Ordering::SeqCst)
    }
}

fn v4(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

/// Two wires on 127.0.0.1 and 127.0.0.2 with one port (a free one).
fn pair() -> ((UdpWire, Arc<Recorder>), (UdpWire, Arc<Recorder>)) {
    for _ in 0..20 {
        let ra = Arc::new(Recorder::default());
        let config = UdpConfig::default();
        let a =
            UdpWire::start(ra.clone(), SocketAddr::new(v4(1), 0), &config).expect("bind 127.0.0.1");
        let rb = Arc::new(Recorder::default());
        let at = SocketAddr::new(v4(2), a.local_addr().port());
        if let Ok(b) = UdpWire::start(rb.clone(), at, &config) {
            return ((a, ra), (b, rb));
        }
    }
    panic!("no port free on both 127.0.0.1 and 127.0.0.2");
}

/// A datagram to `to`'s port `port`.
fn datagram(from: IpAddr, to: SocketAddr, src_port: u16, payload: &[u8]) -> Datagram<'_> {
    Datagram {
        sgid: ip_gid(from),
        dgid: ip_gid(to.ip()),
        src_port,
        dst_port: to.port(),
        traffic_class: 0x28,
        flow_label: 0,
        hop_limit: 17,
        payload,
    }
}

#[test]
fn gids_and_addresses_map_both_ways() {
    let ip = v4(9);
    let gid = ip_gid(ip);
    assert_eq!(&gid[..12], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF]);
    assert_eq!(gid_ip(&gid), ip);
    let v6: IpAddr = "fd77::2".parse().unwrap();
    assert_eq!(gid_ip(&ip_gid(v6)), v6);
    assert_eq!(
        gid_ip(&ip_gid(IpAddr::V6(Ipv6Addr::LOCALHOST))).to_string(),
        "::1"
    );
}

#[test]
fn the_ib_mtu_fits_the_ip_mtu() {
    use irpverbs_abi::{IV_MTU_256, IV_MTU_1024, IV_MTU_2048, IV_MTU_4096};
    assert_eq!(ib_mtu_for(1500, false), Some(IV_MTU_1024));
    assert_eq!(ib_mtu_for(1500, true), Some(IV_MTU_1024));
    assert_eq!(ib_mtu_for(9000, false), Some(IV_MTU_4096));
    assert_eq!(ib_mtu_for(65536, true), Some(IV_MTU_4096));
    assert_eq!(
        ib_mtu_for(4096 + roce_overhead(false) - 1, false),
        Some(IV_MTU_2048)
    );
    assert_eq!(
        ib_mtu_for(256 + roce_overhead(true), true),
        Some(IV_MTU_256)
    );
    assert_eq!(ib_mtu_for(300, false), None);
    let lo = path_mtu(v4(1), v4(2)).expect("route over lo");
    assert!(lo >= 1280, "{lo}");
}

/// A thread busy-polls the receiving wire while its receive thread runs:
/// one reader at a time, so the datagrams of one source port arrive in the
/// order sent, each once.
#[test]
fn busy_poll_receive_delivers_in_order_beside_the_receive_thread() {
    let ((a, _ra), (b, rb)) = pair();
    let (ia, ib) = (v4(1), b.local_addr());
    let n = 3000u16;
    let stop = AtomicBool::new(false);
    let polled = std::thread::scope(|scope| {
        let poller = scope.spawn(|| {
            let mut polled = 0;
            while !stop.load(Ordering::Relaxed) {
                polled += b.poll_rx();
            }
            polled
        });
        for chunk in (0..n).collect::<Vec<_>>().chunks(50) {
            let payloads: Vec<[u8; 2]> = chunk.iter().map(|i| i.to_be_bytes()).collect();
            a.link()
                .send(payloads.iter().map(|p| datagram(ia, ib, 0, p)));
            std::thread::yield_now();
        }
        rb.wait_for(usize::from(n));
        stop.store(true, Ordering::Relaxed);
        poller.join().expect("poller")
    });
    let got = rb.wait_for(usize::from(n));
    let seq: Vec<u16> = got
        .iter()
        .map(|g| u16::from_be_bytes([g.payload[0], g.payload[1]]))
        .collect();
    assert_eq!(seq, (0..n).collect::<Vec<_>>(), "{:?}", b.stats());
    assert!(polled <= usize::from(n));
    // Nothing is queued: a poll delivers nothing.
    assert_eq!(b.poll_rx(), 0);
    a.stop();
    // The receive thread counts a batch after delivering it: the counts
    // are final once it stopped.
    let s = b.stop();
    assert_eq!(s.received, u64::from(n));
}

#[test]
fn datagrams_cross_with_addresses_ports_and_header_fields() {
    let ((a, _ra), (b, rb)) = pair();
    let port = a.local_addr().port();
    let (ia, ib) = (v4(1), b.local_addr());
    let payloads: Vec<Vec<u8>> = (0..100u8).map(|i| vec![i; 20 + usize::from(i)]).collect();
    // Runs of three source ports: the listening one, 0 (= listening) and
    // one of its own (a socket bound on first use).
    let own = if port == u16::MAX { port - 1 } else { port + 1 };
    let src = |i: usize| match i / 40 {
        0 => port,
        1 => 0,
        _ => own,
    };
    a.link().send(
        payloads
            .iter()
            .enumerate()
            .map(|(i, p)| datagram(ia, ib, src(i), p)),
    );
    let got = rb.wait_for(payloads.len());
    assert_eq!(got.len(), payloads.len(), "{:?}", a.stats());
    for (i, g) in got.iter().enumerate() {
        // One socket per source port keeps each run in order; runs from
        // different sockets may interleave.
        let k = usize::from(g.payload[0]);
        assert_eq!(g.payload, payloads[k], "datagram {i}");
        assert_eq!(g.sgid, ip_gid(ia));
        assert_eq!(g.dgid, ip_gid(ib.ip()));
        let want = if src(k) == own { own } else { port };
        assert_eq!(g.src_port, want, "datagram {k}");
        if cfg!(target_os = "linux") {
            assert_eq!((g.traffic_class, g.hop_limit), (0x28, 17));
        }
    }
    let s = a.stats();
    assert_eq!(s.sent, 100);
    assert_eq!(s.send_dropped + s.send_failed + s.port_fallbacks, 0);
    if cfg!(target_os = "linux") {
        // 32 per system call: runs of 40, 40 and 20.
        assert_eq!(s.send_calls, 5, "{s:?}");
    }
    a.stop();
    // The receive thread counts a batch after delivering it: the counts
    // are final once it stopped.
    let bs = b.stop();
    assert_eq!(bs.received, 100);
    assert!(bs.recv_batches <= 100);
}

#[test]
fn wrong_family_and_oversized_datagrams_are_counted() {
    let ((a, _ra), (b, rb)) = pair();
    let v6: SocketAddr = "[fd77::2]:4791".parse().unwrap();
    a.link().send([datagram(v4(1), v6, 0, b"x")].into_iter());
    assert_eq!(a.stats().send_failed, 1);
    let big = vec![7u8; sys::RECV_MAX + 1];
    let small = [1u8; 8];
    a.link().send(
        [
            datagram(v4(1), b.local_addr(), 0, &big),
            datagram(v4(1), b.local_addr(), 0, &small),
        ]
        .into_iter(),
    );
    let got = rb.wait_for(1);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].payload, small);
    let s = b.stop();
    assert_eq!((s.received, s.truncated), (1, 1), "{s:?}");
    a.stop();
}

#[test]
fn ipv6_datagrams_reach_the_link_itself() {
    let r = Arc::new(Recorder::default());
    let lo = IpAddr::V6(Ipv6Addr::LOCALHOST);
    let w = match UdpWire::start(r.clone(), SocketAddr::new(lo, 0), &UdpConfig::default()) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("skipped: no IPv6 loopback here ({e})");
            return;
        }
    };
    w.link()
        .send([datagram(lo, w.local_addr(), 0, b"over IPv6")].into_iter());
    let got = r.wait_for(1);
    assert_eq!(got.len(), 1, "{:?}", w.stats());
    assert_eq!(got[0].sgid, ip_gid(lo));
    assert_eq!(got[0].dgid, ip_gid(lo));
    assert_eq!(got[0].src_port, w.local_addr().port());
    assert_eq!(got[0].payload, b"over IPv6");
    if cfg!(target_os = "linux") {
        assert_eq!((got[0].traffic_class, got[0].hop_limit), (0x28, 17));
    }
    w.stop();
}

#[test]
fn the_timer_thread_follows_deadlines_and_wakes_on_traffic() {
    let ((a, ra), (b, _rb)) = pair();
    // The first call (at start) returned no deadline: idle.
    assert!(ra.wait_clock_calls(1) >= 1);
    // Three deadlines 1 ms apart, then none: four more calls.
    ra.deadlines
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .extend([1_000_000, 1_000_000, 1_000_000]);
    // A transmit wakes the idle timer thread (an empty batch will do).
    a.link().transmit(&TxBatch::default());
    let calls = ra.wait_clock_calls(5);
    assert!(calls >= 5, "{calls}");
    // Idle again; a received batch wakes it too.
    let before = ra.clock_calls.load(Ordering::SeqCst);
    b.link()
        .send([datagram(v4(2), a.local_addr(), 0, b"to a")].into_iter());
    assert!(ra.wait_clock_calls(before + 1) > before);
    // Stopped (threads joined), the wire counted every call the endpoint saw.
    let stats = a.stop();
    assert_eq!(stats.clock_calls, ra.clock_calls.load(Ordering::SeqCst));
    b.stop();
}

#[test]
fn a_taken_address_is_refused_and_dropping_a_wire_joins_its_threads() {
    let ((a, ra), (b, _rb)) = pair();
    let again = UdpWire::start(
        Arc::new(Recorder::default()),
        a.local_addr(),
        &UdpConfig::default(),
    );
    assert!(again.is_err());
    drop(a);
    drop(b);
    // The threads held the endpoint: joined, they released it.
    assert_eq!(Arc::strong_count(&ra), 1);
}

/// A datagram sent from the listening socket because its source port could
/// not be bound is sealed again: same bytes but the ICRC, which is the one
/// of the new source port (the receiver checks it over the UDP header), and
/// it differs from the old one; one too short for an ICRC is refused.
#[test]
fn a_resealed_datagram_carries_the_icrc_of_its_new_source_port() {
    let to = SocketAddr::new(v4(2), 4791);
    // A BTH (SEND ONLY) and 8 bytes of payload, then the ICRC.
    let mut bytes = vec![0x04, 0, 0xFF, 0xFF, 0, 0, 0, 2, 0x80, 0, 0, 1];
    bytes.extend_from_slice(b"8 bytes!");
    let body_len = bytes.len();
    let old = datagram(v4(1), to, 0xC123, &[]);
    let crc = irpverbs_soft::wire::icrc(&old.ip(), &bytes).unwrap();
    bytes.extend_from_slice(&crc.to_le_bytes());
    let d = Datagram {
        payload: &bytes,
        ..old
    };
    let mut buf = Vec::with_capacity(64);
    let resealed = reseal(&d, 4791, &mut buf).expect("resealed");
    assert_eq!(resealed.src_port, 4791);
    assert_eq!(
        (resealed.sgid, resealed.dgid, resealed.dst_port),
        (d.sgid, d.dgid, d.dst_port)
    );
    assert_eq!(
        &resealed.payload[..body_len],
        &bytes[..body_len],
        "the body is kept"
    );
    let new_crc = irpverbs_soft::wire::icrc(&resealed.ip(), &bytes[..body_len]).unwrap();
    assert_eq!(resealed.payload[body_len..], new_crc.to_le_bytes());
    assert_ne!(new_crc, crc, "the source port is under the ICRC");
    let short = Datagram {
        payload: &bytes[..3],
        ..old
    };
    assert!(reseal(&short, 4791, &mut buf).is_none());
    // Longer than the buffer's room: refused, not grown.
    let mut small = Vec::with_capacity(8);
    assert!(reseal(&d, 4791, &mut small).is_none());
    assert_eq!(small.capacity(), 8);
}

/// A run whose source port another socket holds leaves from the listening
/// socket, each datagram resealed in the link's buffer: every datagram
/// arrives, from the listening port, with a valid ICRC, and the path
/// allocates nothing per datagram (the sends run as driver code, whose
/// every heap allocation on this thread the platform counts).
#[test]
fn the_port_fallback_reseals_in_place_and_allocates_nothing() {
    let ((a, _ra), (b, rb)) = pair();
    let port = a.local_addr().port();
    // The source port, held by a socket of someone else.
    let taken = UdpSocket::bind(SocketAddr::new(v4(1), 0)).expect("a port on 127.0.0.1");
    let src = taken.local_addr().unwrap().port();
    assert_ne!(src, port);
    let to = b.local_addr();
    let ip = |d: &Datagram<'_>| d.ip();
    // SEND ONLY packets of 16 bytes of payload each, sealed for `src`.
    let packets: Vec<Vec<u8>> = (0..200u8)
        .map(|i| {
            let mut p = vec![0x04, 0, 0xFF, 0xFF, 0, 0, 0, 2, 0x80, 0, 0, i];
            p.extend_from_slice(&[i; 16]);
            let crc = irpverbs_soft::wire::icrc(&ip(&datagram(v4(1), to, src, &[])), &p).unwrap();
            p.extend_from_slice(&crc.to_le_bytes());
            p
        })
        .collect();
    let platform = crate::platform::HostPlatform::default();
    let send = |range: std::ops::Range<usize>| {
        let before = platform.pool_stats().heap_charges;
        platform.driver_code(|| {
            a.link()
                .send(packets[range].iter().map(|p| datagram(v4(1), to, src, p)));
        });
        platform.pool_stats().heap_charges - before
    };
    // The first send may grow what any send grows once; then none.
    send(0..10);
    assert_eq!(send(10..200), 0, "allocations for 190 resealed datagrams");
    let got = rb.wait_for(packets.len());
    assert_eq!(got.len(), packets.len(), "{:?}", a.stats());
    for g in &got {
        assert_eq!(g.src_port, port, "sent from the listening socket");
        let body = g.payload.len() - 4;
        let from = Datagram {
            src_port: g.src_port,
            ..datagram(v4(1), to, g.src_port, &[])
        };
        let crc = irpverbs_soft::wire::icrc(&from.ip(), &g.payload[..body]).unwrap();
        assert_eq!(
            g.payload[body..],
            crc.to_le_bytes(),
            "resealed for its port"
        );
    }
    let s = a.stats();
    assert_eq!((s.sent, s.port_fallbacks, s.send_failed), (200, 200, 0));
    a.stop();
    b.stop();
}
