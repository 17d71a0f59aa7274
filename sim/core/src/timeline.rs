//! The device timeline: a simulated GPU runs one kernel at a time, first come first served
//! across all processes. A kernel occupies the device from `max(not_before, free_at)` for its
//! duration, and busy time is recorded per 100 ms bucket, for the device and for the process
//! that launched it, so NVML can report the device's utilisation and each process's.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::slots::Slot;
use crate::state::{SharedState, BUCKET_NS, SLOT_BUCKETS};

/// CLOCK_MONOTONIC in nanoseconds: the clock of every timeline, the same in all processes
/// and containers of the node.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the valid timespec we pass.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Sleeps until CLOCK_MONOTONIC reaches `deadline_ns` (returns at once if it has).
pub fn sleep_until(deadline_ns: u64) {
    loop {
        let now = now_ns();
        if now >= deadline_ns {
            return;
        }
        std::thread::sleep(std::time::Duration::from_nanos(deadline_ns - now));
    }
}

/// Where a scheduled kernel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scheduled {
    pub start: u64,
    pub end: u64,
}

fn bucket_add(b: &AtomicU64, epoch: u32, ns: u32) {
    let _ = b.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
        let (e, n) = ((v >> 32) as u32, v as u32);
        if e == epoch {
            Some(((epoch as u64) << 32) | u64::from(n.saturating_add(ns)))
        } else if e < epoch || v == 0 {
            Some(((epoch as u64) << 32) | u64::from(ns))
        } else {
            // The slot already holds a later epoch (a backlog over BUCKETS deep): drop.
            None
        }
    });
}

impl SharedState {
    /// Schedules a kernel of `duration_ns` on device `dev`, not before `not_before` (the
    /// stream's tail or now): it starts when the device is free.
    pub fn schedule(&self, dev: usize, not_before: u64, duration_ns: u64) -> Scheduled {
        let d = &self.layout().devices[dev];
        let mut start = 0;
        let _ = d
            .free_at
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |free_at| {
                start = free_at.max(not_before);
                Some(start.saturating_add(duration_ns))
            });
        let end = start.saturating_add(duration_ns);
        d.busy_ns.fetch_add(duration_ns, Ordering::AcqRel);
        d.launches.fetch_add(1, Ordering::AcqRel);
        self.record_busy(dev, start, end);
        Scheduled { start, end }
    }

    /// When device `dev` finishes all work scheduled so far.
    pub fn free_at(&self, dev: usize) -> u64 {
        self.layout().devices[dev].free_at.load(Ordering::Acquire)
    }

    /// Total kernel time ever scheduled on `dev`, in ns.
    pub fn busy_ns(&self, dev: usize) -> u64 {
        self.layout().devices[dev].busy_ns.load(Ordering::Acquire)
    }

    /// Kernels ever scheduled on `dev`.
    pub fn launches(&self, dev: usize) -> u64 {
        self.layout().devices[dev].launches.load(Ordering::Acquire)
    }

    /// Schedules like [`SharedState::schedule`] and charges the kernel's time to `slot`'s
    /// process: the driver's own per-process figure, which nothing in a container's slice
    /// files can change.
    pub fn schedule_by(
        &self,
        slot: &Slot,
        dev: usize,
        not_before: u64,
        duration_ns: u64,
    ) -> Scheduled {
        let at = self.schedule(dev, not_before, duration_ns);
        let s = &self.layout().slots[slot.index()];
        s.busy_ns[dev].fetch_add(duration_ns, Ordering::AcqRel);
        record_in(&s.buckets[dev], at.start, at.end);
        at
    }

    fn record_busy(&self, dev: usize, start: u64, end: u64) {
        record_in(&self.layout().devices[dev].buckets, start, end);
    }

    /// Percent of the last second (the ten complete 100 ms buckets before `now`) during
    /// which device `dev` ran kernels.
    pub fn utilization(&self, dev: usize, now: u64) -> u32 {
        percent_of_last_second(&self.layout().devices[dev].buckets, now)
    }

    /// Percent of the last second during which device `dev` ran kernels of the process
    /// holding slot `slot` (an index from [`SharedState::slot_usage`]).
    pub fn slot_utilization(&self, slot: usize, dev: usize, now: u64) -> u32 {
        match self.layout().slots.get(slot) {
            Some(s) => percent_of_last_second(&s.buckets[dev], now),
            None => 0,
        }
    }

    /// The kernel time device `dev` ran for the process holding slot `slot` in each complete
    /// [`BUCKET_NS`] bucket still held (the `SLOT_BUCKETS - 1` before the one `now` falls
    /// in), oldest first, with the epoch (`ns / BUCKET_NS`) of the first; a bucket nothing
    /// ran in (or an unknown slot) reads 0.
    pub fn slot_history(&self, slot: usize, dev: usize, now: u64) -> (u64, Vec<u64>) {
        let current = now / BUCKET_NS;
        let first = current.saturating_sub(SLOT_BUCKETS as u64 - 1);
        let Some(buckets) = self
            .layout()
            .slots
            .get(slot)
            .and_then(|s| s.buckets.get(dev))
        else {
            return (first, vec![0; (current - first) as usize]);
        };
        (
            first,
            (first..current).map(|e| busy_in(buckets, e)).collect(),
        )
    }
}

/// Busy ns of `epoch` in a ring of buckets, 0 when the ring holds another epoch there.
fn busy_in(buckets: &[AtomicU64], epoch: u64) -> u64 {
    let v = buckets[(epoch % buckets.len() as u64) as usize].load(Ordering::Acquire);
    if (v >> 32) as u32 == epoch as u32 {
        u64::from(v as u32)
    } else {
        0
    }
}

/// Adds `[start, end)` to a ring of buckets (the most recent `buckets.len()` are kept).
fn record_in(buckets: &[AtomicU64], start: u64, end: u64) {
    if end <= start || buckets.is_empty() {
        return;
    }
    let n = buckets.len() as u64;
    let first = start / BUCKET_NS;
    let last = (end - 1) / BUCKET_NS;
    let from = first.max(last.saturating_sub(n - 1));
    for epoch in from..=last {
        let lo = start.max(epoch * BUCKET_NS);
        let hi = end.min((epoch + 1) * BUCKET_NS);
        bucket_add(
            &buckets[(epoch % n) as usize],
            epoch as u32,
            (hi - lo) as u32,
        );
    }
}

/// Busy percent of the ten complete buckets before `now`.
fn percent_of_last_second(buckets: &[AtomicU64], now: u64) -> u32 {
    let n = buckets.len() as u64;
    let current = now / BUCKET_NS;
    let window = (1_000_000_000 / BUCKET_NS).min(n);
    let busy: u64 = (current.saturating_sub(window)..current)
        .map(|epoch| busy_in(buckets, epoch))
        .sum();
    ((busy * 100 + 500_000_000) / 1_000_000_000).min(100) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::STATE_FILE;

    #[test]
    fn kernels_run_one_at_a_time_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let s = SharedState::open(&dir.path().join(STATE_FILE)).unwrap();
        let a = s.schedule(0, 1_000, 500);
        assert_eq!(
            a,
            Scheduled {
                start: 1_000,
                end: 1_500
            }
        );
        // Submitted earlier than the device is free: waits for it.
        let b = s.schedule(0, 1_200, 100);
        assert_eq!(
            b,
            Scheduled {
                start: 1_500,
                end: 1_600
            }
        );
        // Submitted after an idle gap: starts at its own time.
        let c = s.schedule(0, 5_000, 10);
        assert_eq!(
            c,
            Scheduled {
                start: 5_000,
                end: 5_010
            }
        );
        assert_eq!(s.free_at(0), 5_010);
        assert_eq!(s.busy_ns(0), 610);
        assert_eq!(s.launches(0), 3);
        assert_eq!(s.free_at(1), 0, "other devices untouched");
    }

    #[test]
    fn utilization_covers_the_last_second() {
        let dir = tempfile::tempdir().unwrap();
        let s = SharedState::open(&dir.path().join(STATE_FILE)).unwrap();
        let t0 = 100 * BUCKET_NS;
        // Busy half of every 100 ms for one second.
        for i in 0..10 {
            s.schedule(0, t0 + i * BUCKET_NS, BUCKET_NS / 2);
        }
        assert_eq!(s.utilization(0, t0 + 10 * BUCKET_NS), 50);
        // A second later, nothing ran.
        assert_eq!(s.utilization(0, t0 + 20 * BUCKET_NS), 0);
        // One long kernel spanning buckets counts fully.
        s.schedule(0, t0 + 30 * BUCKET_NS, 10 * BUCKET_NS);
        assert_eq!(s.utilization(0, t0 + 40 * BUCKET_NS), 100);
    }

    #[test]
    fn kernels_are_charged_to_the_launching_process() {
        let dir = tempfile::tempdir().unwrap();
        let s = SharedState::open(&dir.path().join(STATE_FILE)).unwrap();
        let a = s.claim_slot(1, 1).unwrap();
        let b = s.claim_slot(2, 1).unwrap();
        let t0 = 100 * BUCKET_NS;
        // A runs 70 % of every 100 ms, B 20 %, for one second on device 2.
        for i in 0..10 {
            s.schedule_by(&a, 2, t0 + i * BUCKET_NS, BUCKET_NS * 7 / 10);
            s.schedule_by(&b, 2, t0 + i * BUCKET_NS, BUCKET_NS / 5);
        }
        let now = t0 + 10 * BUCKET_NS;
        assert_eq!(s.slot_utilization(a.index(), 2, now), 70);
        assert_eq!(s.slot_utilization(b.index(), 2, now), 20);
        assert_eq!(s.utilization(2, now), 90, "the device sums both");
        assert_eq!(s.slot_utilization(a.index(), 1, now), 0, "other devices");
        let usage = s.slot_usage(2).unwrap();
        assert!(usage.is_empty(), "no memory or context: not listed");
        assert_eq!(s.busy_ns(2), 9 * BUCKET_NS);
        // A dead process's figures go with it.
        let idx = b.index();
        drop(b);
        s.reap_dead().unwrap();
        assert_eq!(s.slot_utilization(idx, 2, now), 0);
        assert_eq!(
            s.slot_utilization(crate::state::MAX_SLOTS + 1, 2, now),
            0,
            "out of range reads 0"
        );
    }

    #[test]
    fn slot_history_holds_the_complete_buckets_of_the_ring() {
        let dir = tempfile::tempdir().unwrap();
        let s = SharedState::open(&dir.path().join(STATE_FILE)).unwrap();
        let a = s.claim_slot(1, 1).unwrap();
        let t0 = 1_000 * BUCKET_NS;
        s.schedule_by(&a, 3, t0, BUCKET_NS / 4);
        s.schedule_by(&a, 3, t0 + 5 * BUCKET_NS, BUCKET_NS);
        let (first, busy) = s.slot_history(a.index(), 3, t0 + 10 * BUCKET_NS + 1);
        assert_eq!(busy.len(), SLOT_BUCKETS - 1);
        assert_eq!(first + busy.len() as u64, 1_010, "up to the current bucket");
        let at = |e: u64| busy[(e - first) as usize];
        assert_eq!(
            (at(1_000), at(1_005), at(1_009)),
            (BUCKET_NS / 4, BUCKET_NS, 0)
        );
        assert_eq!(busy.iter().sum::<u64>(), BUCKET_NS * 5 / 4);
        // Once out of the ring, a bucket reads 0, and the current one is not complete.
        let (_, later) = s.slot_history(a.index(), 3, t0 + 70 * BUCKET_NS);
        assert!(later.iter().all(|b| *b == 0), "{later:?}");
        let (_, unknown) = s.slot_history(crate::state::MAX_SLOTS + 1, 3, t0);
        assert!(unknown.iter().all(|b| *b == 0));
    }
}
