//! The error every `gpuslice` subcommand can end with, and its exit status: 2 for bad
//! configuration or usage, 1 for everything else.

use gpuslice_config::ConfigError;

use crate::cdigen::GenerateError;

/// Why a subcommand failed; each variant prints as one line.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Generate(#[from] GenerateError),
    #[error(transparent)]
    Registry(#[from] gpuslice_registry::RegistryError),
    #[error(transparent)]
    Spec(#[from] gpuslice_cdi::SpecFileError),
    #[error("cannot write to standard output: {0}")]
    Stdout(std::io::Error),
    #[error(transparent)]
    Inventory(#[from] gpuslice_driver::InventoryError),
}

impl Error {
    /// The process exit status for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Config(_) => 2,
            _ => 1,
        }
    }
}
