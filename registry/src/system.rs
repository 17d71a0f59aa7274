//! The seam between the registry and the running system (clock, boot id, processes and their
//! cgroups), so the reaping logic runs against a fake in property tests and against `/proc`
//! and the cgroup tree for real.

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
    #[error("cannot read the cgroups of process {pid} from {path}: {detail}")]
    Cgroup {
        pid: u32,
        path: PathBuf,
        detail: String,
    },
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
    /// The calling process's pid, when the reservations it makes should name it (see
    /// [`crate::Reservation::reserved_by`]).
    fn current_pid(&self) -> Option<u32>;
    /// The parent of the live process `pid`; `None` when there is no such process.
    fn process_parent(&self, pid: u32) -> Result<Option<u32>, SystemError>;
    /// The cgroup of the live process `pid` that tells whether any of its container's
    /// processes are left (see [`crate::ProcessRef::cgroup`]), as recorded when a container
    /// binds or joins: [`System::cgroup_of`], and only while `pid` is alone in it. `None`
    /// when there is no such process, it sits only in root cgroups (never empty), or its
    /// cgroup holds other processes besides it (not the container's own: see `holds_only`).
    fn process_cgroup(&self, pid: u32) -> Result<Option<String>, SystemError>;
    /// The cgroup the live process `pid` runs in, chosen and written as
    /// [`System::process_cgroup`] chooses it (so it compares with a recorded one), whether or
    /// not other processes share it: what tells which recorded container a process is in.
    /// `None` when there is no such process, or it sits only in root cgroups or ones the
    /// caller shares.
    fn cgroup_of(&self, pid: u32) -> Result<Option<String>, SystemError>;
    /// Whether any process is left in `cgroup` (a [`System::process_cgroup`] value) or its
    /// descendants. A cgroup that is gone is empty; one that cannot be read counts as
    /// populated (not being able to look is no proof that its processes are gone).
    fn cgroup_populated(&self, cgroup: &str) -> bool;
}

/// The cgroup v1 controllers, in the order one is chosen to follow a container: runc creates
/// a cgroup in each mounted one, and these are the ones every host mounts.
const V1_PREFERENCE: &[&str] = &[
    "pids", "memory", "freezer", "devices", "cpu", "cpuacct", "blkio",
];

/// Deepest cgroup tree walked under a v1 cgroup when looking for processes left.
const MAX_CGROUP_DEPTH: usize = 8;

/// The real system, reading `<proc_root>` (normally `/proc`) and the cgroup tree under
/// `<cgroup_root>` (normally `/sys/fs/cgroup`).
#[derive(Debug)]
pub struct RealSystem {
    proc_root: PathBuf,
    cgroup_root: PathBuf,
    boot_id: OnceLock<String>,
}

/// Where a host mounts its cgroup trees.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

impl RealSystem {
    /// A system reading processes and the boot id under `proc_root`, cgroups under
    /// [`CGROUP_ROOT`]. Liveness is probed with `getpgid`, so `proc_root` must show the
    /// caller's own pid namespace.
    pub fn new(proc_root: impl Into<PathBuf>) -> RealSystem {
        RealSystem::with_cgroup_root(proc_root, CGROUP_ROOT)
    }

    /// Like [`RealSystem::new`], reading cgroups under `cgroup_root`.
    pub fn with_cgroup_root(
        proc_root: impl Into<PathBuf>,
        cgroup_root: impl Into<PathBuf>,
    ) -> RealSystem {
        RealSystem {
            proc_root: proc_root.into(),
            cgroup_root: cgroup_root.into(),
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

    fn current_pid(&self) -> Option<u32> {
        Some(std::process::id())
    }

    fn process_parent(&self, pid: u32) -> Result<Option<u32>, SystemError> {
        if pid == 0 || i32::try_from(pid).is_err() {
            return Err(SystemError::Pid { pid });
        }
        let path = self.proc_root.join(pid.to_string()).join("stat");
        match read_small(&path) {
            Ok(text) => {
                parse_stat_parent(&text).map_err(|detail| SystemError::Stat { path, detail })
            }
            Err(e) if gone(&e) => Ok(None),
            Err(e) => Err(SystemError::Stat {
                path,
                detail: e.to_string(),
            }),
        }
    }

    fn process_cgroup(&self, pid: u32) -> Result<Option<String>, SystemError> {
        Ok(self.cgroup_of(pid)?.filter(|c| {
            cgroup_rel_path(c).is_some_and(|rel| holds_only(&self.cgroup_root.join(rel), pid))
        }))
    }

    fn cgroup_of(&self, pid: u32) -> Result<Option<String>, SystemError> {
        if pid == 0 || i32::try_from(pid).is_err() {
            return Err(SystemError::Pid { pid });
        }
        let path = self.proc_root.join(pid.to_string()).join("cgroup");
        let text = match read_small(&path) {
            Ok(t) => t,
            Err(e) if gone(&e) => return Ok(None),
            Err(e) => {
                return Err(SystemError::Cgroup {
                    pid,
                    path,
                    detail: e.to_string(),
                })
            }
        };
        // Read after the target's: a caller that cannot read its own shares nothing.
        let own = read_small(&self.proc_root.join("self/cgroup")).unwrap_or_default();
        Ok(choose_cgroup(
            &self.cgroup_root,
            &String::from_utf8_lossy(&text),
            &String::from_utf8_lossy(&own),
        ))
    }

    fn cgroup_populated(&self, cgroup: &str) -> bool {
        let Some(rel) = cgroup_rel_path(cgroup) else {
            // Not a path this system wrote: it cannot be looked at, so it cannot be called empty.
            return true;
        };
        let dir = self.cgroup_root.join(rel);
        populated(&dir, 0)
    }
}

/// True for the errors that mean the process (or cgroup) is not there: ENOENT, or ESRCH
/// when it went away between open and read.
fn gone(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::NotFound
        || e.raw_os_error() == Some(rustix::io::Errno::SRCH.raw_os_error())
        || e.raw_os_error() == Some(rustix::io::Errno::NODEV.raw_os_error())
}

/// Whether `pid` is the only process in the cgroup directory `dir` (its `cgroup.procs`).
/// The create path records a container's cgroup while its init is still alone in it; a
/// cgroup that already held other processes (a container put into an existing cgroup, a
/// runtime that gives containers no cgroup of their own) is not the container's: following
/// it would charge, kill or wait for processes that are not the container's. One that
/// cannot be read is not followed either.
fn holds_only(dir: &Path, pid: u32) -> bool {
    let Ok(text) = read_small(&dir.join("cgroup.procs")) else {
        return false;
    };
    let mut pids = String::from_utf8_lossy(&text)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.trim().parse::<u32>().ok())
        .collect::<Vec<_>>();
    pids.dedup();
    pids == [Some(pid)]
}

/// `cgroup` as a relative path of plain components (never `..`, `.`, a root or empty).
pub fn cgroup_rel_path(cgroup: &str) -> Option<&Path> {
    use std::path::Component;
    let path = Path::new(cgroup);
    let plain = !cgroup.is_empty() && path.components().all(|c| matches!(c, Component::Normal(_)));
    plain.then_some(path)
}

/// Whether the cgroup directory `dir` holds a process: `populated 1` in its `cgroup.events`
/// (v2, which counts descendants), else a pid in its `cgroup.procs` or in a descendant's (v1).
fn populated(dir: &Path, depth: usize) -> bool {
    match std::fs::read_to_string(dir.join("cgroup.events")) {
        Ok(events) => {
            return events
                .lines()
                .find_map(|l| l.strip_prefix("populated "))
                .is_none_or(|v| v.trim() != "0")
        }
        Err(e) if gone(&e) => {}
        Err(_) => return true,
    }
    match std::fs::read_to_string(dir.join("cgroup.procs")) {
        Ok(procs) if !procs.trim().is_empty() => return true,
        Ok(_) => {}
        // The cgroup is gone (its directory removed): nothing is left in it.
        Err(e) if gone(&e) => return false,
        Err(_) => return true,
    }
    if depth >= MAX_CGROUP_DEPTH {
        return true;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries
        .filter_map(Result::ok)
        .any(|e| e.file_type().is_ok_and(|t| t.is_dir()) && populated(&e.path(), depth + 1))
}

/// Picks, from a `/proc/<pid>/cgroup` text, the cgroup to follow the process's container by,
/// relative to `cgroup_root`: the v2 one when the process is not in the v2 root (under
/// `unified/` on a hybrid host), else the first non-root one of [`V1_PREFERENCE`] whose
/// hierarchy is mounted under `cgroup_root`. A cgroup the caller is in as well (`own`: its
/// own `/proc/self/cgroup`) is skipped. `None` when every one is a root cgroup or shared.
pub fn choose_cgroup(cgroup_root: &Path, text: &str, own: &str) -> Option<String> {
    let shared: Vec<&str> = own
        .lines()
        .filter_map(|l| l.split_once(':').map(|(_, r)| r))
        .collect();
    let mut v2: Option<&str> = None;
    let mut v1: Vec<(&str, &str)> = Vec::new();
    for line in text.lines() {
        // A cgroup the caller sits in too is not the container's own: it never empties.
        if line
            .split_once(':')
            .is_some_and(|(_, rest)| shared.contains(&rest))
        {
            continue;
        }
        let mut parts = line.splitn(3, ':');
        let (Some(_id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let rel = path.trim_start_matches('/');
        // A cgroup namespace root or a deleted cgroup cannot be followed.
        if rel.is_empty() || path.ends_with(" (deleted)") || cgroup_rel_path(rel).is_none() {
            continue;
        }
        if controllers.is_empty() {
            v2 = Some(rel);
        } else {
            v1.push((controllers, rel));
        }
    }
    if let Some(rel) = v2 {
        for mount in ["unified", ""] {
            let base = if mount.is_empty() {
                cgroup_root.to_path_buf()
            } else {
                cgroup_root.join(mount)
            };
            if base.join(rel).is_dir() && base.join("cgroup.controllers").exists() {
                return Some(if mount.is_empty() {
                    rel.to_string()
                } else {
                    format!("{mount}/{rel}")
                });
            }
        }
    }
    for want in V1_PREFERENCE {
        for (controllers, rel) in &v1 {
            if !controllers.split(',').any(|c| c == *want) {
                continue;
            }
            // `cpu,cpuacct` is mounted under its joined name (and linked as each part).
            for mount in [*controllers, *want] {
                if cgroup_root.join(mount).join(rel).is_dir() {
                    return Some(format!("{mount}/{rel}"));
                }
            }
        }
    }
    None
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

/// Extracts the parent pid (field 4) from a `/proc/<pid>/stat` line.
pub fn parse_stat_parent(text: &[u8]) -> Result<Option<u32>, String> {
    let text = String::from_utf8_lossy(text);
    let close = text.rfind(')').ok_or("no `)` after the command name")?;
    let ppid = text[close + 1..]
        .split_ascii_whitespace()
        .nth(1)
        .ok_or("no parent pid field")?;
    ppid.parse::<u32>()
        .map(Some)
        .map_err(|_| format!("parent pid `{ppid}` is not a number"))
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

    /// A hybrid host's `/proc/<pid>/cgroup` for a runc container (v1 controllers under
    /// `/<id>`, v2 root), and a pure v2 host's.
    const HYBRID: &str =
        "12:pids:/ctr-a\n11:cpu,cpuacct:/ctr-a\n4:memory:/parent/ctr-a\n1:name=systemd:/\n0::/\n";
    const V2: &str = "0::/system.slice/ctr-b\n";

    fn mkdirs(root: &Path, dirs: &[&str]) {
        for d in dirs {
            std::fs::create_dir_all(root.join(d)).expect("mkdir");
        }
    }

    #[test]
    fn chooses_the_cgroup_that_follows_a_container_on_v1_hybrid_and_v2() {
        let root = tempfile::tempdir().expect("tempdir");
        let r = root.path();
        // Hybrid: v1 hierarchies plus an unused unified tree.
        mkdirs(
            r,
            &[
                "pids/ctr-a",
                "cpu,cpuacct/ctr-a",
                "memory/parent/ctr-a",
                "unified",
            ],
        );
        std::fs::write(r.join("unified/cgroup.controllers"), "").expect("write");
        assert_eq!(choose_cgroup(r, HYBRID, "").as_deref(), Some("pids/ctr-a"));
        // A cgroup the caller shares (a host process's, not a container's) is skipped.
        assert_eq!(
            choose_cgroup(r, HYBRID, "7:pids:/ctr-a\n2:memory:/parent/ctr-a\n").as_deref(),
            Some("cpu,cpuacct/ctr-a")
        );
        // Without a pids hierarchy the next preferred one.
        std::fs::remove_dir_all(r.join("pids")).expect("rm");
        assert_eq!(
            choose_cgroup(r, HYBRID, "").as_deref(),
            Some("memory/parent/ctr-a")
        );
        // Root cgroups only: nothing to follow.
        assert_eq!(choose_cgroup(r, "3:pids:/\n0::/\n", ""), None);
        // A v2 cgroup on the hybrid host's unified tree.
        mkdirs(r, &["unified/system.slice/ctr-b"]);
        assert_eq!(
            choose_cgroup(r, V2, "").as_deref(),
            Some("unified/system.slice/ctr-b")
        );
        // Pure v2: the tree is the root itself.
        let v2 = tempfile::tempdir().expect("tempdir");
        mkdirs(v2.path(), &["system.slice/ctr-b"]);
        std::fs::write(v2.path().join("cgroup.controllers"), "").expect("write");
        assert_eq!(
            choose_cgroup(v2.path(), V2, "").as_deref(),
            Some("system.slice/ctr-b")
        );
        // Paths that would leave the tree are never followed.
        assert_eq!(choose_cgroup(v2.path(), "0::/../../etc\n", ""), None);
    }

    #[test]
    fn a_cgroup_is_populated_while_it_or_a_descendant_lists_a_process() {
        let root = tempfile::tempdir().expect("tempdir");
        let r = root.path();
        let sys = RealSystem::with_cgroup_root("/proc", r);
        // v1: cgroup.procs, in the cgroup or below it.
        mkdirs(r, &["pids/ctr-a/inner"]);
        std::fs::write(r.join("pids/ctr-a/cgroup.procs"), "").expect("write");
        std::fs::write(r.join("pids/ctr-a/inner/cgroup.procs"), "4242\n").expect("write");
        assert!(sys.cgroup_populated("pids/ctr-a"));
        std::fs::write(r.join("pids/ctr-a/inner/cgroup.procs"), "").expect("write");
        assert!(!sys.cgroup_populated("pids/ctr-a"));
        // Removed (runc deleted it): empty.
        assert!(!sys.cgroup_populated("pids/gone"));
        // v2: cgroup.events counts descendants.
        mkdirs(r, &["unified/ctr-b"]);
        std::fs::write(
            r.join("unified/ctr-b/cgroup.events"),
            "populated 1\nfrozen 0\n",
        )
        .expect("write");
        assert!(sys.cgroup_populated("unified/ctr-b"));
        std::fs::write(
            r.join("unified/ctr-b/cgroup.events"),
            "populated 0\nfrozen 0\n",
        )
        .expect("write");
        assert!(!sys.cgroup_populated("unified/ctr-b"));
        // A value that is not a plain relative path is never read: it cannot be called empty.
        for bad in ["", "/pids/ctr-a", "pids/../../etc", "./pids"] {
            assert!(sys.cgroup_populated(bad), "{bad:?}");
        }
    }

    #[test]
    fn reads_a_processs_cgroup_and_parent_from_a_fake_proc() {
        let proc_root = tempfile::tempdir().expect("tempdir");
        let cg = tempfile::tempdir().expect("tempdir");
        mkdirs(cg.path(), &["pids/ctr-a"]);
        mkdirs(proc_root.path(), &["4242"]);
        std::fs::write(proc_root.path().join("4242/cgroup"), HYBRID).expect("write");
        std::fs::write(proc_root.path().join("4242/stat"), STAT).expect("write");
        let sys = RealSystem::with_cgroup_root(proc_root.path(), cg.path());
        let procs = cg.path().join("pids/ctr-a/cgroup.procs");
        // No process list to read: the cgroup is not known to be the container's.
        assert_eq!(sys.process_cgroup(4242), Ok(None));
        // A cgroup that holds another process besides the init is not the container's own.
        std::fs::write(&procs, "4242\n77\n").expect("write");
        assert_eq!(sys.process_cgroup(4242), Ok(None));
        std::fs::write(&procs, "77\n").expect("write");
        assert_eq!(sys.process_cgroup(4242), Ok(None));
        // Whichever processes share it, it is the cgroup the process runs in.
        assert_eq!(sys.cgroup_of(4242), Ok(Some("pids/ctr-a".into())));
        // The init alone: followed.
        std::fs::write(&procs, "4242\n").expect("write");
        assert_eq!(sys.process_cgroup(4242), Ok(Some("pids/ctr-a".into())));
        assert_eq!(sys.process_cgroup(4243), Ok(None));
        assert_eq!(sys.cgroup_of(4243), Ok(None));
        assert_eq!(sys.process_parent(4242), Ok(Some(1)));
        assert_eq!(sys.process_parent(4243), Ok(None));
        let me = RealSystem::new("/proc");
        let parent = me.process_parent(std::process::id()).expect("stat");
        assert_eq!(
            parent,
            Some(rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get() as u32))
        );
    }
}
