//! Graphs with memory nodes: an allocation node gets its address when added (directly, through
//! `cuGraphAddNode`, or by stream capture of `cuMemAllocAsync`); the memory of every
//! allocation node, those in child graphs and clones included, is backed when the graph is
//! instantiated by the device's graph memory pool ([`crate::driver::GraphPool`]: its cache
//! first, then charged). Destroying the executable graph returns its memory to that pool,
//! still charged, except an allocation a launch made that no free node in the graph freed:
//! as on a real driver, it stays until `cuMemFree`/`cuMemFreeAsync` of its address, which
//! returns it to the pool too. `cuDeviceGraphMemTrim` releases what the pool caches;
//! `cuDeviceGetGraphMemAttribute` reports its figures. Launching a graph takes no device time.

use std::ffi::{c_char, c_uint, c_ulonglong, c_void};

use gpuslice_cuda_ffi::*;

use crate::driver::{driver, handle, id_of, Driver, Exec, Graph, GraphNode, GraphPool, Objects};
use crate::guard::{get, get_slice, guard, put, CuResult};

#[no_mangle]
pub unsafe extern "C" fn cuGraphCreate(graph: *mut CUgraph, flags: c_uint) -> CUresult {
    guard(|| {
        let d = driver()?;
        if flags != 0 || graph.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut o = d.objects();
        let id = o.new_id();
        o.graphs.insert(id, Graph::default());
        put(graph, handle(id))
    })
}

fn check_deps(
    o: &crate::driver::Objects,
    graph: u64,
    deps: *const CUgraphNode,
    count: usize,
) -> CuResult {
    let g = o.graphs.get(&graph).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    for dep in get_slice(deps, count)? {
        if !g.nodes.iter().any(|(id, _)| *id == id_of(dep)) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
    }
    Ok(())
}

/// Adds a memory-allocation node; writes the address it will have into `params.dptr`.
fn add_alloc_node(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    num_deps: usize,
    p: &mut CUDA_MEM_ALLOC_NODE_PARAMS,
) -> CuResult {
    let d = driver()?;
    let props = p.poolProps;
    if props.allocType != CU_MEM_ALLOCATION_TYPE_PINNED
        || props.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE
        || p.bytesize == 0
        || node.is_null()
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ord = d
        .ordinal(props.location.id)
        .map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    let gid = id_of(graph);
    let mut o = d.objects();
    check_deps(&o, gid, deps, num_deps)?;
    let dptr = o.new_va(p.bytesize as u64, 0)?;
    let nid = o.new_id();
    if let Some(g) = o.graphs.get_mut(&gid) {
        g.nodes.push((
            nid,
            GraphNode::Alloc {
                ordinal: ord,
                bytes: p.bytesize as u64,
                dptr,
            },
        ));
    }
    p.dptr = dptr;
    put(node, handle(nid))
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddMemAllocNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    num_deps: usize,
    params: *mut CUDA_MEM_ALLOC_NODE_PARAMS,
) -> CUresult {
    guard(|| {
        let mut p = get(params.cast_const())?;
        add_alloc_node(node, graph, deps, num_deps, &mut p)?;
        put(params, p)
    })
}

/// Adds a node holding `n` (a copy of a child graph, or one that holds no memory).
fn add_plain_node(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    num_deps: usize,
    n: GraphNode,
) -> CuResult {
    let d = driver()?;
    if node.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let gid = id_of(graph);
    let mut o = d.objects();
    check_deps(&o, gid, deps, num_deps)?;
    let nid = o.new_id();
    if let Some(g) = o.graphs.get_mut(&gid) {
        g.nodes.push((nid, n));
    }
    put(node, handle(nid))
}

/// The nodes of graph `child`, copied (the driver clones a child graph into its node).
fn copy_of(child: CUgraph) -> CuResult<Vec<GraphNode>> {
    let o = driver()?.objects();
    let g = o
        .graphs
        .get(&id_of(child))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    Ok(g.nodes.iter().map(|(_, n)| n.clone()).collect())
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddChildGraphNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    num_deps: usize,
    child: CUgraph,
) -> CUresult {
    guard(|| {
        let nodes = copy_of(child)?;
        add_plain_node(node, graph, deps, num_deps, GraphNode::Child(nodes))
    })
}

/// `cuGraphAddNode`: the generic form; memory allocation and free, child graph and empty
/// nodes are simulated, other types are `CUDA_ERROR_NOT_SUPPORTED`.
fn add_node(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    num_deps: usize,
    params: *mut CUgraphNodeParams,
) -> CuResult {
    let mut p = get(params.cast_const())?;
    match p.type_ {
        CU_GRAPH_NODE_TYPE_MEM_ALLOC => {
            // SAFETY: the union is read as the member its type names.
            let mut alloc = unsafe { p.u.alloc };
            add_alloc_node(node, graph, deps, num_deps, &mut alloc)?;
            p.u.alloc = alloc;
            put(params, p)
        }
        CU_GRAPH_NODE_TYPE_MEM_FREE => {
            // SAFETY: as above.
            let dptr = unsafe { p.u.free_dptr };
            // SAFETY: the checks of the dedicated entry point, on the caller's arguments.
            let r = unsafe { cuGraphAddMemFreeNode(node, graph, deps, num_deps, dptr) };
            if r == CUDA_SUCCESS {
                Ok(())
            } else {
                Err(r)
            }
        }
        CU_GRAPH_NODE_TYPE_GRAPH => {
            // SAFETY: as above.
            let nodes = copy_of(unsafe { p.u.child_graph })?;
            add_plain_node(node, graph, deps, num_deps, GraphNode::Child(nodes))
        }
        CU_GRAPH_NODE_TYPE_EMPTY => add_plain_node(node, graph, deps, num_deps, GraphNode::Other),
        _ => Err(CUDA_ERROR_NOT_SUPPORTED),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    num_deps: usize,
    params: *mut CUgraphNodeParams,
) -> CUresult {
    guard(|| add_node(node, graph, deps, num_deps, params))
}

/// The 12.3 form; edge data only describes ports, which this simulation does not model.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddNode_v2(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    _edges: *const CUgraphEdgeData,
    num_deps: usize,
    params: *mut CUgraphNodeParams,
) -> CUresult {
    guard(|| add_node(node, graph, deps, num_deps, params))
}

/// `cuGraphClone`: a new graph with copies of every node (allocation nodes keep their
/// addresses, as a clone's instantiation maps the same graph memory).
#[no_mangle]
pub unsafe extern "C" fn cuGraphClone(clone: *mut CUgraph, original: CUgraph) -> CUresult {
    guard(|| {
        let d = driver()?;
        if clone.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let nodes = copy_of(original)?;
        let mut o = d.objects();
        let mut g = Graph::default();
        for n in nodes {
            let nid = o.new_id();
            g.nodes.push((nid, n));
        }
        let id = o.new_id();
        o.graphs.insert(id, g);
        put(clone, handle(id))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddMemFreeNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    num_deps: usize,
    dptr: CUdeviceptr,
) -> CUresult {
    guard(|| {
        let d = driver()?;
        if node.is_null() || dptr == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let gid = id_of(graph);
        let mut o = d.objects();
        check_deps(&o, gid, deps, num_deps)?;
        let is_graph_memory = o
            .graphs
            .values()
            .flat_map(|g| g.nodes.iter())
            .any(|(_, n)| n.allocates(dptr));
        if !is_graph_memory {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let nid = o.new_id();
        if let Some(g) = o.graphs.get_mut(&gid) {
            g.nodes.push((nid, GraphNode::Free(dptr)));
        }
        put(node, handle(nid))
    })
}

/// The graph memory pool of ordinal `ord`.
fn graph_pool(o: &mut Objects, ord: usize) -> CuResult<&mut GraphPool> {
    o.graph_pools.get_mut(ord).ok_or(CUDA_ERROR_INVALID_DEVICE)
}

/// Backs `bytes` of graph memory on ordinal `ord` from its graph pool: the cache first, the
/// rest charged (`CUDA_ERROR_OUT_OF_MEMORY` past the device's capacity). Returns the bytes
/// the pool grew by.
fn back(d: &Driver, o: &mut Objects, ord: usize, bytes: u64) -> CuResult<u64> {
    let grown = graph_pool(o, ord)?.growth_for(bytes);
    if grown > 0 {
        d.charge(ord, grown)?;
    }
    graph_pool(o, ord)?.take(bytes, grown);
    Ok(grown)
}

fn instantiate(exec: *mut CUgraphExec, graph: CUgraph) -> CuResult {
    let d = driver()?;
    if exec.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut o = d.objects();
    o.check_current()?;
    let g = o
        .graphs
        .get(&id_of(graph))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let (mut allocs, mut frees) = (Vec::new(), Vec::new());
    for (_, n) in &g.nodes {
        n.allocations(&mut allocs);
        n.frees(&mut frees);
    }
    let escapes: Vec<(usize, u64, u64)> = allocs
        .iter()
        .filter(|(_, _, p)| !frees.contains(p))
        .copied()
        .collect();
    // (ordinal, bytes, bytes the pool grew by) of each allocation backed so far.
    let mut taken: Vec<(usize, u64, u64)> = Vec::with_capacity(allocs.len());
    for (ord, bytes, _) in &allocs {
        match back(d, &mut o, *ord, *bytes) {
            Ok(grown) => taken.push((*ord, *bytes, grown)),
            Err(e) => {
                for (ord, bytes, grown) in taken.into_iter().rev() {
                    if let Ok(p) = graph_pool(&mut o, ord) {
                        let released = p.untake(bytes, grown);
                        d.uncharge(ord, released);
                    }
                }
                return Err(e);
            }
        }
    }
    let charged = allocs
        .iter()
        .map(|(ord, bytes, _)| (*ord, *bytes))
        .collect();
    let id = o.new_id();
    o.execs.insert(
        id,
        Exec {
            charges: charged,
            escapes,
            live: Vec::new(),
        },
    );
    put(exec, handle(id))
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    flags: c_ulonglong,
) -> CUresult {
    guard(|| {
        if flags & !0xf != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        instantiate(exec, graph)
    })
}

fn instantiate_legacy(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    error_node: *mut CUgraphNode,
    log: *mut c_char,
    log_size: usize,
) -> CuResult {
    if !error_node.is_null() {
        put(error_node, std::ptr::null_mut())?;
    }
    if !log.is_null() && log_size > 0 {
        put(log, 0)?;
    }
    instantiate(exec, graph)
}

/// The pre-12.0 signature (error node and log buffer), still exported by 12.x drivers.
#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiate(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    error_node: *mut CUgraphNode,
    log: *mut c_char,
    log_size: usize,
) -> CUresult {
    guard(|| instantiate_legacy(exec, graph, error_node, log, log_size))
}

/// `cuGraphInstantiateWithParams`: the parameters' flags and upload stream change nothing
/// this simulation models; the result is written to `params.result_out` when given.
fn instantiate_with_params(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    params: *mut std::ffi::c_void,
) -> CuResult {
    let r = instantiate(exec, graph);
    if !params.is_null() {
        // CUDA_GRAPH_INSTANTIATE_PARAMS: flags (u64), hUploadStream, hErrNode_out, result_out.
        let result_out = params
            .cast::<u8>()
            .wrapping_add(24)
            .cast::<std::ffi::c_int>();
        put(result_out, if r.is_ok() { 0 } else { 1 })?;
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithParams(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    params: *mut std::ffi::c_void,
) -> CUresult {
    guard(|| instantiate_with_params(exec, graph, params))
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithParams_ptsz(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    params: *mut std::ffi::c_void,
) -> CUresult {
    guard(|| instantiate_with_params(exec, graph, params))
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiate_v2(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    error_node: *mut CUgraphNode,
    log: *mut c_char,
    log_size: usize,
) -> CUresult {
    guard(|| instantiate_legacy(exec, graph, error_node, log, log_size))
}

/// A launch allocates every allocation node; those the graph does not free stay live until
/// freed, after the executable graph too.
fn launch(exec: CUgraphExec, stream: CUstream) -> CuResult {
    let mut o = driver()?.objects();
    o.stream(stream)?;
    let e = o
        .execs
        .get_mut(&id_of(exec))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    e.live = e.escapes.clone();
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream) -> CUresult {
    guard(|| launch(exec, stream))
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult {
    guard(|| launch(exec, stream))
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphExecDestroy(exec: CUgraphExec) -> CUresult {
    guard(|| {
        let d = driver()?;
        let mut o = d.objects();
        let mut e = o
            .execs
            .remove(&id_of(exec))
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // Graph destruction does not free live graph memory: it stays until freed.
        for (ord, bytes, dptr) in e.live {
            if let Some(i) = e.charges.iter().position(|c| *c == (ord, bytes)) {
                e.charges.remove(i);
                o.graph_live.insert(dptr, (ord, bytes));
            }
        }
        // The rest goes back to the graph pool, cached and still charged.
        for (ord, bytes) in e.charges {
            graph_pool(&mut o, ord)?.give(bytes);
        }
        o.free_id(id_of(exec));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphDestroy(graph: CUgraph) -> CUresult {
    guard(|| {
        let d = driver()?;
        let mut o = d.objects();
        let id = id_of(graph);
        // A graph stream capture is building is not the caller's yet.
        if o.streams.values().any(|s| s.capture == Some(id)) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let g = o.graphs.remove(&id).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // The nodes' ids go with the graph; the addresses of its allocation nodes are not
        // handed out again, as copies of them (clones, child graphs, executable graphs)
        // may still map them.
        o.free_ids(g.nodes.into_iter().map(|(nid, _)| nid));
        o.free_id(id);
        Ok(())
    })
}

/// Releases what the device's graph pool caches: memory no executable graph and no live
/// allocation holds.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGraphMemTrim(dev: CUdevice) -> CUresult {
    guard(|| {
        let d = driver()?;
        let ord = d.ordinal(dev)?;
        let released = graph_pool(&mut d.objects(), ord)?.trim();
        d.uncharge(ord, released);
        Ok(())
    })
}

/// Reads a graph memory attribute of the device (a `cuuint64_t`): used and reserved bytes of
/// its graph pool and their high-water marks.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetGraphMemAttribute(
    dev: CUdevice,
    attr: CUgraphMem_attribute,
    value: *mut c_void,
) -> CUresult {
    guard(|| {
        let d = driver()?;
        let ord = d.ordinal(dev)?;
        let p = *graph_pool(&mut d.objects(), ord)?;
        let bytes = match attr {
            CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT => p.used,
            CU_GRAPH_MEM_ATTR_USED_MEM_HIGH => p.used_high,
            CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT => p.reserved,
            CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH => p.reserved_high,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        put(value.cast::<u64>(), bytes)
    })
}

/// Resets a high-water mark of the device's graph pool; only 0 may be set ("High watermark
/// can only be reset to zero", CUDA driver API), after which the mark follows the current
/// figure again.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceSetGraphMemAttribute(
    dev: CUdevice,
    attr: CUgraphMem_attribute,
    value: *mut c_void,
) -> CUresult {
    guard(|| {
        let d = driver()?;
        let ord = d.ordinal(dev)?;
        if get(value.cast::<u64>().cast_const())? != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut o = d.objects();
        let p = graph_pool(&mut o, ord)?;
        match attr {
            CU_GRAPH_MEM_ATTR_USED_MEM_HIGH => p.used_high = p.used,
            CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH => p.reserved_high = p.reserved,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        Ok(())
    })
}
