//! Reading a claim's allocation: which devices of this node's pool the scheduler gave the
//! claim for driver `gpuslice.io`, and exactly what each consumes, merged per GPU (two
//! requests of one claim may share a device) into the shares the registry books.

use std::collections::BTreeMap;

use gpuslice_config::quantity::{format_kube_quantity, parse_kube_quantity, KubeQuantityError};
use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::slices::{device_index, CAP_CORES, CAP_MEMORY, MEMORY_STEP};
use crate::DRIVER;

/// A claim as the kubelet names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl std::fmt::Display for ClaimRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "claim {}/{} (uid {})",
            self.namespace, self.name, self.uid
        )
    }
}

/// Why a claim cannot be prepared from what the API server holds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    #[error("{claim}: the kubelet's call is malformed: {detail}")]
    BadRef { claim: String, detail: String },
    #[error("{claim}: the API server holds a claim of that name with uid {found}: the claim was deleted and re-created")]
    Uid { claim: String, found: String },
    #[error("{claim} has no allocation yet: the scheduler has not allocated it")]
    NotAllocated { claim: String },
    #[error("{claim} is allocated no device of driver {DRIVER} in pool {node} (this node); its results: {found}")]
    NotOurs {
        claim: String,
        node: String,
        found: String,
    },
    #[error("{at} names a device that is not one of this driver's (`gpu-<index>`)")]
    UnknownDevice { at: String },
    #[error("{at} has no consumedCapacity: the cluster lacks consumable capacity (Kubernetes 1.36+, or 1.35 with the DRAConsumableCapacity feature gate on the API server, scheduler and kubelet)")]
    NoConsumedCapacity { at: String },
    #[error("{at} consumes no `{CAP_MEMORY}`; the scheduler writes every capacity of the device")]
    NoMemory { at: String },
    #[error("{at} consumes 0 bytes of `{CAP_MEMORY}`: a slice of no memory is not prepared; accepted: at least 1 byte (the device's request policy asks for at least {min})", min = format_kube_quantity(MEMORY_STEP))]
    ZeroMemory { at: String },
    #[error("{at}: consumedCapacity {key}: {source}")]
    Quantity {
        at: String,
        key: &'static str,
        source: Box<KubeQuantityError>,
    },
    #[error("{claim}: on {device} the claim consumes {cores}% cores; accepted: 0 to 100")]
    Cores {
        claim: String,
        device: String,
        cores: u64,
    },
}

/// One result of ours: what the kubelet gets back per device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocatedDevice {
    pub request: String,
    pub device: String,
    pub share_id: Option<String>,
}

/// What a claim consumes on one GPU of this node, summed over its results there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceShare {
    pub index: u32,
    pub memory: u64,
    pub cores: u8,
}

/// The claim's allocation on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAllocation {
    /// Our results in the claim's order.
    pub results: Vec<AllocatedDevice>,
    /// One per GPU, in index order.
    pub shares: Vec<DeviceShare>,
}

/// Checks that `claim` is the one `want` names and reads its results for driver
/// `gpuslice.io` in pool `node`.
pub fn node_allocation(
    claim: &ResourceClaim,
    want: &ClaimRef,
    node: &str,
) -> Result<NodeAllocation, ClaimError> {
    let who = want.to_string();
    let found = claim.metadata.uid.clone().unwrap_or_default();
    if found != want.uid {
        return Err(ClaimError::Uid { claim: who, found });
    }
    let results = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .ok_or_else(|| ClaimError::NotAllocated { claim: who.clone() })?;
    let mut ours = Vec::new();
    let mut per_gpu: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    for r in results
        .iter()
        .filter(|r| r.driver == DRIVER && r.pool == node)
    {
        let at = || format!("{who}: result {} on device {}", r.request, r.device);
        let index =
            device_index(&r.device).ok_or_else(|| ClaimError::UnknownDevice { at: at() })?;
        let consumed = r
            .consumed_capacity
            .as_ref()
            .ok_or_else(|| ClaimError::NoConsumedCapacity { at: at() })?;
        let read = |key: &'static str| -> Result<Option<u64>, ClaimError> {
            consumed
                .get(key)
                .map(|q| {
                    parse_kube_quantity(&q.0).map_err(|source| ClaimError::Quantity {
                        at: at(),
                        key,
                        source: Box::new(source),
                    })
                })
                .transpose()
        };
        let memory = read(CAP_MEMORY)?.ok_or_else(|| ClaimError::NoMemory { at: at() })?;
        // The published request policy never lets the scheduler allocate 0 bytes; a result that
        // says so anyway (a changed policy, a hand-written status) would book a slice with no
        // memory, so it is refused here rather than passed on to the registry.
        if memory == 0 {
            return Err(ClaimError::ZeroMemory { at: at() });
        }
        let cores = read(CAP_CORES)?.unwrap_or(0);
        let e = per_gpu.entry(index).or_default();
        e.0 = e.0.saturating_add(memory);
        e.1 = e.1.saturating_add(cores);
        ours.push(AllocatedDevice {
            request: r.request.clone(),
            device: r.device.clone(),
            share_id: r.share_id.clone(),
        });
    }
    if ours.is_empty() {
        let found = if results.is_empty() {
            "none".to_string()
        } else {
            results
                .iter()
                .map(|r| format!("{} in pool {} (driver {})", r.device, r.pool, r.driver))
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Err(ClaimError::NotOurs {
            claim: who,
            node: node.to_string(),
            found,
        });
    }
    let mut shares = Vec::with_capacity(per_gpu.len());
    for (index, (memory, cores)) in per_gpu {
        let cores = u8::try_from(cores)
            .ok()
            .filter(|c| *c <= 100)
            .ok_or_else(|| ClaimError::Cores {
                claim: who.clone(),
                device: crate::slices::device_name(index),
                cores,
            })?;
        shares.push(DeviceShare {
            index,
            memory,
            cores,
        });
    }
    Ok(NodeAllocation {
        results: ours,
        shares,
    })
}

/// Checks what the kubelet sent: a namespace, a name and a UID that may name files.
pub fn check_ref(c: &ClaimRef) -> Result<(), ClaimError> {
    let bad = |detail: String| ClaimError::BadRef {
        claim: c.to_string(),
        detail,
    };
    if c.namespace.is_empty() || c.name.is_empty() {
        return Err(bad("namespace and name must be set".into()));
    }
    let uid_ok = !c.uid.is_empty()
        && c.uid.len() <= 64
        && c.uid
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !uid_ok {
        return Err(bad(format!(
            "uid `{}` is not a Kubernetes UID; accepted: up to 64 lowercase letters, digits and `-`",
            c.uid
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim_json(uid: &str, results: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "ns", "uid": uid},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": {"results": results}}},
        }))
        .unwrap()
    }

    fn want() -> ClaimRef {
        ClaimRef {
            namespace: "ns".into(),
            name: "c".into(),
            uid: "u-1".into(),
        }
    }

    fn result(req: &str, device: &str, pool: &str, mem: &str, cores: &str) -> serde_json::Value {
        serde_json::json!({"request": req, "driver": "gpuslice.io", "pool": pool, "device": device,
            "shareID": format!("share-{req}"), "consumedCapacity": {"memory": mem, "cores": cores}})
    }

    #[test]
    fn results_of_this_node_merge_per_gpu() {
        let c = claim_json(
            "u-1",
            serde_json::json!([
                result("a", "gpu-1", "n1", "20Gi", "30"),
                result("b", "gpu-0", "n1", "1Gi", "0"),
                result("c", "gpu-1", "n1", "512Mi", "10"),
                result("d", "gpu-0", "n2", "1Gi", "0"),
                {"request": "e", "driver": "other.io", "pool": "n1", "device": "x"},
            ]),
        );
        let a = node_allocation(&c, &want(), "n1").unwrap();
        assert_eq!(
            a.results
                .iter()
                .map(|r| r.request.as_str())
                .collect::<Vec<_>>(),
            ["a", "b", "c"]
        );
        assert_eq!(a.results[0].share_id.as_deref(), Some("share-a"));
        assert_eq!(
            a.shares,
            [
                DeviceShare {
                    index: 0,
                    memory: 1 << 30,
                    cores: 0
                },
                DeviceShare {
                    index: 1,
                    memory: (20 << 30) + (512 << 20),
                    cores: 40
                },
            ]
        );
    }

    #[test]
    fn claims_that_are_not_ours_are_refused_by_name() {
        let other_node = claim_json(
            "u-1",
            serde_json::json!([result("a", "gpu-0", "n2", "1Gi", "0")]),
        );
        let e = node_allocation(&other_node, &want(), "n1").unwrap_err();
        assert!(matches!(e, ClaimError::NotOurs { .. }));
        assert!(e.to_string().contains("gpu-0 in pool n2"), "{e}");
        let other_driver = claim_json(
            "u-1",
            serde_json::json!([{"request": "a", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0"}]),
        );
        assert!(node_allocation(&other_driver, &want(), "n1")
            .unwrap_err()
            .to_string()
            .contains("driver gpu.nvidia.com"));
        let uid = claim_json("u-2", serde_json::json!([]));
        assert!(matches!(
            node_allocation(&uid, &want(), "n1"),
            Err(ClaimError::Uid { .. })
        ));
        let mut pending = claim_json("u-1", serde_json::json!([]));
        pending.status = None;
        let e = node_allocation(&pending, &want(), "n1").unwrap_err();
        assert!(e.to_string().contains("no allocation yet"), "{e}");
    }

    #[test]
    fn capacities_must_be_whole_and_present() {
        let cases = [
            (result("a", "gpu-0", "n1", "1.5", "0"), "not a whole"),
            (result("a", "gpu-0", "n1", "1Gi", "70"), "0 to 100"),
            (result("a", "gpux", "n1", "1Gi", "0"), "gpu-<index>"),
            (
                serde_json::json!({"request": "a", "driver": "gpuslice.io", "pool": "n1", "device": "gpu-0"}),
                "DRAConsumableCapacity",
            ),
            (
                serde_json::json!({"request": "a", "driver": "gpuslice.io", "pool": "n1", "device": "gpu-0",
                    "consumedCapacity": {"cores": "1"}}),
                "no `memory`",
            ),
        ];
        for (r, text) in cases {
            let mut results = vec![r];
            if text == "0 to 100" {
                results.push(result("b", "gpu-0", "n1", "1Gi", "40"));
            }
            let c = claim_json("u-1", serde_json::Value::Array(results));
            let e = node_allocation(&c, &want(), "n1").unwrap_err();
            assert!(e.to_string().contains(text), "{e} lacks {text}");
        }
    }

    #[test]
    fn a_result_of_zero_bytes_is_refused_by_claim_and_device() {
        for zero in ["0", "0Gi", "0.0Mi", "0e3"] {
            let c = claim_json(
                "u-1",
                serde_json::json!([
                    result("a", "gpu-0", "n1", "1Gi", "0"),
                    result("b", "gpu-1", "n1", zero, "10"),
                ]),
            );
            let e = node_allocation(&c, &want(), "n1").unwrap_err();
            let text = e.to_string();
            for part in [
                "claim ns/c (uid u-1)",
                "result b on device gpu-1",
                "consumes 0 bytes of `memory`",
                "accepted: at least 1 byte",
            ] {
                assert!(text.contains(part), "{zero}: `{text}` lacks `{part}`");
            }
        }
    }

    #[test]
    fn the_kubelets_names_are_checked() {
        assert!(check_ref(&want()).is_ok());
        for (ns, name, uid) in [
            ("", "c", "u"),
            ("ns", "c", "../x"),
            ("ns", "c", ""),
            ("ns", "c", "U"),
        ] {
            let c = ClaimRef {
                namespace: ns.into(),
                name: name.into(),
                uid: uid.into(),
            };
            assert!(
                matches!(check_ref(&c), Err(ClaimError::BadRef { .. })),
                "{c}"
            );
        }
    }
}
