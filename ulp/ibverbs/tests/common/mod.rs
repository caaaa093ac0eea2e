//! What the library's tests share: the repository and the built library.
#![allow(dead_code, reason = "each test binary uses a part of it")]

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The repository's root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repo root")
}

/// The directory holding `libibverbs.so.1`, built once per test binary by
/// `ulp/ibverbs/link.sh` with the running cargo, into the target directory
/// the host C library's tests build theirs in (so that the two share their
/// dependencies' builds).
pub fn lib_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("capi");
        let out = Command::new("bash")
            .arg(repo().join("ulp/ibverbs/link.sh"))
            .arg("--target-dir")
            .arg(&target)
            .stderr(Stdio::inherit())
            .output()
            .expect("run ulp/ibverbs/link.sh");
        assert!(out.status.success(), "ulp/ibverbs/link.sh failed");
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        assert!(
            dir.join("libibverbs.so.1").exists(),
            "no libibverbs.so.1 in {}",
            dir.display()
        );
        dir
    })
    .clone()
}

/// True when `tool` runs; otherwise the test skips (it says so), except in
/// CI (`CI=true`), where the tool's absence fails it.
pub fn have(tool: &str, package: &str) -> bool {
    if Command::new(tool).arg("--version").output().is_ok() {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{tool} is missing (apt-get install {package})"
    );
    eprintln!("skipping: {tool} is not installed ({package})");
    false
}

/// The program's path, or None (the test skips) when it is not installed
/// (`ibverbs-utils`, `perftest`, `rdmacm-utils`); in CI its absence is a failure.
pub fn program(name: &str) -> Option<PathBuf> {
    let path = PathBuf::from("/usr/bin").join(name);
    if path.exists() {
        return Some(path);
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{name} is missing (apt-get install ibverbs-utils perftest rdmacm-utils)"
    );
    eprintln!("skipping: {name} is not installed (ibverbs-utils, perftest, rdmacm-utils)");
    None
}

pub fn command(exe: &Path, addr: Option<&str>) -> Command {
    let mut cmd = Command::new(exe);
    cmd.env("LD_LIBRARY_PATH", lib_dir())
        .env_remove("IRPVERBS_ENGINE")
        .env_remove("IRPVERBS_BACKEND")
        .env_remove("IRPVERBS_DOORBELLS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    match addr {
        Some(a) => cmd.env("IRPVERBS_ADDR", a),
        None => cmd.env_remove("IRPVERBS_ADDR"),
    };
    cmd
}

/// Waits for `child` at most `limit` (killing it then): (success, stdout,
/// stderr).
pub fn finish(mut child: Child, what: &str, limit: Duration) -> (bool, String, String) {
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    let mut err = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    if status.is_none() {
        err += &format!("\n{what}: no exit within {limit:?} (killed)");
    }
    (status.is_some_and(|s| s.success()), out, err)
}

/// (symbol, version) of the defined symbols `objdump -T` lists in `path`
/// under a version containing `node`, or of the undefined ones
/// (`undefined`).
pub fn dynamic_symbols(path: &Path, undefined: bool, node: &str) -> BTreeSet<(String, String)> {
    let out = Command::new("objdump")
        .arg("-T")
        .arg(path)
        .output()
        .expect("run objdump");
    assert!(out.status.success(), "objdump -T {}", path.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(node) && l.contains("*UND*") == undefined)
        .filter_map(|l| {
            let mut f = l.split_whitespace().rev();
            let name = f.next()?;
            let version = f.next()?.trim_start_matches('(').trim_end_matches(')');
            // The version nodes themselves are listed as symbols too.
            (name != version).then(|| (name.to_owned(), version.to_owned()))
        })
        .collect()
}
pub mod windows;
