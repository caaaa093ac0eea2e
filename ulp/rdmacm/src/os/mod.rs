//! The platform under the library, in one place: event sources and
//! `errno` (the file `ulp/ibverbs` uses too), and the sockets layer —
//! socket addresses, `getaddrinfo` and `poll` — of the C library off
//! Windows (`host.rs`) or of Winsock on Windows x64 (`windows.rs`, whose
//! address families and `addrinfo` layout are Winsock's).

#[path = "../../../ibverbs/src/os/event.rs"]
mod event;
pub use event::*;

#[cfg(not(windows))]
mod host;
#[cfg(not(windows))]
pub use host::*;

#[cfg(windows)]
mod windows;
#[cfg(windows)]
pub use windows::*;
