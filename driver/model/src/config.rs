//! The model HCA's PCI configuration space: what the PCI bus driver reads
//! to enumerate the function (its hardware ID `PCI\VEN_FFFE&DEV_0001`,
//! which `inf/irpverbs.inx` matches) and to size its MSI-X table (the
//! message count the INF's `MessageNumberLimit` allows).
//!
//! The vendor ID is a **placeholder**: 0xFFFE is not a vendor ID the
//! PCI-SIG assigns to anyone (0xFFFF reads back from an empty slot), so
//! the model's ID collides with no real device. A vendor's device reports
//! its own PCI-SIG vendor ID and device ID, and its INF matches those.
//!
//! The space is a type 0 header (64 bytes) followed by one capability,
//! MSI-X, at [`MSIX_CAP_OFFSET`]: [`MSIX_TABLE_SIZE`] entries, the table
//! and its pending-bit array in BAR 0 at [`MSIX_TABLE_OFFSET`] and
//! [`MSIX_PBA_OFFSET`] (the OS programs them; in host mode the platform
//! stands for the OS and grants the messages itself,
//! `HostPlatform::grant_msix`). Everything is little-endian.

use crate::protocol::{BAR_LEN, MAX_EQS};

/// The vendor ID (a placeholder, see the module's documentation).
pub const VENDOR_ID: u16 = 0xFFFE;
/// The device ID.
pub const DEVICE_ID: u16 = 0x0001;
/// The revision ID: the interface version's major number.
pub const REVISION_ID: u8 = (crate::protocol::VERSION >> 16) as u8;
/// The class code (base class, subclass, programming interface): 02h
/// network controller, 07h InfiniBand controller.
pub const CLASS_CODE: u32 = 0x02_07_00;
/// The completion vectors the device has at most (one per processor of a
/// processor group), each with an event queue and an MSI-X message.
pub const MAX_COMP_VECTORS: u16 = 64;
/// The MSI-X table's entries: the async event queue's message and one per
/// completion vector. The INF's `MessageNumberLimit` is this number.
pub const MSIX_TABLE_SIZE: u16 = 1 + MAX_COMP_VECTORS;

/// Bytes of the configuration space (PCI's, not the extended space).
pub const CONFIG_LEN: usize = 256;

/// Offset of the vendor ID (16 bits).
pub const CFG_VENDOR_ID: usize = 0x00;
/// Offset of the device ID (16 bits).
pub const CFG_DEVICE_ID: usize = 0x02;
/// Offset of the status register (16 bits).
pub const CFG_STATUS: usize = 0x06;
/// Offset of the revision ID (8 bits), followed by the class code (24).
pub const CFG_REVISION_ID: usize = 0x08;
/// Offset of the header type (8 bits).
pub const CFG_HEADER_TYPE: usize = 0x0E;
/// Offset of the subsystem vendor ID (16 bits).
pub const CFG_SUBSYSTEM_VENDOR_ID: usize = 0x2C;
/// Offset of the subsystem ID (16 bits).
pub const CFG_SUBSYSTEM_ID: usize = 0x2E;
/// Offset of the capabilities pointer (8 bits).
pub const CFG_CAPABILITIES: usize = 0x34;
/// The status register's capabilities-list bit.
pub const STATUS_CAPABILITIES_LIST: u16 = 1 << 4;
/// The MSI-X capability's ID.
pub const CAP_ID_MSIX: u8 = 0x11;
/// Where the MSI-X capability is.
pub const MSIX_CAP_OFFSET: usize = 0x40;
/// The MSI-X table's offset in BAR 0 (after the registers).
pub const MSIX_TABLE_OFFSET: u32 = 0x3000;
/// The pending-bit array's offset in BAR 0, after the table.
pub const MSIX_PBA_OFFSET: u32 = MSIX_TABLE_OFFSET + MSIX_TABLE_SIZE as u32 * 16;

const _: () = {
    // Every message has an event queue's registers behind it.
    assert!(MSIX_TABLE_SIZE as usize <= MAX_EQS);
    // The table and the PBA fit in BAR 0, past the registers.
    assert!(MSIX_TABLE_OFFSET as usize >= crate::uar::UAR_RESULTS + crate::uar::UAR_PAGES * 8);
    assert!(MSIX_PBA_OFFSET as usize + (MSIX_TABLE_SIZE as usize).div_ceil(64) * 8 <= BAR_LEN);
    // The vectors the soft HCA (the device model's engine) can have.
    assert!(MAX_COMP_VECTORS as u32 == irpverbs_soft::MAX_COMP_VECTORS);
};

const fn put16(space: &mut [u8; CONFIG_LEN], at: usize, v: u16) {
    let b = v.to_le_bytes();
    space[at] = b[0];
    space[at + 1] = b[1];
}

const fn put32(space: &mut [u8; CONFIG_LEN], at: usize, v: u32) {
    let b = v.to_le_bytes();
    let mut i = 0;
    while i < 4 {
        space[at + i] = b[i];
        i += 1;
    }
}

/// The configuration space as the device reports it (read-only: the
/// command register and the MSI-X enable bits the OS writes are not
/// modelled).
pub const CONFIG_SPACE: [u8; CONFIG_LEN] = {
    let mut s = [0u8; CONFIG_LEN];
    put16(&mut s, CFG_VENDOR_ID, VENDOR_ID);
    put16(&mut s, CFG_DEVICE_ID, DEVICE_ID);
    put16(&mut s, CFG_STATUS, STATUS_CAPABILITIES_LIST);
    put32(
        &mut s,
        CFG_REVISION_ID,
        CLASS_CODE << 8 | REVISION_ID as u32,
    );
    // Header type 0 (an endpoint), single function.
    s[CFG_HEADER_TYPE] = 0;
    // BAR 0 and BAR 2 (64-bit memory BARs) are the platform's business:
    // their addresses are assigned by the bus driver and arrive as
    // translated resources.
    put16(&mut s, CFG_SUBSYSTEM_VENDOR_ID, VENDOR_ID);
    put16(&mut s, CFG_SUBSYSTEM_ID, DEVICE_ID);
    s[CFG_CAPABILITIES] = MSIX_CAP_OFFSET as u8;
    // MSI-X: ID, next (none), message control (table size - 1), table
    // offset | BIR 0, PBA offset | BIR 0.
    s[MSIX_CAP_OFFSET] = CAP_ID_MSIX;
    s[MSIX_CAP_OFFSET + 1] = 0;
    put16(&mut s, MSIX_CAP_OFFSET + 2, MSIX_TABLE_SIZE - 1);
    put32(&mut s, MSIX_CAP_OFFSET + 4, MSIX_TABLE_OFFSET);
    put32(&mut s, MSIX_CAP_OFFSET + 8, MSIX_PBA_OFFSET);
    s
};

/// A read of `width` (1, 2 or 4) bytes at `offset` of the configuration
/// space, as `PCI_COMMON_CONFIG` reads give it; outside the space, or a
/// width the bus does not do: all ones, as a master abort reads.
#[must_use]
pub fn read_config(offset: usize, width: usize) -> u32 {
    if !matches!(width, 1 | 2 | 4) || offset % width != 0 {
        return u32::MAX;
    }
    let Some(bytes) = CONFIG_SPACE.get(offset..offset + width) else {
        return u32::MAX;
    };
    let mut v = [0u8; 4];
    v[..width].copy_from_slice(bytes);
    u32::from_le_bytes(v)
}

/// The MSI-X table size a capability at `cap` of `space` declares (its
/// message control's low 11 bits, plus one), or `None` when `cap` is not
/// an MSI-X capability.
#[must_use]
pub fn msix_table_size(space: &[u8], cap: usize) -> Option<u16> {
    if *space.get(cap)? != CAP_ID_MSIX {
        return None;
    }
    let control = u16::from_le_bytes([*space.get(cap + 2)?, *space.get(cap + 3)?]);
    Some((control & 0x7FF) + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_space_names_the_device_and_its_msix_table() {
        assert_eq!(read_config(CFG_VENDOR_ID, 2), u32::from(VENDOR_ID));
        assert_eq!(read_config(CFG_DEVICE_ID, 2), u32::from(DEVICE_ID));
        assert_eq!(read_config(CFG_REVISION_ID, 4) >> 8, CLASS_CODE);
        assert_ne!(
            read_config(CFG_STATUS, 2) as u16 & STATUS_CAPABILITIES_LIST,
            0
        );
        let cap = read_config(CFG_CAPABILITIES, 1) as usize;
        assert_eq!(msix_table_size(&CONFIG_SPACE, cap), Some(MSIX_TABLE_SIZE));
        assert_eq!(read_config(cap + 4, 4), MSIX_TABLE_OFFSET);
        // No further capability.
        assert_eq!(read_config(cap + 1, 1), 0);
        // Misaligned, too wide, or past the space: all ones.
        assert_eq!(read_config(1, 2), u32::MAX);
        assert_eq!(read_config(0, 8), u32::MAX);
        assert_eq!(read_config(CONFIG_LEN, 4), u32::MAX);
        assert_eq!(msix_table_size(&CONFIG_SPACE, 0), None);
    }
}
