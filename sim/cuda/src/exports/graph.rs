//! Graphs with memory nodes: an allocation node gets its address when added; the memory is
//! charged when the graph is instantiated and given back when the executable graph is
//! destroyed. Launching a graph with no kernel nodes takes no device time.

use std::ffi::{c_char, c_uint, c_ulonglong};

use gpuslice_cuda_ffi::*;

use crate::driver::{driver, handle, id_of, Exec, Graph, GraphNode};
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

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddMemAllocNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    num_deps: usize,
    params: *mut CUDA_MEM_ALLOC_NODE_PARAMS,
) -> CUresult {
    guard(|| {
        let d = driver()?;
        let mut p = get(params.cast_const())?;
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
        put(params, p)?;
        put(node, handle(nid))
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
            .any(|(_, n)| matches!(n, GraphNode::Alloc { dptr: a, .. } if *a == dptr));
        if !is_graph_memory {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let nid = o.new_id();
        if let Some(g) = o.graphs.get_mut(&gid) {
            g.nodes.push((nid, GraphNode::Free));
        }
        put(node, handle(nid))
    })
}

fn instantiate(exec: *mut CUgraphExec, graph: CUgraph) -> CuResult {
    let d = driver()?;
    if exec.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut o = d.objects();
    let g = o
        .graphs
        .get(&id_of(graph))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let wanted: Vec<(usize, u64)> = g
        .nodes
        .iter()
        .filter_map(|(_, n)| match n {
            GraphNode::Alloc { ordinal, bytes, .. } => Some((*ordinal, *bytes)),
            GraphNode::Free => None,
        })
        .collect();
    let mut charged = Vec::with_capacity(wanted.len());
    for (ord, bytes) in wanted {
        if let Err(e) = d.charge(ord, bytes) {
            for (o2, b2) in charged {
                d.uncharge(o2, b2);
            }
            return Err(e);
        }
        charged.push((ord, bytes));
    }
    let id = o.new_id();
    o.execs.insert(id, Exec { charges: charged });
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

fn launch(exec: CUgraphExec, stream: CUstream) -> CuResult {
    let o = driver()?.objects();
    o.stream(stream)?;
    o.execs
        .get(&id_of(exec))
        .map(|_| ())
        .ok_or(CUDA_ERROR_INVALID_VALUE)
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
        let e = d
            .objects()
            .execs
            .remove(&id_of(exec))
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        for (ord, bytes) in e.charges {
            d.uncharge(ord, bytes);
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphDestroy(graph: CUgraph) -> CUresult {
    guard(|| {
        let d = driver()?;
        d.objects()
            .graphs
            .remove(&id_of(graph))
            .map(|_| ())
            .ok_or(CUDA_ERROR_INVALID_VALUE)
    })
}

/// Graph memory goes back at exec destroy here, so there is never anything cached to trim.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGraphMemTrim(dev: CUdevice) -> CUresult {
    guard(|| driver()?.ordinal(dev).map(|_| ()))
}
