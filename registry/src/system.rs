//! The seam between the registry and the running system (clock, boot id, processes), so the
//! reaping logic runs against a fake in property tests and against `/proc` for real.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// A system query that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SystemError {
    #[error("cannot read boot id {path}: {detail}")]
    BootId { path: PathBuf, detail: String },
    #[error("cannot read process status {path}: {detail}")]
    Stat { path: PathBuf, detail: String },
    #[error("pid {pid} is not a valid process id (accepted: 1 to 2147483647)")]
    Pid { pid: u32 },
}

/// What the registry needs to know about the system it runs on.
pub trait System: Send + Sync {
    /// Now, in unix milliseconds.
    fn now_ms(&self) -> u64;
    /// The current boot id.
    fn boot_id(&self) -> Result<String, SystemError>;
    /// A cheap check that some process with this pid exists (any instance).
    fn process_exists(&self, pid: u32) -> bool;
    /// The start time (field 22 of `stat`) of the live process `pid`; `None` when there is no
    /// such process or it has exited and awaits its parent (a zombie).
    fn process_start_time(&self, pid: u32) -> Result<Option<u64>, SystemError>;
}

/// The real system, reading `<proc_root>` (normally `/proc`).
#[derive(Debug)]
pub struct RealSystem {
    proc_root: PathBuf,
    boot_id: OnceLock<String>,
}

impl RealSystem {
    /// A system reading processes and the boot id under `proc_root`. Liveness is probed with
    /// `getpgid`, so `proc_root` must show the caller's own pid namespace.
    pub fn new(proc_root: impl Into<PathBuf>) -> RealSystem {
        RealSystem {
            proc_root: proc_root.into(),
            boot_id: OnceLock::new(),
        }
    }

    /// The proc filesystem this system reads.
    pub fn proc_root(&self) -> &Path {
        &self.proc_root
    }
}

impl System for RealSystem {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }

    fn boot_id(&self) -> Result<String, SystemError> {
        if let Some(id) = self.boot_id.get() {
            return Ok(id.clone());
        }
        let path = self.proc_root.join("sys/kernel/random/boot_id");
        let text = read_small(&path).map_err(|e| SystemError::BootId {
            path: path.clone(),
            detail: e.to_string(),
        })?;
        let id = String::from_utf8_lossy(&text).trim().to_string();
        if id.is_empty() {
            return Err(SystemError::BootId {
                path,
                detail: "empty".into(),
            });
        }
        Ok(self.boot_id.get_or_init(|| id).clone())
    }

    fn process_exists(&self, pid: u32) -> bool {
        let Some(pid) = i32::try_from(pid)
            .ok()
            .and_then(rustix::process::Pid::from_raw)
        else {
            return false;
        };
        // getpgid finds the task like kill(pid, 0) does (a zombie still exists) without
        // the signal permission and audit path, at less than half the cost; every
        // operation probes each owning process. Any error but ESRCH means it exists.
        match rustix::process::getpgid(Some(pid)) {
            Ok(_) => true,
            Err(e) => e != rustix::io::Errno::SRCH,
        }
    }

    fn process_start_time(&self, pid: u32) -> Result<Option<u64>, SystemError> {
        if pid == 0 || i32::try_from(pid).is_err() {
            return Err(SystemError::Pid { pid });
        }
        let path = self.proc_root.join(pid.to_string()).join("stat");
        let text = match read_small(&path) {
            Ok(t) => t,
            // ESRCH: the process went away between open and read.
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound
                    || e.raw_os_error() == Some(rustix::io::Errno::SRCH.raw_os_error()) =>
            {
                return Ok(None)
            }
            Err(e) => {
                return Err(SystemError::Stat {
                    path,
                    detail: e.to_string(),
                })
            }
        };
        parse_stat(&text).map_err(|detail| SystemError::Stat { path, detail })
    }
}

/// Reads a small file (a `/proc` line) with one `read` into a stack buffer where it fits:
/// `std::fs::read` spends a `statx` and a read per doubling of its buffer on procfs files,
/// which report size 0, and a full start-time pass reads one per owning process.
fn read_small(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut buf = [0u8; 1024];
    let mut out = Vec::new();
    loop {
        let n = file.read(&mut buf)?;
        out.extend_from_slice(&buf[..n]);
        // procfs hands a whole line to one read; a short read ending the line is the end.
        if n == 0 || (n < buf.len() && out.last() == Some(&b'\n')) {
            return Ok(out);
        }
    }
}

/// Extracts the start time from a `/proc/<pid>/stat` line; `None` for a zombie or dead task.
/// The command name (field 2) may hold spaces and parentheses, so fields are counted after
/// the last `)`.
pub fn parse_stat(text: &[u8]) -> Result<Option<u64>, String> {
    let text = String::from_utf8_lossy(text);
    let close = text.rfind(')').ok_or("no `)` after the command name")?;
    let mut fields = text[close + 1..].split_ascii_whitespace();
    // Field 3 is the state; field 22 the start time, 19 fields later.
    let state = fields.next().ok_or("no state field")?;
    let start = fields.nth(18).ok_or("fewer than 22 fields")?;
    if state == "Z" || state == "X" || state == "x" {
        return Ok(None);
    }
    start
        .parse::<u64>()
        .map(Some)
        .map_err(|_| format!("start time `{start}` is not a number"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str =
        "4242 (we ird) (x)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 200";

    #[test]
    fn stat_start_time_survives_odd_command_names() {
        assert_eq!(parse_stat(STAT.as_bytes()), Ok(Some(987654)));
        let zombie = STAT.replace(") S ", ") Z ");
        assert_eq!(parse_stat(zombie.as_bytes()), Ok(None));
        assert!(parse_stat(b"12 (x) S 1 2").is_err());
        assert!(parse_stat(b"no parens").is_err());
    }

    #[test]
    fn reads_fake_proc_root() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("4242")).expect("mkdir");
        std::fs::write(dir.path().join("4242/stat"), STAT).expect("write");
        std::fs::create_dir_all(dir.path().join("sys/kernel/random")).expect("mkdir");
        std::fs::write(dir.path().join("sys/kernel/random/boot_id"), "abc-123\n").expect("write");
        let sys = RealSystem::new(dir.path());
        assert_eq!(sys.process_start_time(4242), Ok(Some(987654)));
        assert_eq!(sys.process_start_time(4243), Ok(None));
        assert_eq!(sys.boot_id(), Ok("abc-123".to_string()));
        assert!(matches!(
            sys.process_start_time(0),
            Err(SystemError::Pid { .. })
        ));
    }

    #[test]
    fn real_proc_knows_this_process() {
        let sys = RealSystem::new("/proc");
        let me = std::process::id();
        assert!(sys.process_exists(me));
        assert!(sys.process_start_time(me).expect("stat").is_some());
        assert!(!sys.process_exists(0));
        assert!(!sys.boot_id().expect("boot id").is_empty());
    }
}
