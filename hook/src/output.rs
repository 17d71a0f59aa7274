//! Writing a command's output: one place that turns a closed stdout into an error.

use std::io::Write;

use crate::error::Error;

/// Writes a command's output to stdout.
pub fn out(text: &str) -> Result<(), Error> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|_| stdout.flush())
        .map_err(Error::Stdout)
}
