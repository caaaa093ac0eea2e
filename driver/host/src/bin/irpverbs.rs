//! `irpverbs`: tools over the driver running in host mode on a soft HCA.

use clap::{Parser, Subcommand, ValueEnum};
use irpverbs_abi::{FILE_READ_ACCESS, FILE_WRITE_ACCESS, status_name};
use irpverbs_host::{Engine, HostDevice, HostDeviceConfig};
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
    #[command(subcommand)]
    command: Cmd,
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

#[derive(Subcommand)]
enum Cmd {
    /// Print the device and its ports, as ibv_devinfo does.
    Devinfo {
        /// Every attribute and the GID table (ibv_devinfo -v).
        #[arg(short, long)]
        verbose: bool,
    },
    /// Drive the control path end to end: objects, QPs connected in pairs,
    /// busy cases, rundown on close, unload under the verifier.
    Demo {
        /// Number of connected RC QP pairs.
        #[arg(long, default_value_t = 4)]
        pairs: u32,
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
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let engine: Engine = cli.engine.into();
    let result = match cli.command {
        Cmd::Devinfo { verbose } => devinfo(engine, verbose),
        Cmd::Demo { pairs } => irpverbs_host::demo::run(pairs, engine).map(|r| print!("{r}")),
        Cmd::Bench {
            what: BenchCmd::Control { ioctls },
        } => {
            let rates = irpverbs_host::bench::control_suite(ioctls, &[engine]);
            print!("{}", irpverbs_host::bench::format_rates(&rates));
            Ok(())
        }
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("irpverbs: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn devinfo(engine: Engine, verbose: bool) -> Result<(), String> {
    let dev = HostDevice::new(HostDeviceConfig {
        engine,
        ..HostDeviceConfig::default()
    })
    .map_err(|s| format!("device: {}", status_name(s)))?;
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
