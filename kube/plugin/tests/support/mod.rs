//! The tests' kubelet side: a simulated node's registry in a temp dir, the plugin run on a
//! thread of its own, and gRPC clients over its unix sockets as the kubelet dials them.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuslice_config::PlacementConfig;
use gpuslice_kube::proto::dra::dra_plugin_client::DraPluginClient;
use gpuslice_kube::proto::dra::{
    Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest,
};
use gpuslice_kube::proto::registration::registration_client::RegistrationClient;
use gpuslice_kube::{claim_device_id, PluginOptions, ServeError, SliceWriter, WriteError};
use gpuslice_registry::{FakeSystem, Gpu, Inventory, Options, Registry, Reservation};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tonic::transport::{Channel, Endpoint, Uri};

pub const GIB: u64 = 1 << 30;

/// Writes `<dir>/<uid>.json` (the reservation) in place of the real slice files, and can be
/// told to fail.
pub struct FileWriter {
    pub dir: PathBuf,
    pub fail: AtomicBool,
}

impl FileWriter {
    pub fn file(&self, uid: &str) -> PathBuf {
        self.dir.join(format!("{uid}.json"))
    }
}

impl SliceWriter for FileWriter {
    fn write(&self, uid: &str, r: &Reservation) -> Result<Vec<String>, WriteError> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(WriteError::Failed(format!(
                "cannot write {}: told to fail",
                self.file(uid).display()
            )));
        }
        std::fs::write(self.file(uid), serde_json::to_vec(r).unwrap())
            .map_err(|e| WriteError::Failed(e.to_string()))?;
        Ok(vec![claim_device_id(uid)])
    }

    fn remove(&self, uid: &str) -> Result<(), WriteError> {
        match std::fs::remove_file(self.file(uid)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(WriteError::Failed(e.to_string())),
        }
    }
}

/// One simulated node: state dir, registry with `gpus` (memory in GiB), kubelet dirs.
pub struct Node {
    pub dir: tempfile::TempDir,
    pub name: String,
    pub registry: Arc<Registry>,
    /// The processes the registry sees (the containers a claim's hook records).
    pub system: Arc<FakeSystem>,
    pub writer: Arc<FileWriter>,
    pub options: PluginOptions,
}

impl Node {
    pub fn new(name: &str, gpus: &[u64], kubeconfig: PathBuf) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let system = Arc::new(FakeSystem::new(1_000_000));
        let registry = Registry::open(
            &state,
            Options {
                placement: PlacementConfig {
                    policy: gpuslice_config::Policy::Binpack,
                    memory_overcommit: 1.0,
                    max_slices_per_gpu: None,
                },
                pending_timeout: Duration::from_secs(600),
                recheck_interval: Duration::from_secs(1),
            },
            system.clone(),
            gpuslice_registry::no_cleanup(),
        )
        .unwrap();
        let inv = Inventory {
            gpus: gpus
                .iter()
                .enumerate()
                .map(|(i, gib)| Gpu {
                    index: i as u32,
                    uuid: format!("GPU-{i:08x}-1111-2222-3333-444444444444"),
                    model: if i == 0 {
                        "NVIDIA H200".into()
                    } else {
                        "NVIDIA A100-SXM4-80GB".into()
                    },
                    memory_total: gib * GIB,
                    minor: i as u32,
                    pci_bus_id: None,
                    numa_node: None,
                    pcie_root: None,
                })
                .collect(),
        };
        registry.set_inventory(inv).unwrap();
        let cdi = dir.path().join("cdi");
        std::fs::create_dir_all(&cdi).unwrap();
        let writer = Arc::new(FileWriter {
            dir: cdi,
            fail: AtomicBool::new(false),
        });
        let mut options = PluginOptions::new(name.to_string());
        options.kubeconfig = Some(kubeconfig);
        options.plugin_dir = dir.path().join("plugins/gpuslice.io");
        options.registration_dir = dir.path().join("plugins_registry");
        options.publish_interval = Duration::from_millis(50);
        options.cleanup_interval = Duration::from_millis(200);
        Node {
            dir,
            name: name.to_string(),
            registry: Arc::new(registry),
            system,
            writer,
            options,
        }
    }

    pub fn uuid(&self, index: usize) -> String {
        self.registry.snapshot().unwrap().inventory.gpus[index]
            .uuid
            .clone()
    }

    pub fn reservations(&self) -> Vec<Reservation> {
        self.registry.snapshot().unwrap().reservations
    }

    /// Starts the plugin on a thread; it runs until [`Running::stop`].
    pub fn start(&self) -> Running {
        self.start_with(self.writer.clone())
    }

    /// Starts the plugin with another slice writer.
    pub fn start_with(&self, writer: Arc<dyn SliceWriter>) -> Running {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (options, registry) = (self.options.clone(), self.registry.clone());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(gpuslice_kube::run(options, registry, writer, async {
                let _ = rx.await;
            }))
        });
        let running = Running {
            stop: Some(tx),
            thread: Some(thread),
            dra: self.options.dra_socket(),
            reg: self.options.registration_socket(),
        };
        wait_for("the plugin's sockets", || {
            running.dra.exists() && running.reg.exists()
        });
        running
    }
}

/// A running plugin.
pub struct Running {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), ServeError>>>,
    pub dra: PathBuf,
    pub reg: PathBuf,
}

impl Running {
    /// Stops the plugin as SIGTERM does; what `run` returned.
    pub fn stop(mut self) -> Result<(), ServeError> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Polls `ok` until it holds (at most 20 s: a wait for a condition, not a timing check).
pub fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(20);
    while !ok() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

async fn channel(socket: &Path) -> Channel {
    let path = socket.to_path_buf();
    Endpoint::from_static("http://[::]:50051")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                let s = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(TokioIo::new(s))
            }
        }))
        .await
        .unwrap()
}

/// The kubelet: blocking calls on both sockets.
pub struct Kubelet {
    pub rt: tokio::runtime::Runtime,
    pub dra: DraPluginClient<Channel>,
    pub reg: RegistrationClient<Channel>,
}

impl Kubelet {
    pub fn connect(p: &Running) -> Kubelet {
        Kubelet::connect_sockets(&p.dra, &p.reg)
    }

    /// Dials a plugin's DRA and registration sockets (a plugin of this process or another).
    pub fn connect_sockets(dra: &Path, reg: &Path) -> Kubelet {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (dra, reg) = rt.block_on(async { (channel(dra).await, channel(reg).await) });
        Kubelet {
            rt,
            dra: DraPluginClient::new(dra),
            reg: RegistrationClient::new(reg),
        }
    }

    pub fn prepare(
        &self,
        claims: &[(&str, &str, &str)],
    ) -> gpuslice_kube::proto::dra::NodePrepareResourcesResponse {
        let mut c = self.dra.clone();
        let req = NodePrepareResourcesRequest {
            claims: claims_of(claims),
        };
        self.rt
            .block_on(c.node_prepare_resources(req))
            .unwrap()
            .into_inner()
    }

    pub fn unprepare(
        &self,
        claims: &[(&str, &str, &str)],
    ) -> gpuslice_kube::proto::dra::NodeUnprepareResourcesResponse {
        let mut c = self.dra.clone();
        let req = NodeUnprepareResourcesRequest {
            claims: claims_of(claims),
        };
        self.rt
            .block_on(c.node_unprepare_resources(req))
            .unwrap()
            .into_inner()
    }
}

/// (namespace, name, uid) → claims of a call.
pub fn claims_of(claims: &[(&str, &str, &str)]) -> Vec<Claim> {
    claims
        .iter()
        .map(|(ns, name, uid)| Claim {
            namespace: ns.to_string(),
            name: name.to_string(),
            uid: uid.to_string(),
        })
        .collect()
}

/// A claim object allocated `results` (each `(request, pool, device, memory, cores)`).
pub fn claim(ns: &str, name: &str, uid: &str, results: &[(&str, &str, &str, &str, &str)]) -> Value {
    let results: Vec<Value> = results
        .iter()
        .map(|(req, pool, dev, mem, cores)| {
            json!({"request": req, "driver": "gpuslice.io", "pool": pool, "device": dev,
                "shareID": format!("{uid}-{req}"),
                "consumedCapacity": {"memory": mem, "cores": cores}})
        })
        .collect();
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns, "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpuslice.io"}}]}},
        "status": {"allocation": {"devices": {"results": results}}},
    })
}
