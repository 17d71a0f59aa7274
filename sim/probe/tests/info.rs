//! `info` against the simulated driver reports what `devices.json` says, through every
//! resolution mode, and only the GPUs whose device node is present.

use crate::common;
use common::*;

#[test]
fn info_matches_devices_json_and_nvml() {
    let node = node(2, 8 * GIB);
    for dev in 0..2 {
        let v = json(&node, &["--device", &dev.to_string(), "info"]);
        let d = &node.devices[dev];
        assert_eq!(v["count"], 2);
        assert_eq!(v["name"], d.model.as_str());
        assert_eq!(v["uuid"], d.uuid.as_str());
        assert_eq!(u(&v, "total_mem"), d.memory);
        assert_eq!(u(&v, "mem_total"), d.memory);
        assert_eq!(u(&v, "mem_free"), d.memory);
        assert_eq!(u(&v, "clock_khz"), u64::from(d.clock_khz));
        assert_eq!(u(&v, "sm_count"), u64::from(d.sm_count));
        assert_eq!(u(&v["nvml"], "total"), d.memory, "{v}");
        assert_eq!(u(&v["nvml"], "used"), 0);
    }
}

#[test]
fn every_resolution_mode_and_version_reaches_the_driver() {
    let node = node(1, 4 * GIB);
    for (resolve, version) in [
        ("proc", "11030"),
        ("proc", "12040"),
        ("proc2", "12040"),
        ("dlsym", "11080"),
        ("default", "12040"),
    ] {
        let v = json(
            &node,
            &["--resolve", resolve, "--cuda-version", version, "info"],
        );
        assert_eq!(v["resolve"], resolve);
        assert_eq!(u(&v, "total_mem"), 4 * GIB);
    }
}

#[test]
fn only_gpus_with_device_nodes_are_visible() {
    let node = node(3, 2 * GIB);
    node.hide(0);
    node.hide(2);
    let v = json(&node, &["info"]);
    assert_eq!(v["count"], 1);
    assert_eq!(
        v["uuid"],
        node.devices[1].uuid.as_str(),
        "ordinal 0 is the first visible GPU"
    );
    let out = run(&node, &["--device", "1", "info"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("CUDA_ERROR_INVALID_DEVICE"));
}

#[test]
fn failures_are_one_line_with_the_status_name() {
    let node = node(1, GIB);
    node.hide(0);
    let out = run(&node, &["info"]);
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cuInit failed: CUDA_ERROR_NO_DEVICE"), "{err}");

    let out = run(&node, &["--lib", "/nonexistent/libcuda.so.1", "info"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("cannot load /nonexistent/libcuda.so.1"),
        "{err}"
    );
}

/// A GPU whose driver reserves memory, as real ones do: NVML's total holds it and v1 counts
/// it as used; CUDA's totals leave it out, and no allocation path ever gets it.
#[test]
fn reserved_memory_is_in_nvml_total_but_never_allocatable() {
    let mut d = gpuslice_sim_core::testing::device(0, "NVIDIA H100 80GB HBM3", 8 * GIB);
    d.reserved_memory = 512 << 20;
    let node = SimFixture::with_devices(vec![d]);
    gpuslice_sim_core::testing::copy_sim_libs(built_libs(), &node.lib_dir())
        .expect("install libraries");
    let cuda_total = 8 * GIB - (512 << 20);
    let v = json(&node, &["info"]);
    assert_eq!(u(&v, "total_mem"), cuda_total, "{v}");
    assert_eq!(u(&v, "mem_total"), cuda_total, "{v}");
    assert_eq!(u(&v, "mem_free"), cuda_total, "{v}");
    assert_eq!(u(&v["nvml"], "total"), 8 * GIB, "{v}");
    assert_eq!(u(&v["nvml"], "used"), 512 << 20, "{v}");
    assert_eq!(u(&v["nvml"], "free"), cuda_total, "{v}");
    for api in ["alloc", "vmm", "pool"] {
        let v = json(&node, &["alloc", "--chunk", "512Mi", "--api", api]);
        assert_eq!(v["error"], "CUDA_ERROR_OUT_OF_MEMORY", "{api}: {v}");
        assert_eq!(u(&v, "total"), cuda_total, "{api}: {v}");
        assert_eq!(u(&v, "mem_free"), 0, "{api}: {v}");
    }
}
