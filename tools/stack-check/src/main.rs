//! `stack-check`: holds a built binary that instantiates the driver to the
//! kernel stack budget (see the library's documentation and
//! docs/stack-budget.md).
//!
//! ```text
//! stack-check [--debug] [--report-only] [--top N] [--objdump PATH] BINARY
//! stack-check [--debug] ... --disassembly FILE
//! ```
//!
//! `--debug` applies the debug build's frame budget (4 KiB instead of 2 KiB).
//! Exits 1 when a frame or a chain is over the budget or an entry is missing
//! (0 with `--report-only`), 2 on a usage or objdump error.

use std::process::{Command, ExitCode};

use std::collections::HashMap;

use irpverbs_stack_check::{Budget, DEFAULT_ENTRIES, Graph, parse, parse_relocations};

const USAGE: &str = "usage: stack-check [--debug] [--report-only] [--top N] [--objdump PATH] (BINARY | --disassembly FILE)";

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("stack-check: {e}\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<ExitCode, String> {
    let mut budget = Budget::RELEASE;
    let mut report_only = false;
    let mut top = 15usize;
    let mut objdump = String::from("objdump");
    let mut binary = None;
    let mut disassembly = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--debug" => budget = Budget::DEBUG,
            "--report-only" => report_only = true,
            "--top" => {
                top = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .ok_or("--top takes a number")?;
            }
            "--objdump" => objdump = args.next().ok_or("--objdump takes a path")?,
            "--disassembly" => disassembly = Some(args.next().ok_or("--disassembly takes a file")?),
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(ExitCode::SUCCESS);
            }
            a if a.starts_with('-') => return Err(format!("unknown option {a}")),
            _ => binary = Some(arg),
        }
    }
    let (what, text, relocations) = match (binary, disassembly) {
        (Some(bin), None) => {
            let text = objdump_output(&objdump, &["-d", "--no-show-raw-insn", "-C", &bin])?;
            let relocs = objdump_output(&objdump, &["-R", &bin])?;
            (bin, text, parse_relocations(&relocs))
        }
        (None, Some(file)) => {
            let text = std::fs::read_to_string(&file).map_err(|e| format!("{file}: {e}"))?;
            (file, text, HashMap::new())
        }
        _ => return Err("give one BINARY or --disassembly FILE".into()),
    };
    let funcs = parse(&text);
    if funcs.is_empty() {
        return Err(format!("no functions in the disassembly of {what}"));
    }
    let report = Graph::new(funcs, &relocations).check(&DEFAULT_ENTRIES, budget);
    println!("stack-check: {what}");
    print!("{}", report.render(budget, top));
    Ok(if report.passes(budget) || report_only {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The standard output of `objdump ARGS`.
fn objdump_output(objdump: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(objdump)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {objdump}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{objdump} {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
