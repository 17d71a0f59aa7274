//! Slot mode (docs/kubernetes-dra.md, "Slot mode: every DRA cluster") as the kubelet sees the plugin, against a FAKE API
//! server that drops consumable capacity as Kubernetes 1.34/1.35 do: `dra.mode = auto`
//! detects it and publishes equal unshared slots, prepare books exactly k × slot (and the
//! share the opaque parameters ask), node-path bookings withdraw slots, bad claims are refused
//! with nothing booked, and a restart against an API server that keeps consumable capacity
//! (the cluster upgraded) publishes capacity devices while the slot claim keeps its slice.

use crate::support;

use gpuslice_config::Quantity;
use gpuslice_fakeapi::FakeApi;
use gpuslice_registry::{Owner, Request, Selector};
use serde_json::{json, Value};
use support::{wait_for, Kubelet, Node, GIB};

fn node(api: &FakeApi, gpus: &[u64]) -> Node {
    let tmp = tempfile::tempdir().unwrap();
    let kc = api.kubeconfig(tmp.path());
    let mut n = Node::new("node-a", gpus, kc.clone());
    let kept = n.dir.path().join("kubeconfig");
    std::fs::copy(&kc, &kept).unwrap();
    n.options.kubeconfig = Some(kept);
    n.options.dra.slots_per_gpu = 4;
    n.options.mode_file = Some(n.dir.path().join("kubelet-plugin.json"));
    n
}

/// A claim allocated slot `devices` (each `(request, device)`) of pool node-a, with opaque
/// `config` entries.
fn slot_claim(name: &str, uid: &str, devices: &[(&str, &str)], config: Value) -> Value {
    let results: Vec<Value> = devices
        .iter()
        .map(|(r, d)| json!({"request": r, "driver": "gpuslice.io", "pool": "node-a", "device": d}))
        .collect();
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": results, "config": config}}}})
}

/// The devices of the node's slice, by name, once it exists.
fn devices(api: &FakeApi) -> Vec<Value> {
    api.slices()
        .get("node-a-gpuslice.io")
        .and_then(|s| s["spec"]["devices"].as_array().cloned())
        .unwrap_or_default()
}

fn names(api: &FakeApi) -> Vec<String> {
    devices(api)
        .iter()
        .map(|d| d["name"].as_str().unwrap().to_string())
        .collect()
}

fn mode_of(n: &Node) -> Value {
    let path = n.options.mode_file.clone().unwrap();
    serde_json::from_str(&std::fs::read_to_string(path).unwrap_or_default()).unwrap_or(Value::Null)
}

fn booked(n: &Node, uid: &str) -> Option<Vec<(String, u64, u8)>> {
    n.reservations().into_iter().find_map(|r| match &r.owner {
        Owner::DraClaim { claim_uid, .. } if claim_uid == uid => Some(
            r.gpus
                .iter()
                .map(|b| (b.uuid.clone(), b.memory, b.cores))
                .collect(),
        ),
        _ => None,
    })
}

#[test]
fn auto_mode_publishes_slots_where_consumable_capacity_is_dropped_and_books_them() {
    let api = FakeApi::start();
    api.set_drops_consumable_capacity(true);
    let n = node(&api, &[16, 80]);
    let p = n.start();
    wait_for("the slot slice", || names(&api).len() == 8);
    assert_eq!(
        names(&api),
        [
            "gpu-0-slot-0",
            "gpu-0-slot-1",
            "gpu-0-slot-2",
            "gpu-0-slot-3",
            "gpu-1-slot-0",
            "gpu-1-slot-1",
            "gpu-1-slot-2",
            "gpu-1-slot-3"
        ]
    );
    for d in devices(&api) {
        assert!(d.get("allowMultipleAllocations").is_none(), "{d}");
        let gpu = if d["name"].as_str().unwrap().starts_with("gpu-0") {
            0
        } else {
            1
        };
        assert_eq!(d["attributes"]["uuid"]["string"], n.uuid(gpu), "{d}");
        let slot = if gpu == 0 { "4Gi" } else { "20Gi" };
        assert_eq!(d["capacity"]["memory"]["value"], slot, "{d}");
        assert_eq!(d["capacity"]["cores"]["value"], "25", "{d}");
    }
    let mode = mode_of(&n);
    assert_eq!(
        (
            mode["mode"].as_str(),
            mode["configured"].as_str(),
            mode["slots_per_gpu"].as_u64()
        ),
        (Some("slots"), Some("auto"), Some(4)),
        "{mode}"
    );

    // Two slots of GPU 1 with a 50% share (2 × 25% is what they carry).
    api.put_claim(&slot_claim(
        "two",
        "uid-two",
        &[("gpu", "gpu-1-slot-0"), ("gpu", "gpu-1-slot-1")],
        json!([{"source": "FromClaim", "requests": ["gpu"],
            "opaque": {"driver": "gpuslice.io", "parameters": {"cores": 50}}}]),
    ));
    let k = Kubelet::connect(&p);
    let r = k.prepare(&[("ns", "two", "uid-two")]);
    let got = &r.claims["uid-two"];
    assert_eq!(got.error, "");
    assert_eq!(
        got.devices
            .iter()
            .map(|d| d.device_name.as_str())
            .collect::<Vec<_>>(),
        ["gpu-1-slot-0", "gpu-1-slot-1"]
    );
    assert_eq!(booked(&n, "uid-two").unwrap(), [(n.uuid(1), 40 * GIB, 50)]);

    // A node-path slice of 5 GiB on GPU 0 withdraws two of its 4 GiB slots; the held slots
    // of GPU 1 stay published (the scheduler counts them as allocated).
    let mut req = Request::new(Owner::container());
    req.memory = Some(Quantity::Bytes(5 * GIB));
    req.selectors = vec![Selector::Index(0)];
    n.registry.reserve(&req).unwrap();
    wait_for("the withdrawn slots", || names(&api).len() == 6);
    assert_eq!(
        names(&api)[..2],
        ["gpu-0-slot-0".to_string(), "gpu-0-slot-1".to_string()]
    );

    // Bad claims: each refused naming what is accepted, nothing booked.
    api.put_claim(&slot_claim(
        "spans",
        "uid-spans",
        &[("gpu", "gpu-0-slot-2"), ("gpu", "gpu-1-slot-2")],
        json!([]),
    ));
    api.put_claim(&slot_claim(
        "opaque",
        "uid-opaque",
        &[("gpu", "gpu-1-slot-2")],
        json!([{"source": "FromClaim", "opaque": {"driver": "gpuslice.io", "parameters": {"cores": "lots"}}}]),
    ));
    api.put_claim(&slot_claim(
        "cores",
        "uid-cores",
        &[("gpu", "gpu-1-slot-2")],
        json!([{"source": "FromClaim", "opaque": {"driver": "gpuslice.io", "parameters": {"cores": 30}}}]),
    ));
    let r = k.prepare(&[
        ("ns", "spans", "uid-spans"),
        ("ns", "opaque", "uid-opaque"),
        ("ns", "cores", "uid-cores"),
    ]);
    for (uid, part) in [
        ("uid-spans", "matchAttribute: gpuslice.io/uuid"),
        ("uid-opaque", "accepted: a JSON object {\"cores\""),
        ("uid-cores", "at most 25%"),
    ] {
        let e = &r.claims[uid].error;
        assert!(e.contains(part), "{uid}: `{e}` lacks `{part}`");
        assert!(booked(&n, uid).is_none(), "{uid} booked nothing");
    }

    // Unprepare releases the slots.
    assert_eq!(
        k.unprepare(&[("ns", "two", "uid-two")]).claims["uid-two"].error,
        ""
    );
    assert!(booked(&n, "uid-two").is_none());
    p.stop().unwrap();
}

#[test]
fn a_restart_against_an_upgraded_api_server_publishes_capacity_and_keeps_slot_claims() {
    let api = FakeApi::start();
    api.set_drops_consumable_capacity(true);
    let n = node(&api, &[16, 80]);
    let p = n.start();
    wait_for("the slot slice", || names(&api).len() == 8);
    api.put_claim(&slot_claim(
        "old",
        "uid-old",
        &[("gpu", "gpu-1-slot-0"), ("gpu", "gpu-1-slot-1")],
        json!([]),
    ));
    let k = Kubelet::connect(&p);
    assert_eq!(
        k.prepare(&[("ns", "old", "uid-old")]).claims["uid-old"].error,
        ""
    );
    drop(k);
    p.stop().unwrap();

    // The cluster turns consumable capacity on; the plugin restarts.
    api.set_drops_consumable_capacity(false);
    let p = n.start();
    wait_for("the capacity slice", || names(&api) == ["gpu-0", "gpu-1"]);
    // The slot claim's 40 GiB stay booked and are not offered: the scheduler cannot see them
    // in capacity mode.
    wait_for("GPU 1 offered without the slot claim", || {
        devices(&api)[1]["capacity"]["memory"]["value"] == "40Gi"
    });
    assert_eq!(devices(&api)[0]["capacity"]["memory"]["value"], "16Gi");
    assert_eq!(devices(&api)[1]["allowMultipleAllocations"], true);
    assert_eq!(mode_of(&n)["mode"], "capacity");
    assert_eq!(booked(&n, "uid-old").unwrap(), [(n.uuid(1), 40 * GIB, 0)]);

    // A new claim in capacity mode on the same GPU, and the old one still prepares again
    // (a kubelet restart) and unprepares.
    api.put_claim(&support::claim(
        "ns",
        "new",
        "uid-new",
        &[("gpu", "node-a", "gpu-1", "30Gi", "20")],
    ));
    let k = Kubelet::connect(&p);
    let r = k.prepare(&[("ns", "new", "uid-new"), ("ns", "old", "uid-old")]);
    assert_eq!(r.claims["uid-new"].error, "");
    assert_eq!(r.claims["uid-old"].error, "");
    assert_eq!(booked(&n, "uid-new").unwrap(), [(n.uuid(1), 30 * GIB, 20)]);
    assert_eq!(
        k.unprepare(&[("ns", "old", "uid-old")]).claims["uid-old"].error,
        ""
    );
    wait_for("GPU 1 offered whole again", || {
        devices(&api)[1]["capacity"]["memory"]["value"] == "80Gi"
    });
    p.stop().unwrap();
}
