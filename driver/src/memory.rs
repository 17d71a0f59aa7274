//! A GPU's device memory as the driver reports it, and the one computation of what of it
//! gpuslice books: NVML's total less the memory the driver and firmware reserve, which is
//! what CUDA can allocate (`cuMemGetInfo` and `cuDeviceTotalMem` leave it out of their
//! total). NVML's v1 query (`nvmlDeviceGetMemoryInfo`, the one nvml-wrapper wraps) counts
//! the reserved memory in both `total` and `used`; only v2 (`nvmlDeviceGetMemoryInfo_v2`)
//! names it.

use nvml_wrapper::error::{nvml_try, NvmlError};
use nvml_wrapper::Device;
use nvml_wrapper_sys::bindings::{
    nvmlMemory_v2_t, nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
    nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND, nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
    NvmlLib,
};

/// The memory of a GPU that CUDA can allocate and gpuslice books: `total` (NVML's, all the
/// physical memory) less `reserved` (what the driver and firmware set aside).
pub fn bookable_memory(total: u64, reserved: u64) -> u64 {
    total.saturating_sub(reserved)
}

/// One GPU's memory, in NVML v2's terms.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceMemory {
    /// All the physical memory.
    pub total: u64,
    /// Set aside by the driver and firmware (0 where the driver does not tell).
    pub reserved: u64,
    /// Allocated by processes, the reserved memory not counted.
    pub used: u64,
}

impl DeviceMemory {
    /// [`bookable_memory`] of this GPU.
    pub fn bookable(&self) -> u64 {
        bookable_memory(self.total, self.reserved)
    }
}

/// The memory of `dev`: NVML v2's figures through `v2` (a second handle of the library
/// `dev`'s NVML was loaded from) where the driver has the query, else v1's total and used
/// with nothing known to be reserved.
pub fn device_memory(v2: Option<&NvmlLib>, dev: &Device<'_>) -> Result<DeviceMemory, NvmlError> {
    if let Some(get) = v2.and_then(|l| l.nvmlDeviceGetMemoryInfo_v2.as_ref().ok()) {
        let mut m = nvmlMemory_v2_t {
            version: gpuslice_cuda_ffi::nvml::nvmlMemory_v2,
            total: 0,
            reserved: 0,
            free: 0,
            used: 0,
        };
        // SAFETY: the handle is a live device of the initialised NVML that `v2` is a second
        // handle of (the same loaded object); the out-pointer is a local of the v2 layout
        // its `version` names.
        let ret = unsafe { get(dev.handle(), &mut m) };
        // A driver older than the v2 query (or than this structure version) answers v1 only.
        let unsupported = [
            nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
            nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND,
            nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
        ];
        if !unsupported.contains(&ret) {
            nvml_try(ret)?;
            return Ok(DeviceMemory {
                total: m.total,
                reserved: m.reserved.min(m.total),
                used: m.used,
            });
        }
    }
    let m = dev.memory_info()?;
    Ok(DeviceMemory {
        total: m.total,
        reserved: 0,
        used: m.used,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bookable_is_the_total_less_the_reserved_memory() {
        // An H100 80GB: NVML's 81559 MiB total, CUDA's 81089 MiB.
        assert_eq!(bookable_memory(81559 << 20, 470 << 20), 81089 << 20);
        assert_eq!(bookable_memory(1 << 30, 0), 1 << 30);
        assert_eq!(bookable_memory(1, 2), 0, "never below zero");
        let m = DeviceMemory {
            total: 10 << 30,
            reserved: 512 << 20,
            used: 1 << 30,
        };
        assert_eq!(m.bookable(), (10 << 30) - (512 << 20));
    }
}
