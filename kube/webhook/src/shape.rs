//! The one construction of a slice's claim from what was asked (GPUs, memory per GPU, compute
//! share, device selectors) for the cluster's publication mode, so that every front end that
//! writes claims (the webhook, and any other that asks for the same shape) writes the same
//! ResourceClaimTemplate under the same name.

use std::collections::BTreeMap;

use gpuslice_config::format_kube_quantity;
use gpuslice_kube::slices::{CAP_CORES, CAP_MEMORY, MEMORY_STEP};
use gpuslice_kube::DRIVER;
use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, CapacityRequirements, DeviceClaim, DeviceConstraint, DeviceRequest,
    DeviceSelector, ExactDeviceRequest, ResourceClaimSpec, ResourceClaimTemplate,
    ResourceClaimTemplateSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The label every template the webhook writes carries, and the only templates it reuses.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "gpuslice-webhook");
/// The DeviceClass of slot mode's devices.
pub const SLOT_CLASS: &str = "slots.gpuslice.io";
/// The fully qualified attribute that names a GPU (distinct GPUs, slots of one GPU).
pub const UUID_ATTRIBUTE: &str = "gpuslice.io/uuid";
/// Prefix of the templates' names (a hash of the claim spec follows).
pub const TEMPLATE_PREFIX: &str = "gpuslice-";

/// How the cluster's DRA plugin publishes its GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One shared device per GPU whose `memory` and `cores` claims consume.
    Capacity,
    /// N unshared slot devices per GPU (`gpu-<i>-slot-<j>`), of class `slots.gpuslice.io`.
    Slots(SlotSize),
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
    #[error("{field}: {value} GPUs; accepted: at least 1")]
    NoGpu { field: String, value: String },
}

/// The claim spec of `shape` in `mode`, and what was rounded or ignored on the way (one line
/// each, for admission warnings). `field` names where the request came from, for messages.
pub fn claim_spec(
    mode: Mode,
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
    let (class, count, capacity) = match mode {
        Mode::Capacity => {
            let mut req = BTreeMap::new();
            if let Some(m) = shape.memory {
                let rounded = m.div_ceil(MEMORY_STEP) * MEMORY_STEP;
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
        Mode::Slots(slot) => {
            let by_memory = shape
                .memory
                .map_or(u64::from(slot.per_gpu), |m| m.div_ceil(slot.memory.max(1)));
            let by_cores = match (shape.cores.filter(|c| *c > 0), slot.cores) {
                (Some(c), Some(per)) => u64::from(c).div_ceil(u64::from(per.max(1))),
                _ => 0,
            };
            let k = by_memory.max(by_cores).max(1);
            if k > u64::from(slot.per_gpu) {
                return Err(ShapeError::TooManySlots {
                    field: field.to_string(),
                    value: describe(shape),
                    slots: k,
                    slot: format_kube_quantity(slot.memory),
                    per_gpu: slot.per_gpu,
                    max: format_kube_quantity(slot.memory.saturating_mul(u64::from(slot.per_gpu))),
                });
            }
            if let Some(m) = shape.memory {
                let got = k.saturating_mul(slot.memory);
                if got != m {
                    warnings.push(format!(
                        "{field}: memory {} rounded up to {k} slot(s) = {} per GPU",
                        format_kube_quantity(m),
                        format_kube_quantity(got)
                    ));
                }
            }
            if shape.cores.is_some_and(|c| c > 0) && slot.cores.is_none() {
                warnings.push(format!(
                    "{field}: the compute share is ignored (this cluster's slots carry none)"
                ));
            }
            (SLOT_CLASS, k as i64, None)
        }
    };
    let requests = names
        .iter()
        .map(|name| DeviceRequest {
            name: name.clone(),
            exactly: Some(ExactDeviceRequest {
                device_class_name: class.to_string(),
                count: Some(count),
                capacity: capacity.clone(),
                selectors: selectors.clone(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .collect();
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
        match mode {
            Mode::Capacity => constraints.push(DeviceConstraint {
                requests: Some(names.clone()),
                distinct_attribute: Some(UUID_ATTRIBUTE.to_string()),
                ..Default::default()
            }),
            Mode::Slots(_) => warnings.push(format!(
                "{field}: in slot mode the scheduler cannot keep the {} GPUs' slots apart; two may land on one GPU",
                names.len()
            )),
        }
    }
    Ok((
        ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(requests),
                constraints: (!constraints.is_empty()).then_some(constraints),
                ..Default::default()
            }),
        },
        warnings,
    ))
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

/// The template holding `spec`: named after a hash of the spec (a template's spec cannot
/// change, so the same shape is the same template and another shape another one), in
/// `namespace`, labelled as the webhook's.
pub fn template(namespace: &str, spec: ResourceClaimSpec) -> ResourceClaimTemplate {
    // Serialising a typed spec cannot fail (no maps with non-string keys).
    let canonical = serde_json::to_vec(&spec).unwrap_or_default();
    let name = format!("{TEMPLATE_PREFIX}{:016x}", fnv64(&canonical));
    ResourceClaimTemplate {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([(
                MANAGED_BY.0.to_string(),
                MANAGED_BY.1.to_string(),
            )])),
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

/// Whether `t` is a template the webhook wrote, with `want`'s spec (as the API server stores
/// it: with its defaults added).
pub fn is_ours(t: &ResourceClaimTemplate, want: &ResourceClaimTemplate) -> bool {
    let labelled = t
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_BY.0))
        .is_some_and(|v| v == MANAGED_BY.1);
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(mode: Mode, shape: &Shape) -> (serde_json::Value, Vec<String>) {
        let (s, w) = claim_spec(mode, shape, "f").unwrap();
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
    }

    #[test]
    fn slot_mode_counts_slots_of_one_gpu() {
        let slot = SlotSize {
            memory: 8 << 30,
            cores: None,
            per_gpu: 16,
        };
        let (s, w) = spec(
            Mode::Slots(slot),
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
        assert_eq!(w.len(), 1, "20Gi is not whole slots: {w:?}");
        let err = claim_spec(
            Mode::Slots(slot),
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
        let t = |s: &Shape| template("ns", claim_spec(Mode::Capacity, s, "f").unwrap().0);
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
    }
}
