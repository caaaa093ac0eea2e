//! `rdma_getaddrinfo` / `rdma_freeaddrinfo`: names and services resolved
//! by the C library's `getaddrinfo` (numeric addresses, `/etc/hosts`,
//! DNS), as rdma-core does for IP addresses; the result names a source
//! (`RAI_PASSIVE`: the address to bind) or a destination (with the hints'
//! source, if any), the port space (`RDMA_PS_TCP` unless the hints say
//! otherwise) and its QP type.

use std::ffi::{c_char, c_int};

use crate::abi::*;
use crate::id::{sockaddr_get, sockaddr_of};
use crate::{os, set_errno};

/// A boxed copy of the socket address at `sa` and its length.
///
/// # Safety
/// `sa` is a socket address of its family's size.
unsafe fn boxed(sa: *const os::sockaddr) -> Result<(*mut os::sockaddr, os::socklen_t), c_int> {
    // SAFETY: forwarded (caller).
    let a = unsafe { sockaddr_get(sa) }?;
    let (st, len) = sockaddr_of(a);
    Ok((Box::into_raw(Box::new(st)).cast(), len))
}

/// `rdma_getaddrinfo`: 0, or -1 with `errno` (`EINVAL` for no node and no
/// service or a NULL result, `EADDRNOTAVAIL` for a name that does not
/// resolve).
///
/// # Safety
/// `node`, `service` NULL or C strings; `hints` NULL or valid; `res`
/// NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    if res.is_null() || (node.is_null() && service.is_null()) {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: NULL or valid (caller).
    let h = unsafe { hints.as_ref() };
    let flags = h.map_or(0, |h| h.ai_flags);
    let passive = flags & RAI_PASSIVE != 0;
    let mut ps = h.map_or(0, |h| h.ai_port_space);
    let mut qp_type = h.map_or(0, |h| h.ai_qp_type);
    if ps == 0 {
        ps = if qp_type == IBV_QPT_UD {
            RDMA_PS_UDP
        } else {
            RDMA_PS_TCP
        };
    }
    if qp_type == 0 {
        qp_type = if ps == RDMA_PS_UDP {
            IBV_QPT_UD
        } else {
            IBV_QPT_RC
        };
    }
    // SAFETY: all-zero bytes are a valid addrinfo (no pointers).
    let mut gh: os::addrinfo = unsafe { std::mem::zeroed() };
    gh.ai_family = h.map_or(0, |h| h.ai_family);
    gh.ai_socktype = os::SOCK_STREAM;
    if flags & RAI_NUMERICHOST != 0 {
        gh.ai_flags |= os::AI_NUMERICHOST;
    }
    if passive {
        gh.ai_flags |= os::AI_PASSIVE;
    }
    let mut found: *mut os::addrinfo = std::ptr::null_mut();
    // SAFETY: C strings or NULL (caller); hints on the stack; a place for
    // the result.
    let r = unsafe { os::getaddrinfo(node, service, &gh, &mut found) };
    if r != 0 {
        set_errno(os::gai_errno(r));
        return -1;
    }
    // SAFETY: getaddrinfo's first result (it succeeded: there is one).
    let first = unsafe { &*found };
    // SAFETY: its address, of its family's size.
    let addr = unsafe { boxed(first.ai_addr) };
    let family = first.ai_family;
    // SAFETY: getaddrinfo's result, freed once.
    unsafe { os::freeaddrinfo(found) };
    let (addr, len) = match addr {
        Ok(a) => a,
        Err(e) => {
            set_errno(e);
            return -1;
        }
    };
    let mut ai = rdma_addrinfo {
        ai_flags: flags,
        ai_family: family,
        ai_qp_type: qp_type,
        ai_port_space: ps,
        ai_src_len: 0,
        ai_dst_len: 0,
        ai_src_addr: std::ptr::null_mut(),
        ai_dst_addr: std::ptr::null_mut(),
        ai_src_canonname: std::ptr::null_mut(),
        ai_dst_canonname: std::ptr::null_mut(),
        ai_route_len: 0,
        ai_route: std::ptr::null_mut(),
        ai_connect_len: 0,
        ai_connect: std::ptr::null_mut(),
        ai_next: std::ptr::null_mut(),
    };
    if passive {
        ai.ai_src_addr = addr;
        ai.ai_src_len = len;
    } else {
        ai.ai_dst_addr = addr;
        ai.ai_dst_len = len;
        if let Some(src) = h.map(|h| h.ai_src_addr).filter(|p| !p.is_null()) {
            // SAFETY: the hints' source address (caller).
            match unsafe { boxed(src) } {
                Ok((s, l)) => {
                    ai.ai_src_addr = s;
                    ai.ai_src_len = l;
                }
                Err(e) => {
                    // SAFETY: the destination boxed above.
                    drop(unsafe { Box::from_raw(addr.cast::<os::sockaddr_storage>()) });
                    set_errno(e);
                    return -1;
                }
            }
        }
    }
    // SAFETY: writable (caller).
    unsafe { *res = Box::into_raw(Box::new(ai)) };
    0
}

/// `rdma_freeaddrinfo`: frees a result list (NULL is ignored).
///
/// # Safety
/// `res` is NULL or from `rdma_getaddrinfo`, freed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    let mut p = res;
    while !p.is_null() {
        // SAFETY: boxed by rdma_getaddrinfo (caller).
        let ai = unsafe { Box::from_raw(p) };
        for a in [ai.ai_src_addr, ai.ai_dst_addr] {
            if !a.is_null() {
                // SAFETY: boxed as a sockaddr_storage by rdma_getaddrinfo.
                drop(unsafe { Box::from_raw(a.cast::<os::sockaddr_storage>()) });
            }
        }
        p = ai.ai_next;
    }
}
