//! Benchmark against a LIVE control plane (`scripts/kube-cluster.sh up`): the real
//! `gpuslice kubelet-plugin` process on a simulated node, timed as the kubelet sees it.
//!
//! 1. Creates the Node object (no kubelet: its status is patched as the tests do) and the
//!    DeviceClass of `packaging/kubernetes/dra/deviceclass.yaml`.
//! 2. Publication: `STARTS` times, starts the plugin and times, from the spawn of the process,
//!    its `dra.sock` appearing and the node's ResourceSlice arriving on a watch of the API
//!    server opened before the spawn; between starts the plugin gets SIGTERM and the slice is
//!    deleted (as a starting kubelet deletes its node's slices).
//! 3. Prepare: `CLAIMS` ResourceClaims (512Mi, 1 core each) and one pod per claim; the real
//!    scheduler allocates them (consumedCapacity, shareID) and binds the pods to the node.
//!    Then, playing the kubelet over `dra.sock`, one `NodePrepareResources` call per claim,
//!    timed from the call to the answer (the plugin reads the claim from the API server, books
//!    it in the node registry beside the claims prepared before it, writes the slice files and
//!    the claim's CDI spec), and one `NodeUnprepareResources` per claim.
//!
//! Run by `scripts/bench-dra.sh`, which starts the cluster and the simulated node:
//!
//!     bench_prepare_live KUBECONFIG GPUSLICE_BIN CONFIG WORK_DIR NODE [CLAIMS] [STARTS]

#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark: a failed step ends it

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use serde_json::json;
use tokio_stream::StreamExt;

const NS: &str = "default";
/// How long one step (a start, the scheduler's allocations) may take before the run fails.
const STEP: Duration = Duration::from_secs(600);

struct Args {
    kubeconfig: PathBuf,
    gpuslice: PathBuf,
    config: PathBuf,
    work: PathBuf,
    node: String,
    claims: usize,
    starts: usize,
}

fn args() -> Args {
    let a: Vec<String> = std::env::args().skip(1).collect();
    if a.len() < 5 {
        eprintln!("usage: bench_prepare_live KUBECONFIG GPUSLICE_BIN CONFIG WORK_DIR NODE [CLAIMS] [STARTS]");
        std::process::exit(2);
    }
    let number = |i: usize, default: usize, what: &str| {
        a.get(i).map_or(default, |s| {
            s.parse()
                .unwrap_or_else(|_| panic!("{what} must be a whole number, not `{s}`"))
        })
    };
    Args {
        kubeconfig: a[0].clone().into(),
        gpuslice: a[1].clone().into(),
        config: a[2].clone().into(),
        work: a[3].clone().into(),
        node: a[4].clone(),
        claims: number(5, 250, "CLAIMS"),
        starts: number(6, 5, "STARTS"),
    }
}

/// The plugin process.
struct Plugin {
    child: Child,
    dra: PathBuf,
    reg: PathBuf,
    log: PathBuf,
}

impl Plugin {
    fn spawn(a: &Args, n: usize) -> Plugin {
        let plugin_dir = a.work.join("kubelet/plugins/gpuslice.io");
        let registration_dir = a.work.join("kubelet/plugins_registry");
        std::fs::create_dir_all(&plugin_dir).unwrap();
        std::fs::create_dir_all(&registration_dir).unwrap();
        let log = a.work.join(format!("plugin-{n}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(&a.gpuslice)
            .arg("--config")
            .arg(&a.config)
            .args(["kubelet-plugin", "--node-name", &a.node])
            .arg("--kubeconfig")
            .arg(&a.kubeconfig)
            .arg("--plugin-dir")
            .arg(&plugin_dir)
            .arg("--registration-dir")
            .arg(&registration_dir)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("start gpuslice kubelet-plugin");
        Plugin {
            child,
            dra: plugin_dir.join("dra.sock"),
            reg: registration_dir.join("gpuslice.io-reg.sock"),
            log,
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM; the plugin must exit 0 and remove its sockets.
    fn stop(mut self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -TERM {}", self.child.id());
        let exit = self.child.wait().unwrap();
        assert!(
            exit.success(),
            "the plugin exited {exit}:\n{}",
            self.log_text()
        );
        assert!(!self.dra.exists(), "{} left behind", self.dra.display());
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Starts the plugin; (plugin, spawn → dra.sock, spawn → slice on the watch).
async fn start_and_time(client: &kube::Client, a: &Args, n: usize) -> (Plugin, Duration, Duration) {
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let fields = format!("spec.nodeName={},spec.driver=gpuslice.io", a.node);
    // The watch starts at the list's version: only what happens after it arrives.
    let list = slices
        .list(&ListParams::default().fields(&fields))
        .await
        .unwrap();
    assert!(
        list.items.is_empty(),
        "slices of {} left: {:?}",
        a.node,
        list
    );
    let version = list.metadata.resource_version.unwrap_or_default();
    let mut events = Box::pin(
        slices
            .watch(&WatchParams::default().fields(&fields), &version)
            .await
            .unwrap(),
    );
    let t0 = Instant::now();
    let plugin = Plugin::spawn(a, n);
    let dra = plugin.dra.clone();
    let socket = tokio::spawn(async move {
        while !dra.exists() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        t0.elapsed()
    });
    let slice = loop {
        match tokio::time::timeout(STEP, events.next()).await {
            Ok(Some(Ok(WatchEvent::Added(_) | WatchEvent::Modified(_)))) => break t0.elapsed(),
            Ok(Some(Ok(WatchEvent::Bookmark(_)))) => {}
            Ok(Some(other)) => panic!("watch of the node's slices: {other:?}"),
            Ok(None) => panic!("the watch of the node's slices ended"),
            Err(_) => panic!(
                "no ResourceSlice of {} within {STEP:?}; plugin log:\n{}",
                a.node,
                plugin.log_text()
            ),
        }
    };
    let socket = tokio::time::timeout(STEP, socket)
        .await
        .expect("dra.sock")
        .unwrap();
    (plugin, socket, slice)
}

async fn delete_slices(client: &kube::Client, node: &str) {
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let fields = format!("spec.nodeName={node},spec.driver=gpuslice.io");
    for s in slices
        .list(&ListParams::default().fields(&fields))
        .await
        .unwrap()
        .items
    {
        let name = s.metadata.name.unwrap();
        slices
            .delete(&name, &DeleteParams::default())
            .await
            .unwrap();
    }
}

async fn create_node_and_class(client: &kube::Client, node: &str, claims: usize) {
    let nodes: Api<Node> = Api::all(client.clone());
    let n: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}},
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &n).await.unwrap();
    let pods = (claims + 10).to_string();
    let status = json!({"status": {
        "capacity": {"cpu": "8", "memory": "32Gi", "pods": pods},
        "allocatable": {"cpu": "8", "memory": "32Gi", "pods": pods},
    }});
    nodes
        .patch_status(node, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let class: DeviceClass = serde_yaml_ng::from_str(include_str!(
        "../../../packaging/kubernetes/dra/deviceclass.yaml"
    ))
    .unwrap();
    Api::<DeviceClass>::all(client.clone())
        .create(&PostParams::default(), &class)
        .await
        .unwrap();
}

/// Creates `count` claims and their pods; returns (name, uid) of each once the scheduler has
/// allocated all of them.
async fn allocated_claims(
    client: &kube::Client,
    node: &str,
    count: usize,
) -> Vec<(String, String)> {
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    for i in 0..count {
        let name = format!("bench-{i}");
        let claim: ResourceClaim = serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpuslice.io", "count": 1,
                "capacity": {"requests": {"memory": "512Mi", "cores": "1"}},
            }}]}},
        }))
        .unwrap();
        claims.create(&PostParams::default(), &claim).await.unwrap();
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "tolerations": [{"operator": "Exists"}],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                "containers": [{
                    "name": "main",
                    "image": "gpuslice.invalid/never-pulled:1",
                    "resources": {"claims": [{"name": "gpu"}]},
                }],
            },
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    let end = Instant::now() + STEP;
    loop {
        let list = claims.list(&ListParams::default()).await.unwrap();
        let done: Vec<(String, String)> = list
            .items
            .iter()
            .filter(|c| {
                c.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with("bench-"))
            })
            .filter(|c| c.status.as_ref().is_some_and(|s| s.allocation.is_some()))
            .map(|c| {
                (
                    c.metadata.name.clone().unwrap(),
                    c.metadata.uid.clone().unwrap(),
                )
            })
            .collect();
        // The scheduler writes the allocation first and binds the pod after it.
        let pods_now = pods.list(&ListParams::default()).await.unwrap();
        let mut bound = 0;
        for p in &pods_now.items {
            if let Some(on) = p.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
                assert_eq!(on, node, "pod {:?} bound elsewhere", p.metadata.name);
                bound += 1;
            }
        }
        if done.len() == count && bound == count {
            let mut done = done;
            done.sort_by_key(|(n, _)| n[6..].parse::<usize>().unwrap());
            return done;
        }
        assert!(
            Instant::now() < end,
            "within {STEP:?} the scheduler allocated {} of {count} claims and bound {bound} pods",
            done.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// "median …, p90 …, p99 …, min …, max …" of `times` (sorted here).
fn summary(times: &mut [Duration]) -> String {
    times.sort();
    let p = |q: f64| times[((times.len() as f64 * q) as usize).min(times.len() - 1)];
    format!(
        "median {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, min {:.2} ms, max {:.2} ms",
        ms(p(0.5)),
        ms(p(0.9)),
        ms(p(0.99)),
        ms(times[0]),
        ms(times[times.len() - 1])
    )
}

fn list_ms(times: &[Duration]) -> String {
    times
        .iter()
        .map(|d| format!("{:.0}", ms(*d)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn main() {
    let a = args();
    assert!(a.starts >= 1, "STARTS must be at least 1");
    // 8 GPUs x 100 cores, 1 core a claim.
    assert!(
        (1..=800).contains(&a.claims),
        "CLAIMS must be 1-800 (1 core each on 8 GPUs)"
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let client = rt
        .block_on(gpuslice_dra::api::client(Some(&a.kubeconfig)))
        .unwrap();
    rt.block_on(create_node_and_class(&client, &a.node, a.claims));

    let (mut sockets, mut published) = (Vec::new(), Vec::new());
    let mut plugin = None;
    for n in 0..a.starts {
        if let Some(p) = plugin.take() {
            Plugin::stop(p);
            rt.block_on(delete_slices(&client, &a.node));
        }
        let (p, socket, slice) = rt.block_on(start_and_time(&client, &a, n));
        sockets.push(socket);
        published.push(slice);
        plugin = Some(p);
    }
    let plugin = plugin.unwrap();
    println!(
        "plugin start -> dra.sock, {} starts: {} (ms: {})",
        a.starts,
        summary(&mut sockets.clone()),
        list_ms(&sockets)
    );
    println!(
        "plugin start -> ResourceSlice on an API watch, {} starts: {} (ms: {})",
        a.starts,
        summary(&mut published.clone()),
        list_ms(&published)
    );

    let t = Instant::now();
    let claims = rt.block_on(allocated_claims(&client, &a.node, a.claims));
    eprintln!(
        "bench: the scheduler allocated {} claims in {:.1} s",
        claims.len(),
        t.elapsed().as_secs_f64()
    );

    let k = support::Kubelet::connect_sockets(&plugin.dra, &plugin.reg);
    let mut prepare = Vec::with_capacity(claims.len());
    for (name, uid) in &claims {
        let t = Instant::now();
        let r = k.prepare(&[(NS, name, uid)]);
        prepare.push(t.elapsed());
        let answer = &r.claims[uid.as_str()];
        assert_eq!(
            answer.error,
            "",
            "prepare of {name}:\n{}",
            plugin.log_text()
        );
        assert_eq!(answer.devices.len(), 1, "{answer:?}");
        assert_eq!(answer.devices[0].pool_name, a.node, "{answer:?}");
        assert_eq!(
            answer.devices[0].cdi_device_ids,
            [gpuslice_kube::claim_device_id(uid)],
            "{answer:?}"
        );
    }
    let mut unprepare = Vec::with_capacity(claims.len());
    for (name, uid) in &claims {
        let t = Instant::now();
        let r = k.unprepare(&[(NS, name, uid)]);
        unprepare.push(t.elapsed());
        assert_eq!(r.claims[uid.as_str()].error, "", "unprepare of {name}");
    }
    println!(
        "prepare of one claim, {} claims allocated by the scheduler, 0..{} booked before: {}",
        claims.len(),
        claims.len() - 1,
        summary(&mut prepare)
    );
    println!(
        "unprepare of one claim, {} claims: {}",
        claims.len(),
        summary(&mut unprepare)
    );
    drop(k);
    plugin.stop();
    assert_empty_registry(&a.config);
}

/// After every unprepare the node registry holds no claim: what the bench booked it released.
fn assert_empty_registry(config: &Path) {
    let config = gpuslice_config::load_config(Some(config), None)
        .unwrap()
        .config;
    let registry: serde_json::Value =
        serde_json::from_slice(&std::fs::read(config.registry_path()).unwrap()).unwrap();
    let left = registry["reservations"].as_array().map_or(0, Vec::len);
    assert_eq!(left, 0, "reservations left after unprepare: {registry}");
}
