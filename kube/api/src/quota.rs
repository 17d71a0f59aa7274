//! Budgets: the ResourceQuota names gpuslice enforces (its own `limits.gpuslice.io/*` and, in
//! HAMi-compat namespaces, HAMi's `limits.nvidia.com/*`), a quota's hard and used figures read
//! from them, which objects a quota's scopes let it count, and what one pod or claim charges
//! against them — defined once, for the webhook that enforces budgets and the tools that show
//! them (docs/quotas.md).

use gpuslice_config::quantity::ACCEPTED_KUBE;
use gpuslice_config::{format_kube_quantity, parse_kube_quantity};
use k8s_openapi::api::core::v1::{Pod, PodAffinityTerm, ResourceQuota, ResourceRequirements};
use k8s_openapi::api::resource::v1::{DeviceSelector, ExactDeviceRequest, ResourceClaimSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::claim_shape::{selected_size, Mode, PublishedGpus, Shape, UUID_ATTRIBUTE};
use crate::opaque::{gpu_share, share_configs, ShareConfig};
use crate::slices::{CAP_CORES, CAP_MEMORY, MEMORY_STEP};
use crate::{DRIVER, SLOTS_CLASS};

/// gpuslice's quota names: GPU memory in bytes (a quantity), compute share in percent of a
/// GPU, GPUs.
pub const MEMORY: &str = "limits.gpuslice.io/memory";
pub const CORES: &str = "limits.gpuslice.io/cores";
pub const GPUS: &str = "limits.gpuslice.io/gpus";
/// HAMi's quota names (counted in `gpuslice.io/hami-compat=true` namespaces): GPU memory in
/// MiB, compute share in percent of a GPU, GPUs.
pub const HAMI_MEMORY: &str = "limits.nvidia.com/gpumem";
pub const HAMI_CORES: &str = "limits.nvidia.com/gpucores";
pub const HAMI_GPUS: &str = "limits.nvidia.com/gpu";
/// The namespace label under which HAMi's names are read (pods' limits and quotas alike).
pub const HAMI_COMPAT_LABEL: (&str, &str) = ("gpuslice.io/hami-compat", "true");

/// What a quota name counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    Memory,
    Cores,
    Gpus,
}

/// How a quota name's values are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Bytes, as a Kubernetes quantity (`10Gi`).
    Bytes,
    /// Mebibytes, a whole number (HAMi's `limits.nvidia.com/gpumem`).
    Mebibytes,
    /// A whole number (percent of a GPU, GPUs).
    Count,
}

/// One quota name gpuslice enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Name {
    pub name: &'static str,
    pub resource: Resource,
    pub unit: Unit,
    /// One of HAMi's names: counted only in HAMi-compat namespaces.
    pub hami: bool,
}

/// Every quota name gpuslice enforces.
pub const NAMES: [Name; 6] = [
    Name {
        name: MEMORY,
        resource: Resource::Memory,
        unit: Unit::Bytes,
        hami: false,
    },
    Name {
        name: CORES,
        resource: Resource::Cores,
        unit: Unit::Count,
        hami: false,
    },
    Name {
        name: GPUS,
        resource: Resource::Gpus,
        unit: Unit::Count,
        hami: false,
    },
    Name {
        name: HAMI_MEMORY,
        resource: Resource::Memory,
        unit: Unit::Mebibytes,
        hami: true,
    },
    Name {
        name: HAMI_CORES,
        resource: Resource::Cores,
        unit: Unit::Count,
        hami: true,
    },
    Name {
        name: HAMI_GPUS,
        resource: Resource::Gpus,
        unit: Unit::Count,
        hami: true,
    },
];

/// The names counted in a namespace; `hami`: it is a HAMi-compat namespace.
pub fn names(hami: bool) -> impl Iterator<Item = &'static Name> {
    NAMES.iter().filter(move |n| hami || !n.hami)
}

/// Why a quota cannot be read, or a charge not booked: one line naming the quota or object,
/// the field, the value and what is accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuotaError {
    #[error("ResourceQuota {quota}: {field}: value {value:?} is not accepted ({detail}); accepted: {accepted}")]
    Value {
        quota: String,
        field: String,
        value: String,
        detail: String,
        accepted: &'static str,
    },
    #[error("exceeded quota: {quota}, requested: {name}={asked}, used: {name}={used}, limited: {name}={hard}")]
    Exceeded {
        quota: String,
        name: &'static str,
        hard: String,
        used: String,
        asked: String,
    },
    #[error("status unknown for quota: {quota}, resources: {names}, requested: {asked}: its usage is being counted from the namespace's pods and claims; accepted: the same request again in a few seconds")]
    Uncounted {
        quota: String,
        names: String,
        /// What the request asks of each of the quota's names, `name=value` in its unit.
        asked: String,
    },
    #[error("{field}: {detail} overflows what a budget can count (64-bit {unit}); accepted: a smaller ask")]
    Overflow {
        field: String,
        detail: String,
        unit: &'static str,
    },
    #[error("{field}: {detail}; accepted: {accepted}")]
    Unchargeable {
        field: String,
        detail: String,
        accepted: &'static str,
    },
}

/// What the quota names count, in bytes, percent of a GPU and GPUs; `None`: the quota names
/// none of that resource (hard) or counts none (used).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QuotaFigures {
    pub memory_bytes: Option<u64>,
    pub cores: Option<u64>,
    pub gpus: Option<u64>,
}

/// What one pod or claim charges: GPU memory (per GPU times GPUs), compute share (percent of
/// a GPU per GPU times GPUs) and GPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Charge {
    pub memory_bytes: u64,
    pub cores: u64,
    pub gpus: u64,
}

impl Charge {
    pub fn is_zero(&self) -> bool {
        *self == Charge::default()
    }

    /// The sum, or which resource overflows; `field` names the object for the message.
    pub fn checked_add(&self, other: &Charge, field: &str) -> Result<Charge, QuotaError> {
        let over = |what: &str, unit| QuotaError::Overflow {
            field: field.to_string(),
            detail: format!("the sum of its {what}"),
            unit,
        };
        Ok(Charge {
            memory_bytes: self
                .memory_bytes
                .checked_add(other.memory_bytes)
                .ok_or_else(|| over("GPU memory", "bytes"))?,
            cores: self
                .cores
                .checked_add(other.cores)
                .ok_or_else(|| over("compute shares", "percent"))?,
            gpus: self
                .gpus
                .checked_add(other.gpus)
                .ok_or_else(|| over("GPUs", "GPUs"))?,
        })
    }

    /// The charge in `name`'s unit: memory in MiB rounded up for HAMi's name (a charge of
    /// 1 byte counts 1 MiB, so that the MiB budget never admits more than it says).
    pub fn in_unit(&self, name: &Name) -> u64 {
        match (name.resource, name.unit) {
            (Resource::Memory, Unit::Mebibytes) => self.memory_bytes.div_ceil(1 << 20),
            (Resource::Memory, _) => self.memory_bytes,
            (Resource::Cores, _) => self.cores,
            (Resource::Gpus, _) => self.gpus,
        }
    }
}

/// A value of `name` as a quota holds it (`10Gi`, `10240`).
pub fn format_value(name: &Name, value: u64) -> String {
    match name.unit {
        Unit::Bytes => format_kube_quantity(value),
        Unit::Mebibytes | Unit::Count => value.to_string(),
    }
}

/// Reads a value of `name` (`field` and `quota` for the message): a whole, non-negative
/// number in any spelling Kubernetes writes.
fn read_value(quota: &str, field: String, name: &Name, q: &Quantity) -> Result<u64, QuotaError> {
    parse_kube_quantity(&q.0).map_err(|e| QuotaError::Value {
        quota: quota.to_string(),
        field,
        value: q.0.clone(),
        detail: e.detail.to_string(),
        accepted: match name.unit {
            Unit::Bytes => ACCEPTED_KUBE,
            Unit::Mebibytes => "a whole number of MiB, at least 0 (`10240`)",
            Unit::Count => "a whole number, at least 0 (`200`)",
        },
    })
}

/// One name of a quota gpuslice enforces: its hard value and what is used, in its unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Line {
    pub name: &'static Name,
    pub hard: u64,
    /// What `status.used` holds; 0 while it holds nothing (`counted` false).
    pub used: u64,
    /// Whether `status.used` holds the name: a new quota, or a name newly added to `hard`, is
    /// not counted until the recount has written what the namespace's objects already hold,
    /// and books nothing until then (as Kubernetes' own quota admission refuses with "status
    /// unknown").
    pub counted: bool,
}

/// One scope of a quota, as Kubernetes matches objects against it: each of `spec.scopes` (as
/// operator `Exists`) and each of `spec.scopeSelector.matchExpressions`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    /// `Terminating`, `NotTerminating`, `BestEffort`, `NotBestEffort`, `PriorityClass`,
    /// `CrossNamespacePodAffinity`, or one that names no pod (`VolumeAttributesClass`).
    pub name: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist` (read for `PriorityClass` only).
    pub operator: String,
    pub values: Vec<String>,
}

/// What a charge is for, as a quota's scopes tell objects apart.
#[derive(Debug, Clone, Copy)]
pub enum Charged<'a> {
    /// A pod, charged for the claims its template entries make (and those of its limits).
    Pod(&'a Pod),
    /// A ResourceClaim charged on its own (written by hand, used by name): Kubernetes matches
    /// a claim against no scope, so only a quota without scopes counts it.
    Claim,
}

/// A ResourceQuota's lines gpuslice enforces, and the scopes that say what it counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    /// `namespace/name`, for messages.
    pub quota: String,
    pub lines: Vec<Line>,
    /// Every scope must hold for an object for the quota to count it; none: it counts every
    /// object.
    pub scopes: Vec<Scope>,
}

/// The scopes of `q` ([`Scope`]).
fn scopes_of(q: &ResourceQuota) -> Vec<Scope> {
    let Some(spec) = q.spec.as_ref() else {
        return Vec::new();
    };
    let listed = spec.scopes.iter().flatten().map(|name| Scope {
        name: name.clone(),
        operator: "Exists".into(),
        values: Vec::new(),
    });
    let selected = spec
        .scope_selector
        .as_ref()
        .and_then(|s| s.match_expressions.as_ref())
        .into_iter()
        .flatten()
        .map(|e| Scope {
            name: e.scope_name.clone(),
            operator: e.operator.clone(),
            values: e.values.clone().unwrap_or_default(),
        });
    listed.chain(selected).collect()
}

impl Scope {
    /// Whether pod `p` is in this scope, as Kubernetes' pod evaluator decides
    /// (`podMatchesScopeFunc`, pkg/quota/v1/evaluator/core/pods.go of the pinned release): a
    /// scope it does not know names no pod.
    pub fn holds_for_pod(&self, p: &Pod) -> bool {
        match self.name.as_str() {
            "Terminating" => terminating(p),
            "NotTerminating" => !terminating(p),
            "BestEffort" => best_effort(p),
            "NotBestEffort" => !best_effort(p),
            "PriorityClass" => {
                // An empty class is none, as for a label selector over {PriorityClass: class}.
                let class = p
                    .spec
                    .as_ref()
                    .and_then(|s| s.priority_class_name.as_deref())
                    .filter(|c| !c.is_empty());
                let listed = |c: &str| self.values.iter().any(|v| v == c);
                match self.operator.as_str() {
                    "In" => class.is_some_and(listed),
                    "NotIn" => class.is_none_or(|c| !listed(c)),
                    "Exists" => class.is_some(),
                    "DoesNotExist" => class.is_none(),
                    // The API server stores no other operator; were one there, the pod is
                    // counted rather than let past the quota.
                    _ => true,
                }
            }
            "CrossNamespacePodAffinity" => cross_namespace_affinity(p),
            _ => false,
        }
    }
}

/// A pod with an active deadline (`activeDeadlineSeconds` ≥ 0): scope `Terminating`.
fn terminating(p: &Pod) -> bool {
    p.spec
        .as_ref()
        .and_then(|s| s.active_deadline_seconds)
        .is_some_and(|s| s >= 0)
}

/// A pod of QoS class BestEffort: the class its status names, else as the API server computes
/// it — where pod-level resources name one the kubelet manages at the pod level (`cpu`,
/// `memory`, `hugepages-*`), those decide; else every container, init containers included,
/// asks no `cpu` and no `memory`, neither request nor limit (other resources do not count).
fn best_effort(p: &Pod) -> bool {
    if let Some(class) = p
        .status
        .as_ref()
        .and_then(|s| s.qos_class.as_deref())
        .filter(|c| !c.is_empty())
    {
        return class == "BestEffort";
    }
    let Some(spec) = p.spec.as_ref() else {
        return true;
    };
    let pod_level = spec.resources.as_ref().filter(|r| {
        [&r.requests, &r.limits].into_iter().flatten().any(|m| {
            m.keys()
                .any(|k| k == "cpu" || k == "memory" || k.starts_with("hugepages-"))
        })
    });
    match pod_level {
        Some(r) => asks_no_cpu_or_memory(r),
        None => spec
            .init_containers
            .iter()
            .flatten()
            .chain(&spec.containers)
            .all(|c| c.resources.as_ref().is_none_or(asks_no_cpu_or_memory)),
    }
}

/// Neither a request nor a limit of `cpu` or `memory` other than zero.
fn asks_no_cpu_or_memory(r: &ResourceRequirements) -> bool {
    [&r.requests, &r.limits].into_iter().flatten().all(|m| {
        ["cpu", "memory"]
            .iter()
            .all(|k| m.get(*k).is_none_or(|q| zero_quantity(&q.0)))
    })
}

/// Whether a quantity is zero (`0`, `0m`, `0.0Gi`): its digits are all 0. One that cannot be
/// read counts as not zero.
fn zero_quantity(q: &str) -> bool {
    let q = q.trim().trim_start_matches(['+', '-']);
    let number: &str = &q[..q
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(q.len())];
    number.contains('0') && number.chars().all(|c| c == '0' || c == '.')
}

/// A pod with a pod affinity or anti-affinity term, required or preferred, naming other
/// namespaces (`namespaces` or a `namespaceSelector`): scope `CrossNamespacePodAffinity`.
fn cross_namespace_affinity(p: &Pod) -> bool {
    let Some(a) = p.spec.as_ref().and_then(|s| s.affinity.as_ref()) else {
        return false;
    };
    let crosses = |t: &PodAffinityTerm| {
        t.namespaces.as_ref().is_some_and(|n| !n.is_empty()) || t.namespace_selector.is_some()
    };
    let affinity = a.pod_affinity.as_ref().map(|x| {
        (
            &x.required_during_scheduling_ignored_during_execution,
            &x.preferred_during_scheduling_ignored_during_execution,
        )
    });
    let anti = a.pod_anti_affinity.as_ref().map(|x| {
        (
            &x.required_during_scheduling_ignored_during_execution,
            &x.preferred_during_scheduling_ignored_during_execution,
        )
    });
    affinity
        .into_iter()
        .chain(anti)
        .any(|(required, preferred)| {
            required.iter().flatten().any(crosses)
                || preferred
                    .iter()
                    .flatten()
                    .any(|w| crosses(&w.pod_affinity_term))
        })
}

impl Budget {
    /// The lines of `q` gpuslice enforces (`hami`: its namespace is HAMi-compat); `None` when
    /// it names none. A malformed or negative value, hard or used, is an error naming it.
    pub fn read(q: &ResourceQuota, hami: bool) -> Result<Option<Budget>, QuotaError> {
        let quota = format!(
            "{}/{}",
            q.metadata.namespace.as_deref().unwrap_or_default(),
            q.metadata.name.as_deref().unwrap_or_default()
        );
        let hard = q.spec.as_ref().and_then(|s| s.hard.as_ref());
        let used = q.status.as_ref().and_then(|s| s.used.as_ref());
        let mut lines = Vec::new();
        for name in names(hami) {
            let Some(h) = hard.and_then(|h| h.get(name.name)) else {
                continue;
            };
            let hard = read_value(&quota, format!("spec.hard[{}]", name.name), name, h)?;
            let (used, counted) = match used.and_then(|u| u.get(name.name)) {
                Some(u) => (
                    read_value(&quota, format!("status.used[{}]", name.name), name, u)?,
                    true,
                ),
                None => (0, false),
            };
            lines.push(Line {
                name,
                hard,
                used,
                counted,
            });
        }
        Ok((!lines.is_empty()).then(|| Budget {
            quota,
            lines,
            scopes: scopes_of(q),
        }))
    }

    /// Whether `status.used` holds every line ([`Line::counted`]).
    pub fn counted(&self) -> bool {
        self.lines.iter().all(|l| l.counted)
    }

    /// Whether the quota counts what `c` charges: every scope holds for it, as Kubernetes
    /// matches a quota against a pod; an object that is not a pod is in no scope, so only a
    /// quota without scopes counts it (as for every evaluator but the pods'). The one
    /// matching the admissions book by and the recount counts by.
    pub fn applies_to(&self, c: Charged) -> bool {
        self.scopes.iter().all(|s| match c {
            Charged::Pod(p) => s.holds_for_pod(p),
            Charged::Claim => false,
        })
    }

    /// Hard figures in bytes, percent and GPUs (the tighter where both name sets name one).
    pub fn hard(&self) -> QuotaFigures {
        self.figures(|l| l.hard, u64::min)
    }

    /// Used figures in bytes, percent and GPUs (the larger where both name sets count one).
    pub fn used(&self) -> QuotaFigures {
        self.figures(|l| l.used, u64::max)
    }

    fn figures(&self, value: impl Fn(&Line) -> u64, pick: fn(u64, u64) -> u64) -> QuotaFigures {
        let mut f = QuotaFigures::default();
        for l in &self.lines {
            let v = match l.name.unit {
                Unit::Mebibytes => value(l).saturating_mul(1 << 20),
                _ => value(l),
            };
            let slot = match l.name.resource {
                Resource::Memory => &mut f.memory_bytes,
                Resource::Cores => &mut f.cores,
                Resource::Gpus => &mut f.gpus,
            };
            *slot = Some(slot.map_or(v, |old| pick(old, v)));
        }
        f
    }

    /// The used values after booking `asked`: one per line, in its unit; refused when a line
    /// would pass its hard value, naming the quota, the name, hard, used and asked.
    /// A charge against a quota not yet counted ([`Line::counted`]) is refused naming the
    /// names not counted: booked on a used of 0, it would admit past what already runs.
    pub fn book(&self, asked: &Charge) -> Result<Vec<(&'static Name, u64)>, QuotaError> {
        let uncounted: Vec<&str> = self
            .lines
            .iter()
            .filter(|l| !l.counted)
            .map(|l| l.name.name)
            .collect();
        if !asked.is_zero() && !uncounted.is_empty() {
            let amounts: Vec<String> = self
                .lines
                .iter()
                .map(|l| {
                    format!(
                        "{}={}",
                        l.name.name,
                        format_value(l.name, asked.in_unit(l.name))
                    )
                })
                .collect();
            return Err(QuotaError::Uncounted {
                quota: self.quota.clone(),
                names: uncounted.join(","),
                asked: amounts.join(","),
            });
        }
        let mut out = Vec::new();
        for l in &self.lines {
            let a = asked.in_unit(l.name);
            match l.used.checked_add(a) {
                Some(total) if a == 0 || total <= l.hard => out.push((l.name, total)),
                _ => {
                    return Err(QuotaError::Exceeded {
                        quota: self.quota.clone(),
                        name: l.name.name,
                        hard: format_value(l.name, l.hard),
                        used: format_value(l.name, l.used),
                        asked: format_value(l.name, a),
                    })
                }
            }
        }
        Ok(out)
    }
}

/// What a slice of `shape` charges: memory per GPU (the whole GPU's, `whole_gpu`, when it asks
/// no amount) times GPUs, compute share per GPU (100 when not throttled: none asked, or 0,
/// which the plugin books as not throttled) times GPUs, GPUs.
/// `field` names where it was asked, for messages.
pub fn shape_charge(
    shape: &Shape,
    whole_gpu: Option<u64>,
    field: &str,
) -> Result<Charge, QuotaError> {
    let gpus = u64::from(shape.gpus);
    let per_gpu =
        match shape.memory.or(whole_gpu) {
            Some(m) => m,
            None => return Err(QuotaError::Unchargeable {
                field: field.to_string(),
                detail: "asks whole GPUs, but no GPU is published yet to size them".into(),
                accepted:
                    "an amount of memory per GPU, or a cluster whose ResourceSlices publish GPUs",
            }),
        };
    let memory_bytes = per_gpu
        .checked_mul(gpus)
        .ok_or_else(|| QuotaError::Overflow {
            field: field.to_string(),
            detail: format!(
                "{} per GPU times {gpus} GPUs",
                format_kube_quantity(per_gpu)
            ),
            unit: "bytes",
        })?;
    let cores = u64::from(shape.cores.filter(|c| *c > 0).unwrap_or(100)).saturating_mul(gpus);
    Ok(Charge {
        memory_bytes,
        cores,
        gpus,
    })
}

/// The largest GPU the cluster publishes: what a whole-GPU ask charges (the most it can hold).
pub fn whole_gpu(inventory: &PublishedGpus) -> Option<u64> {
    inventory.gpu_memory.iter().max().copied()
}

/// What one exact request of gpuslice's capacity class charges.
fn exact_charge(
    e: &ExactDeviceRequest,
    whole: Option<u64>,
    field: &str,
) -> Result<Charge, QuotaError> {
    if e.allocation_mode.as_deref() == Some("All") {
        return Err(QuotaError::Unchargeable {
            field: field.to_string(),
            detail: "allocationMode All takes every matching GPU, an amount no budget can count before it is allocated".into(),
            accepted: "allocationMode ExactCount (a count of GPUs)",
        });
    }
    let count = u32::try_from(e.count.unwrap_or(1)).map_err(|_| QuotaError::Unchargeable {
        field: format!("{field}.count"),
        detail: format!("{} GPUs", e.count.unwrap_or(1)),
        accepted: "a count from 1 to 4294967295",
    })?;
    let cap = e.capacity.as_ref().and_then(|c| c.requests.as_ref());
    let read = |key: &str| -> Result<Option<u64>, QuotaError> {
        match cap.and_then(|c| c.get(key)) {
            None => Ok(None),
            Some(q) => parse_kube_quantity(&q.0)
                .map(Some)
                .map_err(|e| QuotaError::Unchargeable {
                    field: format!("{field}.capacity.requests[{key}]"),
                    detail: format!("value {:?} is {}", q.0, e.detail),
                    accepted: ACCEPTED_KUBE,
                }),
        }
    };
    // What the device's request policy makes the scheduler consume: at least the step, in
    // whole steps.
    let memory =
        read(CAP_MEMORY)?.map(|m| m.div_ceil(MEMORY_STEP).max(1).saturating_mul(MEMORY_STEP));
    let cores = read(CAP_CORES)?.map(|c| u32::try_from(c).unwrap_or(u32::MAX));
    let shape = Shape {
        gpus: count,
        memory,
        cores,
        selectors: Vec::new(),
    };
    shape_charge(&shape, whole, field)
}

/// The larger of two charges, resource by resource (an ask that may be met either way).
fn larger(a: Charge, b: Charge) -> Charge {
    Charge {
        memory_bytes: a.memory_bytes.max(b.memory_bytes),
        cores: a.cores.max(b.cores),
        gpus: a.gpus.max(b.gpus),
    }
}

/// What one request (or subrequest) of slots holds: its count of slots times the memory of
/// each — the slot size its selector names, else the largest the cluster publishes (else the
/// largest GPU, which no slot exceeds). `field` names it, for messages.
fn slot_hold(
    allocation_mode: Option<&str>,
    count: Option<i64>,
    selectors: Option<&Vec<DeviceSelector>>,
    largest: Option<u64>,
    field: &str,
) -> Result<SlotHold, QuotaError> {
    if allocation_mode == Some("All") {
        return Err(QuotaError::Unchargeable {
            field: field.to_string(),
            detail: "allocationMode All takes every matching slot, an amount no budget can count before it is allocated".into(),
            accepted: "allocationMode ExactCount (a count of slots)",
        });
    }
    let slots = u64::try_from(count.unwrap_or(1)).map_err(|_| QuotaError::Unchargeable {
        field: format!("{field}.count"),
        detail: format!("{} slots", count.unwrap_or(1)),
        accepted: "a count of at least 0",
    })?;
    let named = selectors
        .into_iter()
        .flatten()
        .filter_map(|s| s.cel.as_ref())
        .find_map(|c| selected_size(&c.expression));
    let Some(size) = named.or(largest) else {
        return Err(QuotaError::Unchargeable {
            field: field.to_string(),
            detail: format!(
                "asks slots of {SLOTS_CLASS}, but no slot or GPU is published yet to size them"
            ),
            accepted:
                "a slot selector naming its size, or a cluster whose ResourceSlices publish slots",
        });
    };
    let memory = slots
        .checked_mul(size)
        .ok_or_else(|| QuotaError::Overflow {
            field: field.to_string(),
            detail: format!("{slots} slots of {}", format_kube_quantity(size)),
            unit: "bytes",
        })?;
    Ok(SlotHold { slots, memory })
}

/// What one request of slots holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct SlotHold {
    slots: u64,
    memory: u64,
}

/// One request of slots of a claim: its name, the names its results may carry (`<request>`, or
/// `<request>/<subrequest>` for each alternative of a prioritized list) and what it holds.
type SlotRequest = (String, Vec<String>, SlotHold);

/// What a claim's requests of slots charge, request by request: the sum of their memory;
/// GPUs one per group of requests a `matchAttribute` constraint on the GPU's UUID keeps on one
/// GPU, and one per slot of a request no such constraint binds (its slots may lie on as many
/// GPUs); compute share on each GPU as the kubelet plugin books it
/// ([`crate::opaque::gpu_share`] of the requests there; 100 when none applies, not throttled),
/// the most of the alternatives a prioritized list may take. A configuration whose parameters
/// the plugin refuses is not counted: the plugin prepares no such claim.
fn slots_charge(
    spec: &ResourceClaimSpec,
    holds: &[SlotRequest],
    field: &str,
) -> Result<Charge, QuotaError> {
    let mut memory_bytes = 0u64;
    for (name, _, h) in holds {
        memory_bytes = memory_bytes
            .checked_add(h.memory)
            .ok_or_else(|| QuotaError::Overflow {
                field: field.to_string(),
                detail: format!("the sum of its slots' memory (at request {name})"),
                unit: "bytes",
            })?;
    }
    // Union of the requests each GPU constraint binds (a constraint naming none binds all; one
    // naming a subrequest `parent/sub` binds its parent).
    let mut group: Vec<Option<usize>> = vec![None; holds.len()];
    let devices = spec.devices.as_ref();
    for c in devices
        .and_then(|d| d.constraints.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| c.match_attribute.as_deref() == Some(UUID_ATTRIBUTE))
    {
        let binds = |name: &str| {
            c.requests
                .as_ref()
                .is_none_or(|names| names.iter().any(|n| n.split('/').next() == Some(name)))
        };
        let members: Vec<usize> = (0..holds.len()).filter(|&i| binds(&holds[i].0)).collect();
        let Some(&first) = members.first() else {
            continue;
        };
        let into = group[first].unwrap_or(first);
        for &m in &members {
            match group[m] {
                Some(old) if old != into => {
                    for g in group.iter_mut().filter(|g| **g == Some(old)) {
                        *g = Some(into);
                    }
                }
                _ => group[m] = Some(into),
            }
        }
    }
    let configs: Vec<ShareConfig> = share_configs(
        devices
            .and_then(|d| d.config.as_ref())
            .into_iter()
            .flatten()
            .map(|c| (c.requests.as_deref(), c.opaque.as_ref())),
    )
    .into_iter()
    .filter_map(Result::ok)
    .collect();
    // The most the plugin books on a GPU holding the requests `on_gpu` (each the names its
    // results may carry), whichever alternative each takes: 100 (not throttled) when some
    // choice leaves no configuration applying there, else the largest that applies to any.
    let most_share = |on_gpu: &[&Vec<String>]| -> u64 {
        let unthrottled = on_gpu.iter().all(|names| {
            names
                .iter()
                .any(|n| gpu_share(&configs, [n.as_str()]).is_none())
        });
        let all = on_gpu
            .iter()
            .flat_map(|names| names.iter().map(String::as_str));
        match gpu_share(&configs, all) {
            Some(c) if !unthrottled => u64::from(c),
            _ => 100,
        }
    };
    let mut gpus = 0u64;
    let mut cores = 0u64;
    let mut counted = std::collections::BTreeSet::new();
    for (i, (_, results, h)) in holds.iter().enumerate() {
        match group[i] {
            Some(g) => {
                if counted.insert(g) {
                    gpus = gpus.saturating_add(1);
                    let on_gpu: Vec<&Vec<String>> = holds
                        .iter()
                        .enumerate()
                        .filter(|(k, _)| group[*k] == Some(g))
                        .map(|(_, (_, r, _))| r)
                        .collect();
                    cores = cores.saturating_add(most_share(&on_gpu));
                }
            }
            None => {
                gpus = gpus.saturating_add(h.slots);
                cores = cores.saturating_add(most_share(&[results]).saturating_mul(h.slots));
            }
        }
    }
    Ok(Charge {
        memory_bytes,
        cores,
        gpus,
    })
}

/// What a claim of `spec` charges on a cluster publishing `inventory` (`field` names it, for
/// messages): the sum of its requests of gpuslice's device classes (other classes charge
/// nothing). In capacity mode a request charges its count times its memory (the whole GPU
/// when it asks none) and compute share (100 when none); a prioritized list charges its
/// largest alternative. Requests of slots charge request by request (see [`slots_charge`]):
/// each its count of slots times the slot size it selects (the largest published when it
/// names none), a prioritized list its largest alternative, whatever shape the claim has.
pub fn claim_charge(
    spec: &ResourceClaimSpec,
    inventory: &PublishedGpus,
    field: &str,
) -> Result<Charge, QuotaError> {
    let whole = whole_gpu(inventory);
    let Some(requests) = spec.devices.as_ref().and_then(|d| d.requests.as_ref()) else {
        return Ok(Charge::default());
    };
    let largest_slot = match &inventory.mode {
        Mode::Slots(sizes) => sizes.iter().map(|s| s.memory).max(),
        Mode::Capacity => None,
    }
    .or(whole);
    let mut total = Charge::default();
    let mut holds: Vec<SlotRequest> = Vec::new();
    for (i, r) in requests.iter().enumerate() {
        let f = format!("{field}.devices.requests[{i}]");
        if let Some(e) = &r.exactly {
            if e.device_class_name == DRIVER {
                total =
                    total.checked_add(&exact_charge(e, whole, &format!("{f}.exactly"))?, field)?;
            } else if e.device_class_name == SLOTS_CLASS {
                let h = slot_hold(
                    e.allocation_mode.as_deref(),
                    e.count,
                    e.selectors.as_ref(),
                    largest_slot,
                    &format!("{f}.exactly"),
                )?;
                holds.push((r.name.clone(), vec![r.name.clone()], h));
            }
        }
        let mut best: Option<Charge> = None;
        let mut best_slots: Option<SlotHold> = None;
        let mut alternatives: Vec<String> = Vec::new();
        for (j, s) in r.first_available.iter().flatten().enumerate() {
            if s.device_class_name == SLOTS_CLASS {
                let h = slot_hold(
                    s.allocation_mode.as_deref(),
                    s.count,
                    s.selectors.as_ref(),
                    largest_slot,
                    &format!("{f}.firstAvailable[{j}]"),
                )?;
                best_slots = Some(best_slots.map_or(h, |b| SlotHold {
                    slots: b.slots.max(h.slots),
                    memory: b.memory.max(h.memory),
                }));
                alternatives.push(format!("{}/{}", r.name, s.name));
            } else if s.device_class_name == DRIVER {
                let e = ExactDeviceRequest {
                    device_class_name: s.device_class_name.clone(),
                    allocation_mode: s.allocation_mode.clone(),
                    count: s.count,
                    capacity: s.capacity.clone(),
                    ..ExactDeviceRequest::default()
                };
                let c = exact_charge(&e, whole, &format!("{f}.firstAvailable[{j}]"))?;
                best = Some(best.map_or(c, |b| larger(b, c)));
            }
        }
        if let Some(b) = best {
            total = total.checked_add(&b, field)?;
        }
        if let Some(h) = best_slots {
            holds.push((r.name.clone(), alternatives, h));
        }
    }
    if !holds.is_empty() {
        total = total.checked_add(&slots_charge(spec, &holds, field)?, field)?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claim_shape::{claim_spec, SlotSize};
    use k8s_openapi::api::core::v1::{ResourceQuotaSpec, ResourceQuotaStatus};
    use serde_json::json;
    use std::collections::BTreeMap;

    fn quota(hard: &[(&str, &str)], used: &[(&str, &str)]) -> ResourceQuota {
        let list = |p: &[(&str, &str)]| -> BTreeMap<String, Quantity> {
            p.iter()
                .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                .collect()
        };
        ResourceQuota {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("gpu".into()),
                namespace: Some("team".into()),
                ..Default::default()
            },
            spec: Some(ResourceQuotaSpec {
                hard: Some(list(hard)),
                ..Default::default()
            }),
            status: Some(ResourceQuotaStatus {
                used: Some(list(used)),
                ..Default::default()
            }),
        }
    }

    fn gib(n: u64) -> Charge {
        Charge {
            memory_bytes: n << 30,
            cores: 100,
            gpus: 1,
        }
    }

    #[test]
    fn a_budget_books_up_to_its_hard_value_and_refuses_past_it() {
        let q = quota(&[(MEMORY, "10Gi"), ("pods", "10")], &[(MEMORY, "8Gi")]);
        let b = Budget::read(&q, false).unwrap().unwrap();
        assert_eq!(b.lines.len(), 1);
        assert_eq!(b.book(&gib(2)).unwrap(), vec![(&NAMES[0], 10 << 30)]);
        let e = b.book(&gib(4)).unwrap_err().to_string();
        assert_eq!(
            e,
            "exceeded quota: team/gpu, requested: limits.gpuslice.io/memory=4Gi, used: limits.gpuslice.io/memory=8Gi, limited: limits.gpuslice.io/memory=10Gi"
        );
        // A quota naming none of gpuslice's names is no budget.
        assert_eq!(Budget::read(&quota(&[("pods", "1")], &[]), false), Ok(None));
    }

    #[test]
    fn hami_names_count_in_mib_only_in_hami_namespaces() {
        let q = quota(
            &[(HAMI_MEMORY, "10240"), (HAMI_GPUS, "2")],
            &[(HAMI_MEMORY, "0"), (HAMI_GPUS, "0")],
        );
        assert_eq!(Budget::read(&q, false).unwrap(), None);
        let b = Budget::read(&q, true).unwrap().unwrap();
        assert_eq!(b.hard().memory_bytes, Some(10 << 30));
        assert_eq!(b.hard().gpus, Some(2));
        assert_eq!(b.hard().cores, None);
        // 1 byte more than 1 GiB counts 1025 MiB.
        let odd = Charge {
            memory_bytes: (1 << 30) + 1,
            cores: 0,
            gpus: 1,
        };
        let booked = b.book(&odd).unwrap();
        assert_eq!(booked[0].1, 1025);
        let e = b
            .book(&Charge {
                gpus: 3,
                ..Charge::default()
            })
            .unwrap_err()
            .to_string();
        assert!(e.contains("requested: limits.nvidia.com/gpu=3"), "{e}");
        assert!(e.contains("limited: limits.nvidia.com/gpu=2"), "{e}");
    }

    #[test]
    fn a_quota_whose_used_lacks_a_name_books_nothing_until_counted() {
        // A new quota: nothing in status.used, so nothing known of what already runs.
        let q = quota(&[(MEMORY, "80Gi"), (GPUS, "8")], &[]);
        let b = Budget::read(&q, false).unwrap().unwrap();
        assert!(!b.counted());
        let e = b.book(&gib(10)).unwrap_err().to_string();
        assert_eq!(
            e,
            "status unknown for quota: team/gpu, resources: limits.gpuslice.io/memory,limits.gpuslice.io/gpus, requested: limits.gpuslice.io/memory=10Gi,limits.gpuslice.io/gpus=1: its usage is being counted from the namespace's pods and claims; accepted: the same request again in a few seconds"
        );
        // A name added to hard: that name alone is not counted, and the quota books nothing.
        let q = quota(&[(MEMORY, "80Gi"), (GPUS, "8")], &[(MEMORY, "20Gi")]);
        let b = Budget::read(&q, false).unwrap().unwrap();
        let e = b.book(&gib(1)).unwrap_err().to_string();
        assert!(
            e.starts_with(
                "status unknown for quota: team/gpu, resources: limits.gpuslice.io/gpus, requested: limits.gpuslice.io/memory=1Gi,limits.gpuslice.io/gpus=1:"
            ),
            "{e}"
        );
        // The amounts asked are in each name's unit, as in the exceeded-quota refusal.
        let q = quota(&[(HAMI_MEMORY, "10240"), (HAMI_CORES, "400")], &[]);
        let e = Budget::read(&q, true)
            .unwrap()
            .unwrap()
            .book(&gib(1))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("status unknown for quota: team/gpu, resources: limits.nvidia.com/gpumem,limits.nvidia.com/gpucores, requested: limits.nvidia.com/gpumem=1024,limits.nvidia.com/gpucores=100: its usage"),
            "{e}"
        );
        // Nothing charged: nothing refused. Counted (0 included): booked as usual.
        assert!(b.book(&Charge::default()).is_ok());
        let q = quota(
            &[(MEMORY, "80Gi"), (GPUS, "8")],
            &[(MEMORY, "20Gi"), (GPUS, "0")],
        );
        let b = Budget::read(&q, false).unwrap().unwrap();
        assert!(b.counted());
        assert_eq!(
            b.book(&gib(10)).unwrap(),
            vec![(&NAMES[0], 30 << 30), (&NAMES[2], 1)]
        );
    }

    fn scoped(scopes: serde_json::Value, selector: serde_json::Value) -> Budget {
        let mut q = quota(&[(MEMORY, "40Gi")], &[(MEMORY, "0")]);
        let spec = q.spec.as_mut().unwrap();
        spec.scopes = serde_json::from_value(scopes).unwrap();
        spec.scope_selector = serde_json::from_value(selector).unwrap();
        Budget::read(&q, false).unwrap().unwrap()
    }

    fn pod(spec: serde_json::Value) -> Pod {
        let mut spec = spec;
        spec["containers"] = spec
            .get("containers")
            .cloned()
            .unwrap_or(json!([{"name": "c"}]));
        serde_json::from_value(json!({ "spec": spec })).unwrap()
    }

    #[test]
    fn a_quota_counts_the_pods_all_its_scopes_hold_for_as_kubernetes_does() {
        let class = |op: &str, values: serde_json::Value| {
            scoped(
                json!(null),
                json!({"matchExpressions": [
                    {"scopeName": "PriorityClass", "operator": op, "values": values}]}),
            )
        };
        let high = pod(json!({"priorityClassName": "high"}));
        let low = pod(json!({"priorityClassName": "low"}));
        let none = pod(json!({}));
        let applies = |b: &Budget, p: &Pod| b.applies_to(Charged::Pod(p));
        let cases = [
            (class("In", json!(["high"])), [true, false, false]),
            (class("NotIn", json!(["high"])), [false, true, true]),
            (class("Exists", json!(null)), [true, true, false]),
            (class("DoesNotExist", json!(null)), [false, false, true]),
        ];
        for (b, want) in cases {
            assert_eq!(
                [applies(&b, &high), applies(&b, &low), applies(&b, &none)],
                want,
                "{:?}",
                b.scopes
            );
        }
        // No scope: every pod and every claim; a scope: no claim.
        let plain = scoped(json!(null), json!(null));
        assert!(applies(&plain, &none) && plain.applies_to(Charged::Claim));
        assert!(!class("DoesNotExist", json!(null)).applies_to(Charged::Claim));

        // Terminating: an active deadline of 0 or more.
        let terminating = scoped(json!(["Terminating"]), json!(null));
        let not_terminating = scoped(json!(["NotTerminating"]), json!(null));
        let deadline = pod(json!({"activeDeadlineSeconds": 0}));
        assert!(applies(&terminating, &deadline) && !applies(&terminating, &none));
        assert!(!applies(&not_terminating, &deadline) && applies(&not_terminating, &none));

        // BestEffort: no cpu or memory asked (GPU limits do not count); the status' class
        // when it names one; pod-level resources when they name one.
        let best = scoped(json!(["BestEffort"]), json!(null));
        let not_best = scoped(json!(["NotBestEffort"]), json!(null));
        let gpu_only = pod(json!({"containers": [{"name": "c", "resources": {
            "limits": {"gpuslice.io/memory": "10Gi"}, "requests": {"cpu": "0"}}}]}));
        let cpu = pod(json!({"initContainers": [{"name": "i", "resources": {
            "requests": {"cpu": "100m"}}}]}));
        assert!(applies(&best, &gpu_only) && !applies(&not_best, &gpu_only));
        assert!(!applies(&best, &cpu) && applies(&not_best, &cpu));
        let mut said = gpu_only.clone();
        said.status = serde_json::from_value(json!({"qosClass": "Burstable"})).unwrap();
        assert!(!applies(&best, &said));
        let pod_level = pod(json!({"resources": {"limits": {"memory": "1Gi"}}}));
        assert!(!applies(&best, &pod_level));

        // CrossNamespacePodAffinity: a term naming other namespaces.
        let cross = scoped(json!(["CrossNamespacePodAffinity"]), json!(null));
        let term = |extra: serde_json::Value| {
            let mut t = json!({"topologyKey": "kubernetes.io/hostname"});
            t.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            t
        };
        let same = pod(json!({"affinity": {"podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [term(json!({}))]}}}));
        let other = pod(json!({"affinity": {"podAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1,
                "podAffinityTerm": term(json!({"namespaceSelector": {}}))}]}}}));
        assert!(!applies(&cross, &same) && applies(&cross, &other));

        // Every scope must hold; a scope no pod is in (a claim's, a volume's) holds for none.
        let both = scoped(
            json!(["NotTerminating"]),
            json!({"matchExpressions": [
                {"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]}),
        );
        assert!(applies(&both, &high));
        let mut high_deadline = high.clone();
        high_deadline.spec.as_mut().unwrap().active_deadline_seconds = Some(60);
        assert!(!applies(&both, &high_deadline));
        assert!(!applies(
            &scoped(json!(["VolumeAttributesClass"]), json!(null)),
            &none
        ));
    }

    #[test]
    fn a_quantity_is_zero_in_any_spelling() {
        for zero in ["0", "0m", "0.0Gi", "+0", "0e3", " 0 "] {
            assert!(zero_quantity(zero), "{zero}");
        }
        for not in ["1", "100m", "0.5", "10Gi", "", "Gi", "x"] {
            assert!(!zero_quantity(not), "{not}");
        }
    }

    #[test]
    fn malformed_or_negative_values_are_one_line_naming_the_field() {
        for (hard, used, want) in [
            (
                vec![(MEMORY, "-1Gi")],
                vec![],
                "spec.hard[limits.gpuslice.io/memory]: value \"-1Gi\" is not accepted (negative)",
            ),
            (
                vec![(GPUS, "1.5")],
                vec![],
                "spec.hard[limits.gpuslice.io/gpus]",
            ),
            (
                vec![(MEMORY, "10Gi")],
                vec![(MEMORY, "500m")],
                "status.used[limits.gpuslice.io/memory]: value \"500m\"",
            ),
        ] {
            let e = Budget::read(&quota(&hard, &used), false)
                .unwrap_err()
                .to_string();
            assert!(e.starts_with("ResourceQuota team/gpu: "), "{e}");
            assert!(e.contains(want), "{e}");
            assert!(e.contains("accepted: "), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn a_shape_charges_memory_per_gpu_times_gpus() {
        let s = Shape {
            gpus: 2,
            memory: Some(20 << 30),
            cores: Some(30),
            selectors: vec![],
        };
        assert_eq!(
            shape_charge(&s, None, "f").unwrap(),
            Charge {
                memory_bytes: 40 << 30,
                cores: 60,
                gpus: 2
            }
        );
        let whole = Shape {
            gpus: 1,
            ..Shape::default()
        };
        assert_eq!(
            shape_charge(&whole, Some(80 << 30), "f").unwrap(),
            Charge {
                memory_bytes: 80 << 30,
                cores: 100,
                gpus: 1
            }
        );
        assert!(shape_charge(&whole, None, "f").is_err());
        let huge = Shape {
            gpus: 4,
            memory: Some(u64::MAX / 2),
            ..Shape::default()
        };
        let e = shape_charge(&huge, None, "spec.containers[0]")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("spec.containers[0]: ") && e.contains("overflows"),
            "{e}"
        );
    }

    #[test]
    fn a_claim_charges_the_sum_of_its_requests_of_gpuslices_classes() {
        let inv = PublishedGpus {
            gpu_memory: vec![24 << 30, 80 << 30],
            max_gpus_per_node: Some(8),
            ..PublishedGpus::default()
        };
        let spec: ResourceClaimSpec = serde_json::from_value(json!({"devices": {"requests": [
            {"name": "a", "exactly": {"deviceClassName": "gpuslice.io", "count": 2,
                "capacity": {"requests": {"memory": "4Gi", "cores": "30"}}}},
            {"name": "b", "exactly": {"deviceClassName": "gpuslice.io"}},
            {"name": "c", "exactly": {"deviceClassName": "other.example.com", "count": 5}},
            {"name": "d", "firstAvailable": [
                {"name": "big", "deviceClassName": "gpuslice.io", "capacity": {"requests": {"memory": "8Gi"}}},
                {"name": "small", "deviceClassName": "gpuslice.io", "capacity": {"requests": {"memory": "2Gi"}}}]},
        ]}}))
        .unwrap();
        assert_eq!(
            claim_charge(&spec, &inv, "ResourceClaim team/x").unwrap(),
            Charge {
                memory_bytes: (8 << 30) + (80 << 30) + (8 << 30),
                cores: 60 + 100 + 100,
                gpus: 4
            }
        );
        let all: ResourceClaimSpec = serde_json::from_value(json!({"devices": {"requests": [
            {"name": "a", "exactly": {"deviceClassName": "gpuslice.io", "allocationMode": "All"}}]}}))
        .unwrap();
        let e = claim_charge(&all, &inv, "ResourceClaim team/x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("allocationMode All"), "{e}");
    }

    #[test]
    fn a_request_charges_what_the_plugin_and_scheduler_book() {
        let inv = PublishedGpus {
            gpu_memory: vec![80 << 30],
            ..PublishedGpus::default()
        };
        let one = |cap: serde_json::Value| {
            let spec: ResourceClaimSpec = serde_json::from_value(json!({"devices": {"requests": [
                {"name": "a", "exactly": {"deviceClassName": "gpuslice.io", "count": 2,
                    "capacity": {"requests": cap}}}]}}))
            .unwrap();
            claim_charge(&spec, &inv, "ResourceClaim team/x").unwrap()
        };
        // cores 0 is not throttled, as an omitted cores: a whole GPU's share each.
        let zero = one(json!({"memory": "1Gi", "cores": "0"}));
        assert_eq!(zero, one(json!({"memory": "1Gi"})));
        assert_eq!(
            zero,
            Charge {
                memory_bytes: 2 << 30,
                cores: 200,
                gpus: 2
            }
        );
        // Memory below the 1Mi step or minimum is consumed as whole steps.
        for (asked, per_gpu) in [("1", 1 << 20), ("0", 1 << 20), ("1049000", 2 << 20)] {
            assert_eq!(
                one(json!({"memory": asked})).memory_bytes,
                2 * per_gpu,
                "memory {asked}"
            );
        }
        // A shape of compute share 0 charges as one not throttled.
        let s = Shape {
            gpus: 1,
            memory: Some(1 << 30),
            cores: Some(0),
            selectors: vec![],
        };
        assert_eq!(shape_charge(&s, None, "f").unwrap().cores, 100);
    }

    /// A cluster of one slot size: 6 slots of 4Gi per 24Gi GPU.
    fn six_slots() -> PublishedGpus {
        PublishedGpus {
            mode: Mode::Slots(vec![SlotSize {
                memory: 4 << 30,
                cores: None,
                per_gpu: 6,
            }]),
            max_gpus_per_node: Some(8),
            gpu_memory: vec![24 << 30],
        }
    }

    fn slot_charge(devices: serde_json::Value, inv: &PublishedGpus) -> Charge {
        let spec: ResourceClaimSpec =
            serde_json::from_value(json!({ "devices": devices })).unwrap();
        claim_charge(&spec, inv, "ResourceClaim team/x").unwrap()
    }

    #[test]
    fn hand_written_slot_requests_charge_every_slot_they_ask() {
        let inv = six_slots();
        // Requests of 6, 6, 6, 6, 6 and 1 slots, each kept on one GPU: 31 slots on 6 GPUs.
        let counts = [6, 6, 6, 6, 6, 1];
        let requests: Vec<_> = counts
            .iter()
            .enumerate()
            .map(|(i, n)| {
                json!({"name": format!("r{i}"), "exactly": {
                "deviceClassName": "slots.gpuslice.io", "count": n}})
            })
            .collect();
        let constraints: Vec<_> = (0..counts.len())
            .map(|i| json!({"requests": [format!("r{i}")], "matchAttribute": "gpuslice.io/uuid"}))
            .collect();
        assert_eq!(
            slot_charge(
                json!({"requests": requests, "constraints": constraints}),
                &inv
            ),
            Charge {
                memory_bytes: 31 * (4 << 30),
                cores: 600,
                gpus: 6
            }
        );
        // Requests pinned to slots 0 to 5, each of its own GPU: every pinned slot is charged,
        // not only slot 0.
        let requests: Vec<_> = (0..6)
            .map(|j| {
                json!({"name": format!("p{j}"), "exactly": {
                "deviceClassName": "slots.gpuslice.io",
                "selectors": [{"cel": {"expression": crate::claim_shape::pinned_expression(j)}}]}})
            })
            .collect();
        assert_eq!(
            slot_charge(json!({"requests": requests}), &inv),
            Charge {
                memory_bytes: 6 * (4 << 30),
                cores: 600,
                gpus: 6
            }
        );
        // A request of 3 slots no constraint keeps on one GPU may span 3 GPUs.
        assert_eq!(
            slot_charge(
                json!({"requests": [{"name": "a", "exactly": {
                    "deviceClassName": "slots.gpuslice.io", "count": 3}}]}),
                &inv
            )
            .gpus,
            3
        );
        // Constraints joining requests make one GPU of them; the compute share asked through
        // gpuslice's opaque parameters is charged per GPU.
        let c = slot_charge(
            json!({"requests": [
                {"name": "a", "exactly": {"deviceClassName": "slots.gpuslice.io", "count": 2}},
                {"name": "b", "exactly": {"deviceClassName": "slots.gpuslice.io", "count": 2}},
                {"name": "c", "exactly": {"deviceClassName": "slots.gpuslice.io", "count": 1}}],
             "constraints": [
                {"requests": ["a", "b"], "matchAttribute": "gpuslice.io/uuid"},
                {"requests": ["b", "c"], "matchAttribute": "gpuslice.io/uuid"}],
             "config": [{"opaque": {"driver": "gpuslice.io", "parameters": {
                "apiVersion": "gpuslice.io/v1", "kind": "SliceParameters", "cores": 30}}}]}),
            &inv,
        );
        assert_eq!(
            c,
            Charge {
                memory_bytes: 5 * (4 << 30),
                cores: 30,
                gpus: 1
            }
        );
        // allocationMode All cannot be counted.
        let spec: ResourceClaimSpec = serde_json::from_value(json!({"devices": {"requests": [
            {"name": "a", "exactly": {"deviceClassName": "slots.gpuslice.io", "allocationMode": "All"}}]}}))
        .unwrap();
        let e = claim_charge(&spec, &inv, "ResourceClaim team/x")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("ResourceClaim team/x.devices.requests[0].exactly: ")
                && e.contains("allocationMode All"),
            "{e}"
        );
    }

    #[test]
    fn a_slot_claims_share_is_charged_per_gpu_as_the_plugin_books_it() {
        let inv = six_slots();
        let share = |cores: u32, requests: Option<&[&str]>| {
            let mut c =
                json!({"opaque": {"driver": "gpuslice.io", "parameters": {"cores": cores}}});
            if let Some(r) = requests {
                c["requests"] = json!(r);
            }
            c
        };
        let slots = |name: &str, count: u32| json!({"name": name, "exactly": {"deviceClassName": "slots.gpuslice.io", "count": count}});
        let on_one_gpu =
            |names: &[&str]| json!({"requests": names, "matchAttribute": "gpuslice.io/uuid"});
        let cores = |devices: serde_json::Value| slot_charge(devices, &inv).cores;
        // Several configurations for every request: the largest, not the first.
        assert_eq!(
            cores(
                json!({"requests": [slots("gpu", 6)], "constraints": [on_one_gpu(&["gpu"])],
                "config": [share(1, None), share(96, None)]})
            ),
            96
        );
        // Per request, two requests on one GPU: the largest of theirs, once for the GPU.
        assert_eq!(
            cores(json!({"requests": [slots("a", 2), slots("b", 1)],
                "constraints": [on_one_gpu(&["a", "b"])],
                "config": [share(10, Some(&["a"])), share(20, Some(&["b"]))]})),
            20
        );
        // On two GPUs, one throttled and one not: 10 + 100.
        assert_eq!(
            cores(json!({"requests": [slots("a", 2), slots("b", 1)],
                "constraints": [on_one_gpu(&["a"]), on_one_gpu(&["b"])],
                "config": [share(10, Some(&["a"]))]})),
            110
        );
        // A request no constraint binds: its share on each GPU its slots may lie on.
        assert_eq!(
            cores(json!({"requests": [slots("a", 3)], "config": [share(10, None)]})),
            30
        );
        // A prioritized list: the most any alternative books — unthrottled when one is.
        let listed = |config: serde_json::Value| {
            cores(json!({"requests": [{"name": "gpu", "firstAvailable": [
                    {"name": "slots-0", "deviceClassName": "slots.gpuslice.io", "count": 2},
                    {"name": "slots-1", "deviceClassName": "slots.gpuslice.io", "count": 1}]}],
                "constraints": [on_one_gpu(&["gpu"])], "config": config}))
        };
        assert_eq!(listed(json!([share(15, Some(&["gpu"]))])), 15);
        assert_eq!(listed(json!([share(15, Some(&["gpu/slots-1"]))])), 100);
        assert_eq!(
            listed(json!([
                share(15, Some(&["gpu/slots-1"])),
                share(5, Some(&["gpu/slots-0"]))
            ])),
            15
        );
        // Parameters the plugin refuses are not counted (it prepares no such claim).
        assert_eq!(
            cores(
                json!({"requests": [slots("gpu", 6)], "constraints": [on_one_gpu(&["gpu"])],
                "config": [{"opaque": {"driver": "gpuslice.io", "parameters": {"cores": 0}}},
                    share(40, None)]})
            ),
            40
        );
    }

    #[test]
    fn a_prioritized_list_of_slots_charges_its_largest_alternative() {
        let inv = PublishedGpus {
            mode: Mode::Slots(vec![
                SlotSize {
                    memory: 1 << 30,
                    cores: None,
                    per_gpu: 8,
                },
                SlotSize {
                    memory: 4 << 30,
                    cores: None,
                    per_gpu: 6,
                },
            ]),
            max_gpus_per_node: Some(8),
            gpu_memory: vec![8 << 30, 24 << 30],
        };
        let size = |q: &str| {
            json!([{"cel": {"expression": format!(
                "device.capacity[\"gpuslice.io\"].memory.compareTo(quantity(\"{q}\")) == 0")}}])
        };
        // [6 × 4Gi, 1 × 1Gi]: the scheduler takes the first it can place, so 24Gi.
        let c = slot_charge(
            json!({"requests": [{"name": "gpu", "firstAvailable": [
                {"name": "slots-0", "deviceClassName": "slots.gpuslice.io", "count": 6, "selectors": size("4Gi")},
                {"name": "slots-1", "deviceClassName": "slots.gpuslice.io", "count": 1, "selectors": size("1Gi")}]}],
             "constraints": [{"requests": ["gpu"], "matchAttribute": "gpuslice.io/uuid"}]}),
            &inv,
        );
        assert_eq!(
            c,
            Charge {
                memory_bytes: 24 << 30,
                cores: 100,
                gpus: 1
            }
        );
        // A slot request naming no size charges the largest size published.
        assert_eq!(
            slot_charge(
                json!({"requests": [{"name": "a", "exactly": {
                    "deviceClassName": "slots.gpuslice.io", "count": 2}}],
                 "constraints": [{"matchAttribute": "gpuslice.io/uuid"}]}),
                &inv
            )
            .memory_bytes,
            8 << 30
        );
    }

    #[test]
    fn the_claims_front_ends_write_charge_what_was_asked() {
        let shape = Shape {
            gpus: 2,
            memory: Some(6 << 30),
            cores: None,
            selectors: vec![],
        };
        let want = shape_charge(&shape, None, "f").unwrap();
        let slots = PublishedGpus {
            mode: Mode::Slots(vec![SlotSize {
                memory: 6 << 30,
                cores: None,
                per_gpu: 4,
            }]),
            max_gpus_per_node: Some(2),
            gpu_memory: vec![24 << 30],
        };
        let (spec, _) = claim_spec(&PublishedGpus::default().mode, &shape, "f").unwrap();
        assert_eq!(
            claim_charge(&spec, &PublishedGpus::default(), "f"),
            Ok(want)
        );
        // Slot mode takes each GPU of a multi-GPU slice whole.
        let (spec, _) = claim_spec(&slots.mode, &shape, "f").unwrap();
        assert_eq!(
            claim_charge(&spec, &slots, "f").unwrap(),
            Charge {
                memory_bytes: 48 << 30,
                cores: 200,
                gpus: 2
            }
        );
    }
}
