//! Completion queues.
//!
//! A CQ is a ring of 2^k slots holding up to 2^k - 1 completions; creating
//! or resizing rounds the number asked up to that size. The data path
//! appends CQEs with [`post_cqe`]; the ULP polls them.
//!
//! Notification: the ULP's `req_notify_cq` writes the ring's arm word
//! (`IV_CQ_ARM_NEXT`, optionally `IV_CQ_ARM_SOLICITED`) and rings the arm
//! doorbell. After writing a CQE the HCA reads the arm word; if it is armed
//! and the CQE qualifies (any CQE; with `IV_CQ_ARM_SOLICITED` only a
//! solicited receive or an error) it disarms it (clears the two flags with
//! a compare-and-swap, so a concurrent re-arm is never lost: at worst it
//! fires once more) and posts [`Event::Completion`]. The arm doorbell fires
//! at once when qualifying CQEs wait unpolled.
//!
//! A CQE that does not fit is a CQ overrun: the CQ enters its error state
//! (no CQE is written to it any more), [`AsyncEvent::CqError`] is raised
//! and every QP completing on it goes to ERR.

use core::sync::atomic::Ordering;

use irpverbs_abi::{
    IV_CQ_ARM_NEXT, IV_CQ_ARM_SOLICITED, IV_WC_SUCCESS, IvCqe, NtStatus,
    STATUS_INSUFFICIENT_RESOURCES, STATUS_INVALID_PARAMETER,
};
use irpverbs_core::{AsyncEvent, CommandOut, CreateCq, Event};
use irpverbs_ring::wq::{cq_room, push_cqe, push_cqe_room};

use crate::config::ring_entries;
use crate::firmware::datapath::DataPath;
use crate::firmware::table::Table;
use crate::firmware::{Firmware, Refs};

/// A completion queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Cq {
    /// Entries it holds (2^k - 1).
    pub(crate) cqe: u32,
    /// Completion vector.
    pub(crate) comp_vector: u32,
    /// Overran: nothing is written to it any more.
    pub(crate) error: bool,
    /// Producer index after the last solicited or error CQE.
    pub(crate) last_sol: u32,
    /// The ring CQEs are written to.
    pub(crate) ring: crate::firmware::shared::RingRef,
    /// Free entries as last read from the ring, less the CQEs written
    /// since ([`push_cqe_room`]): the ULP's consumer index is read only
    /// when they run out.
    pub(crate) room: u32,
    /// QPs whose send or receive queue completes here (a QP using it for
    /// both counts twice).
    pub(crate) refs: Refs,
}

impl Cq {
    /// Completions written and not polled.
    pub(crate) fn used(&self) -> u32 {
        let ring = &self.ring.0;
        ring.consumer().filled().unwrap_or(ring.entries())
    }

    /// Whether a CQE fits (reading the consumer index only when the room
    /// it knew of is used up).
    pub(crate) fn has_room(&mut self) -> bool {
        if self.room == 0 {
            self.room = cq_room(&self.ring.0, self.cqe);
        }
        self.room > 0
    }

    /// Copies the `used` unpolled completions to `new` (a resize), oldest
    /// first, and carries the solicited mark over.
    fn move_to(&mut self, new: &irpverbs_ring::Ring, used: u32) {
        let old = &self.ring.0;
        let c = old.consumer_word().load(Ordering::Acquire);
        for k in 0..used {
            let cqe: IvCqe = old
                .region()
                .read_obj(old.slot_offset(c.wrapping_add(k)))
                .unwrap_or_default();
            let _ = push_cqe(new, &cqe);
        }
        let sol = self.last_sol.wrapping_sub(c);
        self.last_sol = if sol != 0 && sol <= used { sol } else { 0 };
    }

    /// If armed, and a completion it would fire for waits unpolled,
    /// disarms it and returns true (`cq_arm_doorbell`).
    pub(crate) fn check_armed(&mut self) -> bool {
        let ring = &self.ring.0;
        let arm = ring.arm_word();
        let w = arm.load(Ordering::Acquire);
        if w & IV_CQ_ARM_NEXT == 0 {
            return false;
        }
        let c = ring.consumer_word().load(Ordering::Acquire);
        let p = ring.producer_word().load(Ordering::Relaxed);
        let pending = if w & IV_CQ_ARM_SOLICITED != 0 {
            let d = self.last_sol.wrapping_sub(c);
            d != 0 && d <= p.wrapping_sub(c)
        } else {
            p != c
        };
        if pending {
            disarm(arm, w);
        }
        pending
    }
}

fn disarm(arm: &core::sync::atomic::AtomicU32, w: u32) {
    let _ = arm.compare_exchange(
        w,
        w & !(IV_CQ_ARM_NEXT | IV_CQ_ARM_SOLICITED),
        Ordering::AcqRel,
        Ordering::Relaxed,
    );
}

/// Appends `cqe` to CQ `cqn` and fires its completion event if it is armed
/// for it (`solicited`: a solicited receive). Returns false when the CQE
/// was not written: no such CQ, or it overran (now or before).
pub(crate) fn post_cqe(
    cqs: &mut Table<Cq>,
    dp: &mut DataPath,
    cqn: u32,
    cqe: &IvCqe,
    solicited: bool,
) -> bool {
    post_cqe_inline(cqs, dp, cqn, cqe, solicited)
}

/// [`post_cqe`], inlined where the CQE is built (the fast path's receive
/// completion): called, the CQE the caller had just stored field by field
/// was read back in 16-byte loads, a store-forwarding stall per message
/// (`perf record -e cycles`: a fifth of `post_cqe`'s cycles).
#[inline(always)]
pub(crate) fn post_cqe_inline(
    cqs: &mut Table<Cq>,
    dp: &mut DataPath,
    cqn: u32,
    cqe: &IvCqe,
    solicited: bool,
) -> bool {
    let Ok(cq) = cqs.get_mut(cqn) else {
        return false;
    };
    if cq.error {
        dp.stats.cqes_lost += 1;
        return false;
    }
    let ring = &cq.ring.0;
    // The ring has a slot more than the CQ's size: the size is the limit.
    let Ok(produced) = push_cqe_room(ring, cqe, cq.cqe, &mut cq.room) else {
        overran(cq, dp, cqn);
        return false;
    };
    let qualifies = solicited || cqe.status != IV_WC_SUCCESS;
    if qualifies {
        cq.last_sol = produced;
    }
    let arm = ring.arm_word();
    let w = arm.load(Ordering::Acquire);
    if w & IV_CQ_ARM_NEXT != 0 && (w & IV_CQ_ARM_SOLICITED == 0 || qualifies) {
        disarm(arm, w);
        dp.event(Event::Completion { cqn });
    }
    true
}

/// CQ `cqn` overran: it is in error from now on, and its async event and
/// the engine's flush of it are queued.
#[cold]
fn overran(cq: &mut Cq, dp: &mut DataPath, cqn: u32) {
    cq.error = true;
    dp.stats.cqes_lost += 1;
    dp.raise(AsyncEvent::CqError(cqn));
    // Room for every CQ was reserved at its create.
    crate::firmware::shared::push(&mut dp.cq_errors, cqn);
}

impl Firmware {
    /// The actual size of a CQ of at least `cqe` entries.
    fn cq_entries(&self, cqe: u32) -> Result<u32, NtStatus> {
        if cqe == 0 {
            Err(STATUS_INVALID_PARAMETER)
        } else if cqe > self.config.max_cqe {
            Err(STATUS_INSUFFICIENT_RESOURCES)
        } else {
            Ok(ring_entries(cqe))
        }
    }

    /// `CreateCq`: returns the CQN and the actual size (2^k - 1 >= `cqe`).
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER` for `cqe` 0 or a completion vector past
    /// `num_comp_vectors`; `STATUS_INSUFFICIENT_RESOURCES` for `cqe` above
    /// `max_cqe` or when `max_cq` CQs exist.
    pub(crate) fn create_cq(&mut self, c: &CreateCq) -> Result<CommandOut, NtStatus> {
        let CreateCq { cqe, comp_vector } = *c;
        let cqe = self.cq_entries(cqe)?;
        if comp_vector >= self.config.num_comp_vectors {
            return Err(STATUS_INVALID_PARAMETER);
        }
        // Room for this CQ in the data path's list of overrun CQs.
        crate::firmware::shared::room_for(&mut self.dp.cq_errors, self.cqs.len() + 1)?;
        let ring = self.rings.alloc(0, cqe + 1, 64)?;
        let cqn = self.cqs.insert(Cq {
            cqe,
            comp_vector,
            error: false,
            last_sol: 0,
            ring: ring.clone(),
            room: 0,
            refs: Refs::default(),
        })?;
        Ok(CommandOut::Cq {
            cqn,
            cqe,
            ring: ring.0,
        })
    }

    /// `ResizeCq`: returns the CQN and the new actual size.
    ///
    /// # Errors
    /// `STATUS_INVALID_HANDLE` for an unknown CQN; `STATUS_INVALID_PARAMETER`
    /// for `cqe` 0 or below the completions the CQ holds;
    /// `STATUS_INSUFFICIENT_RESOURCES` for `cqe` above `max_cqe`.
    pub(crate) fn resize_cq(&mut self, cqn: u32, cqe: u32) -> Result<CommandOut, NtStatus> {
        let used = self.cqs.get(cqn)?.used();
        let cqe = self.cq_entries(cqe)?;
        if cqe < used {
            return Err(STATUS_INVALID_PARAMETER);
        }
        let ring = self.rings.alloc(0, cqe + 1, 64)?;
        let cq = self.cqs.get_mut(cqn)?;
        cq.move_to(&ring.0, used);
        cq.cqe = cqe;
        cq.room = 0;
        let old = core::mem::replace(&mut cq.ring, ring.clone());
        self.rings.retire(old);
        Ok(CommandOut::Cq {
            cqn,
            cqe,
            ring: ring.0,
        })
    }

    /// `DestroyCq`.
    ///
    /// # Errors
    /// `STATUS_INVALID_HANDLE` for an unknown CQN; `STATUS_DEVICE_BUSY` while
    /// a QP uses it.
    pub(crate) fn destroy_cq(&mut self, cqn: u32) -> Result<CommandOut, NtStatus> {
        self.cqs.get(cqn)?.refs.check_idle()?;
        let cq = self.cqs.remove(cqn)?;
        self.dp.cq_errors.retain(|&c| c != cqn);
        self.rings.retire(cq.ring);
        self.doorbells
            .unbind(irpverbs_core::DoorbellTarget::CqArm(cqn));
        Ok(CommandOut::None)
    }
}

#[cfg(test)]
mod tests {
    use crate::tests::util::Dev;
    use irpverbs_abi::{
        STATUS_DEVICE_BUSY, STATUS_INSUFFICIENT_RESOURCES, STATUS_INVALID_HANDLE,
        STATUS_INVALID_PARAMETER,
    };
    use irpverbs_core::{Command, CommandOut, CreateCq};

    #[test]
    fn create_rounds_up() {
        let d = Dev::inline();
        for (asked, got) in [(1, 1), (2, 3), (3, 3), (4, 7), (100, 127), (0x7FFF, 0x7FFF)] {
            let CommandOut::Cq { cqn, cqe, .. } = d.ok(Command::CreateCq(CreateCq {
                cqe: asked,
                comp_vector: 1,
            })) else {
                panic!()
            };
            assert_eq!(cqe, got, "asked {asked}");
            assert_eq!(d.snapshot().cqs.get(cqn).unwrap().cqe, got);
            d.ok(Command::DestroyCq { cqn });
        }
        assert_eq!(d.hca.live_objects(), 0);
    }

    /// A destroyed CQ's ring memory comes back, zeroed, for a CQ of the
    /// same size, but only once nothing else references it.
    #[test]
    fn ring_memory_is_reused_zeroed_once_unreferenced() {
        let d = Dev::inline();
        let create = || {
            let CommandOut::Cq { cqn, ring, .. } = d.ok(Command::CreateCq(CreateCq {
                cqe: 7,
                comp_vector: 0,
            })) else {
                panic!()
            };
            (cqn, ring)
        };
        let (a, ring_a) = create();
        let addr_a = ring_a.region().addr();
        ring_a
            .region()
            .fill(0, ring_a.region().len(), 0xAB)
            .unwrap();
        d.ok(Command::DestroyCq { cqn: a });
        // The driver still holds its view of A's ring: not reused.
        let (b, ring_b) = create();
        assert_ne!(ring_b.region().addr(), addr_a);
        drop(ring_a);
        let (c, ring_c) = create();
        assert_eq!(ring_c.region().addr(), addr_a, "reused");
        let mut bytes = alloc::vec![0xFFu8; ring_c.region().len()];
        ring_c.region().read(0, &mut bytes).unwrap();
        assert!(bytes.iter().all(|&b| b == 0), "zeroed before reuse");
        d.ok(Command::DestroyCq { cqn: b });
        d.ok(Command::DestroyCq { cqn: c });
        assert_eq!(d.hca.live_objects(), 0);
    }

    #[test]
    fn create_validation() {
        let d = Dev::with(|c| c.max_cq = 1);
        let create = |cqe, comp_vector| Command::CreateCq(CreateCq { cqe, comp_vector });
        d.fails(create(0, 0), STATUS_INVALID_PARAMETER);
        d.fails(create(0x8000, 0), STATUS_INSUFFICIENT_RESOURCES);
        d.fails(create(u32::MAX, 0), STATUS_INSUFFICIENT_RESOURCES);
        // Vectors 0 and 1 (the default 2): the third is refused.
        d.fails(create(1, 2), STATUS_INVALID_PARAMETER);
        d.fails(create(1, u32::MAX), STATUS_INVALID_PARAMETER);
        d.ok(create(1, 0));
        d.fails(create(1, 0), STATUS_INSUFFICIENT_RESOURCES);
    }

    #[test]
    fn resize() {
        let d = Dev::inline();
        let cqn = d.cq(10);
        let CommandOut::Cq { cqn: n, cqe, ring } = d.ok(Command::ResizeCq { cqn, cqe: 1000 })
        else {
            panic!("not a CQ")
        };
        assert_eq!((n, cqe, ring.entries()), (cqn, 1023, 1024));
        let CommandOut::Cq { cqn: n, cqe, ring } = d.ok(Command::ResizeCq { cqn, cqe: 1 }) else {
            panic!("not a CQ")
        };
        assert_eq!((n, cqe, ring.entries()), (cqn, 1, 2));
        d.fails(Command::ResizeCq { cqn, cqe: 0 }, STATUS_INVALID_PARAMETER);
        d.fails(
            Command::ResizeCq { cqn, cqe: 0x8000 },
            STATUS_INSUFFICIENT_RESOURCES,
        );
        d.fails(
            Command::ResizeCq {
                cqn: cqn + 1,
                cqe: 1,
            },
            STATUS_INVALID_HANDLE,
        );
        d.fails(Command::ResizeCq { cqn: 0, cqe: 1 }, STATUS_INVALID_HANDLE);
    }

    #[test]
    fn destroy() {
        let d = Dev::inline();
        let cqn = d.cq(1);
        d.fails(Command::DestroyCq { cqn: cqn + 1 }, STATUS_INVALID_HANDLE);
        d.ok(Command::DestroyCq { cqn });
        d.fails(Command::DestroyCq { cqn }, STATUS_INVALID_HANDLE);
    }

    #[test]
    fn cq_used_by_a_qp_is_busy() {
        let d = Dev::inline();
        let pdn = d.pd();
        let scq = d.cq(1);
        let rcq = d.cq(1);
        let qpn = d.qp_with(pdn, scq, rcq, None);
        let both = d.qp(pdn, scq, None);
        for cqn in [scq, rcq] {
            d.fails(Command::DestroyCq { cqn }, STATUS_DEVICE_BUSY);
        }
        d.ok(Command::DestroyQp { qpn });
        d.ok(Command::DestroyCq { cqn: rcq });
        d.fails(Command::DestroyCq { cqn: scq }, STATUS_DEVICE_BUSY);
        d.ok(Command::DestroyQp { qpn: both });
        d.ok(Command::DestroyCq { cqn: scq });
    }
}
