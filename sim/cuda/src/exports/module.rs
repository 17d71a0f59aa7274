//! Modules and kernel launches. Any module image loads; its only kernel is
//! `gpuslice_spin(u64 cycles)`, which occupies the device for `cycles / clock rate` — the
//! kernel the probe embeds as PTX for real GPUs. A launch queues behind the stream's tail and
//! the device's FIFO of kernels from all processes.

use std::ffi::{c_char, c_uint, c_void};

use gpuslice_cuda_ffi::*;
use gpuslice_sim_core::{now_ns, sleep_until};

use crate::driver::{driver, handle, id_of, MAX_PENDING_LAUNCHES};
use crate::guard::{c_str, get, guard, put, CuResult};

/// The one kernel simulated modules contain.
pub const SPIN_KERNEL: &str = "gpuslice_spin";

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void) -> CUresult {
    guard(|| {
        let d = driver()?;
        if image.is_null() || module.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut o = d.objects();
        let ctx = o.current()?;
        let id = o.new_id();
        o.modules.insert(id, ctx);
        put(module, handle(id))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(
    f: *mut CUfunction,
    module: CUmodule,
    name: *const c_char,
) -> CUresult {
    guard(|| {
        let d = driver()?;
        let name = c_str(name)?;
        let mut o = d.objects();
        let m = id_of(module);
        if !o.modules.contains_key(&m) {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        if name.to_bytes() != SPIN_KERNEL.as_bytes() {
            return Err(CUDA_ERROR_NOT_FOUND);
        }
        let id = o.new_id();
        o.functions.insert(id, m);
        put(f, handle(id))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleUnload(module: CUmodule) -> CUresult {
    guard(|| {
        let d = driver()?;
        let mut o = d.objects();
        let m = id_of(module);
        o.modules.remove(&m).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let functions: Vec<u64> = o
            .functions
            .iter()
            .filter(|(_, owner)| **owner == m)
            .map(|(f, _)| *f)
            .collect();
        o.functions.retain(|_, owner| *owner != m);
        o.free_ids(functions);
        o.free_id(m);
        Ok(())
    })
}

/// The `cycles` argument, from `kernelParams[0]` or a `CU_LAUNCH_PARAM_BUFFER_POINTER` buffer.
fn spin_cycles(params: *mut *mut c_void, extra: *mut *mut c_void) -> CuResult<u64> {
    if !params.is_null() {
        let first: *mut c_void = get(params.cast_const())?;
        return get(first.cast::<u64>().cast_const());
    }
    if extra.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (mut buffer, mut size): (*mut c_void, usize) = (std::ptr::null_mut(), 0);
    for i in (0..64).step_by(2) {
        // `extra` is a CU_LAUNCH_PARAM_END-terminated list of (key, value) pairs.
        let key: *mut c_void = get(extra.wrapping_add(i).cast_const())?;
        if key == CU_LAUNCH_PARAM_END {
            break;
        }
        let value: *mut c_void = get(extra.wrapping_add(i + 1).cast_const())?;
        if key == CU_LAUNCH_PARAM_BUFFER_POINTER {
            buffer = value;
        } else if key == CU_LAUNCH_PARAM_BUFFER_SIZE {
            size = get(value.cast::<usize>().cast_const())?;
        } else {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
    }
    if buffer.is_null() || size < 8 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    get(buffer.cast::<u64>().cast_const())
}

#[allow(clippy::too_many_arguments)]
fn launch(
    f: CUfunction,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CuResult {
    let d = driver()?;
    if grid.contains(&0) || block.contains(&0) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let threads = block.iter().map(|b| u64::from(*b)).product::<u64>();
    if threads > 1024 || block[2] > 64 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let cycles = spin_cycles(params, extra)?;
    loop {
        let mut o = d.objects();
        if !o.functions.contains_key(&id_of(f)) {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        let sid = o.stream(stream)?;
        if let Some(g) = o.streams[&sid].capture {
            // Captured: the launch becomes a node of the graph being built.
            let nid = o.new_id();
            if let Some(graph) = o.graphs.get_mut(&g) {
                graph.nodes.push((nid, crate::driver::GraphNode::Other));
            }
            return Ok(());
        }
        let ord = o.stream_ordinal(sid)?;
        let clock_khz = u128::from(d.device(ord).clock_khz.max(1));
        let duration =
            (u128::from(cycles) * 1_000_000 / clock_khz).min(u128::from(u64::MAX / 4)) as u64;
        let now = now_ns();
        let Some(s) = o.streams.get_mut(&sid) else {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        };
        while s.pending.front().is_some_and(|end| *end <= now) {
            s.pending.pop_front();
        }
        if s.pending.len() >= MAX_PENDING_LAUNCHES {
            // The queue is full: block the caller until the oldest launch completes.
            let wait = s.pending.front().copied().unwrap_or(now);
            drop(o);
            sleep_until(wait);
            continue;
        }
        let scheduled =
            d.node
                .state()
                .schedule_by(&d.slot, d.ordinals[ord], now.max(s.tail), duration);
        s.tail = scheduled.end;
        s.pending.push_back(scheduled.end);
        return Ok(());
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel(
    f: CUfunction,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    _shared_mem_bytes: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    guard(|| {
        launch(
            f,
            [grid_x, grid_y, grid_z],
            [block_x, block_y, block_z],
            stream,
            params,
            extra,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel_ptsz(
    f: CUfunction,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    _shared_mem_bytes: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    guard(|| {
        launch(
            f,
            [grid_x, grid_y, grid_z],
            [block_x, block_y, block_z],
            stream,
            params,
            extra,
        )
    })
}
