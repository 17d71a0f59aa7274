//! Function-pointer types of the driver entry points gpuslice implements (sim), intercepts
//! (shim) or calls (probe). Each is named `PFN_<exported symbol>` and has exactly the C
//! signature of that exported symbol, so a pointer from `dlsym` or `cuGetProcAddress` for
//! that symbol can be transmuted to it.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};

use crate::result::CUresult;
use crate::types::*;

macro_rules! pfns {
    ($($(#[$m:meta])* $name:ident ( $($arg:ty),* $(,)? );)*) => {$(
        #[doc = concat!("Signature of the exported symbol named after `PFN_`: `", stringify!($name), "`.")]
        $(#[$m])*
        pub type $name = unsafe extern "C" fn($($arg),*) -> CUresult;
    )*};
}

pfns! {
    // Initialisation, version, errors.
    PFN_cuInit(c_uint);
    PFN_cuDriverGetVersion(*mut c_int);
    PFN_cuGetErrorName(CUresult, *mut *const c_char);
    PFN_cuGetErrorString(CUresult, *mut *const c_char);
    PFN_cuGetProcAddress(*const c_char, *mut *mut c_void, c_int, cuuint64_t);
    PFN_cuGetProcAddress_v2(
        *const c_char,
        *mut *mut c_void,
        c_int,
        cuuint64_t,
        *mut CUdriverProcAddressQueryResult,
    );

    // Devices.
    PFN_cuDeviceGet(*mut CUdevice, c_int);
    PFN_cuDeviceGetCount(*mut c_int);
    PFN_cuDeviceGetName(*mut c_char, c_int, CUdevice);
    PFN_cuDeviceGetUuid(*mut CUuuid, CUdevice);
    PFN_cuDeviceGetUuid_v2(*mut CUuuid, CUdevice);
    /// The pre-3.2 form: a 32-bit byte count.
    PFN_cuDeviceTotalMem(*mut c_uint, CUdevice);
    PFN_cuDeviceTotalMem_v2(*mut usize, CUdevice);
    PFN_cuDeviceGetAttribute(*mut c_int, CUdevice_attribute, CUdevice);
    PFN_cuDeviceGetPCIBusId(*mut c_char, c_int, CUdevice);
    PFN_cuDeviceGetByPCIBusId(*mut CUdevice, *const c_char);
    PFN_cuDeviceGetDefaultMemPool(*mut CUmemoryPool, CUdevice);
    PFN_cuDeviceGetMemPool(*mut CUmemoryPool, CUdevice);
    PFN_cuDeviceGraphMemTrim(CUdevice);
    PFN_cuDeviceGetGraphMemAttribute(CUdevice, CUgraphMem_attribute, *mut c_void);
    PFN_cuDeviceSetGraphMemAttribute(CUdevice, CUgraphMem_attribute, *mut c_void);

    // Primary contexts.
    PFN_cuDevicePrimaryCtxRetain(*mut CUcontext, CUdevice);
    PFN_cuDevicePrimaryCtxRelease(CUdevice);
    PFN_cuDevicePrimaryCtxRelease_v2(CUdevice);
    PFN_cuDevicePrimaryCtxReset(CUdevice);
    PFN_cuDevicePrimaryCtxReset_v2(CUdevice);
    PFN_cuDevicePrimaryCtxGetState(CUdevice, *mut c_uint, *mut c_int);
    PFN_cuDevicePrimaryCtxSetFlags(CUdevice, c_uint);
    PFN_cuDevicePrimaryCtxSetFlags_v2(CUdevice, c_uint);

    // Contexts.
    PFN_cuCtxCreate_v2(*mut CUcontext, c_uint, CUdevice);
    PFN_cuCtxCreate_v3(*mut CUcontext, *mut CUexecAffinityParam, c_int, c_uint, CUdevice);
    PFN_cuCtxCreate_v4(*mut CUcontext, *mut CUctxCreateParams, c_uint, CUdevice);
    PFN_cuCtxDestroy_v2(CUcontext);
    PFN_cuCtxSetCurrent(CUcontext);
    PFN_cuCtxGetCurrent(*mut CUcontext);
    PFN_cuCtxPushCurrent_v2(CUcontext);
    PFN_cuCtxPopCurrent_v2(*mut CUcontext);
    PFN_cuCtxGetDevice(*mut CUdevice);
    PFN_cuCtxSynchronize();
    PFN_cuCtxSetLimit(CUlimit, usize);
    PFN_cuCtxGetLimit(*mut usize, CUlimit);

    // Memory: linear, pitched, managed.
    PFN_cuMemGetInfo_v2(*mut usize, *mut usize);
    PFN_cuMemAlloc_v2(*mut CUdeviceptr, usize);
    PFN_cuMemAllocPitch_v2(*mut CUdeviceptr, *mut usize, usize, usize, c_uint);
    PFN_cuMemAllocManaged(*mut CUdeviceptr, usize, c_uint);
    PFN_cuMemFree_v2(CUdeviceptr);

    // Memory: stream-ordered and pools.
    PFN_cuMemAllocAsync(*mut CUdeviceptr, usize, CUstream);
    PFN_cuMemAllocAsync_ptsz(*mut CUdeviceptr, usize, CUstream);
    PFN_cuMemFreeAsync(CUdeviceptr, CUstream);
    PFN_cuMemFreeAsync_ptsz(CUdeviceptr, CUstream);
    PFN_cuMemPoolCreate(*mut CUmemoryPool, *const CUmemPoolProps);
    PFN_cuMemPoolDestroy(CUmemoryPool);
    PFN_cuMemPoolTrimTo(CUmemoryPool, usize);
    PFN_cuMemAllocFromPoolAsync(*mut CUdeviceptr, usize, CUmemoryPool, CUstream);
    PFN_cuMemAllocFromPoolAsync_ptsz(*mut CUdeviceptr, usize, CUmemoryPool, CUstream);
    PFN_cuMemPoolSetAttribute(CUmemoryPool, CUmemPool_attribute, *mut c_void);
    PFN_cuMemPoolGetAttribute(CUmemoryPool, CUmemPool_attribute, *mut c_void);

    // Memory: virtual memory management.
    PFN_cuMemCreate(*mut CUmemGenericAllocationHandle, usize, *const CUmemAllocationProp, c_ulonglong);
    PFN_cuMemRelease(CUmemGenericAllocationHandle);
    PFN_cuMemAddressReserve(*mut CUdeviceptr, usize, usize, CUdeviceptr, c_ulonglong);
    PFN_cuMemAddressFree(CUdeviceptr, usize);
    PFN_cuMemMap(CUdeviceptr, usize, usize, CUmemGenericAllocationHandle, c_ulonglong);
    PFN_cuMemUnmap(CUdeviceptr, usize);
    PFN_cuMemSetAccess(CUdeviceptr, usize, *const CUmemAccessDesc, usize);
    PFN_cuMemGetAllocationGranularity(*mut usize, *const CUmemAllocationProp, CUmemAllocationGranularity_flags);

    // Memory: arrays.
    PFN_cuArrayCreate_v2(*mut CUarray, *const CUDA_ARRAY_DESCRIPTOR);
    PFN_cuArray3DCreate_v2(*mut CUarray, *const CUDA_ARRAY3D_DESCRIPTOR);
    PFN_cuArrayDestroy(CUarray);
    PFN_cuMipmappedArrayCreate(*mut CUmipmappedArray, *const CUDA_ARRAY3D_DESCRIPTOR, c_uint);
    PFN_cuMipmappedArrayDestroy(CUmipmappedArray);

    // Graphs.
    PFN_cuGraphCreate(*mut CUgraph, c_uint);
    PFN_cuGraphAddMemAllocNode(*mut CUgraphNode, CUgraph, *const CUgraphNode, usize, *mut CUDA_MEM_ALLOC_NODE_PARAMS);
    PFN_cuGraphAddMemFreeNode(*mut CUgraphNode, CUgraph, *const CUgraphNode, usize, CUdeviceptr);
    /// The pre-12.0 form (also exported as `cuGraphInstantiate_v2`).
    PFN_cuGraphInstantiate(*mut CUgraphExec, CUgraph, *mut CUgraphNode, *mut c_char, usize);
    PFN_cuGraphInstantiate_v2(*mut CUgraphExec, CUgraph, *mut CUgraphNode, *mut c_char, usize);
    PFN_cuGraphInstantiateWithFlags(*mut CUgraphExec, CUgraph, c_ulonglong);
    PFN_cuGraphLaunch(CUgraphExec, CUstream);
    PFN_cuGraphLaunch_ptsz(CUgraphExec, CUstream);
    PFN_cuGraphExecDestroy(CUgraphExec);
    PFN_cuGraphDestroy(CUgraph);
    PFN_cuGraphClone(*mut CUgraph, CUgraph);
    PFN_cuGraphAddChildGraphNode(*mut CUgraphNode, CUgraph, *const CUgraphNode, usize, CUgraph);
    /// CUDA 12.2.
    PFN_cuGraphAddNode(*mut CUgraphNode, CUgraph, *const CUgraphNode, usize, *mut CUgraphNodeParams);
    /// CUDA 12.3: with edge data.
    PFN_cuGraphAddNode_v2(*mut CUgraphNode, CUgraph, *const CUgraphNode, *const CUgraphEdgeData, usize, *mut CUgraphNodeParams);
    /// `CUDA_GRAPH_INSTANTIATE_PARAMS` is only passed through by gpuslice, so it stays opaque.
    PFN_cuGraphInstantiateWithParams(*mut CUgraphExec, CUgraph, *mut c_void);
    PFN_cuGraphInstantiateWithParams_ptsz(*mut CUgraphExec, CUgraph, *mut c_void);

    // Modules and launches.
    PFN_cuModuleLoadData(*mut CUmodule, *const c_void);
    PFN_cuModuleGetFunction(*mut CUfunction, CUmodule, *const c_char);
    PFN_cuModuleUnload(CUmodule);
    PFN_cuLaunchKernel(
        CUfunction,
        c_uint, c_uint, c_uint,
        c_uint, c_uint, c_uint,
        c_uint,
        CUstream,
        *mut *mut c_void,
        *mut *mut c_void,
    );
    PFN_cuLaunchKernel_ptsz(
        CUfunction,
        c_uint, c_uint, c_uint,
        c_uint, c_uint, c_uint,
        c_uint,
        CUstream,
        *mut *mut c_void,
        *mut *mut c_void,
    );
    // The deprecated (pre-4.0) launch API, still exported by CUDA 12's driver: block shape
    // and parameters are set on the function beforehand, then launched with a 2-D grid.
    PFN_cuFuncSetBlockShape(CUfunction, c_int, c_int, c_int);
    PFN_cuParamSetSize(CUfunction, c_uint);
    PFN_cuParamSeti(CUfunction, c_int, c_uint);
    PFN_cuParamSetv(CUfunction, c_int, *mut c_void, c_uint);
    PFN_cuLaunch(CUfunction);
    PFN_cuLaunchGrid(CUfunction, c_int, c_int);
    PFN_cuLaunchGridAsync(CUfunction, c_int, c_int, CUstream);
    /// Deprecated since CUDA 11.3, still exported: one cooperative kernel per device.
    PFN_cuLaunchCooperativeKernelMultiDevice(*mut CUDA_LAUNCH_PARAMS, c_uint, c_uint);

    // Streams.
    PFN_cuStreamCreate(*mut CUstream, c_uint);
    PFN_cuStreamDestroy_v2(CUstream);
    PFN_cuStreamSynchronize(CUstream);
    PFN_cuStreamSynchronize_ptsz(CUstream);
    PFN_cuStreamQuery(CUstream);
    PFN_cuStreamQuery_ptsz(CUstream);
    PFN_cuStreamBeginCapture(CUstream);
    PFN_cuStreamBeginCapture_ptsz(CUstream);
    PFN_cuStreamBeginCapture_v2(CUstream, CUstreamCaptureMode);
    PFN_cuStreamBeginCapture_v2_ptsz(CUstream, CUstreamCaptureMode);
    PFN_cuStreamEndCapture(CUstream, *mut CUgraph);
    PFN_cuStreamEndCapture_ptsz(CUstream, *mut CUgraph);
    PFN_cuStreamIsCapturing(CUstream, *mut CUstreamCaptureStatus);
    PFN_cuStreamIsCapturing_ptsz(CUstream, *mut CUstreamCaptureStatus);
    PFN_cuStreamGetCaptureInfo_v2(CUstream, *mut CUstreamCaptureStatus, *mut cuuint64_t, *mut CUgraph, *mut *const CUgraphNode, *mut usize);
    PFN_cuStreamGetCaptureInfo_v2_ptsz(CUstream, *mut CUstreamCaptureStatus, *mut cuuint64_t, *mut CUgraph, *mut *const CUgraphNode, *mut usize);

    // Events.
    PFN_cuEventCreate(*mut CUevent, c_uint);
    PFN_cuEventRecord(CUevent, CUstream);
    PFN_cuEventRecord_ptsz(CUevent, CUstream);
    PFN_cuEventQuery(CUevent);
    PFN_cuEventSynchronize(CUevent);
    PFN_cuEventElapsedTime(*mut f32, CUevent, CUevent);
    PFN_cuEventElapsedTime_v2(*mut f32, CUevent, CUevent);
    PFN_cuEventDestroy_v2(CUevent);
}

/// The pre-3.2 (`_v1`) entry points, with 32-bit sizes and device pointers, which a program
/// can still reach through `dlsym` or by linking.
pub type PFN_cuMemGetInfo_v1 = unsafe extern "C" fn(*mut c_uint, *mut c_uint) -> CUresult;
pub type PFN_cuMemAlloc_v1 = unsafe extern "C" fn(*mut CUdeviceptr_v1, c_uint) -> CUresult;
pub type PFN_cuMemAllocPitch_v1 =
    unsafe extern "C" fn(*mut CUdeviceptr_v1, *mut c_uint, c_uint, c_uint, c_uint) -> CUresult;
pub type PFN_cuMemFree_v1 = unsafe extern "C" fn(CUdeviceptr_v1) -> CUresult;

pub type PFN_cuArrayCreate_v1 =
    unsafe extern "C" fn(*mut CUarray, *const CUDA_ARRAY_DESCRIPTOR_v1) -> CUresult;
pub type PFN_cuArray3DCreate_v1 =
    unsafe extern "C" fn(*mut CUarray, *const CUDA_ARRAY3D_DESCRIPTOR_v1) -> CUresult;

/// `cuStreamGetCtx(CUstream, CUcontext *)` (and its `_ptsz` variant).
pub type PFN_cuStreamGetCtx = unsafe extern "C" fn(CUstream, *mut CUcontext) -> CUresult;

/// `cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)`.
pub type PFN_cuMemRetainAllocationHandle =
    unsafe extern "C" fn(*mut CUmemGenericAllocationHandle, *mut c_void) -> CUresult;

pub type PFN_cuLaunchKernelEx = unsafe extern "C" fn(
    *const CUlaunchConfig,
    CUfunction,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CUresult;

pub type PFN_cuLaunchCooperativeKernel = unsafe extern "C" fn(
    CUfunction,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    CUstream,
    *mut *mut c_void,
) -> CUresult;

pub type PFN_cuMemMapArrayAsync =
    unsafe extern "C" fn(*mut CUarrayMapInfo, c_uint, CUstream) -> CUresult;
