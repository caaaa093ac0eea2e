//! The soft HCA's port cabled to a datagram wire: RoCEv2 over UDP.
//!
//! Destinations that are neither this HCA (loopback) nor an HCA attached to
//! the same in-process [`Fabric`](crate::Fabric) go to the [`Link`], if
//! one is attached ([`SoftHca::attach_link`](crate::SoftHca::attach_link)):
//! the data path serializes their frames, packet by packet, into RoCEv2
//! UDP payloads ([`crate::wire`]) collected in a [`TxBatch`], and hands the
//! batch to [`Link::transmit`] after releasing its locks. Datagrams that
//! arrive go to [`SoftHca::receive`](crate::SoftHca::receive), which checks
//! them (ICRC and every header), copies their payload into receive buffers
//! and delivers them to the transport like frames from another HCA.
//!
//! What the in-process fabric signals between HCAs has its wire form here:
//! UC and UD send WQEs complete once their packets are serialized (the
//! bytes left the source buffers); the responder's "receive posted" hint
//! to an RNR-waiting requester is not sent, the requester's RNR timer
//! fires instead; and lost packets are recovered by the requester's local
//! ACK timer. The timers are kept on the caller's clock: the transport
//! never reads a clock, [`Link::now_ns`] tells the data path the time when
//! it runs and [`SoftHca::advance_clock`](crate::SoftHca::advance_clock)
//! fires the timers that are due. That keeps the transport sans-IO: the
//! same code runs on a simulated wire under a virtual clock and on UDP
//! sockets under the monotonic clock.

use alloc::vec::Vec;

use irpverbs_ring::{Region, Shared};

use crate::wire::packet::{Batch, Frame, Gid, Packet, m, mask, psn_add};
use crate::wire::{self, IpUdp, ROCE_PORT};

/// A RoCEv2 datagram: its UDP payload (BTH to ICRC) and what the IP and
/// UDP headers around it carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Datagram<'a> {
    /// IP source address (IPv4-mapped `::ffff:a.b.c.d` for IPv4).
    pub sgid: Gid,
    /// IP destination address.
    pub dgid: Gid,
    /// UDP source port (flow entropy).
    pub src_port: u16,
    /// UDP destination port (4791 unless configured otherwise).
    pub dst_port: u16,
    /// IPv6 traffic class or IPv4 TOS (masked out of the ICRC).
    pub traffic_class: u8,
    /// IPv6 flow label (masked out of the ICRC).
    pub flow_label: u32,
    /// Hop limit or TTL (masked out of the ICRC).
    pub hop_limit: u8,
    /// The UDP payload.
    pub payload: &'a [u8],
}

impl Datagram<'_> {
    /// The IP and UDP facts, as [`crate::wire`] takes them.
    #[must_use]
    pub fn ip(&self) -> IpUdp {
        IpUdp {
            src: self.sgid,
            dst: self.dgid,
            traffic_class: self.traffic_class,
            flow_label: self.flow_label,
            hop_limit: self.hop_limit,
            ident: 0,
            dont_fragment: true,
            src_port: self.src_port,
            dst_port: self.dst_port,
            udp_checksum: !wire::is_ipv4_mapped(&self.sgid),
        }
    }
}

/// A [`Datagram`] that owns its bytes: one on its way through a wire
/// (queued, delayed, captured).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnedDatagram {
    /// See [`Datagram::sgid`].
    pub sgid: Gid,
    /// See [`Datagram::dgid`].
    pub dgid: Gid,
    /// See [`Datagram::src_port`].
    pub src_port: u16,
    /// See [`Datagram::dst_port`].
    pub dst_port: u16,
    /// See [`Datagram::traffic_class`].
    pub traffic_class: u8,
    /// See [`Datagram::flow_label`].
    pub flow_label: u32,
    /// See [`Datagram::hop_limit`].
    pub hop_limit: u8,
    /// The UDP payload.
    pub bytes: Vec<u8>,
}

impl OwnedDatagram {
    /// A copy of `d`; `None` when there is no memory for its bytes (a
    /// wire drops the datagram then, as a full switch buffer would).
    #[must_use]
    pub fn try_of(d: &Datagram<'_>) -> Option<Self> {
        let mut bytes = Vec::new();
        bytes.try_reserve_exact(d.payload.len()).ok()?;
        bytes.extend_from_slice(d.payload);
        Some(Self {
            sgid: d.sgid,
            dgid: d.dgid,
            src_port: d.src_port,
            dst_port: d.dst_port,
            traffic_class: d.traffic_class,
            flow_label: d.flow_label,
            hop_limit: d.hop_limit,
            bytes,
        })
    }

    /// The datagram, borrowing the bytes.
    #[must_use]
    pub fn view(&self) -> Datagram<'_> {
        Datagram {
            sgid: self.sgid,
            dgid: self.dgid,
            src_port: self.src_port,
            dst_port: self.dst_port,
            traffic_class: self.traffic_class,
            flow_label: self.flow_label,
            hop_limit: self.hop_limit,
            payload: &self.bytes,
        }
    }
}

/// One datagram of a [`TxBatch`]: its headers' facts and where its bytes
/// are in the batch's buffer.
#[derive(Clone, Copy, Debug)]
struct TxItem {
    sgid: Gid,
    dgid: Gid,
    src_port: u16,
    dst_port: u16,
    traffic_class: u8,
    flow_label: u32,
    hop_limit: u8,
    start: usize,
    len: usize,
}

/// Datagrams the HCA sends in one go: their bytes back to back in one
/// buffer. Cleared, never shrunk, so steady state does not allocate.
#[derive(Clone, Debug, Default)]
pub struct TxBatch {
    buf: Vec<u8>,
    items: Vec<TxItem>,
}

impl TxBatch {
    /// Datagrams in the batch.
    #[must_use]
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// No datagrams.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The datagrams, in the order they were built.
    pub fn iter(&self) -> impl Iterator<Item = Datagram<'_>> {
        self.items.iter().map(|t| Datagram {
            sgid: t.sgid,
            dgid: t.dgid,
            src_port: t.src_port,
            dst_port: t.dst_port,
            traffic_class: t.traffic_class,
            flow_label: t.flow_label,
            hop_limit: t.hop_limit,
            payload: self.buf.get(t.start..t.start + t.len).unwrap_or(&[]),
        })
    }

    /// Moves every datagram of `other` to the end of this batch (`other`
    /// is left empty): batches for one link leave in one call. False, and
    /// both batches unchanged, when this one has no memory to grow.
    #[must_use]
    pub fn append(&mut self, other: &mut TxBatch) -> bool {
        if self.buf.try_reserve(other.buf.len()).is_err()
            || self.items.try_reserve(other.items.len()).is_err()
        {
            return false;
        }
        let base = self.buf.len();
        self.buf.append(&mut other.buf);
        self.items.extend(other.items.drain(..).map(|mut t| {
            t.start += base;
            t
        }));
        true
    }

    /// Bytes the batch holds without reallocating.
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// Drops every datagram, keeping the capacity.
    pub fn clear(&mut self) {
        self.buf.clear();
        self.items.clear();
    }

    /// Appends `pkt` with `payload` as a datagram to UDP port `dst_port`;
    /// false (nothing appended) when the packet cannot be emitted, or the
    /// batch has no memory to grow to a new high-water mark.
    pub(crate) fn push(&mut self, pkt: &Packet, payload: &[u8], dst_port: u16) -> bool {
        let src_port = entropy_port(pkt.dest_qpn);
        let mut ip = IpUdp::of(pkt, src_port, 0);
        ip.dst_port = dst_port;
        let Ok(len) = wire::transport_len(pkt) else {
            return false;
        };
        if self.buf.try_reserve(len).is_err() || self.items.try_reserve(1).is_err() {
            return false;
        }
        let start = self.buf.len();
        self.buf.resize(start + len, 0);
        let out = &mut self.buf[start..];
        match wire::emit_transport(pkt, &[payload], &ip, out) {
            Ok(n) if n == len => {
                self.items.push(TxItem {
                    sgid: pkt.sgid,
                    dgid: pkt.dgid,
                    src_port,
                    dst_port,
                    traffic_class: pkt.traffic_class,
                    flow_label: pkt.flow_label,
                    hop_limit: pkt.hop_limit,
                    start,
                    len,
                });
                true
            }
            _ => {
                self.buf.truncate(start);
                false
            }
        }
    }
}

/// The UDP source port of a flow (RoCEv2 uses it for ECMP entropy; the
/// range 0xC000.. as the annex suggests), from its destination QP.
#[must_use]
pub const fn entropy_port(dest_qpn: u32) -> u16 {
    0xC000 | ((dest_qpn ^ (dest_qpn >> 14)) & 0x3FFF) as u16
}

/// What a soft HCA's port is cabled to when packets leave the process.
///
/// Implementations: the host's in-process loopback wire, its seeded
/// simulated wire, and UDP sockets; a kernel UDP socket on Windows.
pub trait Link: Send + Sync {
    /// Sends the datagrams of `batch`. Called with no soft HCA lock held,
    /// at IRQL <= DISPATCH_LEVEL; must not block: a datagram that finds no
    /// room is dropped (RC recovers it by retransmission).
    fn transmit(&self, batch: &TxBatch);

    /// The time now on the clock the HCA's timers run on, in nanoseconds
    /// (monotonic; virtual for a simulated wire).
    fn now_ns(&self) -> u64;
}

/// The platform's clock and timer, for the transport's timers (local ACK,
/// RNR) whatever the destination: loopback, an in-process fabric, or a
/// link. Attached with [`SoftHca::attach_clock`](crate::SoftHca::attach_clock);
/// the platform arms a one-shot timer (a KTIMER's DPC, a WDFTIMER, a host
/// timer) whose routine calls
/// [`SoftHca::advance_clock`](crate::SoftHca::advance_clock).
///
/// With a clock attached the transport's timers run on it, also for QPs
/// whose packets go to a link ([`Link::now_ns`] then only tells a
/// link's own timer thread when to call in).
pub trait Clock: Send + Sync {
    /// The time now, in nanoseconds (monotonic).
    ///
    /// IRQL: any (the transport reads it under `HCA_LOCK`).
    fn now_ns(&self) -> u64;

    /// Arms the platform's timer to call
    /// [`SoftHca::advance_clock`](crate::SoftHca::advance_clock) at
    /// `deadline_ns` (on [`Clock::now_ns`]'s clock) or soon after,
    /// replacing whatever deadline it was armed for. A timer that fires
    /// early does no harm (the transport arms it again).
    ///
    /// IRQL: DISPATCH_LEVEL, under `HCA_LOCK`: must not block or wait.
    fn arm(&self, deadline_ns: u64);
}

/// A link as the soft HCA holds it ([`crate::SoftHca::attach_link`]): its
/// box and reference count, allocated fallibly.
pub type SharedLink = Shared<alloc::boxed::Box<dyn Link>>;

/// A link shared with its owner (the wire that receives): `Arc`, and
/// `irpverbs_ring::Shared` (a reference count allocated fallibly).
macro_rules! shared_link {
    ($([$($generics:tt)*] $pointer:ty),*) => {$(
        impl<$($generics)*> Link for $pointer {
            fn transmit(&self, batch: &TxBatch) {
                (**self).transmit(batch);
            }
            fn now_ns(&self) -> u64 {
                (**self).now_ns()
            }
        }
    )*};
}

shared_link!([T: Link + ?Sized] alloc::sync::Arc<T>, [T: Link] Shared<T>);

/// A clock shared with its owner (a test that moves time, say).
impl<T: Clock + ?Sized> Clock for alloc::sync::Arc<T> {
    fn now_ns(&self) -> u64 {
        (**self).now_ns()
    }

    fn arm(&self, deadline_ns: u64) {
        (**self).arm(deadline_ns);
    }
}

/// Which way a tapped datagram went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Handed to the link.
    Sent,
    /// Received from the link (before it was checked: bad ones too).
    Received,
}

/// Sees every datagram a soft HCA sends to or receives from its link (a
/// capture: `--pcap`). Called with no soft HCA lock held.
pub trait Tap: Send + Sync {
    /// One datagram.
    fn tap(&self, direction: Direction, d: &Datagram<'_>);
}

/// Counters of the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Datagrams handed to the link.
    pub tx_datagrams: u64,
    /// Packets that could not be serialized (dropped; RC retransmits).
    pub tx_errors: u64,
    /// In-process signals with no wire form, not sent.
    pub signals_dropped: u64,
    /// Datagrams received and accepted.
    pub rx_datagrams: u64,
    /// Datagrams received and dropped, by [`wire::WireError`] reason.
    pub rx_dropped: wire::WireStats,
    /// Datagrams dropped for want of a receive buffer (or of memory to
    /// queue them).
    pub rx_no_buffer: u64,
    /// Receive buffers allocated (of 4,096 bytes each): the
    /// pool grows to the most datagrams in flight at once, and keeps them.
    pub rx_buffers: u64,
    /// Local ACK timeouts that fired.
    pub ack_timeouts: u64,
    /// RNR timers that fired.
    pub rnr_timeouts: u64,
}

/// The middle opcode of a message whose burst starts with `first`.
const fn middle_of(first: u8) -> u8 {
    if mask(first) & m::START != 0 {
        first + 1
    } else {
        first
    }
}

/// The MTU a burst of `count` packets carrying `len` bytes was cut with:
/// every packet but the last carries one MTU, the last 1 to MTU bytes, so
/// `len / count` is above half an MTU and at most one.
fn burst_mtu(len: u32, count: u32) -> u32 {
    len.div_ceil(count.max(1)).next_power_of_two().max(1)
}

/// Serializes the frames of `batch` (for the link) into `tx`, packet by
/// packet, copying their payload through `scratch`. UC and UD packets get
/// their "sent" signal into `loopq` (the bytes left); signals that have no
/// wire form are counted and dropped. `tx` and `scratch` grow to new
/// high-water marks fallibly: a packet they have no memory for is dropped
/// and counted as a transmit error (RC retransmits it).
pub(crate) fn serialize(
    batch: &Batch,
    tx: &mut TxBatch,
    scratch: &mut Vec<u8>,
    loopq: &mut Batch,
    dst_port: u16,
    stats: &mut LinkStats,
) {
    for frame in &batch.frames {
        let (pkt, burst, seg, nsegs, notify) = match *frame {
            Frame::Packet {
                pkt,
                burst,
                seg,
                nsegs,
                notify,
            } => (pkt, burst, seg, nsegs, notify),
            Frame::Sent { .. } | Frame::RetryHint { .. } => {
                stats.signals_dropped += 1;
                continue;
            }
        };
        scratch.clear();
        let mut ok = true;
        for s in batch.payload(seg, nsegs) {
            let at = scratch.len();
            if scratch.try_reserve(s.len).is_err() {
                ok = false;
                break;
            }
            scratch.resize(at + s.len, 0);
            ok &= s.region.read(s.offset, &mut scratch[at..]).is_ok();
        }
        let total = pkt.payload_len;
        if !ok || scratch.len() != total as usize {
            stats.tx_errors += u64::from(burst.count);
        } else {
            let n = burst.count.max(1);
            let mtu = burst_mtu(total, n);
            for i in 0..n {
                let last = i + 1 == n;
                let mut p = pkt;
                p.psn = psn_add(pkt.psn, i);
                if i > 0 {
                    p.opcode = if last {
                        burst.last_opcode
                    } else {
                        middle_of(pkt.opcode)
                    };
                }
                if !last {
                    p.solicited = false;
                    p.ack_req = false;
                }
                let off = (i * mtu).min(total);
                let len = if last {
                    total - off
                } else {
                    mtu.min(total - off)
                };
                p.payload_len = len;
                let bytes = &scratch[off as usize..(off + len) as usize];
                if tx.push(&p, bytes, dst_port) {
                    stats.tx_datagrams += 1;
                } else {
                    stats.tx_errors += 1;
                }
            }
        }
        if let Some(qpn) = notify {
            let _ = loopq.push_signal(Frame::Sent {
                qpn,
                psn: burst.last_psn(pkt.psn),
            });
        }
    }
}

/// Receive buffers: regions of [`RxPool::BUF`] bytes, each reused once the
/// frame that carried it is gone (the pool holds its only reference).
#[derive(Debug, Default)]
pub(crate) struct RxPool {
    bufs: Vec<Shared<Region>>,
    /// Where the next search starts: after the buffer taken last. Frames
    /// are processed in order, so the oldest buffer is the likeliest free
    /// and a search usually ends at its first look, however many buffers
    /// are in flight.
    next: usize,
}

/// A copy of the data path starts with no buffers (sharing them would
/// only keep them from being reused).
impl Clone for RxPool {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl RxPool {
    /// Bytes of a buffer: the largest payload of a 4096-byte MTU.
    pub(crate) const BUF: usize = 4096;
    /// Buffers kept at most: 32 MiB, as much as the UDP wire's socket
    /// buffer holds (1,024 lost READ responses to a firmware thread that
    /// fell behind the receive thread: `--engine thread perf read_bw -s
    /// 1048576` between two hosts failed with RETRY_EXC_ERR). Allocated
    /// as needed.
    const MAX: usize = 8192;

    /// Buffers allocated.
    pub(crate) fn len(&self) -> usize {
        self.bufs.len()
    }

    /// A buffer holding `bytes` (at most [`Self::BUF`]); `None` when none
    /// can be had.
    pub(crate) fn take(&mut self, bytes: &[u8]) -> Option<Shared<Region>> {
        if bytes.len() > Self::BUF {
            return None;
        }
        let n = self.bufs.len();
        let start = self.next.min(n);
        let free = (start..n)
            .chain(0..start)
            .find(|&i| Shared::get_mut(&mut self.bufs[i]).is_some());
        let i = match free {
            Some(i) => i,
            None if self.bufs.len() < Self::MAX => {
                let r = Shared::try_new(Region::alloc(Self::BUF)?).ok()?;
                irpverbs_ring::try_push(&mut self.bufs, r).ok()?;
                self.bufs.len() - 1
            }
            None => return None,
        };
        self.next = i + 1;
        let r = &self.bufs[i];
        r.write(0, bytes).ok()?;
        Some(r.clone())
    }
}

/// The default UDP port of a soft HCA's link.
pub const DEFAULT_PORT: u16 = ROCE_PORT;

/// The local ACK timeout of a QP's `timeout` attribute: 4.096 us *
/// 2^timeout; `None` for 0 (infinite).
#[must_use]
pub const fn ack_timeout_ns(timeout: u8) -> Option<u64> {
    if timeout == 0 {
        None
    } else {
        Some(4096u64 << (timeout & 31))
    }
}

/// The RNR NAK timer of an AETH timer code (IBTA table 45), in ns.
#[must_use]
pub const fn rnr_timer_ns(code: u8) -> u64 {
    const US: [u32; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840,
        5120, 7680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
        245_760, 327_680, 491_520,
    ];
    US[(code & 31) as usize] as u64 * 1000
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::packet::{Burst, Seg, op};

    fn gid(last: u8) -> Gid {
        let mut g = [0u8; 16];
        g[10] = 0xFF;
        g[11] = 0xFF;
        g[12..].copy_from_slice(&[10, 0, 0, last]);
        g
    }

    #[test]
    fn timer_encodings() {
        assert_eq!(ack_timeout_ns(0), None);
        assert_eq!(ack_timeout_ns(1), Some(8192));
        assert_eq!(ack_timeout_ns(14), Some(4096 << 14));
        assert_eq!(rnr_timer_ns(0), 655_360_000);
        assert_eq!(rnr_timer_ns(1), 10_000);
        assert_eq!(rnr_timer_ns(31), 491_520_000);
        assert_eq!(burst_mtu(4096 * 3, 3), 4096);
        assert_eq!(burst_mtu(1024 * 2 + 1, 3), 1024);
        assert_eq!(burst_mtu(257, 2), 256);
        assert_eq!(middle_of(op::RC_SEND_FIRST), op::RC_SEND_MIDDLE);
        assert_eq!(middle_of(op::UC_WRITE_FIRST), op::UC_WRITE_MIDDLE);
        assert_eq!(
            middle_of(op::RC_READ_RESPONSE_FIRST),
            op::RC_READ_RESPONSE_MIDDLE
        );
        assert_eq!(middle_of(op::RC_SEND_MIDDLE), op::RC_SEND_MIDDLE);
    }

    /// A burst of three packets becomes three datagrams, FIRST, MIDDLE,
    /// LAST, with consecutive PSNs, the RETH on the first, the immediate
    /// and the ACK request on the last, and the payload cut at the MTU; each
    /// parses back.
    #[test]
    fn bursts_are_cut_into_packets() {
        let (data, batch) = burst_batch();
        let (mut tx, mut scratch, mut loopq) = (TxBatch::default(), Vec::new(), Batch::default());
        let mut stats = LinkStats::default();
        serialize(&batch, &mut tx, &mut scratch, &mut loopq, 4791, &mut stats);
        assert_eq!(tx.len(), 3);
        assert_eq!(stats.tx_datagrams, 3);
        assert_eq!(stats.signals_dropped, 1);
        assert_eq!(loopq.frames, [Frame::Sent { qpn: 9, psn: 1 }]);
        let mut got = Vec::new();
        for (i, d) in tx.iter().enumerate() {
            let (p, payload) = wire::parse_transport(d.payload, &d.ip()).unwrap();
            assert_eq!(p.psn, psn_add(0xFF_FFFF, i as u32));
            assert_eq!(
                p.opcode,
                [
                    op::RC_WRITE_FIRST,
                    op::RC_WRITE_MIDDLE,
                    op::RC_WRITE_LAST_IMM
                ][i]
            );
            assert_eq!(p.ack_req, i == 2);
            if i == 0 {
                assert_eq!(p.reth.rkey, 7);
            }
            if i == 2 {
                assert_eq!(p.imm, 0x0102_0304);
            }
            assert_eq!(d.dst_port, 4791);
            assert_eq!(d.src_port, entropy_port(0x12));
            got.extend_from_slice(payload);
        }
        assert_eq!(got, data, "256 + 256 + 88 bytes, in order");
    }

    /// Serializing grows the transmit batch and the scratch buffer to new
    /// high-water marks fallibly: with any one of its allocations failing,
    /// the packets it had no memory for are dropped and counted as transmit
    /// errors (RC retransmits them), the others go, and nothing aborts.
    #[test]
    fn serializing_without_memory_drops_and_counts() {
        let (_, batch) = burst_batch();
        let mut n = 0;
        loop {
            let (mut tx, mut scratch, mut loopq) =
                (TxBatch::default(), Vec::new(), Batch::default());
            let mut stats = LinkStats::default();
            let ((), failed) = irpverbs_failalloc::failing_nth(n, || {
                serialize(&batch, &mut tx, &mut scratch, &mut loopq, 4791, &mut stats);
            });
            assert_eq!(stats.tx_datagrams + stats.tx_errors, 3, "run {n}");
            assert_eq!(tx.len() as u64, stats.tx_datagrams, "run {n}");
            let signals = loopq.frames.len();
            if failed {
                assert!(
                    stats.tx_errors > 0 || signals == 0,
                    "run {n}: a failure went unnoticed"
                );
            } else {
                assert_eq!((stats.tx_errors, signals), (0, 1));
                break;
            }
            n += 1;
        }
        assert!(
            n >= 3,
            "the scratch buffer, the datagram bytes and items: {n}"
        );
        // A batch with room takes more without allocating.
        let (mut tx, mut scratch, mut loopq) = (TxBatch::default(), Vec::new(), Batch::default());
        let mut stats = LinkStats::default();
        serialize(&batch, &mut tx, &mut scratch, &mut loopq, 4791, &mut stats);
        tx.clear();
        loopq.clear();
        let ((), allocated) = irpverbs_failalloc::counting(|| {
            serialize(&batch, &mut tx, &mut scratch, &mut loopq, 4791, &mut stats);
        });
        assert_eq!(allocated, 0);
        let mut more = TxBatch::default();
        let ((), failed) = irpverbs_failalloc::failing_nth(0, || {
            assert!(!more.append(&mut tx), "no memory to grow: refused");
        });
        assert!(failed);
        assert_eq!((more.len(), tx.len()), (0, 3), "both unchanged");
    }

    /// A write of 600 bytes as a burst of three packets (and a signal).
    fn burst_batch() -> (Vec<u8>, Batch) {
        let region = Shared::try_new(Region::alloc(600).unwrap()).unwrap();
        let data: Vec<u8> = (0..600u32).map(|i| i as u8).collect();
        region.write(0, &data).unwrap();
        let mut pkt = Packet {
            opcode: op::RC_WRITE_FIRST,
            dest_qpn: 0x12,
            psn: 0xFF_FFFF,
            sgid: gid(1),
            dgid: gid(2),
            hop_limit: 64,
            payload_len: 600,
            ack_req: true,
            imm: 0x0102_0304,
            ..Packet::default()
        };
        pkt.reth.len = 600;
        pkt.reth.rkey = 7;
        let mut batch = Batch::default();
        batch.segs.push(Seg {
            region: region.clone(),
            offset: 0,
            len: 600,
        });
        batch.frames.push(Frame::Packet {
            pkt,
            burst: Burst {
                count: 3,
                last_opcode: op::RC_WRITE_LAST_IMM,
            },
            seg: 0,
            nsegs: 1,
            notify: Some(9),
        });
        assert!(batch.push_signal(Frame::RetryHint { qpn: 1 }));
        (data, batch)
    }

    #[test]
    fn receive_buffers_are_reused_once_free() {
        let mut pool = RxPool::default();
        let a = pool.take(&[1, 2, 3]).unwrap();
        let b = pool.take(&[4]).unwrap();
        assert!(!Shared::ptr_eq(&a, &b));
        let a_addr = a.addr();
        drop(a);
        let c = pool.take(&[5]).unwrap();
        assert_eq!(c.addr(), a_addr);
        assert!(pool.take(&[0; RxPool::BUF + 1]).is_none());
    }

    #[test]
    fn receive_buffers_stop_at_their_cap() {
        let mut pool = RxPool::default();
        let held: Vec<_> = (0..RxPool::MAX).map(|_| pool.take(&[7]).unwrap()).collect();
        assert!(pool.take(&[8]).is_none(), "every buffer is in use");
        drop(held);
        assert!(pool.take(&[8]).is_some());
        assert_eq!(pool.bufs.len(), RxPool::MAX);
    }
}
