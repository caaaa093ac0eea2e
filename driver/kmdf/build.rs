//! Configures the driver's link against the WDK (KMDF libraries, entry
//! point, subsystem) from `[package.metadata.wdk]` in Cargo.toml.

fn main() -> Result<(), wdk_build::ConfigError> {
    wdk_build::configure_wdk_binary_build()
}
