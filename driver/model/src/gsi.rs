//! The GSI's MAD rings: how MADs pass between the mini-driver and the
//! device by DMA, as a PCI HCA's QP1 send and receive queues do.
//!
//! One common buffer holds two rings of [`MAD_RING_ENTRIES`] entries of
//! [`MAD_ENTRY_LEN`] bytes: the send ring, then the receive ring. The
//! driver writes [`REG_MAD_ENTRIES`], then the rings' logical addresses
//! ([`REG_MAD_SQ_BASE`], [`REG_MAD_RQ_BASE`]; writing a base starts that
//! ring at index 0, and 0 stops it). An entry is a [`MAD_HEADER_LEN`]-byte
//! header (the addressing of [`MadOut`] or [`MadIn`], and the owner word
//! at [`M_OWNER`], written last by each side) and the 256-byte MAD at
//! [`MAD_HEADER_LEN`]. A zeroed buffer is all free entries.
//!
//! - **Send** (driver to device): the driver fills the entry at its
//!   producer index if its owner is [`MAD_FREE`], sets the owner to
//!   [`MAD_FULL`] and writes its producer index to
//!   [`REG_MAD_SQ_DOORBELL`]. The device reads full entries in order from
//!   its own index by DMA, checks them (untrusted bytes), hands each MAD
//!   to its port, and writes the owner word back to [`MAD_FREE`]. A full
//!   ring (the entry at the producer index not yet free) refuses the send
//!   with `STATUS_INSUFFICIENT_RESOURCES`: a lost MAD is the CM's to
//!   retransmit.
//! - **Receive** (device to driver): the device writes a MAD that arrived
//!   into the entry at its producer index if that entry is free, then its
//!   owner word ([`MAD_FULL`]), and posts an `EQE_MAD` on EQ 0. The driver
//!   takes full entries in order from its consumer index, gives each back
//!   ([`MAD_FREE`]) and writes its consumer index to
//!   [`REG_MAD_RQ_DOORBELL`]; arrivals the ring had no room for wait in the
//!   device until then.
//!
//! Everything is little-endian.

use irpverbs_abi::{NtStatus, STATUS_INVALID_PARAMETER};
use irpverbs_core::hca::{MAD_SIZE, MadIn, MadOut};

/// MAD rings: entries of each ring (32-bit write, at most
/// [`MAX_MAD_RING_ENTRIES`]).
pub const REG_MAD_ENTRIES: usize = 0x040;
/// MAD rings: the send ring's logical address (64-bit write; 0: none).
pub const REG_MAD_SQ_BASE: usize = 0x048;
/// MAD rings: the receive ring's logical address (64-bit write; 0: none).
pub const REG_MAD_RQ_BASE: usize = 0x050;
/// MAD rings: the driver's send producer index (32-bit write): full
/// entries are waiting.
pub const REG_MAD_SQ_DOORBELL: usize = 0x058;
/// MAD rings: the driver's receive consumer index (32-bit write): entries
/// were given back.
pub const REG_MAD_RQ_DOORBELL: usize = 0x05C;

/// Entries of each MAD ring the mini-driver allocates.
pub const MAD_RING_ENTRIES: u32 = 64;
/// Most entries of a MAD ring the device takes.
pub const MAX_MAD_RING_ENTRIES: u32 = 1024;
/// Bytes of a MAD ring entry.
pub const MAD_ENTRY_LEN: usize = MAD_HEADER_LEN + MAD_SIZE;
/// Bytes of an entry's header (the MAD follows).
pub const MAD_HEADER_LEN: usize = 64;

/// Entry field: port (u8).
pub const M_PORT: usize = 0;
/// Entry field: send: source GID index; receive: destination GID index
/// (u8).
pub const M_GID_INDEX: usize = 1;
/// Entry field: traffic class (u8).
pub const M_TRAFFIC_CLASS: usize = 2;
/// Entry field: hop limit (u8).
pub const M_HOP_LIMIT: usize = 3;
/// Entry field: send: destination QP; receive: source QP (u32, 24 bits).
pub const M_QPN: usize = 4;
/// Entry field: flow label (u32, 20 bits).
pub const M_FLOW_LABEL: usize = 8;
/// Entry field: receive: P_Key index (u16).
pub const M_PKEY_INDEX: usize = 12;
/// Entry field: send: destination GID; receive: source GID (16 bytes).
pub const M_GID: usize = 16;
/// Entry field: owner (u32), written last by each side.
pub const M_OWNER: usize = 60;

/// Owner: the entry is free (send: the driver may fill it; receive: the
/// device may).
pub const MAD_FREE: u32 = 0;
/// Owner: the entry holds a MAD for the other side.
pub const MAD_FULL: u32 = 1;

/// Largest QP number (24 bits).
const QPN_MAX: u32 = 0xFF_FFFF;
/// Largest flow label (20 bits).
const FLOW_LABEL_MAX: u32 = 0xF_FFFF;

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The owner word of an entry (its bytes, at least [`MAD_HEADER_LEN`]).
#[must_use]
pub fn owner(entry: &[u8]) -> u32 {
    u32_at(entry, M_OWNER)
}

/// The addressing an entry's header holds (send: the destination's QP
/// and GID, the source GID index; receive: the source's QP and GID, the
/// GID index and P_Key index it arrived on).
struct Header {
    port: u8,
    gid_index: u8,
    traffic_class: u8,
    hop_limit: u8,
    qpn: u32,
    flow_label: u32,
    pkey_index: u16,
    gid: [u8; 16],
}

impl Header {
    /// An entry with this header, `mad` and the owner word [`MAD_FULL`].
    fn entry(&self, mad: &[u8; MAD_SIZE]) -> [u8; MAD_ENTRY_LEN] {
        let mut e = [0u8; MAD_ENTRY_LEN];
        e[M_PORT] = self.port;
        e[M_GID_INDEX] = self.gid_index;
        e[M_TRAFFIC_CLASS] = self.traffic_class;
        e[M_HOP_LIMIT] = self.hop_limit;
        e[M_QPN..M_QPN + 4].copy_from_slice(&self.qpn.to_le_bytes());
        e[M_FLOW_LABEL..M_FLOW_LABEL + 4].copy_from_slice(&self.flow_label.to_le_bytes());
        e[M_PKEY_INDEX..M_PKEY_INDEX + 2].copy_from_slice(&self.pkey_index.to_le_bytes());
        e[M_GID..M_GID + 16].copy_from_slice(&self.gid);
        e[M_OWNER..M_OWNER + 4].copy_from_slice(&MAD_FULL.to_le_bytes());
        e[MAD_HEADER_LEN..].copy_from_slice(mad);
        e
    }

    /// Parses an entry (untrusted bytes): its header and its MAD.
    fn parse(entry: &[u8]) -> Result<(Self, [u8; MAD_SIZE]), NtStatus> {
        if entry.len() != MAD_ENTRY_LEN {
            return Err(STATUS_INVALID_PARAMETER);
        }
        let (qpn, flow_label) = (u32_at(entry, M_QPN), u32_at(entry, M_FLOW_LABEL));
        if entry[M_PORT] == 0 || qpn > QPN_MAX || flow_label > FLOW_LABEL_MAX {
            return Err(STATUS_INVALID_PARAMETER);
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&entry[M_GID..M_GID + 16]);
        let mut mad = [0u8; MAD_SIZE];
        mad.copy_from_slice(&entry[MAD_HEADER_LEN..]);
        let header = Self {
            port: entry[M_PORT],
            gid_index: entry[M_GID_INDEX],
            traffic_class: entry[M_TRAFFIC_CLASS],
            hop_limit: entry[M_HOP_LIMIT],
            qpn,
            flow_label,
            pkey_index: u16::from_le_bytes([entry[M_PKEY_INDEX], entry[M_PKEY_INDEX + 1]]),
            gid,
        };
        Ok((header, mad))
    }
}

/// A send entry for `mad`, its owner word [`MAD_FULL`] (written last).
#[must_use]
pub fn encode_send(mad: &MadOut) -> [u8; MAD_ENTRY_LEN] {
    Header {
        port: mad.port,
        gid_index: mad.sgid_index,
        traffic_class: mad.traffic_class,
        hop_limit: mad.hop_limit,
        qpn: mad.dest_qpn,
        flow_label: mad.flow_label,
        pkey_index: 0,
        gid: mad.dgid,
    }
    .entry(&mad.mad)
}

/// Parses a send entry (untrusted bytes).
///
/// # Errors
/// `STATUS_INVALID_PARAMETER`: not a whole entry, port 0, a QP number past
/// 24 bits or a flow label past 20 bits.
pub fn decode_send(entry: &[u8]) -> Result<MadOut, NtStatus> {
    let (h, mad) = Header::parse(entry)?;
    Ok(MadOut {
        port: h.port,
        sgid_index: h.gid_index,
        dgid: h.gid,
        dest_qpn: h.qpn,
        traffic_class: h.traffic_class,
        flow_label: h.flow_label,
        hop_limit: h.hop_limit,
        mad,
    })
}

/// A receive entry for `mad`, its owner word [`MAD_FULL`] (written last).
#[must_use]
pub fn encode_receive(mad: &MadIn) -> [u8; MAD_ENTRY_LEN] {
    Header {
        port: mad.port,
        gid_index: mad.dgid_index,
        traffic_class: mad.traffic_class,
        hop_limit: mad.hop_limit,
        qpn: mad.src_qpn,
        flow_label: mad.flow_label,
        pkey_index: mad.pkey_index,
        gid: mad.sgid,
    }
    .entry(&mad.mad)
}

/// Parses a receive entry (the device's bytes, checked all the same).
///
/// # Errors
/// As [`decode_send`].
pub fn decode_receive(entry: &[u8]) -> Result<MadIn, NtStatus> {
    let (h, mad) = Header::parse(entry)?;
    Ok(MadIn {
        port: h.port,
        pkey_index: h.pkey_index,
        dgid_index: h.gid_index,
        sgid: h.gid,
        src_qpn: h.qpn,
        traffic_class: h.traffic_class,
        flow_label: h.flow_label,
        hop_limit: h.hop_limit,
        mad,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_bad_ones_are_refused() {
        let out = MadOut {
            port: 1,
            sgid_index: 2,
            dgid: [7; 16],
            dest_qpn: 1,
            traffic_class: 3,
            flow_label: 0xF_FFFF,
            hop_limit: 64,
            mad: [0x5A; MAD_SIZE],
        };
        let e = encode_send(&out);
        assert_eq!(owner(&e), MAD_FULL);
        assert_eq!(decode_send(&e), Ok(out));
        let inb = MadIn {
            port: 1,
            pkey_index: 0,
            dgid_index: 1,
            sgid: [9; 16],
            src_qpn: 1,
            traffic_class: 0,
            flow_label: 5,
            hop_limit: 1,
            mad: [0xA5; MAD_SIZE],
        };
        let e = encode_receive(&inb);
        assert_eq!(decode_receive(&e), Ok(inb));
        for (at, bytes) in [
            (M_PORT, &[0u8][..]),
            (M_QPN, &0x100_0000u32.to_le_bytes()[..]),
            (M_FLOW_LABEL, &0x10_0000u32.to_le_bytes()[..]),
        ] {
            let mut bad = encode_send(&out);
            bad[at..at + bytes.len()].copy_from_slice(bytes);
            assert_eq!(decode_send(&bad), Err(STATUS_INVALID_PARAMETER), "{at}");
            let mut bad = encode_receive(&inb);
            bad[at..at + bytes.len()].copy_from_slice(bytes);
            assert_eq!(decode_receive(&bad), Err(STATUS_INVALID_PARAMETER), "{at}");
        }
        assert_eq!(decode_send(&e[1..]), Err(STATUS_INVALID_PARAMETER));
    }
}
