//! CUDA arrays and mipmapped arrays, charged by the size their descriptor implies.

use std::ffi::c_uint;

use gpuslice_cuda_ffi::*;

use crate::account::{self, Kind};
use crate::guard::guard;
use crate::hooks::vmm;
use crate::sizes;
use crate::state;

fn alloc_array(kind: Kind, bytes: u64, call: impl FnOnce() -> Result<u64, CUresult>) -> CUresult {
    let (slice, devices) = tri!(state::ready());
    let t = tri!(account::target_current(devices));
    account::allocate(slice, t, kind, bytes, call)
}

/// An array creator: its descriptor (the pre-3.2 exports take 32-bit sizes, widened to the
/// `_v2` layout) charged as the array's bytes before the driver is called.
macro_rules! array_create {
    ($name:ident, $desc:ty, $full:ty, $bytes:path) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(arr: *mut CUarray, desc: *const $desc) -> CUresult {
            guard(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                let f = real!($name);
                if desc.is_null() || arr.is_null() {
                    return CUDA_ERROR_INVALID_VALUE;
                }
                // SAFETY: checked non-null; the caller passes a valid descriptor. (A `_v2`
                // descriptor converts to itself.)
                #[allow(clippy::useless_conversion)]
                let full: $full = unsafe { *desc }.into();
                alloc_array(Kind::Array, $bytes(&full), || {
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
    };
}
array_create!(
    cuArrayCreate_v2,
    CUDA_ARRAY_DESCRIPTOR,
    CUDA_ARRAY_DESCRIPTOR,
    sizes::array_bytes
);
array_create!(
    cuArray3DCreate_v2,
    CUDA_ARRAY3D_DESCRIPTOR,
    CUDA_ARRAY3D_DESCRIPTOR,
    sizes::array3d_bytes
);
array_create!(
    cuArrayCreate,
    CUDA_ARRAY_DESCRIPTOR_v1,
    CUDA_ARRAY_DESCRIPTOR,
    sizes::array_bytes
);
array_create!(
    cuArray3DCreate,
    CUDA_ARRAY3D_DESCRIPTOR_v1,
    CUDA_ARRAY3D_DESCRIPTOR,
    sizes::array3d_bytes
);

#[no_mangle]
pub unsafe extern "C" fn cuArrayDestroy(arr: CUarray) -> CUresult {
    guard("cuArrayDestroy", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuArrayDestroy);
        // A sparse array's tile mappings go with it.
        vmm::array_destroy_with(arr as usize, || {
            // SAFETY: the caller's argument.
            account::free(Kind::Array, arr as u64, || unsafe { f(arr) })
        })
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
        // A sparse mipmapped array's tile mappings go with it.
        vmm::array_destroy_with(arr as usize, || {
            // SAFETY: the caller's argument.
            account::free(Kind::Mipmap, arr as u64, || unsafe { f(arr) })
        })
    })
}
