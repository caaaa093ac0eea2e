//! Host devices on the soft HCA's seeded, simulated wire
//! ([`irpverbs_soft::sim`]), on one virtual clock.
//!
//! A [`SimNet`] moves its own virtual clock: it delivers the earliest
//! datagram or fires the earliest soft HCA timer. A [`HostDevice`] has
//! timers of its own on its platform's clock (the connection manager's
//! retransmissions, time wait). [`SimHosts`] merges the two: each step
//! runs the earliest of the net's next event and every device's next
//! platform timer, after moving every clock (the wire's, each platform's
//! [`TimerClock::Virtual`]) to its time. So a MAD a CM timer retransmits
//! leaves at the timer's time, a MAD that arrives is processed at its
//! arrival time, and seconds of retries take microseconds.
//!
//! Deterministic (a seed replays a run exactly) when everything runs on the
//! stepping thread: devices with [`crate::Engine::Inline`] and
//! [`crate::UserDoorbells::Direct`], requests issued with
//! [`crate::CmSubmitter::submit`] or synchronous calls that complete at
//! once, and nothing else stepping the clocks. The DPCs run inline, on the
//! stepping thread (at DISPATCH_LEVEL, below which it returns).

use std::sync::Arc;
use std::time::Duration;

use irpverbs_abi::{NtStatus, STATUS_INVALID_PARAMETER};
use irpverbs_soft::sim::{SimConfig, SimNet, SimStats};

use crate::HostDevice;
use crate::platform::TimerClock;

/// Host devices cabled to one simulated wire, and the loop that runs them
/// on one virtual clock. Dropping it takes the soft HCAs off the wire.
pub struct SimHosts {
    net: SimNet<crate::platform::HostPlatform>,
    devices: Vec<Arc<HostDevice>>,
}

impl std::fmt::Debug for SimHosts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimHosts")
            .field("net", &self.net)
            .field("devices", &self.devices.len())
            .finish()
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl SimHosts {
    /// Cables the devices' soft HCAs to a simulated wire configured by
    /// `config`, and brings every clock to the latest platform's time.
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER` for no device, or a device whose
    /// platform is not on [`TimerClock::Virtual`]; a soft HCA's refusal of
    /// the link (one attached already). Nothing stays attached then.
    pub fn new(config: SimConfig, devices: &[&Arc<HostDevice>]) -> Result<Self, NtStatus> {
        let Some(first) = devices.first() else {
            return Err(STATUS_INVALID_PARAMETER);
        };
        if devices
            .iter()
            .any(|d| d.platform().clock() != TimerClock::Virtual)
        {
            return Err(STATUS_INVALID_PARAMETER);
        }
        let mut this = Self {
            net: SimNet::new(first.platform(), config),
            devices: Vec::new(),
        };
        for d in devices {
            // On error, `this` (dropped) detaches those attached so far.
            this.net.attach(d.soft())?;
            this.devices.push(Arc::clone(d));
        }
        let start = devices
            .iter()
            .map(|d| nanos(d.platform().now()))
            .max()
            .unwrap_or(0);
        this.move_clocks(start);
        Ok(this)
    }

    /// The virtual time, in ns.
    #[must_use]
    pub fn now(&self) -> u64 {
        self.net.now()
    }

    /// The wire's counters.
    #[must_use]
    pub fn stats(&self) -> SimStats {
        self.net.stats()
    }

    /// Changes what the wire does from now on (e.g. heals it; the seed
    /// stays); datagrams on their way keep their fate.
    pub fn set_config(&self, config: SimConfig) {
        self.net.set_config(config);
    }

    /// Moves the wire's and every platform's clock to `t` (platform timers
    /// due by then fire, in deadline order, on this thread).
    fn move_clocks(&self, t: u64) {
        self.net.set_now(t);
        for d in &self.devices {
            // Even by zero: a timer due now fires.
            let now = nanos(d.platform().now());
            d.platform()
                .advance(Duration::from_nanos(t.saturating_sub(now)));
        }
    }

    /// The earliest platform timer of the devices (absolute ns).
    fn next_platform_timer(&self) -> Option<u64> {
        self.devices
            .iter()
            .filter_map(|d| d.platform().next_timer_deadline())
            .map(nanos)
            .min()
    }

    /// Runs one event: the earliest of the devices' platform timers (ties:
    /// the timers first), the wire's next datagram and the soft HCAs'
    /// timers, with every clock moved to its time. False when there is
    /// none, or the next is after `limit` (the clocks then stay).
    pub fn step(&self, limit: u64) -> bool {
        let platform = self.next_platform_timer();
        let net = self.net.next_event();
        let t = match (platform, net) {
            (Some(p), Some(n)) => p.min(n),
            (Some(t), None) | (None, Some(t)) => t,
            (None, None) => return false,
        };
        if t > limit {
            return false;
        }
        let t = t.max(self.now());
        // The platforms' clocks (and timers due) first: what the event
        // makes the driver do happens at its time. A net event due at the
        // same time runs in the next step.
        self.move_clocks(t);
        if platform.is_none_or(|p| p > t) {
            self.net.step(t);
        }
        true
    }

    /// Runs events until `done()` (asked before each step) or until none
    /// is left before `limit`; returns `done()`'s last answer.
    pub fn run_until(&self, limit: u64, mut done: impl FnMut() -> bool) -> bool {
        loop {
            if done() {
                return true;
            }
            if !self.step(limit) {
                return done();
            }
        }
    }

    /// Runs every event due by `limit`; the events run. The clocks end at
    /// `limit` at least (time passes even with nothing to do).
    pub fn run(&self, limit: u64) -> usize {
        let mut n = 0;
        while self.step(limit) {
            n += 1;
        }
        if limit > self.now() {
            self.move_clocks(limit);
        }
        n
    }
}

impl Drop for SimHosts {
    fn drop(&mut self) {
        for d in &self.devices {
            d.soft().detach_link();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use irpverbs_soft::SoftConfig;

    use super::*;
    use crate::platform::HostConfig;
    use crate::{Engine, HostDeviceConfig};

    fn device(last: u8, clock: TimerClock) -> Arc<HostDevice> {
        HostDevice::new(HostDeviceConfig {
            engine: Engine::Inline,
            platform: HostConfig {
                clock,
                ..HostConfig::default()
            },
            soft: SoftConfig {
                ip: IpAddr::V4(Ipv4Addr::new(10, 0, 9, last)),
                node_guid: 0x0200_00FF_FE00_0900 | u64::from(last),
                ..SoftConfig::default()
            },
            ..HostDeviceConfig::default()
        })
        .expect("host device")
    }

    /// A real-clock device is refused; platform timers and the wire share
    /// one clock: a platform timer fires at its deadline, the clocks move
    /// to it and to `run`'s limit, and a timer past the limit waits.
    #[test]
    fn platform_timers_run_on_the_wire_clock() {
        let real = device(1, TimerClock::Real);
        assert_eq!(
            SimHosts::new(SimConfig::default(), &[&real]).err(),
            Some(STATUS_INVALID_PARAMETER)
        );
        real.unload();
        let d = device(2, TimerClock::Virtual);
        d.platform().advance(Duration::from_nanos(500));
        let net = SimHosts::new(SimConfig::default(), &[&d]).unwrap();
        assert_eq!(net.now(), 500, "the wire starts at the platform's time");
        let fired = Arc::new(std::sync::Mutex::new(Vec::new()));
        let timer = {
            let (fired, p) = (Arc::clone(&fired), d.platform().clone());
            d.platform()
                .new_timer(move || fired.lock().unwrap().push(nanos(p.now())))
        };
        timer.set(Duration::from_nanos(1_000), None);
        assert_eq!(
            d.platform().next_timer_deadline(),
            Some(Duration::from_nanos(1_500))
        );
        assert!(!net.step(1_499), "not due by the limit");
        assert_eq!(net.now(), 500);
        assert!(net.step(u64::MAX));
        assert_eq!(*fired.lock().unwrap(), vec![1_500]);
        assert_eq!(net.now(), 1_500, "the wire's clock moved with it");
        timer.set(Duration::from_nanos(10_000), None);
        assert_eq!(net.run(5_000), 0);
        assert_eq!(net.now(), 5_000);
        assert_eq!(nanos(d.platform().now()), 5_000);
        assert!(fired.lock().unwrap().len() == 1);
        assert!(net.run_until(u64::MAX, || fired.lock().unwrap().len() == 2));
        assert_eq!(fired.lock().unwrap()[1], 11_500);
        // A cancelled timer is no event.
        timer.set(Duration::from_nanos(10), None);
        timer.cancel();
        assert_eq!(d.platform().next_timer_deadline(), None);
        assert!(!net.step(u64::MAX));
        drop(net);
        d.unload();
    }
}
