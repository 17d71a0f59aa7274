//! The simulated node's injected faults as the simulated driver reports them
//! (`gpuslice sim fault`; `faults.json`, defined by `gpuslice_driver::simfault`): the file is
//! re-read when it changes (looked at no more than every [`RECHECK`], so a hot allocation
//! path pays no `stat` per call), so a fault shows in every process within that time, and
//! each XID has the effect NVIDIA documents for it (docs/troubleshooting.md, "GPU health
//! and XIDs"):
//!
//! - XID 79 (fallen off the bus): every NVML call on the GPU fails with
//!   `NVML_ERROR_GPU_IS_LOST`; CUDA contexts and allocations fail with `CUDA_ERROR_UNKNOWN`,
//!   kernel launches with `CUDA_ERROR_LAUNCH_FAILED`.
//! - XIDs 48, 94, 95 (uncorrectable ECC): CUDA contexts, allocations and launches fail with
//!   `CUDA_ERROR_ECC_UNCORRECTABLE`; NVML answers, and asks for a GPU reset.
//! - other XIDs: NVML asks for a GPU reset (`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`) except
//!   for application errors and ECC recording events, which need none; CUDA is unaffected.
//!
//! Every fault is delivered once as an XID critical event to the NVML event sets registered
//! for the GPU before it was injected.

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

/// What a fault does to the driver's calls on its GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Off the bus: no call reaches it.
    Lost,
    /// Uncorrectable ECC: CUDA work fails; NVML answers and asks for a reset.
    Ecc,
    /// NVML asks for a reset; CUDA is unaffected.
    NeedsReset,
    /// Reported as an event only.
    EventOnly,
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

    /// Every fault in effect. A list that cannot be read counts as none (reported once per
    /// version of the file), as a driver without that fault would behave.
    pub fn all(&self) -> Vec<SimFault> {
        let mut cache = crate::state::lock_ignoring_poison(&self.cache);
        if let Some(c) = cache.as_mut() {
            if c.checked.elapsed() < self.recheck {
                return c.faults.clone();
            }
        }
        let now = stamp(&self.path);
        if let Some(c) = cache.as_mut() {
            if c.stamp == now {
                c.checked = Instant::now();
                return c.faults.clone();
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
        *cache = Some(Cached {
            stamp: now,
            checked: Instant::now(),
            faults: faults.clone(),
        });
        faults
    }

    /// The fault of GPU `uuid`, if any.
    pub fn of(&self, uuid: &str) -> Option<SimFault> {
        self.all()
            .into_iter()
            .find(|f| f.uuid.eq_ignore_ascii_case(uuid))
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

    #[test]
    fn a_changed_file_is_seen_at_the_next_call() {
        let dir = tempfile::tempdir().unwrap();
        let gpus: Vec<gpuslice_config::SimulatedGpu> = (0..2)
            .map(|i| gpuslice_config::SimulatedGpu {
                model: "NVIDIA H200".into(),
                memory: 16 << 30,
                uuid: gpuslice_config::simulated_uuid(i, "NVIDIA H200"),
                context_memory: 0,
            })
            .collect();
        let devices = crate::devices_from_config(&gpus);
        crate::write_devices(dir.path(), &devices).unwrap();
        let faults = Faults::with_recheck(dir.path(), Duration::ZERO);
        assert!(faults.of(&devices[1].uuid).is_none());
        gpuslice_driver::simfault::set_fault(dir.path(), &devices[1].uuid, Some(79), 5).unwrap();
        assert_eq!(faults.of(&devices[1].uuid).map(|f| f.xid), Some(79));
        assert!(faults.of(&devices[0].uuid).is_none());
        gpuslice_driver::simfault::set_fault(dir.path(), &devices[1].uuid, None, 6).unwrap();
        assert!(faults.of(&devices[1].uuid).is_none(), "cleared");
    }
}
