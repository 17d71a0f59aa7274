//! `scripts/kube-cluster.sh` starts a real control plane of the pinned
//! Kubernetes release on 127.0.0.1 — etcd, kube-apiserver, kube-scheduler and
//! kube-controller-manager — that serves `resource.k8s.io/v1` with consumable capacity on,
//! whose controller-manager turns a Pod's ResourceClaimTemplate into a ResourceClaim and whose
//! scheduler allocates it from a shared device; `down` leaves nothing running or listening.
//! No kubelet runs: the test creates the Node object itself.

use std::collections::{BTreeMap, BTreeSet};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use gpuslice_e2e::kube::{kube_bin, kube_bin_dir, script, wait_for, KubeCluster, COMPONENTS};
use gpuslice_e2e::kubelet_plugin::bound_node;
use gpuslice_e2e::lock;
use serde_json::{json, Value};

/// Namespace of the test's objects.
const NS: &str = "default";

#[test]
#[ignore = "starts a real Kubernetes control plane (slow on a cold cache); the README's test command runs it"]
fn control_plane_serves_dra_with_consumable_capacity_and_goes_down() {
    // Its ports are free ones and its files in temporary directories; the machine lock
    // (shared) keeps its load away from the tests that need the machine alone.
    let _s = lock(&[]);
    let mut cluster = KubeCluster::up();
    let pids = cluster.pids();
    let endpoints = cluster.endpoints();
    for (component, pid) in &pids {
        assert!(
            running(*pid),
            "{component} (pid {pid}) is not running after up"
        );
    }
    let ports = listening_ports(&pids);
    for c in COMPONENTS {
        assert!(
            !ports[c].is_empty(),
            "{c} listens on no TCP port; its log:\n{}",
            cluster.log_tail(c, 20)
        );
    }
    for (c, addrs) in &ports {
        for (ip, port) in addrs {
            assert_eq!(
                ip, "127.0.0.1",
                "{c} listens on {ip}:{port}, not only on 127.0.0.1"
            );
        }
    }

    // The API server serves resource.k8s.io/v1 with the four DRA kinds.
    let group: Value =
        serde_json::from_str(&cluster.kubectl(&["get", "--raw", "/apis/resource.k8s.io/v1"]))
            .unwrap();
    let kinds: BTreeSet<&str> = group["resources"]
        .as_array()
        .expect("an APIResourceList")
        .iter()
        .filter_map(|r| r["kind"].as_str())
        .collect();
    for kind in [
        "DeviceClass",
        "ResourceSlice",
        "ResourceClaim",
        "ResourceClaimTemplate",
    ] {
        assert!(
            kinds.contains(kind),
            "resource.k8s.io/v1 lacks {kind}: {kinds:?}"
        );
    }

    // The scheduler and the controller-manager answer on their own (free) ports.
    for key in ["SCHEDULER_URL", "CONTROLLER_MANAGER_URL"] {
        let url = &endpoints[key];
        assert!(url.starts_with("https://127.0.0.1:"), "{key}={url}");
        let pki = cluster.dir().join("pki");
        let out = Command::new(kube_bin("kubectl"))
            .args([
                "--kubeconfig=/dev/null",
                "--insecure-skip-tls-verify",
                "--request-timeout=10s",
            ])
            .arg(format!(
                "--client-certificate={}",
                pki.join("admin.crt").display()
            ))
            .arg(format!("--client-key={}", pki.join("admin.key").display()))
            .arg(format!("--server={url}"))
            .args(["get", "--raw", "/healthz"])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "ok",
            "{key} {url}/healthz: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // A node without a kubelet: the Node object, with room for pods.
    cluster.add_node("node-a");

    // Consumable capacity is on: a shared device with request policies round-trips intact
    // (a disabled feature's fields would be dropped silently) ...
    cluster
        .create(&slice("node-a", true))
        .unwrap_or_else(|e| panic!("the ResourceSlice was refused: {e}"));
    let stored = cluster.get_json(&["resourceslice", "node-a-gpuslice.io"]);
    let device = &stored["spec"]["devices"][0];
    assert_eq!(
        device["allowMultipleAllocations"],
        json!(true),
        "stored device: {device}"
    );
    assert_eq!(
        device["capacity"]["memory"]["requestPolicy"],
        json!({"default": "140Gi", "validRange": {"min": "1Mi", "step": "1Mi", "max": "140Gi"}}),
        "stored device: {device}"
    );
    assert_eq!(
        device["capacity"]["cores"]["requestPolicy"]["validRange"],
        json!({"min": "0", "step": "1", "max": "100"}),
        "stored device: {device}"
    );
    // ... and validated: a request policy on a device that cannot be shared is refused.
    let err = cluster
        .create(&{
            let mut s = slice("node-b", false);
            s["metadata"]["name"] = json!("node-b-gpuslice.io");
            s
        })
        .expect_err("a request policy without allowMultipleAllocations was accepted");
    assert!(
        err.contains("allowMultipleAllocations must be true"),
        "unexpected refusal: {err}"
    );

    // A plain pod is bound by the scheduler.
    cluster.create(&pod("plain", None)).unwrap();
    let node = bound_node(&cluster, "plain");
    assert_eq!(node, "node-a");

    // The controller-manager creates the pod's claim from its template, and the scheduler
    // allocates it from the shared device, booking the consumed capacity.
    cluster
        .create(&json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": "gpuslice.io"},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == \"gpuslice.io\""}}]},
        }))
        .unwrap();
    cluster
        .create(&json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "slice-20g-30", "namespace": NS},
            "spec": {"spec": {"devices": {"requests": [{
                "name": "gpu",
                "exactly": {
                    "deviceClassName": "gpuslice.io", "count": 1,
                    "capacity": {"requests": {"memory": "20Gi", "cores": "30"}},
                },
            }]}}},
        }))
        .unwrap();
    cluster
        .create(&pod("sliced", Some("slice-20g-30")))
        .unwrap();
    let claim_name = wait_for(
        "the resourceclaim controller to create pod sliced's claim",
        Duration::from_secs(90),
        || {
            let p = cluster.get_json(&["pod", "sliced", "-n", NS]);
            p["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
                .as_str()
                .map(str::to_string)
        },
    );
    let claim = cluster.get_json(&["resourceclaim", &claim_name, "-n", NS]);
    assert_eq!(
        claim["metadata"]["ownerReferences"][0]["kind"],
        json!("Pod"),
        "claim: {claim}"
    );
    assert_eq!(
        claim["metadata"]["ownerReferences"][0]["name"],
        json!("sliced"),
        "claim: {claim}"
    );
    assert_eq!(
        claim["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"],
        json!({"memory": "20Gi", "cores": "30"}),
        "claim: {claim}"
    );
    let result = wait_for(
        "the scheduler to allocate pod sliced's claim",
        Duration::from_secs(90),
        || {
            let c = cluster.get_json(&["resourceclaim", &claim_name, "-n", NS]);
            let r = &c["status"]["allocation"]["devices"]["results"][0];
            (!r.is_null()).then(|| r.clone())
        },
    );
    assert_eq!(
        result["driver"],
        json!("gpuslice.io"),
        "allocation: {result}"
    );
    assert_eq!(result["pool"], json!("node-a"), "allocation: {result}");
    assert_eq!(result["device"], json!("gpu-0"), "allocation: {result}");
    assert_eq!(
        result["consumedCapacity"],
        json!({"memory": "20Gi", "cores": "30"}),
        "allocation: {result}"
    );
    assert!(
        result["shareID"].as_str().is_some_and(|s| !s.is_empty()),
        "a shared device's allocation has a share id: {result}"
    );
    let node = bound_node(&cluster, "sliced");
    assert_eq!(node, "node-a");

    // A second cluster runs beside the first: no fixed port clashes.
    let mut second = KubeCluster::up();
    let second_api = second.endpoints()["API_URL"].clone();
    assert_ne!(second_api, endpoints["API_URL"]);
    assert_eq!(second.kubectl(&["get", "--raw", "/readyz"]).trim(), "ok");
    assert!(
        second.get_json(&["pods", "-n", NS])["items"]
            .as_array()
            .unwrap()
            .is_empty(),
        "the second cluster shares the first one's store"
    );
    second.down();

    // down stops everything it started and removes what it wrote; a second down is a no-op.
    let dir = cluster.dir().to_path_buf();
    cluster.down();
    for (component, pid) in &pids {
        assert!(
            !running(*pid),
            "{component} (pid {pid}) still runs after down"
        );
    }
    for (c, addrs) in &ports {
        for (ip, port) in addrs {
            assert!(
                TcpStream::connect((ip.as_str(), *port)).is_err(),
                "{ip}:{port} of {c} still accepts connections after down"
            );
        }
    }
    assert_eq!(
        entries(&dir),
        Vec::<String>::new(),
        "down left files in {}",
        dir.display()
    );
    let again = Command::new(script())
        .arg("down")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        again.status.success(),
        "a second down failed: {}",
        String::from_utf8_lossy(&again.stderr)
    );
}

#[test]
#[ignore = "needs the Kubernetes binaries (slow on a cold cache); the README's test command runs it"]
fn up_names_the_component_that_died_shows_its_log_and_stops_the_rest() {
    let _s = lock(&[]);
    // A bin dir whose kube-apiserver refuses its flags: etcd comes up, the API server dies.
    let bins = tempfile::tempdir().unwrap();
    let real = kube_bin_dir();
    for b in [
        "kube-controller-manager",
        "kube-scheduler",
        "kubectl",
        "kubelet",
        "etcd",
    ] {
        std::os::unix::fs::symlink(real.join(b), bins.path().join(b)).unwrap();
    }
    let wrapper = bins.path().join("kube-apiserver");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec {} --no-such-flag-for-the-test \"$@\"\n",
            real.join("kube-apiserver").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let cluster_dir = dir.path().join("cluster");
    let out = Command::new(script())
        .arg("up")
        .arg(&cluster_dir)
        .env("GPUSLICE_KUBE_BIN_DIR", bins.path())
        .env("GPUSLICE_KUBE_TIMEOUT", "120")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "up with a broken kube-apiserver: {stderr}"
    );
    assert!(
        stderr.contains("kube-apiserver exited before"),
        "the failing component is not named: {stderr}"
    );
    assert!(
        stderr.contains("no-such-flag-for-the-test"),
        "the API server's log tail is not shown: {stderr}"
    );
    // etcd, which had come up, was stopped again.
    assert!(
        cluster_dir.join("logs/etcd.log").exists() && !cluster_dir.join("pids/etcd.pid").exists(),
        "etcd was not started, or its pid file was left behind"
    );
    assert!(
        no_process_mentions(&cluster_dir),
        "a process started for {} still runs",
        cluster_dir.display()
    );
    let down = Command::new(script())
        .arg("down")
        .arg(&cluster_dir)
        .output()
        .unwrap();
    assert!(
        down.status.success(),
        "down after a failed up: {}",
        String::from_utf8_lossy(&down.stderr)
    );
    assert!(
        !cluster_dir.exists(),
        "down left {} (up created it)",
        cluster_dir.display()
    );
}

#[test]
fn up_refuses_bad_arguments_with_a_clear_error() {
    // Every case (of `up`, `restart` and the commands) is refused before anything starts
    // (`up DIR --node NAME` itself is tests/tests/kube_node.rs's: one node per machine).
    let dir = tempfile::tempdir().unwrap();
    for (args, needle) in [
        (
            vec!["up", "DIR", "--node"],
            "--node needs a node name: scripts/kube-cluster.sh up DIR --node NAME",
        ),
        (
            vec!["up", "DIR", "--node", "Bad_Name"],
            "--node 'Bad_Name' is not a node name",
        ),
        (
            vec!["up", "DIR", "--bogus"],
            "unknown argument to up: '--bogus'",
        ),
        (vec!["up"], "up needs a directory"),
        (vec!["reboot"], "unknown command 'reboot'"),
        (vec!["restart"], "restart needs a directory"),
        (
            vec!["restart", "DIR"],
            "has no cluster.env: start it with 'scripts/kube-cluster.sh up",
        ),
        (
            vec!["restart", "DIR", "--bogus"],
            "unknown argument to restart: '--bogus'",
        ),
        (
            vec!["restart", "DIR", "--feature-gates", "DRAConsumableCapacity"],
            "--feature-gates needs a list Name=true|false",
        ),
    ] {
        let args: Vec<String> = args
            .iter()
            .map(|a| {
                if *a == "DIR" {
                    dir.path().display().to_string()
                } else {
                    a.to_string()
                }
            })
            .collect();
        let out = Command::new(script())
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(
            stderr.contains(needle),
            "{args:?}: expected {needle:?} in: {stderr}"
        );
    }
    assert_eq!(
        entries(dir.path()),
        Vec::<String>::new(),
        "a refused up wrote files"
    );
    let help = Command::new(script()).arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(help.status.success());
    for word in [
        "up DIR",
        "down DIR",
        "restart DIR [--feature-gates LIST]",
        "build",
        "GPUSLICE_KUBE_BIN_DIR",
        "--node NAME",
    ] {
        assert!(
            text.contains(word),
            "--help does not mention {word}: {text}"
        );
    }
}

/// The ResourceSlice of a node with one 140 GiB, 100-core GPU, shareable or not.
fn slice(node: &str, shared: bool) -> Value {
    let mut device = json!({
        "name": "gpu-0",
        "attributes": {
            "uuid": {"string": "GPU-00000000-0000-0000-0000-000000000000"},
            "index": {"int": 0},
            "productName": {"string": "NVIDIA H200"},
        },
        "capacity": {
            "memory": {
                "value": "140Gi",
                "requestPolicy": {"default": "140Gi", "validRange": {"min": "1Mi", "step": "1Mi", "max": "140Gi"}},
            },
            "cores": {
                "value": "100",
                "requestPolicy": {"default": "0", "validRange": {"min": "0", "step": "1", "max": "100"}},
            },
        },
    });
    if shared {
        device["allowMultipleAllocations"] = json!(true);
    }
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("{node}-gpuslice.io")},
        "spec": {
            "driver": "gpuslice.io",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [device],
        },
    })
}

/// A pod that tolerates the taints of a node without a kubelet; with a claim from `template`.
fn pod(name: &str, template: Option<&str>) -> Value {
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "main", "image": "gpuslice.invalid/never-pulled:1"}],
        },
    });
    if let Some(t) = template {
        p["spec"]["resourceClaims"] = json!([{"name": "gpu", "resourceClaimTemplateName": t}]);
        p["spec"]["containers"][0]["resources"] = json!({"claims": [{"name": "gpu"}]});
    }
    p
}

/// The process exists and is not a zombie.
fn running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z')),
        Err(_) => false,
    }
}

/// No live process has `dir` on its command line.
fn no_process_mentions(dir: &Path) -> bool {
    let needle = dir.display().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .all(|e| {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                return true;
            };
            let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            !(running(pid) && String::from_utf8_lossy(&cmdline).contains(&needle))
        })
}

/// The TCP addresses (IPv4 and IPv6) each component's process listens on.
fn listening_ports(
    pids: &BTreeMap<&'static str, u32>,
) -> BTreeMap<&'static str, Vec<(String, u16)>> {
    // inode -> (ip, port) of every listening socket on the host.
    let mut listeners = BTreeMap::new();
    for (file, v6) in [("/proc/net/tcp", false), ("/proc/net/tcp6", true)] {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 10 || f[3] != "0A" {
                continue; // not LISTEN
            }
            let (ip_hex, port_hex) = f[1].split_once(':').unwrap();
            let port = u16::from_str_radix(port_hex, 16).unwrap();
            listeners.insert(f[9].to_string(), (hex_ip(ip_hex, v6), port));
        }
    }
    pids.iter()
        .map(|(c, pid)| {
            let mut addrs: Vec<(String, u16)> = std::fs::read_dir(format!("/proc/{pid}/fd"))
                .map(|d| d.filter_map(Result::ok).collect::<Vec<_>>())
                .unwrap_or_default()
                .into_iter()
                .filter_map(|fd| std::fs::read_link(fd.path()).ok())
                .filter_map(|l| {
                    let l = l.to_string_lossy().into_owned();
                    let inode = l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string();
                    listeners.get(&inode).cloned()
                })
                .collect();
            addrs.sort();
            addrs.dedup();
            (*c, addrs)
        })
        .collect()
}

/// An address of /proc/net/tcp{,6} (little-endian 32-bit words) in dotted or IPv6 form.
fn hex_ip(hex: &str, v6: bool) -> String {
    let words: Vec<[u8; 4]> = (0..hex.len() / 8)
        .map(|i| {
            u32::from_str_radix(&hex[i * 8..i * 8 + 8], 16)
                .unwrap()
                .to_le_bytes()
        })
        .collect();
    if !v6 {
        return std::net::Ipv4Addr::from(words[0]).to_string();
    }
    let mut b = [0u8; 16];
    for (i, w) in words.iter().enumerate() {
        b[i * 4..i * 4 + 4].copy_from_slice(w);
    }
    let ip = std::net::Ipv6Addr::from(b);
    ip.to_ipv4_mapped()
        .map_or_else(|| ip.to_string(), |v4| v4.to_string())
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}
