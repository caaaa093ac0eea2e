//! The general services interface: QP1, the UD queue pair every port has
//! for management datagrams (MADs), here for the connection manager.
//!
//! QP1 is not a QP of the QP table (numbers there start at 2): the GSI is
//! part of the firmware, as on HCAs whose firmware owns the special QPs.
//!
//! - **Send** ([`Firmware::send_mad`]): a MAD becomes one RoCEv2 UD SEND
//!   ONLY packet with a DETH (Q_Key [`GSI_QKEY`], source QP 1) to the
//!   destination QP (normally 1) at the destination GID, routed like every
//!   packet: loopback, a fabric peer, or the link (the wire stage
//!   serializes it as any UD packet). Its 256 bytes are copied into a
//!   buffer of the GSI's (one of a few it reuses once their packets let go
//!   of them), so the caller's buffer is free at once. A MAD
//!   with no route is lost (counted in `packets_dropped`).
//! - **Receive** ([`receive`]): a packet to QP 1 is a MAD if it is a UD
//!   SEND ONLY (no immediate) of exactly 256 bytes with the GSI Q_Key,
//!   addressed to one of the port's GIDs, whose MAD base version is 1.
//!   Anything else is dropped and counted ([`SoftStats::mads_dropped`]),
//!   as is a MAD that finds [`MAD_QUEUE_DEPTH`] MADs queued. A MAD is
//!   queued with its source; the first one queued while the driver has
//!   not been told yet raises [`Event::Mad`] on the event queue, and the
//!   driver takes MADs with `poll_mad` until there are none (which re-arms
//!   the announcement).
//!
//! [`SoftStats::mads_dropped`]: crate::SoftStats::mads_dropped

use irpverbs_abi::{NtStatus, STATUS_INSUFFICIENT_RESOURCES, STATUS_INVALID_PARAMETER};
use irpverbs_core::{Event, GSI_QKEY, GSI_QPN, MAD_SIZE, MadIn, MadOut};
use irpverbs_ring::{Region, Shared};

use crate::firmware::Firmware;
use crate::firmware::datapath::{DataPath, Gsi};
use crate::firmware::port::{PORT_NUM, Port};
use crate::transport::engine::DEFAULT_PKEY;
use crate::wire::packet::{Burst, Deth, PSN_MASK, Packet, Seg, op, psn_add};

/// MADs the GSI holds for the driver at most; more are dropped.
pub const MAD_QUEUE_DEPTH: usize = 1024;

/// The MAD base version this GSI accepts (IBTA 13.4.2).
const MAD_BASE_VERSION: u8 = 1;

/// MAD buffers [`Gsi::spare`] keeps at most.
const SPARE_MADS: usize = 64;

impl Gsi {
    /// A buffer holding `mad`: a spare no packet holds any more, or a new
    /// one; `None` when no memory is left.
    fn buffer(&mut self, mad: &[u8; MAD_SIZE]) -> Option<Shared<Region>> {
        // The oldest spare is the likeliest to be free; a busy one goes to
        // the back, and at most one is tried.
        let reused = match self.spare.pop_front() {
            Some(r) if Shared::strong_count(&r) == 1 => Some(r),
            Some(busy) => {
                self.spare.push_back(busy);
                None
            }
            None => None,
        };
        let r = match reused {
            Some(r) => r,
            None => Shared::try_new(Region::alloc(MAD_SIZE)?).ok()?,
        };
        r.write(0, mad).ok()?;
        if self.spare.len() < SPARE_MADS && self.spare.try_reserve(1).is_ok() {
            self.spare.push_back(r.clone());
        }
        Some(r)
    }
}

impl Gsi {
    /// Takes the oldest MAD; on none, the next MAD will be announced.
    pub(crate) fn poll(&mut self) -> Option<MadIn> {
        let m = self.queue.pop_front();
        if m.is_none() {
            self.announced = false;
        }
        m
    }
}

impl Firmware {
    /// Sends `mad` from QP1 (see the module).
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER` for another port than 1, an unused GID
    /// index, a QP number past 24 bits or a flow label past 20 bits;
    /// `STATUS_INSUFFICIENT_RESOURCES` when no memory is left for the
    /// MAD's copy.
    pub(crate) fn send_mad(&mut self, mad: &MadOut) -> Result<(), NtStatus> {
        if mad.port != PORT_NUM || mad.dest_qpn > PSN_MASK || mad.flow_label > 0xF_FFFF {
            return Err(STATUS_INVALID_PARAMETER);
        }
        let sgid = self
            .port
            .valid_gid(u32::from(mad.sgid_index))
            .ok_or(STATUS_INVALID_PARAMETER)?;
        let dp = &mut self.dp;
        let region = dp
            .gsi
            .buffer(&mad.mad)
            .ok_or(STATUS_INSUFFICIENT_RESOURCES)?;
        let psn = dp.gsi.psn;
        dp.gsi.psn = psn_add(psn, 1);
        dp.gsi.sent += 1;
        let pkt = Packet {
            opcode: op::UD_SEND_ONLY,
            pkey: DEFAULT_PKEY,
            dest_qpn: mad.dest_qpn,
            psn,
            sgid,
            dgid: mad.dgid,
            traffic_class: mad.traffic_class,
            flow_label: mad.flow_label,
            hop_limit: mad.hop_limit,
            deth: Deth {
                qkey: GSI_QKEY,
                src_qpn: GSI_QPN,
            },
            payload_len: MAD_SIZE as u32,
            ..Packet::default()
        };
        let _ = dp.emit::<()>(pkt, Burst::one(pkt.opcode), None, |segs| {
            segs.push(Seg {
                region,
                offset: 0,
                len: MAD_SIZE,
            });
            Ok(())
        });
        Ok(())
    }
}

/// A packet to QP 1: queues it as a MAD for the driver, or drops it.
pub(crate) fn receive(dp: &mut DataPath, port: &Port, pkt: &Packet, burst: Burst, payload: &[Seg]) {
    let q = &mut dp.gsi.queue;
    // The queue grows to its high-water mark, fallibly: a MAD it has no
    // memory for is dropped (MADs are datagrams; the CM retries).
    let room = q.len() < MAD_QUEUE_DEPTH && (q.len() < q.capacity() || q.try_reserve(1).is_ok());
    match check(port, pkt, burst, payload) {
        Some(m) if room => {
            dp.gsi.queue.push_back(m);
            dp.gsi.received += 1;
            if !dp.gsi.announced {
                dp.gsi.announced = dp.event(Event::Mad);
            }
        }
        _ => {
            dp.gsi.dropped += 1;
            dp.stats.packets_dropped += u64::from(burst.count);
        }
    }
}

/// The MAD `pkt` carries, if it is one.
fn check(port: &Port, pkt: &Packet, burst: Burst, payload: &[Seg]) -> Option<MadIn> {
    if pkt.opcode != op::UD_SEND_ONLY
        || burst.count != 1
        || pkt.deth.qkey != GSI_QKEY
        || pkt.payload_len as usize != MAD_SIZE
    {
        return None;
    }
    let dgid_index =
        (0..crate::firmware::port::GID_TBL_LEN).find(|&i| port.valid_gid(i) == Some(pkt.dgid))?;
    let mut mad = [0u8; MAD_SIZE];
    let mut at = 0usize;
    for s in payload {
        let end = at.checked_add(s.len).filter(|&e| e <= MAD_SIZE)?;
        s.region.read(s.offset, &mut mad[at..end]).ok()?;
        at = end;
    }
    if at != MAD_SIZE || mad[0] != MAD_BASE_VERSION {
        return None;
    }
    Some(MadIn {
        port: PORT_NUM,
        pkey_index: 0,
        dgid_index: u8::try_from(dgid_index).ok()?,
        sgid: pkt.sgid,
        src_qpn: pkt.deth.src_qpn,
        traffic_class: pkt.traffic_class,
        flow_label: pkt.flow_label,
        hop_limit: pkt.hop_limit,
        mad,
    })
}
