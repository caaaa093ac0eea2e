//! # irpverbs host C library
//!
//! What a C ULP links against on a non-Windows host (`libirpverbs_host_c`,
//! a cdylib): the driver runs in-process over a soft HCA
//! ([`irpverbs_host::HostDevice`]), reached through
//! - [`win32`], the Win32 subset of `include/irpverbs_host.h`
//!   (`CreateFileA`, `DeviceIoControl`, completion ports);
//! - [`user`], the speed-path library of `include/irpverbs_user.h` and the
//!   host's stand-in for a kernel ULP's query interface
//!   (`include/irpverbs_kernel.h`).
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod user;
pub mod win32;
