//! The host device lookup behind a seam: applying edits fills a device node's missing type
//! and numbers from the host node (as the reference library's `fillMissingInfo` does), and
//! tests replace the lookup with a table so they need no real device files.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

/// The kind of a host device node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostDeviceType {
    /// Block device, OCI type `b`.
    Block,
    /// Character device, OCI type `c`.
    Char,
    /// FIFO, OCI type `p`.
    Fifo,
}

impl HostDeviceType {
    /// The OCI/CDI type letter.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Block => "b",
            Self::Char => "c",
            Self::Fifo => "p",
        }
    }
}

/// What the host says about a device node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostDevice {
    /// Its type.
    pub device_type: HostDeviceType,
    /// Major number (0 for a FIFO).
    pub major: i64,
    /// Minor number (0 for a FIFO).
    pub minor: i64,
}

/// Looks up host device nodes.
pub trait DeviceStat {
    /// `Ok(Some(_))` for a block, character or FIFO node at `path` (not following a final
    /// symlink, like `lstat`), `Ok(None)` when `path` exists but is something else.
    fn stat(&self, path: &Path) -> std::io::Result<Option<HostDevice>>;
}

/// The real host: `lstat(2)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostDeviceStat;

impl DeviceStat for HostDeviceStat {
    fn stat(&self, path: &Path) -> std::io::Result<Option<HostDevice>> {
        let meta = std::fs::symlink_metadata(path)?;
        let file_type = meta.file_type();
        let device_type = if file_type.is_block_device() {
            HostDeviceType::Block
        } else if file_type.is_char_device() {
            HostDeviceType::Char
        } else if file_type.is_fifo() {
            HostDeviceType::Fifo
        } else {
            return Ok(None);
        };
        let rdev = meta.rdev();
        Ok(Some(HostDevice {
            device_type,
            major: i64::from(libc::major(rdev)),
            minor: i64::from(libc::minor(rdev)),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_null_is_char_1_3() {
        let d = HostDeviceStat
            .stat(Path::new("/dev/null"))
            .expect("stat")
            .expect("device");
        assert_eq!(
            d,
            HostDevice {
                device_type: HostDeviceType::Char,
                major: 1,
                minor: 3
            }
        );
    }

    #[test]
    fn regular_file_is_not_a_device_and_missing_is_an_error() {
        let f = tempfile::NamedTempFile::new().expect("tmp");
        assert_eq!(HostDeviceStat.stat(f.path()).expect("stat"), None);
        assert!(HostDeviceStat
            .stat(Path::new("/nonexistent/gpuslice"))
            .is_err());
    }
}
