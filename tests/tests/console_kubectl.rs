//! `kubectl-gpuslice` against the real control plane: two Node objects (no
//! kubelet), one real `gpuslice kubelet-plugin` per simulated node publishing real
//! ResourceSlices (node-a: 2 × H200 141Gi, node-b: 1 × L4 24Gi), claims allocated by the
//! stock scheduler. `nodes` and `gpus` show exactly what the slices offer and what the
//! allocated claims consume; without Prometheus the used columns say `n/a` with one warning
//! line. `allocate` on a Deployment makes the real scheduler place its new pods on GPUs with
//! room, `--dry-run` changes nothing, `release` restores the pod template; bad input gets one
//! line and changes nothing (HAMi's limits too: the webhook's to convert). With the webhook
//! installed `allocate` writes the limits form (which the webhook turns into each pod's
//! claim), without it the claim form; Edit and Release work on both. In slot mode (consumable
//! capacity off) the views gather the slots into their GPUs and `allocate` writes the slot
//! claim.

use std::collections::BTreeMap;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use gpuslice_e2e::kube::KubeCluster;
use gpuslice_e2e::kubelet_plugin::{
    bound_node, deployment, pod, resource_claim, slice_of, KubeletPlugin,
};
use gpuslice_e2e::prometheus::Prometheus;
use gpuslice_e2e::published::{published, quantity, PublishedGpu};
use gpuslice_e2e::{bin, env::workspace, lock, TestNode};
use serde_json::{json, Value};

const NS: &str = "default";
const GIB: u64 = 1 << 30;
const STEP: Duration = Duration::from_secs(90);

/// `kubectl-gpuslice --kubeconfig <cluster> --hami-compat args…` (the test cluster's webhook
/// runs with --hami-compat, so the plugin is told it does).
fn plugin(cluster: &KubeCluster, args: &[&str]) -> Output {
    Command::new(bin("kubectl-gpuslice"))
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig())
        .arg("--hami-compat")
        .env_remove("GPUSLICE_HAMI_COMPAT")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run kubectl-gpuslice")
}

/// Runs it, expecting success; stdout.
fn plugin_ok(cluster: &KubeCluster, args: &[&str]) -> (String, String) {
    let out = plugin(cluster, args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "kubectl-gpuslice {} failed ({}): {stderr}{stdout}",
        args.join(" "),
        out.status
    );
    (stdout, stderr)
}

/// Runs it, expecting a failure with one line on stderr; that line.
fn plugin_refused(cluster: &KubeCluster, args: &[&str]) -> String {
    let out = plugin(cluster, args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "kubectl-gpuslice {} succeeded: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(
        stderr.lines().count(),
        1,
        "kubectl-gpuslice {}: not one line: {stderr}",
        args.join(" ")
    );
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    stderr.trim().to_string()
}

fn json_of(cluster: &KubeCluster, args: &[&str]) -> Value {
    let (stdout, _) = plugin_ok(cluster, args);
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// `gpus -o json` and `nodes -o json` agree with what the API server holds ([`published`]), and used is `null`.
fn check_figures(cluster: &KubeCluster) -> BTreeMap<(String, String), PublishedGpu> {
    let (want, _) = published(cluster);
    let gpus = json_of(cluster, &["gpus", "-o", "json"]);
    let got: BTreeMap<(String, String), PublishedGpu> = gpus["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            assert!(g["memory"]["used"].is_null(), "{g}");
            assert!(g["cores"]["used"].is_null(), "{g}");
            assert_eq!(
                g["memory"]["free"].as_u64().unwrap(),
                g["memory"]["capacity"].as_u64().unwrap()
                    - g["memory"]["allocated"].as_u64().unwrap()
            );
            let mut claims: Vec<String> = g["claims"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| {
                    format!(
                        "{}/{}",
                        c["namespace"].as_str().unwrap(),
                        c["name"].as_str().unwrap()
                    )
                })
                .collect();
            claims.sort();
            (
                (
                    g["node"].as_str().unwrap().to_string(),
                    g["device"].as_str().unwrap().to_string(),
                ),
                PublishedGpu {
                    node: g["node"].as_str().unwrap().to_string(),
                    index: g["index"].as_u64().unwrap(),
                    memory: g["memory"]["capacity"].as_u64().unwrap(),
                    cores: g["cores"]["capacity"].as_u64().unwrap(),
                    memory_allocated: g["memory"]["allocated"].as_u64().unwrap(),
                    cores_allocated: g["cores"]["allocated"].as_u64().unwrap(),
                    model: g["model"].as_str().unwrap().to_string(),
                    uuid: g["uuid"].as_str().unwrap().to_string(),
                    claims,
                },
            )
        })
        .collect();
    assert_eq!(got, want, "gpus -o json against the slices and claims");

    let nodes = json_of(cluster, &["nodes", "-o", "json"]);
    let mut total = (0u64, 0u64, 0u64, 0u64, 0u64);
    for n in nodes["nodes"].as_array().unwrap() {
        let name = n["name"].as_str().unwrap();
        let mine: Vec<&PublishedGpu> = want
            .iter()
            .filter(|((node, _), _)| node == name)
            .map(|(_, e)| e)
            .collect();
        let sum = |f: fn(&PublishedGpu) -> u64| mine.iter().map(|e| f(e)).sum::<u64>();
        assert_eq!(n["gpus"].as_u64().unwrap(), mine.len() as u64, "{n}");
        assert_eq!(
            n["memory"]["capacity"].as_u64().unwrap(),
            sum(|e| e.memory),
            "{n}"
        );
        assert_eq!(
            n["memory"]["allocated"].as_u64().unwrap(),
            sum(|e| e.memory_allocated),
            "{n}"
        );
        assert_eq!(
            n["cores"]["capacity"].as_u64().unwrap(),
            sum(|e| e.cores),
            "{n}"
        );
        assert_eq!(
            n["cores"]["allocated"].as_u64().unwrap(),
            sum(|e| e.cores_allocated),
            "{n}"
        );
        assert!(n["memory"]["used"].is_null(), "{n}");
        total.0 += mine.len() as u64;
        total.1 += sum(|e| e.memory);
        total.2 += sum(|e| e.memory_allocated);
        total.3 += sum(|e| e.cores);
        total.4 += sum(|e| e.cores_allocated);
    }
    let t = &nodes["total"];
    assert_eq!(t["name"], "*");
    assert_eq!(
        (
            t["gpus"].as_u64().unwrap(),
            t["memory"]["capacity"].as_u64().unwrap(),
            t["memory"]["allocated"].as_u64().unwrap(),
            t["cores"]["capacity"].as_u64().unwrap(),
            t["cores"]["allocated"].as_u64().unwrap()
        ),
        total,
        "{t}"
    );
    assert!(
        nodes["usageUnavailable"]
            .as_str()
            .unwrap()
            .contains("--prometheus"),
        "{nodes}"
    );
    want
}

fn rct_names(cluster: &KubeCluster) -> Vec<String> {
    let mut v: Vec<String> = cluster.get_json(&["resourceclaimtemplates", "-n", NS])["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    v.sort();
    v
}

fn deploy(cluster: &KubeCluster, name: &str) -> Value {
    cluster.get_json(&["deployment", name, "-n", NS])
}

/// The Deployment's spec and generation are as `before` (its status may have moved on).
fn assert_unchanged(cluster: &KubeCluster, name: &str, before: &Value) {
    let now = deploy(cluster, name);
    assert_eq!(now["spec"], before["spec"], "deployment/{name} changed");
    assert_eq!(
        now["metadata"]["generation"], before["metadata"]["generation"],
        "deployment/{name} changed"
    );
}

const L4: &str = "device.attributes[\"gpuslice.io\"].productName == \"NVIDIA L4\"";

#[test]
#[ignore = "starts a real Kubernetes control plane and two plugin processes; the README's test command runs it"]
fn kubectl_gpuslice_shows_the_registry_and_allocates_workloads() {
    let _s = lock(&[]);
    let mut cluster = KubeCluster::up();
    let nodes: BTreeMap<&str, TestNode> = [
        (
            "node-a",
            TestNode::with_models(&[("NVIDIA H200", "141Gi"), ("NVIDIA H200", "141Gi")]),
        ),
        ("node-b", TestNode::with_models(&[("NVIDIA L4", "24Gi")])),
    ]
    .into_iter()
    .collect();
    for name in nodes.keys() {
        cluster.add_node(name);
    }
    let plugins: Vec<KubeletPlugin> = nodes
        .iter()
        .map(|(name, node)| KubeletPlugin::start(&cluster, name, node))
        .collect();
    for name in nodes.keys() {
        cluster.wait_for(&format!("the ResourceSlice of {name}"), STEP, || {
            slice_of(&cluster, name)
        });
    }
    let class = workspace().join("packaging/kubernetes/dra/deviceclass.yaml");
    cluster.kubectl(&["create", "-f", &class.display().to_string()]);

    // Before any claim: capacity only; the table's first row is the cluster total, used n/a
    // with one warning line naming the missing source.
    let want = check_figures(&cluster);
    assert_eq!(want.len(), 3);
    assert!(want.values().all(|e| e.memory_allocated == 0));
    let (table, warning) = plugin_ok(&cluster, &["nodes"]);
    eprintln!("kubectl gpuslice nodes:\n{table}");
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("NODE") && lines[0].contains("MEMORY USED"),
        "{table}"
    );
    assert!(lines[1].starts_with("* "), "{table}");
    assert!(
        lines[1].contains("306Gi"),
        "the total of 2 × 141Gi + 24Gi: {table}"
    );
    assert!(
        lines[2].starts_with("node-a") && lines[3].starts_with("node-b"),
        "{table}"
    );
    assert!(lines[1..].iter().all(|l| l.contains("n/a")), "{table}");
    assert_eq!(warning.lines().count(), 1, "{warning}");
    assert!(
        warning.contains("n/a") && warning.contains("--prometheus"),
        "{warning}"
    );

    // Claims of several sizes, placed by the scheduler: the L4 filled, node-a partly.
    for (name, count, memory, cores, cel) in [
        ("l4-full", 1, "24Gi", "50", Some(L4)),
        ("two-gpus", 2, "30Gi", "10", None),
        ("big", 1, "100Gi", "40", None),
    ] {
        cluster
            .create(&resource_claim(name, count, memory, cores, cel))
            .unwrap();
        cluster.create(&pod(name, name)).unwrap();
        bound_node(&cluster, name);
    }
    let want = check_figures(&cluster);
    assert_eq!(
        want[&("node-b".into(), "gpu-0".into())].memory_allocated,
        24 * GIB
    );
    assert_eq!(
        want.values().map(|e| e.memory_allocated).sum::<u64>(),
        (24 + 60 + 100) * GIB
    );
    let (table, _) = plugin_ok(&cluster, &["gpus", "-o", "wide"]);
    eprintln!("kubectl gpuslice gpus -o wide:\n{table}");
    assert!(table.contains("default/l4-full=24Gi/50"), "{table}");
    assert!(
        table.contains("24Gi (100%)"),
        "the L4 fully allocated: {table}"
    );
    // --available: node-b has no room left.
    let available = json_of(&cluster, &["nodes", "--available", "-o", "json"]);
    let names: Vec<&str> = available["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["node-a"], "{available}");
    let (yaml, _) = plugin_ok(&cluster, &["nodes", "-o", "yaml"]);
    assert!(
        yaml.contains("name: node-a") && yaml.contains("allocated:"),
        "{yaml}"
    );

    // A Deployment of 3 pods without GPUs.
    cluster.create(&deployment("web", 3, None)).unwrap();
    let original = deploy(&cluster, "web");
    let template_before = original["spec"]["template"].clone();

    // --dry-run prints the diff and changes nothing.
    let (diff, _) = plugin_ok(
        &cluster,
        &[
            "allocate",
            "deployment/web",
            "--memory",
            "20Gi",
            "--cores",
            "30",
            "--dry-run",
        ],
    );
    eprintln!("allocate --dry-run:\n{diff}");
    assert!(diff.contains("+++ resourceclaimtemplate/"), "{diff}");
    assert!(diff.contains("+- name: gpuslice"), "{diff}");
    assert!(
        diff.contains("+  resourceClaimTemplateName: web-deployment-gpuslice-"),
        "{diff}"
    );
    assert!(diff.contains("+    - name: gpuslice"), "{diff}");
    assert!(diff.contains("memory: 20Gi"), "{diff}");
    assert!(diff.contains("nothing changed"), "{diff}");
    assert_unchanged(&cluster, "web", &original);
    assert!(rct_names(&cluster).is_empty());

    // Bad input: one line, nothing changed.
    cluster
        .create(&deployment(
            "other",
            1,
            Some(json!([{"name": "mine", "resourceClaimTemplateName": "someone-elses"}])),
        ))
        .unwrap();
    let other_before = deploy(&cluster, "other");
    // HAMi's limits are the webhook's to convert: the tool leaves such a workload alone.
    let mut hami = deployment("hami", 1, None);
    hami["spec"]["template"]["spec"]["containers"][0]["resources"] =
        json!({"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2500"}});
    cluster.create(&hami).unwrap();
    let hami_before = deploy(&cluster, "hami");
    for (args, says) in [
        (
            vec!["allocate", "deployment/nope", "--memory", "1Gi"],
            "deployment/nope not found",
        ),
        (
            vec!["allocate", "pod/web", "--memory", "1Gi"],
            "accepted: deployment/NAME",
        ),
        (
            vec!["allocate", "deployment/web", "--memory", "20GB"],
            "--memory `20GB`",
        ),
        (
            vec![
                "allocate",
                "deployment/web",
                "--memory",
                "20Gi",
                "--cores",
                "130",
            ],
            "--cores `130`",
        ),
        (
            vec!["allocate", "deployment/other", "--memory", "1Gi"],
            "already uses claim `mine`",
        ),
        // No GPU has 200Gi; and 3 × 100Gi do not fit the 141Gi H200s' free room (41 + 111).
        (
            vec!["allocate", "deployment/web", "--memory", "200Gi"],
            "fits 0",
        ),
        (
            vec!["allocate", "deployment/web", "--memory", "100Gi"],
            "fits 1 (node-a: 1, node-b: 0)",
        ),
        (vec!["release", "deployment/web"], "nothing to release"),
        (
            vec!["allocate", "deployment/hami", "--memory", "1Gi"],
            "deployment/hami asks HAMi's GPU limits (main: nvidia.com/gpu=1, nvidia.com/gpumem=2500)",
        ),
        (
            vec!["release", "deployment/hami"],
            "deployment/hami asks HAMi's GPU limits",
        ),
        (
            vec![
                "allocate",
                "deployment/web",
                "--memory",
                "1Gi",
                "-c",
                "nosuch",
            ],
            "no container `nosuch`",
        ),
    ] {
        let line = plugin_refused(&cluster, &args);
        eprintln!("{}: {line}", args.join(" "));
        assert!(line.contains(says), "{}: {line}", args.join(" "));
    }
    assert_unchanged(&cluster, "web", &original);
    assert_unchanged(&cluster, "other", &other_before);
    assert_unchanged(&cluster, "hami", &hami_before);
    assert!(rct_names(&cluster).is_empty());

    // allocate: the template and the claim; the scheduler places the new pods on GPUs with
    // room (only node-a has any).
    let (said, _) = plugin_ok(
        &cluster,
        &[
            "allocate",
            "deployment/web",
            "--memory",
            "20Gi",
            "--cores",
            "30",
            "-c",
            "main",
        ],
    );
    assert!(said.contains("allocated"), "{said}");
    let rcts = rct_names(&cluster);
    assert_eq!(rcts.len(), 1, "{rcts:?}");
    let rct = cluster.get_json(&["resourceclaimtemplate", &rcts[0], "-n", NS]);
    let exactly = &rct["spec"]["spec"]["devices"]["requests"][0]["exactly"];
    assert_eq!(exactly["deviceClassName"], "gpuslice.io", "{rct}");
    assert_eq!(exactly["count"], 1, "{rct}");
    assert_eq!(exactly["capacity"]["requests"]["memory"], "20Gi", "{rct}");
    assert_eq!(exactly["capacity"]["requests"]["cores"], "30", "{rct}");
    let d = deploy(&cluster, "web");
    let spec = &d["spec"]["template"]["spec"];
    assert_eq!(
        spec["resourceClaims"],
        json!([{"name": "gpuslice", "resourceClaimTemplateName": rcts[0]}]),
        "{spec}"
    );
    assert_eq!(
        spec["containers"][0]["resources"]["claims"],
        json!([{"name": "gpuslice"}])
    );
    assert!(
        spec["containers"][1]["resources"]["claims"].is_null(),
        "{spec}"
    );
    // Allocating the same again changes nothing.
    let (said, _) = plugin_ok(
        &cluster,
        &[
            "allocate",
            "deployment/web",
            "--memory",
            "20Gi",
            "--cores",
            "30",
            "-c",
            "main",
        ],
    );
    assert!(said.contains("unchanged"), "{said}");

    let placed: Vec<(String, Value)> =
        cluster.wait_for("3 new pods of web with allocated claims", STEP, || {
            let pods = cluster.get_json(&["pods", "-n", NS, "-l", "app=web"]);
            let mut out = Vec::new();
            for p in pods["items"].as_array()? {
                if p["spec"]["resourceClaims"].is_null()
                    || !p["metadata"]["deletionTimestamp"].is_null()
                {
                    continue;
                }
                let node = p["spec"]["nodeName"].as_str()?.to_string();
                let claim =
                    p["status"]["resourceClaimStatuses"][0]["resourceClaimName"].as_str()?;
                let c = cluster.get_json(&["resourceclaim", claim, "-n", NS]);
                c["status"]["allocation"].is_object().then_some(())?;
                out.push((node, c));
            }
            (out.len() == 3).then_some(out)
        });
    for (node, c) in &placed {
        assert_eq!(node, "node-a", "the L4 has no room: {c}");
        let r = &c["status"]["allocation"]["devices"]["results"][0];
        assert_eq!(r["pool"], "node-a", "{c}");
        assert_eq!(quantity(&r["consumedCapacity"]["memory"]), 20 * GIB, "{c}");
        assert_eq!(r["consumedCapacity"]["cores"], "30", "{c}");
    }
    // No GPU holds more than it offers, and the console's figures still equal the registry.
    for ((node, gpu), e) in check_figures(&cluster) {
        assert!(
            e.memory_allocated <= e.memory && e.cores_allocated <= e.cores,
            "{node}/{gpu}: {e:?}"
        );
    }
    let (table, _) = plugin_ok(&cluster, &["pods"]);
    eprintln!("kubectl gpuslice pods:\n{table}");
    assert_eq!(
        table.lines().count(),
        2 + 4 + 3,
        "header, total, 4 slices of the claim pods (two-gpus has two) and 3 web pods: {table}"
    );
    let web: Vec<&str> = table.lines().filter(|l| l.starts_with("web-")).collect();
    assert_eq!(web.len(), 3, "{table}");
    assert!(
        web.iter().all(|l| l.contains("   main   ")
            && l.contains("   node-a   ")
            && l.contains("   20Gi   ")),
        "the main container's slice of 20Gi, the sidecar none: {table}"
    );

    // release: the pod template exactly as before, the template deleted.
    let (diff, _) = plugin_ok(&cluster, &["release", "deployment/web", "--dry-run"]);
    assert!(diff.contains("-- name: gpuslice"), "{diff}");
    assert_eq!(rct_names(&cluster), rcts);
    let (said, _) = plugin_ok(&cluster, &["release", "deployment/web"]);
    assert!(said.contains("released"), "{said}");
    assert_eq!(deploy(&cluster, "web")["spec"]["template"], template_before);
    assert!(rct_names(&cluster).is_empty());

    check_quota(&cluster);

    drop(plugins);
    cluster.down();
}

/// Creates `obj` and sets its status through the status subresource, as the webhook (the
/// ResourceQuota ledger) and Kueue (a ClusterQueue's usage) write theirs; waits until the
/// API server holds it (a controller's first write of a status, conditional on the version
/// it read, retries over ours and keeps it).
fn create_with_status(cluster: &KubeCluster, obj: &Value) {
    cluster.create(obj).unwrap();
    let kind = obj["kind"].as_str().unwrap().to_ascii_lowercase();
    let name = obj["metadata"]["name"].as_str().unwrap();
    let mut args = vec!["patch", &kind, name];
    let ns = obj["metadata"]["namespace"].as_str();
    if let Some(ns) = ns {
        args.extend(["-n", ns]);
    }
    let patch = json!({"status": obj["status"]}).to_string();
    args.extend(["--subresource=status", "--type=merge", "-p", &patch]);
    cluster.kubectl(&args);
    let mut get = vec![kind.as_str(), name];
    if let Some(ns) = ns {
        get.extend(["-n", ns]);
    }
    cluster.wait_for(
        &format!("{kind} {name} holding the status set"),
        STEP,
        || {
            let now = cluster.get_json(&get);
            // The fields set (a quota's controller adds its own names to `used`; `hard` is its).
            let want = obj["status"].as_object().unwrap();
            want.iter()
                .filter(|(k, _)| *k != "hard")
                .all(|(k, v)| match v.as_object() {
                    Some(fields) => fields.iter().all(|(f, x)| &now["status"][k][f] == x),
                    None => &now["status"][k] == v,
                })
                .then_some(())
        },
    );
}

/// A CustomResourceDefinition standing in for one of Kueue's (its group, kind and status
/// subresource; the schema keeps every field), for the budgets views without Kueue built.
fn kueue_kind(cluster: &KubeCluster, kind: &str, plural: &str, scope: &str) {
    cluster
        .create(&json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.kueue.x-k8s.io")},
            "spec": {"group": "kueue.x-k8s.io", "scope": scope,
                "names": {"kind": kind, "plural": plural, "singular": kind.to_ascii_lowercase(), "listKind": format!("{kind}List")},
                "versions": [{"name": "v1beta2", "served": true, "storage": true,
                    "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
        }))
        .unwrap();
    cluster.kubectl(&[
        "wait",
        "--for=condition=Established",
        &format!("crd/{plural}.kueue.x-k8s.io"),
        "--timeout=60s",
    ]);
}

/// Budgets of every kind the views show, with their used figures set by hand (no webhook
/// runs here): `default/gpu` in gpuslice's names (`memory` hard and used, 4 GPUs of which 1
/// used, and the API server's own `pods`), `team-h/hami` in HAMi's names in a namespace
/// labelled HAMi-compat (20480 MiB of which 5120 used, 200 cores of which 50), `team-x/hami`
/// in HAMi's names where they do not count. Returns what `kubectl gpuslice quota -A -o json`
/// must show of them.
pub(crate) fn budgets(cluster: &KubeCluster, memory: (&str, &str)) -> Value {
    for (ns, hami) in [("team-h", true), ("team-x", false)] {
        let labels = if hami {
            json!({"gpuslice.io/hami-compat": "true"})
        } else {
            json!({})
        };
        cluster
            .create(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}}))
            .unwrap();
    }
    let quota = |ns: &str, name: &str, hard: Value, used: Value| {
        json!({"apiVersion": "v1", "kind": "ResourceQuota",
               "metadata": {"name": name, "namespace": ns},
               "spec": {"hard": hard}, "status": {"hard": hard, "used": used}})
    };
    create_with_status(
        cluster,
        &quota(
            NS,
            "gpu",
            json!({"limits.gpuslice.io/memory": memory.0, "limits.gpuslice.io/gpus": "4", "pods": "50"}),
            json!({"limits.gpuslice.io/memory": memory.1, "limits.gpuslice.io/gpus": "1"}),
        ),
    );
    for ns in ["team-h", "team-x"] {
        create_with_status(
            cluster,
            &quota(
                ns,
                "hami",
                json!({"limits.nvidia.com/gpumem": "20480", "limits.nvidia.com/gpucores": "200"}),
                json!({"limits.nvidia.com/gpumem": "5120", "limits.nvidia.com/gpucores": "50"}),
            ),
        );
    }
    let bytes = |q: &str| quantity(&json!(q));
    json!({
        "namespaces": [
            {"namespace": NS, "quota": "gpu",
             "names": ["limits.gpuslice.io/memory", "limits.gpuslice.io/gpus"],
             "memory": {"hard": bytes(memory.0), "used": bytes(memory.1)},
             "cores": {"hard": null, "used": 0},
             "gpus": {"hard": 4, "used": 1}},
            {"namespace": "team-h", "quota": "hami",
             "names": ["limits.nvidia.com/gpumem", "limits.nvidia.com/gpucores"],
             "memory": {"hard": 20 * GIB, "used": 5 * GIB},
             "cores": {"hard": 200, "used": 50},
             "gpus": {"hard": null, "used": 0}},
        ],
        "warnings": ["ResourceQuota team-x/hami names HAMi's limits.nvidia.com/gpumem, limits.nvidia.com/gpucores, counted only by a webhook started with --hami-compat, in namespaces labelled gpuslice.io/hami-compat=true: namespace team-x is not"],
    })
}

/// Stand-ins of Kueue's kinds and ClusterQueues `team-a` (8Gi, borrowing up to 8Gi in cohort
/// `pool`, 12Gi used of which 4Gi borrowed), `team-b` (8Gi in `pool`, unlimited borrowing,
/// nothing used) and `cpu` (no GPU memory), with LocalQueue `default/main` naming `team-a`.
/// Returns the `queues` `kubectl gpuslice quota -A -o json` must show.
pub(crate) fn queues(cluster: &KubeCluster) -> Value {
    {
        kueue_kind(cluster, "ClusterQueue", "clusterqueues", "Cluster");
        kueue_kind(cluster, "LocalQueue", "localqueues", "Namespaced");
        let cq = |name: &str, cohort: Option<&str>, resources: Value, status: Value| {
            let mut q = json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
                   "metadata": {"name": name},
                   "spec": {"namespaceSelector": {},
                            "resourceGroups": [{"coveredResources": [resources["name"]],
                                                "flavors": [{"name": "gpu", "resources": [resources]}]}]},
                   "status": status});
            if let Some(c) = cohort {
                q["spec"]["cohortName"] = json!(c);
            }
            q
        };
        create_with_status(
            cluster,
            &cq(
                "team-a",
                Some("pool"),
                json!({"name": "gpuslice.io/memory", "nominalQuota": "8Gi", "borrowingLimit": "8Gi"}),
                json!({"flavorsUsage": [{"name": "gpu", "resources": [{"name": "gpuslice.io/memory", "total": "12Gi", "borrowed": "4Gi"}]}],
                       "flavorsReservation": [{"name": "gpu", "resources": [{"name": "gpuslice.io/memory", "total": "12Gi", "borrowed": "4Gi"}]}],
                       "admittedWorkloads": 2}),
            ),
        );
        create_with_status(
            cluster,
            &cq(
                "team-b",
                Some("pool"),
                json!({"name": "gpuslice.io/memory", "nominalQuota": "8Gi"}),
                json!({"pendingWorkloads": 0}),
            ),
        );
        create_with_status(
            cluster,
            &cq(
                "cpu",
                None,
                json!({"name": "cpu", "nominalQuota": "9"}),
                json!({"pendingWorkloads": 0}),
            ),
        );
        cluster
            .create(
                &json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                            "metadata": {"name": "main", "namespace": NS},
                            "spec": {"clusterQueue": "team-a"}}),
            )
            .unwrap();
    }
    json!([
        {"name": "team-a", "cohort": "pool", "nominal": 8 * GIB, "borrowingLimit": 8 * GIB,
         "used": 12 * GIB, "borrowed": 4 * GIB, "reserved": 12 * GIB},
        {"name": "team-b", "cohort": "pool", "nominal": 8 * GIB, "borrowingLimit": null,
         "used": 0, "borrowed": 0, "reserved": 0},
    ])
}

/// `kubectl gpuslice quota` against [`budgets`]: the JSON equals what was set, the tables
/// read it in GiB, cores and GPUs, without Kueue no queue section and no error, and
/// `allocate` refuses past the budget before writing anything.
fn check_quota(cluster: &KubeCluster) {
    // No budget anywhere, no Kueue: an empty list and no queue section, no error.
    let v = json_of(cluster, &["quota", "-A", "-o", "json"]);
    assert_eq!(v, json!({"namespaces": [], "warnings": []}));
    let out = plugin(cluster, &["quota"]);
    assert!(out.status.success() && out.stdout.is_empty());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "No ResourceQuota in namespace default names gpuslice's resources (docs/quotas.md).\n"
    );

    // Without Kueue: the namespaces only.
    let made = budgets(cluster, ("10Gi", "6Gi"));
    let (stdout, stderr) = plugin_ok(cluster, &["quota", "-A", "-o", "json"]);
    let v: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v, made, "{stdout}");
    assert_eq!(
        stderr,
        format!("warning: {}\n", made["warnings"][0].as_str().unwrap())
    );
    let (table, _) = plugin_ok(cluster, &["quota", "-A"]);
    eprintln!("kubectl gpuslice quota -A:\n{table}");
    assert_eq!(
        table,
        "NAMESPACE   QUOTA   NAMES         MEMORY   MEMORY USED   CORES   CORES USED   GPUS   GPUS USED\n\
         default     gpu     gpuslice.io   10Gi     6Gi (60%)     -       -            4      1 (25%)\n\
         team-h      hami    nvidia.com    20Gi     5Gi (25%)     200     50 (25%)     -      -\n"
    );
    let (table, _) = plugin_ok(cluster, &["quota", "-n", "team-h", "-o", "wide"]);
    assert!(
        table.starts_with("QUOTA   NAMES") && table.lines().count() == 2,
        "{table}"
    );
    let (yaml, _) = plugin_ok(cluster, &["quota", "-o", "yaml"]);
    assert!(
        yaml.contains("quota: gpu") && !yaml.contains("team-h"),
        "{yaml}"
    );

    // allocate: past the budget refused before anything is written, naming the quota, the
    // resource, hard, used and asked (3 pods × 2Gi on 6Gi of 10Gi used); within it a dry run.
    let before = deploy(cluster, "web");
    let line = plugin_refused(cluster, &["allocate", "deployment/web", "--memory", "2Gi"]);
    assert_eq!(
        line,
        "error: deployment/web: 3 pod(s) of 1 GPU × 2Gi memory: exceeded quota: default/gpu, requested: limits.gpuslice.io/memory=6Gi, used: limits.gpuslice.io/memory=6Gi, limited: limits.gpuslice.io/memory=10Gi: nothing changed; raise the quota, free some of its budget, or pass --force to write anyway (the pods past the budget are refused at admission)"
    );
    let line = plugin_refused(
        cluster,
        &["allocate", "deployment/web", "--memory", "2Gi", "--dry-run"],
    );
    assert!(line.contains("exceeded quota: default/gpu"), "{line}");
    let (diff, _) = plugin_ok(
        cluster,
        &["allocate", "deployment/web", "--memory", "1Gi", "--dry-run"],
    );
    assert!(diff.contains("nothing changed"), "{diff}");
    assert_unchanged(cluster, "web", &before);
    assert!(rct_names(cluster).is_empty());

    // With Kueue's kinds: the ClusterQueues charging gpuslice.io/memory; -n: those its
    // LocalQueues name.
    let made = queues(cluster);
    let v = json_of(cluster, &["quota", "-A", "-o", "json"]);
    assert_eq!(v["queues"], made, "{v}");
    let v = json_of(cluster, &["quota", "-n", "default", "-o", "json"]);
    assert_eq!(v["queues"], json!([made[0]]), "{v}");
    let v = json_of(cluster, &["quota", "-n", "team-x", "-o", "json"]);
    assert_eq!(v["queues"], json!([]), "{v}");
    assert_eq!(v["namespaces"], json!([]), "{v}");
    let (table, _) = plugin_ok(cluster, &["quota", "-A"]);
    eprintln!("kubectl gpuslice quota -A (Kueue):\n{table}");
    let queues = table.split("\n\n").nth(1).unwrap_or_default();
    assert_eq!(
        queues,
        "CLUSTERQUEUE   COHORT   MEMORY NOMINAL   BORROWING LIMIT   MEMORY USED   BORROWED   RESERVED\n\
         team-a         pool     8Gi              8Gi               12Gi (150%)   4Gi        12Gi\n\
         team-b         pool     8Gi              unlimited         0 (0%)        0          0\n",
        "{table}"
    );
}

#[test]
#[ignore = "starts a real Kubernetes control plane, a plugin, gpuslice serve and Prometheus; the README's test command runs it"]
fn used_figures_come_from_prometheus_scraping_the_exporter() {
    use gpuslice_e2e::kubelet::claim as kubelet_claim;
    use gpuslice_e2e::serve::{value, Exporter};

    let _s = lock(&[]);
    let mut cluster = KubeCluster::up();
    let node = TestNode::with_models(&[("NVIDIA H200", "141Gi"), ("NVIDIA H200", "141Gi")]);
    cluster.add_node("node-a");
    let plugin_process = KubeletPlugin::start(&cluster, "node-a", &node);
    cluster.wait_for("the ResourceSlice of node-a", STEP, || {
        slice_of(&cluster, "node-a")
    });
    let class = workspace().join("packaging/kubernetes/dra/deviceclass.yaml");
    cluster.kubectl(&["create", "-f", &class.display().to_string()]);
    cluster
        .create(&resource_claim("train", 1, "20Gi", "30", None))
        .unwrap();
    cluster.create(&pod("train", "train")).unwrap();
    bound_node(&cluster, "train");
    let claim = cluster.get_json(&["resourceclaim", "train", "-n", NS]);
    let uid = claim["metadata"]["uid"].as_str().unwrap().to_string();
    let device = claim["status"]["allocation"]["devices"]["results"][0]["device"]
        .as_str()
        .unwrap()
        .to_string();
    // The kubelet's prepare books the claim's slice on the node: the exporter shows it.
    let mut kubelet = plugin_process.kubelet();
    let answer = kubelet.prepare(kubelet_claim(NS, "train", &uid)).unwrap();
    assert_eq!(answer.error, "", "{}", plugin_process.log_text());

    // Unreachable: n/a and one warning line naming it, never zeros.
    let out = plugin(&cluster, &["pods", "--prometheus", "http://127.0.0.1:1"]);
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("n/a") && stderr.contains("http://127.0.0.1:1 is unreachable"),
        "{stderr}"
    );
    let table = String::from_utf8_lossy(&out.stdout);
    let row = table.lines().find(|l| l.starts_with("train")).unwrap();
    assert!(row.contains("n/a") && !row.contains("0 (0%)"), "{table}");

    let exporter = Exporter::start(&node);
    let prometheus = Prometheus::start(&[exporter.addr]);
    let url = prometheus.url.clone();
    // Once Prometheus has scraped the exporter, the used figures are the exporter's.
    let deadline = std::time::Instant::now() + STEP;
    let pods = loop {
        let out = plugin(&cluster, &["pods", "-o", "json", "--prometheus", &url]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        if v["pods"][0]["memoryUsed"].is_u64() && v["usageUnavailable"].is_null() {
            break v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "Prometheus at {url} never had the exporter's slice series: {v}\n{}\nexporter:\n{}\nprometheus log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            exporter.text(),
            prometheus.get("/api/v1/query?query=%7B__name__%3D~%22gpuslice_(slice%7Cgpu_memory_used).*%22%7D")
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let series = exporter.scrape();
    let uuid = node.uuid(device.strip_prefix("gpu-").unwrap().parse().unwrap());
    let want = |name: &str| {
        value(&series, name, &[("uuid", uuid.as_str()), ("namespace", NS)])
            .unwrap_or_else(|| panic!("no {name} for {uuid} in the exporter's scrape"))
            as u64
    };
    let p = &pods["pods"][0];
    assert_eq!(
        (p["pod"].as_str(), p["container"].as_str()),
        (Some("train"), Some("main"))
    );
    assert_eq!(p["memoryLimit"], 20 * GIB);
    assert_eq!(p["memoryLimit"], want("gpuslice_slice_memory_limit_bytes"));
    assert_eq!(
        p["memoryUsed"],
        want("gpuslice_slice_memory_used_bytes"),
        "{p}"
    );
    assert_eq!(
        p["memoryUsedDriver"],
        want("gpuslice_slice_nvml_memory_used_bytes"),
        "{p}"
    );
    let (gpus, warning) = plugin_ok(&cluster, &["gpus", "-o", "json", "--prometheus", &url]);
    assert!(warning.is_empty(), "{warning}");
    let gpus: Value = serde_json::from_str(&gpus).unwrap();
    for g in gpus["gpus"].as_array().unwrap() {
        let u = g["uuid"].as_str().unwrap();
        let used = value(&series, "gpuslice_gpu_memory_used_bytes", &[("uuid", u)]).unwrap();
        let util = value(&series, "gpuslice_gpu_utilization_ratio", &[("uuid", u)]).unwrap();
        assert_eq!(g["memory"]["used"], used as u64, "{g}");
        assert_eq!(g["cores"]["used"], (util * 100.0).round() as u64, "{g}");
    }
    // The claim's slice holds 20Gi and no process uses it: idle.
    let held = gpus["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["device"] == device.as_str())
        .unwrap();
    assert_eq!(held["claims"][0]["name"], "train", "{held}");
    assert_eq!(held["claims"][0]["idle"], true, "{held}");
    assert_eq!(held["idleSlices"], 1, "{held}");
    let (table, _) = plugin_ok(&cluster, &["pods", "--prometheus", &url]);
    eprintln!("kubectl gpuslice pods --prometheus {url}:\n{table}");
    let (table, _) = plugin_ok(&cluster, &["nodes", "-o", "wide", "--prometheus", &url]);
    eprintln!("kubectl gpuslice nodes -o wide --prometheus {url}:\n{table}");
    assert!(!table.contains("n/a"), "{table}\n{}", prometheus.log());

    let answer = kubelet.unprepare(kubelet_claim(NS, "train", &uid)).unwrap();
    assert_eq!(answer.error, "");
    drop(prometheus);
    drop(exporter);
    drop(plugin_process);
    cluster.down();
}

/// The pods of Deployment `app` not being deleted, once there are `replicas` of them and
/// `ready` accepts each (`None` from `ready`: not yet); what `ready` gave for each. Pods being
/// deleted are removed at once, as the kubelet these nodes lack would once they stopped, so
/// that their claims are released.
fn live_pods<T>(
    cluster: &KubeCluster,
    app: &str,
    replicas: usize,
    what: &str,
    mut ready: impl FnMut(&Value) -> Option<T>,
) -> Vec<T> {
    cluster.wait_for(&format!("{replicas} pods of {app} {what}"), STEP, || {
        let pods = cluster.get_json(&["pods", "-n", NS, "-l", &format!("app={app}")]);
        let (live, gone): (Vec<&Value>, Vec<&Value>) = pods["items"]
            .as_array()?
            .iter()
            .partition(|p| p["metadata"]["deletionTimestamp"].is_null());
        if !gone.is_empty() {
            let mut args = vec![
                "delete",
                "pod",
                "-n",
                NS,
                "--force",
                "--grace-period=0",
                "--wait=false",
            ];
            args.extend(gone.iter().filter_map(|p| p["metadata"]["name"].as_str()));
            let _ = cluster.kubectl_output(&args, None);
        }
        if live.len() != replicas {
            return None;
        }
        live.into_iter().map(&mut ready).collect()
    })
}

/// The allocation results of pod `p`'s only claim, once the scheduler wrote them.
fn allocated(cluster: &KubeCluster, p: &Value) -> Option<Vec<Value>> {
    let statuses = p["status"]["resourceClaimStatuses"].as_array()?;
    if statuses.len() != 1 {
        return None;
    }
    let claim = statuses[0]["resourceClaimName"].as_str()?;
    let c = cluster.get_json(&["resourceclaim", claim, "-n", NS]);
    c["status"]["allocation"]["devices"]["results"]
        .as_array()
        .cloned()
}

/// Every ResourceClaimTemplate of the namespace with the value of its managed-by label.
fn all_templates(cluster: &KubeCluster) -> BTreeMap<String, String> {
    cluster.get_json(&["resourceclaimtemplates", "-n", NS])["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["metadata"]["name"].as_str().unwrap().to_string(),
                t["metadata"]["labels"]["app.kubernetes.io/managed-by"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect()
}

/// A Node object and a real plugin publishing 2 × H200 141Gi on it, and the DeviceClass
/// `class` (a file of packaging/kubernetes/dra).
fn one_plugin_node(cluster: &KubeCluster, node: &TestNode, class: &str) -> KubeletPlugin {
    cluster.add_node("node-a");
    let p = KubeletPlugin::start(cluster, "node-a", node);
    let class = workspace().join("packaging/kubernetes/dra").join(class);
    cluster.kubectl(&["create", "-f", &class.display().to_string()]);
    p
}

/// Waits until the webhook, which reads the slices in the background, knows that the most
/// GPUs a node has is `most` (it refuses more with a line saying so).
fn webhook_knows(cluster: &KubeCluster, most: u32) {
    cluster.wait_for(
        &format!("the webhook to see nodes of {most} GPUs"),
        STEP,
        || {
            let probe = json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "probe", "namespace": NS},
                "spec": {"containers": [{"name": "main", "image": "gpuslice.invalid/x:1",
                         "resources": {"limits": {"gpuslice.io/gpus": (most + 1).to_string()}}}]},
            });
            let out = cluster.kubectl_output(
                &["create", "--dry-run=server", "-f", "-"],
                Some(probe.to_string().as_bytes()),
            );
            String::from_utf8_lossy(&out.stderr)
                .contains(&format!("at most {most} GPUs"))
                .then_some(())
        },
    );
}

#[test]
#[ignore = "starts a real Kubernetes control plane with the webhook and a plugin process; the README's test command runs it"]
fn allocate_writes_the_limits_form_with_the_webhook_and_the_claim_form_without() {
    use gpuslice_dra::claim_shape::{claim_spec, Mode, Shape};

    let _s = lock(&[]);
    let mut cluster = KubeCluster::up_with(&["--webhook"], &[]);
    let node = TestNode::with_models(&[("NVIDIA H200", "141Gi"), ("NVIDIA H200", "141Gi")]);
    let plugin_process = one_plugin_node(&cluster, &node, "deviceclass.yaml");
    cluster.wait_for("the ResourceSlice of node-a", STEP, || {
        slice_of(&cluster, "node-a")
    });
    webhook_knows(&cluster, 2);
    cluster.create(&deployment("web", 2, None)).unwrap();
    let original = deploy(&cluster, "web")["spec"]["template"].clone();
    live_pods(&cluster, "web", 2, "bound", |p| {
        p["spec"]["nodeName"].as_str().map(|_| ())
    });

    // With the webhook installed: the limits form, and the output says so and why.
    let (said, _) = plugin_ok(
        &cluster,
        &[
            "allocate",
            "deployment/web",
            "--memory",
            "8Gi",
            "--cores",
            "30",
            "-c",
            "main",
        ],
    );
    eprintln!("allocate with the webhook: {said}");
    assert!(said.contains("deployment/web allocated"), "{said}");
    assert!(said.contains("limits form"), "{said}");
    assert!(
        said.contains("the webhook pods.gpuslice.io is installed (mutatingwebhookconfiguration/gpuslice-webhook)"),
        "{said}"
    );
    let spec = deploy(&cluster, "web")["spec"]["template"]["spec"].clone();
    assert_eq!(
        spec["containers"][0]["resources"],
        json!({"limits": {"gpuslice.io/gpus": "1", "gpuslice.io/memory": "8Gi", "gpuslice.io/cores": "30"}}),
        "{spec}"
    );
    assert!(
        spec["containers"][1]["resources"]["limits"].is_null(),
        "{spec}"
    );
    assert!(spec["resourceClaims"].is_null(), "{spec}");
    assert!(
        all_templates(&cluster)
            .values()
            .all(|by| by != "kubectl-gpuslice"),
        "the limits form writes no template of the console"
    );
    // The webhook gives each new pod a claim the scheduler allocates on node-a's GPUs.
    let placed = live_pods(&cluster, "web", 2, "with a claim of 8Gi", |p| {
        let r = allocated(&cluster, p)?;
        (r.len() == 1 && r[0]["consumedCapacity"]["memory"] == "8Gi").then(|| r[0].clone())
    });
    for r in &placed {
        assert_eq!(r["pool"], "node-a", "{r}");
        assert_eq!(
            r["consumedCapacity"],
            json!({"memory": "8Gi", "cores": "30"}),
            "{r}"
        );
    }
    let webhook_templates: BTreeMap<String, String> = all_templates(&cluster);
    assert!(
        !webhook_templates.is_empty()
            && webhook_templates
                .values()
                .all(|by| by == "gpuslice-webhook"),
        "{webhook_templates:?}"
    );
    let pods = json_of(&cluster, &["pods", "-o", "json"]);
    let web: Vec<&Value> = pods["pods"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["workload"] == "deployment/web" && p["memoryLimit"] == 8 * GIB)
        .collect();
    assert!(
        web.len() >= 2
            && web
                .iter()
                .all(|p| p["container"] == "main" && p["coresShare"] == 30),
        "{pods}"
    );

    // Edit: another size; the form the workload has, the limits changed in place.
    let (said, _) = plugin_ok(
        &cluster,
        &[
            "allocate",
            "deployment/web",
            "--memory",
            "12Gi",
            "-c",
            "main",
        ],
    );
    eprintln!("allocate again: {said}");
    assert!(
        said.contains("limits form") && said.contains("the workload has the limits form"),
        "{said}"
    );
    let spec = deploy(&cluster, "web")["spec"]["template"]["spec"].clone();
    assert_eq!(
        spec["containers"][0]["resources"],
        json!({"limits": {"gpuslice.io/gpus": "1", "gpuslice.io/memory": "12Gi"}}),
        "{spec}"
    );
    live_pods(&cluster, "web", 2, "with a claim of 12Gi", |p| {
        let r = allocated(&cluster, p)?;
        (r.len() == 1 && r[0]["consumedCapacity"]["memory"] == "12Gi" && r[0]["pool"] == "node-a")
            .then_some(())
    });

    // --form claim overrides the form the workload has (a dry run: the diff, nothing changed).
    let before = deploy(&cluster, "web");
    let (diff, _) = plugin_ok(
        &cluster,
        &[
            "allocate",
            "deployment/web",
            "--memory",
            "12Gi",
            "-c",
            "main",
            "--form",
            "claim",
            "--dry-run",
        ],
    );
    eprintln!("allocate --form claim --dry-run:\n{diff}");
    assert!(
        diff.contains("+++ resourceclaimtemplate/web-deployment-gpuslice-")
            && diff.contains("+- name: gpuslice")
            && diff
                .lines()
                .any(|l| l.starts_with('-') && l[1..].trim() == "gpuslice.io/memory: 12Gi")
            && diff.contains("claim form, capacity mode")
            && diff.contains("because --form claim")
            && diff.contains("nothing changed"),
        "{diff}"
    );
    assert_unchanged(&cluster, "web", &before);

    // A template of a job's ranks whose two containers would each get the slice: the webhook
    // would refuse every pod of it, so allocate refuses it with the webhook's words, with
    // --force (which overrides only room and budget) and in its dry run too.
    let mut rank = deployment("rank", 0, None);
    rank["spec"]["template"]["metadata"]["labels"]["gpuslice.io/job"] = json!("train");
    cluster.create(&rank).unwrap();
    let rank_before = deploy(&cluster, "rank");
    for extra in [&["--force"][..], &["--force", "--dry-run"]] {
        let mut args = vec!["allocate", "deployment/rank", "--memory", "1Gi"];
        args.extend_from_slice(extra);
        let line = plugin_refused(&cluster, &args);
        assert!(
            line.contains("deployment/rank: the webhook would refuse its pods: spec.containers[0], spec.containers[1]: containers of a rank of job gpuslice.io/job=train"),
            "{}: {line}",
            args.join(" ")
        );
    }
    assert_unchanged(&cluster, "rank", &rank_before);

    // Release: the template exactly as before; the pods made after it have no claim.
    let (said, _) = plugin_ok(&cluster, &["release", "deployment/web"]);
    assert!(said.contains("released (limits form removed)"), "{said}");
    assert_eq!(deploy(&cluster, "web")["spec"]["template"], original);
    live_pods(&cluster, "web", 2, "without a claim", |p| {
        (p["spec"]["resourceClaims"].is_null()
            && p["spec"]["containers"][0]["resources"]["limits"].is_null())
        .then_some(())
    });

    cluster.wait_for("the claims of web's pods to be removed", STEP, || {
        cluster.get_json(&["resourceclaims", "-n", NS])["items"]
            .as_array()?
            .is_empty()
            .then_some(())
    });

    // Without the webhook: the claim form, holding what the claim builder writes; here two
    // GPUs, which the scheduler gives as two different GPUs.
    cluster.kubectl(&["delete", "mutatingwebhookconfiguration", "gpuslice-webhook"]);
    // A template of the console for another workload, which releasing web must leave.
    cluster
        .create(&json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "other-deployment-gpuslice-0", "namespace": NS,
                         "labels": {"app.kubernetes.io/managed-by": "kubectl-gpuslice"},
                         "annotations": {"gpuslice.io/workload": "deployment/other"}},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpuslice.io"}}]}}},
        }))
        .unwrap();
    let foreign = all_templates(&cluster);
    let (said, _) = plugin_ok(
        &cluster,
        &[
            "allocate",
            "deployment/web",
            "--memory",
            "20Gi",
            "--cores",
            "30",
            "--gpus",
            "2",
            "-c",
            "main",
        ],
    );
    eprintln!("allocate without the webhook: {said}");
    assert!(
        said.contains("claim form, capacity mode")
            && said.contains("no webhook pods.gpuslice.io is installed"),
        "{said}"
    );
    let mine: Vec<String> = all_templates(&cluster)
        .into_keys()
        .filter(|t| !foreign.contains_key(t))
        .collect();
    assert_eq!(mine.len(), 1, "{mine:?}");
    let t = cluster.get_json(&["resourceclaimtemplate", &mine[0], "-n", NS]);
    // What the API server stored, less the field it defaults (allocationMode: ExactCount).
    let mut stored = t["spec"]["spec"].clone();
    for r in stored["devices"]["requests"].as_array_mut().unwrap() {
        assert_eq!(r["exactly"]["allocationMode"], "ExactCount", "{t}");
        r["exactly"]
            .as_object_mut()
            .unwrap()
            .remove("allocationMode");
    }
    let (want, _) = claim_spec(
        &Mode::Capacity,
        &Shape {
            gpus: 2,
            memory: Some(20 * GIB),
            cores: Some(30),
            selectors: Vec::new(),
        },
        "test",
    )
    .unwrap();
    assert_eq!(stored, serde_json::to_value(&want).unwrap(), "{t}");
    assert_eq!(
        t["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "kubectl-gpuslice"
    );
    let spec = deploy(&cluster, "web")["spec"]["template"]["spec"].clone();
    assert_eq!(
        spec["resourceClaims"],
        json!([{"name": "gpuslice", "resourceClaimTemplateName": mine[0]}]),
        "{spec}"
    );
    assert!(
        spec["containers"][0]["resources"]["limits"].is_null(),
        "{spec}"
    );
    let placed = live_pods(&cluster, "web", 2, "with a claim on two GPUs", |p| {
        allocated(&cluster, p).filter(|r| r.len() == 2)
    });
    for r in &placed {
        assert_ne!(
            r[0]["device"], r[1]["device"],
            "two GPUs, not one twice: {r:?}"
        );
        for one in r {
            assert_eq!(
                one["consumedCapacity"],
                json!({"memory": "20Gi", "cores": "30"}),
                "{one}"
            );
        }
    }

    // Release: the reference and the console's template go; templates it did not write (the
    // webhook's, another workload's) stay.
    let (said, _) = plugin_ok(&cluster, &["release", "deployment/web"]);
    assert!(said.contains("released (claim form removed)"), "{said}");
    assert_eq!(deploy(&cluster, "web")["spec"]["template"], original);
    assert_eq!(all_templates(&cluster), foreign);

    drop(plugin_process);
    cluster.down();
}

/// A claim of `k` slots of one GPU (slot mode), of the GPUs `cel` selects.
fn slot_claim(name: &str, k: u32, cel: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "slots.gpuslice.io", "count": k,
                          "selectors": [{"cel": {"expression": cel}}]}}],
            "constraints": [{"requests": ["gpu"], "matchAttribute": "gpuslice.io/uuid"}],
        }},
    })
}

/// The GPU a slot device belongs to (`gpu-1-slot-4` → `gpu-1`).
fn gpu_of_slot(device: &str) -> String {
    device
        .rsplit_once("-slot-")
        .unwrap_or_else(|| panic!("{device} is not a slot device"))
        .0
        .to_string()
}

/// One GPU as the test reads it from the slot slices and the allocated claims (never through
/// the console's code): memory of its slots, slots, and the slots claims hold.
#[derive(Debug, Default, PartialEq)]
struct SlotGpu {
    memory: u64,
    slots: u64,
    memory_allocated: u64,
    slots_allocated: u64,
    /// The compute shares (opaque parameters) of the claims on it.
    cores_allocated: u64,
    claims: Vec<String>,
}

/// (node, device name) → a figure.
type ByDevice<T> = BTreeMap<(String, String), T>;

/// The GPUs as [`SlotGpu`]s by (node, GPU), and each slot device's memory by (node, slot).
fn slot_gpus(cluster: &KubeCluster) -> (ByDevice<SlotGpu>, ByDevice<u64>) {
    let mut gpus: ByDevice<SlotGpu> = BTreeMap::new();
    let mut slot_memory: ByDevice<u64> = BTreeMap::new();
    for s in cluster.get_json(&["resourceslices"])["items"]
        .as_array()
        .unwrap()
    {
        if s["spec"]["driver"] != "gpuslice.io" {
            continue;
        }
        let pool = s["spec"]["pool"]["name"].as_str().unwrap().to_string();
        for d in s["spec"]["devices"].as_array().unwrap() {
            let name = d["name"].as_str().unwrap();
            let memory = quantity(&d["capacity"]["memory"]["value"]);
            let g = gpus.entry((pool.clone(), gpu_of_slot(name))).or_default();
            g.memory += memory;
            g.slots += 1;
            slot_memory.insert((pool.clone(), name.to_string()), memory);
        }
    }
    for c in cluster.get_json(&["resourceclaims", "-n", NS])["items"]
        .as_array()
        .unwrap()
    {
        for r in c["status"]["allocation"]["devices"]["results"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let pool = r["pool"].as_str().unwrap().to_string();
            let device = r["device"].as_str().unwrap().to_string();
            let g = gpus.get_mut(&(pool.clone(), gpu_of_slot(&device))).unwrap();
            g.memory_allocated += slot_memory[&(pool, device)];
            g.slots_allocated += 1;
            let name = format!("{NS}/{}", c["metadata"]["name"].as_str().unwrap());
            if !g.claims.contains(&name) {
                // The claim's share, once per GPU it holds slots of.
                g.cores_allocated += c["spec"]["devices"]["config"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|x| x["opaque"]["parameters"]["cores"].as_u64())
                    .sum::<u64>();
                g.claims.push(name);
            }
        }
    }
    for g in gpus.values_mut() {
        g.claims.sort();
    }
    (gpus, slot_memory)
}

/// `gpus -o json` against [`slot_gpus`]: one row per GPU, never per slot.
fn check_slot_figures(cluster: &KubeCluster) -> BTreeMap<(String, String), SlotGpu> {
    let (want, _) = slot_gpus(cluster);
    let gpus = json_of(cluster, &["gpus", "-o", "json"]);
    let got: BTreeMap<(String, String), SlotGpu> = gpus["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            let mut claims: Vec<String> = g["claims"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| {
                    format!(
                        "{}/{}",
                        c["namespace"].as_str().unwrap(),
                        c["name"].as_str().unwrap()
                    )
                })
                .collect();
            claims.sort();
            assert_eq!(
                g["slots"]["size"].as_u64().unwrap() * g["slots"]["published"].as_u64().unwrap(),
                g["memory"]["capacity"].as_u64().unwrap(),
                "{g}"
            );
            (
                (
                    g["node"].as_str().unwrap().to_string(),
                    g["device"].as_str().unwrap().to_string(),
                ),
                SlotGpu {
                    memory: g["memory"]["capacity"].as_u64().unwrap(),
                    slots: g["slots"]["published"].as_u64().unwrap(),
                    memory_allocated: g["memory"]["allocated"].as_u64().unwrap(),
                    slots_allocated: g["slots"]["allocated"].as_u64().unwrap(),
                    cores_allocated: g["cores"]["allocated"].as_u64().unwrap(),
                    claims,
                },
            )
        })
        .collect();
    assert_eq!(
        got, want,
        "gpus -o json against the slot slices and claims: {gpus}"
    );
    want
}

#[test]
#[ignore = "starts a real Kubernetes control plane without consumable capacity, the webhook and two plugin processes; the README's test command runs it"]
fn in_slot_mode_the_views_show_gpus_and_allocate_writes_slot_claims() {
    let _s = lock(&[]);
    let mut cluster = KubeCluster::up_with(
        &[
            "--webhook",
            "--feature-gates",
            "DRAConsumableCapacity=false",
        ],
        &[],
    );
    let nodes: BTreeMap<&str, TestNode> = [
        (
            "node-a",
            TestNode::with_models(&[("NVIDIA H200", "141Gi"), ("NVIDIA H200", "141Gi")]),
        ),
        ("node-b", TestNode::with_models(&[("NVIDIA L4", "24Gi")])),
    ]
    .into_iter()
    .collect();
    let gpu_count: BTreeMap<&str, usize> = [("node-a", 2), ("node-b", 1)].into_iter().collect();
    for name in nodes.keys() {
        cluster.add_node(name);
    }
    let plugins: Vec<KubeletPlugin> = nodes
        .iter()
        .map(|(name, node)| KubeletPlugin::start(&cluster, name, node))
        .collect();
    let slots = gpuslice_config::DEFAULT_SLOTS_PER_GPU as usize;
    for name in nodes.keys() {
        cluster.wait_for(&format!("the slot slice of {name}"), STEP, || {
            slice_of(&cluster, name).filter(|s| {
                s["spec"]["devices"].as_array().map(Vec::len) == Some(gpu_count[name] * slots)
            })
        });
    }
    let class = workspace().join("packaging/kubernetes/dra/deviceclass-slots.yaml");
    cluster.kubectl(&["create", "-f", &class.display().to_string()]);
    webhook_knows(&cluster, 2);

    // nodes: the mode, and each node's capacity the sum of its slots.
    let want = check_slot_figures(&cluster);
    assert_eq!(want.len(), 3, "{want:?}");
    let figures = json_of(&cluster, &["nodes", "-o", "json"]);
    for n in figures["nodes"].as_array().unwrap() {
        let name = n["name"].as_str().unwrap();
        let mine: Vec<&SlotGpu> = want
            .iter()
            .filter(|(k, _)| k.0 == name)
            .map(|(_, g)| g)
            .collect();
        assert_eq!(n["gpus"].as_u64().unwrap(), mine.len() as u64, "{n}");
        assert_eq!(
            n["memory"]["capacity"].as_u64().unwrap(),
            mine.iter().map(|g| g.memory).sum::<u64>(),
            "{n}"
        );
        assert!(
            n["mode"]
                .as_str()
                .unwrap()
                .starts_with(&format!("slots ({slots} per GPU × ")),
            "{n}"
        );
    }
    let (table, _) = plugin_ok(&cluster, &["nodes"]);
    eprintln!("kubectl gpuslice nodes (slot mode):\n{table}");
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].trim_end().ends_with("MODE"), "{table}");
    for l in &lines[1..] {
        assert!(l.contains(&format!("slots ({slots} per GPU")), "{table}");
    }

    // Slot claims placed by the scheduler: the figures gather their slots into their GPU.
    for (name, k, cel) in [
        ("l4", 3, L4),
        (
            "h200",
            2,
            "device.attributes[\"gpuslice.io\"].productName == \"NVIDIA H200\"",
        ),
    ] {
        cluster.create(&slot_claim(name, k, cel)).unwrap();
        cluster.create(&pod(name, name)).unwrap();
        bound_node(&cluster, name);
    }
    let want = check_slot_figures(&cluster);
    assert_eq!(want[&("node-b".into(), "gpu-0".into())].slots_allocated, 3);
    assert_eq!(
        want[&("node-b".into(), "gpu-0".into())].memory_allocated,
        12 * GIB
    );
    assert_eq!(want.values().map(|g| g.slots_allocated).sum::<u64>(), 5);
    let (table, _) = plugin_ok(&cluster, &["gpus"]);
    eprintln!("kubectl gpuslice gpus (slot mode):\n{table}");
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(
        lines.len(),
        2 + 3,
        "a header, the total and one row per GPU: {table}"
    );
    assert!(
        lines[1].starts_with("* ") && lines[1].contains("59Gi"),
        "2 × 24064Mi + 3 × 4Gi: {table}"
    );
    for (l, (node, gpu)) in lines[2..].iter().zip([
        ("node-a", "gpu-0"),
        ("node-a", "gpu-1"),
        ("node-b", "gpu-0"),
    ]) {
        assert!(
            l.starts_with(node) && l.contains(&format!(" {gpu} ")),
            "{table}"
        );
    }
    let pods = json_of(&cluster, &["pods", "-o", "json"]);
    let (_, slot_memory) = slot_gpus(&cluster);
    for name in ["l4", "h200"] {
        let c = cluster.get_json(&["resourceclaim", name, "-n", NS]);
        let results = c["status"]["allocation"]["devices"]["results"]
            .as_array()
            .unwrap();
        let node = results[0]["pool"].as_str().unwrap();
        let held: u64 = results
            .iter()
            .map(|r| slot_memory[&(node.to_string(), r["device"].as_str().unwrap().to_string())])
            .sum();
        let rows: Vec<&Value> = pods["pods"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["pod"] == name)
            .collect();
        assert_eq!(rows.len(), 1, "{pods}");
        assert_eq!(rows[0]["container"], "main", "{pods}");
        assert_eq!(rows[0]["node"], node, "{pods}");
        assert_eq!(
            rows[0]["device"],
            gpu_of_slot(results[0]["device"].as_str().unwrap()),
            "{pods}"
        );
        assert_eq!(rows[0]["memoryLimit"].as_u64().unwrap(), held, "{pods}");
    }
    let (table, _) = plugin_ok(&cluster, &["pods"]);
    eprintln!("kubectl gpuslice pods (slot mode):\n{table}");

    // The fit check counts free slots of each GPU's size: 8Gi is 2 of the L4's 4Gi slots and
    // 1 of an H200's 24064Mi, so the free slots (L4: 3, H200s: 4 and 6) hold 1 + 4 + 6 pods;
    // 12 do not fit.
    cluster.create(&deployment("many", 12, None)).unwrap();
    let line = plugin_refused(
        &cluster,
        &[
            "allocate",
            "deployment/many",
            "--memory",
            "8Gi",
            "-c",
            "main",
        ],
    );
    eprintln!("allocate 12 × 8Gi in slot mode: {line}");
    assert!(line.contains("fits 11 (node-a: 10, node-b: 1)"), "{line}");
    cluster.kubectl(&["delete", "deployment", "many", "-n", NS, "--wait=false"]);

    // The one claim builder on this cluster of two slot sizes: each size's own slot count
    // (a prioritized list). 8Gi lands as 1 H200 slot or 2 L4 slots, and prepare books that
    // (never 2 H200 slots, 47Gi); 30Gi, above 6 × 4Gi, is admitted and placed on an H200.
    {
        use gpuslice_dra::claim_shape::{claim_spec, PublishedGpus, Shape};
        let slices: Vec<_> =
            serde_json::from_value(cluster.get_json(&["resourceslices"])["items"].clone()).unwrap();
        let mode = PublishedGpus::from_slices(slices.as_slice()).mode;
        let h200_slot = slot_memory[&("node-a".to_string(), "gpu-0-slot-0".to_string())];
        for (name, memory) in [("sized-8", 8 * GIB), ("sized-30", 30 * GIB)] {
            let shape = Shape {
                gpus: 1,
                memory: Some(memory),
                ..Default::default()
            };
            let (spec, _) = claim_spec(&mode, &shape, "test").unwrap();
            assert!(
                spec.devices.as_ref().unwrap().requests.as_ref().unwrap()[0]
                    .first_available
                    .is_some(),
                "two slot sizes: a prioritized list: {spec:?}"
            );
            let claim = json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": NS},
                "spec": spec,
            });
            cluster.create(&claim).unwrap();
            cluster.create(&pod(name, name)).unwrap();
            let node = bound_node(&cluster, name);
            let c = cluster.get_json(&["resourceclaim", name, "-n", NS]);
            let results = c["status"]["allocation"]["devices"]["results"]
                .as_array()
                .unwrap()
                .clone();
            let gpus: std::collections::BTreeSet<String> = results
                .iter()
                .map(|x| gpu_of_slot(x["device"].as_str().unwrap()))
                .collect();
            assert_eq!(gpus.len(), 1, "the slots of one GPU: {c}");
            let held: u64 = results
                .iter()
                .map(|r| slot_memory[&(node.clone(), r["device"].as_str().unwrap().to_string())])
                .sum();
            let (want_node, want_slots) = match (memory == 8 * GIB, node.as_str()) {
                (true, "node-a") => ("node-a", 1),
                (true, _) => ("node-b", 2),
                (false, _) => ("node-a", 2),
            };
            assert_eq!(
                (node.as_str(), results.len()),
                (want_node, want_slots),
                "{name}: {c}"
            );
            assert!(
                results
                    .iter()
                    .all(|r| r["request"].as_str().unwrap().starts_with("gpu/slots-")),
                "subrequest results: {c}"
            );
            assert!(
                held >= memory && held <= memory.max(h200_slot) + h200_slot,
                "{held}"
            );
            // The kubelet prepares it: the plugin books what the allocation names on that GPU.
            let uid = c["metadata"]["uid"].as_str().unwrap();
            let index = usize::from(node == "node-b");
            let answer = plugins[index]
                .kubelet()
                .prepare(gpuslice_e2e::kubelet::claim(NS, name, uid))
                .unwrap();
            assert_eq!(answer.error, "", "{name}: {}", plugins[index].log_text());
            let text =
                std::fs::read_to_string(nodes[node.as_str()].state_dir().join("registry.json"))
                    .unwrap();
            let file: Value = serde_json::from_str(&text).unwrap();
            let booked: Vec<u64> = file["reservations"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|r| r["owner"]["claim_uid"] == uid)
                .flat_map(|r| r["gpus"].as_array().unwrap().clone())
                .map(|g| g["memory"].as_u64().unwrap())
                .collect();
            assert_eq!(booked, [held], "{name} on {node}: {text}");
            eprintln!(
                "{name}: {} slot(s) on {node}, {held} bytes booked",
                results.len()
            );
        }
    }

    // allocate writes the slot shape (k slots of one GPU, its share as opaque parameters);
    // the scheduler allocates it, each pod's slots on one GPU and at least the memory asked.
    cluster.create(&deployment("web", 2, None)).unwrap();
    let original = deploy(&cluster, "web")["spec"]["template"].clone();
    let (said, _) = plugin_ok(
        &cluster,
        &[
            "allocate",
            "deployment/web",
            "--memory",
            "8Gi",
            "--cores",
            "30",
            "-c",
            "main",
            "--form",
            "claim",
        ],
    );
    eprintln!("allocate in slot mode: {said}");
    assert!(
        said.contains("claim form, slots (") && said.contains("because --form claim"),
        "{said}"
    );
    let rcts = rct_names(&cluster);
    assert_eq!(rcts.len(), 1, "{rcts:?}");
    let t = cluster.get_json(&["resourceclaimtemplate", &rcts[0], "-n", NS]);
    let devices = &t["spec"]["spec"]["devices"];
    // Two slot sizes: a subrequest per size, each its own count (30 cores take 2 slots of
    // either size).
    let subs = devices["requests"][0]["firstAvailable"].as_array().unwrap();
    assert_eq!(subs.len(), 2, "{t}");
    for sub in subs {
        assert_eq!(sub["deviceClassName"], "slots.gpuslice.io", "{t}");
        assert!(sub.get("capacity").is_none(), "{t}");
    }
    let k = subs[0]["count"].as_u64().unwrap();
    assert_eq!(subs[1]["count"].as_u64(), Some(k), "{t}");
    assert_eq!(
        devices["constraints"],
        json!([{"requests": ["gpu"], "matchAttribute": "gpuslice.io/uuid"}]),
        "{t}"
    );
    assert_eq!(
        devices["config"][0]["opaque"]["driver"], "gpuslice.io",
        "{t}"
    );
    assert_eq!(
        devices["config"][0]["opaque"]["parameters"]["cores"], 30,
        "{t}"
    );
    let placed = live_pods(&cluster, "web", 2, "with an allocated slot claim", |p| {
        allocated(&cluster, p).filter(|r| r.len() as u64 == k)
    });
    for r in &placed {
        let node = r[0]["pool"].as_str().unwrap();
        let gpus: std::collections::BTreeSet<String> = r
            .iter()
            .map(|x| gpu_of_slot(x["device"].as_str().unwrap()))
            .collect();
        assert_eq!(gpus.len(), 1, "the slots of one GPU: {r:?}");
        let held: u64 = r
            .iter()
            .map(|x| slot_memory[&(node.to_string(), x["device"].as_str().unwrap().to_string())])
            .sum();
        assert!(held >= 8 * GIB, "{held} bytes for 8Gi: {r:?}");
    }
    let figures = check_slot_figures(&cluster);
    assert_eq!(
        figures.values().map(|g| g.cores_allocated).sum::<u64>(),
        2 * 30,
        "the two web pods' shares: {figures:?}"
    );

    let console_claim = t["spec"]["spec"].clone();

    let (said, _) = plugin_ok(&cluster, &["release", "deployment/web"]);
    assert!(said.contains("released (claim form removed)"), "{said}");
    assert_eq!(deploy(&cluster, "web")["spec"]["template"], original);
    assert!(rct_names(&cluster).is_empty());

    // With the webhook installed, the limits form: the webhook writes each pod the same slot
    // claim the console wrote (one builder), which the scheduler allocates.
    let (said, _) = plugin_ok(
        &cluster,
        &[
            "allocate",
            "deployment/web",
            "--memory",
            "8Gi",
            "--cores",
            "30",
            "-c",
            "main",
        ],
    );
    eprintln!("allocate in slot mode with the webhook: {said}");
    assert!(
        said.contains("limits form") && said.contains("the webhook pods.gpuslice.io is installed"),
        "{said}"
    );
    live_pods(&cluster, "web", 2, "with the webhook's slot claim", |p| {
        let r = allocated(&cluster, p)?;
        let gpus: std::collections::BTreeSet<String> = r
            .iter()
            .map(|x| gpu_of_slot(x["device"].as_str().unwrap()))
            .collect();
        (r.len() as u64 == k && gpus.len() == 1).then_some(())
    });
    let by_webhook: Vec<String> = all_templates(&cluster)
        .into_iter()
        .filter(|(_, by)| by == "gpuslice-webhook")
        .map(|(name, _)| name)
        .collect();
    assert_eq!(by_webhook.len(), 1, "{by_webhook:?}");
    let w = cluster.get_json(&["resourceclaimtemplate", &by_webhook[0], "-n", NS]);
    assert_eq!(
        w["spec"]["spec"], console_claim,
        "the webhook's and the console's claims"
    );
    let (said, _) = plugin_ok(&cluster, &["release", "deployment/web"]);
    assert!(said.contains("released (limits form removed)"), "{said}");
    assert_eq!(deploy(&cluster, "web")["spec"]["template"], original);

    drop(plugins);
    cluster.down();
}
