//! NVML memory queries report the slice like `cuMemGetInfo` does; an NVML device is matched
//! to its limits entry by `nvmlDeviceGetUUID`.

use std::collections::HashMap;
use std::ffi::{c_char, CStr};

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
        match slice_figures(dev, m.total, m.free) {
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
        match slice_figures(dev, m.total, m.free) {
            Ok(fig) => {
                (m.total, m.free, m.used, m.reserved) = (fig.total, fig.free, fig.used, 0);
                r
            }
            Err(e) => e,
        }
    })
}

/// For the child after `fork`.
pub fn reset_in_child() {
    HANDLES.reset_in_child();
}
