//! Namespace budgets hold on a real control plane and a real node (`up DIR --node NAME
//! --webhook`): a ResourceQuota naming `limits.gpuslice.io/memory` (or, in a HAMi-compat
//! namespace, HAMi's `limits.nvidia.com/gpumem` in MiB) is enforced by the webhook for pods
//! created concurrently (once the webhook has counted the new quota) and for claims written by
//! hand, with one line naming the quota, and for the claim the scheduler writes for a pod of
//! the device class's extended resource; what a deleted pod held is freed; a claim nested past
//! the JSON parser's limit is charged and does not stop the recount; a quota cannot hold a
//! value the webhook could not read (docs/quotas.md).

use std::time::Duration;

use gpuslice_e2e::kube::wait_for;
use gpuslice_e2e::kube_node::{pod_spec, KubeNode};
use gpuslice_e2e::{lock, Resource, TestNode};
use serde_json::{json, Value};

const STEP: Duration = Duration::from_secs(120);

/// One budget case: a namespace, its quota's name and hard value, the limits of a 2Gi pod
/// and of a 4Gi one, and how the quota writes 6Gi used.
struct Case {
    ns: &'static str,
    hami: bool,
    name: &'static str,
    hard: &'static str,
    small: Value,
    big: Value,
    six: &'static str,
}

fn budget_pod(ns: &str, name: &str, limits: &Value) -> Value {
    let mut spec = pod_spec("trap 'exit 0' TERM; sleep 3600 & wait", None);
    spec["containers"][0]["resources"] = json!({ "limits": limits });
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": ns}, "spec": spec})
}

fn used(kn: &KubeNode, ns: &str, name: &str) -> Option<String> {
    kn.cluster.get_json(&["resourcequota", "gpu", "-n", ns])["status"]["used"][name]
        .as_str()
        .map(str::to_string)
}

fn wait_running(kn: &KubeNode, ns: &str, name: &str) {
    wait_for(&format!("pod {ns}/{name} to run"), STEP, || {
        let p = kn.cluster.get_json(&["pod", name, "-n", ns]);
        (p["status"]["phase"] == "Running").then_some(())
    });
}

#[test]
#[ignore = "starts a real Kubernetes node and the webhook; the README's test command runs it"]
fn budgets_hold_for_concurrent_pods_and_claims_on_a_real_node() {
    let _s = lock(&[Resource::KubeNode]);
    let node = TestNode::with_models(&[("NVIDIA A100-SXM4-80GB", "40Gi")]);
    let kn = KubeNode::up_with("gpu-node", &node, &["--webhook"]);
    extended_resource_pods_are_charged_the_whole_gpu(&kn, &node);
    let cases = [
        Case {
            ns: "budget",
            hami: false,
            name: "limits.gpuslice.io/memory",
            hard: "10Gi",
            small: json!({"gpuslice.io/memory": "2Gi"}),
            big: json!({"gpuslice.io/memory": "4Gi"}),
            six: "6Gi",
        },
        Case {
            ns: "hami-budget",
            hami: true,
            name: "limits.nvidia.com/gpumem",
            hard: "10240",
            small: json!({"nvidia.com/gpumem": "2048"}),
            big: json!({"nvidia.com/gpumem": "4096"}),
            six: "6144",
        },
    ];
    for case in &cases {
        let ns = case.ns;
        kn.cluster.kubectl(&["create", "namespace", ns]);
        if case.hami {
            kn.cluster
                .kubectl(&["label", "namespace", ns, "gpuslice.io/hami-compat=true"]);
        }
        kn.cluster
            .create(&json!({"apiVersion": "v1", "kind": "ResourceQuota",
                "metadata": {"name": "gpu", "namespace": ns},
                "spec": {"hard": {case.name: case.hard}}}))
            .unwrap();
        // A new quota books nothing until the webhook's recount has counted what runs (here
        // nothing: 0); until then its pods are refused "status unknown for quota".
        wait_for(&format!("{ns}'s new quota to be counted"), STEP, || {
            (used(&kn, ns, case.name).as_deref() == Some("0")).then_some(())
        });

        // 8 pods of 2Gi at once against 10Gi: 5 admitted, 3 refused naming the quota.
        let answers: Vec<(String, Result<(), String>)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|i| {
                    let name = format!("p{i}");
                    let pod = budget_pod(ns, &name, &case.small);
                    let cluster = &kn.cluster;
                    s.spawn(move || (name, cluster.create(&pod)))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let admitted: Vec<&String> = answers
            .iter()
            .filter(|(_, r)| r.is_ok())
            .map(|(n, _)| n)
            .collect();
        assert_eq!(admitted.len(), 5, "{ns}: {answers:?}");
        for (_, r) in &answers {
            if let Err(e) = r {
                assert!(
                    e.contains(&format!("exceeded quota: {ns}/gpu"))
                        && e.contains(&format!("limited: {}={}", case.name, case.hard)),
                    "{ns}: {e}"
                );
            }
        }
        for name in &admitted {
            wait_running(&kn, ns, name);
        }
        assert_eq!(used(&kn, ns, case.name).as_deref(), Some(case.hard), "{ns}");

        // A claim written by hand for 4Gi: refused, naming the quota.
        let claim = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "by-hand", "namespace": ns},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpuslice.io",
                "capacity": {"requests": {"memory": "4Gi"}}}}]}}});
        let e = kn.cluster.create(&claim).unwrap_err();
        assert!(
            e.contains(&format!("exceeded quota: {ns}/gpu")),
            "{ns}: {e}"
        );
        assert_eq!(e.trim().lines().count(), 1, "{ns}: one line: {e}");

        if !case.hami {
            // Opaque parameters (another driver's) nested past the JSON parser's recursion
            // limit, which the API server accepts: the claim is still charged as its devices
            // ask (8 whole GPUs, refused), never admitted uncharged; one of another class is
            // stored, and the recount below still reads its namespace.
            let deep = |name: &str, class: &str, count: u32| {
                let mut parameters = json!(1);
                for _ in 0..200 {
                    parameters = json!({ "a": parameters });
                }
                json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                    "metadata": {"name": name, "namespace": ns},
                    "spec": {"devices": {
                        "requests": [{"name": "g", "exactly": {
                            "deviceClassName": class, "count": count}}],
                        "config": [{"opaque": {"driver": "example.com",
                            "parameters": parameters}}]}}})
            };
            let e = kn
                .cluster
                .create(&deep("deep", "gpuslice.io", 8))
                .unwrap_err();
            assert!(
                e.contains(&format!("exceeded quota: {ns}/gpu")),
                "{ns}: {e}"
            );
            kn.cluster
                .create(&deep("deep-other", "other.example.com", 1))
                .unwrap_or_else(|e| panic!("{ns}: a deep claim of another class: {e}"));
        }

        // Two pods deleted: their 4Gi freed, and a 4Gi pod admitted.
        for name in &admitted[..2] {
            kn.cluster
                .kubectl(&["delete", "pod", name, "-n", ns, "--wait=true"]);
        }
        wait_for(&format!("{ns}'s quota to free two pods"), STEP, || {
            (used(&kn, ns, case.name).as_deref() == Some(case.six)).then_some(())
        });
        kn.cluster
            .create(&budget_pod(ns, "big", &case.big))
            .unwrap_or_else(|e| panic!("{ns}: the 4Gi pod after freeing: {e}"));
        wait_running(&kn, ns, "big");
        assert_eq!(used(&kn, ns, case.name).as_deref(), Some(case.hard), "{ns}");
    }

    // A fractional or negative value cannot be stored for these names (the API server holds
    // extended resources' quotas to whole numbers): the webhook's own refusal of such values
    // (kube/api/src/quota.rs) is a second line that a quota never reaches.
    kn.cluster.kubectl(&["create", "namespace", "bad-quota"]);
    for bad in ["1500m", "-1"] {
        let e = kn
            .cluster
            .create(&json!({"apiVersion": "v1", "kind": "ResourceQuota",
                "metadata": {"name": "gpu", "namespace": "bad-quota"},
                "spec": {"hard": {"limits.gpuslice.io/gpus": bad}}}))
            .unwrap_err();
        assert!(
            e.contains("spec.hard[limits.gpuslice.io/gpus]"),
            "{bad}: {e}"
        );
    }
}

/// The events of object `name` in `ns`, one per line.
fn events(kn: &KubeNode, ns: &str, name: &str) -> String {
    kn.cluster.kubectl(&[
        "get",
        "events",
        "-n",
        ns,
        "--field-selector",
        &format!("involvedObject.name={name}"),
        "-o",
        "custom-columns=REASON:.reason,MESSAGE:.message",
    ])
}

/// Kubernetes' implicit extended resource of gpuslice's device class
/// (`deviceclass.resource.kubernetes.io/gpuslice.io`, always on since 1.37): no webhook sees
/// the pod, the scheduler writes its claim itself as it binds it, a request of one device that
/// names no memory, which consumes the GPU's default: all of it. That claim is charged as any
/// claim not made from a template: past the budget the scheduler's create is refused naming
/// the quota and the pod waits unbound, nothing booked on the node; once the budget holds a
/// whole GPU the pod runs on it, and its deletion frees it.
fn extended_resource_pods_are_charged_the_whole_gpu(kn: &KubeNode, node: &TestNode) {
    let (ns, name, pod) = ("ext", "limits.gpuslice.io/memory", "whole");
    kn.cluster.kubectl(&["create", "namespace", ns]);
    kn.cluster
        .create(&json!({"apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": "gpu", "namespace": ns},
            "spec": {"hard": {name: "39Gi"}}}))
        .unwrap();
    wait_for(&format!("{ns}'s new quota to be counted"), STEP, || {
        (used(kn, ns, name).as_deref() == Some("0")).then_some(())
    });
    let limits = json!({"deviceclass.resource.kubernetes.io/gpuslice.io": "1"});
    kn.cluster
        .create(&budget_pod(ns, pod, &limits))
        .unwrap_or_else(|e| panic!("a pod of the device class's extended resource: {e}"));
    let refused = wait_for(
        "the scheduler's claim of the whole GPU refused past the budget",
        STEP,
        || {
            let ev = events(kn, ns, pod);
            ev.lines()
                .find(|l| l.contains("exceeded quota: ext/gpu"))
                .map(str::to_string)
        },
    );
    assert!(
        refused.contains("limited: limits.gpuslice.io/memory=39Gi"),
        "{refused}"
    );
    let p = kn.cluster.get_json(&["pod", pod, "-n", ns]);
    assert!(p["spec"]["nodeName"].is_null(), "{}", p["spec"]);
    assert!(node.reservations().is_empty(), "{:?}", node.reservations());

    kn.cluster.kubectl(&[
        "patch",
        "resourcequota",
        "gpu",
        "-n",
        ns,
        "--type",
        "merge",
        "-p",
        &json!({"spec": {"hard": {name: "40Gi"}}}).to_string(),
    ]);
    wait_running(kn, ns, pod);
    assert_eq!(used(kn, ns, name).as_deref(), Some("40Gi"));
    let booked = node.reservations();
    assert_eq!(booked.len(), 1, "{booked:?}");
    assert_eq!(booked[0]["gpus"][0]["memory"], 40u64 << 30, "{booked:?}");
    kn.cluster
        .kubectl(&["delete", "pod", pod, "-n", ns, "--wait=true"]);
    wait_for(&format!("{ns}'s quota to free the whole GPU"), STEP, || {
        (used(kn, ns, name).as_deref() == Some("0")).then_some(())
    });
    wait_for("the whole GPU's booking to be released", STEP, || {
        node.reservations().is_empty().then_some(())
    });
}
