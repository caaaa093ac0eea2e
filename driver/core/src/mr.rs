//! Memory regions.
//!
//! A user-mode registration pins the caller's pages in the caller's own
//! context, before the request reaches the dispatch-level queue
//! ([`crate::Device::in_caller_context`] calls [`Platform::pin_memory`] and
//! attaches the pinned region to the request); the queue callback then takes
//! the region back and registers it. A kernel caller's range is its own
//! nonpaged memory, wrapped at dispatch. Either way the HCA holds the region
//! while the MR lives, and dropping it unpins.

use irpverbs_abi::*;
use irpverbs_ring::{Region, Shared};

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

/// Whether the HCA may write an MR with `access`: local write (which remote
/// write and remote atomics require) lets it place receives, RDMA READ
/// responses and atomic results there. The pin asks for write access then
/// (`IoWriteAccess`), read access otherwise.
pub(crate) fn writable(access: u32) -> bool {
    access & (IV_ACCESS_LOCAL_WRITE | IV_ACCESS_REMOTE_WRITE | IV_ACCESS_REMOTE_ATOMIC) != 0
}

/// The checks of `IOCTL_IV_REG_MR` / `IOCTL_IV_REG_PHYS_MR` that need no
/// state: reserved field, access flags, length, and (user mode) that the
/// range is below [`USER_ADDRESS_LIMIT`].
pub(crate) fn check_reg_mr(
    caps: &IvQueryDeviceOut,
    mode: RequestorMode,
    i: &IvRegMrIn,
) -> Result<(), NtStatus> {
    if i.reserved != 0 {
        return Err(STATUS_INVALID_PARAMETER);
    }
    check_access(i.access)?;
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
    Ok(())
}

/// `IOCTL_IV_REG_MR` / `IOCTL_IV_REG_PHYS_MR`, with `pinned`: the region
/// the platform pinned (in caller context for a user-mode caller, at
/// dispatch for a kernel caller). A user-mode registration without one
/// never went through [`crate::Device::in_caller_context`]:
/// `STATUS_INVALID_DEVICE_STATE`.
pub(crate) fn start_reg_mr<P: Platform, H: Hca>(
    d: &Device<P, H>,
    s: &mut State<P::Request>,
    file: FileKey,
    mode: RequestorMode,
    i: &IvRegMrIn,
    physical: bool,
    pinned: Option<Shared<Region>>,
) -> Result<(Op, Command), NtStatus> {
    let caps = d.hca.caps();
    check_reg_mr(caps, mode, i)?;
    let pd = s.file(file)?.objects.lookup(i.pd, Kind::Pd)?;
    let region = pinned.ok_or(STATUS_INVALID_DEVICE_STATE)?;
    let pdn = crate::pd::pdn(s, file, pd);
    // A physical range (kernel callers) pins nothing.
    let pinned = if physical {
        crate::quota::Bytes::default()
    } else {
        crate::quota::mr_pinned(i.addr, i.length)
    };
    let idx = d.reserve_with(s, file, Body::Mr(Mr { pd, lkey: 0 }), caps.max_mr, pinned)?;
    Ok((
        Op::Create(idx),
        Command::RegMr(crate::RegMr {
            pdn,
            addr: i.addr,
            length: i.length,
            access: i.access,
            physical,
            region,
        }),
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

    #[test]
    fn only_local_write_pins_for_writing() {
        assert!(!writable(0));
        assert!(!writable(IV_ACCESS_REMOTE_READ));
        assert!(writable(IV_ACCESS_LOCAL_WRITE));
        assert!(writable(IV_ACCESS_ALL));
    }
}
