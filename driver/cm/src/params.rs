//! What the owner gives `connect`, `accept`, `sidr_request` and
//! `sidr_reply`.

use crate::cep::Conn;
use crate::msg::{Info, Path, SidrStatus, TransportType};
use crate::qp::{self, QpModify, QpTarget};
use crate::types::MadAddr;

/// `connect`: the REQ's fields. `Default` gives the usual values (RC, MTU
/// 4096, CM response timeouts 2^20 * 4.096 us, 15 CM retries, 7 transport
/// and RNR retries); set at least `dest`, `service_id`, `qpn` and
/// `primary`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectParams<'a> {
    /// The remote CM's GSI address, and the local port, P_Key index and
    /// source GID index the connection uses.
    pub dest: MadAddr,
    /// The service to connect to.
    pub service_id: u64,
    /// The local QP (24 bits), already in INIT.
    pub qpn: u32,
    /// RC or UC.
    pub transport: TransportType,
    /// The QP's starting send PSN (24 bits).
    pub starting_psn: u32,
    /// RDMA READs and atomics this side accepts in flight as responder.
    pub responder_resources: u8,
    /// RDMA READs and atomics this side keeps in flight as requester.
    pub initiator_depth: u8,
    /// How long the remote CM may take to answer the REQ (5 bits).
    pub remote_cm_response_timeout: u8,
    /// How long this CM takes to answer the REP (5 bits).
    pub local_cm_response_timeout: u8,
    /// Transport retry count (3 bits).
    pub retry_count: u8,
    /// RNR retry count the remote's QP should use (3 bits, 7 = infinite).
    pub rnr_retry_count: u8,
    /// CM retransmissions of each message (4 bits).
    pub max_cm_retries: u8,
    /// Path MTU (IBTA encoding, 1 = 256 .. 5 = 4096).
    pub path_mtu: u8,
    /// Partition key.
    pub pkey: u16,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// The local QP uses an SRQ.
    pub srq: bool,
    /// This side's minimum RNR NAK timer (5 bits), for its own QP.
    pub min_rnr_timer: u8,
    /// Primary path, local = this side. Its local ACK timeout is the QP's
    /// transport timeout, and with the CM response timeouts sets how long
    /// the CM waits for answers.
    pub primary: Path,
    /// Alternate path, local = this side.
    pub alternate: Option<Path>,
    /// Peer-to-peer: both sides connect to each other's service ID; a REQ
    /// from the remote for the same service ID may make this the passive
    /// side (IBTA 12.9.8.3.2).
    pub peer_to_peer: bool,
    /// Private data (up to 92 bytes, zero-padded).
    pub private_data: &'a [u8],
}

impl Default for ConnectParams<'_> {
    fn default() -> Self {
        Self {
            dest: MadAddr::default(),
            service_id: 0,
            qpn: 0,
            transport: TransportType::Rc,
            starting_psn: 0,
            responder_resources: 1,
            initiator_depth: 1,
            remote_cm_response_timeout: 20,
            local_cm_response_timeout: 20,
            retry_count: 7,
            rnr_retry_count: 7,
            max_cm_retries: 15,
            path_mtu: 5,
            pkey: 0xFFFF,
            flow_control: true,
            srq: false,
            min_rnr_timer: 12,
            primary: Path::default(),
            alternate: None,
            peer_to_peer: false,
            private_data: &[],
        }
    }
}

impl ConnectParams<'_> {
    /// The QP's RESET to INIT attributes for this connection (port, P_Key
    /// index, access flags): the active side moves its QP there before it
    /// calls `connect`. The same as [`Engine::qp_attr`](crate::Engine::qp_attr)
    /// with [`QpTarget::Init`] gives after it.
    #[must_use]
    pub fn init_attr(&self) -> QpModify {
        let conn = Conn {
            transport: Some(self.transport),
            rr: self.responder_resources,
            ..Conn::default()
        };
        qp::modify(&conn, &self.dest, QpTarget::Init, None)
    }
}

/// `accept`: the REP's fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AcceptParams<'a> {
    /// The local QP (24 bits), already in INIT (and moved to RTR and RTS
    /// with [`Engine::accept_qp_attr`](crate::Engine::accept_qp_attr)).
    pub qpn: u32,
    /// The QP's starting send PSN (24 bits).
    pub starting_psn: u32,
    /// Responder resources offered: cut to the REQ's initiator depth.
    pub responder_resources: u8,
    /// Initiator depth wanted: cut to the REQ's responder resources.
    pub initiator_depth: u8,
    /// Target ACK delay (5 bits).
    pub target_ack_delay: u8,
    /// Accept the REQ's alternate path (else failover is rejected and the
    /// alternate path dropped).
    pub accept_alternate: bool,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// RNR retry count the remote's QP should use (3 bits).
    pub rnr_retry_count: u8,
    /// The local QP uses an SRQ.
    pub srq: bool,
    /// This side's minimum RNR NAK timer (5 bits).
    pub min_rnr_timer: u8,
    /// Private data (up to 196 bytes).
    pub private_data: &'a [u8],
}

impl Default for AcceptParams<'_> {
    fn default() -> Self {
        Self {
            qpn: 0,
            starting_psn: 0,
            responder_resources: 1,
            initiator_depth: 1,
            target_ack_delay: 0,
            accept_alternate: true,
            flow_control: true,
            rnr_retry_count: 7,
            srq: false,
            min_rnr_timer: 12,
            private_data: &[],
        }
    }
}

/// `sidr_request`: resolve a service ID to a UD QP.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SidrParams<'a> {
    /// The remote CM's GSI address.
    pub dest: MadAddr,
    /// The service.
    pub service_id: u64,
    /// Partition key.
    pub pkey: u16,
    /// How long to wait for the answer (5-bit exponent of 4.096 us).
    pub timeout: u8,
    /// Retransmissions (4 bits).
    pub max_retries: u8,
    /// Private data (up to 216 bytes).
    pub private_data: &'a [u8],
}

/// `sidr_reply`: the answer to a SIDR_REQ.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SidrReplyParams<'a> {
    /// Status.
    pub status: SidrStatus,
    /// The UD QP serving the service (24 bits).
    pub qpn: u32,
    /// Its Q_Key.
    pub qkey: u32,
    /// Additional information.
    pub info: Info,
    /// Private data (up to 136 bytes).
    pub private_data: &'a [u8],
}
