//! Memory pools (`cuMemPoolCreate`, `cuMemAllocFromPoolAsync`): allocations from a pool are
//! charged like any other; a destroyed pool's outstanding allocations stay valid until freed,
//! as the driver documents.

use gpuslice_cuda_ffi::*;

use crate::driver::{driver, handle, id_of, AllocKind, Objects, Pool};
use crate::exports::memory::allocate;
use crate::guard::{get, guard, put, CuResult};

/// The default pool of ordinal `ord`, created on first use.
pub fn default_pool(o: &mut Objects, ord: usize) -> u64 {
    if let Some(p) = o.default_pools[ord] {
        return p;
    }
    let id = o.new_id();
    o.pools.insert(id, Pool { ordinal: ord });
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
        o.pools.insert(id, Pool { ordinal: ord });
        put(pool, handle(id))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult {
    guard(|| {
        let d = driver()?;
        let mut o = d.objects();
        let id = id_of(pool);
        if o.default_pools.contains(&Some(id)) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        o.pools
            .remove(&id)
            .map(|_| ())
            .ok_or(CUDA_ERROR_INVALID_VALUE)
    })
}

/// Freed memory goes back at once here, so there is never anything to trim.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolTrimTo(
    pool: CUmemoryPool,
    _min_bytes_to_keep: usize,
) -> CUresult {
    guard(|| {
        let d = driver()?;
        d.objects()
            .pools
            .get(&id_of(pool))
            .map(|_| ())
            .ok_or(CUDA_ERROR_INVALID_VALUE)
    })
}

fn alloc_from_pool(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CuResult {
    let d = driver()?;
    let (ctx, ord, pid) = {
        let o = d.objects();
        let sid = o.stream(stream)?;
        let pid = id_of(pool);
        let ord = o.pools.get(&pid).ok_or(CUDA_ERROR_INVALID_VALUE)?.ordinal;
        (o.streams[&sid].ctx, ord, pid)
    };
    if dptr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let va = allocate(d, ctx, ord, bytesize as u64, AllocKind::Pool(pid))?;
    put(dptr, va)
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
