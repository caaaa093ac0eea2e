//! LAP, LoadAlternatePath (IBTA 12.8.1, table 115), and APR,
//! AlternatePathResponse (12.8.2, table 116): loading a new alternate path
//! into an established connection.

use zerocopy::byteorder::network_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::bits::{field8, field32, flag8};
use super::path::Path;
use super::rej::{ARI_LEN, Info};
use super::{MAD_DATA_SIZE, ParseError};
use crate::Gid;

/// Private data bytes of a LAP.
pub const LAP_PDATA: usize = 168;
/// Private data bytes of an APR.
pub const APR_PDATA: usize = 148;

/// The LAP message (232 bytes).
///
/// | byte | field |
/// |---|---|
/// | 0-3 | local communication ID |
/// | 4-7 | remote communication ID |
/// | 8-11 | reserved |
/// | 12-15 | remote QPN/EECN (24), remote CM response timeout (5), reserved (3) |
/// | 16-19 | reserved |
/// | 20-21 | alternate local port LID |
/// | 22-23 | alternate remote port LID |
/// | 24-39 | alternate local port GID |
/// | 40-55 | alternate remote port GID |
/// | 56-59 | alternate flow label (20), reserved (4), alternate traffic class (8) |
/// | 60 | alternate hop limit |
/// | 61 | reserved (2), alternate packet rate (6) |
/// | 62 | alternate SL (4), alternate subnet local (1), reserved (3) |
/// | 63 | alternate local ACK timeout (5), reserved (3) |
/// | 64-231 | private data |
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LapMsg {
    /// Local communication ID.
    pub local_comm_id: U32,
    /// Remote communication ID.
    pub remote_comm_id: U32,
    reserved8: U32,
    w12: U32,
    reserved16: U32,
    /// Alternate local port LID.
    pub alt_local_lid: U16,
    /// Alternate remote port LID.
    pub alt_remote_lid: U16,
    /// Alternate local port GID.
    pub alt_local_gid: Gid,
    /// Alternate remote port GID.
    pub alt_remote_gid: Gid,
    w56: U32,
    /// Alternate hop limit.
    pub alt_hop_limit: u8,
    b61: u8,
    b62: u8,
    b63: u8,
    /// Private data.
    pub private_data: [u8; LAP_PDATA],
}

const _: () = assert!(size_of::<LapMsg>() == MAD_DATA_SIZE);

impl LapMsg {
    field32!(
        /// Remote QPN or EECN (24 bits).
        remote_qpn, set_remote_qpn: w12[8; 24]
    );
    field32!(
        /// Remote CM response timeout (5 bits).
        remote_cm_response_timeout, set_remote_cm_response_timeout: w12[3; 5]
    );
    field32!(
        /// Alternate flow label (20 bits).
        alt_flow_label, set_alt_flow_label: w56[12; 20]
    );
    field32!(
        /// Alternate traffic class.
        alt_traffic_class, set_alt_traffic_class: w56[0; 8]
    );
    field8!(
        /// Alternate packet rate (6 bits).
        alt_packet_rate, set_alt_packet_rate: b61[0; 6]
    );
    field8!(
        /// Alternate SL (4 bits).
        alt_sl, set_alt_sl: b62[4; 4]
    );
    flag8!(
        /// Alternate subnet local.
        alt_subnet_local, set_alt_subnet_local: b62[3]
    );
    field8!(
        /// Alternate local ACK timeout (5 bits).
        alt_local_ack_timeout, set_alt_local_ack_timeout: b63[3; 5]
    );
}

/// A LAP, typed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lap {
    /// Local communication ID (the sender's).
    pub local_comm_id: u32,
    /// Remote communication ID (the receiver's).
    pub remote_comm_id: u32,
    /// Remote QPN (24 bits): the receiver's QP.
    pub remote_qpn: u32,
    /// Remote CM response timeout (5 bits).
    pub remote_cm_response_timeout: u8,
    /// The alternate path, from the sender's side.
    pub alternate: Path,
    /// Private data.
    pub private_data: [u8; LAP_PDATA],
}

impl Lap {
    /// Reads a LAP (every bit pattern is one).
    #[must_use]
    pub fn parse(m: &LapMsg) -> Self {
        Self {
            local_comm_id: m.local_comm_id.get(),
            remote_comm_id: m.remote_comm_id.get(),
            remote_qpn: m.remote_qpn(),
            remote_cm_response_timeout: m.remote_cm_response_timeout() as u8,
            alternate: Path {
                local_lid: m.alt_local_lid.get(),
                remote_lid: m.alt_remote_lid.get(),
                local_gid: m.alt_local_gid,
                remote_gid: m.alt_remote_gid,
                flow_label: m.alt_flow_label(),
                packet_rate: m.alt_packet_rate(),
                traffic_class: m.alt_traffic_class() as u8,
                hop_limit: m.alt_hop_limit,
                sl: m.alt_sl(),
                subnet_local: m.alt_subnet_local(),
                local_ack_timeout: m.alt_local_ack_timeout(),
            },
            private_data: m.private_data,
        }
    }

    /// Writes the LAP.
    pub fn emit(&self, m: &mut LapMsg) {
        *m = zerocopy::FromZeros::new_zeroed();
        let p = &self.alternate;
        m.local_comm_id.set(self.local_comm_id);
        m.remote_comm_id.set(self.remote_comm_id);
        m.set_remote_qpn(self.remote_qpn);
        m.set_remote_cm_response_timeout(u32::from(self.remote_cm_response_timeout));
        m.alt_local_lid.set(p.local_lid);
        m.alt_remote_lid.set(p.remote_lid);
        m.alt_local_gid = p.local_gid;
        m.alt_remote_gid = p.remote_gid;
        m.set_alt_flow_label(p.flow_label);
        m.set_alt_traffic_class(u32::from(p.traffic_class));
        m.alt_hop_limit = p.hop_limit;
        m.set_alt_packet_rate(p.packet_rate);
        m.set_alt_sl(p.sl);
        m.set_alt_subnet_local(p.subnet_local);
        m.set_alt_local_ack_timeout(p.local_ack_timeout);
        m.private_data = self.private_data;
    }
}

/// The APR message (232 bytes).
///
/// | byte | field |
/// |---|---|
/// | 0-3 | local communication ID |
/// | 4-7 | remote communication ID |
/// | 8 | additional information length |
/// | 9 | AP status |
/// | 10-11 | reserved |
/// | 12-83 | additional information |
/// | 84-231 | private data |
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AprMsg {
    /// Local communication ID.
    pub local_comm_id: U32,
    /// Remote communication ID.
    pub remote_comm_id: U32,
    /// Additional information length.
    pub info_len: u8,
    /// AP status.
    pub status: u8,
    reserved: U16,
    /// Additional information.
    pub info: [u8; ARI_LEN],
    /// Private data.
    pub private_data: [u8; APR_PDATA],
}

const _: () = assert!(size_of::<AprMsg>() == MAD_DATA_SIZE);

/// An APR status (IBTA table 117). Any value parses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AprStatus(pub u8);

impl AprStatus {
    /// The alternate path is loaded.
    pub const ACCEPTED: Self = Self(0);
    /// Invalid communication ID.
    pub const INVALID_COMM_ID: Self = Self(1);
    /// Alternate paths are not supported.
    pub const UNSUPPORTED: Self = Self(2);
    /// Rejected.
    pub const REJECTED: Self = Self(3);
    /// Redirect (information: ClassPortInfo).
    pub const REDIRECT: Self = Self(4);
    /// The path is the current one.
    pub const IS_CURRENT: Self = Self(5);
    /// Invalid QPN/EECN.
    pub const INVALID_QPN: Self = Self(6);
    /// Invalid LID.
    pub const INVALID_LID: Self = Self(7);
    /// Invalid GID.
    pub const INVALID_GID: Self = Self(8);
    /// Invalid flow label.
    pub const INVALID_FLOW_LABEL: Self = Self(9);
    /// Invalid traffic class.
    pub const INVALID_TRAFFIC_CLASS: Self = Self(10);
    /// Invalid hop limit.
    pub const INVALID_HOP_LIMIT: Self = Self(11);
    /// Invalid packet rate.
    pub const INVALID_PACKET_RATE: Self = Self(12);
    /// Invalid SL.
    pub const INVALID_SL: Self = Self(13);
}

/// An APR, typed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Apr {
    /// Local communication ID (the sender's).
    pub local_comm_id: u32,
    /// Remote communication ID (the receiver's).
    pub remote_comm_id: u32,
    /// Status.
    pub status: AprStatus,
    /// Additional information.
    pub info: Info,
    /// Private data.
    pub private_data: [u8; APR_PDATA],
}

impl Apr {
    /// Reads an APR.
    ///
    /// # Errors
    /// [`ParseError::Field`] for an additional information length over 72.
    pub fn parse(m: &AprMsg) -> Result<Self, ParseError> {
        Ok(Self {
            local_comm_id: m.local_comm_id.get(),
            remote_comm_id: m.remote_comm_id.get(),
            status: AprStatus(m.status),
            info: Info::read(m.info_len, &m.info, "APR additional information length")?,
            private_data: m.private_data,
        })
    }

    /// Writes the APR.
    pub fn emit(&self, m: &mut AprMsg) {
        *m = zerocopy::FromZeros::new_zeroed();
        m.local_comm_id.set(self.local_comm_id);
        m.remote_comm_id.set(self.remote_comm_id);
        m.status = self.status.0;
        (m.info_len, m.info) = self.info.write();
        m.private_data = self.private_data;
    }
}
