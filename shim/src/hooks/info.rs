//! What a slice reports through CUDA: `cuMemGetInfo` and `cuDeviceTotalMem` show the limit
//! and the slice's own use instead of the whole GPU (see [`crate::figures`]).

use std::ffi::c_uint;

use gpuslice_cuda_ffi::*;

use crate::figures;
use crate::guard::guard;
use crate::state;

/// Rewrites the driver's `(free, total)` for the current context's device.
fn mem_info(phys_free: u64, phys_total: u64) -> Result<figures::Figures, CUresult> {
    let (slice, devices) = state::ready()?;
    let dev = state::current_device()?;
    Ok(figures::for_slice(
        slice,
        devices.index(dev),
        phys_total,
        phys_free,
    ))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    guard("cuMemGetInfo_v2", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuMemGetInfo_v2);
        tri!(state::ready());
        // SAFETY: the caller's arguments.
        let r = unsafe { f(free, total) };
        if r != CUDA_SUCCESS || free.is_null() || total.is_null() {
            return r;
        }
        // SAFETY: the driver just wrote both.
        let (pf, pt) = unsafe { (*free as u64, *total as u64) };
        let fig = tri!(mem_info(pf, pt));
        // SAFETY: checked non-null above.
        unsafe {
            *free = fig.free as usize;
            *total = fig.total as usize;
        }
        r
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) -> CUresult {
    guard("cuMemGetInfo", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuMemGetInfo);
        tri!(state::ready());
        // SAFETY: the caller's arguments.
        let r = unsafe { f(free, total) };
        if r != CUDA_SUCCESS || free.is_null() || total.is_null() {
            return r;
        }
        // SAFETY: the driver just wrote both.
        let (pf, pt) = unsafe { (u64::from(*free), u64::from(*total)) };
        let fig = tri!(mem_info(pf, pt));
        // SAFETY: checked non-null above; the values are at most the 32-bit originals.
        unsafe {
            *free = fig.free as c_uint;
            *total = fig.total as c_uint;
        }
        r
    })
}

/// The limit-clamped total of device `dev`.
fn total_of(dev: CUdevice, phys_total: u64) -> Result<u64, CUresult> {
    let (slice, devices) = state::ready()?;
    Ok(devices
        .index(dev)
        .and_then(|i| slice.device(i))
        .map_or(0, |d| d.memory_limit.min(phys_total)))
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    guard("cuDeviceTotalMem_v2", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuDeviceTotalMem_v2);
        tri!(state::ready());
        // SAFETY: the caller's arguments.
        let r = unsafe { f(bytes, dev) };
        if r != CUDA_SUCCESS || bytes.is_null() {
            return r;
        }
        // SAFETY: the driver just wrote it; checked non-null.
        unsafe { *bytes = tri!(total_of(dev, *bytes as u64)) as usize };
        r
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice) -> CUresult {
    guard("cuDeviceTotalMem", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuDeviceTotalMem);
        tri!(state::ready());
        // SAFETY: the caller's arguments.
        let r = unsafe { f(bytes, dev) };
        if r != CUDA_SUCCESS || bytes.is_null() {
            return r;
        }
        // SAFETY: the driver just wrote it; checked non-null; never larger than before.
        unsafe { *bytes = tri!(total_of(dev, u64::from(*bytes))) as c_uint };
        r
    })
}
