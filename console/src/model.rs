//! The console's data model: per node, per GPU and per pod container, what the ResourceSlices
//! offer (capacity), what allocated ResourceClaims consume (allocated = the sum of their
//! `consumedCapacity` per device in capacity mode; in slot mode the memory of the slots they
//! hold and the share their opaque parameters ask), what is free, and what Prometheus says is
//! really used. Slot devices (`gpu-<i>-slot-<j>`) are gathered into their GPU.
//! Pure functions over API objects and a usage sample, shared by the kubectl plugin and the
//! web console; nothing here talks to a server or prints.

use std::collections::{BTreeMap, BTreeSet};

use gpuslice_config::quantity::parse_kube_quantity;
use gpuslice_dra::claim_shape::{plugin_pools, PublishedGpus};
use gpuslice_dra::opaque::{gpu_share, share_configs};
use gpuslice_dra::slices::{
    device_name, parse_device, DeviceRef, ATTR_PRODUCT, ATTR_UUID, CAP_CORES, CAP_MEMORY,
};
use gpuslice_dra::DRIVER;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use serde::Serialize;

use crate::usage::{SliceUsage, Usage};

/// The objects a view is made from.
#[derive(Debug, Clone)]
pub struct Sources {
    pub slices: Vec<ResourceSlice>,
    pub claims: Vec<ResourceClaim>,
    pub pods: Vec<Pod>,
    /// What Prometheus says is used, or why that is not known.
    pub usage: Result<Usage, String>,
}

/// One resource (memory in bytes, cores in percent of a GPU: 100 per GPU).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Figure {
    /// What the ResourceSlices offer the scheduler.
    pub capacity: u64,
    /// The sum of allocated claims' `consumedCapacity`.
    pub allocated: u64,
    /// `capacity - allocated` (never below 0).
    pub free: u64,
    /// Measured (Prometheus); `None` when not known.
    pub used: Option<u64>,
}

impl Figure {
    fn add(&mut self, other: &Figure) {
        self.capacity += other.capacity;
        self.allocated += other.allocated;
        self.free += other.free;
        self.used = match (self.used, other.used) {
            (Some(a), Some(b)) => Some(a + b),
            _ => None,
        };
    }
}

/// One claim's consumption of one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimOnGpu {
    pub namespace: String,
    pub name: String,
    pub memory: u64,
    pub cores: u64,
    /// The pods the claim is reserved for.
    pub pods: Vec<String>,
    /// Holds its booking but uses no GPU memory and runs no measured kernels (`None`: not
    /// measured or not matched to an exporter series).
    pub idle: Option<bool>,
    /// The slots it holds on this GPU (slot mode only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slots: Option<u64>,
}

/// A GPU's slots in slot mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SlotsView {
    /// Bytes of each slot.
    pub size: u64,
    /// The slots published (those node paths hold are withdrawn).
    pub published: u64,
    /// The slots claims hold.
    pub allocated: u64,
}

/// One GPU as a device of a gpuslice ResourceSlice.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuView {
    pub node: String,
    pub device: String,
    pub index: Option<u32>,
    pub uuid: String,
    pub model: String,
    pub memory: Figure,
    pub cores: Figure,
    pub claims: Vec<ClaimOnGpu>,
    /// Claims on this GPU that hold a booking and use nothing; `None` when not measured.
    pub idle_slices: Option<u64>,
    /// Its slots, when it is published in slot mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slots: Option<SlotsView>,
    /// Why it is offered to no one new, when its device carries the taint
    /// `gpuslice.io/unhealthy` (docs/troubleshooting.md, "GPU health and XIDs").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unhealthy: Option<String>,
}

/// The unhealthy taint of device `d`, as one phrase: `XID 79 since 2026-…Z`.
fn unhealthy(d: &k8s_openapi::api::resource::v1::Device) -> Option<String> {
    let t = d
        .taints
        .iter()
        .flatten()
        .find(|t| t.key == "gpuslice.io/unhealthy")?;
    let what = t
        .value
        .as_deref()
        .and_then(|v| v.strip_prefix("xid-"))
        .map_or_else(|| "unhealthy".to_string(), |x| format!("XID {x}"));
    Some(match &t.time_added {
        Some(at) => format!("{what} since {}", at.0),
        None => what,
    })
}

/// One node (a pool of gpuslice devices).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeView {
    pub name: String,
    pub gpus: u64,
    pub models: Vec<String>,
    pub memory: Figure,
    pub cores: Figure,
    /// Allocations of claims on the node's GPUs.
    pub slices: u64,
    pub idle_slices: Option<u64>,
    /// The largest free memory of one GPU (what the biggest new single-GPU claim can get).
    pub largest_free_memory: u64,
    /// How the node's plugin publishes its GPUs: `capacity` or `slots (N per GPU × SIZE)`.
    pub mode: String,
}

/// One container's slice on one GPU.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerSlice {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub node: String,
    /// The claim's name; `None` for a slice of the annotation path (from the exporter only).
    pub claim: Option<String>,
    pub device: String,
    pub uuid: String,
    pub memory_limit: u64,
    /// The shim's account (the slice's usage file).
    pub memory_used: Option<u64>,
    /// The driver's figure (NVML, summed over the container's processes).
    pub memory_used_driver: Option<u64>,
    /// The compute share, percent (0: not throttled).
    pub cores_share: u64,
    /// The achieved share, percent.
    pub cores_used: Option<f64>,
    /// The containers of a pod that use one claim share one slice.
    pub shared_with: Vec<String>,
    /// The pod's workload, `kind/name` ([`workload_of`]).
    pub workload: String,
}

/// Everything the views show.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Model {
    pub total: NodeView,
    pub nodes: Vec<NodeView>,
    pub gpus: Vec<GpuView>,
    pub pods: Vec<ContainerSlice>,
    /// Why the used figures are missing (`None` when Prometheus answered).
    pub usage_unavailable: Option<String>,
    /// Things the model could not place (a claim on a device no slice publishes, …).
    pub warnings: Vec<String>,
}

/// A GPU as a person names it: `node/gpu-0 (H200)` (the model less its vendor prefix).
pub fn gpu_label(node: &str, device: &str, model: &str) -> String {
    let short = model.strip_prefix("NVIDIA ").unwrap_or(model).trim();
    if short.is_empty() {
        format!("{node}/{device}")
    } else {
        format!("{node}/{device} ({short})")
    }
}

/// The name of the cluster total row.
pub const TOTAL: &str = "*";

/// A capacity or consumption the API server holds, when present and readable (the model shows
/// what it can and says elsewhere what it could not).
fn quantity(q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>) -> Option<u64> {
    q.and_then(|q| parse_kube_quantity(&q.0).ok())
}

/// (pool, GPU device) → the claims' consumption of it.
type Bookings = BTreeMap<(String, String), Vec<ClaimOnGpu>>;

/// A published device: the GPU it belongs to (`(pool, gpu-<i>)`), its memory, and whether it
/// is a slot.
#[derive(Debug, Clone)]
struct Published {
    gpu: (String, String),
    memory: u64,
    slot: bool,
}

/// The compute share a slot claim's opaque parameters ask for the result of request
/// `request` (`<request>` or a prioritized list's `<request>/<subrequest>`), as the plugin
/// reads them ([`gpu_share`]; the largest of a GPU's results is the GPU's).
fn slot_share(alloc: &k8s_openapi::api::resource::v1::AllocationResult, request: &str) -> u64 {
    let configs: Vec<_> = share_configs(
        alloc
            .devices
            .iter()
            .flat_map(|d| d.config.iter().flatten())
            .map(|c| (c.requests.as_deref(), c.opaque.as_ref())),
    )
    .into_iter()
    .filter_map(Result::ok)
    .collect();
    gpu_share(&configs, [request]).map_or(0, u64::from)
}

/// One claim on one GPU while its results are summed: the GPU, memory, cores, slots.
type OnGpu = ((String, String), u64, u64, Option<u64>);

/// The claims' consumption of each published GPU; a result on a device no slice publishes is
/// a warning, except in a pool of `left_out` (already warned of as a whole).
fn bookings(
    claims: &[ResourceClaim],
    published: &BTreeMap<(String, String), Published>,
    left_out: &BTreeSet<&str>,
    warnings: &mut Vec<String>,
) -> Bookings {
    let mut out: Bookings = BTreeMap::new();
    for c in claims {
        let Some(alloc) = c.status.as_ref().and_then(|s| s.allocation.as_ref()) else {
            continue;
        };
        let namespace = c.metadata.namespace.clone().unwrap_or_default();
        let name = c.metadata.name.clone().unwrap_or_default();
        let pods: Vec<String> = c
            .status
            .as_ref()
            .and_then(|s| s.reserved_for.as_ref())
            .map(|r| {
                r.iter()
                    .filter(|r| r.resource == "pods")
                    .map(|r| r.name.clone())
                    .collect()
            })
            .unwrap_or_default();
        // GPU → (memory, cores, slots) of this claim, in the order first met.
        let mut on: Vec<OnGpu> = Vec::new();
        for r in alloc
            .devices
            .iter()
            .flat_map(|d| d.results.iter().flatten())
        {
            if r.driver != DRIVER {
                continue;
            }
            let Some(p) = published.get(&(r.pool.clone(), r.device.clone())) else {
                if left_out.contains(r.pool.as_str()) {
                    continue;
                }
                warnings.push(format!(
                    "claim {namespace}/{name} is allocated device {} of pool {}, which no gpuslice ResourceSlice publishes",
                    r.device, r.pool
                ));
                continue;
            };
            let (memory, cores) = if p.slot {
                // A slot: its bytes; the share its opaque parameters ask, once per GPU.
                (p.memory, slot_share(alloc, &r.request))
            } else {
                let consumed = r.consumed_capacity.as_ref();
                // No consumedCapacity (a scheduler without consumable capacity): the whole GPU.
                (
                    quantity(consumed.and_then(|c| c.get(CAP_MEMORY))).unwrap_or(p.memory),
                    quantity(consumed.and_then(|c| c.get(CAP_CORES))).unwrap_or(0),
                )
            };
            match on.iter_mut().find(|e| e.0 == p.gpu) {
                Some(e) if p.slot => {
                    e.1 += memory;
                    e.2 = e.2.max(cores);
                    e.3 = Some(e.3.unwrap_or(0) + 1);
                }
                Some(e) => {
                    e.1 += memory;
                    e.2 += cores;
                }
                None => on.push((p.gpu.clone(), memory, cores, p.slot.then_some(1))),
            }
        }
        for (gpu, memory, cores, slots) in on {
            out.entry(gpu).or_default().push(ClaimOnGpu {
                namespace: namespace.clone(),
                name: name.clone(),
                memory,
                cores,
                pods: pods.clone(),
                idle: None,
                slots,
            });
        }
    }
    out
}

/// The exporter series of a claim's slice on GPU `uuid` (GPU UUIDs are unique, so the join
/// needs no node name, which the exporter may spell as the host name): the claim's
/// reservation carries its namespace and no pod, and its memory limit is the claim's consumed
/// memory. `None` when no series, or more than one, fits, and when another claim of `on_gpu`
/// (the claims on that GPU) has the same namespace and size: two such claims cannot be told
/// apart from the exporter's labels, even while only one of them has a series.
pub fn claim_series<'a>(
    usage: &'a Usage,
    uuid: &str,
    claim: &ClaimOnGpu,
    on_gpu: &[ClaimOnGpu],
) -> Option<&'a SliceUsage> {
    let twins = on_gpu
        .iter()
        .filter(|c| c.namespace == claim.namespace && c.memory == claim.memory)
        .count();
    if twins > 1 {
        return None;
    }
    let mut found = usage.slices.iter().filter(|s| {
        s.uuid == uuid
            && s.pod.is_empty()
            && s.namespace == claim.namespace
            && s.memory_limit == Some(claim.memory)
    });
    let first = found.next()?;
    found.next().is_none().then_some(first)
}

/// Idle now, judged as the idle report judges (console/src/idle.rs): from the driver's
/// figures for the slice's processes, never the usage file the container writes itself.
fn is_idle(s: &SliceUsage) -> Option<bool> {
    let memory = s.nvml_memory_used?;
    Some(memory == 0 && s.nvml_compute_used.unwrap_or(0.0) == 0.0)
}

/// Builds the model. `namespaces`: the namespaces whose pods the `pods` view shows (`None`:
/// all); nodes and GPUs always show every claim, as they are cluster-wide.
pub fn build(src: &Sources, namespaces: Option<&BTreeSet<String>>) -> Model {
    let mut warnings = Vec::new();
    let usage = src.usage.as_ref().ok();
    // Each GPU once (its capacity device, or its slots gathered), and each published device.
    struct Gpu<'a> {
        key: (String, String),
        device: &'a k8s_openapi::api::resource::v1::Device,
        memory: u64,
        cores: u64,
        slots: Option<SlotsView>,
    }
    let mut gpu_list: Vec<Gpu> = Vec::new();
    let mut published: BTreeMap<(String, String), Published> = BTreeMap::new();
    // The devices the scheduler allocates from, each once (one rule with the webhook's
    // inventory): a pool it takes nothing from now (mid-republish) is one warning, and the
    // claims on its devices are not warned of one by one.
    let pools = plugin_pools(&src.slices);
    let mut left_out: BTreeSet<&str> = BTreeSet::new();
    for p in &pools {
        if let Some(why) = &p.unusable {
            warnings.push(format!(
                "{why}: its GPUs are left out until it is complete, as the scheduler leaves them out"
            ));
            left_out.insert(p.node);
        }
    }
    for (s, d) in pools.iter().flat_map(|p| p.devices()) {
        let pool = s.spec.pool.name.clone();
        let cap = d.capacity.as_ref();
        let memory = quantity(cap.and_then(|c| c.get(CAP_MEMORY)).map(|c| &c.value)).unwrap_or(0);
        let cores = quantity(cap.and_then(|c| c.get(CAP_CORES)).map(|c| &c.value)).unwrap_or(0);
        let (gpu_device, slot) = match parse_device(&d.name) {
            Some(DeviceRef::Slot(i, _)) => (device_name(i), true),
            _ => (d.name.clone(), false),
        };
        let key = (pool.clone(), gpu_device);
        published.insert(
            (pool.clone(), d.name.clone()),
            Published {
                gpu: key.clone(),
                memory,
                slot,
            },
        );
        match gpu_list.iter_mut().find(|g| g.key == key) {
            Some(g) if slot => {
                g.memory += memory;
                g.cores += cores;
                if let Some(s) = g.slots.as_mut() {
                    s.published += 1;
                    s.size = s.size.min(memory);
                }
            }
            Some(_) => {}
            None => gpu_list.push(Gpu {
                key,
                device: d,
                memory,
                cores,
                slots: slot.then_some(SlotsView {
                    size: memory,
                    published: 1,
                    allocated: 0,
                }),
            }),
        }
    }
    let mut booked = bookings(&src.claims, &published, &left_out, &mut warnings);

    let mut gpus: Vec<GpuView> = gpu_list
        .iter()
        .map(|g| {
            let d = g.device;
            let (pool, name) = &g.key;
            let (cap_memory, cap_cores) = (g.memory, g.cores);
            let attr = |k: &str| {
                d.attributes
                    .as_ref()
                    .and_then(|a| a.get(k))
                    .and_then(|a| a.string.clone())
                    .unwrap_or_default()
            };
            let uuid = attr(ATTR_UUID);
            let mut claims = booked.remove(&g.key).unwrap_or_default();
            claims.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
            // A GPU Prometheus knows nothing of: idle unknown, not 0.
            let gpu_usage = usage.and_then(|u| u.gpus.get(&uuid));
            let mut idle_slices = gpu_usage.map(|_| 0);
            if let Some(u) = usage.filter(|_| gpu_usage.is_some()) {
                let idle: Vec<Option<bool>> = claims
                    .iter()
                    .map(|c| claim_series(u, &uuid, c, &claims).and_then(is_idle))
                    .collect();
                for (c, idle) in claims.iter_mut().zip(idle) {
                    c.idle = idle;
                    if c.idle == Some(true) {
                        idle_slices = idle_slices.map(|n| n + 1);
                    }
                }
            }
            let memory_allocated: u64 = claims.iter().map(|c| c.memory).sum();
            let cores_allocated: u64 = claims.iter().map(|c| c.cores).sum();
            let slots = g.slots.map(|s| SlotsView {
                allocated: claims.iter().filter_map(|c| c.slots).sum(),
                ..s
            });
            GpuView {
                node: pool.clone(),
                device: name.clone(),
                index: match parse_device(name) {
                    Some(DeviceRef::Gpu(i)) => Some(i),
                    _ => None,
                },
                model: attr(ATTR_PRODUCT),
                uuid,
                memory: Figure {
                    capacity: cap_memory,
                    allocated: memory_allocated,
                    free: cap_memory.saturating_sub(memory_allocated),
                    used: gpu_usage.and_then(|g| g.memory_used),
                },
                cores: Figure {
                    capacity: cap_cores,
                    allocated: cores_allocated,
                    free: cap_cores.saturating_sub(cores_allocated),
                    used: gpu_usage
                        .and_then(|g| g.utilization)
                        .map(|u| (u * 100.0).round() as u64),
                },
                claims,
                idle_slices,
                slots,
                unhealthy: unhealthy(d),
            }
        })
        .collect();
    gpus.sort_by(|a, b| (&a.node, a.index, &a.device).cmp(&(&b.node, b.index, &b.device)));

    // The mode as each node's slices show it, and the cluster's.
    let mode_of = |pool: Option<&str>| {
        let slices: Vec<ResourceSlice> = src
            .slices
            .iter()
            .filter(|s| pool.is_none_or(|p| s.spec.pool.name == p))
            .cloned()
            .collect();
        PublishedGpus::from_slices(&slices).mode.describe()
    };
    let mut nodes: BTreeMap<String, NodeView> = BTreeMap::new();
    for g in &gpus {
        let n = nodes.entry(g.node.clone()).or_insert_with(|| NodeView {
            mode: mode_of(Some(&g.node)),
            ..empty_node(&g.node, usage)
        });
        add_gpu(n, g);
    }
    let nodes: Vec<NodeView> = nodes.into_values().collect();
    let mut total = NodeView {
        mode: mode_of(None),
        ..empty_node(TOTAL, usage)
    };
    for g in &gpus {
        add_gpu(&mut total, g);
    }

    let pods = container_slices(src, &gpus, namespaces);
    Model {
        total,
        nodes,
        gpus,
        pods,
        usage_unavailable: src.usage.as_ref().err().cloned(),
        warnings,
    }
}

fn empty_node(name: &str, usage: Option<&Usage>) -> NodeView {
    let measured = usage.map(|_| 0);
    NodeView {
        name: name.to_string(),
        gpus: 0,
        models: Vec::new(),
        memory: Figure {
            used: measured,
            ..Figure::default()
        },
        cores: Figure {
            used: measured,
            ..Figure::default()
        },
        slices: 0,
        idle_slices: measured,
        largest_free_memory: 0,
        mode: String::new(),
    }
}

fn add_gpu(n: &mut NodeView, g: &GpuView) {
    n.gpus += 1;
    if !n.models.contains(&g.model) {
        n.models.push(g.model.clone());
    }
    n.memory.add(&g.memory);
    n.cores.add(&g.cores);
    n.slices += g.claims.len() as u64;
    n.idle_slices = match (n.idle_slices, g.idle_slices) {
        (Some(a), Some(b)) => Some(a + b),
        _ => None,
    };
    n.largest_free_memory = n.largest_free_memory.max(g.memory.free);
}

/// A TrainJob's label on its pods, when its Trainer puts one there (v2.0.0 does not: its pods
/// carry the label of the JobSet it makes, of the TrainJob's name).
pub const TRAINJOB_LABEL: &str = "trainer.kubeflow.org/trainjob-name";
/// The training operator's label naming the controller that made a pod (`pytorchjob-controller`,
/// `tfjob-controller`, `mpijob-controller`, …): the kind of a training job whose pod has no
/// owner naming it.
pub const TRAINING_OPERATOR_LABEL: &str = "training.kubeflow.org/operator-name";

/// The workload a pod belongs to, as `kind/name`: the job of a job's pod
/// ([`gpuslice_dra::jobs::job_of`]: `job/NAME` by the `gpuslice.io/job` label, a training
/// operator job's (`pytorchjob/NAME`, `tfjob/NAME`, …) by its controller owner or, without
/// one, by the operator's label naming its controller, `trainjob/NAME` or `jobset/NAME` for a
/// TrainJob's or JobSet's, whose controller owner is one of its Jobs); else its controller owner, a ReplicaSet's pod
/// named by its Deployment (the ReplicaSet's name less the pod's `pod-template-hash`
/// label); `pod/NAME` for a pod without a controller.
pub fn workload_of(pod: &Pod) -> String {
    use gpuslice_dra::jobs::{JOBSET_LABEL, JOB_LABEL, TRAINING_JOB_LABEL};
    let name = pod.metadata.name.clone().unwrap_or_default();
    let labels = pod.metadata.labels.as_ref();
    let label = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
    let owner = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true));
    if let Some(trainjob) = label(TRAINJOB_LABEL).filter(|v| !v.is_empty()) {
        return format!("trainjob/{trainjob}");
    }
    match gpuslice_dra::jobs::job_of(label) {
        Some((JOB_LABEL, job)) => return format!("job/{job}"),
        Some((JOBSET_LABEL, set)) => return format!("jobset/{set}"),
        // The training operator's job owns its pods; without that owner, the kind its
        // controller's label names, else a PyTorchJob's.
        Some((TRAINING_JOB_LABEL, job)) if owner.is_none_or(|o| o.name != job) => {
            let kind = label(TRAINING_OPERATOR_LABEL)
                .and_then(|v| v.strip_suffix("-controller"))
                .filter(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_lowercase()))
                .unwrap_or("pytorchjob");
            return format!("{kind}/{job}");
        }
        _ => {}
    }
    let Some(owner) = owner else {
        return format!("pod/{name}");
    };
    let hash = label("pod-template-hash");
    if owner.kind == "ReplicaSet" {
        if let Some(deployment) = hash.and_then(|h| owner.name.strip_suffix(&format!("-{h}"))) {
            return format!("deployment/{deployment}");
        }
    }
    format!("{}/{}", owner.kind.to_ascii_lowercase(), owner.name)
}

/// The pod's claim name for its entry `entry` of `spec.resourceClaims`.
fn pod_claim_name(pod: &Pod, entry: &str) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    let pc = spec
        .resource_claims
        .as_ref()?
        .iter()
        .find(|c| c.name == entry)?;
    if let Some(n) = &pc.resource_claim_name {
        return Some(n.clone());
    }
    pod.status
        .as_ref()?
        .resource_claim_statuses
        .as_ref()?
        .iter()
        .find(|s| s.name == entry)?
        .resource_claim_name
        .clone()
}

fn container_slices(
    src: &Sources,
    gpus: &[GpuView],
    namespaces: Option<&BTreeSet<String>>,
) -> Vec<ContainerSlice> {
    let usage = src.usage.as_ref().ok();
    let wanted = |ns: &str| namespaces.is_none_or(|set| set.contains(ns));
    let mut out = Vec::new();
    for pod in &src.pods {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        if !wanted(&namespace) {
            continue;
        }
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        let Some(spec) = pod.spec.as_ref() else {
            continue;
        };
        // claim name → the containers using it: by the pod's claim entries, and the claim
        // the scheduler wrote for the containers asking a device class's extended resource.
        let mut users: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut uses = |claim: String, container: &str| {
            let list = users.entry(claim).or_default();
            if !list.iter().any(|c| c == container) {
                list.push(container.to_string());
            }
        };
        for c in &spec.containers {
            for rc in c.resources.iter().flat_map(|r| r.claims.iter().flatten()) {
                if let Some(claim) = pod_claim_name(pod, &rc.name) {
                    uses(claim, &c.name);
                }
            }
        }
        let extended = pod
            .status
            .as_ref()
            .and_then(|s| s.extended_resource_claim_status.as_ref());
        if let Some(e) = extended {
            for m in &e.request_mappings {
                uses(e.resource_claim_name.clone(), &m.container_name);
            }
        }
        for (claim, containers) in &users {
            for g in gpus {
                let Some(c) = g
                    .claims
                    .iter()
                    .find(|c| c.namespace == namespace && &c.name == claim)
                else {
                    continue;
                };
                let series = usage.and_then(|u| claim_series(u, &g.uuid, c, &g.claims));
                let workload = workload_of(pod);
                for container in containers {
                    out.push(ContainerSlice {
                        namespace: namespace.clone(),
                        pod: pod_name.clone(),
                        container: container.clone(),
                        node: g.node.clone(),
                        claim: Some(claim.clone()),
                        device: g.device.clone(),
                        uuid: g.uuid.clone(),
                        memory_limit: c.memory,
                        memory_used: series.and_then(|s| s.memory_used),
                        memory_used_driver: series.and_then(|s| s.nvml_memory_used),
                        cores_share: c.cores,
                        cores_used: series.and_then(|s| s.compute_used).map(|r| r * 100.0),
                        shared_with: containers
                            .iter()
                            .filter(|o| *o != container)
                            .cloned()
                            .collect(),
                        workload: workload.clone(),
                    });
                }
            }
        }
    }
    // Annotation-path slices: only the exporter knows them.
    if let Some(u) = usage {
        for s in u
            .slices
            .iter()
            .filter(|s| !s.pod.is_empty() && wanted(&s.namespace))
        {
            let device = gpus
                .iter()
                .find(|g| g.uuid == s.uuid)
                .map(|g| g.device.clone())
                .unwrap_or_else(|| format!("gpu-{}", s.index));
            out.push(ContainerSlice {
                namespace: s.namespace.clone(),
                pod: s.pod.clone(),
                container: s.container.clone(),
                node: s.node.clone(),
                claim: None,
                device,
                uuid: s.uuid.clone(),
                memory_limit: s.memory_limit.unwrap_or(0),
                memory_used: s.memory_used,
                memory_used_driver: s.nvml_memory_used,
                cores_share: s
                    .compute_limit
                    .map(|r| (r * 100.0).round() as u64)
                    .unwrap_or(0),
                cores_used: s.compute_used.map(|r| r * 100.0),
                shared_with: Vec::new(),
                workload: src
                    .pods
                    .iter()
                    .find(|p| {
                        p.metadata.namespace.as_deref() == Some(s.namespace.as_str())
                            && p.metadata.name.as_deref() == Some(s.pod.as_str())
                    })
                    .map_or_else(|| format!("pod/{}", s.pod), workload_of),
            });
        }
    }
    out.sort_by(|a, b| {
        (&a.namespace, &a.pod, &a.container, &a.node, &a.device).cmp(&(
            &b.namespace,
            &b.pod,
            &b.container,
            &b.node,
            &b.device,
        ))
    });
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use gpuslice_dra::slices::{build_slices, OfferedGpu};
    use serde_json::json;

    use super::*;

    pub const GIB: u64 = 1 << 30;

    fn pod_of(labels: serde_json::Value, owner: Option<(&str, &str)>) -> Pod {
        let owners: Vec<serde_json::Value> = owner
            .iter()
            .map(|(kind, name)| json!({"apiVersion": "x/v1", "kind": kind, "name": name, "uid": "u", "controller": true}))
            .collect();
        serde_json::from_value(json!({"metadata": {
            "name": "rank-0", "labels": labels, "ownerReferences": owners}}))
        .unwrap()
    }

    #[test]
    fn a_jobs_pods_are_grouped_under_the_job() {
        let cases = [
            // The training operator's PyTorchJob owns its pods and labels them.
            (
                json!({"training.kubeflow.org/job-name": "train", "training.kubeflow.org/replica-type": "worker"}),
                Some(("PyTorchJob", "train")),
                "pytorchjob/train",
            ),
            (
                json!({"training.kubeflow.org/job-name": "train"}),
                None,
                "pytorchjob/train",
            ),
            // Without its owner, the kind its controller's label names.
            (
                json!({"training.kubeflow.org/job-name": "train", "training.kubeflow.org/operator-name": "tfjob-controller"}),
                None,
                "tfjob/train",
            ),
            (
                json!({"training.kubeflow.org/job-name": "train", "training.kubeflow.org/operator-name": "MPI/-controller"}),
                None,
                "pytorchjob/train",
            ),
            // A TrainJob's (v2.0.0) or JobSet's pods are owned by one of its Jobs: the JobSet.
            (
                json!({"jobset.sigs.k8s.io/jobset-name": "tj", "batch.kubernetes.io/job-completion-index": "0"}),
                Some(("Job", "tj-node-0")),
                "jobset/tj",
            ),
            (
                json!({"jobset.sigs.k8s.io/jobset-name": "tj", "trainer.kubeflow.org/trainjob-name": "tj"}),
                Some(("Job", "tj-node-0")),
                "trainjob/tj",
            ),
            // gpuslice's own label, whatever made the pods.
            (
                json!({"gpuslice.io/job": "sweep", "pod-template-hash": "5d8f"}),
                Some(("ReplicaSet", "web-5d8f")),
                "job/sweep",
            ),
            // Not a job: as before.
            (
                json!({"pod-template-hash": "5d8f"}),
                Some(("ReplicaSet", "web-5d8f")),
                "deployment/web",
            ),
            (json!({"gpuslice.io/job": ""}), None, "pod/rank-0"),
            (json!({}), Some(("Job", "batch")), "job/batch"),
        ];
        for (labels, owner, want) in cases {
            assert_eq!(
                workload_of(&pod_of(labels.clone(), owner)),
                want,
                "{labels}"
            );
        }
    }

    #[test]
    fn a_tainted_gpu_shows_its_xid_and_time() {
        let mut d: k8s_openapi::api::resource::v1::Device = serde_json::from_value(json!({
            "name": "gpu-1",
            "taints": [{"key": "gpuslice.io/unhealthy", "value": "xid-79", "effect": "NoSchedule",
                        "timeAdded": "2026-12-06T08:31:02Z"}],
        }))
        .unwrap();
        assert_eq!(
            unhealthy(&d).as_deref(),
            Some("XID 79 since 2026-12-06T08:31:02Z")
        );
        d.taints = Some(Vec::new());
        assert_eq!(unhealthy(&d), None);
    }

    fn gpu(index: u32, model: &str, gib: u64) -> OfferedGpu {
        OfferedGpu {
            index,
            uuid: format!("GPU-{model}-{index}").replace(' ', "-"),
            model: model.into(),
            numa_node: None,
            pcie_root: None,
            memory: gib * GIB,
            cores: 100,
            slots: None,
        }
    }

    /// A claim allocated on `(pool, device, memory, cores)` results, reserved for `pod`.
    pub fn claim(
        ns: &str,
        name: &str,
        results: &[(&str, &str, &str, &str)],
        pod: Option<&str>,
    ) -> ResourceClaim {
        let results: Vec<_> = results
            .iter()
            .map(|(pool, device, memory, cores)| {
                json!({"request": "gpu", "driver": "gpuslice.io", "pool": pool, "device": device,
                       "consumedCapacity": {"memory": memory, "cores": cores}})
            })
            .collect();
        let mut status = json!({"allocation": {"devices": {"results": results}}});
        if let Some(p) = pod {
            status["reservedFor"] = json!([{"resource": "pods", "name": p, "uid": "u"}]);
        }
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": ns},
            "spec": {},
            "status": status,
        }))
        .unwrap()
    }

    /// node-a: 2 × H200 141Gi (the second offering 100Gi and 75 cores, node paths hold the
    /// rest), node-b: 1 × L4 24Gi.
    pub fn slices() -> Vec<ResourceSlice> {
        let mut a1 = gpu(1, "NVIDIA H200", 100);
        a1.cores = 75;
        let mut s = build_slices("node-a", &[gpu(0, "NVIDIA H200", 141), a1], 1, None).unwrap();
        s.extend(build_slices("node-b", &[gpu(0, "NVIDIA L4", 24)], 1, None).unwrap());
        s
    }

    pub fn claims() -> Vec<ResourceClaim> {
        let mut unallocated = claim("ml", "pending", &[], None);
        unallocated.status = None;
        let mut foreign = claim("ml", "nvidia", &[("node-a", "gpu-0", "1Gi", "1")], None);
        foreign
            .status
            .as_mut()
            .unwrap()
            .allocation
            .as_mut()
            .unwrap()
            .devices
            .as_mut()
            .unwrap()
            .results
            .as_mut()
            .unwrap()[0]
            .driver = "gpu.nvidia.com".into();
        vec![
            claim(
                "ml",
                "train",
                &[("node-a", "gpu-0", "20Gi", "30")],
                Some("train-0"),
            ),
            claim(
                "ml",
                "pair",
                &[
                    ("node-a", "gpu-0", "10Gi", "0"),
                    ("node-a", "gpu-1", "10Gi", "0"),
                ],
                Some("pair-0"),
            ),
            claim(
                "web",
                "infer",
                &[("node-b", "gpu-0", "24Gi", "50")],
                Some("infer-0"),
            ),
            claim("ml", "ghost", &[("node-c", "gpu-0", "1Gi", "1")], None),
            unallocated,
            foreign,
        ]
    }

    fn sources(usage: Result<Usage, String>) -> Sources {
        Sources {
            slices: slices(),
            claims: claims(),
            pods: Vec::new(),
            usage,
        }
    }

    #[test]
    fn capacity_is_the_slices_allocated_the_claims_consumption() {
        let m = build(&sources(Err("no --prometheus URL given".into())), None);
        assert_eq!(m.gpus.len(), 3);
        let a0 = &m.gpus[0];
        assert_eq!(
            (a0.node.as_str(), a0.device.as_str(), a0.index),
            ("node-a", "gpu-0", Some(0))
        );
        assert_eq!(a0.model, "NVIDIA H200");
        assert_eq!(
            a0.memory,
            Figure {
                capacity: 141 * GIB,
                allocated: 30 * GIB,
                free: 111 * GIB,
                used: None
            }
        );
        assert_eq!(
            a0.cores,
            Figure {
                capacity: 100,
                allocated: 30,
                free: 70,
                used: None
            }
        );
        let names: Vec<&str> = a0.claims.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            ["pair", "train"],
            "the other driver's and the pending claim are not ours"
        );
        assert_eq!(a0.claims[1].pods, ["train-0"]);
        assert_eq!(a0.idle_slices, None);
        let a1 = &m.gpus[1];
        assert_eq!(a1.memory.capacity, 100 * GIB);
        assert_eq!(a1.cores.free, 75);
        // The L4: fully allocated, nothing free.
        let b0 = &m.gpus[2];
        assert_eq!((b0.memory.free, b0.cores.free), (0, 50));

        assert_eq!(m.nodes.len(), 2);
        let a = &m.nodes[0];
        assert_eq!((a.name.as_str(), a.gpus, a.slices), ("node-a", 2, 3));
        assert_eq!(a.memory.capacity, 241 * GIB);
        assert_eq!(a.memory.allocated, 40 * GIB);
        assert_eq!(a.cores.capacity, 175);
        assert_eq!(a.largest_free_memory, 111 * GIB);
        assert_eq!(m.nodes[1].largest_free_memory, 0);
        assert_eq!(m.total.name, TOTAL);
        assert_eq!(m.total.gpus, 3);
        assert_eq!(m.total.memory.capacity, 265 * GIB);
        assert_eq!(m.total.memory.allocated, 64 * GIB);
        assert_eq!(m.total.memory.free, 201 * GIB);
        assert_eq!(m.total.memory.used, None);
        assert_eq!(m.total.models, ["NVIDIA H200", "NVIDIA L4"]);
        assert_eq!(
            m.usage_unavailable.as_deref(),
            Some("no --prometheus URL given")
        );
        assert_eq!(m.warnings.len(), 1, "{:?}", m.warnings);
        assert!(m.warnings[0].contains("ml/ghost") && m.warnings[0].contains("node-c"));
    }

    fn slice(ns: &str, pod: &str, uuid: &str, limit: u64, used: u64, nvml: u64) -> SliceUsage {
        SliceUsage {
            node: "node-a".into(),
            reservation: format!("r-{ns}-{pod}-{limit}"),
            namespace: ns.into(),
            pod: pod.into(),
            uuid: uuid.into(),
            index: "0".into(),
            memory_limit: Some(limit),
            memory_used: Some(used),
            nvml_memory_used: Some(nvml),
            ..SliceUsage::default()
        }
    }

    pub fn usage() -> Usage {
        let a0 = "GPU-NVIDIA-H200-0";
        let a1 = "GPU-NVIDIA-H200-1";
        let mut u = Usage::default();
        u.gpus.insert(
            a0.into(),
            GpuUsage {
                memory_used: Some(12 * GIB),
                utilization: Some(0.42),
            },
        );
        u.gpus.insert(
            a1.into(),
            GpuUsage {
                memory_used: Some(0),
                utilization: Some(0.0),
            },
        );
        let mut train = slice("ml", "", a0, 20 * GIB, 8 * GIB, 9 * GIB);
        train.compute_used = Some(0.28);
        train.nvml_compute_used = Some(0.28);
        train.compute_limit = Some(0.3);
        u.slices = vec![
            train,
            // The pair's two GPUs: idle on both.
            slice("ml", "", a0, 10 * GIB, 0, 0),
            slice("ml", "", a1, 10 * GIB, 0, 0),
            // An annotation-path container.
            slice("ops", "probe", a1, 2 * GIB, GIB, GIB),
        ];
        u
    }

    use crate::usage::GpuUsage;

    #[test]
    fn use_comes_from_prometheus_and_idle_slices_are_counted() {
        let m = build(&sources(Ok(usage())), None);
        let a0 = &m.gpus[0];
        assert_eq!(a0.memory.used, Some(12 * GIB));
        assert_eq!(a0.cores.used, Some(42));
        assert_eq!(
            a0.idle_slices,
            Some(1),
            "the pair is idle on gpu-0, train is not"
        );
        let idle: Vec<(&str, Option<bool>)> = a0
            .claims
            .iter()
            .map(|c| (c.name.as_str(), c.idle))
            .collect();
        assert_eq!(idle, [("pair", Some(true)), ("train", Some(false))]);
        // The L4 is not in Prometheus: unknown, not zero.
        assert_eq!(m.gpus[2].memory.used, None);
        assert_eq!(m.gpus[2].claims[0].idle, None);
        assert_eq!(m.nodes[0].memory.used, Some(12 * GIB));
        assert_eq!(m.nodes[0].idle_slices, Some(2));
        assert_eq!(m.nodes[1].memory.used, None);
        assert_eq!(
            m.total.memory.used, None,
            "a GPU not measured leaves the total unknown"
        );
        assert_eq!(m.usage_unavailable, None);
    }

    #[test]
    fn a_zeroed_usage_file_does_not_make_a_busy_slice_idle() {
        // The container wrote 0 to its usage file; the driver sees its processes hold 9 GiB
        // and run kernels: not idle. The reverse (the file claims use the driver does not
        // see) is idle.
        let mut u = usage();
        u.slices[0].memory_used = Some(0);
        u.slices[0].compute_used = Some(0.0);
        u.slices[1].memory_used = Some(4 * GIB);
        u.slices[1].compute_used = Some(0.5);
        let m = build(&sources(Ok(u)), None);
        let idle: Vec<(&str, Option<bool>)> = m.gpus[0]
            .claims
            .iter()
            .map(|c| (c.name.as_str(), c.idle))
            .collect();
        assert_eq!(idle, [("pair", Some(true)), ("train", Some(false))]);
        let mut u = usage();
        u.slices[0].nvml_memory_used = Some(0);
        u.slices[0].nvml_compute_used = Some(0.0);
        let m = build(&sources(Ok(u)), None);
        assert_eq!(
            m.gpus[0].idle_slices,
            Some(2),
            "train's processes hold nothing"
        );
    }

    #[test]
    fn two_same_sized_claims_of_one_namespace_on_one_gpu_are_not_guessed() {
        let mut u = usage();
        u.slices.push(slice(
            "ml",
            "",
            "GPU-NVIDIA-H200-0",
            10 * GIB,
            3 * GIB,
            3 * GIB,
        ));
        let c = ClaimOnGpu {
            namespace: "ml".into(),
            name: "pair".into(),
            memory: 10 * GIB,
            cores: 0,
            pods: vec![],
            idle: None,
            slots: None,
        };
        let alone = [c.clone()];
        assert!(claim_series(&u, "GPU-NVIDIA-H200-0", &c, &alone).is_none());
        assert!(claim_series(&u, "GPU-NVIDIA-H200-1", &c, &alone).is_some());
        // A same-sized claim of the namespace on the GPU without a series of its own: the
        // one series could be either's.
        let twin = ClaimOnGpu {
            name: "pair-twin".into(),
            ..c.clone()
        };
        let twins = [c.clone(), twin.clone()];
        assert!(claim_series(&u, "GPU-NVIDIA-H200-1", &c, &twins).is_none());
        assert!(claim_series(&u, "GPU-NVIDIA-H200-1", &twin, &twins).is_none());
        let other_ns = ClaimOnGpu {
            namespace: "web".into(),
            ..c.clone()
        };
        assert!(claim_series(&u, "GPU-NVIDIA-H200-1", &other_ns, &alone).is_none());
        let other_size = ClaimOnGpu {
            memory: 11 * GIB,
            ..c
        };
        assert!(claim_series(&u, "GPU-NVIDIA-H200-1", &other_size, &alone).is_none());
    }

    pub fn pod(ns: &str, name: &str, entry: &str, claim: &str, containers: &[(&str, bool)]) -> Pod {
        let containers: Vec<_> = containers
            .iter()
            .map(|(c, uses)| {
                if *uses {
                    json!({"name": c, "resources": {"claims": [{"name": entry}]}})
                } else {
                    json!({"name": c})
                }
            })
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {"containers": containers,
                     "resourceClaims": [{"name": entry, "resourceClaimTemplateName": "t"}]},
            "status": {"resourceClaimStatuses": [{"name": entry, "resourceClaimName": claim}]},
        }))
        .unwrap()
    }

    #[test]
    fn pods_show_each_containers_slice_with_the_shims_and_the_drivers_figures() {
        let mut src = sources(Ok(usage()));
        src.pods = vec![
            pod(
                "ml",
                "train-0",
                "gpu",
                "train",
                &[("main", true), ("log", false)],
            ),
            pod("ml", "pair-0", "gpu", "pair", &[("a", true), ("b", true)]),
            pod("web", "infer-0", "gpu", "infer", &[("main", true)]),
        ];
        let ml = BTreeSet::from(["ml".to_string()]);
        let m = build(&src, Some(&ml));
        let rows: Vec<(&str, &str, &str)> = m
            .pods
            .iter()
            .map(|p| (p.pod.as_str(), p.container.as_str(), p.device.as_str()))
            .collect();
        assert_eq!(
            rows,
            [
                ("pair-0", "a", "gpu-0"),
                ("pair-0", "a", "gpu-1"),
                ("pair-0", "b", "gpu-0"),
                ("pair-0", "b", "gpu-1"),
                ("train-0", "main", "gpu-0"),
            ],
            "namespace ml only; the annotation slice is in ops"
        );
        let train = &m.pods[4];
        assert_eq!(train.claim.as_deref(), Some("train"));
        assert_eq!(train.memory_limit, 20 * GIB);
        assert_eq!(train.memory_used, Some(8 * GIB));
        assert_eq!(train.memory_used_driver, Some(9 * GIB));
        assert_eq!(train.cores_share, 30);
        assert!((train.cores_used.unwrap() - 28.0).abs() < 1e-9);
        assert_eq!(m.pods[0].shared_with, ["b"]);
        // All namespaces: the L4 pod (not in Prometheus: n/a) and the annotation container.
        let m = build(&src, None);
        let infer = m.pods.iter().find(|p| p.pod == "infer-0").unwrap();
        assert_eq!((infer.memory_limit, infer.memory_used), (24 * GIB, None));
        let probe = m.pods.iter().find(|p| p.pod == "probe").unwrap();
        assert_eq!(probe.claim, None);
        assert_eq!(probe.device, "gpu-1");
        assert_eq!(probe.memory_used, Some(GIB));
    }

    #[test]
    fn a_pods_extended_resource_claim_shows_under_the_containers_it_maps() {
        // The claim the scheduler wrote for a device class's extended resource: the pod names
        // it in its status only, container by container; it shows as any claim's slice.
        let mut src = sources(Ok(usage()));
        src.pods = vec![serde_json::from_value(json!({
            "metadata": {"name": "whole-0", "namespace": "web"},
            "spec": {"containers": [{"name": "main"}, {"name": "log"}]},
            "status": {"extendedResourceClaimStatus": {
                "resourceClaimName": "infer",
                "requestMappings": [
                    {"containerName": "main", "requestName": "container-0-request-0",
                     "resourceName": "deviceclass.resource.kubernetes.io/gpuslice.io"},
                    {"containerName": "main", "requestName": "container-0-request-1",
                     "resourceName": "deviceclass.resource.kubernetes.io/gpuslice.io"},
                ],
            }},
        }))
        .unwrap()];
        let m = build(&src, None);
        let rows: Vec<(&str, &str, Option<&str>, u64)> = m
            .pods
            .iter()
            .filter(|p| p.pod == "whole-0")
            .map(|p| {
                (
                    p.pod.as_str(),
                    p.container.as_str(),
                    p.claim.as_deref(),
                    p.memory_limit,
                )
            })
            .collect();
        assert_eq!(rows, [("whole-0", "main", Some("infer"), 24 * GIB)]);
    }

    /// node-s: one L4 of 24Gi published as 6 slots of 4Gi (slot 5 withdrawn by a node path),
    /// a claim of 2 slots with a 30 % share and one of 1 slot, unthrottled.
    fn slot_sources() -> Sources {
        use gpuslice_dra::slices::SlotOffer;
        let mut g = gpu(0, "NVIDIA L4", 24);
        g.slots = Some(SlotOffer {
            memory: 4 * GIB,
            cores: 16,
            published: (0..5).collect(),
        });
        let slices = build_slices("node-s", &[g], 1, None).unwrap();
        let slot_claim = |name: &str, slots: &[u32], cores: Option<u32>| -> ResourceClaim {
            let results: Vec<_> = slots
                .iter()
                .map(|j| {
                    json!({"request": "gpu", "driver": "gpuslice.io", "pool": "node-s",
                                "device": format!("gpu-0-slot-{j}")})
                })
                .collect();
            let mut devices = json!({"results": results});
            if let Some(c) = cores {
                devices["config"] = json!([{"source": "FromClaim", "opaque": {"driver": "gpuslice.io",
                    "parameters": {"apiVersion": "gpuslice.io/v1", "kind": "SliceParameters", "cores": c}}}]);
            }
            serde_json::from_value(json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": "ml"}, "spec": {},
                "status": {"allocation": {"devices": devices},
                           "reservedFor": [{"resource": "pods", "name": format!("{name}-0"), "uid": "u"}]},
            }))
            .unwrap()
        };
        Sources {
            slices,
            claims: vec![
                slot_claim("two", &[0, 1], Some(30)),
                slot_claim("one", &[2], None),
            ],
            pods: vec![],
            usage: Err("no prometheus".into()),
        }
    }

    #[test]
    fn only_the_devices_the_scheduler_allocates_from_count_each_once() {
        // Mid-republish: the pool shrank from two slices (generation 1) to one (generation 2);
        // the old second slice, not yet deleted, lists slot 4 again.
        let mut src = slot_sources();
        src.slices[0].spec.pool.generation = 2;
        let mut stale = src.slices[0].clone();
        stale.metadata.name = Some(gpuslice_dra::slices::slice_name("node-s", 1));
        stale.spec.pool.generation = 1;
        stale.spec.pool.resource_slice_count = 2;
        stale
            .spec
            .devices
            .as_mut()
            .unwrap()
            .retain(|d| d.name == "gpu-0-slot-4");
        src.slices.push(stale);
        let m = build(&src, None);
        assert!(m.warnings.is_empty(), "{:?}", m.warnings);
        let g = &m.gpus[0];
        assert_eq!(
            (g.memory.capacity, g.memory.free, g.cores.capacity),
            (20 * GIB, 8 * GIB, 80),
            "5 slots of 4Gi, not 6"
        );
        assert_eq!(g.slots.map(|s| s.published), Some(5));
        assert_eq!(m.total.memory.capacity, 20 * GIB);
        // The newest generation incomplete (1 of its 2 slices written): the scheduler takes
        // none of the pool's devices, and neither does the model; one warning says why.
        src.slices[0].spec.pool.generation = 3;
        src.slices[0].spec.pool.resource_slice_count = 2;
        let m = build(&src, None);
        assert!(m.gpus.is_empty(), "{:?}", m.gpus);
        assert_eq!(m.total.memory.capacity, 0);
        assert_eq!(
            m.warnings,
            ["pool node-s is incomplete: 1 of 2 slice(s) of generation 3 (the plugin is replacing them): its GPUs are left out until it is complete, as the scheduler leaves them out"]
        );
    }

    #[test]
    fn slot_devices_are_gathered_into_their_gpu_with_the_slots_claims_hold() {
        let m = build(&slot_sources(), None);
        assert!(m.warnings.is_empty(), "{:?}", m.warnings);
        assert_eq!(m.gpus.len(), 1, "one GPU, not five devices: {:?}", m.gpus);
        let g = &m.gpus[0];
        assert_eq!((g.device.as_str(), g.index), ("gpu-0", Some(0)));
        assert_eq!(g.model, "NVIDIA L4");
        assert_eq!(
            g.memory,
            Figure {
                capacity: 20 * GIB,
                allocated: 12 * GIB,
                free: 8 * GIB,
                used: None
            }
        );
        assert_eq!((g.cores.capacity, g.cores.allocated), (80, 30));
        assert_eq!(
            g.slots,
            Some(SlotsView {
                size: 4 * GIB,
                published: 5,
                allocated: 3
            })
        );
        let by_name: Vec<(&str, u64, u64, Option<u64>)> = g
            .claims
            .iter()
            .map(|c| (c.name.as_str(), c.memory, c.cores, c.slots))
            .collect();
        assert_eq!(
            by_name,
            [("one", 4 * GIB, 0, Some(1)), ("two", 8 * GIB, 30, Some(2))]
        );
        assert_eq!(m.nodes[0].mode, "slots (5 per GPU × 4Gi)");
        assert_eq!(m.total.mode, "slots (5 per GPU × 4Gi)");
        assert_eq!((m.total.gpus, m.total.slices), (1, 2));
        let cap = build(
            &Sources {
                slices: slices(),
                claims: claims(),
                pods: vec![],
                usage: Err(String::new()),
            },
            None,
        );
        assert!(cap.nodes.iter().all(|n| n.mode == "capacity"));
    }
}
