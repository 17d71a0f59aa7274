//! Namespace budgets against the FAKE API server of `gpuslice-fakeapi` (no control plane runs
//! in a crate's tests; `budgets::` in tests/ runs the real one): a pod past its budget is
//! refused before any template is made for it, and one within it is booked; a pod asking the
//! node by `gpuslice.io/*` annotations is refused where a budget holds; a claim passed off
//! as a pod's is charged unless the resource claim controller's user creates it; the recount
//! frees what a deleted pod held at once, keeps a booking whose pod is not stored yet for a window
//! however often it runs, and frees nothing while a live claim cannot be priced; a deletion
//! frees its share within a second, long before the periodic recount. The fake holds no
//! ResourceSlice (a cluster in capacity mode whose nodes publish no GPU yet: a memory asked is
//! charged as asked, a whole GPU cannot be priced).

use std::time::{Duration, Instant};

use gpuslice_fakeapi::FakeApi;
use gpuslice_webhook::budget::{Ledger, Recount};
use serde_json::{json, Value};

use crate::hostile::{cluster_of, patient, reviewed, runtime, start_against, start_recounting};

const MEMORY: &str = "limits.gpuslice.io/memory";

/// Quota `gpu` of namespace `ns`: memory `hard`, `used` as booked so far.
pub fn quota(ns: &str, hard: &str, used: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": "gpu", "namespace": ns},
        "spec": {"hard": {MEMORY: hard}},
        "status": {"hard": {MEMORY: hard}, "used": {MEMORY: used}}})
}

pub fn used(api: &FakeApi, ns: &str) -> String {
    let q = &api.objects("resourcequotas")[&(ns.to_string(), "gpu".to_string())];
    q["status"]["used"][MEMORY]
        .as_str()
        .unwrap_or("")
        .to_string()
}

/// The review of the creation of pod `name` of `ns` whose container asks `memory` of one GPU.
pub fn review(ns: &str, name: &str, memory: &str) -> String {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": name, "namespace": ns, "operation": "CREATE",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "object": {
                "metadata": {"name": name, "namespace": ns},
                "spec": {"containers": [{"name": "c", "image": "x", "resources": {
                    "limits": {"gpuslice.io/memory": memory}}}]},
            },
        },
    })
    .to_string()
}

fn templates_in(api: &FakeApi, ns: &str) -> usize {
    api.objects("resourceclaimtemplates")
        .keys()
        .filter(|(n, _)| n == ns)
        .count()
}

#[test]
fn a_pod_past_its_budget_is_refused_before_any_template_is_made() {
    let api = FakeApi::start();
    api.put("resourcequotas", &quota("full", "1Gi", "1Gi"));
    api.put("resourcequotas", &quota("room", "10Gi", "0"));
    let w = start_against(&api.url, patient());

    let answer = reviewed(w.addr, &review("full", "big", "2Gi"));
    let r = &answer["response"];
    assert_eq!(r["allowed"], false, "{answer}");
    assert_eq!(r["status"]["code"], 403, "{answer}");
    let said = r["status"]["message"].as_str().unwrap_or("");
    assert!(said.contains("exceeded quota: full/gpu"), "{answer}");
    assert_eq!(templates_in(&api, "full"), 0, "{:?}", api.requests());
    assert_eq!(used(&api, "full"), "1Gi");

    // Within the budget: the template made, the charge booked.
    let answer = reviewed(w.addr, &review("room", "small", "2Gi"));
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert_eq!(templates_in(&api, "room"), 1);
    assert_eq!(used(&api, "room"), "2Gi");
}

/// The review, by user `user`, of the creation of a claim of `ns` asking `memory` of one GPU,
/// passed off as the one the resource claim controller makes for entry `gpu` of pod `p`
/// (uid `up`): owned as controller by it, annotated for that entry.
fn pods_claim_review(ns: &str, user: &str, memory: &str) -> String {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "c", "namespace": ns, "operation": "CREATE",
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
            "userInfo": {"username": user, "groups": ["system:authenticated"]},
            "object": {
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": "p-gpu-x", "namespace": ns,
                    "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"},
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p",
                        "uid": "up", "controller": true, "blockOwnerDeletion": true}]},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                    "deviceClassName": "gpuslice.io",
                    "capacity": {"requests": {"memory": memory}}}}]}},
            },
        },
    })
    .to_string()
}

#[test]
fn a_pods_claim_is_charged_nothing_only_from_the_claim_controllers_user() {
    const NS: &str = "own";
    let api = FakeApi::start();
    template_2gi(&api, NS);
    // Pod p admitted (its template's 2Gi booked), its claim not made yet.
    let mut p = pod(NS, "p");
    p["metadata"]["uid"] = json!("up");
    p["status"] = json!({"phase": "Pending"});
    api.put("pods", &p);
    api.put("resourcequotas", &quota(NS, "10Gi", "2Gi"));
    let w = start_against(&api.url, patient());

    // A tenant's claim dressed as the pod's: charged as it asks, here past the budget.
    let answer = reviewed(w.addr, &pods_claim_review(NS, "alice", "9Gi"));
    let r = &answer["response"];
    assert_eq!(r["allowed"], false, "{answer}");
    let said = r["status"]["message"].as_str().unwrap_or("");
    assert!(said.contains("exceeded quota: own/gpu"), "{answer}");
    let answer = reviewed(w.addr, &pods_claim_review(NS, "alice", "3Gi"));
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert_eq!(used(&api, NS), "5Gi");

    // The controller's own, under either of its users: its pod was charged for it.
    for user in [
        "system:serviceaccount:kube-system:resource-claim-controller",
        "system:kube-controller-manager",
    ] {
        let answer = reviewed(w.addr, &pods_claim_review(NS, user, "2Gi"));
        assert_eq!(answer["response"]["allowed"], true, "{user}: {answer}");
        assert_eq!(used(&api, NS), "5Gi", "{user}");
    }
}

/// A running pod of `ns` whose one claim entry is made from template `t2` (2Gi).
pub fn pod(ns: &str, name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"containers": [{"name": "c", "image": "x"}],
                 "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t2"}]},
        "status": {"phase": "Running"}})
}

/// Template `t2` of `ns`: one GPU's 2Gi.
pub fn template_2gi(api: &FakeApi, ns: &str) {
    api.put(
        "resourceclaimtemplates",
        &json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "t2", "namespace": ns},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpuslice.io",
                "capacity": {"requests": {"memory": "2Gi"}}}}]}}}}),
    );
}

/// The window the recounts of these tests keep a booking for.
pub const WINDOW: Duration = Duration::from_millis(300);

#[test]
fn the_recount_frees_a_deleted_pods_share_at_once_and_a_booking_in_flight_later() {
    const NS: &str = "team";
    let api = FakeApi::start();
    template_2gi(&api, NS);
    api.put("resourcequotas", &quota(NS, "10Gi", "6Gi"));
    for name in ["p1", "p2", "p3"] {
        api.put("pods", &pod(NS, name));
    }
    runtime().block_on(async {
        let cluster = cluster_of(&api.url).await;
        let recount = Recount::new(Ledger::new(cluster, false), Duration::from_secs(300), None)
            .with_window(WINDOW);
        let once = || async { recount.once().await.unwrap() };
        let window = || tokio::time::sleep(WINDOW + Duration::from_millis(50));

        // A first look frees nothing; nothing to free either.
        once().await;
        assert_eq!(used(&api, NS), "6Gi");
        // A window later, a pod deleted: freed by the next recount.
        window().await;
        api.remove("pods", NS, "p1");
        once().await;
        assert_eq!(used(&api, NS), "4Gi");
        // A booking whose pod is not stored yet (an admission running): kept by the recounts
        // of the window after the first that saw it, however close together, and freed once
        // the window has passed when its pod never came.
        api.edit("resourcequotas", NS, "gpu", |q| {
            q["status"]["used"][MEMORY] = json!("6Gi");
        });
        once().await;
        assert_eq!(used(&api, NS), "6Gi");
        once().await;
        assert_eq!(used(&api, NS), "6Gi");
        window().await;
        once().await;
        assert_eq!(used(&api, NS), "4Gi");

        // A live claim that cannot be priced (a whole GPU, none published): nothing is freed,
        // even what a deleted pod held.
        api.put_claim(
            &json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "whole", "namespace": NS},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpuslice.io"}}]}}}),
        );
        api.remove("pods", NS, "p2");
        once().await;
        once().await;
        assert_eq!(used(&api, NS), "4Gi");
        // Once it is gone, the deleted pod's share is freed.
        api.delete_claim(NS, "whole");
        once().await;
        assert_eq!(used(&api, NS), "2Gi");
    });
}

#[test]
fn a_deleted_pods_share_is_freed_by_the_deletion_watch_not_the_periodic_recount() {
    const NS: &str = "swap";
    let api = FakeApi::start();
    template_2gi(&api, NS);
    api.put("resourcequotas", &quota(NS, "2Gi", "2Gi"));
    api.put("pods", &pod(NS, "old"));
    // The periodic recount runs at the start, then not for 300 s: only the recount a deletion
    // triggers can free the old pod's share within the test.
    let w = start_recounting(
        &api.url,
        patient(),
        Some((Duration::from_secs(300), WINDOW)),
    );
    // The start's recount has listed the namespace's pods (a first look: the old pod's booking
    // may be in flight), the pods are watched, and a window has passed.
    let recounted = format!("GET /api/v1/namespaces/{NS}/pods");
    let began = Instant::now();
    while !api.requests().contains(&recounted) || api.watch_starts("pods").is_empty() {
        assert!(
            began.elapsed() < Duration::from_secs(20),
            "{:?}",
            api.requests()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(WINDOW + Duration::from_millis(200));

    // At its budget: the replacement is refused while the old pod runs.
    let answer = reviewed(w.addr, &review(NS, "new", "2Gi"));
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    assert_eq!(used(&api, NS), "2Gi");

    api.remove("pods", NS, "old");
    let deleted = Instant::now();
    loop {
        let answer = reviewed(w.addr, &review(NS, "new", "2Gi"));
        if answer["response"]["allowed"] == true {
            break;
        }
        // The periodic recount is 300 s away: freed by then, the deletion's recount did it.
        assert!(
            deleted.elapsed() < Duration::from_secs(60),
            "still refused {:?} after the old pod was deleted: {answer}",
            deleted.elapsed()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The replacement booked in the old pod's place.
    assert_eq!(used(&api, NS), "2Gi");
}

#[test]
fn the_recount_lists_a_namespace_a_page_at_a_time() {
    const NS: &str = "many";
    let api = FakeApi::start();
    template_2gi(&api, NS);
    api.put("resourcequotas", &quota(NS, "10Gi", "6Gi"));
    api.put("pods", &pod(NS, "p1"));
    // More pods than one page holds (crate::view::PAGE), none asking a device.
    for i in 0..501 {
        api.put(
            "pods",
            &json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("idle-{i}"), "namespace": NS},
                "spec": {"containers": [{"name": "c", "image": "x"}]},
                "status": {"phase": "Running"}}),
        );
    }
    runtime().block_on(async {
        let cluster = cluster_of(&api.url).await;
        let recount = Recount::new(Ledger::new(cluster, false), Duration::from_secs(300), None)
            .with_window(WINDOW);
        recount.once().await.unwrap();
        tokio::time::sleep(WINDOW + Duration::from_millis(50)).await;
        recount.once().await.unwrap();
    });
    // The pod p1 holds 2Gi: the rest is freed, the page past the first one counted.
    assert_eq!(used(&api, NS), "2Gi");
    for (plural, path) in [
        ("pods", format!("/api/v1/namespaces/{NS}/pods")),
        (
            "resourceclaims",
            format!("/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims"),
        ),
        (
            "resourceclaimtemplates",
            format!("/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaimtemplates"),
        ),
        ("resourcequotas", "/api/v1/resourcequotas".to_string()),
    ] {
        let lists: Vec<_> = api
            .calls(plural)
            .into_iter()
            .filter(|c| c.path == path && !c.watch)
            .collect();
        assert!(!lists.is_empty(), "{plural}: {:?}", api.requests());
        assert!(
            lists.iter().all(|c| c.limit == Some(500)),
            "{plural}: every list asks a page: {lists:?}"
        );
    }
    let pages: Vec<bool> = api
        .calls("pods")
        .into_iter()
        .filter(|c| c.path == format!("/api/v1/namespaces/{NS}/pods"))
        .map(|c| c.continued)
        .collect();
    assert_eq!(pages, [false, true, false, true], "two pages each recount");
}

/// Quota `name` of `ns` naming memory `hard`, with `used` when counted (`None`: as created,
/// no status), and `scope_selector` when given.
fn memory_quota(
    ns: &str,
    name: &str,
    hard: &str,
    used: Option<&str>,
    scope_selector: Option<Value>,
) -> Value {
    let mut q = json!({"apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"hard": {MEMORY: hard}}});
    if let Some(used) = used {
        q["status"] = json!({"hard": {MEMORY: hard}, "used": {MEMORY: used}});
    }
    if let Some(s) = scope_selector {
        q["spec"]["scopeSelector"] = s;
    }
    q
}

/// What quota `name` of `ns` says is used of memory ("" when it says nothing).
fn used_of(api: &FakeApi, ns: &str, name: &str) -> String {
    api.objects("resourcequotas")
        .get(&(ns.to_string(), name.to_string()))
        .and_then(|q| q["status"]["used"][MEMORY].as_str().map(str::to_string))
        .unwrap_or_default()
}

/// Template `name` of `ns`: one GPU's `memory`.
fn template_of(api: &FakeApi, ns: &str, name: &str, memory: &str) {
    api.put(
        "resourceclaimtemplates",
        &json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpuslice.io",
                "capacity": {"requests": {"memory": memory}}}}]}}}}),
    );
}

/// A running pod of `ns` whose claim entry is made from template `template`, of priority
/// class `class` when given.
fn pod_of(ns: &str, name: &str, template: &str, class: Option<&str>) -> Value {
    let mut p = pod(ns, name);
    p["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = json!(template);
    if let Some(c) = class {
        p["spec"]["priorityClassName"] = json!(c);
    }
    p
}

/// The review of pod `name` asking `memory` of one GPU, of priority class `class`.
fn classed_review(ns: &str, name: &str, memory: &str, class: &str) -> String {
    let mut r: Value = serde_json::from_str(&review(ns, name, memory)).unwrap();
    r["request"]["object"]["spec"]["priorityClassName"] = json!(class);
    r.to_string()
}

/// One recount of every namespace, from a first look, with the window of these tests.
fn recount_once(api: &FakeApi) {
    runtime().block_on(async {
        let cluster = cluster_of(&api.url).await;
        Recount::new(Ledger::new(cluster, false), Duration::from_secs(300), None)
            .with_window(WINDOW)
            .once()
            .await
            .unwrap();
    });
}

/// The answer to `body` once it is not `now` (the watched copy catching up with a write), for
/// at most 20 s.
fn answer_once_not(addr: std::net::SocketAddr, body: &str, now: &str) -> Value {
    let began = Instant::now();
    loop {
        let answer = reviewed(addr, body);
        let said = answer["response"]["status"]["message"]
            .as_str()
            .unwrap_or("");
        if !said.contains(now) || began.elapsed() > Duration::from_secs(20) {
            return answer;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The review of the creation of pod `name` of `ns`, labelled `labels`, of RuntimeClass
/// `gpuslice`, asking the node by `annotations`; no GPU limits (`dry_run`: a dry run).
fn annotated_review(
    ns: &str,
    name: &str,
    labels: Value,
    annotations: Value,
    dry_run: bool,
) -> String {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": name, "namespace": ns, "operation": "CREATE", "dryRun": dry_run,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "object": {
                "metadata": {"name": name, "namespace": ns, "labels": labels,
                             "annotations": annotations},
                "spec": {"runtimeClassName": "gpuslice",
                         "containers": [{"name": "trainer", "image": "x"}]},
            },
        },
    })
    .to_string()
}

#[test]
fn a_pod_asking_the_node_by_annotation_is_refused_where_a_budget_holds() {
    let api = FakeApi::start();
    api.put("resourcequotas", &quota("team-a", "10Gi", "0"));
    // A quota not counted yet is a budget too.
    api.put(
        "resourcequotas",
        &memory_quota("team-u", "gpu", "10Gi", None, None),
    );
    let w = start_against(&api.url, patient());
    let asks = json!({"gpuslice.io/memory": "4Gi"});

    // Refused, naming the annotation, the quota and what is accepted; a dry run alike; a
    // per-container annotation alike. Nothing booked, no template made.
    for (ns, annotations, dry_run, named) in [
        ("team-a", asks.clone(), false, "gpuslice.io/memory"),
        ("team-a", asks.clone(), true, "gpuslice.io/memory"),
        ("team-u", asks.clone(), false, "gpuslice.io/memory"),
        (
            "team-a",
            json!({"gpuslice.io/cores.trainer": "30", "example.com/x": "y"}),
            false,
            "gpuslice.io/cores.trainer",
        ),
    ] {
        let body = annotated_review(ns, "p", json!({"app": "x"}), annotations, dry_run);
        let answer = reviewed(w.addr, &body);
        let r = &answer["response"];
        assert_eq!(r["allowed"], false, "{ns}: {answer}");
        assert_eq!(r["status"]["code"], 403, "{ns}: {answer}");
        assert_eq!(
            r["status"]["message"],
            format!(
                "annotations {named}: the node books the GPU slices they ask, which the budget of namespace {ns} (ResourceQuota {ns}/gpu) cannot charge; accepted: the same ask as container limits (resources.limits: {{gpuslice.io/memory: 4Gi}}) or a ResourceClaim of gpuslice's device classes (docs/quotas.md, \"What counts\")"
            ),
            "{ns}: {answer}"
        );
    }
    assert_eq!(used(&api, "team-a"), "0");
    assert_eq!(templates_in(&api, "team-a"), 0, "{:?}", api.requests());

    // `gpuslice.io/*` annotations the node reads as no request (a job's name, a note, the
    // reservation gpuslice writes) ask nothing the budget could miss: admitted unchanged.
    let answer = reviewed(
        w.addr,
        &annotated_review(
            "team-a",
            "p",
            json!({"app": "x"}),
            json!({"gpuslice.io/job": "x", "gpuslice.io/note": "mine",
                   "gpuslice.io/reservation": "3f9a0c1d2e4b5a69"}),
            false,
        ),
    );
    let r = &answer["response"];
    assert_eq!(r["allowed"], true, "{answer}");
    assert!(r["patch"].is_null() && r["warnings"].is_null(), "{answer}");

    // Where no budget holds, the annotation path works as before: admitted unchanged, and a
    // rank of a job gets only the job's rule.
    let answer = reviewed(
        w.addr,
        &annotated_review("free", "p", json!({"app": "x"}), asks.clone(), false),
    );
    let r = &answer["response"];
    assert_eq!(r["allowed"], true, "{answer}");
    assert!(r["patch"].is_null() && r["warnings"].is_null(), "{answer}");
    let answer = reviewed(
        w.addr,
        &annotated_review("free", "r0", json!({"gpuslice.io/job": "x"}), asks, false),
    );
    let r = &answer["response"];
    assert_eq!(r["allowed"], true, "{answer}");
    assert_eq!(
        r["warnings"],
        json!(["one node per rank of job gpuslice.io/job=x: NCCL refuses two ranks on one GPU"]),
        "{answer}"
    );
}

/// A running pod of `ns` of RuntimeClass `gpuslice` annotated `annotations`, with app
/// containers `containers` and init containers `init`, in phase `phase`.
fn annotated_pod(
    ns: &str,
    name: &str,
    annotations: Value,
    containers: &[&str],
    init: &[&str],
    phase: &str,
) -> Value {
    let named = |names: &[&str]| -> Vec<Value> {
        names
            .iter()
            .map(|n| json!({"name": n, "image": "x"}))
            .collect()
    };
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": format!("u-{name}"),
                     "annotations": annotations},
        "spec": {"runtimeClassName": "gpuslice", "containers": named(containers),
                 "initContainers": named(init)},
        "status": {"phase": phase}})
}

#[test]
fn pods_asking_by_annotation_before_the_budget_are_counted_by_the_recount() {
    const NS: &str = "later";
    let api = FakeApi::start();
    // Admitted while the namespace had no budget: the node booked, per container, what the
    // annotations ask it (the trainer 6Gi by its own key, the init container the pod's 4Gi,
    // the log shipper opted out): 10Gi.
    api.put(
        "pods",
        &annotated_pod(
            NS,
            "old",
            json!({"gpuslice.io/memory": "4Gi", "gpuslice.io/memory.trainer": "6Gi",
                   "gpuslice.io/gpus.log": "0", "example.com/note": "x"}),
            &["trainer", "log"],
            &["setup"],
            "Running",
        ),
    );
    // Two GPUs of 1Gi each by annotation: 2Gi.
    api.put(
        "pods",
        &annotated_pod(
            NS,
            "pair",
            json!({"gpuslice.io/memory": "1Gi", "gpuslice.io/gpus": "2"}),
            &["app"],
            &[],
            "Running",
        ),
    );
    // No slice: done, a key the node reads as no request, a value it refuses (the
    // container is not created), or beside a request a key it does not know or a
    // reservation the pod sets itself (every container refused).
    for (name, annotations, phase) in [
        ("done", json!({"gpuslice.io/memory": "8Gi"}), "Succeeded"),
        ("note", json!({"gpuslice.io/note": "8Gi"}), "Running"),
        ("bad", json!({"gpuslice.io/memory": "8GB"}), "Running"),
        (
            "typo",
            json!({"gpuslice.io/memory": "8Gi", "gpuslice.io/note": "x"}),
            "Running",
        ),
        (
            "forged",
            json!({"gpuslice.io/memory": "8Gi", "gpuslice.io/reservation": "3f9a0c1d2e4b5a69"}),
            "Running",
        ),
    ] {
        api.put(
            "pods",
            &annotated_pod(NS, name, annotations, &["app"], &[], phase),
        );
    }
    // The quota comes later: the recount counts what those pods hold.
    api.put(
        "resourcequotas",
        &memory_quota(NS, "gpu", "40Gi", None, None),
    );
    recount_once(&api);
    assert_eq!(used_of(&api, NS, "gpu"), "12Gi");
}

#[test]
fn a_new_quota_books_nothing_until_it_has_counted_the_pods_already_running() {
    const NS: &str = "team-a";
    let api = FakeApi::start();
    template_of(&api, NS, "t10", "10Gi");
    for i in 0..8 {
        api.put("pods", &pod_of(NS, &format!("run-{i}"), "t10", None));
    }
    // Created by the administrator over 8 running pods of 10Gi: no status yet.
    api.put(
        "resourcequotas",
        &memory_quota(NS, "gpu", "80Gi", None, None),
    );
    let w = start_against(&api.url, patient());

    // Booked against a used of 0 it would be admitted: refused, naming the quota, the name
    // and why, as Kubernetes' own quota admission answers a quota it has not counted.
    let answer = reviewed(w.addr, &review(NS, "new", "10Gi"));
    let r = &answer["response"];
    assert_eq!(r["allowed"], false, "{answer}");
    assert_eq!(r["status"]["code"], 403, "{answer}");
    let said = r["status"]["message"].as_str().unwrap_or("");
    assert!(
        said.starts_with(&format!(
            "status unknown for quota: {NS}/gpu, resources: {MEMORY}, requested: {MEMORY}=10Gi: its usage is being counted"
        )) && said.contains("again in a few seconds"),
        "{answer}"
    );
    assert_eq!(used_of(&api, NS, "gpu"), "");

    // The recount writes what runs; the hard limit then refuses.
    recount_once(&api);
    assert_eq!(used_of(&api, NS, "gpu"), "80Gi");
    let answer = answer_once_not(w.addr, &review(NS, "new", "10Gi"), "status unknown");
    let said = answer["response"]["status"]["message"]
        .as_str()
        .unwrap_or("");
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    assert!(
        said.contains(&format!("exceeded quota: {NS}/gpu")),
        "{answer}"
    );
    assert_eq!(used_of(&api, NS, "gpu"), "80Gi");
}

#[test]
fn a_quota_created_or_given_a_name_is_counted_at_once_not_at_the_periodic_recount() {
    let api = FakeApi::start();
    template_of(&api, "busy", "t10", "10Gi");
    api.put("pods", &pod_of("busy", "run", "t10", None));
    // The periodic recount runs at the start, then not for 300 s.
    let w = start_recounting(
        &api.url,
        patient(),
        Some((Duration::from_secs(300), WINDOW)),
    );
    let began = Instant::now();
    while api.watch_starts("resourcequotas").len() < 2
        || !api
            .requests()
            .contains(&"GET /api/v1/resourcequotas".to_string())
    {
        assert!(
            began.elapsed() < Duration::from_secs(20),
            "{:?}",
            api.requests()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let counted_within = |ns: &str, want: &str| {
        let began = Instant::now();
        while used_of(&api, ns, "gpu") != want {
            assert!(
                began.elapsed() < Duration::from_secs(20),
                "{ns}: used {:?}, want {want}",
                used_of(&api, ns, "gpu")
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };

    // In an empty namespace: 0 written, and a pod admitted against it.
    api.put(
        "resourcequotas",
        &memory_quota("empty", "gpu", "10Gi", None, None),
    );
    counted_within("empty", "0");
    let answer = answer_once_not(w.addr, &review("empty", "p", "4Gi"), "status unknown");
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert_eq!(used_of(&api, "empty", "gpu"), "4Gi");

    // Over a running pod: what it holds.
    api.put(
        "resourcequotas",
        &memory_quota("busy", "gpu", "20Gi", None, None),
    );
    counted_within("busy", "10Gi");

    // A name added to a counted quota's hard: written too (0 GPUs here, none asked by name).
    api.edit("resourcequotas", "busy", "gpu", |q| {
        q["spec"]["hard"]["limits.gpuslice.io/gpus"] = json!("4");
    });
    let began = Instant::now();
    loop {
        let q = &api.objects("resourcequotas")[&("busy".to_string(), "gpu".to_string())];
        if q["status"]["used"]["limits.gpuslice.io/gpus"] == "1" {
            break;
        }
        assert!(began.elapsed() < Duration::from_secs(20), "{q}");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(used_of(&api, "busy", "gpu"), "10Gi");
}

/// A scope selector of priority class `class`.
fn priority(class: &str) -> Value {
    json!({"matchExpressions": [
        {"scopeName": "PriorityClass", "operator": "In", "values": [class]}]})
}

#[test]
fn a_scoped_quota_books_and_counts_only_the_pods_its_scopes_hold_for() {
    const NS: &str = "team-a";
    let api = FakeApi::start();
    api.put(
        "resourcequotas",
        &memory_quota(NS, "gpu-high", "40Gi", Some("0"), Some(priority("high"))),
    );
    api.put(
        "resourcequotas",
        &memory_quota(NS, "gpu-low", "8Gi", Some("0"), Some(priority("low"))),
    );
    let w = start_against(&api.url, patient());

    // A high-priority pod is charged to gpu-high alone.
    let answer = reviewed(w.addr, &classed_review(NS, "high", "16Gi", "high"));
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert_eq!(used_of(&api, NS, "gpu-high"), "16Gi");
    assert_eq!(used_of(&api, NS, "gpu-low"), "0");
    // A low one to gpu-low, past it.
    let answer = reviewed(w.addr, &classed_review(NS, "low", "16Gi", "low"));
    let said = answer["response"]["status"]["message"]
        .as_str()
        .unwrap_or("");
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    assert!(
        said.contains(&format!("exceeded quota: {NS}/gpu-low")),
        "{answer}"
    );
    // A pod of neither class, and a claim written by hand (in no scope): no quota counts
    // them, nothing booked.
    let answer = reviewed(w.addr, &review(NS, "plain", "16Gi"));
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    let answer = reviewed(w.addr, &pods_claim_review(NS, "alice", "16Gi"));
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert_eq!(used_of(&api, NS, "gpu-high"), "16Gi");
    assert_eq!(used_of(&api, NS, "gpu-low"), "0");
}

#[test]
fn the_recount_writes_each_scoped_quota_its_own_pods_total() {
    const NS: &str = "team-a";
    let api = FakeApi::start();
    template_of(&api, NS, "t2", "2Gi");
    template_of(&api, NS, "t8", "8Gi");
    api.put("pods", &pod_of(NS, "h1", "t8", Some("high")));
    api.put("pods", &pod_of(NS, "h2", "t8", Some("high")));
    api.put("pods", &pod_of(NS, "l1", "t2", Some("low")));
    api.put("pods", &pod_of(NS, "n1", "t2", None));
    api.put_claim(
        &json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "by-hand", "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpuslice.io", "capacity": {"requests": {"memory": "4Gi"}}}}]}}}),
    );
    api.put(
        "resourcequotas",
        &memory_quota(NS, "gpu-high", "40Gi", Some("0"), Some(priority("high"))),
    );
    api.put(
        "resourcequotas",
        &memory_quota(NS, "gpu-low", "8Gi", Some("0"), Some(priority("low"))),
    );
    api.put(
        "resourcequotas",
        &memory_quota(NS, "gpu", "100Gi", Some("0"), None),
    );
    recount_once(&api);
    assert_eq!(used_of(&api, NS, "gpu-high"), "16Gi");
    assert_eq!(used_of(&api, NS, "gpu-low"), "2Gi");
    // The quota without scopes: every pod and the claim.
    assert_eq!(used_of(&api, NS, "gpu"), "24Gi");
}

/// The budget Lease `gpuslice/budgets` held by another replica, renewed at `renew` (as its
/// clock reads) for a term of 3 s.
fn others_lease(renew: &str) -> Value {
    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "budgets", "namespace": "gpuslice"},
        "spec": {"holderIdentity": "other", "leaseDurationSeconds": 3, "renewTime": renew}})
}

fn lease_holder(api: &FakeApi) -> String {
    api.objects("leases")
        .get(&("gpuslice".to_string(), "budgets".to_string()))
        .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_string))
        .unwrap_or_default()
}

/// Replicas' clocks need not agree: a lease another replica keeps renewing is left to it
/// however far behind its clock writes `renewTime`, and taken once it stops renewing.
#[test]
fn a_lease_renewed_by_a_replica_whose_clock_lags_is_left_to_it_until_it_stops() {
    let api = FakeApi::start();
    api.put("leases", &others_lease("2026-01-01T00:00:00.000000Z"));
    let url = api.url.clone();
    std::thread::spawn(move || {
        runtime().block_on(async move {
            let cluster = cluster_of(&url).await;
            let lease = Some(("gpuslice".to_string(), "budgets".to_string()));
            Recount::new(Ledger::new(cluster, false), Duration::from_secs(1), lease)
                .run()
                .await;
        });
    });
    // The other replica renews every 500 ms for 5 s, its clock eleven months behind.
    for i in 0..10 {
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(
            lease_holder(&api),
            "other",
            "taken while renewed, at renewal {i}"
        );
        api.put(
            "leases",
            &others_lease(&format!("2026-01-01T00:00:{i:02}.000000Z")),
        );
    }
    // It stops: the lease is taken once unchanged for its term (3 s), a renewal or two on.
    let stopped = Instant::now();
    while lease_holder(&api) == "other" {
        assert!(
            stopped.elapsed() < Duration::from_secs(15),
            "not taken {:?} after its holder stopped renewing",
            stopped.elapsed()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
