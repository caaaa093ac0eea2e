//! The engine's vocabulary: identifiers, addresses, states, operations,
//! time.

use crate::Gid;
use crate::msg::MAD_SIZE;

/// Nanoseconds on the caller's monotonic clock. The engine never reads a
/// clock: every call that can arm a timer takes `now`.
pub type Nanos = u64;

/// 4.096 us * 2^`exp` in nanoseconds: the IBTA encoding of every CM and
/// transport timeout (`exp` above 31 counts as 31).
#[must_use]
pub const fn cm_time(exp: u8) -> Nanos {
    let e = if exp > 31 { 31 } else { exp };
    4096 << e
}

/// A connection endpoint: its local communication ID, the value of the
/// messages' "local communication ID" field. The low 24 bits (after the
/// engine's rotation) index the CEP table and the high 8 are a generation,
/// bumped each time the slot is reused, so an ID does not come back until
/// its slot has been reused 256 times; a stale ID does not resolve.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CepId(pub u32);

/// Where a MAD comes from or goes to: the remote CM's GSI (QP1, or the QP
/// it redirects to) as a UD address vector, and the local port, P_Key
/// index and source GID index the MAD travels on.
///
/// For a received MAD the driver fills it from the GSI receive completion
/// and the packet's GRH; the engine answers to it and, for a REQ that
/// creates a CEP, keeps it as the CEP's address (and takes the port, P_Key
/// index and GID index for the QP's attributes from it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MadAddr {
    /// Local port number, from 1.
    pub port_num: u8,
    /// Local P_Key index.
    pub pkey_index: u16,
    /// Local source GID index.
    pub sgid_index: u8,
    /// Remote port GID.
    pub gid: Gid,
    /// Remote LID (0 on RoCE).
    pub lid: u16,
    /// Remote QP number (1: the GSI).
    pub qpn: u32,
    /// Service level.
    pub sl: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
}

/// A MAD to send: the driver posts it on the GSI QP as a UD send to
/// `dest` (Q_Key 0x80010000).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// Destination.
    pub dest: MadAddr,
    /// The 256 bytes of the MAD.
    pub mad: [u8; MAD_SIZE],
}

/// The CM state of a CEP (IBTA 12.9.6 and 12.11: the communication
/// establishment, release and SIDR state diagrams).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum State {
    /// Created, or back from a connection: may listen, connect or resolve.
    Idle,
    /// Listening on a service ID.
    Listen,
    /// Active: REQ sent, waiting for REP (or MRA, REJ).
    ReqSent,
    /// Passive: REQ received, the owner decides (accept, reject, MRA).
    ReqRcvd,
    /// Passive: REQ received and MRA sent.
    MraReqSent,
    /// Active: REQ sent and MRA received (a longer wait).
    MraReqRcvd,
    /// Passive: REP sent, waiting for RTU.
    RepSent,
    /// Active: REP received, the owner moves the QP and sends RTU.
    RepRcvd,
    /// Active: REP received and MRA sent.
    MraRepSent,
    /// Passive: REP sent and MRA received.
    MraRepRcvd,
    /// Connected.
    Established,
    /// DREQ sent, waiting for DREP.
    DreqSent,
    /// DREQ received, the owner flushes the QP and sends DREP.
    DreqRcvd,
    /// Disconnected; stale packets drain before the QP and IDs are reused.
    Timewait,
    /// SIDR_REQ sent, waiting for SIDR_REP.
    SidrReqSent,
    /// SIDR_REQ received, the owner answers with SIDR_REP.
    SidrReqRcvd,
}

/// The alternate path loading state of an established CEP (IBTA 12.9.6,
/// LAP and APR).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LapState {
    /// No exchange in progress.
    Idle,
    /// LAP sent, waiting for APR.
    LapSent,
    /// LAP received, the owner answers with APR.
    LapRcvd,
    /// LAP received and MRA sent.
    MraLapSent,
    /// LAP sent and MRA received.
    MraLapRcvd,
}

/// An operation an owner started that completes with an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// `listen`: ends only when the CEP is destroyed.
    Listen,
    /// `connect`: completes with `Reply` (then `rtu`), `Rejected` or
    /// `Timeout`.
    Connect,
    /// `accept`: completes with `Established`, `Rejected` or `Timeout`.
    Accept,
    /// `disconnect`: completes with `DisconnectReply` or `Timeout`.
    Disconnect,
    /// `load_alternate_path`: completes with `AprReceived` or `Timeout`.
    LoadAltPath,
    /// `sidr_request`: completes with `SidrReply` or `Timeout`.
    Sidr,
}
