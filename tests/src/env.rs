//! Where the binaries under test are, the root check and the host-wide test lock.

use std::path::{Path, PathBuf};

/// The workspace root (parent of this crate).
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// Directory of the built binaries: `GPUSLICE_TEST_BIN_DIR`, else `target/release` or
/// `target/debug`, whichever holds `gpuslice`.
pub fn bin_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("GPUSLICE_TEST_BIN_DIR") {
        return PathBuf::from(d);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"));
    for profile in ["release", "debug"] {
        let d = target.join(profile);
        if d.join("gpuslice").exists() {
            return d;
        }
    }
    target.join("release")
}

/// A built binary or library; panics with the build command when it is missing.
pub fn bin(name: &str) -> PathBuf {
    let p = bin_dir().join(name);
    assert!(p.exists(), "{} is missing: build first with `cargo build --release --workspace` (or ./scripts/build.sh)", p.display());
    p
}

/// A file of the portable (old-glibc) build in `target/portable`.
pub fn portable(name: &str) -> PathBuf {
    let dir = std::env::var_os("GPUSLICE_TEST_PORTABLE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/portable"));
    let p = dir.join(name);
    assert!(
        p.exists(),
        "{} is missing: build it with ./scripts/build-portable.sh",
        p.display()
    );
    p
}

/// Fails the test unless it runs as root (the README's test command runs as root).
pub fn require_root() {
    assert!(
        rustix::process::geteuid().is_root(),
        "end-to-end tests start real containers and need root; run ./scripts/test.sh as root"
    );
}

/// Holds the host-wide e2e lock until dropped.
#[derive(Debug)]
pub struct Serial {
    _file: std::fs::File,
}

/// Takes the host-wide e2e lock (every e2e test shares `/var/run/cdi` and the engines).
pub fn serial() -> Serial {
    require_root();
    std::fs::create_dir_all("/run/lock").ok();
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open("/run/lock/gpuslice-e2e.lock")
        .unwrap_or_else(|e| panic!("cannot open /run/lock/gpuslice-e2e.lock: {e}"));
    rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)
        .unwrap_or_else(|e| panic!("cannot lock /run/lock/gpuslice-e2e.lock: {e}"));
    Serial { _file: file }
}
