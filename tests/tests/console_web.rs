//! The web console `gpuslice console` in a real browser (headless Debian chromium
//! driven by tests/browser/console.js through playwright-core) against the real control
//! plane: Node objects, one real `gpuslice kubelet-plugin` per simulated node, claims
//! allocated by the stock scheduler, `gpuslice serve` per node and a real Prometheus scraping
//! them. Every figure the pages show is compared with what this test computes itself from
//! the API server's ResourceSlices and ResourceClaims and the exporters' own scrapes. The GPU
//! tab's Allocate on a Deployment gives it exactly the pod template `kubectl-gpuslice
//! allocate` gives a twin Deployment (and its form choice, limits, gives the limits form's
//! diff), and Release restores it; a console without
//! `--allow-edit` shows no forms and refuses the POST; one without Prometheus names the
//! missing source and shows `—`, never 0. The screenshots go to
//! `$CARGO_TARGET_TMPDIR/console-screenshots` (docs/console.md copies them).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpuslice_e2e::kube::{wait_for, KubeCluster};
use gpuslice_e2e::kube_node::{claim_template, pod as kube_pod, wait_for_or, KubeNode};
use gpuslice_e2e::kubelet::claim as kubelet_claim;
use gpuslice_e2e::kubelet_plugin::{deployment, pod, resource_claim, slice_of, KubeletPlugin};
use gpuslice_e2e::prometheus::{kubelet_cadvisor, openmetrics, Prometheus};
use gpuslice_e2e::published::{published, PublishedGpu as Gpu, Share};
use gpuslice_e2e::serve::{value, Exporter, Series};
use gpuslice_e2e::{bin, env::workspace, serial, TestNode};
use serde_json::{json, Map, Value};

const NS: &str = "default";
const STEP: Duration = Duration::from_secs(90);
/// The kubeconfig context of scripts/kube-cluster.sh, which the pages name as their rights.
const CONTEXT: &str = "gpuslice-test";
const L4: &str = "device.attributes[\"gpuslice.io\"].productName == \"NVIDIA L4\"";
/// The points a chart over the last hour must have from the history the test writes (one a
/// minute; the console asks for 61).
const HISTORY_POINTS: u64 = 55;
/// The same for a list's sparkline (the console asks for 31, one per 2 minutes).
const SPARK_POINTS: u64 = 27;
/// A list's sparkline's step, seconds.
const SPARK_STEP: u64 = 120;
/// A phone's width in CSS pixels: the pages must not scroll sideways at it.
const PHONE: u64 = 390;
/// How far back the test's history goes: more than the idle window (1h) and the charts.
const HISTORY_SECONDS: u64 = 75 * 60;

/// Unix seconds now.
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// The history the test writes into Prometheus before it starts (OpenMetrics for promtool):
/// [`HISTORY_SECONDS`] up to 30 s before `now`, one sample a minute, of every series the
/// exporters export now, with the `job` and `instance` labels Prometheus gives their
/// scrapes: GPU memory used as now plus a saw-tooth of up to 11 × 256Mi, slice limits as
/// now, the memory used of the slices whose (UUID, limit) is in `busy` at half their limit
/// and of every other slice 0, compute used 0. The slices not in `busy` are thus idle over
/// any window up to an hour.
fn history(exporters: &[Exporter], busy: &[(String, u64)], now: u64) -> String {
    let times: Vec<u64> = (0..)
        .map(|i| now - HISTORY_SECONDS + i * 60)
        .take_while(|t| *t <= now - 30)
        .collect();
    let mut out = Vec::new();
    for e in exporters {
        let scrape = e.scrape();
        for s in &scrape {
            let mut labels = s.labels.clone();
            labels
                .entry("job".into())
                .or_insert_with(|| "gpuslice".into());
            labels
                .entry("instance".into())
                .or_insert_with(|| e.addr.to_string());
            let limit = || {
                scrape
                    .iter()
                    .find(|l| l.name == "gpuslice_slice_memory_limit_bytes" && l.labels == s.labels)
                    .map(|l| l.value as u64)
            };
            let value = |i: usize| -> Option<f64> {
                match s.name.as_str() {
                    "gpuslice_gpu_memory_used_bytes" => {
                        Some(s.value + ((i % 12) as f64) * (256u64 << 20) as f64)
                    }
                    "gpuslice_slice_memory_limit_bytes" | "gpuslice_slice_compute_limit_ratio" => {
                        Some(s.value)
                    }
                    "gpuslice_slice_memory_used_bytes"
                    | "gpuslice_slice_nvml_memory_used_bytes" => {
                        let l = limit()?;
                        let busy = busy
                            .iter()
                            .any(|(u, m)| s.labels.get("uuid") == Some(u) && *m == l);
                        Some(if busy { (l / 2) as f64 } else { 0.0 })
                    }
                    "gpuslice_slice_compute_used_ratio" => Some(0.0),
                    _ => None,
                }
            };
            let samples: Vec<(u64, f64)> = times
                .iter()
                .enumerate()
                .filter_map(|(i, t)| Some((*t, value(i)?)))
                .collect();
            if !samples.is_empty() {
                out.push((s.name.clone(), labels, samples));
            }
        }
    }
    openmetrics(&out)
}

/// Where the screenshots go: `GPUSLICE_SCREENSHOT_DIR`, else the target's tmp dir.
fn screenshot_dir() -> PathBuf {
    std::env::var_os("GPUSLICE_SCREENSHOT_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots"))
}

/// The browser side must be there: a missing part fails the test naming its install step.
fn require_browser() {
    let chromium =
        std::env::var("GPUSLICE_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        Path::new(&chromium).exists(),
        "{chromium} is missing: the console's browser tests need Debian's chromium (scripts/install-deps.sh installs it: apt-get install chromium)"
    );
    let modules = workspace().join("tests/browser/node_modules/playwright-core");
    assert!(
        modules.exists(),
        "{} is missing: run `npm ci --prefix tests/browser` (scripts/test.sh does)",
        modules.display()
    );
    let node = Command::new("node").arg("--version").output();
    assert!(
        node.map(|o| o.status.success()).unwrap_or(false),
        "node is not on PATH: scripts/install-deps.sh installs nodejs and npm"
    );
}

/// Runs tests/browser/console.js on `spec`; panics with its message when a page differs.
fn browser(spec: &Value) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("spec.json");
    std::fs::write(&file, serde_json::to_vec_pretty(spec).unwrap()).unwrap();
    let out = Command::new("node")
        .arg(workspace().join("tests/browser/console.js"))
        .arg(&file)
        .stdin(Stdio::null())
        .output()
        .expect("run node tests/browser/console.js");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the browser test failed ({}):\n{stderr}{stdout}\nspec:\n{}",
        out.status,
        serde_json::to_string_pretty(spec).unwrap()
    );
    eprint!("{stdout}");
}

/// A running `gpuslice console`; killed when dropped.
struct Console {
    child: Child,
    url: String,
    log: Arc<Mutex<String>>,
}

impl Console {
    fn start(cluster: &KubeCluster, prometheus: Option<&str>, allow_edit: bool) -> Console {
        let mut cmd = Command::new(bin("gpuslice"));
        // HAMi's quota names count (team-h's budget) as with a webhook run with --hami-compat.
        cmd.args([
            "console",
            "--listen",
            "127.0.0.1:0",
            "--hami-compat",
            "--kubeconfig",
        ])
        .arg(cluster.kubeconfig())
        .env_remove("GPUSLICE_PROMETHEUS")
        .env_remove("GPUSLICE_HAMI_COMPAT")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        if let Some(url) = prometheus {
            cmd.args(["--prometheus", url]);
        }
        if allow_edit {
            cmd.arg("--allow-edit");
        }
        let mut child = cmd.spawn().expect("start gpuslice console");
        let log = Arc::new(Mutex::new(String::new()));
        let sink = log.clone();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut l = sink.lock().unwrap_or_else(|p| p.into_inner());
                l.push_str(&line);
                l.push('\n');
            }
        });
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        stdout.read_line(&mut first).unwrap();
        let url = first
            .trim()
            .strip_prefix("gpuslice console: listening on ")
            .map(|u| u.trim_end_matches('/').to_string())
            .unwrap_or_else(|| {
                let _ = child.kill();
                let _ = child.wait();
                std::thread::sleep(Duration::from_millis(200));
                panic!(
                    "gpuslice console printed {first:?}, not `gpuslice console: listening on http://ADDR/`:\n{}",
                    log.lock().unwrap()
                )
            });
        Console { child, url, log }
    }

    fn log(&self) -> String {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// A form POST as a same-origin browser sends it: status and body.
    fn post(&self, path: &str, body: &str) -> (u16, String) {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "20", "-o", "-", "-w", "\n%{http_code}"])
            .args(["-H", &format!("Origin: {}", self.url)])
            .args(["-H", "Content-Type: application/x-www-form-urlencoded"])
            .args(["--data-raw", body])
            .arg(format!("{}{path}", self.url))
            .output()
            .expect("curl");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (code.trim().parse().unwrap_or(0), body.to_string())
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the exporters measure, from their own scrapes: per GPU UUID memory used and cores
/// used (utilisation × 100), per claim slice (UUID, namespace, limit) the shim's and the
/// driver's memory used.
struct Measured {
    series: Vec<Series>,
}

impl Measured {
    fn scrape(exporters: &[&Exporter]) -> Measured {
        Measured {
            series: exporters.iter().flat_map(|e| e.scrape()).collect(),
        }
    }

    fn gpu_memory(&self, uuid: &str) -> Option<u64> {
        value(
            &self.series,
            "gpuslice_gpu_memory_used_bytes",
            &[("uuid", uuid)],
        )
        .map(|v| v as u64)
    }

    fn gpu_cores(&self, uuid: &str) -> Option<u64> {
        value(
            &self.series,
            "gpuslice_gpu_utilization_ratio",
            &[("uuid", uuid)],
        )
        .map(|v| (v * 100.0).round() as u64)
    }

    /// The labels of the slice series of `share` (matched on UUID, namespace and limit, as
    /// documented).
    fn slice_labels(&self, share: &Share) -> Option<BTreeMap<String, String>> {
        let ns = share.claim.split('/').next().unwrap();
        let limits: Vec<&Series> = self
            .series
            .iter()
            .filter(|s| {
                s.name == "gpuslice_slice_memory_limit_bytes"
                    && s.labels.get("uuid") == Some(&share.uuid)
                    && s.labels.get("namespace").map(String::as_str) == Some(ns)
                    && s.value as u64 == share.memory
            })
            .collect();
        let [one] = limits.as_slice() else {
            return None;
        };
        Some(one.labels.clone())
    }

    /// The slice series of `share` (matched on UUID, namespace and limit, as documented).
    fn slice(&self, share: &Share, name: &str) -> Option<u64> {
        let ns = share.claim.split('/').next().unwrap();
        let limit = share.memory.to_string();
        let limits: Vec<&Series> = self
            .series
            .iter()
            .filter(|s| {
                s.name == "gpuslice_slice_memory_limit_bytes"
                    && s.labels.get("uuid") == Some(&share.uuid)
                    && s.labels.get("namespace").map(String::as_str) == Some(ns)
                    && (s.value as u64).to_string() == limit
            })
            .collect();
        let [one] = limits.as_slice() else {
            return None;
        };
        let want: Vec<(&str, &str)> = one
            .labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        value(&self.series, name, &want).map(|v| v as u64)
    }
}

/// A host process using a simulated GPU (no reservation): `gpuslice-probe alloc`, held until
/// dropped.
struct HostUse(Child);

impl HostUse {
    fn start(node: &TestNode, index: u64, memory: &str) -> HostUse {
        let sim = node.state_dir().join("sim");
        let mut child = Command::new(gpuslice_e2e::node::probe())
            .arg("--lib")
            .arg(sim.join("usr/lib/x86_64-linux-gnu/libcuda.so.1"))
            .args([
                "--json",
                "--device",
                &index.to_string(),
                "alloc",
                "--chunk",
                memory,
            ])
            .args(["--max", memory, "--hold", "900"])
            .env("GPUSLICE_SIM_STATE", sim.join("state"))
            .env("GPUSLICE_SIM_DEV", sim.join("dev"))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("host probe");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = lines
            .find(|l| l.as_ref().map_or(true, |l| l.contains("\"cmd\":\"alloc\"")))
            .and_then(Result::ok)
            .unwrap_or_else(|| panic!("the host probe ended before allocating {memory}"));
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(v["total"].as_u64().is_some_and(|t| t > 0), "{v}");
        HostUse(child)
    }
}

impl Drop for HostUse {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn opt(v: Option<u64>) -> Value {
    v.map_or(Value::Null, Value::from)
}

/// Sums that are unknown as soon as one part is.
fn sum(mut parts: impl Iterator<Item = Option<u64>>) -> Option<u64> {
    parts.try_fold(0, |a, p| Some(a + p?))
}

/// The pages' expected figures: `/` (node rows and the total), `/nodes/NAME` per node with
/// GPUs and `/pods`. `measured` is `None` for a console without Prometheus.
fn figure_pages(
    cluster: &KubeCluster,
    measured: Option<&Measured>,
    shot: &str,
    node_without_plugin: &str,
) -> Vec<Value> {
    let (gpus, shares) = published(cluster);
    let used = |g: &Gpu| measured.and_then(|m| m.gpu_memory(&g.uuid));
    let cores_used = |g: &Gpu| measured.and_then(|m| m.gpu_cores(&g.uuid));
    let mut nodes: BTreeMap<String, Vec<&Gpu>> = BTreeMap::new();
    for g in gpus.values() {
        nodes.entry(g.node.clone()).or_default().push(g);
    }
    let row = |gs: &[&Gpu]| {
        let memory: u64 = gs.iter().map(|g| g.memory).sum();
        let allocated: u64 = gs.iter().map(|g| g.memory_allocated).sum();
        json!({
            "gpus": gs.len(),
            "memory-capacity": memory,
            "memory-allocated": allocated,
            "memory-free": memory - allocated,
            "memory-used": opt(sum(gs.iter().map(|g| used(g)))),
            "cores-capacity": gs.iter().map(|g| g.cores).sum::<u64>(),
            "cores-allocated": gs.iter().map(|g| g.cores_allocated).sum::<u64>(),
            "cores-used": opt(sum(gs.iter().map(|g| cores_used(g)))),
        })
    };
    let all: Vec<&Gpu> = gpus.values().collect();
    let mut rows = Map::new();
    rows.insert("(total)".into(), row(&all));
    let mut links = Map::new();
    for (name, gs) in &nodes {
        rows.insert(name.clone(), row(gs));
        links.insert(name.clone(), json!([format!("/nodes/{name}")]));
    }
    // Every chart of the Nodes list: each row's GPU memory used, the sum of its GPUs'.
    let sum_of = |gs: &[&Gpu]| {
        let uuids: Vec<&str> = gs.iter().map(|g| g.uuid.as_str()).collect();
        format!(
            "sum(gpuslice_gpu_memory_used_bytes{{uuid=~\"{}\"}})",
            uuids.join("|")
        )
    };
    let mut node_charts = vec![json!({
        "selector": "tr[data-node=\"(total)\"] svg.sparkline[data-chart=\"gpu-memory\"]",
        "query": sum_of(&all), "minPoints": SPARK_POINTS,
    })];
    for (name, gs) in &nodes {
        node_charts.push(json!({
            "selector": format!("tr[data-node=\"{name}\"] svg.sparkline[data-chart=\"gpu-memory\"]"),
            "query": sum_of(gs), "minPoints": SPARK_POINTS,
        }));
    }
    let mut pages = vec![json!({
        "path": "/", "name": "Nodes", "table": "nodes", "key": "data-node",
        "first": "(total)", "rows": rows, "links": links,
        "sparklines": measured.is_some(),
        "charts": if measured.is_some() { json!(node_charts) } else { json!([]) },
        "missing": if measured.is_some() {
            // No kubelet here: cAdvisor's CPU and memory are a missing source.
            json!([format!("plugin:{node_without_plugin}"), "cadvisor"])
        } else {
            json!([format!("plugin:{node_without_plugin}"), "prometheus"])
        },
        "absent": if measured.is_some() { json!(["prometheus"]) } else { json!([]) },
        "screenshot": format!("{shot}nodes.png"),
    })];
    if measured.is_some() && shot.is_empty() {
        pages.push(json!({
            "path": "/", "name": "Nodes", "width": PHONE, "screenshot": "nodes-phone.png",
        }));
    }
    for (name, gs) in &nodes {
        let mut rows = Map::new();
        for g in gs {
            let mut claims: Vec<&str> = g.claims.iter().map(String::as_str).collect();
            claims.sort();
            claims.dedup();
            rows.insert(
                g.uuid.clone(),
                json!({
                    "gpu": format!("{name}/gpu-{} ({})", g.index, g.model.trim_start_matches("NVIDIA ")),
                    "index": g.index,
                    "model": g.model,
                    "memory-capacity": g.memory,
                    "memory-allocated": g.memory_allocated,
                    "memory-share": {"approx": g.memory_allocated * 100 / g.memory, "tol": 1},
                    "memory-used": opt(used(g)),
                    "cores-allocated": g.cores_allocated,
                    "cores-used": opt(cores_used(g)),
                    "claims": {"contains": claims},
                }),
            );
        }
        // Each GPU's slice map: a segment per claim's booking, linked to its pod.
        let mut maps = Map::new();
        for g in gs {
            let segments: Vec<Value> = shares
                .iter()
                .filter(|s| s.uuid == g.uuid)
                .map(|s| {
                    let (ns, claim) = s.claim.split_once('/').unwrap();
                    let c = cluster.get_json(&["resourceclaim", claim, "-n", ns]);
                    let pod = c["status"]["reservedFor"][0]["name"].as_str().unwrap_or("");
                    json!({"claim": s.claim, "pod": pod, "booked": s.memory})
                })
                .collect();
            maps.insert(
                g.uuid.clone(),
                json!({"memory": g.memory, "segments": segments}),
            );
        }
        let charts: Vec<Value> = gs
            .iter()
            .map(|g| {
                json!({
                    "selector": format!("svg.chart[data-gpu=\"{}\"]", g.uuid),
                    "query": format!("gpuslice_gpu_memory_used_bytes{{uuid=\"{}\"}}", g.uuid),
                    "minPoints": HISTORY_POINTS,
                })
            })
            .collect();
        pages.push(json!({
            "path": format!("/nodes/{name}"), "name": "Node", "table": "gpus", "key": "data-gpu",
            "exact": true, "rows": rows, "sliceMaps": maps,
            "charts": if measured.is_some() { json!(charts) } else { json!([]) },
            "missing": if measured.is_some() { json!([]) } else { json!(["prometheus"]) },
            "absent": if measured.is_some() { json!(["prometheus"]) } else { json!([]) },
            "screenshot": if name == "node-a" { json!(format!("{shot}node.png")) } else { Value::Null },
        }));
    }
    if measured.is_some() && shot.is_empty() {
        pages.push(json!({
            "path": "/nodes/node-a", "name": "Node", "width": PHONE, "screenshot": "node-phone.png",
        }));
    }
    pages.push(pods_page(cluster, &shares, measured, shot));
    pages
}

/// `/pods`: one row per container holding a slice (pods whose claims are allocated).
fn pods_page(
    cluster: &KubeCluster,
    shares: &[Share],
    measured: Option<&Measured>,
    shot: &str,
) -> Value {
    let mut rows = Map::new();
    let mut charts = Vec::new();
    for p in cluster.get_json(&["pods", "-A"])["items"]
        .as_array()
        .unwrap()
    {
        // A terminating pod (no kubelet confirms its deletion) still holds its slice.
        let ns = p["metadata"]["namespace"].as_str().unwrap();
        let pod_name = p["metadata"]["name"].as_str().unwrap();
        // The pod's claim entries → the ResourceClaim names.
        let mut claim_of: BTreeMap<String, String> = BTreeMap::new();
        for rc in p["spec"]["resourceClaims"].as_array().into_iter().flatten() {
            let entry = rc["name"].as_str().unwrap().to_string();
            let claim = rc["resourceClaimName"]
                .as_str()
                .map(str::to_string)
                .or_else(|| {
                    p["status"]["resourceClaimStatuses"]
                        .as_array()?
                        .iter()
                        .find(|s| s["name"] == entry.as_str())?["resourceClaimName"]
                        .as_str()
                        .map(str::to_string)
                });
            if let Some(c) = claim {
                claim_of.insert(entry, format!("{ns}/{c}"));
            }
        }
        for c in p["spec"]["containers"].as_array().unwrap() {
            for used in c["resources"]["claims"].as_array().into_iter().flatten() {
                let Some(claim) = claim_of.get(used["name"].as_str().unwrap()) else {
                    continue;
                };
                for s in shares.iter().filter(|s| &s.claim == claim) {
                    // Two claims of one namespace with the same size on one GPU: no series
                    // can be told to be either's (docs/console.md).
                    let ns_of = |c: &str| c.split('/').next().unwrap().to_string();
                    let twins = shares
                        .iter()
                        .filter(|o| {
                            o.uuid == s.uuid
                                && o.memory == s.memory
                                && ns_of(&o.claim) == ns_of(&s.claim)
                        })
                        .count();
                    let measured = measured.filter(|_| twins == 1);
                    let m = |name: &str| measured.and_then(|m| m.slice(s, name));
                    if let Some(labels) = measured.and_then(|m| m.slice_labels(s)) {
                        charts.push(json!({
                            "selector": format!(
                                "tr[data-pod=\"{ns}/{pod_name}\"][data-container=\"{}\"] svg.sparkline[data-chart=\"gpu-memory\"]",
                                c["name"].as_str().unwrap()
                            ),
                            "query": format!(
                                "sum(gpuslice_slice_memory_used_bytes{{uuid=\"{}\",reservation=\"{}\"}})",
                                labels["uuid"], labels["reservation"]
                            ),
                            "minPoints": SPARK_POINTS,
                        }));
                    }
                    rows.insert(
                        format!("{ns}/{pod_name} {}", c["name"].as_str().unwrap()),
                        json!({
                            "memory-limit": s.memory,
                            "cores-share": s.cores,
                            "memory-used": opt(m("gpuslice_slice_memory_used_bytes")),
                            "memory-used-driver": opt(m("gpuslice_slice_nvml_memory_used_bytes")),
                            "cpu": null,
                            "memory": null,
                        }),
                    );
                }
            }
        }
    }
    json!({
        "path": "/pods", "name": "Pods", "table": "pods", "key": ["data-pod", "data-container"],
        "exact": true, "rows": rows,
        "charts": charts,
        "missing": if measured.is_some() { json!(["cadvisor"]) } else { json!(["prometheus"]) },
        "absent": if measured.is_some() { json!(["prometheus"]) } else { json!([]) },
        "screenshot": format!("{shot}pods.png"),
    })
}

/// `/workloads`: the given Deployments with their replicas and slice text.
fn workloads_page(rows: Value, shot: &str) -> Value {
    json!({
        "path": "/workloads", "name": "Workloads", "table": "workloads", "key": "data-workload",
        "rows": rows, "missing": [], "screenshot": format!("{shot}workloads.png"),
    })
}

fn kubectl_gpuslice(cluster: &KubeCluster, args: &[&str]) -> Output {
    Command::new(bin("kubectl-gpuslice"))
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig())
        .arg("--hami-compat")
        .env_remove("GPUSLICE_HAMI_COMPAT")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run kubectl-gpuslice")
}

/// kubectl-gpuslice's one refusal line for `args`, without its `error: ` prefix.
fn refusal(cluster: &KubeCluster, args: &[&str]) -> String {
    let out = kubectl_gpuslice(cluster, args);
    assert!(!out.status.success(), "kubectl-gpuslice {args:?} succeeded");
    let line = String::from_utf8_lossy(&out.stderr).trim().to_string();
    line.strip_prefix("error: ").unwrap_or(&line).to_string()
}

fn deploy(cluster: &KubeCluster, name: &str) -> Value {
    cluster.get_json(&["deployment", name, "-n", NS])
}

/// The console's ResourceClaimTemplates of one workload.
fn templates_of(cluster: &KubeCluster, workload: &str) -> Vec<Value> {
    cluster.get_json(&["resourceclaimtemplates", "-n", NS])["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| {
            t["metadata"]["annotations"]["gpuslice.io/workload"]
                == format!("deployment/{workload}").as_str()
        })
        .cloned()
        .collect()
}

/// A pod template and its one template of the console, with the workload's name and the
/// template's name replaced, so a workload and its twin compare equal.
fn normalised(cluster: &KubeCluster, name: &str) -> (Value, Value) {
    let templates = templates_of(cluster, name);
    assert_eq!(templates.len(), 1, "deployment/{name}: {templates:?}");
    let rct = &templates[0];
    let rct_name = rct["metadata"]["name"].as_str().unwrap().to_string();
    let pod_template = deploy(cluster, name)["spec"]["template"].to_string();
    let rct_text = json!({
        "labels": rct["metadata"]["labels"],
        "annotations": rct["metadata"]["annotations"],
        "spec": rct["spec"],
    })
    .to_string();
    let norm = |s: &str| {
        let s = s.replace(&rct_name, "TEMPLATE");
        let s = s.replace(&format!("\"{name}\""), "\"WORKLOAD\"");
        let s = s.replace(&format!("deployment/{name}\""), "deployment/WORKLOAD\"");
        serde_json::from_str::<Value>(&s).unwrap()
    };
    (norm(&pod_template), norm(&rct_text))
}

/// Waits until `replicas` live pods of `app` use the console's claim, each allocated.
fn wait_allocated(cluster: &KubeCluster, app: &str, replicas: usize) {
    wait_for(
        &format!("{replicas} pods of {app} with allocated claims"),
        STEP,
        || {
            let pods = cluster.get_json(&["pods", "-n", NS, "-l", &format!("app={app}")]);
            let mut n = 0;
            for p in pods["items"].as_array()? {
                // The old pods (no kubelet ever confirms their deletion) hold no claim.
                if !p["metadata"]["deletionTimestamp"].is_null()
                    || p["spec"]["resourceClaims"].is_null()
                {
                    continue;
                }
                let claim =
                    p["status"]["resourceClaimStatuses"][0]["resourceClaimName"].as_str()?;
                let c = cluster.get_json(&["resourceclaim", claim, "-n", NS]);
                c["status"]["allocation"].is_object().then_some(())?;
                n += 1;
            }
            (n == replicas).then_some(())
        },
    );
}

/// Waits until Prometheus has scraped every GPU's series and `slices` slice series live:
/// samples newer than `since` (unix seconds), not only the history written before it started.
fn wait_scraped(prometheus: &Prometheus, uuids: &[String], slices: usize, since: u64) {
    let deadline = Instant::now() + STEP;
    let count = |metric: &str| -> usize {
        let q = format!("count(timestamp({metric}) > {since})");
        let enc: String = form_urlencoded(&q);
        let text = prometheus.get(&format!("/api/v1/query?query={enc}"));
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        v["data"]["result"][0]["value"][1]
            .as_str()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    loop {
        let (g, s) = (
            count("gpuslice_gpu_memory_used_bytes"),
            count("gpuslice_slice_memory_used_bytes"),
        );
        if g >= uuids.len() && s >= slices {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus at {} never scraped every GPU's series ({uuids:?}) and {slices} slices live: {g} GPUs, {s} slices\n{}",
            prometheus.url,
            prometheus.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// `text` percent-encoded for a query string.
fn form_urlencoded(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[test]
#[ignore = "starts a real Kubernetes control plane, plugins, exporters, Prometheus, three consoles and chromium; the README's test command runs it"]
fn the_web_console_shows_the_registry_and_allocates_in_a_browser() {
    // A control plane, plugins, exporters, Prometheus, three consoles and chromium (with
    // playwright's 30 s timeouts) on this machine's 2 cores: the machine alone.
    let _s = serial();
    require_browser();
    let shots = screenshot_dir();
    let mut cluster = KubeCluster::up();
    let nodes: BTreeMap<&str, TestNode> = [
        (
            "node-a",
            TestNode::with_models(&[("NVIDIA H200", "141Gi"), ("NVIDIA H200", "141Gi")]),
        ),
        ("node-b", TestNode::with_models(&[("NVIDIA L4", "24Gi")])),
    ]
    .into_iter()
    .collect();
    for name in nodes.keys() {
        cluster.add_node(name);
    }
    // A node without the plugin: the pages name it as a missing source.
    cluster.add_node("node-c");
    let plugins: BTreeMap<&str, KubeletPlugin> = nodes
        .iter()
        .map(|(name, node)| (*name, KubeletPlugin::start(&cluster, name, node)))
        .collect();
    for name in nodes.keys() {
        wait_for(&format!("the ResourceSlice of {name}"), STEP, || {
            slice_of(&cluster, name)
        });
    }
    let class = workspace().join("packaging/kubernetes/dra/deviceclass.yaml");
    cluster.kubectl(&["create", "-f", &class.display().to_string()]);
    for (name, memory, cores, cel) in [
        ("l4-full", "24Gi", "50", Some(L4)),
        ("big", "100Gi", "40", None),
        ("train", "20Gi", "30", None),
    ] {
        cluster
            .create(&resource_claim(name, 1, memory, cores, cel))
            .unwrap();
        cluster.create(&pod(name, name)).unwrap();
        wait_for(&format!("claim {name} allocated"), STEP, || {
            let c = cluster.get_json(&["resourceclaim", name, "-n", NS]);
            c["status"]["allocation"].is_object().then_some(c)
        });
    }
    // The kubelet's prepare of `train` and `big` books their slices on node-a: the exporter
    // measures them (the history below makes `big` busy and `train` idle).
    let mut prepared = Vec::new();
    for name in ["train", "big"] {
        let c = cluster.get_json(&["resourceclaim", name, "-n", NS]);
        let uid = c["metadata"]["uid"].as_str().unwrap().to_string();
        let pool = c["status"]["allocation"]["devices"]["results"][0]["pool"]
            .as_str()
            .unwrap()
            .to_string();
        let mut kubelet = plugins[pool.as_str()].kubelet();
        let answer = kubelet.prepare(kubelet_claim(NS, name, &uid)).unwrap();
        assert_eq!(answer.error, "", "{}", plugins[pool.as_str()].log_text());
        prepared.push((name, uid, kubelet));
    }
    let train = cluster.get_json(&["resourceclaim", "train", "-n", NS]);
    let train_node = train["status"]["allocation"]["devices"]["results"][0]["pool"]
        .as_str()
        .unwrap()
        .to_string();

    // Real use on train's GPU: a host process holds 3Gi through the simulated driver, so the
    // used figures the pages show are measured ones, not zeros (the enforcer reports it as
    // unowned and leaves it alone). Allocated before the exporters start: every scrape sees it.
    let train_device = train["status"]["allocation"]["devices"]["results"][0]["device"]
        .as_str()
        .unwrap()
        .to_string();
    let train_gpu = &published(&cluster).0[&(train_node.clone(), train_device)];
    let _user = HostUse::start(&nodes[train_node.as_str()], train_gpu.index, "3Gi");

    let exporters: Vec<Exporter> = nodes.values().map(Exporter::start).collect();
    // An hour and a quarter of history in Prometheus before it starts: the charts draw it,
    // the idle view judges the slices by it.
    let (_, shares) = published(&cluster);
    let busy: Vec<(String, u64)> = shares
        .iter()
        .filter(|s| s.claim == format!("{NS}/big"))
        .map(|s| (s.uuid.clone(), s.memory))
        .collect();
    assert_eq!(busy.len(), 1, "{shares:?}");
    let written = history(&exporters, &busy, unix_now());
    assert!(
        written.contains("gpuslice_slice_memory_used_bytes{"),
        "no slice series to write history of:\n{written}"
    );
    let prometheus = Prometheus::start_with(
        &exporters.iter().map(|e| e.addr).collect::<Vec<_>>(),
        "",
        Some(&written),
    );
    let (gpus, _) = published(&cluster);
    let uuids: Vec<String> = gpus.values().map(|g| g.uuid.clone()).collect();
    wait_scraped(&prometheus, &uuids, 2, unix_now());
    let exporter_refs: Vec<&Exporter> = exporters.iter().collect();

    cluster.create(&deployment("web", 2, None)).unwrap();
    cluster.create(&deployment("web-twin", 2, None)).unwrap();
    let original = deploy(&cluster, "web");
    // Budgets with their ledgers set by hand (no webhook here) and Kueue's queues: the
    // Budgets page, the GPU tab's room left and the allocation past the budget.
    let budgets = crate::console_kubectl::budgets(&cluster, ("100Gi", "50Gi"));
    let queues = crate::console_kubectl::queues(&cluster);
    assert_eq!(budgets["namespaces"][0]["quota"], "gpu", "{budgets}");
    assert_eq!(queues[0]["name"], "team-a", "{queues}");

    // The edit console with Prometheus: every page's figures, the filter, the GPU tab.
    let console = Console::start(&cluster, Some(&prometheus.url), true);
    let measured = Measured::scrape(&exporter_refs);
    assert!(
        measured.gpu_memory(&train_gpu.uuid) >= Some(3 << 30),
        "the exporter does not see the host process's 3Gi on {}",
        train_gpu.uuid
    );
    let mut pages = figure_pages(&cluster, Some(&measured), "", "node-c");
    pages.push(workloads_page(
        json!({
            "default/deployment/web": {"replicas": 2, "gpu": "none"},
            "default/deployment/web-twin": {"replicas": 2, "gpu": "none"},
        }),
        "",
    ));
    pages.push(json!({"path": "/nodes/nope", "status": 404, "contains": ["nope"]}));
    // Budgets: each quota's used against its hard value (HAMi's MiB as bytes), and Kueue's
    // ClusterQueues charging gpuslice.io/memory, used against nominal.
    const GIB: u64 = 1 << 30;
    pages.push(json!({
        "path": "/budgets", "name": "Budgets", "table": "budgets", "key": "data-budget", "exact": true,
        "rows": {
            "default/gpu": {
                "names": "gpuslice.io", "memory-hard": 100 * GIB,
                "memory-used": {"value": 50 * GIB, "share": 50.0},
                "cores-hard": "-", "cores-used": "-",
                "gpus-hard": 4, "gpus-used": {"value": 1, "share": 25.0},
            },
            "team-h/hami": {
                "names": "nvidia.com", "memory-hard": 20 * GIB,
                "memory-used": {"value": 5 * GIB, "share": 25.0},
                "cores-hard": 200, "cores-used": {"value": 50, "share": 25.0},
                "gpus-hard": "-",
            },
        },
        "missing": [], "absent": ["kueue", "api"], "contains": ["team-x/hami names HAMi's"],
        "screenshot": "budgets.png",
    }));
    pages.push(json!({
        "path": "/budgets", "name": "Budgets", "table": "queues", "key": "data-queue", "exact": true,
        "rows": {
            "team-a": {"cohort": "pool", "memory-nominal": 8 * GIB, "borrowing-limit": 8 * GIB,
                       "memory-used": {"value": 12 * GIB, "share": 150.0},
                       "memory-borrowed": 4 * GIB, "memory-reserved": 12 * GIB},
            "team-b": {"cohort": "pool", "memory-nominal": 8 * GIB, "borrowing-limit": "unlimited",
                       "memory-used": {"value": 0, "share": 0.0}},
        },
        "missing": [],
    }));
    pages.push(json!({
        "path": "/budgets?namespace=team-x", "name": "Budgets", "table": "budgets", "key": "data-budget",
        "exact": true, "rows": {}, "missing": [],
        "contains": ["No ResourceQuota here names gpuslice's resources", "team-x/hami names HAMi's"],
    }));
    // The idle view: exactly `train` (its history says 0 used), not `big` (half its limit),
    // and the same rows as `kubectl gpuslice pods --idle`.
    let train_share = shares
        .iter()
        .find(|s| s.claim == format!("{NS}/train"))
        .unwrap();
    let idle_key = format!("{NS}/train {}", train_share.uuid);
    pages.push(json!({
        "path": "/idle", "name": "Idle slices", "table": "idle", "key": "data-idle", "exact": true,
        "rows": {idle_key.clone(): {
            "memory-held": train_share.memory, "memory-used-max": 0, "claim": "train",
            "workload": format!("{NS}/pod/train"), "pods": "train",
        }},
        "missing": [], "absent": ["prometheus"], "charts": [], "screenshot": "idle.png",
    }));
    let out = kubectl_gpuslice(
        &cluster,
        &[
            "--prometheus",
            &prometheus.url,
            "pods",
            "--idle",
            "-A",
            "-o",
            "json",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let idle: Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows: Vec<(String, u64)> = idle["idle"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                format!(
                    "{}/{} {}",
                    r["namespace"].as_str().unwrap(),
                    r["claim"].as_str().unwrap_or(""),
                    r["uuid"].as_str().unwrap()
                ),
                r["memoryHeld"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [(idle_key.clone(), train_share.memory)],
        "kubectl gpuslice pods --idle differs from the idle view: {idle}"
    );
    let (text, _) = {
        let out = kubectl_gpuslice(
            &cluster,
            &["--prometheus", &prometheus.url, "pods", "--idle", "-A"],
        );
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            out.status,
        )
    };
    assert!(
        text.lines().count() == 2 && text.contains("pod/train") && text.contains("20Gi"),
        "{text}"
    );
    // What kubectl-gpuslice says to the same bad input (it changes nothing either).
    let bad_memory = refusal(
        &cluster,
        &["allocate", "deployment/web", "--memory", "20GB"],
    );
    let no_fit = refusal(
        &cluster,
        &["allocate", "deployment/web", "--memory", "100Gi"],
    );
    assert!(no_fit.contains("fits 1"), "{no_fit}");
    // 2 pods × 30Gi on 50Gi of 100Gi used: past the budget (the GPUs have the room).
    let over_budget = refusal(
        &cluster,
        &["allocate", "deployment/web", "--memory", "30Gi"],
    );
    assert!(
        over_budget.contains("exceeded quota: default/gpu, requested: limits.gpuslice.io/memory=60Gi, used: limits.gpuslice.io/memory=50Gi, limited: limits.gpuslice.io/memory=100Gi"),
        "{over_budget}"
    );
    let web = "default/deployment/web";
    browser(&json!({
        "url": console.url, "screenshots": shots, "mode": "edit allowed", "rights": CONTEXT,
        "prometheus": prometheus.url,
        "pages": pages,
        "filter": {"available": ["node-a"], "screenshot": "nodes-available.png"},
        "steps": [
            {"do": "allocate", "workload": web, "current": "none", "button": "Allocate",
             "defaultGpus": 1, "releaseForm": false,
             "budget": {"contains": [
                 "quota gpu: limits.gpuslice.io/memory 50Gi of 100Gi used; left for it: 50Gi (25Gi per pod)",
                 "quota gpu: limits.gpuslice.io/gpus 1 of 4 used; left for it: 3 (1 per pod)"]},
             "gpusMax": 1,
             "gpus": 1, "memory": "20Gi", "cores": "10", "dryRun": true, "expect": "ok",
             "diffContains": ["resourceclaimtemplate/web-deployment-gpuslice-", "+- name: gpuslice", "memory: 20Gi"],
             "formScreenshot": "workload-allocate-form.png", "screenshot": "workload-allocate-dry-run.png"},
            // The form choice: limits, though no webhook is installed here (a dry run). Each of
            // web's two containers gets its own limits, which the webhook makes a claim each
            // (capacity mode): 2 pods × 2 slices = 4 GPUs where the budget leaves 3, refused
            // as admission would refuse the pods.
            {"do": "allocate", "workload": web, "gpus": 1, "memory": "10Gi", "cores": "10",
             "form": "limits", "dryRun": true, "expect": "error",
             "resultContains": ["deployment/web: 2 pod(s) of 1 GPU × 10Gi memory, 10 cores in each of 2 containers: exceeded quota: default/gpu, requested: limits.gpuslice.io/gpus=4, used: limits.gpuslice.io/gpus=1, limited: limits.gpuslice.io/gpus=4"]},
            {"do": "allocate", "workload": web, "gpus": 1, "memory": "20GB", "cores": "", "expect": "error",
             "resultContains": [bad_memory]},
            {"do": "allocate", "workload": web, "gpus": 1, "memory": "100Gi", "cores": "", "expect": "error",
             "resultContains": [no_fit], "screenshot": "workload-allocate-refused.png"},
            {"do": "allocate", "workload": web, "gpus": 1, "memory": "30Gi", "cores": "", "expect": "error",
             "resultContains": [over_budget], "screenshot": "workload-allocate-over-budget.png"},
        ],
    }));
    // The dry run and the refusals changed nothing.
    let now = deploy(&cluster, "web");
    assert_eq!(now["spec"], original["spec"]);
    assert_eq!(
        now["metadata"]["generation"],
        original["metadata"]["generation"]
    );
    assert!(templates_of(&cluster, "web").is_empty());

    browser(&json!({
        "url": console.url, "screenshots": shots, "mode": "edit allowed", "rights": CONTEXT,
        "steps": [
            {"do": "allocate", "workload": web, "current": "none", "button": "Allocate",
             "gpus": 1, "memory": "20Gi", "cores": "10", "dryRun": false, "expect": "ok",
             "resultContains": ["deployment/web allocated", "resourceclaimtemplate/web-deployment-gpuslice-"],
             "screenshot": "workload-allocated.png"},
        ],
    }));
    // The browser's Allocate made exactly what kubectl-gpuslice makes of an identical twin.
    let out = kubectl_gpuslice(
        &cluster,
        &[
            "allocate",
            "deployment/web-twin",
            "--memory",
            "20Gi",
            "--cores",
            "10",
            "--gpus",
            "1",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (web_template, web_rct) = normalised(&cluster, "web");
    let (twin_template, twin_rct) = normalised(&cluster, "web-twin");
    assert_eq!(
        web_template, twin_template,
        "the browser's Allocate and kubectl-gpuslice allocate differ"
    );
    assert_eq!(web_rct, twin_rct);
    assert_eq!(
        web_template["spec"]["resourceClaims"],
        json!([{"name": "gpuslice", "resourceClaimTemplateName": "TEMPLATE"}])
    );
    wait_allocated(&cluster, "web", 2);
    wait_allocated(&cluster, "web-twin", 2);

    // After: the figures include the new slices, the tab shows the slice, Edit and Release.
    let measured = Measured::scrape(&exporter_refs);
    let mut pages = figure_pages(&cluster, Some(&measured), "allocated-", "node-c");
    pages.push(workloads_page(
        json!({
            "default/deployment/web": {"replicas": 2, "gpu": {"contains": ["20Gi"], "not": "none"}},
            "default/deployment/web-twin": {"replicas": 2, "gpu": {"contains": ["20Gi"], "not": "none"}},
        }),
        "allocated-",
    ));
    browser(&json!({
        "url": console.url, "screenshots": shots, "mode": "edit allowed", "rights": CONTEXT,
        "prometheus": prometheus.url,
        "pages": pages,
        "steps": [
            {"do": "allocate", "workload": web, "current": {"contains": ["20Gi"], "not": "none"},
             "button": "Edit", "releaseForm": true,
             "gpus": 1, "memory": "30Gi", "cores": "10", "dryRun": true, "expect": "ok",
             "diffContains": ["memory: 30Gi"], "screenshot": "workload-edit-dry-run.png"},
            {"do": "release", "workload": web, "expect": "ok", "resultContains": ["deployment/web released"]},
        ],
    }));
    assert_eq!(
        deploy(&cluster, "web")["spec"]["template"],
        original["spec"]["template"],
        "Release in the browser did not restore the pod template"
    );
    assert!(templates_of(&cluster, "web").is_empty());
    eprintln!("edit console log:\n{}", console.log());
    drop(console);

    // A read-only console: no forms, the sentence, and the POST refused with nothing changed.
    let read_only = Console::start(&cluster, Some(&prometheus.url), false);
    let before = deploy(&cluster, "web");
    browser(&json!({
        "url": read_only.url, "screenshots": shots, "mode": "read-only", "rights": CONTEXT,
        "steps": [{"do": "read-only", "workload": web, "current": "none", "screenshot": "workload-read-only.png"}],
    }));
    for action in ["allocate", "release"] {
        let (status, body) = read_only.post(
            &format!("/workloads/{web}/{action}"),
            "gpus=1&memory=20Gi&cores=10",
        );
        assert_eq!(
            status, 403,
            "POST {action} on a read-only console: {status} {body}"
        );
        assert_eq!(body.trim().lines().count(), 1, "not one line: {body:?}");
    }
    let after = deploy(&cluster, "web");
    assert_eq!(after["spec"], before["spec"]);
    assert_eq!(
        after["metadata"]["generation"],
        before["metadata"]["generation"]
    );
    assert!(templates_of(&cluster, "web").is_empty());
    drop(read_only);

    // A console without Prometheus: the banner naming the source and `—`, never 0.
    let blind = Console::start(&cluster, None, false);
    browser(&json!({
        "url": blind.url, "screenshots": shots, "mode": "read-only", "rights": CONTEXT,
        "pages": figure_pages(&cluster, None, "no-prometheus-", "node-c"),
    }));
    drop(blind);

    for (name, uid, mut kubelet) in prepared {
        let answer = kubelet.unprepare(kubelet_claim(NS, name, &uid)).unwrap();
        assert_eq!(answer.error, "");
    }
    drop(prometheus);
    drop(exporters);
    drop(plugins);
    cluster.down();
}

/// The kubelet's address as the API server publishes it (the Node's InternalIP and its
/// `daemonEndpoints.kubeletEndpoint.Port`), as Prometheus's kubernetes_sd finds it.
fn kubelet_address(cluster: &KubeCluster, node: &str) -> String {
    let n = cluster.get_json(&["node", node]);
    let ip = n["status"]["addresses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["type"] == "InternalIP")
        .and_then(|a| a["address"].as_str())
        .unwrap_or_else(|| panic!("Node {node} has no InternalIP: {}", n["status"]));
    let port = n["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
        .as_u64()
        .unwrap_or_else(|| panic!("Node {node} has no kubelet port: {}", n["status"]));
    format!("{ip}:{port}")
}

#[test]
#[ignore = "starts a real Kubernetes node (containerd, kubelet, plugin), a pod, an exporter, Prometheus scraping the kubelet's cAdvisor, a console and chromium; the README's test command runs it"]
fn cpu_and_memory_columns_show_the_real_kubelets_cadvisor_figures() {
    let _s = serial();
    require_browser();
    let shots = screenshot_dir();
    let node = TestNode::with_models(&[("NVIDIA H200", "141Gi"), ("NVIDIA H200", "141Gi")]);
    let kn = KubeNode::up("node-a", &node);
    let cluster = &kn.cluster;
    cluster
        .create(&claim_template("gpu-8gi", "8Gi", "30"))
        .unwrap();
    // A pod holding its slice: its container's CPU and memory are what cAdvisor measures.
    cluster
        .create(&kube_pod(
            "worker",
            "echo READY; exec sleep 600",
            Some("gpu-8gi"),
        ))
        .unwrap();
    kn.wait_running("worker");
    let exporter = Exporter::start(&node);
    let dir = cluster.dir();
    let scrape = kubelet_cadvisor(
        "node-a",
        &kubelet_address(cluster, "node-a"),
        &dir.join("pki/admin.crt"),
        &dir.join("pki/admin.key"),
    );
    let prometheus = Prometheus::start_with(&[exporter.addr], &scrape, None);
    // cAdvisor's series of the pod's container and of the node (root cgroup), each with two
    // samples at least (the console's CPU is a rate over 5 minutes), and the exporter's.
    let ready = |q: &str| {
        let enc = form_urlencoded(q);
        prometheus
            .get(&format!("/api/v1/query?query={enc}"))
            .contains("\"value\"")
    };
    let held = wait_for_or(STEP, || {
        (ready(r#"rate(container_cpu_usage_seconds_total{pod="worker",container=""}[5m])"#)
            && ready(r#"rate(container_cpu_usage_seconds_total{id="/",node="node-a"}[5m])"#)
            && ready(r#"container_memory_working_set_bytes{pod="worker",container=""}"#)
            && ready("gpuslice_slice_memory_limit_bytes"))
        .then_some(())
    });
    if held.is_none() {
        let q = |q: &str| prometheus.get(&format!("/api/v1/query?query={}", form_urlencoded(q)));
        panic!(
            "Prometheus never held the kubelet's cAdvisor series of the worker and the node:\ntargets: {}\nworker: {}\nroot: {}\nids: {}\n{}",
            prometheus.get("/api/v1/targets"),
            q(r#"container_cpu_usage_seconds_total{pod="worker"}"#),
            q(r#"container_cpu_usage_seconds_total{id="/"}"#),
            q(r#"count by (id) (container_cpu_usage_seconds_total)"#),
            prometheus.log()
        );
    }
    // The console's sparklines end on a step a scrape interval ago: wait until that step
    // comes after the samples above, so its charts have points to compare.
    let first = unix_now();
    let span_wait = Duration::from_secs(SPARK_STEP + 60);
    wait_for(
        "a chart span ending after the first samples",
        span_wait,
        || ((unix_now() - 15) / SPARK_STEP * SPARK_STEP >= first + 2).then_some(()),
    );
    let console = Console::start(cluster, Some(&prometheus.url), false);
    // The pod's own cgroup (`container=""`): the kubelet labels it with the pod whatever the
    // runtime.
    let cpu_pod = r#"sum(rate(container_cpu_usage_seconds_total{namespace="default",pod="worker",container=""}[5m]))"#;
    let mem_pod =
        r#"sum(container_memory_working_set_bytes{namespace="default",pod="worker",container=""})"#;
    let cpu_node = r#"sum(rate(container_cpu_usage_seconds_total{id="/",node="node-a"}[5m]))"#;
    let mem_node = r#"sum(container_memory_working_set_bytes{id="/",node="node-a"})"#;
    let spark = |row: &str, what: &str, query: &str| json!({"selector": format!("{row} svg.sparkline[data-chart=\"{what}\"]"), "query": query});
    let uuids: Vec<String> = published(cluster)
        .0
        .values()
        .map(|g| g.uuid.clone())
        .collect();
    let gpu_sum = format!(
        "sum(gpuslice_gpu_memory_used_bytes{{uuid=~\"{}\"}})",
        uuids.join("|")
    );
    let node_row = "tr[data-node=\"node-a\"]";
    let total_row = "tr[data-node=\"(total)\"]";
    let pod_row = "tr[data-pod=\"default/worker\"][data-container=\"main\"]";
    browser(&json!({
        "url": console.url, "screenshots": shots, "mode": "read-only", "rights": CONTEXT,
        "prometheus": prometheus.url,
        "pages": [
            {"path": "/", "name": "Nodes", "table": "nodes", "key": "data-node",
             "rows": {"node-a": {"cpu": {"measured": cpu_node}, "memory": {"measured": mem_node}}},
             "charts": [
                spark(node_row, "cpu", cpu_node), spark(node_row, "memory", mem_node),
                spark(node_row, "gpu-memory", &gpu_sum),
                spark(total_row, "cpu", cpu_node), spark(total_row, "memory", mem_node),
                spark(total_row, "gpu-memory", &gpu_sum),
             ],
             "missing": [], "absent": ["prometheus", "cadvisor"],
             "screenshot": "kubelet-nodes.png"},
            {"path": "/pods", "name": "Pods", "table": "pods", "key": ["data-pod", "data-container"],
             "rows": {"default/worker main": {"cpu": {"measured": cpu_pod}, "memory": {"measured": mem_pod}}},
             "charts": [
                spark(pod_row, "cpu", cpu_pod), spark(pod_row, "memory", mem_pod),
                spark(pod_row, "gpu-memory", "sum(gpuslice_slice_memory_used_bytes)"),
             ],
             "missing": [], "absent": ["prometheus", "cadvisor"],
             "screenshot": "kubelet-pods.png"},
        ],
    }));
    eprintln!("console log:\n{}", console.log());
    drop(console);
    drop(prometheus);
    drop(exporter);
    kn.cluster
        .kubectl(&["delete", "pod", "worker", "--wait=false"]);
}
