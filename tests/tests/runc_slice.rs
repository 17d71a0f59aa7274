//! With runc through `gpuslice-runtime`: a sliced container sees exactly its GPU,
//! the shim, its read-only limits and the environment; the registry follows its life;
//! misfits, malformed requests, forged annotations and crashes leak nothing.

use std::time::{Duration, Instant};

use gpuslice_e2e::runc::{run, run_detached, runtime, Bundle};
use gpuslice_e2e::view::{assert_slice_view, SLICE_ANNOTATIONS, SLICE_CHECKS};
use gpuslice_e2e::{lock, Resource, TestNode};

fn slice_ann() -> Vec<(&'static str, &'static str)> {
    vec![("gpuslice.io/memory", "4Gi"), ("gpuslice.io/cores", "30")]
}

#[test]
fn runc_slice_sees_its_gpu_shim_limits_and_env() {
    let _s = lock(&[Resource::Cdi]);
    let node = TestNode::new(&["10Gi", "10Gi"]);
    let bundle = Bundle::new(SLICE_CHECKS, &SLICE_ANNOTATIONS);
    let c = run_detached(&node, &bundle, "e2e-runc-slice").expect("container starts");
    let out = c.wait_for("READY");
    assert_slice_view(&node, &out, "e2e-runc-slice");
    c.remove(&node);
    assert!(
        node.reservations().is_empty(),
        "reservation not released after delete"
    );
    assert!(
        node.leftovers().is_empty(),
        "left behind: {:?}",
        node.leftovers()
    );
}

/// The host's `slices/` is 0700 root, yet a container running as an
/// unprivileged user still writes its usage file and reads its limits through the mounts.
#[test]
fn a_non_root_container_user_reaches_its_usage_and_limits_files() {
    let _s = lock(&[Resource::Cdi]);
    let node = TestNode::new(&["10Gi"]);
    let bundle = Bundle::new(
        "id -u; if (exec 3<>/run/gpuslice/usage) 2>/dev/null; then echo usage-writable; fi; \
         if cat /run/gpuslice/limits.json >/dev/null 2>&1; then echo limits-readable; fi",
        &slice_ann(),
    );
    let mut c = bundle.config();
    c["process"]["user"] = serde_json::json!({"uid": 1000, "gid": 1000});
    bundle.set_config(&c);
    let out = run(&node, &bundle, "e2e-runc-nonroot");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.lines().any(|l| l == "1000"), "{text}");
    assert!(text.contains("usage-writable"), "{text}");
    assert!(text.contains("limits-readable"), "{text}");
    let slices = node.state_dir().join("slices");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&slices).expect("slices").permissions(),
    );
    assert_eq!(mode & 0o777, 0o700, "{slices:?}");
}

#[test]
fn misfit_is_refused_with_free_capacity_and_leaks_nothing() {
    let _s = lock(&[Resource::Cdi]);
    let node = TestNode::new(&["10Gi", "10Gi"]);
    let bundle = Bundle::new("true", &[("gpuslice.io/memory", "12Gi")]);
    let out = run(&node, &bundle, "e2e-misfit");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err
        .lines()
        .find(|l| l.contains("gpuslice"))
        .unwrap_or_default()
        .to_string();
    assert!(
        line.contains("12Gi") && line.contains("free per GPU") && line.contains("10Gi"),
        "{err}"
    );
    assert!(node.reservations().is_empty());
    assert!(node.leftovers().is_empty(), "{:?}", node.leftovers());
}

#[test]
fn malformed_requests_fail_creation_and_reserve_nothing() {
    let _s = lock(&[Resource::Cdi]);
    let node = TestNode::new(&["10Gi", "10Gi"]);
    let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
        (vec![("gpuslice.io/memory", "lots")], "gpuslice.io/memory"),
        (vec![("gpuslice.io/cores", "150")], "gpuslice.io/cores"),
        (vec![("gpuslice.io/cores", "30%%%%")], "gpuslice.io/cores"),
        (vec![("gpuslice.io/gpus", "0")], "gpuslice.io/gpus"),
        (
            vec![(
                "gpuslice.io/gpu",
                "GPU-00000000-0000-0000-0000-000000000000",
            )],
            "GPU-00000000-0000-0000-0000-000000000000",
        ),
        (
            vec![("gpuslice.io/reservation", "0123456789abcdef")],
            "gpuslice.io/reservation",
        ),
        (
            vec![
                ("gpuslice.io/memory", "4Gi"),
                ("gpuslice.io/reservation", "0123456789abcdef"),
            ],
            "gpuslice.io/reservation",
        ),
        (vec![("gpuslice.io/policy", "fastest")], "binpack"),
        (vec![("gpuslice.io/memroy", "4Gi")], "gpuslice.io/memroy"),
    ];
    for (i, (ann, want)) in cases.iter().enumerate() {
        let bundle = Bundle::new("true", ann);
        let before = std::fs::read(bundle.config_path()).unwrap();
        let out = run(&node, &bundle, &format!("e2e-bad-{i}"));
        assert!(!out.status.success(), "{ann:?} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.lines()
                .any(|l| l.starts_with("gpuslice") && l.contains(want)),
            "{ann:?}: {err}"
        );
        assert_eq!(
            std::fs::read(bundle.config_path()).unwrap(),
            before,
            "config.json changed for {ann:?}"
        );
        assert!(node.reservations().is_empty(), "{ann:?} reserved something");
        assert!(
            node.leftovers().is_empty(),
            "{ann:?} left {:?}",
            node.leftovers()
        );
    }
}

#[test]
fn container_without_annotations_is_byte_identical() {
    let _s = lock(&[Resource::Cdi]);
    let node = TestNode::new(&["10Gi"]);
    let bundle = Bundle::new(
        "cat /proc/self/status >/dev/null",
        &[("example.com/other", "x")],
    );
    let before = std::fs::read(bundle.config_path()).unwrap();
    // `create` leaves the container's stdio open in `runc init`: give it files, not pipes.
    let log = bundle.path().join("create.log");
    let f = std::fs::File::create(&log).unwrap();
    let status = runtime(&node)
        .args(["create", "-b"])
        .arg(bundle.path())
        .arg("e2e-plain")
        .stdin(std::process::Stdio::null())
        .stdout(f.try_clone().unwrap())
        .stderr(f)
        .status()
        .unwrap();
    assert!(
        status.success(),
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert_eq!(std::fs::read(bundle.config_path()).unwrap(), before);
    let _ = runtime(&node)
        .args(["delete", "--force", "e2e-plain"])
        .output();
    assert!(node.reservations().is_empty());
}

#[test]
fn killed_container_without_poststop_is_reaped() {
    let _s = lock(&[Resource::Cdi]);
    let node = TestNode::new(&["10Gi"]);
    let bundle = Bundle::new("echo READY; sleep 600", &slice_ann());
    let c = run_detached(&node, &bundle, "e2e-crash").expect("starts");
    c.wait_for("READY");
    assert_eq!(node.reservations().len(), 1);
    // SIGKILL the init from outside; never call delete (so no poststop runs).
    let pid = c.pid(&node);
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid as i32).unwrap(),
        rustix::process::Signal::Kill,
    )
    .unwrap();
    let start = Instant::now();
    while std::path::Path::new(&format!("/proc/{pid}")).exists() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "init did not die"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The next registry operation reaps it.
    let gc = node.gpuslice(&["gc"]);
    assert!(gc.status.success());
    assert!(
        String::from_utf8_lossy(&gc.stdout).contains("exited"),
        "{}",
        String::from_utf8_lossy(&gc.stdout)
    );
    assert!(node.reservations().is_empty());
    assert!(node.leftovers().is_empty(), "{:?}", node.leftovers());
    let _ = runtime(&node)
        .args(["delete", "--force", "e2e-crash"])
        .output();
}

#[test]
fn a_failed_create_after_edit_gives_its_slice_back_at_once() {
    let _s = lock(&[Resource::Cdi]);
    // A pending deadline far beyond the test: only the runtime's give-back can free it.
    let node = TestNode::with(&["10Gi"], "[registry]\npending_timeout = \"600s\"\n");
    // A process that cannot start: runc create fails after gpuslice edited the spec.
    let bundle = Bundle::new("true", &slice_ann());
    let mut c = bundle.config();
    c["process"]["args"] = serde_json::json!(["/does/not/exist"]);
    bundle.set_config(&c);
    let out = run(&node, &bundle, "e2e-failed-create");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("/does/not/exist"),
        "failed for another reason: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Given back by the failed create itself, before any delete or gc.
    assert!(node.reservations().is_empty(), "{:?}", node.reservations());
    let _ = runtime(&node)
        .args(["delete", "--force", "e2e-failed-create"])
        .output();
    let gc = node.gpuslice(&["gc"]);
    assert!(gc.status.success());
    assert!(node.reservations().is_empty(), "{:?}", node.reservations());
    assert!(node.leftovers().is_empty(), "{:?}", node.leftovers());
}

#[test]
fn image_ld_preload_does_not_reach_the_hooks() {
    let _s = lock(&[Resource::Cdi]);
    let node = TestNode::new(&["10Gi"]);
    // A library that makes every process that loads it exit at once.
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("poison.c");
    std::fs::write(
        &src,
        "#include <unistd.h>\n__attribute__((constructor)) static void p(void) { _exit(42); }\n",
    )
    .unwrap();
    let lib = dir.path().join("libpoison.so");
    let cc = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .unwrap();
    assert!(cc.success());
    let bundle = Bundle::new("echo READY; sleep 600", &slice_ann());
    let mut c = bundle.config();
    c["process"]["env"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!(format!("LD_PRELOAD={}", lib.display())));
    bundle.set_config(&c);
    // The hooks run on the host: if they inherited the image's env they would load the
    // poison (its host path exists) and die; the container would then fail to start.
    let started = run_detached(&node, &bundle, "e2e-ldpreload")
        .expect("hooks unaffected by the image's LD_PRELOAD");
    let res = node.reservations();
    assert_eq!(res.len(), 1);
    assert_eq!(res[0]["state"], "bound");
    started.remove(&node);
    assert!(node.reservations().is_empty());
}

#[test]
fn precreate_hook_and_runtime_wrapper_together_reserve_once() {
    let _s = lock(&[Resource::Cdi]);
    let node = TestNode::new(&["10Gi"]);
    let bundle = Bundle::new("echo READY; sleep 600", &slice_ann());
    // The engine's precreate hook edits the spec first…
    let mut hook = std::process::Command::new(gpuslice_e2e::bin("gpuslice"))
        .args(["--config", &node.config_str(), "hook", "precreate"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let spec = std::fs::read(bundle.config_path()).unwrap();
    std::io::Write::write_all(hook.stdin.as_mut().unwrap(), &spec).unwrap();
    let out = hook.wait_with_output().unwrap();
    assert!(out.status.success());
    std::fs::write(bundle.config_path(), &out.stdout).unwrap();
    assert_eq!(node.reservations().len(), 1);
    // …then the runtime wrapper sees gpuslice's own edit and leaves it alone.
    let c = run_detached(&node, &bundle, "e2e-twice").expect("starts");
    c.wait_for("READY");
    let res = node.reservations();
    assert_eq!(res.len(), 1, "reserved twice: {res:?}");
    assert_eq!(res[0]["state"], "bound");
    assert_eq!(res[0]["container_id"], "e2e-twice");
    assert_eq!(
        std::fs::read(bundle.config_path()).unwrap(),
        out.stdout,
        "the wrapper rewrote an edited spec"
    );
    c.remove(&node);
    assert!(node.reservations().is_empty());
}
