//! The speed path's memory formats: work queue and completion queue rings
//! shared between the driver, the ULP (kernel, or user through a mapping)
//! and the HCA.
//!
//! A ring is `entries` slots of `stride` bytes (both powers of two) plus an
//! [`IvRingControl`]: the producer index, the consumer index and (CQs) the
//! arm word, each on its own 64-byte cache line. Indices run free (wrap at
//! 2^32); the slot of index `i` is `i & (entries - 1)`; a ring is full when
//! `producer - consumer == entries`.
//!
//! - Send queue: the ULP writes an [`IvSendWqe`] (+ SGEs or inline data) at
//!   the producer slot, then publishes the producer index (release) and rings
//!   the doorbell; the HCA consumes and advances the consumer index when the
//!   WQE's completion has been written (or, for unsignaled WQEs, retired).
//! - Receive queue / SRQ: the same with [`IvRecvWqe`].
//! - Completion queue: the HCA writes an [`IvCqe`], its sequence word last
//!   ([`IvCqe::seq`]), and publishes the producer index; the ULP reads CQEs
//!   whose sequence word it expects (or, up to the producer index) and
//!   publishes the consumer index.
//!
//! Everything the ULP writes is untrusted by the HCA: a WQE is validated
//! before it is executed.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::types::{AbiLayout, abi_layout};

/// Size of a cache line, and of one ring index slot.
pub const IV_CACHE_LINE: usize = 64;

/// One ring index, alone on its cache line (64 bytes; the ring memory is
/// page-aligned, so every index starts a cache line).
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IvRingIndex {
    /// The index (free-running).
    pub value: u32,
    /// Padding to the end of the cache line.
    pub reserved: [u32; 15],
}

/// The control block of a ring: producer, consumer and arm words on separate
/// cache lines.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IvRingControl {
    /// Producer index (written by the producer only).
    pub producer: IvRingIndex,
    /// Consumer index (written by the consumer only).
    pub consumer: IvRingIndex,
    /// CQs: the arm word written by `req_notify_cq` (see [`IV_CQ_ARM_NEXT`]).
    ///
    /// Receive queues and SRQs: the HCA's doorbell request, written by the
    /// HCA only. While it is 0, posting receives need not ring the doorbell:
    /// the HCA reads the producer index when it needs a receive WQE (as a
    /// hardware HCA reads its doorbell record). The HCA sets it (nonzero)
    /// while it must hear of new receives at once — the QP is in ERR (new
    /// receives are flushed), or a responder waits for a receive after an
    /// RNR NAK — and then reads the producer index again. So a ULP, after
    /// publishing its producer index, issues a sequentially consistent fence,
    /// reads this word, and rings the doorbell when it is nonzero; either it
    /// sees the request, or the HCA's read after setting it sees the
    /// receives. Ringing always is correct too (only slower).
    ///
    /// Send queues: unused.
    pub arm: IvRingIndex,
}

/// Where a ring lives, as the create verbs and `IOCTL_IV_MAP_RINGS` return
/// it. Addresses are in the caller's address space: kernel addresses for
/// kernel callers; for user-mode callers the create verbs return the
/// geometry with zero addresses, and `IOCTL_IV_MAP_RINGS` the user mapping.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IvRingMap {
    /// Address of the first slot.
    pub entries_addr: u64,
    /// Address of the [`IvRingControl`].
    pub control_addr: u64,
    /// Number of slots (a power of two; 0: no ring).
    pub entries: u32,
    /// Bytes per slot (a power of two).
    pub stride: u32,
}

/// Bytes of a doorbell page ([`IvDoorbellPage`]): one page.
pub const IV_DOORBELL_PAGE_SIZE: u32 = 4096;
/// Doorbell slots in a doorbell page: the bits of [`IvDoorbellPage::rung`].
pub const IV_DOORBELL_SLOTS: u32 = 4096;
/// Words of [`IvDoorbellPage::rung`] (64 slots each), and bits of
/// [`IvDoorbellPage::summary`].
pub const IV_DOORBELL_WORDS: u32 = 64;
/// No doorbell slot: what `IOCTL_IV_MAP_RINGS` reports for a ring that rings
/// no slot of a doorbell page (kernel callers; a file whose doorbell page was
/// not mapped before the rings; an HCA without doorbell pages).
pub const IV_DOORBELL_NONE: u32 = 0xFFFF_FFFF;

/// A file's doorbell page (`IOCTL_IV_MAP_DOORBELLS`): how a user-mode ULP
/// rings the doorbells of its queues with no system call, as it would write
/// a real HCA's doorbell (UAR) page.
///
/// Each queue doorbell of the file (a QP's send queue, a QP's receive queue,
/// an SRQ, a CQ's arm) that `IOCTL_IV_MAP_RINGS` mapped after the page has
/// a slot in it, `0 .. IV_DOORBELL_SLOTS`. To ring slot `s`, after writing
/// the WQEs (or the arm word) and publishing the producer index:
///
/// 1. `rung[s / 64] |= 1 << (s % 64)`, an atomic OR with release ordering;
/// 2. `summary |= 1 << (s / 64)`, an atomic OR with release ordering.
///
/// The HCA takes `summary` (atomic exchange with 0, acquire), then each
/// `rung` word whose summary bit was set (exchange with 0, acquire), and
/// rings the doorbell of every slot it found. Ringing a slot again before
/// the HCA took it rings once; a doorbell only tells the HCA to look at the
/// queue. The page is untrusted: a slot that is not bound to one of the
/// file's queues is ignored, and nothing written here reaches another
/// file's queues.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct IvDoorbellPage {
    /// Bit `w` set: `rung[w]` has bits set.
    pub summary: u64,
    /// Padding: `summary` is alone on its cache line.
    pub reserved0: [u64; 7],
    /// Bit `s % 64` of word `s / 64`: slot `s` was rung.
    pub rung: [u64; 64],
    /// Written by the HCA, never read by it: nonzero while it polls the
    /// page (a ring is seen without a system call), 0 when it sleeps. After
    /// ringing a slot, the ULP issues a full fence and reads this word; 0
    /// means it must wake the HCA with `IOCTL_IV_RING_DOORBELLS`. The HCA
    /// writes 0 before it makes its last look at the summaries (with a full
    /// fence between), so a ring is either seen by that look or followed by
    /// the IOCTL.
    pub polling: u64,
    /// Padding: `polling` is alone on its cache line.
    pub reserved2: [u64; 7],
    /// Reserved to the end of the page; the HCA never reads it.
    pub reserved1: [u64; 432],
}

impl Default for IvDoorbellPage {
    fn default() -> Self {
        Self {
            summary: 0,
            reserved0: [0; 7],
            rung: [0; 64],
            polling: 0,
            reserved2: [0; 7],
            reserved1: [0; 432],
        }
    }
}

/// CQ arm word: bit 31 set = armed for the next completion; bit 30 set =
/// solicited (and error) completions only; bits 0..30 = the arm sequence the
/// ULP increments on every arm.
pub const IV_CQ_ARM_NEXT: u32 = 0x8000_0000;
/// CQ arm word: solicited only.
pub const IV_CQ_ARM_SOLICITED: u32 = 0x4000_0000;

/// Send work request opcode: SEND.
pub const IV_WR_SEND: u8 = 0;
/// SEND with immediate data.
pub const IV_WR_SEND_WITH_IMM: u8 = 1;
/// SEND with invalidate (the responder invalidates `invalidate_rkey`).
pub const IV_WR_SEND_WITH_INV: u8 = 2;
/// RDMA WRITE.
pub const IV_WR_RDMA_WRITE: u8 = 3;
/// RDMA WRITE with immediate data.
pub const IV_WR_RDMA_WRITE_WITH_IMM: u8 = 4;
/// RDMA READ.
pub const IV_WR_RDMA_READ: u8 = 5;
/// Atomic compare and swap (8 bytes, 8-byte aligned).
pub const IV_WR_ATOMIC_CMP_AND_SWP: u8 = 6;
/// Atomic fetch and add (8 bytes, 8-byte aligned).
pub const IV_WR_ATOMIC_FETCH_AND_ADD: u8 = 7;
/// Local invalidate (RC and UC): `imm_or_inv` is the rkey of a type 2
/// memory window bound on this QP; the window grants nothing afterwards.
/// No SGEs.
pub const IV_WR_LOCAL_INV: u8 = 8;
/// Bind a type 2 memory window (RC and UC), to this QP. No SGEs; fields
/// of [`IvSendWqe`]: `rkey` is the window's new rkey (its index, as
/// `IOCTL_IV_ALLOC_MW` gave it, and a new 8-bit key), `imm_or_inv` the
/// lkey of the MR (of the QP's PD, registered with `IV_ACCESS_MW_BIND`),
/// `remote_addr` and `compare_add` the window's start and length (not 0),
/// `swap` the `IV_ACCESS_REMOTE_*` it grants.
pub const IV_WR_BIND_MW: u8 = 9;
/// Fast-register an MR (RC and UC; docs/fast-registration.md): maps a
/// page list under the MR's keys and makes it valid. Fields of
/// [`IvSendWqe`]: `rkey` is the MR's new key (its index, as
/// `IOCTL_IV_ALLOC_MR` gave it, and a new 8-bit key; lkey and rkey alike),
/// `swap` its `IV_ACCESS_*` flags, `remote_addr` and `compare_add` its
/// start address (iova) and length, `imm_or_inv` the page size (a power of
/// two the device's `page_size_cap` has). The SGEs are the page list: each
/// a page's address (aligned to the page size) in the MR its `lkey` names
/// (an MR of the QP's PD, registered by `IOCTL_IV_REG_MR` or
/// `IOCTL_IV_REG_PHYS_MR`), `length` the page size; page 0 holds the
/// iova's offset in a page, and enough pages follow to hold `length`
/// bytes. Completion opcode [`IV_WC_OP_REG_MR`].
pub const IV_WR_REG_MR: u8 = 10;

/// Send flag: generate a completion (always, with `sq_sig_all`).
pub const IV_SEND_SIGNALED: u8 = 1 << 0;
/// Send flag: set the solicited event bit.
pub const IV_SEND_SOLICITED: u8 = 1 << 1;
/// Send flag: the data follows the header inline (`inline_len` bytes).
pub const IV_SEND_INLINE: u8 = 1 << 2;
/// Send flag: wait for prior RDMA READs and atomics to complete.
pub const IV_SEND_FENCE: u8 = 1 << 3;

/// Size of [`IvSendWqe`]; SGEs or inline data follow it in the slot.
pub const IV_SEND_WQE_HEADER: usize = 64;
/// Size of [`IvRecvWqe`]; SGEs follow it.
pub const IV_RECV_WQE_HEADER: usize = 16;

/// A send work queue element header (64 bytes).
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IvSendWqe {
    /// Returned in the completion.
    pub wr_id: u64,
    /// `IV_WR_*`.
    pub opcode: u8,
    /// `IV_SEND_*`.
    pub flags: u8,
    /// SGEs following the header (0 with inline data).
    pub num_sge: u16,
    /// Immediate data (network byte order as written by the ULP) or the rkey
    /// to invalidate.
    pub imm_or_inv: u32,
    /// RDMA / atomic: remote address.
    pub remote_addr: u64,
    /// RDMA / atomic: remote key.
    pub rkey: u32,
    /// Inline data length in bytes (with `IV_SEND_INLINE`).
    pub inline_len: u32,
    /// Atomic: compare value (CMP_AND_SWP) or add value (FETCH_AND_ADD).
    pub compare_add: u64,
    /// Atomic: swap value (CMP_AND_SWP).
    pub swap: u64,
    /// UD: the address handle number (from `IOCTL_IV_CREATE_AH`).
    pub ahn: u32,
    /// UD: destination QP number.
    pub remote_qpn: u32,
    /// UD: destination Q_Key.
    pub remote_qkey: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

/// A receive work queue element header (16 bytes).
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IvRecvWqe {
    /// Returned in the completion.
    pub wr_id: u64,
    /// SGEs following the header.
    pub num_sge: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

/// A scatter/gather element (16 bytes).
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IvSge {
    /// Start address, inside the MR `lkey` names.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// The local key of the MR.
    pub lkey: u32,
}

/// A completion queue entry (64 bytes).
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IvCqe {
    /// The work request's id.
    pub wr_id: u64,
    /// `IV_WC_*` status.
    pub status: u32,
    /// `IV_WC_OP_*`.
    pub opcode: u32,
    /// Vendor error detail (0 on success).
    pub vendor_err: u32,
    /// Bytes received (receives, RDMA READ) or transferred.
    pub byte_len: u32,
    /// Immediate data (`IV_WC_WITH_IMM`) or invalidated rkey (`IV_WC_WITH_INV`).
    pub imm_or_inv: u32,
    /// The local QP number.
    pub qp_num: u32,
    /// UD receives: the source QP number.
    pub src_qp: u32,
    /// `IV_WC_GRH`, `IV_WC_WITH_IMM`, `IV_WC_WITH_INV`.
    pub wc_flags: u32,
    /// P_Key index.
    pub pkey_index: u16,
    /// Source LID (0 on RoCE).
    pub slid: u16,
    /// Service level.
    pub sl: u8,
    /// DLID path bits.
    pub dlid_path_bits: u8,
    /// Reserved, zero.
    pub reserved0: u16,
    /// Reserved, zero.
    pub reserved: [u32; 3],
    /// The CQ's producer index once this entry is in (its ring index + 1),
    /// stored last, with release ordering, after the rest of the entry
    /// ([`IV_CQE_SEQ_OFFSET`]). A poller that expects entry `i` and loads
    /// `i + 1` here (acquire) may read the entry without reading the
    /// producer index: one cache line per completion instead of two. A
    /// zeroed ring never shows the first expected value.
    pub seq: u32,
}

/// Byte offset of [`IvCqe::seq`] in a CQE.
pub const IV_CQE_SEQ_OFFSET: usize = 60;

const _: () =
    assert!(core::mem::offset_of!(IvCqe, seq) == IV_CQE_SEQ_OFFSET && size_of::<IvCqe>() == 64);

/// Completion status: success.
pub const IV_WC_SUCCESS: u32 = 0;
/// Local length error (a receive buffer too small, a message too long).
pub const IV_WC_LOC_LEN_ERR: u32 = 1;
/// Local QP operation error (a malformed WQE).
pub const IV_WC_LOC_QP_OP_ERR: u32 = 2;
/// Local protection error (bad lkey, PD or bounds).
pub const IV_WC_LOC_PROT_ERR: u32 = 4;
/// The WQE was flushed: the QP is in ERR.
pub const IV_WC_WR_FLUSH_ERR: u32 = 5;
/// A memory window bind failed (its rules: docs/memory-windows.md).
pub const IV_WC_MW_BIND_ERR: u32 = 6;
/// Bad response from the responder.
pub const IV_WC_BAD_RESP_ERR: u32 = 7;
/// Local access error (responder: invalid rkey access locally).
pub const IV_WC_LOC_ACCESS_ERR: u32 = 8;
/// Remote invalid request (opcode the responder QP does not allow, length).
pub const IV_WC_REM_INV_REQ_ERR: u32 = 9;
/// Remote access error (rkey, bounds or access rights at the responder).
pub const IV_WC_REM_ACCESS_ERR: u32 = 10;
/// Remote operational error.
pub const IV_WC_REM_OP_ERR: u32 = 11;
/// Transport retries exhausted.
pub const IV_WC_RETRY_EXC_ERR: u32 = 12;
/// RNR retries exhausted.
pub const IV_WC_RNR_RETRY_EXC_ERR: u32 = 13;
/// Fatal error.
pub const IV_WC_FATAL_ERR: u32 = 19;
/// General error.
pub const IV_WC_GENERAL_ERR: u32 = 21;

/// Completion opcode: SEND.
pub const IV_WC_OP_SEND: u32 = 0;
/// Completion opcode: RDMA WRITE.
pub const IV_WC_OP_RDMA_WRITE: u32 = 1;
/// Completion opcode: RDMA READ.
pub const IV_WC_OP_RDMA_READ: u32 = 2;
/// Completion opcode: compare and swap.
pub const IV_WC_OP_COMP_SWAP: u32 = 3;
/// Completion opcode: fetch and add.
pub const IV_WC_OP_FETCH_ADD: u32 = 4;
/// Completion opcode: memory window bind.
pub const IV_WC_OP_BIND_MW: u32 = 5;
/// Completion opcode: local invalidate.
pub const IV_WC_OP_LOCAL_INV: u32 = 6;
/// Completion opcode: fast registration (`IV_WR_REG_MR`).
pub const IV_WC_OP_REG_MR: u32 = 7;
/// Completion opcode: a receive.
pub const IV_WC_OP_RECV: u32 = 128;
/// Completion opcode: a receive consumed by RDMA WRITE with immediate.
pub const IV_WC_OP_RECV_RDMA_WITH_IMM: u32 = 129;

/// Completion flag: a GRH is present (UD).
pub const IV_WC_GRH: u32 = 1 << 0;
/// Completion flag: `imm_or_inv` holds immediate data.
pub const IV_WC_WITH_IMM: u32 = 1 << 1;
/// Completion flag: `imm_or_inv` holds the invalidated rkey.
pub const IV_WC_WITH_INV: u32 = 1 << 3;

/// Bytes of GRH a UD receive buffer must leave room for at its start.
pub const IV_GRH_LEN: u32 = 40;

abi_layout!(IvRingIndex { value, reserved });
abi_layout!(IvRingControl {
    producer,
    consumer,
    arm
});
abi_layout!(IvRingMap {
    entries_addr,
    control_addr,
    entries,
    stride
});
abi_layout!(IvDoorbellPage {
    summary,
    reserved0,
    rung,
    polling,
    reserved2,
    reserved1
});
abi_layout!(IvSendWqe {
    wr_id,
    opcode,
    flags,
    num_sge,
    imm_or_inv,
    remote_addr,
    rkey,
    inline_len,
    compare_add,
    swap,
    ahn,
    remote_qpn,
    remote_qkey,
    reserved
});
abi_layout!(IvRecvWqe {
    wr_id,
    num_sge,
    reserved
});
abi_layout!(IvSge { addr, length, lkey });
abi_layout!(IvCqe {
    wr_id,
    status,
    opcode,
    vendor_err,
    byte_len,
    imm_or_inv,
    qp_num,
    src_qp,
    wc_flags,
    pkey_index,
    slid,
    sl,
    dlid_path_bits,
    reserved0,
    reserved,
    seq
});

const _: () = {
    assert!(size_of::<IvSendWqe>() == IV_SEND_WQE_HEADER);
    assert!(size_of::<IvRecvWqe>() == IV_RECV_WQE_HEADER);
    assert!(size_of::<IvSge>() == 16);
    assert!(size_of::<IvCqe>() == 64);
    assert!(size_of::<IvRingControl>() == 3 * IV_CACHE_LINE);
    assert!(size_of::<IvDoorbellPage>() == IV_DOORBELL_PAGE_SIZE as usize);
    assert!(IV_DOORBELL_SLOTS == 64 * IV_DOORBELL_WORDS);
};
