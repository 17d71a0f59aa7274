//! Killing a process, behind a seam: the caller passes the start time it read when it judged
//! the process (attribution reads it before the facts it charges the process by; the
//! escalation before it confirms the pid is still in the container's cgroup), and the real
//! signaller reads `<proc>/<pid>/stat` again and sends SIGKILL only when it still matches, so
//! a pid reused after the judgement is never hit. Both reads parse the line the same way
//! (`gpuslice_registry::parse_stat`).

use std::path::{Path, PathBuf};

/// A kill that could not be done.
#[derive(Debug, thiserror::Error)]
pub enum SignalError {
    #[error("process {pid} is gone (no {path})")]
    Gone { pid: u32, path: PathBuf },
    #[error("process {pid} was replaced by another with the same pid (start time {found}, judged {expected})")]
    Reused { pid: u32, expected: u64, found: u64 },
    #[error("cannot kill process {pid}: {source}")]
    Kill { pid: u32, source: std::io::Error },
}

/// Sends the enforcer's signals.
pub trait Signaller: Send {
    /// The start time (clock ticks since boot) of `pid`, `None` when it is gone.
    fn start_time(&self, pid: u32) -> Option<u64>;
    /// SIGKILL to `pid` if it still started at `start`.
    fn kill(&mut self, pid: u32, start: u64) -> Result<(), SignalError>;
}

/// A signaller for tests: every process is alive (start time 1), and each kill is recorded.
#[cfg(test)]
pub struct Recorder(pub std::sync::Arc<std::sync::Mutex<Vec<u32>>>);

#[cfg(test)]
impl Signaller for Recorder {
    fn start_time(&self, _pid: u32) -> Option<u64> {
        Some(1)
    }
    #[allow(clippy::unwrap_used)]
    fn kill(&mut self, pid: u32, _start: u64) -> Result<(), SignalError> {
        self.0.lock().unwrap().push(pid);
        Ok(())
    }
}

/// Real signals, with `/proc` at `proc_root`.
#[derive(Debug, Clone)]
pub struct ProcSignaller {
    proc_root: PathBuf,
}

impl ProcSignaller {
    pub fn new(proc_root: impl Into<PathBuf>) -> ProcSignaller {
        ProcSignaller {
            proc_root: proc_root.into(),
        }
    }

    fn stat_path(&self, pid: u32) -> PathBuf {
        self.proc_root.join(pid.to_string()).join("stat")
    }
}

/// The start time in the `stat` file at `path`; `None` when the process is gone (or a zombie).
fn read_start(path: &Path) -> Option<u64> {
    std::fs::read(path)
        .ok()
        .and_then(|s| gpuslice_registry::parse_stat(&s).ok().flatten())
}

impl Signaller for ProcSignaller {
    fn start_time(&self, pid: u32) -> Option<u64> {
        read_start(&self.stat_path(pid))
    }

    fn kill(&mut self, pid: u32, start: u64) -> Result<(), SignalError> {
        let path = self.stat_path(pid);
        let found = read_start(&path).ok_or(SignalError::Gone {
            pid,
            path: path.clone(),
        })?;
        if found != start {
            return Err(SignalError::Reused {
                pid,
                expected: start,
                found,
            });
        }
        let target = rustix::process::Pid::from_raw(pid as i32).ok_or(SignalError::Gone {
            pid,
            path: path.clone(),
        })?;
        rustix::process::kill_process(target, rustix::process::Signal::Kill).map_err(|e| {
            SignalError::Kill {
                pid,
                source: e.into(),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_survives_spaces_and_parentheses_in_the_name() {
        let root = tempfile::tempdir().unwrap();
        let s = ProcSignaller::new(root.path());
        std::fs::create_dir_all(root.path().join("4242")).unwrap();
        let stat = root.path().join("4242/stat");
        std::fs::write(
            &stat,
            "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10",
        )
        .unwrap();
        assert_eq!(s.start_time(4242), Some(987654));
        std::fs::write(&stat, "12 (x) S 1").unwrap();
        assert_eq!(s.start_time(4242), None);
        std::fs::write(&stat, "garbage").unwrap();
        assert_eq!(s.start_time(4242), None);
        assert_eq!(s.start_time(4243), None, "gone");
    }

    #[test]
    fn kills_a_real_child_only_while_its_start_time_matches() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        let mut s = ProcSignaller::new("/proc");
        let start = s.start_time(pid).unwrap();
        let e = s.kill(pid, start + 1).unwrap_err();
        assert!(matches!(e, SignalError::Reused { .. }), "{e}");
        assert!(
            child.try_wait().unwrap().is_none(),
            "a mismatch kills nothing"
        );
        s.kill(pid, start).unwrap();
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9));
        assert!(matches!(s.kill(pid, start), Err(SignalError::Gone { .. })));
    }
}
