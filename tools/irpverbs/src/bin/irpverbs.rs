//! `irpverbs`: tools over the driver running in host mode on a soft HCA.

use clap::{Parser, Subcommand, ValueEnum};
use irpverbs_abi::{FILE_READ_ACCESS, FILE_WRITE_ACCESS, status_name};
use irpverbs_host::{Engine, HostDevice, HostDeviceConfig, UserDoorbells};
use irpverbs_verbs::Client;

#[derive(Parser)]
#[command(
    name = "irpverbs",
    about = "irpverbs in host mode: the driver in-process over a soft RoCEv2 HCA"
)]
struct Cli {
    /// Where the soft HCA's firmware runs.
    #[arg(long, value_enum, default_value_t = EngineArg::Inline, global = true)]
    engine: EngineArg,
    /// How user-mode files ring their doorbells (perf): direct calls, or
    /// their doorbell pages scanned by a doorbell thread, as on Windows.
    #[arg(long, value_enum, default_value_t = DoorbellsArg::Direct, global = true)]
    doorbells: DoorbellsArg,
    /// With `--doorbells page`: microseconds the doorbell thread polls the
    /// pages after the last doorbell before it sleeps (0: every doorbell
    /// after a quiet scan is an IOCTL_IV_RING_DOORBELLS). Default 200.
    #[arg(long, global = true)]
    doorbell_poll_us: Option<u64>,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Clone, Copy, ValueEnum)]
enum DoorbellsArg {
    Direct,
    Page,
}

impl From<DoorbellsArg> for UserDoorbells {
    fn from(d: DoorbellsArg) -> Self {
        match d {
            DoorbellsArg::Direct => UserDoorbells::Direct,
            DoorbellsArg::Page => UserDoorbells::Page,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum EngineArg {
    Inline,
    Thread,
}

impl From<EngineArg> for Engine {
    fn from(e: EngineArg) -> Self {
        match e {
            EngineArg::Inline => Engine::Inline,
            EngineArg::Thread => Engine::Thread,
        }
    }
}

/// `irpverbs port`'s action.
#[derive(Clone, Copy, ValueEnum)]
enum PortArg {
    /// Take the link down.
    Down,
    /// Bring it up (after taking it down).
    Up,
}

impl From<PortArg> for irpverbs_tools::port::PortAction {
    fn from(a: PortArg) -> Self {
        match a {
            PortArg::Down => Self::Down,
            PortArg::Up => Self::Up,
        }
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Print the device and its ports, as ibv_devinfo does.
    Devinfo {
        /// Every attribute and the GID table (ibv_devinfo -v).
        #[arg(short, long)]
        verbose: bool,
        /// The soft HCA's completion vectors (an event queue, interrupt
        /// and DPC each), 2 to 64. Default: one per processor, at least 2.
        #[arg(long)]
        comp_vectors: Option<u32>,
    },
    /// Drive the control path end to end: objects, QPs connected in pairs,
    /// busy cases, rundown on close, unload under the verifier.
    Demo {
        /// Number of connected RC QP pairs.
        #[arg(long, default_value_t = 4)]
        pairs: u32,
    },
    /// perftest's tests between two endpoints over the soft HCA
    /// (send_lat, send_bw, write_lat, write_bw, read_lat, read_bw,
    /// atomic_lat, atomic_bw): in one process, or as perftest's server
    /// (--server) and client (given the server's address) over UDP.
    Perf {
        /// The test.
        test: String,
        /// Client: the server's IP address (as perftest takes it).
        server_addr: Option<std::net::IpAddr>,
        /// Listen for a client (perftest's server).
        #[arg(long, conflicts_with_all = ["server_addr", "connect"])]
        server: bool,
        /// Client: the server's IP address.
        #[arg(long, conflicts_with = "server_addr")]
        connect: Option<std::net::IpAddr>,
        /// The UDP port of the RoCEv2 wire (both sides).
        #[arg(long, default_value_t = irpverbs_host::udp::ROCE_PORT)]
        port: u16,
        /// The TCP port of the out-of-band exchange.
        #[arg(long, default_value_t = irpverbs_tools::perf::OOB_PORT)]
        oob_port: u16,
        /// This host's IP address (its HCA's); default: the address the
        /// out-of-band connection uses.
        #[arg(long)]
        bind: Option<std::net::IpAddr>,
        /// Record every RoCEv2 packet sent and received into this pcap
        /// file (Wireshark and tshark decode it as InfiniBand). Server and
        /// client mode.
        #[arg(long, value_name = "FILE")]
        pcap: Option<std::path::PathBuf>,
        /// Connect the QPs through the connection manager by address, as
        /// rdma_cm does (perftest's -R / --rdma_cm): the server listens on
        /// its address and the --oob-port number (TCP port space); QPN,
        /// PSN, GID, rkey and address travel in the CM's messages.
        #[arg(short = 'R', long = "cm", visible_alias = "rdma_cm")]
        cm: bool,
        /// Message size in bytes.
        #[arg(short = 's', long)]
        size: Option<u64>,
        /// All sizes from 2 bytes to 8 MiB.
        #[arg(short = 'a', long)]
        all: bool,
        /// Iterations per size.
        #[arg(short = 'n', long)]
        iters: Option<u64>,
        /// QP pairs.
        #[arg(short = 'q', long, default_value_t = 1)]
        qps: u32,
        /// Send up to this many bytes inline (default as perftest's: 236
        /// for send_lat, 220 for write_lat, 0 otherwise).
        #[arg(short = 'I', long)]
        inline_size: Option<u32>,
        /// Wait for completions with CQ events instead of busy polling.
        #[arg(short = 'e', long)]
        events: bool,
        /// Wait for CQ events through a completion channel, as perftest's
        /// -e does (implies --events).
        #[arg(long = "use-channel", visible_alias = "use_channel")]
        use_channel: bool,
        /// Operations in flight (bandwidth).
        #[arg(short = 't', long, default_value_t = 128)]
        tx_depth: u32,
        /// Work requests per post_send call, one doorbell per list
        /// (bandwidth; perftest's --post_list).
        #[arg(
            short = 'l',
            long = "post_list",
            visible_alias = "post-list",
            default_value_t = 1
        )]
        post_list: u32,
        /// Signal every cq_mod-th send (bandwidth, and the SEND and WRITE
        /// ping-pongs; perftest's -Q / --cq-mod).
        #[arg(
            short = 'Q',
            long = "cq-mod",
            visible_alias = "cq_mod",
            default_value_t = 32
        )]
        cq_mod: u32,
        /// Receive work requests per post_recv call, one doorbell per list
        /// (SEND bandwidth, the receiving side; perftest's
        /// --recv_post_list).
        #[arg(
            long = "recv_post_list",
            visible_alias = "recv-post-list",
            default_value_t = 1
        )]
        recv_post_list: u32,
        /// Path MTU in bytes (256 to 4096). Default 4096 in one process;
        /// between hosts, the largest that fits the IP path MTU.
        #[arg(short = 'm', long)]
        mtu: Option<u32>,
        /// The RC QPs' local ACK timeout, 4.096 us x 2^N (perftest's -u /
        /// --qp-timeout; 0 to 31). A server keeps its own.
        #[arg(short = 'u', long = "qp-timeout", visible_alias = "qp_timeout", default_value_t = 14,
              value_parser = clap::value_parser!(u8).range(0..=31))]
        qp_timeout: u8,
        /// Run the verifier.
        #[arg(long)]
        verifier: bool,
        /// Latency ping-pong on one thread (the driver's own cost).
        #[arg(long)]
        one_thread: bool,
        /// send_bw: the QPs take their receives from one SRQ (perftest's
        /// --use_srq).
        #[arg(long = "use_srq", visible_alias = "use-srq")]
        use_srq: bool,
        /// write_bw: RDMA WRITE with immediate, each consuming a receive
        /// on the peer (perftest's --write_with_imm).
        #[arg(long = "write_with_imm", visible_alias = "write-with-imm")]
        write_with_imm: bool,
    },
    /// The soft HCA's link model: takes port 1's link down (`down`), or
    /// down and up again (`up`), on a driver loaded in this process, and
    /// prints the async events a ULP receives and the port's state.
    Port {
        /// `down` or `up`.
        action: PortArg,
    },
    /// Benchmarks (figures, not pass/fail).
    Bench {
        #[command(subcommand)]
        what: BenchCmd,
    },
}

#[derive(Subcommand)]
enum BenchCmd {
    /// Control IOCTLs per second, verifier off and on.
    Control {
        /// IOCTLs per measurement.
        #[arg(long, default_value_t = 2_000_000)]
        ioctls: u64,
    },
    /// 8-byte RC SEND one-way latency by doorbell path, in one run: direct
    /// calls, the doorbell page with its thread polling, and the doorbell
    /// page with its thread asleep (each doorbell an IOCTL).
    Doorbells {
        /// Ping-pong iterations per measurement (three each, alternating).
        #[arg(long, default_value_t = 20_000)]
        iters: u64,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let engine: Engine = cli.engine.into();
    let result = match cli.command {
        Cmd::Devinfo {
            verbose,
            comp_vectors,
        } => devinfo(engine, verbose, comp_vectors),
        Cmd::Demo { pairs } => irpverbs_tools::demo::run(pairs, engine).map(|r| print!("{r}")),
        Cmd::Port { action } => {
            irpverbs_tools::port::run(action.into(), engine).map(|r| print!("{r}"))
        }
        Cmd::Perf {
            test,
            server_addr,
            server,
            connect,
            port,
            oob_port,
            bind,
            pcap,
            cm,
            size,
            all,
            iters,
            qps,
            inline_size,
            events,
            use_channel,
            tx_depth,
            post_list,
            recv_post_list,
            cq_mod,
            mtu,
            qp_timeout,
            verifier,
            one_thread,
            use_srq,
            write_with_imm,
        } => perf(
            engine,
            (
                cli.doorbells.into(),
                cli.doorbell_poll_us.map(std::time::Duration::from_micros),
            ),
            &test,
            Remote {
                server,
                connect: connect.or(server_addr),
                port,
                oob_port,
                bind,
                pcap,
                cm,
            },
            size,
            all,
            iters,
            qps,
            inline_size,
            (events, use_channel),
            (tx_depth, post_list, recv_post_list, cq_mod),
            (mtu, qp_timeout),
            verifier,
            (one_thread, use_srq, write_with_imm),
        ),
        Cmd::Bench {
            what: BenchCmd::Control { ioctls },
        } => {
            let rates = irpverbs_tools::bench::control_suite(ioctls, &[engine], &[false, true]);
            print!("{}", irpverbs_tools::bench::format_rates(&rates));
            Ok(())
        }
        Cmd::Bench {
            what: BenchCmd::Doorbells { iters },
        } => irpverbs_tools::bench::doorbell_latency(iters).map(|r| print!("{r}")),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("irpverbs: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn devinfo(engine: Engine, verbose: bool, comp_vectors: Option<u32>) -> Result<(), String> {
    let mut config = HostDeviceConfig {
        engine,
        ..HostDeviceConfig::default()
    };
    if let Some(n) = comp_vectors {
        config.soft.num_comp_vectors = n;
    }
    let dev = HostDevice::new(config).map_err(|s| format!("device: {}", status_name(s)))?;
    let file = dev
        .open(FILE_READ_ACCESS | FILE_WRITE_ACCESS)
        .map_err(|s| status_name(s).to_string())?;
    let c = Client::new(Box::new(file));
    let text = irpverbs_verbs::devinfo::devinfo(&c, "irpverbs0", verbose)
        .map_err(|s| status_name(s).to_string())?;
    print!("{text}");
    drop(c);
    dev.unload();
    Ok(())
}

/// Where the endpoints of `perf` are.
struct Remote {
    server: bool,
    connect: Option<std::net::IpAddr>,
    port: u16,
    oob_port: u16,
    bind: Option<std::net::IpAddr>,
    pcap: Option<std::path::PathBuf>,
    cm: bool,
}

#[allow(clippy::too_many_arguments, clippy::fn_params_excessive_bools)]
fn perf(
    engine: Engine,
    (doorbells, doorbell_poll_window): (UserDoorbells, Option<std::time::Duration>),
    test: &str,
    remote: Remote,
    size: Option<u64>,
    all: bool,
    iters: Option<u64>,
    qps: u32,
    inline: Option<u32>,
    (events, use_channel): (bool, bool),
    (tx_depth, post_list, recv_post_list, cq_mod): (u32, u32, u32, u32),
    (mtu, qp_timeout): (Option<u32>, u8),
    verifier: bool,
    (one_thread, use_srq, write_with_imm): (bool, bool, bool),
) -> Result<(), String> {
    use irpverbs_tools::perf::{PerfConfig, Test, format, run};
    let test = Test::parse(test).ok_or_else(|| {
        let names: Vec<&str> = Test::ALL.iter().map(|t| t.name()).collect();
        format!("unknown test {test:?}; one of {}", names.join(", "))
    })?;
    let mut cfg = PerfConfig::new(test);
    if let Some(s) = size {
        cfg.sizes = vec![s];
    }
    if all {
        cfg.sizes = PerfConfig::sweep();
        if matches!(test, Test::AtomicLat | Test::AtomicBw) {
            cfg.sizes = vec![8];
        }
    }
    if let Some(n) = iters {
        cfg.iters = n;
    }
    cfg.mtu = match mtu.unwrap_or(4096) {
        256 => irpverbs_abi::IV_MTU_256,
        512 => irpverbs_abi::IV_MTU_512,
        1024 => irpverbs_abi::IV_MTU_1024,
        2048 => irpverbs_abi::IV_MTU_2048,
        4096 => irpverbs_abi::IV_MTU_4096,
        m => return Err(format!("MTU {m}: one of 256, 512, 1024, 2048, 4096")),
    };
    if qps == 0 || tx_depth == 0 || post_list == 0 || recv_post_list == 0 || cq_mod == 0 {
        return Err("qps, tx depth, post lists and cq-mod must be at least 1".into());
    }
    cfg.qps = qps;
    if let Some(n) = inline {
        cfg.inline = n;
    }
    cfg.events = events || use_channel;
    cfg.use_channel = use_channel;
    cfg.tx_depth = tx_depth;
    cfg.post_list = post_list;
    cfg.recv_post_list = recv_post_list;
    cfg.cq_mod = cq_mod;
    cfg.qp_timeout = qp_timeout;
    cfg.engine = engine;
    cfg.doorbells = doorbells;
    cfg.doorbell_poll_window = doorbell_poll_window;
    cfg.verifier = verifier;
    cfg.one_thread = one_thread;
    cfg.use_srq = use_srq;
    cfg.write_with_imm = write_with_imm;
    cfg.check()?;
    if remote.pcap.is_some() && !remote.server && remote.connect.is_none() {
        return Err("--pcap captures the UDP wire: use it with --server or a client".into());
    }
    if remote.cm && !remote.server && remote.connect.is_none() {
        return Err("--cm connects a client to a server: use it with --server or a client".into());
    }
    if remote.server || remote.connect.is_some() {
        if one_thread {
            return Err("--one-thread runs both endpoints in one process".into());
        }
        let rc = irpverbs_tools::perf::RemoteConfig {
            udp_port: remote.port,
            oob_port: remote.oob_port,
            bind: remote.bind,
            mtu_given: mtu.is_some(),
            pcap: remote.pcap,
            cm: remote.cm,
            ..irpverbs_tools::perf::RemoteConfig::default()
        };
        let run = match remote.connect {
            Some(server) => irpverbs_tools::perf::connect(&cfg, server, &rc)?,
            None => irpverbs_tools::perf::serve(&cfg, &rc)?,
        };
        print!("{}", run.format());
        return Ok(());
    }
    let reports = run(&cfg)?;
    print!("{}", format(&cfg, &reports));
    Ok(())
}
