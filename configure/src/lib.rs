//! `gpuslice configure <engine>`: registering gpuslice with container engines.

pub mod args;
pub mod containerd;
pub mod crio;
pub mod docker;
pub mod files;
pub mod podman;
pub mod registration;
pub mod tomldoc;

use std::path::{Path, PathBuf};

use crate::args::ConfigureCommand;
use crate::files::{FileError, Plan};
use crate::registration::{Registration, RegistrationError};
use gpuslice_hook::node::NodeContext;
use gpuslice_hook::output::out;

/// `gpuslice configure` failed.
#[derive(Debug, thiserror::Error)]
pub enum ConfigureError {
    #[error(transparent)]
    Podman(#[from] podman::PodmanError),
    #[error(transparent)]
    Registration(#[from] RegistrationError),
    #[error(transparent)]
    Containerd(Box<containerd::ContainerdError>),
    #[error(transparent)]
    Crio(Box<crio::CrioError>),
    #[error(transparent)]
    Docker(Box<docker::DockerError>),
    #[error("cannot write to standard output: {0}")]
    Output(#[from] gpuslice_hook::output::OutputError),
}

impl From<containerd::ContainerdError> for ConfigureError {
    fn from(e: containerd::ContainerdError) -> Self {
        ConfigureError::Containerd(Box::new(e))
    }
}

impl From<crio::CrioError> for ConfigureError {
    fn from(e: crio::CrioError) -> Self {
        ConfigureError::Crio(Box::new(e))
    }
}

impl From<docker::DockerError> for ConfigureError {
    fn from(e: docker::DockerError) -> Self {
        ConfigureError::Docker(Box::new(e))
    }
}

/// What the engines that take a runtime (containerd, CRI-O, docker) share: a plan of the
/// file changes that register gpuslice, and one that removes them again.
pub trait Engine {
    type Error: From<FileError> + From<RegistrationError>;

    /// The changes that register `reg` (nothing is written yet).
    fn plan_add(&self, reg: &Registration) -> Result<Plan, Self::Error>;

    /// The changes that unregister gpuslice.
    fn plan_remove(&self) -> Result<Plan, Self::Error>;
}

/// Registers the `gpuslice-runtime` next to this executable with the node's config (or with
/// `remove`, unregisters it) with `engine`; with `dry_run` only reports.
pub fn configure<E: Engine>(
    engine: &E,
    node: &NodeContext,
    dry_run: bool,
    remove: bool,
) -> Result<String, E::Error> {
    let plan = if remove {
        engine.plan_remove()?
    } else {
        engine.plan_add(&Registration::from_node(node)?)?
    };
    Ok(plan.apply(dry_run)?)
}

/// Runs `configure <engine>` and prints what changed (or would change).
pub fn run(node: &NodeContext, command: ConfigureCommand) -> Result<(), ConfigureError> {
    let text = match command {
        ConfigureCommand::Podman(a) => podman::configure(node, &a.hooks_dir, a.dry_run, a.remove)?,
        ConfigureCommand::Containerd(a) => configure(
            &containerd::Target::new(absolute(a.config_path.as_deref()).as_deref()),
            node,
            a.dry_run,
            a.remove,
        )?,
        ConfigureCommand::Crio(a) => configure(
            &crio::Target::new(absolute(a.config_path.as_deref()).as_deref()),
            node,
            a.dry_run,
            a.remove,
        )?,
        ConfigureCommand::Docker(a) => configure(
            &docker::Target::new(absolute(a.config_path.as_deref()).as_deref()),
            node,
            a.dry_run,
            a.remove,
        )?,
    };
    Ok(out(&text)?)
}

/// `--config-path` made absolute against the working directory: the files written next to it
/// (drop-in, wrapper) are named by path in the engine's config, which the engine resolves
/// against the config's own directory (or not at all). A path `absolute` cannot resolve is
/// kept as given, and reading it reports it.
fn absolute(path: Option<&Path>) -> Option<PathBuf> {
    path.map(|p| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf()))
}
