//! Initialisation, version, error strings and `cuGetProcAddress`, which resolves a base name
//! and version through the shared cuda-ffi table to this library's own functions, as the real
//! driver resolves to its own (never through `dlsym`, which a preloaded library could hook).

use std::ffi::{c_char, c_int, c_uint, c_void};

use gpuslice_cuda_ffi::*;

use crate::driver::{self, DRIVER_VERSION};
use crate::guard::{c_str, guard, put, CuResult};

#[no_mangle]
pub unsafe extern "C" fn cuInit(flags: c_uint) -> CUresult {
    guard(|| {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        driver::init().map(|_| ())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    guard(|| put(version, DRIVER_VERSION))
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(error: CUresult, out: *mut *const c_char) -> CUresult {
    guard(|| match error.name_cstr() {
        Some(s) => put(out, s.as_ptr()),
        None => {
            put(out, std::ptr::null())?;
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(error: CUresult, out: *mut *const c_char) -> CUresult {
    guard(|| match error.description_cstr() {
        Some(s) => put(out, s.as_ptr()),
        None => {
            put(out, std::ptr::null())?;
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    })
}

const KNOWN_FLAGS: cuuint64_t =
    CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;

fn get_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: cuuint64_t,
    status: *mut CUdriverProcAddressQueryResult,
) -> CuResult {
    let name = c_str(symbol)?;
    if pfn.is_null() || flags & !KNOWN_FLAGS != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let report = |s: CUdriverProcAddressQueryResult| {
        if status.is_null() {
            Ok(())
        } else {
            put(status, s)
        }
    };
    let found = name
        .to_str()
        .map_err(|_| procaddr::ResolveError::SymbolNotFound)
        .and_then(|n| procaddr::resolve(n, cuda_version, flags))
        .and_then(|sym| crate::symbols::lookup(sym).ok_or(procaddr::ResolveError::SymbolNotFound));
    match found {
        Ok(f) => {
            put(pfn, f)?;
            report(CU_GET_PROC_ADDRESS_SUCCESS)
        }
        Err(e) => {
            put(pfn, std::ptr::null_mut())?;
            report(match e {
                procaddr::ResolveError::SymbolNotFound => CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
                procaddr::ResolveError::VersionNotSufficient { .. } => {
                    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                }
            })?;
            Err(CUDA_ERROR_NOT_FOUND)
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: cuuint64_t,
) -> CUresult {
    guard(|| get_proc_address(symbol, pfn, cuda_version, flags, std::ptr::null_mut()))
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: cuuint64_t,
    status: *mut CUdriverProcAddressQueryResult,
) -> CUresult {
    guard(|| get_proc_address(symbol, pfn, cuda_version, flags, status))
}
