//! What one container's limits ask for: gpuslice's own `gpuslice.io/{gpus,memory,cores}`
//! (the annotations' meaning and bounds) or HAMi's `nvidia.com/*` with its selection
//! annotations, validated against what the cluster publishes, as one [`Shape`]; and what
//! cannot be expressed, as one line naming the field, the value and what is accepted.

use std::collections::BTreeMap;

use gpuslice_config::quantity::ACCEPTED_QUANTITY;
use gpuslice_config::{
    format_kube_quantity, is_gpu_uuid, parse_kube_quantity, parse_quantity, Quantity,
};
use gpuslice_registry::MAX_GPUS;

use gpuslice_dra::claim_shape::PublishedGpus;
use gpuslice_dra::claim_shape::Shape;

/// gpuslice's limit names.
pub const GPUS: &str = gpuslice_dra::claim_shape::LIMIT_GPUS;
pub const MEMORY: &str = gpuslice_dra::claim_shape::LIMIT_MEMORY;
pub const CORES: &str = gpuslice_dra::claim_shape::LIMIT_CORES;
const OURS: &[&str] = &[GPUS, MEMORY, CORES];

/// HAMi's limit names (in namespaces labelled for HAMi compatibility).
pub const HAMI_GPU: &str = "nvidia.com/gpu";
pub const HAMI_MEM: &str = "nvidia.com/gpumem";
pub const HAMI_MEM_PERCENT: &str = "nvidia.com/gpumem-percentage";
pub const HAMI_CORES: &str = "nvidia.com/gpucores";
/// HAMi's task priority: no equivalent, removed with a warning.
pub const HAMI_PRIORITY: &str = "nvidia.com/priority";
const HAMI: &[&str] = &[
    HAMI_GPU,
    HAMI_MEM,
    HAMI_MEM_PERCENT,
    HAMI_CORES,
    HAMI_PRIORITY,
];

/// HAMi's selection annotations, turned into CEL selectors.
pub const USE_TYPE: &str = "nvidia.com/use-gputype";
pub const NOUSE_TYPE: &str = "nvidia.com/nouse-gputype";
pub const USE_UUID: &str = "nvidia.com/use-gpuuuid";
pub const NOUSE_UUID: &str = "nvidia.com/nouse-gpuuuid";
/// HAMi annotations with no gpuslice equivalent: admitted, with a warning that says so.
const HAMI_IGNORED: &[&str] = &[
    "hami.io/node-scheduler-policy",
    "hami.io/gpu-scheduler-policy",
    "nvidia.com/vgpu-mode",
];

/// A request the webhook refuses: one line naming the field, the value and what is accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AskError {
    #[error("{field}: value {value:?} is not accepted; expected {accepted}")]
    Value {
        field: String,
        value: String,
        accepted: String,
    },
    /// A value refused for a reason its parser gives (a quantity's unit, its size).
    #[error("{field}: value {value:?} is not accepted ({reason}); expected {accepted}")]
    Refused {
        field: String,
        value: String,
        reason: String,
        accepted: String,
    },
    #[error("{container}: limits name both gpuslice.io/* and nvidia.com/* GPU resources; accepted: one of the two forms per container")]
    Mixed { container: String },
    #[error("{field}: {key} is not a gpuslice limit; accepted: {}", OURS.join(", "))]
    UnknownLimit { field: String, key: String },
}

fn bad(field: &str, value: &str, accepted: impl Into<String>) -> AskError {
    AskError::Value {
        field: field.to_string(),
        value: value.to_string(),
        accepted: accepted.into(),
    }
}

/// One container's request, found in its limits (or requests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    /// The slice asked for; `None`: no GPU (HAMi's `nvidia.com/gpu: 0`, or
    /// `nvidia.com/priority` alone), so the names are removed and nothing is claimed.
    pub shape: Option<Shape>,
    /// The resource names to remove from the container's limits and requests.
    pub remove: Vec<String>,
    /// What was ignored or rounded, one line each.
    pub warnings: Vec<String>,
    /// Where it came from (`spec.containers[0]`), for messages.
    pub field: String,
}

/// The selection HAMi's pod annotations ask for, as CEL expressions on the GPU's attributes,
/// and warnings for HAMi annotations that have no equivalent.
pub fn hami_selectors(
    ann: &BTreeMap<String, String>,
) -> Result<(Vec<String>, Vec<String>), AskError> {
    let mut selectors = Vec::new();
    let mut warnings = Vec::new();
    for (key, negate, uuid) in [
        (USE_TYPE, false, false),
        (NOUSE_TYPE, true, false),
        (USE_UUID, false, true),
        (NOUSE_UUID, true, true),
    ] {
        let Some(v) = ann.get(key) else { continue };
        let field = format!("metadata.annotations[{key}]");
        let items: Vec<&str> = v
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        if items.is_empty() || items.len() > 16 {
            return Err(bad(&field, v, "1 to 16 values separated by commas"));
        }
        let expr = if uuid {
            for u in &items {
                if !is_gpu_uuid(u) {
                    return Err(bad(
                        &field,
                        v,
                        "GPU UUIDs (`GPU-` and 36 hexadecimal digits and dashes) separated by commas",
                    ));
                }
            }
            let list = items
                .iter()
                .map(|u| format!("\"{u}\""))
                .collect::<Vec<_>>()
                .join(", ");
            format!("device.attributes[\"gpuslice.io\"].uuid in [{list}]")
        } else {
            for t in &items {
                if t.len() > 64
                    || !t
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b" ._-".contains(&b))
                {
                    return Err(bad(
                        &field,
                        v,
                        "parts of GPU model names (letters, digits, space, `.`, `_`, `-`; at most 64 each) separated by commas",
                    ));
                }
            }
            // HAMi matches a type as a case-insensitive part of the model name.
            let list = items
                .iter()
                .map(|t| format!("\"{}\"", t.to_ascii_lowercase()))
                .collect::<Vec<_>>()
                .join(", ");
            format!("[{list}].exists(t, device.attributes[\"gpuslice.io\"].productName.lowerAscii().contains(t))")
        };
        selectors.push(if negate { format!("!({expr})") } else { expr });
    }
    for key in HAMI_IGNORED {
        if let Some(v) = ann.get(*key) {
            warnings.push(format!(
                "metadata.annotations[{key}]={v:?} ignored: gpuslice has no equivalent (the scheduler places by free capacity)"
            ));
        }
    }
    Ok((selectors, warnings))
}

/// A whole number from `lo` to `hi`, in any spelling the API server stores a quantity in: it
/// writes the limit `3000` back as `3k` before any webhook sees it. A refusal keeps the
/// quantity parser's reason (`1.5`, `100m`: not a whole number; `-1`: negative), or says the
/// number is out of range.
fn whole(field: &str, v: &str, lo: u32, hi: u32, accepted: &str) -> Result<u32, AskError> {
    let reason = match parse_kube_quantity(v) {
        Ok(n) => match u32::try_from(n) {
            Ok(n) if (lo..=hi).contains(&n) => return Ok(n),
            _ => format!("{n} is out of range"),
        },
        Err(e) => e.detail.to_string(),
    };
    Err(AskError::Refused {
        field: field.to_string(),
        value: v.to_string(),
        reason,
        accepted: accepted.to_string(),
    })
}

/// The value of `key` in the container's limits, else its requests (an extended resource's
/// request must equal its limit, so either names the request), with its field path.
fn lookup<'a>(
    path: &str,
    limits: &'a BTreeMap<String, String>,
    requests: &'a BTreeMap<String, String>,
    key: &str,
) -> Option<(String, &'a str)> {
    if let Some(v) = limits.get(key) {
        return Some((format!("{path}.resources.limits[{key}]"), v.as_str()));
    }
    requests
        .get(key)
        .map(|v| (format!("{path}.resources.requests[{key}]"), v.as_str()))
}

/// What the container at `path` (`spec.containers[0]`) asks for through its limits and
/// requests; `hami`: HAMi's names count too (the namespace is labelled and the webhook runs
/// with `--hami-compat`), with the pod's `selectors` from [`hami_selectors`].
pub fn container_ask(
    path: &str,
    limits: &BTreeMap<String, String>,
    requests: &BTreeMap<String, String>,
    hami: Option<&[String]>,
    inventory: &PublishedGpus,
) -> Result<Option<Ask>, AskError> {
    let names = || limits.keys().chain(requests.keys());
    let ours = names().any(|k| k.starts_with("gpuslice.io/"));
    let theirs = hami.is_some() && names().any(|k| HAMI.contains(&k.as_str()));
    match (ours, theirs) {
        (false, false) => Ok(None),
        (true, true) => Err(AskError::Mixed {
            container: path.to_string(),
        }),
        (true, false) => ours_ask(path, limits, requests, inventory).map(Some),
        (false, true) => {
            hami_ask(path, limits, requests, hami.unwrap_or_default(), inventory).map(Some)
        }
    }
}

fn removed(
    limits: &BTreeMap<String, String>,
    requests: &BTreeMap<String, String>,
    keys: &[&str],
) -> Vec<String> {
    let mut v: Vec<String> = limits
        .keys()
        .chain(requests.keys())
        .filter(|k| keys.contains(&k.as_str()))
        .cloned()
        .collect();
    v.sort();
    v.dedup();
    v
}

fn ours_ask(
    path: &str,
    limits: &BTreeMap<String, String>,
    requests: &BTreeMap<String, String>,
    inventory: &PublishedGpus,
) -> Result<Ask, AskError> {
    for key in limits.keys().chain(requests.keys()) {
        if key.starts_with("gpuslice.io/") && !OURS.contains(&key.as_str()) {
            return Err(AskError::UnknownLimit {
                field: format!("{path}.resources"),
                key: key.clone(),
            });
        }
    }
    let warnings = Vec::new();
    let gpus = match lookup(path, limits, requests, GPUS) {
        Some((f, v)) => whole(
            &f,
            v,
            1,
            MAX_GPUS,
            &format!("a whole number of GPUs from 1 to {MAX_GPUS}"),
        )?,
        None => 1,
    };
    let memory = match lookup(path, limits, requests, MEMORY) {
        Some((f, v)) => {
            let q = parse_quantity(v).map_err(|e| AskError::Refused {
                field: f.clone(),
                value: v.to_string(),
                reason: e.reason(),
                accepted: ACCEPTED_QUANTITY.to_string(),
            })?;
            if q == Quantity::Bytes(0) {
                return Err(bad(
                    &f,
                    v,
                    format!("more than 0 bytes: {ACCEPTED_QUANTITY}"),
                ));
            }
            let bytes = resolve(&f, v, q, inventory)?;
            fits_a_gpu(&f, v, bytes, inventory, format_kube_quantity)?;
            Some(bytes)
        }
        None => None,
    };
    let cores = match lookup(path, limits, requests, CORES) {
        Some((f, v)) => Some(whole(
            &f,
            v,
            1,
            100,
            "a compute share in percent from 1 to 100 (`30`)",
        )?),
        None => None,
    };
    let shape = Shape {
        gpus,
        memory,
        cores,
        selectors: Vec::new(),
    };
    check_fits(path, &shape, inventory, GPUS)?;
    Ok(Ask {
        shape: Some(shape),
        remove: removed(limits, requests, OURS),
        warnings,
        field: path.to_string(),
    })
}

fn hami_ask(
    path: &str,
    limits: &BTreeMap<String, String>,
    requests: &BTreeMap<String, String>,
    selectors: &[String],
    inventory: &PublishedGpus,
) -> Result<Ask, AskError> {
    let mut warnings = Vec::new();
    if let Some((f, v)) = lookup(path, limits, requests, HAMI_PRIORITY) {
        warnings.push(format!("{f}={v} removed: gpuslice has no task priority"));
    }
    let remove = removed(limits, requests, HAMI);
    let mem = lookup(path, limits, requests, HAMI_MEM);
    let pct = lookup(path, limits, requests, HAMI_MEM_PERCENT);
    let core = lookup(path, limits, requests, HAMI_CORES);
    // As HAMi reads a container: nvidia.com/gpu names the GPUs, 0 none at all; without it a
    // memory or cores limit asks for one GPU, and nvidia.com/priority alone for none.
    let gpus = match lookup(path, limits, requests, HAMI_GPU) {
        Some((f, v)) => whole(
            &f,
            v,
            0,
            MAX_GPUS,
            &format!("a whole number of GPUs from 0 (none) to {MAX_GPUS}"),
        )
        .map(|n| (n, Some(f)))?,
        None if mem.is_some() || pct.is_some() || core.is_some() => (1, None),
        None => (0, None),
    };
    let gpus = match gpus {
        (0, field) => {
            if let Some(f) = field {
                warnings.push(format!(
                    "{f}=0 asks for no GPU (as HAMi reads it): the container gets none and its nvidia.com/* limits are removed"
                ));
            }
            return Ok(Ask {
                shape: None,
                remove,
                warnings,
                field: path.to_string(),
            });
        }
        (n, _) => n,
    };
    let memory = match (mem, pct) {
        (Some((f, v)), Some(_)) => {
            return Err(bad(
                &f,
                v,
                format!("one of {HAMI_MEM} (MiB per GPU) or {HAMI_MEM_PERCENT}, not both"),
            ))
        }
        (Some((f, v)), None) => {
            let mib = whole(
                &f,
                v,
                0,
                999_999,
                "a whole number of MiB per GPU (`12000`; 0 for the whole GPU)",
            )?;
            let bytes = u64::from(mib) << 20;
            fits_a_gpu(&f, v, bytes, inventory, |b| format!("{} (MiB)", b >> 20))?;
            (mib > 0).then_some(bytes)
        }
        (None, Some((f, v))) => {
            let p = whole(
                &f,
                v,
                1,
                100,
                "a percentage of each GPU's memory from 1 to 100",
            )?;
            let q = Quantity::Percent(p as u8);
            Some(resolve(&f, v, q, inventory)?)
        }
        (None, None) => None,
    };
    let cores = match core {
        Some((f, v)) => Some(whole(
            &f,
            v,
            0,
            100,
            "a compute share in percent from 0 to 100 (`30`)",
        )?)
        .filter(|c| *c > 0),
        None => None,
    };
    let shape = Shape {
        gpus,
        memory,
        cores,
        selectors: selectors.to_vec(),
    };
    check_fits(path, &shape, inventory, HAMI_GPU)?;
    Ok(Ask {
        shape: Some(shape),
        remove,
        warnings,
        field: path.to_string(),
    })
}

/// Whether a claim of shape `big` gives a container asking for `small` all it asks: the same
/// GPUs and selection, at least its memory (`None`: the whole GPU) and compute share (`None`:
/// not throttled).
pub fn covers(big: &Shape, small: &Shape) -> bool {
    let at_least = |b: Option<u64>, s: Option<u64>| match (b, s) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(b), Some(s)) => b >= s,
    };
    big.gpus == small.gpus
        && big.selectors == small.selectors
        && at_least(big.memory, small.memory)
        && at_least(big.cores.map(u64::from), small.cores.map(u64::from))
}

/// A percentage in bytes: exact when every published GPU has the same memory.
fn resolve(
    field: &str,
    value: &str,
    q: Quantity,
    inventory: &PublishedGpus,
) -> Result<u64, AskError> {
    match q {
        Quantity::Bytes(b) => Ok(b),
        Quantity::Percent(p) => match inventory.gpu_memory.as_slice() {
            [one] => Ok(q.resolve(*one)),
            [] => Err(bad(
                field,
                value,
                format!("an amount of memory: no GPU is published yet to take {p}% of"),
            )),
            many => Err(bad(
                field,
                value,
                format!(
                    "an amount of memory: the cluster's GPUs differ in memory ({}), so {p}% names no one size",
                    many.iter()
                        .map(|m| format_kube_quantity(*m))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )),
        },
    }
}

/// Refuses memory per GPU (`bytes`, field `f` written `v`) that no GPU of the cluster has
/// (checked only against GPUs published); the bound is said as `unit` writes it, in the
/// field's own unit.
fn fits_a_gpu(
    f: &str,
    v: &str,
    bytes: u64,
    inventory: &PublishedGpus,
    unit: fn(u64) -> String,
) -> Result<(), AskError> {
    match inventory.gpu_memory.iter().max() {
        Some(largest) if bytes > *largest => Err(bad(
            f,
            v,
            format!(
                "at most {} per GPU: no GPU of the cluster has more",
                unit(*largest)
            ),
        )),
        _ => Ok(()),
    }
}

/// Refuses what no node of the cluster can hold: more GPUs than any node has (checked only
/// against GPUs published).
fn check_fits(
    path: &str,
    shape: &Shape,
    inventory: &PublishedGpus,
    gpus_key: &str,
) -> Result<(), AskError> {
    if let Some(max) = inventory.max_gpus_per_node {
        if shape.gpus > max {
            return Err(bad(
                &format!("{path}.resources.limits[{gpus_key}]"),
                &shape.gpus.to_string(),
                format!("at most {max} GPUs: no node of the cluster has more"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn inv() -> PublishedGpus {
        PublishedGpus {
            max_gpus_per_node: Some(2),
            gpu_memory: vec![141 << 30],
            ..PublishedGpus::default()
        }
    }

    #[test]
    fn hami_limits_map_to_a_shape() {
        let a = container_ask(
            "spec.containers[0]",
            &map(&[(HAMI_GPU, "2"), (HAMI_MEM, "12000"), (HAMI_CORES, "30")]),
            &map(&[]),
            Some(&[]),
            &inv(),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            a.shape,
            Some(Shape {
                gpus: 2,
                memory: Some(12000 << 20),
                cores: Some(30),
                selectors: vec![]
            })
        );
        assert_eq!(a.remove, vec![HAMI_GPU, HAMI_CORES, HAMI_MEM]);
    }

    #[test]
    fn whole_numbers_are_read_as_the_api_server_writes_them() {
        // The API server stores the limit `3000` as `3k` before admission.
        let a = container_ask(
            "c",
            &map(&[(HAMI_MEM, "3k"), (HAMI_GPU, "2")]),
            &map(&[]),
            Some(&[]),
            &inv(),
        )
        .unwrap()
        .unwrap();
        assert_eq!(a.shape.unwrap().memory, Some(3000 << 20));
    }

    #[test]
    fn hami_names_are_left_alone_without_compat() {
        let a = container_ask(
            "spec.containers[0]",
            &map(&[(HAMI_GPU, "1")]),
            &map(&[]),
            None,
            &inv(),
        )
        .unwrap();
        assert_eq!(a, None);
    }

    #[test]
    fn percentages_resolve_against_one_gpu_size_only() {
        let a = container_ask(
            "c",
            &map(&[(HAMI_MEM_PERCENT, "50")]),
            &map(&[]),
            Some(&[]),
            &inv(),
        )
        .unwrap()
        .unwrap();
        assert_eq!(a.shape.unwrap().memory, Some((141u64 << 30) / 2));
        let two = PublishedGpus {
            gpu_memory: vec![80 << 30, 141 << 30],
            ..inv()
        };
        let e = container_ask(
            "c",
            &map(&[(HAMI_MEM_PERCENT, "50")]),
            &map(&[]),
            Some(&[]),
            &two,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("80Gi, 141Gi"), "{e}");
    }

    #[test]
    fn bad_values_name_field_value_and_accepted() {
        for (limits, want) in [
            (
                vec![(GPUS, "0")],
                "limits[gpuslice.io/gpus]: value \"0\" is not accepted (0 is out of range); expected a whole number of GPUs from 1 to 16",
            ),
            (
                vec![(GPUS, "1.5")],
                "limits[gpuslice.io/gpus]: value \"1.5\" is not accepted (not a whole number); expected a whole number of GPUs from 1 to 16",
            ),
            (
                vec![(GPUS, "100m")],
                "limits[gpuslice.io/gpus]: value \"100m\" is not accepted (not a whole number); expected",
            ),
            (
                vec![(GPUS, "-1")],
                "limits[gpuslice.io/gpus]: value \"-1\" is not accepted (negative); expected",
            ),
            (vec![(GPUS, "two")], "(no digits); expected"),
            (vec![(GPUS, "1x")], "(unknown suffix); expected"),
            (
                vec![(CORES, "30.5")],
                "limits[gpuslice.io/cores]: value \"30.5\" is not accepted (not a whole number); expected a compute share in percent from 1 to 100",
            ),
            (vec![(CORES, "-30")], "(negative); expected a compute share"),
            (vec![(CORES, "5k")], "(5000 is out of range); expected"),
            (vec![(HAMI_GPU, "0.5")], "(not a whole number); expected"),
            (vec![(GPUS, "3")], "at most 2 GPUs"),
            (
                vec![(MEMORY, "100m")],
                "limits[gpuslice.io/memory]: value \"100m\" is not accepted (unit `m` is Kubernetes' milli",
            ),
            (vec![(MEMORY, "16Ei")], "(too large, more than 2^64-1 bytes)"),
            (vec![(MEMORY, "0.5")], "(not a whole number of bytes)"),
            (
                vec![(MEMORY, "200Gi")],
                "limits[gpuslice.io/memory]: value \"200Gi\" is not accepted; expected at most 141Gi per GPU",
            ),
            // As written, and the bound in the field's own unit.
            (
                vec![(HAMI_MEM, "200000")],
                "limits[nvidia.com/gpumem]: value \"200000\" is not accepted; expected at most 144384 (MiB) per GPU",
            ),
            (vec![(CORES, "101")], "(101 is out of range); expected a compute share in percent from 1 to 100"),
            (vec![("gpuslice.io/gpu-type", "1")], "not a gpuslice limit"),
            (
                vec![(GPUS, "1"), (HAMI_GPU, "1")],
                "both gpuslice.io/* and nvidia.com/*",
            ),
            (vec![(HAMI_MEM, "1Gi")], "whole number of MiB"),
            (vec![(HAMI_MEM, "10"), (HAMI_MEM_PERCENT, "10")], "not both"),
            (vec![(HAMI_CORES, "150")], "from 0 to 100"),
        ] {
            let e = container_ask(
                "spec.containers[0]",
                &map(&limits),
                &map(&[]),
                Some(&[]),
                &inv(),
            )
            .unwrap_err()
            .to_string();
            assert!(e.contains(want), "{limits:?}: {e}");
            assert!(!e.contains('\n'), "one line: {e}");
        }
    }

    #[test]
    fn priority_alone_and_zero_gpus_ask_for_no_gpu_as_hami_reads_them() {
        let ask = |limits: &[(&str, &str)]| {
            container_ask(
                "spec.containers[0]",
                &map(limits),
                &map(&[]),
                Some(&[]),
                &inv(),
            )
            .unwrap()
            .unwrap()
        };
        // HAMi gives a GPU only for nvidia.com/gpu or a memory or cores limit.
        let a = ask(&[(HAMI_PRIORITY, "1")]);
        assert_eq!(a.shape, None);
        assert_eq!(a.remove, vec![HAMI_PRIORITY]);
        assert!(
            a.warnings[0].contains("no task priority"),
            "{:?}",
            a.warnings
        );
        // nvidia.com/gpu: 0 is no GPU, whatever else the container names.
        for limits in [
            vec![(HAMI_GPU, "0")],
            vec![(HAMI_GPU, "0"), (HAMI_MEM, "1000"), (HAMI_CORES, "30")],
        ] {
            let a = ask(&limits);
            assert_eq!(a.shape, None, "{limits:?}");
            assert_eq!(a.remove.len(), limits.len(), "{limits:?}: {:?}", a.remove);
            assert!(
                a.warnings
                    .iter()
                    .any(|w| w.contains("nvidia.com/gpu]=0 asks for no GPU")),
                "{:?}",
                a.warnings
            );
        }
        // A priority beside a GPU ask keeps the GPU; cores alone ask for one GPU.
        assert_eq!(
            ask(&[(HAMI_PRIORITY, "1"), (HAMI_GPU, "1")])
                .shape
                .unwrap()
                .gpus,
            1
        );
        assert_eq!(ask(&[(HAMI_CORES, "0")]).shape.unwrap().gpus, 1);
        // gpuslice's own gpus: 0 stays refused.
        assert!(container_ask("c", &map(&[(GPUS, "0")]), &map(&[]), None, &inv()).is_err());
    }

    #[test]
    fn selection_annotations_become_cel() {
        let (s, w) = hami_selectors(&map(&[
            (USE_TYPE, "A100, H200"),
            (NOUSE_UUID, "GPU-12345678-1234-1234-1234-123456789abc"),
            ("hami.io/node-scheduler-policy", "binpack"),
        ]))
        .unwrap();
        assert_eq!(
            s,
            vec![
                "[\"a100\", \"h200\"].exists(t, device.attributes[\"gpuslice.io\"].productName.lowerAscii().contains(t))",
                "!(device.attributes[\"gpuslice.io\"].uuid in [\"GPU-12345678-1234-1234-1234-123456789abc\"])",
            ]
        );
        assert_eq!(w.len(), 1, "{w:?}");
        for bad in [(USE_TYPE, "a\"b"), (USE_UUID, "GPU-0"), (NOUSE_TYPE, " , ")] {
            let e = hami_selectors(&map(&[bad])).unwrap_err().to_string();
            assert!(e.contains(bad.0), "{e}");
        }
    }
}
