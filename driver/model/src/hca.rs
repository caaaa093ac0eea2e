//! The model HCA's mini-driver: an [`Hca`] that reaches its device only
//! through [`PciPlatform`] — BAR 0's registers, common buffers for the
//! command queue and the event queues, scatter/gather mappings for
//! registered memory and for the work queues' and CQs' rings (their page
//! lists go to the device in the command's input mailbox), and one MSI-X
//! message per event queue.
//! The protocol is [`crate::protocol`]'s; docs/hardware-seam.md walks
//! through it.
//!
//! Kernel rules: everything is allocated at [`ModelHca::start`]
//! (PASSIVE_LEVEL) but what a command needs for its object (a mapping, a
//! queue's ring, a query's output box), taken fallibly when it is posted
//! (at DISPATCH_LEVEL: a ring is pool memory mapped for the device, as a
//! registration's is, since a common buffer is allocated at PASSIVE_LEVEL
//! only); a failure there
//! completes the command with the status through the device (a no-op
//! command in its slot), like any other completion. Event processing
//! allocates nothing; each call takes at most what its caller's batch
//! holds.

use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use alloc::boxed::Box;
use alloc::vec::Vec;
use irpverbs_abi::{
    IV_ACCESS_LOCAL_WRITE, IvCqe, IvQpCap, IvQueryDeviceOut, IvQueryPortOut, IvQueryQpOut,
    IvQuerySrqOut, NtStatus, STATUS_DEVICE_HARDWARE_ERROR, STATUS_INSUFFICIENT_RESOURCES,
    STATUS_INVALID_DEVICE_STATE, STATUS_INVALID_PARAMETER, STATUS_IO_TIMEOUT, STATUS_NOT_SUPPORTED,
    STATUS_SUCCESS,
};
use irpverbs_core::Hca;
use irpverbs_core::hca::{
    Command, CommandOut, CreateCq, DoorbellPageInfo, DoorbellTarget, Event, MadIn, MadOut,
};
use irpverbs_core::platform::{
    Bar, CommonBuffer, DMA_PAGE_SIZE, DmaDirection, DmaMapping, EQ_LOCK, HCA_LOCK, LockClass,
    LogicalAddress, PciPlatform, SgElement, SpinLock,
};
use irpverbs_ring::wq::{recv_stride, send_stride};
use irpverbs_ring::{Region, Ring, Shared};

use crate::gsi::*;
use crate::protocol::*;
use crate::uar::*;

/// Entries of the async event queue (EQ 0).
pub const ASYNC_EQ_ENTRIES: u32 = 256;
/// Entries of each completion vector's event queue.
pub const COMP_EQ_ENTRIES: u32 = 256;
/// Command slots the mini-driver uses.
pub const SLOTS: usize = 16;
/// Register reads a polled command waits at most.
const POLL_SPINS: u32 = 1_000_000;

/// The MAD rings' lock: taken by `send_mad` with no lock held and by
/// `poll_mad` under the device's lock; a leaf.
pub static MAD_LOCK: LockClass = LockClass {
    name: "irpverbs.model.mads",
    rank: 22,
};

/// The doorbell pages' index table's lock: taken with no lock held or
/// under the device's lock (`bind_doorbell`), never across a register
/// access; a leaf.
pub static UAR_LOCK: LockClass = LockClass {
    name: "irpverbs.model.uar",
    rank: 25,
};

/// An index of BAR 2 being opened or closed.
const UAR_OPENING: u32 = u32::MAX;
/// An index of BAR 2 freed while the device was out of D0: the device
/// closes it at [`ModelHca::resume`].
const UAR_CLOSE_AT_D0: u32 = u32::MAX - 1;

/// A doorbell of a queue rung while the device was out of D0
/// ([`LiveQueue::missed`]), rung at [`ModelHca::resume`].
const MISSED_SQ: u8 = 1;
const MISSED_RQ: u8 = 2;
const MISSED_SRQ: u8 = 4;
const MISSED_CQ_ARM: u8 = 8;

/// The GSI's MAD rings ([`crate::gsi`]) in one common buffer: the send
/// ring, then the receive ring, and the driver's indices.
struct MadRings<C> {
    buf: C,
    /// The send ring's producer index.
    sq_pi: u32,
    /// The receive ring's consumer index.
    rq_ci: u32,
}

/// Bytes of one MAD ring.
const MAD_RING_LEN: usize = MAD_RING_ENTRIES as usize * MAD_ENTRY_LEN;

/// An event queue in a common buffer, and the driver's consumer index.
struct EventQueue<C> {
    buf: C,
    entries: u32,
    ci: u32,
}

impl<C: CommonBuffer> EventQueue<C> {
    /// The entry at the consumer index, if the device wrote it: kind,
    /// async type, argument.
    fn next(&mut self) -> Option<(u8, u8, u32)> {
        let off = (self.ci % self.entries) as usize * EQE_LEN;
        let region = self.buf.region();
        let owner = region
            .atomic_u32(off + E_OWNER)
            .ok()?
            .load(Ordering::Acquire);
        if owner != eqe_owner(self.ci, self.entries) {
            return None;
        }
        let mut body = [0u8; E_OWNER];
        region.read(off, &mut body).ok()?;
        self.ci = self.ci.wrapping_add(1);
        let arg = u32::from_le_bytes([
            body[E_ARG],
            body[E_ARG + 1],
            body[E_ARG + 2],
            body[E_ARG + 3],
        ]);
        Some((body[E_KIND], body[E_SUB], arg))
    }
}

/// A ring the driver allocated for a queue and its mapping for the device.
type QueueMemory<M> = (Shared<Region>, M);

/// The rings of one create: the first (a CQ's, an SRQ's, a QP's send
/// queue), the second (a QP's receive queue).
type QueueRings<M> = [Option<QueueMemory<M>>; 2];

/// A command slot.
enum Slot<M> {
    Free,
    Posted {
        token: u64,
        opcode: u32,
        /// What the driver found wrong before the device (a no-op was
        /// posted in its place).
        failed: Option<NtStatus>,
        /// A registration's mapping, until its completion.
        mapping: Option<M>,
        /// A create's rings, until its completion.
        queues: QueueRings<M>,
        /// A deregistration's key, a destroyed queue's or a resized CQ's
        /// number.
        number: u32,
        /// A QP query's output, allocated when posted.
        attr: Option<Box<IvQueryQpOut>>,
    },
}

/// The kinds of object whose rings the driver keeps.
#[derive(Clone, Copy, PartialEq, Eq)]
enum QueueKind {
    Cq,
    Srq,
    Qp,
}

/// A live queue's rings' mappings, until the device let go of them (its
/// destroy, or the resize that moves a CQ, completed).
struct LiveQueue<M> {
    kind: QueueKind,
    number: u32,
    mappings: [Option<M>; 2],
    /// Its doorbells rung out of D0 (`MISSED_*` bits).
    missed: u8,
}

/// The command queue, EQ 0 and the registrations' mappings (under
/// [`HCA_LOCK`]).
struct Commands<P: PciPlatform> {
    cmdq: Option<P::CommonBuffer>,
    eq: Option<EventQueue<P::CommonBuffer>>,
    slots: Vec<Slot<P::DmaMapping>>,
    /// Live registrations' mappings by lkey (room reserved when posted).
    mrs: Vec<(u32, P::DmaMapping)>,
    regs_in_flight: usize,
    /// Live queues' rings' mappings (room reserved when posted).
    queues: Vec<LiveQueue<P::DmaMapping>>,
    creates_in_flight: usize,
    /// In D0 ([`ModelHca::suspend`], [`ModelHca::resume`]).
    powered: bool,
}

/// The model HCA's mini-driver. See the module docs.
pub struct ModelHca<P: PciPlatform + Clone> {
    platform: P,
    caps: IvQueryDeviceOut,
    bar: P::Bar,
    cmdq_la: LogicalAddress,
    cmd: P::Lock<Commands<P>>,
    comp: Vec<P::Lock<Option<EventQueue<P::CommonBuffer>>>>,
    /// BAR 2, the doorbell pages ([`crate::uar`]), if the device has it.
    uar: Option<P::Bar>,
    /// The engine's page number at each index of BAR 2 (0: free,
    /// [`UAR_OPENING`]: being opened or closed).
    uars: P::Lock<Vec<u32>>,
    interrupts: Vec<AtomicU64>,
    mads: P::Lock<Option<MadRings<P::CommonBuffer>>>,
    /// Out of D0 ([`Self::suspend`] until [`Self::resume`]): no register
    /// access.
    asleep: AtomicBool,
    /// Register accesses in progress that checked [`Self::asleep`]
    /// ([`Self::awake`]): `suspend` waits for them.
    accessing: AtomicU32,
    /// `ring_doorbell_pages` asked for out of D0.
    missed_pages: AtomicBool,
    /// A MAD queued on the send ring out of D0 (its doorbell waits).
    missed_mad: AtomicBool,
    /// [`Self::release`] ran.
    released: AtomicBool,
}

/// Writes `len` bytes of `v` little-endian into `region` at `at`.
fn put(region: &Region, at: usize, v: &[u8]) -> Result<(), NtStatus> {
    region.write(at, v).map_err(|_| STATUS_INVALID_PARAMETER)
}

fn get_u32(region: &Region, at: usize) -> u32 {
    region
        .atomic_u32(at)
        .map_or(u32::MAX, |w| w.load(Ordering::Acquire))
}

impl<P: PciPlatform + Clone> ModelHca<P> {
    /// Starts the device (`EvtDevicePrepareHardware`): maps BAR 0, checks
    /// the interface version, allocates the command queue and hands it to
    /// the device, reads the device's attributes with a polled command,
    /// allocates EQ 0 and one EQ per completion vector (as many as MSI-X
    /// messages allow) and programs them. The caller then connects one
    /// interrupt per event queue (message `n` for EQ `n`, [`Self::isr`]
    /// and the device's DPCs) and arms them.
    ///
    /// IRQL: PASSIVE_LEVEL.
    ///
    /// # Errors
    /// `STATUS_NOT_SUPPORTED` for another interface version or no MSI-X
    /// message; `STATUS_IO_TIMEOUT` when the device does not answer;
    /// the platform's errors (`STATUS_INSUFFICIENT_RESOURCES`). Nothing is
    /// left allocated.
    pub fn start(platform: P) -> Result<Self, NtStatus> {
        let bar = platform.map_bar(0)?;
        if bar.read32(REG_VERSION)? != VERSION || platform.msix_messages() == 0 {
            return Err(STATUS_NOT_SUPPORTED);
        }
        let slots = SLOTS.min(bar.read32(REG_CMD_SLOTS)? as usize);
        let eqs = (bar.read32(REG_EQS)? as usize)
            .min(usize::from(platform.msix_messages()))
            .min(MAX_EQS);
        if slots == 0 || eqs == 0 {
            return Err(STATUS_NOT_SUPPORTED);
        }
        let cmdq = platform.alloc_common_buffer(slots * SLOT_SIZE)?;
        let cmdq_la = cmdq.logical_address();
        bar.write64(REG_CMDQ_BASE, cmdq_la)?;
        bar.write32(REG_CMDQ_SLOTS, slots as u32)?;
        let mut caps_bytes = [0u8; FIXED_LEN];
        let n = polled(&bar, &cmdq, OP_QUERY_DEVICE, &mut caps_bytes)?;
        let mut caps: IvQueryDeviceOut =
            read_exact(&caps_bytes[..n]).map_err(|_| STATUS_DEVICE_HARDWARE_ERROR)?;
        caps.num_comp_vectors = caps.num_comp_vectors.min(eqs as u32 - 1);
        // A registration's page list travels in its command's mailbox: no
        // larger region than it can describe, wherever it starts in its
        // first page.
        caps.max_mr_size = caps.max_mr_size.min((MAX_MTT as u64 - 1) * DMA_PAGE_SIZE);
        let eq = event_queue(&platform, &bar, 0, ASYNC_EQ_ENTRIES)?;
        let mut comp = Vec::new();
        comp.try_reserve_exact(caps.num_comp_vectors as usize)
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        for v in 0..caps.num_comp_vectors as usize {
            let q = event_queue(&platform, &bar, v + 1, COMP_EQ_ENTRIES)?;
            comp.push(platform.new_lock(&EQ_LOCK, Some(q)));
        }
        let mut slot_vec = Vec::new();
        slot_vec
            .try_reserve_exact(slots)
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        slot_vec.resize_with(slots, || Slot::Free);
        let mut interrupts = Vec::new();
        interrupts
            .try_reserve_exact(1 + comp.len())
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        interrupts.resize_with(1 + comp.len(), AtomicU64::default);
        // BAR 2: the doorbell pages, if the device has them (and the
        // platform can map them into processes).
        let uar = platform
            .map_bar(UAR_BAR)
            .ok()
            .filter(|b| b.pages().is_some_and(|p| p.len() >= DMA_PAGE_SIZE as usize));
        let count = uar
            .as_ref()
            .and_then(Bar::pages)
            .map_or(0, |p| (p.len() / DMA_PAGE_SIZE as usize).min(UAR_PAGES));
        let mut indices = Vec::new();
        indices
            .try_reserve_exact(count)
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        indices.resize(count, 0u32);
        let uars = platform.new_lock(&UAR_LOCK, indices);
        let mad_buf = platform.alloc_common_buffer(2 * MAD_RING_LEN)?;
        let cmd = platform.new_lock(
            &HCA_LOCK,
            Commands {
                cmdq: Some(cmdq),
                eq: Some(eq),
                slots: slot_vec,
                mrs: Vec::new(),
                regs_in_flight: 0,
                queues: Vec::new(),
                creates_in_flight: 0,
                powered: true,
            },
        );
        // The MAD rings last: once the device has them, a MAD arriving
        // is written into the receive ring.
        let mads_la = mad_buf.logical_address();
        bar.write32(REG_MAD_ENTRIES, MAD_RING_ENTRIES)?;
        bar.write64(REG_MAD_SQ_BASE, mads_la)?;
        if let Err(status) = bar.write64(REG_MAD_RQ_BASE, mads_la + MAD_RING_LEN as u64) {
            let _ = bar.write64(REG_MAD_SQ_BASE, 0);
            return Err(status);
        }
        let mads = platform.new_lock(
            &MAD_LOCK,
            Some(MadRings {
                buf: mad_buf,
                sq_pi: 0,
                rq_ci: 0,
            }),
        );
        Ok(Self {
            platform,
            caps,
            bar,
            cmdq_la,
            cmd,
            comp,
            uar,
            uars,
            interrupts,
            mads,
            asleep: AtomicBool::new(false),
            accessing: AtomicU32::new(0),
            missed_pages: AtomicBool::new(false),
            missed_mad: AtomicBool::new(false),
            released: AtomicBool::new(false),
        })
    }

    /// Runs `access` (register accesses) if the device is in D0; `None`
    /// out of D0. [`Self::suspend`] waits for the accesses that found it
    /// in D0.
    ///
    /// IRQL: any (no lock of its own).
    #[inline]
    fn awake<R>(&self, access: impl FnOnce() -> R) -> Option<R> {
        self.awake_with((), |()| access()).ok()
    }

    /// [`Self::awake`] with `value` handed to `access`, or given back out
    /// of D0.
    #[inline]
    fn awake_with<T, R>(&self, value: T, access: impl FnOnce(T) -> R) -> Result<R, T> {
        self.accessing.fetch_add(1, Ordering::SeqCst);
        let r = if self.asleep.load(Ordering::SeqCst) {
            Err(value)
        } else {
            Ok(access(value))
        };
        self.accessing.fetch_sub(1, Ordering::Release);
        r
    }

    /// A queue doorbell: a register write in D0; out of D0 it is
    /// remembered on the queue and rung at [`Self::resume`].
    #[inline]
    fn queue_doorbell(&self, kind: u64, number: u32) {
        let value = (kind << 32) | u64::from(number);
        if self
            .awake(|| self.bar.write64(REG_QUEUE_DOORBELL, value))
            .is_none()
        {
            self.doorbell_out_of_d0(kind, number);
        }
    }

    #[cold]
    fn doorbell_out_of_d0(&self, kind: u64, number: u32) {
        let (queue, bit) = match kind {
            DB_SQ => (QueueKind::Qp, MISSED_SQ),
            DB_RQ => (QueueKind::Qp, MISSED_RQ),
            DB_SRQ => (QueueKind::Srq, MISSED_SRQ),
            _ => (QueueKind::Cq, MISSED_CQ_ARM),
        };
        let in_d0 = self.cmd.lock(|c| {
            if c.powered {
                return true;
            }
            if let Some(q) = c
                .queues
                .iter_mut()
                .find(|q| q.kind == queue && q.number == number)
            {
                q.missed |= bit;
            }
            false
        });
        // Back in D0 meanwhile: rung now.
        if in_d0 {
            let _ = self.awake(|| {
                self.bar
                    .write64(REG_QUEUE_DOORBELL, (kind << 32) | u64::from(number))
            });
        }
    }

    /// `EvtDeviceD0Exit` (the device is about to leave D0 for a sleep
    /// state): the mini-driver stops touching the device. From now on:
    ///
    /// - a command is not posted: `post_command` gives it back, as when
    ///   the queue is full, and the core keeps it in its backlog until
    ///   [`Self::resume`] (`Device::post_backlog`): commands wait, as
    ///   mlx5's command interface holds commands while the device is
    ///   suspended, rather than fail;
    /// - a queue's doorbell is remembered on the queue, a doorbell-page
    ///   scan and a MAD's doorbell are remembered; all are rung at
    ///   [`Self::resume`];
    /// - the event queues are not polled or re-armed (their interrupts
    ///   are disabled: the framework disconnects the messages before
    ///   D0Exit);
    /// - a doorbell page is not opened or bound
    ///   (`STATUS_INVALID_DEVICE_STATE`); one freed is closed at
    ///   [`Self::resume`].
    ///
    /// Commands the device holds already complete after D0Entry: the
    /// device keeps its state across D3hot. Returns once no register
    /// access is in progress. Asleep already: nothing.
    ///
    /// IRQL: PASSIVE_LEVEL.
    pub fn suspend(&self) {
        self.cmd.lock(|c| c.powered = false);
        self.asleep.store(true, Ordering::SeqCst);
        while self.accessing.load(Ordering::SeqCst) != 0 {
            core::hint::spin_loop();
        }
    }

    /// `EvtDeviceD0Entry` after a sleep (the device is in D0 again, with
    /// its state): rings what was rung out of D0 (each queue's doorbells,
    /// the doorbell pages' scan, the MAD rings' indices) and closes the
    /// doorbell pages freed meanwhile. The caller then re-arms the event
    /// queues (their entries written before the sleep raise their
    /// messages) and posts the core's backlog. In D0 already: nothing
    /// but the re-ringing of nothing.
    ///
    /// IRQL: PASSIVE_LEVEL.
    pub fn resume(&self) {
        self.cmd.lock(|c| c.powered = true);
        self.asleep.store(false, Ordering::SeqCst);
        // Each queue's doorbells, one queue per lock hold (a doorbell
        // runs the device: no driver lock is held across it). A queue
        // whose doorbell rings from now on is rung at once.
        let mut from = 0;
        loop {
            let found = self.cmd.lock(|c| {
                let i = from + c.queues.get(from..)?.iter().position(|q| q.missed != 0)?;
                let q = &mut c.queues[i];
                let missed = core::mem::take(&mut q.missed);
                Some((i, q.number, missed))
            });
            let Some((i, number, missed)) = found else {
                if from == 0 {
                    break;
                }
                // The list may have moved: once more from its start.
                from = 0;
                continue;
            };
            from = i;
            for (bit, kind) in [
                (MISSED_SQ, DB_SQ),
                (MISSED_RQ, DB_RQ),
                (MISSED_SRQ, DB_SRQ),
                (MISSED_CQ_ARM, DB_CQ_ARM),
            ] {
                if missed & bit != 0 {
                    self.queue_doorbell(kind, number);
                }
            }
        }
        self.close_deferred_pages();
        if self.missed_pages.swap(false, Ordering::AcqRel) {
            let _ = self.ring_doorbell_pages();
        }
        let indices = self.mads.lock(|m| m.as_ref().map(|m| (m.sq_pi, m.rq_ci)));
        if let Some((pi, ci)) = indices {
            let _ = self.awake(|| {
                if self.missed_mad.swap(false, Ordering::AcqRel) {
                    let _ = self.bar.write32(REG_MAD_SQ_DOORBELL, pi);
                }
                let _ = self.bar.write32(REG_MAD_RQ_DOORBELL, ci);
            });
        }
    }

    /// `post_command` in D0 (the caller counts as a register access).
    fn post_in_d0(&self, token: u64, command: Command) -> Result<(), Command> {
        let posted = self.cmd.lock(|c| {
            let Some(slot) = c.slots.iter().position(|s| matches!(s, Slot::Free)) else {
                return Err(());
            };
            match self.fill(c, slot, token, &command) {
                Ok(s) => {
                    c.slots[slot] = s;
                    Ok(Some(slot))
                }
                // The queue is gone (released): refused like a full one.
                Err(_) => Err(()),
            }
        });
        match posted {
            Ok(Some(slot)) => {
                let _ = self.bar.write32(REG_CMD_DOORBELL, 1 << slot);
                Ok(())
            }
            _ => Err(command),
        }
    }

    /// Closes the doorbell pages freed out of D0.
    fn close_deferred_pages(&self) {
        for index in 0..self.uars.lock(|u| u.len()) {
            let closing = self.uars.lock(|u| {
                let closing = u[index] == UAR_CLOSE_AT_D0;
                if closing {
                    u[index] = UAR_OPENING;
                }
                closing
            });
            if closing {
                let closed = self.uar_op(index, REG_UAR_CLOSE, None);
                let left = if closed == Err(STATUS_INVALID_DEVICE_STATE) {
                    UAR_CLOSE_AT_D0
                } else {
                    0
                };
                self.uars.lock(|u| u[index] = left);
            }
        }
    }

    /// Whether the mini-driver treats the device as in D0 (not between
    /// [`Self::suspend`] and [`Self::resume`]).
    pub fn in_d0(&self) -> bool {
        !self.asleep.load(Ordering::SeqCst)
    }

    /// The ISR of MSI-X message `message` (EQ `message`): counts it and
    /// asks for the DPC (a message is not shared). The DPC then runs
    /// `Device::dpc` for message 0, `Device::comp_dpc(message - 1)` for
    /// the others.
    ///
    /// IRQL: DIRQL; no lock, no allocation.
    pub fn isr(&self, message: u16) -> bool {
        if let Some(c) = self.interrupts.get(usize::from(message)) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    /// MSI-X messages handled by [`Self::isr`] for event queue `eq`.
    pub fn interrupts(&self, eq: usize) -> u64 {
        self.interrupts
            .get(eq)
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    /// The event queues (and MSI-X messages) the driver uses.
    pub fn event_queues(&self) -> u16 {
        self.interrupts.len() as u16
    }

    /// Registrations whose memory is mapped for the device now.
    pub fn mapped_registrations(&self) -> usize {
        self.cmd.lock(|c| c.mrs.len())
    }

    /// Rings (of live CQs, SRQs and QPs) mapped for the device now.
    pub fn mapped_rings(&self) -> usize {
        self.cmd.lock(|c| {
            c.queues
                .iter()
                .map(|q| q.mappings.iter().flatten().count())
                .sum()
        })
    }

    /// The driver's view of the command queue (tests look at what the
    /// device reads).
    pub fn command_queue(&self) -> Option<Shared<Region>> {
        self.cmd
            .lock(|c| c.cmdq.as_ref().map(|b| b.region().clone()))
    }

    /// The driver's view of the GSI's MAD rings (the send ring, then the
    /// receive ring; tests look at what the device reads and writes).
    pub fn mad_rings(&self) -> Option<Shared<Region>> {
        self.mads
            .lock(|m| m.as_ref().map(|m| m.buf.region().clone()))
    }

    /// Stops the device (`EvtDeviceReleaseHardware`): resets it, takes its
    /// queues away and frees them, drops every mapping.
    ///
    /// IRQL: PASSIVE_LEVEL.
    pub fn release(&self) {
        if self.released.swap(true, Ordering::AcqRel) {
            return;
        }
        let _ = self.bar.write32(REG_RESET, 1);
        for n in 0..self.interrupts.len() {
            let _ = self.bar.write64(eq_reg(n, EQ_BASE), 0);
        }
        let _ = self.bar.write64(REG_CMDQ_BASE, 0);
        let _ = self.bar.write64(REG_MAD_SQ_BASE, 0);
        let _ = self.bar.write64(REG_MAD_RQ_BASE, 0);
        drop(self.mads.lock(Option::take));
        let (cmdq, eq, mrs, queues, slots) = self.cmd.lock(|c| {
            (
                c.cmdq.take(),
                c.eq.take(),
                core::mem::take(&mut c.mrs),
                core::mem::take(&mut c.queues),
                core::mem::take(&mut c.slots),
            )
        });
        drop((cmdq, eq, mrs, queues, slots));
        for q in &self.comp {
            drop(q.lock(Option::take));
        }
    }

    /// One operation of the device on doorbell page `index` (the caller
    /// holds the index): the register write, then its result register.
    fn uar_op(
        &self,
        index: usize,
        register: usize,
        target: Option<DoorbellTarget>,
    ) -> Result<u32, NtStatus> {
        let r = self
            .awake(|| {
                match target {
                    Some(t) => self.bar.write64(register, encode_bind(index, t))?,
                    None => self.bar.write32(register, index as u32)?,
                }
                self.bar.read64(uar_result(index))
            })
            .ok_or(STATUS_INVALID_DEVICE_STATE)??;
        let status = (r >> 32) as u32 as NtStatus;
        if status != STATUS_SUCCESS {
            return Err(status);
        }
        Ok(r as u32)
    }

    /// Fills slot `slot` with `command` (or, if it cannot be sent, a no-op
    /// that completes with the status); returns what the slot records.
    fn fill(
        &self,
        c: &mut Commands<P>,
        slot: usize,
        token: u64,
        command: &Command,
    ) -> Result<Slot<P::DmaMapping>, NtStatus> {
        let region = c
            .cmdq
            .as_ref()
            .ok_or(irpverbs_abi::STATUS_DEVICE_REMOVED)?
            .region()
            .clone();
        let base = slot * SLOT_SIZE;
        let base_la = self.cmdq_la + base as u64;
        let decode_as = opcode(command);
        let mut opcode = decode_as;
        let mut failed = None;
        let mut mapping = None;
        let mut queues: QueueRings<P::DmaMapping> = [None, None];
        let mut number = 0;
        let mut attr = None;
        let list = base_la + (INPUT_OFFSET + MTT_OFFSET) as u64;
        let mut mtt = Mtt {
            address: list,
            entries: 0,
            first_offset: 0,
        };
        let mut queue_mtt = QueueMtt {
            address: list,
            pages: [0, 0],
        };
        if makes_rings(command) {
            match self.map_rings(c, &region, base, command) {
                Ok((pages, rings)) => {
                    queue_mtt.pages = pages;
                    queues = rings;
                }
                Err(status) => failed = Some(status),
            }
        }
        match command {
            Command::RegMr(r) => match self.map_registration(c, &region, base, &r.region, r.access)
            {
                Ok((m, entries, first)) => {
                    mtt.entries = entries;
                    mtt.first_offset = first;
                    mapping = Some(m);
                }
                Err(status) => failed = Some(status),
            },
            Command::DeregMr { lkey: k } => number = *k,
            Command::ResizeCq { cqn: n, .. }
            | Command::DestroyCq { cqn: n }
            | Command::DestroySrq { srqn: n }
            | Command::DestroyQp { qpn: n } => number = *n,
            Command::QueryQp { .. } => match irpverbs_ring::try_box(IvQueryQpOut::default()) {
                Ok(b) => attr = Some(b),
                Err(_) => failed = Some(STATUS_INSUFFICIENT_RESOURCES),
            },
            _ => {}
        }
        let mut input = [0u8; FIXED_LEN];
        let len = if failed.is_some() {
            opcode = OP_NOP;
            0
        } else {
            encode_command(command, mtt, queue_mtt, &mut input)?
        };
        put(&region, base + INPUT_OFFSET, &input[..len])?;
        header(&region, base, base_la, opcode, len, 0)?;
        if mapping.is_some() {
            c.regs_in_flight += 1;
        }
        if queues[0].is_some() {
            c.creates_in_flight += 1;
        }
        Ok(Slot::Posted {
            token,
            opcode: decode_as,
            failed,
            mapping,
            queues,
            number,
            attr,
        })
    }

    /// Allocates the rings a create makes, maps each for the device and
    /// writes their page lists into the slot's input mailbox; reserves
    /// room in the table of live queues. A command whose sizes the device
    /// would refuse gets no rings (the device then says why). Returns each
    /// ring's pages and its memory and mapping.
    fn map_rings(
        &self,
        c: &mut Commands<P>,
        cmdq: &Region,
        base: usize,
        command: &Command,
    ) -> Result<([u32; 2], QueueRings<P::DmaMapping>), NtStatus> {
        let mut rings: QueueRings<P::DmaMapping> = [None, None];
        let mut pages = [0u32; 2];
        let Some(bytes) = ring_bytes(&self.caps, command) else {
            return Ok((pages, rings));
        };
        c.queues
            .try_reserve(c.creates_in_flight + 1)
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        let mut used = 0usize;
        for ((ring, n), len) in rings.iter_mut().zip(pages.iter_mut()).zip(bytes) {
            let Some(len) = len else { continue };
            let memory = Region::alloc(len).ok_or(STATUS_INSUFFICIENT_RESOURCES)?;
            let memory = Shared::try_new(memory).map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
            let mapping = self
                .platform
                .map_dma(&memory, DmaDirection::Bidirectional)?;
            let at = base + INPUT_OFFSET + MTT_OFFSET + used * 8;
            let listed = write_page_list(cmdq, at, mapping.elements(), MAX_MTT - used)?;
            used += listed;
            *n = listed as u32;
            *ring = Some((memory, mapping));
        }
        Ok((pages, rings))
    }

    /// Maps a registration's memory for the device and writes its page
    /// list into the slot's input mailbox; reserves its room in the table
    /// of live registrations. Returns the mapping, its pages and where its
    /// first byte is in its first page.
    fn map_registration(
        &self,
        c: &mut Commands<P>,
        cmdq: &Region,
        base: usize,
        memory: &Shared<Region>,
        access: u32,
    ) -> Result<(P::DmaMapping, u32, u32), NtStatus> {
        c.mrs
            .try_reserve(c.regs_in_flight + 1)
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        let direction = if access & IV_ACCESS_LOCAL_WRITE != 0 {
            DmaDirection::Bidirectional
        } else {
            DmaDirection::ToDevice
        };
        let mapping = self.platform.map_dma(memory, direction)?;
        let first = mapping
            .elements()
            .first()
            .ok_or(STATUS_INVALID_PARAMETER)?
            .address;
        let at = base + INPUT_OFFSET + MTT_OFFSET;
        let n = write_page_list(cmdq, at, mapping.elements(), MAX_MTT)?;
        Ok((mapping, n as u32, (first & (DMA_PAGE_SIZE - 1)) as u32))
    }

    /// The completion of slot `slot` as the device wrote it.
    fn command_done(&self, c: &mut Commands<P>, slot: usize) -> Option<Event> {
        let posted = core::mem::replace(c.slots.get_mut(slot)?, Slot::Free);
        let Slot::Posted {
            token,
            opcode,
            failed,
            mapping,
            queues,
            number,
            attr,
        } = posted
        else {
            return None;
        };
        if mapping.is_some() {
            c.regs_in_flight -= 1;
        }
        if queues[0].is_some() {
            c.creates_in_flight -= 1;
        }
        let region = c.cmdq.as_ref()?.region().clone();
        let base = slot * SLOT_SIZE;
        let mut status = get_u32(&region, base + H_STATUS) as NtStatus;
        if get_u32(&region, base + H_OWNER) != OWNER_DRIVER {
            status = STATUS_DEVICE_HARDWARE_ERROR;
        }
        let written = get_u32(&region, base + H_OUT_WRITTEN) as usize;
        let mut out = [0u8; FIXED_LEN];
        if let Some(f) = failed {
            status = f;
        }
        if status == STATUS_SUCCESS
            && (written > FIXED_LEN
                || region
                    .read(base + OUTPUT_OFFSET, &mut out[..written])
                    .is_err())
        {
            status = STATUS_DEVICE_HARDWARE_ERROR;
        }
        if status != STATUS_SUCCESS {
            // The device let go of a refused create's rings and
            // registration's memory: they are unmapped and freed here.
            return Some(Event::CommandDone {
                token,
                status,
                out: CommandOut::None,
            });
        }
        let memory = [
            queues[0].as_ref().map(|(m, _)| m.clone()),
            queues[1].as_ref().map(|(m, _)| m.clone()),
        ];
        let result = decode_output(opcode, &out[..written], memory, attr);
        let [first, second] = queues;
        let mappings = [first.map(|(_, m)| m), second.map(|(_, m)| m)];
        match (&result, opcode) {
            (Ok(CommandOut::Mr { lkey, .. }), OP_REG_MR) => {
                if let Some(m) = mapping {
                    // Room was reserved when it was posted.
                    c.mrs.push((*lkey, m));
                }
            }
            (Ok(_), OP_DEREG_MR) => {
                if let Some(i) = c.mrs.iter().position(|(k, _)| *k == number) {
                    drop(c.mrs.swap_remove(i));
                }
            }
            (Ok(CommandOut::Cq { cqn, .. }), OP_CREATE_CQ | OP_RESIZE_CQ) => {
                // A resize moved the CQ: the device let go of its old ring.
                forget_queue(c, QueueKind::Cq, *cqn);
                keep_queue(c, QueueKind::Cq, *cqn, mappings);
            }
            (Ok(CommandOut::Srq { srqn, .. }), OP_CREATE_SRQ) => {
                keep_queue(c, QueueKind::Srq, *srqn, mappings);
            }
            (Ok(CommandOut::Qp { qpn, .. }), OP_CREATE_QP) => {
                keep_queue(c, QueueKind::Qp, *qpn, mappings);
            }
            (Ok(_), OP_DESTROY_CQ) => forget_queue(c, QueueKind::Cq, number),
            (Ok(_), OP_DESTROY_SRQ) => forget_queue(c, QueueKind::Srq, number),
            (Ok(_), OP_DESTROY_QP) => forget_queue(c, QueueKind::Qp, number),
            _ => {}
        }
        Some(match result {
            Ok(out) => Event::CommandDone { token, status, out },
            Err(status) => Event::CommandDone {
                token,
                status,
                out: CommandOut::None,
            },
        })
    }
}

/// Writes a slot's header and hands it to the device (the owner word
/// last).
fn header(
    region: &Region,
    base: usize,
    base_la: LogicalAddress,
    opcode: u32,
    input_len: usize,
    flags: u32,
) -> Result<(), NtStatus> {
    let mut h = [0u8; HEADER_LEN];
    let mut w = Writer::new(&mut h);
    w.u32(opcode)?;
    w.u32(input_len as u32)?;
    w.u64(base_la + INPUT_OFFSET as u64)?;
    w.u64(base_la + OUTPUT_OFFSET as u64)?;
    w.u32(OUTPUT_LEN as u32)?;
    h[H_FLAGS..H_FLAGS + 4].copy_from_slice(&flags.to_le_bytes());
    put(region, base, &h[..H_OWNER])?;
    region
        .atomic_u32(base + H_OWNER)
        .map_err(|_| STATUS_INVALID_PARAMETER)?
        .store(OWNER_DEVICE, Ordering::Release);
    Ok(())
}

/// Runs a command in slot 0 with the device polled (before interrupts):
/// rings, waits for the owner word, returns the output's length in `out`.
fn polled<B: Bar, C: CommonBuffer>(
    bar: &B,
    cmdq: &C,
    opcode: u32,
    out: &mut [u8],
) -> Result<usize, NtStatus> {
    let region = cmdq.region();
    header(region, 0, cmdq.logical_address(), opcode, 0, FLAG_POLLED)?;
    bar.write32(REG_CMD_DOORBELL, 1)?;
    let mut spins = 0;
    while get_u32(region, H_OWNER) != OWNER_DRIVER {
        spins += 1;
        if spins >= POLL_SPINS || bar.read32(REG_STATUS)? & STATUS_FATAL != 0 {
            return Err(STATUS_IO_TIMEOUT);
        }
        core::hint::spin_loop();
    }
    let status = get_u32(region, H_STATUS) as NtStatus;
    if status != STATUS_SUCCESS {
        return Err(status);
    }
    let n = get_u32(region, H_OUT_WRITTEN) as usize;
    let dst = out.get_mut(..n).ok_or(STATUS_DEVICE_HARDWARE_ERROR)?;
    region
        .read(OUTPUT_OFFSET, dst)
        .map_err(|_| STATUS_DEVICE_HARDWARE_ERROR)?;
    Ok(n)
}

/// Allocates event queue `n` and programs the device with it.
fn event_queue<P: PciPlatform>(
    platform: &P,
    bar: &P::Bar,
    n: usize,
    entries: u32,
) -> Result<EventQueue<P::CommonBuffer>, NtStatus> {
    let buf = platform.alloc_common_buffer(entries as usize * EQE_LEN)?;
    bar.write32(eq_reg(n, EQ_ENTRIES), entries)?;
    bar.write64(eq_reg(n, EQ_BASE), buf.logical_address())?;
    Ok(EventQueue {
        buf,
        entries,
        ci: 0,
    })
}

/// Keeps a created queue's rings' mappings (room was reserved when it was
/// posted).
fn keep_queue<P: PciPlatform>(
    c: &mut Commands<P>,
    kind: QueueKind,
    number: u32,
    mappings: [Option<P::DmaMapping>; 2],
) {
    if mappings.iter().any(Option::is_some) {
        c.queues.push(LiveQueue {
            kind,
            number,
            mappings,
            missed: 0,
        });
    }
}

/// Unmaps a destroyed queue's rings (the device let go of them).
fn forget_queue<P: PciPlatform>(c: &mut Commands<P>, kind: QueueKind, number: u32) {
    if let Some(i) = c
        .queues
        .iter()
        .position(|q| q.kind == kind && q.number == number)
    {
        drop(c.queues.swap_remove(i));
    }
}

/// Bytes of each ring `command` makes, as the device sizes them (a CQ's
/// `cqe + 1` slots of a CQE, an SRQ's or a work queue's `max_wr + 1` slots
/// of its WQE size, each rounded up to a power of two), in whole pages;
/// `None` for sizes past the device's limits (it refuses them).
fn ring_bytes(caps: &IvQueryDeviceOut, command: &Command) -> Option<[Option<usize>; 2]> {
    let ring = |wr: u32, stride: u32| {
        Ring::alloc_len(wr.checked_add(1)?.checked_next_power_of_two()?, stride)
    };
    let cqe_stride = size_of::<IvCqe>() as u32;
    match command {
        Command::CreateCq(CreateCq { cqe, .. }) | Command::ResizeCq { cqe, .. } => {
            if *cqe == 0 || *cqe > caps.max_cqe {
                return None;
            }
            Some([Some(ring(*cqe, cqe_stride)?), None])
        }
        Command::CreateSrq(s) => {
            if s.max_wr == 0
                || s.max_wr > caps.max_srq_wr
                || s.max_sge == 0
                || s.max_sge > caps.max_srq_sge
            {
                return None;
            }
            Some([Some(ring(s.max_wr, recv_stride(s.max_sge))?), None])
        }
        Command::CreateQp(q) => {
            let cap = &q.cap;
            let has_rq = q.srqn.is_none();
            if cap.reserved != 0
                || cap.max_send_wr > caps.max_qp_wr
                || cap.max_send_sge > caps.max_sge
                || cap.max_inline_data > caps.max_inline_data
                || (has_rq && (cap.max_recv_wr > caps.max_qp_wr || cap.max_recv_sge > caps.max_sge))
            {
                return None;
            }
            let sq = ring(
                cap.max_send_wr,
                send_stride(cap.max_send_sge, cap.max_inline_data),
            )?;
            let rq = if has_rq {
                Some(ring(cap.max_recv_wr, recv_stride(cap.max_recv_sge))?)
            } else {
                None
            };
            Some([Some(sq), rq])
        }
        _ => None,
    }
}

/// Writes the pages of a mapping's list (`elements`, one run of memory)
/// as MTT entries at `at` in the command queue, at most `room`; returns
/// how many.
///
/// # Errors
/// `STATUS_INVALID_PARAMETER` for a list that is not a page list;
/// `STATUS_INSUFFICIENT_RESOURCES` past `room`.
fn write_page_list(
    cmdq: &Region,
    at: usize,
    elements: &[SgElement],
    room: usize,
) -> Result<usize, NtStatus> {
    let mask = DMA_PAGE_SIZE - 1;
    let last = elements
        .len()
        .checked_sub(1)
        .ok_or(STATUS_INVALID_PARAMETER)?;
    let mut n = 0usize;
    for (i, e) in elements.iter().enumerate() {
        let end = e.address + u64::from(e.length);
        // A page list: runs start and end on pages but at its ends.
        if (i > 0 && e.address & mask != 0) || (i < last && end & mask != 0) {
            return Err(STATUS_INVALID_PARAMETER);
        }
        let mut page = e.address & !mask;
        while page < end {
            if n >= room {
                return Err(STATUS_INSUFFICIENT_RESOURCES);
            }
            put(cmdq, at + n * 8, &page.to_le_bytes())?;
            n += 1;
            page += DMA_PAGE_SIZE;
        }
    }
    Ok(n)
}

/// The ring the device describes (slots, slot size) over `memory`, the
/// driver's: a ring that does not fit it is a hardware error.
fn ring(
    r: &mut Reader<'_>,
    memory: &mut [Option<Shared<Region>>; 2],
    i: usize,
) -> Result<Ring, NtStatus> {
    let bad = |_| STATUS_DEVICE_HARDWARE_ERROR;
    let (entries, stride) = (r.u32().map_err(bad)?, r.u32().map_err(bad)?);
    let memory = memory[i].take().ok_or(STATUS_DEVICE_HARDWARE_ERROR)?;
    Ring::new(memory, entries, stride).map_err(|_| STATUS_DEVICE_HARDWARE_ERROR)
}

/// A command's output as the device wrote it (checked: a device that
/// writes the wrong length is a hardware error). `memory`: the rings the
/// driver allocated for a create.
fn decode_output(
    opcode: u32,
    bytes: &[u8],
    mut memory: [Option<Shared<Region>>; 2],
    attr: Option<Box<IvQueryQpOut>>,
) -> Result<CommandOut, NtStatus> {
    let bad = |_| STATUS_DEVICE_HARDWARE_ERROR;
    let mut r = Reader::new(bytes);
    let out = match opcode {
        OP_QUERY_PORT => CommandOut::Port(r.obj::<IvQueryPortOut>().map_err(bad)?),
        OP_QUERY_GID => CommandOut::Gid(r.obj::<[u8; 16]>().map_err(bad)?),
        OP_ALLOC_PD => CommandOut::Pd {
            pdn: r.u32().map_err(bad)?,
        },
        OP_ALLOC_MW | OP_BIND_MW => CommandOut::Mw {
            rkey: r.u32().map_err(bad)?,
        },
        OP_REG_MR | OP_ALLOC_MR => CommandOut::Mr {
            lkey: r.u32().map_err(bad)?,
            rkey: r.u32().map_err(bad)?,
        },
        OP_CREATE_CQ | OP_RESIZE_CQ => CommandOut::Cq {
            cqn: r.u32().map_err(bad)?,
            cqe: r.u32().map_err(bad)?,
            ring: ring(&mut r, &mut memory, 0)?,
        },
        OP_CREATE_SRQ => CommandOut::Srq {
            srqn: r.u32().map_err(bad)?,
            max_wr: r.u32().map_err(bad)?,
            max_sge: r.u32().map_err(bad)?,
            ring: ring(&mut r, &mut memory, 0)?,
        },
        OP_QUERY_SRQ => CommandOut::SrqAttr(r.obj::<IvQuerySrqOut>().map_err(bad)?),
        OP_CREATE_QP => {
            let qpn = r.u32().map_err(bad)?;
            let has_rq = r.flag().map_err(bad)?;
            let cap = r.obj::<IvQpCap>().map_err(bad)?;
            let sq = ring(&mut r, &mut memory, 0)?;
            let rq = if has_rq {
                Some(ring(&mut r, &mut memory, 1)?)
            } else {
                // No receive queue: its geometry is (0, 0).
                if (r.u32().map_err(bad)?, r.u32().map_err(bad)?) != (0, 0) {
                    return Err(STATUS_DEVICE_HARDWARE_ERROR);
                }
                None
            };
            CommandOut::Qp { qpn, cap, sq, rq }
        }
        OP_QUERY_QP => {
            let mut b = attr.ok_or(STATUS_DEVICE_HARDWARE_ERROR)?;
            *b = r.obj::<IvQueryQpOut>().map_err(bad)?;
            CommandOut::QpAttr(b)
        }
        OP_CREATE_AH => CommandOut::Ah {
            ahn: r.u32().map_err(bad)?,
        },
        _ => CommandOut::None,
    };
    r.end().map_err(bad)?;
    Ok(out)
}

impl<P: PciPlatform + Clone> Hca for ModelHca<P> {
    fn caps(&self) -> &IvQueryDeviceOut {
        &self.caps
    }

    /// Formats the command into a free slot of the command queue (a
    /// registration's memory mapped and its page list in the input
    /// mailbox) and rings the command doorbell.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    fn post_command(&self, token: u64, command: Command) -> Result<(), Command> {
        // Out of D0 the command waits in the core's backlog.
        self.awake_with(command, |command| self.post_in_d0(token, command))
            .unwrap_or_else(Err)
    }

    fn poll_event(&self) -> Option<Event> {
        let mut one = [None];
        self.poll_events(&mut one);
        let [e] = one;
        e
    }

    /// Takes EQ 0's entries: command completions (the slot's status and
    /// output mailbox), async events, MAD arrivals; then tells the device
    /// how far it read.
    fn poll_events(&self, out: &mut [Option<Event>]) -> usize {
        self.cmd.lock(|c| {
            let mut n = 0;
            let mut took = false;
            while n < out.len() {
                let Some((kind, sub, arg)) = c.eq.as_mut().and_then(EventQueue::next) else {
                    break;
                };
                took = true;
                let event = match kind {
                    EQE_COMMAND => self.command_done(c, arg as usize),
                    EQE_COMPLETION => Some(Event::Completion { cqn: arg }),
                    EQE_ASYNC => decode_async(sub, arg).map(Event::Async),
                    EQE_MAD => Some(Event::Mad),
                    _ => None,
                };
                if let Some(e) = event {
                    out[n] = Some(e);
                    n += 1;
                }
            }
            if took && let Some(eq) = &c.eq {
                // Out of D0 the consumer index reaches the device with
                // the re-arm after D0Entry.
                let _ = self.awake(|| self.bar.write32(eq_reg(0, EQ_CI), eq.ci));
            }
            n
        })
    }

    fn arm_event_queue(&self) {
        self.cmd.lock(|c| {
            if let Some(eq) = &c.eq {
                let _ = self.awake(|| self.bar.write32(eq_reg(0, EQ_ARM), eq.ci));
            }
        });
    }

    fn comp_event_queues(&self) -> u32 {
        self.comp.len() as u32
    }

    fn poll_comp_events(&self, vector: u32, out: &mut [Option<Event>]) -> usize {
        let Some(q) = self.comp.get(vector as usize) else {
            return 0;
        };
        q.lock(|q| {
            let Some(q) = q else { return 0 };
            let mut n = 0;
            let mut took = false;
            while n < out.len() {
                let Some((kind, _, arg)) = q.next() else {
                    break;
                };
                took = true;
                if kind == EQE_COMPLETION {
                    out[n] = Some(Event::Completion { cqn: arg });
                    n += 1;
                }
            }
            if took {
                let _ = self.awake(|| self.bar.write32(eq_reg(vector as usize + 1, EQ_CI), q.ci));
            }
            n
        })
    }

    fn arm_comp_event_queue(&self, vector: u32) {
        if let Some(q) = self.comp.get(vector as usize) {
            q.lock(|q| {
                if let Some(q) = q {
                    let _ =
                        self.awake(|| self.bar.write32(eq_reg(vector as usize + 1, EQ_ARM), q.ci));
                }
            });
        }
    }

    fn sq_doorbell(&self, qpn: u32) {
        self.queue_doorbell(DB_SQ, qpn);
    }

    fn rq_doorbell(&self, qpn: u32) {
        self.queue_doorbell(DB_RQ, qpn);
    }

    fn srq_doorbell(&self, srqn: u32) {
        self.queue_doorbell(DB_SRQ, srqn);
    }

    fn cq_arm_doorbell(&self, cqn: u32) {
        self.queue_doorbell(DB_CQ_ARM, cqn);
    }

    /// The device forgets registered memory (a reset), then every
    /// registration's mapping is dropped: the pins end now. The queues'
    /// rings are the driver's own memory: they stay mapped until each
    /// queue's destroy.
    fn device_removed(&self) {
        // Out of D0 the device cannot be reset: the mappings stay until
        // the release (which resets it first).
        if self.awake(|| self.bar.write32(REG_RESET, 1)).is_none() {
            return;
        }
        let mrs = self.cmd.lock(|c| core::mem::take(&mut c.mrs));
        drop(mrs);
    }

    /// A doorbell (UAR) page: a free page of BAR 2, which the device opens
    /// ([`crate::uar`]); its memory is the BAR's, mapped into the process.
    ///
    /// # Errors
    /// `STATUS_NOT_SUPPORTED` without BAR 2; `STATUS_INSUFFICIENT_RESOURCES`
    /// when every page is taken or memory is short; the device's status.
    fn alloc_doorbell_page(&self) -> Result<DoorbellPageInfo, NtStatus> {
        let bar = self.uar.as_ref().ok_or(STATUS_NOT_SUPPORTED)?;
        let pages = bar.pages().ok_or(STATUS_NOT_SUPPORTED)?;
        let index = self
            .uars
            .lock(|u| {
                let i = u.iter().position(|&p| p == 0)?;
                u[i] = UAR_OPENING;
                Some(i)
            })
            .ok_or(STATUS_INSUFFICIENT_RESOURCES)?;
        let page_len = DMA_PAGE_SIZE as usize;
        let region = Region::sub(pages.clone(), index * page_len, page_len, None)
            .and_then(|r| Shared::try_new(r).ok());
        let opened = match region {
            None => Err(STATUS_INSUFFICIENT_RESOURCES),
            Some(region) => self.uar_op(index, REG_UAR_OPEN, None).and_then(|page| {
                if page == 0 || page == UAR_OPENING {
                    let _ = self.uar_op(index, REG_UAR_CLOSE, None);
                    Err(STATUS_DEVICE_HARDWARE_ERROR)
                } else {
                    Ok(DoorbellPageInfo { page, region })
                }
            }),
        };
        let number = opened.as_ref().map_or(0, |info| info.page);
        self.uars.lock(|u| u[index] = number);
        opened
    }

    /// The device closes the page; its index is free again.
    /// Out of D0 the index is closed at [`ModelHca::resume`].
    fn free_doorbell_page(&self, page: u32) {
        let Some(index) = self.uars.lock(|u| {
            let i = u
                .iter()
                .position(|&p| p == page && p != UAR_OPENING && p != UAR_CLOSE_AT_D0)?;
            u[i] = UAR_OPENING;
            Some(i)
        }) else {
            return;
        };
        let closed = self.uar_op(index, REG_UAR_CLOSE, None);
        let left = if closed == Err(STATUS_INVALID_DEVICE_STATE) {
            UAR_CLOSE_AT_D0
        } else {
            0
        };
        self.uars.lock(|u| u[index] = left);
        // Back in D0 meanwhile: closed now.
        if left != 0 && self.in_d0() {
            self.close_deferred_pages();
        }
    }

    /// The device binds the queue to a free slot of the page.
    fn bind_doorbell(&self, page: u32, target: DoorbellTarget) -> Result<u32, NtStatus> {
        let index = self
            .uars
            .lock(|u| {
                u.iter()
                    .position(|&p| p == page && p != UAR_OPENING && p != UAR_CLOSE_AT_D0)
            })
            .ok_or(STATUS_INVALID_PARAMETER)?;
        self.uar_op(index, REG_UAR_BIND, Some(target))
    }

    /// The device scans its doorbell pages now.
    fn ring_doorbell_pages(&self) -> Result<(), NtStatus> {
        if self.uar.is_none() {
            return Err(STATUS_NOT_SUPPORTED);
        }
        // Out of D0 the device scans its pages at D0Entry.
        match self.awake(|| self.bar.write32(REG_UAR_RUNG, 1)) {
            Some(r) => r,
            None => {
                self.missed_pages.store(true, Ordering::SeqCst);
                if self.in_d0() && self.missed_pages.swap(false, Ordering::AcqRel) {
                    return self.ring_doorbell_pages();
                }
                Ok(())
            }
        }
    }

    /// Puts the MAD in the send ring's next entry and rings the MAD
    /// doorbell ([`crate::gsi`]); the device sends it from QP1.
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER` for a port the device does not have, a
    /// QP number past 24 bits or a flow label past 20 bits (a GID index
    /// the port does not have is the device's to refuse: it drops the
    /// MAD); `STATUS_INSUFFICIENT_RESOURCES` when the ring is full;
    /// `STATUS_INVALID_DEVICE_STATE` after the device was released.
    fn send_mad(&self, mad: &MadOut) -> Result<(), NtStatus> {
        if mad.port == 0
            || mad.port > self.caps.phys_port_cnt
            || mad.dest_qpn > 0xFF_FFFF
            || mad.flow_label > 0xF_FFFF
        {
            return Err(STATUS_INVALID_PARAMETER);
        }
        let entry = encode_send(mad);
        let pi = self.mads.lock(|m| {
            let m = m.as_mut().ok_or(STATUS_INVALID_DEVICE_STATE)?;
            let off = (m.sq_pi % MAD_RING_ENTRIES) as usize * MAD_ENTRY_LEN;
            let region = m.buf.region();
            let word = region
                .atomic_u32(off + M_OWNER)
                .map_err(|_| STATUS_INVALID_PARAMETER)?;
            if word.load(Ordering::Acquire) != MAD_FREE {
                return Err(STATUS_INSUFFICIENT_RESOURCES);
            }
            // The header and the MAD, then the owner word.
            put(region, off, &entry[..M_OWNER])?;
            put(region, off + MAD_HEADER_LEN, &entry[MAD_HEADER_LEN..])?;
            word.store(MAD_FULL, Ordering::Release);
            m.sq_pi = m.sq_pi.wrapping_add(1);
            Ok(m.sq_pi)
        })?;
        // Out of D0 the doorbell is rung at D0Entry (the MAD waits in the
        // ring).
        match self.awake(|| self.bar.write32(REG_MAD_SQ_DOORBELL, pi)) {
            Some(r) => r,
            None => {
                self.missed_mad.store(true, Ordering::SeqCst);
                // Back in D0 meanwhile: rung now.
                if self.in_d0() && self.missed_mad.swap(false, Ordering::AcqRel) {
                    let _ = self.awake(|| self.bar.write32(REG_MAD_SQ_DOORBELL, pi));
                }
                Ok(())
            }
        }
    }

    /// Takes the receive ring's next full entry, gives it back, and tells
    /// the device ([`crate::gsi`]). An entry that does not parse is given
    /// back and skipped.
    fn poll_mad(&self) -> Option<MadIn> {
        let (mad, ci) = self.mads.lock(|m| {
            let Some(m) = m.as_mut() else {
                return (None, None);
            };
            let mut taken = None;
            for _ in 0..MAD_RING_ENTRIES {
                let off = MAD_RING_LEN + (m.rq_ci % MAD_RING_ENTRIES) as usize * MAD_ENTRY_LEN;
                let region = m.buf.region();
                let Ok(word) = region.atomic_u32(off + M_OWNER) else {
                    break;
                };
                if word.load(Ordering::Acquire) != MAD_FULL {
                    break;
                }
                let mut e = [0u8; MAD_ENTRY_LEN];
                let read = region.read(off, &mut e);
                word.store(MAD_FREE, Ordering::Release);
                m.rq_ci = m.rq_ci.wrapping_add(1);
                taken = Some(m.rq_ci);
                if let Some(mad) = read.ok().and_then(|()| decode_receive(&e).ok()) {
                    return (Some(mad), taken);
                }
            }
            (None, taken)
        });
        if let Some(ci) = ci {
            let _ = self.awake(|| self.bar.write32(REG_MAD_RQ_DOORBELL, ci));
        }
        mad
    }
}
