//! Which container a GPU process belongs to. NVML lists host pids; a slice's usage file
//! lists each process as it sees itself (pid in its own pid namespace plus that namespace's
//! inode). `/proc/<pid>/ns/pid`, the `NSpid` line of `/proc/<pid>/status` and
//! `/proc/<pid>/cgroup` translate between the two. The proc root is a parameter so tests run
//! on fixture directories.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// A `/proc` entry that cannot be read or understood.
#[derive(Debug, thiserror::Error)]
pub enum ProcError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: `{found}` is not a pid namespace link; accepted: pid:[<inode>]")]
    NsLink { path: PathBuf, found: String },
    #[error("{path}: no usable NSpid line; accepted: `NSpid:` followed by pids")]
    NsPid { path: PathBuf },
}

/// A host process as its container sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostProcess {
    /// Pid in the exporter's pid namespace (what NVML reports to it).
    pub pid: u32,
    /// Inode of the process's own (innermost) pid namespace.
    pub pid_ns: u64,
    /// Pid in that namespace (what the process itself, and so its usage slot, sees).
    pub ns_pid: u32,
    /// Text of `/proc/<pid>/cgroup`.
    pub cgroup: String,
}

/// The proc filesystem under `root` (normally `/proc`).
#[derive(Debug, Clone)]
pub struct ProcFs {
    root: PathBuf,
}

/// Parses a pid namespace link target, `pid:[4026531836]`.
pub fn parse_ns_link(text: &str) -> Option<u64> {
    text.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok()
}

/// The pids of the `NSpid:` line of a `status` file, outermost first.
pub fn parse_nspid(status: &str) -> Option<Vec<u32>> {
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    let pids: Option<Vec<u32>> = line.split_whitespace().map(|p| p.parse().ok()).collect();
    pids.filter(|p| !p.is_empty())
}

/// True when a `cgroup` file names the container: its id is a whole component of a cgroup
/// path, alone or inside a scope name (`/<id>`, `runc-<id>.scope`, `cri-containerd-<id>`,
/// `libpod-<id>.scope`, `crio-<id>`).
pub fn cgroup_names_container(cgroup: &str, container_id: &str) -> bool {
    if container_id.is_empty() {
        return false;
    }
    let bounded = |c: Option<char>| c.map_or(true, |c| matches!(c, '/' | '-' | '.' | ':' | '_'));
    cgroup.lines().any(|line| {
        // `hierarchy-id:controllers:path`; only the path is matched.
        let path = line.splitn(3, ':').nth(2).unwrap_or("");
        path.match_indices(container_id).any(|(at, _)| {
            bounded(path[..at].chars().next_back())
                && bounded(path[at + container_id.len()..].chars().next())
        })
    })
}

impl ProcFs {
    pub fn new(root: impl Into<PathBuf>) -> ProcFs {
        ProcFs { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn read(&self, path: PathBuf) -> Result<String, ProcError> {
        std::fs::read_to_string(&path).map_err(|source| ProcError::Read { path, source })
    }

    /// Inode of the pid namespace of `who` (a pid, or `self`).
    pub fn pid_ns(&self, who: &str) -> Result<u64, ProcError> {
        let path = self.root.join(who).join("ns/pid");
        let target = std::fs::read_link(&path).map_err(|source| ProcError::Read {
            path: path.clone(),
            source,
        })?;
        let text = target.to_string_lossy();
        parse_ns_link(&text).ok_or_else(|| ProcError::NsLink {
            path,
            found: text.into_owned(),
        })
    }

    /// Identifies host process `pid`: its innermost pid namespace, its pid there, its cgroup.
    pub fn identify(&self, pid: u32) -> Result<HostProcess, ProcError> {
        let dir = pid.to_string();
        let pid_ns = self.pid_ns(&dir)?;
        let status_path = self.root.join(&dir).join("status");
        let status = self.read(status_path.clone())?;
        let ns_pid = parse_nspid(&status)
            .and_then(|p| p.last().copied())
            .ok_or(ProcError::NsPid { path: status_path })?;
        let cgroup = self.read(self.root.join(&dir).join("cgroup"))?;
        Ok(HostProcess {
            pid,
            pid_ns,
            ns_pid,
            cgroup,
        })
    }
}

/// What identifies the processes of one reservation's container on the host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Members {
    /// (pid namespace inode, pid there) of every live slot of the usage file: processes that
    /// run the shim.
    pub slots: HashSet<(u64, u32)>,
    /// The container's own pid namespace, when it has one (not the exporter's): every
    /// process in it belongs to the container, shim or not.
    pub pid_ns: Option<u64>,
    /// The container id, matched against cgroup paths.
    pub container_id: Option<String>,
}

impl Members {
    /// True when host process `p` is one of the container's.
    pub fn contains(&self, p: &HostProcess) -> bool {
        self.slots.contains(&(p.pid_ns, p.ns_pid))
            || self.pid_ns == Some(p.pid_ns)
            || self
                .container_id
                .as_deref()
                .is_some_and(|id| cgroup_names_container(&p.cgroup, id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake `/proc/<pid>` with a namespace link, a status file and a cgroup file.
    fn fake_process(root: &Path, pid: u32, ns: u64, nspid: &str, cgroup: &str) {
        let dir = root.join(pid.to_string());
        std::fs::create_dir_all(dir.join("ns")).unwrap();
        std::os::unix::fs::symlink(format!("pid:[{ns}]"), dir.join("ns/pid")).unwrap();
        std::fs::write(
            dir.join("status"),
            format!("Name:\tprobe\nPid:\t{pid}\nNSpid:\t{nspid}\nPPid:\t1\n"),
        )
        .unwrap();
        std::fs::write(dir.join("cgroup"), cgroup).unwrap();
    }

    #[test]
    fn parses_links_and_nspid() {
        assert_eq!(parse_ns_link("pid:[4026531836]"), Some(4026531836));
        assert_eq!(parse_ns_link("net:[4026531836]"), None);
        assert_eq!(parse_ns_link("pid:[x]"), None);
        assert_eq!(
            parse_nspid("Name:\tx\nNSpid:\t4242\t17\t1\n"),
            Some(vec![4242, 17, 1])
        );
        assert_eq!(parse_nspid("Name:\tx\nPid:\t3\n"), None);
        assert_eq!(parse_nspid("NSpid:\t\n"), None);
        assert_eq!(parse_nspid("NSpid:\t12 x\n"), None);
    }

    #[test]
    fn identifies_a_containerised_process_from_fixture_proc() {
        let root = tempfile::tempdir().unwrap();
        fake_process(
            root.path(),
            4242,
            4026532999,
            "4242\t7",
            "0::/system.slice/runc-e2e-a.scope\n",
        );
        let proc = ProcFs::new(root.path());
        let p = proc.identify(4242).unwrap();
        assert_eq!(
            p,
            HostProcess {
                pid: 4242,
                pid_ns: 4026532999,
                ns_pid: 7,
                cgroup: "0::/system.slice/runc-e2e-a.scope\n".into(),
            }
        );
        // A vanished process is an error naming the path, not a panic.
        let e = proc.identify(4243).unwrap_err();
        assert!(e.to_string().contains("4243/ns/pid"), "{e}");
        // A status without NSpid (kernels before 4.1) is refused with the path.
        fake_process(root.path(), 5, 1, "", "");
        std::fs::write(root.path().join("5/status"), "Name:\tx\n").unwrap();
        let e = proc.identify(5).unwrap_err();
        assert!(matches!(e, ProcError::NsPid { .. }), "{e}");
    }

    #[test]
    fn cgroup_match_needs_whole_id_components() {
        let v2 = "0::/system.slice/runc-abc123.scope\n";
        assert!(cgroup_names_container(v2, "abc123"));
        assert!(!cgroup_names_container(v2, "abc12"));
        assert!(!cgroup_names_container(v2, "bc123"));
        assert!(!cgroup_names_container(v2, ""));
        let v1 = "12:pids:/kubepods/besteffort/pod1/cri-containerd-deadbeef\n1:name=systemd:/x\n";
        assert!(cgroup_names_container(v1, "deadbeef"));
        assert!(cgroup_names_container("0::/mine\n", "mine"));
        // The hierarchy fields are not part of the path.
        assert!(!cgroup_names_container("12:pids:/x\n", "pids"));
    }

    #[test]
    fn members_by_slot_namespace_or_cgroup() {
        let p = HostProcess {
            pid: 900,
            pid_ns: 11,
            ns_pid: 3,
            cgroup: "0::/other\n".into(),
        };
        let mut m = Members::default();
        assert!(!m.contains(&p));
        m.slots.insert((11, 3));
        assert!(m.contains(&p));
        let m = Members {
            pid_ns: Some(11),
            ..Members::default()
        };
        assert!(m.contains(&p));
        let m = Members {
            container_id: Some("other".into()),
            ..Members::default()
        };
        assert!(m.contains(&p));
        let m = Members {
            slots: [(11, 4), (12, 3)].into_iter().collect(),
            pid_ns: Some(12),
            container_id: Some("mine".into()),
        };
        assert!(!m.contains(&p));
    }
}
