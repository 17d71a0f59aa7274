//! Modules and kernel launches. Any module image loads; its only kernel is
//! `gpuslice_spin(u64 cycles)`, which occupies the device for `cycles / clock rate` — the
//! kernel the probe embeds as PTX for real GPUs. A launch queues behind the stream's tail and
//! the device's FIFO of kernels from all processes. The deprecated launches (`cuLaunch`,
//! `cuLaunchGrid`, `cuLaunchGridAsync`, with `cuFuncSetBlockShape` and `cuParamSet*`) run
//! the same way, from the block shape and parameter buffer set on the function.

use std::ffi::{c_char, c_int, c_uint, c_void};

use gpuslice_cuda_ffi::*;
use gpuslice_sim_core::{now_ns, sleep_until};

use crate::driver::{driver, handle, id_of, Function, MAX_PENDING_LAUNCHES};
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
        o.functions.insert(id, Function::new(m));
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
            .filter(|(_, f)| f.module == m)
            .map(|(id, _)| *id)
            .collect();
        o.functions.retain(|_, f| f.module != m);
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

/// How a launch was made: `cuLaunchKernel` invalidates the function's legacy launch state
/// (block shape and parameters), as the driver documents; the legacy launches use it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Via {
    Kernel,
    Legacy,
}

fn launch(
    f: CUfunction,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
    via: Via,
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
        let Some(func) = o.functions.get_mut(&id_of(f)) else {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        };
        if via == Via::Kernel {
            func.block = None;
            func.params.clear();
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
            Via::Kernel,
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
            Via::Kernel,
        )
    })
}

/// `cuLaunchCooperativeKernelMultiDevice`: one kernel per launch parameter, each on its
/// own stream, whose devices must be distinct (`CUDA_ERROR_INVALID_DEVICE` otherwise); the
/// flags may only ask to skip the launch's pre and post synchronisation. The streams'
/// devices are checked before any kernel is queued; a later entry the launch refuses leaves
/// the earlier ones queued.
fn launch_multi_device(list: *mut CUDA_LAUNCH_PARAMS, count: c_uint, flags: c_uint) -> CuResult {
    let d = driver()?;
    if list.is_null() || count == 0 || flags & !0x3 != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let params = crate::guard::get_slice(list.cast_const(), count as usize)?;
    {
        let o = d.objects();
        let mut ordinals = Vec::with_capacity(params.len());
        for p in &params {
            let ord = o.stream_ordinal(o.stream(p.hStream)?)?;
            if ordinals.contains(&ord) {
                return Err(CUDA_ERROR_INVALID_DEVICE);
            }
            ordinals.push(ord);
        }
    }
    for p in &params {
        launch(
            p.function,
            [p.gridDimX, p.gridDimY, p.gridDimZ],
            [p.blockDimX, p.blockDimY, p.blockDimZ],
            p.hStream,
            p.kernelParams,
            std::ptr::null_mut(),
            Via::Kernel,
        )?;
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchCooperativeKernelMultiDevice(
    list: *mut CUDA_LAUNCH_PARAMS,
    num_devices: c_uint,
    flags: c_uint,
) -> CUresult {
    guard(|| launch_multi_device(list, num_devices, flags))
}

/// Largest legacy parameter buffer (the 4 KiB kernel parameter limit of the legacy API).
const MAX_LEGACY_PARAMS: usize = 4096;

/// Runs `change` on the legacy launch state of function `f`.
fn with_function(f: CUfunction, change: impl FnOnce(&mut Function) -> CuResult) -> CuResult {
    let d = driver()?;
    let mut o = d.objects();
    let func = o
        .functions
        .get_mut(&id_of(f))
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    change(func)
}

/// Writes `bytes` into `f`'s parameter buffer at `offset`, growing it to fit.
fn set_param(f: CUfunction, offset: c_int, bytes: &[u8]) -> CuResult {
    let start = usize::try_from(offset).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    let end = start
        .checked_add(bytes.len())
        .filter(|e| *e <= MAX_LEGACY_PARAMS)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    with_function(f, |func| {
        if func.params.len() < end {
            func.params.resize(end, 0);
        }
        func.params[start..end].copy_from_slice(bytes);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncSetBlockShape(
    f: CUfunction,
    x: c_int,
    y: c_int,
    z: c_int,
) -> CUresult {
    guard(|| {
        let dim = |v: c_int| {
            c_uint::try_from(v)
                .ok()
                .filter(|v| *v > 0)
                .ok_or(CUDA_ERROR_INVALID_VALUE)
        };
        let block = [dim(x)?, dim(y)?, dim(z)?];
        with_function(f, |func| {
            func.block = Some(block);
            Ok(())
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuParamSetSize(f: CUfunction, numbytes: c_uint) -> CUresult {
    guard(|| {
        let size = usize::try_from(numbytes)
            .ok()
            .filter(|n| *n <= MAX_LEGACY_PARAMS)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        with_function(f, |func| {
            func.params.resize(size, 0);
            Ok(())
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuParamSeti(f: CUfunction, offset: c_int, value: c_uint) -> CUresult {
    guard(|| set_param(f, offset, &value.to_ne_bytes()))
}

#[no_mangle]
pub unsafe extern "C" fn cuParamSetv(
    f: CUfunction,
    offset: c_int,
    ptr: *mut c_void,
    numbytes: c_uint,
) -> CUresult {
    guard(|| {
        let n = usize::try_from(numbytes).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        let bytes = crate::guard::get_slice(ptr.cast::<u8>().cast_const(), n)?;
        set_param(f, offset, &bytes)
    })
}

/// A legacy launch of `f` on a `width` × `height` grid: the block shape and parameters set
/// on the function beforehand, passed as a `CU_LAUNCH_PARAM_BUFFER_POINTER` buffer to the
/// launch every entry point shares. No block shape set is `CUDA_ERROR_INVALID_VALUE`.
fn launch_legacy(f: CUfunction, width: c_int, height: c_int, stream: CUstream) -> CuResult {
    let grid = |v: c_int| c_uint::try_from(v).map_err(|_| CUDA_ERROR_INVALID_VALUE);
    let (width, height) = (grid(width)?, grid(height)?);
    let (block, mut params) = {
        let d = driver()?;
        let o = d.objects();
        let func = o
            .functions
            .get(&id_of(f))
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        (
            func.block.ok_or(CUDA_ERROR_INVALID_VALUE)?,
            func.params.clone(),
        )
    };
    let mut size = params.len();
    let mut extra = [
        CU_LAUNCH_PARAM_BUFFER_POINTER,
        params.as_mut_ptr().cast::<c_void>(),
        CU_LAUNCH_PARAM_BUFFER_SIZE,
        (&mut size as *mut usize).cast::<c_void>(),
        CU_LAUNCH_PARAM_END,
    ];
    launch(
        f,
        [width, height, 1],
        block,
        stream,
        std::ptr::null_mut(),
        extra.as_mut_ptr(),
        Via::Legacy,
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunch(f: CUfunction) -> CUresult {
    guard(|| launch_legacy(f, 1, 1, std::ptr::null_mut()))
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchGrid(
    f: CUfunction,
    grid_width: c_int,
    grid_height: c_int,
) -> CUresult {
    guard(|| launch_legacy(f, grid_width, grid_height, std::ptr::null_mut()))
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchGridAsync(
    f: CUfunction,
    grid_width: c_int,
    grid_height: c_int,
    stream: CUstream,
) -> CUresult {
    guard(|| launch_legacy(f, grid_width, grid_height, stream))
}
