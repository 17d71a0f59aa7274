//! `cuGetProcAddress` and `cuGetProcAddress_v2` of the simulated driver resolve a base name,
//! version and per-thread flag to the symbol the real driver would return, per the shared
//! cuda-ffi table: the pointer handed out is the library's own export of that name.

use crate::common;

use std::ffi::{c_void, CString};

use gpuslice_cuda_ffi::procaddr::PROC_TABLE;
use gpuslice_cuda_ffi::*;

struct Lib(*mut c_void);

impl Lib {
    fn open() -> Lib {
        let path = CString::new(
            common::built_libs()
                .join("libgpuslice_sim_cuda.so")
                .to_str()
                .unwrap(),
        )
        .unwrap();
        // SAFETY: dlopen of the simulated driver by path; checked for null.
        let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!h.is_null(), "dlopen the simulated libcuda");
        Lib(h)
    }

    fn sym(&self, name: &str) -> *mut c_void {
        let c = CString::new(name).unwrap();
        // SAFETY: a live handle and a C string.
        unsafe { libc::dlsym(self.0, c.as_ptr()) }
    }

    /// cuGetProcAddress_v2(name, version, flags) → (status, pointer, symbol status).
    fn resolve2(&self, name: &str, version: i32, flags: u64) -> (CUresult, *mut c_void, i32) {
        // SAFETY: the export has this signature.
        let f: PFN_cuGetProcAddress_v2 =
            unsafe { std::mem::transmute(self.sym("cuGetProcAddress_v2")) };
        let c = CString::new(name).unwrap();
        let (mut p, mut status) = (std::ptr::null_mut(), -1);
        // SAFETY: valid string and out-pointers.
        let r = unsafe { f(c.as_ptr(), &mut p, version, flags, &mut status) };
        (r, p, status)
    }

    fn resolve1(&self, name: &str, version: i32, flags: u64) -> (CUresult, *mut c_void) {
        // SAFETY: the export has this signature.
        let f: PFN_cuGetProcAddress = unsafe { std::mem::transmute(self.sym("cuGetProcAddress")) };
        let c = CString::new(name).unwrap();
        let mut p = std::ptr::null_mut();
        // SAFETY: valid string and out-pointer.
        let r = unsafe { f(c.as_ptr(), &mut p, version, flags) };
        (r, p)
    }
}

const PT: u64 = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;

#[test]
fn resolves_each_version_to_its_own_export() {
    let lib = Lib::open();
    let mut checked = 0;
    for row in PROC_TABLE {
        for (flags, symbol) in [
            (0, Some(row.symbol)),
            (PT, row.per_thread.or(Some(row.symbol))),
        ] {
            let symbol = symbol.unwrap();
            let exported = lib.sym(symbol);
            let (r, p, status) = lib.resolve2(row.name, row.since, flags);
            if exported.is_null() {
                // The real driver has it; the simulation does not implement it.
                assert_eq!(
                    (r, status),
                    (CUDA_ERROR_NOT_FOUND, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND),
                    "{row:?}"
                );
                assert!(p.is_null());
                continue;
            }
            assert_eq!(
                (r, status),
                (CUDA_SUCCESS, CU_GET_PROC_ADDRESS_SUCCESS),
                "{row:?}"
            );
            assert_eq!(
                p, exported,
                "{} at {} (flags {flags}) must be {symbol}",
                row.name, row.since
            );
            assert_eq!(
                lib.resolve1(row.name, row.since, flags),
                (CUDA_SUCCESS, exported)
            );
            checked += 1;
        }
    }
    assert!(checked > 80, "only {checked} rows resolved");
}

#[test]
fn version_specific_answers() {
    let lib = Lib::open();
    let at = |name: &str, version: i32| lib.resolve2(name, version, 0).1;
    assert_eq!(at("cuMemAlloc", 12040), lib.sym("cuMemAlloc_v2"));
    assert_eq!(at("cuCtxCreate", 11080), lib.sym("cuCtxCreate_v3"));
    assert_eq!(at("cuCtxCreate", 12040), lib.sym("cuCtxCreate_v3"));
    assert_eq!(at("cuCtxCreate", 12050), lib.sym("cuCtxCreate_v4"));
    assert_eq!(
        at("cuGraphInstantiate", 11080),
        lib.sym("cuGraphInstantiate_v2")
    );
    assert_eq!(
        at("cuGraphInstantiate", 12000),
        lib.sym("cuGraphInstantiateWithFlags")
    );
    assert_eq!(
        at("cuGetProcAddress", 12000),
        lib.sym("cuGetProcAddress_v2")
    );
    assert_eq!(at("cuGetProcAddress", 11080), lib.sym("cuGetProcAddress"));
    assert_eq!(
        lib.resolve2("cuLaunchKernel", 12040, PT).1,
        lib.sym("cuLaunchKernel_ptsz")
    );
    // cuMemAlloc before 3.2 is the 32-bit cuMemAlloc, which the simulation does not export.
    assert_eq!(lib.resolve2("cuMemAlloc", 3000, 0).0, CUDA_ERROR_NOT_FOUND);
}

#[test]
fn unknown_names_and_old_versions_are_not_found() {
    let lib = Lib::open();
    let (r, p, s) = lib.resolve2("cuNoSuchEntryPoint", 12040, 0);
    assert_eq!(
        (r, s),
        (CUDA_ERROR_NOT_FOUND, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND)
    );
    assert!(p.is_null());
    // Versioned names are not base names.
    assert_eq!(
        lib.resolve2("cuMemAlloc_v2", 12040, 0).0,
        CUDA_ERROR_NOT_FOUND
    );
    let (r, _, s) = lib.resolve2("cuMemAllocAsync", 11000, 0);
    assert_eq!(
        (r, s),
        (
            CUDA_ERROR_NOT_FOUND,
            CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
        )
    );
    assert_eq!(
        lib.resolve2("cuInit", 12040, 1 << 7).0,
        CUDA_ERROR_INVALID_VALUE,
        "unknown flags"
    );
}
