//! Initialisation and contexts: `cuInit` is where a process without limits is refused;
//! contexts cannot be made on a device the slice does not include; destroying or resetting
//! a context gives back everything allocated in it.

use std::ffi::{c_int, c_uint};

use gpuslice_cuda_ffi::*;

use crate::account;
use crate::guard::guard;
use crate::log::warning;
use crate::state;

#[no_mangle]
pub unsafe extern "C" fn cuInit(flags: c_uint) -> CUresult {
    guard("cuInit", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuInit);
        if state::slice().is_none() {
            state::MODE.store(state::MODE_REFUSED, std::sync::atomic::Ordering::Relaxed);
            return CUDA_ERROR_NOT_INITIALIZED;
        }
        // SAFETY: the caller's argument.
        let r = unsafe { f(flags) };
        if r != CUDA_SUCCESS {
            return r;
        }
        match state::ready() {
            Ok(_) => CUDA_SUCCESS,
            Err(e) => e,
        }
    })
}

/// Refuses devices without a limits entry.
fn allowed(dev: CUdevice) -> Result<(), CUresult> {
    let (slice, devices) = state::ready()?;
    if devices.index(dev).is_some() {
        return Ok(());
    }
    warning!(
        "device {dev}: no entry in {}; refusing a context on it",
        slice.paths.limits.display()
    );
    Err(CUDA_ERROR_INVALID_DEVICE)
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    guard("cuDevicePrimaryCtxRetain", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuDevicePrimaryCtxRetain);
        tri!(allowed(dev));
        // SAFETY: the caller's arguments.
        let r = unsafe { f(pctx, dev) };
        if r == CUDA_SUCCESS && !pctx.is_null() {
            // SAFETY: written by the driver on success.
            account::set_primary(dev, unsafe { *pctx });
        }
        r
    })
}

/// After a release: if the primary context is gone, so is its memory.
fn after_release(dev: CUdevice) {
    let Some(get_state) = crate::real::cu::cuDevicePrimaryCtxGetState() else {
        return;
    };
    let (mut flags, mut active): (c_uint, c_int) = (0, 0);
    // SAFETY: valid out pointers.
    let r = unsafe { get_state(dev, &mut flags, &mut active) };
    if r == CUDA_SUCCESS && active == 0 {
        forget_primary(dev);
    }
}

fn forget_primary(dev: CUdevice) {
    if let Some(ctx) = account::primary(dev) {
        account::forget_context(ctx);
        crate::pacer::forget_context(ctx);
    }
}

macro_rules! primary_release {
    ($name:ident, $after:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(dev: CUdevice) -> CUresult {
            guard(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                let f = real!($name);
                // SAFETY: the caller's argument.
                let r = unsafe { f(dev) };
                if r == CUDA_SUCCESS {
                    $after(dev);
                }
                r
            })
        }
    };
}
primary_release!(cuDevicePrimaryCtxRelease, after_release);
primary_release!(cuDevicePrimaryCtxRelease_v2, after_release);
primary_release!(cuDevicePrimaryCtxReset, forget_primary);
primary_release!(cuDevicePrimaryCtxReset_v2, forget_primary);

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v2(
    pctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    guard("cuCtxCreate_v2", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuCtxCreate_v2);
        tri!(allowed(dev));
        // SAFETY: the caller's arguments.
        unsafe { f(pctx, flags, dev) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v3(
    pctx: *mut CUcontext,
    params: *mut CUexecAffinityParam,
    nparams: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    guard("cuCtxCreate_v3", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuCtxCreate_v3);
        tri!(allowed(dev));
        // SAFETY: the caller's arguments.
        unsafe { f(pctx, params, nparams, flags, dev) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut CUcontext,
    params: *mut CUctxCreateParams,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    guard("cuCtxCreate_v4", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuCtxCreate_v4);
        tri!(allowed(dev));
        // SAFETY: the caller's arguments.
        unsafe { f(pctx, params, flags, dev) }
    })
}

macro_rules! ctx_destroy {
    ($name:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(ctx: CUcontext) -> CUresult {
            guard(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                let f = real!($name);
                // SAFETY: the caller's argument.
                let r = unsafe { f(ctx) };
                if r == CUDA_SUCCESS {
                    account::forget_context(ctx as usize);
                    crate::pacer::forget_context(ctx as usize);
                }
                r
            })
        }
    };
}
ctx_destroy!(cuCtxDestroy);
ctx_destroy!(cuCtxDestroy_v2);
