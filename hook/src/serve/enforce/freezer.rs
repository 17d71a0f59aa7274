//! The container's cgroup freezer, behind a seam, with the cgroup root as a parameter: on
//! a cgroup v1 (or hybrid) host the `freezer` hierarchy's `freezer.state` (`FROZEN` /
//! `THAWED`), on a unified (v2) host the cgroup's `cgroup.freeze` (`1` / `0`). A process's
//! cgroup comes from `/proc/<pid>/cgroup`, which the host writes.

use std::path::{Path, PathBuf};

/// A freezer that cannot be found or written.
#[derive(Debug, thiserror::Error)]
pub enum FreezeError {
    #[error("{path}: no freezer cgroup for this process (neither a v1 `freezer` line nor a v2 `0::` line)")]
    NoCgroup { path: PathBuf },
    #[error("{path}: cgroup path `{cgroup}` is not a clean absolute path")]
    BadPath { path: PathBuf, cgroup: String },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// One container's freezer control file.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FreezerFile {
    /// `<root>/freezer/<path>/freezer.state`.
    V1(PathBuf),
    /// `<root>/<path>/cgroup.freeze`.
    V2(PathBuf),
}

impl FreezerFile {
    pub fn path(&self) -> &Path {
        match self {
            FreezerFile::V1(p) | FreezerFile::V2(p) => p,
        }
    }
}

/// Freezes and thaws cgroups.
pub trait Freezer: Send {
    fn set(&mut self, file: &FreezerFile, frozen: bool) -> Result<(), FreezeError>;
}

/// The kernel's freezer files.
#[derive(Debug, Default, Clone, Copy)]
pub struct CgroupFreezer;

impl Freezer for CgroupFreezer {
    fn set(&mut self, file: &FreezerFile, frozen: bool) -> Result<(), FreezeError> {
        let value: &[u8] = match (file, frozen) {
            (FreezerFile::V1(_), true) => b"FROZEN",
            (FreezerFile::V1(_), false) => b"THAWED",
            (FreezerFile::V2(_), true) => b"1",
            (FreezerFile::V2(_), false) => b"0",
        };
        std::fs::write(file.path(), value).map_err(|source| FreezeError::Write {
            path: file.path().to_path_buf(),
            source,
        })
    }
}

fn clean(cgroup: &str) -> bool {
    cgroup.starts_with('/') && !cgroup.split('/').any(|c| c == ".." || c == ".")
}

/// The freezer file of the process whose `/proc/<pid>/cgroup` text is `text`, under
/// `cgroup_root` (normally `/sys/fs/cgroup`): the v1 `freezer` hierarchy when the host
/// mounts one (hybrid hosts do, and runc puts containers there), else the unified one.
pub fn freezer_of(text: &str, cgroup_root: &Path, from: &Path) -> Result<FreezerFile, FreezeError> {
    let mut v2 = None;
    for line in text.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if !clean(path) {
            return Err(FreezeError::BadPath {
                path: from.to_path_buf(),
                cgroup: path.to_string(),
            });
        }
        let rel = path.trim_start_matches('/');
        if controllers.split(',').any(|c| c == "freezer") {
            let dir = cgroup_root.join("freezer").join(rel);
            if dir.is_dir() {
                return Ok(FreezerFile::V1(dir.join("freezer.state")));
            }
        } else if id == "0" && controllers.is_empty() {
            v2 = Some(cgroup_root.join(rel));
        }
    }
    // On a hybrid host the unified mount is `<root>/unified`.
    match v2 {
        Some(dir) if dir.join("cgroup.freeze").exists() => {
            Ok(FreezerFile::V2(dir.join("cgroup.freeze")))
        }
        Some(dir) => {
            let rel = dir.strip_prefix(cgroup_root).unwrap_or(&dir).to_path_buf();
            let hybrid = cgroup_root.join("unified").join(rel);
            if hybrid.join("cgroup.freeze").exists() {
                Ok(FreezerFile::V2(hybrid.join("cgroup.freeze")))
            } else {
                Err(FreezeError::NoCgroup {
                    path: from.to_path_buf(),
                })
            }
        }
        None => Err(FreezeError::NoCgroup {
            path: from.to_path_buf(),
        }),
    }
}

/// The freezer file of host process `pid`.
pub fn freezer_of_pid(
    proc_root: &Path,
    cgroup_root: &Path,
    pid: u32,
) -> Result<FreezerFile, FreezeError> {
    let path = proc_root.join(pid.to_string()).join("cgroup");
    let text = std::fs::read_to_string(&path).map_err(|source| FreezeError::Read {
        path: path.clone(),
        source,
    })?;
    freezer_of(&text, cgroup_root, &path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_freezer_wins_on_a_hybrid_host_and_v2_is_found_otherwise() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir_all(r.join("freezer/e2e/c1")).unwrap();
        let hybrid = "12:freezer:/e2e/c1\n3:cpu,cpuacct:/e2e/c1\n0::/e2e/c1\n";
        assert_eq!(
            freezer_of(hybrid, r, Path::new("/p")).unwrap(),
            FreezerFile::V1(r.join("freezer/e2e/c1/freezer.state"))
        );
        std::fs::create_dir_all(r.join("system.slice/runc-x.scope")).unwrap();
        std::fs::write(r.join("system.slice/runc-x.scope/cgroup.freeze"), "0").unwrap();
        let unified = "0::/system.slice/runc-x.scope\n";
        let f = freezer_of(unified, r, Path::new("/p")).unwrap();
        assert_eq!(
            f,
            FreezerFile::V2(r.join("system.slice/runc-x.scope/cgroup.freeze"))
        );
        let mut fr = CgroupFreezer;
        fr.set(&f, true).unwrap();
        assert_eq!(std::fs::read_to_string(f.path()).unwrap(), "1");
        fr.set(&f, false).unwrap();
        assert_eq!(std::fs::read_to_string(f.path()).unwrap(), "0");
        // Hybrid host's unified mount.
        std::fs::create_dir_all(r.join("unified/u")).unwrap();
        std::fs::write(r.join("unified/u/cgroup.freeze"), "0").unwrap();
        assert_eq!(
            freezer_of("0::/u\n", r, Path::new("/p")).unwrap(),
            FreezerFile::V2(r.join("unified/u/cgroup.freeze"))
        );
    }

    #[test]
    fn paths_that_escape_or_missing_freezers_are_refused_naming_the_file() {
        let root = tempfile::tempdir().unwrap();
        let e = freezer_of(
            "12:freezer:/../../etc\n",
            root.path(),
            Path::new("/proc/9/cgroup"),
        )
        .unwrap_err();
        assert!(matches!(e, FreezeError::BadPath { .. }), "{e}");
        let e = freezer_of(
            "1:name=systemd:/x\n",
            root.path(),
            Path::new("/proc/9/cgroup"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("/proc/9/cgroup"), "{e}");
    }
}
