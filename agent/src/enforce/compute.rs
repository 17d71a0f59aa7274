//! The compute decision: a slice's SM share is the sum of its processes' per-process SM
//! utilisation as the driver reports it (each over the driver's last second). Above the
//! slice's share by more than [`TOLERANCE`] on average over the window, it is reported; with
//! `compute = "throttle"` a duty-cycle controller picks the fraction of each freezer period
//! the container may run so that what it achieves comes back to its share.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Points (as a fraction) a slice may run above its share before it counts as over: the
/// shim's own pacing is accurate to about this.
pub const TOLERANCE: f64 = 0.05;
/// The least a throttled container may run per period (it must stay killable and make
/// progress).
pub const MIN_RUN: f64 = 0.02;
/// How far back the driver's per-process figure looks.
const DRIVER_WINDOW: Duration = Duration::from_secs(1);
/// Bounds of the controller's correction of its estimate. The low bound must let the run
/// fraction reach [`MIN_RUN`]: a frozen container's kernels already queued on the GPU run
/// on (10–20 ms a period for a pipelined launcher), and a freeze under CPU load lands late,
/// so a container achieves more than the fraction it was let run, and only a correction
/// well under 1 makes up for it (with a floor of 0.5 the slice stayed 5 points over its
/// share).
const GAIN_MIN: f64 = 0.05;
const GAIN_MAX: f64 = 1.5;
/// Integral step: the correction moves by this part of the relative error each reading,
/// and by at most half of itself (the driver's figure lags a second behind).
const INTEGRAL: f64 = 0.5;

/// What the judge found this reading.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ComputeVerdict {
    /// Average share over the window so far, 0–1.
    pub average: f64,
    /// True the first reading the average is over share + tolerance over a full window
    /// (once per episode: it goes false again only after the average is back under).
    pub newly_over: bool,
    /// The fraction of each freezer period the container may run (1 = not throttled).
    pub run_fraction: f64,
}

/// Per slice and GPU: the readings of the window and the controller's state.
#[derive(Debug, Clone)]
pub struct ComputeTrack {
    readings: VecDeque<(Instant, f64)>,
    /// Run fractions applied, for the driver's trailing second.
    applied: VecDeque<(Instant, f64)>,
    run: f64,
    /// Integral correction of the controller (multiplies the estimate).
    gain: f64,
    over: bool,
    started: Option<Instant>,
}

impl Default for ComputeTrack {
    fn default() -> Self {
        ComputeTrack {
            readings: VecDeque::new(),
            applied: VecDeque::new(),
            run: 1.0,
            gain: 1.0,
            over: false,
            started: None,
        }
    }
}

impl ComputeTrack {
    /// Feeds one reading: `used` is the slice's SM share over the driver's last second,
    /// `share` its limit (0–1); `throttle` turns the controller on.
    pub fn judge(
        &mut self,
        used: f64,
        share: f64,
        now: Instant,
        window: Duration,
        throttle: bool,
    ) -> ComputeVerdict {
        let used = used.clamp(0.0, 1.0);
        self.started.get_or_insert(now);
        self.readings.push_back((now, used));
        while self
            .readings
            .front()
            .is_some_and(|(t, _)| now.saturating_duration_since(*t) > window)
        {
            self.readings.pop_front();
        }
        let average = self.average();
        let full = self
            .started
            .is_some_and(|s| now.saturating_duration_since(s) >= window);
        let over = full && average > share + TOLERANCE;
        let newly_over = over && !self.over;
        if over {
            self.over = true;
        } else if average <= share + TOLERANCE {
            self.over = false;
        }
        if throttle {
            self.control(used, share, now);
        } else {
            self.run = 1.0;
        }
        ComputeVerdict {
            average,
            newly_over,
            run_fraction: self.run,
        }
    }

    /// The average share over the window's readings so far, 0–1 (0 before any).
    pub fn average(&self) -> f64 {
        self.readings.iter().map(|(_, u)| u).sum::<f64>() / self.readings.len().max(1) as f64
    }

    /// The fraction of each freezer period the container may run now (1 = not throttled),
    /// as the last reading left it.
    pub fn run_fraction(&self) -> f64 {
        self.run
    }

    /// Duty-cycle control: the demand is what the slice achieved divided by the fraction
    /// it was allowed to run over the driver's last second; the next fraction lets that
    /// demand reach the share, corrected by an integral term for what the estimate misses.
    fn control(&mut self, used: f64, share: f64, now: Instant) {
        while self
            .applied
            .front()
            .is_some_and(|(t, _)| now.saturating_duration_since(*t) > DRIVER_WINDOW)
        {
            self.applied.pop_front();
        }
        let allowed = if self.applied.is_empty() {
            self.run
        } else {
            self.applied.iter().map(|(_, r)| r).sum::<f64>() / self.applied.len() as f64
        };
        let demand = (used / allowed.max(MIN_RUN)).min(1.0);
        if demand <= share {
            // The slice does not want more than its share: let it run.
            self.run = 1.0;
            self.gain = 1.0;
        } else {
            if allowed < 0.999 {
                // Integral on the relative error, bounded so a bad estimate cannot run away.
                let step = (1.0 + INTEGRAL * (share - used) / share.max(0.01)).clamp(0.5, 1.5);
                self.gain = (self.gain * step).clamp(GAIN_MIN, GAIN_MAX);
            }
            self.run = (self.gain * share / demand).clamp(MIN_RUN, 1.0);
        }
        self.applied.push_back((now, self.run));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process that wants `demand` of the GPU, run at fraction `run`, reported by a
    /// driver averaging over the last second (two readings at 500 ms).
    fn simulate(demand: f64, share: f64, seconds: u64) -> (f64, Vec<ComputeVerdict>) {
        let (tail, _, v) = simulate_queued(demand, share, 0.0, seconds);
        (tail, v)
    }

    /// Like [`simulate`], with `queued` of each freezer period run on while frozen (work
    /// the process queued on the GPU before the freeze, and a freeze that lands late).
    /// Returns the mean share after the first two seconds, the mean over the ten seconds
    /// after the throttle engaged, and the verdicts.
    fn simulate_queued(
        demand: f64,
        share: f64,
        queued: f64,
        seconds: u64,
    ) -> (f64, f64, Vec<ComputeVerdict>) {
        let mut t = ComputeTrack::default();
        let t0 = Instant::now();
        let mut achieved: VecDeque<f64> = VecDeque::new();
        let mut run = 1.0;
        let mut verdicts = Vec::new();
        let mut tail = Vec::new();
        let mut engaged: Option<u64> = None;
        let mut after = Vec::new();
        let share_at = |run: f64| {
            if run < 1.0 {
                (demand * run + queued).min(1.0)
            } else {
                demand
            }
        };
        for step in 0..seconds * 2 {
            achieved.push_back(share_at(run));
            if engaged.is_some_and(|e| step > e && step <= e + 20) {
                after.push(share_at(run));
            }
            if achieved.len() > 2 {
                achieved.pop_front();
            }
            let used = achieved.iter().sum::<f64>() / achieved.len() as f64;
            let v = t.judge(
                used,
                share,
                t0 + Duration::from_millis(500 * step),
                Duration::from_secs(5),
                true,
            );
            run = v.run_fraction;
            if run < 1.0 {
                engaged.get_or_insert(step);
            }
            verdicts.push(v);
            if step >= 4 {
                tail.push(share_at(run));
            }
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
        (mean(&tail), mean(&after), verdicts)
    }

    #[test]
    fn work_that_runs_on_while_frozen_is_made_up_for() {
        // Up to a fifth of each period run on while frozen: held to the share over the ten
        // seconds after the throttle engaged, and at it after that.
        for queued in [0.0, 0.1, 0.2, 0.25] {
            let (tail, after, v) = simulate_queued(0.98, 0.30, queued, 30);
            assert!(after <= 0.35, "queued {queued}: {after} over 10 s");
            assert!(
                (tail - 0.30).abs() < 0.03,
                "queued {queued}: held at {tail}"
            );
            assert!(v.iter().all(|v| v.run_fraction >= MIN_RUN));
        }
    }

    #[test]
    fn a_greedy_slice_is_brought_back_to_its_share() {
        let (held, v) = simulate(0.98, 0.30, 20);
        assert!((held - 0.30).abs() < 0.03, "held at {held}");
        assert!(v
            .iter()
            .all(|v| v.run_fraction >= MIN_RUN && v.run_fraction <= 1.0));
    }

    #[test]
    fn a_slice_within_its_share_is_never_throttled_or_reported() {
        let (_, v) = simulate(0.25, 0.30, 20);
        assert!(
            v.iter().all(|v| v.run_fraction == 1.0 && !v.newly_over),
            "{v:?}"
        );
    }

    #[test]
    fn over_is_reported_once_per_episode_after_a_full_window() {
        let mut t = ComputeTrack::default();
        let t0 = Instant::now();
        let w = Duration::from_secs(2);
        let mut reports = 0;
        for step in 0..20u64 {
            let used = if step < 12 { 0.9 } else { 0.1 };
            let v = t.judge(used, 0.3, t0 + Duration::from_millis(500 * step), w, false);
            assert_eq!(v.run_fraction, 1.0, "report mode never throttles");
            if v.newly_over {
                assert!(step >= 4, "not before a full window");
                reports += 1;
            }
        }
        assert_eq!(reports, 1);
    }
}
