//! Graph memory: `cuGraphAddMemAllocNode` only notes the bytes a graph will need; they are
//! charged when the graph is instantiated (refused there past the limit) and given back when
//! the executable graph is destroyed, which is when the driver holds and releases them.

use std::collections::HashMap;
use std::ffi::{c_char, c_ulonglong, c_void};

use gpuslice_cuda_ffi::*;
use gpuslice_slice::usage::MAX_DEVICES;

use crate::account::{self, Kind, Target};
use crate::forksafe::ForkSafe;
use crate::guard::guard;
use crate::state::{self, Devices};

/// Bytes of memory-allocation nodes per graph, per CUDA device.
static GRAPHS: ForkSafe<HashMap<usize, Vec<(CUdevice, u64)>>> = ForkSafe::new(HashMap::new);

fn exec_key(exec: CUgraphExec, idx: usize) -> u64 {
    (exec as u64)
        .wrapping_mul(MAX_DEVICES as u64)
        .wrapping_add(idx as u64)
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
        if r == CUDA_SUCCESS && !params.is_null() {
            // SAFETY: the driver accepted params, so it points to a valid struct.
            let (loc, bytes) = unsafe { ((*params).poolProps.location, (*params).bytesize as u64) };
            let dev = if loc.type_ == CU_MEM_LOCATION_TYPE_DEVICE {
                Some(loc.id)
            } else {
                state::current_device().ok()
            };
            if let Some(dev) = dev {
                let mut g = GRAPHS.lock();
                let per_dev = g.entry(graph as usize).or_default();
                match per_dev.iter_mut().find(|(d, _)| *d == dev) {
                    Some((_, b)) => *b = b.saturating_add(bytes),
                    None => per_dev.push((dev, bytes)),
                }
            }
        }
        r
    })
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
        // SAFETY: the caller's argument.
        let r = unsafe { f(exec) };
        if r == CUDA_SUCCESS {
            for idx in 0..MAX_DEVICES {
                account::forget(Kind::GraphExec, exec_key(exec, idx));
            }
        }
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
