//! A scripted [`System`] for tests: a settable clock, a boot id and a process table, so
//! process deaths, pid reuse and reboots can be played out without real processes.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use crate::system::{System, SystemError};

#[derive(Debug)]
struct State {
    now_ms: u64,
    boot_id: String,
    boots: u32,
    /// pid → start time of the live process holding it.
    processes: HashMap<u32, u64>,
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
        self.state().processes.remove(&pid);
    }

    /// Reboots: a new boot id and no processes.
    pub fn reboot(&self) {
        let mut s = self.state();
        s.boots += 1;
        s.boot_id = format!("fake-boot-{}", s.boots);
        s.processes.clear();
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
}
