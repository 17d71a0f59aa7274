//! A runc container with `gpuslice.io/gpus: 2` sees both of its GPUs and no other,
//! and the shim holds every process of it to the limit on each GPU separately, with one
//! account per GPU shared by the container's processes.

use gpuslice_e2e::runc::{run, Bundle};
use gpuslice_e2e::{lock, Resource, TestNode};

/// A first process takes 1 GiB on each GPU and holds it; a second fills both GPUs to the
/// limit; then both GPUs' identities are printed.
const SCRIPT: &str = "gpuslice-probe --json multi --devices 0,1 --chunk 512Mi --max 1Gi --hold 30 > /dev/shm/first & \
    first=$!; \
    n=0; while ! grep -q multi /dev/shm/first 2>/dev/null; do n=$((n+1)); [ $n -gt 300 ] && break; sleep 0.1; done; \
    echo FIRST $(cat /dev/shm/first); \
    gpuslice-probe --json multi --devices 0,1 --chunk 512Mi; \
    kill $first; wait $first; \
    gpuslice-probe --json info --device 0; \
    gpuslice-probe --json info --device 1; \
    gpuslice-probe --json info --device 2 || echo NO-THIRD-GPU";

fn json_lines(text: &str) -> Vec<serde_json::Value> {
    text.lines()
        .map(|l| l.strip_prefix("FIRST ").unwrap_or(l))
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON {l}: {e}")))
        .collect()
}

#[test]
fn runc_container_with_two_gpus_is_held_to_the_limit_on_each() {
    let _s = lock(&[Resource::Cdi]);
    let node = TestNode::exact(&["10Gi", "10Gi", "10Gi"]);
    let bundle = Bundle::new(
        SCRIPT,
        &[("gpuslice.io/gpus", "2"), ("gpuslice.io/memory", "3Gi")],
    );
    let out = run(&node, &bundle, "e2e-runc-two-gpus");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let lines = json_lines(&stdout);
    let multi: Vec<_> = lines.iter().filter(|v| v["cmd"] == "multi").collect();
    assert_eq!(multi.len(), 2, "both processes report: {stdout}\n{stderr}");
    let gib = 1u64 << 30;
    // The first process stopped at its --max on each GPU.
    for d in multi[0]["devices"].as_array().expect("devices") {
        assert_eq!(d["total"], gib, "first: {stdout}");
        assert!(d["error"].is_null(), "first: {stdout}");
    }
    // The second got the rest of each GPU's 3 GiB, no more, and was refused on each.
    for d in multi[1]["devices"].as_array().expect("devices") {
        assert_eq!(d["total"], 2 * gib, "second: {stdout}");
        assert_eq!(d["error"], "CUDA_ERROR_OUT_OF_MEMORY", "second: {stdout}");
        assert_eq!(d["mem_total"], 3 * gib, "second: {stdout}");
        assert_eq!(d["mem_free"], 0, "second: {stdout}");
    }
    // Two distinct GPUs, each reporting the slice, and no third one.
    let infos: Vec<_> = lines.iter().filter(|v| v["cmd"] == "info").collect();
    assert_eq!(infos.len(), 2, "{stdout}");
    assert_ne!(infos[0]["uuid"], infos[1]["uuid"], "{stdout}");
    for i in &infos {
        assert_eq!(i["mem_total"], 3 * gib, "{stdout}");
        assert_eq!(i["mem_free"], 3 * gib, "memory came back: {stdout}");
    }
    assert!(stdout.contains("NO-THIRD-GPU"), "{stdout}");
    assert!(
        node.reservations().is_empty(),
        "reservation not released: {:?}",
        node.reservations()
    );
    assert!(
        node.leftovers().is_empty(),
        "left behind: {:?}",
        node.leftovers()
    );
}
