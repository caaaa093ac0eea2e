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
//! The counters are [`crate::TrustStats`], kept with the data path's
//! state. IRQL: counted under `HCA_LOCK` (DISPATCH_LEVEL); read with
//! [`crate::SoftHca::stats`].
