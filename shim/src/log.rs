//! Logging to stderr with a `gpuslice-shim:` prefix, at the verbosity `GPUSLICE_LOG` selects
//! (`error`, `warn`, `info`, `debug`; default `warn`). The variable is read once, on the
//! first message, never at load.

use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

/// Message severity, most severe first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Error = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
}

/// The variable that selects verbosity.
pub const LOG_ENV: &str = "GPUSLICE_LOG";

const UNSET: u8 = 0;
static MAX: AtomicU8 = AtomicU8::new(UNSET);

/// Parses a `GPUSLICE_LOG` value; unknown values give `None` (the default then applies).
pub fn parse_level(text: &str) -> Option<Level> {
    match text.trim().to_ascii_lowercase().as_str() {
        "error" => Some(Level::Error),
        "warn" | "warning" => Some(Level::Warn),
        "info" => Some(Level::Info),
        "debug" | "trace" => Some(Level::Debug),
        _ => None,
    }
}

fn max_level() -> u8 {
    let v = MAX.load(Relaxed);
    if v != UNSET {
        return v;
    }
    let level = std::env::var(LOG_ENV)
        .ok()
        .and_then(|t| parse_level(&t))
        .unwrap_or(Level::Warn);
    MAX.store(level as u8, Relaxed);
    level as u8
}

/// Whether a message at `level` would be printed.
pub fn enabled(level: Level) -> bool {
    level as u8 <= max_level()
}

/// Writes one line to stderr (one `write` call, so lines of concurrent processes don't mix).
pub fn emit(level: Level, args: std::fmt::Arguments<'_>) {
    if !enabled(level) {
        return;
    }
    let tag = match level {
        Level::Error => "error",
        Level::Warn => "warn",
        Level::Info => "info",
        Level::Debug => "debug",
    };
    let line = format!("gpuslice-shim: {tag}: {args}\n");
    use std::io::Write;
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

macro_rules! error { ($($t:tt)*) => { $crate::log::emit($crate::log::Level::Error, format_args!($($t)*)) }; }
macro_rules! warning { ($($t:tt)*) => { $crate::log::emit($crate::log::Level::Warn, format_args!($($t)*)) }; }
macro_rules! info { ($($t:tt)*) => { $crate::log::emit($crate::log::Level::Info, format_args!($($t)*)) }; }
macro_rules! debug { ($($t:tt)*) => { $crate::log::emit($crate::log::Level::Debug, format_args!($($t)*)) }; }
pub(crate) use {debug, error, info, warning};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_case_insensitively_and_order() {
        assert_eq!(parse_level("DEBUG"), Some(Level::Debug));
        assert_eq!(parse_level(" warn "), Some(Level::Warn));
        assert_eq!(parse_level("error"), Some(Level::Error));
        assert_eq!(parse_level("info"), Some(Level::Info));
        assert_eq!(parse_level("loud"), None);
        assert!(Level::Error < Level::Debug);
    }
}
