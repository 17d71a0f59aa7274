//! Virtual memory management: physical memory is charged when `cuMemCreate` makes it and
//! given back only when the driver frees it, which is when its handle is released and every
//! mapping of it is unmapped (a program may release the handle right after mapping it; the
//! memory lives on until the last unmap). The shim keeps the driver's reference count of
//! each handle it charged: creation and every `cuMemRetainAllocationHandle` count one,
//! every mapping one; `cuMemRelease` and `cuMemUnmap` take them away. Reserving address
//! space allocates nothing.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_ulonglong, c_void};

use gpuslice_cuda_ffi::*;

use crate::account::{self, Kind};
use crate::forksafe::ForkSafe;
use crate::guard::guard;
use crate::state;

#[derive(Default)]
struct Refs {
    /// References the driver holds on each charged handle (handle, mapping or retain).
    count: HashMap<CUmemGenericAllocationHandle, u64>,
    /// Mappings made through the shim: start address → (size, handle).
    maps: BTreeMap<CUdeviceptr, (u64, CUmemGenericAllocationHandle)>,
}

static REFS: ForkSafe<Refs> = ForkSafe::new(Refs::default);

/// One more reference on `handle`, if it is charged.
fn add_ref(handle: CUmemGenericAllocationHandle) {
    if let Some(n) = REFS.lock().count.get_mut(&handle) {
        *n = n.saturating_add(1);
    }
}

/// One reference less on `handle`; true when it was the last (the driver frees the memory).
fn drop_ref(refs: &mut Refs, handle: CUmemGenericAllocationHandle) -> bool {
    match refs.count.get_mut(&handle) {
        Some(n) if *n > 1 => {
            *n -= 1;
            false
        }
        Some(_) => {
            refs.count.remove(&handle);
            true
        }
        None => false,
    }
}

/// Gives back the charge of `handle`, whose last reference is gone.
fn give_back(handle: CUmemGenericAllocationHandle) {
    account::forget(Kind::Vmm, handle);
}

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
                let h = unsafe { *handle };
                REFS.lock().count.insert(h, 1);
                Ok(h)
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
        if r == CUDA_SUCCESS && drop_ref(&mut REFS.lock(), handle) {
            give_back(handle);
        }
        r
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(
    handle: *mut CUmemGenericAllocationHandle,
    addr: *mut c_void,
) -> CUresult {
    guard("cuMemRetainAllocationHandle", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuMemRetainAllocationHandle);
        // SAFETY: the caller's arguments.
        let r = unsafe { f(handle, addr) };
        if r == CUDA_SUCCESS && !handle.is_null() {
            // SAFETY: the call succeeded, so the driver wrote the output (checked non-null).
            add_ref(unsafe { *handle });
        }
        r
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: c_ulonglong,
) -> CUresult {
    guard("cuMemMap", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuMemMap);
        // SAFETY: the caller's arguments.
        let r = unsafe { f(ptr, size, offset, handle, flags) };
        if r == CUDA_SUCCESS {
            let mut refs = REFS.lock();
            if let Some(n) = refs.count.get_mut(&handle) {
                *n = n.saturating_add(1);
                refs.maps.insert(ptr, (size as u64, handle));
            }
        }
        r
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    guard("cuMemUnmap", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuMemUnmap);
        // SAFETY: the caller's arguments.
        let r = unsafe { f(ptr, size) };
        if r != CUDA_SUCCESS {
            return r;
        }
        // Every mapping that starts inside the range is gone.
        let end = ptr.saturating_add(size as u64);
        let freed: Vec<CUmemGenericAllocationHandle> = {
            let mut refs = REFS.lock();
            let starts: Vec<CUdeviceptr> = refs.maps.range(ptr..end).map(|(s, _)| *s).collect();
            let mut freed = Vec::new();
            for s in starts {
                if let Some((_, h)) = refs.maps.remove(&s) {
                    if drop_ref(&mut refs, h) {
                        freed.push(h);
                    }
                }
            }
            freed
        };
        for h in freed {
            give_back(h);
        }
        r
    })
}

/// For the child after `fork`.
pub fn reset_in_child() {
    REFS.reset_in_child();
}
