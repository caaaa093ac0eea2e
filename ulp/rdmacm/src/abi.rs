//! rdma-core's structures of `<rdma/rdma_cma.h>` (Debian's librdmacm-dev)
//! that programs share with the library, and the parts of
//! `<infiniband/verbs.h>` and `<infiniband/sa.h>` they embed or pass
//! (`tests/layout.rs` checks every size and offset against the headers).
//! Nothing here calls anything, so the layout test includes this file on
//! its own.

#![allow(non_camel_case_types, missing_docs)]

use std::ffi::{c_char, c_int, c_void};

/// `union ibv_gid`, as its raw bytes (8-aligned like the union).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ibv_gid {
    pub raw: [u8; 16],
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut c_void,
    pub recv_cq: *mut c_void,
    pub srq: *mut c_void,
    pub cap: ibv_qp_cap,
    pub qp_type: c_int,
    pub sq_sig_all: c_int,
}

/// `struct ibv_rx_hash_conf`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_rx_hash_conf {
    pub rx_hash_function: u8,
    pub rx_hash_key_len: u8,
    pub rx_hash_key: *mut u8,
    pub rx_hash_fields_mask: u64,
}

/// `struct ibv_qp_init_attr_ex`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_qp_init_attr_ex {
    pub qp_context: *mut c_void,
    pub send_cq: *mut c_void,
    pub recv_cq: *mut c_void,
    pub srq: *mut c_void,
    pub cap: ibv_qp_cap,
    pub qp_type: c_int,
    pub sq_sig_all: c_int,
    pub comp_mask: u32,
    pub pd: *mut c_void,
    pub xrcd: *mut c_void,
    pub create_flags: u32,
    pub max_tso_header: u16,
    pub rwq_ind_tbl: *mut c_void,
    pub rx_hash_conf: ibv_rx_hash_conf,
    pub source_qpn: u32,
    pub send_ops_flags: u64,
}

/// `IBV_QP_INIT_ATTR_PD`.
pub const IBV_QP_INIT_ATTR_PD: u32 = 1 << 0;

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_qp_attr {
    pub qp_state: c_int,
    pub cur_qp_state: c_int,
    pub path_mtu: c_int,
    pub path_mig_state: c_int,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_int,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// The head of `struct ibv_qp` (the members this library reads).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_qp_head {
    pub context: *mut c_void,
    pub qp_context: *mut c_void,
    pub pd: *mut c_void,
    pub send_cq: *mut c_void,
    pub recv_cq: *mut c_void,
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
    pub state: c_int,
    pub qp_type: c_int,
}

/// The head of `struct ibv_pd`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_pd_head {
    pub context: *mut c_void,
    pub handle: u32,
}

/// `struct ibv_sa_path_rec` (`<infiniband/sa.h>`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_sa_path_rec {
    pub dgid: ibv_gid,
    pub sgid: ibv_gid,
    pub dlid: u16,
    pub slid: u16,
    pub raw_traffic: c_int,
    pub flow_label: u32,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub reversible: c_int,
    pub numb_path: u8,
    pub pkey: u16,
    pub sl: u8,
    pub mtu_selector: u8,
    pub mtu: u8,
    pub rate_selector: u8,
    pub rate: u8,
    pub packet_life_time_selector: u8,
    pub packet_life_time: u8,
    pub preference: u8,
}

pub const IBV_QPT_RC: c_int = 2;
pub const IBV_QPT_UD: c_int = 4;
pub const IBV_QPS_RESET: c_int = 0;
pub const IBV_QPS_INIT: c_int = 1;
pub const IBV_QPS_RTR: c_int = 2;
pub const IBV_QPS_RTS: c_int = 3;
pub const IBV_QP_STATE: c_int = 1 << 0;
pub const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub const IBV_QP_PORT: c_int = 1 << 5;
pub const IBV_QP_QKEY: c_int = 1 << 6;
pub const IBV_QP_AV: c_int = 1 << 7;
pub const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub const IBV_QP_DEST_QPN: c_int = 1 << 20;
pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub const IBV_ACCESS_REMOTE_WRITE: c_int = 2;
pub const IBV_ACCESS_REMOTE_READ: c_int = 4;
pub const IBV_ACCESS_REMOTE_ATOMIC: c_int = 8;

// <rdma/rdma_cma.h>

pub const RDMA_CM_EVENT_ADDR_RESOLVED: c_int = 0;
pub const RDMA_CM_EVENT_ADDR_ERROR: c_int = 1;
pub const RDMA_CM_EVENT_ROUTE_RESOLVED: c_int = 2;
pub const RDMA_CM_EVENT_ROUTE_ERROR: c_int = 3;
pub const RDMA_CM_EVENT_CONNECT_REQUEST: c_int = 4;
pub const RDMA_CM_EVENT_CONNECT_RESPONSE: c_int = 5;
pub const RDMA_CM_EVENT_CONNECT_ERROR: c_int = 6;
pub const RDMA_CM_EVENT_UNREACHABLE: c_int = 7;
pub const RDMA_CM_EVENT_REJECTED: c_int = 8;
pub const RDMA_CM_EVENT_ESTABLISHED: c_int = 9;
pub const RDMA_CM_EVENT_DISCONNECTED: c_int = 10;
pub const RDMA_CM_EVENT_DEVICE_REMOVAL: c_int = 11;
pub const RDMA_CM_EVENT_MULTICAST_JOIN: c_int = 12;
pub const RDMA_CM_EVENT_MULTICAST_ERROR: c_int = 13;
pub const RDMA_CM_EVENT_ADDR_CHANGE: c_int = 14;
pub const RDMA_CM_EVENT_TIMEWAIT_EXIT: c_int = 15;

pub const RDMA_PS_IPOIB: c_int = 0x0002;
pub const RDMA_PS_TCP: c_int = 0x0106;
pub const RDMA_PS_UDP: c_int = 0x0111;
pub const RDMA_PS_IB: c_int = 0x013F;
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;
pub const RDMA_MAX_RESP_RES: u8 = 0xFF;
pub const RDMA_MAX_INIT_DEPTH: u8 = 0xFF;

pub const RAI_PASSIVE: c_int = 1;
pub const RAI_NUMERICHOST: c_int = 2;
pub const RAI_NOROUTE: c_int = 4;
pub const RAI_FAMILY: c_int = 8;

pub const RDMA_OPTION_ID: c_int = 0;
pub const RDMA_OPTION_IB: c_int = 1;
pub const RDMA_OPTION_ID_TOS: c_int = 0;
pub const RDMA_OPTION_ID_REUSEADDR: c_int = 1;
pub const RDMA_OPTION_ID_AFONLY: c_int = 2;
pub const RDMA_OPTION_ID_ACK_TIMEOUT: c_int = 3;

/// `struct rdma_ib_addr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct rdma_ib_addr {
    pub sgid: ibv_gid,
    pub dgid: ibv_gid,
    /// Big-endian.
    pub pkey: u16,
}

/// `struct rdma_addr`: the source and destination as `sockaddr_storage`
/// (the anonymous unions' largest members), then the IB addresses.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_addr {
    pub src_storage: libc::sockaddr_storage,
    pub dst_storage: libc::sockaddr_storage,
    pub ibaddr: rdma_ib_addr,
}

/// `struct rdma_route`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_route {
    pub addr: rdma_addr,
    pub path_rec: *mut ibv_sa_path_rec,
    pub num_paths: c_int,
}

/// `struct rdma_event_channel`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct rdma_event_channel {
    pub fd: c_int,
}

/// `struct rdma_cm_id`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_cm_id {
    pub verbs: *mut c_void,
    pub channel: *mut rdma_event_channel,
    pub context: *mut c_void,
    pub qp: *mut c_void,
    pub route: rdma_route,
    pub ps: c_int,
    pub port_num: u8,
    pub event: *mut rdma_cm_event,
    pub send_cq_channel: *mut c_void,
    pub send_cq: *mut c_void,
    pub recv_cq_channel: *mut c_void,
    pub recv_cq: *mut c_void,
    pub srq: *mut c_void,
    pub pd: *mut c_void,
    pub qp_type: c_int,
}

/// `struct rdma_conn_param`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct rdma_conn_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub qp_num: u32,
}

/// `struct rdma_ud_param`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct rdma_ud_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub ah_attr: ibv_ah_attr,
    pub qp_num: u32,
    pub qkey: u32,
}

/// The `param` union of `struct rdma_cm_event`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union rdma_cm_event_param {
    pub conn: rdma_conn_param,
    pub ud: rdma_ud_param,
}

/// `struct rdma_cm_event`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_cm_event {
    pub id: *mut rdma_cm_id,
    pub listen_id: *mut rdma_cm_id,
    pub event: c_int,
    pub status: c_int,
    pub param: rdma_cm_event_param,
}

/// `struct rdma_addrinfo`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct rdma_addrinfo {
    pub ai_flags: c_int,
    pub ai_family: c_int,
    pub ai_qp_type: c_int,
    pub ai_port_space: c_int,
    pub ai_src_len: libc::socklen_t,
    pub ai_dst_len: libc::socklen_t,
    pub ai_src_addr: *mut libc::sockaddr,
    pub ai_dst_addr: *mut libc::sockaddr,
    pub ai_src_canonname: *mut c_char,
    pub ai_dst_canonname: *mut c_char,
    pub ai_route_len: usize,
    pub ai_route: *mut c_void,
    pub ai_connect_len: usize,
    pub ai_connect: *mut c_void,
    pub ai_next: *mut rdma_addrinfo,
}

/// A struct's C name, size and member offsets.
pub type Layout = (&'static str, usize, Vec<(&'static str, usize)>);

/// The layout facts `tests/layout.rs` checks against the headers.
#[must_use]
pub fn layout() -> Vec<Layout> {
    use std::mem::{offset_of, size_of};
    macro_rules! l {
        ($c:literal, $t:ty { $($f:ident),* $(,)? }) => {
            ($c, size_of::<$t>(), vec![$((stringify!($f), offset_of!($t, $f))),*])
        };
    }
    vec![
        l!("union ibv_gid", ibv_gid { raw }),
        l!(
            "struct ibv_global_route",
            ibv_global_route {
                dgid,
                flow_label,
                sgid_index,
                hop_limit,
                traffic_class
            }
        ),
        l!(
            "struct ibv_ah_attr",
            ibv_ah_attr {
                grh,
                dlid,
                sl,
                src_path_bits,
                static_rate,
                is_global,
                port_num
            }
        ),
        l!(
            "struct ibv_qp_cap",
            ibv_qp_cap {
                max_send_wr,
                max_recv_wr,
                max_send_sge,
                max_recv_sge,
                max_inline_data
            }
        ),
        l!(
            "struct ibv_qp_init_attr",
            ibv_qp_init_attr {
                qp_context,
                send_cq,
                recv_cq,
                srq,
                cap,
                qp_type,
                sq_sig_all
            }
        ),
        l!(
            "struct ibv_rx_hash_conf",
            ibv_rx_hash_conf {
                rx_hash_function,
                rx_hash_key_len,
                rx_hash_key,
                rx_hash_fields_mask
            }
        ),
        l!(
            "struct ibv_qp_init_attr_ex",
            ibv_qp_init_attr_ex {
                qp_context,
                send_cq,
                recv_cq,
                srq,
                cap,
                qp_type,
                sq_sig_all,
                comp_mask,
                pd,
                xrcd,
                create_flags,
                max_tso_header,
                rwq_ind_tbl,
                rx_hash_conf,
                source_qpn,
                send_ops_flags
            }
        ),
        l!(
            "struct ibv_qp_attr",
            ibv_qp_attr {
                qp_state,
                cur_qp_state,
                path_mtu,
                path_mig_state,
                qkey,
                rq_psn,
                sq_psn,
                dest_qp_num,
                qp_access_flags,
                cap,
                ah_attr,
                alt_ah_attr,
                pkey_index,
                alt_pkey_index,
                en_sqd_async_notify,
                sq_draining,
                max_rd_atomic,
                max_dest_rd_atomic,
                min_rnr_timer,
                port_num,
                timeout,
                retry_cnt,
                rnr_retry,
                alt_port_num,
                alt_timeout,
                rate_limit
            }
        ),
        (
            "struct ibv_qp",
            0,
            vec![
                ("context", offset_of!(ibv_qp_head, context)),
                ("pd", offset_of!(ibv_qp_head, pd)),
                ("handle", offset_of!(ibv_qp_head, handle)),
                ("qp_num", offset_of!(ibv_qp_head, qp_num)),
                ("qp_type", offset_of!(ibv_qp_head, qp_type)),
            ],
        ),
        (
            "struct ibv_pd",
            size_of::<ibv_pd_head>(),
            vec![
                ("context", offset_of!(ibv_pd_head, context)),
                ("handle", offset_of!(ibv_pd_head, handle)),
            ],
        ),
        l!(
            "struct ibv_sa_path_rec",
            ibv_sa_path_rec {
                dgid,
                sgid,
                dlid,
                slid,
                raw_traffic,
                flow_label,
                hop_limit,
                traffic_class,
                reversible,
                numb_path,
                pkey,
                sl,
                mtu_selector,
                mtu,
                rate_selector,
                rate,
                packet_life_time_selector,
                packet_life_time,
                preference
            }
        ),
        l!("struct rdma_ib_addr", rdma_ib_addr { sgid, dgid, pkey }),
        l!(
            "struct rdma_addr",
            rdma_addr {
                src_storage,
                dst_storage
            }
        ),
        (
            "struct rdma_addr",
            size_of::<rdma_addr>(),
            vec![("addr.ibaddr", offset_of!(rdma_addr, ibaddr))],
        ),
        l!(
            "struct rdma_route",
            rdma_route {
                addr,
                path_rec,
                num_paths
            }
        ),
        l!("struct rdma_event_channel", rdma_event_channel { fd }),
        l!(
            "struct rdma_cm_id",
            rdma_cm_id {
                verbs,
                channel,
                context,
                qp,
                route,
                ps,
                port_num,
                event,
                send_cq_channel,
                send_cq,
                recv_cq_channel,
                recv_cq,
                srq,
                pd,
                qp_type
            }
        ),
        l!(
            "struct rdma_conn_param",
            rdma_conn_param {
                private_data,
                private_data_len,
                responder_resources,
                initiator_depth,
                flow_control,
                retry_count,
                rnr_retry_count,
                srq,
                qp_num
            }
        ),
        l!(
            "struct rdma_ud_param",
            rdma_ud_param {
                private_data,
                private_data_len,
                ah_attr,
                qp_num,
                qkey
            }
        ),
        l!(
            "struct rdma_cm_event",
            rdma_cm_event {
                id,
                listen_id,
                event,
                status,
                param
            }
        ),
        l!(
            "struct rdma_addrinfo",
            rdma_addrinfo {
                ai_flags,
                ai_family,
                ai_qp_type,
                ai_port_space,
                ai_src_len,
                ai_dst_len,
                ai_src_addr,
                ai_dst_addr,
                ai_src_canonname,
                ai_dst_canonname,
                ai_route_len,
                ai_route,
                ai_connect_len,
                ai_connect,
                ai_next
            }
        ),
    ]
}
