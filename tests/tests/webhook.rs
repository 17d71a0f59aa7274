//! `scripts/kube-cluster.sh up DIR --webhook` runs `gpuslice webhook --hami-compat` against a
//! real control plane of the pinned release: container limits (gpuslice's own, and HAMi's in a
//! namespace labelled for it, HAMi's published examples unchanged) become claims the
//! scheduler allocates on distinct GPUs; dry runs create nothing; inexpressible requests are
//! refused with one line; with the webhook killed the API server refuses GPU pods (and only
//! those) until it is back. In the control-plane test the node is an object without a kubelet
//! and the slice is written by the test, as in kube_control_plane.rs; the pods tolerate its
//! taints. On a real node (kubelet, containerd 2.x, the kubelet plugin) HAMi's examples run
//! with the slice they ask; in slot mode (consumable capacity off, a real kubelet plugin
//! without a kubelet) the limits become slot claims the scheduler places.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use gpuslice_e2e::cri::image_archive_of;
use gpuslice_e2e::image::rootfs;
use gpuslice_e2e::kube::{wait_for, KubeCluster};
use gpuslice_e2e::kube_node::{wait_for_or, KubeNode};
use gpuslice_e2e::kubelet::claim as kubelet_claim;
use gpuslice_e2e::kubelet_plugin::{slice_of, KubeletPlugin};
use gpuslice_e2e::{lock, Resource, TestNode};
use serde_json::{json, Value};

const STEP: Duration = Duration::from_secs(90);
/// The namespace labelled for HAMi compatibility, and one that is not.
const HAMI_NS: &str = "hami";
const PLAIN_NS: &str = "plain";

/// A shared GPU of `node`'s slice: A100 80Gi, capacity mode.
fn device(index: u32) -> Value {
    json!({
        "name": format!("gpu-{index}"),
        "allowMultipleAllocations": true,
        "attributes": {
            "uuid": {"string": format!("GPU-00000000-0000-0000-0000-00000000000{index}")},
            "index": {"int": index},
            "productName": {"string": "NVIDIA A100-SXM4-80GB"},
        },
        "capacity": {
            "memory": {"value": "80Gi", "requestPolicy": {"default": "80Gi", "validRange": {"min": "1Mi", "step": "1Mi", "max": "80Gi"}}},
            "cores": {"value": "100", "requestPolicy": {"default": "0", "validRange": {"min": "0", "step": "1", "max": "100"}}},
        },
    })
}

fn pod(ns: &str, name: &str, limits: Value, annotations: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "annotations": annotations},
        "spec": {
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "main", "image": "gpuslice.invalid/never-pulled:1",
                            "resources": {"limits": limits}}],
        },
    })
}

fn templates(c: &KubeCluster) -> BTreeSet<String> {
    let mut all = BTreeSet::new();
    for ns in ["default", HAMI_NS, PLAIN_NS] {
        for t in c.get_json(&["resourceclaimtemplates", "-n", ns])["items"]
            .as_array()
            .unwrap()
        {
            all.insert(format!("{ns}/{}", t["metadata"]["name"].as_str().unwrap()));
        }
    }
    all
}

fn claims(c: &KubeCluster, ns: &str) -> Vec<Value> {
    c.get_json(&["resourceclaims", "-n", ns])["items"]
        .as_array()
        .unwrap()
        .clone()
}

/// The allocation results of pod `name`'s first claim, once the scheduler wrote them.
fn results(c: &KubeCluster, ns: &str, name: &str) -> Vec<Value> {
    c.wait_for(
        &format!("pod {ns}/{name}'s claim to be allocated"),
        STEP,
        || {
            let p = c.get_json(&["pod", name, "-n", ns]);
            let claim = p["status"]["resourceClaimStatuses"][0]["resourceClaimName"].as_str()?;
            let cl = c.get_json(&["resourceclaim", claim, "-n", ns]);
            cl["status"]["allocation"]["devices"]["results"]
                .as_array()
                .cloned()
        },
    )
}

fn devices(r: &[Value]) -> BTreeSet<String> {
    r.iter()
        .map(|x| x["device"].as_str().unwrap().to_string())
        .collect()
}

/// `kubectl apply --dry-run=server -f FILE -n NS -o json`: what the API server would store.
fn dry_run(c: &KubeCluster, ns: &str, file: &Path) -> Value {
    let out = c.kubectl(&[
        "apply",
        "--dry-run=server",
        "-n",
        ns,
        "-f",
        file.to_str().unwrap(),
        "-o",
        "json",
    ]);
    serde_json::from_str(&out).unwrap()
}

fn force_delete(c: &KubeCluster, ns: &str, what: &[&str]) {
    let mut args = vec![
        "delete",
        "-n",
        ns,
        "--grace-period=0",
        "--force",
        "--wait=false",
    ];
    args.extend_from_slice(what);
    let _ = c.kubectl_output(&args, None);
}

/// A pod's slice-request annotations are fixed at its creation (the ValidatingAdmissionPolicy
/// annotations.gpuslice.io, which `up … --webhook` applies as the chart does with the
/// webhook): the node reads them at each container's creation, long after the webhook saw the
/// pod, so adding, changing or removing one is refused by the API server, through the status
/// subresource too; other annotations, under gpuslice.io/ or not, and labels stay writable.
fn request_annotations_are_fixed_at_creation(c: &KubeCluster) {
    c.create(&pod("default", "fixed-plain", json!({}), json!({})))
        .unwrap();
    c.create(&pod(
        "default",
        "fixed-asked",
        json!({}),
        json!({"gpuslice.io/memory": "1Gi"}),
    ))
    .expect("a pod asking by annotation is admitted where no budget holds");
    let annotate = |name: &str, args: &[&str]| {
        let mut all = vec!["annotate", "--overwrite", "pod", "-n", "default", name];
        all.extend_from_slice(args);
        c.kubectl_output(&all, None)
    };
    wait_for(
        "the policy annotations.gpuslice.io to be enforced",
        STEP,
        || {
            let out = annotate("fixed-plain", &["--dry-run=server", "gpuslice.io/gpus=1"]);
            (!out.status.success()).then_some(())
        },
    );
    let refused = |what: &str, out: std::process::Output, parts: &[&str]| {
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what} was let through");
        for part in [
            "ValidatingAdmissionPolicy 'annotations.gpuslice.io'",
            "accepted: set gpuslice.io/<key> annotations when the pod is created; they cannot be added, changed or removed after",
        ]
        .iter()
        .chain(parts)
        {
            assert!(err.contains(part), "{what}: {part} not in {err}");
        }
    };
    for (name, args, parts) in [
        (
            "fixed-plain",
            &["gpuslice.io/gpus=1"][..],
            &["gpuslice.io/gpus added"][..],
        ),
        (
            "fixed-plain",
            &["gpuslice.io/memory.main=1Gi"],
            &["gpuslice.io/memory.main added"],
        ),
        (
            "fixed-plain",
            &["gpuslice.io/gpus=8", "gpuslice.io/memory=80Gi", "team=a"],
            &["gpuslice.io/gpus added", "gpuslice.io/memory added"],
        ),
        (
            "fixed-asked",
            &["gpuslice.io/memory=2Gi"],
            &["gpuslice.io/memory changed"],
        ),
        (
            "fixed-asked",
            &["gpuslice.io/memory-"],
            &["gpuslice.io/memory removed"],
        ),
        (
            "fixed-asked",
            &["gpuslice.io/cores.main=50"],
            &["gpuslice.io/cores.main added"],
        ),
    ] {
        refused(&format!("{name} {args:?}"), annotate(name, args), parts);
    }
    let status = c.kubectl_output(
        &[
            "patch",
            "pod",
            "-n",
            "default",
            "fixed-plain",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"metadata":{"annotations":{"gpuslice.io/gpus":"8"}}}"#,
        ],
        None,
    );
    refused(
        "the status subresource",
        status,
        &["gpuslice.io/gpus added"],
    );
    // Allowed: a request key set again to its value, other annotations, labels.
    for (name, args) in [
        ("fixed-asked", &["gpuslice.io/memory=1Gi"][..]),
        ("fixed-asked", &["gpuslice.io/note=x", "team=a"]),
        ("fixed-plain", &["gpuslice.io/note=x", "team=a"]),
        ("fixed-plain", &["gpuslice.io/note-", "team-"]),
    ] {
        let out = annotate(name, args);
        assert!(
            out.status.success(),
            "{name} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for name in ["fixed-plain", "fixed-asked"] {
        c.kubectl(&["label", "pod", "-n", "default", name, "app=fixed"]);
    }
    let annotations =
        |name: &str| c.get_json(&["pod", name, "-n", "default"])["metadata"]["annotations"].clone();
    assert_eq!(
        annotations("fixed-asked"),
        json!({"gpuslice.io/memory": "1Gi", "gpuslice.io/note": "x", "team": "a"})
    );
    let plain = annotations("fixed-plain");
    assert!(plain.as_object().is_none_or(|a| a.is_empty()), "{plain}");
    force_delete(c, "default", &["pod", "fixed-plain", "fixed-asked"]);
}

fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/hami")
        .join(name)
}

#[test]
#[ignore = "starts a real Kubernetes control plane and the webhook; the README's test command runs it"]
fn limits_become_claims_through_the_webhook_on_a_live_control_plane() {
    let _s = lock(&[]);
    let mut c = KubeCluster::up_with(&["--webhook"], &[]);
    let url = c.endpoints()["WEBHOOK_URL"].clone();
    assert!(url.starts_with("https://127.0.0.1:"), "WEBHOOK_URL={url}");
    c.add_node("node-a");
    c.kubectl(&[
        "apply",
        "-f",
        &format!(
            "{}/../packaging/kubernetes/dra/deviceclass.yaml",
            env!("CARGO_MANIFEST_DIR")
        ),
    ]);
    c.create(&json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "node-a-gpuslice.io"},
        "spec": {"driver": "gpuslice.io", "nodeName": "node-a",
                 "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
                 "devices": [device(0), device(1)]},
    }))
    .unwrap();
    for ns in [HAMI_NS, PLAIN_NS] {
        c.kubectl(&["create", "namespace", ns]);
    }
    c.kubectl(&[
        "label",
        "namespace",
        HAMI_NS,
        "gpuslice.io/hami-compat=true",
    ]);
    for ns in ["default", HAMI_NS, PLAIN_NS] {
        wait_for(&format!("namespace {ns}'s service account"), STEP, || {
            c.kubectl_output(&["get", "serviceaccount", "default", "-n", ns], None)
                .status
                .success()
                .then_some(())
        });
    }

    // The webhook reads the slices in the background: wait until it knows two GPUs a node.
    wait_for("the webhook to see node-a's two GPUs", STEP, || {
        let out = c.kubectl_output(
            &["create", "--dry-run=server", "-f", "-"],
            Some(
                pod(
                    "default",
                    "probe",
                    json!({"gpuslice.io/gpus": "3"}),
                    json!({}),
                )
                .to_string()
                .as_bytes(),
            ),
        );
        String::from_utf8_lossy(&out.stderr)
            .contains("at most 2 GPUs")
            .then_some(())
    });

    // HAMi's published examples, unchanged but for the image: in the labelled namespace the
    // webhook turns them into claims (dry run: the stored object, nothing created) ...
    for (file, gpus, capacity) in [
        (
            "default_use.yaml",
            2,
            json!({"requests": {"cores": "30", "memory": "3000Mi"}}),
        ),
        (
            "use_memory_fraction.yaml",
            2,
            json!({"requests": {"cores": "30", "memory": "40Gi"}}),
        ),
        ("specify_card_type_to_use.yaml", 2, Value::Null),
    ] {
        let before = templates(&c);
        let p = dry_run(&c, HAMI_NS, &fixture(file));
        assert_eq!(
            templates(&c),
            before,
            "{file}: a dry run created a template"
        );
        let limits = &p["spec"]["containers"][0]["resources"];
        assert!(
            limits["limits"].get("nvidia.com/gpu").is_none(),
            "{file}: HAMi's limits are left: {limits}"
        );
        assert_eq!(
            limits["claims"],
            json!([{"name": "gpuslice-c0"}]),
            "{file}: {p}"
        );
        let entry = &p["spec"]["resourceClaims"][0];
        assert_eq!(entry["name"], "gpuslice-c0", "{file}: {p}");
        assert!(entry["resourceClaimTemplateName"]
            .as_str()
            .is_some_and(|t| t.starts_with("gpuslice-")));
        // ... then for real: the pod's claim is allocated as HAMi would have sliced it, each
        // GPU of nvidia.com/gpu: 2 a different one.
        c.kubectl(&[
            "apply",
            "-n",
            HAMI_NS,
            "-f",
            fixture(file).to_str().unwrap(),
        ]);
        let t = entry["resourceClaimTemplateName"].as_str().unwrap();
        let tmpl = c.get_json(&["resourceclaimtemplate", t, "-n", HAMI_NS]);
        assert_eq!(
            tmpl["metadata"]["labels"]["app.kubernetes.io/managed-by"],
            "gpuslice-webhook"
        );
        let reqs = tmpl["spec"]["spec"]["devices"]["requests"]
            .as_array()
            .unwrap();
        assert_eq!(reqs.len(), gpus, "{file}: one request per GPU: {tmpl}");
        for r in reqs {
            assert_eq!(r["exactly"]["capacity"], capacity, "{file}: {tmpl}");
        }
        // The pod spec was not changed by anything but the webhook: its containers' claims
        // and the entry are all it gained; the pod gets bound only if the selection matches.
        let res = results(&c, HAMI_NS, "gpu-pod");
        assert_eq!(res.len(), 2, "{file}: {res:?}");
        assert_eq!(
            devices(&res).len(),
            2,
            "{file}: two GPUs, not one twice: {res:?}"
        );
        if let Some(cap) = capacity["requests"].as_object() {
            for r in &res {
                assert_eq!(
                    r["consumedCapacity"]["memory"], cap["memory"],
                    "{file}: {r}"
                );
            }
        }
        force_delete(&c, HAMI_NS, &["pod", "gpu-pod"]);
        // Deleting the pod leaves no claim behind (the claims controller removes it).
        wait_for(&format!("{file}'s claim to be removed"), STEP, || {
            claims(&c, HAMI_NS).is_empty().then_some(())
        });
    }
    // HAMi's Deployment example: its pod gets a 12000Mi, 30-core slice.
    c.kubectl(&[
        "apply",
        "-n",
        HAMI_NS,
        "-f",
        fixture("sglang_gpu_sharing.yaml").to_str().unwrap(),
    ]);
    let pod_name = wait_for("the Deployment's pod", STEP, || {
        let l = c.get_json(&["pods", "-n", HAMI_NS, "-l", "app=sglang-qwen"]);
        l["items"][0]["metadata"]["name"]
            .as_str()
            .map(str::to_string)
    });
    let res = results(&c, HAMI_NS, &pod_name);
    assert_eq!(
        res[0]["consumedCapacity"],
        json!({"memory": "12000Mi", "cores": "30"}),
        "{res:?}"
    );
    c.kubectl(&[
        "delete",
        "deployment",
        "sglang-qwen",
        "-n",
        HAMI_NS,
        "--wait=false",
    ]);
    force_delete(&c, HAMI_NS, &["pods", "-l", "app=sglang-qwen"]);

    // Outside the labelled namespace HAMi's names are left alone (another device plugin's).
    let p = dry_run(&c, PLAIN_NS, &fixture("default_use.yaml"));
    assert_eq!(
        p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"], "2",
        "{p}"
    );
    assert!(p["spec"]["resourceClaims"].is_null(), "{p}");

    // kubectl apply --dry-run=server of a pod of a new shape: the patch, and no template.
    let before = templates(&c);
    let out = c.kubectl_output(
        &["apply", "--dry-run=server", "-o", "json", "-f", "-"],
        Some(
            pod(
                "default",
                "dry",
                json!({"gpuslice.io/memory": "7Gi"}),
                json!({}),
            )
            .to_string()
            .as_bytes(),
        ),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let p: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(p["spec"]["resourceClaims"][0]["name"], "gpuslice-c0", "{p}");
    assert_eq!(templates(&c), before, "a dry run created a template");
    assert!(!c
        .kubectl_output(&["get", "pod", "dry", "-n", "default"], None)
        .status
        .success());

    // gpuslice's own limits: two pods whose shares do not fit one GPU get different GPUs.
    for name in ["big-a", "big-b"] {
        c.create(&pod(
            "default",
            name,
            json!({"gpuslice.io/memory": "50Gi", "gpuslice.io/cores": "40"}),
            json!({}),
        ))
        .unwrap();
    }
    let a = results(&c, "default", "big-a");
    let b = results(&c, "default", "big-b");
    assert_ne!(
        devices(&a),
        devices(&b),
        "50Gi + 50Gi on one 80Gi GPU: {a:?} {b:?}"
    );
    assert_eq!(
        a[0]["consumedCapacity"],
        json!({"memory": "50Gi", "cores": "40"})
    );
    force_delete(&c, "default", &["pod", "big-a", "big-b"]);
    wait_for("big-a's and big-b's claims to go", STEP, || {
        claims(&c, "default").is_empty().then_some(())
    });

    // A Deployment of 3 × 50Gi where two fit (one per GPU): two bound, one Pending with the
    // scheduler's reason; scaling down releases (the test deletes what a kubelet would).
    let deploy = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "fifty", "namespace": "default"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "fifty"}},
                 "template": {"metadata": {"labels": {"app": "fifty"}},
                              "spec": {"tolerations": [{"operator": "Exists"}],
                                       "containers": [{"name": "main", "image": "gpuslice.invalid/x:1",
                                                       "resources": {"limits": {"gpuslice.io/memory": "50Gi"}}}]}}},
    });
    c.create(&deploy).unwrap();
    let pending = c.wait_for(
        "two of three bound and one refused by the scheduler",
        STEP,
        || {
            let l = c.get_json(&["pods", "-n", "default", "-l", "app=fifty"]);
            let items = l["items"].as_array()?;
            let bound = items
                .iter()
                .filter(|p| p["spec"]["nodeName"].is_string())
                .count();
            let unsched: Vec<&Value> = items
                .iter()
                .filter(|p| {
                    p["status"]["conditions"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|c| c["type"] == "PodScheduled" && c["reason"] == "Unschedulable")
                })
                .collect();
            (items.len() == 3 && bound == 2 && unsched.len() == 1).then(|| unsched[0].clone())
        },
    );
    let why = pending["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "PodScheduled")
        .unwrap()["message"]
        .to_string();
    assert!(
        why.contains("claim"),
        "the scheduler's reason names the claims: {why}"
    );
    let templ: Vec<String> = templates(&c)
        .into_iter()
        .filter(|t| t.starts_with("default/"))
        .collect();
    c.kubectl(&[
        "scale",
        "deployment",
        "fifty",
        "-n",
        "default",
        "--replicas=1",
    ]);
    c.wait_for(
        "the scale-down to leave one pod and one claim",
        STEP,
        || {
            let l = c.get_json(&["pods", "-n", "default", "-l", "app=fifty"]);
            let items = l["items"].as_array()?.clone();
            for p in &items {
                if p["metadata"]["deletionTimestamp"].is_string() {
                    force_delete(&c, "default", &["pod", p["metadata"]["name"].as_str()?]);
                }
            }
            let live = items
                .iter()
                .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
                .count();
            (live == 1 && items.len() == 1 && claims(&c, "default").len() == 1).then_some(())
        },
    );
    assert_eq!(
        templates(&c)
            .into_iter()
            .filter(|t| t.starts_with("default/"))
            .collect::<Vec<_>>(),
        templ,
        "the replicas share one template per shape"
    );

    // Inexpressible or malformed: refused with one line naming field, value and what is
    // accepted; nothing is created.
    let before = templates(&c);
    let cases: Vec<(&str, Value, Value, &str)> = vec![
        ("default", json!({"gpuslice.io/gpus": "0"}), json!({}), "limits[gpuslice.io/gpus]: value \"0\" is not accepted (0 is out of range); expected a whole number of GPUs from 1 to 16"),
        ("default", json!({"gpuslice.io/gpus": "3"}), json!({}), "at most 2 GPUs: no node of the cluster has more"),
        ("default", json!({"gpuslice.io/memory": "100m"}), json!({}), "limits[gpuslice.io/memory]: value \"100m\" is not accepted"),
        ("default", json!({"gpuslice.io/memory": "100Gi"}), json!({}), "at most 80Gi per GPU"),
        ("default", json!({"gpuslice.io/cores": "101"}), json!({}), "percent from 1 to 100"),
        ("default", json!({"gpuslice.io/gpu-type": "1"}), json!({}), "gpuslice.io/gpu-type is not a gpuslice limit"),
        (HAMI_NS, json!({"nvidia.com/gpu": "1", "gpuslice.io/gpus": "1"}), json!({}), "both gpuslice.io/* and nvidia.com/*"),
        (HAMI_NS, json!({"nvidia.com/gpumem": "1Gi"}), json!({}), "a whole number of MiB per GPU"),
        (HAMI_NS, json!({"nvidia.com/gpumem": "10", "nvidia.com/gpumem-percentage": "10"}), json!({}), "not both"),
        (HAMI_NS, json!({"nvidia.com/gpucores": "150"}), json!({}), "percent from 0 to 100"),
        (HAMI_NS, json!({"nvidia.com/gpu": "1"}), json!({"nvidia.com/use-gpuuuid": "GPU-0"}), "metadata.annotations[nvidia.com/use-gpuuuid]: value \"GPU-0\""),
        (HAMI_NS, json!({"nvidia.com/gpu": "1"}), json!({"nvidia.com/use-gputype": "A100\"||true"}), "parts of GPU model names"),
        (HAMI_NS, json!({"nvidia.com/gpu": "3"}), json!({}), "limits[nvidia.com/gpu]: value \"3\""),
    ];
    for (i, (ns, limits, ann, want)) in cases.iter().enumerate() {
        let name = format!("bad-{i}");
        let err = c
            .create(&pod(ns, &name, limits.clone(), ann.clone()))
            .expect_err(&format!("{limits} {ann} was admitted"));
        assert!(err.contains(want), "{limits} {ann}: {err}");
        assert!(
            err.contains("admission webhook \"pods.gpuslice.io\" denied the request"),
            "{err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    }
    assert_eq!(templates(&c), before, "a refused pod created a template");
    for ns in ["default", HAMI_NS] {
        let pods = c.get_json(&["pods", "-n", ns]);
        assert!(
            !pods["items"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("bad-"))),
            "a refused pod exists"
        );
    }
    // A HAMi annotation with no equivalent: admitted, with a warning saying so.
    let out = c.kubectl_output(
        &["create", "--dry-run=server", "-f", "-"],
        Some(
            pod(
                HAMI_NS,
                "warned",
                json!({"nvidia.com/gpu": "1"}),
                json!({"hami.io/node-scheduler-policy": "binpack"}),
            )
            .to_string()
            .as_bytes(),
        ),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "Warning: metadata.annotations[hami.io/node-scheduler-policy]=\"binpack\" ignored"
        ),
        "{stderr}"
    );

    request_annotations_are_fixed_at_creation(&c);

    // The webhook killed: failurePolicy Fail refuses GPU pods (never admitted unchanged);
    // other pods never reach the webhook (matchConditions) and are created.
    let pid_file = c.dir().join("pids/gpuslice-webhook.pid");
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let cmdline: Vec<String> = std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap()
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    // A pod admitted just before the webhook went down: the resource claim controller (held
    // stopped until then) makes its claim while no webhook answers, as the registration does
    // not send the claims that controller makes for a pod (charged with the pod).
    let kcm = std::fs::read_to_string(c.dir().join("pids/kube-controller-manager.pid"))
        .unwrap()
        .trim()
        .to_string();
    signal(&kcm, "STOP");
    let admitted = c.create(&pod(
        "default",
        "admitted-before-down",
        json!({"gpuslice.io/gpus": "1"}),
        json!({}),
    ));
    kill_hard(pid);
    signal(&kcm, "CONT");
    admitted.expect("a GPU pod was refused with the webhook up");
    let made = wait_for(
        "the claim controller to make the admitted pod's claim",
        STEP,
        || {
            claims(&c, "default")
                .into_iter()
                .find(|cl| cl["metadata"]["ownerReferences"][0]["name"] == "admitted-before-down")
        },
    );
    let owner = made["metadata"]["ownerReferences"][0].clone();
    assert_eq!(owner["controller"], true, "{made}");
    // Anyone else's claim owned by a pod is still sent to the webhook: refused while it is down.
    let forged = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "forged-pod-claim", "namespace": "default",
                     "annotations": made["metadata"]["annotations"].clone(),
                     "ownerReferences": [owner]},
        "spec": made["spec"].clone(),
    });
    let err = c
        .create(&forged)
        .expect_err("a claim not made by the claim controller skipped the webhook");
    assert!(
        err.contains("failed calling webhook \"claims.gpuslice.io\""),
        "{err}"
    );
    force_delete(&c, "default", &["pod", "admitted-before-down"]);
    let err = c
        .create(&pod(
            "default",
            "while-down",
            json!({"gpuslice.io/gpus": "1"}),
            json!({}),
        ))
        .expect_err("a GPU pod was admitted with the webhook down");
    assert!(
        err.contains("failed calling webhook \"pods.gpuslice.io\""),
        "{err}"
    );
    c.create(&json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "plain-while-down", "namespace": "default"},
        "spec": {"containers": [{"name": "main", "image": "gpuslice.invalid/x:1"}]},
    }))
    .expect("a pod without GPU limits is not sent to the webhook");
    // A rank of a job naming a claim written by hand is sent too (the webhook keeps a job's
    // ranks one per node): refused while it is down; the same pod of no job is not sent, and
    // is created. A pod asking the node by annotation (gpuslice.io/<key> or
    // gpuslice.io/<key>.<container>) is sent, of a job or not (refused where a budget holds):
    // refused while it is down; one with another gpuslice.io/ annotation is not sent. So is
    // one asking a gpuslice class by the extended resource Kubernetes names after it (a rank
    // of one is kept apart), and not one asking another class's.
    for (labels, job) in [
        (json!({"gpuslice.io/job": "down"}), true),
        (json!({"app": "down"}), false),
    ] {
        let tag = if job { "rank" } else { "no-job" };
        let mut named = pod(
            "default",
            &format!("{tag}-named-claim"),
            json!({}),
            json!({}),
        );
        named["spec"]["resourceClaims"] =
            json!([{"name": "gpu", "resourceClaimName": "rank-claim-while-down"}]);
        named["spec"]["containers"][0]["resources"] = json!({"claims": [{"name": "gpu"}]});
        let annotated = pod(
            "default",
            &format!("{tag}-annotated"),
            json!({}),
            json!({"gpuslice.io/memory": "1Gi"}),
        );
        // A container's own key is a request too; another key under gpuslice.io/ is not.
        let per_container = pod(
            "default",
            &format!("{tag}-annotated-main"),
            json!({}),
            json!({"gpuslice.io/memory.main": "1Gi"}),
        );
        let noted = pod(
            "default",
            &format!("{tag}-noted"),
            json!({}),
            json!({"gpuslice.io/note": "x"}),
        );
        let extended = pod(
            "default",
            &format!("{tag}-extended"),
            json!({"deviceclass.resource.kubernetes.io/slots.gpuslice.io": "1"}),
            json!({}),
        );
        let other_extended = pod(
            "default",
            &format!("{tag}-other-extended"),
            json!({"deviceclass.resource.kubernetes.io/gpu.example.com": "1"}),
            json!({}),
        );
        for (mut p, sent) in [
            (named, job),
            (annotated, true),
            (per_container, true),
            (noted, false),
            (extended, true),
            (other_extended, false),
        ] {
            p["metadata"]["labels"] = labels.clone();
            let name = p["metadata"]["name"].as_str().unwrap().to_string();
            match c.create(&p) {
                Err(err) if sent => assert!(
                    err.contains("failed calling webhook \"pods.gpuslice.io\""),
                    "{name}: {err}"
                ),
                Ok(_) if !sent => force_delete(&c, "default", &["pod", &name]),
                other => panic!("{name} (sent to the webhook: {sent}): {other:?}"),
            }
        }
    }
    // Back: the same command line; GPU pods are admitted again.
    let log = std::fs::File::create(c.dir().join("logs/gpuslice-webhook-restarted.log")).unwrap();
    let mut child = Command::new(&cmdline[0])
        .args(&cmdline[1..])
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    std::fs::write(&pid_file, child.id().to_string()).unwrap();
    wait_for("the restarted webhook to admit a GPU pod", STEP, || {
        c.create(&pod(
            "default",
            "after",
            json!({"gpuslice.io/gpus": "1"}),
            json!({}),
        ))
        .ok()
    });
    let p = c.get_json(&["pod", "after", "-n", "default"]);
    assert!(p["spec"]["resourceClaims"].is_array(), "{p}");

    // A caller other than the API server (here the test, with the webhook's URL) names
    // kube-system: the webhook makes the template there with its own rights (the chart's
    // NetworkPolicy keeps pods out; docs/webhook.md), at most 16 per review ...
    let url = c.endpoints()["WEBHOOK_URL"].clone();
    let ca = c.dir().join("pki/ca.crt");
    let direct = review(
        &url,
        &ca,
        "kube-system",
        &pod(
            "kube-system",
            "direct",
            json!({"gpuslice.io/memory": "3Gi"}),
            json!({}),
        ),
        false,
    );
    assert_eq!(direct["response"]["allowed"], true, "{direct}");
    let in_kube_system = || {
        c.get_json(&["resourceclaimtemplates", "-n", "kube-system"])["items"]
            .as_array()
            .unwrap()
            .len()
    };
    assert_eq!(in_kube_system(), 1);
    let mut many = pod("default", "many", json!({}), json!({}));
    many["spec"]["containers"] = (1..=17)
        .map(|i| {
            json!({"name": format!("c{i}"), "image": "x",
                         "resources": {"limits": {"gpuslice.io/memory": format!("{i}Gi")}}})
        })
        .collect();
    let refused = review(&url, &ca, "default", &many, false);
    assert_eq!(refused["response"]["allowed"], false, "{refused}");
    let why = refused["response"]["status"]["message"].to_string();
    assert!(
        why.contains("ask for 17 different GPU slices") && why.contains("at most 16 per pod"),
        "{why}"
    );
    // ... and a webhook's sweep deletes the templates no pod names (here a second webhook
    // with a grace of 2 s): the kube-system one, those of the pods deleted above; the ones
    // live pods name stay, and a pod of a swept shape gets its template again.
    let named_now = || -> BTreeSet<String> {
        c.get_json(&["pods", "-A"])["items"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|p| {
                let ns = p["metadata"]["namespace"].as_str().unwrap().to_string();
                p["spec"]["resourceClaims"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(move |e| {
                        e["resourceClaimTemplateName"]
                            .as_str()
                            .map(|t| format!("{ns}/{t}"))
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let before = templates(&c);
    let named = named_now();
    assert!(
        before.iter().any(|t| !named.contains(t)),
        "no unused template to sweep: {before:?}"
    );
    assert!(named.iter().all(|t| before.contains(t)), "{named:?}");
    let mut sweeper = spawn_webhook(
        &c,
        &cmdline,
        &c.kubeconfig(),
        "127.0.0.1:0",
        &["--unused-template-grace", "2"],
    );
    // (A pod still going when the sweep began may go meanwhile: the names are read anew.)
    let named = c.wait_for("the sweep to delete the unused templates", STEP, || {
        let now = named_now();
        (templates(&c) == now && in_kube_system() == 0).then_some(now)
    });
    let _ = sweeper.kill();
    let _ = sweeper.wait();
    for t in &named {
        let (ns, name) = t.split_once('/').unwrap();
        let kept = c.get_json(&["resourceclaimtemplate", name, "-n", ns]);
        assert!(
            kept["metadata"]["annotations"]["gpuslice.io/unused-since"].is_null(),
            "{kept}"
        );
    }
    c.create(&pod(
        "default",
        "after-sweep",
        json!({"gpuslice.io/memory": "50Gi", "gpuslice.io/cores": "40"}),
        json!({}),
    ))
    .expect("a pod of a swept shape");
    let p = c.get_json(&["pod", "after-sweep", "-n", "default"]);
    let t = p["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
        .as_str()
        .unwrap();
    assert!(
        !named.contains(&format!("default/{t}")) && before.contains(&format!("default/{t}")),
        "big-a's shape: {t}"
    );
    c.get_json(&["resourceclaimtemplate", t, "-n", "default"]);

    // A webhook whose first read of the ResourceSlices fails (its credentials may not list
    // them) refuses every review, naming the cause, and is not ready; once a read succeeds it
    // admits.
    c.kubectl(&["create", "serviceaccount", "no-slices", "-n", "default"]);
    let token = c.kubectl(&["create", "token", "no-slices", "-n", "default"]);
    let admin: Value = serde_json::from_str(&c.kubectl(&[
        "config",
        "view",
        "--raw",
        "--minify",
        "--flatten",
        "-o",
        "json",
    ]))
    .unwrap();
    let restricted = c.dir().join("no-slices.kubeconfig");
    std::fs::write(
        &restricted,
        json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "c", "cluster": admin["clusters"][0]["cluster"]}],
            "users": [{"name": "u", "user": {"token": token.trim()}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        })
        .to_string(),
    )
    .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut blind = spawn_webhook(&c, &cmdline, &restricted, &addr, &[]);
    let base = format!("https://{addr}");
    let ready = || get(&format!("{base}/readyz"), &ca);
    let (code, body) = wait_for("the second webhook to answer", STEP, || {
        ready().filter(|(code, _)| *code != 0)
    });
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("has not read the cluster's ResourceSlices yet")
            && body.contains("forbidden"),
        "{body}"
    );
    let probe = pod(
        "default",
        "blind",
        json!({"gpuslice.io/memory": "1Gi"}),
        json!({}),
    );
    let answer = review(&format!("{base}/mutate"), &ca, "default", &probe, true);
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    assert!(
        answer["response"]["status"]["message"]
            .to_string()
            .contains("admits no GPU pod until it has"),
        "{answer}"
    );
    c.kubectl(&[
        "create",
        "clusterrole",
        "list-slices",
        "--verb=list",
        "--resource=resourceslices.resource.k8s.io",
        // The namespace's budgets (docs/quotas.md): a webhook that cannot read them refuses.
        "--resource=resourcequotas",
    ]);
    c.kubectl(&[
        "create",
        "clusterrolebinding",
        "no-slices-list",
        "--clusterrole=list-slices",
        "--serviceaccount=default:no-slices",
    ]);
    wait_for("the second webhook to read the slices", STEP, || {
        ready().filter(|(code, _)| *code == 200)
    });
    let answer = review(&format!("{base}/mutate"), &ca, "default", &probe, true);
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    let _ = blind.kill();
    let _ = blind.wait();

    c.down();
    let _ = child.wait();
}

/// Another `gpuslice webhook` with the certificate of `cmdline` (the cluster's), on `listen`
/// with `kubeconfig`, then `extra`; its output in the cluster's logs.
fn spawn_webhook(
    c: &KubeCluster,
    cmdline: &[String],
    kubeconfig: &Path,
    listen: &str,
    extra: &[&str],
) -> std::process::Child {
    let flag = |name: &str| {
        let i = cmdline.iter().position(|a| a == name).unwrap();
        cmdline[i + 1].clone()
    };
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(c.dir().join("logs/gpuslice-webhook-more.log"))
        .unwrap();
    Command::new(&cmdline[0])
        .args(["webhook", "--listen", listen, "--tls-cert"])
        .arg(flag("--tls-cert"))
        .arg("--tls-key")
        .arg(flag("--tls-key"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(extra)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// `GET url` over TLS trusting `ca`: (status, body); status 0 when nothing answered.
fn get(url: &str, ca: &Path) -> Option<(u16, String)> {
    let out = Command::new("curl")
        .args(["-s", "--max-time", "5", "-w", "\n%{http_code}", "--cacert"])
        .arg(ca)
        .arg(url)
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n')?;
    Some((code.trim().parse().unwrap_or(0), body.to_string()))
}

/// An AdmissionReview of creating `pod` in `namespace`, sent to `url` as the API server
/// would (but by anyone who can reach it); the webhook's answer.
fn review(url: &str, ca: &Path, namespace: &str, pod: &Value, dry_run: bool) -> Value {
    let body = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "e2e", "namespace": namespace, "operation": "CREATE",
                    "dryRun": dry_run, "object": pod},
    });
    let mut child = Command::new("curl")
        .args([
            "-s",
            "--max-time",
            "10",
            "-H",
            "Content-Type: application/json",
        ])
        .args(["--data-binary", "@-", "--cacert"])
        .arg(ca)
        .arg(url)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(body.to_string().as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{url}: not a review ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// `kill -SIG PID`.
fn signal(pid: &str, sig: &str) {
    let status = Command::new("kill")
        .args([&format!("-{sig}"), pid])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{sig} {pid}");
}

/// SIGKILL, as a crash would end the webhook.
fn kill_hard(pid: u32) {
    signal(&pid.to_string(), "KILL");
    wait_for("the webhook to exit", STEP, || {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
        stat.is_none_or(|s| s.contains(") Z ")).then_some(())
    });
}

/// The image HAMi's examples name on the real node: the test rootfs (busybox and glibc) with
/// stand-ins for the programs the examples run, which the image does not have. The stand-ins
/// are not those programs: each first prints the container's limits file and runs the probe
/// through the shim (`gpuslice-hami-standin`), then `bash` (HAMi's Pod examples run
/// `bash -c …`) runs the example's own command with `sh`, and `python3` (the sglang
/// Deployment runs `python3 -m sglang.launch_server …`) ignores its arguments and serves the
/// example's readinessProbe (`GET /health` on port 30000) with busybox's httpd, staying up as
/// the server would. The manifests themselves are HAMi's, with only the image replaced.
const HAMI_IMAGE: &str = "localhost/gpuslice-hami-e2e:1";
/// The probe allocates up to 64Gi, more than any GPU of the test node: it stops only when the
/// slice (or the GPU) refuses.
const STANDIN: &str = "#!/bin/sh\n\
    echo limits=$(cat /run/gpuslice/limits.json)\n\
    gpuslice-probe --json alloc --chunk 512Mi --max 64Gi; echo EXIT $?\n\
    echo READY\n";
/// The stand-ins run their long-lived part in the background and end it on SIGTERM, so that a
/// deleted pod stops at once (a process 1 without a handler ignores SIGTERM, and the kubelet
/// would wait out the 30 s grace period).
const BASH: &str = "#!/bin/sh\n\
    gpuslice-hami-standin\n\
    /bin/sh \"$@\" &\n\
    trap 'kill $! 2>/dev/null; exit 0' TERM\n\
    wait $!\n";
const PYTHON3: &str = "#!/bin/sh\n\
    gpuslice-hami-standin\n\
    mkdir -p /tmp/www && echo ok > /tmp/www/health\n\
    httpd -f -p 30000 -h /tmp/www &\n\
    trap 'kill $! 2>/dev/null; exit 0' TERM\n\
    wait $!\n";

fn hami_image(dir: &Path) -> std::path::PathBuf {
    let root = dir.join("hami-rootfs");
    let st = Command::new("cp")
        .arg("-a")
        .arg(rootfs())
        .arg(&root)
        .status()
        .unwrap();
    assert!(st.success());
    std::fs::create_dir_all(root.join("usr/local/bin")).unwrap();
    for (path, text) in [
        ("bin/bash", BASH),
        ("usr/bin/python3", PYTHON3),
        ("usr/local/bin/gpuslice-hami-standin", STANDIN),
    ] {
        let file = root.join(path);
        let _ = std::fs::remove_file(&file);
        std::fs::write(&file, text).unwrap();
        std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
    }
    std::fs::copy(
        gpuslice_e2e::node::probe(),
        root.join("usr/local/bin/gpuslice-probe"),
    )
    .unwrap();
    image_archive_of(&root, dir, HAMI_IMAGE, &["sh"])
}

/// What a stand-in printed: the container's limits file and the probe's alloc report.
fn standin_report(log: &str) -> (Value, Value) {
    let limits: Value = serde_json::from_str(
        log.lines()
            .find_map(|l| l.strip_prefix("limits="))
            .unwrap_or_else(|| panic!("no limits line: {log}")),
    )
    .unwrap_or_else(|e| panic!("limits JSON: {e}: {log}"));
    let report: Value = log
        .lines()
        .find_map(|l| {
            serde_json::from_str::<Value>(l)
                .ok()
                .filter(|v| v["cmd"] == "alloc")
        })
        .unwrap_or_else(|| panic!("no alloc report from the probe: {log}"));
    (limits, report)
}

/// The probe was refused past `limit` bytes, and saw `limit` as the GPU's memory.
fn assert_refused_past(report: &Value, limit: u64) {
    assert_eq!(
        report["error"], "CUDA_ERROR_OUT_OF_MEMORY",
        "refused past the slice: {report}"
    );
    assert!(
        report["total"].as_u64().unwrap() <= limit,
        "more than {limit} bytes allocated: {report}"
    );
    assert_eq!(report["mem_total"], limit, "{report}");
}

/// The pods of Deployment `app` in `default` (label `app=<app>`) not being deleted.
fn deployment_pods(c: &KubeCluster, app: &str) -> Vec<Value> {
    c.get_json(&["pods", "-n", "default", "-l", &format!("app={app}")])["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .cloned()
        .collect()
}

/// A pod Running with its container started and never restarted (a container whose command
/// cannot start leaves its pod in phase Running too, restarting).
fn runs(p: &Value) -> bool {
    let c = &p["status"]["containerStatuses"][0];
    p["status"]["phase"] == "Running" && c["state"]["running"].is_object() && c["restartCount"] == 0
}

/// A pod Pending because the scheduler found no room for its claim.
fn unschedulable_for_its_claim(p: &Value) -> bool {
    p["status"]["phase"] == "Pending"
        && p["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| {
                c["type"] == "PodScheduled"
                    && c["reason"] == "Unschedulable"
                    && c["message"].as_str().is_some_and(|m| m.contains("claim"))
            })
}

#[test]
#[ignore = "starts a real Kubernetes node and the webhook; the README's test command runs it"]
fn hami_examples_run_unchanged_on_a_real_node_with_the_slice_they_ask() {
    let _s = lock(&[Resource::KubeNode]);
    // Two GPUs of 30Gi: room for HAMi's two-GPU examples, and for two 20Gi slices (one each).
    let node = TestNode::with_models(&[
        ("NVIDIA A100-SXM4-80GB", "30Gi"),
        ("NVIDIA A100-SXM4-80GB", "30Gi"),
    ]);
    let cluster = KubeCluster::up_with(
        &["--node", "gpu-node", "--webhook"],
        &[("GPUSLICE_CONFIG", node.config.as_path())],
    );
    let env = cluster.endpoints();
    let kn = KubeNode {
        cluster,
        name: "gpu-node".into(),
        env,
    };
    let work = kn.cluster.dir().join("test-images");
    std::fs::create_dir_all(&work).unwrap();
    kn.ctr_import(&hami_image(&work));
    kn.cluster.kubectl(&[
        "label",
        "namespace",
        "default",
        "gpuslice.io/hami-compat=true",
    ]);

    // HAMi's default example: 2 GPUs × 3000 MiB, 30 % each; the container sees that slice.
    kn.cluster.kubectl(&[
        "apply",
        "-n",
        "default",
        "-f",
        fixture("default_use.yaml").to_str().unwrap(),
    ]);
    kn.wait_running("gpu-pod");
    let log = kn.wait_log("gpu-pod", "READY");
    let (limits, report) = standin_report(&log);
    let devs = limits["devices"]
        .as_array()
        .unwrap_or_else(|| panic!("{limits}"));
    assert_eq!(devs.len(), 2, "two GPUs: {limits}");
    let uuids: BTreeSet<&str> = devs.iter().map(|d| d["uuid"].as_str().unwrap()).collect();
    assert_eq!(uuids.len(), 2, "two different GPUs: {limits}");
    for d in devs {
        assert_eq!(d["memory_limit"], 3000u64 << 20, "{limits}");
        assert_eq!(d["cores"], 30, "{limits}");
    }
    assert_refused_past(&report, 3000 << 20);
    let booked = node.reservations();
    assert_eq!(booked.len(), 1, "{booked:?}");
    kn.delete_pod("gpu-pod");
    wait_for("the example's booking to be released", STEP, || {
        node.reservations().is_empty().then_some(())
    });

    // HAMi's memory-fraction example: 50 % of each 30Gi GPU.
    kn.cluster.kubectl(&[
        "apply",
        "-n",
        "default",
        "-f",
        fixture("use_memory_fraction.yaml").to_str().unwrap(),
    ]);
    kn.wait_running("gpu-pod");
    let log = kn.wait_log("gpu-pod", "READY");
    let (limits, report) = standin_report(&log);
    for d in limits["devices"].as_array().unwrap() {
        assert_eq!(d["memory_limit"], 15u64 << 30, "{limits}");
        assert_eq!(d["cores"], 30, "{limits}");
    }
    assert_refused_past(&report, 15 << 30);
    kn.delete_pod("gpu-pod");
    wait_for("the booking to be released", STEP, || {
        node.reservations().is_empty().then_some(())
    });

    let t_added = Instant::now();
    // HAMi's type-selection example: nvidia.com/use-gputype "A100,V100" and 2 GPUs without
    // memory: two whole A100s (the node's), each 30Gi, refused past that.
    kn.cluster.kubectl(&[
        "apply",
        "-n",
        "default",
        "-f",
        fixture("specify_card_type_to_use.yaml").to_str().unwrap(),
    ]);
    kn.wait_running("gpu-pod");
    let log = kn.wait_log("gpu-pod", "READY");
    let (limits, report) = standin_report(&log);
    let devs = limits["devices"].as_array().unwrap();
    let uuids: BTreeSet<&str> = devs.iter().map(|d| d["uuid"].as_str().unwrap()).collect();
    assert_eq!(uuids.len(), 2, "two different GPUs: {limits}");
    for d in devs {
        assert_eq!(d["memory_limit"], 30u64 << 30, "the whole GPU: {limits}");
    }
    assert_refused_past(&report, 30 << 30);

    // HAMi's Deployment example (sglang: 1 GPU, 12000 MiB, 30 %), applied while the type
    // example holds both GPUs whole: its share does not fit beside them, so its pod waits
    // Pending with the scheduler's reason instead of sharing a GPU ...
    kn.cluster.kubectl(&[
        "apply",
        "-n",
        "default",
        "-f",
        fixture("sglang_gpu_sharing.yaml").to_str().unwrap(),
    ]);
    wait_for("the sglang pod to wait for room", STEP, || {
        let p = deployment_pods(&kn.cluster, "sglang-qwen");
        (p.len() == 1 && unschedulable_for_its_claim(&p[0])).then_some(())
    });
    assert_eq!(node.reservations().len(), 1, "{:?}", node.reservations());
    // ... and runs with its slice once the GPUs are free.
    kn.delete_pod("gpu-pod");
    let mut last = Vec::new();
    let sglang = wait_for_or(STEP, || {
        last = deployment_pods(&kn.cluster, "sglang-qwen");
        (last.len() == 1 && runs(&last[0]))
            .then(|| last[0]["metadata"]["name"].as_str().unwrap().to_string())
    })
    .unwrap_or_else(|| {
        let status: Vec<&Value> = last.iter().map(|p| &p["status"]).collect();
        panic!("the sglang pod does not run: {status:?}")
    });
    let log = kn.wait_log(&sglang, "READY");
    let (limits, report) = standin_report(&log);
    let devs = limits["devices"].as_array().unwrap();
    assert_eq!(devs.len(), 1, "one GPU: {limits}");
    assert_eq!(devs[0]["memory_limit"], 12000u64 << 20, "{limits}");
    assert_eq!(devs[0]["cores"], 30, "{limits}");
    assert_refused_past(&report, 12000 << 20);
    // Three replicas of 12000 MiB: two fit one 30Gi GPU, the third never joins them.
    kn.cluster.kubectl(&[
        "scale",
        "deployment",
        "sglang-qwen",
        "-n",
        "default",
        "--replicas=3",
    ]);
    let booked = wait_for("three sglang pods running", STEP, || {
        let p = deployment_pods(&kn.cluster, "sglang-qwen");
        let booked = node.reservations();
        (p.iter().filter(|p| runs(p)).count() == 3 && booked.len() == 3).then_some(booked)
    });
    let mut per_gpu: BTreeMap<String, u64> = BTreeMap::new();
    for r in &booked {
        assert_eq!(r["gpus"][0]["memory"], 12000u64 << 20, "{r}");
        *per_gpu
            .entry(r["gpus"][0]["uuid"].as_str().unwrap().to_string())
            .or_default() += r["gpus"][0]["memory"].as_u64().unwrap();
    }
    assert_eq!(per_gpu.len(), 2, "both GPUs in use: {booked:?}");
    assert!(
        per_gpu.values().all(|m| *m <= 30 << 30),
        "a GPU holds more than its 30Gi: {booked:?}"
    );
    // The example's own readinessProbe (GET /health on 30000, after 30 s) passes against the
    // stand-in, through the node's pod network.
    wait_for("the sglang pod to be Ready", STEP, || {
        let p = kn.pod(&sglang)?;
        (p["status"]["containerStatuses"][0]["ready"] == true).then_some(())
    });
    kn.cluster.kubectl(&[
        "delete",
        "deployment",
        "sglang-qwen",
        "-n",
        "default",
        "--wait=false",
    ]);
    wait_for(
        "the sglang bookings and claims to be released",
        STEP,
        || {
            (node.reservations().is_empty() && claims(&kn.cluster, "default").is_empty())
                .then_some(())
        },
    );

    eprintln!(
        "the type-selection and sglang examples took {:?}",
        t_added.elapsed()
    );

    // gpuslice.io/memory: 20Gi in a Deployment of 3 where two fit (one per 30Gi GPU): two
    // Running on different GPUs, one Pending with the scheduler's reason; scaling down
    // releases a booking and leaves one claim.
    kn.cluster
        .create(&json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "twenty", "namespace": "default"},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "twenty"}},
                     "template": {"metadata": {"labels": {"app": "twenty"}},
                                  "spec": {"containers": [{"name": "main", "image": HAMI_IMAGE,
                                      "command": ["bash", "-c", "sleep 600"],
                                      "resources": {"limits": {"gpuslice.io/memory": "20Gi"}}}]}}},
        }))
        .unwrap();
    let pods = |phase: &str| -> Vec<Value> {
        kn.cluster
            .get_json(&["pods", "-n", "default", "-l", "app=twenty"])["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| {
                p["status"]["phase"] == phase && p["metadata"]["deletionTimestamp"].is_null()
            })
            .cloned()
            .collect()
    };
    let pending = wait_for("two Running and one Pending", STEP, || {
        let pending = pods("Pending");
        let unsched = pending.iter().any(|p| {
            p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| {
                    c["type"] == "PodScheduled"
                        && c["reason"] == "Unschedulable"
                        && c["message"].as_str().is_some_and(|m| m.contains("claim"))
                })
        });
        (pods("Running").len() == 2 && pending.len() == 1 && unsched).then_some(pending)
    });
    assert_eq!(pending.len(), 1);
    let booked = node.reservations();
    let gpus: BTreeSet<String> = booked
        .iter()
        .map(|r| r["gpus"][0]["uuid"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        (booked.len(), gpus.len()),
        (2, 2),
        "one 20Gi slice per GPU: {booked:?}"
    );
    for r in &booked {
        assert_eq!(r["gpus"][0]["memory"], 20u64 << 30, "{r}");
    }
    kn.cluster.kubectl(&[
        "scale",
        "deployment",
        "twenty",
        "-n",
        "default",
        "--replicas=1",
    ]);
    wait_for("the scale-down to release a booking", STEP, || {
        (node.reservations().len() == 1
            && claims(&kn.cluster, "default").len() == 1
            && pods("Pending").is_empty())
        .then_some(())
    });
}

/// `kubectl create -f -` of `object`: the command's success and stderr (warnings, refusals).
fn create_verbose(c: &KubeCluster, object: &Value, dry_run: bool) -> (bool, String) {
    let mut args = vec!["create", "-f", "-"];
    if dry_run {
        args.push("--dry-run=server");
    }
    let out = c.kubectl_output(&args, Some(object.to_string().as_bytes()));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The slot devices an allocation holds, by GPU (`gpu-1-slot-4` → `gpu-1`).
fn slots_by_gpu(r: &[Value]) -> BTreeMap<String, BTreeSet<String>> {
    let mut by: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for d in devices(r) {
        let gpu = d
            .rsplit_once("-slot-")
            .unwrap_or_else(|| panic!("not a slot device: {d}"))
            .0
            .to_string();
        by.entry(gpu).or_default().insert(d);
    }
    by
}

#[test]
#[ignore = "starts a real Kubernetes control plane, the webhook and a kubelet plugin; the README's test command runs it"]
fn in_slot_mode_limits_become_slot_claims_the_scheduler_places() {
    let _s = lock(&[]);
    // Consumable capacity off: the plugin (dra.mode auto) publishes 2 L4s as 6 slots each.
    let c = KubeCluster::up_with(
        &[
            "--feature-gates",
            "DRAConsumableCapacity=false",
            "--webhook",
        ],
        &[],
    );
    c.add_node("node-a");
    let node = TestNode::with_models(&[("NVIDIA L4", "24Gi"), ("NVIDIA L4", "24Gi")]);
    let plugin = KubeletPlugin::start(&c, "node-a", &node);
    c.kubectl(&[
        "apply",
        "-f",
        &format!(
            "{}/../packaging/kubernetes/dra/deviceclass-slots.yaml",
            env!("CARGO_MANIFEST_DIR")
        ),
    ]);
    let slots = gpuslice_config::DEFAULT_SLOTS_PER_GPU as usize;
    let slice = wait_for("node-a's slot slice", STEP, || {
        slice_of(&c, "node-a")
            .filter(|s| s["spec"]["devices"].as_array().map(Vec::len) == Some(2 * slots))
    });
    let slot_dev = &slice["spec"]["devices"][0];
    assert_eq!(slot_dev["capacity"]["memory"]["value"], "4Gi", "{slot_dev}");
    let slot_cores: u64 = slot_dev["capacity"]["cores"]["value"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    c.kubectl(&["create", "namespace", HAMI_NS]);
    c.kubectl(&[
        "label",
        "namespace",
        HAMI_NS,
        "gpuslice.io/hami-compat=true",
    ]);
    for ns in ["default", HAMI_NS] {
        wait_for(&format!("namespace {ns}'s service account"), STEP, || {
            c.kubectl_output(&["get", "serviceaccount", "default", "-n", ns], None)
                .status
                .success()
                .then_some(())
        });
    }

    // Memory that is not whole slots: admitted, rounded up to 2 slots with a warning (once
    // the webhook has read the slot slices: before, it answers in capacity mode).
    let before = templates(&c);
    wait_for("the webhook to answer in slot mode", STEP, || {
        let (ok, err) = create_verbose(
            &c,
            &pod(
                "default",
                "five",
                json!({"gpuslice.io/memory": "5Gi"}),
                json!({}),
            ),
            true,
        );
        assert!(ok, "{err}");
        err.contains(
            "Warning: spec.containers[0]: memory 5Gi rounded up to 2 slot(s) = 8Gi per GPU",
        )
        .then_some(())
    });
    // Below one slot: one slot, with a warning.
    let (ok, err) = create_verbose(
        &c,
        &pod(
            "default",
            "one",
            json!({"gpuslice.io/memory": "1Gi"}),
            json!({}),
        ),
        true,
    );
    assert!(ok, "{err}");
    assert!(
        err.contains("memory 1Gi rounded up to 1 slot(s) = 4Gi per GPU"),
        "{err}"
    );
    // HAMi's MiB in slot mode: the same rounding.
    let (ok, err) = create_verbose(
        &c,
        &pod(
            HAMI_NS,
            "five",
            json!({"nvidia.com/gpumem": "5000"}),
            json!({}),
        ),
        true,
    );
    assert!(ok, "{err}");
    assert!(
        err.contains("memory 5000Mi rounded up to 2 slot(s) = 8Gi per GPU"),
        "{err}"
    );
    // Several GPUs: admitted as whole GPUs (slot by slot, so the scheduler's search stays
    // bounded), warned that the memory was rounded up.
    let (ok, err) = create_verbose(
        &c,
        &pod(
            "default",
            "two",
            json!({"gpuslice.io/gpus": "2", "gpuslice.io/memory": "4Gi"}),
            json!({}),
        ),
        true,
    );
    assert!(ok, "{err}");
    assert!(
        err.contains("in slot mode a slice of 2 GPUs takes each GPU whole (6 slots); memory 4Gi per GPU rounded up to the whole GPU"),
        "{err}"
    );
    // Refused, one line each: more slots than a GPU has (a compute share above 6 slots'),
    // more memory than a GPU, more GPUs than the node.
    let need = 100u64.div_ceil(slot_cores);
    assert!(need > slots as u64, "slots of {slot_cores} cores");
    for (limits, want) in [
        (
            json!({"gpuslice.io/cores": "100"}),
            format!("needs {need} slots of 4Gi per GPU; accepted: at most {slots} slots (24Gi) per GPU in this cluster's slot mode"),
        ),
        (
            json!({"gpuslice.io/memory": "25Gi"}),
            "at most 24Gi per GPU".to_string(),
        ),
        (
            json!({"gpuslice.io/gpus": "3"}),
            "at most 2 GPUs: no node of the cluster has more".to_string(),
        ),
    ] {
        let (ok, err) = create_verbose(&c, &pod("default", "bad", limits.clone(), json!({})), false);
        assert!(!ok, "{limits} was admitted");
        assert!(err.contains(&want), "{limits}: {err}");
        assert!(
            err.contains("admission webhook \"pods.gpuslice.io\" denied the request"),
            "{err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    }
    assert_eq!(
        templates(&c),
        before,
        "dry runs or refusals created a template"
    );

    // 8Gi: a claim of 2 slots of one GPU, from the webhook's template, placed by the scheduler.
    let (ok, err) = create_verbose(
        &c,
        &pod(
            "default",
            "eight",
            json!({"gpuslice.io/memory": "8Gi"}),
            json!({}),
        ),
        false,
    );
    assert!(ok && !err.contains("Warning"), "{err}");
    let p = c.get_json(&["pod", "eight", "-n", "default"]);
    let t = p["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
        .as_str()
        .unwrap_or_else(|| panic!("{p}"));
    let tmpl = c.get_json(&["resourceclaimtemplate", t, "-n", "default"]);
    let spec = &tmpl["spec"]["spec"]["devices"];
    let req = &spec["requests"][0];
    assert_eq!(spec["requests"].as_array().map(Vec::len), Some(1), "{tmpl}");
    assert_eq!(req["name"], "gpu", "{tmpl}");
    assert_eq!(
        req["exactly"]["deviceClassName"], "slots.gpuslice.io",
        "{tmpl}"
    );
    assert_eq!(req["exactly"]["count"], 2, "{tmpl}");
    assert!(req["exactly"]["capacity"].is_null(), "{tmpl}");
    assert_eq!(
        spec["constraints"],
        json!([{"requests": ["gpu"], "matchAttribute": "gpuslice.io/uuid"}]),
        "{tmpl}"
    );
    let eight = slots_by_gpu(&results(&c, "default", "eight"));
    assert_eq!(
        eight.values().map(BTreeSet::len).collect::<Vec<_>>(),
        [2],
        "2 slots of one GPU: {eight:?}"
    );
    // Prepared as a kubelet would: the node books exactly 2 slots (8Gi) of that GPU.
    let claim_name = c.get_json(&["pod", "eight", "-n", "default"])["status"]
        ["resourceClaimStatuses"][0]["resourceClaimName"]
        .as_str()
        .unwrap()
        .to_string();
    let claim = c.get_json(&["resourceclaim", &claim_name, "-n", "default"]);
    let uid = claim["metadata"]["uid"].as_str().unwrap();
    let mut kubelet = plugin.kubelet();
    let answer = kubelet
        .prepare(kubelet_claim("default", &claim_name, uid))
        .unwrap();
    assert_eq!(answer.error, "", "{}", plugin.log_text());
    let booked = node.reservations();
    assert_eq!(booked.len(), 1, "{booked:?}");
    assert_eq!(booked[0]["gpus"][0]["memory"], 8u64 << 30, "{booked:?}");
    let gpu = eight.keys().next().unwrap();
    let index: usize = gpu.trim_start_matches("gpu-").parse().unwrap();
    assert_eq!(booked[0]["gpus"][0]["uuid"], node.uuid(index), "{booked:?}");
    // 16Gi (4 slots) twice: 4 + 4 do not fit one GPU's 6, so they never share one; a third
    // finds no GPU with 4 free (2 and 2 left) and waits with the scheduler's reason.
    for name in ["sixteen-a", "sixteen-b"] {
        c.create(&pod(
            "default",
            name,
            json!({"gpuslice.io/memory": "16Gi"}),
            json!({}),
        ))
        .unwrap();
    }
    let a = slots_by_gpu(&results(&c, "default", "sixteen-a"));
    let b = slots_by_gpu(&results(&c, "default", "sixteen-b"));
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!(b.len(), 1, "{b:?}");
    assert_ne!(
        a.keys().next(),
        b.keys().next(),
        "4 + 4 slots on one GPU: {a:?} {b:?}"
    );
    let mut per_gpu: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for held in [&eight, &a, &b] {
        for (gpu, devs) in held {
            let all = per_gpu.entry(gpu.clone()).or_default();
            for d in devs {
                assert!(all.insert(d.clone()), "slot {d} given twice");
            }
        }
    }
    assert!(per_gpu.values().all(|d| d.len() <= slots), "{per_gpu:?}");
    c.create(&pod(
        "default",
        "sixteen-c",
        json!({"gpuslice.io/memory": "16Gi"}),
        json!({}),
    ))
    .unwrap();
    let why = wait_for("sixteen-c to find no room", STEP, || {
        let p = c.get_json(&["pod", "sixteen-c", "-n", "default"]);
        unschedulable_for_its_claim(&p).then(|| p["status"]["conditions"].to_string())
    });
    assert!(why.contains("cannot allocate all claims"), "{why}");
    // Releasing one 16Gi pod (its claim goes with it) lets the waiting one in.
    force_delete(&c, "default", &["pod", "sixteen-a"]);
    let cc = slots_by_gpu(&results(&c, "default", "sixteen-c"));
    assert_eq!(
        cc.values().map(BTreeSet::len).collect::<Vec<_>>(),
        [4],
        "{cc:?}"
    );
}

#[test]
fn kube_cluster_help_documents_the_webhook_and_helm() {
    let help = Command::new(gpuslice_e2e::kube::script())
        .arg("--help")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(help.status.success());
    for word in [
        "up DIR … --webhook",
        "gpuslice webhook --hami-compat",
        "WEBHOOK_URL",
        "build-helm",
        "GPUSLICE_HELM_BIN",
    ] {
        assert!(
            text.contains(word),
            "--help does not mention {word}: {text}"
        );
    }
}

/// The webhook's connection cap (docs/webhook.md, "Bounds"): the attack holds more.
const WEBHOOK_SLOTS: usize = 256;
/// Its largest review body.
const WEBHOOK_MAX_BODY: usize = 3 << 20;
/// The chart's memory limit for the webhook (packaging/helm/gpuslice/values.yaml).
const CHART_MEMORY_LIMIT: u64 = 128 << 20;

/// Accepts the test cluster's webhook certificate unchecked (the attack needs no trust).
#[derive(Debug)]
struct AnyCert(std::sync::Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &rustls::pki_types::CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &rustls::pki_types::CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// A TLS session to the webhook at `addr`, handshaken.
fn webhook_session(
    addr: std::net::SocketAddr,
) -> std::io::Result<(rustls::ClientConnection, std::net::TcpStream)> {
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .dangerous()
        .with_custom_certificate_verifier(std::sync::Arc::new(AnyCert(provider)))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let name =
        rustls::pki_types::ServerName::try_from("localhost").map_err(std::io::Error::other)?;
    let mut tls = rustls::ClientConnection::new(std::sync::Arc::new(config), name)
        .map_err(std::io::Error::other)?;
    let mut tcp = std::net::TcpStream::connect(addr)?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    // A small receive buffer: the webhook's answers to a client that never reads stall
    // after some KiB, as over a real network.
    let small: libc::c_int = 4096;
    // SAFETY: setsockopt reads one int, a valid local, about a descriptor `tcp` owns.
    let r = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&tcp),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&small as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    while tls.is_handshaking() {
        tls.complete_io(&mut tcp)?;
    }
    Ok((tls, tcp))
}

/// Peak resident memory of process `pid` (VmHWM), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb << 10
}

#[test]
#[ignore = "starts a real Kubernetes control plane and the webhook; the README's test command runs it"]
fn gpu_pods_are_admitted_while_hostile_clients_hold_the_webhook() {
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    let _s = lock(&[]);
    let mut c = KubeCluster::up_with(&["--webhook"], &[]);
    let url = c.endpoints()["WEBHOOK_URL"].clone();
    let addr: std::net::SocketAddr = url["https://".len()..]
        .split('/')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let pid: u32 = std::fs::read_to_string(c.dir().join("pids/gpuslice-webhook.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    wait_for("namespace default's service account", STEP, || {
        c.kubectl_output(&["get", "serviceaccount", "default"], None)
            .status
            .success()
            .then_some(())
    });

    let stop = Arc::new(AtomicBool::new(false));
    let connected = Arc::new(AtomicUsize::new(0));
    let reviewed = Arc::new(AtomicUsize::new(0));
    let mut threads = Vec::new();
    // Attack 1: more clients than the webhook has slots pipeline health checks without end
    // and never read an answer; a client dropped comes back a second later.
    for _ in 0..WEBHOOK_SLOTS + 16 {
        let (stop, connected) = (stop.clone(), connected.clone());
        threads.push(std::thread::spawn(move || {
            let batch = b"GET /healthz HTTP/1.1\r\nHost: w\r\n\r\n".repeat(64);
            while !stop.load(Ordering::Relaxed) {
                if let Ok((mut tls, mut tcp)) = webhook_session(addr) {
                    connected.fetch_add(1, Ordering::Relaxed);
                    let _ = tcp.set_write_timeout(Some(Duration::from_secs(1)));
                    // Only writes, until the webhook drops the connection or the attack stops.
                    let _ = (|| -> std::io::Result<()> {
                        while !stop.load(Ordering::Relaxed) {
                            tls.writer().write_all(&batch)?;
                            while tls.wants_write() && !stop.load(Ordering::Relaxed) {
                                match tls.write_tls(&mut tcp) {
                                    // Stalled: the webhook reads no more; look at `stop`.
                                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                                    r => {
                                        r?;
                                    }
                                }
                            }
                        }
                        Ok(())
                    })();
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        }));
    }
    // Attack 2: 8 clients send reviews of just under the body limit, one after another, of
    // a pod padded with the densest JSON (a value every two bytes), where the webhook does
    // not read.
    let pad = WEBHOOK_MAX_BODY - 4096;
    let review = {
        let mut p = pod(
            "default",
            "big",
            json!({"gpuslice.io/gpus": "1"}),
            json!({}),
        );
        p["spec"]["containers"][0]["args"] = json!([]);
        let mut r = serde_json::to_string(&json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "hostile", "namespace": "default", "operation": "CREATE",
                        "dryRun": true, "object": p},
        }))
        .unwrap();
        let at = r.find("\"args\":[").unwrap() + "\"args\":[".len();
        let mut zeros = "0,".repeat(pad / 2);
        zeros.pop();
        r.insert_str(at, &zeros);
        Arc::new(r)
    };
    for _ in 0..8 {
        let (stop, reviewed, review) = (stop.clone(), reviewed.clone(), review.clone());
        threads.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let Ok((tls, tcp)) = webhook_session(addr) else {
                    continue;
                };
                let mut s = rustls::StreamOwned::new(tls, tcp);
                let sent = write!(
                    s,
                    "POST /mutate HTTP/1.1\r\nHost: w\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{review}",
                    review.len()
                );
                let mut answer = Vec::new();
                if sent.is_ok() {
                    // The answer, however the connection then ends.
                    let _ = s.read_to_end(&mut answer);
                    let text = String::from_utf8_lossy(&answer);
                    if text.starts_with("HTTP/1.1 200") && text.contains("\"uid\":\"hostile\"") {
                        reviewed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    wait_for("the attackers to hold the webhook", STEP, || {
        (connected.load(Ordering::Relaxed) > WEBHOOK_SLOTS && reviewed.load(Ordering::Relaxed) >= 8)
            .then_some(())
    });

    // Meanwhile a GPU pod is admitted with its claim.
    c.create(&pod(
        "default",
        "during",
        json!({"gpuslice.io/gpus": "1"}),
        json!({}),
    ))
    .expect("the API server could not reach the webhook");
    let p = c.get_json(&["pod", "during", "-n", "default"]);
    assert_eq!(
        p["spec"]["containers"][0]["resources"]["claims"],
        json!([{"name": "gpuslice-c0"}]),
        "{p}"
    );
    assert_eq!(p["spec"]["resourceClaims"][0]["name"], "gpuslice-c0", "{p}");

    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    // The big reviews were answered, and within the chart's memory limit.
    let peak = peak_rss(pid);
    assert!(
        peak < CHART_MEMORY_LIMIT,
        "the webhook's peak RSS was {peak} bytes, over the chart's limit of {CHART_MEMORY_LIMIT}"
    );
    c.down();
}
