//! The achieved compute share of a slice: the growth of its cumulative busy time (measured
//! kernel time, from the usage file) over the wall time between two samples. The previous
//! sample is kept in memory; a window shorter than [`MIN_WINDOW`] keeps the last figure
//! rather than dividing two tiny, noisy deltas, so several scrapers polling at once see the
//! same value. The first sample of a key reports nothing.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// Shortest wall-time window a share is computed over.
pub const MIN_WINDOW: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy)]
struct Baseline {
    at: Instant,
    busy_ns: u64,
    last: Option<f64>,
}

/// Per-key baselines (a key is one device of one slice).
#[derive(Debug)]
pub struct ShareTracker<K> {
    baselines: HashMap<K, Baseline>,
    min_window: Duration,
}

impl<K: Eq + Hash + Clone> Default for ShareTracker<K> {
    fn default() -> Self {
        ShareTracker::new(MIN_WINDOW)
    }
}

impl<K: Eq + Hash + Clone> ShareTracker<K> {
    pub fn new(min_window: Duration) -> ShareTracker<K> {
        ShareTracker {
            baselines: HashMap::new(),
            min_window,
        }
    }

    /// Records `busy_ns` seen at `now` and returns the share (busy time / wall time) over
    /// the window since the baseline, or the last share while the window is too short.
    /// `None` on the first sample and after the counter went backwards (a new usage file).
    pub fn update(&mut self, key: &K, now: Instant, busy_ns: u64) -> Option<f64> {
        let Some(b) = self.baselines.get_mut(key) else {
            self.baselines.insert(
                key.clone(),
                Baseline {
                    at: now,
                    busy_ns,
                    last: None,
                },
            );
            return None;
        };
        if busy_ns < b.busy_ns {
            *b = Baseline {
                at: now,
                busy_ns,
                last: None,
            };
            return None;
        }
        let window = now.saturating_duration_since(b.at);
        if window < self.min_window {
            return b.last;
        }
        let share = (busy_ns - b.busy_ns) as f64 / window.as_nanos() as f64;
        *b = Baseline {
            at: now,
            busy_ns,
            last: Some(share),
        };
        Some(share)
    }

    /// Forgets every key `keep` rejects (slices that are gone).
    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.baselines.retain(|k, _| keep(k));
    }

    pub fn len(&self) -> usize {
        self.baselines.len()
    }

    pub fn is_empty(&self) -> bool {
        self.baselines.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn share_is_busy_growth_over_wall_time() {
        let mut t = ShareTracker::new(Duration::from_secs(1));
        let t0 = Instant::now();
        let k = ("r".to_string(), 0usize);
        assert_eq!(t.update(&k, t0, 5_000 * MS), None, "first sample");
        let s = t
            .update(&k, t0 + Duration::from_secs(2), 5_600 * MS)
            .unwrap();
        assert!((s - 0.3).abs() < 1e-9, "{s}");
        // A short window repeats the last figure and keeps the baseline.
        let again = t.update(&k, t0 + Duration::from_millis(2_100), 9_999 * MS);
        assert_eq!(again, Some(s));
        let s = t
            .update(&k, t0 + Duration::from_secs(4), 5_600 * MS + 1_000 * MS)
            .unwrap();
        assert!((s - 0.5).abs() < 1e-9, "{s}");
    }

    #[test]
    fn counter_going_back_restarts_and_keys_are_pruned() {
        let mut t = ShareTracker::new(Duration::from_secs(1));
        let t0 = Instant::now();
        t.update(&1u32, t0, 10 * MS);
        t.update(&2u32, t0, 0);
        assert_eq!(t.update(&1u32, t0 + Duration::from_secs(2), 5 * MS), None);
        let s = t
            .update(&1u32, t0 + Duration::from_secs(3), 5 * MS + 250 * MS)
            .unwrap();
        assert!((s - 0.25).abs() < 1e-9, "{s}");
        t.retain(|k| *k == 2);
        assert_eq!(t.len(), 1);
        assert_eq!(t.update(&1u32, t0 + Duration::from_secs(9), 0), None);
    }
}
