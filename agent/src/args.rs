//! The node agent's part of the `gpuslice` command line: `serve`, `status`, `gc` and `cdi`.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Subcommand};

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print JSON (docs/observability.md, "gpuslice status") instead of tables.
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

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to serve /metrics and /healthz on [default: serve.listen of the config].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
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
