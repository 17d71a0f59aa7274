//! Where the binaries under test are, the root check, and the host-wide test locks.
//!
//! The e2e tests are modules of one test binary, so libtest runs them on several threads at
//! once, and a second test process may run beside it. What keeps them apart are `flock`s on
//! files in `/run/lock` (each call opens its own file description, so threads of one process
//! exclude each other as two processes do):
//!
//! - the machine lock, `/run/lock/gpuslice-e2e.lock`: [`serial`] takes it exclusively, for a
//!   test that needs the machine alone (it measures time or compute shares, or starts so much
//!   that anything beside it would make it flaky); [`lock`] takes it shared, so every test
//!   that holds a lock keeps a [`serial`] test waiting. `scripts/check-deb.sh` takes the same
//!   file exclusively.
//! - one lock per [`Resource`], `/run/lock/gpuslice-e2e.<name>.lock`: [`lock`] takes the
//!   named ones exclusively, after the machine lock and in the order of [`Resource`], so two
//!   tests never wait on each other in a cycle. [`Resource::KubeNode`] has [`KUBE_NODE_SLOTS`]
//!   lock files, one per slot; a test holds whichever one it got, last of its locks.

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::fs::FlockOperation;

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

/// The previous release's binaries, for the upgrade tests: `GPUSLICE_PREVIOUS_BIN_DIR` (what
/// scripts/test.sh exported from scripts/previous-build.sh), else what that script builds
/// (once, cached by commit) and prints.
pub fn previous_release_bins() -> PathBuf {
    if let Some(d) = std::env::var_os("GPUSLICE_PREVIOUS_BIN_DIR") {
        return PathBuf::from(d);
    }
    let script = workspace().join("scripts/previous-build.sh");
    let out = std::process::Command::new(&script)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(out.status.success(), "{} failed", script.display());
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// The previous release's Helm chart, which scripts/previous-build.sh keeps beside its
/// binaries (`<commit>/chart` beside `<commit>/bin`).
pub fn previous_release_chart() -> PathBuf {
    let bins = previous_release_bins();
    let chart = bins.parent().unwrap_or(&bins).join("chart");
    assert!(
        chart.join("Chart.yaml").is_file(),
        "{} holds no chart: run scripts/previous-build.sh, which keeps it beside {}",
        chart.display(),
        bins.display()
    );
    chart
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

/// A host-wide resource that some e2e tests use and no two may use at once. [`lock`] holds
/// `/run/lock/gpuslice-e2e.<name>.lock` for each one named; anything a test uses that is not
/// listed here is its own (temporary directories, free ports, unique container ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resource {
    /// The host's CDI directories, `/var/run/cdi` and `/etc/cdi`. [`TestNode::new`] and
    /// [`TestNode::with`] publish their node spec to `/var/run/cdi` under a fixed name
    /// (`gpuslice.io-gpu.json`, removed when the node is dropped) and their slices' specs
    /// beside it; a node's `leftovers()` and `gpuslice gc` look at every slice spec there,
    /// and podman reads every spec in both. A node made with [`TestNode::with_models`] has a
    /// CDI directory of its own and needs no lock for it.
    ///
    /// [`TestNode::new`]: crate::TestNode::new
    /// [`TestNode::with`]: crate::TestNode::with
    /// [`TestNode::with_models`]: crate::TestNode::with_models
    Cdi,
    /// podman's global state: its storage and containers (`/var/lib/containers`,
    /// `/run/containers`, `/run/libpod`), the test image imported into it once
    /// (`localhost/gpuslice-e2e:1`, [`crate::image::podman_image`]), the tests' container
    /// names, and `target/e2e/containers.conf`, rewritten by every
    /// [`crate::podman::Podman::new`].
    Podman,
    /// The private containerd of [`crate::cri::Containerd`]: its state, sockets and runc root
    /// under the fixed [`crate::cri::RUN_DIR`], wiped when one is made and when it is
    /// dropped.
    CriContainerd,
    /// runc's state of containerd's namespace `gpuslice-e2e`,
    /// `/run/containerd/runc/gpuslice-e2e` (tests/tests/containerd.rs): the harness there
    /// force-deletes every container in it when dropped.
    CtrNamespace,
    /// nerdctl's containerd namespace `gpuslice-nerdctl-e2e` (tests/tests/nerdctl.rs): runc's
    /// state in `/run/containerd/runc/gpuslice-nerdctl-e2e`, whose containers the harness
    /// force-deletes when dropped, and the parent cgroups
    /// `/sys/fs/cgroup/*/gpuslice-nerdctl-e2e`, which it removes.
    NerdctlNamespace,
    /// A Kubernetes cluster with nodes (`scripts/kube-cluster.sh up DIR --node NAME …`,
    /// [`crate::kube_node::KubeNode`], [`crate::kube_node::KubeNodes`]), whatever its number
    /// of nodes: a test takes this once for all of them. Unlike the others it is
    /// [`KUBE_NODE_SLOTS`] locks, one per slot of the cluster script (`GPUSLICE_KUBE_SLOT`,
    /// scripts/kube-cluster.sh --help): [`lock`] takes whichever is free (waiting for the
    /// first that frees when none is) and the clusters this thread starts run in that slot
    /// ([`kube_slot`]). What a cluster holds of the host, all removed by `down`, is named and
    /// addressed per slot so that clusters of two slots run side by side: the CNI bridges
    /// and their subnets (slot 0: `gskube0`, `gskube1`, … on 10.244.77.0/24,
    /// 10.244.78.0/24, …), the kubelets' cgroups (slot 0: `/sys/fs/cgroup/*/kubepods` and
    /// `/sys/fs/cgroup/*/gpuslice-node-*`), containerd's default NRI socket (slot 0's first
    /// node only), the cluster DNS address (slot 0: 10.244.0.10, port 53, on the loopback
    /// link); `--kubeflow`'s and `--kueue`'s operators read their certificates from the
    /// compiled-in paths `/tmp/k8s-webhook-server/serving-certs` and
    /// `/etc/kueue/metrics/certs` in mount namespaces of their own. Everything else of a
    /// cluster is in its directory, on free ports, or killed by the pids it recorded.
    KubeNode,
}

impl Resource {
    /// The `<name>` of its lock file.
    fn name(self) -> &'static str {
        match self {
            Resource::Cdi => "cdi",
            Resource::Podman => "podman",
            Resource::CriContainerd => "cri-containerd",
            Resource::CtrNamespace => "ctr-namespace",
            Resource::NerdctlNamespace => "nerdctl-namespace",
            Resource::KubeNode => "kube-node",
        }
    }

    /// Its lock file, `/run/lock/gpuslice-e2e.<name>.lock`.
    fn lock_path(self) -> PathBuf {
        lock_file(self.name())
    }
}

/// How many clusters with nodes the tests run at once ([`Resource::KubeNode`]'s slots).
pub const KUBE_NODE_SLOTS: usize = 2;

/// The lock file of [`Resource::KubeNode`]'s slot `slot`: slot 0's is the one lock file the
/// resource had before it had slots (`scripts/bench-pod-start.sh` takes it by that name),
/// slot N's `/run/lock/gpuslice-e2e.kube-node-N.lock`.
fn kube_slot_lock_path(slot: usize) -> PathBuf {
    match slot {
        0 => Resource::KubeNode.lock_path(),
        n => lock_file(&format!("{}-{n}", Resource::KubeNode.name())),
    }
}

thread_local! {
    /// The [`Resource::KubeNode`] slot this thread's test holds, if any.
    static KUBE_SLOT: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The cluster script's slot for the clusters this thread starts: the one its test holds
/// through [`lock`]`(&[Resource::KubeNode])`, else 0 (a [`serial`] test has the machine
/// alone, so slot 0 is free).
pub fn kube_slot() -> usize {
    KUBE_SLOT.with(Cell::get).unwrap_or(0)
}

/// The machine lock: the one file the tests shared before there were named locks, kept so
/// that `scripts/check-deb.sh`, which takes it exclusively, still has the machine alone.
const MACHINE_LOCK: &str = "/run/lock/gpuslice-e2e.lock";

/// `/run/lock/gpuslice-e2e.<name>.lock`.
fn lock_file(name: &str) -> PathBuf {
    PathBuf::from(format!("/run/lock/gpuslice-e2e.{name}.lock"))
}

/// A test's locks, held until it is dropped (which releases the resources' locks first, then
/// the machine lock).
#[derive(Debug)]
pub struct Serial {
    _resources: Vec<std::fs::File>,
    _machine: std::fs::File,
    /// Whether it holds a [`Resource::KubeNode`] slot, recorded in this thread's [`kube_slot`].
    kube_slot: bool,
}

impl Drop for Serial {
    fn drop(&mut self) {
        if self.kube_slot {
            KUBE_SLOT.with(|s| s.set(None));
        }
    }
}

/// Takes the machine lock exclusively: no other e2e test runs until the guard is dropped.
/// For a test that measures time or compute shares, or that loads the machine so that a
/// test beside it, or it beside another, could miss a deadline.
pub fn serial() -> Serial {
    require_root();
    Serial {
        _resources: Vec::new(),
        _machine: flock(Path::new(MACHINE_LOCK), FlockOperation::LockExclusive),
        kube_slot: false,
    }
}

/// Takes the machine lock shared (keeping [`serial`] tests out) and each of `resources`
/// exclusively, in the order of [`Resource`] ([`Resource::KubeNode`]: one of its slots,
/// which this thread's [`kube_slot`] then names); `&[]` for a test that shares nothing
/// host-wide. Holds them until the guard is dropped.
pub fn lock(resources: &[Resource]) -> Serial {
    require_root();
    let mut wanted = resources.to_vec();
    wanted.sort_unstable();
    // A resource named twice would wait on itself: two opens are two lock owners.
    wanted.dedup();
    let machine = flock(Path::new(MACHINE_LOCK), FlockOperation::LockShared);
    let mut kube_slot = false;
    let resources = wanted
        .iter()
        .map(|r| match r {
            Resource::KubeNode => {
                let (slot, file) = any_kube_slot();
                KUBE_SLOT.with(|s| s.set(Some(slot)));
                kube_slot = true;
                file
            }
            r => flock(&r.lock_path(), FlockOperation::LockExclusive),
        })
        .collect();
    Serial {
        _resources: resources,
        _machine: machine,
        kube_slot,
    }
}

/// Takes the lock of a free [`Resource::KubeNode`] slot, the lowest first; when every slot
/// is held, waits until one is free. flock cannot wait for either of two files, so the wait
/// tries them all again every 200 ms: a cluster holds its slot for tens of seconds.
fn any_kube_slot() -> (usize, std::fs::File) {
    let mut files: Vec<std::fs::File> = (0..KUBE_NODE_SLOTS)
        .map(|slot| open_lock(&kube_slot_lock_path(slot)))
        .collect();
    loop {
        if let Some(slot) = (0..KUBE_NODE_SLOTS)
            .find(|&slot| try_lock_exclusive(&files[slot], &kube_slot_lock_path(slot)))
        {
            // The others' files are closed: the locks this thread did not get stay free.
            return (slot, files.swap_remove(slot));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Takes `file`'s lock (the lock file at `path`) exclusively if no one holds it.
fn try_lock_exclusive(file: &std::fs::File, path: &Path) -> bool {
    match rustix::fs::flock(file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => true,
        Err(e) if e == rustix::io::Errno::WOULDBLOCK || e == rustix::io::Errno::INTR => false,
        Err(e) => panic!("cannot lock {}: {e}", path.display()),
    }
}

/// Holds `/run/lock/gpuslice-e2e.<name>.lock` exclusively until the file is dropped: for a
/// helper's one-time set-up that tests running at the same time would otherwise race on.
pub(crate) fn setup_lock(name: &str) -> std::fs::File {
    flock(&lock_file(name), FlockOperation::LockExclusive)
}

/// Opens (creating) the lock file at `path`.
fn open_lock(path: &Path) -> std::fs::File {
    std::fs::create_dir_all("/run/lock").ok();
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()))
}

/// Opens (creating) the lock file at `path` and waits for `op` on it.
fn flock(path: &Path, op: FlockOperation) -> std::fs::File {
    let file = open_lock(path);
    loop {
        match rustix::fs::flock(&file, op) {
            Ok(()) => return file,
            Err(e) if e == rustix::io::Errno::INTR => continue,
            Err(e) => panic!("cannot lock {}: {e}", path.display()),
        }
    }
}
