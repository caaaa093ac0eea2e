//! The speed path: post send, post receive, poll CQ and arm CQ as direct
//! calls on the rings the driver mapped into the caller's address space
//! (`IOCTL_IV_MAP_RINGS`), plus a doorbell. No IOCTL per message.
//!
//! Three layers use the ring views ([`QpRings`], [`CqRings`], [`SrqRings`],
//! the lifetime-free core from `irpverbs-kernel-table`, re-exported here):
//! - the safe Rust objects ([`crate::Qp`], [`crate::Cq`], [`crate::Srq`])
//!   that [`crate::Client`] creates over a [`SpeedPath`] transport;
//! - the kernel ULPs' direct-call function table ([`crate::kernel`]);
//! - the user-mode C library (`include/irpverbs_user.h`, `ulp/host-c`).

use irpverbs_abi::*;

pub use irpverbs_kernel_table::SpeedPath;
pub use irpverbs_kernel_table::speed::{
    AsNtStatus, Bell, Corrupt, CqRings, Doorbells, PageDoorbells, PostError, QpRings, RecvWr,
    SendWr, SrqRings, WakeHca,
};

/// The name of a completion status (`IV_WC_*` without the prefix), as
/// `ibv_wc_status_str` names them.
#[must_use]
pub fn wc_status_name(status: u32) -> &'static str {
    match status {
        IV_WC_SUCCESS => "SUCCESS",
        IV_WC_LOC_LEN_ERR => "LOC_LEN_ERR",
        IV_WC_LOC_QP_OP_ERR => "LOC_QP_OP_ERR",
        IV_WC_LOC_PROT_ERR => "LOC_PROT_ERR",
        IV_WC_WR_FLUSH_ERR => "WR_FLUSH_ERR",
        IV_WC_MW_BIND_ERR => "MW_BIND_ERR",
        IV_WC_BAD_RESP_ERR => "BAD_RESP_ERR",
        IV_WC_LOC_ACCESS_ERR => "LOC_ACCESS_ERR",
        IV_WC_REM_INV_REQ_ERR => "REM_INV_REQ_ERR",
        IV_WC_REM_ACCESS_ERR => "REM_ACCESS_ERR",
        IV_WC_REM_OP_ERR => "REM_OP_ERR",
        IV_WC_RETRY_EXC_ERR => "RETRY_EXC_ERR",
        IV_WC_RNR_RETRY_EXC_ERR => "RNR_RETRY_EXC_ERR",
        IV_WC_FATAL_ERR => "FATAL_ERR",
        IV_WC_GENERAL_ERR => "GENERAL_ERR",
        _ => "unknown status",
    }
}

/// The name of a completion opcode (`IV_WC_OP_*` without the prefix).
#[must_use]
pub fn wc_opcode_name(opcode: u32) -> &'static str {
    match opcode {
        IV_WC_OP_SEND => "SEND",
        IV_WC_OP_RDMA_WRITE => "RDMA_WRITE",
        IV_WC_OP_RDMA_READ => "RDMA_READ",
        IV_WC_OP_COMP_SWAP => "COMP_SWAP",
        IV_WC_OP_FETCH_ADD => "FETCH_ADD",
        IV_WC_OP_BIND_MW => "BIND_MW",
        IV_WC_OP_LOCAL_INV => "LOCAL_INV",
        IV_WC_OP_REG_MR => "REG_MR",
        IV_WC_OP_RECV => "RECV",
        IV_WC_OP_RECV_RDMA_WITH_IMM => "RECV_RDMA_WITH_IMM",
        _ => "unknown opcode",
    }
}

/// An `IV_WR_BIND_MW` work request (docs/memory-windows.md): binds the
/// type 2 window whose rkey's index `rkey` carries, with `rkey`'s 8-bit key
/// from now on (`next_rkey` gives one), to `length` bytes at `addr` of the
/// MR `mr_lkey` names, granting `access` (`IV_ACCESS_REMOTE_*`), as
/// `ibv_post_send` with `IBV_WR_BIND_MW` does. Signaled.
#[must_use]
pub fn bind_mw_wr(
    wr_id: u64,
    rkey: u32,
    mr_lkey: u32,
    addr: u64,
    length: u64,
    access: u32,
) -> SendWr<'static> {
    SendWr {
        wr_id,
        opcode: IV_WR_BIND_MW,
        flags: IV_SEND_SIGNALED,
        rkey,
        imm_or_inv: mr_lkey,
        remote_addr: addr,
        compare_add: length,
        swap: u64::from(access),
        ..SendWr::default()
    }
}

/// An `IV_WR_REG_MR` work request (docs/fast-registration.md): registers
/// the fast-register MR whose key's index `key` carries, with `key`'s
/// 8-bit key from now on (lkey and rkey; [`next_rkey`] gives one), mapping
/// `length` bytes from `iova` onto `pages` (each page `page_size` bytes,
/// aligned to it, in the MR its lkey names; page 0 holds `iova`'s offset in
/// a page) and granting `access` (`IV_ACCESS_*`), as `ib_post_send` with
/// `IB_WR_REG_MR` after `ib_map_mr_sg`. Signaled.
#[must_use]
pub fn reg_mr_wr<'a>(
    wr_id: u64,
    key: u32,
    (iova, length): (u64, u64),
    access: u32,
    page_size: u32,
    pages: &'a [IvSge],
) -> SendWr<'a> {
    SendWr {
        wr_id,
        opcode: IV_WR_REG_MR,
        flags: IV_SEND_SIGNALED,
        sges: pages,
        rkey: key,
        imm_or_inv: page_size,
        remote_addr: iova,
        compare_add: length,
        swap: u64::from(access),
        ..SendWr::default()
    }
}

/// An `IV_WR_LOCAL_INV` work request: invalidates the type 2 window or
/// fast-register MR `rkey` names. Signaled.
#[must_use]
pub fn local_inv_wr(wr_id: u64, rkey: u32) -> SendWr<'static> {
    SendWr {
        wr_id,
        opcode: IV_WR_LOCAL_INV,
        flags: IV_SEND_SIGNALED,
        imm_or_inv: rkey,
        ..SendWr::default()
    }
}

/// `rkey` with the next 8-bit key (`ibv_inc_rkey`): the key a window's
/// next bind may take.
#[must_use]
pub const fn next_rkey(rkey: u32) -> u32 {
    (rkey & !0xFF) | (rkey.wrapping_add(1) & 0xFF)
}

/// A work completion: a read-only view of a polled [`IvCqe`] with names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wc<'a>(&'a IvCqe);

impl<'a> From<&'a IvCqe> for Wc<'a> {
    fn from(cqe: &'a IvCqe) -> Self {
        Self(cqe)
    }
}

impl<'a> Wc<'a> {
    /// The view of `cqe`.
    #[must_use]
    pub fn new(cqe: &'a IvCqe) -> Self {
        Self(cqe)
    }

    /// The CQE itself.
    #[must_use]
    pub fn cqe(&self) -> &'a IvCqe {
        self.0
    }

    /// The work request's id.
    #[must_use]
    pub fn wr_id(&self) -> u64 {
        self.0.wr_id
    }

    /// `IV_WC_*`.
    #[must_use]
    pub fn status(&self) -> u32 {
        self.0.status
    }

    /// True for `IV_WC_SUCCESS`.
    #[must_use]
    pub fn is_success(&self) -> bool {
        self.0.status == IV_WC_SUCCESS
    }

    /// The status' name, e.g. `"REM_ACCESS_ERR"`.
    #[must_use]
    pub fn status_name(&self) -> &'static str {
        wc_status_name(self.0.status)
    }

    /// `IV_WC_OP_*`. Meaningful only on success (as in libibverbs).
    #[must_use]
    pub fn opcode(&self) -> u32 {
        self.0.opcode
    }

    /// The opcode's name, e.g. `"RDMA_READ"`.
    #[must_use]
    pub fn opcode_name(&self) -> &'static str {
        wc_opcode_name(self.0.opcode)
    }

    /// True for a receive completion (`RECV`, `RECV_RDMA_WITH_IMM`).
    #[must_use]
    pub fn is_recv(&self) -> bool {
        self.0.opcode & IV_WC_OP_RECV != 0
    }

    /// Bytes received (receives, RDMA READ) or transferred.
    #[must_use]
    pub fn byte_len(&self) -> u32 {
        self.0.byte_len
    }

    /// Immediate data, if the completion carries some.
    #[must_use]
    pub fn imm(&self) -> Option<u32> {
        (self.0.wc_flags & IV_WC_WITH_IMM != 0).then_some(self.0.imm_or_inv)
    }

    /// The rkey a SEND with invalidate invalidated, if any.
    #[must_use]
    pub fn invalidated_rkey(&self) -> Option<u32> {
        (self.0.wc_flags & IV_WC_WITH_INV != 0).then_some(self.0.imm_or_inv)
    }

    /// True when a GRH precedes the data in the receive buffer (UD).
    #[must_use]
    pub fn has_grh(&self) -> bool {
        self.0.wc_flags & IV_WC_GRH != 0
    }

    /// The local QP number.
    #[must_use]
    pub fn qp_num(&self) -> u32 {
        self.0.qp_num
    }

    /// UD receives: the source QP.
    #[must_use]
    pub fn src_qp(&self) -> u32 {
        self.0.src_qp
    }

    /// The vendor's error detail (0 on success).
    #[must_use]
    pub fn vendor_err(&self) -> u32 {
        self.0.vendor_err
    }
}

impl std::fmt::Display for Wc<'_> {
    /// `wr_id 0x7 qp 0x12: RECV 100 bytes imm 0x1 SUCCESS`, or with an
    /// error status `wr_id 0x7 qp 0x12: REM_ACCESS_ERR (vendor 0x0)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "wr_id {:#x} qp {:#x}: ", self.wr_id(), self.qp_num())?;
        if !self.is_success() {
            return write!(
                f,
                "{} (vendor {:#x})",
                self.status_name(),
                self.vendor_err()
            );
        }
        write!(f, "{} {} bytes", self.opcode_name(), self.byte_len())?;
        if let Some(imm) = self.imm() {
            write!(f, " imm {imm:#x}")?;
        }
        if let Some(rkey) = self.invalidated_rkey() {
            write!(f, " invalidated {rkey:#x}")?;
        }
        write!(f, " {}", self.status_name())
    }
}
