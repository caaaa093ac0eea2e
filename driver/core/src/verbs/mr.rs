//! `REG_MR`, `REG_PHYS_MR` and `ALLOC_MR`. (`DEREG_MR` is a destroy:
//! `destroy.rs`.)
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

use super::Op;
use crate::device::{Device, State};
use crate::object::{Body, Kind, Mr, Object};
use crate::{Command, CommandOut, FileKey, Hca, Platform, RegMr, Request, RequestorMode};

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

/// The region a registration of `request` registers: the one pinned in the
/// caller's context (a user-mode request), else, for a kernel caller, its
/// nonpaged range wrapped now ([`Platform::pin_memory`]). `None` for a
/// user-mode request that never went through
/// [`crate::Device::in_caller_context`] ([`reg_mr`] refuses it).
///
/// IRQL: DISPATCH_LEVEL (the queue callback), before the device lock.
///
/// # Errors
/// Those of [`check_reg_mr`] and [`Platform::pin_memory`].
pub(crate) fn pinned_region<P: Platform, H: Hca>(
    d: &Device<P, H>,
    request: &mut P::Request,
    i: &IvRegMrIn,
    physical: bool,
) -> Result<Option<Shared<Region>>, NtStatus> {
    let pinned = request.take_pin();
    let mode = request.requestor_mode();
    if pinned.is_some() || mode != RequestorMode::Kernel {
        return Ok(pinned);
    }
    check_reg_mr(d.hca.caps(), mode, i)?;
    let write = writable(i.access);
    let region = d
        .platform
        .pin_memory(request, i.addr, i.length, write, physical)?;
    Ok(Some(region))
}

/// `IOCTL_IV_REG_MR` / `IOCTL_IV_REG_PHYS_MR`, with `pinned`: the region
/// the platform pinned ([`pinned_region`]).
///
/// # Errors
/// Those of [`check_reg_mr`]; `STATUS_INVALID_HANDLE` for a PD handle that
/// names no live PD of the file; `STATUS_INVALID_DEVICE_STATE` for a
/// user-mode registration with no pinned region; those of
/// [`Device::reserve_with`].
pub(crate) fn reg_mr<P: Platform, H: Hca>(
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
    let pdn = super::pd::pdn(s, file, pd);
    // A physical range (kernel callers) pins nothing.
    let pinned = if physical {
        crate::quota::Bytes::default()
    } else {
        crate::quota::mr_pinned(i.addr, i.length)
    };
    let idx = d.reserve_with(s, file, Body::Mr(Mr { pd, lkey: 0 }), caps.max_mr, pinned)?;
    let cmd = Command::RegMr(RegMr {
        pdn,
        addr: i.addr,
        length: i.length,
        access: i.access,
        physical,
        region,
    });
    Ok((Op::RegMr(idx), cmd))
}

/// `IOCTL_IV_ALLOC_MR` (kernel callers only: `crate::verbs::parse` refuses
/// a user-mode caller): a free fast-register MR of the PD, which
/// `IV_WR_REG_MR` work requests register (docs/fast-registration.md). It
/// completes as a registration ([`reg_mr_done`]); the driver keeps the key
/// the HCA gave, by which it deregisters the MR whatever key a work
/// request gave it since.
///
/// # Errors
/// `STATUS_INVALID_PARAMETER` for a reserved field set or a `max_num_sg`
/// of 0 or above `max_fast_reg_page_list_len`; `STATUS_INVALID_HANDLE`
/// for a PD handle that names no live PD of the file; those of
/// [`Device::reserve`] (an MR of the device's `max_mr` and the file's MR
/// quota).
pub(crate) fn alloc_mr<P: Platform, H: Hca>(
    d: &Device<P, H>,
    s: &mut State<P::Request>,
    file: FileKey,
    i: &IvAllocMrIn,
) -> Result<(Op, Command), NtStatus> {
    let caps = d.hca.caps();
    if i.reserved != 0 || i.max_num_sg == 0 || i.max_num_sg > caps.max_fast_reg_page_list_len {
        return Err(STATUS_INVALID_PARAMETER);
    }
    let pd = s.file(file)?.objects.lookup(i.pd, Kind::Pd)?;
    let pdn = super::pd::pdn(s, file, pd);
    let idx = d.reserve(s, file, Body::Mr(Mr { pd, lkey: 0 }), caps.max_mr)?;
    let cmd = Command::AllocMr {
        pdn,
        max_pages: i.max_num_sg,
    };
    Ok((Op::RegMr(idx), cmd))
}

/// `IOCTL_IV_REG_MR`'s completion: the MR takes the keys the HCA gave it.
pub(crate) fn reg_mr_done(o: &mut Object, mr: IvHandle, out: CommandOut) -> Option<IvRegMrOut> {
    let (Body::Mr(m), CommandOut::Mr { lkey, rkey }) = (&mut o.body, out) else {
        return None;
    };
    m.lkey = lkey;
    Some(IvRegMrOut { mr, lkey, rkey })
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
