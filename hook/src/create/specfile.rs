//! Reading a bundle's `config.json` within a bound: `gpuslice-runtime` runs as root on
//! whatever the engine (or whoever can write the bundle) put there, so it refuses what is
//! not a regular file (a symlink to `/dev/zero`, a FIFO) and never reads past
//! [`MAX_SPEC_BYTES`].

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The largest OCI spec read: 16 MiB. runc itself reads `config.json` without a limit,
/// but no engine produces a spec anywhere near this: containerd's CRI requests (which carry a
/// container's env, mounts and annotations) are capped by its 16 MiB gRPC message limit, a
/// Kubernetes object by etcd's 1.5 MiB request limit, and `runc spec` writes ~3 KiB (a
/// large seccomp profile adds ~100 KiB). docs/troubleshooting.md says the same.
pub const MAX_SPEC_BYTES: u64 = 16 << 20;

/// `config.json` could not be read, or is not something the wrapper reads.
#[derive(Debug, thiserror::Error)]
pub enum SpecFileError {
    #[error("cannot read OCI spec {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("OCI spec {path} is {kind}, not a regular file; accepted: a regular file (a symlink to one is followed) of at most {} MiB", MAX_SPEC_BYTES >> 20)]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error("OCI spec {path} is larger than {} MiB, the limit gpuslice-runtime reads; accepted: a regular file of at most {} MiB (see docs/troubleshooting.md)", MAX_SPEC_BYTES >> 20, MAX_SPEC_BYTES >> 20)]
    TooLarge { path: PathBuf },
}

fn kind(t: std::fs::FileType) -> &'static str {
    if t.is_dir() {
        "a directory"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// Reads the regular file `path` (symlinks followed: some engines link the bundle's spec),
/// at most `limit` bytes; anything else, or anything larger, is refused.
pub fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>, SpecFileError> {
    let io = |source| SpecFileError::Io {
        path: path.to_path_buf(),
        source,
    };
    // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below. It does
    // not change reads of a regular file.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(path)
        .map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.file_type().is_file() {
        return Err(SpecFileError::NotRegular {
            path: path.to_path_buf(),
            kind: kind(meta.file_type()),
        });
    }
    if meta.len() > limit {
        return Err(SpecFileError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    // The size may change while we read: never read more than one byte past the bound.
    let mut buf = Vec::with_capacity(meta.len() as usize);
    file.take(limit + 1).read_to_end(&mut buf).map_err(io)?;
    if buf.len() as u64 > limit {
        return Err(SpecFileError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    Ok(buf)
}

/// [`read_bounded`] with [`MAX_SPEC_BYTES`].
pub fn read_spec(path: &Path) -> Result<Vec<u8>, SpecFileError> {
    read_bounded(path, MAX_SPEC_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_regular_files_and_symlinks_to_them_within_the_bound() {
        let d = tempfile::tempdir().expect("tempdir");
        let p = d.path().join("config.json");
        std::fs::write(&p, b"{\"a\":1}").expect("write");
        assert_eq!(read_bounded(&p, 7).expect("fits"), b"{\"a\":1}");
        let e = read_bounded(&p, 6).expect_err("too large").to_string();
        assert!(
            e.contains(&p.display().to_string()) && e.contains("16 MiB"),
            "{e}"
        );
        let link = d.path().join("link.json");
        std::os::unix::fs::symlink(&p, &link).expect("symlink");
        assert_eq!(read_bounded(&link, 100).expect("followed"), b"{\"a\":1}");
    }

    #[test]
    fn refuses_devices_fifos_and_directories_without_reading() {
        let d = tempfile::tempdir().expect("tempdir");
        let zero = d.path().join("zero");
        std::os::unix::fs::symlink("/dev/zero", &zero).expect("symlink");
        let fifo = d.path().join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .expect("mkfifo");
        for (p, want) in [
            (zero, "a character device"),
            (fifo, "a FIFO"),
            (d.path().to_path_buf(), "a directory"),
        ] {
            let e = read_spec(&p).expect_err("refused").to_string();
            assert!(
                e.contains(&format!("{} is {want}, not a regular file", p.display())),
                "{e}"
            );
            assert!(!e.contains('\n'));
        }
        let e = read_spec(&d.path().join("missing")).expect_err("missing");
        assert!(matches!(e, SpecFileError::Io { .. }), "{e}");
    }
}
