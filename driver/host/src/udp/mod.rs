//! The UDP wire: a soft HCA's RoCEv2 datagrams on real UDP sockets, so that
//! processes and hosts talk.
//!
//! [`UdpLink`] is the HCA's [`Link`]: one socket bound to the HCA's IP
//! address and its UDP port (`SoftConfig::udp_port`: the RoCEv2 port
//! [`ROCE_PORT`], 4791, unless configured otherwise), which is also the
//! destination port of every datagram (as in RoCEv2, where only the source
//! port varies; every HCA of a wire uses the same port, which the ICRC
//! covers).
//! [`UdpWire`] runs it: a receive thread that reads batches of datagrams
//! and hands each to the HCA ([`Endpoint::receive`]), and a timer thread
//! that drives the HCA's timers ([`Endpoint::advance_clock`]) on a
//! monotonic clock started with the wire.
//!
//! Busy-poll receive (as `SO_BUSY_POLL` does for a socket): a thread that
//! spins on a CQ calls [`UdpWire::poll_rx`] when it finds nothing, and
//! reads and delivers what is queued itself, without waiting, so the
//! datagram it waits for does not have to wake the receive thread (which,
//! on few cores, preempts a spinning thread for every datagram). One
//! thread reads and delivers at a time (the receive lock, taken with a
//! try-lock by pollers), which keeps datagrams in their arrival order. The
//! receive thread waits for the socket to be readable without that lock
//! (`poll(2)`; elsewhere a peek), then takes it and drains the socket; it
//! leaves the socket to the pollers until [`BUSY_POLL_LEASE`] after the
//! last poll, sleeping meanwhile, so that it is not woken for every
//! datagram they deliver.
//!
//! On Linux, sends and receives are batched (`sendmmsg`, `recvmmsg` with
//! `MSG_DONTWAIT`, up to 32 datagrams per system call); elsewhere they are
//! `std::net`'s one datagram per call (receives on a socket made
//! non-blocking for the call).
//!
//! What the IP and UDP headers carry, and why (the ICRC covers every field
//! of both headers but the traffic class, flow label, hop limit and
//! checksums, so both ends must agree on the rest):
//! - addresses: the HCA's GIDs; an IPv4-mapped GID (`::ffff:a.b.c.d`)
//!   travels over IPv4, any other over IPv6. A socket is of one family: a
//!   datagram to a GID of the other is dropped and counted.
//! - source port: the datagram's [`Datagram::src_port`] (RoCEv2's ECMP
//!   entropy). The link sends from a socket bound to that port (made on
//!   first use, up to [`MAX_SOURCE_PORTS`]; the listening socket when the
//!   port is its own or 0), so the receiver reads the port the sender's
//!   ICRC covered. A port that cannot be bound (taken by another program)
//!   falls back to the listening socket and is counted.
//! - traffic class and hop limit: sent per datagram as control messages
//!   and read back from the received ones on Linux (`IP_TOS`/`IP_TTL`,
//!   `IPV6_TCLASS`/`IPV6_HOPLIMIT`, both cheap within
//!   `sendmmsg`/`recvmmsg`); elsewhere the socket's defaults are sent and
//!   0 and [`DEFAULT_HOP_LIMIT`] are reported. The IPv6 flow label is not
//!   carried (the kernel picks it) and reported as 0.
//! - IPv4 identification and DF: the sockets never fragment (path MTU
//!   discovery "do"), and Linux then sends identification 0 from an
//!   unconnected socket — what an ICRC computed with identification 0 and
//!   DF set expects. A datagram larger than the path MTU fails to send
//!   (`EMSGSIZE`, counted); [`ib_mtu_for`] picks an IB MTU that fits.
//!
//! Sends never block (the HCA calls [`Link::transmit`] from any thread):
//! what the socket buffer has no room for is dropped and counted, and RC
//! retransmits it. Socket buffers are [`UdpConfig::socket_buffer`] bytes.
//!
//! Timers: the timer thread sleeps until the deadline the HCA returned, at
//! most [`TIMER_SLICE`] while one is set (a timer armed meanwhile, which
//! may be due earlier, is seen within that slice), and without limit when
//! none is; a transmit or a received batch wakes it from that idle sleep
//! (a datagram sent or received may have armed one). So a timer fires at
//! most [`TIMER_SLICE`] late.
//!
//! Shutdown ([`UdpWire::stop`], or drop) sets a flag, wakes the receive
//! thread with an empty datagram to its own socket (its waits, of at most
//! [`RECV_POLL`], cover a lost one) and the timer thread through its
//! condition variable, and joins both. The host device stops its wire
//! before the verifier's unload checks ([`crate::HostDevice::unload`]).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "linux")]
use linux as sys;
#[cfg(not(target_os = "linux"))]
mod portable;
#[cfg(not(target_os = "linux"))]
use portable as sys;

/// The longest datagram the port fallback reseals (the largest UDP payload
/// over IPv4; an IB MTU of 4096 and its headers fit many times).
const RESEAL_BYTES: usize = 65_507;

/// `d` as sent from UDP source port `port`: its header facts with that
/// port, and its bytes copied into `buf` with the ICRC computed again for
/// that port. `buf` is the link's, taken when it was bound: nothing is
/// allocated per datagram. `None` (counted as failed) when the datagram is
/// too short to carry an ICRC, longer than `buf`'s room, or the ICRC cannot
/// be computed.
fn reseal<'b>(d: &Datagram<'_>, port: u16, buf: &'b mut Vec<u8>) -> Option<Datagram<'b>> {
    let body_len = d.payload.len().checked_sub(4)?;
    if d.payload.len() > buf.capacity() {
        return None;
    }
    let moved = Datagram {
        src_port: port,
        ..*d
    };
    let crc = irpverbs_soft::wire::icrc(&moved.ip(), &d.payload[..body_len]).ok()?;
    buf.clear();
    // Within the capacity (checked above): no allocation.
    buf.extend_from_slice(d.payload);
    buf[body_len..].copy_from_slice(&crc.to_le_bytes());
    Some(Datagram {
        sgid: moved.sgid,
        dgid: moved.dgid,
        src_port: moved.src_port,
        dst_port: moved.dst_port,
        traffic_class: moved.traffic_class,
        flow_label: moved.flow_label,
        hop_limit: moved.hop_limit,
        payload: buf,
    })
}

#[cfg(test)]
mod tests;

pub use irpverbs_soft::packet::Gid;
pub use irpverbs_soft::{Datagram, Link, TxBatch};

/// The RoCEv2 UDP port (IANA).
pub const ROCE_PORT: u16 = 4791;

/// The hop limit reported for a received datagram when the system does not
/// say (the soft HCA's address vectors default to it too).
pub const DEFAULT_HOP_LIMIT: u8 = 64;

/// Most source-port sockets a link makes.
pub const MAX_SOURCE_PORTS: usize = 256;

/// The longest the timer thread sleeps while a deadline is set.
pub const TIMER_SLICE: Duration = Duration::from_millis(10);

/// The receive thread's wait for a datagram (how long a lost wake-up at
/// shutdown can delay it).
pub const RECV_POLL: Duration = Duration::from_millis(200);

/// How long the receive thread leaves the socket to the threads that poll
/// it ([`UdpWire::poll_rx`]) after the last poll.
pub const BUSY_POLL_LEASE: Duration = Duration::from_millis(1);

const BUSY_POLL_LEASE_NS: u64 = 1_000_000;
const _: () = assert!(BUSY_POLL_LEASE.as_nanos() == BUSY_POLL_LEASE_NS as u128);

/// How to build a UDP wire (its address is the HCA's: IP and UDP port).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UdpConfig {
    /// Socket send and receive buffer sizes requested. Default 32 MiB:
    /// the soft HCA has no congestion control, so a burst larger than the
    /// receiver's buffer (a 4 KiB datagram takes about 8 KiB of it) is
    /// lost and recovered by go-back-N, which can exhaust the retries.
    pub socket_buffer: usize,
}

impl Default for UdpConfig {
    fn default() -> Self {
        Self {
            socket_buffer: 32 << 20,
        }
    }
}

/// The IP address a GID names: IPv4 for an IPv4-mapped GID, else IPv6.
#[must_use]
pub fn gid_ip(gid: &Gid) -> IpAddr {
    match mapped_v4(gid) {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(Ipv6Addr::from(*gid)),
    }
}

/// The GID of an IP address (IPv4-mapped for IPv4).
#[must_use]
pub fn ip_gid(ip: IpAddr) -> Gid {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

fn mapped_v4(gid: &Gid) -> Option<Ipv4Addr> {
    (gid[..10] == [0; 10] && gid[10..12] == [0xFF, 0xFF])
        .then(|| Ipv4Addr::new(gid[12], gid[13], gid[14], gid[15]))
}

/// Bytes a RoCEv2 packet adds to its payload at most, IP header included:
/// IPv6 (40) or IPv4 (20), UDP (8), BTH (12), RETH (16), immediate data (4),
/// ICRC (4).
#[must_use]
pub fn roce_overhead(v6: bool) -> usize {
    (if v6 { 40 } else { 20 }) + 8 + 12 + 16 + 4 + 4
}

/// The largest IB MTU (`IV_MTU_*`) whose packets fit an IP MTU of
/// `ip_mtu` bytes (RoCE's active MTU: 1024 on 1500-byte Ethernet); `None`
/// below 256.
#[must_use]
pub fn ib_mtu_for(ip_mtu: usize, v6: bool) -> Option<u32> {
    (1..=5u32)
        .rev()
        .find(|&m| (128usize << m) + roce_overhead(v6) <= ip_mtu)
}

/// The path MTU towards `peer` from `local` (the outgoing interface's MTU
/// unless path MTU discovery lowered it; 1500 where the system cannot say).
///
/// # Errors
/// No route to `peer` from `local`.
pub fn path_mtu(local: IpAddr, peer: IpAddr) -> io::Result<usize> {
    let sock = UdpSocket::bind(SocketAddr::new(local, 0))?;
    sock.connect(SocketAddr::new(peer, ROCE_PORT))?;
    sys::path_mtu(&sock, peer.is_ipv6())
}

/// What the wire delivers datagrams to and whose timers it drives: the soft
/// HCA (through the host device), or a test's recorder.
pub trait Endpoint: Send + Sync {
    /// A datagram arrived (never empty). Drops are the endpoint's to count.
    fn receive(&self, d: &Datagram<'_>);

    /// A datagram of a batch arrived: it may wait for [`Endpoint::end_batch`]
    /// to be processed. By default, [`Endpoint::receive`].
    fn receive_queued(&self, d: &Datagram<'_>) {
        self.receive(d);
    }

    /// The batch is over: process what [`Endpoint::receive_queued`] kept.
    /// With `flush` false the answers it produces (ACKs) may stay queued
    /// for the caller's next send ([`UdpWire::poll_rx`]'s busy-polling
    /// thread sends them with its own). By default nothing.
    fn end_batch(&self, flush: bool) {
        let _ = flush;
    }

    /// Fires the timers due at `now_ns` (nanoseconds on the wire's
    /// monotonic clock, [`Link::now_ns`]); the next deadline, if any.
    fn advance_clock(&self, now_ns: u64) -> Option<u64>;

    /// Runs the body of one of the wire's threads (the host device runs it
    /// under the verifier's guard, which records a bugcheck for unload).
    fn run_thread(&self, name: &str, body: &mut dyn FnMut()) {
        let _ = name;
        body();
    }
}

/// What a batch of sends did (the system layer fills it).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SendReport {
    pub(crate) sent: u64,
    pub(crate) calls: u64,
    pub(crate) dropped: u64,
    pub(crate) failed: u64,
    pub(crate) last_error: Option<i32>,
}

/// A received datagram's IP facts (the system layers fill them).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Received {
    /// Source address (IPv4-mapped for IPv4).
    pub(crate) sgid: Gid,
    /// Source UDP port.
    pub(crate) src_port: u16,
    /// Traffic class (IPv4 TOS).
    pub(crate) traffic_class: u8,
    /// Hop limit (IPv4 TTL).
    pub(crate) hop_limit: u8,
}

/// What one receive call of a system layer did.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RecvReport {
    /// Datagrams handed on.
    pub(crate) received: u64,
    /// Datagrams too long to receive whole, dropped.
    pub(crate) truncated: u64,
}

/// Counters of a UDP wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UdpStats {
    /// Datagrams sent.
    pub sent: u64,
    /// Send system calls.
    pub send_calls: u64,
    /// Datagrams dropped because the socket had no room.
    pub send_dropped: u64,
    /// Datagrams that failed to send (unreachable, too long for the path
    /// MTU, of the other IP family).
    pub send_failed: u64,
    /// The last send error's OS code.
    pub last_send_error: Option<i32>,
    /// Datagrams sent from the listening socket because their source port
    /// could not be bound.
    pub port_fallbacks: u64,
    /// Datagrams received and handed to the endpoint.
    pub received: u64,
    /// Receive system calls that returned datagrams.
    pub recv_batches: u64,
    /// Datagrams too long to receive whole, dropped.
    pub truncated: u64,
    /// Receive errors.
    pub recv_errors: u64,
    /// Times the timer thread called the endpoint's clock.
    pub clock_calls: u64,
}

#[derive(Default)]
struct Counters {
    sent: AtomicU64,
    send_calls: AtomicU64,
    send_dropped: AtomicU64,
    send_failed: AtomicU64,
    last_send_error: Mutex<Option<i32>>,
    port_fallbacks: AtomicU64,
    received: AtomicU64,
    recv_batches: AtomicU64,
    truncated: AtomicU64,
    recv_errors: AtomicU64,
    clock_calls: AtomicU64,
}

fn add(c: &AtomicU64, n: u64) {
    if n > 0 {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

impl Counters {
    fn record_send(&self, r: &SendReport) {
        add(&self.sent, r.sent);
        add(&self.send_calls, r.calls);
        add(&self.send_dropped, r.dropped);
        add(&self.send_failed, r.failed);
        if r.last_error.is_some() {
            *self
                .last_send_error
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = r.last_error;
        }
    }

    fn snapshot(&self) -> UdpStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        UdpStats {
            sent: get(&self.sent),
            send_calls: get(&self.send_calls),
            send_dropped: get(&self.send_dropped),
            send_failed: get(&self.send_failed),
            last_send_error: *self
                .last_send_error
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
            port_fallbacks: get(&self.port_fallbacks),
            received: get(&self.received),
            recv_batches: get(&self.recv_batches),
            truncated: get(&self.truncated),
            recv_errors: get(&self.recv_errors),
            clock_calls: get(&self.clock_calls),
        }
    }
}

/// The timer thread's wake-ups.
struct Clock {
    start: Instant,
    /// The timer thread sleeps with no deadline: a transmit or receive
    /// must wake it.
    idle: AtomicBool,
    state: Mutex<ClockState>,
    cv: Condvar,
}

#[derive(Default)]
struct ClockState {
    kicked: bool,
    stop: bool,
}

impl Clock {
    fn now_ns(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Wakes an idle timer thread (one atomic load when it is not idle).
    fn kick(&self) {
        if self.idle.load(Ordering::SeqCst) && self.idle.swap(false, Ordering::SeqCst) {
            self.state
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .kicked = true;
            self.cv.notify_one();
        }
    }

    fn stop(&self) {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .stop = true;
        self.cv.notify_one();
    }

    /// Sleeps until `next` (at most [`TIMER_SLICE`]), forever if `None`, or
    /// until kicked; false when stopping.
    fn sleep(&self, next: Option<u64>) -> bool {
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if st.stop {
                return false;
            }
            if st.kicked {
                st.kicked = false;
                return true;
            }
            match next {
                None => st = self.cv.wait(st).unwrap_or_else(PoisonError::into_inner),
                Some(t) => {
                    let now = self.now_ns();
                    if t <= now {
                        return true;
                    }
                    let wait = Duration::from_nanos(t - now).min(TIMER_SLICE);
                    let (g, timeout) = self
                        .cv
                        .wait_timeout(st, wait)
                        .unwrap_or_else(PoisonError::into_inner);
                    st = g;
                    if timeout.timed_out() {
                        return true;
                    }
                }
            }
        }
    }
}

/// A soft HCA's [`Link`] over UDP sockets. See the [module
/// documentation](self).
pub struct UdpLink {
    sock: UdpSocket,
    local: SocketAddr,
    v6: bool,
    port: u16,
    buffer: usize,
    sources: RwLock<Vec<(u16, Arc<UdpSocket>)>>,
    /// Where the port fallback reseals a datagram ([`RESEAL_BYTES`] of
    /// room, taken at bind).
    reseal: Mutex<Vec<u8>>,
    counters: Counters,
    clock: Clock,
}

impl std::fmt::Debug for UdpLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdpLink")
            .field("local", &self.local)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl UdpLink {
    /// A link bound to `addr` (port 0: any free port).
    ///
    /// # Errors
    /// The socket's: the address is taken or not this host's.
    pub fn bind(addr: SocketAddr, config: &UdpConfig) -> io::Result<Self> {
        let sock = UdpSocket::bind(addr)?;
        let v6 = addr.is_ipv6();
        sys::configure(&sock, v6, config.socket_buffer)?;
        sock.set_read_timeout(Some(RECV_POLL))?;
        let local = sock.local_addr()?;
        let mut reseal = Vec::new();
        reseal
            .try_reserve_exact(RESEAL_BYTES)
            .map_err(|_| io::Error::from(io::ErrorKind::OutOfMemory))?;
        Ok(Self {
            sock,
            local,
            v6,
            port: local.port(),
            buffer: config.socket_buffer,
            sources: RwLock::new(Vec::new()),
            reseal: Mutex::new(reseal),
            counters: Counters::default(),
            clock: Clock {
                start: Instant::now(),
                idle: AtomicBool::new(false),
                state: Mutex::new(ClockState::default()),
                cv: Condvar::new(),
            },
        })
    }

    /// The address bound.
    #[must_use]
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The counters.
    #[must_use]
    pub fn stats(&self) -> UdpStats {
        self.counters.snapshot()
    }

    /// Sends datagrams, each from its source port to its destination GID
    /// and port, batching consecutive datagrams of one source port. Never
    /// blocks.
    pub fn send<'a>(&self, datagrams: impl Iterator<Item = Datagram<'a>>) {
        let mut it = datagrams.peekable();
        let mut report = SendReport::default();
        while let Some(d) = it.peek() {
            let src = d.src_port;
            if src == 0 || src == self.port {
                sys::send_run(&self.sock, self.v6, src, &mut it, &mut report);
            } else if let Some(s) = self.source(src) {
                sys::send_run(&s, self.v6, src, &mut it, &mut report);
            } else {
                // The source port could not be bound (another socket has
                // it): the run leaves from the listening socket. The ICRC
                // covers the UDP source port, so each datagram is sealed
                // again for that port, or the receiver would drop it.
                // One at a time through the link's reseal buffer: this
                // path allocates nothing per datagram either.
                let mut buf = self.reseal.lock().unwrap_or_else(PoisonError::into_inner);
                while let Some(d) = it.next_if(|d| d.src_port == src) {
                    let before = report.sent + report.dropped + report.failed;
                    match reseal(&d, self.port, &mut buf) {
                        Some(moved) => {
                            let mut one = core::iter::once(moved).peekable();
                            sys::send_run(&self.sock, self.v6, self.port, &mut one, &mut report);
                        }
                        None => report.failed += 1,
                    }
                    add(
                        &self.counters.port_fallbacks,
                        report.sent + report.dropped + report.failed - before,
                    );
                }
            }
        }
        self.counters.record_send(&report);
    }

    /// The socket bound to source port `port`, made on first use.
    fn source(&self, port: u16) -> Option<Arc<UdpSocket>> {
        let find = |v: &Vec<(u16, Arc<UdpSocket>)>| {
            v.iter()
                .find(|(p, _)| *p == port)
                .map(|(_, s)| Arc::clone(s))
        };
        if let Some(s) = find(&self.sources.read().unwrap_or_else(PoisonError::into_inner)) {
            return Some(s);
        }
        let mut w = self.sources.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(s) = find(&w) {
            return Some(s);
        }
        if w.len() >= MAX_SOURCE_PORTS {
            return None;
        }
        let sock = UdpSocket::bind(SocketAddr::new(self.local.ip(), port)).ok()?;
        sys::configure(&sock, self.v6, self.buffer).ok()?;
        let sock = Arc::new(sock);
        w.push((port, Arc::clone(&sock)));
        Some(sock)
    }

    /// Receives one batch of what is queued, without waiting, and hands
    /// each datagram to `endpoint`; how many were received (delivered or
    /// dropped as truncated). The caller holds the receive lock.
    fn receive_batch(&self, rx: &mut sys::Receiver, endpoint: &dyn Endpoint, flush: bool) -> usize {
        let dgid = ip_gid(self.local.ip());
        let result = rx.recv(&self.sock, &mut |r, bytes| {
            endpoint.receive_queued(&Datagram {
                sgid: r.sgid,
                dgid,
                src_port: r.src_port,
                dst_port: self.port,
                traffic_class: r.traffic_class,
                flow_label: 0,
                hop_limit: r.hop_limit,
                payload: bytes,
            });
        });
        endpoint.end_batch(flush);
        match result {
            Ok(r) => {
                add(&self.counters.received, r.received);
                add(&self.counters.truncated, r.truncated);
                if r.received + r.truncated > 0 {
                    add(&self.counters.recv_batches, 1);
                    self.clock.kick();
                }
                usize::try_from(r.received + r.truncated).unwrap_or(usize::MAX)
            }
            Err(_) => {
                add(&self.counters.recv_errors, 1);
                0
            }
        }
    }

    /// Wakes the receive thread: an empty datagram to the link's own
    /// socket.
    fn wake_receiver(&self) {
        let to = if self.local.ip().is_unspecified() {
            let lo = if self.v6 {
                IpAddr::V6(Ipv6Addr::LOCALHOST)
            } else {
                IpAddr::V4(Ipv4Addr::LOCALHOST)
            };
            SocketAddr::new(lo, self.port)
        } else {
            self.local
        };
        let _ = self.sock.send_to(&[], to);
    }
}

impl Link for UdpLink {
    fn transmit(&self, batch: &TxBatch) {
        self.send(batch.iter());
        self.clock.kick();
    }

    fn now_ns(&self) -> u64 {
        self.clock.now_ns()
    }
}

/// A [`UdpLink`] with its receive and timer threads. See the [module
/// documentation](self).
pub struct UdpWire {
    link: Arc<UdpLink>,
    rx: Arc<Rx>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

/// The receive side of a wire, shared by its receive thread and the
/// threads that poll it ([`UdpWire::poll_rx`]).
struct Rx {
    endpoint: Arc<dyn Endpoint>,
    /// The receive lock: whoever holds it reads the socket and delivers,
    /// so datagrams reach the endpoint in the order they arrived.
    receiver: Mutex<sys::Receiver>,
    /// Until when (on the wire's clock, in nanoseconds) a polling thread
    /// has the socket: the receive thread sleeps meanwhile.
    busy_until: AtomicU64,
}

impl Rx {
    /// The receive lock if free (poisoning is harmless: the buffers hold
    /// no state between calls).
    fn try_receiver(&self) -> Option<std::sync::MutexGuard<'_, sys::Receiver>> {
        match self.receiver.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// The receive thread: sleeps while a polling thread has the socket,
    /// else waits for it to be readable (without the receive lock, so that
    /// a polling thread can take over), then takes the lock and drains
    /// what is queued.
    fn run(&self, link: &UdpLink, stop: &AtomicBool) {
        while !stop.load(Ordering::Acquire) {
            let now = link.clock.now_ns();
            let until = self.busy_until.load(Ordering::Relaxed);
            if now < until {
                std::thread::sleep(Duration::from_nanos(until - now));
                continue;
            }
            match sys::wait_readable(&link.sock, RECV_POLL) {
                Ok(true) => {
                    let mut r = self.receiver.lock().unwrap_or_else(PoisonError::into_inner);
                    while link.receive_batch(&mut r, &*self.endpoint, true) == sys::BATCH {}
                }
                Ok(false) => {}
                Err(_) => {
                    add(&link.counters.recv_errors, 1);
                    // A persistent error must not spin the thread.
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }
}

impl std::fmt::Debug for UdpWire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdpWire")
            .field("link", &self.link)
            .finish_non_exhaustive()
    }
}

impl UdpWire {
    /// Binds a link to `addr` and starts its threads, delivering to
    /// `endpoint`. The caller attaches [`UdpWire::link`] to the HCA.
    ///
    /// # Errors
    /// The socket's, or a thread that could not be started.
    pub fn start(
        endpoint: Arc<dyn Endpoint>,
        addr: SocketAddr,
        config: &UdpConfig,
    ) -> io::Result<Self> {
        let link = Arc::new(UdpLink::bind(addr, config)?);
        let stop = Arc::new(AtomicBool::new(false));
        let rx = Arc::new(Rx {
            endpoint: Arc::clone(&endpoint),
            receiver: Mutex::new(sys::Receiver::new(link.v6)),
            busy_until: AtomicU64::new(0),
        });
        let mut wire = Self {
            link,
            rx,
            stop,
            threads: Vec::new(),
        };
        let (l, s, r) = (
            Arc::clone(&wire.link),
            Arc::clone(&wire.stop),
            Arc::clone(&wire.rx),
        );
        wire.threads.push(
            std::thread::Builder::new()
                .name("irpverbs-udp-rx".into())
                .spawn(move || {
                    r.endpoint
                        .run_thread("irpverbs-udp-rx", &mut || r.run(&l, &s));
                })?,
        );
        let l = Arc::clone(&wire.link);
        wire.threads.push(
            std::thread::Builder::new()
                .name("irpverbs-udp-timer".into())
                .spawn(move || {
                    endpoint.run_thread("irpverbs-udp-timer", &mut || {
                        let clock = &l.clock;
                        loop {
                            clock.idle.store(true, Ordering::SeqCst);
                            let next = endpoint.advance_clock(clock.now_ns());
                            add(&l.counters.clock_calls, 1);
                            if next.is_some() {
                                clock.idle.store(false, Ordering::SeqCst);
                            }
                            if !clock.sleep(next) {
                                break;
                            }
                        }
                    });
                })?,
        );
        Ok(wire)
    }

    /// Busy-poll receive (as `SO_BUSY_POLL` does for a socket): reads one
    /// batch of what is queued, without waiting, and delivers it on the
    /// calling thread; how many datagrams. For a thread that spins on a
    /// CQ: the datagram it waits for is delivered without waking the
    /// receive thread, which leaves the socket to the pollers until
    /// [`BUSY_POLL_LEASE`] after the last poll. 0 when another thread is
    /// delivering (one at a time, so that datagrams stay in order).
    pub fn poll_rx(&self) -> usize {
        let until = self.link.clock.now_ns().saturating_add(BUSY_POLL_LEASE_NS);
        self.rx.busy_until.fetch_max(until, Ordering::Relaxed);
        match self.rx.try_receiver() {
            Some(mut r) => self.link.receive_batch(&mut r, &*self.rx.endpoint, false),
            None => 0,
        }
    }

    /// The link, to attach to the HCA.
    #[must_use]
    pub fn link(&self) -> &Arc<UdpLink> {
        &self.link
    }

    /// The address bound.
    #[must_use]
    pub fn local_addr(&self) -> SocketAddr {
        self.link.local
    }

    /// The counters.
    #[must_use]
    pub fn stats(&self) -> UdpStats {
        self.link.stats()
    }

    /// Stops and joins the threads; the counters.
    pub fn stop(mut self) -> UdpStats {
        self.shutdown();
        self.link.stats()
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.link.wake_receiver();
        self.link.clock.stop();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for UdpWire {
    fn drop(&mut self) {
        self.shutdown();
    }
}
