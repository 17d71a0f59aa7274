//! The DRA packaging (`packaging/kubernetes/dra/`), validated without a cluster: every
//! document deserialises into the Kubernetes API types of the pinned release and serialises
//! back to exactly what the file says (an unknown or misspelt field fails), and the parts
//! that must agree with the plugin do: the DeviceClass and driver name, the RBAC of
//! kubernetes.md, the DaemonSet's sockets and directories, the claims' capacity keys, and the
//! policy that keeps the plugin's ServiceAccount to its own node's ResourceSlices.

use std::path::{Path, PathBuf};

use gpuslice_dra::slices::ATTR_SLOT;
use gpuslice_dra::{DRIVER, SLOTS_CLASS};
use gpuslice_kube::serve::{DEFAULT_PLUGIN_DIR, DEFAULT_REGISTRATION_DIR};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::core::v1::{PodSpec, PodTemplateSpec, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaimTemplate};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The policy that keeps the plugin to its own node's ResourceSlices.
const PLUGIN_POLICY: &str = "kubelet-plugin.gpuslice.io";
/// The policy that lets the plugin change only its wake annotation of its own node's pods.
const PLUGIN_PODS_POLICY: &str = "kubelet-plugin-pods.gpuslice.io";

fn dra() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/kubernetes/dra")
}

/// Every YAML document of `dir/*.yaml`: (file name, document).
fn documents(dir: &Path) -> Vec<(String, Value)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for doc in serde_yaml_ng::Deserializer::from_str(&text) {
            let v = Value::deserialize(doc).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            out.push((f.file_name().unwrap().to_string_lossy().into_owned(), v));
        }
    }
    out
}

/// Parses `doc` as `T` and checks nothing was lost or invented on the way back.
fn typed<T: DeserializeOwned + Serialize>(file: &str, doc: &Value) -> T {
    let t: T = serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("{file}: not a valid {}: {e}", std::any::type_name::<T>()));
    let back = serde_json::to_value(&t).unwrap();
    assert_eq!(
        &back, doc,
        "{file}: fields lost or changed by the API types"
    );
    t
}

/// The claim names a pod spec declares and the ones its containers use: each used one is
/// declared, and every declared one names a template.
fn check_pod_claims(file: &str, spec: &PodSpec) {
    let declared: Vec<&str> = spec
        .resource_claims
        .iter()
        .flatten()
        .map(|c| {
            assert!(
                c.resource_claim_template_name.is_some(),
                "{file}: {} names no template",
                c.name
            );
            c.name.as_str()
        })
        .collect();
    assert!(!declared.is_empty(), "{file}: the pod declares no claim");
    for c in &spec.containers {
        let used: Vec<&str> = c
            .resources
            .as_ref()
            .and_then(|r| r.claims.as_ref())
            .into_iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert!(
            !used.is_empty(),
            "{file}: container {} uses no claim",
            c.name
        );
        for u in used {
            assert!(
                declared.contains(&u),
                "{file}: container {} uses undeclared claim {u}",
                c.name
            );
        }
    }
}

/// The policy that lets a pod list at most one claim (slot-pods-policy.yaml).
const SLOT_PODS_POLICY: &str = "slot-pods.gpuslice.io";

fn check_template(file: &str, t: &ResourceClaimTemplate) {
    for r in t
        .spec
        .as_ref()
        .unwrap()
        .spec
        .as_ref()
        .unwrap()
        .devices
        .as_ref()
        .unwrap()
        .requests
        .as_ref()
        .unwrap()
    {
        let exactly = r.exactly.as_ref().unwrap();
        if exactly.device_class_name == SLOTS_CLASS {
            // Slot mode: k slots of one GPU, the request constrained to one GPU's identity.
            let count = exactly.count.unwrap();
            assert!((1..=16).contains(&count), "{file}: {count} slots");
            let constraints = t
                .spec
                .as_ref()
                .unwrap()
                .spec
                .as_ref()
                .unwrap()
                .devices
                .as_ref()
                .unwrap()
                .constraints
                .as_ref()
                .unwrap();
            assert!(
                constraints
                    .iter()
                    .any(|c| c.match_attribute.as_deref() == Some("gpuslice.io/uuid")
                        && c.requests.iter().flatten().any(|n| *n == r.name)),
                "{file}: request {} is not constrained to one GPU",
                r.name
            );
            continue;
        }
        assert_eq!(exactly.device_class_name, DRIVER, "{file}");
        let requests = exactly
            .capacity
            .as_ref()
            .unwrap()
            .requests
            .as_ref()
            .unwrap();
        // Bare keys: until Kubernetes 1.38 a claim must name exactly the published key.
        for k in requests.keys() {
            assert!(k == "memory" || k == "cores", "{file}: capacity key {k}");
        }
        assert!(
            requests.contains_key("memory"),
            "{file}: a slice names its memory"
        );
    }
}

#[test]
fn dra_manifests_are_valid_and_agree_with_the_plugin() {
    let docs = documents(&dra());
    let examples = documents(&dra().join("examples"));
    let mut kinds = Vec::new();
    let mut classes = Vec::new();
    let mut policies = Vec::new();
    let mut bindings = Vec::new();
    for (file, doc) in docs.iter().chain(examples.iter()) {
        let kind = doc["kind"]
            .as_str()
            .unwrap_or_else(|| panic!("{file}: no kind"))
            .to_string();
        match kind.as_str() {
            "DeviceClass" => {
                let d: DeviceClass = typed(file, doc);
                let cel = &d.spec.as_ref().unwrap().selectors.as_ref().unwrap()[0]
                    .cel
                    .as_ref()
                    .unwrap()
                    .expression;
                match d.metadata.name.as_deref() {
                    // Never the slots of slot mode (docs/kubernetes-dra.md, "Bounded search").
                    Some(DRIVER) => assert_eq!(
                        cel,
                        &format!("device.driver == \"{DRIVER}\" && !(\"{ATTR_SLOT}\" in device.attributes[\"{DRIVER}\"])")
                    ),
                    Some(SLOTS_CLASS) => assert_eq!(
                        cel,
                        &format!("device.driver == \"{DRIVER}\" && \"{ATTR_SLOT}\" in device.attributes[\"{DRIVER}\"]")
                    ),
                    other => panic!("{file}: DeviceClass {other:?}"),
                }
                classes.push(d.metadata.name.clone().unwrap());
            }
            "ServiceAccount" => {
                typed::<ServiceAccount>(file, doc);
            }
            "ClusterRole" => {
                let r: ClusterRole = typed(file, doc);
                let rules = r.rules.unwrap();
                let verbs = |res: &str| -> Vec<String> {
                    rules
                        .iter()
                        .find(|r| r.resources.iter().flatten().any(|x| x == res))
                        .unwrap_or_else(|| panic!("no rule for {res}"))
                        .verbs
                        .clone()
                };
                // Exactly the calls of src/, nothing more: its node's slices listed, created,
                // replaced and deleted (publisher.rs), watched (slice_watch.rs), a dry-run
                // create (probe.rs); a claim by name (booking.rs, health_events.rs); its Node
                // (publisher.rs); events posted (health_events.rs) and watched
                // (stalled_prepare.rs); a pod read and patched (stalled_prepare.rs).
                assert_eq!(
                    verbs("resourceslices"),
                    ["list", "watch", "create", "update", "delete"]
                );
                assert_eq!(verbs("resourceclaims"), ["get"]);
                assert_eq!(verbs("nodes"), ["get"]);
                assert_eq!(verbs("events"), ["create", "watch"]);
                assert_eq!(verbs("pods"), ["get", "patch"]);
                let mut resources: Vec<&str> = rules
                    .iter()
                    .flat_map(|r| r.resources.iter().flatten().map(String::as_str))
                    .collect();
                resources.sort_unstable();
                assert_eq!(
                    resources,
                    [
                        "events",
                        "nodes",
                        "pods",
                        "resourceclaims",
                        "resourceslices"
                    ],
                    "{file}: one rule per resource, no other resource"
                );
            }
            "ClusterRoleBinding" => {
                let b: ClusterRoleBinding = typed(file, doc);
                assert_eq!(b.role_ref.name, "gpuslice-kubelet-plugin");
                assert_eq!(b.subjects.unwrap()[0].name, "gpuslice-kubelet-plugin");
            }
            "DaemonSet" => {
                let d: DaemonSet = typed(file, doc);
                let spec = d.spec.template.spec.unwrap();
                assert_eq!(
                    spec.host_pid,
                    Some(true),
                    "the registry checks the node's pids"
                );
                assert_eq!(
                    spec.service_account_name.as_deref(),
                    Some("gpuslice-kubelet-plugin")
                );
                let c = &spec.containers[0];
                assert_eq!(c.command.as_ref().unwrap()[1], "kubelet-plugin");
                let env = c.env.as_ref().unwrap();
                assert!(env.iter().any(|e| e.name == "NODE_NAME"
                    && e.value_from
                        .as_ref()
                        .unwrap()
                        .field_ref
                        .as_ref()
                        .unwrap()
                        .field_path
                        == "spec.nodeName"));
                let mounts: Vec<&str> = c
                    .volume_mounts
                    .as_ref()
                    .unwrap()
                    .iter()
                    .map(|m| m.mount_path.as_str())
                    .collect();
                for dir in [
                    DEFAULT_PLUGIN_DIR,
                    DEFAULT_REGISTRATION_DIR,
                    "/run/gpuslice",
                    "/var/run/cdi",
                    "/etc/gpuslice",
                ] {
                    assert!(mounts.contains(&dir), "{file}: {dir} not mounted");
                }
                // Each host directory is mounted at the same path (the CDI specs and the
                // kubelet name host paths), in whichever container mounts it; the one other
                // volume is the ConfigMap the installer waits on, in its init container only.
                let containers: Vec<_> = spec
                    .init_containers
                    .iter()
                    .flatten()
                    .chain(&spec.containers)
                    .collect();
                for v in spec.volumes.as_ref().unwrap() {
                    let using: Vec<_> = containers
                        .iter()
                        .flat_map(|c| {
                            let name = c.name.as_str();
                            c.volume_mounts
                                .iter()
                                .flatten()
                                .filter(|m| m.name == v.name)
                                .map(move |m| (name, m))
                        })
                        .collect();
                    assert!(!using.is_empty(), "{file}: volume {} not mounted", v.name);
                    match (&v.host_path, &v.config_map) {
                        (Some(h), None) => {
                            for (c, m) in &using {
                                assert_eq!(m.mount_path, h.path, "{file}: {c}: volume {}", v.name);
                            }
                        }
                        (None, Some(cm)) => {
                            assert_eq!(v.name, "installer-config", "{file}");
                            assert_eq!(cm.optional, Some(true), "{file}: {}", v.name);
                            assert!(
                                using.iter().all(|(c, m)| *c == "wait-installed"
                                    && m.read_only == Some(true)),
                                "{file}: {} mounted by {:?}",
                                v.name,
                                using.iter().map(|(c, _)| c).collect::<Vec<_>>()
                            );
                        }
                        _ => panic!("{file}: volume {} is neither a host directory nor the installer's ConfigMap", v.name),
                    }
                }
            }
            "ValidatingAdmissionPolicy" if doc["metadata"]["name"] == PLUGIN_POLICY => {
                // The plugin's ServiceAccount (as rbac.yaml names it) writes only the slices of
                // the node its token was issued for, on every write.
                let p: ValidatingAdmissionPolicy = typed(file, doc);
                let spec = p.spec.unwrap();
                assert_eq!(spec.failure_policy.as_deref(), Some("Fail"));
                let rules = spec.match_constraints.unwrap().resource_rules.unwrap();
                assert_eq!(rules.len(), 1);
                assert_eq!(
                    rules[0].resources.as_deref(),
                    Some(&["resourceslices".to_string()][..])
                );
                assert_eq!(
                    rules[0].operations.as_deref(),
                    Some(
                        &[
                            "CREATE".to_string(),
                            "UPDATE".to_string(),
                            "DELETE".to_string()
                        ][..]
                    )
                );
                let who = &spec.match_conditions.unwrap()[0].expression;
                assert_eq!(
                    who,
                    "request.userInfo.username == 'system:serviceaccount:gpuslice-system:gpuslice-kubelet-plugin'"
                );
                let vars = spec.variables.unwrap();
                assert!(
                    vars[0].expression.contains(
                        "request.userInfo.extra['authentication.kubernetes.io/node-name'][0]"
                    ),
                    "{}",
                    vars[0].expression
                );
                assert!(
                    vars[1].expression.contains("oldObject"),
                    "deletes are checked too"
                );
                assert_eq!(spec.validations.unwrap().len(), 2);
                policies.push(PLUGIN_POLICY);
            }
            "ValidatingAdmissionPolicy" if doc["metadata"]["name"] == PLUGIN_PODS_POLICY => {
                // The plugin's ServiceAccount changes only the annotation the plugin's wake
                // sets (kube/plugin/src/stalled_prepare.rs), of pods of its token's node.
                let p: ValidatingAdmissionPolicy = typed(file, doc);
                let spec = p.spec.unwrap();
                assert_eq!(spec.failure_policy.as_deref(), Some("Fail"));
                let rules = spec.match_constraints.unwrap().resource_rules.unwrap();
                assert_eq!(
                    rules[0].resources.as_deref(),
                    Some(&["pods".to_string()][..])
                );
                assert_eq!(
                    rules[0].operations.as_deref(),
                    Some(&["UPDATE".to_string()][..])
                );
                let who = &spec.match_conditions.unwrap()[0].expression;
                assert_eq!(
                    who,
                    "request.userInfo.username == 'system:serviceaccount:gpuslice-system:gpuslice-kubelet-plugin'"
                );
                let v = spec.validations.unwrap();
                assert_eq!(v.len(), 3);
                assert!(
                    v[2].expression.contains(&format!(
                        "k == '{}'",
                        gpuslice_kube::stalled_prepare::ANNOTATION
                    )),
                    "{}",
                    v[2].expression
                );
                policies.push(PLUGIN_PODS_POLICY);
            }
            "ValidatingAdmissionPolicy" => {
                // The policy refusing slot claims that could never be placed: its N is the
                // plugin's default slots per GPU, and it names the class and the constraint
                // the plugin reads.
                let p: ValidatingAdmissionPolicy = typed(file, doc);
                if p.metadata.name.as_deref() == Some(SLOT_PODS_POLICY) {
                    // At most one claim per pod (docs/kubernetes-dra.md, "Bounded search").
                    let spec = p.spec.unwrap();
                    let v = spec.validations.unwrap();
                    assert_eq!(
                        v[0].expression,
                        "size(object.spec.?resourceClaims.orValue([])) <= 1"
                    );
                    assert_eq!(spec.failure_policy.as_deref(), Some("Fail"));
                    policies.push(SLOT_PODS_POLICY);
                    kinds.push(kind);
                    continue;
                }
                assert_eq!(p.metadata.name.as_deref(), Some(SLOTS_CLASS));
                policies.push(SLOTS_CLASS);
                let spec = p.spec.unwrap();
                let vars = spec.variables.unwrap();
                assert_eq!(vars[0].name, "slotsPerGpu");
                assert_eq!(
                    vars[0].expression,
                    gpuslice_config::DEFAULT_SLOTS_PER_GPU.to_string()
                );
                let all: String = vars.iter().map(|v| v.expression.as_str()).collect();
                assert!(all.contains(&format!("'{SLOTS_CLASS}'")), "{all}");
                assert!(all.contains(&format!("'{DRIVER}/uuid'")), "{all}");
                assert_eq!(spec.validations.unwrap().len(), 7);
                assert_eq!(spec.failure_policy.as_deref(), Some("Fail"));
            }
            "ValidatingAdmissionPolicyBinding" => {
                let b: ValidatingAdmissionPolicyBinding = typed(file, doc);
                assert!(
                    [
                        SLOTS_CLASS,
                        PLUGIN_POLICY,
                        PLUGIN_PODS_POLICY,
                        SLOT_PODS_POLICY
                    ]
                    .contains(&b.spec.policy_name.as_str()),
                    "{file}: binding of {}",
                    b.spec.policy_name
                );
                assert_eq!(
                    b.metadata.name.as_deref(),
                    Some(b.spec.policy_name.as_str())
                );
                assert_eq!(b.spec.validation_actions, ["Deny"]);
                bindings.push(b.spec.policy_name.clone());
            }
            "ResourceClaimTemplate" => {
                let t: ResourceClaimTemplate = typed(file, doc);
                check_template(file, &t);
            }
            "Pod" => {
                let p: Pod = typed(file, doc);
                check_pod_claims(file, p.spec.as_ref().unwrap());
            }
            "Deployment" => {
                let d: Deployment = typed(file, doc);
                let spec = d.spec;
                assert_eq!(spec.replicas, Some(3));
                check_pod_claims(file, spec.template.spec.as_ref().unwrap());
            }
            "PyTorchJob" => {
                // Kubeflow's type is not in k8s-openapi: its replica templates are pod templates.
                assert_eq!(doc["apiVersion"], "kubeflow.org/v1");
                let specs = doc["spec"]["pytorchReplicaSpecs"].as_object().unwrap();
                assert!(specs.contains_key("Master") && specs.contains_key("Worker"));
                let job = doc["metadata"]["name"].as_str().unwrap();
                for (role, r) in specs {
                    let t: PodTemplateSpec = typed(&format!("{file} {role}"), &r["template"]);
                    let spec = t.spec.as_ref().unwrap();
                    check_pod_claims(file, spec);
                    // Its slices may share a GPU, its ranks may not (NCCL): without the
                    // webhook the example keeps them apart itself, one rank per node.
                    let apart = spec
                        .affinity
                        .as_ref()
                        .and_then(|a| a.pod_anti_affinity.as_ref())
                        .and_then(|a| {
                            a.required_during_scheduling_ignored_during_execution
                                .as_ref()
                        })
                        .is_some_and(|terms| {
                            terms.iter().any(|t| {
                                t.topology_key == "kubernetes.io/hostname"
                                    && t.label_selector
                                        .as_ref()
                                        .and_then(|s| s.match_labels.as_ref())
                                        .and_then(|l| l.get("training.kubeflow.org/job-name"))
                                        .is_some_and(|v| v == job)
                            })
                        });
                    assert!(
                        apart,
                        "{file} {role}: no one-rank-per-node anti-affinity on job {job}"
                    );
                }
            }
            other => panic!("{file}: unexpected kind {other}"),
        }
        kinds.push(kind);
    }
    for k in [
        "DeviceClass",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "DaemonSet",
        "ResourceClaimTemplate",
        "Pod",
        "Deployment",
        "PyTorchJob",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ] {
        assert!(kinds.iter().any(|x| x == k), "no {k} in the DRA packaging");
    }
    classes.sort();
    assert_eq!(
        classes,
        [DRIVER, SLOTS_CLASS],
        "both DeviceClasses are shipped"
    );
    policies.sort_unstable();
    bindings.sort_unstable();
    assert_eq!(
        policies,
        [
            PLUGIN_PODS_POLICY,
            PLUGIN_POLICY,
            SLOT_PODS_POLICY,
            SLOTS_CLASS
        ]
    );
    assert_eq!(bindings, policies, "each policy is bound");
}
