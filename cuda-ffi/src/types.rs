//! Handle types, structs with the real C layouts, and the enum constants of the CUDA driver
//! API that gpuslice's simulated driver, shim and probe pass across the FFI boundary.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};

/// Device ordinal as the driver API sees it (`CUdevice`, an `int`).
pub type CUdevice = c_int;
/// A device address (`CUdeviceptr`, `unsigned long long` on 64-bit hosts).
pub type CUdeviceptr = c_ulonglong;
/// Handle of a physical allocation made by `cuMemCreate`.
pub type CUmemGenericAllocationHandle = c_ulonglong;
/// `cuuint64_t`.
pub type cuuint64_t = u64;
/// `cuuint32_t`.
pub type cuuint32_t = u32;

macro_rules! opaque_handles {
    ($($(#[$doc:meta])* $handle:ident => $st:ident;)*) => {$(
        /// Opaque driver object; only ever used behind a pointer.
        #[repr(C)]
        pub struct $st {
            _private: [u8; 0],
        }
        $(#[$doc])*
        pub type $handle = *mut $st;
    )*};
}

opaque_handles! {
    /// A context.
    CUcontext => CUctx_st;
    /// A stream. `0`, [`CU_STREAM_LEGACY`] and [`CU_STREAM_PER_THREAD`] name default streams.
    CUstream => CUstream_st;
    /// An event.
    CUevent => CUevent_st;
    /// A loaded module.
    CUmodule => CUmod_st;
    /// A kernel function of a module.
    CUfunction => CUfunc_st;
    /// A CUDA array.
    CUarray => CUarray_st;
    /// A mipmapped CUDA array.
    CUmipmappedArray => CUmipmappedArray_st;
    /// A stream-ordered memory pool.
    CUmemoryPool => CUmemPoolHandle_st;
    /// A graph (not yet instantiated).
    CUgraph => CUgraph_st;
    /// An instantiated, launchable graph.
    CUgraphExec => CUgraphExec_st;
    /// A node of a graph.
    CUgraphNode => CUgraphNode_st;
    /// A library (CUDA 12 lazy loading).
    CUlibrary => CUlib_st;
    /// A kernel of a library.
    CUkernel => CUkern_st;
}

/// The legacy default stream handle (`CU_STREAM_LEGACY`, `((CUstream)0x1)`).
pub const CU_STREAM_LEGACY: CUstream = 0x1 as CUstream;
/// The per-thread default stream handle (`CU_STREAM_PER_THREAD`, `((CUstream)0x2)`).
pub const CU_STREAM_PER_THREAD: CUstream = 0x2 as CUstream;

/// A device UUID (`CUuuid`): 16 raw bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CUuuid {
    pub bytes: [c_char; 16],
}

impl CUuuid {
    /// The UUID bytes as unsigned values.
    pub fn as_bytes(&self) -> [u8; 16] {
        self.bytes.map(|b| b as u8)
    }

    /// Builds a `CUuuid` from raw bytes.
    pub fn from_bytes(b: [u8; 16]) -> CUuuid {
        CUuuid {
            bytes: b.map(|x| x as c_char),
        }
    }

    /// Formats as NVIDIA does in `nvidia-smi -L` and NVML: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub fn to_gpu_string(&self) -> String {
        let b = self.as_bytes();
        let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
        format!(
            "GPU-{}-{}-{}-{}-{}",
            &hex[0..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..32]
        )
    }

    /// Parses `GPU-<uuid>` (or a bare UUID) into bytes; `None` if it is not 32 hex digits.
    pub fn parse_gpu_string(s: &str) -> Option<CUuuid> {
        let s = s.strip_prefix("GPU-").unwrap_or(s);
        let hex: Vec<u8> = s.bytes().filter(|c| *c != b'-').collect();
        if hex.len() != 32 || s.len() != 36 {
            return None;
        }
        let mut out = [0u8; 16];
        for (i, pair) in hex.chunks(2).enumerate() {
            let text = std::str::from_utf8(pair).ok()?;
            out[i] = u8::from_str_radix(text, 16).ok()?;
        }
        Some(CUuuid::from_bytes(out))
    }
}

/// `CUarray_format`: element format of a CUDA array.
pub type CUarray_format = c_uint;
pub const CU_AD_FORMAT_UNSIGNED_INT8: CUarray_format = 0x01;
pub const CU_AD_FORMAT_UNSIGNED_INT16: CUarray_format = 0x02;
pub const CU_AD_FORMAT_UNSIGNED_INT32: CUarray_format = 0x03;
pub const CU_AD_FORMAT_SIGNED_INT8: CUarray_format = 0x08;
pub const CU_AD_FORMAT_SIGNED_INT16: CUarray_format = 0x09;
pub const CU_AD_FORMAT_SIGNED_INT32: CUarray_format = 0x0a;
pub const CU_AD_FORMAT_HALF: CUarray_format = 0x10;
pub const CU_AD_FORMAT_FLOAT: CUarray_format = 0x20;

/// Bytes of one channel of `format`, for the formats above; `None` for others.
pub fn array_format_bytes(format: CUarray_format) -> Option<u64> {
    match format {
        CU_AD_FORMAT_UNSIGNED_INT8 | CU_AD_FORMAT_SIGNED_INT8 => Some(1),
        CU_AD_FORMAT_UNSIGNED_INT16 | CU_AD_FORMAT_SIGNED_INT16 | CU_AD_FORMAT_HALF => Some(2),
        CU_AD_FORMAT_UNSIGNED_INT32 | CU_AD_FORMAT_SIGNED_INT32 | CU_AD_FORMAT_FLOAT => Some(4),
        _ => None,
    }
}

/// `CUDA_ARRAY_DESCRIPTOR` (the `_v2` layout `cuArrayCreate_v2` takes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CUDA_ARRAY_DESCRIPTOR {
    pub Width: usize,
    pub Height: usize,
    pub Format: CUarray_format,
    pub NumChannels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR` (the `_v2` layout `cuArray3DCreate_v2` and
/// `cuMipmappedArrayCreate` take).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CUDA_ARRAY3D_DESCRIPTOR {
    pub Width: usize,
    pub Height: usize,
    pub Depth: usize,
    pub Format: CUarray_format,
    pub NumChannels: c_uint,
    pub Flags: c_uint,
}

/// `CUmemLocationType`.
pub type CUmemLocationType = c_int;
pub const CU_MEM_LOCATION_TYPE_INVALID: CUmemLocationType = 0;
pub const CU_MEM_LOCATION_TYPE_DEVICE: CUmemLocationType = 1;

/// `CUmemLocation`: where memory lives (type and device ordinal).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CUmemLocation {
    pub type_: CUmemLocationType,
    pub id: c_int,
}

/// `CUmemAllocationType`.
pub type CUmemAllocationType = c_int;
pub const CU_MEM_ALLOCATION_TYPE_INVALID: CUmemAllocationType = 0;
pub const CU_MEM_ALLOCATION_TYPE_PINNED: CUmemAllocationType = 1;

/// `CUmemAllocationHandleType`.
pub type CUmemAllocationHandleType = c_int;
pub const CU_MEM_HANDLE_TYPE_NONE: CUmemAllocationHandleType = 0;
pub const CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: CUmemAllocationHandleType = 1;

/// The `allocFlags` member of `CUmemAllocationProp`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CUmemAllocationPropFlags {
    pub compressionType: u8,
    pub gpuDirectRDMACapable: u8,
    pub usage: u16,
    pub reserved: [u8; 4],
}

/// `CUmemAllocationProp` (v1): properties of a `cuMemCreate` allocation.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUmemAllocationProp {
    pub type_: CUmemAllocationType,
    pub requestedHandleTypes: CUmemAllocationHandleType,
    pub location: CUmemLocation,
    pub win32HandleMetaData: *mut c_void,
    pub allocFlags: CUmemAllocationPropFlags,
}

impl CUmemAllocationProp {
    /// Pinned device memory on device `dev`, the common case.
    pub fn pinned_on(dev: CUdevice) -> Self {
        CUmemAllocationProp {
            type_: CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes: CU_MEM_HANDLE_TYPE_NONE,
            location: CUmemLocation {
                type_: CU_MEM_LOCATION_TYPE_DEVICE,
                id: dev,
            },
            win32HandleMetaData: std::ptr::null_mut(),
            allocFlags: CUmemAllocationPropFlags::default(),
        }
    }
}

/// `CUmemAccess_flags`.
pub type CUmemAccess_flags = c_int;
pub const CU_MEM_ACCESS_FLAGS_PROT_NONE: CUmemAccess_flags = 0;
pub const CU_MEM_ACCESS_FLAGS_PROT_READ: CUmemAccess_flags = 1;
pub const CU_MEM_ACCESS_FLAGS_PROT_READWRITE: CUmemAccess_flags = 3;

/// `CUmemAccessDesc`: access granted to a location for a mapped range.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CUmemAccessDesc {
    pub location: CUmemLocation,
    pub flags: CUmemAccess_flags,
}

/// `CUmemAllocationGranularity_flags`.
pub type CUmemAllocationGranularity_flags = c_int;
pub const CU_MEM_ALLOC_GRANULARITY_MINIMUM: CUmemAllocationGranularity_flags = 0;
pub const CU_MEM_ALLOC_GRANULARITY_RECOMMENDED: CUmemAllocationGranularity_flags = 1;

/// `CUmemPoolProps` (v1, CUDA 12.2+ field names; same 88-byte layout as 11.2's).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUmemPoolProps {
    pub allocType: CUmemAllocationType,
    pub handleTypes: CUmemAllocationHandleType,
    pub location: CUmemLocation,
    pub win32SecurityAttributes: *mut c_void,
    /// Maximum pool size; 0 means the system default (CUDA 12.2+, reserved before).
    pub maxSize: usize,
    pub usage: u16,
    pub reserved: [u8; 54],
}

impl CUmemPoolProps {
    /// A pinned pool on device `dev`.
    pub fn pinned_on(dev: CUdevice) -> Self {
        CUmemPoolProps {
            allocType: CU_MEM_ALLOCATION_TYPE_PINNED,
            handleTypes: CU_MEM_HANDLE_TYPE_NONE,
            location: CUmemLocation {
                type_: CU_MEM_LOCATION_TYPE_DEVICE,
                id: dev,
            },
            win32SecurityAttributes: std::ptr::null_mut(),
            maxSize: 0,
            usage: 0,
            reserved: [0; 54],
        }
    }
}

/// `CUmemPool_attribute`.
pub type CUmemPool_attribute = c_int;
pub const CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: CUmemPool_attribute = 1;
pub const CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC: CUmemPool_attribute = 2;
pub const CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: CUmemPool_attribute = 3;
pub const CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: CUmemPool_attribute = 4;
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: CUmemPool_attribute = 5;
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: CUmemPool_attribute = 6;
pub const CU_MEMPOOL_ATTR_USED_MEM_CURRENT: CUmemPool_attribute = 7;
pub const CU_MEMPOOL_ATTR_USED_MEM_HIGH: CUmemPool_attribute = 8;

/// `CUgraphMem_attribute`: figures of a device's graph memory pool (`cuuint64_t` values).
pub type CUgraphMem_attribute = c_int;
/// Bytes currently associated with graphs.
pub const CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT: CUgraphMem_attribute = 0;
pub const CU_GRAPH_MEM_ATTR_USED_MEM_HIGH: CUgraphMem_attribute = 1;
/// Bytes currently allocated for graphs: used and cached.
pub const CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: CUgraphMem_attribute = 2;
pub const CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH: CUgraphMem_attribute = 3;

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (v1): parameters of a graph memory-allocation node; the
/// driver writes the allocation's address into `dptr` when the node is added.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUDA_MEM_ALLOC_NODE_PARAMS {
    pub poolProps: CUmemPoolProps,
    pub accessDescs: *const CUmemAccessDesc,
    pub accessDescCount: usize,
    pub bytesize: usize,
    pub dptr: CUdeviceptr,
}

/// `CUexecAffinityType`.
pub type CUexecAffinityType = c_int;
pub const CU_EXEC_AFFINITY_TYPE_SM_COUNT: CUexecAffinityType = 0;

/// `CUexecAffinityParam` (v1): the only member of its union is `smCount.val`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct CUexecAffinityParam {
    pub type_: CUexecAffinityType,
    pub param_smCount_val: c_uint,
}

/// `CUctxCreateParams` (CUDA 12.5), taken by `cuCtxCreate_v4`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUctxCreateParams {
    pub execAffinityParams: *mut CUexecAffinityParam,
    pub numExecAffinityParams: c_int,
    pub cigParams: *mut c_void,
}

/// `CUdevice_attribute` (subset).
pub type CUdevice_attribute = c_int;
pub const CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: CUdevice_attribute = 1;
pub const CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: CUdevice_attribute = 2;
pub const CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: CUdevice_attribute = 3;
pub const CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: CUdevice_attribute = 4;
pub const CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: CUdevice_attribute = 5;
pub const CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: CUdevice_attribute = 6;
pub const CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: CUdevice_attribute = 7;
pub const CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: CUdevice_attribute = 8;
pub const CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: CUdevice_attribute = 9;
pub const CU_DEVICE_ATTRIBUTE_WARP_SIZE: CUdevice_attribute = 10;
pub const CU_DEVICE_ATTRIBUTE_MAX_PITCH: CUdevice_attribute = 11;
pub const CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: CUdevice_attribute = 12;
/// Peak SM clock in kHz.
pub const CU_DEVICE_ATTRIBUTE_CLOCK_RATE: CUdevice_attribute = 13;
pub const CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: CUdevice_attribute = 14;
pub const CU_DEVICE_ATTRIBUTE_GPU_OVERLAP: CUdevice_attribute = 15;
pub const CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: CUdevice_attribute = 16;
pub const CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT: CUdevice_attribute = 17;
pub const CU_DEVICE_ATTRIBUTE_INTEGRATED: CUdevice_attribute = 18;
pub const CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: CUdevice_attribute = 19;
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: CUdevice_attribute = 20;
pub const CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: CUdevice_attribute = 31;
pub const CU_DEVICE_ATTRIBUTE_ECC_ENABLED: CUdevice_attribute = 32;
pub const CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: CUdevice_attribute = 33;
pub const CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: CUdevice_attribute = 34;
pub const CU_DEVICE_ATTRIBUTE_TCC_DRIVER: CUdevice_attribute = 35;
/// Peak memory clock in kHz.
pub const CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: CUdevice_attribute = 36;
pub const CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: CUdevice_attribute = 37;
pub const CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: CUdevice_attribute = 38;
pub const CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: CUdevice_attribute = 39;
pub const CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: CUdevice_attribute = 40;
pub const CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: CUdevice_attribute = 41;
pub const CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: CUdevice_attribute = 50;
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: CUdevice_attribute = 75;
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: CUdevice_attribute = 76;
pub const CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: CUdevice_attribute = 78;
pub const CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED: CUdevice_attribute = 79;
pub const CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED: CUdevice_attribute = 80;
pub const CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: CUdevice_attribute = 81;
pub const CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: CUdevice_attribute = 82;
pub const CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: CUdevice_attribute = 83;
pub const CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD: CUdevice_attribute = 84;
pub const CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD_GROUP_ID: CUdevice_attribute = 85;
pub const CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: CUdevice_attribute = 89;
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED: CUdevice_attribute = 90;
pub const CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: CUdevice_attribute = 95;
pub const CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: CUdevice_attribute = 97;
pub const CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: CUdevice_attribute = 102;
pub const CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: CUdevice_attribute = 103;
pub const CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: CUdevice_attribute = 106;
pub const CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE: CUdevice_attribute = 108;
pub const CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: CUdevice_attribute = 115;

/// `cuCtxCreate` / primary context flags.
pub const CU_CTX_SCHED_AUTO: c_uint = 0x00;
pub const CU_CTX_SCHED_SPIN: c_uint = 0x01;
pub const CU_CTX_SCHED_YIELD: c_uint = 0x02;
pub const CU_CTX_SCHED_BLOCKING_SYNC: c_uint = 0x04;
pub const CU_CTX_MAP_HOST: c_uint = 0x08;
pub const CU_CTX_LMEM_RESIZE_TO_MAX: c_uint = 0x10;

/// `cuStreamCreate` flags.
pub const CU_STREAM_DEFAULT: c_uint = 0x0;
pub const CU_STREAM_NON_BLOCKING: c_uint = 0x1;

/// `cuEventCreate` flags.
pub const CU_EVENT_DEFAULT: c_uint = 0x0;
pub const CU_EVENT_BLOCKING_SYNC: c_uint = 0x1;
pub const CU_EVENT_DISABLE_TIMING: c_uint = 0x2;
pub const CU_EVENT_INTERPROCESS: c_uint = 0x4;

/// `cuMemAllocManaged` flags.
pub const CU_MEM_ATTACH_GLOBAL: c_uint = 0x1;
pub const CU_MEM_ATTACH_HOST: c_uint = 0x2;
pub const CU_MEM_ATTACH_SINGLE: c_uint = 0x4;

/// `cuArray3DCreate` flags (subset).
pub const CUDA_ARRAY3D_LAYERED: c_uint = 0x01;
pub const CUDA_ARRAY3D_SURFACE_LDST: c_uint = 0x02;
pub const CUDA_ARRAY3D_CUBEMAP: c_uint = 0x04;

/// `cuLaunchKernel` `extra` markers.
pub const CU_LAUNCH_PARAM_END: *mut c_void = std::ptr::null_mut();
pub const CU_LAUNCH_PARAM_BUFFER_POINTER: *mut c_void = std::ptr::without_provenance_mut(0x01);
pub const CU_LAUNCH_PARAM_BUFFER_SIZE: *mut c_void = std::ptr::without_provenance_mut(0x02);

/// `cuGetProcAddress` flags (`CUdriverProcAddress_flags`).
pub const CU_GET_PROC_ADDRESS_DEFAULT: cuuint64_t = 0;
pub const CU_GET_PROC_ADDRESS_LEGACY_STREAM: cuuint64_t = 1 << 0;
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: cuuint64_t = 1 << 1;

/// `CUdriverProcAddressQueryResult`, written by `cuGetProcAddress_v2`.
pub type CUdriverProcAddressQueryResult = c_int;
pub const CU_GET_PROC_ADDRESS_SUCCESS: CUdriverProcAddressQueryResult = 0;
pub const CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: CUdriverProcAddressQueryResult = 1;
pub const CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: CUdriverProcAddressQueryResult = 2;

/// `cuGraphInstantiateWithFlags` flags (subset).
pub const CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH: c_ulonglong = 1;

/// `CUlimit` (`cuCtxSetLimit` / `cuCtxGetLimit`).
pub type CUlimit = c_int;
pub const CU_LIMIT_STACK_SIZE: CUlimit = 0;
pub const CU_LIMIT_PRINTF_FIFO_SIZE: CUlimit = 1;
pub const CU_LIMIT_MALLOC_HEAP_SIZE: CUlimit = 2;
pub const CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH: CUlimit = 3;
pub const CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT: CUlimit = 4;
pub const CU_LIMIT_MAX_L2_FETCH_GRANULARITY: CUlimit = 5;
pub const CU_LIMIT_PERSISTING_L2_CACHE_SIZE: CUlimit = 6;

/// `CUstreamCaptureStatus`.
pub type CUstreamCaptureStatus = c_int;
pub const CU_STREAM_CAPTURE_STATUS_NONE: CUstreamCaptureStatus = 0;
pub const CU_STREAM_CAPTURE_STATUS_ACTIVE: CUstreamCaptureStatus = 1;
pub const CU_STREAM_CAPTURE_STATUS_INVALIDATED: CUstreamCaptureStatus = 2;

/// `CUstreamCaptureMode`.
pub type CUstreamCaptureMode = c_int;
pub const CU_STREAM_CAPTURE_MODE_GLOBAL: CUstreamCaptureMode = 0;
pub const CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: CUstreamCaptureMode = 1;
pub const CU_STREAM_CAPTURE_MODE_RELAXED: CUstreamCaptureMode = 2;

/// `CUgraphNodeType` (subset).
pub type CUgraphNodeType = c_int;
pub const CU_GRAPH_NODE_TYPE_KERNEL: CUgraphNodeType = 0;
pub const CU_GRAPH_NODE_TYPE_GRAPH: CUgraphNodeType = 4;
pub const CU_GRAPH_NODE_TYPE_EMPTY: CUgraphNodeType = 5;
pub const CU_GRAPH_NODE_TYPE_MEM_ALLOC: CUgraphNodeType = 10;
pub const CU_GRAPH_NODE_TYPE_MEM_FREE: CUgraphNodeType = 11;

/// The union of `CUgraphNodeParams` as the node types gpuslice reads it: a memory
/// allocation (`CUDA_MEM_ALLOC_NODE_PARAMS_v2`, laid out as v1), a memory free, a child
/// graph (`CUDA_CHILD_GRAPH_NODE_PARAMS`), padded to the header's 29 `long long`s.
#[repr(C)]
#[derive(Clone, Copy)]
pub union CUgraphNodeParamsUnion {
    pub reserved1: [i64; 29],
    pub alloc: CUDA_MEM_ALLOC_NODE_PARAMS,
    /// `CUDA_MEM_FREE_NODE_PARAMS`: the address to free.
    pub free_dptr: CUdeviceptr,
    /// `CUDA_CHILD_GRAPH_NODE_PARAMS`: the graph the node embeds (cloned by the driver).
    pub child_graph: CUgraph,
}

/// `CUgraphNodeParams` (CUDA 12.2+), what `cuGraphAddNode` takes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUgraphNodeParams {
    pub type_: CUgraphNodeType,
    pub reserved0: [c_int; 3],
    pub u: CUgraphNodeParamsUnion,
    pub reserved2: i64,
}

impl CUgraphNodeParams {
    /// Parameters of a node of type `type_` with all of its union zeroed.
    pub fn zeroed(type_: CUgraphNodeType) -> CUgraphNodeParams {
        CUgraphNodeParams {
            type_,
            reserved0: [0; 3],
            u: CUgraphNodeParamsUnion { reserved1: [0; 29] },
            reserved2: 0,
        }
    }
}

/// `CUgraphEdgeData` (CUDA 12.3+), passed through by `cuGraphAddNode_v2`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct CUgraphEdgeData {
    pub from_port: u8,
    pub to_port: u8,
    pub type_: u8,
    pub reserved: [u8; 5],
}

/// `CUDA_LAUNCH_PARAMS`: one kernel of `cuLaunchCooperativeKernelMultiDevice`, each on its
/// own stream (and so its own context and device).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(non_snake_case)]
pub struct CUDA_LAUNCH_PARAMS {
    pub function: CUfunction,
    pub gridDimX: c_uint,
    pub gridDimY: c_uint,
    pub gridDimZ: c_uint,
    pub blockDimX: c_uint,
    pub blockDimY: c_uint,
    pub blockDimZ: c_uint,
    pub sharedMemBytes: c_uint,
    pub hStream: CUstream,
    pub kernelParams: *mut *mut std::ffi::c_void,
}

/// `CUdeviceptr_v1`: a 32-bit device address.
pub type CUdeviceptr_v1 = c_uint;

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    // Sizes and offsets from the real cuda.h on x86_64 / aarch64 Linux.
    #[test]
    fn layouts_match_cuda_h() {
        assert_eq!(size_of::<CUuuid>(), 16);
        assert_eq!(offset_of!(CUDA_LAUNCH_PARAMS, hStream), 40);
        assert_eq!(size_of::<CUDA_LAUNCH_PARAMS>(), 56);
        assert_eq!(size_of::<CUDA_ARRAY_DESCRIPTOR>(), 24);
        assert_eq!(size_of::<CUDA_ARRAY3D_DESCRIPTOR>(), 40);
        assert_eq!(offset_of!(CUDA_ARRAY3D_DESCRIPTOR, Flags), 32);
        assert_eq!(size_of::<CUmemLocation>(), 8);
        assert_eq!(size_of::<CUmemAllocationProp>(), 32);
        assert_eq!(offset_of!(CUmemAllocationProp, win32HandleMetaData), 16);
        assert_eq!(offset_of!(CUmemAllocationProp, allocFlags), 24);
        assert_eq!(size_of::<CUmemAccessDesc>(), 12);
        assert_eq!(size_of::<CUmemPoolProps>(), 88);
        assert_eq!(offset_of!(CUmemPoolProps, maxSize), 24);
        assert_eq!(size_of::<CUDA_MEM_ALLOC_NODE_PARAMS>(), 120);
        assert_eq!(offset_of!(CUDA_MEM_ALLOC_NODE_PARAMS, bytesize), 104);
        assert_eq!(offset_of!(CUDA_MEM_ALLOC_NODE_PARAMS, dptr), 112);
        assert_eq!(size_of::<CUexecAffinityParam>(), 8);
        assert_eq!(size_of::<CUctxCreateParams>(), 24);
        assert_eq!(align_of::<CUmemPoolProps>(), 8);
        assert_eq!(size_of::<CUgraphNodeParams>(), 256);
        assert_eq!(offset_of!(CUgraphNodeParams, u), 16);
        assert_eq!(size_of::<CUgraphEdgeData>(), 8);
    }

    #[test]
    fn uuid_strings_round_trip() {
        let text = "GPU-0123abcd-4567-89ef-0123-456789abcdef";
        let u = CUuuid::parse_gpu_string(text).expect("parses");
        assert_eq!(u.as_bytes()[0], 0x01);
        assert_eq!(u.as_bytes()[15], 0xef);
        assert_eq!(u.to_gpu_string(), text);
        assert!(CUuuid::parse_gpu_string("GPU-0123").is_none());
        assert!(CUuuid::parse_gpu_string("GPU-0123abcd-4567-89ef-0123-456789abcdeg").is_none());
    }

    #[test]
    fn format_sizes() {
        assert_eq!(array_format_bytes(CU_AD_FORMAT_FLOAT), Some(4));
        assert_eq!(array_format_bytes(CU_AD_FORMAT_HALF), Some(2));
        assert_eq!(array_format_bytes(0x77), None);
    }

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
