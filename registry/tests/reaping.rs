//! Acceptance 4, with real processes and the real `/proc`: a bound reservation whose process
//! exits (reaped by its parent or still a zombie), or whose pid names another process (start
//! time differs), is reaped by the next operation; so is a pending one past its deadline.

use crate::common;

use std::process::{Child, Command};
use std::sync::Arc;
use std::time::Duration;

use common::{inventory, state_dir, CleanedUp, KillOnDrop, GI};
use gpuslice_config::Quantity;
use gpuslice_registry::{
    read_registry, Options, Owner, ProcessRef, RealSystem, ReapReason, Registry, Request,
};

fn open(dir: &std::path::Path, pending: Duration) -> (Registry, CleanedUp) {
    let (reg, seen) = common::open(
        dir,
        common::options(pending),
        Arc::new(RealSystem::new("/proc")),
    );
    reg.set_inventory(inventory(1, 10 * GI)).expect("inventory");
    (reg, seen)
}

fn slice() -> Request {
    Request {
        memory: Some(Quantity::Bytes(GI)),
        ..Request::new(Owner::container())
    }
}

fn sleeper() -> KillOnDrop {
    KillOnDrop(
        Command::new("sleep")
            .arg("60")
            .spawn()
            .expect("spawn sleep"),
    )
}

fn kill(child: &mut Child) {
    child.kill().expect("kill");
}

#[test]
fn bound_reservation_is_reaped_by_the_next_operation_after_its_process_exits() {
    let dir = state_dir();
    let (reg, seen) = open(dir.path(), Duration::from_secs(3600));
    let mut child = sleeper();
    let a = reg.reserve(&slice()).expect("reserve");
    reg.bind(&a.id, "ctr-a", child.0.id()).expect("bind");
    // Alive: an operation keeps it.
    let keep = reg.reserve(&slice()).expect("reserve");
    assert_eq!(
        read_registry(dir.path()).expect("read").reservations.len(),
        2
    );

    kill(&mut child.0);
    child.0.wait().expect("wait");
    // The very next operation (a release of something else) reaps it.
    reg.release(&keep.id).expect("release");
    let file = read_registry(dir.path()).expect("read");
    assert!(file.reservations.is_empty(), "{:?}", file.reservations);
    assert_eq!(file.counters.reaped_total, 1);
    let mut cleaned = seen.lock().unwrap().clone();
    cleaned.sort();
    let mut want = vec![a.id.clone(), keep.id.clone()];
    want.sort();
    assert_eq!(cleaned, want);
    assert!(!reg.slice_dir(&a.id).expect("slice dir").exists());
}

#[test]
fn zombie_owner_counts_as_exited() {
    let dir = state_dir();
    let (reg, _) = open(dir.path(), Duration::from_secs(3600));
    let mut zombie = sleeper();
    let a = reg.reserve(&slice()).expect("reserve");
    reg.bind(&a.id, "ctr-z", zombie.0.id()).expect("bind");
    kill(&mut zombie.0);
    // Not waited for: the pid stays a zombie until its parent reaps it.
    let pid = zombie.0.id();
    while std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.contains(") Z "))
        .unwrap_or(false)
    {
        std::thread::sleep(Duration::from_millis(1));
    }
    let reaped = reg.gc().expect("gc").reaped;
    assert_eq!(reaped.len(), 1);
    assert_eq!(reaped[0].reason, ReapReason::Exited { pid });
    assert!(read_registry(dir.path())
        .expect("read")
        .reservations
        .is_empty());
}

/// Rewrites `registry.json` so its one process-bound reservation names an earlier process
/// under the same pid, as after pid reuse.
fn set_start_time(reg: &Registry, start_time: u64) {
    let mut file = read_registry(reg.state_dir()).expect("read");
    let bound: Vec<_> = file
        .reservations
        .iter_mut()
        .filter_map(|r| match &mut r.owner {
            Owner::Container {
                process: Some(p), ..
            } => Some(p),
            _ => None,
        })
        .collect();
    assert_eq!(bound.len(), 1, "one process-bound reservation");
    for p in bound {
        p.start_time = start_time;
    }
    let edited = serde_json::to_string(&file).expect("serialise");
    std::fs::write(reg.registry_path(), edited).expect("write");
}

#[test]
fn reservation_whose_pid_names_another_process_is_reaped() {
    let dir = state_dir();
    let (reg, _) = open(dir.path(), Duration::from_secs(3600));
    let live = sleeper();
    let real = reg.process_ref(live.0.id()).expect("process");
    let owner = Owner::Container {
        container_id: Some("old".into()),
        process: Some(real.clone()),
        kubernetes: None,
    };
    let r = reg.reserve(&Request { owner, ..slice() }).expect("reserve");
    assert!(
        reg.gc().expect("gc").reaped.is_empty(),
        "the true start time keeps it"
    );
    // The registry now remembers an earlier process under the same pid: as after pid reuse.
    set_start_time(&reg, real.start_time - 1);
    let reaped = reg.gc().expect("gc").reaped;
    assert_eq!(reaped.len(), 1);
    assert_eq!(reaped[0].id, r.id);
    assert_eq!(
        reaped[0].reason,
        ReapReason::PidReused {
            pid: real.pid,
            recorded: real.start_time - 1,
            found: real.start_time
        }
    );
    // An ordinary operation (not only `gc`) reaps a reused pid too, once the start-time
    // recheck interval has passed since the owners were last read.
    let r2 = reg
        .reserve(&Request {
            owner: Owner::Container {
                container_id: Some("old2".into()),
                process: Some(real.clone()),
                kubernetes: None,
            },
            ..slice()
        })
        .expect("reserve");
    set_start_time(&reg, real.start_time - 2);
    std::thread::sleep(Options::DEFAULT_RECHECK + Duration::from_millis(100));
    let r3 = reg.reserve(&slice()).expect("a later reserve");
    let file = read_registry(dir.path()).expect("registry");
    assert!(
        file.reservation(&r2.id).is_none(),
        "a reserve did not reap the reused pid"
    );
    assert!(file.reservation(&r3.id).is_some());
    // A process that is not the one named is refused outright.
    let stale = ProcessRef {
        start_time: real.start_time - 1,
        ..real
    };
    let owner = Owner::Container {
        container_id: None,
        process: Some(stale),
        kubernetes: None,
    };
    assert!(reg.reserve(&Request { owner, ..slice() }).is_err());
}

#[test]
fn pending_reservation_is_reaped_after_its_deadline() {
    let dir = state_dir();
    let (reg, seen) = open(dir.path(), Duration::from_millis(20));
    let r = reg.reserve(&slice()).expect("reserve");
    std::thread::sleep(Duration::from_millis(40));
    let other = reg.reserve(&slice()).expect("reserve");
    let file = read_registry(dir.path()).expect("read");
    assert!(file.reservation(&r.id).is_none());
    assert!(file.reservation(&other.id).is_some());
    assert_eq!(*seen.lock().unwrap(), vec![r.id.clone()]);
    assert!(!reg.slice_dir(&r.id).expect("slice dir").exists());
}
