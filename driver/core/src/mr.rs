//! Memory regions.
//!
//! On Windows the KMDF layer probes and locks a user-mode region in the
//! caller's context (EvtIoInCallerContext, PASSIVE_LEVEL) before the request
//! reaches the dispatch-level queue; the core only validates and registers.

use irpverbs_abi::*;

use crate::device::{Device, Op, State};
use crate::object::{Body, Kind, Mr};
use crate::{Command, FileKey, Hca, Platform, RequestorMode};

/// Highest user-mode address + 1 on x64 Windows (`MmUserProbeAddress`).
pub const USER_ADDRESS_LIMIT: u64 = 0x0000_7FFF_FFFF_0000;

/// Checks access flags: only defined bits; remote write and remote atomic
/// require local write (IBTA 10.6.3.1).
pub(crate) fn check_access(access: u32) -> Result<(), NtStatus> {
    if access & !IV_ACCESS_ALL != 0 {
        return Err(STATUS_INVALID_PARAMETER);
    }
    if access & (IV_ACCESS_REMOTE_WRITE | IV_ACCESS_REMOTE_ATOMIC) != 0
        && access & IV_ACCESS_LOCAL_WRITE == 0
    {
        return Err(STATUS_INVALID_PARAMETER);
    }
    Ok(())
}

/// `IOCTL_IV_REG_MR` / `IOCTL_IV_REG_PHYS_MR`.
pub(crate) fn start_reg_mr<P: Platform, H: Hca>(
    d: &Device<P, H>,
    s: &mut State<P::Request>,
    file: FileKey,
    mode: RequestorMode,
    i: &IvRegMrIn,
    physical: bool,
) -> Result<(Op, Command), NtStatus> {
    if i.reserved != 0 {
        return Err(STATUS_INVALID_PARAMETER);
    }
    check_access(i.access)?;
    let caps = d.hca.caps();
    if i.length == 0 || i.length > caps.max_mr_size {
        return Err(STATUS_INVALID_PARAMETER);
    }
    let end = i
        .addr
        .checked_add(i.length)
        .ok_or(STATUS_INVALID_PARAMETER)?;
    if mode == RequestorMode::User && end > USER_ADDRESS_LIMIT {
        return Err(STATUS_ACCESS_DENIED);
    }
    let pd = s.file(file)?.objects.lookup(i.pd, Kind::Pd)?;
    let pdn = crate::pd::pdn(s, file, pd);
    let region = d.platform.pin_memory(i.addr, i.length, mode, physical)?;
    let idx = d.reserve(s, file, Body::Mr(Mr { pd, lkey: 0 }), caps.max_mr)?;
    Ok((
        Op::Create(idx),
        Command::RegMr {
            pdn,
            addr: i.addr,
            length: i.length,
            access: i.access,
            physical,
            region,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_write_needs_local_write() {
        assert_eq!(
            check_access(IV_ACCESS_REMOTE_WRITE),
            Err(STATUS_INVALID_PARAMETER)
        );
        assert_eq!(
            check_access(IV_ACCESS_REMOTE_ATOMIC),
            Err(STATUS_INVALID_PARAMETER)
        );
        assert_eq!(check_access(IV_ACCESS_REMOTE_READ), Ok(()));
        assert_eq!(check_access(IV_ACCESS_ALL), Ok(()));
        assert_eq!(check_access(1 << 7), Err(STATUS_INVALID_PARAMETER));
    }
}
