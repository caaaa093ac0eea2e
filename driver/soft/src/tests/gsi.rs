//! The GSI (QP1): MADs between soft HCAs over loopback, a fabric and a
//! simulated wire; garbage dropped and counted.

use alloc::vec::Vec;

use irpverbs_abi::*;
use irpverbs_core::{Event, GSI_QKEY, GSI_QPN, Hca, MAD_SIZE, MadIn, MadOut};
use irpverbs_ring::{Region, Shared};

use crate::Fabric;
use crate::net::sim::{SimConfig, SimNet};
use crate::tests::dp::Node;
use crate::tests::util::TestPlatform;
use crate::wire::packet::{Burst, Deth, Packet, Seg, op};

/// A MAD of base version 1 whose bytes after the header say `tag`.
fn mad(tag: u8) -> [u8; MAD_SIZE] {
    let mut m = [tag; MAD_SIZE];
    m[0] = 1;
    m
}

fn to(dgid: [u8; 16], tag: u8) -> MadOut {
    MadOut {
        port: 1,
        sgid_index: 0,
        dgid,
        dest_qpn: GSI_QPN,
        traffic_class: 0,
        flow_label: 0,
        hop_limit: 64,
        mad: mad(tag),
    }
}

fn mads(n: &Node) -> Vec<MadIn> {
    core::iter::from_fn(|| n.d.hca.poll_mad()).collect()
}

fn announced(n: &Node) -> usize {
    n.events().iter().filter(|e| **e == Event::Mad).count()
}

#[test]
fn mads_cross_a_fabric_and_loop_back() {
    let a = Node::with(1, |_| {});
    let b = Node::with(2, |_| {});
    let f = Fabric::new(&TestPlatform);
    f.attach(&a.d.hca).unwrap();
    f.attach(&b.d.hca).unwrap();
    a.d.hca.send_mad(&to(b.gid(), 7)).unwrap();
    a.d.hca.send_mad(&to(b.gid(), 8)).unwrap();
    assert_eq!(announced(&b), 1, "announced once until polled empty");
    let got = mads(&b);
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].mad, mad(7));
    assert_eq!(got[1].mad, mad(8));
    assert_eq!(
        (got[0].sgid, got[0].src_qpn, got[0].port, got[0].dgid_index),
        (a.gid(), GSI_QPN, 1, 0)
    );
    assert_eq!(got[0].hop_limit, 64);
    // Polled empty: the next MAD is announced again.
    b.d.hca.send_mad(&to(a.gid(), 9)).unwrap();
    b.d.hca.send_mad(&to(b.gid(), 10)).unwrap();
    assert_eq!(announced(&a), 1);
    assert_eq!(mads(&a)[0].mad, mad(9));
    assert_eq!(announced(&b), 1, "loopback");
    assert_eq!(mads(&b)[0].sgid, b.gid());
    let s = b.d.hca.stats();
    assert_eq!((s.mads_sent, s.mads_received, s.mads_dropped), (2, 3, 0));
}

#[test]
fn mads_cross_a_simulated_wire_in_deferred_mode_too() {
    for deferred in [false, true] {
        let set = |c: &mut crate::SoftConfig| {
            if deferred {
                c.execution = crate::Execution::Deferred;
            }
        };
        let a = Node::with(1, set);
        let b = Node::with(2, set);
        let mut net = SimNet::new(
            &TestPlatform,
            SimConfig {
                seed: 5,
                delay_ns: 1000,
                ..SimConfig::default()
            },
        );
        net.attach(&a.d.hca).unwrap();
        net.attach(&b.d.hca).unwrap();
        let mut out = to(b.gid(), 3);
        out.traffic_class = 0x10;
        out.flow_label = 0x1234;
        a.d.hca.send_mad(&out).unwrap();
        a.run();
        net.run(u64::MAX);
        b.run();
        assert_eq!(announced(&b), 1);
        let got = mads(&b);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].mad, mad(3));
        assert_eq!(got[0].sgid, a.gid());
        assert_eq!((got[0].traffic_class, got[0].flow_label), (0x10, 0x1234));
        assert_eq!(net.stats().delivered, 1);
        assert_eq!(b.d.hca.link_stats().rx_datagrams, 1);
    }
}

/// The GSI reuses the buffers of MADs sent, but never one a packet still
/// holds: MADs queued (deferred mode, the data path not run yet) keep their
/// bytes while more are sent, round after round.
#[test]
fn mad_buffers_are_reused_only_once_free() {
    let deferred = |c: &mut crate::SoftConfig| c.execution = crate::Execution::Deferred;
    let a = Node::with(1, deferred);
    let b = Node::with(2, deferred);
    let f = Fabric::new(&TestPlatform);
    f.attach(&a.d.hca).unwrap();
    f.attach(&b.d.hca).unwrap();
    for round in 0..3u8 {
        // More than the GSI keeps spare, all in flight at once.
        let tags: Vec<u8> = (0..100u8).map(|i| i.wrapping_add(round * 100)).collect();
        for &t in &tags {
            a.d.hca.send_mad(&to(b.gid(), t)).unwrap();
        }
        a.run();
        b.run();
        let got: Vec<[u8; MAD_SIZE]> = mads(&b).into_iter().map(|m| m.mad).collect();
        let want: Vec<[u8; MAD_SIZE]> = tags.iter().map(|&t| mad(t)).collect();
        assert_eq!(got, want, "round {round}");
    }
}

/// Feeds `pkt` with `payload` to `node`'s transport as if it arrived.
fn inject(node: &Node, pkt: Packet, burst: Burst, payload: &[u8]) {
    let r = Shared::try_new(Region::alloc(payload.len().max(1)).unwrap()).unwrap();
    r.write(0, payload).unwrap();
    let segs = [Seg {
        region: r,
        offset: 0,
        len: payload.len(),
    }];
    node.d
        .hca
        .with_firmware(|fw| fw.receive(&pkt, burst, &segs[..usize::from(!payload.is_empty())]));
}

/// A valid MAD packet from `a`'s QP1 to `b`'s.
fn mad_packet(a: &Node, b: &Node) -> Packet {
    Packet {
        opcode: op::UD_SEND_ONLY,
        pkey: 0xFFFF,
        dest_qpn: GSI_QPN,
        sgid: a.gid(),
        dgid: b.gid(),
        hop_limit: 64,
        deth: Deth {
            qkey: GSI_QKEY,
            src_qpn: 1,
        },
        payload_len: MAD_SIZE as u32,
        ..Packet::default()
    }
}

#[test]
fn garbage_to_qp1_is_dropped_and_counted() {
    let a = Node::with(1, |_| {});
    let b = Node::with(2, |_| {});
    let good = mad_packet(&a, &b);
    let one = Burst::one(op::UD_SEND_ONLY);
    let m = mad(1);
    let mut v2 = m;
    v2[0] = 2;
    let cases: [(Packet, Burst, &[u8]); 7] = [
        (
            Packet {
                deth: Deth {
                    qkey: 0x1234,
                    src_qpn: 1,
                },
                ..good
            },
            one,
            &m,
        ),
        (
            Packet {
                opcode: op::UD_SEND_ONLY_IMM,
                ..good
            },
            Burst::one(op::UD_SEND_ONLY_IMM),
            &m,
        ),
        (
            Packet {
                payload_len: 100,
                ..good
            },
            one,
            &m[..100],
        ),
        (good, one, &v2),
        (
            Packet {
                dgid: [9; 16],
                ..good
            },
            one,
            &m,
        ),
        (
            Packet {
                opcode: op::RC_SEND_ONLY,
                ..good
            },
            Burst::one(op::RC_SEND_ONLY),
            &m,
        ),
        (
            good,
            Burst {
                count: 2,
                last_opcode: op::UD_SEND_ONLY,
            },
            &m,
        ),
    ];
    for (i, (pkt, burst, payload)) in cases.iter().enumerate() {
        inject(&b, *pkt, *burst, payload);
        assert_eq!(b.d.hca.stats().mads_dropped, i as u64 + 1, "case {i}");
    }
    assert!(mads(&b).is_empty());
    assert_eq!(announced(&b), 0);
    inject(&b, good, one, &m);
    assert_eq!(mads(&b).len(), 1, "the good one passes");
    // A full queue drops.
    for _ in 0..crate::MAD_QUEUE_DEPTH + 3 {
        inject(&b, good, one, &m);
    }
    let s = b.d.hca.stats();
    assert_eq!(s.mads_dropped, 7 + 3);
    assert_eq!(mads(&b).len(), crate::MAD_QUEUE_DEPTH);
}

#[test]
fn send_mad_checks_its_address() {
    let a = Node::with(1, |_| {});
    let bad: [fn(&mut MadOut); 4] = [
        |m| m.port = 2,
        |m| m.sgid_index = 3,
        |m| m.dest_qpn = 0x100_0000,
        |m| m.flow_label = 0x10_0000,
    ];
    for f in bad {
        let mut m = to(a.gid(), 1);
        f(&mut m);
        assert_eq!(a.d.hca.send_mad(&m), Err(STATUS_INVALID_PARAMETER));
    }
    assert_eq!(a.d.hca.stats().mads_sent, 0);
    // No route: lost, not an error (the CM retransmits).
    a.d.hca.send_mad(&to([7; 16], 1)).unwrap();
    assert_eq!(a.d.hca.stats().mads_sent, 1);
}

/// The MAD queue grows to its high-water mark fallibly: a MAD it has no
/// memory for is dropped and counted (and not announced), not an abort.
#[test]
fn a_mad_without_memory_to_queue_is_dropped() {
    let a = Node::with(1, |_| {});
    let b = Node::with(2, |_| {});
    let pkt = mad_packet(&a, &b);
    let r = Shared::try_new(Region::alloc(MAD_SIZE).unwrap()).unwrap();
    r.write(0, &mad(3)).unwrap();
    let segs = [Seg {
        region: r,
        offset: 0,
        len: MAD_SIZE,
    }];
    let one = Burst::one(op::UD_SEND_ONLY);
    let ((), failed) = irpverbs_failalloc::failing_nth(0, || {
        b.d.hca.with_firmware(|fw| fw.receive(&pkt, one, &segs));
    });
    assert!(failed);
    let mad_event = |b: &Node| {
        b.d.hca
            .with_firmware(|fw| fw.dp.events.contains(&Event::Mad))
    };
    assert!(!mad_event(&b), "not announced");
    assert!(mads(&b).is_empty());
    let s = b.d.hca.stats();
    assert_eq!((s.mads_received, s.mads_dropped), (0, 1));
    // With memory, the same MAD is queued.
    b.d.hca.with_firmware(|fw| fw.receive(&pkt, one, &segs));
    assert!(mad_event(&b));
    assert_eq!(mads(&b)[0].mad, mad(3));
}
