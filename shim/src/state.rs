//! The shim's state, built lazily on the first intercepted CUDA or NVML call (nothing runs at
//! load, so programs that never touch CUDA pay nothing): the slice (limits and the mapped
//! usage file) and the map from CUDA devices to limits entries by UUID.

use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
use std::sync::OnceLock;

use gpuslice_cuda_ffi::*;
use gpuslice_slice::usage::{ProcessIdentity, UsageError, UsageFile};
use gpuslice_slice::{DeviceLimit, Limits, LimitsError, CONTAINER_LIMITS, CONTAINER_USAGE};

use crate::locate::{locate, LocateError, SlicePaths, DIR_ENV};
use crate::log::{error, info, warning};
use crate::real::cu;

/// Why the shim refuses to let CUDA start.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error(transparent)]
    Locate(#[from] LocateError),
    #[error("{0}; refusing CUDA initialisation")]
    Limits(#[from] LimitsError),
    #[error("{0}; refusing CUDA initialisation")]
    Usage(#[from] UsageError),
}

/// The slice this process belongs to.
#[derive(Debug)]
pub struct Slice {
    pub paths: SlicePaths,
    pub limits: Limits,
    pub usage: UsageFile,
}

impl Slice {
    /// The limits entry with index `idx`.
    pub fn device(&self, idx: usize) -> Option<&DeviceLimit> {
        self.limits.devices.get(idx)
    }
}

static SLICE: OnceLock<Option<Slice>> = OnceLock::new();

fn load() -> Result<Slice, StateError> {
    let paths = locate(
        Path::new(CONTAINER_LIMITS),
        Path::new(CONTAINER_USAGE),
        std::env::var_os(DIR_ENV),
    )?;
    let limits = Limits::read(&paths.limits)?;
    let usage = UsageFile::open(&paths.usage, ProcessIdentity::current(Path::new("/proc")))?;
    Ok(Slice {
        paths,
        limits,
        usage,
    })
}

/// The slice, or `None` (logged once) when there is none to enforce.
pub fn slice() -> Option<&'static Slice> {
    SLICE
        .get_or_init(|| match load() {
            Ok(s) => {
                info!(
                    "slice {} from {} (usage {}, slot {:?})",
                    s.limits.reservation,
                    s.paths.limits.display(),
                    s.paths.usage.display(),
                    s.usage.slot_index()
                );
                register_atfork();
                Some(s)
            }
            Err(e) => {
                error!("{e}");
                None
            }
        })
        .as_ref()
}

/// CUDA devices of this process and their limits entries.
#[derive(Debug)]
pub struct Devices {
    map: Vec<(CUdevice, Option<usize>)>,
}

impl Devices {
    /// The limits index of CUDA device `dev`; `None` when its UUID has no entry.
    pub fn index(&self, dev: CUdevice) -> Option<usize> {
        self.map
            .iter()
            .find(|(d, _)| *d == dev)
            .and_then(|(_, i)| *i)
    }

    /// The CUDA device of limits index `idx`, if one has it.
    pub fn cuda_device(&self, idx: usize) -> Option<CUdevice> {
        self.map
            .iter()
            .find(|(_, i)| *i == Some(idx))
            .map(|(d, _)| *d)
    }
}

static DEVICES: OnceLock<Devices> = OnceLock::new();

/// Launch-path mode: not yet known, ready without pacing, ready with pacing, refused.
pub static MODE: AtomicU8 = AtomicU8::new(MODE_UNKNOWN);
pub const MODE_UNKNOWN: u8 = 0;
pub const MODE_FAST: u8 = 1;
pub const MODE_PACED: u8 = 2;
pub const MODE_REFUSED: u8 = 3;

fn device_uuid(dev: CUdevice) -> Option<String> {
    let mut u = CUuuid::default();
    let f = cu::cuDeviceGetUuid_v2().or_else(cu::cuDeviceGetUuid)?;
    // SAFETY: a valid out pointer and a device handle from cuDeviceGet.
    let r = unsafe { f(&mut u, dev) };
    (r == CUDA_SUCCESS).then(|| u.to_gpu_string())
}

fn build_devices(slice: &Slice) -> Devices {
    let mut map = Vec::new();
    let mut count = 0;
    if let (Some(get_count), Some(get)) = (cu::cuDeviceGetCount(), cu::cuDeviceGet()) {
        // SAFETY: valid out pointer; the driver is initialised.
        if unsafe { get_count(&mut count) } != CUDA_SUCCESS {
            count = 0;
        }
        for ordinal in 0..count {
            let mut dev: CUdevice = 0;
            // SAFETY: valid out pointer, ordinal below the count.
            if unsafe { get(&mut dev, ordinal) } != CUDA_SUCCESS {
                continue;
            }
            let uuid = device_uuid(dev);
            let idx = uuid.as_deref().and_then(|u| {
                slice
                    .limits
                    .devices
                    .iter()
                    .position(|d| d.uuid.eq_ignore_ascii_case(u))
            });
            match (idx, &uuid) {
                (Some(i), Some(u)) => {
                    let d = &slice.limits.devices[i];
                    info!(
                        "device {ordinal} {u}: memory limit {} bytes, cores {}",
                        d.memory_limit, d.cores
                    );
                }
                (None, u) => warning!(
                    "device {ordinal} {}: no entry in {}; the device is not usable",
                    u.as_deref().unwrap_or("(uuid unknown)"),
                    slice.paths.limits.display()
                ),
                _ => {}
            }
            map.push((dev, idx));
        }
    }
    Devices { map }
}

/// The device map, if it was built ([`ready`]).
pub fn devices() -> Option<&'static Devices> {
    DEVICES.get()
}

/// The slice and device map, initialising the real driver if the program has not called
/// `cuInit` through us yet. Errors are the `CUresult` to return to the caller.
pub fn ready() -> Result<(&'static Slice, &'static Devices), CUresult> {
    let Some(slice) = slice() else {
        MODE.store(MODE_REFUSED, Relaxed);
        return Err(CUDA_ERROR_NOT_INITIALIZED);
    };
    if let Some(d) = DEVICES.get() {
        return Ok((slice, d));
    }
    let init = cu::cuInit().ok_or(CUDA_ERROR_NOT_INITIALIZED)?;
    // SAFETY: cuInit(0) is always valid to call and idempotent.
    let r = unsafe { init(0) };
    if r != CUDA_SUCCESS {
        return Err(r);
    }
    let devices = DEVICES.get_or_init(|| build_devices(slice));
    let paced = slice
        .limits
        .devices
        .iter()
        .any(|d| d.cores > 0 && d.cores < 100);
    MODE.store(if paced { MODE_PACED } else { MODE_FAST }, Relaxed);
    Ok((slice, devices))
}

/// The device of the calling thread's current context.
pub fn current_device() -> Result<CUdevice, CUresult> {
    let f = cu::cuCtxGetDevice().ok_or(CUDA_ERROR_NOT_INITIALIZED)?;
    let mut dev: CUdevice = 0;
    // SAFETY: valid out pointer.
    let r = unsafe { f(&mut dev) };
    if r == CUDA_SUCCESS {
        Ok(dev)
    } else {
        Err(r)
    }
}

/// The device and context of `stream`, which a stream-ordered allocation on it comes from
/// (the driver allocates from the pool current to the stream's device, whatever context is
/// current), and the calling thread's current context, read on the way. Default streams
/// (null, legacy, per-thread) belong to the current context.
pub fn stream_device(
    stream: CUstream,
    per_thread: bool,
) -> Result<(CUdevice, CUcontext, CUcontext), CUresult> {
    let current = current_context();
    if stream.is_null() || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD {
        return Ok((current_device()?, current, current));
    }
    let get = if per_thread {
        cu::cuStreamGetCtx_ptsz()
    } else {
        cu::cuStreamGetCtx()
    };
    let (Some(get), Some(push), Some(pop)) =
        (get, cu::cuCtxPushCurrent_v2(), cu::cuCtxPopCurrent_v2())
    else {
        return Ok((current_device()?, current, current));
    };
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: the caller's stream and a valid out pointer.
    let r = unsafe { get(stream, &mut ctx) };
    if r != CUDA_SUCCESS {
        return Err(r);
    }
    if ctx.is_null() || ctx == current {
        return Ok((current_device()?, current, current));
    }
    // SAFETY: a context the driver just named; it is popped again below.
    let r = unsafe { push(ctx) };
    if r != CUDA_SUCCESS {
        return Err(r);
    }
    let dev = current_device();
    let mut popped: CUcontext = std::ptr::null_mut();
    // SAFETY: pops the context pushed above; valid out pointer.
    unsafe { pop(&mut popped) };
    Ok((dev?, ctx, current))
}

/// The calling thread's current context (null when none).
pub fn current_context() -> CUcontext {
    let mut ctx: CUcontext = std::ptr::null_mut();
    if let Some(f) = cu::cuCtxGetCurrent() {
        // SAFETY: valid out pointer.
        unsafe { f(&mut ctx) };
    }
    ctx
}

extern "C" fn after_fork_in_child() {
    if let Some(Some(s)) = SLICE.get() {
        s.usage.forget_after_fork();
    }
    crate::account::reset_in_child();
    crate::pacer::reset_in_child();
    crate::hooks::pools::reset_in_child();
    crate::hooks::vmm::reset_in_child();
    crate::hooks::context::reset_in_child();
    crate::hooks::graph::reset_in_child();
    crate::hooks::nvml::reset_in_child();
    crate::overhead::reset_in_child();
}

fn register_atfork() {
    // SAFETY: registering a plain extern "C" handler; it runs in the child only.
    let r = unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
    if r != 0 {
        error!("pthread_atfork failed ({r}); a forked child would share its parent's usage slot");
    }
}
