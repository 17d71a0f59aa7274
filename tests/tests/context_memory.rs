//! End to end on a simulated node whose CUDA contexts cost device memory, as a real GPU's do
//! (`inventory.simulated[].context_memory`), with a real runc container and a `gpuslice
//! serve` in the default kill mode with a short grace: two processes of a slice, three and
//! two contexts, allocate what `cuMemGetInfo` reports free (as vLLM and SGLang size their
//! caches) — the slice is then full by the driver's count and never over it, so the enforcer
//! kills nobody; and CUDA, NVML (memory info v1 and v2, every compute process list), the
//! exporter's slice series and `gpuslice status` report one used figure for the slice,
//! within 1 MiB. `nvidia-smi` in the container (the probe, its stand-in on the simulated
//! node, installed in the simulated driver root and mounted by the create path like the
//! real one) lists the slice's own processes only. Times the enforcer: the machine alone.

use std::time::{Duration, Instant};

use gpuslice_e2e::runc::{run_detached, runtime, Bundle};
use gpuslice_e2e::serve::{value, Exporter};
use gpuslice_e2e::{serial, TestNode};
use serde_json::Value;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
const LIMIT: u64 = 4 * GIB;
/// Readings of the enforcer's (250 ms apart) to wait for after the slice is full: twice
/// the 1 s grace.
const READINGS: f64 = 8.0;

fn reservation_of(node: &TestNode, cid: &str) -> String {
    node.reservations()
        .iter()
        .find(|r| r["container_id"] == cid)
        .and_then(|r| r["id"].as_str().map(str::to_string))
        .unwrap_or_else(|| panic!("no reservation for {cid}: {:?}", node.reservations()))
}

/// Every JSON line of `text` with `"cmd":"<cmd>"`.
fn reports(text: &str, cmd: &str) -> Vec<Value> {
    text.lines()
        .filter(|l| l.starts_with('{') && l.contains(&format!("\"cmd\":\"{cmd}\"")))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn within_a_mib(what: &str, got: u64, want: u64, context: &dyn std::fmt::Display) {
    assert!(
        got.abs_diff(want) <= MIB,
        "{what}: {got} bytes, the slice's used memory is {want}\n{context}"
    );
}

#[test]
fn a_slice_filled_by_what_cuda_reports_free_is_full_not_over_and_all_figures_agree() {
    let _s = serial();
    let node = TestNode::with_context(
        &["16Gi"],
        "384Mi",
        "[enforce]\ngrace = \"1s\"\ninterval = \"250ms\"\n",
    );
    let exporter = Exporter::start(&node);
    let cid = "e2e-ctx-fill";
    let _ = runtime(&node).args(["delete", "--force", cid]).output();
    let script = "gpuslice-probe --json fill --fraction 0.5 --contexts 2 --hold 120 > /dev/shm/a.log 2>&1 & \
        until grep -q fill /dev/shm/a.log; do sleep 0.1; done; cat /dev/shm/a.log; \
        gpuslice-probe --json fill --contexts 1 --hold 120 > /dev/shm/b.log 2>&1 & \
        until grep -q fill /dev/shm/b.log; do sleep 0.1; done; cat /dev/shm/b.log; \
        nvidia-smi --json; echo SMI $?; \
        wait; echo EXIT $?";
    let b = Bundle::new(script, &[("gpuslice.io/memory", "4Gi")]);
    let c = run_detached(&node, &b, cid).expect("container starts");
    let r = reservation_of(&node, cid);
    let text = c.wait_for("SMI ");
    let fills = reports(&text, "fill");
    assert_eq!(fills.len(), 2, "{text}");
    let (a, last) = (&fills[0], &fills[1]);
    assert_eq!(a["contexts"], 3, "{a}");
    assert_eq!(last["contexts"], 2, "{last}");
    // The second process took everything CUDA said was free: nothing is left.
    assert_eq!(last["error"], Value::Null, "{last}");
    assert_eq!(last["allocated"], last["free_before"], "{last}");
    assert!(last["mem_free"].as_u64().unwrap() < 2 * MIB, "{last}");
    // The driver's count is the slice's: over several readings past grace, nobody is
    // killed, and the exporter and `status` show the same figure.
    let cycles = |s: &[gpuslice_e2e::serve::Series]| {
        value(s, "gpuslice_enforcer_cycles_total", &[]).unwrap_or(0.0)
    };
    let start = cycles(&exporter.scrape());
    let waited = Instant::now();
    let s = loop {
        let s = exporter.scrape();
        if cycles(&s) >= start + READINGS {
            break s;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(30),
            "the enforcer made no readings\n{}",
            exporter.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let events = node.status()["enforcer"]["events"].clone();
    assert!(
        !events.to_string().contains("memory_kill"),
        "a process that filled its slice was killed: {events}\n{}",
        exporter.log()
    );
    let now = std::fs::read_to_string(&c.log).unwrap_or_default();
    assert!(!now.contains("EXIT"), "a probe ended early:\n{now}");

    // One used figure: CUDA's, NVML's memory info and process lists in the container.
    let used = last["mem_used"].as_u64().unwrap();
    within_a_mib("cuMemGetInfo", used, LIMIT, last);
    let nv = &last["nvml"];
    within_a_mib("NVML v1", nv["v1"]["used"].as_u64().unwrap(), used, last);
    within_a_mib("NVML v2", nv["v2"]["used"].as_u64().unwrap(), used, last);
    for list in [
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetComputeRunningProcesses_v2",
        "nvmlDeviceGetComputeRunningProcesses_v3",
    ] {
        let l = &nv["processes"][list];
        assert_eq!(l["count"], 2, "{list}: both processes of the slice: {last}");
        within_a_mib(list, l["used"].as_u64().unwrap(), used, last);
    }

    let of = |name: &str| {
        value(&s, name, &[("reservation", r.as_str())])
            .unwrap_or_else(|| panic!("{name} missing for {r}\n{}", exporter.text())) as u64
    };
    within_a_mib(
        "exporter",
        of("gpuslice_slice_memory_used_bytes"),
        used,
        last,
    );
    within_a_mib(
        "exporter (the driver's count)",
        of("gpuslice_slice_nvml_memory_used_bytes"),
        used,
        last,
    );
    assert!(of("gpuslice_slice_nvml_memory_used_bytes") <= LIMIT);
    let st = node.status();
    let res = st["reservations"]
        .as_array()
        .and_then(|v| v.iter().find(|x| x["id"] == r.as_str()))
        .unwrap_or_else(|| panic!("{st}"));
    within_a_mib(
        "gpuslice status",
        res["gpus"][0]["memory_used"].as_u64().unwrap_or(0),
        used,
        &st,
    );

    // nvidia-smi in the container: the slice's memory and its own two processes.
    let smi = reports(&text, "smi");
    assert_eq!(smi.len(), 1, "nvidia-smi ran in the container: {text}");
    let d = &smi[0]["device"];
    assert_eq!(d["v2"]["total"], LIMIT, "{d}");
    within_a_mib("nvidia-smi", d["v2"]["used"].as_u64().unwrap(), used, d);
    let mut pids: Vec<u64> = d["processes"]["nvmlDeviceGetComputeRunningProcesses_v3"]["pids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_u64().unwrap())
        .collect();
    pids.sort_unstable();
    let mut want = vec![a["pid"].as_u64().unwrap(), last["pid"].as_u64().unwrap()];
    want.sort_unstable();
    assert_eq!(pids, want, "{d}");
    // Whole-GPU containers get it too: the node CDI spec mounts the same program.
    let smi_host = node.state_dir().join("sim/usr/bin/nvidia-smi");
    let specs: String = std::fs::read_dir(&node.cdi_dir)
        .expect("cdi dir")
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
        .collect();
    assert!(
        specs.contains(&format!("\"{}\"", smi_host.display()))
            && specs.contains("\"/usr/bin/nvidia-smi\""),
        "nvidia-smi is not in the node CDI spec:\n{specs}"
    );
    c.remove(&node);
}
