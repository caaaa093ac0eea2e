//! What the library's tests share: the repository and the built library.
#![allow(dead_code, reason = "each test binary uses a part of it")]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

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
