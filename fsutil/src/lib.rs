//! Atomic replacement of files that others read while we write them (registry, CDI specs,
//! config.json, limits): temp file in the same directory, fsync, rename, fsync the directory;
//! and the diff a dry run prints of what such a write would change ([`diff`]).

pub mod diff;

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// A write that did not happen; the target is untouched.
#[derive(Debug, thiserror::Error)]
pub enum AtomicWriteError {
    #[error("cannot write {path}: {path} has no parent directory")]
    NoParent { path: PathBuf },
    #[error("cannot write {path}: {step} {tmp}: {source}")]
    Io {
        path: PathBuf,
        tmp: PathBuf,
        step: &'static str,
        source: std::io::Error,
    },
}

/// Replaces `path` with `contents` atomically, with permission bits `mode`. Readers see the
/// old file or the new one, never a mix; after return the new file survives a crash.
pub fn atomic_write(path: &Path, contents: &[u8], mode: u32) -> Result<(), AtomicWriteError> {
    atomic_write_sized(path, contents, contents.len() as u64, mode)
}

/// Like [`atomic_write`], for a file of `len` bytes that starts with `head` and is zero
/// after it: the zeros are a hole (no page written or allocated until someone writes there),
/// so a large, mostly empty file costs what its header costs.
pub fn atomic_write_sized(
    path: &Path,
    head: &[u8],
    len: u64,
    mode: u32,
) -> Result<(), AtomicWriteError> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .ok_or_else(|| AtomicWriteError::NoParent {
            path: path.to_path_buf(),
        })?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut attempt = 0u32;
    loop {
        let tmp = dir.join(format!(".{name}.tmp.{}.{attempt}", std::process::id()));
        let io = |step: &'static str, source: std::io::Error| AtomicWriteError::Io {
            path: path.to_path_buf(),
            tmp: tmp.clone(),
            step,
            source,
        };
        let mut file = match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 64 => {
                // A stale temp file of a dead writer with our pid; try another name.
                attempt += 1;
                continue;
            }
            Err(e) => return Err(io("creating", e)),
        };
        let result = (|| {
            file.write_all(head).map_err(|e| io("writing", e))?;
            if len > head.len() as u64 {
                file.set_len(len).map_err(|e| io("extending", e))?;
            }
            // The umask may have narrowed the mode at creation.
            file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode))
                .map_err(|e| io("setting permissions of", e))?;
            // On a memory filesystem (the state dir is a tmpfs) nothing outlives a crash and
            // fsync does nothing, so the three system calls it takes are saved there.
            let durable = !in_memory(&file);
            if durable {
                file.sync_all().map_err(|e| io("syncing", e))?;
            }
            fs::rename(&tmp, path).map_err(|e| io("renaming", e))?;
            if durable {
                sync_dir(dir).map_err(|e| io("syncing directory of", e))?;
            }
            Ok(())
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        return result;
    }
}

/// Whether `file` lives on tmpfs or ramfs, where fsync has nothing to write. Unknown
/// (statfs failed) counts as durable storage.
fn in_memory(file: &File) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    rustix::fs::fstatfs(file).is_ok_and(|s| {
        // `f_type` is `__fsword_t`, whose width depends on the architecture.
        #[allow(clippy::useless_conversion)]
        let kind = i64::from(s.f_type);
        kind == TMPFS_MAGIC || kind == RAMFS_MAGIC
    })
}

/// Removes `path` and syncs its directory; a missing file is not an error.
pub fn remove_synced(path: &Path) -> std::io::Result<()> {
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    }
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => sync_dir(dir),
        _ => Ok(()),
    }
}

/// fsyncs a directory so a rename or unlink in it is durable.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn writes_and_replaces_with_mode() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("f.json");
        atomic_write(&p, b"one", 0o600).expect("first write");
        assert_eq!(fs::read(&p).expect("read"), b"one");
        atomic_write(&p, b"two", 0o644).expect("second write");
        assert_eq!(fs::read(&p).expect("read"), b"two");
        assert_eq!(
            fs::metadata(&p).expect("meta").permissions().mode() & 0o777,
            0o644
        );
        let leftovers: Vec<_> = fs::read_dir(dir.path())
            .expect("readdir")
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains(".tmp."))
            .collect();
        assert!(leftovers.is_empty(), "temp files left behind");
    }

    #[test]
    fn memory_filesystems_are_told_apart() {
        // /dev/shm is a tmpfs on every Linux with POSIX shared memory.
        let shm = tempfile::tempdir_in("/dev/shm").expect("tempdir in /dev/shm");
        let f = File::create(shm.path().join("x")).expect("create");
        assert!(in_memory(&f));
        atomic_write(&shm.path().join("y"), b"y", 0o600).expect("write on tmpfs");
        assert_eq!(fs::read(shm.path().join("y")).expect("read"), b"y");
        // procfs is neither: it counts as durable storage, so writers there would sync.
        let proc = File::open("/proc/self/stat").expect("open /proc/self/stat");
        assert!(!in_memory(&proc));
    }

    #[test]
    fn failure_names_the_path_and_leaves_target() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("missing-dir").join("f.json");
        let e = atomic_write(&p, b"x", 0o600).expect_err("no directory");
        assert!(e.to_string().contains("missing-dir"), "{e}");
        assert!(!p.exists());
    }

    #[test]
    fn sized_write_has_header_then_zeros() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("usage");
        atomic_write_sized(&p, b"HEAD", 1 << 20, 0o666).expect("write");
        let bytes = fs::read(&p).expect("read");
        assert_eq!(bytes.len(), 1 << 20);
        assert_eq!(&bytes[..4], b"HEAD");
        assert!(bytes[4..].iter().all(|b| *b == 0));
        assert_eq!(
            fs::metadata(&p).expect("meta").permissions().mode() & 0o777,
            0o666
        );
    }

    #[test]
    fn remove_is_idempotent() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("x");
        fs::write(&p, b"1").expect("write");
        remove_synced(&p).expect("remove");
        remove_synced(&p).expect("remove again");
        assert!(!p.exists());
    }
}
