//! `dlopen` / `dlsym` / `dlvsym`, the way programs reach the driver: by handle, or through
//! the global scope (`RTLD_DEFAULT`), where a preloaded library comes first.

use std::ffi::{c_void, CStr, CString};

use crate::error::ProbeError;

/// A library opened with `RTLD_NOW | RTLD_GLOBAL` (as if linked), never closed.
#[derive(Debug)]
pub struct Library {
    pub name: String,
    handle: *mut c_void,
}

fn dlerror() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated thread-local message.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown dlopen error".to_string()
    } else {
        // SAFETY: non-null dlerror results are valid C strings until the next dl* call.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

impl Library {
    /// Opens `name` (a soname searched like the dynamic linker does, or a path).
    pub fn open(name: &str) -> Result<Library, ProbeError> {
        let c = CString::new(name).map_err(|_| ProbeError::Load {
            lib: name.into(),
            detail: "name contains NUL".into(),
        })?;
        // SAFETY: dlopen with a valid C string; the result is checked for null.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if handle.is_null() {
            return Err(ProbeError::Load {
                lib: name.into(),
                detail: dlerror(),
            });
        }
        Ok(Library {
            name: name.into(),
            handle,
        })
    }

    /// `dlsym(handle, symbol)`.
    pub fn sym(&self, symbol: &str) -> Option<*mut c_void> {
        lookup(self.handle, symbol)
    }

    /// `dlvsym(handle, symbol, version)`.
    pub fn vsym(&self, symbol: &str, version: &str) -> Option<*mut c_void> {
        let (c, v) = (CString::new(symbol).ok()?, CString::new(version).ok()?);
        // SAFETY: dlvsym with a handle from dlopen and valid C strings.
        let p = unsafe { libc::dlvsym(self.handle, c.as_ptr(), v.as_ptr()) };
        (!p.is_null()).then_some(p)
    }
}

/// `dlsym(RTLD_DEFAULT, symbol)`: the first definition in global scope.
pub fn global_sym(symbol: &str) -> Option<*mut c_void> {
    lookup(libc::RTLD_DEFAULT, symbol)
}

fn lookup(handle: *mut c_void, symbol: &str) -> Option<*mut c_void> {
    let c = CString::new(symbol).ok()?;
    // SAFETY: dlsym with a handle from dlopen (or RTLD_DEFAULT) and a valid C string.
    let p = unsafe { libc::dlsym(handle, c.as_ptr()) };
    (!p.is_null()).then_some(p)
}

/// Reinterprets a resolved symbol as the function pointer type `F`.
///
/// # Safety
/// `p` must be the address of a function whose C signature is exactly `F`'s.
pub unsafe fn as_fn<F: Copy>(p: *mut c_void) -> F {
    const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<*mut c_void>()) };
    // SAFETY: same size (checked above); the caller guarantees `p` is a function of type F.
    unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) }
}
