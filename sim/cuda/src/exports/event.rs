//! Events: recording stamps the moment the device reaches the event (after the stream's work
//! and everything queued on the device before it) without occupying the device; elapsed time
//! is the difference of two stamps, query and synchronise compare a stamp with the clock.

use std::ffi::c_uint;

use gpuslice_cuda_ffi::*;
use gpuslice_sim_core::{now_ns, sleep_until};

use crate::driver::{driver, handle, id_of, Event};
use crate::guard::{guard, put, CuResult};

#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(ph: *mut CUevent, flags: c_uint) -> CUresult {
    guard(|| {
        let d = driver()?;
        let known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
        if flags & !known != 0 || ph.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut o = d.objects();
        let ctx = o.current()?;
        let id = o.new_id();
        o.events.insert(
            id,
            Event {
                ctx,
                flags,
                stamp: None,
            },
        );
        put(ph, handle(id))
    })
}

/// `cuEventRecord`: "hEvent and hStream must be from the same context otherwise
/// CUDA_ERROR_INVALID_HANDLE is returned" (CUDA driver API). A default stream is the current
/// context's; a stream of its own needs no current context.
fn record(ev: CUevent, stream: CUstream) -> CuResult {
    let d = driver()?;
    let mut o = d.objects();
    let sid = o.stream(stream)?;
    let ord = o.stream_ordinal(sid)?;
    let tail = o.streams[&sid].tail;
    let stream_ctx = o.streams[&sid].ctx;
    let free_at = d.node.state().free_at(d.ordinals[ord]);
    let e = o
        .events
        .get_mut(&id_of(ev))
        .filter(|e| e.ctx == stream_ctx)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    e.stamp = Some(now_ns().max(tail).max(free_at));
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuEventRecord(ev: CUevent, stream: CUstream) -> CUresult {
    guard(|| record(ev, stream))
}

#[no_mangle]
pub unsafe extern "C" fn cuEventRecord_ptsz(ev: CUevent, stream: CUstream) -> CUresult {
    guard(|| record(ev, stream))
}

/// When the device reaches event `ev`, if recorded; its context's sticky error when that is
/// poisoned.
fn stamp(ev: CUevent) -> CuResult<Option<u64>> {
    let o = driver()?.objects();
    let e = o.events.get(&id_of(ev)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    o.check_context(e.ctx)?;
    Ok(e.stamp)
}

#[no_mangle]
pub unsafe extern "C" fn cuEventQuery(ev: CUevent) -> CUresult {
    guard(|| match stamp(ev)? {
        Some(t) if t > now_ns() => Err(CUDA_ERROR_NOT_READY),
        _ => Ok(()),
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventSynchronize(ev: CUevent) -> CUresult {
    guard(|| {
        if let Some(t) = stamp(ev)? {
            sleep_until(t);
        }
        // A fault while the work ran fails it: the error surfaces here, as on a real driver.
        stamp(ev).map(|_| ())
    })
}

fn elapsed(ms: *mut f32, start: CUevent, end: CUevent) -> CuResult {
    let (a, b) = {
        let o = driver()?.objects();
        let get = |e: CUevent| o.events.get(&id_of(e)).ok_or(CUDA_ERROR_INVALID_HANDLE);
        let (a, b) = (get(start)?, get(end)?);
        o.check_context(a.ctx)?;
        o.check_context(b.ctx)?;
        if (a.flags | b.flags) & CU_EVENT_DISABLE_TIMING != 0 {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        (
            a.stamp.ok_or(CUDA_ERROR_INVALID_HANDLE)?,
            b.stamp.ok_or(CUDA_ERROR_INVALID_HANDLE)?,
        )
    };
    if a.max(b) > now_ns() {
        return Err(CUDA_ERROR_NOT_READY);
    }
    put(ms, ((b as i128 - a as i128) as f64 / 1e6) as f32)
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime(
    ms: *mut f32,
    start: CUevent,
    end: CUevent,
) -> CUresult {
    guard(|| elapsed(ms, start, end))
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime_v2(
    ms: *mut f32,
    start: CUevent,
    end: CUevent,
) -> CUresult {
    guard(|| elapsed(ms, start, end))
}

fn destroy(ev: CUevent) -> CuResult {
    let d = driver()?;
    let mut o = d.objects();
    let id = id_of(ev);
    o.events.remove(&id).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    o.free_id(id);
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuEventDestroy_v2(ev: CUevent) -> CUresult {
    guard(|| destroy(ev))
}

#[no_mangle]
pub unsafe extern "C" fn cuEventDestroy(ev: CUevent) -> CUresult {
    guard(|| destroy(ev))
}
