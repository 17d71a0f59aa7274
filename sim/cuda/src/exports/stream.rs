//! Streams: each records when its last queued kernel ends; synchronising sleeps until then,
//! querying compares it with the clock. A stream in capture (`cuStreamBeginCapture`) builds a
//! graph from what is issued to it instead of running it. The `_ptsz` entry points are the per-thread default
//! stream variants a caller gets through `cuGetProcAddress` with the per-thread flag.

use std::collections::VecDeque;
use std::ffi::c_uint;

use gpuslice_cuda_ffi::*;
use gpuslice_sim_core::{now_ns, sleep_until};

use crate::driver::{driver, handle, id_of, Graph, Stream};
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
                capture: None,
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
    o.free_id(id);
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
    // A fault while the work ran fails it: the error surfaces here, as on a real driver.
    stream_tail(h).map(|_| ())
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

/// `cuStreamGetCtx`: the context a stream belongs to (the current one for default streams).
fn stream_ctx(h: CUstream, pctx: *mut CUcontext) -> CuResult {
    let d = driver()?;
    let ctx = {
        let o = d.objects();
        let sid = o.stream(h)?;
        o.streams[&sid].ctx
    };
    put(pctx, handle(ctx))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCtx(h: CUstream, pctx: *mut CUcontext) -> CUresult {
    guard(|| stream_ctx(h, pctx))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCtx_ptsz(h: CUstream, pctx: *mut CUcontext) -> CUresult {
    guard(|| stream_ctx(h, pctx))
}

/// `cuStreamBeginCapture`: work issued to the stream from now on builds a new graph instead
/// of running. The legacy default stream cannot be captured.
fn begin_capture(h: CUstream, mode: CUstreamCaptureMode) -> CuResult {
    let d = driver()?;
    if h.is_null() || h == CU_STREAM_LEGACY {
        return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    if !matches!(
        mode,
        CU_STREAM_CAPTURE_MODE_GLOBAL
            | CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
            | CU_STREAM_CAPTURE_MODE_RELAXED
    ) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut o = d.objects();
    let sid = o.stream(h)?;
    if o.streams[&sid].capture.is_some() {
        return Err(CUDA_ERROR_ILLEGAL_STATE);
    }
    let gid = o.new_id();
    o.graphs.insert(gid, Graph::default());
    if let Some(s) = o.streams.get_mut(&sid) {
        s.capture = Some(gid);
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture(h: CUstream) -> CUresult {
    guard(|| begin_capture(h, CU_STREAM_CAPTURE_MODE_GLOBAL))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_ptsz(h: CUstream) -> CUresult {
    guard(|| begin_capture(h, CU_STREAM_CAPTURE_MODE_GLOBAL))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_v2(
    h: CUstream,
    mode: CUstreamCaptureMode,
) -> CUresult {
    guard(|| begin_capture(h, mode))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_v2_ptsz(
    h: CUstream,
    mode: CUstreamCaptureMode,
) -> CUresult {
    guard(|| begin_capture(h, mode))
}

/// `cuStreamEndCapture`: hands out the graph that capture built.
fn end_capture(h: CUstream, graph: *mut CUgraph) -> CuResult {
    let d = driver()?;
    if graph.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut o = d.objects();
    let sid = o.stream(h)?;
    let gid = o
        .streams
        .get_mut(&sid)
        .and_then(|s| s.capture.take())
        .ok_or(CUDA_ERROR_ILLEGAL_STATE)?;
    put(graph, handle(gid))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture(h: CUstream, graph: *mut CUgraph) -> CUresult {
    guard(|| end_capture(h, graph))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture_ptsz(h: CUstream, graph: *mut CUgraph) -> CUresult {
    guard(|| end_capture(h, graph))
}

/// The capture status of a stream and the graph it is building (null when none).
fn capture_of(h: CUstream) -> CuResult<(CUstreamCaptureStatus, u64)> {
    let o = driver()?.objects();
    let sid = o.stream(h)?;
    Ok(match o.streams[&sid].capture {
        Some(g) => (CU_STREAM_CAPTURE_STATUS_ACTIVE, g),
        None => (CU_STREAM_CAPTURE_STATUS_NONE, 0),
    })
}

fn is_capturing(h: CUstream, status: *mut CUstreamCaptureStatus) -> CuResult {
    put(status, capture_of(h)?.0)
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing(
    h: CUstream,
    status: *mut CUstreamCaptureStatus,
) -> CUresult {
    guard(|| is_capturing(h, status))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing_ptsz(
    h: CUstream,
    status: *mut CUstreamCaptureStatus,
) -> CUresult {
    guard(|| is_capturing(h, status))
}

/// `cuStreamGetCaptureInfo_v2`: status, capture id (the graph's id), the graph, and no
/// dependency set (every captured node is a root here); each out pointer may be null.
fn capture_info(
    h: CUstream,
    status: *mut CUstreamCaptureStatus,
    id: *mut cuuint64_t,
    graph: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    num_deps: *mut usize,
) -> CuResult {
    let (st, gid) = capture_of(h)?;
    put(status, st)?;
    if !id.is_null() {
        put(id, gid)?;
    }
    if !graph.is_null() {
        put(
            graph,
            if gid == 0 {
                std::ptr::null_mut()
            } else {
                handle(gid)
            },
        )?;
    }
    if !deps.is_null() {
        put(deps, std::ptr::null())?;
    }
    if !num_deps.is_null() {
        put(num_deps, 0)?;
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v2(
    h: CUstream,
    status: *mut CUstreamCaptureStatus,
    id: *mut cuuint64_t,
    graph: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    num_deps: *mut usize,
) -> CUresult {
    guard(|| capture_info(h, status, id, graph, deps, num_deps))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v2_ptsz(
    h: CUstream,
    status: *mut CUstreamCaptureStatus,
    id: *mut cuuint64_t,
    graph: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    num_deps: *mut usize,
) -> CUresult {
    guard(|| capture_info(h, status, id, graph, deps, num_deps))
}
