//! Process slots: each process using the simulated driver claims one slot and holds its lock
//! for life. The kernel releases the lock when the process dies, however it dies, so any
//! process that later finds a slot marked in use but unlocked gives its memory back, as the
//! real driver frees a dead process's allocations.

use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::devices::MAX_DEVICES;
use crate::state::{
    lock_ignoring_poison, open_rw, slot_lock_offset, try_lock, SharedState, StateError, MAX_SLOTS,
};

/// A claimed slot; dropping it (or dying) releases it.
#[derive(Debug)]
pub struct Slot {
    index: usize,
    /// Own open file description holding the slot lock: distinct from the mapping's, so this
    /// process's own probes see its slot as alive.
    _lock: File,
}

impl Slot {
    /// Index of the slot in the state file.
    pub fn index(&self) -> usize {
        self.index
    }
}

/// A live slot's figures for one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotUsage {
    pub slot: usize,
    /// Pid as seen inside the process's own pid namespace.
    pub pid: u32,
    /// Inode of that pid namespace.
    pub pid_ns: u64,
    /// Bytes held on the device.
    pub used: u64,
    /// Contexts held on the device.
    pub contexts: u64,
    /// Kernel time the process ever ran on the device, ns.
    pub busy_ns: u64,
}

fn zero(counters: &[AtomicU64; MAX_DEVICES]) {
    for c in counters {
        c.store(0, Ordering::Release);
    }
}

/// Clears everything a slot records about its process's use.
fn clear(s: &crate::state::SlotState) {
    zero(&s.used);
    zero(&s.contexts);
    zero(&s.busy_ns);
    for dev in &s.buckets {
        for b in dev {
            b.store(0, Ordering::Release);
        }
    }
}

impl SharedState {
    /// Claims a free slot for the calling process (`pid` as it sees itself, its pid
    /// namespace inode). A slot left by a dead process is cleaned and reused.
    pub fn claim_slot(&self, pid: u32, pid_ns: u64) -> Result<Slot, StateError> {
        let lock_err = |what: String, source| StateError::Lock {
            path: self.path().to_path_buf(),
            what,
            source,
        };
        let (file, _) = open_rw(self.path()).map_err(|source| StateError::Open {
            path: self.path().to_path_buf(),
            source,
        })?;
        let _reaping = lock_ignoring_poison(&self.reap_mutex);
        for i in 0..MAX_SLOTS {
            if !try_lock(&file, slot_lock_offset(i))
                .map_err(|e| lock_err(format!("slot {i}"), e))?
            {
                continue;
            }
            let s = &self.layout().slots[i];
            // Whatever is recorded belongs to a dead process.
            clear(s);
            s.pid.store(u64::from(pid), Ordering::Release);
            s.pid_ns.store(pid_ns, Ordering::Release);
            s.in_use.store(1, Ordering::Release);
            self.layout()
                .header
                .slots_hwm
                .fetch_max(i as u64 + 1, Ordering::AcqRel);
            return Ok(Slot {
                index: i,
                _lock: file,
            });
        }
        Err(StateError::SlotsFull {
            path: self.path().to_path_buf(),
        })
    }

    /// Gives back the memory and contexts of every slot whose process is gone; returns how
    /// many slots were reclaimed.
    pub fn reap_dead(&self) -> Result<usize, StateError> {
        let _reaping = lock_ignoring_poison(&self.reap_mutex);
        let mut reaped = 0;
        for i in 0..self.slots_hwm() {
            let s = &self.layout().slots[i];
            let dirty = s.in_use.load(Ordering::Acquire) != 0
                || s.used
                    .iter()
                    .chain(s.contexts.iter())
                    .any(|c| c.load(Ordering::Acquire) != 0);
            if !dirty || !self.probe_slot_lock(i)? {
                continue;
            }
            clear(s);
            s.in_use.store(0, Ordering::Release);
            self.release_probe_lock(i);
            reaped += 1;
        }
        Ok(reaped)
    }

    /// Slots holding memory or a context on device `dev` (dead ones reaped first).
    pub fn slot_usage(&self, dev: usize) -> Result<Vec<SlotUsage>, StateError> {
        self.reap_dead()?;
        let mut out = Vec::new();
        for i in 0..self.slots_hwm() {
            let s = &self.layout().slots[i];
            if s.in_use.load(Ordering::Acquire) == 0 {
                continue;
            }
            let used = s.used[dev].load(Ordering::Acquire);
            let contexts = s.contexts[dev].load(Ordering::Acquire);
            if used == 0 && contexts == 0 {
                continue;
            }
            out.push(SlotUsage {
                slot: i,
                pid: s.pid.load(Ordering::Acquire) as u32,
                pid_ns: s.pid_ns.load(Ordering::Acquire),
                used,
                contexts,
                busy_ns: s.busy_ns[dev].load(Ordering::Acquire),
            });
        }
        Ok(out)
    }

    /// Records one more (or, with `created == false`, one fewer) context of `slot` on `dev`.
    pub fn count_context(&self, slot: &Slot, dev: usize, created: bool) {
        let c = &self.layout().slots[slot.index].contexts[dev];
        if created {
            c.fetch_add(1, Ordering::AcqRel);
        } else {
            let _ = c.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                Some(v.saturating_sub(1))
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::STATE_FILE;

    #[test]
    fn slots_are_exclusive_and_dead_ones_are_reaped() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(STATE_FILE);
        let a = SharedState::open(&p).unwrap();
        let s0 = a.claim_slot(10, 1).unwrap();
        let s1 = a.claim_slot(11, 1).unwrap();
        assert_ne!(s0.index(), s1.index());
        a.layout().slots[s1.index()].used[0].store(100, Ordering::SeqCst);
        a.count_context(&s1, 0, true);
        assert_eq!(a.reap_dead().unwrap(), 0, "live slots are kept");
        let u = a.slot_usage(0).unwrap();
        assert_eq!(u.len(), 1);
        assert_eq!((u[0].pid, u[0].used, u[0].contexts), (11, 100, 1));

        // Closing the lock's description is what the kernel does when a process dies.
        let idx = s1.index();
        drop(s1);
        assert_eq!(a.reap_dead().unwrap(), 1);
        assert!(a.slot_usage(0).unwrap().is_empty());
        assert_eq!(a.layout().slots[idx].used[0].load(Ordering::SeqCst), 0);
        // The freed slot is claimed again.
        let again = a.claim_slot(12, 1).unwrap();
        assert_eq!(again.index(), idx);
        drop(s0);
    }
}
