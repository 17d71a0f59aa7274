//! Linear, pitched, managed, stream-ordered and pool allocations and their frees.

use std::ffi::c_uint;

use gpuslice_cuda_ffi::*;

use crate::account::{self, Kind, Target};
use crate::ffi_extra::CUdeviceptr_v1;
use crate::guard::guard;
use crate::sizes::pitch_estimate;
use crate::state;

/// Charges `bytes` on the current context's device and runs `call`, which returns the new
/// device address.
fn alloc_current(bytes: u64, call: impl FnOnce() -> Result<u64, CUresult>) -> CUresult {
    let (slice, devices) = tri!(state::ready());
    let t = tri!(account::target_current(devices));
    account::allocate(slice, t, Kind::Ptr, bytes, call)
}

fn ok_then<T>(r: CUresult, value: impl FnOnce() -> T) -> Result<T, CUresult> {
    if r == CUDA_SUCCESS {
        Ok(value())
    } else {
        Err(r)
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    guard("cuMemAlloc_v2", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuMemAlloc_v2);
        alloc_current(bytesize as u64, || {
            // SAFETY: the caller's arguments, unchanged; dptr is read only after success.
            ok_then(unsafe { f(dptr, bytesize) }, || unsafe { *dptr })
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc(dptr: *mut CUdeviceptr_v1, bytesize: c_uint) -> CUresult {
    guard("cuMemAlloc", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuMemAlloc);
        alloc_current(u64::from(bytesize), || {
            // SAFETY: as for cuMemAlloc_v2.
            ok_then(unsafe { f(dptr, bytesize) }, || u64::from(unsafe { *dptr }))
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    flags: c_uint,
) -> CUresult {
    guard("cuMemAllocManaged", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuMemAllocManaged);
        alloc_current(bytesize as u64, || {
            // SAFETY: as for cuMemAlloc_v2.
            ok_then(unsafe { f(dptr, bytesize, flags) }, || unsafe { *dptr })
        })
    })
}

/// Pitched allocations: charge an upper bound first, then settle on the pitch the driver
/// chose (refusing, and freeing, if even that does not fit).
fn alloc_pitch(
    width: u64,
    height: u64,
    call: impl FnOnce() -> Result<(u64, u64), CUresult>,
    free: impl FnOnce(u64),
) -> CUresult {
    let (slice, devices) = tri!(state::ready());
    let t = tri!(account::target_current(devices));
    let estimate = pitch_estimate(width, height);
    tri!(account::reserve(slice, t, estimate));
    let (ptr, pitch) = match call() {
        Ok(v) => v,
        Err(r) => {
            slice.usage.release(t.idx, estimate);
            return r;
        }
    };
    let actual = pitch.saturating_mul(height.max(1));
    if actual > estimate {
        if let Err(r) = account::reserve(slice, t, actual - estimate) {
            slice.usage.release(t.idx, estimate);
            free(ptr);
            return r;
        }
    } else {
        slice.usage.release(t.idx, estimate - actual);
    }
    account::record(Kind::Ptr, ptr, t, actual);
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: c_uint,
) -> CUresult {
    guard("cuMemAllocPitch_v2", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuMemAllocPitch_v2);
        let free = crate::real::cu::cuMemFree_v2();
        alloc_pitch(
            width as u64,
            height as u64,
            || {
                ok_then(
                    // SAFETY: the caller's arguments.
                    unsafe { f(dptr, pitch, width, height, elem) },
                    // SAFETY: read only after success, when the driver wrote both.
                    || unsafe { (*dptr, *pitch as u64) },
                )
            },
            |p| {
                if let Some(free) = free {
                    // SAFETY: freeing the allocation just made.
                    unsafe { free(p) };
                }
            },
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch(
    dptr: *mut CUdeviceptr_v1,
    pitch: *mut c_uint,
    width: c_uint,
    height: c_uint,
    elem: c_uint,
) -> CUresult {
    guard("cuMemAllocPitch", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuMemAllocPitch);
        let free = crate::real::cu::cuMemFree();
        alloc_pitch(
            u64::from(width),
            u64::from(height),
            || {
                ok_then(
                    // SAFETY: the caller's arguments.
                    unsafe { f(dptr, pitch, width, height, elem) },
                    // SAFETY: read only after success, when the driver wrote both.
                    || unsafe { (u64::from(*dptr), u64::from(*pitch)) },
                )
            },
            |p| {
                if let Some(free) = free {
                    // SAFETY: freeing the allocation just made (32-bit address from the driver).
                    unsafe { free(p as CUdeviceptr_v1) };
                }
            },
        )
    })
}

/// Frees through `call`, then gives the allocation back.
fn free_ptr(ptr: u64, call: impl FnOnce() -> CUresult) -> CUresult {
    let r = call();
    if r == CUDA_SUCCESS {
        account::forget(Kind::Ptr, ptr);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    guard("cuMemFree_v2", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuMemFree_v2);
        // SAFETY: the caller's argument.
        free_ptr(dptr, || unsafe { f(dptr) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFree(dptr: CUdeviceptr_v1) -> CUresult {
    guard("cuMemFree", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuMemFree);
        // SAFETY: the caller's argument.
        free_ptr(u64::from(dptr), || unsafe { f(dptr) })
    })
}

macro_rules! alloc_async {
    ($name:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            dptr: *mut CUdeviceptr,
            bytesize: usize,
            stream: CUstream,
        ) -> CUresult {
            guard(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                let f = real!($name);
                alloc_current(bytesize as u64, || {
                    // SAFETY: the caller's arguments; dptr read only after success.
                    ok_then(unsafe { f(dptr, bytesize, stream) }, || unsafe { *dptr })
                })
            })
        }
    };
}
alloc_async!(cuMemAllocAsync);
alloc_async!(cuMemAllocAsync_ptsz);

macro_rules! free_async {
    ($name:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
            guard(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                let f = real!($name);
                // SAFETY: the caller's arguments.
                free_ptr(dptr, || unsafe { f(dptr, stream) })
            })
        }
    };
}
free_async!(cuMemFreeAsync);
free_async!(cuMemFreeAsync_ptsz);

/// Pools created through the shim and their CUDA devices.
static POOLS: crate::forksafe::ForkSafe<std::collections::HashMap<usize, CUdevice>> =
    crate::forksafe::ForkSafe::new(std::collections::HashMap::new);

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolCreate(
    pool: *mut CUmemoryPool,
    props: *const CUmemPoolProps,
) -> CUresult {
    guard("cuMemPoolCreate", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuMemPoolCreate);
        // SAFETY: the caller's arguments.
        let r = unsafe { f(pool, props) };
        if r == CUDA_SUCCESS
            && !props.is_null()
            // SAFETY: on success the driver validated props (checked non-null).
            && unsafe { (*props).location.type_ } == CU_MEM_LOCATION_TYPE_DEVICE
        {
            // SAFETY: as above.
            let (p, dev) = unsafe { (*pool as usize, (*props).location.id) };
            POOLS.lock().insert(p, dev);
        }
        r
    })
}

macro_rules! alloc_from_pool {
    ($name:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            dptr: *mut CUdeviceptr,
            bytesize: usize,
            pool: CUmemoryPool,
            stream: CUstream,
        ) -> CUresult {
            guard(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                let f = real!($name);
                let (slice, devices) = tri!(state::ready());
                let pool_dev = POOLS.lock().get(&(pool as usize)).copied();
                let t: Target = match pool_dev {
                    Some(dev) => tri!(account::target_on(devices, dev)),
                    None => tri!(account::target_current(devices)),
                };
                account::allocate(slice, t, Kind::Ptr, bytesize as u64, || {
                    // SAFETY: the caller's arguments; dptr read only after success.
                    ok_then(unsafe { f(dptr, bytesize, pool, stream) }, || unsafe {
                        *dptr
                    })
                })
            })
        }
    };
}
alloc_from_pool!(cuMemAllocFromPoolAsync);
alloc_from_pool!(cuMemAllocFromPoolAsync_ptsz);

/// For the child after `fork`.
pub fn reset_in_child() {
    POOLS.reset_in_child();
}
