//! Virtual memory management: physical allocations (`cuMemCreate`) are charged when created
//! and given back once released and unmapped everywhere; address reservations and mappings
//! are bookkeeping on fake addresses.

use std::ffi::c_ulonglong;

use gpuslice_cuda_ffi::*;

use crate::driver::{driver, Driver, Mapping, Physical, VMM_GRANULARITY};
use crate::guard::{get, get_slice, guard, put, CuResult};

fn check_prop(d: &Driver, prop: *const CUmemAllocationProp) -> CuResult<usize> {
    let p = get(prop)?;
    if p.type_ != CU_MEM_ALLOCATION_TYPE_PINNED || p.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    d.ordinal(p.location.id)
        .map_err(|_| CUDA_ERROR_INVALID_DEVICE)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    granularity: *mut usize,
    prop: *const CUmemAllocationProp,
    option: CUmemAllocationGranularity_flags,
) -> CUresult {
    guard(|| {
        let d = driver()?;
        check_prop(d, prop)?;
        if !matches!(
            option,
            CU_MEM_ALLOC_GRANULARITY_MINIMUM | CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
        ) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        put(granularity, VMM_GRANULARITY as usize)
    })
}

fn aligned(size: usize) -> bool {
    size > 0 && (size as u64).is_multiple_of(VMM_GRANULARITY)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: c_ulonglong,
) -> CUresult {
    guard(|| {
        let d = driver()?;
        let ord = check_prop(d, prop)?;
        if handle.is_null() || flags != 0 || !aligned(size) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut o = d.objects();
        d.charge(ord, size as u64)?;
        let id = o.new_id();
        o.physical.insert(
            id,
            Physical {
                ordinal: ord,
                bytes: size as u64,
                released: false,
                maps: 0,
            },
        );
        put(handle, id)
    })
}

fn drop_if_unused(d: &Driver, o: &mut crate::driver::Objects, id: u64) {
    if let Some(p) = o.physical.get(&id) {
        if p.released && p.maps == 0 {
            d.uncharge(p.ordinal, p.bytes);
            o.physical.remove(&id);
            o.free_id(id);
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult {
    guard(|| {
        let d = driver()?;
        let mut o = d.objects();
        let p = o
            .physical
            .get_mut(&handle)
            .filter(|p| !p.released)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        p.released = true;
        drop_if_unused(d, &mut o, handle);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    alignment: usize,
    _addr: CUdeviceptr,
    flags: c_ulonglong,
) -> CUresult {
    guard(|| {
        let d = driver()?;
        if ptr.is_null()
            || flags != 0
            || !aligned(size)
            || (alignment != 0 && !alignment.is_power_of_two())
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut o = d.objects();
        let va = o.new_va(size as u64, (alignment as u64).max(VMM_GRANULARITY))?;
        o.reservations.insert(va, size as u64);
        put(ptr, va)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult {
    guard(|| {
        let d = driver()?;
        let mut o = d.objects();
        if o.reservations.get(&ptr) != Some(&(size as u64)) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        o.reservations.remove(&ptr);
        // A range with mappings left in it is not handed out again: they would refuse the
        // next reservation's `cuMemMap` there.
        let mapped = o
            .mappings
            .range(..ptr.saturating_add(size as u64))
            .next_back()
            .is_some_and(|(s, m)| s + m.size > ptr);
        if !mapped {
            o.free_va(ptr, size as u64);
        }
        Ok(())
    })
}

/// True when `[ptr, ptr+size)` lies inside one reservation.
fn reserved(o: &crate::driver::Objects, ptr: u64, size: u64) -> bool {
    o.reservations
        .range(..=ptr)
        .next_back()
        .is_some_and(|(start, len)| ptr.checked_add(size).is_some_and(|end| end <= start + len))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: c_ulonglong,
) -> CUresult {
    guard(|| {
        let d = driver()?;
        let mut o = d.objects();
        let (size, offset) = (size as u64, offset as u64);
        if flags != 0 || size == 0 || !reserved(&o, ptr, size) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if o.mappings
            .range(..ptr.saturating_add(size))
            .next_back()
            .is_some_and(|(s, m)| s + m.size > ptr)
        {
            return Err(CUDA_ERROR_ALREADY_MAPPED);
        }
        let p = o
            .physical
            .get_mut(&handle)
            .filter(|p| !p.released)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if !matches!(offset.checked_add(size), Some(end) if end <= p.bytes) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        p.maps += 1;
        o.mappings.insert(ptr, Mapping { handle, size });
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    guard(|| {
        let d = driver()?;
        let mut o = d.objects();
        let m = *o
            .mappings
            .get(&ptr)
            .filter(|m| m.size == size as u64)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        o.mappings.remove(&ptr);
        if let Some(p) = o.physical.get_mut(&m.handle) {
            p.maps = p.maps.saturating_sub(1);
        }
        drop_if_unused(d, &mut o, m.handle);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemSetAccess(
    ptr: CUdeviceptr,
    size: usize,
    desc: *const CUmemAccessDesc,
    count: usize,
) -> CUresult {
    guard(|| {
        let d = driver()?;
        let descs = get_slice(desc, count)?;
        if descs.is_empty() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        for a in &descs {
            if a.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            d.ordinal(a.location.id)
                .map_err(|_| CUDA_ERROR_INVALID_DEVICE)?;
        }
        let o = d.objects();
        let end = ptr
            .checked_add(size as u64)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // Every byte of the range must be mapped.
        let mut at = ptr;
        while at < end {
            let (start, m) = o
                .mappings
                .range(..=at)
                .next_back()
                .ok_or(CUDA_ERROR_INVALID_VALUE)?;
            if start + m.size <= at {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            at = start + m.size;
        }
        Ok(())
    })
}
