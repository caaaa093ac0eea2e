//! Ids (`rdma_cm_id`): a CEP of the driver's CM with addresses, and the
//! calls that move it: `rdma_create_id`, `rdma_destroy_id`,
//! `rdma_bind_addr`, `rdma_resolve_addr`, `rdma_resolve_route`,
//! `rdma_listen`, `rdma_get_request`, `rdma_connect`, `rdma_accept`,
//! `rdma_reject`, `rdma_disconnect`, `rdma_get_cm_event`,
//! `rdma_ack_cm_event`, `rdma_migrate_id`, `rdma_set_option`, the port
//! getters.
//!
//! The driver's requests that wait for the remote (connect, accept,
//! disconnect, SIDR, the next CEP event) run on an id's worker threads;
//! they queue rdma_cm's events on the id's channel, in rdma_cm's order:
//! `ADDR_RESOLVED`, `ROUTE_RESOLVED` (at once: on RoCE the route comes
//! with the address); on a listener `CONNECT_REQUEST` (a new id); then
//! `ESTABLISHED` (the active side once its QP is in RTS and the RTU left,
//! the passive side on the RTU), or `REJECTED` (status: the REJ's reason),
//! `UNREACHABLE` (status `-ETIMEDOUT`), `CONNECT_ERROR`; `DISCONNECTED`
//! (the peer's DREQ answered, or this side's answered or timed out).
//!
//! An id made without a channel is synchronous, as rdma-core's: it has a
//! private channel, and each call that produces an event waits for it
//! (and fails with its status).

use std::cell::UnsafeCell;
use std::ffi::{c_char, c_int, c_void};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use irpverbs_abi::*;
use irpverbs_verbs::rdma_cm::{IP_CM_HEADER_LEN, IpCmHeader, PortSpace, gid_ip, ip_gid, resolve};

use crate::abi::*;
use crate::channel::{Channel, Event};
use crate::device::{Device, call, call_none, device, errno_of, irpverbs_qp_handle};
use crate::{err, os, ret};

/// The CM's flags as the messages carry them.
const FLOW_CONTROL: u8 = IV_CM_FLOW_CONTROL as u8;
const CM_SRQ: u8 = IV_CM_SRQ as u8;

/// The CM response timeout of a connection's messages (4.096 us * 2^16,
/// about 268 ms; 15 retries, about 4 s in all). A host here is a process:
/// when a program's peer exits, no one answers its DREQ any more, and
/// programs wait for `DISCONNECTED` after `rdma_disconnect` (rdma_cm's
/// 2^20, 4 s per try, would keep them a minute).
const CM_RESPONSE_TIMEOUT: u8 = 16;

/// How long a listener's program may take to accept or reject a connect
/// request: the MRA the listener sends at once asks the requester for
/// 4.096 us * 2^23, about 34 s.
const MRA_SERVICE_TIMEOUT: u8 = 23;

/// Where an id is in rdma_cm's sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    Idle,
    Bound,
    Listening,
    AddrResolved,
    RouteResolved,
    Connecting,
    /// Connected without a QP of the id: the REP came (`CONNECT_RESPONSE`),
    /// `rdma_establish` sends the RTU.
    ConnectResponse,
    /// A connect request received, not yet answered.
    Request,
    Accepting,
    Connected,
    Disconnected,
}

/// What the worker threads and the calls share.
pub(crate) struct State {
    pub phase: Phase,
    pub channel: *mut Channel,
    /// Events of this id the program took, and acknowledged.
    pub reported: u64,
    pub acked: u64,
    /// A `DISCONNECTED` is queued (or about to be) and not taken.
    pub disc_pending: bool,
    /// The resolved route (active side).
    pub route: Option<IvResolveAddrOut>,
    /// The connect request's responder resources and initiator depth
    /// (passive side).
    pub req_depths: (u8, u8),
    /// `RDMA_OPTION_ID_ACK_TIMEOUT`.
    pub ack_timeout: Option<u8>,
    /// `rdma_create_ep`'s QP attributes of a passive id, for the ids
    /// `rdma_get_request` returns.
    pub ep_qp: Option<(ibv_qp_init_attr, *mut c_void)>,
    /// The CQs and channels `rdma_create_qp` made (destroyed with the QP).
    pub own_cqs: bool,
    /// The send PSN of a connection without a QP of the id (its REQ's or
    /// REP's, and `rdma_init_qp_attr`'s RTS before the accept).
    pub psn: u32,
}

/// An id: the `rdma_cm_id` programs see first (shared with the
/// program, which may write it: in a cell).
#[repr(C)]
pub(crate) struct Id {
    cm: UnsafeCell<rdma_cm_id>,
    pub cep: IvHandle,
    pub ps: PortSpace,
    st: Mutex<State>,
    cond: Condvar,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

/// An id crossing to a worker thread.
#[derive(Clone, Copy)]
struct IdRef(*mut Id);
// SAFETY: an id outlives its workers (destroying it joins them), and what
// they touch of it is behind its mutex.
unsafe impl Send for IdRef {}

impl IdRef {
    fn get(&self) -> &Id {
        // SAFETY: alive while the worker runs (see Send).
        unsafe { &*self.0 }
    }
}

impl Id {
    /// The C struct. Only the program's calls on the id touch it (one at a
    /// time, as rdma-core requires of a program); the workers never do.
    #[allow(clippy::mut_from_ref, reason = "the program's struct, in a cell")]
    pub fn cm(&self) -> &mut rdma_cm_id {
        // SAFETY: the cell's contents; no other reference to them lives
        // across this one's use (see above).
        unsafe { &mut *self.cm.get() }
    }

    pub fn state(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `ev` on the id's channel.
    fn queue(&self, ev: Box<Event>) {
        let ch = self.state().channel;
        // SAFETY: the id's channel lives as long as the id.
        unsafe { &*ch }.push(ev);
    }

    /// Starts a worker running `f`, its thread named `name` (a
    /// listener's is `rdma-cm-listen`: a test sees from outside when a
    /// program listens).
    fn spawn(&self, name: &str, f: impl FnOnce(&Id) + Send + 'static) -> Result<(), c_int> {
        let me = IdRef(std::ptr::from_ref(self).cast_mut());
        let t = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || f(me.get()))
            .map_err(|_| libc::ENOMEM)?;
        self.workers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(t);
        Ok(())
    }

    /// The next event of the CEP (waits; fails once the CEP is gone).
    fn cep_event(&self, d: &Device) -> Result<IvCepEventOut, NtStatus> {
        call(d, IOCTL_IV_GET_CEP_EVENT, &IvHandleIn { handle: self.cep })
    }

    /// A synchronous id's wait for the event its call produced, as
    /// rdma-core's `ucma_complete`: the previous one acknowledged, the
    /// new one kept in `cm.event`; its status is the call's error.
    fn complete(&self) -> Result<(), c_int> {
        let ch = self.state().channel;
        // SAFETY: the id's channel.
        if !unsafe { &*ch }.sync {
            return Ok(());
        }
        if !self.cm().event.is_null() {
            // SAFETY: an event of this library, not yet acknowledged.
            unsafe { rdma_ack_cm_event(self.cm().event) };
            self.cm().event = std::ptr::null_mut();
        }
        let mut ev = std::ptr::null_mut();
        // SAFETY: the id's channel; a place for the event.
        if unsafe { rdma_get_cm_event(ch.cast(), &mut ev) } != 0 {
            // SAFETY: the calling thread's errno.
            return Err(crate::os::errno());
        }
        self.cm().event = ev;
        // SAFETY: the event just taken.
        let e = unsafe { &*ev };
        match (e.event, e.status) {
            (_, 0) => Ok(()),
            (RDMA_CM_EVENT_REJECTED, _) => Err(libc::ECONNREFUSED),
            (_, s) if s < 0 => Err(-s),
            (_, s) => Err(s),
        }
    }
}

/// The id behind a program's pointer.
///
/// # Safety
/// `id` is NULL or a live id of this library.
pub(crate) unsafe fn id_of<'a>(id: *mut rdma_cm_id) -> Option<&'a Id> {
    // SAFETY: the `rdma_cm_id` is the first field of its `Id` (caller).
    unsafe { id.cast::<Id>().as_ref() }
}

/// A random value (the process's hasher keys are random).
fn random(salt: u64) -> u64 {
    use std::hash::BuildHasher;
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    std::collections::hash_map::RandomState::new().hash_one((t, salt))
}

/// An ephemeral port.
fn ephemeral(salt: u64) -> u16 {
    49152 + (random(salt) % 16384) as u16
}

/// The socket address at `sa`.
///
/// # Errors
/// `EINVAL` for NULL, `EAFNOSUPPORT` for a family other than IPv4 or IPv6.
///
/// # Safety
/// `sa` is NULL or a `sockaddr` of its family's size.
pub(crate) unsafe fn sockaddr_get(sa: *const os::sockaddr) -> Result<SocketAddr, c_int> {
    // SAFETY: readable (caller).
    let Some(family) = (unsafe { sa.as_ref() }).map(|s| c_int::from(s.sa_family)) else {
        return Err(libc::EINVAL);
    };
    match family {
        os::AF_INET => {
            // SAFETY: an IPv4 socket address (its family).
            let s = unsafe { &*sa.cast::<os::sockaddr_in>() };
            Ok(SocketAddr::new(
                IpAddr::V4(Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr))),
                u16::from_be(s.sin_port),
            ))
        }
        os::AF_INET6 => {
            // SAFETY: an IPv6 socket address (its family).
            let s = unsafe { &*sa.cast::<os::sockaddr_in6>() };
            Ok(SocketAddr::new(
                IpAddr::V6(Ipv6Addr::from(s.sin6_addr.s6_addr)),
                u16::from_be(s.sin6_port),
            ))
        }
        _ => Err(libc::EAFNOSUPPORT),
    }
}

/// `a` as a `sockaddr_storage` (IPv4 as `sockaddr_in`), and its length.
pub(crate) fn sockaddr_of(a: SocketAddr) -> (os::sockaddr_storage, os::socklen_t) {
    // SAFETY: all-zero bytes are a valid sockaddr_storage.
    let mut st: os::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match a {
        SocketAddr::V4(v4) => {
            let sin = os::sockaddr_in {
                sin_family: os::AF_INET as os::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: os::in_addr {
                    s_addr: u32::from(*v4.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: a sockaddr_in fits a sockaddr_storage.
            unsafe { std::ptr::write((&raw mut st).cast(), sin) };
            size_of::<os::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            let sin6 = os::sockaddr_in6 {
                sin6_family: os::AF_INET6 as os::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: 0,
                sin6_addr: os::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: 0,
            };
            // SAFETY: a sockaddr_in6 fits a sockaddr_storage.
            unsafe { std::ptr::write((&raw mut st).cast(), sin6) };
            size_of::<os::sockaddr_in6>()
        }
    };
    (st, len as os::socklen_t)
}

/// The address in `st` (None if it holds none).
fn storage_addr(st: &os::sockaddr_storage) -> Option<SocketAddr> {
    // SAFETY: a sockaddr_storage holds a sockaddr of its family.
    unsafe { sockaddr_get(std::ptr::from_ref(st).cast()) }.ok()
}

/// `ip` in the family of `like` (an IPv4 peer sees IPv4 addresses).
fn family_as(ip: IpAddr, like: IpAddr) -> IpAddr {
    match (ip.to_canonical(), like) {
        (IpAddr::V4(v4), IpAddr::V6(_)) => IpAddr::V6(v4.to_ipv6_mapped()),
        (c, _) => c,
    }
}

/// The port space of `ps`, and the QP type of its ids.
fn port_space(ps: c_int) -> Option<(PortSpace, c_int)> {
    match ps {
        RDMA_PS_TCP => Some((PortSpace::Tcp, IBV_QPT_RC)),
        RDMA_PS_IB => Some((PortSpace::Ib, IBV_QPT_RC)),
        RDMA_PS_UDP => Some((PortSpace::Udp, IBV_QPT_UD)),
        _ => None,
    }
}

/// A new id on `channel` (NULL: a synchronous id with a private channel)
/// for CEP `cep`.
fn new_id(
    channel: *mut Channel,
    context: *mut c_void,
    ps: (PortSpace, c_int),
    rdma_ps: c_int,
    cep: IvHandle,
) -> Result<*mut Id, c_int> {
    let channel = if channel.is_null() {
        Channel::new(true)?
    } else {
        channel
    };
    // SAFETY: all-zero bytes are a valid rdma_route (no addresses, NULL
    // path).
    let route: rdma_route = unsafe { std::mem::zeroed() };
    let id = Box::new(Id {
        cm: UnsafeCell::new(rdma_cm_id {
            verbs: std::ptr::null_mut(),
            channel: channel.cast(),
            context,
            qp: std::ptr::null_mut(),
            route,
            ps: rdma_ps,
            port_num: 0,
            event: std::ptr::null_mut(),
            send_cq_channel: std::ptr::null_mut(),
            send_cq: std::ptr::null_mut(),
            recv_cq_channel: std::ptr::null_mut(),
            recv_cq: std::ptr::null_mut(),
            srq: std::ptr::null_mut(),
            pd: std::ptr::null_mut(),
            qp_type: ps.1,
        }),
        cep,
        ps: ps.0,
        st: Mutex::new(State {
            phase: Phase::Idle,
            channel,
            reported: 0,
            acked: 0,
            disc_pending: false,
            route: None,
            req_depths: (0, 0),
            ack_timeout: None,
            ep_qp: None,
            own_cqs: false,
            psn: (random(cep) as u32) & 0xFF_FFFF,
        }),
        cond: Condvar::new(),
        workers: Mutex::new(Vec::new()),
    });
    Ok(Box::into_raw(id))
}

/// `rdma_create_id`: a new id on `channel` (NULL: synchronous) in port
/// space `ps` (`RDMA_PS_TCP`, `RDMA_PS_UDP`, `RDMA_PS_IB`).
///
/// # Safety
/// `channel` is NULL or a channel of this library; `id` is NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: c_int,
) -> c_int {
    let Some(space) = port_space(ps) else {
        return err(libc::EINVAL);
    };
    if id.is_null() {
        return err(libc::EINVAL);
    }
    let d = match device() {
        Ok(d) => d,
        Err(e) => return err(e),
    };
    let cep = match call::<_, IvCreateCepOut>(d, IOCTL_IV_CREATE_CEP, &IvCreateCepIn::default()) {
        Ok(o) => o.cep,
        Err(s) => return err(errno_of(s)),
    };
    match new_id(channel.cast(), context, space, ps, cep) {
        Ok(p) => {
            // SAFETY: writable (caller).
            unsafe { *id = p.cast() };
            0
        }
        Err(e) => {
            let _ = call_none(d, IOCTL_IV_DESTROY_CEP, &IvHandleIn { handle: cep });
            err(e)
        }
    }
}

/// `rdma_destroy_id`: the CEP goes (a connection still up is abandoned as
/// the CM's state asks: REJ or DREQ), the id's workers end, its events
/// not taken are dropped (a listener's connect requests with their new
/// ids), and it waits until the program acknowledged those it took.
///
/// # Safety
/// `id` is NULL or a live id of this library, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    // SAFETY: forwarded (caller).
    let Some(i) = (unsafe { id_of(id) }) else {
        return err(libc::EINVAL);
    };
    let Ok(d) = device() else {
        return err(libc::ENODEV);
    };
    if !i.cm().event.is_null() {
        // SAFETY: the synchronous id's kept event.
        unsafe { rdma_ack_cm_event(i.cm().event) };
        i.cm().event = std::ptr::null_mut();
    }
    let _ = call_none(d, IOCTL_IV_DESTROY_CEP, &IvHandleIn { handle: i.cep });
    let workers = std::mem::take(&mut *i.workers.lock().unwrap_or_else(PoisonError::into_inner));
    for w in workers {
        let _ = w.join();
    }
    let ch = i.state().channel;
    let me = std::ptr::from_ref(i).cast_mut();
    // SAFETY: the id's channel.
    let dropped = unsafe { &*ch }.drop_where(|e| e.owner == me);
    for e in dropped {
        // A connect request's new id, never seen by the program.
        if e.ev.event == RDMA_CM_EVENT_CONNECT_REQUEST && e.ev.id != id {
            // SAFETY: that id, owned by the event.
            unsafe { rdma_destroy_id(e.ev.id) };
        }
    }
    {
        let mut st = i.state();
        while st.acked < st.reported {
            st = i.cond.wait(st).unwrap_or_else(PoisonError::into_inner);
        }
    }
    if !i.cm().route.path_rec.is_null() {
        // SAFETY: the path record resolve_route boxed.
        drop(unsafe { Box::from_raw(i.cm().route.path_rec) });
    }
    // SAFETY: the id, boxed by new_id, no longer used by any thread.
    let b = unsafe { Box::from_raw(std::ptr::from_ref(i).cast_mut()) };
    // SAFETY: the id's channel.
    if unsafe { &*ch }.sync {
        // SAFETY: its private channel, used by no other id.
        unsafe { Channel::destroy(ch) };
    }
    drop(b);
    0
}

/// Fills the route's source address and what comes with it.
fn set_src(i: &Id, a: SocketAddr) {
    i.cm().route.addr.src_storage = sockaddr_of(a).0;
}

fn set_dst(i: &Id, a: SocketAddr) {
    i.cm().route.addr.dst_storage = sockaddr_of(a).0;
}

/// `rdma_bind_addr`: one of the device's addresses, or the unspecified
/// one (any); port 0 picks an ephemeral port.
///
/// # Safety
/// `id` is NULL or a live id; `addr` is NULL or a socket address.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut os::sockaddr) -> c_int {
    // SAFETY: forwarded (caller).
    let Some(i) = (unsafe { id_of(id) }) else {
        return err(libc::EINVAL);
    };
    // SAFETY: forwarded (caller).
    let a = match unsafe { sockaddr_get(addr) } {
        Ok(a) => a,
        Err(e) => return err(e),
    };
    ret(bind(i, a))
}

pub(crate) fn bind(i: &Id, a: SocketAddr) -> Result<(), c_int> {
    let d = device()?;
    if i.state().phase != Phase::Idle {
        return Err(libc::EINVAL);
    }
    let ip = a.ip();
    if !ip.is_unspecified() {
        let ip = ip.to_canonical();
        resolve(&d.client, Some(ip), ip).map_err(|_| libc::EADDRNOTAVAIL)?;
        i.cm().verbs = d.ctx;
        i.cm().port_num = 1;
    }
    let port = if a.port() == 0 {
        ephemeral(i.cep)
    } else {
        a.port()
    };
    set_src(i, SocketAddr::new(ip, port));
    i.state().phase = Phase::Bound;
    Ok(())
}

/// `rdma_resolve_addr`: the port, source GID and path that reach `dst`
/// (from `src`, or the bound address, if given), through
/// `IOCTL_IV_RESOLVE_ADDR`; `ADDR_RESOLVED` follows (`ADDR_ERROR` with
/// `-ENETUNREACH` for a destination no port reaches).
///
/// # Safety
/// `id` is NULL or a live id; the addresses are NULL or socket addresses.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src_addr: *mut os::sockaddr,
    dst_addr: *mut os::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    // SAFETY: forwarded (caller).
    let Some(i) = (unsafe { id_of(id) }) else {
        return err(libc::EINVAL);
    };
    // SAFETY: forwarded (caller).
    let dst = match unsafe { sockaddr_get(dst_addr) } {
        Ok(a) => a,
        Err(e) => return err(e),
    };
    let src = if src_addr.is_null() {
        None
    } else {
        // SAFETY: forwarded (caller).
        match unsafe { sockaddr_get(src_addr) } {
            Ok(a) => Some(a),
            Err(e) => return err(e),
        }
    };
    ret(resolve_addr(i, src, dst))
}

pub(crate) fn resolve_addr(i: &Id, src: Option<SocketAddr>, dst: SocketAddr) -> Result<(), c_int> {
    let d = device()?;
    let phase = i.state().phase;
    if let Some(s) = src {
        if phase == Phase::Idle {
            bind(i, s)?;
        }
    }
    let phase = i.state().phase;
    if !matches!(phase, Phase::Idle | Phase::Bound | Phase::AddrResolved) {
        return Err(libc::EINVAL);
    }
    if dst.ip().is_unspecified() {
        return Err(libc::EINVAL);
    }
    let bound = storage_addr(&i.cm().route.addr.src_storage);
    let src_ip = bound.map(|b| b.ip()).filter(|ip| !ip.is_unspecified());
    let route = match resolve(
        &d.client,
        src_ip.map(|ip| ip.to_canonical()),
        dst.ip().to_canonical(),
    ) {
        Ok(r) => r,
        Err(STATUS_NETWORK_UNREACHABLE) => {
            let me = std::ptr::from_ref(i).cast_mut();
            i.queue(Event::new(me, RDMA_CM_EVENT_ADDR_ERROR, -libc::ENETUNREACH));
            return i.complete();
        }
        Err(s) => return Err(errno_of(s)),
    };
    let port = match bound {
        Some(b) if b.port() != 0 => b.port(),
        _ => ephemeral(i.cep),
    };
    set_src(
        i,
        SocketAddr::new(family_as(gid_ip(&route.sgid), dst.ip()), port),
    );
    set_dst(i, dst);
    i.cm().route.addr.ibaddr = rdma_ib_addr {
        sgid: ibv_gid { raw: route.sgid },
        dgid: ibv_gid { raw: route.dgid },
        pkey: route.pkey.to_be(),
    };
    i.cm().verbs = d.ctx;
    i.cm().port_num = route.port_num;
    {
        let mut st = i.state();
        st.route = Some(route);
        st.phase = Phase::AddrResolved;
    }
    let me = std::ptr::from_ref(i).cast_mut();
    i.queue(Event::new(me, RDMA_CM_EVENT_ADDR_RESOLVED, 0));
    i.complete()
}

/// `rdma_resolve_route`: on RoCE the path is the resolved address's
/// (`route.path_rec`: the GIDs, the port's MTU, hop limit, P_Key);
/// `ROUTE_RESOLVED` follows.
///
/// # Safety
/// `id` is NULL or a live id.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_resolve_route(id: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    // SAFETY: forwarded (caller).
    let Some(i) = (unsafe { id_of(id) }) else {
        return err(libc::EINVAL);
    };
    let route = {
        let mut st = i.state();
        let Some(r) = st.route.filter(|_| st.phase == Phase::AddrResolved) else {
            return err(libc::EINVAL);
        };
        st.phase = Phase::RouteResolved;
        r
    };
    let path = ibv_sa_path_rec {
        dgid: ibv_gid { raw: route.dgid },
        sgid: ibv_gid { raw: route.sgid },
        flow_label: route.flow_label.to_be(),
        hop_limit: route.hop_limit,
        traffic_class: route.traffic_class,
        reversible: 1,
        numb_path: 1,
        pkey: route.pkey.to_be(),
        sl: route.sl,
        mtu_selector: 2,
        mtu: route.path_mtu,
        rate_selector: 2,
        rate: 3,
        packet_life_time_selector: 2,
        ..ibv_sa_path_rec::default()
    };
    if !i.cm().route.path_rec.is_null() {
        // SAFETY: the record this function boxed before.
        drop(unsafe { Box::from_raw(i.cm().route.path_rec) });
    }
    i.cm().route.path_rec = Box::into_raw(Box::new(path));
    i.cm().route.num_paths = 1;
    let me = std::ptr::from_ref(i).cast_mut();
    i.queue(Event::new(me, RDMA_CM_EVENT_ROUTE_RESOLVED, 0));
    ret(i.complete())
}

/// `rdma_listen`: connect requests for the bound address and port (an id
/// not bound listens on any address, on an ephemeral port), each a
/// `CONNECT_REQUEST` with a new id. `EADDRINUSE` for a port with a
/// listener on the address (or on any).
///
/// # Safety
/// `id` is NULL or a live id.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_listen(id: *mut rdma_cm_id, _backlog: c_int) -> c_int {
    // SAFETY: forwarded (caller).
    let Some(i) = (unsafe { id_of(id) }) else {
        return err(libc::EINVAL);
    };
    ret(listen(i))
}

fn listen(i: &Id) -> Result<(), c_int> {
    let d = device()?;
    if i.state().phase == Phase::Idle {
        bind(i, SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0))?;
    }
    if i.state().phase != Phase::Bound {
        return Err(libc::EINVAL);
    }
    let local = storage_addr(&i.cm().route.addr.src_storage).ok_or(libc::EINVAL)?;
    let gid = if local.ip().is_unspecified() {
        [0; 16]
    } else {
        ip_gid(local.ip())
    };
    call_none(
        d,
        IOCTL_IV_LISTEN_ADDR,
        &IvListenAddrIn {
            cep: i.cep,
            service_id: i.ps.service_id(local.port()),
            gid,
        },
    )
    .map_err(errno_of)?;
    i.state().phase = Phase::Listening;
    // What the requests' ids inherit, copied: workers never read the
    // program's struct.
    let inherit = Inherit {
        context: i.cm().context as usize,
        ps: i.cm().ps,
        port: local.port(),
    };
    i.spawn("rdma-cm-listen", move |l| listener(l, inherit))
}

/// What a listener's requests' ids inherit from it.
#[derive(Clone, Copy)]
struct Inherit {
    /// `id->context`.
    context: usize,
    /// `id->ps`.
    ps: c_int,
    /// The port it listens on.
    port: u16,
}

/// A listener's worker: each connect request (or SIDR request) a new id
/// and a `CONNECT_REQUEST` on the listener's channel, until the CEP goes.
fn listener(l: &Id, inherit: Inherit) {
    let Ok(d) = device() else { return };
    while let Ok(ev) = l.cep_event(d) {
        let sidr = match ev.event_type {
            IV_CEP_EVENT_CONNECT_REQUEST => false,
            IV_CEP_EVENT_SIDR_REQUEST => true,
            _ => continue,
        };
        let n = usize::from(ev.private_data_len).min(ev.private_data.len());
        let pd = &ev.private_data[..n];
        let Ok(h) = IpCmHeader::parse(pd) else {
            refuse(d, ev.cep, sidr);
            continue;
        };
        if let Err(()) = request(l, d, &ev, h, inherit, sidr) {
            refuse(d, ev.cep, sidr);
        } else if !sidr {
            // The program answers when it gets to it: the MRA keeps the
            // requester waiting that long (its own timeout is short).
            let _ = call_none(
                d,
                IOCTL_IV_CM_MRA,
                &IvCmMraIn {
                    cep: ev.cep,
                    service_timeout: MRA_SERVICE_TIMEOUT,
                    ..IvCmMraIn::default()
                },
            );
        }
    }
}

/// Turns down a request the listener cannot take (a malformed IP CM
/// header, no memory): REJ consumer reject, or SIDR_REP "rejected".
fn refuse(d: &Device, cep: IvHandle, sidr: bool) {
    if sidr {
        let _ = call_none(
            d,
            IOCTL_IV_SIDR_REPLY,
            &IvSidrReplyIn {
                cep,
                status: 2,
                ..IvSidrReplyIn::default()
            },
        );
    } else {
        let _ = call_none(
            d,
            IOCTL_IV_CM_REJECT,
            &IvCmRejectIn {
                cep,
                reason: 28,
                ..IvCmRejectIn::default()
            },
        );
    }
    let _ = call_none(d, IOCTL_IV_DESTROY_CEP, &IvHandleIn { handle: cep });
}

/// The new id of a connect request and its event.
fn request(
    l: &Id,
    d: &Device,
    ev: &IvCepEventOut,
    h: IpCmHeader,
    inherit: Inherit,
    sidr: bool,
) -> Result<(), ()> {
    let lch = l.state().channel;
    // SAFETY: the listener's channel.
    let sync = unsafe { &*lch }.sync;
    let ps = if sidr {
        (PortSpace::Udp, IBV_QPT_UD)
    } else {
        (l.ps, IBV_QPT_RC)
    };
    let channel = if sync { std::ptr::null_mut() } else { lch };
    let nid = new_id(
        channel,
        inherit.context as *mut c_void,
        ps,
        inherit.ps,
        ev.cep,
    )
    .map_err(|_| ())?;
    // SAFETY: just made, not yet seen by any other thread.
    let n = unsafe { &*nid };
    let local = SocketAddr::new(family_as(h.dst, h.src.ip()), inherit.port);
    set_src(n, local);
    set_dst(n, h.src);
    n.cm().route.addr.ibaddr = rdma_ib_addr {
        sgid: ibv_gid { raw: ip_gid(h.dst) },
        dgid: ibv_gid { raw: ev.remote_gid },
        pkey: ev.pkey.to_be(),
    };
    n.cm().verbs = d.ctx;
    n.cm().port_num = 1;
    {
        let mut st = n.state();
        st.phase = Phase::Request;
        st.req_depths = (ev.responder_resources, ev.initiator_depth);
        st.ep_qp = l.state().ep_qp;
    }
    let len = usize::from(ev.private_data_len).min(ev.private_data.len());
    let user = &ev.private_data[IP_CM_HEADER_LEN.min(len)..len];
    let mut e = Event::new(nid, RDMA_CM_EVENT_CONNECT_REQUEST, 0).with_pdata(user);
    e.ev.listen_id = std::ptr::from_ref(l).cast_mut().cast();
    e.owner = std::ptr::from_ref(l).cast_mut();
    if sidr {
        // SAFETY: the UD form of the parameters (pointer and length set).
        let ud = unsafe { &mut e.ev.param.ud };
        ud.ah_attr = ah_to(&ev.remote_gid, 0, 64);
        ud.qp_num = ev.remote_qpn;
        ud.qkey = RDMA_UDP_QKEY;
    } else {
        // SAFETY: the connection form of the parameters.
        let c = unsafe { &mut e.ev.param.conn };
        c.responder_resources = ev.responder_resources;
        c.initiator_depth = ev.initiator_depth;
        c.flow_control = u8::from(ev.flags & FLOW_CONTROL != 0);
        c.retry_count = ev.retry_count;
        c.rnr_retry_count = ev.rnr_retry_count;
        c.srq = u8::from(ev.flags & CM_SRQ != 0);
        c.qp_num = ev.remote_qpn;
    }
    l.queue(e);
    Ok(())
}

/// An address vector to the GID `dgid` from GID index `sgid_index`.
fn ah_to(dgid: &[u8; 16], sgid_index: u8, hop_limit: u8) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: *dgid },
            flow_label: 0,
            sgid_index,
            hop_limit,
            traffic_class: 0,
        },
        dlid: 0,
        sl: 0,
        src_path_bits: 0,
        static_rate: 0,
        is_global: 1,
        port_num: 1,
    }
}

/// `rdma_get_request`: a synchronous listener's next connect request, as
/// a new (synchronous) id holding its event, with a QP if the listener
/// came from `rdma_create_ep` with QP attributes.
///
/// # Safety
/// `listen` is NULL or a live id; `id` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    // SAFETY: forwarded (caller).
    let Some(l) = (unsafe { id_of(listen) }) else {
        return err(libc::EINVAL);
    };
    let ch = l.state().channel;
    // SAFETY: the id's channel.
    if id.is_null() || !unsafe { &*ch }.sync {
        return err(libc::EINVAL);
    }
    if !l.cm().event.is_null() {
        // SAFETY: the listener's kept event.
        unsafe { rdma_ack_cm_event(l.cm().event) };
        l.cm().event = std::ptr::null_mut();
    }
    let mut ev = std::ptr::null_mut();
    // SAFETY: the listener's channel; a place for the event.
    if unsafe { rdma_get_cm_event(ch.cast(), &mut ev) } != 0 {
        return -1;
    }
    // SAFETY: the event just taken.
    let e = unsafe { &*ev };
    let fail = |code| {
        // SAFETY: the event, acknowledged once.
        unsafe { rdma_ack_cm_event(ev) };
        err(code)
    };
    if e.event == RDMA_CM_EVENT_REJECTED {
        return fail(libc::ECONNREFUSED);
    }
    if e.status != 0 {
        return fail(e.status.abs());
    }
    if e.event != RDMA_CM_EVENT_CONNECT_REQUEST {
        return fail(libc::EINVAL);
    }
    // SAFETY: the new id of the request.
    let Some(n) = (unsafe { id_of(e.id) }) else {
        return fail(libc::EINVAL);
    };
    let ep = n.state().ep_qp;
    if let Some((mut attr, pd)) = ep {
        // SAFETY: the new id; attributes copied from rdma_create_ep's.
        if unsafe { crate::qp::rdma_create_qp(e.id, pd, &mut attr) } != 0 {
            // SAFETY: the calling thread's errno.
            let code = crate::os::errno();
            // SAFETY: the request's id, not handed out.
            unsafe { rdma_destroy_id(e.id) };
            return fail(code);
        }
    }
    n.cm().event = ev;
    // SAFETY: writable (caller).
    unsafe { *id = e.id };
    0
}

/// The responder resources or initiator depth asked for: `RDMA_MAX_*`
/// (or no parameters) means the device's maximum; more than it is
/// `EINVAL`, as rdma-core checks.
fn depth(asked: Option<u8>, max: u8) -> Result<u8, c_int> {
    match asked {
        None | Some(0xFF) => Ok(max),
        Some(v) if v > max => Err(libc::EINVAL),
        Some(v) => Ok(v),
    }
}

/// The private data of `param` (at most `max` bytes: `EINVAL` otherwise).
///
/// # Safety
/// `p` is NULL or valid parameters whose data holds their length.
unsafe fn pdata(p: Option<&rdma_conn_param>, max: usize) -> Result<&[u8], c_int> {
    let Some(p) = p else { return Ok(&[]) };
    let n = usize::from(p.private_data_len);
    if n == 0 {
        return Ok(&[]);
    }
    if p.private_data.is_null() || n > max {
        return Err(libc::EINVAL);
    }
    // SAFETY: `n` readable bytes (caller).
    Ok(unsafe { std::slice::from_raw_parts(p.private_data.cast::<u8>(), n) })
}

/// `rdma_connect`: RC, the driver's `CM_CONNECT` of the id's QP (which it
/// moves to INIT, RTR and RTS), `ESTABLISHED` when it completes (with
/// the REP's private data); UD, a SIDR request, `ESTABLISHED` with the
/// remote QP, Q_Key and address vector.
///
/// # Safety
/// `id` is NULL or a live id; `conn_param` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_connect(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    // SAFETY: forwarded (caller).
    let Some(i) = (unsafe { id_of(id) }) else {
        return err(libc::EINVAL);
    };
    // SAFETY: NULL or valid (caller).
    let p = unsafe { conn_param.as_ref() };
    ret(connect(i, p))
}

fn connect(i: &Id, p: Option<&rdma_conn_param>) -> Result<(), c_int> {
    let d = device()?;
    let (route, phase, ack) = {
        let st = i.state();
        (st.route, st.phase, st.ack_timeout)
    };
    let Some(route) = route.filter(|_| phase == Phase::RouteResolved) else {
        return Err(libc::EINVAL);
    };
    let local = storage_addr(&i.cm().route.addr.src_storage).ok_or(libc::EINVAL)?;
    let peer = storage_addr(&i.cm().route.addr.dst_storage).ok_or(libc::EINVAL)?;
    let header = IpCmHeader {
        src: local,
        dst: peer.ip(),
    }
    .to_bytes();
    let service_id = i.ps.service_id(peer.port());
    if i.cm().qp_type == IBV_QPT_UD {
        // SAFETY: forwarded (caller).
        let user = unsafe { pdata(p, IV_CM_SIDR_REQ_PDATA as usize - IP_CM_HEADER_LEN) }?;
        let mut input = IvSidrRequestIn {
            cep: i.cep,
            service_id,
            remote_gid: route.dgid,
            pkey: route.pkey,
            timeout: 18,
            max_retries: 3,
            private_data_len: (IP_CM_HEADER_LEN + user.len()) as u8,
            ..IvSidrRequestIn::default()
        };
        input.private_data[..IP_CM_HEADER_LEN].copy_from_slice(&header);
        input.private_data[IP_CM_HEADER_LEN..][..user.len()].copy_from_slice(user);
        i.state().phase = Phase::Connecting;
        i.spawn("rdma-cm", move |i| sidr(i, &input, &route))?;
        return i.complete();
    }
    // SAFETY: forwarded (caller).
    let user = unsafe { pdata(p, IV_CM_REQ_PDATA as usize - IP_CM_HEADER_LEN) }?;
    let own = own_qp(i, p)?;
    let mut input = IvCmConnectIn {
        cep: i.cep,
        qp: own.qp,
        qpn: own.qpn,
        service_id,
        local_gid: route.sgid,
        sgid_index: route.sgid_index,
        remote_gid: route.dgid,
        starting_psn: own.psn,
        cm_response_timeout: CM_RESPONSE_TIMEOUT,
        max_cm_retries: 15,
        local_ack_timeout: ack.unwrap_or(14),
        path_mtu: route.path_mtu,
        responder_resources: depth(p.map(|p| p.responder_resources), d.max_rd_atom)?,
        initiator_depth: depth(p.map(|p| p.initiator_depth), d.max_init_rd_atom)?,
        retry_count: p.map_or(7, |p| p.retry_count.min(7)),
        rnr_retry_count: p.map_or(7, |p| p.rnr_retry_count.min(7)),
        min_rnr_timer: 12,
        flags: own.srq
            | if p.is_some_and(|p| p.flow_control != 0) {
                FLOW_CONTROL
            } else {
                0
            },
        private_data_len: (IP_CM_HEADER_LEN + user.len()) as u8,
        ..IvCmConnectIn::default()
    };
    input.private_data[..IP_CM_HEADER_LEN].copy_from_slice(&header);
    input.private_data[IP_CM_HEADER_LEN..][..user.len()].copy_from_slice(user);
    i.state().phase = Phase::Connecting;
    i.spawn("rdma-cm", move |i| connect_rc(i, &input))?;
    i.complete()
}

/// The active side's worker: `CM_CONNECT`, then the connection's events.
fn connect_rc(i: &Id, input: &IvCmConnectIn) {
    let Ok(d) = device() else { return };
    let me = std::ptr::from_ref(i).cast_mut();
    match call_none(d, IOCTL_IV_CM_CONNECT, input) {
        Ok(()) => {
            // The REP, queued on the CEP when it came.
            let rep = loop {
                match i.cep_event(d) {
                    Ok(e) if e.event_type == IV_CEP_EVENT_REPLY => break e,
                    Ok(_) => {}
                    Err(_) => return,
                }
            };
            // Without a QP of the id, the program moves its QP and
            // answers with `rdma_establish`.
            let (phase, event) = if input.qp == 0 {
                (Phase::ConnectResponse, RDMA_CM_EVENT_CONNECT_RESPONSE)
            } else {
                (Phase::Connected, RDMA_CM_EVENT_ESTABLISHED)
            };
            i.state().phase = phase;
            let n = usize::from(rep.private_data_len).min(rep.private_data.len());
            let mut e = Event::new(me, event, 0).with_pdata(&rep.private_data[..n]);
            // SAFETY: the connection form of the parameters.
            let c = unsafe { &mut e.ev.param.conn };
            c.responder_resources = rep.responder_resources;
            c.initiator_depth = rep.initiator_depth;
            c.flow_control = u8::from(rep.flags & FLOW_CONTROL != 0);
            c.rnr_retry_count = rep.rnr_retry_count;
            c.srq = u8::from(rep.flags & CM_SRQ != 0);
            c.qp_num = rep.remote_qpn;
            i.queue(e);
            connected(i, d);
        }
        Err(STATUS_CONNECTION_REFUSED) => {
            let rej = loop {
                match i.cep_event(d) {
                    Ok(e) if e.event_type == IV_CEP_EVENT_REJECTED => break e,
                    Ok(_) => {}
                    Err(_) => return,
                }
            };
            i.state().phase = Phase::Idle;
            let n = usize::from(rej.private_data_len).min(rej.private_data.len());
            i.queue(
                Event::new(me, RDMA_CM_EVENT_REJECTED, rej.reason as c_int)
                    .with_pdata(&rej.private_data[..n]),
            );
        }
        Err(STATUS_CANCELLED | STATUS_INVALID_HANDLE) => {}
        Err(s) => failed(i, s),
    }
}

/// The QP an RC connect or accept names: the id's (the driver's CM moves
/// it), or without one the program's (`qp_num` and `srq` of the
/// parameters; the program moves it with `rdma_init_qp_attr`).
struct OwnQp {
    /// The id's QP's handle; 0 without one.
    qp: IvHandle,
    /// Without a QP of the id: the program's QP number.
    qpn: u32,
    /// The request's send PSN.
    psn: u32,
    /// `CM_SRQ` when the program's QP has an SRQ.
    srq: u8,
}

/// The [`OwnQp`] of `i` with the parameters `p`. `EINVAL` without a QP
/// and without parameters (as rdma-core), or for a QP number past 24 bits.
fn own_qp(i: &Id, p: Option<&rdma_conn_param>) -> Result<OwnQp, c_int> {
    if i.cm().qp.is_null() {
        let p = p.filter(|p| p.qp_num <= 0xFF_FFFF).ok_or(libc::EINVAL)?;
        return Ok(OwnQp {
            qp: 0,
            qpn: p.qp_num,
            psn: i.state().psn,
            srq: if p.srq != 0 { CM_SRQ } else { 0 },
        });
    }
    // SAFETY: the id's QP, of libibverbs.
    let qp = unsafe { irpverbs_qp_handle(i.cm().qp) };
    Ok(OwnQp {
        qp,
        qpn: 0,
        psn: (random(qp) as u32) & 0xFF_FFFF,
        srq: 0,
    })
}

/// A connect or accept that failed for another reason than a REJ.
fn failed(i: &Id, s: NtStatus) {
    i.state().phase = Phase::Idle;
    let me = std::ptr::from_ref(i).cast_mut();
    let e = if s == STATUS_IO_TIMEOUT {
        Event::new(me, RDMA_CM_EVENT_UNREACHABLE, -libc::ETIMEDOUT)
    } else {
        Event::new(me, RDMA_CM_EVENT_CONNECT_ERROR, -errno_of(s))
    };
    i.queue(e);
}

/// A UD id's worker: the SIDR request and its answer.
fn sidr(i: &Id, input: &IvSidrRequestIn, route: &IvResolveAddrOut) {
    let Ok(d) = device() else { return };
    let me = std::ptr::from_ref(i).cast_mut();
    match call::<_, IvSidrRequestOut>(d, IOCTL_IV_SIDR_REQUEST, input) {
        Ok(o) if o.status == 0 => {
            i.state().phase = Phase::Connected;
            let n = usize::from(o.private_data_len).min(o.private_data.len());
            let mut e =
                Event::new(me, RDMA_CM_EVENT_ESTABLISHED, 0).with_pdata(&o.private_data[..n]);
            // SAFETY: the UD form of the parameters.
            let ud = unsafe { &mut e.ev.param.ud };
            ud.ah_attr = ah_to(&route.dgid, route.sgid_index, route.hop_limit);
            ud.ah_attr.port_num = route.port_num;
            ud.qp_num = o.qpn;
            ud.qkey = o.qkey;
            i.queue(e);
        }
        Ok(o) => {
            i.state().phase = Phase::Idle;
            let n = usize::from(o.private_data_len).min(o.private_data.len());
            i.queue(
                Event::new(me, RDMA_CM_EVENT_UNREACHABLE, o.status as c_int)
                    .with_pdata(&o.private_data[..n]),
            );
        }
        Err(STATUS_CANCELLED | STATUS_INVALID_HANDLE) => {}
        Err(s) => failed(i, s),
    }
}

/// A connection's events until the CEP goes: the peer's DREQ is answered
/// (the QP to ERR, the DREP) and reported as `DISCONNECTED`.
fn connected(i: &Id, d: &Device) {
    while let Ok(ev) = i.cep_event(d) {
        if ev.event_type != IV_CEP_EVENT_DISCONNECT_REQUEST {
            continue;
        }
        {
            let mut st = i.state();
            if st.phase != Phase::Connected {
                continue;
            }
            st.phase = Phase::Disconnected;
            st.disc_pending = true;
        }
        let _ = call_none(
            d,
            IOCTL_IV_CM_DISCONNECT,
            &IvCmDisconnectIn {
                cep: i.cep,
                ..IvCmDisconnectIn::default()
            },
        );
        let me = std::ptr::from_ref(i).cast_mut();
        i.queue(Event::new(me, RDMA_CM_EVENT_DISCONNECTED, 0));
    }
}

/// `rdma_accept`: RC, the driver's `CM_ACCEPT` of the id's QP (moved to
/// INIT, RTR and RTS), `ESTABLISHED` on the RTU; UD, the SIDR reply with
/// the id's QP and `RDMA_UDP_QKEY` (no event, as rdma_cm).
///
/// # Safety
/// `id` is NULL or a live id; `conn_param` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_accept(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    // SAFETY: forwarded (caller).
    let Some(i) = (unsafe { id_of(id) }) else {
        return err(libc::EINVAL);
    };
    // SAFETY: NULL or valid (caller).
    let p = unsafe { conn_param.as_ref() };
    ret(accept(i, p))
}

fn accept(i: &Id, p: Option<&rdma_conn_param>) -> Result<(), c_int> {
    let d = device()?;
    if i.state().phase != Phase::Request {
        return Err(libc::EINVAL);
    }
    if i.cm().qp_type == IBV_QPT_UD {
        // SAFETY: forwarded (caller).
        let user = unsafe { pdata(p, IV_CM_SIDR_REP_PDATA as usize) }?;
        let qpn = if i.cm().qp.is_null() {
            p.map_or(0, |p| p.qp_num)
        } else {
            // SAFETY: the id's QP (an `ibv_qp` of libibverbs).
            unsafe { &*i.cm().qp.cast::<ibv_qp>() }.qp_num
        };
        let mut input = IvSidrReplyIn {
            cep: i.cep,
            status: 0,
            qpn,
            qkey: RDMA_UDP_QKEY,
            private_data_len: user.len() as u8,
            ..IvSidrReplyIn::default()
        };
        input.private_data[..user.len()].copy_from_slice(user);
        call_none(d, IOCTL_IV_SIDR_REPLY, &input).map_err(errno_of)?;
        i.state().phase = Phase::Connected;
        return Ok(());
    }
    // SAFETY: forwarded (caller).
    let user = unsafe { pdata(p, IV_CM_REP_PDATA as usize) }?;
    let own = own_qp(i, p)?;
    let mut input = IvCmAcceptIn {
        cep: i.cep,
        qp: own.qp,
        qpn: own.qpn,
        starting_psn: own.psn,
        responder_resources: depth(p.map(|p| p.responder_resources), d.max_rd_atom)?,
        initiator_depth: depth(p.map(|p| p.initiator_depth), d.max_init_rd_atom)?,
        rnr_retry_count: p.map_or(7, |p| p.rnr_retry_count.min(7)),
        min_rnr_timer: 12,
        flags: own.srq
            | if p.is_some_and(|p| p.flow_control != 0) {
                FLOW_CONTROL
            } else {
                0
            },
        private_data_len: user.len() as u8,
        ..IvCmAcceptIn::default()
    };
    input.private_data[..user.len()].copy_from_slice(user);
    i.state().phase = Phase::Accepting;
    i.spawn("rdma-cm", move |i| {
        let Ok(d) = device() else { return };
        match call_none(d, IOCTL_IV_CM_ACCEPT, &input) {
            Ok(()) => {
                i.state().phase = Phase::Connected;
                let me = std::ptr::from_ref(i).cast_mut();
                i.queue(Event::new(me, RDMA_CM_EVENT_ESTABLISHED, 0));
                connected(i, d);
            }
            Err(STATUS_CANCELLED | STATUS_INVALID_HANDLE) => {}
            Err(STATUS_CONNECTION_REFUSED) => {
                i.state().phase = Phase::Idle;
                let me = std::ptr::from_ref(i).cast_mut();
                i.queue(Event::new(me, RDMA_CM_EVENT_REJECTED, 0));
            }
            Err(s) => failed(i, s),
        }
    })?;
    i.complete()
}

/// `rdma_reject`: a connect request turned down with a REJ (consumer
/// reject, with the private data: at most 148 bytes), or a SIDR request
/// with a SIDR_REP "rejected" (at most 136).
///
/// # Safety
/// `id` is NULL or a live id; `private_data` holds `private_data_len`
/// bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_reject(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    // SAFETY: forwarded (caller).
    let Some(i) = (unsafe { id_of(id) }) else {
        return err(libc::EINVAL);
    };
    let p = rdma_conn_param {
        private_data,
        private_data_len,
        responder_resources: 0,
        initiator_depth: 0,
        flow_control: 0,
        retry_count: 0,
        rnr_retry_count: 0,
        srq: 0,
        qp_num: 0,
    };
    let Ok(d) = device() else {
        return err(libc::ENODEV);
    };
    if i.state().phase != Phase::Request {
        return err(libc::EINVAL);
    }
    let r = if i.cm().qp_type == IBV_QPT_UD {
        // SAFETY: forwarded (caller).
        let user = match unsafe { pdata(Some(&p), IV_CM_SIDR_REP_PDATA as usize) } {
            Ok(u) => u,
            Err(e) => return err(e),
        };
        let mut input = IvSidrReplyIn {
            cep: i.cep,
            status: 2,
            private_data_len: user.len() as u8,
            ..IvSidrReplyIn::default()
        };
        input.private_data[..user.len()].copy_from_slice(user);
        call_none(d, IOCTL_IV_SIDR_REPLY, &input)
    } else {
        // SAFETY: forwarded (caller).
        let user = match unsafe { pdata(Some(&p), IV_CM_REJ_PDATA as usize) } {
            Ok(u) => u,
            Err(e) => return err(e),
        };
        let mut input = IvCmRejectIn {
            cep: i.cep,
            reason: 28,
            private_data_len: user.len() as u8,
            ..IvCmRejectIn::default()
        };
        input.private_data[..user.len()].copy_from_slice(user);
        call_none(d, IOCTL_IV_CM_REJECT, &input)
    };
    match r {
        Ok(()) => {
            i.state().phase = Phase::Idle;
            0
        }
        Err(s) => err(errno_of(s)),
    }
}

/// `rdma_disconnect`: a connection's DREQ (the QP to ERR), `DISCONNECTED`
/// on the DREP or the DREQ's timeout; after the peer disconnected,
/// nothing more (0). `EINVAL` for an id never connected.
///
/// # Safety
/// `id` is NULL or a live id.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    // SAFETY: forwarded (caller).
    let Some(i) = (unsafe { id_of(id) }) else {
        return err(libc::EINVAL);
    };
    let (phase, pending) = {
        let mut st = i.state();
        let was = (st.phase, st.disc_pending);
        if st.phase == Phase::Connected && i.cm().qp_type != IBV_QPT_UD {
            st.phase = Phase::Disconnected;
            st.disc_pending = true;
        }
        was
    };
    match phase {
        Phase::Connected if i.cm().qp_type == IBV_QPT_UD => 0,
        Phase::Connected => {
            let spawned = i.spawn("rdma-cm", |i| {
                let Ok(d) = device() else { return };
                let r = call_none(
                    d,
                    IOCTL_IV_CM_DISCONNECT,
                    &IvCmDisconnectIn {
                        cep: i.cep,
                        ..IvCmDisconnectIn::default()
                    },
                );
                if !matches!(r, Err(STATUS_CANCELLED | STATUS_INVALID_HANDLE)) {
                    let me = std::ptr::from_ref(i).cast_mut();
                    i.queue(Event::new(me, RDMA_CM_EVENT_DISCONNECTED, 0));
                }
            });
            if let Err(e) = spawned {
                return err(e);
            }
            ret(i.complete())
        }
        Phase::Disconnected if pending => ret(i.complete()),
        Phase::Disconnected => 0,
        _ => err(libc::EINVAL),
    }
}

/// `rdma_get_cm_event`: the channel's next event (waits, unless the fd is
/// non-blocking: `EAGAIN`). Acknowledge it with `rdma_ack_cm_event`.
///
/// # Safety
/// `channel` is NULL or a live channel; `event` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    if channel.is_null() || event.is_null() {
        return err(libc::EINVAL);
    }
    // SAFETY: a channel of this library (caller).
    let ch = unsafe { &*channel.cast::<Channel>() };
    let e = match ch.take() {
        Ok(e) => e,
        Err(code) => return err(code),
    };
    // SAFETY: an event's owner and id are live ids until acknowledged.
    let owner = unsafe { &*e.owner };
    owner.state().reported += 1;
    if e.ev.event == RDMA_CM_EVENT_DISCONNECTED {
        owner.state().disc_pending = false;
    }
    let p = Box::into_raw(e);
    // SAFETY: writable (caller); `ev` is the first field of the event.
    unsafe { *event = p.cast() };
    0
}

/// `rdma_ack_cm_event`: frees an event `rdma_get_cm_event` gave.
///
/// # Safety
/// `event` is NULL or an event of this library, acknowledged once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    if event.is_null() {
        return err(libc::EINVAL);
    }
    // SAFETY: boxed by the library, handed out once (caller).
    let e = unsafe { Box::from_raw(event.cast::<Event>()) };
    // SAFETY: the owner lives until its events are acknowledged.
    let owner = unsafe { &*e.owner };
    owner.state().acked += 1;
    owner.cond.notify_all();
    0
}

/// `rdma_migrate_id`: moves the id to `channel` (NULL: a private channel,
/// synchronous), once the program acknowledged the events it took; its
/// queued events follow it.
///
/// # Safety
/// `id` is NULL or a live id; `channel` is NULL or a live channel.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_migrate_id(
    id: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> c_int {
    // SAFETY: forwarded (caller).
    let Some(i) = (unsafe { id_of(id) }) else {
        return err(libc::EINVAL);
    };
    let new = if channel.is_null() {
        match Channel::new(true) {
            Ok(c) => c,
            Err(e) => return err(e),
        }
    } else {
        channel.cast::<Channel>()
    };
    let me = std::ptr::from_ref(i).cast_mut();
    let mut st = i.state();
    while st.acked < st.reported {
        st = i.cond.wait(st).unwrap_or_else(PoisonError::into_inner);
    }
    let old = st.channel;
    // SAFETY: the id's channel.
    for e in unsafe { &*old }.drop_where(|e| e.owner == me) {
        // SAFETY: the new channel.
        unsafe { &*new }.push(e);
    }
    st.channel = new;
    drop(st);
    i.cm().channel = new.cast();
    // SAFETY: the old channel.
    if unsafe { &*old }.sync {
        // SAFETY: the id's private channel, used by no other id.
        unsafe { Channel::destroy(old) };
    }
    0
}

/// `rdma_set_option`: `RDMA_OPTION_ID_TOS` (kept),
/// `RDMA_OPTION_ID_REUSEADDR` and `RDMA_OPTION_ID_AFONLY` (accepted),
/// `RDMA_OPTION_ID_ACK_TIMEOUT` (the connection's local ACK timeout);
/// others `ENOSYS`, a wrong size `EINVAL`.
///
/// # Safety
/// `id` is NULL or a live id; `optval` holds `optlen` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    // SAFETY: forwarded (caller).
    let Some(i) = (unsafe { id_of(id) }) else {
        return err(libc::EINVAL);
    };
    if optval.is_null() {
        return err(libc::EINVAL);
    }
    match (level, optname) {
        (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS) if optlen == 1 => 0,
        (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR | RDMA_OPTION_ID_AFONLY)
            if optlen == size_of::<c_int>() =>
        {
            0
        }
        (RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT) if optlen == 1 => {
            // SAFETY: one readable byte (caller).
            let t = unsafe { *optval.cast::<u8>() };
            if t > 31 {
                return err(libc::EINVAL);
            }
            i.state().ack_timeout = Some(t);
            0
        }
        (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS..=RDMA_OPTION_ID_ACK_TIMEOUT) => err(libc::EINVAL),
        _ => err(libc::ENOSYS),
    }
}

fn port_of(st: &os::sockaddr_storage) -> u16 {
    storage_addr(st).map_or(0, |a| a.port().to_be())
}

/// `rdma_get_src_port`: the local port, big-endian (0 without one).
///
/// # Safety
/// `id` is NULL or a live id.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: forwarded (caller).
    unsafe { id_of(id) }.map_or(0, |i| port_of(&i.cm().route.addr.src_storage))
}

/// `rdma_get_dst_port`: the peer's port, big-endian (0 without one).
///
/// # Safety
/// `id` is NULL or a live id.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: forwarded (caller).
    unsafe { id_of(id) }.map_or(0, |i| port_of(&i.cm().route.addr.dst_storage))
}

/// `rdma_event_str`.
#[unsafe(no_mangle)]
pub extern "C" fn rdma_event_str(event: c_int) -> *const c_char {
    let s: &'static std::ffi::CStr = match event {
        RDMA_CM_EVENT_ADDR_RESOLVED => c"RDMA_CM_EVENT_ADDR_RESOLVED",
        RDMA_CM_EVENT_ADDR_ERROR => c"RDMA_CM_EVENT_ADDR_ERROR",
        RDMA_CM_EVENT_ROUTE_RESOLVED => c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        RDMA_CM_EVENT_ROUTE_ERROR => c"RDMA_CM_EVENT_ROUTE_ERROR",
        RDMA_CM_EVENT_CONNECT_REQUEST => c"RDMA_CM_EVENT_CONNECT_REQUEST",
        RDMA_CM_EVENT_CONNECT_RESPONSE => c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        RDMA_CM_EVENT_CONNECT_ERROR => c"RDMA_CM_EVENT_CONNECT_ERROR",
        RDMA_CM_EVENT_UNREACHABLE => c"RDMA_CM_EVENT_UNREACHABLE",
        RDMA_CM_EVENT_REJECTED => c"RDMA_CM_EVENT_REJECTED",
        RDMA_CM_EVENT_ESTABLISHED => c"RDMA_CM_EVENT_ESTABLISHED",
        RDMA_CM_EVENT_DISCONNECTED => c"RDMA_CM_EVENT_DISCONNECTED",
        RDMA_CM_EVENT_DEVICE_REMOVAL => c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        RDMA_CM_EVENT_MULTICAST_JOIN => c"RDMA_CM_EVENT_MULTICAST_JOIN",
        RDMA_CM_EVENT_MULTICAST_ERROR => c"RDMA_CM_EVENT_MULTICAST_ERROR",
        RDMA_CM_EVENT_ADDR_CHANGE => c"RDMA_CM_EVENT_ADDR_CHANGE",
        RDMA_CM_EVENT_TIMEWAIT_EXIT => c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
        _ => c"UNKNOWN EVENT",
    };
    s.as_ptr()
}
