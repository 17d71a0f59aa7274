//! `gpuslice-runtime`: a runc-compatible wrapper. On `create` and `run` it applies the spec
//! edit to `<bundle>/config.json` (atomic replace), then runs the real runtime with the
//! unchanged arguments as its child — stdio and every other open descriptor inherited,
//! signals forwarded, its exit status passed on — so that when the runtime fails before any
//! hook bound the reservation it made, the wrapper gives the reservation back at once
//! ([`run_forwarding`]); every other subcommand passes straight through ([`exec_runtime`]).
//! Either way the runtime starts with the signal mask and dispositions the wrapper was
//! started with ([`StartSignals`]), which runc hands on to the container's process.

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::create::specedit::{edit_spec, EditError, Outcome};
use crate::node::NodeContext;

/// runc's global flags that take a value.
const GLOBAL_VALUE_FLAGS: &[&str] = &["--log", "--log-format", "--root", "--criu", "--rootless"];
/// `create`/`run` flags that take a value.
const CREATE_VALUE_FLAGS: &[&str] = &[
    "--bundle",
    "-b",
    "--console-socket",
    "--pid-file",
    "--preserve-fds",
];

/// The parts of a runc command line the wrapper needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuncArgs {
    /// `--log FILE`: where runc (and we) report errors for the engine.
    pub log: Option<PathBuf>,
    /// `--log-format text|json`.
    pub log_json: bool,
    /// The subcommand (`create`, `run`, `start`, `delete`, ...).
    pub command: Option<String>,
    /// `--bundle`/`-b` of create and run.
    pub bundle: Option<PathBuf>,
    /// The container id of create and run.
    pub container_id: Option<String>,
}

fn split_flag(arg: &str) -> (&str, Option<&str>) {
    match arg.split_once('=') {
        Some((f, v)) if f.starts_with('-') => (f, Some(v)),
        _ => (arg, None),
    }
}

/// The value of the flag at `args[*i]`: its `=value`, else the next argument (then `*i`
/// moves onto it).
fn flag_value(args: &[OsString], i: &mut usize, inline: Option<&str>) -> Option<String> {
    match inline {
        Some(v) => Some(v.to_string()),
        None => {
            *i += 1;
            args.get(*i).map(|v| v.to_string_lossy().into_owned())
        }
    }
}

/// Parses runc's command line (without the program name).
pub fn parse_args(args: &[OsString]) -> RuncArgs {
    let mut out = RuncArgs::default();
    let mut i = 0;
    // Global flags, up to the subcommand.
    while i < args.len() {
        let arg = args[i].to_string_lossy();
        if !arg.starts_with('-') {
            out.command = Some(arg.into_owned());
            i += 1;
            break;
        }
        let (flag, inline) = split_flag(&arg);
        if GLOBAL_VALUE_FLAGS.contains(&flag) {
            let value = flag_value(args, &mut i, inline);
            match flag {
                "--log" => out.log = value.map(PathBuf::from),
                "--log-format" => out.log_json = value.as_deref() == Some("json"),
                _ => {}
            }
        }
        i += 1;
    }
    if !matches!(out.command.as_deref(), Some("create" | "run")) {
        return out;
    }
    while i < args.len() {
        let arg = args[i].to_string_lossy();
        if arg == "--" {
            out.container_id = args.get(i + 1).map(|v| v.to_string_lossy().into_owned());
            break;
        }
        if !arg.starts_with('-') || arg == "-" {
            out.container_id = Some(arg.into_owned());
            break;
        }
        let (flag, inline) = split_flag(&arg);
        if CREATE_VALUE_FLAGS.contains(&flag) {
            let value = flag_value(args, &mut i, inline);
            if matches!(flag, "--bundle" | "-b") {
                out.bundle = value.map(PathBuf::from);
            }
        }
        i += 1;
    }
    out
}

/// Why the wrapper could not hand over to the runtime.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("gpuslice-runtime: {0}")]
    Config(#[from] gpuslice_config::ConfigError),
    #[error("gpuslice-runtime: cannot read {path}: {source}")]
    ReadSpec {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("gpuslice: {0}")]
    Edit(#[from] EditError),
    #[error("gpuslice-runtime: cannot write {path}: {source}")]
    WriteSpec {
        path: PathBuf,
        source: gpuslice_fsutil::AtomicWriteError,
    },
    #[error(
        "gpuslice-runtime: runtime {name:?} not found in PATH; set runtime.path in the config"
    )]
    NotFound { name: String },
    #[error("gpuslice-runtime: cannot execute {path}: {source}")]
    Exec {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("gpuslice-runtime: cannot wait for {path}: {source}")]
    Wait {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("gpuslice-runtime: cannot read the signal mask it was started with: {source}")]
    StartSignals { source: std::io::Error },
}

/// The signals the wrapper passes on to the runtime (everything a process can catch but
/// SIGCHLD, which tells the wrapper the runtime exited, and the synchronous faults).
const FORWARDED: &[libc::c_int] = &[
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGPIPE,
    libc::SIGALRM,
    libc::SIGTERM,
    libc::SIGCONT,
    libc::SIGTSTP,
    libc::SIGTTIN,
    libc::SIGTTOU,
    libc::SIGURG,
    libc::SIGXCPU,
    libc::SIGXFSZ,
    libc::SIGVTALRM,
    libc::SIGPROF,
    libc::SIGWINCH,
    libc::SIGIO,
    libc::SIGPWR,
    libc::SIGSYS,
];

/// The set of [`FORWARDED`] signals plus SIGCHLD.
fn wait_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it before any other use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t owned here; the signal numbers are valid.
    unsafe {
        libc::sigemptyset(&mut set);
        for sig in FORWARDED.iter().chain(&[libc::SIGCHLD]) {
            libc::sigaddset(&mut set, *sig);
        }
    }
    set
}

/// The signal state the wrapper was started with, which the runtime gets back in
/// [`run_forwarding`] and [`exec_runtime`]: a child inherits the signal mask and ignored
/// signals of its parent (Rust's `Command` keeps both, but for SIGPIPE, which it sets to
/// the default), and runc passes both on through `runc init` to the container's process;
/// the signals the wrapper blocks and the dispositions it changes for itself must not reach
/// the container.
#[derive(Clone, Copy)]
pub struct StartSignals {
    /// The signal mask at start.
    mask: libc::sigset_t,
    /// SIGPIPE was ignored at start. Rust's runtime ignores it before `main` and `Command`
    /// sets it to the default in a child, so only what the caller read before `main` (an
    /// `.init_array` function of the binary) knows whether the runtime should find it ignored.
    sigpipe_ignored: bool,
}

impl StartSignals {
    /// The current signal mask, with `sigpipe_ignored` read before Rust's runtime started.
    /// Call it before anything changes the mask.
    pub fn capture(sigpipe_ignored: bool) -> Result<StartSignals, RuntimeError> {
        // SAFETY: sigset_t is plain data, filled by pthread_sigmask below.
        let mut mask: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: a null new set only reads the mask into `mask`, a valid sigset_t.
        let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut mask) };
        if rc != 0 {
            return Err(RuntimeError::StartSignals {
                source: std::io::Error::from_raw_os_error(rc),
            });
        }
        Ok(StartSignals {
            mask,
            sigpipe_ignored,
        })
    }

    /// Makes `command`'s child put back, just before it executes the program, the mask this
    /// process started with, SIGPIPE as it was then, and SIGCHLD as `sigchld` (its
    /// disposition before the wrapper set its own).
    fn restore_in_child(
        &self,
        command: &mut std::process::Command,
        sigchld: Option<libc::sigaction>,
    ) {
        use std::os::unix::process::CommandExt;
        let start = *self;
        let child_setup = move || -> std::io::Result<()> {
            // SAFETY: this runs in the forked child before exec, where only async-signal-safe
            // calls are allowed: sigaction and sigprocmask are, and every value they read is a
            // copy made before the fork. The dispositions go first, so that a signal the
            // restored mask lets through finds the disposition the runtime will have.
            unsafe {
                if let Some(action) = &sigchld {
                    if libc::sigaction(libc::SIGCHLD, action, std::ptr::null_mut()) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                if start.sigpipe_ignored {
                    let mut ignore: libc::sigaction = std::mem::zeroed();
                    ignore.sa_sigaction = libc::SIG_IGN;
                    libc::sigemptyset(&mut ignore.sa_mask);
                    if libc::sigaction(libc::SIGPIPE, &ignore, std::ptr::null_mut()) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                if libc::sigprocmask(libc::SIG_SETMASK, &start.mask, std::ptr::null_mut()) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        };
        // SAFETY: the closure only makes async-signal-safe calls (above) and allocates
        // nothing.
        unsafe { command.pre_exec(child_setup) };
    }
}

/// Replaces this process with `runtime args` (every subcommand but create and run), with
/// the signal state it was started with; returns only when that fails.
pub fn exec_runtime(runtime: &Path, args: &[OsString], start: &StartSignals) -> std::io::Error {
    use std::os::unix::process::CommandExt;
    let mut command = std::process::Command::new(runtime);
    command.args(args);
    start.restore_in_child(&mut command, None);
    command.exec()
}

/// Runs `runtime args` as a child and returns how it ended. The child inherits stdin,
/// stdout, stderr and every descriptor not marked close-on-exec (`--preserve-fds`, a
/// console socket passed by fd), as it would through `exec`, and the signal state of
/// `start` (the mask and dispositions the wrapper was started with; std's `Command` would
/// hand it the mask blocked here). The signals in [`FORWARDED`] and SIGCHLD are blocked here
/// before it starts (none is lost in between) and each forwarded one that arrives is sent on
/// to it, until it exits.
pub fn run_forwarding(
    runtime: &Path,
    args: &[OsString],
    start: &StartSignals,
) -> Result<std::process::ExitStatus, RuntimeError> {
    let set = wait_set();
    // SAFETY: sigaction is plain data, filled by sigaction below.
    let mut old_chld: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: `dfl` is a valid sigaction (SIG_DFL, empty mask); `old_chld` receives the
    // previous one. SIGCHLD ignored by whoever started us (inherited through exec) would
    // reap the runtime behind our back and never be reported: the default disposition
    // queues it.
    let sigchld = unsafe {
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigemptyset(&mut dfl.sa_mask);
        (libc::sigaction(libc::SIGCHLD, &dfl, &mut old_chld) == 0).then_some(old_chld)
    };
    // SAFETY: sigset_t is plain data, filled by pthread_sigmask below.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` and `old` are valid sigsets; this thread is the only one that runs.
    unsafe {
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
    }
    let restore = |old: &libc::sigset_t| {
        // SAFETY: `old` is the mask saved above.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, old, std::ptr::null_mut()) };
    };
    let mut command = std::process::Command::new(runtime);
    command.args(args);
    start.restore_in_child(&mut command, sigchld);
    let mut child = match command.spawn() {
        Ok(c) => c,
        Err(source) => {
            restore(&old);
            return Err(RuntimeError::Exec {
                path: runtime.to_path_buf(),
                source,
            });
        }
    };
    let pid = child.id() as libc::pid_t;
    let status = loop {
        // SAFETY: `set` is a valid sigset; a null info pointer is allowed.
        let sig = unsafe { libc::sigwaitinfo(&set, std::ptr::null_mut()) };
        if sig == libc::SIGCHLD || sig < 0 {
            match child.try_wait() {
                Ok(Some(status)) => break Ok(status),
                Ok(None) => continue,
                Err(source) => {
                    break Err(RuntimeError::Wait {
                        path: runtime.to_path_buf(),
                        source,
                    })
                }
            }
        }
        // SAFETY: kill has no memory effects; `pid` is our child, not yet reaped.
        unsafe { libc::kill(pid, sig) };
    };
    restore(&old);
    status
}

/// Ends the wrapper as the runtime ended: with its exit code, or killed by the same signal
/// (re-raised with its default action), so the engine reads the runtime's own status.
pub fn exit_like(status: std::process::ExitStatus) -> std::process::ExitCode {
    use std::os::unix::process::ExitStatusExt;
    if let Some(code) = status.code() {
        return std::process::ExitCode::from(u8::try_from(code & 0xff).unwrap_or(1));
    }
    if let Some(sig) = status.signal() {
        // SAFETY: resetting a disposition to the default, unblocking and raising the signal
        // only affect this process, which is about to end.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::raise(sig);
        }
        return std::process::ExitCode::from(u8::try_from((128 + sig) & 0xff).unwrap_or(1));
    }
    std::process::ExitCode::from(1)
}

/// Applies the spec edit to the bundle's config.json when the command creates a container.
pub fn edit_bundle(node: &NodeContext, args: &RuncArgs) -> Result<(), RuntimeError> {
    let bundle = match &args.bundle {
        Some(b) => b.clone(),
        None => std::env::current_dir().map_err(|source| RuntimeError::ReadSpec {
            path: PathBuf::from("."),
            source,
        })?,
    };
    let path = bundle.join("config.json");
    // Bounded, regular files only (specfile); a spec without a request is never rewritten.
    let input = crate::create::specfile::read_spec(&path).map_err(EditError::from)?;
    if let Outcome::Edited { bytes, .. } = edit_spec(node, &input).map_err(|e| e.in_file(&path))? {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path)
            .map(|m| m.permissions().mode() & 0o7777)
            .unwrap_or(0o644);
        gpuslice_fsutil::atomic_write(&path, &bytes, mode).map_err(|source| {
            RuntimeError::WriteSpec {
                path: path.clone(),
                source,
            }
        })?;
    }
    Ok(())
}

/// The real runtime: `runtime.path`, looked up in PATH when it is a bare name (never this
/// wrapper itself, even if it is installed under the same name: `own_exe`, e.g.
/// `/proc/self/exe`, is compared by device and inode, which also sees through links).
pub fn resolve_runtime(
    configured: &Path,
    path_env: Option<&OsStr>,
    own_exe: Option<&Path>,
) -> Result<PathBuf, RuntimeError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if configured.is_absolute() {
        return Ok(configured.to_path_buf());
    }
    let mut own: Option<Option<(u64, u64)>> = None;
    let dirs = path_env.map(std::env::split_paths).into_iter().flatten();
    for dir in dirs {
        let candidate = dir.join(configured);
        let Ok(meta) = std::fs::metadata(&candidate) else {
            continue;
        };
        if !(meta.is_file() && meta.permissions().mode() & 0o111 != 0) {
            continue;
        }
        let own = *own.get_or_insert_with(|| {
            own_exe
                .and_then(|p| std::fs::metadata(p).ok())
                .map(|m| (m.dev(), m.ino()))
        });
        if own == Some((meta.dev(), meta.ino())) {
            continue;
        }
        return Ok(candidate);
    }
    Err(RuntimeError::NotFound {
        name: configured.display().to_string(),
    })
}

/// Reports an error where the engine shows it: stderr, and runc's `--log` file in its format.
pub fn report(args: &RuncArgs, message: &str) {
    eprintln!("{message}");
    let Some(log) = &args.log else { return };
    let time = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let line = if args.log_json {
        let v = serde_json::json!({"level": "error", "msg": message, "time": time});
        format!("{v}\n")
    } else {
        format!("time={time:?} level=error msg={message:?}\n")
    };
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
    {
        let _ = f.write_all(line.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn containerd_shim_create_line() {
        let a = parse_args(&args(&[
            "--root",
            "/run/containerd/runc/default",
            "--log",
            "/run/containerd/x/log.json",
            "--log-format",
            "json",
            "--systemd-cgroup",
            "create",
            "--bundle",
            "/run/containerd/x",
            "--pid-file",
            "/run/containerd/x/init.pid",
            "--console-socket",
            "/tmp/pty.sock",
            "ctr-1",
        ]));
        assert_eq!(a.command.as_deref(), Some("create"));
        assert_eq!(a.bundle.as_deref(), Some(Path::new("/run/containerd/x")));
        assert_eq!(a.container_id.as_deref(), Some("ctr-1"));
        assert_eq!(
            a.log.as_deref(),
            Some(Path::new("/run/containerd/x/log.json"))
        );
        assert!(a.log_json);
    }

    #[test]
    fn podman_style_and_inline_values() {
        let a = parse_args(&args(&[
            "--log-format=text",
            "--log=/l",
            "run",
            "-b",
            "/b",
            "-d",
            "--keep",
            "c2",
        ]));
        assert_eq!(
            (
                a.command.as_deref(),
                a.bundle.as_deref(),
                a.container_id.as_deref()
            ),
            (Some("run"), Some(Path::new("/b")), Some("c2"))
        );
        assert!(!a.log_json);
        let a = parse_args(&args(&["create", "--bundle=/bb", "c3"]));
        assert_eq!(a.bundle.as_deref(), Some(Path::new("/bb")));
        let a = parse_args(&args(&["create", "c4"]));
        assert_eq!((a.bundle, a.container_id.as_deref()), (None, Some("c4")));
    }

    #[test]
    fn other_commands_are_not_parsed_further() {
        let a = parse_args(&args(&["--root", "/r", "delete", "--force", "c5"]));
        assert_eq!(a.command.as_deref(), Some("delete"));
        assert_eq!(a.container_id, None);
        assert_eq!(parse_args(&args(&["--version"])).command, None);
    }

    #[test]
    fn resolves_runtime_in_path_skipping_itself() {
        let d1 = tempfile::tempdir().expect("tempdir");
        let d2 = tempfile::tempdir().expect("tempdir");
        for d in [&d1, &d2] {
            let p = d.path().join("runc");
            std::fs::write(&p, "#!/bin/sh\n").expect("write");
            std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .expect("chmod");
        }
        let path = std::env::join_paths([d1.path(), d2.path()]).expect("join");
        let own = d1.path().join("runc");
        let found = resolve_runtime(Path::new("runc"), Some(&path), Some(&own)).expect("found");
        assert_eq!(found, d2.path().join("runc"));
        // Itself under another name (a symlink in PATH) is skipped too.
        let d0 = tempfile::tempdir().expect("tempdir");
        std::os::unix::fs::symlink(&own, d0.path().join("runc")).expect("symlink");
        let path = std::env::join_paths([d0.path(), d1.path(), d2.path()]).expect("join");
        let found = resolve_runtime(Path::new("runc"), Some(&path), Some(&own)).expect("found");
        assert_eq!(found, d2.path().join("runc"));
        assert!(matches!(
            resolve_runtime(Path::new("nope"), Some(&path), None),
            Err(RuntimeError::NotFound { .. })
        ));
        assert_eq!(
            resolve_runtime(Path::new("/usr/sbin/runc"), None, None).expect("abs"),
            Path::new("/usr/sbin/runc")
        );
    }
}
