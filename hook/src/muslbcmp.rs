//! `bcmp` eight bytes at a time for the static (musl) build of the create-path binaries.
//! Every `==` on strings and byte slices ends in `bcmp`, and musl's compares a byte at a time
//! (through its `memcmp`): a tenth of a hook's instructions went there (registry ids, UUIDs,
//! boot ids, config and JSON keys). Linked before libc, this definition is the one the static
//! binaries use; glibc builds keep glibc's.

/// Whether the `n` bytes at `a` and `b` differ (0: equal), as C's `bcmp`.
///
/// # Safety
/// `a` and `b` must each point to `n` readable bytes (C's contract for `bcmp`).
#[cfg(all(target_env = "musl", not(test)))]
#[no_mangle]
pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: the caller's contract, forwarded.
    unsafe { differ(a, b, n) }
}

/// The comparison behind [`bcmp`], callable in tests on every target.
///
/// # Safety
/// `a` and `b` must each point to `n` readable bytes.
#[inline(always)]
pub unsafe fn differ(a: *const u8, b: *const u8, n: usize) -> i32 {
    let mut i = 0;
    while n - i >= 8 {
        // SAFETY: `i + 8 <= n`, so both reads stay within the caller's `n` bytes; unaligned
        // reads are allowed by `read_unaligned`.
        let (x, y) = unsafe {
            (
                a.add(i).cast::<u64>().read_unaligned(),
                b.add(i).cast::<u64>().read_unaligned(),
            )
        };
        if x != y {
            return 1;
        }
        i += 8;
    }
    while i < n {
        // SAFETY: `i < n`.
        let (x, y) = unsafe { (*a.add(i), *b.add(i)) };
        if x != y {
            return 1;
        }
        i += 1;
    }
    0
}

#[cfg(test)]
mod tests {
    use super::differ;

    fn same(a: &[u8], b: &[u8]) -> bool {
        assert_eq!(a.len(), b.len());
        // SAFETY: both slices hold `a.len()` bytes.
        unsafe { differ(a.as_ptr(), b.as_ptr(), a.len()) == 0 }
    }

    #[test]
    fn agrees_with_slice_equality_at_every_length_offset_and_difference() {
        let base: Vec<u8> = (0..80u8).map(|i| i.wrapping_mul(37)).collect();
        for start in 0..8 {
            for len in 0..(base.len() - start) {
                let a = &base[start..start + len];
                let copy = a.to_vec();
                assert!(same(a, &copy), "start {start} len {len}");
                for i in 0..len {
                    let mut b = copy.clone();
                    b[i] ^= 0x80;
                    assert!(!same(a, &b), "start {start} len {len} at {i}");
                }
            }
        }
    }
}
