//! The change to one Pod: for each container and init container whose limits ask for a
//! slice, the limits and requests removed and a claim entry added (from a template per
//! shape), as a JSON Patch on the pod the API server sent, so that fields this code does not
//! know travel untouched.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use serde_json::{json, Map, Value};

use crate::ask::{container_ask, hami_selectors, AskError, HAMI_GPU, HAMI_MEM, HAMI_MEM_PERCENT};
use gpuslice_dra::claim_shape::PublishedGpus;
use gpuslice_dra::claim_shape::{claim_spec, template, ShapeError};

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
    let mut entries = Vec::new();
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
            let Some(ask) = ask else { continue };
            let (spec, warnings) = claim_spec(&inventory.mode, &ask.shape, &path)?;
            out.warnings.extend(ask.warnings);
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
            let entry = format!("{ENTRY_PREFIX}{letter}{i}");
            if existing.contains(&entry) {
                return Err(MutateError::EntryTaken { name: entry });
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
            entries.push(json!({"name": entry, "resourceClaimTemplateName": tname}));
        }
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
