//! Benchmark: the kubelet's NodePrepareResources for one claim, from the call to the answer,
//! over the plugin's unix socket, with the plugin reading the claim over HTTP from the tests'
//! FAKE API server (no control plane here) and booking in a real registry (flock, fsync,
//! rename). The claim's files are written by a stand-in writer that writes and fsyncs one
//! file (the real writer, in the `gpuslice` crate, writes the limits, usage and CDI spec
//! files the same way). Each round unprepares again.
//!
//!     cargo run --release -p gpuslice-kube --example bench_prepare [ROUNDS]
//!
//! The state dir is under $BENCH_DIR (default: the temp dir; use a tmpfs such as /run to
//! match a node's /run/gpuslice).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark: a failed step ends it

#[path = "../tests/support/mod.rs"]
mod support;

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuslice_fakeapi::FakeApi;
use gpuslice_kube::{claim_device_id, SliceWriter, WriteError};
use gpuslice_registry::Reservation;
use support::{claim, Kubelet, Node};

/// Writes and fsyncs one file per claim.
struct SyncedWriter(std::path::PathBuf);

impl SliceWriter for SyncedWriter {
    fn write(&self, uid: &str, r: &Reservation) -> Result<Vec<String>, WriteError> {
        let mut f = std::fs::File::create(self.0.join(uid))
            .map_err(|e| WriteError::Failed(e.to_string()))?;
        f.write_all(&serde_json::to_vec(r).unwrap()).unwrap();
        f.sync_all()
            .map_err(|e| WriteError::Failed(e.to_string()))?;
        Ok(vec![claim_device_id(uid)])
    }

    fn remove(&self, uid: &str) -> Result<(), WriteError> {
        let _ = std::fs::remove_file(self.0.join(uid));
        Ok(())
    }
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .map_or(300, |a| a.parse().expect("ROUNDS"));
    if let Ok(d) = std::env::var("BENCH_DIR") {
        std::env::set_var("TMPDIR", d);
    }
    let api = FakeApi::start();
    let kc_dir = tempfile::tempdir().unwrap();
    let mut node = Node::new(
        "node-a",
        &[80, 80, 80, 80, 80, 80, 80, 80],
        api.kubeconfig(kc_dir.path()),
    );
    node.options.cleanup_interval = Duration::from_secs(3600);
    node.options.publish_interval = Duration::from_secs(1);
    let files = node.dir.path().join("bench-cdi");
    std::fs::create_dir_all(&files).unwrap();
    let writer: Arc<dyn SliceWriter> = Arc::new(SyncedWriter(files));
    let running = node.start_with(writer);
    let k = Kubelet::connect(&running);
    // 100 other claims prepared first: the registry holds what a busy node holds.
    for i in 0..100 {
        let uid = format!("bg-{i}");
        api.put_claim(&claim(
            "ns",
            &uid,
            &uid,
            &[("gpu", "node-a", &format!("gpu-{}", i % 8), "512Mi", "1")],
        ));
        assert_eq!(k.prepare(&[("ns", &uid, &uid)]).claims[&uid].error, "");
    }
    api.put_claim(&claim(
        "ns",
        "c",
        "uid-c",
        &[("gpu", "node-a", "gpu-3", "20Gi", "30")],
    ));
    let mut times = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        let r = k.prepare(&[("ns", "c", "uid-c")]);
        times.push(t.elapsed());
        assert_eq!(r.claims["uid-c"].error, "");
        assert_eq!(
            k.unprepare(&[("ns", "c", "uid-c")]).claims["uid-c"].error,
            ""
        );
    }
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let p = |q: f64| times[((times.len() as f64 * q) as usize).min(times.len() - 1)];
    println!(
        "prepare of one claim, {rounds} rounds, 100 other claims booked: median {:.2} ms, p99 {:.2} ms, min {:.2} ms, max {:.2} ms",
        ms(p(0.5)),
        ms(p(0.99)),
        ms(times[0]),
        ms(times[times.len() - 1])
    );
    drop(k);
    running.stop().unwrap();
}
