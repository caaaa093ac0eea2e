//! # irpverbs tools
//!
//! The `irpverbs` command line's work over host devices
//! ([`irpverbs_host::HostDevice`]):
//! - [`demo`]: control-path work end to end, then an unload under the
//!   verifier's leak checks;
//! - [`perf`]: perftest's tests in one process, or between two processes or
//!   hosts over the UDP wire;
//! - [`bench`](mod@bench): the figures of `cargo bench -p irpverbs-tools` and
//!   `irpverbs bench`;
//! - [`pcap::Capture`] records RoCEv2 packets in a pcap file.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod bench;
pub mod demo;
pub mod pcap;
pub mod perf;
pub mod port;
pub mod ucx;
