//! The simulated driver's behaviour under injected XIDs, in this process: contexts on a GPU
//! when an XID 79 or an uncorrectable ECC XID comes are poisoned for good (every later call
//! on them fails with one sticky error, before and after the clear; work in flight fails at
//! the next synchronisation), other GPUs' contexts are untouched, and contexts created after
//! the clear work. One test: the driver is opened once per process, from the environment.

use std::ffi::c_void;
use std::time::Duration;

use gpuslice_cuda_ffi::*;
use gpuslice_sim_core::faults::RECHECK;
use gpuslice_sim_core::testing::SimFixture;

use crate::exports::context::*;
use crate::exports::event::*;
use crate::exports::graph::*;
use crate::exports::init::*;
use crate::exports::memory::*;
use crate::exports::module::*;
use crate::exports::stream::*;

/// Cycles of a spin kernel that runs about 200 ms on the fixture's 1.98 GHz GPUs.
const SPIN_200MS: u64 = 396_000_000;

struct Node {
    fixture: SimFixture,
}

impl Node {
    /// Injects `xid` into GPU `gpu` (clears it with `None`) and waits until every process
    /// would see it.
    fn fault(&self, gpu: usize, xid: Option<u32>) {
        gpuslice_driver::simfault::set_fault(
            &self.fixture.paths.state_dir,
            &self.fixture.devices[gpu].uuid,
            xid,
            1,
        )
        .unwrap();
        std::thread::sleep(RECHECK + Duration::from_millis(50));
    }
}

/// A new context on `dev`, made current.
fn context(dev: CUdevice) -> Result<CUcontext, CUresult> {
    let mut c: CUcontext = std::ptr::null_mut();
    // SAFETY: the out-pointer is a local.
    match unsafe { cuCtxCreate_v2(&mut c, 0, dev) } {
        CUDA_SUCCESS => Ok(c),
        e => Err(e),
    }
}

fn current(c: CUcontext) {
    // SAFETY: a handle argument only.
    assert_eq!(unsafe { cuCtxSetCurrent(c) }, CUDA_SUCCESS);
}

fn destroy(c: CUcontext) -> CUresult {
    // SAFETY: a handle argument only.
    unsafe { cuCtxDestroy_v2(c) }
}

fn alloc() -> Result<CUdeviceptr, CUresult> {
    let mut p: CUdeviceptr = 0;
    // SAFETY: the out-pointer is a local.
    match unsafe { cuMemAlloc_v2(&mut p, 1 << 20) } {
        CUDA_SUCCESS => Ok(p),
        e => Err(e),
    }
}

/// The spin kernel of a module loaded into the current context.
fn kernel() -> CUfunction {
    let mut m: CUmodule = std::ptr::null_mut();
    let image = b"simulated\0";
    // SAFETY: the out-pointer is a local, the image a live NUL-terminated buffer.
    let loaded = unsafe { cuModuleLoadData(&mut m, image.as_ptr().cast()) };
    assert_eq!(loaded, CUDA_SUCCESS);
    let mut f: CUfunction = std::ptr::null_mut();
    // SAFETY: the out-pointer is a local, the name a C string literal.
    let got = unsafe { cuModuleGetFunction(&mut f, m, c"gpuslice_spin".as_ptr()) };
    assert_eq!(got, CUDA_SUCCESS);
    f
}

/// Launches `f` for `cycles` on the current context's default stream.
fn launch(f: CUfunction, cycles: u64) -> CUresult {
    let mut cycles = cycles;
    let mut params: [*mut c_void; 1] = [(&mut cycles as *mut u64).cast()];
    let (stream, extra) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: `params` holds one pointer to a live u64, as the spin kernel takes.
    unsafe { cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, stream, params.as_mut_ptr(), extra) }
}

/// An executable graph (no nodes) instantiated in the current context.
fn graph() -> CUgraphExec {
    let mut g: CUgraph = std::ptr::null_mut();
    // SAFETY: the out-pointer is a local.
    assert_eq!(unsafe { cuGraphCreate(&mut g, 0) }, CUDA_SUCCESS);
    let mut e: CUgraphExec = std::ptr::null_mut();
    // SAFETY: the out-pointer is a local.
    let got = unsafe { cuGraphInstantiateWithFlags(&mut e, g, 0) };
    assert_eq!(got, CUDA_SUCCESS);
    e
}

/// What each context-using call on the current context returns, by name.
fn calls(f: CUfunction, p: CUdeviceptr, exec: CUgraphExec) -> Vec<(&'static str, CUresult)> {
    let mut ev: CUevent = std::ptr::null_mut();
    let null = std::ptr::null_mut();
    // SAFETY: handle and integer arguments, and one out-pointer to a local.
    unsafe {
        vec![
            ("cuCtxSynchronize", cuCtxSynchronize()),
            ("cuStreamSynchronize", cuStreamSynchronize(null)),
            ("cuMemAlloc", alloc().err().unwrap_or(CUDA_SUCCESS)),
            ("cuMemFree", cuMemFree_v2(p)),
            ("cuLaunchKernel", launch(f, 1)),
            ("cuGraphLaunch", cuGraphLaunch(exec, null)),
            ("cuEventCreate", cuEventCreate(&mut ev, 0)),
        ]
    }
}

fn all_fail_with(got: &[(&str, CUresult)], want: CUresult, when: &str) {
    for (call, e) in got {
        assert_eq!(*e, want, "{call} {when}: {got:?}");
    }
}

#[test]
fn faults_poison_the_contexts_on_their_gpu_for_good() {
    let node = Node {
        fixture: SimFixture::new(&[("NVIDIA H200", 8 << 30), ("NVIDIA H200", 8 << 30)]),
    };
    for (k, v) in node.fixture.env() {
        std::env::set_var(k, v);
    }
    // SAFETY: no pointer arguments.
    assert_eq!(unsafe { cuInit(0) }, CUDA_SUCCESS);

    // A context on each GPU; GPU 0's is running a kernel when GPU 0 falls off the bus.
    let other = context(1).unwrap();
    let other_f = kernel();
    let other_p = alloc().unwrap();
    let other_exec = graph();
    let sick = context(0).unwrap();
    let f = kernel();
    let p = alloc().unwrap();
    let exec = graph();
    assert_eq!(launch(f, SPIN_200MS), CUDA_SUCCESS);
    node.fault(0, Some(79));
    // The kernel in flight failed: the error surfaces at the synchronisation, and stays.
    let got = calls(f, p, exec);
    all_fail_with(&got, CUDA_ERROR_LAUNCH_FAILED, "after XID 79");
    assert_eq!(
        context(0).err(),
        Some(CUDA_ERROR_UNKNOWN),
        "no new context on a lost GPU"
    );
    // GPU 1's context is untouched.
    current(other);
    all_fail_with(
        &calls(other_f, other_p, other_exec),
        CUDA_SUCCESS,
        "on the other GPU",
    );

    // The reset: the poisoned context stays poisoned; a new one works.
    node.fault(0, None);
    current(sick);
    all_fail_with(
        &calls(f, p, exec),
        CUDA_ERROR_LAUNCH_FAILED,
        "after the clear",
    );
    assert_eq!(destroy(sick), CUDA_SUCCESS);
    let fresh = context(0).unwrap();
    let fresh_f = kernel();
    let fresh_p = alloc().unwrap();
    let fresh_exec = graph();
    assert_eq!(launch(fresh_f, 1), CUDA_SUCCESS);
    all_fail_with(
        &calls(fresh_f, fresh_p, fresh_exec),
        CUDA_SUCCESS,
        "on a context made after the clear",
    );

    // Uncorrectable ECC, then an application error: the ECC error stays in effect (no new
    // context) and poisons the context that was there.
    let fresh_p = alloc().unwrap();
    node.fault(0, Some(48));
    node.fault(0, Some(13));
    assert_eq!(context(0).err(), Some(CUDA_ERROR_ECC_UNCORRECTABLE));
    current(fresh);
    all_fail_with(
        &calls(fresh_f, fresh_p, fresh_exec),
        CUDA_ERROR_ECC_UNCORRECTABLE,
        "after XIDs 48 and 13",
    );
    node.fault(0, None);
    current(fresh);
    assert_eq!(alloc().err(), Some(CUDA_ERROR_ECC_UNCORRECTABLE), "sticky");

    // A context that never put work on the GPU: off the bus, every call fails with
    // CUDA_ERROR_UNKNOWN, a launch included (the first error sticks).
    let idle = context(0).unwrap();
    let idle_f = kernel();
    node.fault(0, Some(79));
    current(idle);
    assert_eq!(alloc().err(), Some(CUDA_ERROR_UNKNOWN));
    assert_eq!(launch(idle_f, 1), CUDA_ERROR_UNKNOWN);
    // An XID that needs a reset but kills no context leaves contexts alone.
    node.fault(0, None);
    let calm = context(0).unwrap();
    node.fault(0, Some(119));
    current(calm);
    assert!(alloc().is_ok(), "XID 119 poisons no context");
    for c in [idle, calm, fresh, other] {
        assert_eq!(destroy(c), CUDA_SUCCESS);
    }
}
