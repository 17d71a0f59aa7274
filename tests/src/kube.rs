//! A real Kubernetes control plane for end-to-end tests: starts `scripts/kube-cluster.sh up`
//! in a temporary directory, drives it with the release's own `kubectl`, and takes it down
//! again when dropped.
//!
//! The binaries come from `GPUSLICE_KUBE_BIN_DIR` (the README's test command sets it after
//! `scripts/kube-cluster.sh build`); without it, this runs that build, which reuses its cache
//! and is slow only the first time on a machine.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::env::workspace;

/// The components `scripts/kube-cluster.sh up DIR` starts, as named in `DIR/pids`.
pub const COMPONENTS: [&str; 4] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
];

/// `scripts/kube-cluster.sh` of this checkout.
pub fn script() -> PathBuf {
    workspace().join("scripts/kube-cluster.sh")
}

/// Directory holding kube-apiserver, kube-scheduler, kube-controller-manager, kubectl,
/// kubelet and etcd: `GPUSLICE_KUBE_BIN_DIR`, else what `scripts/kube-cluster.sh build` prints.
pub fn kube_bin_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(d) = std::env::var_os("GPUSLICE_KUBE_BIN_DIR") {
            return PathBuf::from(d);
        }
        let out = Command::new(script())
            .arg("build")
            .stderr(Stdio::inherit())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {} build: {e}", script().display()));
        assert!(
            out.status.success(),
            "{} build failed ({}): the Kubernetes binaries could not be built",
            script().display(),
            out.status
        );
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
    .clone()
}

/// One of the cluster binaries; panics with the build command when it is missing.
pub fn kube_bin(name: &str) -> PathBuf {
    let p = kube_bin_dir().join(name);
    assert!(
        p.exists(),
        "{} is missing: build it with scripts/kube-cluster.sh build",
        p.display()
    );
    p
}

/// A control plane started by `scripts/kube-cluster.sh up` in a temporary directory.
#[derive(Debug)]
pub struct KubeCluster {
    dir: tempfile::TempDir,
    down: bool,
}

impl KubeCluster {
    /// Starts a control plane; panics with the script's output when it does not come up.
    pub fn up() -> KubeCluster {
        KubeCluster::up_with(&[], &[])
    }

    /// Starts a control plane and, with `up DIR --node NAME`, a node for this machine
    /// (containerd 2.x, kubelet, the gpuslice kubelet plugin) whose gpuslice config is
    /// `gpuslice_config` and whose gpuslice binaries are in `gpuslice_bin_dir`; panics with the
    /// script's output when it does not come up.
    pub fn up_with_node(
        name: &str,
        gpuslice_config: &Path,
        gpuslice_bin_dir: &Path,
    ) -> KubeCluster {
        KubeCluster::up_with_node_and(name, gpuslice_config, gpuslice_bin_dir, &[])
    }

    /// As [`KubeCluster::up_with_node`], with more arguments to `up` (`--feature-gates LIST`).
    pub fn up_with_node_and(
        name: &str,
        gpuslice_config: &Path,
        gpuslice_bin_dir: &Path,
        args: &[&str],
    ) -> KubeCluster {
        let mut all = vec!["--node", name];
        all.extend_from_slice(args);
        KubeCluster::up_with(
            &all,
            &[
                ("GPUSLICE_CONFIG", gpuslice_config),
                ("GPUSLICE_BIN_DIR", gpuslice_bin_dir),
            ],
        )
    }

    /// Starts a control plane with `up DIR ARGS…` (e.g. `--webhook`, `--node NAME`), gpuslice's
    /// binaries from the build under test, in the slot of the cluster script that this
    /// thread's test holds (`GPUSLICE_KUBE_SLOT`, [`crate::env::kube_slot`]: what a node
    /// holds of the host is the slot's) and the environment `envs` (e.g. `GPUSLICE_CONFIG`;
    /// an entry there wins over the defaults);
    /// panics with the script's output when it does not come up.
    pub fn up_with(args: &[&str], envs: &[(&str, &Path)]) -> KubeCluster {
        let dir = tempfile::Builder::new()
            .prefix("gpuslice-kube-")
            .tempdir()
            .expect("create a temporary directory for the cluster");
        let out = Command::new(script())
            .arg("up")
            .arg(dir.path())
            .args(args)
            .env("GPUSLICE_KUBE_BIN_DIR", kube_bin_dir())
            .env("GPUSLICE_BIN_DIR", crate::env::bin_dir())
            .env("GPUSLICE_KUBE_SLOT", crate::env::kube_slot().to_string())
            .envs(envs.iter().map(|(k, v)| (k, v.as_os_str())))
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script().display()));
        let mut cluster = KubeCluster { dir, down: false };
        if !out.status.success() {
            cluster.down = true;
            let _ = run_script(&["down".as_ref(), cluster.dir().as_os_str()]);
            panic!(
                "scripts/kube-cluster.sh up {} {} failed ({}):\n{}",
                cluster.dir().display(),
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        cluster
    }

    /// The cluster's directory (`DIR` of the script).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The admin kubeconfig, `DIR/kubeconfig`.
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir().join("kubeconfig")
    }

    /// `DIR/cluster.env`: `API_URL`, `ETCD_URL`, `SCHEDULER_URL`, `CONTROLLER_MANAGER_URL`, `BIN_DIR`.
    pub fn endpoints(&self) -> BTreeMap<String, String> {
        let path = self.dir().join("cluster.env");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        text.lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// The pid `up` recorded for each component.
    pub fn pids(&self) -> BTreeMap<&'static str, u32> {
        COMPONENTS
            .iter()
            .map(|c| {
                let path = self.dir().join("pids").join(format!("{c}.pid"));
                let text = std::fs::read_to_string(&path)
                    .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
                let pid = text
                    .trim()
                    .parse()
                    .unwrap_or_else(|e| panic!("{} holds no pid ({text:?}): {e}", path.display()));
                (*c, pid)
            })
            .collect()
    }

    /// The last `lines` lines of a component's log, for failure messages.
    pub fn log_tail(&self, component: &str, lines: usize) -> String {
        let path = self.dir().join("logs").join(format!("{component}.log"));
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        last_lines(text.lines(), lines)
    }

    /// Runs kubectl against the cluster with the admin kubeconfig.
    pub fn kubectl_output(&self, args: &[&str], stdin: Option<&[u8]>) -> Output {
        let mut cmd = Command::new(kube_bin("kubectl"));
        cmd.arg("--kubeconfig")
            .arg(self.kubeconfig())
            .arg("--request-timeout=30s")
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("start kubectl");
        if let Some(input) = stdin {
            let mut pipe = child.stdin.take().unwrap();
            pipe.write_all(input).expect("write kubectl's input");
        }
        child.wait_with_output().expect("wait for kubectl")
    }

    /// Runs kubectl and returns its stdout; panics with its stderr when it fails.
    pub fn kubectl(&self, args: &[&str]) -> String {
        let out = self.kubectl_output(args, None);
        assert!(
            out.status.success(),
            "kubectl {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl create -f -` of one object (JSON); the API server's answer on failure.
    pub fn create(&self, object: &Value) -> Result<(), String> {
        let out = self.kubectl_output(&["create", "-f", "-"], Some(object.to_string().as_bytes()));
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// `kubectl get ... -o json`, parsed.
    pub fn get_json(&self, args: &[&str]) -> Value {
        let mut all = vec!["get"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-o", "json"]);
        let text = self.kubectl(&all);
        serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("kubectl {} printed no JSON ({e}): {text}", all.join(" ")))
    }

    /// Creates the Node object `name` of a node without a kubelet (labelled
    /// `kubernetes.io/hostname`), with capacity and allocatable set so the scheduler has room
    /// for pods on it.
    pub fn add_node(&self, name: &str) {
        self.create(&serde_json::json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        }))
        .unwrap_or_else(|e| panic!("Node {name} refused: {e}"));
        self.kubectl(&[
            "patch",
            "node",
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            &serde_json::json!({"status": {
                "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
                "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
            }})
            .to_string(),
        ]);
    }

    /// Runs `scripts/kube-cluster.sh restart DIR ARGS…` (the control plane, then the node's
    /// kubelet and plugin, e.g. with other `--feature-gates`); panics with its output when it
    /// fails.
    pub fn restart(&self, args: &[&str]) {
        let mut all: Vec<&std::ffi::OsStr> = vec!["restart".as_ref(), self.dir().as_os_str()];
        all.extend(args.iter().map(|a| std::ffi::OsStr::new(*a)));
        let out = run_script(&all);
        assert!(
            out.status.success(),
            "scripts/kube-cluster.sh restart {} {args:?} failed ({}):\n{}",
            self.dir().display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Runs `scripts/kube-cluster.sh down DIR`; panics when it fails.
    pub fn down(&mut self) {
        self.down = true;
        let out = run_script(&["down".as_ref(), self.dir().as_os_str()]);
        assert!(
            out.status.success(),
            "scripts/kube-cluster.sh down {} failed ({}):\n{}",
            self.dir().display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for KubeCluster {
    fn drop(&mut self) {
        if !self.down {
            let _ = run_script(&["down".as_ref(), self.dir().as_os_str()]);
        }
    }
}

fn run_script(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(script())
        .args(args)
        .env("GPUSLICE_KUBE_BIN_DIR", kube_bin_dir())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script().display()))
}

/// Polls `probe` every 250 ms until it gives a value; panics naming `what` after `timeout`.
pub fn wait_for<T>(what: &str, timeout: Duration, probe: impl FnMut() -> Option<T>) -> T {
    poll(timeout, probe).unwrap_or_else(|| panic!("timed out after {timeout:?} waiting for {what}"))
}

/// The last `n` of `lines`, joined.
fn last_lines<'a>(lines: impl Iterator<Item = &'a str>, n: usize) -> String {
    let all: Vec<&str> = lines.collect();
    all[all.len().saturating_sub(n)..].join("\n")
}

/// Polls `probe` every 250 ms until it gives a value, or `None` once `timeout` has passed.
fn poll<T>(timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

impl KubeCluster {
    /// [`wait_for`] on this cluster: a timeout's panic also shows the pods, the claims, the
    /// latest events and the scheduler's log, so that a wait that failed once says why.
    pub fn wait_for<T>(
        &self,
        what: &str,
        timeout: Duration,
        probe: impl FnMut() -> Option<T>,
    ) -> T {
        poll(timeout, probe).unwrap_or_else(|| {
            panic!(
                "timed out after {timeout:?} waiting for {what}\n{}",
                self.state()
            )
        })
    }

    /// The pods and claims of every namespace, the last 30 events and the scheduler's last
    /// 30 log lines that say something, for failure messages.
    pub fn state(&self) -> String {
        let get = |args: &[&str]| {
            let out = self.kubectl_output(args, None);
            format!(
                "$ kubectl {}\n{}{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        };
        let events = get(&["get", "events", "-A", "--sort-by=.lastTimestamp"]);
        let mut events = events.lines();
        let header = events.next().unwrap_or_default();
        // Less the scheduler's repeated complaint that this control plane has no front-proxy
        // CA (it runs no aggregated API servers).
        let scheduler = self.log_tail("kube-scheduler", 400);
        let scheduler = scheduler
            .lines()
            .filter(|l| !l.contains("extension-apiserver-authentication"));
        format!(
            "{}{}{header}\n{}\nkube-scheduler's log:\n{}",
            get(&["get", "pods", "-A", "-o", "wide"]),
            get(&["get", "resourceclaims", "-A", "-o", "wide"]),
            last_lines(events, 30),
            last_lines(scheduler, 30)
        )
    }
}
