//! MRA, MsgRcptAck (IBTA 12.6.6, table 107): "your message arrived, the
//! answer takes longer": the receiver extends its timeout.

use zerocopy::byteorder::network_endian::U32;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::bits::field8;
use super::{MAD_DATA_SIZE, ParseError};

/// Private data bytes of an MRA.
pub const MRA_PDATA: usize = 222;

/// The MRA message (232 bytes).
///
/// | byte | field |
/// |---|---|
/// | 0-3 | local communication ID |
/// | 4-7 | remote communication ID |
/// | 8 | message MRAed (2), reserved (6) |
/// | 9 | service timeout (5), reserved (3) |
/// | 10-231 | private data |
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MraMsg {
    /// Local communication ID.
    pub local_comm_id: U32,
    /// Remote communication ID.
    pub remote_comm_id: U32,
    b8: u8,
    b9: u8,
    /// Private data.
    pub private_data: [u8; MRA_PDATA],
}

const _: () = assert!(size_of::<MraMsg>() == MAD_DATA_SIZE);

impl MraMsg {
    field8!(
        /// Message MRAed (2 bits): 0 REQ, 1 REP, 2 LAP.
        msg_mraed, set_msg_mraed: b8[6; 2]
    );
    field8!(
        /// Service timeout (5 bits): 4.096 us * 2^t more.
        service_timeout, set_service_timeout: b9[3; 5]
    );
}

/// Which message an MRA acknowledges.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MraedMsg {
    /// The REQ.
    Req,
    /// The REP.
    Rep,
    /// The LAP.
    Lap,
}

impl MraedMsg {
    /// The wire value.
    #[must_use]
    pub const fn bits(self) -> u8 {
        match self {
            MraedMsg::Req => 0,
            MraedMsg::Rep => 1,
            MraedMsg::Lap => 2,
        }
    }
}

/// An MRA, typed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mra {
    /// Local communication ID (the sender's).
    pub local_comm_id: u32,
    /// Remote communication ID (the receiver's).
    pub remote_comm_id: u32,
    /// The message acknowledged.
    pub msg_mraed: MraedMsg,
    /// Service timeout (5 bits).
    pub service_timeout: u8,
    /// Private data.
    pub private_data: [u8; MRA_PDATA],
}

impl Mra {
    /// Reads an MRA.
    ///
    /// # Errors
    /// [`ParseError::Field`] for message MRAed 3 (reserved).
    pub fn parse(m: &MraMsg) -> Result<Self, ParseError> {
        let msg_mraed = match m.msg_mraed() {
            0 => MraedMsg::Req,
            1 => MraedMsg::Rep,
            2 => MraedMsg::Lap,
            _ => return Err(ParseError::Field("MRA message MRAed")),
        };
        Ok(Self {
            local_comm_id: m.local_comm_id.get(),
            remote_comm_id: m.remote_comm_id.get(),
            msg_mraed,
            service_timeout: m.service_timeout(),
            private_data: m.private_data,
        })
    }

    /// Writes the MRA.
    pub fn emit(&self, m: &mut MraMsg) {
        *m = zerocopy::FromZeros::new_zeroed();
        m.local_comm_id.set(self.local_comm_id);
        m.remote_comm_id.set(self.remote_comm_id);
        m.set_msg_mraed(self.msg_mraed.bits());
        m.set_service_timeout(self.service_timeout);
        m.private_data = self.private_data;
    }
}
