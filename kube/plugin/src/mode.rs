//! Which way the node's GPUs are published: `dra.mode` resolved against what the API server
//! keeps. Consumable capacity (`DRAConsumableCapacity`) is off on Kubernetes 1.34/1.35 and on
//! managed clusters that accept no alpha gates, and an API server with the gate off silently
//! drops `allowMultipleAllocations` and the request policies from a ResourceSlice; the version
//! string cannot say whether the gate is on. So `auto` asks the API server itself: a dry-run
//! create of a capacity-mode slice, and whether the answer still carries those fields.

use std::path::Path;

use gpuslice_config::{DraConfig, DraMode};
use gpuslice_dra::slices::{build_slices, OfferedGpu, SliceError, CAP_MEMORY};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::PostParams;
use kube::Api;
use serde::Serialize;

use crate::offer::Publication;

/// The mode could not be detected (it is retried).
#[derive(Debug, thiserror::Error)]
pub enum ModeError {
    #[error("{0}")]
    Slice(#[from] SliceError),
    #[error("cannot ask the API server whether it keeps consumable capacity (a dry-run create of ResourceSlice {name}): {source}; the plugin needs resource.k8s.io/v1 (Kubernetes 1.34+) and the right to create ResourceSlices")]
    Api { name: String, source: kube::Error },
    #[error("cannot write {path}: {detail}")]
    Write { path: String, detail: String },
}

/// Whether the API server keeps the consumable-capacity fields of a ResourceSlice: a dry-run
/// create (nothing is stored) of one capacity-mode device on `node`, read back.
pub async fn keeps_consumable_capacity(
    client: &kube::Client,
    node: &str,
) -> Result<bool, ModeError> {
    let probe = OfferedGpu {
        index: 0,
        uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
        model: "gpuslice mode probe".into(),
        numa_node: None,
        memory: 1 << 30,
        cores: 100,
        slots: None,
    };
    let mut slices = build_slices(node, &[probe], 1, None)?;
    let mut slice = slices.remove(0);
    let name = format!("{}-probe", slice.metadata.name.clone().unwrap_or_default());
    slice.metadata.name = Some(name.clone());
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let params = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let back = api
        .create(&params, &slice)
        .await
        .map_err(|source| ModeError::Api { name, source })?;
    Ok(kept(&back))
}

/// Whether `slice`'s first device still carries what consumable capacity adds.
pub fn kept(slice: &ResourceSlice) -> bool {
    slice
        .spec
        .devices
        .as_ref()
        .and_then(|d| d.first())
        .is_some_and(|d| {
            d.allow_multiple_allocations == Some(true)
                && d.capacity
                    .as_ref()
                    .and_then(|c| c.get(CAP_MEMORY))
                    .is_some_and(|c| c.request_policy.is_some())
        })
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

    #[test]
    fn a_slice_whose_sharing_fields_were_dropped_is_read_as_no_consumable_capacity() {
        let gpu = OfferedGpu {
            index: 0,
            uuid: "GPU-x".into(),
            model: "m".into(),
            numa_node: None,
            memory: 1 << 30,
            cores: 100,
            slots: None,
        };
        let mut s = build_slices("n1", &[gpu], 1, None).unwrap().remove(0);
        assert!(kept(&s));
        // What an API server with the gate off stores: the same device without the fields.
        let d = &mut s.spec.devices.as_mut().unwrap()[0];
        d.allow_multiple_allocations = None;
        for c in d.capacity.as_mut().unwrap().values_mut() {
            c.request_policy = None;
        }
        assert!(!kept(&s));
    }
}
