//! Work queues and completion queues over [`Ring`]s: what `post_send`,
//! `post_recv`, `poll_cq` and `req_notify_cq` do to shared memory (the ULP's
//! side), and how the HCA reads WQEs and writes CQEs (the HCA's side).
//!
//! Callable at IRQL <= DISPATCH_LEVEL: no allocation, no blocking. Concurrent
//! posts to one queue are serialized by a small spin flag in the ULP-side
//! object (never in shared memory, which the other side could corrupt).

use core::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use irpverbs_abi::*;
use zerocopy::IntoBytes;

use crate::region::{OutOfBounds, Region, Window};
use crate::ring::{Corrupt, Ring, Slots};

/// Why a post was refused. Nothing was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PostError {
    /// The queue is full (`ENOMEM` in libibverbs).
    Full,
    /// More SGEs than the queue was created with.
    TooManySge,
    /// More inline data than the queue was created with.
    InlineTooLong,
    /// Unknown opcode or flag.
    Invalid,
}

/// Slot size of a send queue for `max_sge` SGEs and `max_inline` bytes.
#[must_use]
pub fn send_stride(max_sge: u32, max_inline: u32) -> u32 {
    let need = IV_SEND_WQE_HEADER as u32 + (16 * max_sge).max(max_inline);
    need.next_power_of_two().max(64)
}

/// Slot size of a receive queue (or SRQ) for `max_sge` SGEs.
#[must_use]
pub fn recv_stride(max_sge: u32) -> u32 {
    (IV_RECV_WQE_HEADER as u32 + 16 * max_sge.max(1))
        .next_power_of_two()
        .max(32)
}

struct SpinFlag {
    held: AtomicBool,
    check: Option<LockCheck>,
}

/// A check run each time a queue's lock is taken, given the lock's address
/// (see [`SendQueue::set_lock_check`]): the host verifier's check that a
/// kernel caller's queue is locked at DISPATCH_LEVEL.
///
/// The lock itself never changes IRQL. A user-mode ULP needs no more (a
/// thread preempted while holding it is rescheduled); a kernel caller must
/// hold it at DISPATCH_LEVEL, or a DPC on the same processor that takes the
/// same queue's lock spins forever on a holder that cannot run. The kernel
/// direct-call table takes a platform spin lock that raises to
/// DISPATCH_LEVEL around every post and poll, and gives its queues the
/// platform's check of that.
pub type LockCheck = fn(lock: usize);

impl SpinFlag {
    const fn new() -> Self {
        Self {
            held: AtomicBool::new(false),
            check: None,
        }
    }

    #[inline]
    fn with<R>(&self, f: impl FnOnce() -> R) -> R {
        if let Some(check) = self.check {
            check(core::ptr::from_ref(self).addr());
        }
        while self
            .held
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            core::hint::spin_loop();
        }
        let r = f();
        self.held.store(false, Ordering::Release);
        r
    }
}

/// A send work request, as `post_send` takes it.
#[derive(Clone, Copy, Debug, Default)]
pub struct SendWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// `IV_WR_*`.
    pub opcode: u8,
    /// `IV_SEND_*` (`IV_SEND_INLINE` is set from `inline`).
    pub flags: u8,
    /// Gather list (ignored with `inline`).
    pub sges: &'a [IvSge],
    /// Inline data instead of a gather list.
    pub inline: Option<&'a [u8]>,
    /// Immediate data or rkey to invalidate.
    pub imm_or_inv: u32,
    /// RDMA / atomic remote address.
    pub remote_addr: u64,
    /// RDMA / atomic remote key.
    pub rkey: u32,
    /// Atomic compare / add operand.
    pub compare_add: u64,
    /// Atomic swap operand.
    pub swap: u64,
    /// UD: AH number, remote QPN, remote Q_Key.
    pub ud: Option<(u32, u32, u32)>,
}

/// The ULP's side of a send queue. Alone on its cache lines: its lock is
/// written by every post (poll), and two queues side by side in memory
/// (one process's CQs, say) may be used from two processors.
#[repr(align(128))]
pub struct SendQueue {
    ring: Ring,
    max_sge: u32,
    max_inline: u32,
    lock: SpinFlag,
    known_free: KnownFree,
}

impl core::fmt::Debug for SendQueue {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SendQueue")
            .field("ring", &self.ring)
            .finish_non_exhaustive()
    }
}

impl SendQueue {
    /// The send queue over `ring`.
    #[must_use]
    pub fn new(ring: Ring, max_sge: u32, max_inline: u32) -> Self {
        Self {
            ring,
            max_sge,
            max_inline,
            lock: SpinFlag::new(),
            known_free: KnownFree::default(),
        }
    }

    /// The ring.
    #[must_use]
    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    /// Runs `check` each time the queue's lock is taken (before spinning
    /// on it). Set before the queue is shared; see [`LockCheck`].
    pub fn set_lock_check(&mut self, check: LockCheck) {
        self.lock.check = Some(check);
    }

    /// Writes `wr` at the producer slot and publishes it. The caller then
    /// rings the doorbell.
    ///
    /// # Errors
    /// [`PostError`]; nothing was posted.
    #[inline]
    pub fn post(&self, wr: &SendWr<'_>) -> Result<(), PostError> {
        post_one(&self.lock, &self.known_free, &self.ring, |slots, index| {
            self.write(slots, index, wr)
        })
    }

    /// Writes `wrs` in order at the producer slots and publishes them
    /// together (one hold of the queue's lock, one producer index store).
    /// The caller then rings the doorbell once.
    ///
    /// # Errors
    /// The index of the first work request not posted and why; the ones
    /// before it were posted.
    pub fn post_list(&self, wrs: &[SendWr<'_>]) -> Result<(), (usize, PostError)> {
        post_each(
            &self.lock,
            &self.known_free,
            &self.ring,
            wrs,
            |slots, index, wr| self.write(slots, index, wr),
        )
    }

    /// Checks `wr` and writes it into the (free) slot `index`.
    #[inline(always)]
    fn write(&self, slots: Slots<'_>, index: u32, wr: &SendWr<'_>) -> Result<(), PostError> {
        // The common WR (one SGE, not inline, not UD) on a path of its own,
        // with few values live: the general one spilled and reloaded a
        // dozen (callgrind: 20 instructions more per single-SGE post).
        if let ([sge], None, None) = (wr.sges, wr.inline, wr.ud)
            && wr.opcode <= IV_WR_ATOMIC_FETCH_AND_ADD
            && wr.flags & !(IV_SEND_SIGNALED | IV_SEND_SOLICITED | IV_SEND_FENCE) == 0
            && self.max_sge >= 1
        {
            let at = slots.offset(index);
            let region = slots.window;
            let header = IvSendWqe {
                wr_id: wr.wr_id,
                opcode: wr.opcode,
                flags: wr.flags,
                num_sge: 1,
                imm_or_inv: wr.imm_or_inv,
                remote_addr: wr.remote_addr,
                rkey: wr.rkey,
                inline_len: 0,
                compare_add: wr.compare_add,
                swap: wr.swap,
                ahn: 0,
                remote_qpn: 0,
                remote_qkey: 0,
                reserved: 0,
            };
            return region
                .write_obj(at + IV_SEND_WQE_HEADER, sge)
                .and_then(|()| region.write_obj(at, &header))
                .map_err(|OutOfBounds| PostError::Invalid);
        }
        self.write_general(slots, index, wr)
    }

    /// [`SendQueue::write`] for any WR.
    #[inline(never)]
    fn write_general(
        &self,
        slots: Slots<'_>,
        index: u32,
        wr: &SendWr<'_>,
    ) -> Result<(), PostError> {
        if wr.opcode > IV_WR_REG_MR
            || wr.flags & !(IV_SEND_SIGNALED | IV_SEND_SOLICITED | IV_SEND_INLINE | IV_SEND_FENCE)
                != 0
        {
            return Err(PostError::Invalid);
        }
        let (num_sge, inline_len) = match wr.inline {
            Some(d) if d.len() > self.max_inline as usize => return Err(PostError::InlineTooLong),
            Some(d) => (0u16, d.len() as u32),
            None if wr.sges.len() > self.max_sge as usize => return Err(PostError::TooManySge),
            None => (wr.sges.len() as u16, 0),
        };
        let (ahn, remote_qpn, remote_qkey) = wr.ud.unwrap_or_default();
        let header = IvSendWqe {
            wr_id: wr.wr_id,
            opcode: wr.opcode,
            flags: wr.flags & !IV_SEND_INLINE
                | if wr.inline.is_some() {
                    IV_SEND_INLINE
                } else {
                    0
                },
            num_sge,
            imm_or_inv: wr.imm_or_inv,
            remote_addr: wr.remote_addr,
            rkey: wr.rkey,
            inline_len,
            compare_add: wr.compare_add,
            swap: wr.swap,
            ahn,
            remote_qpn,
            remote_qkey,
            reserved: 0,
        };
        let at = slots.offset(index);
        let region = slots.window;
        let body = at + IV_SEND_WQE_HEADER;
        match wr.inline {
            Some(d) => region.write(body, d),
            None => write_sges(region, body, wr.sges),
        }
        .and_then(|()| region.write_obj(at, &header))
        .map_err(|OutOfBounds| PostError::Invalid)
    }
}

/// The ULP's side of a receive queue or SRQ. Alone on its cache lines: its lock is
/// written by every post (poll), and two queues side by side in memory
/// (one process's CQs, say) may be used from two processors.
#[repr(align(128))]
pub struct RecvQueue {
    ring: Ring,
    max_sge: u32,
    lock: SpinFlag,
    /// Free slots as of the last look at the consumer index, less those
    /// posted since (see [`KnownFree`]).
    known_free: KnownFree,
}

impl core::fmt::Debug for RecvQueue {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RecvQueue")
            .field("ring", &self.ring)
            .finish_non_exhaustive()
    }
}

impl RecvQueue {
    /// The receive queue over `ring`.
    #[must_use]
    pub fn new(ring: Ring, max_sge: u32) -> Self {
        Self {
            ring,
            max_sge,
            lock: SpinFlag::new(),
            known_free: KnownFree::default(),
        }
    }

    /// The ring.
    #[must_use]
    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    /// Runs `check` each time the queue's lock is taken (before spinning
    /// on it). Set before the queue is shared; see [`LockCheck`].
    pub fn set_lock_check(&mut self, check: LockCheck) {
        self.lock.check = Some(check);
    }

    /// After posting: whether the HCA asks for the doorbell
    /// ([`crate::ring::DoorbellRequest::wanted`]; a full fence, then a read
    /// of the ring's request word). When it does not, the HCA finds what
    /// was posted when it needs a receive, and no doorbell is needed.
    #[must_use]
    pub fn doorbell_wanted(&self) -> bool {
        self.ring.doorbell_request().wanted()
    }

    /// Posts a receive buffer (scatter list). The caller then rings the
    /// doorbell (if [`RecvQueue::doorbell_wanted`]).
    ///
    /// # Errors
    /// [`PostError::Full`], [`PostError::TooManySge`]; nothing was posted.
    pub fn post(&self, wr_id: u64, sges: &[IvSge]) -> Result<(), PostError> {
        post_one(&self.lock, &self.known_free, &self.ring, |slots, index| {
            self.write(slots, index, &RecvWr { wr_id, sges })
        })
    }

    /// Writes `wrs` in order at the producer slots and publishes them
    /// together (one hold of the queue's lock, one producer index store):
    /// `ibv_post_recv` with a chain. The caller then rings the doorbell
    /// once.
    ///
    /// # Errors
    /// The index of the first work request not posted and why
    /// ([`PostError::Full`], [`PostError::TooManySge`]); the ones before it
    /// were posted.
    pub fn post_list(&self, wrs: &[RecvWr<'_>]) -> Result<(), (usize, PostError)> {
        post_each(
            &self.lock,
            &self.known_free,
            &self.ring,
            wrs,
            |slots, index, wr| self.write(slots, index, wr),
        )
    }

    /// Checks `wr` and writes it into the (free) slot `index`.
    #[inline(always)]
    fn write(&self, slots: Slots<'_>, index: u32, wr: &RecvWr<'_>) -> Result<(), PostError> {
        if wr.sges.len() > self.max_sge as usize {
            return Err(PostError::TooManySge);
        }
        let header = IvRecvWqe {
            wr_id: wr.wr_id,
            num_sge: wr.sges.len() as u32,
            reserved: 0,
        };
        let at = slots.offset(index);
        let region = slots.window;
        write_sges(region, at + IV_RECV_WQE_HEADER, wr.sges)
            .and_then(|()| region.write_obj(at, &header))
            .map_err(|OutOfBounds| PostError::Invalid)
    }
}

/// The body of `post_list` for either queue: under the queue's lock,
/// writes `items` at the producer slots (`write(index, item)`) into the
/// free slots `known` knows of (reading the consumer index when they run
/// out), stops at the first refusal or a full ring, and publishes what it
/// wrote with one producer index store.
fn post_each<T>(
    lock: &SpinFlag,
    known: &KnownFree,
    ring: &Ring,
    items: &[T],
    mut write: impl FnMut(Slots<'_>, u32, &T) -> Result<(), PostError>,
) -> Result<(), (usize, PostError)> {
    lock.with(|| {
        let p = ring.producer();
        let slots = ring.slots();
        let start = p.producer.load(Ordering::Relaxed);
        let mut free = known.get();
        let mut n = 0u32;
        let mut result = Ok(());
        for item in items {
            if n == free {
                // The slots it knew of are used: the consumer index again
                // (free slots from `start`, `n` of them written since).
                let fresh = wq_free(&p);
                if fresh <= n {
                    result = Err((n as usize, PostError::Full));
                    break;
                }
                free = fresh;
            }
            if let Err(e) = write(slots, start.wrapping_add(n), item) {
                result = Err((n as usize, e));
                break;
            }
            n += 1;
        }
        known.set(free - n);
        if n > 0 {
            p.publish(start.wrapping_add(n));
        }
        result
    })
}

/// Free slots of a work queue: its ring's free slots less the one a work
/// queue never fills ([`Ring::capacity`]).
#[inline]
fn wq_free(p: &crate::ring::Producer<'_, AtomicU32>) -> u32 {
    p.free().saturating_sub(1)
}

/// [`post_each`] for one work request, without the list's loop (the
/// common `post_send` of one WR): under the queue's lock, writes it at the
/// producer slot if one is free and publishes it.
fn post_one(
    lock: &SpinFlag,
    known: &KnownFree,
    ring: &Ring,
    write: impl FnOnce(Slots<'_>, u32) -> Result<(), PostError>,
) -> Result<(), PostError> {
    lock.with(|| {
        let p = ring.producer();
        let start = p.producer.load(Ordering::Relaxed);
        let mut free = known.get();
        if free == 0 {
            free = wq_free(&p);
            if free == 0 {
                return Err(PostError::Full);
            }
        }
        // On a refusal the bound it had stays a bound (the consumer only
        // moves forward).
        write(ring.slots(), start)?;
        known.set(free - 1);
        p.publish(start.wrapping_add(1));
        Ok(())
    })
}

/// A queue's free slots as its poster last saw them: the consumer index
/// only moves forward (the HCA frees slots; a reset empties the queue), so
/// free slots minus those posted since is a lower bound, and `post` reads
/// the consumer index (a cache line the HCA writes, on another processor)
/// only when that bound runs out, as a hardware driver tracks its queue's
/// tail instead of reading the device's. Read and written under the
/// queue's lock.
#[derive(Debug, Default)]
struct KnownFree(AtomicU32);

impl KnownFree {
    fn get(&self) -> u32 {
        self.0.load(Ordering::Relaxed)
    }

    fn set(&self, free: u32) {
        self.0.store(free, Ordering::Relaxed);
    }
}

/// A receive work request, as `post_recv` takes it in a list.
#[derive(Clone, Copy, Debug, Default)]
pub struct RecvWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Scatter list.
    pub sges: &'a [IvSge],
}

/// The ULP's side of a completion queue. Alone on its cache lines: its lock is
/// written by every post (poll), and two queues side by side in memory
/// (one process's CQs, say) may be used from two processors.
#[repr(align(128))]
pub struct CompletionQueue {
    ring: Ring,
    lock: SpinFlag,
    arm_seq: AtomicU32,
}

impl core::fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("ring", &self.ring)
            .finish_non_exhaustive()
    }
}

impl CompletionQueue {
    /// The CQ over `ring`.
    #[must_use]
    pub fn new(ring: Ring) -> Self {
        Self {
            ring,
            lock: SpinFlag::new(),
            arm_seq: AtomicU32::new(0),
        }
    }

    /// The ring.
    #[must_use]
    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    /// Runs `check` each time the queue's lock is taken (before spinning
    /// on it). Set before the queue is shared; see [`LockCheck`].
    pub fn set_lock_check(&mut self, check: LockCheck) {
        self.lock.check = Some(check);
    }

    /// Takes up to `out.len()` completions, oldest first.
    ///
    /// # Errors
    /// [`Corrupt`] if the HCA's producer index is impossible.
    pub fn poll(&self, out: &mut [IvCqe]) -> Result<usize, Corrupt> {
        self.lock.with(|| {
            let c = self.ring.consumer();
            let start = self.ring.consumer_word().load(Ordering::Relaxed);
            let slots = self.ring.slots();
            // The entries whose sequence words say they are in: the common
            // case reads one cache line per completion, never the producer
            // index.
            let mut n = 0;
            while n < out.len() {
                let index = start.wrapping_add(n as u32);
                let at = slots.offset(index);
                let seq = slots
                    .window
                    .atomic_u32(at + IV_CQE_SEQ_OFFSET)
                    .map_err(|OutOfBounds| Corrupt)?;
                if seq.load(Ordering::Acquire) != index.wrapping_add(1) {
                    break;
                }
                out[n] = slots.window.read_obj(at).map_err(|OutOfBounds| Corrupt)?;
                n += 1;
            }
            if n == 0 {
                // None by its sequence word: the producer index says (and
                // checks the indices; an HCA that leaves the word alone is
                // polled this way). Entries taken by their sequence words
                // may put the consumer index ahead of a producer index the
                // HCA has not stored yet: by at most the ring, and nothing
                // new then.
                let p = self.ring.producer_word().load(Ordering::Acquire);
                let entries = self.ring.entries();
                n = if p.wrapping_sub(start) <= entries {
                    (p.wrapping_sub(start) as usize).min(out.len())
                } else if start.wrapping_sub(p) <= entries {
                    0
                } else {
                    return Err(Corrupt);
                };
                for (i, slot) in out.iter_mut().take(n).enumerate() {
                    *slot = self.read(self.ring.slot_offset(start.wrapping_add(i as u32)))?;
                }
            }
            if n > 0 {
                c.release(start.wrapping_add(n as u32));
            }
            Ok(n)
        })
    }

    /// The entry at byte `at`.
    fn read(&self, at: usize) -> Result<IvCqe, Corrupt> {
        self.ring
            .region()
            .read_obj(at)
            .map_err(|OutOfBounds| Corrupt)
    }

    /// `req_notify_cq`: arms the CQ for the next completion (or the next
    /// solicited one). The caller then rings the CQ's arm doorbell; the HCA
    /// raises one completion event and disarms. Returns the arm word written.
    pub fn arm(&self, solicited_only: bool) -> u32 {
        let seq = self.arm_seq.fetch_add(1, Ordering::Relaxed).wrapping_add(1) & 0x3FFF_FFFF;
        let word = IV_CQ_ARM_NEXT
            | if solicited_only {
                IV_CQ_ARM_SOLICITED
            } else {
                0
            }
            | seq;
        self.ring.arm_word().store(word, Ordering::Release);
        word
    }
}

/// A send WQE as the HCA read it: a snapshot, validated before use.
#[derive(Clone, Copy, Debug)]
pub struct SendWqeSnapshot {
    /// The header.
    pub header: IvSendWqe,
    /// The gather list (`header.num_sge` entries are valid).
    pub sges: [IvSge; MAX_SGE],
}

/// Most SGEs a WQE may carry.
pub const MAX_SGE: usize = 32;

/// What is wrong with a WQE the ULP wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WqeError {
    /// More SGEs than the queue allows, or a slot too small for them.
    TooManySge,
    /// More inline data than the queue allows.
    InlineTooLong,
    /// Unknown opcode or flags, non-zero reserved field.
    Malformed,
}

/// The HCA's side: reads the send WQE at `index`, checked against the
/// queue's limits.
///
/// # Errors
/// [`WqeError`].
pub fn read_send_wqe(
    ring: &Ring,
    index: u32,
    max_sge: u32,
    max_inline: u32,
) -> Result<SendWqeSnapshot, WqeError> {
    let mut snap = SendWqeSnapshot {
        header: IvSendWqe::default(),
        sges: [IvSge::default(); MAX_SGE],
    };
    read_send_wqe_into(
        ring,
        index,
        max_sge,
        max_inline,
        &mut snap.header,
        &mut snap.sges,
    )?;
    Ok(snap)
}

/// The HCA's side, without an intermediate copy: reads the send WQE at
/// `index` straight into `header` and the first `num_sge` entries of `sges`
/// (the HCA's own shadow of the slot), checked against the queue's limits
/// and against `sges.len()`. Returns the number of SGEs read (0 with inline
/// data). On error `header` and `sges` hold unspecified values.
///
/// # Errors
/// [`WqeError`].
// Inlined into the HCA's requester: called, it cost the call, the spills
// around it and its result passed back (callgrind: 27 instructions per
// single-post SEND).
#[inline(always)]
pub fn read_send_wqe_into(
    ring: &Ring,
    index: u32,
    max_sge: u32,
    max_inline: u32,
    header: &mut IvSendWqe,
    sges: &mut [IvSge],
) -> Result<usize, WqeError> {
    let at = ring.slot_offset(index);
    ring.region()
        .read(at, header.as_mut_bytes())
        .map_err(|OutOfBounds| WqeError::Malformed)?;
    if header.opcode > IV_WR_REG_MR
        || header.flags & !(IV_SEND_SIGNALED | IV_SEND_SOLICITED | IV_SEND_INLINE | IV_SEND_FENCE)
            != 0
        || header.reserved != 0
    {
        return Err(WqeError::Malformed);
    }
    let room = ring.stride() as usize - IV_SEND_WQE_HEADER;
    if header.flags & IV_SEND_INLINE != 0 {
        if header.inline_len > max_inline || header.inline_len as usize > room {
            return Err(WqeError::InlineTooLong);
        }
        Ok(0)
    } else {
        let n = header.num_sge as usize;
        if n > max_sge as usize || n > MAX_SGE || n > sges.len() || n * 16 > room {
            return Err(WqeError::TooManySge);
        }
        read_sges(ring.region(), at + IV_SEND_WQE_HEADER, &mut sges[..n])
            .map_err(|OutOfBounds| WqeError::Malformed)?;
        Ok(n)
    }
}

/// Byte offset (in the ring's region) and length of a send WQE's inline data.
#[must_use]
pub fn inline_data(ring: &Ring, index: u32, snap: &SendWqeSnapshot) -> (usize, usize) {
    (
        ring.slot_offset(index) + IV_SEND_WQE_HEADER,
        snap.header.inline_len as usize,
    )
}

/// A receive WQE as the HCA read it.
#[derive(Clone, Copy, Debug)]
pub struct RecvWqeSnapshot {
    /// The work request id.
    pub wr_id: u64,
    /// SGEs.
    pub num_sge: usize,
    /// The scatter list.
    pub sges: [IvSge; MAX_SGE],
}

/// The HCA's side: reads the receive WQE at `index`.
///
/// # Errors
/// [`WqeError`].
pub fn read_recv_wqe(ring: &Ring, index: u32, max_sge: u32) -> Result<RecvWqeSnapshot, WqeError> {
    let mut snap = RecvWqeSnapshot {
        wr_id: 0,
        num_sge: 0,
        sges: [IvSge::default(); MAX_SGE],
    };
    let (wr_id, n) = read_recv_wqe_into(ring, index, max_sge, &mut snap.sges)?;
    snap.wr_id = wr_id;
    snap.num_sge = n;
    Ok(snap)
}

/// The HCA's side, without an intermediate copy: reads the receive WQE at
/// `index`, its scatter list straight into the first entries of `sges`
/// (checked against `max_sge` and `sges.len()`). Returns the work request
/// id and the number of SGEs.
///
/// # Errors
/// [`WqeError`].
// Inlined into the HCA's receive path: returned through memory, its
// result was read back as one 16-byte load over two 8-byte stores, a
// store-forwarding stall (`perf record -e cycles`: a tenth of the
// single-post SEND's fast path).
#[inline(always)]
pub fn read_recv_wqe_into(
    ring: &Ring,
    index: u32,
    max_sge: u32,
    sges: &mut [IvSge],
) -> Result<(u64, usize), WqeError> {
    let at = ring.slot_offset(index);
    let header: IvRecvWqe = ring
        .region()
        .read_obj(at)
        .map_err(|OutOfBounds| WqeError::Malformed)?;
    let n = header.num_sge as usize;
    if header.reserved != 0 {
        return Err(WqeError::Malformed);
    }
    if n > max_sge as usize
        || n > MAX_SGE
        || n > sges.len()
        || n * 16 > ring.stride() as usize - IV_RECV_WQE_HEADER
    {
        return Err(WqeError::TooManySge);
    }
    read_sges(ring.region(), at + IV_RECV_WQE_HEADER, &mut sges[..n])
        .map_err(|OutOfBounds| WqeError::Malformed)?;
    Ok((header.wr_id, n))
}

/// Reads `out.len()` SGEs at byte `at` of `region`: the common single SGE
/// as one fixed-size copy.
fn read_sges(region: &Region, at: usize, out: &mut [IvSge]) -> Result<(), OutOfBounds> {
    match out {
        [one] => {
            *one = region.read_obj(at)?;
            Ok(())
        }
        _ => region.read(at, out.as_mut_bytes()),
    }
}

/// Writes `sges` at byte `at` of `region`, each as one fixed-size copy: a
/// variable-length copy is a `memcpy` call, and the compiler merged the
/// single-SGE case into it (callgrind: 30 instructions more per single-SGE
/// post, the call and the spills around it).
fn write_sges(region: Window<'_>, at: usize, sges: &[IvSge]) -> Result<(), OutOfBounds> {
    match sges {
        [one] => region.write_obj(at, one),
        _ => {
            // The whole list's bounds first: nothing is written when it
            // does not fit.
            region.check(at, sges.len() * 16)?;
            for (k, sge) in sges.iter().enumerate() {
                region.write_obj(at + 16 * k, sge)?;
            }
            Ok(())
        }
    }
}

/// The CQ is full: the CQE was not written (a CQ overrun).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Overrun;

/// The HCA's side: appends a CQE.
///
/// # Errors
/// [`Overrun`] when the ULP has not consumed enough entries (or its
/// consumer index is corrupt).
pub fn push_cqe(ring: &Ring, cqe: &IvCqe) -> Result<(), Overrun> {
    let p = ring.producer();
    let index = p.next_free().ok_or(Overrun)?;
    write_cqe(ring, index, cqe)?;
    p.publish(index.wrapping_add(1));
    Ok(())
}

/// Writes `cqe` into slot `index`: everything but the sequence word, then
/// the sequence word (`index + 1`, release), so that a poller that sees it
/// sees the whole entry ([`IvCqe::seq`]).
#[inline(always)]
fn write_cqe(ring: &Ring, index: u32, cqe: &IvCqe) -> Result<(), Overrun> {
    let at = ring.slot_offset(index);
    let region = ring.region().window();
    write_cqe_body(region, at, cqe).map_err(|OutOfBounds| Overrun)?;
    region
        .atomic_u32(at + IV_CQE_SEQ_OFFSET)
        .map_err(|OutOfBounds| Overrun)?
        .store(index.wrapping_add(1), Ordering::Release);
    Ok(())
}

/// Writes everything of `cqe` but its sequence word at byte `at`, a field
/// at a time: inlined where the CQE is built, its fields go from registers
/// to the ring (a copy as bytes went through a CQE on the stack, and read
/// it back in loads wider than the stores that built it).
#[inline(always)]
fn write_cqe_body(w: Window<'_>, at: usize, cqe: &IvCqe) -> Result<(), OutOfBounds> {
    use core::mem::offset_of;
    const { assert!(offset_of!(IvCqe, seq) == IV_CQE_SEQ_OFFSET) };
    w.check(at, IV_CQE_SEQ_OFFSET)?;
    macro_rules! field {
        ($($f:ident),*) => {
            $(w.write_obj(at + offset_of!(IvCqe, $f), &cqe.$f)?;)*
        };
    }
    field!(
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
        reserved
    );
    Ok(())
}

/// The HCA's side: appends a CQE to a CQ that holds at most `limit`
/// entries (a CQ of 2^k - 1 entries on a ring of 2^k slots), for a writer
/// that keeps `room`, the free entries it last saw less those it wrote since (a lower bound: only
/// the ULP's polls free entries). It reads the ULP's consumer index (a
/// cache line the polling processor writes) only when `room` runs out.
/// Returns the producer index after the CQE.
///
/// # Errors
/// [`Overrun`] when `limit` entries (or the whole ring) are unconsumed, or
/// the ULP's consumer index is impossible.
// Inlined where the CQE is built (see `write_cqe_body`).
#[inline(always)]
pub fn push_cqe_room(ring: &Ring, cqe: &IvCqe, limit: u32, room: &mut u32) -> Result<u32, Overrun> {
    if *room == 0 {
        *room = cq_room(ring, limit);
        if *room == 0 {
            return Err(Overrun);
        }
    }
    let p = ring.producer_word().load(Ordering::Relaxed);
    write_cqe(ring, p, cqe)?;
    *room -= 1;
    let next = p.wrapping_add(1);
    ring.producer_word().store(next, Ordering::Release);
    Ok(next)
}

/// Free entries of a CQ ring that holds at most `limit`: 0 when it is full
/// or its consumer index is impossible.
#[must_use]
pub fn cq_room(ring: &Ring, limit: u32) -> u32 {
    let p = ring.producer_word().load(Ordering::Relaxed);
    let c = ring.consumer_word().load(Ordering::Acquire);
    limit.min(ring.entries()).saturating_sub(p.wrapping_sub(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sge(addr: u64) -> IvSge {
        IvSge {
            addr,
            length: 8,
            lkey: 0x101,
        }
    }

    #[test]
    fn post_list_publishes_what_it_wrote_and_stops_at_the_first_refusal() {
        let ring = Ring::alloc(4, send_stride(1, 0)).unwrap();
        let sq = SendQueue::new(ring.clone(), 1, 0);
        let sges = [sge(0x1000)];
        let wr = |wr_id| SendWr {
            wr_id,
            sges: &sges,
            ..Default::default()
        };
        let bad = SendWr {
            opcode: 0xEE,
            ..wr(99)
        };
        // A bad one in the middle: the one before it is posted.
        assert_eq!(
            sq.post_list(&[wr(1), bad, wr(2)]),
            Err((1, PostError::Invalid))
        );
        assert_eq!(ring.producer_word().load(Ordering::Relaxed), 1);
        // A queue of depth 3 (4 slots) with one posted: the third of four
        // is refused.
        assert_eq!(
            sq.post_list(&[wr(2), wr(3), wr(4), wr(5)]),
            Err((2, PostError::Full))
        );
        assert_eq!(ring.producer_word().load(Ordering::Relaxed), 3);
        let ids = [0, 1, 2].map(|i| read_send_wqe(&ring, i, 1, 0).unwrap().header.wr_id);
        assert_eq!(ids, [1, 2, 3]);
        assert_eq!(sq.post(&wr(6)), Err(PostError::Full));
        assert_eq!(sq.post_list(&[]), Ok(()));
    }

    #[test]
    fn recv_post_list_publishes_what_it_wrote_and_stops_at_the_first_refusal() {
        let ring = Ring::alloc(4, recv_stride(1)).unwrap();
        let rq = RecvQueue::new(ring.clone(), 1);
        let one = [sge(0x1000)];
        let two = [sge(0x1000), sge(0x2000)];
        let wr = |wr_id| RecvWr { wr_id, sges: &one };
        // Too many SGEs in the middle: the one before it is posted.
        assert_eq!(
            rq.post_list(&[
                wr(1),
                RecvWr {
                    wr_id: 99,
                    sges: &two
                },
                wr(2)
            ]),
            Err((1, PostError::TooManySge))
        );
        assert_eq!(ring.producer_word().load(Ordering::Relaxed), 1);
        // A queue of depth 3 (4 slots) with one posted: the third of four
        // is refused.
        assert_eq!(
            rq.post_list(&[wr(2), wr(3), wr(4), wr(5)]),
            Err((2, PostError::Full))
        );
        assert_eq!(ring.producer_word().load(Ordering::Relaxed), 3);
        let ids = [0, 1, 2].map(|i| read_recv_wqe(&ring, i, 1).unwrap().wr_id);
        assert_eq!(ids, [1, 2, 3]);
        assert_eq!(read_recv_wqe(&ring, 2, 1).unwrap().sges[0], one[0]);
        assert_eq!(rq.post(6, &one), Err(PostError::Full));
        assert_eq!(rq.post_list(&[]), Ok(()));
        assert_eq!(ring.producer_word().load(Ordering::Relaxed), 3);
        // The HCA takes two: two more fit (the consumer index is read
        // again once the free slots the queue knew of are used up).
        ring.consumer().release(2);
        assert_eq!(
            rq.post_list(&[wr(6), wr(7), wr(8)]),
            Err((2, PostError::Full))
        );
        assert_eq!(ring.producer_word().load(Ordering::Relaxed), 5);
        assert_eq!(read_recv_wqe(&ring, 4, 1).unwrap().wr_id, 7);
    }

    /// A queue that knows of free slots posts into them without reading
    /// the consumer index; when they run out it reads it again, and a
    /// consumer index that jumped (a reset emptying the queue) frees every
    /// slot.
    #[test]
    fn posts_track_free_slots_and_read_the_consumer_index_when_they_run_out() {
        let ring = Ring::alloc(8, send_stride(1, 0)).unwrap();
        let sq = SendQueue::new(ring.clone(), 1, 0);
        let sges = [sge(0x1000)];
        let wr = |wr_id| SendWr {
            wr_id,
            sges: &sges,
            ..Default::default()
        };
        let eight: [SendWr<'_>; 8] = core::array::from_fn(|i| wr(i as u64));
        assert_eq!(sq.post_list(&eight[..5]), Ok(()));
        // The consumer index moves while the queue (of depth 7) still
        // knows of two free slots: they are used first, then the index is
        // read again.
        ring.consumer().release(4);
        assert_eq!(
            sq.post_list(&eight),
            Err((6, PostError::Full)),
            "2 known + 4 freed"
        );
        assert_eq!(sq.post(&wr(9)), Err(PostError::Full));
        assert_eq!(ring.producer_word().load(Ordering::Relaxed), 11);
        // A reset: the HCA empties the queue (consumer = producer).
        ring.consumer().release(11);
        assert_eq!(sq.post_list(&eight), Err((7, PostError::Full)), "its depth");
        assert_eq!(sq.post(&wr(9)), Err(PostError::Full));
        // A consumer index past the producer (corrupt) frees nothing.
        ring.consumer().release(100);
        assert_eq!(sq.post(&wr(9)), Err(PostError::Full));
    }

    fn cqe(wr_id: u64) -> IvCqe {
        IvCqe {
            wr_id,
            byte_len: 8,
            ..IvCqe::default()
        }
    }

    /// A CQE written a field at a time lands byte for byte, every byte
    /// before the sequence word (a field left out of the list would not),
    /// and the sequence word says it is in.
    #[test]
    fn every_byte_of_a_cqe_reaches_the_ring() {
        use zerocopy::FromBytes;
        let mut bytes = [0u8; size_of::<IvCqe>()];
        for (k, b) in bytes.iter_mut().enumerate() {
            *b = (k as u8).wrapping_mul(7) | 1;
        }
        let cqe = IvCqe::read_from_bytes(&bytes).unwrap();
        let ring = Ring::alloc(4, 64).unwrap();
        push_cqe(&ring, &cqe).unwrap();
        let mut got = [0u8; size_of::<IvCqe>()];
        ring.region().read(ring.slot_offset(0), &mut got).unwrap();
        assert_eq!(got[..IV_CQE_SEQ_OFFSET], bytes[..IV_CQE_SEQ_OFFSET]);
        assert_eq!(
            got[IV_CQE_SEQ_OFFSET..IV_CQE_SEQ_OFFSET + 4],
            1u32.to_le_bytes()
        );
    }

    /// The HCA writes into the room it knows of without reading the
    /// consumer index, reads it again when that runs out, and finds the
    /// CQ full (or the index impossible) as an overrun.
    #[test]
    fn cqes_fill_the_known_room_then_read_the_consumer_index() {
        let ring = Ring::alloc(8, 64).unwrap();
        let cq = CompletionQueue::new(ring.clone());
        let mut out = [IvCqe::default(); 8];
        let mut room = 0;
        for k in 0..3 {
            assert_eq!(
                push_cqe_room(&ring, &cqe(k), 7, &mut room),
                Ok(k as u32 + 1)
            );
        }
        assert_eq!(room, 4, "a CQ of 7 with 3 in");
        // An impossible consumer index is not read while room is known.
        ring.consumer().release(1000);
        for k in 3..7 {
            push_cqe_room(&ring, &cqe(k), 7, &mut room).unwrap();
        }
        assert_eq!(push_cqe_room(&ring, &cqe(7), 7, &mut room), Err(Overrun));
        ring.consumer().release(0);
        assert_eq!(
            push_cqe_room(&ring, &cqe(7), 7, &mut room),
            Err(Overrun),
            "full"
        );
        assert_eq!(cq.poll(&mut out[..5]), Ok(5));
        assert_eq!(push_cqe_room(&ring, &cqe(7), 7, &mut room), Ok(8));
        assert_eq!(room, 4);
        assert_eq!(cq.poll(&mut out), Ok(3));
        assert_eq!(
            out[..3]
                .iter()
                .map(|c| c.wr_id)
                .collect::<alloc::vec::Vec<_>>(),
            [5, 6, 7]
        );
    }

    /// A CQE is taken by its sequence word, without the producer index;
    /// an entry of the previous lap is not; the producer index still
    /// delivers an entry written without one.
    #[test]
    fn poll_takes_entries_by_their_sequence_word() {
        let ring = Ring::alloc(2, 64).unwrap();
        let cq = CompletionQueue::new(ring.clone());
        let mut out = [IvCqe::default(); 4];
        assert_eq!(cq.poll(&mut out), Ok(0), "a zeroed ring is empty");
        push_cqe(&ring, &cqe(1)).unwrap();
        push_cqe(&ring, &cqe(2)).unwrap();
        // The producer index not seen yet: the sequence words suffice.
        ring.producer_word().store(0, Ordering::Relaxed);
        assert_eq!(cq.poll(&mut out), Ok(2));
        assert_eq!((out[0].wr_id, out[0].seq), (1, 1));
        assert_eq!((out[1].wr_id, out[1].seq), (2, 2));
        ring.producer_word().store(2, Ordering::Relaxed);
        // Both slots hold the previous lap's entries (sequence 1 and 2; 3
        // and 4 expected): nothing.
        assert_eq!(cq.poll(&mut out), Ok(0));
        // An entry written without its sequence word, then published.
        ring.region()
            .write_obj(ring.slot_offset(2), &cqe(3))
            .unwrap();
        ring.producer().publish(3);
        assert_eq!(cq.poll(&mut out), Ok(1));
        assert_eq!(out[0].wr_id, 3);
        // Taken by its sequence word before the HCA stored the producer
        // index: the consumer index is ahead of it, which is no
        // corruption, and nothing more is there.
        push_cqe(&ring, &cqe(4)).unwrap();
        ring.producer_word().store(3, Ordering::Relaxed);
        assert_eq!(cq.poll(&mut out), Ok(1));
        assert_eq!(out[0].wr_id, 4);
        assert_eq!(cq.poll(&mut out), Ok(0), "consumer 4, producer 3");
        ring.producer_word().store(4, Ordering::Relaxed);
        assert_eq!(cq.poll(&mut out), Ok(0));
        // A producer index past the consumer by more than the ring, or
        // behind it by more than the ring.
        ring.producer().publish(9);
        assert_eq!(cq.poll(&mut out), Err(Corrupt));
        ring.producer().publish(2);
        assert_eq!(
            cq.poll(&mut out),
            Ok(0),
            "behind by the ring: not stored yet"
        );
        ring.producer().publish(1);
        assert_eq!(
            cq.poll(&mut out),
            Err(Corrupt),
            "behind by more than the ring"
        );
    }

    /// The single-SGE path writes the slot byte for byte as the general
    /// path does, for every opcode and flag combination it takes, and
    /// leaves the rest to the general path's checks.
    #[test]
    fn the_single_sge_path_writes_what_the_general_path_writes() {
        let sges = [IvSge {
            addr: 0x1234_5678_9abc,
            length: 77,
            lkey: 0xabc01,
        }];
        for opcode in 0..=IV_WR_REG_MR + 1 {
            for flags in 0..=0x1fu8 {
                let wr = SendWr {
                    wr_id: 0x1111_2222_3333_4444 ^ u64::from(opcode) << 8 ^ u64::from(flags),
                    opcode,
                    flags,
                    sges: &sges,
                    inline: None,
                    imm_or_inv: 0x5566_7788,
                    remote_addr: 0x99aa_bbcc_ddee_ff00,
                    rkey: 0x4321,
                    compare_add: 0x0102_0304_0506_0708,
                    swap: 0x1112_1314_1516_1718,
                    ud: None,
                };
                let (a, b) = (
                    Ring::alloc(4, send_stride(2, 0)).unwrap(),
                    Ring::alloc(4, send_stride(2, 0)).unwrap(),
                );
                let (qa, qb) = (
                    SendQueue::new(a.clone(), 2, 0),
                    SendQueue::new(b.clone(), 2, 0),
                );
                let fast = qa.write(a.slots(), 1, &wr);
                let general = qb.write_general(b.slots(), 1, &wr);
                assert_eq!(fast, general, "opcode {opcode} flags {flags:#x}");
                let mut bytes = [[0u8; 128]; 2];
                a.region().read(a.slot_offset(1), &mut bytes[0]).unwrap();
                b.region().read(b.slot_offset(1), &mut bytes[1]).unwrap();
                assert_eq!(bytes[0], bytes[1], "opcode {opcode} flags {flags:#x}");
            }
        }
    }

    #[test]
    fn post_send_then_hca_reads_the_same_wqe() {
        let ring = Ring::alloc(8, send_stride(4, 64)).unwrap();
        let sq = SendQueue::new(ring.clone(), 4, 64);
        let sges = [sge(0x1000), sge(0x2000)];
        sq.post(&SendWr {
            wr_id: 9,
            opcode: IV_WR_RDMA_WRITE,
            flags: IV_SEND_SIGNALED,
            sges: &sges,
            remote_addr: 0x55,
            rkey: 7,
            ..Default::default()
        })
        .unwrap();
        sq.post(&SendWr {
            wr_id: 10,
            inline: Some(b"hello"),
            ..Default::default()
        })
        .unwrap();
        let c = ring.consumer();
        let i = c.next_filled().unwrap().unwrap();
        let w = read_send_wqe(&ring, i, 4, 64).unwrap();
        assert_eq!(
            (
                w.header.wr_id,
                w.header.opcode,
                w.header.num_sge,
                w.header.rkey
            ),
            (9, IV_WR_RDMA_WRITE, 2, 7)
        );
        assert_eq!(&w.sges[..2], &sges);
        let w2 = read_send_wqe(&ring, i + 1, 4, 64).unwrap();
        assert_eq!(w2.header.flags & IV_SEND_INLINE, IV_SEND_INLINE);
        let (off, len) = inline_data(&ring, i + 1, &w2);
        let mut buf = [0u8; 5];
        ring.region().read(off, &mut buf[..len]).unwrap();
        assert_eq!(&buf, b"hello");
    }

    #[test]
    fn post_refuses_what_does_not_fit() {
        // Depth 1: 2 slots.
        let ring = Ring::alloc(2, send_stride(1, 16)).unwrap();
        let sq = SendQueue::new(ring, 1, 16);
        let two = [sge(1), sge(2)];
        assert_eq!(
            sq.post(&SendWr {
                sges: &two,
                ..Default::default()
            }),
            Err(PostError::TooManySge)
        );
        assert_eq!(
            sq.post(&SendWr {
                inline: Some(&[0; 17]),
                ..Default::default()
            }),
            Err(PostError::InlineTooLong)
        );
        assert_eq!(
            sq.post(&SendWr {
                opcode: 99,
                ..Default::default()
            }),
            Err(PostError::Invalid)
        );
        sq.post(&SendWr::default()).unwrap();
        assert_eq!(sq.post(&SendWr::default()), Err(PostError::Full));
    }

    #[test]
    fn the_hca_rejects_garbage_wqes() {
        let ring = Ring::alloc(2, 64).unwrap();
        let bad = IvSendWqe {
            opcode: 200,
            ..Default::default()
        };
        ring.region().write_obj(ring.slot_offset(0), &bad).unwrap();
        assert_eq!(
            read_send_wqe(&ring, 0, 4, 0).err(),
            Some(WqeError::Malformed)
        );
        let many = IvSendWqe {
            num_sge: 3,
            ..Default::default()
        };
        ring.region().write_obj(ring.slot_offset(0), &many).unwrap();
        assert_eq!(
            read_send_wqe(&ring, 0, 32, 0).err(),
            Some(WqeError::TooManySge),
            "3 SGEs don't fit a 64-byte slot"
        );
        let long = IvSendWqe {
            flags: IV_SEND_INLINE,
            inline_len: 1000,
            ..Default::default()
        };
        ring.region().write_obj(ring.slot_offset(0), &long).unwrap();
        assert_eq!(
            read_send_wqe(&ring, 0, 4, 2000).err(),
            Some(WqeError::InlineTooLong)
        );
    }

    #[test]
    fn reading_into_a_shadow_copies_only_the_sges_named() {
        let ring = Ring::alloc(4, send_stride(4, 0)).unwrap();
        let sq = SendQueue::new(ring.clone(), 4, 0);
        let sges = [sge(0x10), sge(0x20), sge(0x30)];
        sq.post(&SendWr {
            wr_id: 5,
            sges: &sges,
            ..Default::default()
        })
        .unwrap();
        let mut header = IvSendWqe::default();
        let mut shadow = [IvSge::default(); 4];
        assert_eq!(
            read_send_wqe_into(&ring, 0, 4, 0, &mut header, &mut shadow),
            Ok(3)
        );
        assert_eq!((header.wr_id, &shadow[..3]), (5, &sges[..]));
        assert_eq!(shadow[3], IvSge::default(), "untouched");
        let mut small = [IvSge::default(); 2];
        assert_eq!(
            read_send_wqe_into(&ring, 0, 4, 0, &mut header, &mut small),
            Err(WqeError::TooManySge),
            "the shadow is a limit too"
        );

        let rq_ring = Ring::alloc(4, recv_stride(2)).unwrap();
        let rq = RecvQueue::new(rq_ring.clone(), 2);
        rq.post(9, &sges[..2]).unwrap();
        let mut shadow = [IvSge::default(); 2];
        assert_eq!(read_recv_wqe_into(&rq_ring, 0, 2, &mut shadow), Ok((9, 2)));
        assert_eq!(shadow, [sges[0], sges[1]]);
        assert_eq!(
            read_recv_wqe_into(&rq_ring, 0, 2, &mut shadow[..1]),
            Err(WqeError::TooManySge)
        );
    }

    #[test]
    fn recv_and_cq_round_trip() {
        let rq_ring = Ring::alloc(4, recv_stride(2)).unwrap();
        let rq = RecvQueue::new(rq_ring.clone(), 2);
        rq.post(77, &[sge(0x10)]).unwrap();
        let w = read_recv_wqe(&rq_ring, 0, 2).unwrap();
        assert_eq!((w.wr_id, w.num_sge, w.sges[0].addr), (77, 1, 0x10));

        let cq_ring = Ring::alloc(2, 64).unwrap();
        let cq = CompletionQueue::new(cq_ring.clone());
        let mut out = [IvCqe::default(); 4];
        assert_eq!(cq.poll(&mut out), Ok(0));
        push_cqe(
            &cq_ring,
            &IvCqe {
                wr_id: 1,
                ..Default::default()
            },
        )
        .unwrap();
        push_cqe(
            &cq_ring,
            &IvCqe {
                wr_id: 2,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(push_cqe(&cq_ring, &IvCqe::default()), Err(Overrun));
        let mut room = 0;
        assert_eq!(
            push_cqe_room(&cq_ring, &IvCqe::default(), 5, &mut room),
            Err(Overrun),
            "the ring is the limit too"
        );
        assert_eq!(cq.poll(&mut out[..1]), Ok(1));
        assert_eq!(out[0].wr_id, 1);
        assert_eq!(cq.poll(&mut out), Ok(1));
        assert_eq!(out[0].wr_id, 2);
        assert_eq!(
            push_cqe_room(&cq_ring, &IvCqe::default(), 1, &mut room),
            Ok(3)
        );
        assert_eq!(
            push_cqe_room(&cq_ring, &IvCqe::default(), 1, &mut room),
            Err(Overrun),
            "a CQ of 1 on a ring of 2"
        );
        assert_eq!(cq.poll(&mut out), Ok(1));
        let w = cq.arm(true);
        assert_eq!(
            w & (IV_CQ_ARM_NEXT | IV_CQ_ARM_SOLICITED),
            IV_CQ_ARM_NEXT | IV_CQ_ARM_SOLICITED
        );
        assert_eq!(cq_ring.arm_word().load(Ordering::Acquire), w);
    }
}
