//! A rank of a job whose own claim templates ask gpuslice's device classes is kept off its
//! job's other ranks' nodes, as one whose limits the webhook turns into a claim is
//! (docs/kubeflow.md, "One rank per GPU per job"): the real server over TLS answers the review
//! of such a pod with the job's required anti-affinity term, the rule's annotation and the
//! rule as a warning (also, in a namespace without a budget, when its template is missing or
//! cannot be charged), and leaves a pod of no job, and a rank whose template asks another
//! driver's class (also one whose other driver's parameters nest past the JSON parser's
//! limit), unchanged. The server reads the templates from a FAKE API server (no control
//! plane runs in a crate's tests; `kubeflow::` in tests/ runs the real one with Kubeflow
//! Trainer): plain HTTP on 127.0.0.1 serving what an admission of such a pod reads.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use base64::Engine;
use serde_json::{json, Value};

use crate::hostile::{patient, reviewed, start_against};

const NS: &str = "team";

/// A fake API server: ResourceClaimTemplates by namespace and name from the test's, an empty
/// list of ResourceSlices (a cluster in capacity mode whose nodes publish no GPU yet: a
/// template's charge then counts its memory asked) and of a namespace's ResourceQuotas (no
/// budget); anything else, watches included, is answered 404 as a resource it does not
/// serve (the webhook then reads quotas on each admission, as it does while a watch is
/// down). Stopped on drop.
struct FakeApi {
    url: String,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl FakeApi {
    fn start(templates: &[Value]) -> FakeApi {
        let store: BTreeMap<String, Value> = templates
            .iter()
            .map(|t| {
                let (ns, name) = (&t["metadata"]["namespace"], &t["metadata"]["name"]);
                (
                    format!("{}/{}", ns.as_str().unwrap(), name.as_str().unwrap()),
                    t.clone(),
                )
            })
            .collect();
        let store = Arc::new(store);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let accept = std::thread::spawn(move || {
            for tcp in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(tcp) = tcp else { continue };
                let store = Arc::clone(&store);
                // A connection ends when its client closes it (the webhook's runtime ends).
                std::thread::spawn(move || {
                    let _ = serve_connection(tcp, &store);
                });
            }
        });
        FakeApi {
            url,
            stop,
            accept: Some(accept),
        }
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop to see the flag.
        let _ = TcpStream::connect(self.url.trim_start_matches("http://"));
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// HTTP/1.1 requests on `tcp`, answered in turn until the client closes it.
fn serve_connection(tcp: TcpStream, store: &BTreeMap<String, Value>) -> std::io::Result<()> {
    let mut out = tcp.try_clone()?;
    let mut from = BufReader::new(tcp);
    loop {
        let mut line = String::new();
        if from.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let mut words = line.split_whitespace();
        let (method, target) = (
            words.next().unwrap_or_default().to_string(),
            words.next().unwrap_or_default().to_string(),
        );
        let mut len = 0;
        loop {
            let mut header = String::new();
            if from.read_line(&mut header)? == 0 || header.trim().is_empty() {
                break;
            }
            if let Some((k, v)) = header.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
        }
        // A body is read past, never used: the webhook's admission only reads.
        std::io::copy(&mut (&mut from).take(len), &mut std::io::sink())?;
        let (code, body) = route(&method, &target, store);
        write!(
            out,
            "HTTP/1.1 {code} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            if code == 200 { "OK" } else { "Not Found" },
            body.len()
        )?;
    }
}

fn route(method: &str, target: &str, store: &BTreeMap<String, Value>) -> (u16, String) {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let watch = query.split('&').any(|q| q.starts_with("watch="));
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let list = |kind: &str| {
        json!({"kind": kind, "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": []})
            .to_string()
    };
    match (method, parts.as_slice(), watch) {
        ("GET", ["apis", "resource.k8s.io", "v1", "resourceslices"], false) => {
            (200, list("ResourceSliceList"))
        }
        ("GET", ["api", "v1", "namespaces", _, "resourcequotas"], false) => {
            (200, list("ResourceQuotaList"))
        }
        (
            "GET",
            ["apis", "resource.k8s.io", "v1", "namespaces", ns, "resourceclaimtemplates", name],
            false,
        ) => match store.get(&format!("{ns}/{name}")) {
            Some(t) => (200, t.to_string()),
            None => not_found(&format!(
                "resourceclaimtemplates.resource.k8s.io \"{name}\" not found"
            )),
        },
        _ => not_found(&format!(
            "the fake API server does not serve {method} {target}"
        )),
    }
}

fn not_found(message: &str) -> (u16, String) {
    let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": "NotFound", "code": 404});
    (404, status.to_string())
}

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
    let api = FakeApi::start(&[
        template("rank-4gi", "gpuslice.io"),
        template("other-gpu", "gpu.example.com"),
        deep,
        all,
    ]);
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
