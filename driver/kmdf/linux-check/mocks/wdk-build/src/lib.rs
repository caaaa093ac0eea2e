//! MOCK of wdk-build 0.6.0 for linux-check/check.sh: the items irpverbs-kmdf's
//! build script uses, with wdk-build's signatures. Configures nothing.
use std::path::PathBuf;

#[derive(Debug)]
pub struct ConfigError;

pub struct Config;

impl Config {
    pub fn from_env_auto() -> Result<Self, ConfigError> {
        Ok(Self)
    }
    pub fn include_paths(&self) -> Result<impl Iterator<Item = PathBuf>, ConfigError> {
        Ok(std::iter::empty())
    }
    pub fn preprocessor_definitions(&self) -> impl Iterator<Item = (String, Option<String>)> {
        std::iter::empty()
    }
    pub fn configure_binary_build(&self) -> Result<(), ConfigError> {
        Ok(())
    }
}

pub fn configure_wdk_binary_build() -> Result<(), ConfigError> {
    Ok(())
}
