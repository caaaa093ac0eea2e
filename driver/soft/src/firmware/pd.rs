//! Protection domains.

use irpverbs_abi::NtStatus;
use irpverbs_core::CommandOut;

use crate::firmware::{Firmware, Refs};

/// A protection domain.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Pd {
    /// MRs, SRQs, QPs and AHs in this PD.
    pub(crate) refs: Refs,
}

impl Firmware {
    /// `AllocPd`: a new PD number, small and reused after free.
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES` when `max_pd` PDs exist.
    pub(crate) fn alloc_pd(&mut self) -> Result<CommandOut, NtStatus> {
        let pdn = self.pds.insert(Pd::default())?;
        Ok(CommandOut::Pd { pdn })
    }

    /// `DeallocPd`.
    ///
    /// # Errors
    /// `STATUS_INVALID_HANDLE` for an unknown PDN; `STATUS_DEVICE_BUSY` while
    /// an MR, SRQ, QP or AH is in the PD.
    pub(crate) fn dealloc_pd(&mut self, pdn: u32) -> Result<CommandOut, NtStatus> {
        self.pds.get(pdn)?.refs.check_idle()?;
        self.pds.remove(pdn)?;
        Ok(CommandOut::None)
    }
}

#[cfg(test)]
mod tests {
    use crate::tests::util::Dev;
    use irpverbs_abi::{STATUS_DEVICE_BUSY, STATUS_INSUFFICIENT_RESOURCES, STATUS_INVALID_HANDLE};
    use irpverbs_core::{Command, CommandOut};

    #[test]
    fn alloc_and_dealloc() {
        let d = Dev::inline();
        assert_eq!(d.ok(Command::AllocPd), CommandOut::Pd { pdn: 1 });
        assert_eq!(d.ok(Command::AllocPd), CommandOut::Pd { pdn: 2 });
        assert_eq!(d.hca.live_objects(), 2);
        assert_eq!(d.ok(Command::DeallocPd { pdn: 1 }), CommandOut::None);
        assert_eq!(d.hca.live_objects(), 1);
        assert_eq!(d.ok(Command::AllocPd), CommandOut::Pd { pdn: 1 }, "reused");
        d.ok(Command::DeallocPd { pdn: 1 });
        d.ok(Command::DeallocPd { pdn: 2 });
        assert_eq!(d.hca.live_objects(), 0);
    }

    #[test]
    fn unknown_pd() {
        let d = Dev::inline();
        let pdn = d.pd();
        for pdn in [0, pdn + 1, u32::MAX] {
            d.fails(Command::DeallocPd { pdn }, STATUS_INVALID_HANDLE);
        }
        d.ok(Command::DeallocPd { pdn });
        d.fails(Command::DeallocPd { pdn }, STATUS_INVALID_HANDLE);
    }

    #[test]
    fn pd_limit() {
        let d = Dev::with(|c| c.max_pd = 2);
        d.pd();
        d.pd();
        d.fails(Command::AllocPd, STATUS_INSUFFICIENT_RESOURCES);
    }

    #[test]
    fn pd_with_dependents_is_busy() {
        let d = Dev::inline();
        let pdn = d.pd();
        let cqn = d.cq(1);
        let (lkey, _) = d.mr(pdn);
        let srqn = d.srq(pdn);
        let ahn = d.ah(pdn);
        let qpn = d.qp(pdn, cqn, None);
        let undo = [
            Command::DestroyQp { qpn },
            Command::DestroyAh { ahn },
            Command::DestroySrq { srqn },
            Command::DeregMr { lkey },
        ];
        for cmd in undo {
            d.fails(Command::DeallocPd { pdn }, STATUS_DEVICE_BUSY);
            d.ok(cmd);
        }
        d.ok(Command::DeallocPd { pdn });
        d.ok(Command::DestroyCq { cqn });
        assert_eq!(d.hca.live_objects(), 0);
    }
}
