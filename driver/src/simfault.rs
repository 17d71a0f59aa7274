//! Faults of the simulated node: `faults.json` in the simulated driver's state dir, which
//! `gpuslice sim fault` writes (atomically) and the simulated `libnvidia-ml.so.1` and
//! `libcuda.so.1` read, on the host and in containers alike, to report XIDs the way a real
//! driver does (docs/troubleshooting.md, "GPU health and XIDs"). The file is the node's XID
//! log: every injected XID, in injection order, never removed, so each is delivered as an
//! event to every NVML waiter and a later XID never hides an earlier one. An XID is in effect
//! from its injection until `--clear` (a GPU reset on a real node) marks every XID of its GPU
//! cleared.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::simulated::{read_devices, DevicesError};

/// File name of the fault list inside the sim state dir.
pub const FAULTS_FILE: &str = "faults.json";
/// The only `version` of `faults.json` this code reads and writes (version 1 kept one fault
/// per GPU, replaced by the next).
pub const FAULTS_VERSION: u32 = 2;
/// The XID of a GPU fallen off the bus: every NVML call on it fails with
/// `NVML_ERROR_GPU_IS_LOST`.
pub const XID_FALLEN_OFF_BUS: u32 = 79;

/// One injected XID.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimFault {
    /// `GPU-<uuid>` of a GPU of `devices.json`.
    pub uuid: String,
    pub xid: u32,
    /// When it was injected, ms since the Unix epoch.
    pub since_ms: u64,
    /// When `--clear` ended it, ms since the Unix epoch; `None` while it is in effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleared_ms: Option<u64>,
}

impl SimFault {
    /// Whether this XID is on GPU `uuid` (UUIDs compare without case).
    pub fn is_on(&self, uuid: &str) -> bool {
        self.uuid.eq_ignore_ascii_case(uuid)
    }

    /// Whether it is still in effect (not cleared by a reset).
    pub fn in_effect(&self) -> bool {
        self.cleared_ms.is_none()
    }
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

/// The XID log of the simulated node whose state dir is `state_dir`, in injection order
/// (cleared XIDs included); empty without the file.
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

/// Injects XID `xid` into GPU `uuid` (at `now_ms`), appended to the log after every earlier
/// XID, which stays in effect; or with `None` clears every XID of the GPU (a reset). Returns
/// the GPU's XIDs in effect afterwards, in injection order. The GPU must be one of
/// `devices.json`.
pub fn set_fault(
    state_dir: &Path,
    uuid: &str,
    xid: Option<u32>,
    now_ms: u64,
) -> Result<Vec<SimFault>, FaultError> {
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
    match xid {
        Some(xid) => faults.push(SimFault {
            uuid: device.uuid.clone(),
            xid,
            since_ms: now_ms,
            cleared_ms: None,
        }),
        None => faults
            .iter_mut()
            .filter(|f| f.is_on(&device.uuid) && f.in_effect())
            .for_each(|f| f.cleared_ms = Some(now_ms)),
    }
    let in_effect = faults
        .iter()
        .filter(|f| f.is_on(&device.uuid) && f.in_effect())
        .cloned()
        .collect();
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
    Ok(in_effect)
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
                reserved_memory: 0,
            })
            .collect();
        let devices = devices_from_config(&gpus);
        write_devices(dir.path(), &devices).expect("devices");
        (dir, devices.into_iter().map(|d| d.uuid).collect())
    }

    #[test]
    fn xids_are_logged_in_order_and_a_clear_ends_only_its_gpus() {
        let (dir, uuids) = node();
        assert!(read_faults(dir.path()).expect("none yet").is_empty());
        set_fault(dir.path(), &uuids[1], Some(48), 10).expect("48");
        set_fault(dir.path(), &uuids[0], Some(13), 11).expect("13");
        // A later XID on GPU 1 (benign or not) leaves the uncorrectable ECC error in effect.
        let now = set_fault(dir.path(), &uuids[1].to_lowercase(), Some(13), 12).expect("13");
        let xids = |fs: &[SimFault]| fs.iter().map(|f| f.xid).collect::<Vec<_>>();
        assert_eq!(xids(&now), [48, 13]);
        assert!(now.iter().all(|f| f.uuid == uuids[1]), "{now:?}");
        let all = read_faults(dir.path()).expect("read");
        assert_eq!(
            all.iter()
                .map(|f| (f.uuid.as_str(), f.xid, f.since_ms))
                .collect::<Vec<_>>(),
            [
                (uuids[1].as_str(), 48, 10),
                (uuids[0].as_str(), 13, 11),
                (uuids[1].as_str(), 13, 12)
            ],
            "every XID, in injection order"
        );
        // The reset of GPU 1 clears both of its XIDs and keeps them in the log.
        assert!(set_fault(dir.path(), &uuids[1], None, 13)
            .expect("clear")
            .is_empty());
        let all = read_faults(dir.path()).expect("read");
        assert_eq!(all.len(), 3);
        let in_effect: Vec<_> = all.iter().filter(|f| f.in_effect()).collect();
        assert_eq!(in_effect.len(), 1);
        assert_eq!(
            (in_effect[0].uuid.as_str(), in_effect[0].xid),
            (uuids[0].as_str(), 13)
        );
        assert!(all
            .iter()
            .filter(|f| f.is_on(&uuids[1]))
            .all(|f| f.cleared_ms == Some(13)));
        // After the reset a new XID is in effect alone.
        let now = set_fault(dir.path(), &uuids[1], Some(79), 14).expect("79");
        assert_eq!(xids(&now), [79]);
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
