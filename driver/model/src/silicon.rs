//! The device model: the "silicon" of the model HCA.
//!
//! Its only contact with the driver is BAR 0 ([`Silicon::read`],
//! [`Silicon::write`]: what the platform calls for each register access),
//! DMA at logical addresses and MSI-X messages, both through its
//! [`DeviceBus`] (in host mode, the IOMMU model of
//! `irpverbs_host::platform::pci`, which bugchecks 0xE6 on any access
//! outside a live mapping). Inside, it executes commands and moves data
//! with the soft HCA's firmware and transport (a [`SoftHca`] it owns, its
//! engine): it reads each command from the command queue in host memory,
//! checks it (untrusted bytes: a bad command gets a status, never a
//! panic), takes views of the queues and registered memory it names
//! through their page lists ([`DeviceBus::dma_view`]), hands it to the
//! engine on them, and writes the output, the status and
//! an event queue entry back by DMA, raising the event queue's MSI-X
//! message when it is armed. Its BAR 2 is doorbell (UAR) pages of its own
//! memory, which its engine scans ([`crate::uar`]).
//!
//! The device does its work in [`Silicon::run`], which its bus schedules
//! ([`DeviceBus::kick`]) when a register asks for work and when the engine
//! interrupts: in host mode a DPC of its own. A run is bounded by the
//! command slots and the room in the event queues.

use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering, fence};

use alloc::sync::Arc;
use alloc::vec::Vec;
use irpverbs_abi::IV_ACCESS_LOCAL_WRITE;
use irpverbs_abi::{
    IvQueryDeviceOut, NtStatus, STATUS_BUFFER_TOO_SMALL, STATUS_INSUFFICIENT_RESOURCES,
    STATUS_INVALID_PARAMETER, STATUS_SUCCESS,
};
use irpverbs_core::hca::{Command, Event, RegMr};
use irpverbs_core::platform::{DMA_PAGE_SIZE, LogicalAddress};
use irpverbs_core::{Hca, Platform};
use irpverbs_ring::{Region, Shared};
use irpverbs_soft::SoftHca;
use zerocopy::IntoBytes;

use crate::config::MSIX_TABLE_SIZE;
use crate::gsi::*;
use crate::protocol::*;
use crate::uar::*;

/// What the device reaches the host through: DMA at logical addresses,
/// MSI-X messages, and its own scheduling.
pub trait DeviceBus: Send + Sync + 'static {
    /// Reads host memory at logical address `at` (a DMA read).
    ///
    /// # Errors
    /// The platform's refusal (host mode: a bugcheck 0xE6 with the
    /// verifier on, `STATUS_INVALID_ADDRESS` with it off).
    fn dma_read(&self, at: LogicalAddress, buf: &mut [u8]) -> Result<(), NtStatus>;
    /// Writes host memory at logical address `at` (a DMA write).
    ///
    /// # Errors
    /// As [`DeviceBus::dma_read`].
    fn dma_write(&self, at: LogicalAddress, buf: &[u8]) -> Result<(), NtStatus>;
    /// The device's view of `len` bytes of host memory through a page
    /// list, to work on in place for as long as it holds it (its engine's
    /// queues and registered memory): the first byte `first_offset` bytes
    /// into the first page, `next_page(i)` the logical address of page `i`.
    /// The platform translates and checks every page (for writing too if
    /// `write`) and counts the view against its mapping until it is
    /// dropped (host mode: `HostPlatform::dma_view`).
    ///
    /// # Errors
    /// As [`DeviceBus::dma_read`]; `STATUS_INVALID_PARAMETER` for a page
    /// list that is not one piece of mapped memory; `next_page`'s error.
    fn dma_view(
        &self,
        first_offset: usize,
        len: usize,
        write: bool,
        next_page: &mut dyn FnMut(usize) -> Result<LogicalAddress, NtStatus>,
    ) -> Result<Shared<Region>, NtStatus>;
    /// Signals MSI-X message `message`.
    fn raise_msix(&self, message: u16);
    /// Schedules [`Silicon::run`] soon (never on the caller's stack while
    /// the caller may hold a driver lock).
    fn kick(&self);
}

/// An event queue as the device sees it.
#[derive(Default)]
struct DevEq {
    base: AtomicU64,
    entries: AtomicU32,
    /// The driver's consumer index (its register).
    ci: AtomicU32,
    /// The device's producer index (only [`Silicon::run`] moves it).
    pi: AtomicU32,
    armed: AtomicBool,
    /// The device has work waiting for room in this queue (a command whose
    /// completion, or engine events, found it full): the driver's next
    /// consumer index runs the device again. Otherwise a consumer index or
    /// an arm is a register write and nothing more, as on hardware.
    waiting: AtomicBool,
}

impl DevEq {
    /// Records that work waits for room, then looks again (the driver may
    /// have freed room meanwhile without seeing the flag): the room there
    /// is now. Paired with [`DevEq::freed`]'s fence, so that either the
    /// device sees the new consumer index or the driver sees the flag.
    fn wait_for_room(&self, room: impl Fn() -> usize) -> usize {
        self.waiting.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        room()
    }

    /// The driver moved the consumer index: whether the device has work
    /// that waited for the room.
    fn freed(&self) -> bool {
        fence(Ordering::SeqCst);
        self.waiting.swap(false, Ordering::AcqRel)
    }
}

/// A command slot as the device executes it.
#[derive(Default)]
struct DevSlot {
    out_addr: AtomicU64,
    out_len: AtomicU32,
    flags: AtomicU32,
    /// Handed to the engine, not yet completed.
    busy: AtomicBool,
}

/// Counters of the device, for tests and tools.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SiliconStats {
    /// Commands read from the command queue.
    pub commands: u64,
    /// Commands refused by the device's own checks (before the engine).
    pub commands_refused: u64,
    /// No-op commands ([`OP_NOP`]: what the driver could not send).
    pub nops: u64,
    /// Event queue entries written.
    pub eqes: u64,
    /// MSI-X messages raised.
    pub messages: u64,
    /// DMA accesses refused (the device then stops: [`STATUS_FATAL`]).
    pub dma_faults: u64,
    /// MADs taken from the send ring and sent.
    pub mads_sent: u64,
    /// Send ring entries refused (malformed, or refused by the port: a
    /// GID index it does not have); each is given back unsent.
    pub mads_refused: u64,
    /// MADs written into the receive ring.
    pub mads_received: u64,
}

/// A doorbell page of BAR 2 as the device keeps it ([`crate::uar`]).
#[derive(Default)]
struct UarPage {
    /// The engine's number for it (0: not open).
    page: AtomicU32,
    /// The last operation's result register.
    result: AtomicU64,
}

/// The GSI's MAD rings as the device sees them ([`crate::gsi`]).
#[derive(Default)]
struct DevMads {
    entries: AtomicU32,
    sq_base: AtomicU64,
    rq_base: AtomicU64,
    /// The next send entry the device reads (only [`Silicon::run`]).
    sq_ci: AtomicU32,
    /// The next receive entry the device writes (only [`Silicon::run`]).
    rq_pi: AtomicU32,
    /// The engine announced MADs the receive ring has not taken yet.
    waiting: AtomicBool,
    /// MADs went into the receive ring and no `EQE_MAD` told the driver.
    announce: AtomicBool,
    sent: AtomicU64,
    refused: AtomicU64,
    received: AtomicU64,
}

/// The device model. See the module docs.
pub struct Silicon<P: Platform, B: DeviceBus> {
    soft: Arc<SoftHca<P>>,
    /// BAR 2: the doorbell pages ([`crate::uar`]).
    uar: Shared<Region>,
    uar_pages: Vec<UarPage>,
    bus: B,
    cmdq_base: AtomicU64,
    cmdq_slots: AtomicU32,
    rung: AtomicU32,
    status: AtomicU32,
    eqs: Vec<DevEq>,
    slots: Vec<DevSlot>,
    running: AtomicBool,
    /// Out of D0 ([`Self::power`]): no DMA, no message.
    asleep: AtomicBool,
    again: AtomicBool,
    commands: AtomicU64,
    refused: AtomicU64,
    nops: AtomicU64,
    eqes: AtomicU64,
    messages: AtomicU64,
    faults: AtomicU64,
    mads: DevMads,
}

/// Events taken from the engine per batch (a small frame).
const BATCH: usize = 4;

impl<P: Platform, B: DeviceBus> Silicon<P, B> {
    /// A device over `soft` (its engine: the soft HCA's firmware and
    /// transport, which must execute commands inline), attached to `bus`.
    /// It has 1 + the engine's completion vectors event queues and as many
    /// MSI-X messages.
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES`.
    pub fn new(soft: Arc<SoftHca<P>>, bus: B) -> Result<Self, NtStatus> {
        let uar = Region::alloc(UAR_PAGES * DMA_PAGE_SIZE as usize)
            .and_then(|r| Shared::try_new(r).ok())
            .ok_or(STATUS_INSUFFICIENT_RESOURCES)?;
        let mut uar_pages = Vec::new();
        uar_pages
            .try_reserve_exact(UAR_PAGES)
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        uar_pages.resize_with(UAR_PAGES, UarPage::default);
        let n = (1 + soft.comp_event_queues() as usize).min(usize::from(MSIX_TABLE_SIZE));
        let mut eqs = Vec::new();
        eqs.try_reserve_exact(n)
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        eqs.resize_with(n, DevEq::default);
        let mut slots = Vec::new();
        slots
            .try_reserve_exact(MAX_SLOTS)
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        slots.resize_with(MAX_SLOTS, DevSlot::default);
        Ok(Self {
            soft,
            uar,
            uar_pages,
            bus,
            cmdq_base: AtomicU64::new(0),
            cmdq_slots: AtomicU32::new(0),
            rung: AtomicU32::new(0),
            status: AtomicU32::new(STATUS_READY),
            eqs,
            slots,
            running: AtomicBool::new(false),
            asleep: AtomicBool::new(false),
            again: AtomicBool::new(false),
            commands: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            nops: AtomicU64::new(0),
            eqes: AtomicU64::new(0),
            messages: AtomicU64::new(0),
            faults: AtomicU64::new(0),
            mads: DevMads::default(),
        })
    }

    /// The engine (its port, wires and counters are the device's).
    pub fn soft(&self) -> &Arc<SoftHca<P>> {
        &self.soft
    }

    /// BAR 2's memory: the doorbell pages ([`crate::uar`]), which the
    /// platform maps for the driver.
    pub fn uar_memory(&self) -> &Shared<Region> {
        &self.uar
    }

    /// The engine's number of the doorbell page at index `index` of
    /// BAR 2 (0: not open).
    pub fn uar_page(&self, index: usize) -> u32 {
        self.uar_pages
            .get(index)
            .map_or(0, |p| p.page.load(Ordering::Acquire))
    }

    /// [`REG_UAR_OPEN`]: zeroes page `index` and has the engine scan it.
    fn uar_open(&self, index: usize) {
        let Some(state) = self.uar_pages.get(index) else {
            return;
        };
        let page = DMA_PAGE_SIZE as usize;
        let opened = if state.page.load(Ordering::Acquire) != 0 {
            Err(STATUS_INVALID_PARAMETER)
        } else {
            Region::sub(self.uar.clone(), index * page, page, None)
                .and_then(|r| Shared::try_new(r).ok())
                .ok_or(STATUS_INSUFFICIENT_RESOURCES)
                .and_then(|memory| self.soft.alloc_doorbell_page_on(memory))
        };
        let value = match opened {
            Ok(info) => {
                state.page.store(info.page, Ordering::Release);
                result(info.page, STATUS_SUCCESS)
            }
            Err(status) => result(0, status),
        };
        state.result.store(value, Ordering::Release);
    }

    /// [`REG_UAR_CLOSE`]: the engine stops scanning page `index`.
    fn uar_close(&self, index: usize) {
        let Some(state) = self.uar_pages.get(index) else {
            return;
        };
        let page = state.page.swap(0, Ordering::AcqRel);
        if page != 0 {
            self.soft.free_doorbell_page(page);
        }
        state
            .result
            .store(result(0, STATUS_SUCCESS), Ordering::Release);
    }

    /// [`REG_UAR_BIND`]: binds a queue to a slot of an open page.
    fn uar_bind(&self, value: u64) {
        let Some((index, target)) = decode_bind(value) else {
            return;
        };
        let Some(state) = self.uar_pages.get(index) else {
            return;
        };
        let page = state.page.load(Ordering::Acquire);
        let bound = if page == 0 {
            Err(STATUS_INVALID_PARAMETER)
        } else {
            self.soft.bind_doorbell(page, target)
        };
        let value = match bound {
            Ok(slot) => result(slot, STATUS_SUCCESS),
            Err(status) => result(0, status),
        };
        state.result.store(value, Ordering::Release);
    }

    /// The function's power state changes (the PCI bus driver's write of
    /// its power management register; host mode:
    /// `HostPlatform::set_device_power`). Leaving D0 (`false`): the device
    /// finishes the work it is doing, then does none (no DMA, no MSI-X
    /// message) until it is back in D0; it keeps its state across D3hot
    /// (its power management capability's No_Soft_Reset), so commands
    /// rung before, events its engine queues meanwhile and MADs that
    /// arrive wait in the device. Back in D0 (`true`): it runs what
    /// waited.
    ///
    /// The engine's own clock and port keep running (the port stays up,
    /// as a device armed for wake keeps its link); what it moves through
    /// the views it holds of queues and registered memory is the one
    /// device access out of D0 the IOMMU model does not see.
    ///
    /// IRQL: PASSIVE_LEVEL.
    pub fn power(&self, d0: bool) {
        if d0 {
            self.asleep.store(false, Ordering::SeqCst);
            self.bus.kick();
        } else {
            self.asleep.store(true, Ordering::SeqCst);
            // A run in progress ends (it checks between steps).
            while self.running.load(Ordering::SeqCst) {
                core::hint::spin_loop();
            }
        }
    }

    /// Whether the device is in D0 ([`Self::power`]).
    pub fn in_d0(&self) -> bool {
        !self.asleep.load(Ordering::SeqCst)
    }

    /// A read of its PCI configuration space ([`crate::config`]).
    pub fn read_config(&self, offset: usize, width: usize) -> u32 {
        crate::config::read_config(offset, width)
    }

    /// The MSI-X messages the device needs (one per event queue).
    pub fn messages(&self) -> u16 {
        self.eqs.len() as u16
    }

    /// The bus.
    pub fn bus(&self) -> &B {
        &self.bus
    }

    /// Its status register ([`STATUS_READY`], [`STATUS_FATAL`]).
    pub fn status(&self) -> u32 {
        self.status.load(Ordering::Acquire)
    }

    /// Its counters.
    pub fn stats(&self) -> SiliconStats {
        SiliconStats {
            commands: self.commands.load(Ordering::Relaxed),
            commands_refused: self.refused.load(Ordering::Relaxed),
            nops: self.nops.load(Ordering::Relaxed),
            eqes: self.eqes.load(Ordering::Relaxed),
            messages: self.messages.load(Ordering::Relaxed),
            dma_faults: self.faults.load(Ordering::Relaxed),
            mads_sent: self.mads.sent.load(Ordering::Relaxed),
            mads_refused: self.mads.refused.load(Ordering::Relaxed),
            mads_received: self.mads.received.load(Ordering::Relaxed),
        }
    }

    // ----------------------------------------------------------- registers

    /// A register read of `width` bytes at `offset` of BAR 0 (the
    /// platform checked the offset and width).
    pub fn read(&self, offset: usize, width: usize) -> u64 {
        let _ = width;
        match offset {
            REG_VERSION => u64::from(VERSION),
            REG_STATUS => u64::from(self.status.load(Ordering::Acquire)),
            REG_CMD_SLOTS => MAX_SLOTS as u64,
            REG_EQS => self.eqs.len() as u64,
            o if o >= UAR_RESULTS => self
                .uar_pages
                .get((o - UAR_RESULTS) / 8)
                .map_or(0, |p| p.result.load(Ordering::Acquire)),
            _ => 0,
        }
    }

    /// A register write of `width` bytes at `offset` of BAR 0. Queue
    /// doorbells run the engine's data path now (as the soft HCA's
    /// doorbells do); everything else records the write and schedules
    /// [`Self::run`].
    pub fn write(&self, offset: usize, width: usize, value: u64) {
        let _ = width;
        match offset {
            REG_CMDQ_BASE => self.cmdq_base.store(value, Ordering::Release),
            REG_CMDQ_SLOTS => self
                .cmdq_slots
                .store((value as u32).min(MAX_SLOTS as u32), Ordering::Release),
            REG_CMD_DOORBELL => {
                self.rung.fetch_or(value as u32, Ordering::AcqRel);
                self.bus.kick();
            }
            REG_QUEUE_DOORBELL => {
                let number = value as u32;
                match value >> 32 {
                    DB_SQ => self.soft.sq_doorbell(number),
                    DB_RQ => self.soft.rq_doorbell(number),
                    DB_SRQ => self.soft.srq_doorbell(number),
                    DB_CQ_ARM => self.soft.cq_arm_doorbell(number),
                    _ => {}
                }
            }
            REG_RESET if value == 1 => {
                // Registered memory is forgotten: the engine drops its
                // MRs' views and queued commands; the MAD rings are no
                // longer the device's.
                self.soft.device_removed();
                self.mads.sq_base.store(0, Ordering::Release);
                self.mads.rq_base.store(0, Ordering::Release);
            }
            REG_MAD_ENTRIES => self
                .mads
                .entries
                .store((value as u32).min(MAX_MAD_RING_ENTRIES), Ordering::Release),
            REG_MAD_SQ_BASE => {
                self.mads.sq_ci.store(0, Ordering::Release);
                self.mads.sq_base.store(value, Ordering::Release);
            }
            REG_MAD_RQ_BASE => {
                self.mads.rq_pi.store(0, Ordering::Release);
                self.mads.rq_base.store(value, Ordering::Release);
                self.bus.kick();
            }
            REG_MAD_SQ_DOORBELL | REG_MAD_RQ_DOORBELL => self.bus.kick(),
            REG_UAR_OPEN => self.uar_open(value as usize),
            REG_UAR_CLOSE => self.uar_close(value as usize),
            REG_UAR_BIND => self.uar_bind(value),
            REG_UAR_RUNG => {
                let _ = self.soft.ring_doorbell_pages();
            }
            o if o >= UAR_RESULTS => {}
            o if o >= EQ_REGS => {
                let (n, reg) = ((o - EQ_REGS) / EQ_REGS_LEN, (o - EQ_REGS) % EQ_REGS_LEN);
                let Some(eq) = self.eqs.get(n) else { return };
                match reg {
                    EQ_BASE => {
                        eq.pi.store(0, Ordering::Release);
                        eq.ci.store(0, Ordering::Release);
                        eq.base.store(value, Ordering::Release);
                    }
                    EQ_ENTRIES => eq.entries.store(value as u32, Ordering::Release),
                    // The consumer index runs the device only when work
                    // waited for the room it frees.
                    EQ_CI => {
                        eq.ci.store(value as u32, Ordering::SeqCst);
                        if eq.freed() {
                            self.bus.kick();
                        }
                    }
                    // Armed: the next entry raises the message. Entries
                    // the driver has not taken yet (or work waiting for
                    // room) run the device, which raises it now.
                    EQ_ARM => {
                        eq.ci.store(value as u32, Ordering::SeqCst);
                        eq.armed.store(true, Ordering::SeqCst);
                        let waiting = eq.freed();
                        if waiting || eq.pi.load(Ordering::SeqCst) != value as u32 {
                            self.bus.kick();
                        }
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }

    // ----------------------------------------------------------------- work

    /// The device's work: executes the commands rung, moves the engine's
    /// events into the event queues in host memory, raises the messages
    /// of armed queues with entries. Runs one at a time (a call while one
    /// runs makes that one go again).
    ///
    /// IRQL: DISPATCH_LEVEL (host mode: its DPC), no driver lock held.
    pub fn run(&self) {
        if self.running.swap(true, Ordering::AcqRel) {
            self.again.store(true, Ordering::Release);
            return;
        }
        loop {
            self.again.store(false, Ordering::Release);
            if self.asleep.load(Ordering::SeqCst) {
                // Out of D0: the work waits for D0 ([`Self::power`] runs
                // the device again).
                self.running.store(false, Ordering::SeqCst);
                break;
            }
            if self.status.load(Ordering::Acquire) & STATUS_FATAL == 0
                && let Err(_status) = self.step()
            {
                self.faults.fetch_add(1, Ordering::Relaxed);
                self.status.fetch_or(STATUS_FATAL, Ordering::AcqRel);
            }
            self.running.store(false, Ordering::Release);
            if !self.again.load(Ordering::Acquire) || self.running.swap(true, Ordering::AcqRel) {
                break;
            }
        }
    }

    fn step(&self) -> Result<(), NtStatus> {
        self.execute_commands()?;
        self.send_mads()?;
        self.drain(0)?;
        self.receive_mads()?;
        for v in 1..self.eqs.len() {
            self.drain(v)?;
        }
        // Paired with an arm's: either this run sees the queue armed, or
        // the arm sees the entries written.
        fence(Ordering::SeqCst);
        for (n, eq) in self.eqs.iter().enumerate() {
            if eq.armed.load(Ordering::Acquire)
                && eq.pi.load(Ordering::Acquire) != eq.ci.load(Ordering::Acquire)
                && eq.armed.swap(false, Ordering::AcqRel)
            {
                self.messages.fetch_add(1, Ordering::Relaxed);
                self.bus.raise_msix(n as u16);
            }
        }
        Ok(())
    }

    fn slot_base(&self, slot: usize) -> LogicalAddress {
        self.cmdq_base.load(Ordering::Acquire) + (slot * SLOT_SIZE) as u64
    }

    fn execute_commands(&self) -> Result<(), NtStatus> {
        let mut pending = self.rung.swap(0, Ordering::AcqRel);
        let slots = self.cmdq_slots.load(Ordering::Acquire) as usize;
        while pending != 0 {
            let slot = pending.trailing_zeros() as usize;
            pending &= pending - 1;
            if slot >= slots || self.cmdq_base.load(Ordering::Acquire) == 0 {
                continue;
            }
            if !self.execute_slot(slot)? {
                // No room in EQ 0 or the engine's queue: the rest waits
                // for the driver to take events (its consumer index
                // kicks).
                self.rung.fetch_or((1 << slot) | pending, Ordering::AcqRel);
                break;
            }
        }
        Ok(())
    }

    /// Reads slot `slot` and hands its command to the engine (or completes
    /// it with the status of what is wrong with it). False when the engine
    /// had no room (nothing changed).
    fn execute_slot(&self, slot: usize) -> Result<bool, NtStatus> {
        let base = self.slot_base(slot);
        let mut h = [0u8; HEADER_LEN];
        self.bus.dma_read(base, &mut h)?;
        let mut r = Reader::new(&h);
        let opcode = r.u32()?;
        let in_len = r.u32()? as usize;
        let in_addr = r.u64()?;
        let out_addr = r.u64()?;
        let out_len = r.u32()?;
        let owner =
            u32::from_le_bytes([h[H_OWNER], h[H_OWNER + 1], h[H_OWNER + 2], h[H_OWNER + 3]]);
        let flags =
            u32::from_le_bytes([h[H_FLAGS], h[H_FLAGS + 1], h[H_FLAGS + 2], h[H_FLAGS + 3]]);
        let state = &self.slots[slot];
        if owner != OWNER_DEVICE || state.busy.load(Ordering::Acquire) {
            // A doorbell for a slot not handed over, or one executing.
            return Ok(true);
        }
        if flags & FLAG_POLLED == 0
            && self.room(0) == 0
            && self.eqs[0].wait_for_room(|| self.room(0)) == 0
        {
            // No room for its completion: the driver's consumer index
            // kicks the device again.
            return Ok(false);
        }
        self.commands.fetch_add(1, Ordering::Relaxed);
        state.out_addr.store(out_addr, Ordering::Release);
        state.out_len.store(out_len, Ordering::Release);
        state.flags.store(flags, Ordering::Release);
        state.busy.store(true, Ordering::Release);
        if in_len > FIXED_LEN {
            return self.refuse(slot, STATUS_INVALID_PARAMETER);
        }
        let mut input = [0u8; FIXED_LEN];
        if in_len > 0 {
            self.bus.dma_read(in_addr, &mut input[..in_len])?;
        }
        if opcode == OP_QUERY_DEVICE {
            if in_len != 0 {
                return self.refuse(slot, STATUS_INVALID_PARAMETER);
            }
            let caps: IvQueryDeviceOut = *self.soft.caps();
            self.complete_bytes(slot, STATUS_SUCCESS, caps.as_bytes())?;
            return Ok(true);
        }
        if opcode == OP_NOP {
            if in_len != 0 {
                return self.refuse(slot, STATUS_INVALID_PARAMETER);
            }
            self.nops.fetch_add(1, Ordering::Relaxed);
            self.complete_bytes(slot, STATUS_SUCCESS, &[])?;
            return Ok(true);
        }
        let command = match decode_command(opcode, &input[..in_len]) {
            Ok(Parsed::Command(c)) => c,
            Ok(Parsed::OnQueues(command, queues)) => {
                let rings = match self.queue_views(queues)? {
                    Ok(rings) => rings,
                    Err(status) => return self.refuse(slot, status),
                };
                return match self.soft.post_command_on_rings(slot as u64, command, rings) {
                    Ok(()) => Ok(true),
                    Err(_) => {
                        // The engine had no room: the views are let go of,
                        // and the command is read again later.
                        state.busy.store(false, Ordering::Release);
                        Ok(false)
                    }
                };
            }
            Ok(Parsed::RegMr {
                pdn,
                access,
                addr,
                length,
                physical,
                mtt,
            }) => match self.registration(mtt, length, access)? {
                Ok(region) => Command::RegMr(RegMr {
                    pdn,
                    addr,
                    length,
                    access,
                    physical,
                    region,
                }),
                Err(status) => return self.refuse(slot, status),
            },
            Err(status) => return self.refuse(slot, status),
        };
        match self.soft.post_command(slot as u64, command) {
            Ok(()) => Ok(true),
            Err(_) => {
                // A registration's view is let go of with the command,
                // which is read again later.
                state.busy.store(false, Ordering::Release);
                Ok(false)
            }
        }
    }

    fn refuse(&self, slot: usize, status: NtStatus) -> Result<bool, NtStatus> {
        self.refused.fetch_add(1, Ordering::Relaxed);
        self.complete_bytes(slot, status, &[])?;
        Ok(true)
    }

    /// A registration's memory: the device's view of `length` bytes from
    /// `mtt.first_offset` into the first of the `mtt.entries` pages its
    /// page table lists (read by DMA at `mtt.address`), which must be as
    /// many as those bytes touch, for writing too when `access` grants
    /// local write. The platform checks every page (a page list naming
    /// memory not mapped for the device faults) and counts the view until
    /// the engine lets go of the MR.
    ///
    /// `Ok(Err(status))`: the command is refused; `Err`: a DMA fault.
    fn registration(
        &self,
        mtt: Mtt,
        length: u64,
        access: u32,
    ) -> Result<Result<Shared<Region>, NtStatus>, NtStatus> {
        if length == 0
            || u64::from(mtt.first_offset) >= DMA_PAGE_SIZE
            || u64::from(mtt.entries) != pages_spanned(u64::from(mtt.first_offset), length)
        {
            return Ok(Err(STATUS_INVALID_PARAMETER));
        }
        let Ok(len) = usize::try_from(length) else {
            return Ok(Err(STATUS_INVALID_PARAMETER));
        };
        let write = access & IV_ACCESS_LOCAL_WRITE != 0;
        self.view(mtt.address, mtt.first_offset as usize, len, write)
    }

    /// The views of a create's rings ([`QueueMtt`]): each ring's pages,
    /// read by DMA from the page list, for reading and writing. A ring of
    /// no pages is not given.
    ///
    /// `Ok(Err(status))`: the command is refused; `Err`: a DMA fault.
    #[allow(clippy::type_complexity, reason = "a refusal inside a fault")]
    fn queue_views(
        &self,
        queues: QueueMtt,
    ) -> Result<Result<[Option<Shared<Region>>; 2], NtStatus>, NtStatus> {
        let [first, second] = queues.pages;
        if first as usize + second as usize > MAX_MTT {
            return Ok(Err(STATUS_INVALID_PARAMETER));
        }
        let mut rings: [Option<Shared<Region>>; 2] = [None, None];
        let mut at = queues.address;
        for (ring, pages) in rings.iter_mut().zip([first, second]) {
            if pages == 0 {
                continue;
            }
            let len = pages as usize * DMA_PAGE_SIZE as usize;
            match self.view(at, 0, len, true)? {
                Ok(view) => *ring = Some(view),
                Err(status) => return Ok(Err(status)),
            }
            at += u64::from(pages) * 8;
        }
        Ok(Ok(rings))
    }

    /// The view of `len` bytes from `first_offset` into the pages listed
    /// at `list` (each entry read by DMA).
    ///
    /// `Ok(Err(status))`: refused; `Err`: a DMA fault.
    fn view(
        &self,
        list: LogicalAddress,
        first_offset: usize,
        len: usize,
        write: bool,
    ) -> Result<Result<Shared<Region>, NtStatus>, NtStatus> {
        let mut fault = None;
        let mut next_page = |i: usize| {
            let mut entry = [0u8; 8];
            self.bus
                .dma_read(list + i as u64 * 8, &mut entry)
                .inspect_err(|&e| fault = Some(e))?;
            Ok(u64::from_le_bytes(entry))
        };
        let view = self.bus.dma_view(first_offset, len, write, &mut next_page);
        match (view, fault) {
            (_, Some(e)) => Err(e),
            (Ok(view), None) => Ok(Ok(view)),
            // A list that is not one piece of mapped memory.
            (Err(STATUS_INVALID_PARAMETER), None) => Ok(Err(STATUS_INVALID_PARAMETER)),
            (Err(e), None) => Err(e),
        }
    }

    /// Writes slot `slot`'s output (if it fits its mailbox), status and
    /// owner word by DMA, and its completion entry (unless polled).
    fn complete_bytes(&self, slot: usize, status: NtStatus, out: &[u8]) -> Result<(), NtStatus> {
        let state = &self.slots[slot];
        let (status, n) = if status == STATUS_SUCCESS
            && out.len() > state.out_len.load(Ordering::Acquire) as usize
        {
            (STATUS_BUFFER_TOO_SMALL, 0)
        } else {
            (status, out.len())
        };
        if n > 0 {
            self.bus
                .dma_write(state.out_addr.load(Ordering::Acquire), &out[..n])?;
        }
        let base = self.slot_base(slot);
        let mut done = [0u8; 8];
        done[..4].copy_from_slice(&status.to_le_bytes());
        done[4..].copy_from_slice(&(n as u32).to_le_bytes());
        self.bus.dma_write(base + H_STATUS as u64, &done)?;
        self.bus
            .dma_write(base + H_OWNER as u64, &OWNER_DRIVER.to_le_bytes())?;
        state.busy.store(false, Ordering::Release);
        if state.flags.load(Ordering::Acquire) & FLAG_POLLED == 0 {
            self.post_eqe(0, EQE_COMMAND, 0, slot as u32)?;
        }
        Ok(())
    }

    /// Room left in event queue `n`.
    fn room(&self, n: usize) -> usize {
        let eq = &self.eqs[n];
        let entries = eq.entries.load(Ordering::Acquire);
        if eq.base.load(Ordering::Acquire) == 0 || entries == 0 {
            return 0;
        }
        let used = eq
            .pi
            .load(Ordering::Acquire)
            .wrapping_sub(eq.ci.load(Ordering::Acquire));
        entries.saturating_sub(used) as usize
    }

    /// Writes an entry into event queue `n` (the caller checked its room;
    /// a full queue drops it and counts a fault).
    fn post_eqe(&self, n: usize, kind: u8, sub: u8, arg: u32) -> Result<(), NtStatus> {
        if self.room(n) == 0 {
            return Err(STATUS_INSUFFICIENT_RESOURCES);
        }
        let eq = &self.eqs[n];
        let (pi, entries) = (
            eq.pi.load(Ordering::Acquire),
            eq.entries.load(Ordering::Acquire),
        );
        let at = eq.base.load(Ordering::Acquire) + u64::from(pi % entries) * EQE_LEN as u64;
        let entry = eqe(kind, sub, arg, eqe_owner(pi, entries));
        // The body, then the owner word: the driver sees a whole entry.
        self.bus.dma_write(at, &entry[..E_OWNER])?;
        self.bus.dma_write(at + E_OWNER as u64, &entry[E_OWNER..])?;
        eq.pi.store(pi.wrapping_add(1), Ordering::Release);
        self.eqes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Moves the engine's events of event queue `n` (0: async; `1 + v`:
    /// completion vector `v`) into the host's, as far as it has room;
    /// re-arms the engine's queue once it is empty.
    fn drain(&self, n: usize) -> Result<(), NtStatus> {
        loop {
            // A command completion needs its slot's entry: keep room for
            // every slot that may complete on EQ 0.
            let mut room = self.room(n);
            if room == 0 {
                // The engine's events wait in the engine until the driver
                // frees entries.
                room = self.eqs[n].wait_for_room(|| self.room(n));
                if room == 0 {
                    return Ok(());
                }
            }
            let want = room.min(BATCH);
            let mut events: [Option<Event>; BATCH] = Default::default();
            let got = if n == 0 {
                self.soft.poll_events(&mut events[..want])
            } else {
                self.soft
                    .poll_comp_events(n as u32 - 1, &mut events[..want])
            };
            for e in events.iter_mut().take(got) {
                if let Some(e) = e.take() {
                    self.deliver(n, e)?;
                }
            }
            if got < want {
                if n == 0 {
                    self.soft.arm_event_queue();
                } else {
                    self.soft.arm_comp_event_queue(n as u32 - 1);
                }
                return Ok(());
            }
        }
    }

    fn deliver(&self, n: usize, event: Event) -> Result<(), NtStatus> {
        match event {
            Event::CommandDone { token, status, out } => {
                let slot = token as usize;
                if slot >= MAX_SLOTS {
                    return Ok(());
                }
                let mut buf = [0u8; FIXED_LEN];
                let len = if status == STATUS_SUCCESS {
                    encode_output(&out, &mut buf)?
                } else {
                    0
                };
                // The engine's rings are views of the driver's memory:
                // let go of before the driver learns the command is done.
                drop(out);
                self.complete_bytes(slot, status, &buf[..len])
            }
            Event::Completion { cqn } => self.post_eqe(n, EQE_COMPLETION, 0, cqn),
            Event::Async(a) => {
                let (sub, arg) = encode_async(a);
                self.post_eqe(n, EQE_ASYNC, sub, arg)
            }
            // The MADs move into the receive ring after the batch
            // ([`Self::receive_mads`]).
            Event::Mad => {
                self.mads.waiting.store(true, Ordering::Release);
                Ok(())
            }
        }
    }

    /// The address of entry `index` of the MAD ring at `base`.
    fn mad_entry(&self, base: LogicalAddress, index: u32) -> LogicalAddress {
        let entries = self.mads.entries.load(Ordering::Acquire).max(1);
        base + u64::from(index % entries) * MAD_ENTRY_LEN as u64
    }

    /// Sends the send ring's full entries, in order, and gives each back;
    /// at most one lap per run.
    fn send_mads(&self) -> Result<(), NtStatus> {
        let m = &self.mads;
        for _ in 0..m.entries.load(Ordering::Acquire) {
            let base = m.sq_base.load(Ordering::Acquire);
            if base == 0 {
                return Ok(());
            }
            let ci = m.sq_ci.load(Ordering::Acquire);
            let at = self.mad_entry(base, ci);
            let mut entry = [0u8; MAD_ENTRY_LEN];
            self.bus.dma_read(at, &mut entry)?;
            if owner(&entry) != MAD_FULL {
                return Ok(());
            }
            // Untrusted bytes: a bad entry, or one the port refuses, is
            // given back unsent.
            match decode_send(&entry).and_then(|mad| self.soft.send_mad(&mad)) {
                Ok(()) => m.sent.fetch_add(1, Ordering::Relaxed),
                Err(_) => m.refused.fetch_add(1, Ordering::Relaxed),
            };
            self.bus
                .dma_write(at + M_OWNER as u64, &MAD_FREE.to_le_bytes())?;
            m.sq_ci.store(ci.wrapping_add(1), Ordering::Release);
        }
        Ok(())
    }

    /// Moves the MADs the engine received into the receive ring's free
    /// entries; what finds no room waits for the driver to give entries
    /// back. One `EQE_MAD` on EQ 0 announces them.
    fn receive_mads(&self) -> Result<(), NtStatus> {
        let m = &self.mads;
        for _ in 0..m.entries.load(Ordering::Acquire) {
            let base = m.rq_base.load(Ordering::Acquire);
            if base == 0 || !m.waiting.load(Ordering::Acquire) {
                break;
            }
            let pi = m.rq_pi.load(Ordering::Acquire);
            let at = self.mad_entry(base, pi);
            let mut word = [0u8; 4];
            self.bus.dma_read(at + M_OWNER as u64, &mut word)?;
            if u32::from_le_bytes(word) != MAD_FREE {
                break;
            }
            let Some(mad) = self.soft.poll_mad() else {
                m.waiting.store(false, Ordering::Release);
                break;
            };
            let entry = encode_receive(&mad);
            // The header and the MAD, then the owner word.
            self.bus.dma_write(at, &entry[..M_OWNER])?;
            self.bus
                .dma_write(at + MAD_HEADER_LEN as u64, &entry[MAD_HEADER_LEN..])?;
            self.bus
                .dma_write(at + M_OWNER as u64, &entry[M_OWNER..MAD_HEADER_LEN])?;
            m.rq_pi.store(pi.wrapping_add(1), Ordering::Release);
            m.received.fetch_add(1, Ordering::Relaxed);
            m.announce.store(true, Ordering::Release);
        }
        if m.announce.load(Ordering::Acquire) && self.room(0) > 0 {
            m.announce.store(false, Ordering::Release);
            self.post_eqe(0, EQE_MAD, 0, 0)?;
        }
        Ok(())
    }
}
