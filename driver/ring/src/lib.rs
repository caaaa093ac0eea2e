//! # irpverbs ring
//!
//! The speed path's shared memory, in one place: [`Region`] (queue memory and
//! registered memory, accessed only by bounds-checked copies and aligned
//! atomics), the single-producer/single-consumer [`ring`] protocol, and the
//! work and completion queue operations over it — the ULP's side
//! (`post_send`, `post_recv`, `poll_cq`, `req_notify_cq`) and the HCA's side
//! (read and validate a WQE, append a CQE) — and the [`doorbell`] page a
//! user-mode ULP rings its queues through.
//!
//! `no_std` + `alloc`; the `unsafe` blocks are in [`region`], `copy` (the
//! byte mover behind [`Region::copy`]), [`shared`]
//! (a reference count whose allocation can fail) and in the
//! constructors that view a mapping (`Ring::from_map`,
//! `DoorbellPage::from_map`), each with its `// SAFETY:` argument.
#![no_std]
#![warn(missing_docs)]

extern crate alloc;

mod copy;
pub mod doorbell;
pub mod fallible;
pub mod region;
pub mod ring;
pub mod shared;
pub mod wq;

pub use doorbell::DoorbellPage;
pub use fallible::{try_box, try_box_with, try_push, try_vec};
pub use region::{OutOfBounds, Region, Window};
pub use ring::{Consumer, Corrupt, IndexWord, MapError, Producer, Ring, Slots};
pub use shared::{Shared, WeakShared};
pub use wq::{CompletionQueue, PostError, RecvQueue, RecvWr, SendQueue, SendWr};
