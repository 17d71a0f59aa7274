//! `churn`: several threads allocate and free concurrently in the primary context of one
//! device for a number of rounds, through `cuMemAlloc` and `cuMemAllocAsync` at random, each
//! free at once handing its address back to the driver for the next allocation (of any
//! thread); refusals (out of memory) are counted, not errors. Reports `cuMemGetInfo`'s used
//! figure (total - free) before the threads start and after they all ended, everything
//! freed: through the shim, the slice's charge, which must come back to where it started.

use std::ffi::c_void;

use serde_json::json;

use gpuslice_cuda_ffi::*;

use crate::cli::ChurnArgs;
use crate::cuda::{call, Cuda};
use crate::error::{check, ProbeError};
use crate::report::{human_bytes, Out};

/// The entry points the threads call, resolved once on the main thread (the resolver's cache
/// is not shared between threads).
#[derive(Clone, Copy)]
struct Entry {
    set_current: PFN_cuCtxSetCurrent,
    alloc: PFN_cuMemAlloc_v2,
    free: PFN_cuMemFree_v2,
    alloc_async: PFN_cuMemAllocAsync,
    free_async: PFN_cuMemFreeAsync,
    stream_create: PFN_cuStreamCreate,
    stream_sync: PFN_cuStreamSynchronize,
    stream_destroy: PFN_cuStreamDestroy_v2,
}

/// What one thread did: allocations made and refused.
#[derive(Default)]
struct Tally {
    allocs: u64,
    refusals: u64,
}

/// xorshift64*: a fixed sequence per thread, so a failing run can be repeated.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n.max(1)
    }
}

/// Resolves base entry point `name` as `F`.
///
/// # Safety
/// `F` must be the signature `name` resolves to.
unsafe fn entry<F: Copy>(cuda: &Cuda, name: &'static str) -> Result<F, ProbeError> {
    // SAFETY: forwarded to the caller.
    unsafe { cuda.f::<F>(name) }
}

/// One thread's rounds: up to `--held` allocations of `--chunk` bytes or a half, quarter or
/// eighth of it, then all freed in random order.
fn worker(e: Entry, ctx: usize, index: u64, args: &ChurnArgs) -> Result<Tally, ProbeError> {
    // SAFETY: resolved as cuCtxSetCurrent; ctx is the primary context the main thread holds.
    let r = unsafe { (e.set_current)(ctx as *mut c_void as CUcontext) };
    check("cuCtxSetCurrent", r)?;
    let mut stream: CUstream = std::ptr::null_mut();
    // SAFETY: resolved as cuStreamCreate; the out-pointer is a local.
    let r = unsafe { (e.stream_create)(&mut stream, CU_STREAM_NON_BLOCKING) };
    check("cuStreamCreate", r)?;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (index + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9));
    let mut tally = Tally::default();
    let mut held: Vec<(CUdeviceptr, bool)> = Vec::new();
    for _ in 0..args.rounds {
        for _ in 0..=rng.below(args.held) {
            let size = (args.chunk >> rng.below(4)).max(1) as usize;
            let is_async = rng.below(2) == 1;
            let mut p: CUdeviceptr = 0;
            let (call, r) = if is_async {
                // SAFETY: resolved as cuMemAllocAsync; a local out-pointer, this thread's
                // stream.
                ("cuMemAllocAsync", unsafe {
                    (e.alloc_async)(&mut p, size, stream)
                })
            } else {
                // SAFETY: resolved as cuMemAlloc; a local out-pointer.
                ("cuMemAlloc", unsafe { (e.alloc)(&mut p, size) })
            };
            match r {
                CUDA_SUCCESS => {
                    tally.allocs += 1;
                    held.push((p, is_async));
                }
                CUDA_ERROR_OUT_OF_MEMORY => tally.refusals += 1,
                code => return Err(ProbeError::Cuda { call, code }),
            }
        }
        while !held.is_empty() {
            let (p, is_async) = held.swap_remove(rng.below(held.len() as u64) as usize);
            let (call, r) = if is_async {
                // SAFETY: resolved as cuMemFreeAsync; p came from cuMemAllocAsync.
                ("cuMemFreeAsync", unsafe { (e.free_async)(p, stream) })
            } else {
                // SAFETY: resolved as cuMemFree; p came from cuMemAlloc.
                ("cuMemFree", unsafe { (e.free)(p) })
            };
            check(call, r)?;
        }
    }
    // SAFETY: resolved as cuStreamSynchronize; this thread's stream.
    let r = unsafe { (e.stream_sync)(stream) };
    check("cuStreamSynchronize", r)?;
    // SAFETY: resolved as cuStreamDestroy; this thread's stream, no longer used.
    let r = unsafe { (e.stream_destroy)(stream) };
    check("cuStreamDestroy", r)?;
    Ok(tally)
}

pub fn run(cuda: &Cuda, out: Out, ordinal: i32, args: &ChurnArgs) -> Result<(), ProbeError> {
    let dev = cuda.open_device(ordinal)?;
    let mut ctx: CUcontext = std::ptr::null_mut();
    call!(cuda, cuCtxGetCurrent: PFN_cuCtxGetCurrent, &mut ctx)?;
    // SAFETY: each name resolves to the signature named with it.
    let e = unsafe {
        Entry {
            set_current: entry(cuda, "cuCtxSetCurrent")?,
            alloc: entry(cuda, "cuMemAlloc")?,
            free: entry(cuda, "cuMemFree")?,
            alloc_async: entry(cuda, "cuMemAllocAsync")?,
            free_async: entry(cuda, "cuMemFreeAsync")?,
            stream_create: entry(cuda, "cuStreamCreate")?,
            stream_sync: entry(cuda, "cuStreamSynchronize")?,
            stream_destroy: entry(cuda, "cuStreamDestroy")?,
        }
    };
    let (free, total) = cuda.mem_info()?;
    let start = total - free;
    let ctx = ctx as usize;
    let tallies: Vec<Result<Tally, ProbeError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..u64::from(args.threads))
            .map(|i| s.spawn(move || worker(e, ctx, i, args)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(ProbeError::Usage("a churn thread panicked".into())))
            })
            .collect()
    });
    let (mut allocs, mut refusals) = (0, 0);
    for t in tallies {
        let t = t?;
        allocs += t.allocs;
        refusals += t.refusals;
    }
    let (free, total) = cuda.mem_info()?;
    let end = total - free;
    let v = json!({
        "cmd": "churn",
        "device": dev.ordinal,
        "threads": args.threads,
        "rounds": args.rounds,
        "allocs": allocs,
        "refusals": refusals,
        "start": start,
        "end": end,
        "mem_total": total,
    });
    out.emit(v, || {
        format!(
            "churn: {} threads × {} rounds, {allocs} allocations, {refusals} refused; used {} before, {} after, of {}",
            args.threads,
            args.rounds,
            human_bytes(start),
            human_bytes(end),
            human_bytes(total)
        )
    });
    Ok(())
}
