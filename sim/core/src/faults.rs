//! The simulated node's injected XIDs as the simulated driver reports them
//! (`gpuslice sim fault`; `faults.json`, the node's XID log, defined by
//! `gpuslice_driver::simfault`): the file is re-read when it changes (looked at no more than
//! every [`RECHECK`], so a hot allocation path pays no `stat` per call), so an XID shows in
//! every process within that time, and each XID has the effect NVIDIA documents for it
//! (docs/troubleshooting.md, "GPU health and XIDs"). XIDs add up: a GPU's effect is the worst
//! of its XIDs in effect (a later benign XID never ends an earlier fatal one), until a clear
//! (the GPU's reset) ends them all:
//!
//! - XID 79 (fallen off the bus): every NVML call on the GPU fails with
//!   `NVML_ERROR_GPU_IS_LOST`; no CUDA context can be created on it (`CUDA_ERROR_UNKNOWN`).
//! - XIDs 48, 94, 95 (uncorrectable ECC): no CUDA context can be created on it
//!   (`CUDA_ERROR_ECC_UNCORRECTABLE`); NVML answers, and asks for a GPU reset.
//! - other XIDs: NVML asks for a GPU reset (`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`) except
//!   for application errors and ECC recording events, which need none; CUDA is unaffected.
//!
//! A CUDA context that was on the GPU when an XID 79 or an uncorrectable ECC XID came is
//! poisoned for good, as on a real driver, whose sticky errors leave a context unusable until
//! the process ends: every later call on it fails with that error, after the clear too
//! (`sim/cuda/src/driver.rs`, `Objects::check_context`). Every XID is delivered once, in order, as an XID critical
//! event to each NVML event set registered for the GPU before it was injected.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub use gpuslice_driver::simfault::{SimFault, FAULTS_FILE, XID_FALLEN_OFF_BUS};

/// How long a read of the fault list is trusted before the file is looked at again.
pub const RECHECK: Duration = Duration::from_millis(100);

/// The uncorrectable-ECC XIDs: double-bit error (48), contained (94) and uncontained (95)
/// ECC errors.
pub const ECC_XIDS: [u32; 3] = [48, 94, 95];
/// XIDs after which the GPU needs no reset: NVIDIA's application errors and the row
/// remapping / page retirement recording events (63, 64).
const NO_RESET_XIDS: [u32; 8] = [13, 31, 43, 45, 63, 64, 68, 109];

/// What an XID does to the driver's calls on its GPU, from the mildest to the worst (a GPU's
/// effect is the worst of its XIDs in effect).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Effect {
    /// Reported as an event only.
    EventOnly,
    /// NVML asks for a reset; CUDA is unaffected.
    NeedsReset,
    /// Uncorrectable ECC: CUDA contexts on the GPU fail; NVML answers and asks for a reset.
    Ecc,
    /// Off the bus: no call reaches it.
    Lost,
}

/// The effect of XID `xid`.
pub fn effect(xid: u32) -> Effect {
    if xid == XID_FALLEN_OFF_BUS {
        Effect::Lost
    } else if ECC_XIDS.contains(&xid) {
        Effect::Ecc
    } else if NO_RESET_XIDS.contains(&xid) {
        Effect::EventOnly
    } else {
        Effect::NeedsReset
    }
}

/// Where to resume in a GPU's XID history of `len` XIDs after having seen `seen` of them: at
/// `seen`, or at the start when the history is shorter (its file was removed and the log
/// started anew, so all of it is new).
pub fn resume_at(len: usize, seen: usize) -> usize {
    if len < seen {
        0
    } else {
        seen
    }
}

/// The worst effect of `faults`; `None` for none.
pub fn worst<'a>(faults: impl IntoIterator<Item = &'a SimFault>) -> Option<Effect> {
    faults.into_iter().map(|f| effect(f.xid)).max()
}

/// Identity of a version of the file: (inode, size, mtime in ns); `None` without the file.
type Stamp = Option<(u64, u64, i128)>;

#[derive(Debug)]
struct Cached {
    stamp: Stamp,
    checked: Instant,
    faults: Vec<SimFault>,
}

/// The fault list of one sim state dir, re-read when the file changes.
#[derive(Debug)]
pub struct Faults {
    path: PathBuf,
    state_dir: PathBuf,
    recheck: Duration,
    cache: Mutex<Option<Cached>>,
}

fn stamp(path: &Path) -> Stamp {
    let m = std::fs::metadata(path).ok()?;
    Some((
        m.ino(),
        m.size(),
        i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
    ))
}

impl Faults {
    pub fn new(state_dir: &Path) -> Faults {
        Faults::with_recheck(state_dir, RECHECK)
    }

    /// As [`Faults::new`], trusting a read for `recheck`.
    pub fn with_recheck(state_dir: &Path, recheck: Duration) -> Faults {
        Faults {
            path: state_dir.join(FAULTS_FILE),
            state_dir: state_dir.to_path_buf(),
            recheck,
            cache: Mutex::new(None),
        }
    }

    /// Runs `f` on the XID log (every injected XID, in injection order, cleared ones
    /// included). A log that cannot be read counts as empty (reported once per version of
    /// the file), as a driver that saw no XID would behave.
    fn with<R>(&self, f: impl FnOnce(&[SimFault]) -> R) -> R {
        let mut cache = crate::state::lock_ignoring_poison(&self.cache);
        if let Some(c) = cache.as_mut() {
            if c.checked.elapsed() < self.recheck {
                return f(&c.faults);
            }
        }
        let now = stamp(&self.path);
        if let Some(c) = cache.as_mut() {
            if c.stamp == now {
                c.checked = Instant::now();
                return f(&c.faults);
            }
        }
        let faults = match now {
            None => Vec::new(),
            Some(_) => {
                gpuslice_driver::simfault::read_faults(&self.state_dir).unwrap_or_else(|e| {
                    eprintln!("gpuslice simulated driver: {e}");
                    Vec::new()
                })
            }
        };
        let c = cache.insert(Cached {
            stamp: now,
            checked: Instant::now(),
            faults,
        });
        f(&c.faults)
    }

    /// The XID log of the node: every injected XID, in injection order.
    pub fn all(&self) -> Vec<SimFault> {
        self.with(<[SimFault]>::to_vec)
    }

    /// The XIDs of GPU `uuid` still in effect, in injection order.
    pub fn in_effect(&self, uuid: &str) -> Vec<SimFault> {
        self.with(|all| {
            all.iter()
                .filter(|f| f.is_on(uuid) && f.in_effect())
                .cloned()
                .collect()
        })
    }

    /// The worst effect of GPU `uuid`'s XIDs in effect.
    pub fn effect(&self, uuid: &str) -> Option<Effect> {
        self.with(|all| worst(all.iter().filter(|f| f.is_on(uuid) && f.in_effect())))
    }

    /// Every XID injected into GPU `uuid`, cleared or not, in injection order: the `n`-th
    /// stays the `n`-th (the log only grows), so a count of them marks a point in the GPU's
    /// history.
    pub fn history(&self, uuid: &str) -> Vec<SimFault> {
        self.with(|all| all.iter().filter(|f| f.is_on(uuid)).cloned().collect())
    }

    /// How many XIDs were ever injected into GPU `uuid` (see [`Faults::history`]).
    pub fn count(&self, uuid: &str) -> usize {
        self.with(|all| all.iter().filter(|f| f.is_on(uuid)).count())
    }

    /// The worst effect of the XIDs injected into GPU `uuid` after the first `seen` of its
    /// history, cleared ones included (from [`resume_at`]).
    pub fn worst_since(&self, uuid: &str, seen: usize) -> Option<Effect> {
        self.with(|all| {
            let history: Vec<&SimFault> = all.iter().filter(|f| f.is_on(uuid)).collect();
            worst(history[resume_at(history.len(), seen)..].iter().copied())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documented_effects() {
        assert_eq!(effect(79), Effect::Lost);
        for x in ECC_XIDS {
            assert_eq!(effect(x), Effect::Ecc);
        }
        for x in [119, 120, 62, 74] {
            assert_eq!(effect(x), Effect::NeedsReset, "XID {x}");
        }
        for x in [13, 31, 43, 45, 63, 64, 68, 109] {
            assert_eq!(effect(x), Effect::EventOnly, "XID {x}");
        }
    }

    fn node() -> (tempfile::TempDir, Vec<String>) {
        let dir = tempfile::tempdir().unwrap();
        let gpus: Vec<gpuslice_config::SimulatedGpu> = (0..2)
            .map(|i| gpuslice_config::SimulatedGpu {
                model: "NVIDIA H200".into(),
                memory: 16 << 30,
                uuid: gpuslice_config::simulated_uuid(i, "NVIDIA H200"),
                context_memory: 0,
                reserved_memory: 0,
            })
            .collect();
        let devices = crate::devices_from_config(&gpus);
        crate::write_devices(dir.path(), &devices).unwrap();
        (dir, devices.into_iter().map(|d| d.uuid).collect())
    }

    #[test]
    fn a_changed_file_is_seen_at_the_next_call() {
        let (dir, uuids) = node();
        let faults = Faults::with_recheck(dir.path(), Duration::ZERO);
        assert_eq!(faults.effect(&uuids[1]), None);
        gpuslice_driver::simfault::set_fault(dir.path(), &uuids[1], Some(79), 5).unwrap();
        assert_eq!(faults.effect(&uuids[1]), Some(Effect::Lost));
        assert_eq!(faults.effect(&uuids[0]), None);
        gpuslice_driver::simfault::set_fault(dir.path(), &uuids[1], None, 6).unwrap();
        assert_eq!(faults.effect(&uuids[1]), None, "cleared");
    }

    #[test]
    fn a_later_benign_xid_keeps_the_fatal_one_and_the_history_keeps_both() {
        let (dir, uuids) = node();
        let set = |gpu: usize, xid| {
            gpuslice_driver::simfault::set_fault(dir.path(), &uuids[gpu], xid, 1).unwrap();
        };
        let faults = Faults::with_recheck(dir.path(), Duration::ZERO);
        set(1, Some(48));
        set(1, Some(13));
        assert_eq!(faults.effect(&uuids[1]), Some(Effect::Ecc), "13 after 48");
        let xids = |fs: Vec<SimFault>| fs.into_iter().map(|f| f.xid).collect::<Vec<_>>();
        assert_eq!(xids(faults.in_effect(&uuids[1])), [48, 13]);
        set(0, Some(119));
        set(1, None);
        assert_eq!(faults.effect(&uuids[1]), None, "the reset ends both");
        assert_eq!(faults.effect(&uuids[0]), Some(Effect::NeedsReset));
        assert_eq!(xids(faults.history(&uuids[1])), [48, 13], "kept, in order");
        assert_eq!(faults.count(&uuids[1]), 2);
        // What came after a point of GPU 1's history, cleared or not.
        assert_eq!(faults.worst_since(&uuids[1], 0), Some(Effect::Ecc));
        assert_eq!(faults.worst_since(&uuids[1], 1), Some(Effect::EventOnly));
        assert_eq!(faults.worst_since(&uuids[1], 2), None);
        // A log started anew (its file removed): everything in it is new.
        std::fs::remove_file(dir.path().join(FAULTS_FILE)).unwrap();
        set(1, Some(79));
        assert_eq!(faults.worst_since(&uuids[1], 2), Some(Effect::Lost));
    }
}
