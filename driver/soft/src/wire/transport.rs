//! The UDP payload of RoCEv2: BTH, extension headers, payload, pad, ICRC.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::headers::{
    AethHdr, AtomicAckEthHdr, AtomicEthHdr, BthHdr, DethHdr, IethHdr, ImmDtHdr, RethHdr,
};
use super::ip::udp_len_of;
use super::{EmitError, ICRC_LEN, IpUdp, WireError, icrc};
use crate::wire::packet::{PSN_MASK, Packet, header_len, m, mask};

/// Bytes of `pkt` as a UDP payload: its headers, `payload_len` bytes of
/// payload, the pad and the ICRC.
///
/// # Errors
///
/// [`EmitError::UnknownOpcode`] for an opcode not in the opcode table;
/// [`EmitError::PayloadLen`] for payload on an opcode without.
pub fn transport_len(pkt: &Packet) -> Result<usize, EmitError> {
    let hdr = header_len(pkt.opcode).ok_or(EmitError::UnknownOpcode)?;
    if pkt.mask() & m::PAYLOAD == 0 && pkt.payload_len != 0 {
        return Err(EmitError::PayloadLen);
    }
    Ok(hdr + pkt.payload_len as usize + pkt.pad() as usize + ICRC_LEN)
}

/// Copies byte strings one after the other into a buffer.
struct Cursor<'a> {
    buf: &'a mut [u8],
    at: usize,
}

impl Cursor<'_> {
    fn put(&mut self, bytes: &[u8]) -> Result<(), EmitError> {
        let end = self.at + bytes.len();
        let needed = end;
        self.buf
            .get_mut(self.at..end)
            .ok_or(EmitError::BufferTooSmall { needed })?
            .copy_from_slice(bytes);
        self.at = end;
        Ok(())
    }
}

/// Writes `pkt` as a RoCEv2 UDP payload into `buf`: the BTH (pad count,
/// TVer 0, the packet's MigReq; FECN, BECN and reserved bits 0), the extension headers
/// its opcode carries in IBTA order, the payload gathered from `payload`'s
/// pieces in order, zero pad bytes to a multiple of 4, and the ICRC of the
/// datagram `ip` describes. The fields of headers the opcode does not
/// carry, and `pkt`'s addresses, are ignored. Returns the bytes written
/// ([`transport_len`]). Does not allocate.
///
/// # Errors
///
/// [`EmitError::UnknownOpcode`]; [`EmitError::OutOfRange`] for a 24-bit
/// field (destination QP, PSN, MSN, source QP) over 24 bits;
/// [`EmitError::PayloadLen`] when the pieces do not add up to
/// `pkt.payload_len`; [`EmitError::MixedFamilies`] and
/// [`EmitError::TooLong`] for a datagram `ip` cannot describe;
/// [`EmitError::BufferTooSmall`].
pub fn emit_transport(
    pkt: &Packet,
    payload: &[&[u8]],
    ip: &IpUdp,
    buf: &mut [u8],
) -> Result<usize, EmitError> {
    let len = transport_len(pkt)?;
    let k = mask(pkt.opcode);
    let wide = |v: u32| v > PSN_MASK;
    if wide(pkt.dest_qpn)
        || wide(pkt.psn)
        || (k & m::AETH != 0 && wide(pkt.aeth.msn))
        || (k & m::DETH != 0 && wide(pkt.deth.src_qpn))
    {
        return Err(EmitError::OutOfRange);
    }
    let carried = payload
        .iter()
        .try_fold(0usize, |n, p| n.checked_add(p.len()));
    if carried != Some(pkt.payload_len as usize) {
        return Err(EmitError::PayloadLen);
    }
    let family = ip.family().ok_or(EmitError::MixedFamilies)?;
    udp_len_of(family, len - ICRC_LEN).ok_or(EmitError::TooLong)?;
    let out = buf
        .get_mut(..len)
        .ok_or(EmitError::BufferTooSmall { needed: len })?;
    #[allow(clippy::cast_possible_truncation)]
    let pad = pkt.pad() as u8;
    let mut c = Cursor { buf: out, at: 0 };
    c.put(BthHdr::of(pkt, pad).as_bytes())?;
    if k & m::RETH != 0 {
        c.put(RethHdr::from(&pkt.reth).as_bytes())?;
    }
    if k & m::AETH != 0 {
        c.put(AethHdr::from(&pkt.aeth).as_bytes())?;
    }
    if k & m::ATMETH != 0 {
        c.put(AtomicEthHdr::from(&pkt.atomic).as_bytes())?;
    }
    if k & m::ATMACK != 0 {
        let h = AtomicAckEthHdr {
            orig: pkt.atomic_orig.into(),
        };
        c.put(h.as_bytes())?;
    }
    if k & m::IMMDT != 0 {
        c.put(ImmDtHdr::of(pkt.imm).as_bytes())?;
    }
    if k & m::IETH != 0 {
        c.put(
            IethHdr {
                rkey: pkt.ieth.into(),
            }
            .as_bytes(),
        )?;
    }
    if k & m::DETH != 0 {
        c.put(DethHdr::from(&pkt.deth).as_bytes())?;
    }
    for piece in payload {
        c.put(piece)?;
    }
    c.put(&[0; 3][..usize::from(pad)])?;
    let body = c
        .buf
        .get(..c.at)
        .ok_or(EmitError::BufferTooSmall { needed: len })?;
    let crc = icrc(ip, body).map_err(|_| EmitError::TooLong)?;
    c.put(&crc.to_le_bytes())?;
    Ok(c.at)
}

/// The header `H` at the start of `rest`, which moves past it.
fn take<'b, H: FromBytes + KnownLayout + Immutable>(
    rest: &mut &'b [u8],
) -> Result<&'b H, WireError> {
    let (h, r) = H::ref_from_prefix(rest).map_err(|_| WireError::Truncated)?;
    *rest = r;
    Ok(h)
}

/// Parses a RoCEv2 UDP payload received in the datagram `ip` describes:
/// the BTH (TVer 0), the extension headers its opcode carries, and the ICRC
/// over the whole. Returns the packet (with `ip`'s addresses, traffic
/// class, flow label and hop limit) and its payload, without the pad,
/// borrowed from `bytes`, and its MigReq. Reserved bits, FECN and BECN
/// are ignored.
/// Never panics; does not allocate.
///
/// # Errors
///
/// In the order checked: [`WireError::Truncated`] (shorter than a BTH),
/// [`WireError::BadVersion`], [`WireError::UnknownOpcode`],
/// [`WireError::Truncated`] (shorter than the opcode's headers and the
/// ICRC), [`WireError::BadLength`] (not a multiple of 4 bytes, or the
/// datagram longer than 65535), [`WireError::BadIpHeader`] (`ip` mixes
/// IPv4 and IPv6), [`WireError::BadIcrc`], [`WireError::BadLength`]
/// (payload on an opcode without), [`WireError::BadPad`].
pub fn parse_transport<'a>(bytes: &'a [u8], ip: &IpUdp) -> Result<(Packet, &'a [u8]), WireError> {
    let (bth, _) = BthHdr::ref_from_prefix(bytes).map_err(|_| WireError::Truncated)?;
    if bth.tver() != 0 {
        return Err(WireError::BadVersion);
    }
    let hdr = header_len(bth.opcode).ok_or(WireError::UnknownOpcode)?;
    let k = mask(bth.opcode);
    let body_len = bytes
        .len()
        .checked_sub(ICRC_LEN)
        .filter(|&n| n >= hdr)
        .ok_or(WireError::Truncated)?;
    if bytes.len() % 4 != 0 {
        return Err(WireError::BadLength);
    }
    let (body, crc) = bytes.split_at(body_len);
    let crc = <[u8; ICRC_LEN]>::read_from_bytes(crc).map_err(|_| WireError::Truncated)?;
    if icrc(ip, body)? != u32::from_le_bytes(crc) {
        return Err(WireError::BadIcrc);
    }
    let (headers, data) = body.split_at(hdr);
    let pad = usize::from(bth.pad());
    if k & m::PAYLOAD == 0 && !data.is_empty() {
        return Err(WireError::BadLength);
    }
    let payload_len = data.len().checked_sub(pad).ok_or(WireError::BadPad)?;
    let payload = data.get(..payload_len).ok_or(WireError::BadPad)?;

    let mut pkt = Packet {
        sgid: ip.src,
        dgid: ip.dst,
        traffic_class: ip.traffic_class,
        flow_label: ip.flow_label,
        hop_limit: ip.hop_limit,
        payload_len: u32::try_from(payload_len).map_err(|_| WireError::BadLength)?,
        ..Packet::default()
    };
    bth.fill(&mut pkt);
    let mut rest = headers.get(size_of::<BthHdr>()..).unwrap_or_default();
    if k & m::RETH != 0 {
        pkt.reth = take::<RethHdr>(&mut rest)?.into();
    }
    if k & m::AETH != 0 {
        pkt.aeth = take::<AethHdr>(&mut rest)?.into();
    }
    if k & m::ATMETH != 0 {
        pkt.atomic = take::<AtomicEthHdr>(&mut rest)?.into();
    }
    if k & m::ATMACK != 0 {
        pkt.atomic_orig = take::<AtomicAckEthHdr>(&mut rest)?.orig.get();
    }
    if k & m::IMMDT != 0 {
        pkt.imm = take::<ImmDtHdr>(&mut rest)?.get();
    }
    if k & m::IETH != 0 {
        pkt.ieth = take::<IethHdr>(&mut rest)?.rkey.get();
    }
    if k & m::DETH != 0 {
        pkt.deth = take::<DethHdr>(&mut rest)?.into();
    }
    Ok((pkt, payload))
}
