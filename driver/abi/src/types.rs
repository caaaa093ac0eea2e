//! Request and response structs, and the constants their fields take.
//!
//! Every struct is `#[repr(C)]`, made of fixed-width fields, with explicit
//! `reserved` fields where C would pad, so the layout is the same for every
//! compiler (the C tests prove it for gcc and MinGW x64). Reserved fields must
//! be zero in requests and are zero in responses.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::IvHandle;

macro_rules! abi_struct {
    ($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* pub $f:ident : $t:ty),* $(,)? }) => {
        $(#[$m])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
        pub struct $name { $($(#[$fm])* pub $f: $t),* }

        impl AbiLayout for $name {
            const NAME: &'static str = stringify!($name);
            const FIELDS: &'static [(&'static str, usize)] =
                &[$((stringify!($f), core::mem::offset_of!($name, $f))),*];
        }
    };
}

// ---------------------------------------------------------------- constants

/// QP type: reliable connected.
pub const IV_QPT_RC: u32 = 2;
/// QP type: unreliable connected.
pub const IV_QPT_UC: u32 = 3;
/// QP type: unreliable datagram.
pub const IV_QPT_UD: u32 = 4;

/// QP state RESET.
pub const IV_QPS_RESET: u32 = 0;
/// QP state INIT.
pub const IV_QPS_INIT: u32 = 1;
/// QP state RTR (ready to receive).
pub const IV_QPS_RTR: u32 = 2;
/// QP state RTS (ready to send).
pub const IV_QPS_RTS: u32 = 3;
/// QP state SQD (send queue drained).
pub const IV_QPS_SQD: u32 = 4;
/// QP state SQE (send queue error).
pub const IV_QPS_SQE: u32 = 5;
/// QP state ERR.
pub const IV_QPS_ERR: u32 = 6;

/// Path MTU 256 bytes.
pub const IV_MTU_256: u32 = 1;
/// Path MTU 512 bytes.
pub const IV_MTU_512: u32 = 2;
/// Path MTU 1024 bytes.
pub const IV_MTU_1024: u32 = 3;
/// Path MTU 2048 bytes.
pub const IV_MTU_2048: u32 = 4;
/// Path MTU 4096 bytes.
pub const IV_MTU_4096: u32 = 5;

/// Path migration state MIGRATED (the only one without alternate paths).
pub const IV_MIG_MIGRATED: u32 = 0;
/// Path migration state REARM.
pub const IV_MIG_REARM: u32 = 1;
/// Path migration state ARMED.
pub const IV_MIG_ARMED: u32 = 2;

/// Access: the HCA may write local memory (required with any remote write or atomic).
pub const IV_ACCESS_LOCAL_WRITE: u32 = 1 << 0;
/// Access: remote RDMA WRITE.
pub const IV_ACCESS_REMOTE_WRITE: u32 = 1 << 1;
/// Access: remote RDMA READ.
pub const IV_ACCESS_REMOTE_READ: u32 = 1 << 2;
/// Access: remote atomics.
pub const IV_ACCESS_REMOTE_ATOMIC: u32 = 1 << 3;
/// Every access flag this ABI version defines.
pub const IV_ACCESS_ALL: u32 = IV_ACCESS_LOCAL_WRITE
    | IV_ACCESS_REMOTE_WRITE
    | IV_ACCESS_REMOTE_READ
    | IV_ACCESS_REMOTE_ATOMIC;

/// QP attribute mask: `qp_state`.
pub const IV_QP_STATE: u32 = 1 << 0;
/// QP attribute mask: `cur_qp_state`.
pub const IV_QP_CUR_STATE: u32 = 1 << 1;
/// QP attribute mask: `en_sqd_async_notify`.
pub const IV_QP_EN_SQD_ASYNC_NOTIFY: u32 = 1 << 2;
/// QP attribute mask: `qp_access_flags`.
pub const IV_QP_ACCESS_FLAGS: u32 = 1 << 3;
/// QP attribute mask: `pkey_index`.
pub const IV_QP_PKEY_INDEX: u32 = 1 << 4;
/// QP attribute mask: `port_num`.
pub const IV_QP_PORT: u32 = 1 << 5;
/// QP attribute mask: `qkey`.
pub const IV_QP_QKEY: u32 = 1 << 6;
/// QP attribute mask: `ah_attr` (the primary path).
pub const IV_QP_AV: u32 = 1 << 7;
/// QP attribute mask: `path_mtu`.
pub const IV_QP_PATH_MTU: u32 = 1 << 8;
/// QP attribute mask: `timeout`.
pub const IV_QP_TIMEOUT: u32 = 1 << 9;
/// QP attribute mask: `retry_cnt`.
pub const IV_QP_RETRY_CNT: u32 = 1 << 10;
/// QP attribute mask: `rnr_retry`.
pub const IV_QP_RNR_RETRY: u32 = 1 << 11;
/// QP attribute mask: `rq_psn`.
pub const IV_QP_RQ_PSN: u32 = 1 << 12;
/// QP attribute mask: `max_rd_atomic`.
pub const IV_QP_MAX_QP_RD_ATOMIC: u32 = 1 << 13;
/// QP attribute mask: `alt_ah_attr`, `alt_pkey_index`, `alt_port_num`, `alt_timeout`.
pub const IV_QP_ALT_PATH: u32 = 1 << 14;
/// QP attribute mask: `min_rnr_timer`.
pub const IV_QP_MIN_RNR_TIMER: u32 = 1 << 15;
/// QP attribute mask: `sq_psn`.
pub const IV_QP_SQ_PSN: u32 = 1 << 16;
/// QP attribute mask: `max_dest_rd_atomic`.
pub const IV_QP_MAX_DEST_RD_ATOMIC: u32 = 1 << 17;
/// QP attribute mask: `path_mig_state`.
pub const IV_QP_PATH_MIG_STATE: u32 = 1 << 18;
/// QP attribute mask: `cap` (resize the work queues).
pub const IV_QP_CAP: u32 = 1 << 19;
/// QP attribute mask: `dest_qp_num`.
pub const IV_QP_DEST_QPN: u32 = 1 << 20;
/// Every QP attribute mask bit this ABI version defines.
pub const IV_QP_ATTR_ALL: u32 = (1 << 21) - 1;

/// SRQ attribute mask: `max_wr` (resize).
pub const IV_SRQ_MAX_WR: u32 = 1 << 0;
/// SRQ attribute mask: `srq_limit` (arm the limit event).
pub const IV_SRQ_LIMIT: u32 = 1 << 1;

/// Port state DOWN.
pub const IV_PORT_DOWN: u32 = 1;
/// Port state INIT.
pub const IV_PORT_INIT: u32 = 2;
/// Port state ARMED.
pub const IV_PORT_ARMED: u32 = 3;
/// Port state ACTIVE.
pub const IV_PORT_ACTIVE: u32 = 4;

/// Port link layer: InfiniBand.
pub const IV_LINK_LAYER_INFINIBAND: u8 = 1;
/// Port link layer: Ethernet (RoCE).
pub const IV_LINK_LAYER_ETHERNET: u8 = 2;

/// Atomic capability: none.
pub const IV_ATOMIC_NONE: u32 = 0;
/// Atomic capability: atomic within this HCA.
pub const IV_ATOMIC_HCA: u32 = 1;
/// Atomic capability: atomic with respect to the CPU too.
pub const IV_ATOMIC_GLOB: u32 = 2;

/// Device capability: the HCA supports SRQ resize.
pub const IV_DEVICE_SRQ_RESIZE: u64 = 1 << 13;
/// Device capability: RC QPs move to SQD and back.
pub const IV_DEVICE_RC_RNR_NAK_GEN: u64 = 1 << 12;
/// Device capability: port active event.
pub const IV_DEVICE_PORT_ACTIVE_EVENT: u64 = 1 << 7;
/// Device capability: CQ resize.
pub const IV_DEVICE_RESIZE_MAX_WR: u64 = 1 << 0;

// ---------------------------------------------------------------- structs

abi_struct! {
    /// A request that names one object: destroy, query.
    pub struct IvHandleIn {
        /// The object's handle.
        pub handle: IvHandle,
    }
}

abi_struct! {
    /// Response of `IOCTL_IV_GET_VERSION`.
    pub struct IvGetVersionOut {
        /// [`crate::IV_ABI_VERSION`] of the driver.
        pub abi_version: u32,
        /// Driver version, major in the high 16 bits.
        pub driver_version: u32,
    }
}

abi_struct! {
    /// Response of `IOCTL_IV_QUERY_DEVICE`: the device's attributes and the
    /// limits the driver enforces.
    pub struct IvQueryDeviceOut {
        /// [`crate::IV_ABI_VERSION`].
        pub abi_version: u32,
        /// IEEE OUI of the vendor.
        pub vendor_id: u32,
        /// Vendor part id.
        pub vendor_part_id: u32,
        /// Hardware version.
        pub hw_ver: u32,
        /// Firmware version (major.minor.sub as 16.16.32 bits).
        pub fw_ver: u64,
        /// Node GUID (network byte order value as u64).
        pub node_guid: u64,
        /// System image GUID.
        pub sys_image_guid: u64,
        /// Largest registrable memory region, in bytes.
        pub max_mr_size: u64,
        /// Supported page sizes (bit n set: 2^n bytes).
        pub page_size_cap: u64,
        /// `IV_DEVICE_*` capability bits.
        pub device_cap_flags: u64,
        /// Max QPs.
        pub max_qp: u32,
        /// Max work requests per work queue.
        pub max_qp_wr: u32,
        /// Max scatter/gather entries per send or receive WR.
        pub max_sge: u32,
        /// Max SGEs per RDMA READ.
        pub max_sge_rd: u32,
        /// Max CQs.
        pub max_cq: u32,
        /// Max entries per CQ.
        pub max_cqe: u32,
        /// Max MRs.
        pub max_mr: u32,
        /// Max PDs.
        pub max_pd: u32,
        /// Max outstanding RDMA READ / atomic as responder, per QP.
        pub max_qp_rd_atom: u32,
        /// Max outstanding RDMA READ / atomic as requester, per QP.
        pub max_qp_init_rd_atom: u32,
        /// Max responder resources for the whole HCA.
        pub max_res_rd_atom: u32,
        /// `IV_ATOMIC_*`.
        pub atomic_cap: u32,
        /// Max SRQs.
        pub max_srq: u32,
        /// Max WRs per SRQ.
        pub max_srq_wr: u32,
        /// Max SGEs per SRQ WR.
        pub max_srq_sge: u32,
        /// Max address handles.
        pub max_ah: u32,
        /// Max inline data per send WR, in bytes.
        pub max_inline_data: u32,
        /// P_Key table length.
        pub max_pkeys: u16,
        /// Local CA ACK delay (IBTA encoding).
        pub local_ca_ack_delay: u8,
        /// Number of physical ports.
        pub phys_port_cnt: u8,
        /// Number of completion vectors.
        pub num_comp_vectors: u32,
        /// Reserved, zero.
        pub reserved: u32,
    }
}

abi_struct! {
    /// Request of `IOCTL_IV_QUERY_PORT`.
    pub struct IvQueryPortIn {
        /// Port number, from 1.
        pub port_num: u32,
        /// Reserved, zero.
        pub reserved: u32,
    }
}

abi_struct! {
    /// Response of `IOCTL_IV_QUERY_PORT`.
    pub struct IvQueryPortOut {
        /// `IV_PORT_*`.
        pub state: u32,
        /// Physical state (5 = LinkUp, 3 = Disabled).
        pub phys_state: u32,
        /// `IV_MTU_*`.
        pub max_mtu: u32,
        /// `IV_MTU_*`.
        pub active_mtu: u32,
        /// GID table length.
        pub gid_tbl_len: u32,
        /// Port capability flags.
        pub port_cap_flags: u32,
        /// Max message size, in bytes.
        pub max_msg_sz: u32,
        /// P_Key table length.
        pub pkey_tbl_len: u32,
        /// LID (0 on RoCE).
        pub lid: u16,
        /// SM LID (0 on RoCE).
        pub sm_lid: u16,
        /// LID mask count.
        pub lmc: u8,
        /// Max VLs.
        pub max_vl_num: u8,
        /// Active width (IBTA encoding).
        pub active_width: u8,
        /// Active speed (IBTA encoding).
        pub active_speed: u8,
        /// `IV_LINK_LAYER_*`.
        pub link_layer: u8,
        /// Reserved, zero.
        pub reserved: [u8; 7],
        /// GID index 0.
        pub gid0: [u8; 16],
    }
}

abi_struct! {
    /// Request of `IOCTL_IV_QUERY_GID`.
    pub struct IvQueryGidIn {
        /// Port number, from 1.
        pub port_num: u32,
        /// GID table index.
        pub index: u32,
    }
}

abi_struct! {
    /// Response of `IOCTL_IV_QUERY_GID`.
    pub struct IvQueryGidOut {
        /// The GID.
        pub gid: [u8; 16],
    }
}

abi_struct! {
    /// Request of `IOCTL_IV_ALLOC_PD`.
    pub struct IvAllocPdIn {
        /// Flags, none defined: zero.
        pub flags: u32,
        /// Reserved, zero.
        pub reserved: u32,
    }
}

abi_struct! {
    /// Response of `IOCTL_IV_ALLOC_PD`.
    pub struct IvAllocPdOut {
        /// The PD's handle.
        pub pd: IvHandle,
        /// The PD number the HCA assigned.
        pub pdn: u32,
        /// Reserved, zero.
        pub reserved: u32,
    }
}

abi_struct! {
    /// Request of `IOCTL_IV_REG_MR` and `IOCTL_IV_REG_PHYS_MR`.
    pub struct IvRegMrIn {
        /// The PD.
        pub pd: IvHandle,
        /// Start address (virtual, or physical for REG_PHYS_MR).
        pub addr: u64,
        /// Length in bytes, 1 to `max_mr_size`.
        pub length: u64,
        /// `IV_ACCESS_*`; remote write or atomic requires local write.
        pub access: u32,
        /// Reserved, zero.
        pub reserved: u32,
    }
}

abi_struct! {
    /// Response of `IOCTL_IV_REG_MR`.
    pub struct IvRegMrOut {
        /// The MR's handle.
        pub mr: IvHandle,
        /// Local key.
        pub lkey: u32,
        /// Remote key (equal to lkey when no remote access was asked).
        pub rkey: u32,
    }
}

abi_struct! {
    /// Request of `IOCTL_IV_CREATE_CQ`.
    pub struct IvCreateCqIn {
        /// Minimum number of entries, 1 to `max_cqe`.
        pub cqe: u32,
        /// Completion vector, below `num_comp_vectors`.
        pub comp_vector: u32,
        /// Completion channel handle, or 0 for none.
        pub channel: IvHandle,
        /// Returned with events for this CQ.
        pub user_context: u64,
    }
}

abi_struct! {
    /// Response of `IOCTL_IV_CREATE_CQ`.
    pub struct IvCreateCqOut {
        /// The CQ's handle.
        pub cq: IvHandle,
        /// CQ number.
        pub cqn: u32,
        /// Actual number of entries (at least the number asked).
        pub cqe: u32,
    }
}

abi_struct! {
    /// Request of `IOCTL_IV_RESIZE_CQ`.
    pub struct IvResizeCqIn {
        /// The CQ.
        pub cq: IvHandle,
        /// New minimum number of entries.
        pub cqe: u32,
        /// Reserved, zero.
        pub reserved: u32,
    }
}

abi_struct! {
    /// Response of `IOCTL_IV_RESIZE_CQ`.
    pub struct IvResizeCqOut {
        /// Actual number of entries.
        pub cqe: u32,
        /// Reserved, zero.
        pub reserved: u32,
    }
}

abi_struct! {
    /// Work queue sizes of a QP.
    pub struct IvQpCap {
        /// Send queue depth.
        pub max_send_wr: u32,
        /// Receive queue depth (0 with an SRQ).
        pub max_recv_wr: u32,
        /// SGEs per send WR.
        pub max_send_sge: u32,
        /// SGEs per receive WR.
        pub max_recv_sge: u32,
        /// Inline data per send WR, in bytes.
        pub max_inline_data: u32,
        /// Reserved, zero.
        pub reserved: u32,
    }
}

abi_struct! {
    /// Request of `IOCTL_IV_CREATE_QP`.
    pub struct IvCreateQpIn {
        /// The PD.
        pub pd: IvHandle,
        /// CQ for send completions.
        pub send_cq: IvHandle,
        /// CQ for receive completions (may equal `send_cq`).
        pub recv_cq: IvHandle,
        /// SRQ, or 0 for none.
        pub srq: IvHandle,
        /// Returned with async events for this QP.
        pub user_context: u64,
        /// `IV_QPT_*`.
        pub qp_type: u32,
        /// 1: every send WR generates a completion; 0: only signaled ones.
        pub sq_sig_all: u32,
        /// Requested work queue sizes.
        pub cap: IvQpCap,
    }
}

abi_struct! {
    /// Response of `IOCTL_IV_CREATE_QP`.
    pub struct IvCreateQpOut {
        /// The QP's handle.
        pub qp: IvHandle,
        /// QP number.
        pub qpn: u32,
        /// Reserved, zero.
        pub reserved: u32,
        /// Actual work queue sizes (at least the ones asked).
        pub cap: IvQpCap,
    }
}

abi_struct! {
    /// An address vector: the path to a remote port. On RoCE `is_global`
    /// must be 1 and `dgid` is the remote GID (an IPv4-mapped or IPv6 address).
    pub struct IvAhAttr {
        /// Destination GID.
        pub dgid: [u8; 16],
        /// IPv6 flow label (20 bits).
        pub flow_label: u32,
        /// Destination LID (0 on RoCE).
        pub dlid: u16,
        /// Source GID index.
        pub sgid_index: u8,
        /// Hop limit (TTL).
        pub hop_limit: u8,
        /// Traffic class (DSCP and ECN).
        pub traffic_class: u8,
        /// Service level, 0 to 15.
        pub sl: u8,
        /// Source path bits.
        pub src_path_bits: u8,
        /// Static rate (IBTA encoding), 0 for the port rate.
        pub static_rate: u8,
        /// 1: a GRH is present (required on RoCE).
        pub is_global: u8,
        /// Port number, from 1.
        pub port_num: u8,
        /// Reserved, zero.
        pub reserved: [u8; 2],
    }
}

abi_struct! {
    /// QP attributes, as `modify_qp` takes them and `query_qp` returns them.
    /// Which fields a modify reads is given by its attribute mask.
    pub struct IvQpAttr {
        /// `IV_QPS_*`: the state to move to.
        pub qp_state: u32,
        /// `IV_QPS_*`: the state the caller believes the QP is in.
        pub cur_qp_state: u32,
        /// `IV_MTU_*`.
        pub path_mtu: u32,
        /// `IV_MIG_*`.
        pub path_mig_state: u32,
        /// Q_Key (UD).
        pub qkey: u32,
        /// Receive PSN, 24 bits.
        pub rq_psn: u32,
        /// Send PSN, 24 bits.
        pub sq_psn: u32,
        /// Destination QP number, 24 bits.
        pub dest_qp_num: u32,
        /// Remote access allowed on this QP (`IV_ACCESS_REMOTE_*`).
        pub qp_access_flags: u32,
        /// P_Key index.
        pub pkey_index: u16,
        /// Alternate path P_Key index.
        pub alt_pkey_index: u16,
        /// 1: raise the SQ drained event on entering SQD.
        pub en_sqd_async_notify: u8,
        /// Query only: 1 while the SQ is draining in SQD.
        pub sq_draining: u8,
        /// Outstanding RDMA READ / atomic as requester.
        pub max_rd_atomic: u8,
        /// Outstanding RDMA READ / atomic as responder.
        pub max_dest_rd_atomic: u8,
        /// Minimum RNR NAK timer (IBTA encoding, 0 to 31).
        pub min_rnr_timer: u8,
        /// Port number, from 1.
        pub port_num: u8,
        /// Local ACK timeout (4.096 us * 2^timeout, 0 to 31; 0 = infinite).
        pub timeout: u8,
        /// Transport retries, 0 to 7.
        pub retry_cnt: u8,
        /// RNR retries, 0 to 7 (7 = unlimited).
        pub rnr_retry: u8,
        /// Alternate path port.
        pub alt_port_num: u8,
        /// Alternate path local ACK timeout.
        pub alt_timeout: u8,
        /// Reserved, zero.
        pub reserved0: u8,
        /// Work queue sizes.
        pub cap: IvQpCap,
        /// Primary path.
        pub ah_attr: IvAhAttr,
        /// Alternate path.
        pub alt_ah_attr: IvAhAttr,
        /// Reserved, zero.
        pub reserved1: u32,
    }
}

abi_struct! {
    /// Request of `IOCTL_IV_MODIFY_QP`.
    pub struct IvModifyQpIn {
        /// The QP.
        pub qp: IvHandle,
        /// `IV_QP_*` mask bits: which attributes to apply.
        pub attr_mask: u32,
        /// Reserved, zero.
        pub reserved: u32,
        /// The attributes.
        pub attr: IvQpAttr,
    }
}

abi_struct! {
    /// Response of `IOCTL_IV_QUERY_QP`.
    pub struct IvQueryQpOut {
        /// Current attributes; `qp_state` is the HCA's current state.
        pub attr: IvQpAttr,
        /// `IV_QPT_*`.
        pub qp_type: u32,
        /// As created.
        pub sq_sig_all: u32,
        /// QP number.
        pub qpn: u32,
        /// Reserved, zero.
        pub reserved: u32,
    }
}

abi_struct! {
    /// Request of `IOCTL_IV_CREATE_SRQ`.
    pub struct IvCreateSrqIn {
        /// The PD.
        pub pd: IvHandle,
        /// Returned with async events for this SRQ.
        pub user_context: u64,
        /// Depth, 1 to `max_srq_wr`.
        pub max_wr: u32,
        /// SGEs per WR, 1 to `max_srq_sge`.
        pub max_sge: u32,
        /// Limit event threshold (0: not armed).
        pub srq_limit: u32,
        /// Reserved, zero.
        pub reserved: u32,
    }
}

abi_struct! {
    /// Response of `IOCTL_IV_CREATE_SRQ`.
    pub struct IvCreateSrqOut {
        /// The SRQ's handle.
        pub srq: IvHandle,
        /// SRQ number.
        pub srqn: u32,
        /// Actual depth.
        pub max_wr: u32,
        /// Actual SGEs per WR.
        pub max_sge: u32,
        /// Reserved, zero.
        pub reserved: u32,
    }
}

abi_struct! {
    /// Request of `IOCTL_IV_MODIFY_SRQ`.
    pub struct IvModifySrqIn {
        /// The SRQ.
        pub srq: IvHandle,
        /// `IV_SRQ_MAX_WR` and/or `IV_SRQ_LIMIT`.
        pub attr_mask: u32,
        /// New depth (with `IV_SRQ_MAX_WR`).
        pub max_wr: u32,
        /// New limit (with `IV_SRQ_LIMIT`); must be below the depth.
        pub srq_limit: u32,
        /// Reserved, zero.
        pub reserved: u32,
    }
}

abi_struct! {
    /// Response of `IOCTL_IV_QUERY_SRQ`.
    pub struct IvQuerySrqOut {
        /// Depth.
        pub max_wr: u32,
        /// SGEs per WR.
        pub max_sge: u32,
        /// Current limit (0 once the limit event fired).
        pub srq_limit: u32,
        /// Reserved, zero.
        pub reserved: u32,
    }
}

abi_struct! {
    /// Request of `IOCTL_IV_CREATE_AH`.
    pub struct IvCreateAhIn {
        /// The PD.
        pub pd: IvHandle,
        /// The address vector.
        pub attr: IvAhAttr,
    }
}

abi_struct! {
    /// Response of `IOCTL_IV_CREATE_AH`.
    pub struct IvCreateAhOut {
        /// The AH's handle.
        pub ah: IvHandle,
    }
}

/// The layout of an ABI struct as Rust lays it out: the C layout tests
/// static-assert the header's layout against it.
pub trait AbiLayout: Sized {
    /// The struct's name, as in the C header.
    const NAME: &'static str;
    /// Each field's name and byte offset.
    const FIELDS: &'static [(&'static str, usize)];
    /// Size in bytes.
    const SIZE: usize = core::mem::size_of::<Self>();
}

/// One struct's layout, for tables.
///
/// cbindgen:ignore
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    /// Struct name.
    pub name: &'static str,
    /// Size in bytes.
    pub size: usize,
    /// Alignment in bytes.
    pub align: usize,
    /// Field names and offsets.
    pub fields: &'static [(&'static str, usize)],
}

const fn layout<T: AbiLayout>() -> Layout {
    Layout {
        name: T::NAME,
        size: T::SIZE,
        align: core::mem::align_of::<T>(),
        fields: T::FIELDS,
    }
}

/// The layout of every ABI struct.
///
/// cbindgen:ignore
pub const LAYOUTS: &[Layout] = &[
    layout::<IvHandleIn>(),
    layout::<IvGetVersionOut>(),
    layout::<IvQueryDeviceOut>(),
    layout::<IvQueryPortIn>(),
    layout::<IvQueryPortOut>(),
    layout::<IvQueryGidIn>(),
    layout::<IvQueryGidOut>(),
    layout::<IvAllocPdIn>(),
    layout::<IvAllocPdOut>(),
    layout::<IvRegMrIn>(),
    layout::<IvRegMrOut>(),
    layout::<IvCreateCqIn>(),
    layout::<IvCreateCqOut>(),
    layout::<IvResizeCqIn>(),
    layout::<IvResizeCqOut>(),
    layout::<IvQpCap>(),
    layout::<IvCreateQpIn>(),
    layout::<IvCreateQpOut>(),
    layout::<IvAhAttr>(),
    layout::<IvQpAttr>(),
    layout::<IvModifyQpIn>(),
    layout::<IvQueryQpOut>(),
    layout::<IvCreateSrqIn>(),
    layout::<IvCreateSrqOut>(),
    layout::<IvModifySrqIn>(),
    layout::<IvQuerySrqOut>(),
    layout::<IvCreateAhIn>(),
    layout::<IvCreateAhOut>(),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_struct_is_a_multiple_of_its_alignment_and_eight_bytes_where_it_holds_u64() {
        for l in LAYOUTS {
            assert_eq!(l.size % l.align, 0, "{}", l.name);
            if l.align == 8 {
                assert_eq!(l.size % 8, 0, "{}", l.name);
            }
            let mut prev = None;
            for (f, off) in l.fields {
                assert!(*off < l.size, "{}.{}", l.name, f);
                if let Some(p) = prev {
                    assert!(*off > p, "{}.{} out of order", l.name, f);
                }
                prev = Some(*off);
            }
        }
    }

    #[test]
    fn sizes_are_pinned() {
        // A change here is an ABI change: bump IV_ABI_MAJOR.
        assert_eq!(size_of::<IvQpAttr>(), 144);
        assert_eq!(size_of::<IvModifyQpIn>(), 160);
        assert_eq!(size_of::<IvAhAttr>(), 32);
        assert_eq!(size_of::<IvCreateQpIn>(), 72);
        assert_eq!(size_of::<IvQueryDeviceOut>(), 144);
        assert_eq!(size_of::<IvQueryPortOut>(), 64);
    }
}
