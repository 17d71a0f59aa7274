//! `gpuslice`: the node CLI and the OCI hooks.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::ExitCode;

use clap::Parser;
use gpuslice::staticbuild;

/// The hooks (a container's create path) allocate from a bump region from the process's first
/// allocation; every other command switches to the system allocator at once (see
/// `gpuslice::arena`).
#[global_allocator]
static ALLOC: gpuslice::arena::Arena<true> = gpuslice::arena::Arena;

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let hook = staticbuild::is_hook(&args);
    if !hook {
        gpuslice::arena::disable();
    }
    if staticbuild::IS_STATIC && !hook {
        // The static build runs the hooks; NVML needs the full build (see `staticbuild`).
        let full = std::env::current_exe()
            .ok()
            .and_then(|exe| staticbuild::handover_target(&args, &exe));
        if let Some(full) = full {
            let err = std::process::Command::new(&full)
                .arg0("gpuslice")
                .args(&args)
                .exec();
            eprintln!(
                "gpuslice: cannot run the full build {}: {err}",
                full.display()
            );
            return ExitCode::from(1);
        }
    }
    let cli = if hook {
        // The lines gpuslice writes are read without clap (see `hookargv`); clap reads the
        // rest and gives its errors and help.
        gpuslice::hookargv::parse(&args).unwrap_or_else(|| gpuslice::cli::HookCli::parse().into())
    } else {
        gpuslice::cli::Cli::parse()
    };
    match gpuslice::commands::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpuslice: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
