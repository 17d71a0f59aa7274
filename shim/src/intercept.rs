//! The table of intercepted symbols: the exported name of each interceptor and its address,
//! consulted by the `dlsym` and `cuGetProcAddress` interceptors to hand out the shim's
//! version of a driver entry point however the program looks it up.

use std::ffi::c_void;

use crate::hooks::{
    arrays::*, context::*, graph::*, info::*, launch::*, memory::*, nvml::*, pools::*, procaddr::*,
    vmm::*,
};

macro_rules! table {
    ($($f:ident),* $(,)?) => {
        /// The interceptor for exported symbol `name`, if the shim has one.
        pub fn wrapper(name: &[u8]) -> Option<*mut c_void> {
            $(
                if name == stringify!($f).as_bytes() {
                    return Some($f as *mut c_void);
                }
            )*
            None
        }

        /// Every intercepted symbol name.
        #[cfg(test)]
        pub const NAMES: &[&str] = &[$(stringify!($f)),*];
    };
}

table! {
    cuInit, cuGetProcAddress, cuGetProcAddress_v2,
    cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2,
    cuDevicePrimaryCtxReset, cuDevicePrimaryCtxReset_v2,
    cuCtxCreate, cuCtxCreate_v2, cuCtxCreate_v3, cuCtxCreate_v4, cuCtxDestroy, cuCtxDestroy_v2, cuCtxSetLimit,
    cuMemGetInfo, cuMemGetInfo_v2, cuDeviceTotalMem, cuDeviceTotalMem_v2,
    cuMemAlloc, cuMemAlloc_v2, cuMemAllocPitch, cuMemAllocPitch_v2, cuMemAllocManaged,
    cuMemFree, cuMemFree_v2, cuMemAllocAsync, cuMemAllocAsync_ptsz, cuMemFreeAsync, cuMemFreeAsync_ptsz,
    cuMemPoolCreate, cuMemPoolDestroy, cuMemPoolTrimTo, cuMemPoolSetAttribute,
    cuDeviceGetDefaultMemPool, cuDeviceGetMemPool,
    cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz,
    cuMemCreate, cuMemRelease, cuMemMap, cuMemUnmap, cuMemRetainAllocationHandle,
    cuMemMapArrayAsync, cuMemMapArrayAsync_ptsz,
    cuArrayCreate, cuArrayCreate_v2, cuArray3DCreate, cuArray3DCreate_v2, cuArrayDestroy, cuMipmappedArrayCreate, cuMipmappedArrayDestroy,
    cuGraphAddMemAllocNode, cuGraphAddMemFreeNode, cuGraphAddNode, cuGraphAddNode_v2, cuGraphAddChildGraphNode, cuGraphClone,
    cuGraphInstantiate, cuGraphInstantiate_v2, cuGraphInstantiateWithFlags,
    cuGraphInstantiateWithParams, cuGraphInstantiateWithParams_ptsz, cuGraphExecDestroy, cuGraphDestroy,
    cuDeviceGraphMemTrim,
    cuLaunchKernel, cuLaunchKernel_ptsz, cuLaunchKernelEx, cuLaunchKernelEx_ptsz,
    cuLaunchCooperativeKernel, cuLaunchCooperativeKernel_ptsz, cuLaunchCooperativeKernelMultiDevice,
    cuGraphLaunch, cuGraphLaunch_ptsz,
    cuLaunch, cuLaunchGrid, cuLaunchGridAsync,
    nvmlDeviceGetMemoryInfo, nvmlDeviceGetMemoryInfo_v2,
    nvmlDeviceGetComputeRunningProcesses, nvmlDeviceGetComputeRunningProcesses_v2,
    nvmlDeviceGetComputeRunningProcesses_v3, nvmlDeviceGetGraphicsRunningProcesses,
    nvmlDeviceGetGraphicsRunningProcesses_v2, nvmlDeviceGetGraphicsRunningProcesses_v3,
    nvmlDeviceGetMPSComputeRunningProcesses, nvmlDeviceGetMPSComputeRunningProcesses_v2,
    nvmlDeviceGetMPSComputeRunningProcesses_v3,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_maps_and_others_do_not() {
        for n in NAMES {
            assert!(wrapper(n.as_bytes()).is_some(), "{n}");
        }
        assert!(wrapper(b"cuMemcpy").is_none());
        assert!(wrapper(b"cuMemAlloc_v3").is_none());
    }

    /// The base names (of the cuda-ffi `cuGetProcAddress` table) of which the shim
    /// intercepts at least one exported symbol: the families it hooks, taken from the
    /// interceptor table itself rather than a list kept beside it.
    fn intercepted_families() -> Vec<&'static str> {
        let mut bases: Vec<&'static str> = NAMES
            .iter()
            .filter_map(|n| gpuslice_cuda_ffi::procaddr::base_name_of(n))
            .collect();
        bases.sort_unstable();
        bases.dedup();
        bases
    }

    #[test]
    fn every_allocation_symbol_the_driver_can_return_is_intercepted() {
        // Whatever version a program asks for, the symbol the driver hands back for an
        // entry point the shim hooks at all (allocation, free, report, launch, ...) has an
        // interceptor: a family hooked at one version and not at another would let a program
        // built against the other slip past.
        let families = intercepted_families();
        for base in [
            "cuMemAlloc",
            "cuMemFree",
            "cuLaunchKernel",
            "cuLaunchGrid",
            "cuGraphLaunch",
            "cuGetProcAddress",
            "cuCtxCreate",
            "cuInit",
        ] {
            assert!(families.contains(&base), "{base} is not intercepted");
        }
        for base in families {
            // Every version the driver answers differently for, the oldest (pre-3.2,
            // 32-bit) exports included.
            for version in gpuslice_cuda_ffi::procaddr::versions_of(base)
                .iter()
                .map(|row| row.since)
            {
                for flags in [
                    0,
                    gpuslice_cuda_ffi::CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
                ] {
                    if let Ok(sym) = gpuslice_cuda_ffi::resolve(base, version, flags) {
                        assert!(
                            wrapper(sym.as_bytes()).is_some(),
                            "{base} {version} {flags} -> {sym}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn every_entry_point_holding_a_reference_on_a_vmm_handle_is_intercepted() {
        // The driver frees a cuMemCreate allocation when its last reference goes: its handle,
        // each retain, each mapping of it into an address range or (sparse arrays) a tile. The
        // shim counts them (`hooks::vmm`), so every entry point that takes or drops one,
        // every export of it, must be intercepted or the count, and the charge, goes wrong.
        // `cuMemImportFromShareableHandle` is not: an imported handle is its exporter's.
        let takers = [
            "cuMemCreate",
            "cuMemRelease",
            "cuMemRetainAllocationHandle",
            "cuMemMap",
            "cuMemUnmap",
            "cuMemMapArrayAsync",
        ];
        let rows: Vec<_> = gpuslice_cuda_ffi::procaddr::PROC_TABLE
            .iter()
            .filter(|row| takers.contains(&row.name))
            .collect();
        for name in takers {
            assert!(
                rows.iter().any(|row| row.name == name),
                "{name} missing from the table"
            );
        }
        for row in rows {
            for symbol in std::iter::once(row.symbol).chain(row.per_thread) {
                assert!(
                    NAMES.contains(&symbol),
                    "{symbol} takes or drops a reference on a VMM handle and is not intercepted"
                );
            }
        }
    }

    #[test]
    fn every_kernel_launch_entry_point_is_paced() {
        // Every launch entry point the driver table lists is intercepted (and so paced:
        // `hooks::launch` sends each through the one pacing path), the deprecated `cuLaunch`,
        // `cuLaunchGrid` and `cuLaunchGridAsync` included. `cuLaunchHostFunc` queues a host
        // function, not a kernel: nothing runs on the GPU to pace.
        let families = intercepted_families();
        let launches: Vec<&str> = gpuslice_cuda_ffi::procaddr::PROC_TABLE
            .iter()
            .map(|row| row.name)
            .filter(|n| n.starts_with("cuLaunch") || n.starts_with("cuGraphLaunch"))
            .filter(|n| *n != "cuLaunchHostFunc")
            .collect();
        for name in [
            "cuLaunch",
            "cuLaunchGrid",
            "cuLaunchGridAsync",
            "cuLaunchKernel",
            "cuLaunchCooperativeKernelMultiDevice",
        ] {
            assert!(launches.contains(&name), "{name} missing from the table");
        }
        for name in launches {
            assert!(
                families.contains(&name),
                "launch entry point {name} is not paced"
            );
        }
    }
}
