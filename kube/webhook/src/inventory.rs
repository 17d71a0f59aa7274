//! What the cluster publishes, as the webhook needs it to write and check claims: the
//! publication mode (capacity or slots) and the GPUs' sizes, read from gpuslice's
//! ResourceSlices.

use std::collections::{BTreeMap, BTreeSet};

use gpuslice_config::parse_kube_quantity;
use gpuslice_kube::slices::{CAP_CORES, CAP_MEMORY};
use gpuslice_kube::DRIVER;
use k8s_openapi::api::resource::v1::ResourceSlice;

use crate::shape::{Mode, SlotSize};

/// The cluster's GPUs, as gpuslice's ResourceSlices show them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inventory {
    pub mode: Mode,
    /// The most GPUs one node has; `None` when no GPU is published (nothing to check).
    pub max_gpus_per_node: Option<u32>,
    /// The distinct memory sizes of the GPUs, ascending.
    pub gpu_memory: Vec<u64>,
}

impl Default for Inventory {
    fn default() -> Inventory {
        Inventory {
            mode: Mode::Capacity,
            max_gpus_per_node: None,
            gpu_memory: Vec::new(),
        }
    }
}

/// `gpu-3-slot-7` → (3, 7); `gpu-3` → (3, None).
fn device_name(name: &str) -> Option<(u32, Option<u32>)> {
    let rest = name.strip_prefix("gpu-")?;
    match rest.split_once("-slot-") {
        Some((g, s)) => Some((g.parse().ok()?, Some(s.parse().ok()?))),
        None => Some((rest.parse().ok()?, None)),
    }
}

impl Inventory {
    /// Reads the slices of driver `gpuslice.io`. Slot mode when the devices are slots
    /// (`gpu-<i>-slot-<j>`), with the smallest slot seen; capacity mode otherwise.
    pub fn from_slices(slices: &[ResourceSlice]) -> Inventory {
        // node → GPU index → (memory, slots)
        let mut gpus: BTreeMap<String, BTreeMap<u32, (u64, u32)>> = BTreeMap::new();
        let mut slot: Option<SlotSize> = None;
        for s in slices.iter().filter(|s| s.spec.driver == DRIVER) {
            let node = s
                .spec
                .node_name
                .clone()
                .unwrap_or_else(|| s.spec.pool.name.clone());
            for d in s.spec.devices.iter().flatten() {
                let Some((index, slot_no)) = device_name(&d.name) else {
                    continue;
                };
                let cap = |k: &str| {
                    d.capacity
                        .as_ref()
                        .and_then(|c| c.get(k))
                        .and_then(|c| parse_kube_quantity(&c.value.0).ok())
                };
                let memory = cap(CAP_MEMORY).unwrap_or(0);
                let entry = gpus
                    .entry(node.clone())
                    .or_default()
                    .entry(index)
                    .or_default();
                match slot_no {
                    None => entry.0 = memory,
                    Some(_) => {
                        entry.0 += memory;
                        entry.1 += 1;
                        let cores = cap(CAP_CORES).and_then(|c| u32::try_from(c).ok());
                        slot = Some(match slot {
                            Some(prev) if prev.memory <= memory => prev,
                            _ => SlotSize {
                                memory,
                                cores,
                                per_gpu: 0,
                            },
                        });
                    }
                }
            }
        }
        let mode = match slot {
            Some(mut s) => {
                s.per_gpu = gpus
                    .values()
                    .flat_map(|g| g.values().map(|(_, n)| *n))
                    .filter(|n| *n > 0)
                    .min()
                    .unwrap_or(1);
                Mode::Slots(s)
            }
            None => Mode::Capacity,
        };
        let memory: BTreeSet<u64> = gpus
            .values()
            .flat_map(|g| g.values().map(|(m, _)| *m))
            .filter(|m| *m > 0)
            .collect();
        Inventory {
            mode,
            max_gpus_per_node: gpus
                .values()
                .map(|g| g.len() as u32)
                .max()
                .filter(|n| *n > 0),
            gpu_memory: memory.into_iter().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn slice(node: &str, devices: serde_json::Value) -> ResourceSlice {
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": format!("{node}-gpuslice.io")},
            "spec": {"driver": "gpuslice.io", "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": devices},
        }))
        .unwrap()
    }

    #[test]
    fn capacity_slices_give_sizes_and_gpus_per_node() {
        let inv = Inventory::from_slices(&[
            slice(
                "a",
                json!([{"name": "gpu-0", "capacity": {"memory": {"value": "141Gi"}}},
                       {"name": "gpu-1", "capacity": {"memory": {"value": "141Gi"}}}]),
            ),
            slice(
                "b",
                json!([{"name": "gpu-0", "capacity": {"memory": {"value": "80Gi"}}}]),
            ),
        ]);
        assert_eq!(inv.mode, Mode::Capacity);
        assert_eq!(inv.max_gpus_per_node, Some(2));
        assert_eq!(inv.gpu_memory, vec![80 << 30, 141 << 30]);
    }

    #[test]
    fn slot_devices_mean_slot_mode() {
        let inv = Inventory::from_slices(&[slice(
            "a",
            json!([{"name": "gpu-0-slot-0", "capacity": {"memory": {"value": "8Gi"}}},
                   {"name": "gpu-0-slot-1", "capacity": {"memory": {"value": "8Gi"}}}]),
        )]);
        assert_eq!(
            inv.mode,
            Mode::Slots(SlotSize {
                memory: 8 << 30,
                cores: None,
                per_gpu: 2
            })
        );
        assert_eq!(inv.gpu_memory, vec![16 << 30]);
        assert_eq!(Inventory::from_slices(&[]), Inventory::default());
    }
}
