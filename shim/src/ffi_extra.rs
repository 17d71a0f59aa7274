//! Driver declarations the shim needs beyond `gpuslice-cuda-ffi`: the pre-3.2 (`_v1`)
//! entry points with 32-bit sizes and pointers, which a program can still reach through
//! `dlsym` or by linking, the launch and instantiate variants that carry no memory or
//! stream the simulated driver models, sparse array tile mapping (which it does not
//! implement), and NVML's process-list signatures. Layouts follow
//! `cuda.h` and `nvml.h`.

#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::{c_uint, c_void};

use gpuslice_cuda_ffi::*;

/// `CUdeviceptr_v1`: a 32-bit device address.
pub type CUdeviceptr_v1 = c_uint;

pub type PFN_cuMemGetInfo_v1 = unsafe extern "C" fn(*mut c_uint, *mut c_uint) -> CUresult;
pub type PFN_cuMemAlloc_v1 = unsafe extern "C" fn(*mut CUdeviceptr_v1, c_uint) -> CUresult;
pub type PFN_cuMemAllocPitch_v1 =
    unsafe extern "C" fn(*mut CUdeviceptr_v1, *mut c_uint, c_uint, c_uint, c_uint) -> CUresult;
pub type PFN_cuMemFree_v1 = unsafe extern "C" fn(CUdeviceptr_v1) -> CUresult;

/// `CUDA_ARRAY_DESCRIPTOR_v1`: the pre-3.2 layout `cuArrayCreate` takes (32-bit sizes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct CUDA_ARRAY_DESCRIPTOR_v1 {
    pub Width: c_uint,
    pub Height: c_uint,
    pub Format: CUarray_format,
    pub NumChannels: c_uint,
}

impl From<CUDA_ARRAY_DESCRIPTOR_v1> for CUDA_ARRAY_DESCRIPTOR {
    fn from(d: CUDA_ARRAY_DESCRIPTOR_v1) -> Self {
        CUDA_ARRAY_DESCRIPTOR {
            Width: d.Width as usize,
            Height: d.Height as usize,
            Format: d.Format,
            NumChannels: d.NumChannels,
        }
    }
}

/// `CUDA_ARRAY3D_DESCRIPTOR_v1`: the pre-3.2 layout `cuArray3DCreate` takes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct CUDA_ARRAY3D_DESCRIPTOR_v1 {
    pub Width: c_uint,
    pub Height: c_uint,
    pub Depth: c_uint,
    pub Format: CUarray_format,
    pub NumChannels: c_uint,
    pub Flags: c_uint,
}

impl From<CUDA_ARRAY3D_DESCRIPTOR_v1> for CUDA_ARRAY3D_DESCRIPTOR {
    fn from(d: CUDA_ARRAY3D_DESCRIPTOR_v1) -> Self {
        CUDA_ARRAY3D_DESCRIPTOR {
            Width: d.Width as usize,
            Height: d.Height as usize,
            Depth: d.Depth as usize,
            Format: d.Format,
            NumChannels: d.NumChannels,
            Flags: d.Flags,
        }
    }
}

pub type PFN_cuArrayCreate_v1 =
    unsafe extern "C" fn(*mut CUarray, *const CUDA_ARRAY_DESCRIPTOR_v1) -> CUresult;
pub type PFN_cuArray3DCreate_v1 =
    unsafe extern "C" fn(*mut CUarray, *const CUDA_ARRAY3D_DESCRIPTOR_v1) -> CUresult;

/// `cuStreamGetCtx(CUstream, CUcontext *)` (and its `_ptsz` variant).
pub type PFN_cuStreamGetCtx = unsafe extern "C" fn(CUstream, *mut CUcontext) -> CUresult;

/// `cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)`.
pub type PFN_cuMemRetainAllocationHandle =
    unsafe extern "C" fn(*mut CUmemGenericAllocationHandle, *mut c_void) -> CUresult;

/// `CUlaunchConfig`: the shim reads only `hStream`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUlaunchConfig {
    pub gridDimX: c_uint,
    pub gridDimY: c_uint,
    pub gridDimZ: c_uint,
    pub blockDimX: c_uint,
    pub blockDimY: c_uint,
    pub blockDimZ: c_uint,
    pub sharedMemBytes: c_uint,
    pub hStream: CUstream,
    pub attrs: *mut c_void,
    pub numAttrs: c_uint,
}

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

/// `CUarrayMapInfo`: one mapping or unmapping of a sparse (mipmapped) array tile onto
/// physical memory, for `cuMemMapArrayAsync`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUarrayMapInfo {
    pub resourceType: c_uint,
    /// `CUarray` or `CUmipmappedArray`, by `resourceType`.
    pub resource: *mut c_void,
    pub subresourceType: c_uint,
    /// The `sparseLevel` (level, layer, offsetX/Y/Z, extentWidth/Height/Depth: eight
    /// `unsigned int`) or `miptail` (layer, offset, size) union, as raw words.
    pub subresource: [u64; 4],
    pub memOperationType: c_uint,
    pub memHandleType: c_uint,
    /// The `memHandle` union: a `CUmemGenericAllocationHandle` for the generic handle type.
    pub memHandle: CUmemGenericAllocationHandle,
    pub offset: u64,
    pub deviceBitMask: c_uint,
    pub flags: c_uint,
    pub reserved: [c_uint; 2],
}

/// `CUarraySparseSubresourceType`.
pub const CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_SPARSE_LEVEL: c_uint = 0;
pub const CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_MIPTAIL: c_uint = 1;
/// `CUmemOperationType`.
pub const CU_MEM_OPERATION_TYPE_MAP: c_uint = 1;
pub const CU_MEM_OPERATION_TYPE_UNMAP: c_uint = 2;
/// `CUmemHandleType`.
pub const CU_MEM_HANDLE_TYPE_GENERIC: c_uint = 0;

pub type PFN_cuMemMapArrayAsync =
    unsafe extern "C" fn(*mut CUarrayMapInfo, c_uint, CUstream) -> CUresult;

/// NVML's process lists: `nvmlDevice*RunningProcesses` with the v1 entry layout (the
/// unversioned names) and with the v2 layout (`_v2` and `_v3`; cuda-ffi's
/// `nvmlProcessInfo_t`).
pub type PFN_nvmlProcesses_v1 = unsafe extern "C" fn(
    gpuslice_cuda_ffi::nvml::nvmlDevice_t,
    *mut c_uint,
    *mut gpuslice_cuda_ffi::nvml::nvmlProcessInfo_v1_t,
) -> gpuslice_cuda_ffi::nvml::nvmlReturn_t;
pub type PFN_nvmlProcesses_v2 = unsafe extern "C" fn(
    gpuslice_cuda_ffi::nvml::nvmlDevice_t,
    *mut c_uint,
    *mut gpuslice_cuda_ffi::nvml::nvmlProcessInfo_t,
) -> gpuslice_cuda_ffi::nvml::nvmlReturn_t;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_config_layout_matches_cuda_h() {
        assert_eq!(std::mem::offset_of!(CUlaunchConfig, hStream), 32);
        assert_eq!(std::mem::size_of::<CUlaunchConfig>(), 56);
    }

    #[test]
    fn array_map_info_layout_matches_cuda_h() {
        use std::mem::offset_of;
        assert_eq!(offset_of!(CUarrayMapInfo, resource), 8);
        assert_eq!(offset_of!(CUarrayMapInfo, subresource), 24);
        assert_eq!(offset_of!(CUarrayMapInfo, memOperationType), 56);
        assert_eq!(offset_of!(CUarrayMapInfo, memHandle), 64);
        assert_eq!(offset_of!(CUarrayMapInfo, deviceBitMask), 80);
        assert_eq!(std::mem::size_of::<CUarrayMapInfo>(), 96);
    }
}
