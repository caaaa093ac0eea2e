//! # irpverbs-cm
//!
//! The InfiniBand connection manager (IBTA volume 1 chapter 12) as a
//! sans-IO engine, `no_std` + `alloc`, no `unsafe`: it never sends,
//! receives, sleeps or reads a clock. The driver feeds it and drains it.
//!
//! - [`msg`]: the CM MADs (REQ, MRA, REJ, REP, RTU, DREQ, DREP, LAP, APR,
//!   SIDR_REQ, SIDR_REP, ClassPortInfo) as zero-copy big-endian views and
//!   typed structs; parsing is checked and never panics.
//! - [`Engine`]: connection endpoints (CEPs) and the CM state machine.
//!
//! ## CEPs and lookups
//!
//! A CEP's local communication ID ([`CepId`]) is its table slot and a
//! generation, rotated by a per-engine seed: lookup by local ID is an index
//! and a check, and an ID does not come back soon after its CEP is freed
//! (the slot waits behind 1024 other free ones, and 256 reuses pass before
//! the ID repeats). Ordered maps (`BTreeMap`, as the OFED and Linux CMs
//! use red-black trees) find a CEP by (remote CA GUID, remote
//! communication ID) — duplicates, REJ by ARI —, by service ID for listens,
//! by (service ID, remote GID) for peer-to-peer connects, and by (remote CA
//! GUID, remote QPN) to detect stale connections. Disconnected CEPs stay in
//! time wait (the primary path's local ACK timeout, at least
//! [`Config::min_timewait`]) before their remote entries go.
//!
//! ## Putting it in the driver
//!
//! One engine per CA, under the CA's spin lock; every call is short,
//! non-blocking and fit for DISPATCH_LEVEL.
//!
//! - **Receive.** The soft HCA's GSI (QP1, UD) receive completion, in the
//!   completion DPC, calls [`Engine::receive`] with the MAD's 256 bytes and
//!   its source as a [`MadAddr`] (the remote GID and LID from the GRH and
//!   work completion, the source QP, and the local port, P_Key index and
//!   GID index the MAD arrived on). No thread switch: the state machine
//!   runs right there.
//! - **Send.** Then [`Engine::poll_transmit`] until empty: each
//!   [`Transmit`] is a UD send on QP1 to its `dest` (Q_Key 0x80010000),
//!   over any wire the soft HCA has.
//! - **Time.** [`Engine::next_deadline`] is when to call
//!   [`Engine::on_timer`] (a platform timer whose DPC calls it with the
//!   current time in nanoseconds). Retransmissions, giving up and time wait
//!   all run from there.
//! - **Events: the polling model.** [`Engine::poll_ready`] names each CEP
//!   that has events, once; the driver completes that CEP's pended
//!   get-event request (or calls a kernel ULP's callback at
//!   DISPATCH_LEVEL), and the owner polls [`Engine::poll_event`] until it
//!   returns `None`, which re-arms the CEP. A listener's
//!   [`Event::ConnectRequest`] hands the owner a new CEP. Each CEP has its
//!   own queue, so the driver can keep one request outstanding per CEP and
//!   refuse a second (busy): connection work on different CEPs proceeds in
//!   parallel.
//!
//! ## Multi-phase requests
//!
//! Connect, accept and disconnect are each one request (IRP) that the
//! driver moves through phases, each an asynchronous QP modify command or
//! a CM call; the engine supplies every QP attribute as plain data
//! ([`QpModify`]: the ABI's `IvQpAttr` and mask, valid for the core's QP
//! state machine).
//!
//! | request | phases | completes on |
//! |---|---|---|
//! | Connect | QP to INIT ([`ConnectParams::init_attr`]); [`Engine::connect`] (REQ); on [`Event::Reply`]: QP to RTR and RTS ([`Engine::qp_attr`] with [`QpTarget::Rtr`], [`QpTarget::Rts`]); [`Engine::rtu`] | the RTU sent; [`Event::Rejected`] or [`Event::Timeout`] fail it |
//! | Accept | on [`Event::ConnectRequest`]: QP to INIT, RTR and RTS ([`Engine::accept_qp_attr`]); [`Engine::accept`] (REP) | [`Event::Established`] (the RTU, or [`Engine::notify_established`] on the QP's COMM_EST event); `Rejected` or `Timeout` fail it |
//! | Reject | [`Engine::reject`] | at once |
//! | Disconnect | [`Engine::disconnect`] (DREQ); QP to ERR ([`QpTarget::Error`]), flushing it | [`Event::DisconnectReply`] or [`Event::Timeout`] |
//! | (passive disconnect) | on [`Event::DisconnectRequest`]: QP to ERR; [`Engine::drep`] | — |
//! | Load path | [`Engine::load_alternate_path`]; on [`Event::AprReceived`]: QP RTS to RTS ([`QpTarget::LoadAlt`]) | the APR |
//!
//! If a QP modify fails, the driver rejects ([`Engine::reject`]) or
//! disconnects and fails the request. [`Engine::destroy`] returns the
//! events the owner had not polled and a [`Event::Canceled`] for a pending
//! operation, with which the driver completes the CEP's pended requests.
//!
//! ## Timeouts and retries
//!
//! IBTA encodes times as 4.096 us * 2^t ([`cm_time`]). A message that
//! waits for an answer is retransmitted after the remote's CM response
//! timeout (the REQ's remote CM response timeout for the active side, its
//! local CM response timeout for the passive side) plus a packet lifetime
//! each way (together the path's local ACK timeout), up to the REQ's max
//! CM retries times; an MRA extends the wait by its service timeout.
//! Giving up sends REJ with reason Timeout (ARI: this CA's GUID) for a
//! connection, and reports [`Event::Timeout`]. Duplicates are answered
//! from state: a REQ again gets the MRA or REP again (REJ stale connection
//! in time wait), a REP again gets the RTU again, a DREQ again gets the
//! DREP again, a LAP again the APR again.
//!
//! ## Allocation
//!
//! The receive path allocates only what a CEP owns: a new CEP's table
//! chunk (1024 at a time), its map entries, and the MAD it keeps to
//! retransmit (one 256-byte box while an answer is awaited). Events live in
//! one slab shared by all CEPs and transmits in one queue; both reuse their
//! space.
#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

extern crate alloc;

mod cep;
mod engine;
mod event;
pub mod fallible;
pub mod msg;
mod params;
mod qp;
mod types;

pub use cep::MAX_CEPS;
pub use engine::{ANY_GID, CmError, Config, Engine, Footprint, MAX_REMOTE_EXP, Stats};
pub use event::Event;
pub use params::{AcceptParams, ConnectParams, SidrParams, SidrReplyParams};
pub use qp::{QpModify, QpTarget};
pub use types::{CepId, LapState, MadAddr, Nanos, Op, State, Transmit, cm_time};

/// A port GID (16 bytes, network order).
pub type Gid = [u8; 16];
