//! `gpuslice hook precreate` through the binary: an edited spec that cannot be written back
//! to the engine (its end of stdout closed: EPIPE) fails the hook and gives the reservation
//! back at once, not at `registry.pending_timeout`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use gpuslice_agent::nodespec::node_spec;
use gpuslice_cdi::DeviceNode;
use gpuslice_hook::create::driveredits::DriverEdits;
use gpuslice_hook::node::NodeContext;
use gpuslice_hook::specfiles::NODE_SPEC_CACHE;
use gpuslice_registry::{read_registry, Inventory};

use crate::specs_schema::gpus;

/// A node of two simulated GPUs, its inventory cached and its node spec written as `cdi
/// generate` leaves them; returns the config file.
fn node(dir: &Path) -> std::path::PathBuf {
    let shim = dir.join("libgpuslice_shim.so");
    std::fs::write(&shim, b"shim").unwrap();
    let cfg = dir.join("config.toml");
    std::fs::write(
        &cfg,
        format!(
            "state_dir = \"{}\"\n[cdi]\nspec_dir = \"{}\"\n[shim]\nlibrary = \"{}\"\n[hook]\npath = \"{}\"\n[inventory]\nsource = \"simulated\"\n[[inventory.simulated]]\nmemory = \"10Gi\"\n[[inventory.simulated]]\nmemory = \"10Gi\"\n",
            dir.join("state").display(),
            dir.join("cdi").display(),
            shim.display(),
            env!("CARGO_BIN_EXE_gpuslice"),
        ),
    )
    .unwrap();
    let n = NodeContext::from_loaded(gpuslice_config::load_config(Some(&cfg), None).unwrap());
    let config = n.config().clone();
    std::fs::create_dir_all(&config.state_dir).unwrap();
    let dev = |name: &str, major: i64, minor: i64| {
        DeviceNode::char_device(format!("/dev/{name}"), major, minor)
    };
    let driver = DriverEdits {
        control: vec![dev("nvidiactl", 195, 255)],
        gpus: BTreeMap::from([(0, dev("nvidia0", 195, 0)), (1, dev("nvidia1", 195, 1))]),
        mounts: Vec::new(),
    };
    let spec = node_spec(&n, &n.hook_binary().unwrap(), &gpus(), &driver).unwrap();
    gpuslice_cdi::write_spec_compact_as(&config.state_dir, NODE_SPEC_CACHE, &spec).unwrap();
    n.open_registry()
        .unwrap()
        .set_inventory(Inventory { gpus: gpus() })
        .unwrap();
    cfg
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
