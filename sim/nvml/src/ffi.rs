//! The FFI boundary of the simulated NVML: a panic guard mapping panics to
//! `NVML_ERROR_UNKNOWN`, and null-checked helpers that are the only code touching caller
//! memory. They are only given pointers a C caller passed to an export, whose contract (the
//! NVML API) makes every non-null pointer valid for the access the API defines.

use std::ffi::{c_char, c_uint, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use gpuslice_cuda_ffi::nvml::*;

/// What export bodies return.
pub type NvResult<T = ()> = Result<T, nvmlReturn_t>;

/// Runs an export body: `Ok` is `NVML_SUCCESS`, a panic `NVML_ERROR_UNKNOWN`.
pub fn guard(f: impl FnOnce() -> NvResult) -> nvmlReturn_t {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => NVML_SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => NVML_ERROR_UNKNOWN,
    }
}

/// Writes through an out-pointer; null is `NVML_ERROR_INVALID_ARGUMENT`.
pub fn put<T>(ptr: *mut T, value: T) -> NvResult {
    if ptr.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: NVML contract: a non-null out-pointer points to writable storage for a `T`.
    unsafe { ptr.write(value) };
    Ok(())
}

/// Reads through an in-pointer; null is `NVML_ERROR_INVALID_ARGUMENT`.
pub fn get<T: Copy>(ptr: *const T) -> NvResult<T> {
    if ptr.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: NVML contract: a non-null in-pointer points to an initialised `T`.
    Ok(unsafe { ptr.read_unaligned() })
}

/// Borrows a caller's string argument.
pub fn c_str<'a>(ptr: *const c_char) -> NvResult<&'a str> {
    if ptr.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: NVML contract: string arguments are NUL-terminated and outlive the call.
    unsafe { CStr::from_ptr(ptr) }
        .to_str()
        .map_err(|_| NVML_ERROR_INVALID_ARGUMENT)
}

/// Copies `text` and a NUL into a caller's buffer of `len` bytes:
/// `NVML_ERROR_INSUFFICIENT_SIZE` when it does not fit, as NVML does.
pub fn put_str(buf: *mut c_char, len: c_uint, text: &str) -> NvResult {
    if buf.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let bytes = text.as_bytes();
    if bytes.len() + 1 > len as usize {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: the buffer holds `len >= bytes.len() + 1` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), buf, bytes.len());
        buf.add(bytes.len()).write(0);
    }
    Ok(())
}

/// Writes `items` into a caller's array of `capacity` elements.
pub fn put_slice<T: Copy>(ptr: *mut T, capacity: usize, items: &[T]) -> NvResult {
    if items.len() > capacity {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    if items.is_empty() {
        return Ok(());
    }
    if ptr.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: the caller's array holds `capacity >= items.len()` elements.
    unsafe { std::ptr::copy_nonoverlapping(items.as_ptr(), ptr, items.len()) };
    Ok(())
}
