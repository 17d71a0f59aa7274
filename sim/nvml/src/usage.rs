//! What NVML reports about use: node-wide memory (every process's allocations, dead
//! processes' reclaimed), the compute processes with their memory (pids as seen from the
//! caller's pid namespace, so host-side callers get host pids), and utilisation over the
//! last second of the device timeline.

use std::ffi::c_uint;
use std::path::Path;

use gpuslice_cuda_ffi::nvml::*;
use gpuslice_sim_core::now_ns;
use gpuslice_sim_core::procs::{pid_ns_inode, visible_pid};

use crate::ffi::{get, guard, put, put_slice, NvResult};
use crate::state::nvml;

fn memory(device: nvmlDevice_t) -> NvResult<gpuslice_sim_core::MemoryFigures> {
    let n = nvml()?;
    let (_, d) = n.device(device)?;
    n.node
        .memory(d.index as usize)
        .map_err(|_| NVML_ERROR_UNKNOWN)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    out: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    guard(|| {
        let m = memory(device)?;
        put(
            out,
            nvmlMemory_t {
                total: m.total,
                free: m.free,
                used: m.used,
            },
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    out: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    guard(|| {
        if get(out.cast_const())?.version != nvmlMemory_v2 {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let m = memory(device)?;
        put(
            out,
            nvmlMemory_v2_t {
                version: nvmlMemory_v2,
                total: m.total,
                reserved: 0,
                free: m.free,
                used: m.used,
            },
        )
    })
}

/// The compute processes on `device`, pids as the caller sees them.
fn processes(device: nvmlDevice_t) -> NvResult<Vec<nvmlProcessInfo_t>> {
    let n = nvml()?;
    let (_, d) = n.device(device)?;
    let usage = n
        .node
        .state()
        .slot_usage(d.index as usize)
        .map_err(|_| NVML_ERROR_UNKNOWN)?;
    let proc_root = Path::new("/proc");
    let own_ns = pid_ns_inode(proc_root, "self");
    Ok(usage
        .iter()
        .filter_map(|u| {
            visible_pid(proc_root, own_ns, u.pid, u.pid_ns).map(|pid| nvmlProcessInfo_t {
                pid,
                usedGpuMemory: u.used,
                gpuInstanceId: u32::MAX,
                computeInstanceId: u32::MAX,
            })
        })
        .collect())
}

fn running_processes(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> NvResult {
    let list = processes(device)?;
    let capacity = get(count.cast_const())? as usize;
    put(count, list.len() as c_uint)?;
    put_slice(infos, capacity, &list)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    guard(|| running_processes(device, count, infos))
}

/// Same layout as `_v3` (`nvmlProcessInfo_v2_t`).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    guard(|| running_processes(device, count, infos))
}

/// `gpu` is the percent of the last second the device ran kernels; memory-bandwidth use is
/// not modelled and reads 0.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    out: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    guard(|| {
        let n = nvml()?;
        let (_, d) = n.device(device)?;
        let gpu = n.node.state().utilization(d.index as usize, now_ns());
        put(out, nvmlUtilization_t { gpu, memory: 0 })
    })
}
