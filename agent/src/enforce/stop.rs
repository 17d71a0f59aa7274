//! Stopping a reservation's containers, the escalation for a slice that goes over its memory
//! limit again within the repeat window of a kill: every process in the cgroups recorded for
//! the reservation's containers (the same host facts attribution uses; a cgroup is recorded
//! only when the container's init was alone in it, so a shared one is never emptied), read from
//! `cgroup.procs` under the cgroup root and killed through the signaller, in a few passes so
//! that processes forked meanwhile go too. A listed pid is killed only when it is still listed
//! after its start time was read, and only while it has that start time: one that exited and
//! was reused by a process outside the cgroups in between is not hit.

use std::path::{Path, PathBuf};

use gpuslice_registry::{cgroup_rel_path, Reservation};

use crate::enforce::signal::Signaller;

/// Deepest cgroup tree walked under a container's cgroup.
const MAX_DEPTH: usize = 8;
/// Passes over the cgroups: a process forked between the read and the kill is caught by
/// the next one.
const PASSES: usize = 3;

/// A container that could not be stopped.
#[derive(Debug, thiserror::Error)]
pub enum StopError {
    #[error("recorded cgroup `{cgroup}` is not a relative path of plain components; nothing under it is stopped")]
    BadCgroup { cgroup: String },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The pids in `dir`'s `cgroup.procs` and its descendants'.
fn pids_under(dir: &Path, depth: usize, out: &mut Vec<u32>) -> Result<(), StopError> {
    let procs = dir.join("cgroup.procs");
    match std::fs::read_to_string(&procs) {
        Ok(text) => out.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok())),
        // The cgroup is gone: its processes with it.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(StopError::Read {
                path: procs,
                source,
            })
        }
    }
    if depth >= MAX_DEPTH {
        return Ok(());
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for e in entries.filter_map(Result::ok) {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            pids_under(&e.path(), depth + 1, out)?;
        }
    }
    Ok(())
}

/// Kills every process of `r`'s containers: those in the cgroups recorded for them under
/// `cgroup_root`, and each recorded init still running (a container without a recorded
/// cgroup ends with its pid namespace's init). Returns the (pid, start time) of each process
/// killed and a line per thing that failed.
pub fn stop_containers(
    r: &Reservation,
    cgroup_root: &Path,
    signaller: &mut dyn Signaller,
) -> (Vec<(u32, u64)>, Vec<String>) {
    let mut killed = Vec::new();
    let mut errors = Vec::new();
    let mut dirs = Vec::new();
    for p in r.owner.processes() {
        match p.cgroup.as_deref() {
            Some(c) => match cgroup_rel_path(c) {
                Some(rel) => dirs.push(cgroup_root.join(rel)),
                None => errors.push(StopError::BadCgroup { cgroup: c.into() }.to_string()),
            },
            None => {
                if signaller.start_time(p.pid) == Some(p.start_time)
                    && signaller.kill(p.pid, p.start_time).is_ok()
                {
                    killed.push((p.pid, p.start_time));
                }
            }
        }
    }
    let listed = |errors: &mut Vec<String>| {
        let mut pids = Vec::new();
        for d in &dirs {
            if let Err(e) = pids_under(d, 0, &mut pids) {
                errors.push(e.to_string());
            }
        }
        pids
    };
    for _ in 0..PASSES {
        let pids = listed(&mut errors);
        if pids.is_empty() {
            break;
        }
        let starts: Vec<(u32, u64)> = pids
            .into_iter()
            .filter_map(|pid| Some((pid, signaller.start_time(pid)?)))
            .collect();
        // Listed again after the start times were read: a pid still there had that start
        // time while in the cgroup, so the kill's check hits that process or nothing.
        // (What it cannot read the first read of this pass reported.)
        let still = listed(&mut Vec::new());
        for (pid, start) in starts.into_iter().filter(|(p, _)| still.contains(p)) {
            match signaller.kill(pid, start) {
                Ok(()) => killed.push((pid, start)),
                Err(e) => errors.push(e.to_string()),
            }
        }
    }
    (killed, errors)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::enforce::signal::SignalError;
    use std::collections::HashSet;

    /// Kills by removing the pid from a fixture cgroup tree, as the kernel would.
    struct TreeKiller {
        root: PathBuf,
        killed: Vec<u32>,
        dead: HashSet<u32>,
    }

    impl Signaller for TreeKiller {
        fn start_time(&self, pid: u32) -> Option<u64> {
            (!self.dead.contains(&pid)).then_some(1)
        }
        fn kill(&mut self, pid: u32, _start: u64) -> Result<(), SignalError> {
            self.killed.push(pid);
            self.dead.insert(pid);
            for dir in ["ctr", "ctr/sub", "other"] {
                let f = self.root.join(dir).join("cgroup.procs");
                let text = std::fs::read_to_string(&f).unwrap_or_default();
                let kept: Vec<&str> = text.lines().filter(|l| *l != pid.to_string()).collect();
                let _ = std::fs::write(&f, kept.join("\n"));
            }
            Ok(())
        }
    }

    #[test]
    fn every_process_of_the_containers_cgroups_and_nothing_else_is_killed() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for (d, pids) in [("ctr", "10\n11\n"), ("ctr/sub", "12\n"), ("other", "20\n")] {
            std::fs::create_dir_all(root.join(d)).unwrap();
            std::fs::write(root.join(d).join("cgroup.procs"), pids).unwrap();
        }
        let r: Reservation = serde_json::from_value(serde_json::json!({
            "id": "0000000000000001", "state": "bound",
            "owner": {"kind": "dra_claim", "claim_uid": "u", "namespace": "ns", "name": "n",
                "members": [
                    {"pid": 10, "start_time": 1, "boot_id": "b", "cgroup": "ctr"},
                    {"pid": 30, "start_time": 1, "boot_id": "b", "cgroup": "../escape"},
                ]},
            "gpus": [], "created_ms": 0,
        }))
        .unwrap();
        let mut k = TreeKiller {
            root: root.to_path_buf(),
            killed: Vec::new(),
            dead: HashSet::new(),
        };
        let (n, errors) = stop_containers(&r, root, &mut k);
        let mut killed = k.killed.clone();
        killed.sort();
        assert_eq!(killed, vec![10, 11, 12]);
        assert_eq!(n.len(), 3);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].contains("../escape"), "{errors:?}");
    }

    /// Pid 11 of the container exits after `cgroup.procs` was read, and a process outside
    /// the cgroup gets its pid before its start time is read.
    struct Reused {
        tree: TreeKiller,
    }

    impl Signaller for Reused {
        fn start_time(&self, pid: u32) -> Option<u64> {
            if pid == 11 {
                let f = self.tree.root.join("ctr/cgroup.procs");
                let _ = std::fs::write(&f, "10\n");
                return Some(2);
            }
            self.tree.start_time(pid)
        }
        fn kill(&mut self, pid: u32, start: u64) -> Result<(), SignalError> {
            self.tree.kill(pid, start)
        }
    }

    #[test]
    fn a_pid_reused_outside_the_cgroup_before_its_start_time_is_read_is_not_killed() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("ctr")).unwrap();
        std::fs::write(root.join("ctr/cgroup.procs"), "10\n11\n").unwrap();
        let r: Reservation = serde_json::from_value(serde_json::json!({
            "id": "0000000000000001", "state": "bound",
            "owner": {"kind": "dra_claim", "claim_uid": "u", "namespace": "ns", "name": "n",
                "members": [{"pid": 10, "start_time": 1, "boot_id": "b", "cgroup": "ctr"}]},
            "gpus": [], "created_ms": 0,
        }))
        .unwrap();
        let mut k = Reused {
            tree: TreeKiller {
                root: root.to_path_buf(),
                killed: Vec::new(),
                dead: HashSet::new(),
            },
        };
        let (n, errors) = stop_containers(&r, root, &mut k);
        assert_eq!(k.tree.killed, vec![10]);
        assert_eq!(n.len(), 1);
        assert!(errors.is_empty(), "{errors:?}");
    }
}
