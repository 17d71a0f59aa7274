//! `info`: what a program learns about a device — name, UUID, `cuMemGetInfo`,
//! `cuDeviceTotalMem` — and what NVML reports for the same GPU (by UUID).

use serde_json::json;

use gpuslice_cuda_ffi::*;

use crate::cuda::Cuda;
use crate::error::ProbeError;
use crate::nvml;
use crate::report::{human_bytes, Out};

pub fn run(cuda: &Cuda, out: Out, ordinal: i32, nvml_lib: &str) -> Result<(), ProbeError> {
    let count = cuda.device_count()?;
    let driver_version = cuda.driver_version()?;
    let dev = cuda.open_device(ordinal)?;
    let name = cuda.name(&dev)?;
    let uuid = cuda.uuid(&dev)?;
    let (free, total) = cuda.mem_info()?;
    let total_mem = cuda.total_mem(&dev)?;
    let clock_khz = cuda.attribute(&dev, CU_DEVICE_ATTRIBUTE_CLOCK_RATE)?;
    let sm_count = cuda.attribute(&dev, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    let nv = nvml::memory(nvml_lib, &uuid);
    let nvml_json = match &nv {
        Ok(m) => json!({"total": m.total, "used": m.used, "free": m.free}),
        Err(_) => serde_json::Value::Null,
    };
    out.emit(
        json!({
            "cmd": "info",
            "resolve": cuda.resolve.as_str(),
            "cuda_version": cuda.version,
            "driver_version": driver_version,
            "count": count,
            "device": ordinal,
            "name": name,
            "uuid": uuid,
            "mem_free": free,
            "mem_total": total,
            "total_mem": total_mem,
            "clock_khz": clock_khz,
            "sm_count": sm_count,
            "nvml": nvml_json,
            "nvml_error": nv.as_ref().err(),
        }),
        || {
            let nvml_line = match &nv {
                Ok(m) => format!("total {} used {} free {}", human_bytes(m.total), human_bytes(m.used), human_bytes(m.free)),
                Err(e) => format!("unavailable ({e})"),
            };
            format!(
                "device {ordinal} of {count}: {name} {uuid}\n  driver {driver_version}, {sm_count} SMs at {} MHz\n  cuMemGetInfo: free {} of {}\n  cuDeviceTotalMem: {}\n  NVML: {nvml_line}",
                clock_khz / 1000,
                human_bytes(free),
                human_bytes(total),
                human_bytes(total_mem)
            )
        },
    );
    Ok(())
}
