//! Zero-copy views of the InfiniBand transport headers (IBTA 9.2-9.3), in
//! network byte order: cast them from received bytes with zerocopy
//! (`ref_from_prefix`, `read_from_prefix`) and write them with `as_bytes`.
//! Every view has the exact size and alignment 1 of the header, so any
//! byte offset of a packet may hold one.
//!
//! Each converts from and to the [`packet`](crate::wire::packet) struct of the
//! same header; 24-bit fields are masked when read.

use zerocopy::byteorder::network_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::wire::packet::{
    AETH_LEN, ATMACK_LEN, ATMETH_LEN, Aeth, AtomicEth, BTH_LEN, DETH_LEN, Deth, IETH_LEN,
    IMMDT_LEN, PSN_MASK, Packet, RETH_LEN, Reth,
};

/// Base transport header (12 bytes).
///
/// | byte | bits |
/// |---|---|
/// | 0 | opcode |
/// | 1 | SE, MigReq, PadCnt (2), TVer (4) |
/// | 2-3 | P_Key |
/// | 4 | FECN, BECN, resv6 (the byte the ICRC masks) |
/// | 5-7 | DestQP |
/// | 8 | AckReq, resv7 |
/// | 9-11 | PSN |
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BthHdr {
    /// Opcode.
    pub opcode: u8,
    /// SE, MigReq, PadCnt, TVer.
    pub flags: u8,
    /// Partition key.
    pub pkey: U16,
    /// FECN, BECN, resv6 and the destination QP.
    pub qpn: U32,
    /// AckReq, resv7 and the PSN.
    pub apsn: U32,
}

/// The BTH's SE bit (in [`BthHdr::flags`]).
pub const BTH_SE: u8 = 0x80;
/// The BTH's MigReq bit.
pub const BTH_MIG: u8 = 0x40;
/// The BTH's FECN bit (in the top byte of [`BthHdr::qpn`]).
pub const BTH_FECN: u32 = 1 << 31;
/// The BTH's BECN bit.
pub const BTH_BECN: u32 = 1 << 30;
/// The BTH's AckReq bit (in [`BthHdr::apsn`]).
pub const BTH_ACK: u32 = 1 << 31;
/// Offset in the BTH of the byte (FECN, BECN, resv6) the ICRC masks.
pub const BTH_RESV8A: usize = 4;

impl BthHdr {
    /// The BTH of `pkt`, with pad count `pad` (0..=3), TVer 0, its
    /// MigReq, and FECN, BECN and the reserved bits 0. The caller checks
    /// that the 24-bit fields fit (they are masked here).
    #[must_use]
    pub fn of(pkt: &Packet, pad: u8) -> Self {
        let mut flags = (pad & 3) << 4;
        if pkt.solicited {
            flags |= BTH_SE;
        }
        if pkt.mig_req {
            flags |= BTH_MIG;
        }
        let ack = if pkt.ack_req { BTH_ACK } else { 0 };
        Self {
            opcode: pkt.opcode,
            flags,
            pkey: U16::new(pkt.pkey),
            qpn: U32::new(pkt.dest_qpn & PSN_MASK),
            apsn: U32::new(ack | (pkt.psn & PSN_MASK)),
        }
    }

    /// Solicited event.
    #[must_use]
    pub fn solicited(&self) -> bool {
        self.flags & BTH_SE != 0
    }

    /// MigReq.
    #[must_use]
    pub fn migreq(&self) -> bool {
        self.flags & BTH_MIG != 0
    }

    /// Pad count: bytes (0..=3) between the payload and the ICRC.
    #[must_use]
    pub fn pad(&self) -> u8 {
        (self.flags >> 4) & 3
    }

    /// Transport header version (0 is the only one).
    #[must_use]
    pub fn tver(&self) -> u8 {
        self.flags & 0x0F
    }

    /// Partition key.
    #[must_use]
    pub fn pkey(&self) -> u16 {
        self.pkey.get()
    }

    /// Forward explicit congestion notification.
    #[must_use]
    pub fn fecn(&self) -> bool {
        self.qpn.get() & BTH_FECN != 0
    }

    /// Backward explicit congestion notification.
    #[must_use]
    pub fn becn(&self) -> bool {
        self.qpn.get() & BTH_BECN != 0
    }

    /// Destination QP (24 bits).
    #[must_use]
    pub fn dest_qpn(&self) -> u32 {
        self.qpn.get() & PSN_MASK
    }

    /// Acknowledge request.
    #[must_use]
    pub fn ack_req(&self) -> bool {
        self.apsn.get() & BTH_ACK != 0
    }

    /// Packet sequence number (24 bits).
    #[must_use]
    pub fn psn(&self) -> u32 {
        self.apsn.get() & PSN_MASK
    }

    /// Sets the BTH fields of `pkt` (opcode, SE, AckReq, P_Key, DestQP,
    /// PSN).
    pub fn fill(&self, pkt: &mut Packet) {
        pkt.opcode = self.opcode;
        pkt.solicited = self.solicited();
        pkt.ack_req = self.ack_req();
        pkt.mig_req = self.migreq();
        pkt.pkey = self.pkey();
        pkt.dest_qpn = self.dest_qpn();
        pkt.psn = self.psn();
    }
}

/// RDMA extended transport header (16 bytes).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RethHdr {
    /// Virtual address.
    pub va: U64,
    /// Remote key.
    pub rkey: U32,
    /// DMA length.
    pub len: U32,
}

impl From<&Reth> for RethHdr {
    fn from(r: &Reth) -> Self {
        Self {
            va: U64::new(r.va),
            rkey: U32::new(r.rkey),
            len: U32::new(r.len),
        }
    }
}

impl From<&RethHdr> for Reth {
    fn from(h: &RethHdr) -> Self {
        Self {
            va: h.va.get(),
            rkey: h.rkey.get(),
            len: h.len.get(),
        }
    }
}

/// ACK extended transport header (4 bytes): syndrome and MSN.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AethHdr {
    /// Syndrome (top byte) and message sequence number (24 bits).
    pub smsn: U32,
}

impl From<&Aeth> for AethHdr {
    fn from(a: &Aeth) -> Self {
        Self {
            smsn: U32::new((u32::from(a.syndrome) << 24) | (a.msn & PSN_MASK)),
        }
    }
}

impl From<&AethHdr> for Aeth {
    fn from(h: &AethHdr) -> Self {
        let v = h.smsn.get();
        Self {
            syndrome: v.to_be_bytes()[0],
            msn: v & PSN_MASK,
        }
    }
}

/// Atomic extended transport header (28 bytes).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AtomicEthHdr {
    /// Virtual address.
    pub va: U64,
    /// Remote key.
    pub rkey: U32,
    /// Swap or add data.
    pub swap_add: U64,
    /// Compare data.
    pub compare: U64,
}

impl From<&AtomicEth> for AtomicEthHdr {
    fn from(a: &AtomicEth) -> Self {
        Self {
            va: U64::new(a.va),
            rkey: U32::new(a.rkey),
            swap_add: U64::new(a.swap_add),
            compare: U64::new(a.compare),
        }
    }
}

impl From<&AtomicEthHdr> for AtomicEth {
    fn from(h: &AtomicEthHdr) -> Self {
        Self {
            va: h.va.get(),
            rkey: h.rkey.get(),
            swap_add: h.swap_add.get(),
            compare: h.compare.get(),
        }
    }
}

/// Atomic acknowledge extended transport header (8 bytes): the original
/// remote data.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AtomicAckEthHdr {
    /// Original remote data.
    pub orig: U64,
}

/// Immediate data (4 bytes). Opaque to the transport: the bytes the ULP
/// wrote are the bytes sent, so [`Packet::imm`] is their in-memory
/// (native-endian) reading, not a network-order number.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ImmDtHdr {
    /// The bytes, as sent.
    pub imm: [u8; 4],
}

impl ImmDtHdr {
    /// The header carrying [`Packet::imm`].
    #[must_use]
    pub fn of(imm: u32) -> Self {
        Self {
            imm: imm.to_ne_bytes(),
        }
    }

    /// The [`Packet::imm`] value of these bytes.
    #[must_use]
    pub fn get(&self) -> u32 {
        u32::from_ne_bytes(self.imm)
    }
}

/// Invalidate extended transport header (4 bytes): the R_Key to
/// invalidate.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IethHdr {
    /// Remote key.
    pub rkey: U32,
}

/// Datagram extended transport header (8 bytes).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DethHdr {
    /// Queue key.
    pub qkey: U32,
    /// Reserved byte and the source QP (24 bits).
    pub src_qp: U32,
}

impl From<&Deth> for DethHdr {
    fn from(d: &Deth) -> Self {
        Self {
            qkey: U32::new(d.qkey),
            src_qp: U32::new(d.src_qpn & PSN_MASK),
        }
    }
}

impl From<&DethHdr> for Deth {
    fn from(h: &DethHdr) -> Self {
        Self {
            qkey: h.qkey.get(),
            src_qpn: h.src_qp.get() & PSN_MASK,
        }
    }
}

const _: () = {
    assert!(size_of::<BthHdr>() == BTH_LEN);
    assert!(size_of::<RethHdr>() == RETH_LEN);
    assert!(size_of::<AethHdr>() == AETH_LEN);
    assert!(size_of::<AtomicEthHdr>() == ATMETH_LEN);
    assert!(size_of::<AtomicAckEthHdr>() == ATMACK_LEN);
    assert!(size_of::<ImmDtHdr>() == IMMDT_LEN);
    assert!(size_of::<IethHdr>() == IETH_LEN);
    assert!(size_of::<DethHdr>() == DETH_LEN);
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::packet::op;

    #[test]
    fn the_bth_bits_are_where_ibta_puts_them() {
        let pkt = Packet {
            opcode: op::RC_SEND_ONLY,
            solicited: true,
            ack_req: true,
            pkey: 0xFFFF,
            dest_qpn: 0x12_3456,
            psn: 0xAB_CDEF,
            ..Packet::default()
        };
        let bth = BthHdr::of(&pkt, 3);
        assert_eq!(
            bth.as_bytes(),
            [
                0x04, 0xB0, 0xFF, 0xFF, 0x00, 0x12, 0x34, 0x56, 0x80, 0xAB, 0xCD, 0xEF
            ]
        );
        assert!(bth.solicited() && bth.ack_req() && !bth.migreq());
        assert_eq!((bth.pad(), bth.tver()), (3, 0));
        let mut back = Packet::default();
        bth.fill(&mut back);
        assert_eq!(back, pkt);

        let (raw, _) =
            BthHdr::read_from_prefix(&[0x04, 0x4F, 0, 0, 0xC1, 0, 0, 1, 0x7F, 0, 0, 2][..])
                .unwrap();
        assert!(raw.migreq() && !raw.solicited());
        assert_eq!(raw.tver(), 0xF);
        assert!(raw.fecn() && raw.becn() && !raw.ack_req());
        assert_eq!((raw.dest_qpn(), raw.psn()), (1, 2), "reserved bits ignored");
    }

    #[test]
    fn extension_headers_are_big_endian_except_immdt() {
        let reth = Reth {
            va: 0x0102_0304_0506_0708,
            rkey: 0x1122_3344,
            len: 0x10,
        };
        let h = RethHdr::from(&reth);
        assert_eq!(h.as_bytes()[..4], [1, 2, 3, 4]);
        assert_eq!(Reth::from(&h), reth);

        let aeth = Aeth {
            syndrome: 0x1F,
            msn: 1,
        };
        let h = AethHdr::from(&aeth);
        assert_eq!(h.as_bytes(), [0x1F, 0, 0, 1]);
        assert_eq!(Aeth::from(&h), aeth);

        let a = AtomicEth {
            va: 8,
            rkey: 9,
            swap_add: 10,
            compare: 11,
        };
        assert_eq!(AtomicEth::from(&AtomicEthHdr::from(&a)), a);

        let d = Deth {
            qkey: 0x1111_1111,
            src_qpn: 0x12,
        };
        let h = DethHdr::from(&d);
        assert_eq!(h.as_bytes(), [0x11, 0x11, 0x11, 0x11, 0, 0, 0, 0x12]);
        let (r, _) = DethHdr::read_from_prefix(&[0, 0, 0, 1, 0xFF, 0, 0, 2][..]).unwrap();
        assert_eq!(Deth::from(&r).src_qpn, 2, "the reserved byte is ignored");

        let imm = u32::from_ne_bytes([0xDE, 0xAD, 0xBE, 0xEF]);
        assert_eq!(ImmDtHdr::of(imm).as_bytes(), [0xDE, 0xAD, 0xBE, 0xEF]);
        assert_eq!(ImmDtHdr::of(imm).get(), imm);
    }
}
