//! What NVML reports about use: node-wide memory (every process's allocations, dead
//! processes' reclaimed, and the memory the driver reserves: inside v1's `used`, v2's
//! `reserved`), the compute processes with their memory (pids as seen from the
//! caller's pid namespace, so host-side callers get host pids, and a container sees only its
//! own), utilisation over the last second of the device timeline, and the driver's buffer of
//! per-process SM utilisation samples, made of the kernel time it charged to each process
//! (`samples`). Every figure comes from the simulated driver's state, never from a slice's
//! `usage` file.

use std::ffi::c_uint;
use std::path::Path;

use gpuslice_cuda_ffi::nvml::*;
use gpuslice_sim_core::procs::{pid_ns_inode, visible_pid};
use gpuslice_sim_core::{now_ns, MemoryFigures, SlotUsage};

use crate::ffi::{get, guard, put, put_slice, NvResult};
use crate::samples::{self, Reply};
use crate::state::nvml;

fn memory(device: nvmlDevice_t) -> NvResult<MemoryFigures> {
    let n = nvml()?;
    let (_, d) = n.device(device)?;
    n.node
        .memory(d.index as usize)
        .map_err(|_| NVML_ERROR_UNKNOWN)
}

/// NVML v1's figures: `total` all the memory, `used` the reserved memory and the
/// allocations, `free` the rest.
pub fn memory_v1(m: &MemoryFigures) -> nvmlMemory_t {
    nvmlMemory_t {
        total: m.total,
        free: m.free,
        used: m.nvml_v1_used(),
    }
}

/// NVML v2's figures: `total` all the memory, `reserved` the driver's, `used` the
/// allocations alone, `free` the rest.
pub fn memory_v2(m: &MemoryFigures) -> nvmlMemory_v2_t {
    nvmlMemory_v2_t {
        version: nvmlMemory_v2,
        total: m.total,
        reserved: m.reserved,
        free: m.free,
        used: m.used,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    out: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    guard(|| put(out, memory_v1(&memory(device)?)))
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
        put(out, memory_v2(&memory(device)?))
    })
}

/// The driver's processes on `device` that the caller can see: (pid as the caller sees
/// it, the slot's figures), and the device's host index.
fn visible_slots(device: nvmlDevice_t) -> NvResult<(usize, Vec<(u32, SlotUsage)>)> {
    let n = nvml()?;
    let (_, d) = n.device(device)?;
    let dev = d.index as usize;
    let usage = n
        .node
        .state()
        .slot_usage(dev)
        .map_err(|_| NVML_ERROR_UNKNOWN)?;
    let proc_root = Path::new("/proc");
    let own_ns = pid_ns_inode(proc_root, "self");
    let list = usage
        .into_iter()
        .filter_map(|u| visible_pid(proc_root, own_ns, u.pid, u.pid_ns).map(|pid| (pid, u)))
        .collect();
    Ok((dev, list))
}

/// The compute processes on `device`, pids as the caller sees them.
fn processes(device: nvmlDevice_t) -> NvResult<Vec<nvmlProcessInfo_t>> {
    Ok(visible_slots(device)?
        .1
        .iter()
        .map(|(pid, u)| nvmlProcessInfo_t {
            pid: *pid,
            usedGpuMemory: u.used,
            gpuInstanceId: u32::MAX,
            computeInstanceId: u32::MAX,
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

/// The oldest interface: `nvmlProcessInfo_v1_t` (pid and memory only).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> nvmlReturn_t {
    guard(|| {
        let list: Vec<nvmlProcessInfo_v1_t> = processes(device)?
            .iter()
            .map(|p| nvmlProcessInfo_v1_t {
                pid: p.pid,
                usedGpuMemory: p.usedGpuMemory,
            })
            .collect();
        let capacity = get(count.cast_const())? as usize;
        put(count, list.len() as c_uint)?;
        put_slice(infos, capacity, &list)
    })
}

/// Graphics processes: the simulated GPU runs compute only, so the lists are empty.
fn no_processes(device: nvmlDevice_t, count: *mut c_uint) -> NvResult {
    nvml()?.device(device)?;
    get(count.cast_const())?;
    put(count, 0)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses(
    device: nvmlDevice_t,
    count: *mut c_uint,
    _infos: *mut nvmlProcessInfo_v1_t,
) -> nvmlReturn_t {
    guard(|| no_processes(device, count))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v2(
    device: nvmlDevice_t,
    count: *mut c_uint,
    _infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    guard(|| no_processes(device, count))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    device: nvmlDevice_t,
    count: *mut c_uint,
    _infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    guard(|| no_processes(device, count))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    count: *mut c_uint,
    _infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    guard(|| no_processes(device, count))
}

/// The samples of the driver's buffer (`samples`) newer than `last_seen`, of the visible
/// processes on the device: several per process when several sample periods passed since,
/// none for a process that ran no kernel (`NVML_ERROR_NOT_FOUND` when no process ran one).
/// With `utilization` null, the count needed comes back with
/// `NVML_ERROR_INSUFFICIENT_SIZE`, as the real library does; so does a buffer too small.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    device: nvmlDevice_t,
    utilization: *mut nvmlProcessUtilizationSample_t,
    count: *mut c_uint,
    last_seen: std::ffi::c_ulonglong,
) -> nvmlReturn_t {
    guard(|| {
        let n = nvml()?;
        let (dev, list) = visible_slots(device)?;
        let now = now_ns();
        let state = n.node.state();
        let all = list
            .iter()
            .flat_map(|(pid, u)| {
                let (first, busy) = state.slot_history(u.slot, dev, now);
                samples::process_samples(*pid, first, &busy, n.wall_offset_ns)
            })
            .collect();
        let found = samples::newer_than(all, last_seen);
        let capacity = get(count.cast_const())? as usize;
        match samples::reply(found.len(), !utilization.is_null(), capacity) {
            Reply::NotFound => {
                put(count, 0)?;
                Err(NVML_ERROR_NOT_FOUND)
            }
            Reply::Size(needed) => {
                put(count, needed)?;
                Err(NVML_ERROR_INSUFFICIENT_SIZE)
            }
            Reply::Write(written) => {
                put_slice(utilization, capacity, &found)?;
                put(count, written)
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// NVML's documented semantics: v1 `used` = reserved + allocated, `free` = total - used;
    /// v2 `used` = allocated alone, `free` = total - reserved - used.
    #[test]
    fn v1_counts_the_reserved_memory_as_used_and_v2_names_it() {
        let m = MemoryFigures {
            total: 81559 * MIB,
            reserved: 470 * MIB,
            used: 1000 * MIB,
            free: 80089 * MIB,
        };
        let v1 = memory_v1(&m);
        assert_eq!(
            (v1.total, v1.used, v1.free),
            (81559 * MIB, 1470 * MIB, 80089 * MIB)
        );
        assert_eq!(v1.free, v1.total - v1.used);
        let v2 = memory_v2(&m);
        assert_eq!(v2.version, nvmlMemory_v2);
        assert_eq!(
            (v2.total, v2.reserved, v2.used, v2.free),
            (81559 * MIB, 470 * MIB, 1000 * MIB, 80089 * MIB)
        );
        assert_eq!(v2.free, v2.total - v2.reserved - v2.used);
    }
}
