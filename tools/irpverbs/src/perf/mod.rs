//! `irpverbs perf`: perftest's tests (send/write/read/atomic, latency and
//! bandwidth) between two endpoints in one process over the soft HCA.
//!
//! The endpoints are two files (two "processes") on one host device, their
//! QPs connected to each other (RoCEv2 loopback through the soft HCA). The
//! speed path is the real one: WQEs written into the mapped rings, doorbells,
//! CQEs polled from the CQ rings — no IOCTL per message. Latency follows
//! perftest: send and write report half the round trip of a ping-pong, read
//! and atomic the whole round trip of one operation; bandwidth keeps
//! `tx_depth` operations in flight and signals every `cq_mod`-th.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use irpverbs_abi::*;
use irpverbs_ring::SendWr;
use irpverbs_soft::SoftConfig;
use irpverbs_verbs::{
    Client, CompChannel, Cq, IntoClient, IoctlResult, Qp, RTS_PSN, RecvWr, Srq, qp_request,
    rts_steps,
};

use irpverbs_host::Backend;
use irpverbs_host::device::{Engine, HostDevice, HostDeviceConfig, UserDoorbells};
use irpverbs_host::platform::{HostConfig, VerifierConfig};

mod remote;
pub use remote::{OOB_PORT, RemoteConfig, RemoteRun, connect, serve};

/// A perftest test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Test {
    /// `ib_send_lat`.
    SendLat,
    /// `ib_send_bw`.
    SendBw,
    /// `ib_write_lat`.
    WriteLat,
    /// `ib_write_bw`.
    WriteBw,
    /// `ib_read_lat`.
    ReadLat,
    /// `ib_read_bw`.
    ReadBw,
    /// `ib_atomic_lat` (fetch and add).
    AtomicLat,
    /// `ib_atomic_bw` (fetch and add).
    AtomicBw,
}

impl Test {
    /// Every test.
    pub const ALL: [Test; 8] = [
        Test::SendLat,
        Test::SendBw,
        Test::WriteLat,
        Test::WriteBw,
        Test::ReadLat,
        Test::ReadBw,
        Test::AtomicLat,
        Test::AtomicBw,
    ];

    /// perftest's name.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Test::SendLat => "send_lat",
            Test::SendBw => "send_bw",
            Test::WriteLat => "write_lat",
            Test::WriteBw => "write_bw",
            Test::ReadLat => "read_lat",
            Test::ReadBw => "read_bw",
            Test::AtomicLat => "atomic_lat",
            Test::AtomicBw => "atomic_bw",
        }
    }

    /// Parses perftest's name.
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == s)
    }

    /// Latency (else bandwidth).
    #[must_use]
    pub fn is_latency(self) -> bool {
        matches!(
            self,
            Test::SendLat | Test::WriteLat | Test::ReadLat | Test::AtomicLat
        )
    }

    /// An atomic test (8-byte messages only).
    #[must_use]
    pub fn is_atomic(self) -> bool {
        matches!(self, Test::AtomicLat | Test::AtomicBw)
    }
}

/// How to run a test.
#[derive(Clone, Debug)]
pub struct PerfConfig {
    /// The test.
    pub test: Test,
    /// Message sizes (one run per size).
    pub sizes: Vec<u64>,
    /// Iterations per size.
    pub iters: u64,
    /// QP pairs (bandwidth tests spread messages over them).
    pub qps: u32,
    /// Send data inline up to this many bytes (perftest's default: 236
    /// for SEND latency, 220 for WRITE latency, none otherwise).
    pub inline: u32,
    /// Completion by CQ events (a blocked thread woken through the CQ
    /// notify IOCTL) instead of busy polling.
    pub events: bool,
    /// With `events`: wait through a completion channel, as perftest's
    /// `-e` does (`ibv_req_notify_cq`, `ibv_get_cq_event`,
    /// `ibv_ack_cq_events`; each side's CQs are created on its own
    /// channel) instead of one `IOCTL_IV_CQ_NOTIFY` per wait.
    pub use_channel: bool,
    /// Operations in flight (bandwidth).
    pub tx_depth: u32,
    /// Signal every `cq_mod`-th operation (bandwidth, and the SEND and
    /// WRITE ping-pongs, whose sender polls its send CQ only then, as
    /// perftest's latency tests do).
    pub cq_mod: u32,
    /// Work requests per `post_send` call (bandwidth; perftest's
    /// `--post_list`): lists of this many are posted with one doorbell,
    /// each when there is room for all of it in the `tx_depth` window.
    pub post_list: u32,
    /// Receive work requests per `post_recv` call (SEND bandwidth, the
    /// receiving side; perftest's `--recv_post_list`): completed receives
    /// are reposted in lists of this many, with one doorbell each.
    pub recv_post_list: u32,
    /// Path MTU (`IV_MTU_*`).
    pub mtu: u32,
    /// The RC QPs' local ACK timeout, as the QP attribute takes it
    /// (4.096 µs × 2^`qp_timeout`; perftest's `-u`, default 14, 67 ms).
    /// Each endpoint uses its own: a server does not adopt its client's.
    pub qp_timeout: u8,
    /// Where the soft HCA's firmware runs.
    pub engine: Engine,
    /// The HCA the driver runs over: the soft HCA, or the model HCA (a
    /// mini-driver over the PCI seam, the soft HCA as its device's engine).
    pub backend: Backend,
    /// How the endpoints ring their doorbells: direct calls, or their
    /// files' doorbell pages, scanned by the device's doorbell thread (what
    /// a user-mode ULP does on Windows).
    pub doorbells: UserDoorbells,
    /// With page doorbells: how long the doorbell thread polls after the
    /// last doorbell before it sleeps (`None`: the device's default; zero:
    /// it sleeps after every quiet scan, so each doorbell is an
    /// `IOCTL_IV_RING_DOORBELLS`, what a ULP meets when the HCA is idle).
    pub doorbell_poll_window: Option<Duration>,
    /// Run the verifier (off by default: perftest measures the fast path).
    pub verifier: bool,
    /// Latency ping-pong on one thread (the driver's own cost, without the
    /// cross-core cache traffic of two polling threads).
    pub one_thread: bool,
    /// SEND bandwidth: each side's QPs take their receives from one SRQ
    /// (perftest's `--use_srq`).
    pub use_srq: bool,
    /// WRITE bandwidth: RDMA WRITE with immediate, each consuming a
    /// receive on the peer, which polls and reposts them as the SEND
    /// bandwidth server does (perftest's `--write_with_imm`).
    pub write_with_imm: bool,
}

impl PerfConfig {
    /// perftest's defaults for `test`: 2-byte messages (8 for atomics),
    /// 1000 latency / 5000 bandwidth iterations, tx depth 128.
    #[must_use]
    pub fn new(test: Test) -> Self {
        Self {
            test,
            sizes: vec![if test.is_atomic() { 8 } else { 2 }],
            iters: if test.is_latency() { 1000 } else { 5000 },
            qps: 1,
            inline: match test {
                Test::SendLat => 236,
                Test::WriteLat => 220,
                _ => 0,
            },
            events: false,
            use_channel: false,
            tx_depth: 128,
            cq_mod: 32,
            post_list: 1,
            recv_post_list: 1,
            mtu: IV_MTU_4096,
            qp_timeout: 14,
            engine: Engine::Inline,
            backend: Backend::Soft,
            doorbells: UserDoorbells::Direct,
            doorbell_poll_window: None,
            verifier: false,
            one_thread: false,
            use_srq: false,
            write_with_imm: false,
        }
    }

    /// Refuses options that do not apply to the test.
    ///
    /// # Errors
    /// Which option, and where it applies.
    pub fn check(&self) -> Result<(), String> {
        if self.use_channel && !self.events {
            return Err("--use-channel waits for CQ events: with --events".into());
        }
        if self.use_srq && self.test != Test::SendBw {
            return Err("--use_srq applies to send_bw".into());
        }
        if self.write_with_imm && self.test != Test::WriteBw {
            return Err("--write_with_imm applies to write_bw".into());
        }
        if self.test.is_atomic() && self.sizes.iter().any(|&s| s != 8) {
            return Err(format!("{} moves 8 bytes: -s 8", self.test.name()));
        }
        if self.test == Test::WriteLat && self.sizes.contains(&0) {
            // perftest's write_lat polls each message's last byte too.
            return Err("write_lat polls the last byte of each message: sizes from 1".into());
        }
        Ok(())
    }

    /// Whether the test's messages consume receives on the peer (which
    /// then polls and reposts them).
    #[must_use]
    pub fn receives(&self) -> bool {
        self.test == Test::SendBw || (self.test == Test::WriteBw && self.write_with_imm)
    }

    /// The sweep `ib_*` runs with `-a`: 2 bytes to 8 MiB.
    #[must_use]
    pub fn sweep() -> Vec<u64> {
        (1..=23).map(|k| 1u64 << k).collect()
    }
}

/// A latency result (microseconds).
#[derive(Clone, Debug)]
pub struct Latency {
    /// Message size.
    pub bytes: u64,
    /// Iterations.
    pub iters: u64,
    /// Minimum.
    pub min: f64,
    /// Maximum.
    pub max: f64,
    /// Median (perftest's "typical").
    pub typical: f64,
    /// Mean.
    pub avg: f64,
    /// Standard deviation.
    pub stdev: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
}

/// A bandwidth result.
#[derive(Clone, Debug)]
pub struct Bandwidth {
    /// Message size.
    pub bytes: u64,
    /// Iterations.
    pub iters: u64,
    /// Best interval, MiB/s.
    pub peak_mib: f64,
    /// Whole run, MiB/s.
    pub avg_mib: f64,
    /// Messages per second, millions.
    pub mpps: f64,
}

/// One size's result.
#[derive(Clone, Debug)]
pub enum Report {
    /// Latency test.
    Latency(Latency),
    /// Bandwidth test.
    Bandwidth(Bandwidth),
}

fn ok<T>(what: &str, r: IoctlResult<T>) -> Result<T, String> {
    r.map_err(|s| format!("{what}: {}", status_name(s)))
}

/// An endpoint: a file with a PD, a registered buffer, send and receive
/// CQs and QPs.
struct Side<'c> {
    c: &'c Client,
    /// The registered buffer (owned here; reached through `mem`).
    buf: Vec<u8>,
    /// `buf`'s memory as the HCA writes it, behind Rust's back.
    mem: Registered,
    mr: IvRegMrOut,
    scq: Cq<'c>,
    rcq: Cq<'c>,
    qps: Vec<Qp<'c>>,
    /// The SRQ the QPs take their receives from (`--use_srq`).
    srq: Option<Srq<'c>>,
    /// The completion channel both CQs are on (`--use-channel`); declared
    /// after them, so it is destroyed after them.
    channel: Option<CompChannel<'c>>,
    /// CQ events taken from `channel`.
    channel_events: AtomicU64,
    /// Receives on the SRQ not completed yet: a QP's reset between sizes
    /// leaves them there (they are the SRQ's, not the QP's).
    srq_posted: AtomicU64,
    pd: IvHandle,
    /// The device whose UDP wire the busy-poll loops poll when a CQ has
    /// nothing ([`Side::idle`]); none in process.
    wire: Option<&'c HostDevice>,
    /// Busy-poll loops yield the processor when their CQ has nothing
    /// ([`yields_when_idle`]).
    yield_idle: bool,
    /// The QPs' local ACK timeout ([`PerfConfig::qp_timeout`]).
    qp_timeout: u8,
}

/// Whether a busy-poll loop of a test configured as `cfg` yields the
/// processor when it finds nothing: when the soft HCA's work runs on a
/// thread of its own (the firmware thread, or the doorbell thread that
/// scans doorbell pages) and the spinning threads (one poller per side of
/// a two-thread ping-pong, one otherwise, and the HCA's) outnumber the
/// processors. A thread that spins there holds the processor the HCA needs
/// to answer it until the scheduler preempts it, milliseconds later (on 2
/// processors a two-thread SEND ping-pong with the firmware on its own
/// thread took 35 us one way, with the doorbell page 2 ms). Hardware needs
/// no processor of the host's: perftest spins.
fn yields_when_idle(cfg: &PerfConfig, cpus: usize) -> bool {
    let hca = usize::from(cfg.engine == Engine::Thread)
        + usize::from(cfg.doorbells == UserDoorbells::Page);
    let pollers = if cfg.test.is_latency() && !cfg.one_thread {
        2
    } else {
        1
    };
    hca > 0 && pollers + hca > cpus
}

impl<'c> Side<'c> {
    fn new(c: &'c Client, cfg: &PerfConfig, bytes: usize) -> Result<Self, String> {
        let caps = ok("query_device", c.query_device())?;
        if cfg.inline > caps.max_inline_data {
            return Err(format!(
                "inline size {} is above the device's max_inline_data ({})",
                cfg.inline, caps.max_inline_data
            ));
        }
        let pd = ok("alloc_pd", c.alloc_pd())?.pd;
        // Written, as perftest writes its buffers before registering them:
        // a zeroed allocation the process never wrote is the kernel's one
        // shared zero page, which would make every read of it a cache hit.
        // (Not 1: the first byte a WRITE ping-pong waits for.)
        let mut buf = vec![0xA5u8; bytes.max(64)];
        let mem = Registered::new(&mut buf);
        let mr = ok(
            "reg_mr",
            c.reg_mr(pd, mem.addr(), buf.len() as u64, IV_ACCESS_ALL),
        )?;
        let depth = (cfg.tx_depth * 2).max(64);
        let channel = if cfg.use_channel {
            Some(ok("create_comp_channel", c.create_comp_channel())?)
        } else {
            None
        };
        let cq_in = IvCreateCqIn {
            cqe: depth * cfg.qps * 2,
            channel: channel.as_ref().map_or(0, CompChannel::handle),
            ..Default::default()
        };
        let scq = ok("create_cq", c.new_cq(&cq_in))?;
        let rcq = ok("create_cq", c.new_cq(&cq_in))?;
        let srq = if cfg.use_srq {
            let srq_in = IvCreateSrqIn {
                pd,
                max_wr: depth * cfg.qps,
                max_sge: 1,
                ..Default::default()
            };
            Some(ok("create_srq", c.new_srq(&srq_in))?)
        } else {
            None
        };
        let mut qps = Vec::new();
        for _ in 0..cfg.qps {
            let mut req = qp_request(
                pd,
                scq.handle(),
                srq.as_ref().map_or(0, Srq::handle),
                IV_QPT_RC,
            );
            req.recv_cq = rcq.handle();
            req.cap.max_send_wr = depth;
            if srq.is_none() {
                req.cap.max_recv_wr = depth;
            }
            req.cap.max_inline_data = cfg.inline;
            qps.push(ok("create_qp", c.new_qp(&req))?);
        }
        Ok(Self {
            c,
            buf,
            mem,
            mr,
            scq,
            rcq,
            qps,
            srq,
            srq_posted: AtomicU64::new(0),
            channel,
            channel_events: AtomicU64::new(0),
            pd,
            wire: None,
            yield_idle: yields_when_idle(
                cfg,
                std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
            ),
            qp_timeout: cfg.qp_timeout,
        })
    }

    /// What a busy-poll loop does when its CQ (or buffer) has nothing yet:
    /// busy-poll receive on the device's UDP wire
    /// ([`HostDevice::poll_wire`]), so that the spinning thread delivers the
    /// datagram it waits for instead of waking the wire's receive thread.
    fn idle(&self) {
        match self.wire {
            Some(dev) => {
                dev.poll_wire();
            }
            None if self.yield_idle => std::thread::yield_now(),
            None => std::hint::spin_loop(),
        }
    }

    /// [`Side::poll`] for a busy-poll loop: [`Side::idle`] when nothing
    /// completed.
    fn poll_busy(&self, cq: &Cq<'_>, out: &mut [IvCqe]) -> Result<usize, String> {
        let n = Self::poll(cq, out)?;
        if n == 0 {
            self.idle();
        }
        Ok(n)
    }

    fn sge(&self, offset: u64, len: u64) -> IvSge {
        IvSge {
            addr: self.mem.addr() + offset,
            length: len as u32,
            lkey: self.mr.lkey,
        }
    }

    fn addr(&self) -> u64 {
        self.mem.addr()
    }

    /// This endpoint's buffer, as its peer names it.
    fn remote(&self) -> Remote {
        Remote {
            addr: self.addr(),
            rkey: self.mr.rkey,
            len: self.buf.len() as u64,
        }
    }

    /// Connects QP `i` to QP `dest.qpn` on `dest.gid` with the configured
    /// MTU, read depth and ACK timeout; it sends from PSN `psn` and expects `dest.psn`.
    fn connect(&self, i: usize, psn: u32, dest: &QpInfo, mtu: u32) -> Result<(), String> {
        for (mask, mut attr) in rts_steps(IV_QPT_RC, dest.qpn, dest.gid) {
            if attr.qp_state == IV_QPS_INIT {
                attr.qp_access_flags =
                    IV_ACCESS_REMOTE_WRITE | IV_ACCESS_REMOTE_READ | IV_ACCESS_REMOTE_ATOMIC;
            }
            if attr.qp_state == IV_QPS_RTR {
                attr.path_mtu = mtu;
                attr.max_dest_rd_atomic = 16;
                attr.rq_psn = dest.psn;
            }
            if attr.qp_state == IV_QPS_RTS {
                attr.max_rd_atomic = 16;
                attr.sq_psn = psn;
                attr.timeout = self.qp_timeout;
            }
            ok("modify_qp", self.qps[i].modify(mask, &attr))?;
        }
        Ok(())
    }

    /// Moves QP `i` to ERR (flushing what it holds), drains both CQs of the
    /// flushed completions, and back to RESET.
    fn restart(&self, i: usize) -> Result<(), String> {
        let state = |s| IvQpAttr {
            qp_state: s,
            ..IvQpAttr::default()
        };
        ok(
            "modify_qp",
            self.qps[i].modify(IV_QP_STATE, &state(IV_QPS_ERR)),
        )?;
        let mut cqes = [IvCqe::default(); 64];
        for cq in [&self.scq, &self.rcq] {
            loop {
                let n = cq.poll(&mut cqes).map_err(|_| "corrupt CQ".to_string())?;
                if n == 0 {
                    break;
                }
                if std::ptr::eq(cq, &self.rcq) && self.srq.is_some() {
                    // An SRQ receive the QP had begun: flushed.
                    sub_posted(&self.srq_posted, n as u64);
                }
            }
        }
        ok(
            "modify_qp",
            self.qps[i].modify(IV_QP_STATE, &state(IV_QPS_RESET)),
        )
    }

    fn poll(cq: &Cq<'_>, out: &mut [IvCqe]) -> Result<usize, String> {
        let n = cq.poll(out).map_err(|_| "corrupt CQ".to_string())?;
        if let Some(bad) = out[..n].iter().find(|c| c.status != IV_WC_SUCCESS) {
            return Err(format!(
                "completion {} failed: {}",
                bad.wr_id,
                irpverbs_verbs::speed::wc_status_name(bad.status)
            ));
        }
        Ok(n)
    }

    fn teardown(self) {
        let Side {
            c,
            buf,
            mem: _,
            mr,
            scq,
            rcq,
            qps,
            srq,
            srq_posted: _,
            channel,
            channel_events: _,
            pd,
            wire: _,
            yield_idle: _,
            qp_timeout: _,
        } = self;
        drop(qps);
        drop(srq);
        drop(scq);
        drop(rcq);
        drop(channel);
        let _ = c.dereg_mr(mr.mr);
        let _ = c.dealloc_pd(pd);
        drop(buf);
    }
}

/// `n` receives on an SRQ completed (one thread updates the count).
fn sub_posted(posted: &AtomicU64, n: u64) {
    let left = posted.load(Ordering::Relaxed).saturating_sub(n);
    posted.store(left, Ordering::Relaxed);
}

/// The latency figures of `samples` (microseconds) of `bytes`-byte
/// messages.
#[must_use]
pub fn latency_stats(samples: Vec<f64>, bytes: u64) -> Latency {
    stats(samples, bytes)
}

fn stats(mut samples: Vec<f64>, bytes: u64) -> Latency {
    samples.sort_by(f64::total_cmp);
    let n = samples.len().max(1);
    let at = |q: f64| samples[((n as f64 * q) as usize).min(n - 1)];
    let avg = samples.iter().sum::<f64>() / n as f64;
    let var = samples.iter().map(|s| (s - avg) * (s - avg)).sum::<f64>() / n as f64;
    Latency {
        bytes,
        iters: samples.len() as u64,
        min: samples.first().copied().unwrap_or(0.0),
        max: samples.last().copied().unwrap_or(0.0),
        typical: at(0.5),
        avg,
        stdev: var.sqrt(),
        p99: at(0.99),
        p999: at(0.999),
    }
}

/// Runs `cfg` and returns one report per size.
///
/// # Errors
/// A verb that failed, or a completion with an error status.
pub fn run(cfg: &PerfConfig) -> Result<Vec<Report>, String> {
    run_with_stats(cfg).map(|(reports, _, _)| reports)
}

/// [`run`], the soft HCA's counters at the end of it, and the CQ events
/// both sides took from their completion channels.
fn run_with_stats(
    cfg: &PerfConfig,
) -> Result<(Vec<Report>, irpverbs_soft::SoftStats, u64), String> {
    cfg.check()?;
    let dev = new_device(cfg, SoftConfig::default())?;
    let open = || {
        dev.open(FILE_READ_ACCESS | FILE_WRITE_ACCESS)
            .map(|f| f.into_client())
    };
    let cc = open().map_err(|s| format!("open: {}", status_name(s)))?;
    let sc = open().map_err(|s| format!("open: {}", status_name(s)))?;
    let client = Side::new(&cc, cfg, buffer_bytes(cfg))?;
    let server = Side::new(&sc, cfg, buffer_bytes(cfg))?;
    let gid = ok("query_gid", cc.query_gid(1, 0))?;
    let mut out = Vec::new();
    for (n, &size) in cfg.sizes.iter().enumerate() {
        // Start every size from empty queues: receives sized for the last
        // size must not meet this one's messages.
        connect_pair(&client, &server, gid, cfg.mtu, n > 0)?;
        let r = if cfg.test.is_latency() {
            Report::Latency(latency(cfg, &client, &server, size)?)
        } else {
            Report::Bandwidth(bandwidth(cfg, &client, &server, size)?)
        };
        out.push(r);
    }
    let stats = dev.soft().stats();
    let channel_events = [&client, &server]
        .iter()
        .map(|s| s.channel_events.load(Ordering::Relaxed))
        .sum();
    client.teardown();
    server.teardown();
    drop(cc);
    drop(sc);
    dev.quiesce(Duration::from_secs(10))?;
    dev.unload();
    Ok((out, stats, channel_events))
}

/// A host device for `cfg` (verifier and engine) with the soft HCA `soft`.
fn new_device(cfg: &PerfConfig, soft: SoftConfig) -> Result<Arc<HostDevice>, String> {
    HostDevice::new(HostDeviceConfig {
        platform: HostConfig {
            verifier: VerifierConfig {
                enabled: cfg.verifier,
                fail_pool: None,
                ..VerifierConfig::default()
            },
            ..HostConfig::default()
        },
        engine: cfg.engine,
        user_doorbells: cfg.doorbells,
        doorbell_poll_window: cfg.doorbell_poll_window,
        soft,
        power_managed_queue: false,
        cleanup_pin_timeout: None,
        no_process_notify: false,
        device: irpverbs_core::DeviceConfig::default(),
        backend: cfg.backend,
    })
    .map_err(|s| format!("device: {}", status_name(s)))
}

/// An endpoint's buffer: two messages of the largest size (latency), or
/// `tx_depth` of them (bandwidth), at most 1 GiB.
fn buffer_bytes(cfg: &PerfConfig) -> usize {
    let max = cfg.sizes.iter().copied().max().unwrap_or(8) as usize;
    let n = if cfg.test.is_latency() {
        2
    } else {
        cfg.tx_depth as usize
    };
    max.saturating_mul(n).min(1 << 30)
}

/// Connects the QPs of two endpoints of one device to each other (both
/// directions from [`RTS_PSN`]).
fn connect_pair(
    client: &Side<'_>,
    server: &Side<'_>,
    gid: [u8; 16],
    mtu: u32,
    restart: bool,
) -> Result<(), String> {
    let n = client.qps.len();
    let psns = vec![RTS_PSN; n];
    let infos =
        |side: &Side<'_>| -> Vec<QpInfo> { (0..n).map(|i| side.info(i, RTS_PSN, gid)).collect() };
    client.connect_all(&psns, &infos(server), mtu, restart)?;
    server.connect_all(&psns, &infos(client), mtu, restart)
}

/// What an endpoint knows of its peer's registered buffer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Remote {
    addr: u64,
    rkey: u32,
    len: u64,
}

/// What perftest exchanges per QP: QPN, PSN, GID, and the buffer's rkey
/// and address.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct QpInfo {
    qpn: u32,
    psn: u32,
    gid: [u8; 16],
    remote: Remote,
}

impl Side<'_> {
    /// QP `i` as its peer sees it, sending from `psn`.
    fn info(&self, i: usize, psn: u32, gid: [u8; 16]) -> QpInfo {
        QpInfo {
            qpn: self.qps[i].qpn(),
            psn,
            gid,
            remote: self.remote(),
        }
    }

    /// Connects every QP to its peer's (the same index), a size's restart
    /// first when `restart`.
    fn connect_all(
        &self,
        psns: &[u32],
        peers: &[QpInfo],
        mtu: u32,
        restart: bool,
    ) -> Result<(), String> {
        for (i, (peer, &psn)) in peers.iter().zip(psns).enumerate() {
            if restart {
                self.restart(i)?;
            }
            self.connect(i, psn, peer, mtu)?;
        }
        Ok(())
    }
}

fn send_wr<'a>(
    cfg: &PerfConfig,
    side: &'a Side<'_>,
    opcode: u8,
    size: u64,
    sge: &'a [IvSge],
    peer: Remote,
) -> SendWr<'a> {
    let inline = matches!(
        opcode,
        IV_WR_SEND | IV_WR_RDMA_WRITE | IV_WR_RDMA_WRITE_WITH_IMM
    ) && size <= u64::from(cfg.inline);
    // Inline, the bytes the gather list names, copied at the post.
    let at = sge.first().map_or(0, |g| (g.addr - side.addr()) as usize);
    SendWr {
        wr_id: 0,
        opcode,
        flags: IV_SEND_SIGNALED,
        sges: sge,
        inline: inline.then(|| &side.buf[at..at + size as usize]),
        remote_addr: peer.addr,
        rkey: peer.rkey,
        compare_add: 1,
        imm_or_inv: 0x1234_5678,
        ..SendWr::default()
    }
}

/// Blocks until `cq` has a completion: arm, then pend `IOCTL_IV_CQ_NOTIFY`
/// (a synchronous DeviceIoControl on the endpoint's file), as an
/// event-driven ULP does.
fn wait_event(side: &Side<'_>, cq: &Cq<'_>, out: &mut [IvCqe]) -> Result<usize, String> {
    loop {
        let n = Side::poll(cq, out)?;
        if n > 0 {
            return Ok(n);
        }
        if let Some(ch) = &side.channel {
            // perftest's -e: arm (an arming with completions already
            // unpolled fires at once), take the event, acknowledge it.
            cq.req_notify(false);
            let ev = ok("get_cq_event", ch.get_cq_event())?;
            if ev.cq != cq.handle() {
                return Err(format!("a CQ event for CQ {:#x}, never armed", ev.cq));
            }
            ok("ack_cq_events", side.c.ack_cq_events(ev.cq, 1))?;
            side.channel_events.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let arm = IvCqNotifyIn {
            cq: cq.handle(),
            arm: IV_NOTIFY_NEXT,
            reserved: 0,
        };
        let (st, _) = side.c.raw(
            IOCTL_IV_CQ_NOTIFY,
            zerocopy::IntoBytes::as_bytes(&arm),
            size_of::<IvCqEventOut>(),
        );
        if !nt_success(st) {
            return Err(format!("cq notify: {}", status_name(st)));
        }
    }
}

/// Posts the 16 receives a SEND ping-pong endpoint keeps ahead, into its
/// buffer at `at`.
fn post_ahead(side: &Side<'_>, at: u64, size: u64) -> Result<(), String> {
    for k in 0..16 {
        side.qps[0]
            .post_recv(k, &[side.sge(at, size.max(1))])
            .map_err(|e| format!("post_recv: {e:?}"))?;
    }
    Ok(())
}

/// The answering side of a SEND or WRITE ping-pong (perftest's server; in
/// process, a thread of its own): for each of `cfg.iters` messages it waits
/// for the message (a receive completion, polled or with CQ events, or the
/// last byte of a WRITE into its buffer at 0) and answers with the same
/// operation into the peer's buffer at `size`. Returns early, without an
/// error, once `stop` is set.
fn pong(
    cfg: &PerfConfig,
    me: &Side<'_>,
    peer: Remote,
    size: u64,
    stop: &AtomicBool,
) -> Result<(), String> {
    let send = cfg.test == Test::SendLat;
    let qp = &me.qps[0];
    let mut cqes = [IvCqe::default(); 16];
    let sge = [me.sge(size, size)];
    for i in 0..cfg.iters {
        if send {
            let mut got = 0;
            while got == 0 {
                if stop.load(Ordering::Relaxed) {
                    return Ok(());
                }
                got = if cfg.events {
                    wait_event(me, &me.rcq, &mut cqes)?
                } else {
                    me.poll_busy(&me.rcq, &mut cqes)?
                };
            }
            qp.post_recv(i + 16, &[me.sge(0, size.max(1))])
                .map_err(|e| format!("post_recv: {e:?}"))?;
        } else {
            // WRITE: poll the last byte of the incoming message.
            let want = (i as u8).wrapping_add(1);
            while me.buf_byte(size - 1) != want {
                if stop.load(Ordering::Relaxed) {
                    return Ok(());
                }
                me.idle();
            }
        }
        let op = if send { IV_WR_SEND } else { IV_WR_RDMA_WRITE };
        let mut wr = send_wr(cfg, me, op, size, &sge, peer);
        wr.remote_addr = peer.addr + size;
        let signaled = signals(cfg, i);
        wr.flags = if signaled { IV_SEND_SIGNALED } else { 0 };
        if !send {
            me.set_byte(2 * size - 1, (i as u8).wrapping_add(1));
        }
        qp.post_send(&wr).map_err(|e| format!("post_send: {e:?}"))?;
        if signaled {
            while me.poll_busy(&me.scq, &mut cqes)? == 0 {}
        }
    }
    Ok(())
}

/// Whether ping-pong send `i` (of `cfg.iters`) is signaled: every
/// `cq_mod`-th and the last, as perftest's latency tests signal theirs (a
/// send queue of unsignaled sends is retired by the ACKs its signaled ones
/// and the HCA's ACK requests bring).
fn signals(cfg: &PerfConfig, i: u64) -> bool {
    let cq_mod = u64::from(cfg.cq_mod.max(1));
    (i + 1) % cq_mod == 0 || i + 1 == cfg.iters
}

/// The measuring side of a latency test (perftest's client): SEND or
/// WRITE ping-pong against [`pong`] (a sample is half the round trip), or
/// READ or atomic round trips (a sample is the whole round trip).
fn ping(
    cfg: &PerfConfig,
    me: &Side<'_>,
    peer: Remote,
    size: u64,
    samples: &mut Vec<f64>,
) -> Result<(), String> {
    let qp = &me.qps[0];
    let mut cqes = [IvCqe::default(); 16];
    let sge = [me.sge(0, size)];
    match cfg.test {
        Test::SendLat | Test::WriteLat => {
            let send = cfg.test == Test::SendLat;
            let op = if send { IV_WR_SEND } else { IV_WR_RDMA_WRITE };
            for i in 0..cfg.iters {
                let want = (i as u8).wrapping_add(1);
                if !send {
                    me.set_byte(size - 1, want);
                }
                let signaled = signals(cfg, i);
                let mut wr = send_wr(cfg, me, op, size, &sge, peer);
                wr.flags = if signaled { IV_SEND_SIGNALED } else { 0 };
                let t0 = Instant::now();
                qp.post_send(&wr).map_err(|e| format!("post_send: {e:?}"))?;
                if signaled {
                    while me.poll_busy(&me.scq, &mut cqes)? == 0 {}
                }
                await_message(me, send, 2 * size - 1, want, &mut cqes)?;
                samples.push(t0.elapsed().as_secs_f64() * 1e6 / 2.0);
                if send {
                    qp.post_recv(i + 16, &[me.sge(size, size.max(1))])
                        .map_err(|e| format!("post_recv: {e:?}"))?;
                }
            }
        }
        Test::ReadLat | Test::AtomicLat => {
            let op = if cfg.test == Test::ReadLat {
                IV_WR_RDMA_READ
            } else {
                IV_WR_ATOMIC_FETCH_AND_ADD
            };
            for _ in 0..cfg.iters {
                let t0 = Instant::now();
                qp.post_send(&send_wr(cfg, me, op, size, &sge, peer))
                    .map_err(|e| format!("post_send: {e:?}"))?;
                if cfg.events {
                    wait_event(me, &me.scq, &mut cqes)?;
                } else {
                    while me.poll_busy(&me.scq, &mut cqes)? == 0 {}
                }
                samples.push(t0.elapsed().as_secs_f64() * 1e6);
            }
        }
        _ => unreachable!("latency tests only"),
    }
    Ok(())
}

/// Waits for ping-pong message `want` at `me`: a receive completion (SEND),
/// or the byte at `at` of its buffer turning `want` (WRITE).
fn await_message(
    me: &Side<'_>,
    send: bool,
    at: u64,
    want: u8,
    cqes: &mut [IvCqe],
) -> Result<(), String> {
    if send {
        while me.poll_busy(&me.rcq, cqes)? == 0 {}
    } else {
        while me.buf_byte(at) != want {
            me.idle();
        }
    }
    Ok(())
}

fn latency(
    cfg: &PerfConfig,
    client: &Side<'_>,
    server: &Side<'_>,
    size: u64,
) -> Result<Latency, String> {
    let mut samples = Vec::with_capacity(cfg.iters as usize);
    match cfg.test {
        Test::SendLat | Test::WriteLat if cfg.one_thread && !cfg.events => {
            ping_pong_one_thread(cfg, client, server, size, &mut samples)?;
        }
        Test::SendLat | Test::WriteLat => {
            if cfg.test == Test::SendLat {
                post_ahead(server, 0, size)?;
                post_ahead(client, size, size)?;
            }
            // The server answers on its own thread, polling (or blocked on
            // CQ events with --events), like the other process.
            let stop = AtomicBool::new(false);
            std::thread::scope(|scope| -> Result<(), String> {
                let responder = scope.spawn(|| pong(cfg, server, client.remote(), size, &stop));
                let measured = ping(cfg, client, server.remote(), size, &mut samples);
                stop.store(true, Ordering::Relaxed);
                responder
                    .join()
                    .map_err(|_| "responder panicked".to_string())??;
                measured
            })?;
        }
        _ => ping(cfg, client, server.remote(), size, &mut samples)?,
    }
    Ok(stats(samples, size))
}

/// Send or write ping-pong driven from one thread: post, poll the peer's
/// side, answer, poll ours.
fn ping_pong_one_thread(
    cfg: &PerfConfig,
    client: &Side<'_>,
    server: &Side<'_>,
    size: u64,
    samples: &mut Vec<f64>,
) -> Result<(), String> {
    let send = cfg.test == Test::SendLat;
    let (cq0, sq0) = (&client.qps[0], &server.qps[0]);
    let mut cqes = [IvCqe::default(); 16];
    if send {
        post_ahead(server, 0, size)?;
        post_ahead(client, size, size)?;
    }
    let (csge, ssge) = ([client.sge(0, size)], [server.sge(size, size)]);
    let op = if send { IV_WR_SEND } else { IV_WR_RDMA_WRITE };
    for i in 0..cfg.iters {
        let want = (i as u8).wrapping_add(1);
        if !send {
            client.set_byte(size - 1, want);
            server.set_byte(2 * size - 1, want);
        }
        let signaled = signals(cfg, i);
        let flags = if signaled { IV_SEND_SIGNALED } else { 0 };
        let mut wr = send_wr(cfg, client, op, size, &csge, server.remote());
        wr.flags = flags;
        let t0 = Instant::now();
        cq0.post_send(&wr)
            .map_err(|e| format!("post_send: {e:?}"))?;
        await_message(server, send, size - 1, want, &mut cqes)?;
        let mut wr = send_wr(cfg, server, op, size, &ssge, client.remote());
        wr.remote_addr = client.addr() + size;
        wr.flags = flags;
        sq0.post_send(&wr)
            .map_err(|e| format!("post_send: {e:?}"))?;
        await_message(client, send, 2 * size - 1, want, &mut cqes)?;
        samples.push(t0.elapsed().as_secs_f64() * 1e6 / 2.0);
        if signaled {
            while Side::poll(&client.scq, &mut cqes)? == 0 {}
            while Side::poll(&server.scq, &mut cqes)? == 0 {}
        }
        if send {
            sq0.post_recv(i + 16, &[server.sge(0, size.max(1))])
                .map_err(|e| format!("post_recv: {e:?}"))?;
            cq0.post_recv(i + 16, &[client.sge(size, size.max(1))])
                .map_err(|e| format!("post_recv: {e:?}"))?;
        }
    }
    Ok(())
}

/// CQ-event wake-up latency: a thread blocked in `IOCTL_IV_CQ_NOTIFY` on the
/// server's receive CQ, a SEND from the client; the time from the post to
/// the blocked thread running again (microseconds).
///
/// # Errors
/// A verb that failed.
pub fn event_wakeup(iters: u64, engine: Engine) -> Result<Latency, String> {
    let cfg = PerfConfig {
        iters,
        engine,
        events: true,
        ..PerfConfig::new(Test::SendLat)
    };
    let dev = HostDevice::new(HostDeviceConfig {
        engine,
        ..HostDeviceConfig::default()
    })
    .map_err(|s| format!("device: {}", status_name(s)))?;
    let open = || {
        dev.open(FILE_READ_ACCESS | FILE_WRITE_ACCESS)
            .map(|f| f.into_client())
    };
    let cc = open().map_err(|s| format!("open: {}", status_name(s)))?;
    let sc = open().map_err(|s| format!("open: {}", status_name(s)))?;
    let client = Side::new(&cc, &cfg, 64)?;
    let server = Side::new(&sc, &cfg, 64)?;
    let gid = ok("query_gid", cc.query_gid(1, 0))?;
    connect_pair(&client, &server, gid, cfg.mtu, false)?;
    let origin = Instant::now();
    let posted_at = std::sync::atomic::AtomicU64::new(0);
    let blocked = AtomicBool::new(false);
    let mut samples = Vec::with_capacity(iters as usize);
    std::thread::scope(|scope| -> Result<(), String> {
        let waiter = scope.spawn(|| -> Result<Vec<f64>, String> {
            let mut got = Vec::with_capacity(iters as usize);
            let mut cqes = [IvCqe::default(); 4];
            for i in 0..iters {
                server.qps[0]
                    .post_recv(i, &[server.sge(0, 8)])
                    .map_err(|e| format!("post_recv: {e:?}"))?;
                let arm = IvCqNotifyIn {
                    cq: server.rcq.handle(),
                    arm: IV_NOTIFY_NEXT,
                    reserved: 0,
                };
                blocked.store(true, Ordering::SeqCst);
                let (st, _) = server.c.raw(
                    IOCTL_IV_CQ_NOTIFY,
                    zerocopy::IntoBytes::as_bytes(&arm),
                    size_of::<IvCqEventOut>(),
                );
                let woke = origin.elapsed().as_nanos() as u64;
                if !nt_success(st) {
                    return Err(format!("cq notify: {}", status_name(st)));
                }
                got.push((woke - posted_at.load(Ordering::SeqCst)) as f64 / 1e3);
                while Side::poll(&server.rcq, &mut cqes)? == 0 {}
            }
            Ok(got)
        });
        let mut cqes = [IvCqe::default(); 4];
        let sge = [client.sge(0, 8)];
        for _ in 0..iters {
            while !blocked.swap(false, Ordering::SeqCst) {
                std::thread::yield_now();
            }
            // Let the waiter get into its wait.
            std::thread::sleep(Duration::from_micros(200));
            posted_at.store(origin.elapsed().as_nanos() as u64, Ordering::SeqCst);
            client.qps[0]
                .post_send(&send_wr(
                    &cfg,
                    &client,
                    IV_WR_SEND,
                    8,
                    &sge,
                    server.remote(),
                ))
                .map_err(|e| format!("post_send: {e:?}"))?;
            while Side::poll(&client.scq, &mut cqes)? == 0 {}
        }
        samples = waiter.join().map_err(|_| "waiter panicked".to_string())??;
        Ok(())
    })?;
    client.teardown();
    server.teardown();
    drop(cc);
    drop(sc);
    dev.quiesce(Duration::from_secs(10))?;
    dev.unload();
    Ok(stats(samples, 8))
}

impl Side<'_> {
    fn buf_byte(&self, at: u64) -> u8 {
        self.mem.byte(at)
    }

    fn set_byte(&self, at: u64, v: u8) {
        self.mem.set_byte(at, v);
    }
}

/// A registered buffer's memory, which the HCA writes behind Rust's back:
/// a pointer taken once with `Vec::as_mut_ptr` (no reference to the
/// contents is made for it), and the length. Single bytes are read and
/// written volatile, bounds checked.
#[derive(Clone, Copy, Debug)]
struct Registered {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: `Registered` is an address and a length; the memory it names is
// the registered buffer, which outlives every `Side` method that reads or
// writes through it, and whose bytes are only read and written volatile
// (they are shared with the HCA, on other threads, as a device's memory).
#[allow(unsafe_code)]
unsafe impl Send for Registered {}
// SAFETY: as for `Send`.
#[allow(unsafe_code)]
unsafe impl Sync for Registered {}

impl Registered {
    fn new(buf: &mut Vec<u8>) -> Self {
        Self {
            ptr: std::ptr::NonNull::new(buf.as_mut_ptr()).unwrap_or(std::ptr::NonNull::dangling()),
            len: buf.len(),
        }
    }

    /// The address registered for the HCA.
    fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// The offset of byte `at`, which must be inside the buffer.
    fn index(&self, at: u64) -> usize {
        match usize::try_from(at) {
            Ok(i) if i < self.len => i,
            _ => panic!("byte {at} of a {}-byte buffer", self.len),
        }
    }

    fn byte(&self, at: u64) -> u8 {
        let p = self.ptr.as_ptr().wrapping_add(self.index(at));
        #[allow(unsafe_code)]
        // SAFETY: `p` is inside the live buffer (the index is checked);
        // volatile, since the HCA may write it concurrently.
        unsafe {
            p.read_volatile()
        }
    }

    fn set_byte(&self, at: u64, v: u8) {
        let p = self.ptr.as_ptr().wrapping_add(self.index(at));
        #[allow(unsafe_code)]
        // SAFETY: as in `byte`; the pointer came from `as_mut_ptr`, so it
        // may write.
        unsafe {
            p.write_volatile(v);
        }
    }
}

/// The receives of a SEND bandwidth test: `2 * tx_depth` per QP posted
/// ahead, each reposted on its QP as it completes, in lists of
/// `recv_post_list` with one doorbell per list.
struct Refill {
    next: Vec<u64>,
    /// Completed receives not reposted yet, per QP.
    owed: Vec<u64>,
    list: u64,
    size: u64,
    cqes: Vec<IvCqe>,
}

impl Refill {
    fn prime(cfg: &PerfConfig, side: &Side<'_>, size: u64) -> Result<Self, String> {
        let depth = u64::from(cfg.tx_depth) * 2;
        let mut r = Self {
            next: vec![0; side.qps.len()],
            owed: vec![0; side.qps.len()],
            list: u64::from(cfg.recv_post_list).clamp(1, depth.max(1)),
            size,
            cqes: vec![IvCqe::default(); 256],
        };
        if side.srq.is_some() {
            // One queue for every QP's receives (queue 0 here), sized for
            // the largest message of the run: topped up, since the last
            // size's receives are still on it.
            r.size = cfg.sizes.iter().copied().max().unwrap_or(size);
            let want = depth * side.qps.len() as u64;
            r.post(
                side,
                0,
                want.saturating_sub(side.srq_posted.load(Ordering::Relaxed)),
            )?;
        } else {
            for q in 0..side.qps.len() {
                r.post(side, q, depth)?;
            }
        }
        Ok(r)
    }

    /// Posts `n` receives on QP `q` (or the SRQ), in lists of at most 64.
    fn post(&mut self, side: &Side<'_>, q: usize, n: u64) -> Result<(), String> {
        let sge = [side.sge(0, self.size)];
        let mut left = n;
        while left > 0 {
            let k = left.min(64);
            let first = self.next[q];
            let r = if k == 1 {
                match &side.srq {
                    Some(srq) => srq.post_recv(first, &sge),
                    None => side.qps[q].post_recv(first, &sge),
                }
                .map_err(|e| format!("post_recv: {e:?}"))
            } else {
                // On the stack: the server's refill allocates nothing.
                let mut wrs = [RecvWr {
                    wr_id: 0,
                    sges: &sge,
                }; 64];
                let wrs = &mut wrs[..k as usize];
                for (wr, wr_id) in wrs.iter_mut().zip(first..) {
                    wr.wr_id = wr_id;
                }
                match &side.srq {
                    Some(srq) => srq.post_recv_list(wrs),
                    None => side.qps[q].post_recv_list(wrs),
                }
                .map_err(|(i, e)| format!("post_recv (list entry {i}): {e:?}"))
            };
            r?;
            if side.srq.is_some() {
                side.srq_posted.fetch_add(k, Ordering::Relaxed);
            }
            self.next[q] += k;
            left -= k;
        }
        Ok(())
    }

    /// Polls `side`'s receive CQ (busy-poll: [`Side::idle`] on nothing)
    /// and reposts what completed on the QP it completed on (as perftest's
    /// server does), once that QP is owed a whole list; how many completed.
    fn step(&mut self, side: &Side<'_>) -> Result<usize, String> {
        // Everything that completed, however many polls that takes: receives
        // left in the CQ are receives not reposted, and with several QPs
        // their senders would run out of them (RNR).
        let mut total = 0;
        loop {
            let n = side.poll_busy(&side.rcq, &mut self.cqes)?;
            for c in &self.cqes[..n] {
                let q = match side.qps.iter().position(|qp| qp.qpn() == c.qp_num) {
                    Some(_) if side.srq.is_some() => 0,
                    Some(q) => q,
                    None => return Err(format!("a receive completion of QP {:#x}", c.qp_num)),
                };
                if c.status != IV_WC_SUCCESS {
                    return Err(format!("a receive completed with status {}", c.status));
                }
                self.owed[q] += 1;
            }
            if side.srq.is_some() {
                sub_posted(&side.srq_posted, n as u64);
            }
            total += n;
            if n < self.cqes.len() {
                break;
            }
        }
        let n = total;
        for q in 0..self.owed.len() {
            if self.owed[q] >= self.list {
                let k = self.owed[q];
                self.owed[q] = 0;
                self.post(side, q, k)?;
            }
        }
        Ok(n)
    }
}

fn bw_opcode(cfg: &PerfConfig) -> u8 {
    match cfg.test {
        Test::SendBw => IV_WR_SEND,
        Test::WriteBw if cfg.write_with_imm => IV_WR_RDMA_WRITE_WITH_IMM,
        Test::WriteBw => IV_WR_RDMA_WRITE,
        Test::ReadBw => IV_WR_RDMA_READ,
        _ => IV_WR_ATOMIC_FETCH_AND_ADD,
    }
}

/// The posting side of a bandwidth test (perftest's client): keeps
/// `tx_depth` operations in flight on each QP, posted `post_list` at a
/// time (one doorbell per list), signals every `cq_mod`-th, until `iters`
/// are done; `between` runs after each poll of the send CQ
/// (in process, the server's receive refill).
fn bw_post(
    cfg: &PerfConfig,
    me: &Side<'_>,
    peer: Remote,
    size: u64,
    between: &mut dyn FnMut() -> Result<(), String>,
) -> Result<Bandwidth, String> {
    let op = bw_opcode(cfg);
    let iters = cfg.iters;
    let depth = u64::from(cfg.tx_depth);
    let cq_mod = u64::from(cfg.cq_mod.clamp(1, cfg.tx_depth));
    let nq = cfg.qps as usize;
    let mut cqes = vec![IvCqe::default(); 256];
    let slots = depth.max(1);
    let sges: Vec<[IvSge; 1]> = (0..slots)
        .map(|k| [me.sge((k * size) % me.buf.len() as u64, size)])
        .collect();
    // Each slot's WR built once (as perftest builds its WRs before the
    // loop); the loop sets what changes. Single posts reuse one WR per QP
    // (as perftest does), which stays in the cache: a slot's WR is touched
    // once per tx depth of messages, and its cache lines are gone by then.
    let slot_wrs: Vec<SendWr<'_>> = sges
        .iter()
        .map(|sge| send_wr(cfg, me, op, size, sge, peer))
        .collect();
    let inline = slot_wrs.first().is_some_and(|w| w.inline.is_some());
    let source = |slot: usize| -> (&[IvSge], Option<&[u8]>) {
        let sge = &sges[slot];
        let data = inline.then(|| {
            let at = (sge[0].addr - me.addr()) as usize;
            &me.buf[at..at + size as usize]
        });
        (sge, data)
    };
    let list = u64::from(cfg.post_list).clamp(1, depth.max(1));
    let mut wrs: Vec<SendWr<'_>> = Vec::with_capacity(list as usize);
    // Per QP, advanced by each WR without a division (perftest steps its
    // addresses the same way).
    #[derive(Clone)]
    struct Cursor<'w> {
        /// The WR of single posts.
        one: SendWr<'w>,
        /// WRs posted and completed.
        posted: u64,
        done: u64,
        /// The next of `slot_wrs`.
        slot: usize,
        /// The next offset in the peer's buffer.
        off: u64,
        /// WRs left until the next signaled one.
        until: u64,
    }
    let mut cursors = vec![
        Cursor {
            one: slot_wrs[0],
            posted: 0,
            done: 0,
            slot: 0,
            off: 0,
            until: cq_mod,
        };
        nq
    ];
    let per_qp = iters.div_ceil(nq as u64);
    let start = Instant::now();
    let mut last = start;
    let mut last_done = 0u64;
    let mut peak = 0f64;
    loop {
        let mut all = true;
        for (q, (qp, c)) in me.qps.iter().zip(cursors.iter_mut()).enumerate() {
            loop {
                let n = list.min(per_qp - c.posted);
                if n == 0 || c.posted - c.done + n > depth {
                    break;
                }
                wrs.clear();
                for k in c.posted..c.posted + n {
                    c.until -= 1;
                    let signaled = c.until == 0 || k + 1 == per_qp;
                    if c.until == 0 {
                        c.until = cq_mod;
                    }
                    // The fields that change are set last, on the WR the
                    // post reads (the QP's single-post WR, or the list's
                    // copy of the slot's): a WR copied after they were
                    // stored would read them back over different store
                    // boundaries, a store-forwarding stall per WR (`perf
                    // stat -e ls_bad_status2.stli_other`).
                    let wr = if n == 1 {
                        (c.one.sges, c.one.inline) = source(c.slot);
                        &mut c.one
                    } else {
                        wrs.push(slot_wrs[c.slot]);
                        let last = wrs.len() - 1;
                        &mut wrs[last]
                    };
                    wr.wr_id = (q as u64) << 48 | k;
                    wr.flags = if signaled { IV_SEND_SIGNALED } else { 0 };
                    wr.remote_addr = peer.addr + c.off;
                    if n == 1 {
                        qp.post_send(wr).map_err(|e| format!("post_send: {e:?}"))?;
                    }
                    c.slot = if c.slot + 1 == slot_wrs.len() {
                        0
                    } else {
                        c.slot + 1
                    };
                    c.off = if c.off + 2 * size > peer.len {
                        0
                    } else {
                        c.off + size
                    };
                }
                if n > 1 {
                    qp.post_send_list(&wrs)
                        .map_err(|(i, e)| format!("post_send (list entry {i}): {e:?}"))?;
                }
                c.posted += n;
            }
            all &= c.done >= per_qp;
        }
        if all {
            break;
        }
        let n = me.poll_busy(&me.scq, &mut cqes)?;
        for c in &cqes[..n] {
            if let Some(cursor) = cursors.get_mut((c.wr_id >> 48) as usize) {
                cursor.done = (c.wr_id & ((1 << 48) - 1)) + 1;
            }
        }
        between()?;
        let total: u64 = cursors.iter().map(|c| c.done).sum();
        if n > 0 && total - last_done >= depth {
            let now = Instant::now();
            let dt = (now - last).as_secs_f64();
            if dt > 0.0 {
                peak = peak.max((total - last_done) as f64 * size as f64 / dt);
            }
            last = now;
            last_done = total;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let total: u64 = cursors.iter().map(|c| c.done).sum();
    let avg = total as f64 * size as f64 / secs;
    Ok(Bandwidth {
        bytes: size,
        iters: total,
        peak_mib: peak.max(avg) / (1 << 20) as f64,
        avg_mib: avg / (1 << 20) as f64,
        mpps: total as f64 / secs / 1e6,
    })
}

fn bandwidth(
    cfg: &PerfConfig,
    client: &Side<'_>,
    server: &Side<'_>,
    size: u64,
) -> Result<Bandwidth, String> {
    if cfg.receives() {
        let mut refill = Refill::prime(cfg, server, size)?;
        bw_post(cfg, client, server.remote(), size, &mut || {
            refill.step(server).map(|_| ())
        })
    } else {
        bw_post(cfg, client, server.remote(), size, &mut || Ok(()))
    }
}

/// memcpy bandwidth of `size`-byte copies (MiB/s), measured like the WRITE
/// bandwidth test: one source and one destination buffer of `depth` slots.
#[must_use]
pub fn memcpy_mib(size: u64, iters: u64, depth: u64) -> f64 {
    let n = (size * depth) as usize;
    let src = vec![7u8; n];
    // Touch every destination page first: the registered buffers of the
    // WRITE test are touched before it is timed too.
    let mut dst = vec![1u8; n];
    dst.copy_from_slice(&src);
    let start = Instant::now();
    for k in 0..iters {
        let at = ((k % depth) * size) as usize;
        dst[at..at + size as usize].copy_from_slice(&src[at..at + size as usize]);
        std::hint::black_box(&mut dst);
    }
    iters as f64 * size as f64 / start.elapsed().as_secs_f64() / (1 << 20) as f64
}

/// Formats reports as perftest prints them.
#[must_use]
pub fn format(cfg: &PerfConfig, reports: &[Report]) -> String {
    let mut s = format_header(cfg);
    s.push_str(&format_table(cfg, reports));
    s
}

/// The banner perftest prints before a test's figures.
fn format_header(cfg: &PerfConfig) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "---------------------------------------------------------------------------------------\n \
         irpverbs perf {}{} | RC | qps {} | mtu {} | tx depth {} | post list {} | inline {} | {} | engine {:?} | doorbells {:?} | verifier {}\n\
         ---------------------------------------------------------------------------------------",
        cfg.test.name(),
        match (cfg.use_srq, cfg.write_with_imm) {
            (true, _) => " (SRQ)",
            (_, true) => " (with immediate)",
            _ => "",
        },
        cfg.qps,
        128u32 << cfg.mtu,
        cfg.tx_depth,
        cfg.post_list,
        cfg.inline,
        match (cfg.events, cfg.use_channel) {
            (true, true) => "events (completion channel)",
            (true, false) => "events",
            _ => "polling",
        },
        cfg.engine,
        cfg.doorbells,
        if cfg.verifier { "on" } else { "off" }
    );
    s
}

/// The figures: a column header and a line per size.
fn format_table(cfg: &PerfConfig, reports: &[Report]) -> String {
    let mut s = String::new();
    if cfg.test.is_latency() {
        let _ = writeln!(
            s,
            " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]"
        );
    } else {
        let _ = writeln!(
            s,
            " #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]"
        );
    }
    for r in reports {
        match r {
            Report::Latency(l) => {
                let _ = writeln!(
                    s,
                    " {:<6} {:<10}     {:<10.2}     {:<10.2}   {:<10.2}         {:<10.2}     {:<10.2}      {:<10.2}             {:<10.2}",
                    l.bytes, l.iters, l.min, l.max, l.typical, l.avg, l.stdev, l.p99, l.p999
                );
            }
            Report::Bandwidth(b) => {
                let _ = writeln!(
                    s,
                    " {:<10} {:<10}     {:<10.2}          {:<10.2}            {:<10.6}",
                    b.bytes, b.iters, b.peak_mib, b.avg_mib, b.mpps
                );
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(test: Test) -> PerfConfig {
        PerfConfig {
            iters: 200,
            tx_depth: 16,
            cq_mod: 4,
            sizes: vec![if test.is_atomic() { 8 } else { 64 }],
            ..PerfConfig::new(test)
        }
    }

    #[test]
    fn qp_timeout_reaches_the_connected_qps() {
        let dev = HostDevice::new(HostDeviceConfig::default()).unwrap();
        let open = || {
            dev.open(FILE_READ_ACCESS | FILE_WRITE_ACCESS)
                .unwrap()
                .into_client()
        };
        let (cc, sc) = (open(), open());
        let timeouts = [(20, 9), (14, 31)];
        for (client_timeout, server_timeout) in timeouts {
            let with = |qp_timeout| PerfConfig {
                qp_timeout,
                ..PerfConfig::new(Test::WriteBw)
            };
            let client = Side::new(&cc, &with(client_timeout), 64).unwrap();
            let server = Side::new(&sc, &with(server_timeout), 64).unwrap();
            let gid = cc.query_gid(1, 0).unwrap();
            connect_pair(&client, &server, gid, IV_MTU_1024, false).unwrap();
            assert_eq!(client.qps[0].query().unwrap().attr.timeout, client_timeout);
            assert_eq!(server.qps[0].query().unwrap().attr.timeout, server_timeout);
            client.teardown();
            server.teardown();
        }
        drop((cc, sc));
        dev.unload();
    }

    #[test]
    fn every_test_runs_and_reports() {
        for test in Test::ALL {
            let cfg = small(test);
            let r = run(&cfg).unwrap_or_else(|e| panic!("{}: {e}", test.name()));
            assert_eq!(r.len(), 1);
            match &r[0] {
                Report::Latency(l) => {
                    assert_eq!(l.iters, 200);
                    assert!(
                        l.min <= l.typical && l.typical <= l.p99 && l.p99 <= l.max,
                        "{l:?}"
                    );
                }
                Report::Bandwidth(b) => {
                    assert!(b.iters >= 200, "{b:?}");
                    assert!(b.avg_mib > 0.0 && b.mpps > 0.0);
                }
            }
            assert!(format(&cfg, &r).contains(test.name()));
        }
    }

    /// Pollers yield only when they and the HCA's own thread outnumber the
    /// processors, and never when the HCA runs on the polling threads.
    #[test]
    fn busy_polls_yield_only_to_an_hca_thread_short_of_processors() {
        let with = |test, engine, doorbells, one_thread| PerfConfig {
            engine,
            doorbells,
            one_thread,
            ..small(test)
        };
        let (inline, thread) = (Engine::Inline, Engine::Thread);
        let (direct, page) = (UserDoorbells::Direct, UserDoorbells::Page);
        // The HCA on the posting thread: nobody to yield to.
        for cpus in [1, 2, 64] {
            assert!(!yields_when_idle(
                &with(Test::SendLat, inline, direct, false),
                cpus
            ));
            assert!(!yields_when_idle(
                &with(Test::SendBw, inline, direct, false),
                cpus
            ));
        }
        // Two pollers and the firmware thread (or the doorbell thread).
        for hca in [(thread, direct), (inline, page)] {
            let lat = with(Test::SendLat, hca.0, hca.1, false);
            assert!(yields_when_idle(&lat, 2));
            assert!(!yields_when_idle(&lat, 3));
            // One poller and the HCA's thread fit on two processors.
            let bw = with(Test::SendBw, hca.0, hca.1, false);
            assert!(yields_when_idle(&bw, 1));
            assert!(!yields_when_idle(&bw, 2));
            let one = with(Test::SendLat, hca.0, hca.1, true);
            assert!(!yields_when_idle(&one, 2));
        }
        // Both HCA threads and two pollers.
        let both = with(Test::WriteLat, thread, page, false);
        assert!(yields_when_idle(&both, 3));
        assert!(!yields_when_idle(&both, 4));
    }

    #[test]
    fn size_sweeps_start_each_size_from_empty_queues() {
        for test in [Test::SendBw, Test::SendLat, Test::WriteLat] {
            let cfg = PerfConfig {
                sizes: vec![64, 4096, 256, 65536],
                ..small(test)
            };
            let r = run(&cfg).unwrap_or_else(|e| panic!("{}: {e}", test.name()));
            assert_eq!(r.len(), 4);
        }
    }

    #[test]
    fn bandwidth_over_several_qps_threaded_engine_and_verifier() {
        let cfg = PerfConfig {
            qps: 3,
            engine: Engine::Thread,
            verifier: true,
            sizes: vec![4096, 65536],
            ..small(Test::WriteBw)
        };
        let r = run(&cfg).unwrap();
        assert_eq!(r.len(), 2);
        let cfg = PerfConfig {
            qps: 2,
            inline: 64,
            ..small(Test::SendBw)
        };
        run(&cfg).unwrap();
    }

    /// SEND bandwidth over several QPs whose receives complete faster than
    /// one poll takes them (four QPs of 128 in flight, a poll of 256): the
    /// server reposts every receive on the QP it completed on, and no
    /// sender ever runs out of receives (no RNR NAK, every message on the
    /// fast path).
    #[test]
    fn send_bandwidth_over_several_qps_never_runs_out_of_receives() {
        let cfg = PerfConfig {
            qps: 4,
            iters: 20_000,
            sizes: vec![8],
            ..PerfConfig::new(Test::SendBw)
        };
        let (r, stats, _) = run_with_stats(&cfg).unwrap();
        assert!(matches!(&r[0], Report::Bandwidth(b) if b.iters == 20_000));
        assert_eq!(stats.rnr_naks, 0, "{stats:?}");
        assert_eq!(stats.fast_path_wqes, 20_000, "{stats:?}");
    }

    /// `--use_srq`: four QPs' receives on one SRQ, reposted as they
    /// complete, over three sizes (the SRQ keeps the last size's receives
    /// across the QPs' resets: topped up, not overfilled), every message
    /// on the fast path with none short of a receive; in lists too.
    #[test]
    fn send_bandwidth_on_an_srq() {
        for post_list in [1, 8] {
            let cfg = PerfConfig {
                qps: 4,
                iters: 8_000,
                sizes: vec![8, 5000, 64],
                use_srq: true,
                post_list,
                recv_post_list: post_list,
                ..PerfConfig::new(Test::SendBw)
            };
            let (r, stats, _) = run_with_stats(&cfg).unwrap();
            assert!(
                r.iter()
                    .all(|r| matches!(r, Report::Bandwidth(b) if b.iters == 8_000)),
                "{r:?}"
            );
            assert_eq!(stats.rnr_naks, 0, "{stats:?}");
            assert_eq!(stats.fast_path_wqes, 24_000, "{stats:?}");
        }
    }

    /// `--write_with_imm`: every WRITE consumes a receive the server
    /// reposts, on the fast path; refused for another test.
    #[test]
    fn write_bandwidth_with_immediate() {
        let cfg = PerfConfig {
            qps: 2,
            iters: 10_000,
            sizes: vec![8, 4096],
            write_with_imm: true,
            ..PerfConfig::new(Test::WriteBw)
        };
        let (r, stats, _) = run_with_stats(&cfg).unwrap();
        assert!(
            r.iter()
                .all(|r| matches!(r, Report::Bandwidth(b) if b.iters == 10_000)),
            "{r:?}"
        );
        assert_eq!(stats.rnr_naks, 0, "{stats:?}");
        assert_eq!(stats.fast_path_wqes, 20_000, "{stats:?}");
    }

    /// Options that do not apply to the test are refused, with what
    /// applies, before anything is created.
    #[test]
    fn options_that_do_not_apply_are_refused() {
        let send_lat = PerfConfig {
            use_srq: true,
            ..PerfConfig::new(Test::SendLat)
        };
        assert_eq!(run(&send_lat).unwrap_err(), "--use_srq applies to send_bw");
        let read = PerfConfig {
            write_with_imm: true,
            ..PerfConfig::new(Test::ReadBw)
        };
        assert_eq!(
            run(&read).unwrap_err(),
            "--write_with_imm applies to write_bw"
        );
        let atomic = PerfConfig {
            sizes: vec![8, 16],
            ..PerfConfig::new(Test::AtomicBw)
        };
        assert_eq!(run(&atomic).unwrap_err(), "atomic_bw moves 8 bytes: -s 8");
        let empty_write = PerfConfig {
            sizes: vec![0],
            ..PerfConfig::new(Test::WriteLat)
        };
        assert_eq!(
            run(&empty_write).unwrap_err(),
            "write_lat polls the last byte of each message: sizes from 1"
        );
        let too_inline = PerfConfig {
            inline: 1 << 20,
            ..PerfConfig::new(Test::SendBw)
        };
        let e = run(&too_inline).unwrap_err();
        assert!(
            e.starts_with("inline size 1048576 is above the device's max_inline_data ("),
            "{e}"
        );
    }

    /// The registered buffer's byte accessors check their bounds (they
    /// wrote past the buffer for a 0-byte WRITE ping-pong).
    #[test]
    #[should_panic(expected = "byte 64 of a 64-byte buffer")]
    fn registered_bytes_are_bounds_checked() {
        let mut buf = vec![0u8; 64];
        let mem = Registered::new(&mut buf);
        mem.set_byte(63, 7);
        assert_eq!(mem.byte(63), 7);
        mem.set_byte(64, 1);
    }

    #[test]
    fn post_lists_send_and_repost_receives_in_lists() {
        // Lists that do not divide the iterations or the depth; receives
        // reposted in lists of 8 over two QPs: a receive not reposted
        // would leave the sender RNR-retrying until it fails.
        for (test, list, recv_list) in [
            (Test::SendBw, 4, 8),
            (Test::SendBw, 1, 5),
            (Test::SendBw, 7, 1),
            (Test::WriteBw, 5, 1),
        ] {
            let cfg = PerfConfig {
                qps: 2,
                iters: 2003,
                post_list: list,
                recv_post_list: recv_list,
                ..small(test)
            };
            let r = run(&cfg).unwrap_or_else(|e| panic!("{} -l {list}: {e}", test.name()));
            let Report::Bandwidth(b) = &r[0] else {
                panic!("not a bandwidth report");
            };
            assert_eq!(b.iters, 2004, "{b:?}");
        }
    }

    #[test]
    fn one_thread_ping_pong_and_event_wakeup() {
        for test in [Test::SendLat, Test::WriteLat] {
            let cfg = PerfConfig {
                one_thread: true,
                ..small(test)
            };
            run(&cfg).unwrap_or_else(|e| panic!("{}: {e}", test.name()));
        }
        let l = event_wakeup(20, Engine::Inline).unwrap();
        assert_eq!(l.iters, 20);
        assert!(l.min > 0.0);
    }

    #[test]
    fn through_doorbell_pages() {
        for test in [Test::SendLat, Test::WriteBw] {
            let cfg = PerfConfig {
                doorbells: UserDoorbells::Page,
                verifier: true,
                iters: 50,
                ..small(test)
            };
            let r = run(&cfg).unwrap_or_else(|e| panic!("{}: {e}", test.name()));
            assert_eq!(r.len(), 1);
            assert!(format(&cfg, &r).contains("doorbells Page"));
        }
    }

    #[test]
    fn event_driven_latency() {
        for test in [Test::SendLat, Test::ReadLat] {
            let cfg = PerfConfig {
                events: true,
                iters: 50,
                ..small(test)
            };
            run(&cfg).unwrap_or_else(|e| panic!("{}: {e}", test.name()));
        }
    }

    /// `--use-channel`: the latency tests that wait for events take them
    /// from a completion channel (and acknowledge each, or the CQs'
    /// destroys would be refused and the device would not quiesce).
    #[test]
    fn event_driven_latency_through_a_completion_channel() {
        for (test, engine) in [
            (Test::SendLat, Engine::Inline),
            (Test::ReadLat, Engine::Thread),
        ] {
            let cfg = PerfConfig {
                events: true,
                use_channel: true,
                iters: 50,
                engine,
                verifier: true,
                ..small(test)
            };
            let (r, _, taken) =
                run_with_stats(&cfg).unwrap_or_else(|e| panic!("{}: {e}", test.name()));
            assert_eq!(r.len(), 1);
            // A wait whose completion was already there takes no event.
            assert!(taken > 0, "{}: no channel event", test.name());
            assert!(format(&cfg, &r).contains("events (completion channel)"));
        }
        let cfg = PerfConfig {
            use_channel: true,
            ..small(Test::SendLat)
        };
        assert!(run(&cfg).unwrap_err().contains("--use-channel"));
    }
}
