//! The file changes of `gpuslice configure <engine>` as a plan: computed first (so a dry run
//! shows exactly what a real run does), then applied with a backup before the first change
//! of an operator's file, atomic replacement, and exact restoration on `--remove`.

use std::path::{Path, PathBuf};

use gpuslice_fsutil::diff::{diff, Context};

/// Suffix of the copy kept of an operator's file before gpuslice first changes it.
pub const BACKUP_SUFFIX: &str = ".gpuslice.bak";

/// A file could not be read, written or removed.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: gpuslice_fsutil::AtomicWriteError,
    },
    #[error("cannot create directory {path}: {source}")]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot remove {path}: {source}")]
    Remove {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot set the mode of {path}: {source}")]
    Mode {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The backup path of `path`: `<path>.gpuslice.bak`.
pub fn backup_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(BACKUP_SUFFIX);
    PathBuf::from(s)
}

/// A file as it is now: its text (`None` when it does not exist) and permission bits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Current {
    pub path: PathBuf,
    pub text: Option<String>,
    pub mode: u32,
}

/// Reads `path`; a missing file is `text: None`, mode 0644.
pub fn read(path: &Path) -> Result<Current, FileError> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let mode = std::fs::metadata(path)
                .map(|m| m.permissions().mode() & 0o7777)
                .unwrap_or(0o644);
            Ok(Current {
                path: path.to_path_buf(),
                text: Some(text),
                mode,
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Current {
            path: path.to_path_buf(),
            text: None,
            mode: 0o644,
        }),
        Err(source) => Err(FileError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// One step of a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Replace (or create) `path` with `text`, parent directories included.
    Write {
        path: PathBuf,
        text: String,
        mode: u32,
    },
    /// Keep `text` (the operator's original) as `<of>.gpuslice.bak` unless a backup exists:
    /// the first backup is the original.
    Backup {
        of: PathBuf,
        text: String,
        mode: u32,
    },
    /// Delete `path` if it exists.
    Remove { path: PathBuf },
    /// Delete directory `path` if it exists and is empty (one gpuslice created).
    RemoveEmptyDir { path: PathBuf },
}

/// The changes of one `configure` run and the lines to tell the operator afterwards.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub ops: Vec<Op>,
    /// Lines always printed after the report (warnings).
    pub notes: Vec<String>,
    /// Lines printed only when something changed or would change (what to restart).
    pub after_change: Vec<String>,
}

impl Plan {
    pub fn write(&mut self, path: &Path, text: String, mode: u32) {
        self.ops.push(Op::Write {
            path: path.to_path_buf(),
            text,
            mode,
        });
    }

    pub fn remove(&mut self, path: &Path) {
        self.ops.push(Op::Remove {
            path: path.to_path_buf(),
        });
    }

    pub fn note(&mut self, line: impl Into<String>) {
        self.notes.push(line.into());
    }

    pub fn after_change(&mut self, line: impl Into<String>) {
        self.after_change.push(line.into());
    }

    /// The text `path` will have after the plan (`None`: absent), given its text now.
    pub fn result_for(&self, path: &Path, now: Option<&str>) -> Option<String> {
        let mut text = now.map(str::to_string);
        for op in &self.ops {
            match op {
                Op::Write {
                    path: p, text: t, ..
                } if p == path => text = Some(t.clone()),
                Op::Remove { path: p } if p == path => text = None,
                _ => {}
            }
        }
        text
    }

    /// Applies the plan (or with `dry_run` only describes it); returns the report.
    pub fn apply(&self, dry_run: bool) -> Result<String, FileError> {
        let mut out = String::new();
        let mut changed = false;
        // Files first, then the directories they may leave empty, deepest first.
        let (dirs, files): (Vec<&Op>, Vec<&Op>) = self
            .ops
            .iter()
            .partition(|op| matches!(op, Op::RemoveEmptyDir { .. }));
        let mut dirs = dirs;
        dirs.sort_by_key(|op| match op {
            Op::RemoveEmptyDir { path } => std::cmp::Reverse(path.components().count()),
            _ => std::cmp::Reverse(0),
        });
        for op in files.into_iter().chain(dirs) {
            changed |= apply_op(op, dry_run, &mut out)?;
        }
        if !changed {
            out.push_str("nothing to change\n");
        }
        for n in &self.notes {
            out.push_str(n);
            out.push('\n');
        }
        if changed {
            for n in &self.after_change {
                out.push_str(n);
                out.push('\n');
            }
        }
        Ok(out)
    }
}

/// Symlinks followed at most this deep (the kernel's own limit, `MAXSYMLINKS`).
const MAX_LINKS: usize = 40;

/// The file a write of `path` must replace: `path` itself, or when it is a symlink the file
/// at the end of its chain of links (canonical when it exists; a dangling link's target is
/// created). Replacing the link itself would turn it into a plain file.
fn link_target(path: &Path) -> Result<PathBuf, FileError> {
    let mut p = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {}
            // Not a link (or absent): `p` is the file.
            _ if p == path => return Ok(p),
            _ => return Ok(std::fs::canonicalize(&p).unwrap_or(p)),
        }
        let to = std::fs::read_link(&p).map_err(|source| FileError::Read {
            path: p.clone(),
            source,
        })?;
        p = match p.parent() {
            Some(dir) => dir.join(to),
            None => to,
        };
    }
    Err(FileError::Read {
        path: path.to_path_buf(),
        source: std::io::Error::other(format!("more than {MAX_LINKS} levels of symlinks")),
    })
}

fn apply_op(op: &Op, dry_run: bool, out: &mut String) -> Result<bool, FileError> {
    match op {
        Op::Write { path, text, mode } => {
            let now = read(path)?;
            if now.text.as_deref() == Some(text.as_str()) {
                if now.mode == *mode {
                    out.push_str(&format!("{} is up to date\n", path.display()));
                    return Ok(false);
                }
                // Same text, wider or other permissions (a copy of a file made private
                // since, or a file an older gpuslice wrote): only the mode changes.
                if dry_run {
                    out.push_str(&format!(
                        "would set the mode of {} to {mode:04o} (now {:04o})\n",
                        path.display(),
                        now.mode
                    ));
                    return Ok(true);
                }
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(*mode)).map_err(
                    |source| FileError::Mode {
                        path: path.clone(),
                        source,
                    },
                )?;
                out.push_str(&format!(
                    "set the mode of {} to {mode:04o}\n",
                    path.display()
                ));
                return Ok(true);
            }
            if dry_run {
                out.push_str(&format!("would write {}:\n", path.display()));
                out.push_str(&diff(
                    &path.display().to_string(),
                    now.text.as_deref().unwrap_or(""),
                    text,
                    Context::Lines(3),
                ));
                return Ok(true);
            }
            // A config that is a symlink (config management keeps the real file elsewhere)
            // stays one: the file it points at is replaced, in that file's directory.
            let real = link_target(path)?;
            if let Some(dir) = real.parent() {
                std::fs::create_dir_all(dir).map_err(|source| FileError::Dir {
                    path: dir.to_path_buf(),
                    source,
                })?;
            }
            gpuslice_fsutil::atomic_write(&real, text.as_bytes(), *mode).map_err(|source| {
                FileError::Write {
                    path: real.clone(),
                    source,
                }
            })?;
            if &real == path {
                out.push_str(&format!("wrote {}\n", path.display()));
            } else {
                out.push_str(&format!(
                    "wrote {} (through the symlink {})\n",
                    real.display(),
                    path.display()
                ));
            }
            Ok(true)
        }
        Op::Backup { of, text, mode } => {
            let backup = backup_path(of);
            if backup.exists() {
                return Ok(false);
            }
            if dry_run {
                out.push_str(&format!(
                    "would keep the original as {}\n",
                    backup.display()
                ));
                return Ok(true);
            }
            gpuslice_fsutil::atomic_write(&backup, text.as_bytes(), *mode).map_err(|source| {
                FileError::Write {
                    path: backup.clone(),
                    source,
                }
            })?;
            out.push_str(&format!("kept the original as {}\n", backup.display()));
            Ok(true)
        }
        Op::Remove { path } => {
            if std::fs::symlink_metadata(path).is_err() {
                return Ok(false);
            }
            if dry_run {
                out.push_str(&format!("would remove {}\n", path.display()));
                return Ok(true);
            }
            gpuslice_fsutil::remove_synced(path).map_err(|source| FileError::Remove {
                path: path.clone(),
                source,
            })?;
            out.push_str(&format!("removed {}\n", path.display()));
            Ok(true)
        }
        Op::RemoveEmptyDir { path } => {
            let empty = std::fs::read_dir(path)
                .map(|mut d| d.next().is_none())
                .unwrap_or(false);
            if !empty {
                return Ok(false);
            }
            if dry_run {
                out.push_str(&format!(
                    "would remove empty directory {}\n",
                    path.display()
                ));
                return Ok(true);
            }
            std::fs::remove_dir(path).map_err(|source| FileError::Remove {
                path: path.clone(),
                source,
            })?;
            out.push_str(&format!("removed empty directory {}\n", path.display()));
            Ok(true)
        }
    }
}

/// How one engine's own config file gains and loses the gpuslice registration. `add` must be
/// idempotent and `strip(add(x))` must give back `x`'s settings.
pub trait Edit {
    type Error: From<FileError>;
    /// The text with the registration added.
    fn add(&self, text: &str) -> Result<String, Self::Error>;
    /// The text with the registration taken out (operator edits made since are kept).
    fn strip(&self, text: &str) -> Result<String, Self::Error>;
    /// The file to create when there is none.
    fn create(&self) -> Result<String, Self::Error>;
}

/// Plans adding the registration to `file`: a backup of the original before the first
/// change, then the edited text (or a created file when there was none).
pub fn plan_add<E: Edit>(file: &Current, edit: &E, plan: &mut Plan) -> Result<(), E::Error> {
    match &file.text {
        Some(text) => {
            let new = edit.add(text)?;
            if &new != text {
                plan.ops.push(Op::Backup {
                    of: file.path.clone(),
                    text: text.clone(),
                    mode: file.mode,
                });
            }
            plan.write(&file.path, new, file.mode);
        }
        None => plan.write(&file.path, edit.create()?, file.mode),
    }
    Ok(())
}

/// Plans taking the registration out of `file`. When the file is exactly what gpuslice made
/// of its backup, the backup is restored byte for byte; a file gpuslice created is deleted
/// (created through a symlink: the file at the link's end, the link stays); otherwise (the operator edited it since) only the registration is taken out.
pub fn plan_strip<E: Edit>(file: &Current, edit: &E, plan: &mut Plan) -> Result<(), E::Error> {
    let Some(text) = &file.text else {
        return Ok(());
    };
    let backup = read(&backup_path(&file.path))?;
    let restored = match &backup.text {
        Some(original) if edit.add(original).ok().as_deref() == Some(text.as_str()) => {
            Some(original.clone())
        }
        _ => None,
    };
    if let Some(original) = restored {
        plan.write(&file.path, original, file.mode);
    } else if backup.text.is_none() && edit.create().ok().as_deref() == Some(text.as_str()) {
        // Created through a dangling link: unlinking would take the operator's link and
        // leave the created file; the file goes and the link dangles again, as before.
        plan.remove(&link_target(&file.path)?);
        if let Some(dir) = file.path.parent() {
            plan.ops.push(Op::RemoveEmptyDir {
                path: dir.to_path_buf(),
            });
        }
    } else {
        plan.write(&file.path, edit.strip(text)?, file.mode);
    }
    if backup.text.is_some() {
        plan.remove(&backup.path);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy engine file: the registration is the line `gpuslice`.
    struct Lines;
    impl Edit for Lines {
        type Error = FileError;
        fn add(&self, t: &str) -> Result<String, FileError> {
            if t.lines().any(|l| l == "gpuslice") {
                Ok(t.to_string())
            } else {
                Ok(format!("{t}gpuslice\n"))
            }
        }
        fn strip(&self, t: &str) -> Result<String, FileError> {
            Ok(t.lines()
                .filter(|l| *l != "gpuslice")
                .map(|l| format!("{l}\n"))
                .collect())
        }
        fn create(&self) -> Result<String, FileError> {
            Ok("# created\ngpuslice\n".to_string())
        }
    }

    fn run(path: &Path, remove: bool) -> String {
        let cur = read(path).unwrap();
        let mut plan = Plan::default();
        if remove {
            plan_strip(&cur, &Lines, &mut plan).unwrap();
        } else {
            plan_add(&cur, &Lines, &mut plan).unwrap();
        }
        plan.apply(false).unwrap()
    }

    #[test]
    fn add_keeps_first_backup_and_remove_restores_it_exactly() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("engine.conf");
        std::fs::write(&f, "a = 1\n").unwrap();
        run(&f, false);
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "a = 1\ngpuslice\n");
        assert_eq!(std::fs::read_to_string(backup_path(&f)).unwrap(), "a = 1\n");
        assert!(run(&f, false).contains("nothing to change"));
        run(&f, true);
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "a = 1\n");
        assert!(!backup_path(&f).exists());
        assert!(run(&f, true).contains("nothing to change"));
    }

    #[test]
    fn remove_keeps_operator_edits_made_after_configure() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("engine.conf");
        std::fs::write(&f, "a = 1\n").unwrap();
        run(&f, false);
        std::fs::write(&f, "a = 1\ngpuslice\nb = 2\n").unwrap();
        run(&f, true);
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "a = 1\nb = 2\n");
        assert!(!backup_path(&f).exists());
    }

    #[test]
    fn created_file_is_deleted_on_remove() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("sub/engine.conf");
        run(&f, false);
        assert!(f.exists());
        assert!(!backup_path(&f).exists());
        run(&f, true);
        assert!(!f.exists());
        assert!(
            !f.parent().unwrap().exists(),
            "the directory it created is left"
        );
    }

    #[test]
    fn a_dangling_link_gets_its_target_created_and_stays_a_link() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("engine.conf");
        std::os::unix::fs::symlink("managed/engine.conf", &f).unwrap();
        run(&f, false);
        assert!(std::fs::symlink_metadata(&f)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(
            std::fs::read_to_string(d.path().join("managed/engine.conf")).unwrap(),
            "# created\ngpuslice\n"
        );
        // `--remove` deletes the file it created, not the operator's link.
        run(&f, true);
        assert!(std::fs::symlink_metadata(&f)
            .unwrap()
            .file_type()
            .is_symlink());
        assert!(std::fs::symlink_metadata(d.path().join("managed/engine.conf")).is_err());
    }

    #[test]
    fn dry_run_changes_nothing_and_shows_the_diff() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("engine.conf");
        std::fs::write(&f, "a = 1\nz = 2\n").unwrap();
        let cur = read(&f).unwrap();
        let mut plan = Plan::default();
        plan_add(&cur, &Lines, &mut plan).unwrap();
        let out = plan.apply(true).unwrap();
        assert!(out.contains("+gpuslice"), "{out}");
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "a = 1\nz = 2\n");
        assert!(!backup_path(&f).exists());
    }
}
