//! Helpers shared by the registry's integration tests: a simulated inventory and registries
//! opened in throwaway state directories (on tmpfs when there is one, as on a node).

#![allow(dead_code, clippy::expect_used, clippy::unwrap_used)]

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuslice_config::{PlacementConfig, Policy};
use gpuslice_registry::{Cleanup, Gpu, Inventory, Options, Registry, Reservation, System};

pub const GI: u64 = 1 << 30;

/// `n` GPUs of `memory` bytes, model "NVIDIA H200".
pub fn inventory(n: u32, memory: u64) -> Inventory {
    Inventory {
        gpus: (0..n)
            .map(|i| Gpu {
                index: i,
                uuid: format!("GPU-{i:08x}-1111-2222-3333-444444444444"),
                model: "NVIDIA H200".into(),
                memory_total: memory,
                minor: i,
                pci_bus_id: Some(format!("0000:{:02x}:00.0", i + 1)),
                numa_node: Some(0),
                pcie_root: None,
            })
            .collect(),
    }
}

/// A temp dir on tmpfs when available (fsync there is cheap, as on a node's /run).
pub fn state_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::Builder::new()
            .prefix("gpuslice-registry-test")
            .tempdir_in(shm)
            .expect("tempdir")
    } else {
        tempfile::tempdir().expect("tempdir")
    }
}

pub fn options(pending_timeout: Duration) -> Options {
    Options {
        placement: PlacementConfig {
            policy: Policy::Binpack,
            memory_overcommit: 1.0,
            max_slices_per_gpu: None,
        },
        pending_timeout,
        recheck_interval: Options::DEFAULT_RECHECK,
    }
}

/// Ids passed to the cleanup callback, in order.
pub type CleanedUp = Arc<Mutex<Vec<String>>>;

pub fn recording_cleanup() -> (Cleanup, CleanedUp) {
    let seen: CleanedUp = Arc::default();
    let s = seen.clone();
    (
        Box::new(move |r: &Reservation| s.lock().unwrap().push(r.id.clone())),
        seen,
    )
}

pub fn open(dir: &Path, options: Options, system: Arc<dyn System>) -> (Registry, CleanedUp) {
    let (cleanup, seen) = recording_cleanup();
    (
        Registry::open(dir, options, system, cleanup).expect("open registry"),
        seen,
    )
}

/// Environment variable that selects a child role when a test binary re-executes itself.
pub const ROLE_ENV: &str = "GPUSLICE_REGISTRY_TEST_ROLE";
/// Environment variable carrying the state directory to a child.
pub const DIR_ENV: &str = "GPUSLICE_REGISTRY_TEST_DIR";

/// The state directory when this process runs as child `role`; `None` in a normal run.
pub fn child_role(role: &str) -> Option<std::path::PathBuf> {
    if std::env::var(ROLE_ENV).ok()?.as_str() != role {
        return None;
    }
    std::env::var_os(DIR_ENV).map(std::path::PathBuf::from)
}

/// Re-executes this test binary running only test `test_name` as child `role`, with piped
/// stdin and stdout.
pub fn spawn_child(test_name: &str, role: &str, dir: &Path) -> KillOnDrop {
    let child = std::process::Command::new(std::env::current_exe().expect("current exe"))
        .args(["--exact", test_name, "--nocapture", "--test-threads=1"])
        .env(ROLE_ENV, role)
        .env(DIR_ENV, dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("spawn child");
    KillOnDrop(child)
}

/// A child process killed (and waited for) if the test ends early.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// The payload of a child's report line: what follows `marker` (libtest may print its own
/// text on the same line).
pub fn report<'a>(line: &'a str, marker: &str) -> Option<&'a str> {
    line.find(marker)
        .map(|i| line[i + marker.len()..].trim_end())
}

/// A small deterministic generator for test schedules (SplitMix64).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}
