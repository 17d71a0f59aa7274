//! `scripts/kube-cluster.sh up DIR … --kueue` runs Kueue (the pinned release, built from its Go
//! module) against a real control plane and node with gpuslice's webhook, configured by
//! gpuslice's part of packaging/helm/kueue-values.yaml: a ClusterQueue's `gpuslice.io/memory`
//! is charged a Job's GPU memory whichever way its pods ask — gpuslice's limits (memory per GPU
//! times GPUs), a claim template of the DeviceClass gpuslice.io, HAMi's limit names — so that
//! borrowing and reclaim inside a cohort move GPU memory between teams, and the node books
//! exactly what runs. In slot mode a claim template is charged its slots, and a prioritized
//! list is held inadmissible with Kueue's reason; the shipped values render with Kueue's chart.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use gpuslice_e2e::kube::KubeCluster;
use gpuslice_e2e::kube_node::{wait_for_or, KubeNode, APP_IMAGE};
use gpuslice_e2e::kubelet_plugin::{slice_of, KubeletPlugin};
use gpuslice_e2e::{lock, Resource, TestNode};
use serde_json::{json, Value};

use crate::helm_chart::{documents, find, helm};

const STEP: Duration = Duration::from_secs(120);
const GIB: u64 = 1 << 30;
/// Kueue's label naming a Job's LocalQueue.
const QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";
const TEAM_A: &str = "team-a";
const TEAM_B: &str = "team-b";

/// A ClusterQueue of `8Gi` of `gpuslice.io/memory` (and room for the GPUs pods count in
/// `gpuslice.io/gpus`, which Kueue holds every workload's resources to) in the cohort `pool`,
/// that reclaims what others borrowed from it.
fn cluster_queue(name: &str) -> Value {
    json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "cohortName": "pool",
            "namespaceSelector": {},
            "resourceGroups": [{
                "coveredResources": ["gpuslice.io/memory", "gpuslice.io/gpus"],
                "flavors": [{"name": "default", "resources": [
                    {"name": "gpuslice.io/memory", "nominalQuota": "8Gi"},
                    {"name": "gpuslice.io/gpus", "nominalQuota": "4"},
                ]}],
            }],
            "preemption": {"reclaimWithinCohort": "Any", "withinClusterQueue": "Never"},
        },
    })
}

/// A one-pod batch Job in `ns`'s LocalQueue `queue` whose container asks `limits`, or uses the
/// claim of template `template`.
fn job(ns: &str, name: &str, limits: Value, template: Option<&str>) -> Value {
    let mut pod = json!({
        "restartPolicy": "Never",
        "automountServiceAccountToken": false,
        "terminationGracePeriodSeconds": 1,
        "enableServiceLinks": false,
        "containers": [{
            "name": "main",
            "image": APP_IMAGE,
            "imagePullPolicy": "Never",
            "command": ["sh", "-c", "echo READY; exec sleep 3600"],
            "resources": {"limits": limits},
        }],
    });
    if let Some(t) = template {
        pod["resourceClaims"] = json!([{"name": "gpu", "resourceClaimTemplateName": t}]);
        pod["containers"][0]["resources"] = json!({"claims": [{"name": "gpu"}]});
    }
    json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": ns, "labels": {QUEUE_LABEL: "queue"}},
        "spec": {"backoffLimit": 0, "template": {"spec": pod}},
    })
}

/// Creates `object` and returns what the API server stored (after the admission webhooks).
fn create(c: &KubeCluster, object: &Value) -> Value {
    let out = c.kubectl_output(
        &["create", "-o", "json", "-f", "-"],
        Some(object.to_string().as_bytes()),
    );
    assert!(
        out.status.success(),
        "creating {} refused: {}",
        object["metadata"]["name"],
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("kubectl create -o json")
}

/// The Workload Kueue made for Job `ns/job`, once it exists.
fn workload(c: &KubeCluster, ns: &str, job: &str) -> Option<Value> {
    c.get_json(&["workloads.kueue.x-k8s.io", "-n", ns])["items"]
        .as_array()?
        .iter()
        .find(|w| w["metadata"]["ownerReferences"][0]["name"] == job)
        .cloned()
}

/// Whether condition `kind` of `object` is True, and its reason.
fn condition(object: &Value, kind: &str) -> Option<(bool, String)> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
        .map(|c| {
            (
                c["status"] == "True",
                c["reason"].as_str().unwrap_or_default().to_string(),
            )
        })
}

/// A Kubernetes quantity in bytes (the forms Kueue and kubectl print: plain, Ki/Mi/Gi).
fn bytes(q: &Value) -> u64 {
    let s = q.as_str().unwrap_or_else(|| panic!("not a quantity: {q}"));
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = n.parse().unwrap_or_else(|_| panic!("not a quantity: {s}"));
    n * match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        _ => panic!("unexpected unit in quantity {s}"),
    }
}

/// Waits until Job `ns/job`'s Workload is admitted; returns the `gpuslice.io/memory` Kueue
/// charged it.
fn wait_admitted(c: &KubeCluster, ns: &str, job: &str) -> u64 {
    let w = c.wait_for(
        &format!("Job {ns}/{job} to be admitted by Kueue"),
        STEP,
        || {
            let w = workload(c, ns, job)?;
            condition(&w, "Admitted")?.0.then_some(w)
        },
    );
    let usage = &w["status"]["admission"]["podSetAssignments"][0]["resourceUsage"];
    bytes(&usage["gpuslice.io/memory"])
}

/// `gpuslice.io/memory` of ClusterQueue `name`'s status: (total, borrowed); (0, 0) before
/// Kueue first reports it.
fn queue_usage(c: &KubeCluster, name: &str) -> (u64, u64) {
    let cq = c.get_json(&["clusterqueues.kueue.x-k8s.io", name]);
    let Some(r) = cq["status"]["flavorsUsage"][0]["resources"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["name"] == "gpuslice.io/memory"))
    else {
        return (0, 0);
    };
    let get = |k: &str| r.get(k).map_or(0, bytes);
    (get("total"), get("borrowed"))
}

/// Waits until ClusterQueue `name` reports `want` (total, borrowed) of `gpuslice.io/memory`
/// (Kueue writes a queue's status after it admits or evicts).
fn wait_queue_usage(c: &KubeCluster, name: &str, want: (u64, u64)) {
    let mut last = (0, 0);
    wait_for_or(STEP, || {
        last = queue_usage(c, name);
        (last == want).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "ClusterQueue {name} reports (total, borrowed) {last:?} of gpuslice.io/memory, not \
             {want:?}, within {STEP:?}: {}",
            c.get_json(&["clusterqueues.kueue.x-k8s.io", name])["status"]
        )
    });
}

/// The Job of each Running pod of the teams, and what the node books for it: the claims of
/// the pod (its `resourceClaimStatuses`) matched to the registry's reservations by
/// namespace and name, the bytes of every GPU added up. A booking of no running pod shows as
/// `(ns, "booked for no running pod: <claim>")`.
fn booked_per_running_job(c: &KubeCluster, node: &TestNode) -> BTreeMap<(String, String), u64> {
    let mut claim_job = BTreeMap::new();
    let mut booked = BTreeMap::new();
    for ns in [TEAM_A, TEAM_B] {
        for p in c.get_json(&["pods", "-n", ns])["items"].as_array().unwrap() {
            if p["status"]["phase"] != "Running" || !p["metadata"]["deletionTimestamp"].is_null() {
                continue;
            }
            let job = p["metadata"]["labels"]["job-name"].as_str().unwrap();
            booked.insert((ns.to_string(), job.to_string()), 0);
            for c in p["status"]["resourceClaimStatuses"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let claim = c["resourceClaimName"].as_str().unwrap().to_string();
                claim_job.insert((ns.to_string(), claim), job.to_string());
            }
        }
    }
    for r in node.reservations() {
        let ns = r["owner"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let claim = r["owner"]["name"].as_str().unwrap_or_default().to_string();
        let memory: u64 = r["gpus"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|g| g["memory"].as_u64().unwrap())
            .sum();
        let job = claim_job
            .get(&(ns.clone(), claim.clone()))
            .cloned()
            .unwrap_or_else(|| format!("booked for no running pod: {claim}"));
        *booked.entry((ns, job)).or_insert(0) += memory;
    }
    booked
}

/// Waits until the node books exactly `want` (job → bytes) for the teams' running pods.
fn wait_booked(c: &KubeCluster, node: &TestNode, want: &[(&str, &str, u64)]) {
    let want: BTreeMap<(String, String), u64> = want
        .iter()
        .map(|(ns, job, b)| ((ns.to_string(), job.to_string()), *b))
        .collect();
    let mut last = BTreeMap::new();
    wait_for_or(STEP, || {
        last = booked_per_running_job(c, node);
        (last == want).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "the node does not book exactly what runs within {STEP:?}: want {want:?}, booked \
             {last:?}\nreservations: {:?}\n{}\nkueue's log:\n{}",
            node.reservations(),
            c.state(),
            c.log_tail("kueue", 30)
        )
    });
}

#[test]
#[ignore = "starts a real Kubernetes node, the webhook and Kueue; the README's test command runs it"]
fn queues_charge_gpu_memory_borrow_and_reclaim_however_pods_ask() {
    let _s = lock(&[Resource::KubeNode]);
    // Two GPUs of 40Gi: room for everything the queues admit (16Gi at once, one Job on two GPUs).
    let node = TestNode::with_models(&[
        ("NVIDIA A100-SXM4-80GB", "40Gi"),
        ("NVIDIA A100-SXM4-80GB", "40Gi"),
    ]);
    let kn = KubeNode::up_with("gpu-node", &node, &["--webhook", "--kueue"]);
    let url = kn.env("KUEUE_WEBHOOK_URL").to_string();
    assert!(
        url.starts_with("https://127.0.0.1:"),
        "KUEUE_WEBHOOK_URL={url}"
    );

    let c = &kn.cluster;
    c.kubectl(&["create", "namespace", TEAM_A]);
    c.kubectl(&["create", "namespace", TEAM_B]);
    c.kubectl(&["label", "namespace", TEAM_B, "gpuslice.io/hami-compat=true"]);
    create(
        c,
        &json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                "metadata": {"name": "default"}}),
    );
    for team in [TEAM_A, TEAM_B] {
        create(c, &cluster_queue(team));
        create(
            c,
            &json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                    "metadata": {"name": "queue", "namespace": team},
                    "spec": {"clusterQueue": team}}),
        );
    }
    for team in [TEAM_A, TEAM_B] {
        c.wait_for(&format!("ClusterQueue {team} to be active"), STEP, || {
            let cq = c.get_json(&["clusterqueues.kueue.x-k8s.io", team]);
            condition(&cq, "Active")?.0.then_some(())
        });
    }
    // The v1beta1 view goes through Kueue's conversion webhook (registered by URL).
    let v1beta1 = c.get_json(&["clusterqueues.v1beta1.kueue.x-k8s.io", TEAM_A]);
    assert_eq!(v1beta1["spec"]["cohort"], "pool", "{v1beta1}");

    // Team A's first Job asks gpuslice's limits: 4Gi per GPU on 2 GPUs, charged 8Gi. Kueue's
    // Job webhook (by URL) suspended it at creation; Kueue admits it within A's quota.
    let stored = create(
        c,
        &job(
            TEAM_A,
            "a-1",
            json!({"gpuslice.io/gpus": "2", "gpuslice.io/memory": "4Gi"}),
            None,
        ),
    );
    assert_eq!(stored["spec"]["suspend"], true, "{}", stored["spec"]);
    assert_eq!(wait_admitted(c, TEAM_A, "a-1"), 8 * GIB);

    // Its second asks the same through a claim template of gpuslice.io: 8Gi more, past A's
    // quota, so it borrows B's idle 8Gi.
    create(
        c,
        &json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "slice-8g", "namespace": TEAM_A},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpuslice.io", "count": 1,
                "capacity": {"requests": {"memory": "8Gi"}},
            }}]}}},
        }),
    );
    create(c, &job(TEAM_A, "a-2", json!({}), Some("slice-8g")));
    assert_eq!(wait_admitted(c, TEAM_A, "a-2"), 8 * GIB);
    wait_queue_usage(c, TEAM_A, (16 * GIB, 8 * GIB));
    wait_booked(
        c,
        &node,
        &[(TEAM_A, "a-1", 8 * GIB), (TEAM_A, "a-2", 8 * GIB)],
    );

    // Team B submits HAMi's names: 8192 MiB on 1 GPU. B's quota is lent to A, so Kueue
    // reclaims it: one of A's Jobs is preempted (suspended, its pod and booking gone) and B's
    // runs. Kueue takes the most recently admitted first, by its QuotaReserved condition's
    // time, which is in whole seconds: a-1 and a-2 admitted within one second tie, and then
    // either may go.
    create(
        c,
        &job(
            TEAM_B,
            "b-1",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8192"}),
            None,
        ),
    );
    assert_eq!(wait_admitted(c, TEAM_B, "b-1"), 8 * GIB);
    let (victim, kept) = c.wait_for("Kueue to preempt one of team-a's Jobs", STEP, || {
        [("a-2", "a-1"), ("a-1", "a-2")]
            .into_iter()
            .find(|(name, _)| {
                workload(c, TEAM_A, name).is_some_and(|w| {
                    condition(&w, "Preempted") == Some((true, "InCohortReclamation".to_string()))
                })
            })
    });
    c.wait_for(
        &format!("Kueue to suspend the preempted Job team-a/{victim}"),
        STEP,
        || (c.get_json(&["job", victim, "-n", TEAM_A])["spec"]["suspend"] == true).then_some(()),
    );
    wait_booked(
        c,
        &node,
        &[(TEAM_A, kept, 8 * GIB), (TEAM_B, "b-1", 8 * GIB)],
    );
    wait_queue_usage(c, TEAM_A, (8 * GIB, 0));
    wait_queue_usage(c, TEAM_B, (8 * GIB, 0));
    // A's preempted Job waits for quota again.
    let pending = workload(c, TEAM_A, victim).unwrap();
    assert_eq!(
        condition(&pending, "Admitted").map(|c| c.0),
        Some(false),
        "{}",
        pending["status"]
    );
}

#[test]
#[ignore = "starts a real Kubernetes control plane, Kueue and a kubelet plugin; the README's test command runs it"]
fn in_slot_mode_a_claim_template_is_charged_its_slots() {
    let _s = lock(&[]);
    // Consumable capacity off: the plugin (dra.mode auto) publishes 2 L4s of 24Gi as 6 slots
    // of 4Gi each; Kueue admits without a kubelet (the pods then wait on a node object).
    let c = KubeCluster::up_with(
        &["--feature-gates", "DRAConsumableCapacity=false", "--kueue"],
        &[],
    );
    c.add_node("node-a");
    let node = TestNode::with_models(&[("NVIDIA L4", "24Gi"), ("NVIDIA L4", "24Gi")]);
    let _plugin = KubeletPlugin::start(&c, "node-a", &node);
    c.kubectl(&[
        "apply",
        "-f",
        &format!(
            "{}/../packaging/kubernetes/dra/deviceclass-slots.yaml",
            env!("CARGO_MANIFEST_DIR")
        ),
    ]);
    let slots = 2 * gpuslice_config::DEFAULT_SLOTS_PER_GPU as usize;
    let slice = c.wait_for("node-a's slot slice", STEP, || {
        slice_of(&c, "node-a")
            .filter(|s| s["spec"]["devices"].as_array().map(Vec::len) == Some(slots))
    });
    assert_eq!(
        slice["spec"]["devices"][0]["capacity"]["memory"]["value"], "4Gi",
        "{slice}"
    );
    c.kubectl(&["create", "namespace", TEAM_A]);
    for object in [
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
               "metadata": {"name": "default"}}),
        cluster_queue(TEAM_A),
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
               "metadata": {"name": "queue", "namespace": TEAM_A},
               "spec": {"clusterQueue": TEAM_A}}),
        // 2 slots of one GPU (the shape gpuslice's tools write for 8Gi of an L4).
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "two-slots", "namespace": TEAM_A},
            "spec": {"spec": {"devices": {
                "requests": [{"name": "gpu", "exactly": {
                    "deviceClassName": "slots.gpuslice.io", "count": 2}}],
                "constraints": [{"requests": ["gpu"], "matchAttribute": "gpuslice.io/uuid"}],
            }}},
        }),
    ] {
        c.create(&object)
            .unwrap_or_else(|e| panic!("{} refused: {e}", object["metadata"]["name"]));
    }
    c.wait_for("ClusterQueue team-a to be active", STEP, || {
        let cq = c.get_json(&["clusterqueues.kueue.x-k8s.io", TEAM_A]);
        condition(&cq, "Active")?.0.then_some(())
    });
    c.create(&job(TEAM_A, "slots", json!({}), Some("two-slots")))
        .unwrap_or_else(|e| panic!("Job refused: {e}"));
    assert_eq!(wait_admitted(&c, TEAM_A, "slots"), 8 * GIB);

    // A prioritized list (what gpuslice's tools write for several slot sizes) is not something
    // Kueue v0.19 can charge: the Workload stays inadmissible and says why.
    c.create(&json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "first-available", "namespace": TEAM_A},
        "spec": {"spec": {"devices": {
            "requests": [{"name": "gpu", "firstAvailable": [
                {"name": "slots-0", "deviceClassName": "slots.gpuslice.io", "count": 2}]}],
            "constraints": [{"requests": ["gpu"], "matchAttribute": "gpuslice.io/uuid"}],
        }}},
    }))
    .unwrap_or_else(|e| panic!("the prioritized-list template refused: {e}"));
    c.create(&job(
        TEAM_A,
        "prioritized",
        json!({}),
        Some("first-available"),
    ))
    .unwrap_or_else(|e| panic!("Job refused: {e}"));
    let why = c.wait_for(
        "Kueue to hold the prioritized-list Job inadmissible",
        STEP,
        || {
            let w = workload(&c, TEAM_A, "prioritized")?;
            let held = w["status"]["conditions"].as_array()?.iter().find(|c| {
                c["type"] == "QuotaReserved"
                    && c["status"] == "False"
                    && c["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("FirstAvailable"))
            })?;
            Some(held["message"].as_str()?.to_string())
        },
    );
    assert!(why.contains("not supported"), "{why}");
}

/// The directory of the Kueue module pinned in tests/kueue (its Helm chart is `charts/kueue`),
/// from Go's module cache, which `scripts/kube-cluster.sh build-kueue` filled.
fn kueue_module_dir() -> PathBuf {
    let go = ["go", "/usr/local/go/bin/go"]
        .into_iter()
        .find(|g| Command::new(g).arg("version").output().is_ok())
        .expect("a Go toolchain (go on PATH or /usr/local/go/bin/go)");
    let out = Command::new(go)
        .args([
            "list",
            "-mod=readonly",
            "-m",
            "-f",
            "{{.Dir}}",
            "sigs.k8s.io/kueue",
        ])
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("kueue"))
        .output()
        .expect("run go list");
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(
        out.status.success() && dir.join("charts/kueue/Chart.yaml").exists(),
        "no Kueue module with charts/kueue in Go's module cache ({}): run \
         scripts/kube-cluster.sh build-kueue",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

/// A Kueue Configuration held as text (a ConfigMap's data, the chart's values).
fn configuration(text: &Value) -> Value {
    serde_yaml_ng::from_str(text.as_str().expect("a configuration as text"))
        .unwrap_or_else(|e| panic!("not a YAML configuration ({e}): {text}"))
}

#[test]
#[ignore = "needs helm, built from its Go module (slow on a cold cache); the README's test command runs it"]
fn the_kueue_values_configure_kueues_own_chart() {
    let values = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/helm/kueue-values.yaml");
    let chart = kueue_module_dir().join("charts/kueue");
    let rendered = documents(&helm(&[
        "template",
        "kueue",
        chart.to_str().unwrap(),
        "--namespace",
        "kueue-system",
        "-f",
        values.to_str().unwrap(),
    ]));
    let shipped: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(&values).unwrap())
        .expect("kueue-values.yaml is YAML");
    let shipped = configuration(&shipped["managerConfig"]["controllerManagerConfigYaml"]);
    let config = find(&rendered, "ConfigMap", "kueue-manager-config")
        .unwrap_or_else(|| panic!("the chart rendered no kueue-manager-config"));
    let config = configuration(&config["data"]["controller_manager_config.yaml"]);
    // gpuslice's part reaches the manager's configuration whole ...
    assert_eq!(config["resources"], shipped["resources"], "{config}");
    assert_eq!(
        config["featureGates"]["KueueDRAIntegrationConsumableCapacity"], true,
        "{config}"
    );
    assert_eq!(
        config["resources"]["transformations"]
            .as_array()
            .map(Vec::len),
        Some(5)
    );
    // ... and no feature gate on the command line, which Kueue refuses beside them.
    let manager = find(&rendered, "Deployment", "kueue-controller-manager")
        .unwrap_or_else(|| panic!("the chart rendered no kueue-controller-manager"));
    let args = &manager["spec"]["template"]["spec"]["containers"][0]["args"];
    assert!(
        args.as_array()
            .unwrap()
            .iter()
            .all(|a| !a.as_str().unwrap().starts_with("--feature-gates")),
        "{args}"
    );
}

#[test]
fn kube_cluster_help_documents_kueue() {
    let help = Command::new(gpuslice_e2e::kube::script())
        .arg("--help")
        .output()
        .expect("run kube-cluster.sh --help");
    let text = String::from_utf8_lossy(&help.stdout);
    for needle in [
        "up DIR … --kueue",
        "build-kueue",
        "GPUSLICE_KUEUE_BIN_DIR",
        "packaging/helm/kueue-values.yaml",
    ] {
        assert!(text.contains(needle), "--help lacks {needle:?}:\n{text}");
    }
}
