//! Node-wide device memory: every allocation of every process is charged to its slot, and a
//! charge is admitted only while the sum over all slots stays within the device's capacity,
//! decided under the device's lock so two processes can never both take the last bytes.

use std::sync::atomic::Ordering;

use crate::slots::Slot;
use crate::state::{SharedState, StateError};

/// Outcome of a refused charge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfMemory {
    /// Bytes in use on the device when refused.
    pub used: u64,
    pub capacity: u64,
}

impl SharedState {
    /// Bytes in use on device `dev` by all processes (dead ones included until reaped).
    pub fn used(&self, dev: usize) -> u64 {
        (0..self.slots_hwm())
            .map(|i| self.layout().slots[i].used[dev].load(Ordering::Acquire))
            .fold(0u64, u64::saturating_add)
    }

    /// Bytes of device `dev` held by `slot`.
    pub fn used_by(&self, slot: &Slot, dev: usize) -> u64 {
        self.layout().slots[slot.index()].used[dev].load(Ordering::Acquire)
    }

    /// Charges `bytes` of device `dev` (of `capacity` bytes) to `slot`, or refuses when the
    /// device would be over capacity even after reclaiming dead processes' memory.
    pub fn charge(
        &self,
        slot: &Slot,
        dev: usize,
        bytes: u64,
        capacity: u64,
    ) -> Result<Result<(), OutOfMemory>, StateError> {
        self.with_device_lock(dev, || {
            let mut used = self.used(dev);
            if used.saturating_add(bytes) > capacity {
                self.reap_dead()?;
                used = self.used(dev);
                if used.saturating_add(bytes) > capacity {
                    return Ok(Err(OutOfMemory { used, capacity }));
                }
            }
            self.layout().slots[slot.index()].used[dev].fetch_add(bytes, Ordering::AcqRel);
            Ok(Ok(()))
        })?
    }

    /// Gives back `bytes` of device `dev` charged to `slot`.
    pub fn uncharge(&self, slot: &Slot, dev: usize, bytes: u64) {
        let c = &self.layout().slots[slot.index()].used[dev];
        let _ = c.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
            Some(v.saturating_sub(bytes))
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::STATE_FILE;

    #[test]
    fn charges_are_node_wide_and_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(STATE_FILE);
        let a = SharedState::open(&p).unwrap();
        let b = SharedState::open(&p).unwrap();
        let sa = a.claim_slot(1, 1).unwrap();
        let sb = b.claim_slot(2, 1).unwrap();
        assert_eq!(a.charge(&sa, 0, 600, 1000).unwrap(), Ok(()));
        assert_eq!(
            b.charge(&sb, 0, 500, 1000).unwrap(),
            Err(OutOfMemory {
                used: 600,
                capacity: 1000
            })
        );
        assert_eq!(b.charge(&sb, 0, 400, 1000).unwrap(), Ok(()));
        assert_eq!(a.used(0), 1000);
        assert_eq!(a.used(1), 0, "devices are separate");
        a.uncharge(&sa, 0, 600);
        assert_eq!(b.used(0), 400);
        assert_eq!(b.used_by(&sb, 0), 400);
    }

    #[test]
    fn dead_memory_is_reclaimed_on_pressure() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(STATE_FILE);
        let a = SharedState::open(&p).unwrap();
        let dead = a.claim_slot(1, 1).unwrap();
        a.charge(&dead, 0, 900, 1000).unwrap().unwrap();
        drop(dead);
        let live = a.claim_slot(2, 1).unwrap();
        // The freed slot may be the same index; either way the 900 bytes are gone.
        assert_eq!(a.charge(&live, 0, 800, 1000).unwrap(), Ok(()));
    }

    #[test]
    fn concurrent_threads_never_oversubscribe() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(STATE_FILE);
        let a = std::sync::Arc::new(SharedState::open(&p).unwrap());
        let slot = std::sync::Arc::new(a.claim_slot(1, 1).unwrap());
        let granted: u64 = (0..4)
            .map(|_| {
                let (a, slot) = (a.clone(), slot.clone());
                std::thread::spawn(move || {
                    (0..100)
                        .filter(|_| a.charge(&slot, 0, 7, 1000).unwrap().is_ok())
                        .count() as u64
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .sum();
        assert_eq!(granted, 1000 / 7);
        assert_eq!(a.used(0), granted * 7);
    }
}
