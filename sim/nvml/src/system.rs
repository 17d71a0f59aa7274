//! Library and system entry points: init, shutdown, error strings, driver versions.

use std::ffi::{c_char, c_uint};

use gpuslice_cuda_ffi::nvml::*;

use crate::ffi::{guard, put, put_str};
use crate::state;

/// Kernel driver version reported (the R550 branch ships CUDA 12.4).
pub const DRIVER_VERSION: &str = "550.54.15";
/// CUDA version reported.
pub const CUDA_DRIVER_VERSION: i32 = 12040;

#[no_mangle]
pub unsafe extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    guard(|| state::init(false))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlInitWithFlags(flags: c_uint) -> nvmlReturn_t {
    guard(|| {
        if flags & !(NVML_INIT_FLAG_NO_GPUS | NVML_INIT_FLAG_NO_ATTACH) != 0 {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        state::init(flags & NVML_INIT_FLAG_NO_GPUS != 0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    guard(state::shutdown)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    result.description_cstr().as_ptr()
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard(|| {
        state::nvml()?;
        put_str(version, length, DRIVER_VERSION)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(version: *mut i32) -> nvmlReturn_t {
    guard(|| put(version, CUDA_DRIVER_VERSION))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut i32) -> nvmlReturn_t {
    guard(|| put(version, CUDA_DRIVER_VERSION))
}
