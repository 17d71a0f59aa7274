//! A GPU whose driver reserves memory (`inventory.simulated[].reserved_memory`, as real
//! GPUs do): the inventory `gpuslice cdi generate` caches books NVML's total less the
//! reserved memory, `status --json` shows that as `memory_total`, and slices are booked up
//! to exactly that and no further.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

const MIB: u64 = 1 << 20;
/// 10Gi less 512Mi reserved.
const BOOKABLE: u64 = 9728 * MIB;

/// A node of one simulated 10Gi GPU with 512Mi reserved; returns the config file.
fn node(dir: &Path) -> std::path::PathBuf {
    crate::sim_node::node(
        dir,
        "[inventory]\nsource = \"simulated\"\n[[inventory.simulated]]\nmemory = \"10Gi\"\nreserved_memory = \"512Mi\"\n",
    )
}

fn gpuslice(cfg: &Path, args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .arg("--config")
        .arg(cfg)
        .args(args)
        .env_remove("GPUSLICE_CONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

/// `gpuslice hook precreate` on a spec asking for `memory` of the GPU: whether it booked a
/// slice (a refusal comes back as a spec whose createRuntime hook fails the container).
fn books(cfg: &Path, memory: &str) -> bool {
    let out = precreate(cfg, memory);
    assert!(out.status.success(), "{memory}: {out:?}");
    let booked = String::from_utf8_lossy(&out.stdout).contains("gpuslice.io/reservation");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(booked || err.contains("no GPU fits"), "{memory}: {err}");
    booked
}

fn precreate(cfg: &Path, memory: &str) -> Output {
    let spec = format!(
        r#"{{"ociVersion":"1.0.2","process":{{"args":["true"],"env":[]}},"root":{{"path":"rootfs"}},"annotations":{{"gpuslice.io/memory":"{memory}"}}}}"#
    );
    gpuslice(cfg, &["hook", "precreate"], spec.as_bytes())
}

fn status(cfg: &Path) -> Value {
    let out = gpuslice(cfg, &["status", "--json"], b"");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn slices_are_booked_up_to_the_total_less_the_reserved_memory() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = node(dir.path());
    let s = status(&cfg);
    assert_eq!(s["gpus"][0]["memory_total"].as_u64(), Some(BOOKABLE), "{s}");

    // One MiB past what CUDA can allocate is refused; nothing is booked.
    assert!(!books(&cfg, "9729Mi"));
    assert_eq!(
        status(&cfg)["reservations"].as_array().map(Vec::len),
        Some(0)
    );

    // Exactly the bookable memory, in two slices, fits.
    assert!(books(&cfg, "9216Mi"));
    assert!(books(&cfg, "512Mi"));
    let s = status(&cfg);
    assert_eq!(
        s["gpus"][0]["memory_allocated"].as_u64(),
        Some(BOOKABLE),
        "{s}"
    );

    // And no further: the reserved memory is never promised.
    assert!(!books(&cfg, "1Mi"));
    assert_eq!(
        status(&cfg)["reservations"].as_array().map(Vec::len),
        Some(2)
    );
}
