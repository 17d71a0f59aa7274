//! Faults of the simulated node: `faults.json` in the simulated driver's state dir, which
//! `gpuslice sim fault` writes (atomically) and the simulated `libnvidia-ml.so.1` and
//! `libcuda.so.1` read, on the host and in containers alike, to report an XID the way a real
//! driver does (docs/troubleshooting.md, "GPU health and XIDs"). A GPU has at most one
//! fault; a new one replaces it, `--clear` ends it (a GPU reset on a real node).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::simulated::{read_devices, DevicesError};

/// File name of the fault list inside the sim state dir.
pub const FAULTS_FILE: &str = "faults.json";
/// The only `version` of `faults.json` this code reads and writes.
pub const FAULTS_VERSION: u32 = 1;
/// The XID of a GPU fallen off the bus: every NVML call on it fails with
/// `NVML_ERROR_GPU_IS_LOST`.
pub const XID_FALLEN_OFF_BUS: u32 = 79;

/// One GPU's fault.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimFault {
    /// `GPU-<uuid>` of a GPU of `devices.json`.
    pub uuid: String,
    pub xid: u32,
    /// When it was injected, ms since the Unix epoch (tells one injection from the next).
    pub since_ms: u64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FaultsDoc {
    version: u32,
    faults: Vec<SimFault>,
}

/// A fault that cannot be read, refused or written.
#[derive(Debug, thiserror::Error)]
pub enum FaultError {
    #[error(transparent)]
    Devices(#[from] DevicesError),
    #[error("the simulated node in {dir} has no GPU {uuid}; its GPUs: {known}")]
    UnknownGpu {
        dir: PathBuf,
        uuid: String,
        known: String,
    },
    #[error("XID {0} is not accepted; an XID is an integer from 1 to 65535")]
    BadXid(u32),
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a valid simulated fault list (version {FAULTS_VERSION}): {detail}")]
    Parse { path: PathBuf, detail: String },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: gpuslice_fsutil::AtomicWriteError,
    },
}

/// The faults of the simulated node whose state dir is `state_dir`; none without the file.
pub fn read_faults(state_dir: &Path) -> Result<Vec<SimFault>, FaultError> {
    let path = state_dir.join(FAULTS_FILE);
    let text = match std::fs::read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(FaultError::Read { path, source }),
    };
    let doc: FaultsDoc = serde_json::from_slice(&text).map_err(|e| FaultError::Parse {
        path: path.clone(),
        detail: e.to_string(),
    })?;
    if doc.version != FAULTS_VERSION {
        return Err(FaultError::Parse {
            path,
            detail: format!("version {}", doc.version),
        });
    }
    Ok(doc.faults)
}

/// Gives GPU `uuid` fault `xid` (at `now_ms`), or ends its fault with `None`; returns the
/// fault now in effect for it. The GPU must be one of `devices.json`.
pub fn set_fault(
    state_dir: &Path,
    uuid: &str,
    xid: Option<u32>,
    now_ms: u64,
) -> Result<Option<SimFault>, FaultError> {
    if let Some(x) = xid {
        if !(1..=65535).contains(&x) {
            return Err(FaultError::BadXid(x));
        }
    }
    let devices = read_devices(state_dir)?;
    let device = devices
        .iter()
        .find(|d| d.uuid.eq_ignore_ascii_case(uuid))
        .ok_or_else(|| FaultError::UnknownGpu {
            dir: state_dir.to_path_buf(),
            uuid: uuid.to_string(),
            known: devices
                .iter()
                .map(|d| d.uuid.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        })?;
    let mut faults = read_faults(state_dir)?;
    faults.retain(|f| !f.uuid.eq_ignore_ascii_case(&device.uuid));
    let fault = xid.map(|xid| SimFault {
        uuid: device.uuid.clone(),
        xid,
        since_ms: now_ms,
    });
    faults.extend(fault.clone());
    let path = state_dir.join(FAULTS_FILE);
    let doc = FaultsDoc {
        version: FAULTS_VERSION,
        faults,
    };
    let mut text = serde_json::to_vec_pretty(&doc).map_err(|e| FaultError::Parse {
        path: path.clone(),
        detail: e.to_string(),
    })?;
    text.push(b'\n');
    gpuslice_fsutil::atomic_write(&path, &text, 0o644)
        .map_err(|source| FaultError::Write { path, source })?;
    Ok(fault)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulated::{devices_from_config, write_devices};

    fn node() -> (tempfile::TempDir, Vec<String>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let gpus: Vec<gpuslice_config::SimulatedGpu> = (0..2)
            .map(|i| gpuslice_config::SimulatedGpu {
                model: "NVIDIA H200".into(),
                memory: 16 << 30,
                uuid: gpuslice_config::simulated_uuid(i, "NVIDIA H200"),
                context_memory: 0,
            })
            .collect();
        let devices = devices_from_config(&gpus);
        write_devices(dir.path(), &devices).expect("devices");
        (dir, devices.into_iter().map(|d| d.uuid).collect())
    }

    #[test]
    fn a_fault_replaces_the_last_and_clear_ends_it() {
        let (dir, uuids) = node();
        assert!(read_faults(dir.path()).expect("none yet").is_empty());
        set_fault(dir.path(), &uuids[1], Some(48), 10).expect("48");
        set_fault(dir.path(), &uuids[0], Some(13), 11).expect("13");
        let f = set_fault(dir.path(), &uuids[1].to_lowercase(), Some(79), 12)
            .expect("79")
            .expect("in effect");
        assert_eq!(
            (f.uuid.as_str(), f.xid, f.since_ms),
            (uuids[1].as_str(), 79, 12)
        );
        let all = read_faults(dir.path()).expect("read");
        assert_eq!(all.len(), 2, "one fault per GPU: {all:?}");
        assert_eq!(
            set_fault(dir.path(), &uuids[1], None, 13).expect("clear"),
            None
        );
        let all = read_faults(dir.path()).expect("read");
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].xid, 13);
    }

    #[test]
    fn unknown_gpus_and_xids_are_refused_naming_them() {
        let (dir, uuids) = node();
        let e = set_fault(
            dir.path(),
            "GPU-00000000-0000-0000-0000-000000000000",
            Some(79),
            1,
        )
        .expect_err("unknown")
        .to_string();
        assert!(
            e.contains("GPU-00000000-0000-0000-0000-000000000000") && e.contains(&uuids[0]),
            "{e}"
        );
        let e = set_fault(dir.path(), &uuids[0], Some(0), 1)
            .expect_err("xid 0")
            .to_string();
        assert!(e.contains("XID 0"), "{e}");
        assert!(!dir.path().join(FAULTS_FILE).exists(), "nothing written");
    }
}
