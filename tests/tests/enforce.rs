//! End to end on a simulated node with real runc containers (through
//! `gpuslice-runtime`) and a `gpuslice serve` started here: the three escapes of a slice
//! container — the shim unloaded (`unshare -U -r -m`, then `/dev/null` bound over
//! `/etc/ld.so.preload`; also from a pid namespace of its own, `unshare -U -r -p -f -m`,
//! where only the container's cgroup tells whose the holder is), a forged `limits.json`
//! bound over the read-only one, and one's own usage-file slot zeroed with `dd` — each
//! caught by the host-side enforcer from the driver's
//! per-process figures: the process that crossed the limit is killed within grace + 1 s,
//! and `gpuslice status` and the exporter show the kill; with `memory = "report"` the
//! process lives and the report is there. A process on a GPU outside any reservation is
//! reported. Containers get podman's default capabilities (`unshare -r` writes its gid map
//! with CAP_SETGID), as a stock podman container has. Every test here times the enforcer's
//! reaction, so each holds the machine alone (`serial()`).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gpuslice_e2e::runc::{run_detached, Bundle, Containers, Detached};
use gpuslice_e2e::serve::{value, Exporter};
use gpuslice_e2e::{serial, TestNode};
use serde_json::Value;

const GIB: u64 = 1 << 30;
/// The grace the tests' nodes use (the default).
const GRACE: Duration = Duration::from_secs(2);

/// podman's default capability set (containers.conf): what a stock podman container has,
/// unlike `runc spec`'s three. `unshare -r` needs CAP_SETGID to write its gid map.
const PODMAN_CAPS: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_NET_BIND_SERVICE",
    "CAP_SETFCAP",
    "CAP_SETGID",
    "CAP_SETPCAP",
    "CAP_SETUID",
    "CAP_SYS_CHROOT",
];

/// A bundle running `script` with `annotations` and podman's default capabilities.
fn bundle(script: &str, annotations: &[(&str, &str)]) -> Bundle {
    let b = Bundle::new(script, annotations);
    let mut c = b.config();
    let caps = serde_json::json!(PODMAN_CAPS);
    for set in ["bounding", "effective", "permitted"] {
        c["process"]["capabilities"][set] = caps.clone();
    }
    b.set_config(&c);
    b
}

/// Runs `inner` with the shim not loaded: a user and mount namespace of its own, where
/// `/dev/null` is bound over `/etc/ld.so.preload`.
fn unshimmed(inner: &str) -> String {
    format!("unshare -U -r -m sh -c 'mount --bind /dev/null /etc/ld.so.preload && {inner}'")
}

/// Like [`unshimmed`], in a pid namespace of its own as well (`-p -f`: `inner` runs in no
/// namespace a container init was recorded in).
fn unshimmed_in_own_pid_namespace(inner: &str) -> String {
    format!("unshare -U -r -p -f -m sh -c 'mount --bind /dev/null /etc/ld.so.preload && {inner}'")
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn reservation_of(node: &TestNode, cid: &str) -> String {
    node.reservations()
        .iter()
        .find(|r| r["container_id"] == cid)
        .and_then(|r| r["id"].as_str().map(str::to_string))
        .unwrap_or_else(|| panic!("no reservation for {cid}: {:?}", node.reservations()))
}

/// The enforcer's events of `kind` in `status --json`.
fn events(node: &TestNode, kind: &str) -> Vec<Value> {
    node.status()["enforcer"]["events"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e["kind"] == kind)
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
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until the container printed `marker`; the time the test saw it (ms since epoch).
fn seen(c: &Detached, marker: &str) -> (String, u64) {
    let text = c.wait_for(marker);
    (text, now_ms())
}

/// Checks one memory escape: the crossing probe prints its `alloc` line right after the
/// slice went over its limit, and the script `EXIT <rc>` when that probe ends. Returns the
/// kill event.
fn assert_killed(
    node: &TestNode,
    exporter: &Exporter,
    c: &Detached,
    reservation: &str,
    limit: u64,
) -> Value {
    let (_, crossed_ms) = seen(c, "\"cmd\":\"alloc\"");
    let (text, _) = seen(c, "EXIT");
    assert!(
        text.contains("EXIT 137"),
        "the crossing process must die by SIGKILL:\n{text}\nserve log:\n{}",
        exporter.log()
    );
    // The record is written right after the kill: wait for it.
    let kill = wait(Duration::from_secs(3), || {
        events(node, "memory_kill")
            .into_iter()
            .find(|e| e["reservation"] == reservation)
    })
    .unwrap_or_else(|| panic!("no kill in status\nserve log:\n{}", exporter.log()));
    let at = kill["at_ms"].as_u64().unwrap();
    // `crossed_ms` is when the test saw the line, no earlier than the crossing. The bound is
    // loose (a loaded machine delays the scan); it only catches a kill left to a much later
    // scan than the one after the grace.
    assert!(
        at <= crossed_ms + (GRACE + Duration::from_secs(5)).as_millis() as u64,
        "killed {} ms after the crossing was seen; grace is {GRACE:?}",
        at.saturating_sub(crossed_ms)
    );
    eprintln!(
        "reaction: killed {} ms after the crossing was seen (grace {GRACE:?})",
        at as i64 - crossed_ms as i64
    );
    assert_eq!(kill["limit_bytes"].as_u64(), Some(limit), "{kill}");
    assert!(kill["slice_bytes"].as_u64().unwrap() > limit, "{kill}");
    assert!(
        exporter.log().contains("memory_kill pid"),
        "logged: {}",
        exporter.log()
    );
    let s = exporter.scrape();
    assert!(value(&s, "gpuslice_enforcer_kills_total", &[]).unwrap_or(0.0) >= 1.0);
    assert!(
        value(
            &s,
            "gpuslice_enforcer_events_total",
            &[("kind", "memory_kill")]
        )
        .unwrap_or(0.0)
            >= 1.0
    );
    let table = String::from_utf8_lossy(&node.gpuslice(&["status"]).stdout).to_string();
    assert!(table.contains("memory_kill pid"), "status table:\n{table}");
    kill
}

#[test]
fn shim_bypassed_through_a_user_namespace_is_killed_by_the_enforcer() {
    let _s = serial();
    let node = TestNode::new(&["16Gi"]);
    let exporter = Exporter::start(&node);
    let _c = Containers::new(&node, &["e2e-enf-bypass"]);
    // 2 GiB slice; without the shim the driver gives 10 GiB.
    let b = bundle(
        &format!(
            "{}; echo EXIT $?",
            unshimmed("gpuslice-probe --json alloc --chunk 1Gi --max 10Gi --hold 30")
        ),
        &[("gpuslice.io/memory", "2Gi")],
    );
    let c = run_detached(&node, &b, "e2e-enf-bypass").expect("container starts");
    let r = reservation_of(&node, "e2e-enf-bypass");
    let kill = assert_killed(&node, &exporter, &c, &r, 2 * GIB);
    assert!(
        kill["process_bytes"].as_u64().unwrap() >= 10 * GIB,
        "{kill}"
    );
    c.remove(&node);
}

/// The holder in a pid namespace of its own is in its container's cgroup with the
/// container's init: charged to the slice and killed within the same window.
#[test]
fn shim_bypassed_from_a_pid_namespace_of_its_own_is_killed_by_the_enforcer() {
    let _s = serial();
    let node = TestNode::new(&["16Gi"]);
    let exporter = Exporter::start(&node);
    let _c = Containers::new(&node, &["e2e-enf-pidns"]);
    // The namespaces the container's shell and the holder see themselves in.
    let b = bundle(
        &format!(
            "echo INIT-NS $(readlink /proc/self/ns/pid); {}; echo EXIT $?",
            unshimmed_in_own_pid_namespace(
                "echo HOLDER-NS $(readlink /proc/self/ns/pid) && gpuslice-probe --json alloc --chunk 1Gi --max 6Gi --hold 30"
            )
        ),
        &[("gpuslice.io/memory", "2Gi")],
    );
    let c = run_detached(&node, &b, "e2e-enf-pidns").expect("container starts");
    let r = reservation_of(&node, "e2e-enf-pidns");
    let (text, _) = seen(&c, "HOLDER-NS");
    let ns = |prefix: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .map(str::trim)
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        !ns("HOLDER-NS").is_empty() && ns("HOLDER-NS") != ns("INIT-NS"),
        "the holder runs in a pid namespace of its own:\n{text}"
    );
    let kill = assert_killed(&node, &exporter, &c, &r, 2 * GIB);
    assert!(kill["process_bytes"].as_u64().unwrap() > 2 * GIB, "{kill}");
    assert!(
        events(&node, "unowned").is_empty(),
        "the holder was never unowned: {:?}",
        events(&node, "unowned")
    );
    c.remove(&node);
}

#[test]
fn forged_limits_file_is_caught_against_the_registry_limit() {
    let _s = serial();
    let node = TestNode::new(&["16Gi"]);
    let exporter = Exporter::start(&node);
    let _c = Containers::new(&node, &["e2e-enf-forged"]);
    let forge = "sed -E \"s/(\\\"memory_limit\\\": *)[0-9]+/\\110737418240/\" /run/gpuslice/limits.json > /dev/shm/l.json && mount --bind /dev/shm/l.json /run/gpuslice/limits.json && gpuslice-probe --json alloc --chunk 1Gi --max 6Gi --hold 30";
    let b = bundle(
        &format!("{}; echo EXIT $?", unshimmed_keep_shim(forge)),
        &[("gpuslice.io/memory", "2Gi")],
    );
    let c = run_detached(&node, &b, "e2e-enf-forged").expect("container starts");
    let r = reservation_of(&node, "e2e-enf-forged");
    let kill = assert_killed(&node, &exporter, &c, &r, 2 * GIB);
    assert!(
        kill["process_bytes"].as_u64().unwrap() >= 6 * GIB,
        "the shim granted the forged limit: {kill}"
    );
    c.remove(&node);
}

/// Like [`unshimmed`] but the shim stays loaded (only the limits file is forged).
fn unshimmed_keep_shim(inner: &str) -> String {
    format!("unshare -U -r -m sh -c '{inner}'")
}

#[test]
fn zeroed_usage_slot_lets_a_second_process_over_and_it_is_killed() {
    let _s = serial();
    // Exact figures: the killed process holds its 3 GiB and nothing for its context.
    let node = TestNode::exact(&["16Gi"]);
    let exporter = Exporter::start(&node);
    let _c = Containers::new(&node, &["e2e-enf-zeroed"]);
    // A holds 3 GiB of a 4 GiB slice; the usage file's slots are zeroed; B takes 3 GiB more.
    let script = "gpuslice-probe --json alloc --chunk 1Gi --max 3Gi --hold 60 > /dev/shm/a.log 2>&1 & A=$!; \
        until grep -q total /dev/shm/a.log; do sleep 0.1; done; \
        dd if=/dev/zero of=/run/gpuslice/usage bs=4096 seek=1 count=64 conv=notrunc 2>/dev/null; \
        gpuslice-probe --json alloc --chunk 1Gi --max 3Gi --hold 30; echo EXIT $?; \
        sleep 1; kill -0 $A && echo A-ALIVE; sleep 30";
    let b = bundle(script, &[("gpuslice.io/memory", "4Gi")]);
    let c = run_detached(&node, &b, "e2e-enf-zeroed").expect("container starts");
    let r = reservation_of(&node, "e2e-enf-zeroed");
    let (text, _) = seen(&c, "\"cmd\":\"alloc\"");
    assert!(
        text.contains("3221225472"),
        "B got its 3 GiB past the zeroed slot:\n{text}"
    );
    let kill = assert_killed(&node, &exporter, &c, &r, 4 * GIB);
    // The process under its own share (A) lives: only the one that crossed is killed.
    let (text, _) = seen(&c, "A-ALIVE");
    assert!(text.contains("A-ALIVE"));
    assert_eq!(kill["process_bytes"].as_u64(), Some(3 * GIB), "{kill}");
    assert_eq!(events(&node, "memory_kill").len(), 1, "one kill only");
    c.remove(&node);
}

#[test]
fn report_mode_lets_the_process_live_and_reports_it() {
    let _s = serial();
    let node = TestNode::with(&["16Gi"], "[enforce]\nmemory = \"report\"\n");
    let exporter = Exporter::start(&node);
    let _c = Containers::new(&node, &["e2e-enf-report"]);
    let b = bundle(
        &format!(
            "{}; echo EXIT $?",
            unshimmed("gpuslice-probe --json alloc --chunk 1Gi --max 6Gi --hold 5")
        ),
        &[("gpuslice.io/memory", "2Gi")],
    );
    let c = run_detached(&node, &b, "e2e-enf-report").expect("container starts");
    let r = reservation_of(&node, "e2e-enf-report");
    seen(&c, "\"cmd\":\"alloc\"");
    let (text, _) = seen(&c, "EXIT");
    assert!(
        text.contains("EXIT 0"),
        "the process lives out its hold:\n{text}"
    );
    let reports = events(&node, "memory_report");
    assert!(
        reports.iter().any(|e| e["reservation"] == r.as_str()),
        "{reports:?}\n{}",
        exporter.log()
    );
    assert!(events(&node, "memory_kill").is_empty());
    let s = exporter.scrape();
    assert_eq!(value(&s, "gpuslice_enforcer_kills_total", &[]), Some(0.0));
    assert!(
        value(
            &s,
            "gpuslice_enforcer_events_total",
            &[("kind", "memory_report")]
        )
        .unwrap_or(0.0)
            >= 1.0
    );
    c.remove(&node);
}

#[test]
fn a_process_on_a_gpu_outside_any_reservation_is_reported() {
    let _s = serial();
    let node = TestNode::new(&["16Gi", "16Gi"]);
    let exporter = Exporter::start(&node);
    let uuid = node.uuid(1);
    // A host process opens GPU 1 through the simulated driver, with no reservation at all.
    let sim = node.state_dir().join("sim");
    let mut host = Command::new(gpuslice_e2e::node::probe())
        .args(["--lib"])
        .arg(sim.join("usr/lib/x86_64-linux-gnu/libcuda.so.1"))
        .args([
            "--json", "--device", "1", "alloc", "--chunk", "1Gi", "--max", "1Gi", "--hold", "20",
        ])
        .env("GPUSLICE_SIM_STATE", sim.join("state"))
        .env("GPUSLICE_SIM_DEV", sim.join("dev"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("host probe");
    let pid = host.id();
    let found = wait(Duration::from_secs(10), || {
        events(&node, "unowned")
            .into_iter()
            .find(|e| e["pid"] == pid && e["uuid"] == uuid.as_str())
    });
    let s = exporter.scrape();
    let _ = host.kill();
    let _ = host.wait();
    let e = found.unwrap_or_else(|| panic!("no unowned report for pid {pid}\n{}", exporter.log()));
    assert_eq!(e["reservation"], "", "{e}");
    assert_eq!(
        value(
            &s,
            "gpuslice_enforcer_unowned_processes",
            &[("uuid", uuid.as_str())]
        ),
        Some(1.0)
    );
    assert!(events(&node, "memory_kill").is_empty(), "never killed");
}
