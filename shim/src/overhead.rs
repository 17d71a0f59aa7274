//! A context's own device memory, measured from the driver's figures around its creation:
//! on a real GPU every CUDA context costs device memory that no allocation returns and
//! NVML's per-process figure (what the host enforcer judges) includes. The slice is charged
//! what the driver added, not a guess: NVML's figure for this process when NVML can name it
//! (same pid namespace), else the device's used memory, before and after the creation.
//!
//! Whether NVML names this process is learnt at its first context on a GPU: its pid must be
//! absent from the list before and present after. A pid NVML lists before this process has
//! any context there is another namespace's process with the same number (a container under
//! a real driver, which reports host pids), so that GPU's device figures are used instead.

use std::collections::HashMap;
use std::ffi::{c_uint, CString};
use std::sync::OnceLock;

use gpuslice_cuda_ffi::nvml::*;

use crate::forksafe::ForkSafe;
use crate::log::warning;
use crate::real::nvml as real;

/// Per GPU UUID, whether NVML's process list names this process (learnt at its first
/// context there). Held for the whole measurement: it also serialises context creations of
/// this process, so one creation's reading never takes in another thread's context.
static BY_PROCESS: ForkSafe<HashMap<String, bool>> = ForkSafe::new(HashMap::new);

/// Whether the real NVML is initialised (once per process; never shut down here, so the
/// program's own `nvmlShutdown` cannot close it under us, NVML being reference counted).
fn nvml_ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        let ok = real::nvmlInit_v2()
            // SAFETY: nvmlInit_v2 takes no arguments.
            .map(|f| unsafe { f() } == NVML_SUCCESS)
            .unwrap_or(false);
        if !ok {
            warning!("NVML is not available: CUDA contexts' own memory cannot be measured and is not charged");
        }
        ok
    })
}

/// The driver's figures at one moment: this process's bytes on the device (`None` when
/// NVML does not list it, e.g. before its first context there), and the device's used bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reading {
    pub process: Option<u64>,
    pub device: Option<u64>,
}

fn handle(uuid: &str) -> Option<nvmlDevice_t> {
    let by_uuid = real::nvmlDeviceGetHandleByUUID()?;
    let c = CString::new(uuid).ok()?;
    let mut dev: nvmlDevice_t = std::ptr::null_mut();
    // SAFETY: a NUL-terminated string and a valid out-pointer.
    (unsafe { by_uuid(c.as_ptr(), &mut dev) } == NVML_SUCCESS).then_some(dev)
}

/// This process's entry in the driver's compute process list (pids as NVML reports them to
/// this process: its own pid when they share a pid namespace).
fn own_bytes(dev: nvmlDevice_t) -> Option<Option<u64>> {
    let me = std::process::id();
    let mut cap: c_uint = 64;
    for _ in 0..3 {
        let mut buf = vec![nvmlProcessInfo_t::default(); cap as usize];
        let mut count = cap;
        let r = if let Some(f) = real::nvmlDeviceGetComputeRunningProcesses_v3() {
            // SAFETY: a buffer of `count` entries of the v2/v3 layout.
            unsafe { f(dev, &mut count, buf.as_mut_ptr()) }
        } else if let Some(f) = real::nvmlDeviceGetComputeRunningProcesses_v2() {
            // SAFETY: as above; `_v2` takes the same layout.
            unsafe { f(dev, &mut count, buf.as_mut_ptr()) }
        } else {
            return None;
        };
        match r {
            NVML_SUCCESS => {
                return Some(
                    buf.iter()
                        .take(count as usize)
                        .find(|p| p.pid == me)
                        .map(|p| p.usedGpuMemory),
                )
            }
            NVML_ERROR_INSUFFICIENT_SIZE => cap = count.max(cap) + 16,
            _ => return None,
        }
    }
    None
}

fn device_used(dev: nvmlDevice_t) -> Option<u64> {
    let f = real::nvmlDeviceGetMemoryInfo()?;
    let mut m = nvmlMemory_t::default();
    // SAFETY: a handle from NVML and a valid out-pointer.
    (unsafe { f(dev, &mut m) } == NVML_SUCCESS).then_some(m.used)
}

/// The driver's figures for the GPU with `uuid` now.
pub fn read(uuid: &str) -> Reading {
    if !nvml_ready() {
        return Reading::default();
    }
    let Some(dev) = handle(uuid) else {
        return Reading::default();
    };
    Reading {
        process: own_bytes(dev).flatten(),
        device: device_used(dev),
    }
}

/// Whether the first creation's readings show NVML naming this process: not listed before
/// (no context yet), listed after.
pub fn names_this_process(before: Reading, after: Reading) -> bool {
    before.process.is_none() && after.process.is_some()
}

/// What the driver added between two readings: the process's own growth when NVML names
/// the process (from 0 when it was not listed before: its first context), else the device's
/// growth; 0 when nothing could be read.
pub fn grown(before: Reading, after: Reading, by_process: bool) -> u64 {
    match (by_process, before.process, after.process) {
        (true, b, Some(a)) => a.saturating_sub(b.unwrap_or(0)),
        _ => match (before.device, after.device) {
            (Some(b), Some(a)) => a.saturating_sub(b),
            _ => 0,
        },
    }
}

/// Runs `create` (a context creation on the GPU with `uuid`) and measures what the driver
/// charged for it: `(create's result, bytes)`.
pub fn measure<T>(uuid: &str, create: impl FnOnce() -> T) -> (T, u64) {
    let mut by_process = BY_PROCESS.lock();
    let before = read(uuid);
    let out = create();
    let after = read(uuid);
    let trusted = match by_process.get(uuid) {
        Some(t) => *t,
        // Nothing listed either time (the creation failed, or NVML lists nothing): decide
        // at the next creation.
        None if before.process.is_none() && after.process.is_none() => false,
        None => {
            let t = names_this_process(before, after);
            by_process.insert(uuid.to_string(), t);
            t
        }
    };
    (out, grown(before, after, trusted))
}

/// Runs `f` while no context creation of this process can run (they wait for the lock that
/// serialises [`measure`]): for a call that may destroy a context, so that no creation gets
/// its handle before what died with it is forgotten.
pub fn exclusive<T>(f: impl FnOnce() -> T) -> T {
    let _creations = BY_PROCESS.lock();
    f()
}

/// For the child after `fork`: its pid is new.
pub fn reset_in_child() {
    BY_PROCESS.reset_in_child();
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    fn r(process: Option<u64>, device: Option<u64>) -> Reading {
        Reading { process, device }
    }

    #[test]
    fn the_process_figure_wins_over_the_device() {
        // First context: not listed before, listed after.
        let (b, a) = (r(None, Some(0)), r(Some(500 * MIB), Some(900 * MIB)));
        assert!(names_this_process(b, a));
        assert_eq!(grown(b, a, true), 500 * MIB);
        // A second context of a listed process.
        assert_eq!(
            grown(
                r(Some(700 * MIB), Some(0)),
                r(Some(1200 * MIB), Some(0)),
                true
            ),
            500 * MIB
        );
    }

    #[test]
    fn another_namespaces_process_with_this_pid_is_not_trusted() {
        // Listed before this process had any context: someone else's pid.
        let b = r(Some(3 * GIB), Some(5 * GIB));
        let a = r(Some(3 * GIB), Some(5 * GIB + 300 * MIB));
        assert!(!names_this_process(b, a));
        assert_eq!(grown(b, a, false), 300 * MIB);
    }

    #[test]
    fn device_growth_when_the_process_is_not_named_and_never_negative() {
        let (b, a) = (r(None, Some(GIB)), r(None, Some(GIB + 300 * MIB)));
        assert_eq!(grown(b, a, false), 300 * MIB);
        assert_eq!(grown(b, a, true), 300 * MIB);
        assert_eq!(grown(r(None, Some(GIB)), r(None, Some(MIB)), false), 0);
        assert_eq!(grown(r(None, None), r(None, Some(GIB)), false), 0);
        assert_eq!(grown(r(Some(GIB), None), r(Some(MIB), None), true), 0);
    }
}
