//! REJ, ConnectReject (IBTA 12.6.7, tables 108 and 109): either side ends
//! a connection attempt, with a reason and additional reject information.

use zerocopy::byteorder::network_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::bits::field8;
use super::{MAD_DATA_SIZE, ParseError};

/// Private data bytes of a REJ.
pub const REJ_PDATA: usize = 148;
/// Bytes of the additional reject information (ARI) field.
pub const ARI_LEN: usize = 72;

/// The REJ message (232 bytes).
///
/// | byte | field |
/// |---|---|
/// | 0-3 | local communication ID |
/// | 4-7 | remote communication ID |
/// | 8 | message REJected (2), reserved (6) |
/// | 9 | reject info length (7), reserved (1) |
/// | 10-11 | reason |
/// | 12-83 | additional reject information (ARI) |
/// | 84-231 | private data |
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RejMsg {
    /// Local communication ID.
    pub local_comm_id: U32,
    /// Remote communication ID.
    pub remote_comm_id: U32,
    b8: u8,
    b9: u8,
    /// Reason.
    pub reason: U16,
    /// Additional reject information.
    pub ari: [u8; ARI_LEN],
    /// Private data.
    pub private_data: [u8; REJ_PDATA],
}

const _: () = assert!(size_of::<RejMsg>() == MAD_DATA_SIZE);

impl RejMsg {
    field8!(
        /// Message REJected (2 bits): 0 REQ, 1 REP, 2 other.
        msg_rejected, set_msg_rejected: b8[6; 2]
    );
    field8!(
        /// Reject info length (7 bits): the bytes of ARI that count.
        ari_len, set_ari_len: b9[1; 7]
    );
}

/// Which message a REJ rejects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RejectedMsg {
    /// The REQ.
    Req,
    /// The REP.
    Rep,
    /// No message: a timeout or a later stage.
    Other,
}

impl RejectedMsg {
    /// The wire value.
    #[must_use]
    pub const fn bits(self) -> u8 {
        match self {
            RejectedMsg::Req => 0,
            RejectedMsg::Rep => 1,
            RejectedMsg::Other => 2,
        }
    }
}

/// A reject reason (IBTA table 109). Any 16-bit value parses; the
/// constants name the defined ones.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RejReason(pub u16);

impl RejReason {
    /// No QP available.
    pub const NO_QP: Self = Self(1);
    /// No EEC available.
    pub const NO_EEC: Self = Self(2);
    /// No resources available.
    pub const NO_RESOURCES: Self = Self(3);
    /// Timeout (ARI: the CA GUID of the side that timed out).
    pub const TIMEOUT: Self = Self(4);
    /// Unsupported request.
    pub const UNSUPPORTED_REQUEST: Self = Self(5);
    /// Invalid communication ID.
    pub const INVALID_COMM_ID: Self = Self(6);
    /// Invalid communication instance.
    pub const INVALID_COMM_INSTANCE: Self = Self(7);
    /// Invalid service ID.
    pub const INVALID_SERVICE_ID: Self = Self(8);
    /// Invalid transport service type.
    pub const INVALID_TRANSPORT_TYPE: Self = Self(9);
    /// Stale connection.
    pub const STALE_CONNECTION: Self = Self(10);
    /// RDC does not exist.
    pub const RDC_NOT_EXIST: Self = Self(11);
    /// Primary remote port GID rejected (ARI: the GID to use).
    pub const PRIMARY_GID_REJECTED: Self = Self(12);
    /// Primary remote port LID rejected (ARI: the LID to use).
    pub const PRIMARY_LID_REJECTED: Self = Self(13);
    /// Invalid primary SL (ARI: the SL to use).
    pub const INVALID_PRIMARY_SL: Self = Self(14);
    /// Invalid primary traffic class.
    pub const INVALID_PRIMARY_TRAFFIC_CLASS: Self = Self(15);
    /// Invalid primary hop limit.
    pub const INVALID_PRIMARY_HOP_LIMIT: Self = Self(16);
    /// Invalid primary packet rate.
    pub const INVALID_PRIMARY_PACKET_RATE: Self = Self(17);
    /// Alternate remote port GID rejected.
    pub const ALT_GID_REJECTED: Self = Self(18);
    /// Alternate remote port LID rejected.
    pub const ALT_LID_REJECTED: Self = Self(19);
    /// Invalid alternate SL.
    pub const INVALID_ALT_SL: Self = Self(20);
    /// Invalid alternate traffic class.
    pub const INVALID_ALT_TRAFFIC_CLASS: Self = Self(21);
    /// Invalid alternate hop limit.
    pub const INVALID_ALT_HOP_LIMIT: Self = Self(22);
    /// Invalid alternate packet rate.
    pub const INVALID_ALT_PACKET_RATE: Self = Self(23);
    /// Port CM redirection (ARI: ClassPortInfo).
    pub const PORT_CM_REDIRECT: Self = Self(24);
    /// Port redirection.
    pub const PORT_REDIRECT: Self = Self(25);
    /// Invalid path MTU (ARI: the largest acceptable MTU).
    pub const INVALID_MTU: Self = Self(26);
    /// Insufficient responder resources (ARI: the acceptable number).
    pub const INSUFFICIENT_RESP_RESOURCES: Self = Self(27);
    /// Consumer reject: the application said no.
    pub const CONSUMER_REJECT: Self = Self(28);
    /// RNR retry count reject.
    pub const INVALID_RNR_RETRY: Self = Self(29);
    /// Duplicate local communication ID.
    pub const DUPLICATE_LOCAL_COMM_ID: Self = Self(30);
    /// Unsupported class version (ARI: the highest supported).
    pub const UNSUPPORTED_CLASS_VERSION: Self = Self(31);
    /// Invalid primary flow label.
    pub const INVALID_FLOW_LABEL: Self = Self(32);
    /// Invalid alternate flow label.
    pub const INVALID_ALT_FLOW_LABEL: Self = Self(33);
    /// Vendor option not supported.
    pub const VENDOR_OPTION_NOT_SUPPORTED: Self = Self(35);

    /// Every defined reason.
    pub const ALL: [Self; 34] = [
        Self::NO_QP,
        Self::NO_EEC,
        Self::NO_RESOURCES,
        Self::TIMEOUT,
        Self::UNSUPPORTED_REQUEST,
        Self::INVALID_COMM_ID,
        Self::INVALID_COMM_INSTANCE,
        Self::INVALID_SERVICE_ID,
        Self::INVALID_TRANSPORT_TYPE,
        Self::STALE_CONNECTION,
        Self::RDC_NOT_EXIST,
        Self::PRIMARY_GID_REJECTED,
        Self::PRIMARY_LID_REJECTED,
        Self::INVALID_PRIMARY_SL,
        Self::INVALID_PRIMARY_TRAFFIC_CLASS,
        Self::INVALID_PRIMARY_HOP_LIMIT,
        Self::INVALID_PRIMARY_PACKET_RATE,
        Self::ALT_GID_REJECTED,
        Self::ALT_LID_REJECTED,
        Self::INVALID_ALT_SL,
        Self::INVALID_ALT_TRAFFIC_CLASS,
        Self::INVALID_ALT_HOP_LIMIT,
        Self::INVALID_ALT_PACKET_RATE,
        Self::PORT_CM_REDIRECT,
        Self::PORT_REDIRECT,
        Self::INVALID_MTU,
        Self::INSUFFICIENT_RESP_RESOURCES,
        Self::CONSUMER_REJECT,
        Self::INVALID_RNR_RETRY,
        Self::DUPLICATE_LOCAL_COMM_ID,
        Self::UNSUPPORTED_CLASS_VERSION,
        Self::INVALID_FLOW_LABEL,
        Self::INVALID_ALT_FLOW_LABEL,
        Self::VENDOR_OPTION_NOT_SUPPORTED,
    ];
}

/// Additional information: up to 72 bytes with their length (the ARI of a
/// REJ, the additional information of an APR or a SIDR_REP).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Info {
    len: u8,
    bytes: [u8; ARI_LEN],
}

impl Default for Info {
    fn default() -> Self {
        Self::EMPTY
    }
}

impl Info {
    /// No information.
    pub const EMPTY: Self = Self {
        len: 0,
        bytes: [0; ARI_LEN],
    };

    /// `bytes` as information, or `None` when longer than 72 bytes.
    #[must_use]
    pub fn new(bytes: &[u8]) -> Option<Self> {
        let len = u8::try_from(bytes.len())
            .ok()
            .filter(|&l| usize::from(l) <= ARI_LEN)?;
        let mut info = Self::EMPTY;
        info.len = len;
        info.bytes[..bytes.len()].copy_from_slice(bytes);
        Some(info)
    }

    /// The information bytes.
    #[must_use]
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// Reads a length and the 72-byte field; the bytes beyond the length
    /// are not kept.
    ///
    /// # Errors
    /// [`ParseError::Field`] when the length is over 72.
    pub(crate) fn read(
        len: u8,
        field: &[u8; ARI_LEN],
        name: &'static str,
    ) -> Result<Self, ParseError> {
        let info = Self::new(
            field
                .get(..usize::from(len))
                .ok_or(ParseError::Field(name))?,
        )
        .ok_or(ParseError::Field(name))?;
        Ok(info)
    }

    /// The length and the 72-byte field, zero beyond the length.
    pub(crate) fn write(&self) -> (u8, [u8; ARI_LEN]) {
        (self.len, self.bytes)
    }
}

/// A REJ, typed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rej {
    /// Local communication ID (the sender's; 0 when the sender had none).
    pub local_comm_id: u32,
    /// Remote communication ID (the receiver's; 0 when unknown).
    pub remote_comm_id: u32,
    /// The message rejected.
    pub msg_rejected: RejectedMsg,
    /// Reason.
    pub reason: RejReason,
    /// Additional reject information.
    pub ari: Info,
    /// Private data.
    pub private_data: [u8; REJ_PDATA],
}

impl Rej {
    /// Reads a REJ.
    ///
    /// # Errors
    /// [`ParseError::Field`] for message REJected 3 (reserved) or a reject
    /// info length over 72.
    pub fn parse(m: &RejMsg) -> Result<Self, ParseError> {
        let msg_rejected = match m.msg_rejected() {
            0 => RejectedMsg::Req,
            1 => RejectedMsg::Rep,
            2 => RejectedMsg::Other,
            _ => return Err(ParseError::Field("REJ message rejected")),
        };
        Ok(Self {
            local_comm_id: m.local_comm_id.get(),
            remote_comm_id: m.remote_comm_id.get(),
            msg_rejected,
            reason: RejReason(m.reason.get()),
            ari: Info::read(m.ari_len(), &m.ari, "REJ reject info length")?,
            private_data: m.private_data,
        })
    }

    /// Writes the REJ.
    pub fn emit(&self, m: &mut RejMsg) {
        *m = zerocopy::FromZeros::new_zeroed();
        m.local_comm_id.set(self.local_comm_id);
        m.remote_comm_id.set(self.remote_comm_id);
        m.set_msg_rejected(self.msg_rejected.bits());
        let (len, ari) = self.ari.write();
        m.set_ari_len(len);
        m.ari = ari;
        m.reason.set(self.reason.0);
        m.private_data = self.private_data;
    }
}
