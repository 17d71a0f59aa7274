//! A rank of a job whose own claim templates ask gpuslice's device classes is kept off its
//! job's other ranks' nodes, as one whose limits the webhook turns into a claim is
//! (docs/kubeflow.md, "One rank per GPU per job"): the real server over TLS answers the review
//! of such a pod with the job's required anti-affinity term, the rule's annotation and the
//! rule as a warning (also, in a namespace without a budget, when its template is missing or
//! cannot be charged), and leaves a pod of no job, and a rank whose template asks another
//! driver's class (also one whose other driver's parameters nest past the JSON parser's
//! limit), unchanged. The server reads the templates from the FAKE API server of
//! `gpuslice-fakeapi` (no control plane runs in a crate's tests; `kubeflow::` in tests/ runs
//! the real one with Kubeflow Trainer), which holds them and no ResourceSlice (a cluster in
//! capacity mode whose nodes publish no GPU yet: a template's charge then counts its memory
//! asked) nor ResourceQuota (no budget).

use base64::Engine;
use gpuslice_fakeapi::FakeApi;
use serde_json::{json, Value};

use crate::hostile::{patient, reviewed, start_against};

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

/// The review of the creation of a pod labelled `labels` whose one container uses the claim
/// of its entry `gpu`, made from template `template`; no GPU limits.
fn review(uid: &str, labels: Value, template: &str) -> String {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": uid, "namespace": NS, "operation": "CREATE",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "object": {
                "metadata": {"name": "rank", "namespace": NS, "labels": labels},
                "spec": {
                    "containers": [{"name": "node", "image": "x",
                                    "resources": {"claims": [{"name": "gpu"}]}}],
                    "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
                },
            },
        },
    })
    .to_string()
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
