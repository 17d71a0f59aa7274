//! `gpuslice-runtime`: the runc-compatible wrapper for containerd's `BinaryName`, nerdctl
//! and docker `--runtime`. Finds its config through `GPUSLICE_CONFIG` or the default path.

use std::os::unix::process::CommandExt;
use std::process::ExitCode;

use gpuslice::create::runtime::{edit_bundle, parse_args, report, resolve_runtime, RuntimeError};
use gpuslice::node::Node;

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let parsed = parse_args(&args);
    let creates = matches!(parsed.command.as_deref(), Some("create" | "run"));
    let configured = if creates {
        let node = match Node::load(None) {
            Ok(n) => n,
            Err(e) => {
                report(&parsed, &RuntimeError::Config(e).to_string());
                return ExitCode::from(1);
            }
        };
        if let Err(e) = edit_bundle(&node, &parsed) {
            report(&parsed, &e.to_string());
            return ExitCode::from(1);
        }
        node.config().runtime.path.clone()
    } else {
        // Other commands (start, delete, kill, state…) only pass through: they read
        // `runtime.path` alone, and must keep working with a broken config so existing
        // containers can be cleaned up (the default runtime then).
        gpuslice_config::passthrough_runtime(
            None,
            std::env::var_os(gpuslice_config::CONFIG_ENV).as_deref(),
        )
    };
    let runtime = match resolve_runtime(
        &configured,
        std::env::var_os("PATH").as_deref(),
        Some(std::path::Path::new("/proc/self/exe")),
    ) {
        Ok(p) => p,
        Err(e) => {
            report(&parsed, &e.to_string());
            return ExitCode::from(1);
        }
    };
    let err = std::process::Command::new(&runtime).args(&args).exec();
    report(
        &parsed,
        &RuntimeError::Exec {
            path: runtime,
            source: err,
        }
        .to_string(),
    );
    ExitCode::from(1)
}
