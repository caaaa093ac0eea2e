//! The soft HCA's RoCEv2 wire over one kernel datagram socket, sans-IO:
//! what irpverbs.sys's WSK glue (`driver/kmdf/src/backend/soft/wsk.rs`) drives, tested
//! in host mode through the same calls.
//!
//! The platform owns the socket (on Windows a WSK datagram socket bound to
//! the HCA's address and UDP port), the clock and a one-shot timer; this
//! module decides everything else, and [`SocketLink`] is the HCA's
//! [`Link`]:
//!
//! - **Configuration** ([`WireConfig::from_registry`]): the device's
//!   registry values (the INF's defaults) as the platform reads them:
//!   `RoceEnable` (REG_DWORD, 0 or 1), `RoceAddress` (REG_SZ, an IPv4 or
//!   IPv6 address of the machine: the port's GID 0 and the socket's bound
//!   address) and `RocePort` (REG_DWORD, default 4791).
//! - **Send**: [`Link::transmit`] copies each datagram into a free buffer
//!   of a pool allocated with the link ([`SocketLink::new`], `slots`
//!   buffers of [`SLOT_BYTES`]), with its ICRC sealed again for the
//!   socket's own source port (one socket, one source port: RoCEv2's
//!   per-flow source ports would need a socket each; the ICRC covers the
//!   UDP source port, so the receiver must read the port it was sealed
//!   for), and hands the buffers to the platform in batches of up to
//!   [`SEND_BATCH`] ([`DatagramSocket::send`]: one `WskSendTo` per
//!   buffer, never waiting). The platform gives each buffer back with
//!   [`SocketLink::send_done`] when the send completes. A datagram that
//!   finds no free buffer, or is of the other IP family than the socket,
//!   is dropped and counted: RC retransmits it. Nothing is allocated after
//!   [`SocketLink::new`].
//! - **Receive**: the platform hands each datagram it received to
//!   [`SocketLink::received`] (on Windows from the WSK receive event
//!   callback, at DISPATCH_LEVEL), which gives it to the HCA with the IP
//!   and UDP facts the socket reports (source address and port; the
//!   destination is the bound address; traffic class 0 and hop limit 64,
//!   which the ICRC does not cover), without running the data path; then
//!   [`SocketLink::end_receive`] runs the data path once for the batch.
//! - **Timers**: the transport's timers (local ACK, RNR) run on the
//!   platform's clock, [`DatagramSocket::now_ns`]. As the host UDP wire's
//!   timer thread does, the link keeps one platform timer armed while the
//!   HCA has a deadline: [`SocketLink::on_timer`] fires what is due
//!   ([`crate::SoftHca::advance_clock`]) and arms the timer at the next
//!   deadline, at most [`TIMER_SLICE_NS`] away; with no deadline the timer
//!   stays idle until a send or a received batch arms it for "now" (a
//!   packet sent or received may have armed a timer in the HCA).
//!
//! Locks: the send pool is under [`SOCKWIRE_LOCK`], a leaf taken with no
//! soft HCA lock held (the HCA calls [`Link::transmit`] after releasing
//! its own).

use alloc::vec::Vec;
use core::net::{IpAddr, SocketAddr};
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use irpverbs_abi::{NtStatus, STATUS_INSUFFICIENT_RESOURCES, STATUS_INVALID_PARAMETER};
use irpverbs_core::platform::LockClass;
use irpverbs_core::{Platform, SpinLock};
use irpverbs_ring::{Region, Shared};

use crate::net::link::{Datagram, Link, TxBatch};
use crate::wire::ip::ip_gid;
use crate::wire::{self, ROCE_PORT};
use crate::{SoftConfig, SoftHca};

/// The send pool (a leaf: taken with no soft HCA lock held).
pub static SOCKWIRE_LOCK: LockClass = LockClass {
    name: "irpverbs.soft.sockwire",
    rank: 28,
};

/// Bytes of a send buffer: the largest RoCEv2 UDP payload the soft HCA
/// sends (a 4096-byte MTU's payload, BTH, RETH, immediate data, ICRC),
/// rounded up.
pub const SLOT_BYTES: usize = 4096 + 128;

/// Most buffers handed to the platform in one [`DatagramSocket::send`].
pub const SEND_BATCH: usize = 16;

/// The longest the platform timer is armed ahead while the HCA has a
/// deadline (a timer armed meanwhile, which may be due earlier, is seen
/// within this): 10 ms, as the host UDP wire's timer thread.
pub const TIMER_SLICE_NS: u64 = 10_000_000;

/// The hop limit reported for a received datagram (the socket does not
/// say; the ICRC does not cover it).
pub const RECEIVED_HOP_LIMIT: u8 = 64;

/// Registry value: 1 to put the HCA on the wire (REG_DWORD).
pub const REG_ENABLE: &str = "RoceEnable";
/// Registry value: the HCA's IP address (REG_SZ).
pub const REG_ADDRESS: &str = "RoceAddress";
/// Registry value: the UDP port (REG_DWORD, default 4791).
pub const REG_PORT: &str = "RocePort";

/// A registry value as the platform read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegValue<'a> {
    /// REG_DWORD.
    Dword(u32),
    /// REG_SZ (without its terminating NUL).
    Sz(&'a str),
}

/// Where the HCA meets the wire: its address and UDP port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WireConfig {
    /// The socket's bound address: the port's GID 0.
    pub addr: SocketAddr,
}

impl WireConfig {
    /// The wire the registry values configure: `Ok(None)` when
    /// `RoceEnable` is absent or 0 (the HCA stays loopback-only). `get`
    /// returns a value by name, `None` when absent.
    ///
    /// IRQL: any (the platform reads the values at PASSIVE_LEVEL).
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER` when enabled with `RoceAddress` absent,
    /// not an address, unspecified or multicast, `RocePort` 0 or above
    /// 65535, `RoceEnable` other than 0 or 1, or a value of the wrong type.
    pub fn from_registry<'a>(
        get: impl Fn(&str) -> Option<RegValue<'a>>,
    ) -> Result<Option<Self>, NtStatus> {
        match get(REG_ENABLE) {
            None | Some(RegValue::Dword(0)) => return Ok(None),
            Some(RegValue::Dword(1)) => {}
            Some(_) => return Err(STATUS_INVALID_PARAMETER),
        }
        let ip: IpAddr = match get(REG_ADDRESS) {
            Some(RegValue::Sz(text)) => {
                text.trim().parse().map_err(|_| STATUS_INVALID_PARAMETER)?
            }
            _ => return Err(STATUS_INVALID_PARAMETER),
        };
        if ip.is_unspecified() || ip.is_multicast() {
            return Err(STATUS_INVALID_PARAMETER);
        }
        let port = match get(REG_PORT) {
            None => ROCE_PORT,
            Some(RegValue::Dword(p)) => u16::try_from(p)
                .ok()
                .filter(|&p| p != 0)
                .ok_or(STATUS_INVALID_PARAMETER)?,
            Some(RegValue::Sz(_)) => return Err(STATUS_INVALID_PARAMETER),
        };
        Ok(Some(Self {
            addr: SocketAddr::new(ip, port),
        }))
    }

    /// Gives the soft HCA this address and port (GID 0 and the UDP port
    /// its datagrams go to).
    pub fn apply(&self, soft: &mut SoftConfig) {
        soft.ip = self.addr.ip();
        soft.udp_port = self.addr.port();
    }
}

/// One datagram handed to the platform: which buffer, how many bytes of
/// it, and where to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outgoing {
    /// The buffer's index ([`SocketLink::buffer`]).
    pub slot: u16,
    /// Bytes of the buffer to send.
    pub len: u32,
    /// The destination address and port.
    pub to: SocketAddr,
}

/// What the platform gives the link: its socket, clock and timer.
pub trait DatagramSocket: Send + Sync {
    /// Sends each datagram of `batch` from its buffer, never waiting, and
    /// calls [`SocketLink::send_done`] for each once the buffer is free
    /// again (sent or failed; possibly before this returns).
    ///
    /// IRQL: called at <= DISPATCH_LEVEL, with no soft HCA lock held.
    fn send(&self, batch: &[Outgoing]);

    /// The time on the transport's clock, in ns (monotonic).
    fn now_ns(&self) -> u64;

    /// Arms the one-shot platform timer to call [`SocketLink::on_timer`]
    /// at `due_ns` (on [`DatagramSocket::now_ns`]'s clock), replacing
    /// whatever was armed.
    ///
    /// IRQL: called at <= DISPATCH_LEVEL.
    fn arm_timer(&self, due_ns: u64);
}

/// Counters of a socket wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockWireStats {
    /// Datagrams handed to the platform.
    pub sent: u64,
    /// [`DatagramSocket::send`] calls.
    pub send_calls: u64,
    /// Sends the platform reported failed.
    pub send_failed: u64,
    /// Datagrams dropped: no free buffer.
    pub no_buffer: u64,
    /// Datagrams dropped: of the other IP family than the socket, too long
    /// for a buffer, or not sealable.
    pub unsendable: u64,
    /// Datagrams received and handed to the HCA.
    pub received: u64,
    /// Datagrams received and dropped (empty, or of the other family).
    pub rx_dropped: u64,
    /// Times the platform timer fired.
    pub timer_fired: u64,
}

/// The send pool's bookkeeping: which buffers are free.
struct Pool {
    free: Vec<u16>,
}

/// A soft HCA's [`Link`] over a platform datagram socket. See the
/// [module documentation](self).
pub struct SocketLink<P: Platform, S: DatagramSocket> {
    local: SocketAddr,
    socket: S,
    buffers: Vec<Shared<Region>>,
    pool: P::Lock<Pool>,
    /// The timer is not armed (the HCA had no deadline at its last run).
    timer_idle: AtomicBool,
    sent: AtomicU64,
    send_calls: AtomicU64,
    send_failed: AtomicU64,
    no_buffer: AtomicU64,
    unsendable: AtomicU64,
    received: AtomicU64,
    rx_dropped: AtomicU64,
    timer_fired: AtomicU64,
}

impl<P: Platform, S: DatagramSocket> core::fmt::Debug for SocketLink<P, S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SocketLink")
            .field("local", &self.local)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

fn count(c: &AtomicU64, n: u64) {
    if n > 0 {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

impl<P: Platform, S: DatagramSocket> SocketLink<P, S> {
    /// A link bound (by the platform) to `local`, sending through
    /// `socket`, with `slots` send buffers (1 to 65535) allocated now.
    ///
    /// IRQL: <= DISPATCH_LEVEL (nonpaged allocations).
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER` for 0 or more than 65535 slots;
    /// `STATUS_INSUFFICIENT_RESOURCES` when the buffers cannot be
    /// allocated.
    pub fn new(platform: &P, local: SocketAddr, socket: S, slots: usize) -> Result<Self, NtStatus> {
        let n = u16::try_from(slots)
            .ok()
            .filter(|&n| n > 0)
            .ok_or(STATUS_INVALID_PARAMETER)?;
        let mut buffers = Vec::new();
        buffers
            .try_reserve_exact(slots)
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        let mut free = Vec::new();
        free.try_reserve_exact(slots)
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        for i in 0..n {
            let r = Region::alloc(SLOT_BYTES).ok_or(STATUS_INSUFFICIENT_RESOURCES)?;
            buffers.push(Shared::try_new(r).map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?);
            // Taken from the back: the lowest index first.
            free.push(n - 1 - i);
        }
        Ok(Self {
            local,
            socket,
            buffers,
            pool: platform.new_lock(&SOCKWIRE_LOCK, Pool { free }),
            timer_idle: AtomicBool::new(true),
            sent: AtomicU64::new(0),
            send_calls: AtomicU64::new(0),
            send_failed: AtomicU64::new(0),
            no_buffer: AtomicU64::new(0),
            unsendable: AtomicU64::new(0),
            received: AtomicU64::new(0),
            rx_dropped: AtomicU64::new(0),
            timer_fired: AtomicU64::new(0),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The platform's socket.
    pub fn socket(&self) -> &S {
        &self.socket
    }

    /// Send buffer `slot` (the platform describes each once, as an MDL on
    /// Windows); `None` past the last.
    pub fn buffer(&self, slot: u16) -> Option<&Shared<Region>> {
        self.buffers.get(usize::from(slot))
    }

    /// Send buffers.
    pub fn buffers(&self) -> usize {
        self.buffers.len()
    }

    /// Buffers free now.
    pub fn free_buffers(&self) -> usize {
        self.pool.lock(|p| p.free.len())
    }

    /// The counters.
    pub fn stats(&self) -> SockWireStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        SockWireStats {
            sent: get(&self.sent),
            send_calls: get(&self.send_calls),
            send_failed: get(&self.send_failed),
            no_buffer: get(&self.no_buffer),
            unsendable: get(&self.unsendable),
            received: get(&self.received),
            rx_dropped: get(&self.rx_dropped),
            timer_fired: get(&self.timer_fired),
        }
    }

    /// The platform is done with buffer `slot` (its send completed; `ok`
    /// false: it failed): it is free again. A slot that is not out is
    /// ignored.
    ///
    /// IRQL: <= DISPATCH_LEVEL (a send's completion).
    pub fn send_done(&self, slot: u16, ok: bool) {
        if !ok {
            count(&self.send_failed, 1);
        }
        if usize::from(slot) >= self.buffers.len() {
            return;
        }
        self.pool.lock(|p| {
            // The pool's capacity is every slot: no allocation here.
            if !p.free.contains(&slot) && p.free.len() < p.free.capacity() {
                p.free.push(slot);
            }
        });
    }

    /// Copies `d` into buffer `slot`, sealed for the socket's source port;
    /// its length, or `None` if it cannot be sent from this socket.
    fn fill(&self, slot: u16, d: &Datagram<'_>) -> Option<u32> {
        if d.dgid_is_v4() != self.local.is_ipv4() {
            return None;
        }
        let buf = self.buffers.get(usize::from(slot))?;
        let len = d.payload.len();
        if len > SLOT_BYTES {
            return None;
        }
        let mut sealed = [0u8; 4];
        let body = len.checked_sub(4)?;
        let moved = Datagram {
            src_port: self.local.port(),
            ..*d
        };
        let crc = wire::icrc(&moved.ip(), &d.payload[..body]).ok()?;
        sealed.copy_from_slice(&crc.to_le_bytes());
        buf.write(0, &d.payload[..body]).ok()?;
        buf.write(body, &sealed).ok()?;
        u32::try_from(len).ok()
    }

    /// Hands the next `want` (at most [`SEND_BATCH`]) datagrams of `it` to
    /// the platform, in one [`DatagramSocket::send`].
    fn send_run<'a>(&self, it: &mut impl Iterator<Item = Datagram<'a>>, want: usize) {
        let mut slots = [0u16; SEND_BATCH];
        let want = want.min(SEND_BATCH);
        let taken = self.pool.lock(|p| {
            let mut taken = 0;
            while taken < want {
                let Some(s) = p.free.pop() else { break };
                slots[taken] = s;
                taken += 1;
            }
            taken
        });
        let mut out = [Outgoing {
            slot: 0,
            len: 0,
            to: self.local,
        }; SEND_BATCH];
        let (mut n, mut spares) = (0, 0);
        for i in 0..want {
            let Some(d) = it.next() else { break };
            let Some(&slot) = slots[..taken].get(i) else {
                count(&self.no_buffer, 1);
                continue;
            };
            match self.fill(slot, &d) {
                Some(len) => {
                    out[n] = Outgoing {
                        slot,
                        len,
                        to: SocketAddr::new(gid_ip(&d.dgid), d.dst_port),
                    };
                    n += 1;
                }
                None => {
                    // Given back below, in the slots' array's tail.
                    slots[spares] = slot;
                    spares += 1;
                }
            }
        }
        if spares > 0 {
            count(&self.unsendable, spares as u64);
            // The pool's capacity is every slot: no allocation here.
            self.pool
                .lock(|p| p.free.extend_from_slice(&slots[..spares]));
        }
        if n > 0 {
            count(&self.sent, n as u64);
            count(&self.send_calls, 1);
            self.socket.send(&out[..n]);
        }
    }

    /// A datagram the socket received from `from`: handed to `hca`
    /// (checked there: ICRC, headers), without running the data path
    /// ([`SocketLink::end_receive`] runs it once per batch). Empty
    /// datagrams and those of the other family are dropped and counted.
    ///
    /// IRQL: <= DISPATCH_LEVEL (the socket's receive event).
    pub fn received(&self, hca: &SoftHca<P>, from: SocketAddr, payload: &[u8]) {
        if payload.is_empty() || from.is_ipv4() != self.local.is_ipv4() {
            count(&self.rx_dropped, 1);
            return;
        }
        count(&self.received, 1);
        let d = Datagram {
            sgid: ip_gid(from.ip()),
            dgid: ip_gid(self.local.ip()),
            src_port: from.port(),
            dst_port: self.local.port(),
            traffic_class: 0,
            flow_label: 0,
            hop_limit: RECEIVED_HOP_LIMIT,
            payload,
        };
        // A drop is counted in the HCA's link statistics.
        let _ = hca.receive_queued(&d);
    }

    /// The end of a batch of received datagrams: the data path runs on
    /// them (and sends what they call for), and the timer is armed if it
    /// is idle.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    pub fn end_receive(&self, hca: &SoftHca<P>) {
        hca.run_deferred(true);
        self.kick_timer();
    }

    /// Arms the timer for now if it is idle (a datagram sent or received
    /// may have armed a timer in the HCA). One atomic load when it is not.
    fn kick_timer(&self) {
        if self.timer_idle.load(Ordering::SeqCst) && self.timer_idle.swap(false, Ordering::SeqCst) {
            self.socket.arm_timer(self.socket.now_ns());
        }
    }

    /// The platform timer fired: fires the HCA's timers due now, and arms
    /// the platform timer at the next deadline (at most
    /// [`TIMER_SLICE_NS`] ahead), or leaves it idle when there is none.
    /// Returns the time it was armed for.
    ///
    /// IRQL: <= DISPATCH_LEVEL (the timer's callback).
    pub fn on_timer(&self, hca: &SoftHca<P>) -> Option<u64> {
        count(&self.timer_fired, 1);
        // Idle first: a send meanwhile arms the timer again (at worst once
        // too often), instead of being lost.
        self.timer_idle.store(true, Ordering::SeqCst);
        let now = self.socket.now_ns();
        let next = hca.advance_clock(now)?;
        if !self.timer_idle.swap(false, Ordering::SeqCst) {
            // A kick armed it for now meanwhile: that run re-arms.
            return None;
        }
        let due = next.min(now.saturating_add(TIMER_SLICE_NS));
        self.socket.arm_timer(due);
        Some(due)
    }
}

impl<P: Platform, S: DatagramSocket> Link for SocketLink<P, S> {
    /// Sends the batch in runs of [`SEND_BATCH`], then arms the timer if
    /// idle.
    fn transmit(&self, batch: &TxBatch) {
        let mut it = batch.iter();
        let mut left = batch.len();
        while left > 0 {
            let run = left.min(SEND_BATCH);
            self.send_run(&mut it, run);
            left -= run;
        }
        self.kick_timer();
    }

    fn now_ns(&self) -> u64 {
        self.socket.now_ns()
    }
}

/// `AF_INET` on Windows (ws2def.h).
pub const AF_INET: u16 = 2;
/// `AF_INET6` on Windows (ws2def.h).
pub const AF_INET6: u16 = 23;
/// Bytes of a `SOCKADDR_IN6`, the larger of the two socket addresses.
pub const SOCKADDR_LEN: usize = 28;

/// `addr` as a Windows `SOCKADDR_IN` (16 bytes) or `SOCKADDR_IN6` (28
/// bytes): the family in host (little-endian) order, the port and the
/// address in network order, the rest 0. The buffer and the length used.
#[must_use]
pub fn encode_sockaddr(addr: &SocketAddr) -> ([u8; SOCKADDR_LEN], usize) {
    let mut b = [0u8; SOCKADDR_LEN];
    b[2..4].copy_from_slice(&addr.port().to_be_bytes());
    match addr {
        SocketAddr::V4(a) => {
            b[0..2].copy_from_slice(&AF_INET.to_le_bytes());
            b[4..8].copy_from_slice(&a.ip().octets());
            (b, 16)
        }
        SocketAddr::V6(a) => {
            b[0..2].copy_from_slice(&AF_INET6.to_le_bytes());
            b[4..8].copy_from_slice(&a.flowinfo().to_be_bytes());
            b[8..24].copy_from_slice(&a.ip().octets());
            b[24..28].copy_from_slice(&a.scope_id().to_le_bytes());
            (b, SOCKADDR_LEN)
        }
    }
}

/// The address a Windows `SOCKADDR_IN` or `SOCKADDR_IN6` holds (a received
/// datagram's source); `None` for another family or too few bytes.
#[must_use]
pub fn decode_sockaddr(b: &[u8]) -> Option<SocketAddr> {
    let family = u16::from_le_bytes([*b.first()?, *b.get(1)?]);
    let port = u16::from_be_bytes([*b.get(2)?, *b.get(3)?]);
    match family {
        AF_INET => {
            let ip: [u8; 4] = b.get(4..8)?.try_into().ok()?;
            Some(SocketAddr::new(IpAddr::from(ip), port))
        }
        AF_INET6 => {
            let ip: [u8; 16] = b.get(8..24)?.try_into().ok()?;
            Some(SocketAddr::new(IpAddr::from(ip), port))
        }
        _ => None,
    }
}

/// The IP address a GID names: IPv4 for an IPv4-mapped GID, else IPv6.
fn gid_ip(gid: &[u8; 16]) -> IpAddr {
    let v6 = core::net::Ipv6Addr::from(*gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

impl Datagram<'_> {
    /// The destination is an IPv4 address (an IPv4-mapped GID).
    fn dgid_is_v4(&self) -> bool {
        wire::is_ipv4_mapped(&self.dgid)
    }
}

#[cfg(test)]
mod tests;
