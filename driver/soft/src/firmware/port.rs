//! The soft HCA's single RoCE port: attributes, GID table and link state.
//!
//! The link model: the host takes the port's link down and up
//! ([`crate::SoftHca::set_port_link`]). Down, the port is `IV_PORT_DOWN`
//! with physical state Disabled (what `ip link set down` makes of an rxe
//! port), transmits nothing (loopback included) and drops what arrives;
//! the change raises `PORT_ERR`, and coming back up `PORT_ACTIVE`. QPs are
//! not moved by the change itself, as on rxe and mlx5: an RC QP's packets
//! are lost, its retransmission timer runs out its `retry_cnt` and its
//! send completes with `RETRY_EXC_ERR`, the QP going to ERR and the rest
//! of its work flushed; a UD send completes (the datagram is lost on the
//! wire). After the link is up again, traffic flows on new QPs and on QPs
//! taken through RESET.

use core::net::IpAddr;

use irpverbs_abi::{
    IV_LINK_LAYER_ETHERNET, IV_MTU_1024, IV_MTU_4096, IV_PORT_ACTIVE, IV_PORT_DOWN, IvQueryPortOut,
    NtStatus, STATUS_INVALID_PARAMETER,
};
use irpverbs_core::CommandOut;

use crate::firmware::Firmware;

/// The only port's number.
pub const PORT_NUM: u8 = 1;
/// GID table entries; index 0 holds the port's address, the rest are zero.
pub const GID_TBL_LEN: u32 = 16;
/// P_Key table entries (just the default P_Key 0xFFFF).
pub const PKEY_TBL_LEN: u32 = 1;
/// Largest message, in bytes.
pub const MAX_MSG_SZ: u32 = 1 << 31;
/// Physical state LinkUp (IBTA PortInfo PortPhysicalState).
pub const PHYS_STATE_LINK_UP: u32 = 5;
/// Physical state Disabled (IBTA PortInfo PortPhysicalState): the link
/// was taken down.
pub const PHYS_STATE_DISABLED: u32 = 3;
/// PortInfo CapabilityMask: IsConnectionManagementSupported (bit 16).
pub const PORT_CAP_CM_SUP: u32 = 1 << 16;
/// Active width 4x (IBTA encoding).
pub const ACTIVE_WIDTH_4X: u8 = 2;
/// Active speed EDR, 25.78125 Gb/s per lane (IBTA encoding): 4x EDR = 100 Gb/s.
pub const ACTIVE_SPEED_EDR: u8 = 0x20;

/// The port's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Port {
    gids: [[u8; 16]; GID_TBL_LEN as usize],
}

impl Port {
    /// A port whose GID 0 is `ip` (IPv4-mapped for IPv4), and GIDs 1, 2,
    /// ... `aliases` (as many as fit).
    pub(crate) fn new(ip: IpAddr, aliases: &[IpAddr]) -> Self {
        let mut gids = [[0; 16]; GID_TBL_LEN as usize];
        for (g, a) in gids.iter_mut().zip(core::iter::once(&ip).chain(aliases)) {
            *g = ip_gid(*a);
        }
        Self { gids }
    }

    /// True if `gid` is one of the port's (non-zero) GIDs.
    pub(crate) fn owns(&self, gid: &[u8; 16]) -> bool {
        *gid != [0; 16] && self.gids.contains(gid)
    }

    /// GID table entry `index`, zero when unused.
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER` when `index` is past the table.
    pub(crate) fn gid(&self, index: u32) -> Result<[u8; 16], NtStatus> {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.gids.get(i))
            .copied()
            .ok_or(STATUS_INVALID_PARAMETER)
    }

    /// GID table entry `index` if it is in use (non-zero).
    pub(crate) fn valid_gid(&self, index: u32) -> Option<[u8; 16]> {
        self.gid(index).ok().filter(|g| *g != [0; 16])
    }

    /// The port's attributes, its link down or up.
    pub(crate) fn attributes(&self, link_down: bool) -> IvQueryPortOut {
        let (state, phys_state) = if link_down {
            (IV_PORT_DOWN, PHYS_STATE_DISABLED)
        } else {
            (IV_PORT_ACTIVE, PHYS_STATE_LINK_UP)
        };
        IvQueryPortOut {
            state,
            phys_state,
            max_mtu: IV_MTU_4096,
            active_mtu: IV_MTU_1024,
            gid_tbl_len: GID_TBL_LEN,
            port_cap_flags: PORT_CAP_CM_SUP,
            max_msg_sz: MAX_MSG_SZ,
            pkey_tbl_len: PKEY_TBL_LEN,
            lid: 0,
            sm_lid: 0,
            lmc: 0,
            max_vl_num: 1,
            active_width: ACTIVE_WIDTH_4X,
            active_speed: ACTIVE_SPEED_EDR,
            link_layer: IV_LINK_LAYER_ETHERNET,
            reserved: [0; 7],
            gid0: self.gids[0],
        }
    }

    /// The active MTU in bytes (UD messages are at most this).
    pub(crate) const fn active_mtu_bytes(&self) -> u32 {
        crate::wire::mtu_bytes(IV_MTU_1024)
    }

    /// Largest path MTU (`IV_MTU_*`).
    pub(crate) const fn max_mtu(&self) -> u32 {
        IV_MTU_4096
    }
}

pub(crate) use crate::wire::ip::ip_gid;

/// Fails unless `port` is the soft HCA's port.
///
/// # Errors
/// `STATUS_INVALID_PARAMETER`.
pub(crate) fn check_port(port: u8) -> Result<(), NtStatus> {
    if port == PORT_NUM {
        Ok(())
    } else {
        Err(STATUS_INVALID_PARAMETER)
    }
}

impl Firmware {
    /// `QueryPort`.
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER` for a port other than 1.
    pub(crate) fn query_port(&self, port: u8) -> Result<CommandOut, NtStatus> {
        check_port(port)?;
        Ok(CommandOut::Port(self.port.attributes(self.dp.link_down)))
    }

    /// `QueryGid`.
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER` for a port other than 1 or an index past
    /// the GID table.
    pub(crate) fn query_gid(&self, port: u8, index: u32) -> Result<CommandOut, NtStatus> {
        check_port(port)?;
        Ok(CommandOut::Gid(self.port.gid(index)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::util::{Dev, IP6};
    use core::net::Ipv6Addr;
    use irpverbs_core::Command;

    #[test]
    fn query_port() {
        let d = Dev::inline();
        let CommandOut::Port(p) = d.ok(Command::QueryPort { port: 1 }) else {
            panic!()
        };
        assert_eq!(p.state, IV_PORT_ACTIVE);
        assert_eq!(p.phys_state, 5);
        assert_eq!(p.max_mtu, IV_MTU_4096);
        assert_eq!(p.active_mtu, IV_MTU_1024);
        assert_eq!(p.gid_tbl_len, 16);
        assert_eq!(p.pkey_tbl_len, 1);
        assert_eq!(p.max_msg_sz, 1 << 31);
        assert_eq!(p.link_layer, IV_LINK_LAYER_ETHERNET);
        assert_eq!(
            p.gid0,
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 127, 0, 0, 1]
        );
        for port in [0, 2, 255] {
            d.fails(Command::QueryPort { port }, STATUS_INVALID_PARAMETER);
        }
    }

    #[test]
    fn query_gid() {
        let d = Dev::inline();
        let mapped = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 127, 0, 0, 1];
        assert_eq!(
            d.ok(Command::QueryGid { port: 1, index: 0 }),
            CommandOut::Gid(mapped)
        );
        for index in 1..16 {
            assert_eq!(
                d.ok(Command::QueryGid { port: 1, index }),
                CommandOut::Gid([0; 16])
            );
        }
        for (port, index) in [(1, 16), (1, u32::MAX), (0, 0), (2, 0)] {
            d.fails(Command::QueryGid { port, index }, STATUS_INVALID_PARAMETER);
        }
    }

    #[test]
    fn ipv6_gid() {
        let d = Dev::with(|c| c.ip = IP6);
        let expect = "fd00::7".parse::<Ipv6Addr>().unwrap().octets();
        assert_eq!(
            d.ok(Command::QueryGid { port: 1, index: 0 }),
            CommandOut::Gid(expect)
        );
    }

    #[test]
    fn aliases_fill_the_gid_table_after_the_address() {
        let alias: IpAddr = "10.0.0.9".parse().unwrap();
        let d = Dev::with(|c| c.aliases = alloc::vec![alias, IpAddr::V6(IP6_ALIAS)]);
        assert_eq!(
            d.ok(Command::QueryGid { port: 1, index: 1 }),
            CommandOut::Gid(ip_gid(alias))
        );
        assert_eq!(
            d.ok(Command::QueryGid { port: 1, index: 2 }),
            CommandOut::Gid(IP6_ALIAS.octets())
        );
        assert_eq!(
            d.ok(Command::QueryGid { port: 1, index: 3 }),
            CommandOut::Gid([0; 16])
        );
        let port = Port::new(IpAddr::V4(core::net::Ipv4Addr::LOCALHOST), &[alias]);
        assert!(port.owns(&ip_gid(alias)) && !port.owns(&[0; 16]));
        // Repeated, unspecified or too many: refused.
        for bad in [
            alloc::vec![alias, alias],
            alloc::vec!["0.0.0.0".parse().unwrap()],
            alloc::vec!["127.0.0.1".parse().unwrap()],
            (1..=16u8)
                .map(|k| IpAddr::V4(core::net::Ipv4Addr::new(10, 1, 0, k)))
                .collect(),
        ] {
            let c = crate::SoftConfig {
                aliases: bad,
                ..crate::SoftConfig::default()
            };
            assert_eq!(c.validate(), Err(STATUS_INVALID_PARAMETER));
        }
    }

    const IP6_ALIAS: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 8);
}
