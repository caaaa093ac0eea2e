//! The layout facts of the modules (every size and member offset), for
//! the libraries' layout tests.

use alloc::vec;
use alloc::vec::Vec;

use crate::Layout;
use crate::cma::*;
use crate::verbs::*;

/// The layout facts of [`crate::verbs`], which `ulp/ibverbs/tests/layout.rs`
/// checks against `<infiniband/verbs.h>` and `<infiniband/sa.h>`.
#[must_use]
pub fn verbs() -> Vec<Layout> {
    use core::mem::{offset_of, size_of};
    vec![
        l!("union ibv_gid", ibv_gid { raw }),
        l!(
            "struct ibv_gid_entry",
            ibv_gid_entry {
                gid,
                gid_index,
                port_num,
                gid_type,
                ndev_ifindex
            }
        ),
        l!(
            "struct ibv_device",
            ibv_device {
                _ops,
                node_type,
                transport_type,
                name,
                dev_name,
                dev_path,
                ibdev_path
            }
        ),
        l!(
            "struct ibv_device_attr",
            ibv_device_attr {
                fw_ver,
                node_guid,
                sys_image_guid,
                max_mr_size,
                page_size_cap,
                vendor_id,
                vendor_part_id,
                hw_ver,
                max_qp,
                max_qp_wr,
                device_cap_flags,
                max_sge,
                max_sge_rd,
                max_cq,
                max_cqe,
                max_mr,
                max_pd,
                max_qp_rd_atom,
                max_ee_rd_atom,
                max_res_rd_atom,
                max_qp_init_rd_atom,
                max_ee_init_rd_atom,
                atomic_cap,
                max_ee,
                max_rdd,
                max_mw,
                max_raw_ipv6_qp,
                max_raw_ethy_qp,
                max_mcast_grp,
                max_mcast_qp_attach,
                max_total_mcast_qp_attach,
                max_ah,
                max_fmr,
                max_map_per_fmr,
                max_srq,
                max_srq_wr,
                max_srq_sge,
                max_pkeys,
                local_ca_ack_delay,
                phys_port_cnt
            }
        ),
        l!(
            "struct ibv_port_attr",
            ibv_port_attr {
                state,
                max_mtu,
                active_mtu,
                gid_tbl_len,
                port_cap_flags,
                max_msg_sz,
                bad_pkey_cntr,
                qkey_viol_cntr,
                pkey_tbl_len,
                lid,
                sm_lid,
                lmc,
                max_vl_num,
                sm_sl,
                subnet_timeout,
                init_type_reply,
                active_width,
                active_speed,
                phys_state,
                link_layer,
                flags,
                port_cap_flags2
            }
        ),
        l!(
            "struct ibv_async_event",
            ibv_async_event {
                element,
                event_type
            }
        ),
        l!(
            "struct ibv_wc",
            ibv_wc {
                wr_id,
                status,
                opcode,
                vendor_err,
                byte_len,
                imm_data,
                qp_num,
                src_qp,
                wc_flags,
                pkey_index,
                slid,
                sl,
                dlid_path_bits
            }
        ),
        l!("struct ibv_pd", ibv_pd { context, handle }),
        l!(
            "struct ibv_mr",
            ibv_mr {
                context,
                pd,
                addr,
                length,
                handle,
                lkey,
                rkey
            }
        ),
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
            "struct ibv_grh",
            ibv_grh {
                version_tclass_flow,
                paylen,
                next_hdr,
                hop_limit,
                sgid,
                dgid
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
            "struct ibv_srq_attr",
            ibv_srq_attr {
                max_wr,
                max_sge,
                srq_limit
            }
        ),
        l!(
            "struct ibv_srq_init_attr",
            ibv_srq_init_attr { srq_context, attr }
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
        l!("struct ibv_sge", ibv_sge { addr, length, lkey }),
        l!("struct ibv_send_wr", ibv_send_wr { wr_id, next, sg_list, num_sge, opcode, send_flags,
            imm_data, wr, wr.rdma, wr.atomic, wr.ud, qp_type, bind_mw }),
        l!(
            "struct ibv_recv_wr",
            ibv_recv_wr {
                wr_id,
                next,
                sg_list,
                num_sge
            }
        ),
        l!(
            "struct ibv_srq",
            ibv_srq {
                context,
                srq_context,
                pd,
                handle,
                mutex,
                cond,
                events_completed
            }
        ),
        l!(
            "struct ibv_qp",
            ibv_qp {
                context,
                qp_context,
                pd,
                send_cq,
                recv_cq,
                srq,
                handle,
                qp_num,
                state,
                qp_type,
                mutex,
                cond,
                events_completed
            }
        ),
        l!(
            "struct ibv_comp_channel",
            ibv_comp_channel {
                context,
                fd,
                refcnt
            }
        ),
        l!(
            "struct ibv_cq",
            ibv_cq {
                context,
                channel,
                cq_context,
                handle,
                cqe,
                mutex,
                cond,
                comp_events_completed,
                async_events_completed
            }
        ),
        l!(
            "struct ibv_ah",
            ibv_ah {
                context,
                pd,
                handle
            }
        ),
        l!(
            "struct ibv_context_ops",
            ibv_context_ops {
                _compat_query_device,
                _compat_query_port,
                alloc_mw,
                bind_mw,
                dealloc_mw,
                poll_cq,
                req_notify_cq,
                post_srq_recv,
                post_send,
                post_recv,
                _compat_async_event
            }
        ),
        l!(
            "struct ibv_context",
            ibv_context {
                device,
                ops,
                cmd_fd,
                async_fd,
                num_comp_vectors,
                mutex,
                abi_compat
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
    ]
}

/// The layout facts of [`crate::cma`], which `ulp/rdmacm/tests/layout.rs`
/// checks against `<rdma/rdma_cma.h>`.
#[must_use]
pub fn cma() -> Vec<Layout> {
    use core::mem::{offset_of, size_of};
    vec![
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
