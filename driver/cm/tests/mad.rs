//! CM MADs: the layout against IBTA's tables (as Linux's
//! `ibta_vol1_c12.h` and Wireshark's `packet-infiniband.c` have them),
//! typed values that emit and parse back, and arbitrary bytes that never
//! panic the parser and re-emit to the same message.

use irpverbs_cm::msg::{
    self, Apr, AprStatus, ClassPortInfo, CmMsg, Drep, Dreq, Info, Lap, Mad, MadHeader, Mra,
    MraedMsg, ParseError, Path, Rej, RejReason, RejectedMsg, Rep, Req, Rtu, SidrRep, SidrReq,
    SidrStatus, TransportType, attr,
};
use proptest::prelude::*;

const H: usize = msg::MAD_HDR_SIZE;

fn gid(b: u8) -> [u8; 16] {
    core::array::from_fn(|i| b.wrapping_add(i as u8))
}

fn path(seed: u8) -> Path {
    Path {
        local_lid: 0x1100 | u16::from(seed),
        remote_lid: 0x2200 | u16::from(seed),
        local_gid: gid(seed),
        remote_gid: gid(seed.wrapping_add(0x80)),
        flow_label: 0xA_BCDE,
        packet_rate: 0x2B,
        traffic_class: 0x5C,
        hop_limit: 0x40,
        sl: 0x9,
        subnet_local: true,
        local_ack_timeout: 0x13,
    }
}

fn sample_req() -> Req {
    Req {
        local_comm_id: 0x1122_3344,
        vendor_id: 0x00AB_CDEF,
        service_id: 0x0102_0304_0506_0708,
        local_ca_guid: 0x1112_1314_1516_1718,
        local_qkey: 0x8001_0000,
        local_qpn: 0x00AB_CDEF,
        responder_resources: 0x10,
        local_eecn: 0x0012_3456,
        initiator_depth: 0x20,
        remote_eecn: 0x0065_4321,
        remote_cm_response_timeout: 0x15,
        transport: TransportType::Uc,
        end_to_end_flow_control: true,
        starting_psn: 0x0076_5432,
        local_cm_response_timeout: 0x0E,
        retry_count: 6,
        pkey: 0xFFFF,
        path_mtu: 5,
        rdc_exists: false,
        rnr_retry_count: 3,
        max_cm_retries: 0xC,
        srq: true,
        extended_transport_type: 0,
        primary: path(1),
        alternate: Some(path(2)),
        sap_supported: true,
        private_data: core::array::from_fn(|i| i as u8 + 1),
    }
}

fn bytes_of(msg: CmMsg) -> [u8; msg::MAD_SIZE] {
    Mad::new(0xDEAD_BEEF_0000_0001, msg).to_bytes()
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

#[test]
fn mad_header_layout() {
    let b = bytes_of(CmMsg::Req(sample_req()));
    assert_eq!(
        &b[..4],
        &[1, 0x07, 2, 0x03],
        "base version, class, class version, Send"
    );
    assert_eq!(&b[4..8], &[0; 4], "status, class specific");
    assert_eq!(
        &b[8..16],
        &0xDEAD_BEEF_0000_0001u64.to_be_bytes(),
        "transaction ID"
    );
    assert_eq!(&b[16..18], &[0x00, 0x10], "attribute ID: REQ");
    assert_eq!(&b[18..24], &[0; 6], "reserved, attribute modifier");
}

/// Table 106, at the offsets `ibta_vol1_c12.h` gives (plus the 24-byte
/// header).
#[test]
fn req_layout() {
    let b = bytes_of(CmMsg::Req(sample_req()));
    assert_eq!(be32(&b, H), 0x1122_3344, "local comm ID @0");
    assert_eq!(be32(&b, H + 4), 0x00AB_CDEF, "vendor ID @5 (24 bits)");
    assert_eq!(
        &b[H + 8..H + 16],
        &0x0102_0304_0506_0708u64.to_be_bytes(),
        "service ID @8"
    );
    assert_eq!(
        &b[H + 16..H + 24],
        &0x1112_1314_1516_1718u64.to_be_bytes(),
        "CA GUID @16"
    );
    assert_eq!(be32(&b, H + 28), 0x8001_0000, "Q_Key @28");
    assert_eq!(
        be32(&b, H + 32),
        0xABCD_EF10,
        "QPN @32 (24), responder resources @35"
    );
    assert_eq!(
        be32(&b, H + 36),
        0x1234_5620,
        "EECN @36, initiator depth @39"
    );
    // remote EECN, then byte 43: response timeout 0x15 (5 bits), UC (01), e2e 1.
    assert_eq!(be32(&b, H + 40), 0x6543_2100 | (0x15 << 3) | (1 << 1) | 1);
    // starting PSN, then byte 47: local response timeout 0x0E (5 bits), retry 6.
    assert_eq!(be32(&b, H + 44), 0x7654_3200 | (0x0E << 3) | 6);
    assert_eq!(&b[H + 48..H + 50], &[0xFF, 0xFF], "P_Key @48");
    assert_eq!(
        b[H + 50],
        (5 << 4) | 3,
        "MTU (4), RDC exists (1), RNR retry (3) @50"
    );
    assert_eq!(
        b[H + 51],
        (0xC << 4) | (1 << 3),
        "max CM retries (4), SRQ (1) @51"
    );
    assert_eq!(&b[H + 52..H + 54], &[0x11, 0x01], "primary local LID @52");
    assert_eq!(&b[H + 54..H + 56], &[0x22, 0x01], "primary remote LID @54");
    assert_eq!(&b[H + 56..H + 72], &gid(1), "primary local GID @56");
    assert_eq!(&b[H + 72..H + 88], &gid(0x81), "primary remote GID @72");
    assert_eq!(
        be32(&b, H + 88),
        (0xA_BCDE << 12) | 0x2B,
        "flow label (20), rate @91 (6)"
    );
    assert_eq!(b[H + 92], 0x5C, "traffic class @92");
    assert_eq!(b[H + 93], 0x40, "hop limit @93");
    assert_eq!(b[H + 94], (0x9 << 4) | (1 << 3), "SL (4), subnet local @94");
    assert_eq!(b[H + 95], 0x13 << 3, "local ACK timeout (5) @95");
    assert_eq!(&b[H + 96..H + 98], &[0x11, 0x02], "alternate local LID @96");
    assert_eq!(&b[H + 100..H + 116], &gid(2), "alternate local GID @100");
    assert_eq!(
        b[H + 139],
        (0x13 << 3) | (1 << 2),
        "alternate ACK timeout, SAP supported @139"
    );
    assert_eq!(b[H + 140], 1, "private data @140");
    assert_eq!(b[255], 92, "92 bytes of private data to the end");
}

#[test]
fn rep_rej_mra_layout() {
    let rep = Rep {
        local_comm_id: 1,
        remote_comm_id: 2,
        local_qkey: 3,
        local_qpn: 0x00CA_FE01,
        local_eecn: 0x0000_0002,
        starting_psn: 0x0012_3456,
        vendor_id: 0x00AA_BBCC,
        responder_resources: 4,
        initiator_depth: 5,
        target_ack_delay: 0x11,
        failover_accepted: 2,
        end_to_end_flow_control: true,
        rnr_retry_count: 7,
        srq: true,
        local_ca_guid: 0x0A0B_0C0D_0E0F_1011,
        private_data: [0xEE; msg::REP_PDATA],
    };
    let b = bytes_of(CmMsg::Rep(rep));
    assert_eq!(&b[16..18], &[0x00, 0x13]);
    assert_eq!(be32(&b, H + 12), 0xCAFE_01AA, "QPN @12, vendor ID high @15");
    assert_eq!(
        be32(&b, H + 16),
        0x0000_02BB,
        "EECN @16, vendor ID middle @19"
    );
    assert_eq!(
        be32(&b, H + 20),
        0x1234_56CC,
        "starting PSN @20, vendor ID low @23"
    );
    assert_eq!(
        &b[H + 24..H + 26],
        &[4, 5],
        "responder resources, initiator depth"
    );
    assert_eq!(
        b[H + 26],
        (0x11 << 3) | (2 << 1) | 1,
        "ACK delay, failover, e2e @26"
    );
    assert_eq!(b[H + 27], (7 << 5) | (1 << 4), "RNR retry, SRQ @27");
    assert_eq!(
        &b[H + 28..H + 36],
        &0x0A0B_0C0D_0E0F_1011u64.to_be_bytes(),
        "CA GUID @28"
    );
    assert_eq!(b[H + 36], 0xEE, "private data @36");

    let rej = Rej {
        local_comm_id: 7,
        remote_comm_id: 8,
        msg_rejected: RejectedMsg::Rep,
        reason: RejReason::CONSUMER_REJECT,
        ari: Info::new(&[9, 9, 9]).unwrap(),
        private_data: [0x77; msg::REJ_PDATA],
    };
    let b = bytes_of(CmMsg::Rej(rej));
    assert_eq!(b[H + 8], 1 << 6, "message REJected @8 (2 bits)");
    assert_eq!(b[H + 9], 3 << 1, "reject info length @9 (7 bits)");
    assert_eq!(&b[H + 10..H + 12], &[0, 28], "reason @10");
    assert_eq!(&b[H + 12..H + 16], &[9, 9, 9, 0], "ARI @12");
    assert_eq!(b[H + 84], 0x77, "private data @84");

    let mra = Mra {
        local_comm_id: 1,
        remote_comm_id: 2,
        msg_mraed: MraedMsg::Lap,
        service_timeout: 0x1F,
        private_data: [0x55; msg::MRA_PDATA],
    };
    let b = bytes_of(CmMsg::Mra(mra));
    assert_eq!(b[H + 8], 2 << 6, "message MRAed @8");
    assert_eq!(b[H + 9], 0x1F << 3, "service timeout @9");
    assert_eq!(b[H + 10], 0x55, "private data @10");
}

#[test]
fn lap_apr_sidr_dreq_layout() {
    let lap = Lap {
        local_comm_id: 1,
        remote_comm_id: 2,
        remote_qpn: 0x00AB_CDEF,
        remote_cm_response_timeout: 0x12,
        alternate: path(3),
        private_data: [0x44; msg::LAP_PDATA],
    };
    let b = bytes_of(CmMsg::Lap(lap));
    assert_eq!(
        be32(&b, H + 12),
        0xABCD_EF00 | (0x12 << 3),
        "QPN @12, response timeout @15"
    );
    assert_eq!(&b[H + 20..H + 22], &[0x11, 0x03], "alternate local LID @20");
    assert_eq!(&b[H + 24..H + 40], &gid(3), "alternate local GID @24");
    assert_eq!(
        be32(&b, H + 56),
        (0xA_BCDE << 12) | 0x5C,
        "flow label @56, traffic class @59"
    );
    assert_eq!(b[H + 60], 0x40, "hop limit @60");
    assert_eq!(b[H + 61], 0x2B, "packet rate @61 (low 6 bits)");
    assert_eq!(b[H + 62], (0x9 << 4) | (1 << 3), "SL, subnet local @62");
    assert_eq!(b[H + 63], 0x13 << 3, "ACK timeout @63");
    assert_eq!(b[H + 64], 0x44, "private data @64");

    let apr = Apr {
        local_comm_id: 1,
        remote_comm_id: 2,
        status: AprStatus::IS_CURRENT,
        info: Info::new(&[1, 2]).unwrap(),
        private_data: [0x33; msg::APR_PDATA],
    };
    let b = bytes_of(CmMsg::Apr(apr));
    assert_eq!(&b[H + 8..H + 10], &[2, 5], "info length @8, status @9");
    assert_eq!(&b[H + 12..H + 14], &[1, 2], "info @12");
    assert_eq!(b[H + 84], 0x33, "private data @84");

    let req = SidrReq {
        request_id: 0x0102_0304,
        pkey: 0x8001,
        service_id: 0x1122_3344_5566_7788,
        private_data: [0x22; msg::SIDR_REQ_PDATA],
    };
    let b = bytes_of(CmMsg::SidrReq(req));
    assert_eq!(&b[16..18], &[0x00, 0x17]);
    assert_eq!(&b[H + 4..H + 6], &[0x80, 0x01], "P_Key @4");
    assert_eq!(
        &b[H + 8..H + 16],
        &0x1122_3344_5566_7788u64.to_be_bytes(),
        "service ID @8"
    );
    assert_eq!(b[H + 16], 0x22, "private data @16");

    let rep = SidrRep {
        request_id: 1,
        status: SidrStatus::REDIRECT,
        vendor_id: 0x00AB_CDEF,
        qpn: 0x0012_3456,
        service_id: 0x99,
        qkey: 0x1234_5678,
        info: Info::new(&[7; 72]).unwrap(),
        private_data: [0x11; msg::SIDR_REP_PDATA],
    };
    let b = bytes_of(CmMsg::SidrRep(rep));
    assert_eq!(
        &b[H + 4..H + 8],
        &[4, 72, 0xAB, 0xCD],
        "status, info length, vendor ID high"
    );
    assert_eq!(be32(&b, H + 8), 0x1234_56EF, "QPN @8, vendor ID low @11");
    assert_eq!(&b[H + 12..H + 20], &0x99u64.to_be_bytes(), "service ID @12");
    assert_eq!(be32(&b, H + 20), 0x1234_5678, "Q_Key @20");
    assert_eq!(b[H + 24], 7, "info @24");
    assert_eq!(b[H + 96], 0x11, "private data @96");

    let dreq = Dreq {
        local_comm_id: 1,
        remote_comm_id: 2,
        remote_qpn: 0x00FE_DCBA,
        private_data: [0x66; msg::DREQ_PDATA],
    };
    let b = bytes_of(CmMsg::Dreq(dreq));
    assert_eq!(be32(&b, H + 8), 0xFEDC_BA00, "remote QPN @8");
    assert_eq!(b[H + 12], 0x66, "private data @12");
}

#[test]
fn class_port_info_answers_get() {
    let cpi = ClassPortInfo {
        base_version: 1,
        class_version: 2,
        capability_mask: 0x0102,
        capability_mask2: 0x7FF_FFFF,
        resp_time_value: 0x12,
        redirect_gid: gid(9),
        redirect_tc: 0xAB,
        redirect_sl: 0xC,
        redirect_fl: 0xF_EDCB,
        redirect_qp: 0x00AB_CDEF,
        trap_hl: 0x40,
        trap_qp: 1,
        ..ClassPortInfo::default()
    };
    let b = bytes_of(CmMsg::ClassPortInfo(cpi));
    assert_eq!(b[3], msg::METHOD_GET_RESP);
    assert_eq!(&b[H..H + 4], &[1, 2, 1, 2]);
    assert_eq!(
        be32(&b, H + 4),
        (0x7FF_FFFF << 5) | 0x12,
        "CapabilityMask2, RespTimeValue"
    );
    assert_eq!(be32(&b, H + 24), 0xABCF_EDCB, "TC, SL, FL");
    assert_eq!(be32(&b, H + 32), 0x00AB_CDEF, "redirect QP");
    assert_eq!(be32(&b, H + 64), 0x4000_0001, "trap HL, QP");
    assert_eq!(msg::parse(&b).unwrap().msg, CmMsg::ClassPortInfo(cpi));
}

#[test]
fn bad_headers_and_fields() {
    let good = bytes_of(CmMsg::Req(sample_req()));
    assert!(msg::parse(&good).is_ok());
    assert_eq!(msg::parse(&good[..255]), Err(ParseError::Length));
    let mut long = good.to_vec();
    long.push(0);
    assert_eq!(msg::parse(&long), Err(ParseError::Length));
    let with = |i: usize, v: u8| {
        let mut b = good;
        b[i] = v;
        msg::parse(&b)
    };
    assert_eq!(with(0, 2), Err(ParseError::BaseVersion));
    assert_eq!(with(1, 0x04), Err(ParseError::NotCm));
    assert_eq!(with(2, 1), Err(ParseError::ClassVersion));
    assert_eq!(with(3, msg::METHOD_GET), Err(ParseError::Method));
    assert_eq!(with(17, 0x1B), Err(ParseError::Attribute));
    assert_eq!(with(17, 0x02), Err(ParseError::Attribute));

    let rej = |b8: u8, b9: u8| {
        let mut b = bytes_of(CmMsg::Rtu(Rtu {
            local_comm_id: 1,
            remote_comm_id: 2,
            private_data: [0; msg::RTU_PDATA],
        }));
        b[17] = attr::REJ as u8;
        b[H + 8] = b8;
        b[H + 9] = b9;
        msg::parse(&b)
    };
    assert!(rej(2 << 6, 72 << 1).is_ok());
    assert!(matches!(rej(3 << 6, 0), Err(ParseError::Field(_))));
    assert!(matches!(rej(0, 73 << 1), Err(ParseError::Field(_))));
    let mut b = bytes_of(CmMsg::Mra(Mra {
        local_comm_id: 1,
        remote_comm_id: 2,
        msg_mraed: MraedMsg::Req,
        service_timeout: 1,
        private_data: [0; msg::MRA_PDATA],
    }));
    b[H + 8] = 3 << 6;
    assert!(matches!(msg::parse(&b), Err(ParseError::Field(_))));
}

#[test]
fn every_reason_and_status_round_trips() {
    for reason in RejReason::ALL {
        let rej = Rej {
            local_comm_id: 1,
            remote_comm_id: 2,
            msg_rejected: RejectedMsg::Other,
            reason,
            ari: Info::EMPTY,
            private_data: [0; msg::REJ_PDATA],
        };
        let m = msg::parse(&bytes_of(CmMsg::Rej(rej))).unwrap();
        assert_eq!(m.msg, CmMsg::Rej(rej));
    }
    assert_eq!(RejReason::ALL.len(), 34, "1 to 33 and 35");
}

// ---------------------------------------------------------------- properties

fn bits(n: u32) -> impl Strategy<Value = u32> {
    0..(1u32 << n)
}

fn bits8(n: u32) -> impl Strategy<Value = u8> {
    (0..(1u32 << n)).prop_map(|v| v as u8)
}

fn arr<const N: usize>() -> impl Strategy<Value = [u8; N]> {
    proptest::collection::vec(any::<u8>(), N).prop_map(|v| v.try_into().unwrap())
}

fn info() -> impl Strategy<Value = Info> {
    proptest::collection::vec(any::<u8>(), 0..=72).prop_map(|v| Info::new(&v).unwrap())
}

prop_compose! {
    fn arb_path()(
        local_lid in any::<u16>(), remote_lid in any::<u16>(),
        local_gid in arr::<16>(), remote_gid in arr::<16>(),
        flow_label in bits(20), packet_rate in bits8(6), traffic_class in any::<u8>(),
        hop_limit in any::<u8>(), sl in bits8(4), subnet_local in any::<bool>(),
        local_ack_timeout in bits8(5),
    ) -> Path {
        Path { local_lid, remote_lid, local_gid, remote_gid, flow_label, packet_rate,
            traffic_class, hop_limit, sl, subnet_local, local_ack_timeout }
    }
}

prop_compose! {
    fn req_ids()(
        local_comm_id in any::<u32>(), vendor_id in bits(24), service_id in any::<u64>(),
        local_ca_guid in any::<u64>(), local_qkey in any::<u32>(), local_qpn in bits(24),
        responder_resources in any::<u8>(), local_eecn in bits(24),
        initiator_depth in any::<u8>(), remote_eecn in bits(24),
    ) -> (u32, u32, u64, u64, u32, u32, u8, u32, u8, u32) {
        (local_comm_id, vendor_id, service_id, local_ca_guid, local_qkey, local_qpn,
            responder_resources, local_eecn, initiator_depth, remote_eecn)
    }
}

prop_compose! {
    fn arb_req()(
        ids in req_ids(),
        t in (bits8(5), bits8(2), any::<bool>(), bits(24), bits8(5), bits8(3), any::<u16>()),
        u in (bits8(4), any::<bool>(), bits8(3), bits8(4), any::<bool>(), bits8(3), any::<bool>()),
        primary in arb_path(),
        alternate in proptest::option::of(arb_path().prop_filter("an absent path is zero", |p| !p.is_zero())),
        private_data in arr::<92>(),
    ) -> Req {
        Req {
            local_comm_id: ids.0, vendor_id: ids.1, service_id: ids.2, local_ca_guid: ids.3,
            local_qkey: ids.4, local_qpn: ids.5, responder_resources: ids.6, local_eecn: ids.7,
            initiator_depth: ids.8, remote_eecn: ids.9,
            remote_cm_response_timeout: t.0, transport: TransportType::from_bits(t.1),
            end_to_end_flow_control: t.2, starting_psn: t.3, local_cm_response_timeout: t.4,
            retry_count: t.5, pkey: t.6,
            path_mtu: u.0, rdc_exists: u.1, rnr_retry_count: u.2, max_cm_retries: u.3, srq: u.4,
            extended_transport_type: u.5, sap_supported: u.6,
            primary, alternate, private_data,
        }
    }
}

prop_compose! {
    fn arb_rep()(
        ids in (any::<u32>(), any::<u32>(), any::<u32>(), bits(24), bits(24), bits(24), bits(24)),
        f in (any::<u8>(), any::<u8>(), bits8(5), bits8(2), any::<bool>(), bits8(3), any::<bool>()),
        local_ca_guid in any::<u64>(),
        private_data in arr::<196>(),
    ) -> Rep {
        Rep {
            local_comm_id: ids.0, remote_comm_id: ids.1, local_qkey: ids.2, local_qpn: ids.3,
            local_eecn: ids.4, starting_psn: ids.5, vendor_id: ids.6,
            responder_resources: f.0, initiator_depth: f.1, target_ack_delay: f.2,
            failover_accepted: f.3, end_to_end_flow_control: f.4, rnr_retry_count: f.5, srq: f.6,
            local_ca_guid, private_data,
        }
    }
}

fn arb_rej() -> impl Strategy<Value = Rej> {
    (
        any::<u32>(),
        any::<u32>(),
        0..3u8,
        any::<u16>(),
        info(),
        arr::<148>(),
    )
        .prop_map(|(l, r, m, reason, ari, private_data)| Rej {
            local_comm_id: l,
            remote_comm_id: r,
            msg_rejected: [RejectedMsg::Req, RejectedMsg::Rep, RejectedMsg::Other][m as usize],
            reason: RejReason(reason),
            ari,
            private_data,
        })
}

fn arb_mra() -> impl Strategy<Value = Mra> {
    (any::<u32>(), any::<u32>(), 0..3u8, bits8(5), arr::<222>()).prop_map(|(l, r, m, t, pd)| Mra {
        local_comm_id: l,
        remote_comm_id: r,
        msg_mraed: [MraedMsg::Req, MraedMsg::Rep, MraedMsg::Lap][m as usize],
        service_timeout: t,
        private_data: pd,
    })
}

fn arb_lap() -> impl Strategy<Value = Lap> {
    (
        any::<u32>(),
        any::<u32>(),
        bits(24),
        bits8(5),
        arb_path(),
        arr::<168>(),
    )
        .prop_map(|(l, r, q, t, alternate, private_data)| Lap {
            local_comm_id: l,
            remote_comm_id: r,
            remote_qpn: q,
            remote_cm_response_timeout: t,
            alternate,
            private_data,
        })
}

fn arb_cpi() -> impl Strategy<Value = ClassPortInfo> {
    (
        (
            any::<u8>(),
            any::<u8>(),
            any::<u16>(),
            bits(27),
            bits8(5),
            arr::<16>(),
        ),
        (
            any::<u8>(),
            bits8(4),
            bits(20),
            any::<u16>(),
            any::<u16>(),
            bits(24),
            any::<u32>(),
        ),
        (
            arr::<16>(),
            any::<u8>(),
            bits8(4),
            bits(20),
            any::<u16>(),
            any::<u16>(),
        ),
        (any::<u8>(), bits(24), any::<u32>()),
    )
        .prop_map(|(a, b, c, d)| ClassPortInfo {
            base_version: a.0,
            class_version: a.1,
            capability_mask: a.2,
            capability_mask2: a.3,
            resp_time_value: a.4,
            redirect_gid: a.5,
            redirect_tc: b.0,
            redirect_sl: b.1,
            redirect_fl: b.2,
            redirect_lid: b.3,
            redirect_pkey: b.4,
            redirect_qp: b.5,
            redirect_qkey: b.6,
            trap_gid: c.0,
            trap_tc: c.1,
            trap_sl: c.2,
            trap_fl: c.3,
            trap_lid: c.4,
            trap_pkey: c.5,
            trap_hl: d.0,
            trap_qp: d.1,
            trap_qkey: d.2,
        })
}

fn arb_msg() -> impl Strategy<Value = CmMsg> {
    prop_oneof![
        arb_req().prop_map(CmMsg::Req),
        arb_rep().prop_map(CmMsg::Rep),
        arb_rej().prop_map(CmMsg::Rej),
        arb_mra().prop_map(CmMsg::Mra),
        arb_lap().prop_map(CmMsg::Lap),
        arb_cpi().prop_map(CmMsg::ClassPortInfo),
        (any::<u32>(), any::<u32>(), arr::<224>()).prop_map(|(l, r, p)| CmMsg::Rtu(Rtu {
            local_comm_id: l,
            remote_comm_id: r,
            private_data: p
        })),
        (any::<u32>(), any::<u32>(), arr::<224>()).prop_map(|(l, r, p)| CmMsg::Drep(Drep {
            local_comm_id: l,
            remote_comm_id: r,
            private_data: p
        })),
        (any::<u32>(), any::<u32>(), bits(24), arr::<220>()).prop_map(|(l, r, q, p)| {
            CmMsg::Dreq(Dreq {
                local_comm_id: l,
                remote_comm_id: r,
                remote_qpn: q,
                private_data: p,
            })
        }),
        (
            any::<u32>(),
            any::<u32>(),
            any::<u8>(),
            info(),
            arr::<148>()
        )
            .prop_map(|(l, r, s, info, p)| CmMsg::Apr(Apr {
                local_comm_id: l,
                remote_comm_id: r,
                status: AprStatus(s),
                info,
                private_data: p
            })),
        (any::<u32>(), any::<u16>(), any::<u64>(), arr::<216>()).prop_map(|(i, k, s, p)| {
            CmMsg::SidrReq(SidrReq {
                request_id: i,
                pkey: k,
                service_id: s,
                private_data: p,
            })
        }),
        (
            (any::<u32>(), any::<u8>(), bits(24), bits(24)),
            (any::<u64>(), any::<u32>(), info(), arr::<136>())
        )
            .prop_map(|(a, b)| CmMsg::SidrRep(SidrRep {
                request_id: a.0,
                status: SidrStatus(a.1),
                vendor_id: a.2,
                qpn: a.3,
                service_id: b.0,
                qkey: b.1,
                info: b.2,
                private_data: b.3,
            })),
    ]
}

/// MAD-looking bytes: a valid CM header (any attribute) over random bytes
/// half of the time, anything the other half.
fn mad_bytes() -> impl Strategy<Value = Vec<u8>> {
    (
        proptest::collection::vec(any::<u8>(), 256),
        any::<bool>(),
        0x0010u16..=0x001B,
    )
        .prop_map(|(mut b, header, a)| {
            if header {
                b[..4].copy_from_slice(&[1, 0x07, 2, 0x03]);
                b[16..18].copy_from_slice(&a.to_be_bytes());
            }
            b
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn typed_messages_emit_and_parse_back(msg in arb_msg(), tid in any::<u64>()) {
        let mad = Mad::new(tid, msg);
        let parsed = msg::parse(&mad.to_bytes()).unwrap();
        prop_assert_eq!(parsed, mad);
    }

    #[test]
    fn any_bytes_parse_without_panic_and_re_emit(b in mad_bytes()) {
        if let Ok(m) = msg::parse(&b) {
            let again = msg::parse(&m.to_bytes()).unwrap();
            prop_assert_eq!(again, m);
            prop_assert_eq!(m.hdr.attr_id, m.msg.attr_id());
        }
    }

    #[test]
    fn any_length_is_checked(b in proptest::collection::vec(any::<u8>(), 0..600)) {
        let r = msg::parse(&b);
        if b.len() != msg::MAD_SIZE {
            prop_assert_eq!(r, Err(ParseError::Length));
        }
    }

    #[test]
    fn header_fields_round_trip(method in any::<u8>(), status in any::<u16>(), cs in any::<u16>(),
                                tid in any::<u64>(), am in any::<u32>()) {
        let mut m = Mad::new(tid, CmMsg::Rtu(Rtu {
            local_comm_id: 1, remote_comm_id: 2, private_data: [0; msg::RTU_PDATA] }));
        m.hdr = MadHeader { method, status, class_specific: cs, attr_mod: am, ..m.hdr };
        let r = msg::parse(&m.to_bytes());
        if method == msg::METHOD_SEND {
            prop_assert_eq!(r, Ok(m));
        } else {
            prop_assert_eq!(r, Err(ParseError::Method));
        }
    }
}

// ---- the fuzz target's seed corpus and engine reset ----------------------

/// The seed corpus of `driver/cm/fuzz` (`seeds/parse/`): valid MADs of
/// every message type, drawn from [`arb_msg`] with a fixed seed, named by
/// type. `IRPVERBS_WRITE_CORPUS=1 cargo test -p irpverbs-cm --test mad
/// fuzz_seed_corpus` writes them; otherwise the test checks that the
/// committed files are these.
fn corpus() -> Vec<(String, [u8; msg::MAD_SIZE])> {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]);
    let mut runner = TestRunner::new_with_rng(Config::default(), rng);
    let mut out = Vec::new();
    let mut per_type = std::collections::BTreeMap::new();
    let mut tid = 0x5EED_0000_0000_0000u64;
    while per_type.len() < 12 || per_type.values().any(|&n: &usize| n < 3) {
        let msg = arb_msg().new_tree(&mut runner).unwrap().current();
        let id = msg.attr_id();
        let n = per_type.entry(id).or_insert(0);
        if *n == 3 {
            continue;
        }
        *n += 1;
        tid += 1;
        out.push((format!("{id:#06x}-{n}"), Mad::new(tid, msg).to_bytes()));
    }
    out.sort();
    out
}

#[test]
fn fuzz_seed_corpus_covers_every_message_and_is_committed() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/parse");
    let want = corpus();
    assert_eq!(want.len(), 36, "three MADs of each of the 12 types");
    if std::env::var_os("IRPVERBS_WRITE_CORPUS").is_some() {
        std::fs::create_dir_all(&dir).unwrap();
        for (name, bytes) in &want {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
    }
    for (name, bytes) in &want {
        let got = std::fs::read(dir.join(name))
            .unwrap_or_else(|e| panic!("{name}: {e} (IRPVERBS_WRITE_CORPUS=1 writes the corpus)"));
        assert_eq!(&got[..], &bytes[..], "{name} is stale");
        assert_eq!(msg::parse(&got).unwrap().to_bytes(), *bytes, "{name}");
    }
}

/// The engine's state after a script of inputs: what it sent and counted.
fn script(e: &mut irpverbs_cm::Engine, inputs: &[[u8; msg::MAD_SIZE]]) -> String {
    use irpverbs_cm::MadAddr;
    let l = e.create(0).unwrap();
    let listen = e.listen(l, sample_req().service_id);
    for (k, m) in inputs.iter().enumerate() {
        let _ = e.receive(k as u64, &MadAddr::default(), m);
    }
    e.on_timer(u64::MAX);
    let mut out = format!("{l:?} {listen:?} {:?}", e.stats());
    while let Some(t) = e.poll_transmit() {
        out.push_str(&format!(" {:?}", &t.mad[..]));
    }
    while let Some((id, _)) = e.poll_ready() {
        while let Some(ev) = e.poll_event(id) {
            out.push_str(&format!(" {id:?} {ev:?}"));
        }
    }
    out
}

/// `Engine::reset` leaves an engine that behaves as a new one: the fuzz
/// target resets one engine per input instead of building one.
#[test]
fn a_reset_engine_behaves_as_a_new_one() {
    let inputs: Vec<_> = corpus().into_iter().map(|(_, b)| b).collect();
    let cfg = irpverbs_cm::Config::new(0x0002_C903_0000_0001);
    let req = [bytes_of(CmMsg::Req(sample_req()))];
    let fresh = script(&mut irpverbs_cm::Engine::new(cfg), &req);
    let mut e = irpverbs_cm::Engine::new(cfg);
    let _ = script(&mut e, &inputs);
    let _ = script(&mut e, &req);
    e.reset();
    assert_eq!(script(&mut e, &req), fresh);
}
