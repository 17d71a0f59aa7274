//! Shared set-up of the probe's integration tests: a simulated node in a temp dir with the
//! simulated libraries installed under their sonames, and a runner for the probe binary.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;

pub use gpuslice_sim_core::testing::SimFixture;

pub const GIB: u64 = 1 << 30;

/// The simulated libraries: `GPUSLICE_SIM_LIB_DIR`'s (scripts/test.sh: the release build), else
/// built once per test binary.
pub fn built_libs() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        gpuslice_sim_core::testing::sim_lib_dir().expect("build the simulated driver libraries")
    })
}

/// A node with `gpus` H200-like GPUs of `memory` bytes, libraries installed.
pub fn node(gpus: usize, memory: u64) -> SimFixture {
    let node = SimFixture::new(&vec![("NVIDIA H200", memory); gpus]);
    gpuslice_sim_core::testing::copy_sim_libs(built_libs(), &node.lib_dir())
        .expect("install libraries");
    node
}

/// The probe with `--json` and `args`, on `node`.
pub fn probe(node: &SimFixture, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpuslice-probe"));
    node.apply(&mut cmd);
    cmd.arg("--json").args(args);
    cmd
}

/// Runs the probe to completion.
pub fn run(node: &SimFixture, args: &[&str]) -> Output {
    probe(node, args).output().expect("run gpuslice-probe")
}

/// Runs the probe, expects success and one JSON line; returns it.
pub fn json(node: &SimFixture, args: &[&str]) -> serde_json::Value {
    let out = run(node, args);
    assert!(
        out.status.success(),
        "gpuslice-probe {args:?} failed: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(text.lines().next().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {text:?}"))
}

/// Starts the probe in the background (stdout piped).
pub fn spawn(node: &SimFixture, args: &[&str]) -> Child {
    probe(node, args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn gpuslice-probe")
}

/// Reads the first JSON line of a running probe (it prints before holding).
pub fn first_line(child: &mut Child) -> serde_json::Value {
    use std::io::BufRead;
    let stdout = child.stdout.as_mut().expect("piped stdout");
    let mut line = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read probe output");
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
}

pub fn u(v: &serde_json::Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} missing in {v}"))
}

pub fn f(v: &serde_json::Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} missing in {v}"))
}
