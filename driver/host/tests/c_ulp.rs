//! Builds the C ULP tests in `tests/c` with the system C compiler against
//! `include/` and the host library (cdylib), and runs them with the soft
//! HCA's firmware inline and on its own thread.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repo root")
}

/// The directory holding `libirpverbs_host.so` (target/<profile>).
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test exe");
    let deps = exe.parent().expect("deps dir");
    let dir = deps.parent().expect("profile dir").to_path_buf();
    assert!(
        dir.join("libirpverbs_host.so").exists() || dir.join("libirpverbs_host.dylib").exists(),
        "host cdylib not found in {}",
        dir.display()
    );
    dir
}

fn build(name: &str) -> PathBuf {
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
        .arg("-lirpverbs_host")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .status()
        .expect("run the C compiler");
    assert!(status.success(), "{cc} failed to build {name}.c");
    out
}

fn run(exe: &Path, engine: &str) {
    let out = Command::new(exe)
        .env("IRPVERBS_ENGINE", engine)
        .env("IRPVERBS_VERIFIER", "1")
        .output()
        .expect("run the C test");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{} ({engine}) failed:\n{stdout}\n{stderr}",
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
