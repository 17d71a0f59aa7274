//! `gpuslice-probe`: drives a CUDA driver the way the CUDA runtime does (dlopen
//! `libcuda.so.1`, entry points through `cuGetProcAddress`), against the simulated driver in
//! tests and unchanged against a real NVIDIA driver: `info`, `alloc` until refused on every
//! allocation path, `burn` for compute share, and `bench` for per-call cost.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod alloc;
mod bench;
mod burn;
mod cli;
mod cuda;
mod dl;
mod error;
mod info;
mod nvml;
mod ptx;
mod report;

use clap::Parser;

use crate::cli::{Cli, Command};
use crate::error::ProbeError;
use crate::report::Out;

fn run(cli: &Cli) -> Result<(), ProbeError> {
    let cuda = cuda::Cuda::load(&cli.lib, cli.resolve(), cli.cuda_version)?;
    cuda.init()?;
    let out = Out { json: cli.json };
    match &cli.command {
        Command::Info => info::run(&cuda, out, cli.device, &cli.nvml_lib),
        Command::Alloc(a) => alloc::run(&cuda, out, cli.device, a),
        Command::Multi(m) => alloc::run_multi(&cuda, out, m),
        Command::Burn(b) => burn::run(&cuda, out, cli.device, b),
        Command::Bench(b) => bench::run(&cuda, out, cli.device, b),
    }
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(&cli) {
        eprintln!("gpuslice-probe: {e}");
        std::process::exit(e.exit_code());
    }
}
