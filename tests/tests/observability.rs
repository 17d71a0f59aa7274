//! End to end on a simulated node: two slice containers (runc through
//! `gpuslice-runtime`) run `gpuslice-probe alloc` and `burn`; the `/metrics` of a
//! `gpuslice serve` started here shows their limits and the memory and compute share they
//! really use, within tolerance of what the probes print, passes `promtool check metrics`,
//! and forgets them once they exit. `gpuslice status` shows the same measured memory.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpuslice_e2e::runc::{run_detached, runtime, Bundle, Detached};
use gpuslice_e2e::serve::{Exporter, Series};
use gpuslice_e2e::{serial, TestNode};
use serde_json::Value;

/// The value of `name` for reservation `id`, if exported.
fn of(series: &[Series], name: &str, id: &str) -> Option<f64> {
    series
        .iter()
        .find(|s| s.name == name && s.labels.get("reservation").map(String::as_str) == Some(id))
        .map(|s| s.value)
}

/// The first JSON line printed by a probe (`"cmd":"<cmd>"`).
fn probe_json(out: &str, cmd: &str) -> Value {
    let line = out
        .lines()
        .find(|l| l.starts_with('{') && l.contains(&format!("\"cmd\":\"{cmd}\"")))
        .unwrap_or_else(|| panic!("no {cmd} JSON in:\n{out}"));
    serde_json::from_str(line).unwrap()
}

/// The reservation id of container `cid`.
fn reservation_of(node: &TestNode, cid: &str) -> String {
    node.reservations()
        .iter()
        .find(|r| r["container_id"] == cid)
        .and_then(|r| r["id"].as_str().map(str::to_string))
        .unwrap_or_else(|| panic!("no reservation for {cid}: {:?}", node.reservations()))
}

/// Force-deletes the named containers when dropped: left over by an earlier failed run
/// they would block the ids, and a failing assertion must not leave them running.
struct Containers<'a> {
    node: &'a TestNode,
    ids: &'static [&'static str],
}

impl<'a> Containers<'a> {
    fn new(node: &'a TestNode, ids: &'static [&'static str]) -> Containers<'a> {
        let c = Containers { node, ids };
        c.delete();
        c
    }

    fn delete(&self) {
        for id in self.ids {
            let _ = runtime(self.node).args(["delete", "--force", id]).output();
        }
    }
}

impl Drop for Containers<'_> {
    fn drop(&mut self) {
        self.delete();
    }
}

/// Waits until the container's init has exited (`runc state` says stopped).
fn wait_stopped(node: &TestNode, c: &Detached) {
    let start = Instant::now();
    loop {
        let out = runtime(node).args(["state", &c.id]).output().unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        if v["status"] == "stopped" {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{} did not stop: {v}",
            c.id
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn exporter_shows_two_slices_measured_and_forgets_them_after_exit() {
    // Measures compute shares over timed windows: the machine alone.
    let _s = serial();
    let node = TestNode::exact(&["10Gi", "10Gi"]);
    let exporter = Exporter::start(&node);
    let _containers = Containers::new(&node, &["e2e-obs-alloc", "e2e-obs-burn"]);

    // A: 1 GiB in 256 MiB chunks, held, on a 4 GiB slice of GPU 0.
    let a = Bundle::new(
        "gpuslice-probe --json alloc --chunk 256Mi --max 1Gi --hold 12; echo DONE",
        &[("gpuslice.io/memory", "4Gi"), ("gpuslice.io/gpu", "0")],
    );
    // B: kernels back to back for 8 s on a 30 % slice of GPU 1.
    let b = Bundle::new(
        "gpuslice-probe --json burn --seconds 8; echo DONE",
        &[
            ("gpuslice.io/memory", "2Gi"),
            ("gpuslice.io/cores", "30"),
            ("gpuslice.io/gpu", "1"),
        ],
    );
    let ca = run_detached(&node, &a, "e2e-obs-alloc").expect("alloc container starts");
    let cb = run_detached(&node, &b, "e2e-obs-burn").expect("burn container starts");
    let burn_started = Instant::now();
    let ra = reservation_of(&node, "e2e-obs-alloc");
    let rb = reservation_of(&node, "e2e-obs-burn");

    // Memory: what the probe allocated, exactly, from the usage file; NVML agrees.
    let alloc = probe_json(&ca.wait_for("\"cmd\":\"alloc\""), "alloc");
    let total = alloc["total"].as_f64().unwrap();
    assert_eq!(total, (1u64 << 30) as f64, "{alloc}");
    let s = exporter.scrape();
    let log = || exporter.log();
    assert_eq!(
        of(&s, "gpuslice_slice_memory_limit_bytes", &ra),
        Some((4u64 << 30) as f64),
        "{}",
        log()
    );
    assert_eq!(of(&s, "gpuslice_slice_memory_used_bytes", &ra), Some(total));
    let nvml = of(&s, "gpuslice_slice_nvml_memory_used_bytes", &ra).expect("NVML cross-check");
    assert!(
        (nvml - total).abs() <= total * 0.01,
        "NVML per-process {nvml} vs usage file {total}; log: {}",
        log()
    );
    let labels = &s
        .iter()
        .find(|x| x.name == "gpuslice_slice_memory_used_bytes" && x.labels["reservation"] == ra)
        .unwrap()
        .labels;
    assert_eq!(labels["container_id"], "e2e-obs-alloc");
    assert_eq!(labels["uuid"], node.uuid(0));
    let gpu0_used = s
        .iter()
        .find(|x| x.name == "gpuslice_gpu_memory_used_bytes" && x.labels["index"] == "0")
        .map(|x| x.value);
    assert!(gpu0_used.is_some_and(|u| u >= total), "{gpu0_used:?}");
    assert_eq!(of(&s, "gpuslice_slice_compute_limit_ratio", &rb), Some(0.3));
    assert_eq!(
        of(&s, "gpuslice_slice_memory_limit_bytes", &rb),
        Some((2u64 << 30) as f64)
    );

    // Acceptance 2 on real output.
    let text = exporter.text();
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool");
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = promtool.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // `status` shows the same measured memory.
    let st = node.status();
    let r = st["reservations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == ra.as_str())
        .unwrap()
        .clone();
    assert_eq!(r["gpus"][0]["memory_used"].as_f64(), Some(total), "{st}");
    assert!(
        st["gpus"][0]["memory_used"].as_f64().unwrap() >= total,
        "{st}"
    );

    // Compute: the share over a window inside the burn, against the probe's own figure.
    let until = |t: Duration| {
        if let Some(rest) = t.checked_sub(burn_started.elapsed()) {
            std::thread::sleep(rest);
        }
    };
    until(Duration::from_millis(1500));
    let _baseline = exporter.scrape();
    until(Duration::from_millis(6500));
    let s = exporter.scrape();
    let share = of(&s, "gpuslice_slice_compute_used_ratio", &rb).expect("achieved share");
    let busy = of(&s, "gpuslice_slice_compute_busy_seconds_total", &rb).expect("busy counter");
    let burn = probe_json(&cb.wait_for("DONE"), "burn");
    // Kernels × their duration over the wall time; the event-timed figure includes the
    // shim's pacing delay inside the timed span, so it is not a share of device time here.
    let probe_share = burn["nominal_share"].as_f64().unwrap();
    assert!(
        (share - probe_share).abs() <= 0.05,
        "exporter share {share:.3} vs probe {probe_share:.3} ({burn})"
    );
    assert!(
        (share - 0.30).abs() <= 0.05,
        "share {share:.3} is not the 30 % limit"
    );
    let elapsed = burn_started.elapsed().as_secs_f64();
    assert!(
        busy > 0.0 && busy <= 0.36 * elapsed,
        "busy {busy} s over {elapsed} s"
    );

    // After they exit, their series disappear (before any registry operation reaps them).
    ca.wait_for("DONE");
    wait_stopped(&node, &ca);
    wait_stopped(&node, &cb);
    let s = exporter.scrape();
    for id in [&ra, &rb] {
        let left: Vec<&Series> = s
            .iter()
            .filter(|x| x.labels.get("reservation") == Some(id))
            .collect();
        assert!(left.is_empty(), "series of {id} remain: {left:?}");
    }
    assert!(s.iter().any(|x| x.name == "gpuslice_reservations"
        && x.labels["state"] == "stale"
        && x.value == 2.0));
    ca.remove(&node);
    cb.remove(&node);
    let s = exporter.scrape();
    let count = |state: &str| {
        s.iter()
            .find(|x| x.name == "gpuslice_reservations" && x.labels["state"] == state)
            .map(|x| x.value)
    };
    assert_eq!(count("bound"), Some(0.0));
    assert_eq!(count("stale"), Some(0.0));
    assert!(s
        .iter()
        .all(|x| x.name != "gpuslice_slice_memory_limit_bytes"));
    // Their exit made them stale; the poststop's registry operation reaps or releases them.
    let total = |name: &str| {
        s.iter()
            .find(|x| x.name == name)
            .map(|x| x.value)
            .unwrap_or(0.0)
    };
    assert!(
        total("gpuslice_released_total") + total("gpuslice_reaped_total") >= 2.0,
        "both left the registry"
    );
}
