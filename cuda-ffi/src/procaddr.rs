//! The `cuGetProcAddress` symbol table: for a base name (`cuMemAlloc`), the `cudaVersion` a
//! caller was built against and the per-thread-default-stream flag, which exported symbol the
//! real driver hands back (`cuMemAlloc_v2` from 3.2 on, `cuLaunchKernel_ptsz` for per-thread
//! callers from 7.0 on). The simulated driver resolves with it; the shim uses it to map a
//! request to the interceptor of the symbol the driver would have returned.
//!
//! Source: the `PFN_<name>_v<version>` typedefs of CUDA 12.6's `cudaTypedefs.h` (the version
//! from which each signature is returned) together with the `#define`s of `cuda.h` that give
//! the exported name of each signature (`cuMemAlloc` → `cuMemAlloc_v2`, `__CUDA_API_PTDS`
//! → `_ptds`, `__CUDA_API_PTSZ` → `_ptsz`). Rows within a name are ordered by `since`.
//! Names absent from this table are ones gpuslice neither implements nor intercepts; the
//! simulated driver answers them with `CUDA_ERROR_NOT_FOUND`, as the real one does for
//! names it does not know.

use crate::types::{cuuint64_t, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM};

/// One version of one driver entry point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcEntry {
    /// Base name a caller asks for, without version suffix.
    pub name: &'static str,
    /// First `cudaVersion` (e.g. 3020 for CUDA 3.2) for which this row applies.
    pub since: i32,
    /// Exported symbol returned for legacy-default-stream (and default) requests.
    pub symbol: &'static str,
    /// Exported symbol returned when `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM` is set,
    /// for entry points that have a per-thread-stream variant.
    pub per_thread: Option<&'static str>,
}

/// Why a name did not resolve (both are `CUDA_ERROR_NOT_FOUND` to the caller).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResolveError {
    /// The name is not a driver entry point this table knows
    /// (`CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND`).
    SymbolNotFound,
    /// The entry point exists, but only from `earliest` on
    /// (`CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT`).
    VersionNotSufficient { earliest: i32 },
}

macro_rules! table {
    ($($name:literal $since:literal $sym:literal $($pt:literal)?;)*) => {
        &[$(ProcEntry { name: $name, since: $since, symbol: $sym, per_thread: table!(@pt $($pt)?) },)*]
    };
    (@pt) => { None };
    (@pt $pt:literal) => { Some($pt) };
}

/// Every row, sorted by `name` then `since` (a unit test checks the order).
pub static PROC_TABLE: &[ProcEntry] = table! {
    "cuArray3DCreate" 2000 "cuArray3DCreate";
    "cuArray3DCreate" 3020 "cuArray3DCreate_v2";
    "cuArray3DGetDescriptor" 2000 "cuArray3DGetDescriptor";
    "cuArray3DGetDescriptor" 3020 "cuArray3DGetDescriptor_v2";
    "cuArrayCreate" 2000 "cuArrayCreate";
    "cuArrayCreate" 3020 "cuArrayCreate_v2";
    "cuArrayDestroy" 2000 "cuArrayDestroy";
    "cuArrayGetDescriptor" 2000 "cuArrayGetDescriptor";
    "cuArrayGetDescriptor" 3020 "cuArrayGetDescriptor_v2";
    "cuCtxCreate" 2000 "cuCtxCreate";
    "cuCtxCreate" 3020 "cuCtxCreate_v2";
    "cuCtxCreate" 11040 "cuCtxCreate_v3";
    "cuCtxCreate" 12050 "cuCtxCreate_v4";
    "cuCtxDestroy" 2000 "cuCtxDestroy";
    "cuCtxDestroy" 4000 "cuCtxDestroy_v2";
    "cuCtxGetApiVersion" 3020 "cuCtxGetApiVersion";
    "cuCtxGetCurrent" 4000 "cuCtxGetCurrent";
    "cuCtxGetDevice" 2000 "cuCtxGetDevice";
    "cuCtxGetFlags" 7000 "cuCtxGetFlags";
    "cuCtxGetLimit" 3010 "cuCtxGetLimit";
    "cuCtxPopCurrent" 2000 "cuCtxPopCurrent";
    "cuCtxPopCurrent" 4000 "cuCtxPopCurrent_v2";
    "cuCtxPushCurrent" 2000 "cuCtxPushCurrent";
    "cuCtxPushCurrent" 4000 "cuCtxPushCurrent_v2";
    "cuCtxSetCurrent" 4000 "cuCtxSetCurrent";
    "cuCtxSetLimit" 3010 "cuCtxSetLimit";
    "cuCtxSynchronize" 2000 "cuCtxSynchronize";
    "cuDeviceGet" 2000 "cuDeviceGet";
    "cuDeviceGetAttribute" 2000 "cuDeviceGetAttribute";
    "cuDeviceGetByPCIBusId" 4010 "cuDeviceGetByPCIBusId";
    "cuDeviceGetCount" 2000 "cuDeviceGetCount";
    "cuDeviceGetDefaultMemPool" 11020 "cuDeviceGetDefaultMemPool";
    "cuDeviceGetGraphMemAttribute" 11040 "cuDeviceGetGraphMemAttribute";
    "cuDeviceGetMemPool" 11020 "cuDeviceGetMemPool";
    "cuDeviceGetName" 2000 "cuDeviceGetName";
    "cuDeviceGetPCIBusId" 4010 "cuDeviceGetPCIBusId";
    "cuDeviceGetUuid" 9020 "cuDeviceGetUuid";
    "cuDeviceGetUuid" 11040 "cuDeviceGetUuid_v2";
    "cuDeviceGraphMemTrim" 11040 "cuDeviceGraphMemTrim";
    "cuDevicePrimaryCtxGetState" 7000 "cuDevicePrimaryCtxGetState";
    "cuDevicePrimaryCtxRelease" 7000 "cuDevicePrimaryCtxRelease";
    "cuDevicePrimaryCtxRelease" 11000 "cuDevicePrimaryCtxRelease_v2";
    "cuDevicePrimaryCtxReset" 7000 "cuDevicePrimaryCtxReset";
    "cuDevicePrimaryCtxReset" 11000 "cuDevicePrimaryCtxReset_v2";
    "cuDevicePrimaryCtxRetain" 7000 "cuDevicePrimaryCtxRetain";
    "cuDevicePrimaryCtxSetFlags" 7000 "cuDevicePrimaryCtxSetFlags";
    "cuDevicePrimaryCtxSetFlags" 11000 "cuDevicePrimaryCtxSetFlags_v2";
    "cuDeviceSetGraphMemAttribute" 11040 "cuDeviceSetGraphMemAttribute";
    "cuDeviceSetMemPool" 11020 "cuDeviceSetMemPool";
    "cuDeviceTotalMem" 2000 "cuDeviceTotalMem";
    "cuDeviceTotalMem" 3020 "cuDeviceTotalMem_v2";
    "cuDriverGetVersion" 2020 "cuDriverGetVersion";
    "cuEventCreate" 2000 "cuEventCreate";
    "cuEventDestroy" 2000 "cuEventDestroy";
    "cuEventDestroy" 4000 "cuEventDestroy_v2";
    "cuEventElapsedTime" 2000 "cuEventElapsedTime";
    "cuEventElapsedTime" 12080 "cuEventElapsedTime_v2";
    "cuEventQuery" 2000 "cuEventQuery";
    "cuEventRecord" 2000 "cuEventRecord";
    "cuEventRecord" 7000 "cuEventRecord" "cuEventRecord_ptsz";
    "cuEventRecordWithFlags" 11010 "cuEventRecordWithFlags" "cuEventRecordWithFlags_ptsz";
    "cuEventSynchronize" 2000 "cuEventSynchronize";
    "cuFuncSetBlockShape" 2000 "cuFuncSetBlockShape";
    "cuGetErrorName" 6000 "cuGetErrorName";
    "cuGetErrorString" 6000 "cuGetErrorString";
    "cuGetProcAddress" 11030 "cuGetProcAddress";
    "cuGetProcAddress" 12000 "cuGetProcAddress_v2";
    "cuGraphAddChildGraphNode" 10000 "cuGraphAddChildGraphNode";
    "cuGraphAddKernelNode" 10000 "cuGraphAddKernelNode";
    "cuGraphAddKernelNode" 12000 "cuGraphAddKernelNode_v2";
    "cuGraphAddMemAllocNode" 11040 "cuGraphAddMemAllocNode";
    "cuGraphAddMemFreeNode" 11040 "cuGraphAddMemFreeNode";
    "cuGraphAddNode" 12020 "cuGraphAddNode";
    "cuGraphAddNode" 12030 "cuGraphAddNode_v2";
    "cuGraphClone" 10000 "cuGraphClone";
    "cuGraphCreate" 10000 "cuGraphCreate";
    "cuGraphDestroy" 10000 "cuGraphDestroy";
    "cuGraphExecDestroy" 10000 "cuGraphExecDestroy";
    "cuGraphExecKernelNodeSetParams" 10010 "cuGraphExecKernelNodeSetParams";
    "cuGraphExecKernelNodeSetParams" 12000 "cuGraphExecKernelNodeSetParams_v2";
    "cuGraphExecUpdate" 10020 "cuGraphExecUpdate";
    "cuGraphExecUpdate" 12000 "cuGraphExecUpdate_v2";
    "cuGraphInstantiate" 10000 "cuGraphInstantiate";
    "cuGraphInstantiate" 11000 "cuGraphInstantiate_v2";
    "cuGraphInstantiate" 12000 "cuGraphInstantiateWithFlags";
    "cuGraphInstantiateWithFlags" 11040 "cuGraphInstantiateWithFlags";
    "cuGraphInstantiateWithParams" 12000 "cuGraphInstantiateWithParams" "cuGraphInstantiateWithParams_ptsz";
    "cuGraphKernelNodeGetParams" 10000 "cuGraphKernelNodeGetParams";
    "cuGraphKernelNodeGetParams" 12000 "cuGraphKernelNodeGetParams_v2";
    "cuGraphKernelNodeSetParams" 10000 "cuGraphKernelNodeSetParams";
    "cuGraphKernelNodeSetParams" 12000 "cuGraphKernelNodeSetParams_v2";
    "cuGraphLaunch" 10000 "cuGraphLaunch" "cuGraphLaunch_ptsz";
    "cuGraphUpload" 11010 "cuGraphUpload" "cuGraphUpload_ptsz";
    "cuInit" 2000 "cuInit";
    "cuIpcOpenMemHandle" 4010 "cuIpcOpenMemHandle";
    "cuIpcOpenMemHandle" 11000 "cuIpcOpenMemHandle_v2";
    "cuLaunch" 2000 "cuLaunch";
    "cuLaunchCooperativeKernel" 9000 "cuLaunchCooperativeKernel" "cuLaunchCooperativeKernel_ptsz";
    "cuLaunchCooperativeKernelMultiDevice" 9000 "cuLaunchCooperativeKernelMultiDevice";
    "cuLaunchGrid" 2000 "cuLaunchGrid";
    "cuLaunchGridAsync" 2000 "cuLaunchGridAsync";
    "cuLaunchHostFunc" 10000 "cuLaunchHostFunc" "cuLaunchHostFunc_ptsz";
    "cuLaunchKernel" 4000 "cuLaunchKernel";
    "cuLaunchKernel" 7000 "cuLaunchKernel" "cuLaunchKernel_ptsz";
    "cuLaunchKernelEx" 11060 "cuLaunchKernelEx" "cuLaunchKernelEx_ptsz";
    "cuLinkAddData" 5050 "cuLinkAddData";
    "cuLinkAddData" 6050 "cuLinkAddData_v2";
    "cuLinkAddFile" 5050 "cuLinkAddFile";
    "cuLinkAddFile" 6050 "cuLinkAddFile_v2";
    "cuLinkComplete" 5050 "cuLinkComplete";
    "cuLinkCreate" 5050 "cuLinkCreate";
    "cuLinkCreate" 6050 "cuLinkCreate_v2";
    "cuLinkDestroy" 5050 "cuLinkDestroy";
    "cuMemAddressFree" 10020 "cuMemAddressFree";
    "cuMemAddressReserve" 10020 "cuMemAddressReserve";
    "cuMemAdvise" 8000 "cuMemAdvise";
    "cuMemAdvise" 12020 "cuMemAdvise_v2";
    "cuMemAlloc" 2000 "cuMemAlloc";
    "cuMemAlloc" 3020 "cuMemAlloc_v2";
    "cuMemAllocAsync" 11020 "cuMemAllocAsync" "cuMemAllocAsync_ptsz";
    "cuMemAllocFromPoolAsync" 11020 "cuMemAllocFromPoolAsync" "cuMemAllocFromPoolAsync_ptsz";
    "cuMemAllocHost" 2000 "cuMemAllocHost";
    "cuMemAllocHost" 3020 "cuMemAllocHost_v2";
    "cuMemAllocManaged" 6000 "cuMemAllocManaged";
    "cuMemAllocPitch" 2000 "cuMemAllocPitch";
    "cuMemAllocPitch" 3020 "cuMemAllocPitch_v2";
    "cuMemCreate" 10020 "cuMemCreate";
    "cuMemExportToShareableHandle" 10020 "cuMemExportToShareableHandle";
    "cuMemFree" 2000 "cuMemFree";
    "cuMemFree" 3020 "cuMemFree_v2";
    "cuMemFreeAsync" 11020 "cuMemFreeAsync" "cuMemFreeAsync_ptsz";
    "cuMemFreeHost" 2000 "cuMemFreeHost";
    "cuMemGetAccess" 10020 "cuMemGetAccess";
    "cuMemGetAddressRange" 2000 "cuMemGetAddressRange";
    "cuMemGetAddressRange" 3020 "cuMemGetAddressRange_v2";
    "cuMemGetAllocationGranularity" 10020 "cuMemGetAllocationGranularity";
    "cuMemGetAllocationPropertiesFromHandle" 10020 "cuMemGetAllocationPropertiesFromHandle";
    "cuMemGetInfo" 2000 "cuMemGetInfo";
    "cuMemGetInfo" 3020 "cuMemGetInfo_v2";
    "cuMemHostAlloc" 2020 "cuMemHostAlloc";
    "cuMemHostGetDevicePointer" 2020 "cuMemHostGetDevicePointer";
    "cuMemHostGetDevicePointer" 3020 "cuMemHostGetDevicePointer_v2";
    "cuMemHostRegister" 4000 "cuMemHostRegister";
    "cuMemHostRegister" 6050 "cuMemHostRegister_v2";
    "cuMemHostUnregister" 4000 "cuMemHostUnregister";
    "cuMemImportFromShareableHandle" 10020 "cuMemImportFromShareableHandle";
    "cuMemMap" 10020 "cuMemMap";
    "cuMemMapArrayAsync" 11010 "cuMemMapArrayAsync" "cuMemMapArrayAsync_ptsz";
    "cuMemPoolCreate" 11020 "cuMemPoolCreate";
    "cuMemPoolDestroy" 11020 "cuMemPoolDestroy";
    "cuMemPoolGetAccess" 11020 "cuMemPoolGetAccess";
    "cuMemPoolGetAttribute" 11020 "cuMemPoolGetAttribute";
    "cuMemPoolSetAccess" 11020 "cuMemPoolSetAccess";
    "cuMemPoolSetAttribute" 11020 "cuMemPoolSetAttribute";
    "cuMemPoolTrimTo" 11020 "cuMemPoolTrimTo";
    "cuMemPrefetchAsync" 8000 "cuMemPrefetchAsync" "cuMemPrefetchAsync_ptsz";
    "cuMemPrefetchAsync" 12020 "cuMemPrefetchAsync_v2" "cuMemPrefetchAsync_v2_ptsz";
    "cuMemRelease" 10020 "cuMemRelease";
    "cuMemRetainAllocationHandle" 11000 "cuMemRetainAllocationHandle";
    "cuMemSetAccess" 10020 "cuMemSetAccess";
    "cuMemUnmap" 10020 "cuMemUnmap";
    "cuMemcpy" 4000 "cuMemcpy";
    "cuMemcpy" 7000 "cuMemcpy" "cuMemcpy_ptds";
    "cuMemcpy2D" 2000 "cuMemcpy2D";
    "cuMemcpy2D" 3020 "cuMemcpy2D_v2";
    "cuMemcpy2D" 7000 "cuMemcpy2D_v2" "cuMemcpy2D_v2_ptds";
    "cuMemcpy2DAsync" 2000 "cuMemcpy2DAsync";
    "cuMemcpy2DAsync" 3020 "cuMemcpy2DAsync_v2";
    "cuMemcpy2DAsync" 7000 "cuMemcpy2DAsync_v2" "cuMemcpy2DAsync_v2_ptsz";
    "cuMemcpy3D" 2000 "cuMemcpy3D";
    "cuMemcpy3D" 3020 "cuMemcpy3D_v2";
    "cuMemcpy3D" 7000 "cuMemcpy3D_v2" "cuMemcpy3D_v2_ptds";
    "cuMemcpy3DAsync" 2000 "cuMemcpy3DAsync";
    "cuMemcpy3DAsync" 3020 "cuMemcpy3DAsync_v2";
    "cuMemcpy3DAsync" 7000 "cuMemcpy3DAsync_v2" "cuMemcpy3DAsync_v2_ptsz";
    "cuMemcpyAsync" 4000 "cuMemcpyAsync";
    "cuMemcpyAsync" 7000 "cuMemcpyAsync" "cuMemcpyAsync_ptsz";
    "cuMemcpyDtoD" 2000 "cuMemcpyDtoD";
    "cuMemcpyDtoD" 3020 "cuMemcpyDtoD_v2";
    "cuMemcpyDtoD" 7000 "cuMemcpyDtoD_v2" "cuMemcpyDtoD_v2_ptds";
    "cuMemcpyDtoDAsync" 3000 "cuMemcpyDtoDAsync";
    "cuMemcpyDtoDAsync" 3020 "cuMemcpyDtoDAsync_v2";
    "cuMemcpyDtoDAsync" 7000 "cuMemcpyDtoDAsync_v2" "cuMemcpyDtoDAsync_v2_ptsz";
    "cuMemcpyDtoH" 2000 "cuMemcpyDtoH";
    "cuMemcpyDtoH" 3020 "cuMemcpyDtoH_v2";
    "cuMemcpyDtoH" 7000 "cuMemcpyDtoH_v2" "cuMemcpyDtoH_v2_ptds";
    "cuMemcpyDtoHAsync" 2000 "cuMemcpyDtoHAsync";
    "cuMemcpyDtoHAsync" 3020 "cuMemcpyDtoHAsync_v2";
    "cuMemcpyDtoHAsync" 7000 "cuMemcpyDtoHAsync_v2" "cuMemcpyDtoHAsync_v2_ptsz";
    "cuMemcpyHtoD" 2000 "cuMemcpyHtoD";
    "cuMemcpyHtoD" 3020 "cuMemcpyHtoD_v2";
    "cuMemcpyHtoD" 7000 "cuMemcpyHtoD_v2" "cuMemcpyHtoD_v2_ptds";
    "cuMemcpyHtoDAsync" 2000 "cuMemcpyHtoDAsync";
    "cuMemcpyHtoDAsync" 3020 "cuMemcpyHtoDAsync_v2";
    "cuMemcpyHtoDAsync" 7000 "cuMemcpyHtoDAsync_v2" "cuMemcpyHtoDAsync_v2_ptsz";
    "cuMemcpyPeer" 4000 "cuMemcpyPeer";
    "cuMemcpyPeer" 7000 "cuMemcpyPeer" "cuMemcpyPeer_ptds";
    "cuMemcpyPeerAsync" 4000 "cuMemcpyPeerAsync";
    "cuMemcpyPeerAsync" 7000 "cuMemcpyPeerAsync" "cuMemcpyPeerAsync_ptsz";
    "cuMemsetD16" 2000 "cuMemsetD16";
    "cuMemsetD16" 3020 "cuMemsetD16_v2";
    "cuMemsetD16" 7000 "cuMemsetD16_v2" "cuMemsetD16_v2_ptds";
    "cuMemsetD16Async" 3020 "cuMemsetD16Async";
    "cuMemsetD16Async" 7000 "cuMemsetD16Async" "cuMemsetD16Async_ptsz";
    "cuMemsetD32" 2000 "cuMemsetD32";
    "cuMemsetD32" 3020 "cuMemsetD32_v2";
    "cuMemsetD32" 7000 "cuMemsetD32_v2" "cuMemsetD32_v2_ptds";
    "cuMemsetD32Async" 3020 "cuMemsetD32Async";
    "cuMemsetD32Async" 7000 "cuMemsetD32Async" "cuMemsetD32Async_ptsz";
    "cuMemsetD8" 2000 "cuMemsetD8";
    "cuMemsetD8" 3020 "cuMemsetD8_v2";
    "cuMemsetD8" 7000 "cuMemsetD8_v2" "cuMemsetD8_v2_ptds";
    "cuMemsetD8Async" 3020 "cuMemsetD8Async";
    "cuMemsetD8Async" 7000 "cuMemsetD8Async" "cuMemsetD8Async_ptsz";
    "cuMipmappedArrayCreate" 5000 "cuMipmappedArrayCreate";
    "cuMipmappedArrayDestroy" 5000 "cuMipmappedArrayDestroy";
    "cuMipmappedArrayGetLevel" 5000 "cuMipmappedArrayGetLevel";
    "cuModuleGetFunction" 2000 "cuModuleGetFunction";
    "cuModuleGetGlobal" 2000 "cuModuleGetGlobal";
    "cuModuleGetGlobal" 3020 "cuModuleGetGlobal_v2";
    "cuModuleLoad" 2000 "cuModuleLoad";
    "cuModuleLoadData" 2000 "cuModuleLoadData";
    "cuModuleLoadDataEx" 2010 "cuModuleLoadDataEx";
    "cuModuleLoadFatBinary" 2000 "cuModuleLoadFatBinary";
    "cuModuleUnload" 2000 "cuModuleUnload";
    "cuParamSetSize" 2000 "cuParamSetSize";
    "cuParamSeti" 2000 "cuParamSeti";
    "cuParamSetv" 2000 "cuParamSetv";
    "cuPointerGetAttribute" 4000 "cuPointerGetAttribute";
    "cuPointerGetAttributes" 7000 "cuPointerGetAttributes";
    "cuStreamAddCallback" 5000 "cuStreamAddCallback";
    "cuStreamAddCallback" 7000 "cuStreamAddCallback" "cuStreamAddCallback_ptsz";
    "cuStreamAttachMemAsync" 6000 "cuStreamAttachMemAsync";
    "cuStreamAttachMemAsync" 7000 "cuStreamAttachMemAsync" "cuStreamAttachMemAsync_ptsz";
    "cuStreamBeginCapture" 10000 "cuStreamBeginCapture" "cuStreamBeginCapture_ptsz";
    "cuStreamBeginCapture" 10010 "cuStreamBeginCapture_v2" "cuStreamBeginCapture_v2_ptsz";
    "cuStreamCreate" 2000 "cuStreamCreate";
    "cuStreamCreateWithPriority" 5050 "cuStreamCreateWithPriority";
    "cuStreamDestroy" 2000 "cuStreamDestroy";
    "cuStreamDestroy" 4000 "cuStreamDestroy_v2";
    "cuStreamEndCapture" 10000 "cuStreamEndCapture" "cuStreamEndCapture_ptsz";
    "cuStreamGetCaptureInfo" 10010 "cuStreamGetCaptureInfo" "cuStreamGetCaptureInfo_ptsz";
    "cuStreamGetCaptureInfo" 11030 "cuStreamGetCaptureInfo_v2" "cuStreamGetCaptureInfo_v2_ptsz";
    "cuStreamGetCaptureInfo" 12030 "cuStreamGetCaptureInfo_v3" "cuStreamGetCaptureInfo_v3_ptsz";
    "cuStreamGetCtx" 9020 "cuStreamGetCtx" "cuStreamGetCtx_ptsz";
    "cuStreamGetCtx" 12050 "cuStreamGetCtx_v2" "cuStreamGetCtx_v2_ptsz";
    "cuStreamGetFlags" 5050 "cuStreamGetFlags";
    "cuStreamGetFlags" 7000 "cuStreamGetFlags" "cuStreamGetFlags_ptsz";
    "cuStreamGetPriority" 5050 "cuStreamGetPriority";
    "cuStreamGetPriority" 7000 "cuStreamGetPriority" "cuStreamGetPriority_ptsz";
    "cuStreamIsCapturing" 10000 "cuStreamIsCapturing" "cuStreamIsCapturing_ptsz";
    "cuStreamQuery" 2000 "cuStreamQuery";
    "cuStreamQuery" 7000 "cuStreamQuery" "cuStreamQuery_ptsz";
    "cuStreamSynchronize" 2000 "cuStreamSynchronize";
    "cuStreamSynchronize" 7000 "cuStreamSynchronize" "cuStreamSynchronize_ptsz";
    "cuStreamWaitEvent" 3020 "cuStreamWaitEvent";
    "cuStreamWaitEvent" 7000 "cuStreamWaitEvent" "cuStreamWaitEvent_ptsz";
};

/// The rows for base name `name`, oldest first; empty if unknown.
pub fn versions_of(name: &str) -> &'static [ProcEntry] {
    let start = PROC_TABLE.partition_point(|e| e.name < name);
    let end = start + PROC_TABLE[start..].partition_point(|e| e.name == name);
    &PROC_TABLE[start..end]
}

/// The exported symbol the real driver returns from `cuGetProcAddress(name, cuda_version,
/// flags)`: the newest row whose `since` is at most `cuda_version`, and its per-thread
/// variant when `flags` has `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM` and the row has
/// one. `CU_GET_PROC_ADDRESS_DEFAULT` resolves like `LEGACY_STREAM`, as for any caller not
/// built with `--default-stream per-thread`.
pub fn resolve(
    name: &str,
    cuda_version: i32,
    flags: cuuint64_t,
) -> Result<&'static str, ResolveError> {
    let rows = versions_of(name);
    let first = rows.first().ok_or(ResolveError::SymbolNotFound)?;
    let row = rows.iter().rev().find(|e| e.since <= cuda_version).ok_or(
        ResolveError::VersionNotSufficient {
            earliest: first.since,
        },
    )?;
    let per_thread = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0;
    Ok(match (per_thread, row.per_thread) {
        (true, Some(pt)) => pt,
        _ => row.symbol,
    })
}

/// The base name under which exported symbol `symbol` is resolved (`cuMemAlloc_v2` →
/// `cuMemAlloc`, `cuLaunchKernel_ptsz` → `cuLaunchKernel`); a symbol that is itself a base
/// name maps to itself (`cuGraphInstantiateWithFlags`). `None` for symbols not in the table.
pub fn base_name_of(symbol: &str) -> Option<&'static str> {
    if let Some(e) = versions_of(symbol).first() {
        return Some(e.name);
    }
    PROC_TABLE
        .iter()
        .find(|e| e.symbol == symbol || e.per_thread == Some(symbol))
        .map(|e| e.name)
}

/// Every distinct exported symbol the table can return, legacy and per-thread.
pub fn all_symbols() -> impl Iterator<Item = &'static str> {
    let mut seen: Vec<&'static str> = PROC_TABLE
        .iter()
        .flat_map(|e| std::iter::once(e.symbol).chain(e.per_thread))
        .collect();
    seen.sort_unstable();
    seen.dedup();
    seen.into_iter()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{CU_GET_PROC_ADDRESS_DEFAULT, CU_GET_PROC_ADDRESS_LEGACY_STREAM};

    const PT: cuuint64_t = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;

    #[test]
    fn table_is_sorted_and_rows_are_distinct() {
        for w in PROC_TABLE.windows(2) {
            assert!(
                (w[0].name, w[0].since) < (w[1].name, w[1].since),
                "{:?} must come before {:?}",
                w[0],
                w[1]
            );
        }
    }

    #[test]
    fn versioned_names_follow_the_requested_version() {
        assert_eq!(resolve("cuMemAlloc", 3010, 0), Ok("cuMemAlloc"));
        assert_eq!(resolve("cuMemAlloc", 3020, 0), Ok("cuMemAlloc_v2"));
        assert_eq!(resolve("cuMemAlloc", 12040, 0), Ok("cuMemAlloc_v2"));
        assert_eq!(resolve("cuMemGetInfo", 11080, 0), Ok("cuMemGetInfo_v2"));
        assert_eq!(
            resolve("cuDeviceTotalMem", 12040, 0),
            Ok("cuDeviceTotalMem_v2")
        );
        assert_eq!(resolve("cuCtxCreate", 11030, 0), Ok("cuCtxCreate_v2"));
        assert_eq!(resolve("cuCtxCreate", 11040, 0), Ok("cuCtxCreate_v3"));
        assert_eq!(resolve("cuCtxCreate", 12050, 0), Ok("cuCtxCreate_v4"));
        assert_eq!(
            resolve("cuGetProcAddress", 11080, 0),
            Ok("cuGetProcAddress")
        );
        assert_eq!(
            resolve("cuGetProcAddress", 12000, 0),
            Ok("cuGetProcAddress_v2")
        );
        assert_eq!(
            resolve("cuGraphInstantiate", 11080, 0),
            Ok("cuGraphInstantiate_v2")
        );
        assert_eq!(
            resolve("cuGraphInstantiate", 12000, 0),
            Ok("cuGraphInstantiateWithFlags")
        );
        assert_eq!(
            resolve("cuDevicePrimaryCtxRelease", 10020, 0),
            Ok("cuDevicePrimaryCtxRelease")
        );
        assert_eq!(
            resolve("cuDevicePrimaryCtxRelease", 11000, 0),
            Ok("cuDevicePrimaryCtxRelease_v2")
        );
        assert_eq!(
            resolve("cuStreamDestroy", 12040, 0),
            Ok("cuStreamDestroy_v2")
        );
        assert_eq!(resolve("cuEventDestroy", 12040, 0), Ok("cuEventDestroy_v2"));
        assert_eq!(
            resolve("cuEventElapsedTime", 12040, 0),
            Ok("cuEventElapsedTime")
        );
        assert_eq!(
            resolve("cuEventElapsedTime", 12080, 0),
            Ok("cuEventElapsedTime_v2")
        );
    }

    #[test]
    fn per_thread_flag_selects_ptsz_and_ptds_variants() {
        assert_eq!(
            resolve("cuLaunchKernel", 12040, PT),
            Ok("cuLaunchKernel_ptsz")
        );
        assert_eq!(
            resolve("cuLaunchKernel", 12040, CU_GET_PROC_ADDRESS_DEFAULT),
            Ok("cuLaunchKernel")
        );
        assert_eq!(
            resolve("cuLaunchKernel", 12040, CU_GET_PROC_ADDRESS_LEGACY_STREAM),
            Ok("cuLaunchKernel")
        );
        // Per-thread variants exist only from 7.0.
        assert_eq!(resolve("cuLaunchKernel", 6050, PT), Ok("cuLaunchKernel"));
        assert_eq!(
            resolve("cuMemcpyHtoD", 12040, PT),
            Ok("cuMemcpyHtoD_v2_ptds")
        );
        assert_eq!(
            resolve("cuMemAllocAsync", 11020, PT),
            Ok("cuMemAllocAsync_ptsz")
        );
        // No per-thread variant: the flag changes nothing.
        assert_eq!(resolve("cuMemAlloc", 12040, PT), Ok("cuMemAlloc_v2"));
    }

    #[test]
    fn unknown_and_too_old_are_distinguished() {
        assert_eq!(
            resolve("cuNoSuchThing", 12040, 0),
            Err(ResolveError::SymbolNotFound)
        );
        // Versioned names are not base names.
        assert_eq!(
            resolve("cuMemAlloc_v2", 12040, 0),
            Err(ResolveError::SymbolNotFound)
        );
        assert_eq!(
            resolve("cuMemAllocAsync", 11010, 0),
            Err(ResolveError::VersionNotSufficient { earliest: 11020 })
        );
    }

    #[test]
    fn base_names_map_back() {
        assert_eq!(base_name_of("cuMemAlloc_v2"), Some("cuMemAlloc"));
        assert_eq!(base_name_of("cuLaunchKernel_ptsz"), Some("cuLaunchKernel"));
        assert_eq!(
            base_name_of("cuGraphInstantiateWithFlags"),
            Some("cuGraphInstantiateWithFlags")
        );
        assert_eq!(base_name_of("cuCtxCreate_v3"), Some("cuCtxCreate"));
        assert_eq!(base_name_of("nope"), None);
        assert!(all_symbols().any(|s| s == "cuMemcpyDtoHAsync_v2_ptsz"));
    }
}
