//! Contexts: per-device primary contexts with retain counts (what the CUDA runtime uses),
//! created contexts, the per-thread context stack, and synchronisation. A context costs its
//! device's `context_memory`; destroying it gives that back with the memory it owns, as the
//! real driver does.

use std::ffi::{c_int, c_uint};

use gpuslice_cuda_ffi::*;
use gpuslice_sim_core::sleep_until;

use crate::driver::{self, driver, handle, id_of, Driver};
use crate::guard::{guard, put, CuResult};

fn retain_primary(d: &Driver, pctx: *mut CUcontext, dev: CUdevice) -> CuResult {
    let ord = d.ordinal(dev)?;
    let mut o = d.objects();
    let ctx = match o.primary[ord].ctx {
        Some(c) => c,
        None => {
            let c = o.create_context(d, ord)?;
            o.primary[ord].ctx = Some(c);
            c
        }
    };
    put(pctx, handle(ctx))?;
    o.primary[ord].refs += 1;
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    guard(|| retain_primary(driver()?, pctx, dev))
}

fn release_primary(dev: CUdevice) -> CuResult {
    let d = driver()?;
    let ord = d.ordinal(dev)?;
    let mut o = d.objects();
    let p = &mut o.primary[ord];
    if p.refs == 0 {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    p.refs -= 1;
    if p.refs == 0 {
        if let Some(c) = p.ctx.take() {
            o.destroy_context(d, c);
        }
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult {
    guard(|| release_primary(dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    guard(|| release_primary(dev))
}

fn reset_primary(dev: CUdevice) -> CuResult {
    let d = driver()?;
    let ord = d.ordinal(dev)?;
    let mut o = d.objects();
    o.primary[ord].refs = 0;
    if let Some(c) = o.primary[ord].ctx.take() {
        o.destroy_context(d, c);
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult {
    guard(|| reset_primary(dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult {
    guard(|| reset_primary(dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    dev: CUdevice,
    flags: *mut c_uint,
    active: *mut c_int,
) -> CUresult {
    guard(|| {
        let d = driver()?;
        let ord = d.ordinal(dev)?;
        let o = d.objects();
        let p = &o.primary[ord];
        put(flags, p.flags)?;
        put(active, c_int::from(p.ctx.is_some() && p.refs > 0))
    })
}

fn set_primary_flags(dev: CUdevice, flags: c_uint) -> CuResult {
    let d = driver()?;
    let ord = d.ordinal(dev)?;
    if flags & !0x1f != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    d.objects().primary[ord].flags = flags;
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxSetFlags(dev: CUdevice, flags: c_uint) -> CUresult {
    guard(|| set_primary_flags(dev, flags))
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: c_uint) -> CUresult {
    guard(|| set_primary_flags(dev, flags))
}

fn create(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CuResult {
    let d = driver()?;
    let ord = d.ordinal(dev)?;
    if pctx.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if flags & !0x1f != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut o = d.objects();
    let c = o.create_context(d, ord)?;
    put(pctx, handle(c))?;
    driver::push_current(o.entry(c)?);
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v2(
    pctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    guard(|| create(pctx, flags, dev))
}

/// Execution-affinity parameters are accepted and ignored (no SM partitioning here).
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v3(
    pctx: *mut CUcontext,
    params: *mut CUexecAffinityParam,
    num_params: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        if num_params < 0 || (num_params > 0 && params.is_null()) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        create(pctx, flags, dev)
    })
}

/// Creation parameters (affinity, CIG) are accepted and ignored.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut CUcontext,
    _params: *mut CUctxCreateParams,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    guard(|| create(pctx, flags, dev))
}

fn destroy(ctx: CUcontext) -> CuResult {
    let d = driver()?;
    let id = id_of(ctx);
    let mut o = d.objects();
    if o.primary.iter().any(|p| p.ctx == Some(id)) {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    let entry = o.entry(id)?;
    o.destroy_context(d, id);
    if driver::current_entry() == Some(entry) {
        driver::pop_current();
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult {
    guard(|| destroy(ctx))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy(ctx: CUcontext) -> CUresult {
    guard(|| destroy(ctx))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    guard(|| {
        let d = driver()?;
        if ctx.is_null() {
            driver::set_current(None);
            return Ok(());
        }
        let entry = d.objects().entry(id_of(ctx))?;
        driver::set_current(Some(entry));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult {
    guard(|| {
        driver()?;
        put(
            pctx,
            driver::current_ctx_id()
                .map(handle)
                .unwrap_or(std::ptr::null_mut()),
        )
    })
}

fn push(ctx: CUcontext) -> CuResult {
    let d = driver()?;
    let entry = d.objects().entry(id_of(ctx))?;
    driver::push_current(entry);
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxPushCurrent_v2(ctx: CUcontext) -> CUresult {
    guard(|| push(ctx))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxPushCurrent(ctx: CUcontext) -> CUresult {
    guard(|| push(ctx))
}

fn pop(pctx: *mut CUcontext) -> CuResult {
    driver()?;
    let (id, _) = driver::pop_current().ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
    if !pctx.is_null() {
        put(pctx, handle(id))?;
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) -> CUresult {
    guard(|| pop(pctx))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent(pctx: *mut CUcontext) -> CUresult {
    guard(|| pop(pctx))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(device: *mut CUdevice) -> CUresult {
    guard(|| {
        let ord = driver()?.objects().current_ordinal()?;
        put(device, ord as CUdevice)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    guard(|| {
        let d = driver()?;
        let (c, until) = {
            let o = d.objects();
            let c = o.current()?;
            let until = o
                .streams
                .values()
                .filter(|s| s.ctx == c)
                .map(|s| s.tail)
                .max()
                .unwrap_or(0);
            (c, until)
        };
        sleep_until(until);
        // A fault while the work ran fails it: the error surfaces here, as on a real driver.
        d.objects().check_context(c)
    })
}

/// `cuCtxSetLimit` on the current context. Growing the device malloc heap
/// (`CU_LIMIT_MALLOC_HEAP_SIZE`) beyond the default 8 MiB takes device memory: the excess is
/// charged (out of memory past capacity) and given back when the heap shrinks or the context
/// is destroyed. The other limits are stored.
#[no_mangle]
pub unsafe extern "C" fn cuCtxSetLimit(limit: CUlimit, value: usize) -> CUresult {
    guard(|| {
        let d = driver()?;
        let idx = usize::try_from(limit)
            .ok()
            .filter(|l| *l < 7)
            .ok_or(CUDA_ERROR_UNSUPPORTED_LIMIT)?;
        let mut o = d.objects();
        let ctx = o.current()?;
        let c = o.contexts.get_mut(&ctx).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        if limit == CU_LIMIT_MALLOC_HEAP_SIZE {
            let want = (value as u64).saturating_sub(driver::DEFAULT_MALLOC_HEAP);
            if want > c.heap_charge {
                d.charge(c.ordinal, want - c.heap_charge)?;
            } else {
                d.uncharge(c.ordinal, c.heap_charge - want);
            }
            c.heap_charge = want;
        }
        c.limits[idx] = value as u64;
        Ok(())
    })
}

/// `cuCtxGetLimit` of the current context.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetLimit(value: *mut usize, limit: CUlimit) -> CUresult {
    guard(|| {
        let d = driver()?;
        let idx = usize::try_from(limit)
            .ok()
            .filter(|l| *l < 7)
            .ok_or(CUDA_ERROR_UNSUPPORTED_LIMIT)?;
        let o = d.objects();
        let ctx = o.current()?;
        put(value, o.contexts[&ctx].limits[idx] as usize)
    })
}
