//! Off Windows: the C library's sockets layer.

use std::ffi::c_int;

pub use libc::{
    AF_INET, AF_INET6, AI_NUMERICHOST, AI_PASSIVE, SOCK_STREAM, addrinfo, freeaddrinfo,
    getaddrinfo, in_addr, in6_addr, nfds_t, poll, pollfd, sa_family_t, sockaddr, sockaddr_in,
    sockaddr_in6, sockaddr_storage, socklen_t,
};

/// The errno of a `getaddrinfo` failure, as rdma-core converts it.
#[must_use]
pub fn gai_errno(e: c_int) -> c_int {
    match e {
        libc::EAI_NODATA | libc::EAI_NONAME => libc::EADDRNOTAVAIL,
        libc::EAI_AGAIN => libc::EAGAIN,
        libc::EAI_BADFLAGS | libc::EAI_SERVICE | libc::EAI_SOCKTYPE => libc::EINVAL,
        libc::EAI_FAMILY => libc::EAFNOSUPPORT,
        libc::EAI_MEMORY => libc::ENOMEM,
        libc::EAI_SYSTEM => super::errno(),
        _ => libc::EINVAL,
    }
}
