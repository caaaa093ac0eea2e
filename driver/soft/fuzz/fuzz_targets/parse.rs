//! Arbitrary bytes as an Ethernet frame, an IP datagram and a RoCEv2 UDP
//! payload: parsing never panics, and what parses re-emits to bytes that
//! parse to the same packet.
#![no_main]

use irpverbs_soft::wire::{self, IpUdp, Parsed};
use libfuzzer_sys::fuzz_target;

fn re_emits(p: &Parsed<'_>) {
    let mut buf = [0u8; 0x1_0000];
    let n =
        wire::emit_datagram(&p.pkt, &[p.payload], &p.ip, &mut buf).expect("a parsed packet emits");
    let q = wire::parse_datagram(&buf[..n]).expect("an emitted packet parses");
    assert_eq!((q.pkt, q.payload), (p.pkt, p.payload));
}

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = wire::parse_frame(data) {
        re_emits(&p);
    }
    if let Ok(p) = wire::parse_datagram(data) {
        re_emits(&p);
    }
    let mut ip = IpUdp::default();
    ip.src[0] = 0xFD;
    ip.dst[0] = 0xFD;
    let _ = wire::parse_transport(data, &ip);
});
