//! The driver as the CUDA runtime reaches it: `dlopen("libcuda.so.1")`, then every entry
//! point by base name and version through `cuGetProcAddress` (or, for comparison, by
//! versioned name through `dlsym` on the handle or in global scope, or `dlvsym`). Thin
//! wrappers turn each call's status into a `Result` naming the call.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use gpuslice_cuda_ffi::*;

use crate::dl::{as_fn, global_sym, Library};
use crate::error::{check, ProbeError};

/// How entry points are resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Resolve {
    /// `cuGetProcAddress` (CUDA 11.3+), what 11.x runtimes use.
    Proc,
    /// `cuGetProcAddress_v2` (CUDA 12.0+), what 12.x runtimes use.
    Proc2,
    /// `dlsym(handle, versioned name)`.
    Dlsym,
    /// `dlsym(RTLD_DEFAULT, versioned name)`, as a program linked with `-lcuda` binds.
    Default,
    /// `dlvsym(handle, versioned name, "GPUSLICE_PROBE")`: a version no driver defines, which
    /// glibc accepts only from a library without symbol versions.
    Dlvsym,
}

impl Resolve {
    pub fn as_str(self) -> &'static str {
        match self {
            Resolve::Proc => "proc",
            Resolve::Proc2 => "proc2",
            Resolve::Dlsym => "dlsym",
            Resolve::Default => "default",
            Resolve::Dlvsym => "dlvsym",
        }
    }
}

/// A loaded driver and its resolver.
pub struct Cuda {
    lib: Library,
    pub resolve: Resolve,
    pub version: i32,
    get_proc: Option<PFN_cuGetProcAddress>,
    get_proc2: Option<PFN_cuGetProcAddress_v2>,
    cache: RefCell<HashMap<&'static str, *mut c_void>>,
}

impl Cuda {
    /// Loads `lib` and prepares resolution with `resolve` for CUDA `version`.
    pub fn load(lib: &str, resolve: Resolve, version: i32) -> Result<Cuda, ProbeError> {
        let lib = Library::open(lib)?;
        let missing = |symbol: &str| ProbeError::NoEntry {
            lib: lib.name.clone(),
            symbol: symbol.into(),
            mode: resolve.as_str(),
        };
        let (mut get_proc, mut get_proc2) = (None, None);
        match resolve {
            Resolve::Proc => {
                // SAFETY: the driver exports cuGetProcAddress with the 11.3 signature.
                get_proc = Some(unsafe {
                    as_fn(
                        lib.sym("cuGetProcAddress")
                            .ok_or_else(|| missing("cuGetProcAddress"))?,
                    )
                })
            }
            Resolve::Proc2 => {
                // SAFETY: the driver exports cuGetProcAddress_v2 with the 12.0 signature.
                get_proc2 = Some(unsafe {
                    as_fn(
                        lib.sym("cuGetProcAddress_v2")
                            .ok_or_else(|| missing("cuGetProcAddress_v2"))?,
                    )
                })
            }
            Resolve::Dlsym | Resolve::Default | Resolve::Dlvsym => {}
        }
        Ok(Cuda {
            lib,
            resolve,
            version,
            get_proc,
            get_proc2,
            cache: RefCell::new(HashMap::new()),
        })
    }

    /// The address of base entry point `name`, resolved for this version and mode.
    pub fn ptr(&self, name: &'static str) -> Result<*mut c_void, ProbeError> {
        if let Some(p) = self.cache.borrow().get(name) {
            return Ok(*p);
        }
        let fail = |detail: String| ProbeError::Resolve {
            name: name.into(),
            version: self.version,
            how: self.resolve.as_str().into(),
            detail,
        };
        let cname = std::ffi::CString::new(name).map_err(|_| fail("name contains NUL".into()))?;
        let mut p: *mut c_void = std::ptr::null_mut();
        match (self.resolve, self.get_proc, self.get_proc2) {
            (Resolve::Proc, Some(f), _) => {
                // SAFETY: f is cuGetProcAddress; valid C string and out-pointer.
                let r = unsafe {
                    f(
                        cname.as_ptr(),
                        &mut p,
                        self.version,
                        CU_GET_PROC_ADDRESS_DEFAULT,
                    )
                };
                check("cuGetProcAddress", r).map_err(|e| fail(e.to_string()))?;
            }
            (Resolve::Proc2, _, Some(f)) => {
                let mut status: CUdriverProcAddressQueryResult = 0;
                // SAFETY: f is cuGetProcAddress_v2; valid C string and out-pointers.
                let r = unsafe {
                    f(
                        cname.as_ptr(),
                        &mut p,
                        self.version,
                        CU_GET_PROC_ADDRESS_DEFAULT,
                        &mut status,
                    )
                };
                check("cuGetProcAddress_v2", r)
                    .map_err(|e| fail(format!("{e} (symbol status {status})")))?;
            }
            _ => {
                let symbol =
                    procaddr::resolve(name, self.version, 0).map_err(|e| fail(format!("{e:?}")))?;
                let found = match self.resolve {
                    Resolve::Default => global_sym(symbol),
                    Resolve::Dlvsym => self.lib.vsym(symbol, "GPUSLICE_PROBE"),
                    _ => self.lib.sym(symbol),
                };
                p = found
                    .ok_or_else(|| fail(format!("{} has no symbol {symbol}", self.lib.name)))?;
            }
        }
        if p.is_null() {
            return Err(fail("resolved to a null address".into()));
        }
        self.cache.borrow_mut().insert(name, p);
        Ok(p)
    }

    /// Exported symbol `symbol` looked up with `dlsym` on the library (not by base name), as
    /// type `F`.
    ///
    /// # Safety
    /// `F` must be the signature of that exported symbol.
    pub unsafe fn exact<F: Copy>(&self, symbol: &'static str) -> Result<F, ProbeError> {
        let p = self.lib.sym(symbol).ok_or_else(|| ProbeError::Resolve {
            name: symbol.into(),
            version: self.version,
            how: "dlsym".into(),
            detail: format!("{} has no symbol {symbol}", self.lib.name),
        })?;
        // SAFETY: forwarded to the caller.
        Ok(unsafe { as_fn(p) })
    }

    /// Base entry point `name` as function type `F`.
    ///
    /// # Safety
    /// `F` must be the signature of what `name` resolves to for this version.
    pub unsafe fn f<F: Copy>(&self, name: &'static str) -> Result<F, ProbeError> {
        // SAFETY: forwarded to the caller.
        Ok(unsafe { as_fn(self.ptr(name)?) })
    }
}

/// Calls a resolved entry point and checks its status: `call!(cuda, cuMemAlloc: PFN_cuMemAlloc_v2, args..)`.
macro_rules! call {
    ($cuda:expr, $name:ident : $ty:ty $(, $arg:expr)* $(,)?) => {
        // SAFETY: `$ty` is the signature the driver returns for this base name at the
        // versions the probe accepts (11.3+).
        match unsafe { $cuda.f::<$ty>(stringify!($name)) } {
            // SAFETY: the arguments follow the driver API for this entry point.
            Ok(f) => $crate::error::check(stringify!($name), unsafe { f($($arg),*) }),
            Err(e) => Err(e),
        }
    };
}
pub(crate) use call;

/// A device with its primary context made current, as the runtime sets it up.
pub struct Device {
    pub ordinal: CUdevice,
}

impl Cuda {
    /// `cuInit(0)`.
    pub fn init(&self) -> Result<(), ProbeError> {
        call!(self, cuInit: PFN_cuInit, 0)
    }

    pub fn driver_version(&self) -> Result<i32, ProbeError> {
        let mut v = 0;
        call!(self, cuDriverGetVersion: PFN_cuDriverGetVersion, &mut v)?;
        Ok(v)
    }

    pub fn device_count(&self) -> Result<i32, ProbeError> {
        let mut n = 0;
        call!(self, cuDeviceGetCount: PFN_cuDeviceGetCount, &mut n)?;
        Ok(n)
    }

    /// Gets device `ordinal`, retains its primary context and makes it current.
    pub fn open_device(&self, ordinal: i32) -> Result<Device, ProbeError> {
        let mut dev: CUdevice = 0;
        call!(self, cuDeviceGet: PFN_cuDeviceGet, &mut dev, ordinal)?;
        let mut ctx: CUcontext = std::ptr::null_mut();
        call!(self, cuDevicePrimaryCtxRetain: PFN_cuDevicePrimaryCtxRetain, &mut ctx, dev)?;
        call!(self, cuCtxSetCurrent: PFN_cuCtxSetCurrent, ctx)?;
        Ok(Device { ordinal: dev })
    }

    /// Creates a context on `dev` with `cuCtxCreate` (which pushes it: it becomes current).
    pub fn context_create(&self, dev: &Device) -> Result<CUcontext, ProbeError> {
        let mut c: CUcontext = std::ptr::null_mut();
        // The probe claims CUDA 11.4 or later here: `cuCtxCreate` resolves to `_v3`.
        if self.version >= 11040 {
            call!(self, cuCtxCreate: PFN_cuCtxCreate_v3, &mut c, std::ptr::null_mut(), 0, 0, dev.ordinal)?;
        } else {
            call!(self, cuCtxCreate: PFN_cuCtxCreate_v2, &mut c, 0, dev.ordinal)?;
        }
        Ok(c)
    }

    pub fn name(&self, dev: &Device) -> Result<String, ProbeError> {
        let mut buf = [0 as c_char; 256];
        call!(self, cuDeviceGetName: PFN_cuDeviceGetName, buf.as_mut_ptr(), buf.len() as c_int, dev.ordinal)?;
        // SAFETY: the driver NUL-terminates within the buffer; the last byte is still 0.
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    pub fn uuid(&self, dev: &Device) -> Result<String, ProbeError> {
        let mut u = CUuuid::default();
        call!(self, cuDeviceGetUuid: PFN_cuDeviceGetUuid, &mut u, dev.ordinal)?;
        Ok(u.to_gpu_string())
    }

    pub fn total_mem(&self, dev: &Device) -> Result<u64, ProbeError> {
        let mut b = 0usize;
        call!(self, cuDeviceTotalMem: PFN_cuDeviceTotalMem_v2, &mut b, dev.ordinal)?;
        Ok(b as u64)
    }

    pub fn attribute(&self, dev: &Device, attr: CUdevice_attribute) -> Result<i32, ProbeError> {
        let mut v = 0;
        call!(self, cuDeviceGetAttribute: PFN_cuDeviceGetAttribute, &mut v, attr, dev.ordinal)?;
        Ok(v)
    }

    /// `cuMemGetInfo`: (free, total) for the current context's device.
    pub fn mem_info(&self) -> Result<(u64, u64), ProbeError> {
        let (mut free, mut total) = (0usize, 0usize);
        call!(self, cuMemGetInfo: PFN_cuMemGetInfo_v2, &mut free, &mut total)?;
        Ok((free as u64, total as u64))
    }

    pub fn stream_create(&self) -> Result<CUstream, ProbeError> {
        let mut s: CUstream = std::ptr::null_mut();
        call!(self, cuStreamCreate: PFN_cuStreamCreate, &mut s, CU_STREAM_NON_BLOCKING)?;
        Ok(s)
    }

    pub fn stream_sync(&self, s: CUstream) -> Result<(), ProbeError> {
        call!(self, cuStreamSynchronize: PFN_cuStreamSynchronize, s)
    }

    pub fn stream_destroy(&self, s: CUstream) -> Result<(), ProbeError> {
        call!(self, cuStreamDestroy: PFN_cuStreamDestroy_v2, s)
    }

    pub fn event_create(&self) -> Result<CUevent, ProbeError> {
        let mut e: CUevent = std::ptr::null_mut();
        call!(self, cuEventCreate: PFN_cuEventCreate, &mut e, CU_EVENT_DEFAULT)?;
        Ok(e)
    }

    pub fn event_record(&self, e: CUevent, s: CUstream) -> Result<(), ProbeError> {
        call!(self, cuEventRecord: PFN_cuEventRecord, e, s)
    }

    pub fn event_sync(&self, e: CUevent) -> Result<(), ProbeError> {
        call!(self, cuEventSynchronize: PFN_cuEventSynchronize, e)
    }

    pub fn event_elapsed_ms(&self, a: CUevent, b: CUevent) -> Result<f32, ProbeError> {
        let mut ms = 0f32;
        call!(self, cuEventElapsedTime: PFN_cuEventElapsedTime, &mut ms, a, b)?;
        Ok(ms)
    }

    pub fn event_destroy(&self, e: CUevent) -> Result<(), ProbeError> {
        call!(self, cuEventDestroy: PFN_cuEventDestroy_v2, e)
    }

    /// Loads the embedded PTX and returns `gpuslice_spin`.
    pub fn spin_kernel(&self) -> Result<CUfunction, ProbeError> {
        let mut m: CUmodule = std::ptr::null_mut();
        call!(self, cuModuleLoadData: PFN_cuModuleLoadData, &mut m, crate::ptx::SPIN_PTX.as_ptr().cast())?;
        let mut f: CUfunction = std::ptr::null_mut();
        call!(self, cuModuleGetFunction: PFN_cuModuleGetFunction, &mut f, m, crate::ptx::SPIN_NAME.as_ptr())?;
        Ok(f)
    }

    /// The raw `cuLaunchKernel` pointer (for timing the call alone).
    pub fn launch_fn(&self) -> Result<PFN_cuLaunchKernel, ProbeError> {
        // SAFETY: cuLaunchKernel (and its _ptsz variant) has this signature at every version.
        unsafe { self.f("cuLaunchKernel") }
    }
}

/// `gpuslice_spin(cycles)` made ready to launch as one block of one thread through one
/// launch entry point (`burn --launch`).
pub enum SpinLauncher {
    Kernel(PFN_cuLaunchKernel),
    GridAsync(PFN_cuLaunchGridAsync),
    Grid(PFN_cuLaunchGrid),
    Legacy(PFN_cuLaunch),
    MultiDevice(PFN_cuLaunchCooperativeKernelMultiDevice),
}

impl Cuda {
    /// Resolves `api` for kernel `f`; for the deprecated launches, sets the block shape
    /// (1×1×1) and the one `u64` parameter, `cycles`, on the function first.
    pub fn spin_launcher(
        &self,
        api: crate::cli::LaunchApi,
        f: CUfunction,
        cycles: u64,
    ) -> Result<SpinLauncher, ProbeError> {
        use crate::cli::LaunchApi;
        if matches!(
            api,
            LaunchApi::GridAsync | LaunchApi::Grid | LaunchApi::Legacy
        ) {
            let mut arg = cycles;
            let size = std::mem::size_of::<u64>() as c_uint;
            call!(self, cuFuncSetBlockShape: PFN_cuFuncSetBlockShape, f, 1, 1, 1)?;
            call!(self, cuParamSetv: PFN_cuParamSetv, f, 0, (&mut arg as *mut u64).cast(), size)?;
            call!(self, cuParamSetSize: PFN_cuParamSetSize, f, size)?;
        }
        // SAFETY: each base name resolves to a symbol of this signature at every version.
        Ok(unsafe {
            match api {
                LaunchApi::Kernel => SpinLauncher::Kernel(self.f("cuLaunchKernel")?),
                LaunchApi::GridAsync => SpinLauncher::GridAsync(self.f("cuLaunchGridAsync")?),
                LaunchApi::Grid => SpinLauncher::Grid(self.f("cuLaunchGrid")?),
                LaunchApi::Legacy => SpinLauncher::Legacy(self.f("cuLaunch")?),
                LaunchApi::MultiDevice => {
                    SpinLauncher::MultiDevice(self.f("cuLaunchCooperativeKernelMultiDevice")?)
                }
            }
        })
    }
}

impl SpinLauncher {
    /// Launches `f` (set up by [`Cuda::spin_launcher`] with `cycles`) on `stream`; the
    /// deprecated `cuLaunchGrid` and `cuLaunch` always use the legacy default stream.
    pub fn launch(&self, f: CUfunction, stream: CUstream, cycles: u64) -> CUresult {
        match *self {
            SpinLauncher::Kernel(l) => launch_spin(l, f, stream, cycles),
            // SAFETY: the function's block shape and parameters were set beforehand.
            SpinLauncher::GridAsync(l) => unsafe { l(f, 1, 1, stream) },
            // SAFETY: as above.
            SpinLauncher::Grid(l) => unsafe { l(f, 1, 1) },
            // SAFETY: as above.
            SpinLauncher::Legacy(l) => unsafe { l(f) },
            SpinLauncher::MultiDevice(l) => {
                let mut arg = cycles;
                let mut args = [(&mut arg as *mut u64).cast::<c_void>()];
                let mut one = CUDA_LAUNCH_PARAMS {
                    function: f,
                    gridDimX: 1,
                    gridDimY: 1,
                    gridDimZ: 1,
                    blockDimX: 1,
                    blockDimY: 1,
                    blockDimZ: 1,
                    sharedMemBytes: 0,
                    hStream: stream,
                    kernelParams: args.as_mut_ptr(),
                };
                // SAFETY: one launch parameter for a kernel taking one u64, no flags.
                unsafe { l(&mut one, 1, 0) }
            }
        }
    }

    /// Whether launches ignore the stream and go to the legacy default stream.
    pub fn default_stream_only(&self) -> bool {
        matches!(self, SpinLauncher::Grid(_) | SpinLauncher::Legacy(_))
    }
}

/// Launches `gpuslice_spin(cycles)` as one block of one thread on `stream`.
pub fn launch_spin(
    launch: PFN_cuLaunchKernel,
    f: CUfunction,
    stream: CUstream,
    cycles: u64,
) -> CUresult {
    let mut arg = cycles;
    let mut params = [(&mut arg as *mut u64).cast::<c_void>()];
    // SAFETY: a kernel taking one u64, its parameter array, no extra options.
    unsafe {
        launch(
            f,
            1,
            1,
            1,
            1,
            1,
            1,
            0 as c_uint,
            stream,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }
}
