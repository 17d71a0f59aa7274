//! Writing a command's output: one place that turns a closed stdout into an error.

use std::io::Write;

/// Standard output could not be written (closed, full).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct OutputError(#[from] std::io::Error);

/// Writes a command's output to stdout.
pub fn out(text: &str) -> Result<(), OutputError> {
    let mut stdout = std::io::stdout().lock();
    Ok(stdout
        .write_all(text.as_bytes())
        .and_then(|_| stdout.flush())?)
}
