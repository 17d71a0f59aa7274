//! Nerdctl, built from its Go module (`tests/nerdctl`, nerdctl 2.2.1), on a
//! containerd 2.x of its own (the test node's containerd 2.2.9, `tests/node`) registered with
//! gpuslice by `gpuslice configure containerd`: a slice through `nerdctl run --runtime` and
//! annotations, a whole GPU through `--device gpuslice.io/gpu=0` (CDI, the node spec in the
//! simulated node's own CDI directory, named by `cdi_spec_dirs` of a `nerdctl.toml`), both
//! released by `nerdctl rm`, and bad requests refused with gpuslice's one line and nothing
//! booked.
//!
//! The harness below starts containerd with a private root, state and socket in a temp dir
//! (not the kube node's), loads the test image with `nerdctl load`, and on drop removes the
//! containers, stops containerd and what it left running, and unmounts what it mounted.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use gpuslice_e2e::cri::image_archive;
use gpuslice_e2e::kube::script;
use gpuslice_e2e::node::probe;
use gpuslice_e2e::view::{assert_slice_view, SLICE_CHECKS};
use gpuslice_e2e::{lock, Resource, TestNode};
use serde_json::Value;

/// The test image (busybox and glibc, the test rootfs) as nerdctl names it.
const IMAGE: &str = "localhost/gpuslice-e2e:1";
/// The containerd namespace of the tests' containers.
const NAMESPACE: &str = "gpuslice-nerdctl-e2e";
/// Where containerd 2.x's runc shim keeps runc's state for [`NAMESPACE`].
const RUNC_ROOT: &str = "/run/containerd/runc/gpuslice-nerdctl-e2e";

/// What `scripts/kube-cluster.sh <command>` prints (a build, cached after the first run).
fn built(command: &str) -> PathBuf {
    let out = Command::new(script())
        .arg(command)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} {command}: {e}", script().display()));
    assert!(
        out.status.success(),
        "{} {command} failed ({})",
        script().display(),
        out.status
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// containerd, ctr and containerd-shim-runc-v2 of the test node: `GPUSLICE_NODE_BIN_DIR`,
/// else what `scripts/kube-cluster.sh build-node` prints.
fn node_bin_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        std::env::var_os("GPUSLICE_NODE_BIN_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| built("build-node"))
    })
    .clone()
}

/// The nerdctl binary: `GPUSLICE_NERDCTL_BIN`, else what `scripts/kube-cluster.sh
/// build-nerdctl` prints.
fn nerdctl_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        std::env::var_os("GPUSLICE_NERDCTL_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| built("build-nerdctl"))
    })
    .clone()
}

/// A private containerd 2.x and nerdctl configured for it and for one simulated node.
struct Nerdctl {
    dir: tempfile::TempDir,
    containerd: Child,
    toml: PathBuf,
    /// What `gpuslice configure containerd` told the operator to pass as `--runtime`.
    runtime: PathBuf,
}

impl Nerdctl {
    /// Starts containerd for `node` (registered with `gpuslice configure containerd`, whose
    /// config names `node`'s gpuslice config) and loads [`IMAGE`].
    fn start(node: &TestNode) -> Nerdctl {
        let bin = node_bin_dir();
        for b in ["containerd", "ctr", "containerd-shim-runc-v2"] {
            assert!(
                bin.join(b).exists(),
                "{} is missing: build it with scripts/kube-cluster.sh build-node",
                bin.join(b).display()
            );
        }
        let nerdctl = nerdctl_bin();
        assert!(
            nerdctl.exists(),
            "{} is missing: build it with scripts/kube-cluster.sh build-nerdctl",
            nerdctl.display()
        );
        let dir = tempfile::Builder::new()
            .prefix("gpuslice-nerdctl-")
            .tempdir()
            .expect("tempdir");
        let d = dir.path().to_path_buf();
        let d = d.as_path();
        let c = d.join("containerd");
        std::fs::create_dir_all(&c).expect("containerd dir");
        let config = c.join("config.toml");
        // The CRI plugins are off: nerdctl talks to containerd's own API. The snapshotters
        // that need kernel or C support this host lacks are off too (native is used).
        let text = format!(
            "version = 3\nroot = \"{root}\"\nstate = \"{state}\"\n\
             disabled_plugins = [\"io.containerd.grpc.v1.cri\", \"io.containerd.cri.v1.runtime\", \
             \"io.containerd.cri.v1.images\", \"io.containerd.podsandbox.controller.v1.podsandbox\", \
             \"io.containerd.snapshotter.v1.btrfs\", \"io.containerd.snapshotter.v1.zfs\", \
             \"io.containerd.snapshotter.v1.devmapper\", \"io.containerd.snapshotter.v1.blockfile\", \
             \"io.containerd.snapshotter.v1.erofs\", \"io.containerd.tracing.processor.v1.otlp\", \
             \"io.containerd.internal.v1.opt\"]\n\
             [grpc]\n  address = \"{sock}\"\n[ttrpc]\n  address = \"{sock}.ttrpc\"\n",
            root = c.join("root").display(),
            state = c.join("state").display(),
            sock = c.join("containerd.sock").display(),
        );
        std::fs::write(&config, text).expect("containerd config");
        let out = node.gpuslice(&[
            "configure",
            "containerd",
            "--config-path",
            &config.display().to_string(),
        ]);
        assert!(
            out.status.success(),
            "gpuslice configure containerd: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        let runtime = said
            .split("nerdctl: `--runtime ")
            .nth(1)
            .and_then(|r| r.split('`').next())
            .map(PathBuf::from)
            .unwrap_or_else(|| panic!("configure containerd names no nerdctl --runtime: {said}"));

        let log = std::fs::File::create(c.join("containerd.log")).expect("containerd log");
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        // containerd runs the shim it finds on PATH: this build's, first.
        let child = Command::new(bin.join("containerd"))
            .arg("--config")
            .arg(&config)
            .env("PATH", path)
            .env_remove("GPUSLICE_CONFIG")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log)
            .spawn()
            .expect("start containerd");
        let toml = d.join("nerdctl.toml");
        std::fs::create_dir_all(d.join("cni")).expect("cni dir");
        std::fs::write(
            &toml,
            format!(
                "address = \"{sock}\"\nnamespace = \"{NAMESPACE}\"\nsnapshotter = \"native\"\n\
                 data_root = \"{data}\"\ncgroup_manager = \"cgroupfs\"\n\
                 cni_netconfpath = \"{cni}\"\ncdi_spec_dirs = [\"{cdi}\"]\n",
                sock = c.join("containerd.sock").display(),
                data = d.join("nerdctl").display(),
                cni = d.join("cni").display(),
                cdi = node.cdi_dir.display(),
            ),
        )
        .expect("nerdctl.toml");
        let n = Nerdctl {
            dir,
            containerd: child,
            toml,
            runtime,
        };
        let start = Instant::now();
        while !n.run(&["version"]).status.success() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "containerd did not answer on its socket within 30 s: {}",
                n.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let images = d.join("images");
        std::fs::create_dir_all(&images).expect("image dir");
        let archive = image_archive(&images, IMAGE, &["sh"]);
        n.ok(&["load", "-i", &archive.display().to_string()]);
        n
    }

    /// `nerdctl args…` with this containerd, namespace and `nerdctl.toml`.
    fn run(&self, args: &[&str]) -> Output {
        Command::new(nerdctl_bin())
            .env("NERDCTL_TOML", &self.toml)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run nerdctl")
    }

    /// `nerdctl args…`, which must succeed; its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "nerdctl {args:?} failed: {}{}\ncontainerd:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.log_tail(30)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// containerd's log.
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("containerd/containerd.log"))
            .unwrap_or_default()
    }

    /// The last `lines` lines of containerd's log.
    fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The ids of every container nerdctl lists in [`NAMESPACE`].
    fn containers(&self) -> Vec<String> {
        self.ok(&["ps", "-a", "-q", "--no-trunc"])
            .split_whitespace()
            .map(str::to_string)
            .collect()
    }

    /// The temp dir holding containerd's and nerdctl's files.
    fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// Pids (other than this process) whose command line names `dir`: the shims and loggers
/// containerd started for this test, which outlive it.
fn pids_naming(dir: &Path) -> Vec<i32> {
    let me = std::process::id() as i32;
    let needle = dir.display().to_string();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| *p != me)
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&needle))
        })
        .collect()
}

impl Drop for Nerdctl {
    fn drop(&mut self) {
        if let Ok(out) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.run(&["ps", "-a", "-q", "--no-trunc"])
        })) {
            for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = self.run(&["rm", "-f", id]);
            }
        }
        if let Ok(pid) = i32::try_from(self.containerd.id()) {
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::Term);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while matches!(self.containerd.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.containerd.kill();
        let _ = self.containerd.wait();
        for p in pids_naming(self.dir.path()) {
            if let Some(pid) = rustix::process::Pid::from_raw(p) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::Kill);
            }
        }
        if let Ok(rd) = std::fs::read_dir(RUNC_ROOT) {
            for e in rd.filter_map(|e| e.ok()) {
                let _ = Command::new("runc")
                    .args(["--root", RUNC_ROOT, "delete", "--force"])
                    .arg(e.file_name())
                    .output();
            }
        }
        // The namespace's parent cgroups nerdctl's cgroupfs manager made: empty once the
        // containers are deleted.
        if let Ok(rd) = std::fs::read_dir("/sys/fs/cgroup") {
            for e in rd.filter_map(|e| e.ok()) {
                let _ = std::fs::remove_dir(e.path().join(NAMESPACE));
            }
        }
        // Rootfs mounts under the task state, deepest first, so the temp dir can go.
        let prefix = format!("{}/", self.dir.path().display());
        let mut mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
            .filter(|m| m.starts_with(&prefix))
            .collect();
        mounts.sort_unstable_by(|a, b| b.cmp(a));
        for m in mounts {
            let _ = Command::new("umount").arg("-l").arg(&m).output();
        }
    }
}

/// A simulated node of two 10 GiB GPUs whose CDI specs go to a directory of its own.
fn two_gpus() -> TestNode {
    TestNode::with_models_exact(&[("NVIDIA H200", "10Gi"), ("NVIDIA H200", "10Gi")])
}

/// Waits until `nerdctl logs name` holds `marker`; returns the log.
fn wait_log(n: &Nerdctl, name: &str, marker: &str) -> String {
    let start = Instant::now();
    loop {
        let out = n.run(&["logs", name]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if text.contains(marker) {
            return text;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no {marker:?} in the log of {name} within 30 s: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The `/dev/nvidia*` names in `text` (one word per name).
fn nvidia_nodes(text: &str) -> Vec<String> {
    let mut v: Vec<String> = text
        .split_whitespace()
        .filter(|w| w.starts_with("nvidia"))
        .map(str::to_string)
        .collect();
    v.sort_unstable();
    v
}

fn assert_released(n: &Nerdctl, node: &TestNode) {
    assert!(
        node.reservations().is_empty(),
        "not released after nerdctl rm: {:?}",
        node.reservations()
    );
    assert!(node.leftovers().is_empty(), "{:?}", node.leftovers());
    assert!(n.containers().is_empty(), "{:?}", n.containers());
}

#[test]
fn run_with_the_gpuslice_runtime_gets_its_slice_and_rm_releases_it() {
    let _s = lock(&[Resource::NerdctlNamespace]);
    let node = two_gpus();
    let n = Nerdctl::start(&node);
    // With a non-default gpuslice config the handler runs configure's wrapper, which names
    // the config: containerd itself was started without GPUSLICE_CONFIG.
    assert_eq!(
        n.runtime,
        n.dir().join("containerd/gpuslice-runtime.sh"),
        "the --runtime configure containerd names"
    );
    let name = "e2e-nerdctl-slice";
    let volume = format!("{}:/usr/local/bin/gpuslice-probe:ro", probe().display());
    let runtime = n.runtime.display().to_string();
    let id = n
        .ok(&[
            "run",
            "-d",
            "--name",
            name,
            "--net",
            "none",
            "--runtime",
            &runtime,
            "--annotation",
            "gpuslice.io/memory=4Gi",
            "--annotation",
            "gpuslice.io/cores=30",
            "-v",
            &volume,
            IMAGE,
            "sh",
            "-c",
            SLICE_CHECKS,
        ])
        .trim()
        .to_string();
    assert_eq!(id.len(), 64, "nerdctl run -d printed no container id: {id}");
    let log = wait_log(&n, name, "READY");
    // Its GPU and the control nodes only, the shim preloaded, read-only limits of 4 GiB and
    // 30 %, the environment, the probe seeing 4 GiB; booked for this container id.
    assert_slice_view(&node, &log, &id);

    // Any process of the container (here one nerdctl exec starts) is held to the slice.
    let report: Value = serde_json::from_str(
        n.ok(&[
            "exec",
            name,
            "gpuslice-probe",
            "--json",
            "alloc",
            "--chunk",
            "1Gi",
            "--max",
            "20Gi",
        ])
        .trim(),
    )
    .expect("alloc report JSON");
    assert_eq!(report["total"], 4u64 << 30, "{report}");
    assert_eq!(report["error"], "CUDA_ERROR_OUT_OF_MEMORY", "{report}");
    assert_eq!(report["mem_total"], 4u64 << 30, "{report}");

    n.ok(&["rm", "-f", name]);
    assert_released(&n, &node);
}

#[test]
fn device_gpuslice_io_gpu_0_books_the_whole_gpu_until_rm() {
    let _s = lock(&[Resource::NerdctlNamespace]);
    let node = two_gpus();
    let n = Nerdctl::start(&node);
    let name = "e2e-nerdctl-whole";
    let id = n
        .ok(&[
            "run",
            "-d",
            "--name",
            name,
            "--net",
            "none",
            "--device",
            "gpuslice.io/gpu=0",
            IMAGE,
            "sleep",
            "600",
        ])
        .trim()
        .to_string();
    let res = node.reservations();
    assert_eq!(res.len(), 1, "{res:?}");
    let r = &res[0];
    assert_eq!(r["state"], "bound", "{r}");
    assert_eq!(r["container_id"], id.as_str(), "{r}");
    assert_eq!(r["gpus"][0]["uuid"], node.uuid(0).as_str(), "{r}");
    assert_eq!(r["gpus"][0]["memory"], 10u64 << 30, "{r}");
    assert_eq!(r["gpus"][0]["cores"], 100, "{r}");
    let view = n.ok(&[
        "exec",
        name,
        "sh",
        "-c",
        "ls /dev; if [ -e /etc/ld.so.preload ]; then echo preload; else echo no-preload; fi",
    ]);
    assert_eq!(
        nvidia_nodes(&view),
        ["nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidiactl"],
        "{view}"
    );
    // A whole GPU needs no enforcement: the node spec carries no shim.
    assert!(view.lines().any(|l| l == "no-preload"), "{view}");

    // GPU 0 is not given twice; GPU 1 is free meanwhile.
    let out = n.run(&[
        "run",
        "--rm",
        "--net",
        "none",
        "--device",
        "gpuslice.io/gpu=0",
        IMAGE,
        "true",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "GPU 0 was given whole twice");
    assert!(err.contains("cannot be given whole"), "{err}");
    let other = n.ok(&[
        "run",
        "--rm",
        "--net",
        "none",
        "--device",
        "gpuslice.io/gpu=1",
        IMAGE,
        "ls",
        "/dev",
    ]);
    assert_eq!(
        nvidia_nodes(&other),
        ["nvidia-uvm", "nvidia-uvm-tools", "nvidia1", "nvidiactl"],
        "{other}"
    );
    let res = node.reservations();
    assert_eq!(
        res.len(),
        1,
        "only the running container holds a GPU: {res:?}"
    );
    assert_eq!(res[0]["container_id"], id.as_str());

    n.ok(&["rm", "-f", name]);
    assert_released(&n, &node);
}

#[test]
fn a_bad_request_fails_nerdctl_run_with_gpuslice_s_line_and_books_nothing() {
    let _s = lock(&[Resource::NerdctlNamespace]);
    let node = two_gpus();
    let n = Nerdctl::start(&node);
    let runtime = n.runtime.display().to_string();
    for (ann, want) in [
        (
            "gpuslice.io/memory=lots",
            &["gpuslice: annotation gpuslice.io/memory", "lots", "4Gi"][..],
        ),
        (
            "gpuslice.io/cores=150",
            &["gpuslice: annotation gpuslice.io/cores", "150", "1 to 100"][..],
        ),
        (
            "gpuslice.io/memroy=4Gi",
            &["annotation gpuslice.io/memroy is not a gpuslice annotation"][..],
        ),
        ("gpuslice.io/memory=11Gi", &["free per GPU", "11Gi"][..]),
    ] {
        let out = n.run(&[
            "run",
            "--rm",
            "--net",
            "none",
            "--runtime",
            &runtime,
            "--annotation",
            ann,
            IMAGE,
            "true",
        ]);
        assert!(!out.status.success(), "{ann} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = err.lines().filter(|l| l.contains("gpuslice")).collect();
        assert_eq!(lines.len(), 1, "{ann}: not one line: {err}");
        for w in want {
            assert!(lines[0].contains(w), "{ann}: no {w:?} in {err}");
        }
        assert!(node.reservations().is_empty(), "{ann} booked something");
        assert!(
            node.leftovers().is_empty(),
            "{ann} left {:?}",
            node.leftovers()
        );
        assert!(n.containers().is_empty(), "{ann} left {:?}", n.containers());
    }
}
