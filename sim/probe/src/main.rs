//! `gpuslice-probe`: drives a CUDA driver the way the CUDA runtime does (dlopen
//! `libcuda.so.1`, entry points through `cuGetProcAddress`), against the simulated driver in
//! tests and unchanged against a real NVIDIA driver: `info`, `alloc` until refused on every
//! allocation path, `ctx-destroy` for what outlives a destroyed context, `churn` for
//! concurrent allocation and free, `burn` for compute share, `bench` for per-call cost, `fill` as a serving engine sizes its memory, and `smi`
//! (NVML only; also what the probe does when run as `nvidia-smi`, its stand-in on the
//! simulated node).

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod alloc;
mod bench;
mod burn;
mod churn;
mod cli;
mod cuda;
mod dl;
mod error;
mod fill;
mod info;
mod nvml;
mod ptx;
mod report;

use clap::Parser;

use crate::cli::{Cli, Command};
use crate::error::ProbeError;
use crate::report::Out;

fn run(cli: &Cli) -> Result<(), ProbeError> {
    let out = Out { json: cli.json };
    if let Command::Smi = cli.command {
        return fill::smi(out, &cli.nvml_lib);
    }
    let cuda = cuda::Cuda::load(&cli.lib, cli.resolve(), cli.cuda_version)?;
    cuda.init()?;
    match &cli.command {
        Command::Info => info::run(&cuda, out, cli.device, &cli.nvml_lib),
        Command::Alloc(a) => alloc::run(&cuda, out, cli.device, a),
        Command::Multi(m) => alloc::run_multi(&cuda, out, m),
        Command::CtxDestroy(a) => alloc::run_ctx_destroy(&cuda, out, cli.device, a),
        Command::Burn(b) => burn::run(&cuda, out, cli.device, b),
        Command::Bench(b) => bench::run(&cuda, out, cli.device, b),
        Command::Fill(f) => fill::run(&cuda, out, cli.device, &cli.nvml_lib, f),
        Command::Churn(c) => churn::run(&cuda, out, cli.device, c),
        Command::GraphCache(g) => alloc::run_graph_cache(&cuda, out, cli.device, g),
        Command::Smi => Ok(()),
    }
}

/// Run as `nvidia-smi` (the stand-in the simulated node installs in its driver root), the
/// probe is `smi`, with `-q`/`--json`-free arguments ignored as a tool's would be.
fn invoked_as_smi() -> bool {
    std::env::args_os()
        .next()
        .and_then(|a| {
            std::path::Path::new(&a)
                .file_name()
                .map(|n| n == "nvidia-smi")
        })
        .unwrap_or(false)
}

fn main() {
    let cli = if invoked_as_smi() {
        let json = std::env::args().skip(1).any(|a| a == "--json");
        Cli::parse_from([
            "gpuslice-probe",
            if json { "--json" } else { "--device=0" },
            "smi",
        ])
    } else {
        Cli::parse()
    };
    if let Err(e) = run(&cli) {
        eprintln!("gpuslice-probe: {e}");
        std::process::exit(e.exit_code());
    }
}
