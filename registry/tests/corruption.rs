//! Acceptance 5: an unusable `registry.json` is never guessed at or overwritten. Reserve,
//! bind and gc refuse with one line naming the file and `gpuslice gc --rebuild`; release
//! still removes slice directories; `rebuild` restores exactly the live reservations.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{inventory, state_dir, GI};
use gpuslice_config::Quantity;
use gpuslice_registry::{
    read_registry, FakeSystem, Owner, ReapReason, RebuildReport, Registry, RegistryError, Request,
    Reservation, UnreadableOutcome, UnreadableRecord, RECORD_FILE,
};

fn slice(owner: Owner) -> Request {
    Request {
        memory: Some(Quantity::Bytes(GI)),
        cores: 10,
        ..Request::new(owner)
    }
}

fn assert_refuses(e: RegistryError, path: &std::path::Path, what: &str) {
    let msg = e.to_string();
    assert!(matches!(e, RegistryError::Corrupt { .. }), "{msg}");
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(msg.contains("run `gpuslice gc --rebuild`"), "{msg}");
    assert!(msg.contains(what), "{msg}");
    assert!(!msg.contains('\n'), "{msg}");
}

struct Node {
    _dir: tempfile::TempDir,
    sys: Arc<FakeSystem>,
    reg: Registry,
    seen: common::CleanedUp,
}

fn node() -> Node {
    let dir = state_dir();
    let sys = Arc::new(FakeSystem::new(5_000_000));
    let (reg, seen) = common::open(
        dir.path(),
        common::options(Duration::from_secs(60)),
        sys.clone(),
    );
    reg.set_inventory(inventory(2, 20 * GI)).expect("inventory");
    Node {
        _dir: dir,
        sys,
        reg,
        seen,
    }
}

#[test]
fn corrupt_registry_refuses_changes_and_rebuild_restores_live_reservations() {
    let n = node();
    let (reg, sys) = (&n.reg, &n.sys);
    sys.spawn(100, 1);
    sys.spawn(200, 2);
    // Soon past its deadline.
    let expiring = reg.reserve(&slice(Owner::container())).expect("reserve");
    sys.advance_ms(30_000);
    let pending = reg.reserve(&slice(Owner::container())).expect("reserve");
    let bound = reg.reserve(&slice(Owner::container())).expect("reserve");
    let bound = reg.bind(&bound.id, "ctr-live", 100).expect("bind");
    let dying = reg.reserve(&slice(Owner::container())).expect("reserve");
    let dying = reg.bind(&dying.id, "ctr-dying", 200).expect("bind");
    let claim = Owner::DraClaim {
        claim_uid: "u".into(),
        namespace: "ns".into(),
        members: Vec::new(),
        name: "c".into(),
        gone: None,
    };
    let claim = reg
        .reserve(&Request {
            gpus: 2,
            ..slice(claim)
        })
        .expect("reserve");
    let released = reg.reserve(&slice(Owner::container())).expect("reserve");

    let path = reg.registry_path().to_path_buf();
    let garbage = b"{\"version\":1,\"reservations\":[{\"id\":".to_vec();
    std::fs::write(&path, &garbage).expect("corrupt");

    assert_refuses(
        reg.reserve(&slice(Owner::container()))
            .expect_err("reserve"),
        &path,
        "invalid JSON",
    );
    sys.spawn(300, 3);
    assert_refuses(
        reg.bind(&pending.id, "c", 300).expect_err("bind"),
        &path,
        "invalid JSON",
    );
    assert_refuses(reg.gc().expect_err("gc"), &path, "invalid JSON");
    assert_refuses(
        reg.set_inventory(inventory(2, 20 * GI))
            .expect_err("inventory"),
        &path,
        "invalid JSON",
    );
    assert_refuses(
        read_registry(reg.state_dir()).expect_err("read"),
        &path,
        "invalid JSON",
    );

    // Release still removes the slice directory and runs the cleanup.
    let out = reg.release(&released.id).expect("release");
    assert_eq!(out.reservations, vec![released.clone()]);
    assert!(out
        .corrupt
        .as_deref()
        .is_some_and(|m| m.contains("gpuslice gc --rebuild")));
    assert!(!reg.slice_dir(&released.id).expect("slice dir").exists());
    assert_eq!(n.seen.lock().unwrap().last(), Some(&released.id));
    assert!(reg
        .release_container("nobody")
        .expect("release")
        .reservations
        .is_empty());
    // Nothing touched the file.
    assert_eq!(std::fs::read(&path).expect("read"), garbage);

    // Meanwhile one owner dies and one pending reservation runs out of time.
    sys.kill(200);
    sys.advance_ms(31_000);
    let report = reg.rebuild(inventory(2, 20 * GI)).expect("rebuild");
    let aside = report.moved_aside.clone().expect("kept aside");
    assert!(aside
        .file_name()
        .unwrap()
        .to_string_lossy()
        .starts_with("registry.json.corrupt-"));
    assert_eq!(std::fs::read(&aside).expect("aside"), garbage);

    let mut restored: Vec<Reservation> = report.restored.clone();
    restored.sort_by(|a, b| a.id.cmp(&b.id));
    let mut want = vec![pending.clone(), bound.clone(), claim.clone()];
    want.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(
        restored, want,
        "exactly the live reservations, as they were"
    );
    let mut dropped: Vec<(String, bool)> = report
        .dropped
        .iter()
        .map(|d| (d.id.clone(), matches!(d.reason, ReapReason::Expired { .. })))
        .collect();
    dropped.sort();
    let mut want_dropped = vec![(expiring.id.clone(), true), (dying.id.clone(), false)];
    want_dropped.sort();
    assert_eq!(dropped, want_dropped);
    assert!(
        !reg.slice_dir(&dying.id).expect("slice dir").exists()
            && !reg.slice_dir(&expiring.id).expect("slice dir").exists()
    );
    assert!(report.violations.is_empty() && report.unreadable.is_empty());

    // The registry works again and holds exactly what was restored.
    let file = read_registry(reg.state_dir()).expect("parses");
    let mut ids: Vec<&str> = file.reservations.iter().map(|r| r.id.as_str()).collect();
    ids.sort();
    let mut want_ids: Vec<&str> = want.iter().map(|r| r.id.as_str()).collect();
    want_ids.sort();
    assert_eq!(ids, want_ids);
    assert_eq!(file.inventory, inventory(2, 20 * GI));
    reg.reserve(&slice(Owner::container()))
        .expect("reserve works again");
    assert!(reg.bind(&pending.id, "ctr-p", 100).is_ok());
}

#[test]
fn unknown_version_is_refused_by_name() {
    let n = node();
    let path = n.reg.registry_path().to_path_buf();
    std::fs::write(
        &path,
        br#"{"version":7,"inventory":{"gpus":[]},"reservations":[]}"#,
    )
    .expect("write");
    let e = n
        .reg
        .reserve(&slice(Owner::container()))
        .expect_err("version 7");
    assert_refuses(e, &path, "version 7 is not supported");
}

#[test]
fn a_version_2_file_is_refused_by_version_and_rebuilt_from_the_records() {
    let n = node();
    n.sys.spawn(100, 1);
    let pending = n.reg.reserve(&slice(Owner::container())).expect("reserve");
    let bound = n.reg.reserve(&slice(Owner::container())).expect("reserve");
    let bound = n.reg.bind(&bound.id, "ctr", 100).expect("bind");
    // What a build of the version 2 layout (reservations as arrays) left behind.
    let path = n.reg.registry_path().to_path_buf();
    let old = format!(
        r#"{{"version":2,"inventory":{{"gpus":[]}},"reservations":[["{}","pending",["container",null,null,null],[],false,1,null,null]]}}"#,
        pending.id
    );
    std::fs::write(&path, &old).expect("write");
    let e = n
        .reg
        .reserve(&slice(Owner::container()))
        .expect_err("version 2");
    assert_refuses(
        e,
        &path,
        &format!(
            "version 2 is not supported (this build reads version {})",
            gpuslice_registry::REGISTRY_VERSION
        ),
    );
    assert_eq!(std::fs::read_to_string(&path).expect("read"), old);
    let report = n.reg.rebuild(inventory(2, 20 * GI)).expect("rebuild");
    assert!(report.moved_aside.is_some());
    let mut restored = report.restored.clone();
    restored.sort_by(|a, b| a.id.cmp(&b.id));
    let mut want = vec![pending, bound];
    want.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(restored, want);
    assert_eq!(
        read_registry(n.reg.state_dir())
            .expect("parses")
            .reservations
            .len(),
        2
    );
}

/// Overwrites the record of reservation `id` with `text`.
fn break_record(reg: &Registry, id: &str, text: &[u8]) -> std::path::PathBuf {
    let path = reg.slice_dir(id).expect("slice dir").join(RECORD_FILE);
    std::fs::write(&path, text).expect("write");
    path
}

fn outcome_of<'a>(report: &'a RebuildReport, id: &str) -> &'a UnreadableOutcome {
    let found: Vec<&UnreadableRecord> = report.unreadable.iter().filter(|u| u.id == id).collect();
    assert_eq!(found.len(), 1, "{id} in {:?}", report.unreadable);
    &found[0].outcome
}

#[test]
fn rebuild_of_a_sound_registry_keeps_counters_and_judges_unreadable_records_by_its_entries() {
    let n = node();
    n.sys.spawn(100, 1);
    let r = n.reg.reserve(&slice(Owner::container())).expect("reserve");
    // Listed and live: restored from the registry's entry, its record written again.
    let broken = n.reg.reserve(&slice(Owner::container())).expect("reserve");
    let broken_path = break_record(&n.reg, &broken.id, b"nonsense");
    // Listed, but its owner exits: dropped with the registry's entry.
    let dead = n.reg.reserve(&slice(Owner::container())).expect("reserve");
    let dead = n.reg.bind(&dead.id, "ctr-dead", 100).expect("bind");
    break_record(&n.reg, &dead.id, b"{\"version\":2}");
    // Not listed: nothing vouches for it, so it is neither booked nor removed.
    let stray = "0123456789abcdef";
    std::fs::create_dir(n.reg.slice_dir(stray).expect("slice dir")).expect("mkdir");
    break_record(&n.reg, stray, b"{\"version\":2}");
    n.sys.kill(100);

    let before = read_registry(n.reg.state_dir()).expect("read").counters;
    let report = n.reg.rebuild(inventory(2, 20 * GI)).expect("rebuild");
    assert!(report.moved_aside.is_none());
    let mut restored: Vec<&str> = report.restored.iter().map(|r| r.id.as_str()).collect();
    restored.sort();
    let mut want = vec![r.id.as_str(), broken.id.as_str()];
    want.sort();
    assert_eq!(restored, want);
    assert_eq!(
        report.restored.iter().find(|x| x.id == broken.id),
        Some(&broken),
        "restored as the registry listed it"
    );
    assert_eq!(report.unreadable.len(), 3, "{:?}", report.unreadable);
    assert_eq!(
        outcome_of(&report, &broken.id),
        &UnreadableOutcome::Restored {
            rewrite_failed: None
        }
    );
    assert_eq!(outcome_of(&report, &dead.id), &UnreadableOutcome::Dropped);
    assert_eq!(outcome_of(&report, stray), &UnreadableOutcome::LeftInPlace);
    for u in &report.unreadable {
        let line = u.to_string();
        assert!(line.contains(&u.id) && line.contains(RECORD_FILE), "{line}");
        assert!(!line.contains('\n'), "{line}");
    }
    let broken_line = report
        .unreadable
        .iter()
        .find(|u| u.id == broken.id)
        .expect("broken")
        .to_string();
    assert!(
        broken_line.contains(&broken_path.display().to_string())
            && broken_line.contains("invalid JSON")
            && broken_line.contains("written again"),
        "{broken_line}"
    );
    let dropped: Vec<&str> = report.dropped.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(dropped, vec![dead.id.as_str()]);
    assert!(!n.reg.slice_dir(&dead.id).expect("slice dir").exists());
    assert!(
        n.reg.slice_dir(stray).expect("slice dir").exists(),
        "an unreadable record nothing vouches for is left in place"
    );
    let after = read_registry(n.reg.state_dir()).expect("read").counters;
    assert_eq!(after.reaped_total, before.reaped_total + 1);
    assert_eq!(after.reserved_total, before.reserved_total);
    // The rewritten record reads again: a second rebuild restores both from their records.
    let report = n.reg.rebuild(inventory(2, 20 * GI)).expect("rebuild");
    assert_eq!(report.restored.len(), 2);
    assert_eq!(report.unreadable.len(), 1, "{:?}", report.unreadable);
    // Shrinking the inventory under restored reservations is reported, not refused.
    let report = n.reg.rebuild(inventory(1, 20 * GI)).expect("rebuild");
    assert_eq!(report.restored.len(), 2);
    // What `gc --rebuild` prints of such a report: agent/tests/status_render.rs.
}

/// Fills the node (2 GPUs of 20 GiB) with 1 GiB, 10 % slices until a reserve is refused.
fn fill(reg: &Registry) -> Vec<Reservation> {
    let mut booked = Vec::new();
    loop {
        match reg.reserve(&slice(Owner::container())) {
            Ok(r) => booked.push(r),
            Err(RegistryError::Refused(_)) => return booked,
            Err(e) => panic!("reserve: {e}"),
        }
    }
}

#[test]
fn rebuild_keeps_a_listed_live_reservation_whose_record_is_unreadable_so_nothing_is_booked_twice() {
    let n = node();
    let booked = fill(&n.reg);
    assert_eq!(booked.len(), 20, "10 slices of 10 % cores per GPU");
    let victim = booked[7].clone();
    let path = break_record(&n.reg, &victim.id, b"{\"version\":2}");

    let report = n.reg.rebuild(inventory(2, 20 * GI)).expect("rebuild");
    let file = read_registry(n.reg.state_dir()).expect("read");
    assert_eq!(
        file.reservation(&victim.id),
        Some(&victim),
        "the victim is still booked"
    );
    // The node is still full: no second booking of the victim's capacity.
    let e = n
        .reg
        .reserve(&slice(Owner::container()))
        .expect_err("the node is full");
    assert!(matches!(e, RegistryError::Refused(_)), "{e}");

    // The report says what happened.
    assert_eq!(report.unreadable.len(), 1, "{:?}", report.unreadable);
    assert!(
        report.unreadable[0]
            .to_string()
            .contains(&path.display().to_string()),
        "{:?}",
        report.unreadable
    );
    assert_eq!(
        outcome_of(&report, &victim.id),
        &UnreadableOutcome::Restored {
            rewrite_failed: None
        }
    );
    assert_eq!(report.restored.len(), 20);
    assert!(report.dropped.is_empty(), "{:?}", report.dropped);
    assert!(report.violations.is_empty(), "{:?}", report.violations);

    // gc keeps it too, and its record reads again.
    let gc = n.reg.gc().expect("gc");
    assert!(gc.reaped.is_empty() && gc.unreadable.is_empty(), "{gc:?}");
    assert!(n.reg.slice_dir(&victim.id).expect("slice dir").exists());
    let again = n.reg.rebuild(inventory(2, 20 * GI)).expect("rebuild");
    assert!(again.unreadable.is_empty(), "{:?}", again.unreadable);
    assert_eq!(again.restored.len(), 20);
}

#[test]
fn gc_leaves_an_unlisted_slice_directory_whose_record_is_unreadable_in_place() {
    let n = node();
    let kept = n.reg.reserve(&slice(Owner::container())).expect("reserve");
    // Unlisted with an unreadable record (a newer build's, or damaged): kept, reported.
    let odd = "0123456789abcdef";
    let odd_dir = n.reg.slice_dir(odd).expect("slice dir");
    std::fs::create_dir(&odd_dir).expect("mkdir");
    std::fs::write(odd_dir.join("keep"), b"x").expect("write");
    let path = break_record(&n.reg, odd, b"{\"version\":2}");
    // Unlisted without a record: a stray, removed as before.
    let orphan = "fedcba9876543210";
    std::fs::create_dir(n.reg.slice_dir(orphan).expect("slice dir")).expect("mkdir");

    let gc = n.reg.gc().expect("gc");
    let reaped: Vec<(&str, &ReapReason)> = gc
        .reaped
        .iter()
        .map(|r| (r.id.as_str(), &r.reason))
        .collect();
    assert_eq!(reaped, vec![(orphan, &ReapReason::Orphan)]);
    assert!(!n.reg.slice_dir(orphan).expect("slice dir").exists());
    assert_eq!(gc.unreadable.len(), 1, "{gc:?}");
    assert_eq!(gc.unreadable[0].id, odd);
    assert_eq!(gc.unreadable[0].outcome, UnreadableOutcome::LeftInPlace);
    let line = gc.unreadable[0].to_string();
    assert!(
        line.contains(&path.display().to_string())
            && line.contains("is unreadable")
            && line.contains("left in place")
            && !line.contains('\n'),
        "{line}"
    );
    assert!(odd_dir.join("keep").is_file(), "gc removed {odd_dir:?}");
    assert!(n.reg.slice_dir(&kept.id).expect("slice dir").exists());
    // Again: still there, still reported.
    let gc = n.reg.gc().expect("gc");
    assert!(gc.reaped.is_empty());
    assert_eq!(gc.unreadable.len(), 1);
    assert!(odd_dir.join("keep").is_file());
}
