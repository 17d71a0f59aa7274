//! `alloc` against the simulated driver: every allocation path stops at the GPU's physical
//! capacity with `CUDA_ERROR_OUT_OF_MEMORY`; memory is node-wide across processes and comes
//! back when a process dies.

use crate::common;
use common::*;

const APIS: &[&str] = &[
    "alloc", "pitch", "managed", "async", "pool", "vmm", "array", "graph",
];

#[test]
fn every_api_stops_at_capacity_with_out_of_memory() {
    let node = node(1, 6 * GIB);
    for api in APIS {
        let v = json(&node, &["alloc", "--chunk", "1Gi", "--api", api]);
        assert_eq!(v["error"], "CUDA_ERROR_OUT_OF_MEMORY", "{api}: {v}");
        assert_eq!(u(&v, "total"), 6 * GIB, "{api}: {v}");
        assert_eq!(u(&v, "mem_free"), 0, "{api}: {v}");
        // The next process finds everything free again.
    }
    let v = json(&node, &["info"]);
    assert_eq!(u(&v, "mem_free"), 6 * GIB);
}

#[test]
fn chunks_that_do_not_divide_capacity_stop_below_it() {
    let node = node(1, 5 * GIB);
    let v = json(&node, &["alloc", "--chunk", "2Gi"]);
    assert_eq!((u(&v, "count"), u(&v, "total")), (2, 4 * GIB));
    assert_eq!(u(&v, "mem_free"), GIB);
    let v = json(&node, &["alloc", "--chunk", "1Gi", "--max", "3Gi"]);
    assert_eq!(u(&v, "total"), 3 * GIB);
    assert!(v["error"].is_null(), "{v}");
}

#[test]
fn processes_share_node_wide_memory_per_device() {
    let node = node(2, 8 * GIB);
    let mut holder = spawn(
        &node,
        &["alloc", "--chunk", "1Gi", "--max", "5Gi", "--hold", "30"],
    );
    let held = first_line(&mut holder);
    assert_eq!(u(&held, "total"), 5 * GIB);

    let other = json(&node, &["alloc", "--chunk", "1Gi", "--api", "vmm"]);
    assert_eq!(
        u(&other, "total"),
        3 * GIB,
        "only what the holder left: {other}"
    );
    let info = json(&node, &["info"]);
    assert_eq!(u(&info, "mem_free"), 3 * GIB);
    assert_eq!(u(&info["nvml"], "used"), 5 * GIB);
    // The other device is untouched.
    let info1 = json(&node, &["--device", "1", "info"]);
    assert_eq!(u(&info1, "mem_free"), 8 * GIB);

    holder.kill().unwrap();
    holder.wait().unwrap();
}

#[test]
fn a_killed_process_gives_its_memory_back() {
    let node = node(1, 4 * GIB);
    let mut holder = spawn(&node, &["alloc", "--chunk", "1Gi", "--hold", "60"]);
    assert_eq!(u(&first_line(&mut holder), "total"), 4 * GIB);
    assert_eq!(u(&json(&node, &["info"]), "mem_free"), 0);

    // SIGKILL: no destructor, no atexit; only the kernel releasing the slot lock.
    holder.kill().unwrap();
    holder.wait().unwrap();
    let v = json(&node, &["info"]);
    assert_eq!(u(&v, "mem_free"), 4 * GIB, "{v}");
    let v = json(&node, &["alloc", "--chunk", "1Gi", "--api", "pool"]);
    assert_eq!(u(&v, "total"), 4 * GIB);
}
