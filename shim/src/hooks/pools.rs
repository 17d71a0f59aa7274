//! Memory pools: allocations from created pools and from a device's default pool, and the
//! memory a pool keeps reserved after its allocations are freed. A pool with a release
//! threshold above 0 does not give freed memory back to the device, so a freed pool
//! allocation stays charged as the pool's cache until the driver says the pool no longer
//! holds it (reserved minus used bytes, `cuMemPoolGetAttribute`, never below what the
//! release threshold lets it keep after a free), the pool is trimmed or destroyed. Before an allocation is refused, this process's pool caches on that device are
//! trimmed (`cuMemPoolTrimTo(pool, 0)`), so a cache never makes the program fail: it only
//! loses reuse.

use std::collections::HashMap;
use std::ffi::c_void;

use gpuslice_cuda_ffi::*;

use crate::account::{self, Entry, Target};
use crate::forksafe::ForkSafe;
use crate::guard::guard;
use crate::real::cu;
use crate::state::{self, Slice};

/// What the shim knows of one pool.
#[derive(Debug, Clone, Copy, Default)]
struct PoolState {
    /// The CUDA device whose memory it holds (`None` when not a device pool).
    dev: Option<CUdevice>,
    /// Limits index and bytes of freed memory the pool keeps, charged to the slice.
    cache: Option<(usize, u64)>,
}

static POOLS: ForkSafe<HashMap<usize, PoolState>> = ForkSafe::new(HashMap::new);

/// The CUDA device of pool `pool`, if it was created or looked up through the shim.
pub fn device_of(pool: usize) -> Option<CUdevice> {
    POOLS.lock().get(&pool).and_then(|p| p.dev)
}

/// Remembers that pool `pool` holds memory of CUDA device `dev`.
fn learn_device(pool: CUmemoryPool, dev: CUdevice) {
    if !pool.is_null() {
        POOLS.lock().entry(pool as usize).or_default().dev = Some(dev);
    }
}

/// The current pool of CUDA device `dev` (where `cuMemAllocAsync` allocates), remembered.
pub fn current_pool_of(dev: CUdevice) -> Option<usize> {
    let f = cu::cuDeviceGetMemPool()?;
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: a valid out pointer and a device of this process.
    if unsafe { f(&mut pool, dev) } != CUDA_SUCCESS || pool.is_null() {
        return None;
    }
    learn_device(pool, dev);
    Some(pool as usize)
}

fn attribute(pool: usize, attr: CUmemPool_attribute) -> Option<u64> {
    let f = cu::cuMemPoolGetAttribute()?;
    let mut v: u64 = 0;
    // SAFETY: the byte-count attributes write a cuuint64_t into the out pointer.
    let r = unsafe { f(pool as CUmemoryPool, attr, (&mut v as *mut u64).cast()) };
    (r == CUDA_SUCCESS).then_some(v)
}

/// What pool `pool` still keeps of the `cached` bytes charged to it. `exact`: the driver's
/// figure (reserved minus used bytes), right after an allocation or a trim. Otherwise (after
/// a free, whose bytes count as used until the stream reaches it) at least what the release
/// threshold lets the pool keep. Without figures, the threshold; 0 for a pool that is gone.
fn kept(pool: usize, cached: u64, exact: bool) -> u64 {
    let threshold = attribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD);
    let figure = match (
        attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
        attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT),
    ) {
        (Some(reserved), Some(used)) => Some(reserved.saturating_sub(used)),
        _ => None,
    };
    let bound = threshold.unwrap_or(0).min(cached);
    match (figure, exact) {
        (Some(f), true) => f,
        (Some(f), false) => f.max(bound),
        (None, _) => bound,
    }
}

/// Gives back the part of pool `pool`'s charged cache it no longer keeps (see [`kept`]).
fn settle(slice: &Slice, pool: usize, exact: bool) {
    if let Some((idx, give)) = settle_with(pool, |cached| kept(pool, cached, exact)) {
        slice.usage.release(idx, give);
    }
}

/// Takes out of pool `pool`'s charged cache what `kept` (asked with the cache as it is now,
/// without the lock: it queries the driver) says the pool no longer holds; returns the
/// limits index and the bytes to give back. A free on another thread may add to the cache
/// while the driver is asked: those bytes are not in the cache `kept` judged, so at most the
/// cache as it was minus what it holds leaves (the other free settles its own bytes).
fn settle_with(pool: usize, kept: impl FnOnce(u64) -> u64) -> Option<(usize, u64)> {
    let (idx, cached) = POOLS.lock().get(&pool).and_then(|p| p.cache)?;
    if cached == 0 {
        return None;
    }
    let held = kept(cached);
    if held >= cached {
        return None;
    }
    let mut pools = POOLS.lock();
    let (_, c) = pools.get_mut(&pool)?.cache.as_mut()?;
    let give = (cached - held).min(*c);
    *c -= give;
    Some((idx, give))
}

/// A pool allocation's memory went back to its pool: it stays charged as the pool's cache
/// for as long as the driver keeps it reserved.
pub fn freed(slice: &Slice, e: Entry) {
    let kept = {
        let mut pools = POOLS.lock();
        let p = pools.entry(e.pool).or_default();
        match p.cache.get_or_insert((e.dev, 0)) {
            (idx, c) if *idx == e.dev => {
                *c = c.saturating_add(e.bytes);
                true
            }
            // A pool holds one device's memory; anything else is given back at once.
            _ => false,
        }
    };
    if kept {
        settle(slice, e.pool, false);
    } else {
        slice.usage.release(e.dev, e.bytes);
    }
}

/// Trims every pool of this process that keeps charged memory on limits device `idx`;
/// true when some charge was given back.
pub fn trim_caches(slice: &Slice, idx: usize) -> bool {
    let holding: Vec<usize> = POOLS
        .lock()
        .iter()
        .filter(|(_, p)| matches!(p.cache, Some((i, c)) if i == idx && c > 0))
        .map(|(k, _)| *k)
        .collect();
    let Some(trim) = cu::cuMemPoolTrimTo() else {
        return false;
    };
    let before = slice.usage.reserved_here(idx);
    for pool in holding {
        // SAFETY: a pool handle the driver gave this process; trimming frees only unused memory.
        unsafe { trim(pool as CUmemoryPool, 0) };
        settle(slice, pool, true);
    }
    slice.usage.reserved_here(idx) < before
}

/// Charges an allocation of `bytes` from pool `pool` (0: unknown), runs it and records it.
pub fn allocate_from(
    slice: &Slice,
    t: Target,
    pool: usize,
    bytes: u64,
    call: impl FnOnce() -> Result<u64, CUresult>,
) -> CUresult {
    if let Err(r) = account::reserve(slice, t, bytes) {
        return r;
    }
    match call() {
        Ok(ptr) => {
            account::record_stream_ordered(ptr, t, bytes, pool);
            if pool != 0 {
                // The driver may have reused cached memory for it.
                settle(slice, pool, true);
            }
            CUDA_SUCCESS
        }
        Err(r) => {
            slice.usage.release(t.idx, bytes);
            r
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolCreate(
    pool: *mut CUmemoryPool,
    props: *const CUmemPoolProps,
) -> CUresult {
    guard("cuMemPoolCreate", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuMemPoolCreate);
        // SAFETY: the caller's arguments.
        let r = unsafe { f(pool, props) };
        if r == CUDA_SUCCESS
            && !props.is_null()
            // SAFETY: on success the driver validated props (checked non-null).
            && unsafe { (*props).location.type_ } == CU_MEM_LOCATION_TYPE_DEVICE
        {
            // SAFETY: as above.
            let (p, dev) = unsafe { (*pool as usize, (*props).location.id) };
            POOLS.lock().insert(
                p,
                PoolState {
                    dev: Some(dev),
                    cache: None,
                },
            );
        }
        r
    })
}

/// Destroys pool `pool` through `call`; returns the driver's result and, when it destroyed
/// the pool, the limits index and bytes of the cache charged to it (the driver released
/// it). The pool's state leaves the table before the driver is asked, as every free does
/// (docs/shim.md, "Frees and reused handles"): once destroyed, another thread's
/// `cuMemPoolCreate` may get the same handle, and its state must stay. If the driver
/// refuses, the state is put back.
fn destroy_pool(pool: usize, call: impl FnOnce() -> CUresult) -> (CUresult, Option<(usize, u64)>) {
    let taken = POOLS.lock().remove(&pool);
    let r = call();
    if r == CUDA_SUCCESS {
        return (r, taken.and_then(|p| p.cache));
    }
    if let Some(p) = taken {
        POOLS.lock().entry(pool).or_insert(p);
    }
    (r, None)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult {
    guard("cuMemPoolDestroy", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuMemPoolDestroy);
        // SAFETY: the caller's argument.
        let (r, cache) = destroy_pool(pool as usize, || unsafe { f(pool) });
        if let (Some((idx, c)), Some(s)) = (cache, state::slice()) {
            s.usage.release(idx, c);
        }
        r
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: CUmemoryPool, keep: usize) -> CUresult {
    guard("cuMemPoolTrimTo", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuMemPoolTrimTo);
        // SAFETY: the caller's arguments.
        let r = unsafe { f(pool, keep) };
        if let Some(s) = state::slice() {
            settle(s, pool as usize, true);
        }
        r
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: CUmemoryPool,
    attr: CUmemPool_attribute,
    value: *mut c_void,
) -> CUresult {
    guard("cuMemPoolSetAttribute", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuMemPoolSetAttribute);
        // SAFETY: the caller's arguments.
        let r = unsafe { f(pool, attr, value) };
        if let Some(s) = state::slice() {
            settle(s, pool as usize, false);
        }
        r
    })
}

/// `cuDeviceGetDefaultMemPool` and `cuDeviceGetMemPool`: the pool handed out holds memory of
/// `dev`, which is where its allocations are charged.
macro_rules! device_pool {
    ($name:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult {
            guard(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                let f = real!($name);
                // SAFETY: the caller's arguments.
                let r = unsafe { f(pool, dev) };
                if r == CUDA_SUCCESS && !pool.is_null() {
                    // SAFETY: the driver wrote the pool on success (checked non-null).
                    learn_device(unsafe { *pool }, dev);
                }
                r
            })
        }
    };
}
device_pool!(cuDeviceGetDefaultMemPool);
device_pool!(cuDeviceGetMemPool);

/// `cuMemAllocFromPoolAsync`: charged to the pool's device. A pool the shim has not seen
/// made or handed out (imported from another process) is taken to hold memory of the
/// stream's device, as a pool allocation is normally made on a stream of the pool's device;
/// never the current context's, which need not be either. On a stream in capture, an
/// allocation node of the capture graph instead.
macro_rules! alloc_from_pool {
    ($name:ident, $per_thread:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            dptr: *mut CUdeviceptr,
            bytesize: usize,
            pool: CUmemoryPool,
            stream: CUstream,
        ) -> CUresult {
            guard(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                let f = real!($name);
                let (slice, devices) = tri!(state::ready());
                let (stream_dev, ctx, _) = tri!(state::stream_device(stream, $per_thread));
                let dev = device_of(pool as usize).unwrap_or(stream_dev);
                // SAFETY: the caller's arguments; dptr read only after success.
                let call = || unsafe { f(dptr, bytesize, pool, stream) };
                if let Some(graph) = crate::hooks::graph::capture_graph(stream, $per_thread) {
                    return crate::hooks::graph::captured(
                        graph,
                        Some(dev),
                        bytesize as u64,
                        || {
                            // SAFETY: the driver wrote dptr on success.
                            crate::hooks::memory::ok_then(call(), || unsafe { *dptr })
                        },
                    );
                }
                let mut t: Target = tri!(account::target_on(devices, dev));
                t.ctx = ctx as usize;
                allocate_from(slice, t, pool as usize, bytesize as u64, || {
                    // SAFETY: the driver wrote dptr on success.
                    crate::hooks::memory::ok_then(call(), || unsafe { *dptr })
                })
            })
        }
    };
}
alloc_from_pool!(cuMemAllocFromPoolAsync, false);
alloc_from_pool!(cuMemAllocFromPoolAsync_ptsz, true);

/// For the child after `fork`.
pub fn reset_in_child() {
    POOLS.reset_in_child();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache_of(pool: usize) -> Option<(usize, u64)> {
        POOLS.lock().get(&pool).and_then(|p| p.cache)
    }

    fn set_cache(pool: usize, bytes: u64) {
        POOLS.lock().insert(
            pool,
            PoolState {
                dev: Some(0),
                cache: Some((0, bytes)),
            },
        );
    }

    #[test]
    fn a_settle_gives_back_only_what_left_the_cache_it_judged() {
        let pool = 0x3300_0000;
        set_cache(pool, 100);
        // While the driver is asked (the pool keeps none of the 100), another thread's
        // free adds 50 to the cache: those stay charged for that free to settle.
        let give = settle_with(pool, |cached| {
            assert_eq!(cached, 100);
            if let Some((_, c)) = POOLS.lock().get_mut(&pool).and_then(|p| p.cache.as_mut()) {
                *c += 50;
            }
            0
        });
        assert_eq!(give, Some((0, 100)));
        assert_eq!(cache_of(pool), Some((0, 50)));
    }

    #[test]
    fn a_settle_gives_back_what_the_pool_no_longer_keeps() {
        let pool = 0x3400_0000;
        set_cache(pool, 100);
        assert_eq!(settle_with(pool, |_| 30), Some((0, 70)));
        assert_eq!(cache_of(pool), Some((0, 30)));
        assert_eq!(settle_with(pool, |_| 30), None, "it keeps all of it");
        assert_eq!(cache_of(pool), Some((0, 30)));
    }

    #[test]
    fn a_pool_the_driver_hands_out_again_during_a_destroy_keeps_its_state() {
        let pool = 0x3500_0000;
        set_cache(pool, 100);
        // Another thread's cuMemPoolCreate gets the handle as soon as the driver destroyed
        // the pool; a free into the new pool is cached before this destroy returns.
        let (r, gone) = destroy_pool(pool, || {
            set_cache(pool, 40);
            CUDA_SUCCESS
        });
        assert_eq!(r, CUDA_SUCCESS);
        assert_eq!(
            gone,
            Some((0, 100)),
            "the destroyed pool's cache is given back"
        );
        assert_eq!(
            cache_of(pool),
            Some((0, 40)),
            "the new pool's stays charged"
        );
    }

    #[test]
    fn a_refused_pool_destroy_keeps_the_cache_charged() {
        let pool = 0x3600_0000;
        set_cache(pool, 100);
        let (r, gone) = destroy_pool(pool, || CUDA_ERROR_INVALID_VALUE);
        assert_eq!((r, gone), (CUDA_ERROR_INVALID_VALUE, None));
        assert_eq!(cache_of(pool), Some((0, 100)));
    }
}
