//! The Kubernetes path without a cluster: a private containerd (own root, state, socket and
//! config, CRI plugin on, no CNI: pods use the host network), OCI image archives built from
//! the test rootfs and imported with `ctr` (no registry), and a CRI v1 client that drives
//! the runtime service over containerd's unix socket the way the kubelet does.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::image::rootfs;

/// The generated CRI v1 messages and client (`runtime.v1`).
#[allow(clippy::all, clippy::unwrap_used, clippy::expect_used)]
pub mod v1 {
    tonic::include_proto!("runtime.v1");
}

use v1::runtime_service_client::RuntimeServiceClient;

/// State, sockets and runc root of the private containerd (fixed: a test using it holds
/// [`crate::Resource::CriContainerd`]).
pub const RUN_DIR: &str = "/run/gpuslice-e2e-containerd";
/// The pause image the CRI plugin starts sandboxes from.
pub const PAUSE_IMAGE: &str = "localhost/gpuslice-e2e-pause:1";
/// The application image (the test rootfs).
pub const APP_IMAGE: &str = "localhost/gpuslice-e2e:1";
/// containerd's namespace for CRI.
pub const NAMESPACE: &str = "k8s.io";

/// A private containerd; dropping it stops containerd and removes its state.
#[derive(Debug)]
pub struct Containerd {
    pub dir: tempfile::TempDir,
    /// Main config (`version = 2`), ready for `gpuslice configure containerd --config-path`.
    pub config: PathBuf,
    pub socket: PathBuf,
    pub state: PathBuf,
    pub log: PathBuf,
    child: Option<Child>,
}

impl Default for Containerd {
    fn default() -> Self {
        Self::new()
    }
}

impl Containerd {
    /// Writes the config: CRI plugin with the pause image, the native snapshotter, an empty
    /// CNI setup, and a default `runc` runtime with its own `Root` and cgroupfs (which the
    /// `gpuslice` runtime inherits).
    pub fn new() -> Containerd {
        let _ = Command::new("umount").args(["-R", RUN_DIR]).status();
        let _ = std::fs::remove_dir_all(RUN_DIR);
        let dir = tempfile::Builder::new()
            .prefix("gpuslice-containerd-")
            .tempdir()
            .expect("tempdir");
        let run = Path::new(RUN_DIR);
        let state = run.join("state");
        let socket = run.join("containerd.sock");
        for d in [
            dir.path().join("cni/bin"),
            dir.path().join("cni/net.d"),
            state.clone(),
        ] {
            std::fs::create_dir_all(d).expect("containerd dirs");
        }
        let config = dir.path().join("config.toml");
        let text = format!(
            r#"# The end-to-end tests' private containerd.
version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "{socket}"

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "{PAUSE_IMAGE}"
    disable_tcp_service = true
    # Sandboxes ask for oom_score_adj -998; a test host in a container may not lower it.
    restrict_oom_score_adj = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "{cni}/bin"
      conf_dir = "{cni}/net.d"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "native"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          Root = "{run}/runc"
          SystemdCgroup = false
"#,
            root = dir.path().join("root").display(),
            state = state.display(),
            socket = socket.display(),
            cni = dir.path().join("cni").display(),
            run = RUN_DIR,
        );
        std::fs::write(&config, text).expect("write containerd config");
        let log = dir.path().join("containerd.log");
        Containerd {
            dir,
            config,
            socket,
            state,
            log,
            child: None,
        }
    }

    /// Starts containerd and waits until its CRI service answers.
    pub fn start(&mut self) -> Cri {
        let log = std::fs::File::create(&self.log).expect("containerd log");
        let child = Command::new("containerd")
            .arg("--config")
            .arg(&self.config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup"))
            .stderr(log)
            .spawn()
            .expect("start containerd (package containerd)");
        self.child = Some(child);
        let start = Instant::now();
        loop {
            if self.socket.exists() {
                if let Ok(mut cri) = Cri::connect(&self.socket) {
                    if cri.version().is_ok() {
                        return cri;
                    }
                }
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                panic!("containerd exited with {status}:\n{}", self.log_text());
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "containerd's CRI service did not come up:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// containerd's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `ctr -n k8s.io images import` of an archive into the native snapshotter.
    pub fn import(&self, archive: &Path) {
        let out = Command::new("ctr")
            .arg("--address")
            .arg(&self.socket)
            .args([
                "-n",
                NAMESPACE,
                "images",
                "import",
                "--snapshotter",
                "native",
            ])
            .arg(archive)
            .output()
            .expect("ctr images import");
        assert!(
            out.status.success(),
            "ctr images import {}: {}{}",
            archive.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The OCI bundle config of a task (sandbox or container) as runc received it.
    pub fn bundle_spec(&self, id: &str) -> serde_json::Value {
        let p = self
            .state
            .join("io.containerd.runtime.v2.task")
            .join(NAMESPACE)
            .join(id)
            .join("config.json");
        let text = std::fs::read(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
        serde_json::from_slice(&text).expect("config.json")
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = rustix::process::Pid::from_child(&child);
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::Term);
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(10) {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = Command::new("umount").args(["-R", RUN_DIR]).status();
        let _ = std::fs::remove_dir_all(RUN_DIR);
    }
}

/// Writes an OCI image layout archive of the test rootfs named `name` whose default command
/// is `cmd`, for `ctr images import`.
pub fn image_archive(dir: &Path, name: &str, cmd: &[&str]) -> PathBuf {
    image_archive_of(&rootfs(), dir, name, cmd)
}

/// The same, of the root filesystem `root`.
pub fn image_archive_of(root: &Path, dir: &Path, name: &str, cmd: &[&str]) -> PathBuf {
    let layout = dir.join(format!("layout-{}", name.replace(['/', ':'], "_")));
    let blobs = layout.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).expect("layout dirs");
    let layer_tmp = layout.join("layer.tar");
    let status = Command::new("tar")
        .arg("-C")
        .arg(root)
        .args([
            "--exclude",
            "./.gpuslice-e2e-image",
            "--numeric-owner",
            "-cf",
        ])
        .arg(&layer_tmp)
        .arg(".")
        .status()
        .expect("tar");
    assert!(status.success(), "tar of the test rootfs failed");
    let layer = blob(&blobs, &std::fs::read(&layer_tmp).expect("layer"));
    std::fs::remove_file(&layer_tmp).expect("remove layer tmp");
    let config = json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "Cmd": cmd,
        },
        "rootfs": {"type": "layers", "diff_ids": [layer.0.clone()]},
    });
    let config = blob(&blobs, config.to_string().as_bytes());
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config.0, "size": config.1},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer.0, "size": layer.1}],
    });
    let manifest = blob(&blobs, manifest.to_string().as_bytes());
    let index = json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest.0,
            "size": manifest.1,
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"io.containerd.image.name": name},
        }],
    });
    std::fs::write(layout.join("index.json"), index.to_string()).expect("index.json");
    std::fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .expect("oci-layout");
    let archive = layout.with_extension("tar");
    let status = Command::new("tar")
        .arg("-C")
        .arg(&layout)
        .arg("-cf")
        .arg(&archive)
        .args(["oci-layout", "index.json", "blobs"])
        .status()
        .expect("tar");
    assert!(status.success(), "tar of the image layout failed");
    archive
}

/// Stores `bytes` as a blob; returns its digest and size.
fn blob(blobs: &Path, bytes: &[u8]) -> (String, u64) {
    let tmp = blobs.join("incoming");
    std::fs::write(&tmp, bytes).expect("blob");
    let out = Command::new("sha256sum")
        .arg(&tmp)
        .output()
        .expect("sha256sum");
    let hex = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string();
    assert_eq!(hex.len(), 64, "sha256sum output");
    std::fs::rename(&tmp, blobs.join(&hex)).expect("rename blob");
    (format!("sha256:{hex}"), bytes.len() as u64)
}

/// A blocking CRI v1 runtime-service client on one unix socket.
#[derive(Debug)]
pub struct Cri {
    rt: tokio::runtime::Runtime,
    client: RuntimeServiceClient<tonic::transport::Channel>,
}

/// A failed CRI call: the gRPC status code and message.
pub type CriResult<T> = Result<T, tonic::Status>;

impl Cri {
    /// Connects to `socket` (the kubelet's `--container-runtime-endpoint`).
    pub fn connect(socket: &Path) -> Result<Cri, tonic::transport::Error> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        let channel = rt.block_on(crate::kubelet::unix_channel(socket))?;
        Ok(Cri {
            rt,
            client: RuntimeServiceClient::new(channel),
        })
    }

    /// `Version`: the runtime's name and version.
    pub fn version(&mut self) -> CriResult<v1::VersionResponse> {
        let req = v1::VersionRequest {
            version: "v1".into(),
        };
        let c = &mut self.client;
        self.rt
            .block_on(c.version(req))
            .map(tonic::Response::into_inner)
    }

    /// `RunPodSandbox` with `handler` (the RuntimeClass handler); returns the sandbox id.
    pub fn run_pod_sandbox(
        &mut self,
        config: &v1::PodSandboxConfig,
        handler: &str,
    ) -> CriResult<String> {
        let req = v1::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: handler.into(),
        };
        let c = &mut self.client;
        self.rt
            .block_on(c.run_pod_sandbox(req))
            .map(|r| r.into_inner().pod_sandbox_id)
    }

    /// `CreateContainer` in a sandbox; returns the container id.
    pub fn create_container(
        &mut self,
        sandbox: &str,
        config: &v1::ContainerConfig,
        sandbox_config: &v1::PodSandboxConfig,
    ) -> CriResult<String> {
        let req = v1::CreateContainerRequest {
            pod_sandbox_id: sandbox.into(),
            config: Some(config.clone()),
            sandbox_config: Some(sandbox_config.clone()),
        };
        let c = &mut self.client;
        self.rt
            .block_on(c.create_container(req))
            .map(|r| r.into_inner().container_id)
    }

    pub fn start_container(&mut self, id: &str) -> CriResult<()> {
        let req = v1::StartContainerRequest {
            container_id: id.into(),
        };
        let c = &mut self.client;
        self.rt.block_on(c.start_container(req)).map(|_| ())
    }

    /// `StopContainer` with a grace period in seconds (0: kill at once).
    pub fn stop_container(&mut self, id: &str, timeout: i64) -> CriResult<()> {
        let req = v1::StopContainerRequest {
            container_id: id.into(),
            timeout,
        };
        let c = &mut self.client;
        self.rt.block_on(c.stop_container(req)).map(|_| ())
    }

    pub fn remove_container(&mut self, id: &str) -> CriResult<()> {
        let req = v1::RemoveContainerRequest {
            container_id: id.into(),
        };
        let c = &mut self.client;
        self.rt.block_on(c.remove_container(req)).map(|_| ())
    }

    pub fn stop_pod_sandbox(&mut self, id: &str) -> CriResult<()> {
        let req = v1::StopPodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        let c = &mut self.client;
        self.rt.block_on(c.stop_pod_sandbox(req)).map(|_| ())
    }

    pub fn remove_pod_sandbox(&mut self, id: &str) -> CriResult<()> {
        let req = v1::RemovePodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        let c = &mut self.client;
        self.rt.block_on(c.remove_pod_sandbox(req)).map(|_| ())
    }

    /// `ContainerStatus`: the state (`CONTAINER_RUNNING`, `CONTAINER_EXITED`, ...).
    pub fn container_state(&mut self, id: &str) -> CriResult<v1::ContainerState> {
        let req = v1::ContainerStatusRequest {
            container_id: id.into(),
            verbose: false,
        };
        let c = &mut self.client;
        let status = self.rt.block_on(c.container_status(req))?.into_inner();
        Ok(status
            .status
            .map(|s| s.state())
            .unwrap_or(v1::ContainerState::ContainerUnknown))
    }
}

/// A pod on the host network (no CNI) with `annotations`, its logs under `log_dir`.
pub fn pod_config(
    name: &str,
    annotations: &[(&str, &str)],
    log_dir: &Path,
) -> v1::PodSandboxConfig {
    v1::PodSandboxConfig {
        metadata: Some(v1::PodSandboxMetadata {
            name: name.into(),
            uid: format!("{name}-uid"),
            namespace: "default".into(),
            attempt: 0,
        }),
        log_directory: log_dir.display().to_string(),
        annotations: to_map(annotations),
        labels: HashMap::from([("app".to_string(), name.to_string())]),
        linux: Some(v1::LinuxPodSandboxConfig {
            security_context: Some(v1::LinuxSandboxSecurityContext {
                namespace_options: Some(host_network()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A container `name` of `image` running `sh -c script`, with read-only bind `mounts`
/// (host path, container path).
pub fn container_config(
    name: &str,
    image: &str,
    script: &str,
    mounts: &[(&Path, &str)],
) -> v1::ContainerConfig {
    v1::ContainerConfig {
        metadata: Some(v1::ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(v1::ImageSpec {
            image: image.into(),
            ..Default::default()
        }),
        command: vec!["sh".into(), "-c".into(), script.into()],
        log_path: format!("{name}.log"),
        mounts: mounts
            .iter()
            .map(|(host, ctr)| v1::Mount {
                host_path: host.display().to_string(),
                container_path: (*ctr).into(),
                readonly: true,
                ..Default::default()
            })
            .collect(),
        linux: Some(v1::LinuxContainerConfig {
            security_context: Some(v1::LinuxContainerSecurityContext {
                namespace_options: Some(host_network()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn host_network() -> v1::NamespaceOption {
    v1::NamespaceOption {
        network: v1::NamespaceMode::Node as i32,
        pid: v1::NamespaceMode::Container as i32,
        ipc: v1::NamespaceMode::Pod as i32,
        ..Default::default()
    }
}

fn to_map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The message text of a CRI log file (`<time> <stream> <tag> <message>` per line).
pub fn log_messages(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| l.splitn(4, ' ').nth(3).unwrap_or_default())
        .map(|l| format!("{l}\n"))
        .collect()
}

/// Waits until the CRI log at `path` contains `marker`; returns the messages.
pub fn wait_for_log(path: &Path, marker: &str) -> String {
    let start = Instant::now();
    loop {
        let text = log_messages(path);
        if text.contains(marker) {
            return text;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{} never showed {marker:?}:\n{text}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
