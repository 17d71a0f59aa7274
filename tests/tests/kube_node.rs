//! A real Kubernetes node. `scripts/kube-cluster.sh up DIR --node NAME` runs the
//! release's kubelet on containerd 2.x (built from its Go module, CDI on by default) with
//! gpuslice registered by `gpuslice configure containerd` and the gpuslice kubelet plugin
//! registered with that kubelet, on a simulated GPU node (one 24 GiB L4). Pods go through the
//! scheduler, the kubelet's DRA calls, CRI and runc:
//! 1. a pod with a claim from a template gets the claim's GPU node and limits, the probe
//!    through the shim is refused past the slice, a holder that unloads the shim from a pid
//!    namespace of its own (`unshare -U -r -p -f -m` under `kubectl exec`) is killed by the
//!    enforcer as the claim's, and deleting the pod releases the booking;
//!    then a claim deleted under its running pod (finalizer removed) stays booked while the
//!    pod's container runs, a claim the scheduler allocates over it is not booked (the pod's
//!    event names the holder), `status` and the plugin's log say why, and deleting the pod
//!    releases it; and the plugin's ServiceAccount may write only its own node's
//!    ResourceSlices (packaging/kubernetes/dra/kubelet-plugin-policy.yaml);
//! 2. a Deployment of 3 replicas whose claims fit 2: 2 Running, 1 Pending with the
//!    scheduler's reason; scaling to 2 frees nothing wrongly;
//! 3. the RuntimeClass + annotation path through the same kubelet and containerd, and
//!    `configure containerd --remove` gives containerd's config back as it was;
//! 4. the plugin, then the kubelet, restarted under a running pod: nothing is lost and the
//!    pod's deletion still unprepares;
//! 5. with `DRAConsumableCapacity=false` on every component (what 1.34/1.35 and managed
//!    clusters run), the plugin publishes slots: two pods with slot claims run with their
//!    limits, a third that does not fit is Pending with the scheduler's reason, and deleting a
//!    pod releases its slots to it; the exporter shows the slot claims' slices with their
//!    per-GPU limits and share. Then the cluster upgrades (the control plane and the kubelet
//!    restarted with consumable capacity on, then the plugin): the plugin publishes in capacity
//!    mode, the running slot pods keep their slices, what they hold stays unavailable to
//!    capacity claims, a capacity claim runs, and deleting a slot pod releases its booking.

use std::collections::BTreeSet;

use gpuslice_e2e::kube_node::{
    claim_reservations, claim_template, pod, pod_spec, wait, wait_for_or, KubeNode, NS, STEP,
};
use gpuslice_e2e::serve::{value, Exporter, Series};
use gpuslice_e2e::view::{assert_slice_view, SLICE_CHECKS};
use gpuslice_e2e::{lock, Resource, TestNode};
use serde_json::{json, Value};

const GIB: u64 = 1 << 30;
const NODE: &str = "gpu-node";

/// What a claimed container prints: its GPU device nodes, the shim preload, its limits and
/// whether it can write them, and the probe allocating 1 GiB chunks through the shim.
const CLAIM_CHECKS: &str = "echo devices=$(ls /dev | grep nvidia | tr '\\n' ' '); \
    echo preload=$(cat /etc/ld.so.preload); \
    echo limits=$(cat /run/gpuslice/limits.json); \
    if (echo x > /run/gpuslice/limits.json) 2>/dev/null; then echo limits-writable; else echo limits-readonly; fi; \
    gpuslice-probe --json alloc --chunk 1Gi --max 20Gi; echo EXIT $?; \
    echo READY; exec sleep 600";

fn l4_node() -> TestNode {
    TestNode::with_models_exact(&[("NVIDIA L4", "24Gi")])
}

/// The ResourceClaim of pod `p` (made from its template), as JSON.
fn claim_of(kn: &KubeNode, p: &Value) -> Value {
    let name = p["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        .as_str()
        .unwrap_or_else(|| panic!("pod has no generated claim: {}", p["status"]));
    kn.cluster.get_json(&["resourceclaim", name, "-n", NS])
}

/// The one line of the log starting with `prefix`, without it.
fn line<'a>(log: &'a str, prefix: &str) -> &'a str {
    log.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} line in: {log}"))
}

/// The node's reservations as (id, uuid, memory, cores).
fn bookings(node: &TestNode) -> BTreeSet<(String, String, u64, u64)> {
    node.reservations()
        .iter()
        .flat_map(|r| {
            let id = r["id"].as_str().unwrap().to_string();
            r["gpus"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(move |g| {
                    (
                        id.clone(),
                        g["uuid"].as_str().unwrap().to_string(),
                        g["memory"].as_u64().unwrap(),
                        g["cores"].as_u64().unwrap_or(0),
                    )
                })
        })
        .collect()
}

/// Checks the view of a container holding the claim of `p` (10 GiB, 30 % of GPU 0): the
/// allocation the scheduler wrote, the booking `status` shows, and what the container saw.
/// Returns the reservation id.
fn assert_claim_view(kn: &KubeNode, node: &TestNode, p: &Value, log: &str) -> String {
    let claim = claim_of(kn, p);
    let results = &claim["status"]["allocation"]["devices"]["results"];
    assert_eq!(results.as_array().map(Vec::len), Some(1), "{claim}");
    let r = &results[0];
    assert_eq!(r["driver"], "gpuslice.io", "{r}");
    assert_eq!(r["pool"], NODE, "{r}");
    assert_eq!(r["device"], "gpu-0", "{r}");
    assert_eq!(r["consumedCapacity"]["memory"], "10Gi", "{r}");
    assert_eq!(r["consumedCapacity"]["cores"], "30", "{r}");

    let uuid = node.uuid(0);
    let res = node.reservations();
    assert_eq!(res.len(), 1, "{res:?}");
    let id = res[0]["id"].as_str().unwrap().to_string();
    assert_eq!(
        bookings(node),
        BTreeSet::from([(id.clone(), uuid.clone(), 10 * GIB, 30)]),
        "status --json: {res:?}"
    );

    // The claim's CDI hook recorded its container host-side: what the node agent attributes
    // the claim's GPU processes by (init pid, start time and the cgroup the kubelet made).
    let file: Value =
        serde_json::from_slice(&std::fs::read(node.state_dir().join("registry.json")).unwrap())
            .unwrap();
    let owner = &file["reservations"][0]["owner"];
    assert_eq!(owner["kind"], "dra_claim", "{owner}");
    let members = owner["members"].as_array().cloned().unwrap_or_default();
    assert!(
        !members.is_empty()
            && members
                .iter()
                .all(|m| m["pid"].as_u64().is_some_and(|p| p > 1)
                    && m["cgroup"].as_str().is_some_and(|c| !c.is_empty())),
        "the claim's container is not recorded: {owner}"
    );

    let mut devices: Vec<&str> = line(log, "devices=").split_whitespace().collect();
    devices.sort_unstable();
    assert_eq!(
        devices,
        ["nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidiactl"],
        "{log}"
    );
    assert_eq!(
        line(log, "preload="),
        "/usr/lib/gpuslice/libgpuslice_shim.so",
        "{log}"
    );
    let limits: Value = serde_json::from_str(line(log, "limits=")).expect("limits JSON");
    assert_eq!(
        limits,
        json!({"version": 1, "reservation": id,
               "devices": [{"uuid": uuid, "memory_limit": 10 * GIB, "cores": 30}]}),
        "{log}"
    );
    assert!(log.lines().any(|l| l == "limits-readonly"), "{log}");
    let report: Value = log
        .lines()
        .find_map(|l| {
            serde_json::from_str::<Value>(l)
                .ok()
                .filter(|v| v["cmd"] == "alloc")
        })
        .unwrap_or_else(|| panic!("no alloc report from the probe: {log}"));
    assert_eq!(report["total"], 10 * GIB, "{report}");
    assert_eq!(report["error"], "CUDA_ERROR_OUT_OF_MEMORY", "{report}");
    assert_eq!(report["mem_total"], 10 * GIB, "{report}");
    assert!(log.contains("EXIT 0"), "{log}");
    id
}

/// After pod deletion: no booking, no slice files, no claim spec, claim gone.
fn assert_released(kn: &KubeNode, node: &TestNode, claim: &Value) {
    let uid = claim["metadata"]["uid"].as_str().unwrap().to_string();
    let name = claim["metadata"]["name"].as_str().unwrap().to_string();
    wait_for_or(STEP, || node.reservations().is_empty().then_some(())).unwrap_or_else(|| {
        panic!(
            "the claim's booking was not released: {:?}\n{}",
            node.reservations(),
            kn.logs()
        )
    });
    assert!(node.leftovers().is_empty(), "{:?}", node.leftovers());
    let spec = node
        .cdi_dir
        .join(gpuslice_cdi::transient_spec_file_name(gpuslice_kube::CLAIM_KIND, &uid).unwrap());
    assert!(!spec.exists(), "{} left behind", spec.display());
    wait(&format!("claim {name} to be deleted with its pod"), || {
        let out = kn
            .cluster
            .kubectl_output(&["get", "resourceclaim", &name, "-n", NS], None);
        (!out.status.success()).then_some(())
    });
}

#[test]
fn pod_with_a_claim_runs_with_its_slice_and_releases_it() {
    let _s = lock(&[Resource::KubeNode]);
    let node = l4_node();
    let mut kn = KubeNode::up(NODE, &node);
    kn.cluster
        .create(&claim_template("slice-10g-30", "10Gi", "30"))
        .unwrap();
    kn.cluster
        .create(&pod("sliced", CLAIM_CHECKS, Some("slice-10g-30")))
        .unwrap();
    let p = kn.wait_running("sliced");
    assert_eq!(p["spec"]["nodeName"], NODE, "{}", p["spec"]);
    let log = kn.wait_log("sliced", "READY");
    assert_claim_view(&kn, &node, &p, &log);

    // Past the shim from a pid namespace of its own: only the container's cgroup tells that
    // the holder is the claim's; the enforcer kills it as the claim's.
    let claim = claim_of(&kn, &p);
    let r = reservation_of(&node, &claim)["id"]
        .as_str()
        .unwrap()
        .to_string();
    let exporter = Exporter::start(&node);
    let out = kn.exec(
        "sliced",
        &[
            "sh",
            "-c",
            "unshare -U -r -p -f -m sh -c 'mount --bind /dev/null /etc/ld.so.preload && \
             gpuslice-probe --json alloc --chunk 1Gi --max 14Gi --hold 30'; echo EXIT $?",
        ],
    );
    assert!(
        out.contains("EXIT 137"),
        "the holder must die by SIGKILL:\n{out}\nserve log:\n{}",
        exporter.log()
    );
    let kill = wait_for_or(STEP, || {
        node.status()["enforcer"]["events"]
            .as_array()?
            .iter()
            .find(|e| e["kind"] == "memory_kill" && e["reservation"] == r.as_str())
            .cloned()
    })
    .unwrap_or_else(|| panic!("no kill of claim {r}'s holder\n{}", exporter.log()));
    assert_eq!(kill["limit_bytes"].as_u64(), Some(10 * GIB), "{kill}");
    drop(exporter);

    kn.delete_pod("sliced");
    assert_released(&kn, &node, &claim);

    a_deleted_claim_stays_booked_while_its_pod_runs(&kn, &node);
    the_plugins_service_account_writes_only_its_own_nodes_slices(&kn);
    the_plugins_service_account_annotates_only_its_own_nodes_pods(&kn);
    a_prepare_refused_on_the_authorizers_race_is_retried_at_once(&kn);
    kn.cluster.down();
}

/// Waits until the plugin's log holds `text`; returns the whole log.
fn wait_plugin_log(kn: &KubeNode, text: &str) -> String {
    let path = kn.cluster.dir().join("logs/gpuslice-kubelet-plugin.log");
    wait_for_or(STEP, || {
        let log = std::fs::read_to_string(&path).unwrap_or_default();
        log.contains(text).then_some(log)
    })
    .unwrap_or_else(|| panic!("no {text:?} in {}\n{}", path.display(), kn.logs()))
}

/// What a pod's claim allocated over a kept booking came to.
enum Over {
    /// Allocated, and its prepare refused: the pod's events.
    Refused(String),
    /// Never allocated (the plugin had withdrawn the kept booking first): the scheduler's
    /// message.
    Unschedulable(String),
}

/// A claim deleted under its running pod (its finalizer removed, as the default `edit` role
/// may) keeps its booking while the pod's container runs: a claim the scheduler then
/// allocates over it on the same GPU is not booked (prepare refuses, naming the holder), or,
/// once the plugin has withdrawn the kept booking from the slice, is not allocated at all;
/// `status` and one line of the plugin's log say why; deleting the pod releases the booking
/// and the waiting pod runs.
fn a_deleted_claim_stays_booked_while_its_pod_runs(kn: &KubeNode, node: &TestNode) {
    let mut claim = claim_template("held-16g", "16Gi", "0");
    claim["kind"] = json!("ResourceClaim");
    claim["spec"] = claim["spec"]["spec"].clone();
    kn.cluster.create(&claim).unwrap();
    let mut spec = pod_spec("echo READY; exec sleep 600", None);
    spec["resourceClaims"] = json!([{"name": "gpu", "resourceClaimName": "held-16g"}]);
    spec["containers"][0]["resources"] = json!({"claims": [{"name": "gpu"}]});
    kn.cluster
        .create(&json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "holder", "namespace": NS},
            "spec": spec,
        }))
        .unwrap();
    let holder = kn.wait_running("holder");
    let cid = holder["status"]["containerStatuses"][0]["containerID"].clone();
    let held = kn
        .cluster
        .get_json(&["resourceclaim", "held-16g", "-n", NS]);
    let booking = reservation_of(node, &held);
    let id = booking["id"].as_str().unwrap().to_string();
    assert_eq!(booking["gpus"][0]["memory"], 16 * GIB, "{booking}");

    kn.cluster.kubectl(&[
        "delete",
        "resourceclaim",
        "held-16g",
        "-n",
        NS,
        "--wait=false",
    ]);
    kn.cluster.kubectl(&[
        "patch",
        "resourceclaim",
        "held-16g",
        "-n",
        NS,
        "--type=json",
        "-p",
        r#"[{"op": "remove", "path": "/metadata/finalizers"}]"#,
    ]);
    wait("claim held-16g to be gone", || {
        let out = kn
            .cluster
            .kubectl_output(&["get", "resourceclaim", "held-16g", "-n", NS], None);
        (!out.status.success()).then_some(())
    });
    // The scheduler no longer counts the 16 GiB: 12 GiB of the 24 GiB L4 look free.
    kn.cluster
        .create(&claim_template("slice-12g", "12Gi", "0"))
        .unwrap();
    kn.cluster
        .create(&pod(
            "over",
            "echo READY; exec sleep 600",
            Some("slice-12g"),
        ))
        .unwrap();
    let withdrawn = vec![("gpu-0".to_string(), Some("8Gi".to_string()))];
    let holder_named =
        "held there by claim default/held-16g (16Gi; the claim no longer exists, kept while its containers run)";
    let outcome = wait_for_or(STEP, || {
        let events = kn.events("over");
        if events.contains(holder_named) {
            return Some(Over::Refused(events));
        }
        let p = kn.pod("over")?;
        let unschedulable = p["status"]["conditions"].as_array()?.iter().find(|c| {
            c["type"] == "PodScheduled" && c["status"] == "False" && c["reason"] == "Unschedulable"
        })?;
        (published(kn) == withdrawn)
            .then(|| Over::Unschedulable(unschedulable["message"].to_string()))
    })
    .unwrap_or_else(|| {
        panic!(
            "pod over was neither refused at prepare naming the holder nor unschedulable: {:?}\nevents:\n{}\n{}",
            kn.pod("over").map(|p| p["status"].clone()),
            kn.events("over"),
            kn.logs()
        )
    });
    match &outcome {
        Over::Refused(events) => assert!(
            events.contains("cannot be prepared on GPU 0")
                && events.contains("it needs 12Gi of memory and 8Gi of 24Gi is free"),
            "{events}"
        ),
        Over::Unschedulable(message) => assert!(
            message.contains("cannot allocate all claims"),
            "scheduler's reason: {message}"
        ),
    }
    // The plugin says why once; the booking, the container and the withdrawal stay.
    let kept_line = "keeping the booking of claim default/held-16g";
    let log = wait_plugin_log(kn, kept_line);
    assert!(
        log.contains(&format!(
            "(reservation {id}): the claim no longer exists, but 1 container(s) it was given to still run"
        )),
        "{log}"
    );
    wait_for_or(STEP, || (published(kn) == withdrawn).then_some(()))
        .unwrap_or_else(|| panic!("published {:?}, want {withdrawn:?}", published(kn)));
    let now = reservation_of(node, &held);
    assert_eq!(now["id"], id.as_str());
    assert_eq!(
        now["owner"]["gone"]["why"], "the claim no longer exists",
        "{now}"
    );
    assert_eq!(now["gpus"], booking["gpus"]);
    let over_claim = claim_of(kn, &kn.pod("over").unwrap());
    assert!(
        claim_reservations(node)
            .iter()
            .all(|r| r["owner"]["claim_uid"] != over_claim["metadata"]["uid"]),
        "{:?}",
        node.reservations()
    );
    let holder = kn.wait_running("holder");
    assert_eq!(holder["status"]["containerStatuses"][0]["containerID"], cid);
    let status = node.gpuslice(&["status"]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        text.contains(&format!(
            "DRA: reservation {id} of claim default/held-16g is kept: the claim no longer exists, but 1 container(s) it was given to still run"
        )),
        "{text}"
    );

    // The pod goes: the booking with it; the waiting pod runs with its 12 GiB.
    kn.delete_pod("holder");
    wait_for_or(STEP, || {
        claim_reservations(node)
            .iter()
            .all(|r| r["id"] != id.as_str())
            .then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "the kept booking outlived its pod: {:?}",
            node.reservations()
        )
    });
    let over = kn.wait_running("over");
    let over_claim = claim_of(kn, &over);
    assert_eq!(
        reservation_of(node, &over_claim)["gpus"][0]["memory"],
        12 * GIB
    );
    assert_eq!(
        wait_plugin_log(kn, kept_line).matches(kept_line).count(),
        1,
        "the plugin logs a kept booking once"
    );
    kn.delete_pod("over");
    assert_released(kn, node, &over_claim);
}

/// The plugin's ServiceAccount, with the node-name claim a pod's token carries, may create,
/// update and delete the ResourceSlices of its own node only; without the claim, none.
fn the_plugins_service_account_writes_only_its_own_nodes_slices(kn: &KubeNode) {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let _ = kn
        .cluster
        .kubectl_output(&["create", "namespace", "gpuslice-system"], None);
    for file in ["rbac.yaml", "kubelet-plugin-policy.yaml"] {
        let path = repo.join("packaging/kubernetes/dra").join(file);
        kn.cluster.kubectl(&["apply", "-f", path.to_str().unwrap()]);
    }
    let slice = |name: &str, node: &str| {
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {"driver": "policy-probe.gpuslice.io", "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": []},
        })
    };
    let as_plugin =
        |args: &[&str], object: Option<&Value>, extra: bool| as_the_plugin(kn, args, object, extra);
    let refused_other = format!(
        "the gpuslice kubelet plugin of node {NODE} may write only ResourceSlices whose spec.nodeName is {NODE}; this one is of node other-node"
    );
    // Another node's slice: refused, once the API server has loaded the policy.
    wait_for_or(STEP, || {
        match as_plugin(
            &["create", "-f", "-"],
            Some(&slice("probe-other", "other-node")),
            true,
        ) {
            Err(e) if e.contains(&refused_other) => Some(()),
            Err(e) => panic!("refused for another reason: {e}"),
            Ok(()) => {
                // Admitted before the policy took effect: take it back and try again.
                kn.cluster
                    .kubectl(&["delete", "resourceslice", "probe-other"]);
                None
            }
        }
    })
    .unwrap_or_else(|| panic!("the plugin could write another node's ResourceSlice"));
    // An update as the plugin makes it (kube/plugin/src/publisher.rs): a replace of the slice
    // read back, its resourceVersion kept (the role grants update, neither get nor patch).
    let updated = |name: &str| {
        let mut s = kn.cluster.get_json(&["resourceslice", name]);
        s["metadata"]["labels"] = json!({"probe": "updated"});
        s
    };
    // Its own node's: created, updated and deleted.
    as_plugin(
        &["create", "-f", "-"],
        Some(&slice("probe-own", NODE)),
        true,
    )
    .unwrap();
    as_plugin(&["replace", "-f", "-"], Some(&updated("probe-own")), true).unwrap();
    as_plugin(&["delete", "resourceslice", "probe-own"], None, true).unwrap();
    // Another node's, made by an admin: the plugin may neither change nor delete it.
    kn.cluster
        .create(&slice("probe-other", "other-node"))
        .unwrap();
    let e = as_plugin(&["replace", "-f", "-"], Some(&updated("probe-other")), true).unwrap_err();
    assert!(e.contains(&refused_other), "replace: {e}");
    let e = as_plugin(&["delete", "resourceslice", "probe-other"], None, true).unwrap_err();
    assert!(e.contains(&refused_other), "delete: {e}");
    kn.cluster
        .kubectl(&["delete", "resourceslice", "probe-other"]);
    // A token bound to no node writes nothing.
    let e = as_plugin(
        &["create", "-f", "-"],
        Some(&slice("probe-own", NODE)),
        false,
    )
    .unwrap_err();
    assert!(e.contains("this request names no node"), "{e}");
}

/// kubectl `args` (stdin `object`) as the plugin's ServiceAccount, with the node-name claim of
/// a token issued on NODE when `extra`: Ok, or kubectl's error.
fn as_the_plugin(
    kn: &KubeNode,
    args: &[&str],
    object: Option<&Value>,
    extra: bool,
) -> Result<(), String> {
    let plugin = "--as=system:serviceaccount:gpuslice-system:gpuslice-kubelet-plugin";
    let on_node = format!("--as-user-extra=authentication.kubernetes.io/node-name={NODE}");
    let mut all = vec![plugin];
    if extra {
        all.push(&on_node);
    }
    all.extend_from_slice(args);
    let input = object.map(|o| o.to_string().into_bytes());
    let out = kn.cluster.kubectl_output(&all, input.as_deref());
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The plugin's ServiceAccount (rbac.yaml and kubelet-plugin-policy.yaml applied by the test
/// before) may set the annotation that wakes the kubelet on a pod of its own node, guarded by
/// the pod's uid as the plugin's patch is (kube/plugin/src/stalled_prepare.rs); it may not
/// touch another node's pod, another annotation or a label, nor anything without the node
/// claim, nor delete a pod.
fn the_plugins_service_account_annotates_only_its_own_nodes_pods(kn: &KubeNode) {
    let mut own = pod("wake-own", "sleep 3600", None);
    own["spec"]["nodeName"] = json!(NODE);
    own["spec"]["terminationGracePeriodSeconds"] = json!(0);
    let mut other = own.clone();
    other["metadata"]["name"] = json!("wake-other");
    other["spec"]["nodeName"] = json!("other-node");
    for p in [&own, &other] {
        kn.cluster.create(p).unwrap();
    }
    let key = "dra.gpuslice.io/prepare-retries";
    let set = |value: &str| format!("{key}={value}");
    let refused_other = format!(
        "the gpuslice kubelet plugin of node {NODE} may annotate only pods on {NODE}; this one is on node other-node"
    );
    // Another node's pod: refused, once the API server has loaded the policy.
    wait_for_or(STEP, || {
        match as_the_plugin(
            kn,
            &["annotate", "pod", "-n", NS, "wake-other", &set("1")],
            None,
            true,
        ) {
            Err(e) if e.contains(&refused_other) => Some(()),
            Err(e) => panic!("refused for another reason: {e}"),
            Ok(()) => {
                // Admitted before the policy took effect: take it back and try again.
                kn.cluster.kubectl(&[
                    "annotate",
                    "pod",
                    "-n",
                    NS,
                    "wake-other",
                    &format!("{key}-"),
                ]);
                None
            }
        }
    })
    .unwrap_or_else(|| panic!("the plugin could annotate another node's pod"));
    // Its own node's pod: the annotation, by the plugin's own patch (the uid held).
    let uid = kn.cluster.get_json(&["pod", "wake-own", "-n", NS])["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let wake = |uid: &str, n: usize| {
        let patch = gpuslice_kube::stalled_prepare::wake_patch(uid, n).to_string();
        as_the_plugin(
            kn,
            &[
                "patch", "pod", "-n", NS, "wake-own", "--type", "merge", "-p", &patch,
            ],
            None,
            true,
        )
    };
    wake(&uid, 1).unwrap();
    let got = kn.cluster.get_json(&["pod", "wake-own", "-n", NS]);
    assert_eq!(got["metadata"]["annotations"][key], "1", "{got}");
    // A pod of that name made since (another uid) is not touched.
    let e = wake("0000", 2).unwrap_err();
    assert!(e.to_lowercase().contains("uid"), "{e}");
    let got = kn.cluster.get_json(&["pod", "wake-own", "-n", NS]);
    assert_eq!(got["metadata"]["annotations"][key], "1", "{got}");
    // Nothing else of its own node's pods.
    let only = "the gpuslice kubelet plugin may change only the annotation dra.gpuslice.io/prepare-retries of a pod";
    for args in [
        &[
            "annotate",
            "pod",
            "-n",
            NS,
            "wake-own",
            "other.example.com/x=1",
        ][..],
        &["label", "pod", "-n", NS, "wake-own", "x=y"][..],
    ] {
        let e = as_the_plugin(kn, args, None, true).unwrap_err();
        assert!(e.contains(only), "{args:?}: {e}");
    }
    // Without the node claim, nothing; a delete is not granted at all.
    let e = as_the_plugin(
        kn,
        &[
            "annotate",
            "--overwrite",
            "pod",
            "-n",
            NS,
            "wake-own",
            &set("2"),
        ],
        None,
        false,
    )
    .unwrap_err();
    assert!(e.contains("this request names no node"), "{e}");
    let e = as_the_plugin(kn, &["delete", "pod", "-n", NS, "wake-own"], None, true).unwrap_err();
    assert!(e.contains("forbidden"), "{e}");
    force_delete_pods(kn, &["wake-own", "wake-other"]);
}

/// The plugin watches the kubelet's FailedPrepareDynamicResources events and sets the wake
/// annotation on a pod of its node that the node authorizer refused the kubelet the claims
/// of (kube/plugin/src/stalled_prepare.rs), and on no other: the events are the kubelet's as
/// it posts them (reason, source, message), made by the test because the race they report
/// cannot be made to happen on purpose. Two pods stay Pending on the node (their image is
/// never pulled); the event about the first names another failure and comes first, so by the
/// time the second pod is annotated the first one's was seen and left alone.
fn a_prepare_refused_on_the_authorizers_race_is_retried_at_once(kn: &KubeNode) {
    let key = "dra.gpuslice.io/prepare-retries";
    let mut uids = Vec::new();
    for name in ["refused-other", "refused-race"] {
        let mut p = pod(name, "true", None);
        p["spec"]["nodeName"] = json!(NODE);
        p["spec"]["terminationGracePeriodSeconds"] = json!(0);
        p["spec"]["containers"][0]["image"] = json!("localhost/gpuslice-e2e-never-pulled:1");
        p["spec"]["containers"][0]["imagePullPolicy"] = json!("Never");
        kn.cluster.create(&p).unwrap();
        let got = kn.cluster.get_json(&["pod", name, "-n", NS]);
        uids.push(got["metadata"]["uid"].as_str().unwrap().to_string());
    }
    let event = |pod: &str, uid: &str, message: &str| {
        json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": format!("{pod}.prepare"), "namespace": NS},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": NS, "name": pod, "uid": uid},
            "reason": "FailedPrepareDynamicResources",
            "message": message,
            "source": {"component": "kubelet", "host": NODE},
            "type": "Warning",
            "count": 1,
            "firstTimestamp": "2026-12-06T00:00:00Z",
            "lastTimestamp": "2026-12-06T00:00:00Z",
        })
    };
    kn.cluster
        .create(&event(
            "refused-other",
            &uids[0],
            "Failed to prepare dynamic resources: NodePrepareResources: claim refused by the driver",
        ))
        .unwrap();
    kn.cluster
        .create(&event(
            "refused-race",
            &uids[1],
            &format!(
                "Failed to prepare dynamic resources: prepare dynamic resources: fetch ResourceClaim refused-race-gpu-x: \
                 resourceclaims.resource.k8s.io \"refused-race-gpu-x\" is forbidden: User \"system:node:{NODE}\" cannot get \
                 resource \"resourceclaims\" in API group \"resource.k8s.io\" in the namespace \"{NS}\": node: no \
                 relationship found between node '{NODE}' and this object"
            ),
        ))
        .unwrap();
    let woken = wait_for_or(STEP, || {
        let p = kn.cluster.get_json(&["pod", "refused-race", "-n", NS]);
        (p["metadata"]["annotations"][key] == "1").then_some(p)
    })
    .unwrap_or_else(|| {
        panic!(
            "the plugin did not annotate the pod refused on the race\n{}",
            kn.logs()
        )
    });
    assert_eq!(woken["metadata"]["uid"], uids[1].as_str());
    let log = wait_plugin_log(
        kn,
        &format!("pod {NS}/refused-race: the node authorizer refused"),
    );
    assert!(log.contains(&format!("{key}=1")), "{log}");
    let other = kn.cluster.get_json(&["pod", "refused-other", "-n", NS]);
    assert!(
        other["metadata"]["annotations"][key].is_null(),
        "another failure woke the pod: {other}"
    );
    force_delete_pods(kn, &["refused-other", "refused-race"]);
}

/// Deletes pods `names` at once, without waiting (pods on no real node, or never started).
fn force_delete_pods(kn: &KubeNode, names: &[&str]) {
    for p in names {
        kn.cluster.kubectl(&[
            "delete",
            "pod",
            "-n",
            NS,
            p,
            "--grace-period=0",
            "--force",
            "--wait=false",
        ]);
    }
}

/// The pods of Deployment `app` by phase: (Running and ready, Pending).
fn replicas(kn: &KubeNode, app: &str) -> (Vec<Value>, Vec<Value>) {
    let pods = kn
        .cluster
        .get_json(&["pods", "-n", NS, "-l", &format!("app={app}")]);
    let items = pods["items"].as_array().cloned().unwrap_or_default();
    let running = items
        .iter()
        .filter(|p| {
            p["metadata"]["deletionTimestamp"].is_null()
                && p["status"]["phase"] == "Running"
                && p["status"]["containerStatuses"]
                    .as_array()
                    .is_some_and(|c| c.iter().all(|c| c["ready"] == true))
        })
        .cloned()
        .collect();
    let pending = items
        .iter()
        .filter(|p| {
            p["metadata"]["deletionTimestamp"].is_null() && p["status"]["phase"] == "Pending"
        })
        .cloned()
        .collect();
    (running, pending)
}

fn names(pods: &[Value]) -> BTreeSet<String> {
    pods.iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn deployment_of_three_whose_claims_fit_two_runs_two() {
    let _s = lock(&[Resource::KubeNode]);
    let node = l4_node();
    let mut kn = KubeNode::up(NODE, &node);
    kn.cluster
        .create(&claim_template("slice-10g", "10Gi", "0"))
        .unwrap();
    let mut spec = pod_spec("echo READY; exec sleep 600", Some("slice-10g"));
    spec["containers"][0]["volumeMounts"] = json!([]);
    spec["volumes"] = json!([]);
    kn.cluster
        .create(&json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "sliced", "namespace": NS},
            "spec": {
                "replicas": 3,
                "selector": {"matchLabels": {"app": "sliced"}},
                "template": {"metadata": {"labels": {"app": "sliced"}}, "spec": spec},
            },
        }))
        .unwrap();
    let mut last = (Vec::new(), Vec::new());
    let (running, pending) = wait_for_or(STEP, || {
        last = replicas(&kn, "sliced");
        let (running, pending) = &last;
        let unschedulable = pending.len() == 1
            && pending[0]["status"]["conditions"]
                .as_array()
                .is_some_and(|c| {
                    c.iter().any(|c| {
                        c["type"] == "PodScheduled"
                            && c["status"] == "False"
                            && c["reason"] == "Unschedulable"
                    })
                });
        (running.len() == 2 && unschedulable).then(|| last.clone())
    })
    .unwrap_or_else(|| {
        panic!(
            "want 2 Running and 1 unschedulable: running {:?}, pending {:?}\n{}",
            names(&last.0),
            last.1.iter().map(|p| &p["status"]).collect::<Vec<_>>(),
            kn.logs()
        )
    });
    let message = pending[0]["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "PodScheduled")
        .unwrap()["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        message.contains("cannot allocate all claims"),
        "scheduler's reason: {message}"
    );
    // Two claims of 10 GiB booked on the one GPU, nothing for the Pending one.
    let uuid = node.uuid(0);
    let booked = bookings(&node);
    assert_eq!(booked.len(), 2, "{booked:?}");
    assert!(
        booked
            .iter()
            .all(|(_, u, m, _)| *u == uuid && *m == 10 * GIB),
        "{booked:?}"
    );

    // Scaling to 2 removes the Pending pod; the Running ones keep their slices.
    kn.cluster
        .kubectl(&["scale", "deployment", "sliced", "-n", NS, "--replicas=2"]);
    wait("the Pending replica to go", || {
        let (r, p) = replicas(&kn, "sliced");
        let all = kn.cluster.get_json(&["pods", "-n", NS, "-l", "app=sliced"]);
        (p.is_empty() && r.len() == 2 && all["items"].as_array().map(Vec::len) == Some(2))
            .then_some(())
    });
    let (after, _) = replicas(&kn, "sliced");
    assert_eq!(names(&after), names(&running));
    assert_eq!(bookings(&node), booked, "scaling to 2 changed the bookings");
    // The two slices' claims are still prepared on this node.
    for p in &after {
        let claim = claim_of(&kn, p);
        assert_eq!(
            claim["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]["memory"],
            "10Gi",
            "{claim}"
        );
    }
    kn.cluster.down();
    assert!(node.reservations().is_empty(), "{:?}", node.reservations());
}

#[test]
fn runtime_class_and_annotations_through_kubelet_and_containerd_2() {
    let _s = lock(&[Resource::KubeNode]);
    let node = l4_node();
    let mut kn = KubeNode::up(NODE, &node);
    let mut spec = pod_spec(SLICE_CHECKS, None);
    spec["runtimeClassName"] = json!("gpuslice");
    kn.cluster
        .create(&json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "annotated", "namespace": NS, "annotations": {
                "gpuslice.io/memory": "4Gi", "gpuslice.io/cores": "30",
            }},
            "spec": spec,
        }))
        .unwrap();
    let p = kn.wait_running("annotated");
    let log = kn.wait_log("annotated", "READY");
    let cid = p["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .and_then(|c| c.strip_prefix("containerd://"))
        .unwrap_or_else(|| panic!("no containerd id: {}", p["status"]))
        .to_string();
    assert_slice_view(&node, &log, &cid);

    kn.delete_pod("annotated");
    wait("the annotation slice to be released", || {
        node.reservations().is_empty().then_some(())
    });
    assert!(node.leftovers().is_empty(), "{:?}", node.leftovers());

    // `configure containerd --remove` gives back the config the harness wrote.
    let config = std::path::PathBuf::from(kn.env("CONTAINERD_CONFIG"));
    let base = std::fs::read_to_string(config.with_file_name("config.base.toml")).unwrap();
    let configured = std::fs::read_to_string(&config).unwrap();
    assert_ne!(configured, base, "gpuslice did not register itself");
    let drop_in = config.with_file_name("conf.d/gpuslice.toml");
    let drop_in_text =
        std::fs::read_to_string(&drop_in).unwrap_or_else(|e| panic!("{}: {e}", drop_in.display()));
    assert!(drop_in_text.contains("version = 3"), "{drop_in_text}");
    let out = node.gpuslice(&[
        "configure",
        "containerd",
        "--remove",
        "--config-path",
        &config.display().to_string(),
    ]);
    assert!(
        out.status.success(),
        "configure --remove: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&config).unwrap(), base);
    assert!(!drop_in.exists(), "{} left behind", drop_in.display());
    kn.cluster.down();
}

#[test]
fn plugin_and_kubelet_restarts_lose_nothing() {
    let _s = lock(&[Resource::KubeNode]);
    let node = l4_node();
    let mut kn = KubeNode::up(NODE, &node);
    kn.cluster
        .create(&claim_template("slice-10g-30", "10Gi", "30"))
        .unwrap();
    kn.cluster
        .create(&pod("kept", CLAIM_CHECKS, Some("slice-10g-30")))
        .unwrap();
    let p = kn.wait_running("kept");
    let log = kn.wait_log("kept", "READY");
    let id = assert_claim_view(&kn, &node, &p, &log);
    let claim = claim_of(&kn, &p);
    let cid = p["status"]["containerStatuses"][0]["containerID"].clone();
    let booked = bookings(&node);
    kn.wait_registered(1);

    // Each restart ends with the kubelet registering the plugin's own socket again (the
    // plugin's new socket, or the restarted kubelet's walk of its plugin directory).
    for (times, component) in [(2, "gpuslice-kubelet-plugin"), (3, "kubelet")] {
        kn.restart(component);
        kn.wait_registered(times);
        kn.wait_ready();
        let p = kn.wait_running("kept");
        assert_eq!(
            p["status"]["containerStatuses"][0]["containerID"], cid,
            "after restarting {component}: {}",
            p["status"]
        );
        assert_eq!(
            p["status"]["containerStatuses"][0]["restartCount"], 0,
            "after restarting {component}"
        );
        assert_eq!(bookings(&node), booked, "after restarting {component}");
        let now = claim_of(&kn, &p);
        assert_eq!(now["metadata"]["uid"], claim["metadata"]["uid"]);
        assert_eq!(
            now["status"]["allocation"], claim["status"]["allocation"],
            "after restarting {component}"
        );
    }
    assert!(node.reservations().iter().any(|r| r["id"] == id.as_str()));

    kn.delete_pod("kept");
    assert_released(&kn, &node, &claim);
    kn.cluster.down();
}

/// A ResourceClaimTemplate asking `slots` slots of one GPU of the class `slots.gpuslice.io`,
/// with a compute share `cores` (opaque parameters) when given.
fn slot_template(name: &str, slots: u32, cores: Option<u32>) -> Value {
    let mut devices = json!({
        "requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "slots.gpuslice.io", "count": slots,
        }}],
        "constraints": [{"requests": ["gpu"], "matchAttribute": "gpuslice.io/uuid"}],
    });
    if let Some(c) = cores {
        devices["config"] = json!([{"requests": ["gpu"], "opaque": {
            "driver": "gpuslice.io",
            "parameters": {"apiVersion": "gpuslice.io/v1", "kind": "SliceParameters", "cores": c},
        }}]);
    }
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"spec": {"devices": devices}},
    })
}

/// The bytes of one slot of the 24 GiB L4 at the default `dra.slots_per_gpu`.
const L4_SLOT: u64 = (24 * GIB / gpuslice_config::DEFAULT_SLOTS_PER_GPU as u64) >> 20 << 20;

/// Checks what a container holding `slots` slots of the L4 saw: its allocation, its limits, the probe refused past them, and its booking.
fn assert_slot_view(kn: &KubeNode, node: &TestNode, p: &Value, slots: u64, cores: Option<u64>) {
    let claim = claim_of(kn, p);
    let results = claim["status"]["allocation"]["devices"]["results"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(results.len() as u64, slots, "{claim}");
    assert!(
        results.iter().all(|r| r["pool"] == NODE
            && r["device"]
                .as_str()
                .is_some_and(|d| d.starts_with("gpu-0-slot-"))
            && r.get("consumedCapacity").is_none()),
        "{claim}"
    );
    let name = p["metadata"]["name"].as_str().unwrap();
    let log = kn.wait_log(name, "READY");
    let limits: Value = serde_json::from_str(line(&log, "limits=")).expect("limits JSON");
    let device = &limits["devices"][0];
    assert_eq!(device["uuid"], node.uuid(0), "{log}");
    assert_eq!(device["memory_limit"], slots * L4_SLOT, "{log}");
    if let Some(c) = cores {
        assert_eq!(device["cores"], c, "{log}");
    }
    let report: Value = log
        .lines()
        .find_map(|l| {
            serde_json::from_str::<Value>(l)
                .ok()
                .filter(|v| v["cmd"] == "alloc")
        })
        .unwrap_or_else(|| panic!("no alloc report from the probe: {log}"));
    assert_eq!(report["total"], slots * L4_SLOT, "{report}");
    assert_eq!(report["error"], "CUDA_ERROR_OUT_OF_MEMORY", "{report}");
    let uid = claim["metadata"]["uid"].as_str().unwrap();
    let booked: Vec<u64> = claim_reservations(node)
        .iter()
        .filter(|r| r["owner"]["claim_uid"] == uid)
        .flat_map(|r| r["gpus"].as_array().cloned().unwrap_or_default())
        .map(|g| g["memory"].as_u64().unwrap())
        .collect();
    assert_eq!(booked, [slots * L4_SLOT], "{:?}", node.reservations());
}

/// The node's claim reservation of claim `claim`, by its UID.
fn reservation_of(node: &TestNode, claim: &Value) -> Value {
    let uid = claim["metadata"]["uid"].as_str().unwrap();
    claim_reservations(node)
        .into_iter()
        .find(|r| r["owner"]["claim_uid"] == uid)
        .unwrap_or_else(|| panic!("claim {uid} is not booked: {:?}", node.reservations()))
}

/// What the probe reports allocating 1 GiB chunks inside pod `name` now (`kubectl exec`).
fn exec_probe(kn: &KubeNode, name: &str) -> Value {
    let out = kn.exec(
        name,
        &[
            "gpuslice-probe",
            "--json",
            "alloc",
            "--chunk",
            "1Gi",
            "--max",
            "20Gi",
        ],
    );
    out.lines()
        .find_map(|l| {
            serde_json::from_str::<Value>(l)
                .ok()
                .filter(|v| v["cmd"] == "alloc")
        })
        .unwrap_or_else(|| panic!("no alloc report from the probe in {name}: {out}"))
}

/// The devices of the node's gpuslice ResourceSlices: (name, memory capacity if any).
fn published(kn: &KubeNode) -> Vec<(String, Option<String>)> {
    let slices = kn.cluster.get_json(&["resourceslices"]);
    slices["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["spec"]["nodeName"] == NODE && s["spec"]["driver"] == "gpuslice.io")
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .map(|d| {
            (
                d["name"].as_str().unwrap_or_default().to_string(),
                d["capacity"]["memory"]["value"]
                    .as_str()
                    .map(str::to_string),
            )
        })
        .collect()
}

/// The exporter's memory limit and compute share of reservation `id` on the node's GPU 0.
fn exported(series: &[Series], node: &TestNode, id: &str) -> (Option<f64>, Option<f64>) {
    let uuid = node.uuid(0);
    let want = [("reservation", id), ("uuid", uuid.as_str())];
    (
        value(series, "gpuslice_slice_memory_limit_bytes", &want),
        value(series, "gpuslice_slice_compute_limit_ratio", &want),
    )
}

#[test]
fn with_consumable_capacity_off_slot_claims_run_with_their_limits_and_a_third_waits() {
    let _s = lock(&[Resource::KubeNode]);
    let node = l4_node();
    let mut kn = KubeNode::up_with(
        NODE,
        &node,
        &["--feature-gates", "DRAConsumableCapacity=false"],
    );
    let plugin_log = kn.log_tail("gpuslice-kubelet-plugin", 200);
    assert!(
        plugin_log.contains(&format!(
            "publishing in slot mode ({} slot devices per GPU)",
            gpuslice_config::DEFAULT_SLOTS_PER_GPU
        )),
        "{plugin_log}"
    );
    // 2 + 2 of the L4's 6 slots run; 3 more do not fit the 2 left.
    kn.cluster
        .create(&slot_template("slots-2-cores-20", 2, Some(20)))
        .unwrap();
    kn.cluster
        .create(&slot_template("slots-2", 2, None))
        .unwrap();
    kn.cluster
        .create(&slot_template("slots-3", 3, None))
        .unwrap();
    for (name, template) in [("a", "slots-2-cores-20"), ("b", "slots-2")] {
        kn.cluster
            .create(&pod(name, CLAIM_CHECKS, Some(template)))
            .unwrap();
    }
    let a = kn.wait_running("a");
    let b = kn.wait_running("b");
    assert_slot_view(&kn, &node, &a, 2, Some(20));
    assert_slot_view(&kn, &node, &b, 2, None);

    // The exporter shows each slot claim's slice with its per-GPU limit, and the share a asked.
    let ra = reservation_of(&node, &claim_of(&kn, &a))["id"]
        .as_str()
        .unwrap()
        .to_string();
    let rb = reservation_of(&node, &claim_of(&kn, &b))["id"]
        .as_str()
        .unwrap()
        .to_string();
    let exporter = Exporter::start(&node);
    let series = exporter.scrape();
    assert_eq!(
        exported(&series, &node, &ra),
        (Some((2 * L4_SLOT) as f64), Some(0.2)),
        "{}",
        exporter.text()
    );
    assert_eq!(
        exported(&series, &node, &rb),
        (Some((2 * L4_SLOT) as f64), None),
        "{}",
        exporter.text()
    );
    drop(exporter);

    kn.cluster
        .create(&pod("c", CLAIM_CHECKS, Some("slots-3")))
        .unwrap();
    let message = kn.wait_unschedulable("c");
    assert!(
        message.contains("cannot allocate all claims"),
        "scheduler's reason: {message}"
    );
    assert_eq!(
        claim_reservations(&node).len(),
        2,
        "{:?}",
        node.reservations()
    );

    // Deleting a releases its booking and its slots: c runs with them.
    let claim_a = claim_of(&kn, &a);
    kn.delete_pod("a");
    let c = kn.wait_running("c");
    assert_slot_view(&kn, &node, &c, 3, None);
    let uid_a = claim_a["metadata"]["uid"].as_str().unwrap();
    assert!(
        claim_reservations(&node)
            .iter()
            .all(|r| r["owner"]["claim_uid"] != uid_a),
        "{:?}",
        node.reservations()
    );

    upgrade_to_capacity_mode(&mut kn, &node, &[("b", 2), ("c", 3)]);
    kn.cluster.down();
}

/// The cluster upgrades under running slot claims (`running`: pod, slots): the control plane
/// and the kubelet restarted with the release's default gates (consumable capacity on), then
/// the plugin. The plugin now publishes in capacity mode; the running pods keep their slices
/// (same containers, bookings, limits file, the probe still refused past them) and what they
/// book stays unavailable to capacity claims; a capacity claim runs on the rest; deleting a
/// slot pod releases its booking, which a waiting capacity claim then gets.
fn upgrade_to_capacity_mode(kn: &mut KubeNode, node: &TestNode, running: &[(&str, u64)]) {
    let before: Vec<(Value, Value, String)> = running
        .iter()
        .map(|(name, _)| {
            let p = kn.pod(name).unwrap();
            let claim = claim_of(kn, &p);
            let limits = kn.exec(name, &["cat", "/run/gpuslice/limits.json"]);
            (p, reservation_of(node, &claim), limits)
        })
        .collect();
    let slots: u64 = running.iter().map(|(_, k)| k).sum();

    kn.restart_cluster(&[]);
    assert_eq!(kn.env.get("FEATURE_GATES"), None, "{:?}", kn.env);
    let plugin_log = kn.log_tail("gpuslice-kubelet-plugin", 400);
    assert!(
        plugin_log.contains("publishing in capacity mode (one shared device per GPU): the API server keeps consumable capacity"),
        "{plugin_log}"
    );
    let status = node.gpuslice(&["status", "--json"]);
    let status: Value = serde_json::from_slice(&status.stdout).expect("status --json");
    assert_eq!(status["dra"]["mode"], "capacity", "{}", status["dra"]);
    // One shared device offering what the slot claims do not hold.
    let free = 24 * GIB - slots * L4_SLOT;
    let want = vec![(
        "gpu-0".to_string(),
        Some(gpuslice_config::format_kube_quantity(free)),
    )];
    let mut last = Vec::new();
    wait_for_or(STEP, || {
        last = published(kn);
        (last == want).then_some(())
    })
    .unwrap_or_else(|| panic!("published {last:?}, want {want:?}\n{}", kn.logs()));

    for ((name, k), (p, booking, limits)) in running.iter().zip(&before) {
        let now = kn.wait_running(name);
        assert_eq!(
            now["status"]["containerStatuses"][0]["containerID"],
            p["status"]["containerStatuses"][0]["containerID"],
            "{name} after the upgrade: {}",
            now["status"]
        );
        assert_eq!(now["status"]["containerStatuses"][0]["restartCount"], 0);
        assert_eq!(&reservation_of(node, &claim_of(kn, &now)), booking);
        assert_eq!(
            &kn.exec(name, &["cat", "/run/gpuslice/limits.json"]),
            limits,
            "{name}'s limits file changed"
        );
        let report = exec_probe(kn, name);
        assert_eq!(report["total"], k * L4_SLOT, "{name}: {report}");
        assert_eq!(report["error"], "CUDA_ERROR_OUT_OF_MEMORY", "{report}");
    }

    // A capacity claim fits what is left (4 GiB); one of 5 GiB does not, until a slot pod goes.
    kn.cluster
        .create(&claim_template("slice-3g", "3Gi", "0"))
        .unwrap();
    kn.cluster
        .create(&claim_template("slice-5g", "5Gi", "0"))
        .unwrap();
    kn.cluster
        .create(&pod("d", CLAIM_CHECKS, Some("slice-3g")))
        .unwrap();
    let d = kn.wait_running("d");
    let claim_d = claim_of(kn, &d);
    assert_eq!(
        claim_d["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]["memory"],
        "3Gi",
        "{claim_d}"
    );
    let log = kn.wait_log("d", "READY");
    let limits: Value = serde_json::from_str(line(&log, "limits=")).expect("limits JSON");
    assert_eq!(limits["devices"][0]["memory_limit"], 3 * GIB, "{log}");
    kn.cluster
        .create(&pod("e", CLAIM_CHECKS, Some("slice-5g")))
        .unwrap();
    let message = kn.wait_unschedulable("e");
    assert!(
        message.contains("cannot allocate all claims"),
        "scheduler's reason: {message}"
    );

    let (first, _) = running[0];
    let claim_first = claim_of(kn, &before[0].0);
    kn.delete_pod(first);
    let uid = claim_first["metadata"]["uid"].as_str().unwrap();
    wait_for_or(STEP, || {
        claim_reservations(node)
            .iter()
            .all(|r| r["owner"]["claim_uid"] != uid)
            .then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "{first}'s slots are still booked: {:?}",
            node.reservations()
        )
    });
    let e = kn.wait_running("e");
    let claim_e = claim_of(kn, &e);
    let mut claims = vec![claim_d, claim_e];
    for (name, _) in &running[1..] {
        claims.push(claim_of(kn, &kn.pod(name).unwrap()));
        kn.delete_pod(name);
    }
    kn.delete_pod("d");
    kn.delete_pod("e");
    for claim in &claims {
        assert_released(kn, node, claim);
    }
}
