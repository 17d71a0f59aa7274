//! At the registry: whole-GPU bookings belong to a process
//! instance, not to a container id; the process that reserved a pending slice can give it
//! back and is the only one whose containers bind it while it runs; an owner whose init
//! exited lives while its cgroup holds processes; a poststop hook releases only the slice its
//! own container holds.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{inventory, open, options, state_dir, GI};
use gpuslice_config::Quantity;
use gpuslice_registry::{
    ClaimShare, FakeSystem, Owner, ReapReason, Registry, RegistryError, Request, ReservationState,
    Selector,
};

fn setup(gpus: u32) -> (tempfile::TempDir, Arc<FakeSystem>, Registry) {
    let dir = state_dir();
    let sys = Arc::new(FakeSystem::new(1_000_000));
    let (reg, _) = open(dir.path(), options(Duration::from_secs(120)), sys.clone());
    reg.set_inventory(inventory(gpus, 10 * GI))
        .expect("inventory");
    (dir, sys, reg)
}

fn slice(memory: u64) -> Request {
    Request {
        memory: Some(Quantity::Bytes(memory)),
        ..Request::new(Owner::container())
    }
}

/// What a createRuntime hook books for a container of id `id` whose init is `pid`.
fn whole(reg: &Registry, id: &str, pid: u32, gpu: u32) -> Result<String, RegistryError> {
    let process = reg.process_ref(pid).expect("process");
    let mut req = Request::new(Owner::Container {
        container_id: Some(id.into()),
        process: Some(process),
        kubernetes: None,
    });
    req.whole_gpu = true;
    req.selectors = vec![Selector::Index(gpu)];
    reg.reserve(&req).map(|r| r.id)
}

#[test]
fn a_stopped_containers_release_keeps_a_running_container_of_the_same_id() {
    let (_d, sys, reg) = setup(2);
    // Two runtime roots, one container id.
    sys.spawn(10, 100);
    sys.spawn(20, 200);
    let a = whole(&reg, "same", 10, 0).expect("a");
    let b = whole(&reg, "same", 20, 1).expect("b");
    // The same GPU is not given whole to the second one.
    let e = whole(&reg, "same", 20, 0).expect_err("GPU 0 is a's");
    assert!(e.refusal().is_some(), "{e}");
    // a stops; its poststop releases what it booked, not b's.
    sys.kill(10);
    let out = reg.release_stopped_container("same").expect("release");
    let ids: Vec<&str> = out.reservations.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, [a.as_str()]);
    let file = reg.snapshot().expect("snapshot");
    assert!(
        file.reservation(&b).is_some(),
        "b's GPU was released by a's poststop"
    );
    // Idempotent, and a running container's bookings stay.
    assert!(reg
        .release_stopped_container("same")
        .expect("again")
        .reservations
        .is_empty());
    // A failing createRuntime of b gives back b's own bookings only.
    sys.spawn(30, 300);
    let c = whole(&reg, "same", 30, 0).expect("c");
    let b_process = reg.process_ref(20).expect("b");
    let gone = reg
        .release_container_process("same", &b_process)
        .expect("release b");
    assert_eq!(gone.len(), 1);
    assert_eq!(gone[0].id, b);
    assert!(reg.snapshot().unwrap().reservation(&c).is_some());
}

#[test]
fn the_reserving_process_gives_back_only_its_own_pending_reservations() {
    let (_d, sys, reg) = setup(1);
    sys.spawn(500, 5);
    sys.spawn(600, 6);
    sys.set_current(Some(500));
    let mine = reg.reserve(&slice(GI)).expect("mine");
    assert_eq!(mine.reserved_by.as_ref().map(|p| p.pid), Some(500));
    let bound = reg.reserve(&slice(GI)).expect("mine, then bound");
    sys.spawn(501, 7);
    sys.set_parent(501, 500);
    reg.bind(&bound.id, "c-bound", 501).expect("bind");
    sys.set_current(Some(600));
    let theirs = reg.reserve(&slice(GI)).expect("theirs");
    sys.set_current(Some(500));
    let back = reg.give_back_pending().expect("give back");
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].id, mine.id);
    let file = reg.snapshot().unwrap();
    assert!(file.reservation(&mine.id).is_none());
    assert!(
        file.reservation(&theirs.id).is_some(),
        "another process's slice was released"
    );
    assert_eq!(
        file.reservation(&bound.id).map(|r| r.state),
        Some(ReservationState::Bound)
    );
    // The same pid, another process (its start time differs), gets nothing back.
    sys.set_current(Some(600));
    sys.spawn(600, 66);
    assert!(reg.give_back_pending().expect("none").is_empty());
    assert!(reg.snapshot().unwrap().reservation(&theirs.id).is_some());
}

#[test]
fn only_the_reserving_processs_containers_bind_while_it_runs() {
    let (_d, sys, reg) = setup(1);
    sys.spawn(500, 5);
    sys.set_current(Some(500));
    let r = reg.reserve(&slice(GI)).expect("reserve");
    // Another create (its runtime and init not descended from the reserving wrapper).
    sys.spawn(700, 70);
    sys.spawn(650, 65);
    sys.set_parent(700, 650);
    sys.set_current(Some(650));
    let e = reg.bind(&r.id, "thief", 700).expect_err("foreign bind");
    assert!(matches!(e, RegistryError::NotReserver { .. }), "{e}");
    assert!(e.to_string().contains(&r.id), "{e}");
    assert_eq!(
        reg.snapshot().unwrap().reservation(&r.id).map(|x| x.state),
        Some(ReservationState::Pending)
    );
    // The wrapper's own container: init → runc → wrapper.
    sys.spawn(710, 71);
    sys.spawn(705, 72);
    sys.set_parent(710, 705);
    sys.set_parent(705, 500);
    let b = reg.bind(&r.id, "victim", 710).expect("own bind");
    assert_eq!(b.owner.container_id(), Some("victim"));
    // A reserver that is gone (a precreate hook) no longer restricts the binder.
    sys.set_current(Some(800));
    sys.spawn(800, 80);
    let p = reg.reserve(&slice(GI)).expect("precreate reserve");
    sys.kill(800);
    reg.bind(&p.id, "podman-ctr", 700)
        .expect("bind after the reserver exited");
}

#[test]
fn an_owner_lives_while_its_cgroup_holds_processes() {
    let (_d, sys, reg) = setup(1);
    sys.spawn(900, 9);
    sys.set_cgroup(900, "pids/ctr-900");
    let r = reg.reserve(&slice(8 * GI)).expect("reserve");
    let b = reg.bind(&r.id, "no-pidns", 900).expect("bind");
    assert_eq!(
        b.owner.process().and_then(|p| p.cgroup.as_deref()),
        Some("pids/ctr-900")
    );
    // init exits; `sleep 100 &` it started still runs in the container's cgroup.
    sys.set_populated("pids/ctr-900", true);
    sys.kill(900);
    let reaped = reg.gc().expect("gc").reaped;
    assert!(
        reaped.is_empty(),
        "reaped while its processes run: {reaped:?}"
    );
    let e = reg.reserve(&slice(4 * GI)).expect_err("memory still held");
    assert!(e.refusal().is_some(), "{e}");
    // The pid is reused by an unrelated process: still the container's while it runs.
    sys.spawn(900, 99);
    assert!(reg.gc().expect("gc").reaped.is_empty());
    // The last process leaves the cgroup: now the owner is gone.
    sys.set_populated("pids/ctr-900", false);
    sys.kill(900);
    let reaped = reg.gc().expect("gc").reaped;
    assert_eq!(reaped.len(), 1);
    assert!(matches!(reaped[0].reason, ReapReason::Exited { pid: 900 }));
    reg.reserve(&slice(8 * GI)).expect("memory free again");
}

#[test]
fn an_everyday_operation_does_not_reap_an_owner_whose_cgroup_holds_processes() {
    let (_d, sys, reg) = setup(1);
    sys.spawn(910, 9);
    sys.set_cgroup(910, "unified/ctr-910");
    let r = reg.reserve(&slice(4 * GI)).expect("reserve");
    reg.bind(&r.id, "no-pidns", 910).expect("bind");
    sys.set_populated("unified/ctr-910", true);
    sys.kill(910);
    // reserve probes exits after its write (and under the lock when it does not fit).
    reg.reserve(&slice(GI)).expect("reserve");
    let _ = reg.reserve(&slice(6 * GI));
    assert!(reg.snapshot().unwrap().reservation(&r.id).is_some());
    sys.set_populated("unified/ctr-910", false);
    reg.reserve(&slice(GI)).expect("reserve");
    assert!(reg.snapshot().unwrap().reservation(&r.id).is_none());
}

/// A container put into a cgroup that already holds another process (an engine without a
/// cgroup per container) records no cgroup at bind: that cgroup is not the container's own,
/// so it neither keeps the owner alive nor attributes processes to it. One alone in its
/// cgroup records it.
#[test]
fn a_cgroup_shared_at_bind_is_not_recorded() {
    let (_d, sys, reg) = setup(1);
    sys.spawn(920, 9);
    sys.set_cgroup(920, "user.slice/session-1.scope");
    sys.spawn(921, 9);
    sys.set_cgroup(921, "user.slice/session-1.scope");
    let r = reg.reserve(&slice(GI)).expect("reserve");
    let b = reg.bind(&r.id, "shared", 921).expect("bind");
    assert_eq!(b.owner.process().and_then(|p| p.cgroup.as_deref()), None);
    // Outside the table too: a cgroup marked as holding other processes.
    sys.spawn(930, 9);
    sys.set_cgroup(930, "system.slice/shared.scope");
    sys.set_populated("system.slice/shared.scope", true);
    let r = reg.reserve(&slice(GI)).expect("reserve");
    let b = reg.bind(&r.id, "populated", 930).expect("bind");
    assert_eq!(b.owner.process().and_then(|p| p.cgroup.as_deref()), None);
    sys.spawn(940, 9);
    sys.set_cgroup(940, "system.slice/runc-own.scope");
    let r = reg.reserve(&slice(GI)).expect("reserve");
    let b = reg.bind(&r.id, "own", 940).expect("bind");
    assert_eq!(
        b.owner.process().and_then(|p| p.cgroup.as_deref()),
        Some("system.slice/runc-own.scope")
    );
}

/// The poststop hook's release names a reservation and the stopped container: a container
/// whose spec names someone else's reservation (its annotation and hooks copied, or the
/// slice's CDI device injected) releases nothing, whatever its spec says.
#[test]
fn a_poststop_releases_only_the_slice_its_container_holds() {
    let (_d, sys, reg) = setup(1);
    let held = |id: &str| reg.snapshot().unwrap().reservation(id).is_some();
    let refused = |e: RegistryError, id: &str, holder: &str| {
        let msg = e.to_string();
        assert!(matches!(e, RegistryError::NotReleased { .. }), "{msg}");
        assert!(msg.contains(id) && msg.contains(holder), "{msg}");
        assert!(!msg.contains('\n'), "{msg}");
    };
    // The victim runs with slice R.
    let r = reg.reserve(&slice(GI)).expect("reserve");
    sys.spawn(100, 10);
    reg.bind(&r.id, "victim", 100).expect("bind");
    // A thief's container stops.
    let e = reg
        .release_for_container(&r.id, "thief", Some(200))
        .expect_err("a thief released the victim's slice");
    refused(e, &r.id, "container victim");
    assert!(held(&r.id), "the victim's running slice was released");
    // A container of the same id under another runtime root stops while the victim runs.
    let e = reg
        .release_for_container(&r.id, "victim", None)
        .expect_err("a namesake released the running victim's slice");
    refused(e, &r.id, "container victim");
    assert!(held(&r.id));
    // The victim stops: its own poststop releases it, once.
    sys.kill(100);
    let out = reg
        .release_for_container(&r.id, "victim", Some(100))
        .expect("own release");
    assert_eq!(out.reservations.len(), 1);
    assert!(!held(&r.id));
    assert!(reg
        .release_for_container(&r.id, "victim", None)
        .expect("again")
        .reservations
        .is_empty());

    // Pending: while its reserving process runs, only a hook of its own create releases it.
    sys.spawn(500, 5);
    sys.set_current(Some(500));
    let p = reg.reserve(&slice(GI)).expect("pending");
    sys.spawn(650, 65);
    sys.set_current(Some(650));
    let e = reg
        .release_for_container(&p.id, "thief", Some(700))
        .expect_err("another create released a pending slice");
    refused(e, &p.id, "process 500");
    assert!(held(&p.id));
    sys.spawn(600, 60);
    sys.set_parent(600, 500);
    sys.set_current(Some(600));
    let out = reg
        .release_for_container(&p.id, "mine", None)
        .expect("own create");
    assert_eq!(out.reservations.len(), 1);

    // A claim's booking is released by its unprepare, never by a container's poststop.
    let claim = Owner::DraClaim {
        claim_uid: "u".into(),
        namespace: "ns".into(),
        name: "c".into(),
        members: Vec::new(),
        gone: None,
    };
    let uuid = reg.snapshot().unwrap().inventory.gpus[0].uuid.clone();
    let c = reg
        .reserve_claim(
            &claim,
            &[ClaimShare {
                uuid,
                memory: GI,
                cores: 0,
            }],
        )
        .expect("claim")
        .reservation;
    let e = reg
        .release_for_container(&c.id, "ctr", None)
        .expect_err("a poststop released a claim");
    refused(e, &c.id, "claim ns/c");
    assert!(held(&c.id));
}
