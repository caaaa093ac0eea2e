#[derive(Debug)]
pub struct ConfigError;
pub fn configure_wdk_binary_build() -> Result<(), ConfigError> { Ok(()) }
