//! Optional NVML figures: `libnvidia-ml.so.1` loaded with `dlopen`, the device found by the
//! CUDA device's UUID (NVML and CUDA may number devices differently), its memory read with
//! `nvmlDeviceGetMemoryInfo`; and the view a monitoring tool (`nvidia-smi`) takes of every
//! GPU: both memory-info versions and every process-list version. Any failure yields a
//! reason instead of figures.

use std::ffi::{c_uint, CString};

use gpuslice_cuda_ffi::nvml::*;

use crate::dl::{as_fn, Library};

/// NVML's view of one device's memory.
#[derive(Debug, Clone, Copy)]
pub struct NvmlMemory {
    pub total: u64,
    pub used: u64,
    pub free: u64,
}

fn status(call: &str, r: nvmlReturn_t) -> Result<(), String> {
    if r == NVML_SUCCESS {
        Ok(())
    } else {
        Err(format!(
            "{call} failed: {}",
            r.name().unwrap_or("unknown NVML status")
        ))
    }
}

/// Memory of the GPU with `uuid` through NVML at `lib`.
pub fn memory(lib: &str, uuid: &str) -> Result<NvmlMemory, String> {
    let lib = Library::open(lib).map_err(|e| e.to_string())?;
    let sym = |name: &str| {
        lib.sym(name)
            .ok_or_else(|| format!("{} does not export {name}", lib.name))
    };
    // SAFETY: each symbol is resolved by its exact exported name, whose signature is the
    // corresponding PFN type.
    let (init, shutdown, by_uuid, mem): (
        PFN_nvmlInit_v2,
        PFN_nvmlShutdown,
        PFN_nvmlDeviceGetHandleByUUID,
        PFN_nvmlDeviceGetMemoryInfo,
    ) = unsafe {
        (
            as_fn(sym("nvmlInit_v2")?),
            as_fn(sym("nvmlShutdown")?),
            as_fn(sym("nvmlDeviceGetHandleByUUID")?),
            as_fn(sym("nvmlDeviceGetMemoryInfo")?),
        )
    };
    // SAFETY: nvmlInit_v2 takes no arguments.
    status("nvmlInit_v2", unsafe { init() })?;
    let result = (|| {
        let cuuid = CString::new(uuid).map_err(|_| "uuid contains NUL".to_string())?;
        let mut dev: nvmlDevice_t = std::ptr::null_mut();
        // SAFETY: valid C string and out-pointer.
        status("nvmlDeviceGetHandleByUUID", unsafe {
            by_uuid(cuuid.as_ptr(), &mut dev)
        })?;
        let mut m = nvmlMemory_t::default();
        // SAFETY: a handle from NVML and a valid out-pointer.
        status("nvmlDeviceGetMemoryInfo", unsafe { mem(dev, &mut m) })?;
        Ok(NvmlMemory {
            total: m.total,
            used: m.used,
            free: m.free,
        })
    })();
    // SAFETY: balances the successful nvmlInit_v2.
    unsafe { shutdown() };
    result
}

/// Signature of the process lists with the v1 entry layout (the unversioned names).
type ProcessesV1 =
    unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut nvmlProcessInfo_v1_t) -> nvmlReturn_t;
/// Signature of the process lists with the v2 entry layout (`_v2`, `_v3`).
type ProcessesV2 =
    unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut nvmlProcessInfo_t) -> nvmlReturn_t;

/// One process list as NVML returned it: `(pid, bytes)` per entry.
pub type ProcessList = Vec<(u32, u64)>;

/// What a monitoring tool (`nvidia-smi`) reads about one GPU: memory through both
/// `nvmlDeviceGetMemoryInfo` versions and every compute and graphics process list version.
#[derive(Debug, Clone)]
pub struct DeviceView {
    pub index: u32,
    pub uuid: String,
    pub v1: NvmlMemory,
    pub v2: NvmlMemory,
    /// `(list name, entries)` of each list the library exports.
    pub lists: Vec<(&'static str, ProcessList)>,
}

impl DeviceView {
    pub fn to_json(&self) -> serde_json::Value {
        let lists: serde_json::Map<String, serde_json::Value> = self
            .lists
            .iter()
            .map(|(name, l)| {
                (
                    name.to_string(),
                    serde_json::json!({
                        "count": l.len(),
                        "used": l.iter().map(|(_, u)| u).sum::<u64>(),
                        "pids": l.iter().map(|(p, _)| p).collect::<Vec<_>>(),
                        "entries": l,
                    }),
                )
            })
            .collect();
        serde_json::json!({
            "index": self.index,
            "uuid": self.uuid,
            "v1": {"total": self.v1.total, "used": self.v1.used, "free": self.v1.free},
            "v2": {"total": self.v2.total, "used": self.v2.used, "free": self.v2.free},
            "processes": lists,
        })
    }
}

fn list<T: Copy + Default>(
    f: unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut T) -> nvmlReturn_t,
    name: &str,
    dev: nvmlDevice_t,
    entry: impl Fn(&T) -> (u32, u64),
) -> Result<ProcessList, String> {
    let mut count: c_uint = 0;
    // SAFETY: a size query: count 0 and no array.
    let r = unsafe { f(dev, &mut count, std::ptr::null_mut()) };
    if r != NVML_SUCCESS && r != NVML_ERROR_INSUFFICIENT_SIZE {
        status(name, r)?;
    }
    let mut buf = vec![T::default(); count as usize + 8];
    let mut n = buf.len() as c_uint;
    // SAFETY: an array of `n` entries of the layout `f` takes.
    status(name, unsafe { f(dev, &mut n, buf.as_mut_ptr()) })?;
    Ok(buf.iter().take(n as usize).map(entry).collect())
}

/// NVML's view of the GPUs whose UUIDs are `uuids` (all visible GPUs when empty), through the
/// library at `lib`.
pub fn view(lib: &str, uuids: &[String]) -> Result<Vec<DeviceView>, String> {
    let lib = Library::open(lib).map_err(|e| e.to_string())?;
    let sym = |name: &str| {
        lib.sym(name)
            .ok_or_else(|| format!("{} does not export {name}", lib.name))
    };
    // SAFETY: each symbol is resolved by its exact exported name, whose signature is the
    // corresponding PFN type.
    let (init, shutdown, count, by_index, get_uuid, mem, mem2) = unsafe {
        (
            as_fn::<PFN_nvmlInit_v2>(sym("nvmlInit_v2")?),
            as_fn::<PFN_nvmlShutdown>(sym("nvmlShutdown")?),
            as_fn::<PFN_nvmlDeviceGetCount_v2>(sym("nvmlDeviceGetCount_v2")?),
            as_fn::<PFN_nvmlDeviceGetHandleByIndex_v2>(sym("nvmlDeviceGetHandleByIndex_v2")?),
            as_fn::<PFN_nvmlDeviceGetUUID>(sym("nvmlDeviceGetUUID")?),
            as_fn::<PFN_nvmlDeviceGetMemoryInfo>(sym("nvmlDeviceGetMemoryInfo")?),
            as_fn::<PFN_nvmlDeviceGetMemoryInfo_v2>(sym("nvmlDeviceGetMemoryInfo_v2")?),
        )
    };
    let v1_lists: Vec<(&'static str, ProcessesV1)> = [
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetGraphicsRunningProcesses",
    ]
    .into_iter()
    // SAFETY: these names take the v1 entry layout.
    .filter_map(|n| lib.sym(n).map(|p| (n, unsafe { as_fn::<ProcessesV1>(p) })))
    .collect();
    let v2_lists: Vec<(&'static str, ProcessesV2)> = [
        "nvmlDeviceGetComputeRunningProcesses_v2",
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetGraphicsRunningProcesses_v2",
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
    ]
    .into_iter()
    // SAFETY: these names take the v2 entry layout.
    .filter_map(|n| lib.sym(n).map(|p| (n, unsafe { as_fn::<ProcessesV2>(p) })))
    .collect();
    // SAFETY: nvmlInit_v2 takes no arguments.
    status("nvmlInit_v2", unsafe { init() })?;
    let result = (|| {
        let mut n: c_uint = 0;
        // SAFETY: a valid out-pointer.
        status("nvmlDeviceGetCount_v2", unsafe { count(&mut n) })?;
        let mut out = Vec::new();
        for index in 0..n {
            let mut dev: nvmlDevice_t = std::ptr::null_mut();
            // SAFETY: an index below the count and a valid out-pointer.
            status("nvmlDeviceGetHandleByIndex_v2", unsafe {
                by_index(index, &mut dev)
            })?;
            let mut buf = [0 as std::ffi::c_char; NVML_DEVICE_UUID_V2_BUFFER_SIZE];
            // SAFETY: a buffer of the stated length.
            status("nvmlDeviceGetUUID", unsafe {
                get_uuid(dev, buf.as_mut_ptr(), buf.len() as c_uint)
            })?;
            // SAFETY: NVML NUL-terminates within the buffer on success.
            let uuid = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
                .to_string_lossy()
                .into_owned();
            if !uuids.is_empty() && !uuids.iter().any(|u| u.eq_ignore_ascii_case(&uuid)) {
                continue;
            }
            let mut m = nvmlMemory_t::default();
            // SAFETY: a handle from NVML and a valid out-pointer.
            status("nvmlDeviceGetMemoryInfo", unsafe { mem(dev, &mut m) })?;
            let mut m2 = nvmlMemory_v2_t {
                version: nvmlMemory_v2,
                ..Default::default()
            };
            // SAFETY: as above, with the version set.
            status("nvmlDeviceGetMemoryInfo_v2", unsafe { mem2(dev, &mut m2) })?;
            let mut lists = Vec::new();
            for (name, f) in &v1_lists {
                lists.push((*name, list(*f, name, dev, |p| (p.pid, p.usedGpuMemory))?));
            }
            for (name, f) in &v2_lists {
                lists.push((*name, list(*f, name, dev, |p| (p.pid, p.usedGpuMemory))?));
            }
            out.push(DeviceView {
                index,
                uuid,
                v1: NvmlMemory {
                    total: m.total,
                    used: m.used,
                    free: m.free,
                },
                v2: NvmlMemory {
                    total: m2.total,
                    used: m2.used,
                    free: m2.free,
                },
                lists,
            });
        }
        Ok(out)
    })();
    // SAFETY: balances the successful nvmlInit_v2.
    unsafe { shutdown() };
    result
}
