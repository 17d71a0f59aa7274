//! The driver's per-process figures on each GPU, behind a seam: used memory and SM
//! utilisation per host pid. The real meter is NVML (`nvmlDeviceGetComputeRunningProcesses`
//! and `nvmlDeviceGetProcessUtilization`) through nvml-wrapper; tests use fakes.

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;

use crate::gpu::NvmlSource;

/// One process on one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcFigures {
    /// Host pid.
    pub pid: u32,
    /// Bytes held, when the driver tells.
    pub used: Option<u64>,
    /// SM utilisation over the driver's last sample period, percent.
    pub sm: Option<u32>,
}

/// The processes of one GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuProcs {
    pub uuid: String,
    pub processes: Vec<ProcFigures>,
}

/// Reads the per-process figures of every GPU; what cannot be read is an error line.
pub trait ProcessMeter: Send {
    fn read(&mut self) -> (Vec<GpuProcs>, Vec<String>);
}

/// NVML could not be opened for the enforcer.
#[derive(Debug, thiserror::Error)]
#[error("the enforcer cannot initialise NVML ({lib}): {detail}; nothing is enforced until it can")]
pub struct MeterOpenError {
    pub lib: String,
    pub detail: String,
}

/// NVML through nvml-wrapper.
pub struct NvmlProcessMeter {
    nvml: Nvml,
    uuids: Vec<Option<String>>,
}

impl std::fmt::Debug for NvmlProcessMeter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlProcessMeter").finish_non_exhaustive()
    }
}

impl NvmlProcessMeter {
    /// Opens NVML from `source` (its environment already set by the exporter's meter).
    pub fn open(source: &NvmlSource) -> Result<NvmlProcessMeter, MeterOpenError> {
        let nvml = Nvml::builder()
            .lib_path(source.lib.as_os_str())
            .init()
            .map_err(|e| MeterOpenError {
                lib: source.lib.display().to_string(),
                detail: e.to_string(),
            })?;
        Ok(NvmlProcessMeter {
            nvml,
            uuids: Vec::new(),
        })
    }
}

impl ProcessMeter for NvmlProcessMeter {
    fn read(&mut self) -> (Vec<GpuProcs>, Vec<String>) {
        let mut out = Vec::new();
        let mut errors = Vec::new();
        let count = match self.nvml.device_count() {
            Ok(c) => c,
            Err(e) => return (out, vec![format!("NVML cannot count the GPUs: {e}")]),
        };
        self.uuids.resize(count as usize, None);
        for index in 0..count {
            let dev = match self.nvml.device_by_index(index) {
                Ok(d) => d,
                Err(e) => {
                    errors.push(format!("NVML GPU {index}: no handle: {e}"));
                    continue;
                }
            };
            let uuid = match &self.uuids[index as usize] {
                Some(u) => u.clone(),
                None => match dev.uuid() {
                    Ok(u) => {
                        self.uuids[index as usize] = Some(u.clone());
                        u
                    }
                    Err(e) => {
                        errors.push(format!("NVML GPU {index}: no UUID: {e}"));
                        continue;
                    }
                },
            };
            let list = match dev.running_compute_processes() {
                Ok(l) => l,
                Err(e) => {
                    errors.push(format!(
                        "NVML GPU {index}: cannot list compute processes: {e}"
                    ));
                    continue;
                }
            };
            let samples = match dev.process_utilization_stats(None) {
                Ok(s) => s,
                Err(NvmlError::NotSupported | NvmlError::NotFound) => Vec::new(),
                Err(e) => {
                    errors.push(format!(
                        "NVML GPU {index}: cannot read process utilisation: {e}"
                    ));
                    Vec::new()
                }
            };
            let processes = list
                .into_iter()
                .map(|p| ProcFigures {
                    pid: p.pid,
                    used: match p.used_gpu_memory {
                        UsedGpuMemory::Used(b) => Some(b),
                        UsedGpuMemory::Unavailable => None,
                    },
                    sm: samples.iter().find(|s| s.pid == p.pid).map(|s| s.sm_util),
                })
                .collect();
            out.push(GpuProcs { uuid, processes });
        }
        (out, errors)
    }
}
