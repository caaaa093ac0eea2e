//! `CREATE_AH`, and the address vector checks QPs share. (`DESTROY_AH` is
//! a destroy: `destroy.rs`.)

use irpverbs_abi::*;

use super::Op;
use crate::device::{Device, State};
use crate::object::{Ah, Body, Kind, Object};
use crate::{Command, CommandOut, CreateAh, FileKey, Hca, Platform};

/// Checks an address vector: reserved bytes zero, a GRH (RoCE needs one),
/// a valid port, SL and flow label in range.
pub(crate) fn check_ah_attr(a: &IvAhAttr, caps: &IvQueryDeviceOut) -> Result<(), NtStatus> {
    if a.reserved != [0; 2] {
        return Err(STATUS_INVALID_PARAMETER);
    }
    if a.is_global != 1 || a.sl > 15 || a.flow_label > 0xF_FFFF || a.hop_limit == 0 {
        return Err(STATUS_INVALID_PARAMETER);
    }
    super::port::check_port(u32::from(a.port_num), caps)
}

/// `IOCTL_IV_CREATE_AH`.
///
/// # Errors
/// `STATUS_INVALID_PARAMETER` for an address vector [`check_ah_attr`]
/// refuses; `STATUS_INVALID_HANDLE` for a PD handle that names no live PD
/// of the file; those of [`Device::reserve`].
pub(crate) fn create_ah<P: Platform, H: Hca>(
    d: &Device<P, H>,
    s: &mut State<P::Request>,
    file: FileKey,
    i: &IvCreateAhIn,
) -> Result<(Op, Command), NtStatus> {
    let caps = d.hca.caps();
    check_ah_attr(&i.attr, caps)?;
    let pd = s.file(file)?.objects.lookup(i.pd, Kind::Pd)?;
    let pdn = super::pd::pdn(s, file, pd);
    let idx = d.reserve(s, file, Body::Ah(Ah { pd, ahn: 0 }), caps.max_ah)?;
    let cmd = Command::CreateAh(CreateAh { pdn, attr: i.attr });
    Ok((Op::CreateAh(idx), cmd))
}

/// `IOCTL_IV_CREATE_AH`'s completion: the AH takes the number the HCA gave
/// it.
pub(crate) fn create_ah_done(
    o: &mut Object,
    ah: IvHandle,
    out: CommandOut,
) -> Option<IvCreateAhOut> {
    let (Body::Ah(a), CommandOut::Ah { ahn }) = (&mut o.body, out) else {
        return None;
    };
    a.ahn = ahn;
    Some(IvCreateAhOut {
        ah,
        ahn,
        reserved: 0,
    })
}
#[cfg(test)]
mod tests {
    use super::*;

    fn caps() -> IvQueryDeviceOut {
        IvQueryDeviceOut {
            phys_port_cnt: 1,
            ..Default::default()
        }
    }

    #[test]
    fn av_checks() {
        let good = IvAhAttr {
            is_global: 1,
            port_num: 1,
            hop_limit: 64,
            ..Default::default()
        };
        assert_eq!(check_ah_attr(&good, &caps()), Ok(()));
        for bad in [
            IvAhAttr {
                is_global: 0,
                ..good
            },
            IvAhAttr {
                port_num: 2,
                ..good
            },
            IvAhAttr { sl: 16, ..good },
            IvAhAttr {
                flow_label: 1 << 20,
                ..good
            },
            IvAhAttr {
                reserved: [0, 1],
                ..good
            },
            IvAhAttr {
                hop_limit: 0,
                ..good
            },
        ] {
            assert_eq!(
                check_ah_attr(&bad, &caps()),
                Err(STATUS_INVALID_PARAMETER),
                "{bad:?}"
            );
        }
    }
}
