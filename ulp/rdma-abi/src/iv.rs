//! From the driver's ABI (`irpverbs-abi`) to rdma-core's: the QP
//! attributes the driver answers with (`IOCTL_IV_QUERY_QP`,
//! `IOCTL_IV_CM_INIT_QP_ATTR`) as `ibv_qp_attr`, for `ibv_query_qp` and
//! `rdma_init_qp_attr`. The attribute mask bits are the same on both
//! sides (`IV_QP_*` are `IBV_QP_*`).

use core::ffi::c_int;

use irpverbs_abi::{IvAhAttr, IvQpAttr, IvQpCap};

use crate::verbs::{ibv_ah_attr, ibv_gid, ibv_global_route, ibv_qp_attr, ibv_qp_cap};

/// `ibv_qp_cap` of the driver's capacities.
#[must_use]
pub fn qp_cap_from_iv(c: &IvQpCap) -> ibv_qp_cap {
    ibv_qp_cap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// `ibv_ah_attr` of the driver's address vector.
#[must_use]
pub fn ah_attr_from_iv(a: &IvAhAttr) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: a.dgid },
            flow_label: a.flow_label,
            sgid_index: a.sgid_index,
            hop_limit: a.hop_limit,
            traffic_class: a.traffic_class,
        },
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        is_global: a.is_global,
        port_num: a.port_num,
    }
}

/// `ibv_qp_attr` of the driver's QP attributes (no rate limit).
#[must_use]
pub fn qp_attr_from_iv(a: &IvQpAttr) -> ibv_qp_attr {
    ibv_qp_attr {
        qp_state: a.qp_state as c_int,
        cur_qp_state: a.cur_qp_state as c_int,
        path_mtu: a.path_mtu as c_int,
        path_mig_state: a.path_mig_state as c_int,
        qkey: a.qkey,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qp_num: a.dest_qp_num,
        qp_access_flags: a.qp_access_flags,
        cap: qp_cap_from_iv(&a.cap),
        ah_attr: ah_attr_from_iv(&a.ah_attr),
        alt_ah_attr: ah_attr_from_iv(&a.alt_ah_attr),
        pkey_index: a.pkey_index,
        alt_pkey_index: a.alt_pkey_index,
        en_sqd_async_notify: a.en_sqd_async_notify,
        sq_draining: a.sq_draining,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        alt_port_num: a.alt_port_num,
        alt_timeout: a.alt_timeout,
        rate_limit: 0,
    }
}
