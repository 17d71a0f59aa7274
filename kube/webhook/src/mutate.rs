//! The change to one Pod: for each container and init container whose limits ask for a
//! slice, the limits and requests removed and a claim entry added (from a template per
//! shape), as a JSON Patch on the pod the API server sent, so that fields this code does not
//! know travel untouched.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use serde_json::{json, Map, Value};

use crate::ask::{container_ask, hami_selectors, AskError, HAMI_GPU, HAMI_MEM, HAMI_MEM_PERCENT};
use gpuslice_kube::claim_shape::{
    claim_spec, pod_shape, template, Mode, PublishedGpus, ShapeError,
};

/// Prefix of the pod's claim entries the webhook adds (`gpuslice-c0`, `gpuslice-i1`).
pub const ENTRY_PREFIX: &str = "gpuslice-";

/// Why a pod is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MutateError {
    #[error(transparent)]
    Ask(#[from] AskError),
    #[error(transparent)]
    Shape(#[from] ShapeError),
    #[error("spec.resourceClaims: an entry is already named {name}; accepted: no entry named {ENTRY_PREFIX}c<N> or {ENTRY_PREFIX}i<N> in a pod whose limits ask for GPU slices")]
    EntryTaken { name: String },
    #[error("{field}: {detail}")]
    Pod { field: String, detail: String },
}

/// What admitting a pod takes: the patch, the templates the patch names, the warnings.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub patch: Vec<Value>,
    pub templates: Vec<ResourceClaimTemplate>,
    pub warnings: Vec<String>,
}

/// Whether the pod names any of HAMi's GPU limits (the namespace's label is looked up only
/// then).
pub fn mentions_hami(pod: &Value) -> bool {
    let keys = [HAMI_GPU, HAMI_MEM, HAMI_MEM_PERCENT, crate::ask::HAMI_CORES];
    ["containers", "initContainers"].iter().any(|list| {
        pod["spec"][list].as_array().into_iter().flatten().any(|c| {
            ["limits", "requests"].iter().any(|r| {
                c["resources"][r]
                    .as_object()
                    .is_some_and(|m| keys.iter().any(|k| m.contains_key(*k)))
            })
        })
    })
}

fn strings(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| {
                    let s = match v {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    (k.clone(), s)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The plan for `pod` in `namespace`; `hami`: HAMi's names count (the webhook runs with
/// `--hami-compat` and the namespace is labelled for it).
pub fn plan(
    pod: &Value,
    namespace: &str,
    hami: bool,
    inventory: &PublishedGpus,
) -> Result<Plan, MutateError> {
    let mut out = Plan::default();
    let selectors = if hami {
        let ann = strings(&pod["metadata"]["annotations"]);
        let (s, w) = hami_selectors(&ann)?;
        Some((s, w))
    } else {
        None
    };
    let existing: Vec<String> = pod["spec"]["resourceClaims"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["name"].as_str().map(str::to_string))
        .collect();
    // Every container that asks, with its ask.
    let mut asks = Vec::new();
    for (list, letter) in [("containers", 'c'), ("initContainers", 'i')] {
        for (i, c) in pod["spec"][list]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let path = format!("spec.{list}[{i}]");
            let resources = &c["resources"];
            let ask = container_ask(
                &path,
                &strings(&resources["limits"]),
                &strings(&resources["requests"]),
                selectors.as_ref().map(|(s, _)| s.as_slice()),
                inventory,
            )?;
            if let Some(ask) = ask {
                asks.push((list, letter, i, path, ask));
            }
        }
    }
    // In slot mode the pod's containers share one claim (one slot claim per pod bounds the
    // scheduler's search: docs/kubernetes-dra.md, "Bounded search"): the first asking
    // container's entry, for the pod's effective ask.
    let shared = match (&inventory.mode, asks.len() > 1) {
        (Mode::Slots(_), true) => {
            let (shape, warning) = pod_shape(
                &asks
                    .iter()
                    .map(|(list, _, _, path, ask)| {
                        (path.clone(), ask.shape.clone(), *list == "initContainers")
                    })
                    .collect::<Vec<_>>(),
            )?;
            let (_, letter, i, _, _) = &asks[0];
            let field = asks
                .iter()
                .map(|a| a.3.as_str())
                .collect::<Vec<_>>()
                .join(", ");
            out.warnings.push(warning);
            Some((format!("{ENTRY_PREFIX}{letter}{i}"), shape, field))
        }
        _ => None,
    };
    let mut entries = Vec::new();
    for (list, letter, i, path, ask) in asks {
        let resources = &pod["spec"][list][i]["resources"];
        out.warnings.extend(ask.warnings);
        let entry = match &shared {
            Some((entry, _, _)) => entry.clone(),
            None => format!("{ENTRY_PREFIX}{letter}{i}"),
        };
        if existing.contains(&entry) {
            return Err(MutateError::EntryTaken { name: entry });
        }
        if !entries.iter().any(|e: &Value| e["name"] == entry.as_str()) {
            let (spec, warnings) = match &shared {
                Some((_, shape, field)) => claim_spec(&inventory.mode, shape, field)?,
                None => claim_spec(&inventory.mode, &ask.shape, &path)?,
            };
            out.warnings.extend(warnings);
            let t = template(namespace, spec);
            let tname = t.metadata.name.clone().unwrap_or_default();
            if !out
                .templates
                .iter()
                .any(|x| x.metadata.name == t.metadata.name)
            {
                out.templates.push(t);
            }
            entries.push(json!({"name": entry, "resourceClaimTemplateName": tname}));
        }
        let mut res: Map<String, Value> = resources.as_object().cloned().unwrap_or_default();
        for part in ["limits", "requests"] {
            if let Some(Value::Object(m)) = res.get_mut(part) {
                for k in &ask.remove {
                    m.remove(k);
                }
                if m.is_empty() {
                    res.remove(part);
                }
            }
        }
        let claims = res
            .entry("claims")
            .or_insert_with(|| Value::Array(Vec::new()));
        let Value::Array(claims) = claims else {
            return Err(MutateError::Pod {
                field: format!("{path}.resources.claims"),
                detail: "not a list".into(),
            });
        };
        claims.push(json!({"name": entry}));
        out.patch.push(json!({
            "op": if resources.is_object() { "replace" } else { "add" },
            "path": format!("/spec/{list}/{i}/resources"),
            "value": Value::Object(res),
        }));
    }
    if entries.is_empty() {
        return Ok(Plan::default());
    }
    if let Some((_, w)) = selectors {
        out.warnings.extend(w);
    }
    if pod["spec"]["resourceClaims"].is_array() {
        for e in entries {
            out.patch
                .push(json!({"op": "add", "path": "/spec/resourceClaims/-", "value": e}));
        }
    } else {
        out.patch
            .push(json!({"op": "add", "path": "/spec/resourceClaims", "value": entries}));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(limits: Value) -> Value {
        json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "sidecar", "image": "x"},
            {"name": "app", "image": "x", "resources": {"limits": limits, "requests": {"cpu": "1"}}},
        ]}})
    }

    #[test]
    fn limits_become_a_claim_of_the_container() {
        let p = plan(
            &pod(json!({"gpuslice.io/memory": "20Gi", "cpu": "2"})),
            "ns",
            false,
            &PublishedGpus::default(),
        )
        .unwrap();
        assert_eq!(p.templates.len(), 1);
        let t = p.templates[0].metadata.name.clone().unwrap();
        assert_eq!(
            Value::Array(p.patch),
            json!([
                {"op": "replace", "path": "/spec/containers/1/resources", "value": {
                    "limits": {"cpu": "2"}, "requests": {"cpu": "1"}, "claims": [{"name": "gpuslice-c1"}]}},
                {"op": "add", "path": "/spec/resourceClaims", "value": [
                    {"name": "gpuslice-c1", "resourceClaimTemplateName": t}]},
            ])
        );
    }

    #[test]
    fn in_slot_mode_a_pods_containers_share_one_claim() {
        use gpuslice_kube::claim_shape::SlotSize;
        let slots = PublishedGpus {
            mode: Mode::Slots(vec![SlotSize {
                memory: 4 << 30,
                cores: None,
                per_gpu: 6,
            }]),
            max_gpus_per_node: Some(2),
            gpu_memory: vec![24 << 30],
        };
        // 13 containers of 1Mi, as 13 claims, made the scheduler try every order of a node's
        // slots: one claim, one slot, every container on it.
        let containers: Vec<Value> = (0..13)
            .map(|i| json!({"name": format!("c{i}"), "image": "x", "resources": {"limits": {"gpuslice.io/memory": "1Mi"}}}))
            .collect();
        let p = json!({"metadata": {"name": "p"}, "spec": {"containers": containers}});
        let got = plan(&p, "ns", false, &slots).unwrap();
        assert_eq!(got.templates.len(), 1);
        let t = got.templates[0].metadata.name.clone().unwrap();
        let spec = serde_json::to_value(got.templates[0].spec.as_ref().unwrap()).unwrap();
        assert_eq!(
            spec["spec"]["devices"]["requests"][0]["exactly"]["count"],
            1
        );
        let last = got.patch.last().unwrap();
        assert_eq!(
            last,
            &json!({"op": "add", "path": "/spec/resourceClaims", "value": [
                {"name": "gpuslice-c0", "resourceClaimTemplateName": t}]})
        );
        assert_eq!(got.patch.len(), 14);
        for op in &got.patch[..13] {
            assert_eq!(
                op["value"]["claims"],
                json!([{"name": "gpuslice-c0"}]),
                "{op}"
            );
        }
        assert!(
            got.warnings.iter().any(|w| w
                .ends_with("in slot mode the containers of a pod share one slice, 1 GPU × 13Mi")),
            "{:?}",
            got.warnings
        );
        // Together more than a GPU: refused naming the containers.
        let p = json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "a", "image": "x", "resources": {"limits": {"gpuslice.io/memory": "16Gi"}}},
            {"name": "b", "image": "x", "resources": {"limits": {"gpuslice.io/memory": "16Gi"}}},
        ]}});
        let e = plan(&p, "ns", false, &slots).unwrap_err().to_string();
        assert!(
            e.starts_with("spec.containers[0], spec.containers[1]: 1 GPU × 32Gi needs 8 slots"),
            "{e}"
        );
        // In capacity mode each container keeps its own claim.
        let p = json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "a", "image": "x", "resources": {"limits": {"gpuslice.io/memory": "1Gi"}}},
            {"name": "b", "image": "x", "resources": {"limits": {"gpuslice.io/memory": "1Gi"}}},
        ]}});
        let got = plan(&p, "ns", false, &PublishedGpus::default()).unwrap();
        assert_eq!(
            got.patch.last().unwrap()["value"].as_array().map(Vec::len),
            Some(2)
        );
    }

    #[test]
    fn hami_limits_count_only_with_compat() {
        let p = pod(json!({"nvidia.com/gpu": "1"}));
        assert!(mentions_hami(&p));
        assert!(plan(&p, "ns", false, &PublishedGpus::default())
            .unwrap()
            .patch
            .is_empty());
        assert_eq!(
            plan(&p, "ns", true, &PublishedGpus::default())
                .unwrap()
                .patch
                .len(),
            2
        );
    }

    #[test]
    fn a_taken_entry_name_is_refused() {
        let mut p = pod(json!({"gpuslice.io/gpus": "1"}));
        p["spec"]["resourceClaims"] = json!([{"name": "gpuslice-c1", "resourceClaimName": "x"}]);
        let e = plan(&p, "ns", false, &PublishedGpus::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("gpuslice-c1"), "{e}");
    }
}
