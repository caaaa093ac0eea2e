//! The connection manager in the device: one [`irpverbs_cm::Engine`] per
//! [`Device`], under the device lock.
//!
//! - **Receive.** The HCA announces MADs its GSI (QP1) received with
//!   [`Event::Mad`](crate::Event::Mad); the DPC takes them
//!   ([`Hca::poll_mad`]) and feeds each to [`Engine::receive`] right there,
//!   at DISPATCH_LEVEL, with no thread switch. A MAD the engine's parser
//!   refuses is counted ([`DeviceStats::cm_mads_malformed`]).
//! - **Send.** After every engine call the device drains
//!   [`Engine::poll_transmit`] under its lock and, with the lock released,
//!   hands each MAD to [`Hca::send_mad`] (a UD send from QP1 with Q_Key
//!   0x80010000). A MAD the HCA refuses is counted
//!   ([`DeviceStats::cm_send_failures`]) and left to the CM's
//!   retransmission, as a MAD lost on the wire.
//! - **Time.** The platform glue gives the device a way to arm a one-shot
//!   platform timer ([`Device::set_cm_timer`]: on Windows a KTIMER and
//!   KDPC, in host mode a `HostTimer`), whose DPC calls
//!   [`Device::cm_timer`]. The device arms it at
//!   [`Engine::next_deadline`] whenever that changes, on the clock of
//!   [`Platform::now_ns`]. Retransmissions, giving up and time wait run
//!   from there.
//!
//! [`DeviceStats::cm_mads_malformed`]: crate::DeviceStats::cm_mads_malformed
//! [`DeviceStats::cm_send_failures`]: crate::DeviceStats::cm_send_failures

use alloc::sync::Arc;
use alloc::vec::Vec;

use irpverbs_cm::{Config, Engine, MadAddr, Transmit};

use crate::device::State;
use crate::hca::{MadIn, MadOut};
use crate::{Device, Hca, Platform, SpinLock};

/// Arms the CM's platform timer to fire at an absolute time (ns on the
/// clock of [`Platform::now_ns`]), replacing any earlier arming. Called
/// with no driver lock held, at IRQL <= DISPATCH_LEVEL.
pub type CmTimerArm = Arc<dyn Fn(u64) + Send + Sync>;

/// The device's CM (part of the state under the device lock).
pub(crate) struct Cm {
    pub(crate) engine: Engine,
    /// The timer's arming function, once the glue gave one.
    arm: Option<CmTimerArm>,
    /// The deadline the timer is armed for.
    armed: Option<u64>,
}

/// What to do after releasing the device lock: send MADs, arm the timer.
#[must_use]
pub(crate) struct CmFlush {
    transmits: Vec<Transmit>,
    arm: Option<(CmTimerArm, u64)>,
}

impl Cm {
    /// The CM of a CA whose node GUID is `ca_guid`; communication IDs
    /// rotated by `seed`.
    pub(crate) fn new(ca_guid: u64, seed: u32) -> Self {
        let mut cfg = Config::new(ca_guid);
        cfg.id_seed = seed;
        Self {
            engine: Engine::new(cfg),
            arm: None,
            armed: None,
        }
    }

    /// The engine's transmits, and the timer to arm if its deadline
    /// changed.
    pub(crate) fn take(&mut self) -> CmFlush {
        let mut transmits = Vec::new();
        while let Some(t) = self.engine.poll_transmit() {
            transmits.push(t);
        }
        let next = self.engine.next_deadline();
        let arm = match (&self.arm, next) {
            (Some(f), Some(d)) if self.armed != Some(d) => {
                self.armed = Some(d);
                Some((Arc::clone(f), d))
            }
            _ => None,
        };
        CmFlush { transmits, arm }
    }
}

/// Where a received MAD came from, as the engine takes it.
pub(crate) fn mad_addr(m: &MadIn) -> MadAddr {
    MadAddr {
        port_num: m.port,
        pkey_index: m.pkey_index,
        sgid_index: m.dgid_index,
        gid: m.sgid,
        lid: 0,
        qpn: m.src_qpn,
        sl: 0,
        traffic_class: m.traffic_class,
        hop_limit: m.hop_limit,
        flow_label: m.flow_label,
    }
}

/// A transmit as the HCA's GSI sends it.
pub(crate) fn mad_out(t: &Transmit) -> MadOut {
    MadOut {
        port: t.dest.port_num,
        sgid_index: t.dest.sgid_index,
        dgid: t.dest.gid,
        dest_qpn: t.dest.qpn,
        traffic_class: t.dest.traffic_class,
        flow_label: t.dest.flow_label,
        hop_limit: if t.dest.hop_limit == 0 {
            64
        } else {
            t.dest.hop_limit
        },
        mad: t.mad,
    }
}

impl<P: Platform, H: Hca> Device<P, H> {
    /// Takes every MAD the HCA's GSI holds into the CM (the DPC, on
    /// [`crate::Event::Mad`], under the device lock).
    pub(crate) fn cm_receive(&self, s: &mut State<P::Request>) {
        let now = self.platform.now_ns();
        while let Some(m) = self.hca.poll_mad() {
            s.stats.mads_received += 1;
            if s.cm.engine.receive(now, &mad_addr(&m), &m.mad).is_err() {
                s.stats.cm_mads_malformed += 1;
            }
        }
    }

    /// Sends the MADs and arms the timer `flush` holds (no lock held).
    pub(crate) fn cm_flush(&self, flush: CmFlush) {
        let mut failed = 0u64;
        for t in &flush.transmits {
            if self.hca.send_mad(&mad_out(t)).is_err() {
                failed += 1;
            }
        }
        if failed != 0 {
            self.state.lock(|s| s.stats.cm_send_failures += failed);
        }
        if let Some((arm, deadline)) = flush.arm {
            arm(deadline);
        }
    }

    /// Gives the device the function that arms its CM timer (see
    /// [`CmTimerArm`]); the platform timer's DPC must call
    /// [`Device::cm_timer`]. Arms it at once if the CM waits for time.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    pub fn set_cm_timer(&self, arm: CmTimerArm) {
        let flush = self.state.lock(|s| {
            s.cm.arm = Some(arm);
            s.cm.armed = None;
            s.cm.take()
        });
        self.cm_flush(flush);
    }

    /// Forgets the timer's arming function (before the driver unloads and
    /// cancels the timer): the CM's timers stop.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    pub fn stop_cm_timer(&self) {
        self.state.lock(|s| {
            s.cm.arm = None;
            s.cm.armed = None;
        });
    }

    /// The CM timer's DPC: runs the CM's timers due now (retransmissions,
    /// timeouts, time wait), sends what they produced and re-arms the
    /// timer at the next deadline.
    ///
    /// IRQL: DISPATCH_LEVEL (any IRQL <= DISPATCH_LEVEL).
    pub fn cm_timer(&self) {
        let now = self.platform.now_ns();
        let flush = self.state.lock(|s| {
            s.cm.armed = None;
            s.cm.engine.on_timer(now);
            s.cm.take()
        });
        self.cm_flush(flush);
    }

    /// The CM engine's counters.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    pub fn cm_stats(&self) -> irpverbs_cm::Stats {
        self.state.lock(|s| s.cm.engine.stats())
    }
}
