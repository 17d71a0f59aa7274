//! The exporter's error count by source (`gpuslice_exporter_errors_total{source}`): what a
//! scrape could not read is left out of the output and counted here, never fatal. Each
//! distinct message is also logged once, so a persistent fault does not flood the log.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Display;

/// Where a collection error came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    /// `registry.json` missing its directory, unreadable or corrupt.
    Registry,
    /// A slice's `usage` file missing, truncated or not a usage file.
    Usage,
    /// A slice's `limits.json` missing or invalid.
    Limits,
    /// NVML unavailable or failing on a GPU.
    Nvml,
    /// A reservation whose container is gone but which is not reaped yet.
    Container,
    /// A GPU process whose `/proc` entry cannot be read.
    Proc,
}

impl Source {
    pub const ALL: [Source; 6] = [
        Source::Registry,
        Source::Usage,
        Source::Limits,
        Source::Nvml,
        Source::Container,
        Source::Proc,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Source::Registry => "registry",
            Source::Usage => "usage",
            Source::Limits => "limits",
            Source::Nvml => "nvml",
            Source::Container => "container",
            Source::Proc => "proc",
        }
    }
}

/// Distinct messages remembered for deduplication before the memory is reset.
const MAX_REMEMBERED: usize = 1024;

/// Running error counts, and the log they are reported to.
pub struct ErrorLog {
    counts: BTreeMap<Source, u64>,
    seen: HashSet<String>,
    sink: Box<dyn FnMut(&str) + Send>,
}

impl std::fmt::Debug for ErrorLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ErrorLog")
            .field("counts", &self.counts)
            .finish_non_exhaustive()
    }
}

impl Default for ErrorLog {
    /// Logs to standard error.
    fn default() -> Self {
        ErrorLog::with_sink(Box::new(|line| eprintln!("gpuslice serve: {line}")))
    }
}

impl ErrorLog {
    /// Counts start at zero for every source, so every series exists from the first scrape.
    pub fn with_sink(sink: Box<dyn FnMut(&str) + Send>) -> ErrorLog {
        ErrorLog {
            counts: Source::ALL.iter().map(|s| (*s, 0)).collect(),
            seen: HashSet::new(),
            sink,
        }
    }

    /// Counts one error of `source`; logs `message` the first time it is seen.
    pub fn record(&mut self, source: Source, message: impl Display) {
        *self.counts.entry(source).or_default() += 1;
        let line = format!("{}: {message}", source.as_str());
        if self.seen.len() >= MAX_REMEMBERED {
            self.seen.clear();
        }
        if self.seen.insert(line.clone()) {
            (self.sink)(&line);
        }
    }

    pub fn count(&self, source: Source) -> u64 {
        self.counts.get(&source).copied().unwrap_or(0)
    }

    /// Every source with its count, in a fixed order.
    pub fn counts(&self) -> impl Iterator<Item = (Source, u64)> + '_ {
        self.counts.iter().map(|(s, n)| (*s, *n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn counts_every_error_and_logs_each_message_once() {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let l = lines.clone();
        let mut log = ErrorLog::with_sink(Box::new(move |s| l.lock().unwrap().push(s.to_string())));
        assert!(log.counts().all(|(_, n)| n == 0));
        assert_eq!(log.counts().count(), Source::ALL.len());
        log.record(Source::Usage, "usage file /s/a/usage: bad magic");
        log.record(Source::Usage, "usage file /s/a/usage: bad magic");
        log.record(Source::Nvml, "GPU 0: lost");
        assert_eq!(log.count(Source::Usage), 2);
        assert_eq!(log.count(Source::Nvml), 1);
        assert_eq!(log.count(Source::Registry), 0);
        assert_eq!(
            *lines.lock().unwrap(),
            vec![
                "usage: usage file /s/a/usage: bad magic".to_string(),
                "nvml: GPU 0: lost".to_string()
            ]
        );
    }
}
