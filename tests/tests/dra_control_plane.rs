//! Against the real control plane: two Node objects (no kubelet), one real
//! `gpuslice kubelet-plugin` process per node, each on a simulated GPU node of its own with
//! other GPUs and sizes. The stock scheduler places claims of several sizes, a 2-GPU claim and
//! a claim selecting a model by `productName` on what the plugins publish; what cannot fit
//! stays Pending with the scheduler's reason. Then the test plays the kubelet over each
//! plugin's `dra.sock`: prepare books exactly the scheduler's `consumedCapacity` and writes
//! limits and a schema-valid CDI spec naming the chosen GPUs, a real runc container given that
//! spec is held to its slice by the shim, unprepare releases, and an annotation-path booking
//! shrinks the capacity the node's ResourceSlice offers.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use gpuslice_config::quantity::parse_kube_quantity;
use gpuslice_e2e::kube::KubeCluster;
use gpuslice_e2e::kubelet::{claim as kubelet_claim, Kubelet};
use gpuslice_e2e::kubelet_plugin::{
    bound_node, no_room, pod, resource_claim, slice_of, KubeletPlugin,
};
use gpuslice_e2e::runc::{run_detached, runtime, Bundle, RUNC_ROOT};
use gpuslice_e2e::{env::workspace, lock, TestNode};
use serde_json::{json, Value};

#[path = "../../cdi/tests/schema/validator.rs"]
mod cdi_schema;

/// Namespace of the test's objects.
const NS: &str = "default";
const GIB: u64 = 1 << 30;
/// How long the control plane gets for one step (scheduling, slice publication).
const STEP: Duration = Duration::from_secs(90);

/// A container started through `gpuslice-runtime`; force-deleted when dropped.
struct Container<'a> {
    node: &'a TestNode,
    id: String,
}

impl Drop for Container<'_> {
    fn drop(&mut self) {
        let _ = runtime(self.node)
            .args(["delete", "--force", &self.id])
            .output();
    }
}

/// Device `device` of a slice.
fn device<'a>(slice: &'a Value, device: &str) -> &'a Value {
    slice["spec"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == device)
        .unwrap_or_else(|| panic!("no device {device} in {slice}"))
}

/// The field names of a JSON object (none for anything else).
fn keys(v: &Value) -> BTreeSet<&str> {
    v.as_object()
        .map(|o| o.keys().map(String::as_str).collect())
        .unwrap_or_default()
}

fn quantity(v: &Value) -> u64 {
    let s = v.as_str().unwrap_or_else(|| panic!("not a quantity: {v}"));
    parse_kube_quantity(s).unwrap_or_else(|e| panic!("{e}"))
}

/// The reservation owned by claim `uid` in the node's registry file.
fn claim_reservation(node: &TestNode, uid: &str) -> Option<Value> {
    let text = std::fs::read_to_string(node.state_dir().join("registry.json")).ok()?;
    let file: Value = serde_json::from_str(&text).unwrap();
    file["reservations"]
        .as_array()?
        .iter()
        .find(|r| r["owner"]["kind"] == "dra_claim" && r["owner"]["claim_uid"] == uid)
        .cloned()
}

/// Path of claim `uid`'s own CDI spec on `node`.
fn claim_spec_path(node: &TestNode, uid: &str) -> PathBuf {
    node.cdi_dir
        .join(gpuslice_cdi::transient_spec_file_name(gpuslice_kube::CLAIM_KIND, uid).unwrap())
}

/// What the test asked for and where it must land.
struct Case {
    name: &'static str,
    count: u32,
    memory: &'static str,
    cores: &'static str,
    cel: Option<&'static str>,
    /// The node it must be bound to; `None`: it cannot fit and stays Pending.
    node: Option<&'static str>,
}

const L4: &str = "device.attributes[\"gpuslice.io\"].productName == \"NVIDIA L4\"";
const H200: &str = "device.attributes[\"gpuslice.io\"].productName.contains(\"H200\")";

/// Created one after another (each scheduled before the next), so where each lands is
/// decided: node-a has 2 × 141Gi H200, node-b 1 × 24Gi L4.
const CASES: [Case; 6] = [
    // The model selector: only node-b has an L4.
    Case {
        name: "l4-small",
        count: 1,
        memory: "10Gi",
        cores: "20",
        cel: Some(L4),
        node: Some("node-b"),
    },
    // Two distinct GPUs: only node-a has two.
    Case {
        name: "two-gpus",
        count: 2,
        memory: "30Gi",
        cores: "10",
        cel: None,
        node: Some("node-a"),
    },
    Case {
        name: "h200-big",
        count: 1,
        memory: "100Gi",
        cores: "50",
        cel: Some(H200),
        node: Some("node-a"),
    },
    // 14Gi left on the L4: only an H200 still has 60Gi.
    Case {
        name: "any-mid",
        count: 1,
        memory: "60Gi",
        cores: "30",
        cel: None,
        node: Some("node-a"),
    },
    // The L4 has 14Gi left: the selector allows no other GPU.
    Case {
        name: "l4-over",
        count: 1,
        memory: "20Gi",
        cores: "10",
        cel: Some(L4),
        node: None,
    },
    // No GPU anywhere is that large.
    Case {
        name: "too-big",
        count: 1,
        memory: "200Gi",
        cores: "10",
        cel: None,
        node: None,
    },
];

#[test]
#[ignore = "starts a real Kubernetes control plane, two plugin processes and runc containers; the README's test command runs it"]
fn the_scheduler_places_slices_the_plugins_publish_and_prepare_enforces_them() {
    let _s = lock(&[]);
    let mut cluster = KubeCluster::up();
    let nodes: BTreeMap<&str, TestNode> = [
        (
            "node-a",
            TestNode::with_models_exact(&[("NVIDIA H200", "141Gi"), ("NVIDIA H200", "141Gi")]),
        ),
        (
            "node-b",
            TestNode::with_models_exact(&[("NVIDIA L4", "24Gi")]),
        ),
    ]
    .into_iter()
    .collect();
    for name in nodes.keys() {
        cluster.add_node(name);
    }
    let plugins: BTreeMap<&str, KubeletPlugin> = nodes
        .iter()
        .map(|(name, node)| (*name, KubeletPlugin::start(&cluster, name, node)))
        .collect();

    // Both plugins publish their GPUs.
    let slices: BTreeMap<&str, Value> = nodes
        .keys()
        .map(|name| {
            let s = cluster.wait_for(&format!("the ResourceSlice of {name}"), STEP, || {
                slice_of(&cluster, name)
            });
            (*name, s)
        })
        .collect();
    eprintln!(
        "kubectl get resourceslices -o yaml:\n{}",
        cluster.kubectl(&["get", "resourceslices", "-o", "yaml"])
    );
    for (name, model, memory, count) in [
        ("node-a", "NVIDIA H200", "141Gi", 2),
        ("node-b", "NVIDIA L4", "24Gi", 1),
    ] {
        let s = &slices[name];
        assert_eq!(s["spec"]["pool"]["name"], name, "{s}");
        let devices = s["spec"]["devices"].as_array().unwrap();
        assert_eq!(devices.len(), count, "{s}");
        for (i, d) in devices.iter().enumerate() {
            assert_eq!(d["name"], format!("gpu-{i}"), "{s}");
            assert_eq!(d["allowMultipleAllocations"], true, "{d}");
            assert_eq!(d["attributes"]["productName"]["string"], model, "{d}");
            assert_eq!(
                d["attributes"]["uuid"]["string"],
                nodes[name].uuid(i),
                "{d}"
            );
            assert_eq!(d["capacity"]["memory"]["value"], memory, "{d}");
            assert_eq!(d["capacity"]["cores"]["value"], "100", "{d}");
        }
    }
    // Exactly the shape docs/kubernetes-dra.md ("What kubectl shows") documents, as the API
    // server returns it: no field more or less in the spec, the slice owned by its Node.
    for (name, s) in &slices {
        assert_eq!(s["metadata"]["name"], format!("{name}-gpuslice.io"), "{s}");
        let owners = s["metadata"]["ownerReferences"].as_array().unwrap();
        assert_eq!(owners.len(), 1, "{s}");
        assert_eq!(
            keys(&owners[0]),
            keys(&json!({"apiVersion": 0, "controller": 0, "kind": 0, "name": 0, "uid": 0})),
            "{s}"
        );
        assert_eq!(
            (
                &owners[0]["apiVersion"],
                &owners[0]["kind"],
                &owners[0]["name"],
                &owners[0]["controller"]
            ),
            (&json!("v1"), &json!("Node"), &json!(name), &json!(true)),
            "{s}"
        );
        assert_eq!(
            keys(&s["spec"]),
            keys(&json!({"devices": 0, "driver": 0, "nodeName": 0, "pool": 0})),
            "{s}"
        );
        assert_eq!(s["spec"]["driver"], "gpuslice.io", "{s}");
        assert_eq!(
            keys(&s["spec"]["pool"]),
            keys(&json!({"generation": 0, "name": 0, "resourceSliceCount": 0})),
            "{s}"
        );
        assert_eq!(s["spec"]["pool"]["resourceSliceCount"], 1, "{s}");
        for d in s["spec"]["devices"].as_array().unwrap() {
            assert_eq!(
                keys(d),
                keys(
                    &json!({"allowMultipleAllocations": 0, "attributes": 0, "capacity": 0, "name": 0})
                ),
                "{d}"
            );
            // The simulated inventory knows the NUMA node (0), as a real node's sysfs does.
            assert_eq!(
                d["attributes"],
                json!({
                    "index": {"int": d["attributes"]["index"]["int"]},
                    "productName": {"string": d["attributes"]["productName"]["string"]},
                    "resource.kubernetes.io/numaNode": {"int": 0},
                    "uuid": {"string": d["attributes"]["uuid"]["string"]},
                }),
                "{d}"
            );
            let memory = &d["capacity"]["memory"]["value"];
            let cores = &d["capacity"]["cores"]["value"];
            assert_eq!(
                d["capacity"],
                json!({
                    "cores": {"value": cores, "requestPolicy": {
                        "default": "0",
                        "validRange": {"max": cores, "min": "0", "step": "1"},
                    }},
                    "memory": {"value": memory, "requestPolicy": {
                        "default": memory,
                        "validRange": {"max": memory, "min": "1Mi", "step": "1Mi"},
                    }},
                }),
                "{d}"
            );
        }
    }

    // The DeviceClass as shipped.
    let class = workspace().join("packaging/kubernetes/dra/deviceclass.yaml");
    cluster.kubectl(&["create", "-f", &class.display().to_string()]);

    // The scheduler decides, one pod after another.
    for c in &CASES {
        cluster
            .create(&resource_claim(c.name, c.count, c.memory, c.cores, c.cel))
            .unwrap_or_else(|e| panic!("claim {} refused: {e}", c.name));
        cluster.create(&pod(c.name, c.name)).unwrap();
        match c.node {
            Some(want) => {
                let got = bound_node(&cluster, c.name);
                assert_eq!(got, want, "pod {} bound to the wrong node", c.name);
            }
            None => {
                let message = no_room(&cluster, c.name);
                eprintln!("pod {} stays Pending: {message}", c.name);
            }
        }
    }
    // The pods that cannot fit are still Pending, unbound, with unallocated claims.
    for c in CASES.iter().filter(|c| c.node.is_none()) {
        let p = cluster.get_json(&["pod", c.name, "-n", NS]);
        assert!(
            p["spec"]["nodeName"].is_null(),
            "pod {} got bound: {p}",
            c.name
        );
        assert_eq!(p["status"]["phase"], "Pending", "{p}");
        let claim = cluster.get_json(&["resourceclaim", c.name, "-n", NS]);
        assert!(
            claim["status"]["allocation"].is_null(),
            "claim {} allocated: {claim}",
            c.name
        );
    }

    // What the scheduler allocated: every result from the pod's node's pool, each request
    // on distinct GPUs, the selector held, and no GPU given more than it offers.
    let mut claims: BTreeMap<&str, (String, Vec<Value>)> = BTreeMap::new();
    let mut consumed: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
    for c in CASES.iter().filter(|c| c.node.is_some()) {
        let node = c.node.unwrap();
        let claim = cluster.get_json(&["resourceclaim", c.name, "-n", NS]);
        let uid = claim["metadata"]["uid"].as_str().unwrap().to_string();
        let results = claim["status"]["allocation"]["devices"]["results"]
            .as_array()
            .unwrap_or_else(|| panic!("claim {} not allocated: {claim}", c.name))
            .clone();
        assert_eq!(results.len(), c.count as usize, "claim {}: {claim}", c.name);
        let gpus: BTreeSet<&str> = results
            .iter()
            .map(|r| r["device"].as_str().unwrap())
            .collect();
        assert_eq!(
            gpus.len(),
            results.len(),
            "claim {} got a GPU twice: {results:?}",
            c.name
        );
        for r in &results {
            assert_eq!(r["driver"], "gpuslice.io", "{r}");
            assert_eq!(r["pool"], node, "claim {}: {r}", c.name);
            assert_eq!(
                quantity(&r["consumedCapacity"]["memory"]),
                quantity(&json!(c.memory)),
                "{r}"
            );
            assert_eq!(r["consumedCapacity"]["cores"], c.cores, "{r}");
            let d = device(&slices[node], r["device"].as_str().unwrap());
            if c.cel == Some(L4) {
                assert_eq!(d["attributes"]["productName"]["string"], "NVIDIA L4");
            }
            if c.cel == Some(H200) {
                assert_eq!(d["attributes"]["productName"]["string"], "NVIDIA H200");
            }
            let e = consumed
                .entry((node.to_string(), r["device"].as_str().unwrap().to_string()))
                .or_default();
            e.0 += quantity(&r["consumedCapacity"]["memory"]);
            e.1 += quantity(&r["consumedCapacity"]["cores"]);
        }
        claims.insert(c.name, (uid, results));
    }
    for ((node, gpu), (memory, cores)) in &consumed {
        let d = device(&slices[node.as_str()], gpu);
        let offered = quantity(&d["capacity"]["memory"]["value"]);
        assert!(
            *memory <= offered && *cores <= 100,
            "{node}/{gpu}: the scheduler handed out {memory} bytes and {cores}% of {offered} bytes"
        );
    }

    // The kubelet prepares every bound pod's claim on its node.
    let validator = cdi_schema::validator();
    let mut kubelets: BTreeMap<&str, Kubelet> = plugins
        .iter()
        .map(|(name, p)| (*name, p.kubelet()))
        .collect();
    for c in CASES.iter().filter(|c| c.node.is_some()) {
        let name = c.node.unwrap();
        let node = &nodes[name];
        let (uid, results) = &claims[c.name];
        let answer = kubelets
            .get_mut(name)
            .unwrap()
            .prepare(kubelet_claim(NS, c.name, uid))
            .unwrap();
        assert_eq!(
            answer.error,
            "",
            "prepare of {} failed; plugin log:\n{}",
            c.name,
            plugins[name].log_text()
        );
        let device_id = format!("gpuslice.io/claim={uid}");
        let prepared: BTreeSet<&str> = answer
            .devices
            .iter()
            .map(|d| {
                assert_eq!(d.pool_name, name, "{d:?}");
                assert_eq!(d.cdi_device_ids, std::slice::from_ref(&device_id), "{d:?}");
                d.device_name.as_str()
            })
            .collect();
        let allocated: BTreeSet<&str> = results
            .iter()
            .map(|r| r["device"].as_str().unwrap())
            .collect();
        assert_eq!(prepared, allocated, "claim {}", c.name);

        // The booking is exactly the scheduler's consumedCapacity, on the chosen GPUs.
        let chosen: BTreeMap<String, (u64, u64, i64)> = results
            .iter()
            .map(|r| {
                let d = device(&slices[name], r["device"].as_str().unwrap());
                (
                    d["attributes"]["uuid"]["string"]
                        .as_str()
                        .unwrap()
                        .to_string(),
                    (
                        quantity(&r["consumedCapacity"]["memory"]),
                        quantity(&r["consumedCapacity"]["cores"]),
                        d["attributes"]["index"]["int"].as_i64().unwrap(),
                    ),
                )
            })
            .collect();
        let r = claim_reservation(node, uid)
            .unwrap_or_else(|| panic!("no booking of claim {} after prepare", c.name));
        assert_eq!(r["owner"]["namespace"], NS, "{r}");
        assert_eq!(r["owner"]["name"], c.name, "{r}");
        let booked: BTreeMap<String, (u64, u64)> = r["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| {
                (
                    b["uuid"].as_str().unwrap().to_string(),
                    (b["memory"].as_u64().unwrap(), b["cores"].as_u64().unwrap()),
                )
            })
            .collect();
        let want: BTreeMap<String, (u64, u64)> = chosen
            .iter()
            .map(|(u, (m, c, _))| (u.clone(), (*m, *c)))
            .collect();
        assert_eq!(booked, want, "claim {}: booking {r}", c.name);

        // limits.json names the chosen GPUs with the consumed memory.
        let id = r["id"].as_str().unwrap();
        let limits_path = node.state_dir().join("slices").join(id).join("limits.json");
        let limits: Value = serde_json::from_slice(&std::fs::read(&limits_path).unwrap()).unwrap();
        let limited: BTreeMap<String, u64> = limits["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                (
                    d["uuid"].as_str().unwrap().to_string(),
                    d["memory_limit"].as_u64().unwrap(),
                )
            })
            .collect();
        let want: BTreeMap<String, u64> = chosen
            .iter()
            .map(|(u, (m, _, _))| (u.clone(), *m))
            .collect();
        assert_eq!(limited, want, "{}: {limits}", limits_path.display());

        // The claim's CDI spec: schema-valid, one device named by the claim, the device
        // nodes of exactly the chosen GPUs.
        let spec_path = claim_spec_path(node, uid);
        let bytes =
            std::fs::read(&spec_path).unwrap_or_else(|e| panic!("{}: {e}", spec_path.display()));
        let spec: Value = serde_json::from_slice(&bytes).unwrap();
        let errors: Vec<String> = validator
            .iter_errors(&spec)
            .map(|e| e.to_string())
            .collect();
        assert!(
            errors.is_empty(),
            "{} is not valid against the CDI schema: {errors:?}",
            spec_path.display()
        );
        assert_eq!(spec["kind"], gpuslice_kube::CLAIM_KIND, "{spec}");
        assert_eq!(spec["devices"][0]["name"], uid.as_str(), "{spec}");
        let mut nodes_in_spec: BTreeSet<String> = BTreeSet::new();
        for edits in [
            &spec["containerEdits"],
            &spec["devices"][0]["containerEdits"],
        ] {
            for d in edits["deviceNodes"].as_array().into_iter().flatten() {
                let p = d["path"].as_str().unwrap();
                if p.strip_prefix("/dev/nvidia")
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                {
                    nodes_in_spec.insert(p.to_string());
                }
            }
        }
        let want: BTreeSet<String> = chosen
            .values()
            .map(|(_, _, i)| format!("/dev/nvidia{i}"))
            .collect();
        assert_eq!(
            nodes_in_spec,
            want,
            "GPU device nodes of {}",
            spec_path.display()
        );
    }

    // After every prepare, each GPU's bookings fit it.
    for (name, node) in &nodes {
        let status = node.status();
        for g in status["gpus"].as_array().unwrap() {
            let uuid = g["uuid"].as_str().unwrap();
            let total = g["memory_total"].as_u64().unwrap();
            let booked: u64 = node
                .reservations()
                .iter()
                .flat_map(|r| r["gpus"].as_array().cloned().unwrap_or_default())
                .filter(|b| b["uuid"] == uuid)
                .map(|b| b["memory"].as_u64().unwrap())
                .sum();
            assert!(booked <= total, "{name} {uuid}: {booked} booked of {total}");
        }
    }

    // A real runc container given the L4 claim's CDI spec sees its slice: the probe through
    // the shim on the simulated driver is refused past the claim's 10Gi.
    let node_b = &nodes["node-b"];
    let (uid, _) = &claims["l4-small"];
    let spec_bytes = std::fs::read(claim_spec_path(node_b, uid)).unwrap();
    let spec = gpuslice_cdi::from_json(&spec_bytes).unwrap();
    let bundle = Bundle::new(
        "gpuslice-probe --json alloc --chunk 1Gi --max 20Gi; echo EXIT $?",
        &[],
    );
    let mut oci = bundle.config();
    gpuslice_cdi::inject(&mut oci, &spec, &[&format!("gpuslice.io/claim={uid}")]).unwrap();
    bundle.set_config(&oci);
    let out = Command::new("runc")
        .arg("--root")
        .arg(RUNC_ROOT)
        .args(["run", "-b"])
        .arg(bundle.path())
        .arg("e2e-dra-claim")
        .stdin(Stdio::null())
        .output()
        .expect("runc run");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("EXIT 0"),
        "runc run: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = text
        .lines()
        .find_map(|l| {
            serde_json::from_str::<Value>(l)
                .ok()
                .filter(|v| v["cmd"] == "alloc")
        })
        .unwrap_or_else(|| panic!("no alloc report from the probe: {text}"));
    assert_eq!(report["total"], 10 * GIB, "{report}");
    assert_eq!(report["error"], "CUDA_ERROR_OUT_OF_MEMORY", "{report}");
    assert_eq!(report["mem_total"], 10 * GIB, "{report}");

    // Unprepare releases: booking, slice files and spec gone.
    for c in CASES.iter().filter(|c| c.node.is_some()) {
        let name = c.node.unwrap();
        let node = &nodes[name];
        let (uid, _) = &claims[c.name];
        let id = claim_reservation(node, uid).unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string();
        let answer = kubelets
            .get_mut(name)
            .unwrap()
            .unprepare(kubelet_claim(NS, c.name, uid))
            .unwrap();
        assert_eq!(answer.error, "", "unprepare of {}", c.name);
        assert!(
            claim_reservation(node, uid).is_none(),
            "claim {} still booked",
            c.name
        );
        assert!(
            !claim_spec_path(node, uid).exists(),
            "claim {}'s CDI spec left behind",
            c.name
        );
        assert!(
            !node.state_dir().join("slices").join(&id).exists(),
            "claim {}'s slice directory left behind",
            c.name
        );
    }
    for node in nodes.values() {
        assert!(node.reservations().is_empty(), "{:?}", node.reservations());
    }

    // An annotation-path booking on the L4 shrinks what node-b's slice offers; its release
    // gives it back.
    let bundle = Bundle::new(
        "echo READY; exec sleep 600",
        &[("gpuslice.io/memory", "8Gi"), ("gpuslice.io/cores", "25")],
    );
    let container = Container {
        node: node_b,
        id: "e2e-dra-annotated".to_string(),
    };
    let c = run_detached(node_b, &bundle, &container.id).expect("annotated container starts");
    c.wait_for("READY");
    let shrunk = cluster.wait_for("node-b's slice to offer 16Gi of the L4", STEP, || {
        let s = slice_of(&cluster, "node-b")?;
        (device(&s, "gpu-0")["capacity"]["memory"]["value"] == "16Gi").then_some(s)
    });
    let gpu0 = device(&shrunk, "gpu-0");
    assert_eq!(gpu0["capacity"]["cores"]["value"], "75", "{gpu0}");
    assert_eq!(
        gpu0["capacity"]["memory"]["requestPolicy"]["validRange"]["max"], "16Gi",
        "{gpu0}"
    );
    assert!(
        shrunk["spec"]["pool"]["generation"].as_i64()
            > slices["node-b"]["spec"]["pool"]["generation"].as_i64(),
        "the pool generation was not bumped: {shrunk}"
    );
    c.remove(node_b);
    drop(container);
    cluster.wait_for("node-b's slice to offer the whole L4 again", STEP, || {
        let s = slice_of(&cluster, "node-b")?;
        (device(&s, "gpu-0")["capacity"]["memory"]["value"] == "24Gi").then_some(())
    });

    drop(kubelets);
    drop(plugins);
    cluster.down();
}
