//! Where the slice's files are (docs/shim.md): `/run/gpuslice/limits.json` and
//! `/run/gpuslice/usage` in a container; only when that limits file does not exist,
//! `$GPUSLICE_DIR/limits.json` and `$GPUSLICE_DIR/usage` (how tests run the shim outside a
//! container). No other variable is consulted: the environment cannot raise a limit.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use gpuslice_slice::{LIMITS_FILE, USAGE_FILE};

/// The variable naming a slice directory outside a container.
pub const DIR_ENV: &str = "GPUSLICE_DIR";

/// The two files of the slice in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlicePaths {
    pub limits: PathBuf,
    pub usage: PathBuf,
}

/// No slice could be found.
#[derive(Debug, thiserror::Error)]
pub enum LocateError {
    #[error("no limits: {container} does not exist and {DIR_ENV} is not set; refusing CUDA initialisation rather than running unlimited")]
    NoLimits { container: PathBuf },
    #[error("cannot check {container}: {source}")]
    Stat {
        container: PathBuf,
        source: std::io::Error,
    },
}

/// Picks the slice files: the container's when `container_limits` exists, else those in
/// `dir_env` (the value of `GPUSLICE_DIR`, if set and not empty).
pub fn locate(
    container_limits: &Path,
    container_usage: &Path,
    dir_env: Option<OsString>,
) -> Result<SlicePaths, LocateError> {
    match std::fs::symlink_metadata(container_limits) {
        Ok(_) => {
            return Ok(SlicePaths {
                limits: container_limits.to_path_buf(),
                usage: container_usage.to_path_buf(),
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(LocateError::Stat {
                container: container_limits.to_path_buf(),
                source,
            })
        }
    }
    match dir_env.filter(|d| !d.is_empty()) {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            Ok(SlicePaths {
                limits: dir.join(LIMITS_FILE),
                usage: dir.join(USAGE_FILE),
            })
        }
        None => Err(LocateError::NoLimits {
            container: container_limits.to_path_buf(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_file_wins_over_the_environment() {
        let d = tempfile::tempdir().expect("tempdir");
        let limits = d.path().join("limits.json");
        std::fs::write(&limits, b"{}").expect("write");
        let usage = d.path().join("usage");
        let p = locate(&limits, &usage, Some("/elsewhere".into())).expect("found");
        assert_eq!(p, SlicePaths { limits, usage });
    }

    #[test]
    fn environment_is_used_only_without_the_container_file() {
        let d = tempfile::tempdir().expect("tempdir");
        let missing = d.path().join("run/limits.json");
        let p =
            locate(&missing, &d.path().join("run/usage"), Some("/slice".into())).expect("found");
        assert_eq!(p.limits, Path::new("/slice/limits.json"));
        assert_eq!(p.usage, Path::new("/slice/usage"));
        let e = locate(&missing, &d.path().join("run/usage"), None).expect_err("nothing");
        assert!(
            e.to_string().contains("run/limits.json") && e.to_string().contains("GPUSLICE_DIR"),
            "{e}"
        );
        assert!(locate(&missing, &d.path().join("u"), Some("".into())).is_err());
    }
}
