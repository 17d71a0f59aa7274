//! `memcpy` and `memmove` for the static (musl) build of the create-path binaries. musl's
//! x86_64 `memcpy` moves an unaligned head and tail a byte at a time with microcoded `movsb`
//! and starts `rep movsq` for every length; its `memmove` copies backwards with
//! `std; rep movsb`. The create path makes thousands of short copies (the registry's strings,
//! JSON values, paths), and sampling put 7 % of a hook's time in `memcpy`. Here a copy of up to
//! 32 bytes is two loads and two stores, longer ones move 32 bytes a step, and long
//! non-overlapping ones use `rep movsb`. Linked before libc, these definitions are the ones the
//! static binaries use (libc's `memmove`, the only user of its `memcpy` internals, is then not
//! linked either); glibc builds keep glibc's.

/// Copies `n` bytes from `s` to `d`, as C's `memcpy`; returns `d`.
///
/// # Safety
/// `s` must point to `n` readable bytes and `d` to `n` writable ones, not overlapping (C's
/// contract for `memcpy`).
#[cfg(all(target_env = "musl", not(test)))]
#[no_mangle]
pub unsafe extern "C" fn memcpy(d: *mut u8, s: *const u8, n: usize) -> *mut u8 {
    // SAFETY: the caller's contract, forwarded.
    unsafe { copy(d, s, n) };
    d
}

/// Copies `n` bytes from `s` to `d`, which may overlap, as C's `memmove`; returns `d`.
///
/// # Safety
/// `s` must point to `n` readable bytes and `d` to `n` writable ones (C's contract for
/// `memmove`).
#[cfg(all(target_env = "musl", not(test)))]
#[no_mangle]
pub unsafe extern "C" fn memmove(d: *mut u8, s: *const u8, n: usize) -> *mut u8 {
    // SAFETY: the caller's contract, forwarded.
    unsafe { move_bytes(d, s, n) };
    d
}

/// Lengths from which a non-overlapping copy uses `rep movsb` (fast on CPUs with ERMS, slow
/// to start).
const REP_MOVSB_FROM: usize = 2048;

#[inline(always)]
unsafe fn load<T>(p: *const u8) -> T {
    // SAFETY: the caller keeps `p .. p + size_of::<T>()` readable; unaligned reads are
    // allowed by `read_unaligned`.
    unsafe { p.cast::<T>().read_unaligned() }
}

#[inline(always)]
unsafe fn store<T>(p: *mut u8, v: T) {
    // SAFETY: the caller keeps `p .. p + size_of::<T>()` writable; unaligned writes are
    // allowed by `write_unaligned`.
    unsafe { p.cast::<T>().write_unaligned(v) }
}

/// Copies `n <= 32` bytes, reading all of them before writing any (so overlap is harmless):
/// two possibly overlapping loads of the widest size that fits.
///
/// # Safety
/// `s .. s + n` readable, `d .. d + n` writable, `n <= 32`.
#[inline(always)]
unsafe fn small(d: *mut u8, s: *const u8, n: usize) {
    // SAFETY: every access below lies within the first or last bytes of the `n`
    // bytes at `s` or `d`, of a size no larger than `n` in its branch.
    unsafe {
        if n >= 16 {
            let (a, b) = (load::<u128>(s), load::<u128>(s.add(n - 16)));
            store(d, a);
            store(d.add(n - 16), b);
        } else if n >= 8 {
            let (a, b) = (load::<u64>(s), load::<u64>(s.add(n - 8)));
            store(d, a);
            store(d.add(n - 8), b);
        } else if n >= 4 {
            let (a, b) = (load::<u32>(s), load::<u32>(s.add(n - 4)));
            store(d, a);
            store(d.add(n - 4), b);
        } else if n > 0 {
            let (a, b, c) = (*s, *s.add(n / 2), *s.add(n - 1));
            *d = a;
            *d.add(n / 2) = b;
            *d.add(n - 1) = c;
        }
    }
}

/// Copies front to back, 32 bytes a step; the last 32 bytes are read before anything is
/// written, so this is also right when `d` lies before `s` and they overlap.
///
/// # Safety
/// `s .. s + n` readable, `d .. d + n` writable, `n > 32`, and `d <= s` if they overlap.
#[inline(always)]
unsafe fn forward(d: *mut u8, s: *const u8, n: usize) {
    // SAFETY: for every access below, `i + 32 < n` in the loop, and the tail is the last 32 of
    // `n > 32` bytes. A step's stores land below the bytes later steps read (`d <= s`), and
    // the tail was read first.
    unsafe {
        let (t0, t1) = (load::<u128>(s.add(n - 32)), load::<u128>(s.add(n - 16)));
        let mut i = 0;
        while i + 32 < n {
            let (a, b) = (load::<u128>(s.add(i)), load::<u128>(s.add(i + 16)));
            store(d.add(i), a);
            store(d.add(i + 16), b);
            i += 32;
        }
        store(d.add(n - 32), t0);
        store(d.add(n - 16), t1);
    }
}

/// Copies back to front, 32 bytes a step; the first 32 bytes are read before anything is
/// written, so this is right when `d` lies after `s` and they overlap.
///
/// # Safety
/// `s .. s + n` readable, `d .. d + n` writable, `n > 32`, and `d >= s` if they overlap.
#[inline(always)]
unsafe fn backward(d: *mut u8, s: *const u8, n: usize) {
    // SAFETY: for every access below, `end > 32` in the loop, so `end - 32 .. end` lies within
    // the `n` bytes; a step's stores land above the bytes later steps read (`d >= s`), and
    // the head was read first.
    unsafe {
        let (h0, h1) = (load::<u128>(s), load::<u128>(s.add(16)));
        let mut end = n;
        while end > 32 {
            let (a, b) = (load::<u128>(s.add(end - 32)), load::<u128>(s.add(end - 16)));
            store(d.add(end - 32), a);
            store(d.add(end - 16), b);
            end -= 32;
        }
        store(d, h0);
        store(d.add(16), h1);
    }
}

/// `rep movsb`: fast for long copies on CPUs with ERMS.
///
/// # Safety
/// `s .. s + n` readable, `d .. d + n` writable, not overlapping.
#[inline(always)]
unsafe fn rep_movsb(d: *mut u8, s: *const u8, n: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: copies exactly `n` bytes from `s` to `d` (the caller's ranges) front to back;
    // the direction flag is clear at every call boundary (System V ABI); it touches only
    // rcx, rdi, rsi (declared) and memory, not the stack or flags.
    unsafe {
        std::arch::asm!(
            "rep movsb",
            inout("rcx") n => _,
            inout("rdi") d => _,
            inout("rsi") s => _,
            options(nostack, preserves_flags)
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: the caller's contract, forwarded (`n > 32` for every caller).
    unsafe {
        forward(d, s, n)
    }
}

/// The copy behind [`memcpy`], callable in tests on every target.
///
/// # Safety
/// `s .. s + n` readable, `d .. d + n` writable, not overlapping.
#[inline(always)]
pub unsafe fn copy(d: *mut u8, s: *const u8, n: usize) {
    // SAFETY: the caller's contract; each callee's length condition holds in its branch.
    unsafe {
        if n <= 32 {
            small(d, s, n);
        } else if n >= REP_MOVSB_FROM {
            rep_movsb(d, s, n);
        } else {
            forward(d, s, n);
        }
    }
}

/// The move behind [`memmove`], callable in tests on every target.
///
/// # Safety
/// `s .. s + n` readable, `d .. d + n` writable.
#[inline(always)]
pub unsafe fn move_bytes(d: *mut u8, s: *const u8, n: usize) {
    let (da, sa) = (d as usize, s as usize);
    // SAFETY: the caller's contract; each callee's length and overlap conditions hold in its
    // branch (`small` reads everything first; `d` before `s` for `forward`, after for
    // `backward`; `rep movsb` only without overlap).
    unsafe {
        if n <= 32 {
            small(d, s, n);
        } else if da.wrapping_sub(sa) >= n {
            // `d` before `s`, or at least `n` bytes after it.
            if n >= REP_MOVSB_FROM && (da >= sa || sa - da >= n) {
                rep_movsb(d, s, n);
            } else {
                forward(d, s, n);
            }
        } else {
            backward(d, s, n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{copy, move_bytes};

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 131 + 7) as u8).collect()
    }

    const LENGTHS: &[usize] = &[
        0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 48, 63, 64, 65, 95, 96, 97, 200,
        1000, 2047, 2048, 2049, 5000,
    ];

    #[test]
    fn copy_agrees_with_the_standard_copy_at_every_length_and_alignment() {
        for &n in LENGTHS {
            for so in 0..9 {
                for dof in 0..9 {
                    let src = pattern(n + 16);
                    let mut want = vec![0xeeu8; n + 32];
                    let mut got = want.clone();
                    want[dof..dof + n].copy_from_slice(&src[so..so + n]);
                    // SAFETY: both ranges lie within their vectors, which are distinct.
                    unsafe { copy(got.as_mut_ptr().add(dof), src.as_ptr().add(so), n) };
                    assert_eq!(got, want, "n {n} src +{so} dst +{dof}");
                }
            }
        }
    }

    #[test]
    fn move_agrees_with_the_standard_move_for_every_overlap() {
        for &n in LENGTHS {
            // Destination before, on and after the source, overlapping or not.
            let shifts: Vec<isize> = [-(n as isize) - 3, -(n as isize), -33, -32, -17, -8, -1]
                .into_iter()
                .chain([0, 1, 8, 17, 32, 33, n as isize, n as isize + 3])
                .collect();
            for shift in shifts {
                let base = n + 40;
                let mut want = pattern(3 * base);
                let mut got = want.clone();
                let s = base;
                let d = (base as isize + shift) as usize;
                want.copy_within(s..s + n, d);
                let p = got.as_mut_ptr();
                // SAFETY: `s .. s + n` and `d .. d + n` lie within the vector.
                unsafe { move_bytes(p.add(d), p.add(s), n) };
                assert_eq!(got, want, "n {n} shift {shift}");
            }
        }
    }
}
