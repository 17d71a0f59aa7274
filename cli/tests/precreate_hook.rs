//! `gpuslice hook precreate` through the binary: an edited spec that cannot be written back
//! to the engine (its end of stdout closed: EPIPE) fails the hook and gives the reservation
//! back at once, not at `registry.pending_timeout`; a node without its cached CDI spec fails
//! the create with one line naming the command that makes it.

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

#[test]
fn a_node_without_its_cached_spec_is_named_once_with_the_command_that_makes_it() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = node(dir.path());
    std::fs::remove_file(dir.path().join("state/cdi-node.json")).unwrap();
    // The create goes on to fail at its createRuntime hook (`hook fail`, which prints the
    // reason after one `gpuslice: `), where the engine shows it.
    let out = precreate(&cfg, Stdio::piped());
    assert!(out.status.success(), "{out:?}");
    let edited: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let args = &edited["hooks"]["createRuntime"][0]["args"];
    assert_eq!(args[4], "fail", "{edited}");
    let reason = args[5].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("no node CDI spec cached: ")
            && reason.ends_with("; run `gpuslice cdi generate` on this node first"),
        "{reason}"
    );
    // One prefix on the hook's own line, as docs/troubleshooting.md heads it.
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim_end(), format!("gpuslice: {reason}"));
}
