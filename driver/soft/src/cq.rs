//! Completion queues.
//!
//! A CQ is a ring of 2^k slots holding up to 2^k - 1 completions; creating
//! or resizing rounds the number asked up to that size. The ring itself
//! belongs to the data path (a later stage); the firmware keeps its size.

use irpverbs_abi::{NtStatus, STATUS_INSUFFICIENT_RESOURCES, STATUS_INVALID_PARAMETER};
use irpverbs_core::CommandOut;

use crate::config::ring_entries;
use crate::firmware::{Firmware, Refs};

/// A completion queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Cq {
    /// Entries it holds (2^k - 1).
    pub(crate) cqe: u32,
    /// Completion vector.
    pub(crate) comp_vector: u32,
    /// Completions it holds now (always 0 until the data path exists).
    pub(crate) used: u32,
    /// The ring CQEs are written to.
    pub(crate) ring: crate::shared::RingRef,
    /// QPs whose send or receive queue completes here (a QP using it for
    /// both counts twice).
    pub(crate) refs: Refs,
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
    pub(crate) fn create_cq(&mut self, cqe: u32, comp_vector: u32) -> Result<CommandOut, NtStatus> {
        let cqe = self.cq_entries(cqe)?;
        if comp_vector >= self.config.num_comp_vectors {
            return Err(STATUS_INVALID_PARAMETER);
        }
        let ring = crate::shared::RingRef::alloc(cqe + 1, 64)?;
        let cqn = self.cqs.insert(Cq {
            cqe,
            comp_vector,
            used: 0,
            ring: ring.clone(),
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
        let used = self.cqs.get(cqn)?.used;
        let cqe = self.cq_entries(cqe)?;
        if cqe < used {
            return Err(STATUS_INVALID_PARAMETER);
        }
        let ring = crate::shared::RingRef::alloc(cqe + 1, 64)?;
        let cq = self.cqs.get_mut(cqn)?;
        cq.cqe = cqe;
        cq.ring = ring.clone();
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
        self.cqs.remove(cqn)?;
        Ok(CommandOut::None)
    }
}

#[cfg(test)]
mod tests {
    use crate::testutil::Dev;
    use irpverbs_abi::{
        STATUS_DEVICE_BUSY, STATUS_INSUFFICIENT_RESOURCES, STATUS_INVALID_HANDLE,
        STATUS_INVALID_PARAMETER,
    };
    use irpverbs_core::{Command, CommandOut};

    #[test]
    fn create_rounds_up() {
        let d = Dev::inline();
        for (asked, got) in [(1, 1), (2, 3), (3, 3), (4, 7), (100, 127), (0x7FFF, 0x7FFF)] {
            let CommandOut::Cq { cqn, cqe, .. } = d.ok(Command::CreateCq {
                cqe: asked,
                comp_vector: 3,
            }) else {
                panic!()
            };
            assert_eq!(cqe, got, "asked {asked}");
            assert_eq!(d.snapshot().cqs.get(cqn).unwrap().cqe, got);
            d.ok(Command::DestroyCq { cqn });
        }
        assert_eq!(d.hca.live_objects(), 0);
    }

    #[test]
    fn create_validation() {
        let d = Dev::with(|c| c.max_cq = 1);
        let create = |cqe, comp_vector| Command::CreateCq { cqe, comp_vector };
        d.fails(create(0, 0), STATUS_INVALID_PARAMETER);
        d.fails(create(0x8000, 0), STATUS_INSUFFICIENT_RESOURCES);
        d.fails(create(u32::MAX, 0), STATUS_INSUFFICIENT_RESOURCES);
        d.fails(create(1, 4), STATUS_INVALID_PARAMETER);
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
