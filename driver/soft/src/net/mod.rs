//! Where the soft HCA's port is cabled: the links a port transmits on and
//! receives from.
//!
//! - [`link`]: the [`Link`](link::Link) trait, RoCEv2 over a datagram wire
//!   (UDP), batching;
//! - [`fabric`]: soft HCAs of one process delivering to each other;
//! - [`sim`]: a seeded, simulated wire on a virtual clock, for tests;
//! - [`sockwire`]: the sans-I/O UDP wire that kernel sockets (WSK) drive.

pub mod fabric;
pub mod link;
pub mod sim;
pub mod sockwire;
