//! Reservation ids: 16 lowercase hex characters from the OS random source, valid both as a
//! CDI device name and as a path component under `slices/`.

/// Length of a reservation id.
pub const ID_LEN: usize = 16;

/// A random id could not be drawn.
#[derive(Debug, thiserror::Error)]
#[error("cannot draw a random reservation id from the OS: {0}")]
pub struct IdError(getrandom::Error);

/// A fresh random id.
pub fn new_id() -> Result<String, IdError> {
    let mut bytes = [0u8; ID_LEN / 2];
    getrandom::getrandom(&mut bytes).map_err(IdError)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// True for exactly 16 lowercase hex characters (so never `..`, `/` or empty).
pub fn is_valid_id(s: &str) -> bool {
    s.len() == ID_LEN
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_valid_and_differ() {
        let a = new_id().expect("id");
        let b = new_id().expect("id");
        assert!(is_valid_id(&a), "{a}");
        assert_ne!(a, b);
        for bad in [
            "",
            "../../etc/passwd",
            "0123456789ABCDEF",
            "0123456789abcde",
            "0123456789abcdefa",
        ] {
            assert!(!is_valid_id(bad), "{bad}");
        }
    }
}
