//! `IOCTL_IV_RESOLVE_ADDR`: an IP address to the local port, source GID and
//! path that reach it, as rdma_cm's `rdma_resolve_addr` and
//! `rdma_resolve_route` (WinOF's IBAT) do for RoCEv2.
//!
//! The HCA's GID tables are the source of truth, and the driver keeps no
//! copy: one request walks them with commands, one after another, each
//! posted from the previous one's completion in the DPC — `QueryPort` for
//! each port (its state, link layer, active MTU, GID table length and GID
//! 0), then `QueryGid` for the port's other entries. Unused (zero) entries,
//! ports that are not active and ports whose link layer is not Ethernet are
//! skipped. The source is:
//!
//! 1. with a source address, the first GID equal to it (the walk stops
//!    there); none: `STATUS_INVALID_ADDRESS`;
//! 2. without one, a GID equal to the destination (the destination is this
//!    device: loopback; the walk stops there), else the first GID of the
//!    destination's family (an IPv4-mapped GID for IPv4); none:
//!    `STATUS_NETWORK_UNREACHABLE`.
//!
//! The destination GID is the address itself (RoCEv2: IPv4-mapped
//! `::ffff:a.b.c.d` or the IPv6 address). The path: the port's active MTU,
//! hop limit [`HOP_LIMIT`], traffic class, flow label and SL 0, the default
//! P_Key 0xFFFF at index 0 (the command interface has no P_Key query; every
//! RoCE port's table holds it there).

use alloc::boxed::Box;

use irpverbs_abi::*;

use crate::hca::{Command, CommandOut};

/// The hop limit of a resolved path (the IPv6 default, Linux's
/// `IPV6_DEFAULT_HOPLIMIT`, and the TTL RoCEv2 datagrams usually carry).
pub const HOP_LIMIT: u8 = 64;

/// GID table entries read per port at most (the index is a `u8` on the
/// wire of the CM's address vectors).
const MAX_GID_INDEX: u32 = 256;

/// The GID of an IPv4 address: IPv4-mapped.
fn v4_gid(a: [u8; 4]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xFF;
    g[11] = 0xFF;
    g[12..].copy_from_slice(&a);
    g
}

/// True for an IPv4-mapped GID (`::ffff:0:0/96`).
pub(crate) fn is_v4(gid: &[u8; 16]) -> bool {
    gid[..10] == [0; 10] && gid[10..12] == [0xFF, 0xFF]
}

/// One address of a request as a GID (`None` for no address: family
/// `IV_ADDR_NONE` or unspecified).
fn addr_gid(family: u16, addr: &[u8; 16]) -> Result<Option<[u8; 16]>, NtStatus> {
    let gid = match family {
        IV_ADDR_NONE if *addr == [0; 16] => return Ok(None),
        IV_ADDR_IPV4 if addr[4..] == [0; 12] => v4_gid([addr[0], addr[1], addr[2], addr[3]]),
        IV_ADDR_IPV6 => *addr,
        _ => return Err(STATUS_INVALID_PARAMETER),
    };
    let unspecified = if is_v4(&gid) {
        gid[12..] == [0; 4]
    } else {
        gid == [0; 16]
    };
    Ok((!unspecified).then_some(gid))
}

/// A multicast or broadcast address (no unicast route).
fn is_group(gid: &[u8; 16]) -> bool {
    if is_v4(gid) {
        gid[12] >= 224 // 224/4 multicast, 240/4 reserved, broadcast
    } else {
        gid[0] == 0xFF
    }
}

/// An address resolution in progress.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Resolve {
    dgid: [u8; 16],
    sgid: Option<[u8; 16]>,
    ports: u8,
    /// The port being read.
    port: u8,
    /// The next GID index to read on it.
    next: u32,
    /// Its GID table length (bounded by [`MAX_GID_INDEX`]) and active MTU.
    table: u32,
    mtu: u32,
    /// The first GID of the destination's family seen (no source given).
    first: Option<IvResolveAddrOut>,
    /// A `LISTEN_ADDR`'s input, for a walk that checks its GID
    /// ([`Resolve::owner`]).
    listen: Option<IvListenAddrIn>,
}

/// What to do after a step.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Post this command; the request travels with it.
    Next(Box<Resolve>, Command),
    /// Complete the request.
    Done(Result<IvResolveAddrOut, NtStatus>),
}

impl Resolve {
    /// Checks a request and starts it: the first port's query.
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER`: a reserved field not zero, an unknown
    /// family or non-zero IPv4 padding, no destination or a multicast or
    /// broadcast one, a source of the other family;
    /// `STATUS_NETWORK_UNREACHABLE` for a device without ports.
    pub(crate) fn start(
        i: &IvResolveAddrIn,
        caps: &IvQueryDeviceOut,
    ) -> Result<(Self, Command), NtStatus> {
        if i.reserved != 0 || i.dst_family == IV_ADDR_NONE {
            return Err(STATUS_INVALID_PARAMETER);
        }
        let dgid = addr_gid(i.dst_family, &i.dst_addr)?.ok_or(STATUS_INVALID_PARAMETER)?;
        if is_group(&dgid) {
            return Err(STATUS_INVALID_PARAMETER);
        }
        let sgid = addr_gid(i.src_family, &i.src_addr)?;
        if sgid.is_some_and(|s| is_v4(&s) != is_v4(&dgid) || is_group(&s)) {
            return Err(STATUS_INVALID_PARAMETER);
        }
        if caps.phys_port_cnt == 0 {
            return Err(STATUS_NETWORK_UNREACHABLE);
        }
        Ok(Self::walk(dgid, sgid, None, caps.phys_port_cnt))
    }

    /// A walk of `ports` ports from the first one's query.
    fn walk(
        dgid: [u8; 16],
        sgid: Option<[u8; 16]>,
        listen: Option<IvListenAddrIn>,
        ports: u8,
    ) -> (Self, Command) {
        let r = Self {
            listen,
            dgid,
            sgid,
            ports,
            port: 1,
            next: 0,
            table: 0,
            mtu: 0,
            first: None,
        };
        (r, Command::QueryPort { port: 1 })
    }

    /// Starts a walk that finds the GID of a `LISTEN_ADDR` in the active
    /// ports' GID tables (the check that the address is the device's): it
    /// ends with the route through it, or `STATUS_INVALID_ADDRESS`.
    ///
    /// # Errors
    /// `STATUS_INVALID_ADDRESS` for a device without ports.
    pub(crate) fn owner(
        listen: &IvListenAddrIn,
        caps: &IvQueryDeviceOut,
    ) -> Result<(Self, Command), NtStatus> {
        if caps.phys_port_cnt == 0 {
            return Err(STATUS_INVALID_ADDRESS);
        }
        let gid = listen.gid;
        Ok(Self::walk(
            gid,
            Some(gid),
            Some(*listen),
            caps.phys_port_cnt,
        ))
    }

    /// The `LISTEN_ADDR` this walk checks the GID of, if it is one.
    pub(crate) fn listen(&self) -> Option<IvListenAddrIn> {
        self.listen
    }

    /// The route through GID `index` of the current port.
    fn route(&self, index: u32, gid: [u8; 16]) -> IvResolveAddrOut {
        IvResolveAddrOut {
            sgid: gid,
            dgid: self.dgid,
            port_num: self.port,
            sgid_index: u8::try_from(index).unwrap_or(u8::MAX),
            path_mtu: u8::try_from(self.mtu).unwrap_or(0),
            hop_limit: HOP_LIMIT,
            pkey: 0xFFFF,
            pkey_index: 0,
            flow_label: 0,
            traffic_class: 0,
            sl: 0,
            reserved: 0,
        }
    }

    /// Weighs GID `index` of the current port: `Some` ends the walk.
    fn consider(&mut self, index: u32, gid: [u8; 16]) -> Option<IvResolveAddrOut> {
        if gid == [0; 16] {
            return None;
        }
        match self.sgid {
            Some(s) => (gid == s).then(|| self.route(index, gid)),
            None if gid == self.dgid => Some(self.route(index, gid)),
            None => {
                if self.first.is_none() && is_v4(&gid) == is_v4(&self.dgid) {
                    self.first = Some(self.route(index, gid));
                }
                None
            }
        }
    }

    /// The next command of the walk, or its answer when it is over.
    fn advance(mut self: Box<Self>) -> Step {
        if self.next < self.table {
            let index = self.next;
            self.next += 1;
            let port = self.port;
            return Step::Next(self, Command::QueryGid { port, index });
        }
        if self.port < self.ports {
            self.port += 1;
            self.table = 0;
            self.next = 0;
            let port = self.port;
            return Step::Next(self, Command::QueryPort { port });
        }
        Step::Done(match (self.sgid, self.first) {
            (Some(_), _) => Err(STATUS_INVALID_ADDRESS),
            (None, Some(r)) => Ok(r),
            (None, None) => Err(STATUS_NETWORK_UNREACHABLE),
        })
    }

    /// A command of the walk completed with `status` and `out`.
    pub(crate) fn step(mut self: Box<Self>, status: NtStatus, out: CommandOut) -> Step {
        if !nt_success(status) {
            return Step::Done(Err(status));
        }
        match out {
            CommandOut::Port(p) => {
                let up = p.state == IV_PORT_ACTIVE && p.link_layer == IV_LINK_LAYER_ETHERNET;
                if up {
                    self.mtu = p.active_mtu;
                    self.table = p.gid_tbl_len.min(MAX_GID_INDEX);
                    self.next = 1;
                    if self.table > 0 {
                        if let Some(r) = self.consider(0, p.gid0) {
                            return Step::Done(Ok(r));
                        }
                    }
                } else {
                    self.table = 0;
                }
                self.advance()
            }
            CommandOut::Gid(g) => {
                if let Some(r) = self.consider(self.next - 1, g) {
                    return Step::Done(Ok(r));
                }
                self.advance()
            }
            _ => Step::Done(Err(STATUS_DEVICE_HARDWARE_ERROR)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;

    /// A port's attributes, GID 0 and the rest of its table.
    struct Port {
        attr: IvQueryPortOut,
        gids: Vec<[u8; 16]>,
    }

    fn port(active: bool, gids: &[[u8; 16]]) -> Port {
        let mut g = gids.to_vec();
        g.resize(16, [0; 16]);
        Port {
            attr: IvQueryPortOut {
                state: if active { IV_PORT_ACTIVE } else { 1 },
                link_layer: IV_LINK_LAYER_ETHERNET,
                active_mtu: IV_MTU_1024,
                gid_tbl_len: 16,
                gid0: g[0],
                ..IvQueryPortOut::default()
            },
            gids: g,
        }
    }

    /// Runs a resolution against `ports`, counting commands.
    fn run(i: &IvResolveAddrIn, ports: &[Port]) -> (Result<IvResolveAddrOut, NtStatus>, usize) {
        let caps = IvQueryDeviceOut {
            phys_port_cnt: u8::try_from(ports.len()).unwrap(),
            ..IvQueryDeviceOut::default()
        };
        let (r, mut cmd) = match Resolve::start(i, &caps) {
            Ok(x) => x,
            Err(st) => return (Err(st), 0),
        };
        let mut r = Box::new(r);
        let mut n = 1;
        loop {
            let out = match cmd {
                Command::QueryPort { port } => CommandOut::Port(ports[port as usize - 1].attr),
                Command::QueryGid { port, index } => {
                    CommandOut::Gid(ports[port as usize - 1].gids[index as usize])
                }
                ref c => panic!("{c:?}"),
            };
            match r.step(STATUS_SUCCESS, out) {
                Step::Next(next, c) => {
                    r = next;
                    cmd = c;
                    n += 1;
                }
                Step::Done(res) => return (res, n),
            }
        }
    }

    fn v4(a: [u8; 4]) -> [u8; 16] {
        let mut x = [0; 16];
        x[..4].copy_from_slice(&a);
        x
    }

    fn req(dst_family: u16, dst: [u8; 16], src_family: u16, src: [u8; 16]) -> IvResolveAddrIn {
        IvResolveAddrIn {
            dst_addr: dst,
            src_addr: src,
            dst_family,
            src_family,
            reserved: 0,
        }
    }

    const V6A: [u8; 16] = [0xFD, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    const V6B: [u8; 16] = [0xFD, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];

    #[test]
    fn ipv4_picks_the_first_mapped_gid_and_maps_the_destination() {
        let ports = [port(
            true,
            &[V6A, v4_gid([10, 0, 0, 1]), v4_gid([10, 0, 0, 2])],
        )];
        let (r, n) = run(&req(IV_ADDR_IPV4, v4([10, 0, 0, 9]), 0, [0; 16]), &ports);
        let r = r.unwrap();
        assert_eq!((r.port_num, r.sgid_index), (1, 1));
        assert_eq!(r.sgid, v4_gid([10, 0, 0, 1]));
        assert_eq!(r.dgid, v4_gid([10, 0, 0, 9]));
        assert_eq!(
            (r.path_mtu, r.hop_limit, r.pkey),
            (IV_MTU_1024 as u8, 64, 0xFFFF)
        );
        assert_eq!(n, 16, "the whole table read: the destination may be local");
    }

    #[test]
    fn a_local_destination_is_loopback_and_a_source_is_matched_exactly() {
        let ports = [
            port(false, &[v4_gid([10, 0, 0, 5])]),
            port(true, &[v4_gid([10, 0, 0, 1]), v4_gid([10, 0, 0, 2])]),
        ];
        let (r, _) = run(&req(IV_ADDR_IPV4, v4([10, 0, 0, 2]), 0, [0; 16]), &ports);
        assert_eq!(r.map(|r| (r.port_num, r.sgid_index)), Ok((2, 1)));
        let (r, n) = run(
            &req(
                IV_ADDR_IPV4,
                v4([10, 0, 0, 9]),
                IV_ADDR_IPV4,
                v4([10, 0, 0, 2]),
            ),
            &ports,
        );
        assert_eq!(r.map(|r| r.sgid), Ok(v4_gid([10, 0, 0, 2])));
        assert_eq!(n, 3, "port 1 (down), port 2, its GID 1");
        // Owned only by a port that is down: not routable from here.
        let (r, _) = run(
            &req(
                IV_ADDR_IPV4,
                v4([10, 0, 0, 9]),
                IV_ADDR_IPV4,
                v4([10, 0, 0, 5]),
            ),
            &ports,
        );
        assert_eq!(r, Err(STATUS_INVALID_ADDRESS));
    }

    #[test]
    fn ipv6_and_mapped_sources() {
        let ports = [port(true, &[v4_gid([10, 0, 0, 1]), V6A])];
        let (r, _) = run(&req(IV_ADDR_IPV6, V6B, 0, [0; 16]), &ports);
        assert_eq!(r.map(|r| (r.sgid, r.dgid, r.sgid_index)), Ok((V6A, V6B, 1)));
        // An IPv4-mapped IPv6 address is the IPv4 address.
        let (r, _) = run(
            &req(IV_ADDR_IPV6, v4_gid([10, 0, 0, 7]), 0, [0; 16]),
            &ports,
        );
        assert_eq!(r.map(|r| r.sgid_index), Ok(0));
        let (r, _) = run(&req(IV_ADDR_IPV6, V6B, IV_ADDR_IPV6, V6B), &ports);
        assert_eq!(r, Err(STATUS_INVALID_ADDRESS));
        let only_v4 = [port(true, &[v4_gid([10, 0, 0, 1])])];
        let (r, _) = run(&req(IV_ADDR_IPV6, V6B, 0, [0; 16]), &only_v4);
        assert_eq!(r, Err(STATUS_NETWORK_UNREACHABLE));
    }

    #[test]
    fn bad_requests_are_refused_before_any_command() {
        let ports = [port(true, &[v4_gid([10, 0, 0, 1])])];
        let dst = v4([10, 0, 0, 9]);
        let bad = [
            IvResolveAddrIn {
                reserved: 1,
                ..req(IV_ADDR_IPV4, dst, 0, [0; 16])
            },
            req(0, dst, 0, [0; 16]),
            req(5, dst, 0, [0; 16]),
            req(
                IV_ADDR_IPV4,
                [10, 0, 0, 9, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                0,
                [0; 16],
            ),
            req(IV_ADDR_IPV4, [0; 16], 0, [0; 16]),
            req(IV_ADDR_IPV6, [0; 16], 0, [0; 16]),
            req(IV_ADDR_IPV4, v4([224, 0, 0, 1]), 0, [0; 16]),
            req(IV_ADDR_IPV4, v4([255, 255, 255, 255]), 0, [0; 16]),
            req(IV_ADDR_IPV6, [0xFF; 16], 0, [0; 16]),
            req(IV_ADDR_IPV4, dst, IV_ADDR_IPV6, V6A),
            req(IV_ADDR_IPV4, dst, 0, v4([10, 0, 0, 1])),
            req(IV_ADDR_IPV4, dst, 9, v4([10, 0, 0, 1])),
        ];
        for (k, i) in bad.iter().enumerate() {
            assert_eq!(
                run(i, &ports),
                (Err(STATUS_INVALID_PARAMETER), 0),
                "case {k}"
            );
        }
        // An unspecified source is no source.
        let (r, _) = run(&req(IV_ADDR_IPV4, dst, IV_ADDR_IPV4, [0; 16]), &ports);
        assert_eq!(r.map(|r| r.sgid_index), Ok(0));
    }

    #[test]
    fn a_failed_query_ends_the_walk_with_its_status() {
        let caps = IvQueryDeviceOut {
            phys_port_cnt: 1,
            ..IvQueryDeviceOut::default()
        };
        let (r, _) =
            Resolve::start(&req(IV_ADDR_IPV4, v4([10, 0, 0, 9]), 0, [0; 16]), &caps).unwrap();
        assert_eq!(
            Box::new(r).step(STATUS_INVALID_PARAMETER, CommandOut::None),
            Step::Done(Err(STATUS_INVALID_PARAMETER))
        );
    }
}
