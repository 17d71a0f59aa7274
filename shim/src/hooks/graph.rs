//! Graph memory: adding a memory-allocation node (`cuGraphAddMemAllocNode`, `cuGraphAddNode`
//! with allocation parameters, or `cuMemAllocAsync` on a stream in capture) only notes the
//! bytes and address a graph will allocate, a free node (`cuGraphAddMemFreeNode`,
//! `cuGraphAddNode`, a captured `cuMemFreeAsync`) the address it frees; child-graph nodes and
//! clones take over what their source graph notes. The bytes are charged when the graph is
//! instantiated (refused there past the limit), once per executable graph. Graph memory comes
//! from the device's graph memory pool, which keeps it when the executable graph is destroyed
//! (CUDA Programming Guide, graph memory nodes, "physical memory footprint"): the bytes stay
//! charged as the device's graph cache, which later instantiations use before charging more,
//! until `cuDeviceGraphMemTrim` (or the trim before a refusal, [`trim_cache`]) gives back what
//! the driver no longer holds. An allocation a launch made that no free node of the graph
//! freed and nothing freed since outlives the executable graph: its bytes stay charged at its
//! address until `cuMemFree`/`cuMemFreeAsync` of it, which returns them to the graph cache.

use std::collections::HashMap;
use std::ffi::{c_char, c_ulonglong, c_void};

use gpuslice_cuda_ffi::*;
use gpuslice_slice::usage::MAX_DEVICES;

use crate::account::{self, Entry, Kind, Target};
use crate::forksafe::ForkSafe;
use crate::guard::guard;
use crate::real::cu;
use crate::state::{self, Devices, Slice};

/// What a graph allocates and frees.
#[derive(Debug, Clone, Default)]
struct GraphMem {
    /// Allocation nodes: CUDA device, bytes, address.
    allocs: Vec<(CUdevice, u64, CUdeviceptr)>,
    /// Addresses its free nodes free.
    frees: Vec<CUdeviceptr>,
}

static GRAPHS: ForkSafe<HashMap<usize, GraphMem>> = ForkSafe::new(HashMap::new);

/// An allocation of an executable graph that no free node of its graph frees.
#[derive(Debug, Clone, Copy)]
struct Escape {
    /// Limits index of its device.
    idx: usize,
    bytes: u64,
    dptr: CUdeviceptr,
    /// A launch allocated it and nothing freed it since.
    live: bool,
}

/// Escaping allocations per executable graph.
static EXECS: ForkSafe<HashMap<usize, Vec<Escape>>> = ForkSafe::new(HashMap::new);

/// Bytes of graph memory the driver's graph pool of each device (by limits index) keeps
/// cached after the executable graphs or escaped allocations that held them are gone, charged
/// to the slice.
static CACHE: ForkSafe<HashMap<usize, u64>> = ForkSafe::new(HashMap::new);

/// The `pool` of an allocation entry that is graph memory (an escaped allocation): its free
/// returns the bytes to the graph cache ([`freed`]). No pool handle has this value.
pub const GRAPH_POOL: usize = usize::MAX;

/// Adds `bytes`, still charged, to device `idx`'s graph cache.
fn cache(idx: usize, bytes: u64) {
    if bytes > 0 {
        let mut c = CACHE.lock();
        let v = c.entry(idx).or_default();
        *v = v.saturating_add(bytes);
    }
}

/// Takes up to `want` bytes out of device `idx`'s graph cache, for an instantiation (the
/// driver backs its graph memory from the cache first); returns how many.
fn from_cache(idx: usize, want: u64) -> u64 {
    let mut c = CACHE.lock();
    let Some(v) = c.get_mut(&idx) else {
        return 0;
    };
    let take = (*v).min(want);
    *v -= take;
    take
}

/// An escaped graph allocation was freed outside a graph: its bytes go back to the graph
/// pool of its device, cached and still charged.
pub fn freed(e: Entry) {
    cache(e.dev, e.bytes);
}

/// What the driver's graph pool of CUDA device `dev` caches, after a trim: reserved minus used
/// bytes (`cuDeviceGetGraphMemAttribute`); without those figures none (a trim releases every
/// block no graph uses).
fn cached_by_driver(dev: CUdevice) -> u64 {
    let Some(f) = cu::cuDeviceGetGraphMemAttribute() else {
        return 0;
    };
    let get = |attr| {
        let mut v: u64 = 0;
        // SAFETY: the graph memory attributes write a cuuint64_t into the out pointer.
        let r = unsafe { f(dev, attr, (&mut v as *mut u64).cast()) };
        (r == CUDA_SUCCESS).then_some(v)
    };
    match (
        get(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT),
        get(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT),
    ) {
        (Some(reserved), Some(used)) => reserved.saturating_sub(used),
        _ => 0,
    }
}

/// Takes out of device `idx`'s charged graph cache what `kept` (asked with the cache as it is
/// now, without the lock: it queries the driver) says the driver no longer caches; returns
/// the bytes to give back. An instantiation on another thread may take from the cache while
/// the driver is asked (its executable graph's charge holds those bytes from then on), so at
/// most what is left of the cache leaves.
fn settle_with(idx: usize, kept: impl FnOnce(u64) -> u64) -> u64 {
    let Some(cached) = CACHE.lock().get(&idx).copied().filter(|c| *c > 0) else {
        return 0;
    };
    let held = kept(cached);
    if held >= cached {
        return 0;
    }
    let mut c = CACHE.lock();
    let Some(now) = c.get_mut(&idx) else {
        return 0;
    };
    let give = (cached - held).min(*now);
    *now -= give;
    give
}

/// Gives back the part of device `idx`'s graph cache the driver no longer holds, right after
/// a trim of CUDA device `dev`.
fn settle(slice: &Slice, idx: usize, dev: CUdevice) -> bool {
    let give = settle_with(idx, |_| cached_by_driver(dev));
    if give > 0 {
        slice.usage.release(idx, give);
    }
    give > 0
}

/// Trims the driver's graph pool of limits device `idx` when this process has graph memory
/// cached there (`cuDeviceGraphMemTrim`, which frees only blocks no graph uses) and gives back
/// what it released; true when some charge was given back. Run before an allocation is
/// refused, so a cache never makes the program fail.
pub fn trim_cache(slice: &Slice, devices: &Devices, idx: usize) -> bool {
    if CACHE.lock().get(&idx).is_none_or(|c| *c == 0) {
        return false;
    }
    let (Some(dev), Some(trim)) = (devices.cuda_device(idx), cu::cuDeviceGraphMemTrim()) else {
        return false;
    };
    // SAFETY: a device of this process.
    if unsafe { trim(dev) } != CUDA_SUCCESS {
        return false;
    }
    settle(slice, idx, dev)
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGraphMemTrim(dev: CUdevice) -> CUresult {
    guard("cuDeviceGraphMemTrim", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuDeviceGraphMemTrim);
        // SAFETY: the caller's argument.
        let r = unsafe { f(dev) };
        if r == CUDA_SUCCESS {
            if let Ok((slice, devices)) = state::ready() {
                if let Some(idx) = devices.index(dev) {
                    settle(slice, idx, dev);
                }
            }
        }
        r
    })
}

fn exec_key(exec: CUgraphExec, idx: usize) -> u64 {
    (exec as u64)
        .wrapping_mul(MAX_DEVICES as u64)
        .wrapping_add(idx as u64)
}

/// Notes that graph `graph` allocates `bytes` at `dptr` on CUDA device `dev` when launched.
fn note(graph: CUgraph, dev: CUdevice, bytes: u64, dptr: CUdeviceptr) {
    GRAPHS
        .lock()
        .entry(graph as usize)
        .or_default()
        .allocs
        .push((dev, bytes, dptr));
}

/// Notes that graph `graph` frees `dptr` when launched.
pub fn note_free(graph: CUgraph, dptr: CUdeviceptr) {
    GRAPHS
        .lock()
        .entry(graph as usize)
        .or_default()
        .frees
        .push(dptr);
}

/// Adds what graph `from` allocates and frees to graph `into` (a child graph node, a clone).
fn merge(from: CUgraph, into: CUgraph) {
    let mut g = GRAPHS.lock();
    let Some(from) = g.get(&(from as usize)).cloned() else {
        return;
    };
    let into = g.entry(into as usize).or_default();
    into.allocs.extend(from.allocs);
    into.frees.extend(from.frees);
}

/// A launch of `exec` allocated its escaping allocations.
pub fn launched(exec: CUgraphExec) {
    if let Some(escapes) = EXECS.lock().get_mut(&(exec as usize)) {
        for e in escapes {
            e.live = true;
        }
    }
}

/// `dptr`, freed outside a graph, was perhaps a live escaping allocation of an executable
/// graph: no longer live (the executable keeps its charge, its next launch allocates again).
pub fn freed_outside(dptr: CUdeviceptr) {
    for escapes in EXECS.lock().values_mut() {
        if let Some(e) = escapes.iter_mut().find(|e| e.dptr == dptr && e.live) {
            e.live = false;
            return;
        }
    }
}

/// Notes a memory-allocation node's bytes from its parameters, once the driver added it.
///
/// # Safety
/// `params` is null or points to parameters the driver accepted.
unsafe fn note_alloc_params(graph: CUgraph, params: *const CUDA_MEM_ALLOC_NODE_PARAMS) {
    if params.is_null() {
        return;
    }
    // SAFETY: per the contract, a valid struct (the driver wrote the address).
    let (loc, bytes, dptr) = unsafe {
        (
            (*params).poolProps.location,
            (*params).bytesize as u64,
            (*params).dptr,
        )
    };
    let dev = if loc.type_ == CU_MEM_LOCATION_TYPE_DEVICE {
        Some(loc.id)
    } else {
        state::current_device().ok()
    };
    if let Some(dev) = dev {
        note(graph, dev, bytes, dptr);
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddMemAllocNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    ndeps: usize,
    params: *mut CUDA_MEM_ALLOC_NODE_PARAMS,
) -> CUresult {
    guard("cuGraphAddMemAllocNode", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuGraphAddMemAllocNode);
        // SAFETY: the caller's arguments.
        let r = unsafe { f(node, graph, deps, ndeps, params) };
        if r == CUDA_SUCCESS {
            // SAFETY: the driver accepted params.
            unsafe { note_alloc_params(graph, params) };
        }
        r
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddMemFreeNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    ndeps: usize,
    dptr: CUdeviceptr,
) -> CUresult {
    guard("cuGraphAddMemFreeNode", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuGraphAddMemFreeNode);
        // SAFETY: the caller's arguments.
        let r = unsafe { f(node, graph, deps, ndeps, dptr) };
        if r == CUDA_SUCCESS {
            note_free(graph, dptr);
        }
        r
    })
}

/// After `cuGraphAddNode` succeeded: a memory-allocation node is noted like
/// `cuGraphAddMemAllocNode`, a child-graph node like `cuGraphAddChildGraphNode`.
///
/// # Safety
/// `params` is null or points to node parameters the driver accepted.
unsafe fn note_node(graph: CUgraph, params: *const CUgraphNodeParams) {
    if params.is_null() {
        return;
    }
    // SAFETY: per the contract; the union is read as the member its type names.
    unsafe {
        match (*params).type_ {
            CU_GRAPH_NODE_TYPE_MEM_ALLOC => note_alloc_params(graph, &(*params).u.alloc),
            CU_GRAPH_NODE_TYPE_MEM_FREE => note_free(graph, (*params).u.free_dptr),
            CU_GRAPH_NODE_TYPE_GRAPH => merge((*params).u.child_graph, graph),
            _ => {}
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    ndeps: usize,
    params: *mut CUgraphNodeParams,
) -> CUresult {
    guard("cuGraphAddNode", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuGraphAddNode);
        // SAFETY: the caller's arguments.
        let r = unsafe { f(node, graph, deps, ndeps, params) };
        if r == CUDA_SUCCESS {
            // SAFETY: the driver accepted params.
            unsafe { note_node(graph, params) };
        }
        r
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddNode_v2(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    edges: *const CUgraphEdgeData,
    ndeps: usize,
    params: *mut CUgraphNodeParams,
) -> CUresult {
    guard("cuGraphAddNode_v2", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuGraphAddNode_v2);
        // SAFETY: the caller's arguments.
        let r = unsafe { f(node, graph, deps, edges, ndeps, params) };
        if r == CUDA_SUCCESS {
            // SAFETY: the driver accepted params.
            unsafe { note_node(graph, params) };
        }
        r
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddChildGraphNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    ndeps: usize,
    child: CUgraph,
) -> CUresult {
    guard("cuGraphAddChildGraphNode", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuGraphAddChildGraphNode);
        // SAFETY: the caller's arguments.
        let r = unsafe { f(node, graph, deps, ndeps, child) };
        if r == CUDA_SUCCESS {
            merge(child, graph);
        }
        r
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphClone(clone: *mut CUgraph, original: CUgraph) -> CUresult {
    guard("cuGraphClone", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuGraphClone);
        // SAFETY: the caller's arguments.
        let r = unsafe { f(clone, original) };
        if r == CUDA_SUCCESS && !clone.is_null() {
            // SAFETY: the driver wrote the clone on success.
            merge(original, unsafe { *clone });
        }
        r
    })
}

/// The graph `stream` is being captured into, if it is (`cuStreamGetCaptureInfo_v2`).
pub fn capture_graph(stream: CUstream, per_thread: bool) -> Option<CUgraph> {
    let f = if per_thread {
        cu::cuStreamGetCaptureInfo_v2_ptsz()
    } else {
        cu::cuStreamGetCaptureInfo_v2()
    }?;
    let mut status: CUstreamCaptureStatus = CU_STREAM_CAPTURE_STATUS_NONE;
    let mut graph: CUgraph = std::ptr::null_mut();
    let null = std::ptr::null_mut();
    // SAFETY: the caller's stream; optional outputs are null, the others valid.
    let r = unsafe {
        f(
            stream,
            &mut status,
            null,
            &mut graph,
            null.cast(),
            null.cast(),
        )
    };
    (r == CUDA_SUCCESS && status == CU_STREAM_CAPTURE_STATUS_ACTIVE && !graph.is_null())
        .then_some(graph)
}

/// A stream-ordered allocation issued to a stream in capture: the driver adds an
/// allocation node instead of allocating, so nothing is charged now; the bytes are noted
/// for the graph and charged when it is instantiated (on `dev`, else the current device).
pub fn captured(
    graph: CUgraph,
    dev: Option<CUdevice>,
    bytes: u64,
    call: impl FnOnce() -> Result<CUdeviceptr, CUresult>,
) -> CUresult {
    match call() {
        Ok(dptr) => {
            if let Some(dev) = dev.or_else(|| state::current_device().ok()) {
                note(graph, dev, bytes, dptr);
            }
            CUDA_SUCCESS
        }
        Err(r) => r,
    }
}

/// Charges the graph's memory, runs the real instantiation, records the executable.
fn instantiate(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let (slice, devices) = tri!(state::ready());
    let mem = GRAPHS
        .lock()
        .get(&(graph as usize))
        .cloned()
        .unwrap_or_default();
    if mem.allocs.is_empty() {
        return call();
    }
    let mut needs: Vec<(CUdevice, u64)> = Vec::new();
    for (dev, bytes, _) in &mem.allocs {
        match needs.iter_mut().find(|(d, _)| d == dev) {
            Some((_, b)) => *b = b.saturating_add(*bytes),
            None => needs.push((*dev, *bytes)),
        }
    }
    // (target, bytes, of which taken from the graph cache) charged so far.
    let mut charged: Vec<(Target, u64, u64)> = Vec::new();
    // A refused instantiation gives back what it charged and returns what it took from the
    // cache there (counted high: a trim meanwhile may have released it; the next trim settles).
    let give_back = |charged: &[(Target, u64, u64)]| {
        for (t, b, reused) in charged {
            slice.usage.release(t.idx, b - reused);
            cache(t.idx, *reused);
        }
    };
    for (dev, bytes) in needs {
        let t = match target(devices, dev) {
            Ok(t) => t,
            Err(r) => {
                give_back(&charged);
                return r;
            }
        };
        // The driver backs graph memory from the bytes its graph pool caches first; those are
        // charged already.
        let reused = from_cache(t.idx, bytes);
        if let Err(r) = account::reserve(slice, t, bytes - reused) {
            cache(t.idx, reused);
            give_back(&charged);
            return r;
        }
        charged.push((t, bytes, reused));
    }
    let r = call();
    if r != CUDA_SUCCESS || exec.is_null() {
        give_back(&charged);
        return r;
    }
    // SAFETY: the driver wrote the new executable graph on success.
    let e = unsafe { *exec };
    let escapes: Vec<Escape> = mem
        .allocs
        .iter()
        .filter(|(_, _, dptr)| !mem.frees.contains(dptr))
        .filter_map(|(dev, bytes, dptr)| {
            Some(Escape {
                idx: devices.index(*dev)?,
                bytes: *bytes,
                dptr: *dptr,
                live: false,
            })
        })
        .collect();
    EXECS.lock().insert(e as usize, escapes);
    for (t, bytes, _) in charged {
        account::record(Kind::GraphExec, exec_key(e, t.idx), t, bytes);
    }
    r
}

fn target(devices: &Devices, dev: CUdevice) -> Result<Target, CUresult> {
    account::target_on(devices, dev)
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiate(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    err_node: *mut CUgraphNode,
    log: *mut c_char,
    log_size: usize,
) -> CUresult {
    guard("cuGraphInstantiate", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuGraphInstantiate);
        // SAFETY: the caller's arguments.
        instantiate(exec, graph, || unsafe {
            f(exec, graph, err_node, log, log_size)
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiate_v2(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    err_node: *mut CUgraphNode,
    log: *mut c_char,
    log_size: usize,
) -> CUresult {
    guard("cuGraphInstantiate_v2", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuGraphInstantiate_v2);
        // SAFETY: the caller's arguments.
        instantiate(exec, graph, || unsafe {
            f(exec, graph, err_node, log, log_size)
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    flags: c_ulonglong,
) -> CUresult {
    guard("cuGraphInstantiateWithFlags", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuGraphInstantiateWithFlags);
        // SAFETY: the caller's arguments.
        instantiate(exec, graph, || unsafe { f(exec, graph, flags) })
    })
}

macro_rules! with_params {
    ($name:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            exec: *mut CUgraphExec,
            graph: CUgraph,
            params: *mut c_void,
        ) -> CUresult {
            guard(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                let f = real!($name);
                // SAFETY: the caller's arguments.
                instantiate(exec, graph, || unsafe { f(exec, graph, params) })
            })
        }
    };
}
with_params!(cuGraphInstantiateWithParams);
with_params!(cuGraphInstantiateWithParams_ptsz);

#[no_mangle]
pub unsafe extern "C" fn cuGraphExecDestroy(exec: CUgraphExec) -> CUresult {
    guard("cuGraphExecDestroy", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuGraphExecDestroy);
        let keys: Vec<u64> = (0..MAX_DEVICES).map(|idx| exec_key(exec, idx)).collect();
        let escapes = EXECS.lock().remove(&(exec as usize));
        // SAFETY: the caller's argument.
        let (r, mut gone) = account::free_with(Kind::GraphExec, &keys, || unsafe { f(exec) });
        if r != CUDA_SUCCESS {
            if let Some(escapes) = escapes {
                EXECS.lock().insert(exec as usize, escapes);
            }
            return r;
        }
        keep_live(&mut gone, &escapes.unwrap_or_default());
        // The rest stays in the device's graph pool: charged, as its graph cache.
        for e in gone {
            cache(e.dev, e.bytes);
        }
        r
    })
}

/// Destroying an executable graph does not free the live allocations its launch made: their
/// bytes move from the executable's charges `gone` to entries at their addresses, graph
/// memory ([`GRAPH_POOL`]) whose free returns it to the graph cache.
fn keep_live(gone: &mut [Entry], escapes: &[Escape]) {
    for esc in escapes.iter().filter(|e| e.live) {
        if let Some(e) = gone
            .iter_mut()
            .find(|e| e.dev == esc.idx && e.bytes >= esc.bytes)
        {
            e.bytes -= esc.bytes;
            account::record_stream_ordered(esc.dptr, e.target(), esc.bytes, GRAPH_POOL);
        }
    }
}

/// Destroys graph `graph` through `call`. What the shim noted for it leaves the table before
/// the driver is asked, as every free does (docs/shim.md, "Frees and reused handles"): once
/// the driver destroyed it, another thread's `cuGraphCreate` may get the same handle and add
/// allocation nodes, whose notes must stay (else its instantiation would charge nothing). If
/// the driver refuses, the notes are put back.
fn destroy_graph(graph: CUgraph, call: impl FnOnce() -> CUresult) -> CUresult {
    let key = graph as usize;
    let taken = GRAPHS.lock().remove(&key);
    let r = call();
    if r != CUDA_SUCCESS {
        if let Some(mem) = taken {
            GRAPHS.lock().entry(key).or_insert(mem);
        }
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphDestroy(graph: CUgraph) -> CUresult {
    guard("cuGraphDestroy", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuGraphDestroy);
        // SAFETY: the caller's argument.
        destroy_graph(graph, || unsafe { f(graph) })
    })
}

/// For the child after `fork`.
pub fn reset_in_child() {
    GRAPHS.reset_in_child();
    EXECS.reset_in_child();
    CACHE.reset_in_child();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_graph_the_driver_hands_out_again_during_a_destroy_keeps_its_notes() {
        let g = 0x4400_0000usize as CUgraph;
        note(g, 0, 100, 0x1000);
        // Another thread's cuGraphCreate gets the handle as soon as the driver destroyed it,
        // and adds an allocation node before this destroy returns.
        let r = destroy_graph(g, || {
            note(g, 0, 200, 0x2000);
            CUDA_SUCCESS
        });
        assert_eq!(r, CUDA_SUCCESS);
        let allocs = GRAPHS.lock().get(&(g as usize)).map(|m| m.allocs.clone());
        assert_eq!(allocs, Some(vec![(0, 200, 0x2000)]));
    }

    fn cached(idx: usize) -> u64 {
        CACHE.lock().get(&idx).copied().unwrap_or(0)
    }

    #[test]
    fn an_instantiation_takes_what_the_graph_cache_holds_first() {
        let idx = 9;
        cache(idx, 300);
        assert_eq!(from_cache(idx, 200), 200);
        assert_eq!(from_cache(idx, 200), 100, "only what is left");
        assert_eq!(from_cache(idx, 200), 0);
        assert_eq!(cached(idx), 0);
    }

    #[test]
    fn a_settle_gives_back_only_what_is_left_of_the_graph_cache() {
        let idx = 10;
        cache(idx, 300);
        // While the driver is asked after a trim (it caches none of the 300), another
        // thread's instantiation takes 200 of the cache: its executable graph's charge holds
        // them from then on, so only the 100 left are given back.
        let give = settle_with(idx, |c| {
            assert_eq!(c, 300);
            assert_eq!(from_cache(idx, 200), 200);
            0
        });
        assert_eq!(give, 100);
        assert_eq!(cached(idx), 0);
        cache(idx, 300);
        assert_eq!(
            settle_with(idx, |_| 120),
            180,
            "the driver still caches 120"
        );
        assert_eq!(cached(idx), 120);
        assert_eq!(settle_with(idx, |_| 500), 0, "never more than charged");
        assert_eq!(cached(idx), 120);
    }

    #[test]
    fn a_refused_graph_destroy_keeps_the_notes() {
        let g = 0x4500_0000usize as CUgraph;
        note(g, 0, 300, 0x3000);
        assert_eq!(
            destroy_graph(g, || CUDA_ERROR_INVALID_VALUE),
            CUDA_ERROR_INVALID_VALUE
        );
        let allocs = GRAPHS.lock().get(&(g as usize)).map(|m| m.allocs.clone());
        assert_eq!(allocs, Some(vec![(0, 300, 0x3000)]));
    }
}
