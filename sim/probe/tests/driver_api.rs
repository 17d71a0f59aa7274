//! The simulated driver's API semantics, called in-process the way the shim calls it:
//! contexts own their memory (not VMM, stream-ordered or graph memory, which outlive them),
//! VMM memory lives until released and unmapped, stream-ordered frees need stream-ordered
//! memory, graph memory lives from instantiation to exec destroy and then stays in the
//! device's graph pool until trimmed, events and streams follow
//! the kernel timeline. Each test uses its own GPU of one shared node (the driver is per
//! process). They run one at a time ([`turn`]): the driver hands a freed address or handle
//! to the next allocation of any thread, as a real one does, and tests check that what they
//! freed is refused afterwards.

use crate::common;

use std::ffi::{c_void, CString};
use std::sync::{Mutex, MutexGuard, OnceLock};

use gpuslice_cuda_ffi::*;

const GIB: usize = 1 << 30;
const CAPACITY: usize = 8 * GIB;

struct Driver {
    handle: *mut c_void,
    _node: common::SimFixture,
}

// SAFETY: the handle is only used for dlsym, which is thread-safe.
unsafe impl Sync for Driver {}
// SAFETY: as above.
unsafe impl Send for Driver {}

fn driver() -> &'static Driver {
    static D: OnceLock<Driver> = OnceLock::new();
    D.get_or_init(|| {
        let node = common::node(6, CAPACITY as u64);
        // Set before the library's first cuInit, which is below; no other thread reads the
        // environment concurrently in this binary before then.
        for (k, v) in node.env() {
            std::env::set_var(k, v);
        }
        let path = CString::new(node.lib_dir().join("libcuda.so.1").to_str().unwrap()).unwrap();
        // SAFETY: dlopen by path, checked for null.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!handle.is_null());
        let d = Driver {
            handle,
            _node: node,
        };
        // SAFETY: cuInit's signature.
        assert_eq!(unsafe { d.f::<PFN_cuInit>("cuInit")(0) }, CUDA_SUCCESS);
        d
    })
}

/// The driver, for one test at a time: another test's allocation could otherwise get the
/// address or handle a test just freed and checks is refused.
fn turn() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    driver();
    TURN.lock().unwrap_or_else(|p| p.into_inner())
}

impl Driver {
    /// # Safety
    /// `F` must be the signature of export `name`.
    unsafe fn f<F: Copy>(&self, name: &str) -> F {
        let c = CString::new(name).unwrap();
        // SAFETY: live handle, C string.
        let p = unsafe { libc::dlsym(self.handle, c.as_ptr()) };
        assert!(!p.is_null(), "{name} not exported");
        // SAFETY: forwarded to the caller.
        unsafe { std::mem::transmute_copy(&p) }
    }
}

/// Calls export `$name` with signature `$ty`.
macro_rules! cu {
    ($name:ident : $ty:ty $(, $arg:expr)* $(,)?) => {{
        // SAFETY: the export's signature is `$ty`; arguments follow the driver API.
        unsafe { driver().f::<$ty>(stringify!($name))($($arg),*) }
    }};
}

/// Makes device `dev`'s primary context current on this thread.
fn use_device(dev: i32) {
    let mut ctx = std::ptr::null_mut();
    assert_eq!(
        cu!(cuDevicePrimaryCtxRetain: PFN_cuDevicePrimaryCtxRetain, &mut ctx, dev),
        CUDA_SUCCESS
    );
    assert_eq!(cu!(cuCtxSetCurrent: PFN_cuCtxSetCurrent, ctx), CUDA_SUCCESS);
}

fn free_mem() -> usize {
    let (mut free, mut total) = (0, 0);
    assert_eq!(
        cu!(cuMemGetInfo_v2: PFN_cuMemGetInfo_v2, &mut free, &mut total),
        CUDA_SUCCESS
    );
    assert_eq!(total, CAPACITY);
    free
}

#[test]
fn destroying_a_context_frees_its_memory() {
    let _turn = turn();
    let mut ctx = std::ptr::null_mut();
    assert_eq!(
        cu!(cuCtxCreate_v2: PFN_cuCtxCreate_v2, &mut ctx, 0, 0),
        CUDA_SUCCESS
    );
    let mut p = 0;
    assert_eq!(
        cu!(cuMemAlloc_v2: PFN_cuMemAlloc_v2, &mut p, 3 * GIB),
        CUDA_SUCCESS
    );
    assert_eq!(free_mem(), CAPACITY - 3 * GIB);
    assert_eq!(cu!(cuCtxDestroy_v2: PFN_cuCtxDestroy_v2, ctx), CUDA_SUCCESS);
    let mut current = 1usize as CUcontext;
    assert_eq!(
        cu!(cuCtxGetCurrent: PFN_cuCtxGetCurrent, &mut current),
        CUDA_SUCCESS
    );
    assert!(
        current.is_null(),
        "the destroyed context is no longer current"
    );
    assert_eq!(
        cu!(cuMemAlloc_v2: PFN_cuMemAlloc_v2, &mut p, 1),
        CUDA_ERROR_INVALID_CONTEXT
    );
    use_device(0);
    assert_eq!(free_mem(), CAPACITY);

    // The primary context's memory goes when its last reference does.
    assert_eq!(
        cu!(cuMemAlloc_v2: PFN_cuMemAlloc_v2, &mut p, GIB),
        CUDA_SUCCESS
    );
    assert_eq!(
        cu!(cuDevicePrimaryCtxRelease_v2: PFN_cuDevicePrimaryCtxRelease_v2, 0),
        CUDA_SUCCESS
    );
    use_device(0);
    assert_eq!(free_mem(), CAPACITY);
    assert_eq!(
        cu!(cuMemFree_v2: PFN_cuMemFree_v2, p),
        CUDA_ERROR_INVALID_VALUE,
        "freed with its context"
    );
}

#[test]
fn a_destroyed_context_stays_invalid_where_it_is_current() {
    let _turn = turn();
    let mut ctx = std::ptr::null_mut();
    assert_eq!(
        cu!(cuCtxCreate_v2: PFN_cuCtxCreate_v2, &mut ctx, 0, 1),
        CUDA_SUCCESS
    );
    // Another thread destroys it and makes a context, which gets its handle back.
    let old = ctx as usize;
    let new = std::thread::spawn(move || {
        assert_eq!(
            cu!(cuCtxDestroy_v2: PFN_cuCtxDestroy_v2, old as CUcontext),
            CUDA_SUCCESS
        );
        let mut c = std::ptr::null_mut();
        assert_eq!(
            cu!(cuCtxCreate_v2: PFN_cuCtxCreate_v2, &mut c, 0, 1),
            CUDA_SUCCESS
        );
        c as usize
    })
    .join()
    .unwrap();
    assert_eq!(
        new, old,
        "the destroyed context's handle is handed out again"
    );
    // This thread's stack still holds the destroyed context, not the new one.
    let mut p = 0;
    assert_eq!(
        cu!(cuMemAlloc_v2: PFN_cuMemAlloc_v2, &mut p, 1),
        CUDA_ERROR_INVALID_CONTEXT
    );
    assert_eq!(
        cu!(cuCtxSetCurrent: PFN_cuCtxSetCurrent, std::ptr::null_mut()),
        CUDA_SUCCESS
    );
    assert_eq!(
        cu!(cuCtxDestroy_v2: PFN_cuCtxDestroy_v2, new as CUcontext),
        CUDA_SUCCESS
    );
}

#[test]
fn memory_no_context_owns_outlives_the_context() {
    // cuCtxDestroy "will not destroy memory allocations by cuMemCreate(), cuMemAllocAsync()
    // and cuMemAllocFromPoolAsync()" (CUDA driver API); executable graphs and their graph
    // memory belong to no context either.
    let _turn = turn();
    let mut ctx = std::ptr::null_mut();
    assert_eq!(
        cu!(cuCtxCreate_v2: PFN_cuCtxCreate_v2, &mut ctx, 0, 5),
        CUDA_SUCCESS
    );
    let mut s = std::ptr::null_mut();
    assert_eq!(
        cu!(cuStreamCreate: PFN_cuStreamCreate, &mut s, 0),
        CUDA_SUCCESS
    );
    let (mut linear, mut asynch, mut pooled) = (0, 0, 0);
    assert_eq!(
        cu!(cuMemAlloc_v2: PFN_cuMemAlloc_v2, &mut linear, GIB),
        CUDA_SUCCESS
    );
    assert_eq!(
        cu!(cuMemAllocAsync: PFN_cuMemAllocAsync, &mut asynch, GIB, s),
        CUDA_SUCCESS
    );
    let props = CUmemPoolProps::pinned_on(5);
    let mut pool = std::ptr::null_mut();
    assert_eq!(
        cu!(cuMemPoolCreate: PFN_cuMemPoolCreate, &mut pool, &props),
        CUDA_SUCCESS
    );
    assert_eq!(
        cu!(cuMemAllocFromPoolAsync: PFN_cuMemAllocFromPoolAsync, &mut pooled, GIB, pool, s),
        CUDA_SUCCESS
    );
    let prop = CUmemAllocationProp::pinned_on(5);
    let mut h = 0;
    assert_eq!(
        cu!(cuMemCreate: PFN_cuMemCreate, &mut h, GIB, &prop, 0),
        CUDA_SUCCESS
    );
    let mut g = std::ptr::null_mut();
    assert_eq!(
        cu!(cuGraphCreate: PFN_cuGraphCreate, &mut g, 0),
        CUDA_SUCCESS
    );
    let access = CUmemAccessDesc {
        location: prop.location,
        flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    let mut params = CUDA_MEM_ALLOC_NODE_PARAMS {
        poolProps: CUmemPoolProps::pinned_on(5),
        accessDescs: &access,
        accessDescCount: 1,
        bytesize: GIB,
        dptr: 0,
    };
    let mut node = std::ptr::null_mut();
    let r = cu!(cuGraphAddMemAllocNode: PFN_cuGraphAddMemAllocNode, &mut node, g, std::ptr::null(), 0, &mut params);
    assert_eq!(r, CUDA_SUCCESS);
    let mut exec = std::ptr::null_mut();
    assert_eq!(
        cu!(cuGraphInstantiateWithFlags: PFN_cuGraphInstantiateWithFlags, &mut exec, g, 0),
        CUDA_SUCCESS
    );
    assert_eq!(free_mem(), CAPACITY - 5 * GIB);
    assert_eq!(cu!(cuCtxDestroy_v2: PFN_cuCtxDestroy_v2, ctx), CUDA_SUCCESS);
    use_device(5);
    assert_eq!(
        free_mem(),
        CAPACITY - 4 * GIB,
        "only the linear allocation died with the context"
    );
    assert_eq!(
        cu!(cuMemFree_v2: PFN_cuMemFree_v2, linear),
        CUDA_ERROR_INVALID_VALUE,
        "freed with its context"
    );
    for p in [asynch, pooled] {
        assert_eq!(cu!(cuMemFree_v2: PFN_cuMemFree_v2, p), CUDA_SUCCESS);
    }
    assert_eq!(cu!(cuMemRelease: PFN_cuMemRelease, h), CUDA_SUCCESS);
    assert_eq!(
        cu!(cuGraphExecDestroy: PFN_cuGraphExecDestroy, exec),
        CUDA_SUCCESS
    );
    assert_eq!(cu!(cuGraphDestroy: PFN_cuGraphDestroy, g), CUDA_SUCCESS);
    assert_eq!(
        cu!(cuMemPoolDestroy: PFN_cuMemPoolDestroy, pool),
        CUDA_SUCCESS
    );
    // The executable graph's memory stays in the device's graph pool until trimmed.
    assert_eq!(
        cu!(cuDeviceGraphMemTrim: PFN_cuDeviceGraphMemTrim, 5),
        CUDA_SUCCESS
    );
    assert_eq!(free_mem(), CAPACITY);
}

#[test]
fn vmm_memory_lives_until_released_and_unmapped() {
    let _turn = turn();
    use_device(1);
    let prop = CUmemAllocationProp::pinned_on(1);
    let mut gran = 0;
    let r = cu!(cuMemGetAllocationGranularity: PFN_cuMemGetAllocationGranularity, &mut gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    assert_eq!((r, gran), (CUDA_SUCCESS, 2 << 20));
    let mut h = 0;
    assert_eq!(
        cu!(cuMemCreate: PFN_cuMemCreate, &mut h, gran + 1, &prop, 0),
        CUDA_ERROR_INVALID_VALUE
    );
    assert_eq!(
        cu!(cuMemCreate: PFN_cuMemCreate, &mut h, 2 * GIB, &prop, 0),
        CUDA_SUCCESS
    );
    assert_eq!(free_mem(), CAPACITY - 2 * GIB);
    let mut va = 0;
    assert_eq!(
        cu!(cuMemAddressReserve: PFN_cuMemAddressReserve, &mut va, 2 * GIB, 0, 0, 0),
        CUDA_SUCCESS
    );
    assert_eq!(
        cu!(cuMemMap: PFN_cuMemMap, va, 2 * GIB, 0, h, 0),
        CUDA_SUCCESS
    );
    assert_eq!(
        cu!(cuMemMap: PFN_cuMemMap, va, 2 * GIB, 0, h, 0),
        CUDA_ERROR_ALREADY_MAPPED
    );
    let access = CUmemAccessDesc {
        location: prop.location,
        flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    assert_eq!(
        cu!(cuMemSetAccess: PFN_cuMemSetAccess, va, 2 * GIB, &access, 1),
        CUDA_SUCCESS
    );
    assert_eq!(cu!(cuMemRelease: PFN_cuMemRelease, h), CUDA_SUCCESS);
    assert_eq!(free_mem(), CAPACITY - 2 * GIB, "still mapped");
    assert_eq!(cu!(cuMemUnmap: PFN_cuMemUnmap, va, 2 * GIB), CUDA_SUCCESS);
    assert_eq!(free_mem(), CAPACITY);
    assert_eq!(
        cu!(cuMemAddressFree: PFN_cuMemAddressFree, va, 2 * GIB),
        CUDA_SUCCESS
    );
}

#[test]
fn stream_ordered_memory_and_pools() {
    let _turn = turn();
    use_device(2);
    let mut s = std::ptr::null_mut();
    assert_eq!(
        cu!(cuStreamCreate: PFN_cuStreamCreate, &mut s, 0),
        CUDA_SUCCESS
    );
    let (mut a, mut b, mut c) = (0, 0, 0);
    assert_eq!(
        cu!(cuMemAllocAsync: PFN_cuMemAllocAsync, &mut a, GIB, s),
        CUDA_SUCCESS
    );
    assert_eq!(
        cu!(cuMemAllocAsync_ptsz: PFN_cuMemAllocAsync_ptsz, &mut b, GIB, std::ptr::null_mut()),
        CUDA_SUCCESS
    );
    let props = CUmemPoolProps::pinned_on(2);
    let mut pool = std::ptr::null_mut();
    assert_eq!(
        cu!(cuMemPoolCreate: PFN_cuMemPoolCreate, &mut pool, &props),
        CUDA_SUCCESS
    );
    assert_eq!(
        cu!(cuMemAllocFromPoolAsync: PFN_cuMemAllocFromPoolAsync, &mut c, 2 * GIB, pool, s),
        CUDA_SUCCESS
    );
    assert_eq!(free_mem(), CAPACITY - 4 * GIB);
    let mut plain = 0;
    assert_eq!(
        cu!(cuMemAlloc_v2: PFN_cuMemAlloc_v2, &mut plain, GIB),
        CUDA_SUCCESS
    );
    assert_eq!(
        cu!(cuMemFreeAsync: PFN_cuMemFreeAsync, plain, s),
        CUDA_ERROR_INVALID_VALUE,
        "not stream-ordered memory"
    );
    for p in [a, b, c] {
        assert_eq!(cu!(cuMemFreeAsync: PFN_cuMemFreeAsync, p, s), CUDA_SUCCESS);
    }
    assert_eq!(
        cu!(cuMemPoolDestroy: PFN_cuMemPoolDestroy, pool),
        CUDA_SUCCESS
    );
    assert_eq!(cu!(cuMemFree_v2: PFN_cuMemFree_v2, plain), CUDA_SUCCESS);
    assert_eq!(free_mem(), CAPACITY);
}

#[test]
fn arrays_are_charged_by_extent() {
    let _turn = turn();
    use_device(3);
    let mut a = std::ptr::null_mut();
    let d3 = CUDA_ARRAY3D_DESCRIPTOR {
        Width: 1024,
        Height: 1024,
        Depth: 64,
        Format: CU_AD_FORMAT_FLOAT,
        NumChannels: 4,
        Flags: 0,
    };
    assert_eq!(
        cu!(cuArray3DCreate_v2: PFN_cuArray3DCreate_v2, &mut a, &d3),
        CUDA_SUCCESS
    );
    assert_eq!(free_mem(), CAPACITY - 1024 * 1024 * 64 * 16);
    let mut m = std::ptr::null_mut();
    let d2 = CUDA_ARRAY3D_DESCRIPTOR {
        Width: 1024,
        Height: 1024,
        Depth: 0,
        Format: CU_AD_FORMAT_UNSIGNED_INT8,
        NumChannels: 1,
        Flags: 0,
    };
    assert_eq!(
        cu!(cuMipmappedArrayCreate: PFN_cuMipmappedArrayCreate, &mut m, &d2, 2),
        CUDA_SUCCESS
    );
    assert_eq!(
        free_mem(),
        CAPACITY - 1024 * 1024 * 64 * 16 - (1024 * 1024 + 512 * 512)
    );
    assert_eq!(cu!(cuArrayDestroy: PFN_cuArrayDestroy, a), CUDA_SUCCESS);
    assert_eq!(
        cu!(cuMipmappedArrayDestroy: PFN_cuMipmappedArrayDestroy, m),
        CUDA_SUCCESS
    );
    assert_eq!(
        cu!(cuArrayDestroy: PFN_cuArrayDestroy, a),
        CUDA_ERROR_INVALID_HANDLE
    );
    assert_eq!(free_mem(), CAPACITY);
}

/// A new graph with one memory allocation node of `bytesize` on device `dev`: the graph,
/// the node and the address the allocation will have.
fn graph_allocating(dev: i32, bytesize: usize) -> (CUgraph, CUgraphNode, CUdeviceptr) {
    let mut g = std::ptr::null_mut();
    assert_eq!(
        cu!(cuGraphCreate: PFN_cuGraphCreate, &mut g, 0),
        CUDA_SUCCESS
    );
    let access = CUmemAccessDesc {
        location: CUmemLocation {
            type_: CU_MEM_LOCATION_TYPE_DEVICE,
            id: dev,
        },
        flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    let mut params = CUDA_MEM_ALLOC_NODE_PARAMS {
        poolProps: CUmemPoolProps::pinned_on(dev),
        accessDescs: &access,
        accessDescCount: 1,
        bytesize,
        dptr: 0,
    };
    let mut node = std::ptr::null_mut();
    let r = cu!(cuGraphAddMemAllocNode: PFN_cuGraphAddMemAllocNode, &mut node, g, std::ptr::null(), 0, &mut params);
    assert_eq!(r, CUDA_SUCCESS);
    (g, node, params.dptr)
}

#[test]
fn graph_memory_lives_from_instantiation_to_exec_destroy() {
    let _turn = turn();
    use_device(4);
    let (g, node, dptr) = graph_allocating(4, 3 * GIB);
    assert_ne!(dptr, 0, "the address is known when the node is added");
    let mut free_node = std::ptr::null_mut();
    assert_eq!(
        cu!(cuGraphAddMemFreeNode: PFN_cuGraphAddMemFreeNode, &mut free_node, g, &node, 1, 12345),
        CUDA_ERROR_INVALID_VALUE
    );
    assert_eq!(
        free_mem(),
        CAPACITY,
        "nothing is charged before instantiation"
    );
    let (mut e1, mut e2, mut e3) = (
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    );
    assert_eq!(
        cu!(cuGraphInstantiateWithFlags: PFN_cuGraphInstantiateWithFlags, &mut e1, g, 0),
        CUDA_SUCCESS
    );
    assert_eq!(free_mem(), CAPACITY - 3 * GIB);
    let r = cu!(cuGraphInstantiate: PFN_cuGraphInstantiate, &mut e2, g, std::ptr::null_mut(), std::ptr::null_mut(), 0);
    assert_eq!(r, CUDA_SUCCESS);
    let r = cu!(cuGraphInstantiate_v2: PFN_cuGraphInstantiate_v2, &mut e3, g, std::ptr::null_mut(), std::ptr::null_mut(), 0);
    assert_eq!(
        r, CUDA_ERROR_OUT_OF_MEMORY,
        "a third 3 GiB instantiation does not fit in 8 GiB"
    );
    assert_eq!(
        free_mem(),
        CAPACITY - 6 * GIB,
        "a refused instantiation charges nothing"
    );
    assert_eq!(
        cu!(cuGraphLaunch: PFN_cuGraphLaunch, e1, std::ptr::null_mut()),
        CUDA_SUCCESS
    );
    assert_eq!(
        cu!(cuGraphExecDestroy: PFN_cuGraphExecDestroy, e1),
        CUDA_SUCCESS
    );
    assert_eq!(
        cu!(cuGraphExecDestroy: PFN_cuGraphExecDestroy, e2),
        CUDA_SUCCESS
    );
    assert_eq!(cu!(cuGraphDestroy: PFN_cuGraphDestroy, g), CUDA_SUCCESS);
    assert_eq!(
        free_mem(),
        CAPACITY - 6 * GIB,
        "the allocation e1's launch made, with no free node, outlives the executable graph; \
         e2's memory stays in the device's graph pool"
    );
    assert_eq!(graph_mem(4), (3 * GIB as u64, 6 * GIB as u64));
    assert_eq!(cu!(cuMemFree_v2: PFN_cuMemFree_v2, dptr), CUDA_SUCCESS);
    assert_eq!(
        free_mem(),
        CAPACITY - 6 * GIB,
        "a freed graph allocation goes back to the graph pool"
    );
    assert_eq!(graph_mem(4), (0, 6 * GIB as u64));
    assert_eq!(
        cu!(cuDeviceGraphMemTrim: PFN_cuDeviceGraphMemTrim, 4),
        CUDA_SUCCESS
    );
    assert_eq!(free_mem(), CAPACITY, "the trim released the cache");
    assert_eq!(graph_mem(4), (0, 0));
}

/// `(USED_MEM_CURRENT, RESERVED_MEM_CURRENT)` of device `dev`'s graph memory pool.
fn graph_mem(dev: i32) -> (u64, u64) {
    let get = |attr| {
        let mut v = 0u64;
        let r = cu!(cuDeviceGetGraphMemAttribute: PFN_cuDeviceGetGraphMemAttribute, dev, attr,
            (&mut v as *mut u64).cast::<c_void>());
        assert_eq!(r, CUDA_SUCCESS);
        v
    };
    (
        get(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT),
        get(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT),
    )
}

#[test]
fn the_graph_pool_reuses_its_cache_before_growing() {
    let _turn = turn();
    use_device(5);
    let (g, node, dptr) = graph_allocating(5, 5 * GIB);
    let mut free_node = std::ptr::null_mut();
    let r =
        cu!(cuGraphAddMemFreeNode: PFN_cuGraphAddMemFreeNode, &mut free_node, g, &node, 1, dptr);
    assert_eq!(r, CUDA_SUCCESS);
    let instantiate = || {
        let mut e = std::ptr::null_mut();
        let r = cu!(cuGraphInstantiateWithFlags: PFN_cuGraphInstantiateWithFlags, &mut e, g, 0);
        (r, e)
    };
    let (r, e1) = instantiate();
    assert_eq!(r, CUDA_SUCCESS);
    assert_eq!(
        cu!(cuGraphLaunch: PFN_cuGraphLaunch, e1, std::ptr::null_mut()),
        CUDA_SUCCESS
    );
    assert_eq!(
        cu!(cuGraphExecDestroy: PFN_cuGraphExecDestroy, e1),
        CUDA_SUCCESS
    );
    assert_eq!(free_mem(), CAPACITY - 5 * GIB, "destroyed, still cached");
    let mut p: CUdeviceptr = 0;
    assert_eq!(
        cu!(cuMemAlloc_v2: PFN_cuMemAlloc_v2, &mut p, 5 * GIB),
        CUDA_ERROR_OUT_OF_MEMORY,
        "the graph pool's cache holds the device's memory"
    );
    let (r, e2) = instantiate();
    assert_eq!(r, CUDA_SUCCESS, "a second graph reuses the cache");
    assert_eq!(free_mem(), CAPACITY - 5 * GIB, "without growing the pool");
    assert_eq!(graph_mem(5), (5 * GIB as u64, 5 * GIB as u64));
    assert_eq!(
        cu!(cuDeviceGraphMemTrim: PFN_cuDeviceGraphMemTrim, 5),
        CUDA_SUCCESS
    );
    assert_eq!(
        free_mem(),
        CAPACITY - 5 * GIB,
        "a trim keeps what an executable graph holds"
    );
    assert_eq!(
        cu!(cuGraphExecDestroy: PFN_cuGraphExecDestroy, e2),
        CUDA_SUCCESS
    );
    let mut zero = 0u64;
    let r = cu!(cuDeviceSetGraphMemAttribute: PFN_cuDeviceSetGraphMemAttribute, 5,
        CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, (&mut zero as *mut u64).cast::<c_void>());
    assert_eq!(r, CUDA_SUCCESS);
    let mut high = 1u64;
    let r = cu!(cuDeviceGetGraphMemAttribute: PFN_cuDeviceGetGraphMemAttribute, 5,
        CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, (&mut high as *mut u64).cast::<c_void>());
    assert_eq!((r, high), (CUDA_SUCCESS, 0), "the mark was reset");
    assert_eq!(
        cu!(cuDeviceGraphMemTrim: PFN_cuDeviceGraphMemTrim, 5),
        CUDA_SUCCESS
    );
    assert_eq!(free_mem(), CAPACITY);
    assert_eq!(cu!(cuGraphDestroy: PFN_cuGraphDestroy, g), CUDA_SUCCESS);
}

#[test]
fn events_and_streams_follow_the_timeline() {
    let _turn = turn();
    use_device(5);
    let mut module = std::ptr::null_mut();
    assert_eq!(
        cu!(cuModuleLoadData: PFN_cuModuleLoadData, &mut module, c"any image".as_ptr().cast()),
        CUDA_SUCCESS
    );
    let mut f = std::ptr::null_mut();
    assert_eq!(
        cu!(cuModuleGetFunction: PFN_cuModuleGetFunction, &mut f, module, c"other".as_ptr()),
        CUDA_ERROR_NOT_FOUND
    );
    assert_eq!(
        cu!(cuModuleGetFunction: PFN_cuModuleGetFunction, &mut f, module, c"gpuslice_spin".as_ptr()),
        CUDA_SUCCESS
    );
    let mut clock = 0;
    assert_eq!(
        cu!(cuDeviceGetAttribute: PFN_cuDeviceGetAttribute, &mut clock, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, 5),
        CUDA_SUCCESS
    );
    let mut s = std::ptr::null_mut();
    assert_eq!(
        cu!(cuStreamCreate: PFN_cuStreamCreate, &mut s, CU_STREAM_NON_BLOCKING),
        CUDA_SUCCESS
    );
    let (mut e0, mut e1) = (std::ptr::null_mut(), std::ptr::null_mut());
    assert_eq!(
        cu!(cuEventCreate: PFN_cuEventCreate, &mut e0, 0),
        CUDA_SUCCESS
    );
    assert_eq!(
        cu!(cuEventCreate: PFN_cuEventCreate, &mut e1, 0),
        CUDA_SUCCESS
    );
    let mut ms = 0f32;
    assert_eq!(
        cu!(cuEventElapsedTime: PFN_cuEventElapsedTime, &mut ms, e0, e1),
        CUDA_ERROR_INVALID_HANDLE,
        "not recorded"
    );

    // A 100 ms kernel keeps the stream busy, so the event before the 200 ms kernel is
    // stamped at the first kernel's end and the second starts exactly there, however slowly
    // this thread runs.
    let mut first: u64 = 100 * clock as u64;
    let mut first_params = [(&mut first as *mut u64).cast::<c_void>()];
    let r = cu!(cuLaunchKernel: PFN_cuLaunchKernel, f, 1, 1, 1, 1, 1, 1, 0, s, first_params.as_mut_ptr(), std::ptr::null_mut());
    assert_eq!(r, CUDA_SUCCESS);
    // 200 ms of cycles at the device's clock.
    let mut cycles: u64 = 200 * clock as u64;
    let mut params = [(&mut cycles as *mut u64).cast::<c_void>()];
    assert_eq!(cu!(cuEventRecord: PFN_cuEventRecord, e0, s), CUDA_SUCCESS);
    let r = cu!(cuLaunchKernel: PFN_cuLaunchKernel, f, 1, 1, 1, 1, 1, 1, 0, s, params.as_mut_ptr(), std::ptr::null_mut());
    assert_eq!(r, CUDA_SUCCESS);
    assert_eq!(
        cu!(cuEventRecord_ptsz: PFN_cuEventRecord_ptsz, e1, s),
        CUDA_SUCCESS
    );
    assert_eq!(
        cu!(cuStreamQuery: PFN_cuStreamQuery, s),
        CUDA_ERROR_NOT_READY
    );
    assert_eq!(
        cu!(cuEventQuery: PFN_cuEventQuery, e1),
        CUDA_ERROR_NOT_READY
    );
    assert_eq!(
        cu!(cuEventElapsedTime: PFN_cuEventElapsedTime, &mut ms, e0, e1),
        CUDA_ERROR_NOT_READY
    );
    assert_eq!(
        cu!(cuEventSynchronize: PFN_cuEventSynchronize, e1),
        CUDA_SUCCESS
    );
    assert_eq!(
        cu!(cuStreamQuery_ptsz: PFN_cuStreamQuery_ptsz, s),
        CUDA_SUCCESS
    );
    assert_eq!(
        cu!(cuEventElapsedTime_v2: PFN_cuEventElapsedTime_v2, &mut ms, e0, e1),
        CUDA_SUCCESS
    );
    assert!(
        (199.99..200.01).contains(&ms),
        "elapsed {ms} ms for a 200 ms kernel"
    );

    // Bad launches are refused before touching the timeline.
    let r = cu!(cuLaunchKernel_ptsz: PFN_cuLaunchKernel_ptsz, f, 1, 1, 1, 2048, 1, 1, 0, s, params.as_mut_ptr(), std::ptr::null_mut());
    assert_eq!(r, CUDA_ERROR_INVALID_VALUE);
    let r = cu!(cuLaunchKernel: PFN_cuLaunchKernel, f, 1, 1, 1, 1, 1, 1, 0, s, std::ptr::null_mut(), std::ptr::null_mut());
    assert_eq!(
        r, CUDA_ERROR_INVALID_VALUE,
        "gpuslice_spin needs its argument"
    );
    // Arguments through the extra buffer work too.
    let mut buf = 0u64;
    let mut size = 8usize;
    let mut extra = [
        CU_LAUNCH_PARAM_BUFFER_POINTER,
        (&mut buf as *mut u64).cast(),
        CU_LAUNCH_PARAM_BUFFER_SIZE,
        (&mut size as *mut usize).cast(),
        CU_LAUNCH_PARAM_END,
    ];
    let r = cu!(cuLaunchKernel: PFN_cuLaunchKernel, f, 1, 1, 1, 1, 1, 1, 0, s, std::ptr::null_mut(), extra.as_mut_ptr());
    assert_eq!(r, CUDA_SUCCESS);
    assert_eq!(cu!(cuCtxSynchronize: PFN_cuCtxSynchronize), CUDA_SUCCESS);
    for e in [e0, e1] {
        assert_eq!(
            cu!(cuEventDestroy_v2: PFN_cuEventDestroy_v2, e),
            CUDA_SUCCESS
        );
    }
    assert_eq!(
        cu!(cuStreamDestroy_v2: PFN_cuStreamDestroy_v2, s),
        CUDA_SUCCESS
    );
    assert_eq!(
        cu!(cuModuleUnload: PFN_cuModuleUnload, module),
        CUDA_SUCCESS
    );
}

#[test]
fn error_strings_and_versions() {
    let _turn = turn();
    let mut s: *const std::ffi::c_char = std::ptr::null();
    assert_eq!(
        cu!(cuGetErrorName: PFN_cuGetErrorName, CUDA_ERROR_OUT_OF_MEMORY, &mut s),
        CUDA_SUCCESS
    );
    // SAFETY: the driver returns a static NUL-terminated string.
    let name = unsafe { std::ffi::CStr::from_ptr(s) };
    assert_eq!(name, c"CUDA_ERROR_OUT_OF_MEMORY");
    assert_eq!(
        cu!(cuGetErrorString: PFN_cuGetErrorString, CUresult(4242), &mut s),
        CUDA_ERROR_INVALID_VALUE
    );
    assert!(s.is_null());
    let mut v = 0;
    assert_eq!(
        cu!(cuDriverGetVersion: PFN_cuDriverGetVersion, &mut v),
        CUDA_SUCCESS
    );
    assert_eq!(v, 12040);
    let mut old: u32 = 0;
    assert_eq!(
        cu!(cuDeviceTotalMem: PFN_cuDeviceTotalMem, &mut old, 0),
        CUDA_SUCCESS
    );
    assert_eq!(old, u32::MAX, "the 32-bit query saturates");
}
