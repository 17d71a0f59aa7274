//! `cuGetProcAddress` and `cuGetProcAddress_v2`, how the CUDA runtime (11.3+) finds every
//! driver entry point: the real driver answers, then, if the symbol it returned (the base
//! name resolved for the requested `cudaVersion` and flags, through the cuda-ffi table) is
//! intercepted, the caller gets the shim's interceptor instead.

use std::ffi::{c_char, c_int, c_void, CStr, CString};

use gpuslice_cuda_ffi::*;

use crate::guard::guard;
use crate::intercept::wrapper;
use crate::real::CUDA;

/// The interceptor to hand out for `symbol` resolved at `version` with `flags` to `found`.
fn substitute(
    symbol: &str,
    version: c_int,
    flags: cuuint64_t,
    found: *mut c_void,
) -> Option<*mut c_void> {
    let resolved = gpuslice_cuda_ffi::resolve(symbol, version, flags).ok()?;
    // Prefer the variant whose real address is what the driver returned, so a driver that
    // resolves a flag differently from the table still gets the matching interceptor.
    let rows = gpuslice_cuda_ffi::procaddr::versions_of(symbol);
    let candidates = rows
        .iter()
        .rev()
        .filter(|r| r.since <= version)
        .take(1)
        .flat_map(|r| [Some(r.symbol), r.per_thread]);
    for c in candidates.flatten() {
        let Ok(name) = CString::new(c) else { continue };
        if CUDA.sym(&name) == found {
            return wrapper(c.as_bytes());
        }
    }
    wrapper(resolved.as_bytes())
}

/// Rewrites `*pfn` after a successful real lookup.
fn rewrite(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: cuuint64_t) {
    if symbol.is_null() || pfn.is_null() {
        return;
    }
    // SAFETY: the driver succeeded, so both pointers are valid.
    let (name, found) = unsafe { (CStr::from_ptr(symbol), *pfn) };
    let Ok(name) = name.to_str() else { return };
    if found.is_null() {
        return;
    }
    if let Some(w) = substitute(name, version, flags, found) {
        crate::log::debug!("cuGetProcAddress({name}, {version}, {flags}) -> interceptor");
        // SAFETY: checked non-null above.
        unsafe { *pfn = w };
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: cuuint64_t,
) -> CUresult {
    guard("cuGetProcAddress", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuGetProcAddress);
        // SAFETY: the caller's arguments.
        let r = unsafe { f(symbol, pfn, version, flags) };
        if r == CUDA_SUCCESS {
            rewrite(symbol, pfn, version, flags);
        }
        r
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: cuuint64_t,
    status: *mut CUdriverProcAddressQueryResult,
) -> CUresult {
    guard("cuGetProcAddress_v2", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuGetProcAddress_v2);
        // SAFETY: the caller's arguments.
        let r = unsafe { f(symbol, pfn, version, flags, status) };
        if r == CUDA_SUCCESS {
            rewrite(symbol, pfn, version, flags);
        }
        r
    })
}
