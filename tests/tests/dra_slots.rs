//! Slot mode against a real control plane that behaves as Kubernetes 1.34 (the pinned
//! binaries with `--emulated-version=1.34`: consumable capacity off, DRA v1 GA): two Node
//! objects (no kubelet), one real `gpuslice kubelet-plugin` per node with `dra.mode` left at
//! `auto`. Each plugin detects that the API server drops consumable capacity and publishes
//! its GPUs as slots; the stock scheduler places a claim mix — a 2-GPU claim, sizes that
//! cannot all fit, one that fits nowhere — only where the slots fit per GPU, leaves the rest
//! Pending with its reason, and each prepare over the plugin's `dra.sock` books exactly
//! k × slot per GPU; unprepare releases. Bad input is refused naming what is accepted, nothing
//! created or booked: the ValidatingAdmissionPolicy slots.gpuslice.io refuses, at creation, a
//! claim or template asking more slots than a GPU has or several slots without the constraint
//! to one GPU, slots in several requests unless pinned slot by slot (the allocator's search
//! multiplies), or every slot (allocationMode All); prepare refuses malformed opaque
//! parameters. Shapes it admits that fit nowhere — 13 devices of the class gpuslice.io, which
//! selects no slot, the webhook's whole GPUs — are answered Unschedulable, never
//! SchedulerError, and a plain pod after them is placed. The tools' prioritized-list slot
//! claim (one `firstAvailable` subrequest per slot size) is kept by the API server, placed on
//! the next subrequest when the first fits nowhere, and booked for the chosen size.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use gpuslice_config::quantity::parse_kube_quantity;
use gpuslice_e2e::kube::KubeCluster;
use gpuslice_e2e::kubelet::claim as kubelet_claim;
use gpuslice_e2e::kubelet_plugin::{bound_node, no_room, pod, slice_of, KubeletPlugin};
use gpuslice_e2e::{env::workspace, lock, TestNode};
use serde_json::{json, Value};

const NS: &str = "default";
const STEP: Duration = Duration::from_secs(90);
const MIB: u64 = 1 << 20;
/// The default `dra.slots_per_gpu`.
const SLOTS: u64 = gpuslice_config::DEFAULT_SLOTS_PER_GPU as u64;

const L4: &str = "device.attributes[\"gpuslice.io\"].productName == \"NVIDIA L4\"";

/// A claim of `slots` per request (one request per GPU), each constrained to one GPU.
fn slot_claim(name: &str, slots: &[u32], cel: Option<&str>) -> Value {
    let names: Vec<String> = (0..slots.len()).map(|i| format!("gpu{i}")).collect();
    let requests: Vec<Value> = slots
        .iter()
        .zip(&names)
        .map(|(k, n)| {
            let mut exactly = json!({"deviceClassName": "slots.gpuslice.io", "count": k});
            if let Some(expression) = cel {
                exactly["selectors"] = json!([{"cel": {"expression": expression}}]);
            }
            json!({"name": n, "exactly": exactly})
        })
        .collect();
    let constraints: Vec<Value> = names
        .iter()
        .map(|n| json!({"requests": [n], "matchAttribute": "gpuslice.io/uuid"}))
        .collect();
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": {"requests": requests, "constraints": constraints}},
    })
}

struct Case {
    name: &'static str,
    slots: &'static [u32],
    cel: Option<&'static str>,
    node: Option<&'static str>,
}

/// node-a: 2 × 141Gi H200 (6 slots of 24064Mi each); node-b: 1 × 24Gi L4 (6 of 4Gi).
/// Created one after another, each scheduled before the next.
const CASES: [Case; 4] = [
    // 4 + 4 slots: more than one GPU's 6, so two GPUs, and only node-a has two. On node-b the
    // scheduler must give up (4 + 4 of one GPU's 6) within its filter timeout: with 16 slots
    // per GPU (9 + 9), its search through the orderings of the slots timed out there. (Created
    // before slot-claims-policy.yaml, which refuses slots in several unpinned requests.)
    Case {
        name: "two-gpus",
        slots: &[4, 4],
        cel: None,
        node: Some("node-a"),
    },
    Case {
        name: "l4-five",
        slots: &[5],
        cel: Some(L4),
        node: Some("node-b"),
    },
    // 2 slots left on each H200, 1 on the L4: only an H200 has room.
    Case {
        name: "two",
        slots: &[2],
        cel: None,
        node: Some("node-a"),
    },
    // 1 slot left on the L4: 2 do not fit there, and the selector allows no other GPU.
    Case {
        name: "l4-over",
        slots: &[2],
        cel: Some(L4),
        node: None,
    },
];

fn want_node(c: &Case) -> Option<&'static str> {
    c.node
}

/// With the policy packaging/kubernetes/dra/slot-claims-policy.yaml installed, slot claims
/// and templates the scheduler could never place are refused when created, each with a
/// message naming the value and what is accepted; nothing is created.
fn refused_at_admission(cluster: &KubeCluster) {
    let policy = workspace().join("packaging/kubernetes/dra/slot-claims-policy.yaml");
    cluster.kubectl(&["create", "-f", &policy.display().to_string()]);
    // More slots than a GPU has (slots_per_gpu is 6): without the policy, created, and its
    // pod Pending with the scheduler's "cannot allocate all claims".
    let too_many = slot_claim("too-many", &[7], None);
    // The API server enforces a new policy once its informer has it: dry runs until then.
    cluster.wait_for("the policy slots.gpuslice.io to be enforced", STEP, || {
        let out = cluster.kubectl_output(
            &["create", "--dry-run=server", "-f", "-"],
            Some(too_many.to_string().as_bytes()),
        );
        (!out.status.success()).then_some(())
    });
    let mut unconstrained = slot_claim("unconstrained", &[3], None);
    unconstrained["spec"]["devices"]
        .as_object_mut()
        .unwrap()
        .remove("constraints");
    let mut template = slot_claim("too-many-template", &[8, 2], None);
    template["kind"] = json!("ResourceClaimTemplate");
    template["spec"] = json!({"spec": template["spec"].take()});
    // Shapes whose search the scheduler's allocator could not finish within its 10 s per node
    // (docs/benchmarks.md, "DRA allocator"): four single slots and a request no device
    // matches; two whole GPUs as `count: 6` each (the webhook's former multi-GPU claim);
    // every slot of the node (allocationMode All); slots pinned one by one with nothing
    // keeping them on one GPU.
    let mut four_and_none = slot_claim("four-and-none", &[1, 1, 1, 1, 1], None);
    four_and_none["spec"]["devices"]["requests"][4]["exactly"]["selectors"] = json!([{"cel": {"expression": "device.attributes[\"gpuslice.io\"].productName == \"none\""}}]);
    four_and_none["spec"]["devices"]
        .as_object_mut()
        .unwrap()
        .remove("constraints");
    let two_whole = slot_claim("two-whole", &[6, 6], None);
    let all = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "all-slots", "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "slots.gpuslice.io", "allocationMode": "All"}}]}},
    });
    let pin = |j: u32| {
        json!({"name": format!("p{j}"), "exactly": {"deviceClassName": "slots.gpuslice.io",
            "selectors": [{"cel": {"expression": gpuslice_dra::claim_shape::pinned_expression(j)}}]}})
    };
    let loose = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "loose-pins", "namespace": NS},
        "spec": {"devices": {"requests": [pin(0), pin(1)]}},
    });
    // Part of a GPU pinned slot by slot, and a whole GPU but for a slot no GPU has: the
    // allocator tries every order of the other GPUs before it finds either fits nowhere.
    let pinned_group = |name: &str, pins: &[u32]| {
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"devices": {
                "requests": pins.iter().enumerate().map(|(i, j)| {
                    let mut r = pin(*j);
                    r["name"] = json!(format!("p{i}"));
                    r
                }).collect::<Vec<_>>(),
                "constraints": [{"requests": (0..pins.len()).map(|i| format!("p{i}")).collect::<Vec<_>>(),
                    "matchAttribute": "gpuslice.io/uuid"}]}},
        })
    };
    let part_pinned = pinned_group("part-pinned", &[0, 1]);
    let slot_nobody_has = pinned_group("slot-nobody-has", &[0, 1, 2, 3, 4, 99]);
    let several = "ask slots of slots.gpuslice.io in several requests; accepted: one request of 1 to 6 slots per claim, or whole GPUs asked slot by slot";
    let cases: Vec<(&Value, &str, String)> = vec![
        (
            &too_many,
            "resourceclaim",
            "request gpu0 asks 7 slots of slots.gpuslice.io; accepted: 1 to 6, the slots of one GPU (dra.slots_per_gpu = 6)".into(),
        ),
        (
            &unconstrained,
            "resourceclaim",
            "request gpu0 asks more than one slot of slots.gpuslice.io without a constraint to one GPU; accepted: constraints: [{requests: [gpu0], matchAttribute: gpuslice.io/uuid}]".into(),
        ),
        (
            &template,
            "resourceclaimtemplate",
            "request gpu0 asks 8 slots of slots.gpuslice.io; accepted: 1 to 6".into(),
        ),
        (
            &four_and_none,
            "resourceclaim",
            format!("requests gpu0, gpu1, gpu2, gpu3, gpu4 {several}"),
        ),
        (
            &two_whole,
            "resourceclaim",
            format!("requests gpu0, gpu1 {several}"),
        ),
        (
            &all,
            "resourceclaim",
            "request gpu asks all devices of slots.gpuslice.io (allocationMode All); accepted: allocationMode ExactCount with count 1 to 6".into(),
        ),
        (
            &loose,
            "resourceclaim",
            "request p0 pins a slot of slots.gpuslice.io without a constraint to one GPU".into(),
        ),
        (
            &part_pinned,
            "resourceclaim",
            "requests kept on one GPU pin slots 0, 1 of slots.gpuslice.io; accepted: whole GPUs asked slot by slot, each GPU's requests pinning every slot 0 to 5 once".into(),
        ),
        (
            &slot_nobody_has,
            "resourceclaim",
            "requests kept on one GPU pin slots 0, 1, 2, 3, 4, 99 of slots.gpuslice.io".into(),
        ),
    ];
    for (object, kind, part) in &cases {
        let name = object["metadata"]["name"].as_str().unwrap();
        let e = cluster
            .create(object)
            .err()
            .unwrap_or_else(|| panic!("{kind} {name} was created"));
        assert!(
            e.contains("ValidatingAdmissionPolicy 'slots.gpuslice.io'") && e.contains(part),
            "{kind} {name}: `{e}` lacks `{part}`"
        );
        let get = cluster.kubectl_output(&["get", kind, name, "-n", NS], None);
        assert!(!get.status.success(), "{kind} {name} exists");
        eprintln!("{kind} {name} refused: {}", e.trim());
    }
}

#[test]
#[ignore = "starts a real Kubernetes control plane (emulating 1.34) and two plugin processes; the README's test command runs it"]
fn on_a_1_34_control_plane_slots_are_placed_per_gpu_and_booked_exactly() {
    let _s = lock(&[]);
    let cluster = KubeCluster::up_with(&["--emulated-version", "1.34"], &[]);
    let gpu_count: BTreeMap<&str, usize> = [("node-a", 2), ("node-b", 1)].into_iter().collect();
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
    let plugins: BTreeMap<&str, KubeletPlugin> = nodes
        .iter()
        .map(|(name, node)| (*name, KubeletPlugin::start(&cluster, name, node)))
        .collect();
    let slot_bytes: BTreeMap<&str, u64> = [
        ("node-a", (141 << 30) / SLOTS / MIB * MIB),
        ("node-b", (24 << 30) / SLOTS / MIB * MIB),
    ]
    .into_iter()
    .collect();

    // Each plugin detected that the API server drops consumable capacity.
    let slices: BTreeMap<&str, Value> = nodes
        .keys()
        .map(|name| {
            let s = cluster.wait_for(&format!("the slot slice of {name}"), STEP, || {
                slice_of(&cluster, name).filter(|s| {
                    s["spec"]["devices"].as_array().map(Vec::len)
                        == Some(gpu_count[name] * SLOTS as usize)
                })
            });
            (*name, s)
        })
        .collect();
    for (name, p) in &plugins {
        let log = p.log_text();
        assert!(
            log.contains(&format!("publishing in slot mode ({SLOTS} slot devices per GPU): the API server drops consumable capacity")),
            "{name}: {log}"
        );
    }
    for (name, s) in &slices {
        for d in s["spec"]["devices"].as_array().unwrap() {
            assert!(d.get("allowMultipleAllocations").is_none(), "{d}");
            let memory =
                parse_kube_quantity(d["capacity"]["memory"]["value"].as_str().unwrap()).unwrap();
            assert_eq!(memory, slot_bytes[name], "{d}");
            let index = d["attributes"]["index"]["int"].as_u64().unwrap() as usize;
            assert_eq!(
                d["attributes"]["uuid"]["string"],
                nodes[name].uuid(index),
                "{d}"
            );
            let slot = d["attributes"]["slot"]["int"].as_u64().unwrap();
            assert_eq!(d["name"], format!("gpu-{index}-slot-{slot}"), "{d}");
        }
    }
    let class = workspace().join("packaging/kubernetes/dra/deviceclass-slots.yaml");
    cluster.kubectl(&["create", "-f", &class.display().to_string()]);

    for c in &CASES {
        let t0 = Instant::now();
        cluster
            .create(&slot_claim(c.name, c.slots, c.cel))
            .unwrap_or_else(|e| panic!("claim {} refused: {e}", c.name));
        cluster.create(&pod(c.name, c.name)).unwrap();
        match want_node(c) {
            Some(want) => {
                let got = bound_node(&cluster, c.name);
                assert_eq!(got, want, "pod {} bound to the wrong node", c.name);
                eprintln!("pod {} bound to {got} in {:?}", c.name, t0.elapsed());
            }
            None => {
                let message = no_room(&cluster, c.name);
                eprintln!(
                    "pod {} stays Pending (decided in {:?}): {message}",
                    c.name,
                    t0.elapsed()
                );
            }
        }
    }

    // What the scheduler allocated: each request's slots on one GPU, the 2-GPU claim on two,
    // no GPU given more slots than it has.
    let mut per_gpu: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    let mut claims: BTreeMap<&str, (String, Vec<Value>)> = BTreeMap::new();
    for c in CASES.iter().filter(|c| want_node(c).is_some()) {
        let node = want_node(c).unwrap();
        let claim = cluster.get_json(&["resourceclaim", c.name, "-n", NS]);
        let uid = claim["metadata"]["uid"].as_str().unwrap().to_string();
        let results = claim["status"]["allocation"]["devices"]["results"]
            .as_array()
            .unwrap_or_else(|| panic!("claim {} not allocated: {claim}", c.name))
            .clone();
        let total: u32 = c.slots.iter().sum();
        assert_eq!(results.len(), total as usize, "{claim}");
        let mut gpus_of_claim = BTreeSet::new();
        for (i, _) in c.slots.iter().enumerate() {
            let request = format!("gpu{i}");
            let gpus: BTreeSet<String> = results
                .iter()
                .filter(|r| r["request"] == request.as_str())
                .map(|r| {
                    assert_eq!(r["pool"], node, "{r}");
                    let d = r["device"].as_str().unwrap();
                    per_gpu
                        .entry((
                            node.to_string(),
                            d.rsplit_once("-slot-").unwrap().0.to_string(),
                        ))
                        .or_default()
                        .insert(d.to_string());
                    d.rsplit_once("-slot-").unwrap().0.to_string()
                })
                .collect();
            assert_eq!(
                gpus.len(),
                1,
                "claim {} request {request} spans GPUs: {claim}",
                c.name
            );
            gpus_of_claim.extend(gpus);
        }
        assert_eq!(
            gpus_of_claim.len(),
            c.slots.len(),
            "claim {}: {claim}",
            c.name
        );
        claims.insert(c.name, (uid, results));
    }
    for ((node, gpu), slots) in &per_gpu {
        assert!(slots.len() as u64 <= SLOTS, "{node}/{gpu}: {slots:?}");
    }

    // The kubelet prepares each bound claim: exactly k × slot per GPU is booked.
    for c in CASES.iter().filter(|c| want_node(c).is_some()) {
        let name = want_node(c).unwrap();
        let (uid, results) = &claims[c.name];
        let mut kubelet = plugins[name].kubelet();
        let answer = kubelet.prepare(kubelet_claim(NS, c.name, uid)).unwrap();
        assert_eq!(answer.error, "", "{}: {}", c.name, plugins[name].log_text());
        assert_eq!(answer.devices.len(), results.len());
        let text = std::fs::read_to_string(nodes[name].state_dir().join("registry.json")).unwrap();
        let file: Value = serde_json::from_str(&text).unwrap();
        let r = file["reservations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["owner"]["claim_uid"] == uid.as_str())
            .unwrap_or_else(|| panic!("no booking of {}", c.name))
            .clone();
        let mut booked: Vec<u64> = r["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["memory"].as_u64().unwrap())
            .collect();
        booked.sort();
        let mut want: Vec<u64> = c
            .slots
            .iter()
            .map(|k| u64::from(*k) * slot_bytes[name])
            .collect();
        want.sort();
        assert_eq!(booked, want, "claim {}: {r}", c.name);
        let un = kubelet.unprepare(kubelet_claim(NS, c.name, uid)).unwrap();
        assert_eq!(un.error, "");
        let text = std::fs::read_to_string(nodes[name].state_dir().join("registry.json")).unwrap();
        assert!(
            !text.contains(uid.as_str()),
            "{} still booked: {text}",
            c.name
        );
    }

    // From here on the policies are installed (the claim mix above has a claim of two
    // `count: 4` requests, which the policy now refuses).
    refused_at_admission(&cluster);

    // Malformed opaque parameters pass admission (the API server keeps them as JSON) and are
    // placed; prepare refuses them naming what is accepted, and books nothing.
    let mut opaque = slot_claim("bad-opaque", &[1], None);
    opaque["spec"]["devices"]["config"] = json!([{"requests": ["gpu0"],
        "opaque": {"driver": "gpuslice.io", "parameters": {"cores": "lots"}}}]);
    cluster.create(&opaque).unwrap();
    cluster.create(&pod("bad-opaque", "bad-opaque")).unwrap();
    let node = bound_node(&cluster, "bad-opaque");
    let claim = cluster.get_json(&["resourceclaim", "bad-opaque", "-n", NS]);
    let uid = claim["metadata"]["uid"].as_str().unwrap();
    let answer = plugins[node.as_str()]
        .kubelet()
        .prepare(kubelet_claim(NS, "bad-opaque", uid))
        .unwrap();
    for part in [
        "`cores`: \"lots\" is not accepted",
        "accepted: a JSON object {\"cores\": <percent per GPU, 1 to 100>}",
        "nothing was booked",
    ] {
        assert!(
            answer.error.contains(part),
            "`{}` lacks `{part}`",
            answer.error
        );
    }
    let text =
        std::fs::read_to_string(nodes[node.as_str()].state_dir().join("registry.json")).unwrap();
    assert!(!text.contains(uid), "bad-opaque booked: {text}");

    // The claim gpuslice's tools write on this cluster of two slot sizes: a prioritized list
    // (DRAPrioritizedList, beta and on in 1.34), one subrequest per size. 8Gi is 2 L4 slots
    // first, but the L4 has at most 1 left: the scheduler takes the next, 1 H200 slot.
    let items = cluster.get_json(&["resourceslices"])["items"].clone();
    let slices: Vec<_> = serde_json::from_value(items).unwrap();
    let mode = gpuslice_dra::claim_shape::PublishedGpus::from_slices(slices.as_slice()).mode;
    let shape = gpuslice_dra::claim_shape::Shape {
        gpus: 1,
        memory: Some(8 << 30),
        ..Default::default()
    };
    let (spec, _) = gpuslice_dra::claim_shape::claim_spec(&mode, &shape, "test").unwrap();
    cluster
        .create(&json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "sized", "namespace": NS},
            "spec": spec,
        }))
        .unwrap();
    let stored = cluster.get_json(&["resourceclaim", "sized", "-n", NS]);
    assert_eq!(
        stored["spec"]["devices"]["requests"][0]["firstAvailable"]
            .as_array()
            .map(Vec::len),
        Some(2),
        "the API server keeps the subrequests: {stored}"
    );
    cluster.create(&pod("sized", "sized")).unwrap();
    assert_eq!(bound_node(&cluster, "sized"), "node-a");
    let claim = cluster.get_json(&["resourceclaim", "sized", "-n", NS]);
    let results = claim["status"]["allocation"]["devices"]["results"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(results.len(), 1, "{claim}");
    assert_eq!(results[0]["request"], "gpu/slots-1", "{claim}");
    let uid = claim["metadata"]["uid"].as_str().unwrap();
    let answer = plugins["node-a"]
        .kubelet()
        .prepare(kubelet_claim(NS, "sized", uid))
        .unwrap();
    assert_eq!(answer.error, "", "{}", plugins["node-a"].log_text());
    let text = std::fs::read_to_string(nodes["node-a"].state_dir().join("registry.json")).unwrap();
    let file: Value = serde_json::from_str(&text).unwrap();
    let booked: Vec<u64> = file["reservations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["owner"]["claim_uid"] == uid)
        .flat_map(|r| r["gpus"].as_array().unwrap().clone())
        .map(|g| g["memory"].as_u64().unwrap())
        .collect();
    assert_eq!(booked, [slot_bytes["node-a"]], "{text}");

    // What is admitted now and fits nowhere is answered Unschedulable — never SchedulerError
    // (the allocator timed out on these before their bounds: docs/benchmarks.md, "DRA
    // allocator") — and a plain pod created after them is placed (one slot is left).
    let class = workspace().join("packaging/kubernetes/dra/deviceclass.yaml");
    cluster.kubectl(&["create", "-f", &class.display().to_string()]);
    let whole = |gpus| {
        gpuslice_dra::claim_shape::claim_spec(
            &mode,
            &gpuslice_dra::claim_shape::Shape {
                gpus,
                ..Default::default()
            },
            "test",
        )
        .unwrap()
        .0
    };
    let hostile = [
        // 13 devices of the class gpuslice.io, which selects no slot.
        (
            "class-13",
            json!({"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpuslice.io", "count": 13}}]}}),
        ),
        // The webhook's claims for 2 and 3 whole GPUs (slot by slot): no GPU is wholly free.
        ("whole-2", serde_json::to_value(whole(2)).unwrap()),
        ("whole-3", serde_json::to_value(whole(3)).unwrap()),
        // A whole GPU in one request.
        ("whole-1", slot_claim("x", &[6], None)["spec"].clone()),
    ];
    for (name, spec) in &hostile {
        let t0 = Instant::now();
        cluster
            .create(&json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": NS},
                "spec": spec,
            }))
            .unwrap_or_else(|e| panic!("claim {name} refused: {e}"));
        cluster.create(&pod(name, name)).unwrap();
        let message = no_room(&cluster, name);
        eprintln!(
            "pod {name} Unschedulable (decided in {:?}): {message}",
            t0.elapsed()
        );
    }
    // Two claims a pod may hold one by one multiply the search when one pod lists both (a
    // whole GPU each timed out on a fragmented 8-GPU node): with slot-pods-policy.yaml, a pod
    // lists at most one claim.
    let policy = workspace().join("packaging/kubernetes/dra/slot-pods-policy.yaml");
    cluster.kubectl(&["create", "-f", &policy.display().to_string()]);
    for name in ["pair-a", "pair-b"] {
        cluster.create(&slot_claim(name, &[6], None)).unwrap();
    }
    let mut pair = pod("pair", "pair-a");
    pair["spec"]["resourceClaims"] = json!([
        {"name": "a", "resourceClaimName": "pair-a"},
        {"name": "b", "resourceClaimName": "pair-b"},
    ]);
    pair["spec"]["containers"][0]["resources"]["claims"] = json!([{"name": "a"}, {"name": "b"}]);
    cluster.wait_for(
        "the policy slot-pods.gpuslice.io to be enforced",
        STEP,
        || {
            let out = cluster.kubectl_output(
                &["create", "--dry-run=server", "-f", "-"],
                Some(pair.to_string().as_bytes()),
            );
            (!out.status.success()).then_some(())
        },
    );
    let e = cluster.create(&pair).expect_err("pod pair was created");
    assert!(
        e.contains("ValidatingAdmissionPolicy 'slot-pods.gpuslice.io'")
            && e.contains("spec.resourceClaims lists 2 claims; accepted: at most 1 per pod"),
        "{e}"
    );

    let t0 = Instant::now();
    cluster
        .create(&slot_claim("plain", &[1], None))
        .unwrap_or_else(|e| panic!("claim plain refused: {e}"));
    cluster.create(&pod("plain", "plain")).unwrap();
    let node = bound_node(&cluster, "plain");
    eprintln!(
        "pod plain bound to {node} in {:?} beside {} Unschedulable pods",
        t0.elapsed(),
        hostile.len()
    );
}
