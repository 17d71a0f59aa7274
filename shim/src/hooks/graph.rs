//! Graph memory: adding a memory-allocation node (`cuGraphAddMemAllocNode`, `cuGraphAddNode`
//! with allocation parameters, or `cuMemAllocAsync` on a stream in capture) only notes the
//! bytes a graph will need; child-graph nodes and clones take over what their source graph
//! needs. The bytes are charged when the graph is instantiated (refused there past the
//! limit), once per executable graph, and given back when it is destroyed, which is when the
//! driver holds and releases them.

use std::collections::HashMap;
use std::ffi::{c_char, c_ulonglong, c_void};

use gpuslice_cuda_ffi::*;
use gpuslice_slice::usage::MAX_DEVICES;

use crate::account::{self, Kind, Target};
use crate::forksafe::ForkSafe;
use crate::guard::guard;
use crate::real::cu;
use crate::state::{self, Devices};

/// Bytes of memory-allocation nodes per graph, per CUDA device.
static GRAPHS: ForkSafe<HashMap<usize, Vec<(CUdevice, u64)>>> = ForkSafe::new(HashMap::new);

fn exec_key(exec: CUgraphExec, idx: usize) -> u64 {
    (exec as u64)
        .wrapping_mul(MAX_DEVICES as u64)
        .wrapping_add(idx as u64)
}

/// Notes that graph `graph` allocates `bytes` on CUDA device `dev` when instantiated.
fn note(graph: CUgraph, dev: CUdevice, bytes: u64) {
    let mut g = GRAPHS.lock();
    let per_dev = g.entry(graph as usize).or_default();
    match per_dev.iter_mut().find(|(d, _)| *d == dev) {
        Some((_, b)) => *b = b.saturating_add(bytes),
        None => per_dev.push((dev, bytes)),
    }
}

/// Adds what graph `from` allocates to graph `into` (a child graph node, or a clone).
fn merge(from: CUgraph, into: CUgraph) {
    let needs = GRAPHS.lock().get(&(from as usize)).cloned();
    for (dev, bytes) in needs.unwrap_or_default() {
        note(into, dev, bytes);
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
    // SAFETY: per the contract, a valid struct.
    let (loc, bytes) = unsafe { ((*params).poolProps.location, (*params).bytesize as u64) };
    let dev = if loc.type_ == CU_MEM_LOCATION_TYPE_DEVICE {
        Some(loc.id)
    } else {
        state::current_device().ok()
    };
    if let Some(dev) = dev {
        note(graph, dev, bytes);
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
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let r = call();
    if r == CUDA_SUCCESS {
        if let Some(dev) = dev.or_else(|| state::current_device().ok()) {
            note(graph, dev, bytes);
        }
    }
    r
}

/// Charges the graph's memory, runs the real instantiation, records the executable.
fn instantiate(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let (slice, devices) = tri!(state::ready());
    let needs = GRAPHS
        .lock()
        .get(&(graph as usize))
        .cloned()
        .unwrap_or_default();
    if needs.is_empty() {
        return call();
    }
    let mut charged: Vec<(Target, u64)> = Vec::new();
    let give_back = |charged: &[(Target, u64)]| {
        for (t, b) in charged {
            slice.usage.release(t.idx, *b);
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
        if let Err(r) = account::reserve(slice, t, bytes) {
            give_back(&charged);
            return r;
        }
        charged.push((t, bytes));
    }
    let r = call();
    if r != CUDA_SUCCESS || exec.is_null() {
        give_back(&charged);
        return r;
    }
    // SAFETY: the driver wrote the new executable graph on success.
    let e = unsafe { *exec };
    for (t, bytes) in charged {
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
        // SAFETY: the caller's argument.
        let (r, gone) = account::free_with(Kind::GraphExec, &keys, || unsafe { f(exec) });
        account::release_all(&gone);
        r
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphDestroy(graph: CUgraph) -> CUresult {
    guard("cuGraphDestroy", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuGraphDestroy);
        // SAFETY: the caller's argument.
        let r = unsafe { f(graph) };
        if r == CUDA_SUCCESS {
            GRAPHS.lock().remove(&(graph as usize));
        }
        r
    })
}

/// For the child after `fork`.
pub fn reset_in_child() {
    GRAPHS.reset_in_child();
}
