//! The simulated NVML's reports of injected XIDs, in this process: every XID is delivered
//! once, in injection order, to each event set registered for its GPU before it came (cleared
//! or not by then); a later benign XID leaves an earlier one's reset request in effect; row
//! remapping follows XIDs 63 and 64 in effect. One test: NVML opens the node once, from the
//! environment.

use std::time::Duration;

use gpuslice_cuda_ffi::nvml::*;
use gpuslice_sim_core::faults::RECHECK;
use gpuslice_sim_core::testing::SimFixture;

use crate::device::nvmlDeviceGetHandleByIndex_v2;
use crate::health::*;
use crate::system::nvmlInit_v2;

/// Injects `xid` into GPU `gpu` (clears it with `None`) and waits until every process would
/// see it.
fn fault(node: &SimFixture, gpu: usize, xid: Option<u32>) {
    gpuslice_driver::simfault::set_fault(&node.paths.state_dir, &node.devices[gpu].uuid, xid, 1)
        .unwrap();
    std::thread::sleep(RECHECK + Duration::from_millis(50));
}

fn handle(i: u32) -> nvmlDevice_t {
    let mut h: nvmlDevice_t = std::ptr::null_mut();
    // SAFETY: the out-pointer is a local.
    let got = unsafe { nvmlDeviceGetHandleByIndex_v2(i, &mut h) };
    assert_eq!(got, NVML_SUCCESS);
    h
}

/// An event set with the XID events of `devices` registered.
fn set_of(devices: &[nvmlDevice_t]) -> nvmlEventSet_t {
    let mut set: nvmlEventSet_t = std::ptr::null_mut();
    // SAFETY: the out-pointer is a local.
    assert_eq!(unsafe { nvmlEventSetCreate(&mut set) }, NVML_SUCCESS);
    for d in devices {
        // SAFETY: handle and integer arguments.
        let got = unsafe { nvmlDeviceRegisterEvents(*d, nvmlEventTypeXidCriticalError, set) };
        assert_eq!(got, NVML_SUCCESS);
    }
    set
}

/// Every event `set` has now: (device, XID), in delivery order.
fn drain(set: nvmlEventSet_t) -> Vec<(nvmlDevice_t, u64)> {
    let mut out = Vec::new();
    loop {
        let mut e = nvmlEventData_t {
            device: std::ptr::null_mut(),
            eventType: 0,
            eventData: 0,
            gpuInstanceId: 0,
            computeInstanceId: 0,
        };
        // SAFETY: the out-pointer is a local.
        match unsafe { nvmlEventSetWait_v2(set, &mut e, 0) } {
            NVML_SUCCESS => out.push((e.device, e.eventData)),
            NVML_ERROR_TIMEOUT => return out,
            other => panic!("nvmlEventSetWait_v2: {other:?}"),
        }
    }
}

fn recovery_action(d: nvmlDevice_t) -> u64 {
    let mut v = nvmlFieldValue_t {
        fieldId: NVML_FI_DEV_GET_GPU_RECOVERY_ACTION,
        scopeId: 0,
        timestamp: 0,
        latencyUsec: 0,
        valueType: 0,
        nvmlReturn: NVML_SUCCESS,
        value: 0,
    };
    // SAFETY: one field value, a local.
    let got = unsafe { nvmlDeviceGetFieldValues(d, 1, &mut v) };
    assert_eq!(got, NVML_SUCCESS);
    v.value
}

/// (pending, failed) of `nvmlDeviceGetRemappedRows`.
fn remapping(d: nvmlDevice_t) -> (u32, u32) {
    let (mut corr, mut unc, mut pending, mut failed) = (0, 0, 0, 0);
    // SAFETY: four out-pointers to locals.
    let got =
        unsafe { nvmlDeviceGetRemappedRows(d, &mut corr, &mut unc, &mut pending, &mut failed) };
    assert_eq!(got, NVML_SUCCESS);
    (pending, failed)
}

#[test]
fn every_xid_is_delivered_in_order_and_none_hides_another() {
    let node = SimFixture::new(&[("NVIDIA H200", 8 << 30), ("NVIDIA H200", 8 << 30)]);
    for (k, v) in node.env() {
        std::env::set_var(k, v);
    }
    // SAFETY: no arguments.
    assert_eq!(unsafe { nvmlInit_v2() }, NVML_SUCCESS);
    let (g0, g1) = (handle(0), handle(1));
    let early = set_of(&[g0, g1]);
    fault(&node, 1, Some(48));
    // Registered after XID 48: it gets only what comes later.
    let late = set_of(&[g1]);
    fault(&node, 1, Some(13));
    fault(&node, 0, Some(63));

    // XID 13 after 48: the uncorrectable ECC error still asks for a reset.
    assert_eq!(
        recovery_action(g1),
        u64::from(NVML_GPU_RECOVERY_ACTION_GPU_RESET)
    );
    assert_eq!(remapping(g0), (1, 0), "XID 63: a remapping pending");
    assert_eq!(
        drain(early),
        [(g1, 48), (g1, 13), (g0, 63)],
        "each XID, in order"
    );
    assert_eq!(drain(late), [(g1, 13)], "each waiter has its own");
    assert!(drain(early).is_empty(), "delivered once");

    // XID 64 beside 63: pending and failed. An XID cleared before the wait still arrives.
    fault(&node, 0, Some(64));
    assert_eq!(remapping(g0), (1, 1));
    fault(&node, 1, Some(94));
    fault(&node, 1, None);
    assert_eq!(
        recovery_action(g1),
        u64::from(NVML_GPU_RECOVERY_ACTION_NONE),
        "the reset ends 48, 13 and 94"
    );
    assert_eq!(drain(early), [(g0, 64), (g1, 94)]);
    assert_eq!(drain(late), [(g1, 94)]);
    fault(&node, 0, None);
    assert_eq!(remapping(g0), (0, 0), "the reset applied the remapping");
    assert_eq!(
        recovery_action(g0),
        u64::from(NVML_GPU_RECOVERY_ACTION_NONE)
    );
    for set in [early, late] {
        // SAFETY: a set this test created, freed once.
        assert_eq!(unsafe { nvmlEventSetFree(set) }, NVML_SUCCESS);
    }
}
