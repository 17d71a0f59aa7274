//! Equality of the registry's fixed-length identifiers (GPU UUIDs, boot ids) eight bytes at a
//! time: every registry operation compares them once per reservation, and the static
//! create-path build links musl, whose `memcmp` (behind `==` on strings) goes a byte at a time.

/// `a == b`, without a call to `memcmp`.
pub(crate) fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let (mut wa, mut wb) = (a.chunks_exact(8), b.chunks_exact(8));
    for (x, y) in (&mut wa).zip(&mut wb) {
        let x: [u8; 8] = x.try_into().unwrap_or_default();
        let y: [u8; 8] = y.try_into().unwrap_or_default();
        if u64::from_ne_bytes(x) != u64::from_ne_bytes(y) {
            return false;
        }
    }
    wa.remainder()
        .iter()
        .zip(wb.remainder())
        .all(|(x, y)| x == y)
}

#[cfg(test)]
mod tests {
    use super::same;

    #[test]
    fn agrees_with_eq_on_every_length_and_position() {
        let base = "GPU-371d38fa-b643-52bd-b498-5aaafe5093ad";
        for len in 0..=base.len() {
            let a = &base[..len];
            assert!(same(a, a), "{a}");
            // A difference at each position, in the words and in the tail.
            for i in 0..len {
                let mut b = a.as_bytes().to_vec();
                b[i] ^= 1;
                let b = String::from_utf8(b).unwrap();
                assert!(!same(a, &b), "{a} vs {b}");
            }
            if len > 0 {
                assert!(!same(a, &base[..len - 1]), "lengths differ");
            }
        }
        assert!(same("", ""));
    }
}
