//! The GPUs the driver reported unhealthy, as the agent's health watch records them in
//! `<state_dir>/health.json` (replaced atomically) for every node path that must not hand
//! them out: the create path refuses them by name, the kubelet plugin taints or withdraws
//! them, `status` and the exporter show them. A GPU is listed from its fatal XID until the
//! driver shows it recovered (docs/troubleshooting.md, "GPU health and XIDs").

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// The only `version` of `health.json` this code reads and writes.
pub const HEALTH_VERSION: u32 = 1;

/// XID 154, "GPU recovery action changed": the driver's own XID for asking for a reset or a
/// reboot. A GPU found asking for one without its XID having been seen (`gpuslice serve` was
/// not running, its event set was being rebuilt) is recorded with it.
pub const XID_RECOVERY_ACTION_CHANGED: u32 = 154;

/// One GPU the driver reported a fatal XID for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Unhealthy {
    /// Host index (NVML index).
    pub index: u32,
    /// `GPU-<uuid>`.
    pub uuid: String,
    /// The XID that made it unhealthy.
    pub xid: u32,
    /// When the XID was reported, ms since the Unix epoch.
    pub since_ms: u64,
    /// Whether the driver was seen asking for a recovery (a reset, or the GPU lost) since
    /// the mark: only a GPU whose driver asked and then stopped asking is healthy again. A
    /// record of an earlier release has no such field and counts as not seen. Left out while
    /// false, so such a record stays readable by the earlier release.
    #[serde(default, skip_serializing_if = "is_false")]
    pub recovery_seen: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Unhealthy {
    /// The time of the XID, RFC 3339 in UTC to the second.
    pub fn since_text(&self) -> String {
        let at = UNIX_EPOCH + Duration::from_millis(self.since_ms);
        humantime::format_rfc3339_seconds(at).to_string()
    }
}

impl std::fmt::Display for Unhealthy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.xid == XID_RECOVERY_ACTION_CHANGED {
            return write!(
                f,
                "GPU {} ({}) is unhealthy: the driver asks for a recovery (XID {}, GPU recovery action changed) since {}",
                self.index,
                self.uuid,
                self.xid,
                self.since_text()
            );
        }
        write!(
            f,
            "GPU {} ({}) is unhealthy: the driver reported XID {} at {}",
            self.index,
            self.uuid,
            self.xid,
            self.since_text()
        )
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct HealthDoc {
    version: u32,
    unhealthy: Vec<Unhealthy>,
}

/// `health.json` that cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum HealthError {
    #[error("cannot read the GPU health record {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a valid GPU health record (version {HEALTH_VERSION}): {detail}; `gpuslice serve` rewrites it")]
    Parse { path: PathBuf, detail: String },
    #[error("cannot write the GPU health record {path}: {source}")]
    Write {
        path: PathBuf,
        source: gpuslice_fsutil::AtomicWriteError,
    },
}

/// The unhealthy GPUs recorded at `path`; none when the file does not exist (no health watch
/// ran, or every GPU is healthy).
pub fn read_health(path: &Path) -> Result<Vec<Unhealthy>, HealthError> {
    let text = match std::fs::read(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(HealthError::Read {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let parse = |detail: String| HealthError::Parse {
        path: path.to_path_buf(),
        detail,
    };
    let doc: HealthDoc = serde_json::from_slice(&text).map_err(|e| parse(e.to_string()))?;
    if doc.version != HEALTH_VERSION {
        return Err(parse(format!("version {}", doc.version)));
    }
    Ok(doc.unhealthy)
}

/// Records `unhealthy` at `path` atomically (mode 0644), sorted by index.
pub fn write_health(path: &Path, unhealthy: &[Unhealthy]) -> Result<(), HealthError> {
    let mut list = unhealthy.to_vec();
    list.sort_by_key(|u| u.index);
    let doc = HealthDoc {
        version: HEALTH_VERSION,
        unhealthy: list,
    };
    let mut text = serde_json::to_vec_pretty(&doc).map_err(|e| HealthError::Parse {
        path: path.to_path_buf(),
        detail: e.to_string(),
    })?;
    text.push(b'\n');
    gpuslice_fsutil::atomic_write(path, &text, 0o644).map_err(|source| HealthError::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// The record of GPU `uuid` in `list`, if it is unhealthy.
pub fn find<'a>(list: &'a [Unhealthy], uuid: &str) -> Option<&'a Unhealthy> {
    list.iter().find(|u| u.uuid.eq_ignore_ascii_case(uuid))
}

/// Now, in ms since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sick() -> Unhealthy {
        Unhealthy {
            index: 1,
            uuid: "GPU-11111111-2222-3333-4444-555555555555".into(),
            xid: 79,
            since_ms: 1_796_000_000_000,
            recovery_seen: false,
        }
    }

    #[test]
    fn round_trips_and_a_missing_file_is_all_healthy() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("health.json");
        assert!(read_health(&path).expect("missing").is_empty());
        write_health(&path, &[sick()]).expect("write");
        let back = read_health(&path).expect("read");
        assert_eq!(back, [sick()]);
        assert_eq!(
            find(&back, "gpu-11111111-2222-3333-4444-555555555555"),
            Some(&sick())
        );
        assert!(find(&back, "GPU-00000000-2222-3333-4444-555555555555").is_none());
        write_health(&path, &[]).expect("clear");
        assert!(read_health(&path).expect("read").is_empty());
    }

    #[test]
    fn a_record_of_the_earlier_release_reads_as_recovery_not_seen_and_round_trips() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("health.json");
        // As the earlier release wrote it: no `recovery_seen`.
        std::fs::write(
            &path,
            br#"{"version":1,"unhealthy":[{"index":1,"uuid":"GPU-11111111-2222-3333-4444-555555555555","xid":79,"since_ms":1796000000000}]}"#,
        )
        .expect("write");
        assert_eq!(read_health(&path).expect("read"), [sick()]);
        // Not seen: written as the earlier release writes it.
        write_health(&path, &[sick()]).expect("write");
        let text = std::fs::read_to_string(&path).expect("read back");
        assert!(!text.contains("recovery_seen"), "{text}");
        let seen = Unhealthy {
            recovery_seen: true,
            ..sick()
        };
        write_health(&path, std::slice::from_ref(&seen)).expect("write");
        assert_eq!(read_health(&path).expect("read"), [seen]);
    }

    #[test]
    fn the_line_names_gpu_xid_and_time() {
        let line = sick().to_string();
        assert_eq!(
            line,
            "GPU 1 (GPU-11111111-2222-3333-4444-555555555555) is unhealthy: the driver reported XID 79 at 2026-11-30T00:53:20Z"
        );
    }

    #[test]
    fn a_gpu_asking_for_recovery_without_its_xid_says_so() {
        let u = Unhealthy {
            xid: XID_RECOVERY_ACTION_CHANGED,
            ..sick()
        };
        assert_eq!(
            u.to_string(),
            "GPU 1 (GPU-11111111-2222-3333-4444-555555555555) is unhealthy: the driver asks for a recovery (XID 154, GPU recovery action changed) since 2026-11-30T00:53:20Z"
        );
    }

    #[test]
    fn a_foreign_file_is_refused_naming_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("health.json");
        std::fs::write(&path, br#"{"version":2,"unhealthy":[]}"#).expect("write");
        let e = read_health(&path).expect_err("version 2").to_string();
        assert!(e.contains("health.json") && e.contains("version 2"), "{e}");
    }
}
