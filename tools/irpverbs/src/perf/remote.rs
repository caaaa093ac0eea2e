//! perftest's server/client mode: one endpoint per process (or host), the
//! soft HCA of each on a UDP wire ([`irpverbs_host::udp`]), the connection set up
//! out of band over TCP as perftest does it.
//!
//! The exchange, in lines of text on one TCP connection:
//! 1. client: `irpverbs-perf/1 TEST key=value ...` — the run's parameters
//!    (sizes, iterations, QPs, inline, events, tx depth, cq_mod, MTU). The
//!    server must run the same test; it adopts the rest (so they are given
//!    to the client only). Server: `ok`, or `error WHY`.
//! 2. client: one `qp QPN PSN RKEY VADDR LEN GID` line per QP; the server
//!    answers with its own (perftest's QPN, PSN, GID, rkey and address).
//! 3. per size: both sides connect their QPs (from the second size on,
//!    through a reset: each size starts from empty queues and fresh PSNs)
//!    and post what they receive into; server: `ready`; the client runs
//!    the test and sends `done` with its figures; server, having stopped
//!    answering: `ok`.
//! 4. client: `bye`.
//!
//! With [`RemoteConfig::cm`] (perftest's `-R`, `--rdma_cm`) step 2 goes
//! through the connection manager instead, by address as rdma_cm does
//! ([`irpverbs_verbs::rdma_cm`]): the server listens on its address and
//! the out-of-band port number in the TCP port space (service ID
//! `0x0106_0000 | port`) and says `listening`; the client resolves the
//! server's address and connects each QP (its PSN in the REQ), its
//! buffer's rkey, address and length in the REQ's private data after the
//! IP CM header, the server's in the REP's. QPN, PSN and GID come from the
//! CM exchange; the parameters and the per-size steps stay on TCP. The
//! connections use the CM's path MTU (the port's active MTU) for every
//! size, and the client disconnects them at the end.
//!
//! Each side's IP address (its HCA's GID) is the address its end of the
//! TCP connection has, unless [`RemoteConfig::bind`] names one. The path
//! MTU, unless the client was given one, is the largest IB MTU whose
//! packets fit the IP path MTU (RoCE's active MTU: 1024 on 1500-byte
//! Ethernet).

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use irpverbs_abi::*;
use irpverbs_soft::{LinkStats, SoftConfig};

use super::{
    Bandwidth, Latency, PerfConfig, QpInfo, Refill, Remote, Report, Side, Test, buffer_bytes,
    bw_post, format_header, format_table, new_device, ok, ping, pong, post_ahead, stats,
};
use irpverbs_host::udp::{UdpConfig, UdpStats, ib_mtu_for, path_mtu};
use irpverbs_verbs::IntoClient;
use irpverbs_verbs::rdma_cm::{CmEvent, CmId, ConnParam, PortSpace, ip_gid};

/// perftest's out-of-band TCP port.
pub const OOB_PORT: u16 = 18515;

const HELLO: &str = "irpverbs-perf/1";

/// Where the two endpoints meet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteConfig {
    /// The UDP port of the RoCEv2 wire, on both hosts. Default 4791.
    pub udp_port: u16,
    /// The TCP port of the out-of-band exchange. Default [`OOB_PORT`].
    pub oob_port: u16,
    /// This host's IP address (its HCA's); default the address of its end
    /// of the out-of-band connection. The server listens on it too.
    pub bind: Option<IpAddr>,
    /// How long a client keeps trying to reach the server.
    pub connect_timeout: Duration,
    /// The path MTU was given (`-m`): else the client picks it from the
    /// IP path MTU.
    pub mtu_given: bool,
    /// Record every datagram sent and received into this pcap file.
    pub pcap: Option<std::path::PathBuf>,
    /// Connect the QPs through the connection manager, by address
    /// (perftest's `--rdma_cm`), instead of exchanging them over TCP.
    pub cm: bool,
}

impl Default for RemoteConfig {
    fn default() -> Self {
        Self {
            udp_port: irpverbs_host::udp::ROCE_PORT,
            oob_port: OOB_PORT,
            bind: None,
            connect_timeout: Duration::from_secs(15),
            mtu_given: false,
            pcap: None,
            cm: false,
        }
    }
}

/// What one endpoint of a remote run did.
#[derive(Clone, Debug)]
pub struct RemoteRun {
    /// The parameters run (a server's are the client's).
    pub cfg: PerfConfig,
    /// The client's figures, one per size (the server prints them too).
    pub reports: Vec<Report>,
    /// This endpoint's QPs and its peer's, as perftest prints them.
    pub addresses: String,
    /// This endpoint's UDP wire counters.
    pub udp: UdpStats,
    /// Its soft HCA's counters of the wire.
    pub link: LinkStats,
}

impl RemoteRun {
    /// The output, as perftest prints it: banner, addresses, figures, and
    /// the wire's counters.
    #[must_use]
    pub fn format(&self) -> String {
        let mut s = format_header(&self.cfg);
        s.push_str(&self.addresses);
        s.push_str(
            "---------------------------------------------------------------------------------------\n",
        );
        s.push_str(&format_table(&self.cfg, &self.reports));
        let u = &self.udp;
        let _ = writeln!(
            s,
            "---------------------------------------------------------------------------------------\n \
             UDP wire: {} datagrams sent in {} calls ({} dropped, {} failed), {} received in {} batches",
            u.sent, u.send_calls, u.send_dropped, u.send_failed, u.received, u.recv_batches
        );
        let l = &self.link;
        let _ = writeln!(
            s,
            " HCA: {} datagrams accepted, {} dropped ({} without a buffer), {} ACK timeouts, {} RNR timeouts",
            l.rx_dropped.accepted,
            l.rx_dropped.total_drops(),
            l.rx_no_buffer,
            l.ack_timeouts,
            l.rnr_timeouts
        );
        s
    }
}

/// The out-of-band connection.
struct Oob {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    /// The peer's address.
    peer: IpAddr,
}

impl Oob {
    fn new(stream: TcpStream) -> Result<Self, String> {
        let _ = stream.set_nodelay(true);
        let writer = stream.try_clone().map_err(|e| format!("oob: {e}"))?;
        let peer = stream
            .peer_addr()
            .map(|a| a.ip().to_canonical())
            .map_err(|e| format!("oob: {e}"))?;
        Ok(Self {
            reader: BufReader::new(stream),
            writer,
            peer,
        })
    }

    fn send(&mut self, line: &str) -> Result<(), String> {
        writeln!(self.writer, "{line}").map_err(|e| format!("oob send: {e}"))
    }

    fn recv(&mut self) -> Result<String, String> {
        read_line(&mut self.reader)
    }

    /// Reads a line that must be `want` (or the peer's `error`).
    fn expect(&mut self, want: &str) -> Result<(), String> {
        let line = self.recv()?;
        if line == want {
            Ok(())
        } else {
            Err(format!("oob: expected {want:?}, got {line:?}"))
        }
    }

    /// Tells the peer why this side gives up (best effort).
    fn fail(&mut self, why: &str) {
        let _ = self.send(&format!("error {why}"));
    }
}

/// One line; the peer's `error WHY` and the end of the stream are errors.
fn read_line(r: &mut BufReader<TcpStream>) -> Result<String, String> {
    let mut line = String::new();
    match r.read_line(&mut line) {
        Ok(0) => Err("oob: the peer closed the connection".into()),
        Ok(_) => {
            let line = line.trim_end().to_string();
            match line.strip_prefix("error ") {
                Some(why) => Err(format!("peer: {why}")),
                None => Ok(line),
            }
        }
        Err(e) => Err(format!("oob: {e}")),
    }
}

/// Runs the server's side: waits for one client on the out-of-band port,
/// adopts its parameters (the test must be `cfg.test`), and answers its
/// test over the UDP wire.
///
/// # Errors
/// The exchange's, the wire's, or the test's.
pub fn serve(cfg: &PerfConfig, rc: &RemoteConfig) -> Result<RemoteRun, String> {
    cfg.check()?;
    let listener = match rc.bind {
        Some(ip) => TcpListener::bind((ip, rc.oob_port)),
        None => TcpListener::bind((Ipv6Addr::UNSPECIFIED, rc.oob_port))
            .or_else(|_| TcpListener::bind(("0.0.0.0", rc.oob_port))),
    }
    .map_err(|e| format!("listen on port {}: {e}", rc.oob_port))?;
    let (stream, _) = listener.accept().map_err(|e| format!("accept: {e}"))?;
    let local = local_ip(&stream, rc)?;
    let mut oob = Oob::new(stream)?;
    let hello = oob.recv()?;
    let run_cfg = match parse_hello(&hello, cfg) {
        Ok(c) => c,
        Err(e) => {
            oob.fail(&e);
            return Err(e);
        }
    };
    oob.send("ok")?;
    endpoint(&run_cfg, rc, local, oob, false)
}

/// Runs the client's side against the server at `server`: sends it the
/// parameters, runs the test over the UDP wire, and returns the figures.
///
/// # Errors
/// The exchange's (no server within [`RemoteConfig::connect_timeout`]),
/// the wire's, or the test's.
pub fn connect(cfg: &PerfConfig, server: IpAddr, rc: &RemoteConfig) -> Result<RemoteRun, String> {
    cfg.check()?;
    let to = SocketAddr::new(server, rc.oob_port);
    let deadline = Instant::now() + rc.connect_timeout;
    let stream = loop {
        match TcpStream::connect_timeout(&to, Duration::from_secs(1)) {
            Ok(s) => break s,
            Err(e) if Instant::now() >= deadline => {
                return Err(format!("couldn't connect to {to}: {e}"));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    let local = local_ip(&stream, rc)?;
    let mut run_cfg = cfg.clone();
    if !rc.mtu_given {
        let mtu = path_mtu(local, server).map_err(|e| format!("path MTU to {server}: {e}"))?;
        run_cfg.mtu = ib_mtu_for(mtu, server.is_ipv6())
            .ok_or_else(|| format!("the path MTU to {server} ({mtu}) is below RoCE's 256"))?;
    }
    let mut oob = Oob::new(stream)?;
    oob.send(&hello(&run_cfg))?;
    oob.expect("ok")?;
    endpoint(&run_cfg, rc, local, oob, true)
}

fn local_ip(stream: &TcpStream, rc: &RemoteConfig) -> Result<IpAddr, String> {
    match rc.bind {
        Some(ip) => Ok(ip),
        None => stream
            .local_addr()
            .map(|a| a.ip().to_canonical())
            .map_err(|e| format!("oob: {e}")),
    }
}

fn hello(cfg: &PerfConfig) -> String {
    let sizes: Vec<String> = cfg.sizes.iter().map(u64::to_string).collect();
    format!(
        "{HELLO} {} sizes={} iters={} qps={} inline={} events={} channel={} tx_depth={} cq_mod={} mtu={} srq={} imm={}",
        cfg.test.name(),
        sizes.join(","),
        cfg.iters,
        cfg.qps,
        cfg.inline,
        u8::from(cfg.events),
        u8::from(cfg.use_channel),
        cfg.tx_depth,
        cfg.cq_mod,
        cfg.mtu,
        u8::from(cfg.use_srq),
        u8::from(cfg.write_with_imm)
    )
}

/// The client's parameters over the server's own (engine, verifier).
fn parse_hello(line: &str, own: &PerfConfig) -> Result<PerfConfig, String> {
    let mut words = line.split_whitespace();
    if words.next() != Some(HELLO) {
        return Err(format!("not an irpverbs perf client: {line:?}"));
    }
    let test = words.next().and_then(Test::parse);
    if test != Some(own.test) {
        return Err(format!(
            "the server runs {}, the client asked for {}",
            own.test.name(),
            test.map_or("an unknown test", Test::name)
        ));
    }
    let mut cfg = own.clone();
    for w in words {
        let (k, v) = w
            .split_once('=')
            .ok_or_else(|| format!("bad field {w:?}"))?;
        let num = |v: &str| v.parse::<u32>().map_err(|_| format!("bad {k}: {v:?}"));
        match k {
            "sizes" => {
                cfg.sizes = v
                    .split(',')
                    .map(|s| s.parse::<u64>().map_err(|_| format!("bad size {s:?}")))
                    .collect::<Result<_, _>>()?;
            }
            "iters" => cfg.iters = v.parse().map_err(|_| format!("bad iters {v:?}"))?,
            "qps" => cfg.qps = num(v)?,
            "inline" => cfg.inline = num(v)?,
            "events" => cfg.events = num(v)? != 0,
            "channel" => cfg.use_channel = num(v)? != 0,
            "tx_depth" => cfg.tx_depth = num(v)?,
            "cq_mod" => cfg.cq_mod = num(v)?,
            "mtu" => cfg.mtu = num(v)?,
            "srq" => cfg.use_srq = num(v)? != 0,
            "imm" => cfg.write_with_imm = num(v)? != 0,
            _ => return Err(format!("unknown field {k:?}")),
        }
    }
    let sane = !cfg.sizes.is_empty()
        && cfg.sizes.iter().all(|&s| (1..=1 << 30).contains(&s))
        && (1..=1024).contains(&cfg.qps)
        && (1..=8192).contains(&cfg.tx_depth)
        && (IV_MTU_256..=IV_MTU_4096).contains(&cfg.mtu);
    if !sane {
        return Err(format!("parameters out of range: {line:?}"));
    }
    cfg.check()?;
    Ok(cfg)
}

fn qp_line(q: &QpInfo) -> String {
    let gid: String = q.gid.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "qp {} {} {} {} {} {gid}",
        q.qpn, q.psn, q.remote.rkey, q.remote.addr, q.remote.len
    )
}

fn parse_qp(line: &str) -> Result<QpInfo, String> {
    let bad = || format!("bad QP line {line:?}");
    let w: Vec<&str> = line.split_whitespace().collect();
    if w.len() != 7 || w[0] != "qp" || w[6].len() != 32 {
        return Err(bad());
    }
    let mut gid = [0u8; 16];
    for (i, g) in gid.iter_mut().enumerate() {
        *g = u8::from_str_radix(&w[6][2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(QpInfo {
        qpn: w[1].parse().map_err(|_| bad())?,
        psn: w[2].parse().map_err(|_| bad())?,
        gid,
        remote: Remote {
            rkey: w[3].parse().map_err(|_| bad())?,
            addr: w[4].parse().map_err(|_| bad())?,
            len: w[5].parse().map_err(|_| bad())?,
        },
    })
}

/// perftest's address lines: `local address: LID .. QPN .. PSN .. RKey ..
/// VAddr ..` and the GID as decimal bytes.
fn address_lines(s: &mut String, what: &str, q: &QpInfo) {
    let _ = writeln!(
        s,
        " {what} address: LID 0000 QPN {:#06x} PSN {:#08x} RKey {:#010x} VAddr {:#016x}",
        q.qpn, q.psn, q.remote.rkey, q.remote.addr
    );
    let gid: Vec<String> = q.gid.iter().map(|b| format!("{b:02}")).collect();
    let _ = writeln!(s, " GID: {}", gid.join(":"));
}

fn report_line(r: &Report) -> String {
    match r {
        Report::Latency(l) => format!(
            "done lat {} {} {} {} {} {} {} {} {}",
            l.bytes, l.iters, l.min, l.max, l.typical, l.avg, l.stdev, l.p99, l.p999
        ),
        Report::Bandwidth(b) => format!(
            "done bw {} {} {} {} {}",
            b.bytes, b.iters, b.peak_mib, b.avg_mib, b.mpps
        ),
    }
}

fn parse_report(line: &str) -> Result<Report, String> {
    let bad = || format!("bad report {line:?}");
    let w: Vec<&str> = line.split_whitespace().collect();
    let f =
        |i: usize| -> Result<f64, String> { w.get(i).and_then(|v| v.parse().ok()).ok_or_else(bad) };
    let n =
        |i: usize| -> Result<u64, String> { w.get(i).and_then(|v| v.parse().ok()).ok_or_else(bad) };
    match (w.first(), w.get(1)) {
        (Some(&"done"), Some(&"lat")) if w.len() == 11 => Ok(Report::Latency(Latency {
            bytes: n(2)?,
            iters: n(3)?,
            min: f(4)?,
            max: f(5)?,
            typical: f(6)?,
            avg: f(7)?,
            stdev: f(8)?,
            p99: f(9)?,
            p999: f(10)?,
        })),
        (Some(&"done"), Some(&"bw")) if w.len() == 7 => Ok(Report::Bandwidth(Bandwidth {
            bytes: n(2)?,
            iters: n(3)?,
            peak_mib: f(4)?,
            avg_mib: f(5)?,
            mpps: f(6)?,
        })),
        _ => Err(bad()),
    }
}

/// A QP's first PSN: random per run (perftest's `lrand48() & 0xffffff`),
/// moved on by 2^20 per size so that a stray packet of the last size never
/// matches the next.
fn first_psn(seed: u32, qp: usize, size_index: usize) -> u32 {
    let x = seed
        .wrapping_mul(0x9E37_79B9)
        .wrapping_add((qp as u32).wrapping_mul(0x85EB_CA6B));
    (x ^ (x >> 15)).wrapping_add((size_index as u32) << 20) & 0xFF_FFFF
}

fn seed() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() ^ d.as_secs() as u32);
    t ^ std::process::id().rotate_left(16)
}

/// Either side, once the parameters are agreed: a device on the wire, the
/// QPs exchanged, then the test size by size.
fn endpoint(
    cfg: &PerfConfig,
    rc: &RemoteConfig,
    local: IpAddr,
    mut oob: Oob,
    client: bool,
) -> Result<RemoteRun, String> {
    let soft = SoftConfig {
        ip: local,
        udp_port: rc.udp_port,
        ..SoftConfig::default()
    };
    let dev = new_device(cfg, soft)?;
    if let Err(e) = dev.attach_udp(&UdpConfig::default()) {
        let why = format!("UDP wire on {local} port {}: {e}", rc.udp_port);
        oob.fail(&why);
        dev.unload();
        return Err(why);
    }
    let tap = match &rc.pcap {
        Some(path) => match crate::pcap::PcapTap::create(path) {
            Ok(tap) => {
                dev.soft().set_tap(Some(tap.clone()));
                Some(tap)
            }
            Err(e) => {
                let why = format!("capture {}: {e}", path.display());
                oob.fail(&why);
                dev.unload();
                return Err(why);
            }
        },
        None => None,
    };
    let result = (|| {
        let file = dev
            .open(FILE_READ_ACCESS | FILE_WRITE_ACCESS)
            .map_err(|s| format!("open: {}", status_name(s)))?;
        let c = file.into_client();
        let mut side = Side::new(&c, cfg, buffer_bytes(cfg))?;
        if !cfg.events {
            side.wire = Some(&dev);
        }
        let r = run_sizes(cfg, rc, local, &c, &side, &mut oob, client);
        side.teardown();
        drop(c);
        r
    })();
    let result = result.inspect_err(|e| oob.fail(e));
    let udp = dev.udp_stats().unwrap_or_default();
    let link = dev.soft().link_stats();
    if let Some(tap) = tap {
        dev.soft().set_tap(None);
        tap.finish().map_err(|e| format!("capture: {e}"))?;
    }
    dev.quiesce(Duration::from_secs(10))?;
    dev.unload();
    let (reports, addresses, mtu) = result.map_err(|e| {
        let hint = congestion_hint(cfg, &e, UdpConfig::default().socket_buffer);
        format!("{e} (UDP wire: {udp:?}; HCA: {link:?}){hint}")
    })?;
    Ok(RemoteRun {
        cfg: PerfConfig { mtu, ..cfg.clone() },
        reports,
        addresses,
        udp,
        link,
    })
}

/// The rkey, address and length of a buffer, as CM private data.
fn memory_pdata(r: &Remote) -> Vec<u8> {
    let mut v = Vec::with_capacity(20);
    v.extend_from_slice(&r.rkey.to_be_bytes());
    v.extend_from_slice(&r.addr.to_be_bytes());
    v.extend_from_slice(&r.len.to_be_bytes());
    v
}

fn parse_memory_pdata(pd: &[u8]) -> Result<Remote, String> {
    let bad = || format!("bad memory private data {pd:02x?}");
    let rkey = pd.get(..4).ok_or_else(bad)?;
    let addr = pd.get(4..12).ok_or_else(bad)?;
    let len = pd.get(12..20).ok_or_else(bad)?;
    Ok(Remote {
        rkey: u32::from_be_bytes(rkey.try_into().map_err(|_| bad())?),
        addr: u64::from_be_bytes(addr.try_into().map_err(|_| bad())?),
        len: u64::from_be_bytes(len.try_into().map_err(|_| bad())?),
    })
}

/// The QPs connected through the CM, by address: the peers' QPN, PSN, GID
/// and memory, and the connections (kept until the end of the run).
fn cm_exchange<'c>(
    rc: &RemoteConfig,
    local: IpAddr,
    c: &'c irpverbs_verbs::Client,
    side: &Side<'_>,
    oob: &mut Oob,
    client: bool,
    seed: u32,
) -> Result<(Vec<QpInfo>, Vec<CmId<'c>>), String> {
    let cm_err = |what: &str, st: NtStatus| format!("rdma_cm {what}: {}", status_name(st));
    let mut ids = Vec::new();
    let mut theirs = Vec::new();
    if client {
        let server = oob.peer;
        oob.expect("listening")?;
        for i in 0..side.qps.len() {
            let mut id = CmId::new(c, PortSpace::Tcp).map_err(|s| cm_err("create_id", s))?;
            id.resolve_addr(Some(local), SocketAddr::new(server, rc.oob_port))
                .map_err(|s| cm_err("resolve_addr", s))?;
            id.resolve_route().map_err(|s| cm_err("resolve_route", s))?;
            let p = ConnParam {
                starting_psn: Some(first_psn(seed, i, 0)),
                private_data: memory_pdata(&side.remote()),
                ..ConnParam::default()
            };
            id.connect(side.qps[i].handle(), &p)
                .map_err(|s| cm_err("connect", s))?;
            theirs.push(QpInfo {
                qpn: id.remote_qpn(),
                psn: id.remote_psn(),
                gid: ip_gid(server),
                remote: parse_memory_pdata(id.private_data())?,
            });
            ids.push(id);
        }
    } else {
        let mut listener = CmId::new(c, PortSpace::Tcp).map_err(|s| cm_err("create_id", s))?;
        listener
            .bind_addr(SocketAddr::new(local, rc.oob_port))
            .map_err(|s| cm_err("bind_addr", s))?;
        listener.listen().map_err(|s| cm_err("listen", s))?;
        oob.send("listening")?;
        for i in 0..side.qps.len() {
            let mut id = listener
                .get_request()
                .map_err(|s| cm_err("get_request", s))?;
            let remote = parse_memory_pdata(id.private_data())?;
            let peer = id.peer_addr().map_or(local, |a| a.ip());
            let p = ConnParam {
                starting_psn: Some(first_psn(seed, i, 0)),
                private_data: memory_pdata(&side.remote()),
                ..ConnParam::default()
            };
            id.accept(side.qps[i].handle(), &p)
                .map_err(|s| cm_err("accept", s))?;
            theirs.push(QpInfo {
                qpn: id.remote_qpn(),
                psn: id.remote_psn(),
                gid: ip_gid(peer),
                remote,
            });
            ids.push(id);
        }
    }
    Ok((theirs, ids))
}

/// Ends the CM's connections: the client disconnects, the server answers
/// each DREQ.
fn cm_disconnect(ids: &mut [CmId<'_>], client: bool) -> Result<(), String> {
    for id in ids {
        if !client {
            loop {
                match id.get_event() {
                    Ok(CmEvent::DisconnectRequest) => break,
                    Ok(_) => {}
                    Err(st) => return Err(format!("rdma_cm get_event: {}", status_name(st))),
                }
            }
        }
        id.disconnect()
            .map_err(|st| format!("rdma_cm disconnect: {}", status_name(st)))?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn run_sizes(
    cfg: &PerfConfig,
    rc: &RemoteConfig,
    local: IpAddr,
    c: &irpverbs_verbs::Client,
    side: &Side<'_>,
    oob: &mut Oob,
    client: bool,
) -> Result<(Vec<Report>, String, u32), String> {
    let gid = ok("query_gid", c.query_gid(1, 0))?;
    let seed = seed();
    let nq = side.qps.len();
    let mine: Vec<QpInfo> = (0..nq)
        .map(|i| side.info(i, first_psn(seed, i, 0), gid))
        .collect();
    let exchange = |oob: &mut Oob| -> Result<Vec<QpInfo>, String> {
        let send = |oob: &mut Oob| -> Result<(), String> {
            mine.iter().try_for_each(|q| oob.send(&qp_line(q)))
        };
        if client {
            send(oob)?;
        }
        let theirs = (0..nq)
            .map(|_| oob.recv().and_then(|l| parse_qp(&l)))
            .collect::<Result<Vec<_>, _>>()?;
        if !client {
            send(oob)?;
        }
        Ok(theirs)
    };
    let (theirs, mut cm_ids) = if rc.cm {
        cm_exchange(rc, local, c, side, oob, client, seed)?
    } else {
        (exchange(oob)?, Vec::new())
    };
    // Through the CM, the QPs run at the path MTU the CM gave them.
    let mtu = if rc.cm {
        ok("query_qp", side.qps[0].query())?.attr.path_mtu
    } else {
        cfg.mtu
    };
    let mut addresses = String::new();
    for (m, t) in mine.iter().zip(&theirs) {
        address_lines(&mut addresses, "local", m);
        address_lines(&mut addresses, "remote", t);
    }
    let peer = theirs[0].remote;
    let mut reports = Vec::new();
    for (n, &size) in cfg.sizes.iter().enumerate() {
        let psns: Vec<u32> = (0..nq).map(|i| first_psn(seed, i, n)).collect();
        let peers: Vec<QpInfo> = theirs
            .iter()
            .map(|t| QpInfo {
                psn: (t.psn + ((n as u32) << 20)) & 0xFF_FFFF,
                ..*t
            })
            .collect();
        if !(rc.cm && n == 0) {
            side.connect_all(&psns, &peers, mtu, n > 0)?;
        }
        if cfg.test == Test::SendLat {
            post_ahead(side, if client { size } else { 0 }, size)?;
        }
        if client {
            oob.expect("ready")?;
            let report = if cfg.test.is_latency() {
                let mut samples = Vec::with_capacity(cfg.iters as usize);
                ping(cfg, side, peer, size, &mut samples)?;
                Report::Latency(stats(samples, size))
            } else {
                Report::Bandwidth(bw_post(cfg, side, peer, size, &mut || Ok(()))?)
            };
            oob.send(&report_line(&report))?;
            oob.expect("ok")?;
            reports.push(report);
        } else {
            let mut refill = if cfg.receives() {
                Some(Refill::prime(cfg, side, size)?)
            } else {
                None
            };
            oob.send("ready")?;
            let report = answer(cfg, side, peer, size, oob, refill.as_mut())?;
            oob.send("ok")?;
            reports.push(report);
        }
    }
    if client {
        cm_disconnect(&mut cm_ids, client)?;
        oob.send("bye")?;
    } else {
        cm_disconnect(&mut cm_ids, client)?;
        oob.expect("bye")?;
    }
    Ok((reports, addresses, mtu))
}

/// What to tell a user whose bandwidth test over the wire ran out of
/// retries with more bytes in flight than the receiving socket can hold:
/// the requester's congestion window could not keep up with the losses
/// (a path shared with other traffic, a receiver slower than its socket),
/// and a smaller tx depth keeps the window within the buffers from the
/// start.
fn congestion_hint(cfg: &PerfConfig, error: &str, socket_buffer: usize) -> String {
    let largest = cfg.sizes.iter().copied().max().unwrap_or(0);
    let in_flight = largest
        .saturating_mul(u64::from(cfg.tx_depth))
        .saturating_mul(u64::from(cfg.qps));
    if cfg.test.is_latency()
        || !error.contains("RETRY_EXC_ERR")
        || in_flight <= socket_buffer as u64
    {
        return String::new();
    }
    let depth = (socket_buffer as u64 / 2 / largest.max(1) / u64::from(cfg.qps.max(1))).max(1);
    format!(
        "; {} MiB in flight against {} MiB socket buffers, more than the congestion window \
         recovered from: try -t {depth}",
        in_flight >> 20,
        socket_buffer >> 20
    )
}

/// The server's part of one size: answer the ping-pong, or refill the
/// receives of a SEND stream, until the client's `done` (read on a thread
/// of its own) stops it; the client's figures.
fn answer(
    cfg: &PerfConfig,
    side: &Side<'_>,
    peer: Remote,
    size: u64,
    oob: &mut Oob,
    refill: Option<&mut Refill>,
) -> Result<Report, String> {
    let stop = AtomicBool::new(false);
    let reader = &mut oob.reader;
    std::thread::scope(|scope| -> Result<Report, String> {
        let done = scope.spawn(|| {
            let line = read_line(reader);
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            line
        });
        let served = match (cfg.test, refill) {
            (Test::SendLat | Test::WriteLat, _) => pong(cfg, side, peer, size, &stop),
            (_, Some(refill)) => {
                let mut r = Ok(());
                while r.is_ok() && !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    r = refill.step(side).map(|_| ());
                }
                r
            }
            // READ, WRITE and atomic streams, READ and atomic round
            // trips: the HCA answers; nothing to do but wait.
            _ => Ok(()),
        };
        let line = done
            .join()
            .map_err(|_| "oob reader panicked".to_string())??;
        served?;
        parse_report(&line)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exchange_round_trips() {
        let mut cfg = PerfConfig::new(Test::WriteBw);
        cfg.sizes = vec![8, 1 << 20];
        cfg.qps = 3;
        cfg.events = true;
        cfg.use_channel = true;
        cfg.mtu = IV_MTU_1024;
        let back = parse_hello(&hello(&cfg), &PerfConfig::new(Test::WriteBw)).unwrap();
        assert_eq!(back.sizes, cfg.sizes);
        assert_eq!(
            (
                back.qps,
                back.events,
                back.use_channel,
                back.mtu,
                back.iters
            ),
            (3, true, true, IV_MTU_1024, cfg.iters)
        );
        let other = parse_hello(&hello(&cfg), &PerfConfig::new(Test::SendLat)).unwrap_err();
        assert!(other.contains("send_lat"), "{other}");
        assert!(parse_hello("hello", &cfg).is_err());
        let mut huge = cfg.clone();
        huge.qps = 5000;
        assert!(parse_hello(&hello(&huge), &cfg).is_err());

        let q = QpInfo {
            qpn: 0x12,
            psn: 0xAB_CDEF,
            gid: irpverbs_host::udp::ip_gid("10.77.0.1".parse().unwrap()),
            remote: Remote {
                addr: 0x7F00_1234_5000,
                rkey: 0x203,
                len: 4096,
            },
        };
        assert_eq!(parse_qp(&qp_line(&q)).unwrap(), q);
        assert!(parse_qp("qp 1 2 3").is_err());
        let mut s = String::new();
        address_lines(&mut s, "local", &q);
        assert!(s.contains("QPN 0x0012 PSN 0xabcdef"), "{s}");
        assert!(s.contains("GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:77:00:01"));

        let lat = Report::Latency(stats(vec![1.5, 2.25, 3.0], 8));
        let bw = Report::Bandwidth(Bandwidth {
            bytes: 1 << 20,
            iters: 100,
            peak_mib: 1234.5,
            avg_mib: 1000.25,
            mpps: 0.001,
        });
        for r in [lat, bw] {
            assert_eq!(
                format!("{:?}", parse_report(&report_line(&r)).unwrap()),
                format!("{r:?}")
            );
        }
        assert!(parse_report("done lat 1 2").is_err());
        for n in 0..4 {
            assert!(first_psn(seed(), 5, n) <= 0xFF_FFFF);
        }
    }

    /// Server and client on two threads of one process, on 127.0.0.1 and
    /// 127.0.0.2: every test, a size sweep for one.
    #[test]
    fn server_and_client_run_every_test_over_udp() {
        for test in Test::ALL {
            let mut cfg = PerfConfig::new(test);
            cfg.iters = 100;
            cfg.tx_depth = 16;
            cfg.cq_mod = 4;
            if test == Test::SendBw {
                cfg.sizes = vec![64, 8192];
            } else if !test.is_atomic() {
                cfg.sizes = vec![4096];
            }
            let Some((server, client)) = free_ports() else {
                eprintln!("skipped: no free ports");
                return;
            };
            let s_cfg = cfg.clone();
            let srv = std::thread::spawn(move || serve(&s_cfg, &server));
            let run = connect(&cfg, "127.0.0.1".parse().unwrap(), &client)
                .unwrap_or_else(|e| panic!("{}: {e}", test.name()));
            let s_run = srv.join().unwrap().unwrap();
            assert_eq!(run.reports.len(), cfg.sizes.len());
            assert_eq!(format!("{:?}", run.reports), format!("{:?}", s_run.reports));
            assert!(run.udp.sent > 0 && run.udp.received > 0, "{:?}", run.udp);
            let text = run.format();
            assert!(text.contains(test.name()) && text.contains("remote address"));
            assert_eq!(run.cfg.mtu, IV_MTU_4096, "loopback's MTU is 64 KiB");
        }
    }

    /// A bandwidth test that ran out of retries with more in flight than
    /// the socket buffers hold gets a hint with a depth that fits; nothing
    /// else does.
    #[test]
    fn retries_exhausted_by_an_oversized_window_get_a_hint() {
        let mut cfg = PerfConfig::new(Test::SendBw);
        cfg.sizes = vec![2 << 20];
        let e = "completion 47 failed: RETRY_EXC_ERR";
        assert_eq!(
            congestion_hint(&cfg, e, 32 << 20),
            "; 256 MiB in flight against 32 MiB socket buffers, more than the congestion \
             window recovered from: try -t 8"
        );
        assert_eq!(
            congestion_hint(&cfg, "completion 1 failed: REM_ACCESS_ERR", 32 << 20),
            ""
        );
        cfg.sizes = vec![4096];
        assert_eq!(congestion_hint(&cfg, e, 32 << 20), "", "512 KiB fits");
        let lat = PerfConfig::new(Test::SendLat);
        assert_eq!(congestion_hint(&lat, e, 32 << 20), "");
    }

    /// `--use_srq` and `--write_with_imm` between two processes' worth of
    /// endpoints: the server adopts them from the client's parameters, and
    /// reposts the receives both consume (on the SRQ for the first).
    #[test]
    fn server_and_client_with_an_srq_and_with_immediate() {
        for (test, srq, imm) in [(Test::SendBw, true, false), (Test::WriteBw, false, true)] {
            let mut cfg = PerfConfig::new(test);
            cfg.iters = 400;
            cfg.tx_depth = 16;
            cfg.cq_mod = 4;
            cfg.qps = 2;
            cfg.sizes = vec![64, 8192];
            let Some((server, client)) = free_ports() else {
                eprintln!("skipped: no free ports");
                return;
            };
            // The server is started without them: the client's hello
            // carries them.
            let s_cfg = cfg.clone();
            cfg.use_srq = srq;
            cfg.write_with_imm = imm;
            let srv = std::thread::spawn(move || serve(&s_cfg, &server));
            let run = connect(&cfg, "127.0.0.1".parse().unwrap(), &client)
                .unwrap_or_else(|e| panic!("{}: {e}", test.name()));
            let s_run = srv.join().unwrap().unwrap();
            assert_eq!((s_run.cfg.use_srq, s_run.cfg.write_with_imm), (srq, imm));
            assert_eq!(format!("{:?}", run.reports), format!("{:?}", s_run.reports));
            for r in &run.reports {
                assert!(matches!(r, Report::Bandwidth(b) if b.iters == 400), "{r:?}");
            }
        }
    }

    /// Server and client through the CM (`--cm`), on 127.0.0.1 and
    /// 127.0.0.2: the QPs connected by address, the memory in the private
    /// data; two QPs, WRITE and READ (which need the peer's rkey and
    /// address), SEND latency, and a sweep (later sizes reconnect from the
    /// CM's QPNs and PSNs).
    #[test]
    fn server_and_client_connect_through_the_cm() {
        for (test, sizes) in [
            (Test::WriteBw, vec![4096]),
            (Test::ReadLat, vec![64]),
            (Test::SendLat, vec![2, 1024]),
        ] {
            let mut cfg = PerfConfig::new(test);
            cfg.iters = 100;
            cfg.tx_depth = 16;
            cfg.cq_mod = 4;
            cfg.qps = if test == Test::WriteBw { 2 } else { 1 };
            cfg.sizes = sizes;
            let Some((mut server, mut client)) = free_ports() else {
                eprintln!("skipped: no free ports");
                return;
            };
            server.cm = true;
            client.cm = true;
            let s_cfg = cfg.clone();
            let srv = std::thread::spawn(move || serve(&s_cfg, &server));
            let run = connect(&cfg, "127.0.0.1".parse().unwrap(), &client)
                .unwrap_or_else(|e| panic!("{}: {e}", test.name()));
            let s_run = srv.join().unwrap().unwrap();
            assert_eq!(run.reports.len(), cfg.sizes.len());
            assert_eq!(format!("{:?}", run.reports), format!("{:?}", s_run.reports));
            // The CM's path MTU: the soft HCA port's active MTU.
            assert_eq!((run.cfg.mtu, s_run.cfg.mtu), (IV_MTU_1024, IV_MTU_1024));
            assert!(run.udp.sent > 0 && run.udp.received > 0, "{:?}", run.udp);
            let text = run.format();
            assert!(text.contains("remote address"), "{text}");
        }
    }

    #[test]
    fn memory_private_data_round_trips() {
        let r = Remote {
            addr: 0x7F00_1234_5000,
            rkey: 0x203,
            len: 4096,
        };
        let mut pd = memory_pdata(&r);
        assert_eq!(pd.len(), 20);
        assert_eq!(parse_memory_pdata(&pd), Ok(r));
        pd.resize(56, 0);
        assert_eq!(parse_memory_pdata(&pd), Ok(r), "zero padding follows");
        assert!(parse_memory_pdata(&pd[..19]).is_err());
    }

    /// A server on 127.0.0.1 and a client bound to 127.0.0.2, with an
    /// out-of-band port and a UDP port free (on both addresses).
    fn free_ports() -> Option<(RemoteConfig, RemoteConfig)> {
        for _ in 0..20 {
            let oob = TcpListener::bind("127.0.0.1:0")
                .ok()?
                .local_addr()
                .ok()?
                .port();
            let udp = std::net::UdpSocket::bind("127.0.0.1:0")
                .ok()?
                .local_addr()
                .ok()?
                .port();
            if std::net::UdpSocket::bind(("127.0.0.2", udp)).is_err() {
                continue;
            }
            let server = RemoteConfig {
                udp_port: udp,
                oob_port: oob,
                bind: Some("127.0.0.1".parse().ok()?),
                ..RemoteConfig::default()
            };
            let client = RemoteConfig {
                bind: Some("127.0.0.2".parse().ok()?),
                ..server.clone()
            };
            return Some((server, client));
        }
        None
    }
}
