//! Optional NVML figures: `libnvidia-ml.so.1` loaded with `dlopen`, the device found by the
//! CUDA device's UUID (NVML and CUDA may number devices differently), its memory read with
//! `nvmlDeviceGetMemoryInfo`. Any failure yields a reason instead of figures.

use std::ffi::CString;

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
