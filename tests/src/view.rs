//! What a container given a slice must see, checked the same way whichever engine started it:
//! exactly its GPU and the control nodes, the shim in `/etc/ld.so.preload`, its read-only
//! limits, the environment docs/annotations.md lists, and the probe held to the slice by the shim.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::node::TestNode;

/// The request the view tests make: 4 GiB and 30 % of a GPU.
pub const SLICE_ANNOTATIONS: [(&str, &str); 2] =
    [("gpuslice.io/memory", "4Gi"), ("gpuslice.io/cores", "30")];

/// The container's script: prints its view, then `READY`, then waits to be stopped.
pub const SLICE_CHECKS: &str = "echo devices=$(ls /dev | grep nvidia | tr '\\n' ' '); \
    echo preload=$(cat /etc/ld.so.preload); \
    echo limits=$(cat /run/gpuslice/limits.json); \
    if (echo x > /run/gpuslice/limits.json) 2>/dev/null; then echo limits-writable; else echo limits-readonly; fi; \
    env | grep -E '^(GPUSLICE|CUDA_DEVICE|NVIDIA)' | sort; \
    gpuslice-probe info --json; \
    echo READY; exec sleep 600";

/// Waits until the file at `path` contains `marker`; returns its text.
pub fn wait_for_file(path: &Path, marker: &str) -> String {
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(marker) {
            return text;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no {marker:?} in {}: {text}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Checks `out`, printed by [`SLICE_CHECKS`] in container `container_id` on `node`, against
/// the node's one reservation; returns the reservation id.
pub fn assert_slice_view(node: &TestNode, out: &str, container_id: &str) -> String {
    let res = node.reservations();
    assert_eq!(res.len(), 1, "{res:?}");
    let r = &res[0];
    assert_eq!(r["state"], "bound", "{r}");
    assert_eq!(r["container_id"], container_id, "{r}");
    assert_eq!(r["gpus"][0]["memory"], 4u64 << 30);
    assert_eq!(r["gpus"][0]["cores"], 30);
    let id = r["id"].as_str().expect("id").to_string();
    let uuid = r["gpus"][0]["uuid"].as_str().expect("uuid").to_string();
    let index = (0..node.status()["gpus"].as_array().map_or(0, Vec::len))
        .find(|i| node.uuid(*i) == uuid)
        .expect("the booked GPU is in the inventory");

    let devices = out
        .lines()
        .find_map(|l| l.strip_prefix("devices="))
        .expect("device line");
    let mut seen: Vec<&str> = devices.split_whitespace().collect();
    seen.sort_unstable();
    let gpu = format!("nvidia{index}");
    let mut want = vec!["nvidia-uvm", "nvidia-uvm-tools", "nvidiactl", gpu.as_str()];
    want.sort_unstable();
    assert_eq!(seen, want, "devices in the container: {out}");

    assert!(
        out.lines()
            .any(|l| l == "preload=/usr/lib/gpuslice/libgpuslice_shim.so"),
        "{out}"
    );
    let limits = format!(
        "limits={{\"version\":1,\"reservation\":\"{id}\",\"devices\":[{{\"uuid\":\"{uuid}\",\"memory_limit\":4294967296,\"cores\":30}}]}}"
    );
    assert!(out.lines().any(|l| l == limits), "want {limits} in {out}");
    assert!(
        out.lines().any(|l| l == "limits-readonly"),
        "the container could write its limits: {out}"
    );
    for env in [
        format!("GPUSLICE_RESERVATION={id}"),
        "GPUSLICE_DIR=/run/gpuslice".to_string(),
        "NVIDIA_VISIBLE_DEVICES=void".to_string(),
        "CUDA_DEVICE_MEMORY_LIMIT_0=4096m".to_string(),
        "CUDA_DEVICE_SM_LIMIT=30".to_string(),
    ] {
        assert!(out.lines().any(|l| l == env), "missing {env}: {out}");
    }
    // The probe, through the shim, sees the slice and not the 10 GiB GPU.
    let info = out
        .lines()
        .find(|l| l.starts_with('{') && l.contains("total"))
        .expect("probe info JSON");
    let v: serde_json::Value = serde_json::from_str(info).expect("probe JSON");
    assert!(
        v.to_string().contains(&(4u64 << 30).to_string()),
        "probe does not report the 4 GiB slice: {v}"
    );
    assert!(
        !v.to_string().contains(&(10u64 << 30).to_string()),
        "probe sees the whole GPU: {v}"
    );
    id
}
