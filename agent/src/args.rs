//! The node agent's part of the `gpuslice` command line: `serve`, `status` and `gc`.

use std::net::SocketAddr;

use clap::Args;

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

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to serve /metrics and /healthz on [default: serve.listen of the config].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
}
