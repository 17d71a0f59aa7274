//! Linear device memory: `cuMemAlloc`, pitched, managed and stream-ordered allocations, all
//! charged node-wide against the device's capacity (`CUDA_ERROR_OUT_OF_MEMORY` past it), and
//! `cuMemGetInfo` reporting the node-wide figures (its total without the memory the driver
//! reserves).

use std::ffi::c_uint;

use gpuslice_cuda_ffi::*;

use crate::driver::{driver, AllocKind, Allocation, Charge, Driver, GraphNode};
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
        put(total, m.cuda_total() as usize)
    })
}

/// Charges `bytes` on `ord` for context `ctx` and records an allocation at a fresh address.
/// An allocation from a pool reuses what the pool keeps reserved before charging more.
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
    let pool = match kind {
        AllocKind::Pool(p) => Some(p),
        _ => None,
    };
    let reuse = pool
        .and_then(|p| o.pools.get(&p))
        .map_or(0, |p| p.cached.min(bytes));
    if let Err(e) = d.charge(ord, bytes - reuse) {
        o.free_va(va, bytes);
        return Err(e);
    }
    if let Some(p) = pool.and_then(|p| o.pools.get_mut(&p)) {
        p.cached -= reuse;
        p.used = p.used.saturating_add(bytes);
    }
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

/// Frees the allocation at `dptr` (exactly its base address). Memory of a pool goes back to
/// the pool, which keeps up to its release threshold reserved and releases the rest.
pub fn free(d: &Driver, dptr: CUdeviceptr) -> CuResult {
    if dptr == 0 {
        return Ok(());
    }
    let mut o = d.objects();
    if !o.allocations.contains_key(&dptr) && o.free_graph_memory(dptr) {
        return Ok(());
    }
    let a = o
        .allocations
        .remove(&dptr)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let bytes = a.charge.bytes;
    o.free_va(dptr, bytes);
    if let AllocKind::Pool(p) = a.kind {
        // A destroyed pool's id is given back with its last allocation
        // (`exports::pool::cuMemPoolDestroy`).
        let orphan = !o.pools.contains_key(&p)
            && !o.allocations.values().any(|x| x.kind == AllocKind::Pool(p));
        if orphan {
            o.free_id(p);
        }
    }
    let release = match a.kind {
        AllocKind::Pool(p) => match o.pools.get_mut(&p) {
            Some(pool) => {
                pool.used = pool.used.saturating_sub(bytes);
                let kept = pool.cached.saturating_add(bytes).min(pool.threshold);
                let released = pool.cached.saturating_add(bytes) - kept;
                pool.cached = kept;
                released
            }
            None => bytes,
        },
        _ => bytes,
    };
    drop(o);
    d.uncharge(a.charge.ordinal, release);
    Ok(())
}

/// If `stream` is being captured, adds an allocation node of `bytes` to the capture graph
/// and returns its address (nothing is charged until the graph is instantiated).
fn captured_alloc(d: &Driver, stream: CUstream, bytes: u64) -> CuResult<Option<CUdeviceptr>> {
    let mut o = d.objects();
    let sid = o.stream(stream)?;
    let Some(g) = o.streams[&sid].capture else {
        return Ok(None);
    };
    if bytes == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ordinal = o.stream_ordinal(sid)?;
    let dptr = o.new_va(bytes, 0)?;
    let nid = o.new_id();
    let graph = o.graphs.get_mut(&g).ok_or(CUDA_ERROR_ILLEGAL_STATE)?;
    graph.nodes.push((
        nid,
        GraphNode::Alloc {
            ordinal,
            bytes,
            dptr,
        },
    ));
    Ok(Some(dptr))
}

/// Stream-ordered allocation on a stream (`pool` = `None`: the device's default pool), or an
/// allocation node when the stream is being captured.
pub fn alloc_on_stream(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: CUstream,
    pool: Option<u64>,
) -> CuResult {
    let d = driver()?;
    if dptr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if let Some(p) = pool {
        if !d.objects().pools.contains_key(&p) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
    }
    if let Some(va) = captured_alloc(d, stream, bytesize as u64)? {
        return put(dptr, va);
    }
    let (ctx, ord, pool) = {
        let mut o = d.objects();
        let sid = o.stream(stream)?;
        let ctx = o.streams[&sid].ctx;
        let ord = o.stream_ordinal(sid)?;
        let pool = match pool {
            Some(p) => p,
            None => crate::exports::pool::default_pool(&mut o, ord),
        };
        (ctx, ord, pool)
    };
    let va = allocate(d, ctx, ord, bytesize as u64, AllocKind::Pool(pool))?;
    put(dptr, va)
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
    guard(|| {
        let d = driver()?;
        // A poisoned context frees nothing: its memory is held until it is destroyed.
        d.objects().check_pointer(dptr)?;
        free(d, dptr)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: CUstream,
) -> CUresult {
    guard(|| alloc_on_stream(dptr, bytesize, stream, None))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: CUstream,
) -> CUresult {
    guard(|| alloc_on_stream(dptr, bytesize, stream, None))
}

/// Only stream-ordered allocations may be freed stream-ordered; on a stream being captured
/// the free becomes a node of the graph (graph memory or not, freed when the graph runs).
fn free_async(dptr: CUdeviceptr, stream: CUstream) -> CuResult {
    let d = driver()?;
    {
        let mut o = d.objects();
        let sid = o.stream(stream)?;
        if let Some(g) = o.streams[&sid].capture {
            let nid = o.new_id();
            let graph = o.graphs.get_mut(&g).ok_or(CUDA_ERROR_ILLEGAL_STATE)?;
            graph.nodes.push((nid, GraphNode::Free(dptr)));
            return Ok(());
        }
        if o.free_graph_memory(dptr) {
            return Ok(());
        }
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
