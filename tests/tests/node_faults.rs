//! Upgrades and faults on a real node (`scripts/kube-cluster.sh up DIR --node NAME`: kubelet,
//! containerd 2.x, runc, `gpuslice kubelet-plugin`, and `gpuslice serve` started by the test),
//! one cluster for every case, each case ending with the registry (`status --json`), the slice
//! files and the ResourceClaims checked against the pods that run:
//! 0. the node starts on the previous release's binaries (scripts/previous-build.sh, built from
//!    a pinned commit and cached by it); a pod's claim is booked by that plugin; the plugin is
//!    rolled to this build, as a Helm upgrade of its DaemonSet does: the pod keeps its slice,
//!    this build reads the registry and slice files the previous one wrote, and later
//!    unprepares that claim;
//! 1. the plugin SIGKILLed in a prepare before the booking, then in one after the booking and
//!    before the claim's files (it stops at those points only when the test-only
//!    `GPUSLICE_TEST_PAUSE_AT` names them): the restarted plugin, called again by the kubelet,
//!    books each claim exactly once and the pods run with their limits;
//! 2. the agent (`gpuslice serve`) SIGKILLed while a slice is over its limit within the
//!    enforcer's grace: the restarted agent kills the holder, once, and the booking stays;
//! 3. containerd restarted, then the kubelet SIGKILLed and started again: the containers run
//!    on, nothing is booked twice or released, the restarted kubelet reaches the plugin to
//!    unprepare the previous release's claim, and a new claim is allocated and prepared beside
//!    them (a starting kubelet deletes its node's ResourceSlices, at times after it registered
//!    the plugin again: here the test deletes them then; the plugin publishes them again);
//! 4. a node "reboot": every container and node daemon killed, the tmpfs state (gpuslice's
//!    state_dir, the CDI specs, containerd's and runc's state) wiped, the node CDI spec
//!    written again as the boot unit does, the daemons started: the kubelet prepares the claims
//!    again, the pods run with the same slices, each booked once, and deleting the pods
//!    releases every booking and file.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use gpuslice_e2e::cri::image_archive;
use gpuslice_e2e::env::previous_release_bins;
use gpuslice_e2e::kube::{kube_bin, KubeCluster};
use gpuslice_e2e::kube_node::{
    claim_reservations, claim_template, pod, wait_for_or, KubeNode, APP_IMAGE, NS, STEP,
};
use gpuslice_e2e::node::artifacts_dir;
use gpuslice_e2e::serve::{value, Exporter};
use gpuslice_e2e::{bin, lock, Resource, TestNode};
use gpuslice_kube::booking::{PAUSE_AFTER_BOOKING, PAUSE_BEFORE_BOOKING, PAUSE_ENV};
use rustix::process::{kill_process, Pid, Signal};
use serde_json::{json, Value};

const GIB: u64 = 1 << 30;
const NODE: &str = "fault-node";
const PLUGIN: &str = "gpuslice-kubelet-plugin";
const TEMPLATE: &str = "slice-6g-20";

/// What a claimed container prints (its limits file), then it waits.
const SCRIPT: &str = "echo limits=$(cat /run/gpuslice/limits.json); echo READY; exec sleep 3600";

/// A node component's command line and environment, read from /proc before it is stopped.
struct Proc {
    argv: Vec<String>,
    env: Vec<(String, String)>,
}

fn pid_file(kn: &KubeNode, component: &str) -> PathBuf {
    kn.cluster
        .dir()
        .join("pids")
        .join(format!("{component}.pid"))
}

fn nul_split(bytes: &[u8]) -> Vec<String> {
    bytes
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// Whether `pid` is gone (or a zombie of the script's subshell).
fn gone(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
    stat.is_none_or(|s| s.rsplit(") ").next().is_some_and(|r| r.starts_with('Z')))
}

/// Sends `signal` to node component `component` and waits until it is gone; returns how it
/// was started.
fn stop(kn: &KubeNode, component: &str, signal: Signal) -> Proc {
    let pid = kn.pid(component);
    let argv = nul_split(
        &std::fs::read(format!("/proc/{pid}/cmdline"))
            .unwrap_or_else(|e| panic!("{component} (pid {pid}) is not running: {e}")),
    );
    let env = nul_split(&std::fs::read(format!("/proc/{pid}/environ")).unwrap())
        .into_iter()
        .filter_map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect();
    kill_process(Pid::from_raw(pid as i32).unwrap(), signal)
        .unwrap_or_else(|e| panic!("{signal:?} to {component} (pid {pid}): {e}"));
    wait_for_or(Duration::from_secs(60), || gone(pid).then_some(()))
        .unwrap_or_else(|| panic!("{component} (pid {pid}) did not stop on {signal:?}"));
    Proc { argv, env }
}

/// Starts `component` again as `p` says, with `set` added to (value) or removed from (`None`)
/// its environment, its output appended to its log, its pid where `down` finds it.
fn start(kn: &KubeNode, component: &str, p: &Proc, set: Option<(&str, Option<&str>)>) {
    let log = kn
        .cluster
        .dir()
        .join("logs")
        .join(format!("{component}.log"));
    let out = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    let mut env: BTreeMap<String, String> = p.env.iter().cloned().collect();
    if let Some((k, v)) = set {
        match v {
            Some(v) => env.insert(k.to_string(), v.to_string()),
            None => env.remove(k),
        };
    }
    // Not waited for: `down` stops it by the pid recorded below, as it does what `up` started.
    #[allow(clippy::zombie_processes)]
    let child = Command::new("setsid")
        .args(&p.argv)
        .env_clear()
        .envs(env)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap_or_else(|e| panic!("start {component} ({:?}): {e}", p.argv));
    std::fs::write(pid_file(kn, component), format!("{}\n", child.id())).unwrap();
}

fn plugin_log(kn: &KubeNode) -> String {
    std::fs::read_to_string(kn.cluster.dir().join("logs").join(format!("{PLUGIN}.log")))
        .unwrap_or_default()
}

/// Waits until the plugin's log holds `text` more than `before` times.
fn wait_plugin_says(kn: &KubeNode, text: &str, before: usize) {
    wait_for_or(STEP, || {
        (plugin_log(kn).matches(text).count() > before).then_some(())
    })
    .unwrap_or_else(|| panic!("the plugin did not log {text:?}\n{}", kn.logs()));
}

/// Stops the plugin with `signal` and starts it again (with `pause` as its pause point, or
/// none); waits until the kubelet has registered the new one.
fn restart_plugin(kn: &KubeNode, signal: Signal, pause: Option<&str>) {
    let registered = plugin_log(kn)
        .matches("registered with the kubelet")
        .count();
    let p = stop(kn, PLUGIN, signal);
    start(kn, PLUGIN, &p, Some((PAUSE_ENV, pause)));
    wait_plugin_says(kn, "registered with the kubelet", registered);
}

/// The ResourceClaim of pod `name`.
fn claim_of_pod(kn: &KubeNode, name: &str) -> Value {
    let p = kn.pod(name).unwrap_or_else(|| panic!("no pod {name}"));
    let claim = wait_for_or(STEP, || {
        let p = kn.pod(name)?;
        p["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
            .as_str()
            .map(str::to_string)
    })
    .unwrap_or_else(|| panic!("pod {name} has no generated claim: {}", p["status"]));
    kn.cluster.get_json(&["resourceclaim", &claim, "-n", NS])
}

fn uid(claim: &Value) -> String {
    claim["metadata"]["uid"].as_str().unwrap().to_string()
}

/// The claim's CDI spec on the node.
fn claim_spec(node: &TestNode, claim_uid: &str) -> PathBuf {
    node.cdi_dir
        .join(gpuslice_cdi::transient_spec_file_name(gpuslice_kube::CLAIM_KIND, claim_uid).unwrap())
}

/// The registry's reservations of claim `claim_uid`.
fn bookings_of(node: &TestNode, claim_uid: &str) -> Vec<Value> {
    claim_reservations(node)
        .into_iter()
        .filter(|r| r["owner"]["claim_uid"] == claim_uid)
        .collect()
}

/// The slice directories under the node's state_dir.
fn slice_dirs(node: &TestNode) -> BTreeSet<String> {
    std::fs::read_dir(node.state_dir().join("slices"))
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Checks the node against what runs: each pod of `pods` Running with its claim allocated on
/// this node (6 GiB, 20 % of GPU 0) and reserved for it; the registry holds exactly one
/// booking per claim and none other; each booking has its slice directory and limits file,
/// each claim its CDI spec, and nothing else is left; each container reads its booking's
/// limits. Returns the reservation id of each pod.
fn assert_node_matches(kn: &KubeNode, node: &TestNode, pods: &[&str], when: &str) -> Vec<String> {
    let gpu = node.uuid(0);
    let mut ids = Vec::new();
    let mut claims = BTreeSet::new();
    for name in pods {
        let p = kn.wait_running(name);
        let claim = claim_of_pod(kn, name);
        let r = &claim["status"]["allocation"]["devices"]["results"];
        assert_eq!(r.as_array().map(Vec::len), Some(1), "{when}: {claim}");
        assert_eq!(r[0]["pool"], NODE, "{when}: {r}");
        assert_eq!(r[0]["device"], "gpu-0", "{when}: {r}");
        assert_eq!(r[0]["consumedCapacity"]["memory"], "6Gi", "{when}: {r}");
        assert_eq!(r[0]["consumedCapacity"]["cores"], "20", "{when}: {r}");
        assert!(
            claim["status"]["reservedFor"]
                .as_array()
                .is_some_and(|f| f.iter().any(|f| f["uid"] == p["metadata"]["uid"])),
            "{when}: claim not reserved for pod {name}: {}",
            claim["status"]
        );
        let uid = uid(&claim);
        let booked = bookings_of(node, &uid);
        assert_eq!(booked.len(), 1, "{when}: claim of {name} booked {booked:?}");
        let b = &booked[0];
        assert_eq!(
            b["gpus"],
            json!([{"index": 0, "uuid": gpu, "memory": 6 * GIB, "cores": 20}]),
            "{when}: {b}"
        );
        let id = b["id"].as_str().unwrap().to_string();
        let limits = node
            .state_dir()
            .join("slices")
            .join(&id)
            .join("limits.json");
        let want = json!({"version": 1, "reservation": id,
                          "devices": [{"uuid": gpu, "memory_limit": 6 * GIB, "cores": 20}]});
        let on_node: Value = serde_json::from_slice(
            &std::fs::read(&limits).unwrap_or_else(|e| panic!("{when}: {}: {e}", limits.display())),
        )
        .unwrap();
        assert_eq!(on_node, want, "{when}: {}", limits.display());
        let seen: Value =
            serde_json::from_str(kn.exec(name, &["cat", "/run/gpuslice/limits.json"]).trim())
                .unwrap();
        assert_eq!(seen, want, "{when}: the limits pod {name} reads");
        assert!(
            claim_spec(node, &uid).exists(),
            "{when}: no CDI spec of {name}'s claim"
        );
        claims.insert(uid);
        ids.push(id);
    }
    // Nothing else: no booking of another claim, no other booking at all, no other files.
    let all = node.reservations();
    assert_eq!(all.len(), pods.len(), "{when}: bookings {all:?}");
    assert_eq!(
        slice_dirs(node),
        ids.iter().cloned().collect::<BTreeSet<_>>(),
        "{when}: slice directories"
    );
    let specs: BTreeSet<PathBuf> = claims.iter().map(|u| claim_spec(node, u)).collect();
    let stray: Vec<PathBuf> = node
        .leftovers()
        .into_iter()
        .filter(|p| p.starts_with(&node.cdi_dir) && !specs.contains(p))
        .collect();
    assert!(stray.is_empty(), "{when}: stray specs {stray:?}");
    ids
}

/// Waits until the scheduler has placed pod `name`; if it does not, the failure shows what
/// the scheduler saw: the ResourceSlices, the claims, its log and the plugin's.
fn wait_scheduled(kn: &KubeNode, name: &str) {
    let scheduled = wait_for_or(STEP, || {
        let p = kn.pod(name)?;
        p["spec"]["nodeName"].as_str().map(|_| ())
    });
    if scheduled.is_none() {
        let get = |what: &str| {
            let out = kn
                .cluster
                .kubectl_output(&["get", what, "-A", "-o", "yaml"], None);
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        panic!(
            "pod {name} was not scheduled within {STEP:?}: {}\nevents:\n{}\n\
             --- resourceslices:\n{}\n--- resourceclaims:\n{}\n--- kube-scheduler:\n{}\n\
             --- plugin:\n{}\n{}",
            kn.pod(name)
                .map(|p| p["status"].clone())
                .unwrap_or_default(),
            kn.events(name),
            get("resourceslices"),
            get("resourceclaims"),
            kn.log_tail("kube-scheduler", 40),
            kn.log_tail(PLUGIN, 40),
            kn.logs()
        );
    }
}

/// Creates pod `name` with a claim of [`TEMPLATE`].
fn create_pod(kn: &KubeNode, name: &str) {
    kn.cluster
        .create(&pod(name, SCRIPT, Some(TEMPLATE)))
        .unwrap();
}

/// The plugin stopped for good at `point` of the prepare of pod `name`'s claim, SIGKILLed
/// there, and started again without a pause point: the kubelet's retry prepares the claim.
/// Returns what the registry held for the claim at the kill; the claim's CDI spec was not
/// written yet.
fn kill_plugin_in_prepare(kn: &KubeNode, node: &TestNode, name: &str, point: &str) -> Vec<Value> {
    restart_plugin(kn, Signal::Term, Some(point));
    let paused_at = format!("paused at {point}");
    let paused = plugin_log(kn).matches(&paused_at).count();
    create_pod(kn, name);
    wait_plugin_says(kn, &paused_at, paused);
    let claim = claim_of_pod(kn, name);
    let held = bookings_of(node, &uid(&claim));
    assert!(
        !claim_spec(node, &uid(&claim)).exists(),
        "the claim's CDI spec was written before {point}"
    );
    restart_plugin(kn, Signal::Kill, None);
    held
}

/// `kubectl exec` of a GPU memory holder in pod `name` that unloads the shim in namespaces of
/// its own (so only the enforcer stops it), holding `gib` GiB; its output is the child's.
fn start_holder(kn: &KubeNode, name: &str, gib: u32) -> Child {
    let hold = format!(
        "unshare -U -r -p -f -m sh -c 'mount --bind /dev/null /etc/ld.so.preload && \
         gpuslice-probe --json alloc --chunk 1Gi --max {gib}Gi --hold 120'; echo EXIT $?"
    );
    Command::new(kube_bin("kubectl"))
        .arg("--kubeconfig")
        .arg(kn.cluster.kubeconfig())
        .args(["exec", "-n", NS, name, "--", "sh", "-c", &hold])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start kubectl exec")
}

/// The memory_kill events of reservation `id` in the enforcer's record.
fn kills_of(node: &TestNode, id: &str) -> usize {
    node.status()["enforcer"]["events"]
        .as_array()
        .map(|e| {
            e.iter()
                .filter(|e| e["kind"] == "memory_kill" && e["reservation"] == id)
                .count()
        })
        .unwrap_or(0)
}

/// `ctr -n k8s.io ARGS…` against the node's containerd.
fn ctr(kn: &KubeNode, args: &[&str]) -> std::process::Output {
    Command::new(kn.env("CTR"))
        .args([
            "--address",
            kn.env("CONTAINERD_SOCKET"),
            "--namespace",
            "k8s.io",
        ])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run ctr")
}

/// Waits until the node's containerd answers.
fn wait_containerd(kn: &KubeNode) {
    wait_for_or(STEP, || {
        ctr(kn, &["version"]).status.success().then_some(())
    })
    .unwrap_or_else(|| panic!("containerd did not come back\n{}", kn.logs()));
}

/// Every mount under `dir`, deepest first, lazily unmounted.
fn unmount_under(dir: &Path) {
    let prefix = format!("{}/", dir.display());
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mut points: Vec<&str> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(&prefix))
        .collect();
    points.sort_unstable_by(|a, b| b.cmp(a));
    for m in points {
        let _ = Command::new("umount").args(["-l", m]).status();
    }
}

/// Empties directory `dir` (the contents of a tmpfs at a reboot).
fn wipe(dir: &Path) {
    unmount_under(dir);
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.filter_map(|e| e.ok()) {
            let p = e.path();
            let r = if p.is_dir() && !p.is_symlink() {
                std::fs::remove_dir_all(&p)
            } else {
                std::fs::remove_file(&p)
            };
            r.unwrap_or_else(|e| panic!("cannot wipe {}: {e}", p.display()));
        }
    }
}

/// A power cut and a boot: every container's processes killed, the node's daemons SIGKILLed,
/// what lives on tmpfs on a real node wiped (gpuslice's state_dir and the claims' CDI specs in
/// /var/run/cdi; containerd's state and runc's root under /run), the node CDI spec written
/// again (gpuslice-cdi.service), then containerd, the kubelet and the plugin started.
fn reboot(kn: &KubeNode, node: &TestNode) {
    let ctr = |args: &[&str]| ctr(kn, args);
    let tasks = String::from_utf8_lossy(&ctr(&["tasks", "ls", "-q"]).stdout).into_owned();
    for t in tasks.lines().filter(|t| !t.is_empty()) {
        ctr(&["tasks", "kill", "-a", "-s", "KILL", t]);
    }
    let plugin = stop(kn, PLUGIN, Signal::Kill);
    let kubelet = stop(kn, "kubelet", Signal::Kill);
    let containerd = stop(kn, "containerd", Signal::Kill);
    // containerd's shims outlive it; a reboot does not.
    let node_dir = format!("{}/node/", kn.cluster.dir().display());
    for e in std::fs::read_dir("/proc").unwrap().filter_map(|e| e.ok()) {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmd).contains(&node_dir) && pid != std::process::id() as i32 {
            let _ = kill_process(Pid::from_raw(pid).unwrap(), Signal::Kill);
        }
    }
    let root = kn.cluster.dir().join("node");
    wipe(node.state_dir());
    for e in std::fs::read_dir(&node.cdi_dir)
        .unwrap()
        .filter_map(|e| e.ok())
    {
        std::fs::remove_file(e.path()).unwrap();
    }
    wipe(&root.join("containerd").join("state"));
    wipe(&root.join("runc"));
    let out = node.gpuslice(&[
        "cdi",
        "generate",
        "--sim-driver",
        &artifacts_dir().display().to_string(),
    ]);
    assert!(
        out.status.success(),
        "cdi generate: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let registered = plugin_log(kn)
        .matches("registered with the kubelet")
        .count();
    start(kn, "containerd", &containerd, None);
    wait_containerd(kn);
    start(kn, "kubelet", &kubelet, None);
    start(kn, PLUGIN, &plugin, None);
    wait_plugin_says(kn, "registered with the kubelet", registered);
    kn.wait_ready();
}

/// A container's id and restart count.
fn container(kn: &KubeNode, name: &str) -> (Value, Value) {
    let p = kn.wait_running(name);
    let c = &p["status"]["containerStatuses"][0];
    (c["containerID"].clone(), c["restartCount"].clone())
}

#[test]
fn upgrade_plugin_agent_kubelet_containerd_kills_and_a_reboot_lose_and_double_book_nothing() {
    let _s = lock(&[Resource::KubeNode]);
    let node = TestNode::with_models_exact(&[("NVIDIA L4", "24Gi")]);
    // A grace long enough to kill the agent inside it.
    let mut config = std::fs::read_to_string(&node.config).unwrap();
    config.push_str("[enforce]\ngrace = \"8s\"\n");
    std::fs::write(&node.config, config).unwrap();

    // 0. The node runs the previous release's plugin; a pod's claim is booked by it.
    let previous = previous_release_bins();
    let cluster = KubeCluster::up_with_node_and(NODE, &node.config, &previous, &[]);
    let kn = KubeNode {
        env: cluster.endpoints(),
        cluster,
        name: NODE.to_string(),
    };
    let images = kn.cluster.dir().join("test-images");
    std::fs::create_dir_all(&images).unwrap();
    kn.ctr_import(&image_archive(&images, APP_IMAGE, &["sh"]));
    kn.cluster
        .create(&claim_template(TEMPLATE, "6Gi", "20"))
        .unwrap();
    create_pod(&kn, "old");
    kn.wait_log("old", "READY");
    let old = assert_node_matches(&kn, &node, &["old"], "booked by the previous release");
    let old_container = container(&kn, "old");

    // The upgrade rolls the plugin (the DaemonSet's pod) to this build: the registry and the
    // slice files the previous release wrote are this one's.
    let registered = plugin_log(&kn)
        .matches("registered with the kubelet")
        .count();
    let mut p = stop(&kn, PLUGIN, Signal::Term);
    assert_eq!(
        Path::new(&p.argv[0]),
        previous.join("gpuslice"),
        "{:?}",
        p.argv
    );
    p.argv[0] = bin("gpuslice").display().to_string();
    start(&kn, PLUGIN, &p, None);
    wait_plugin_says(&kn, "registered with the kubelet", registered);
    kn.wait_ready();
    assert_eq!(
        assert_node_matches(&kn, &node, &["old"], "after the upgrade"),
        old
    );
    assert_eq!(container(&kn, "old"), old_container);

    // 1. The plugin killed in prepare, before and after the booking.
    let held = kill_plugin_in_prepare(&kn, &node, "before", PAUSE_BEFORE_BOOKING);
    assert!(held.is_empty(), "booked before the booking point: {held:?}");
    kn.wait_log("before", "READY");
    assert_node_matches(
        &kn,
        &node,
        &["old", "before"],
        "after a SIGKILL before the booking",
    );

    let held = kill_plugin_in_prepare(&kn, &node, "after", PAUSE_AFTER_BOOKING);
    assert_eq!(
        held.len(),
        1,
        "not booked at the point after the booking: {held:?}"
    );
    kn.wait_log("after", "READY");
    let ids = assert_node_matches(
        &kn,
        &node,
        &["old", "before", "after"],
        "after a SIGKILL after the booking",
    );
    assert_eq!(
        ids[2], held[0]["id"],
        "the restarted plugin booked the claim again instead of finding its booking"
    );

    // 2. The agent killed while a slice is over its limit, within grace.
    let exporter = Exporter::start(&node);
    let mut holder = start_holder(&kn, "before", 10);
    let want = [("reservation", ids[1].as_str())];
    wait_for_or(STEP, || {
        let used = value(
            &exporter.scrape(),
            "gpuslice_slice_nvml_memory_used_bytes",
            &want,
        )?;
        (used > (6 * GIB) as f64).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "the agent never saw the slice over its limit\n{}",
            exporter.log()
        )
    });
    drop(exporter); // SIGKILL
    assert!(
        holder.try_wait().unwrap().is_none(),
        "the holder was stopped before the agent was killed: the kill decision was not interrupted"
    );
    assert_eq!(kills_of(&node, &ids[1]), 0);
    let exporter = Exporter::start(&node);
    let status = holder.wait().unwrap();
    let mut out = String::new();
    holder
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(
        out.contains("EXIT 137"),
        "the restarted agent must kill the holder ({status}):\n{out}\n{}",
        exporter.log()
    );
    // The enforcer records a kill after it: the holder may be seen gone first.
    wait_for_or(STEP, || (kills_of(&node, &ids[1]) > 0).then_some(()))
        .unwrap_or_else(|| panic!("the kill was not recorded\n{}", exporter.log()));
    assert_eq!(kills_of(&node, &ids[1]), 1, "{}", exporter.log());
    drop(exporter);
    let pods = ["old", "before", "after"];
    let running: Vec<_> = pods.iter().map(|p| container(&kn, p)).collect();
    assert_eq!(
        assert_node_matches(&kn, &node, &pods, "after the agent's SIGKILL"),
        ids
    );

    // 3. containerd restarted, then the kubelet killed and started again.
    let c = stop(&kn, "containerd", Signal::Term);
    start(&kn, "containerd", &c, None);
    wait_containerd(&kn);
    let k = stop(&kn, "kubelet", Signal::Kill);
    start(&kn, "kubelet", &k, None);
    kn.wait_ready();
    for (name, was) in pods.iter().zip(&running) {
        assert_eq!(
            &container(&kn, name),
            was,
            "pod {name} after the containerd and kubelet restarts"
        );
    }
    // This build unprepares the claim the previous release prepared.
    kn.delete_pod("old");
    wait_for_or(STEP, || (node.reservations().len() == 2).then_some(())).unwrap_or_else(|| {
        panic!(
            "the claim of pod old was not released: {:?}",
            node.reservations()
        )
    });
    assert_node_matches(&kn, &node, &["before", "after"], "after deleting pod old");
    // A new claim is still allocated and prepared beside them. A starting kubelet deletes its
    // node's ResourceSlices, at times only after it has registered the plugin again (whose
    // republication then found them as they were); the test deletes them as the kubelet
    // does, now that the kubelet reached the plugin, so that this order is the one tested:
    // the plugin publishes them again.
    kn.cluster.kubectl(&[
        "delete",
        "resourceslices",
        "--field-selector",
        &format!("spec.nodeName={NODE}"),
    ]);
    create_pod(&kn, "third");
    wait_scheduled(&kn, "third");
    kn.wait_log("third", "READY");
    assert_eq!(
        assert_node_matches(
            &kn,
            &node,
            &["before", "after", "third"],
            "after containerd and kubelet restarts"
        )[..2],
        ids[1..]
    );
    kn.delete_pod("third");
    wait_for_or(STEP, || (node.reservations().len() == 2).then_some(())).unwrap_or_else(|| {
        panic!(
            "the claim of pod third was not released: {:?}",
            node.reservations()
        )
    });
    let running = &running[1..];

    // 4. A reboot.
    reboot(&kn, &node);
    for name in ["before", "after"] {
        wait_for_or(STEP, || {
            let (id, _) = container(&kn, name);
            (running.iter().all(|(was, _)| *was != id)).then_some(())
        })
        .unwrap_or_else(|| {
            panic!(
                "pod {name} did not start again after the reboot\n{}",
                kn.logs()
            )
        });
        kn.wait_log(name, "READY");
    }
    assert_node_matches(&kn, &node, &["before", "after"], "after the reboot");

    // Claims prepared before the reboot are unprepared after it.
    let claims = [claim_of_pod(&kn, "before"), claim_of_pod(&kn, "after")];
    kn.delete_pod("before");
    kn.delete_pod("after");
    wait_for_or(STEP, || node.reservations().is_empty().then_some(()))
        .unwrap_or_else(|| panic!("bookings left: {:?}\n{}", node.reservations(), kn.logs()));
    assert!(node.leftovers().is_empty(), "{:?}", node.leftovers());
    for c in &claims {
        assert!(!claim_spec(&node, &uid(c)).exists());
    }
    let mut kn = kn;
    kn.cluster.down();
}
