//! Linear device memory: `cuMemAlloc`, pitched, managed and stream-ordered allocations, all
//! charged node-wide against the device's capacity (`CUDA_ERROR_OUT_OF_MEMORY` past it), and
//! `cuMemGetInfo` reporting the node-wide figures.

use std::ffi::c_uint;

use gpuslice_cuda_ffi::*;

use crate::driver::{driver, AllocKind, Allocation, Charge, Driver};
use crate::guard::{guard, put, CuResult};

/// Row alignment of pitched allocations.
pub const PITCH_ALIGNMENT: u64 = 512;

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    guard(|| {
        let d = driver()?;
        let ord = d.objects().current_ordinal()?;
        let m = d
            .node
            .memory(d.ordinals[ord])
            .map_err(|_| CUDA_ERROR_UNKNOWN)?;
        put(free, m.free as usize)?;
        put(total, m.total as usize)
    })
}

/// Charges `bytes` on `ord` for context `ctx` and records an allocation at a fresh address.
pub fn allocate(
    d: &Driver,
    ctx: u64,
    ord: usize,
    bytes: u64,
    kind: AllocKind,
) -> CuResult<CUdeviceptr> {
    if bytes == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut o = d.objects();
    let va = o.new_va(bytes, 0)?;
    d.charge(ord, bytes)?;
    o.allocations.insert(
        va,
        Allocation {
            charge: Charge {
                ctx,
                ordinal: ord,
                bytes,
            },
            kind,
        },
    );
    Ok(va)
}

/// Frees the allocation at `dptr` (exactly its base address).
pub fn free(d: &Driver, dptr: CUdeviceptr) -> CuResult {
    if dptr == 0 {
        return Ok(());
    }
    let a = d
        .objects()
        .allocations
        .remove(&dptr)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    d.uncharge(a.charge.ordinal, a.charge.bytes);
    Ok(())
}

fn current(d: &Driver) -> CuResult<(u64, usize)> {
    let o = d.objects();
    let ctx = o.current()?;
    Ok((ctx, o.contexts[&ctx].ordinal))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    guard(|| {
        let d = driver()?;
        let (ctx, ord) = current(d)?;
        if dptr.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let va = allocate(d, ctx, ord, bytesize as u64, AllocKind::Linear)?;
        put(dptr, va)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width_bytes: usize,
    height: usize,
    element_size: c_uint,
) -> CUresult {
    guard(|| {
        let d = driver()?;
        let (ctx, ord) = current(d)?;
        if dptr.is_null()
            || pitch.is_null()
            || width_bytes == 0
            || height == 0
            || !matches!(element_size, 4 | 8 | 16)
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let row = (width_bytes as u64)
            .div_ceil(PITCH_ALIGNMENT)
            .checked_mul(PITCH_ALIGNMENT);
        let row = row.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let bytes = row
            .checked_mul(height as u64)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let va = allocate(d, ctx, ord, bytes, AllocKind::Linear)?;
        put(dptr, va)?;
        put(pitch, row as usize)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    flags: c_uint,
) -> CUresult {
    guard(|| {
        let d = driver()?;
        let (ctx, ord) = current(d)?;
        if dptr.is_null() || !matches!(flags, CU_MEM_ATTACH_GLOBAL | CU_MEM_ATTACH_HOST) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let va = allocate(d, ctx, ord, bytesize as u64, AllocKind::Managed)?;
        put(dptr, va)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    guard(|| free(driver()?, dptr))
}

/// Stream-ordered allocation from the default pool of the stream's device. Memory is
/// charged when the call returns and given back when the free is issued (a pool with
/// release threshold 0 after synchronisation, without the reuse in between).
fn alloc_async(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream) -> CuResult {
    let d = driver()?;
    let (ctx, ord, pool) = {
        let mut o = d.objects();
        let sid = o.stream(stream)?;
        let ctx = o.streams[&sid].ctx;
        let ord = o.stream_ordinal(sid)?;
        (ctx, ord, crate::exports::pool::default_pool(&mut o, ord))
    };
    if dptr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let va = allocate(d, ctx, ord, bytesize as u64, AllocKind::Pool(pool))?;
    put(dptr, va)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: CUstream,
) -> CUresult {
    guard(|| alloc_async(dptr, bytesize, stream))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: CUstream,
) -> CUresult {
    guard(|| alloc_async(dptr, bytesize, stream))
}

/// Only stream-ordered allocations may be freed stream-ordered.
fn free_async(dptr: CUdeviceptr, stream: CUstream) -> CuResult {
    let d = driver()?;
    {
        let o = d.objects();
        o.stream(stream)?;
        match o.allocations.get(&dptr) {
            Some(a) if matches!(a.kind, AllocKind::Pool(_)) => {}
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
    }
    free(d, dptr)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    guard(|| free_async(dptr, stream))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    guard(|| free_async(dptr, stream))
}
