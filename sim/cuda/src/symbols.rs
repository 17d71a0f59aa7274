//! This library's own exports by name, what `cuGetProcAddress` hands out after the cuda-ffi
//! table has turned a base name and version into an exported symbol name.

use std::ffi::c_void;

use crate::exports::{
    array::*, context::*, device::*, event::*, graph::*, init::*, memory::*, module::*, pool::*,
    stream::*, vmm::*,
};

macro_rules! exports {
    ($($f:ident),* $(,)?) => {
        /// The address of export `name`, if this library has it.
        pub fn lookup(name: &str) -> Option<*mut c_void> {
            match name {
                $(stringify!($f) => Some($f as *mut c_void),)*
                _ => None,
            }
        }

        /// Every export name (for tests).
        #[cfg(test)]
        pub const ALL: &[&str] = &[$(stringify!($f)),*];
    };
}

exports! {
    cuInit, cuDriverGetVersion, cuGetErrorName, cuGetErrorString, cuGetProcAddress, cuGetProcAddress_v2,
    cuDeviceGet, cuDeviceGetCount, cuDeviceGetName, cuDeviceGetUuid, cuDeviceGetUuid_v2,
    cuDeviceTotalMem, cuDeviceTotalMem_v2, cuDeviceGetAttribute, cuDeviceGetPCIBusId, cuDeviceGetByPCIBusId,
    cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2,
    cuDevicePrimaryCtxReset, cuDevicePrimaryCtxReset_v2, cuDevicePrimaryCtxGetState,
    cuDevicePrimaryCtxSetFlags, cuDevicePrimaryCtxSetFlags_v2,
    cuCtxCreate_v2, cuCtxCreate_v3, cuCtxCreate_v4, cuCtxDestroy, cuCtxDestroy_v2,
    cuCtxSetCurrent, cuCtxGetCurrent, cuCtxPushCurrent, cuCtxPushCurrent_v2, cuCtxPopCurrent, cuCtxPopCurrent_v2,
    cuCtxGetDevice, cuCtxSynchronize, cuCtxSetLimit, cuCtxGetLimit,
    cuMemGetInfo_v2, cuMemAlloc_v2, cuMemAllocPitch_v2, cuMemAllocManaged, cuMemFree_v2,
    cuMemAllocAsync, cuMemAllocAsync_ptsz, cuMemFreeAsync, cuMemFreeAsync_ptsz,
    cuMemPoolCreate, cuMemPoolDestroy, cuMemPoolTrimTo, cuMemPoolSetAttribute, cuMemPoolGetAttribute, cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz,
    cuDeviceGetDefaultMemPool, cuDeviceGetMemPool,
    cuMemGetAllocationGranularity, cuMemCreate, cuMemRelease, cuMemAddressReserve, cuMemAddressFree,
    cuMemMap, cuMemUnmap, cuMemSetAccess,
    cuArrayCreate_v2, cuArray3DCreate_v2, cuArrayDestroy, cuMipmappedArrayCreate, cuMipmappedArrayDestroy,
    cuGraphCreate, cuGraphAddMemAllocNode, cuGraphAddMemFreeNode, cuGraphInstantiateWithFlags,
    cuGraphInstantiate, cuGraphInstantiate_v2, cuGraphLaunch, cuGraphLaunch_ptsz, cuGraphExecDestroy,
    cuGraphDestroy, cuDeviceGraphMemTrim, cuDeviceGetGraphMemAttribute, cuDeviceSetGraphMemAttribute, cuGraphAddNode, cuGraphAddNode_v2, cuGraphClone, cuGraphAddChildGraphNode,
    cuGraphInstantiateWithParams, cuGraphInstantiateWithParams_ptsz,
    cuModuleLoadData, cuModuleGetFunction, cuModuleUnload, cuLaunchKernel, cuLaunchKernel_ptsz,
    cuFuncSetBlockShape, cuParamSetSize, cuParamSeti, cuParamSetv, cuLaunch, cuLaunchGrid, cuLaunchGridAsync,
    cuLaunchCooperativeKernelMultiDevice,
    cuStreamCreate, cuStreamDestroy, cuStreamDestroy_v2, cuStreamSynchronize, cuStreamSynchronize_ptsz,
    cuStreamQuery, cuStreamQuery_ptsz, cuStreamGetCtx, cuStreamGetCtx_ptsz,
    cuStreamBeginCapture, cuStreamBeginCapture_ptsz, cuStreamBeginCapture_v2, cuStreamBeginCapture_v2_ptsz,
    cuStreamEndCapture, cuStreamEndCapture_ptsz, cuStreamIsCapturing, cuStreamIsCapturing_ptsz,
    cuStreamGetCaptureInfo_v2, cuStreamGetCaptureInfo_v2_ptsz,
    cuEventCreate, cuEventRecord, cuEventRecord_ptsz, cuEventQuery, cuEventSynchronize,
    cuEventElapsedTime, cuEventElapsedTime_v2, cuEventDestroy, cuEventDestroy_v2,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_export_resolvable_by_the_table_maps_to_itself() {
        for name in ALL {
            assert!(lookup(name).is_some(), "{name}");
        }
        // Every export except the legacy aliases is what some base name resolves to.
        let table: Vec<&str> = gpuslice_cuda_ffi::procaddr::all_symbols().collect();
        for name in ALL {
            assert!(
                table.contains(name),
                "{name} is exported but unreachable through cuGetProcAddress"
            );
        }
        assert!(lookup("cuMemAlloc").is_none());
    }
}
