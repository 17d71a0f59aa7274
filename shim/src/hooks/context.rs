//! Initialisation and contexts: `cuInit` is where a process without limits is refused;
//! contexts cannot be made on a device the slice does not include; a context's own device
//! memory, measured from the driver's figures as it is created ([`crate::overhead`]), is
//! charged to the slice (a context the slice cannot hold is destroyed again and refused with
//! out-of-memory); destroying or resetting a context gives back that and what the driver
//! frees with it (not VMM, pool or graph memory, which no context owns); growing a
//! context's device malloc heap (`cuCtxSetLimit`) is charged.

use std::collections::HashMap;
use std::ffi::{c_int, c_uint};

use gpuslice_cuda_ffi::*;

use crate::account::{self, Kind};
use crate::forksafe::ForkSafe;
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

/// Refuses devices without a limits entry; the limits index of an allowed one.
fn allowed(dev: CUdevice) -> Result<usize, CUresult> {
    let (slice, devices) = state::ready()?;
    if let Some(idx) = devices.index(dev) {
        return Ok(idx);
    }
    warning!(
        "device {dev}: no entry in {}; refusing a context on it",
        slice.paths.limits.display()
    );
    Err(CUDA_ERROR_INVALID_DEVICE)
}

/// Runs `create` (which makes a context on the device with limits index `idx` and returns
/// the driver's status and the new context) measuring the context's own memory, and charges
/// that to the slice. When the slice cannot hold it, `undo` destroys the context again and
/// the creation is refused with out-of-memory.
fn create_charged(
    idx: usize,
    create: impl FnOnce() -> (CUresult, CUcontext),
    undo: impl FnOnce(CUcontext),
) -> CUresult {
    let Some(slice) = state::slice() else {
        return CUDA_ERROR_NOT_INITIALIZED;
    };
    let Some(uuid) = slice.device(idx).map(|d| d.uuid.clone()) else {
        return CUDA_ERROR_INVALID_DEVICE;
    };
    let ((r, ctx), bytes) = crate::overhead::measure(&uuid, create);
    if r != CUDA_SUCCESS || bytes == 0 || ctx.is_null() {
        return r;
    }
    let t = account::Target {
        idx,
        ctx: ctx as usize,
    };
    if let Err(e) = account::reserve(slice, t, bytes) {
        warning!(
            "a CUDA context on device {uuid} takes {bytes} bytes of device memory, more than the slice has left; context refused"
        );
        undo(ctx);
        return e;
    }
    crate::log::info!(
        "CUDA context on {uuid}: {bytes} bytes of device memory charged to the slice"
    );
    account::record(Kind::Context, ctx as u64, t, bytes);
    r
}

/// Whether `dev`'s primary context exists (a retain then only counts a reference).
fn primary_active(dev: CUdevice) -> bool {
    let Some(get_state) = crate::real::cu::cuDevicePrimaryCtxGetState() else {
        return false;
    };
    let (mut flags, mut active): (c_uint, c_int) = (0, 0);
    // SAFETY: valid out pointers.
    let r = unsafe { get_state(dev, &mut flags, &mut active) };
    r == CUDA_SUCCESS && active != 0
}

/// The driver's status and, on success, the context it wrote to `pctx` (not null).
fn created(r: CUresult, pctx: *mut CUcontext) -> (CUresult, CUcontext) {
    if r != CUDA_SUCCESS {
        return (r, std::ptr::null_mut());
    }
    // SAFETY: a non-null out-pointer the driver wrote on success.
    (r, unsafe { *pctx })
}

/// Destroys a created context the slice could not hold.
fn destroy_real(ctx: CUcontext) {
    if let Some(f) = crate::real::cu::cuCtxDestroy_v2() {
        // SAFETY: a context the driver just created.
        unsafe { f(ctx) };
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    guard("cuDevicePrimaryCtxRetain", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuDevicePrimaryCtxRetain);
        let idx = tri!(allowed(dev));
        if pctx.is_null() || primary_active(dev) {
            // SAFETY: the caller's arguments.
            let r = unsafe { f(pctx, dev) };
            if r == CUDA_SUCCESS && !pctx.is_null() {
                // SAFETY: written by the driver on success.
                account::set_primary(dev, unsafe { *pctx });
            }
            return r;
        }
        create_charged(
            idx,
            || {
                // SAFETY: the caller's arguments; `pctx` is not null.
                let r = unsafe { f(pctx, dev) };
                if r != CUDA_SUCCESS {
                    return (r, std::ptr::null_mut());
                }
                // SAFETY: written by the driver on success.
                let ctx = unsafe { *pctx };
                account::set_primary(dev, ctx);
                (r, ctx)
            },
            |_| {
                if let Some(release) = crate::real::cu::cuDevicePrimaryCtxRelease_v2() {
                    // SAFETY: balances the retain just made.
                    unsafe { release(dev) };
                }
                after_release(dev);
            },
        )
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
        destroyed(ctx, take_context(ctx));
    }
}

/// `cuDevicePrimaryCtxRelease(_v2)`: whether this release destroys the primary context is
/// known only after it, so context creations of this process wait until what died with it
/// is forgotten ([`crate::overhead::exclusive`]): none can get its handle and record memory
/// under it in between.
macro_rules! primary_release {
    ($name:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(dev: CUdevice) -> CUresult {
            guard(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                let f = real!($name);
                crate::overhead::exclusive(|| {
                    // SAFETY: the caller's argument.
                    let r = unsafe { f(dev) };
                    if r == CUDA_SUCCESS {
                        after_release(dev);
                    }
                    r
                })
            })
        }
    };
}
primary_release!(cuDevicePrimaryCtxRelease);
primary_release!(cuDevicePrimaryCtxRelease_v2);

/// `cuDevicePrimaryCtxReset(_v2)` destroys the primary context: what dies with it is taken
/// out before the driver is asked (see [`destroy_with`]).
macro_rules! primary_reset {
    ($name:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(dev: CUdevice) -> CUresult {
            guard(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                let f = real!($name);
                // SAFETY: the caller's argument.
                let call = || unsafe { f(dev) };
                // Without an active primary context there is nothing to destroy (and its
                // old handle may since name another context).
                match account::primary(dev).filter(|_| primary_active(dev)) {
                    Some(ctx) => destroy_with(ctx, call),
                    None => call(),
                }
            })
        }
    };
}
primary_reset!(cuDevicePrimaryCtxReset);
primary_reset!(cuDevicePrimaryCtxReset_v2);

/// `cuCtxCreate_v2` and the pre-3.2 `cuCtxCreate` (same signature): the device checked
/// against the slice, the context charged.
macro_rules! ctx_create {
    ($name:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            pctx: *mut CUcontext,
            flags: c_uint,
            dev: CUdevice,
        ) -> CUresult {
            guard(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                let f = real!($name);
                let idx = tri!(allowed(dev));
                if pctx.is_null() {
                    return CUDA_ERROR_INVALID_VALUE;
                }
                create_charged(
                    idx,
                    || {
                        // SAFETY: the caller's arguments; `pctx` is not null.
                        let r = unsafe { f(pctx, flags, dev) };
                        created(r, pctx)
                    },
                    destroy_real,
                )
            })
        }
    };
}
ctx_create!(cuCtxCreate);
ctx_create!(cuCtxCreate_v2);

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
        let idx = tri!(allowed(dev));
        if pctx.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        create_charged(
            idx,
            || {
                // SAFETY: the caller's arguments; `pctx` is not null.
                let r = unsafe { f(pctx, params, nparams, flags, dev) };
                created(r, pctx)
            },
            destroy_real,
        )
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
        let idx = tri!(allowed(dev));
        if pctx.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        create_charged(
            idx,
            || {
                // SAFETY: the caller's arguments; `pctx` is not null.
                let r = unsafe { f(pctx, params, flags, dev) };
                created(r, pctx)
            },
            destroy_real,
        )
    })
}

/// What the shim keeps for a context and forgets when the driver destroys it.
struct ContextState {
    charges: account::ContextCharges,
    /// Its malloc heap size as first seen ([`HEAP_BASE`]).
    heap_base: Option<u64>,
}

/// Takes out what dies with context `ctx` (see [`account::take_context`]).
fn take_context(ctx: usize) -> ContextState {
    ContextState {
        charges: account::take_context(ctx),
        heap_base: HEAP_BASE.lock().remove(&ctx),
    }
}

/// The driver destroyed context `ctx`: gives back what died with it.
fn destroyed(ctx: usize, taken: ContextState) {
    taken.charges.release();
    crate::pacer::forget_context(ctx);
}

/// Destroys context `ctx` through `call`. What dies with it leaves the shim's tables before
/// the driver is asked, as every free does (docs/shim.md, "Frees and reused handles"): once
/// the driver destroyed it, another thread's creation may get the same handle and record its
/// own memory and allocations under it, which must stay charged. If the driver refuses,
/// everything is put back.
fn destroy_with(ctx: usize, call: impl FnOnce() -> CUresult) -> CUresult {
    let taken = take_context(ctx);
    let r = call();
    if r == CUDA_SUCCESS {
        destroyed(ctx, taken);
    } else {
        taken.charges.restore();
        if let Some(b) = taken.heap_base {
            HEAP_BASE.lock().entry(ctx).or_insert(b);
        }
    }
    r
}

macro_rules! ctx_destroy {
    ($name:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(ctx: CUcontext) -> CUresult {
            guard(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                let f = real!($name);
                // SAFETY: the caller's argument.
                destroy_with(ctx as usize, || unsafe { f(ctx) })
            })
        }
    };
}
ctx_destroy!(cuCtxDestroy);
ctx_destroy!(cuCtxDestroy_v2);

/// Each context's malloc heap size before the program first changed it: memory the context
/// came with, not charged.
static HEAP_BASE: ForkSafe<HashMap<usize, u64>> = ForkSafe::new(HashMap::new);

/// The heap size of the current context as first seen (the driver's default, 8 MiB, when it
/// cannot say).
fn heap_base(ctx: usize) -> u64 {
    if let Some(b) = HEAP_BASE.lock().get(&ctx).copied() {
        return b;
    }
    let mut v: usize = 8 << 20;
    if let Some(get) = crate::real::cu::cuCtxGetLimit() {
        // SAFETY: a valid out pointer; the limit of the current context.
        if unsafe { get(&mut v, CU_LIMIT_MALLOC_HEAP_SIZE) } != CUDA_SUCCESS {
            v = 8 << 20;
        }
    }
    *HEAP_BASE.lock().entry(ctx).or_insert(v as u64)
}

/// `cuCtxSetLimit`: growing the device malloc heap (`CU_LIMIT_MALLOC_HEAP_SIZE`) above what
/// the context started with takes device memory, so the growth is charged before the driver
/// is asked (refused with out-of-memory past the limit), given back when the heap shrinks or
/// the context goes. Other limits pass through.
#[no_mangle]
pub unsafe extern "C" fn cuCtxSetLimit(limit: CUlimit, value: usize) -> CUresult {
    guard("cuCtxSetLimit", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuCtxSetLimit);
        if limit != CU_LIMIT_MALLOC_HEAP_SIZE {
            // SAFETY: the caller's arguments.
            return unsafe { f(limit, value) };
        }
        let (slice, devices) = tri!(state::ready());
        let t = tri!(account::target_current(devices));
        let key = t.ctx as u64;
        let want = (value as u64).saturating_sub(heap_base(t.ctx));
        let had = account::charged(Kind::Heap, key).map_or(0, |e| e.bytes);
        if want > had {
            tri!(account::reserve(slice, t, want - had));
        }
        // SAFETY: the caller's arguments.
        let r = unsafe { f(limit, value) };
        if r != CUDA_SUCCESS {
            if want > had {
                slice.usage.release(t.idx, want - had);
            }
            return r;
        }
        if want < had {
            slice.usage.release(t.idx, had - want);
        }
        account::take(Kind::Heap, key);
        if want > 0 {
            account::record(Kind::Heap, key, t, want);
        }
        r
    })
}

/// For the child after `fork`.
pub fn reset_in_child() {
    HEAP_BASE.reset_in_child();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::account::Target;

    fn bytes(kind: Kind, key: u64) -> Option<u64> {
        account::charged(kind, key).map(|e| e.bytes)
    }

    #[test]
    fn a_context_the_driver_hands_out_again_during_a_destroy_keeps_its_charges() {
        let a = 0x6100_0000usize;
        let t = Target { idx: 0, ctx: a };
        account::record(Kind::Context, a as u64, t, 100);
        account::record(Kind::Ptr, 0x6110_0000, t, 300);
        // Another thread's cuCtxCreate gets the same handle as soon as the driver destroyed
        // the context, before this destroy returns: its memory and allocations are its own.
        let r = destroy_with(a, || {
            account::record(Kind::Context, a as u64, t, 200);
            account::record(Kind::Ptr, 0x6120_0000, t, 400);
            CUDA_SUCCESS
        });
        assert_eq!(r, CUDA_SUCCESS);
        assert_eq!(bytes(Kind::Context, a as u64), Some(200));
        assert_eq!(bytes(Kind::Ptr, 0x6120_0000), Some(400));
        assert_eq!(bytes(Kind::Ptr, 0x6110_0000), None, "died with the context");
    }

    #[test]
    fn a_refused_destroy_keeps_the_context_charged() {
        let a = 0x6200_0000usize;
        let t = Target { idx: 0, ctx: a };
        account::record(Kind::Context, a as u64, t, 100);
        account::record(Kind::Array, 0x6210_0000, t, 300);
        let r = destroy_with(a, || CUDA_ERROR_INVALID_CONTEXT);
        assert_eq!(r, CUDA_ERROR_INVALID_CONTEXT);
        assert_eq!(bytes(Kind::Context, a as u64), Some(100));
        assert_eq!(bytes(Kind::Array, 0x6210_0000), Some(300));
    }

    #[test]
    fn memory_no_context_owns_outlives_its_context() {
        let a = 0x6300_0000usize;
        let t = Target { idx: 0, ctx: a };
        account::record(Kind::Context, a as u64, t, 1);
        account::record(Kind::Heap, a as u64, t, 2);
        account::record(Kind::Ptr, 0x6310_0000, t, 3);
        account::record(Kind::Mipmap, 0x6320_0000, t, 4);
        account::record(Kind::Vmm, 0x6330_0000, t, 5);
        account::record(Kind::GraphExec, 0x6340_0000, t, 6);
        account::record_stream_ordered(0x6350_0000, t, 7, 0x6360_0000);
        account::record_stream_ordered(0x6370_0000, t, 8, 0);
        assert_eq!(destroy_with(a, || CUDA_SUCCESS), CUDA_SUCCESS);
        for (kind, key) in [
            (Kind::Context, a as u64),
            (Kind::Heap, a as u64),
            (Kind::Ptr, 0x6310_0000),
            (Kind::Mipmap, 0x6320_0000),
        ] {
            assert_eq!(bytes(kind, key), None, "{kind:?} dies with its context");
        }
        assert_eq!(bytes(Kind::Vmm, 0x6330_0000), Some(5));
        assert_eq!(bytes(Kind::GraphExec, 0x6340_0000), Some(6));
        assert_eq!(bytes(Kind::Ptr, 0x6350_0000), Some(7), "pool memory");
        assert_eq!(
            bytes(Kind::Ptr, 0x6370_0000),
            Some(8),
            "escaped graph memory"
        );
    }
}
