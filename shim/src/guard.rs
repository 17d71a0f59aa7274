//! Keeps panics from crossing the FFI boundary: every exported function runs its body
//! through [`guard`], which turns a panic into an error code (and one log line).

use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `body`; if it panics, logs and returns `on_panic` instead.
#[inline(always)]
pub fn guard<R: Copy>(name: &str, on_panic: R, body: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(r) => r,
        Err(_) => {
            crate::log::error!("{name}: internal error (panic caught), returning an error code");
            on_panic
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panics_become_the_error_value() {
        assert_eq!(guard("t", 7, || 1), 1);
        assert_eq!(guard("t", 7, || panic!("boom")), 7);
    }
}
