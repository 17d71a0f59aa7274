//! Acceptance 3: processes of one slice share one account; a process killed with SIGKILL
//! gives its memory back at the next allocation; killing processes mid-allocation in a loop
//! never hangs anything.

use crate::common;
use common::*;

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};

/// Starts a probe that allocates up to `max` and holds it; returns it once it reported.
fn holder(node: &SliceNode, max: &str) -> (Child, serde_json::Value) {
    let mut child = node
        .probe(&["alloc", "--chunk", "512Mi", "--max", max, "--hold", "120"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn holder");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read");
    let v =
        serde_json::from_str(line.trim()).unwrap_or_else(|e| panic!("holder said {line:?}: {e}"));
    (child, v)
}

fn sigkill(mut child: Child) {
    // SAFETY: our own child, not yet waited for.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().expect("wait");
}

#[test]
fn two_processes_stay_within_the_limit_and_sigkill_returns_memory() {
    let node = SliceNode::new(&[16 * GIB], &[(4 * GIB, 0)]);
    let (first, v) = holder(&node, "3Gi");
    assert_eq!(u(&v, "total"), 3 * GIB, "{v}");
    let second = run_json(node.probe(&["alloc", "--chunk", "512Mi"]));
    assert_eq!(
        u(&second, "total"),
        GIB,
        "only what is left of the limit: {second}"
    );
    assert_eq!(second["error"], "CUDA_ERROR_OUT_OF_MEMORY");
    sigkill(first);
    let after = run_json(node.probe(&["alloc", "--chunk", "512Mi"]));
    assert_eq!(
        u(&after, "total"),
        4 * GIB,
        "the killed process's memory is usable again: {after}"
    );
}

#[test]
fn killing_processes_mid_allocation_never_hangs_or_leaks() {
    let node = SliceNode::new(&[16 * GIB], &[(4 * GIB, 0)]);
    for round in 0..8u64 {
        let api = if round.is_multiple_of(2) {
            "alloc"
        } else {
            "vmm"
        };
        // Two processes filling and freeing the slice over and over, racing each other for
        // its limit, and a third, started with them, that reports once it has allocated what
        // it could of 1Gi: by then the others are loaded and churning (they never stop), so
        // the kills, at staggered moments after that, land amid allocations and frees.
        let churners: Vec<Child> = (0..2)
            .map(|_| {
                node.probe(&[
                    "alloc", "--chunk", "256Mi", "--api", api, "--rounds", "1000000",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn")
            })
            .collect();
        let (sentinel, held) = holder(&node, "1Gi");
        assert!(u(&held, "total") <= GIB, "round {round}: {held}");
        std::thread::sleep(std::time::Duration::from_millis(5 * round));
        churners.into_iter().for_each(sigkill);
        sigkill(sentinel);
        let v = run_json(node.probe(&["alloc", "--chunk", "1Gi"]));
        assert_eq!(
            u(&v, "total"),
            4 * GIB,
            "round {round}: memory of killed processes not returned: {v}"
        );
    }
}
