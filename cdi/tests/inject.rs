//! Injection into realistic OCI specs: the output of `runc spec` and a podman 4.3
//! config.json carrying unknown fields (tests/fixtures/). Edits follow the reference
//! library's ContainerEdits.Apply; nothing else in the spec changes.

use crate::support;

use gpuslice_cdi::{
    apply_edits_with, inject_with, ContainerEdits, DeviceNode, Hook, InjectError, Mount, Spec,
};
use serde_json::{json, Value};
use support::FakeStat;

const RID: &str = "3f9a0c1d2e4b5a69";

fn fixture(name: &str) -> Value {
    let text = match name {
        "runc" => include_str!("fixtures/runc-spec.json"),
        "podman" => include_str!("fixtures/podman-config.json"),
        other => panic!("no fixture {other}"),
    };
    serde_json::from_str(text).expect("fixture parses")
}

fn inject_slice(oci: &mut Value) -> Result<(), InjectError> {
    inject_with(oci, &support::slice_spec(RID), &[RID], &FakeStat::nvidia())
}

/// `after` with every field CDI edits may touch set back to its value in `before`.
fn undo_cdi_fields(before: &Value, after: &Value) -> Value {
    let mut undone = after.clone();
    for path in [
        &["process", "env"][..],
        &["process", "user", "additionalGids"],
        &["linux", "devices"],
        &["linux", "resources", "devices"],
        &["linux", "intelRdt"],
        &["linux", "netDevices"],
        &["mounts"],
        &["hooks"],
    ] {
        let original = path.iter().try_fold(before, |v, k| v.get(k)).cloned();
        let (last, parents) = path.split_last().expect("non-empty");
        let Some(parent) = parents.iter().try_fold(&mut undone, |v, k| v.get_mut(k)) else {
            continue;
        };
        let obj = parent.as_object_mut().expect("object");
        match original {
            Some(v) => {
                obj.insert(last.to_string(), v);
            }
            None => {
                obj.remove(*last);
            }
        }
    }
    // Objects the edits had to create (e.g. linux.resources) that were absent before.
    if before.pointer("/linux/resources").is_none() {
        if let Some(linux) = undone.get_mut("linux").and_then(Value::as_object_mut) {
            if linux
                .get("resources")
                .is_some_and(|r| r.as_object().is_some_and(|o| o.is_empty()))
            {
                linux.remove("resources");
            }
        }
    }
    undone
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|e| e.as_str().expect("string"))
        .collect()
}

#[test]
fn podman_config_keeps_unknown_fields_and_everything_else() {
    let before = fixture("podman");
    let mut oci = before.clone();
    inject_slice(&mut oci).expect("inject");
    assert_ne!(oci, before);
    assert_eq!(
        oci["x-vendor-extension"],
        json!({"kept": [1, "two", {"three": null}]})
    );
    assert_eq!(oci["linux"]["x-linux-unknown"], json!({"a": true}));
    assert_eq!(oci["process"]["x-process-unknown"], 7);
    assert_eq!(oci["linux"]["resources"]["devices"][0]["x-rule-unknown"], 1);
    let proc_mount = oci["mounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .find(|m| m["destination"] == "/proc")
        .expect("/proc");
    assert_eq!(proc_mount["x-mount-unknown"], "m");
    assert_eq!(
        undo_cdi_fields(&before, &oci),
        before,
        "only CDI fields may change"
    );
    // Key order survives too (config.json diffs stay readable).
    let keys = |v: &Value| {
        v.as_object()
            .expect("object")
            .keys()
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(keys(&oci)[..keys(&before).len()], keys(&before)[..]);
}

#[test]
fn runc_spec_gets_devices_rules_env_mounts_hooks() {
    let before = fixture("runc");
    let mut oci = before.clone();
    inject_slice(&mut oci).expect("inject");
    assert_eq!(undo_cdi_fields(&before, &oci), before);

    let env = strings(&oci["process"]["env"]);
    assert_eq!(
        &env[..2],
        &strings(&before["process"]["env"])[..],
        "existing variables stay first"
    );
    assert!(env.contains(&"GPUSLICE_RESERVATION=3f9a0c1d2e4b5a69"));

    assert_eq!(
        oci["linux"]["devices"],
        json!([
            {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0},
            {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255},
            {"path": "/dev/nvidia-uvm", "type": "c", "major": 508, "minor": 0},
            {"path": "/dev/nvidia-uvm-tools", "type": "c", "major": 508, "minor": 1, "fileMode": 0o666},
        ])
    );
    let rules = oci["linux"]["resources"]["devices"]
        .as_array()
        .expect("rules");
    let before_rules = before["linux"]["resources"]["devices"]
        .as_array()
        .expect("runc spec has a deny-all rule");
    assert_eq!(
        &rules[..before_rules.len()],
        &before_rules[..],
        "allow rules come after the existing deny rule"
    );
    assert_eq!(
        rules[before_rules.len()..],
        [
            json!({"allow": true, "type": "c", "major": 195, "minor": 0, "access": "rw"}),
            json!({"allow": true, "type": "c", "major": 195, "minor": 255, "access": "rwm"}),
            json!({"allow": true, "type": "c", "major": 508, "minor": 0, "access": "rwm"}),
            json!({"allow": true, "type": "c", "major": 508, "minor": 1, "access": "rwm"}),
        ]
    );

    assert_eq!(
        oci["hooks"],
        json!({
            "createRuntime": [{"path": "/usr/bin/gpuslice", "args": ["gpuslice", "hook", "create-runtime"],
                               "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"], "timeout": 10}],
            "poststop": [{"path": "/usr/bin/gpuslice", "args": ["gpuslice", "hook", "poststop"],
                          "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"], "timeout": 10}],
        })
    );
    assert_mounts_sorted(&oci);
    let limits = oci["mounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .find(|m| m["destination"] == "/run/gpuslice/limits.json");
    assert_eq!(
        limits,
        Some(
            &json!({"destination": "/run/gpuslice/limits.json", "source": "/run/gpuslice/slices/3f9a0c1d2e4b5a69/limits.json",
                     "options": ["ro", "nosuid", "nodev", "bind"]})
        )
    );
}

fn assert_mounts_sorted(oci: &Value) {
    let depth = |m: &Value| {
        m["destination"]
            .as_str()
            .expect("destination")
            .trim_end_matches('/')
            .matches('/')
            .count()
            .max(1)
    };
    let depths: Vec<usize> = oci["mounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .map(depth)
        .collect();
    assert!(
        depths.windows(2).all(|w| w[0] <= w[1]),
        "mounts sorted by depth: {depths:?}"
    );
}

#[test]
fn env_is_replaced_by_name_in_place() {
    let mut oci = fixture("podman");
    let env = oci["process"]["env"].as_array_mut().expect("env");
    env.insert(0, json!("NVIDIA_VISIBLE_DEVICES=all"));
    env.push(json!("GPUSLICE_DIR=/elsewhere"));
    let len_before = env.len();
    inject_slice(&mut oci).expect("inject");
    let env = strings(&oci["process"]["env"]);
    assert_eq!(
        env[0], "NVIDIA_VISIBLE_DEVICES=void",
        "replaced where it was"
    );
    assert_eq!(
        env.iter()
            .filter(|e| e.starts_with("NVIDIA_VISIBLE_DEVICES="))
            .count(),
        1
    );
    let dirs: Vec<&str> = env
        .iter()
        .copied()
        .filter(|e| e.starts_with("GPUSLICE_DIR="))
        .collect();
    assert_eq!(dirs, ["GPUSLICE_DIR=/run/gpuslice"]);
    assert_eq!(env.len(), len_before + 2, "two new variables appended");
}

#[test]
fn mount_with_same_destination_is_replaced_and_order_kept() {
    let mut oci = fixture("podman");
    let edits = ContainerEdits {
        mounts: vec![
            Mount::bind("/run/gpuslice/hosts", "/etc/hosts", &["ro", "bind"]),
            Mount::bind("/usr/lib/gpuslice", "/usr/lib/gpuslice/", &["ro", "bind"]),
        ],
        ..Default::default()
    };
    let before_dests: Vec<String> = oci["mounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .map(|m| m["destination"].as_str().expect("dest").to_string())
        .collect();
    apply_edits_with(&mut oci, &edits, &FakeStat::nvidia()).expect("apply");
    let mounts = oci["mounts"].as_array().expect("mounts");
    let hosts: Vec<&Value> = mounts
        .iter()
        .filter(|m| m["destination"] == "/etc/hosts")
        .collect();
    assert_eq!(
        hosts,
        [
            &json!({"destination": "/etc/hosts", "source": "/run/gpuslice/hosts", "options": ["ro", "bind"]})
        ]
    );
    assert_eq!(mounts.len(), before_dests.len() + 1);
    assert_mounts_sorted(&oci);
    // Untouched mounts keep their relative order (the sort is stable); the replaced one
    // moves to the end of the mounts of its depth, as in the reference library.
    let after_dests: Vec<&str> = mounts
        .iter()
        .map(|m| m["destination"].as_str().expect("dest"))
        .collect();
    let kept: Vec<&str> = after_dests
        .iter()
        .copied()
        .filter(|d| before_dests.iter().any(|b| b == d))
        .collect();
    let mut expected: Vec<&str> = before_dests
        .iter()
        .map(String::as_str)
        .filter(|d| *d != "/etc/hosts")
        .collect();
    expected.push("/etc/hosts");
    expected.sort_by_key(|d| d.matches('/').count());
    assert_eq!(kept, expected);
}

#[test]
fn applying_twice_equals_applying_once() {
    for name in ["runc", "podman"] {
        let mut once = fixture(name);
        inject_slice(&mut once).expect("first");
        let mut twice = once.clone();
        inject_slice(&mut twice).expect("second");
        assert_eq!(
            twice, once,
            "{name}: re-injection must not duplicate devices, rules, mounts, env or hooks"
        );
        let devices = once["linux"]["devices"].as_array().expect("devices");
        assert_eq!(
            devices
                .iter()
                .filter(|d| d["path"] == "/dev/nvidia0")
                .count(),
            1
        );
    }
}

#[test]
fn hooks_are_appended_after_existing_ones() {
    let mut oci = fixture("runc");
    oci["hooks"] = json!({"createRuntime": [{"path": "/usr/libexec/other-hook"}], "prestart": [{"path": "/x"}]});
    inject_slice(&mut oci).expect("inject");
    let create_runtime = oci["hooks"]["createRuntime"].as_array().expect("hooks");
    assert_eq!(create_runtime.len(), 2);
    assert_eq!(
        create_runtime[0],
        json!({"path": "/usr/libexec/other-hook"})
    );
    assert_eq!(create_runtime[1]["path"], "/usr/bin/gpuslice");
    assert_eq!(oci["hooks"]["prestart"], json!([{"path": "/x"}]));
}

#[test]
fn existing_device_with_same_path_is_replaced() {
    let mut oci = fixture("runc");
    oci["linux"]["devices"] = json!([
        {"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229},
        {"path": "/dev/nvidia0", "type": "c", "major": 1, "minor": 1, "x": 1}
    ]);
    inject_slice(&mut oci).expect("inject");
    let devices = oci["linux"]["devices"].as_array().expect("devices");
    assert_eq!(devices[0]["path"], "/dev/fuse");
    let nv0: Vec<&Value> = devices
        .iter()
        .filter(|d| d["path"] == "/dev/nvidia0")
        .collect();
    assert_eq!(
        nv0,
        [&json!({"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0})]
    );
}

#[test]
fn node_owner_defaults_to_the_process_user() {
    let mut oci = fixture("runc");
    oci["process"]["user"] = json!({"uid": 1000, "gid": 1001});
    inject_slice(&mut oci).expect("inject");
    assert_eq!(oci["linux"]["devices"][0]["uid"], 1000);
    assert_eq!(oci["linux"]["devices"][0]["gid"], 1001);
}

#[test]
fn node_spec_spec_edits_apply_once_for_several_devices() {
    let mut oci = fixture("runc");
    inject_with(
        &mut oci,
        &support::node_spec(),
        &["0", "gpuslice.io/gpu=1"],
        &FakeStat::nvidia(),
    )
    .expect("inject");
    let paths: Vec<&str> = oci["linux"]["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .map(|d| d["path"].as_str().expect("p"))
        .collect();
    assert_eq!(paths, ["/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia1"]);
    assert_eq!(
        oci["hooks"]["createRuntime"]
            .as_array()
            .expect("hooks")
            .len(),
        1
    );
}

#[test]
fn every_field_is_applied() {
    let mut oci = fixture("runc");
    inject_with(
        &mut oci,
        &support::every_field_spec(),
        &["0"],
        &FakeStat::nvidia(),
    )
    .expect("inject");
    assert_eq!(
        oci["linux"]["intelRdt"],
        json!({"closID": "gpuslice", "l3CacheSchema": "L3:0=ff", "memBwSchema": "MB:0=50", "schemata": ["L2:0=f"], "enableMonitoring": true})
    );
    assert_eq!(
        oci["linux"]["netDevices"],
        json!({"eth1": {"name": "net0"}})
    );
    assert_eq!(oci["process"]["user"]["additionalGids"], json!([44, 109]));
    let null = oci["linux"]["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .find(|d| d["path"] == "/dev/gpuslice-null")
        .cloned();
    assert_eq!(
        null,
        Some(
            json!({"path": "/dev/gpuslice-null", "type": "c", "major": 1, "minor": 3, "fileMode": 0o20666, "uid": 1000, "gid": 1000})
        )
    );
    let tmpfs = oci["mounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .find(|m| m["destination"] == "/run/scratch")
        .cloned();
    assert_eq!(
        tmpfs,
        Some(
            json!({"destination": "/run/scratch", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "size=64m"]})
        )
    );
}

#[test]
fn unbuffered_and_fifo_nodes_get_no_cgroup_rule_and_fifo_no_stat() {
    let mut oci = json!({});
    let edits = ContainerEdits {
        device_nodes: vec![
            DeviceNode {
                path: "/dev/u".into(),
                device_type: Some("u".into()),
                major: Some(7),
                minor: Some(1),
                ..Default::default()
            },
            DeviceNode {
                path: "/dev/fifo".into(),
                device_type: Some("p".into()),
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    apply_edits_with(&mut oci, &edits, &FakeStat::default()).expect("no stat needed");
    assert_eq!(
        oci["linux"]["devices"][1],
        json!({"path": "/dev/fifo", "type": "p", "major": 0, "minor": 0})
    );
    assert!(oci["linux"].get("resources").is_none(), "{oci}");
}

#[test]
fn failures_leave_the_spec_untouched() {
    let before = fixture("runc");

    // The host node for /dev/nvidia-uvm is missing: the earlier edits must not stick.
    let mut oci = before.clone();
    let mut stat = FakeStat::nvidia();
    stat.devices.remove(std::path::Path::new("/dev/nvidia-uvm"));
    let e =
        inject_with(&mut oci, &support::slice_spec(RID), &[RID], &stat).expect_err("stat fails");
    assert!(matches!(e, InjectError::Stat { .. }), "{e}");
    assert!(e.to_string().contains("/dev/nvidia-uvm"), "{e}");
    assert_eq!(oci, before);

    // A wrong shape names the field.
    let mut oci = before.clone();
    oci["linux"]["devices"] = json!({"not": "an array"});
    let snapshot = oci.clone();
    let e = inject_slice(&mut oci).expect_err("shape").to_string();
    assert!(e.contains("linux.devices is not an array"), "{e}");
    assert_eq!(oci, snapshot);

    let mut oci = before.clone();
    oci["process"]["env"] = json!(["A=1", 5]);
    let e = inject_slice(&mut oci).expect_err("shape").to_string();
    assert!(e.contains("process.env[1] is not a string"), "{e}");

    let mut oci = json!("not an object");
    assert!(matches!(
        inject_slice(&mut oci),
        Err(InjectError::NotAnObject)
    ));
}

#[test]
fn host_node_problems_are_reported() {
    let mut oci = json!({});
    let regular = ContainerEdits {
        device_nodes: vec![DeviceNode {
            path: "/etc/passwd".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let e = apply_edits_with(&mut oci, &regular, &FakeStat::nvidia()).expect_err("not a device");
    assert!(matches!(e, InjectError::NotADevice { .. }), "{e}");

    let mismatch = ContainerEdits {
        device_nodes: vec![DeviceNode {
            path: "/dev/nvidia0".into(),
            device_type: Some("b".into()),
            ..Default::default()
        }],
        ..Default::default()
    };
    let e = apply_edits_with(&mut oci, &mismatch, &FakeStat::nvidia())
        .expect_err("type mismatch")
        .to_string();
    assert!(
        e.contains("declares type \"b\"") && e.contains("\"c\""),
        "{e}"
    );

    let u_on_char = ContainerEdits {
        device_nodes: vec![DeviceNode {
            path: "/dev/nvidia0".into(),
            device_type: Some("u".into()),
            ..Default::default()
        }],
        ..Default::default()
    };
    apply_edits_with(&mut oci, &u_on_char, &FakeStat::nvidia())
        .expect("u matches a character device");
    assert_eq!(
        oci["linux"]["devices"][0],
        json!({"path": "/dev/nvidia0", "type": "u", "major": 195, "minor": 0})
    );
    assert_eq!(oci.pointer("/linux/resources"), None);
    assert_eq!(json!({}), {
        let mut fresh = json!({});
        let _ = apply_edits_with(&mut fresh, &mismatch, &FakeStat::nvidia());
        fresh
    });
}

#[test]
fn device_requests_are_checked() {
    let spec = support::node_spec();
    let mut oci = fixture("runc");
    let e = inject_with(&mut oci, &spec, &["7"], &FakeStat::nvidia())
        .expect_err("unknown")
        .to_string();
    assert!(
        e.contains("\"7\"") && e.contains("0, 1, GPU-0b7f3c1e-1111-2222-3333-444455556666, all"),
        "{e}"
    );
    let e = inject_with(
        &mut oci,
        &spec,
        &["gpuslice.io/slice=0"],
        &FakeStat::nvidia(),
    )
    .expect_err("wrong kind");
    assert!(matches!(e, InjectError::WrongKind { .. }), "{e}");
    let e = inject_with(&mut oci, &spec, &["gpuslice.io/gpu="], &FakeStat::nvidia())
        .expect_err("malformed");
    assert!(matches!(e, InjectError::DeviceName(_)), "{e}");
    let before = oci.clone();
    inject_with(&mut oci, &spec, &[], &FakeStat::nvidia()).expect("nothing requested");
    assert_eq!(
        oci, before,
        "no devices requested: no edits, not even the spec's"
    );

    let mut invalid = Spec::new("gpuslice.io/gpu");
    invalid.devices.push(gpuslice_cdi::Device::new(
        "0",
        ContainerEdits {
            hooks: vec![Hook {
                hook_name: "onStart".into(),
                path: "/x".into(),
                ..Default::default()
            }],
            ..Default::default()
        },
    ));
    let e = inject_with(&mut oci, &invalid, &["0"], &FakeStat::nvidia())
        .expect_err("invalid")
        .to_string();
    assert!(
        e.contains("devices[0].containerEdits.hooks[0].hookName \"onStart\""),
        "{e}"
    );
}
