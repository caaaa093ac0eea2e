//! The model HCA's interface: its registers (BAR 0), the command queue's
//! layout in host memory, the event queue entries, and the encoding of
//! every command and its output. Both sides use this module: the
//! mini-driver ([`crate::ModelHca`]) to format commands and read results,
//! the device ([`crate::Silicon`]) to parse commands (untrusted bytes,
//! checked) and format results. Everything is little-endian.
//!
//! # Registers (BAR 0, [`BAR_LEN`] bytes)
//!
//! | Offset | Width | Access | Register |
//! |---|---|---|---|
//! | [`REG_VERSION`] | 32 | read | interface version ([`VERSION`]) |
//! | [`REG_STATUS`] | 32 | read | [`STATUS_READY`], [`STATUS_FATAL`] |
//! | [`REG_CMD_SLOTS`] | 32 | read | command slots the device executes (at most 32) |
//! | [`REG_EQS`] | 32 | read | event queues it has (1 async + completion vectors) |
//! | [`REG_CMDQ_BASE`] | 64 | write | logical address of the command queue |
//! | [`REG_CMDQ_SLOTS`] | 32 | write | slots the driver uses (<= `REG_CMD_SLOTS`) |
//! | [`REG_CMD_DOORBELL`] | 32 | write | bit `s`: slot `s` is handed to the device |
//! | [`REG_QUEUE_DOORBELL`] | 64 | write | `kind << 32 \| number` ([`DB_SQ`], ...) |
//! | [`REG_RESET`] | 32 | write | 1: stop DMA of registered memory and forget it (removal) |
//! | [`REG_MAD_ENTRIES`], [`REG_MAD_SQ_BASE`], [`REG_MAD_RQ_BASE`], [`REG_MAD_SQ_DOORBELL`], [`REG_MAD_RQ_DOORBELL`] | | write | the GSI's MAD rings ([`crate::gsi`]) |
//! | `REG_UAR_OPEN`, `REG_UAR_CLOSE`, `REG_UAR_BIND`, `REG_UAR_RUNG`, `uar_result(i)` | | | the doorbell pages of BAR 2 ([`crate::uar`]) |
//! | [`eq_reg`]`(n, EQ_BASE)` | 64 | write | EQ `n`'s logical address (0: none) |
//! | [`eq_reg`]`(n, EQ_ENTRIES)` | 32 | write | its entries (a power of two) |
//! | [`eq_reg`]`(n, EQ_CI)` | 32 | write | the driver's consumer index (frees entries) |
//! | [`eq_reg`]`(n, EQ_ARM)` | 32 | write | consumer index, and arm: the next entry raises MSI-X message `n` |
//!
//! # Command queue
//!
//! [`SLOT_SIZE`] bytes per slot, in one common buffer: a [`HEADER_LEN`]-byte
//! header (opcode, input and output mailbox addresses and lengths, the
//! status and output length the device writes back, the owner word), the
//! input mailbox at [`INPUT_OFFSET`] and the output mailbox at
//! [`OUTPUT_OFFSET`]. The driver fills a slot, sets its owner word to
//! [`OWNER_DEVICE`] and writes the slot's bit to [`REG_CMD_DOORBELL`]. The
//! device reads the header and the input by DMA at the addresses the
//! header gives, executes, writes the output, the status and then the
//! owner word ([`OWNER_DRIVER`]) by DMA, and posts an [`EQE_COMMAND`] on
//! EQ 0 (unless the header asked for polling, [`FLAG_POLLED`]).
//!
//! # Queues in host memory
//!
//! The driver allocates every work queue's and CQ's ring and maps it for
//! the device (a scatter/gather mapping, both directions). A create (or a
//! CQ resize) carries the rings' page lists, as a registration does its
//! MTT: [`QueueMtt`] after the command's fields, the pages in the input
//! mailbox at [`MTT_OFFSET`], the first ring's (a CQ's, an SRQ's, a QP's
//! send queue) then the second's (a QP's receive queue). Each ring starts
//! on a page and is whole pages. The device translates and checks the
//! whole list at the create and works on the rings in place for as long
//! as the queue lives; its output gives each ring's geometry (slots and
//! slot size), which the driver checks against what it allocated. A
//! destroy (or the resize that moves a CQ) completes after the device let
//! go of the memory: the driver unmaps and frees it then.
//!
//! # Event queues
//!
//! EQ 0 takes command completions, async events and MAD arrivals; EQ
//! `1 + v` the completion events of completion vector `v`. An entry is
//! [`EQE_LEN`] bytes; its owner word (the last 4 bytes) is written last
//! and is `1 + lap % 2`, where `lap` is the producer index divided by the
//! entries: the driver at consumer index `ci` takes an entry whose owner
//! is `1 + (ci / entries) % 2` (a zeroed queue holds none).

use irpverbs_abi::{
    IvAhAttr, IvQpAttr, IvQpCap, IvQueryDeviceOut, IvQueryPortOut, IvQueryQpOut, NtStatus,
    STATUS_INVALID_PARAMETER, STATUS_NOT_SUPPORTED,
};
use irpverbs_core::hca::{
    AsyncEvent, BindMw, Command, CommandOut, CreateAh, CreateCq, CreateQp, CreateSrq, ModifyQp,
    ModifySrq,
};
use zerocopy::{FromBytes, Immutable, IntoBytes};

#[cfg(doc)]
use crate::gsi::{
    REG_MAD_ENTRIES, REG_MAD_RQ_BASE, REG_MAD_RQ_DOORBELL, REG_MAD_SQ_BASE, REG_MAD_SQ_DOORBELL,
};

/// The interface version [`REG_VERSION`] reads.
pub const VERSION: u32 = 0x0001_0000;
/// Bytes of BAR 0: the registers, the event queues' and the doorbell
/// pages' ([`crate::uar`]).
pub const BAR_LEN: usize = 0x4000;

/// Interface version (read).
pub const REG_VERSION: usize = 0x000;
/// Device status (read).
pub const REG_STATUS: usize = 0x004;
/// Command slots the device executes (read).
pub const REG_CMD_SLOTS: usize = 0x008;
/// Event queues the device has (read).
pub const REG_EQS: usize = 0x00C;
/// The command queue's logical address (64-bit write).
pub const REG_CMDQ_BASE: usize = 0x010;
/// Slots the driver uses (write).
pub const REG_CMDQ_SLOTS: usize = 0x018;
/// Command doorbell: a mask of slots (write).
pub const REG_CMD_DOORBELL: usize = 0x020;
/// Queue doorbell: `kind << 32 | number` (64-bit write).
pub const REG_QUEUE_DOORBELL: usize = 0x028;
/// Reset (write 1).
pub const REG_RESET: usize = 0x030;

/// [`REG_STATUS`]: the device runs.
pub const STATUS_READY: u32 = 1;
/// [`REG_STATUS`]: the device hit a fatal error (it stopped).
pub const STATUS_FATAL: u32 = 2;

/// Where the event queues' registers start.
pub const EQ_REGS: usize = 0x100;
/// Bytes of one event queue's registers.
pub const EQ_REGS_LEN: usize = 0x20;
/// EQ register: base (64-bit).
pub const EQ_BASE: usize = 0x00;
/// EQ register: entries.
pub const EQ_ENTRIES: usize = 0x08;
/// EQ register: consumer index.
pub const EQ_CI: usize = 0x0C;
/// EQ register: arm (with the consumer index).
pub const EQ_ARM: usize = 0x10;
/// Event queues the register file has room for.
pub const MAX_EQS: usize = (crate::uar::UAR_RESULTS - EQ_REGS) / EQ_REGS_LEN;

/// The offset of register `reg` of event queue `eq`.
#[must_use]
pub const fn eq_reg(eq: usize, reg: usize) -> usize {
    EQ_REGS + eq * EQ_REGS_LEN + reg
}

/// [`REG_QUEUE_DOORBELL`] kind: a QP's send queue.
pub const DB_SQ: u64 = 1;
/// Kind: a QP's receive queue.
pub const DB_RQ: u64 = 2;
/// Kind: an SRQ.
pub const DB_SRQ: u64 = 3;
/// Kind: a CQ's arm word.
pub const DB_CQ_ARM: u64 = 4;

/// Most command slots (the doorbell's mask is 32 bits).
pub const MAX_SLOTS: usize = 32;
/// Bytes of a command slot: room in the input mailbox for the page lists
/// of the largest QP's two rings (32 MiB with the soft HCA's limits).
pub const SLOT_SIZE: usize = 128 * 1024;
/// Bytes of a slot's header.
pub const HEADER_LEN: usize = 64;
/// Where a slot's input mailbox starts.
pub const INPUT_OFFSET: usize = HEADER_LEN;
/// Where its output mailbox starts.
pub const OUTPUT_OFFSET: usize = SLOT_SIZE - OUTPUT_LEN;
/// Bytes of the output mailbox.
pub const OUTPUT_LEN: usize = 4096;
/// Bytes of the input mailbox (the fixed part of a command, then a
/// registration's or a create's page lists).
pub const INPUT_LEN: usize = OUTPUT_OFFSET - INPUT_OFFSET;
/// Bytes of the fixed part of any command's input, and of any output: what
/// either side holds on its stack.
pub const FIXED_LEN: usize = 512;
/// Where a registration's or a create's page lists start in the input
/// mailbox.
pub const MTT_OFFSET: usize = FIXED_LEN;
/// Pages one command's page lists (in the input mailbox) hold.
pub const MAX_MTT: usize = (INPUT_LEN - MTT_OFFSET) / 8;

/// Header field: opcode (u32).
pub const H_OPCODE: usize = 0;
/// Header field: input bytes (u32).
pub const H_INPUT_LEN: usize = 4;
/// Header field: input mailbox address (u64).
pub const H_INPUT_ADDR: usize = 8;
/// Header field: output mailbox address (u64).
pub const H_OUTPUT_ADDR: usize = 16;
/// Header field: output mailbox bytes (u32).
pub const H_OUTPUT_LEN: usize = 24;
/// Header field: status (i32, the device writes it).
pub const H_STATUS: usize = 28;
/// Header field: output bytes written (u32, the device writes it).
pub const H_OUT_WRITTEN: usize = 32;
/// Header field: flags (u32).
pub const H_FLAGS: usize = 36;
/// Header field: owner (u32), written last by each side.
pub const H_OWNER: usize = 60;

/// Owner: the driver may fill the slot (the device finished it).
pub const OWNER_DRIVER: u32 = 0;
/// Owner: the device executes the slot.
pub const OWNER_DEVICE: u32 = 1;
/// Flag: no event when done; the driver polls the owner word
/// (initialization, before interrupts are connected).
pub const FLAG_POLLED: u32 = 1;

/// Bytes of an event queue entry.
pub const EQE_LEN: usize = 16;
/// Entry field: kind (u8).
pub const E_KIND: usize = 0;
/// Entry field: async event type (u8).
pub const E_SUB: usize = 1;
/// Entry field: argument (u32: a slot, a CQN, an object number).
pub const E_ARG: usize = 4;
/// Entry field: owner (u32).
pub const E_OWNER: usize = 12;
/// Kind: command slot `arg` completed.
pub const EQE_COMMAND: u8 = 1;
/// Kind: CQ `arg` got a completion while armed.
pub const EQE_COMPLETION: u8 = 2;
/// Kind: async event `sub` on object `arg`.
pub const EQE_ASYNC: u8 = 3;
/// Kind: MADs arrived on the GSI.
pub const EQE_MAD: u8 = 4;

/// The owner word of the entry at producer or consumer index `index` of a
/// queue of `entries`.
#[must_use]
pub const fn eqe_owner(index: u32, entries: u32) -> u32 {
    1 + (index / entries) % 2
}

/// Opcode: the device's attributes (an [`IvQueryDeviceOut`]).
pub const OP_QUERY_DEVICE: u32 = 0x001;
/// Opcode: nothing (success, no output). The mini-driver posts it in
/// place of a command it could not send (its mapping was refused, say),
/// so that the failure completes through the event queue like any other.
pub const OP_NOP: u32 = 0x002;
/// Opcodes of [`Command`]s, in its order.
pub const OP_QUERY_PORT: u32 = 0x100;
/// [`Command::QueryGid`].
pub const OP_QUERY_GID: u32 = 0x101;
/// [`Command::AllocPd`].
pub const OP_ALLOC_PD: u32 = 0x102;
/// [`Command::DeallocPd`].
pub const OP_DEALLOC_PD: u32 = 0x103;
/// [`Command::RegMr`].
pub const OP_REG_MR: u32 = 0x104;
/// [`Command::DeregMr`].
pub const OP_DEREG_MR: u32 = 0x105;
/// [`Command::CreateCq`].
pub const OP_CREATE_CQ: u32 = 0x106;
/// [`Command::ResizeCq`].
pub const OP_RESIZE_CQ: u32 = 0x107;
/// [`Command::DestroyCq`].
pub const OP_DESTROY_CQ: u32 = 0x108;
/// [`Command::CreateSrq`].
pub const OP_CREATE_SRQ: u32 = 0x109;
/// [`Command::ModifySrq`].
pub const OP_MODIFY_SRQ: u32 = 0x10A;
/// [`Command::QuerySrq`].
pub const OP_QUERY_SRQ: u32 = 0x10B;
/// [`Command::DestroySrq`].
pub const OP_DESTROY_SRQ: u32 = 0x10C;
/// [`Command::CreateQp`].
pub const OP_CREATE_QP: u32 = 0x10D;
/// [`Command::ModifyQp`].
pub const OP_MODIFY_QP: u32 = 0x10E;
/// [`Command::QueryQp`].
pub const OP_QUERY_QP: u32 = 0x10F;
/// [`Command::DestroyQp`].
pub const OP_DESTROY_QP: u32 = 0x110;
/// [`Command::CreateAh`].
pub const OP_CREATE_AH: u32 = 0x111;
/// [`Command::DestroyAh`].
pub const OP_DESTROY_AH: u32 = 0x112;
/// [`Command::AllocMw`].
pub const OP_ALLOC_MW: u32 = 0x113;
/// [`Command::DeallocMw`].
pub const OP_DEALLOC_MW: u32 = 0x114;
/// [`Command::BindMw`].
pub const OP_BIND_MW: u32 = 0x115;
/// [`Command::AllocMr`].
pub const OP_ALLOC_MR: u32 = 0x116;

const _: () = assert!(size_of::<IvQueryQpOut>() + 16 <= FIXED_LEN);
const _: () = assert!(size_of::<IvQpAttr>() + 16 <= FIXED_LEN);
const _: () = assert!(size_of::<IvQueryDeviceOut>() <= FIXED_LEN);
const _: () = assert!(size_of::<IvQueryPortOut>() <= FIXED_LEN);

/// A little-endian writer over a fixed buffer.
pub struct Writer<'a> {
    buf: &'a mut [u8],
    at: usize,
}

impl<'a> Writer<'a> {
    /// A writer at the start of `buf`.
    pub fn new(buf: &'a mut [u8]) -> Self {
        Self { buf, at: 0 }
    }

    /// Appends `bytes`.
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER` when they do not fit.
    pub fn bytes(&mut self, bytes: &[u8]) -> Result<(), NtStatus> {
        let end = self.at + bytes.len();
        self.buf
            .get_mut(self.at..end)
            .ok_or(STATUS_INVALID_PARAMETER)?
            .copy_from_slice(bytes);
        self.at = end;
        Ok(())
    }

    /// Appends a u32.
    ///
    /// # Errors
    /// As [`Self::bytes`].
    pub fn u32(&mut self, v: u32) -> Result<(), NtStatus> {
        self.bytes(&v.to_le_bytes())
    }

    /// Appends a u64.
    ///
    /// # Errors
    /// As [`Self::bytes`].
    pub fn u64(&mut self, v: u64) -> Result<(), NtStatus> {
        self.bytes(&v.to_le_bytes())
    }

    /// Appends a plain struct.
    ///
    /// # Errors
    /// As [`Self::bytes`].
    pub fn obj<T: IntoBytes + Immutable>(&mut self, v: &T) -> Result<(), NtStatus> {
        self.bytes(v.as_bytes())
    }

    /// Bytes written.
    #[must_use]
    pub fn len(&self) -> usize {
        self.at
    }

    /// Nothing written yet.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.at == 0
    }
}

/// A checked little-endian reader of untrusted bytes.
pub struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `buf`.
    #[must_use]
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, at: 0 }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], NtStatus> {
        let s = self
            .buf
            .get(self.at..self.at + n)
            .ok_or(STATUS_INVALID_PARAMETER)?;
        self.at += n;
        Ok(s)
    }

    /// The next u32.
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER` past the end.
    pub fn u32(&mut self) -> Result<u32, NtStatus> {
        let mut b = [0; 4];
        b.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(b))
    }

    /// The next u64.
    ///
    /// # Errors
    /// As [`Self::u32`].
    pub fn u64(&mut self) -> Result<u64, NtStatus> {
        let mut b = [0; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }

    /// The next plain struct.
    ///
    /// # Errors
    /// As [`Self::u32`].
    pub fn obj<T: FromBytes>(&mut self) -> Result<T, NtStatus> {
        T::read_from_bytes(self.take(size_of::<T>())?).map_err(|_| STATUS_INVALID_PARAMETER)
    }

    /// A boolean word (0 or 1).
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER` for anything else.
    pub fn flag(&mut self) -> Result<bool, NtStatus> {
        match self.u32()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(STATUS_INVALID_PARAMETER),
        }
    }

    /// Every byte was read: a command longer than its opcode's is refused.
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER` when bytes are left.
    pub fn end(&self) -> Result<(), NtStatus> {
        if self.at == self.buf.len() {
            Ok(())
        } else {
            Err(STATUS_INVALID_PARAMETER)
        }
    }
}

/// A registration's page table, as [`Command::RegMr`]'s input carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mtt {
    /// Logical address of the first entry (in the slot's input mailbox).
    pub address: u64,
    /// Entries (pages).
    pub entries: u32,
    /// Where the region's first byte is in the first page.
    pub first_offset: u32,
}

/// The page lists of a create's rings ([`Command::CreateCq`],
/// [`Command::ResizeCq`], [`Command::CreateSrq`], [`Command::CreateQp`]):
/// `pages[0]` page addresses at `address` for the first ring, then
/// `pages[1]` for the second (0: no such ring given).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueMtt {
    /// Logical address of the first entry (in the slot's input mailbox).
    pub address: u64,
    /// Pages of each ring.
    pub pages: [u32; 2],
}

/// Whether `command` makes rings: it carries a [`QueueMtt`].
#[must_use]
pub fn makes_rings(command: &Command) -> bool {
    matches!(
        command,
        Command::CreateCq(_)
            | Command::ResizeCq { .. }
            | Command::CreateSrq(_)
            | Command::CreateQp(_)
    )
}

/// Pages a region of `length` bytes starting `first_offset` bytes into its
/// first page touches.
#[must_use]
pub fn pages_spanned(first_offset: u64, length: u64) -> u64 {
    (first_offset + length).div_ceil(irpverbs_core::platform::DMA_PAGE_SIZE)
}

/// The opcode of `command`.
#[must_use]
pub fn opcode(command: &Command) -> u32 {
    match command {
        Command::QueryPort { .. } => OP_QUERY_PORT,
        Command::QueryGid { .. } => OP_QUERY_GID,
        Command::AllocPd => OP_ALLOC_PD,
        Command::DeallocPd { .. } => OP_DEALLOC_PD,
        Command::RegMr(_) => OP_REG_MR,
        Command::DeregMr { .. } => OP_DEREG_MR,
        Command::CreateCq(_) => OP_CREATE_CQ,
        Command::ResizeCq { .. } => OP_RESIZE_CQ,
        Command::DestroyCq { .. } => OP_DESTROY_CQ,
        Command::CreateSrq(_) => OP_CREATE_SRQ,
        Command::ModifySrq(_) => OP_MODIFY_SRQ,
        Command::QuerySrq { .. } => OP_QUERY_SRQ,
        Command::DestroySrq { .. } => OP_DESTROY_SRQ,
        Command::CreateQp(_) => OP_CREATE_QP,
        Command::ModifyQp(_) => OP_MODIFY_QP,
        Command::QueryQp { .. } => OP_QUERY_QP,
        Command::DestroyQp { .. } => OP_DESTROY_QP,
        Command::CreateAh(_) => OP_CREATE_AH,
        Command::DestroyAh { .. } => OP_DESTROY_AH,
        Command::AllocMw { .. } => OP_ALLOC_MW,
        Command::DeallocMw { .. } => OP_DEALLOC_MW,
        Command::BindMw(_) => OP_BIND_MW,
        Command::AllocMr { .. } => OP_ALLOC_MR,
    }
}

/// Writes the fixed part of `command`'s input (its page table, for a
/// registration, is `mtt`; its rings', for a create, `queues`); returns
/// its length.
///
/// # Errors
/// `STATUS_INVALID_PARAMETER` when `out` is too small (never for
/// [`FIXED_LEN`] bytes).
pub fn encode_command(
    command: &Command,
    mtt: Mtt,
    queues: QueueMtt,
    out: &mut [u8],
) -> Result<usize, NtStatus> {
    let mut w = Writer::new(out);
    encode_fields(command, mtt, &mut w)?;
    if makes_rings(command) {
        w.u64(queues.address)?;
        w.u32(queues.pages[0])?;
        w.u32(queues.pages[1])?;
    }
    Ok(w.len())
}

fn encode_fields(command: &Command, mtt: Mtt, w: &mut Writer<'_>) -> Result<(), NtStatus> {
    match command {
        Command::QueryPort { port } => w.u32(u32::from(*port))?,
        Command::QueryGid { port, index } => {
            w.u32(u32::from(*port))?;
            w.u32(*index)?;
        }
        Command::AllocPd => {}
        Command::DeallocPd { pdn } => w.u32(*pdn)?,
        Command::RegMr(r) => {
            w.u32(r.pdn)?;
            w.u32(r.access)?;
            w.u64(r.addr)?;
            w.u64(r.length)?;
            w.u32(u32::from(r.physical))?;
            w.u32(mtt.entries)?;
            w.u64(mtt.address)?;
            w.u32(mtt.first_offset)?;
        }
        Command::DeregMr { lkey } => w.u32(*lkey)?,
        Command::CreateCq(c) => {
            w.u32(c.cqe)?;
            w.u32(c.comp_vector)?;
        }
        Command::ResizeCq { cqn, cqe } => {
            w.u32(*cqn)?;
            w.u32(*cqe)?;
        }
        Command::DestroyCq { cqn } => w.u32(*cqn)?,
        Command::CreateSrq(s) => {
            w.u32(s.pdn)?;
            w.u32(s.max_wr)?;
            w.u32(s.max_sge)?;
            w.u32(s.srq_limit)?;
        }
        Command::ModifySrq(s) => {
            w.u32(s.srqn)?;
            w.u32(s.mask)?;
            w.u32(s.max_wr)?;
            w.u32(s.srq_limit)?;
        }
        Command::QuerySrq { srqn } | Command::DestroySrq { srqn } => w.u32(*srqn)?,
        Command::CreateQp(q) => {
            w.u32(q.pdn)?;
            w.u32(q.qp_type)?;
            w.u32(q.send_cqn)?;
            w.u32(q.recv_cqn)?;
            w.u32(u32::from(q.srqn.is_some()))?;
            w.u32(q.srqn.unwrap_or(0))?;
            w.u32(u32::from(q.sq_sig_all))?;
            w.obj(&q.cap)?;
        }
        Command::ModifyQp(m) => {
            w.u32(m.qpn)?;
            w.u32(m.cur_state)?;
            w.u32(m.mask)?;
            w.obj(&m.attr)?;
        }
        Command::QueryQp { qpn } | Command::DestroyQp { qpn } => w.u32(*qpn)?,
        Command::CreateAh(a) => {
            w.u32(a.pdn)?;
            w.obj(&a.attr)?;
        }
        Command::DestroyAh { ahn } => w.u32(*ahn)?,
        Command::AllocMw { pdn, mw_type } => {
            w.u32(*pdn)?;
            w.u32(*mw_type)?;
        }
        Command::DeallocMw { rkey } => w.u32(*rkey)?,
        Command::BindMw(b) => {
            w.u32(b.rkey)?;
            w.u32(b.lkey)?;
            w.u64(b.addr)?;
            w.u64(b.length)?;
            w.u32(b.access)?;
        }
        Command::AllocMr { pdn, max_pages } => {
            w.u32(*pdn)?;
            w.u32(*max_pages)?;
        }
    }
    Ok(())
}

/// A command as the device parsed it: a [`Command`], or a registration
/// whose memory the device still has to find ([`Parsed::RegMr`]).
#[derive(Debug)]
pub enum Parsed {
    /// Any command but a registration or a create of rings.
    Command(Command),
    /// A command that makes rings ([`makes_rings`]) and their page lists.
    OnQueues(Command, QueueMtt),
    /// [`Command::RegMr`]'s fields and its page table.
    RegMr {
        /// PD number.
        pdn: u32,
        /// `IV_ACCESS_*`.
        access: u32,
        /// Start address.
        addr: u64,
        /// Bytes.
        length: u64,
        /// A physical registration.
        physical: bool,
        /// Its page table.
        mtt: Mtt,
    },
}

fn port(r: &mut Reader<'_>) -> Result<u8, NtStatus> {
    u8::try_from(r.u32()?).map_err(|_| STATUS_INVALID_PARAMETER)
}

/// Parses the input of a command of `opcode` (untrusted bytes): every
/// field read with bounds checks, booleans 0 or 1, no bytes left over.
///
/// # Errors
/// `STATUS_NOT_SUPPORTED` for an unknown opcode; `STATUS_INVALID_PARAMETER`
/// for an input of the wrong length or a bad field.
pub fn decode_command(opcode: u32, input: &[u8]) -> Result<Parsed, NtStatus> {
    let mut r = Reader::new(input);
    let command = match opcode {
        OP_QUERY_PORT => Command::QueryPort {
            port: port(&mut r)?,
        },
        OP_QUERY_GID => Command::QueryGid {
            port: port(&mut r)?,
            index: r.u32()?,
        },
        OP_ALLOC_PD => Command::AllocPd,
        OP_DEALLOC_PD => Command::DeallocPd { pdn: r.u32()? },
        OP_REG_MR => {
            let parsed = Parsed::RegMr {
                pdn: r.u32()?,
                access: r.u32()?,
                addr: r.u64()?,
                length: r.u64()?,
                physical: r.flag()?,
                mtt: {
                    let entries = r.u32()?;
                    Mtt {
                        entries,
                        address: r.u64()?,
                        first_offset: r.u32()?,
                    }
                },
            };
            r.end()?;
            return Ok(parsed);
        }
        OP_DEREG_MR => Command::DeregMr { lkey: r.u32()? },
        OP_CREATE_CQ => Command::CreateCq(CreateCq {
            cqe: r.u32()?,
            comp_vector: r.u32()?,
        }),
        OP_RESIZE_CQ => Command::ResizeCq {
            cqn: r.u32()?,
            cqe: r.u32()?,
        },
        OP_DESTROY_CQ => Command::DestroyCq { cqn: r.u32()? },
        OP_CREATE_SRQ => Command::CreateSrq(CreateSrq {
            pdn: r.u32()?,
            max_wr: r.u32()?,
            max_sge: r.u32()?,
            srq_limit: r.u32()?,
        }),
        OP_MODIFY_SRQ => Command::ModifySrq(ModifySrq {
            srqn: r.u32()?,
            mask: r.u32()?,
            max_wr: r.u32()?,
            srq_limit: r.u32()?,
        }),
        OP_QUERY_SRQ => Command::QuerySrq { srqn: r.u32()? },
        OP_DESTROY_SRQ => Command::DestroySrq { srqn: r.u32()? },
        OP_CREATE_QP => {
            let (pdn, qp_type, send_cqn, recv_cqn) = (r.u32()?, r.u32()?, r.u32()?, r.u32()?);
            let has_srq = r.flag()?;
            let srqn = r.u32()?;
            Command::CreateQp(CreateQp {
                pdn,
                qp_type,
                send_cqn,
                recv_cqn,
                srqn: has_srq.then_some(srqn),
                sq_sig_all: r.flag()?,
                cap: r.obj::<IvQpCap>()?,
            })
        }
        OP_MODIFY_QP => Command::ModifyQp(ModifyQp {
            qpn: r.u32()?,
            cur_state: r.u32()?,
            mask: r.u32()?,
            attr: r.obj::<IvQpAttr>()?,
        }),
        OP_QUERY_QP => Command::QueryQp { qpn: r.u32()? },
        OP_DESTROY_QP => Command::DestroyQp { qpn: r.u32()? },
        OP_CREATE_AH => Command::CreateAh(CreateAh {
            pdn: r.u32()?,
            attr: r.obj::<IvAhAttr>()?,
        }),
        OP_DESTROY_AH => Command::DestroyAh { ahn: r.u32()? },
        OP_ALLOC_MW => Command::AllocMw {
            pdn: r.u32()?,
            mw_type: r.u32()?,
        },
        OP_DEALLOC_MW => Command::DeallocMw { rkey: r.u32()? },
        OP_BIND_MW => Command::BindMw(BindMw {
            rkey: r.u32()?,
            lkey: r.u32()?,
            addr: r.u64()?,
            length: r.u64()?,
            access: r.u32()?,
        }),
        OP_ALLOC_MR => Command::AllocMr {
            pdn: r.u32()?,
            max_pages: r.u32()?,
        },
        _ => return Err(STATUS_NOT_SUPPORTED),
    };
    if makes_rings(&command) {
        let queues = QueueMtt {
            address: r.u64()?,
            pages: [r.u32()?, r.u32()?],
        };
        r.end()?;
        return Ok(Parsed::OnQueues(command, queues));
    }
    r.end()?;
    Ok(Parsed::Command(command))
}

/// Writes a command's output (a ring by its geometry: slots, then slot
/// size); returns its length.
///
/// # Errors
/// `STATUS_INVALID_PARAMETER` when `out` is too small (never for
/// [`FIXED_LEN`] bytes).
pub fn encode_output(output: &CommandOut, out: &mut [u8]) -> Result<usize, NtStatus> {
    let mut w = Writer::new(out);
    match output {
        CommandOut::None => {}
        CommandOut::Port(p) => w.obj(p)?,
        CommandOut::Gid(g) => w.bytes(g)?,
        CommandOut::Pd { pdn } => w.u32(*pdn)?,
        CommandOut::Mr { lkey, rkey } => {
            w.u32(*lkey)?;
            w.u32(*rkey)?;
        }
        CommandOut::Cq { cqn, cqe, ring } => {
            w.u32(*cqn)?;
            w.u32(*cqe)?;
            geometry(&mut w, Some(ring))?;
        }
        CommandOut::Srq {
            srqn,
            max_wr,
            max_sge,
            ring,
        } => {
            w.u32(*srqn)?;
            w.u32(*max_wr)?;
            w.u32(*max_sge)?;
            geometry(&mut w, Some(ring))?;
        }
        CommandOut::SrqAttr(a) => w.obj(a)?,
        CommandOut::Qp { qpn, cap, sq, rq } => {
            w.u32(*qpn)?;
            w.u32(u32::from(rq.is_some()))?;
            w.obj(cap)?;
            geometry(&mut w, Some(sq))?;
            geometry(&mut w, rq.as_ref())?;
        }
        CommandOut::QpAttr(a) => w.obj(&**a)?,
        CommandOut::Ah { ahn } => w.u32(*ahn)?,
        CommandOut::Mw { rkey } => w.u32(*rkey)?,
    }
    Ok(w.len())
}

/// A ring's geometry in an output: its slots and slot size (0, 0: none).
fn geometry(w: &mut Writer<'_>, ring: Option<&irpverbs_ring::Ring>) -> Result<(), NtStatus> {
    w.u32(ring.map_or(0, irpverbs_ring::Ring::entries))?;
    w.u32(ring.map_or(0, irpverbs_ring::Ring::stride))
}

/// The async event an [`EQE_ASYNC`] entry carries: its type and object.
#[must_use]
pub fn encode_async(event: AsyncEvent) -> (u8, u32) {
    match event {
        AsyncEvent::QpFatal(n) => (1, n),
        AsyncEvent::QpRequestError(n) => (2, n),
        AsyncEvent::QpAccessError(n) => (3, n),
        AsyncEvent::CommEstablished(n) => (4, n),
        AsyncEvent::SqDrained(n) => (5, n),
        AsyncEvent::LastWqeReached(n) => (6, n),
        AsyncEvent::SrqLimitReached(n) => (7, n),
        AsyncEvent::SrqError(n) => (8, n),
        AsyncEvent::CqError(n) => (9, n),
        AsyncEvent::PortActive(p) => (10, u32::from(p)),
        AsyncEvent::PortError(p) => (11, u32::from(p)),
        AsyncEvent::DeviceFatal => (12, 0),
        AsyncEvent::PathMigrated(n) => (13, n),
        AsyncEvent::PathMigrationError(n) => (14, n),
    }
}

/// The async event of an [`EQE_ASYNC`] entry; `None` for an unknown type.
#[must_use]
pub fn decode_async(sub: u8, arg: u32) -> Option<AsyncEvent> {
    let port = || u8::try_from(arg).ok();
    Some(match sub {
        1 => AsyncEvent::QpFatal(arg),
        2 => AsyncEvent::QpRequestError(arg),
        3 => AsyncEvent::QpAccessError(arg),
        4 => AsyncEvent::CommEstablished(arg),
        5 => AsyncEvent::SqDrained(arg),
        6 => AsyncEvent::LastWqeReached(arg),
        7 => AsyncEvent::SrqLimitReached(arg),
        8 => AsyncEvent::SrqError(arg),
        9 => AsyncEvent::CqError(arg),
        10 => AsyncEvent::PortActive(port()?),
        11 => AsyncEvent::PortError(port()?),
        12 => AsyncEvent::DeviceFatal,
        13 => AsyncEvent::PathMigrated(arg),
        14 => AsyncEvent::PathMigrationError(arg),
        _ => return None,
    })
}

/// An event queue entry: kind, async type, argument, owner word.
#[must_use]
pub fn eqe(kind: u8, sub: u8, arg: u32, owner: u32) -> [u8; EQE_LEN] {
    let mut e = [0; EQE_LEN];
    e[E_KIND] = kind;
    e[E_SUB] = sub;
    e[E_ARG..E_ARG + 4].copy_from_slice(&arg.to_le_bytes());
    e[E_OWNER..E_OWNER + 4].copy_from_slice(&owner.to_le_bytes());
    e
}

/// The output of a query that reads a struct: [`IvQueryPortOut`],
/// [`IvQuerySrqOut`], [`IvQueryQpOut`], [`IvQueryDeviceOut`].
///
/// # Errors
/// `STATUS_INVALID_PARAMETER` when `bytes` is not exactly one.
pub fn read_exact<T: FromBytes>(bytes: &[u8]) -> Result<T, NtStatus> {
    let mut r = Reader::new(bytes);
    let v = r.obj::<T>()?;
    r.end()?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use irpverbs_abi::IV_QPT_RC;

    fn round_trip(command: Command) {
        let mut buf = [0u8; FIXED_LEN];
        let queues = QueueMtt {
            address: 0x1000,
            pages: [3, 1],
        };
        let n = encode_command(&command, Mtt::default_for_tests(), queues, &mut buf).unwrap();
        match decode_command(opcode(&command), &buf[..n]).unwrap() {
            Parsed::Command(c) => assert_eq!(c, command),
            Parsed::OnQueues(c, q) => {
                assert!(makes_rings(&c));
                assert_eq!((c, q), (command.clone(), queues));
            }
            Parsed::RegMr { .. } => panic!("not a registration"),
        }
        // One byte more or less is refused.
        assert_eq!(
            decode_command(opcode(&command), &buf[..n + 1]).unwrap_err(),
            STATUS_INVALID_PARAMETER
        );
        if n > 0 {
            assert_eq!(
                decode_command(opcode(&command), &buf[..n - 1]).unwrap_err(),
                STATUS_INVALID_PARAMETER
            );
        }
    }

    impl Mtt {
        fn default_for_tests() -> Self {
            Self {
                address: 0,
                entries: 0,
                first_offset: 0,
            }
        }
    }

    #[test]
    fn commands_round_trip_and_wrong_lengths_are_refused() {
        round_trip(Command::QueryPort { port: 1 });
        round_trip(Command::QueryGid { port: 1, index: 3 });
        round_trip(Command::AllocPd);
        round_trip(Command::DeallocPd { pdn: 7 });
        round_trip(Command::CreateCq(CreateCq {
            cqe: 64,
            comp_vector: 1,
        }));
        round_trip(Command::CreateQp(CreateQp {
            pdn: 1,
            qp_type: IV_QPT_RC,
            send_cqn: 2,
            recv_cqn: 3,
            srqn: Some(4),
            sq_sig_all: true,
            cap: IvQpCap {
                max_send_wr: 16,
                ..IvQpCap::default()
            },
        }));
        round_trip(Command::ModifyQp(ModifyQp {
            qpn: 9,
            cur_state: 1,
            mask: 3,
            attr: IvQpAttr::default(),
        }));
        round_trip(Command::DestroyAh { ahn: 2 });
    }

    #[test]
    fn bad_fields_are_refused() {
        assert_eq!(
            decode_command(0x7777, &[]).unwrap_err(),
            STATUS_NOT_SUPPORTED
        );
        // A port number that is not a byte.
        assert_eq!(
            decode_command(OP_QUERY_PORT, &300u32.to_le_bytes()).unwrap_err(),
            STATUS_INVALID_PARAMETER
        );
        // A boolean that is neither 0 nor 1.
        let mut buf = [0u8; FIXED_LEN];
        let q = Command::CreateQp(CreateQp {
            pdn: 1,
            qp_type: IV_QPT_RC,
            send_cqn: 2,
            recv_cqn: 3,
            srqn: None,
            sq_sig_all: false,
            cap: IvQpCap::default(),
        });
        let n =
            encode_command(&q, Mtt::default_for_tests(), QueueMtt::default(), &mut buf).unwrap();
        buf[16] = 2;
        assert_eq!(
            decode_command(OP_CREATE_QP, &buf[..n]).unwrap_err(),
            STATUS_INVALID_PARAMETER
        );
    }

    #[test]
    fn async_events_round_trip() {
        for e in [
            AsyncEvent::QpFatal(5),
            AsyncEvent::PortActive(1),
            AsyncEvent::DeviceFatal,
            AsyncEvent::CqError(3),
            AsyncEvent::PathMigrated(7),
            AsyncEvent::PathMigrationError(8),
        ] {
            let (sub, arg) = encode_async(e);
            assert_eq!(decode_async(sub, arg), Some(e));
        }
        assert_eq!(decode_async(0, 0), None);
        assert_eq!(decode_async(10, 300), None);
    }

    #[test]
    fn owner_words_alternate_by_lap() {
        assert_eq!(eqe_owner(0, 4), 1);
        assert_eq!(eqe_owner(3, 4), 1);
        assert_eq!(eqe_owner(4, 4), 2);
        assert_eq!(eqe_owner(8, 4), 1);
        assert_eq!(pages_spanned(0, 4096), 1);
        assert_eq!(pages_spanned(1, 4096), 2);
        assert_eq!(pages_spanned(4095, 2), 2);
    }
}
