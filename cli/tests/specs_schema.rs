//! The specs gpuslice really generates — the node spec for whole GPUs and a slice spec —
//! validate against the CDI project's JSON schema, carry the lowest cdiVersion for their
//! fields, and come out byte-identical for the same inventory.

use std::collections::BTreeMap;
use std::path::Path;

use gpuslice_agent::nodespec::node_spec;
use gpuslice_cdi::{DeviceNode, Mount};
use gpuslice_hook::create::driveredits::DriverEdits;
use gpuslice_hook::create::slicespec::slice_spec;
use gpuslice_hook::node::NodeContext;
use gpuslice_hook::specfiles::Holder;
use gpuslice_registry::{Booking, Gpu, Owner, Reservation, ReservationState};
use serde_json::Value;

use crate::cdi_schema;
use cdi_schema::validator;

fn node(dir: &Path) -> NodeContext {
    let cfg = dir.join("config.toml");
    std::fs::write(
        &cfg,
        format!("state_dir = \"{}\"\n[inventory]\nsource = \"simulated\"\n[[inventory.simulated]]\nmemory = \"10Gi\"\n[[inventory.simulated]]\nmemory = \"10Gi\"\n", dir.join("state").display()),
    )
    .unwrap();
    NodeContext::from_loaded(gpuslice_config::load_config(Some(&cfg), None).unwrap())
}

/// The two simulated 10Gi H200s the node-spec tests build specs for.
pub(crate) fn gpus() -> Vec<Gpu> {
    (0..2)
        .map(|i| Gpu {
            index: i,
            uuid: gpuslice_config::simulated_uuid(i as usize, "NVIDIA H200"),
            model: "NVIDIA H200".into(),
            memory_total: 10 << 30,
            minor: i,
            pci_bus_id: None,
            numa_node: None,
            pcie_root: None,
        })
        .collect()
}

fn driver(root: &str) -> DriverEdits {
    let node = |name: &str, major: i64, minor: i64| {
        let mut n = DeviceNode::char_device(format!("/dev/{name}"), major, minor);
        n.host_path = Some(format!("{root}/dev/{name}"));
        n
    };
    DriverEdits {
        control: vec![
            node("nvidiactl", 195, 255),
            node("nvidia-uvm", 510, 0),
            node("nvidia-uvm-tools", 510, 1),
        ],
        gpus: BTreeMap::from([(0, node("nvidia0", 195, 0)), (1, node("nvidia1", 195, 1))]),
        mounts: vec![Mount::bind(
            format!("{root}/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            &["ro", "nosuid", "nodev", "bind"],
        )],
    }
}

fn check(v: &jsonschema::Validator, bytes: &[u8]) -> Value {
    let instance: Value = serde_json::from_slice(bytes).unwrap();
    let errors: Vec<String> = v
        .iter_errors(&instance)
        .map(|e| format!("{e} at {}", e.instance_path))
        .collect();
    assert!(
        errors.is_empty(),
        "not valid against the CDI schema: {errors:?}"
    );
    instance
}

#[test]
fn node_spec_is_schema_valid_lowest_version_and_deterministic() {
    let dir = tempfile::tempdir().unwrap();
    let n = node(dir.path());
    let bin = Path::new("/usr/bin/gpuslice");
    let spec = node_spec(&n, bin, &gpus(), &driver("/run/gpuslice/sim")).unwrap();
    let bytes = gpuslice_cdi::to_json(&spec).unwrap();
    let v = check(&validator(), &bytes);
    // hostPath on device nodes needs 0.5.0, nothing in the spec needs more.
    assert_eq!(v["cdiVersion"], "0.5.0");
    let names: Vec<&str> = v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 5);
    assert!(names.contains(&"0") && names.contains(&"1") && names.contains(&"all"));
    assert!(names.iter().filter(|n| n.starts_with("GPU-")).count() == 2);
    // Same inputs, same bytes.
    let again =
        gpuslice_cdi::to_json(&node_spec(&n, bin, &gpus(), &driver("/run/gpuslice/sim")).unwrap())
            .unwrap();
    assert_eq!(bytes, again);
    // Hooks: absolute path, explicit PATH-only environment, --config because not default.
    let hook = &v["devices"][0]["containerEdits"]["hooks"][0];
    assert_eq!(hook["hookName"], "createRuntime");
    assert_eq!(hook["path"], "/usr/bin/gpuslice");
    assert_eq!(hook["env"].as_array().unwrap().len(), 1);
    assert!(hook["env"][0].as_str().unwrap().starts_with("PATH="));
    let args: Vec<&str> = hook["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(&args[..2], &["gpuslice", "--config"]);
    assert!(args.ends_with(&["create-runtime", "--whole-gpu", gpus()[0].uuid.as_str()]));
    // No shim in the whole-GPU spec.
    assert!(!String::from_utf8_lossy(&bytes).contains("ld.so.preload"));
}

#[test]
fn without_host_paths_only_the_index_names_need_0_5_0() {
    let dir = tempfile::tempdir().unwrap();
    let n = node(dir.path());
    let mut d = driver("");
    for node in d.control.iter_mut().chain(d.gpus.values_mut()) {
        node.host_path = None;
    }
    let mut spec = node_spec(&n, Path::new("/usr/bin/gpuslice"), &gpus(), &d).unwrap();
    let v = check(&validator(), &gpuslice_cdi::to_json(&spec).unwrap());
    // Device names starting with a digit (`0`, `1`) arrived in CDI 0.5.0.
    assert_eq!(v["cdiVersion"], "0.5.0");
    spec.devices
        .retain(|d| !d.name.starts_with(|c: char| c.is_ascii_digit()));
    let v = check(&validator(), &gpuslice_cdi::to_json(&spec).unwrap());
    assert_eq!(v["cdiVersion"], "0.3.0");
}

#[test]
fn slice_spec_is_schema_valid_and_complete() {
    let dir = tempfile::tempdir().unwrap();
    let n = node(dir.path());
    let bin = Path::new("/usr/bin/gpuslice");
    let ns = node_spec(&n, bin, &gpus(), &driver("/run/gpuslice/sim")).unwrap();
    let r = Reservation {
        id: "3f9a0c1d2e4b5a69".into(),
        state: ReservationState::Pending,
        owner: Owner::container(),
        whole_gpu: false,
        gpus: vec![Booking {
            index: 1,
            uuid: gpus()[1].uuid.clone(),
            memory: 4 << 30,
            cores: 30,
            unknown: Default::default(),
        }],
        created_ms: 0,
        deadline_ms: Some(1),
        bound_ms: None,
        reserved_by: None,
        unknown: Default::default(),
    };
    let spec = slice_spec(
        &n,
        bin,
        &ns,
        &r,
        Path::new("/run/gpuslice/slices/3f9a0c1d2e4b5a69"),
        Holder::Container { reservation: &r.id },
    )
    .unwrap();
    let bytes = gpuslice_cdi::to_json(&spec).unwrap();
    let v = check(&validator(), &bytes);
    assert_eq!(v["kind"], "gpuslice.io/slice");
    assert_eq!(v["cdiVersion"], "0.5.0");
    let edits = &v["devices"][0]["containerEdits"];
    let nodes: Vec<&str> = edits["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        nodes,
        vec![
            "/dev/nvidia1",
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools"
        ]
    );
    let mounts: Vec<(&str, &str)> = edits["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["containerPath"].as_str().unwrap(),
                m["options"][0].as_str().unwrap(),
            )
        })
        .collect();
    for want in [
        ("/usr/lib/gpuslice/libgpuslice_shim.so", "ro"),
        ("/etc/ld.so.preload", "ro"),
        ("/run/gpuslice/limits.json", "ro"),
        ("/run/gpuslice/usage", "rw"),
        ("/usr/lib/x86_64-linux-gnu/libcuda.so.1", "ro"),
    ] {
        assert!(mounts.contains(&want), "missing {want:?} in {mounts:?}");
    }
    let env: Vec<&str> = edits["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    for want in [
        "GPUSLICE_RESERVATION=3f9a0c1d2e4b5a69",
        "GPUSLICE_DIR=/run/gpuslice",
        "NVIDIA_VISIBLE_DEVICES=void",
        "CUDA_DEVICE_MEMORY_LIMIT_0=4096m",
        "CUDA_DEVICE_SM_LIMIT=30",
    ] {
        assert!(env.contains(&want), "missing {want} in {env:?}");
    }
    let hooks: Vec<(&str, Vec<&str>)> = edits["hooks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["hookName"].as_str().unwrap(),
                h["args"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|a| a.as_str().unwrap())
                    .collect(),
            )
        })
        .collect();
    assert_eq!(hooks[0].0, "createRuntime");
    assert!(hooks[0]
        .1
        .ends_with(&["create-runtime", "--reservation", "3f9a0c1d2e4b5a69"]));
    assert_eq!(hooks[1].0, "poststop");
    assert!(hooks[1]
        .1
        .ends_with(&["poststop", "--reservation", "3f9a0c1d2e4b5a69"]));
}
