//! Reading a claim's allocation: which devices of this node's pool the scheduler gave the
//! claim for driver `gpuslice.io`, and exactly what each consumes — a shared device's
//! `consumedCapacity`, or a slot's bytes (and the compute share its opaque parameters ask,
//! bounded by its slots) — merged per GPU (two requests of one claim may share a GPU) into the
//! shares the registry books.

use std::collections::{BTreeMap, BTreeSet};

use gpuslice_config::quantity::{format_kube_quantity, parse_kube_quantity, KubeQuantityError};
use gpuslice_dra::opaque::{
    gpu_share, parent_request, share_configs, ShareConfig, OPAQUE_ACCEPTED,
};
use gpuslice_dra::slices::{
    device_name, is_dns_label, is_dns_subdomain, parse_device, slot_cores, slot_memory, DeviceRef,
    CAP_CORES, CAP_MEMORY, MAX_NAME, MEMORY_STEP,
};
use gpuslice_dra::DRIVER;
use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::offer::Held;

/// What a slot of each GPU of this node is: the node's `dra.slots_per_gpu` and each GPU's
/// memory, from which the published slot sizes are made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotGeometry {
    pub per_gpu: u32,
    /// Total bytes by GPU index.
    pub totals: BTreeMap<u32, u64>,
}

impl SlotGeometry {
    /// The geometry of `inventory` with `per_gpu` slots per GPU.
    pub fn new(per_gpu: u32, inventory: &gpuslice_registry::Inventory) -> SlotGeometry {
        SlotGeometry {
            per_gpu,
            totals: inventory
                .gpus
                .iter()
                .map(|g| (g.index, g.memory_total))
                .collect(),
        }
    }
}

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
    #[error("{at} names a device that is not one of this driver's (`gpu-<index>` or `gpu-<index>-slot-<j>`)")]
    UnknownDevice { at: String },
    #[error("{at}: slot {slot} is not one of this node's {per_gpu} slots per GPU (dra.slots_per_gpu changed since the claim was allocated); accepted: slots 0 to {last}; delete and re-create the claim", last = per_gpu.saturating_sub(1))]
    SlotRange { at: String, slot: u32, per_gpu: u32 },
    #[error("{at}: GPU {index} is not in this node's inventory, so its slot size is unknown")]
    SlotGpu { at: String, index: u32 },
    #[error("{claim}: request {request} was allocated slots of several GPUs ({gpus}); accepted: the slots of one request on one GPU — add `constraints: [{{requests: [{request}], matchAttribute: gpuslice.io/uuid}}]` to the claim, and one request per GPU for a multi-GPU slice; nothing was booked")]
    SlotsSpanGpus {
        claim: String,
        request: String,
        gpus: String,
    },
    #[error("{claim}: opaque parameters of driver {DRIVER}: {detail}; accepted: {OPAQUE_ACCEPTED}; nothing was booked")]
    Opaque { claim: String, detail: String },
    #[error("{claim}: asks {cores}% cores on {device}, which it holds {slots} slot(s) of; accepted: at most {max}% ({per}% per slot of {per_gpu}): ask more slots or fewer cores; nothing was booked")]
    SlotCores {
        claim: String,
        device: String,
        cores: u64,
        slots: u32,
        max: u64,
        per: u32,
        per_gpu: u32,
    },
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
    /// The devices the claim holds here, as the publisher counts them.
    pub held: Held,
}

/// The configurations of driver `gpuslice.io` in `claim`'s allocation, each read; malformed
/// parameters refuse the claim.
fn claim_share_configs(claim: &ResourceClaim, who: &str) -> Result<Vec<ShareConfig>, ClaimError> {
    let configs = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.config.as_ref());
    share_configs(
        configs
            .into_iter()
            .flatten()
            .map(|c| (c.requests.as_deref(), c.opaque.as_ref())),
    )
    .into_iter()
    .map(|c| {
        c.map_err(|e| ClaimError::Opaque {
            claim: who.to_string(),
            detail: e.to_string(),
        })
    })
    .collect()
}

/// Checks that `claim` is the one `want` names and reads its results for driver
/// `gpuslice.io` in pool `node`; a slot's bytes come from `slots`.
pub fn node_allocation(
    claim: &ResourceClaim,
    want: &ClaimRef,
    node: &str,
    slots: &SlotGeometry,
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
    // Slot results: the slots each GPU holds, and the GPUs each request's slots are on.
    let mut slot_list: Vec<(u32, u32)> = Vec::new();
    let mut request_gpus: BTreeMap<&str, BTreeSet<u32>> = BTreeMap::new();
    // The slot results on each GPU, by name.
    let mut gpu_results: BTreeMap<u32, Vec<&str>> = BTreeMap::new();
    // The names slot results carry (`<request>` or `<request>/<subrequest>`).
    let mut slot_results: BTreeSet<&str> = BTreeSet::new();
    let mut capacity = false;
    for r in results
        .iter()
        .filter(|r| r.driver == DRIVER && r.pool == node)
    {
        let at = || format!("{who}: result {} on device {}", r.request, r.device);
        let index = match parse_device(&r.device) {
            Some(DeviceRef::Gpu(index)) => index,
            Some(DeviceRef::Slot(index, slot)) => {
                if slot >= slots.per_gpu {
                    return Err(ClaimError::SlotRange {
                        at: at(),
                        slot,
                        per_gpu: slots.per_gpu,
                    });
                }
                let total = slots
                    .totals
                    .get(&index)
                    .ok_or(ClaimError::SlotGpu { at: at(), index })?;
                let e = per_gpu.entry(index).or_default();
                e.0 = e.0.saturating_add(slot_memory(*total, slots.per_gpu));
                slot_list.push((index, slot));
                // The slots of one request (all its subrequest's) must be on one GPU.
                request_gpus
                    .entry(parent_request(&r.request))
                    .or_default()
                    .insert(index);
                slot_results.insert(&r.request);
                gpu_results.entry(index).or_default().push(&r.request);
                ours.push(AllocatedDevice {
                    request: r.request.clone(),
                    device: r.device.clone(),
                    share_id: r.share_id.clone(),
                });
                continue;
            }
            None => return Err(ClaimError::UnknownDevice { at: at() }),
        };
        capacity = true;
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
    if let Some((request, gpus)) = request_gpus.iter().find(|(_, g)| g.len() > 1) {
        return Err(ClaimError::SlotsSpanGpus {
            claim: who,
            request: request.to_string(),
            gpus: gpus
                .iter()
                .map(|i| device_name(*i))
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    // A claim's compute share on a GPU of its slots: what its opaque parameters ask there,
    // once per GPU however many of its requests lie there (gpu_share), at most the share its
    // slots carry, so that claims the scheduler fits by slots never together book more than a
    // GPU's compute.
    let configs = claim_share_configs(claim, &who)?;
    for (index, results) in &gpu_results {
        let cores = gpu_share(&configs, results.iter().copied()).map_or(0, u64::from);
        let e = per_gpu.entry(*index).or_default();
        e.1 = e.1.saturating_add(cores);
    }
    // Opaque `cores` are for requests of slots: a configuration that applies to a request of
    // the shared device (by naming it, or by naming none) is refused, never silently ignored.
    let mut shared = ours
        .iter()
        .map(|o| o.request.as_str())
        .filter(|r| !slot_results.contains(r));
    for c in &configs {
        let detail = match c.requests.as_deref() {
            Some(names) if !names.is_empty() => names.iter().find_map(|n| {
                shared
                    .clone()
                    .find(|r| r == n || parent_request(r) == n)
                    .map(|_| format!("request {n} is of the shared device, not of slots"))
            }),
            _ => shared.next().map(|r| {
                format!(
                    "a configuration that names no request applies to every request, and request {r} is of the shared device, not of slots"
                )
            }),
        };
        if let Some(detail) = detail {
            return Err(ClaimError::Opaque { claim: who, detail });
        }
    }
    for (index, (_, cores)) in &per_gpu {
        let held =
            u32::try_from(slot_list.iter().filter(|(i, _)| i == index).count()).unwrap_or(u32::MAX);
        if held == 0 {
            continue;
        }
        let per = slot_cores(slots.per_gpu);
        let max = u64::from(per) * u64::from(held);
        if *cores > max {
            return Err(ClaimError::SlotCores {
                claim: who,
                device: device_name(*index),
                cores: *cores,
                slots: held,
                max,
                per,
                per_gpu: slots.per_gpu,
            });
        }
    }
    let held = if capacity || slot_list.is_empty() {
        Held::Capacity
    } else {
        Held::Slots(slot_list)
    };
    let mut shares = Vec::with_capacity(per_gpu.len());
    for (index, (memory, cores)) in per_gpu {
        let cores = u8::try_from(cores)
            .ok()
            .filter(|c| *c <= 100)
            .ok_or_else(|| ClaimError::Cores {
                claim: who.clone(),
                device: device_name(index),
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
        held,
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
    // They become a request's path (and lines of `gpuslice status`): only names Kubernetes
    // gives a claim pass, so `/`, `?` or `..` cannot steer the read to another object.
    if !is_dns_label(&c.namespace) {
        return Err(bad(format!(
            "namespace `{}` is not a Kubernetes namespace; accepted: a DNS label (up to 63 lowercase letters, digits and `-`)",
            c.namespace.escape_debug()
        )));
    }
    if !is_dns_subdomain(&c.name, MAX_NAME) {
        return Err(bad(format!(
            "name `{}` is not a ResourceClaim's name; accepted: a DNS subdomain (up to {MAX_NAME} lowercase letters, digits, `-` and `.`)",
            c.name.escape_debug()
        )));
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

    fn geometry() -> SlotGeometry {
        SlotGeometry {
            per_gpu: 16,
            totals: [(0, 80 << 30), (1, 141 << 30)].into_iter().collect(),
        }
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
        let a = node_allocation(&c, &want(), "n1", &geometry()).unwrap();
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
        let e = node_allocation(&other_node, &want(), "n1", &geometry()).unwrap_err();
        assert!(matches!(e, ClaimError::NotOurs { .. }));
        assert!(e.to_string().contains("gpu-0 in pool n2"), "{e}");
        let other_driver = claim_json(
            "u-1",
            serde_json::json!([{"request": "a", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0"}]),
        );
        assert!(node_allocation(&other_driver, &want(), "n1", &geometry())
            .unwrap_err()
            .to_string()
            .contains("driver gpu.nvidia.com"));
        let uid = claim_json("u-2", serde_json::json!([]));
        assert!(matches!(
            node_allocation(&uid, &want(), "n1", &geometry()),
            Err(ClaimError::Uid { .. })
        ));
        let mut pending = claim_json("u-1", serde_json::json!([]));
        pending.status = None;
        let e = node_allocation(&pending, &want(), "n1", &geometry()).unwrap_err();
        assert!(e.to_string().contains("no allocation yet"), "{e}");
    }

    #[test]
    fn capacities_must_be_whole_and_present() {
        let cases = [
            (result("a", "gpu-0", "n1", "1.5", "0"), "not a whole"),
            (result("a", "gpu-0", "n1", "1Gi", "70"), "0 to 100"),
            (
                result("a", "gpux", "n1", "1Gi", "0"),
                "gpu-<index>-slot-<j>",
            ),
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
            let e = node_allocation(&c, &want(), "n1", &geometry()).unwrap_err();
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
            let e = node_allocation(&c, &want(), "n1", &geometry()).unwrap_err();
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
            ("../x", "c", "u"),
            ("ns", "a/b", "u"),
            ("ns", "c?x=", "u"),
            ("Ns", "c", "u"),
            ("n.s", "c", "u"),
            ("ns", "c\n", "u"),
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

    fn slot(req: &str, device: &str, pool: &str) -> serde_json::Value {
        serde_json::json!({"request": req, "driver": "gpuslice.io", "pool": pool, "device": device})
    }

    fn with_config(mut c: ResourceClaim, config: serde_json::Value) -> ResourceClaim {
        let a = c.status.as_mut().unwrap().allocation.as_mut().unwrap();
        a.devices.as_mut().unwrap().config = Some(serde_json::from_value(config).unwrap());
        c
    }

    #[test]
    fn slots_book_their_bytes_per_gpu_and_a_share_bounded_by_them() {
        // 16 slots per GPU: 5 GiB of the 80 GiB GPU 0, 9024 MiB of the 141 GiB GPU 1.
        let c = claim_json(
            "u-1",
            serde_json::json!([
                slot("g0", "gpu-0-slot-0", "n1"),
                slot("g0", "gpu-0-slot-1", "n1"),
                slot("g1", "gpu-1-slot-4", "n1"),
                slot("g1", "gpu-1-slot-5", "n2"),
            ]),
        );
        let a = node_allocation(&c, &want(), "n1", &geometry()).unwrap();
        assert_eq!(
            a.shares,
            [
                DeviceShare {
                    index: 0,
                    memory: 10 << 30,
                    cores: 0
                },
                DeviceShare {
                    index: 1,
                    memory: 9024 << 20,
                    cores: 0
                },
            ]
        );
        assert_eq!(a.held, Held::Slots(vec![(0, 0), (0, 1), (1, 4)]));
        assert_eq!(a.results.len(), 3);
        // A share asked through opaque parameters, for one request or all.
        let shared = with_config(
            c.clone(),
            serde_json::json!([{"source": "FromClaim", "requests": ["g0"],
                "opaque": {"driver": "gpuslice.io", "parameters": {"apiVersion": "gpuslice.io/v1", "kind": "SliceParameters", "cores": 12}}}]),
        );
        let a = node_allocation(&shared, &want(), "n1", &geometry()).unwrap();
        assert_eq!((a.shares[0].cores, a.shares[1].cores), (12, 0));
        // 2 slots of 16 carry at most 12%.
        let over = with_config(
            c,
            serde_json::json!([{"source": "FromClaim",
                "opaque": {"driver": "gpuslice.io", "parameters": {"cores": 13}}}]),
        );
        let e = node_allocation(&over, &want(), "n1", &geometry())
            .unwrap_err()
            .to_string();
        for part in [
            "13% cores on gpu-0",
            "2 slot(s)",
            "at most 12%",
            "nothing was booked",
        ] {
            assert!(e.contains(part), "`{e}` lacks `{part}`");
        }
    }

    #[test]
    fn opaque_cores_for_a_request_of_the_shared_device_are_refused_named_or_not() {
        let c = claim_json(
            "u-1",
            serde_json::json!([result("gpu", "gpu-0", "n1", "4Gi", "0")]),
        );
        let cores = |requests: serde_json::Value| {
            let mut config = serde_json::json!({"source": "FromClaim",
                "opaque": {"driver": "gpuslice.io", "parameters": {"cores": 30}}});
            if !requests.is_null() {
                config["requests"] = requests;
            }
            let e = node_allocation(
                &with_config(c.clone(), serde_json::json!([config])),
                &want(),
                "n1",
                &geometry(),
            )
            .unwrap_err();
            assert!(matches!(e, ClaimError::Opaque { .. }), "{e}");
            e.to_string()
        };
        let named = cores(serde_json::json!(["gpu"]));
        assert!(
            named.contains("request gpu is of the shared device, not of slots"),
            "{named}"
        );
        // Naming no request, it applies to `gpu` too: refused, not ignored (the claim would
        // run unthrottled).
        for requests in [serde_json::Value::Null, serde_json::json!([])] {
            let all = cores(requests);
            for part in [
                "names no request",
                "request gpu is of the shared device",
                "cores in capacity.requests",
                "nothing was booked",
            ] {
                assert!(all.contains(part), "`{all}` lacks `{part}`");
            }
        }
        // A configuration naming another request only is not this one's.
        let other = with_config(
            c,
            serde_json::json!([{"source": "FromClaim", "requests": ["other"],
                "opaque": {"driver": "gpuslice.io", "parameters": {"cores": 30}}}]),
        );
        assert!(node_allocation(&other, &want(), "n1", &geometry()).is_ok());
    }

    #[test]
    fn subrequest_results_group_by_their_parent_and_its_config_applies() {
        // A prioritized list's results name `<request>/<subrequest>`: the slots of `gpu` are
        // counted as one request's (on one GPU), and a share configured for `gpu` is theirs.
        let c = claim_json(
            "u-1",
            serde_json::json!([
                slot("gpu/slots-0", "gpu-0-slot-0", "n1"),
                slot("gpu/slots-0", "gpu-0-slot-1", "n1"),
            ]),
        );
        let shared = with_config(
            c,
            serde_json::json!([{"source": "FromClaim", "requests": ["gpu"],
                "opaque": {"driver": "gpuslice.io", "parameters": {"cores": 10}}}]),
        );
        let a = node_allocation(&shared, &want(), "n1", &geometry()).unwrap();
        assert_eq!(
            a.shares,
            [DeviceShare {
                index: 0,
                memory: 10 << 30,
                cores: 10
            }]
        );
        assert_eq!(a.results[0].request, "gpu/slots-0");
        // Two subrequest results of one request on two GPUs are still one request's slots
        // spread over GPUs.
        let spans = claim_json(
            "u-1",
            serde_json::json!([
                slot("gpu/slots-0", "gpu-0-slot-0", "n1"),
                slot("gpu/slots-0", "gpu-1-slot-0", "n1"),
            ]),
        );
        let e = node_allocation(&spans, &want(), "n1", &geometry())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("request gpu ") && e.contains("gpu-0, gpu-1"),
            "{e}"
        );
    }

    #[test]
    fn bad_slot_claims_are_refused_naming_what_is_accepted() {
        // One request's slots on two GPUs: no matchAttribute constraint.
        let spans = claim_json(
            "u-1",
            serde_json::json!([
                slot("gpu", "gpu-0-slot-0", "n1"),
                slot("gpu", "gpu-1-slot-0", "n1")
            ]),
        );
        let e = node_allocation(&spans, &want(), "n1", &geometry())
            .unwrap_err()
            .to_string();
        for part in [
            "request gpu",
            "gpu-0, gpu-1",
            "matchAttribute: gpuslice.io/uuid",
            "one request per GPU",
            "nothing was booked",
        ] {
            assert!(e.contains(part), "`{e}` lacks `{part}`");
        }
        // A slot the node does not publish (slots_per_gpu is 16 here).
        let range = claim_json(
            "u-1",
            serde_json::json!([slot("gpu", "gpu-0-slot-16", "n1")]),
        );
        let e = node_allocation(&range, &want(), "n1", &geometry())
            .unwrap_err()
            .to_string();
        assert!(e.contains("slots 0 to 15"), "{e}");
        // Malformed opaque parameters.
        let one = claim_json(
            "u-1",
            serde_json::json!([slot("gpu", "gpu-0-slot-0", "n1")]),
        );
        for (params, part) in [
            (serde_json::json!("cores=10"), "is not an object"),
            (serde_json::json!({"cores": 0}), "from 1 to 100"),
            (serde_json::json!({"cores": "10"}), "`cores`"),
            (serde_json::json!({"memory": "4Gi", "cores": 5}), "`memory`"),
            (serde_json::json!({"kind": "Other", "cores": 5}), "`kind`"),
            (serde_json::json!({}), "no `cores`"),
        ] {
            let c = with_config(
                one.clone(),
                serde_json::json!([{"source": "FromClaim", "opaque": {"driver": "gpuslice.io", "parameters": params}}]),
            );
            let e = node_allocation(&c, &want(), "n1", &geometry())
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(part) && e.contains("accepted: a JSON object {\"cores\""),
                "{params}: `{e}` lacks `{part}`"
            );
        }
        // Other drivers' parameters are theirs.
        let theirs = with_config(
            one,
            serde_json::json!([{"source": "FromClaim", "opaque": {"driver": "gpu.nvidia.com", "parameters": "x"}}]),
        );
        assert!(node_allocation(&theirs, &want(), "n1", &geometry()).is_ok());
    }

    /// Six 4Gi slots on each of two 24Gi GPUs.
    fn six_slots() -> (SlotGeometry, gpuslice_dra::claim_shape::PublishedGpus) {
        use gpuslice_dra::claim_shape::{Mode, PublishedGpus, SlotSize};
        let geometry = SlotGeometry {
            per_gpu: 6,
            totals: [(0, 24 << 30), (1, 24 << 30)].into_iter().collect(),
        };
        let inventory = PublishedGpus {
            mode: Mode::Slots(vec![SlotSize {
                memory: 4 << 30,
                cores: None,
                per_gpu: 6,
            }]),
            max_gpus_per_node: Some(2),
            gpu_memory: vec![24 << 30],
        };
        (geometry, inventory)
    }

    /// A claim of `spec` allocated `results` (request, device) on node n1, its configuration
    /// copied into the allocation as the scheduler does.
    fn allocated(
        spec: &k8s_openapi::api::resource::v1::ResourceClaimSpec,
        results: &[(&str, &str)],
    ) -> ResourceClaim {
        let results: Vec<_> = results.iter().map(|(r, d)| slot(r, d, "n1")).collect();
        let mut c = claim_json("u-1", serde_json::Value::Array(results));
        c.spec = Some(spec.clone());
        let config: Vec<_> = spec
            .devices
            .iter()
            .flat_map(|d| d.config.iter().flatten())
            .map(|c| {
                let mut v = serde_json::to_value(c).unwrap();
                v["source"] = serde_json::json!("FromClaim");
                v
            })
            .collect();
        with_config(c, serde_json::Value::Array(config))
    }

    #[test]
    fn a_slice_of_whole_gpus_books_its_share_once_per_gpu() {
        use gpuslice_dra::claim_shape::{claim_spec, Shape};
        let (geometry, inventory) = six_slots();
        // `gpus: 2, cores: N` in slot mode: one single-slot request per slot, one share for all.
        let devices: Vec<String> = (0..2)
            .flat_map(|g| (0..6).map(move |j| format!("gpu-{g}-slot-{j}")))
            .collect();
        let results: Vec<(&str, &str)> = devices.iter().map(|d| (d.as_str(), d.as_str())).collect();
        for cores in [10, 30] {
            let shape = Shape {
                gpus: 2,
                cores: Some(cores),
                ..Shape::default()
            };
            let (spec, _) = claim_spec(&inventory.mode, &shape, "f").unwrap();
            let c = allocated(&spec, &results);
            let a = node_allocation(&c, &want(), "n1", &geometry).unwrap();
            assert_eq!(
                a.shares,
                [0, 1]
                    .map(|index| DeviceShare {
                        index,
                        memory: 24 << 30,
                        cores: cores as u8
                    })
                    .to_vec(),
                "cores {cores}"
            );
        }
    }

    #[test]
    fn what_a_claim_is_charged_is_what_prepare_books() {
        use gpuslice_dra::quota::claim_charge;
        let (geometry, inventory) = six_slots();
        let share = |cores: u32, requests: Option<&[&str]>| {
            let mut c = serde_json::json!({"opaque": {"driver": "gpuslice.io",
                "parameters": {"apiVersion": "gpuslice.io/v1", "kind": "SliceParameters", "cores": cores}}});
            if let Some(r) = requests {
                c["requests"] = serde_json::json!(r);
            }
            c
        };
        let slots = |name: &str, count: u32| serde_json::json!({"name": name, "exactly": {"deviceClassName": "slots.gpuslice.io", "count": count}});
        let on_one_gpu = |names: &[&str]| serde_json::json!({"requests": names, "matchAttribute": "gpuslice.io/uuid"});
        let whole_gpu = |g: u32| (0..6).map(move |j| format!("gpu-{g}-slot-{j}"));
        let gpu0: Vec<String> = whole_gpu(0).collect();
        let pinned: Vec<String> = whole_gpu(0).chain(whole_gpu(1)).collect();
        let pinned_results: Vec<(&str, &str)> =
            pinned.iter().map(|d| (d.as_str(), d.as_str())).collect();
        let (two_gpus, _) = gpuslice_dra::claim_shape::claim_spec(
            &inventory.mode,
            &gpuslice_dra::claim_shape::Shape {
                gpus: 2,
                cores: Some(30),
                ..Default::default()
            },
            "f",
        )
        .unwrap();
        // (what, the claim's devices, its results as (request, device), the cores it books)
        type Layout<'a> = (&'a str, serde_json::Value, Vec<(&'a str, &'a str)>, u64);
        let layouts: Vec<Layout> = vec![
            (
                "two configurations for every request",
                serde_json::json!({"requests": [slots("gpu", 6)],
                    "constraints": [on_one_gpu(&["gpu"])],
                    "config": [share(1, None), share(96, None)]}),
                gpu0.iter().map(|d| ("gpu", d.as_str())).collect(),
                96,
            ),
            (
                "a configuration per request, both on one GPU",
                serde_json::json!({"requests": [slots("a", 2), slots("b", 1)],
                    "constraints": [on_one_gpu(&["a", "b"])],
                    "config": [share(10, Some(&["a"])), share(20, Some(&["b"]))]}),
                vec![
                    ("a", "gpu-0-slot-0"),
                    ("a", "gpu-0-slot-1"),
                    ("b", "gpu-0-slot-2"),
                ],
                20,
            ),
            (
                "one GPU throttled, one not",
                serde_json::json!({"requests": [slots("a", 2), slots("b", 1)],
                    "constraints": [on_one_gpu(&["a"]), on_one_gpu(&["b"])],
                    "config": [share(10, Some(&["a"]))]}),
                vec![
                    ("a", "gpu-0-slot-0"),
                    ("a", "gpu-0-slot-1"),
                    ("b", "gpu-1-slot-0"),
                ],
                110,
            ),
            (
                "a prioritized list, its parent configured",
                serde_json::json!({"requests": [{"name": "gpu", "firstAvailable": [
                        {"name": "slots-0", "deviceClassName": "slots.gpuslice.io", "count": 2},
                        {"name": "slots-1", "deviceClassName": "slots.gpuslice.io", "count": 1}]}],
                    "constraints": [on_one_gpu(&["gpu"])],
                    "config": [share(15, Some(&["gpu"]))]}),
                vec![("gpu/slots-1", "gpu-1-slot-3")],
                15,
            ),
            (
                "whole GPUs asked slot by slot",
                serde_json::to_value(&two_gpus).unwrap()["devices"].clone(),
                pinned_results,
                60,
            ),
        ];
        for (what, devices, results, want_cores) in layouts {
            let spec: k8s_openapi::api::resource::v1::ResourceClaimSpec =
                serde_json::from_value(serde_json::json!({ "devices": devices })).unwrap();
            let charged = claim_charge(&spec, &inventory, "f").unwrap();
            let a = node_allocation(&allocated(&spec, &results), &want(), "n1", &geometry)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            // Booked 0 is not throttled, which a budget charges as a whole GPU's share.
            let booked: u64 = a
                .shares
                .iter()
                .map(|s| {
                    if s.cores == 0 {
                        100
                    } else {
                        u64::from(s.cores)
                    }
                })
                .sum();
            assert_eq!(
                (charged.cores, charged.gpus),
                (booked, a.shares.len() as u64),
                "{what}"
            );
            assert_eq!(booked, want_cores, "{what}");
        }
    }
}
