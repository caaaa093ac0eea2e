//! Doorbell (UAR) pages: the pages of the device's BAR 2 that the driver
//! maps into a process, one per file, for a user-mode ULP to ring its
//! queues' doorbells with no system call.
//!
//! BAR 2 is [`UAR_PAGES`] pages of the device's own memory. The device
//! scans the pages it has opened for rung slots (the soft HCA's doorbell
//! protocol, `irpverbs_ring::doorbell`), and rings the queue each slot is
//! bound to; a slot bound to nothing rings nothing. The driver owns the
//! page indices; for each, BAR 0's registers:
//!
//! - [`REG_UAR_OPEN`] (32-bit write of the index): the device opens page
//!   `index` (zeroes it and starts scanning it); its result register then
//!   holds the page's number (never 0) or, on failure, 0 and the status.
//! - [`REG_UAR_CLOSE`] (32-bit write of the index): the device stops
//!   scanning it and forgets its bindings.
//! - [`REG_UAR_BIND`] (64-bit write of
//!   `index << 48 | kind << 32 | number`, kinds [`UAR_SQ`], ...): binds a
//!   queue to a free slot of the page; the result register holds the slot,
//!   or the status.
//! - [`REG_UAR_RUNG`] (32-bit write): a ULP found the device not polling
//!   its page after ringing it: the device takes what was rung now and
//!   polls its pages again for a while.
//! - [`uar_result`]`(index)` (64-bit read): the last operation's result on
//!   the page: its value in the low 32 bits, its status (an NTSTATUS, 0 on
//!   success) in the high 32.
//!
//! Operations on one index are the driver's to serialize (it holds the
//! index); operations on different indices are independent.

use irpverbs_core::DoorbellTarget;

/// The BAR of UAR pages.
pub const UAR_BAR: u8 = 2;
/// Pages of BAR 2.
pub const UAR_PAGES: usize = 256;
/// Open page `index` (32-bit write).
pub const REG_UAR_OPEN: usize = 0x060;
/// Close page `index` (32-bit write).
pub const REG_UAR_CLOSE: usize = 0x064;
/// Bind a queue to a slot of a page (64-bit write).
pub const REG_UAR_BIND: usize = 0x068;
/// Scan the pages now (32-bit write).
pub const REG_UAR_RUNG: usize = 0x070;
/// Where the pages' result registers start (8 bytes each).
pub const UAR_RESULTS: usize = 0x2000;

/// Bind kind: a QP's send queue.
pub const UAR_SQ: u64 = 1;
/// Bind kind: a QP's receive queue.
pub const UAR_RQ: u64 = 2;
/// Bind kind: an SRQ.
pub const UAR_SRQ: u64 = 3;
/// Bind kind: a CQ's arm doorbell.
pub const UAR_CQ_ARM: u64 = 4;

/// The result register of page `index`.
#[must_use]
pub const fn uar_result(index: usize) -> usize {
    UAR_RESULTS + index * 8
}

/// [`REG_UAR_BIND`]'s value binding `target` on page `index`.
#[must_use]
pub fn encode_bind(index: usize, target: DoorbellTarget) -> u64 {
    let (kind, number) = match target {
        DoorbellTarget::Sq(n) => (UAR_SQ, n),
        DoorbellTarget::Rq(n) => (UAR_RQ, n),
        DoorbellTarget::Srq(n) => (UAR_SRQ, n),
        DoorbellTarget::CqArm(n) => (UAR_CQ_ARM, n),
    };
    ((index as u64) << 48) | (kind << 32) | u64::from(number)
}

/// The page index and target of a [`REG_UAR_BIND`] value (untrusted);
/// `None` for an unknown kind.
#[must_use]
pub fn decode_bind(value: u64) -> Option<(usize, DoorbellTarget)> {
    let number = value as u32;
    let index = (value >> 48) as usize;
    let target = match (value >> 32) & 0xFFFF {
        UAR_SQ => DoorbellTarget::Sq(number),
        UAR_RQ => DoorbellTarget::Rq(number),
        UAR_SRQ => DoorbellTarget::Srq(number),
        UAR_CQ_ARM => DoorbellTarget::CqArm(number),
        _ => return None,
    };
    Some((index, target))
}

/// A result register's value: `value` and `status`.
#[must_use]
pub fn result(value: u32, status: irpverbs_abi::NtStatus) -> u64 {
    (u64::from(status as u32) << 32) | u64::from(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_round_trip_and_unknown_kinds_are_refused() {
        for t in [
            DoorbellTarget::Sq(5),
            DoorbellTarget::Rq(0xFF_FFFF),
            DoorbellTarget::Srq(1),
            DoorbellTarget::CqArm(u32::MAX),
        ] {
            assert_eq!(decode_bind(encode_bind(255, t)), Some((255, t)));
        }
        assert_eq!(decode_bind(9 << 32), None);
        assert!(uar_result(UAR_PAGES - 1) + 8 <= crate::protocol::BAR_LEN);
    }
}
