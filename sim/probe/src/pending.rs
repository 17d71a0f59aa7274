//! `pool-pending`: a stream-ordered free still queued while the pool it returns to grows.
//! `--chunk` is allocated from a new pool that keeps everything freed into it (release
//! threshold `UINT64_MAX`, as frameworks set it) on stream `s`, a kernel of `--kernel-ms`
//! is queued on `s`, then the chunk's `cuMemFreeAsync` on `s` (pending until the kernel
//! ends), then 1 MiB from the same pool on stream `s2` (the pool cannot reuse the pending
//! chunk, so it grows). Once `s` has passed the free (the pool now keeps the chunk), a
//! `cuMemAlloc` of `--then`. Reports the step's refusal, cuMemGetInfo's free memory and the
//! pool's reserved bytes; holds `--hold` seconds; frees.

use std::ffi::c_void;
use std::time::Duration;

use serde_json::json;

use gpuslice_cuda_ffi::*;

use crate::cli::PoolPendingArgs;
use crate::cuda::{call, launch_spin, Cuda};
use crate::error::{check, name, ProbeError};
use crate::report::{human_bytes, Out};

pub fn run(cuda: &Cuda, out: Out, ordinal: i32, args: &PoolPendingArgs) -> Result<(), ProbeError> {
    let dev = cuda.open_device(ordinal)?;
    let clock_khz = cuda.attribute(&dev, CU_DEVICE_ATTRIBUTE_CLOCK_RATE)? as u64;
    let kernel = cuda.spin_kernel()?;
    let launch = cuda.launch_fn()?;
    let (s, s2) = (cuda.stream_create()?, cuda.stream_create()?);
    let props = CUmemPoolProps::pinned_on(ordinal);
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    call!(cuda, cuMemPoolCreate: PFN_cuMemPoolCreate, &mut pool, &props)?;
    let mut keep = u64::MAX;
    call!(cuda, cuMemPoolSetAttribute: PFN_cuMemPoolSetAttribute, pool,
        CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, (&mut keep as *mut u64).cast::<c_void>())?;
    let mut chunk: CUdeviceptr = 0;
    call!(cuda, cuMemAllocFromPoolAsync: PFN_cuMemAllocFromPoolAsync, &mut chunk,
        args.chunk as usize, pool, s)?;
    check(
        "cuLaunchKernel",
        launch_spin(launch, kernel, s, args.kernel_ms * clock_khz),
    )?;
    call!(cuda, cuMemFreeAsync: PFN_cuMemFreeAsync, chunk, s)?;
    let mut small: CUdeviceptr = 0;
    call!(cuda, cuMemAllocFromPoolAsync: PFN_cuMemAllocFromPoolAsync, &mut small, 1 << 20,
        pool, s2)?;
    cuda.stream_sync(s)?;
    cuda.stream_sync(s2)?;
    let mut held: CUdeviceptr = 0;
    let step = call!(cuda, cuMemAlloc: PFN_cuMemAlloc_v2, &mut held, args.then as usize);
    let refusal = match step {
        Ok(()) => None,
        Err(ProbeError::Cuda { call, code }) => Some((call, code)),
        Err(e) => return Err(e),
    };
    let (free_after, mem_total) = cuda.mem_info()?;
    let mut reserved = 0u64;
    call!(cuda, cuMemPoolGetAttribute: PFN_cuMemPoolGetAttribute, pool,
        CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, (&mut reserved as *mut u64).cast::<c_void>())?;
    let v = json!({
        "cmd": "pool-pending",
        "device": ordinal,
        "chunk": args.chunk,
        "then": args.then,
        "error": refusal.map(|(_, code)| name(code)),
        "free_after": free_after,
        "mem_total": mem_total,
        "pool_reserved": reserved,
    });
    out.emit(v.clone(), || {
        format!(
            "pool-pending: cuMemAlloc of {} after the pending free: {}; cuMemGetInfo free {}, \
             the pool reserves {}",
            human_bytes(args.then),
            v["error"].as_str().unwrap_or("not refused"),
            human_bytes(free_after),
            human_bytes(reserved)
        )
    });
    if args.hold > 0.0 {
        std::thread::sleep(Duration::from_secs_f64(args.hold));
    }
    if held != 0 {
        let _ = call!(cuda, cuMemFree: PFN_cuMemFree_v2, held);
    }
    let _ = call!(cuda, cuMemFreeAsync: PFN_cuMemFreeAsync, small, s2);
    let _ = cuda.stream_sync(s2);
    let _ = call!(cuda, cuMemPoolDestroy: PFN_cuMemPoolDestroy, pool);
    let _ = cuda.stream_destroy(s);
    let _ = cuda.stream_destroy(s2);
    match refusal {
        Some((call, code)) if code != CUDA_ERROR_OUT_OF_MEMORY => {
            Err(ProbeError::Cuda { call, code })
        }
        _ => Ok(()),
    }
}
