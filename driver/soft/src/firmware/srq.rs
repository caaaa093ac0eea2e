//! Shared receive queues.
//!
//! Like every work queue, an SRQ is a ring of 2^k slots holding up to
//! 2^k - 1 WRs; the depth asked is rounded up. Responders of the QPs
//! attached take WQEs from it in order (`responder.rs`); when fewer than
//! an armed limit are left, `SrqLimitReached` is raised and the limit
//! disarmed. Resizing changes the depth reported; the ring keeps its
//! slots.

use irpverbs_abi::{
    IV_SRQ_LIMIT, IV_SRQ_MAX_WR, IvQuerySrqOut, NtStatus, STATUS_INSUFFICIENT_RESOURCES,
    STATUS_INVALID_PARAMETER,
};
use irpverbs_core::{CommandOut, CreateSrq, ModifySrq};

use crate::config::ring_entries;
use crate::firmware::{Firmware, Refs};

/// A shared receive queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Srq {
    /// Its PD.
    pub(crate) pdn: u32,
    /// Depth (2^k - 1).
    pub(crate) max_wr: u32,
    /// SGEs per WR.
    pub(crate) max_sge: u32,
    /// Limit event threshold; 0: not armed.
    pub(crate) srq_limit: u32,
    /// Consumer index (published to the ring; the ULP can't move it).
    pub(crate) ci: u32,
    /// QPs that sent an RNR NAK for want of a WQE: their requesters may
    /// retry when one is posted.
    pub(crate) rnr_waiters: alloc::vec::Vec<u32>,
    /// In error (its producer index was found out of range): the QPs
    /// that take from it fail (a local QP operation error: their
    /// requesters get a remote operational error NAK) and go to ERR.
    pub(crate) error: bool,
    /// The ring receive WQEs are posted on.
    pub(crate) ring: crate::firmware::shared::RingRef,
    /// QPs attached to it.
    pub(crate) refs: Refs,
}

impl Firmware {
    /// The actual depth of an SRQ of at least `max_wr` WRs.
    fn srq_depth(&self, max_wr: u32) -> Result<u32, NtStatus> {
        if max_wr == 0 {
            Err(STATUS_INVALID_PARAMETER)
        } else if max_wr > self.config.max_srq_wr {
            Err(STATUS_INSUFFICIENT_RESOURCES)
        } else {
            Ok(ring_entries(max_wr))
        }
    }

    /// `CreateSrq`: returns the SRQN and the actual depth and SGEs.
    ///
    /// # Errors
    /// `STATUS_INVALID_HANDLE` for an unknown PD; `STATUS_INVALID_PARAMETER`
    /// for `max_wr` or `max_sge` 0 or a limit not below `max_wr`;
    /// `STATUS_INSUFFICIENT_RESOURCES` for `max_wr` above `max_srq_wr`,
    /// `max_sge` above `max_srq_sge` or when `max_srq` SRQs exist.
    pub(crate) fn create_srq(&mut self, c: &CreateSrq) -> Result<CommandOut, NtStatus> {
        let CreateSrq {
            pdn,
            max_wr,
            max_sge,
            srq_limit,
        } = *c;
        self.pds.get(pdn)?;
        let depth = self.srq_depth(max_wr)?;
        if max_sge == 0 || srq_limit >= max_wr {
            return Err(STATUS_INVALID_PARAMETER);
        }
        if max_sge > self.config.max_srq_sge {
            return Err(STATUS_INSUFFICIENT_RESOURCES);
        }
        let ring = self.rings.alloc(
            0,
            (depth + 1).next_power_of_two(),
            irpverbs_ring::wq::recv_stride(max_sge),
        )?;
        let srqn = self.srqs.insert(Srq {
            pdn,
            max_wr: depth,
            max_sge,
            srq_limit,
            ci: 0,
            rnr_waiters: alloc::vec::Vec::new(),
            error: false,
            ring: ring.clone(),
            refs: Refs::default(),
        })?;
        self.pds.get_mut(pdn)?.refs.get();
        Ok(CommandOut::Srq {
            srqn,
            max_wr: depth,
            max_sge,
            ring: ring.0,
        })
    }

    /// `ModifySrq`: with `IV_SRQ_MAX_WR` resizes to at least `max_wr`; with
    /// `IV_SRQ_LIMIT` arms the limit event at `srq_limit` (0 disarms).
    ///
    /// # Errors
    /// `STATUS_INVALID_HANDLE` for an unknown SRQN; `STATUS_INVALID_PARAMETER`
    /// for an empty mask or unknown bits, `max_wr` 0 or below the WRs the SRQ
    /// holds, or a limit not below the (new) depth;
    /// `STATUS_INSUFFICIENT_RESOURCES` for `max_wr` above `max_srq_wr`.
    pub(crate) fn modify_srq(&mut self, c: &ModifySrq) -> Result<CommandOut, NtStatus> {
        let ModifySrq {
            srqn,
            mask,
            max_wr,
            srq_limit,
        } = *c;
        let srq = self.srqs.get(srqn)?;
        if mask == 0 || mask & !(IV_SRQ_MAX_WR | IV_SRQ_LIMIT) != 0 {
            return Err(STATUS_INVALID_PARAMETER);
        }
        let (depth, asked) = if mask & IV_SRQ_MAX_WR != 0 {
            let depth = self.srq_depth(max_wr)?;
            let used = srq.ring.0.consumer().filled().unwrap_or(0);
            if depth < used {
                return Err(STATUS_INVALID_PARAMETER);
            }
            (depth, max_wr)
        } else {
            (srq.max_wr, srq.max_wr)
        };
        let limit = if mask & IV_SRQ_LIMIT != 0 {
            srq_limit
        } else {
            srq.srq_limit
        };
        if limit >= asked {
            return Err(STATUS_INVALID_PARAMETER);
        }
        let srq = self.srqs.get_mut(srqn)?;
        srq.max_wr = depth;
        srq.srq_limit = limit;
        Ok(CommandOut::None)
    }

    /// `QuerySrq`.
    ///
    /// # Errors
    /// `STATUS_INVALID_HANDLE` for an unknown SRQN.
    pub(crate) fn query_srq(&self, srqn: u32) -> Result<CommandOut, NtStatus> {
        let srq = self.srqs.get(srqn)?;
        Ok(CommandOut::SrqAttr(IvQuerySrqOut {
            max_wr: srq.max_wr,
            max_sge: srq.max_sge,
            srq_limit: srq.srq_limit,
            reserved: 0,
        }))
    }

    /// `DestroySrq`.
    ///
    /// # Errors
    /// `STATUS_INVALID_HANDLE` for an unknown SRQN; `STATUS_DEVICE_BUSY`
    /// while a QP is attached.
    pub(crate) fn destroy_srq(&mut self, srqn: u32) -> Result<CommandOut, NtStatus> {
        self.srqs.get(srqn)?.refs.check_idle()?;
        let srq = self.srqs.remove(srqn)?;
        self.pds.get_mut(srq.pdn)?.refs.put();
        self.rings.retire(srq.ring);
        self.doorbells
            .unbind(irpverbs_core::DoorbellTarget::Srq(srqn));
        Ok(CommandOut::None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::util::Dev;
    use irpverbs_abi::{STATUS_DEVICE_BUSY, STATUS_INVALID_HANDLE};
    use irpverbs_core::Command;

    fn create(pdn: u32, max_wr: u32, max_sge: u32, srq_limit: u32) -> Command {
        Command::CreateSrq(CreateSrq {
            pdn,
            max_wr,
            max_sge,
            srq_limit,
        })
    }

    fn attr(max_wr: u32, max_sge: u32, srq_limit: u32) -> CommandOut {
        CommandOut::SrqAttr(IvQuerySrqOut {
            max_wr,
            max_sge,
            srq_limit,
            reserved: 0,
        })
    }

    #[test]
    fn create_query_destroy() {
        let d = Dev::inline();
        let pdn = d.pd();
        let CommandOut::Srq {
            srqn,
            max_wr,
            max_sge,
            ring,
        } = d.ok(create(pdn, 100, 4, 10))
        else {
            panic!("not an SRQ")
        };
        assert_eq!((srqn, max_wr, max_sge, ring.entries()), (1, 127, 4, 128));
        assert_eq!(d.ok(Command::QuerySrq { srqn: 1 }), attr(127, 4, 10));
        assert_eq!(d.hca.live_objects(), 2);
        d.fails(Command::DeallocPd { pdn }, STATUS_DEVICE_BUSY);
        d.ok(Command::DestroySrq { srqn: 1 });
        d.fails(Command::QuerySrq { srqn: 1 }, STATUS_INVALID_HANDLE);
        d.fails(Command::DestroySrq { srqn: 1 }, STATUS_INVALID_HANDLE);
        d.ok(Command::DeallocPd { pdn });
    }

    #[test]
    fn create_validation() {
        let d = Dev::with(|c| c.max_srq = 1);
        let pdn = d.pd();
        d.fails(create(pdn + 1, 1, 1, 0), STATUS_INVALID_HANDLE);
        d.fails(create(pdn, 0, 1, 0), STATUS_INVALID_PARAMETER);
        d.fails(create(pdn, 1, 0, 0), STATUS_INVALID_PARAMETER);
        d.fails(create(pdn, 4, 1, 4), STATUS_INVALID_PARAMETER);
        d.fails(create(pdn, 0x4000, 1, 0), STATUS_INSUFFICIENT_RESOURCES);
        d.fails(create(pdn, 1, 33, 0), STATUS_INSUFFICIENT_RESOURCES);
        d.ok(create(pdn, 0x3FFF, 32, 0x3FFE));
        d.fails(create(pdn, 1, 1, 0), STATUS_INSUFFICIENT_RESOURCES);
    }

    #[test]
    fn modify() {
        let d = Dev::inline();
        let pdn = d.pd();
        let srqn = d.srq(pdn);
        let modify = |mask, max_wr, srq_limit| {
            Command::ModifySrq(ModifySrq {
                srqn,
                mask,
                max_wr,
                srq_limit,
            })
        };
        assert_eq!(d.ok(Command::QuerySrq { srqn }), attr(15, 1, 0));
        d.ok(modify(IV_SRQ_LIMIT, 0, 5));
        assert_eq!(d.ok(Command::QuerySrq { srqn }), attr(15, 1, 5));
        d.ok(modify(IV_SRQ_MAX_WR, 200, 0));
        assert_eq!(d.ok(Command::QuerySrq { srqn }), attr(255, 1, 5));
        d.ok(modify(IV_SRQ_MAX_WR | IV_SRQ_LIMIT, 2, 1));
        assert_eq!(d.ok(Command::QuerySrq { srqn }), attr(3, 1, 1));

        d.fails(modify(0, 8, 1), STATUS_INVALID_PARAMETER);
        d.fails(modify(1 << 2, 8, 1), STATUS_INVALID_PARAMETER);
        d.fails(modify(IV_SRQ_MAX_WR, 0, 0), STATUS_INVALID_PARAMETER);
        d.fails(
            modify(IV_SRQ_MAX_WR, 0x4000, 0),
            STATUS_INSUFFICIENT_RESOURCES,
        );
        d.fails(modify(IV_SRQ_LIMIT, 0, 3), STATUS_INVALID_PARAMETER);
        d.fails(modify(IV_SRQ_MAX_WR, 1, 0), STATUS_INVALID_PARAMETER);
        d.fails(
            modify(IV_SRQ_MAX_WR | IV_SRQ_LIMIT, 4, 4),
            STATUS_INVALID_PARAMETER,
        );
        d.fails(
            Command::ModifySrq(ModifySrq {
                srqn: srqn + 1,
                mask: IV_SRQ_LIMIT,
                max_wr: 0,
                srq_limit: 0,
            }),
            STATUS_INVALID_HANDLE,
        );
        d.fails(Command::QuerySrq { srqn: 0 }, STATUS_INVALID_HANDLE);
    }

    #[test]
    fn srq_with_a_qp_is_busy() {
        let d = Dev::inline();
        let pdn = d.pd();
        let cqn = d.cq(1);
        let srqn = d.srq(pdn);
        let qpn = d.qp(pdn, cqn, Some(srqn));
        d.fails(Command::DestroySrq { srqn }, STATUS_DEVICE_BUSY);
        d.ok(Command::DestroyQp { qpn });
        d.ok(Command::DestroySrq { srqn });
    }
}
