//! CM MADs on the wire: the 256-byte management datagrams of the
//! communication management class (IBTA 13.4 for the MAD, 12.6, 12.8 and
//! 12.11 for the messages).
//!
//! Each message has a zero-copy view in network byte order (`ReqMsg`,
//! `RepMsg`, ...: exactly the 232 bytes after the MAD header, alignment 1,
//! with accessors for the packed bit fields) and a typed struct (`Req`,
//! `Rep`, ...) with `parse` from the view and `emit` into it. [`parse`]
//! takes a whole MAD: untrusted bytes, checked, never a panic; what parses
//! emits back ([`Mad::emit`]) to a MAD that parses to the same value.
//!
//! The offsets are those of IBTA volume 1 chapter 12 (tables 106-121),
//! which Linux transcribes in `include/rdma/ibta_vol1_c12.h` and Wireshark
//! dissects in `packet-infiniband.c`; the tests check a few of them byte by
//! byte.
//!
//! Reserved fields are sent as zero and ignored on receipt. Private data
//! has no length on the wire: every message carries its full private data
//! field, zero-padded by the sender.

mod bits;
pub mod cpi;
pub mod header;
pub mod lap;
pub mod mra;
pub mod path;
pub mod rej;
pub mod rep;
pub mod req;
pub mod short;
pub mod sidr;

use core::fmt;

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

pub use cpi::{CPI_LEN, ClassPortInfo, ClassPortInfoMsg, CpiData};
pub use header::{
    BASE_VERSION, CM_CLASS_VERSION, MAD_DATA_SIZE, MAD_HDR_SIZE, MAD_SIZE, METHOD_GET,
    METHOD_GET_RESP, METHOD_SEND, MGMT_CLASS_CM, MadHdr, MadHeader, attr,
};
pub use lap::{APR_PDATA, Apr, AprMsg, AprStatus, LAP_PDATA, Lap, LapMsg};
pub use mra::{MRA_PDATA, Mra, MraMsg, MraedMsg};
pub use path::{Path, PathMsg};
pub use rej::{ARI_LEN, Info, REJ_PDATA, Rej, RejMsg, RejReason, RejectedMsg};
pub use rep::{REP_PDATA, Rep, RepMsg};
pub use req::{REQ_PDATA, Req, ReqMsg};
pub use short::{DREP_PDATA, DREQ_PDATA, Drep, DrepMsg, Dreq, DreqMsg, RTU_PDATA, Rtu, RtuMsg};
pub use sidr::{
    SIDR_REP_PDATA, SIDR_REQ_PDATA, SidrRep, SidrRepMsg, SidrReq, SidrReqMsg, SidrStatus,
};

/// A whole MAD: the header and the message, in network byte order.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MadBuf {
    /// The common MAD header.
    pub hdr: MadHdr,
    /// The CM message.
    pub data: [u8; MAD_DATA_SIZE],
}

const _: () = assert!(size_of::<MadBuf>() == MAD_SIZE);

/// Why bytes are not a CM MAD this engine takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ParseError {
    /// Not exactly 256 bytes.
    Length,
    /// A base version other than 1.
    BaseVersion,
    /// A management class other than CM (0x07).
    NotCm,
    /// A CM class version other than 2.
    ClassVersion,
    /// A method the attribute does not take (CM messages are Send,
    /// ClassPortInfo is Get or GetResp).
    Method,
    /// An attribute ID the CM does not define.
    Attribute,
    /// A field with a reserved value.
    Field(&'static str),
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::Length => f.write_str("a MAD is 256 bytes"),
            ParseError::BaseVersion => f.write_str("MAD base version is not 1"),
            ParseError::NotCm => f.write_str("not the CM management class"),
            ParseError::ClassVersion => f.write_str("CM class version is not 2"),
            ParseError::Method => f.write_str("method not valid for the attribute"),
            ParseError::Attribute => f.write_str("unknown CM attribute"),
            ParseError::Field(name) => write!(f, "reserved value in {name}"),
        }
    }
}

/// The transport service type of a REQ (2 bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TransportType {
    /// Reliable connection.
    Rc,
    /// Unreliable connection.
    Uc,
    /// Reliable datagram.
    Rd,
    /// 3: the extended transport type field says which (XRC).
    Extended,
}

impl TransportType {
    /// From the 2-bit wire value.
    #[must_use]
    pub const fn from_bits(v: u8) -> Self {
        match v & 3 {
            0 => TransportType::Rc,
            1 => TransportType::Uc,
            2 => TransportType::Rd,
            _ => TransportType::Extended,
        }
    }

    /// The 2-bit wire value.
    #[must_use]
    pub const fn bits(self) -> u8 {
        match self {
            TransportType::Rc => 0,
            TransportType::Uc => 1,
            TransportType::Rd => 2,
            TransportType::Extended => 3,
        }
    }
}

/// A CM message, typed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmMsg {
    /// ClassPortInfo (Get or GetResp).
    ClassPortInfo(ClassPortInfo),
    /// REQ.
    Req(Req),
    /// MRA.
    Mra(Mra),
    /// REJ.
    Rej(Rej),
    /// REP.
    Rep(Rep),
    /// RTU.
    Rtu(Rtu),
    /// DREQ.
    Dreq(Dreq),
    /// DREP.
    Drep(Drep),
    /// SIDR_REQ.
    SidrReq(SidrReq),
    /// SIDR_REP.
    SidrRep(SidrRep),
    /// LAP.
    Lap(Lap),
    /// APR.
    Apr(Apr),
}

impl CmMsg {
    /// The message's attribute ID.
    #[must_use]
    pub const fn attr_id(&self) -> u16 {
        match self {
            CmMsg::ClassPortInfo(_) => attr::CLASS_PORT_INFO,
            CmMsg::Req(_) => attr::REQ,
            CmMsg::Mra(_) => attr::MRA,
            CmMsg::Rej(_) => attr::REJ,
            CmMsg::Rep(_) => attr::REP,
            CmMsg::Rtu(_) => attr::RTU,
            CmMsg::Dreq(_) => attr::DREQ,
            CmMsg::Drep(_) => attr::DREP,
            CmMsg::SidrReq(_) => attr::SIDR_REQ,
            CmMsg::SidrRep(_) => attr::SIDR_REP,
            CmMsg::Lap(_) => attr::LAP,
            CmMsg::Apr(_) => attr::APR,
        }
    }
}

/// A parsed CM MAD.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mad {
    /// The header.
    pub hdr: MadHeader,
    /// The message.
    pub msg: CmMsg,
}

impl Mad {
    /// A CM MAD carrying `msg`: method Send (GetResp for a ClassPortInfo),
    /// transaction `tid`.
    #[must_use]
    pub fn new(tid: u64, msg: CmMsg) -> Self {
        let method = match msg {
            CmMsg::ClassPortInfo(_) => METHOD_GET_RESP,
            _ => METHOD_SEND,
        };
        Self {
            hdr: MadHeader::cm(method, msg.attr_id(), tid),
            msg,
        }
    }

    /// Writes the MAD into `out`. The header's attribute ID is the
    /// message's.
    pub fn emit(&self, out: &mut [u8; MAD_SIZE]) {
        let buf: &mut MadBuf = zerocopy::transmute_mut!(out);
        let hdr = MadHeader {
            attr_id: self.msg.attr_id(),
            ..self.hdr
        };
        hdr.write(&mut buf.hdr);
        let data = &mut buf.data;
        match &self.msg {
            CmMsg::ClassPortInfo(m) => {
                let v: &mut CpiData = zerocopy::transmute_mut!(data);
                *v = zerocopy::FromZeros::new_zeroed();
                m.emit(&mut v.cpi);
            }
            CmMsg::Req(m) => m.emit(zerocopy::transmute_mut!(data)),
            CmMsg::Mra(m) => m.emit(zerocopy::transmute_mut!(data)),
            CmMsg::Rej(m) => m.emit(zerocopy::transmute_mut!(data)),
            CmMsg::Rep(m) => m.emit(zerocopy::transmute_mut!(data)),
            CmMsg::Rtu(m) => m.emit(zerocopy::transmute_mut!(data)),
            CmMsg::Dreq(m) => m.emit(zerocopy::transmute_mut!(data)),
            CmMsg::Drep(m) => m.emit(zerocopy::transmute_mut!(data)),
            CmMsg::SidrReq(m) => m.emit(zerocopy::transmute_mut!(data)),
            CmMsg::SidrRep(m) => m.emit(zerocopy::transmute_mut!(data)),
            CmMsg::Lap(m) => m.emit(zerocopy::transmute_mut!(data)),
            CmMsg::Apr(m) => m.emit(zerocopy::transmute_mut!(data)),
        }
    }

    /// The MAD's bytes.
    #[must_use]
    pub fn to_bytes(&self) -> [u8; MAD_SIZE] {
        let mut out = [0; MAD_SIZE];
        self.emit(&mut out);
        out
    }
}

/// Checks the length, base version and class of `bytes` and returns the
/// header and the message bytes (any class version).
///
/// # Errors
/// [`ParseError::Length`], [`ParseError::BaseVersion`],
/// [`ParseError::NotCm`].
pub fn parse_header(bytes: &[u8]) -> Result<(MadHeader, &[u8; MAD_DATA_SIZE]), ParseError> {
    let arr: &[u8; MAD_SIZE] = bytes.try_into().map_err(|_| ParseError::Length)?;
    let buf: &MadBuf = zerocopy::transmute_ref!(arr);
    let hdr = MadHeader::read(&buf.hdr);
    if hdr.base_version != BASE_VERSION {
        return Err(ParseError::BaseVersion);
    }
    if hdr.mgmt_class != MGMT_CLASS_CM {
        return Err(ParseError::NotCm);
    }
    Ok((hdr, &buf.data))
}

/// Parses the message of a MAD whose header [`parse_header`] accepted.
///
/// # Errors
/// [`ParseError::ClassVersion`], [`ParseError::Method`],
/// [`ParseError::Attribute`], [`ParseError::Field`].
pub fn parse_msg(hdr: &MadHeader, data: &[u8; MAD_DATA_SIZE]) -> Result<CmMsg, ParseError> {
    if hdr.class_version != CM_CLASS_VERSION {
        return Err(ParseError::ClassVersion);
    }
    if hdr.attr_id == attr::CLASS_PORT_INFO {
        if hdr.method != METHOD_GET && hdr.method != METHOD_GET_RESP {
            return Err(ParseError::Method);
        }
        let v: &CpiData = zerocopy::transmute_ref!(data);
        return Ok(CmMsg::ClassPortInfo(ClassPortInfo::parse(&v.cpi)));
    }
    let known = matches!(hdr.attr_id, attr::REQ..=attr::APR);
    if !known {
        return Err(ParseError::Attribute);
    }
    if hdr.method != METHOD_SEND {
        return Err(ParseError::Method);
    }
    Ok(match hdr.attr_id {
        attr::REQ => CmMsg::Req(Req::parse(zerocopy::transmute_ref!(data))),
        attr::MRA => CmMsg::Mra(Mra::parse(zerocopy::transmute_ref!(data))?),
        attr::REJ => CmMsg::Rej(Rej::parse(zerocopy::transmute_ref!(data))?),
        attr::REP => CmMsg::Rep(Rep::parse(zerocopy::transmute_ref!(data))),
        attr::RTU => CmMsg::Rtu(Rtu::parse(zerocopy::transmute_ref!(data))),
        attr::DREQ => CmMsg::Dreq(Dreq::parse(zerocopy::transmute_ref!(data))),
        attr::DREP => CmMsg::Drep(Drep::parse(zerocopy::transmute_ref!(data))),
        attr::SIDR_REQ => CmMsg::SidrReq(SidrReq::parse(zerocopy::transmute_ref!(data))),
        attr::SIDR_REP => CmMsg::SidrRep(SidrRep::parse(zerocopy::transmute_ref!(data))?),
        attr::LAP => CmMsg::Lap(Lap::parse(zerocopy::transmute_ref!(data))),
        _ => CmMsg::Apr(Apr::parse(zerocopy::transmute_ref!(data))?),
    })
}

/// Parses a whole CM MAD.
///
/// # Errors
/// Any [`ParseError`]: the MAD is to be dropped (the engine answers a REQ
/// of another class version with a REJ first).
pub fn parse(bytes: &[u8]) -> Result<Mad, ParseError> {
    let (hdr, data) = parse_header(bytes)?;
    Ok(Mad {
        hdr,
        msg: parse_msg(&hdr, data)?,
    })
}
