//! REQ, ConnectRequest (IBTA 12.6.5, table 106): the active side asks for
//! a connection to a service.

use zerocopy::byteorder::network_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::bits::{field8, field32, flag8, flag32};
use super::path::{Path, PathMsg};
use super::{MAD_DATA_SIZE, TransportType};

/// Private data bytes of a REQ.
pub const REQ_PDATA: usize = 92;

/// The REQ message (232 bytes after the MAD header).
///
/// | byte | field |
/// |---|---|
/// | 0-3 | local communication ID |
/// | 4-7 | reserved (8), vendor ID (24) |
/// | 8-15 | service ID |
/// | 16-23 | local CA GUID |
/// | 24-27 | reserved |
/// | 28-31 | local Q_Key |
/// | 32-35 | local QPN (24), responder resources (8) |
/// | 36-39 | local EECN (24), initiator depth (8) |
/// | 40-43 | remote EECN (24), remote CM response timeout (5), transport service type (2), end-to-end flow control (1) |
/// | 44-47 | starting PSN (24), local CM response timeout (5), retry count (3) |
/// | 48-49 | partition key |
/// | 50 | path packet payload MTU (4), RDC exists (1), RNR retry count (3) |
/// | 51 | max CM retries (4), SRQ (1), extended transport type (3) |
/// | 52-95 | primary path ([`PathMsg`]) |
/// | 96-139 | alternate path ([`PathMsg`]; byte 139 bit 5: SAP supported) |
/// | 140-231 | private data |
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReqMsg {
    /// Local communication ID.
    pub local_comm_id: U32,
    vendor: U32,
    /// Service ID.
    pub service_id: U64,
    /// Local CA GUID.
    pub local_ca_guid: U64,
    reserved24: U32,
    /// Local Q_Key.
    pub local_qkey: U32,
    w32: U32,
    w36: U32,
    w40: U32,
    w44: U32,
    /// Partition key.
    pub pkey: U16,
    b50: u8,
    b51: u8,
    /// Primary path.
    pub primary: PathMsg,
    /// Alternate path (all zero: none).
    pub alternate: PathMsg,
    /// Private data.
    pub private_data: [u8; REQ_PDATA],
}

const _: () = assert!(size_of::<ReqMsg>() == MAD_DATA_SIZE);

impl ReqMsg {
    field32!(
        /// Vendor ID (24 bits).
        vendor_id, set_vendor_id: vendor[0; 24]
    );
    field32!(
        /// Local QPN (24 bits).
        local_qpn, set_local_qpn: w32[8; 24]
    );
    field32!(
        /// Responder resources: RDMA READs and atomics the sender accepts
        /// in flight as responder.
        responder_resources, set_responder_resources: w32[0; 8]
    );
    field32!(
        /// Local EECN (24 bits, RD only).
        local_eecn, set_local_eecn: w36[8; 24]
    );
    field32!(
        /// Initiator depth: RDMA READs and atomics the sender keeps in
        /// flight as requester.
        initiator_depth, set_initiator_depth: w36[0; 8]
    );
    field32!(
        /// Remote EECN (24 bits, RD only).
        remote_eecn, set_remote_eecn: w40[8; 24]
    );
    field32!(
        /// Remote CM response timeout (5 bits): how long the passive side
        /// takes to answer, 4.096 us * 2^t.
        remote_cm_response_timeout, set_remote_cm_response_timeout: w40[3; 5]
    );
    field32!(
        /// Transport service type (2 bits).
        transport_service_type, set_transport_service_type: w40[1; 2]
    );
    flag32!(
        /// End-to-end flow control.
        end_to_end_flow_control, set_end_to_end_flow_control: w40[0]
    );
    field32!(
        /// Starting PSN (24 bits) of the sender's send queue.
        starting_psn, set_starting_psn: w44[8; 24]
    );
    field32!(
        /// Local CM response timeout (5 bits): how long the sender takes to
        /// answer a REP.
        local_cm_response_timeout, set_local_cm_response_timeout: w44[3; 5]
    );
    field32!(
        /// Retry count (3 bits): transport retries.
        retry_count, set_retry_count: w44[0; 3]
    );
    field8!(
        /// Path packet payload MTU (4 bits, 1 = 256 .. 5 = 4096).
        path_mtu, set_path_mtu: b50[4; 4]
    );
    flag8!(
        /// RDC exists (RD only).
        rdc_exists, set_rdc_exists: b50[3]
    );
    field8!(
        /// RNR retry count (3 bits) the sender asks the receiver to use.
        rnr_retry_count, set_rnr_retry_count: b50[0; 3]
    );
    field8!(
        /// Max CM retries (4 bits).
        max_cm_retries, set_max_cm_retries: b51[4; 4]
    );
    flag8!(
        /// The sender's QP uses an SRQ.
        srq, set_srq: b51[3]
    );
    field8!(
        /// Extended transport type (3 bits; with transport type 3).
        extended_transport_type, set_extended_transport_type: b51[0; 3]
    );
}

/// A REQ, typed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Req {
    /// Local communication ID (the sender's).
    pub local_comm_id: u32,
    /// Vendor ID (24 bits).
    pub vendor_id: u32,
    /// Service ID.
    pub service_id: u64,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// Local Q_Key.
    pub local_qkey: u32,
    /// Local QPN (24 bits).
    pub local_qpn: u32,
    /// Responder resources.
    pub responder_resources: u8,
    /// Local EECN (24 bits).
    pub local_eecn: u32,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Remote EECN (24 bits).
    pub remote_eecn: u32,
    /// Remote CM response timeout (5 bits).
    pub remote_cm_response_timeout: u8,
    /// Transport service type.
    pub transport: TransportType,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// Starting PSN (24 bits).
    pub starting_psn: u32,
    /// Local CM response timeout (5 bits).
    pub local_cm_response_timeout: u8,
    /// Retry count (3 bits).
    pub retry_count: u8,
    /// Partition key.
    pub pkey: u16,
    /// Path MTU (4 bits, IBTA encoding).
    pub path_mtu: u8,
    /// RDC exists.
    pub rdc_exists: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// Max CM retries (4 bits).
    pub max_cm_retries: u8,
    /// SRQ.
    pub srq: bool,
    /// Extended transport type (3 bits).
    pub extended_transport_type: u8,
    /// Primary path.
    pub primary: Path,
    /// Alternate path: `None` when its bytes are all zero.
    pub alternate: Option<Path>,
    /// SAP supported.
    pub sap_supported: bool,
    /// Private data.
    pub private_data: [u8; REQ_PDATA],
}

impl Req {
    /// Reads a REQ (every bit pattern is one).
    #[must_use]
    pub fn parse(m: &ReqMsg) -> Self {
        let alt = m.alternate.get();
        Self {
            local_comm_id: m.local_comm_id.get(),
            vendor_id: m.vendor_id(),
            service_id: m.service_id.get(),
            local_ca_guid: m.local_ca_guid.get(),
            local_qkey: m.local_qkey.get(),
            local_qpn: m.local_qpn(),
            responder_resources: m.responder_resources() as u8,
            local_eecn: m.local_eecn(),
            initiator_depth: m.initiator_depth() as u8,
            remote_eecn: m.remote_eecn(),
            remote_cm_response_timeout: m.remote_cm_response_timeout() as u8,
            transport: TransportType::from_bits(m.transport_service_type() as u8),
            end_to_end_flow_control: m.end_to_end_flow_control(),
            starting_psn: m.starting_psn(),
            local_cm_response_timeout: m.local_cm_response_timeout() as u8,
            retry_count: m.retry_count() as u8,
            pkey: m.pkey.get(),
            path_mtu: m.path_mtu(),
            rdc_exists: m.rdc_exists(),
            rnr_retry_count: m.rnr_retry_count(),
            max_cm_retries: m.max_cm_retries(),
            srq: m.srq(),
            extended_transport_type: m.extended_transport_type(),
            primary: m.primary.get(),
            alternate: (!alt.is_zero()).then_some(alt),
            sap_supported: m.alternate.sap_supported(),
            private_data: m.private_data,
        }
    }

    /// Writes the REQ; fields are cut to their widths on the wire, reserved
    /// bits are zero.
    pub fn emit(&self, m: &mut ReqMsg) {
        *m = zerocopy::FromZeros::new_zeroed();
        m.local_comm_id.set(self.local_comm_id);
        m.set_vendor_id(self.vendor_id);
        m.service_id.set(self.service_id);
        m.local_ca_guid.set(self.local_ca_guid);
        m.local_qkey.set(self.local_qkey);
        m.set_local_qpn(self.local_qpn);
        m.set_responder_resources(u32::from(self.responder_resources));
        m.set_local_eecn(self.local_eecn);
        m.set_initiator_depth(u32::from(self.initiator_depth));
        m.set_remote_eecn(self.remote_eecn);
        m.set_remote_cm_response_timeout(u32::from(self.remote_cm_response_timeout));
        m.set_transport_service_type(u32::from(self.transport.bits()));
        m.set_end_to_end_flow_control(self.end_to_end_flow_control);
        m.set_starting_psn(self.starting_psn);
        m.set_local_cm_response_timeout(u32::from(self.local_cm_response_timeout));
        m.set_retry_count(u32::from(self.retry_count));
        m.pkey.set(self.pkey);
        m.set_path_mtu(self.path_mtu);
        m.set_rdc_exists(self.rdc_exists);
        m.set_rnr_retry_count(self.rnr_retry_count);
        m.set_max_cm_retries(self.max_cm_retries);
        m.set_srq(self.srq);
        m.set_extended_transport_type(self.extended_transport_type);
        m.primary.set(&self.primary);
        m.alternate.set(&self.alternate.unwrap_or_default());
        m.alternate.set_sap_supported(self.sap_supported);
        m.private_data = self.private_data;
    }
}
