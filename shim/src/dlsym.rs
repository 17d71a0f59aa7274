//! `dlsym` interception: a program that `dlopen`s `libcuda.so.1` and looks entry points up
//! by name (or `libnvidia-ml.so.1`) gets the shim's interceptors, as a program linked
//! against the library does through the preload order.
//!
//! The real `dlsym` interprets `RTLD_NEXT` relative to its caller's return address, so a
//! wrapper that called it would make every `RTLD_NEXT` lookup of another library relative
//! to the shim. On x86_64 the exported `dlsym` is therefore a naked trampoline that
//! tail-jumps to the real `dlsym` for `RTLD_NEXT` (the return address stays the caller's)
//! and to the Rust lookup otherwise. Elsewhere `RTLD_NEXT` lookups are answered relative to
//! the shim (documented gap).

use std::ffi::{c_char, c_void, CStr};

use crate::guard::guard;
use crate::intercept::wrapper;
use crate::real::real_dlsym;

/// The real `dlsym`'s address, for the trampoline (null if glibc has none: then the
/// trampoline returns null).
extern "C" fn real_dlsym_addr() -> *mut c_void {
    real_dlsym().map_or(std::ptr::null_mut(), |f| f as *mut c_void)
}

/// Looks `name` up for real, then hands out the interceptor for intercepted driver symbols
/// that exist in the looked-up scope.
extern "C" fn dlsym_impl(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    guard("dlsym", std::ptr::null_mut(), || {
        let Some(real) = real_dlsym() else {
            return std::ptr::null_mut();
        };
        // SAFETY: the caller's arguments, passed through.
        let found = unsafe { real(handle, name) };
        if found.is_null() || name.is_null() {
            return found;
        }
        // SAFETY: the real dlsym found a symbol, so name is a valid C string.
        let bytes = unsafe { CStr::from_ptr(name) }.to_bytes();
        if !(bytes.starts_with(b"cu") || bytes.starts_with(b"nvml")) {
            return found;
        }
        wrapper(bytes).unwrap_or(found)
    })
}

#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    // RTLD_NEXT is ((void *) -1). Stack: 8 at entry + 16 pushed + 8 = 16-byte aligned call.
    core::arch::naked_asm!(
        "cmp rdi, -1",
        "jne {imp}",
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {next}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 2f",
        "jmp rax",
        "2:",
        "ret",
        imp = sym dlsym_impl,
        next = sym real_dlsym_addr,
    )
}

#[cfg(not(target_arch = "x86_64"))]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    dlsym_impl(handle, name)
}
