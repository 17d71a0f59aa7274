//! The FFI boundary: every export runs its body through [`guard`], which turns a panic into
//! `CUDA_ERROR_UNKNOWN` (no panic may unwind into C), and reads and writes caller pointers
//! only through the null-checking helpers here. These helpers are the trust boundary: they
//! are only ever given pointers that a C caller passed to an export, whose contract (the
//! CUDA driver API) makes every non-null pointer valid for the access the API defines.

use std::ffi::{c_char, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use gpuslice_cuda_ffi::{CUresult, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_UNKNOWN, CUDA_SUCCESS};

/// What export bodies return: `Err` carries the failing status.
pub type CuResult<T = ()> = Result<T, CUresult>;

/// Runs an export body, mapping `Ok` to `CUDA_SUCCESS` and a panic to `CUDA_ERROR_UNKNOWN`.
pub fn guard(f: impl FnOnce() -> CuResult) -> CUresult {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => CUDA_SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => CUDA_ERROR_UNKNOWN,
    }
}

/// Writes `value` through a caller's out-pointer; null is `CUDA_ERROR_INVALID_VALUE`.
pub fn put<T>(ptr: *mut T, value: T) -> CuResult {
    if ptr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the driver API contract: a non-null out-pointer points to writable storage
    // for one `T`; we checked non-null; `write` does not read or drop the old contents.
    unsafe { ptr.write(value) };
    Ok(())
}

/// Reads a caller's in-pointer; null is `CUDA_ERROR_INVALID_VALUE`.
pub fn get<T: Copy>(ptr: *const T) -> CuResult<T> {
    if ptr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the driver API contract: a non-null in-pointer points to an initialised `T`;
    // `read_unaligned` tolerates callers' packing.
    Ok(unsafe { ptr.read_unaligned() })
}

/// Reads `count` elements of a caller's array (null allowed only when `count` is 0).
pub fn get_slice<T: Copy>(ptr: *const T, count: usize) -> CuResult<Vec<T>> {
    if count == 0 {
        return Ok(Vec::new());
    }
    if ptr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the driver API contract: `ptr` points to `count` initialised elements.
    Ok((0..count)
        .map(|i| unsafe { ptr.add(i).read_unaligned() })
        .collect())
}

/// Borrows a caller's NUL-terminated string; null is `CUDA_ERROR_INVALID_VALUE`.
pub fn c_str<'a>(ptr: *const c_char) -> CuResult<&'a CStr> {
    if ptr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the driver API contract: a non-null string argument is NUL-terminated and
    // outlives the call; the borrow does not escape the export.
    Ok(unsafe { CStr::from_ptr(ptr) })
}

/// Copies `text` into a caller's buffer of `len` bytes, truncating, always NUL-terminated.
pub fn put_str(buf: *mut c_char, len: i32, text: &str) -> CuResult {
    if buf.is_null() || len <= 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let bytes = text.as_bytes();
    let n = bytes.len().min(len as usize - 1);
    // SAFETY: the caller's buffer holds `len` bytes; we write `n + 1 <= len` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), buf, n);
        buf.add(n).write(0);
    }
    Ok(())
}
