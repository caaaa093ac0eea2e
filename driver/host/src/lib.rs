//! # irpverbs host
//!
//! Runs the irpverbs driver in user mode: [`platform::HostPlatform`]
//! implements [`irpverbs_core::Platform`] over host threads, emulating
//! KMDF's execution model (IRQL per thread, DPCs, spin locks, tagged pool,
//! requests with cancel, timers, work items) under a verifier that
//! bugchecks with the real Windows codes when a rule is broken.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod platform;
