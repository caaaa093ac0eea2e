//! The in-process loopback wire: soft HCAs of one process exchanging real
//! RoCEv2 datagrams (serialized, ICRC and all) with no socket.
//!
//! Unlike the in-process [`Fabric`](irpverbs_soft::Fabric), which hands
//! frames from HCA to HCA, this wire carries what a UDP socket would: each
//! packet is emitted as bytes by the sender and parsed and checked by the
//! receiver, and the receiver's timers run on the monotonic clock. A
//! delivery thread ("the cable") takes the datagrams in order and delivers
//! them, and fires the HCAs' timers at their deadlines.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use irpverbs_abi::NtStatus;
use irpverbs_soft::SoftHca;
use irpverbs_soft::link::{Link, OwnedDatagram, TxBatch};

use crate::platform::HostPlatform;

#[derive(Default)]
struct State {
    queue: VecDeque<OwnedDatagram>,
    hcas: Vec<Arc<SoftHca<HostPlatform>>>,
    /// GIDs no datagram reaches ([`LoopWire::set_reachable`]).
    cut: Vec<[u8; 16]>,
    stop: bool,
    delivered: u64,
    unroutable: u64,
}

struct Cable {
    start: Instant,
    state: Mutex<State>,
    wake: Condvar,
}

impl Cable {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The cable's thread: delivers datagrams in order, fires timers.
    fn run(&self) {
        let mut deadline: Option<u64> = None;
        loop {
            let (batch, hcas) = {
                let mut s = self.state();
                loop {
                    if s.stop {
                        return;
                    }
                    let due = deadline.is_some_and(|d| d <= self.now());
                    if !s.queue.is_empty() || due {
                        break;
                    }
                    let wait = deadline.map_or(Duration::from_millis(100), |d| {
                        Duration::from_nanos(d.saturating_sub(self.now()))
                    });
                    s = self
                        .wake
                        .wait_timeout(s, wait)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
                (
                    s.queue.drain(..).collect::<Vec<_>>(),
                    (s.hcas.clone(), s.cut.clone()),
                )
            };
            let (hcas, cut) = hcas;
            let (mut delivered, mut unroutable) = (0, 0);
            for d in &batch {
                let to = hcas.iter().find(|h| h.owns_gid(&d.dgid));
                match to.filter(|_| !cut.contains(&d.dgid)) {
                    Some(h) => {
                        delivered += 1;
                        let _ = h.receive(&d.view());
                    }
                    None => unroutable += 1,
                }
            }
            let now = self.now();
            deadline = hcas.iter().filter_map(|h| h.advance_clock(now)).min();
            let mut s = self.state();
            s.delivered += delivered;
            s.unroutable += unroutable;
        }
    }
}

impl Link for Cable {
    fn transmit(&self, batch: &TxBatch) {
        let mut s = self.state();
        // A datagram the cable has no memory for is lost (RC retransmits).
        for d in batch.iter() {
            if let Some(d) = OwnedDatagram::try_of(&d).filter(|_| s.queue.try_reserve(1).is_ok()) {
                s.queue.push_back(d);
            }
        }
        drop(s);
        self.wake.notify_one();
    }

    fn now_ns(&self) -> u64 {
        self.now()
    }
}

impl Cable {
    fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// Counters of the loopback wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoopWireStats {
    /// Datagrams delivered to an HCA.
    pub delivered: u64,
    /// Datagrams for a GID no attached HCA has, or one made unreachable.
    pub unroutable: u64,
}

/// The loopback wire and its delivery thread. [`LoopWire::stop`] (or
/// dropping it) detaches the HCAs and joins the thread.
pub struct LoopWire {
    cable: Arc<Cable>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for LoopWire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoopWire")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl LoopWire {
    /// A wire with no HCAs; its thread starts now.
    ///
    /// # Panics
    /// When the thread cannot be spawned.
    #[must_use]
    pub fn start() -> Self {
        let cable = Arc::new(Cable {
            start: Instant::now(),
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
        });
        let c = Arc::clone(&cable);
        let thread = std::thread::Builder::new()
            .name("irpverbs-loopwire".into())
            .spawn(move || c.run())
            .expect("spawn the loopback wire's thread");
        Self {
            cable,
            thread: Some(thread),
        }
    }

    /// Cables `hca` to the wire.
    ///
    /// # Errors
    /// As [`SoftHca::attach_link`].
    pub fn attach(&self, hca: &Arc<SoftHca<HostPlatform>>) -> Result<(), NtStatus> {
        let link: Arc<dyn Link> = self.cable.clone();
        hca.attach_link(link)?;
        self.cable.state().hcas.push(Arc::clone(hca));
        Ok(())
    }

    /// Makes `gid` unreachable (`reachable` false: datagrams to it are
    /// lost from now on and counted as unroutable, as when the route to
    /// that address goes away) or reachable again.
    pub fn set_reachable(&self, gid: [u8; 16], reachable: bool) {
        let mut s = self.cable.state();
        s.cut.retain(|g| *g != gid);
        if !reachable {
            s.cut.push(gid);
        }
    }

    /// The wire's counters.
    #[must_use]
    pub fn stats(&self) -> LoopWireStats {
        let s = self.cable.state();
        LoopWireStats {
            delivered: s.delivered,
            unroutable: s.unroutable,
        }
    }

    /// Detaches every HCA and stops the thread.
    pub fn stop(mut self) -> LoopWireStats {
        self.shut_down();
        self.stats()
    }

    fn shut_down(&mut self) {
        let hcas = {
            let mut s = self.cable.state();
            s.stop = true;
            std::mem::take(&mut s.hcas)
        };
        self.cable.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        for h in hcas {
            h.detach_link();
        }
    }
}

impl Drop for LoopWire {
    fn drop(&mut self) {
        self.shut_down();
    }
}
