//! Address handles, and the address vector checks QPs share.

use irpverbs_abi::{IvAhAttr, NtStatus, STATUS_INVALID_PARAMETER};
use irpverbs_core::{CommandOut, CreateAh};

use crate::firmware::Firmware;
use crate::firmware::port::check_port;

/// Largest IPv6 flow label (20 bits).
pub const MAX_FLOW_LABEL: u32 = 0xF_FFFF;
/// Largest service level.
pub const MAX_SL: u8 = 15;

/// An address handle: the path to a remote port, for UD sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Ah {
    /// Its PD.
    pub(crate) pdn: u32,
    /// The address vector.
    pub(crate) attr: IvAhAttr,
}

impl Firmware {
    /// Checks an address vector for this RoCE port: a GRH (`is_global` 1)
    /// to a non-zero destination GID, port 1, a source GID index naming a
    /// GID in use, `sl` <= 15, a 20-bit flow label and zero reserved bytes.
    /// `dlid`, `src_path_bits`, `static_rate`, `hop_limit` and
    /// `traffic_class` take any value (RoCE ignores the first two).
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER`.
    pub(crate) fn check_av(&self, av: &IvAhAttr) -> Result<(), NtStatus> {
        check_port(av.port_num)?;
        let ok = av.is_global == 1
            && av.dgid != [0; 16]
            && self.port.valid_gid(u32::from(av.sgid_index)).is_some()
            && av.sl <= MAX_SL
            && av.flow_label <= MAX_FLOW_LABEL
            && av.reserved == [0; 2];
        if ok {
            Ok(())
        } else {
            Err(STATUS_INVALID_PARAMETER)
        }
    }

    /// `CreateAh`.
    ///
    /// # Errors
    /// `STATUS_INVALID_HANDLE` for an unknown PD; `STATUS_INVALID_PARAMETER`
    /// for an address vector [`Firmware::check_av`] refuses;
    /// `STATUS_INSUFFICIENT_RESOURCES` when `max_ah` AHs exist.
    pub(crate) fn create_ah(&mut self, c: &CreateAh) -> Result<CommandOut, NtStatus> {
        let CreateAh { pdn, ref attr } = *c;
        self.pds.get(pdn)?;
        self.check_av(attr)?;
        let ahn = self.ahs.insert(Ah { pdn, attr: *attr })?;
        self.pds.get_mut(pdn)?.refs.get();
        Ok(CommandOut::Ah { ahn })
    }

    /// `DestroyAh`.
    ///
    /// # Errors
    /// `STATUS_INVALID_HANDLE` for an unknown AHN.
    pub(crate) fn destroy_ah(&mut self, ahn: u32) -> Result<CommandOut, NtStatus> {
        let ah = self.ahs.remove(ahn)?;
        self.pds.get_mut(ah.pdn)?.refs.put();
        Ok(CommandOut::None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::util::{Dev, av, bad_avs};
    use irpverbs_abi::{STATUS_INSUFFICIENT_RESOURCES, STATUS_INVALID_HANDLE};
    use irpverbs_core::Command;

    #[test]
    fn create_and_destroy() {
        let d = Dev::inline();
        let pdn = d.pd();
        let mut attr = av();
        attr.sl = 15;
        attr.flow_label = MAX_FLOW_LABEL;
        attr.hop_limit = 0;
        attr.traffic_class = 0xFF;
        assert_eq!(
            d.ok(Command::CreateAh(CreateAh { pdn, attr })),
            CommandOut::Ah { ahn: 1 }
        );
        assert_eq!(d.snapshot().ahs.get(1).unwrap().attr, attr);
        assert_eq!(d.hca.live_objects(), 2);
        d.ok(Command::DestroyAh { ahn: 1 });
        d.fails(Command::DestroyAh { ahn: 1 }, STATUS_INVALID_HANDLE);
        d.fails(Command::DestroyAh { ahn: 0 }, STATUS_INVALID_HANDLE);
        d.ok(Command::DeallocPd { pdn });
    }

    #[test]
    fn validation() {
        let d = Dev::with(|c| c.max_ah = 1);
        let pdn = d.pd();
        d.fails(
            Command::CreateAh(CreateAh {
                pdn: pdn + 1,
                attr: av(),
            }),
            STATUS_INVALID_HANDLE,
        );
        for attr in bad_avs() {
            d.fails(
                Command::CreateAh(CreateAh { pdn, attr }),
                STATUS_INVALID_PARAMETER,
            );
        }
        d.ok(Command::CreateAh(CreateAh { pdn, attr: av() }));
        d.fails(
            Command::CreateAh(CreateAh { pdn, attr: av() }),
            STATUS_INSUFFICIENT_RESOURCES,
        );
    }
}
