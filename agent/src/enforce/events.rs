//! What the enforcer did, kept for everyone who shows it: the counters the exporter's
//! metrics read (shared in memory with the HTTP thread) and `state_dir/enforcer.json`, the
//! recent events and totals `gpuslice status` prints (a separate process, so a file;
//! replaced atomically, written only when something happened).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

/// File name of the enforcer's record in the state dir.
pub const ENFORCER_FILE: &str = "enforcer.json";
/// Events kept in the file.
pub const KEPT_EVENTS: usize = 64;

/// The record could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum EventsError {
    #[error("cannot write the enforcer record {path}: {detail}")]
    Write { path: PathBuf, detail: String },
    #[error("the enforcer record {path} is unreadable: {detail}")]
    Read { path: PathBuf, detail: String },
}

/// What an event was about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// A process was killed for taking its slice over its memory limit.
    MemoryKill,
    /// A slice was over its memory limit past grace (`memory = "report"`, or the kill
    /// failed).
    MemoryReport,
    /// A slice ran above its compute share over the window.
    ComputeReport,
    /// A throttled slice's cgroup began its freezer duty cycle.
    ComputeThrottle,
    /// A process on a GPU belongs to no reservation (of that GPU).
    Unowned,
    /// A slice went over its memory limit again within the repeat window of a kill (with
    /// `memory = "kill"`): every process of its containers was stopped.
    MemoryEscalation,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::MemoryKill => "memory_kill",
            EventKind::MemoryReport => "memory_report",
            EventKind::ComputeReport => "compute_report",
            EventKind::ComputeThrottle => "compute_throttle",
            EventKind::Unowned => "unowned",
            EventKind::MemoryEscalation => "memory_escalation",
        }
    }

    pub const ALL: [EventKind; 6] = [
        EventKind::MemoryKill,
        EventKind::MemoryReport,
        EventKind::MemoryEscalation,
        EventKind::ComputeReport,
        EventKind::ComputeThrottle,
        EventKind::Unowned,
    ];
}

/// One thing the enforcer did or saw.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub kind: EventKind,
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// Empty for an unowned process.
    pub reservation: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    pub uuid: String,
    pub pid: u32,
    /// Memory events: the slice's bytes on the GPU, its limit and the process's bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_bytes: Option<u64>,
    /// Compute events: the slice's average share over the window and its limit, 0–1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_limit: Option<f64>,
    /// What went wrong when an action failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Event {
    /// The log line of this event.
    pub fn line(&self) -> String {
        let who = if self.reservation.is_empty() {
            "no reservation".to_string()
        } else {
            format!(
                "reservation {}{}",
                self.reservation,
                self.container_id
                    .as_deref()
                    .map(|c| format!(" (container {c})"))
                    .unwrap_or_default()
            )
        };
        let mut line = format!(
            "gpuslice serve: enforcer: {} pid {} of {who} on {}",
            self.kind.as_str(),
            self.pid,
            self.uuid
        );
        if let (Some(s), Some(l)) = (self.slice_bytes, self.limit_bytes) {
            line.push_str(&format!(": slice holds {s} bytes, limit {l}"));
            if let Some(p) = self.process_bytes {
                line.push_str(&format!(", process {p}"));
            }
        }
        if let (Some(s), Some(l)) = (self.share, self.share_limit) {
            line.push_str(&format!(
                ": compute share {:.1}% over the window, limit {:.1}%",
                s * 100.0,
                l * 100.0
            ));
        }
        if let Some(e) = &self.error {
            line.push_str(&format!("; {e}"));
        }
        // A cgroup path in an error is named by whoever made the cgroup, a container with a
        // delegated cgroup tree too: the line reaches the log and `gpuslice status` escaped.
        gpuslice_registry::printable(&line)
    }
}

/// Totals and recent events, as written to [`ENFORCER_FILE`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub kills_total: u64,
    pub memory_reports_total: u64,
    pub compute_reports_total: u64,
    pub throttles_total: u64,
    pub unowned_total: u64,
    #[serde(default)]
    pub escalations_total: u64,
    /// Readings taken since the enforcer started.
    pub cycles_total: u64,
    /// Newest last.
    pub events: Vec<Event>,
}

impl Record {
    pub fn count(&self, kind: EventKind) -> u64 {
        match kind {
            EventKind::MemoryKill => self.kills_total,
            EventKind::MemoryReport => self.memory_reports_total,
            EventKind::ComputeReport => self.compute_reports_total,
            EventKind::ComputeThrottle => self.throttles_total,
            EventKind::Unowned => self.unowned_total,
            EventKind::MemoryEscalation => self.escalations_total,
        }
    }

    fn add(&mut self, e: Event) {
        let c = match e.kind {
            EventKind::MemoryKill => &mut self.kills_total,
            EventKind::MemoryReport => &mut self.memory_reports_total,
            EventKind::ComputeReport => &mut self.compute_reports_total,
            EventKind::ComputeThrottle => &mut self.throttles_total,
            EventKind::Unowned => &mut self.unowned_total,
            EventKind::MemoryEscalation => &mut self.escalations_total,
        };
        *c += 1;
        self.events.push(e);
        if self.events.len() > KEPT_EVENTS {
            let extra = self.events.len() - KEPT_EVENTS;
            self.events.drain(..extra);
        }
    }
}

/// Live state shown by the exporter: the record and the current throttles.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Live {
    pub record: Record,
    /// (reservation, GPU UUID, run fraction) of every slice now under a duty cycle.
    pub throttled: Vec<(String, String, f64)>,
    /// Processes on GPUs that belong to no reservation now: (GPU UUID, count).
    pub unowned: Vec<(String, u64)>,
    /// Seconds the last cycle took.
    pub cycle_seconds: f64,
}

/// The enforcer's shared state: the exporter reads it, the enforcer writes it.
pub type Shared = Arc<Mutex<Live>>;

/// Locks `shared` whatever a panicking holder left.
pub fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, Live> {
    shared.lock().unwrap_or_else(|p| p.into_inner())
}

/// Appends `events` to the shared record, logs each, and rewrites the file.
pub fn publish(shared: &Shared, state_dir: &Path, events: Vec<Event>) -> Result<(), EventsError> {
    if events.is_empty() {
        return Ok(());
    }
    let record = {
        let mut live = lock(shared);
        for e in events {
            eprintln!("{}", e.line());
            live.record.add(e);
        }
        live.record.clone()
    };
    write_record(state_dir, &record)
}

/// Replaces `state_dir/enforcer.json` with `record`.
pub fn write_record(state_dir: &Path, record: &Record) -> Result<(), EventsError> {
    let path = state_dir.join(ENFORCER_FILE);
    let text = serde_json::to_vec_pretty(record).map_err(|e| EventsError::Write {
        path: path.clone(),
        detail: e.to_string(),
    })?;
    gpuslice_fsutil::atomic_write(&path, &text, 0o644).map_err(|e| EventsError::Write {
        path: path.clone(),
        detail: e.to_string(),
    })
}

/// Reads `state_dir/enforcer.json`; `Ok(None)` when no enforcer ever wrote one.
pub fn read_record(state_dir: &Path) -> Result<Option<Record>, EventsError> {
    let path = state_dir.join(ENFORCER_FILE);
    match std::fs::read(&path) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| EventsError::Read {
                path,
                detail: e.to_string(),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(EventsError::Read {
            path,
            detail: e.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kill(pid: u32) -> Event {
        Event {
            kind: EventKind::MemoryKill,
            at_ms: 1,
            reservation: "r1".into(),
            container_id: Some("c1".into()),
            uuid: "GPU-1".into(),
            pid,
            slice_bytes: Some(7),
            limit_bytes: Some(4),
            process_bytes: Some(3),
            share: None,
            share_limit: None,
            error: None,
        }
    }

    #[test]
    fn published_events_are_counted_kept_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let shared = Shared::default();
        assert_eq!(read_record(dir.path()).unwrap(), None);
        publish(&shared, dir.path(), (0..70).map(kill).collect()).unwrap();
        let r = read_record(dir.path()).unwrap().unwrap();
        assert_eq!(r.kills_total, 70);
        assert_eq!(r.events.len(), KEPT_EVENTS);
        assert_eq!(r.events.last().unwrap().pid, 69, "newest last");
        assert_eq!(lock(&shared).record, r);
        let line = kill(5).line();
        assert!(
            line.contains("memory_kill pid 5 of reservation r1 (container c1) on GPU-1"),
            "{line}"
        );
        assert!(
            line.contains("slice holds 7 bytes, limit 4, process 3"),
            "{line}"
        );
        std::fs::write(dir.path().join(ENFORCER_FILE), "{").unwrap();
        let e = read_record(dir.path()).unwrap_err();
        assert!(e.to_string().contains(ENFORCER_FILE), "{e}");
    }

    #[test]
    fn a_line_carries_no_control_characters_from_a_cgroup_name() {
        let mut e = kill(5);
        e.error = Some("not throttled: process 5 runs in cgroup /x\n\u{1b}[2Jforged".into());
        let line = e.line();
        assert!(!line.chars().any(char::is_control), "{line:?}");
        assert!(line.contains("/x\\n\\u{1b}[2Jforged"), "{line}");
    }
}
