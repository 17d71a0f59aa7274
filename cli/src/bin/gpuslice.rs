//! `gpuslice`: the node CLI and the OCI hooks.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::ExitCode;

use gpuslice_hook::staticbuild;

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    // One rule: the hook lines gpuslice writes are read by the create path's `hookargv`; any
    // other line is clap's, and the static build hands it to the full build (see
    // `staticbuild`).
    if let Some(line) = gpuslice_hook::create::hookargv::parse(&args) {
        let result = gpuslice_hook::node::NodeContext::load(line.config.as_deref())
            .map_err(gpuslice_hook::error::Error::from)
            .and_then(|node| {
                gpuslice_hook::create::hooks::run(&node, line.command)
                    .map_err(gpuslice_hook::error::Error::from)
            });
        return match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("gpuslice: {e}");
                ExitCode::from(e.exit_code())
            }
        };
    }
    full(&args)
}

/// Any command line but a hook line: the full build's command tree.
#[cfg(feature = "full")]
fn full(_args: &[OsString]) -> ExitCode {
    use clap::Parser;
    if staticbuild::IS_STATIC {
        return hand_over(_args);
    }
    match gpuslice::dispatch::run(gpuslice::cli::Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpuslice: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// Any command line but a hook line: the static create-path build hands it to the full one.
#[cfg(not(feature = "full"))]
fn full(args: &[OsString]) -> ExitCode {
    hand_over(args)
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
