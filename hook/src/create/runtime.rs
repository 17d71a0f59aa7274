//! `gpuslice-runtime`: a runc-compatible wrapper. On `create` and `run` it applies the spec
//! edit to `<bundle>/config.json` (atomic replace), then executes the real runtime with the
//! unchanged arguments; every other subcommand passes straight through.

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::create::specedit::{edit_spec, EditError, Outcome};
use crate::node::Node;

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
}

/// Applies the spec edit to the bundle's config.json when the command creates a container.
pub fn edit_bundle(node: &Node, args: &RuncArgs) -> Result<(), RuntimeError> {
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
