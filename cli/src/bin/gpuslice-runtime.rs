//! `gpuslice-runtime`: the runc-compatible wrapper for containerd's `BinaryName`, nerdctl
//! and docker `--runtime`. Finds its config through `GPUSLICE_CONFIG` or the default path.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

use gpuslice_hook::create::runtime::{
    edit_bundle, exec_runtime, exit_like, parse_args, report, resolve_runtime, run_forwarding,
    RuntimeError, StartSignals,
};
use gpuslice_hook::node::NodeContext;

/// Whether SIGPIPE was ignored when this process was started: Rust's runtime ignores it
/// before `main`, and the runtime this wrapper starts must find it as the engine left it.
static SIGPIPE_IGNORED_AT_START: AtomicBool = AtomicBool::new(false);

/// Reads SIGPIPE's disposition before Rust's runtime changes it (an `.init_array` function
/// runs before `main`, with glibc and musl alike).
extern "C" fn record_start_sigpipe() {
    // SAFETY: sigaction is plain data; a null new action only reads the current one into
    // `current`, a valid sigaction owned here.
    let ignored = unsafe {
        let mut current: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGPIPE, std::ptr::null(), &mut current) == 0
            && current.sa_sigaction == libc::SIG_IGN
    };
    SIGPIPE_IGNORED_AT_START.store(ignored, Ordering::Relaxed);
}

#[used]
#[link_section = ".init_array"]
static RECORD_START_SIGPIPE: extern "C" fn() = record_start_sigpipe;

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let parsed = parse_args(&args);
    // Before anything blocks a signal: the runtime gets this state back.
    let start = match StartSignals::capture(SIGPIPE_IGNORED_AT_START.load(Ordering::Relaxed)) {
        Ok(s) => s,
        Err(e) => {
            report(&parsed, &e.to_string());
            return ExitCode::from(1);
        }
    };
    let creates = matches!(parsed.command.as_deref(), Some("create" | "run"));
    let mut node = None;
    let configured = if creates {
        let n = match NodeContext::load(None) {
            Ok(n) => n,
            Err(e) => {
                report(&parsed, &RuntimeError::Config(e).to_string());
                return ExitCode::from(1);
            }
        };
        if let Err(e) = edit_bundle(&n, &parsed) {
            // The edit may have reserved before it failed (writing config.json back): the
            // slice is given back now, not at the pending timeout.
            give_back(Some(&n), &parsed);
            report(&parsed, &e.to_string());
            return ExitCode::from(1);
        }
        let path = n.config().runtime.path.clone();
        node = Some(n);
        path
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
            give_back(node.as_ref(), &parsed);
            report(&parsed, &e.to_string());
            return ExitCode::from(1);
        }
    };
    if let Some(node) = &node {
        // create/run: the runtime runs as a child, so that a failure before any hook bound
        // the reservation this create made gives it back now, not at the pending timeout.
        return match run_forwarding(&runtime, &args, &start) {
            Ok(status) => {
                if !status.success() {
                    give_back(Some(node), &parsed);
                }
                exit_like(status)
            }
            Err(e) => {
                give_back(Some(node), &parsed);
                report(&parsed, &e.to_string());
                ExitCode::from(1)
            }
        };
    }
    let err = exec_runtime(&runtime, &args, &start);
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

/// Releases the reservations this process made that no hook bound (the runtime failed or
/// never ran). A failure here is reported; the runtime's exit status stays what it was, and
/// the pending timeout still reaps what could not be released.
fn give_back(node: Option<&NodeContext>, parsed: &gpuslice_hook::create::runtime::RuncArgs) {
    let Some(node) = node else { return };
    if let Err(e) = node.give_back_pending() {
        report(
            parsed,
            &format!("gpuslice-runtime: cannot release the slice reserved for this create: {e}"),
        );
    }
}
