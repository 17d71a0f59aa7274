//! Pids across pid namespaces: a process records the pid it sees and its pid namespace; NVML
//! on the host reports host pids, found through the `NSpid:` line of `/proc/<pid>/status`.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Inode of the pid namespace of the process whose `/proc` entry is `proc_root/<who>`
/// (`who` is `self` or a pid); 0 if unreadable.
pub fn pid_ns_inode(proc_root: &Path, who: &str) -> u64 {
    std::fs::metadata(proc_root.join(who).join("ns/pid"))
        .map(|m| m.ino())
        .unwrap_or(0)
}

/// The pid as seen from the `/proc` at `proc_root` of a process that sees itself as `pid` in
/// namespace `pid_ns`: itself when `pid_ns` is `own_ns`, else the `/proc` entry whose
/// `NSpid:` line ends in `pid` and whose namespace is `pid_ns`. `None` when not found (the
/// process is in a namespace this `/proc` cannot see into, or gone).
pub fn visible_pid(proc_root: &Path, own_ns: u64, pid: u32, pid_ns: u64) -> Option<u32> {
    if pid_ns == own_ns {
        return Some(pid);
    }
    let entries = std::fs::read_dir(proc_root).ok()?;
    for e in entries.filter_map(|e| e.ok()) {
        let name = e.file_name();
        let Some(host) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(e.path().join("status")) else {
            continue;
        };
        let innermost = status
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .and_then(|rest| rest.split_whitespace().last())
            .and_then(|p| p.parse::<u32>().ok());
        if innermost == Some(pid) && pid_ns_inode(proc_root, &host.to_string()) == pid_ns {
            return Some(host);
        }
    }
    None
}

/// This process's pid and pid namespace inode.
pub fn current_process() -> (u32, u64) {
    (std::process::id(), pid_ns_inode(Path::new("/proc"), "self"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_proc(root: &Path, host: u32, nspid: &str) -> u64 {
        let d = root.join(host.to_string());
        std::fs::create_dir_all(d.join("ns")).unwrap();
        std::fs::write(d.join("status"), format!("Name:\tx\nNSpid:\t{nspid}\n")).unwrap();
        std::fs::write(d.join("ns/pid"), host.to_string()).unwrap();
        std::fs::metadata(d.join("ns/pid")).unwrap().ino()
    }

    #[test]
    fn maps_container_pids_to_host_pids() {
        let root = tempfile::tempdir().unwrap();
        let _host_only = fake_proc(root.path(), 100, "100");
        let ns_a = fake_proc(root.path(), 4242, "4242\t7");
        let ns_b = fake_proc(root.path(), 5151, "5151\t7");
        assert_eq!(visible_pid(root.path(), 1, 7, ns_a), Some(4242));
        assert_eq!(visible_pid(root.path(), 1, 7, ns_b), Some(5151));
        assert_eq!(visible_pid(root.path(), 1, 8, ns_a), None);
        assert_eq!(
            visible_pid(root.path(), ns_a, 7, ns_a),
            Some(7),
            "same namespace: as recorded"
        );
    }

    #[test]
    fn own_namespace_is_readable() {
        let (pid, ns) = current_process();
        assert!(pid > 0);
        assert!(ns > 0);
        assert_eq!(visible_pid(Path::new("/proc"), ns, pid, ns), Some(pid));
    }
}
