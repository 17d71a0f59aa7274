//! A real Kubernetes node for end-to-end tests: `scripts/kube-cluster.sh up DIR --node NAME`
//! (containerd 2.x, kubelet, the gpuslice kubelet plugin) on a simulated GPU node, the test
//! image imported into that containerd, pods created through the API server and watched to
//! Running or Pending, and the node's processes restarted the way an operator would.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use crate::cri::image_archive;
use crate::kube::{wait_for, KubeCluster};
use crate::node::{probe, TestNode};

/// The test image (busybox and glibc, the test rootfs) in the node's containerd.
pub const APP_IMAGE: &str = "localhost/gpuslice-e2e:1";
/// Namespace of the tests' objects.
pub const NS: &str = "default";
/// Where pods mount the probe (a hostPath volume of the build's probe).
pub const PROBE_IN_POD: &str = "/usr/local/bin/gpuslice-probe";
/// How long one step (scheduling, a pod start, a release) may take.
pub const STEP: Duration = Duration::from_secs(120);

/// A control plane and a node NAME on this machine, with the test image imported.
pub struct KubeNode {
    pub cluster: KubeCluster,
    pub name: String,
    pub env: BTreeMap<String, String>,
}

impl KubeNode {
    /// `up DIR --node name` for the simulated `node`; imports [`APP_IMAGE`].
    pub fn up(name: &str, node: &TestNode) -> KubeNode {
        KubeNode::up_with(name, node, &[])
    }

    /// As [`KubeNode::up`], with more arguments to `up` (`--feature-gates LIST`).
    pub fn up_with(name: &str, node: &TestNode, args: &[&str]) -> KubeNode {
        let cluster =
            KubeCluster::up_with_node_and(name, &node.config, &crate::env::bin_dir(), args);
        let env = cluster.endpoints();
        let n = KubeNode {
            cluster,
            name: name.to_string(),
            env,
        };
        let work = n.cluster.dir().join("test-images");
        std::fs::create_dir_all(&work).expect("image dir");
        let archive = image_archive(&work, APP_IMAGE, &["sh"]);
        n.ctr_import(&archive);
        n
    }

    /// A path or value `up --node` wrote to `DIR/cluster.env`.
    pub fn env(&self, key: &str) -> &str {
        self.env
            .get(key)
            .unwrap_or_else(|| panic!("no {key} in {}/cluster.env", self.cluster.dir().display()))
    }

    /// `ctr -n k8s.io images import` into the node's containerd (native snapshotter).
    pub fn ctr_import(&self, archive: &Path) {
        ctr_import(self.env("CTR"), self.env("CONTAINERD_SOCKET"), archive);
    }

    /// The last `lines` lines of a component's log (`containerd`, `kubelet`,
    /// `gpuslice-kubelet-plugin`, or a control-plane one).
    pub fn log_tail(&self, component: &str, lines: usize) -> String {
        self.cluster.log_tail(component, lines)
    }

    /// The node components' log tails, for failure messages.
    pub fn logs(&self) -> String {
        ["kubelet", "containerd", "gpuslice-kubelet-plugin"]
            .iter()
            .map(|c| format!("--- {c}:\n{}\n", self.log_tail(c, 25)))
            .collect()
    }

    /// Pod `name` as JSON, if it exists.
    pub fn pod(&self, name: &str) -> Option<Value> {
        let out = self
            .cluster
            .kubectl_output(&["get", "pod", name, "-n", NS, "-o", "json"], None);
        out.status
            .success()
            .then(|| serde_json::from_slice(&out.stdout).ok())
            .flatten()
    }

    /// Waits until pod `name` is Running with every container ready; returns it.
    pub fn wait_running(&self, name: &str) -> Value {
        let mut last = Value::Null;
        let found = wait_for_or(STEP, || {
            let p = self.pod(name)?;
            last = p.clone();
            (p["status"]["phase"] == "Running"
                && p["status"]["containerStatuses"]
                    .as_array()
                    .is_some_and(|c| c.iter().all(|c| c["ready"] == true)))
            .then_some(p)
        });
        found.unwrap_or_else(|| {
            panic!(
                "pod {name} is not Running within {STEP:?}: {}\nevents:\n{}\n{}",
                last["status"],
                self.events(name),
                self.logs()
            )
        })
    }

    /// The events of object `name`, one per line.
    pub fn events(&self, name: &str) -> String {
        let out = self.cluster.kubectl_output(
            &[
                "get",
                "events",
                "-n",
                NS,
                "--field-selector",
                &format!("involvedObject.name={name}"),
                "-o",
                "custom-columns=REASON:.reason,MESSAGE:.message",
            ],
            None,
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl logs` of pod `name` (its one container).
    pub fn pod_log(&self, name: &str) -> String {
        self.cluster.kubectl(&["logs", "-n", NS, name])
    }

    /// `kubectl exec` of `command` in pod `name` (its one container): its stdout; panics with
    /// its stderr when it fails.
    pub fn exec(&self, name: &str, command: &[&str]) -> String {
        let mut args = vec!["exec", "-n", NS, name, "--"];
        args.extend_from_slice(command);
        let out = self.cluster.kubectl_output(&args, None);
        assert!(
            out.status.success(),
            "kubectl exec {name} -- {command:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `scripts/kube-cluster.sh restart DIR ARGS…` ([`KubeCluster::restart`]), then `cluster.env`
    /// read again.
    pub fn restart_cluster(&mut self, args: &[&str]) {
        self.cluster.restart(args);
        self.env = self.cluster.endpoints();
    }

    /// Waits until pod `name` is Pending with the scheduler's Unschedulable condition; returns
    /// the scheduler's message.
    pub fn wait_unschedulable(&self, name: &str) -> String {
        let mut last = Value::Null;
        wait_for_or(STEP, || {
            last = self.pod(name)?;
            last["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| {
                    c["type"] == "PodScheduled"
                        && c["status"] == "False"
                        && c["reason"] == "Unschedulable"
                })
                .and_then(|c| c["message"].as_str().map(str::to_string))
        })
        .unwrap_or_else(|| {
            panic!(
                "pod {name} is not Unschedulable: {}\n{}",
                last["status"],
                self.logs()
            )
        })
    }

    /// Waits until pod `name`'s log holds `marker`; returns the log.
    pub fn wait_log(&self, name: &str, marker: &str) -> String {
        let mut last = String::new();
        wait_for_or(STEP, || {
            let out = self.cluster.kubectl_output(&["logs", "-n", NS, name], None);
            last = String::from_utf8_lossy(&out.stdout).into_owned();
            last.contains(marker).then(|| last.clone())
        })
        .unwrap_or_else(|| panic!("no {marker:?} in the log of pod {name}: {last}"))
    }

    /// Waits until the plugin's log says it was registered with the kubelet `times` times in
    /// all (through its own registration socket, as on a real node); returns the log.
    pub fn wait_registered(&self, times: usize) -> String {
        let log = self
            .cluster
            .dir()
            .join("logs")
            .join("gpuslice-kubelet-plugin.log");
        let mut last = String::new();
        wait_for_or(STEP, || {
            last = std::fs::read_to_string(&log).unwrap_or_default();
            (last.matches("registered with the kubelet").count() >= times).then(|| last.clone())
        })
        .unwrap_or_else(|| {
            panic!(
                "the kubelet did not register the plugin {times} times: {}",
                log.display()
            )
        })
    }

    /// Deletes pod `name` and waits until the API server no longer has it.
    pub fn delete_pod(&self, name: &str) {
        self.cluster
            .kubectl(&["delete", "pod", name, "-n", NS, "--wait=false"]);
        wait_for_or(STEP, || self.pod(name).is_none().then_some(())).unwrap_or_else(|| {
            panic!(
                "pod {name} was not deleted within {STEP:?}\n{}",
                self.logs()
            )
        });
    }

    /// The pid `up` recorded for node component `component`.
    pub fn pid(&self, component: &str) -> u32 {
        let path = self.pid_file(component);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        text.trim()
            .parse()
            .unwrap_or_else(|e| panic!("{} holds no pid ({text:?}): {e}", path.display()))
    }

    fn pid_file(&self, component: &str) -> PathBuf {
        self.cluster
            .dir()
            .join("pids")
            .join(format!("{component}.pid"))
    }

    /// Stops node component `component` with SIGTERM and starts it again with the same
    /// command line, appending to its log; records the new pid where `down` finds it.
    pub fn restart(&self, component: &str) {
        let pid = self.pid(component);
        let argv: Vec<String> = std::fs::read(format!("/proc/{pid}/cmdline"))
            .unwrap_or_else(|e| panic!("{component} (pid {pid}) is not running: {e}"))
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let pid_t = rustix::process::Pid::from_raw(pid as i32).expect("a pid");
        rustix::process::kill_process(pid_t, rustix::process::Signal::Term)
            .unwrap_or_else(|e| panic!("SIGTERM to {component} (pid {pid}): {e}"));
        wait_for_or(Duration::from_secs(30), || {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
            // Gone, or a zombie of the script's subshell.
            stat.is_none_or(|s| s.rsplit(") ").next().is_some_and(|r| r.starts_with('Z')))
                .then_some(())
        })
        .unwrap_or_else(|| panic!("{component} (pid {pid}) did not stop on SIGTERM"));
        let log = self
            .cluster
            .dir()
            .join("logs")
            .join(format!("{component}.log"));
        let out = std::fs::OpenOptions::new()
            .append(true)
            .open(&log)
            .unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        // Not waited for: `down` stops it by the pid recorded below, as it does what `up`
        // started, and the test process reaps nothing else of the cluster either.
        #[allow(clippy::zombie_processes)]
        let child = Command::new("setsid")
            .args(&argv)
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("dup log"))
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("restart {component} ({argv:?}): {e}"));
        std::fs::write(self.pid_file(component), format!("{}\n", child.id())).expect("pid file");
    }

    /// Waits until the Node is Ready and its gpuslice ResourceSlice is published.
    pub fn wait_ready(&self) {
        // What was seen last, for the failure message: the Node's Ready condition and
        // whether the plugin's ResourceSlice was listed.
        let mut seen = (serde_json::Value::Null, false);
        wait_for_or(STEP, || {
            let node = self.cluster.get_json(&["node", &self.name]);
            let ready = node["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == "Ready")
                .cloned()
                .unwrap_or_default();
            let slices = self.cluster.get_json(&["resourceslices"]);
            let published = slices["items"].as_array()?.iter().any(|s| {
                s["spec"]["nodeName"] == self.name.as_str() && s["spec"]["driver"] == "gpuslice.io"
            });
            let ok = ready["status"] == "True" && published;
            seen = (ready, published);
            ok.then_some(())
        })
        .unwrap_or_else(|| {
            panic!(
                "node {} not Ready with its ResourceSlice within {STEP:?} (last seen: Ready \
                 condition {}, gpuslice ResourceSlice listed: {})\n{}",
                self.name,
                seen.0,
                seen.1,
                self.logs()
            )
        });
    }
}

/// `ctr -n k8s.io images import` of `archive` into the containerd at `socket` (native
/// snapshotter).
fn ctr_import(ctr: &str, socket: &str, archive: &Path) {
    let out = Command::new(ctr)
        .args(["--address", socket])
        .args(["--namespace", "k8s.io", "images", "import"])
        // containerd 2.x's transfer service unpacks only for its default snapshotter.
        .args(["--local", "--snapshotter", "native"])
        .arg(archive)
        .stdin(Stdio::null())
        .output()
        .expect("run ctr");
    assert!(
        out.status.success(),
        "ctr images import {} into {socket}: {}",
        archive.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Several nodes of one cluster on this machine (`up DIR --node A=CONFIG --node B=CONFIG …`,
/// scripts/lib/cluster-nodes.sh), [`APP_IMAGE`] imported into every node's containerd.
pub struct KubeNodes {
    /// The cluster as its first node (whose paths are `cluster.env`'s).
    pub first: KubeNode,
    /// Each node's `node.env` (its name, directory, containerd and component names), in
    /// the order given.
    pub nodes: Vec<BTreeMap<String, String>>,
}

impl KubeNodes {
    /// `up DIR --node NAME=CONFIG …` for each `(name, node)` and `args` (`--kubeflow`,
    /// `--webhook`); imports [`APP_IMAGE`] into every node.
    pub fn up(nodes: &[(&str, &TestNode)], args: &[&str]) -> KubeNodes {
        let specs: Vec<String> = nodes
            .iter()
            .map(|(name, node)| format!("{name}={}", node.config.display()))
            .collect();
        let mut all: Vec<&str> = Vec::new();
        for spec in &specs {
            all.extend_from_slice(&["--node", spec]);
        }
        all.extend_from_slice(args);
        // The training operator's init container of PyTorchJob workers (it waits until the
        // master's name resolves) in the test image: nothing can be pulled here.
        let cluster = KubeCluster::up_with(
            &all,
            &[("GPUSLICE_KUBEFLOW_INIT_IMAGE", Path::new(APP_IMAGE))],
        );
        let env = cluster.endpoints();
        let dirs: Vec<PathBuf> = env
            .get("NODE_DIRS")
            .map(|d| d.split(',').map(PathBuf::from).collect())
            .unwrap_or_default();
        let nodes: Vec<BTreeMap<String, String>> = dirs
            .iter()
            .map(|d| {
                let path = d.join("node.env");
                let text = std::fs::read_to_string(&path)
                    .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
                text.lines()
                    .filter_map(|l| l.split_once('='))
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            })
            .collect();
        let first = KubeNode {
            cluster,
            name: nodes
                .first()
                .and_then(|n| n.get("NODE_NAME"))
                .cloned()
                .unwrap_or_default(),
            env,
        };
        let work = first.cluster.dir().join("test-images");
        std::fs::create_dir_all(&work).expect("image dir");
        let archive = image_archive(&work, APP_IMAGE, &["sh"]);
        for n in &nodes {
            ctr_import(&n["CTR"], &n["CONTAINERD_SOCKET"], &archive);
        }
        KubeNodes { first, nodes }
    }

    /// Whether `ip` is in the pod subnet of node `name` (its node.env's `CNI_SUBNET`, which
    /// depends on the cluster script's slot).
    pub fn in_subnet(&self, name: &str, ip: &str) -> bool {
        let node = self
            .nodes
            .iter()
            .find(|n| n.get("NODE_NAME").is_some_and(|n| n == name))
            .unwrap_or_else(|| panic!("no node {name} in this cluster"));
        let subnet = &node["CNI_SUBNET"];
        let parsed = subnet
            .split_once('/')
            .and_then(|(net, len)| Some((net.parse::<Ipv4Addr>().ok()?, len.parse::<u32>().ok()?)));
        let (net, len) = parsed
            .unwrap_or_else(|| panic!("node {name}'s CNI_SUBNET {subnet} is not a.b.c.d/len"));
        let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
        ip.parse::<Ipv4Addr>()
            .is_ok_and(|ip| u32::from(ip) & mask == u32::from(net) & mask)
    }

    /// Every node's components' log tails, for failure messages.
    pub fn logs(&self) -> String {
        let mut text = String::new();
        for n in &self.nodes {
            for key in [
                "KUBELET_COMPONENT",
                "CONTAINERD_COMPONENT",
                "PLUGIN_COMPONENT",
            ] {
                let c = n.get(key).map(String::as_str).unwrap_or_default();
                text.push_str(&format!("--- {c}:\n{}\n", self.first.log_tail(c, 25)));
            }
        }
        text
    }
}

/// Like [`wait_for`], but gives `None` on a timeout so the caller can say more.
pub fn wait_for_or<T>(timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(v) = probe() {
            return Some(v);
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// A ResourceClaimTemplate asking the DeviceClass `gpuslice.io` for one GPU with `memory`
/// and `cores`.
pub fn claim_template(name: &str, memory: &str, cores: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpuslice.io",
            "count": 1,
            "capacity": {"requests": {"memory": memory, "cores": cores}},
        }}]}}},
    })
}

/// A pod spec running `script` in the test image with the probe mounted, using the claim
/// made from template `template` when one is given.
pub fn pod_spec(script: &str, template: Option<&str>) -> Value {
    let mut spec = json!({
        "automountServiceAccountToken": false,
        "terminationGracePeriodSeconds": 1,
        "enableServiceLinks": false,
        "containers": [{
            "name": "main",
            "image": APP_IMAGE,
            "imagePullPolicy": "Never",
            "command": ["sh", "-c", script],
            "volumeMounts": [{"name": "probe", "mountPath": PROBE_IN_POD, "readOnly": true}],
        }],
        "volumes": [{"name": "probe", "hostPath": {"path": probe().display().to_string(), "type": "File"}}],
    });
    if let Some(t) = template {
        spec["resourceClaims"] = json!([{"name": "gpu", "resourceClaimTemplateName": t}]);
        spec["containers"][0]["resources"] = json!({"claims": [{"name": "gpu"}]});
    }
    spec
}

/// A pod named `name` with [`pod_spec`].
pub fn pod(name: &str, script: &str, template: Option<&str>) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": pod_spec(script, template),
    })
}

/// The registry reservations of the node owned by DRA claims.
pub fn claim_reservations(node: &TestNode) -> Vec<Value> {
    let path = node.state_dir().join("registry.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Vec::new();
    };
    let file: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    file["reservations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["owner"]["kind"] == "dra_claim")
        .cloned()
        .collect()
}

/// Wait helper re-exported for the tests.
pub fn wait<T>(what: &str, probe: impl FnMut() -> Option<T>) -> T {
    wait_for(what, STEP, probe)
}
