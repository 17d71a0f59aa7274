//! The kubelet plugin's slice writer on a node config: a claim gets the same edits as an
//! annotation slice (the create path's `slice_spec`) with a claim's hook instead of the
//! bind/release hooks, as CDI
//! kind `gpuslice.io/claim` with one device named by the claim UID; the spec validates against
//! the CDI schema; the limits file holds the booking; a repeated write keeps the usage file;
//! releasing the claim removes its spec and slice directory.

#![cfg(feature = "full")]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use gpuslice_agent::nodespec::node_spec;

use crate::specs_schema::gpus;
use gpuslice_cdi::{DeviceNode, Mount};
use gpuslice_hook::create::driveredits::DriverEdits;
use gpuslice_hook::create::slicespec::slice_spec;
use gpuslice_hook::node::NodeContext;
use gpuslice_hook::specfiles::{Holder, NODE_SPEC_CACHE};
use gpuslice_kube::node_slices::{claim_spec_path, ClaimSlices};
use gpuslice_kube::SliceWriter;
use gpuslice_registry::{ClaimShare, Inventory, Owner};
use serde_json::Value;

use crate::cdi_schema;
use cdi_schema::validator;

fn node(dir: &Path) -> NodeContext {
    let shim = dir.join("libgpuslice_shim.so");
    std::fs::write(&shim, b"shim").unwrap();
    let bin = dir.join("gpuslice");
    std::fs::write(&bin, b"bin").unwrap();
    let cfg = dir.join("config.toml");
    std::fs::write(
        &cfg,
        format!(
            "state_dir = \"{}\"\n[cdi]\nspec_dir = \"{}\"\n[shim]\nlibrary = \"{}\"\n[hook]\npath = \"{}\"\n[inventory]\nsource = \"simulated\"\n[[inventory.simulated]]\nmemory = \"10Gi\"\n[[inventory.simulated]]\nmemory = \"10Gi\"\n",
            dir.join("state").display(),
            dir.join("cdi").display(),
            shim.display(),
            bin.display()
        ),
    )
    .unwrap();
    NodeContext::from_loaded(gpuslice_config::load_config(Some(&cfg), None).unwrap())
}

fn driver() -> DriverEdits {
    let node = |name: &str, major: i64, minor: i64| {
        DeviceNode::char_device(format!("/dev/{name}"), major, minor)
    };
    DriverEdits {
        control: vec![node("nvidiactl", 195, 255), node("nvidia-uvm", 510, 0)],
        gpus: BTreeMap::from([(0, node("nvidia0", 195, 0)), (1, node("nvidia1", 195, 1))]),
        mounts: vec![Mount::bind(
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            &["ro", "nosuid", "nodev", "bind"],
        )],
    }
}

#[test]
fn a_claim_gets_the_slice_edits_under_its_own_cdi_name() {
    let dir = tempfile::tempdir().unwrap();
    let n = node(dir.path());
    let config = n.config().clone();
    std::fs::create_dir_all(&config.state_dir).unwrap();
    let bin = n.hook_binary().unwrap();
    let spec = node_spec(&n, &bin, &gpus(), &driver()).unwrap();
    gpuslice_cdi::write_spec_compact_as(&config.state_dir, NODE_SPEC_CACHE, &spec).unwrap();
    let registry = Arc::new(n.open_registry().unwrap());
    registry.set_inventory(Inventory { gpus: gpus() }).unwrap();
    let uid = "0b4a6c1e-3d2f-4e5a-9b8c-7d6e5f4a3b2c";
    let owner = Owner::DraClaim {
        claim_uid: uid.into(),
        namespace: "ns".into(),
        members: Vec::new(),
        name: "c".into(),
        gone: None,
    };
    let share = ClaimShare {
        uuid: gpus()[1].uuid.clone(),
        memory: 3 << 30,
        cores: 40,
    };
    let r = registry
        .reserve_claim(&owner, &[share])
        .unwrap()
        .reservation;
    let writer = ClaimSlices::new(n.clone(), registry.clone()).unwrap();
    let ids = writer.write(uid, &r).unwrap();
    assert_eq!(ids, [format!("gpuslice.io/claim={uid}")]);

    let path = claim_spec_path(&config.cdi.spec_dir, uid).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let instance: Value = serde_json::from_slice(&bytes).unwrap();
    let errors: Vec<String> = validator()
        .iter_errors(&instance)
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "{errors:?}");
    let claim_spec = gpuslice_cdi::read_spec(&path).unwrap();
    assert_eq!(claim_spec.kind, "gpuslice.io/claim");
    assert_eq!(claim_spec.devices.len(), 1);
    assert_eq!(claim_spec.devices[0].name, uid);

    // The annotation path's slice spec for the same reservation: the same edits, hooks aside.
    let slice_dir = registry.slice_dir(&r.id).unwrap();
    let full = gpuslice_cdi::read_spec(&config.state_dir.join(NODE_SPEC_CACHE)).unwrap();
    let annotation = Holder::Container { reservation: &r.id };
    let mut expected = slice_spec(&n, &bin, &full, &r, &slice_dir, annotation)
        .unwrap()
        .devices[0]
        .container_edits
        .clone();
    assert!(
        !expected.hooks.is_empty(),
        "annotation slices carry bind/release hooks"
    );
    expected.hooks.clear();
    let mut edits = claim_spec.devices[0].container_edits.clone();
    // The claim's one hook records each container it is given to; nothing binds or
    // releases the claim's reservation.
    let hooks: Vec<(&str, &[String])> = edits
        .hooks
        .iter()
        .map(|h| (h.hook_name.as_str(), &h.args[h.args.len() - 4..]))
        .collect();
    assert_eq!(
        hooks,
        [(
            "createRuntime",
            &[
                "hook".to_string(),
                "create-runtime".into(),
                "--claim".into(),
                r.id.clone()
            ][..]
        )]
    );
    edits.hooks.clear();
    assert_eq!(edits, expected);
    let edits = &claim_spec.devices[0].container_edits;
    let nodes: Vec<&str> = edits.device_nodes.iter().map(|d| d.path.as_str()).collect();
    assert!(
        nodes.contains(&"/dev/nvidia1") && !nodes.contains(&"/dev/nvidia0"),
        "{nodes:?}"
    );
    assert!(nodes.contains(&"/dev/nvidiactl"));
    let targets: Vec<&str> = edits
        .mounts
        .iter()
        .map(|m| m.container_path.as_str())
        .collect();
    for t in [
        "/etc/ld.so.preload",
        "/run/gpuslice/limits.json",
        "/run/gpuslice/usage",
    ] {
        assert!(targets.contains(&t), "{t} not mounted: {targets:?}");
    }
    assert!(edits
        .env
        .contains(&format!("GPUSLICE_RESERVATION={}", r.id)));

    // The limits file holds the booking; a repeated write keeps the usage account.
    let limits: Value =
        serde_json::from_slice(&std::fs::read(slice_dir.join("limits.json")).unwrap()).unwrap();
    assert_eq!(limits["devices"][0]["memory_limit"], 3u64 << 30);
    assert_eq!(limits["devices"][0]["cores"], 40);
    let usage = slice_dir.join("usage");
    let mut account = std::fs::read(&usage).unwrap();
    account[100] = 7;
    std::fs::write(&usage, &account).unwrap();
    writer.write(uid, &r).unwrap();
    assert_eq!(
        std::fs::read(&usage).unwrap()[100],
        7,
        "usage file replaced"
    );
    assert_eq!(
        std::fs::read_to_string(config.state_dir.join("ld.so.preload")).unwrap(),
        "/usr/lib/gpuslice/libgpuslice_shim.so\n"
    );

    // Release: the registry's cleanup removes the claim's spec and its slice directory.
    registry.release_claim(uid).unwrap();
    assert!(!path.exists());
    assert!(!slice_dir.exists());
    writer.remove(uid).unwrap();
    assert!(writer.remove("../x").is_err());
}
