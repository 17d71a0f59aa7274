//! The simulated inventory's side of the simulated node: `devices.json`, the list of the
//! simulated GPUs that `gpuslice cdi generate` writes from the config's
//! `[[inventory.simulated]]` list (so the simulated driver and the inventory agree on UUIDs)
//! and the simulated `libcuda.so.1` and `libnvidia-ml.so.1` read, and where that node lives
//! for a process (the environment variables the exporter sets, the directory containers
//! get it mounted at). The simulator (`gpuslice-sim-core`) builds on this, not the reverse.

use std::path::{Path, PathBuf};

use gpuslice_config::SimulatedGpu;
use serde::{Deserialize, Serialize};

/// Env var naming the simulated node's state dir (`devices.json`, the shared state file).
pub const STATE_ENV: &str = "GPUSLICE_SIM_STATE";
/// Env var naming the simulated node's device-node dir.
pub const DEV_ENV: &str = "GPUSLICE_SIM_DEV";
/// Where gpuslice mounts the simulated node's state dir inside containers.
pub const CONTAINER_STATE_DIR: &str = "/run/gpuslice-sim";

/// File name of the device list inside the sim state dir.
pub const DEVICES_FILE: &str = "devices.json";
/// The only `version` of `devices.json` this code reads and writes.
pub const DEVICES_VERSION: u32 = 1;
/// Most GPUs a simulated node can have (the config's limit too).
pub const MAX_DEVICES: usize = 16;

/// One simulated GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimDevice {
    /// Host index (NVML index, order in the config).
    pub index: u32,
    /// `GPU-<uuid>`.
    pub uuid: String,
    /// Marketing name, e.g. `NVIDIA H200`.
    pub model: String,
    /// Total memory in bytes.
    pub memory: u64,
    /// Minor number of `/dev/nvidia<minor>`; a process sees the GPU only if that node exists.
    pub minor: u32,
    /// `DDDDDDDD:BB:DD.F`, as NVML prints it.
    pub pci_bus_id: String,
    pub numa_node: u32,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// SM clock in kHz; a `gpuslice_spin(cycles)` kernel runs `cycles / clock_khz` ms.
    pub clock_khz: u32,
    /// Device memory each CUDA context costs its process, as a real driver charges it:
    /// NVML's per-process figures and the device's free memory include it, no allocation
    /// returns it. Absent in a list written before it existed: 0.
    #[serde(default)]
    pub context_memory: u64,
    /// Device memory the driver and firmware set aside, part of `memory`: NVML reports it
    /// (v2's `reserved`, inside v1's `used`), CUDA's totals leave it out and no allocation
    /// ever gets it. Absent in a list written before it existed: 0; left out when 0, so a
    /// list without reserved memory still reads in a simulated driver built before it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reserved_memory: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl SimDevice {
    /// What CUDA can allocate on this GPU and reports as its total (`cuMemGetInfo`,
    /// `cuDeviceTotalMem`): the memory gpuslice books, [`crate::memory::bookable_memory`].
    pub fn allocatable(&self) -> u64 {
        crate::memory::bookable_memory(self.memory, self.reserved_memory)
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct DevicesDoc {
    version: u32,
    devices: Vec<SimDevice>,
}

/// `devices.json` that cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum DevicesError {
    #[error("cannot read {path}: {source}; run `gpuslice cdi generate` with a simulated inventory to create it")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a valid simulated device list: {detail}")]
    Parse { path: PathBuf, detail: String },
    #[error("{path} has version {found}; this driver reads version {DEVICES_VERSION}")]
    Version { path: PathBuf, found: u32 },
    #[error("{path}: {detail}")]
    Invalid { path: PathBuf, detail: String },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: gpuslice_fsutil::AtomicWriteError,
    },
}

/// SMs and clock of a known model; other models get an H200's.
fn model_shape(model: &str) -> (u32, u32) {
    let m = model.to_ascii_uppercase();
    if m.contains("A100") {
        (108, 1_410_000)
    } else if m.contains("L40") {
        (142, 2_490_000)
    } else if m.contains("T4") {
        (40, 1_590_000)
    } else {
        (132, 1_980_000)
    }
}

/// The PCI bus id of simulated GPU `index`: the config crate's, which the simulated
/// inventory reports too.
pub use gpuslice_config::simulated_pci_bus_id;

/// The simulated devices of a config's `[[inventory.simulated]]` list, in index order:
/// minor = index, the config's UUIDs, NUMA node 0.
pub fn devices_from_config(gpus: &[SimulatedGpu]) -> Vec<SimDevice> {
    gpus.iter()
        .enumerate()
        .map(|(i, g)| {
            let (sm_count, clock_khz) = model_shape(&g.model);
            SimDevice {
                index: i as u32,
                uuid: g.uuid.clone(),
                model: g.model.clone(),
                memory: g.memory,
                minor: i as u32,
                pci_bus_id: simulated_pci_bus_id(i),
                numa_node: 0,
                sm_count,
                clock_khz,
                context_memory: g.context_memory,
                reserved_memory: g.reserved_memory,
            }
        })
        .collect()
}

fn validate(path: &Path, devices: &[SimDevice]) -> Result<(), DevicesError> {
    let invalid = |detail: String| DevicesError::Invalid {
        path: path.to_path_buf(),
        detail,
    };
    if devices.len() > MAX_DEVICES {
        return Err(invalid(format!(
            "{} devices; at most {MAX_DEVICES} are accepted",
            devices.len()
        )));
    }
    for (i, d) in devices.iter().enumerate() {
        if d.index as usize != i {
            return Err(invalid(format!(
                "device {i} has index {}; indexes must be 0, 1, … in order",
                d.index
            )));
        }
        if !gpuslice_config::is_gpu_uuid(&d.uuid) {
            return Err(invalid(format!(
                "device {i} has uuid {:?}; expected GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx",
                d.uuid
            )));
        }
        if d.memory == 0 || d.clock_khz == 0 || d.sm_count == 0 {
            return Err(invalid(format!(
                "device {i} needs memory, sm_count and clock_khz above 0"
            )));
        }
        if d.context_memory > d.memory / 4 {
            return Err(invalid(format!(
                "device {i} has context_memory {}; at most a quarter of its memory ({}) is accepted",
                d.context_memory,
                d.memory / 4
            )));
        }
        if d.reserved_memory >= d.memory {
            return Err(invalid(format!(
                "device {i} has reserved_memory {}; less than its memory ({}) is accepted",
                d.reserved_memory, d.memory
            )));
        }
        if devices[..i]
            .iter()
            .any(|o| o.uuid == d.uuid || o.minor == d.minor)
        {
            return Err(invalid(format!(
                "device {i} repeats the uuid or minor of an earlier device"
            )));
        }
    }
    Ok(())
}

/// Writes `<state_dir>/devices.json` atomically (mode 0644).
pub fn write_devices(state_dir: &Path, devices: &[SimDevice]) -> Result<(), DevicesError> {
    let path = state_dir.join(DEVICES_FILE);
    validate(&path, devices)?;
    let doc = DevicesDoc {
        version: DEVICES_VERSION,
        devices: devices.to_vec(),
    };
    let mut text = serde_json::to_vec_pretty(&doc).map_err(|e| DevicesError::Parse {
        path: path.clone(),
        detail: e.to_string(),
    })?;
    text.push(b'\n');
    gpuslice_fsutil::atomic_write(&path, &text, 0o644)
        .map_err(|source| DevicesError::Write { path, source })
}

/// Reads and checks `<state_dir>/devices.json`.
pub fn read_devices(state_dir: &Path) -> Result<Vec<SimDevice>, DevicesError> {
    let path = state_dir.join(DEVICES_FILE);
    let text = std::fs::read(&path).map_err(|source| DevicesError::Read {
        path: path.clone(),
        source,
    })?;
    let doc: DevicesDoc = serde_json::from_slice(&text).map_err(|e| DevicesError::Parse {
        path: path.clone(),
        detail: e.to_string(),
    })?;
    if doc.version != DEVICES_VERSION {
        return Err(DevicesError::Version {
            path,
            found: doc.version,
        });
    }
    validate(&path, &doc.devices)?;
    Ok(doc.devices)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus() -> Vec<SimulatedGpu> {
        vec![
            SimulatedGpu {
                model: "NVIDIA H200".into(),
                memory: 141 << 30,
                uuid: gpuslice_config::simulated_uuid(0, "NVIDIA H200"),
                context_memory: 512 << 20,
                reserved_memory: 0,
            },
            SimulatedGpu {
                model: "NVIDIA A100-SXM4-80GB".into(),
                memory: 80 << 30,
                uuid: gpuslice_config::simulated_uuid(1, "NVIDIA A100-SXM4-80GB"),
                context_memory: 0,
                reserved_memory: 470 << 20,
            },
        ]
    }

    #[test]
    fn from_config_keeps_uuids_and_order() {
        let d = devices_from_config(&gpus());
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].uuid, gpuslice_config::simulated_uuid(0, "NVIDIA H200"));
        assert_eq!((d[0].sm_count, d[0].clock_khz), (132, 1_980_000));
        assert_eq!((d[1].sm_count, d[1].clock_khz), (108, 1_410_000));
        assert_eq!(d[1].minor, 1);
        assert_eq!(d[1].pci_bus_id, "00000000:19:00.0");
        assert_eq!((d[0].context_memory, d[1].context_memory), (512 << 20, 0));
        assert_eq!((d[0].reserved_memory, d[1].reserved_memory), (0, 470 << 20));
        assert_eq!(d[1].allocatable(), (80 << 30) - (470 << 20));
    }

    #[test]
    fn a_list_without_context_or_reserved_memory_reads_as_none() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = devices_from_config(&gpus());
        write_devices(dir.path(), &d).expect("write");
        let path = dir.path().join(DEVICES_FILE);
        let mut doc: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("json");
        for d in doc["devices"].as_array_mut().expect("devices") {
            let d = d.as_object_mut().expect("device");
            d.remove("context_memory");
            d.remove("reserved_memory");
        }
        let old = serde_json::to_vec(&doc).expect("json");
        std::fs::write(&path, old).expect("write old");
        let read = read_devices(dir.path()).expect("read old");
        assert_eq!(read[0].context_memory, 0);
        assert_eq!(read[1].reserved_memory, 0);
    }

    #[test]
    fn write_then_read_round_trips() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = devices_from_config(&gpus());
        write_devices(dir.path(), &d).expect("write");
        assert_eq!(read_devices(dir.path()).expect("read"), d);
    }

    #[test]
    fn rejects_bad_lists_naming_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut d = devices_from_config(&gpus());
        d[1].uuid = d[0].uuid.clone();
        let e = write_devices(dir.path(), &d)
            .expect_err("repeated uuid")
            .to_string();
        assert!(e.contains("devices.json") && e.contains("repeats"), "{e}");

        std::fs::write(
            dir.path().join(DEVICES_FILE),
            r#"{"version":2,"devices":[]}"#,
        )
        .expect("write");
        let e = read_devices(dir.path()).expect_err("version 2").to_string();
        assert!(e.contains("version 2"), "{e}");

        let mut d = devices_from_config(&gpus());
        d[1].reserved_memory = d[1].memory;
        let e = write_devices(dir.path(), &d)
            .expect_err("all memory reserved")
            .to_string();
        assert!(
            e.contains("device 1 has reserved_memory 85899345920"),
            "{e}"
        );

        let e = read_devices(&dir.path().join("missing"))
            .expect_err("missing")
            .to_string();
        assert!(e.contains("gpuslice cdi generate"), "{e}");
    }
}
