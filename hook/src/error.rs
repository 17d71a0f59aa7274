//! The error a create-path command (the hooks) and the node context can end with,
//! and its exit status: 2 for bad configuration or usage, 1 for everything else.

use gpuslice_config::ConfigError;

/// Why a subcommand failed; each variant prints as one line.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Registry(Box<gpuslice_registry::RegistryError>),
    #[error(transparent)]
    Spec(#[from] gpuslice_cdi::SpecFileError),
    #[error("cannot write to standard output: {0}")]
    Stdout(#[from] crate::output::OutputError),
    #[error(transparent)]
    Hook(Box<crate::create::hooks::HookError>),
}

impl From<crate::create::hooks::HookError> for Error {
    fn from(e: crate::create::hooks::HookError) -> Self {
        Error::Hook(Box::new(e))
    }
}

impl From<gpuslice_registry::RegistryError> for Error {
    fn from(e: gpuslice_registry::RegistryError) -> Self {
        Error::Registry(Box::new(e))
    }
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
