//! CUDA arrays and mipmapped arrays, charged by the size their descriptor implies.

use std::ffi::c_uint;

use gpuslice_cuda_ffi::*;

use crate::account::{self, Kind};
use crate::ffi_extra::{CUDA_ARRAY3D_DESCRIPTOR_v1, CUDA_ARRAY_DESCRIPTOR_v1};
use crate::guard::guard;
use crate::sizes;
use crate::state;

fn alloc_array(kind: Kind, bytes: u64, call: impl FnOnce() -> Result<u64, CUresult>) -> CUresult {
    let (slice, devices) = tri!(state::ready());
    let t = tri!(account::target_current(devices));
    account::allocate(slice, t, kind, bytes, call)
}

#[no_mangle]
pub unsafe extern "C" fn cuArrayCreate_v2(
    arr: *mut CUarray,
    desc: *const CUDA_ARRAY_DESCRIPTOR,
) -> CUresult {
    guard("cuArrayCreate_v2", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuArrayCreate_v2);
        if desc.is_null() || arr.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: checked non-null; the caller passes a valid descriptor.
        let bytes = sizes::array_bytes(unsafe { &*desc });
        alloc_array(Kind::Array, bytes, || {
            // SAFETY: the caller's arguments; arr read only after success.
            let r = unsafe { f(arr, desc) };
            if r == CUDA_SUCCESS {
                // SAFETY: the call succeeded, so the driver wrote the output.
                Ok(unsafe { *arr } as u64)
            } else {
                Err(r)
            }
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    arr: *mut CUarray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
) -> CUresult {
    guard("cuArray3DCreate_v2", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuArray3DCreate_v2);
        if desc.is_null() || arr.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: checked non-null; the caller passes a valid descriptor.
        let bytes = sizes::array3d_bytes(unsafe { &*desc });
        alloc_array(Kind::Array, bytes, || {
            // SAFETY: the caller's arguments; arr read only after success.
            let r = unsafe { f(arr, desc) };
            if r == CUDA_SUCCESS {
                // SAFETY: the call succeeded, so the driver wrote the output.
                Ok(unsafe { *arr } as u64)
            } else {
                Err(r)
            }
        })
    })
}

/// `cuArrayCreate`, the pre-3.2 export with 32-bit sizes: charged like `_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuArrayCreate(
    arr: *mut CUarray,
    desc: *const CUDA_ARRAY_DESCRIPTOR_v1,
) -> CUresult {
    guard("cuArrayCreate", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuArrayCreate);
        if desc.is_null() || arr.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: checked non-null; the caller passes a valid descriptor.
        let bytes = sizes::array_bytes(&unsafe { *desc }.into());
        alloc_array(Kind::Array, bytes, || {
            // SAFETY: the caller's arguments; arr read only after success.
            let r = unsafe { f(arr, desc) };
            if r == CUDA_SUCCESS {
                // SAFETY: the call succeeded, so the driver wrote the output.
                Ok(unsafe { *arr } as u64)
            } else {
                Err(r)
            }
        })
    })
}

/// `cuArray3DCreate`, the pre-3.2 export with 32-bit sizes: charged like `_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuArray3DCreate(
    arr: *mut CUarray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR_v1,
) -> CUresult {
    guard("cuArray3DCreate", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuArray3DCreate);
        if desc.is_null() || arr.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: checked non-null; the caller passes a valid descriptor.
        let bytes = sizes::array3d_bytes(&unsafe { *desc }.into());
        alloc_array(Kind::Array, bytes, || {
            // SAFETY: the caller's arguments; arr read only after success.
            let r = unsafe { f(arr, desc) };
            if r == CUDA_SUCCESS {
                // SAFETY: the call succeeded, so the driver wrote the output.
                Ok(unsafe { *arr } as u64)
            } else {
                Err(r)
            }
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuArrayDestroy(arr: CUarray) -> CUresult {
    guard("cuArrayDestroy", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuArrayDestroy);
        // SAFETY: the caller's argument.
        account::free(Kind::Array, arr as u64, || unsafe { f(arr) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    arr: *mut CUmipmappedArray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
    levels: c_uint,
) -> CUresult {
    guard("cuMipmappedArrayCreate", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuMipmappedArrayCreate);
        if desc.is_null() || arr.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: checked non-null; the caller passes a valid descriptor.
        let bytes = sizes::mipmapped_bytes(unsafe { &*desc }, levels);
        alloc_array(Kind::Mipmap, bytes, || {
            // SAFETY: the caller's arguments; arr read only after success.
            let r = unsafe { f(arr, desc, levels) };
            if r == CUDA_SUCCESS {
                // SAFETY: the call succeeded, so the driver wrote the output.
                Ok(unsafe { *arr } as u64)
            } else {
                Err(r)
            }
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(arr: CUmipmappedArray) -> CUresult {
    guard("cuMipmappedArrayDestroy", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuMipmappedArrayDestroy);
        // SAFETY: the caller's argument.
        account::free(Kind::Mipmap, arr as u64, || unsafe { f(arr) })
    })
}
