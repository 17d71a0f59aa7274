//! The node's one reading of the driver, behind the [`GpuMeter`] seam, for both the exporter
//! and the enforcer: per GPU its used memory and utilisation, and its compute processes
//! (host pids) with the memory each holds and its SM utilisation. The real meter is NVML
//! through nvml-wrapper (`nvmlDeviceGetComputeRunningProcesses`,
//! `nvmlDeviceGetProcessUtilization`; the simulated `libnvidia-ml.so.1` on a simulated
//! node); tests use fakes. A meter never fails as a whole: what it cannot read is left out
//! and reported as an error line.

use std::ffi::OsStr;
use std::path::PathBuf;

use gpuslice_config::Config;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;

use gpuslice_driver::simnode::SimLayout;

/// NVML's soname on a real node.
pub const NVML_SONAME: &str = "libnvidia-ml.so.1";

/// NVML could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum MeterError {
    #[error("NVML ({lib}) cannot be initialised: {detail}")]
    Init { lib: String, detail: String },
}

/// One compute process on a GPU, as the driver reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuProcess {
    /// Host pid (the agent's pid namespace).
    pub pid: u32,
    /// Bytes it uses on this GPU, when the driver tells.
    pub used: Option<u64>,
    /// Its SM utilisation over the driver's last sample period, percent, when the driver
    /// tells.
    pub sm: Option<u32>,
}

/// What was measured on one GPU; a field the driver would not give is `None`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceReading {
    pub index: u32,
    pub uuid: String,
    pub model: String,
    pub memory_total: Option<u64>,
    pub memory_used: Option<u64>,
    /// Fraction (0–1) of the last sample period a kernel ran.
    pub utilization: Option<f64>,
    /// `None` when the driver would not list them (nothing can be judged on this GPU).
    pub processes: Option<Vec<GpuProcess>>,
}

/// One reading of every GPU, and one line per thing that could not be read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reading {
    pub devices: Vec<DeviceReading>,
    pub errors: Vec<String>,
}

/// Measures the node's GPUs.
pub trait GpuMeter: Send {
    fn read(&mut self) -> Reading;
}

/// NVML through nvml-wrapper. Device identities (index, UUID, name) are read once.
pub struct NvmlMeter {
    nvml: Nvml,
    identities: Vec<Option<(String, String)>>,
}

impl std::fmt::Debug for NvmlMeter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlMeter").finish_non_exhaustive()
    }
}

/// Where NVML is loaded from for `config`, and the environment the simulated NVML needs to
/// find its node (set only where not set already).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmlSource {
    pub lib: PathBuf,
    pub env: Vec<(&'static str, PathBuf)>,
}

impl NvmlSource {
    /// The NVML of `config`: the driver's soname, or the simulated library under
    /// `state_dir/sim` with `GPUSLICE_SIM_STATE` / `GPUSLICE_SIM_DEV` pointing at that node
    /// (a `--config` flag is not seen by the library, which otherwise reads the default
    /// config).
    pub fn of(config: &Config) -> NvmlSource {
        if !config.is_simulated() {
            return NvmlSource {
                lib: PathBuf::from(NVML_SONAME),
                env: Vec::new(),
            };
        }
        let layout = SimLayout::of(config);
        NvmlSource {
            lib: layout.lib_dir.join(NVML_SONAME),
            env: vec![
                (gpuslice_driver::simulated::STATE_ENV, layout.state),
                (gpuslice_driver::simulated::DEV_ENV, layout.dev),
            ],
        }
    }
}

impl NvmlMeter {
    /// Loads and initialises NVML from `source`, first setting the simulated node's
    /// environment where it is not set. The first call must come before the process starts
    /// other threads (`std::env::set_var` is not thread-safe); later calls (retries) find
    /// the variables set and leave the environment alone.
    pub fn open(source: &NvmlSource) -> Result<NvmlMeter, MeterError> {
        for (key, value) in &source.env {
            if std::env::var_os(key).is_none() {
                std::env::set_var(key, value);
            }
        }
        let nvml = Nvml::builder()
            .lib_path(source.lib.as_os_str())
            .init()
            .map_err(|e| MeterError::Init {
                lib: source.lib.display().to_string(),
                detail: e.to_string(),
            })?;
        Ok(NvmlMeter {
            nvml,
            identities: Vec::new(),
        })
    }

    /// Opens NVML from `lib` with no extra environment (tests).
    pub fn open_lib(lib: &OsStr) -> Result<NvmlMeter, MeterError> {
        NvmlMeter::open(&NvmlSource {
            lib: PathBuf::from(lib),
            env: Vec::new(),
        })
    }
}

/// A failure worth counting: "not supported" on this GPU is an absent figure, not an error.
fn counted(e: &NvmlError) -> bool {
    !matches!(e, NvmlError::NotSupported)
}

impl GpuMeter for NvmlMeter {
    fn read(&mut self) -> Reading {
        let mut reading = Reading::default();
        let count = match self.nvml.device_count() {
            Ok(c) => c,
            Err(e) => {
                reading
                    .errors
                    .push(format!("NVML cannot count the GPUs: {e}"));
                return reading;
            }
        };
        self.identities.resize(count as usize, None);
        for index in 0..count {
            let mut err = |what: &str, e: NvmlError| {
                if counted(&e) {
                    reading
                        .errors
                        .push(format!("NVML GPU {index}: cannot read {what}: {e}"));
                }
            };
            let dev = match self.nvml.device_by_index(index) {
                Ok(d) => d,
                Err(e) => {
                    err("the device handle", e);
                    continue;
                }
            };
            let slot = &mut self.identities[index as usize];
            if slot.is_none() {
                match dev.uuid().and_then(|u| Ok((u, dev.name()?))) {
                    Ok(id) => *slot = Some(id),
                    Err(e) => {
                        err("UUID and name", e);
                        continue;
                    }
                }
            }
            let Some((uuid, model)) = slot.clone() else {
                continue;
            };
            let mut d = DeviceReading {
                index,
                uuid,
                model,
                ..DeviceReading::default()
            };
            match dev.memory_info() {
                Ok(m) => {
                    d.memory_total = Some(m.total);
                    d.memory_used = Some(m.used);
                }
                Err(e) => err("memory", e),
            }
            match dev.utilization_rates() {
                Ok(u) => d.utilization = Some(f64::from(u.gpu.min(100)) / 100.0),
                Err(e) => err("utilisation", e),
            }
            match dev.running_compute_processes() {
                Ok(list) => {
                    // No samples since the driver's last period is `NotFound`: no figure.
                    let samples = match dev.process_utilization_stats(None) {
                        Ok(s) => s,
                        Err(NvmlError::NotFound) => Vec::new(),
                        Err(e) => {
                            err("process utilisation", e);
                            Vec::new()
                        }
                    };
                    d.processes = Some(
                        list.into_iter()
                            .map(|p| GpuProcess {
                                pid: p.pid,
                                used: match p.used_gpu_memory {
                                    UsedGpuMemory::Used(b) => Some(b),
                                    UsedGpuMemory::Unavailable => None,
                                },
                                sm: samples.iter().find(|s| s.pid == p.pid).map(|s| s.sm_util),
                            })
                            .collect(),
                    )
                }
                Err(e) => err("compute processes", e),
            }
            reading.devices.push(d);
        }
        reading
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn source_follows_the_inventory() {
        let real = Config::default();
        assert_eq!(NvmlSource::of(&real).lib, PathBuf::from(NVML_SONAME));
        assert!(NvmlSource::of(&real).env.is_empty());
        let sim = gpuslice_config::parse_config(
            "state_dir=\"/s\"\n[inventory]\nsource=\"simulated\"\n[[inventory.simulated]]\nmemory=\"1Gi\"\n",
            Path::new("/c.toml"),
        )
        .unwrap();
        let s = NvmlSource::of(&sim);
        assert_eq!(
            s.lib,
            Path::new("/s/sim/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1")
        );
        assert!(s.env.contains(&(
            gpuslice_driver::simulated::STATE_ENV,
            PathBuf::from("/s/sim/state")
        )));
        assert!(s.env.contains(&(
            gpuslice_driver::simulated::DEV_ENV,
            PathBuf::from("/s/sim/dev")
        )));
    }

    #[test]
    fn missing_library_is_an_init_error_naming_it() {
        let e = NvmlMeter::open_lib(OsStr::new("/nonexistent/libnvidia-ml.so.1")).unwrap_err();
        let line = e.to_string();
        assert!(line.contains("/nonexistent/libnvidia-ml.so.1"), "{line}");
        assert!(!line.contains('\n'));
    }
}
