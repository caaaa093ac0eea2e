//! Automatic path migration (IBTA 17.2.8): an RC or UC QP with an
//! alternate path armed moves to it when its primary path fails.
//!
//! A QP's migration state is its `attr.path_mig_state`: MIGRATED until an
//! alternate path is loaded (`modify_qp` with `IV_QP_ALT_PATH`) and armed
//! (`IV_QP_PATH_MIG_STATE` REARM or ARMED: this HCA arms at once), then
//! ARMED until it migrates. Migrating makes the alternate path the primary
//! (address vector, port, P_Key index, ACK timeout) and the state MIGRATED;
//! the alternate path stays loaded, and a new one is armed by REARM.
//!
//! It migrates:
//! - as requester, when a request ran out its `retry_cnt` retries on the
//!   primary path: the requests in flight are sent again on the alternate
//!   path, with every retry left, and `PATH_MIG` is raised; when the
//!   alternate path leads nowhere either (no route to its GID, the port's
//!   link down), `PATH_MIG_ERR` is raised instead and the WQE fails with
//!   `RETRY_EXC_ERR` as without an alternate path;
//! - as responder, when a packet with MigReq set arrives from the
//!   alternate path's addresses (its peer migrated): the packet is taken,
//!   and `PATH_MIG` is raised;
//! - by `modify_qp(PATH_MIG_STATE = MIGRATED)` from ARMED (no event: the
//!   owner asked for it).
//!
//! Packets carry MigReq set once the QP migrated (MIGRATED with an
//! alternate path loaded, as Linux's rdmavt sets it in MIGRATED; a QP that
//! never had an alternate path sends it clear, as rxe does).
//!
//! IRQL: DISPATCH_LEVEL, under `HCA_LOCK`, as the rest of the transport.
//! Nothing here allocates.

use irpverbs_abi::{IV_MIG_ARMED, IV_MIG_MIGRATED, IV_QPT_UD, IvQpAttr};
use irpverbs_core::AsyncEvent;

use crate::firmware::qp::{Qp, alt_loaded, migrate_attr};
use crate::firmware::qp_state::Path;
use crate::transport::engine::Env;
use crate::wire::packet::{Gid, Packet};

/// The BTH MigReq bit a QP with `attr` sends.
pub(crate) const fn mig_req(attr: &IvQpAttr) -> bool {
    attr.path_mig_state == IV_MIG_MIGRATED && alt_loaded(attr)
}

/// The path a connected QP with `attr` takes to `dest_qpn`, by its primary
/// address vector (`alt` false) or its alternate one; `gid0` when the
/// source GID index names no entry.
pub(crate) fn path(
    attr: &IvQpAttr,
    port: &crate::firmware::port::Port,
    alt: bool,
    gid0: Gid,
) -> Path {
    let av = if alt {
        &attr.alt_ah_attr
    } else {
        &attr.ah_attr
    };
    Path {
        sgid: port.gid(u32::from(av.sgid_index)).unwrap_or(gid0),
        dgid: av.dgid,
        dest_qpn: attr.dest_qp_num,
        traffic_class: av.traffic_class,
        flow_label: av.flow_label,
        hop_limit: av.hop_limit,
        mig_req: mig_req(attr),
    }
}

/// Migrates QP `qp` to its alternate path now (the caller checked that it
/// is armed).
fn migrate(qp: &mut Qp, env: &Env<'_>) {
    migrate_attr(&mut qp.attr);
    qp.tx.path = path(&qp.attr, env.port, false, env.dp.gid);
}

/// Armed and connected.
fn armed(qp: &Qp) -> bool {
    qp.qp_type != IV_QPT_UD && qp.attr.path_mig_state == IV_MIG_ARMED && alt_loaded(&qp.attr)
}

/// QP `qpn`'s request ran out its retries on the current path. Armed, it
/// migrates to the alternate path when that one has a route (`PATH_MIG`,
/// every retry left: true, send again), else `PATH_MIG_ERR` (false: the
/// WQE fails). Not armed: false, nothing raised.
pub(crate) fn retries_exhausted(qpn: u32, qp: &mut Qp, env: &mut Env<'_>) -> bool {
    if !armed(qp) {
        return false;
    }
    if !env.dp.reaches(&qp.attr.alt_ah_attr.dgid) {
        env.dp.raise(AsyncEvent::PathMigrationError(qpn));
        return false;
    }
    migrate(qp, env);
    qp.tx.req.retry_left = qp.attr.retry_cnt;
    env.dp.raise(AsyncEvent::PathMigrated(qpn));
    true
}

/// A packet for QP `qpn` came from other addresses than its path's: if it
/// is armed, the packet carries MigReq and comes from the alternate path's
/// addresses, its peer migrated and so does it (`PATH_MIG`): true, the
/// packet is to be taken. False otherwise (the packet is foreign).
// Cold, out of line: its path is not in the frames of every packet's
// checks (`engine::accepts`, docs/stack-budget.md).
#[cold]
#[inline(never)]
pub(crate) fn migration_request(qpn: u32, qp: &mut Qp, env: &mut Env<'_>, pkt: &Packet) -> bool {
    if !pkt.mig_req || !armed(qp) {
        return false;
    }
    let alt = path(&qp.attr, env.port, true, env.dp.gid);
    if pkt.sgid != alt.dgid || pkt.dgid != alt.sgid {
        return false;
    }
    migrate(qp, env);
    env.dp.raise(AsyncEvent::PathMigrated(qpn));
    true
}
