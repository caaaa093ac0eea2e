//! The tests. Each opens what it needs, checks, and closes everything.

use irpverbs_abi::*;
use zerocopy::IntoBytes;

use crate::{Dut, dp, preconditions as pre};
use irpverbs_verbs::{Client, av, qp_request, rts_steps};

/// A conformance test.
pub type Test = fn(&dyn Dut) -> Result<(), String>;

/// Every test, by name.
pub const SUITE: &[(&str, Test)] = &[
    ("version_and_device", version_and_device),
    ("query_port_and_gid", query_port_and_gid),
    (
        "pd_lifecycle_and_stale_handle",
        pd_lifecycle_and_stale_handle,
    ),
    ("pd_busy_while_dependents", pd_busy_while_dependents),
    ("cq_and_srq_busy_while_qp", cq_and_srq_busy_while_qp),
    (
        "handles_foreign_and_wrong_type",
        handles_foreign_and_wrong_type,
    ),
    ("qp_walk_to_rts_every_type", qp_walk_to_rts_every_type),
    ("qp_sqd_err_reset", qp_sqd_err_reset),
    (
        "qp_invalid_transitions_change_nothing",
        qp_invalid_transitions_change_nothing,
    ),
    ("qp_create_checks", qp_create_checks),
    ("mr_checks", mr_checks),
    ("bad_buffers_and_codes", bad_buffers_and_codes),
    ("reserved_fields_must_be_zero", reserved_fields_must_be_zero),
    ("cq_create_resize_limits", cq_create_resize_limits),
    ("srq_modify_query", srq_modify_query),
    ("ah_checks", ah_checks),
    ("close_with_objects_alive", close_with_objects_alive),
    ("comp_channel_lifecycle", comp_channel_lifecycle),
    ("rings_map_into_the_caller", rings_map_into_the_caller),
    // The documented preconditions the tests above do not reach.
    ("pre_query_gid", pre::pre_query_gid),
    ("pre_create_srq", pre::pre_create_srq),
    ("pre_channels", pre::pre_channels),
    ("pre_notify_and_acks", pre::pre_notify_and_acks),
    ("pre_listen", pre::pre_listen),
    // The data path: the speed path, every completion status.
    ("dp_rc_send_recv_sgl", dp::dp_rc_send_recv_sgl),
    (
        "dp_rc_send_with_imm_and_unsignaled",
        dp::dp_rc_send_with_imm_and_unsignaled,
    ),
    ("dp_rc_send_with_invalidate", dp::dp_rc_send_with_invalidate),
    (
        "dp_rc_send_with_invalidate_of_an_mr",
        dp::dp_rc_send_with_invalidate_of_an_mr,
    ),
    ("dp_rc_memory_window_type_1", dp::dp_rc_memory_window_type_1),
    (
        "dp_rc_rdma_write_and_write_with_imm",
        dp::dp_rc_rdma_write_and_write_with_imm,
    ),
    ("dp_rc_rdma_read", dp::dp_rc_rdma_read),
    ("dp_rc_atomics", dp::dp_rc_atomics),
    ("dp_inline_data", dp::dp_inline_data),
    ("dp_ud_send_grh_src_qp", dp::dp_ud_send_grh_src_qp),
    ("dp_uc_send_and_write", dp::dp_uc_send_and_write),
    (
        "dp_srq_receive_and_limit_event",
        dp::dp_srq_receive_and_limit_event,
    ),
    (
        "dp_solicited_only_notification",
        dp::dp_solicited_only_notification,
    ),
    (
        "dp_completion_channel_events",
        dp::dp_completion_channel_events,
    ),
    ("dp_loc_len_err", dp::dp_loc_len_err),
    ("dp_loc_prot_err", dp::dp_loc_prot_err),
    (
        "dp_loc_qp_op_err_garbage_wqe",
        dp::dp_loc_qp_op_err_garbage_wqe,
    ),
    ("dp_rem_access_err", dp::dp_rem_access_err),
    ("dp_rem_inv_req_err", dp::dp_rem_inv_req_err),
    ("dp_rem_op_err", dp::dp_rem_op_err),
    ("dp_rnr_retry_exc_err", dp::dp_rnr_retry_exc_err),
    (
        "dp_rnr_retries_run_on_the_devices_clock",
        dp::dp_rnr_retries_run_on_the_devices_clock,
    ),
    (
        "dp_retry_exc_err_missing_qp",
        dp::dp_retry_exc_err_missing_qp,
    ),
    (
        "dp_wr_flush_err_exactly_once",
        dp::dp_wr_flush_err_exactly_once,
    ),
    ("dp_cq_overrun_cq_error", dp::dp_cq_overrun_cq_error),
    (
        "dp_work_queues_take_their_reported_depth",
        dp::dp_work_queues_take_their_reported_depth,
    ),
];

pub(crate) fn expect<T: std::fmt::Debug>(
    what: &str,
    got: Result<T, NtStatus>,
    want: NtStatus,
) -> Result<(), String> {
    match got {
        Err(s) if s == want => Ok(()),
        Err(s) => Err(format!(
            "{what}: got {} ({s:#x}), want {}",
            status_name(s),
            status_name(want)
        )),
        Ok(v) => Err(format!(
            "{what}: succeeded ({v:?}), want {}",
            status_name(want)
        )),
    }
}

/// A destroy that must be refused with `STATUS_DEVICE_BUSY`: gives the
/// object back.
pub(crate) fn busy<T>(what: &str, got: Result<(), (T, NtStatus)>) -> Result<T, String> {
    match got {
        Ok(()) => Err(format!("{what}: succeeded, want STATUS_DEVICE_BUSY")),
        Err((object, st)) if st == STATUS_DEVICE_BUSY => Ok(object),
        Err((_, st)) => Err(format!(
            "{what}: got {} ({st:#x}), want STATUS_DEVICE_BUSY",
            status_name(st)
        )),
    }
}

pub(crate) fn ok<T>(what: &str, got: Result<T, NtStatus>) -> Result<T, String> {
    got.map_err(|s| format!("{what}: failed with {} ({s:#x})", status_name(s)))
}

fn open(d: &dyn Dut) -> Result<Client, String> {
    d.open()
        .map(Client::new)
        .map_err(|s| format!("open: {}", status_name(s)))
}

fn version_and_device(d: &dyn Dut) -> Result<(), String> {
    let c = open(d)?;
    let v = ok("get_version", c.get_version())?;
    check!(
        v.abi_version == IV_ABI_VERSION,
        "abi version {:#x}",
        v.abi_version
    );
    let dev = ok("query_device", c.query_device())?;
    check!(
        dev.abi_version == IV_ABI_VERSION,
        "device abi version {:#x}",
        dev.abi_version
    );
    check!(dev.phys_port_cnt >= 1, "no ports");
    check!(
        dev.max_qp > 0 && dev.max_cq > 0 && dev.max_cqe > 0 && dev.max_pd > 0,
        "zero limits"
    );
    check!(
        dev.max_mr_size > 0 && dev.max_qp_wr > 0 && dev.max_sge > 0,
        "zero limits"
    );
    check!(dev.node_guid != 0, "no node GUID");
    Ok(())
}

fn query_port_and_gid(d: &dyn Dut) -> Result<(), String> {
    let c = open(d)?;
    let p = ok("query_port(1)", c.query_port(1))?;
    check!(p.state == IV_PORT_ACTIVE, "port state {}", p.state);
    check!(
        p.link_layer == IV_LINK_LAYER_ETHERNET,
        "link layer {}",
        p.link_layer
    );
    check!(
        (IV_MTU_256..=IV_MTU_4096).contains(&p.active_mtu),
        "active mtu {}",
        p.active_mtu
    );
    check!(p.gid_tbl_len >= 1, "gid table empty");
    expect("query_port(0)", c.query_port(0), STATUS_INVALID_PARAMETER)?;
    let ports = ok("query_device", c.query_device())?.phys_port_cnt;
    expect(
        "query_port(past last)",
        c.query_port(u32::from(ports) + 1),
        STATUS_INVALID_PARAMETER,
    )?;
    let gid = ok("query_gid(1,0)", c.query_gid(1, 0))?;
    check!(gid != [0; 16], "gid 0 is zero");
    check!(
        gid == p.gid0,
        "gid0 differs between query_port and query_gid"
    );
    expect(
        "query_gid(past table)",
        c.query_gid(1, p.gid_tbl_len),
        STATUS_INVALID_PARAMETER,
    )?;
    Ok(())
}

fn pd_lifecycle_and_stale_handle(d: &dyn Dut) -> Result<(), String> {
    let c = open(d)?;
    let pd = ok("alloc_pd", c.alloc_pd())?;
    check!(pd.pd != 0, "zero handle");
    ok("dealloc_pd", c.dealloc_pd(pd.pd))?;
    expect(
        "dealloc_pd(stale)",
        c.dealloc_pd(pd.pd),
        STATUS_INVALID_HANDLE,
    )?;
    let again = ok("alloc_pd", c.alloc_pd())?;
    check!(again.pd != pd.pd, "handle reused without a new generation");
    expect(
        "dealloc_pd(stale after reuse)",
        c.dealloc_pd(pd.pd),
        STATUS_INVALID_HANDLE,
    )?;
    ok("dealloc_pd", c.dealloc_pd(again.pd))?;
    expect("dealloc_pd(0)", c.dealloc_pd(0), STATUS_INVALID_HANDLE)?;
    expect(
        "dealloc_pd(garbage)",
        c.dealloc_pd(0xDEAD_BEEF_0102_0304),
        STATUS_INVALID_HANDLE,
    )?;
    Ok(())
}

fn pd_busy_while_dependents(d: &dyn Dut) -> Result<(), String> {
    let c = open(d)?;
    let buf = vec![0u8; 4096];
    let gid = ok("query_gid", c.query_gid(1, 0))?;
    // One dependent of each kind, one at a time.
    for kind in ["mr", "qp", "srq", "ah"] {
        let pd = ok("alloc_pd", c.alloc_pd())?.pd;
        let cq = ok("create_cq", c.create_cq(16))?.cq;
        let c = &c;
        let destroy: Box<dyn Fn() -> Result<(), NtStatus> + '_> = match kind {
            "mr" => {
                let mr = ok(
                    "reg_mr",
                    c.reg_mr(pd, buf.as_ptr() as u64, 4096, IV_ACCESS_LOCAL_WRITE),
                )?
                .mr;
                Box::new(move || c.dereg_mr(mr))
            }
            "qp" => {
                let qp = ok("create_qp", c.create_qp(pd, cq, IV_QPT_RC))?.qp;
                Box::new(move || c.destroy_qp(qp))
            }
            "srq" => {
                let srq = ok("create_srq", c.create_srq(pd, 16, 0))?.srq;
                Box::new(move || c.destroy_srq(srq))
            }
            _ => {
                let ah = ok("create_ah", c.create_ah(pd, &av(gid)))?.ah;
                Box::new(move || c.destroy_ah(ah))
            }
        };
        expect(
            &format!("dealloc_pd with {kind}"),
            c.dealloc_pd(pd),
            STATUS_DEVICE_BUSY,
        )?;
        ok(&format!("destroy {kind}"), destroy())?;
        ok(&format!("dealloc_pd after {kind}"), c.dealloc_pd(pd))?;
        ok("destroy_cq", c.destroy_cq(cq))?;
    }
    Ok(())
}

fn cq_and_srq_busy_while_qp(d: &dyn Dut) -> Result<(), String> {
    let c = open(d)?;
    let pd = ok("alloc_pd", c.alloc_pd())?.pd;
    let scq = ok("create_cq", c.create_cq(16))?.cq;
    let rcq = ok("create_cq", c.create_cq(16))?.cq;
    let srq = ok("create_srq", c.create_srq(pd, 16, 0))?.srq;
    let mut req = qp_request(pd, scq, srq, IV_QPT_RC);
    req.recv_cq = rcq;
    let qp = ok("create_qp", c.create_qp_with(&req))?.qp;
    expect("destroy send cq", c.destroy_cq(scq), STATUS_DEVICE_BUSY)?;
    expect("destroy recv cq", c.destroy_cq(rcq), STATUS_DEVICE_BUSY)?;
    expect("destroy srq", c.destroy_srq(srq), STATUS_DEVICE_BUSY)?;
    expect("dealloc pd", c.dealloc_pd(pd), STATUS_DEVICE_BUSY)?;
    // Busy changed nothing: the QP still works.
    ok("query_qp", c.query_qp(qp))?;
    ok("destroy_qp", c.destroy_qp(qp))?;
    ok("destroy srq", c.destroy_srq(srq))?;
    ok("destroy send cq", c.destroy_cq(scq))?;
    ok("destroy recv cq", c.destroy_cq(rcq))?;
    ok("dealloc pd", c.dealloc_pd(pd))?;
    Ok(())
}

fn handles_foreign_and_wrong_type(d: &dyn Dut) -> Result<(), String> {
    let a = open(d)?;
    let b = open(d)?;
    let pd = ok("alloc_pd", a.alloc_pd())?.pd;
    let cq = ok("create_cq", a.create_cq(8))?.cq;
    // B's own objects at the same indices must not make A's handles valid there.
    let bpd = ok("alloc_pd b", b.alloc_pd())?.pd;
    let bcq = ok("create_cq b", b.create_cq(8))?.cq;
    expect("foreign pd", b.dealloc_pd(pd), STATUS_INVALID_HANDLE)?;
    expect("foreign cq", b.destroy_cq(cq), STATUS_INVALID_HANDLE)?;
    expect(
        "foreign pd in create_qp",
        b.create_qp(pd, bcq, IV_QPT_RC),
        STATUS_INVALID_HANDLE,
    )?;
    expect("pd as cq", a.destroy_cq(pd), STATUS_INVALID_HANDLE)?;
    expect("cq as pd", a.dealloc_pd(cq), STATUS_INVALID_HANDLE)?;
    expect(
        "cq as pd in create_qp",
        a.create_qp(cq, cq, IV_QPT_RC),
        STATUS_INVALID_HANDLE,
    )?;
    expect(
        "pd as cq in create_qp",
        a.create_qp(pd, pd, IV_QPT_RC),
        STATUS_INVALID_HANDLE,
    )?;
    expect("pd as qp", a.query_qp(pd), STATUS_INVALID_HANDLE)?;
    // Nothing was changed by any of that.
    ok("b dealloc", b.dealloc_pd(bpd))?;
    ok("b destroy cq", b.destroy_cq(bcq))?;
    ok("a destroy cq", a.destroy_cq(cq))?;
    ok("a dealloc", a.dealloc_pd(pd))?;
    Ok(())
}

fn qp_walk_to_rts_every_type(d: &dyn Dut) -> Result<(), String> {
    let c = open(d)?;
    let pd = ok("alloc_pd", c.alloc_pd())?.pd;
    let cq = ok("create_cq", c.create_cq(64))?.cq;
    let gid = ok("query_gid", c.query_gid(1, 0))?;
    for t in [IV_QPT_RC, IV_QPT_UC, IV_QPT_UD] {
        let qp = ok("create_qp", c.create_qp(pd, cq, t))?;
        check!(qp.qpn > 1 && qp.qpn <= 0xFF_FFFF, "qpn {:#x}", qp.qpn);
        check!(
            qp.cap.max_send_wr >= 16 && qp.cap.max_recv_wr >= 16,
            "caps shrank: {:?}",
            qp.cap
        );
        let q = ok("query_qp", c.query_qp(qp.qp))?;
        check!(
            q.attr.qp_state == IV_QPS_RESET,
            "new QP in state {}",
            q.attr.qp_state
        );
        check!(q.qp_type == t && q.qpn == qp.qpn, "query_qp type/qpn");
        let mut states = Vec::new();
        for (mask, attr) in rts_steps(t, 0x77, gid) {
            ok(
                &format!("modify type {t} to {}", attr.qp_state),
                c.modify_qp(qp.qp, mask, &attr),
            )?;
            states.push(ok("query_qp", c.query_qp(qp.qp))?.attr.qp_state);
        }
        check!(
            states == [IV_QPS_INIT, IV_QPS_RTR, IV_QPS_RTS],
            "type {t}: states {states:?}"
        );
        let q = ok("query_qp", c.query_qp(qp.qp))?;
        if t != IV_QPT_UD {
            check!(
                q.attr.dest_qp_num == 0x77,
                "dest qpn {:#x}",
                q.attr.dest_qp_num
            );
            check!(
                q.attr.path_mtu == IV_MTU_1024,
                "path mtu {}",
                q.attr.path_mtu
            );
            check!(q.attr.ah_attr.dgid == gid, "dgid");
        } else {
            check!(q.attr.qkey == 0x1111_1111, "qkey {:#x}", q.attr.qkey);
        }
        check!(q.attr.sq_psn == 0x4321, "sq psn {:#x}", q.attr.sq_psn);
        ok("destroy_qp", c.destroy_qp(qp.qp))?;
    }
    ok("destroy_cq", c.destroy_cq(cq))?;
    ok("dealloc_pd", c.dealloc_pd(pd))?;
    Ok(())
}

fn qp_sqd_err_reset(d: &dyn Dut) -> Result<(), String> {
    let c = open(d)?;
    let pd = ok("alloc_pd", c.alloc_pd())?.pd;
    let cq = ok("create_cq", c.create_cq(64))?.cq;
    let gid = ok("query_gid", c.query_gid(1, 0))?;
    let qp = ok("create_qp", c.create_qp(pd, cq, IV_QPT_RC))?.qp;
    ok("to rts", c.connect_qp(qp, IV_QPT_RC, 9, gid))?;
    let sqd = IvQpAttr {
        qp_state: IV_QPS_SQD,
        en_sqd_async_notify: 1,
        ..Default::default()
    };
    ok(
        "rts->sqd",
        c.modify_qp(qp, IV_QP_STATE | IV_QP_EN_SQD_ASYNC_NOTIFY, &sqd),
    )?;
    check!(
        ok("query", c.query_qp(qp))?.attr.qp_state == IV_QPS_SQD,
        "not SQD"
    );
    // Asked for: the SQ drained event, which must be acknowledged before
    // the QP can be destroyed.
    let ev = ok("get_async_event", c.get_async_event())?;
    check!(
        ev.event_type == IV_EVENT_SQ_DRAINED && ev.handle == qp,
        "event {ev:?}"
    );
    ok("ack", c.ack_async_event(qp, IV_EVENT_SQ_DRAINED))?;
    let rts = IvQpAttr {
        qp_state: IV_QPS_RTS,
        min_rnr_timer: 3,
        ..Default::default()
    };
    ok(
        "sqd->rts",
        c.modify_qp(qp, IV_QP_STATE | IV_QP_MIN_RNR_TIMER, &rts),
    )?;
    ok("rts->rts", c.modify_qp(qp, IV_QP_MIN_RNR_TIMER, &rts))?;
    let err = IvQpAttr {
        qp_state: IV_QPS_ERR,
        ..Default::default()
    };
    ok("rts->err", c.modify_qp(qp, IV_QP_STATE, &err))?;
    check!(
        ok("query", c.query_qp(qp))?.attr.qp_state == IV_QPS_ERR,
        "not ERR"
    );
    expect(
        "err->rts",
        c.modify_qp(
            qp,
            IV_QP_STATE,
            &IvQpAttr {
                qp_state: IV_QPS_RTS,
                ..Default::default()
            },
        ),
        STATUS_INVALID_DEVICE_STATE,
    )?;
    ok(
        "err->reset",
        c.modify_qp(qp, IV_QP_STATE, &IvQpAttr::default()),
    )?;
    check!(
        ok("query", c.query_qp(qp))?.attr.qp_state == IV_QPS_RESET,
        "not RESET"
    );
    // And from RESET it can start again.
    ok("to rts again", c.connect_qp(qp, IV_QPT_RC, 9, gid))?;
    // Without an ack the QP could not be destroyed: prove the busy rule.
    ok(
        "rts->sqd again",
        c.modify_qp(qp, IV_QP_STATE | IV_QP_EN_SQD_ASYNC_NOTIFY, &sqd),
    )?;
    // The event is asynchronous: take it (waiting if need be), then the QP
    // is busy until it is acknowledged.
    ok("get_async_event", c.get_async_event())?;
    expect(
        "destroy with an unacknowledged event",
        c.destroy_qp(qp),
        STATUS_DEVICE_BUSY,
    )?;
    ok("ack", c.ack_async_event(qp, IV_EVENT_SQ_DRAINED))?;
    ok("destroy_qp", c.destroy_qp(qp))?;
    ok("destroy_cq", c.destroy_cq(cq))?;
    ok("dealloc_pd", c.dealloc_pd(pd))?;
    Ok(())
}

fn qp_invalid_transitions_change_nothing(d: &dyn Dut) -> Result<(), String> {
    let c = open(d)?;
    let pd = ok("alloc_pd", c.alloc_pd())?.pd;
    let cq = ok("create_cq", c.create_cq(64))?.cq;
    let gid = ok("query_gid", c.query_gid(1, 0))?;
    let qp = ok("create_qp", c.create_qp(pd, cq, IV_QPT_RC))?.qp;
    let steps = rts_steps(IV_QPT_RC, 5, gid);
    let state = |c: &Client| c.query_qp(qp).map(|q| q.attr.qp_state);
    // RESET -> RTR skips INIT.
    let (rtr_mask, rtr) = steps[1];
    expect(
        "reset->rtr",
        c.modify_qp(qp, rtr_mask, &rtr),
        STATUS_INVALID_DEVICE_STATE,
    )?;
    check!(
        state(&c) == Ok(IV_QPS_RESET),
        "moved after a refused modify"
    );
    // RESET -> INIT without the port.
    let (init_mask, init) = steps[0];
    expect(
        "reset->init missing port",
        c.modify_qp(qp, init_mask & !IV_QP_PORT, &init),
        STATUS_INVALID_PARAMETER_MIX,
    )?;
    expect(
        "reset->init with an extra attribute",
        c.modify_qp(qp, init_mask | IV_QP_SQ_PSN, &init),
        STATUS_INVALID_PARAMETER_MIX,
    )?;
    expect(
        "reset->init with port 0",
        c.modify_qp(
            qp,
            init_mask,
            &IvQpAttr {
                port_num: 0,
                ..init
            },
        ),
        STATUS_INVALID_PARAMETER,
    )?;
    expect(
        "unknown mask bit",
        c.modify_qp(qp, init_mask | (1 << 30), &init),
        STATUS_INVALID_PARAMETER,
    )?;
    expect(
        "bad state value",
        c.modify_qp(
            qp,
            IV_QP_STATE,
            &IvQpAttr {
                qp_state: 9,
                ..init
            },
        ),
        STATUS_INVALID_PARAMETER,
    )?;
    check!(
        state(&c) == Ok(IV_QPS_RESET),
        "moved after refused modifies"
    );
    ok("reset->init", c.modify_qp(qp, init_mask, &init))?;
    // cur_qp_state that is not the QP's state.
    let (rts_mask, rts) = steps[2];
    ok("init->rtr", c.modify_qp(qp, rtr_mask, &rtr))?;
    expect(
        "rtr->rts with wrong cur state",
        c.modify_qp(
            qp,
            rts_mask | IV_QP_CUR_STATE,
            &IvQpAttr {
                cur_qp_state: IV_QPS_SQD,
                ..rts
            },
        ),
        STATUS_INVALID_DEVICE_STATE,
    )?;
    expect(
        "rtr->rts with a 25-bit psn",
        c.modify_qp(
            qp,
            rts_mask,
            &IvQpAttr {
                sq_psn: 1 << 24,
                ..rts
            },
        ),
        STATUS_INVALID_PARAMETER,
    )?;
    check!(state(&c) == Ok(IV_QPS_RTR), "moved after refused modifies");
    ok("rtr->rts", c.modify_qp(qp, rts_mask, &rts))?;
    ok("destroy_qp", c.destroy_qp(qp))?;
    ok("destroy_cq", c.destroy_cq(cq))?;
    ok("dealloc_pd", c.dealloc_pd(pd))?;
    Ok(())
}

fn qp_create_checks(d: &dyn Dut) -> Result<(), String> {
    let c = open(d)?;
    let dev = ok("query_device", c.query_device())?;
    let pd = ok("alloc_pd", c.alloc_pd())?.pd;
    let cq = ok("create_cq", c.create_cq(16))?.cq;
    let srq = ok("create_srq", c.create_srq(pd, 16, 0))?.srq;
    let base = qp_request(pd, cq, 0, IV_QPT_RC);
    let cases = [
        ("qp type 1", IvCreateQpIn { qp_type: 1, ..base }),
        ("qp type 5", IvCreateQpIn { qp_type: 5, ..base }),
        (
            "sq_sig_all 2",
            IvCreateQpIn {
                sq_sig_all: 2,
                ..base
            },
        ),
        (
            "send wr over max",
            IvCreateQpIn {
                cap: IvQpCap {
                    max_send_wr: dev.max_qp_wr + 1,
                    ..base.cap
                },
                ..base
            },
        ),
        (
            "sge over max",
            IvCreateQpIn {
                cap: IvQpCap {
                    max_send_sge: dev.max_sge + 1,
                    ..base.cap
                },
                ..base
            },
        ),
        (
            "inline over max",
            IvCreateQpIn {
                cap: IvQpCap {
                    max_inline_data: dev.max_inline_data + 1,
                    ..base.cap
                },
                ..base
            },
        ),
        (
            "cap reserved",
            IvCreateQpIn {
                cap: IvQpCap {
                    reserved: 1,
                    ..base.cap
                },
                ..base
            },
        ),
        ("recv wr with srq", IvCreateQpIn { srq, ..base }),
    ];
    for (what, req) in cases {
        expect(what, c.create_qp_with(&req), STATUS_INVALID_PARAMETER)?;
    }
    expect(
        "srq handle is a cq",
        c.create_qp_with(&IvCreateQpIn {
            srq: cq,
            ..qp_request(pd, cq, srq, IV_QPT_RC)
        }),
        STATUS_INVALID_HANDLE,
    )?;
    let q = ok(
        "qp on srq",
        c.create_qp_with(&qp_request(pd, cq, srq, IV_QPT_UD)),
    )?;
    ok("destroy", c.destroy_qp(q.qp))?;
    ok("destroy srq", c.destroy_srq(srq))?;
    ok("destroy cq", c.destroy_cq(cq))?;
    ok("dealloc", c.dealloc_pd(pd))?;
    Ok(())
}

fn mr_checks(d: &dyn Dut) -> Result<(), String> {
    let c = open(d)?;
    let dev = ok("query_device", c.query_device())?;
    let pd = ok("alloc_pd", c.alloc_pd())?.pd;
    let buf = vec![0u8; 8192];
    let a = buf.as_ptr() as u64;
    let mr = ok("reg_mr", c.reg_mr(pd, a, 8192, IV_ACCESS_ALL))?;
    check!(mr.lkey != 0 && mr.rkey != 0, "zero keys");
    let mr2 = ok(
        "reg_mr read-only",
        c.reg_mr(pd, a, 100, IV_ACCESS_REMOTE_READ),
    )?;
    check!(mr2.lkey != mr.lkey, "duplicate lkey");
    expect("length 0", c.reg_mr(pd, a, 0, 0), STATUS_INVALID_PARAMETER)?;
    expect(
        "length over max",
        c.reg_mr(pd, a, dev.max_mr_size + 1, 0),
        STATUS_INVALID_PARAMETER,
    )?;
    expect(
        "wraps",
        c.reg_mr(pd, u64::MAX - 10, 100, 0),
        STATUS_INVALID_PARAMETER,
    )?;
    expect(
        "unknown access bit",
        c.reg_mr(pd, a, 64, 1 << 9),
        STATUS_INVALID_PARAMETER,
    )?;
    expect(
        "remote write without local write",
        c.reg_mr(pd, a, 64, IV_ACCESS_REMOTE_WRITE),
        STATUS_INVALID_PARAMETER,
    )?;
    expect(
        "remote atomic without local write",
        c.reg_mr(pd, a, 64, IV_ACCESS_REMOTE_ATOMIC),
        STATUS_INVALID_PARAMETER,
    )?;
    expect(
        "kernel address from user",
        c.reg_mr(pd, 0xFFFF_8000_0000_0000, 4096, 0),
        STATUS_ACCESS_DENIED,
    )?;
    expect("bad pd", c.reg_mr(0x1234, a, 64, 0), STATUS_INVALID_HANDLE)?;
    // A kernel-only IOCTL from a user-mode caller.
    let req = IvRegMrIn {
        pd,
        addr: a,
        length: 64,
        access: 0,
        reserved: 0,
    };
    let (st, _) = c.raw(
        IOCTL_IV_REG_PHYS_MR,
        req.as_bytes(),
        size_of::<IvRegMrOut>(),
    );
    check!(
        st == STATUS_ACCESS_DENIED,
        "REG_PHYS_MR from user: {}",
        status_name(st)
    );
    // ALLOC_MR (fast registration) is kernel-only too; a device with the
    // memory management extensions reports how long a page list may be.
    expect(
        "ALLOC_MR from user",
        c.alloc_mr(pd, 1),
        STATUS_ACCESS_DENIED,
    )?;
    let caps = ok("query_device", c.query_device())?;
    let mgt = caps.device_cap_flags & IV_DEVICE_MEM_MGT_EXTENSIONS != 0;
    check!(
        mgt == (caps.max_fast_reg_page_list_len != 0),
        "max_fast_reg_page_list_len {} with the extensions {mgt}",
        caps.max_fast_reg_page_list_len
    );
    ok("dereg", c.dereg_mr(mr.mr))?;
    ok("dereg", c.dereg_mr(mr2.mr))?;
    expect("dereg stale", c.dereg_mr(mr.mr), STATUS_INVALID_HANDLE)?;
    ok("dealloc", c.dealloc_pd(pd))?;
    drop(buf);
    Ok(())
}

fn bad_buffers_and_codes(d: &dyn Dut) -> Result<(), String> {
    let c = open(d)?;
    let (st, _) = c.raw(0x003B_0000 | (0xFFF << 2), &[], 0);
    check!(
        st == STATUS_INVALID_DEVICE_REQUEST,
        "unknown function: {}",
        status_name(st)
    );
    let (st, _) = c.raw(0x0022_0000 | (0x800 << 2), &[], 0);
    check!(
        st == STATUS_INVALID_DEVICE_REQUEST,
        "other device type: {}",
        status_name(st)
    );
    let pd_in = IvAllocPdIn::default();
    let (st, _) = c.raw(
        IOCTL_IV_ALLOC_PD,
        &pd_in.as_bytes()[..4],
        size_of::<IvAllocPdOut>(),
    );
    check!(
        st == STATUS_INFO_LENGTH_MISMATCH,
        "short input: {}",
        status_name(st)
    );
    let long = [0u8; 16];
    let (st, _) = c.raw(IOCTL_IV_ALLOC_PD, &long, size_of::<IvAllocPdOut>());
    check!(
        st == STATUS_INFO_LENGTH_MISMATCH,
        "long input: {}",
        status_name(st)
    );
    let (st, _) = c.raw(
        IOCTL_IV_ALLOC_PD,
        pd_in.as_bytes(),
        size_of::<IvAllocPdOut>() - 1,
    );
    check!(
        st == STATUS_BUFFER_TOO_SMALL,
        "short output: {}",
        status_name(st)
    );
    let (st, _) = c.raw(IOCTL_IV_QUERY_DEVICE, &[], 8);
    check!(
        st == STATUS_BUFFER_TOO_SMALL,
        "short query output: {}",
        status_name(st)
    );
    let (st, _) = c.raw(IOCTL_IV_QUERY_DEVICE, &[1], size_of::<IvQueryDeviceOut>());
    check!(
        st == STATUS_INFO_LENGTH_MISMATCH,
        "input to a no-input verb: {}",
        status_name(st)
    );
    // A longer output buffer is fine: only the struct is written.
    let (st, out) = c.raw(IOCTL_IV_ALLOC_PD, pd_in.as_bytes(), 64);
    check!(
        st == STATUS_SUCCESS && out.len() == size_of::<IvAllocPdOut>(),
        "long output: {} {}",
        status_name(st),
        out.len()
    );
    Ok(())
}

fn reserved_fields_must_be_zero(d: &dyn Dut) -> Result<(), String> {
    let c = open(d)?;
    let pd = ok("alloc_pd", c.alloc_pd())?.pd;
    let cq = ok("create_cq", c.create_cq(8))?.cq;
    let qp = ok("create_qp", c.create_qp(pd, cq, IV_QPT_RC))?.qp;
    let srq = ok("create_srq", c.create_srq(pd, 8, 0))?.srq;
    let raw = |code: u32, bytes: &[u8], out: usize| c.raw(code, bytes, out).0;
    let cases: Vec<(&str, u32, Vec<u8>, usize)> = vec![
        (
            "alloc_pd flags",
            IOCTL_IV_ALLOC_PD,
            IvAllocPdIn {
                flags: 1,
                reserved: 0,
            }
            .as_bytes()
            .to_vec(),
            16,
        ),
        (
            "alloc_pd reserved",
            IOCTL_IV_ALLOC_PD,
            IvAllocPdIn {
                flags: 0,
                reserved: 1,
            }
            .as_bytes()
            .to_vec(),
            16,
        ),
        (
            "reg_mr reserved",
            IOCTL_IV_REG_MR,
            IvRegMrIn {
                pd,
                addr: 4096,
                length: 4096,
                access: 0,
                reserved: 1,
            }
            .as_bytes()
            .to_vec(),
            16,
        ),
        (
            "resize_cq reserved",
            IOCTL_IV_RESIZE_CQ,
            IvResizeCqIn {
                cq,
                cqe: 16,
                reserved: 1,
            }
            .as_bytes()
            .to_vec(),
            size_of::<IvResizeCqOut>(),
        ),
        (
            "query_port reserved",
            IOCTL_IV_QUERY_PORT,
            IvQueryPortIn {
                port_num: 1,
                reserved: 1,
            }
            .as_bytes()
            .to_vec(),
            64,
        ),
        (
            "modify_qp reserved",
            IOCTL_IV_MODIFY_QP,
            IvModifyQpIn {
                qp,
                attr_mask: 0,
                reserved: 1,
                attr: IvQpAttr::default(),
            }
            .as_bytes()
            .to_vec(),
            0,
        ),
        (
            "modify_qp attr reserved",
            IOCTL_IV_MODIFY_QP,
            IvModifyQpIn {
                qp,
                attr_mask: IV_QP_STATE,
                reserved: 0,
                attr: IvQpAttr {
                    reserved0: 1,
                    ..Default::default()
                },
            }
            .as_bytes()
            .to_vec(),
            0,
        ),
        (
            "create_srq reserved",
            IOCTL_IV_CREATE_SRQ,
            IvCreateSrqIn {
                pd,
                user_context: 0,
                max_wr: 4,
                max_sge: 1,
                srq_limit: 0,
                reserved: 1,
            }
            .as_bytes()
            .to_vec(),
            size_of::<IvCreateSrqOut>(),
        ),
        (
            "modify_srq reserved",
            IOCTL_IV_MODIFY_SRQ,
            IvModifySrqIn {
                srq,
                attr_mask: IV_SRQ_LIMIT,
                max_wr: 0,
                srq_limit: 1,
                reserved: 1,
            }
            .as_bytes()
            .to_vec(),
            0,
        ),
        (
            "create_ah reserved",
            IOCTL_IV_CREATE_AH,
            IvCreateAhIn {
                pd,
                attr: IvAhAttr {
                    reserved: [1, 0],
                    ..av([1; 16])
                },
            }
            .as_bytes()
            .to_vec(),
            size_of::<IvCreateAhOut>(),
        ),
    ];
    for (what, code, bytes, out) in cases {
        let st = raw(code, &bytes, out);
        check!(
            st == STATUS_INVALID_PARAMETER,
            "{what}: {}",
            status_name(st)
        );
    }
    check!(
        ok("query_qp", c.query_qp(qp))?.attr.qp_state == IV_QPS_RESET,
        "QP changed"
    );
    ok("destroy qp", c.destroy_qp(qp))?;
    ok("destroy srq", c.destroy_srq(srq))?;
    ok("destroy cq", c.destroy_cq(cq))?;
    ok("dealloc", c.dealloc_pd(pd))?;
    Ok(())
}

fn cq_create_resize_limits(d: &dyn Dut) -> Result<(), String> {
    let c = open(d)?;
    let dev = ok("query_device", c.query_device())?;
    let cq = ok("create_cq", c.create_cq(10))?;
    check!(cq.cqe >= 10, "cqe {} below asked", cq.cqe);
    let r = ok("resize", c.resize_cq(cq.cq, 1000))?;
    check!(r.cqe >= 1000, "resized cqe {}", r.cqe);
    expect(
        "resize to 0",
        c.resize_cq(cq.cq, 0),
        STATUS_INVALID_PARAMETER,
    )?;
    expect(
        "resize over max",
        c.resize_cq(cq.cq, dev.max_cqe + 1),
        STATUS_INVALID_PARAMETER,
    )?;
    expect("create 0", c.create_cq(0), STATUS_INVALID_PARAMETER)?;
    expect(
        "create over max",
        c.create_cq(dev.max_cqe + 1),
        STATUS_INVALID_PARAMETER,
    )?;
    let bad_vector = IvCreateCqIn {
        cqe: 4,
        comp_vector: dev.num_comp_vectors,
        channel: 0,
        user_context: 0,
    };
    let (st, _) = c.raw(
        IOCTL_IV_CREATE_CQ,
        bad_vector.as_bytes(),
        size_of::<IvCreateCqOut>(),
    );
    check!(
        st == STATUS_INVALID_PARAMETER,
        "comp vector out of range: {}",
        status_name(st)
    );
    let bad_channel = IvCreateCqIn {
        cqe: 4,
        comp_vector: 0,
        channel: cq.cq,
        user_context: 0,
    };
    let (st, _) = c.raw(
        IOCTL_IV_CREATE_CQ,
        bad_channel.as_bytes(),
        size_of::<IvCreateCqOut>(),
    );
    check!(
        st == STATUS_INVALID_HANDLE,
        "cq handle as channel: {}",
        status_name(st)
    );
    ok("destroy", c.destroy_cq(cq.cq))?;
    expect(
        "resize destroyed",
        c.resize_cq(cq.cq, 16),
        STATUS_INVALID_HANDLE,
    )?;
    Ok(())
}

fn srq_modify_query(d: &dyn Dut) -> Result<(), String> {
    let c = open(d)?;
    let dev = ok("query_device", c.query_device())?;
    let pd = ok("alloc_pd", c.alloc_pd())?.pd;
    let srq = ok("create_srq", c.create_srq(pd, 32, 0))?;
    check!(srq.max_wr >= 32, "srq depth {}", srq.max_wr);
    ok("arm limit", c.modify_srq(srq.srq, IV_SRQ_LIMIT, 0, 8))?;
    let q = ok("query", c.query_srq(srq.srq))?;
    check!(q.srq_limit == 8 && q.max_wr >= 32, "query {q:?}");
    expect(
        "limit at the depth (must be below it)",
        c.modify_srq(srq.srq, IV_SRQ_LIMIT, 0, q.max_wr),
        STATUS_INVALID_PARAMETER,
    )?;
    expect(
        "empty mask",
        c.modify_srq(srq.srq, 0, 0, 0),
        STATUS_INVALID_PARAMETER,
    )?;
    expect(
        "unknown mask",
        c.modify_srq(srq.srq, 4, 0, 0),
        STATUS_INVALID_PARAMETER,
    )?;
    if dev.device_cap_flags & IV_DEVICE_SRQ_RESIZE != 0 {
        ok("resize", c.modify_srq(srq.srq, IV_SRQ_MAX_WR, 64, 0))?;
        check!(
            ok("query", c.query_srq(srq.srq))?.max_wr >= 64,
            "resize not applied"
        );
    } else {
        expect(
            "resize unsupported",
            c.modify_srq(srq.srq, IV_SRQ_MAX_WR, 64, 0),
            STATUS_NOT_SUPPORTED,
        )?;
    }
    expect(
        "create depth 0",
        c.create_srq(pd, 0, 0),
        STATUS_INVALID_PARAMETER,
    )?;
    expect(
        "create over max",
        c.create_srq(pd, dev.max_srq_wr + 1, 0),
        STATUS_INVALID_PARAMETER,
    )?;
    ok("destroy", c.destroy_srq(srq.srq))?;
    ok("dealloc", c.dealloc_pd(pd))?;
    Ok(())
}

fn ah_checks(d: &dyn Dut) -> Result<(), String> {
    let c = open(d)?;
    let pd = ok("alloc_pd", c.alloc_pd())?.pd;
    let gid = ok("query_gid", c.query_gid(1, 0))?;
    let ah = ok("create_ah", c.create_ah(pd, &av(gid)))?.ah;
    expect(
        "no grh",
        c.create_ah(
            pd,
            &IvAhAttr {
                is_global: 0,
                ..av(gid)
            },
        ),
        STATUS_INVALID_PARAMETER,
    )?;
    expect(
        "port 0",
        c.create_ah(
            pd,
            &IvAhAttr {
                port_num: 0,
                ..av(gid)
            },
        ),
        STATUS_INVALID_PARAMETER,
    )?;
    expect(
        "sl 16",
        c.create_ah(pd, &IvAhAttr { sl: 16, ..av(gid) }),
        STATUS_INVALID_PARAMETER,
    )?;
    expect("bad pd", c.create_ah(ah, &av(gid)), STATUS_INVALID_HANDLE)?;
    ok("destroy", c.destroy_ah(ah))?;
    expect("destroy stale", c.destroy_ah(ah), STATUS_INVALID_HANDLE)?;
    ok("dealloc", c.dealloc_pd(pd))?;
    Ok(())
}

/// A completion channel through the verbs library, without the speed path:
/// a CQ on it keeps it busy, an ack with nothing delivered is refused, a
/// CQ of another file cannot use it, and dropping the channel destroys it.
fn comp_channel_lifecycle(d: &dyn Dut) -> Result<(), String> {
    let c = open(d)?;
    let other = open(d)?;
    let ch = ok("create_comp_channel", c.create_comp_channel())?;
    let on = |cqe| IvCreateCqIn {
        cqe,
        comp_vector: 0,
        channel: ch.handle(),
        user_context: 7,
    };
    expect(
        "a CQ of another file on the channel",
        other.create_cq_with(&on(4)),
        STATUS_INVALID_HANDLE,
    )?;
    let cq = ok("create_cq_with on the channel", c.create_cq_with(&on(4)))?;
    check!(cq.cqe >= 4, "cqe {}", cq.cqe);
    expect(
        "ack an event never delivered",
        c.ack_cq_events(cq.cq, 1),
        STATUS_INVALID_PARAMETER,
    )?;
    let handle = ch.handle();
    let ch = busy("destroy a channel with a CQ on it", ch.destroy())?;
    ok("destroy the CQ", c.destroy_cq(cq.cq))?;
    drop(ch);
    let (st, _) = c.raw(
        IOCTL_IV_DESTROY_CHANNEL,
        IvHandleIn { handle }.as_bytes(),
        0,
    );
    check!(
        st == STATUS_INVALID_HANDLE,
        "the dropped channel still exists (destroy again: {})",
        status_name(st)
    );
    Ok(())
}

fn close_with_objects_alive(d: &dyn Dut) -> Result<(), String> {
    for _ in 0..3 {
        let c = open(d)?;
        let gid = ok("query_gid", c.query_gid(1, 0))?;
        let pd = ok("alloc_pd", c.alloc_pd())?.pd;
        let buf = vec![0u8; 4096];
        ok(
            "reg_mr",
            c.reg_mr(pd, buf.as_ptr() as u64, 4096, IV_ACCESS_LOCAL_WRITE),
        )?;
        let cq = ok("create_cq", c.create_cq(32))?.cq;
        let srq = ok("create_srq", c.create_srq(pd, 16, 0))?.srq;
        let qp = ok("create_qp", c.create_qp(pd, cq, IV_QPT_RC))?.qp;
        ok("to rts", c.connect_qp(qp, IV_QPT_RC, 3, gid))?;
        ok(
            "srq qp",
            c.create_qp_with(&qp_request(pd, cq, srq, IV_QPT_UD)),
        )?;
        ok("create_ah", c.create_ah(pd, &av(gid)))?;
        drop(c);
        drop(buf);
        d.check_quiescent()?;
    }
    Ok(())
}

/// A user-mode create carries only its rings' geometry; `IOCTL_IV_MAP_RINGS`
/// maps them into the caller and answers the same addresses every time.
fn rings_map_into_the_caller(d: &dyn Dut) -> Result<(), String> {
    let c = open(d)?;
    let other = open(d)?;
    let geometry_only = |m: &IvRingMap| m.control_addr == 0 && m.entries_addr == 0 && m.entries > 0;
    let mapped_as = |m: &IvRingMap, g: &IvRingMap| {
        m.control_addr != 0
            && m.entries_addr == m.control_addr + size_of::<IvRingControl>() as u64
            && (m.entries, m.stride) == (g.entries, g.stride)
    };
    let pd = ok("alloc_pd", c.alloc_pd())?.pd;
    let cq = ok("create_cq", c.create_cq(8))?;
    check!(geometry_only(&cq.ring), "cq ring {:?}", cq.ring);
    let m = ok("map cq", c.map_rings(cq.cq))?;
    check!(mapped_as(&m.ring, &cq.ring), "cq mapped {:?}", m.ring);
    check!(m.rq == IvRingMap::default(), "a cq has one ring");
    check!(
        ok("map cq again", c.map_rings(cq.cq))? == m,
        "the same addresses"
    );
    let qp = ok("create_qp", c.create_qp(pd, cq.cq, IV_QPT_RC))?;
    check!(geometry_only(&qp.sq) && geometry_only(&qp.rq), "qp rings");
    let m = ok("map qp", c.map_rings(qp.qp))?;
    check!(
        mapped_as(&m.ring, &qp.sq) && mapped_as(&m.rq, &qp.rq),
        "qp mapped {m:?}"
    );
    let srq = ok("create_srq", c.create_srq(pd, 4, 0))?;
    check!(geometry_only(&srq.ring), "srq ring");
    let m = ok("map srq", c.map_rings(srq.srq))?;
    check!(mapped_as(&m.ring, &srq.ring), "srq mapped {:?}", m.ring);
    expect("map a pd", c.map_rings(pd), STATUS_INVALID_HANDLE)?;
    expect(
        "map a foreign cq",
        other.map_rings(cq.cq),
        STATUS_INVALID_HANDLE,
    )?;
    ok("destroy_qp", c.destroy_qp(qp.qp))?;
    expect(
        "map a destroyed qp",
        c.map_rings(qp.qp),
        STATUS_INVALID_HANDLE,
    )?;
    let resized = ok("resize_cq", c.resize_cq(cq.cq, 32))?;
    check!(
        geometry_only(&resized.ring),
        "resized ring {:?}",
        resized.ring
    );
    let m = ok("map resized cq", c.map_rings(cq.cq))?;
    check!(
        mapped_as(&m.ring, &resized.ring),
        "resized mapped {:?}",
        m.ring
    );
    ok("destroy srq", c.destroy_srq(srq.srq))?;
    ok("destroy cq", c.destroy_cq(cq.cq))?;
    ok("dealloc pd", c.dealloc_pd(pd))?;
    Ok(())
}
