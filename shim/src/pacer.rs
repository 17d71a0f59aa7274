//! Compute pacing: holds a container's share of a GPU's time at its `cores` percent.
//!
//! Unlike HAMi-core, which reacts to coarse device-wide NVML utilisation samples, the shim
//! measures the container's *own* kernel time: an event pair (from a per-context pool) is
//! recorded around every paced launch, and when the end event has completed its elapsed
//! time is the device time that launch used. All processes of the container share one
//! pacing clock per device in the usage file, a GCRA ("virtual scheduling") clock: each
//! nanosecond of kernel time advances it by `100 / cores` ns of wall time, and a launch may
//! start only while the clock is at most [`TOLERANCE_NS`] ahead of now, otherwise the
//! launching thread sleeps until it is. Launches are charged an estimate (the recent mean
//! kernel time of this process on that device) when they start and corrected to the
//! measured time when they complete; the work in flight per process and device is bounded
//! ([`MAX_INFLIGHT`], and 1 until a first measurement exists) so the estimate can never run
//! far ahead of the measurements. Over any window the container's kernel time is therefore
//! `cores`% of wall time, give or take one tolerance and the in-flight work.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering::SeqCst;

use gpuslice_cuda_ffi::*;
use gpuslice_slice::usage::{DeviceLock, DeviceRecord, UsageFile, MAX_DEVICES};

use crate::forksafe::ForkSafe;
use crate::real::cu;
use crate::state::{self, Slice};

/// Paced launches per process and device that may be in flight unmeasured.
pub const MAX_INFLIGHT: usize = 32;
/// How far ahead of now the pacing clock may be when a launch starts (burst allowance).
pub const TOLERANCE_NS: u64 = 20_000_000;
/// Longest single sleep, so a thread re-reads the shared clock regularly.
const MAX_SLEEP_NS: u64 = 50_000_000;
/// Furthest ahead of now launches push the shared clock: a charge or correction that would
/// take it further (a kernel longer than 36 s at a 1 % share) stops here, so one launch's
/// debt is paid up to an hour, never cancelled.
pub const MAX_AHEAD_NS: u64 = 3_600 * 1_000_000_000;
/// A clock this far ahead of now cannot come from launches, even written a moment ago by a
/// process whose `now` was later than the reader's: it is damage in the shared file (or a
/// forged record) and is restarted from now instead of being waited for. Between
/// [`MAX_AHEAD_NS`] and this it is brought back to `now + MAX_AHEAD_NS` and waited for.
pub const DAMAGED_AHEAD_NS: u64 = 2 * MAX_AHEAD_NS;

struct Pending {
    start: CUevent,
    end: CUevent,
    ctx: usize,
    idx: usize,
    cores: u8,
    /// Wall time the launch's charge added to the clock (see [`charge`]).
    charged_wall: u64,
}

// SAFETY: event handles are plain driver handles usable from any thread.
unsafe impl Send for Pending {}

#[derive(Default)]
struct Pacer {
    pending: VecDeque<Pending>,
    /// Idle events per context (events belong to the context that created them).
    pools: HashMap<usize, Vec<usize>>,
    /// Running mean kernel time per device index, 0 until measured.
    est_ns: [u64; MAX_DEVICES],
}

static PACER: ForkSafe<Pacer> = ForkSafe::new(Pacer::default);

/// Serialises paced launches of this process's threads (the device lock's owner is the
/// process); held only around two event records and the launch, never while sleeping.
static LAUNCH: ForkSafe<()> = ForkSafe::new(|| ());

/// CLOCK_MONOTONIC in ns: the clock every process of the container shares.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out pointer; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Wall time a share of `cores` percent pays for `kernel_ns` of device time.
pub fn wall_cost(kernel_ns: u64, cores: u8) -> u64 {
    kernel_ns.saturating_mul(100) / u64::from(cores.max(1))
}

/// The furthest a charge or correction at `now` may take the clock.
fn furthest(now: u64) -> u64 {
    now.saturating_add(MAX_AHEAD_NS)
}

/// Charges `cost` ns of wall time to the clock (never from a point in the past, never
/// beyond [`MAX_AHEAD_NS`] ahead of `now`; a clock already beyond is left to [`admit`]).
/// Returns the wall time actually charged, less than `cost` where the bound stopped it: what
/// a later correction or refund of this charge may take back.
pub fn charge(clock: &std::sync::atomic::AtomicU64, now: u64, cost: u64) -> u64 {
    let moved = |tat: u64| tat.max(tat.max(now).saturating_add(cost).min(furthest(now)));
    match clock.fetch_update(SeqCst, SeqCst, |tat| Some(moved(tat))) {
        Ok(tat) | Err(tat) => moved(tat).saturating_sub(tat.max(now)),
    }
}

/// Corrects the clock by `delta` ns (an estimate that was too low or too high); a raise
/// takes it no further than [`MAX_AHEAD_NS`] ahead of now.
pub fn adjust(clock: &std::sync::atomic::AtomicU64, delta: i64) {
    let now = now_ns();
    let _ = clock.fetch_update(SeqCst, SeqCst, |tat| {
        let moved = tat.saturating_add_signed(delta);
        Some(if delta > 0 {
            tat.max(moved.min(furthest(now)))
        } else {
            moved
        })
    });
}

/// How long a launch at `now` must wait for a clock at `tat` (0: go).
pub fn wait_ns(tat: u64, now: u64) -> u64 {
    tat.saturating_sub(now.saturating_add(TOLERANCE_NS))
}

/// Runs `f` with `ctx` current: pushed (and popped again) when the calling thread's current
/// context is another one or none. The pacer's events belong to the context of the stream
/// they are recorded on, which need not be current at a launch.
fn in_context<T>(ctx: CUcontext, current: CUcontext, f: impl FnOnce() -> T) -> Option<T> {
    if ctx == current {
        return Some(f());
    }
    let (push, pop) = (cu::cuCtxPushCurrent_v2()?, cu::cuCtxPopCurrent_v2()?);
    // SAFETY: a live context the driver named for the caller's stream; popped again below.
    if unsafe { push(ctx) } != CUDA_SUCCESS {
        return None;
    }
    let out = f();
    let mut popped: CUcontext = std::ptr::null_mut();
    // SAFETY: pops the context pushed above; valid out pointer.
    unsafe { pop(&mut popped) };
    Some(out)
}

/// Records `ev` (an event of `ctx`) on `stream` (a stream of `ctx`).
fn record(
    ev: CUevent,
    stream: CUstream,
    per_thread: bool,
    ctx: CUcontext,
    current: CUcontext,
) -> bool {
    let f = if per_thread {
        cu::cuEventRecord_ptsz()
    } else {
        cu::cuEventRecord()
    };
    let Some(f) = f else { return false };
    // SAFETY: an event of the stream's context and the caller's stream.
    in_context(ctx, current, || unsafe { f(ev, stream) }) == Some(CUDA_SUCCESS)
}

fn capturing(stream: CUstream, per_thread: bool) -> bool {
    let f = if per_thread {
        cu::cuStreamIsCapturing_ptsz()
    } else {
        cu::cuStreamIsCapturing()
    };
    let Some(f) = f else { return false };
    let mut status = 0;
    // SAFETY: the caller's stream and a valid out pointer.
    let r = unsafe { f(stream, &mut status) };
    r == CUDA_SUCCESS && status != 0
}

/// Settles every completed launch at the front of the queue.
fn drain(p: &mut Pacer, slice: &Slice) {
    let (Some(query), Some(elapsed)) = (cu::cuEventQuery(), cu::cuEventElapsedTime()) else {
        return;
    };
    while let Some(front) = p.pending.front() {
        // SAFETY: an event we created and recorded.
        let q = unsafe { query(front.end) };
        if q == CUDA_ERROR_NOT_READY {
            break;
        }
        let Some(x) = p.pending.pop_front() else {
            break;
        };
        let mut ms = 0f32;
        // SAFETY: both events were recorded on the same stream.
        if q == CUDA_SUCCESS && unsafe { elapsed(&mut ms, x.start, x.end) } == CUDA_SUCCESS {
            let ns = (f64::from(ms.max(0.0)) * 1e6) as u64;
            if let Some(rec) = slice.usage.device(x.idx) {
                rec.busy_ns.fetch_add(ns, SeqCst);
                rec.launches.fetch_add(1, SeqCst);
                let cost = i64::try_from(wall_cost(ns, x.cores)).unwrap_or(i64::MAX);
                let delta = cost.saturating_sub(x.charged_wall as i64);
                adjust(&rec.pace_clock, delta);
            }
            crate::log::debug!(
                "pacer: device {} kernel {ns} ns (charged {} ns of wall time)",
                x.idx,
                x.charged_wall
            );
            let est = &mut p.est_ns[x.idx];
            *est = if *est == 0 {
                ns.max(1)
            } else {
                ((*est * 3 + ns) / 4).max(1)
            };
        }
        p.pools
            .entry(x.ctx)
            .or_default()
            .extend([x.start as usize, x.end as usize]);
    }
}

/// An idle event of context `ctx`, made in `ctx` when the pool has none.
fn take_event(p: &mut Pacer, ctx: CUcontext, current: CUcontext) -> Option<CUevent> {
    if let Some(e) = p.pools.get_mut(&(ctx as usize)).and_then(Vec::pop) {
        return Some(e as CUevent);
    }
    let create = cu::cuEventCreate()?;
    let mut ev: CUevent = std::ptr::null_mut();
    // SAFETY: valid out pointer; the event belongs to `ctx`, current for the call.
    let r = in_context(ctx, current, || unsafe {
        create(&mut ev, CU_EVENT_DEFAULT)
    });
    (r == Some(CUDA_SUCCESS)).then_some(ev)
}

/// Puts events of `ctx` back in its pool.
fn give_back(ctx: CUcontext, events: impl IntoIterator<Item = CUevent>) {
    PACER
        .lock()
        .pools
        .entry(ctx as usize)
        .or_default()
        .extend(events.into_iter().map(|e| e as usize));
}

/// Waits until this process may put more work on device `idx`.
fn bound_inflight(slice: &Slice, idx: usize) {
    loop {
        let wait_on = {
            let mut p = PACER.lock();
            drain(&mut p, slice);
            let limit = if p.est_ns[idx] == 0 { 1 } else { MAX_INFLIGHT };
            let mine = p.pending.iter().filter(|x| x.idx == idx).count();
            if mine < limit {
                return;
            }
            p.pending.iter().find(|x| x.idx == idx).map(|x| x.end)
        };
        match (wait_on, cu::cuEventSynchronize()) {
            // SAFETY: an event we recorded; waiting does not hold our lock.
            (Some(ev), Some(sync)) => unsafe {
                sync(ev);
            },
            _ => return,
        }
    }
}

/// Sleeps until the shared clock admits a launch. A clock more than [`DAMAGED_AHEAD_NS`]
/// ahead of now cannot come from launches and is restarted from now; one more than
/// [`MAX_AHEAD_NS`] ahead is brought back to that bound and waited for (a long kernel's debt
/// is paid, not cancelled).
fn admit(rec: &DeviceRecord) -> u64 {
    loop {
        let now = now_ns();
        let tat = rec.pace_clock.load(SeqCst);
        let ahead = tat.saturating_sub(now);
        if ahead > MAX_AHEAD_NS {
            let to = if ahead > DAMAGED_AHEAD_NS {
                crate::log::warning!(
                    "pacer: the shared pacing clock is {} s ahead; restarting it from now",
                    ahead / 1_000_000_000
                );
                now
            } else {
                furthest(now)
            };
            let _ = rec.pace_clock.compare_exchange(tat, to, SeqCst, SeqCst);
            continue;
        }
        let wait = wait_ns(tat, now);
        if wait == 0 {
            return now;
        }
        crate::log::debug!("pacer: waiting {wait} ns");
        std::thread::sleep(std::time::Duration::from_nanos(wait.min(MAX_SLEEP_NS)));
    }
}

/// One stream of a paced launch: where its kernel runs and how it is measured.
#[derive(Clone, Copy)]
struct Target {
    stream: CUstream,
    ctx: CUcontext,
    idx: usize,
    cores: u8,
    /// When it was admitted, and the kernel time charged then (the estimate).
    now: u64,
    est: u64,
    /// The wall time that charge added to the clock: corrections and a refund are relative
    /// to it, never to the estimate's full cost, which the bound may have cut.
    charged: u64,
    start: Option<CUevent>,
    end: Option<CUevent>,
    started: bool,
    measured: bool,
}

impl Target {
    /// Charges the estimate to the clock of `rec`, this target's device, at its admission.
    fn charge(&mut self, rec: &DeviceRecord) {
        self.charged = charge(&rec.pace_clock, self.now, wall_cost(self.est, self.cores));
    }

    /// A place holder, never paced.
    const NONE: Target = Target {
        stream: std::ptr::null_mut(),
        ctx: std::ptr::null_mut(),
        idx: 0,
        cores: 0,
        now: 0,
        est: 0,
        charged: 0,
        start: None,
        end: None,
        started: false,
        measured: false,
    };
}

/// The paced stream `stream`: its device and context (a kernel launched on a stream runs in
/// the stream's context whatever context is current, or none; a default stream's is the
/// current context) and the calling thread's current context, `None` when that device has
/// no share to hold, the stream is being captured, or no device can be found (a default
/// stream without a current context, a stream the driver does not know: the driver refuses
/// such a launch).
fn target(
    slice: &Slice,
    devices: &state::Devices,
    stream: CUstream,
    per_thread: bool,
) -> Option<(Target, CUcontext)> {
    let (dev, ctx, current) = state::stream_device(stream, per_thread).ok()?;
    let idx = devices.index(dev)?;
    let cores = slice.device(idx).map_or(0, |d| d.cores);
    slice.usage.device(idx)?;
    if cores == 0 || cores >= 100 || capturing(stream, per_thread) {
        return None;
    }
    let t = Target {
        stream,
        ctx,
        idx,
        cores,
        ..Target::NONE
    };
    Some((t, current))
}

/// Runs `launch`, which puts one kernel on each of `streams` (at most [`MAX_DEVICES`], each
/// on its own device, as the driver requires), paced to the share of each stream's device:
/// each is admitted by its device's clock and charged, and its kernel is bracketed by events
/// of the stream's context. Nothing is allocated on the heap.
pub fn paced_launch(
    streams: &[CUstream],
    per_thread: bool,
    launch: impl FnOnce() -> CUresult,
) -> CUresult {
    let Ok((slice, devices)) = state::ready() else {
        return launch();
    };
    if let [stream] = streams {
        // The common case: one stream.
        let Some((t, current)) = target(slice, devices, *stream, per_thread) else {
            return launch();
        };
        return pace(slice, &mut [t], current, per_thread, launch);
    }
    if streams.len() > MAX_DEVICES {
        // More kernels than devices: the driver refuses such a launch.
        return CUDA_ERROR_INVALID_VALUE;
    }
    let mut targets = [Target::NONE; MAX_DEVICES];
    let (mut n, mut current) = (0, std::ptr::null_mut());
    for s in streams {
        if let Some((t, c)) = target(slice, devices, *s, per_thread) {
            targets[n] = t;
            n += 1;
            current = c;
        }
    }
    if n == 0 {
        return launch();
    }
    pace(slice, &mut targets[..n], current, per_thread, launch)
}

/// [`paced_launch`] for its `targets` (not empty); `current` is the calling thread's current
/// context.
fn pace(
    slice: &Slice,
    targets: &mut [Target],
    current: CUcontext,
    per_thread: bool,
    launch: impl FnOnce() -> CUresult,
) -> CUresult {
    if let Err(e) = slice.usage.intact() {
        crate::log::error!("{e}; paced launch refused");
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    // Device locks are taken in device order.
    targets.sort_unstable_by_key(|t| t.idx);
    for t in targets.iter_mut() {
        bound_inflight(slice, t.idx);
        let Some(rec) = slice.usage.device(t.idx) else {
            continue;
        };
        t.now = admit(rec);
        {
            let mut p = PACER.lock();
            t.est = p.est_ns[t.idx];
            t.start = take_event(&mut p, t.ctx, current);
            t.end = take_event(&mut p, t.ctx, current);
        }
        t.charge(rec);
    }
    // Start events, launch and end events go to the devices together: another process of
    // the container launching in between would have its kernel counted as ours.
    let r = {
        let _threads = LAUNCH.lock();
        let mut _processes: [Option<DeviceLock<'_>>; MAX_DEVICES] = Default::default();
        let mut locked = None;
        for (t, lock) in targets.iter().zip(_processes.iter_mut()) {
            if locked != Some(t.idx) {
                *lock = slice.usage.device_lock(t.idx);
                locked = Some(t.idx);
            }
        }
        for t in targets.iter_mut() {
            t.started = t
                .start
                .is_some_and(|s| record(s, t.stream, per_thread, t.ctx, current));
        }
        let r = launch();
        for t in targets.iter_mut() {
            t.measured = t.started
                && r == CUDA_SUCCESS
                && t.end
                    .is_some_and(|e| record(e, t.stream, per_thread, t.ctx, current));
        }
        r
    };
    for t in targets.iter() {
        settle(&slice.usage, *t, r);
    }
    r
}

/// After the launch: a measured kernel waits in the queue for its end event; one the driver
/// refused is refunded; one that ran but cannot be measured keeps its estimate charged.
fn settle(usage: &UsageFile, t: Target, r: CUresult) {
    match (t.start, t.end) {
        (Some(start), Some(end)) if t.measured => {
            PACER.lock().pending.push_back(Pending {
                start,
                end,
                ctx: t.ctx as usize,
                idx: t.idx,
                cores: t.cores,
                charged_wall: t.charged,
            });
        }
        (start, end) => {
            if r != CUDA_SUCCESS {
                // Nothing ran: nothing to pay.
                if let Some(rec) = usage.device(t.idx) {
                    adjust(&rec.pace_clock, -(t.charged as i64));
                }
            } else {
                crate::log::debug!(
                    "pacer: device {}: a launch not measured, charged {} ns",
                    t.idx,
                    t.est
                );
            }
            give_back(t.ctx, start.into_iter().chain(end));
        }
    }
}

/// Forgets events of a destroyed context (they died with it).
pub fn forget_context(ctx: usize) {
    let mut p = PACER.lock();
    p.pools.remove(&ctx);
    p.pending.retain(|x| x.ctx != ctx);
}

/// For the child after `fork`.
pub fn reset_in_child() {
    PACER.reset_in_child();
    LAUNCH.reset_in_child();
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuslice_slice::usage::{create_usage_file, ProcessIdentity, UsageFile};
    use std::path::Path;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn cost_scales_with_the_share() {
        assert_eq!(wall_cost(1_000, 10), 10_000);
        assert_eq!(wall_cost(1_000, 50), 2_000);
        assert_eq!(wall_cost(u64::MAX, 1), u64::MAX, "saturates");
    }

    #[test]
    fn gcra_clock_admits_at_the_share() {
        // Simulate a greedy launcher of 1 ms kernels at 30 %: it may launch only when the
        // clock is within the tolerance; over 1000 launches the clock runs at 1/0.3 ms each.
        let clock = AtomicU64::new(0);
        let mut now = 1_000_000_000u64;
        let start = now;
        for _ in 0..1000 {
            now += wait_ns(clock.load(SeqCst), now);
            charge(&clock, now, wall_cost(1_000_000, 30));
        }
        let busy = 1000 * 1_000_000u64;
        let share = busy as f64 / (now - start + wall_cost(1_000_000, 30)) as f64;
        assert!((share - 0.30).abs() < 0.01, "share {share}");
    }

    #[test]
    fn a_long_kernels_debt_is_waited_for_not_cancelled() {
        // A 40 s kernel at a 1 % share owes 4000 s: beyond the bound, so the clock is
        // brought back to an hour ahead, and a launch still waits.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("usage");
        create_usage_file(&path).unwrap();
        let usage = UsageFile::open(&path, ProcessIdentity::current(Path::new("/proc"))).unwrap();
        let usage: &'static UsageFile = Box::leak(Box::new(usage));
        let rec = usage.device(0).unwrap();
        let debt = wall_cost(40_000_000_000, 1);
        rec.pace_clock.store(now_ns() + debt, SeqCst);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            admit(rec);
            let _ = tx.send(());
        });
        assert!(
            rx.recv_timeout(std::time::Duration::from_millis(200))
                .is_err(),
            "a launch went ahead of a {} s debt",
            debt / 1_000_000_000
        );
        let ahead = rec.pace_clock.load(SeqCst).saturating_sub(now_ns());
        assert!(ahead > MAX_AHEAD_NS - 60_000_000_000, "{ahead} ns ahead");
    }

    #[test]
    fn a_correction_takes_the_clock_at_most_the_bound_ahead() {
        let clock = AtomicU64::new(now_ns());
        adjust(&clock, wall_cost(40_000_000_000, 1) as i64);
        let ahead = clock.load(SeqCst).saturating_sub(now_ns());
        assert!(ahead <= MAX_AHEAD_NS, "{ahead} ns ahead");
        assert!(ahead > MAX_AHEAD_NS - 60_000_000_000, "{ahead} ns ahead");
        let now = now_ns();
        charge(&clock, now, wall_cost(40_000_000_000, 1));
        assert_eq!(
            clock.load(SeqCst),
            now + MAX_AHEAD_NS,
            "a charge stops at the bound"
        );
        // A clock already beyond (damage) is not pulled back by a charge: admit judges it.
        clock.store(u64::MAX - 5, SeqCst);
        charge(&clock, now, 10);
        assert_eq!(clock.load(SeqCst), u64::MAX - 5);
    }

    #[test]
    fn a_refused_launch_takes_back_only_what_its_capped_charge_added() {
        // A 40 s estimate at a 1 % share charged to a clock 10 s short of the bound adds
        // only those 10 s: the refund of the refused launch takes back no more.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("usage");
        create_usage_file(&path).unwrap();
        let usage = UsageFile::open(&path, ProcessIdentity::current(Path::new("/proc"))).unwrap();
        let rec = usage.device(0).unwrap();
        let now = now_ns();
        let before = now + MAX_AHEAD_NS - 10_000_000_000;
        rec.pace_clock.store(before, SeqCst);
        let mut t = Target {
            idx: 0,
            cores: 1,
            now,
            est: 40_000_000_000,
            ..Target::NONE
        };
        t.charge(rec);
        assert_eq!(rec.pace_clock.load(SeqCst), now + MAX_AHEAD_NS);
        settle(&usage, t, CUDA_ERROR_INVALID_VALUE);
        assert_eq!(
            rec.pace_clock.load(SeqCst),
            before,
            "the debt before it is kept"
        );
    }

    #[test]
    fn idle_time_is_not_banked() {
        let clock = AtomicU64::new(0);
        charge(&clock, 1_000, 10);
        assert_eq!(clock.load(SeqCst), 1_010);
        // Much later: the clock restarts from now, no credit for the idle gap (and only the
        // cost counts as charged, not the gap).
        assert_eq!(charge(&clock, 1_000_000, 10), 10);
        assert_eq!(clock.load(SeqCst), 1_000_010);
        adjust(&clock, -20);
        assert_eq!(clock.load(SeqCst), 999_990);
    }
}
