//! `gpuslice configure crio`: the handler drop-in on a crun-default CRI-O (golden), settings
//! inherited from the default runtime across drop-ins, idempotence, `--remove` leaves the
//! tree as it was, malformed CRI-O configs and foreign drop-ins refused untouched.

use crate::common;

use std::path::Path;

use common::{dirs, fixture, golden, mode, stage, tree};
use gpuslice_configure::crio::{plan_add, plan_remove, CrioError, Target, HANDLER, RUNTIME_ROOT};
use gpuslice_configure::registration::Registration;

const RUNTIME: &str = "/usr/bin/gpuslice-runtime";

fn reg() -> Registration {
    Registration {
        runtime: RUNTIME.into(),
        config: None,
    }
}

fn target(dir: &Path) -> Target {
    Target {
        config: dir.join("crio.conf"),
    }
}

fn handler(t: &Target) -> toml::Value {
    let v: toml::Table = toml::from_str(&std::fs::read_to_string(t.drop_in()).unwrap()).unwrap();
    v["crio"]["runtime"]["runtimes"][HANDLER].clone()
}

fn lifecycle(case: &str) -> toml::Value {
    let d = tempfile::tempdir().unwrap();
    stage(&fixture("crio", case).join("input"), d.path());
    let before = tree(d.path());
    let before_dirs = dirs(d.path());
    let t = target(d.path());
    plan_add(&t, &reg()).unwrap().apply(false).unwrap();
    golden("crio", case, d.path());
    let h = handler(&t);
    let again = plan_add(&t, &reg()).unwrap().apply(false).unwrap();
    assert!(again.contains("nothing to change"), "{again}");
    plan_remove(&t).unwrap().apply(false).unwrap();
    assert_eq!(
        tree(d.path()),
        before,
        "{case}: --remove did not restore the tree"
    );
    assert_eq!(
        dirs(d.path()),
        before_dirs,
        "{case}: --remove left directories"
    );
    h
}

#[test]
fn crun_default_settings_are_inherited_but_not_its_binary_or_state() {
    let h = lifecycle("crun-default");
    assert_eq!(h["runtime_path"].as_str(), Some(RUNTIME));
    assert_eq!(h["runtime_type"].as_str(), Some("oci"));
    assert_eq!(h["runtime_root"].as_str(), Some(RUNTIME_ROOT));
    assert_eq!(h["monitor_path"].as_str(), Some("/usr/libexec/crio/conmon"));
    // From crio.conf.d/10-crun.conf: drop-ins merge key by key.
    assert_eq!(
        h["monitor_env"][0].as_str(),
        Some("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin")
    );
    // Only CRI-O's own names are accepted there; gpuslice adds none.
    assert_eq!(
        h["allowed_annotations"].as_array().unwrap(),
        &vec![toml::Value::from("io.containers.trace-syscall")]
    );
}

#[test]
fn without_a_main_config_the_handler_stands_alone() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("crio");
    let t = target(&dir);
    plan_add(&t, &reg()).unwrap().apply(false).unwrap();
    let h = handler(&t);
    assert_eq!(h.as_table().unwrap().len(), 3, "{h:?}");
    golden("crio", "missing", &dir);
    plan_remove(&t).unwrap().apply(false).unwrap();
    assert!(!dir.exists(), "the directories gpuslice created are left");
}

#[test]
fn malformed_drop_ins_and_foreign_files_are_refused() {
    let d = tempfile::tempdir().unwrap();
    stage(&fixture("crio", "crun-default").join("input"), d.path());
    let bad = d.path().join("crio.conf.d/20-bad.conf");
    std::fs::copy(fixture("crio", "malformed").join("20-bad.conf"), &bad).unwrap();
    let before = tree(d.path());
    let err = plan_add(&target(d.path()), &reg()).unwrap_err();
    assert!(matches!(err, CrioError::Malformed { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("20-bad.conf") && !msg.contains('\n'), "{msg}");
    assert_eq!(tree(d.path()), before);

    let d = tempfile::tempdir().unwrap();
    let t = target(d.path());
    std::fs::create_dir_all(t.drop_in().parent().unwrap()).unwrap();
    std::fs::write(t.drop_in(), "[crio.runtime]\n").unwrap();
    assert!(matches!(
        plan_add(&t, &reg()),
        Err(CrioError::Foreign { .. })
    ));
    assert!(matches!(plan_remove(&t), Err(CrioError::Foreign { .. })));
}

/// The handler copies the default runtime's settings (its `monitor_env` may carry tokens):
/// the drop-in is readable by no one a file it copies from is not readable by.
#[test]
fn the_drop_in_is_as_private_as_the_files_it_copies() {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    stage(&fixture("crio", "crun-default").join("input"), d.path());
    let t = target(d.path());
    let private = d.path().join("crio.conf.d/10-crun.conf");
    std::fs::set_permissions(&private, PermissionsExt::from_mode(0o600)).unwrap();
    std::fs::set_permissions(&t.config, PermissionsExt::from_mode(0o644)).unwrap();
    plan_add(&t, &reg()).unwrap().apply(false).unwrap();
    assert!(std::fs::read_to_string(t.drop_in())
        .unwrap()
        .contains("monitor_env"));
    assert_eq!(mode(&t.drop_in()), 0o600);
}

/// A `gpuslice` handler the operator defined already is refused, naming the file, and
/// nothing is written; one that is exactly the handler gpuslice writes is accepted.
#[test]
fn a_gpuslice_handler_the_operator_defined_is_refused() {
    let d = tempfile::tempdir().unwrap();
    stage(&fixture("crio", "crun-default").join("input"), d.path());
    let theirs = d.path().join("crio.conf.d/50-theirs.conf");
    std::fs::write(
        &theirs,
        format!("[crio.runtime.runtimes.{HANDLER}]\nruntime_path = \"/usr/bin/runc\"\nprivileged_without_host_devices = true\n"),
    )
    .unwrap();
    let before = tree(d.path());
    let err = plan_add(&target(d.path()), &reg()).unwrap_err();
    assert!(matches!(err, CrioError::Defined { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("50-theirs.conf") && msg.contains("runtimes.gpuslice"),
        "{msg}"
    );
    assert_eq!(tree(d.path()), before, "nothing is written");

    // The same table gpuslice writes, copied by the operator: nothing to refuse.
    std::fs::remove_file(&theirs).unwrap();
    let t = target(d.path());
    plan_add(&t, &reg()).unwrap().apply(false).unwrap();
    let ours = std::fs::read_to_string(t.drop_in()).unwrap();
    std::fs::write(&theirs, ours).unwrap();
    let again = plan_add(&t, &reg()).unwrap().apply(false).unwrap();
    assert!(again.contains("nothing to change"), "{again}");
}
