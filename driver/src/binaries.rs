//! The driver's utility programs mounted into containers when the host has them
//! (`nvidia-smi`, as the NVIDIA Container Toolkit's "utility" capability does), found in the
//! standard binary directories of the driver root.

use std::path::{Path, PathBuf};

use crate::libraries::{resolve_in_root, LibrariesError};

/// The driver programs mounted when present.
pub const UTILITY_BINARIES: &[&str] = &["nvidia-smi", "nvidia-debugdump", "nvidia-persistenced"];

/// Directories searched, in order.
pub const BINARY_DIRS: &[&str] = &["/usr/bin", "/usr/local/bin", "/bin", "/usr/sbin", "/sbin"];

/// One program to mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverBinary {
    pub name: String,
    /// The file on the host (symlinks resolved inside the root).
    pub host_path: PathBuf,
    /// Where it appears in the container (`/usr/bin/<name>`).
    pub container_path: PathBuf,
}

/// Finds `names` under `root`; absent programs (and dangling links) are skipped, links are
/// followed only inside the root, and a link loop is an error.
pub fn discover_binaries(root: &Path, names: &[&str]) -> Result<Vec<DriverBinary>, LibrariesError> {
    let mut found = Vec::new();
    for name in names {
        for dir in BINARY_DIRS {
            let inside = Path::new(dir).join(name);
            let on_host = root.join(inside.strip_prefix("/").unwrap_or(&inside));
            if std::fs::symlink_metadata(&on_host).is_err() {
                continue;
            }
            let host_path = match resolve_in_root(root, &inside) {
                Ok(p) => p,
                // A dangling link: the program is not there.
                Err(LibrariesError::Read { .. }) => continue,
                Err(e) => return Err(e),
            };
            if host_path.is_file() {
                found.push(DriverBinary {
                    name: name.to_string(),
                    host_path,
                    container_path: Path::new("/usr/bin").join(name),
                });
                break;
            }
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_nvidia_smi_when_present_and_skips_it_when_not() {
        let root = tempfile::tempdir().expect("tempdir");
        assert!(discover_binaries(root.path(), UTILITY_BINARIES)
            .expect("empty")
            .is_empty());
        let bin = root.path().join("usr/bin");
        std::fs::create_dir_all(&bin).expect("mkdir");
        std::fs::write(bin.join("nvidia-smi.550"), b"\x7fELF").expect("write");
        std::os::unix::fs::symlink("nvidia-smi.550", bin.join("nvidia-smi")).expect("link");
        let found = discover_binaries(root.path(), UTILITY_BINARIES).expect("found");
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].host_path, bin.join("nvidia-smi.550"));
        assert_eq!(found[0].container_path, Path::new("/usr/bin/nvidia-smi"));
        // An absolute link is read inside the root, never on the host: dangling there.
        std::fs::remove_file(bin.join("nvidia-smi")).expect("rm");
        std::os::unix::fs::symlink("/etc/passwd", bin.join("nvidia-smi")).expect("link");
        assert!(discover_binaries(root.path(), UTILITY_BINARIES)
            .expect("skipped")
            .is_empty());
    }
}
