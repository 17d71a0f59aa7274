//! The process facts the node agent reads from `/proc` itself: a process's pid namespace
//! (`/proc/<pid>/ns/pid`, a kernel link no container can write). The proc root is a
//! parameter so tests run on fixture directories. Which reservation a process belongs to is
//! decided in `attribution` from these facts and the registry's.

use std::path::{Path, PathBuf};

/// A `/proc` entry that cannot be read or understood.
#[derive(Debug, thiserror::Error)]
pub enum ProcError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: `{found}` is not a pid namespace link; accepted: pid:[<inode>]")]
    NsLink { path: PathBuf, found: String },
}

/// The proc filesystem under `root` (normally `/proc`).
#[derive(Debug, Clone)]
pub struct ProcFs {
    root: PathBuf,
}

/// Parses a pid namespace link target, `pid:[4026531836]`.
pub fn parse_ns_link(text: &str) -> Option<u64> {
    text.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok()
}

impl ProcFs {
    pub fn new(root: impl Into<PathBuf>) -> ProcFs {
        ProcFs { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Inode of the pid namespace of `who` (a pid, or `self`).
    pub fn pid_ns(&self, who: &str) -> Result<u64, ProcError> {
        let path = self.root.join(who).join("ns/pid");
        let target = std::fs::read_link(&path).map_err(|source| ProcError::Read {
            path: path.clone(),
            source,
        })?;
        let text = target.to_string_lossy();
        parse_ns_link(&text).ok_or_else(|| ProcError::NsLink {
            path,
            found: text.into_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_namespace_links() {
        assert_eq!(parse_ns_link("pid:[4026531836]"), Some(4026531836));
        assert_eq!(parse_ns_link("net:[4026531836]"), None);
        assert_eq!(parse_ns_link("pid:[x]"), None);
    }

    #[test]
    fn reads_the_namespace_from_a_fixture_proc() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("4242/ns")).unwrap();
        std::os::unix::fs::symlink("pid:[4026532999]", root.path().join("4242/ns/pid")).unwrap();
        let proc = ProcFs::new(root.path());
        assert_eq!(proc.pid_ns("4242").unwrap(), 4026532999);
        // A vanished process is an error naming the path, not a panic.
        let e = proc.pid_ns("4243").unwrap_err();
        assert!(e.to_string().contains("4243/ns/pid"), "{e}");
        std::fs::create_dir_all(root.path().join("7/ns")).unwrap();
        std::os::unix::fs::symlink("net:[1]", root.path().join("7/ns/pid")).unwrap();
        assert!(matches!(proc.pid_ns("7"), Err(ProcError::NsLink { .. })));
    }
}
