//! The error every `gpuslice` subcommand can end with, and its exit status: 2 for bad
//! configuration or usage, 1 for everything else.

use gpuslice_config::ConfigError;

use crate::commands::cdi::GenerateError;

/// Why a subcommand failed; each variant prints as one line.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Generate(#[from] GenerateError),
    #[error(transparent)]
    Registry(Box<gpuslice_registry::RegistryError>),
    #[error(transparent)]
    Spec(#[from] gpuslice_cdi::SpecFileError),
    #[error("cannot write to standard output: {0}")]
    Stdout(std::io::Error),
    #[error(transparent)]
    Inventory(#[from] gpuslice_driver::InventoryError),
    #[error(transparent)]
    Hook(Box<crate::create::hooks::HookError>),
    #[error(transparent)]
    Podman(#[from] crate::configure::podman::PodmanError),
    #[error(transparent)]
    Registration(#[from] crate::configure::registration::RegistrationError),
    #[error(transparent)]
    Containerd(Box<crate::configure::containerd::ContainerdError>),
    #[error(transparent)]
    Crio(Box<crate::configure::crio::CrioError>),
    #[error(transparent)]
    Docker(Box<crate::configure::docker::DockerError>),
    #[error(transparent)]
    Serve(#[from] crate::serve::ServeError),
    #[cfg(feature = "kubernetes")]
    #[error(transparent)]
    KubeletPlugin(Box<crate::kubelet_plugin::KubeletPluginError>),
    #[cfg(feature = "kubernetes")]
    #[error(transparent)]
    Console(#[from] gpuslice_console::web::WebError),
}

#[cfg(feature = "kubernetes")]
impl From<crate::kubelet_plugin::KubeletPluginError> for Error {
    fn from(e: crate::kubelet_plugin::KubeletPluginError) -> Self {
        Error::KubeletPlugin(Box::new(e))
    }
}

impl From<crate::create::hooks::HookError> for Error {
    fn from(e: crate::create::hooks::HookError) -> Self {
        Error::Hook(Box::new(e))
    }
}

impl From<crate::configure::containerd::ContainerdError> for Error {
    fn from(e: crate::configure::containerd::ContainerdError) -> Self {
        Error::Containerd(Box::new(e))
    }
}

impl From<crate::configure::crio::CrioError> for Error {
    fn from(e: crate::configure::crio::CrioError) -> Self {
        Error::Crio(Box::new(e))
    }
}

impl From<crate::configure::docker::DockerError> for Error {
    fn from(e: crate::configure::docker::DockerError) -> Self {
        Error::Docker(Box::new(e))
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
