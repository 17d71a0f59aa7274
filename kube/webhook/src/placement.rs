//! One rank per GPU per job: NCCL refuses two ranks of one communicator on one GPU, and
//! nothing else keeps the ranks of a multi-node job apart, so a pod of a job (a Kubeflow
//! PyTorchJob's, a JobSet's — hence a Kubeflow TrainJob's — or one labelled
//! `gpuslice.io/job`) that gets gpuslice devices (by limits, claim templates, claims it
//! names, the annotations the node reads, or a device class's extended resource,
//! `mutate::asks_by_extended_resource`) is given a required pod anti-affinity on the
//! node against the job's other pods: ranks on different nodes never share a GPU, and a rank
//! that cannot be placed waits Pending with the scheduler's reason (docs/kubeflow.md, "One
//! rank per GPU per job").

use std::collections::BTreeMap;

use gpuslice_registry::annotations::{parse_ask, Ask, CONTAINER_NAME, PREFIX, RESERVATION};
use gpuslice_registry::Request;
use serde_json::{json, Value};

pub use gpuslice_dra::jobs::{JOB_LABEL, JOB_LABELS};

/// The pod annotation that states the rule the webhook applied. Not under `gpuslice.io/`:
/// nodes pass `gpuslice.io/*` pod annotations to the container runtime, which reads them as
/// a slice request (docs/annotations.md).
pub const RULE_ANNOTATION: &str = "placement.gpuslice.io/rule";
/// [`RULE_ANNOTATION`] as a JSON Pointer into the pod (its `/` written `~1`).
const RULE_ANNOTATION_PATH: &str = "/metadata/annotations/placement.gpuslice.io~1rule";
pub use gpuslice_registry::annotations::request_key;
/// The topology of the rule: one rank of a job per node.
pub const NODE_KEY: &str = "kubernetes.io/hostname";
const REQUIRED: &str = "requiredDuringSchedulingIgnoredDuringExecution";

/// The job `pod` belongs to ([`gpuslice_dra::jobs::job_of`]): its label and value.
pub fn job_of(pod: &Value) -> Option<(&'static str, String)> {
    let labels = pod["metadata"]["labels"].as_object()?;
    gpuslice_dra::jobs::job_of(|k| labels.get(k).and_then(Value::as_str))
        .map(|(k, v)| (k, v.to_string()))
}

/// The annotations by which `pod` asks the node for slices (the annotation path: the request
/// keys the node reads, [`request_key`]; other `gpuslice.io/*` annotations ask nothing),
/// which the webhook leaves as written.
pub fn slice_annotations(pod: &Value) -> Vec<&str> {
    pod["metadata"]["annotations"]
        .as_object()
        .map(|a| {
            a.keys()
                .map(String::as_str)
                .filter(|k| request_key(k).is_some())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether annotation `key` is one the node reads of a pod asking it for slices
/// ([`node_slice`]): every `gpuslice.io/*` annotation, not the request keys alone (another
/// key makes it refuse every container of the pod, [`RESERVATION`] makes it take the spec
/// for one already edited). What the webhook keeps of a pod that has a request key.
pub fn node_reads(key: &str) -> bool {
    key.starts_with(PREFIX)
}

/// The slice the node books for container `container` of a pod whose `gpuslice.io/*`
/// annotations are `ann` ([`node_reads`]), as it reads them when it creates the container
/// (the runtime gives each container the pod's annotations and its own name): its request
/// ([`parse_ask`]), or `None` where it books none: no key applies to the container, it opted
/// out, a value or key the node refuses (the container is not created), or [`RESERVATION`],
/// which the node takes for a spec it edited already (one the pod sets itself is refused as
/// forged).
pub fn node_slice(ann: &BTreeMap<String, String>, container: &str) -> Option<Box<Request>> {
    if ann.contains_key(RESERVATION) {
        return None;
    }
    let mut ann = ann.clone();
    ann.insert(CONTAINER_NAME[0].to_string(), container.to_string());
    match parse_ask(&ann) {
        Ok(Ask::Slice(req)) => Some(req),
        _ => None,
    }
}

/// Whether `pod` asks the node for slices by annotation ([`slice_annotations`]).
pub fn asks_by_annotation(pod: &Value) -> bool {
    !slice_annotations(pod).is_empty()
}

/// The warning for a rank of job `label`=`value` whose entry `entry` names a claim the
/// webhook could not read (`detail`: missing yet, or why not): it is not known to ask
/// gpuslice's devices, so the rank is not kept apart for it.
pub fn unread_claim(entry: &str, detail: &str, label: &str, value: &str) -> String {
    format!(
        "spec.resourceClaims[{entry}]: {detail}: whether it asks gpuslice's devices is unknown, so this pod is not kept off the nodes of the other ranks of job {label}={value}; create the claim before the pods that name it (docs/kubeflow.md, \"One rank per GPU per job\")"
    )
}

/// A rank of a job refused for the rule's sake.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// It names `count` distinct ResourceClaims, more than the `max` the webhook reads, and
    /// none of those read asks gpuslice's devices: whether the others do is unknown, and a
    /// rank admitted without the rule may share a GPU with another.
    #[error("spec.resourceClaims names {count} distinct ResourceClaims by resourceClaimName: the webhook reads at most {max} to tell whether a rank of job {job} asks gpuslice's devices, and none of those asks them, so whether this pod must be kept off the nodes of the other ranks is unknown; accepted: at most {max} distinct ResourceClaims named by resourceClaimName in a pod of a job, or one asking gpuslice's devices among the first {max} (docs/kubeflow.md, \"One rank per GPU per job\")")]
    TooManyClaims {
        count: usize,
        max: usize,
        job: String,
    },
}

/// The rule as the annotation and the admission warning state it.
pub fn rule(label: &str, value: &str) -> String {
    format!("one node per rank of job {label}={value}: NCCL refuses two ranks on one GPU")
}

/// For a pod of a job that gets gpuslice devices: the JSON Patch operations that append the
/// job's anti-affinity term to the pod's own required terms (kept) and state the rule in
/// [`RULE_ANNOTATION`], and the warning; `None` for a pod of no job. A pod already holding
/// the same term gets only the annotation.
pub fn keep_ranks_apart(pod: &Value) -> Option<(Vec<Value>, String)> {
    let (label, value) = job_of(pod)?;
    let term = json!({
        "labelSelector": {"matchLabels": {label: value}},
        "topologyKey": NODE_KEY,
    });
    let affinity = &pod["spec"]["affinity"];
    let anti = &affinity["podAntiAffinity"];
    let mut patch = Vec::new();
    if !affinity.is_object() {
        patch.push(json!({"op": "add", "path": "/spec/affinity",
                          "value": {"podAntiAffinity": {REQUIRED: [term]}}}));
    } else if !anti.is_object() {
        patch.push(
            json!({"op": "add", "path": "/spec/affinity/podAntiAffinity",
                          "value": {REQUIRED: [term]}}),
        );
    } else {
        match anti[REQUIRED].as_array() {
            None => patch.push(json!({"op": "add",
                "path": format!("/spec/affinity/podAntiAffinity/{REQUIRED}"), "value": [term]})),
            Some(terms) if terms.contains(&term) => {}
            Some(_) => patch.push(json!({"op": "add",
                "path": format!("/spec/affinity/podAntiAffinity/{REQUIRED}/-"), "value": term})),
        }
    }
    let said = rule(label, &value);
    if pod["metadata"]["annotations"].is_object() {
        patch.push(json!({"op": "add",
            "path": RULE_ANNOTATION_PATH,
            "value": said}));
    } else {
        patch.push(json!({"op": "add", "path": "/metadata/annotations",
                          "value": {RULE_ANNOTATION: said}}));
    }
    Some((patch, said))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `patch` applied to `doc` (the operations [`keep_ranks_apart`] writes: `add` of a member
    /// or at the end of a list).
    fn apply(mut doc: Value, patch: &[Value]) -> Value {
        for op in patch {
            assert_eq!(op["op"], "add", "{op}");
            let path = op["path"].as_str().unwrap();
            let mut parts: Vec<String> = path[1..]
                .split('/')
                .map(|p| p.replace("~1", "/").replace("~0", "~"))
                .collect();
            let last = parts.pop().unwrap();
            let mut at = &mut doc;
            for p in &parts {
                at = &mut at[p.as_str()];
            }
            if last == "-" {
                at.as_array_mut().unwrap().push(op["value"].clone());
            } else {
                at[last.as_str()] = op["value"].clone();
            }
        }
        doc
    }

    fn pod(labels: Value) -> Value {
        json!({"metadata": {"name": "r", "labels": labels}, "spec": {"containers": []}})
    }

    fn term(label: &str, value: &str) -> Value {
        json!({"labelSelector": {"matchLabels": {label: value}}, "topologyKey": "kubernetes.io/hostname"})
    }

    #[test]
    fn each_job_label_gets_its_term_and_the_rule() {
        for (label, kind) in [
            ("training.kubeflow.org/job-name", "PyTorchJob"),
            ("jobset.sigs.k8s.io/jobset-name", "JobSet"),
            ("gpuslice.io/job", "the documented label"),
        ] {
            let p = pod(json!({label: "train", "app": "x"}));
            let (patch, warning) = keep_ranks_apart(&p).unwrap();
            let got = apply(p, &patch);
            assert_eq!(
                got["spec"]["affinity"],
                json!({"podAntiAffinity": {REQUIRED: [term(label, "train")]}}),
                "{kind}"
            );
            let said = format!(
                "one node per rank of job {label}=train: NCCL refuses two ranks on one GPU"
            );
            assert_eq!(
                got["metadata"]["annotations"][RULE_ANNOTATION], said,
                "{kind}"
            );
            assert_eq!(warning, said);
        }
        // The documented label wins over the operators' (it is the user's own grouping).
        let p = pod(json!({"training.kubeflow.org/job-name": "a", "gpuslice.io/job": "team"}));
        assert_eq!(job_of(&p), Some(("gpuslice.io/job", "team".to_string())));
    }

    #[test]
    fn a_pod_of_no_job_is_untouched() {
        for labels in [
            json!({"app": "x"}),
            json!({"gpuslice.io/job": ""}),
            json!({"training.kubeflow.org/job-name": 3}),
            Value::Null,
        ] {
            assert!(keep_ranks_apart(&pod(labels.clone())).is_none(), "{labels}");
        }
    }

    #[test]
    fn the_pods_own_affinity_is_kept() {
        let mine = json!({"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "zone"});
        let node_affinity = json!({"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]}});
        let job = json!({"gpuslice.io/job": "j"});
        let cases = [
            // Required terms of its own: the job's appended after them.
            (
                json!({"nodeAffinity": node_affinity, "podAntiAffinity": {
                    REQUIRED: [mine], "preferredDuringSchedulingIgnoredDuringExecution": []}}),
                json!({"nodeAffinity": node_affinity, "podAntiAffinity": {
                    REQUIRED: [mine, term("gpuslice.io/job", "j")],
                    "preferredDuringSchedulingIgnoredDuringExecution": []}}),
            ),
            // Only preferred terms: the required list added beside them.
            (
                json!({"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}),
                json!({"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [],
                    REQUIRED: [term("gpuslice.io/job", "j")]}}),
            ),
            // Node affinity only: podAntiAffinity added beside it.
            (
                json!({"nodeAffinity": node_affinity}),
                json!({"nodeAffinity": node_affinity,
                    "podAntiAffinity": {REQUIRED: [term("gpuslice.io/job", "j")]}}),
            ),
            // The same term already written: not repeated.
            (
                json!({"podAntiAffinity": {REQUIRED: [term("gpuslice.io/job", "j")]}}),
                json!({"podAntiAffinity": {REQUIRED: [term("gpuslice.io/job", "j")]}}),
            ),
        ];
        for (affinity, want) in cases {
            let mut p = pod(job.clone());
            p["spec"]["affinity"] = affinity.clone();
            p["metadata"]["annotations"] = json!({"other": "kept"});
            let (patch, _) = keep_ranks_apart(&p).unwrap();
            let got = apply(p, &patch);
            assert_eq!(got["spec"]["affinity"], want, "from {affinity}");
            assert_eq!(got["metadata"]["annotations"]["other"], "kept");
            assert!(got["metadata"]["annotations"][RULE_ANNOTATION].is_string());
        }
    }
}
