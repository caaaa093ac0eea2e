//! The short messages: RTU (IBTA 12.6.9, table 111), DREQ (12.6.10,
//! table 112) and DREP (12.6.11, table 113).

use zerocopy::byteorder::network_endian::U32;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::MAD_DATA_SIZE;
use super::bits::field32;

/// Private data bytes of an RTU.
pub const RTU_PDATA: usize = 224;
/// Private data bytes of a DREQ.
pub const DREQ_PDATA: usize = 220;
/// Private data bytes of a DREP.
pub const DREP_PDATA: usize = 224;

/// The RTU message, and the DREP message, which has the same layout
/// (232 bytes).
///
/// | byte | field |
/// |---|---|
/// | 0-3 | local communication ID |
/// | 4-7 | remote communication ID |
/// | 8-231 | private data |
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtuMsg {
    /// Local communication ID.
    pub local_comm_id: U32,
    /// Remote communication ID.
    pub remote_comm_id: U32,
    /// Private data.
    pub private_data: [u8; RTU_PDATA],
}

const _: () = assert!(size_of::<RtuMsg>() == MAD_DATA_SIZE);

/// The DREP message: the RTU's layout.
pub type DrepMsg = RtuMsg;

/// The DREQ message (232 bytes).
///
/// | byte | field |
/// |---|---|
/// | 0-3 | local communication ID |
/// | 4-7 | remote communication ID |
/// | 8-11 | remote QPN/EECN (24), reserved (8) |
/// | 12-231 | private data |
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DreqMsg {
    /// Local communication ID.
    pub local_comm_id: U32,
    /// Remote communication ID.
    pub remote_comm_id: U32,
    w8: U32,
    /// Private data.
    pub private_data: [u8; DREQ_PDATA],
}

const _: () = assert!(size_of::<DreqMsg>() == MAD_DATA_SIZE);

impl DreqMsg {
    field32!(
        /// Remote QPN or EECN (24 bits): the receiver's QP.
        remote_qpn, set_remote_qpn: w8[8; 24]
    );
}

/// An RTU, typed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rtu {
    /// Local communication ID (the sender's).
    pub local_comm_id: u32,
    /// Remote communication ID (the receiver's).
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: [u8; RTU_PDATA],
}

/// A DREP, typed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Drep {
    /// Local communication ID (the sender's).
    pub local_comm_id: u32,
    /// Remote communication ID (the receiver's).
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: [u8; DREP_PDATA],
}

macro_rules! rtu_like {
    ($t:ident) => {
        impl $t {
            /// Reads the message (every bit pattern is one).
            #[must_use]
            pub fn parse(m: &RtuMsg) -> Self {
                Self {
                    local_comm_id: m.local_comm_id.get(),
                    remote_comm_id: m.remote_comm_id.get(),
                    private_data: m.private_data,
                }
            }

            /// Writes the message.
            pub fn emit(&self, m: &mut RtuMsg) {
                m.local_comm_id.set(self.local_comm_id);
                m.remote_comm_id.set(self.remote_comm_id);
                m.private_data = self.private_data;
            }
        }
    };
}

rtu_like!(Rtu);
rtu_like!(Drep);

/// A DREQ, typed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dreq {
    /// Local communication ID (the sender's).
    pub local_comm_id: u32,
    /// Remote communication ID (the receiver's).
    pub remote_comm_id: u32,
    /// Remote QPN (24 bits): the receiver's QP.
    pub remote_qpn: u32,
    /// Private data.
    pub private_data: [u8; DREQ_PDATA],
}

impl Dreq {
    /// Reads a DREQ (every bit pattern is one).
    #[must_use]
    pub fn parse(m: &DreqMsg) -> Self {
        Self {
            local_comm_id: m.local_comm_id.get(),
            remote_comm_id: m.remote_comm_id.get(),
            remote_qpn: m.remote_qpn(),
            private_data: m.private_data,
        }
    }

    /// Writes the DREQ.
    pub fn emit(&self, m: &mut DreqMsg) {
        *m = zerocopy::FromZeros::new_zeroed();
        m.local_comm_id.set(self.local_comm_id);
        m.remote_comm_id.set(self.remote_comm_id);
        m.set_remote_qpn(self.remote_qpn);
        m.private_data = self.private_data;
    }
}
