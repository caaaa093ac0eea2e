//! The soft HCA's tests that span its parts (each part's own tests are a
//! `tests` module in its file): [`util`] is their platform, bus and helpers.

mod doorbell;
pub(crate) mod dp;
mod fast_reg;
mod given_rings;
mod gsi;
mod hca;
mod mw;
mod short_circuit;
mod sim;
pub(crate) mod util;
