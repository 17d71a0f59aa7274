//! Escaping for text that reaches an operator's terminal: `gpuslice status` and
//! `kubectl-gpuslice` print names taken from annotations, the driver and the API server.

/// `s` with every control character (newline, escape, bell, …) written as a Rust escape
/// (`\n`, `\u{1b}`): names from annotations and the driver reach the operator's terminal,
/// where they must not move the cursor or forge lines.
pub fn printable(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_others_kept() {
        assert_eq!(printable("plain ünïcode"), "plain ünïcode");
        assert_eq!(
            printable("a\u{1b}[2J\nb\tc\u{7f}\u{85}"),
            "a\\u{1b}[2J\\nb\\tc\\u{7f}\\u{85}"
        );
    }
}
