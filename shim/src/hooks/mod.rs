//! The exported interceptors, one file per family. Each has the real symbol's exact name
//! and C signature, runs under [`crate::guard::guard`], and calls the real entry point from
//! [`crate::real`].

#![allow(non_snake_case)]

/// Unwraps a `Result<T, CUresult>` or returns the error code from the interceptor.
macro_rules! tri {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(r) => return r,
        }
    };
}

/// The real entry point, or `CUDA_ERROR_NOT_FOUND` when the driver lacks it.
macro_rules! real {
    ($name:ident) => {
        match crate::real::cu::$name() {
            Some(f) => f,
            None => return gpuslice_cuda_ffi::CUDA_ERROR_NOT_FOUND,
        }
    };
}

pub mod arrays;
pub mod context;
pub mod graph;
pub mod info;
pub mod launch;
pub mod memory;
pub mod nvml;
pub mod pools;
pub mod procaddr;
pub mod vmm;
