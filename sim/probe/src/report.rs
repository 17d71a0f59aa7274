//! Output: one line of text for people, or one JSON object per line for tests and scripts,
//! flushed at once so a caller reading a held process's output sees it immediately.

use std::io::Write;

/// Where results go.
#[derive(Debug, Clone, Copy)]
pub struct Out {
    pub json: bool,
}

impl Out {
    /// Prints `value` (JSON mode) or `human()` (text mode) and flushes stdout.
    pub fn emit(&self, value: serde_json::Value, human: impl FnOnce() -> String) {
        let mut stdout = std::io::stdout().lock();
        let _ = if self.json {
            writeln!(stdout, "{value}")
        } else {
            writeln!(stdout, "{}", human())
        };
        let _ = stdout.flush();
    }
}

/// Bytes as `12Gi` when exact, else with two decimals in the largest binary unit.
pub fn human_bytes(b: u64) -> String {
    let exact = gpuslice_config::format_bytes(b);
    if !exact.chars().all(|c| c.is_ascii_digit()) || b < 1024 {
        return exact;
    }
    for (name, size) in [
        ("Ti", 1u64 << 40),
        ("Gi", 1 << 30),
        ("Mi", 1 << 20),
        ("Ki", 1 << 10),
    ] {
        if b >= size {
            return format!("{:.2}{name}", b as f64 / size as f64);
        }
    }
    exact
}
