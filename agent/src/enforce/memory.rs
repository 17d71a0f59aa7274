//! The memory decision, as a pure function of the driver's per-process figures: a slice
//! whose processes together hold more than its limit on a GPU for longer than `grace` is
//! brought back at or under its limit in that one action, and a slice that goes over again
//! within [`REPEAT_WINDOW`] of an action is acted on at once and escalated. Nothing here
//! reads the system, so the properties that matter (a slice under its limit is never acted
//! on; an action always leaves the slice at or under its limit) are tested over random
//! figures. A process this enforcer killed that the driver still lists is left out of its
//! slice for [`DYING`], so the kill is neither repeated nor taken for a new crossing. With
//! `memory = "report"` nothing is done to the slice, so nothing ends its time over the limit:
//! it is acted on (reported) once per episode, and never as a repeat.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use gpuslice_config::MemoryAction;

/// After an action, how long a slice that goes over its limit again counts as the same
/// offence: it is then acted on without a new grace, and escalated (every process of its
/// containers is stopped; see `cycle`). A process that keeps starting new holders past the
/// shim otherwise holds memory over the slice for a grace after every kill.
pub const REPEAT_WINDOW: Duration = Duration::from_secs(60);

/// How long a process this enforcer killed is left out of its slice's total while the driver
/// still lists it. A real driver keeps listing a SIGKILLed process, with the memory it held,
/// while its contexts are torn down, which for a large holder often takes longer than one
/// `enforce.interval` (500 ms by default): counted then, the slice would look over again
/// within [`REPEAT_WINDOW`], so its containers would be stopped and the process killed (and
/// counted) again for a kill that worked. Bounded, so that a process still listed after it
/// (one that does not die: its kill did not land, or it is stuck in the kernel) counts again.
pub const DYING: Duration = Duration::from_secs(5);

/// One process's memory on one GPU, as the driver reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcMemory {
    /// Host pid.
    pub pid: u32,
    /// Bytes it holds.
    pub used: u64,
    /// Its start time as read when it was attributed (`None`: unreadable): with the pid, what
    /// tells a killed process from a new one that took its pid over.
    pub start: Option<u64>,
}

/// What the judge decided for one slice on one GPU this reading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemoryVerdict {
    /// At or under the limit.
    Under,
    /// Over the limit since `since`: within grace, or (with `report`) an episode already
    /// reported.
    Over { since: Instant, total: u64 },
    /// Over for longer than grace, or over again within [`REPEAT_WINDOW`] of the last kill
    /// action (`repeat`): act on `procs`, in order — the fewest processes whose end brings the
    /// slice's `total` at or under its limit: first the one whose growth crossed the limit
    /// (the allocation that broke it), then the largest holders (each ends the most memory
    /// for the least work lost).
    Act {
        procs: Vec<ProcMemory>,
        total: u64,
        over_for: Duration,
        repeat: bool,
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
    /// When the last action was decided.
    acted: Option<Instant>,
    /// (pid, start time) of the processes killed for this slice, and when: left out of the
    /// slice while the driver still lists them, for at most [`DYING`].
    dying: HashMap<(u32, u64), Instant>,
    /// With `memory = "report"`: an action ends nothing, so it opens no repeat window and
    /// the episode it reported goes on.
    report_only: bool,
    /// With `report`: this episode over the limit was reported; reset once the slice is at
    /// or under its limit, so it is not reported again every reading until then.
    reported: bool,
}

impl MemoryTrack {
    /// The state of a slice that has not been judged yet, under `action`.
    pub fn new(action: MemoryAction) -> MemoryTrack {
        MemoryTrack {
            report_only: action == MemoryAction::Report,
            ..MemoryTrack::default()
        }
    }

    /// Records that process `pid` with start time `start` was killed at `now`: while the
    /// driver lists it within [`DYING`] of then, it is not the slice's any more.
    pub fn killed(&mut self, pid: u32, start: u64, now: Instant) {
        self.dying.insert((pid, start), now);
    }

    /// Judges one reading of the slice's processes against `limit`; a process killed within
    /// [`DYING`] (same pid and start time) is left out of it.
    pub fn judge(
        &mut self,
        listed: &[ProcMemory],
        limit: u64,
        now: Instant,
        grace: Duration,
    ) -> MemoryVerdict {
        let is_listed = |(pid, start): &(u32, u64)| {
            listed
                .iter()
                .any(|p| p.pid == *pid && p.start == Some(*start))
        };
        // A killed process no longer listed is gone for good; one listed past DYING counts.
        self.dying
            .retain(|k, at| is_listed(k) && now.saturating_duration_since(*at) <= DYING);
        let procs: Vec<ProcMemory> = listed
            .iter()
            .copied()
            .filter(|p| {
                !p.start
                    .is_some_and(|s| self.dying.contains_key(&(p.pid, s)))
            })
            .collect();
        let procs = procs.as_slice();
        let total = procs.iter().fold(0u64, |a, p| a.saturating_add(p.used));
        let verdict = if total <= limit {
            self.over_since = None;
            self.crosser = None;
            self.reported = false;
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
            let repeat = self
                .acted
                .is_some_and(|t| now.saturating_duration_since(t) <= REPEAT_WINDOW);
            if self.reported {
                // Reported already, and nothing was done that could have ended it.
                MemoryVerdict::Over { since, total }
            } else if over_for >= grace || repeat {
                let chosen = self.to_end(procs, total, limit);
                if self.report_only {
                    self.reported = true;
                } else {
                    self.over_since = None;
                    self.crosser = None;
                    self.acted = Some(now);
                }
                MemoryVerdict::Act {
                    procs: chosen,
                    total,
                    over_for,
                    repeat,
                }
            } else {
                MemoryVerdict::Over { since, total }
            }
        };
        self.last = procs.iter().map(|p| (p.pid, p.used)).collect();
        verdict
    }

    /// The processes to end so that what is left of `total` is at or under `limit`: the
    /// crosser, then the largest holders (ties: the higher pid, the newer process).
    fn to_end(&self, procs: &[ProcMemory], total: u64, limit: u64) -> Vec<ProcMemory> {
        let mut order: Vec<ProcMemory> = procs.iter().copied().filter(|p| p.used > 0).collect();
        order.sort_by(|a, b| {
            let first = |p: &ProcMemory| Some(p.pid) == self.crosser;
            first(b)
                .cmp(&first(a))
                .then(b.used.cmp(&a.used))
                .then(b.pid.cmp(&a.pid))
        });
        let mut left = total;
        let mut chosen = Vec::new();
        for p in order {
            if left <= limit {
                break;
            }
            left = left.saturating_sub(p.used);
            chosen.push(p);
        }
        chosen
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
        ProcMemory {
            pid,
            used,
            start: Some(u64::from(pid)),
        }
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
                procs: vec![p(2, 3 * GIB)],
                total: 6 * GIB,
                over_for: Duration::from_secs(2),
                repeat: false,
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
            MemoryVerdict::Act { procs, .. } if procs == vec![p(9, 5)]
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
        assert!(
            matches!(&v, MemoryVerdict::Act { procs, .. } if procs == &vec![p(7, 10 * GIB)]),
            "{v:?}"
        );
    }

    #[test]
    fn one_action_brings_the_slice_back_under_and_a_repeat_is_acted_on_at_once() {
        let t0 = Instant::now();
        let grace = Duration::from_secs(2);
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut m = MemoryTrack::default();
        // Five 1 GiB holders on a 2 GiB slice, the fifth the last to come.
        let five: Vec<ProcMemory> = (1..=5).map(|i| p(i, GIB)).collect();
        m.judge(&five[..2], 2 * GIB, t0, grace);
        m.judge(&five[..4], 2 * GIB, ms(500), grace);
        m.judge(&five, 2 * GIB, ms(1000), grace);
        let v = m.judge(&five, 2 * GIB, ms(2500), grace);
        let MemoryVerdict::Act { procs, repeat, .. } = v else {
            panic!("{v:?}")
        };
        assert!(!repeat);
        // The crosser (4, the newest of the two that took it over) first, then the largest
        // (the newest on a tie): three go, two stay.
        let pids: Vec<u32> = procs.iter().map(|q| q.pid).collect();
        assert_eq!(pids, vec![4, 5, 3]);
        // A new holder takes the slice over again within the window: acted on without grace.
        let v = m.judge(&[p(1, GIB), p(2, GIB), p(6, GIB)], 2 * GIB, ms(3000), grace);
        assert!(
            matches!(&v, MemoryVerdict::Act { procs, repeat: true, .. } if procs == &vec![p(6, GIB)]),
            "{v:?}"
        );
        // Past the window, the grace applies again.
        let late = ms(3000) + REPEAT_WINDOW + Duration::from_secs(1);
        let v = m.judge(&[p(1, GIB), p(2, GIB), p(7, GIB)], 2 * GIB, late, grace);
        assert!(matches!(v, MemoryVerdict::Over { .. }), "{v:?}");
    }

    /// A killed process the driver keeps listing while its contexts are torn down is left
    /// out of the slice for [`DYING`]: not acted on again, and no repeat. The slice going
    /// over without it, a new process on its pid, or it still listed past [`DYING`] are.
    #[test]
    fn a_killed_process_still_listed_is_left_out_until_dying_ends() {
        let t0 = Instant::now();
        let grace = Duration::from_secs(2);
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let act = |m: &mut MemoryTrack, procs: &[ProcMemory], at: Instant| match m.judge(
            procs,
            4 * GIB,
            at,
            grace,
        ) {
            MemoryVerdict::Act { procs, repeat, .. } => Some((procs, repeat)),
            _ => None,
        };
        let two = [p(1, 3 * GIB), p(2, 3 * GIB)];
        let mut m = MemoryTrack::default();
        assert_eq!(act(&mut m, &two, t0), None);
        let (ended, repeat) = act(&mut m, &two, ms(2000)).expect("acted after grace");
        assert!(!repeat);
        assert_eq!(ended.len(), 1, "{ended:?}");
        let victim = ended[0];
        let other = two.iter().copied().find(|q| q.pid != victim.pid).unwrap();
        m.killed(victim.pid, victim.start.unwrap(), ms(2000));
        for at in [2500, 3000, 4500, 7000] {
            assert_eq!(
                m.judge(&two, 4 * GIB, ms(at), grace),
                MemoryVerdict::Under,
                "at {at} ms"
            );
        }
        // Over without it: acted on at once (a repeat), and it is not in the list.
        let grown = [
            victim,
            ProcMemory {
                used: 5 * GIB,
                ..other
            },
        ];
        let (ended, repeat) = act(&mut m, &grown, ms(7000)).expect("over without it");
        assert!(repeat);
        assert_eq!(ended, vec![grown[1]]);
        // Its pid taken over by a new process: that one counts.
        let mut m = MemoryTrack::default();
        act(&mut m, &two, t0);
        act(&mut m, &two, ms(2000));
        m.killed(victim.pid, victim.start.unwrap(), ms(2000));
        let reused = ProcMemory {
            start: Some(99),
            ..victim
        };
        let (ended, repeat) = act(&mut m, &[other, reused], ms(2500)).expect("a new process");
        assert!(repeat);
        assert_eq!(ended, vec![reused]);
        // Still listed past DYING: it counts again, as a repeat.
        let mut m = MemoryTrack::default();
        act(&mut m, &two, t0);
        act(&mut m, &two, ms(2000));
        m.killed(victim.pid, victim.start.unwrap(), ms(2000));
        assert_eq!(act(&mut m, &two, ms(2500)), None);
        let late = ms(2000) + DYING + Duration::from_millis(500);
        let (ended, repeat) = act(&mut m, &two, late).expect("listed past DYING");
        assert!(repeat);
        assert_eq!(ended.len(), 1);
    }

    proptest! {
        /// Over random sequences of per-process figures and limits, an action is only ever
        /// taken on a reading whose total is over the limit, against processes of that
        /// reading, after the slice has been over for the whole grace or again within the
        /// repeat window of an action; and the processes left hold at most the limit.
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
            let mut acted: Option<Instant> = None;
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
                    MemoryVerdict::Act { procs: ended, repeat, .. } => {
                        prop_assert!(total > limit, "acted at {total} <= {limit}");
                        for e in &ended {
                            prop_assert!(procs.iter().any(|q| q == e && q.used > 0));
                        }
                        let freed: u64 = ended.iter().map(|q| q.used).sum();
                        prop_assert!(total - freed <= limit, "left {} > {limit}", total - freed);
                        let since = over_since.unwrap_or(now);
                        let again = acted.is_some_and(|t| now.duration_since(t) <= REPEAT_WINDOW);
                        prop_assert_eq!(repeat, again);
                        prop_assert!(now.duration_since(since) >= grace || again);
                        acted = Some(now);
                        // The ended processes leave the next reading, as killed ones do.
                        over_since = None;
                    }
                    MemoryVerdict::Under => prop_assert!(total <= limit),
                    MemoryVerdict::Over { .. } => prop_assert!(total > limit),
                }
            }
        }

        /// With `report`, over random figures: a slice is acted on (reported) only once it
        /// has been over its limit for the whole grace, never as a repeat, and once per
        /// episode over the limit; an episode over for the grace is always reported.
        #[test]
        fn report_only_reports_each_episode_once(
            limit in 0u64..64,
            grace_ms in 0u64..3000,
            steps in proptest::collection::vec(
                (proptest::collection::vec((0u32..6, 0u64..40), 0..6), 1u64..1500),
                1..40,
            ),
        ) {
            let grace = Duration::from_millis(grace_ms);
            let mut m = MemoryTrack::new(MemoryAction::Report);
            let mut now = Instant::now();
            let mut over_since: Option<Instant> = None;
            let mut reported = false;
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
                    reported = false;
                }
                let over_for = over_since.map(|s| now.duration_since(s));
                match m.judge(&procs, limit, now, grace) {
                    MemoryVerdict::Act { repeat, .. } => {
                        prop_assert!(!repeat);
                        prop_assert!(!reported, "reported twice in one episode");
                        prop_assert!(over_for.is_some_and(|o| o >= grace), "{over_for:?}");
                        reported = true;
                    }
                    MemoryVerdict::Under => prop_assert!(total <= limit),
                    MemoryVerdict::Over { .. } => {
                        prop_assert!(total > limit);
                        prop_assert!(reported || over_for.is_some_and(|o| o < grace));
                    }
                }
            }
        }
    }
}
