//! The socket wire's logic: registry configuration, send batching and
//! buffer reuse, the receive hand-off, timer arming, and an RC exchange
//! between two soft HCAs through it (the calls the WSK glue makes).

use alloc::sync::Arc;
use alloc::vec::Vec;
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use core::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use irpverbs_abi::*;
use irpverbs_ring::wq::SendWr;

use super::*;
use crate::net::link::TxBatch;
use crate::tests::dp::{ALL_ACCESS, Conn, Node, signaled};
use crate::tests::util::TestPlatform;
use crate::wire::packet::{Packet, op};

fn reg<'a>(values: &'a [(&'a str, RegValue<'a>)]) -> impl Fn(&str) -> Option<RegValue<'a>> {
    move |name| values.iter().find(|(n, _)| *n == name).map(|&(_, v)| v)
}

#[test]
fn registry_values_configure_the_wire() {
    use RegValue::{Dword, Sz};
    assert_eq!(WireConfig::from_registry(reg(&[])), Ok(None), "absent: off");
    assert_eq!(
        WireConfig::from_registry(reg(&[(REG_ENABLE, Dword(0)), (REG_ADDRESS, Sz("x"))])),
        Ok(None),
        "disabled: the rest is not read"
    );
    let v4 = WireConfig::from_registry(reg(&[
        (REG_ENABLE, Dword(1)),
        (REG_ADDRESS, Sz(" 192.168.1.20 ")),
    ]))
    .unwrap()
    .unwrap();
    assert_eq!(v4.addr, "192.168.1.20:4791".parse().unwrap());
    let v6 = WireConfig::from_registry(reg(&[
        (REG_ENABLE, Dword(1)),
        (REG_ADDRESS, Sz("fd00::7")),
        (REG_PORT, Dword(5000)),
    ]))
    .unwrap()
    .unwrap();
    assert_eq!(v6.addr, "[fd00::7]:5000".parse().unwrap());
    let mut soft = SoftConfig::default();
    v6.apply(&mut soft);
    assert_eq!((soft.ip, soft.udp_port), (v6.addr.ip(), 5000));
    assert_eq!(soft.validate(), Ok(()));
    let bad: [&[(&str, RegValue<'_>)]; 9] = [
        &[(REG_ENABLE, Dword(2)), (REG_ADDRESS, Sz("10.0.0.1"))],
        &[(REG_ENABLE, Sz("1")), (REG_ADDRESS, Sz("10.0.0.1"))],
        &[(REG_ENABLE, Dword(1))],
        &[(REG_ENABLE, Dword(1)), (REG_ADDRESS, Dword(0x0A00_0001))],
        &[(REG_ENABLE, Dword(1)), (REG_ADDRESS, Sz("10.0.0"))],
        &[(REG_ENABLE, Dword(1)), (REG_ADDRESS, Sz("0.0.0.0"))],
        &[(REG_ENABLE, Dword(1)), (REG_ADDRESS, Sz("ff02::1"))],
        &[
            (REG_ENABLE, Dword(1)),
            (REG_ADDRESS, Sz("10.0.0.1")),
            (REG_PORT, Dword(0)),
        ],
        &[
            (REG_ENABLE, Dword(1)),
            (REG_ADDRESS, Sz("10.0.0.1")),
            (REG_PORT, Dword(65536)),
        ],
    ];
    for (i, values) in bad.iter().enumerate() {
        assert_eq!(
            WireConfig::from_registry(reg(values)),
            Err(STATUS_INVALID_PARAMETER),
            "case {i}"
        );
    }
}

/// A platform socket that records what it is given; the test completes
/// the sends and moves the datagrams.
#[derive(Default)]
struct TestSocket {
    calls: Mutex<Vec<Vec<Outgoing>>>,
    armed: Mutex<Vec<u64>>,
    now: AtomicU64,
}

impl DatagramSocket for TestSocket {
    fn send(&self, batch: &[Outgoing]) {
        self.calls.lock().unwrap().push(batch.to_vec());
    }
    fn now_ns(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
    fn arm_timer(&self, due_ns: u64) {
        self.armed.lock().unwrap().push(due_ns);
    }
}

type TestLink = SocketLink<TestPlatform, TestSocket>;

fn link(addr: &str, slots: usize) -> Arc<TestLink> {
    Arc::new(
        SocketLink::new(
            &TestPlatform,
            addr.parse().unwrap(),
            TestSocket::default(),
            slots,
        )
        .unwrap(),
    )
}

fn gid4(last: u8) -> [u8; 16] {
    Ipv4Addr::new(10, 0, 0, last).to_ipv6_mapped().octets()
}

/// `n` RC SEND ONLY datagrams from 10.0.0.1 to 10.0.0.`to`, 8 bytes each,
/// sealed for their entropy source ports.
fn batch(n: u32, to: [u8; 16]) -> TxBatch {
    let mut tx = TxBatch::default();
    for i in 0..n {
        let pkt = Packet {
            opcode: op::RC_SEND_ONLY,
            dest_qpn: 0x20 + i,
            psn: i,
            sgid: gid4(1),
            dgid: to,
            hop_limit: 64,
            payload_len: 8,
            ..Packet::default()
        };
        assert!(tx.push(&pkt, &[i as u8; 8], 4791));
    }
    tx
}

/// The bytes of a sent buffer.
fn bytes(l: &TestLink, o: &Outgoing) -> Vec<u8> {
    let mut b = alloc::vec![0; o.len as usize];
    l.buffer(o.slot).unwrap().read(0, &mut b).unwrap();
    b
}

#[test]
fn sends_leave_in_batches_sealed_for_the_socket_s_port() {
    let l = link("10.0.0.1:4791", 40);
    l.transmit(&batch(37, gid4(2)));
    let calls = core::mem::take(&mut *l.socket().calls.lock().unwrap());
    assert_eq!(calls.iter().map(Vec::len).collect::<Vec<_>>(), [16, 16, 5]);
    let all: Vec<Outgoing> = calls.into_iter().flatten().collect();
    let mut slots: Vec<u16> = all.iter().map(|o| o.slot).collect();
    slots.sort_unstable();
    slots.dedup();
    assert_eq!(slots.len(), 37, "a buffer each");
    for (i, o) in all.iter().enumerate() {
        assert_eq!(o.to, "10.0.0.2:4791".parse().unwrap());
        let d = Datagram {
            sgid: gid4(1),
            dgid: gid4(2),
            src_port: 4791,
            dst_port: 4791,
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 64,
            payload: &bytes(&l, o),
        };
        let (p, payload) = wire::parse_transport(d.payload, &d.ip()).expect("ICRC for port 4791");
        assert_eq!((p.psn, payload), (i as u32, &[i as u8; 8][..]), "in order");
        let entropy = Datagram {
            src_port: crate::net::link::entropy_port(p.dest_qpn),
            ..d
        };
        assert!(
            wire::parse_transport(entropy.payload, &entropy.ip()).is_err(),
            "sealed again: the entropy port's ICRC no longer holds"
        );
    }
    assert_eq!(l.free_buffers(), 3);
    let s = l.stats();
    assert_eq!((s.sent, s.send_calls, s.no_buffer), (37, 3, 0));
    // Out of buffers: what does not fit is dropped (RC retransmits it).
    l.transmit(&batch(5, gid4(2)));
    let calls = core::mem::take(&mut *l.socket().calls.lock().unwrap());
    assert_eq!(calls.iter().map(Vec::len).collect::<Vec<_>>(), [3]);
    assert_eq!(l.stats().no_buffer, 2);
    assert_eq!(l.free_buffers(), 0);
    // Completions give the buffers back (a failed send too; a slot that is
    // not out, or does not exist, changes nothing).
    for o in &all {
        l.send_done(o.slot, o.slot != 0);
    }
    l.send_done(all[0].slot, true);
    l.send_done(999, true);
    assert_eq!(l.free_buffers(), 37);
    assert_eq!(l.stats().send_failed, 1);
    l.transmit(&batch(2, gid4(2)));
    assert_eq!(l.socket().calls.lock().unwrap().len(), 1, "reused");
}

#[test]
fn datagrams_the_socket_cannot_carry_are_dropped_and_their_buffers_kept() {
    let l = link("[fd00::1]:4791", 4);
    l.transmit(&batch(3, gid4(2)));
    assert!(l.socket().calls.lock().unwrap().is_empty());
    assert_eq!(l.stats().unsendable, 3, "IPv4 through an IPv6 socket");
    assert_eq!(l.free_buffers(), 4);
    assert!(SocketLink::new(&TestPlatform, l.local_addr(), TestSocket::default(), 0).is_err());
}

#[test]
fn the_timer_is_armed_by_traffic_and_follows_the_hca_s_deadlines() {
    let a = Node::new(1);
    let l = link("10.0.0.1:4791", 8);
    l.socket().now.store(1_000, Ordering::SeqCst);
    let armed = || core::mem::take(&mut *l.socket().armed.lock().unwrap());
    // Idle: a send arms it for now, once.
    l.transmit(&batch(1, gid4(2)));
    l.transmit(&batch(1, gid4(2)));
    assert_eq!(armed(), [1_000]);
    // No deadline in the HCA: it goes idle, and the next traffic arms it.
    assert_eq!(l.on_timer(&a.d.hca), None);
    assert!(armed().is_empty());
    l.end_receive(&a.d.hca);
    assert_eq!(armed(), [1_000]);
    // A deadline (an RC request waiting for its ACK over the link): armed
    // for it, at most a slice ahead.
    a.d.hca.attach_link(l.clone()).unwrap();
    let cq = a.cq(4);
    let qp = a.qp(IV_QPT_RC, &cq);
    a.connect(&qp, gid4(9), 0x99, &Conn::default());
    a.post(
        &qp,
        &SendWr {
            inline: Some(b"x"),
            ..signaled(1, IV_WR_SEND)
        },
    );
    let deadline = a.d.hca.next_deadline().expect("the ACK timer");
    let due = l.on_timer(&a.d.hca).expect("armed");
    assert_eq!(due, deadline.min(1_000 + TIMER_SLICE_NS));
    assert_eq!(armed(), [due]);
    assert_eq!(l.stats().timer_fired, 2);
    a.d.hca.detach_link();
}

/// Two soft HCAs whose links are socket wires, the datagrams moved by the
/// test as the WSK glue moves them (send, completion, receive event): an
/// RC SEND and an RDMA WRITE complete on both sides, every buffer comes
/// back, and a lost datagram is recovered by the timer's retransmission.
#[test]
fn two_hcas_talk_rc_through_socket_links() {
    let (a, b) = (Node::new(1), Node::new(2));
    let (la, lb) = (link("10.0.0.1:4791", 16), link("10.0.0.2:4791", 16));
    a.d.hca.attach_link(la.clone()).unwrap();
    b.d.hca.attach_link(lb.clone()).unwrap();
    // Moves what `from` sent to `to` (dropping the first `lose`); how many.
    let pump = |from: &TestLink, to: &TestLink, node: &Node, lose: &mut usize| {
        let calls = core::mem::take(&mut *from.socket().calls.lock().unwrap());
        let mut n = 0;
        for o in calls.iter().flatten() {
            if *lose > 0 {
                *lose -= 1;
            } else {
                to.received(&node.d.hca, from.local_addr(), &bytes(from, o));
                n += 1;
            }
            from.send_done(o.slot, true);
        }
        to.end_receive(&node.d.hca);
        n
    };
    let (cqa, cqb) = (a.cq(16), b.cq(16));
    let (qa, qb) = (a.qp(IV_QPT_RC, &cqa), b.qp(IV_QPT_RC, &cqb));
    let c = Conn::default();
    a.connect(&qa, b.gid(), qb.qpn, &c);
    let back = Conn {
        sq_psn: c.rq_psn,
        rq_psn: c.sq_psn,
        ..c
    };
    b.connect(&qb, a.gid(), qa.qpn, &back);
    let (ma, mb) = (a.mem(4096, ALL_ACCESS), b.mem(4096, ALL_ACCESS));
    b.recv(&qb, 7, &[mb.sge(0, 64)]);
    ma.write(0, b"over a socket");
    a.post(
        &qa,
        &SendWr {
            sges: &[ma.sge(0, 13)],
            ..signaled(1, IV_WR_SEND)
        },
    );
    let mut lose = 0;
    let mut rounds = 0;
    while cqa.poll().is_empty() {
        pump(&la, &lb, &b, &mut lose);
        pump(&lb, &la, &a, &mut lose);
        rounds += 1;
        assert!(rounds < 10, "no completion");
    }
    let r = cqb.poll();
    assert_eq!(
        (r[0].wr_id, r[0].status, r[0].byte_len),
        (7, IV_WC_SUCCESS, 13)
    );
    assert_eq!(mb.read(0, 13), b"over a socket");
    // A WRITE whose first datagram is lost: the ACK timer (armed through
    // the link) retransmits it.
    ma.write(100, b"again");
    a.post(
        &qa,
        &SendWr {
            sges: &[ma.sge(100, 5)],
            remote_addr: mb.addr + 200,
            rkey: mb.lkey,
            ..signaled(2, IV_WR_RDMA_WRITE)
        },
    );
    let mut lose = 1;
    assert_eq!(pump(&la, &lb, &b, &mut lose), 0, "lost");
    let now = la.socket().now_ns();
    la.socket()
        .now
        .store(now + TIMER_SLICE_NS * 100, Ordering::SeqCst);
    la.on_timer(&a.d.hca);
    let mut rounds = 0;
    while cqa.poll().is_empty() {
        pump(&la, &lb, &b, &mut lose);
        pump(&lb, &la, &a, &mut lose);
        rounds += 1;
        assert!(rounds < 10, "not retransmitted");
    }
    assert_eq!(mb.read(200, 5), b"again");
    assert!(a.d.hca.stats().retries >= 1);
    assert_eq!((la.free_buffers(), lb.free_buffers()), (16, 16));
    assert!(lb.stats().received >= 2 && la.stats().received >= 2);
    a.d.hca.detach_link();
    b.d.hca.detach_link();
}

/// The receive hand-off: what the socket reports becomes the datagram's
/// IP and UDP facts; a datagram of the other family or an empty one is
/// dropped before the HCA sees it; garbage reaches the HCA's checks.
#[test]
fn received_datagrams_carry_the_socket_s_facts() {
    let b = Node::new(2);
    let lb = link("10.0.0.2:4791", 2);
    let from: SocketAddr = "10.0.0.1:4791".parse().unwrap();
    lb.received(
        &b.d.hca,
        SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 4791),
        &[1; 40],
    );
    lb.received(&b.d.hca, from, &[]);
    assert_eq!(lb.stats().rx_dropped, 2);
    lb.received(&b.d.hca, from, &[0xAB; 40]);
    lb.end_receive(&b.d.hca);
    assert_eq!(lb.stats().received, 1);
    let ls = b.d.hca.link_stats();
    assert_eq!(ls.rx_datagrams, 0, "the HCA's checks refused it");
    // A good datagram, sealed for the sender's socket port, is accepted.
    let sender = link("10.0.0.1:4791", 2);
    sender.transmit(&batch(1, gid4(2)));
    let o = sender.socket().calls.lock().unwrap()[0][0];
    lb.received(&b.d.hca, from, &bytes(&sender, &o));
    lb.end_receive(&b.d.hca);
    assert_eq!(b.d.hca.link_stats().rx_datagrams, 1);
}

#[test]
fn socket_addresses_have_windows_layouts() {
    let v4: SocketAddr = "10.1.2.3:4791".parse().unwrap();
    let (b, n) = encode_sockaddr(&v4);
    assert_eq!(n, 16);
    assert_eq!(&b[..8], &[2, 0, 0x12, 0xB7, 10, 1, 2, 3]);
    assert_eq!(decode_sockaddr(&b[..n]), Some(v4));
    let v6: SocketAddr = "[fd00::7]:5000".parse().unwrap();
    let (b, n) = encode_sockaddr(&v6);
    assert_eq!((n, &b[..4]), (28, &[23, 0, 0x13, 0x88][..]));
    assert_eq!(b[8], 0xFD);
    assert_eq!(decode_sockaddr(&b[..n]), Some(v6));
    assert_eq!(decode_sockaddr(&b[..20]), None, "short");
    assert_eq!(decode_sockaddr(&[17, 0, 0, 0, 1, 2, 3, 4]), None, "AF_UNIX");
    assert_eq!(decode_sockaddr(&[]), None);
}
