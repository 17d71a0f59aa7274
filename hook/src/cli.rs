//! The `gpuslice` command line: subcommands, flags and their help texts (clap). A new
//! subcommand is a variant of [`Command`] and an arm of `commands::run`; the hook lines
//! gpuslice writes are read by `create::hookargv` before clap is built.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Share NVIDIA GPUs between containers with per-container memory and compute limits.
///
/// gpuslice reserves GPU slices when containers are created (from `gpuslice.io/*`
/// annotations), injects the devices, driver libraries and enforcement shim into the OCI
/// spec, and keeps a node registry of who holds which part of which GPU.
#[derive(Debug, Parser)]
#[command(name = "gpuslice", version, propagate_version = true)]
pub struct Cli {
    /// Node config file [default: $GPUSLICE_CONFIG, else /etc/gpuslice/config.toml].
    #[arg(long, global = true, value_name = "PATH")]
    pub config: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Publish CDI specs for engines that pick devices themselves.
    #[command(subcommand)]
    Cdi(CdiCommand),
    /// Show per-GPU capacity and allocation, and the reservations.
    Status(StatusArgs),
    /// Reap reservations of containers that are gone; `--rebuild` repairs a corrupt registry.
    Gc(GcArgs),
    /// OCI hooks called by container engines and runtimes (not for interactive use).
    #[command(subcommand)]
    Hook(HookCommand),
    /// Register gpuslice with a container engine.
    #[command(subcommand)]
    Configure(ConfigureCommand),
    /// Serve Prometheus metrics.
    Serve(ServeArgs),
    /// Run the DRA kubelet plugin of this node (Kubernetes 1.36+; docs/kubernetes-dra.md).
    #[cfg(feature = "kubernetes")]
    KubeletPlugin(crate::kubelet_plugin::KubeletPluginArgs),
    /// Serve the web console of the cluster's GPU slices (docs/console.md): nodes, GPUs,
    /// pods and workloads, and with --allow-edit allocating slices. It acts with the
    /// kubeconfig's rights for anyone who can reach --listen (default 127.0.0.1:8080).
    #[cfg(feature = "kubernetes")]
    Console(crate::commands::console::ConsoleArgs),
}

#[derive(Debug, Subcommand)]
pub enum CdiCommand {
    /// Take the GPU inventory (NVML or simulated), cache it for the registry, set up a
    /// simulated node when configured, and write the node's CDI spec for whole GPUs
    /// (`gpuslice.io/gpu=0`, `=GPU-<uuid>`, `=all`).
    ///
    /// Run it at install, at boot and after a driver change. The create path never touches
    /// NVML; it reads what this command cached.
    Generate(GenerateArgs),
    /// Print the CDI device names of the node spec, one per line.
    List,
}

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Directory to write the spec to [default: cdi.spec_dir of the config].
    #[arg(long, value_name = "DIR")]
    pub output: Option<PathBuf>,
    /// Directory holding the simulated driver libraries (simulated nodes only)
    /// [default: next to this executable, then /usr/lib/gpuslice/sim].
    #[arg(long, value_name = "DIR")]
    pub sim_driver: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print JSON (the contract of DESIGN.md §4) instead of tables.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct GcArgs {
    /// Rebuild a corrupt registry from the inventory and the slice directories of live
    /// containers (the corrupt file is kept aside).
    #[arg(long)]
    pub rebuild: bool,
}

#[derive(Debug, Subcommand)]
pub enum HookCommand {
    /// hooks.d `precreate` stage (podman, CRI-O): OCI spec on stdin, edited spec on stdout.
    Precreate,
    /// `createRuntime` hook: bind the reservation to the container (state on stdin).
    #[command(alias = "prestart")]
    CreateRuntime(HookArgs),
    /// `poststop` hook: release the container's reservations (state on stdin).
    Poststop(HookArgs),
    /// Print MESSAGE and fail: how a refused precreate edit reaches the user through the
    /// runtime's error.
    #[command(hide = true)]
    Fail {
        /// The refusal, one line.
        message: String,
    },
}

#[derive(Debug, Args)]
pub struct HookArgs {
    /// The reservation this hook is for (slices).
    #[arg(long, value_name = "ID")]
    pub reservation: Option<String>,
    /// Book these GPUs whole for the container (CDI whole-GPU devices).
    #[arg(long = "whole-gpu", value_name = "UUID")]
    pub whole_gpu: Vec<String>,
    /// Record the container as one of the containers of the DRA claim holding reservation
    /// ID (the claim's CDI spec carries this hook): its init process and cgroup, read here on
    /// the host, are what the node agent attributes the claim's GPU processes by.
    #[arg(long, value_name = "ID", conflicts_with_all = ["reservation", "whole_gpu"])]
    pub claim: Option<String>,
}

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

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to serve /metrics and /healthz on [default: serve.listen of the config].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
}
