//! Compute, end to end on a simulated node with real runc containers (through
//! `gpuslice-runtime`) and a `gpuslice serve` started here: a process on a 30 % slice that
//! forges its pacing record (a loop zeroing device 0's pacing clock in the shared usage
//! file, so the shim never makes a launch wait) burns the GPU at ~98 %. With
//! `compute = "throttle"` the enforcer holds it to ≤ 35 % over 10 s; with `"report"` it
//! reports it and the process burns on.
//!
//! How utilisation is measured: as the enforcer's figure is defined, from the simulated
//! driver's own per-process record — the kernel time the driver charged to each process on
//! the device (`busy_ns` of its slot in the driver's state file, what NVML's per-process SM
//! utilisation is computed from). The slice's figure is the sum over the slots of the
//! container's pid namespace; utilisation over a window is its growth divided by the
//! window's wall time, an exact integral rather than a mean of sampled percentages. The
//! simulated device runs a kernel for its wall-clock duration once queued, whatever the
//! host's CPU load; the burner keeps 10–20 ms of kernels queued, so machine load can only
//! lower what it achieves (a starved launcher leaves the device idle), never raise it: the
//! ≤ 35 % bound does not depend on load. What load can delay is the enforcer's own
//! freezer thread, which the bound is meant to test.
//!
//! Engagement: the window starts when `gpuslice status --json` first shows the enforcer's
//! `compute_throttle` event for the slice (written when its cgroup enters the freezer duty
//! cycle), with no settling time after it.

use std::time::{Duration, Instant};

use gpuslice_e2e::runc::{run_detached, thaw, Bundle, Containers, Detached};
use gpuslice_e2e::serve::{value, Exporter};
use gpuslice_e2e::{serial, TestNode};
use gpuslice_sim_core::state::STATE_FILE;
use gpuslice_sim_core::SharedState;
use serde_json::Value;

/// The slice's compute share (annotation `gpuslice.io/cores`).
const CORES: &str = "30";
/// What the issue holds a throttled slice to.
const BOUND: f64 = 0.35;
/// The measurement window.
const WINDOW: Duration = Duration::from_secs(10);
/// Longest the enforcer may take to engage or report: its default window (5 s) plus
/// readings and the burner's start.
const ENGAGE: Duration = Duration::from_secs(20);

/// The forger: zeroes device 0's pacing clock (usage file: 64-byte header, then 64-byte
/// device records of busy ns, pacing clock, …: offset 72) every few milliseconds, so the
/// shim's pacing never holds a launch back; then the burner, 1 ms kernels back to back.
fn script() -> String {
    "while :; do dd if=/dev/zero of=/run/gpuslice/usage bs=8 seek=9 count=1 conv=notrunc 2>/dev/null; usleep 3000; done & \
     gpuslice-probe --json burn --seconds 120; echo EXIT $?"
        .to_string()
}

fn reservation_of(node: &TestNode, cid: &str) -> String {
    node.reservations()
        .iter()
        .find(|r| r["container_id"] == cid)
        .and_then(|r| r["id"].as_str().map(str::to_string))
        .unwrap_or_else(|| panic!("no reservation for {cid}: {:?}", node.reservations()))
}

/// The enforcer's events of `kind` for `reservation` in `status --json`.
fn events(node: &TestNode, kind: &str, reservation: &str) -> Vec<Value> {
    node.status()["enforcer"]["events"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e["kind"] == kind && e["reservation"] == reservation)
        .collect()
}

/// Waits up to `limit` for `f` to give something.
fn wait<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if start.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The simulated driver's per-process record for one container on one device.
struct DriverFigure {
    state: SharedState,
    dev: usize,
    pid_ns: u64,
}

impl DriverFigure {
    fn open(node: &TestNode, init_pid: u32, dev: usize) -> DriverFigure {
        let path = node.state_dir().join("sim/state").join(STATE_FILE);
        let state = SharedState::open(&path)
            .unwrap_or_else(|e| panic!("the simulated driver's state {}: {e}", path.display()));
        let link = std::fs::read_link(format!("/proc/{init_pid}/ns/pid")).expect("pid ns link");
        let pid_ns = link
            .to_string_lossy()
            .trim_start_matches("pid:[")
            .trim_end_matches(']')
            .parse()
            .expect("pid ns inode");
        DriverFigure { state, dev, pid_ns }
    }

    /// Kernel time the driver charged to the container's processes on the device, and the
    /// number of them.
    fn busy(&self) -> (Duration, usize) {
        let slots: Vec<_> = self
            .state
            .slot_usage(self.dev)
            .expect("driver slots")
            .into_iter()
            .filter(|s| s.pid_ns == self.pid_ns)
            .collect();
        let ns = slots.iter().map(|s| s.busy_ns).sum();
        (Duration::from_nanos(ns), slots.len())
    }

    /// Utilisation over `window` from now: the total, and each second's.
    fn measure(&self, window: Duration) -> (f64, Vec<f64>) {
        let (b0, n) = self.busy();
        assert!(n > 0, "no process of the container on GPU {}", self.dev);
        let t0 = Instant::now();
        let (mut last_b, mut last_t) = (b0, t0);
        let mut seconds = Vec::new();
        while t0.elapsed() < window {
            let next = last_t + Duration::from_secs(1);
            if let Some(w) = next.checked_duration_since(Instant::now()) {
                std::thread::sleep(w);
            }
            let (b, _) = self.busy();
            let t = Instant::now();
            seconds.push(b.saturating_sub(last_b).as_secs_f64() / (t - last_t).as_secs_f64());
            (last_b, last_t) = (b, t);
        }
        let total = last_b.saturating_sub(b0).as_secs_f64() / (last_t - t0).as_secs_f64();
        (total, seconds)
    }
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg").unwrap_or_default()
}

/// Starts the forging burner on a 30 % slice of a fresh node with `enforce`; returns the
/// node's pieces once the burner runs.
fn start(node: &TestNode, id: &str) -> (Bundle, Detached, String, DriverFigure) {
    let b = Bundle::new(
        &script(),
        &[("gpuslice.io/memory", "2Gi"), ("gpuslice.io/cores", CORES)],
    );
    let c = run_detached(node, &b, id).expect("container starts");
    let r = reservation_of(node, id);
    let pid = c.pid(node);
    let fig = DriverFigure::open(node, pid, 0);
    // The burner is on the GPU once the driver lists it.
    wait(Duration::from_secs(15), || (fig.busy().1 > 0).then_some(())).unwrap_or_else(|| {
        panic!(
            "the burner never reached the GPU:\n{}",
            std::fs::read_to_string(&c.log).unwrap_or_default()
        )
    });
    (b, c, r, fig)
}

#[test]
fn a_forged_pacing_burn_is_held_to_its_share_by_the_throttle() {
    // Measures the share the enforcer holds a slice to: the machine alone.
    let _s = serial();
    let node = TestNode::with(&["16Gi"], "[enforce]\ncompute = \"throttle\"\n");
    let exporter = Exporter::start(&node);
    let id = "e2e-enf-throttle";
    let _c = Containers::new(&node, &[id]);
    let (_b, c, r, fig) = start(&node, id);

    // Engagement: the first compute_throttle event for the slice.
    let engaged = wait(ENGAGE, || {
        events(&node, "compute_throttle", &r).into_iter().next()
    })
    .unwrap_or_else(|| panic!("never throttled\nserve log:\n{}", exporter.log()));
    let at_engagement = engaged["share"].as_f64().unwrap();
    let load_before = load();
    let (held, seconds) = fig.measure(WINDOW);
    let s = exporter.scrape();
    let run = value(
        &s,
        "gpuslice_enforcer_run_ratio",
        &[("reservation", r.as_str())],
    );
    eprintln!(
        "throttle: {:.1} % over {WINDOW:?} after engagement (share at engagement {:.1} %); per second: {}; run fraction now {run:?}; load {} -> {}",
        held * 100.0,
        at_engagement * 100.0,
        seconds.iter().map(|u| format!("{:.0}", u * 100.0)).collect::<Vec<_>>().join(" "),
        load_before.trim(),
        load().trim()
    );
    assert!(
        held <= BOUND,
        "throttled slice ran at {:.1} % over {WINDOW:?} (bound {:.0} %); per second {seconds:?}\nserve log:\n{}",
        held * 100.0,
        BOUND * 100.0,
        exporter.log()
    );
    // Held, not stopped: it still makes progress, and it lives.
    assert!(held > 0.10, "throttled to {held}: frozen solid?");
    let text = std::fs::read_to_string(&c.log).unwrap_or_default();
    assert!(!text.contains("EXIT"), "the burner ended:\n{text}");
    // The exporter shows the duty cycle and the event.
    let run = run.unwrap_or_else(|| panic!("no gpuslice_enforcer_run_ratio for {r}"));
    assert!(run > 0.0 && run < 1.0, "run fraction {run}");
    assert!(
        value(
            &s,
            "gpuslice_enforcer_events_total",
            &[("kind", "compute_throttle")]
        )
        .unwrap_or(0.0)
            >= 1.0
    );
    let table = String::from_utf8_lossy(&node.gpuslice(&["status"]).stdout).to_string();
    assert!(
        table.contains("compute_throttle pid"),
        "status table:\n{table}"
    );
    assert!(events(&node, "memory_kill", &r).is_empty(), "never killed");
    thaw(c.pid(&node));
    c.remove(&node);
}

#[test]
fn a_forged_pacing_burn_is_reported_and_lives_in_report_mode() {
    // Measures the share the enforcer holds a slice to: the machine alone.
    let _s = serial();
    let node = TestNode::with(&["16Gi"], "[enforce]\ncompute = \"report\"\n");
    let exporter = Exporter::start(&node);
    let id = "e2e-enf-creport";
    let _c = Containers::new(&node, &[id]);
    let (_b, c, r, fig) = start(&node, id);

    let report = wait(ENGAGE, || {
        events(&node, "compute_report", &r).into_iter().next()
    })
    .unwrap_or_else(|| panic!("never reported\nserve log:\n{}", exporter.log()));
    let reported = report["share"].as_f64().unwrap();
    assert!(reported > BOUND, "{report}");
    assert_eq!(report["share_limit"].as_f64(), Some(0.30), "{report}");
    // Not throttled: over the next 10 s it burns on far above its share.
    let (burned, seconds) = fig.measure(WINDOW);
    eprintln!(
        "report: reported at {:.1} %, then {:.1} % over {WINDOW:?}; per second: {}; load {}",
        reported * 100.0,
        burned * 100.0,
        seconds
            .iter()
            .map(|u| format!("{:.0}", u * 100.0))
            .collect::<Vec<_>>()
            .join(" "),
        load().trim()
    );
    assert!(
        burned > BOUND,
        "report mode must not hold the slice: {burned} over {WINDOW:?}"
    );
    let text = std::fs::read_to_string(&c.log).unwrap_or_default();
    assert!(!text.contains("EXIT"), "the burner ended:\n{text}");
    assert!(events(&node, "compute_throttle", &r).is_empty());
    let s = exporter.scrape();
    assert_eq!(
        value(
            &s,
            "gpuslice_enforcer_run_ratio",
            &[("reservation", r.as_str())]
        ),
        None,
        "no duty cycle in report mode"
    );
    assert!(
        value(
            &s,
            "gpuslice_enforcer_events_total",
            &[("kind", "compute_report")]
        )
        .unwrap_or(0.0)
            >= 1.0
    );
    let table = String::from_utf8_lossy(&node.gpuslice(&["status"]).stdout).to_string();
    assert!(
        table.contains("compute_report pid"),
        "status table:\n{table}"
    );
    c.remove(&node);
}
