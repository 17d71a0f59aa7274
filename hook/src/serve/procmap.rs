//! Which container a GPU process belongs to. NVML lists host pids; a slice's usage file
//! lists each process as it sees itself (pid in its own pid namespace plus that namespace's
//! inode). `/proc/<pid>/ns/pid`, the `NSpid` line of `/proc/<pid>/status` and
//! `/proc/<pid>/cgroup` translate between the two. The proc root is a parameter so tests run
//! on fixture directories.

use std::collections::HashMap;
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
    let bounded = |c: Option<char>| c.is_none_or(|c| matches!(c, '/' | '-' | '.' | ':' | '_'));
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

    /// The pid of host process `pid` in its own (innermost) pid namespace.
    pub fn ns_pid(&self, pid: u32) -> Result<u32, ProcError> {
        let path = self.root.join(pid.to_string()).join("status");
        let status = self.read(path.clone())?;
        parse_nspid(&status)
            .and_then(|p| p.last().copied())
            .ok_or(ProcError::NsPid { path })
    }

    /// The text of `/proc/<pid>/cgroup`.
    pub fn cgroup(&self, pid: u32) -> Result<String, ProcError> {
        self.read(self.root.join(pid.to_string()).join("cgroup"))
    }
}

/// Attributes host pids to owners (reservations, by position), reading `/proc` lazily:
/// the pid namespace first; the `NSpid` line only for processes neither in the exporter's
/// namespace nor in a known container namespace; the cgroup only for those still unmatched.
/// A scrape builds one, so each pid is looked at once whatever the number of reservations.
#[derive(Debug)]
pub struct Attributor<'a> {
    proc: &'a ProcFs,
    own_ns: Option<u64>,
    /// (pid namespace inode, pid there) of usage-file slots → owner.
    slots: HashMap<(u64, u32), usize>,
    /// A container's own pid namespace → owner.
    namespaces: HashMap<u64, usize>,
    /// Container ids, for the cgroup fallback.
    containers: Vec<(String, usize)>,
    seen: HashMap<u32, Option<usize>>,
}

impl<'a> Attributor<'a> {
    /// `own_ns` is the exporter's pid namespace (NVML reports pids as seen from it).
    pub fn new(proc: &'a ProcFs, own_ns: Option<u64>) -> Attributor<'a> {
        Attributor {
            proc,
            own_ns,
            slots: Default::default(),
            namespaces: Default::default(),
            containers: Vec::new(),
            seen: Default::default(),
        }
    }

    /// Registers `owner`: the processes of its usage-file slots, its container's pid
    /// namespace (ignored when it is the exporter's: `--pid=host`) and its container id.
    pub fn add(
        &mut self,
        owner: usize,
        slots: impl IntoIterator<Item = (u64, u32)>,
        pid_ns: Option<u64>,
        container_id: Option<&str>,
    ) {
        for key in slots {
            self.slots.insert(key, owner);
        }
        if let Some(ns) = pid_ns.filter(|ns| Some(*ns) != self.own_ns) {
            self.namespaces.insert(ns, owner);
        }
        if let Some(id) = container_id.filter(|id| !id.is_empty()) {
            self.containers.push((id.to_string(), owner));
        }
    }

    /// The owner of host process `pid`, if any; an unreadable `/proc` entry is an error.
    pub fn owner_of(&mut self, pid: u32) -> Result<Option<usize>, ProcError> {
        if let Some(o) = self.seen.get(&pid) {
            return Ok(*o);
        }
        let ns = self.proc.pid_ns(&pid.to_string())?;
        let mut owner = if Some(ns) == self.own_ns {
            self.slots.get(&(ns, pid)).copied()
        } else if let Some(o) = self.namespaces.get(&ns) {
            Some(*o)
        } else {
            let ns_pid = self.proc.ns_pid(pid)?;
            self.slots.get(&(ns, ns_pid)).copied()
        };
        if owner.is_none() && !self.containers.is_empty() {
            let cgroup = self.proc.cgroup(pid)?;
            owner = self
                .containers
                .iter()
                .find(|(id, _)| cgroup_names_container(&cgroup, id))
                .map(|(_, o)| *o);
        }
        self.seen.insert(pid, owner);
        Ok(owner)
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
    fn reads_namespace_nspid_and_cgroup_from_fixture_proc() {
        let root = tempfile::tempdir().unwrap();
        fake_process(
            root.path(),
            4242,
            4026532999,
            "4242\t7",
            "0::/runc-e2e-a.scope\n",
        );
        let proc = ProcFs::new(root.path());
        assert_eq!(proc.pid_ns("4242").unwrap(), 4026532999);
        assert_eq!(proc.ns_pid(4242).unwrap(), 7);
        assert_eq!(proc.cgroup(4242).unwrap(), "0::/runc-e2e-a.scope\n");
        // A vanished process is an error naming the path, not a panic.
        let e = proc.pid_ns("4243").unwrap_err();
        assert!(e.to_string().contains("4243/ns/pid"), "{e}");
        // A status without NSpid (kernels before 4.1) is refused with the path.
        fake_process(root.path(), 5, 1, "", "");
        std::fs::write(root.path().join("5/status"), "Name:\tx\n").unwrap();
        assert!(matches!(proc.ns_pid(5), Err(ProcError::NsPid { .. })));
        std::fs::create_dir_all(root.path().join("7/ns")).unwrap();
        std::os::unix::fs::symlink("net:[1]", root.path().join("7/ns/pid")).unwrap();
        assert!(matches!(proc.pid_ns("7"), Err(ProcError::NsLink { .. })));
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
    fn attributes_by_slot_namespace_or_cgroup_reading_only_what_is_needed() {
        let root = tempfile::tempdir().unwrap();
        let own = 4026531836;
        // Owner 0: container with its own namespace 11 (any process in it is its).
        fake_process(root.path(), 100, 11, "100\t1", "0::/a\n");
        // Owner 1: a shim process in the exporter's namespace (`--pid=host`), pid 200.
        fake_process(root.path(), 200, own, "200", "0::/b\n");
        // Owner 2: known by a slot in a nested namespace 13 (pid 5 there) only.
        fake_process(root.path(), 300, 13, "300\t9\t5", "0::/c\n");
        // Owner 3: known only by its cgroup.
        fake_process(
            root.path(),
            400,
            14,
            "400\t1",
            "0::/system.slice/runc-ctr-d.scope\n",
        );
        // Nobody's: a host process, and one in an unknown namespace.
        fake_process(root.path(), 500, own, "500", "0::/user\n");
        fake_process(root.path(), 600, 15, "600\t3", "0::/e\n");
        let proc = ProcFs::new(root.path());
        let mut a = Attributor::new(&proc, Some(own));
        a.add(0, [], Some(11), Some("ctr-a"));
        a.add(1, [(own, 200)], Some(own), Some("ctr-b"));
        a.add(2, [(13, 5)], None, None);
        a.add(3, [], None, Some("ctr-d"));
        assert_eq!(a.owner_of(100).unwrap(), Some(0));
        assert_eq!(a.owner_of(200).unwrap(), Some(1));
        assert_eq!(a.owner_of(300).unwrap(), Some(2));
        assert_eq!(a.owner_of(400).unwrap(), Some(3));
        assert_eq!(a.owner_of(500).unwrap(), None);
        assert_eq!(a.owner_of(600).unwrap(), None);
        assert!(a.owner_of(700).is_err(), "no /proc entry");
        // A process in a known container namespace needs neither status nor cgroup.
        std::fs::remove_file(root.path().join("100/status")).unwrap();
        std::fs::remove_file(root.path().join("100/cgroup")).unwrap();
        let mut b = Attributor::new(&proc, Some(own));
        b.add(0, [], Some(11), Some("ctr-a"));
        assert_eq!(b.owner_of(100).unwrap(), Some(0));
        // The host namespace is never taken for a container's own.
        let mut c = Attributor::new(&proc, Some(own));
        c.add(0, [], Some(own), None);
        assert_eq!(c.owner_of(500).unwrap(), None);
    }
}
