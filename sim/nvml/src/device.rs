//! Device enumeration and identity: the GPUs whose device node this process sees, numbered
//! 0.. in index order, with the names, UUIDs, minors and PCI addresses of `devices.json`.

use std::ffi::{c_char, c_uint};

use gpuslice_cuda_ffi::nvml::*;
use gpuslice_sim_core::SimDevice;

use crate::ffi::{c_str, guard, put, put_str, NvResult};
use crate::state::nvml;

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    guard(|| put(count, nvml()?.visible.len() as c_uint))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard(|| put(device, nvml()?.handle(index as usize)?))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard(|| {
        let n = nvml()?;
        let wanted = c_str(uuid)?;
        let i = (0..n.visible.len())
            .find(|i| {
                n.node.devices()[n.visible[*i]]
                    .uuid
                    .eq_ignore_ascii_case(wanted)
            })
            .ok_or(NVML_ERROR_NOT_FOUND)?;
        put(device, n.handle(i)?)
    })
}

/// (domain, bus, device, function) of `DDDDDDDD:BB:DD.F` or `DDDD:BB:DD.F`.
pub fn parse_bus_id(s: &str) -> Option<(u32, u32, u32, u32)> {
    let (domain, rest) = s.split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (dev, function) = rest.split_once('.')?;
    Some((
        u32::from_str_radix(domain, 16).ok()?,
        u32::from_str_radix(bus, 16).ok()?,
        u32::from_str_radix(dev, 16).ok()?,
        u32::from_str_radix(function, 16).ok()?,
    ))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    bus_id: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard(|| {
        let n = nvml()?;
        let wanted = parse_bus_id(c_str(bus_id)?).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        let i = (0..n.visible.len())
            .find(|i| parse_bus_id(&n.node.devices()[n.visible[*i]].pci_bus_id) == Some(wanted))
            .ok_or(NVML_ERROR_NOT_FOUND)?;
        put(device, n.handle(i)?)
    })
}

/// Runs `f` on the device behind handle `h`.
pub fn with_device(h: nvmlDevice_t, f: impl FnOnce(usize, &SimDevice) -> NvResult) -> NvResult {
    let n = nvml()?;
    let (i, d) = n.device(h)?;
    f(i, d)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(
    device: nvmlDevice_t,
    index: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| with_device(device, |i, _| put(index, i as c_uint)))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard(|| with_device(device, |_, d| put_str(name, length, &d.model)))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard(|| with_device(device, |_, d| put_str(uuid, length, &d.uuid)))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device: nvmlDevice_t,
    minor: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| with_device(device, |_, d| put(minor, d.minor)))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNumaNodeId(
    device: nvmlDevice_t,
    node: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| with_device(device, |_, d| put(node, d.numa_node)))
}

/// PCI device id (device << 16 | NVIDIA's vendor id) of a model.
fn pci_device_id(model: &str) -> u32 {
    let m = model.to_ascii_uppercase();
    let device = if m.contains("A100") {
        0x20b2
    } else if m.contains("H100") {
        0x2330
    } else {
        0x2335
    };
    (device << 16) | 0x10de
}

fn copy_str<const N: usize>(text: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (o, b) in out.iter_mut().zip(text.bytes().take(N - 1)) {
        *o = b as c_char;
    }
    out
}

/// The PCI info NVML reports for `d`.
pub fn pci_info(d: &SimDevice) -> nvmlPciInfo_t {
    let (domain, bus, device, function) = parse_bus_id(&d.pci_bus_id).unwrap_or_default();
    nvmlPciInfo_t {
        busIdLegacy: copy_str(&format!("{domain:04X}:{bus:02X}:{device:02X}.{function:X}")),
        domain,
        bus,
        device,
        pciDeviceId: pci_device_id(&d.model),
        pciSubSystemId: 0x18be_10de,
        busId: copy_str(&format!("{domain:08X}:{bus:02X}:{device:02X}.{function:X}")),
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    guard(|| with_device(device, |_, d| put(pci, pci_info(d))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_info_has_both_bus_id_forms() {
        let d = SimDevice {
            index: 0,
            uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
            model: "NVIDIA H200".into(),
            memory: 1,
            minor: 0,
            pci_bus_id: "00000000:1A:00.0".into(),
            numa_node: 0,
            sm_count: 1,
            clock_khz: 1,
            context_memory: 0,
            reserved_memory: 0,
        };
        let p = pci_info(&d);
        let text = |b: &[c_char]| {
            b.iter()
                .take_while(|c| **c != 0)
                .map(|c| *c as u8 as char)
                .collect::<String>()
        };
        assert_eq!(text(&p.busId), "00000000:1A:00.0");
        assert_eq!(text(&p.busIdLegacy), "0000:1A:00.0");
        assert_eq!((p.bus, p.device, p.pciDeviceId), (0x1a, 0, 0x2335_10de));
    }
}
