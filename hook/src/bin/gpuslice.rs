//! `gpuslice`: the node CLI and the OCI hooks.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::ExitCode;

use clap::Parser;
use gpuslice::staticbuild;

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    // One rule: the hook lines gpuslice writes are read by `hookargv`; any other line is
    // clap's, and the static build hands it to the full build (see `staticbuild`).
    let cli = match gpuslice::create::hookargv::parse(&args) {
        Some(cli) => cli,
        None if staticbuild::IS_STATIC => return hand_over(&args),
        None => gpuslice::cli::Cli::parse(),
    };
    match gpuslice::commands::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpuslice: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// Re-executes the command line with `gpuslice-full`; returns only when that fails.
fn hand_over(args: &[OsString]) -> ExitCode {
    let full = std::env::current_exe()
        .map_err(staticbuild::HandoverError::CurrentExe)
        .and_then(|exe| staticbuild::full_build(&exe));
    let err = match full {
        Ok(full) => {
            let err = std::process::Command::new(&full)
                .arg0("gpuslice")
                .args(args)
                .exec();
            format!("cannot run the full build {}: {err}", full.display())
        }
        Err(e) => e.to_string(),
    };
    eprintln!("gpuslice: {err}");
    ExitCode::from(1)
}
