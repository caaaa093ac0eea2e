//! The datagram around a transport packet: IPv4 (RFC 791) or IPv6
//! (RFC 8200), UDP (RFC 768) to port 4791, and Ethernet II for captures.
//!
//! Sent: IPv4 without options, DF as [`IpUdp::dont_fragment`] says, the
//! header checksum computed, the UDP checksum computed or 0 (none: the
//! ICRC protects the transport) as [`IpUdp::udp_checksum`] says; IPv6
//! without extension headers, the UDP checksum computed (RFC 8200 requires
//! one). Received: the same, and a UDP checksum is checked when it is not
//! 0.

use zerocopy::byteorder::network_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::transport::{emit_transport, parse_transport, transport_len};
use super::{EmitError, Family, ICRC_LEN, IpUdp, ROCE_PORT, WireError, is_ipv4_mapped};
use crate::wire::packet::{Gid, Packet};

/// The RoCEv2 GID of an IP address: IPv4-mapped for IPv4.
pub(crate) fn ip_gid(ip: core::net::IpAddr) -> Gid {
    match ip {
        core::net::IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        core::net::IpAddr::V6(v6) => v6.octets(),
    }
}

/// Bytes of an IPv4 header without options.
pub const IPV4_HDR_LEN: usize = 20;
/// Bytes of an IPv6 header.
pub const IPV6_HDR_LEN: usize = 40;
/// Bytes of a UDP header.
pub const UDP_HDR_LEN: usize = 8;
/// Bytes of an Ethernet II header (no VLAN tag).
pub const ETH_HDR_LEN: usize = 14;

/// EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// EtherType of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86DD;
/// EtherType of an 802.1Q VLAN tag.
pub const ETHERTYPE_VLAN: u16 = 0x8100;
/// IP protocol number of UDP.
pub const IPPROTO_UDP: u8 = 17;

/// IPv4 flags and fragment offset: don't fragment.
const IPV4_DF: u16 = 0x4000;
/// IPv4 flags and fragment offset: more fragments, and the offset.
const IPV4_FRAGMENT: u16 = 0x3FFF;
/// The largest IP datagram (IPv4) or UDP datagram (both).
const MAX_LEN: usize = 0xFFFF;

/// IPv4 header without options.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ipv4Hdr {
    /// Version (4) and header length in words (5).
    pub ver_ihl: u8,
    /// Type of service (DSCP, ECN).
    pub tos: u8,
    /// Total length.
    pub total_len: U16,
    /// Identification.
    pub ident: U16,
    /// Flags and fragment offset.
    pub frag: U16,
    /// Time to live.
    pub ttl: u8,
    /// Protocol.
    pub proto: u8,
    /// Header checksum.
    pub csum: U16,
    /// Source address.
    pub src: [u8; 4],
    /// Destination address.
    pub dst: [u8; 4],
}

/// IPv6 header.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ipv6Hdr {
    /// Version (6), traffic class, flow label.
    pub vtf: U32,
    /// Payload length.
    pub payload_len: U16,
    /// Next header.
    pub next: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Source address.
    pub src: [u8; 16],
    /// Destination address.
    pub dst: [u8; 16],
}

/// UDP header.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UdpHdr {
    /// Source port.
    pub src_port: U16,
    /// Destination port.
    pub dst_port: U16,
    /// Length of header and payload.
    pub len: U16,
    /// Checksum (0: none).
    pub csum: U16,
}

/// Ethernet II header.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EthHdr {
    /// Destination MAC.
    pub dst: [u8; 6],
    /// Source MAC.
    pub src: [u8; 6],
    /// EtherType.
    pub ethertype: U16,
}

/// The MAC addresses of an Ethernet frame.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EthAddrs {
    /// Source MAC.
    pub src: [u8; 6],
    /// Destination MAC.
    pub dst: [u8; 6],
}

/// A received packet: the transport packet (with the addresses, traffic
/// class, flow label and hop limit of its IP header), its payload (without
/// pad), borrowed from the bytes parsed, and the datagram's IP and UDP
/// facts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Parsed<'a> {
    /// The packet.
    pub pkt: Packet,
    /// Its payload bytes.
    pub payload: &'a [u8],
    /// The IP and UDP headers' facts.
    pub ip: IpUdp,
}

/// The UDP length of a datagram over `family` whose transport bytes before
/// the ICRC are `transport` long; `None` over 65535 bytes of UDP (or of
/// IPv4 datagram).
pub(crate) fn udp_len_of(family: Family, transport: usize) -> Option<u16> {
    let udp = UDP_HDR_LEN.checked_add(transport)?.checked_add(ICRC_LEN)?;
    let ip = match family {
        Family::V4 => udp + IPV4_HDR_LEN,
        Family::V6 => udp,
    };
    if ip > MAX_LEN {
        return None;
    }
    u16::try_from(udp).ok()
}

fn v4_addr(gid: &Gid) -> [u8; 4] {
    [gid[12], gid[13], gid[14], gid[15]]
}

fn mapped(a: [u8; 4]) -> Gid {
    let mut g = [0u8; 16];
    g[10] = 0xFF;
    g[11] = 0xFF;
    g[12..].copy_from_slice(&a);
    g
}

/// The IPv4 header of a datagram of `udp_len` UDP bytes, checksum 0.
pub(crate) fn v4_hdr(ip: &IpUdp, udp_len: u16) -> Ipv4Hdr {
    Ipv4Hdr {
        ver_ihl: 0x45,
        tos: ip.traffic_class,
        total_len: U16::new(udp_len.wrapping_add(IPV4_HDR_LEN as u16)),
        ident: U16::new(ip.ident),
        frag: U16::new(if ip.dont_fragment { IPV4_DF } else { 0 }),
        ttl: ip.hop_limit,
        proto: IPPROTO_UDP,
        csum: U16::ZERO,
        src: v4_addr(&ip.src),
        dst: v4_addr(&ip.dst),
    }
}

/// The IPv6 header of a datagram of `udp_len` UDP bytes.
pub(crate) fn v6_hdr(ip: &IpUdp, udp_len: u16) -> Ipv6Hdr {
    let vtf = (6 << 28) | (u32::from(ip.traffic_class) << 20) | (ip.flow_label & 0xF_FFFF);
    Ipv6Hdr {
        vtf: U32::new(vtf),
        payload_len: U16::new(udp_len),
        next: IPPROTO_UDP,
        hop_limit: ip.hop_limit,
        src: ip.src,
        dst: ip.dst,
    }
}

/// The UDP header of `ip`, `udp_len` bytes, checksum 0.
pub(crate) fn udp_hdr(ip: &IpUdp, udp_len: u16) -> UdpHdr {
    UdpHdr {
        src_port: U16::new(ip.src_port),
        dst_port: U16::new(ip.dst_port),
        len: U16::new(udp_len),
        csum: U16::ZERO,
    }
}

/// Adds `bytes` as big-endian 16-bit words (a last odd byte padded with
/// zero) to the one's complement sum `acc`, not yet folded.
fn sum16(acc: u64, bytes: &[u8]) -> u64 {
    let mut words = bytes.chunks_exact(2);
    let mut s = acc;
    for w in &mut words {
        s += u64::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [last] = words.remainder() {
        s += u64::from(*last) << 8;
    }
    s
}

/// Folds a sum to 16 bits.
fn fold(mut s: u64) -> u16 {
    while s > 0xFFFF {
        s = (s & 0xFFFF) + (s >> 16);
    }
    #[allow(clippy::cast_possible_truncation)]
    let v = s as u16;
    v
}

/// The sum of the pseudo-header of a UDP datagram (RFC 768, RFC 8200).
fn pseudo(family: Family, src: &Gid, dst: &Gid, udp_len: u16) -> u64 {
    let s = match family {
        Family::V4 => sum16(sum16(0, &v4_addr(src)), &v4_addr(dst)),
        Family::V6 => sum16(sum16(0, src), dst),
    };
    s + u64::from(udp_len) + u64::from(IPPROTO_UDP)
}

/// Writes the IPv4 header (with its checksum) or the IPv6 header of a
/// datagram carrying `udp_len` bytes of UDP (header included) at the start
/// of `buf`, IPv4 when both addresses of `ip` are IPv4-mapped. Returns its
/// length ([`IPV4_HDR_LEN`] or [`IPV6_HDR_LEN`]).
///
/// # Errors
///
/// [`EmitError::MixedFamilies`] for one IPv4-mapped address and one not;
/// [`EmitError::TooLong`] past 65535 bytes; [`EmitError::OutOfRange`] for
/// a flow label over 20 bits (IPv6); [`EmitError::BufferTooSmall`].
pub fn emit_ip_header(ip: &IpUdp, udp_len: usize, buf: &mut [u8]) -> Result<usize, EmitError> {
    let family = ip.family().ok_or(EmitError::MixedFamilies)?;
    let hdr_len = match family {
        Family::V4 => IPV4_HDR_LEN,
        Family::V6 => IPV6_HDR_LEN,
    };
    let udp = u16::try_from(udp_len).map_err(|_| EmitError::TooLong)?;
    if family == Family::V4 && udp_len + IPV4_HDR_LEN > MAX_LEN {
        return Err(EmitError::TooLong);
    }
    if family == Family::V6 && ip.flow_label > 0xF_FFFF {
        return Err(EmitError::OutOfRange);
    }
    let out = buf
        .get_mut(..hdr_len)
        .ok_or(EmitError::BufferTooSmall { needed: hdr_len })?;
    match family {
        Family::V4 => {
            let mut h = v4_hdr(ip, udp);
            h.csum.set(!fold(sum16(0, h.as_bytes())));
            out.copy_from_slice(h.as_bytes());
        }
        Family::V6 => out.copy_from_slice(v6_hdr(ip, udp).as_bytes()),
    }
    Ok(hdr_len)
}

/// Writes `pkt` with its payload `payload` (pieces gathered in order) as an
/// IP datagram into `buf`: the IP header of [`emit_ip_header`], the UDP
/// header of `ip` (the IP header's addresses, traffic class, flow label and
/// hop limit are `ip`'s, not `pkt`'s: see [`IpUdp::of`]), and the transport
/// packet of [`emit_transport`]. Returns the datagram's length.
///
/// # Errors
///
/// Those of [`emit_transport`] and [`emit_ip_header`];
/// [`EmitError::BufferTooSmall`] with the whole datagram's length.
pub fn emit_datagram(
    pkt: &Packet,
    payload: &[&[u8]],
    ip: &IpUdp,
    buf: &mut [u8],
) -> Result<usize, EmitError> {
    let tlen = transport_len(pkt)?;
    around(ip, tlen, buf, |t| {
        emit_transport(pkt, payload, ip, t).map(|_| ())
    })
}

/// Writes the IP and UDP headers of `ip` around `transport`, a UDP payload
/// taken as it is (a captured or received packet, valid or not) into
/// `buf`. Returns the datagram's length.
///
/// # Errors
///
/// Those of [`emit_ip_header`]; [`EmitError::TooLong`] for a payload
/// shorter than an ICRC or too long for a datagram;
/// [`EmitError::BufferTooSmall`].
pub fn emit_datagram_raw(ip: &IpUdp, transport: &[u8], buf: &mut [u8]) -> Result<usize, EmitError> {
    around(ip, transport.len(), buf, |t| {
        t.copy_from_slice(transport);
        Ok(())
    })
}

/// The IP and UDP headers of `ip` around `tlen` transport bytes that
/// `fill` writes (the UDP checksum computed over them when `ip` asks for
/// one).
fn around(
    ip: &IpUdp,
    tlen: usize,
    buf: &mut [u8],
    fill: impl FnOnce(&mut [u8]) -> Result<(), EmitError>,
) -> Result<usize, EmitError> {
    let family = ip.family().ok_or(EmitError::MixedFamilies)?;
    let before_icrc = tlen.checked_sub(ICRC_LEN).ok_or(EmitError::TooLong)?;
    let udp_len = udp_len_of(family, before_icrc).ok_or(EmitError::TooLong)?;
    let hdr_len = match family {
        Family::V4 => IPV4_HDR_LEN,
        Family::V6 => IPV6_HDR_LEN,
    };
    let total = hdr_len + usize::from(udp_len);
    let out = buf
        .get_mut(..total)
        .ok_or(EmitError::BufferTooSmall { needed: total })?;
    let (iph, udp) = out.split_at_mut(hdr_len);
    emit_ip_header(ip, usize::from(udp_len), iph)?;
    let (udph, transport) = udp.split_at_mut(UDP_HDR_LEN);
    fill(transport)?;
    let mut h = udp_hdr(ip, udp_len);
    if family == Family::V6 || ip.udp_checksum {
        let s = sum16(pseudo(family, &ip.src, &ip.dst, udp_len), h.as_bytes());
        let c = !fold(sum16(s, transport));
        h.csum.set(if c == 0 { 0xFFFF } else { c });
    }
    udph.copy_from_slice(h.as_bytes());
    Ok(total)
}

/// Writes `pkt` as an Ethernet II frame into `buf`: the MAC addresses
/// `eth`, the EtherType of the IP version, and the datagram of
/// [`emit_datagram`]. No VLAN tag, no padding to 60 bytes, no FCS (as a
/// capture records a frame). Returns the frame's length.
///
/// # Errors
///
/// Those of [`emit_datagram`]; [`EmitError::BufferTooSmall`] with the whole
/// frame's length.
pub fn emit_frame(
    pkt: &Packet,
    payload: &[&[u8]],
    ip: &IpUdp,
    eth: &EthAddrs,
    buf: &mut [u8],
) -> Result<usize, EmitError> {
    framed(ip, eth, buf, |rest| emit_datagram(pkt, payload, ip, rest))
}

/// [`emit_frame`] of a UDP payload taken as it is ([`emit_datagram_raw`]).
///
/// # Errors
///
/// Those of [`emit_datagram_raw`], with the whole frame's length.
pub fn emit_frame_raw(
    ip: &IpUdp,
    transport: &[u8],
    eth: &EthAddrs,
    buf: &mut [u8],
) -> Result<usize, EmitError> {
    framed(ip, eth, buf, |rest| emit_datagram_raw(ip, transport, rest))
}

/// The Ethernet header for `ip`'s family before the datagram `datagram`
/// writes.
fn framed(
    ip: &IpUdp,
    eth: &EthAddrs,
    buf: &mut [u8],
    datagram: impl FnOnce(&mut [u8]) -> Result<usize, EmitError>,
) -> Result<usize, EmitError> {
    let ethertype = match ip.family().ok_or(EmitError::MixedFamilies)? {
        Family::V4 => ETHERTYPE_IPV4,
        Family::V6 => ETHERTYPE_IPV6,
    };
    let (head, rest) = buf
        .split_at_mut_checked(ETH_HDR_LEN)
        .ok_or(EmitError::BufferTooSmall {
            needed: ETH_HDR_LEN,
        })?;
    let n = datagram(rest).map_err(|e| match e {
        EmitError::BufferTooSmall { needed } => EmitError::BufferTooSmall {
            needed: needed + ETH_HDR_LEN,
        },
        e => e,
    })?;
    let h = EthHdr {
        dst: eth.dst,
        src: eth.src,
        ethertype: U16::new(ethertype),
    };
    head.copy_from_slice(h.as_bytes());
    Ok(ETH_HDR_LEN + n)
}

/// Parses an IP datagram carrying a RoCEv2 packet: IPv4 (no options, not a
/// fragment, header checksum right) or IPv6 (next header UDP, addresses
/// not IPv4-mapped), then UDP to [`ROCE_PORT`] (length matching the IP
/// length, checksum right or 0), then the transport packet
/// ([`parse_transport`]). Bytes after the IP length (Ethernet padding) are
/// ignored.
///
/// # Errors
///
/// The [`WireError`] that drops it.
pub fn parse_datagram(bytes: &[u8]) -> Result<Parsed<'_>, WireError> {
    let version = bytes.first().ok_or(WireError::Truncated)? >> 4;
    let (family, (ip, udp)) = match version {
        4 => (Family::V4, parse_v4(bytes)?),
        6 => (Family::V6, parse_v6(bytes)?),
        _ => return Err(WireError::NotRoce),
    };
    let (uh, _) = UdpHdr::ref_from_prefix(udp).map_err(|_| WireError::Truncated)?;
    let ulen = usize::from(uh.len.get());
    if ulen > udp.len() {
        return Err(WireError::Truncated);
    }
    if ulen != udp.len() {
        return Err(WireError::BadLength);
    }
    if uh.dst_port.get() != ROCE_PORT {
        return Err(WireError::NotRoce);
    }
    let udp_checksum = uh.csum.get() != 0;
    if udp_checksum {
        let s = pseudo(family, &ip.src, &ip.dst, uh.len.get());
        if fold(sum16(s, udp)) != 0xFFFF {
            return Err(WireError::BadUdpChecksum);
        }
    }
    let ip = IpUdp {
        src_port: uh.src_port.get(),
        dst_port: uh.dst_port.get(),
        udp_checksum,
        ..ip
    };
    let transport = udp.get(UDP_HDR_LEN..).ok_or(WireError::Truncated)?;
    let (pkt, payload) = parse_transport(transport, &ip)?;
    Ok(Parsed { pkt, payload, ip })
}

/// The IPv4 header's facts and the UDP bytes (to the IP length).
fn parse_v4(bytes: &[u8]) -> Result<(IpUdp, &[u8]), WireError> {
    let (h, _) = Ipv4Hdr::ref_from_prefix(bytes).map_err(|_| WireError::Truncated)?;
    if h.ver_ihl != 0x45 {
        return Err(WireError::BadIpHeader);
    }
    if fold(sum16(0, h.as_bytes())) != 0xFFFF {
        return Err(WireError::BadIpChecksum);
    }
    let total = usize::from(h.total_len.get());
    let datagram = bytes.get(..total).ok_or(WireError::Truncated)?;
    let udp = datagram.get(IPV4_HDR_LEN..).ok_or(WireError::BadLength)?;
    if h.frag.get() & IPV4_FRAGMENT != 0 {
        return Err(WireError::BadIpHeader);
    }
    if h.proto != IPPROTO_UDP {
        return Err(WireError::NotRoce);
    }
    let ip = IpUdp {
        src: mapped(h.src),
        dst: mapped(h.dst),
        traffic_class: h.tos,
        hop_limit: h.ttl,
        ident: h.ident.get(),
        dont_fragment: h.frag.get() & IPV4_DF != 0,
        ..IpUdp::default()
    };
    Ok((ip, udp))
}

/// The IPv6 header's facts and the UDP bytes (to the payload length).
fn parse_v6(bytes: &[u8]) -> Result<(IpUdp, &[u8]), WireError> {
    let (h, rest) = Ipv6Hdr::ref_from_prefix(bytes).map_err(|_| WireError::Truncated)?;
    let udp = rest
        .get(..usize::from(h.payload_len.get()))
        .ok_or(WireError::Truncated)?;
    if h.next != IPPROTO_UDP {
        return Err(WireError::NotRoce);
    }
    if is_ipv4_mapped(&h.src) || is_ipv4_mapped(&h.dst) {
        return Err(WireError::BadIpHeader);
    }
    let vtf = h.vtf.get();
    let ip = IpUdp {
        src: h.src,
        dst: h.dst,
        traffic_class: vtf.to_be_bytes()[0] << 4 | vtf.to_be_bytes()[1] >> 4,
        flow_label: vtf & 0xF_FFFF,
        hop_limit: h.hop_limit,
        ..IpUdp::default()
    };
    Ok((ip, udp))
}

/// Parses an Ethernet II frame (at most one 802.1Q VLAN tag, no FCS)
/// carrying a RoCEv2 datagram ([`parse_datagram`]).
///
/// # Errors
///
/// [`WireError::NotRoce`] for an EtherType other than IPv4 or IPv6 (or one
/// that disagrees with the IP header's version), and those of
/// [`parse_datagram`].
pub fn parse_frame(bytes: &[u8]) -> Result<Parsed<'_>, WireError> {
    let (h, mut rest) = EthHdr::ref_from_prefix(bytes).map_err(|_| WireError::Truncated)?;
    let mut ethertype = h.ethertype.get();
    if ethertype == ETHERTYPE_VLAN {
        let (tag, inner) = <[U16; 2]>::ref_from_prefix(rest).map_err(|_| WireError::Truncated)?;
        ethertype = tag[1].get();
        rest = inner;
    }
    let version = rest.first().map(|b| b >> 4);
    match (ethertype, version) {
        (ETHERTYPE_IPV4, Some(4)) | (ETHERTYPE_IPV6, Some(6)) => parse_datagram(rest),
        (ETHERTYPE_IPV4 | ETHERTYPE_IPV6, None) => Err(WireError::Truncated),
        _ => Err(WireError::NotRoce),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The folded one's complement sum of `bytes`.
    pub(crate) fn checksum(bytes: &[u8]) -> u16 {
        fold(sum16(0, bytes))
    }

    #[test]
    fn the_internet_checksum() {
        // RFC 1071's example.
        assert_eq!(
            checksum(&[0x00, 0x01, 0xF2, 0x03, 0xF4, 0xF5, 0xF6, 0xF7]),
            0xDDF2
        );
        assert_eq!(checksum(&[0xFF, 0xFF, 0xFF]), 0xFF00, "0x1FEFF folded");
        assert_eq!(checksum(&[0x12]), 0x1200, "an odd byte is the high half");
    }

    #[test]
    fn ip_headers_follow_the_gids() {
        let v4 = |last| {
            let mut g = [0u8; 16];
            g[10..12].fill(0xFF);
            g[12..].copy_from_slice(&[10, 0, 0, last]);
            g
        };
        let ip = IpUdp {
            src: v4(1),
            dst: v4(2),
            traffic_class: 0x68,
            hop_limit: 9,
            ident: 0x1234,
            dont_fragment: true,
            ..IpUdp::default()
        };
        let mut h = [0u8; 40];
        assert_eq!(emit_ip_header(&ip, 100, &mut h), Ok(IPV4_HDR_LEN));
        let mut zeroed = h;
        zeroed[10..12].fill(0);
        assert_eq!(
            zeroed[..20],
            [
                0x45, 0x68, 0, 120, 0x12, 0x34, 0x40, 0, 9, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2
            ]
        );
        assert_eq!(checksum(&h[..20]), 0xFFFF, "the header checksum is right");
        assert_eq!(
            emit_ip_header(&ip, 0xFFFF - 19, &mut h),
            Err(EmitError::TooLong)
        );
        assert_eq!(
            emit_ip_header(&ip, 8, &mut h[..19]),
            Err(EmitError::BufferTooSmall { needed: 20 })
        );
        let ip6 = IpUdp {
            src: [0xFE; 16],
            dst: [0xFD; 16],
            flow_label: 0xABCDE,
            ..ip
        };
        assert_eq!(emit_ip_header(&ip6, 0xFFFF, &mut h), Ok(IPV6_HDR_LEN));
        assert_eq!(h[..8], [0x66, 0x8A, 0xBC, 0xDE, 0xFF, 0xFF, 17, 9]);
        assert_eq!(h[8..24], [0xFE; 16]);
        assert_eq!(h[24..40], [0xFD; 16]);
        assert_eq!(
            emit_ip_header(&ip6, 0x1_0000, &mut h),
            Err(EmitError::TooLong)
        );
        let mixed = IpUdp { src: v4(1), ..ip6 };
        assert_eq!(
            emit_ip_header(&mixed, 8, &mut h),
            Err(EmitError::MixedFamilies)
        );
    }
}
