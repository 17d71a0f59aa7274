//! The real driver libraries behind the shim: glibc's `dlsym` and `dlvsym` (found in libc's
//! symbol table, since the shim exports both names), handles of `libcuda.so.1` /
//! `libnvidia-ml.so.1`, and one cached, typed accessor per real entry point the interceptors
//! call.
//!
//! Symbols are looked up in the library's own handle, never in the global scope, so the
//! shim's exports of the same names are never found by mistake.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::ptr::null_mut;
use std::sync::atomic::{
    AtomicBool, AtomicPtr,
    Ordering::{Acquire, Relaxed, Release},
};

/// `dlsym`'s C signature.
pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
/// `dlvsym`'s C signature.
pub type DlvsymFn = unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char) -> *mut c_void;

/// One of glibc's `dl*` functions, found on first use and cached.
struct GlibcFn {
    name: &'static CStr,
    addr: AtomicPtr<c_void>,
    /// Whether "not found" has been logged (once per process).
    missing_logged: AtomicBool,
}

impl GlibcFn {
    const fn new(name: &'static CStr) -> GlibcFn {
        GlibcFn {
            name,
            addr: AtomicPtr::new(null_mut()),
            missing_logged: AtomicBool::new(false),
        }
    }

    /// The function's address, or null (logged once) when no loaded glibc object defines it.
    fn get(&self) -> *mut c_void {
        let p = self.addr.load(Acquire);
        if !p.is_null() {
            return p;
        }
        let p = crate::glibc::function(self.name);
        if p.is_null() {
            if !self.missing_logged.swap(true, Relaxed) {
                crate::log::warning!(
                    "glibc's {} not found in libc.so.6 or libdl.so.2: the shim answers it with null",
                    self.name.to_string_lossy()
                );
            }
        } else {
            self.addr.store(p, Release);
        }
        p
    }
}

static REAL_DLSYM: GlibcFn = GlibcFn::new(c"dlsym");
static REAL_DLVSYM: GlibcFn = GlibcFn::new(c"dlvsym");

/// glibc's `dlsym` (`dlsym@@GLIBC_2.34` in libc.so.6, or `dlsym@@GLIBC_2.2.5` in libdl.so.2).
pub fn real_dlsym() -> Option<DlsymFn> {
    let p = REAL_DLSYM.get();
    // SAFETY: a non-null p is glibc's dlsym, whose signature is DlsymFn.
    (!p.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(p) })
}

/// glibc's `dlvsym`, found as [`real_dlsym`] is.
pub fn real_dlvsym() -> Option<DlvsymFn> {
    let p = REAL_DLVSYM.get();
    // SAFETY: a non-null p is glibc's dlvsym, whose signature is DlvsymFn.
    (!p.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, DlvsymFn>(p) })
}

/// A real library, opened on first use.
pub struct Lib {
    soname: &'static CStr,
    handle: AtomicPtr<c_void>,
}

impl Lib {
    const fn new(soname: &'static CStr) -> Lib {
        Lib {
            soname,
            handle: AtomicPtr::new(null_mut()),
        }
    }

    /// The library's handle: the already loaded copy if there is one, else a fresh load.
    pub fn handle(&self) -> Option<*mut c_void> {
        let h = self.handle.load(Acquire);
        if !h.is_null() {
            return Some(h);
        }
        let flags: c_int = libc::RTLD_NOW | libc::RTLD_NODELETE;
        // SAFETY: dlopen with a constant NUL-terminated soname.
        let mut h = unsafe { libc::dlopen(self.soname.as_ptr(), flags | libc::RTLD_NOLOAD) };
        if h.is_null() {
            // SAFETY: as above.
            h = unsafe { libc::dlopen(self.soname.as_ptr(), flags) };
        }
        if h.is_null() {
            crate::log::warning!("cannot load {}", self.soname.to_string_lossy());
            return None;
        }
        self.handle.store(h, Release);
        Some(h)
    }

    /// The address of `name` in this library (not in the shim), or null.
    pub fn sym(&self, name: &CStr) -> *mut c_void {
        match (self.handle(), real_dlsym()) {
            // SAFETY: a live handle and a NUL-terminated name.
            (Some(h), Some(dlsym)) => unsafe { dlsym(h, name.as_ptr()) },
            _ => null_mut(),
        }
    }
}

/// The real CUDA driver.
pub static CUDA: Lib = Lib::new(c"libcuda.so.1");
/// The real NVML.
pub static NVML: Lib = Lib::new(c"libnvidia-ml.so.1");

/// Resolves `name` (NUL-terminated) in `lib` and caches it in `cache`; the slow path of
/// the accessors below.
#[cold]
#[inline(never)]
pub fn resolve_into(cache: &AtomicPtr<c_void>, lib: &Lib, name: &'static str) -> *mut c_void {
    let Ok(name) = CStr::from_bytes_with_nul(name.as_bytes()) else {
        return null_mut();
    };
    let p = lib.sym(name);
    if !p.is_null() {
        cache.store(p, Release);
    }
    p
}

/// Declares `pub fn <symbol>() -> Option<PFN>` for real entry points of a library: one
/// atomic load once resolved.
macro_rules! real_fns {
    ($lib:expr; $($name:ident : $pfn:ty;)*) => {$(
        #[allow(non_snake_case, dead_code)]
        #[inline(always)]
        pub fn $name() -> Option<$pfn> {
            static CACHE: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
            let mut p = CACHE.load(Acquire);
            if p.is_null() {
                p = resolve_into(&CACHE, &$lib, concat!(stringify!($name), "\0"));
                if p.is_null() {
                    return None;
                }
            }
            // SAFETY: the library exports this symbol with exactly the signature $pfn
            // (cuda-ffi declares PFN_<symbol> from the C headers).
            Some(unsafe { std::mem::transmute::<*mut c_void, $pfn>(p) })
        }
    )*};
}

/// Real CUDA driver entry points.
pub mod cu {
    use super::*;
    use gpuslice_cuda_ffi::*;

    real_fns! { CUDA;
        cuInit: PFN_cuInit;
        cuGetProcAddress: PFN_cuGetProcAddress;
        cuGetProcAddress_v2: PFN_cuGetProcAddress_v2;
        cuDeviceGet: PFN_cuDeviceGet;
        cuDeviceGetCount: PFN_cuDeviceGetCount;
        cuDeviceGetUuid: PFN_cuDeviceGetUuid;
        cuDeviceGetUuid_v2: PFN_cuDeviceGetUuid_v2;
        cuDeviceTotalMem: PFN_cuDeviceTotalMem;
        cuDeviceTotalMem_v2: PFN_cuDeviceTotalMem_v2;
        cuDevicePrimaryCtxRetain: PFN_cuDevicePrimaryCtxRetain;
        cuDevicePrimaryCtxRelease: PFN_cuDevicePrimaryCtxRelease;
        cuDevicePrimaryCtxRelease_v2: PFN_cuDevicePrimaryCtxRelease_v2;
        cuDevicePrimaryCtxReset: PFN_cuDevicePrimaryCtxReset;
        cuDevicePrimaryCtxReset_v2: PFN_cuDevicePrimaryCtxReset_v2;
        cuDevicePrimaryCtxGetState: PFN_cuDevicePrimaryCtxGetState;
        cuCtxCreate: PFN_cuCtxCreate_v2;
        cuCtxCreate_v2: PFN_cuCtxCreate_v2;
        cuCtxCreate_v3: PFN_cuCtxCreate_v3;
        cuCtxCreate_v4: PFN_cuCtxCreate_v4;
        cuCtxDestroy: PFN_cuCtxDestroy_v2;
        cuCtxDestroy_v2: PFN_cuCtxDestroy_v2;
        cuCtxGetCurrent: PFN_cuCtxGetCurrent;
        cuCtxGetDevice: PFN_cuCtxGetDevice;
        cuCtxPushCurrent_v2: PFN_cuCtxPushCurrent_v2;
        cuCtxPopCurrent_v2: PFN_cuCtxPopCurrent_v2;
        cuStreamGetCtx: PFN_cuStreamGetCtx;
        cuStreamGetCtx_ptsz: PFN_cuStreamGetCtx;
        cuCtxSetLimit: PFN_cuCtxSetLimit;
        cuCtxGetLimit: PFN_cuCtxGetLimit;
        cuDeviceGetMemPool: PFN_cuDeviceGetMemPool;
        cuDeviceGetDefaultMemPool: PFN_cuDeviceGetDefaultMemPool;
        cuDeviceGraphMemTrim: PFN_cuDeviceGraphMemTrim;
        cuDeviceGetGraphMemAttribute: PFN_cuDeviceGetGraphMemAttribute;
        cuMemPoolDestroy: PFN_cuMemPoolDestroy;
        cuMemPoolTrimTo: PFN_cuMemPoolTrimTo;
        cuMemPoolSetAttribute: PFN_cuMemPoolSetAttribute;
        cuMemPoolGetAttribute: PFN_cuMemPoolGetAttribute;
        cuGraphAddNode: PFN_cuGraphAddNode;
        cuGraphAddNode_v2: PFN_cuGraphAddNode_v2;
        cuGraphAddChildGraphNode: PFN_cuGraphAddChildGraphNode;
        cuGraphClone: PFN_cuGraphClone;
        cuStreamGetCaptureInfo_v2: PFN_cuStreamGetCaptureInfo_v2;
        cuStreamGetCaptureInfo_v2_ptsz: PFN_cuStreamGetCaptureInfo_v2_ptsz;
        cuMemGetInfo: PFN_cuMemGetInfo_v1;
        cuMemGetInfo_v2: PFN_cuMemGetInfo_v2;
        cuMemAlloc: PFN_cuMemAlloc_v1;
        cuMemAlloc_v2: PFN_cuMemAlloc_v2;
        cuMemAllocPitch: PFN_cuMemAllocPitch_v1;
        cuMemAllocPitch_v2: PFN_cuMemAllocPitch_v2;
        cuMemAllocManaged: PFN_cuMemAllocManaged;
        cuMemFree: PFN_cuMemFree_v1;
        cuMemFree_v2: PFN_cuMemFree_v2;
        cuMemAllocAsync: PFN_cuMemAllocAsync;
        cuMemAllocAsync_ptsz: PFN_cuMemAllocAsync_ptsz;
        cuMemFreeAsync: PFN_cuMemFreeAsync;
        cuMemFreeAsync_ptsz: PFN_cuMemFreeAsync_ptsz;
        cuMemPoolCreate: PFN_cuMemPoolCreate;
        cuMemAllocFromPoolAsync: PFN_cuMemAllocFromPoolAsync;
        cuMemAllocFromPoolAsync_ptsz: PFN_cuMemAllocFromPoolAsync_ptsz;
        cuMemCreate: PFN_cuMemCreate;
        cuMemRelease: PFN_cuMemRelease;
        cuMemMap: PFN_cuMemMap;
        cuMemUnmap: PFN_cuMemUnmap;
        cuMemRetainAllocationHandle: PFN_cuMemRetainAllocationHandle;
        cuMemMapArrayAsync: PFN_cuMemMapArrayAsync;
        cuMemMapArrayAsync_ptsz: PFN_cuMemMapArrayAsync;
        cuArrayCreate: PFN_cuArrayCreate_v1;
        cuArrayCreate_v2: PFN_cuArrayCreate_v2;
        cuArray3DCreate: PFN_cuArray3DCreate_v1;
        cuArray3DCreate_v2: PFN_cuArray3DCreate_v2;
        cuArrayDestroy: PFN_cuArrayDestroy;
        cuMipmappedArrayCreate: PFN_cuMipmappedArrayCreate;
        cuMipmappedArrayDestroy: PFN_cuMipmappedArrayDestroy;
        cuGraphAddMemAllocNode: PFN_cuGraphAddMemAllocNode;
        cuGraphAddMemFreeNode: PFN_cuGraphAddMemFreeNode;
        cuGraphInstantiate: PFN_cuGraphInstantiate;
        cuGraphInstantiate_v2: PFN_cuGraphInstantiate_v2;
        cuGraphInstantiateWithFlags: PFN_cuGraphInstantiateWithFlags;
        cuGraphInstantiateWithParams: PFN_cuGraphInstantiateWithParams;
        cuGraphInstantiateWithParams_ptsz: PFN_cuGraphInstantiateWithParams_ptsz;
        cuGraphExecDestroy: PFN_cuGraphExecDestroy;
        cuGraphDestroy: PFN_cuGraphDestroy;
        cuGraphLaunch: PFN_cuGraphLaunch;
        cuGraphLaunch_ptsz: PFN_cuGraphLaunch_ptsz;
        cuLaunchKernel: PFN_cuLaunchKernel;
        cuLaunchKernel_ptsz: PFN_cuLaunchKernel_ptsz;
        cuLaunchKernelEx: PFN_cuLaunchKernelEx;
        cuLaunchKernelEx_ptsz: PFN_cuLaunchKernelEx;
        cuLaunchCooperativeKernel: PFN_cuLaunchCooperativeKernel;
        cuLaunchCooperativeKernel_ptsz: PFN_cuLaunchCooperativeKernel;
        cuLaunchCooperativeKernelMultiDevice: PFN_cuLaunchCooperativeKernelMultiDevice;
        cuLaunch: PFN_cuLaunch;
        cuLaunchGrid: PFN_cuLaunchGrid;
        cuLaunchGridAsync: PFN_cuLaunchGridAsync;
        cuEventCreate: PFN_cuEventCreate;
        cuEventRecord: PFN_cuEventRecord;
        cuEventRecord_ptsz: PFN_cuEventRecord_ptsz;
        cuEventQuery: PFN_cuEventQuery;
        cuEventSynchronize: PFN_cuEventSynchronize;
        cuEventElapsedTime: PFN_cuEventElapsedTime;
        cuEventDestroy_v2: PFN_cuEventDestroy_v2;
        cuStreamIsCapturing: PFN_cuStreamIsCapturing;
        cuStreamIsCapturing_ptsz: PFN_cuStreamIsCapturing_ptsz;
    }
}

/// Real NVML entry points.
pub mod nvml {
    use super::*;
    use gpuslice_cuda_ffi::nvml::*;

    real_fns! { NVML;
        nvmlInit_v2: PFN_nvmlInit_v2;
        nvmlDeviceGetHandleByUUID: PFN_nvmlDeviceGetHandleByUUID;
        nvmlDeviceGetComputeRunningProcesses: PFN_nvmlProcesses_v1;
        nvmlDeviceGetComputeRunningProcesses_v2: PFN_nvmlProcesses_v2;
        nvmlDeviceGetComputeRunningProcesses_v3: PFN_nvmlProcesses_v2;
        nvmlDeviceGetGraphicsRunningProcesses: PFN_nvmlProcesses_v1;
        nvmlDeviceGetGraphicsRunningProcesses_v2: PFN_nvmlProcesses_v2;
        nvmlDeviceGetGraphicsRunningProcesses_v3: PFN_nvmlProcesses_v2;
        nvmlDeviceGetMPSComputeRunningProcesses: PFN_nvmlProcesses_v1;
        nvmlDeviceGetMPSComputeRunningProcesses_v2: PFN_nvmlProcesses_v2;
        nvmlDeviceGetMPSComputeRunningProcesses_v3: PFN_nvmlProcesses_v2;
        nvmlDeviceGetMemoryInfo: PFN_nvmlDeviceGetMemoryInfo;
        nvmlDeviceGetMemoryInfo_v2: PFN_nvmlDeviceGetMemoryInfo_v2;
        nvmlDeviceGetUUID: PFN_nvmlDeviceGetUUID;
    }
}
