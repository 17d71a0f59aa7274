//! Acceptance 3: writers killed with SIGKILL at random points, many times over. The registry
//! file always parses, stays within capacity, and never loses a reservation whose reserve
//! call returned (each child reports an id through its stdout pipe before going on, and
//! announces a release before starting it).

use crate::common;

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::sync::Arc;
use std::time::Duration;

use common::{child_role, inventory, report, spawn_child, state_dir, Rng, GI};
use gpuslice_config::Quantity;
use gpuslice_registry::{
    no_cleanup, read_registry, violations, ClaimShare, Owner, RealSystem, Registry, Request,
    ReservationState, RECORD_FILE,
};

const ROLE: &str = "writer";
const ROUNDS: u64 = 60;
const WRITERS: usize = 3;

fn open(dir: &std::path::Path) -> Registry {
    let options = common::options(Duration::from_secs(3600));
    Registry::open(
        dir,
        options,
        Arc::new(RealSystem::new("/proc")),
        no_cleanup(),
    )
    .expect("open")
}

/// Child: reserves and releases in a tight loop until killed.
#[test]
fn child_writer() {
    let Some(dir) = child_role(ROLE) else { return };
    let reg = open(&dir);
    let mut out = std::io::stdout().lock();
    let mut rng = Rng(u64::from(std::process::id()));
    let mut mine: Vec<String> = Vec::new();
    loop {
        let memory = (1 + rng.below(8)) * (GI / 4);
        let request = Request {
            memory: Some(Quantity::Bytes(memory)),
            cores: rng.below(4) as u8,
            ..Request::new(Owner::container())
        };
        if let Ok(r) = reg.reserve(&request) {
            // Reported before anything else happens: from here on it must survive.
            writeln!(out, "R {}", r.id).expect("report");
            out.flush().expect("flush");
            mine.push(r.id);
        }
        if mine.len() > 4 || (!mine.is_empty() && rng.below(3) == 0) {
            let id = mine.remove(rng.below(mine.len() as u64) as usize);
            writeln!(out, "X {id}").expect("report");
            out.flush().expect("flush");
            reg.release(&id).expect("release");
        }
    }
}

#[test]
fn sigkilled_writers_never_corrupt_or_lose_reservations() {
    let dir = state_dir();
    let reg = open(dir.path());
    reg.set_inventory(inventory(2, 256 * GI))
        .expect("inventory");
    let mut rng = Rng(0x5eed);
    // Ids whose reserve returned and whose release was never started.
    let mut promised: HashSet<String> = HashSet::new();
    let mut kills = 0;
    let mut reported = 0;
    for round in 0..ROUNDS {
        let mut children: Vec<_> = (0..WRITERS)
            .map(|_| spawn_child("crash::child_writer", ROLE, dir.path()))
            .collect();
        let mut readers: Vec<_> = children
            .iter_mut()
            .map(|c| BufReader::new(c.0.stdout.take().expect("stdout")))
            .collect();
        let mut take = |line: &str, promised: &mut HashSet<String>| {
            if let Some(id) = report(line, "R ") {
                reported += 1;
                promised.insert(id.to_string());
            } else if let Some(id) = report(line, "X ") {
                promised.remove(id);
            }
        };
        // Each writer is in its loop once it reports its first reservation...
        for r in &mut readers {
            let mut line = String::new();
            while report(&line, "R ").is_none() {
                line.clear();
                assert!(r.read_line(&mut line).expect("read") > 0, "writer died");
            }
            take(&line, &mut promised);
        }
        // ...then each is killed at its own random moment.
        std::thread::sleep(Duration::from_millis(rng.below(20)));
        for c in &mut children {
            std::thread::sleep(Duration::from_micros(rng.below(3000)));
            c.0.kill().expect("SIGKILL");
            kills += 1;
        }
        for (c, r) in children.iter_mut().zip(readers) {
            c.0.wait().expect("wait");
            for line in r.lines() {
                take(&line.expect("read"), &mut promised);
            }
        }
        let file = read_registry(dir.path())
            .unwrap_or_else(|e| panic!("round {round}: registry does not parse: {e}"));
        for id in &promised {
            assert!(
                file.reservation(id).is_some(),
                "round {round}: reservation {id} was lost"
            );
        }
        let broken = violations(&file, &reg.options().placement);
        assert!(broken.is_empty(), "round {round}: {broken:?}");
        // A reserve call returns only after the reservation's record is written (it is
        // written after the registry lists it, outside the lock), so every promised
        // reservation can be rebuilt; one whose writer died before the record waits for
        // its pending deadline.
        for id in &promised {
            assert!(
                reg.slice_dir(id)
                    .expect("slice dir")
                    .join(RECORD_FILE)
                    .is_file(),
                "round {round}: no record for {id}"
            );
        }
        // Keep room for the next round: release about half of what the dead writers held.
        for r in &file.reservations {
            if rng.below(2) == 0 {
                reg.release(&r.id).expect("release");
                promised.remove(&r.id);
            }
        }
    }
    assert_eq!(kills, ROUNDS as usize * WRITERS);
    // Every writer was killed in its loop, after its first reservation went through.
    assert!(
        reported >= ROUNDS * WRITERS as u64,
        "only {reported} reservations reported"
    );
    // gc sweeps what the kills left (orphan directories, temp files); every slice directory
    // is then listed, and a listed reservation without one is pending: a writer died
    // between listing it and writing its record, so nobody has its id and its pending
    // deadline reaps it.
    let swept = reg.gc().expect("gc").reaped;
    eprintln!(
        "{reported} reservations reported; gc swept {} leftovers",
        swept.len()
    );
    let file = read_registry(dir.path()).expect("parses");
    let mut dirs: Vec<String> = std::fs::read_dir(dir.path().join("slices"))
        .expect("slices")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    dirs.sort();
    let mut ids: Vec<String> = file
        .reservations
        .iter()
        .filter(|r| {
            let has_dir = reg.slice_dir(&r.id).expect("slice dir").exists();
            if !has_dir {
                assert_eq!(r.state, ReservationState::Pending, "{}", r.id);
                assert!(!promised.contains(&r.id), "{} lost its directory", r.id);
            }
            has_dir
        })
        .map(|r| r.id.clone())
        .collect();
    ids.sort();
    assert_eq!(dirs, ids);
    let temps = std::fs::read_dir(dir.path())
        .expect("state dir")
        .filter(|e| {
            e.as_ref()
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .contains(".tmp.")
        })
        .count();
    assert_eq!(temps, 0);
}

/// A claim's booking whose slice directory a crash lost (the plugin killed after
/// `registry.json` listed it and before its record was written, or power lost before the
/// new directory's entry reached the disk) is prepared again: the repeated prepare gets the
/// same booking back and its record and directory with it, so its slice files can be
/// written.
#[test]
fn a_claim_prepared_again_after_its_slice_directory_was_lost_gets_it_back() {
    let dir = state_dir();
    let reg = open(dir.path());
    reg.set_inventory(inventory(1, 16 * GI)).expect("inventory");
    let owner = Owner::DraClaim {
        claim_uid: "uid-lost".into(),
        namespace: "ns".into(),
        name: "lost".into(),
        members: Vec::new(),
        gone: None,
    };
    let uuid = reg.snapshot().expect("snapshot").inventory.gpus[0]
        .uuid
        .clone();
    let shares = [ClaimShare {
        uuid,
        memory: 2 * GI,
        cores: 10,
    }];
    let first = reg.reserve_claim(&owner, &shares).expect("prepare");
    assert!(first.created);
    let id = first.reservation.id.clone();
    let slice = reg.slice_dir(&id).expect("slice dir");
    std::fs::remove_dir_all(&slice).expect("the crash takes the directory");

    let again = reg.reserve_claim(&owner, &shares).expect("prepare again");
    assert!(!again.created, "a second booking was made");
    assert_eq!(again.reservation.id, id);
    let record = std::fs::read_to_string(slice.join(RECORD_FILE)).expect("record written again");
    assert!(record.contains(&id), "{record}");
    std::fs::write(slice.join("limits.json"), b"{}").expect("the slice files can be written");
    // Still the one booking, and `gc --rebuild` would find it from its record.
    let file = read_registry(dir.path()).expect("parses");
    assert_eq!(file.reservations.len(), 1);
    assert_eq!(reg.gc().expect("gc").reaped, Vec::new());

    // A directory that cannot be made again fails the prepare and keeps the booking: it is
    // the claim's, and the kubelet's next try makes it.
    std::fs::remove_dir_all(&slice).expect("remove");
    std::fs::write(&slice, b"in the way").expect("a file in its place");
    let e = reg
        .reserve_claim(&owner, &shares)
        .expect_err("prepared without a directory");
    assert!(e.to_string().contains(&id), "{e}");
    assert_eq!(
        read_registry(dir.path())
            .expect("parses")
            .reservations
            .len(),
        1
    );
    std::fs::remove_file(&slice).expect("remove");
    let again = reg.reserve_claim(&owner, &shares).expect("prepare again");
    assert_eq!((again.created, again.reservation.id), (false, id));
    assert!(slice.join(RECORD_FILE).is_file());
}
