//! Configures the driver's link against the WDK (KMDF libraries, entry
//! point, subsystem, `/INTEGRITYCHECK`) from `[package.metadata.wdk]` in
//! Cargo.toml, and compiles `src/seh.c` (the `__try` / `__except` shim
//! around the two kernel calls that raise exceptions) with the WDK's
//! compiler, headers and preprocessor definitions into a static library
//! linked into the driver.
//!
//! The shim is compiled only for Windows targets: it is MSVC C with SEH. The
//! Linux type-check (`linux-check/check.sh`) never links, so it needs none.

fn main() -> Result<(), wdk_build::ConfigError> {
    let config = wdk_build::Config::from_env_auto()?;
    println!("cargo::rerun-if-changed=src/seh.c");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("windows") {
        let mut shim = cc::Build::new();
        for (name, value) in config.preprocessor_definitions() {
            shim.define(&name, value.as_deref());
        }
        shim.includes(config.include_paths()?)
            // Kernel-mode code generation (what the WDK's MSBuild props pass).
            .flag("/kernel")
            .file("src/seh.c")
            .compile("irpverbs_seh");
        // PsSetCreateProcessNotifyRoutineEx (src/process.rs) refuses a
        // routine in an image without IMAGE_DLLCHARACTERISTICS_FORCE_INTEGRITY
        // (STATUS_ACCESS_DENIED, and DriverEntry fails): link with
        // /INTEGRITYCHECK. wdk-build's binary configuration passes it too;
        // stating it here keeps the driver's requirement in the driver.
        println!("cargo::rustc-cdylib-link-arg=/INTEGRITYCHECK");
    }
    config.configure_binary_build()
}
