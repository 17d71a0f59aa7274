//! What the simulated NVML reports of injected XIDs (`gpuslice sim fault`), as the real
//! driver on Linux reports them: every XID as an XID critical event
//! (`nvmlEventTypeXidCriticalError`, the XID as `eventData`), in injection order, delivered
//! once to each event set registered for the GPU before it was injected (each set keeps its
//! own place in the GPU's XID history, so one waiter's events are not another's), whether or
//! not a reset cleared it since; the recovery the GPU needs
//! (`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`) while any XID in effect needs one (a later benign
//! XID does not end it); a row remapping pending while an XID 63 is in effect, a remapping
//! failure while an XID 64 is (`nvmlDeviceGetRemappedRows`), until the clear (the reset that
//! applies it). Event sets are ids dressed as pointers, like device handles.

use std::collections::BTreeMap;
use std::ffi::{c_int, c_uint, c_ulonglong};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gpuslice_cuda_ffi::nvml::*;
use gpuslice_sim_core::faults::resume_at;
use gpuslice_sim_core::Effect;

use crate::device::with_device;
use crate::ffi::{get, guard, put, NvResult};
use crate::state::{nvml, raw_handle};

const SET_BASE: usize = 0x6e65_0000_0000;
/// How often a waiting set looks at the fault list.
const POLL: Duration = Duration::from_millis(50);

/// One device registered in a set: its event types and how many of the GPU's XIDs
/// (`SimNode::xid_count`) the set has seen — those injected before the registration, then
/// each one delivered — so each is delivered once, in order.
#[derive(Debug, Clone, Copy)]
struct Registration {
    types: c_ulonglong,
    seen: usize,
}

static SETS: Mutex<BTreeMap<usize, BTreeMap<usize, Registration>>> = Mutex::new(BTreeMap::new());
static NEXT_SET: AtomicUsize = AtomicUsize::new(1);

fn sets() -> std::sync::MutexGuard<'static, BTreeMap<usize, BTreeMap<usize, Registration>>> {
    SETS.lock().unwrap_or_else(|p| p.into_inner())
}

fn set_id(set: nvmlEventSet_t) -> NvResult<usize> {
    let v = set as usize;
    if v <= SET_BASE || !(v - SET_BASE).is_multiple_of(16) {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    Ok((v - SET_BASE) / 16)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> nvmlReturn_t {
    guard(|| {
        nvml()?;
        let id = NEXT_SET.fetch_add(1, Ordering::Relaxed);
        put(set, (SET_BASE + id * 16) as nvmlEventSet_t)?;
        sets().insert(id, BTreeMap::new());
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> nvmlReturn_t {
    guard(|| {
        sets()
            .remove(&set_id(set)?)
            .map(|_| ())
            .ok_or(NVML_ERROR_INVALID_ARGUMENT)
    })
}

/// The event types the simulated GPUs report: XIDs.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: nvmlDevice_t,
    types: *mut c_ulonglong,
) -> nvmlReturn_t {
    guard(|| with_device(device, |_, _| put(types, nvmlEventTypeXidCriticalError)))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device: nvmlDevice_t,
    types: c_ulonglong,
    set: nvmlEventSet_t,
) -> nvmlReturn_t {
    guard(|| {
        let n = nvml()?;
        n.device(device)?;
        let host = n.host_of(device)?;
        if types & !nvmlEventTypeXidCriticalError != 0 {
            return Err(NVML_ERROR_NOT_SUPPORTED);
        }
        let seen = n.node.xid_count(host);
        let id = set_id(set)?;
        let mut all = sets();
        let regs = all.get_mut(&id).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        regs.insert(host, Registration { types, seen });
        Ok(())
    })
}

/// The next XID of the node's log not yet delivered to set `id` on a GPU registered in it,
/// marked delivered.
fn next_event(id: usize) -> NvResult<Option<nvmlEventData_t>> {
    let n = nvml()?;
    let log = n.node.faults();
    let mut all = sets();
    let regs = all.get_mut(&id).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
    let uuid_of = |host: usize| n.node.devices().get(host).map(|d| d.uuid.as_str());
    for (host, reg) in regs.iter_mut() {
        let count = uuid_of(*host).map_or(0, |u| log.iter().filter(|f| f.is_on(u)).count());
        reg.seen = resume_at(count, reg.seen);
    }
    // The place of each XID in its GPU's history, walking the log in injection order.
    let mut nth: BTreeMap<usize, usize> = BTreeMap::new();
    for f in &log {
        let Some((host, reg)) = regs
            .iter_mut()
            .find(|(h, _)| uuid_of(**h).is_some_and(|u| f.is_on(u)))
        else {
            continue;
        };
        let place = nth.entry(*host).or_insert(0);
        let this = *place;
        *place += 1;
        if this < reg.seen || reg.types & nvmlEventTypeXidCriticalError == 0 {
            continue;
        }
        reg.seen = this + 1;
        return Ok(Some(nvmlEventData_t {
            device: raw_handle(*host),
            eventType: nvmlEventTypeXidCriticalError,
            eventData: c_ulonglong::from(f.xid),
            gpuInstanceId: u32::MAX,
            computeInstanceId: u32::MAX,
        }));
    }
    Ok(None)
}

/// Waits up to `timeout_ms` for an event of set `set`; `NVML_ERROR_TIMEOUT` without one.
fn wait(set: nvmlEventSet_t, timeout_ms: c_uint) -> NvResult<nvmlEventData_t> {
    let id = set_id(set)?;
    let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
    loop {
        if let Some(e) = next_event(id)? {
            return Ok(e);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(NVML_ERROR_TIMEOUT);
        }
        std::thread::sleep(left.min(POLL));
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> nvmlReturn_t {
    guard(|| {
        if data.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        put(data, wait(set, timeout_ms)?)
    })
}

/// The recovery action NVML reports for host GPU `host`: a reset while any XID in effect
/// needs one.
fn recovery_action(host: usize) -> NvResult<c_uint> {
    let n = nvml()?;
    Ok(match n.node.effect(host) {
        Some(Effect::Ecc | Effect::NeedsReset | Effect::Lost) => NVML_GPU_RECOVERY_ACTION_GPU_RESET,
        Some(Effect::EventOnly) | None => NVML_GPU_RECOVERY_ACTION_NONE,
    })
}

/// The row-remapping recording XID: a remapping is pending, applied at the next reset.
const XID_ROW_REMAP_PENDING: u32 = 63;
/// The row-remapping failure XID.
const XID_ROW_REMAP_FAILURE: u32 = 64;

/// Rows remapped: one uncorrectable row, pending while an XID 63 is in effect, failed while
/// an XID 64 is (both when both are); none otherwise (a clear is the reset that applies a
/// remapping).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRemappedRows(
    device: nvmlDevice_t,
    corr_rows: *mut c_uint,
    unc_rows: *mut c_uint,
    is_pending: *mut c_uint,
    failure_occurred: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let n = nvml()?;
        n.device(device)?;
        let host = n.host_of(device)?;
        let in_effect = n.node.faults_in_effect(host);
        let pending = in_effect.iter().any(|f| f.xid == XID_ROW_REMAP_PENDING);
        let failed = in_effect.iter().any(|f| f.xid == XID_ROW_REMAP_FAILURE);
        put(corr_rows, 0)?;
        put(unc_rows, c_uint::from(pending || failed))?;
        put(is_pending, c_uint::from(pending))?;
        put(failure_occurred, c_uint::from(failed))
    })
}

/// Field values: `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`; any other field answers
/// `NVML_ERROR_NOT_SUPPORTED` in its own `nvmlReturn`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: nvmlDevice_t,
    count: c_int,
    values: *mut nvmlFieldValue_t,
) -> nvmlReturn_t {
    guard(|| {
        let count = usize::try_from(count).map_err(|_| NVML_ERROR_INVALID_ARGUMENT)?;
        let n = nvml()?;
        n.device(device)?;
        let host = n.host_of(device)?;
        for i in 0..count {
            let at = values.wrapping_add(i);
            let mut v = get(at.cast_const())?;
            v.timestamp = 0;
            v.latencyUsec = 0;
            if v.fieldId == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION {
                v.valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
                v.value = u64::from(recovery_action(host)?);
                v.nvmlReturn = NVML_SUCCESS;
            } else {
                v.nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            }
            put(at, v)?;
        }
        Ok(())
    })
}
