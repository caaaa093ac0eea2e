//! The common MAD header (IBTA 13.4.3): the first 24 bytes of every
//! 256-byte management datagram.
//!
//! | byte | field |
//! |---|---|
//! | 0 | BaseVersion (1) |
//! | 1 | MgmtClass (0x07, communication management) |
//! | 2 | ClassVersion (2 for the CM) |
//! | 3 | R (response bit) and Method (7 bits) |
//! | 4-5 | Status |
//! | 6-7 | ClassSpecific |
//! | 8-15 | TransactionID |
//! | 16-17 | AttributeID |
//! | 18-19 | reserved |
//! | 20-23 | AttributeModifier |

use zerocopy::byteorder::network_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Bytes of a MAD.
pub const MAD_SIZE: usize = 256;
/// Bytes of the common MAD header.
pub const MAD_HDR_SIZE: usize = 24;
/// Bytes after the header: the CM message.
pub const MAD_DATA_SIZE: usize = MAD_SIZE - MAD_HDR_SIZE;

/// The MAD base version of every MAD.
pub const BASE_VERSION: u8 = 1;
/// The communication management class.
pub const MGMT_CLASS_CM: u8 = 0x07;
/// The CM class version this engine speaks (IBTA 1.2 and later).
pub const CM_CLASS_VERSION: u8 = 2;

/// Method Get (ClassPortInfo queries).
pub const METHOD_GET: u8 = 0x01;
/// Method Send: every CM message.
pub const METHOD_SEND: u8 = 0x03;
/// Method GetResp (the answer to a Get).
pub const METHOD_GET_RESP: u8 = 0x81;

/// Attribute IDs of the CM class (IBTA table 104).
pub mod attr {
    /// ClassPortInfo.
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    /// ConnectRequest.
    pub const REQ: u16 = 0x0010;
    /// MsgRcptAck.
    pub const MRA: u16 = 0x0011;
    /// ConnectReject.
    pub const REJ: u16 = 0x0012;
    /// ConnectReply.
    pub const REP: u16 = 0x0013;
    /// ReadyToUse.
    pub const RTU: u16 = 0x0014;
    /// DisconnectRequest.
    pub const DREQ: u16 = 0x0015;
    /// DisconnectReply.
    pub const DREP: u16 = 0x0016;
    /// ServiceIDResReq.
    pub const SIDR_REQ: u16 = 0x0017;
    /// ServiceIDResReqResp.
    pub const SIDR_REP: u16 = 0x0018;
    /// LoadAlternatePath.
    pub const LAP: u16 = 0x0019;
    /// AlternatePathResponse.
    pub const APR: u16 = 0x001A;
}

/// The common MAD header, in network byte order.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MadHdr {
    /// BaseVersion.
    pub base_version: u8,
    /// MgmtClass.
    pub mgmt_class: u8,
    /// ClassVersion.
    pub class_version: u8,
    /// R bit and Method.
    pub method: u8,
    /// Status.
    pub status: U16,
    /// ClassSpecific.
    pub class_specific: U16,
    /// TransactionID.
    pub tid: U64,
    /// AttributeID.
    pub attr_id: U16,
    /// Reserved.
    pub reserved: U16,
    /// AttributeModifier.
    pub attr_mod: U32,
}

const _: () = assert!(size_of::<MadHdr>() == MAD_HDR_SIZE);

/// The header fields of a MAD, in host order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MadHeader {
    /// BaseVersion.
    pub base_version: u8,
    /// MgmtClass.
    pub mgmt_class: u8,
    /// ClassVersion.
    pub class_version: u8,
    /// R bit and Method.
    pub method: u8,
    /// Status.
    pub status: u16,
    /// ClassSpecific.
    pub class_specific: u16,
    /// TransactionID.
    pub tid: u64,
    /// AttributeID.
    pub attr_id: u16,
    /// AttributeModifier.
    pub attr_mod: u32,
}

impl MadHeader {
    /// A CM header (base version 1, class 0x07, class version 2) with
    /// status 0 and attribute modifier 0.
    #[must_use]
    pub fn cm(method: u8, attr_id: u16, tid: u64) -> Self {
        Self {
            base_version: BASE_VERSION,
            mgmt_class: MGMT_CLASS_CM,
            class_version: CM_CLASS_VERSION,
            method,
            status: 0,
            class_specific: 0,
            tid,
            attr_id,
            attr_mod: 0,
        }
    }

    /// Reads the header view.
    #[must_use]
    pub fn read(h: &MadHdr) -> Self {
        Self {
            base_version: h.base_version,
            mgmt_class: h.mgmt_class,
            class_version: h.class_version,
            method: h.method,
            status: h.status.get(),
            class_specific: h.class_specific.get(),
            tid: h.tid.get(),
            attr_id: h.attr_id.get(),
            attr_mod: h.attr_mod.get(),
        }
    }

    /// Writes the header view (the reserved field as zero).
    pub fn write(&self, h: &mut MadHdr) {
        *h = MadHdr {
            base_version: self.base_version,
            mgmt_class: self.mgmt_class,
            class_version: self.class_version,
            method: self.method,
            status: U16::new(self.status),
            class_specific: U16::new(self.class_specific),
            tid: U64::new(self.tid),
            attr_id: U16::new(self.attr_id),
            reserved: U16::ZERO,
            attr_mod: U32::new(self.attr_mod),
        };
    }
}
