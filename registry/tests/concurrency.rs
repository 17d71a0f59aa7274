//! Acceptance 2: 64 real processes reserve 1 GiB at once on a node of 2 GPUs × 10 GiB.
//! Exactly 20 succeed, the other 44 get the free-capacity refusal, and once the winners
//! release (concurrently too) the registry is empty.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::sync::Arc;
use std::time::Duration;

use common::{child_role, inventory, report, spawn_child, state_dir, GI};
use gpuslice_config::Quantity;
use gpuslice_registry::{
    no_cleanup, read_registry, violations, Owner, RealSystem, Registry, Request,
};

const PROCESSES: usize = 64;
const ROLE: &str = "reserver";

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

/// Child: waits for `go`, reserves 1 GiB, reports, waits for `release`, releases.
#[test]
fn child_reserver() {
    let Some(dir) = child_role(ROLE) else { return };
    let reg = open(&dir);
    let mut stdin = std::io::stdin().lock();
    let mut line = String::new();
    stdin.read_line(&mut line).expect("go");
    let request = Request {
        memory: Some(Quantity::Bytes(GI)),
        ..Request::new(Owner::container())
    };
    let id = match reg.reserve(&request) {
        Ok(r) => {
            println!("RESULT ok {}", r.id);
            Some(r.id)
        }
        Err(e) => {
            println!("RESULT err {e}");
            None
        }
    };
    std::io::stdout().flush().expect("flush");
    line.clear();
    stdin.read_line(&mut line).expect("release");
    if let Some(id) = id {
        let n = reg.release(&id).expect("release").reservations.len();
        println!("RELEASED {n}");
    }
}

#[test]
fn sixty_four_processes_race_for_twenty_slices() {
    let dir = state_dir();
    let reg = open(dir.path());
    reg.set_inventory(inventory(2, 10 * GI)).expect("inventory");

    let mut children: Vec<_> = (0..PROCESSES)
        .map(|_| spawn_child("concurrency::child_reserver", ROLE, dir.path()))
        .collect();
    let mut readers: Vec<_> = children
        .iter_mut()
        .map(|c| BufReader::new(c.0.stdout.take().expect("stdout")))
        .collect();
    // All are started and waiting; let them go together.
    for c in &mut children {
        c.0.stdin
            .as_mut()
            .expect("stdin")
            .write_all(b"go\n")
            .expect("go");
    }
    let mut ok = Vec::new();
    let mut refused = Vec::new();
    for r in &mut readers {
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                r.read_line(&mut line).expect("read") > 0,
                "child ended without a result"
            );
            if let Some(rest) = report(&line, "RESULT ") {
                match rest.split_once(' ') {
                    Some(("ok", id)) => ok.push(id.to_string()),
                    Some(("err", msg)) => refused.push(msg.to_string()),
                    _ => panic!("bad report {line:?}"),
                }
                break;
            }
        }
    }
    assert_eq!(ok.len(), 20, "successes; refusals: {refused:?}");
    assert_eq!(refused.len(), PROCESSES - 20);
    for msg in &refused {
        assert_eq!(
            msg,
            "no GPU fits 1Gi memory: free per GPU: 0 (NVIDIA H200) 0 B, 100% cores; 1 (NVIDIA H200) 0 B, 100% cores"
        );
    }
    let file = read_registry(dir.path()).expect("parses");
    assert_eq!(file.reservations.len(), 20);
    assert!(violations(&file, &reg.options().placement).is_empty());
    let mut ids: Vec<String> = file.reservations.iter().map(|r| r.id.clone()).collect();
    ids.sort();
    ok.sort();
    assert_eq!(ids, ok);
    assert_eq!(file.counters.refused_total.get("no-fit"), Some(&44));

    // The winners release concurrently.
    for c in &mut children {
        c.0.stdin
            .as_mut()
            .expect("stdin")
            .write_all(b"release\n")
            .expect("release");
    }
    for c in &mut children {
        assert!(c.0.wait().expect("wait").success());
    }
    let file = read_registry(dir.path()).expect("parses");
    assert!(file.reservations.is_empty(), "{:?}", file.reservations);
    assert_eq!(file.counters.released_total, 20);
    let left = std::fs::read_dir(dir.path().join("slices"))
        .expect("slices")
        .count();
    assert_eq!(left, 0, "slice directories left behind");
}
