//! Paths: the primary and alternate path of a REQ (44 bytes each, IBTA
//! table 106 bytes 52-95 and 96-139) and the typed [`Path`] that the REQ
//! and the LAP carry.

use zerocopy::byteorder::network_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::bits::{field8, field32, flag8};
use crate::Gid;

/// A path as the CM carries it, from the sender's side: "local" is the
/// port of the CA that sends the REQ or LAP, "remote" the other end.
/// [`Path::reversed`] gives the receiver's view.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Path {
    /// LID of the local port (0 on RoCE).
    pub local_lid: u16,
    /// LID of the remote port (0 on RoCE).
    pub remote_lid: u16,
    /// GID of the local port.
    pub local_gid: Gid,
    /// GID of the remote port.
    pub remote_gid: Gid,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Packet rate (IBTA rate encoding, 6 bits).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Whether the remote port is in the local subnet (no GRH needed on
    /// InfiniBand).
    pub subnet_local: bool,
    /// Local ACK timeout: 4.096 us * 2^t (5 bits), the QP's transport
    /// timeout on this path.
    pub local_ack_timeout: u8,
}

impl Path {
    /// The path seen from the other end: local and remote swapped.
    #[must_use]
    pub fn reversed(&self) -> Self {
        Self {
            local_lid: self.remote_lid,
            remote_lid: self.local_lid,
            local_gid: self.remote_gid,
            remote_gid: self.local_gid,
            ..*self
        }
    }

    /// The path with every field cut to its width on the wire.
    #[must_use]
    pub fn masked(&self) -> Self {
        Self {
            flow_label: self.flow_label & 0xF_FFFF,
            packet_rate: self.packet_rate & 0x3F,
            sl: self.sl & 0xF,
            local_ack_timeout: self.local_ack_timeout & 0x1F,
            ..*self
        }
    }

    /// Whether every field is zero: how an absent alternate path is sent.
    #[must_use]
    pub fn is_zero(&self) -> bool {
        *self == Self::default()
    }
}

/// A path of a REQ (44 bytes).
///
/// | byte | field |
/// |---|---|
/// | 0-1 | local port LID |
/// | 2-3 | remote port LID |
/// | 4-19 | local port GID |
/// | 20-35 | remote port GID |
/// | 36-39 | flow label (20), reserved (6), packet rate (6) |
/// | 40 | traffic class |
/// | 41 | hop limit |
/// | 42 | SL (4), subnet local (1), reserved (3) |
/// | 43 | local ACK timeout (5), reserved (3; the alternate's has SAP supported) |
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PathMsg {
    /// Local port LID.
    pub local_lid: U16,
    /// Remote port LID.
    pub remote_lid: U16,
    /// Local port GID.
    pub local_gid: Gid,
    /// Remote port GID.
    pub remote_gid: Gid,
    flow: U32,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    sl_byte: u8,
    ack_byte: u8,
}

const _: () = assert!(size_of::<PathMsg>() == 44);

impl PathMsg {
    field32!(
        /// Flow label (20 bits).
        flow_label, set_flow_label: flow[12; 20]
    );
    field32!(
        /// Packet rate (6 bits).
        packet_rate, set_packet_rate: flow[0; 6]
    );
    field8!(
        /// Service level (4 bits).
        sl, set_sl: sl_byte[4; 4]
    );
    flag8!(
        /// Subnet local.
        subnet_local, set_subnet_local: sl_byte[3]
    );
    field8!(
        /// Local ACK timeout (5 bits).
        local_ack_timeout, set_local_ack_timeout: ack_byte[3; 5]
    );
    flag8!(
        /// SAP supported (only in the alternate path's byte, REQ byte 139).
        sap_supported, set_sap_supported: ack_byte[2]
    );

    /// The typed path.
    #[must_use]
    pub fn get(&self) -> Path {
        Path {
            local_lid: self.local_lid.get(),
            remote_lid: self.remote_lid.get(),
            local_gid: self.local_gid,
            remote_gid: self.remote_gid,
            flow_label: self.flow_label(),
            packet_rate: self.packet_rate() as u8,
            traffic_class: self.traffic_class,
            hop_limit: self.hop_limit,
            sl: self.sl(),
            subnet_local: self.subnet_local(),
            local_ack_timeout: self.local_ack_timeout(),
        }
    }

    /// Writes `p` (fields cut to their widths, reserved bits zero, SAP
    /// supported kept).
    pub fn set(&mut self, p: &Path) {
        let sap = self.sap_supported();
        *self = Self {
            local_lid: U16::new(p.local_lid),
            remote_lid: U16::new(p.remote_lid),
            local_gid: p.local_gid,
            remote_gid: p.remote_gid,
            traffic_class: p.traffic_class,
            hop_limit: p.hop_limit,
            ..Self::default()
        };
        self.set_flow_label(p.flow_label);
        self.set_packet_rate(u32::from(p.packet_rate));
        self.set_sl(p.sl);
        self.set_subnet_local(p.subnet_local);
        self.set_local_ack_timeout(p.local_ack_timeout);
        self.set_sap_supported(sap);
    }
}
