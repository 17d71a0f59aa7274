//! A mutex-protected value that a forked child can replace without touching the parent's
//! lock (which another parent thread may have held at `fork`): the child handler swaps in a
//! fresh value and leaks the old one, so no child ever waits on a lock nobody will release.

use std::sync::atomic::{
    AtomicPtr,
    Ordering::{AcqRel, Acquire},
};
use std::sync::{Mutex, MutexGuard};

/// See the module documentation.
pub struct ForkSafe<T: 'static> {
    ptr: AtomicPtr<Mutex<T>>,
    make: fn() -> T,
}

impl<T: 'static> ForkSafe<T> {
    pub const fn new(make: fn() -> T) -> ForkSafe<T> {
        ForkSafe {
            ptr: AtomicPtr::new(std::ptr::null_mut()),
            make,
        }
    }

    fn cell(&self) -> &'static Mutex<T> {
        let p = self.ptr.load(Acquire);
        if !p.is_null() {
            // SAFETY: p came from Box::leak below and is never freed.
            return unsafe { &*p };
        }
        let fresh = Box::into_raw(Box::new(Mutex::new((self.make)())));
        match self
            .ptr
            .compare_exchange(std::ptr::null_mut(), fresh, AcqRel, Acquire)
        {
            // SAFETY: fresh is a leaked Box that lives for the rest of the process.
            Ok(_) => unsafe { &*fresh },
            Err(existing) => {
                // SAFETY: fresh was never shared; existing is a leaked Box as above.
                unsafe {
                    drop(Box::from_raw(fresh));
                    &*existing
                }
            }
        }
    }

    /// Locks the value (a poisoned lock is taken over: the data stays consistent because
    /// every critical section is a plain map update).
    pub fn lock(&self) -> MutexGuard<'static, T> {
        self.cell().lock().unwrap_or_else(|e| e.into_inner())
    }

    /// For the child after `fork`: forget the inherited value.
    pub fn reset_in_child(&self) {
        let fresh = Box::into_raw(Box::new(Mutex::new((self.make)())));
        let _old = self.ptr.swap(fresh, AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static V: ForkSafe<Vec<u32>> = ForkSafe::new(Vec::new);

    #[test]
    fn reset_gives_a_fresh_unlocked_value() {
        V.lock().push(1);
        let held = V.lock();
        V.reset_in_child();
        assert!(
            V.lock().is_empty(),
            "the child sees a fresh value and is not blocked"
        );
        drop(held);
    }
}
