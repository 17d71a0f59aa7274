//! Which way the node's GPUs are published: `dra.mode` resolved against what the API server
//! keeps. Consumable capacity (`DRAConsumableCapacity`) is off on Kubernetes 1.34/1.35 and on
//! managed clusters that accept no alpha gates, and an API server with the gate off silently
//! drops `allowMultipleAllocations` and the request policies from a ResourceSlice; the version
//! string cannot say whether the gate is on. So `auto` asks the API server itself
//! (crate::probe).

use std::path::Path;

use gpuslice_config::{DraConfig, DraMode};
use serde::Serialize;

use crate::offer::Publication;

/// The mode record could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ModeError {
    #[error("cannot write {path}: {detail}")]
    Write { path: String, detail: String },
}

/// The publication `config` asks for, given whether the API server keeps consumable capacity
/// (`None`: not asked, as `capacity` and `slots` need not).
pub fn resolve(config: &DraConfig, keeps: Option<bool>) -> Publication {
    match (config.mode, keeps) {
        (DraMode::Capacity, _) | (DraMode::Auto, Some(true)) => Publication::Capacity,
        (DraMode::Slots, _) | (DraMode::Auto, _) => Publication::Slots(config.slots_per_gpu),
    }
}

/// What the plugin records in [`MODE_FILE`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ModeRecord {
    /// `capacity` or `slots`.
    pub mode: String,
    /// `dra.mode` as configured (`auto`, `capacity` or `slots`).
    pub configured: String,
    /// Slots per GPU in slot mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slots_per_gpu: Option<u32>,
    pub node: String,
}

impl ModeRecord {
    pub fn new(publication: Publication, config: &DraConfig, node: &str) -> ModeRecord {
        let (mode, slots_per_gpu) = match publication {
            Publication::Capacity => ("capacity", None),
            Publication::Slots(n) => ("slots", Some(n)),
        };
        ModeRecord {
            mode: mode.to_string(),
            configured: config.mode.as_str().to_string(),
            slots_per_gpu,
            node: node.to_string(),
        }
    }
}

/// Writes `record` to `path`, replaced atomically (others read it).
pub fn write_record(path: &Path, record: &ModeRecord) -> Result<(), ModeError> {
    let err = |detail: String| ModeError::Write {
        path: path.display().to_string(),
        detail,
    };
    let mut text = serde_json::to_vec_pretty(record).map_err(|e| err(e.to_string()))?;
    text.push(b'\n');
    gpuslice_fsutil::atomic_write(path, &text, 0o644).map_err(|e| err(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_follows_what_the_api_server_keeps() {
        let mut c = DraConfig::default();
        assert_eq!(resolve(&c, Some(true)), Publication::Capacity);
        assert_eq!(
            resolve(&c, Some(false)),
            Publication::Slots(gpuslice_config::DEFAULT_SLOTS_PER_GPU)
        );
        c.mode = DraMode::Slots;
        c.slots_per_gpu = 8;
        assert_eq!(resolve(&c, Some(true)), Publication::Slots(8));
        c.mode = DraMode::Capacity;
        assert_eq!(resolve(&c, Some(false)), Publication::Capacity);
    }
}
