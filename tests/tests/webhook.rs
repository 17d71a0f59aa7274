//! `scripts/kube-cluster.sh up DIR --webhook` runs `gpuslice webhook --hami-compat` against a
//! real control plane of the pinned release: container limits (gpuslice's own, and HAMi's in a
//! namespace labelled for it, HAMi's published examples unchanged) become claims the
//! scheduler allocates on distinct GPUs; dry runs create nothing; inexpressible requests are
//! refused with one line; with the webhook killed the API server refuses GPU pods (and only
//! those) until it is back. The node is an object without a kubelet and the slice is written
//! by the test, as in kube_control_plane.rs; the pods tolerate its taints.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use gpuslice_e2e::cri::image_archive_of;
use gpuslice_e2e::image::rootfs;
use gpuslice_e2e::kube::{wait_for, KubeCluster};
use gpuslice_e2e::kube_node::KubeNode;
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
    wait_for(
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
    let pending = wait_for(
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
    wait_for(
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
        ("default", json!({"gpuslice.io/gpus": "0"}), json!({}), "limits[gpuslice.io/gpus]: value \"0\" is not accepted; expected a whole number of GPUs from 1 to 16"),
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
    kill_hard(pid);
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

    c.down();
    let _ = child.wait();
}

/// SIGKILL, as a crash would end the webhook.
fn kill_hard(pid: u32) {
    let status = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    wait_for("the webhook to exit", STEP, || {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
        stat.is_none_or(|s| s.contains(") Z ")).then_some(())
    });
}

/// The image HAMi's examples name on the real node: the test rootfs, whose `bash` (HAMi's
/// examples run `bash -c …`) first prints the container's limits file and runs the probe
/// through the shim, then runs the example's own command with `sh`.
const HAMI_IMAGE: &str = "localhost/gpuslice-hami-e2e:1";
const BASH: &str = "#!/bin/sh\n\
    echo limits=$(cat /run/gpuslice/limits.json)\n\
    gpuslice-probe --json alloc --chunk 512Mi --max 20Gi; echo EXIT $?\n\
    echo READY\n\
    exec /bin/sh \"$@\"\n";

fn hami_image(dir: &Path) -> std::path::PathBuf {
    let root = dir.join("hami-rootfs");
    let st = Command::new("cp")
        .arg("-a")
        .arg(rootfs())
        .arg(&root)
        .status()
        .unwrap();
    assert!(st.success());
    let bash = root.join("bin/bash");
    let _ = std::fs::remove_file(&bash);
    std::fs::write(&bash, BASH).unwrap();
    std::fs::set_permissions(&bash, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::create_dir_all(root.join("usr/local/bin")).unwrap();
    std::fs::copy(
        gpuslice_e2e::node::probe(),
        root.join("usr/local/bin/gpuslice-probe"),
    )
    .unwrap();
    image_archive_of(&root, dir, HAMI_IMAGE, &["sh"])
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
    let limits: Value = serde_json::from_str(
        log.lines()
            .find_map(|l| l.strip_prefix("limits="))
            .unwrap_or_else(|| panic!("no limits line: {log}")),
    )
    .unwrap_or_else(|e| panic!("limits JSON: {e}: {log}"));
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
    let report: Value = log
        .lines()
        .find_map(|l| {
            serde_json::from_str::<Value>(l)
                .ok()
                .filter(|v| v["cmd"] == "alloc")
        })
        .unwrap_or_else(|| panic!("no alloc report from the probe: {log}"));
    assert_eq!(
        report["error"], "CUDA_ERROR_OUT_OF_MEMORY",
        "refused past the slice: {report}"
    );
    assert!(
        report["total"].as_u64().unwrap() <= 3000u64 << 20,
        "more than 3000 MiB allocated: {report}"
    );
    assert_eq!(report["mem_total"], 3000u64 << 20, "{report}");
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
    let limits: Value =
        serde_json::from_str(log.lines().find_map(|l| l.strip_prefix("limits=")).unwrap()).unwrap();
    for d in limits["devices"].as_array().unwrap() {
        assert_eq!(d["memory_limit"], 15u64 << 30, "{limits}");
    }
    kn.delete_pod("gpu-pod");
    wait_for("the booking to be released", STEP, || {
        node.reservations().is_empty().then_some(())
    });

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
