//! Windows x64: Winsock's socket addresses (`ws2def.h`, `ws2ipdef.h`),
//! `getaddrinfo` / `freeaddrinfo` and `WSAPoll` (`ws2tcpip.h`,
//! `winsock2.h`), declared with their documented layouts and signatures.
//! Winsock is started (`WSAStartup` 2.2) once, before the first
//! `getaddrinfo`, and left to the process's end.
#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::{c_char, c_int};
use std::sync::Once;

pub use irpverbs_rdma_abi::sys::{
    in_addr, in6_addr, sa_family_t, sockaddr, sockaddr_in, sockaddr_in6, sockaddr_storage,
    socklen_t,
};
/// `nfds_t` of `rpoll`: `WSAPoll`'s `ULONG` count.
pub type nfds_t = u32;

/// `AF_INET`.
pub const AF_INET: c_int = 2;
/// `AF_INET6` (23 in Winsock).
pub const AF_INET6: c_int = 23;
/// `SOCK_STREAM`.
pub const SOCK_STREAM: c_int = 1;
/// `AI_PASSIVE`.
pub const AI_PASSIVE: c_int = 0x01;
/// `AI_NUMERICHOST`.
pub const AI_NUMERICHOST: c_int = 0x04;

/// `ADDRINFOA` (`ai_addrlen` is a `size_t`, and `ai_canonname` comes
/// before `ai_addr`, unlike glibc's).
#[repr(C)]
pub struct addrinfo {
    pub ai_flags: c_int,
    pub ai_family: c_int,
    pub ai_socktype: c_int,
    pub ai_protocol: c_int,
    pub ai_addrlen: usize,
    pub ai_canonname: *mut c_char,
    pub ai_addr: *mut sockaddr,
    pub ai_next: *mut addrinfo,
}

/// `WSAPOLLFD` (`pollfd` in `rpoll`).
#[repr(C)]
pub struct pollfd {
    pub fd: usize,
    pub events: i16,
    pub revents: i16,
}

const _: () = assert!(size_of::<addrinfo>() == 48);
const _: () = assert!(std::mem::offset_of!(addrinfo, ai_addr) == 32);
const _: () = assert!(size_of::<pollfd>() == 16);

#[link(name = "ws2_32")]
unsafe extern "system" {
    fn WSAStartup(wVersionRequested: u16, lpWSAData: *mut u64) -> c_int;
    #[link_name = "getaddrinfo"]
    fn ws_getaddrinfo(
        pNodeName: *const c_char,
        pServiceName: *const c_char,
        pHints: *const addrinfo,
        ppResult: *mut *mut addrinfo,
    ) -> c_int;
    #[link_name = "freeaddrinfo"]
    fn ws_freeaddrinfo(pAddrInfo: *mut addrinfo);
    fn WSAPoll(fdArray: *mut pollfd, fds: u32, timeout: c_int) -> c_int;
    fn WSAGetLastError() -> c_int;
}

/// `WSANOTINITIALISED`: Winsock could not be started.
const WSANOTINITIALISED: c_int = 10093;

/// Starts Winsock 2.2 once.
fn startup() -> Result<(), c_int> {
    static START: Once = Once::new();
    static mut STARTED: c_int = WSANOTINITIALISED;
    START.call_once(|| {
        // `WSADATA` is 408 bytes on x64: 512 hold it, 8-aligned.
        let mut data = [0u64; 64];
        // SAFETY: a writable WSADATA-sized buffer.
        let r = unsafe { WSAStartup(0x0202, data.as_mut_ptr()) };
        // SAFETY: written only here, inside `call_once`, read after it.
        unsafe { STARTED = r };
    });
    // SAFETY: `call_once` returned: the write above happened before.
    match unsafe { STARTED } {
        0 => Ok(()),
        e => Err(e),
    }
}

/// `getaddrinfo`, once Winsock is started; its failure is a Winsock error
/// (for [`gai_errno`]).
///
/// # Safety
/// As `getaddrinfo`.
pub unsafe fn getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const addrinfo,
    res: *mut *mut addrinfo,
) -> c_int {
    if let Err(e) = startup() {
        return e;
    }
    // SAFETY: forwarded (caller).
    unsafe { ws_getaddrinfo(node, service, hints, res) }
}

/// `freeaddrinfo`.
///
/// # Safety
/// As `freeaddrinfo`.
pub unsafe fn freeaddrinfo(ai: *mut addrinfo) {
    // SAFETY: forwarded (caller).
    unsafe { ws_freeaddrinfo(ai) }
}

/// `poll` over sockets: `WSAPoll`, -1 with `errno` `EINVAL` on failure (the
/// Winsock error is `WSAGetLastError`'s).
///
/// # Safety
/// As `WSAPoll`.
pub unsafe fn poll(fds: *mut pollfd, nfds: nfds_t, timeout: c_int) -> c_int {
    if let Err(e) = startup() {
        super::set_errno(gai_errno(e));
        return -1;
    }
    // SAFETY: forwarded (caller).
    let r = unsafe { WSAPoll(fds, nfds, timeout) };
    if r < 0 {
        // SAFETY: no arguments.
        super::set_errno(gai_errno(unsafe { WSAGetLastError() }));
    }
    r
}

/// The errno of a Winsock `getaddrinfo` failure, as rdma-core converts
/// the `EAI_*` code it stands for (`ws2tcpip.h` defines each as a `WSA*`
/// error).
#[must_use]
pub fn gai_errno(e: c_int) -> c_int {
    const WSA_NOT_ENOUGH_MEMORY: c_int = 8; // EAI_MEMORY
    const WSAEAFNOSUPPORT: c_int = 10047; // EAI_FAMILY
    const WSAHOST_NOT_FOUND: c_int = 11001; // EAI_NONAME, EAI_NODATA
    const WSATRY_AGAIN: c_int = 11002; // EAI_AGAIN
    const WSANO_DATA: c_int = 11004;
    match e {
        WSAHOST_NOT_FOUND | WSANO_DATA => libc::EADDRNOTAVAIL,
        WSATRY_AGAIN => libc::EAGAIN,
        WSAEAFNOSUPPORT => libc::EAFNOSUPPORT,
        WSA_NOT_ENOUGH_MEMORY => libc::ENOMEM,
        _ => libc::EINVAL,
    }
}
