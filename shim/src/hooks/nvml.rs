//! NVML in a slice shows the slice: memory queries report it like `cuMemGetInfo` does (the
//! driver's reserved memory left out of the total, no reserved part of its own), and
//! the running-process lists (compute, graphics and MPS, every version) list only the
//! slice's own processes, never the neighbours'. An NVML device is matched to its limits
//! entry by `nvmlDeviceGetUUID`. Utilisation queries pass through: they are device-wide.

use std::collections::HashMap;
use std::ffi::{c_char, c_uint, CStr};
use std::path::Path;

use gpuslice_cuda_ffi::nvml::*;

use crate::figures::{self, Figures};
use crate::forksafe::ForkSafe;
use crate::guard::guard;
use crate::log::warning;
use crate::real::nvml as real;
use crate::state;

/// Limits index per NVML device handle (`None`: not in the slice).
static HANDLES: ForkSafe<HashMap<usize, Option<usize>>> = ForkSafe::new(HashMap::new);

fn index_of(dev: nvmlDevice_t, slice: &state::Slice) -> Option<usize> {
    if let Some(i) = HANDLES.lock().get(&(dev as usize)) {
        return *i;
    }
    let get_uuid = real::nvmlDeviceGetUUID()?;
    let mut buf = [0 as c_char; NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    // SAFETY: a buffer of the stated length.
    if unsafe { get_uuid(dev, buf.as_mut_ptr(), buf.len() as u32) } != NVML_SUCCESS {
        return None;
    }
    // SAFETY: NVML NUL-terminates within the buffer on success.
    let uuid = unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    let idx = slice
        .limits
        .devices
        .iter()
        .position(|d| d.uuid.eq_ignore_ascii_case(&uuid));
    if idx.is_none() {
        warning!(
            "NVML device {uuid}: no entry in {}; reporting no memory",
            slice.paths.limits.display()
        );
    }
    HANDLES.lock().insert(dev as usize, idx);
    idx
}

/// The memory the driver reserves on `dev` (NVML v2's `reserved`; 0 where the driver has no
/// v2 query). NVML's total holds it, CUDA's leaves it out and no slice can allocate it, so a
/// slice's NVML total is clamped to the total without it, as its CUDA total is.
fn reserved(dev: nvmlDevice_t) -> u64 {
    let Some(f) = real::nvmlDeviceGetMemoryInfo_v2() else {
        return 0;
    };
    let mut m = nvmlMemory_v2_t {
        version: nvmlMemory_v2,
        ..Default::default()
    };
    // SAFETY: a handle NVML just accepted and a local out-pointer of the layout `version`
    // names.
    if unsafe { f(dev, &mut m) } == NVML_SUCCESS {
        m.reserved.min(m.total)
    } else {
        0
    }
}

fn slice_figures(dev: nvmlDevice_t, total: u64, free: u64) -> Result<Figures, nvmlReturn_t> {
    let slice = state::slice().ok_or(NVML_ERROR_NO_PERMISSION)?;
    Ok(figures::for_slice(slice, index_of(dev, slice), total, free))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    dev: nvmlDevice_t,
    mem: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    guard("nvmlDeviceGetMemoryInfo", NVML_ERROR_UNKNOWN, || {
        let Some(f) = real::nvmlDeviceGetMemoryInfo() else {
            return NVML_ERROR_FUNCTION_NOT_FOUND;
        };
        if state::slice().is_none() {
            return NVML_ERROR_NO_PERMISSION;
        }
        // SAFETY: the caller's arguments.
        let r = unsafe { f(dev, mem) };
        if r != NVML_SUCCESS || mem.is_null() {
            return r;
        }
        // SAFETY: written by NVML on success.
        let m = unsafe { &mut *mem };
        match slice_figures(dev, m.total.saturating_sub(reserved(dev)), m.free) {
            Ok(fig) => {
                (m.total, m.free, m.used) = (fig.total, fig.free, fig.used);
                r
            }
            Err(e) => e,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    dev: nvmlDevice_t,
    mem: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    guard("nvmlDeviceGetMemoryInfo_v2", NVML_ERROR_UNKNOWN, || {
        let Some(f) = real::nvmlDeviceGetMemoryInfo_v2() else {
            return NVML_ERROR_FUNCTION_NOT_FOUND;
        };
        if state::slice().is_none() {
            return NVML_ERROR_NO_PERMISSION;
        }
        // SAFETY: the caller's arguments.
        let r = unsafe { f(dev, mem) };
        if r != NVML_SUCCESS || mem.is_null() {
            return r;
        }
        // SAFETY: written by NVML on success.
        let m = unsafe { &mut *mem };
        match slice_figures(dev, m.total.saturating_sub(m.reserved), m.free) {
            Ok(fig) => {
                (m.total, m.free, m.used, m.reserved) = (fig.total, fig.free, fig.used, 0);
                r
            }
            Err(e) => e,
        }
    })
}

/// An entry of an NVML process list, in the v1 or the v2/v3 layout.
trait ProcEntry: Copy + Default {
    fn pid(&self) -> u32;
    fn used(&self) -> u64;
    fn of(pid: u32, used: u64) -> Self;
}

impl ProcEntry for nvmlProcessInfo_v1_t {
    fn pid(&self) -> u32 {
        self.pid
    }
    fn used(&self) -> u64 {
        self.usedGpuMemory
    }
    fn of(pid: u32, used: u64) -> Self {
        nvmlProcessInfo_v1_t {
            pid,
            usedGpuMemory: used,
        }
    }
}

impl ProcEntry for nvmlProcessInfo_t {
    fn pid(&self) -> u32 {
        self.pid
    }
    fn used(&self) -> u64 {
        self.usedGpuMemory
    }
    fn of(pid: u32, used: u64) -> Self {
        nvmlProcessInfo_t {
            pid,
            usedGpuMemory: used,
            gpuInstanceId: u32::MAX,
            computeInstanceId: u32::MAX,
        }
    }
}

/// The driver's list from `f` (grown until it fits).
fn driver_list<T: ProcEntry>(
    f: unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut T) -> nvmlReturn_t,
    dev: nvmlDevice_t,
) -> Result<Vec<T>, nvmlReturn_t> {
    let mut cap: c_uint = 0;
    loop {
        let mut buf = vec![T::default(); cap as usize];
        let mut count = cap;
        let ptr = if buf.is_empty() {
            std::ptr::null_mut()
        } else {
            buf.as_mut_ptr()
        };
        // SAFETY: a buffer of `count` entries of the layout `f` takes (or null with 0).
        match unsafe { f(dev, &mut count, ptr) } {
            NVML_SUCCESS => {
                buf.truncate(count as usize);
                return Ok(buf);
            }
            NVML_ERROR_INSUFFICIENT_SIZE if count > cap && count < 65536 => cap = count + 8,
            e => return Err(e),
        }
    }
}

/// The slice's processes in the caller's pid namespace: (pid, bytes the slice charges it on
/// limits entry `idx`, 0 when `idx` is none).
fn slice_processes(slice: &state::Slice, idx: Option<usize>) -> Vec<(u32, u64)> {
    slice.usage.reclaim_dead();
    let snap = match gpuslice_slice::usage::read_snapshot(&slice.paths.usage) {
        Ok(s) => s,
        Err(e) => {
            warning!("{e}; NVML lists no process of the slice");
            return Vec::new();
        }
    };
    let own_ns = gpuslice_slice::usage::ProcessIdentity::current(Path::new("/proc")).pid_ns;
    snap.processes
        .iter()
        .filter(|p| p.pid_ns == own_ns)
        .map(|p| {
            let used = idx.and_then(|i| p.used.get(i).copied()).unwrap_or(0);
            (p.pid, used)
        })
        .collect()
}

/// Caps each figure so that the list never adds up to more than `limit`.
fn capped(list: &mut [(u32, u64)], limit: u64) {
    let mut left = limit;
    for (_, used) in list.iter_mut() {
        *used = (*used).min(left);
        left -= *used;
    }
}

/// Writes `list` into the caller's array of `*count` entries, as NVML does: the needed
/// count always, `NVML_ERROR_INSUFFICIENT_SIZE` when it does not fit.
fn put_list<T: ProcEntry>(count: *mut c_uint, infos: *mut T, list: &[(u32, u64)]) -> nvmlReturn_t {
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: checked non-null; the caller's capacity.
    let cap = unsafe { *count } as usize;
    // SAFETY: as above.
    unsafe { *count = list.len() as c_uint };
    if list.len() > cap {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if list.is_empty() {
        return NVML_SUCCESS;
    }
    if infos.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    for (i, (pid, used)) in list.iter().enumerate() {
        // SAFETY: the caller's array holds `cap >= list.len()` entries.
        unsafe { infos.add(i).write(T::of(*pid, *used)) };
    }
    NVML_SUCCESS
}

/// A compute list: the slice's processes holding memory on the device, each with what the
/// slice charges it (its allocations and its contexts' own memory), so the list adds up to
/// the used memory `nvmlDeviceGetMemoryInfo` and `cuMemGetInfo` report. The driver is asked
/// first, so an invalid handle or an uninitialised NVML fails as it would.
fn compute_list<T: ProcEntry>(
    f: Option<unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut T) -> nvmlReturn_t>,
    dev: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut T,
) -> nvmlReturn_t {
    let Some(f) = f else {
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    };
    let Some(slice) = state::slice() else {
        return NVML_ERROR_NO_PERMISSION;
    };
    if let Err(e) = driver_list(f, dev) {
        return e;
    }
    let idx = index_of(dev, slice);
    let mut list: Vec<(u32, u64)> = slice_processes(slice, idx)
        .into_iter()
        .filter(|(_, used)| *used > 0)
        .collect();
    let limit = idx
        .and_then(|i| slice.device(i))
        .map_or(0, |d| d.memory_limit);
    capped(&mut list, limit);
    put_list(count, infos, &list)
}

/// A graphics or MPS list: the driver's entries of the slice's own processes (none of a
/// device outside the slice), their figures capped so the list never exceeds the limit.
fn filtered_list<T: ProcEntry>(
    f: Option<unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut T) -> nvmlReturn_t>,
    dev: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut T,
) -> nvmlReturn_t {
    let Some(f) = f else {
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    };
    let Some(slice) = state::slice() else {
        return NVML_ERROR_NO_PERMISSION;
    };
    let driver = match driver_list(f, dev) {
        Ok(l) => l,
        Err(e) => return e,
    };
    let idx = index_of(dev, slice);
    let mut list: Vec<(u32, u64)> = match idx {
        Some(_) => {
            let ours = slice_processes(slice, idx);
            driver
                .iter()
                .filter(|e| ours.iter().any(|(pid, _)| *pid == e.pid()))
                .map(|e| (e.pid(), e.used()))
                .collect()
        }
        None => Vec::new(),
    };
    let limit = idx
        .and_then(|i| slice.device(i))
        .map_or(0, |d| d.memory_limit);
    capped(&mut list, limit);
    put_list(count, infos, &list)
}

macro_rules! process_list {
    ($name:ident, $entry:ty, $pfn:ty, $how:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            dev: nvmlDevice_t,
            count: *mut c_uint,
            infos: *mut $entry,
        ) -> nvmlReturn_t {
            guard(stringify!($name), NVML_ERROR_UNKNOWN, || {
                let f: Option<$pfn> = real::$name();
                $how(f, dev, count, infos)
            })
        }
    };
}

process_list!(
    nvmlDeviceGetComputeRunningProcesses,
    nvmlProcessInfo_v1_t,
    PFN_nvmlProcesses_v1,
    compute_list
);
process_list!(
    nvmlDeviceGetComputeRunningProcesses_v2,
    nvmlProcessInfo_t,
    PFN_nvmlProcesses_v2,
    compute_list
);
process_list!(
    nvmlDeviceGetComputeRunningProcesses_v3,
    nvmlProcessInfo_t,
    PFN_nvmlProcesses_v2,
    compute_list
);
process_list!(
    nvmlDeviceGetGraphicsRunningProcesses,
    nvmlProcessInfo_v1_t,
    PFN_nvmlProcesses_v1,
    filtered_list
);
process_list!(
    nvmlDeviceGetGraphicsRunningProcesses_v2,
    nvmlProcessInfo_t,
    PFN_nvmlProcesses_v2,
    filtered_list
);
process_list!(
    nvmlDeviceGetGraphicsRunningProcesses_v3,
    nvmlProcessInfo_t,
    PFN_nvmlProcesses_v2,
    filtered_list
);
process_list!(
    nvmlDeviceGetMPSComputeRunningProcesses,
    nvmlProcessInfo_v1_t,
    PFN_nvmlProcesses_v1,
    filtered_list
);
process_list!(
    nvmlDeviceGetMPSComputeRunningProcesses_v2,
    nvmlProcessInfo_t,
    PFN_nvmlProcesses_v2,
    filtered_list
);
process_list!(
    nvmlDeviceGetMPSComputeRunningProcesses_v3,
    nvmlProcessInfo_t,
    PFN_nvmlProcesses_v2,
    filtered_list
);

/// For the child after `fork`.
pub fn reset_in_child() {
    HANDLES.reset_in_child();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_never_adds_up_past_the_limit() {
        let mut l = vec![(1, 3), (2, 5), (3, 4)];
        capped(&mut l, 10);
        assert_eq!(l, vec![(1, 3), (2, 5), (3, 2)]);
        let mut l = vec![(1, 3)];
        capped(&mut l, 10);
        assert_eq!(l, vec![(1, 3)]);
    }

    #[test]
    fn put_list_reports_the_needed_count() {
        let list = [(7, 100), (8, 200)];
        let mut count: c_uint = 1;
        let mut buf = [nvmlProcessInfo_t::default(); 2];
        assert_eq!(
            put_list(&mut count, buf.as_mut_ptr(), &list),
            NVML_ERROR_INSUFFICIENT_SIZE
        );
        assert_eq!(count, 2);
        assert_eq!(put_list(&mut count, buf.as_mut_ptr(), &list), NVML_SUCCESS);
        assert_eq!((buf[1].pid, buf[1].usedGpuMemory), (8, 200));
        let mut zero: c_uint = 0;
        let none: *mut nvmlProcessInfo_v1_t = std::ptr::null_mut();
        assert_eq!(put_list(&mut zero, none, &[]), NVML_SUCCESS);
    }
}
