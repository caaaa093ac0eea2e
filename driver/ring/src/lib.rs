//! # irpverbs ring
//!
//! The speed path's shared memory, in one place: [`Region`] (queue memory and
//! registered memory, accessed only by bounds-checked copies and aligned
//! atomics), the single-producer/single-consumer [`ring`] protocol, and the
//! work and completion queue operations over it — the ULP's side
//! (`post_send`, `post_recv`, `poll_cq`, `req_notify_cq`) and the HCA's side
//! (read and validate a WQE, append a CQE).
//!
//! `no_std` + `alloc`; every `unsafe` block is in [`region`] and carries its
//! `// SAFETY:` argument.
#![no_std]
#![warn(missing_docs)]

extern crate alloc;

pub mod region;
pub mod ring;
pub mod wq;

pub use region::{OutOfBounds, Region};
pub use ring::{Consumer, Corrupt, IndexWord, Producer, Ring};
pub use wq::{CompletionQueue, PostError, RecvQueue, SendQueue, SendWr};
