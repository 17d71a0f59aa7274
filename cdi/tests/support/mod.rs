//! Shared fixtures for the integration tests: realistic gpuslice specs and a table-driven
//! host device lookup.
#![allow(dead_code, clippy::expect_used, clippy::unwrap_used)]

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

use gpuslice_cdi::{
    ContainerEdits, Device, DeviceNode, DeviceStat, Hook, HostDevice, HostDeviceType, IntelRdt,
    Mount, NetDevice, Spec,
};

/// Host device lookup answering from a table; unknown paths are "not found".
#[derive(Default)]
pub struct FakeStat {
    pub devices: HashMap<PathBuf, HostDevice>,
    pub regular_files: Vec<PathBuf>,
}

impl FakeStat {
    pub fn nvidia() -> Self {
        let mut f = Self::default();
        for (path, major, minor) in [
            ("/dev/nvidia0", 195, 0),
            ("/dev/nvidia1", 195, 1),
            ("/dev/nvidiactl", 195, 255),
            ("/dev/nvidia-uvm", 508, 0),
            ("/dev/nvidia-uvm-tools", 508, 1),
        ] {
            f.devices.insert(
                path.into(),
                HostDevice {
                    device_type: HostDeviceType::Char,
                    major,
                    minor,
                },
            );
        }
        f.regular_files.push("/etc/passwd".into());
        f
    }
}

impl DeviceStat for FakeStat {
    fn stat(&self, path: &Path) -> io::Result<Option<HostDevice>> {
        if let Some(d) = self.devices.get(path) {
            return Ok(Some(*d));
        }
        if self.regular_files.iter().any(|p| p == path) {
            return Ok(None);
        }
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            "no such file or directory",
        ))
    }
}

/// The per-slice spec gpuslice publishes: one device named by the reservation id.
pub fn slice_spec(reservation: &str) -> Spec {
    let mut spec = Spec::new("gpuslice.io/slice");
    let hook = |name: &str, sub: &str| Hook {
        hook_name: name.into(),
        path: "/usr/bin/gpuslice".into(),
        args: vec!["gpuslice".into(), "hook".into(), sub.into()],
        env: vec!["PATH=/usr/sbin:/usr/bin:/sbin:/bin".into()],
        timeout: Some(10),
    };
    spec.devices.push(Device::new(
        reservation,
        ContainerEdits {
            env: vec![
                format!("GPUSLICE_RESERVATION={reservation}"),
                "GPUSLICE_DIR=/run/gpuslice".into(),
                "NVIDIA_VISIBLE_DEVICES=void".into(),
                "CUDA_DEVICE_MEMORY_LIMIT_0=4096m".into(),
            ],
            device_nodes: vec![
                DeviceNode {
                    permissions: Some("rw".into()),
                    ..DeviceNode::char_device("/dev/nvidia0", 195, 0)
                },
                DeviceNode::char_device("/dev/nvidiactl", 195, 255),
                // Numbers left out: taken from the host node.
                DeviceNode {
                    path: "/dev/nvidia-uvm".into(),
                    ..Default::default()
                },
                DeviceNode {
                    path: "/dev/nvidia-uvm-tools".into(),
                    host_path: Some("/dev/nvidia-uvm-tools".into()),
                    device_type: Some("c".into()),
                    file_mode: Some(0o666),
                    ..Default::default()
                },
            ],
            mounts: vec![
                Mount::bind(
                    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                    &["ro", "nosuid", "nodev", "bind"],
                ),
                Mount::bind(
                    "/usr/lib/gpuslice/libgpuslice_shim.so",
                    "/usr/lib/gpuslice/libgpuslice_shim.so",
                    &["ro", "nosuid", "nodev", "bind"],
                ),
                Mount::bind(
                    format!("/run/gpuslice/slices/{reservation}/ld.so.preload"),
                    "/etc/ld.so.preload",
                    &["ro", "nosuid", "nodev", "bind"],
                ),
                Mount::bind(
                    format!("/run/gpuslice/slices/{reservation}/limits.json"),
                    "/run/gpuslice/limits.json",
                    &["ro", "nosuid", "nodev", "bind"],
                ),
                Mount::bind(
                    format!("/run/gpuslice/slices/{reservation}/usage"),
                    "/run/gpuslice/usage",
                    &["rw", "nosuid", "nodev", "bind"],
                ),
            ],
            hooks: vec![
                hook("createRuntime", "create-runtime"),
                hook("poststop", "poststop"),
            ],
            ..Default::default()
        },
    ));
    spec
}

/// The node spec naming whole GPUs: `0`, `1`, `GPU-<uuid>`, `all`.
pub fn node_spec() -> Spec {
    let mut spec = Spec::new("gpuslice.io/gpu");
    spec.container_edits = ContainerEdits {
        env: vec!["NVIDIA_VISIBLE_DEVICES=void".into()],
        device_nodes: vec![DeviceNode::char_device("/dev/nvidiactl", 195, 255)],
        hooks: vec![Hook {
            hook_name: "createRuntime".into(),
            path: "/usr/bin/gpuslice".into(),
            args: vec!["gpuslice".into(), "hook".into(), "create-runtime".into()],
            ..Default::default()
        }],
        ..Default::default()
    };
    let gpu = |i: i64| ContainerEdits {
        device_nodes: vec![DeviceNode::char_device(format!("/dev/nvidia{i}"), 195, i)],
        ..Default::default()
    };
    spec.devices.push(Device::new("0", gpu(0)));
    spec.devices.push(Device::new("1", gpu(1)));
    spec.devices.push(Device::new(
        "GPU-0b7f3c1e-1111-2222-3333-444455556666",
        gpu(0),
    ));
    let mut all = gpu(0);
    all.append(&gpu(1));
    spec.devices.push(Device::new("all", all));
    spec
}

/// A spec using every field CDI 1.1.0 has.
pub fn every_field_spec() -> Spec {
    let mut spec = node_spec();
    spec.kind = "gpuslice.io/every.field".into();
    spec.annotations
        .insert("gpuslice.io/generated-by".into(), "test".into());
    spec.devices[0]
        .annotations
        .insert("uuid".into(), "GPU-0b7f3c1e".into());
    spec.container_edits.mounts.push(Mount {
        mount_type: Some("tmpfs".into()),
        ..Mount::bind("tmpfs", "/run/scratch", &["nosuid", "size=64m"])
    });
    spec.container_edits.device_nodes.push(DeviceNode {
        path: "/dev/gpuslice-null".into(),
        host_path: Some("/dev/null".into()),
        device_type: Some("c".into()),
        major: Some(1),
        minor: Some(3),
        file_mode: Some(0o20666),
        permissions: Some("rwm".into()),
        uid: Some(1000),
        gid: Some(1000),
    });
    spec.container_edits.intel_rdt = Some(IntelRdt {
        clos_id: Some("gpuslice".into()),
        l3_cache_schema: Some("L3:0=ff".into()),
        mem_bw_schema: Some("MB:0=50".into()),
        schemata: vec!["L2:0=f".into()],
        enable_monitoring: true,
    });
    spec.container_edits.additional_gids = vec![44, 109];
    spec.container_edits.net_devices = vec![NetDevice {
        host_interface_name: "eth1".into(),
        name: "net0".into(),
    }];
    spec
}
