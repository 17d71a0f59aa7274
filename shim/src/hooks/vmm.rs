//! Virtual memory management: physical memory is charged when `cuMemCreate` makes it and
//! given back at `cuMemRelease`; reserving address space or mapping a handle (possibly
//! several times) allocates nothing.

use std::ffi::c_ulonglong;

use gpuslice_cuda_ffi::*;

use crate::account::{self, Kind};
use crate::guard::guard;
use crate::state;

#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: c_ulonglong,
) -> CUresult {
    guard("cuMemCreate", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuMemCreate);
        if prop.is_null() || handle.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let (slice, devices) = tri!(state::ready());
        // SAFETY: checked non-null; the caller owns a valid CUmemAllocationProp.
        let location = unsafe { (*prop).location };
        let t = if location.type_ == CU_MEM_LOCATION_TYPE_DEVICE {
            tri!(account::target_on(devices, location.id))
        } else {
            tri!(account::target_current(devices))
        };
        account::allocate(slice, t, Kind::Vmm, size as u64, || {
            // SAFETY: the caller's arguments; handle read only after success.
            let r = unsafe { f(handle, size, prop, flags) };
            if r == CUDA_SUCCESS {
                // SAFETY: the call succeeded, so the driver wrote the output.
                Ok(unsafe { *handle })
            } else {
                Err(r)
            }
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult {
    guard("cuMemRelease", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuMemRelease);
        // SAFETY: the caller's argument.
        let r = unsafe { f(handle) };
        if r == CUDA_SUCCESS {
            account::forget(Kind::Vmm, handle);
        }
        r
    })
}
