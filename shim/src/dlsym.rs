//! `dlsym` and `dlvsym` interception: a program that `dlopen`s `libcuda.so.1` and looks
//! entry points up by name (or `libnvidia-ml.so.1`) gets the shim's interceptors, as a
//! program linked against the library does through the preload order.
//!
//! The real `dlsym` and `dlvsym` interpret `RTLD_NEXT` relative to their caller's return
//! address, so a wrapper that called them would make every `RTLD_NEXT` lookup of another
//! library relative to the shim. On x86_64 the exported `dlsym` and `dlvsym` are therefore
//! naked trampolines that tail-jump to the real function for `RTLD_NEXT` (the return address
//! stays the caller's) and to the Rust lookup otherwise. Elsewhere `RTLD_NEXT` lookups are
//! answered relative to the shim (documented gap).

use std::ffi::{c_char, c_void, CStr};

use crate::guard::guard;
use crate::intercept::wrapper;
use crate::real::{real_dlsym, real_dlvsym};

/// What the shim hands out for `name`, which the real lookup resolved to `found`: the
/// interceptor for an intercepted driver or NVML symbol that exists in the looked-up scope,
/// else what the real lookup found.
fn hand_out(found: *mut c_void, name: *const c_char) -> *mut c_void {
    if found.is_null() || name.is_null() {
        return found;
    }
    // SAFETY: the real lookup found a symbol, so name is a valid C string.
    let bytes = unsafe { CStr::from_ptr(name) }.to_bytes();
    if !(bytes.starts_with(b"cu") || bytes.starts_with(b"nvml")) {
        return found;
    }
    wrapper(bytes).unwrap_or(found)
}

/// The real `dlsym`'s address, for the trampoline (null if glibc has none: then the
/// trampoline returns null).
extern "C" fn real_dlsym_addr() -> *mut c_void {
    real_dlsym().map_or(std::ptr::null_mut(), |f| f as *mut c_void)
}

/// The real `dlvsym`'s address, for the trampoline (null as for `dlsym`).
extern "C" fn real_dlvsym_addr() -> *mut c_void {
    real_dlvsym().map_or(std::ptr::null_mut(), |f| f as *mut c_void)
}

/// Looks `name` up for real, then hands out what [`hand_out`] says.
extern "C" fn dlsym_impl(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    guard("dlsym", std::ptr::null_mut(), || {
        let Some(real) = real_dlsym() else {
            return std::ptr::null_mut();
        };
        // SAFETY: the caller's arguments, passed through.
        hand_out(unsafe { real(handle, name) }, name)
    })
}

/// Looks `name` at `version` up for real, then hands out what [`hand_out`] says.
extern "C" fn dlvsym_impl(
    handle: *mut c_void,
    name: *const c_char,
    version: *const c_char,
) -> *mut c_void {
    guard("dlvsym", std::ptr::null_mut(), || {
        let Some(real) = real_dlvsym() else {
            return std::ptr::null_mut();
        };
        // SAFETY: the caller's arguments, passed through.
        hand_out(unsafe { real(handle, name, version) }, name)
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

#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlvsym(
    handle: *mut c_void,
    name: *const c_char,
    version: *const c_char,
) -> *mut c_void {
    // As dlsym, with the third argument (rdx) kept too. Stack: 8 at entry + 24 pushed =
    // 16-byte aligned call.
    core::arch::naked_asm!(
        "cmp rdi, -1",
        "jne {imp}",
        "push rdi",
        "push rsi",
        "push rdx",
        "call {next}",
        "pop rdx",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 2f",
        "jmp rax",
        "2:",
        "ret",
        imp = sym dlvsym_impl,
        next = sym real_dlvsym_addr,
    )
}

#[cfg(not(target_arch = "x86_64"))]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    dlsym_impl(handle, name)
}

#[cfg(not(target_arch = "x86_64"))]
#[no_mangle]
pub unsafe extern "C" fn dlvsym(
    handle: *mut c_void,
    name: *const c_char,
    version: *const c_char,
) -> *mut c_void {
    dlvsym_impl(handle, name, version)
}
