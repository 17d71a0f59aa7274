//! The NVML inventory of a node where one GPU cannot be read (fallen off the bus at boot:
//! every NVML call on it fails with `NVML_ERROR_GPU_IS_LOST`): the other GPUs are listed
//! with their own index and minor number, and the lost one is named as unreadable with
//! NVML's error. One test: NVML opens the node once, from the environment.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::path::Path;

use gpuslice_driver::nvml_inventory;
use gpuslice_driver::simfault::{set_fault, XID_FALLEN_OFF_BUS};
use gpuslice_sim_core::testing::{device, install_sim_libs, SimFixture};

#[test]
fn a_lost_gpu_is_named_unreadable_and_the_others_are_listed() {
    // Minor numbers unlike the indexes: each GPU's own must be kept.
    let devices = (0..3)
        .map(|i| {
            let mut d = device(i, "NVIDIA H200", 16 << 30);
            d.minor = 4 + i;
            d
        })
        .collect::<Vec<_>>();
    let node = SimFixture::with_devices(devices);
    let libs = install_sim_libs(&node.lib_dir()).expect("the simulated driver libraries");
    for (k, v) in node.env() {
        std::env::set_var(k, v);
    }
    let lost = node.devices[1].uuid.clone();
    set_fault(&node.paths.state_dir, &lost, Some(XID_FALLEN_OFF_BUS), 1).unwrap();

    let inv = nvml_inventory(libs.nvml.as_os_str(), Path::new("/nonexistent"))
        .expect("the GPUs that can be read");
    let listed = inv
        .gpus
        .iter()
        .map(|g| (g.index, g.uuid.as_str(), g.minor))
        .collect::<Vec<_>>();
    assert_eq!(
        listed,
        [
            (0, node.devices[0].uuid.as_str(), 4),
            (2, node.devices[2].uuid.as_str(), 6)
        ]
    );
    assert_eq!(inv.unreadable.len(), 1, "{:?}", inv.unreadable);
    assert_eq!(inv.unreadable[0].index, 1);
    let line = inv.unreadable[0].to_string();
    assert!(
        line.starts_with("GPU 1: NVML cannot read it")
            && line.contains("fell off the bus")
            && line.contains("left out of the inventory")
            && !line.contains('\n'),
        "{line}"
    );
}
