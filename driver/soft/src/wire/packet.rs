//! The transport's packets, as the requester, responder and completer
//! exchange them: the IBTA base transport header (BTH) and extension header
//! fields, and a payload described as memory segments, never copied into
//! the packet.
//!
//! One opcode table ([`mask`] of an opcode, [`header_len`]) decides which
//! headers a packet carries, as Linux rxe's `rxe_opcode.c` does; opcodes are
//! the IBTA numbers (RC 0x00.., UC 0x20.., UD 0x60..), so the wire stage can
//! serialize a [`Packet`] to RoCEv2 byte for byte: the fields a header does
//! not carry are ignored there.
//!
//! In-process delivery moves [`Frame`]s in [`Batch`]es: a batch owns its
//! frames and, in one list beside them, the payload [`Seg`]ments, each a
//! reference-counted region (the source MR, or the send queue's slot for
//! inline data) with an offset and a length. The receiver copies straight
//! from there into its destination region: one copy per byte, no bounce
//! buffer, and no allocation once a batch's vectors have grown.

use alloc::vec::Vec;

use irpverbs_ring::{Region, Shared};

/// A GID (RoCE: an IPv6 or IPv4-mapped address).
pub type Gid = [u8; 16];

/// BTH opcodes (IBTA 9.2, table 38): transport in bits 7..5, operation in
/// bits 4..0.
pub mod op {
    #![allow(missing_docs)]
    pub const RC_SEND_FIRST: u8 = 0x00;
    pub const RC_SEND_MIDDLE: u8 = 0x01;
    pub const RC_SEND_LAST: u8 = 0x02;
    pub const RC_SEND_LAST_IMM: u8 = 0x03;
    pub const RC_SEND_ONLY: u8 = 0x04;
    pub const RC_SEND_ONLY_IMM: u8 = 0x05;
    pub const RC_WRITE_FIRST: u8 = 0x06;
    pub const RC_WRITE_MIDDLE: u8 = 0x07;
    pub const RC_WRITE_LAST: u8 = 0x08;
    pub const RC_WRITE_LAST_IMM: u8 = 0x09;
    pub const RC_WRITE_ONLY: u8 = 0x0A;
    pub const RC_WRITE_ONLY_IMM: u8 = 0x0B;
    pub const RC_READ_REQUEST: u8 = 0x0C;
    pub const RC_READ_RESPONSE_FIRST: u8 = 0x0D;
    pub const RC_READ_RESPONSE_MIDDLE: u8 = 0x0E;
    pub const RC_READ_RESPONSE_LAST: u8 = 0x0F;
    pub const RC_READ_RESPONSE_ONLY: u8 = 0x10;
    pub const RC_ACKNOWLEDGE: u8 = 0x11;
    pub const RC_ATOMIC_ACKNOWLEDGE: u8 = 0x12;
    pub const RC_COMPARE_SWAP: u8 = 0x13;
    pub const RC_FETCH_ADD: u8 = 0x14;
    pub const RC_SEND_LAST_INV: u8 = 0x16;
    pub const RC_SEND_ONLY_INV: u8 = 0x17;
    pub const UC_SEND_FIRST: u8 = 0x20;
    pub const UC_SEND_MIDDLE: u8 = 0x21;
    pub const UC_SEND_LAST: u8 = 0x22;
    pub const UC_SEND_LAST_IMM: u8 = 0x23;
    pub const UC_SEND_ONLY: u8 = 0x24;
    pub const UC_SEND_ONLY_IMM: u8 = 0x25;
    pub const UC_WRITE_FIRST: u8 = 0x26;
    pub const UC_WRITE_MIDDLE: u8 = 0x27;
    pub const UC_WRITE_LAST: u8 = 0x28;
    pub const UC_WRITE_LAST_IMM: u8 = 0x29;
    pub const UC_WRITE_ONLY: u8 = 0x2A;
    pub const UC_WRITE_ONLY_IMM: u8 = 0x2B;
    pub const UD_SEND_ONLY: u8 = 0x64;
    pub const UD_SEND_ONLY_IMM: u8 = 0x65;

    /// Transport bits of an opcode.
    pub const TRANSPORT_MASK: u8 = 0xE0;
    /// Reliable connection.
    pub const RC: u8 = 0x00;
    /// Unreliable connection.
    pub const UC: u8 = 0x20;
    /// Unreliable datagram.
    pub const UD: u8 = 0x60;
}

/// What an opcode's packet carries and means (bits of [`mask`]).
pub mod m {
    #![allow(missing_docs)]
    /// RDMA extended transport header (va, rkey, length).
    pub const RETH: u32 = 1 << 0;
    /// ACK extended transport header (syndrome, MSN).
    pub const AETH: u32 = 1 << 1;
    /// Atomic extended transport header.
    pub const ATMETH: u32 = 1 << 2;
    /// Atomic ACK extended transport header (original value).
    pub const ATMACK: u32 = 1 << 3;
    /// Immediate data.
    pub const IMMDT: u32 = 1 << 4;
    /// Invalidate extended transport header (rkey).
    pub const IETH: u32 = 1 << 5;
    /// Datagram extended transport header (Q_Key, source QP).
    pub const DETH: u32 = 1 << 6;
    /// Carries a payload.
    pub const PAYLOAD: u32 = 1 << 7;
    /// A request (requester to responder).
    pub const REQ: u32 = 1 << 8;
    /// A response (responder to requester): ACK, READ response, atomic ACK.
    pub const RESP: u32 = 1 << 9;
    pub const SEND: u32 = 1 << 10;
    pub const WRITE: u32 = 1 << 11;
    pub const READ: u32 = 1 << 12;
    pub const ATOMIC: u32 = 1 << 13;
    /// Consumes a receive WQE (first packet of a SEND, last of a WRITE
    /// with immediate).
    pub const RWR: u32 = 1 << 14;
    /// Completes the receive WQE.
    pub const COMP: u32 = 1 << 15;
    /// First packet of a message (FIRST or ONLY).
    pub const START: u32 = 1 << 16;
    /// A MIDDLE packet.
    pub const MIDDLE: u32 = 1 << 17;
    /// Last packet of a message (LAST or ONLY).
    pub const END: u32 = 1 << 18;
}

/// The header mask of `opcode`; 0 for an opcode this HCA does not know
/// (reserved, RD, XRC, CNP, ...). One load from the opcode table (rxe's
/// `rxe_opcode`): every packet asks several times.
#[must_use]
#[inline(always)]
pub const fn mask(opcode: u8) -> u32 {
    MASKS[opcode as usize]
}

/// [`mask`] of every opcode, built at compile time from [`mask_of`].
const MASKS: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        // In range: `i` < 256.
        t[i] = mask_of(i as u8);
        i += 1;
    }
    t
};

/// The header mask of `opcode`, by its transport and code (IBTA 9.2,
/// table 38).
const fn mask_of(opcode: u8) -> u32 {
    use m::*;
    let transport = opcode & op::TRANSPORT_MASK;
    let code = opcode & 0x1F;
    if transport == op::UD {
        return match code {
            0x04 => DETH | PAYLOAD | REQ | SEND | RWR | COMP | START | END,
            0x05 => DETH | IMMDT | PAYLOAD | REQ | SEND | RWR | COMP | START | END,
            _ => 0,
        };
    }
    if transport != op::RC && transport != op::UC {
        return 0;
    }
    let both = match code {
        0x00 => PAYLOAD | REQ | SEND | RWR | START,
        0x01 => PAYLOAD | REQ | SEND | MIDDLE,
        0x02 => PAYLOAD | REQ | SEND | COMP | END,
        0x03 => IMMDT | PAYLOAD | REQ | SEND | COMP | END,
        0x04 => PAYLOAD | REQ | SEND | RWR | COMP | START | END,
        0x05 => IMMDT | PAYLOAD | REQ | SEND | RWR | COMP | START | END,
        0x06 => RETH | PAYLOAD | REQ | WRITE | START,
        0x07 => PAYLOAD | REQ | WRITE | MIDDLE,
        0x08 => PAYLOAD | REQ | WRITE | END,
        0x09 => IMMDT | PAYLOAD | REQ | WRITE | RWR | COMP | END,
        0x0A => RETH | PAYLOAD | REQ | WRITE | START | END,
        0x0B => RETH | IMMDT | PAYLOAD | REQ | WRITE | RWR | COMP | START | END,
        _ => 0,
    };
    if both != 0 || transport == op::UC {
        return both;
    }
    match code {
        0x0C => RETH | REQ | READ | START | END,
        0x0D => AETH | PAYLOAD | RESP | READ | START,
        0x0E => PAYLOAD | RESP | READ | MIDDLE,
        0x0F => AETH | PAYLOAD | RESP | READ | END,
        0x10 => AETH | PAYLOAD | RESP | READ | START | END,
        0x11 => AETH | RESP | START | END,
        0x12 => AETH | ATMACK | RESP | ATOMIC | START | END,
        0x13 | 0x14 => ATMETH | REQ | ATOMIC | START | END,
        0x16 => IETH | PAYLOAD | REQ | SEND | COMP | END,
        0x17 => IETH | PAYLOAD | REQ | SEND | RWR | COMP | START | END,
        _ => 0,
    }
}

/// Bytes of the BTH.
pub const BTH_LEN: usize = 12;
/// Bytes of each extension header.
pub const RETH_LEN: usize = 16;
/// AETH bytes.
pub const AETH_LEN: usize = 4;
/// AtomicETH bytes.
pub const ATMETH_LEN: usize = 28;
/// AtomicAckETH bytes.
pub const ATMACK_LEN: usize = 8;
/// ImmDt bytes.
pub const IMMDT_LEN: usize = 4;
/// IETH bytes.
pub const IETH_LEN: usize = 4;
/// DETH bytes.
pub const DETH_LEN: usize = 8;

/// Bytes of the BTH and the extension headers `opcode` carries (the
/// transport headers before the payload), `None` for an unknown opcode.
#[must_use]
pub const fn header_len(opcode: u8) -> Option<usize> {
    let k = mask(opcode);
    if k == 0 {
        return None;
    }
    const fn has(k: u32, bit: u32, len: usize) -> usize {
        if k & bit != 0 { len } else { 0 }
    }
    Some(
        BTH_LEN
            + has(k, m::RETH, RETH_LEN)
            + has(k, m::AETH, AETH_LEN)
            + has(k, m::ATMETH, ATMETH_LEN)
            + has(k, m::ATMACK, ATMACK_LEN)
            + has(k, m::IMMDT, IMMDT_LEN)
            + has(k, m::IETH, IETH_LEN)
            + has(k, m::DETH, DETH_LEN),
    )
}

/// AETH syndromes (IBTA 9.7.5.1): bits 7..5 the type, 4..0 the value.
pub mod aeth {
    /// ACK; the low bits are the credit count (0x1F: unlimited).
    pub const ACK: u8 = 0x00;
    /// The credit field value for "no credit flow control".
    pub const ACK_UNLIMITED: u8 = 0x1F;
    /// RNR NAK; the low bits are the RNR timer.
    pub const RNR_NAK: u8 = 0x20;
    /// NAK; the low bits are one of the codes below.
    pub const NAK: u8 = 0x60;
    /// Type bits.
    pub const TYPE_MASK: u8 = 0xE0;
    /// NAK code: PSN sequence error.
    pub const NAK_PSN_SEQ_ERR: u8 = 0;
    /// NAK code: invalid request.
    pub const NAK_INVALID_REQ: u8 = 1;
    /// NAK code: remote access error.
    pub const NAK_REM_ACCESS: u8 = 2;
    /// NAK code: remote operational error.
    pub const NAK_REM_OP: u8 = 3;
    /// NAK code: invalid RD request.
    pub const NAK_INVALID_RD_REQ: u8 = 4;
}

/// The largest PSN, and the mask of PSN arithmetic.
pub const PSN_MASK: u32 = 0xFF_FFFF;

/// `a - b` in 24-bit serial arithmetic: negative when `a` is before `b`.
#[must_use]
pub const fn psn_diff(a: u32, b: u32) -> i32 {
    ((a.wrapping_sub(b) << 8) as i32) >> 8
}

/// `psn + n`, wrapped to 24 bits.
#[must_use]
pub const fn psn_add(psn: u32, n: u32) -> u32 {
    psn.wrapping_add(n) & PSN_MASK
}

/// RDMA extended transport header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reth {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// DMA length of the whole message.
    pub len: u32,
}

/// ACK extended transport header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Aeth {
    /// Syndrome ([`aeth`]).
    pub syndrome: u8,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

/// Atomic extended transport header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AtomicEth {
    /// Remote virtual address (8-byte aligned).
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap (compare and swap) or add (fetch and add) operand.
    pub swap_add: u64,
    /// Compare operand.
    pub compare: u64,
}

/// Datagram extended transport header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Deth {
    /// Q_Key.
    pub qkey: u32,
    /// Source QP number (24 bits).
    pub src_qpn: u32,
}

/// A transport packet: the fields of the BTH and of every extension header
/// (valid as [`mask`] of `opcode` says), the network addresses, and the
/// payload length (its bytes are the segments that travel beside it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Packet {
    /// BTH opcode ([`op`]).
    pub opcode: u8,
    /// BTH SE: solicited event.
    pub solicited: bool,
    /// BTH A: acknowledge request.
    pub ack_req: bool,
    /// BTH MigReq: the sender's QP is in MIGRATED (it runs on the path it
    /// migrated to, or never had an alternate one armed).
    pub mig_req: bool,
    /// BTH P_Key.
    pub pkey: u16,
    /// BTH destination QP (24 bits).
    pub dest_qpn: u32,
    /// BTH PSN (24 bits).
    pub psn: u32,
    /// Source GID (IP source address).
    pub sgid: Gid,
    /// Destination GID (IP destination address).
    pub dgid: Gid,
    /// IP traffic class.
    pub traffic_class: u8,
    /// IPv6 flow label.
    pub flow_label: u32,
    /// IP hop limit (TTL).
    pub hop_limit: u8,
    /// RETH.
    pub reth: Reth,
    /// AETH.
    pub aeth: Aeth,
    /// AtomicETH.
    pub atomic: AtomicEth,
    /// AtomicAckETH: the original value at the remote address.
    pub atomic_orig: u64,
    /// ImmDt, exactly as the ULP wrote it in its WQE (its in-memory bytes
    /// are the wire bytes) and as the receiver's CQE reports it.
    pub imm: u32,
    /// IETH: the rkey to invalidate.
    pub ieth: u32,
    /// DETH.
    pub deth: Deth,
    /// Payload bytes (without pad).
    pub payload_len: u32,
}

impl Packet {
    /// The header mask of its opcode.
    #[must_use]
    pub const fn mask(&self) -> u32 {
        mask(self.opcode)
    }

    /// The pad count the BTH would carry (payload to a multiple of 4).
    #[must_use]
    pub const fn pad(&self) -> u32 {
        self.payload_len.wrapping_neg() & 3
    }
}

/// A piece of a payload: `len` bytes at `offset` in `region`.
#[derive(Clone, Debug)]
pub struct Seg {
    /// The memory (an MR's pinned region, or a send queue ring for inline
    /// data); the reference keeps it alive while the packet travels.
    pub region: Shared<Region>,
    /// Byte offset in the region.
    pub offset: usize,
    /// Bytes.
    pub len: usize,
}

/// Consecutive packets of one message, carried as one frame in-process.
///
/// Segmentation is unchanged: a message of `n` bytes is
/// `max(1, ceil(n / MTU))` packets, each with its own PSN and opcode
/// (FIRST, MIDDLE..., LAST, or ONLY), every one but the message's last
/// carrying exactly one MTU. A burst is a run of them: the frame's
/// [`Packet`] is the first (its `opcode`, `psn`, RETH), `last_opcode` the
/// opcode of the last (whose fields are the ImmDt, IETH, solicited event
/// and ACK request the packet carries), packets between them are MIDDLEs,
/// and `payload_len` is the bytes of them all. In-process delivery then
/// validates and copies a message once instead of once per MTU; the wire
/// stage sends the packets one by one (a burst of 1 is a packet).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Burst {
    /// Packets (at least 1).
    pub count: u32,
    /// Opcode of the last packet (the first's when `count` is 1).
    pub last_opcode: u8,
}

impl Burst {
    /// A single packet of opcode `opcode`.
    #[must_use]
    pub const fn one(opcode: u8) -> Self {
        Self {
            count: 1,
            last_opcode: opcode,
        }
    }

    /// The PSN of the last packet of a burst starting at `psn`.
    #[must_use]
    pub const fn last_psn(&self, psn: u32) -> u32 {
        psn_add(psn, self.count.saturating_sub(1))
    }
}

/// What travels between HCAs: a packet (or a [`Burst`] of them), or one of
/// the in-process fabric's own signals (not wire packets: the wire stage
/// replaces them by its transmit notification and its RNR timer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame {
    /// A transport packet, or a burst; its payload is `nsegs` segments
    /// from `seg` in the batch's segment list.
    Packet {
        /// The (first) packet.
        pkt: Packet,
        /// How many packets.
        burst: Burst,
        /// First segment.
        seg: u32,
        /// Segments.
        nsegs: u32,
        /// Unacknowledged transports (UC, UD): after consuming this packet
        /// (or dropping it) the receiving HCA tells QP `notify` at the
        /// packet's source GID that its bytes have left the source buffers,
        /// so the requester may complete the WQE.
        notify: Option<u32>,
    },
    /// The packet `psn` of QP `qpn` was consumed (see `notify`).
    Sent {
        /// The requester QP.
        qpn: u32,
        /// The packet's PSN.
        psn: u32,
    },
    /// QP `qpn` (a requester waiting after an RNR NAK) may retry now: its
    /// responder got a receive WQE posted. Stands in for the RNR timer.
    RetryHint {
        /// The requester QP.
        qpn: u32,
    },
}

/// Frames with their payload segments. Vectors are cleared, never freed,
/// so a batch reused in steady state does not allocate.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    /// The frames, in order.
    pub frames: Vec<Frame>,
    /// The segments of the frames' payloads.
    pub segs: Vec<Seg>,
}

impl Batch {
    /// No frames.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Drops every frame and segment, keeping the capacity.
    pub fn clear(&mut self) {
        self.frames.clear();
        self.segs.clear();
    }

    /// Moves every frame of `other` to the end of this batch (`other` is
    /// left empty, with its capacity). False, and both batches unchanged,
    /// when this one has no memory to grow.
    #[must_use]
    pub fn append(&mut self, other: &mut Batch) -> bool {
        if !self.room_for(other.frames.len(), other.segs.len()) {
            return false;
        }
        let base = u32::try_from(self.segs.len()).unwrap_or(u32::MAX);
        self.frames.extend(other.frames.drain(..).map(|mut f| {
            if let Frame::Packet { seg, .. } = &mut f {
                *seg = seg.saturating_add(base);
            }
            f
        }));
        self.segs.append(&mut other.segs);
        true
    }

    /// Makes room for `frames` more frames and `segs` more segments,
    /// fallibly; false when memory is short. Cheap when the room is there.
    #[must_use]
    pub fn room_for(&mut self, frames: usize, segs: usize) -> bool {
        self.frames.try_reserve(frames).is_ok() && self.segs.try_reserve(segs).is_ok()
    }

    /// The payload segments of a packet frame (empty for a bad range).
    #[must_use]
    pub fn payload(&self, seg: u32, nsegs: u32) -> &[Seg] {
        let start = seg as usize;
        let end = start.saturating_add(nsegs as usize);
        self.segs.get(start..end).unwrap_or(&[])
    }

    /// Appends a signal frame; false (the signal lost) when the batch has
    /// no memory to grow.
    pub fn push_signal(&mut self, frame: Frame) -> bool {
        if self.frames.try_reserve(1).is_err() {
            return false;
        }
        self.frames.push(frame);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_opcode_table() {
        assert_eq!(op::RC_SEND_ONLY, 0x04);
        let known: Vec<u8> = (0..=255u8).filter(|&o| mask(o) != 0).collect();
        assert_eq!(known.len(), 23 + 12 + 2, "RC 23, UC 12, UD 2");
        for o in 0..=255u8 {
            assert_eq!(mask(o), mask_of(o), "the table of {o:#x}");
        }
        for o in known {
            let k = mask(o);
            assert!(
                k & (m::REQ | m::RESP) != 0,
                "{o:#x} is a request or a response"
            );
            assert!(k & m::REQ == 0 || k & m::RESP == 0);
            assert!(k & (m::START | m::MIDDLE | m::END) != 0, "{o:#x}");
            let uc = o & op::TRANSPORT_MASK == op::UC;
            if uc {
                assert_eq!(mask(o), mask(o & 0x1F), "UC is RC's first twelve");
            }
        }
        assert_eq!(mask(0x15), 0, "RESYNC is not supported");
        assert_eq!(mask(0x2C), 0, "UC has no READ");
        assert_eq!(mask(0x36), 0, "UC has no SEND with invalidate");
        assert_eq!(mask(0x40), 0, "no RD");
        assert_eq!(mask(0x81), 0, "no CNP");
        assert_eq!(header_len(op::RC_SEND_ONLY), Some(12));
        assert_eq!(header_len(op::RC_WRITE_ONLY_IMM), Some(12 + 16 + 4));
        assert_eq!(header_len(op::RC_COMPARE_SWAP), Some(12 + 28));
        assert_eq!(header_len(op::RC_ATOMIC_ACKNOWLEDGE), Some(12 + 4 + 8));
        assert_eq!(header_len(op::UD_SEND_ONLY_IMM), Some(12 + 8 + 4));
        assert_eq!(header_len(op::RC_SEND_ONLY_INV), Some(12 + 4));
        assert_eq!(header_len(0xFF), None);
    }

    #[test]
    fn psn_arithmetic_wraps_at_24_bits() {
        assert_eq!(psn_add(PSN_MASK, 1), 0);
        assert_eq!(psn_diff(0, PSN_MASK), 1);
        assert_eq!(psn_diff(PSN_MASK, 0), -1);
        assert_eq!(psn_diff(5, 5), 0);
        assert_eq!(psn_diff(0x80_0000, 0), -0x80_0000);
        let p = Packet {
            payload_len: 5,
            ..Packet::default()
        };
        assert_eq!(p.pad(), 3);
    }

    #[test]
    fn batches_append_and_keep_segments_with_their_frames() {
        let r = Shared::try_new(Region::alloc(64).unwrap()).unwrap();
        let seg = |offset| Seg {
            region: r.clone(),
            offset,
            len: 1,
        };
        let pkt = |seg, nsegs| Frame::Packet {
            pkt: Packet::default(),
            burst: Burst::one(0),
            seg,
            nsegs,
            notify: None,
        };
        let mut a = Batch::default();
        a.segs.push(seg(0));
        a.frames.push(pkt(0, 1));
        let mut b = Batch::default();
        b.segs.extend([seg(1), seg(2)]);
        b.frames.push(pkt(0, 2));
        assert!(b.push_signal(Frame::RetryHint { qpn: 3 }));
        assert!(a.append(&mut b));
        assert!(b.is_empty() && b.segs.is_empty());
        assert_eq!(a.frames.len(), 3);
        let Frame::Packet { seg, nsegs, .. } = a.frames[1] else {
            panic!()
        };
        let offsets: Vec<usize> = a.payload(seg, nsegs).iter().map(|s| s.offset).collect();
        assert_eq!(offsets, [1, 2]);
        assert!(a.payload(7, 2).is_empty());
        a.clear();
        assert!(a.is_empty() && a.frames.capacity() >= 3);
    }
}
