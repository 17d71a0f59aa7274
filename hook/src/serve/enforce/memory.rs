//! The memory decision, as a pure function of the driver's per-process figures: a slice
//! whose processes together hold more than its limit on a GPU for longer than `grace` gets
//! an action against the process that crossed the limit. Nothing here reads the system, so
//! the property that matters (a slice under its limit is never acted on) is tested over
//! random figures.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// One process's memory on one GPU, as the driver reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcMemory {
    /// Host pid.
    pub pid: u32,
    /// Bytes it holds.
    pub used: u64,
}

/// What the judge decided for one slice on one GPU this reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryVerdict {
    /// At or under the limit.
    Under,
    /// Over the limit since `since`, within grace.
    Over { since: Instant, total: u64 },
    /// Over for longer than grace: act on `pid`, which holds `used` of the slice's `total`.
    Act {
        pid: u32,
        used: u64,
        total: u64,
        over_for: Duration,
    },
}

/// The state kept between readings for one slice on one GPU.
#[derive(Debug, Clone, Default)]
pub struct MemoryTrack {
    over_since: Option<Instant>,
    /// The process whose growth took the slice over the limit.
    crosser: Option<u32>,
    /// Each process's bytes at the last reading.
    last: HashMap<u32, u64>,
}

impl MemoryTrack {
    /// Judges one reading of the slice's processes against `limit`.
    ///
    /// The process acted on is the one whose growth since the previous reading was largest
    /// when the total crossed the limit (the allocation that broke it), or, when that
    /// process is gone (or holds nothing now) and the slice is still over, the largest holder. After an action the
    /// grace starts again, so a slice still over after one kill loses one more process per
    /// grace period, never a burst.
    pub fn judge(
        &mut self,
        procs: &[ProcMemory],
        limit: u64,
        now: Instant,
        grace: Duration,
    ) -> MemoryVerdict {
        let total = procs.iter().fold(0u64, |a, p| a.saturating_add(p.used));
        let verdict = if total <= limit {
            self.over_since = None;
            self.crosser = None;
            MemoryVerdict::Under
        } else {
            let since = *self.over_since.get_or_insert(now);
            if self
                .crosser
                .is_none_or(|c| !procs.iter().any(|p| p.pid == c && p.used > 0))
            {
                self.crosser = self.crossing(procs);
            }
            let over_for = now.saturating_duration_since(since);
            match (over_for >= grace, self.crosser) {
                (true, Some(pid)) => {
                    self.over_since = Some(now);
                    self.crosser = None;
                    let used = procs.iter().find(|p| p.pid == pid).map_or(0, |p| p.used);
                    MemoryVerdict::Act {
                        pid,
                        used,
                        total,
                        over_for,
                    }
                }
                _ => MemoryVerdict::Over { since, total },
            }
        };
        self.last = procs.iter().map(|p| (p.pid, p.used)).collect();
        verdict
    }

    /// The process that grew most since the last reading; the largest holder on a tie or
    /// when nothing grew.
    fn crossing(&self, procs: &[ProcMemory]) -> Option<u32> {
        procs
            .iter()
            .filter(|p| p.used > 0)
            .max_by_key(|p| {
                let before = self.last.get(&p.pid).copied().unwrap_or(0);
                (p.used.saturating_sub(before), p.used)
            })
            .map(|p| p.pid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GIB: u64 = 1 << 30;

    fn p(pid: u32, used: u64) -> ProcMemory {
        ProcMemory { pid, used }
    }

    #[test]
    fn the_process_that_crossed_is_acted_on_after_grace() {
        let t0 = Instant::now();
        let grace = Duration::from_secs(2);
        let mut m = MemoryTrack::default();
        // A holds 3 GiB of a 4 GiB slice; B's 3 GiB take it over.
        assert_eq!(
            m.judge(&[p(1, 3 * GIB)], 4 * GIB, t0, grace),
            MemoryVerdict::Under
        );
        let over = m.judge(
            &[p(1, 3 * GIB), p(2, 3 * GIB)],
            4 * GIB,
            t0 + Duration::from_millis(500),
            grace,
        );
        assert!(matches!(over, MemoryVerdict::Over { total, .. } if total == 6 * GIB));
        let still = m.judge(
            &[p(1, 3 * GIB), p(2, 3 * GIB)],
            4 * GIB,
            t0 + Duration::from_secs(2),
            grace,
        );
        assert!(matches!(still, MemoryVerdict::Over { .. }), "{still:?}");
        let act = m.judge(
            &[p(1, 3 * GIB), p(2, 3 * GIB)],
            4 * GIB,
            t0 + Duration::from_millis(2500),
            grace,
        );
        assert_eq!(
            act,
            MemoryVerdict::Act {
                pid: 2,
                used: 3 * GIB,
                total: 6 * GIB,
                over_for: Duration::from_secs(2)
            }
        );
        // B is gone: under again, nothing more.
        assert_eq!(
            m.judge(
                &[p(1, 3 * GIB)],
                4 * GIB,
                t0 + Duration::from_secs(3),
                grace
            ),
            MemoryVerdict::Under
        );
    }

    #[test]
    fn dipping_under_restarts_the_grace_and_zero_grace_acts_at_once() {
        let t0 = Instant::now();
        let grace = Duration::from_secs(2);
        let mut m = MemoryTrack::default();
        m.judge(&[p(1, 5)], 4, t0, grace);
        m.judge(&[p(1, 3)], 4, t0 + Duration::from_secs(1), grace);
        let v = m.judge(&[p(1, 5)], 4, t0 + Duration::from_millis(2500), grace);
        assert!(matches!(v, MemoryVerdict::Over { .. }), "{v:?}");
        let mut z = MemoryTrack::default();
        assert!(matches!(
            z.judge(&[p(9, 5)], 4, t0, Duration::ZERO),
            MemoryVerdict::Act { pid: 9, .. }
        ));
    }

    #[test]
    fn a_single_process_over_the_limit_is_the_one_acted_on() {
        let t0 = Instant::now();
        let mut m = MemoryTrack::default();
        m.judge(&[p(7, 10 * GIB)], 2 * GIB, t0, Duration::from_secs(1));
        let v = m.judge(
            &[p(7, 10 * GIB)],
            2 * GIB,
            t0 + Duration::from_secs(1),
            Duration::from_secs(1),
        );
        assert!(matches!(v, MemoryVerdict::Act { pid: 7, .. }), "{v:?}");
    }

    proptest! {
        /// Over random sequences of per-process figures and limits, an action is only ever
        /// taken on a reading whose total is over the limit, against a process of that
        /// reading, and only after the slice has been over for the whole grace.
        #[test]
        fn never_acts_on_a_slice_under_its_limit(
            limit in 0u64..64,
            grace_ms in 0u64..3000,
            steps in proptest::collection::vec(
                (proptest::collection::vec((0u32..6, 0u64..40), 0..6), 1u64..1500),
                1..40,
            ),
        ) {
            let grace = Duration::from_millis(grace_ms);
            let mut m = MemoryTrack::default();
            let mut now = Instant::now();
            let mut over_since: Option<Instant> = None;
            for (raw, dt) in steps {
                now += Duration::from_millis(dt);
                let mut procs: Vec<ProcMemory> = Vec::new();
                for (pid, used) in raw {
                    if !procs.iter().any(|q| q.pid == pid) {
                        procs.push(p(pid, used));
                    }
                }
                let total: u64 = procs.iter().map(|q| q.used).sum();
                if total > limit {
                    over_since.get_or_insert(now);
                } else {
                    over_since = None;
                }
                match m.judge(&procs, limit, now, grace) {
                    MemoryVerdict::Act { pid, .. } => {
                        prop_assert!(total > limit, "acted at {total} <= {limit}");
                        prop_assert!(procs.iter().any(|q| q.pid == pid && q.used > 0));
                        let since = over_since.unwrap_or(now);
                        prop_assert!(now.duration_since(since) >= grace);
                    }
                    MemoryVerdict::Under => prop_assert!(total <= limit),
                    MemoryVerdict::Over { .. } => prop_assert!(total > limit),
                }
            }
        }
    }
}
