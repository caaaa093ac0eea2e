//! SIDR_REQ and SIDR_REP, service ID resolution (IBTA 12.11, tables 119
//! and 120): a UD client asks which QP (and Q_Key) serves a service ID.

use zerocopy::byteorder::network_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::bits::field32;
use super::rej::{ARI_LEN, Info};
use super::{MAD_DATA_SIZE, ParseError};

/// Private data bytes of a SIDR_REQ.
pub const SIDR_REQ_PDATA: usize = 216;
/// Private data bytes of a SIDR_REP.
pub const SIDR_REP_PDATA: usize = 136;

/// The SIDR_REQ message (232 bytes).
///
/// | byte | field |
/// |---|---|
/// | 0-3 | request ID |
/// | 4-5 | partition key |
/// | 6-7 | reserved |
/// | 8-15 | service ID |
/// | 16-231 | private data |
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SidrReqMsg {
    /// Request ID.
    pub request_id: U32,
    /// Partition key.
    pub pkey: U16,
    reserved: U16,
    /// Service ID.
    pub service_id: U64,
    /// Private data.
    pub private_data: [u8; SIDR_REQ_PDATA],
}

const _: () = assert!(size_of::<SidrReqMsg>() == MAD_DATA_SIZE);

/// The SIDR_REP message (232 bytes).
///
/// | byte | field |
/// |---|---|
/// | 0-3 | request ID |
/// | 4 | status |
/// | 5 | additional information length |
/// | 6-7 | vendor ID high |
/// | 8-11 | QPN (24), vendor ID low (8) |
/// | 12-19 | service ID |
/// | 20-23 | Q_Key |
/// | 24-95 | ClassPortInfo / additional information |
/// | 96-231 | private data |
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SidrRepMsg {
    /// Request ID.
    pub request_id: U32,
    /// Status.
    pub status: u8,
    /// Additional information length.
    pub info_len: u8,
    /// Vendor ID, high 16 bits.
    pub vendor_id_h: U16,
    w8: U32,
    /// Service ID.
    pub service_id: U64,
    /// Q_Key.
    pub qkey: U32,
    /// Additional information.
    pub info: [u8; ARI_LEN],
    /// Private data.
    pub private_data: [u8; SIDR_REP_PDATA],
}

const _: () = assert!(size_of::<SidrRepMsg>() == MAD_DATA_SIZE);

impl SidrRepMsg {
    field32!(
        /// QPN (24 bits).
        qpn, set_qpn: w8[8; 24]
    );
    field32!(
        /// Vendor ID, low byte.
        vendor_id_l, set_vendor_id_l: w8[0; 8]
    );
}

/// A SIDR_REP status (IBTA table 121). Any value parses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SidrStatus(pub u8);

impl SidrStatus {
    /// The QPN and Q_Key are valid.
    pub const VALID: Self = Self(0);
    /// The service ID is not supported.
    pub const UNSUPPORTED_SERVICE_ID: Self = Self(1);
    /// Rejected by the service provider.
    pub const REJECTED: Self = Self(2);
    /// No QP available.
    pub const NO_QP: Self = Self(3);
    /// Redirect (information: ClassPortInfo).
    pub const REDIRECT: Self = Self(4);
    /// Unsupported class version.
    pub const UNSUPPORTED_VERSION: Self = Self(5);
}

/// A SIDR_REQ, typed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SidrReq {
    /// Request ID (the sender's communication ID).
    pub request_id: u32,
    /// Partition key.
    pub pkey: u16,
    /// Service ID.
    pub service_id: u64,
    /// Private data.
    pub private_data: [u8; SIDR_REQ_PDATA],
}

impl SidrReq {
    /// Reads a SIDR_REQ (every bit pattern is one).
    #[must_use]
    pub fn parse(m: &SidrReqMsg) -> Self {
        Self {
            request_id: m.request_id.get(),
            pkey: m.pkey.get(),
            service_id: m.service_id.get(),
            private_data: m.private_data,
        }
    }

    /// Writes the SIDR_REQ.
    pub fn emit(&self, m: &mut SidrReqMsg) {
        *m = zerocopy::FromZeros::new_zeroed();
        m.request_id.set(self.request_id);
        m.pkey.set(self.pkey);
        m.service_id.set(self.service_id);
        m.private_data = self.private_data;
    }
}

/// A SIDR_REP, typed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SidrRep {
    /// Request ID (the SIDR_REQ's).
    pub request_id: u32,
    /// Status.
    pub status: SidrStatus,
    /// Vendor ID (24 bits).
    pub vendor_id: u32,
    /// QPN (24 bits) serving the service.
    pub qpn: u32,
    /// Service ID.
    pub service_id: u64,
    /// Q_Key of the QP.
    pub qkey: u32,
    /// Additional information (ClassPortInfo for a redirect).
    pub info: Info,
    /// Private data.
    pub private_data: [u8; SIDR_REP_PDATA],
}

impl SidrRep {
    /// Reads a SIDR_REP.
    ///
    /// # Errors
    /// [`ParseError::Field`] for an additional information length over 72.
    pub fn parse(m: &SidrRepMsg) -> Result<Self, ParseError> {
        Ok(Self {
            request_id: m.request_id.get(),
            status: SidrStatus(m.status),
            vendor_id: (u32::from(m.vendor_id_h.get()) << 8) | m.vendor_id_l(),
            qpn: m.qpn(),
            service_id: m.service_id.get(),
            qkey: m.qkey.get(),
            info: Info::read(
                m.info_len,
                &m.info,
                "SIDR_REP additional information length",
            )?,
            private_data: m.private_data,
        })
    }

    /// Writes the SIDR_REP.
    pub fn emit(&self, m: &mut SidrRepMsg) {
        *m = zerocopy::FromZeros::new_zeroed();
        m.request_id.set(self.request_id);
        m.status = self.status.0;
        m.vendor_id_h.set((self.vendor_id >> 8) as u16);
        m.set_vendor_id_l(self.vendor_id);
        m.set_qpn(self.qpn);
        m.service_id.set(self.service_id);
        m.qkey.set(self.qkey);
        (m.info_len, m.info) = self.info.write();
        m.private_data = self.private_data;
    }
}
