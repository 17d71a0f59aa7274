//! Containerd 1.6 (Debian) running `ctr run --runc-binary gpuslice-runtime
//! --annotation …`; containerd is started by the test with its own root, state and socket.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use gpuslice_e2e::image::copy_rootfs;
use gpuslice_e2e::node::probe;
use gpuslice_e2e::view::{assert_slice_view, wait_for_file, SLICE_CHECKS};
use gpuslice_e2e::{bin, lock, Resource, TestNode};

/// A private containerd; killed when dropped.
struct Containerd {
    dir: tempfile::TempDir,
    child: Child,
}

impl Containerd {
    fn start(gpuslice_config: &str) -> Containerd {
        let dir = tempfile::Builder::new()
            .prefix("gpuslice-containerd-")
            .tempdir()
            .unwrap();
        let d = dir.path();
        let config = format!(
            "version = 2\nroot = \"{r}\"\nstate = \"{s}\"\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n\
             [grpc]\n  address = \"{a}\"\n[ttrpc]\n  address = \"{a}.ttrpc\"\n",
            r = d.join("root").display(),
            s = d.join("state").display(),
            a = d.join("containerd.sock").display(),
        );
        std::fs::write(d.join("config.toml"), config).unwrap();
        let log = std::fs::File::create(d.join("containerd.log")).unwrap();
        let child = Command::new("containerd")
            .arg("--config")
            .arg(d.join("config.toml"))
            // containerd hands its environment to the shim, which runs the runtime with it:
            // that is how gpuslice-runtime finds a non-default gpuslice config.
            .env("GPUSLICE_CONFIG", gpuslice_config)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start containerd (package containerd)");
        let c = Containerd { dir, child };
        let start = Instant::now();
        while !c.socket().exists() || !c.ctr(&["version"]).status.success() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "containerd did not start: {}",
                c.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        c
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("containerd.sock")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default()
    }

    fn ctr(&self, args: &[&str]) -> Output {
        Command::new("ctr")
            .arg("--address")
            .arg(self.socket())
            .args(["--namespace", "gpuslice-e2e"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run ctr")
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Shims outlive containerd: stop them, and remove what a failed test left in runc's
        // state for this namespace.
        let _ = Command::new("pkill")
            .arg("-f")
            .arg(self.dir.path().display().to_string())
            .status();
        let root = "/run/containerd/runc/gpuslice-e2e";
        if let Ok(rd) = std::fs::read_dir(root) {
            for e in rd.filter_map(|e| e.ok()) {
                let _ = Command::new("runc")
                    .args(["--root", root, "delete", "--force"])
                    .arg(e.file_name())
                    .output();
            }
        }
    }
}

/// `ctr run --rootfs` has no image config to take a PATH from.
const PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

#[test]
fn ctr_run_with_gpuslice_runtime_gets_its_slice() {
    let _s = lock(&[Resource::Cdi, Resource::CtrNamespace]);
    let node = TestNode::new(&["10Gi", "10Gi"]);
    let containerd = Containerd::start(&node.config_str());
    let work = tempfile::tempdir().unwrap();
    let rootfs = work.path().join("rootfs");
    copy_rootfs(&rootfs);
    let log = work.path().join("task.log");
    let id = "e2e-ctr-slice";
    let runtime = bin("gpuslice-runtime");
    let mount = format!(
        "type=bind,src={},dst=/usr/local/bin/gpuslice-probe,options=rbind:ro",
        probe().display()
    );
    let log_uri = format!("file://{}", log.display());
    let out = containerd.ctr(&[
        "run",
        "-d",
        "--runc-binary",
        &runtime.display().to_string(),
        "--annotation",
        "gpuslice.io/memory=4Gi",
        "--annotation",
        "gpuslice.io/cores=30",
        "--mount",
        &mount,
        "--log-uri",
        &log_uri,
        "--env",
        PATH,
        "--rootfs",
        &rootfs.display().to_string(),
        id,
        "sh",
        "-c",
        SLICE_CHECKS,
    ]);
    assert!(
        out.status.success(),
        "ctr run: {}{}",
        String::from_utf8_lossy(&out.stderr),
        containerd.log()
    );
    let text = wait_for_file(&log, "READY");
    assert_slice_view(&node, &text, id);

    let _ = containerd.ctr(&["task", "kill", "-s", "KILL", id]);
    let start = Instant::now();
    loop {
        let out = containerd.ctr(&["task", "delete", id]);
        if out.status.success() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "task delete: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = containerd.ctr(&["container", "delete", id]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        node.reservations().is_empty(),
        "not released: {:?}",
        node.reservations()
    );
    assert!(node.leftovers().is_empty(), "{:?}", node.leftovers());
}

#[test]
fn ctr_misfit_fails_with_the_capacity_line() {
    let _s = lock(&[Resource::Cdi, Resource::CtrNamespace]);
    let node = TestNode::new(&["10Gi"]);
    let containerd = Containerd::start(&node.config_str());
    let work = tempfile::tempdir().unwrap();
    let rootfs = work.path().join("rootfs");
    copy_rootfs(&rootfs);
    let runtime = bin("gpuslice-runtime");
    let out = containerd.ctr(&[
        "run",
        "--rm",
        "--runc-binary",
        &runtime.display().to_string(),
        "--annotation",
        "gpuslice.io/memory=11Gi",
        "--env",
        PATH,
        "--rootfs",
        &rootfs.display().to_string(),
        "e2e-ctr-misfit",
        "true",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    // containerd shows the runtime's --log message to the user.
    assert!(
        err.contains("free per GPU") && err.contains("11Gi"),
        "{err}"
    );
    assert!(node.reservations().is_empty());
    assert!(node.leftovers().is_empty(), "{:?}", node.leftovers());
}
