//! The host's `MmProbeAndLockPages`: before a registration pins a range of
//! the process's memory, every page of it must be mapped, readable, and
//! writable when the HCA may write it. Windows raises
//! `STATUS_ACCESS_VIOLATION` for a range that is not (the SEH shim of
//! irpverbs.sys returns it); host mode returns the same status instead of
//! letting a device that reads the pages (the model HCA touches every page
//! of a registration) fault the process.
//!
//! On Linux the process's mappings are read from `/proc/self/maps`; a
//! system without it (or one where it cannot be read) is not probed.
//!
//! IRQL: PASSIVE_LEVEL or APC_LEVEL in practice (it reads a file), which is
//! where the core pins user memory; kernel ranges at DISPATCH_LEVEL are
//! probed the same way in host mode, where reading the file is harmless.

use irpverbs_abi::{NtStatus, STATUS_ACCESS_VIOLATION};

/// Checks that `[addr, addr + len)` is mapped readable (and writable when
/// `write`) in this process.
///
/// # Errors
/// `STATUS_ACCESS_VIOLATION` when a byte of the range is not mapped, or is
/// not readable, or (with `write`) not writable.
pub(crate) fn probe_range(addr: u64, len: u64, write: bool) -> Result<(), NtStatus> {
    // The system's memory, as the page tables Windows walks: never charged
    // to the driver's heap (nor failed by its low-resources simulation).
    super::heap::uncharged(|| {
        let Some(maps) = read_maps() else {
            return Ok(());
        };
        if covered(&maps, addr, len, write) {
            Ok(())
        } else {
            Err(STATUS_ACCESS_VIOLATION)
        }
    })
}

#[cfg(target_os = "linux")]
fn read_maps() -> Option<String> {
    std::fs::read_to_string("/proc/self/maps").ok()
}

#[cfg(not(target_os = "linux"))]
fn read_maps() -> Option<String> {
    None
}

/// One line of `/proc/self/maps`: `start-end perms ...`, hex addresses.
fn parse_line(line: &str) -> Option<(u64, u64, &str)> {
    let mut fields = line.split_ascii_whitespace();
    let (start, end) = fields.next()?.split_once('-')?;
    let perms = fields.next()?;
    let start = u64::from_str_radix(start, 16).ok()?;
    let end = u64::from_str_radix(end, 16).ok()?;
    Some((start, end, perms))
}

/// Whether the mappings in `maps` (ascending, as the kernel lists them)
/// cover `[addr, addr + len)` without a gap, each readable (and writable
/// when `write`).
pub(crate) fn covered(maps: &str, addr: u64, len: u64, write: bool) -> bool {
    if len == 0 {
        return true;
    }
    let Some(end) = addr.checked_add(len) else {
        return false;
    };
    let mut at = addr;
    for (start, stop, perms) in maps.lines().filter_map(parse_line) {
        if stop <= at {
            continue;
        }
        if start > at {
            return false;
        }
        let readable = perms.as_bytes().first() == Some(&b'r');
        let writable = perms.as_bytes().get(1) == Some(&b'w');
        if !readable || (write && !writable) {
            return false;
        }
        at = stop;
        if at >= end {
            return true;
        }
    }
    false
}
