//! Linear, pitched, managed and stream-ordered allocations and their frees (pools, and what
//! they keep after a free, are in [`crate::hooks::pools`]).

use std::ffi::c_uint;

use gpuslice_cuda_ffi::*;

use crate::account::{self, Kind};
use crate::guard::guard;
use crate::hooks::{graph, pools};
use crate::sizes::pitch_estimate;
use crate::state;

/// Charges `bytes` on the current context's device and runs `call`, which returns the new
/// device address.
fn alloc_current(bytes: u64, call: impl FnOnce() -> Result<u64, CUresult>) -> CUresult {
    let (slice, devices) = tri!(state::ready());
    let t = tri!(account::target_current(devices));
    account::allocate(slice, t, Kind::Ptr, bytes, call)
}

pub fn ok_then<T>(r: CUresult, value: impl FnOnce() -> T) -> Result<T, CUresult> {
    if r == CUDA_SUCCESS {
        Ok(value())
    } else {
        Err(r)
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    guard("cuMemAlloc_v2", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuMemAlloc_v2);
        alloc_current(bytesize as u64, || {
            // SAFETY: the caller's arguments, unchanged; dptr is read only after success.
            ok_then(unsafe { f(dptr, bytesize) }, || unsafe { *dptr })
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc(dptr: *mut CUdeviceptr_v1, bytesize: c_uint) -> CUresult {
    guard("cuMemAlloc", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuMemAlloc);
        alloc_current(u64::from(bytesize), || {
            // SAFETY: as for cuMemAlloc_v2.
            ok_then(unsafe { f(dptr, bytesize) }, || u64::from(unsafe { *dptr }))
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    flags: c_uint,
) -> CUresult {
    guard("cuMemAllocManaged", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuMemAllocManaged);
        alloc_current(bytesize as u64, || {
            // SAFETY: as for cuMemAlloc_v2.
            ok_then(unsafe { f(dptr, bytesize, flags) }, || unsafe { *dptr })
        })
    })
}

/// Pitched allocations: charge an upper bound first, then settle on the pitch the driver
/// chose (refusing, and freeing, if even that does not fit).
fn alloc_pitch(
    width: u64,
    height: u64,
    call: impl FnOnce() -> Result<(u64, u64), CUresult>,
    free: impl FnOnce(u64),
) -> CUresult {
    let (slice, devices) = tri!(state::ready());
    let t = tri!(account::target_current(devices));
    let estimate = pitch_estimate(width, height);
    tri!(account::reserve(slice, t, estimate));
    let (ptr, pitch) = match call() {
        Ok(v) => v,
        Err(r) => {
            slice.usage.release(t.idx, estimate);
            return r;
        }
    };
    let actual = pitch.saturating_mul(height.max(1));
    if actual > estimate {
        if let Err(r) = account::reserve(slice, t, actual - estimate) {
            slice.usage.release(t.idx, estimate);
            free(ptr);
            return r;
        }
    } else {
        slice.usage.release(t.idx, estimate - actual);
    }
    account::record(Kind::Ptr, ptr, t, actual);
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: c_uint,
) -> CUresult {
    guard("cuMemAllocPitch_v2", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuMemAllocPitch_v2);
        let free = crate::real::cu::cuMemFree_v2();
        alloc_pitch(
            width as u64,
            height as u64,
            || {
                ok_then(
                    // SAFETY: the caller's arguments.
                    unsafe { f(dptr, pitch, width, height, elem) },
                    // SAFETY: read only after success, when the driver wrote both.
                    || unsafe { (*dptr, *pitch as u64) },
                )
            },
            |p| {
                if let Some(free) = free {
                    // SAFETY: freeing the allocation just made.
                    unsafe { free(p) };
                }
            },
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch(
    dptr: *mut CUdeviceptr_v1,
    pitch: *mut c_uint,
    width: c_uint,
    height: c_uint,
    elem: c_uint,
) -> CUresult {
    guard("cuMemAllocPitch", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuMemAllocPitch);
        let free = crate::real::cu::cuMemFree();
        alloc_pitch(
            u64::from(width),
            u64::from(height),
            || {
                ok_then(
                    // SAFETY: the caller's arguments.
                    unsafe { f(dptr, pitch, width, height, elem) },
                    // SAFETY: read only after success, when the driver wrote both.
                    || unsafe { (u64::from(*dptr), u64::from(*pitch)) },
                )
            },
            |p| {
                if let Some(free) = free {
                    // SAFETY: freeing the allocation just made (32-bit address from the driver).
                    unsafe { free(p as CUdeviceptr_v1) };
                }
            },
        )
    })
}

/// Frees through `call` and gives the allocation back (its entry leaves the table before the
/// driver is asked, see [`account::free_with`]); a pool allocation's memory goes to its
/// pool's cache (see [`crate::hooks::pools`]), graph memory to its device's graph cache (see
/// [`crate::hooks::graph`]).
fn free_ptr(ptr: u64, call: impl FnOnce() -> CUresult) -> CUresult {
    let (r, gone) = account::free_with(Kind::Ptr, &[ptr], call);
    if r == CUDA_SUCCESS && gone.is_empty() {
        // Perhaps graph memory a launch allocated, freed outside the graph.
        graph::freed_outside(ptr);
    }
    if let Some(s) = state::slice() {
        for e in gone {
            if e.pool == graph::GRAPH_POOL {
                graph::freed(e);
            } else if e.pool != 0 {
                pools::freed(s, e);
            } else {
                s.usage.release(e.dev, e.bytes);
            }
        }
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    guard("cuMemFree_v2", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuMemFree_v2);
        // SAFETY: the caller's argument.
        free_ptr(dptr, || unsafe { f(dptr) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFree(dptr: CUdeviceptr_v1) -> CUresult {
    guard("cuMemFree", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuMemFree);
        // SAFETY: the caller's argument.
        free_ptr(u64::from(dptr), || unsafe { f(dptr) })
    })
}

/// `cuMemAllocAsync`: from the current pool of the stream's device, charged to that device and
/// recorded with that pool; on a stream in capture, an allocation node of the capture graph instead.
macro_rules! alloc_async {
    ($name:ident, $per_thread:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            dptr: *mut CUdeviceptr,
            bytesize: usize,
            stream: CUstream,
        ) -> CUresult {
            guard(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                let f = real!($name);
                let (slice, devices) = tri!(state::ready());
                // SAFETY: the caller's arguments; dptr read only after success.
                let call = || unsafe { f(dptr, bytesize, stream) };
                // From the pool current to the stream's device, not the current context's.
                let (dev, ctx, _) = tri!(state::stream_device(stream, $per_thread));
                if let Some(graph) = graph::capture_graph(stream, $per_thread) {
                    return graph::captured(graph, Some(dev), bytesize as u64, || {
                        // SAFETY: the driver wrote dptr on success.
                        ok_then(call(), || unsafe { *dptr })
                    });
                }
                let mut t = tri!(account::target_on(devices, dev));
                t.ctx = ctx as usize;
                let pool = pools::current_pool_of(dev).unwrap_or(0);
                pools::allocate_from(slice, t, pool, bytesize as u64, || {
                    // SAFETY: the driver wrote dptr on success.
                    ok_then(call(), || unsafe { *dptr })
                })
            })
        }
    };
}
alloc_async!(cuMemAllocAsync, false);
alloc_async!(cuMemAllocAsync_ptsz, true);

/// `cuMemFreeAsync`; on a stream in capture the free becomes a graph node that runs with
/// the graph, so nothing is given back now.
macro_rules! free_async {
    ($name:ident, $per_thread:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
            guard(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                let f = real!($name);
                if let Some(graph) = graph::capture_graph(stream, $per_thread) {
                    // SAFETY: the caller's arguments.
                    let r = unsafe { f(dptr, stream) };
                    if r == CUDA_SUCCESS {
                        graph::note_free(graph, dptr);
                    }
                    return r;
                }
                // SAFETY: the caller's arguments.
                free_ptr(dptr, || unsafe { f(dptr, stream) })
            })
        }
    };
}
free_async!(cuMemFreeAsync, false);
free_async!(cuMemFreeAsync_ptsz, true);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::account::Target;

    const T: Target = Target { idx: 0, ctx: 1 };

    #[test]
    fn an_address_the_driver_hands_out_again_during_a_free_stays_charged() {
        let p = 0x7000_0000;
        account::record(Kind::Ptr, p, T, 100);
        // Another thread's allocation gets the address as soon as the driver has freed it,
        // before this free returns: its entry must survive the free.
        let r = free_ptr(p, || {
            account::record(Kind::Ptr, p, T, 200);
            CUDA_SUCCESS
        });
        assert_eq!(r, CUDA_SUCCESS);
        assert_eq!(account::charged(Kind::Ptr, p).map(|e| e.bytes), Some(200));
    }

    #[test]
    fn a_refused_free_keeps_the_allocation_charged() {
        let p = 0x7100_0000;
        account::record(Kind::Ptr, p, T, 300);
        let r = free_ptr(p, || CUDA_ERROR_INVALID_VALUE);
        assert_eq!(r, CUDA_ERROR_INVALID_VALUE);
        assert_eq!(account::charged(Kind::Ptr, p).map(|e| e.bytes), Some(300));
        assert_eq!(free_ptr(p, || CUDA_SUCCESS), CUDA_SUCCESS);
        assert!(account::charged(Kind::Ptr, p).is_none());
    }
}
