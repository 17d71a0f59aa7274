//! The driver's buffer of per-process utilisation samples, as
//! `nvmlDeviceGetProcessUtilization` reads it (NVML API reference): at the end of each
//! [`PERIOD_NS`] sample period the driver records one sample for every process that ran
//! kernels in that period — none for an idle one — stamped with the CPU time (wall clock,
//! microseconds) of the period's end, and keeps about five seconds of them. Its `smUtil` is
//! the process's share of the second before the stamp (the figure the enforcer's controller
//! models, `agent/src/enforce/compute.rs`). A call returns the samples newer than the
//! caller's `lastSeenTimeStamp` (several per process when several periods passed;
//! `lastSeenTimeStamp = 0` returns the whole buffer, old stamps included), and
//! `NVML_ERROR_NOT_FOUND` when there is none.
//!
//! The buffer is not stored: it is derived from the per-process kernel time the shared state
//! keeps per 100 ms bucket (`SharedState::slot_history`), so every process reading NVML sees
//! the same samples with the same stamps.

use std::ffi::c_uint;

use gpuslice_cuda_ffi::nvml::*;

/// Length of one bucket of the simulated driver's kernel-time history (its `BUCKET_NS`).
const BUCKET_NS: u64 = 100_000_000;
/// The sample period: 200 ms, within the 1/6 s to 1 s NVIDIA documents for its products'
/// utilisation sample period (nvidia-smi(1)).
pub const PERIOD_NS: u64 = 2 * BUCKET_NS;
/// What a sample's `smUtil` covers: the second before its stamp.
const SECOND_NS: u64 = 1_000_000_000;

/// The wall clock minus CLOCK_MONOTONIC, in ns, rounded to the millisecond: turns the
/// timeline's instants into the CPU timestamps NVML reports. Read once per `nvmlInit`, so a
/// sample keeps its stamp from one call to the next (two clock reads a call would move it by
/// a few microseconds, and a sample already seen would come back as newer).
pub fn wall_offset_ns() -> i64 {
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0);
    let offset = wall - gpuslice_sim_core::now_ns() as i64;
    (offset + 500_000).div_euclid(1_000_000) * 1_000_000
}

/// The samples the driver holds for process `pid` (as the caller sees it), from its kernel
/// time per bucket: `busy[i]` is the bucket of epoch `first + i` (`ns / BUCKET_NS`), oldest
/// first, every one complete. One sample per period that ends within the history, whose
/// second before it the history covers, and in which the process ran kernels.
pub fn process_samples(
    pid: u32,
    first: u64,
    busy: &[u64],
    wall_offset_ns: i64,
) -> Vec<nvmlProcessUtilizationSample_t> {
    let per_period = PERIOD_NS / BUCKET_NS;
    let per_second = SECOND_NS / BUCKET_NS;
    let sum = |from: u64, to: u64| -> u64 {
        busy[(from - first) as usize..(to - first) as usize]
            .iter()
            .sum()
    };
    let end = first + busy.len() as u64;
    let mut out = Vec::new();
    // `e` is the epoch a period ends at (exclusive).
    let start = (first + per_second).next_multiple_of(per_period);
    for e in (start..=end).step_by(per_period as usize) {
        if sum(e - per_period, e) == 0 {
            continue; // Idle this period: the driver records nothing.
        }
        let second = sum(e - per_second, e);
        // It ran, so its figure is at least 1 % (the driver records non-zero use only).
        let sm = ((second * 100 + SECOND_NS / 2) / SECOND_NS).clamp(1, 100) as u32;
        let stamp_ns = (e * BUCKET_NS) as i64 + wall_offset_ns;
        out.push(nvmlProcessUtilizationSample_t {
            pid,
            timeStamp: (stamp_ns.max(0) / 1_000) as u64,
            smUtil: sm,
            memUtil: 0,
            encUtil: 0,
            decUtil: 0,
        });
    }
    out
}

/// The samples newer than `last_seen` (strictly), in the order the driver recorded them.
pub fn newer_than(
    mut samples: Vec<nvmlProcessUtilizationSample_t>,
    last_seen: u64,
) -> Vec<nvmlProcessUtilizationSample_t> {
    samples.retain(|s| s.timeStamp > last_seen);
    samples.sort_by_key(|s| (s.timeStamp, s.pid));
    samples
}

/// What a call answers when `found` samples are newer than its `lastSeenTimeStamp`, given
/// whether it passed a buffer and how many samples that buffer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// `NVML_ERROR_NOT_FOUND`, count 0: nothing newer.
    NotFound,
    /// `NVML_ERROR_INSUFFICIENT_SIZE` with the count needed: the size query (no buffer), or a
    /// buffer too small.
    Size(c_uint),
    /// `NVML_SUCCESS`: this many samples are written and counted.
    Write(c_uint),
}

pub fn reply(found: usize, buffer: bool, capacity: usize) -> Reply {
    let n = c_uint::try_from(found).unwrap_or(c_uint::MAX);
    if found == 0 {
        Reply::NotFound
    } else if !buffer || capacity < found {
        Reply::Size(n)
    } else {
        Reply::Write(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// 63 complete buckets ending at epoch 1_000 (exclusive), all idle but `busy`.
    fn history(busy: &[(u64, u64)]) -> (u64, Vec<u64>) {
        let first = 1_000 - 63;
        let mut v = vec![0; 63];
        for (e, ns) in busy {
            v[(e - first) as usize] = *ns;
        }
        (first, v)
    }

    #[test]
    fn an_idle_process_has_no_sample_and_a_busy_one_one_per_period() {
        let (first, idle) = history(&[]);
        assert!(process_samples(7, first, &idle, 0).is_empty());
        // Busy half of every bucket for the last two seconds.
        let busy: Vec<(u64, u64)> = (980..1_000).map(|e| (e, 50 * MS)).collect();
        let (first, h) = history(&busy);
        let s = process_samples(7, first, &h, 0);
        assert_eq!(s.len(), 10, "one per 200 ms period: {s:?}");
        assert!(s.iter().all(|s| s.pid == 7));
        let stamps: Vec<u64> = s.iter().map(|s| s.timeStamp).collect();
        assert_eq!(stamps.first(), Some(&(982 * BUCKET_NS / 1_000)));
        assert_eq!(stamps.last(), Some(&(1_000 * BUCKET_NS / 1_000)));
        assert!(stamps.windows(2).all(|w| w[1] - w[0] == PERIOD_NS / 1_000));
        // Each over the second before it: rising while the second fills, then 50 %.
        assert_eq!(s[0].smUtil, 10);
        assert!(s[4..].iter().all(|s| s.smUtil == 50), "{s:?}");
    }

    #[test]
    fn a_process_that_stopped_has_only_its_old_samples() {
        // Ran for 300 ms, 3 s ago.
        let (first, h) = history(&[(967, 100 * MS), (968, 100 * MS), (969, 100 * MS)]);
        let s = process_samples(9, first, &h, 5_000 * MS as i64);
        let stamps: Vec<u64> = s.iter().map(|s| s.timeStamp).collect();
        assert_eq!(
            stamps,
            [968, 970].map(|e| (e * BUCKET_NS + 5_000 * MS) / 1_000),
            "the periods it ran in, stamped at their end on the wall clock"
        );
        assert_eq!((s[0].smUtil, s[1].smUtil), (10, 30));
    }

    #[test]
    fn a_sliver_of_use_is_still_a_sample() {
        let (first, h) = history(&[(999, 1_000)]);
        let s = process_samples(3, first, &h, 0);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].smUtil, 1);
    }

    #[test]
    fn only_samples_newer_than_last_seen_come_back_in_recording_order() {
        let sample = |pid, timeStamp| nvmlProcessUtilizationSample_t {
            pid,
            timeStamp,
            smUtil: 5,
            memUtil: 0,
            encUtil: 0,
            decUtil: 0,
        };
        let all = vec![
            sample(2, 300),
            sample(1, 300),
            sample(1, 100),
            sample(2, 200),
        ];
        let pick = |seen| -> Vec<(u32, u64)> {
            newer_than(all.clone(), seen)
                .iter()
                .map(|s| (s.pid, s.timeStamp))
                .collect()
        };
        assert_eq!(pick(0), [(1, 100), (2, 200), (1, 300), (2, 300)]);
        assert_eq!(pick(200), [(1, 300), (2, 300)], "strictly newer");
        assert!(pick(300).is_empty());
    }

    #[test]
    fn the_reply_follows_the_documented_size_protocol() {
        assert_eq!(reply(0, false, 0), Reply::NotFound, "size query, none");
        assert_eq!(reply(0, true, 8), Reply::NotFound);
        assert_eq!(reply(3, false, 0), Reply::Size(3), "size query");
        assert_eq!(reply(3, true, 2), Reply::Size(3), "buffer too small");
        assert_eq!(reply(3, true, 3), Reply::Write(3));
        assert_eq!(reply(3, true, 10), Reply::Write(3));
    }

    #[test]
    fn the_wall_offset_is_whole_milliseconds_and_stable() {
        let a = wall_offset_ns();
        assert_eq!(a % 1_000_000, 0);
        // Two reads agree, or differ by one millisecond across a rounding edge.
        assert!((wall_offset_ns() - a).abs() <= 1_000_000);
    }
}
