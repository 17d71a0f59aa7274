//! The one construction of a slice's claim from what was asked (GPUs, memory per GPU, compute
//! share, device selectors) for the publication mode the cluster's gpuslice ResourceSlices
//! show, so that every front end that writes claims (the webhook, `kubectl gpuslice allocate`
//! and the web console) writes the same claim for the same ask; and the reading back of what
//! a claim of that shape asks, for the tools that show it.

use std::collections::{BTreeMap, BTreeSet};

use gpuslice_config::{format_kube_quantity, parse_kube_quantity};
use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, CapacityRequirements, Device, DeviceClaim, DeviceClaimConfiguration,
    DeviceConstraint, DeviceRequest, DeviceSelector, DeviceSubRequest, ExactDeviceRequest,
    OpaqueDeviceConfiguration, ResourceClaimSpec, ResourceClaimTemplate, ResourceClaimTemplateSpec,
    ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;

use crate::slices::{
    max_request, parse_device, round_up_request, DeviceRef, CAP_CORES, CAP_MEMORY, SLICE_SUFFIX,
};
use crate::{DRIVER, SLOTS_CLASS};

/// The label key naming who wrote a template.
pub const MANAGED_BY_KEY: &str = "app.kubernetes.io/managed-by";
/// The label every template the webhook writes carries, and the only templates it reuses.
pub const MANAGED_BY: (&str, &str) = (MANAGED_BY_KEY, "gpuslice-webhook");
/// The DeviceClass of slot mode's devices.
pub const SLOT_CLASS: &str = SLOTS_CLASS;
/// The fully qualified attribute that names a GPU (distinct GPUs, slots of one GPU): the
/// driver's domain and [`crate::slices::ATTR_UUID`].
pub const UUID_ATTRIBUTE: &str = "gpuslice.io/uuid";
/// Prefix of the webhook's templates' names (a hash of the claim spec follows).
pub const TEMPLATE_PREFIX: &str = "gpuslice-";
/// The container limits that ask for a slice (what the webhook turns into a claim).
pub const LIMIT_GPUS: &str = "gpuslice.io/gpus";
pub const LIMIT_MEMORY: &str = "gpuslice.io/memory";
pub const LIMIT_CORES: &str = "gpuslice.io/cores";
/// The prefix of HAMi's container limits (`nvidia.com/gpu`, `nvidia.com/gpumem`, …).
pub const HAMI_LIMIT_PREFIX: &str = "nvidia.com/gpu";
/// The opaque parameters' version and kind a slot claim's compute share is written with.
pub const PARAMETERS_API_VERSION: &str = "gpuslice.io/v1";
pub const PARAMETERS_KIND: &str = "SliceParameters";

/// How the cluster's DRA plugin publishes its GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// One shared device per GPU whose `memory` and `cores` claims consume.
    Capacity,
    /// N unshared slot devices per GPU (`gpu-<i>-slot-<j>`), of class `slots.gpuslice.io`:
    /// the distinct slot sizes the cluster's GPUs have, ascending by memory, at least one.
    Slots(Vec<SlotSize>),
}

/// One slot of slot mode: its memory, its compute share (when slots carry one) and how many
/// slots make a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotSize {
    pub memory: u64,
    pub cores: Option<u32>,
    pub per_gpu: u32,
}

/// What one container asks for, already validated and resolved to bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shape {
    /// Distinct GPUs, 1 or more.
    pub gpus: u32,
    /// Memory per GPU in bytes; `None`: the whole GPU's.
    pub memory: Option<u64>,
    /// Compute share per GPU in percent; `None`: not throttled.
    pub cores: Option<u32>,
    /// CEL expressions every GPU must satisfy.
    pub selectors: Vec<String>,
}

/// A shape the mode cannot express.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    #[error("{field}: {value} needs {slots} slots of {slot} per GPU; accepted: at most {per_gpu} slots ({max}) per GPU in this cluster's slot mode")]
    TooManySlots {
        field: String,
        value: String,
        slots: u64,
        slot: String,
        per_gpu: u32,
        max: String,
    },
    #[error("{field}: the cluster publishes slot mode without any slot size; accepted: a cluster whose ResourceSlices publish slots")]
    NoSlotSize { field: String },
    #[error("{field}: memory of {value} bytes is above {max}, the largest whole number of 1Mi steps a device is asked in; accepted: at most {max}")]
    Memory {
        field: String,
        value: u64,
        max: String,
    },
    #[error("{field}: {value} GPUs; accepted: at least 1")]
    NoGpu { field: String, value: String },
    #[error("{field}: {value} needs {devices} slot devices in one claim; accepted: at most {max} (Kubernetes' limit of devices per claim), i.e. at most {gpus} whole GPUs of {per_gpu} slots in this cluster's slot mode")]
    TooManyDevices {
        field: String,
        value: String,
        devices: u64,
        max: u64,
        gpus: u64,
        per_gpu: u32,
    },
    #[error("{field}: a slice of several GPUs in slot mode takes each GPU whole, but this cluster's GPUs have different slot counts ({counts}); accepted: gpus 1, or one dra.slots_per_gpu on every node")]
    UnevenSlots { field: String, counts: String },
    #[error("{field}: the containers of a pod share one slice in slot mode, but they select different GPUs ({first} and {other}); accepted: the same selection for every container of the pod")]
    PodSelectors {
        field: String,
        first: String,
        other: String,
    },
}

/// The most devices one claim's allocation may hold (Kubernetes' `AllocationResultsMaxSize`):
/// an allocator asked for more fails the whole scheduling attempt, on every node, with an
/// error instead of `Unschedulable`.
pub const MAX_CLAIM_DEVICES: u64 = 32;

/// The claim spec of `shape` in `mode`, and what was rounded or ignored on the way (one line
/// each, for admission warnings). `field` names where the request came from, for messages.
pub fn claim_spec(
    mode: &Mode,
    shape: &Shape,
    field: &str,
) -> Result<(ResourceClaimSpec, Vec<String>), ShapeError> {
    if shape.gpus == 0 {
        return Err(ShapeError::NoGpu {
            field: field.to_string(),
            value: "0".into(),
        });
    }
    let mut warnings = Vec::new();
    let selectors = (!shape.selectors.is_empty()).then(|| {
        shape
            .selectors
            .iter()
            .map(|e| DeviceSelector {
                cel: Some(CELDeviceSelector {
                    expression: e.clone(),
                }),
            })
            .collect::<Vec<_>>()
    });
    let names: Vec<String> = if shape.gpus == 1 {
        vec!["gpu".to_string()]
    } else {
        (0..shape.gpus).map(|i| format!("gpu-{i}")).collect()
    };
    if let (Mode::Slots(sizes), true) = (mode, shape.gpus > 1) {
        return whole_gpus(sizes, shape, field, selectors.as_deref());
    }
    // In slot mode with several slot sizes: per size, the slot count and its selector.
    let mut sized: Vec<(SlotSize, u64)> = Vec::new();
    let (class, count, capacity) = match mode {
        Mode::Capacity => {
            let mut req = BTreeMap::new();
            if let Some(m) = shape.memory {
                let rounded = round_up_request(m).ok_or_else(|| ShapeError::Memory {
                    field: field.to_string(),
                    value: m,
                    max: max_request(),
                })?;
                if rounded != m {
                    warnings.push(format!(
                        "{field}: memory rounded up to {} (the device's step is 1Mi)",
                        format_kube_quantity(rounded)
                    ));
                }
                req.insert(
                    CAP_MEMORY.to_string(),
                    Quantity(format_kube_quantity(rounded)),
                );
            }
            if let Some(c) = shape.cores.filter(|c| *c > 0) {
                req.insert(CAP_CORES.to_string(), Quantity(c.to_string()));
            }
            let capacity = (!req.is_empty()).then_some(CapacityRequirements {
                requests: Some(req),
            });
            (DRIVER, 1, capacity)
        }
        Mode::Slots(sizes) => {
            // Every size whose slots of one GPU can hold the ask, best fit first: the fewest
            // bytes taken, then the smaller slot.
            let mut fits: Vec<(SlotSize, u64)> = sizes
                .iter()
                .map(|s| (*s, slot_count(s, shape)))
                .filter(|(s, k)| *k <= u64::from(s.per_gpu))
                .collect();
            fits.sort_by_key(|(s, k)| (k.saturating_mul(s.memory), s.memory));
            let Some((_, k)) = fits.first().copied() else {
                // Refused on every size: name the size that holds the most per GPU.
                let big = sizes
                    .iter()
                    .max_by_key(|s| s.memory.saturating_mul(u64::from(s.per_gpu)))
                    .ok_or_else(|| ShapeError::NoSlotSize {
                        field: field.to_string(),
                    })?;
                return Err(ShapeError::TooManySlots {
                    field: field.to_string(),
                    value: describe(shape),
                    slots: slot_count(big, shape),
                    slot: format_kube_quantity(big.memory),
                    per_gpu: big.per_gpu,
                    max: format_kube_quantity(big.memory.saturating_mul(u64::from(big.per_gpu))),
                });
            };
            // Warned when some GPU's slots hold more than asked (what the pod may get).
            if let Some(m) = shape.memory {
                if fits.iter().any(|(s, k)| k.saturating_mul(s.memory) != m) {
                    let on = fits
                        .iter()
                        .map(|(s, k)| {
                            let got = format_kube_quantity(k.saturating_mul(s.memory));
                            if sizes.len() > 1 {
                                format!(
                                    "{k} slot(s) = {got} on GPUs of {} slots",
                                    format_kube_quantity(s.memory)
                                )
                            } else {
                                format!("{k} slot(s) = {got}")
                            }
                        })
                        .collect::<Vec<_>>()
                        .join(", ");
                    warnings.push(format!(
                        "{field}: memory {} rounded up to {on} per GPU",
                        format_kube_quantity(m)
                    ));
                }
            }
            if k > MAX_CLAIM_DEVICES {
                return Err(ShapeError::TooManyDevices {
                    field: field.to_string(),
                    value: describe(shape),
                    devices: k,
                    max: MAX_CLAIM_DEVICES,
                    gpus: 0,
                    per_gpu: sizes.iter().map(|s| s.per_gpu).max().unwrap_or(1),
                });
            }
            if sizes.len() > 1 {
                sized = fits;
            }
            (SLOT_CLASS, k as i64, None)
        }
    };
    // Several slot sizes: a prioritized list, one subrequest per size that fits, each asking
    // the slots of its size; the scheduler takes the first it can place.
    let subrequests = (!sized.is_empty()).then(|| {
        sized
            .iter()
            .enumerate()
            .map(|(i, (s, k))| DeviceSubRequest {
                name: format!("{SUBREQUEST_PREFIX}{i}"),
                device_class_name: SLOT_CLASS.to_string(),
                count: Some(*k as i64),
                selectors: Some(
                    std::iter::once(size_selector(s.memory))
                        .chain(selectors.iter().flatten().cloned())
                        .collect(),
                ),
                ..Default::default()
            })
            .collect::<Vec<_>>()
    });
    let requests = names
        .iter()
        .map(|name| DeviceRequest {
            name: name.clone(),
            first_available: subrequests.clone(),
            exactly: subrequests.is_none().then(|| ExactDeviceRequest {
                device_class_name: class.to_string(),
                count: Some(count),
                capacity: capacity.clone(),
                selectors: selectors.clone(),
                ..Default::default()
            }),
        })
        .collect();
    // A slot claim asks its share through opaque parameters (the scheduler cannot see them;
    // its slots bound it), for every request.
    let config = match mode {
        Mode::Slots(_) => share_config(shape.cores),
        Mode::Capacity => None,
    };
    let mut constraints = Vec::new();
    if let Mode::Slots(_) = mode {
        for name in &names {
            constraints.push(DeviceConstraint {
                requests: Some(vec![name.clone()]),
                match_attribute: Some(UUID_ATTRIBUTE.to_string()),
                ..Default::default()
            });
        }
    }
    if names.len() > 1 {
        constraints.push(DeviceConstraint {
            requests: Some(names.clone()),
            distinct_attribute: Some(UUID_ATTRIBUTE.to_string()),
            ..Default::default()
        });
    }
    Ok((
        ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(requests),
                constraints: (!constraints.is_empty()).then_some(constraints),
                config,
            }),
        },
        warnings,
    ))
}

/// The opaque configuration that asks a slot claim's compute share, for every request.
fn share_config(cores: Option<u32>) -> Option<Vec<DeviceClaimConfiguration>> {
    let c = cores.filter(|c| *c > 0)?;
    Some(vec![DeviceClaimConfiguration {
        requests: None,
        opaque: Some(OpaqueDeviceConfiguration {
            driver: DRIVER.to_string(),
            parameters: RawExtension(serde_json::json!({
                "apiVersion": PARAMETERS_API_VERSION,
                "kind": PARAMETERS_KIND,
                "cores": c,
            })),
        }),
    }])
}

/// A slot-mode slice of several GPUs: each GPU whole, asked slot by slot — one single-slot
/// request per slot number `j`, whose selector pins `slot == j`, the GPU's N requests under one
/// constraint to one GPU. Kubernetes' allocator tries every order of interchangeable devices
/// before it gives up on a claim, so N slots of a `count: N` request cost N! orderings per GPU
/// and a claim of several such requests their product (past the scheduler's 10 s filter
/// timeout at 6 slots on an 8-GPU node); pinned, each slot has one candidate per GPU
/// (docs/kubernetes-dra.md, "Bounded search"). Whole GPUs are distinct GPUs, which slot mode
/// cannot otherwise say. A smaller memory per GPU is rounded up to the whole GPU, warned.
fn whole_gpus(
    sizes: &[SlotSize],
    shape: &Shape,
    field: &str,
    selectors: Option<&[DeviceSelector]>,
) -> Result<(ResourceClaimSpec, Vec<String>), ShapeError> {
    let counts: BTreeSet<u32> = sizes.iter().map(|s| s.per_gpu).collect();
    let (Some(&per_gpu), 1) = (counts.iter().next(), counts.len()) else {
        return Err(ShapeError::UnevenSlots {
            field: field.to_string(),
            counts: counts
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        });
    };
    let devices = u64::from(shape.gpus) * u64::from(per_gpu);
    if devices > MAX_CLAIM_DEVICES {
        return Err(ShapeError::TooManyDevices {
            field: field.to_string(),
            value: describe(shape),
            devices,
            max: MAX_CLAIM_DEVICES,
            gpus: MAX_CLAIM_DEVICES / u64::from(per_gpu.max(1)),
            per_gpu,
        });
    }
    let mut warnings = Vec::new();
    // The slot sizes whose whole GPU holds the memory asked; when not all do, a selector of
    // the smallest that does.
    let whole = |s: &SlotSize| s.memory.saturating_mul(u64::from(per_gpu));
    let mut size_floor = None;
    if let Some(m) = shape.memory {
        let Some(smallest) = sizes
            .iter()
            .filter(|s| whole(s) >= m)
            .min_by_key(|s| s.memory)
        else {
            let big = sizes
                .iter()
                .max_by_key(|s| s.memory)
                .copied()
                .ok_or_else(|| ShapeError::NoSlotSize {
                    field: field.to_string(),
                })?;
            return Err(ShapeError::TooManySlots {
                field: field.to_string(),
                value: describe(shape),
                slots: m.div_ceil(big.memory.max(1)),
                slot: format_kube_quantity(big.memory),
                per_gpu,
                max: format_kube_quantity(whole(&big)),
            });
        };
        if sizes.iter().any(|s| s.memory < smallest.memory) {
            size_floor = Some(DeviceSelector {
                cel: Some(CELDeviceSelector {
                    expression: format!(
                        "{SIZE_FLOOR_PREFIX}{}\")) >= 0",
                        format_kube_quantity(smallest.memory)
                    ),
                }),
            });
        }
        if sizes.iter().any(|s| whole(s) > m) {
            warnings.push(format!(
                "{field}: in slot mode a slice of {} GPUs takes each GPU whole ({per_gpu} slots); memory {} per GPU rounded up to the whole GPU",
                shape.gpus,
                format_kube_quantity(m)
            ));
        }
    }
    let mut requests = Vec::new();
    let mut constraints = Vec::new();
    for g in 0..shape.gpus {
        let names: Vec<String> = (0..per_gpu).map(|j| pinned_request(g, j)).collect();
        for (j, name) in names.iter().enumerate() {
            requests.push(DeviceRequest {
                name: name.clone(),
                first_available: None,
                exactly: Some(ExactDeviceRequest {
                    device_class_name: SLOT_CLASS.to_string(),
                    count: Some(1),
                    selectors: Some(
                        std::iter::once(DeviceSelector {
                            cel: Some(CELDeviceSelector {
                                expression: pinned_expression(j as u32),
                            }),
                        })
                        .chain(size_floor.iter().cloned())
                        .chain(selectors.into_iter().flatten().cloned())
                        .collect(),
                    ),
                    ..Default::default()
                }),
            });
        }
        constraints.push(DeviceConstraint {
            requests: Some(names),
            match_attribute: Some(UUID_ATTRIBUTE.to_string()),
            ..Default::default()
        });
    }
    Ok((
        ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(requests),
                constraints: Some(constraints),
                config: share_config(shape.cores),
            }),
        },
        warnings,
    ))
}

/// The slot a request of [`whole_gpus`]' form pins.
fn pinned_of(e: &ExactDeviceRequest) -> Option<u32> {
    e.selectors
        .iter()
        .flatten()
        .filter_map(|s| s.cel.as_ref())
        .find_map(|c| pinned_slot(&c.expression))
}

/// How a whole-GPU request's size floor (GPUs of at least a slot size) begins.
const SIZE_FLOOR_PREFIX: &str = "device.capacity[\"gpuslice.io\"].memory.compareTo(quantity(\"";

/// The name of the request for slot `j` of the `g`-th whole GPU of a slot claim.
fn pinned_request(g: u32, j: u32) -> String {
    format!("gpu-{g}-slot-{j}")
}

/// The CEL expression that pins slot number `j` (see [`whole_gpus`]).
pub fn pinned_expression(j: u32) -> String {
    format!(
        "device.attributes[\"{DRIVER}\"].{} == {j}",
        crate::slices::ATTR_SLOT
    )
}

/// The slot number a selector of [`pinned_expression`]'s form pins.
fn pinned_slot(expression: &str) -> Option<u32> {
    let rest = expression.strip_prefix(&format!(
        "device.attributes[\"{DRIVER}\"].{} == ",
        crate::slices::ATTR_SLOT
    ))?;
    rest.parse::<u32>().ok().filter(|j| j.to_string() == rest)
}

/// What the containers of one pod ask together in slot mode, where they share one claim: the
/// pod's effective ask as Kubernetes counts a pod's resources — the larger of the init
/// containers' largest and the app containers' sum (memory and compute share per GPU; the
/// whole GPU when one asks it whole, no share when one asks none; a share of at most 100),
/// the most GPUs any asks, and
/// their selection, which must be one. Several slot claims in one pod multiply the
/// allocator's search (every order of one claim's slots is tried against the next), so the
/// webhook gives a pod one (docs/kubernetes-dra.md, "Bounded search"). `asks` are (field,
/// shape, init container); the result's warning names them.
pub fn pod_shape(asks: &[(String, Shape, bool)]) -> Result<(Shape, String), ShapeError> {
    let fields: Vec<&str> = asks.iter().map(|(f, _, _)| f.as_str()).collect();
    let field = fields.join(", ");
    let Some((first_field, first, _)) = asks.first() else {
        return Err(ShapeError::NoGpu {
            field,
            value: "0".into(),
        });
    };
    // `None` (the whole GPU's memory, no share) makes the pod's ask whole or unthrottled: one
    // container that runs unthrottled on the shared slice cannot be throttled for another's
    // share.
    let mut out = Shape {
        gpus: 0,
        memory: Some(0),
        cores: Some(0),
        selectors: first.selectors.clone(),
    };
    let mut init = Shape {
        memory: Some(0),
        cores: Some(0),
        ..Shape::default()
    };
    for (f, s, is_init) in asks {
        if s.selectors != first.selectors {
            return Err(ShapeError::PodSelectors {
                field: format!("{first_field}, {f}"),
                first: selection(&first.selectors),
                other: selection(&s.selectors),
            });
        }
        out.gpus = out.gpus.max(s.gpus);
        let into = if *is_init { &mut init } else { &mut out };
        into.memory = match (into.memory, s.memory) {
            (Some(a), Some(b)) if *is_init => Some(a.max(b)),
            (Some(a), Some(b)) => Some(a.saturating_add(b)),
            _ => None,
        };
        into.cores = match (into.cores, s.cores.filter(|c| *c > 0)) {
            (Some(a), Some(b)) if *is_init => Some(a.max(b)),
            (Some(a), Some(b)) => Some(a.saturating_add(b).min(100)),
            _ => None,
        };
    }
    out.memory = match (out.memory, init.memory) {
        (Some(a), Some(b)) => Some(a.max(b)),
        _ => None,
    };
    out.cores = match (out.cores, init.cores) {
        (Some(a), Some(b)) => Some(a.max(b)).filter(|c| *c > 0),
        _ => None,
    };
    let warning = format!(
        "{field}: in slot mode the containers of a pod share one slice, {}",
        describe(&out)
    );
    Ok((out, warning))
}

/// `no selection` or the selectors joined, for messages.
fn selection(selectors: &[String]) -> String {
    if selectors.is_empty() {
        "no selection".to_string()
    } else {
        selectors.join(" && ")
    }
}

/// The prefix of the subrequests of a slot claim on a cluster of several slot sizes
/// (`slots-0` the best fit, then `slots-1`, …).
pub const SUBREQUEST_PREFIX: &str = "slots-";

/// The CEL expression that selects the slots of `memory` bytes.
fn size_expression(memory: u64) -> String {
    format!(
        "device.capacity[\"{DRIVER}\"].{CAP_MEMORY}.compareTo(quantity(\"{}\")) == 0",
        format_kube_quantity(memory)
    )
}

/// The selector of the slots of `memory` bytes.
fn size_selector(memory: u64) -> DeviceSelector {
    DeviceSelector {
        cel: Some(CELDeviceSelector {
            expression: size_expression(memory),
        }),
    }
}

/// The slot size a selector of [`size_selector`]'s form selects.
pub(crate) fn selected_size(expression: &str) -> Option<u64> {
    let rest = expression.strip_prefix(&format!(
        "device.capacity[\"{DRIVER}\"].{CAP_MEMORY}.compareTo(quantity(\""
    ))?;
    let q = rest.strip_suffix("\")) == 0")?;
    parse_kube_quantity(q).ok()
}

/// How many slots of each GPU `shape` takes: enough for its memory (all of them for a whole
/// GPU, and for a slice of several GPUs, which takes each whole) and for its compute share
/// where slots carry one, at least one.
pub fn slot_count(slot: &SlotSize, shape: &Shape) -> u64 {
    if shape.gpus > 1 {
        return u64::from(slot.per_gpu);
    }
    let by_memory = shape
        .memory
        .map_or(u64::from(slot.per_gpu), |m| m.div_ceil(slot.memory.max(1)));
    let by_cores = match (shape.cores.filter(|c| *c > 0), slot.cores) {
        (Some(c), Some(per)) => u64::from(c).div_ceil(u64::from(per.max(1))),
        _ => 0,
    };
    by_memory.max(by_cores).max(1)
}

/// `2 GPUs × 20Gi, 30 cores`, for messages.
pub fn describe(shape: &Shape) -> String {
    let gpus = if shape.gpus == 1 {
        "1 GPU".to_string()
    } else {
        format!("{} GPUs", shape.gpus)
    };
    let memory = shape
        .memory
        .map_or("whole memory".to_string(), format_kube_quantity);
    match shape.cores {
        Some(c) if c > 0 => format!("{gpus} × {memory}, {c} cores"),
        _ => format!("{gpus} × {memory}"),
    }
}

/// FNV-1a, 64 bits: a stable hash (the same on every replica and release) of a spec.
fn fnv64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Who writes a template: the value of its [`MANAGED_BY_KEY`] label, the prefix of its name
/// and the annotations it carries (e.g. the workload it is for).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Writer {
    pub manager: String,
    pub prefix: String,
    pub annotations: BTreeMap<String, String>,
}

impl Writer {
    /// The webhook: `gpuslice-<hash>`, labelled [`MANAGED_BY`].
    pub fn webhook() -> Writer {
        Writer {
            manager: MANAGED_BY.1.to_string(),
            prefix: TEMPLATE_PREFIX.to_string(),
            annotations: BTreeMap::new(),
        }
    }
}

/// The template holding `spec` as the webhook writes it (see [`template_by`]).
pub fn template(namespace: &str, spec: ResourceClaimSpec) -> ResourceClaimTemplate {
    template_by(&Writer::webhook(), namespace, spec)
}

/// The template holding `spec`: named after the writer's prefix and a hash of the spec (a
/// template's spec cannot change, so the same shape is the same template and another shape
/// another one; the prefix is cut so that the name stays within 253 characters), in
/// `namespace`, labelled and annotated as `writer`'s.
pub fn template_by(
    writer: &Writer,
    namespace: &str,
    spec: ResourceClaimSpec,
) -> ResourceClaimTemplate {
    // Serialising a typed spec cannot fail (no maps with non-string keys).
    let canonical = serde_json::to_vec(&spec).unwrap_or_default();
    let hash = format!("{:016x}", fnv64(&canonical));
    let mut prefix = writer.prefix.clone();
    while prefix.len() + hash.len() > crate::slices::MAX_NAME
        || !prefix.is_char_boundary(prefix.len())
    {
        prefix.pop();
    }
    let name = format!("{prefix}{hash}");
    ResourceClaimTemplate {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([(
                MANAGED_BY_KEY.to_string(),
                writer.manager.clone(),
            )])),
            annotations: (!writer.annotations.is_empty()).then(|| writer.annotations.clone()),
            ..Default::default()
        },
        spec: Some(ResourceClaimTemplateSpec {
            metadata: None,
            spec: Some(spec),
        }),
    }
}

/// Fields the API server adds to a claim spec it stores (defaults).
const DEFAULTED: &[&str] = &["allocationMode"];

/// Whether `have` is `want` as the API server stores it: the same fields with the same values,
/// plus at most the [`DEFAULTED`] ones.
fn within(want: &serde_json::Value, have: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (want, have) {
        (Value::Object(w), Value::Object(h)) => {
            w.iter()
                .all(|(k, v)| h.get(k).is_some_and(|hv| within(v, hv)))
                && h.keys()
                    .all(|k| w.contains_key(k) || DEFAULTED.contains(&k.as_str()))
        }
        (Value::Array(w), Value::Array(h)) => {
            w.len() == h.len() && w.iter().zip(h).all(|(a, b)| within(a, b))
        }
        _ => want == have,
    }
}

/// Whether every entry of `want` is in `have`.
fn has_all(
    want: Option<&BTreeMap<String, String>>,
    have: Option<&BTreeMap<String, String>>,
) -> bool {
    want.into_iter()
        .flatten()
        .all(|(k, v)| have.and_then(|h| h.get(k)) == Some(v))
}

/// Whether `t` was written by `writer` (its label and annotations), whatever its spec.
pub fn written_by(t: &ResourceClaimTemplate, writer: &Writer) -> bool {
    t.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_BY_KEY))
        .is_some_and(|v| *v == writer.manager)
        && has_all(Some(&writer.annotations), t.metadata.annotations.as_ref())
}

/// Whether `t` is the template `want` as its writer wrote it: the same label and annotations,
/// and `want`'s spec (as the API server stores it: with its defaults added). A template
/// without them is someone else's and never reused or changed.
pub fn is_ours(t: &ResourceClaimTemplate, want: &ResourceClaimTemplate) -> bool {
    let labelled = has_all(want.metadata.labels.as_ref(), t.metadata.labels.as_ref())
        && has_all(
            want.metadata.annotations.as_ref(),
            t.metadata.annotations.as_ref(),
        );
    let spec = |x: &ResourceClaimTemplate| {
        x.spec
            .as_ref()
            .and_then(|s| s.spec.as_ref())
            .map(|s| serde_json::to_value(s).unwrap_or_default())
    };
    labelled
        && match (spec(want), spec(t)) {
            (Some(w), Some(h)) => within(&w, &h),
            _ => false,
        }
}

/// The spec of `t` as [`is_ours`] compares it, in a canonical form: its JSON with the
/// [`DEFAULTED`] fields left out and every object's keys in order. For a `want` that names no
/// defaulted field (the webhook writes none), `t` holds `want`'s spec exactly when their forms
/// are equal, so a digest of the form stands for the spec (`None` when `t` has none).
pub fn spec_form(t: &ResourceClaimTemplate) -> Option<Vec<u8>> {
    let spec = t.spec.as_ref()?.spec.as_ref()?;
    let value = serde_json::to_value(spec).ok()?;
    let mut out = Vec::new();
    canonical(&value, &mut out);
    Some(out)
}

/// `v` as JSON into `out`, objects' keys in order and the [`DEFAULTED`] fields left out.
fn canonical(v: &serde_json::Value, out: &mut Vec<u8>) {
    use serde_json::Value;
    // Writing a string or a scalar into a Vec cannot fail.
    match v {
        Value::Object(m) => {
            let mut entries: Vec<_> = m
                .iter()
                .filter(|(k, _)| !DEFAULTED.contains(&k.as_str()))
                .collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                let _ = serde_json::to_writer(&mut *out, k);
                out.push(b':');
                canonical(v, out);
            }
            out.push(b'}');
        }
        Value::Array(a) => {
            out.push(b'[');
            for (i, v) in a.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical(v, out);
            }
            out.push(b']');
        }
        other => {
            let _ = serde_json::to_writer(&mut *out, other);
        }
    }
}

/// The cluster's GPUs as gpuslice's ResourceSlices show them: the publication mode and the
/// GPUs' sizes, what a claim is written and checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedGpus {
    pub mode: Mode,
    /// The most GPUs one node has; `None` when no GPU is published (nothing to check).
    pub max_gpus_per_node: Option<u32>,
    /// The distinct memory sizes of the GPUs, ascending.
    pub gpu_memory: Vec<u64>,
}

impl Default for PublishedGpus {
    fn default() -> PublishedGpus {
        PublishedGpus {
            mode: Mode::Capacity,
            max_gpus_per_node: None,
            gpu_memory: Vec::new(),
        }
    }
}

/// The slots of one size seen: their compute share and how many each (node, GPU) has.
type SlotsOfSize = (Option<u32>, BTreeMap<(String, u32), u32>);

/// One node's GPUs as its own pool shows them.
#[derive(Default)]
struct NodeGpus {
    /// GPU index → (memory, slots).
    gpus: BTreeMap<u32, (u64, u32)>,
    /// Whether a device is a whole GPU (`gpu-<i>`).
    whole: bool,
    /// One per slot device (`gpu-<i>-slot-<j>`): its bytes, its share, its GPU's index.
    slots: Vec<(u64, Option<u32>, u32)>,
}

/// The number `n` of a slice named as the plugin names its pool's slices
/// (`<node>-gpuslice.io`, then `<node>-gpuslice.io-<n>`).
fn slice_number(name: &str, node: &str) -> Option<usize> {
    let rest = name.strip_prefix(node)?.strip_prefix(SLICE_SUFFIX)?;
    if rest.is_empty() {
        return Some(0);
    }
    let n: usize = rest.strip_prefix('-')?.parse().ok()?;
    (n >= 1 && crate::slices::slice_name(node, n) == name).then_some(n)
}

/// Whether `s` is laid out as gpuslice's kubelet plugin publishes: driver `gpuslice.io`, on a
/// node, in the pool named after that node, under one of the pool's slice names.
fn plugins_slice(s: &ResourceSlice) -> bool {
    let node = s.spec.pool.name.as_str();
    s.spec.driver == DRIVER
        && s.spec.node_name.as_deref() == Some(node)
        && s.metadata
            .name
            .as_deref()
            .and_then(|n| slice_number(n, node))
            .and_then(|n| i64::try_from(n).ok())
            .is_some_and(|n| n < s.spec.pool.resource_slice_count)
}

/// One node's pool of gpuslice devices as the scheduler reads it: the slices of the pool's
/// newest generation laid out as the kubelet plugin lays them out.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginPool<'a> {
    /// The node, which names the pool.
    pub node: &'a str,
    /// The pool's newest generation.
    pub generation: i64,
    /// Its slices of that generation.
    pub slices: Vec<&'a ResourceSlice>,
    /// Its slices of older generations still listed while the newest is incomplete (the plugin
    /// has not replaced them yet); empty once the newest generation is complete.
    pub older: Vec<&'a ResourceSlice>,
    /// Why the scheduler allocates none of its devices now, `None` when it allocates them.
    pub unusable: Option<String>,
}

impl<'a> PluginPool<'a> {
    /// Its devices, each once, when the scheduler allocates them (none otherwise): what is
    /// free to place now.
    pub fn devices(&self) -> impl Iterator<Item = (&'a ResourceSlice, &'a Device)> + '_ {
        self.slices
            .iter()
            .filter(|_| self.unusable.is_none())
            .flat_map(|s| s.spec.devices.iter().flatten().map(move |d| (*s, d)))
    }

    /// Every device the pool lists, each once, as its newest slice listing it says, even while
    /// the plugin is replacing its slices (an older slice's devices that no newer slice lists
    /// yet included): what the node's GPUs are like (their mode, number and sizes), which a
    /// republish does not change, unlike what may be placed at this moment.
    pub fn listed_devices(&self) -> impl Iterator<Item = &'a Device> + '_ {
        let mut older: Vec<&ResourceSlice> = self.older.clone();
        older.sort_by_key(|s| std::cmp::Reverse(s.spec.pool.generation));
        // Whether a device is a slot (slot mode) or a GPU (capacity mode).
        let slot = |d: &Device| parse_device(&d.name).map(|r| matches!(r, DeviceRef::Slot(..)));
        // A republish that changes the node's mode leaves the other mode's devices behind in
        // the older slices: those are not what its GPUs are like now.
        let mode = self.devices_listed_now().find_map(slot);
        let older = older
            .into_iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .filter(move |d| mode.is_none() || slot(d) == mode);
        let mut seen = BTreeSet::new();
        self.devices_listed_now()
            .chain(older)
            .filter(move |d| seen.insert(d.name.as_str()))
    }

    /// The devices its newest generation's slices list.
    fn devices_listed_now(&self) -> impl Iterator<Item = &'a Device> + '_ {
        self.slices
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
    }
}

/// gpuslice's pools in `slices` as Kubernetes' allocator gathers them
/// (k8s.io/dynamic-resource-allocation `structured`, `GatherPools`): per pool only the slices
/// of its newest generation (an older slice, still listed while the plugin replaces them one by
/// one, is out of date, and may list a device a newer one lists again); a pool whose newest
/// generation has fewer or more slices than its `resourceSliceCount` is incomplete, one that
/// lists a device twice invalid, and the allocator takes no device of either until the plugin
/// has finished. Only slices laid out as gpuslice's kubelet plugin publishes count (driver
/// `gpuslice.io`, on a node, in the pool named after it, under one of the pool's slice names).
/// Sorted by node.
pub fn plugin_pools(slices: &[ResourceSlice]) -> Vec<PluginPool<'_>> {
    let mut pools: BTreeMap<&str, PluginPool> = BTreeMap::new();
    for s in slices.iter().filter(|s| plugins_slice(s)) {
        let node = s.spec.pool.name.as_str();
        let generation = s.spec.pool.generation;
        let pool = pools.entry(node).or_insert_with(|| PluginPool {
            node,
            generation,
            slices: Vec::new(),
            older: Vec::new(),
            unusable: None,
        });
        if generation > pool.generation {
            pool.generation = generation;
            let out_of_date = std::mem::take(&mut pool.slices);
            pool.older.extend(out_of_date);
        }
        if generation == pool.generation {
            pool.slices.push(s);
        } else {
            pool.older.push(s);
        }
    }
    for pool in pools.values_mut() {
        let have = pool.slices.len();
        let counts: BTreeSet<i64> = pool
            .slices
            .iter()
            .map(|s| s.spec.pool.resource_slice_count)
            .collect();
        let complete = counts
            .iter()
            .all(|c| usize::try_from(*c).ok() == Some(have));
        pool.unusable = if !complete {
            Some(format!(
                "pool {} is incomplete: {have} of {} slice(s) of generation {} (the plugin is replacing them)",
                pool.node,
                counts
                    .iter()
                    .map(i64::to_string)
                    .collect::<Vec<_>>()
                    .join(" or "),
                pool.generation
            ))
        } else {
            let mut seen = BTreeSet::new();
            pool.slices
                .iter()
                .flat_map(|s| s.spec.devices.iter().flatten())
                .find(|d| !seen.insert(d.name.as_str()))
                .map(|d| {
                    format!(
                        "pool {} is invalid: generation {} lists device {} twice",
                        pool.node, pool.generation, d.name
                    )
                })
        };
        // A complete newest generation says all the pool lists: older slices still listed are
        // leftovers the plugin is deleting.
        if complete {
            pool.older.clear();
        }
    }
    pools.into_values().collect()
}

impl PublishedGpus {
    /// Reads what gpuslice's kubelet plugins publish, and only that: each pool's devices, each
    /// once as its newest slice listing it says ([`plugin_pools`], [`PluginPool::listed_devices`]:
    /// slices laid out as the plugin lays them out; a pool mid-republish included), devices `gpu-<i>` (capacity) or
    /// `gpu-<i>-slot-<j>` (slots). A node publishes one mode: a node whose devices mix both
    /// is left out. The cluster's mode is the one most nodes publish (a tie is capacity mode),
    /// so that one stray slice or device cannot turn it; the sizes (GPUs per node, GPU memory, per slot
    /// size the fewest slots a GPU of that size publishes) are those of the nodes publishing
    /// that mode (docs/webhook.md).
    pub fn from_slices(slices: &[ResourceSlice]) -> PublishedGpus {
        let mut capacity_nodes: BTreeMap<&str, NodeGpus> = BTreeMap::new();
        let mut slot_nodes: BTreeMap<&str, NodeGpus> = BTreeMap::new();
        for pool in plugin_pools(slices) {
            let node = pool.node;
            let mut n = NodeGpus::default();
            // A pool mid-republish still says what its GPUs are like: leaving it out, or its
            // slices not yet replaced, would turn the cluster's mode, or shrink its largest
            // node, for as long as the republish lasts.
            for d in pool.listed_devices() {
                let cap = |k: &str| {
                    d.capacity
                        .as_ref()
                        .and_then(|c| c.get(k))
                        .and_then(|c| parse_kube_quantity(&c.value.0).ok())
                };
                let memory = cap(CAP_MEMORY).unwrap_or(0);
                match parse_device(&d.name) {
                    Some(DeviceRef::Gpu(i)) => {
                        n.whole = true;
                        n.gpus.entry(i).or_default().0 = memory;
                    }
                    Some(DeviceRef::Slot(i, _)) => {
                        let gpu = n.gpus.entry(i).or_default();
                        gpu.0 += memory;
                        gpu.1 += 1;
                        let cores = cap(CAP_CORES).and_then(|c| u32::try_from(c).ok());
                        n.slots.push((memory, cores, i));
                    }
                    None => {}
                }
            }
            match (n.whole, n.slots.is_empty()) {
                (true, true) => {
                    capacity_nodes.insert(node, n);
                }
                (false, false) => {
                    slot_nodes.insert(node, n);
                }
                // Both kinds (not what one plugin publishes), or no GPU at all: no vote.
                _ => {}
            }
        }
        let slot_mode = slot_nodes.len() > capacity_nodes.len();
        let nodes = if slot_mode {
            slot_nodes
        } else {
            capacity_nodes
        };
        // slot bytes → (cores, per (node, GPU index) → slots)
        let mut slot_gpus: BTreeMap<u64, SlotsOfSize> = BTreeMap::new();
        for (node, n) in &nodes {
            for (memory, cores, index) in &n.slots {
                let size = slot_gpus
                    .entry(*memory)
                    .or_insert((*cores, BTreeMap::new()));
                *size.1.entry((node.to_string(), *index)).or_default() += 1;
            }
        }
        let mode = if slot_mode {
            Mode::Slots(
                slot_gpus
                    .into_iter()
                    .map(|(memory, (cores, per))| SlotSize {
                        memory,
                        cores,
                        per_gpu: per.values().copied().min().unwrap_or(1),
                    })
                    .collect(),
            )
        } else {
            Mode::Capacity
        };
        let memory: BTreeSet<u64> = nodes
            .values()
            .flat_map(|n| n.gpus.values().map(|(m, _)| *m))
            .filter(|m| *m > 0)
            .collect();
        PublishedGpus {
            mode,
            max_gpus_per_node: nodes
                .values()
                .map(|n| n.gpus.len() as u32)
                .max()
                .filter(|n| *n > 0),
            gpu_memory: memory.into_iter().collect(),
        }
    }
}

impl Mode {
    /// `capacity` or `slots (6 per GPU × 4Gi, 6 per GPU × 24064Mi)`, for the tools' views.
    pub fn describe(&self) -> String {
        match self {
            Mode::Capacity => "capacity".to_string(),
            Mode::Slots(sizes) => format!(
                "slots ({})",
                sizes
                    .iter()
                    .map(|s| format!("{} per GPU × {}", s.per_gpu, format_kube_quantity(s.memory)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

/// What a claim spec of [`claim_spec`]'s shape asks, read back (`None` when the spec is not of
/// that shape). Slot requests give their memory as slots × `mode`'s slot (`None` when `mode`
/// is not slot mode of one size); a prioritized list of slots (several slot sizes) gives the
/// least its subrequests hold, each slots × the size its selector names; a capacity request
/// with `count: N` (an older shape) is N GPUs.
pub fn shape_of(spec: &ResourceClaimSpec, mode: &Mode) -> Option<Shape> {
    let devices = spec.devices.as_ref()?;
    let requests = devices.requests.as_ref()?;
    let mut shape = Shape::default();
    for r in requests {
        if let Some(subs) = r.first_available.as_ref().filter(|s| !s.is_empty()) {
            let mut memory: Option<u64> = None;
            for sub in subs {
                if sub.device_class_name != SLOT_CLASS {
                    return None;
                }
                let count = u64::try_from(sub.count.unwrap_or(1)).ok()?;
                let size = sub
                    .selectors
                    .iter()
                    .flatten()
                    .filter_map(|s| s.cel.as_ref())
                    .find_map(|c| selected_size(&c.expression))?;
                let held = count.saturating_mul(size);
                memory = Some(memory.map_or(held, |m| m.min(held)));
            }
            shape.gpus += 1;
            shape.memory = memory;
            shape.selectors = subs[0]
                .selectors
                .iter()
                .flatten()
                .filter_map(|s| s.cel.as_ref())
                .filter(|c| selected_size(&c.expression).is_none())
                .map(|c| c.expression.clone())
                .collect();
            continue;
        }
        let e = r.exactly.as_ref()?;
        let count = u32::try_from(e.count.unwrap_or(1)).ok()?;
        let cap = e.capacity.as_ref().and_then(|c| c.requests.as_ref());
        let q = |k: &str| {
            cap.and_then(|c| c.get(k))
                .and_then(|q| parse_kube_quantity(&q.0).ok())
        };
        if e.device_class_name == DRIVER {
            shape.gpus += count;
            shape.memory = q(CAP_MEMORY);
            shape.cores = q(CAP_CORES).and_then(|c| u32::try_from(c).ok());
        } else if e.device_class_name == SLOT_CLASS && pinned_of(e).is_some() {
            // A whole GPU asked slot by slot: one GPU per slot 0, the rest of the selection
            // as written (without the pin and a size floor).
            if pinned_of(e) == Some(0) {
                shape.gpus += 1;
            }
            shape.memory = None;
            shape.selectors = e
                .selectors
                .iter()
                .flatten()
                .filter_map(|s| s.cel.as_ref())
                .map(|c| c.expression.as_str())
                .filter(|x| pinned_slot(x).is_none() && !x.starts_with(SIZE_FLOOR_PREFIX))
                .map(str::to_string)
                .collect();
            continue;
        } else if e.device_class_name == SLOT_CLASS {
            shape.gpus += 1;
            shape.memory = match mode {
                Mode::Slots(sizes) if sizes.len() == 1 => {
                    Some(u64::from(count).saturating_mul(sizes[0].memory))
                }
                _ => None,
            };
        } else {
            return None;
        }
        shape.selectors = e
            .selectors
            .iter()
            .flatten()
            .filter_map(|s| s.cel.as_ref().map(|c| c.expression.clone()))
            .collect();
    }
    if let Some(c) = devices
        .config
        .iter()
        .flatten()
        .filter_map(|c| c.opaque.as_ref())
        .filter(|o| o.driver == DRIVER)
        .find_map(|o| crate::opaque::opaque_cores(&o.parameters.0).ok())
    {
        shape.cores = Some(c);
    }
    (shape.gpus > 0).then_some(shape)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(mode: Mode, shape: &Shape) -> (serde_json::Value, Vec<String>) {
        let (s, w) = claim_spec(&mode, shape, "f").unwrap();
        (serde_json::to_value(s).unwrap(), w)
    }

    #[test]
    fn capacity_mode_asks_one_request_per_distinct_gpu() {
        let shape = Shape {
            gpus: 2,
            memory: Some(12000 << 20),
            cores: Some(30),
            selectors: vec![],
        };
        let (s, w) = spec(Mode::Capacity, &shape);
        assert!(w.is_empty(), "{w:?}");
        let cap = json!({"requests": {"cores": "30", "memory": "12000Mi"}});
        assert_eq!(
            s["devices"],
            json!({
                "requests": [
                    {"name": "gpu-0", "exactly": {"deviceClassName": "gpuslice.io", "count": 1, "capacity": cap}},
                    {"name": "gpu-1", "exactly": {"deviceClassName": "gpuslice.io", "count": 1, "capacity": cap}},
                ],
                "constraints": [{"requests": ["gpu-0", "gpu-1"], "distinctAttribute": "gpuslice.io/uuid"}],
            })
        );
    }

    #[test]
    fn a_whole_gpu_names_no_capacity_and_odd_bytes_round_up_with_a_warning() {
        let (s, w) = spec(
            Mode::Capacity,
            &Shape {
                gpus: 1,
                ..Default::default()
            },
        );
        assert_eq!(
            s["devices"],
            json!({"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpuslice.io", "count": 1}}]})
        );
        assert!(w.is_empty());
        let (s, w) = spec(
            Mode::Capacity,
            &Shape {
                gpus: 1,
                memory: Some((1 << 20) + 1),
                ..Default::default()
            },
        );
        assert_eq!(
            s["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["memory"],
            "2Mi"
        );
        assert_eq!(w.len(), 1, "{w:?}");
        // The last whole step is asked as it is; above it nothing rounds (a request of
        // nothing, were it to wrap): refused, naming the field and the bound.
        let max = u64::MAX / (1 << 20) * (1 << 20);
        for (gpus, memory) in [(1, max), (2, max)] {
            let shape = Shape {
                gpus,
                memory: Some(memory),
                ..Default::default()
            };
            assert!(claim_spec(&Mode::Capacity, &shape, "f").is_ok());
        }
        for memory in [max + 1, u64::MAX] {
            let shape = Shape {
                gpus: 1,
                memory: Some(memory),
                ..Default::default()
            };
            let e = claim_spec(&Mode::Capacity, &shape, "f").unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("f: memory of {memory} bytes is above 17592186044415Mi, the largest whole number of 1Mi steps a device is asked in; accepted: at most 17592186044415Mi")
            );
        }
    }

    #[test]
    fn slot_mode_counts_slots_of_one_gpu() {
        let slot = SlotSize {
            memory: 8 << 30,
            cores: None,
            per_gpu: 16,
        };
        let (s, w) = spec(
            Mode::Slots(vec![slot]),
            &Shape {
                gpus: 1,
                memory: Some(20 << 30),
                ..Default::default()
            },
        );
        assert_eq!(
            s["devices"],
            json!({
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "slots.gpuslice.io", "count": 3}}],
                "constraints": [{"requests": ["gpu"], "matchAttribute": "gpuslice.io/uuid"}],
            })
        );
        assert_eq!(
            w,
            ["f: memory 20Gi rounded up to 3 slot(s) = 24Gi per GPU"],
            "20Gi is not whole slots"
        );
        let err = claim_spec(
            &Mode::Slots(vec![slot]),
            &Shape {
                gpus: 1,
                memory: Some(200 << 30),
                ..Default::default()
            },
            "spec.containers[0].resources.limits[gpuslice.io/memory]",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("gpuslice.io/memory") && err.contains("at most 16 slots"),
            "{err}"
        );
    }

    #[test]
    fn several_gpus_in_slot_mode_are_whole_gpus_pinned_slot_by_slot() {
        let slot = SlotSize {
            memory: 4 << 30,
            cores: Some(16),
            per_gpu: 3,
        };
        let shape = Shape {
            gpus: 2,
            memory: Some(5 << 30),
            cores: Some(40),
            selectors: vec!["device.attributes[\"gpuslice.io\"].index < 4".into()],
        };
        let (s, w) = spec(Mode::Slots(vec![slot]), &shape);
        let user = json!({"cel": {"expression": "device.attributes[\"gpuslice.io\"].index < 4"}});
        let req = |g: u32, j: u32| {
            json!({"name": format!("gpu-{g}-slot-{j}"), "exactly": {
                "deviceClassName": "slots.gpuslice.io", "count": 1,
                "selectors": [{"cel": {"expression": format!("device.attributes[\"gpuslice.io\"].slot == {j}")}}, user.clone()]}})
        };
        assert_eq!(
            s["devices"]["requests"],
            json!([
                req(0, 0),
                req(0, 1),
                req(0, 2),
                req(1, 0),
                req(1, 1),
                req(1, 2)
            ]),
            "one request per slot, each pinned: one candidate per GPU"
        );
        assert_eq!(
            s["devices"]["constraints"],
            json!([
                {"requests": ["gpu-0-slot-0", "gpu-0-slot-1", "gpu-0-slot-2"], "matchAttribute": "gpuslice.io/uuid"},
                {"requests": ["gpu-1-slot-0", "gpu-1-slot-1", "gpu-1-slot-2"], "matchAttribute": "gpuslice.io/uuid"},
            ])
        );
        assert_eq!(
            s["devices"]["config"][0]["opaque"]["parameters"]["cores"],
            40
        );
        assert_eq!(
            w,
            ["f: in slot mode a slice of 2 GPUs takes each GPU whole (3 slots); memory 5Gi per GPU rounded up to the whole GPU"]
        );
        // Read back: 2 whole GPUs, the user's selection, the share.
        let (typed, _) = claim_spec(&Mode::Slots(vec![slot]), &shape, "f").unwrap();
        assert_eq!(
            shape_of(&typed, &Mode::Slots(vec![slot])),
            Some(Shape {
                memory: None,
                ..shape.clone()
            })
        );
        // Whole GPUs asked as such: no warning.
        let (_, w) = spec(
            Mode::Slots(vec![slot]),
            &Shape {
                gpus: 3,
                ..Default::default()
            },
        );
        assert!(w.is_empty(), "{w:?}");
        // More than a GPU per GPU: refused as before.
        let e = claim_spec(
            &Mode::Slots(vec![slot]),
            &Shape {
                gpus: 2,
                memory: Some(13 << 30),
                ..Default::default()
            },
            "f",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("at most 3 slots (12Gi) per GPU"), "{e}");
    }

    #[test]
    fn a_claim_never_asks_more_devices_than_kubernetes_allocates_to_one() {
        let six = SlotSize {
            memory: 24064 << 20,
            cores: None,
            per_gpu: 6,
        };
        // 5 whole GPUs of 6 slots are 30 devices; 6 would be 36, past 32.
        let five = Shape {
            gpus: 5,
            ..Default::default()
        };
        let (s, _) = spec(Mode::Slots(vec![six]), &five);
        assert_eq!(s["devices"]["requests"].as_array().map(Vec::len), Some(30));
        let e = claim_spec(
            &Mode::Slots(vec![six]),
            &Shape {
                gpus: 6,
                ..Default::default()
            },
            "f",
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "f: 6 GPUs × whole memory needs 36 slot devices in one claim; accepted: at most 32 (Kubernetes' limit of devices per claim), i.e. at most 5 whole GPUs of 6 slots in this cluster's slot mode"
        );
        // One GPU of 64 slots, whole: 64 devices.
        let tiny = SlotSize {
            memory: 1 << 30,
            cores: None,
            per_gpu: 64,
        };
        let e = claim_spec(
            &Mode::Slots(vec![tiny]),
            &Shape {
                gpus: 1,
                ..Default::default()
            },
            "f",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("needs 64 slot devices in one claim"), "{e}");
        // Uneven slot counts cannot be asked whole slot by slot.
        let e = claim_spec(&Mode::Slots(vec![six, tiny]), &five, "f")
            .unwrap_err()
            .to_string();
        assert!(e.contains("different slot counts (6, 64)"), "{e}");
    }

    #[test]
    fn whole_gpus_of_two_sizes_keep_to_the_sizes_that_hold_the_memory() {
        let l4 = SlotSize {
            memory: 4 << 30,
            cores: None,
            per_gpu: 6,
        };
        let h200 = SlotSize {
            memory: 24064 << 20,
            cores: None,
            per_gpu: 6,
        };
        let mode = Mode::Slots(vec![l4, h200]);
        let (s, w) = spec(
            mode.clone(),
            &Shape {
                gpus: 2,
                memory: Some(30 << 30),
                ..Default::default()
            },
        );
        assert_eq!(
            s["devices"]["requests"][0]["exactly"]["selectors"][1],
            json!({"cel": {"expression": "device.capacity[\"gpuslice.io\"].memory.compareTo(quantity(\"24064Mi\")) >= 0"}}),
            "30Gi is more than an L4"
        );
        assert_eq!(w.len(), 1, "{w:?}");
        let (typed, _) = claim_spec(
            &mode,
            &Shape {
                gpus: 2,
                memory: Some(30 << 30),
                ..Default::default()
            },
            "f",
        )
        .unwrap();
        assert_eq!(
            shape_of(&typed, &mode).map(|s| (s.gpus, s.selectors.len())),
            Some((2, 0))
        );
        // 20Gi fits both: no floor.
        let (s, _) = spec(
            mode,
            &Shape {
                gpus: 2,
                memory: Some(20 << 30),
                ..Default::default()
            },
        );
        assert_eq!(
            s["devices"]["requests"][0]["exactly"]["selectors"]
                .as_array()
                .map(Vec::len),
            Some(1)
        );
    }

    #[test]
    fn a_pods_containers_ask_together_as_kubernetes_counts_a_pod() {
        let one = |m: u64, cores: Option<u32>| Shape {
            gpus: 1,
            memory: Some(m),
            cores,
            selectors: vec![],
        };
        // 13 containers of 1Mi: one slice of 13Mi.
        let asks: Vec<_> = (0..13)
            .map(|i| (format!("spec.containers[{i}]"), one(1 << 20, None), false))
            .collect();
        let (s, w) = pod_shape(&asks).unwrap();
        assert_eq!(s, one(13 << 20, None));
        assert!(
            w.starts_with("spec.containers[0], spec.containers[1], ")
                && w.ends_with(
                    "in slot mode the containers of a pod share one slice, 1 GPU × 13Mi"
                ),
            "{w}"
        );
        // App containers add up, init containers take the largest, the pod the larger of both;
        // shares add up to at most 100.
        let (s, _) = pod_shape(&[
            ("a".into(), one(8 << 30, Some(60)), false),
            ("b".into(), one(4 << 30, Some(70)), false),
            ("i".into(), one(20 << 30, Some(10)), true),
            ("j".into(), one(2 << 30, Some(5)), true),
        ])
        .unwrap();
        assert_eq!(s, one(20 << 30, Some(100)));
        let (s, _) = pod_shape(&[
            ("a".into(), one(8 << 30, Some(20)), false),
            ("i".into(), one(2 << 30, Some(30)), true),
        ])
        .unwrap();
        assert_eq!(s, one(8 << 30, Some(30)));
        // A whole GPU makes the slice whole; GPUs are the most any asks.
        let (s, _) = pod_shape(&[
            (
                "a".into(),
                Shape {
                    gpus: 2,
                    memory: None,
                    ..Default::default()
                },
                false,
            ),
            ("b".into(), one(4 << 30, None), false),
        ])
        .unwrap();
        assert_eq!((s.gpus, s.memory), (2, None));
        // A container asking no share runs unthrottled on the shared slice, so the slice asks
        // none (as one asking the whole GPU's memory makes it whole), whichever container,
        // app, sidecar or init, asks it and in any order.
        for asks in [
            vec![
                ("a".into(), one(8 << 30, None), false),
                ("b".into(), one(1 << 30, Some(10)), false),
            ],
            vec![
                ("b".into(), one(1 << 30, Some(10)), false),
                ("a".into(), one(8 << 30, None), false),
            ],
            vec![
                ("a".into(), one(8 << 30, Some(10)), false),
                ("i".into(), one(1 << 30, None), true),
            ],
            vec![
                ("i".into(), one(1 << 30, Some(10)), true),
                ("j".into(), one(1 << 30, None), true),
                ("a".into(), one(8 << 30, Some(10)), false),
            ],
        ] {
            let (s, w) = pod_shape(&asks).unwrap();
            assert_eq!(s.cores, None, "{asks:?}");
            assert!(!w.contains("cores"), "{w}");
        }
        // One selection for the pod.
        let mut picky = one(1 << 20, None);
        picky.selectors = vec!["x".into()];
        let e = pod_shape(&[
            ("spec.containers[0]".into(), one(1 << 20, None), false),
            ("spec.containers[1]".into(), picky, false),
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("different GPUs (no selection and x)"), "{e}");
    }

    #[test]
    fn mixed_slot_sizes_ask_each_sizes_slots_best_fit_first() {
        // An L4 of 6 × 4Gi slots and an H200 of 6 × 23.5Gi slots.
        let l4 = SlotSize {
            memory: 4 << 30,
            cores: None,
            per_gpu: 6,
        };
        let h200 = SlotSize {
            memory: 24064 << 20,
            cores: None,
            per_gpu: 6,
        };
        let mode = Mode::Slots(vec![l4, h200]);
        let sel = |q: &str| json!({"cel": {"expression": format!("device.capacity[\"gpuslice.io\"].memory.compareTo(quantity(\"{q}\")) == 0")}});
        let eight = Shape {
            gpus: 1,
            memory: Some(8 << 30),
            cores: Some(20),
            selectors: vec!["device.attributes[\"gpuslice.io\"].index == 0".into()],
        };
        let (s, w) = spec(mode.clone(), &eight);
        let user = json!({"cel": {"expression": "device.attributes[\"gpuslice.io\"].index == 0"}});
        assert_eq!(
            s["devices"]["requests"],
            json!([{"name": "gpu", "firstAvailable": [
                {"name": "slots-0", "deviceClassName": "slots.gpuslice.io", "count": 2,
                 "selectors": [sel("4Gi"), user.clone()]},
                {"name": "slots-1", "deviceClassName": "slots.gpuslice.io", "count": 1,
                 "selectors": [sel("24064Mi"), user]},
            ]}]),
            "2 L4 slots waste nothing and come first; 1 H200 slot next"
        );
        assert_eq!(
            s["devices"]["constraints"],
            json!([{"requests": ["gpu"], "matchAttribute": "gpuslice.io/uuid"}])
        );
        assert_eq!(w.len(), 1, "the H200 rounds up: {w:?}");
        let (typed, _) = claim_spec(&mode, &eight, "f").unwrap();
        assert_eq!(shape_of(&typed, &mode), Some(eight.clone()));
        // 30Gi is above 6 × 4Gi: only the H200 subrequest, 2 of its slots.
        let thirty = Shape {
            gpus: 1,
            memory: Some(30 << 30),
            ..Default::default()
        };
        let (s, _) = spec(mode.clone(), &thirty);
        assert_eq!(
            s["devices"]["requests"][0]["firstAvailable"],
            json!([{"name": "slots-0", "deviceClassName": "slots.gpuslice.io", "count": 2,
                    "selectors": [sel("24064Mi")]}])
        );
        assert!(s["devices"]["requests"][0].get("exactly").is_none());
        // 20Gi: 5 L4 slots (20Gi) waste less than 1 H200 slot (23.5Gi).
        let (s, _) = spec(
            mode.clone(),
            &Shape {
                gpus: 1,
                memory: Some(20 << 30),
                ..Default::default()
            },
        );
        let counts: Vec<_> = s["devices"]["requests"][0]["firstAvailable"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["count"].clone())
            .collect();
        assert_eq!(counts, [json!(5), json!(1)]);
        // Above every GPU: refused naming the largest.
        let e = claim_spec(
            &mode,
            &Shape {
                gpus: 1,
                memory: Some(200 << 30),
                ..Default::default()
            },
            "f",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("at most 6 slots") && e.contains("(141Gi)"),
            "{e}"
        );
        // One size in the cluster keeps the plain form.
        let (s, _) = spec(Mode::Slots(vec![l4]), &eight);
        assert_eq!(s["devices"]["requests"][0]["exactly"]["count"], 2);
        assert!(s["devices"]["requests"][0].get("firstAvailable").is_none());
    }

    #[test]
    fn mixed_slot_slices_give_every_size() {
        let inv = PublishedGpus::from_slices(&[
            slice(
                "l4",
                json!([{"name": "gpu-0-slot-0", "capacity": {"memory": {"value": "4Gi"}}},
                       {"name": "gpu-0-slot-1", "capacity": {"memory": {"value": "4Gi"}}}]),
            ),
            slice(
                "h200",
                json!([{"name": "gpu-0-slot-0", "capacity": {"memory": {"value": "24064Mi"}}},
                       {"name": "gpu-0-slot-1", "capacity": {"memory": {"value": "24064Mi"}}},
                       {"name": "gpu-0-slot-2", "capacity": {"memory": {"value": "24064Mi"}}}]),
            ),
        ]);
        let size = |memory, per_gpu| SlotSize {
            memory,
            cores: None,
            per_gpu,
        };
        assert_eq!(
            inv.mode,
            Mode::Slots(vec![size(4 << 30, 2), size(24064 << 20, 3)])
        );
        assert_eq!(
            inv.mode.describe(),
            "slots (2 per GPU × 4Gi, 3 per GPU × 24064Mi)"
        );
    }

    #[test]
    fn the_same_shape_is_the_same_template_and_another_is_another() {
        let a = Shape {
            gpus: 1,
            memory: Some(20 << 30),
            ..Default::default()
        };
        let b = Shape {
            cores: Some(30),
            ..a.clone()
        };
        let t = |s: &Shape| template("ns", claim_spec(&Mode::Capacity, s, "f").unwrap().0);
        assert_eq!(t(&a).metadata.name, t(&a).metadata.name);
        assert_ne!(t(&a).metadata.name, t(&b).metadata.name);
        assert!(is_ours(&t(&a), &t(&a)));
        assert!(!is_ours(&t(&b), &t(&a)));
        let mut foreign = t(&a);
        foreign.metadata.labels = None;
        assert!(!is_ours(&foreign, &t(&a)), "a template without our label");
        // As stored: the API server's defaults added.
        let mut stored = serde_json::to_value(t(&a)).unwrap();
        stored["spec"]["spec"]["devices"]["requests"][0]["exactly"]["allocationMode"] =
            json!("ExactCount");
        let stored: ResourceClaimTemplate = serde_json::from_value(stored).unwrap();
        assert!(is_ours(&stored, &t(&a)), "defaults are not a difference");
        // The canonical form agrees: the stored one's is the written one's, another shape's
        // is another.
        assert_eq!(spec_form(&stored), spec_form(&t(&a)));
        assert_ne!(spec_form(&t(&b)), spec_form(&t(&a)));
        assert!(spec_form(&t(&a)).is_some());
    }

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
        let inv = PublishedGpus::from_slices(&[
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
        let inv = PublishedGpus::from_slices(&[slice(
            "a",
            json!([{"name": "gpu-0-slot-0", "capacity": {"memory": {"value": "8Gi"}}},
                   {"name": "gpu-0-slot-1", "capacity": {"memory": {"value": "8Gi"}}}]),
        )]);
        assert_eq!(
            inv.mode,
            Mode::Slots(vec![SlotSize {
                memory: 8 << 30,
                cores: None,
                per_gpu: 2
            }])
        );
        assert_eq!(inv.gpu_memory, vec![16 << 30]);
        assert_eq!(PublishedGpus::from_slices(&[]), PublishedGpus::default());
    }

    /// `slice(node, devices)` as a ResourceSlice of another name, node, pool or driver.
    fn stray(
        name: &str,
        node: Option<&str>,
        pool: &str,
        devices: serde_json::Value,
    ) -> ResourceSlice {
        let mut s = slice(pool, devices);
        s.metadata.name = Some(name.to_string());
        s.spec.node_name = node.map(str::to_string);
        s
    }

    #[test]
    fn one_stray_slot_device_does_not_turn_the_cluster_to_slot_mode() {
        let gpu = |n: &str| {
            slice(
                n,
                json!([{"name": "gpu-0", "capacity": {"memory": {"value": "80Gi"}}}]),
            )
        };
        let slot = json!([{"name": "gpu-0-slot-0", "capacity": {"memory": {"value": "1Mi"}}}]);
        // A slice not named as the plugin names them, one outside a node's pool, one of another
        // driver: none counts.
        let mut other_driver = slice("x", slot.clone());
        other_driver.spec.driver = "gpu.example.com".into();
        for s in [
            stray("evil", Some("a"), "a", slot.clone()),
            stray("b-gpuslice.io", None, "b", slot.clone()),
            stray("c-gpuslice.io", Some("d"), "c", slot.clone()),
            stray("e-gpuslice.io-1", Some("e"), "e", slot.clone()),
            other_driver,
        ] {
            let inv = PublishedGpus::from_slices(&[gpu("a"), s.clone()]);
            assert_eq!(inv.mode, Mode::Capacity, "{:?}", s.metadata.name);
            assert_eq!(inv.gpu_memory, vec![80 << 30], "{:?}", s.metadata.name);
        }
        // A slot device among a node's GPUs: that node mixes modes and has no vote.
        let mut mixed = gpu("a");
        mixed
            .spec
            .devices
            .as_mut()
            .unwrap()
            .extend(serde_json::from_value::<Vec<_>>(slot.clone()).unwrap());
        let inv = PublishedGpus::from_slices(&[mixed, gpu("b")]);
        assert_eq!(inv.mode, Mode::Capacity);
        assert_eq!(inv.max_gpus_per_node, Some(1));
        // A whole node of slots among two capacity nodes: the majority's mode, its sizes only.
        let inv = PublishedGpus::from_slices(&[gpu("a"), gpu("b"), slice("s", slot.clone())]);
        assert_eq!(inv.mode, Mode::Capacity);
        assert_eq!(inv.gpu_memory, vec![80 << 30]);
        // A tie is capacity mode; a majority of slot nodes is slot mode.
        let inv = PublishedGpus::from_slices(&[gpu("a"), slice("s", slot.clone())]);
        assert_eq!(inv.mode, Mode::Capacity);
        let inv = PublishedGpus::from_slices(&[
            gpu("a"),
            slice("s", slot.clone()),
            slice("t", slot.clone()),
        ]);
        assert!(matches!(inv.mode, Mode::Slots(_)), "{:?}", inv.mode);
        assert_eq!(inv.gpu_memory, vec![1 << 20]);
    }

    #[test]
    fn only_the_pools_newest_generation_and_its_slice_names_count() {
        let mut old = slice(
            "a",
            json!([{"name": "gpu-0-slot-0", "capacity": {"memory": {"value": "1Gi"}}}]),
        );
        old.metadata.name = Some("a-gpuslice.io-1".into());
        old.spec.pool.resource_slice_count = 2;
        let mut new = slice(
            "a",
            json!([{"name": "gpu-0", "capacity": {"memory": {"value": "80Gi"}}},
                   {"name": "gpu-1", "capacity": {"memory": {"value": "80Gi"}}}]),
        );
        new.spec.pool.generation = 2;
        let inv = PublishedGpus::from_slices(&[old.clone(), new]);
        assert_eq!(inv.mode, Mode::Capacity);
        assert_eq!(inv.max_gpus_per_node, Some(2));
        // The pool's second slice, of the same generation, counts.
        let first = slice(
            "a",
            json!([{"name": "gpu-0-slot-1", "capacity": {"memory": {"value": "1Gi"}}}]),
        );
        let mut second = old;
        second.spec.pool.resource_slice_count = 2;
        let mut first2 = first;
        first2.spec.pool.resource_slice_count = 2;
        let inv = PublishedGpus::from_slices(&[first2, second]);
        assert_eq!(
            inv.mode,
            Mode::Slots(vec![SlotSize {
                memory: 1 << 30,
                cores: None,
                per_gpu: 2
            }])
        );
        // A slice number past the pool's count is not the plugin's.
        assert_eq!(slice_number("a-gpuslice.io-01", "a"), None);
        assert_eq!(slice_number("a-gpuslice.io-3", "a"), Some(3));
        assert_eq!(slice_number("a-gpuslice.io", "a"), Some(0));
        assert_eq!(slice_number("ab-gpuslice.io", "a"), None);
    }

    /// `slice(node, devices)` as the pool's slice `n` of `count`, of `generation`.
    fn nth(
        node: &str,
        n: usize,
        count: i64,
        generation: i64,
        devices: serde_json::Value,
    ) -> ResourceSlice {
        let mut s = slice(node, devices);
        s.metadata.name = Some(crate::slices::slice_name(node, n));
        s.spec.pool.resource_slice_count = count;
        s.spec.pool.generation = generation;
        s
    }

    #[test]
    fn a_pool_counts_only_when_its_newest_generation_is_complete_as_the_scheduler_reads_it() {
        let gpu =
            |i: u32| json!({"name": format!("gpu-{i}"), "capacity": {"memory": {"value": "20Gi"}}});
        // Mid-republish of a pool of two slices: slice 0 already of generation 3 (gpu-0,
        // gpu-1: a device moved into it), slice 1 still of generation 2 (gpu-1 again).
        let mid = [
            nth("a", 0, 2, 3, json!([gpu(0), gpu(1)])),
            nth("a", 1, 2, 2, json!([gpu(1)])),
        ];
        let pools = plugin_pools(&mid);
        assert_eq!(pools.len(), 1);
        assert_eq!((pools[0].node, pools[0].generation), ("a", 3));
        assert_eq!(pools[0].slices.len(), 1, "the older slice is out of date");
        assert_eq!(
            pools[0].unusable.as_deref(),
            Some("pool a is incomplete: 1 of 2 slice(s) of generation 3 (the plugin is replacing them)")
        );
        assert_eq!(pools[0].devices().count(), 0, "the allocator takes none");
        // What the node's GPUs are like reads the same before, during and after a republish
        // (a device moved between slices, each once): the cluster's mode, its largest node and
        // the GPU sizes do not flicker.
        let before = [
            nth("a", 0, 2, 2, json!([gpu(0)])),
            nth("a", 1, 2, 2, json!([gpu(1), gpu(2)])),
        ];
        let mid = [
            nth("a", 0, 2, 3, json!([gpu(0), gpu(1)])),
            nth("a", 1, 2, 2, json!([gpu(1), gpu(2)])),
        ];
        let after = [
            nth("a", 0, 2, 3, json!([gpu(0), gpu(1)])),
            nth("a", 1, 2, 3, json!([gpu(2)])),
        ];
        let shape = PublishedGpus::from_slices(&before);
        assert_eq!(shape.max_gpus_per_node, Some(3));
        assert_eq!(PublishedGpus::from_slices(&mid), shape);
        assert_eq!(PublishedGpus::from_slices(&after), shape);
        assert_eq!(plugin_pools(&mid)[0].devices().count(), 0);
        // The same in slot mode: the mode and the slot size hold mid-republish.
        let slot = |g: u32, j: u32| json!({"name": format!("gpu-{g}-slot-{j}"), "capacity": {"memory": {"value": "4Gi"}}});
        let before = [
            nth("s", 0, 2, 5, json!([slot(0, 0), slot(0, 1)])),
            nth("s", 1, 2, 5, json!([slot(1, 0), slot(1, 1)])),
        ];
        let mid = [
            nth("s", 0, 2, 6, json!([slot(0, 0), slot(0, 1), slot(1, 0)])),
            nth("s", 1, 2, 5, json!([slot(1, 0), slot(1, 1)])),
        ];
        let shape = PublishedGpus::from_slices(&before);
        assert_eq!(
            shape.mode,
            Mode::Slots(vec![SlotSize {
                memory: 4 << 30,
                cores: None,
                per_gpu: 2
            }])
        );
        assert_eq!(PublishedGpus::from_slices(&mid), shape);
        // A republish turning the node to capacity mode: the slots left in the older slice are
        // not mixed in (a mixed node would have no say at all).
        let turning = [
            nth("s", 0, 2, 6, json!([gpu(0)])),
            nth("s", 1, 2, 5, json!([slot(1, 0), slot(1, 1)])),
        ];
        let shape = PublishedGpus::from_slices(&turning);
        assert_eq!(shape.mode, Mode::Capacity);
        assert_eq!(shape.max_gpus_per_node, Some(1));
        // Done: both slices of generation 3, each device once.
        let done = [
            nth("a", 0, 2, 3, json!([gpu(0), gpu(1)])),
            nth("a", 1, 2, 3, json!([gpu(2)])),
            nth("b", 0, 1, 7, json!([gpu(0)])),
        ];
        let pools = plugin_pools(&done);
        assert_eq!(pools.iter().map(|p| p.node).collect::<Vec<_>>(), ["a", "b"]);
        assert!(pools.iter().all(|p| p.unusable.is_none()), "{pools:?}");
        let names: Vec<&str> = pools[0].devices().map(|(_, d)| d.name.as_str()).collect();
        assert_eq!(names, ["gpu-0", "gpu-1", "gpu-2"]);
        assert_eq!(PublishedGpus::from_slices(&done).max_gpus_per_node, Some(3));
        // A device listed twice in the newest generation: invalid, none of its devices.
        let twice = [
            nth("a", 0, 2, 4, json!([gpu(0), gpu(1)])),
            nth("a", 1, 2, 4, json!([gpu(1)])),
        ];
        let pools = plugin_pools(&twice);
        assert_eq!(
            pools[0].unusable.as_deref(),
            Some("pool a is invalid: generation 4 lists device gpu-1 twice")
        );
        assert_eq!(pools[0].devices().count(), 0);
        // More slices of a generation than it says it has (counts that disagree) is incomplete.
        let odd = [
            nth("a", 0, 1, 5, json!([gpu(0)])),
            nth("a", 1, 2, 5, json!([gpu(1)])),
        ];
        assert!(plugin_pools(&odd)[0]
            .unusable
            .as_deref()
            .is_some_and(|u| u.starts_with("pool a is incomplete")));
    }

    #[test]
    fn a_slot_claims_share_travels_as_opaque_parameters_and_reads_back() {
        let slot = SlotSize {
            memory: 4 << 30,
            cores: Some(16),
            per_gpu: 6,
        };
        let shape = Shape {
            gpus: 1,
            memory: Some(8 << 30),
            cores: Some(30),
            selectors: vec![],
        };
        let (s, w) = claim_spec(&Mode::Slots(vec![slot]), &shape, "f").unwrap();
        assert!(w.is_empty(), "{w:?}");
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["devices"]["requests"][0]["exactly"]["count"], 2);
        assert_eq!(
            v["devices"]["config"],
            json!([{"opaque": {"driver": "gpuslice.io", "parameters": {"apiVersion": "gpuslice.io/v1", "kind": "SliceParameters", "cores": 30}}}])
        );
        assert_eq!(shape_of(&s, &Mode::Slots(vec![slot])), Some(shape.clone()));
        // Capacity mode reads back as written, and an older one-request `count: 2` as 2 GPUs.
        let cap = Shape {
            gpus: 2,
            ..shape.clone()
        };
        let (s, _) = claim_spec(&Mode::Capacity, &cap, "f").unwrap();
        assert_eq!(shape_of(&s, &Mode::Capacity), Some(cap));
        let old: ResourceClaimSpec = serde_json::from_value(json!({"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpuslice.io", "count": 2,
             "capacity": {"requests": {"memory": "20Gi"}}}}]}}))
        .unwrap();
        assert_eq!(
            shape_of(&old, &Mode::Capacity).map(|s| (s.gpus, s.memory)),
            Some((2, Some(20 << 30)))
        );
        assert_eq!(
            shape_of(&ResourceClaimSpec::default(), &Mode::Capacity),
            None
        );
        assert_eq!(
            UUID_ATTRIBUTE,
            format!("{DRIVER}/{}", crate::slices::ATTR_UUID)
        );
    }

    #[test]
    fn a_writer_names_and_labels_its_templates_and_knows_them_again() {
        let spec = claim_spec(
            &Mode::Capacity,
            &Shape {
                gpus: 1,
                ..Default::default()
            },
            "f",
        )
        .unwrap()
        .0;
        let tool = Writer {
            manager: "kubectl-gpuslice".into(),
            prefix: "web-deployment-gpuslice-".into(),
            annotations: BTreeMap::from([("gpuslice.io/workload".into(), "deployment/web".into())]),
        };
        let t = template_by(&tool, "ml", spec.clone());
        let name = t.metadata.name.clone().unwrap();
        assert!(
            name.starts_with("web-deployment-gpuslice-") && name.len() == 24 + 16,
            "{name}"
        );
        assert_eq!(
            template("ml", spec.clone()).spec,
            t.spec,
            "the webhook's template holds the same claim"
        );
        assert!(written_by(&t, &tool) && is_ours(&t, &t));
        let other = Writer {
            annotations: BTreeMap::from([("gpuslice.io/workload".into(), "deployment/api".into())]),
            ..tool.clone()
        };
        assert!(!written_by(&t, &other) && !written_by(&t, &Writer::webhook()));
        assert!(!is_ours(&t, &template_by(&other, "ml", spec.clone())));
        assert!(!is_ours(&t, &template("ml", spec.clone())));
        let long = Writer {
            prefix: "a".repeat(300),
            ..tool
        };
        assert_eq!(
            template_by(&long, "ml", spec).metadata.name.unwrap().len(),
            253
        );
    }
}
