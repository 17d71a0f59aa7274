//! Memory pools (`cuMemPoolCreate`, `cuMemAllocFromPoolAsync`): allocations from a pool are
//! charged like any other; freed memory stays reserved in the pool up to its release
//! threshold (`cuMemPoolSetAttribute`) until reused, trimmed or the pool is destroyed; a
//! destroyed pool's outstanding allocations stay valid until freed, as the driver documents.

use gpuslice_cuda_ffi::*;

use std::ffi::{c_int, c_void};

use crate::driver::{driver, handle, id_of, AllocKind, Objects, Pool};
use crate::guard::{get, guard, put, CuResult};

/// The default pool of ordinal `ord`, created on first use.
pub fn default_pool(o: &mut Objects, ord: usize) -> u64 {
    if let Some(p) = o.default_pools[ord] {
        return p;
    }
    let id = o.new_id();
    o.pools.insert(id, Pool::new(ord));
    o.default_pools[ord] = Some(id);
    id
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolCreate(
    pool: *mut CUmemoryPool,
    props: *const CUmemPoolProps,
) -> CUresult {
    guard(|| {
        let d = driver()?;
        let p = get(props)?;
        if p.allocType != CU_MEM_ALLOCATION_TYPE_PINNED
            || p.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let ord = d
            .ordinal(p.location.id)
            .map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        if pool.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut o = d.objects();
        let id = o.new_id();
        o.pools.insert(id, Pool::new(ord));
        put(pool, handle(id))
    })
}

/// Destroys a pool, releasing what it keeps reserved; its live allocations stay valid.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult {
    guard(|| {
        let d = driver()?;
        let removed = {
            let mut o = d.objects();
            let id = id_of(pool);
            if o.default_pools.contains(&Some(id)) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let removed = o.pools.remove(&id).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            // Its outstanding allocations still name it: the id is given back with the last
            // of them (`exports::memory::free`).
            if !o
                .allocations
                .values()
                .any(|a| a.kind == AllocKind::Pool(id))
            {
                o.free_id(id);
            }
            removed
        };
        d.uncharge(removed.ordinal, removed.cached);
        Ok(())
    })
}

/// Releases what the pool keeps reserved beyond its live allocations, down to
/// `min_bytes_to_keep`.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: CUmemoryPool, min_bytes_to_keep: usize) -> CUresult {
    guard(|| {
        let d = driver()?;
        let (ord, released) = {
            let mut o = d.objects();
            let p = o
                .pools
                .get_mut(&id_of(pool))
                .ok_or(CUDA_ERROR_INVALID_VALUE)?;
            let keep = p.cached.min(min_bytes_to_keep as u64);
            let released = p.cached - keep;
            p.cached = keep;
            (p.ordinal, released)
        };
        d.uncharge(ord, released);
        Ok(())
    })
}

/// Sets a pool attribute: the release threshold (a `cuuint64_t`; lowering it releases what
/// is kept above it), the reuse flags (an `int`, accepted) and the high-water marks (reset).
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: CUmemoryPool,
    attr: CUmemPool_attribute,
    value: *mut c_void,
) -> CUresult {
    guard(|| {
        let d = driver()?;
        let (ord, released) = {
            let mut o = d.objects();
            let p = o
                .pools
                .get_mut(&id_of(pool))
                .ok_or(CUDA_ERROR_INVALID_VALUE)?;
            match attr {
                CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => {
                    p.threshold = get(value.cast::<u64>().cast_const())?;
                    let keep = p.cached.min(p.threshold);
                    let released = p.cached - keep;
                    p.cached = keep;
                    (p.ordinal, released)
                }
                CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES
                | CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC
                | CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
                    get(value.cast::<c_int>().cast_const())?;
                    (p.ordinal, 0)
                }
                CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH | CU_MEMPOOL_ATTR_USED_MEM_HIGH => (p.ordinal, 0),
                _ => return Err(CUDA_ERROR_INVALID_VALUE),
            }
        };
        d.uncharge(ord, released);
        Ok(())
    })
}

/// Reads a pool attribute: threshold, reserved (live + kept) and used (live) bytes as
/// `cuuint64_t` (the high-water marks report the current figures), reuse flags as `int` 1.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolGetAttribute(
    pool: CUmemoryPool,
    attr: CUmemPool_attribute,
    value: *mut c_void,
) -> CUresult {
    guard(|| {
        let d = driver()?;
        let o = d.objects();
        let p = o.pools.get(&id_of(pool)).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let bytes = match attr {
            CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => p.threshold,
            CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT | CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH => {
                p.used.saturating_add(p.cached)
            }
            CU_MEMPOOL_ATTR_USED_MEM_CURRENT | CU_MEMPOOL_ATTR_USED_MEM_HIGH => p.used,
            CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES
            | CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC
            | CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
                return put(value.cast::<c_int>(), 1);
            }
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        put(value.cast::<u64>(), bytes)
    })
}

fn alloc_from_pool(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CuResult {
    crate::exports::memory::alloc_on_stream(dptr, bytesize, stream, Some(id_of(pool)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    guard(|| alloc_from_pool(dptr, bytesize, pool, stream))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    guard(|| alloc_from_pool(dptr, bytesize, pool, stream))
}

fn device_pool(out: *mut CUmemoryPool, dev: CUdevice) -> CuResult {
    let d = driver()?;
    let ord = d.ordinal(dev)?;
    let id = default_pool(&mut d.objects(), ord);
    put(out, handle(id))
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(
    out: *mut CUmemoryPool,
    dev: CUdevice,
) -> CUresult {
    guard(|| device_pool(out, dev))
}

/// The current pool is always the default pool (`cuDeviceSetMemPool` is not simulated).
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetMemPool(out: *mut CUmemoryPool, dev: CUdevice) -> CUresult {
    guard(|| device_pool(out, dev))
}
