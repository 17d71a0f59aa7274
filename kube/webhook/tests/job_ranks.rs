//! A rank of a job that gets gpuslice's devices otherwise than by limits the webhook turns
//! into a claim is kept off its job's other ranks' nodes as such a rank is (docs/kubeflow.md,
//! "One rank per GPU per job"): one whose own claim templates ask gpuslice's device classes,
//! one naming a claim written by hand that asks them, one asking the node by `gpuslice.io/*`
//! annotations, one asking a class by the extended resource Kubernetes names after it; and a
//! rank whose containers that run together each ask a slice by limits is
//! refused (their claims may be given one GPU), the same pod of no job admitted with a
//! warning saying so. The real server over TLS answers the review of such a pod with the job's
//! required anti-affinity term, the rule's annotation and the rule as a warning (also, in a
//! namespace without a budget, when its template is missing or cannot be charged; also for
//! each of the ranks naming one shared claim, which then cannot all be placed), and leaves a
//! pod of no job, and a rank whose template or claim asks another driver's class (also one
//! whose other driver's parameters nest past the JSON parser's limit), unchanged; a rank
//! naming a claim not there yet is admitted unchanged with a warning saying so. The
//! registrations (the chart's and the test cluster's) send such pods: their condition, word
//! for word the same, names the job labels, named claims and the classes' extended
//! resources, and sends every pod with the
//! annotations, of a job or not (refused where a budget holds: `budgets::`). The server
//! reads the templates and claims from the FAKE API server of `gpuslice-fakeapi` (no control
//! plane runs in a crate's tests; `kubeflow::` in tests/ runs the real one with Kubeflow
//! Trainer), which holds them and no ResourceSlice (a cluster in capacity mode whose nodes
//! publish no GPU yet: a template's charge then counts its memory asked) nor ResourceQuota
//! (no budget).

use base64::Engine;
use gpuslice_fakeapi::FakeApi;
use gpuslice_webhook::placement::JOB_LABELS;
use serde_json::{json, Value};

use crate::hostile::{patient, reviewed, start_against};

/// The registrations' test (CEL, `k` an annotation key) of an annotation that asks the node
/// for a slice: the request keys of `gpuslice_registry::annotations::request_key`, with or without a container's name
/// (also `gpuslice.io/<key>.` with none, which the node refuses: the webhook admits it).
fn annotation_condition() -> String {
    use gpuslice_registry::annotations::{KEYS, PREFIX};
    let quoted = |suffix: &str| -> String {
        KEYS.iter()
            .map(|k| format!("'{PREFIX}{k}{suffix}'"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "k.startsWith('{PREFIX}') && (k in [{}] || [{}].exists(p, k.startsWith(p)))",
        quoted(""),
        quoted(".")
    )
}

const NS: &str = "team";

/// A ResourceClaimTemplate of namespace [`NS`] asking one GPU of 4Gi of DeviceClass `class`.
fn template(name: &str, class: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": class, "count": 1, "capacity": {"requests": {"memory": "4Gi"}},
        }}]}}},
    })
}

/// A ResourceClaim written by hand in namespace [`NS`] asking one GPU of 20Gi of DeviceClass
/// `class`.
fn claim(name: &str, class: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": class, "count": 1, "capacity": {"requests": {"memory": "20Gi"}},
        }}]}},
    })
}

/// The review of the creation of a pod labelled `labels` whose one container uses the claim
/// of its entry `gpu`, made from template `template`; no GPU limits.
fn review(uid: &str, labels: Value, template: &str) -> String {
    pod_review(
        uid,
        labels,
        Value::Null,
        json!([{"name": "gpu", "resourceClaimTemplateName": template}]),
    )
}

/// The review of the creation of a pod labelled `labels`, annotated `annotations` (`null`:
/// none), of RuntimeClass `gpuslice`, with the claim entries `entries` (`null`: none), whose
/// one container uses the entry `gpu` if there is one; no GPU limits.
fn pod_review(uid: &str, labels: Value, annotations: Value, entries: Value) -> String {
    let claims = if entries.is_null() {
        json!([])
    } else {
        json!([{"name": "gpu"}])
    };
    let mut spec = json!({
        "runtimeClassName": "gpuslice",
        "containers": [{"name": "node", "image": "x", "resources": {"claims": claims}}],
    });
    if !entries.is_null() {
        spec["resourceClaims"] = entries;
    }
    let mut metadata = json!({"name": uid, "namespace": NS, "labels": labels});
    if !annotations.is_null() {
        metadata["annotations"] = annotations;
    }
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": uid, "namespace": NS, "operation": "CREATE",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "object": {"metadata": metadata, "spec": spec},
        },
    })
    .to_string()
}

/// The job's required anti-affinity term added to a pod without affinity, and the rule's
/// annotation added beside its own annotations (`annotated`) or as its first: the whole
/// patch a rank asking no limits gets.
fn kept_apart(label: &str, value: &str, annotated: bool) -> Value {
    let said =
        format!("one node per rank of job {label}={value}: NCCL refuses two ranks on one GPU");
    let annotation = if annotated {
        json!({"op": "add", "path": "/metadata/annotations/placement.gpuslice.io~1rule",
               "value": said})
    } else {
        json!({"op": "add", "path": "/metadata/annotations",
               "value": {"placement.gpuslice.io/rule": said}})
    };
    json!([
        {"op": "add", "path": "/spec/affinity", "value": {"podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [{
                "labelSelector": {"matchLabels": {label: value}},
                "topologyKey": "kubernetes.io/hostname",
            }],
        }}},
        annotation,
    ])
}

/// The answer's JSON Patch, decoded (empty when it has none).
fn patch(answer: &Value) -> Value {
    match answer["response"]["patch"].as_str() {
        None => json!([]),
        Some(b64) => serde_json::from_slice(
            &base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap(),
        )
        .unwrap(),
    }
}

#[test]
fn a_rank_whose_own_claim_templates_ask_gpuslice_is_kept_off_its_jobs_other_ranks_nodes() {
    let mut all = template("all-gpus", "gpuslice.io");
    all["spec"]["spec"]["devices"]["requests"][0]["exactly"] =
        json!({"deviceClassName": "gpuslice.io", "allocationMode": "All"});
    // Another driver's template whose opaque parameters nest past the JSON parser's limit
    // (the API server stores them): read all the same, through the webhook's view.
    let mut deep = template("other-gpu-deep", "gpu.example.com");
    let mut parameters = json!(1);
    for _ in 0..200 {
        parameters = json!({ "a": parameters });
    }
    deep["spec"]["spec"]["devices"]["config"] =
        json!([{"opaque": {"driver": "gpu.example.com", "parameters": parameters}}]);
    let api = FakeApi::start();
    for t in [
        template("rank-4gi", "gpuslice.io"),
        template("other-gpu", "gpu.example.com"),
        deep,
        all,
    ] {
        api.put("resourceclaimtemplates", &t);
    }
    let w = start_against(&api.url, patient());
    let job = json!({"training.kubeflow.org/job-name": "rdzv", "app": "x"});

    // A rank of PyTorchJob rdzv: the job's term and the rule, nothing else (its claim entry
    // is its own, unchanged).
    let answer = reviewed(w.addr, &review("rank", job.clone(), "rank-4gi"));
    let said = "one node per rank of job training.kubeflow.org/job-name=rdzv: NCCL refuses two ranks on one GPU";
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert_eq!(answer["response"]["uid"], "rank", "{answer}");
    assert_eq!(answer["response"]["warnings"], json!([said]), "{answer}");
    assert_eq!(
        patch(&answer),
        json!([
            {"op": "add", "path": "/spec/affinity", "value": {"podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [{
                    "labelSelector": {"matchLabels": {"training.kubeflow.org/job-name": "rdzv"}},
                    "topologyKey": "kubernetes.io/hostname",
                }],
            }}},
            {"op": "add", "path": "/metadata/annotations",
             "value": {"placement.gpuslice.io/rule": said}},
        ]),
        "{answer}"
    );

    // Without a budget nothing is charged and nothing refused for it: a rank naming a
    // template its namespace lacks yet (Kubernetes lets it wait for it), or one that asks
    // every GPU of the node (allocationMode All, which no budget can count), is admitted and
    // kept off its job's other ranks' nodes all the same.
    for (uid, template) in [("missing", "rank-8gi"), ("all", "all-gpus")] {
        let answer = reviewed(w.addr, &review(uid, job.clone(), template));
        let r = &answer["response"];
        assert_eq!(r["allowed"], true, "{uid}: {answer}");
        assert_eq!(r["warnings"], json!([said]), "{uid}: {answer}");
        assert_eq!(
            patch(&answer)[0]["value"]["podAntiAffinity"]
                ["requiredDuringSchedulingIgnoredDuringExecution"][0]["labelSelector"],
            json!({"matchLabels": {"training.kubeflow.org/job-name": "rdzv"}}),
            "{uid}: {answer}"
        );
    }

    // The missing template was asked of the API server, which answered it is not there.
    let missing =
        format!("GET /apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaimtemplates/rank-8gi");
    assert!(api.requests().contains(&missing), "{:?}", api.requests());

    // The same pod of no job, and a rank whose template asks another driver's devices
    // (gpuslice gives it none), deeply configured or not: admitted unchanged, without a
    // warning.
    for (uid, labels, template) in [
        ("no-job", json!({"app": "x"}), "rank-4gi"),
        ("other-driver", job.clone(), "other-gpu"),
        ("other-driver-deep", job, "other-gpu-deep"),
    ] {
        let answer = reviewed(w.addr, &review(uid, labels, template));
        let r = &answer["response"];
        assert_eq!(r["allowed"], true, "{uid}: {answer}");
        assert_eq!(r["uid"], uid, "{answer}");
        assert!(
            r["patch"].is_null() && r["warnings"].is_null(),
            "{uid}: {answer}"
        );
    }
}

#[test]
fn a_rank_naming_a_claim_of_gpuslices_classes_is_kept_off_its_jobs_other_ranks_nodes() {
    let api = FakeApi::start();
    for c in [
        claim("rank-0-gpu", "gpuslice.io"),
        claim("rank-1-slots", "slots.gpuslice.io"),
        claim("shared", "gpuslice.io"),
        claim("other-gpu", "gpu.example.com"),
    ] {
        api.put_claim(&c);
    }
    let w = start_against(&api.url, patient());
    let job = json!({"training.kubeflow.org/job-name": "rdzv", "app": "x"});
    let said = "one node per rank of job training.kubeflow.org/job-name=rdzv: NCCL refuses two ranks on one GPU";
    let named = |name: &str| json!([{"name": "gpu", "resourceClaimName": name}]);

    // A rank naming its own claim of either of gpuslice's classes: the job's term and the
    // rule, nothing else (its claim entry unchanged).
    for (uid, name) in [("rank-0", "rank-0-gpu"), ("rank-1", "rank-1-slots")] {
        let answer = reviewed(
            w.addr,
            &pod_review(uid, job.clone(), Value::Null, named(name)),
        );
        let r = &answer["response"];
        assert_eq!(r["allowed"], true, "{uid}: {answer}");
        assert_eq!(r["warnings"], json!([said]), "{uid}: {answer}");
        assert_eq!(
            patch(&answer),
            kept_apart("training.kubeflow.org/job-name", "rdzv", false),
            "{uid}: {answer}"
        );
    }
    let get = format!("GET /apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims/rank-0-gpu");
    assert!(api.requests().contains(&get), "{:?}", api.requests());

    // Two ranks naming one claim: each gets the term and the rule's annotation and warning,
    // so the second cannot be placed (the claim holds it to the first's node, the term keeps
    // it off it) and waits with a reason the pod's annotation explains.
    let team = json!({"gpuslice.io/job": "x"});
    let team_said = "one node per rank of job gpuslice.io/job=x: NCCL refuses two ranks on one GPU";
    for uid in ["r0", "r1"] {
        let answer = reviewed(
            w.addr,
            &pod_review(uid, team.clone(), json!({"note": "mine"}), named("shared")),
        );
        let r = &answer["response"];
        assert_eq!(r["allowed"], true, "{uid}: {answer}");
        assert_eq!(r["warnings"], json!([team_said]), "{uid}: {answer}");
        assert_eq!(
            patch(&answer),
            kept_apart("gpuslice.io/job", "x", true),
            "{uid}: {answer}"
        );
    }

    // A rank naming a claim not there yet: admitted unchanged (nothing says it asks
    // gpuslice's devices), with a warning naming the claim and what to do.
    let answer = reviewed(
        w.addr,
        &pod_review("early", job.clone(), Value::Null, named("rank-9-gpu")),
    );
    let r = &answer["response"];
    assert_eq!(r["allowed"], true, "{answer}");
    assert!(r["patch"].is_null(), "{answer}");
    assert_eq!(
        r["warnings"],
        json!([format!(
            "spec.resourceClaims[gpu]: ResourceClaim {NS}/rank-9-gpu does not exist yet: whether it asks gpuslice's devices is unknown, so this pod is not kept off the nodes of the other ranks of job training.kubeflow.org/job-name=rdzv; create the claim before the pods that name it (docs/kubeflow.md, \"One rank per GPU per job\")"
        )]),
        "{answer}"
    );

    // A rank naming another driver's claim, and a pod of no job naming gpuslice's: admitted
    // unchanged, without a warning.
    for (uid, labels, name) in [
        ("other-driver", job, "other-gpu"),
        ("no-job", json!({"app": "x"}), "rank-0-gpu"),
    ] {
        let answer = reviewed(w.addr, &pod_review(uid, labels, Value::Null, named(name)));
        let r = &answer["response"];
        assert_eq!(r["allowed"], true, "{uid}: {answer}");
        assert!(
            r["patch"].is_null() && r["warnings"].is_null(),
            "{uid}: {answer}"
        );
    }
}

/// The GETs by name of objects of `plural` (in [`NS`]) among `api`'s requests, by name.
fn gets(api: &FakeApi, plural: &str) -> Vec<String> {
    let at = format!("GET /apis/resource.k8s.io/v1/namespaces/{NS}/{plural}/");
    api.requests()
        .iter()
        .filter_map(|r| r.strip_prefix(&at).map(str::to_string))
        .collect()
}

#[test]
fn a_ranks_admission_reads_each_named_object_once_and_at_most_32_claims() {
    let api = FakeApi::start();
    api.put(
        "resourceclaimtemplates",
        &template("other-gpu", "gpu.example.com"),
    );
    api.put_claim(&claim("other-gpu", "gpu.example.com"));
    for i in 0..40 {
        api.put_claim(&claim(&format!("o-{i}"), "gpu.example.com"));
    }
    api.put_claim(&claim("mine", "gpuslice.io"));
    let w = start_against(&api.url, patient());
    let job = json!({"gpuslice.io/job": "x"});
    let entries = |names: &mut dyn Iterator<Item = (String, String)>, field: &str| -> Value {
        names
            .enumerate()
            .map(|(i, (_, n))| {
                let entry = if i == 0 {
                    "gpu".to_string()
                } else {
                    format!("e{i}")
                };
                json!({"name": entry, field: n})
            })
            .collect::<Vec<_>>()
            .into()
    };
    let same = |n: &str| std::iter::repeat_n((String::new(), n.to_string()), 256);

    // 256 entries (the most a review may carry) naming one claim, or one template, of another
    // driver: each read once; admitted unchanged.
    for (uid, plural, field) in [
        ("one-claim", "resourceclaims", "resourceClaimName"),
        (
            "one-template",
            "resourceclaimtemplates",
            "resourceClaimTemplateName",
        ),
    ] {
        let named = entries(&mut same("other-gpu"), field);
        let answer = reviewed(w.addr, &pod_review(uid, job.clone(), Value::Null, named));
        let r = &answer["response"];
        assert_eq!(r["allowed"], true, "{uid}: {answer}");
        assert!(
            r["patch"].is_null() && r["warnings"].is_null(),
            "{uid}: {answer}"
        );
        assert_eq!(gets(&api, plural), ["other-gpu"], "{uid}");
    }

    // 40 distinct claims of another driver, then gpuslice's: the first 32 are read (none
    // asks gpuslice's devices), the others not; whether the rank must be kept apart is
    // unknown, so it is refused, naming the count and the most read.
    let mut names = (0..40)
        .map(|i| format!("o-{i}"))
        .chain(["mine".to_string()])
        .map(|n| (String::new(), n));
    let named = entries(&mut names, "resourceClaimName");
    let answer = reviewed(w.addr, &pod_review("many", job.clone(), Value::Null, named));
    let r = &answer["response"];
    assert_eq!(r["allowed"], false, "{answer}");
    assert_eq!(r["status"]["code"], 400, "{answer}");
    assert_eq!(
        r["status"]["message"],
        "spec.resourceClaims names 41 distinct ResourceClaims by resourceClaimName: the webhook reads at most 32 to tell whether a rank of job gpuslice.io/job=x asks gpuslice's devices, and none of those asks them, so whether this pod must be kept off the nodes of the other ranks is unknown; accepted: at most 32 distinct ResourceClaims named by resourceClaimName in a pod of a job, or one asking gpuslice's devices among the first 32 (docs/kubeflow.md, \"One rank per GPU per job\")",
        "{answer}"
    );
    let read = gets(&api, "resourceclaims");
    let want: Vec<String> = ["other-gpu".to_string()]
        .into_iter()
        .chain((0..32).map(|i| format!("o-{i}")))
        .collect();
    assert_eq!(read, want);

    // gpuslice's claim the 32nd named: read, and the rank kept apart.
    let mut names = (0..31)
        .map(|i| format!("o-{i}"))
        .chain(["mine".to_string()])
        .map(|n| (String::new(), n));
    let named = entries(&mut names, "resourceClaimName");
    let answer = reviewed(w.addr, &pod_review("32nd", job, Value::Null, named));
    assert_eq!(
        patch(&answer),
        kept_apart("gpuslice.io/job", "x", false),
        "{answer}"
    );
    assert_eq!(gets(&api, "resourceclaims").len(), 33 + 32);
}

#[test]
fn ranks_asking_the_node_by_annotation_are_kept_off_each_others_nodes() {
    let api = FakeApi::start();
    let w = start_against(&api.url, patient());
    let team = json!({"gpuslice.io/job": "x"});
    let asks = json!({"gpuslice.io/memory": "20Gi", "gpuslice.io/cores": "50"});
    // Two ranks of job x asking 20Gi each by annotation: each gets the term and the rule, and
    // its own annotations stay as written (only the rule's is added beside them).
    for uid in ["r0", "r1"] {
        let answer = reviewed(
            w.addr,
            &pod_review(uid, team.clone(), asks.clone(), Value::Null),
        );
        let r = &answer["response"];
        assert_eq!(r["allowed"], true, "{uid}: {answer}");
        assert_eq!(
            r["warnings"],
            json!([
                "one node per rank of job gpuslice.io/job=x: NCCL refuses two ranks on one GPU"
            ]),
            "{uid}: {answer}"
        );
        assert_eq!(
            patch(&answer),
            kept_apart("gpuslice.io/job", "x", true),
            "{uid}: {answer}"
        );
    }
    // A container's override alone asks a slice too.
    let answer = reviewed(
        w.addr,
        &pod_review(
            "override",
            team.clone(),
            json!({"gpuslice.io/memory.node": "4Gi"}),
            Value::Null,
        ),
    );
    assert_eq!(
        patch(&answer),
        kept_apart("gpuslice.io/job", "x", true),
        "{answer}"
    );
    // The same pod of no job, and pods of the job asking nothing by annotation (another
    // domain's, or `gpuslice.io/*` keys the node reads as no request): unchanged.
    for (uid, labels, annotations) in [
        ("no-job", json!({"app": "x"}), asks),
        (
            "no-ask",
            team.clone(),
            json!({"example.com/gpuslice.io": "x"}),
        ),
        (
            "other-keys",
            team,
            json!({"gpuslice.io/job": "x", "gpuslice.io/note": "mine",
                   "gpuslice.io/reservation": "3f9a0c1d2e4b5a69", "gpuslice.io/memory.": "1Gi"}),
        ),
    ] {
        let answer = reviewed(w.addr, &pod_review(uid, labels, annotations, Value::Null));
        let r = &answer["response"];
        assert_eq!(r["allowed"], true, "{uid}: {answer}");
        assert!(
            r["patch"].is_null() && r["warnings"].is_null(),
            "{uid}: {answer}"
        );
    }
}

#[test]
fn ranks_asking_a_device_class_by_its_extended_resource_are_kept_off_each_others_nodes() {
    let api = FakeApi::start();
    let w = start_against(&api.url, patient());
    // Kubernetes' name for each of gpuslice's classes, in limits or in requests (an init
    // container's too): the scheduler writes the claim, the webhook adds the rule alone.
    let review = |uid: &str, labels: Value, list: &str, resources: Value| {
        let mut spec = json!({"containers": [{"name": "node", "image": "x"}]});
        spec[list] = json!([{"name": "node", "image": "x", "resources": resources}]);
        json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": uid, "namespace": NS, "operation": "CREATE",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "object": {"metadata": {"name": uid, "namespace": NS, "labels": labels},
                           "spec": spec},
            },
        })
        .to_string()
    };
    let team = json!({"training.kubeflow.org/job-name": "x"});
    for (i, name) in gpuslice_dra::IMPLICIT_EXTENDED_RESOURCES.iter().enumerate() {
        for (list, field) in [("containers", "limits"), ("initContainers", "requests")] {
            let uid = format!("rank-{i}-{list}");
            let answer = reviewed(
                w.addr,
                &review(&uid, team.clone(), list, json!({field: {*name: "1"}})),
            );
            let r = &answer["response"];
            assert_eq!(r["allowed"], true, "{uid}: {answer}");
            assert_eq!(
                patch(&answer),
                kept_apart("training.kubeflow.org/job-name", "x", false),
                "{uid}: {answer}"
            );
        }
        // The same pod of no job: unchanged.
        let answer = reviewed(
            w.addr,
            &review(
                "no-job",
                json!({"app": "x"}),
                "containers",
                json!({"limits": {*name: "1"}}),
            ),
        );
        let r = &answer["response"];
        assert_eq!(r["allowed"], true, "{answer}");
        assert!(r["patch"].is_null() && r["warnings"].is_null(), "{answer}");
    }
    // Another class's extended resource asks nothing of gpuslice's: unchanged.
    let answer = reviewed(
        w.addr,
        &review(
            "other",
            team,
            "containers",
            json!({"limits": {"deviceclass.resource.kubernetes.io/gpu.example.com": "1"}}),
        ),
    );
    assert!(answer["response"]["patch"].is_null(), "{answer}");
}

#[test]
fn a_rank_whose_containers_each_get_a_slice_by_annotation_is_refused() {
    let api = FakeApi::start();
    let w = start_against(&api.url, patient());
    let review = |uid: &str, annotations: Value| {
        json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": uid, "namespace": NS, "operation": "CREATE",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "object": {
                    "metadata": {"name": uid, "namespace": NS,
                                 "labels": {"gpuslice.io/job": "x"}, "annotations": annotations},
                    "spec": {"runtimeClassName": "gpuslice", "containers": [
                        {"name": "trainer", "image": "x", "env": [{"name": "A", "value": "1"}]},
                        {"name": "log", "image": "x"},
                    ]},
                },
            },
        })
        .to_string()
    };
    // The pod-wide ask gives both containers a slice of the node's: refused, naming them.
    let answer = reviewed(w.addr, &review("both", json!({"gpuslice.io/gpus": "1"})));
    let r = &answer["response"];
    assert_eq!(r["allowed"], false, "{answer}");
    assert_eq!(r["status"]["code"], 400, "{answer}");
    let said = r["status"]["message"].as_str().unwrap_or_default();
    assert!(
        said.starts_with("spec.containers[0], spec.containers[1]: containers of a rank of job gpuslice.io/job=x that run at the same time each ask a GPU slice"),
        "{answer}"
    );
    // The log shipper opted out by its name: admitted, kept apart.
    let answer = reviewed(
        w.addr,
        &review(
            "one",
            json!({"gpuslice.io/gpus": "1", "gpuslice.io/gpus.log": "0"}),
        ),
    );
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert_eq!(
        patch(&answer),
        kept_apart("gpuslice.io/job", "x", true),
        "{answer}"
    );
}

/// The words of the expression of the pods webhook's condition in `text` (the chart's
/// template or the test cluster's script): the folded lines under `expression: >-` after
/// `- name: names-gpu-resources`, joined by one space.
fn pods_condition(text: &str) -> String {
    let mut lines = text
        .lines()
        .skip_while(|l| l.trim() != "- name: names-gpu-resources")
        .skip(1);
    let head = lines.next().unwrap_or_default();
    assert_eq!(head.trim(), "expression: >-", "{text}");
    let indent = head.len() - head.trim_start().len();
    let body: Vec<&str> = lines
        .take_while(|l| l.len() - l.trim_start().len() > indent)
        .collect();
    body.join(" ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn both_registrations_send_a_jobs_ranks_that_name_claims_and_every_pod_asking_by_annotation() {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let read = |f: &str| std::fs::read_to_string(repo.join(f)).unwrap();
    let chart = pods_condition(&read("packaging/helm/gpuslice/templates/webhook.yaml"));
    let cluster = pods_condition(&read("scripts/lib/cluster-webhook.sh"));
    assert_eq!(
        chart, cluster,
        "the chart's and the test cluster's registrations send different pods"
    );
    // The labels the webhook reads as a job's, all of them, and what makes a rank of one
    // without limits or templates: a claim it names.
    let labels: Vec<String> = JOB_LABELS.iter().map(|l| format!("'{l}'")).collect();
    let job = format!(
        "[{}].exists(l, l in object.metadata.labels)",
        labels.join(", ")
    );
    // A container's limits and requests: gpuslice's names, HAMi's, and the extended
    // resources Kubernetes names after gpuslice's device classes.
    let extended: Vec<String> = gpuslice_dra::IMPLICIT_EXTENDED_RESOURCES
        .iter()
        .map(|n| format!("'{n}'"))
        .collect();
    let names = format!(
        "k.startsWith('gpuslice.io/') || k.startsWith('nvidia.com/gpu') || k in [{}]",
        extended.join(", ")
    );
    let limits = format!("c.resources.limits.exists(k, {names})");
    let requests = format!("c.resources.requests.exists(k, {names})");
    for part in [
        limits.as_str(),
        &requests,
        "has(object.spec.resourceClaims) && object.spec.resourceClaims.exists(e, has(e.resourceClaimTemplateName))",
        &job,
        "object.spec.resourceClaims.exists(e, has(e.resourceClaimName))",
    ] {
        assert!(chart.contains(part), "{part} not in {chart}");
    }
    // Every pod asking the node by annotation, of a job or not: the webhook refuses it where
    // a budget holds (docs/quotas.md). Its test names the keys the node reads as a request
    // (the webhook's and the node's one list), and is one of the condition's own
    // alternatives, under no other test (no parenthesis open before it).
    let annotated = format!(
        "(has(object.metadata.annotations) && object.metadata.annotations.exists(k, {}))",
        annotation_condition()
    );
    let at = chart
        .find(&annotated)
        .unwrap_or_else(|| panic!("{annotated} not in {chart}"));
    let before = &chart[..at];
    assert_eq!(
        before.matches('(').count(),
        before.matches(')').count(),
        "{annotated} is under another test in {chart}"
    );
    assert!(before.trim_end().ends_with("||"), "{chart}");
    assert!(
        chart[at + annotated.len()..].trim_start().starts_with("||"),
        "{chart}"
    );
}

#[test]
fn a_ranks_containers_that_each_ask_a_slice_by_limits_are_refused_through_the_server() {
    let api = FakeApi::start();
    let w = start_against(&api.url, patient());
    let sliced = |name: &str| {
        json!({"name": name, "image": "x", "resources": {"limits": {
            "gpuslice.io/gpus": "1", "gpuslice.io/memory": "1Gi"}}})
    };
    let pod = |uid: &str, labels: Value| {
        json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": uid, "namespace": NS, "operation": "CREATE",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "object": {"metadata": {"name": uid, "namespace": NS, "labels": labels},
                           "spec": {"containers": [sliced("a"), sliced("b")]}},
            },
        })
        .to_string()
    };
    // Two ranks' worth of slices in one pod of a job: their claims may be given one GPU,
    // which NCCL refuses; refused at admission, naming both containers and the job.
    let answer = reviewed(
        w.addr,
        &pod("rank", json!({"training.kubeflow.org/job-name": "rdzv"})),
    );
    let r = &answer["response"];
    assert_eq!(r["allowed"], false, "{answer}");
    let said = r["status"]["message"].as_str().unwrap_or("");
    assert!(
        said.starts_with("spec.containers[0], spec.containers[1]: containers of a rank of job training.kubeflow.org/job-name=rdzv that run at the same time each ask a GPU slice"),
        "{answer}"
    );
    // The same pod of no job: admitted, a claim each, and told they may share a GPU.
    let answer = reviewed(w.addr, &pod("no-job", json!({"app": "x"})));
    let r = &answer["response"];
    assert_eq!(r["allowed"], true, "{answer}");
    let warnings = r["warnings"].as_array().cloned().unwrap_or_default();
    assert!(
        warnings.iter().any(|w| w.as_str().is_some_and(|w| w.starts_with(
            "spec.containers[0], spec.containers[1]: each gets a GPU slice of its own (a claim each), and two of them may be given one GPU"
        ))),
        "{answer}"
    );
    let entries: Vec<Value> = patch(&answer)
        .as_array()
        .unwrap()
        .iter()
        .filter(|op| op["path"] == "/spec/resourceClaims")
        .flat_map(|op| op["value"].as_array().cloned().unwrap_or_default())
        .collect();
    assert_eq!(entries.len(), 2, "{answer}");
}

#[test]
fn the_policy_fixing_request_annotations_after_creation_tests_the_keys_the_registrations_send() {
    // The ValidatingAdmissionPolicy that refuses a request annotation added, changed or
    // removed after a pod's creation (the webhook sees pods at creation only) must name the
    // same keys as the registrations' condition, the one list the node reads.
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let policy = std::fs::read_to_string(repo.join("packaging/kubernetes/annotations-policy.yaml"))
        .unwrap()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    for part in [
        "name: annotations.gpuslice.io".to_string(),
        r#"operations: ["UPDATE"]"#.to_string(),
        format!(".filter(k, {})", annotation_condition()),
        "oldObject.metadata.?annotations.orValue({})".to_string(),
        "object.metadata.?annotations.orValue({})".to_string(),
    ] {
        assert!(policy.contains(&part), "{part} not in {policy}");
    }
}
