//! Acceptance 1, 2 and 5: every allocation path stops at the limit with out-of-memory, CUDA
//! and NVML report the slice, whatever way entry points are resolved; without limits CUDA
//! does not start, and no environment variable changes a limit.

use crate::common;
use common::*;

const APIS: &[&str] = &[
    "alloc",
    "pitch",
    "managed",
    "async",
    "pool",
    "vmm",
    "vmm-release-mapped",
    "array",
    "array3d",
    "graph",
    "graph-node",
    "capture",
    "clone",
    "child",
    "heap",
    "graph-escape",
];

/// Graph APIs: every way of putting an allocation into a graph.
const GRAPH_APIS: &[&str] = &["graph", "graph-node", "capture", "clone", "child"];

#[test]
fn every_allocation_path_stops_at_the_limit() {
    let node = SliceNode::new(&[16 * GIB], &[(4 * GIB, 0)]);
    for api in APIS {
        let v = run_json(node.probe(&["alloc", "--chunk", "512Mi", "--api", api]));
        assert_eq!(v["error"], "CUDA_ERROR_OUT_OF_MEMORY", "{api}: {v}");
        assert!(u(&v, "total") <= 4 * GIB, "{api} exceeded the limit: {v}");
        assert_eq!(
            u(&v, "total"),
            4 * GIB,
            "{api}: the whole limit is usable: {v}"
        );
        assert_eq!(u(&v, "mem_total"), 4 * GIB, "{api}: {v}");
        assert_eq!(u(&v, "mem_free"), 0, "{api}: {v}");
    }
    // Without the shim the same node gives the whole GPU, on every path.
    for api in APIS {
        let bare =
            run_json(node.bare_probe(&["alloc", "--chunk", "1Gi", "--max", "8Gi", "--api", api]));
        assert_eq!(u(&bare, "total"), 8 * GIB, "{api} without the shim: {bare}");
    }
}

#[test]
fn what_a_free_gives_back_is_allocatable_again() {
    let node = SliceNode::new(&[16 * GIB], &[(4 * GIB, 0)]);
    // Frees that end an allocation's life by several steps (unmap after release, a graph's
    // live allocation freed after its executable) give the whole limit back.
    for api in [
        "alloc",
        "async",
        "vmm",
        "vmm-release-mapped",
        "graph",
        "graph-escape",
        "capture",
        "array",
    ] {
        let v = run_json(node.probe(&["alloc", "--chunk", "512Mi", "--api", api, "--rounds", "2"]));
        assert_eq!(v["error"], "CUDA_ERROR_OUT_OF_MEMORY", "{api}: {v}");
        assert_eq!(u(&v, "total"), 4 * GIB, "{api}: second round: {v}");
    }
}

#[test]
fn mipmapped_arrays_count_every_level() {
    let node = SliceNode::new(&[16 * GIB], &[(4 * GIB, 0)]);
    let v = run_json(node.probe(&["alloc", "--chunk", "512Mi", "--api", "mipmap"]));
    assert_eq!(v["error"], "CUDA_ERROR_OUT_OF_MEMORY", "{v}");
    // Two levels: 512 MiB + 128 MiB per array, so six fit in 4 GiB.
    assert_eq!(u(&v, "chunk"), 640 << 20, "{v}");
    assert_eq!(
        (u(&v, "count"), u(&v, "total")),
        (6, 6 * (640 << 20)),
        "{v}"
    );
    assert_eq!(u(&v, "mem_free"), 4 * GIB - 6 * (640 << 20), "{v}");
}

#[test]
fn every_graph_instantiate_variant_is_charged() {
    let node = SliceNode::new(&[16 * GIB], &[(4 * GIB, 0)]);
    for api in GRAPH_APIS {
        for how in ["legacy", "v2", "flags", "params"] {
            let v = run_json(node.probe(&[
                "alloc",
                "--chunk",
                "1Gi",
                "--api",
                api,
                "--instantiate",
                how,
            ]));
            assert_eq!(v["error"], "CUDA_ERROR_OUT_OF_MEMORY", "{api} {how}: {v}");
            assert_eq!(u(&v, "total"), 4 * GIB, "{api} {how}: {v}");
            assert_eq!(u(&v, "mem_free"), 0, "{api} {how}: {v}");
        }
    }
    // cuGraphAddNode before 12.3 (no edge data) is covered too.
    let v = run_json(node.probe(&[
        "--cuda-version",
        "12020",
        "alloc",
        "--chunk",
        "1Gi",
        "--api",
        "graph-node",
    ]));
    assert_eq!(v["error"], "CUDA_ERROR_OUT_OF_MEMORY", "{v}");
    assert_eq!(u(&v, "total"), 4 * GIB, "{v}");
}

#[test]
fn memory_a_pool_keeps_counts_against_the_limit() {
    let node = SliceNode::new(&[16 * GIB], &[(4 * GIB, 0)]);
    // Pools that keep what is freed into them: without the shim they hold the whole GPU.
    let bare = run_json(node.bare_probe(&[
        "alloc",
        "--chunk",
        "1Gi",
        "--max",
        "12Gi",
        "--api",
        "pool-keep",
    ]));
    assert_eq!(u(&bare, "reserved_peak"), 12 * GIB, "{bare}");
    // With the shim the kept memory is charged; at the limit the pools are trimmed instead
    // of the allocation failing, so the driver never holds more than the limit.
    let v = run_json(node.probe(&[
        "alloc",
        "--chunk",
        "1Gi",
        "--max",
        "12Gi",
        "--api",
        "pool-keep",
    ]));
    assert!(v["error"].is_null(), "trimming makes room: {v}");
    assert!(u(&v, "reserved_peak") <= 4 * GIB, "{v}");
    assert!(u(&v, "reserved_peak") >= 3 * GIB, "{v}");
    // Kept memory is the slice's: another process of the slice gets only the rest.
    let mut keeper = node
        .probe(&[
            "alloc",
            "--chunk",
            "1Gi",
            "--max",
            "3Gi",
            "--api",
            "pool-keep",
            "--hold",
            "60",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn keeper");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(keeper.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let kept: serde_json::Value = serde_json::from_str(&line).expect("keeper JSON");
    let other = run_json(node.probe(&["alloc", "--chunk", "512Mi", "--api", "alloc"]));
    let info = run_json(node.probe(&["info"]));
    let _ = keeper.kill();
    let _ = keeper.wait();
    assert_eq!(u(&kept, "reserved_peak"), 3 * GIB, "{kept}");
    assert_eq!(u(&other, "total"), GIB, "{other}");
    assert_eq!(u(&info, "mem_free"), GIB, "{info}");
}

#[test]
fn a_process_with_two_limited_gpus_is_held_to_each_limit() {
    let node = SliceNode::new(&[16 * GIB, 16 * GIB], &[(4 * GIB, 0), (2 * GIB, 0)]);
    for api in ["alloc", "async", "graph", "heap"] {
        let v = run_json(node.probe(&[
            "multi",
            "--devices",
            "0,1",
            "--chunk",
            "512Mi",
            "--api",
            api,
        ]));
        let d = v["devices"].as_array().expect("devices");
        assert_eq!(d.len(), 2, "{v}");
        for (dev, limit) in [(0, 4 * GIB), (1, 2 * GIB)] {
            assert_eq!(d[dev]["error"], "CUDA_ERROR_OUT_OF_MEMORY", "{api}: {v}");
            assert_eq!(u(&d[dev], "total"), limit, "{api} device {dev}: {v}");
            assert_eq!(u(&d[dev], "mem_total"), limit, "{api} device {dev}: {v}");
            assert_eq!(u(&d[dev], "mem_free"), 0, "{api} device {dev}: {v}");
        }
    }
}

#[test]
fn a_stream_ordered_allocation_is_charged_to_the_streams_device() {
    let node = SliceNode::new(&[16 * GIB, 16 * GIB], &[(4 * GIB, 0), (2 * GIB, 0)]);
    // Device 0's context current, the stream on device 1: the memory lands on device 1 and
    // is held to device 1's limit; device 0 keeps all of its own.
    let v = run_json(node.probe(&[
        "alloc",
        "--chunk",
        "512Mi",
        "--api",
        "async",
        "--stream-device",
        "1",
    ]));
    assert_eq!(v["error"], "CUDA_ERROR_OUT_OF_MEMORY", "{v}");
    assert_eq!(u(&v, "total"), 2 * GIB, "{v}");
    assert_eq!(u(&v, "mem_free"), 4 * GIB, "device 0 charged nothing: {v}");
}

#[test]
fn a_default_pool_allocation_is_charged_to_the_pools_device() {
    let node = SliceNode::new(&[16 * GIB, 16 * GIB], &[(4 * GIB, 0), (2 * GIB, 0)]);
    // Device 0's context current, device 1's default pool (cuDeviceGetDefaultMemPool, which
    // the shim did not create) on a stream of device 1: held to device 1's limit, and device
    // 1 has nothing left for anything else.
    let v = run_json(node.probe(&[
        "alloc",
        "--chunk",
        "512Mi",
        "--api",
        "default-pool",
        "--stream-device",
        "1",
    ]));
    assert_eq!(v["error"], "CUDA_ERROR_OUT_OF_MEMORY", "{v}");
    assert_eq!(u(&v, "total"), 2 * GIB, "{v}");
    assert_eq!(u(&v, "mem_free"), 4 * GIB, "device 0 charged nothing: {v}");
}

/// Runs `probe ctx-destroy` with `args` holding its memory; returns its report and what the
/// driver (NVML without the shim) says device `dev` uses meanwhile.
fn ctx_destroy_held(node: &SliceNode, args: &[&str], dev: &str) -> (serde_json::Value, u64) {
    let mut all = vec!["ctx-destroy", "--hold", "60"];
    all.extend_from_slice(args);
    let mut held = node
        .probe(&all)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn probe");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(held.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let bare = run_json(node.bare_probe(&["--device", dev, "info"]));
    let _ = held.kill();
    let _ = held.wait();
    let v: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{args:?}: {e}: {line:?}"));
    (v, u(&bare["nvml"], "used"))
}

#[test]
fn memory_no_context_owns_stays_charged_past_its_context() {
    // cuCtxDestroy does not free VMM, stream-ordered (pool) or graph memory: it is associated
    // with no context. Filled in a context that is then destroyed, it still holds the limit:
    // nothing more can be allocated, and the driver never holds more than the limit.
    let node = SliceNode::new(&[16 * GIB], &[(4 * GIB, 0)]);
    for api in ["vmm", "async", "pool", "graph", "graph-escape"] {
        let (v, used) = ctx_destroy_held(&node, &["--chunk", "512Mi", "--api", api], "0");
        assert_eq!(u(&v, "kept"), 4 * GIB, "{api}: {v}");
        assert_eq!(u(&v, "after"), 0, "{api}: nothing more fits: {v}");
        assert_eq!(v["error"], "CUDA_ERROR_OUT_OF_MEMORY", "{api}: {v}");
        assert_eq!(u(&v, "mem_free"), 0, "{api}: {v}");
        assert!(used <= 4 * GIB, "{api}: the driver holds {used} bytes: {v}");
    }
    // What dies with its context is given back with it.
    for api in ["alloc", "array", "heap"] {
        let (v, used) = ctx_destroy_held(&node, &["--chunk", "512Mi", "--api", api], "0");
        assert_eq!(
            u(&v, "after"),
            4 * GIB,
            "{api}: freed with the context: {v}"
        );
        assert!(used <= 4 * GIB, "{api}: the driver holds {used} bytes: {v}");
    }
}

/// Four threads allocate (`cuMemAlloc`, `cuMemAllocAsync`) and free at once for 300
/// rounds each, past the limit at times, the driver handing every freed address straight to
/// the next allocation of any thread (docs/shim.md, "Frees and reused handles"): the shim's
/// charge comes back exactly to the context's own memory, and the process never holds more
/// than the limit on the GPU (the driver's figure, what bare NVML reports, sampled
/// throughout).
#[test]
fn concurrent_allocation_and_free_keep_the_charge_exact() {
    const CONTEXT: u64 = 64 << 20;
    const LIMIT: u64 = GIB;
    let node = SliceNode::with_context_memory(&[16 * GIB], &[(LIMIT, 0)], CONTEXT);
    let sim = gpuslice_sim_core::SimNode::open(node.sim.paths.clone()).expect("open sim node");
    let args = [
        "churn",
        "--threads",
        "4",
        "--rounds",
        "300",
        "--chunk",
        "128Mi",
    ];
    let mut child = node
        .probe(&args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run the probe");
    let mut peak = 0;
    while child.try_wait().expect("wait for the probe").is_none() {
        peak = peak.max(sim.memory(0).expect("sim memory").used);
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    let out = child.wait_with_output().expect("probe output");
    assert!(out.status.success(), "churn failed: {out:?}");
    let v = json_lines(&out).pop().expect("a report");
    assert!(u(&v, "refusals") > 0, "the limit was never reached: {v}");
    assert!(u(&v, "allocs") > 1000, "{v}");
    assert_eq!(u(&v, "start"), CONTEXT, "charge before: {v}");
    assert_eq!(u(&v, "end"), CONTEXT, "charge after, everything freed: {v}");
    assert!(
        peak <= LIMIT,
        "the process held {peak} bytes, over {LIMIT}: {v}"
    );
    assert!(peak > CONTEXT, "the sampling saw no allocation: {v}");
}

/// The most memory the simulated driver says one process holds on GPU 0 (NVML's
/// per-process figure), sampled while `child` runs.
fn peak_per_process(
    node: &SliceNode,
    mut child: std::process::Child,
) -> (u64, std::process::Output) {
    let sim = gpuslice_sim_core::SimNode::open(node.sim.paths.clone()).expect("open sim node");
    let mut peak = 0;
    while child.try_wait().expect("wait for the probe").is_none() {
        let held = sim.state().slot_usage(0).expect("slot usage");
        peak = peak.max(held.iter().map(|s| s.used).max().unwrap_or(0));
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    (peak, child.wait_with_output().expect("probe output"))
}

/// Destroying an executable graph leaves its memory in the device's graph pool (CUDA
/// Programming Guide, graph memory nodes, "physical memory footprint"): the shim keeps it
/// charged, and before refusing an allocation trims the pool, so a cuMemAlloc of 3/4 of
/// the limit after a destroyed graph of 3/4 succeeds while the driver never holds more than
/// the limit for the process.
#[test]
fn a_destroyed_graphs_cached_memory_is_trimmed_before_an_allocation_is_refused() {
    const LIMIT: u64 = 4 * GIB;
    const CHUNK: u64 = 3 * GIB;
    let node = SliceNode::new(&[16 * GIB], &[(LIMIT, 0)]);
    let child = node
        .probe(&[
            "graph-cache",
            "--chunk",
            "3Gi",
            "--then",
            "alloc",
            "--hold",
            "0.5",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run the probe");
    let (peak, out) = peak_per_process(&node, child);
    assert!(out.status.success(), "graph-cache failed: {out:?}");
    let v = json_lines(&out).pop().expect("a report");
    assert!(
        peak <= LIMIT,
        "the driver held {peak} bytes for the process, over {LIMIT}: {v}"
    );
    assert!(peak >= CHUNK, "the sampling saw no allocation: {v}");
    assert_eq!(
        v["error"],
        serde_json::Value::Null,
        "cuMemAlloc after the trim: {v}"
    );
    assert_eq!(
        u(&v, "free_destroyed"),
        LIMIT - CHUNK,
        "the graph pool keeps the destroyed graph's memory: {v}"
    );
    assert_eq!(u(&v, "free_after"), LIMIT - CHUNK, "{v}");
    assert_eq!(
        u(&v, "graph_reserved"),
        0,
        "the graph pool was trimmed: {v}"
    );
}

/// Without a trim, a later graph is backed by what the graph pool keeps: no extra charge.
#[test]
fn a_later_graph_reuses_the_cached_graph_memory_without_more_charge() {
    const LIMIT: u64 = 4 * GIB;
    const CHUNK: u64 = 3 * GIB;
    let node = SliceNode::new(&[16 * GIB], &[(LIMIT, 0)]);
    let v = run_json(node.probe(&["graph-cache", "--chunk", "3Gi", "--then", "graph"]));
    assert_eq!(v["error"], serde_json::Value::Null, "{v}");
    assert_eq!(
        u(&v, "free_destroyed"),
        LIMIT - CHUNK,
        "the graph pool keeps the destroyed graph's memory: {v}"
    );
    assert_eq!(
        u(&v, "free_after"),
        LIMIT - CHUNK,
        "the second graph is backed by the cache: {v}"
    );
    assert_eq!(
        (u(&v, "graph_used"), u(&v, "graph_reserved")),
        (CHUNK, CHUNK),
        "the driver's graph pool did not grow: {v}"
    );
}

/// `cuDeviceGraphMemTrim` gives back what the graph pool kept.
#[test]
fn an_explicit_graph_memory_trim_gives_the_cache_back() {
    const LIMIT: u64 = 4 * GIB;
    const CHUNK: u64 = 3 * GIB;
    let node = SliceNode::new(&[16 * GIB], &[(LIMIT, 0)]);
    let v = run_json(node.probe(&["graph-cache", "--chunk", "3Gi", "--then", "trim"]));
    assert_eq!(v["error"], serde_json::Value::Null, "{v}");
    assert_eq!(
        u(&v, "free_destroyed"),
        LIMIT - CHUNK,
        "charged until the trim: {v}"
    );
    assert_eq!(u(&v, "free_after"), LIMIT, "the trim gave it back: {v}");
    assert_eq!(u(&v, "graph_reserved"), 0, "{v}");
}

#[test]
fn odd_sizes_never_exceed_the_limit() {
    let node = SliceNode::new(&[16 * GIB], &[(4 * GIB, 0)]);
    for api in ["alloc", "pitch", "array", "managed"] {
        let v = run_json(node.probe(&["alloc", "--chunk", "300000000", "--api", api]));
        assert_eq!(v["error"], "CUDA_ERROR_OUT_OF_MEMORY", "{api}: {v}");
        assert!(
            u(&v, "total") <= 4 * GIB && u(&v, "total") > 3 * GIB,
            "{api}: {v}"
        );
    }
}

#[test]
fn info_reports_the_slice_from_cuda_and_nvml() {
    let node = SliceNode::new(&[16 * GIB], &[(4 * GIB, 0)]);
    let v = run_json(node.probe(&["info"]));
    assert_eq!(u(&v, "mem_total"), 4 * GIB, "{v}");
    assert_eq!(u(&v, "mem_free"), 4 * GIB, "{v}");
    assert_eq!(u(&v, "total_mem"), 4 * GIB, "{v}");
    assert_eq!(u(&v["nvml"], "total"), 4 * GIB, "{v}");
    assert_eq!(u(&v["nvml"], "free"), 4 * GIB, "{v}");
    // With another process of the slice holding 1.5 GiB: free = limit - used, both ways.
    let mut holder = node
        .probe(&[
            "alloc", "--chunk", "512Mi", "--max", "1536Mi", "--hold", "60",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn holder");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let v = run_json(node.probe(&["info"]));
    let _ = holder.kill();
    let _ = holder.wait();
    let used = 1536 << 20;
    assert_eq!(u(&v, "mem_free"), 4 * GIB - used, "{v}");
    assert_eq!(u(&v, "mem_total"), 4 * GIB, "{v}");
    assert_eq!(u(&v["nvml"], "free"), 4 * GIB - used, "{v}");
    assert_eq!(u(&v["nvml"], "used"), used, "{v}");
}

/// On a GPU whose driver reserves memory, a whole-GPU slice (or one booked before the
/// reserved memory was left out) reports CUDA's total through NVML too, never NVML's, and
/// allocates no more than that.
#[test]
fn a_whole_gpu_slice_reports_the_total_without_the_reserved_memory() {
    let cuda_total = 8 * GIB - (512 << 20);
    for limit in [cuda_total, 8 * GIB] {
        let node = SliceNode::with_reserved_memory(&[8 * GIB], &[(limit, 0)], 512 << 20);
        let v = run_json(node.probe(&["info"]));
        assert_eq!(u(&v, "mem_total"), cuda_total, "limit {limit}: {v}");
        assert_eq!(u(&v, "total_mem"), cuda_total, "limit {limit}: {v}");
        assert_eq!(u(&v, "mem_free"), cuda_total, "limit {limit}: {v}");
        assert_eq!(u(&v["nvml"], "total"), cuda_total, "limit {limit}: {v}");
        assert_eq!(u(&v["nvml"], "free"), cuda_total, "limit {limit}: {v}");
        assert_eq!(u(&v["nvml"], "used"), 0, "limit {limit}: {v}");
        let v = run_json(node.probe(&["alloc", "--chunk", "512Mi"]));
        assert_eq!(u(&v, "total"), cuda_total, "limit {limit}: {v}");
    }
}

#[test]
fn limit_above_the_gpu_is_clamped_to_physical() {
    let node = SliceNode::new(&[2 * GIB], &[(8 * GIB, 0)]);
    let v = run_json(node.probe(&["info"]));
    assert_eq!(u(&v, "mem_total"), 2 * GIB, "{v}");
    assert_eq!(u(&v["nvml"], "total"), 2 * GIB, "{v}");
}

#[test]
fn every_resolution_path_and_cuda_version_is_covered() {
    let node = SliceNode::new(&[16 * GIB], &[(4 * GIB, 0)]);
    for resolve in ["proc", "proc2", "dlsym", "default"] {
        for version in ["11040", "11080", "12000", "12040"] {
            if resolve == "proc2" && version.starts_with("11") {
                continue; // cuGetProcAddress_v2 exists from 12.0
            }
            for api in ["alloc", "async", "vmm"] {
                let args = [
                    "--resolve",
                    resolve,
                    "--cuda-version",
                    version,
                    "alloc",
                    "--chunk",
                    "1Gi",
                    "--api",
                    api,
                ];
                let v = run_json(node.probe(&args));
                assert_eq!(
                    v["error"], "CUDA_ERROR_OUT_OF_MEMORY",
                    "{resolve} {version} {api}: {v}"
                );
                assert_eq!(u(&v, "total"), 4 * GIB, "{resolve} {version} {api}: {v}");
                assert_eq!(
                    u(&v, "mem_total"),
                    4 * GIB,
                    "{resolve} {version} {api}: {v}"
                );
            }
        }
    }
}

#[test]
fn dlvsym_hands_out_the_interceptors() {
    let node = SliceNode::new(&[16 * GIB], &[(4 * GIB, 0)]);
    let alloc = |api| {
        node.probe(&[
            "--resolve",
            "dlvsym",
            "alloc",
            "--chunk",
            "1Gi",
            "--api",
            api,
        ])
    };
    // A driver with symbol version tables (any linked against glibc, this one too) gives
    // its unversioned entry points to no dlvsym version: the probe cannot resolve them.
    let out = alloc("alloc").output().expect("run probe");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && stderr.contains("cannot resolve cuInit")
            && stderr.contains("through dlvsym"),
        "{out:?}"
    );
    // Without version tables glibc accepts any version: the shim hands out its interceptors.
    strip_symbol_versions(&node.sim.lib_dir().join("libcuda.so.1"));
    for api in ["alloc", "async", "vmm"] {
        let v = run_json(alloc(api));
        assert_eq!(v["error"], "CUDA_ERROR_OUT_OF_MEMORY", "{api}: {v}");
        assert_eq!(u(&v, "total"), 4 * GIB, "{api}: {v}");
    }
}

#[test]
fn without_limits_cuda_initialisation_fails_with_the_message() {
    let node = SliceNode::new(&[16 * GIB], &[(4 * GIB, 0)]);
    let mut cmd = node.bare_probe(&["info"]);
    cmd.env("LD_PRELOAD", &node.art.shim);
    let out = cmd.output().expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("gpuslice-shim: error: no limits"), "{err}");
    assert!(
        err.contains("/run/gpuslice/limits.json") && err.contains("GPUSLICE_DIR"),
        "{err}"
    );
    assert!(err.contains("CUDA_ERROR_NOT_INITIALIZED"), "{err}");
    // A broken limits file is refused too, naming the file.
    std::fs::write(node.slice_dir.join("limits.json"), b"{not json").unwrap();
    let out = node.probe(&["info"]).output().expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("limits.json") && err.contains("invalid JSON"),
        "{err}"
    );
}

#[test]
fn the_environment_cannot_raise_a_limit() {
    let node = SliceNode::new(&[16 * GIB], &[(4 * GIB, 0)]);
    let mut cmd = node.probe(&["alloc", "--chunk", "1Gi", "--max", "16Gi"]);
    cmd.env("CUDA_DEVICE_MEMORY_LIMIT", "16g")
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "16384m")
        .env("CUDA_DEVICE_SM_LIMIT", "100")
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/tmp/x")
        .env("GPUSLICE_MEMORY_LIMIT", "16Gi")
        .env("NVIDIA_VISIBLE_DEVICES", "all");
    let v = run_json(cmd);
    assert_eq!(u(&v, "total"), 4 * GIB, "{v}");
    assert_eq!(v["error"], "CUDA_ERROR_OUT_OF_MEMORY", "{v}");
}

#[test]
fn a_device_missing_from_the_limits_is_not_usable() {
    // Two GPUs, limits only for the first.
    let node = SliceNode::new(&[16 * GIB, 16 * GIB], &[(4 * GIB, 0)]);
    let out = node
        .probe(&["info", "--device", "1"])
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no entry in"), "{err}");
    let v = run_json(node.probe(&["alloc", "--chunk", "1Gi", "--api", "alloc"]));
    assert_eq!(u(&v, "total"), 4 * GIB, "device 0 still works: {v}");
}
