//! The Helm chart packaging/helm/gpuslice: it renders every raw manifest of
//! packaging/kubernetes unchanged (so the two cannot drift), its certificate bootstrap works
//! without cert-manager and names cert-manager's objects with it, its installer uninstalls only
//! when asked and with the node agent, kubelet plugin and RuntimeClass off, and `helm install`
//! on a real control plane creates the cluster side: the node installer and DRA plugin
//! DaemonSets, the DeviceClasses, and the webhook's two replicas, Service, RBAC and
//! registration with a CA that signs the served certificate, kept across an upgrade; an
//! upgrade from the previous release's chart (scripts/previous-build.sh) makes this chart's
//! objects and keeps it too.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use gpuslice_e2e::env::previous_release_chart;
use gpuslice_e2e::kube::{script, KubeCluster};
use gpuslice_e2e::lock;
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn chart() -> PathBuf {
    repo().join("packaging/helm/gpuslice")
}

/// helm: `GPUSLICE_HELM_BIN`, else what `scripts/kube-cluster.sh build-helm` prints.
fn helm_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(b) = std::env::var_os("GPUSLICE_HELM_BIN") {
            return PathBuf::from(b);
        }
        let out = Command::new(script())
            .arg("build-helm")
            .stderr(Stdio::inherit())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "scripts/kube-cluster.sh build-helm failed"
        );
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
    .clone()
}

/// `helm ARGS`, with a Helm home of the tests' own, whatever its status.
fn helm_output(args: &[&str]) -> std::process::Output {
    let home = std::env::temp_dir().join("gpuslice-helm-home");
    Command::new(helm_bin())
        .args(args)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
        .unwrap()
}

pub(crate) fn helm(args: &[&str]) -> String {
    let out = helm_output(args);
    assert!(
        out.status.success(),
        "helm {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub(crate) fn documents(text: &str) -> Vec<Value> {
    // Documents are separated by a line `---` (Helm's output, and the raw manifests).
    let mut docs = vec![String::new()];
    for line in text.lines() {
        if line.trim_end() == "---" {
            docs.push(String::new());
        } else if let Some(d) = docs.last_mut() {
            d.push_str(line);
            d.push('\n');
        }
    }
    docs.iter()
        .filter_map(|d| {
            let v: Value =
                serde_yaml_ng::from_str(d).unwrap_or_else(|e| panic!("not YAML ({e}): {d}"));
            (!v.is_null()).then_some(v)
        })
        .collect()
}

pub(crate) fn find<'a>(objs: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    objs.iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
}

fn template(sets: &[&str]) -> Vec<Value> {
    let chart = chart();
    let mut args = vec!["template", "gpuslice", chart.to_str().unwrap()];
    for s in sets {
        args.extend(["--set", s]);
    }
    documents(&helm(&args))
}

/// What `helm template` with `sets` writes to stderr, where the chart must refuse them.
fn template_refused(sets: &[&str]) -> String {
    let chart = chart();
    let mut args = vec!["template", "gpuslice", chart.to_str().unwrap()];
    for s in sets {
        args.extend(["--set", s]);
    }
    let out = helm_output(&args);
    assert!(
        !out.status.success(),
        "{sets:?} rendered: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The pod-template annotation that rolls a DaemonSet when the node config changes.
const CONFIG_CHECKSUM: &str = "checksum/config";

/// `o` without its pod template's [`CONFIG_CHECKSUM`] (and without the annotations map it
/// leaves empty): the chart's only addition to the raw manifests, whose ConfigMap is edited
/// by hand and rolled with `kubectl rollout restart`.
fn without_config_checksum(o: &Value) -> Value {
    let mut o = o.clone();
    if let Some(meta) = o
        .pointer_mut("/spec/template/metadata")
        .and_then(Value::as_object_mut)
    {
        if let Some(annotations) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
            annotations.remove(CONFIG_CHECKSUM);
            if annotations.is_empty() {
                meta.remove("annotations");
            }
        }
    }
    o
}

#[test]
#[ignore = "needs helm, built from its Go module (slow on a cold cache); the README's test command runs it"]
fn the_chart_renders_the_raw_manifests_and_both_certificate_bootstraps() {
    let rendered = template(&[]);
    for file in [
        "packaging/kubernetes/daemonset.yaml",
        "packaging/kubernetes/runtimeclass.yaml",
        "packaging/kubernetes/annotations-policy.yaml",
        "packaging/kubernetes/dra/deviceclass.yaml",
        "packaging/kubernetes/dra/deviceclass-slots.yaml",
        "packaging/kubernetes/dra/slot-claims-policy.yaml",
        "packaging/kubernetes/dra/kubelet-plugin-policy.yaml",
        "packaging/kubernetes/dra/rbac.yaml",
        "packaging/kubernetes/dra/kubelet-plugin.yaml",
        "packaging/monitoring/exporter.yaml",
    ] {
        let raw = documents(&std::fs::read_to_string(repo().join(file)).unwrap());
        assert!(!raw.is_empty(), "{file} holds no object");
        for o in raw {
            let (kind, name) = (
                o["kind"].as_str().unwrap(),
                o["metadata"]["name"].as_str().unwrap(),
            );
            let r = find(&rendered, kind, name)
                .unwrap_or_else(|| panic!("{file}: the chart renders no {kind} {name}"));
            assert_eq!(
                &without_config_checksum(r),
                &o,
                "{file}: {kind} {name} differs from the chart's"
            );
        }
    }
    // One claim per pod where slot mode can run: forced on, it is the raw manifest; `auto`
    // renders it for a 1.34 cluster and not for 1.37 (capacity mode) unless mode is slots.
    let slot_pods = |args: &[&str]| {
        let chart = chart();
        let mut a = vec!["template", "gpuslice", chart.to_str().unwrap()];
        a.extend(args);
        let r = documents(&helm(&a));
        find(&r, "ValidatingAdmissionPolicy", "slot-pods.gpuslice.io").cloned()
    };
    let raw = documents(
        &std::fs::read_to_string(repo().join("packaging/kubernetes/dra/slot-pods-policy.yaml"))
            .unwrap(),
    );
    assert_eq!(
        slot_pods(&["--set", "dra.slotPodsPolicy=true"]).as_ref(),
        Some(&raw[0])
    );
    assert_eq!(
        slot_pods(&["--kube-version", "1.34.2"]).as_ref(),
        Some(&raw[0])
    );
    assert_eq!(slot_pods(&["--kube-version", "1.37.2"]), None);
    assert_eq!(
        slot_pods(&["--kube-version", "1.37.2", "--set", "dra.mode=slots"]).as_ref(),
        Some(&raw[0])
    );
    assert_eq!(
        slot_pods(&[
            "--kube-version",
            "1.34.2",
            "--set",
            "dra.slotPodsPolicy=false"
        ]),
        None
    );
    // Without cert-manager: a Secret with a CA and a serving certificate, the CA in the
    // registration; nothing of cert-manager's.
    let secret = find(&rendered, "Secret", "gpuslice-webhook-tls").expect("the webhook's Secret");
    let mwc = find(
        &rendered,
        "MutatingWebhookConfiguration",
        "gpuslice-webhook",
    )
    .unwrap();
    let hook = &mwc["webhooks"][0];
    assert_eq!(hook["clientConfig"]["caBundle"], secret["data"]["ca.crt"]);
    assert_eq!(hook["sideEffects"], "NoneOnDryRun");
    assert_eq!(hook["failurePolicy"], "Fail");
    assert!(find(&rendered, "Certificate", "gpuslice-webhook").is_none());
    // The test cluster registers the webhook by URL (scripts/lib/cluster-webhook.sh), and the
    // e2e tests check what its conditions do: they must be the chart's, word for word.
    let out = Command::new("bash")
        .arg("-c")
        .arg(". scripts/lib/cluster-webhook.sh && webhook_configuration https://127.0.0.1:1/mutate Q0E=")
        .current_dir(repo())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cluster = documents(&String::from_utf8_lossy(&out.stdout));
    let conditions = |m: &Value| -> Vec<(String, Vec<(String, String)>)> {
        let words = |v: &Value| {
            v.as_str()
                .unwrap()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        };
        m["webhooks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| {
                let c = w["matchConditions"].as_array().unwrap();
                let c = c
                    .iter()
                    .map(|c| (words(&c["name"]), words(&c["expression"])));
                (words(&w["name"]), c.collect())
            })
            .collect()
    };
    assert_eq!(
        conditions(&cluster[0]),
        conditions(mwc),
        "the test cluster's webhook registration and the chart's send different objects"
    );
    // The policy that keeps slice-request annotations as the webhook saw them comes with the
    // webhook, in the chart and in the test cluster (which applies the raw manifest).
    assert!(
        std::fs::read_to_string(repo().join("scripts/lib/cluster-webhook.sh"))
            .unwrap()
            .contains("\"$REPO/packaging/kubernetes/annotations-policy.yaml\"")
    );
    let without_webhook = template(&["webhook.enabled=false"]);
    for kind in [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ] {
        assert!(find(&without_webhook, kind, "annotations.gpuslice.io").is_none());
    }
    let deploy = find(&rendered, "Deployment", "gpuslice-webhook").unwrap();
    assert_eq!(deploy["spec"]["replicas"], 2);
    let cmd = deploy["spec"]["template"]["spec"]["containers"][0]["command"].to_string();
    assert!(
        !cmd.contains("--hami-compat"),
        "HAMi compatibility is off by default: {cmd}"
    );

    // dra.slotsPerGpu is N for both the plugin (the node config) and the policy that refuses
    // slot requests above N; by default the node config leaves the plugin's own default.
    let config = |objs: &[Value]| {
        find(objs, "ConfigMap", "gpuslice-config").unwrap()["data"]["config.toml"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(
        !config(&rendered).contains("slots_per_gpu"),
        "{}",
        config(&rendered)
    );
    let eight = template(&["dra.slotsPerGpu=8"]);
    assert!(
        config(&eight).ends_with("[dra]\nslots_per_gpu = 8\n"),
        "{}",
        config(&eight)
    );
    let policy = find(&eight, "ValidatingAdmissionPolicy", "slots.gpuslice.io").unwrap();
    assert_eq!(
        policy["spec"]["variables"][0],
        serde_json::json!({"name": "slotsPerGpu", "expression": "8"})
    );
    assert!(find(
        &template(&["dra.slotsDeviceClass=false"]),
        "ValidatingAdmissionPolicy",
        "slots.gpuslice.io"
    )
    .is_none());

    // The node agent (exporter and enforcer) is on by default, scraped through its pod
    // annotations; the prometheus-operator objects are the raw ones when asked for.
    let agent = find(&rendered, "DaemonSet", "gpuslice-exporter").expect("the node agent");
    let pod = &agent["spec"]["template"];
    assert_eq!(
        pod["metadata"]["annotations"]["prometheus.io/scrape"],
        "true"
    );
    assert_eq!(
        pod["spec"]["containers"][0]["command"],
        serde_json::json!([
            "nsenter",
            "--target",
            "1",
            "--cgroup",
            "--",
            "chroot",
            "/host",
            "/opt/gpuslice/bin/gpuslice",
            "serve",
            "--listen",
            "0.0.0.0:9400"
        ])
    );
    assert!(find(&rendered, "ServiceMonitor", "gpuslice-exporter").is_none());
    let monitored = template(&["agent.serviceMonitor=true"]);
    let raw = documents(
        &std::fs::read_to_string(repo().join("packaging/monitoring/servicemonitor.yaml")).unwrap(),
    );
    assert_eq!(raw.len(), 2);
    for o in raw {
        let (kind, name) = (
            o["kind"].as_str().unwrap(),
            o["metadata"]["name"].as_str().unwrap(),
        );
        assert_eq!(find(&monitored, kind, name), Some(&o), "{kind} {name}");
    }
    assert!(find(
        &template(&["agent.enabled=false"]),
        "DaemonSet",
        "gpuslice-exporter"
    )
    .is_none());

    // The namespace selector keeps the chart's own exclusion and adds the user's expressions
    // and labels (none of them dropped).
    let selected = template(&[
        "webhook.namespaceSelector.matchExpressions[0].key=team",
        "webhook.namespaceSelector.matchExpressions[0].operator=In",
        "webhook.namespaceSelector.matchExpressions[0].values[0]=ml",
        "webhook.namespaceSelector.matchLabels.gpu=yes",
    ]);
    let selector = &find(
        &selected,
        "MutatingWebhookConfiguration",
        "gpuslice-webhook",
    )
    .unwrap()["webhooks"][0]["namespaceSelector"];
    assert_eq!(
        selector["matchExpressions"],
        serde_json::json!([
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
             "values": ["gpuslice-system", "kube-system"]},
            {"key": "team", "operator": "In", "values": ["ml"]}
        ]),
        "{selector}"
    );
    assert_eq!(selector["matchLabels"], serde_json::json!({"gpu": "yes"}));

    // With cert-manager: its Issuer and Certificate, the CA injected by it.
    let cm = template(&[
        "webhook.certManager.enabled=true",
        "webhook.hamiCompat=true",
    ]);
    assert!(find(&cm, "Secret", "gpuslice-webhook-tls").is_none());
    let cert = find(&cm, "Certificate", "gpuslice-webhook").expect("a Certificate");
    assert_eq!(cert["spec"]["secretName"], "gpuslice-webhook-tls");
    assert_eq!(
        cert["spec"]["dnsNames"][0],
        "gpuslice-webhook.gpuslice-system.svc"
    );
    assert!(find(&cm, "Issuer", "gpuslice-webhook").is_some());
    let mwc = find(&cm, "MutatingWebhookConfiguration", "gpuslice-webhook").unwrap();
    assert_eq!(
        mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        "gpuslice-system/gpuslice-webhook"
    );
    let cmd = find(&cm, "Deployment", "gpuslice-webhook").unwrap()["spec"]["template"]["spec"]
        ["containers"][0]["command"]
        .to_string();
    assert!(cmd.contains("--hami-compat"), "{cmd}");
}

#[test]
#[ignore = "needs helm, built from its Go module (slow on a cold cache); the README's test command runs it"]
fn the_webhooks_network_policy_admits_the_api_server_and_not_the_pods() {
    let chart = chart();
    let webhook_pods = serde_json::json!({"matchLabels": {
        "app.kubernetes.io/name": "gpuslice", "app.kubernetes.io/component": "webhook"}});
    // Without a cluster to read the Nodes' pod networks from, and no peers given: no policy.
    let plain = template(&[]);
    assert!(find(&plain, "NetworkPolicy", "gpuslice-webhook").is_none());
    assert!(find(&plain, "CiliumNetworkPolicy", "gpuslice-webhook").is_none());
    // The pod networks known: every address outside them, and kube-system's pods, on the
    // webhook's port only.
    let known = template(&["webhook.networkPolicy.podCIDRs={10.244.0.0/16,fd00:10:244::/56}"]);
    let np = find(&known, "NetworkPolicy", "gpuslice-webhook").expect("a NetworkPolicy");
    assert_eq!(np["metadata"]["namespace"], "gpuslice-system");
    assert_eq!(np["spec"]["podSelector"], webhook_pods);
    assert_eq!(np["spec"]["policyTypes"], serde_json::json!(["Ingress"]));
    assert_eq!(
        np["spec"]["ingress"],
        serde_json::json!([{
            "ports": [{"port": 8443, "protocol": "TCP"}],
            "from": [
                {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.244.0.0/16"]}},
                {"ipBlock": {"cidr": "::/0", "except": ["fd00:10:244::/56"]}},
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}},
            ],
        }])
    );
    let deploy = find(&known, "Deployment", "gpuslice-webhook").unwrap();
    let pod = &deploy["spec"]["template"];
    assert_eq!(pod["metadata"]["labels"], webhook_pods["matchLabels"]);
    assert_eq!(
        pod["spec"]["containers"][0]["ports"][0]["containerPort"],
        8443
    );
    // The peers the operator names replace the default, under any network plugin.
    let given = helm(&[
        "template",
        "gpuslice",
        chart.to_str().unwrap(),
        "--api-versions",
        "cilium.io/v2/CiliumNetworkPolicy",
        "--set",
        "webhook.networkPolicy.from[0].ipBlock.cidr=10.0.0.10/32",
        "--set",
        "webhook.networkPolicy.kubeSystem=false",
    ]);
    let given = documents(&given);
    let np = find(&given, "NetworkPolicy", "gpuslice-webhook").expect("a NetworkPolicy");
    assert_eq!(
        np["spec"]["ingress"][0]["from"],
        serde_json::json!([{"ipBlock": {"cidr": "10.0.0.10/32"}}])
    );
    assert!(find(&given, "CiliumNetworkPolicy", "gpuslice-webhook").is_none());
    // Under Cilium (whose ipBlock never matches the nodes an API server may run on): its
    // kube-apiserver entity, and kube-system's endpoints.
    let cilium = documents(&helm(&[
        "template",
        "gpuslice",
        chart.to_str().unwrap(),
        "--api-versions",
        "cilium.io/v2/CiliumNetworkPolicy",
        "--set",
        "webhook.networkPolicy.podCIDRs={10.244.0.0/16}",
    ]));
    assert!(find(&cilium, "NetworkPolicy", "gpuslice-webhook").is_none());
    let cnp =
        find(&cilium, "CiliumNetworkPolicy", "gpuslice-webhook").expect("a CiliumNetworkPolicy");
    assert_eq!(cnp["spec"]["endpointSelector"], webhook_pods);
    assert_eq!(
        cnp["spec"]["ingress"][0],
        serde_json::json!({"fromEntities": ["kube-apiserver"],
                           "toPorts": [{"ports": [{"port": "8443", "protocol": "TCP"}]}]})
    );
    assert_eq!(
        cnp["spec"]["ingress"][1]["fromEndpoints"],
        serde_json::json!([{"matchLabels": {"k8s:io.kubernetes.pod.namespace": "kube-system"}}])
    );
    let off = template(&[
        "webhook.networkPolicy.enabled=false",
        "webhook.networkPolicy.podCIDRs={10.244.0.0/16}",
    ]);
    assert!(find(&off, "NetworkPolicy", "gpuslice-webhook").is_none());

    // Ready once the ResourceSlices were read; the rights the template sweep needs.
    let c = &pod["spec"]["containers"][0];
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert!(c["command"]
        .as_array()
        .unwrap()
        .contains(&serde_json::json!("--unused-template-grace=600")));
    let role = find(&known, "ClusterRole", "gpuslice-webhook").unwrap();
    let rules = role["rules"].as_array().unwrap();
    let verbs = |resource: &str| {
        rules
            .iter()
            .find(|r| r["resources"][0] == resource)
            .map(|r| r["verbs"].clone())
            .unwrap_or_else(|| panic!("no rule for {resource}: {rules:?}"))
    };
    assert_eq!(
        verbs("resourceclaimtemplates"),
        serde_json::json!(["get", "list", "watch", "create", "patch", "delete"])
    );
    // The budgets' recount: a pod or claim deleted frees its share at once (docs/quotas.md);
    // a claim a rank of a job names is read to know whether it asks gpuslice's devices
    // (docs/kubeflow.md, "One rank per GPU per job").
    assert_eq!(verbs("pods"), serde_json::json!(["get", "list", "watch"]));
    assert_eq!(
        verbs("resourceclaims"),
        serde_json::json!(["get", "list", "watch"])
    );
    // The budgets' ledger (docs/quotas.md): quotas read, their status written.
    assert_eq!(
        verbs("resourcequotas/status"),
        serde_json::json!(["update"])
    );
    assert!(c["command"]
        .as_array()
        .unwrap()
        .contains(&serde_json::json!(
            "--budget-lease=gpuslice-system/gpuslice-webhook-budgets"
        )));
}

/// Every pod that reads the node config (the installer writes the ConfigMap's config.toml to
/// the host, the kubelet plugin and the agent read it when they start) names its digest in its
/// pod template, so a `helm upgrade` that changes only the config (dra.slotsPerGpu, `config`)
/// rolls them, and one that changes nothing rolls nothing.
#[test]
#[ignore = "needs helm, built from its Go module (slow on a cold cache); the README's test command runs it"]
fn a_changed_node_config_rolls_every_pod_that_reads_it() {
    let checksums = |sets: &[&str]| -> Vec<String> {
        let objs = template(sets);
        [
            "gpuslice-installer",
            "gpuslice-kubelet-plugin",
            "gpuslice-exporter",
        ]
        .iter()
        .map(|name| {
            let ds = find(&objs, "DaemonSet", name)
                .unwrap_or_else(|| panic!("the chart renders no DaemonSet {name}"));
            ds["spec"]["template"]["metadata"]["annotations"][CONFIG_CHECKSUM]
                .as_str()
                .unwrap_or_else(|| panic!("DaemonSet {name}: no {CONFIG_CHECKSUM}: {ds}"))
                .to_string()
        })
        .collect()
    };
    let default = checksums(&[]);
    assert!(
        default.iter().all(|c| c == &default[0] && c.len() == 64),
        "{default:?}"
    );
    assert_eq!(checksums(&[]), default, "the same values, another digest");
    let eight = checksums(&["dra.slotsPerGpu=8"]);
    let config = checksums(&["config=# another node config"]);
    for changed in [&eight, &config] {
        for (name, (a, b)) in ["installer", "kubelet-plugin", "exporter"]
            .iter()
            .zip(default.iter().zip(changed.iter()))
        {
            assert_ne!(a, b, "{name}: another config, the same {CONFIG_CHECKSUM}");
        }
    }
    assert_eq!(checksums(&["dra.slotsPerGpu=8"]), eight);
    assert_ne!(eight, config);
}

/// The kubelet plugin and the node agent wait in an init container for their node's installer
/// pod to have written this release's config and binaries (the raw manifests' case, compared
/// above); without the installer (`installer.enabled=false`) there is nothing to wait for, and
/// neither the init container nor the ConfigMap it reads is rendered.
#[test]
#[ignore = "needs helm, built from its Go module (slow on a cold cache); the README's test command runs it"]
fn pods_wait_for_the_installer_only_where_the_chart_runs_it() {
    for (sets, waits) in [(&[][..], true), (&["installer.enabled=false"][..], false)] {
        let objs = template(sets);
        for name in ["gpuslice-kubelet-plugin", "gpuslice-exporter"] {
            let ds = find(&objs, "DaemonSet", name)
                .unwrap_or_else(|| panic!("{sets:?}: the chart renders no DaemonSet {name}"));
            let pod = &ds["spec"]["template"]["spec"];
            let init = pod["initContainers"]
                .as_array()
                .is_some_and(|a| a.iter().any(|c| c["name"] == "wait-installed"));
            let configmap = pod["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|v| v["configMap"]["name"] == "gpuslice-config");
            assert_eq!((init, configmap), (waits, waits), "{sets:?}: {name}: {pod}");
        }
    }
}

/// `installer.mode` is the installer pods' GPUSLICE_MODE (installer.sh): `install` by default,
/// `uninstall` only with the node agent and the kubelet plugin off (both use the /opt/gpuslice
/// it deletes) and the RuntimeClass gone (it names the runtime unregistered), anything else
/// refused naming what is accepted.
#[test]
#[ignore = "needs helm, built from its Go module (slow on a cold cache); the README's test command runs it"]
fn the_installer_uninstalls_when_asked_and_only_without_the_agent_plugin_and_runtime_class() {
    let mode = |objs: &[Value]| {
        let ds = find(objs, "DaemonSet", "gpuslice-installer").expect("the installer");
        let env = ds["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .unwrap();
        env.iter()
            .find(|e| e["name"] == "GPUSLICE_MODE")
            .map(|e| e["value"].clone())
    };
    assert_eq!(mode(&template(&[])), Some(serde_json::json!("install")));
    let off = [
        "agent.enabled=false",
        "dra.enabled=false",
        "runtimeClass.enabled=false",
    ];
    let uninstall = template(&[off[0], off[1], off[2], "installer.mode=uninstall"]);
    assert_eq!(mode(&uninstall), Some(serde_json::json!("uninstall")));
    assert!(find(&uninstall, "DaemonSet", "gpuslice-exporter").is_none());
    assert!(find(&uninstall, "DaemonSet", "gpuslice-kubelet-plugin").is_none());
    assert!(find(&uninstall, "RuntimeClass", "gpuslice").is_none());

    // Each one left on alone is refused, and named.
    for on in off {
        let mut sets: Vec<&str> = off.iter().copied().filter(|s| *s != on).collect();
        sets.push("installer.mode=uninstall");
        let err = template_refused(&sets);
        let value = on.trim_end_matches("=false");
        assert!(
            err.contains(&format!("still true: {value};"))
                && err.contains(
                    "accepted: agent.enabled=false, dra.enabled=false and runtimeClass.enabled=false"
                ),
            "{on}: {err}"
        );
    }
    for bad in ["Uninstall", "remove", "true"] {
        let err = template_refused(&[&format!("installer.mode={bad}")]);
        assert!(
            err.contains(&format!(
                "installer.mode is \"{bad}\"; accepted: install or uninstall"
            )),
            "{bad}: {err}"
        );
    }
}

/// The webhook's PodDisruptionBudget keeps one replica answering through drains; with a
/// single replica it would keep that one from ever being evicted, so it is left out.
#[test]
#[ignore = "needs helm, built from its Go module (slow on a cold cache); the README's test command runs it"]
fn the_webhooks_disruption_budget_never_blocks_a_drain() {
    let pdb = |replicas: &str| {
        find(
            &template(&[&format!("webhook.replicas={replicas}")]),
            "PodDisruptionBudget",
            "gpuslice-webhook",
        )
        .cloned()
    };
    assert_eq!(pdb("1"), None, "one replica: no budget");
    for replicas in ["2", "3"] {
        let p = pdb(replicas).unwrap_or_else(|| panic!("{replicas} replicas: no budget"));
        assert_eq!(p["spec"]["minAvailable"], 1, "{p}");
    }
}

#[test]
#[ignore = "needs helm and starts a real Kubernetes control plane; the README's test command runs it"]
fn helm_install_creates_the_cluster_side_on_a_live_control_plane() {
    let _s = lock(&[]);
    let mut c = KubeCluster::up();
    let kc = c.kubeconfig();
    let kc = kc.to_str().unwrap();
    let chart = chart();
    helm(&[
        "install",
        "gpuslice",
        chart.to_str().unwrap(),
        "--kubeconfig",
        kc,
        "--set",
        "webhook.hamiCompat=true",
        "--set",
        "dra.mode=capacity",
    ]);
    let ns = "gpuslice-system";
    for (kind, name) in [
        ("daemonset", "gpuslice-installer"),
        ("daemonset", "gpuslice-kubelet-plugin"),
        ("daemonset", "gpuslice-exporter"),
        ("deployment", "gpuslice-webhook"),
        ("service", "gpuslice-webhook"),
        ("serviceaccount", "gpuslice-webhook"),
        ("secret", "gpuslice-webhook-tls"),
        ("configmap", "gpuslice-config"),
        ("poddisruptionbudget", "gpuslice-webhook"),
    ] {
        c.get_json(&[kind, name, "-n", ns]);
    }
    for (kind, name) in [
        ("deviceclass", "gpuslice.io"),
        ("deviceclass", "slots.gpuslice.io"),
        ("validatingadmissionpolicy", "slots.gpuslice.io"),
        ("validatingadmissionpolicybinding", "slots.gpuslice.io"),
        ("runtimeclass", "gpuslice"),
        ("clusterrole", "gpuslice-webhook"),
        ("clusterrolebinding", "gpuslice-webhook"),
        ("clusterrole", "gpuslice-kubelet-plugin"),
        ("mutatingwebhookconfiguration", "gpuslice-webhook"),
    ] {
        c.get_json(&[kind, name]);
    }
    let d = c.get_json(&["deployment", "gpuslice-webhook", "-n", ns]);
    assert_eq!(d["spec"]["replicas"], 2);
    assert!(d["spec"]["template"]["spec"]["containers"][0]["command"]
        .to_string()
        .contains("--hami-compat"));
    let cm = c.get_json(&["configmap", "gpuslice-config", "-n", ns]);
    assert!(cm["data"]["config.toml"]
        .as_str()
        .unwrap()
        .contains("[dra]\nmode = \"capacity\""));
    let mwc = c.get_json(&["mutatingwebhookconfiguration", "gpuslice-webhook"]);
    let hook = &mwc["webhooks"][0];
    assert_eq!(hook["clientConfig"]["service"]["name"], "gpuslice-webhook");
    assert_eq!(hook["clientConfig"]["service"]["namespace"], ns);
    assert_eq!(hook["matchConditions"][0]["name"], "names-gpu-resources");
    // The claims entry: the same conditions as the test cluster's registration, whose effect
    // tests/tests/webhook.rs checks (the API server compiled their CEL at install).
    let names: Vec<&str> = mwc["webhooks"][1]["matchConditions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["name"].as_str())
        .collect();
    assert_eq!(
        names,
        [
            "asks-gpuslice-devices",
            "not-a-pods-claim-from-the-claim-controller"
        ],
        "{mwc}"
    );
    assert!(hook["namespaceSelector"]
        .to_string()
        .contains("kube-system"));

    // The registration's CA signs the served certificate, for the Service's DNS name.
    let secret = c.get_json(&["secret", "gpuslice-webhook-tls", "-n", ns]);
    let dir = tempfile::tempdir().unwrap();
    let decode = |k: &str| {
        let b64 = secret["data"][k].as_str().unwrap();
        let out = Command::new("base64")
            .arg("-d")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .and_then(|mut ch| {
                use std::io::Write;
                ch.stdin.take().unwrap().write_all(b64.as_bytes())?;
                ch.wait_with_output()
            })
            .unwrap();
        let p = dir.path().join(k);
        std::fs::write(&p, out.stdout).unwrap();
        p
    };
    assert_eq!(hook["clientConfig"]["caBundle"], secret["data"]["ca.crt"]);
    let (ca, crt) = (decode("ca.crt"), decode("tls.crt"));
    let verify = Command::new("openssl")
        .args(["verify", "-CAfile"])
        .arg(&ca)
        .arg(&crt)
        .output()
        .unwrap();
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stdout)
    );
    let text = Command::new("openssl")
        .args(["x509", "-noout", "-ext", "subjectAltName", "-in"])
        .arg(&crt)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("DNS:gpuslice-webhook.gpuslice-system.svc"),
        "{}",
        String::from_utf8_lossy(&text.stdout)
    );

    // An upgrade keeps the certificate (no new CA for the API server to trust).
    helm(&[
        "upgrade",
        "gpuslice",
        chart.to_str().unwrap(),
        "--kubeconfig",
        kc,
        "--set",
        "webhook.hamiCompat=true",
    ]);
    let again = c.get_json(&["secret", "gpuslice-webhook-tls", "-n", ns]);
    assert_eq!(
        again["data"], secret["data"],
        "the upgrade made a new certificate"
    );

    helm(&["uninstall", "gpuslice", "--kubeconfig", kc, "--wait"]);
    let left = c.kubectl_output(
        &["get", "mutatingwebhookconfiguration", "gpuslice-webhook"],
        None,
    );
    assert!(
        !left.status.success(),
        "the registration outlived the release"
    );

    upgrade_from_the_previous_release(&c, &["webhook.hamiCompat=true", "dra.mode=capacity"]);
    c.down();
}

/// The previous release's chart (scripts/previous-build.sh) installed with `sets`, then
/// upgraded to this one: the upgrade succeeds (no field it cannot change), every object this
/// chart renders exists after it, the webhook registrations and ClusterRoles are this chart's,
/// and the webhook keeps the certificate the previous release made; then uninstalled.
fn upgrade_from_the_previous_release(c: &KubeCluster, sets: &[&str]) {
    let kc = c.kubeconfig();
    let kc = kc.to_str().unwrap();
    // `helm VERB gpuslice CHART` on the cluster, with `sets`.
    let release = |verb: &str, chart: &Path| {
        let chart = chart.to_str().unwrap();
        let mut args = vec![verb, "gpuslice", chart, "--kubeconfig", kc];
        for s in sets {
            args.extend(["--set", s]);
        }
        helm(&args);
    };
    release("install", &previous_release_chart());
    let ns = "gpuslice-system";
    let secret = c.get_json(&["secret", "gpuslice-webhook-tls", "-n", ns]);
    release("upgrade", &chart());
    let rendered = template(sets);
    assert!(!rendered.is_empty(), "the chart rendered nothing");
    for o in &rendered {
        let kind = o["kind"].as_str().unwrap().to_lowercase();
        let name = o["metadata"]["name"].as_str().unwrap();
        let live = match o["metadata"]["namespace"].as_str() {
            Some(n) => c.get_json(&[&kind, name, "-n", n]),
            None => c.get_json(&[&kind, name]),
        };
        let same = |field: &str, part: &dyn Fn(&Value) -> Value| {
            assert_eq!(
                part(&live),
                part(o),
                "after the upgrade, {kind} {name}'s {field} is not this chart's"
            );
        };
        match kind.as_str() {
            "mutatingwebhookconfiguration" => same("webhooks' match conditions", &|v| {
                Value::Array(
                    v["webhooks"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|w| w["matchConditions"].clone())
                        .collect(),
                )
            }),
            "clusterrole" => same("rules", &|v| v["rules"].clone()),
            _ => {}
        }
    }
    let kept = c.get_json(&["secret", "gpuslice-webhook-tls", "-n", ns]);
    assert_eq!(
        kept["data"], secret["data"],
        "the upgrade from the previous release made a new certificate"
    );
    helm(&["uninstall", "gpuslice", "--kubeconfig", kc, "--wait"]);
}
