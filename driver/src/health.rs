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
    /// the mark: only a GPU whose driver asked and then stopped asking is healthy again. Not
    /// in `health.json`, which keeps the earlier release's format (its strict readers, the
    /// kubelet plugin and the hooks of a node half-upgraded, refuse an unknown field): the
    /// agent keeps it in [`RECOVERY_SEEN_FILE`] beside it ([`write_health`],
    /// [`read_health_with_recovery`]).
    #[serde(skip)]
    pub recovery_seen: bool,
}

/// Beside `health.json`: the marks of it whose driver was seen asking for a recovery, which
/// only the agent's health watch reads.
pub const RECOVERY_SEEN_FILE: &str = "health-recovery-seen.json";

/// The `version` of [`RECOVERY_SEEN_FILE`] this code writes: each mark by UUID and time.
/// Version 1 (UUIDs alone, the earlier release's) is still read.
pub const RECOVERY_SEEN_VERSION: u32 = 2;

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecoverySeenDoc {
    version: u32,
    seen: Vec<SeenEntry>,
}

/// One mark whose recovery was seen. The two files are written one after the other, so the
/// mark's time ties the entry to the record it was written with: an entry left from an
/// earlier mark of the same GPU (the agent stopped between the two writes) counts for no
/// later one.
#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
enum SeenEntry {
    Mark(SeenMark),
    /// Version 1: the UUID alone.
    Uuid(String),
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SeenMark {
    uuid: String,
    since_ms: u64,
}

impl SeenEntry {
    fn is_of(&self, u: &Unhealthy) -> bool {
        match self {
            SeenEntry::Mark(m) => m.uuid.eq_ignore_ascii_case(&u.uuid) && m.since_ms == u.since_ms,
            SeenEntry::Uuid(uuid) => uuid.eq_ignore_ascii_case(&u.uuid),
        }
    }
}

/// The path of [`RECOVERY_SEEN_FILE`] beside the health record at `health_path`.
pub fn recovery_seen_path(health_path: &Path) -> PathBuf {
    health_path.with_file_name(RECOVERY_SEEN_FILE)
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
    #[error("{path} is not a valid GPU health record (version {HEALTH_VERSION}): {detail}; no GPU of this node is given new work while it cannot be read, and `gpuslice serve` leaves it as it is: restore it, or remove it to have the GPUs' health recorded afresh")]
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

/// Records `unhealthy` at `path` atomically (mode 0644), sorted by index, then which of them
/// had a recovery seen in [`recovery_seen_path`] (also atomically).
pub fn write_health(path: &Path, unhealthy: &[Unhealthy]) -> Result<(), HealthError> {
    let mut list = unhealthy.to_vec();
    list.sort_by_key(|u| u.index);
    let seen = RecoverySeenDoc {
        version: RECOVERY_SEEN_VERSION,
        seen: list
            .iter()
            .filter(|u| u.recovery_seen)
            .map(|u| {
                SeenEntry::Mark(SeenMark {
                    uuid: u.uuid.clone(),
                    since_ms: u.since_ms,
                })
            })
            .collect(),
    };
    let doc = HealthDoc {
        version: HEALTH_VERSION,
        unhealthy: list,
    };
    write_json(path, &doc)?;
    write_json(&recovery_seen_path(path), &seen)
}

fn write_json<T: Serialize>(path: &Path, doc: &T) -> Result<(), HealthError> {
    let mut text = serde_json::to_vec_pretty(doc).map_err(|e| HealthError::Parse {
        path: path.to_path_buf(),
        detail: e.to_string(),
    })?;
    text.push(b'\n');
    gpuslice_fsutil::atomic_write(path, &text, 0o644).map_err(|source| HealthError::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// The record at `path` with the recoveries seen of [`recovery_seen_path`] (none where that
/// file is missing: an earlier release wrote the record). An entry counts for the record's
/// mark of the same GPU and time (a version 1 file's, for its GPU); one of a GPU or mark
/// not in the record is ignored.
pub fn read_health_with_recovery(path: &Path) -> Result<Vec<Unhealthy>, HealthError> {
    let mut list = read_health(path)?;
    let seen_path = recovery_seen_path(path);
    let text = match std::fs::read(&seen_path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(list),
        Err(source) => {
            return Err(HealthError::Read {
                path: seen_path,
                source,
            })
        }
    };
    let parse = |detail: String| HealthError::Parse {
        path: seen_path.clone(),
        detail,
    };
    let doc: RecoverySeenDoc = serde_json::from_slice(&text).map_err(|e| parse(e.to_string()))?;
    let shaped = match doc.version {
        1 => doc.seen.iter().all(|e| matches!(e, SeenEntry::Uuid(_))),
        RECOVERY_SEEN_VERSION => doc.seen.iter().all(|e| matches!(e, SeenEntry::Mark(_))),
        v => return Err(parse(format!("version {v}"))),
    };
    if !shaped {
        return Err(parse(format!(
            "an entry of another version than {}",
            doc.version
        )));
    }
    for u in &mut list {
        u.recovery_seen = doc.seen.iter().any(|e| e.is_of(u));
    }
    Ok(list)
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
    fn the_record_keeps_the_earlier_release_format_and_recoveries_seen_live_beside_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("health.json");
        // As the earlier release wrote it: no file of recoveries seen.
        let earlier = br#"{"version":1,"unhealthy":[{"index":1,"uuid":"GPU-11111111-2222-3333-4444-555555555555","xid":79,"since_ms":1796000000000}]}"#;
        std::fs::write(&path, earlier).expect("write");
        assert_eq!(read_health(&path).expect("read"), [sick()]);
        assert_eq!(read_health_with_recovery(&path).expect("read"), [sick()]);
        let seen = Unhealthy {
            recovery_seen: true,
            ..sick()
        };
        let other = Unhealthy {
            index: 2,
            uuid: "GPU-22222222-2222-3333-4444-555555555555".into(),
            ..sick()
        };
        write_health(&path, &[other.clone(), seen.clone()]).expect("write");
        // health.json is what the earlier release writes and reads: no new field.
        let text = std::fs::read_to_string(&path).expect("read back");
        assert!(!text.contains("recovery"), "{text}");
        let doc: serde_json::Value = serde_json::from_str(&text).expect("json");
        for u in doc["unhealthy"].as_array().expect("list") {
            let mut keys: Vec<&str> = u
                .as_object()
                .expect("entry")
                .keys()
                .map(|k| k.as_str())
                .collect();
            keys.sort_unstable();
            assert_eq!(keys, ["index", "since_ms", "uuid", "xid"], "{text}");
        }
        assert_eq!(read_health(&path).expect("read"), [sick(), other.clone()]);
        assert_eq!(
            read_health_with_recovery(&path).expect("read"),
            [seen, other.clone()]
        );
        // A GPU no longer recorded is not brought back by the file beside it.
        write_health(&path, std::slice::from_ref(&other)).expect("write");
        assert_eq!(read_health_with_recovery(&path).expect("read"), [other]);
        std::fs::write(recovery_seen_path(&path), b"{").expect("write");
        let e = read_health_with_recovery(&path).expect_err("malformed");
        assert!(e.to_string().contains(RECOVERY_SEEN_FILE), "{e}");
    }

    /// The agent stopped between the two writes of a new mark of a GPU whose earlier mark
    /// had its recovery seen: the entry left beside the new record is the earlier mark's,
    /// and counts for no other.
    #[test]
    fn a_recovery_seen_counts_for_its_own_mark_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("health.json");
        let earlier = Unhealthy {
            recovery_seen: true,
            ..sick()
        };
        write_health(&path, std::slice::from_ref(&earlier)).expect("write");
        let text = std::fs::read_to_string(recovery_seen_path(&path)).expect("read");
        assert!(
            text.contains("since_ms")
                && text.contains(&format!("\"version\": {RECOVERY_SEEN_VERSION}")),
            "{text}"
        );
        assert_eq!(
            read_health_with_recovery(&path).expect("read"),
            std::slice::from_ref(&earlier)
        );
        // The new mark's health.json is written; its file of recoveries seen is not.
        let later = Unhealthy {
            xid: 48,
            since_ms: earlier.since_ms + 5_000,
            recovery_seen: false,
            ..sick()
        };
        let doc = HealthDoc {
            version: HEALTH_VERSION,
            unhealthy: vec![later.clone()],
        };
        write_json(&path, &doc).expect("write");
        assert_eq!(read_health_with_recovery(&path).expect("read"), [later]);
        // The earlier release's file (UUIDs alone) still counts for its GPU.
        std::fs::write(
            recovery_seen_path(&path),
            format!(r#"{{"version":1,"seen":["{}"]}}"#, sick().uuid),
        )
        .expect("write");
        assert!(read_health_with_recovery(&path).expect("read")[0].recovery_seen);
        // Entries of the other version's shape are refused, naming the file.
        std::fs::write(
            recovery_seen_path(&path),
            format!(r#"{{"version":2,"seen":["{}"]}}"#, sick().uuid),
        )
        .expect("write");
        let e = read_health_with_recovery(&path).expect_err("mixed");
        assert!(e.to_string().contains(RECOVERY_SEEN_FILE), "{e}");
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
