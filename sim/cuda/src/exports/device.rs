//! Device enumeration and properties: only the GPUs whose device node this process can see,
//! numbered 0.. in index order, with the name, UUID, memory, PCI address, SM count and clock
//! of `devices.json` and attributes of a Hopper-class GPU.

use std::ffi::{c_char, c_int, c_uint};

use gpuslice_cuda_ffi::*;
use gpuslice_sim_core::SimDevice;

use crate::driver::driver;
use crate::guard::{c_str, guard, put, put_str, CuResult};

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    guard(|| put(count, driver()?.ordinals.len() as c_int))
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult {
    guard(|| {
        let d = driver()?;
        put(device, d.ordinal(ordinal)? as CUdevice)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    guard(|| {
        let d = driver()?;
        put_str(name, len, &d.device(d.ordinal(dev)?).model)
    })
}

fn uuid(out: *mut CUuuid, dev: CUdevice) -> CuResult {
    let d = driver()?;
    let text = &d.device(d.ordinal(dev)?).uuid;
    put(
        out,
        CUuuid::parse_gpu_string(text).ok_or(CUDA_ERROR_UNKNOWN)?,
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid(out: *mut CUuuid, dev: CUdevice) -> CUresult {
    guard(|| uuid(out, dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(out: *mut CUuuid, dev: CUdevice) -> CUresult {
    guard(|| uuid(out, dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    guard(|| {
        let d = driver()?;
        put(bytes, d.device(d.ordinal(dev)?).allocatable() as usize)
    })
}

/// The pre-3.2 entry point: a 32-bit count, clamped.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice) -> CUresult {
    guard(|| {
        let d = driver()?;
        put(
            bytes,
            d.device(d.ordinal(dev)?)
                .allocatable()
                .min(u64::from(c_uint::MAX)) as c_uint,
        )
    })
}

/// `DDDDDDDD:BB:DD.F` → (domain, bus, device, function).
pub fn parse_bus_id(s: &str) -> Option<(u32, u32, u32, u32)> {
    let (domain, rest) = s.split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (device, function) = rest.split_once('.')?;
    Some((
        u32::from_str_radix(domain, 16).ok()?,
        u32::from_str_radix(bus, 16).ok()?,
        u32::from_str_radix(device, 16).ok()?,
        u32::from_str_radix(function, 16).ok()?,
    ))
}

fn compute_capability(model: &str) -> (c_int, c_int) {
    let m = model.to_ascii_uppercase();
    if m.contains("A100") || m.contains("A30") {
        (8, 0)
    } else if m.contains("L40") || m.contains("L4") {
        (8, 9)
    } else if m.contains("T4") {
        (7, 5)
    } else {
        (9, 0)
    }
}

/// Highest attribute number accepted (the API numbers attributes 1.. without gaps).
const ATTRIBUTE_MAX: CUdevice_attribute = 150;

/// The value of attribute `attr` for `d`; `None` for an attribute number the API lacks.
pub fn attribute(d: &SimDevice, attr: CUdevice_attribute) -> Option<c_int> {
    let (domain, bus, device, _) = parse_bus_id(&d.pci_bus_id).unwrap_or_default();
    let (major, minor) = compute_capability(&d.model);
    let value = match attr {
        CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK => 1024,
        CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X | CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y => 1024,
        CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z => 64,
        CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X => c_int::MAX,
        CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y | CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z => 65535,
        CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK => 49152,
        CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY => 65536,
        CU_DEVICE_ATTRIBUTE_WARP_SIZE => 32,
        CU_DEVICE_ATTRIBUTE_MAX_PITCH => c_int::MAX,
        CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK => 65536,
        CU_DEVICE_ATTRIBUTE_CLOCK_RATE => d.clock_khz as c_int,
        CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT => 512,
        CU_DEVICE_ATTRIBUTE_GPU_OVERLAP => 1,
        CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT => d.sm_count as c_int,
        CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT | CU_DEVICE_ATTRIBUTE_INTEGRATED => 0,
        CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY => 1,
        CU_DEVICE_ATTRIBUTE_COMPUTE_MODE => 0,
        CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS | CU_DEVICE_ATTRIBUTE_ECC_ENABLED => 1,
        CU_DEVICE_ATTRIBUTE_PCI_BUS_ID => bus as c_int,
        CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID => device as c_int,
        CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID => domain as c_int,
        CU_DEVICE_ATTRIBUTE_TCC_DRIVER => 0,
        CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE => 2_619_000,
        CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH => 6144,
        CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE => 50 << 20,
        CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR => 2048,
        CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT => 3,
        CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING => 1,
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR => major,
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR => minor,
        CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED
        | CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED
        | CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED => 1,
        CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR => 233_472,
        CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR => 65536,
        CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY => 1,
        CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD => 0,
        CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD_GROUP_ID => d.index as c_int,
        CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS
        | CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED
        | CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH => 1,
        CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN => 232_448,
        CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
        | CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED => 1,
        CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR => 32,
        CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE => 31 << 20,
        CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED => 1,
        // Attributes this simulation does not model read as 0, as unsupported features do.
        _ => 0,
    };
    (1..=ATTRIBUTE_MAX).contains(&attr).then_some(value)
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    pi: *mut c_int,
    attrib: CUdevice_attribute,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        let d = driver()?;
        let value = attribute(d.device(d.ordinal(dev)?), attrib).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        put(pi, value)
    })
}

/// The bus id as CUDA prints it: `DDDD:BB:DD.F`.
fn cuda_bus_id(d: &SimDevice) -> String {
    let (domain, bus, device, function) = parse_bus_id(&d.pci_bus_id).unwrap_or_default();
    format!("{domain:04x}:{bus:02x}:{device:02x}.{function:x}")
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetPCIBusId(
    bus_id: *mut c_char,
    len: c_int,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        let d = driver()?;
        put_str(bus_id, len, &cuda_bus_id(d.device(d.ordinal(dev)?)))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetByPCIBusId(
    dev: *mut CUdevice,
    bus_id: *const c_char,
) -> CUresult {
    guard(|| {
        let d = driver()?;
        let wanted = c_str(bus_id)?
            .to_str()
            .ok()
            .and_then(parse_bus_id)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let ord = (0..d.ordinals.len())
            .find(|o| parse_bus_id(&d.device(*o).pci_bus_id) == Some(wanted))
            .ok_or(CUDA_ERROR_INVALID_DEVICE)?;
        put(dev, ord as CUdevice)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev() -> SimDevice {
        SimDevice {
            index: 2,
            uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
            model: "NVIDIA H200".into(),
            memory: 1 << 30,
            minor: 2,
            pci_bus_id: "00000000:1A:00.0".into(),
            numa_node: 0,
            sm_count: 132,
            clock_khz: 1_980_000,
            context_memory: 0,
            reserved_memory: 0,
        }
    }

    #[test]
    fn attributes_follow_the_device() {
        let d = dev();
        assert_eq!(
            attribute(&d, CU_DEVICE_ATTRIBUTE_CLOCK_RATE),
            Some(1_980_000)
        );
        assert_eq!(
            attribute(&d, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
            Some(132)
        );
        assert_eq!(
            attribute(&d, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
            Some(9)
        );
        assert_eq!(attribute(&d, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID), Some(0x1a));
        assert_eq!(attribute(&d, 9999), None);
        assert_eq!(cuda_bus_id(&d), "0000:1a:00.0");
        assert_eq!(parse_bus_id("0000:1a:00.0"), parse_bus_id(&d.pci_bus_id));
    }
}
