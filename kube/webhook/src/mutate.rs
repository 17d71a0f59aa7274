//! The change to one Pod: for each container and init container whose limits ask for a
//! slice, the limits and requests removed and a claim entry added (from a template per
//! shape), and for a rank of a job its job's anti-affinity (`placement`), as a JSON Patch on the pod the API server sent, so that fields this code does not
//! know travel untouched.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use serde_json::{json, Map, Value};

use crate::ask::{
    container_ask, covers, hami_selectors, Ask, AskError, HAMI_GPU, HAMI_MEM, HAMI_MEM_PERCENT,
    HAMI_PRIORITY,
};
use crate::placement::{asks_by_annotation, job_of, keep_ranks_apart, node_reads, node_slice};
use gpuslice_dra::claim_shape::{
    claim_spec, describe, pod_shape, template, Mode, PublishedGpus, Shape, ShapeError,
};

/// Prefix of the pod's claim entries the webhook adds (`gpuslice-c0`, `gpuslice-i1`).
pub const ENTRY_PREFIX: &str = "gpuslice-";
/// The most templates (distinct shapes) one pod may need: each is an object the webhook
/// creates with its own rights in the pod's namespace, so a review cannot make more.
pub const MAX_TEMPLATES: usize = 16;

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
    #[error("spec: the containers ask for {count} different GPU slices (a ResourceClaimTemplate each); accepted: at most {max} per pod (containers asking the same share one)")]
    TooManyTemplates { count: usize, max: usize },
    #[error("{fields}: containers of a rank of job {job} that run at the same time each ask a GPU slice, and their slices may lie on one GPU (each is a claim of its own in capacity mode, and DRA keeps GPUs distinct within one claim only; in slot mode they share one slice; the node places slices asked by annotation one by one), where NCCL refuses two ranks; accepted: the rank's GPUs asked by one of those containers (`gpuslice.io/gpus: N` or `nvidia.com/gpu: N`, N distinct GPUs), the others asking none (by annotation: `gpuslice.io/gpus.<container-name>: \"0\"`) (docs/kubeflow.md, \"One rank per GPU per job\")")]
    RankContainers { fields: String, job: String },
    #[error("{fields}: deviceclass.resource.kubernetes.io/slots.gpuslice.io asks the scheduler for slots it would write into one claim with nothing keeping them on one GPU, which the policy slots.gpuslice.io refuses as the scheduler binds the pod (it would wait unbound); accepted: one container asking 1 slot that way, or the slice as limits (`gpuslice.io/memory`, `gpuslice.io/gpus`: a claim the webhook writes, on one GPU or several) (docs/webhook.md)")]
    ExtendedSlots { fields: String },
}

/// What admitting a pod takes: the patch, the templates the patch names, the warnings.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub patch: Vec<Value>,
    pub templates: Vec<ResourceClaimTemplate>,
    /// The claim entries the patch adds: (entry name, template name).
    pub entries: Vec<(String, String)>,
    pub warnings: Vec<String>,
}

/// Each container of `pod`, app then init: its field (`spec.containers[0]`) and itself.
fn containers(pod: &Value) -> impl Iterator<Item = (String, &Value)> {
    ["containers", "initContainers"]
        .into_iter()
        .flat_map(move |list| {
            pod["spec"][list]
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
                .map(move |(i, c)| (format!("spec.{list}[{i}]"), c))
        })
}

/// What container `c` asks of resource `name`: its limit, else its request.
fn asked<'a>(c: &'a Value, name: &str) -> Option<&'a Value> {
    ["limits", "requests"]
        .iter()
        .find_map(|r| c["resources"][r].get(name))
}

/// Whether the pod names any of HAMi's GPU limits (the namespace's label is looked up only
/// then).
pub fn mentions_hami(pod: &Value) -> bool {
    let keys = [
        HAMI_GPU,
        HAMI_MEM,
        HAMI_MEM_PERCENT,
        crate::ask::HAMI_CORES,
        HAMI_PRIORITY,
    ];
    containers(pod).any(|(_, c)| keys.iter().any(|k| asked(c, k).is_some()))
}

/// Whether a container of `pod` (app or init) asks one of gpuslice's device classes by the
/// extended resource Kubernetes names after it
/// ([`gpuslice_dra::IMPLICIT_EXTENDED_RESOURCES`]), in its limits or requests: the scheduler
/// writes that claim (and the claims webhook charges it), so the webhook only keeps such a
/// rank apart (`crate::placement`); in slot mode two ranks of one slot each could otherwise
/// share a GPU.
pub fn asks_by_extended_resource(pod: &Value) -> bool {
    containers(pod).any(|(_, c)| {
        gpuslice_dra::IMPLICIT_EXTENDED_RESOURCES
            .iter()
            .any(|n| asked(c, n).is_some())
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

/// One container whose limits name a slice (or HAMi's names for none).
struct Asked<'a> {
    list: &'static str,
    /// `c` for an app container, `i` for an init container (the entry's name).
    letter: char,
    index: usize,
    /// An init container without `restartPolicy: Always`: it runs alone, before the app
    /// containers (a sidecar runs beside them).
    ordinary_init: bool,
    resources: &'a Value,
    ask: Ask,
    /// The claim entry the container uses, if it gets a slice.
    entry: Option<String>,
}

/// What a new claim entry needs besides its shape.
struct NewClaim<'a> {
    existing: &'a [String],
    namespace: &'a str,
    inventory: &'a PublishedGpus,
}

impl NewClaim<'_> {
    /// Adds the entry `entry` for a claim of `shape` (asked at `field`) and its template.
    fn add(
        &self,
        out: &mut Plan,
        entries: &mut Vec<Value>,
        entry: &str,
        shape: &Shape,
        field: &str,
    ) -> Result<(), MutateError> {
        if self.existing.iter().any(|e| e == entry) {
            return Err(MutateError::EntryTaken {
                name: entry.to_string(),
            });
        }
        let (spec, warnings) = claim_spec(&self.inventory.mode, shape, field)?;
        out.warnings.extend(warnings);
        let t = template(self.namespace, spec);
        let tname = t.metadata.name.clone().unwrap_or_default();
        if !out
            .templates
            .iter()
            .any(|x| x.metadata.name == t.metadata.name)
        {
            out.templates.push(t);
        }
        out.entries.push((entry.to_string(), tname.clone()));
        entries.push(json!({"name": entry, "resourceClaimTemplateName": tname}));
        Ok(())
    }
}

/// The plan for `pod` in `namespace`; `hami`: HAMi's names count (the webhook runs with
/// `--hami-compat` and the namespace is labelled for it).
///
/// Each app container and each sidecar (an init container with `restartPolicy: Always`) that
/// asks gets a claim of its own (`gpuslice-c<N>`, `gpuslice-i<N>`). An ordinary init
/// container runs alone, before the app containers and after the init containers before it,
/// so it shares the claim of the first app container, else of the first earlier ordinary init
/// container, whose slice [`covers`] its ask; only when none does it gets a claim of its own,
/// held, as every claim of the pod, for the pod's life (docs/webhook.md).
///
/// A pod of a job that gets a claim here also gets the job's anti-affinity and the rule's
/// annotation ([`keep_ranks_apart`]). Containers that run together, each on a slice of its
/// own (`sliced_together`), may be given one GPU, as DRA keeps devices distinct within one
/// claim only: in a pod of a job, where NCCL refuses two ranks on one GPU, that is refused
/// ([`MutateError::RankContainers`]); elsewhere, in capacity mode, it is warned.
///
/// In slot mode every container of the pod that asks for a slice shares one claim instead,
/// of the pod's effective ask ([`pod_shape`]): one slot claim per pod bounds the scheduler's
/// search (docs/kubernetes-dra.md, "Bounded search").
pub fn plan(
    pod: &Value,
    namespace: &str,
    hami: bool,
    inventory: &PublishedGpus,
) -> Result<Plan, MutateError> {
    let slots = extended_slot_asks(pod);
    if slots.len() > 1 || slots.iter().any(|(_, n)| n != "1") {
        let fields: Vec<String> = slots.iter().map(|(f, n)| format!("{f}: {n}")).collect();
        return Err(MutateError::ExtendedSlots {
            fields: fields.join(", "),
        });
    }
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
    // Every container whose limits name a slice (or HAMi's names for none), in pod order:
    // the app containers, then the init containers.
    let mut asked: Vec<Asked> = Vec::new();
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
            let Some(mut ask) = ask else { continue };
            out.warnings.append(&mut ask.warnings);
            asked.push(Asked {
                list,
                letter,
                index: i,
                ordinary_init: letter == 'i' && c["restartPolicy"].as_str() != Some("Always"),
                resources,
                ask,
                entry: None,
            });
        }
    }
    // Containers that run together on slices of their own may be given one GPU: those whose
    // limits ask one and, in a rank of a job, those the node gives one by the pod's
    // annotations (it places them itself, and may place two on one GPU just the same).
    let by_limits: Vec<(&str, usize)> = asked
        .iter()
        .filter(|a| a.ask.shape.is_some())
        .map(|a| (a.list, a.index))
        .collect();
    let together = sliced_together(&sliced_containers(pod, &by_limits, job_of(pod).is_some()));
    if !together.is_empty() {
        let fields = together.join(", ");
        if let Some((label, value)) = job_of(pod) {
            return Err(MutateError::RankContainers {
                fields,
                job: format!("{label}={value}"),
            });
        }
        if matches!(inventory.mode, Mode::Capacity) {
            out.warnings.push(shared_gpu_warning(&fields));
        }
    }
    let mut entries = Vec::new();
    let sliced: Vec<usize> = (0..asked.len())
        .filter(|k| asked[*k].ask.shape.is_some())
        .collect();
    if matches!(inventory.mode, Mode::Slots(_)) && sliced.len() > 1 {
        let parts: Vec<(String, Shape, bool)> = asked
            .iter()
            .filter_map(|a| {
                let path = format!("spec.{}[{}]", a.list, a.index);
                a.ask.shape.clone().map(|s| (path, s, a.ordinary_init))
            })
            .collect();
        let (shape, warning) = pod_shape(&parts)?;
        out.warnings.push(warning);
        let field = parts
            .iter()
            .map(|p| p.0.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        let first = &asked[sliced[0]];
        let entry = format!("{ENTRY_PREFIX}{}{}", first.letter, first.index);
        let claim = NewClaim {
            existing: &existing,
            namespace,
            inventory,
        };
        claim.add(&mut out, &mut entries, &entry, &shape, &field)?;
        for k in sliced {
            asked[k].entry = Some(entry.clone());
        }
    } else {
        // What an ordinary init container may share, as indexes into `asked`: the app
        // containers' claims, then the earlier ordinary init containers' own.
        let mut app_claims: Vec<usize> = Vec::new();
        let mut init_claims: Vec<usize> = Vec::new();
        // Ordinary init containers given a claim of their own: (path, entry, their ask).
        let mut own_init: Vec<(String, String, Shape)> = Vec::new();
        let claim = NewClaim {
            existing: &existing,
            namespace,
            inventory,
        };
        for k in sliced {
            let Some(want) = asked[k].ask.shape.clone() else {
                continue;
            };
            let shared = if asked[k].ordinary_init {
                app_claims
                    .iter()
                    .chain(&init_claims)
                    .map(|j| &asked[*j])
                    .find(|held| {
                        held.ask
                            .shape
                            .as_ref()
                            .is_some_and(|have| covers(have, &want))
                    })
                    .and_then(|held| held.entry.clone())
            } else {
                None
            };
            let entry = match shared {
                Some(entry) => entry,
                None => {
                    let a = &asked[k];
                    let entry = format!("{ENTRY_PREFIX}{}{}", a.letter, a.index);
                    let path = format!("spec.{}[{}]", a.list, a.index);
                    claim.add(&mut out, &mut entries, &entry, &want, &path)?;
                    if a.letter == 'c' {
                        app_claims.push(k);
                    } else if a.ordinary_init {
                        init_claims.push(k);
                        own_init.push((path, entry.clone(), want));
                    }
                    entry
                }
            };
            asked[k].entry = Some(entry);
        }
        // Beside other claims, an ordinary init container's own claim is held for the pod's
        // life on top of them, while Kubernetes' pod requests, which Kueue charges, count
        // only the larger of the app containers' sum and the largest init container.
        if entries.len() > 1 {
            for (path, entry, want) in &own_init {
                out.warnings.push(own_init_warning(path, entry, want));
            }
        }
    }
    if out.templates.len() > MAX_TEMPLATES {
        return Err(MutateError::TooManyTemplates {
            count: out.templates.len(),
            max: MAX_TEMPLATES,
        });
    }
    for a in &asked {
        let path = format!("spec.{}[{}]", a.list, a.index);
        let mut res: Map<String, Value> = a.resources.as_object().cloned().unwrap_or_default();
        for part in ["limits", "requests"] {
            if let Some(Value::Object(m)) = res.get_mut(part) {
                for k in &a.ask.remove {
                    m.remove(k);
                }
                if m.is_empty() {
                    res.remove(part);
                }
            }
        }
        if let Some(entry) = &a.entry {
            let claims = res
                .entry("claims")
                .or_insert_with(|| Value::Array(Vec::new()));
            let Value::Array(claims) = claims else {
                return Err(MutateError::Pod {
                    field: format!("{path}.resources.claims"),
                    detail: "not a list".into(),
                });
            };
            claims.push(json!({ "name": entry }));
        }
        out.patch.push(json!({
            "op": if a.resources.is_object() { "replace" } else { "add" },
            "path": format!("/spec/{}/{}/resources", a.list, a.index),
            "value": Value::Object(res),
        }));
    }
    if entries.is_empty() {
        return Ok(Plan {
            patch: out.patch,
            templates: Vec::new(),
            entries: Vec::new(),
            warnings: out.warnings,
        });
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
    // A rank of a job that gets gpuslice devices keeps off its job's other ranks' nodes.
    if let Some((ops, warning)) = keep_ranks_apart(pod) {
        out.patch.extend(ops);
        out.warnings.push(warning);
    }
    Ok(out)
}

/// The containers (app and init) of `pod` that ask slot mode's class by the extended resource
/// Kubernetes names after it: each one's field and value (its limit, else its request). The
/// scheduler writes one claim for them all, a request per container of as many slots as it
/// asks, nothing keeping a request's slots on one GPU: the policy `slots.gpuslice.io` lets
/// through one request of one slot only.
fn extended_slot_asks(pod: &Value) -> Vec<(String, String)> {
    containers(pod)
        .filter_map(|(field, c)| {
            let v = asked(c, gpuslice_dra::SLOTS_EXTENDED_RESOURCE)?;
            let v = v.as_str().map_or_else(|| v.to_string(), str::to_string);
            Some((format!("{field}.resources"), v))
        })
        .collect()
}

/// A container of a pod that gets a slice, as [`sliced_together`] reads it: where it is and
/// how it runs.
struct Sliced {
    list: &'static str,
    index: usize,
    /// An init container (a sidecar, or an ordinary one).
    init: bool,
    /// An init container without `restartPolicy: Always`: it runs alone, before the app
    /// containers (a sidecar runs beside them).
    ordinary_init: bool,
}

/// The containers of `pod` that get a slice, in pod order (the app containers, then the
/// init containers): those of `by_limits` (list, index), whose limits ask one, and, with
/// `annotations`, those the node gives one by the pod's `gpuslice.io/*` annotations (read
/// by each container's name as the node reads them, [`node_slice`]).
fn sliced_containers(pod: &Value, by_limits: &[(&str, usize)], annotations: bool) -> Vec<Sliced> {
    let ann: BTreeMap<String, String> = if annotations && asks_by_annotation(pod) {
        strings(&pod["metadata"]["annotations"])
            .into_iter()
            .filter(|(k, _)| node_reads(k))
            .collect()
    } else {
        BTreeMap::new()
    };
    let mut out = Vec::new();
    for list in ["containers", "initContainers"] {
        for (index, c) in pod["spec"][list]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let by_annotation = || {
                !ann.is_empty()
                    && node_slice(&ann, c["name"].as_str().unwrap_or_default()).is_some()
            };
            if by_limits.contains(&(list, index)) || by_annotation() {
                let init = list == "initContainers";
                out.push(Sliced {
                    list,
                    index,
                    init,
                    ordinary_init: init && c["restartPolicy"].as_str() != Some("Always"),
                });
            }
        }
    }
    out
}

/// The containers of `sliced` ([`sliced_containers`]) that get a slice while another that
/// gets one may be running, as their paths in pod order: app containers and sidecars run
/// together, and an ordinary init container runs beside the sidecars declared before it
/// (not beside another ordinary init container, nor the app containers). In capacity mode two
/// of them are on different claims (in slot mode on one slice they share), and DRA keeps
/// devices distinct within one claim only; the node places slices asked by annotation one
/// by one: two of them may be given one GPU.
fn sliced_together(sliced: &[Sliced]) -> Vec<String> {
    let running = sliced.iter().filter(|a| !a.ordinary_init).count();
    let first_sidecar = sliced
        .iter()
        .filter(|a| a.init && !a.ordinary_init)
        .map(|a| a.index)
        .min();
    let last_init = sliced
        .iter()
        .filter(|a| a.ordinary_init)
        .map(|a| a.index)
        .max();
    sliced
        .iter()
        .filter(|a| {
            if a.ordinary_init {
                first_sidecar.is_some_and(|s| s < a.index)
            } else {
                running > 1 || (a.init && last_init.is_some_and(|i| i > a.index))
            }
        })
        .map(|a| format!("spec.{}[{}]", a.list, a.index))
        .collect()
}

/// The warning for containers of a pod of no job at `fields` that run together, each on a
/// slice of its own (capacity mode): two of them may be given one GPU.
pub fn shared_gpu_warning(fields: &str) -> String {
    format!(
        "{fields}: each gets a GPU slice of its own (a claim each), and two of them may be given one GPU: DRA keeps GPUs distinct within one claim only; for distinct GPUs ask them in one container (`gpuslice.io/gpus: N`), as two processes of one NCCL communicator need (docs/webhook.md)"
    )
}

/// The warning for an ordinary init container at `path` given a claim of its own (`entry`)
/// beside the pod's other claims: the pod holds both until it ends, and a queue charging the
/// pod's requests (Kueue) counts only the larger.
pub fn own_init_warning(path: &str, entry: &str, want: &Shape) -> String {
    format!(
        "{path}: no app container's slice covers its {}, so it gets a claim of its own ({entry}), held beside the pod's other slices until the pod ends: the node books the init container's GPU memory plus the app containers'; Kueue charges a queued pod only the larger of the app containers' sum and its largest init container (Kubernetes' pod requests), less than the node books; to be charged what it holds, give an app container a slice that covers it (at least its memory and cores, the same GPUs and selection), which it then shares (docs/quotas.md)",
        describe(want)
    )
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
    fn slots_asked_by_their_extended_resource_past_one_are_refused() {
        let ext = gpuslice_dra::SLOTS_EXTENDED_RESOURCE;
        let inventory = PublishedGpus::default();
        // One container, one slot: the scheduler's claim passes the slot policy; nothing to
        // write here (the claim is the scheduler's).
        let p = plan(&pod(json!({ext: "1"})), "ns", false, &inventory).unwrap();
        assert!(
            p.patch.is_empty() && p.templates.is_empty(),
            "{:?}",
            p.patch
        );
        // Two slots in one container, or one slot in each of two (an init container's asked
        // by its requests): slots of one claim the policy refuses at binding.
        let two = pod(json!({ext: "2"}));
        let mut each = pod(json!({ext: "1"}));
        each["spec"]["initContainers"] =
            json!([{"name": "prep", "image": "x", "resources": {"requests": {ext: "1"}}}]);
        for (p, fields) in [
            (two, "spec.containers[1].resources: 2"),
            (
                each,
                "spec.containers[1].resources: 1, spec.initContainers[0].resources: 1",
            ),
        ] {
            let e = plan(&p, "ns", false, &inventory).unwrap_err();
            assert_eq!(
                e,
                MutateError::ExtendedSlots {
                    fields: fields.into()
                }
            );
            assert!(
                e.to_string().starts_with(&format!("{fields}: deviceclass.resource.kubernetes.io/slots.gpuslice.io asks the scheduler for slots")),
                "{e}"
            );
        }
        // Whole GPUs by the capacity class's: any number (DRA keeps a claim's GPUs distinct).
        let p = plan(
            &pod(json!({gpuslice_dra::EXTENDED_RESOURCE: "2"})),
            "ns",
            false,
            &inventory,
        )
        .unwrap();
        assert!(p.patch.is_empty(), "{:?}", p.patch);
    }

    #[test]
    fn in_slot_mode_a_pods_containers_share_one_claim() {
        use gpuslice_dra::claim_shape::SlotSize;
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
    fn a_rank_of_a_job_gets_the_jobs_anti_affinity_with_its_claim() {
        let mut p = pod(json!({"gpuslice.io/gpus": "1"}));
        p["metadata"]["labels"] = json!({"training.kubeflow.org/job-name": "train"});
        let got = plan(&p, "ns", false, &PublishedGpus::default()).unwrap();
        assert_eq!(
            got.patch[2..],
            [
                json!({"op": "add", "path": "/spec/affinity", "value": {"podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [{
                        "labelSelector": {"matchLabels": {"training.kubeflow.org/job-name": "train"}},
                        "topologyKey": "kubernetes.io/hostname"}]}}}),
                json!({"op": "add", "path": "/metadata/annotations", "value": {
                    "placement.gpuslice.io/rule": "one node per rank of job training.kubeflow.org/job-name=train: NCCL refuses two ranks on one GPU"}}),
            ]
        );
        assert!(
            got.warnings
                .iter()
                .any(|w| w
                    .starts_with("one node per rank of job training.kubeflow.org/job-name=train")),
            "{:?}",
            got.warnings
        );
        // A pod of the job that gets no slice is left where the scheduler puts it.
        let mut p = pod(json!({"cpu": "1"}));
        p["metadata"]["labels"] = json!({"training.kubeflow.org/job-name": "train"});
        let got = plan(&p, "ns", false, &PublishedGpus::default()).unwrap();
        assert!(got.patch.is_empty(), "{:?}", got.patch);
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

    fn containers(memories: &[&str]) -> Vec<Value> {
        memories
            .iter()
            .enumerate()
            .map(|(i, m)| {
                json!({"name": format!("c{i}"), "image": "x",
                       "resources": {"limits": {"gpuslice.io/memory": m}}})
            })
            .collect()
    }

    #[test]
    fn a_pod_needs_at_most_sixteen_templates() {
        let sizes: Vec<String> = (1..=17).map(|i| format!("{i}Gi")).collect();
        let sizes: Vec<&str> = sizes.iter().map(String::as_str).collect();
        let pod = |n: usize| json!({"spec": {"containers": containers(&sizes[..n])}});
        let p = plan(&pod(16), "ns", false, &PublishedGpus::default()).unwrap();
        assert_eq!(p.templates.len(), 16);
        let e = plan(&pod(17), "ns", false, &PublishedGpus::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("ask for 17 different GPU slices") && e.contains("at most 16 per pod"),
            "{e}"
        );
        // Many containers of one shape share one template.
        let same = json!({"spec": {"containers": containers(&["1Gi"; 3000])}});
        let p = plan(&same, "ns", false, &PublishedGpus::default()).unwrap();
        assert_eq!(p.templates.len(), 1);
    }

    /// One GPU of `memory`, as the webhook reads a container's limits.
    fn p_shape(memory: &str) -> Shape {
        let limits = BTreeMap::from([("gpuslice.io/memory".to_string(), memory.to_string())]);
        container_ask(
            "x",
            &limits,
            &BTreeMap::new(),
            None,
            &PublishedGpus::default(),
        )
        .unwrap()
        .unwrap()
        .shape
        .unwrap()
    }

    #[test]
    fn an_init_container_shares_an_app_containers_claim_that_covers_it() {
        let inv = PublishedGpus::default();
        let init = |m: &str, always: bool| {
            let mut c = json!({"name": "init", "image": "x",
                               "resources": {"limits": {"gpuslice.io/memory": m}}});
            if always {
                c["restartPolicy"] = json!("Always");
            }
            c
        };
        let claims = |p: &Plan, list: &str, i: usize| {
            p.patch
                .iter()
                .find(|op| op["path"] == format!("/spec/{list}/{i}/resources"))
                .map(|op| op["value"]["claims"].clone())
                .unwrap()
        };
        let entries = |p: &Plan| {
            p.patch
                .iter()
                .find(|op| op["path"] == "/spec/resourceClaims")
                .map(|op| {
                    op["value"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|e| e["name"].as_str().unwrap().to_string())
                        .collect::<Vec<_>>()
                })
                .unwrap()
        };
        // 10Gi before the app's 20Gi: the app's claim, no claim of its own, one template.
        let pod = json!({"spec": {"containers": containers(&["20Gi"]),
                                  "initContainers": [init("10Gi", false)]}});
        let p = plan(&pod, "ns", false, &inv).unwrap();
        assert_eq!(
            claims(&p, "initContainers", 0),
            json!([{"name": "gpuslice-c0"}])
        );
        assert_eq!(entries(&p), vec!["gpuslice-c0"]);
        assert_eq!(p.templates.len(), 1);
        assert!(p.warnings.is_empty(), "{:?}", p.warnings);
        // More than the app's: a claim of its own; a later init container it covers shares it.
        let pod = json!({"spec": {"containers": containers(&["20Gi"]),
                                  "initContainers": [init("30Gi", false), init("25Gi", false)]}});
        let p = plan(&pod, "ns", false, &inv).unwrap();
        assert_eq!(
            claims(&p, "initContainers", 0),
            json!([{"name": "gpuslice-i0"}])
        );
        assert_eq!(
            claims(&p, "initContainers", 1),
            json!([{"name": "gpuslice-i0"}])
        );
        assert_eq!(entries(&p), vec!["gpuslice-c0", "gpuslice-i0"]);
        // The pod holds 20Gi + 30Gi until it ends, and Kueue charges max(20Gi, 30Gi): the
        // admission says so, once, for the init container with a claim of its own.
        assert_eq!(
            p.warnings,
            [own_init_warning(
                "spec.initContainers[0]",
                "gpuslice-i0",
                &p_shape("30Gi")
            )]
        );
        assert!(
            p.warnings[0].starts_with("spec.initContainers[0]: no app container's slice covers its 1 GPU × 30Gi, so it gets a claim of its own (gpuslice-i0), held beside the pod's other slices until the pod ends: the node books the init container's GPU memory plus the app containers'; Kueue charges a queued pod only the larger"),
            "{:?}",
            p.warnings
        );
        // The warning travels in the AdmissionReview's response.
        let r = crate::review::allow("u", &p.patch, &p.warnings);
        assert_eq!(r["response"]["warnings"], json!(p.warnings));
        // Its own claim and nothing beside it: the pod holds what Kueue charges, no warning.
        let pod = json!({"spec": {"containers": [{"name": "app", "image": "x"}],
                                  "initContainers": [init("30Gi", false)]}});
        let p = plan(&pod, "ns", false, &inv).unwrap();
        assert_eq!(entries(&p), vec!["gpuslice-i0"]);
        assert!(p.warnings.is_empty(), "{:?}", p.warnings);
        // A sidecar runs beside the app containers: always a claim of its own.
        let pod = json!({"spec": {"containers": containers(&["20Gi"]),
                                  "initContainers": [init("10Gi", true)]}});
        let p = plan(&pod, "ns", false, &inv).unwrap();
        assert_eq!(
            claims(&p, "initContainers", 0),
            json!([{"name": "gpuslice-i0"}])
        );
        assert_eq!(entries(&p), vec!["gpuslice-c0", "gpuslice-i0"]);
        // Kueue counts a sidecar: no warning of its charge; it runs beside the app, each on a
        // claim of its own, which may be given one GPU: said.
        assert_eq!(
            p.warnings,
            [shared_gpu_warning(
                "spec.containers[0], spec.initContainers[0]"
            )],
        );
        // Another GPU count or a share the app's claim does not give: its own.
        for other in [
            json!({"gpuslice.io/memory": "10Gi", "gpuslice.io/gpus": "2"}),
            json!({"gpuslice.io/memory": "10Gi", "gpuslice.io/cores": "30"}),
        ] {
            let mut c = init("10Gi", false);
            c["resources"]["limits"] = other.clone();
            let mut app = containers(&["20Gi"]);
            app[0]["resources"]["limits"]["gpuslice.io/cores"] = json!("20");
            let pod = json!({"spec": {"containers": app, "initContainers": [c]}});
            let p = plan(&pod, "ns", false, &inv).unwrap();
            assert_eq!(entries(&p), vec!["gpuslice-c0", "gpuslice-i0"], "{other}");
        }
    }

    /// Slot mode of 6 slots of 4Gi per GPU, 2 GPUs per node.
    fn six_slots() -> PublishedGpus {
        use gpuslice_dra::claim_shape::SlotSize;
        PublishedGpus {
            mode: Mode::Slots(vec![SlotSize {
                memory: 4 << 30,
                cores: None,
                per_gpu: 6,
            }]),
            max_gpus_per_node: Some(2),
            gpu_memory: vec![24 << 30],
        }
    }

    #[test]
    fn a_ranks_containers_that_run_together_on_slices_are_refused_in_both_modes() {
        let rank = |containers: Value, init: Value| {
            json!({"metadata": {"name": "r", "labels": {"training.kubeflow.org/job-name": "train"}},
                   "spec": {"containers": containers, "initContainers": init}})
        };
        let two = json!([
            {"name": "a", "image": "x", "resources": {"limits": {"gpuslice.io/gpus": "1", "gpuslice.io/memory": "1Gi"}}},
            {"name": "b", "image": "x", "resources": {"limits": {"gpuslice.io/gpus": "1", "gpuslice.io/memory": "1Gi"}}},
        ]);
        let hami = json!([
            {"name": "a", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1024"}}},
            {"name": "b", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1024"}}},
        ]);
        for inv in [PublishedGpus::default(), six_slots()] {
            for (containers, compat) in [(&two, false), (&hami, true)] {
                let e = plan(&rank(containers.clone(), json!([])), "ns", compat, &inv).unwrap_err();
                assert_eq!(
                    e,
                    MutateError::RankContainers {
                        fields: "spec.containers[0], spec.containers[1]".into(),
                        job: "training.kubeflow.org/job-name=train".into(),
                    },
                    "{:?}",
                    inv.mode
                );
                let said = e.to_string();
                assert!(
                    said.starts_with("spec.containers[0], spec.containers[1]: containers of a rank of job training.kubeflow.org/job-name=train that run at the same time each ask a GPU slice")
                        && said.contains("accepted: the rank's GPUs asked by one of those containers (`gpuslice.io/gpus: N` or `nvidia.com/gpu: N`, N distinct GPUs)"),
                    "{said}"
                );
            }
            // The rank's GPUs in one container: admitted, one claim of distinct GPUs.
            let one = json!([{"name": "a", "image": "x",
                              "resources": {"limits": {"gpuslice.io/gpus": "2", "gpuslice.io/memory": "1Gi"}}},
                             {"name": "b", "image": "x"}]);
            let got = plan(&rank(one, json!([])), "ns", false, &inv).unwrap();
            assert_eq!(got.templates.len(), 1, "{:?}", inv.mode);
            assert!(
                !got.warnings
                    .iter()
                    .any(|w| w.contains("may be given one GPU")),
                "{:?}",
                got.warnings
            );
            // An ordinary init container runs alone, before the app: admitted beside it.
            let init = json!([{"name": "i", "image": "x",
                               "resources": {"limits": {"gpuslice.io/memory": "2Gi"}}}]);
            let app = json!([{"name": "a", "image": "x",
                              "resources": {"limits": {"gpuslice.io/memory": "1Gi"}}}]);
            plan(&rank(app.clone(), init.clone()), "ns", false, &inv).unwrap();
            // Beside a sidecar declared before it, it runs with the sidecar: refused.
            let sidecar = json!({"name": "s", "image": "x", "restartPolicy": "Always",
                                 "resources": {"limits": {"gpuslice.io/memory": "1Gi"}}});
            let init = json!([sidecar, init[0]]);
            let e = plan(
                &rank(json!([{"name": "a", "image": "x"}]), init),
                "ns",
                false,
                &inv,
            )
            .unwrap_err();
            assert!(
                e.to_string().starts_with(
                    "spec.initContainers[0], spec.initContainers[1]: containers of a rank"
                ),
                "{e}"
            );
        }
        // The same pods of no job are admitted: in capacity mode warned that two slices may be
        // given one GPU, in slot mode sharing one slice, as said.
        let mut p = rank(two.clone(), json!([]));
        p["metadata"]["labels"] = json!({});
        let got = plan(&p, "ns", false, &PublishedGpus::default()).unwrap();
        assert!(
            got.warnings.contains(&shared_gpu_warning(
                "spec.containers[0], spec.containers[1]"
            )),
            "{:?}",
            got.warnings
        );
        let got = plan(&p, "ns", false, &six_slots()).unwrap();
        assert_eq!(
            got.warnings[0],
            "spec.containers[0], spec.containers[1]: in slot mode the containers of a pod share one slice, 1 GPU × 2Gi"
        );
        assert!(
            !got.warnings
                .iter()
                .any(|w| w.contains("may be given one GPU")),
            "{:?}",
            got.warnings
        );
        // One container asking: no such warning.
        let got = plan(
            &pod(json!({"gpuslice.io/memory": "1Gi"})),
            "ns",
            false,
            &PublishedGpus::default(),
        )
        .unwrap();
        assert!(got.warnings.is_empty(), "{:?}", got.warnings);
    }

    #[test]
    fn a_ranks_containers_that_run_together_on_slices_asked_by_annotation_are_refused() {
        let rank = |annotations: Value, containers: Value, init: Value| {
            json!({"metadata": {"name": "r", "labels": {"gpuslice.io/job": "x"},
                                "annotations": annotations},
                   "spec": {"containers": containers, "initContainers": init}})
        };
        let ab = json!([{"name": "a", "image": "x"}, {"name": "b", "image": "x"}]);
        let refused = |p: &Value| plan(p, "ns", false, &PublishedGpus::default()).err();
        let both = Some(MutateError::RankContainers {
            fields: "spec.containers[0], spec.containers[1]".into(),
            job: "gpuslice.io/job=x".into(),
        });
        // The pod-wide ask applies to every container: each gets a slice of the node's.
        let p = rank(json!({"gpuslice.io/gpus": "1"}), ab.clone(), json!([]));
        assert_eq!(refused(&p), both);
        let said = refused(&p).unwrap().to_string();
        assert!(
            said.starts_with("spec.containers[0], spec.containers[1]: containers of a rank of job gpuslice.io/job=x that run at the same time each ask a GPU slice")
                && said.contains("`gpuslice.io/gpus.<container-name>: \"0\"`"),
            "{said}"
        );
        // Each container's own key; one by limits, the other by its key.
        let own = json!({"gpuslice.io/memory.a": "1Gi", "gpuslice.io/memory.b": "1Gi"});
        assert_eq!(refused(&rank(own, ab.clone(), json!([]))), both);
        let limited = json!([{"name": "a", "image": "x",
                              "resources": {"limits": {"gpuslice.io/memory": "1Gi"}}},
                             {"name": "b", "image": "x"}]);
        let p = rank(json!({"gpuslice.io/memory.b": "1Gi"}), limited, json!([]));
        assert_eq!(refused(&p), both);
        // A sidecar runs beside the app container; an ordinary init container alone.
        let sidecar = json!([{"name": "s", "image": "x", "restartPolicy": "Always"}]);
        let one = json!([{"name": "a", "image": "x"}]);
        let p = rank(json!({"gpuslice.io/memory": "1Gi"}), one.clone(), sidecar);
        assert_eq!(
            refused(&p).map(|e| e.to_string().split(':').next().map(str::to_string)),
            Some(Some(
                "spec.containers[0], spec.initContainers[0]".to_string()
            ))
        );
        let init = json!([{"name": "i", "image": "x"}]);
        let p = rank(json!({"gpuslice.io/memory": "1Gi"}), one, init);
        assert_eq!(refused(&p), None);
        // Admitted: the others opted out, one container's key alone, keys the node refuses
        // (no slice at all), or a pod of no job.
        for ann in [
            json!({"gpuslice.io/gpus": "2", "gpuslice.io/gpus.b": "0"}),
            json!({"gpuslice.io/memory.a": "1Gi"}),
            json!({"gpuslice.io/memory": "1Gi", "gpuslice.io/typo": "x"}),
            json!({"gpuslice.io/memory": "1Gi", "gpuslice.io/reservation": "3f9a0c1d2e4b5a69"}),
        ] {
            assert_eq!(
                refused(&rank(ann.clone(), ab.clone(), json!([]))),
                None,
                "{ann}"
            );
        }
        let mut p = rank(json!({"gpuslice.io/gpus": "1"}), ab, json!([]));
        p["metadata"]["labels"] = json!({"app": "x"});
        let got = plan(&p, "ns", false, &PublishedGpus::default()).unwrap();
        assert!(got.warnings.is_empty(), "{:?}", got.warnings);
    }

    #[test]
    fn hami_names_that_ask_for_no_gpu_are_removed_without_a_claim() {
        for limits in [
            json!({"nvidia.com/priority": "1"}),
            json!({"nvidia.com/gpu": "0"}),
        ] {
            let p = plan(&pod(limits.clone()), "ns", true, &PublishedGpus::default()).unwrap();
            assert!(p.templates.is_empty(), "{limits}");
            assert_eq!(
                Value::Array(p.patch),
                json!([{"op": "replace", "path": "/spec/containers/1/resources",
                        "value": {"requests": {"cpu": "1"}}}]),
                "{limits}"
            );
            assert_eq!(p.warnings.len(), 1, "{limits}: {:?}", p.warnings);
        }
    }
}
