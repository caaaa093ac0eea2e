//! The RoCEv2 transport: what a doorbell, a received packet and the clock
//! set running.
//!
//! - [`engine`]: the scheduler of the data path (ready queues, timers, the
//!   inbound batch) and the entry points that run it;
//! - [`requester`], [`responder`], [`completer`]: IBTA's three state
//!   machines of a QP, over [`crate::wire::packet`]s;
//! - [`fast`]: the send doorbell's fast path between two local QPs, in
//!   front of the requester for what it takes;
//! - [`local`]: the wire between two QPs of this HCA, short-circuited (the
//!   same state machines, without frames);
//! - [`dma`]: keys to MRs and copies between regions;
//! - [`trust`]: what a connected QP believes, and what it drops;
//! - [`gsi`]: QP1, the management datagrams of the connection manager;
//! - [`apm`]: automatic path migration to a QP's alternate path.

pub(crate) mod apm;
pub(crate) mod completer;
pub(crate) mod dma;
pub(crate) mod engine;
pub(crate) mod fast;
pub(crate) mod gsi;
pub(crate) mod local;
pub(crate) mod requester;
pub(crate) mod responder;
pub(crate) mod trust;
