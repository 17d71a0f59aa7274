//! `gpuslice configure docker`: daemon.json gains `runtimes.gpuslice` and keeps everything
//! else (order, other runtimes, the default runtime, indentation); golden files, idempotence,
//! `--remove` restores the original byte for byte, a created file is deleted again, malformed
//! JSON is refused untouched.

use crate::common;

use std::path::Path;

use common::{fixture, golden, stage, tree};
use gpuslice_configure::docker::{plan_add, plan_remove, DockerError, Target};
use gpuslice_configure::registration::Registration;
use serde_json::Value;

const RUNTIME: &str = "/usr/bin/gpuslice-runtime";

fn reg() -> Registration {
    Registration {
        runtime: RUNTIME.into(),
        config: None,
    }
}

fn target(dir: &Path) -> Target {
    Target {
        config: dir.join("daemon.json"),
    }
}

fn lifecycle(case: &str) -> Value {
    let d = tempfile::tempdir().unwrap();
    stage(&fixture("docker", case).join("input"), d.path());
    let before = tree(d.path());
    let t = target(d.path());
    plan_add(&t, &reg()).unwrap().apply(false).unwrap();
    golden("docker", case, d.path());
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&t.config).unwrap()).unwrap();
    let again = plan_add(&t, &reg()).unwrap().apply(false).unwrap();
    assert!(again.contains("nothing to change"), "{again}");
    plan_remove(&t).unwrap().apply(false).unwrap();
    assert_eq!(
        tree(d.path()),
        before,
        "{case}: --remove did not restore the tree"
    );
    v
}

#[test]
fn nvidia_setup_keeps_its_default_runtime_and_order() {
    let v = lifecycle("nvidia");
    assert_eq!(v["runtimes"]["gpuslice"]["path"], RUNTIME);
    assert_eq!(v["runtimes"]["nvidia"]["path"], "nvidia-container-runtime");
    assert_eq!(v["default-runtime"], "nvidia");
    let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        ["default-runtime", "runtimes", "log-driver", "log-opts"]
    );
}

#[test]
fn a_compact_file_without_runtimes() {
    let v = lifecycle("compact");
    assert_eq!(v["runtimes"]["gpuslice"]["path"], RUNTIME);
    assert_eq!(v["features"]["cdi"], true);
}

#[test]
fn a_missing_file_is_created_and_deleted_again() {
    let v = lifecycle("missing");
    assert_eq!(v["runtimes"]["gpuslice"]["path"], RUNTIME);
}

#[test]
fn malformed_json_is_refused_untouched() {
    let d = tempfile::tempdir().unwrap();
    let cfg = d.path().join("daemon.json");
    std::fs::copy(fixture("docker", "malformed").join("daemon.json"), &cfg).unwrap();
    let before = std::fs::read(&cfg).unwrap();
    let err = plan_add(&target(d.path()), &reg()).unwrap_err();
    assert!(matches!(err, DockerError::Malformed { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("daemon.json") && msg.contains("line 3") && !msg.contains('\n'),
        "{msg}"
    );
    assert_eq!(std::fs::read(&cfg).unwrap(), before);
    assert_eq!(tree(d.path()).len(), 1);
}

/// A daemon.json that config management keeps elsewhere and links to stays a link: the
/// edit and the restore of `--remove` replace the file it points at.
#[test]
fn a_symlinked_daemon_json_stays_a_symlink() {
    let d = tempfile::tempdir().unwrap();
    let real = d.path().join("managed/daemon.json");
    std::fs::create_dir_all(real.parent().unwrap()).unwrap();
    let original = "{\n  \"data-root\": \"/srv\"\n}\n";
    std::fs::write(&real, original).unwrap();
    let t = target(d.path());
    std::os::unix::fs::symlink("managed/daemon.json", &t.config).unwrap();
    let is_link = |p: &Path| {
        std::fs::symlink_metadata(p)
            .unwrap()
            .file_type()
            .is_symlink()
    };

    let out = plan_add(&t, &reg()).unwrap().apply(false).unwrap();
    assert!(is_link(&t.config), "replaced by a plain file: {out}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&real).unwrap()).unwrap();
    assert_eq!(v["runtimes"]["gpuslice"]["path"], RUNTIME);
    assert_eq!(v["data-root"], "/srv");
    let again = plan_add(&t, &reg()).unwrap().apply(false).unwrap();
    assert!(again.contains("nothing to change"), "{again}");

    plan_remove(&t).unwrap().apply(false).unwrap();
    assert!(is_link(&t.config), "--remove replaced the link");
    assert_eq!(std::fs::read_to_string(&real).unwrap(), original);
    let mut left: Vec<_> = std::fs::read_dir(real.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    left.sort();
    assert_eq!(left, ["daemon.json"], "temp files left beside the target");
}
