//! The QP attributes a connection gives: what the driver applies with
//! `modify_qp` (asynchronous commands) in each phase of connect, accept,
//! load path and disconnect, as the ABI's [`IvQpAttr`] and mask.
//!
//! | phase | active side | passive side |
//! |---|---|---|
//! | [`QpTarget::Init`] | before `connect` | before `accept` |
//! | [`QpTarget::Rtr`] | after `Reply` | before `accept` ([`Engine::accept_qp_attr`](crate::Engine::accept_qp_attr)) |
//! | [`QpTarget::Rts`] | after `Reply`, then `rtu` | before `accept` |
//! | [`QpTarget::LoadAlt`] | on `AprReceived` (accepted) | on `LapReceived`, then `apr` |
//! | [`QpTarget::Error`] | `disconnect`, or on `DisconnectRequest` before `drep` | same |
//!
//! Where the values come from (IBTA 12.7): the path, MTU and P_Key of the
//! REQ; the destination QPN and receive PSN from the remote's REQ or REP,
//! the send PSN from this side's; max_dest_rd_atomic is the responder
//! resources this side offered, max_rd_atomic this side's initiator depth
//! cut to the remote's responder resources; the ACK timeout is the path's
//! local ACK timeout; the transport retry count is the REQ's; the RNR retry
//! count is the one the remote asked for (the REQ's for the passive side,
//! the REP's for the active side).

use irpverbs_abi::{
    IV_ACCESS_LOCAL_WRITE, IV_ACCESS_REMOTE_ATOMIC, IV_ACCESS_REMOTE_READ, IV_ACCESS_REMOTE_WRITE,
    IV_MIG_REARM, IV_QP_ACCESS_FLAGS, IV_QP_ALT_PATH, IV_QP_AV, IV_QP_DEST_QPN,
    IV_QP_MAX_DEST_RD_ATOMIC, IV_QP_MAX_QP_RD_ATOMIC, IV_QP_MIN_RNR_TIMER, IV_QP_PATH_MIG_STATE,
    IV_QP_PATH_MTU, IV_QP_PKEY_INDEX, IV_QP_PORT, IV_QP_RETRY_CNT, IV_QP_RNR_RETRY, IV_QP_RQ_PSN,
    IV_QP_SQ_PSN, IV_QP_STATE, IV_QP_TIMEOUT, IV_QPS_ERR, IV_QPS_INIT, IV_QPS_RTR, IV_QPS_RTS,
    IvAhAttr, IvQpAttr,
};

use crate::cep::Conn;
use crate::msg::{Path, TransportType};
use crate::types::MadAddr;

/// The QP state (and attribute set) to compute.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpTarget {
    /// RESET to INIT: port, P_Key index, access flags.
    Init,
    /// INIT to RTR: path, MTU, destination QP, receive PSN, responder
    /// resources, RNR timer, alternate path.
    Rtr,
    /// RTR to RTS: send PSN, timeout, retry counts, initiator depth.
    Rts,
    /// RTS to RTS: load the alternate path and rearm migration.
    LoadAlt,
    /// Any state to ERR: flush (disconnect).
    Error,
}

/// A `modify_qp`: the attributes and the mask of those that apply.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpModify {
    /// The attributes.
    pub attr: IvQpAttr,
    /// `IV_QP_*` mask bits.
    pub mask: u32,
}

/// The address vector of `path` (this side's view) from `addr`'s port and
/// source GID. A GRH unless the path is subnet-local with a LID.
fn av(path: &Path, addr: &MadAddr) -> IvAhAttr {
    IvAhAttr {
        dgid: path.remote_gid,
        flow_label: path.flow_label,
        dlid: path.remote_lid,
        sgid_index: addr.sgid_index,
        hop_limit: path.hop_limit,
        traffic_class: path.traffic_class,
        sl: path.sl,
        src_path_bits: 0,
        static_rate: path.packet_rate,
        is_global: u8::from(!(path.subnet_local && path.remote_lid != 0)),
        port_num: addr.port_num,
        reserved: [0; 2],
    }
}

fn set_alt(attr: &mut IvQpAttr, alt: &Path, addr: &MadAddr) {
    attr.alt_ah_attr = av(alt, addr);
    attr.alt_port_num = addr.port_num;
    attr.alt_pkey_index = addr.pkey_index;
    attr.alt_timeout = alt.local_ack_timeout;
}

/// The attributes for `target`; `alt` is the alternate path to load for
/// [`QpTarget::LoadAlt`].
pub(crate) fn modify(
    conn: &Conn,
    addr: &MadAddr,
    target: QpTarget,
    alt: Option<&Path>,
) -> QpModify {
    let rc = conn.transport == Some(TransportType::Rc);
    let mut attr = IvQpAttr::default();
    let mut mask = IV_QP_STATE;
    match target {
        QpTarget::Init => {
            attr.qp_state = IV_QPS_INIT;
            attr.pkey_index = addr.pkey_index;
            attr.port_num = addr.port_num;
            attr.qp_access_flags = IV_ACCESS_LOCAL_WRITE | IV_ACCESS_REMOTE_WRITE;
            if rc && conn.rr > 0 {
                attr.qp_access_flags |= IV_ACCESS_REMOTE_READ | IV_ACCESS_REMOTE_ATOMIC;
            }
            mask |= IV_QP_PKEY_INDEX | IV_QP_PORT | IV_QP_ACCESS_FLAGS;
        }
        QpTarget::Rtr => {
            attr.qp_state = IV_QPS_RTR;
            attr.ah_attr = av(&conn.primary, addr);
            attr.path_mtu = u32::from(conn.mtu);
            attr.dest_qp_num = conn.remote_qpn;
            attr.rq_psn = conn.rq_psn;
            mask |= IV_QP_AV | IV_QP_PATH_MTU | IV_QP_DEST_QPN | IV_QP_RQ_PSN;
            if rc {
                attr.max_dest_rd_atomic = conn.rr;
                attr.min_rnr_timer = conn.min_rnr_timer;
                mask |= IV_QP_MAX_DEST_RD_ATOMIC | IV_QP_MIN_RNR_TIMER;
            }
            if let Some(a) = &conn.alternate {
                set_alt(&mut attr, a, addr);
                mask |= IV_QP_ALT_PATH;
            }
        }
        QpTarget::Rts => {
            attr.qp_state = IV_QPS_RTS;
            attr.sq_psn = conn.sq_psn;
            mask |= IV_QP_SQ_PSN;
            if rc {
                attr.timeout = conn.primary.local_ack_timeout;
                attr.retry_cnt = conn.retry_count;
                attr.rnr_retry = conn.rnr_retry;
                attr.max_rd_atomic = conn.id.min(conn.peer_rr);
                mask |= IV_QP_TIMEOUT | IV_QP_RETRY_CNT | IV_QP_RNR_RETRY | IV_QP_MAX_QP_RD_ATOMIC;
            }
            if conn.alternate.is_some() {
                attr.path_mig_state = IV_MIG_REARM;
                mask |= IV_QP_PATH_MIG_STATE;
            }
        }
        QpTarget::LoadAlt => {
            attr.qp_state = IV_QPS_RTS;
            if let Some(a) = alt {
                set_alt(&mut attr, a, addr);
                attr.path_mig_state = IV_MIG_REARM;
                mask |= IV_QP_ALT_PATH | IV_QP_PATH_MIG_STATE;
            }
        }
        QpTarget::Error => attr.qp_state = IV_QPS_ERR,
    }
    QpModify { attr, mask }
}
