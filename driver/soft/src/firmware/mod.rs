//! The firmware: object tables and command execution.
//!
//! [`Firmware::execute`] runs one command against the tables. Every command
//! is validated completely before anything changes, so a failed command
//! leaves the firmware exactly as it was. The handlers live with their
//! objects (pd.rs, mr.rs, cq.rs, srq.rs, qp.rs, ah.rs, port.rs).

pub(crate) mod ah;
pub(crate) mod cq;
pub(crate) mod datapath;
pub(crate) mod doorbell;
pub(crate) mod eq;
pub(crate) mod fast_reg;
pub(crate) mod mr;
pub(crate) mod mw;
pub(crate) mod pd;
pub(crate) mod port;
pub(crate) mod qp;
pub(crate) mod qp_state;
pub(crate) mod shared;
pub(crate) mod srq;
pub(crate) mod table;

use irpverbs_abi::{
    IV_ABI_VERSION, IV_ATOMIC_HCA, IV_DEVICE_MEM_MGT_EXTENSIONS, IV_DEVICE_MEM_WINDOW,
    IV_DEVICE_MEM_WINDOW_TYPE_2B, IV_DEVICE_PORT_ACTIVE_EVENT, IV_DEVICE_RC_RNR_NAK_GEN,
    IV_DEVICE_RESIZE_MAX_WR, IV_DEVICE_SRQ_RESIZE, IvQueryDeviceOut, NtStatus,
    STATUS_INSUFFICIENT_RESOURCES, STATUS_SUCCESS,
};
use irpverbs_core::{AsyncEvent, Command, CommandOut};

use crate::config::SoftConfig;
use crate::firmware::ah::Ah;
use crate::firmware::cq::Cq;
use crate::firmware::mr::Mr;
use crate::firmware::pd::Pd;
use crate::firmware::port::{PKEY_TBL_LEN, Port};
use crate::firmware::qp::QpTable;
use crate::firmware::srq::Srq;
use crate::firmware::table::Table;

/// Vendor id of the soft device: 0xFFFFFF, no IEEE OUI (as rdma_rxe).
pub const SOFT_VENDOR_ID: u32 = 0x00FF_FFFF;
/// Page sizes an MR may use: 4 KiB and every larger power of two up to 2 GiB.
pub const SOFT_PAGE_SIZE_CAP: u64 = 0xFFFF_F000;
/// Local CA ACK delay (IBTA encoding: 4.096 us * 2^15, about 134 ms).
pub const SOFT_LOCAL_CA_ACK_DELAY: u8 = 15;

const fn parse_version(s: &str) -> u64 {
    let b = s.as_bytes();
    let mut v = 0;
    let mut i = 0;
    while i < b.len() {
        v = v * 10 + (b[i] - b'0') as u64;
        i += 1;
    }
    v
}

/// Firmware version: this crate's version as major.minor.patch in 16.16.32
/// bits.
pub const SOFT_FW_VER: u64 = (parse_version(env!("CARGO_PKG_VERSION_MAJOR")) << 48)
    | (parse_version(env!("CARGO_PKG_VERSION_MINOR")) << 32)
    | parse_version(env!("CARGO_PKG_VERSION_PATCH"));

/// The device attributes `config` describes.
pub(crate) fn device_caps(config: &SoftConfig) -> IvQueryDeviceOut {
    IvQueryDeviceOut {
        abi_version: IV_ABI_VERSION,
        vendor_id: SOFT_VENDOR_ID,
        vendor_part_id: 0,
        hw_ver: 0,
        fw_ver: SOFT_FW_VER,
        node_guid: config.node_guid,
        sys_image_guid: config.node_guid,
        max_mr_size: config.max_mr_size,
        page_size_cap: SOFT_PAGE_SIZE_CAP,
        device_cap_flags: IV_DEVICE_RESIZE_MAX_WR
            | IV_DEVICE_PORT_ACTIVE_EVENT
            | IV_DEVICE_RC_RNR_NAK_GEN
            | IV_DEVICE_SRQ_RESIZE
            | IV_DEVICE_MEM_WINDOW
            | IV_DEVICE_MEM_WINDOW_TYPE_2B
            | IV_DEVICE_MEM_MGT_EXTENSIONS,
        max_qp: config.max_qp,
        max_qp_wr: config.max_qp_wr,
        max_sge: config.max_sge,
        max_sge_rd: config.max_sge_rd,
        max_cq: config.max_cq,
        max_cqe: config.max_cqe,
        max_mr: config.max_mr,
        max_pd: config.max_pd,
        max_qp_rd_atom: config.max_qp_rd_atom,
        max_qp_init_rd_atom: config.max_qp_init_rd_atom,
        max_res_rd_atom: config.max_res_rd_atom,
        atomic_cap: IV_ATOMIC_HCA,
        max_srq: config.max_srq,
        max_srq_wr: config.max_srq_wr,
        max_srq_sge: config.max_srq_sge,
        max_ah: config.max_ah,
        max_inline_data: config.max_inline_data,
        #[allow(clippy::cast_possible_truncation)]
        max_pkeys: PKEY_TBL_LEN as u16,
        local_ca_ack_delay: SOFT_LOCAL_CA_ACK_DELAY,
        phys_port_cnt: 1,
        num_comp_vectors: config.num_comp_vectors,
        max_mw: config.max_mw,
        // An `IV_WR_REG_MR`'s page list rides in its SGEs.
        max_fast_reg_page_list_len: config.max_sge,
        reserved: 0,
    }
}

/// The firmware's state: the device's limits, its port and its object
/// tables. Kept under `HCA_LOCK`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Firmware {
    /// Limits.
    pub(crate) config: SoftConfig,
    /// The port.
    pub(crate) port: Port,
    /// Protection domains by PDN.
    pub(crate) pds: Table<Pd>,
    /// Memory regions by key index (key >> 8).
    pub(crate) mrs: Table<Mr>,
    /// Memory windows by key index without its top bit
    /// ([`crate::firmware::mw::MW_INDEX`]).
    pub(crate) mws: Table<crate::firmware::mw::Mw>,
    /// Completion queues by CQN.
    pub(crate) cqs: Table<Cq>,
    /// Shared receive queues by SRQN.
    pub(crate) srqs: Table<Srq>,
    /// Queue pairs by QPN.
    pub(crate) qps: QpTable,
    /// Address handles by AHN.
    pub(crate) ahs: Table<Ah>,
    /// An async event the command being executed raised.
    pub(crate) raised: Option<AsyncEvent>,
    /// Responder resources the QPs hold: the sum of their
    /// `max_dest_rd_atomic`, at most `config.max_res_rd_atom`.
    pub(crate) rd_atom_reserved: u32,
    /// Ring memory of destroyed queues, for new ones.
    pub(crate) rings: crate::firmware::shared::RingPool,
    /// Doorbell pages and the queues their slots ring.
    pub(crate) doorbells: crate::firmware::doorbell::Doorbells,
    /// The data path's state (not compared: see [`crate::firmware::datapath::DataPath`]),
    /// in a box of its own: the firmware, built at device add, stays small
    /// (docs/stack-budget.md).
    pub(crate) dp: alloc::boxed::Box<crate::firmware::datapath::DataPath>,
}

/// What the firmware's commands need the transport to do. The transport
/// implements it (`crate::transport::engine::Engine`) and the HCA names
/// the implementation where it executes a command
/// ([`Firmware::execute`]): the firmware names no transport code (the
/// transport is built on the firmware's objects, not the other way
/// round), and the call is direct.
pub(crate) trait DataPathOps {
    /// The data path's consequences of a successful `ModifyQp` of QP
    /// `qpn` from state `from` with attribute mask `mask` (the attributes
    /// are applied already): flushes on ERR, the path, PSNs and timers on
    /// the way to RTS, the drain on SQD.
    fn on_modify(fw: &mut Firmware, qpn: u32, from: qp::QpState, mask: u32);
}

/// What executing a command produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Executed {
    /// `STATUS_SUCCESS` or why it failed.
    pub(crate) status: NtStatus,
    /// Output on success, `CommandOut::None` on failure.
    pub(crate) out: CommandOut,
    /// An async event to report after the completion.
    pub(crate) event: Option<AsyncEvent>,
}

/// Whether `command` frees a resource (what a fatal device still does).
fn frees(command: &Command) -> bool {
    matches!(
        command,
        Command::DeallocPd { .. }
            | Command::DeregMr { .. }
            | Command::DeallocMw { .. }
            | Command::DestroyCq { .. }
            | Command::DestroySrq { .. }
            | Command::DestroyQp { .. }
            | Command::DestroyAh { .. }
    )
}

impl Firmware {
    /// Firmware with empty tables, in a box. `config` must be valid.
    ///
    /// The firmware and its data path are built in their boxes, not on the
    /// stack and then moved (docs/stack-budget.md).
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES` when memory is short.
    #[inline(never)]
    pub(crate) fn new_boxed(
        config: SoftConfig,
        attention: irpverbs_ring::Shared<core::sync::atomic::AtomicU32>,
    ) -> Result<alloc::boxed::Box<Self>, NtStatus> {
        let events = crate::firmware::shared::vec_with_capacity(config.eq_depth)?;
        let rings = crate::firmware::shared::RingPool::new()?;
        let port = Port::new(config.ip, &config.aliases);
        let gid = port.gid(0).unwrap_or_default();
        let udp_port = config.udp_port;
        let mut dp =
            crate::firmware::datapath::DataPath::new_boxed(gid, attention, events, udp_port)?;
        dp.short_circuit = config.short_circuit;
        dp.fast_path = config.fast_path;
        irpverbs_ring::try_box_with(|| Self {
            dp,
            port,
            pds: Table::new(config.max_pd),
            mrs: Table::new(config.max_mr),
            mws: Table::new(config.max_mw),
            cqs: Table::new(config.max_cq),
            srqs: Table::new(config.max_srq),
            qps: QpTable::new(config.max_qp),
            ahs: Table::new(config.max_ah),
            raised: None,
            rd_atom_reserved: 0,
            rings,
            doorbells: crate::firmware::doorbell::Doorbells::default(),
            config,
        })
        .ok_or(STATUS_INSUFFICIENT_RESOURCES)
    }

    /// Objects alive in the tables.
    pub(crate) fn live_objects(&self) -> usize {
        self.pds.len()
            + self.mrs.len()
            + self.mws.len()
            + self.cqs.len()
            + self.srqs.len()
            + self.qps.len()
            + self.ahs.len()
    }

    /// Executes one command, with the data path's part of it done by `D`.
    /// On failure nothing changed and no event was raised.
    pub(crate) fn execute<D: DataPathOps>(&mut self, command: Command) -> Executed {
        self.raised = None;
        if self.dp.fatal && !frees(&command) {
            // A device in internal error executes only what frees
            // resources (as mlx5 in its internal error state).
            return Executed {
                status: irpverbs_abi::STATUS_DEVICE_HARDWARE_ERROR,
                out: CommandOut::None,
                event: None,
            };
        }
        // Each verb runs in a frame of its own (see `own_frame`).
        let result = match command {
            Command::QueryPort { port } => own_frame(|| self.query_port(port)),
            Command::QueryGid { port, index } => own_frame(|| self.query_gid(port, index)),
            Command::AllocPd => own_frame(|| self.alloc_pd()),
            Command::DeallocPd { pdn } => own_frame(|| self.dealloc_pd(pdn)),
            Command::RegMr(c) => own_frame(|| self.reg_mr(c)),
            Command::AllocMr { pdn, max_pages } => own_frame(|| self.alloc_mr(pdn, max_pages)),
            Command::AllocMw { pdn, mw_type } => own_frame(|| self.alloc_mw(pdn, mw_type)),
            Command::DeallocMw { rkey } => own_frame(|| self.dealloc_mw(rkey)),
            Command::BindMw(c) => own_frame(|| self.bind_mw(&c)),
            Command::DeregMr { lkey } => own_frame(|| self.dereg_mr(lkey)),
            Command::CreateCq(c) => own_frame(|| self.create_cq(&c)),
            Command::ResizeCq { cqn, cqe } => own_frame(|| self.resize_cq(cqn, cqe)),
            Command::DestroyCq { cqn } => own_frame(|| self.destroy_cq(cqn)),
            Command::CreateSrq(c) => own_frame(|| self.create_srq(&c)),
            Command::ModifySrq(c) => own_frame(|| self.modify_srq(&c)),
            Command::QuerySrq { srqn } => own_frame(|| self.query_srq(srqn)),
            Command::DestroySrq { srqn } => own_frame(|| self.destroy_srq(srqn)),
            Command::CreateQp(c) => own_frame(|| self.create_qp(&c)),
            Command::ModifyQp(c) => own_frame(|| self.modify_qp::<D>(&c)),
            Command::QueryQp { qpn } => own_frame(|| self.query_qp(qpn)),
            Command::DestroyQp { qpn } => own_frame(|| self.destroy_qp(qpn)),
            Command::CreateAh(c) => own_frame(|| self.create_ah(&c)),
            Command::DestroyAh { ahn } => own_frame(|| self.destroy_ah(ahn)),
        };
        match result {
            Ok(out) => Executed {
                status: STATUS_SUCCESS,
                out,
                event: self.raised.take(),
            },
            Err(status) => {
                debug_assert!(self.raised.is_none());
                self.raised = None;
                Executed {
                    status,
                    out: CommandOut::None,
                    event: None,
                }
            }
        }
    }
}

/// Runs `f` in a frame of its own. The firmware's verbs are large and
/// [`Firmware::execute`] calls each from one `match`: inlined there, their
/// locals would add up in one frame of several KiB (the kernel stack is
/// 24 KiB; docs/stack-budget.md sets 2 KiB per frame). Out of line, the
/// deepest command costs only its own frame. Command execution is the
/// control path: one call more per command.
#[inline(never)]
fn own_frame<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// A reference count of dependents (QPs, MRs, SRQs, AHs on a PD; QPs on a
/// CQ or SRQ). An object with dependents can't be destroyed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Refs(u32);

impl Refs {
    /// One more dependent.
    pub(crate) fn get(&mut self) {
        self.0 += 1;
    }

    /// One dependent fewer.
    pub(crate) fn put(&mut self) {
        debug_assert!(self.0 > 0, "reference count underflow");
        self.0 = self.0.saturating_sub(1);
    }

    /// How many dependents.
    pub(crate) fn count(self) -> usize {
        self.0 as usize
    }

    /// Fails with `STATUS_DEVICE_BUSY` while there are dependents.
    pub(crate) fn check_idle(self) -> Result<(), NtStatus> {
        if self.0 == 0 {
            Ok(())
        } else {
            Err(irpverbs_abi::STATUS_DEVICE_BUSY)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::util::Dev;
    use irpverbs_core::Hca;

    #[test]
    fn caps_come_from_the_config() {
        let d = Dev::with(|c| {
            c.max_qp = 77;
            c.node_guid = 0x1122_3344_5566_7788;
            c.num_comp_vectors = 3;
        });
        let caps = d.hca.caps();
        assert_eq!(caps.abi_version, IV_ABI_VERSION);
        assert_eq!(caps.vendor_id, 0xFF_FFFF);
        assert_eq!(caps.max_qp, 77);
        assert_eq!(caps.node_guid, 0x1122_3344_5566_7788);
        assert_eq!(caps.sys_image_guid, 0x1122_3344_5566_7788);
        assert_eq!(caps.phys_port_cnt, 1);
        assert_eq!(caps.num_comp_vectors, 3);
        assert_eq!(caps.atomic_cap, IV_ATOMIC_HCA);
        assert_eq!(caps.max_pkeys, 1);
        assert_eq!(caps.fw_ver, SOFT_FW_VER);
        assert_eq!(parse_version("0"), 0);
        assert_eq!(parse_version("12"), 12);
        let def = SoftConfig::default();
        let caps = device_caps(&def);
        assert_eq!(caps.max_qp_wr, def.max_qp_wr);
        assert_eq!(caps.max_cqe, def.max_cqe);
        assert_eq!(caps.max_mr_size, def.max_mr_size);
        assert_eq!(caps.max_inline_data, 400);
        assert_eq!(caps.max_mw, SoftConfig::default().max_mw);
    }
}
