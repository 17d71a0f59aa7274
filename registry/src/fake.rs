//! A scripted [`System`] for tests: a settable clock, a boot id, a process table (with
//! parents and cgroups) and the cgroups that still hold processes, so process deaths, pid
//! reuse, reboots and containers outliving their init can be played out without real
//! processes.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};

use crate::system::{System, SystemError};

#[derive(Debug)]
struct State {
    now_ms: u64,
    boot_id: String,
    boots: u32,
    /// pid → start time of the live process holding it.
    processes: HashMap<u32, u64>,
    /// pid → parent pid.
    parents: HashMap<u32, u32>,
    /// pid → the cgroup it runs in.
    cgroups: HashMap<u32, String>,
    /// Cgroups holding processes besides those of the table (children not modelled).
    populated: HashSet<String>,
    /// The pid the registry's caller runs as, when set.
    current: Option<u32>,
}

/// A fake system; share it with the registry through an `Arc`.
#[derive(Debug)]
pub struct FakeSystem {
    state: Mutex<State>,
}

impl FakeSystem {
    /// A system at `now_ms` with no processes.
    pub fn new(now_ms: u64) -> FakeSystem {
        FakeSystem {
            state: Mutex::new(State {
                now_ms,
                boot_id: "fake-boot-0".into(),
                boots: 0,
                processes: HashMap::new(),
                parents: HashMap::new(),
                cgroups: HashMap::new(),
                populated: HashSet::new(),
                current: None,
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data that is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Moves the clock forward.
    pub fn advance_ms(&self, ms: u64) {
        let mut s = self.state();
        s.now_ms = s.now_ms.saturating_add(ms);
    }

    /// Starts (or, for a pid in use, replaces: pid reuse) process `pid` with `start_time`.
    pub fn spawn(&self, pid: u32, start_time: u64) {
        self.state().processes.insert(pid, start_time);
    }

    /// Ends process `pid`.
    pub fn kill(&self, pid: u32) {
        let mut s = self.state();
        s.processes.remove(&pid);
        s.parents.remove(&pid);
        s.cgroups.remove(&pid);
    }

    /// Makes the registry's caller run as `pid` (none by default: reservations then name no
    /// reserving process).
    pub fn set_current(&self, pid: Option<u32>) {
        self.state().current = pid;
    }

    /// Makes `parent` the parent of the running process `pid`.
    pub fn set_parent(&self, pid: u32, parent: u32) {
        self.state().parents.insert(pid, parent);
    }

    /// Puts the running process `pid` into `cgroup`.
    pub fn set_cgroup(&self, pid: u32, cgroup: &str) {
        self.state().cgroups.insert(pid, cgroup.to_string());
    }

    /// Marks `cgroup` as holding (or no longer holding) processes outside the table, such as
    /// the children a container's init left behind.
    pub fn set_populated(&self, cgroup: &str, populated: bool) {
        let mut s = self.state();
        if populated {
            s.populated.insert(cgroup.to_string());
        } else {
            s.populated.remove(cgroup);
        }
    }

    /// Reboots: a new boot id and no processes.
    pub fn reboot(&self) {
        let mut s = self.state();
        s.boots += 1;
        s.boot_id = format!("fake-boot-{}", s.boots);
        s.processes.clear();
        s.parents.clear();
        s.cgroups.clear();
        s.populated.clear();
    }

    /// The start time of `pid`, if it runs.
    pub fn start_time(&self, pid: u32) -> Option<u64> {
        self.state().processes.get(&pid).copied()
    }
}

impl System for FakeSystem {
    fn now_ms(&self) -> u64 {
        self.state().now_ms
    }

    fn boot_id(&self) -> Result<String, SystemError> {
        Ok(self.state().boot_id.clone())
    }

    fn process_exists(&self, pid: u32) -> bool {
        self.state().processes.contains_key(&pid)
    }

    fn process_start_time(&self, pid: u32) -> Result<Option<u64>, SystemError> {
        if pid == 0 {
            return Err(SystemError::Pid { pid });
        }
        Ok(self.state().processes.get(&pid).copied())
    }

    fn current_pid(&self) -> Option<u32> {
        self.state().current
    }

    fn process_parent(&self, pid: u32) -> Result<Option<u32>, SystemError> {
        if pid == 0 {
            return Err(SystemError::Pid { pid });
        }
        let s = self.state();
        Ok(s.processes
            .contains_key(&pid)
            .then(|| s.parents.get(&pid).copied().unwrap_or(1)))
    }

    /// As the real system records it: the process's cgroup only while no other process
    /// (of the table, or outside it: [`FakeSystem::set_populated`]) is in it.
    fn process_cgroup(&self, pid: u32) -> Result<Option<String>, SystemError> {
        let Some(cgroup) = self.cgroup_of(pid)? else {
            return Ok(None);
        };
        let s = self.state();
        let shared = s.populated.contains(&cgroup)
            || s.cgroups
                .iter()
                .any(|(other, c)| *other != pid && *c == cgroup && s.processes.contains_key(other));
        Ok((!shared).then_some(cgroup))
    }

    fn cgroup_of(&self, pid: u32) -> Result<Option<String>, SystemError> {
        if pid == 0 {
            return Err(SystemError::Pid { pid });
        }
        let s = self.state();
        Ok(s.processes
            .contains_key(&pid)
            .then(|| s.cgroups.get(&pid).cloned())
            .flatten())
    }

    fn cgroup_populated(&self, cgroup: &str) -> bool {
        let s = self.state();
        s.populated.contains(cgroup) || s.cgroups.values().any(|c| c == cgroup)
    }
}
