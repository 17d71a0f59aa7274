//! A context's own device memory, as a real driver charges it (the simulated driver's
//! `context_memory`): the shim measures it from the driver's figures when the context is
//! made and charges it to the slice, so the free memory `cuMemGetInfo` reports is what a
//! process can really still take; CUDA, NVML's memory info (v1, v2) and its process lists
//! (every version) then report one used figure for the slice, which is also what the driver
//! counts for its processes — never more than the limit.

use crate::common;
use common::*;

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};

const MIB: u64 = 1 << 20;
const CONTEXT: u64 = 300 * MIB;

/// Starts a probe that reports one JSON line and holds; returns it with that line.
fn started(mut cmd: std::process::Command) -> (Child, serde_json::Value) {
    let mut child = cmd.stdout(Stdio::piped()).spawn().expect("spawn");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read");
    let v =
        serde_json::from_str(line.trim()).unwrap_or_else(|e| panic!("probe said {line:?}: {e}"));
    (child, v)
}

fn stop(mut child: Child) {
    // SAFETY: our own child, not yet waited for.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().expect("wait");
}

/// The driver's per-process figures (host NVML, no shim): pid → bytes on GPU 0.
fn driver_processes(node: &SliceNode) -> Vec<(u64, u64)> {
    let v = run_json(node.bare_probe(&["smi"]));
    let list = &v["device"]["processes"]["nvmlDeviceGetComputeRunningProcesses_v3"];
    let pids = list["pids"].as_array().expect("pids");
    // The bare view lists figures only as a sum: ask per pid through v1 as well.
    assert_eq!(pids.len() as u64, list["count"].as_u64().unwrap(), "{v}");
    pids.iter()
        .map(|p| (p.as_u64().unwrap(), list["used"].as_u64().unwrap()))
        .collect()
}

/// Every used figure of a `fill` report: CUDA, NVML v1 and v2, and each compute list's sum.
fn used_figures(v: &serde_json::Value) -> Vec<(String, u64)> {
    let mut out = vec![("cuMemGetInfo".to_string(), u(v, "mem_used"))];
    let n = &v["nvml"];
    out.push(("nvml v1".into(), n["v1"]["used"].as_u64().expect("v1")));
    out.push(("nvml v2".into(), n["v2"]["used"].as_u64().expect("v2")));
    for name in [
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetComputeRunningProcesses_v2",
        "nvmlDeviceGetComputeRunningProcesses_v3",
    ] {
        out.push((
            name.into(),
            n["processes"][name]["used"].as_u64().expect(name),
        ));
    }
    out
}

#[test]
fn filling_what_cuda_reports_free_fills_the_slice_exactly_by_the_drivers_count() {
    let node = SliceNode::with_context_memory(&[16 * GIB], &[(4 * GIB, 0)], CONTEXT);
    let (child, v) = started(node.probe(&["fill", "--contexts", "2", "--hold", "60"]));
    assert_eq!(v["error"], serde_json::Value::Null, "{v}");
    assert_eq!(u(&v, "contexts"), 3, "{v}");
    // Three contexts' memory is charged before the process sees its free memory.
    assert_eq!(u(&v, "free_before"), 4 * GIB - 3 * CONTEXT, "{v}");
    assert_eq!(u(&v, "allocated"), 4 * GIB - 3 * CONTEXT, "{v}");
    assert_eq!(u(&v, "mem_free"), 0, "{v}");
    for (what, used) in used_figures(&v) {
        assert_eq!(used, 4 * GIB, "{what}: {v}");
    }
    let list = &v["nvml"]["processes"]["nvmlDeviceGetComputeRunningProcesses_v3"];
    assert_eq!(list["pids"], serde_json::json!([u(&v, "pid")]), "{v}");
    // The driver's own count for the process (what the host enforcer judges) is the same
    // figure: the slice is full, not over.
    let driver = driver_processes(&node);
    assert_eq!(driver, vec![(u(&v, "pid"), 4 * GIB)], "{v}");
    stop(child);
}

#[test]
fn several_processes_and_contexts_report_one_figure() {
    let node = SliceNode::with_context_memory(&[16 * GIB], &[(6 * GIB, 0)], CONTEXT);
    let (a, va) = started(node.probe(&[
        "fill",
        "--fraction",
        "0.5",
        "--contexts",
        "1",
        "--hold",
        "60",
    ]));
    let (b, vb) = started(node.probe(&["fill", "--contexts", "2", "--hold", "60"]));
    assert_eq!(u(&vb, "mem_free"), 0, "{vb}");
    for (what, used) in used_figures(&vb) {
        assert_eq!(used, 6 * GIB, "{what}: {vb}");
    }
    let list = &vb["nvml"]["processes"]["nvmlDeviceGetComputeRunningProcesses_v2"];
    assert_eq!(list["count"], 2, "both processes of the slice: {vb}");
    let (pa, pb) = (u(&va, "pid"), u(&vb, "pid"));
    let driver = driver_processes(&node);
    let mut pids: Vec<u64> = driver.iter().map(|(p, _)| *p).collect();
    pids.sort_unstable();
    let mut want = vec![pa, pb];
    want.sort_unstable();
    assert_eq!(pids, want, "{driver:?}");
    assert_eq!(
        driver[0].1,
        6 * GIB,
        "the driver's count is the slice's: {driver:?}"
    );
    stop(a);
    stop(b);
}

#[test]
fn a_neighbours_processes_are_not_listed() {
    let node = SliceNode::with_context_memory(&[16 * GIB], &[(4 * GIB, 0)], CONTEXT);
    let other = node.add_slice("other", &[(4 * GIB, 0)]);
    let (n, vn) = started(node.probe_in(&other, &["fill", "--fraction", "0.5", "--hold", "60"]));
    let (m, vm) = started(node.probe(&["fill", "--fraction", "0.25", "--hold", "60"]));
    let list = &vm["nvml"]["processes"]["nvmlDeviceGetComputeRunningProcesses_v3"];
    assert_eq!(list["pids"], serde_json::json!([u(&vm, "pid")]), "{vm}");
    assert_ne!(u(&vm, "pid"), u(&vn, "pid"));
    assert_eq!(
        vm["nvml"]["processes"]["nvmlDeviceGetGraphicsRunningProcesses_v3"]["count"], 0,
        "{vm}"
    );
    stop(n);
    stop(m);
}

#[test]
fn a_slice_too_small_for_a_context_refuses_it() {
    let node = SliceNode::with_context_memory(&[16 * GIB], &[(200 * MIB, 0)], CONTEXT);
    let out = node.probe(&["info"]).output().expect("run");
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("CUDA_ERROR_OUT_OF_MEMORY"), "{err}");
    // Nothing stays charged, on the slice or the device.
    let driver = run_json(node.bare_probe(&["smi"]));
    assert_eq!(driver["device"]["v1"]["used"], 0, "{driver}");
}
