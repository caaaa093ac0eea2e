//! RoCEv2 on the wire: the bytes of a [`Packet`] in a UDP datagram.
//!
//! A RoCEv2 packet is an Ethernet frame, an IPv4 or IPv6 header, a UDP
//! header (destination port [`ROCE_PORT`]) and, as the UDP payload, the
//! InfiniBand transport: the BTH, the extension headers the opcode carries
//! (in IBTA order: RETH, AETH, AtomicETH, AtomicAckETH, ImmDt, IETH, DETH),
//! the payload, 0 to 3 pad bytes (their count in the BTH) and the 4-byte
//! ICRC.
//!
//! - [`headers`]: zero-copy views of the transport headers.
//! - [`transport`]: [`emit_transport`] and [`parse_transport`], the UDP
//!   payload (BTH to ICRC).
//! - [`icrc`](mod@icrc): the invariant CRC of the RoCEv2 annex (A17.8),
//!   [`icrc()`].
//! - [`ip`]: IPv4, IPv6, UDP and Ethernet II: [`emit_datagram`],
//!   [`emit_frame`], [`parse_datagram`], [`parse_frame`].
//! - [`packet`]: the transport's packets as fields (BTH and extension
//!   headers, payload segments), what the requester, responder and
//!   completer exchange and what the rest of this module serializes.
//!
//! Which headers a packet has is decided by the transport's one opcode
//! table, [`packet::mask`]; whether a packet travels
//! over IPv4 or IPv6 by its GIDs (IPv4-mapped `::ffff:a.b.c.d` is IPv4).
//!
//! Emitting writes into a buffer the caller provides and parsing borrows
//! the payload from the bytes parsed: nothing here allocates, blocks or
//! panics, so all of it may run at DISPATCH_LEVEL. Parsing takes untrusted
//! bytes: anything malformed, truncated or with a bad ICRC or checksum is a
//! [`WireError`], which the receiver drops and counts in [`WireStats`].
//!
//! Reserved fields (BTH resv6 and resv7, DETH's reserved byte) are sent as
//! zero and not checked on receipt (as Linux rxe); nor are the BTH's
//! FECN and BECN bits, which this HCA (no congestion control) sends as
//! zero. MigReq is sent and parsed ([`packet::Packet::mig_req`]): a QP's
//! path migration state, docs/path-migration.md.

pub mod headers;
pub mod icrc;
pub mod ip;
pub mod packet;
pub mod transport;

use core::fmt;

use crate::wire::packet::{Gid, Packet};

pub use icrc::icrc;
pub use ip::{
    ETH_HDR_LEN, EthAddrs, IPV4_HDR_LEN, IPV6_HDR_LEN, Parsed, UDP_HDR_LEN, emit_datagram,
    emit_datagram_raw, emit_frame, emit_frame_raw, emit_ip_header, parse_datagram, parse_frame,
};
pub use transport::{emit_transport, parse_transport, transport_len};

/// The UDP destination port of RoCEv2 (IANA).
pub const ROCE_PORT: u16 = 4791;

/// Bytes of an `IV_MTU_*` value (1024 for a value out of range).
pub(crate) const fn mtu_bytes(mtu: u32) -> u32 {
    match mtu {
        1..=5 => 128 << mtu,
        _ => 1024,
    }
}

/// Bytes of the ICRC that ends every packet.
pub const ICRC_LEN: usize = 4;

/// Whether `gid` is an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`), which
/// RoCEv2 sends over IPv4.
#[must_use]
pub fn is_ipv4_mapped(gid: &Gid) -> bool {
    gid[..10] == [0; 10] && gid[10..12] == [0xFF, 0xFF]
}

/// The IP and UDP facts of a datagram: what the IP and UDP headers say
/// besides the lengths (which follow from the UDP payload's length).
/// The ICRC covers all of them but the variant fields (traffic class, flow
/// label, hop limit), so receiving a bare UDP payload needs them too.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IpUdp {
    /// Source address; IPv4-mapped for IPv4.
    pub src: Gid,
    /// Destination address; IPv4-mapped for IPv4.
    pub dst: Gid,
    /// IPv6 traffic class, or the IPv4 TOS byte (DSCP and ECN).
    pub traffic_class: u8,
    /// IPv6 flow label (20 bits); not sent over IPv4, 0 when parsed there.
    pub flow_label: u32,
    /// IPv6 hop limit or IPv4 TTL.
    pub hop_limit: u8,
    /// IPv4 identification; not sent over IPv6, 0 when parsed there.
    pub ident: u16,
    /// IPv4 DF (don't fragment); not sent over IPv6, false when parsed
    /// there.
    pub dont_fragment: bool,
    /// UDP source port (RoCEv2 uses it for ECMP entropy).
    pub src_port: u16,
    /// UDP destination port ([`ROCE_PORT`]).
    pub dst_port: u16,
    /// Whether the UDP checksum is computed (else it is 0, "none") over
    /// IPv4; over IPv6 it is always computed. Not covered by the ICRC.
    /// Parsing sets it when the checksum is not 0.
    pub udp_checksum: bool,
}

impl IpUdp {
    /// The facts for sending `pkt`: its GIDs, traffic class, flow label and
    /// hop limit, UDP source port `src_port` to [`ROCE_PORT`], over IPv4
    /// DF set, identification `ident` and no UDP checksum (as Linux rxe
    /// sends), over IPv6 the UDP checksum (which RFC 8200 requires).
    #[must_use]
    pub fn of(pkt: &Packet, src_port: u16, ident: u16) -> Self {
        Self {
            src: pkt.sgid,
            dst: pkt.dgid,
            traffic_class: pkt.traffic_class,
            flow_label: pkt.flow_label,
            hop_limit: pkt.hop_limit,
            ident,
            dont_fragment: true,
            src_port,
            dst_port: ROCE_PORT,
            udp_checksum: !is_ipv4_mapped(&pkt.sgid),
        }
    }

    /// IPv4 when both addresses are IPv4-mapped, IPv6 when neither is,
    /// `None` for a mix (no datagram has that).
    #[must_use]
    pub fn family(&self) -> Option<Family> {
        match (is_ipv4_mapped(&self.src), is_ipv4_mapped(&self.dst)) {
            (true, true) => Some(Family::V4),
            (false, false) => Some(Family::V6),
            _ => None,
        }
    }
}

/// The IP version a datagram travels over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

/// Why a received packet was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireError {
    /// Shorter than the headers it announces (Ethernet, IP, UDP, BTH, the
    /// opcode's extension headers, ICRC), or than its IP or UDP length.
    Truncated,
    /// Not RoCEv2: an EtherType other than IPv4 or IPv6, an IP protocol
    /// other than UDP, or a UDP destination port other than the one
    /// expected.
    NotRoce,
    /// An IP header this HCA does not accept: IPv4 options, a fragment, an
    /// IPv6 address that is IPv4-mapped, or IPv4 and IPv6 addresses mixed.
    BadIpHeader,
    /// The IPv4 header checksum is wrong.
    BadIpChecksum,
    /// The UDP checksum is wrong (0, no checksum, is accepted over IPv4
    /// and IPv6: the ICRC protects the transport).
    BadUdpChecksum,
    /// The lengths disagree: the IP length with the UDP length, a
    /// transport packet not a multiple of 4 bytes, or bytes after the
    /// headers of an opcode that carries no payload.
    BadLength,
    /// A BTH opcode this HCA does not know (reserved, RD, XRC, CNP, ...).
    UnknownOpcode,
    /// A BTH transport header version other than 0.
    BadVersion,
    /// A pad count larger than the bytes after the headers, or non-zero on
    /// an opcode without payload.
    BadPad,
    /// The ICRC does not match.
    BadIcrc,
}

impl WireError {
    /// Every reason, in [`WireError::index`] order.
    pub const ALL: [WireError; 10] = [
        WireError::Truncated,
        WireError::NotRoce,
        WireError::BadIpHeader,
        WireError::BadIpChecksum,
        WireError::BadUdpChecksum,
        WireError::BadLength,
        WireError::UnknownOpcode,
        WireError::BadVersion,
        WireError::BadPad,
        WireError::BadIcrc,
    ];

    /// The reason's position in [`WireError::ALL`] (and in
    /// [`WireStats`]'s counters).
    #[must_use]
    pub const fn index(self) -> usize {
        self as usize
    }

    /// A short description.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            WireError::Truncated => "truncated",
            WireError::NotRoce => "not RoCEv2",
            WireError::BadIpHeader => "unsupported IP header",
            WireError::BadIpChecksum => "bad IPv4 header checksum",
            WireError::BadUdpChecksum => "bad UDP checksum",
            WireError::BadLength => "length mismatch",
            WireError::UnknownOpcode => "unknown opcode",
            WireError::BadVersion => "bad transport header version",
            WireError::BadPad => "bad pad count",
            WireError::BadIcrc => "bad ICRC",
        }
    }
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl core::error::Error for WireError {}

/// Why a packet could not be emitted. Nothing is written that the caller
/// should send: the buffer's contents are unspecified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmitError {
    /// The buffer is shorter than the `needed` bytes.
    BufferTooSmall {
        /// Bytes the packet needs.
        needed: usize,
    },
    /// An opcode not in the opcode table.
    UnknownOpcode,
    /// A field wider than its header field: a QPN, PSN, MSN or source QPN
    /// over 24 bits, a flow label over 20 bits.
    OutOfRange,
    /// The payload pieces do not add up to `payload_len`, or an opcode
    /// without payload was given some.
    PayloadLen,
    /// Over the 65535 bytes of a UDP datagram (or an IPv4 packet).
    TooLong,
    /// One GID IPv4-mapped and the other not.
    MixedFamilies,
}

impl fmt::Display for EmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EmitError::BufferTooSmall { needed } => {
                write!(f, "buffer too small: {needed} bytes needed")
            }
            EmitError::UnknownOpcode => f.write_str("unknown opcode"),
            EmitError::OutOfRange => f.write_str("field out of range"),
            EmitError::PayloadLen => f.write_str("payload length mismatch"),
            EmitError::TooLong => f.write_str("datagram too long"),
            EmitError::MixedFamilies => f.write_str("IPv4 and IPv6 GIDs mixed"),
        }
    }
}

impl core::error::Error for EmitError {}

/// Packets received, and dropped by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WireStats {
    /// Packets accepted.
    pub accepted: u64,
    drops: [u64; WireError::ALL.len()],
}

impl WireStats {
    /// Counts a parse's outcome: an accepted packet, or a drop for its
    /// reason. Returns the packet, `None` for a drop.
    pub fn record<T>(&mut self, parsed: Result<T, WireError>) -> Option<T> {
        match parsed {
            Ok(v) => {
                self.accepted = self.accepted.wrapping_add(1);
                Some(v)
            }
            Err(e) => {
                self.count(e);
                None
            }
        }
    }

    /// Counts one drop for `reason`.
    pub fn count(&mut self, reason: WireError) {
        if let Some(n) = self.drops.get_mut(reason.index()) {
            *n = n.wrapping_add(1);
        }
    }

    /// Packets dropped for `reason`.
    #[must_use]
    pub fn drops(&self, reason: WireError) -> u64 {
        self.drops.get(reason.index()).copied().unwrap_or(0)
    }

    /// Packets dropped, all reasons.
    #[must_use]
    pub fn total_drops(&self) -> u64 {
        self.drops.iter().fold(0, |a, &n| a.wrapping_add(n))
    }
}

#[cfg(test)]
mod tests;
