//! What monitoring tools (DCGM exporters, `nvidia-smi`-style dashboards, nvml-wrapper users)
//! read beyond memory and processes: identity extras (serial, brand, architecture, compute
//! capability, modes), temperature, power and clocks. Temperature and power follow the
//! device's utilisation over the last second, so a busy simulated GPU looks busy; clocks are
//! the model's. The unversioned entry points older programs link against are here too.

use std::ffi::{c_char, c_int, c_uint};

use gpuslice_cuda_ffi::nvml::*;
use gpuslice_sim_core::{now_ns, SimDevice};

use crate::device::with_device;
use crate::ffi::{guard, put, put_str, NvResult};
use crate::state::{self, nvml};

/// Idle die temperature, °C.
const IDLE_CELSIUS: u32 = 32;
/// Added at 100 % utilisation, °C.
const BUSY_CELSIUS: u32 = 40;
/// Memory clock reported, MHz (HBM3e of an H200).
const MEMORY_MHZ: u32 = 2619;
/// Idle power, mW.
const IDLE_MILLIWATTS: u32 = 70_000;

/// Board power limit of a model, mW.
pub fn power_limit_mw(model: &str) -> u32 {
    let m = model.to_ascii_uppercase();
    if m.contains("A100") {
        400_000
    } else {
        700_000
    }
}

/// Percent of the last second device `d` ran kernels.
fn busy_percent(d: &SimDevice) -> NvResult<u32> {
    Ok(nvml()?.node.state().utilization(d.index as usize, now_ns()))
}

/// Die temperature at `busy` percent utilisation.
pub fn temperature(busy: u32) -> u32 {
    IDLE_CELSIUS + BUSY_CELSIUS * busy.min(100) / 100
}

/// Power draw at `busy` percent utilisation, mW.
pub fn power_mw(model: &str, busy: u32) -> u32 {
    let limit = power_limit_mw(model);
    IDLE_MILLIWATTS + (limit - IDLE_MILLIWATTS) / 100 * busy.min(100)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlInit() -> nvmlReturn_t {
    guard(|| state::init(false))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount(count: *mut c_uint) -> nvmlReturn_t {
    guard(|| put(count, nvml()?.visible.len() as c_uint))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard(|| put(device, nvml()?.handle(index as usize)?))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard(|| put_str(version, length, "12.550.54.15"))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSerial(
    device: nvmlDevice_t,
    serial: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard(|| {
        with_device(device, |_, d| {
            put_str(serial, length, &format!("16523{:08}", d.index))
        })
    })
}

/// `NVML_BRAND_NVIDIA` (14) for data-centre parts.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetBrand(
    device: nvmlDevice_t,
    brand: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| with_device(device, |_, _| put(brand, 14)))
}

/// `NVML_DEVICE_ARCH_HOPPER` (9), `NVML_DEVICE_ARCH_AMPERE` (7) for A100s.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetArchitecture(
    device: nvmlDevice_t,
    arch: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        with_device(device, |_, d| {
            put(
                arch,
                if d.model.to_ascii_uppercase().contains("A100") {
                    7
                } else {
                    9
                },
            )
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> nvmlReturn_t {
    guard(|| {
        with_device(device, |_, d| {
            let ampere = d.model.to_ascii_uppercase().contains("A100");
            put(major, if ampere { 8 } else { 9 })?;
            put(minor, 0)
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPersistenceMode(
    device: nvmlDevice_t,
    mode: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| with_device(device, |_, _| put(mode, NVML_FEATURE_ENABLED)))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeMode(
    device: nvmlDevice_t,
    mode: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| with_device(device, |_, _| put(mode, NVML_COMPUTEMODE_DEFAULT)))
}

/// Performance state: P0 while busy, P8 idle.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPerformanceState(
    device: nvmlDevice_t,
    state: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        with_device(device, |_, d| {
            put(state, if busy_percent(d)? > 0 { 0 } else { 8 })
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: nvmlDevice_t,
    sensor: c_uint,
    temp: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        if sensor != NVML_TEMPERATURE_GPU {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        with_device(device, |_, d| put(temp, temperature(busy_percent(d)?)))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    device: nvmlDevice_t,
    power: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        with_device(device, |_, d| {
            put(power, power_mw(&d.model, busy_percent(d)?))
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementLimit(
    device: nvmlDevice_t,
    limit: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| with_device(device, |_, d| put(limit, power_limit_mw(&d.model))))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEnforcedPowerLimit(
    device: nvmlDevice_t,
    limit: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| with_device(device, |_, d| put(limit, power_limit_mw(&d.model))))
}

/// Total energy since the driver loaded is not modelled.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTotalEnergyConsumption(
    device: nvmlDevice_t,
    _energy: *mut u64,
) -> nvmlReturn_t {
    guard(|| with_device(device, |_, _| Err(NVML_ERROR_NOT_SUPPORTED)))
}

/// Data-centre GPUs report no fan.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFanSpeed(
    device: nvmlDevice_t,
    _speed: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| with_device(device, |_, _| Err(NVML_ERROR_NOT_SUPPORTED)))
}

fn clock_mhz(d: &SimDevice, kind: c_uint) -> NvResult<u32> {
    let sm = d.clock_khz / 1000;
    match kind {
        NVML_CLOCK_GRAPHICS | NVML_CLOCK_SM => Ok(sm),
        NVML_CLOCK_MEM => Ok(MEMORY_MHZ),
        NVML_CLOCK_VIDEO => Ok(sm * 9 / 10),
        _ => Err(NVML_ERROR_INVALID_ARGUMENT),
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device: nvmlDevice_t,
    kind: c_uint,
    clock: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| with_device(device, |_, d| put(clock, clock_mhz(d, kind)?)))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxClockInfo(
    device: nvmlDevice_t,
    kind: c_uint,
    clock: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| with_device(device, |_, d| put(clock, clock_mhz(d, kind)?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temperature_and_power_follow_utilisation_within_limits() {
        assert_eq!(temperature(0), IDLE_CELSIUS);
        assert_eq!(temperature(100), IDLE_CELSIUS + BUSY_CELSIUS);
        assert_eq!(temperature(250), temperature(100), "clamped");
        assert_eq!(power_mw("NVIDIA H200", 0), IDLE_MILLIWATTS);
        assert!(power_mw("NVIDIA H200", 100) <= power_limit_mw("NVIDIA H200"));
        assert!(power_mw("NVIDIA H200", 50) > power_mw("NVIDIA H200", 10));
        assert_eq!(power_limit_mw("NVIDIA A100-SXM4-80GB"), 400_000);
    }
}
