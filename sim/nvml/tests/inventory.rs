//! The NVML inventory (`gpuslice_driver::nvml_inventory`, nvml-wrapper and NVML v2's memory
//! query) on the simulated `libnvidia-ml.so.1` books what CUDA can allocate, NVML's total
//! less the memory the driver reserves, exactly as the simulated inventory does from the
//! config. One test: NVML opens the node once, from the environment.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::path::Path;

use gpuslice_driver::simulated::devices_from_config;
use gpuslice_driver::{device_memory, nvml_inventory, simulated_inventory};
use gpuslice_sim_core::testing::{install_sim_libs, SimFixture};

const MIB: u64 = 1 << 20;

#[test]
fn nvml_books_the_total_less_the_reserved_memory_as_the_simulated_inventory_does() {
    let config = gpuslice_config::parse_config(
        "[inventory]\nsource = \"simulated\"\n\
         [[inventory.simulated]]\nmodel = \"NVIDIA H100 80GB HBM3\"\nmemory = \"81559Mi\"\nreserved_memory = \"470Mi\"\ncontext_memory = 0\n\
         [[inventory.simulated]]\nmemory = \"16Gi\"\ncontext_memory = 0\n",
        Path::new("/c.toml"),
    )
    .unwrap();
    let node = SimFixture::with_devices(devices_from_config(&config.inventory.simulated));
    let libs = install_sim_libs(&node.lib_dir()).expect("the simulated driver libraries");
    for (k, v) in node.env() {
        std::env::set_var(k, v);
    }

    let inv = nvml_inventory(libs.nvml.as_os_str(), Path::new("/nonexistent")).unwrap();
    assert!(inv.unreadable.is_empty(), "{:?}", inv.unreadable);
    let nvml = inv.gpus;
    let simulated = simulated_inventory(&config);
    let figures = |inv: &[gpuslice_driver::Gpu]| {
        inv.iter()
            .map(|g| (g.index, g.uuid.clone(), g.model.clone(), g.memory_total))
            .collect::<Vec<_>>()
    };
    assert_eq!(figures(&nvml), figures(&simulated));
    assert_eq!(nvml[0].memory_total, 81089 * MIB, "an H100's CUDA total");
    assert_eq!(nvml[1].memory_total, 16 << 30, "nothing reserved");

    // NVML's own figures: v1 counts the reserved memory as used, v2 names it.
    let lib = nvml_wrapper::Nvml::builder()
        .lib_path(libs.nvml.as_os_str())
        .init()
        .unwrap();
    let dev = lib.device_by_index(0).unwrap();
    let v1 = dev.memory_info().unwrap();
    assert_eq!(
        (v1.total, v1.used, v1.free),
        (81559 * MIB, 470 * MIB, 81089 * MIB)
    );
    // SAFETY: the library `lib` was initialised from, a second handle of the same object.
    let raw = unsafe { nvml_wrapper_sys::bindings::NvmlLib::new(libs.nvml.as_os_str()) }.unwrap();
    let m = device_memory(Some(&raw), &dev).unwrap();
    assert_eq!((m.total, m.reserved, m.used), (81559 * MIB, 470 * MIB, 0));
    assert_eq!(m.bookable(), 81089 * MIB);
    // Without the v2 query (an older driver), v1's total: nothing is known to be reserved.
    let m = device_memory(None, &dev).unwrap();
    assert_eq!((m.total, m.reserved, m.used), (81559 * MIB, 0, 470 * MIB));
}
