//! REP, ConnectReply (IBTA 12.6.8, table 110): the passive side accepts.

use zerocopy::byteorder::network_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::MAD_DATA_SIZE;
use super::bits::{field8, field32, flag8};

/// Private data bytes of a REP.
pub const REP_PDATA: usize = 196;

/// The REP message (232 bytes).
///
/// | byte | field |
/// |---|---|
/// | 0-3 | local communication ID |
/// | 4-7 | remote communication ID |
/// | 8-11 | local Q_Key |
/// | 12-15 | local QPN (24), vendor ID high (8) |
/// | 16-19 | local EE context number (24), vendor ID middle (8) |
/// | 20-23 | starting PSN (24), vendor ID low (8) |
/// | 24 | responder resources |
/// | 25 | initiator depth |
/// | 26 | target ACK delay (5), failover accepted (2), end-to-end flow control (1) |
/// | 27 | RNR retry count (3), SRQ (1), reserved (4) |
/// | 28-35 | local CA GUID |
/// | 36-231 | private data |
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RepMsg {
    /// Local communication ID.
    pub local_comm_id: U32,
    /// Remote communication ID.
    pub remote_comm_id: U32,
    /// Local Q_Key.
    pub local_qkey: U32,
    w12: U32,
    w16: U32,
    w20: U32,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    b26: u8,
    b27: u8,
    /// Local CA GUID.
    pub local_ca_guid: U64,
    /// Private data.
    pub private_data: [u8; REP_PDATA],
}

const _: () = assert!(size_of::<RepMsg>() == MAD_DATA_SIZE);

impl RepMsg {
    field32!(
        /// Local QPN (24 bits).
        local_qpn, set_local_qpn: w12[8; 24]
    );
    field32!(
        /// Vendor ID, high byte.
        vendor_id_h, set_vendor_id_h: w12[0; 8]
    );
    field32!(
        /// Local EE context number (24 bits, RD only).
        local_eecn, set_local_eecn: w16[8; 24]
    );
    field32!(
        /// Vendor ID, middle byte.
        vendor_id_m, set_vendor_id_m: w16[0; 8]
    );
    field32!(
        /// Starting PSN (24 bits) of the sender's send queue.
        starting_psn, set_starting_psn: w20[8; 24]
    );
    field32!(
        /// Vendor ID, low byte.
        vendor_id_l, set_vendor_id_l: w20[0; 8]
    );
    field8!(
        /// Target ACK delay (5 bits).
        target_ack_delay, set_target_ack_delay: b26[3; 5]
    );
    field8!(
        /// Failover accepted (2 bits): 0 accepted, 1 rejected, 2 not
        /// supported.
        failover_accepted, set_failover_accepted: b26[1; 2]
    );
    flag8!(
        /// End-to-end flow control.
        end_to_end_flow_control, set_end_to_end_flow_control: b26[0]
    );
    field8!(
        /// RNR retry count (3 bits) the sender asks the receiver to use.
        rnr_retry_count, set_rnr_retry_count: b27[5; 3]
    );
    flag8!(
        /// The sender's QP uses an SRQ.
        srq, set_srq: b27[4]
    );
}

/// A REP, typed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rep {
    /// Local communication ID (the sender's).
    pub local_comm_id: u32,
    /// Remote communication ID (the REQ's sender's).
    pub remote_comm_id: u32,
    /// Local Q_Key.
    pub local_qkey: u32,
    /// Local QPN (24 bits).
    pub local_qpn: u32,
    /// Local EE context number (24 bits).
    pub local_eecn: u32,
    /// Starting PSN (24 bits).
    pub starting_psn: u32,
    /// Vendor ID (24 bits: high, middle, low byte).
    pub vendor_id: u32,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Target ACK delay (5 bits).
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// SRQ.
    pub srq: bool,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// Private data.
    pub private_data: [u8; REP_PDATA],
}

impl Rep {
    /// Reads a REP (every bit pattern is one).
    #[must_use]
    pub fn parse(m: &RepMsg) -> Self {
        Self {
            local_comm_id: m.local_comm_id.get(),
            remote_comm_id: m.remote_comm_id.get(),
            local_qkey: m.local_qkey.get(),
            local_qpn: m.local_qpn(),
            local_eecn: m.local_eecn(),
            starting_psn: m.starting_psn(),
            vendor_id: (m.vendor_id_h() << 16) | (m.vendor_id_m() << 8) | m.vendor_id_l(),
            responder_resources: m.responder_resources,
            initiator_depth: m.initiator_depth,
            target_ack_delay: m.target_ack_delay(),
            failover_accepted: m.failover_accepted(),
            end_to_end_flow_control: m.end_to_end_flow_control(),
            rnr_retry_count: m.rnr_retry_count(),
            srq: m.srq(),
            local_ca_guid: m.local_ca_guid.get(),
            private_data: m.private_data,
        }
    }

    /// Writes the REP; fields are cut to their widths, reserved bits zero.
    pub fn emit(&self, m: &mut RepMsg) {
        *m = zerocopy::FromZeros::new_zeroed();
        m.local_comm_id.set(self.local_comm_id);
        m.remote_comm_id.set(self.remote_comm_id);
        m.local_qkey.set(self.local_qkey);
        m.set_local_qpn(self.local_qpn);
        m.set_local_eecn(self.local_eecn);
        m.set_starting_psn(self.starting_psn);
        m.set_vendor_id_h(self.vendor_id >> 16);
        m.set_vendor_id_m(self.vendor_id >> 8);
        m.set_vendor_id_l(self.vendor_id);
        m.responder_resources = self.responder_resources;
        m.initiator_depth = self.initiator_depth;
        m.set_target_ack_delay(self.target_ack_delay);
        m.set_failover_accepted(self.failover_accepted);
        m.set_end_to_end_flow_control(self.end_to_end_flow_control);
        m.set_rnr_retry_count(self.rnr_retry_count);
        m.set_srq(self.srq);
        m.local_ca_guid.set(self.local_ca_guid);
        m.private_data = self.private_data;
    }
}
