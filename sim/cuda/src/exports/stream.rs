//! Streams: each records when its last queued kernel ends; synchronising sleeps until then,
//! querying compares it with the clock. The `_ptsz` entry points are the per-thread default
//! stream variants a caller gets through `cuGetProcAddress` with the per-thread flag.

use std::collections::VecDeque;
use std::ffi::c_uint;

use gpuslice_cuda_ffi::*;
use gpuslice_sim_core::{now_ns, sleep_until};

use crate::driver::{driver, handle, id_of, Stream};
use crate::guard::{guard, put, CuResult};

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(ph: *mut CUstream, flags: c_uint) -> CUresult {
    guard(|| {
        let d = driver()?;
        if flags & !CU_STREAM_NON_BLOCKING != 0 || ph.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut o = d.objects();
        let ctx = o.current()?;
        let id = o.new_id();
        o.streams.insert(
            id,
            Stream {
                ctx,
                tail: 0,
                pending: VecDeque::new(),
            },
        );
        put(ph, handle(id))
    })
}

fn destroy(h: CUstream) -> CuResult {
    let d = driver()?;
    let mut o = d.objects();
    let id = id_of(h);
    let is_default = o.contexts.values().any(|c| c.default_stream == id);
    if is_default || o.streams.remove(&id).is_none() {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy_v2(h: CUstream) -> CUresult {
    guard(|| destroy(h))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy(h: CUstream) -> CUresult {
    guard(|| destroy(h))
}

/// When all work queued on stream `h` ends.
pub fn stream_tail(h: CUstream) -> CuResult<u64> {
    let o = driver()?.objects();
    let id = o.stream(h)?;
    Ok(o.streams[&id].tail)
}

fn synchronize(h: CUstream) -> CuResult {
    sleep_until(stream_tail(h)?);
    Ok(())
}

fn query(h: CUstream) -> CuResult {
    if stream_tail(h)? <= now_ns() {
        Ok(())
    } else {
        Err(CUDA_ERROR_NOT_READY)
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize(h: CUstream) -> CUresult {
    guard(|| synchronize(h))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize_ptsz(h: CUstream) -> CUresult {
    guard(|| synchronize(h))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamQuery(h: CUstream) -> CUresult {
    guard(|| query(h))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamQuery_ptsz(h: CUstream) -> CUresult {
    guard(|| query(h))
}
