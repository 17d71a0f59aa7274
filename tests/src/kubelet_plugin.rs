//! One real `gpuslice kubelet-plugin` process per simulated node for tests against the
//! control plane: its kubelet directories in the node's temp dir, started with the cluster's
//! admin kubeconfig, ready once its DRA socket exists; killed when dropped. Also the claim and
//! pod objects such tests create.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use crate::env::bin;
use crate::kube::{wait_for, KubeCluster};
use crate::kubelet::Kubelet;
use crate::node::TestNode;

/// A running plugin.
#[derive(Debug)]
pub struct KubeletPlugin {
    child: Child,
    pub dra: PathBuf,
    log: PathBuf,
}

impl KubeletPlugin {
    /// Starts the plugin for Node `name` on `node`; returns once its DRA socket is in place.
    pub fn start(cluster: &KubeCluster, name: &str, node: &TestNode) -> KubeletPlugin {
        let plugin_dir = node.dir.path().join("kubelet/plugins/gpuslice.io");
        let registration_dir = node.dir.path().join("kubelet/plugins_registry");
        std::fs::create_dir_all(&plugin_dir).unwrap();
        std::fs::create_dir_all(&registration_dir).unwrap();
        let log = node.dir.path().join("plugin.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(bin("gpuslice"))
            .arg("--config")
            .arg(&node.config)
            .args(["kubelet-plugin", "--node-name", name])
            .arg("--kubeconfig")
            .arg(cluster.kubeconfig())
            .arg("--plugin-dir")
            .arg(&plugin_dir)
            .arg("--registration-dir")
            .arg(&registration_dir)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("start gpuslice kubelet-plugin");
        let mut p = KubeletPlugin {
            child,
            dra: plugin_dir.join("dra.sock"),
            log,
        };
        wait_for(
            &format!("the plugin of {name} to open {}", p.dra.display()),
            Duration::from_secs(30),
            || {
                if let Ok(Some(status)) = p.child.try_wait() {
                    panic!("the plugin of {name} exited ({status}):\n{}", p.log_text());
                }
                p.dra.exists().then_some(())
            },
        );
        p
    }

    /// What the plugin logged.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A kubelet's DRA client on the plugin's socket.
    pub fn kubelet(&self) -> Kubelet {
        Kubelet::connect(&self.dra).unwrap_or_else(|e| {
            panic!(
                "cannot dial {}: {e}\nplugin log:\n{}",
                self.dra.display(),
                self.log_text()
            )
        })
    }
}

impl Drop for KubeletPlugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The gpuslice ResourceSlice of Node `node` (`<node>-gpuslice.io`), once published.
pub fn slice_of(cluster: &KubeCluster, node: &str) -> Option<Value> {
    let all = cluster.get_json(&["resourceslices"]);
    all["items"].as_array()?.iter().find_map(|s| {
        (s["spec"]["nodeName"] == node && s["spec"]["driver"] == "gpuslice.io").then(|| s.clone())
    })
}

/// The namespace of [`resource_claim`]'s and [`pod`]'s objects.
pub const CLAIMS_NS: &str = "default";

/// How long the tests give the scheduler to decide a pod.
pub const SCHEDULE: Duration = Duration::from_secs(90);

/// The node the scheduler binds pod `name` (of [`CLAIMS_NS`]) to; a timeout's panic shows the
/// cluster's state ([`KubeCluster::wait_for`]).
pub fn bound_node(cluster: &KubeCluster, name: &str) -> String {
    cluster.wait_for(
        &format!("the scheduler to bind pod {name}"),
        SCHEDULE,
        || {
            let p = cluster.get_json(&["pod", name, "-n", CLAIMS_NS]);
            p["spec"]["nodeName"].as_str().map(str::to_string)
        },
    )
}

/// The scheduler's message for pod `name` (of [`CLAIMS_NS`]), once it found no node whose
/// devices can hold the pod's claims; panics when it gives another reason.
pub fn no_room(cluster: &KubeCluster, name: &str) -> String {
    let cond = cluster.wait_for(
        &format!("the scheduler to find no room for pod {name}"),
        SCHEDULE,
        || {
            let p = cluster.get_json(&["pod", name, "-n", CLAIMS_NS]);
            p["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == "PodScheduled" && c["status"] == "False")
                .cloned()
        },
    );
    assert_eq!(cond["reason"], "Unschedulable", "pod {name}: {cond}");
    let message = cond["message"].as_str().unwrap_or_default().to_string();
    assert!(
        message.contains("cannot allocate all claims"),
        "pod {name}: the scheduler's reason names no claim: {cond}"
    );
    message
}

/// A ResourceClaim asking the DeviceClass `gpuslice.io` for `count` GPUs of `memory` and
/// `cores` each, optionally with a CEL selector.
pub fn resource_claim(
    name: &str,
    count: u32,
    memory: &str,
    cores: &str,
    cel: Option<&str>,
) -> Value {
    let mut exactly = json!({
        "deviceClassName": "gpuslice.io",
        "count": count,
        "capacity": {"requests": {"memory": memory, "cores": cores}},
    });
    if let Some(expression) = cel {
        exactly["selectors"] = json!([{"cel": {"expression": expression}}]);
    }
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": CLAIMS_NS},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    })
}

/// A pod (tolerating the taints of a node without a kubelet) using claim `claim`.
pub fn pod(name: &str, claim: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": CLAIMS_NS},
        "spec": {
            "tolerations": [{"operator": "Exists"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "containers": [{
                "name": "main",
                "image": "gpuslice.invalid/never-pulled:1",
                "resources": {"claims": [{"name": "gpu"}]},
            }],
        },
    })
}

/// A Deployment of `replicas` pods (two containers, `main` and `sidecar`, tolerating a node
/// without a kubelet) that replaces all its pods at once on a template change (no kubelet
/// ever makes them ready), with `claims` as its pod template's `resourceClaims` if given.
pub fn deployment(name: &str, replicas: u32, claims: Option<Value>) -> Value {
    let mut d = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": CLAIMS_NS},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "100%", "maxUnavailable": "100%"}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [
                        {"name": "main", "image": "gpuslice.invalid/never-pulled:1"},
                        {"name": "sidecar", "image": "gpuslice.invalid/never-pulled:1"},
                    ],
                },
            },
        },
    });
    if let Some(c) = claims {
        d["spec"]["template"]["spec"]["resourceClaims"] = c;
    }
    d
}
