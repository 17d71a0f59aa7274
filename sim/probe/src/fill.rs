//! `fill`: what a serving engine does at start (vLLM and SGLang size their caches so): make
//! its contexts, read the free memory `cuMemGetInfo` reports, allocate that much (or a
//! fraction of it), then report what CUDA and NVML say about the device, and hold.

use std::time::Duration;

use serde_json::json;

use gpuslice_cuda_ffi::*;

use crate::cli::FillArgs;
use crate::cuda::{call, Cuda};
use crate::error::ProbeError;
use crate::nvml;
use crate::report::{human_bytes, Out};

/// Granularity the last allocation is rounded down to when the exact remainder is refused
/// (real GPUs allocate in 2 MiB pages).
const PAGE: u64 = 2 << 20;

pub fn run(
    cuda: &Cuda,
    out: Out,
    ordinal: i32,
    nvml_lib: &str,
    args: &FillArgs,
) -> Result<(), ProbeError> {
    let dev = cuda.open_device(ordinal)?;
    let mut primary: CUcontext = std::ptr::null_mut();
    call!(cuda, cuCtxGetCurrent: PFN_cuCtxGetCurrent, &mut primary)?;
    let mut contexts = Vec::new();
    for _ in 0..args.contexts {
        contexts.push(cuda.context_create(&dev)?);
    }
    call!(cuda, cuCtxSetCurrent: PFN_cuCtxSetCurrent, primary)?;
    let (free_before, _) = cuda.mem_info()?;
    let target = (free_before as f64 * args.fraction.clamp(0.0, 1.0)) as u64;
    let mut held: Vec<CUdeviceptr> = Vec::new();
    let mut total = 0u64;
    let mut refused = None;
    while total < target {
        let want = (target - total).min(args.chunk);
        let mut p: CUdeviceptr = 0;
        let mut r = call!(cuda, cuMemAlloc: PFN_cuMemAlloc_v2, &mut p, want as usize);
        let mut got = want;
        if r.is_err() && want > PAGE && !want.is_multiple_of(PAGE) {
            got = want / PAGE * PAGE;
            r = call!(cuda, cuMemAlloc: PFN_cuMemAlloc_v2, &mut p, got as usize);
        }
        match r {
            Ok(()) => {
                held.push(p);
                total += got;
                if got < want {
                    break;
                }
            }
            Err(ProbeError::Cuda { call, code }) => {
                refused = Some((call, code));
                break;
            }
            Err(e) => return Err(e),
        }
    }
    let (free, mem_total) = cuda.mem_info()?;
    let uuid = cuda.uuid(&dev)?;
    let view = nvml::view(nvml_lib, std::slice::from_ref(&uuid));
    let nvml_json = match &view {
        Ok(v) => v
            .first()
            .map(|d| d.to_json())
            .unwrap_or(serde_json::Value::Null),
        Err(_) => serde_json::Value::Null,
    };
    let v = json!({
        "cmd": "fill",
        "pid": std::process::id(),
        "contexts": 1 + contexts.len(),
        "free_before": free_before,
        "allocated": total,
        "error": refused.map(|(_, code)| crate::error::name(code)),
        "mem_free": free,
        "mem_total": mem_total,
        "mem_used": mem_total.saturating_sub(free),
        "nvml": nvml_json,
        "nvml_error": view.as_ref().err(),
    });
    out.emit(v, || {
        format!(
            "fill: {} contexts; cuMemGetInfo said {} free, {} allocated; now free {} of {}",
            1 + contexts.len(),
            human_bytes(free_before),
            human_bytes(total),
            human_bytes(free),
            human_bytes(mem_total)
        )
    });
    if args.hold > 0.0 {
        std::thread::sleep(Duration::from_secs_f64(args.hold));
    }
    for p in held {
        let _ = call!(cuda, cuMemFree: PFN_cuMemFree_v2, p);
    }
    for c in contexts {
        let _ = call!(cuda, cuCtxDestroy: PFN_cuCtxDestroy_v2, c);
    }
    match refused {
        Some((call, code)) if code != CUDA_ERROR_OUT_OF_MEMORY => {
            Err(ProbeError::Cuda { call, code })
        }
        _ => Ok(()),
    }
}

/// `smi`: NVML only, no CUDA — what `nvidia-smi` reads: every GPU's memory (both
/// `nvmlDeviceGetMemoryInfo` versions) and every process-list version. On the simulated
/// node the probe installed as `nvidia-smi` in the driver root runs this.
pub fn smi(out: Out, nvml_lib: &str) -> Result<(), ProbeError> {
    let view = nvml::view(nvml_lib, &[]).map_err(ProbeError::Nvml)?;
    for d in &view {
        out.emit(json!({"cmd": "smi", "device": d.to_json()}), || {
            let procs = d
                .lists
                .iter()
                .find(|(n, _)| *n == "nvmlDeviceGetComputeRunningProcesses_v3")
                .or_else(|| d.lists.first())
                .map(|(_, l)| {
                    l.iter()
                        .map(|(pid, used)| format!("\n    pid {pid}: {}", human_bytes(*used)))
                        .collect::<String>()
                })
                .unwrap_or_default();
            format!(
                "GPU {} {}: {} / {} used{}",
                d.index,
                d.uuid,
                human_bytes(d.v2.used),
                human_bytes(d.v2.total),
                if procs.is_empty() {
                    "\n    no running processes".to_string()
                } else {
                    procs
                }
            )
        });
    }
    Ok(())
}
