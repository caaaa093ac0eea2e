//! # irpverbs host
//!
//! Runs the irpverbs driver in user mode on any OS:
//! - [`platform::HostPlatform`] implements [`irpverbs_core::Platform`] over
//!   host threads, emulating KMDF's execution model (IRQL per thread, DPCs,
//!   spin locks, tagged pool, requests with cancel, timers, work items) under
//!   a verifier that bugchecks with the real Windows codes when a rule is
//!   broken;
//! - [`device::HostDevice`] is the driver over a soft HCA, wired as PnP and
//!   the I/O manager wire it on Windows (with [`UserDoorbells::Page`], a
//!   doorbell thread polls user files' doorbell pages and sleeps when they
//!   are quiet, as irpverbs.sys's system thread does);
//! - [`simwire`] cables host devices to the soft HCA's seeded simulated
//!   wire on one virtual clock (deterministic fault-injection tests);
//! - [`udp`] puts a host device's soft HCA on a real UDP wire
//!   ([`HostDevice::attach_udp`]), so that processes and hosts talk;
//! - [`loopwire`] and [`pairwire`] cable host devices in one process.
//!
//! The C library over it is `irpverbs-host-c` (`ulp/host-c`); the command
//! line, captures and benchmarks are `irpverbs-tools` (`tools/irpverbs`).
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod backend;
pub mod device;
pub mod loopwire;
pub mod pairwire;
pub mod platform;
pub mod process;
pub mod simwire;
pub mod udp;

/// The verifier sees every allocation: driver code's heap allocations are
/// charged to its platform's pool ([`platform::heap`]).
#[cfg(feature = "global-allocator")]
#[global_allocator]
static GLOBAL: platform::heap::DriverHeap = platform::heap::DriverHeap;

pub use backend::Backend;
pub use device::{
    CLEANUP_PIN_TIMEOUT, CmSubmitter, Engine, HostDevice, HostDeviceConfig, HostFile, Ioctl,
    SharedFile, Submitted, UserDoorbells,
};
