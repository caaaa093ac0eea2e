//! Allocation that fails with a status instead of aborting: the CM crate's
//! helpers ([`irpverbs_cm::fallible`]), which the driver core shares.

pub use irpverbs_cm::fallible::*;
