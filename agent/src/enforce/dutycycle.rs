//! The freezer duty cycle: every period, each throttled cgroup is thawed at the start and
//! frozen again once its run fraction of the period has passed. A cgroup that leaves the
//! plan is thawed once, so nothing the enforcer froze stays frozen while it runs; the
//! cgroups in the plan are recorded in the state dir whenever they change, for the next
//! run to thaw (see `freezer`), beside those an earlier run left that could not be thawed.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::enforce::cycle::Throttles;
use crate::enforce::freezer::{record_held, Freezer, FreezerFile};

/// Length of one duty cycle.
pub const PERIOD: Duration = Duration::from_millis(100);

/// Runs duty cycles for the plan in `throttles` until the process exits, recording the
/// cgroups held in `state_dir` and, in every record, `kept` (what the start could not thaw:
/// the next start tries again); failures are logged once per cgroup (or record) until it
/// works again.
pub fn run(
    throttles: Throttles,
    mut freezer: Box<dyn Freezer>,
    period: Duration,
    state_dir: &Path,
    kept: &[FreezerFile],
) {
    let mut active: BTreeMap<FreezerFile, f64> = BTreeMap::new();
    let mut failing: std::collections::HashSet<FreezerFile> = Default::default();
    let mut record_failing = false;
    loop {
        let plan = throttles.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let changed = !plan.keys().eq(active.keys());
        let mut record = |mut held: Vec<FreezerFile>| {
            for f in kept {
                if !held.contains(f) {
                    held.push(f.clone());
                }
            }
            match record_held(state_dir, &held) {
                Ok(()) => record_failing = false,
                Err(e) => {
                    if !record_failing {
                        eprintln!("gpuslice serve: enforcer: {e}");
                    }
                    record_failing = true;
                }
            }
        };
        if changed {
            // A new cgroup is recorded before its first freeze, one leaving the plan stays
            // recorded until it is thawed.
            record(
                active
                    .keys()
                    .chain(plan.keys())
                    .cloned()
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .collect(),
            );
        }
        let start = Instant::now();
        let mut set = |f: &FreezerFile, frozen: bool| match freezer.set(f, frozen) {
            Ok(()) => {
                failing.remove(f);
            }
            Err(e) => {
                if failing.insert(f.clone()) {
                    eprintln!("gpuslice serve: enforcer: {e}");
                }
            }
        };
        for f in active.keys().filter(|f| !plan.contains_key(*f)) {
            set(f, false);
        }
        if changed && active.keys().any(|f| !plan.contains_key(f)) {
            record(plan.keys().cloned().collect());
        }
        active = plan;
        if active.is_empty() {
            std::thread::sleep(period);
            continue;
        }
        for f in active.keys() {
            set(f, false);
        }
        let mut order: Vec<(&FreezerFile, f64)> = active.iter().map(|(f, r)| (f, *r)).collect();
        order.sort_by(|a, b| a.1.total_cmp(&b.1));
        for (f, run) in order {
            if run >= 1.0 {
                continue;
            }
            let at = start + period.mul_f64(run.clamp(0.0, 1.0));
            if let Some(wait) = at.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            set(f, true);
        }
        if let Some(wait) = (start + period).checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::enforce::freezer::{FreezeError, HELD_FILE};

    /// A freezer that freezes and thaws nothing.
    struct Idle;

    impl Freezer for Idle {
        fn set(&mut self, _: &FreezerFile, _: bool) -> Result<(), FreezeError> {
            Ok(())
        }
    }

    #[test]
    fn what_the_start_could_not_thaw_stays_in_every_record() {
        let state = tempfile::tempdir().unwrap();
        let kept = vec![FreezerFile::V2("/sys/fs/cgroup/old/cgroup.freeze".into())];
        let throttled = FreezerFile::V2("/sys/fs/cgroup/new/cgroup.freeze".into());
        let throttles = Throttles::default();
        let (t, dir, k) = (throttles.clone(), state.path().to_path_buf(), kept.clone());
        std::thread::spawn(move || run(t, Box::new(Idle), Duration::from_millis(5), &dir, &k));
        let recorded = || -> Option<Vec<FreezerFile>> {
            let mut files: Vec<FreezerFile> =
                serde_json::from_slice(&std::fs::read(state.path().join(HELD_FILE)).ok()?).ok()?;
            files.sort();
            Some(files)
        };
        let wait_for = |want: Vec<FreezerFile>| {
            let deadline = Instant::now() + Duration::from_secs(10);
            while recorded().as_ref() != Some(&want) {
                assert!(Instant::now() < deadline, "recorded {:?}", recorded());
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        throttles.lock().unwrap().insert(throttled.clone(), 0.5);
        let mut both = vec![kept[0].clone(), throttled];
        both.sort();
        wait_for(both);
        // The throttle ends: the record keeps what the start could not thaw.
        throttles.lock().unwrap().clear();
        wait_for(kept);
    }
}
