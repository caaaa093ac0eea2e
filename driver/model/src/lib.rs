//! # The model HCA: a PCI-style HCA reached only through the hardware seam
//!
//! Two halves, as on real hardware:
//!
//! - [`ModelHca`], the **mini-driver**: an [`irpverbs_core::Hca`] over
//!   [`irpverbs_core::platform::PciPlatform`]. It maps BAR 0, keeps an
//!   mlx5-like command queue (slots with input and output mailboxes) and
//!   event queues in common buffers, formats every command into host
//!   memory and rings the command doorbell, maps registered memory and
//!   the queues' rings (its own memory) with `map_dma` and hands their
//!   page lists (MTTs) to the device in the command's mailbox, and takes command completions, completion
//!   events and async events from its event queues, one MSI-X message per
//!   queue (ISR, then the device's DPCs).
//! - [`Silicon`], the **device model**: it owns BAR 0's registers and
//!   reaches host memory only by DMA at logical addresses
//!   ([`DeviceBus`]: in host mode through the IOMMU model, which bugchecks
//!   0xE6 on any access outside a live mapping, and grants views of
//!   queues and registered memory through their page lists), and signals
//!   MSI-X messages. It executes commands with the soft HCA's firmware
//!   and moves data with its transport, both working on those views.
//!
//! [`protocol`] is the interface between them (registers, command queue,
//! event queue entries, command encoding), [`gsi`] the GSI's MAD rings;
//! [`uar`] the doorbell pages in BAR 2; [`config`] the PCI configuration
//! space (the hardware ID the INF matches, the MSI-X table). Nothing passes around the seam:
//! the device model's engine works on its views of the driver's memory
//! and on its own BAR memory.
//! docs/hardware-seam.md walks through the protocol as a worked example
//! for a vendor's backend.
#![no_std]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

extern crate alloc;

pub mod config;
pub mod gsi;
mod hca;
pub mod protocol;
mod silicon;
pub mod uar;

pub use hca::{ASYNC_EQ_ENTRIES, COMP_EQ_ENTRIES, ModelHca, SLOTS};
pub use silicon::{DeviceBus, Silicon, SiliconStats};
