//! End to end with real runc and the real
//! `gpuslice-runtime`: whole GPUs booked per container instance (not per id), a spec runc
//! rejects gives its slice back at once (so does one whose edited config.json cannot be
//! written back), a spec carrying another container's reservation
//! cannot take or release it, a container without its own pid namespace keeps its
//! slice while its processes outlive init, and a cgroup that already held a host process is
//! never recorded as a container's.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use gpuslice_e2e::runc::{run_detached, runtime, Bundle, RUNC_ROOT};
use gpuslice_e2e::{lock, Resource, TestNode};
use serde_json::{json, Value};

/// A second runc state root: container ids are unique per root, not per node.
const OTHER_ROOT: &str = "/run/gpuslice-e2e-runc-other";

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Plain runc (as a CDI-aware engine or podman's conmon runs it) with state root `root`.
fn runc(root: &str) -> Command {
    let mut c = Command::new("runc");
    c.arg("--root").arg(root);
    c
}

/// `runc run -d` of `bundle` as `id` under `root`, output to a file in the bundle.
fn runc_detached(root: &str, bundle: &Bundle, id: &str) -> Result<(), String> {
    let log = bundle
        .path()
        .join(format!("runc-{}.log", root.replace('/', "_")));
    let f = std::fs::File::create(&log).unwrap();
    let status = runc(root)
        .args(["run", "-d", "-b"])
        .arg(bundle.path())
        .arg(id)
        .stdin(Stdio::null())
        .stdout(f.try_clone().unwrap())
        .stderr(f)
        .status()
        .unwrap();
    if status.success() {
        Ok(())
    } else {
        Err(std::fs::read_to_string(&log).unwrap_or_default())
    }
}

/// Deletes container `.1` under root `.0` when the test ends, passed or not (a container
/// without a pid namespace leaves processes behind otherwise).
struct Removed(&'static str, &'static str);

impl Drop for Removed {
    fn drop(&mut self) {
        remove(self.0, self.1);
    }
}

fn remove(root: &str, id: &str) {
    let _ = runc(root).args(["kill", id, "KILL"]).output();
    let _ = runc(root).args(["delete", "--force", id]).output();
}

/// The OCI hooks a CDI-aware engine adds for device `name` of the node CDI spec
/// (`gpuslice.io/gpu=<name>`).
fn node_device_hooks(node: &TestNode, name: &str) -> Value {
    let path = node.cdi_dir.join("gpuslice.io-gpu.json");
    let spec: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let dev = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == name)
        .unwrap_or_else(|| panic!("no device {name} in {}", path.display()));
    let mut hooks = serde_json::Map::new();
    for h in dev["containerEdits"]["hooks"].as_array().unwrap() {
        let mut entry = h.clone();
        let stage = entry.as_object_mut().unwrap().remove("hookName").unwrap();
        hooks
            .entry(stage.as_str().unwrap().to_string())
            .or_insert_with(|| json!([]))
            .as_array_mut()
            .unwrap()
            .push(entry);
    }
    Value::Object(hooks)
}

/// A bundle with no gpuslice request whose spec carries `hooks` and its own cgroup.
fn bundle_with_hooks(script: &str, hooks: &Value, cgroup: &str) -> Bundle {
    let b = Bundle::new(script, &[]);
    let mut c = b.config();
    c["hooks"] = hooks.clone();
    c["linux"]["cgroupsPath"] = json!(cgroup);
    b.set_config(&c);
    b
}

fn whole_bookings(node: &TestNode) -> Vec<Value> {
    node.reservations()
}

/// Defect 1: two runtime roots, one container id, whole GPUs from the node CDI spec.
#[test]
fn whole_gpus_belong_to_a_container_instance_not_to_its_id() {
    let _s = lock(&[Resource::Cdi]);
    let node = TestNode::new(&["10Gi", "10Gi"]);
    let id = "e2e-same-id";
    remove(RUNC_ROOT, id);
    remove(OTHER_ROOT, id);
    let gpu0 = node_device_hooks(&node, "0");
    let gpu1 = node_device_hooks(&node, "1");
    let script = "echo READY; sleep 600";
    let a = bundle_with_hooks(script, &gpu0, "/gpuslice-e2e-same-id-a");
    runc_detached(RUNC_ROOT, &a, id).expect("a takes GPU 0");
    let held = whole_bookings(&node);
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(held[0]["container_id"], id);
    assert_eq!(held[0]["gpus"][0]["uuid"], node.uuid(0));

    // The same id under another root asks for GPU 0 too: it is a's, whole.
    let b = bundle_with_hooks(script, &gpu0, "/gpuslice-e2e-same-id-b");
    let refused = runc_detached(OTHER_ROOT, &b, id);
    remove(OTHER_ROOT, id);
    let err = refused.expect_err("a second container took GPU 0 whole while a holds it");
    assert!(err.contains("gpuslice") || err.contains("hook"), "{err}");
    let held = whole_bookings(&node);
    assert_eq!(
        held.len(),
        1,
        "b's failed create changed a's booking: {held:?}"
    );
    assert_eq!(held[0]["gpus"][0]["uuid"], node.uuid(0));

    // It takes GPU 1; its poststop then releases GPU 1 only.
    let b1 = bundle_with_hooks(script, &gpu1, "/gpuslice-e2e-same-id-b");
    runc_detached(OTHER_ROOT, &b1, id).expect("b takes GPU 1");
    assert_eq!(whole_bookings(&node).len(), 2);
    let del = runc(OTHER_ROOT)
        .args(["delete", "--force", id])
        .output()
        .unwrap();
    assert!(del.status.success(), "{}", text(&del));
    let held = whole_bookings(&node);
    assert_eq!(
        held.len(),
        1,
        "b's poststop released a's GPU as well (same container id): {held:?}"
    );
    assert_eq!(held[0]["gpus"][0]["uuid"], node.uuid(0));
    let del = runc(RUNC_ROOT)
        .args(["delete", "--force", id])
        .output()
        .unwrap();
    assert!(del.status.success(), "{}", text(&del));
    assert!(whole_bookings(&node).is_empty());
}

/// Defect 8: runc rejects the edited spec before any hook runs; the wrapper exits with
/// runc's status and output, and the slice is gone at once (no pending timeout).
#[test]
fn a_spec_runc_rejects_leaves_no_pending_slice() {
    let _s = lock(&[Resource::Cdi]);
    let node = TestNode::new(&["10Gi"]);
    let bundle = Bundle::new("true", &[("gpuslice.io/memory", "4Gi")]);
    let mut c = bundle.config();
    c["process"]["cwd"] = json!("relative/dir");
    bundle.set_config(&c);
    let id = "e2e-rejected";
    let wrapped = runtime(&node)
        .args(["run", "-b"])
        .arg(bundle.path())
        .arg(id)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let _ = runtime(&node).args(["delete", "--force", id]).output();
    assert!(!wrapped.status.success(), "{}", text(&wrapped));
    // runc's own words reach the caller.
    assert!(
        String::from_utf8_lossy(&wrapped.stderr).contains("absolute"),
        "{}",
        text(&wrapped)
    );
    // The wrapper did edit the spec (so it did reserve), and released it.
    assert!(
        bundle.config()["annotations"]["gpuslice.io/reservation"].is_string(),
        "the spec was not edited: {}",
        text(&wrapped)
    );
    assert!(
        node.reservations().is_empty(),
        "slice still pending after runc failed: {:?}",
        node.reservations()
    );
    let registry: Value =
        serde_json::from_slice(&std::fs::read(node.state_dir().join("registry.json")).unwrap())
            .unwrap();
    assert_eq!(registry["reservations"], json!([]), "{registry}");
    assert!(node.leftovers().is_empty(), "{:?}", node.leftovers());
    // The same exit status plain runc gives for this spec.
    let plain = runc(RUNC_ROOT)
        .args(["run", "-b"])
        .arg(bundle.path())
        .arg("e2e-rejected-plain")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let _ = runc(RUNC_ROOT)
        .args(["delete", "--force", "e2e-rejected-plain"])
        .output();
    assert!(!plain.status.success());
    assert_eq!(
        wrapped.status.code(),
        plain.status.code(),
        "{}",
        text(&plain)
    );
}

/// The bundle is read-only (a read-only bind mount over it): the wrapper reserves, cannot
/// write the edited config.json back, says so naming the file, and gives the slice back at
/// once rather than leaving it pending until the timeout.
#[test]
fn a_spec_that_cannot_be_written_back_leaves_no_pending_slice() {
    let _s = lock(&[Resource::Cdi]);
    let node = TestNode::new(&["10Gi"]);
    let bundle = Bundle::new("true", &[("gpuslice.io/memory", "4Gi")]);
    let mount = |args: &[&str]| {
        let out = Command::new("mount")
            .args(args)
            .arg(bundle.path())
            .arg(bundle.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "mount {args:?}: {}", text(&out));
    };
    mount(&["--bind"]);
    /// Unmounts the bundle's read-only bind mount however the test ends.
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(self.0).output();
        }
    }
    let _unmount = Unmount(bundle.path());
    mount(&["-o", "remount,bind,ro"]);
    let wrapped = runtime(&node)
        .args(["create", "-b"])
        .arg(bundle.path())
        .arg("e2e-read-only-bundle")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(wrapped.status.code(), Some(1), "{}", text(&wrapped));
    let stderr = String::from_utf8_lossy(&wrapped.stderr);
    assert!(
        stderr.contains(&bundle.path().join("config.json").display().to_string()),
        "{}",
        text(&wrapped)
    );
    assert!(
        node.reservations().is_empty(),
        "slice still pending after config.json could not be written: {:?}",
        node.reservations()
    );
    assert!(node.leftovers().is_empty(), "{:?}", node.leftovers());
}

/// Defect 8: with the runtime as a child, signals still reach the container and its exit
/// status is the wrapper's.
#[test]
fn the_wrapper_forwards_signals_and_exit_status_of_a_foreground_run() {
    let _s = lock(&[Resource::Cdi]);
    let node = TestNode::new(&["10Gi"]);
    let bundle = Bundle::new(
        "trap 'echo got-term; exit 7' TERM; echo READY; while :; do sleep 0.1; done",
        &[("gpuslice.io/memory", "1Gi")],
    );
    let out_path = bundle.path().join("fg.log");
    let out = std::fs::File::create(&out_path).unwrap();
    let mut child = runtime(&node)
        .args(["run", "-b"])
        .arg(bundle.path())
        .arg("e2e-fg")
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !std::fs::read_to_string(&out_path)
        .unwrap_or_default()
        .contains("READY")
    {
        assert!(start.elapsed() < Duration::from_secs(30), "never READY");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(node.reservations().len(), 1);
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(child.id() as i32).unwrap(),
        rustix::process::Signal::Term,
    )
    .unwrap();
    let status = child.wait().unwrap();
    let _ = runtime(&node)
        .args(["delete", "--force", "e2e-fg"])
        .output();
    let log = std::fs::read_to_string(&out_path).unwrap_or_default();
    assert!(log.contains("got-term"), "{log}");
    assert_eq!(status.code(), Some(7), "{log}");
    assert!(node.reservations().is_empty(), "{:?}", node.reservations());
}

/// The edited spec `gpuslice hook precreate` (podman's path) makes of `bundle`'s.
fn precreate(node: &TestNode, bundle: &Bundle) -> Vec<u8> {
    let mut hook = Command::new(gpuslice_e2e::bin("gpuslice"))
        .args(["--config", &node.config_str(), "hook", "precreate"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let spec = std::fs::read(bundle.config_path()).unwrap();
    std::io::Write::write_all(hook.stdin.as_mut().unwrap(), &spec).unwrap();
    let out = hook.wait_with_output().unwrap();
    assert!(out.status.success());
    out.stdout
}

/// Defect 12: a spec carrying another container's pending reservation in gpuslice's hooks
/// neither binds nor releases it; the container it was reserved for then starts, and a
/// stopped copy carrying its hooks and its annotation does not release it either.
#[test]
fn a_spec_with_another_containers_reservation_cannot_take_it() {
    let _s = lock(&[Resource::Cdi]);
    let node = TestNode::new(&["10Gi"]);
    // A failed run leaves no victim behind for the next one.
    remove(RUNC_ROOT, "e2e-victim");
    let _victim = Removed(RUNC_ROOT, "e2e-victim");
    let victim = Bundle::new("echo READY; sleep 600", &[("gpuslice.io/memory", "8Gi")]);
    let edited = precreate(&node, &victim);
    std::fs::write(victim.config_path(), &edited).unwrap();
    let spec: Value = serde_json::from_slice(&edited).unwrap();
    let rid = spec["annotations"]["gpuslice.io/reservation"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(node.reservations()[0]["state"], "pending");

    // The thief copies gpuslice's hooks (createRuntime binds, poststop releases), not the
    // annotation the wrapper would refuse, and goes through the wrapper.
    let thief = Bundle::new("echo READY; sleep 600", &[]);
    let mut c = thief.config();
    c["hooks"] = spec["hooks"].clone();
    thief.set_config(&c);
    let stolen = run_detached(&node, &thief, "e2e-thief");
    let _ = runtime(&node)
        .args(["delete", "--force", "e2e-thief"])
        .output();
    let err = stolen.expect_err("a copied hook bound another container's slice");
    assert!(
        err.contains(&rid) && err.contains("gpuslice.io/reservation"),
        "{err}"
    );
    let res = node.reservations();
    assert_eq!(res.len(), 1, "the thief's poststop released it: {res:?}");
    assert_eq!(res[0]["id"], rid.as_str());
    assert_eq!(res[0]["state"], "pending", "{res:?}");

    // The container it was made for binds it (podman runs runc after precreate).
    runc_detached(RUNC_ROOT, &victim, "e2e-victim").expect("the victim's create fails");
    let res = node.reservations();
    assert_eq!(res[0]["state"], "bound", "{res:?}");
    assert_eq!(res[0]["container_id"], "e2e-victim");
    // A stopped copy cannot release the bound slice either, even with the annotation the
    // spec edit writes (plain runc, as a CDI-aware engine runs it, applies no edit that
    // would refuse it).
    let copy = Bundle::new("true", &[]);
    let mut c = copy.config();
    c["hooks"] = json!({"poststop": spec["hooks"]["poststop"].clone()});
    c["annotations"] = json!({"gpuslice.io/reservation": rid});
    copy.set_config(&c);
    let out = runc(RUNC_ROOT)
        .args(["run", "-b"])
        .arg(copy.path())
        .arg("e2e-copy")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let _ = runc(RUNC_ROOT)
        .args(["delete", "--force", "e2e-copy"])
        .output();
    assert!(out.status.success(), "{}", text(&out));
    let res = node.reservations();
    assert_eq!(res.len(), 1, "a copied poststop released it: {res:?}");
    assert_eq!(res[0]["id"], rid.as_str());
    assert_eq!(res[0]["container_id"], "e2e-victim", "{res:?}");
    remove(RUNC_ROOT, "e2e-victim");
    assert!(node.reservations().is_empty(), "{:?}", node.reservations());
}

fn pids_in(cgroup_dir: &Path) -> Vec<i32> {
    let mut pids = Vec::new();
    let procs = cgroup_dir.join("cgroup.procs");
    if let Ok(t) = std::fs::read_to_string(procs) {
        pids.extend(t.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
    }
    if let Ok(rd) = std::fs::read_dir(cgroup_dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                pids.extend(pids_in(&e.path()));
            }
        }
    }
    pids
}

/// Defect 13: a container without its own pid namespace whose init exits leaving a child:
/// the slice stays while the child runs, and goes once no process of it is left.
#[test]
fn a_slice_outlives_init_while_the_containers_processes_run() {
    let _s = lock(&[Resource::Cdi]);
    let node = TestNode::new(&["10Gi"]);
    let bundle = Bundle::new("sleep 100 & echo READY", &[("gpuslice.io/memory", "8Gi")]);
    let mut c = bundle.config();
    c["linux"]["namespaces"]
        .as_array_mut()
        .unwrap()
        .retain(|n| n["type"] != "pid");
    bundle.set_config(&c);
    let id = "e2e-no-pidns";
    remove(RUNC_ROOT, id);
    let _removed = Removed(RUNC_ROOT, id);
    let ctr = run_detached(&node, &bundle, id).expect("starts");
    ctr.wait_for("READY");
    // init (sh) exits at once; `sleep` stays in the container's cgroup.
    let start = Instant::now();
    loop {
        let st = runtime(&node).args(["state", id]).output().unwrap();
        let v: Value = serde_json::from_slice(&st.stdout).unwrap_or(Value::Null);
        if v["status"] == "stopped" {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "init never exited: {v}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let gc = node.gpuslice(&["gc"]);
    assert!(gc.status.success(), "{}", text(&gc));
    let res = node.reservations();
    assert_eq!(
        res.len(),
        1,
        "reaped while the container's processes still hold it: {}",
        String::from_utf8_lossy(&gc.stdout)
    );
    // Its memory is not given to the next container.
    let next = Bundle::new("true", &[("gpuslice.io/memory", "4Gi")]);
    let out = gpuslice_e2e::runc::run(&node, &next, "e2e-next");
    let _ = runtime(&node)
        .args(["delete", "--force", "e2e-next"])
        .output();
    assert!(
        !out.status.success(),
        "given memory still held: {}",
        text(&out)
    );
    // Refused by placement for want of memory (8Gi of 10Gi still held), not failed for
    // another reason.
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err
        .lines()
        .find(|l| l.contains("free per GPU"))
        .unwrap_or_default();
    assert!(
        line.contains("no GPU fits 4Gi memory") && line.contains(") 2Gi, "),
        "no refusal showing the free memory per GPU: {}",
        text(&out)
    );
    let res = node.reservations();
    assert_eq!(res.len(), 1, "{res:?}");
    assert!(
        res.iter().all(|r| r["container_id"] != "e2e-next"),
        "the refused container holds a reservation: {res:?}"
    );

    let registry: Value =
        serde_json::from_slice(&std::fs::read(node.state_dir().join("registry.json")).unwrap())
            .unwrap();
    let cgroup = registry["reservations"][0]["owner"]["process"]["cgroup"]
        .as_str()
        .unwrap_or_else(|| panic!("no cgroup recorded: {registry}"))
        .to_string();
    let dir = Path::new("/sys/fs/cgroup").join(&cgroup);
    let left = pids_in(&dir);
    assert!(!left.is_empty(), "no process left in {}", dir.display());

    // The last process goes: the owner is gone and the next operation reaps it.
    for pid in left {
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(pid).unwrap(),
            rustix::process::Signal::Kill,
        );
    }
    let start = Instant::now();
    while !pids_in(&dir).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "child did not die"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let gc = node.gpuslice(&["gc"]);
    assert!(gc.status.success(), "{}", text(&gc));
    assert!(
        String::from_utf8_lossy(&gc.stdout).contains("exited"),
        "{}",
        String::from_utf8_lossy(&gc.stdout)
    );
    assert!(node.reservations().is_empty(), "{:?}", node.reservations());
    let _ = runtime(&node).args(["delete", "--force", id]).output();
}

/// A process of the host kept in a cgroup for as long as the test runs, then the cgroup
/// removed.
struct HostInCgroup {
    child: std::process::Child,
    dirs: Vec<std::path::PathBuf>,
}

impl Drop for HostInCgroup {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for d in &self.dirs {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// A container that runc puts into a cgroup already holding a host process (an existing
/// `cgroupsPath`) does not get that cgroup recorded: the cgroup is not the container's, so
/// neither attribution, escalation (which kills every process of a recorded cgroup) nor the
/// reaper's "processes left" may follow it. The host process survives the container.
#[test]
fn a_cgroup_that_already_held_a_host_process_is_not_recorded_as_the_containers() {
    let _s = lock(&[Resource::Cdi]);
    let node = TestNode::new(&["10Gi"]);
    let name = "gpuslice-e2e-shared-cgroup";
    // The host process sits in `name` in every hierarchy (v2, or each v1 controller and a
    // hybrid host's `unified` tree), whichever the registry follows.
    let root = Path::new("/sys/fs/cgroup");
    let hierarchies: Vec<std::path::PathBuf> = if root.join("cgroup.controllers").exists() {
        vec![root.to_path_buf()]
    } else {
        std::fs::read_dir(root)
            .unwrap()
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .collect()
    };
    let host = Command::new("sleep").arg("300").spawn().unwrap();
    let host_pid = host.id();
    let mut guard = HostInCgroup {
        child: host,
        dirs: Vec::new(),
    };
    for h in &hierarchies {
        let d = h.join(name);
        std::fs::create_dir_all(&d).unwrap();
        guard.dirs.push(d.clone());
        // A v1 cpuset takes no process before it has CPUs and memory nodes.
        for f in ["cpuset.cpus", "cpuset.mems"] {
            if let Ok(v) = std::fs::read_to_string(h.join(f)) {
                std::fs::write(d.join(f), v.trim()).unwrap();
            }
        }
        std::fs::write(d.join("cgroup.procs"), host_pid.to_string())
            .unwrap_or_else(|e| panic!("moving {host_pid} into {}: {e}", d.display()));
    }
    let shared = hierarchies[0].join(name);

    let bundle = Bundle::new("echo READY; sleep 100", &[("gpuslice.io/memory", "4Gi")]);
    let mut c = bundle.config();
    c["linux"]["cgroupsPath"] = json!(format!("/{name}"));
    bundle.set_config(&c);
    let id = "e2e-shared-cgroup";
    remove(RUNC_ROOT, id);
    let _removed = Removed(RUNC_ROOT, id);
    let ctr = run_detached(&node, &bundle, id).expect("starts");
    ctr.wait_for("READY");
    let in_cgroup = pids_in(&shared);
    assert!(
        in_cgroup.len() >= 2 && in_cgroup.contains(&(host_pid as i32)),
        "the container did not join the populated cgroup {}: {in_cgroup:?}",
        shared.display()
    );

    let registry: Value =
        serde_json::from_slice(&std::fs::read(node.state_dir().join("registry.json")).unwrap())
            .unwrap();
    let process = &registry["reservations"][0]["owner"]["process"];
    assert!(process["pid"].is_u64(), "not bound: {registry}");
    assert!(
        process.get("cgroup").is_none(),
        "a cgroup shared with a host process was recorded as the container's: {registry}"
    );

    remove(RUNC_ROOT, id);
    assert!(
        guard.child.try_wait().unwrap().is_none(),
        "the host process in the shared cgroup died with the container"
    );
    assert!(node.reservations().is_empty(), "{:?}", node.reservations());
}
