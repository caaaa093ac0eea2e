//! rdma_cm's shape over the IOCTL transport: connections named by IP
//! address and port on RoCEv2, as librdmacm offers them.
//!
//! A [`CmId`] is a connection endpoint of the device's CM (a CEP) with
//! addresses:
//!
//! - **active side**: [`CmId::resolve_addr`] (`IOCTL_IV_RESOLVE_ADDR`: the
//!   local port, source GID and path that reach the destination),
//!   [`CmId::resolve_route`] (on RoCE the path comes with the address: no
//!   subnet administrator to ask), [`CmId::connect`] (`IOCTL_IV_CM_CONNECT`
//!   from the route: the service ID of the destination's port in the port
//!   space, a random starting PSN; one request until the connection is
//!   established);
//! - **passive side**: [`CmId::bind_addr`] (the address must be one of the
//!   device's: resolved with itself as source), [`CmId::listen`]
//!   (`IOCTL_IV_LISTEN_ADDR`: REQs for another of the device's addresses
//!   are rejected by the driver with REJ invalid service ID; the
//!   unspecified address takes any), [`CmId::get_request`] (a new `CmId`
//!   for each connect request), [`CmId::accept`], [`CmId::reject`];
//! - both: [`CmId::get_event`], [`CmId::disconnect`]; dropping a `CmId`
//!   destroys its CEP.
//!
//! Service IDs come from the port space as rdma_cm makes them:
//! `0x0000_0000_0106_0000 | port` for [`PortSpace::Tcp`] (RDMA_PS_TCP).
//!
//! The REQ's private data starts with the IP CM header (IBTA annex A11,
//! rdma_cm's): version, IP version, the source port, the source and
//! destination addresses, 36 bytes ([`IpCmHeader`]); the caller's private
//! data follows (at most [`MAX_REQ_PRIVATE_DATA`] bytes). The passive side
//! reads the peer's address and port from it; a request whose header is
//! malformed, or names another destination than the bound address, is
//! rejected (REJ consumer reject) and skipped.

use std::hash::BuildHasher;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use irpverbs_abi::*;

use crate::{Client, IoctlResult, call, call_none};

/// An rdma_cm port space: the top of the service IDs of its ports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PortSpace {
    /// RDMA_PS_TCP: reliable connections (RC).
    Tcp,
    /// RDMA_PS_UDP.
    Udp,
    /// RDMA_PS_IB.
    Ib,
}

impl PortSpace {
    /// The service ID of `port` in this space (`ps << 16 | port`).
    #[must_use]
    pub const fn service_id(self, port: u16) -> u64 {
        let ps = match self {
            PortSpace::Tcp => IV_RDMA_PS_TCP,
            PortSpace::Udp => IV_RDMA_PS_UDP,
            PortSpace::Ib => IV_RDMA_PS_IB,
        };
        ((ps as u64) << 16) | port as u64
    }
}

/// The RoCEv2 GID of an IP address: IPv4-mapped for IPv4.
#[must_use]
pub fn ip_gid(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// The IP address of a RoCEv2 GID (IPv4 for an IPv4-mapped one).
#[must_use]
pub fn gid_ip(gid: &[u8; 16]) -> IpAddr {
    Ipv6Addr::from(*gid).to_canonical()
}

/// The family and bytes `IOCTL_IV_RESOLVE_ADDR` takes for `ip`.
fn ioctl_addr(ip: IpAddr) -> (u16, [u8; 16]) {
    match ip.to_canonical() {
        IpAddr::V4(v4) => {
            let mut a = [0u8; 16];
            a[..4].copy_from_slice(&v4.octets());
            (IV_ADDR_IPV4, a)
        }
        IpAddr::V6(v6) => (IV_ADDR_IPV6, v6.octets()),
    }
}

/// A random value (the process's hasher keys are random).
fn random(salt: u64) -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    std::collections::hash_map::RandomState::new().hash_one((t, salt))
}

/// `IOCTL_IV_RESOLVE_ADDR` for `dst` from `src` (any if `None`).
///
/// # Errors
/// The driver's status: `STATUS_INVALID_ADDRESS` (no port owns `src`),
/// `STATUS_NETWORK_UNREACHABLE`, `STATUS_INVALID_PARAMETER` (an address
/// that names no unicast host, families that differ).
pub fn resolve(c: &Client, src: Option<IpAddr>, dst: IpAddr) -> IoctlResult<IvResolveAddrOut> {
    let (dst_family, dst_addr) = ioctl_addr(dst);
    let (src_family, src_addr) = src.map_or((IV_ADDR_NONE, [0; 16]), ioctl_addr);
    call(
        c,
        IOCTL_IV_RESOLVE_ADDR,
        &IvResolveAddrIn {
            dst_addr,
            src_addr,
            dst_family,
            src_family,
            reserved: 0,
        },
    )
}

/// Bytes of the IP CM header ([`IpCmHeader`]).
pub const IP_CM_HEADER_LEN: usize = 36;
/// The caller's private data a REQ carries after the IP CM header.
pub const MAX_REQ_PRIVATE_DATA: usize = IV_CM_REQ_PDATA as usize - IP_CM_HEADER_LEN;
/// The caller's private data a REP carries.
pub const MAX_REP_PRIVATE_DATA: usize = IV_CM_REP_PDATA as usize;

/// The IP CM header at the front of a REQ's private data (IBTA annex
/// A11, "RDMA IP CM Service"): byte 0 the version (major in the high
/// nibble, minor in the low: 0.0), byte 1 the IP version in the high
/// nibble (4 or 6), bytes 2-3 the source port (big-endian), then the
/// source and the destination address, 16 bytes each (an IPv4 address in
/// the last 4, the 12 before zero).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpCmHeader {
    /// The active side's address and port.
    pub src: SocketAddr,
    /// The address the active side connects to.
    pub dst: IpAddr,
}

impl IpCmHeader {
    /// The header's bytes. `src` and `dst` must be of one family (the
    /// source's wins).
    #[must_use]
    pub fn to_bytes(&self) -> [u8; IP_CM_HEADER_LEN] {
        let mut b = [0u8; IP_CM_HEADER_LEN];
        let put = |b: &mut [u8], ip: IpAddr| match ip.to_canonical() {
            IpAddr::V4(v4) => b[12..16].copy_from_slice(&v4.octets()),
            IpAddr::V6(v6) => b.copy_from_slice(&v6.octets()),
        };
        let v4 = src_is_v4(self.src.ip());
        b[1] = if v4 { 4 << 4 } else { 6 << 4 };
        b[2..4].copy_from_slice(&self.src.port().to_be_bytes());
        put(&mut b[4..20], self.src.ip());
        put(&mut b[20..36], self.dst);
        b
    }

    /// Parses and checks a header at the front of `pd`: version 0.0, IP
    /// version 4 or 6 (an IPv4 address's 12 leading bytes zero), neither
    /// address unspecified.
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER` for a short or malformed header.
    pub fn parse(pd: &[u8]) -> IoctlResult<Self> {
        let b = pd.get(..IP_CM_HEADER_LEN).ok_or(STATUS_INVALID_PARAMETER)?;
        if b[0] != 0 || b[1] & 0x0F != 0 {
            return Err(STATUS_INVALID_PARAMETER);
        }
        let addr = |a: &[u8]| -> IoctlResult<IpAddr> {
            let mut x = [0u8; 16];
            x.copy_from_slice(a);
            let ip = match b[1] >> 4 {
                4 if x[..12] == [0; 12] => IpAddr::V4(Ipv4Addr::new(x[12], x[13], x[14], x[15])),
                6 => IpAddr::V6(Ipv6Addr::from(x)),
                _ => return Err(STATUS_INVALID_PARAMETER),
            };
            if ip.is_unspecified() {
                return Err(STATUS_INVALID_PARAMETER);
            }
            Ok(ip)
        };
        let src = addr(&b[4..20])?;
        let dst = addr(&b[20..36])?;
        Ok(Self {
            src: SocketAddr::new(src, u16::from_be_bytes([b[2], b[3]])),
            dst,
        })
    }
}

fn src_is_v4(ip: IpAddr) -> bool {
    ip.to_canonical().is_ipv4()
}

/// The connection's parameters ([`CmId::connect`], [`CmId::accept`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnParam {
    /// The QP's starting send PSN (24 bits); random if `None`.
    pub starting_psn: Option<u32>,
    /// CM response timeout (4.096 us * 2^t).
    pub cm_response_timeout: u8,
    /// Retries of each CM message.
    pub max_cm_retries: u8,
    /// The path's local ACK timeout (4.096 us * 2^t).
    pub local_ack_timeout: u8,
    /// RDMA READs and atomics accepted in flight as responder.
    pub responder_resources: u8,
    /// RDMA READs and atomics kept in flight as requester.
    pub initiator_depth: u8,
    /// Transport retry count (at most 7).
    pub retry_count: u8,
    /// RNR retry count of the peer's QP (7: infinite).
    pub rnr_retry_count: u8,
    /// This side's minimum RNR NAK timer (IBTA encoding, 1 to 31).
    pub min_rnr_timer: u8,
    /// Private data: the REQ's after the IP CM header (at most
    /// [`MAX_REQ_PRIVATE_DATA`]) or the REP's (at most
    /// [`MAX_REP_PRIVATE_DATA`]).
    pub private_data: Vec<u8>,
}

impl Default for ConnParam {
    /// rdma_cm's: CM response timeout 20 (about 4 s), 15 retries, ACK
    /// timeout 14 (about 67 ms), retry counts 7, 16 READs or atomics in
    /// flight each way, RNR timer 12 (0.64 ms), no private data.
    fn default() -> Self {
        Self {
            starting_psn: None,
            cm_response_timeout: 20,
            max_cm_retries: 15,
            local_ack_timeout: 14,
            responder_resources: 16,
            initiator_depth: 16,
            retry_count: 7,
            rnr_retry_count: 7,
            min_rnr_timer: 12,
            private_data: Vec::new(),
        }
    }
}

impl ConnParam {
    fn psn(&self, salt: u64) -> u32 {
        self.starting_psn
            .unwrap_or_else(|| (random(salt) as u32) & 0xFF_FFFF)
            & 0xFF_FFFF
    }
}

/// An event of a connection's [`CmId`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmEvent {
    /// The passive side's connection is established (the RTU, or the first
    /// receive).
    Established,
    /// A REJ ended the attempt: its IBTA reason code.
    Rejected(u32),
    /// The peer disconnects (DREQ): answer with [`CmId::disconnect`].
    DisconnectRequest,
    /// Time wait is over.
    TimewaitExit,
    /// An exchange gave up after its retries.
    Timeout,
    /// Another `IV_CEP_EVENT_*`.
    Other(u32),
}

/// Where a [`CmId`] is in rdma_cm's sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Idle,
    Bound,
    Listening,
    AddrResolved,
    RouteResolved,
    /// A connect request received, not yet accepted or rejected.
    Request,
    Connected,
}

/// A connection endpoint named by IP addresses and ports (`rdma_cm_id`).
pub struct CmId<'c> {
    c: &'c Client,
    cep: IvHandle,
    ps: PortSpace,
    phase: Phase,
    local: Option<SocketAddr>,
    peer: Option<SocketAddr>,
    route: Option<IvResolveAddrOut>,
    remote_qpn: u32,
    remote_psn: u32,
    private_data: Vec<u8>,
}

impl std::fmt::Debug for CmId<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmId")
            .field("cep", &self.cep)
            .field("ps", &self.ps)
            .field("phase", &self.phase)
            .field("local", &self.local)
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

impl<'c> CmId<'c> {
    /// A new endpoint (`rdma_create_id`): a CEP of the device's CM.
    ///
    /// # Errors
    /// `IOCTL_IV_CREATE_CEP`'s status.
    pub fn new(c: &'c Client, ps: PortSpace) -> IoctlResult<Self> {
        let out: IvCreateCepOut = call(c, IOCTL_IV_CREATE_CEP, &IvCreateCepIn { user_context: 0 })?;
        Ok(Self {
            c,
            cep: out.cep,
            ps,
            phase: Phase::Idle,
            local: None,
            peer: None,
            route: None,
            remote_qpn: 0,
            remote_psn: 0,
            private_data: Vec::new(),
        })
    }

    /// The CEP's handle.
    #[must_use]
    pub fn cep(&self) -> IvHandle {
        self.cep
    }

    /// The local address: bound, or chosen by address resolution (the
    /// source address and an ephemeral port).
    #[must_use]
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local
    }

    /// The peer's address: the destination (active side), or the IP CM
    /// header's source address and port (passive side).
    #[must_use]
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer
    }

    /// The resolved route (active side).
    #[must_use]
    pub fn route(&self) -> Option<&IvResolveAddrOut> {
        self.route.as_ref()
    }

    /// The peer's QP number: the REQ's (passive side) or the REP's (active
    /// side, once connected).
    #[must_use]
    pub fn remote_qpn(&self) -> u32 {
        self.remote_qpn
    }

    /// The peer's starting PSN, from the REQ or the REP as
    /// [`CmId::remote_qpn`].
    #[must_use]
    pub fn remote_psn(&self) -> u32 {
        self.remote_psn
    }

    /// The peer's private data: the REQ's after the IP CM header (passive
    /// side: 56 bytes), the REP's (active side, once connected: 196 bytes);
    /// as CM messages carry it, zero-padded to the message's size.
    #[must_use]
    pub fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    fn expect(&self, phases: &[Phase]) -> IoctlResult<()> {
        if phases.contains(&self.phase) {
            Ok(())
        } else {
            Err(STATUS_INVALID_DEVICE_STATE)
        }
    }

    /// Binds to a local address (`rdma_bind_addr`): one of the device's
    /// (checked by resolving it from itself), or unspecified (any). The
    /// port is the one [`CmId::listen`] takes.
    ///
    /// # Errors
    /// `STATUS_INVALID_DEVICE_STATE` (not a new endpoint),
    /// `STATUS_INVALID_ADDRESS` (no port of the device has the address).
    pub fn bind_addr(&mut self, addr: SocketAddr) -> IoctlResult<()> {
        self.expect(&[Phase::Idle])?;
        let ip = addr.ip().to_canonical();
        if !ip.is_unspecified() {
            resolve(self.c, Some(ip), ip)?;
        }
        self.local = Some(SocketAddr::new(ip, addr.port()));
        self.phase = Phase::Bound;
        Ok(())
    }

    /// Listens on the bound address and port (`rdma_listen`): the service
    /// ID of the port in the port space, REQs for the bound address only
    /// (any of the device's if unspecified, and then no other). Listeners
    /// bound to different addresses of the device share a port.
    ///
    /// # Errors
    /// `STATUS_INVALID_DEVICE_STATE` (not bound), `STATUS_INVALID_PARAMETER`
    /// (port 0), `STATUS_ADDRESS_ALREADY_EXISTS` (the port has a listener on
    /// this address, or this or that one is on any address).
    pub fn listen(&mut self) -> IoctlResult<()> {
        self.expect(&[Phase::Bound])?;
        let local = self.local.ok_or(STATUS_INVALID_DEVICE_STATE)?;
        if local.port() == 0 {
            return Err(STATUS_INVALID_PARAMETER);
        }
        let gid = if local.ip().is_unspecified() {
            [0; 16]
        } else {
            ip_gid(local.ip())
        };
        call_none(
            self.c,
            IOCTL_IV_LISTEN_ADDR,
            &IvListenAddrIn {
                cep: self.cep,
                service_id: self.ps.service_id(local.port()),
                gid,
            },
        )?;
        self.phase = Phase::Listening;
        Ok(())
    }

    /// Resolves `dst` (`rdma_resolve_addr`): the local port, source GID
    /// (`src`'s if given, which must be the device's) and path. The local
    /// address becomes the source with an ephemeral port.
    ///
    /// # Errors
    /// `STATUS_INVALID_DEVICE_STATE` (listening or connected), and
    /// [`resolve`]'s.
    pub fn resolve_addr(&mut self, src: Option<IpAddr>, dst: SocketAddr) -> IoctlResult<()> {
        self.expect(&[Phase::Idle, Phase::Bound, Phase::AddrResolved])?;
        let src = src.or_else(|| self.local.map(|l| l.ip()).filter(|ip| !ip.is_unspecified()));
        let route = resolve(self.c, src, dst.ip())?;
        let port = match self.local {
            Some(l) if l.port() != 0 => l.port(),
            _ => 49152 + (random(u64::from(self.cep as u32)) % 16384) as u16,
        };
        self.local = Some(SocketAddr::new(gid_ip(&route.sgid), port));
        self.peer = Some(SocketAddr::new(dst.ip().to_canonical(), dst.port()));
        self.route = Some(route);
        self.phase = Phase::AddrResolved;
        Ok(())
    }

    /// Resolves the route (`rdma_resolve_route`): on RoCEv2 the path is
    /// the resolved address's (port MTU, hop limit, traffic class, flow
    /// label); nothing is asked of a subnet administrator.
    ///
    /// # Errors
    /// `STATUS_INVALID_DEVICE_STATE` before [`CmId::resolve_addr`].
    pub fn resolve_route(&mut self) -> IoctlResult<()> {
        self.expect(&[Phase::AddrResolved])?;
        self.phase = Phase::RouteResolved;
        Ok(())
    }

    /// Connects the RC QP `qp` (in RESET) to the listener at the resolved
    /// address (`rdma_connect`), as one request: the QP to INIT, the REQ,
    /// on the REP the QP to RTR and RTS, the RTU.
    ///
    /// # Errors
    /// `STATUS_INVALID_DEVICE_STATE` before [`CmId::resolve_route`];
    /// `IOCTL_IV_CM_CONNECT`'s: `STATUS_CONNECTION_REFUSED` (a REJ: no
    /// listener on the port, or one bound to another address),
    /// `STATUS_IO_TIMEOUT`, ...
    pub fn connect(&mut self, qp: IvHandle, param: &ConnParam) -> IoctlResult<()> {
        self.expect(&[Phase::RouteResolved])?;
        let (route, peer) = match (self.route, self.peer) {
            (Some(r), Some(p)) => (r, p),
            _ => return Err(STATUS_INVALID_DEVICE_STATE),
        };
        let local = self.local.ok_or(STATUS_INVALID_DEVICE_STATE)?;
        if param.private_data.len() > MAX_REQ_PRIVATE_DATA {
            return Err(STATUS_INVALID_PARAMETER);
        }
        let mut i = IvCmConnectIn {
            cep: self.cep,
            qp,
            service_id: self.ps.service_id(peer.port()),
            local_gid: route.sgid,
            sgid_index: route.sgid_index,
            remote_gid: route.dgid,
            starting_psn: param.psn(qp),
            cm_response_timeout: param.cm_response_timeout,
            max_cm_retries: param.max_cm_retries,
            local_ack_timeout: param.local_ack_timeout,
            path_mtu: route.path_mtu,
            responder_resources: param.responder_resources,
            initiator_depth: param.initiator_depth,
            retry_count: param.retry_count,
            rnr_retry_count: param.rnr_retry_count,
            min_rnr_timer: param.min_rnr_timer,
            private_data_len: (IP_CM_HEADER_LEN + param.private_data.len()) as u8,
            ..IvCmConnectIn::default()
        };
        let header = IpCmHeader {
            src: local,
            dst: peer.ip(),
        };
        i.private_data[..IP_CM_HEADER_LEN].copy_from_slice(&header.to_bytes());
        i.private_data[IP_CM_HEADER_LEN..][..param.private_data.len()]
            .copy_from_slice(&param.private_data);
        call_none(self.c, IOCTL_IV_CM_CONNECT, &i)?;
        self.phase = Phase::Connected;
        // The REP's values and private data, queued when it came.
        let ev: IvCepEventOut = call(
            self.c,
            IOCTL_IV_GET_CEP_EVENT,
            &IvHandleIn { handle: self.cep },
        )?;
        if ev.event_type == IV_CEP_EVENT_REPLY {
            self.remote_qpn = ev.remote_qpn;
            self.remote_psn = ev.starting_psn;
            let n = usize::from(ev.private_data_len).min(ev.private_data.len());
            self.private_data = ev.private_data[..n].to_vec();
        }
        Ok(())
    }

    /// The next connect request on a listener (`rdma_get_request`): a new
    /// endpoint for the connection, to accept or reject. Waits for one.
    /// Other events of the listener are skipped; so are requests whose IP
    /// CM header is malformed or names another destination than the bound
    /// address, which are rejected (REJ consumer reject).
    ///
    /// # Errors
    /// `STATUS_INVALID_DEVICE_STATE` (not listening), `STATUS_CANCELLED`
    /// (the endpoint was destroyed), the transport's.
    pub fn get_request(&self) -> IoctlResult<CmId<'c>> {
        self.expect(&[Phase::Listening])?;
        loop {
            let ev: IvCepEventOut = call(
                self.c,
                IOCTL_IV_GET_CEP_EVENT,
                &IvHandleIn { handle: self.cep },
            )?;
            if ev.event_type != IV_CEP_EVENT_CONNECT_REQUEST {
                continue;
            }
            let mut id = CmId {
                c: self.c,
                cep: ev.cep,
                ps: self.ps,
                phase: Phase::Request,
                local: self.local,
                peer: None,
                route: None,
                remote_qpn: ev.remote_qpn,
                remote_psn: ev.starting_psn,
                private_data: Vec::new(),
            };
            let n = usize::from(ev.private_data_len).min(ev.private_data.len());
            let bound = self.local.map(|l| l.ip()).filter(|ip| !ip.is_unspecified());
            match IpCmHeader::parse(&ev.private_data[..n]) {
                Ok(h) if bound.is_none_or(|b| b == h.dst.to_canonical()) => {
                    id.local = self
                        .local
                        .map(|l| SocketAddr::new(h.dst.to_canonical(), l.port()));
                    id.peer = Some(SocketAddr::new(h.src.ip().to_canonical(), h.src.port()));
                    id.private_data = ev.private_data[IP_CM_HEADER_LEN..n].to_vec();
                    return Ok(id);
                }
                // Dropping `id` destroys its CEP after the REJ.
                _ => {
                    let _ = id.reject();
                }
            }
        }
    }

    /// Accepts the connect request with the RC QP `qp` (in RESET)
    /// (`rdma_accept`), as one request: the QP to INIT, RTR and RTS, the
    /// REP; completes when the connection is established.
    ///
    /// # Errors
    /// `STATUS_INVALID_DEVICE_STATE` (no request), `IOCTL_IV_CM_ACCEPT`'s.
    pub fn accept(&mut self, qp: IvHandle, param: &ConnParam) -> IoctlResult<()> {
        self.expect(&[Phase::Request])?;
        if param.private_data.len() > MAX_REP_PRIVATE_DATA {
            return Err(STATUS_INVALID_PARAMETER);
        }
        let mut i = IvCmAcceptIn {
            cep: self.cep,
            qp,
            starting_psn: param.psn(qp.rotate_left(7)),
            responder_resources: param.responder_resources,
            initiator_depth: param.initiator_depth,
            rnr_retry_count: param.rnr_retry_count,
            min_rnr_timer: param.min_rnr_timer,
            private_data_len: param.private_data.len() as u8,
            ..IvCmAcceptIn::default()
        };
        i.private_data[..param.private_data.len()].copy_from_slice(&param.private_data);
        call_none(self.c, IOCTL_IV_CM_ACCEPT, &i)?;
        self.phase = Phase::Connected;
        Ok(())
    }

    /// Rejects the connect request (`rdma_reject`): REJ consumer reject.
    ///
    /// # Errors
    /// `STATUS_INVALID_DEVICE_STATE` (no request), `IOCTL_IV_CM_REJECT`'s.
    pub fn reject(&mut self) -> IoctlResult<()> {
        self.expect(&[Phase::Request])?;
        call_none(
            self.c,
            IOCTL_IV_CM_REJECT,
            &IvCmRejectIn {
                cep: self.cep,
                reason: 28,
                ..IvCmRejectIn::default()
            },
        )?;
        self.phase = Phase::Idle;
        Ok(())
    }

    /// The connection's next event (`rdma_get_cm_event`); waits for one.
    ///
    /// # Errors
    /// `STATUS_CANCELLED` (destroyed), the transport's.
    pub fn get_event(&self) -> IoctlResult<CmEvent> {
        let ev: IvCepEventOut = call(
            self.c,
            IOCTL_IV_GET_CEP_EVENT,
            &IvHandleIn { handle: self.cep },
        )?;
        Ok(match ev.event_type {
            IV_CEP_EVENT_ESTABLISHED => CmEvent::Established,
            IV_CEP_EVENT_REJECTED => CmEvent::Rejected(ev.reason),
            IV_CEP_EVENT_DISCONNECT_REQUEST => CmEvent::DisconnectRequest,
            IV_CEP_EVENT_TIMEWAIT_EXIT => CmEvent::TimewaitExit,
            IV_CEP_EVENT_TIMEOUT => CmEvent::Timeout,
            t => CmEvent::Other(t),
        })
    }

    /// Proposes an alternate path for the connection (IBTA's LAP, as
    /// ib_cm's `ib_send_cm_lap`; librdmacm has none), as one request: this
    /// port's GID on the path (`local`, entry `sgid_index` of the GID
    /// table), the peer's (`remote`), the path's ACK timeout (4.096 us *
    /// 2^`timeout`). Accepted by the peer, both QPs load and arm the path
    /// (docs/path-migration.md).
    ///
    /// # Errors
    /// `IOCTL_IV_CM_LAP`'s: `STATUS_CONNECTION_REFUSED` (the peer's APR
    /// rejected it), `STATUS_IO_TIMEOUT`, `STATUS_INVALID_DEVICE_STATE`
    /// (not connected, or a LAP in progress), `STATUS_INVALID_PARAMETER`.
    pub fn load_alternate_path(
        &mut self,
        local: [u8; 16],
        sgid_index: u8,
        remote: [u8; 16],
        timeout: u8,
    ) -> IoctlResult<()> {
        call_none(
            self.c,
            IOCTL_IV_CM_LAP,
            &IvCmLapIn {
                cep: self.cep,
                alt_local_gid: local,
                alt_remote_gid: remote,
                alt_sgid_index: sgid_index,
                alt_local_ack_timeout: timeout,
                ..IvCmLapIn::default()
            },
        )
    }

    /// Answers the peer's LAP (the event `CmEvent::Other(IV_CEP_EVENT_LAP)`)
    /// with an APR: `IV_CM_APR_ACCEPTED` loads and arms the path in the
    /// QP (this port's GID on it is entry `sgid_index`), any other status
    /// (at most `IV_CM_APR_MAX_STATUS`) rejects it.
    ///
    /// # Errors
    /// `IOCTL_IV_CM_APR`'s: `STATUS_INVALID_DEVICE_STATE` (no LAP to
    /// answer), `STATUS_INVALID_PARAMETER`, a QP modify's status.
    pub fn answer_lap(&mut self, status: u8, sgid_index: u8) -> IoctlResult<()> {
        call_none(
            self.c,
            IOCTL_IV_CM_APR,
            &IvCmAprIn {
                cep: self.cep,
                status,
                alt_sgid_index: if status == IV_CM_APR_ACCEPTED {
                    sgid_index
                } else {
                    0
                },
                ..IvCmAprIn::default()
            },
        )
    }

    /// Disconnects (`rdma_disconnect`), as one request: established, the
    /// DREQ and the QP to ERR until the DREP; after the peer's
    /// [`CmEvent::DisconnectRequest`], the QP to ERR and the DREP.
    ///
    /// # Errors
    /// `IOCTL_IV_CM_DISCONNECT`'s (`STATUS_INVALID_DEVICE_STATE` when not
    /// connected).
    pub fn disconnect(&mut self) -> IoctlResult<()> {
        call_none(
            self.c,
            IOCTL_IV_CM_DISCONNECT,
            &IvCmDisconnectIn {
                cep: self.cep,
                ..IvCmDisconnectIn::default()
            },
        )?;
        self.phase = Phase::Idle;
        Ok(())
    }
}

impl Drop for CmId<'_> {
    /// Destroys the CEP (`rdma_destroy_id`): a connection still up is
    /// abandoned as the CM's state asks (REJ or DREQ).
    fn drop(&mut self) {
        let _ = call_none(
            self.c,
            IOCTL_IV_DESTROY_CEP,
            &IvHandleIn { handle: self.cep },
        );
    }
}

/// `Ipv4Addr::UNSPECIFIED` with a port: a wildcard bind.
#[must_use]
pub fn any_v4(port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_ids_and_addresses() {
        assert_eq!(PortSpace::Tcp.service_id(18515), 0x0000_0000_0106_4853);
        assert_eq!(PortSpace::Udp.service_id(1), 0x0111_0001);
        assert_eq!(PortSpace::Ib.service_id(0xFFFF), 0x013F_FFFF);
        let v4: IpAddr = "10.0.0.1".parse().unwrap();
        let v6: IpAddr = "fd00::1".parse().unwrap();
        for ip in [v4, v6] {
            assert_eq!(gid_ip(&ip_gid(ip)), ip);
        }
        assert_eq!(ip_gid(v4)[10..], [0xFF, 0xFF, 10, 0, 0, 1]);
        assert_eq!(
            ioctl_addr(v4),
            (IV_ADDR_IPV4, {
                let mut a = [0; 16];
                a[..4].copy_from_slice(&[10, 0, 0, 1]);
                a
            })
        );
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(ioctl_addr(mapped).0, IV_ADDR_IPV4);
        assert_eq!(ioctl_addr(v6).0, IV_ADDR_IPV6);
        let p = ConnParam::default();
        assert!(p.psn(1) <= 0xFF_FFFF);
        let fixed = ConnParam {
            starting_psn: Some(0x1FF_FFFF),
            ..p
        };
        assert_eq!(fixed.psn(1), 0xFF_FFFF);
    }

    #[test]
    fn the_ip_cm_header_round_trips_and_refuses_malformed_ones() {
        let v4 = IpCmHeader {
            src: "10.0.0.1:50000".parse().unwrap(),
            dst: "10.0.0.2".parse().unwrap(),
        };
        let b = v4.to_bytes();
        assert_eq!(&b[..4], &[0, 0x40, 0xC3, 0x50]);
        assert_eq!(
            &b[4..20],
            &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 0, 0, 1]
        );
        assert_eq!(&b[32..36], &[10, 0, 0, 2]);
        assert_eq!(IpCmHeader::parse(&b), Ok(v4));
        let v6 = IpCmHeader {
            src: "[fd00::1]:7".parse().unwrap(),
            dst: "fd00::2".parse().unwrap(),
        };
        let mut pd = v6.to_bytes().to_vec();
        pd.extend_from_slice(b"user data");
        assert_eq!(IpCmHeader::parse(&pd), Ok(v6));
        let bad = |f: &dyn Fn(&mut [u8; 36])| {
            let mut x = b;
            f(&mut x);
            IpCmHeader::parse(&x)
        };
        assert_eq!(bad(&|x| x[0] = 0x10), Err(STATUS_INVALID_PARAMETER));
        assert_eq!(bad(&|x| x[1] = 0x50), Err(STATUS_INVALID_PARAMETER));
        assert_eq!(bad(&|x| x[1] = 0x41), Err(STATUS_INVALID_PARAMETER));
        assert_eq!(bad(&|x| x[4] = 1), Err(STATUS_INVALID_PARAMETER));
        assert_eq!(bad(&|x| x[32..].fill(0)), Err(STATUS_INVALID_PARAMETER));
        assert_eq!(IpCmHeader::parse(&b[..35]), Err(STATUS_INVALID_PARAMETER));
        assert_eq!(IpCmHeader::parse(&[]), Err(STATUS_INVALID_PARAMETER));
    }
}
