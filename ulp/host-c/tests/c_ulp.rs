//! Builds the C ULP tests in `tests/c` with the system C compiler against
//! `include/` and the host C library (`libirpverbs_host_c`, a cdylib), and runs them with the soft
//! HCA's firmware inline and on its own thread:
//! - `ulp_control.c`: the control path (overlapped IOCTLs, completion port);
//! - `ulp_speed.c`: the user-mode speed-path library without data movement;
//! - `kernel_ulp.c`: a kernel ULP's internal IOCTLs and direct-call table;
//! - `kernel_cm.c`: a kernel ULP connecting and accepting through CEP
//!   callbacks of the table (version 2), then moving data;
//! - `ulp_notify.c`: events, `WaitForSingleObject`, and the completion port
//!   suppression of an `hEvent` with its low bit set;
//! - `ulp_data.c`: two RC QPs in loopback moving data (needs the transport
//!   engine), and a completion channel's events;
//! - `ulp_alloc_sweep.c`: a control scenario run once per allocation with
//!   that allocation refused (`IRPVERBS_FAIL_NTH_ALLOC`), every verb
//!   failing cleanly and working when issued again.
//!
//! The user-mode ones also run with `IRPVERBS_DOORBELLS=page`: the library
//! rings through the file's doorbell page and the device's doorbell thread
//! scans it, the way a ULP's doorbells reach irpverbs.sys.
//!
//! The user-mode ones are Windows code too: they also build for Windows x64
//! with MinGW when it is installed.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repo root")
}

/// The directory holding `libirpverbs_host_c.so`. `cargo test` builds the
/// C library crate as an rlib only, so the cdylib is built here, with the same
/// cargo and profile, into its own target directory (no lock contention with
/// the running `cargo test`).
fn lib_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("capi");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "--quiet", "-p", "irpverbs-host-c", "--lib"])
            .arg("--manifest-path")
            .arg(repo().join("Cargo.toml"))
            .arg("--target-dir")
            .arg(&target)
            .status()
            .expect("run cargo build for the host cdylib");
        assert!(status.success(), "cargo build of the host cdylib failed");
        let dir = target.join("debug");
        assert!(
            dir.join("libirpverbs_host_c.so").exists()
                || dir.join("libirpverbs_host_c.dylib").exists(),
            "host cdylib not found in {}",
            dir.display()
        );
        dir
    })
    .clone()
}

/// Builds `tests/c/<name>.c` once per test binary (tests run in parallel and
/// must not rewrite an executable another one is running).
fn build(name: &'static str) -> PathBuf {
    static BUILT: std::sync::Mutex<Vec<(&'static str, PathBuf)>> =
        std::sync::Mutex::new(Vec::new());
    let mut built = BUILT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, p)) = built.iter().find(|(n, _)| *n == name) {
        return p.clone();
    }
    let exe = compile(name);
    built.push((name, exe.clone()));
    exe
}

fn compile(name: &str) -> PathBuf {
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let root = repo();
    let lib = lib_dir();
    let status = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1"])
        .arg("-I")
        .arg(root.join("include"))
        .arg(root.join("tests/c").join(format!("{name}.c")))
        .arg("-o")
        .arg(&out)
        .arg("-L")
        .arg(&lib)
        .arg("-lirpverbs_host_c")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .status()
        .expect("run the C compiler");
    assert!(status.success(), "{cc} failed to build {name}.c");
    out
}

fn run(exe: &Path, engine: &str) {
    run_with(exe, engine, "direct");
}

/// The loader's library path variable, with the host cdylib's directory
/// first: cargo runs tests with its deps folder on the library path, which
/// may hold a `libirpverbs_host_c.so` from another build (`cargo build`):
/// the loader would prefer it to the rpath (RUNPATH).
fn library_path() -> (&'static str, std::ffi::OsString) {
    let lib = lib_dir();
    let var = if cfg!(target_os = "macos") {
        "DYLD_LIBRARY_PATH"
    } else {
        "LD_LIBRARY_PATH"
    };
    let path = std::env::join_paths(
        std::iter::once(lib).chain(std::env::var_os(var).iter().flat_map(std::env::split_paths)),
    )
    .expect("library path");
    (var, path)
}

/// Runs `exe` with the firmware `engine` and user-mode `doorbells`
/// (`direct`, or `page`: through each file's doorbell page, as on Windows).
fn run_with(exe: &Path, engine: &str, doorbells: &str) {
    run_on(exe, engine, doorbells, "soft");
}

/// [`run_with`] over `backend` (`soft`, or `model`: the model HCA, reached
/// only through the PCI seam).
fn run_on(exe: &Path, engine: &str, doorbells: &str, backend: &str) {
    let (var, path) = library_path();
    let out = Command::new(exe)
        .env(var, path)
        .env("IRPVERBS_ENGINE", engine)
        .env("IRPVERBS_VERIFIER", "1")
        .env("IRPVERBS_DOORBELLS", doorbells)
        .env("IRPVERBS_BACKEND", backend)
        .output()
        .expect("run the C test");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{} ({backend}, {engine}, {doorbells} doorbells) failed:\n{stdout}\n{stderr}",
        exe.display()
    );
    assert!(stdout.contains(" passed, 0 failed"), "no summary: {stdout}");
}

#[test]
fn c_ulp_control_path_inline_engine() {
    run(&build("ulp_control"), "inline");
}

#[test]
fn c_ulp_control_path_thread_engine() {
    run(&build("ulp_control"), "thread");
}

#[test]
fn c_ulp_notify_inline_engine() {
    run(&build("ulp_notify"), "inline");
}

#[test]
fn c_ulp_notify_thread_engine() {
    run(&build("ulp_notify"), "thread");
}

#[test]
fn c_ulp_speed_path_inline_engine() {
    run(&build("ulp_speed"), "inline");
}

#[test]
fn c_ulp_speed_path_thread_engine() {
    run(&build("ulp_speed"), "thread");
}

#[test]
fn c_kernel_ulp_inline_engine() {
    run(&build("kernel_ulp"), "inline");
}

#[test]
fn c_kernel_ulp_thread_engine() {
    run(&build("kernel_ulp"), "thread");
}

#[test]
fn c_kernel_cm_callbacks_inline_engine() {
    run(&build("kernel_cm"), "inline");
}

#[test]
fn c_kernel_cm_callbacks_thread_engine() {
    run(&build("kernel_cm"), "thread");
}

#[test]
fn c_ulp_data_inline_engine() {
    run(&build("ulp_data"), "inline");
}

#[test]
fn c_ulp_data_thread_engine() {
    run(&build("ulp_data"), "thread");
}

#[test]
fn c_ulp_speed_path_doorbell_page() {
    run_with(&build("ulp_speed"), "inline", "page");
}

#[test]
fn c_ulp_data_doorbell_page_inline_engine() {
    run_with(&build("ulp_data"), "inline", "page");
}

#[test]
fn c_ulp_data_doorbell_page_thread_engine() {
    run_with(&build("ulp_data"), "thread", "page");
}

/// The user-mode C ULPs are Windows programs: they compile for Windows x64
/// against `<windows.h>` (what `.ci/run` checks for `ulp_control.c`).
#[test]
fn c_ulps_compile_for_windows_x64_with_mingw() {
    let mingw = "x86_64-w64-mingw32-gcc";
    if Command::new(mingw).arg("--version").output().is_err() {
        eprintln!("skipping: {mingw} is not installed");
        return;
    }
    let root = repo();
    for name in [
        "ulp_control",
        "ulp_notify",
        "ulp_speed",
        "ulp_data",
        "ulp_alloc_sweep",
    ] {
        let out = Command::new(mingw)
            .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-c", "-o"])
            .arg(PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}.obj")))
            .arg("-I")
            .arg(root.join("include"))
            .arg(root.join("tests/c").join(format!("{name}.c")))
            .output()
            .expect("run MinGW");
        assert!(
            out.status.success(),
            "{name}.c does not build for Windows x64:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Every C test over the model HCA (a mini-driver over the PCI seam).
#[test]
fn c_ulps_over_the_model_backend() {
    for test in [
        "ulp_control",
        "ulp_notify",
        "ulp_speed",
        "ulp_data",
        "kernel_ulp",
        "kernel_cm",
    ] {
        run_on(&build(test), "inline", "direct", "model");
    }
}

/// What one run of `ulp_alloc_sweep` did.
#[derive(Debug)]
struct SweepRun {
    nth: u64,
    /// Exit code (`None`: killed by a signal, an abort).
    code: Option<i32>,
    /// Where the refused allocation was made, if it was refused.
    site: Option<String>,
    /// Verbs the program issued once more after a refusal.
    retried: bool,
    stdout: String,
    stderr: String,
}

/// Runs `exe` with `IRPVERBS_FAIL_NTH_ALLOC=nth` (0: count only).
fn sweep_run(exe: &Path, nth: u64) -> SweepRun {
    let (var, path) = library_path();
    let out = Command::new(exe)
        .env(var, path)
        .env("IRPVERBS_ENGINE", "inline")
        .env("IRPVERBS_VERIFIER", "1")
        .env("IRPVERBS_DOORBELLS", "direct")
        .env("IRPVERBS_BACKEND", "soft")
        .env("IRPVERBS_FAIL_NTH_ALLOC", nth.to_string())
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run the C test");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let site = stderr.lines().find_map(|l| {
        l.strip_prefix("irpverbs: allocation ")
            .and_then(|r| r.split_once(" at "))
            .map(|(_, site)| site.to_owned())
    });
    SweepRun {
        nth,
        code: out.status.code(),
        site,
        retried: stdout.contains("retry: "),
        stdout,
        stderr,
    }
}

/// The allocations the scenario makes once the device is loaded: what
/// `IrpverbsHostUnload` printed.
fn counted(run: &SweepRun) -> u64 {
    run.stderr
        .lines()
        .find_map(|l| {
            l.strip_prefix("irpverbs: ")?
                .strip_suffix(" allocations counted")?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no count:\n{}\n{}", run.stdout, run.stderr))
}

/// Which side of the driver's boundary a site is: the driver crates, or
/// what stands in for Windows around them (the host platform and device,
/// the Win32 subset and speed-path library).
fn side_of(site: &str) -> &'static str {
    const DRIVER: &[&str] = &[
        "irpverbs_core::",
        "irpverbs_cm::",
        "irpverbs_soft::",
        "irpverbs_ring::",
        "irpverbs_kernel_table::",
        "irpverbs_model::",
    ];
    if DRIVER.iter().any(|c| site.starts_with(c)) {
        "driver crates"
    } else {
        "Win32 subset and host"
    }
}

/// The black-box allocation sweep of a C ULP (`ulp_alloc_sweep.c`): the
/// program runs once counting the allocations the process makes once the
/// device is loaded (T), then once per N in 1..=T with the Nth refused
/// (`IRPVERBS_FAIL_NTH_ALLOC=N`, two runs at a time). Every run must exit
/// 0 (no abort, no signal, every verb refused once succeeded when issued
/// again, every result right, the driver's unload found no leak and no
/// verifier violation) and must have reached the refused allocation. It
/// prints T, the runs, and the sites reached, by side.
#[test]
fn c_ulp_allocation_sweep() {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU64, Ordering};

    let exe = build("ulp_alloc_sweep");
    let first = sweep_run(&exe, 0);
    assert_eq!(
        first.code,
        Some(0),
        "the counting run failed:\n{}\n{}",
        first.stdout,
        first.stderr
    );
    let total = counted(&first);
    assert!(total > 0, "nothing counted");
    let next = AtomicU64::new(1);
    let runs = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                loop {
                    let nth = next.fetch_add(1, Ordering::Relaxed);
                    if nth > total {
                        break;
                    }
                    let run = sweep_run(&exe, nth);
                    runs.lock().unwrap().push(run);
                }
            });
        }
    });
    let mut runs = runs.into_inner().unwrap();
    runs.sort_by_key(|r| r.nth);
    let mut sites: BTreeMap<(&str, String), (usize, usize)> = BTreeMap::new();
    let mut bad = Vec::new();
    let mut retried = 0;
    for run in &runs {
        let ok = run.code == Some(0) && run.site.is_some();
        retried += usize::from(run.retried);
        if let Some(site) = &run.site {
            let entry = sites.entry((side_of(site), site.clone())).or_insert((0, 0));
            entry.0 += 1;
            entry.1 += usize::from(!ok);
        }
        if !ok {
            bad.push(run);
        }
    }
    let aborted = runs.iter().filter(|r| r.code.is_none()).count();
    println!(
        "ulp_alloc_sweep: {total} allocations after the device loaded, {} runs: {} clean \
         ({retried} with a verb issued again), {} failed ({aborted} aborted)",
        runs.len(),
        runs.len() - bad.len(),
        bad.len()
    );
    for side in ["Win32 subset and host", "driver crates"] {
        let reached: Vec<_> = sites.iter().filter(|((s, _), _)| *s == side).collect();
        let failing = reached.iter().filter(|(_, (_, f))| *f > 0).count();
        println!(
            "  {side}: {} sites reached, {failing} failing",
            reached.len()
        );
        for ((_, site), (n, f)) in reached {
            println!("    {n:4} refused, {f:4} failed  {site}");
        }
    }
    if let Some(run) = bad.first() {
        println!(
            "first failing run: N={} exit {:?}, site {:?}\n{}\n{}",
            run.nth, run.code, run.site, run.stdout, run.stderr
        );
    }
    if SWEEP_STRICT {
        assert!(
            bad.is_empty(),
            "{} of {} runs failed",
            bad.len(),
            runs.len()
        );
    }
}

/// Whether [`c_ulp_allocation_sweep`] fails on a run that does not end
/// cleanly (off while the sweep only measures).
const SWEEP_STRICT: bool = true;
