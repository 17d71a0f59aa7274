//! Costs the create path pays for CDI: injecting a slice spec into a podman config.json
//! (against the parse + serialise a wrapper does anyway), writing the per-slice spec
//! atomically, and reading it back. Medians of many runs; no external bench harness.
//!
//! Run: `cargo bench -p gpuslice-cdi --bench cdi`

#![allow(clippy::expect_used, clippy::unwrap_used)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::hint::black_box;
use std::time::{Duration, Instant};

use gpuslice_cdi::{inject_with, read_spec, remove_spec, write_transient_spec};

const RID: &str = "3f9a0c1d2e4b5a69";

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn measure(runs: usize, mut f: impl FnMut()) -> Duration {
    for _ in 0..runs / 10 {
        f();
    }
    median(
        (0..runs)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed()
            })
            .collect(),
    )
}

fn main() {
    let config = include_str!("../tests/fixtures/podman-config.json");
    let spec = support::slice_spec(RID);
    let stat = support::FakeStat::nvidia();

    let baseline = measure(5000, || {
        let v: serde_json::Value = serde_json::from_str(black_box(config)).unwrap();
        black_box(serde_json::to_vec(&v).unwrap());
    });
    let with_inject = measure(5000, || {
        let mut v: serde_json::Value = serde_json::from_str(black_box(config)).unwrap();
        inject_with(&mut v, black_box(&spec), &[RID], &stat).unwrap();
        black_box(serde_json::to_vec(&v).unwrap());
    });
    // On a node /var/run/cdi is on tmpfs; /dev/shm stands in for it (in this build
    // container /run is on disk, where fsync alone costs milliseconds).
    let dir = ["/dev/shm", "/run"]
        .into_iter()
        .find_map(|d| tempfile::tempdir_in(d).ok())
        .unwrap_or_else(|| tempfile::tempdir().unwrap());
    let write = measure(500, || {
        black_box(write_transient_spec(dir.path(), &spec, RID).unwrap());
    });
    let path = write_transient_spec(dir.path(), &spec, RID).unwrap();
    let read = measure(5000, || {
        black_box(read_spec(&path).unwrap());
    });
    remove_spec(&path).unwrap();

    println!("parse + serialise podman config.json:          {baseline:?}");
    println!("parse + inject slice spec + serialise:          {with_inject:?}");
    println!(
        "  ratio with/without inject:                    {:.2}",
        with_inject.as_secs_f64() / baseline.as_secs_f64()
    );
    println!(
        "  inject alone (difference):                    {:?}",
        with_inject.saturating_sub(baseline)
    );
    println!(
        "write_transient_spec (atomic, fsync) in {}: {write:?}",
        dir.path()
            .parent()
            .map_or("?".into(), |p| p.display().to_string())
    );
    println!("read_spec (parse + validate):                   {read:?}");
}
