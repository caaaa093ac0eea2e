//! Two soft HCAs cabled back to back, each end's arrivals delivered by the
//! thread that polls that end: two machines on one cable, each with its
//! own processor.
//!
//! Unlike the [`crate::loopwire`], whose one delivery thread runs both
//! receivers (and so every DPC of both devices), here the host that owns
//! an end runs its receive path itself, as a NIC's interrupt would on that
//! machine: [`PairWire::poll`] takes the datagrams queued for the end,
//! checks and delivers them (every header and the ICRC, as from a UDP
//! socket), and fires the end's soft HCA timers that are due on the
//! monotonic clock. The two ends share nothing but the two queues, so two
//! threads that each poll their end run in parallel.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use irpverbs_abi::{NtStatus, STATUS_INVALID_PARAMETER};
use irpverbs_soft::SoftHca;
use irpverbs_soft::link::{Link, OwnedDatagram, TxBatch};

use crate::platform::HostPlatform;

/// Datagrams queued to an HCA between two runs of its data path at most.
const DRIVE_EVERY: usize = 64;

/// One end's inbound queue.
#[derive(Default)]
struct Inbox {
    queue: Mutex<Vec<OwnedDatagram>>,
}

impl Inbox {
    fn queue(&self) -> MutexGuard<'_, Vec<OwnedDatagram>> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What an end's soft HCA transmits on: the peer's inbox.
struct Tx {
    start: Instant,
    peer: Arc<Inbox>,
    /// The peer's GIDs' owner, to drop what is not for it.
    peer_hca: Arc<SoftHca<HostPlatform>>,
}

impl Link for Tx {
    fn transmit(&self, batch: &TxBatch) {
        let mut q = self.peer.queue();
        // A datagram the cable has no memory for is lost (RC retransmits).
        for d in batch.iter().filter(|d| self.peer_hca.owns_gid(&d.dgid)) {
            if let Some(d) = OwnedDatagram::try_of(&d).filter(|_| q.try_reserve(1).is_ok()) {
                q.push(d);
            }
        }
    }

    fn now_ns(&self) -> u64 {
        nanos_since(self.start)
    }
}

fn nanos_since(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Counters of one end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EndStats {
    /// Datagrams delivered to the end's HCA.
    pub delivered: u64,
    /// Datagrams its HCA refused (a bad header or ICRC).
    pub refused: u64,
}

struct End {
    hca: Arc<SoftHca<HostPlatform>>,
    inbox: Arc<Inbox>,
    stats: Mutex<EndStats>,
}

/// The cable and its two ends (0 and 1). Dropping it detaches both HCAs.
pub struct PairWire {
    start: Instant,
    ends: [End; 2],
}

impl std::fmt::Debug for PairWire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PairWire")
            .field("end0", &self.stats(0))
            .field("end1", &self.stats(1))
            .finish_non_exhaustive()
    }
}

impl PairWire {
    /// Cables `a` (end 0) to `b` (end 1).
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER` when `a` and `b` are one HCA; a soft
    /// HCA's refusal of the link ([`SoftHca::attach_link`]: one is
    /// attached already). Nothing stays attached then.
    pub fn new(
        a: &Arc<SoftHca<HostPlatform>>,
        b: &Arc<SoftHca<HostPlatform>>,
    ) -> Result<Self, NtStatus> {
        if Arc::ptr_eq(a, b) {
            return Err(STATUS_INVALID_PARAMETER);
        }
        let start = Instant::now();
        let end = |hca: &Arc<SoftHca<HostPlatform>>| End {
            hca: Arc::clone(hca),
            inbox: Arc::default(),
            stats: Mutex::new(EndStats::default()),
        };
        let ends = [end(a), end(b)];
        let tx = |from: usize| -> Arc<dyn Link> {
            let to = &ends[1 - from];
            Arc::new(Tx {
                start,
                peer: Arc::clone(&to.inbox),
                peer_hca: Arc::clone(&to.hca),
            })
        };
        a.attach_link(tx(0))?;
        if let Err(st) = b.attach_link(tx(1)) {
            a.detach_link();
            return Err(st);
        }
        Ok(Self { start, ends })
    }

    /// Delivers what waits for end `end` (0 or 1) and fires its soft HCA
    /// timers that are due, on this thread (the receive path and the DPCs
    /// it leads to run here); the datagrams delivered. Another end number
    /// does nothing.
    pub fn poll(&self, end: usize) -> usize {
        let Some(e) = self.ends.get(end) else {
            return 0;
        };
        let batch = std::mem::take(&mut *e.inbox.queue());
        let now = nanos_since(self.start);
        if batch.is_empty() && e.hca.next_deadline().is_none_or(|d| d > now) {
            return 0;
        }
        let (mut delivered, mut refused) = (0, 0);
        // A run of the data path (and the DPCs it leads to) per chunk, with
        // the timers due: a whole burst queued at once would outrun the
        // HCA's receive buffers and its GSI's MAD queue, as a NIC's ring
        // would.
        for chunk in batch.chunks(DRIVE_EVERY) {
            for d in chunk {
                match e.hca.receive_queued(&d.view()) {
                    Ok(()) => delivered += 1,
                    Err(_) => refused += 1,
                }
            }
            let _ = e.hca.advance_clock(nanos_since(self.start));
        }
        if batch.is_empty() {
            let _ = e.hca.advance_clock(nanos_since(self.start));
        }
        let mut s = lock(&e.stats);
        s.delivered += delivered;
        s.refused += refused;
        batch.len()
    }

    /// End `end`'s counters (zero for another number).
    #[must_use]
    pub fn stats(&self, end: usize) -> EndStats {
        self.ends
            .get(end)
            .map_or_else(EndStats::default, |e| *lock(&e.stats))
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Drop for PairWire {
    fn drop(&mut self) {
        for e in &self.ends {
            e.hca.detach_link();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use irpverbs_soft::SoftConfig;

    use super::*;
    use crate::{Engine, HostDevice, HostDeviceConfig};

    fn device(last: u8) -> Arc<HostDevice> {
        HostDevice::new(HostDeviceConfig {
            engine: Engine::Inline,
            soft: SoftConfig {
                ip: IpAddr::V4(Ipv4Addr::new(10, 0, 8, last)),
                node_guid: 0x0200_00FF_FE00_0800 | u64::from(last),
                ..SoftConfig::default()
            },
            ..HostDeviceConfig::default()
        })
        .expect("host device")
    }

    /// One HCA at both ends is refused; an HCA cabled already is refused
    /// and the other end is left detached (it can be cabled again); a
    /// dropped cable frees both; polling an end with nothing queued, or
    /// one that does not exist, delivers nothing.
    #[test]
    fn cabling_is_checked_and_undone() {
        let (a, b, c) = (device(1), device(2), device(3));
        assert_eq!(
            PairWire::new(a.soft(), a.soft()).err(),
            Some(STATUS_INVALID_PARAMETER)
        );
        let ab = PairWire::new(a.soft(), b.soft()).expect("cable");
        assert!(PairWire::new(c.soft(), b.soft()).is_err(), "b is cabled");
        assert_eq!((ab.poll(0), ab.poll(1), ab.poll(2)), (0, 0, 0));
        assert_eq!(ab.stats(0), EndStats::default());
        drop(ab);
        let cb = PairWire::new(c.soft(), b.soft()).expect("c was left free");
        drop(cb);
        for d in [a, b, c] {
            d.unload();
        }
    }
}
