//! A reservation id in `registry.json` never becomes a path
//! outside `slices/`; a state directory that others could tamper with is refused; host users
//! cannot reach a slice's files; `gc --rebuild` of a sound registry keeps live reservations
//! that lost their record.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::{inventory, state_dir, GI};
use gpuslice_config::Quantity;
use gpuslice_registry::{
    check_state_dir, read_registry, FakeSystem, Owner, Registry, RegistryError, Request,
};

fn slice() -> Request {
    Request {
        memory: Some(Quantity::Bytes(GI)),
        ..Request::new(Owner::container())
    }
}

fn open(dir: &Path, sys: Arc<FakeSystem>) -> Result<Registry, RegistryError> {
    Registry::open(
        dir,
        common::options(Duration::from_secs(60)),
        sys,
        gpuslice_registry::no_cleanup(),
    )
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

#[test]
fn an_id_that_is_a_path_is_refused_and_nothing_outside_slices_is_removed() {
    let tmp = state_dir();
    let state = tmp.path().join("a/b/state");
    std::fs::create_dir_all(&state).expect("mkdir");
    // `slices/../../../x` from `a/b/state` is `a/x`.
    let victim = tmp.path().join("a/x");
    std::fs::create_dir_all(&victim).expect("mkdir");
    std::fs::write(victim.join("keep"), b"precious").expect("write");
    let sys = Arc::new(FakeSystem::new(5_000_000));
    let reg = open(&state, sys.clone()).expect("open");
    reg.set_inventory(inventory(1, 20 * GI)).expect("inventory");
    reg.reserve(&slice()).expect("reserve");
    let path = reg.registry_path().to_path_buf();
    let mut v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("json");
    v["reservations"][0]["id"] = "../../../x".into();
    v["reservations"][0]["deadline_ms"] = 1.into();
    let text = serde_json::to_vec(&v).expect("json");
    std::fs::write(&path, &text).expect("write");
    sys.advance_ms(120_000);

    let e = reg
        .gc()
        .expect_err("gc of a registry naming a path as an id");
    let msg = e.to_string();
    assert!(matches!(e, RegistryError::Corrupt { .. }), "{msg}");
    assert!(msg.contains("`../../../x`"), "{msg}");
    assert!(msg.contains("16 lowercase hex characters"), "{msg}");
    assert!(!msg.contains('\n'), "{msg}");
    assert!(victim.join("keep").is_file(), "gc removed {victim:?}");
    assert_eq!(
        std::fs::read(&path).expect("read"),
        text,
        "file left as it was"
    );
    // Release and status refuse it the same way; rebuild keeps it aside and leaves `a/x`.
    assert!(matches!(
        read_registry(&state),
        Err(RegistryError::Corrupt { .. })
    ));
    let report = reg.rebuild(inventory(1, 20 * GI)).expect("rebuild");
    assert!(report.moved_aside.is_some());
    assert!(victim.join("keep").is_file());
    // Nor does a caller asking for a slice's directory get a path for it.
    let e = reg
        .slice_dir("../../../x")
        .expect_err("slice_dir of a path");
    assert!(e.to_string().contains("`../../../x`"), "{e}");
}

#[test]
fn a_state_dir_others_could_change_is_refused_with_one_line() {
    let tmp = state_dir();
    let sys = Arc::new(FakeSystem::new(5_000_000));
    let real = tmp.path().join("real");
    std::fs::create_dir(&real).expect("mkdir");
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink(&real, &link).expect("symlink");
    let e = open(&link, sys.clone()).expect_err("symlinked state_dir");
    let msg = e.to_string();
    assert!(
        msg.contains(&link.display().to_string()) && msg.contains("symbolic link"),
        "{msg}"
    );
    assert!(msg.contains("accepted:"), "{msg}");
    assert!(!msg.contains('\n'), "{msg}");

    chmod(&real, 0o775);
    let msg = open(&real, sys.clone())
        .expect_err("group-writable")
        .to_string();
    assert!(
        msg.contains(&real.display().to_string()) && msg.contains("mode 0775"),
        "{msg}"
    );
    assert!(msg.contains("not writable by group or others"), "{msg}");
    chmod(&real, 0o757);
    assert!(open(&real, sys.clone()).is_err(), "world-writable");
    chmod(&real, 0o755);
    let reg = open(&real, sys.clone()).expect("a sound state_dir opens");
    reg.set_inventory(inventory(1, 20 * GI)).expect("inventory");

    // The registry file too: a symlink or a file others may write is refused.
    let file = reg.registry_path().to_path_buf();
    chmod(&file, 0o622);
    let msg = open(&real, sys.clone())
        .expect_err("group-writable registry")
        .to_string();
    assert!(
        msg.contains(&file.display().to_string()) && msg.contains("mode 0622"),
        "{msg}"
    );
    chmod(&file, 0o600);
    std::fs::rename(&file, real.join("elsewhere.json")).expect("move");
    std::os::unix::fs::symlink(real.join("elsewhere.json"), &file).expect("symlink");
    let msg = open(&real, sys.clone())
        .expect_err("symlinked registry")
        .to_string();
    assert!(msg.contains("symbolic link"), "{msg}");
    std::fs::remove_file(&file).expect("rm");

    // Owned by someone else than the expected owner (root on a node).
    let me = rustix::process::geteuid().as_raw();
    check_state_dir(&real, me).expect("owned by me");
    let msg = check_state_dir(&real, me + 1)
        .expect_err("foreign owner")
        .to_string();
    assert!(
        msg.contains(&format!("owned by uid {me}")) && msg.contains(&format!("uid {}", me + 1)),
        "{msg}"
    );
}

/// Runs `script` with `sh -c` as uid/gid 65534 (nobody), without supplementary groups.
fn as_nobody(script: &str, arg: &Path) -> std::process::Output {
    std::process::Command::new("setpriv")
        .args([
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            "--",
            "sh",
            "-c",
            script,
            "sh",
        ])
        .arg(arg)
        .output()
        .expect("run setpriv (util-linux)")
}

#[test]
fn host_users_cannot_open_a_slices_usage_or_limits_file() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: needs root to switch to an unprivileged uid");
        return;
    }
    let tmp = state_dir();
    // The state directory as on a node: traversable by everyone.
    chmod(tmp.path(), 0o755);
    let state = tmp.path().join("state");
    // A node installed by an older build: slices/ world-traversable.
    std::fs::create_dir_all(state.join("slices")).expect("mkdir");
    chmod(&state.join("slices"), 0o755);
    let reg = open(&state, Arc::new(FakeSystem::new(5_000_000))).expect("open");
    reg.set_inventory(inventory(1, 20 * GI)).expect("inventory");
    let r = reg.reserve(&slice()).expect("reserve");
    let dir = reg.slice_dir(&r.id).expect("slice dir");
    // The modes the create path gives them: the container's user, whoever it is, reads
    // the limits and writes the usage file through its bind mounts.
    let usage = dir.join("usage");
    let limits = dir.join("limits.json");
    std::fs::write(&usage, vec![0u8; 64]).expect("usage");
    chmod(&usage, 0o666);
    std::fs::write(&limits, b"{}").expect("limits");
    chmod(&limits, 0o644);
    // The test itself can reach the state dir as nobody (so a failure below is the slice
    // files' protection, not the temp dir's).
    let ls = as_nobody("ls \"$1\" >/dev/null", &state);
    assert!(ls.status.success(), "{ls:?}");

    let write = as_nobody("exec 3<>\"$1\"", &usage);
    assert!(
        !write.status.success(),
        "an unprivileged host user opened {usage:?} for writing"
    );
    assert!(
        String::from_utf8_lossy(&write.stderr).contains("Permission denied"),
        "{write:?}"
    );
    let read = as_nobody("cat \"$1\" >/dev/null", &usage);
    assert!(!read.status.success(), "read {usage:?}");
    let read = as_nobody("cat \"$1\" >/dev/null", &limits);
    assert!(!read.status.success(), "read {limits:?}");
    let mode = std::fs::metadata(state.join("slices"))
        .expect("slices")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700, "slices/ is {mode:o}");
}

#[test]
fn rebuild_of_a_sound_registry_keeps_live_reservations_that_lost_their_record() {
    let tmp = state_dir();
    let sys = Arc::new(FakeSystem::new(5_000_000));
    let reg = open(tmp.path(), sys.clone()).expect("open");
    reg.set_inventory(inventory(2, 20 * GI)).expect("inventory");
    sys.spawn(4242, 77);
    let with_record = reg.reserve(&slice()).expect("reserve");
    let pending = reg.reserve(&slice()).expect("reserve");
    let bound = reg.reserve(&slice()).expect("reserve");
    let bound = reg.bind(&bound.id, "c-bound", 4242).expect("bind");
    sys.spawn(4343, 88);
    let dead = reg.reserve(&slice()).expect("reserve");
    reg.bind(&dead.id, "c-dead", 4343).expect("bind");
    sys.kill(4343);
    for id in [&pending.id, &bound.id, &dead.id] {
        std::fs::remove_dir_all(reg.slice_dir(id).expect("slice dir")).expect("rm slice dir");
    }

    let report = reg.rebuild(inventory(2, 20 * GI)).expect("rebuild");
    let mut restored: Vec<&str> = report.restored.iter().map(|r| r.id.as_str()).collect();
    restored.sort_unstable();
    let mut want = vec![
        with_record.id.as_str(),
        pending.id.as_str(),
        bound.id.as_str(),
    ];
    want.sort_unstable();
    assert_eq!(restored, want, "{report:?}");
    assert!(report.dropped.iter().any(|d| d.id == dead.id), "{report:?}");
    let file = read_registry(tmp.path()).expect("read");
    let mut listed: Vec<&str> = file.reservations.iter().map(|r| r.id.as_str()).collect();
    listed.sort_unstable();
    assert_eq!(listed, want);
    assert_eq!(file.reservation(&bound.id), Some(&bound));
    // Their records are written again, so a later rebuild finds them.
    for id in [&pending.id, &bound.id] {
        assert!(
            reg.slice_dir(id)
                .expect("slice dir")
                .join("reservation.json")
                .is_file(),
            "{id} has no record"
        );
    }
    let again = reg.rebuild(inventory(2, 20 * GI)).expect("rebuild");
    assert_eq!(again.restored.len(), 3, "{again:?}");
}
