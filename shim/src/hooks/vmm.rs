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

use crate::account::{self, Entry, Kind};
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

/// One reference less on `handle`: `Some(true)` when it was the last (the driver frees the
/// memory), `None` when the handle is not charged.
fn drop_ref(refs: &mut Refs, handle: CUmemGenericAllocationHandle) -> Option<bool> {
    let n = refs.count.get_mut(&handle)?;
    if *n > 1 {
        *n -= 1;
        return Some(false);
    }
    refs.count.remove(&handle);
    Some(true)
}

/// Takes the charges of `handles`, whose last reference is going, out of the table before
/// the driver frees them (see [`account::free_with`]: a `cuMemCreate` that gets the same
/// handle right after keeps its own charge).
fn take_charges(handles: &[CUmemGenericAllocationHandle]) -> Vec<(u64, Entry)> {
    handles
        .iter()
        .filter_map(|h| account::take(Kind::Vmm, *h).map(|e| (*h, e)))
        .collect()
}

/// Gives the taken charges back (the driver freed) or restores them (it refused).
fn settle(r: CUresult, taken: Vec<(u64, Entry)>) {
    if r == CUDA_SUCCESS {
        let gone: Vec<Entry> = taken.into_iter().map(|(_, e)| e).collect();
        account::release_all(&gone);
    } else {
        for (h, e) in taken {
            account::restore(Kind::Vmm, h, e);
        }
    }
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
        let dropped = drop_ref(&mut REFS.lock(), handle);
        let one = [handle];
        let last = if dropped == Some(true) { &one[..] } else { &[] };
        let taken = take_charges(last);
        // SAFETY: the caller's argument.
        let r = unsafe { f(handle) };
        if r != CUDA_SUCCESS && dropped.is_some() {
            // Refused: the reference is still held.
            *REFS.lock().count.entry(handle).or_insert(0) += 1;
        }
        settle(r, taken);
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
        // Every mapping that starts inside the range goes; they leave the table first.
        let end = ptr.saturating_add(size as u64);
        let (removed, last) = {
            let mut refs = REFS.lock();
            let starts: Vec<CUdeviceptr> = refs.maps.range(ptr..end).map(|(s, _)| *s).collect();
            let (mut removed, mut last) = (Vec::new(), Vec::new());
            for s in starts {
                if let Some((len, h)) = refs.maps.remove(&s) {
                    removed.push((s, len, h));
                    if drop_ref(&mut refs, h) == Some(true) {
                        last.push(h);
                    }
                }
            }
            (removed, last)
        };
        let taken = take_charges(&last);
        // SAFETY: the caller's arguments.
        let r = unsafe { f(ptr, size) };
        if r != CUDA_SUCCESS {
            let mut refs = REFS.lock();
            for (s, len, h) in removed {
                refs.maps.insert(s, (len, h));
                *refs.count.entry(h).or_insert(0) += 1;
            }
        }
        settle(r, taken);
        r
    })
}

/// For the child after `fork`.
pub fn reset_in_child() {
    REFS.reset_in_child();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::account::Target;

    #[test]
    fn a_handle_the_driver_reuses_during_a_release_stays_charged() {
        let h: CUmemGenericAllocationHandle = 0x5150;
        let t = Target { idx: 0, ctx: 1 };
        account::record(Kind::Vmm, h, t, 100);
        REFS.lock().count.insert(h, 1);
        let dropped = drop_ref(&mut REFS.lock(), h);
        assert_eq!(dropped, Some(true));
        let taken = take_charges(&[h]);
        // The driver freed the handle; another thread's cuMemCreate gets it back at once.
        account::record(Kind::Vmm, h, t, 200);
        settle(CUDA_SUCCESS, taken);
        assert_eq!(account::charged(Kind::Vmm, h).map(|e| e.bytes), Some(200));
    }
}
