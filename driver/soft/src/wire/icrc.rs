//! The invariant CRC (RoCEv2 annex A17.8, IBTA 7.8.1).
//!
//! The standard CRC-32 (IEEE 802.3: reflected, initial value and final XOR
//! all ones) over, in order:
//! - 8 bytes of `0xFF`, standing in for the LRH RoCEv2 does not have;
//! - the IP header with its variant fields set to all ones: IPv4 TOS, TTL
//!   and header checksum; IPv6 traffic class, flow label and hop limit;
//! - the UDP header with its checksum set to all ones;
//! - the BTH with its byte 4 (FECN, BECN, resv6) set to all ones;
//! - the rest of the packet up to the ICRC: extension headers, payload,
//!   pad.
//!
//! The CRC travels after the pad as a little-endian `u32` (the byte order
//! of the CRC's bits on the wire; Linux rxe and the RoCEv2 vectors agree).

use crc32fast::Hasher;
use zerocopy::IntoBytes;

use super::headers::BTH_RESV8A;
use super::ip::{udp_hdr, udp_len_of, v4_hdr, v6_hdr};
use super::{Family, IpUdp, WireError};
use crate::wire::packet::BTH_LEN;

/// The ICRC of a packet whose transport bytes (BTH up to the pad, without
/// the ICRC itself) are `transport`, carried in the datagram `ip`
/// describes.
///
/// # Errors
///
/// [`WireError::Truncated`] when `transport` is shorter than a BTH;
/// [`WireError::BadLength`] when the datagram would be longer than 65535
/// bytes; [`WireError::BadIpHeader`] when `ip` mixes IPv4 and IPv6
/// addresses.
pub fn icrc(ip: &IpUdp, transport: &[u8]) -> Result<u32, WireError> {
    let family = ip.family().ok_or(WireError::BadIpHeader)?;
    let (bth, rest) = transport
        .split_at_checked(BTH_LEN)
        .ok_or(WireError::Truncated)?;
    let udp_len = udp_len_of(family, transport.len()).ok_or(WireError::BadLength)?;
    let mut h = Hasher::new();
    h.update(&[0xFF; 8]);
    match family {
        Family::V4 => {
            let mut v4 = v4_hdr(ip, udp_len);
            v4.tos = 0xFF;
            v4.ttl = 0xFF;
            v4.csum.set(0xFFFF);
            h.update(v4.as_bytes());
        }
        Family::V6 => {
            let mut v6 = v6_hdr(ip, udp_len);
            v6.vtf.set(0x6FFF_FFFF);
            v6.hop_limit = 0xFF;
            h.update(v6.as_bytes());
        }
    }
    let mut udp = udp_hdr(ip, udp_len);
    udp.csum.set(0xFFFF);
    h.update(udp.as_bytes());
    let mut b = [0u8; BTH_LEN];
    b.copy_from_slice(bth);
    b[BTH_RESV8A] = 0xFF;
    h.update(&b);
    h.update(rest);
    Ok(h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_is_the_standard_one() {
        // The CRC-32 check value.
        let mut h = Hasher::new();
        h.update(b"123456789");
        assert_eq!(h.finalize(), 0xCBF4_3926);
        // rxe starts from the CRC of the 8 masked LRH bytes.
        let mut h = Hasher::new();
        h.update(&[0xFF; 8]);
        assert_eq!(!h.finalize(), 0xDEBB_20E3);
    }

    #[test]
    fn short_or_mixed_input_is_an_error() {
        let v4 = IpUdp {
            src: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 1, 2, 3, 4],
            dst: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 1, 2, 3, 5],
            ..IpUdp::default()
        };
        assert_eq!(icrc(&v4, &[0; 11]), Err(WireError::Truncated));
        assert!(icrc(&v4, &[0; 12]).is_ok());
        let mixed = IpUdp {
            dst: [0xFD; 16],
            ..v4
        };
        assert_eq!(icrc(&mixed, &[0; 12]), Err(WireError::BadIpHeader));
    }
}
