//! `gpuslice hook precreate` through the binary: an edited spec that cannot be written back
//! to the engine (its end of stdout closed: EPIPE) fails the hook and gives the reservation
//! back at once, not at `registry.pending_timeout`.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use gpuslice_registry::read_registry;

/// A node of two simulated 10Gi GPUs; returns the config file.
fn node(dir: &Path) -> std::path::PathBuf {
    crate::sim_node::node(
        dir,
        "[inventory]\nsource = \"simulated\"\n[[inventory.simulated]]\nmemory = \"10Gi\"\n[[inventory.simulated]]\nmemory = \"10Gi\"\n",
    )
}

/// `gpuslice hook precreate` on a spec asking for 4Gi, its stdout `stdout`.
fn precreate(cfg: &Path, stdout: Stdio) -> Output {
    let spec = br#"{"ociVersion":"1.0.2","process":{"args":["true"],"env":[]},"root":{"path":"rootfs"},"annotations":{"gpuslice.io/memory":"4Gi"}}"#;
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .arg("--config")
        .arg(cfg)
        .args(["hook", "precreate"])
        .env_remove("GPUSLICE_CONFIG")
        .stdin(Stdio::piped())
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(spec).unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn a_spec_the_engine_stops_reading_gives_its_slice_back() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = node(dir.path());
    let state = dir.path().join("state");
    // The engine reads: the spec comes back edited and the slice stays pending for it.
    let read = precreate(&cfg, Stdio::piped());
    assert!(
        read.status.success(),
        "{}",
        String::from_utf8_lossy(&read.stderr)
    );
    assert!(String::from_utf8_lossy(&read.stdout).contains("gpuslice.io/reservation"));
    let pending = read_registry(&state).unwrap().reservations;
    assert_eq!(pending.len(), 1, "{pending:?}");

    // The engine stopped reading: the hook fails and its own reservation goes, the other
    // create's stays.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = precreate(&cfg, Stdio::from(writer));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot write the edited spec to stdout"),
        "{err}"
    );
    let left = read_registry(&state).unwrap().reservations;
    assert_eq!(
        left.iter().map(|r| &r.id).collect::<Vec<_>>(),
        [&pending[0].id],
        "the unwritten spec's reservation was left pending"
    );
}
