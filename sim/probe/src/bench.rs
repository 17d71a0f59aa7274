//! `bench`: the median cost of one driver call as a program sees it, to measure what an
//! interposed library adds (run once with and once without it, same machine, same script).

use std::time::Instant;

use serde_json::json;

use gpuslice_cuda_ffi::*;

use crate::cli::{BenchArgs, BenchWhat};
use crate::cuda::{call, launch_spin, Cuda};
use crate::error::{check, ProbeError};
use crate::report::Out;

/// Launches between (untimed) synchronisations, well under any launch queue depth.
const LAUNCH_BATCH: u64 = 256;
/// Bytes per allocation of `bench alloc`.
const ALLOC_BYTES: usize = 1 << 20;

fn summary(mut ns: Vec<u64>) -> (u64, u64, f64) {
    ns.sort_unstable();
    let median = ns[ns.len() / 2];
    let p90 = ns[(ns.len() * 9 / 10).min(ns.len() - 1)];
    let mean = ns.iter().sum::<u64>() as f64 / ns.len() as f64;
    (median, p90, mean)
}

pub fn run(cuda: &Cuda, out: Out, ordinal: i32, args: &BenchArgs) -> Result<(), ProbeError> {
    cuda.open_device(ordinal)?;
    let mut ns = Vec::with_capacity(args.iters as usize);
    let what = match args.what {
        BenchWhat::Launch => {
            let kernel = cuda.spin_kernel()?;
            let launch = cuda.launch_fn()?;
            let stream = cuda.stream_create()?;
            for i in 0..args.iters {
                let t = Instant::now();
                let r = launch_spin(launch, kernel, stream, 0);
                ns.push(t.elapsed().as_nanos() as u64);
                check("cuLaunchKernel", r)?;
                if (i + 1) % LAUNCH_BATCH == 0 {
                    cuda.stream_sync(stream)?;
                }
            }
            cuda.stream_sync(stream)?;
            let _ = cuda.stream_destroy(stream);
            "launch"
        }
        BenchWhat::Alloc => {
            // SAFETY: the v2 signatures are what these base names resolve to from 3.2 on.
            let (alloc, free): (PFN_cuMemAlloc_v2, PFN_cuMemFree_v2) =
                unsafe { (cuda.f("cuMemAlloc")?, cuda.f("cuMemFree")?) };
            for _ in 0..args.iters {
                let mut p: CUdeviceptr = 0;
                let t = Instant::now();
                // SAFETY: valid out-pointer; the pointer freed is the one just allocated.
                let (a, f) = unsafe {
                    let a = alloc(&mut p, ALLOC_BYTES);
                    (
                        a,
                        if a.is_success() {
                            free(p)
                        } else {
                            CUDA_SUCCESS
                        },
                    )
                };
                ns.push(t.elapsed().as_nanos() as u64);
                check("cuMemAlloc", a)?;
                check("cuMemFree", f)?;
            }
            "alloc"
        }
    };
    let _ = call!(cuda, cuCtxSynchronize: PFN_cuCtxSynchronize);
    let (median, p90, mean) = summary(ns);
    out.emit(
        json!({"cmd": "bench", "what": what, "iters": args.iters, "median_ns": median, "p90_ns": p90, "mean_ns": mean}),
        || format!("bench {what}: {} calls, median {median} ns, p90 {p90} ns, mean {mean:.0} ns", args.iters),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn summary_takes_the_middle() {
        assert_eq!(super::summary(vec![5, 1, 9, 3, 7]), (5, 9, 5.0));
    }
}
