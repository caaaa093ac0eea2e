//! Protection domains and memory regions: `ibv_alloc_pd`,
//! `ibv_dealloc_pd`, `ibv_reg_mr` (and `_iova`, `_iova2`), `ibv_dereg_mr`.

use std::ffi::{c_int, c_uint, c_void};

use irpverbs_abi::*;

use crate::abi::*;
use crate::{context, errno_of, leak, null_with};

/// A PD: the `ibv_pd` programs see, then the driver's handle.
#[repr(C)]
pub(crate) struct Pd {
    pub ibv: ibv_pd,
    pub handle: IvHandle,
}

/// An MR.
#[repr(C)]
pub(crate) struct Mr {
    pub ibv: ibv_mr,
    pub handle: IvHandle,
}

/// The PD behind `pd` and its context.
///
/// # Safety
/// `pd` is NULL or from `ibv_alloc_pd`, not deallocated.
pub(crate) unsafe fn pd_of<'a>(pd: *mut ibv_pd) -> Option<(&'a Pd, &'a crate::Context)> {
    // SAFETY: forwarded (C contract).
    unsafe { crate::object_of(pd) }
}

impl crate::Object for Pd {
    fn context_ptr(&self) -> *mut ibv_context {
        self.ibv.context
    }
}

/// `ibv_alloc_pd`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    // SAFETY: a context from `ibv_open_device` (C contract).
    let Some(c) = (unsafe { context(ctx) }) else {
        return null_with(libc::EINVAL);
    };
    match c.client.alloc_pd() {
        Ok(out) => leak(Pd {
            ibv: ibv_pd {
                context: ctx,
                handle: out.pd as u32,
            },
            handle: out.pd,
        })
        .cast(),
        Err(s) => null_with(errno_of(s)),
    }
}

/// `ibv_dealloc_pd`: `EBUSY` while MRs, QPs, SRQs or AHs use it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    // SAFETY: a PD from `ibv_alloc_pd` (C contract).
    let Some((p, c)) = (unsafe { pd_of(pd) }) else {
        return libc::EINVAL;
    };
    match c.client.dealloc_pd(p.handle) {
        Ok(()) => {
            // SAFETY: from `leak` in `ibv_alloc_pd`, deallocated once.
            drop(unsafe { Box::from_raw(pd.cast::<Pd>()) });
            0
        }
        Err(s) => errno_of(s),
    }
}

/// The access bits the driver takes: the optional ones (relaxed ordering
/// and the rest of `IBV_ACCESS_OPTIONAL_RANGE`) and `IBV_ACCESS_HUGETLB`
/// (a hint) are accepted and ignored; zero-based and on-demand MRs are
/// `EOPNOTSUPP`; unknown bits `EINVAL`.
fn access_of(access: c_uint) -> Result<u32, c_int> {
    let known = IBV_ACCESS_LOCAL_WRITE
        | IBV_ACCESS_REMOTE_WRITE
        | IBV_ACCESS_REMOTE_READ
        | IBV_ACCESS_REMOTE_ATOMIC
        | IBV_ACCESS_MW_BIND;
    let access = access & !(IBV_ACCESS_OPTIONAL_RANGE | IBV_ACCESS_HUGETLB);
    if access & (IBV_ACCESS_ZERO_BASED | IBV_ACCESS_ON_DEMAND) != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    if access & !known != 0 {
        return Err(libc::EINVAL);
    }
    Ok(access)
}

/// `ibv_reg_mr_iova2`: registers `length` bytes at `addr`. The HCA
/// addresses an MR by its virtual address, so `iova` must be `addr`
/// (`EOPNOTSUPP` otherwise).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    // SAFETY: a PD from `ibv_alloc_pd` (C contract).
    let Some((p, c)) = (unsafe { pd_of(pd) }) else {
        return null_with(libc::EINVAL);
    };
    if iova != addr as u64 {
        return null_with(libc::EOPNOTSUPP);
    }
    let access = match access_of(access) {
        Ok(a) => a,
        Err(e) => return null_with(e),
    };
    match c
        .client
        .reg_mr(p.handle, addr as u64, length as u64, access)
    {
        Ok(out) => leak(Mr {
            ibv: ibv_mr {
                context: p.ibv.context,
                pd,
                addr,
                length,
                handle: out.mr as u32,
                lkey: out.lkey,
                rkey: out.rkey,
            },
            handle: out.mr,
        })
        .cast(),
        Err(s) => null_with(errno_of(s)),
    }
}

/// `ibv_reg_mr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded (C contract).
    unsafe { ibv_reg_mr_iova2(pd, addr, length, addr as u64, access as c_uint) }
}

/// `ibv_reg_mr_iova`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded (C contract).
    unsafe { ibv_reg_mr_iova2(pd, addr, length, iova, access as c_uint) }
}

/// `ibv_dereg_mr`: `EBUSY` while memory windows are bound to it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    // SAFETY: an MR's `ibv_mr` is the first field of its `Mr` (C contract).
    let Some(m) = (unsafe { mr.cast::<Mr>().as_ref() }) else {
        return libc::EINVAL;
    };
    // SAFETY: its context is open (C contract).
    let Some(c) = (unsafe { context(m.ibv.context) }) else {
        return libc::EINVAL;
    };
    match c.client.dereg_mr(m.handle) {
        Ok(()) => {
            // SAFETY: from `leak` in `ibv_reg_mr_iova2`, deregistered once.
            drop(unsafe { Box::from_raw(mr.cast::<Mr>()) });
            0
        }
        Err(s) => errno_of(s),
    }
}
