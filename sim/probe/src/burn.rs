//! `burn`: launch `gpuslice_spin` kernels back to back on one stream in batches, waiting for
//! the previous batch while the next is queued, as pipelined applications do, and report the share of device time achieved —
//! nominally (kernels × their duration from cycles and the clock rate) and as measured with
//! event pairs around sampled kernels (which catches clock drift on real GPUs). `--launch`
//! picks the entry point: cuLaunchKernel, or one of the deprecated cuLaunchGridAsync,
//! cuLaunchGrid, cuLaunch (the last two on the legacy default stream),
//! cuLaunchCooperativeKernelMultiDevice (one device). `--current` picks the
//! context current at each launch: the stream's, none or another context on the device (the
//! probe's own events are recorded with the stream's context current).

use std::time::Instant;

use serde_json::json;

use gpuslice_cuda_ffi::*;

use crate::cli::{BurnArgs, LaunchCurrent};
use crate::cuda::{call, Cuda};
use crate::error::{check, ProbeError};
use crate::report::Out;

/// Events of one batch of launches.
struct Batch {
    /// (before, after) pairs around sampled kernels; the first `used` were recorded.
    samples: Vec<(CUevent, CUevent)>,
    used: usize,
    /// Recorded after the batch's last kernel.
    end: CUevent,
}

pub fn run(cuda: &Cuda, out: Out, ordinal: i32, args: &BurnArgs) -> Result<(), ProbeError> {
    if !(args.seconds > 0.0 && args.seconds.is_finite()) {
        return Err(ProbeError::Usage(format!(
            "--seconds {} must be above 0",
            args.seconds
        )));
    }
    let dev = cuda.open_device(ordinal)?;
    let clock_khz = cuda.attribute(&dev, CU_DEVICE_ATTRIBUTE_CLOCK_RATE)? as u64;
    let cycles = args.kernel_us * clock_khz / 1000;
    let kernel = cuda.spin_kernel()?;
    let launcher = cuda.spin_launcher(args.launch, kernel, cycles)?;
    // Events bracket kernels on the stream the kernels run on.
    let stream = if launcher.default_stream_only() {
        std::ptr::null_mut()
    } else {
        cuda.stream_create()?
    };
    let mut own: CUcontext = std::ptr::null_mut();
    call!(cuda, cuCtxGetCurrent: PFN_cuCtxGetCurrent, &mut own)?;
    // The context made current for each launch (`None`: the stream's, nothing to switch).
    let at_launch = match args.current {
        LaunchCurrent::Stream => None,
        _ if stream.is_null() => {
            return Err(ProbeError::Usage(format!(
                "--current {:?} needs a launch on the probe's stream, not {}",
                args.current,
                args.launch.as_str()
            )))
        }
        LaunchCurrent::None => Some(std::ptr::null_mut()),
        LaunchCurrent::Other => {
            let other = cuda.context_create(&dev)?;
            call!(cuda, cuCtxSetCurrent: PFN_cuCtxSetCurrent, own)?;
            Some(other)
        }
    };
    let launch = |kernel: CUfunction| -> Result<(), ProbeError> {
        if let Some(c) = at_launch {
            call!(cuda, cuCtxSetCurrent: PFN_cuCtxSetCurrent, c)?;
        }
        let r = launcher.launch(kernel, stream, cycles);
        if at_launch.is_some() {
            call!(cuda, cuCtxSetCurrent: PFN_cuCtxSetCurrent, own)?;
        }
        check(args.launch.as_str(), r)
    };
    // Two sets of events, for the batch running and the batch being queued behind it.
    let pairs = (args.sync_every.div_ceil(args.sample_every)) as usize;
    let mut sets = Vec::new();
    for _ in 0..2 {
        let samples: Vec<(CUevent, CUevent)> = (0..pairs)
            .map(|_| Ok((cuda.event_create()?, cuda.event_create()?)))
            .collect::<Result<_, ProbeError>>()?;
        sets.push(Batch {
            samples,
            used: 0,
            end: cuda.event_create()?,
        });
    }

    let (mut launches, mut sampled, mut sampled_ms) = (0u64, 0u64, 0f64);
    let mut collect = |b: &Batch| -> Result<(), ProbeError> {
        for (a, e) in &b.samples[..b.used] {
            sampled_ms += f64::from(cuda.event_elapsed_ms(*a, *e)?);
            sampled += 1;
        }
        Ok(())
    };
    let start = Instant::now();
    let mut k = 0usize;
    while start.elapsed().as_secs_f64() < args.seconds {
        // Queue batch k, then wait for batch k-1: the device always has work queued, as in
        // an application that overlaps launching with execution.
        let b = &mut sets[k % 2];
        b.used = 0;
        for i in 0..args.sync_every {
            let sample =
                (i % args.sample_every == 0).then(|| b.samples[(i / args.sample_every) as usize]);
            if let Some((a, _)) = sample {
                cuda.event_record(a, stream)?;
            }
            launch(kernel)?;
            if let Some((_, e)) = sample {
                cuda.event_record(e, stream)?;
                b.used += 1;
            }
            launches += 1;
        }
        cuda.event_record(b.end, stream)?;
        if k > 0 {
            let prev = &sets[(k - 1) % 2];
            cuda.event_sync(prev.end)?;
            collect(prev)?;
        }
        k += 1;
    }
    cuda.stream_sync(stream)?;
    if k > 0 {
        collect(&sets[(k - 1) % 2])?;
    }
    let wall = start.elapsed().as_secs_f64();
    for b in sets {
        for (a, e) in b.samples {
            let _ = cuda.event_destroy(a);
            let _ = cuda.event_destroy(e);
        }
        let _ = cuda.event_destroy(b.end);
    }
    if !stream.is_null() {
        let _ = cuda.stream_destroy(stream);
    }

    let nominal = launches as f64 * args.kernel_us as f64 * 1e-6 / wall;
    let event_kernel_us = if sampled > 0 {
        sampled_ms * 1000.0 / sampled as f64
    } else {
        0.0
    };
    let event_share = launches as f64 * event_kernel_us * 1e-6 / wall;
    out.emit(
        json!({
            "cmd": "burn",
            "launch": args.launch.as_str(),
            "current": format!("{:?}", args.current).to_lowercase(),
            "seconds": wall,
            "kernel_us": args.kernel_us,
            "cycles": cycles,
            "launches": launches,
            "nominal_share": nominal,
            "event_share": event_share,
            "event_kernel_us": event_kernel_us,
        }),
        || {
            format!(
                // Events bracket a launch call, so a shim pacing launches shows up in the
                // event time: that figure checks the clock on real GPUs, the share is nominal.
                "burn: {wall:.2} s wall, {launches} kernels of {} us: share of device time {:.1} % (event time per launch {event_kernel_us:.1} us, includes any launch pacing)",
                args.kernel_us,
                nominal * 100.0
            )
        },
    );
    Ok(())
}
