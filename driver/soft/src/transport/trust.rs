//! What a connected QP believes, and the counters of what it does not.
//!
//! A connected QP (RC, UC) takes a packet only from its peer: the packet's
//! IP source must be the path's destination GID and its IP destination the
//! path's source GID (the GIDs the QP cached when it moved to RTR), as
//! Linux rxe's `check_addr` does; a datagram to another UDP port than the
//! HCA's is dropped before the transport sees it
//! ([`crate::wire::WireError::NotRoce`]). The UDP source port is RoCEv2's
//! flow entropy, which a sender picks and may change (a port it cannot
//! bind, an ECMP rehash; rxe and this HCA pick differently): it is not
//! checked, as rxe does not. Against a sender that forges the peer's IP
//! address, the PSN is what is left: whatever is not inside the window
//! below is dropped.
//!
//! An RC requester takes a response only when it answers a request it has
//! outstanding ([`crate::transport::completer`]): its PSN inside the window of
//! requests sent and not yet acknowledged, its opcode the one the request
//! at that PSN calls for, its AETH syndrome one IBTA defines, a READ
//! response's length and opcode sequence the READ's. Anything else is
//! dropped and counted here; it never completes or fails a WQE.
//!
//! IRQL: counted under `HCA_LOCK` (DISPATCH_LEVEL); read with
//! [`crate::SoftHca::stats`].

/// Packets a QP dropped because it does not believe them, by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrustStats {
    /// Packets to an RC or UC QP from other than its peer's GID, or to
    /// other than its own (an off-path sender, or a QP not connected).
    pub foreign_address: u64,
    /// Responses (ACK, NAK, READ response, atomic ACK) whose PSN is past
    /// every request the requester has outstanding: never sent, or sent
    /// before a rewind and sent again since.
    pub response_psn_ahead: u64,
    /// Responses whose opcode is not what the request at their PSN calls
    /// for (a READ response to a SEND, an atomic ACK to a READ).
    pub response_opcode: u64,
    /// READ responses out of sequence (opcode order) or of the wrong
    /// length for the READ they answer.
    pub response_malformed: u64,
    /// ACKs with a reserved AETH type, NAKs with a code IBTA does not
    /// define.
    pub unknown_syndrome: u64,
    /// NAKs (sequence error, RNR, invalid request, remote access, remote
    /// operation) whose PSN is not that of a request outstanding.
    pub nak_psn_invalid: u64,
}

impl TrustStats {
    /// Every packet dropped, all reasons.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.foreign_address
            .wrapping_add(self.response_psn_ahead)
            .wrapping_add(self.response_opcode)
            .wrapping_add(self.response_malformed)
            .wrapping_add(self.unknown_syndrome)
            .wrapping_add(self.nak_psn_invalid)
    }
}
