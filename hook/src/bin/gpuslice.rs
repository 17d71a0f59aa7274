//! `gpuslice`: the node CLI and the OCI hooks.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = gpuslice::cli::Cli::parse();
    match gpuslice::commands::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpuslice: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
