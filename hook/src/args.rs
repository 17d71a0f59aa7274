//! The create path's part of the `gpuslice` command line: the OCI hooks, defined
//! next to the code they drive and composed into the command tree by the `gpuslice`
//! binary. The hook lines gpuslice writes are read without clap by `create::hookargv`, into
//! the same types.

use std::path::PathBuf;

use clap::{Args, Subcommand};

/// A hook line: the `--config` it names and the hook.
#[derive(Debug)]
pub struct HookLine {
    pub config: Option<PathBuf>,
    pub command: HookCommand,
}

#[derive(Debug, Subcommand)]
pub enum HookCommand {
    /// hooks.d `precreate` stage (podman, CRI-O): OCI spec on stdin, edited spec on stdout.
    Precreate,
    /// `createRuntime` hook: bind the reservation to the container (state on stdin); alias
    /// `prestart`, for runtimes that run only that older stage.
    #[command(visible_alias = "prestart")]
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
    /// The slice's reservation this hook is for: bound to the container at createRuntime,
    /// released at poststop.
    #[arg(long, value_name = "ID")]
    pub reservation: Option<String>,
    /// createRuntime: book these GPUs whole for the container (CDI whole-GPU devices).
    /// poststop releases whatever the stopped container booked, with or without it.
    #[arg(long = "whole-gpu", value_name = "UUID")]
    pub whole_gpu: Vec<String>,
    /// createRuntime only (refused at poststop): record the container as one of the
    /// containers of the DRA claim holding reservation ID (the claim's CDI spec carries this
    /// hook): its init process and cgroup, read here on the host, are what the node agent
    /// attributes the claim's GPU processes by.
    #[arg(long, value_name = "ID", conflicts_with_all = ["reservation", "whole_gpu"])]
    pub claim: Option<String>,
}
