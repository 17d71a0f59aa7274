//! `limits.json`: the host-written limits of one slice, read by the shim (docs/shim.md).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::usage::MAX_DEVICES;

/// Name of the limits file in a slice directory.
pub const LIMITS_FILE: &str = "limits.json";
/// The only version this build reads and writes.
pub const LIMITS_VERSION: u32 = 1;

/// The limits of one slice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    pub version: u32,
    /// Reservation id.
    pub reservation: String,
    pub devices: Vec<DeviceLimit>,
}

/// The limit on one GPU, matched to a CUDA device by UUID.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceLimit {
    /// `GPU-<uuid>`.
    pub uuid: String,
    /// Bytes the slice may allocate on this GPU.
    pub memory_limit: u64,
    /// Compute share in percent; 0 means not throttled.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cores: u8,
}

fn is_zero(v: &u8) -> bool {
    *v == 0
}

/// A limits file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LimitsError {
    #[error("limits file {path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("limits file {path}: invalid JSON: {source}")]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("limits file {path}: version {found} is not supported; this build reads version {LIMITS_VERSION}")]
    Version { path: PathBuf, found: u32 },
    #[error("limits file {path}: device {uuid}: cores {cores} is outside 0-100")]
    Cores {
        path: PathBuf,
        uuid: String,
        cores: u8,
    },
    #[error("limits file {path}: no devices")]
    Empty { path: PathBuf },
    #[error("limits file {path}: {count} devices; at most {MAX_DEVICES} are supported (the usage file has {MAX_DEVICES} device records)")]
    TooManyDevices { path: PathBuf, count: usize },
    #[error("cannot write limits file {path}: {source}")]
    Write {
        path: PathBuf,
        source: gpuslice_fsutil::AtomicWriteError,
    },
}

impl Limits {
    /// Parses and checks limits text; `path` names the file in errors.
    pub fn from_json(text: &[u8], path: &Path) -> Result<Limits, LimitsError> {
        let limits: Limits = serde_json::from_slice(text).map_err(|source| LimitsError::Parse {
            path: path.to_path_buf(),
            source,
        })?;
        if limits.version != LIMITS_VERSION {
            return Err(LimitsError::Version {
                path: path.to_path_buf(),
                found: limits.version,
            });
        }
        if limits.devices.is_empty() {
            return Err(LimitsError::Empty {
                path: path.to_path_buf(),
            });
        }
        // Device `i` is usage-file device `i`: an entry past the usage file's device records
        // could be reported free yet never charged, so such a file is refused whole.
        if limits.devices.len() > MAX_DEVICES {
            return Err(LimitsError::TooManyDevices {
                path: path.to_path_buf(),
                count: limits.devices.len(),
            });
        }
        if let Some(d) = limits.devices.iter().find(|d| d.cores > 100) {
            return Err(LimitsError::Cores {
                path: path.to_path_buf(),
                uuid: d.uuid.clone(),
                cores: d.cores,
            });
        }
        Ok(limits)
    }

    /// Reads and checks a limits file.
    pub fn read(path: &Path) -> Result<Limits, LimitsError> {
        let text = std::fs::read(path).map_err(|source| LimitsError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Limits::from_json(&text, path)
    }

    /// Serialises in the contract's field order.
    pub fn to_json(&self) -> Vec<u8> {
        // Serialising plain structs of strings and integers cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Writes the file atomically, readable by everyone, writable by the owner only.
    pub fn write(&self, path: &Path) -> Result<(), LimitsError> {
        gpuslice_fsutil::atomic_write(path, &self.to_json(), 0o644).map_err(|source| {
            LimitsError::Write {
                path: path.to_path_buf(),
                source,
            }
        })
    }

    /// The limit for the device with this UUID (compared case-insensitively).
    pub fn device(&self, uuid: &str) -> Option<&DeviceLimit> {
        self.devices
            .iter()
            .find(|d| d.uuid.eq_ignore_ascii_case(uuid))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contract_example_parses() {
        let text = br#"{"version": 1, "reservation": "r1",
 "devices": [{"uuid": "GPU-aaaa", "memory_limit": 4294967296, "cores": 30}]}"#;
        let l = Limits::from_json(text, Path::new("/x")).expect("parses");
        assert_eq!(l.devices[0].memory_limit, 4 << 30);
        assert_eq!(l.devices[0].cores, 30);
        assert_eq!(l.device("gpu-AAAA").map(|d| d.cores), Some(30));
    }

    #[test]
    fn cores_absent_means_zero_and_round_trips() {
        let text =
            br#"{"version":1,"reservation":"r","devices":[{"uuid":"GPU-b","memory_limit":1}]}"#;
        let l = Limits::from_json(text, Path::new("/x")).expect("parses");
        assert_eq!(l.devices[0].cores, 0);
        assert_eq!(l.to_json(), text.to_vec());
    }

    #[test]
    fn refuses_bad_files_naming_the_path() {
        for (text, want) in [
            (&br#"{"version":2,"reservation":"r","devices":[{"uuid":"u","memory_limit":1}]}"#[..], "version 2"),
            (br#"{"version":1,"reservation":"r","devices":[]}"#, "no devices"),
            (br#"{"version":1,"reservation":"r","devices":[{"uuid":"u","memory_limit":1,"cores":101}]}"#, "cores 101"),
            (br#"{"version":1,"reservation":"r","devices":[{"uuid":"u","memory_limit":-1}]}"#, "invalid JSON"),
            (br#"{"version":1,"reservation":"r","extra":1,"devices":[]}"#, "invalid JSON"),
            (b"not json", "invalid JSON"),
        ] {
            let e = Limits::from_json(text, Path::new("/slices/r/limits.json")).expect_err("refused");
            let s = e.to_string();
            assert!(s.contains("/slices/r/limits.json") && s.contains(want), "{s}");
        }
    }

    #[test]
    fn refuses_more_devices_than_the_usage_file_holds() {
        let devices = |n: usize| Limits {
            version: 1,
            reservation: "r".into(),
            devices: (0..n)
                .map(|i| DeviceLimit {
                    uuid: format!("GPU-{i}"),
                    memory_limit: 1,
                    cores: 0,
                })
                .collect(),
        };
        let path = Path::new("/slices/r/limits.json");
        let max = devices(MAX_DEVICES);
        assert_eq!(Limits::from_json(&max.to_json(), path).ok(), Some(max));
        let e = Limits::from_json(&devices(MAX_DEVICES + 1).to_json(), path).expect_err("refused");
        let s = e.to_string();
        assert!(
            s.contains("/slices/r/limits.json")
                && s.contains("17 devices")
                && s.contains("at most 16"),
            "{s}"
        );
    }
}
