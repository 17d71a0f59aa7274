//! `gpuslice configure` flags, composed into the command tree by the `gpuslice` binary.

use std::path::PathBuf;

use clap::{Args, Subcommand};

#[derive(Debug, Subcommand)]
pub enum ConfigureCommand {
    /// Add a `gpuslice` runtime handler to containerd (Kubernetes RuntimeClass, nerdctl).
    Containerd(ConfigureArgs),
    /// Install the hooks.d precreate hook for podman.
    Podman(PodmanArgs),
    /// Add a `gpuslice` runtime handler to CRI-O.
    Crio(ConfigureArgs),
    /// Add a `gpuslice` runtime to docker's daemon.json.
    Docker(ConfigureArgs),
}

#[derive(Debug, Args)]
pub struct ConfigureArgs {
    /// The engine's config file [default: the engine's standard path].
    #[arg(long, value_name = "PATH")]
    pub config_path: Option<PathBuf>,
    /// Print what would change, change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Undo a previous `configure`.
    #[arg(long)]
    pub remove: bool,
}

#[derive(Debug, Args)]
pub struct PodmanArgs {
    /// hooks.d directory to write the hook file into.
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/etc/containers/oci/hooks.d"
    )]
    pub hooks_dir: PathBuf,
    /// Print the hook file, change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Remove the hook file.
    #[arg(long)]
    pub remove: bool,
}
