//! Kernel and graph launches. Without a compute share the path is one atomic load of the
//! mode and one of the real entry point; with one, the launch goes through the pacer. Every
//! launch entry point, the deprecated `cuLaunch`/`cuLaunchGrid`/`cuLaunchGridAsync`
//! included, goes through [`launch`].

use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::Ordering::Relaxed;

use gpuslice_cuda_ffi::*;
use gpuslice_slice::usage::MAX_DEVICES;

use crate::guard::guard;
use crate::pacer;
use crate::state::{self, MODE, MODE_FAST, MODE_PACED};

/// The launch path once the mode is not `MODE_FAST`: `call` launches on `streams` (one
/// kernel each).
#[cold]
fn slow(streams: &[CUstream], per_thread: bool, call: impl FnOnce() -> CUresult) -> CUresult {
    if MODE.load(Relaxed) == state::MODE_UNKNOWN || MODE.load(Relaxed) == state::MODE_REFUSED {
        if let Err(r) = state::ready() {
            return r;
        }
    }
    match MODE.load(Relaxed) {
        MODE_PACED => pacer::paced_launch(streams, per_thread, call),
        _ => call(),
    }
}

#[inline(always)]
fn launch(stream: CUstream, per_thread: bool, call: impl FnOnce() -> CUresult) -> CUresult {
    if MODE.load(Relaxed) == MODE_FAST {
        return call();
    }
    slow(&[stream], per_thread, call)
}

macro_rules! launch_kernel {
    ($name:ident, $per_thread:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            f: CUfunction,
            gx: c_uint,
            gy: c_uint,
            gz: c_uint,
            bx: c_uint,
            by: c_uint,
            bz: c_uint,
            shared: c_uint,
            stream: CUstream,
            params: *mut *mut c_void,
            extra: *mut *mut c_void,
        ) -> CUresult {
            guard(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                let real = real!($name);
                // SAFETY: the caller's arguments, unchanged.
                launch(stream, $per_thread, || unsafe {
                    real(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra)
                })
            })
        }
    };
}
launch_kernel!(cuLaunchKernel, false);
launch_kernel!(cuLaunchKernel_ptsz, true);

macro_rules! launch_cooperative {
    ($name:ident, $per_thread:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            f: CUfunction,
            gx: c_uint,
            gy: c_uint,
            gz: c_uint,
            bx: c_uint,
            by: c_uint,
            bz: c_uint,
            shared: c_uint,
            stream: CUstream,
            params: *mut *mut c_void,
        ) -> CUresult {
            guard(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                let real = real!($name);
                // SAFETY: the caller's arguments, unchanged.
                launch(stream, $per_thread, || unsafe {
                    real(f, gx, gy, gz, bx, by, bz, shared, stream, params)
                })
            })
        }
    };
}
launch_cooperative!(cuLaunchCooperativeKernel, false);
launch_cooperative!(cuLaunchCooperativeKernel_ptsz, true);

macro_rules! launch_ex {
    ($name:ident, $per_thread:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            config: *const CUlaunchConfig,
            f: CUfunction,
            params: *mut *mut c_void,
            extra: *mut *mut c_void,
        ) -> CUresult {
            guard(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                let real = real!($name);
                if config.is_null() {
                    return CUDA_ERROR_INVALID_VALUE;
                }
                // SAFETY: checked non-null; the caller passes a valid config.
                let stream = unsafe { (*config).hStream };
                // SAFETY: the caller's arguments, unchanged.
                launch(stream, $per_thread, || unsafe {
                    real(config, f, params, extra)
                })
            })
        }
    };
}
launch_ex!(cuLaunchKernelEx, false);
launch_ex!(cuLaunchKernelEx_ptsz, true);

macro_rules! graph_launch {
    ($name:ident, $per_thread:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(exec: CUgraphExec, stream: CUstream) -> CUresult {
            guard(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                let real = real!($name);
                // SAFETY: the caller's arguments, unchanged.
                let r = launch(stream, $per_thread, || unsafe { real(exec, stream) });
                if r == CUDA_SUCCESS {
                    crate::hooks::graph::launched(exec);
                }
                r
            })
        }
    };
}
graph_launch!(cuGraphLaunch, false);
graph_launch!(cuGraphLaunch_ptsz, true);

/// `cuLaunchCooperativeKernelMultiDevice` (deprecated since CUDA 11.3, still exported): one
/// kernel per launch parameter, each on its own stream, so each paced on its stream's device.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchCooperativeKernelMultiDevice(
    params: *mut CUDA_LAUNCH_PARAMS,
    num_devices: c_uint,
    flags: c_uint,
) -> CUresult {
    guard(
        "cuLaunchCooperativeKernelMultiDevice",
        CUDA_ERROR_UNKNOWN,
        || {
            let real = real!(cuLaunchCooperativeKernelMultiDevice);
            // SAFETY: the caller's arguments, unchanged.
            let call = || unsafe { real(params, num_devices, flags) };
            if MODE.load(Relaxed) == MODE_FAST || params.is_null() || num_devices == 0 {
                return call();
            }
            // The devices must be distinct, and a slice has at most this many usable ones:
            // the driver would refuse, and the list is not read past what can be valid.
            if num_devices as usize > MAX_DEVICES {
                return CUDA_ERROR_INVALID_VALUE;
            }
            // SAFETY: the caller passes `num_devices` launch parameters at `params` (checked
            // non-null); only their streams are read.
            let list = unsafe { std::slice::from_raw_parts(params, num_devices as usize) };
            let mut streams = [std::ptr::null_mut(); MAX_DEVICES];
            for (s, p) in streams.iter_mut().zip(list) {
                *s = p.hStream;
            }
            slow(&streams[..list.len()], false, call)
        },
    )
}

// The deprecated launches (block shape and parameters set on the function beforehand). They
// have no per-thread variants: `cuLaunch` and `cuLaunchGrid` use the legacy default stream
// (null), `cuLaunchGridAsync` a null stream the same way.

#[no_mangle]
pub unsafe extern "C" fn cuLaunch(f: CUfunction) -> CUresult {
    guard("cuLaunch", CUDA_ERROR_UNKNOWN, || {
        let real = real!(cuLaunch);
        // SAFETY: the caller's argument, unchanged.
        launch(std::ptr::null_mut(), false, || unsafe { real(f) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchGrid(
    f: CUfunction,
    grid_width: c_int,
    grid_height: c_int,
) -> CUresult {
    guard("cuLaunchGrid", CUDA_ERROR_UNKNOWN, || {
        let real = real!(cuLaunchGrid);
        // SAFETY: the caller's arguments, unchanged.
        launch(std::ptr::null_mut(), false, || unsafe {
            real(f, grid_width, grid_height)
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchGridAsync(
    f: CUfunction,
    grid_width: c_int,
    grid_height: c_int,
    stream: CUstream,
) -> CUresult {
    guard("cuLaunchGridAsync", CUDA_ERROR_UNKNOWN, || {
        let real = real!(cuLaunchGridAsync);
        // SAFETY: the caller's arguments, unchanged.
        launch(stream, false, || unsafe {
            real(f, grid_width, grid_height, stream)
        })
    })
}
