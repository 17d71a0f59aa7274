//! The container's cgroup freezer, behind a seam, with the cgroup root as a parameter: on
//! a cgroup v1 (or hybrid) host the `freezer` hierarchy's `freezer.state` (`FROZEN` /
//! `THAWED`), on a unified (v2) host the cgroup's `cgroup.freeze` (`1` / `0`). A process's
//! cgroup comes from `/proc/<pid>/cgroup`, which the host writes. The files the duty cycle
//! holds are recorded in the state dir ([`HELD_FILE`]), so an enforcer started after one
//! that was stopped mid-period thaws what it left frozen (a frozen container shows no use,
//! so nothing else would ever throttle, and so thaw, it again). The record is therefore
//! never dropped while it may name a cgroup left frozen: files whose thaw failed stay in it,
//! and one this build cannot read is kept aside ([`UNREADABLE_PREFIX`]) and reported at
//! every start until an operator removes it.

use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

/// File in the state dir naming the freezer files under a duty cycle now.
pub const HELD_FILE: &str = "enforcer-throttled.json";

/// Start of the names (`enforcer-throttled.json.unreadable-<unix ms>`) under which a record
/// this build cannot read is kept in the state dir: the cgroups it names were not thawed.
pub const UNREADABLE_PREFIX: &str = "enforcer-throttled.json.unreadable-";

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
    #[error("cannot record the throttled cgroups in {path}: {detail}")]
    Record { path: PathBuf, detail: String },
    #[error("{path}: a record of cgroups an earlier run held frozen that this build cannot read ({detail}); none of them was thawed: thaw those it names (`THAWED` into their freezer.state, `0` into their cgroup.freeze), then remove it")]
    Unreadable { path: PathBuf, detail: String },
    #[error("{path}: `{file}` is not a freezer file under {root}; left alone")]
    Foreign {
        path: PathBuf,
        file: PathBuf,
        root: PathBuf,
    },
}

/// One container's freezer control file.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
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

impl FreezerFile {
    /// Whether this names a freezer control file below `cgroup_root`, with no `..` on the
    /// way (what a recorded file must be before it is written).
    fn is_under(&self, cgroup_root: &Path) -> bool {
        let name = match self {
            FreezerFile::V1(_) => "freezer.state",
            FreezerFile::V2(_) => "cgroup.freeze",
        };
        let p = self.path();
        p.starts_with(cgroup_root)
            && p.file_name().is_some_and(|n| n == name)
            && p.components()
                .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
    }
}

/// Records `held` as the freezer files under a duty cycle, replacing the record
/// atomically (no file when none is held).
pub fn record_held(state_dir: &Path, held: &[FreezerFile]) -> Result<(), FreezeError> {
    let path = state_dir.join(HELD_FILE);
    let err = |detail: String| FreezeError::Record {
        path: path.clone(),
        detail,
    };
    if held.is_empty() {
        return match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(err(e.to_string())),
            _ => Ok(()),
        };
    }
    let text = serde_json::to_vec(held).map_err(|e| err(e.to_string()))?;
    gpuslice_fsutil::atomic_write(&path, &text, 0o600).map_err(|e| err(e.to_string()))
}

/// What [`thaw_held`] left behind.
#[derive(Debug, Default)]
pub struct Leftover {
    /// Files whose thaw failed: still recorded, and to stay in every record written after
    /// (the duty cycle's), so the next start tries them again.
    pub kept: Vec<FreezerFile>,
    /// The problems met, each naming its file.
    pub errors: Vec<FreezeError>,
}

/// Thaws what the record of an earlier run names (files that are not freezer files under
/// `cgroup_root` are left alone) and removes the record once each file it names was thawed
/// or is gone; files whose thaw failed stay recorded ([`Leftover::kept`]). A record this
/// build cannot read (a newer build's, or damaged) thaws nothing and is kept aside as
/// `<`[`UNREADABLE_PREFIX`]`<unix ms>`, so the duty cycle's records do not replace it;
/// every record kept aside is reported, at every start, until an operator removes it.
pub fn thaw_held(state_dir: &Path, cgroup_root: &Path, freezer: &mut dyn Freezer) -> Leftover {
    let mut left = Leftover::default();
    thaw_recorded(state_dir, cgroup_root, freezer, &mut left);
    report_unreadable(state_dir, &mut left.errors);
    left
}

/// [`thaw_held`]'s work on [`HELD_FILE`].
fn thaw_recorded(
    state_dir: &Path,
    cgroup_root: &Path,
    freezer: &mut dyn Freezer,
    left: &mut Leftover,
) {
    let path = state_dir.join(HELD_FILE);
    let text = match std::fs::read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
        Err(source) => return left.errors.push(FreezeError::Read { path, source }),
    };
    let files = match serde_json::from_slice::<Vec<FreezerFile>>(&text) {
        Ok(files) => files,
        Err(e) => {
            // Reported from where it is kept, with the others kept aside.
            let ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis());
            let aside = state_dir.join(format!("{UNREADABLE_PREFIX}{ms}"));
            if let Err(moved) = std::fs::rename(&path, &aside) {
                left.errors.push(FreezeError::Unreadable {
                    path,
                    detail: format!(
                        "{e}; it cannot be kept aside as {}: {moved}",
                        aside.display()
                    ),
                });
            }
            return;
        }
    };
    for f in files {
        if !f.is_under(cgroup_root) {
            left.errors.push(FreezeError::Foreign {
                path: path.clone(),
                file: f.path().to_path_buf(),
                root: cgroup_root.to_path_buf(),
            });
            continue;
        }
        // A container gone since has no freezer left to thaw.
        if f.path().exists() {
            if let Err(e) = freezer.set(&f, false) {
                left.errors.push(e);
                left.kept.push(f);
            }
        }
    }
    if let Err(e) = record_held(state_dir, &left.kept) {
        left.errors.push(e);
    }
}

/// One error for each record kept aside in `state_dir` as unreadable, naming it and why it
/// cannot be read.
fn report_unreadable(state_dir: &Path, errors: &mut Vec<FreezeError>) {
    let Ok(entries) = std::fs::read_dir(state_dir) else {
        return;
    };
    let mut aside: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(UNREADABLE_PREFIX))
        })
        .map(|e| e.path())
        .collect();
    aside.sort();
    for path in aside {
        let detail = match std::fs::read(&path) {
            Ok(text) => match serde_json::from_slice::<Vec<FreezerFile>>(&text) {
                Ok(_) => "it was when an earlier start kept it aside".to_string(),
                Err(e) => e.to_string(),
            },
            Err(e) => e.to_string(),
        };
        errors.push(FreezeError::Unreadable { path, detail });
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
    fn what_an_earlier_run_held_is_thawed_at_start_and_foreign_files_are_left_alone() {
        let root = tempfile::tempdir().unwrap();
        let state = tempfile::tempdir().unwrap();
        let cg = root.path();
        std::fs::create_dir_all(cg.join("freezer/c1")).unwrap();
        std::fs::write(cg.join("freezer/c1/freezer.state"), "FROZEN").unwrap();
        let held = vec![
            FreezerFile::V1(cg.join("freezer/c1/freezer.state")),
            // Gone since: nothing to thaw, no error.
            FreezerFile::V1(cg.join("freezer/c2/freezer.state")),
        ];
        record_held(state.path(), &held).unwrap();
        let other = state.path().join("other");
        std::fs::write(&other, "keep").unwrap();
        // A record naming something else: refused, never written.
        let mut text: Vec<FreezerFile> = held.clone();
        text.push(FreezerFile::V1(other.clone()));
        text.push(FreezerFile::V2(cg.join("x/../../etc/cgroup.freeze")));
        std::fs::write(
            state.path().join(HELD_FILE),
            serde_json::to_vec(&text).unwrap(),
        )
        .unwrap();
        let left = thaw_held(state.path(), cg, &mut CgroupFreezer);
        assert_eq!(left.errors.len(), 2, "{:?}", left.errors);
        assert!(left
            .errors
            .iter()
            .all(|e| matches!(e, FreezeError::Foreign { .. })));
        assert!(left.kept.is_empty());
        assert_eq!(
            std::fs::read_to_string(cg.join("freezer/c1/freezer.state")).unwrap(),
            "THAWED"
        );
        assert_eq!(std::fs::read_to_string(&other).unwrap(), "keep");
        assert!(!state.path().join(HELD_FILE).exists(), "record removed");
        assert!(thaw_held(state.path(), cg, &mut CgroupFreezer)
            .errors
            .is_empty());
    }

    /// Thaws as the kernel does, except that writing `failing` fails.
    struct FailsOn(PathBuf);

    impl Freezer for FailsOn {
        fn set(&mut self, file: &FreezerFile, frozen: bool) -> Result<(), FreezeError> {
            if file.path() == self.0 {
                return Err(FreezeError::Write {
                    path: self.0.clone(),
                    source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
                });
            }
            CgroupFreezer.set(file, frozen)
        }
    }

    fn recorded(state: &Path) -> Vec<FreezerFile> {
        serde_json::from_slice(&std::fs::read(state.join(HELD_FILE)).unwrap()).unwrap()
    }

    #[test]
    fn a_cgroup_whose_thaw_fails_stays_recorded_alone_until_a_start_thaws_it() {
        let root = tempfile::tempdir().unwrap();
        let state = tempfile::tempdir().unwrap();
        let cg = root.path();
        let held: Vec<FreezerFile> = ["c1", "c2"]
            .iter()
            .map(|c| {
                std::fs::create_dir_all(cg.join(c)).unwrap();
                std::fs::write(cg.join(c).join("cgroup.freeze"), "1").unwrap();
                FreezerFile::V2(cg.join(c).join("cgroup.freeze"))
            })
            .collect();
        record_held(state.path(), &held).unwrap();
        let left = thaw_held(state.path(), cg, &mut FailsOn(held[0].path().into()));
        assert_eq!(left.kept, [held[0].clone()]);
        assert_eq!(left.errors.len(), 1, "{:?}", left.errors);
        assert!(
            left.errors[0].to_string().contains("c1/cgroup.freeze"),
            "{:?}",
            left.errors
        );
        assert_eq!(recorded(state.path()), [held[0].clone()]);
        assert_eq!(std::fs::read_to_string(held[1].path()).unwrap(), "0");
        // The next start thaws it and drops the record.
        let left = thaw_held(state.path(), cg, &mut CgroupFreezer);
        assert!(left.kept.is_empty() && left.errors.is_empty(), "{left:?}");
        assert_eq!(std::fs::read_to_string(held[0].path()).unwrap(), "0");
        assert!(!state.path().join(HELD_FILE).exists());
    }

    #[test]
    fn an_unreadable_record_is_kept_aside_and_reported_at_every_start() {
        let root = tempfile::tempdir().unwrap();
        let state = tempfile::tempdir().unwrap();
        std::fs::write(state.path().join(HELD_FILE), "{\"v2\":").unwrap();
        let unreadable = |left: &Leftover| -> Vec<PathBuf> {
            left.errors
                .iter()
                .filter_map(|e| match e {
                    FreezeError::Unreadable { path, .. } => Some(path.clone()),
                    _ => None,
                })
                .collect()
        };
        let left = thaw_held(state.path(), root.path(), &mut CgroupFreezer);
        let aside = unreadable(&left);
        assert_eq!(aside.len(), 1, "{:?}", left.errors);
        assert_eq!(left.errors.len(), 1, "{:?}", left.errors);
        assert!(aside[0]
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(UNREADABLE_PREFIX)));
        assert_eq!(std::fs::read_to_string(&aside[0]).unwrap(), "{\"v2\":");
        let message = left.errors[0].to_string();
        assert!(
            message.contains(&aside[0].display().to_string()) && message.contains("remove it"),
            "{message}"
        );
        // The duty cycle's records go where the unreadable one was, and leave it alone.
        record_held(
            state.path(),
            &[FreezerFile::V2(root.path().join("c/cgroup.freeze"))],
        )
        .unwrap();
        assert_eq!(std::fs::read_to_string(&aside[0]).unwrap(), "{\"v2\":");
        // Reported again at the next start, until an operator removes it.
        let left = thaw_held(state.path(), root.path(), &mut CgroupFreezer);
        assert_eq!(unreadable(&left), aside);
        std::fs::remove_file(&aside[0]).unwrap();
        let left = thaw_held(state.path(), root.path(), &mut CgroupFreezer);
        assert!(left.errors.is_empty(), "{:?}", left.errors);
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
