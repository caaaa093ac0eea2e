//! The wire formats against packets built by an independent RoCEv2
//! implementation (`tests/vectors/rocev2/README.md`): every vector parses
//! to the fields it was built with and its ICRC, re-emits byte for byte,
//! and any single flipped bit is caught (but in the fields the network may
//! change, which the ICRC masks).

use irpverbs_soft::packet::{Aeth, Deth, Packet, Reth, op};
use irpverbs_soft::wire::{
    self, ETH_HDR_LEN, EthAddrs, IPV4_HDR_LEN, IPV6_HDR_LEN, IpUdp, ROCE_PORT, UDP_HDR_LEN,
    WireError,
};

struct Vector {
    name: String,
    frame: Vec<u8>,
    udp_payload: Vec<u8>,
    icrc: u32,
}

fn hex(s: &str) -> Vec<u8> {
    assert!(s.len() % 2 == 0, "odd hex {s}");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex digit"))
        .collect()
}

/// The string value of `"key": "..."` in one JSON object's text.
fn field<'a>(obj: &'a str, key: &str) -> &'a str {
    let tag = format!("\"{key}\": \"");
    let at = obj.find(&tag).unwrap_or_else(|| panic!("no {key}")) + tag.len();
    let len = obj[at..].find('"').expect("closing quote");
    &obj[at..at + len]
}

/// vectors.json: a flat array of objects of string fields.
fn vectors() -> Vec<Vector> {
    let json = include_str!("vectors/rocev2/vectors.json");
    let v: Vec<Vector> = json
        .split('{')
        .skip(1)
        .map(|obj| Vector {
            name: field(obj, "name").to_owned(),
            frame: hex(field(obj, "ethernet_frame_hex")),
            udp_payload: hex(field(obj, "udp_payload_hex")),
            icrc: u32::from_str_radix(field(obj, "icrc_le_u32").trim_start_matches("0x"), 16)
                .expect("icrc"),
        })
        .collect();
    assert_eq!(v.len(), 4);
    v
}

fn v4(a: [u8; 4]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10..12].copy_from_slice(&[0xFF, 0xFF]);
    g[12..].copy_from_slice(&a);
    g
}

fn v6(last: u8) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[0] = 0xFD;
    g[15] = last;
    g
}

/// What each vector was built with.
fn expected(name: &str) -> (Packet, &'static [u8], IpUdp) {
    let a = v4([192, 168, 7, 1]);
    let b = v4([192, 168, 7, 2]);
    let ip = |src, dst, port, ident| IpUdp {
        src,
        dst,
        traffic_class: 0,
        flow_label: 0,
        hop_limit: 64,
        ident,
        dont_fragment: true,
        src_port: port,
        dst_port: ROCE_PORT,
        udp_checksum: true,
    };
    let base = |opcode, dest_qpn, psn, ip: &IpUdp| Packet {
        opcode,
        pkey: 0xFFFF,
        dest_qpn,
        psn,
        sgid: ip.src,
        dgid: ip.dst,
        hop_limit: 64,
        ..Packet::default()
    };
    match name {
        "rc_send_only_ipv4" => {
            let ip = ip(a, b, 0xC001, 1);
            let payload: &[u8] = b"hello, rocev2!!!";
            let pkt = Packet {
                ack_req: true,
                payload_len: 16,
                ..base(op::RC_SEND_ONLY, 0x11, 0x100, &ip)
            };
            (pkt, payload, ip)
        }
        "rc_ack_ipv4" => {
            let ip = ip(b, a, 0xC002, 2);
            let pkt = Packet {
                aeth: Aeth {
                    syndrome: 0x1F,
                    msn: 1,
                },
                ..base(op::RC_ACKNOWLEDGE, 0x12, 0x100, &ip)
            };
            (pkt, b"", ip)
        }
        "rc_rdma_write_only_ipv4" => {
            let ip = ip(a, b, 0xC001, 3);
            let pkt = Packet {
                ack_req: true,
                reth: Reth {
                    va: 0x7F00_1234_5000,
                    rkey: 0xABCD,
                    len: 16,
                },
                payload_len: 16,
                ..base(op::RC_WRITE_ONLY, 0x11, 0x101, &ip)
            };
            (pkt, b"0123456789abcdef", ip)
        }
        "ud_send_only_ipv6" => {
            let ip = IpUdp {
                ident: 0,
                dont_fragment: false,
                ..ip(v6(1), v6(2), 0xC003, 0)
            };
            let pkt = Packet {
                deth: Deth {
                    qkey: 0x1111_1111,
                    src_qpn: 0x12,
                },
                payload_len: 8,
                ..base(op::UD_SEND_ONLY, 0x13, 7, &ip)
            };
            (pkt, b"datagram", ip)
        }
        other => panic!("unknown vector {other}"),
    }
}

#[test]
fn every_vector_parses_to_its_fields_and_icrc() {
    for v in vectors() {
        let p = wire::parse_frame(&v.frame).unwrap_or_else(|e| panic!("{}: {e}", v.name));
        let (pkt, payload, ip) = expected(&v.name);
        assert_eq!(p.pkt, pkt, "{}", v.name);
        assert_eq!(p.payload, payload, "{}", v.name);
        assert_eq!(p.ip, ip, "{}", v.name);

        let ip_len = if p.ip.family() == Some(wire::Family::V4) {
            IPV4_HDR_LEN
        } else {
            IPV6_HDR_LEN
        };
        let udp = &v.frame[ETH_HDR_LEN + ip_len + UDP_HDR_LEN..];
        assert_eq!(udp, &v.udp_payload[..], "{}", v.name);
        let (t, tp) = wire::parse_transport(udp, &ip).expect("the UDP payload alone");
        assert_eq!((t, tp), (pkt, payload), "{}", v.name);
        let body = &udp[..udp.len() - 4];
        assert_eq!(wire::icrc(&ip, body), Ok(v.icrc), "{}", v.name);
        assert_eq!(udp[udp.len() - 4..], v.icrc.to_le_bytes(), "{}", v.name);
    }
}

#[test]
fn every_vector_re_emits_byte_for_byte() {
    for v in vectors() {
        let p = wire::parse_frame(&v.frame).expect("parses");
        let eth = EthAddrs {
            dst: v.frame[..6].try_into().unwrap(),
            src: v.frame[6..12].try_into().unwrap(),
        };
        let mut buf = [0u8; 256];
        let n = wire::emit_frame(&p.pkt, &[p.payload], &p.ip, &eth, &mut buf).expect("emits");
        assert_eq!(&buf[..n], &v.frame[..], "{}", v.name);

        // The same from the packet as the transport holds it, its payload
        // gathered from several pieces.
        let (pkt, payload, _) = expected(&v.name);
        let ip = IpUdp {
            dont_fragment: p.ip.dont_fragment,
            ..IpUdp::of(&pkt, p.ip.src_port, p.ip.ident)
        };
        let (x, y) = payload.split_at(payload.len() / 2);
        let mut buf = [0u8; 256];
        let n = wire::emit_transport(&pkt, &[x, &[], y], &ip, &mut buf).expect("emits");
        assert_eq!(&buf[..n], &v.udp_payload[..], "{}", v.name);
        assert_eq!(
            wire::emit_transport(&pkt, &[payload], &ip, &mut buf[..n - 1]),
            Err(wire::EmitError::BufferTooSmall { needed: n })
        );
    }
}

/// The BTH's FECN, BECN and resv6 byte: masked by the ICRC, so that the
/// network may set FECN and BECN.
fn in_masked_bth_byte(udp_offset: usize) -> bool {
    udp_offset == 4
}

#[test]
fn any_flipped_bit_of_a_udp_payload_is_caught_by_the_icrc() {
    for v in vectors() {
        let p = wire::parse_frame(&v.frame).expect("parses");
        let mut bytes = v.udp_payload.clone();
        for bit in 0..bytes.len() * 8 {
            let (i, b) = (bit / 8, 1u8 << (bit % 8));
            bytes[i] ^= b;
            let r = wire::parse_transport(&bytes, &p.ip);
            if in_masked_bth_byte(i) {
                let (pkt, payload) = r.expect("FECN, BECN and resv6 are not covered");
                assert_eq!((pkt, payload), (p.pkt, p.payload), "{}", v.name);
            } else {
                assert!(r.is_err(), "{}: bit {bit} flipped went unnoticed", v.name);
            }
            bytes[i] ^= b;
        }
        // The ICRC covers the IP and UDP facts too.
        let mut moved = p.ip;
        moved.src_port ^= 1;
        assert_eq!(
            wire::parse_transport(&bytes, &moved),
            Err(WireError::BadIcrc)
        );
    }
}

#[test]
fn any_flipped_bit_of_a_datagram_is_caught_but_in_the_variant_fields() {
    for v in vectors() {
        let mut d = v.frame[ETH_HDR_LEN..].to_vec();
        let ipv4 = d[0] >> 4 == 4;
        let ip_len = if ipv4 { IPV4_HDR_LEN } else { IPV6_HDR_LEN };
        let udp_csum = d[ip_len + 6..ip_len + 8] != [0, 0];
        for bit in 0..d.len() * 8 {
            let (i, b) = (bit / 8, 1u8 << (bit % 8));
            d[i] ^= b;
            let r = wire::parse_datagram(&d);
            // IPv6's traffic class, flow label and hop limit: no checksum
            // covers them and the ICRC masks them. The BTH byte the ICRC
            // masks: only a UDP checksum covers it.
            let variant = (!ipv4 && ((i == 0 && bit % 8 < 4) || (1..4).contains(&i) || i == 7))
                || (!udp_csum && i == ip_len + UDP_HDR_LEN + 4);
            if variant {
                assert!(r.is_ok(), "{}: bit {bit}: {r:?}", v.name);
            } else {
                assert!(r.is_err(), "{}: bit {bit} flipped went unnoticed", v.name);
            }
            d[i] ^= b;
        }
    }
}

#[test]
fn every_truncation_of_a_vector_is_rejected() {
    for v in vectors() {
        for n in 0..v.frame.len() {
            assert!(
                wire::parse_frame(&v.frame[..n]).is_err(),
                "{} at {n}",
                v.name
            );
        }
        let d = &v.frame[ETH_HDR_LEN..];
        for n in 0..d.len() {
            assert!(wire::parse_datagram(&d[..n]).is_err(), "{} at {n}", v.name);
        }
        let p = wire::parse_frame(&v.frame).expect("parses");
        for n in 0..v.udp_payload.len() {
            let r = wire::parse_transport(&v.udp_payload[..n], &p.ip);
            assert!(r.is_err(), "{} at {n}", v.name);
        }
    }
}

/// The pcap holds the same frames as the JSON, in order (a classic pcap
/// file, microsecond timestamps, LINKTYPE_ETHERNET); read by hand here, the
/// host crate's capture tests read it with a pcap library.
#[test]
fn the_pcap_holds_the_same_frames() {
    let pcap: &[u8] = include_bytes!("vectors/rocev2/vectors.pcap");
    let u32_at = |at: usize| u32::from_le_bytes(pcap[at..at + 4].try_into().unwrap());
    assert_eq!(u32_at(0), 0xA1B2_C3D4, "little-endian microsecond pcap");
    assert_eq!(u32_at(20), 1, "LINKTYPE_ETHERNET");
    let mut at = 24;
    for v in vectors() {
        let caplen = u32_at(at + 8) as usize;
        let frame = &pcap[at + 16..at + 16 + caplen];
        assert_eq!(frame, &v.frame[..], "{}", v.name);
        at += 16 + caplen;
    }
    assert_eq!(at, pcap.len());
}
