//! The registry's operations one by one against a fake system: reserve, bind, release, gc,
//! inventory changes, owners of every kind, and what each leaves on disk.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{inventory, open, state_dir, GI};
use gpuslice_config::Quantity;
use gpuslice_registry::{
    read_registry, FakeSystem, KubernetesRef, Owner, ProcessRef, ReapReason, RefusalReason,
    Registry, RegistryError, Request, ReservationState, Selector, System, RECORD_FILE,
};

fn slice(memory: u64, cores: u8) -> Request {
    Request {
        memory: Some(Quantity::Bytes(memory)),
        cores,
        ..Request::new(Owner::container())
    }
}

fn setup(
    gpus: u32,
    memory: u64,
) -> (
    tempfile::TempDir,
    Arc<FakeSystem>,
    Registry,
    common::CleanedUp,
) {
    let dir = state_dir();
    let sys = Arc::new(FakeSystem::new(1_000_000));
    let (reg, seen) = open(
        dir.path(),
        common::options(Duration::from_secs(120)),
        sys.clone(),
    );
    reg.set_inventory(inventory(gpus, memory))
        .expect("inventory");
    (dir, sys, reg, seen)
}

#[test]
fn reserve_writes_registry_and_record_then_release_removes_both() {
    let (_d, _sys, reg, seen) = setup(2, 10 * GI);
    let r = reg.reserve(&slice(4 * GI, 30)).expect("reserve");
    assert_eq!(r.state, ReservationState::Pending);
    assert_eq!(r.deadline_ms, Some(1_000_000 + 120_000));
    assert_eq!(r.gpus.len(), 1);
    assert_eq!((r.gpus[0].memory, r.gpus[0].cores), (4 * GI, 30));
    let dir = reg.slice_dir(&r.id).expect("slice dir");
    assert!(dir.join(RECORD_FILE).is_file());
    let file = read_registry(reg.state_dir()).expect("read");
    assert_eq!(file.reservations, vec![r.clone()]);
    assert_eq!(file.counters.reserved_total, 1);

    let out = reg.release(&r.id).expect("release");
    assert_eq!(out.reservations, vec![r.clone()]);
    assert!(out.corrupt.is_none());
    assert!(!dir.exists());
    assert_eq!(*seen.lock().unwrap(), vec![r.id.clone()]);
    // Idempotent: a second release removes nothing and calls nothing.
    assert!(reg.release(&r.id).expect("again").reservations.is_empty());
    assert_eq!(seen.lock().unwrap().len(), 1);
    let file = read_registry(reg.state_dir()).expect("read");
    assert!(file.reservations.is_empty());
    assert_eq!(file.counters.released_total, 1);
}

#[test]
fn bind_records_process_and_is_idempotent_for_one_container() {
    let (_d, sys, reg, _) = setup(1, 10 * GI);
    sys.spawn(4242, 777);
    let r = reg.reserve(&slice(GI, 0)).expect("reserve");
    let b = reg.bind(&r.id, "ctr-a", 4242).expect("bind");
    assert_eq!(b.state, ReservationState::Bound);
    assert_eq!(b.deadline_ms, None);
    let want = ProcessRef {
        pid: 4242,
        start_time: 777,
        boot_id: "fake-boot-0".into(),
        cgroup: None,
        unknown: Default::default(),
    };
    assert_eq!(b.owner.process(), Some(&want));
    assert_eq!(b.owner.container_id(), Some("ctr-a"));
    assert_eq!(reg.bind(&r.id, "ctr-a", 4242).expect("again"), b);
    let e = reg.bind(&r.id, "ctr-b", 4242).expect_err("other container");
    assert!(matches!(e, RegistryError::AlreadyBound { .. }), "{e}");
    // The record follows the binding, so a rebuild keeps it.
    let rec = std::fs::read_to_string(reg.slice_dir(&r.id).expect("slice dir").join(RECORD_FILE))
        .expect("record");
    assert!(rec.contains("\"ctr-a\"") && rec.contains("4242"), "{rec}");
    // Bound reservations outlive the pending deadline.
    sys.advance_ms(10 * 60 * 1000);
    assert!(reg.gc().expect("gc").reaped.is_empty());
}

#[test]
fn bind_refuses_missing_reservation_dead_process_and_bad_ids() {
    let (_d, sys, reg, _) = setup(1, 10 * GI);
    let r = reg.reserve(&slice(GI, 0)).expect("reserve");
    assert!(matches!(
        reg.bind(&r.id, "c", 99).expect_err("no pid"),
        RegistryError::NoProcess { pid: 99 }
    ));
    sys.spawn(5, 1);
    let e = reg.bind("0123456789abcdef", "c", 5).expect_err("unknown");
    assert!(e.to_string().contains("0123456789abcdef"), "{e}");
    assert!(matches!(
        reg.bind("../x", "c", 5).expect_err("bad id"),
        RegistryError::InvalidId { .. }
    ));
    assert!(matches!(
        reg.bind(&r.id, "", 5).expect_err("empty"),
        RegistryError::EmptyContainerId
    ));
    assert!(matches!(
        reg.release("ZZ").expect_err("bad id"),
        RegistryError::InvalidId { .. }
    ));
}

#[test]
fn pending_past_deadline_and_dead_owners_are_reaped_by_the_next_operation() {
    let (_d, sys, reg, seen) = setup(1, 10 * GI);
    sys.spawn(10, 100);
    sys.spawn(11, 110);
    let pending = reg.reserve(&slice(GI, 0)).expect("reserve");
    let a = reg.reserve(&slice(GI, 0)).expect("reserve");
    let b = reg.reserve(&slice(GI, 0)).expect("reserve");
    reg.bind(&a.id, "a", 10).expect("bind");
    reg.bind(&b.id, "b", 11).expect("bind");
    sys.kill(10);
    sys.advance_ms(120_001);
    // Any operation reaps: here a reserve.
    let c = reg.reserve(&slice(GI, 0)).expect("reserve");
    let file = read_registry(reg.state_dir()).expect("read");
    let ids: Vec<&str> = file.reservations.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, vec![b.id.as_str(), c.id.as_str()]);
    assert_eq!(file.counters.reaped_total, 2);
    let mut cleaned = seen.lock().unwrap().clone();
    cleaned.sort();
    let mut want = vec![pending.id.clone(), a.id.clone()];
    want.sort();
    assert_eq!(cleaned, want);
    assert!(
        !reg.slice_dir(&pending.id).expect("slice dir").exists()
            && !reg.slice_dir(&a.id).expect("slice dir").exists()
    );
}

/// A reservation of `memory` bound to process `pid`, whose start time the registry has just
/// read (so the next operation only probes exits), after which `pid` exits.
fn bound_then_exited(
    sys: &FakeSystem,
    reg: &Registry,
    pid: u32,
    memory: u64,
) -> gpuslice_registry::Reservation {
    sys.spawn(pid, u64::from(pid) * 10);
    let r = reg.reserve(&slice(memory, 0)).expect("reserve");
    reg.bind(&r.id, "a", pid).expect("bind");
    reg.release("0000000000000000").expect("no-op");
    assert_eq!(
        read_registry(reg.state_dir()).unwrap().processes_checked_ms,
        sys.now_ms(),
        "start times were just read"
    );
    sys.kill(pid);
    r
}

#[test]
fn capacity_of_an_exited_owner_is_reclaimed_before_a_refusal() {
    let (_d, sys, reg, seen) = setup(1, 10 * GI);
    let a = bound_then_exited(&sys, &reg, 12, 8 * GI);
    // Fits only once `a` is reaped: the reserve probes owners under the lock, reaps `a`
    // and places, instead of refusing for a dead process.
    let b = reg
        .reserve(&slice(6 * GI, 0))
        .expect("the exited owner's memory is free");
    let file = read_registry(reg.state_dir()).expect("read");
    let ids: Vec<&str> = file.reservations.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, vec![b.id.as_str()]);
    assert_eq!(file.counters.reaped_total, 1);
    assert!(
        file.counters.refused_total.is_empty(),
        "{:?}",
        file.counters
    );
    assert_eq!(*seen.lock().unwrap(), vec![a.id.clone()]);
    assert!(!reg.slice_dir(&a.id).expect("slice dir").exists());
}

#[test]
fn a_failing_operation_still_reaps_exited_owners() {
    let (_d, sys, reg, _) = setup(1, 10 * GI);
    bound_then_exited(&sys, &reg, 13, GI);
    let e = reg
        .bind("0123456789abcdef", "c", 13)
        .expect_err("no such process");
    assert!(matches!(e, RegistryError::NoProcess { pid: 13 }), "{e}");
    sys.spawn(14, 140);
    let e = reg
        .bind("0123456789abcdef", "c", 14)
        .expect_err("no such reservation");
    assert!(matches!(e, RegistryError::NotFound { .. }), "{e}");
    let file = read_registry(reg.state_dir()).expect("read");
    assert!(file.reservations.is_empty(), "{:?}", file.reservations);
    assert_eq!(file.counters.reaped_total, 1);
}

#[test]
fn pid_reuse_and_reboot_are_reaped_with_reasons() {
    let (_d, sys, reg, _) = setup(1, 10 * GI);
    sys.spawn(20, 200);
    sys.spawn(21, 210);
    let a = reg.reserve(&slice(GI, 0)).expect("reserve");
    reg.bind(&a.id, "a", 20).expect("bind");
    let b = reg.reserve(&slice(GI, 0)).expect("reserve");
    reg.bind(&b.id, "b", 21).expect("bind");
    sys.spawn(20, 999); // pid 20 now names another process
    let reaped = reg.gc().expect("gc").reaped;
    assert_eq!(reaped.len(), 1, "{reaped:?}");
    assert_eq!(reaped[0].id, a.id);
    assert_eq!(
        reaped[0].reason,
        ReapReason::PidReused {
            pid: 20,
            recorded: 200,
            found: 999
        }
    );
    sys.reboot();
    sys.spawn(21, 210); // same pid and start time after a reboot: still another process
    let reaped = reg.gc().expect("gc").reaped;
    assert_eq!(reaped.len(), 1);
    assert!(
        matches!(reaped[0].reason, ReapReason::Rebooted { .. }),
        "{}",
        reaped[0]
    );
}

#[test]
fn pid_reuse_is_seen_by_the_next_start_time_check() {
    let (_d, sys, reg, _) = setup(1, 10 * GI);
    sys.spawn(30, 300);
    let a = reg.reserve(&slice(GI, 0)).expect("reserve");
    reg.bind(&a.id, "a", 30).expect("bind");
    reg.release("0000000000000000").expect("no-op");
    let checked = read_registry(reg.state_dir())
        .expect("read")
        .processes_checked_ms;
    assert_eq!(checked, sys.now_ms(), "the start times were read");
    sys.spawn(30, 301);
    // Start times are read again once the recheck interval has passed.
    sys.advance_ms(1_000);
    reg.release("0000000000000000").expect("no-op");
    let file = read_registry(reg.state_dir()).expect("read");
    assert!(file.reservation(&a.id).is_none());
    assert_eq!(file.counters.reaped_total, 1);
}

#[test]
fn reserve_for_a_process_refuses_one_that_is_not_running() {
    let (_d, sys, reg, _) = setup(1, 10 * GI);
    sys.spawn(40, 400);
    let real = reg.process_ref(40).expect("process");
    let stale = ProcessRef {
        start_time: 399,
        ..real.clone()
    };
    for p in [
        stale,
        ProcessRef {
            pid: 41,
            ..real.clone()
        },
    ] {
        let owner = Owner::Container {
            container_id: Some("c".into()),
            process: Some(p),
            kubernetes: None,
        };
        let e = reg
            .reserve(&Request {
                owner,
                ..slice(GI, 0)
            })
            .expect_err("not running");
        assert!(matches!(e, RegistryError::NoProcess { .. }), "{e}");
    }
    assert!(read_registry(reg.state_dir())
        .expect("read")
        .reservations
        .is_empty());
}

#[test]
fn dra_claims_are_held_until_released_and_never_bound() {
    let (_d, sys, reg, _) = setup(1, 10 * GI);
    let owner = Owner::DraClaim {
        claim_uid: "uid-1".into(),
        namespace: "ns".into(),
        members: Vec::new(),
        name: "claim".into(),
        gone: None,
    };
    let r = reg
        .reserve(&Request {
            owner,
            ..slice(GI, 10)
        })
        .expect("reserve");
    assert_eq!(r.state, ReservationState::Bound);
    sys.advance_ms(24 * 3600 * 1000);
    sys.reboot();
    assert!(reg.gc().expect("gc").reaped.is_empty());
    sys.spawn(3, 3);
    assert!(matches!(
        reg.bind(&r.id, "c", 3).expect_err("claim"),
        RegistryError::HeldByClaim { .. }
    ));
    assert_eq!(reg.release(&r.id).expect("release").reservations.len(), 1);
}

#[test]
fn release_container_takes_all_of_its_reservations() {
    let (_d, sys, reg, seen) = setup(2, 10 * GI);
    sys.spawn(7, 70);
    let k8s = KubernetesRef {
        namespace: "ns".into(),
        pod: "p".into(),
        pod_uid: None,
        container: "c".into(),
        unknown: Default::default(),
    };
    let owner = Owner::Container {
        container_id: Some("ctr".into()),
        process: None,
        kubernetes: Some(k8s),
    };
    let a = reg
        .reserve(&Request {
            owner: owner.clone(),
            ..slice(GI, 0)
        })
        .expect("reserve");
    let b = reg
        .reserve(&Request {
            owner,
            whole_gpu: true,
            ..slice(GI, 0)
        })
        .expect("reserve");
    let other = reg.reserve(&slice(GI, 0)).expect("reserve");
    reg.bind(&a.id, "ctr", 7).expect("bind");
    let out = reg.release_container("ctr").expect("release");
    let mut ids: Vec<String> = out.reservations.iter().map(|r| r.id.clone()).collect();
    ids.sort();
    let mut want = vec![a.id.clone(), b.id.clone()];
    want.sort();
    assert_eq!(ids, want);
    assert_eq!(seen.lock().unwrap().len(), 2);
    assert!(reg
        .release_container("ctr")
        .expect("again")
        .reservations
        .is_empty());
    let file = read_registry(reg.state_dir()).expect("read");
    assert_eq!(file.reservations.len(), 1);
    assert_eq!(file.reservations[0].id, other.id);
}

#[test]
fn whole_gpu_booking_is_bound_at_once_and_exclusive() {
    let (_d, sys, reg, _) = setup(2, 10 * GI);
    sys.spawn(8, 80);
    let s = reg
        .reserve(&Request {
            selectors: vec![Selector::Index(0)],
            ..slice(GI, 0)
        })
        .expect("slice");
    let process = reg.process_ref(8).expect("process");
    let owner = Owner::Container {
        container_id: Some("w".into()),
        process: Some(process),
        kubernetes: None,
    };
    let whole = Request {
        owner: owner.clone(),
        whole_gpu: true,
        selectors: vec![Selector::Index(0)],
        ..Request::new(owner.clone())
    };
    let e = reg.reserve(&whole).expect_err("GPU 0 holds a slice");
    assert_eq!(e.refusal().map(|r| r.reason), Some(RefusalReason::NoFit));
    let on1 = Request {
        selectors: vec![Selector::Index(1)],
        ..whole
    };
    let w = reg.reserve(&on1).expect("GPU 1 is free");
    assert_eq!(w.state, ReservationState::Bound);
    assert_eq!(
        (w.gpus[0].index, w.gpus[0].memory, w.gpus[0].cores),
        (1, 10 * GI, 100)
    );
    assert!(reg
        .reserve(&Request {
            selectors: vec![Selector::Index(1)],
            ..slice(GI, 0)
        })
        .is_err());
    reg.release(&s.id).expect("release");
    sys.kill(8);
    assert_eq!(reg.gc().expect("gc").reaped.len(), 1);
}

#[test]
fn refusals_are_counted_by_reason() {
    let (_d, _sys, reg, _) = setup(1, 10 * GI);
    assert!(reg.reserve(&slice(11 * GI, 0)).is_err());
    assert!(reg
        .reserve(&Request {
            selectors: vec![Selector::Index(5)],
            ..slice(GI, 0)
        })
        .is_err());
    assert!(reg
        .reserve(&Request {
            gpus: 0,
            ..slice(GI, 0)
        })
        .is_err());
    let c = read_registry(reg.state_dir()).expect("read").counters;
    assert_eq!(c.refused_total.get("no-fit"), Some(&1));
    assert_eq!(c.refused_total.get("bad-selector"), Some(&1));
    assert_eq!(c.refused_total.get("bad-request"), Some(&1));
    assert_eq!(c.reserved_total, 0);
}

#[test]
fn empty_registry_refuses_without_inventory() {
    let dir = state_dir();
    let (reg, _) = open(
        dir.path(),
        common::options(Duration::from_secs(1)),
        Arc::new(FakeSystem::new(1)),
    );
    let e = reg.reserve(&slice(GI, 0)).expect_err("no inventory");
    assert_eq!(
        e.refusal().map(|r| r.reason),
        Some(RefusalReason::NoInventory)
    );
    assert!(e.to_string().contains("gpuslice cdi generate"), "{e}");
}

#[test]
fn inventory_change_keeps_reservations_on_vanished_gpus() {
    let (_d, _sys, reg, _) = setup(2, 10 * GI);
    let on1 = reg
        .reserve(&Request {
            selectors: vec![Selector::Index(1)],
            ..slice(GI, 0)
        })
        .expect("reserve");
    let mut smaller = inventory(2, 10 * GI);
    smaller.gpus.remove(1);
    let change = reg.set_inventory(smaller).expect("inventory");
    assert_eq!(
        change.missing,
        vec![(on1.id.clone(), on1.gpus[0].uuid.clone())]
    );
    let file = read_registry(reg.state_dir()).expect("read");
    assert_eq!(file.reservations.len(), 1);
    assert_eq!(file.inventory.gpus.len(), 1);
    // Indexes follow the GPU (by UUID) when the inventory renumbers.
    let mut renumbered = inventory(2, 10 * GI);
    renumbered.gpus[0].index = 5;
    renumbered.gpus[1].index = 4;
    reg.set_inventory(renumbered).expect("inventory");
    let file = read_registry(reg.state_dir()).expect("read");
    assert_eq!(file.reservations[0].gpus[0].index, 4);
    let mut dup = inventory(2, 10 * GI);
    dup.gpus[1].uuid = dup.gpus[0].uuid.clone();
    assert!(matches!(
        reg.set_inventory(dup).expect_err("dup"),
        RegistryError::BadInventory { .. }
    ));
}

#[test]
fn gc_removes_orphan_slice_dirs_and_stale_temps() {
    let (_d, _sys, reg, seen) = setup(1, 10 * GI);
    let r = reg.reserve(&slice(GI, 0)).expect("reserve");
    // A crash after the registry dropped a reservation but before its directory went.
    let orphan = reg.reserve(&slice(GI, 0)).expect("reserve");
    let kept = std::fs::read(
        reg.slice_dir(&orphan.id)
            .expect("slice dir")
            .join(RECORD_FILE),
    )
    .expect("record");
    reg.release(&orphan.id).expect("release");
    std::fs::create_dir_all(reg.slice_dir(&orphan.id).expect("slice dir")).expect("mkdir");
    std::fs::write(
        reg.slice_dir(&orphan.id)
            .expect("slice dir")
            .join(RECORD_FILE),
        kept,
    )
    .expect("write");
    std::fs::create_dir_all(reg.slice_dir("abcdefabcdefabcd").expect("slice dir")).expect("mkdir");
    let temp = reg.state_dir().join(".registry.json.tmp.99999.0");
    std::fs::write(&temp, b"partial").expect("write");
    seen.lock().unwrap().clear();
    let reaped = reg.gc().expect("gc").reaped;
    let mut ids: Vec<&str> = reaped.iter().map(|r| r.id.as_str()).collect();
    ids.sort();
    let mut want = vec![orphan.id.as_str(), "abcdefabcdefabcd"];
    want.sort();
    assert_eq!(ids, want);
    assert!(reaped.iter().all(|r| r.reason == ReapReason::Orphan));
    assert_eq!(*seen.lock().unwrap(), vec![orphan.id.clone()]);
    assert!(
        !reg.slice_dir(&orphan.id).expect("slice dir").exists()
            && !reg
                .slice_dir("abcdefabcdefabcd")
                .expect("slice dir")
                .exists()
    );
    assert!(reg.slice_dir(&r.id).expect("slice dir").exists());
    assert!(!temp.exists());
}

#[test]
fn options_follow_the_config() {
    let mut c = gpuslice_config::Config::default();
    c.placement.memory_overcommit = 2.0;
    c.registry.pending_timeout = Duration::from_secs(7);
    let o = gpuslice_registry::Options::from_config(&c);
    assert_eq!(o.placement.memory_overcommit, 2.0);
    assert_eq!(o.pending_timeout, Duration::from_secs(7));
}
