//! The C library's types rdma-core's structures embed: glibc's off Windows;
//! on Windows x64 winpthreads' `pthread_mutex_t` / `pthread_cond_t` (one
//! pointer-sized word each, as MinGW-w64 declares them) and Winsock's socket
//! addresses (`ws2def.h`, `ws2ipdef.h`; `socklen_t` is an `int`).

#[cfg(not(windows))]
pub use libc::{
    in_addr, in6_addr, pthread_cond_t, pthread_mutex_t, sa_family_t, sockaddr, sockaddr_in,
    sockaddr_in6, sockaddr_storage, socklen_t,
};

#[cfg(windows)]
pub use windows::*;

#[cfg(windows)]
mod windows {
    use core::ffi::{c_char, c_int};

    /// winpthreads' `pthread_mutex_t` (`intptr_t`).
    pub type pthread_mutex_t = isize;
    /// winpthreads' `pthread_cond_t` (`intptr_t`).
    pub type pthread_cond_t = isize;
    /// `ADDRESS_FAMILY`.
    pub type sa_family_t = u16;
    /// `socklen_t` (`int` in `ws2tcpip.h`).
    pub type socklen_t = c_int;

    /// `SOCKADDR`.
    #[repr(C)]
    #[derive(Clone, Copy)]
    pub struct sockaddr {
        pub sa_family: sa_family_t,
        pub sa_data: [c_char; 14],
    }

    /// `IN_ADDR` (as its `S_addr` view).
    #[repr(C)]
    #[derive(Clone, Copy)]
    pub struct in_addr {
        pub s_addr: u32,
    }

    /// `IN6_ADDR` (as its `Byte` view).
    #[repr(C)]
    #[derive(Clone, Copy)]
    pub struct in6_addr {
        pub s6_addr: [u8; 16],
    }

    /// `SOCKADDR_IN`.
    #[repr(C)]
    #[derive(Clone, Copy)]
    pub struct sockaddr_in {
        pub sin_family: sa_family_t,
        pub sin_port: u16,
        pub sin_addr: in_addr,
        pub sin_zero: [c_char; 8],
    }

    /// `SOCKADDR_IN6` (its `sin6_scope_id` view of the scope union).
    #[repr(C)]
    #[derive(Clone, Copy)]
    pub struct sockaddr_in6 {
        pub sin6_family: sa_family_t,
        pub sin6_port: u16,
        pub sin6_flowinfo: u32,
        pub sin6_addr: in6_addr,
        pub sin6_scope_id: u32,
    }

    /// `SOCKADDR_STORAGE`.
    #[repr(C)]
    #[derive(Clone, Copy)]
    pub struct sockaddr_storage {
        pub ss_family: sa_family_t,
        __ss_pad1: [c_char; 6],
        __ss_align: i64,
        __ss_pad2: [c_char; 112],
    }

    const _: () = assert!(size_of::<sockaddr_in>() == 16);
    const _: () = assert!(size_of::<sockaddr_in6>() == 28);
    const _: () = assert!(size_of::<sockaddr_storage>() == 128);
}
