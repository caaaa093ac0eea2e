//! Properties of the wire formats: every opcode of the table round-trips
//! with any field values over IPv4 and IPv6; no truncation, no single
//! flipped bit and no random input gets through (or panics).

use alloc::vec::Vec;

use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::Config;

use super::*;
use crate::wire::packet::{
    Aeth, AtomicEth, Deth, PSN_MASK, Packet, Reth, aeth, header_len, m, mask, op,
};

fn config() -> Config {
    Config {
        failure_persistence: None,
        ..Config::default()
    }
}

/// Every opcode the table knows.
fn opcodes() -> Vec<u8> {
    (0..=255u8).filter(|&o| mask(o) != 0).collect()
}

fn v4_gid(a: u32) -> Gid {
    let mut g = [0u8; 16];
    g[10] = 0xFF;
    g[11] = 0xFF;
    g[12..].copy_from_slice(&a.to_be_bytes());
    g
}

fn v6_gid(w: [u32; 4]) -> Gid {
    let mut g = [0u8; 16];
    for (c, x) in g.chunks_exact_mut(4).zip(w) {
        c.copy_from_slice(&x.to_be_bytes());
    }
    g[0] = 0xFD; // unique local: never IPv4-mapped
    g
}

/// A packet of `opcode` with the values `r` in exactly the fields its
/// headers carry (the others 0, as parsing leaves them), the payload (if
/// the opcode has one), and the datagram facts of sending it.
fn packet(opcode: u8, r: &[u32; 20], payload: &[u8], ipv4: bool) -> (Packet, Vec<u8>, IpUdp) {
    let k = mask(opcode);
    let wide = |a: u32, b: u32| (u64::from(a) << 32) | u64::from(b);
    let has = |bit| k & bit != 0;
    let (sgid, dgid, flow_label) = if ipv4 {
        (v4_gid(r[0]), v4_gid(r[1]), 0)
    } else {
        (
            v6_gid([r[0], r[2], r[3], r[4]]),
            v6_gid([r[1], r[4], r[3], r[2]]),
            r[5] & 0xF_FFFF,
        )
    };
    let payload: Vec<u8> = if has(m::PAYLOAD) {
        payload.to_vec()
    } else {
        Vec::new()
    };
    #[allow(clippy::cast_possible_truncation)]
    let pkt = Packet {
        opcode,
        solicited: r[6] & 1 != 0,
        ack_req: r[6] & 2 != 0,
        mig_req: r[6] >> 31 != 0,
        pkey: r[6] as u16 >> 2,
        dest_qpn: r[7] & PSN_MASK,
        psn: r[8] & PSN_MASK,
        sgid,
        dgid,
        traffic_class: r[9] as u8,
        flow_label,
        hop_limit: (r[9] >> 8) as u8,
        reth: if has(m::RETH) {
            Reth {
                va: wide(r[10], r[11]),
                rkey: r[12],
                len: r[13],
            }
        } else {
            Reth::default()
        },
        aeth: if has(m::AETH) {
            Aeth {
                syndrome: (r[14] >> 24) as u8,
                msn: r[14] & PSN_MASK,
            }
        } else {
            Aeth::default()
        },
        atomic: if has(m::ATMETH) {
            AtomicEth {
                va: wide(r[10], r[11]),
                rkey: r[12],
                swap_add: wide(r[13], r[15]),
                compare: wide(r[16], r[17]),
            }
        } else {
            AtomicEth::default()
        },
        atomic_orig: if has(m::ATMACK) {
            wide(r[18], r[19])
        } else {
            0
        },
        imm: if has(m::IMMDT) { r[15] } else { 0 },
        ieth: if has(m::IETH) { r[16] } else { 0 },
        deth: if has(m::DETH) {
            Deth {
                qkey: r[17],
                src_qpn: r[18] & PSN_MASK,
            }
        } else {
            Deth::default()
        },
        payload_len: u32::try_from(payload.len()).unwrap(),
    };
    #[allow(clippy::cast_possible_truncation)]
    let mut ip = IpUdp::of(&pkt, r[19] as u16, (r[19] >> 16) as u16);
    ip.dont_fragment = r[5] & 1 != 0 || !ipv4;
    ip.udp_checksum = r[5] & 2 != 0 || !ipv4;
    if !ipv4 {
        ip.ident = 0;
        ip.dont_fragment = false;
    }
    (pkt, payload, ip)
}

fn any_packet() -> impl Strategy<Value = (Packet, Vec<u8>, IpUdp)> {
    (
        select(opcodes()),
        any::<[u32; 20]>(),
        proptest::collection::vec(any::<u8>(), 0..160),
        any::<bool>(),
    )
        .prop_map(|(o, r, p, v4)| packet(o, &r, &p, v4))
}

/// The payload cut into up to three pieces at `cut`.
fn pieces(p: &[u8], cut: usize) -> [&[u8]; 3] {
    let a = cut % (p.len() + 1);
    let b = (cut / 7) % (p.len() - a + 1) + a;
    [&p[..a], &p[a..b], &p[b..]]
}

const BUF: usize = 512;

fn datagram(pkt: &Packet, payload: &[u8], ip: &IpUdp) -> ([u8; BUF], usize) {
    let mut buf = [0u8; BUF];
    let n = emit_datagram(pkt, &[payload], ip, &mut buf).unwrap();
    (buf, n)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn every_opcode_round_trips((pkt, payload, ip) in any_packet(), cut in any::<usize>()) {
        let parts = pieces(&payload, cut);
        let mut buf = [0u8; BUF];
        let n = emit_transport(&pkt, &parts, &ip, &mut buf).unwrap();
        prop_assert_eq!(n, transport_len(&pkt).unwrap());
        prop_assert_eq!(n % 4, 0);
        prop_assert_eq!(usize::from(buf[1] >> 4 & 3), pkt.pad() as usize);
        let (back, data) = parse_transport(&buf[..n], &ip).unwrap();
        prop_assert_eq!(back, pkt);
        prop_assert_eq!(data, &payload[..]);

        let n = emit_datagram(&pkt, &parts, &ip, &mut buf).unwrap();
        let p = parse_datagram(&buf[..n]).unwrap();
        prop_assert_eq!((p.pkt, p.payload, p.ip), (pkt, &payload[..], ip));

        let eth = EthAddrs { src: [2, 0, 0, 0, 0, 1], dst: [2, 0, 0, 0, 0, 2] };
        let n = emit_frame(&pkt, &parts, &ip, &eth, &mut buf).unwrap();
        let p = parse_frame(&buf[..n]).unwrap();
        prop_assert_eq!((p.pkt, p.payload, p.ip), (pkt, &payload[..], ip));
    }

    #[test]
    fn every_truncation_is_rejected((pkt, payload, ip) in any_packet()) {
        let (buf, n) = datagram(&pkt, &payload, &ip);
        let hdr = n - transport_len(&pkt).unwrap();
        for len in 0..n {
            prop_assert!(parse_datagram(&buf[..len]).is_err(), "datagram cut at {}", len);
        }
        let transport = &buf[hdr..n];
        for len in 0..transport.len() {
            prop_assert!(parse_transport(&transport[..len], &ip).is_err(), "cut at {}", len);
        }
    }

    #[test]
    fn a_flipped_bit_is_caught(
        (pkt, payload, ip) in any_packet(),
        bits in proptest::collection::vec(any::<usize>(), 16),
    ) {
        let (mut buf, n) = datagram(&pkt, &payload, &ip);
        let hdr = n - transport_len(&pkt).unwrap();
        for bit in bits {
            let bit = bit % ((n - hdr) * 8);
            let (i, b) = (hdr + bit / 8, 1u8 << (bit % 8));
            buf[i] ^= b;
            let r = parse_transport(&buf[hdr..n], &ip);
            if i == hdr + headers::BTH_RESV8A {
                prop_assert!(r.is_ok(), "FECN, BECN, resv6 are masked");
            } else {
                prop_assert!(r.is_err(), "bit {} of the transport", bit);
            }
            buf[i] ^= b;
        }
    }

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let ip = IpUdp { src: v6_gid([1; 4]), dst: v6_gid([2; 4]), ..IpUdp::default() };
        let _ = parse_frame(&bytes);
        let _ = parse_datagram(&bytes);
        let _ = parse_transport(&bytes, &ip);
    }

    #[test]
    fn mangled_packets_never_panic(
        (pkt, payload, ip) in any_packet(),
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
        cut in any::<usize>(),
    ) {
        let (mut buf, n) = datagram(&pkt, &payload, &ip);
        for (at, v) in edits {
            buf[at % n] = v;
        }
        let len = n - cut % (n / 4 + 1);
        let mut stats = WireStats::default();
        stats.record(parse_datagram(&buf[..len]));
        stats.record(parse_transport(&buf[..len], &ip));
        prop_assert_eq!(stats.accepted + stats.total_drops(), 2);
    }
}

/// A datagram of `opcode` (with a UDP checksum), its facts, the offset of
/// its transport and its length.
fn sample(opcode: u8, payload_len: usize, ipv4: bool) -> (Packet, IpUdp, [u8; BUF], usize, usize) {
    let (pkt, payload, ip) = packet(opcode, &[7; 20], &[0x5A; 64][..payload_len], ipv4);
    let (buf, n) = datagram(&pkt, &payload, &ip);
    let hdr = n - transport_len(&pkt).unwrap();
    (pkt, ip, buf, hdr, n)
}

/// Recomputes the ICRC of the transport `t` (whose length may have
/// changed) after an edit, so the edit is what gets checked.
fn reseal(t: &mut [u8], ip: &IpUdp) {
    let n = t.len() - ICRC_LEN;
    let crc = icrc(ip, &t[..n]).unwrap();
    t[n..].copy_from_slice(&crc.to_le_bytes());
}

#[test]
fn each_malformed_transport_gets_its_reason() {
    let (pkt, ip, buf, hdr, n) = sample(op::RC_SEND_ONLY, 5, true);
    let good = &buf[hdr..n];
    assert!(parse_transport(good, &ip).is_ok());
    let edit = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut t = good.to_vec();
        f(&mut t);
        reseal(&mut t, &ip);
        parse_transport(&t, &ip).map(|(p, _)| p)
    };
    assert_eq!(edit(&|t| t[1] |= 1), Err(WireError::BadVersion));
    assert_eq!(edit(&|t| t[0] = 0x15), Err(WireError::UnknownOpcode));
    assert_eq!(edit(&|t| t[0] = 0x81), Err(WireError::UnknownOpcode));
    assert_eq!(edit(&|t| t.push(0)), Err(WireError::BadLength));
    assert_eq!(
        edit(&|t| t[0] = op::RC_ACKNOWLEDGE),
        Err(WireError::BadLength),
        "bytes after an ACK's AETH"
    );
    // A 12-byte SEND ONLY with pad 3: nothing to pad.
    let t = &mut [0u8; 16];
    t[..12].copy_from_slice(&good[..12]);
    t[1] = 0x30;
    reseal(t, &ip);
    assert_eq!(parse_transport(t, &ip), Err(WireError::BadPad));
    // An ACK (no payload) with a pad count.
    let (_, ack_ip, buf, hdr, n) = sample(op::RC_ACKNOWLEDGE, 0, true);
    let mut t = buf[hdr..n].to_vec();
    t[1] |= 0x10;
    reseal(&mut t, &ack_ip);
    assert_eq!(parse_transport(&t, &ack_ip), Err(WireError::BadPad));
    let mut t = good.to_vec();
    t[n - hdr - 1] ^= 1;
    assert_eq!(parse_transport(&t, &ip), Err(WireError::BadIcrc));
    assert_eq!(parse_transport(&good[..11], &ip), Err(WireError::Truncated));
    assert_eq!(parse_transport(&good[..12], &ip), Err(WireError::Truncated));
    let mixed = IpUdp {
        dst: v6_gid([1; 4]),
        ..ip
    };
    assert_eq!(parse_transport(good, &mixed), Err(WireError::BadIpHeader));
    // Reserved bits, FECN and BECN are ignored; MigReq is the packet's.
    let ignored = edit(&|t| {
        t[4] = 0xFF;
        t[8] |= 0x7F;
    });
    assert_eq!(ignored, Ok(pkt));
    let migrated = edit(&|t| t[1] |= headers::BTH_MIG);
    assert_eq!(
        migrated,
        Ok(Packet {
            mig_req: true,
            ..pkt
        })
    );
}

/// Sets the IPv4 header checksum of `d` again after an edit.
fn recheck_v4(d: &mut [u8]) {
    d[10..12].fill(0);
    let c = !ip::tests::checksum(&d[..IPV4_HDR_LEN]);
    d[10..12].copy_from_slice(&c.to_be_bytes());
}

#[test]
fn each_malformed_datagram_gets_its_reason() {
    let (_, _, buf, _, n) = sample(op::RC_SEND_ONLY, 8, true);
    let good = &buf[..n];
    assert!(parse_datagram(good).is_ok());
    let edit = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut d = good.to_vec();
        f(&mut d);
        recheck_v4(&mut d);
        parse_datagram(&d).map(|p| p.pkt)
    };
    assert_eq!(
        edit(&|d| d[0] = 0x46),
        Err(WireError::BadIpHeader),
        "options"
    );
    assert_eq!(edit(&|d| d[6] |= 0x20), Err(WireError::BadIpHeader), "MF");
    assert_eq!(edit(&|d| d[7] = 1), Err(WireError::BadIpHeader), "offset");
    assert_eq!(edit(&|d| d[9] = 6), Err(WireError::NotRoce), "TCP");
    assert_eq!(edit(&|d| d[23] ^= 1), Err(WireError::NotRoce), "port");
    assert_eq!(edit(&|d| d[3] += 4), Err(WireError::Truncated), "IP length");
    assert_eq!(
        edit(&|d| d[3] -= 4),
        Err(WireError::Truncated),
        "UDP length"
    );
    assert_eq!(
        edit(&|d| d[25] -= 4),
        Err(WireError::BadLength),
        "UDP length"
    );
    assert_eq!(edit(&|d| d[2..4].fill(0)), Err(WireError::BadLength));
    assert_eq!(edit(&|d| d[0] = 0x55), Err(WireError::NotRoce), "version 5");
    let mut d = good.to_vec();
    d[8] ^= 1;
    assert_eq!(
        parse_datagram(&d).map(|_| ()),
        Err(WireError::BadIpChecksum)
    );
    assert_eq!(edit(&|d| d[27] ^= 1), Err(WireError::BadUdpChecksum));
    assert_eq!(edit(&|d| d[40] ^= 1), Err(WireError::BadUdpChecksum));
    // Ethernet padding after the datagram is ignored.
    let mut d = good.to_vec();
    d.extend_from_slice(&[0; 9]);
    assert!(parse_datagram(&d).is_ok());
    assert_eq!(parse_datagram(&[]).map(|_| ()), Err(WireError::Truncated));

    let (_, _, buf, _, n) = sample(op::UD_SEND_ONLY_IMM, 8, false);
    let good6 = &buf[..n];
    assert!(parse_datagram(good6).is_ok());
    let edit6 = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut d = good6.to_vec();
        f(&mut d);
        parse_datagram(&d).map(|p| p.pkt)
    };
    assert_eq!(edit6(&|d| d[6] = 0), Err(WireError::NotRoce), "hop-by-hop");
    assert_eq!(edit6(&|d| d[5] += 4), Err(WireError::Truncated));
    assert_eq!(edit6(&|d| d[60] ^= 0x10), Err(WireError::BadUdpChecksum));
    // IPv6 with an IPv4-mapped address.
    let mapped = |d: &mut Vec<u8>| {
        d[8..24].copy_from_slice(&v4_gid(1));
    };
    assert_eq!(edit6(&mapped), Err(WireError::BadIpHeader));
    // No UDP checksum over IPv6 is accepted (the ICRC covers the packet).
    assert!(edit6(&|d| d[46..48].fill(0)).is_ok());
}

#[test]
fn frames_carry_ipv4_or_ipv6_and_may_have_a_vlan_tag() {
    let (pkt, payload, ip) = packet(op::RC_WRITE_FIRST, &[3; 20], &[1; 12], true);
    let eth = EthAddrs {
        src: [2, 0, 0, 0, 0, 1],
        dst: [2, 0, 0, 0, 0, 2],
    };
    let mut f = [0u8; BUF];
    let n = emit_frame(&pkt, &[&payload], &ip, &eth, &mut f).unwrap();
    assert_eq!(f[12..14], [0x08, 0x00]);
    assert_eq!(parse_frame(&f[..n]).unwrap().pkt, pkt);
    let mut tagged = f[..12].to_vec();
    tagged.extend_from_slice(&[0x81, 0x00, 0x00, 0x05]);
    tagged.extend_from_slice(&f[12..n]);
    assert_eq!(parse_frame(&tagged).unwrap().pkt, pkt);
    assert_eq!(
        parse_frame(&tagged[..16]).map(|_| ()),
        Err(WireError::Truncated)
    );
    let mut wrong = f[..n].to_vec();
    wrong[12..14].copy_from_slice(&[0x86, 0xDD]);
    assert_eq!(parse_frame(&wrong).map(|_| ()), Err(WireError::NotRoce));
    wrong[12..14].copy_from_slice(&[0x08, 0x06]);
    assert_eq!(parse_frame(&wrong).map(|_| ()), Err(WireError::NotRoce));
    assert_eq!(parse_frame(&f[..14]).map(|_| ()), Err(WireError::Truncated));

    let (pkt, payload, ip) = packet(op::UC_SEND_LAST_IMM, &[9; 20], &[1; 3], false);
    let n = emit_frame(&pkt, &[&payload], &ip, &eth, &mut f).unwrap();
    assert_eq!(f[12..14], [0x86, 0xDD]);
    assert_eq!(parse_frame(&f[..n]).unwrap().pkt, pkt);
}

#[test]
fn emit_refuses_what_the_headers_cannot_say() {
    let (pkt, payload, ip) = packet(op::RC_SEND_ONLY, &[1; 20], &[1; 10], true);
    let mut buf = [0u8; BUF];
    let need = transport_len(&pkt).unwrap();
    assert_eq!(need, 12 + 10 + 2 + 4);
    assert_eq!(
        emit_transport(&pkt, &[&payload], &ip, &mut buf[..need - 1]),
        Err(EmitError::BufferTooSmall { needed: need })
    );
    assert_eq!(
        emit_datagram(&pkt, &[&payload], &ip, &mut buf[..need]),
        Err(EmitError::BufferTooSmall { needed: need + 28 })
    );
    let eth = EthAddrs::default();
    assert_eq!(
        emit_frame(&pkt, &[&payload], &ip, &eth, &mut buf[..need]),
        Err(EmitError::BufferTooSmall { needed: need + 42 })
    );
    assert_eq!(
        emit_frame(&pkt, &[&payload], &ip, &eth, &mut buf[..3]),
        Err(EmitError::BufferTooSmall { needed: 14 })
    );
    assert_eq!(
        emit_transport(&pkt, &[&payload[1..]], &ip, &mut buf),
        Err(EmitError::PayloadLen)
    );
    let bad = |f: &dyn Fn(&mut Packet)| {
        let mut p = pkt;
        f(&mut p);
        emit_transport(&p, &[&payload], &ip, &mut buf.clone())
    };
    assert_eq!(bad(&|p| p.opcode = 0x15), Err(EmitError::UnknownOpcode));
    assert_eq!(bad(&|p| p.psn = PSN_MASK + 1), Err(EmitError::OutOfRange));
    assert_eq!(
        bad(&|p| p.dest_qpn = PSN_MASK + 1),
        Err(EmitError::OutOfRange)
    );
    assert_eq!(
        bad(&|p| {
            p.opcode = op::RC_ACKNOWLEDGE;
            p.payload_len = 0;
        }),
        Err(EmitError::PayloadLen),
        "an ACK with payload pieces"
    );
    let ack = Packet {
        opcode: op::RC_ACKNOWLEDGE,
        aeth: Aeth {
            syndrome: aeth::ACK,
            msn: PSN_MASK + 1,
        },
        ..pkt
    };
    assert_eq!(
        transport_len(&Packet {
            payload_len: 1,
            ..ack
        }),
        Err(EmitError::PayloadLen)
    );
    assert_eq!(
        emit_transport(
            &Packet {
                payload_len: 0,
                ..ack
            },
            &[],
            &ip,
            &mut buf
        ),
        Err(EmitError::OutOfRange)
    );
    let ud = Packet {
        opcode: op::UD_SEND_ONLY,
        deth: Deth {
            qkey: 1,
            src_qpn: PSN_MASK + 1,
        },
        ..pkt
    };
    assert_eq!(
        emit_transport(&ud, &[&payload], &ip, &mut buf),
        Err(EmitError::OutOfRange)
    );
    let mixed = IpUdp {
        dst: v6_gid([4; 4]),
        ..ip
    };
    assert_eq!(
        emit_transport(&pkt, &[&payload], &mixed, &mut buf),
        Err(EmitError::MixedFamilies)
    );
    assert_eq!(
        emit_datagram(&pkt, &[&payload], &mixed, &mut buf),
        Err(EmitError::MixedFamilies)
    );
    let v6 = IpUdp {
        src: v6_gid([4; 4]),
        dst: v6_gid([5; 4]),
        flow_label: 0x10_0000,
        ..ip
    };
    assert_eq!(
        emit_datagram(&pkt, &[&payload], &v6, &mut buf),
        Err(EmitError::OutOfRange)
    );
    // 65535 bytes of UDP at most, and of IPv4 datagram.
    let big = [0u8; 0x1_0000];
    let huge = |len: usize| Packet {
        payload_len: u32::try_from(len).unwrap(),
        ..pkt
    };
    let mut out = alloc::vec![0u8; 0x1_0000 + 64];
    let fits4 = 0xFFFF - 20 - 8 - 12 - 4 - 3;
    assert!(emit_datagram(&huge(fits4), &[&big[..fits4]], &ip, &mut out).is_ok());
    assert_eq!(
        emit_datagram(&huge(fits4 + 1), &[&big[..=fits4]], &ip, &mut out),
        Err(EmitError::TooLong)
    );
    let v6 = IpUdp {
        flow_label: 0,
        ..v6
    };
    let fits6 = 0xFFFF - 8 - 12 - 4 - 3;
    assert!(emit_datagram(&huge(fits6), &[&big[..fits6]], &v6, &mut out).is_ok());
    assert_eq!(
        emit_transport(&huge(fits6 + 1), &[&big[..=fits6]], &v6, &mut out),
        Err(EmitError::TooLong)
    );
}

#[test]
fn the_udp_checksum_follows_the_family() {
    let (pkt, payload, mut ip) = packet(op::RC_SEND_ONLY, &[2; 20], &[3; 9], true);
    ip.udp_checksum = false;
    let (d, n) = datagram(&pkt, &payload, &ip);
    assert_eq!(d[26..28], [0, 0], "none over IPv4 unless asked");
    assert_eq!(parse_datagram(&d[..n]).unwrap().ip, ip);
    ip.udp_checksum = true;
    let (d, n) = datagram(&pkt, &payload, &ip);
    assert_ne!(d[26..28], [0, 0]);
    assert_eq!(parse_datagram(&d[..n]).unwrap().ip, ip);

    let (pkt, payload, mut ip) = packet(op::RC_SEND_ONLY, &[2; 20], &[3; 9], false);
    ip.udp_checksum = false;
    let (d, n) = datagram(&pkt, &payload, &ip);
    assert_ne!(d[46..48], [0, 0], "always over IPv6");
    assert!(parse_datagram(&d[..n]).unwrap().ip.udp_checksum);
    assert!(IpUdp::of(&pkt, 1, 1).udp_checksum);
}

#[test]
fn headers_follow_the_opcode_table() {
    for o in opcodes() {
        let (pkt, payload, ip) = packet(o, &[0x0102_0304; 20], &[0xEE; 4], true);
        let mut buf = [0u8; BUF];
        let n = emit_transport(&pkt, &[&payload], &ip, &mut buf).unwrap();
        assert_eq!(n, header_len(o).unwrap() + payload.len() + ICRC_LEN);
        assert_eq!(buf[0], o);
    }
}

#[test]
fn stats_count_drops_by_reason() {
    let mut s = WireStats::default();
    assert_eq!(s.record::<u8>(Ok(7)), Some(7));
    assert_eq!(s.record::<u8>(Err(WireError::BadIcrc)), None);
    assert_eq!(s.record::<u8>(Err(WireError::BadIcrc)), None);
    s.count(WireError::Truncated);
    assert_eq!(s.accepted, 1);
    assert_eq!(s.drops(WireError::BadIcrc), 2);
    assert_eq!(s.drops(WireError::Truncated), 1);
    assert_eq!(s.drops(WireError::BadPad), 0);
    assert_eq!(s.total_drops(), 3);
    for (i, e) in WireError::ALL.iter().enumerate() {
        assert_eq!(e.index(), i);
        assert!(!e.as_str().is_empty());
    }
}

#[test]
fn families_follow_the_gids() {
    let v4: Gid = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 10, 0, 0, 1];
    let mut v6: Gid = [0; 16];
    v6[0] = 0xFD;
    let ip = |src, dst| IpUdp {
        src,
        dst,
        ..IpUdp::default()
    };
    assert_eq!(ip(v4, v4).family(), Some(Family::V4));
    assert_eq!(ip(v6, v6).family(), Some(Family::V6));
    assert_eq!(ip(v4, v6).family(), None);
    assert_eq!(ip(v6, v4).family(), None);
    let pkt = Packet {
        sgid: v4,
        dgid: v4,
        hop_limit: 64,
        ..Packet::default()
    };
    let f = IpUdp::of(&pkt, 0xC000, 9);
    assert_eq!((f.dst_port, f.src_port, f.ident), (ROCE_PORT, 0xC000, 9));
    assert!(f.dont_fragment && f.hop_limit == 64);
}
