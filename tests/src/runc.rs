//! runc bundles made from the test image, and the runtime wrapper driving them.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::env::bin;
use crate::image::copy_rootfs;
use crate::node::{probe, TestNode};

/// runc's state root for the tests (kept apart from the host's /run/runc).
pub const RUNC_ROOT: &str = "/run/gpuslice-e2e-runc";

/// A bundle: `config.json` from `runc spec` and a copy of the test rootfs.
#[derive(Debug)]
pub struct Bundle {
    pub dir: tempfile::TempDir,
}

impl Bundle {
    /// A bundle running `sh -c script` with `annotations`; the probe is mounted at
    /// `/usr/local/bin/gpuslice-probe`.
    pub fn new(script: &str, annotations: &[(&str, &str)]) -> Bundle {
        let dir = tempfile::Builder::new()
            .prefix("gpuslice-bundle-")
            .tempdir()
            .expect("tempdir");
        copy_rootfs(&dir.path().join("rootfs"));
        let out = Command::new("runc")
            .arg("spec")
            .current_dir(dir.path())
            .output()
            .expect("runc spec");
        assert!(
            out.status.success(),
            "runc spec: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let b = Bundle { dir };
        let mut c = b.config();
        c["process"]["terminal"] = json!(false);
        c["process"]["args"] = json!(["sh", "-c", script]);
        let ann: serde_json::Map<String, Value> = annotations
            .iter()
            .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
            .collect();
        c["annotations"] = Value::Object(ann);
        c["mounts"].as_array_mut().expect("mounts").push(json!({
            "destination": "/usr/local/bin/gpuslice-probe",
            "type": "bind",
            "source": probe().display().to_string(),
            "options": ["rbind", "ro"]
        }));
        b.set_config(&c);
        b
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("config.json")
    }

    pub fn config(&self) -> Value {
        serde_json::from_slice(&std::fs::read(self.config_path()).expect("read config.json"))
            .expect("config.json")
    }

    pub fn set_config(&self, c: &Value) {
        std::fs::write(
            self.config_path(),
            serde_json::to_vec_pretty(c).expect("json"),
        )
        .expect("write config.json");
    }
}

/// The runtime wrapper with `GPUSLICE_CONFIG` of `node` and the test runc root.
pub fn runtime(node: &TestNode) -> Command {
    let mut c = Command::new(bin("gpuslice-runtime"));
    c.env("GPUSLICE_CONFIG", node.config_str())
        .arg("--root")
        .arg(RUNC_ROOT);
    c
}

/// `runc run` in the foreground through the wrapper: the container's output and the exit.
pub fn run(node: &TestNode, bundle: &Bundle, id: &str) -> Output {
    runtime(node)
        .args(["run", "-b"])
        .arg(bundle.path())
        .arg(id)
        .stdin(Stdio::null())
        .output()
        .expect("run wrapper")
}

/// A container started detached through the wrapper; its output goes to a file.
#[derive(Debug)]
pub struct Detached {
    pub id: String,
    pub log: PathBuf,
}

/// Starts the bundle detached (`run -d`), output to `<bundle>/out.log`.
pub fn run_detached(node: &TestNode, bundle: &Bundle, id: &str) -> Result<Detached, String> {
    let log = bundle.path().join("out.log");
    let file = std::fs::File::create(&log).expect("log file");
    let status = runtime(node)
        .args(["run", "-d", "-b"])
        .arg(bundle.path())
        .arg(id)
        .stdin(Stdio::null())
        .stdout(file.try_clone().expect("dup"))
        .stderr(file)
        .status()
        .expect("run wrapper");
    if status.success() {
        Ok(Detached {
            id: id.to_string(),
            log,
        })
    } else {
        Err(std::fs::read_to_string(&log).unwrap_or_default())
    }
}

impl Detached {
    /// Waits until the container printed `marker`; returns everything it printed.
    pub fn wait_for(&self, marker: &str) -> String {
        let start = Instant::now();
        loop {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            if text.contains(marker) {
                return text;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "container {} never printed {marker:?}; output:\n{text}",
                self.id
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The container's init pid from `runc state`.
    pub fn pid(&self, node: &TestNode) -> u32 {
        let out = runtime(node)
            .args(["state", &self.id])
            .output()
            .expect("runc state");
        let v: Value = serde_json::from_slice(&out.stdout).expect("state JSON");
        v["pid"].as_u64().expect("pid") as u32
    }

    /// `kill KILL` then `delete --force` through the wrapper (runs poststop).
    pub fn remove(&self, node: &TestNode) {
        let _ = runtime(node).args(["kill", &self.id, "KILL"]).output();
        let out = runtime(node)
            .args(["delete", "--force", &self.id])
            .output()
            .expect("delete");
        assert!(
            out.status.success(),
            "delete {}: {}",
            self.id,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Force-deletes the named containers now and when dropped, thawing them first (a
/// `gpuslice serve` stopped mid-period leaves its duty cycle's last freeze in place).
pub struct Containers<'a> {
    node: &'a TestNode,
    ids: Vec<String>,
}

impl<'a> Containers<'a> {
    pub fn new(node: &'a TestNode, ids: &[&str]) -> Containers<'a> {
        let c = Containers {
            node,
            ids: ids.iter().map(|s| s.to_string()).collect(),
        };
        c.delete();
        c
    }

    fn delete(&self) {
        for id in &self.ids {
            if let Some(pid) = init_pid(self.node, id) {
                thaw(pid);
            }
            let _ = runtime(self.node).args(["delete", "--force", id]).output();
        }
    }
}

impl Drop for Containers<'_> {
    fn drop(&mut self) {
        self.delete();
    }
}

/// The host pid of container `id`'s init, while it exists.
pub fn init_pid(node: &TestNode, id: &str) -> Option<u32> {
    let out = runtime(node).args(["state", id]).output().ok()?;
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    v["pid"].as_u64().map(|p| p as u32).filter(|p| *p > 0)
}

/// The v1 freezer state file of host process `pid` (this host is hybrid v1).
pub fn freezer_state(pid: u32) -> Option<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let path = text.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, c, p) = (f.next()?, f.next()?, f.next()?);
        c.split(',').any(|c| c == "freezer").then(|| p.to_string())
    })?;
    Some(
        PathBuf::from("/sys/fs/cgroup/freezer")
            .join(path.trim_start_matches('/'))
            .join("freezer.state"),
    )
}

/// Thaws the v1 freezer cgroup of host process `pid` (a no-op when there is none).
pub fn thaw(pid: u32) {
    if let Some(f) = freezer_state(pid) {
        let _ = std::fs::write(f, "THAWED");
    }
}
