//! The wider simulated NVML surface through `nvml-wrapper`, as monitoring tools call it:
//! per-process SM utilisation samples charged by the driver to the launching process (none for
//! an idle one; those newer than the last one read), the
//! unversioned process list, temperature, power and clocks following the device's load.
//! One test per binary: it sets the process environment NVML reads.

use crate::common;
use common::*;

use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;

#[test]
fn per_process_utilisation_and_monitoring_figures_come_from_the_driver() {
    let node = node(2, 8 * GIB);
    for (k, v) in node.env() {
        std::env::set_var(k, v);
    }
    let lib = node.lib_dir().join("libnvidia-ml.so.1");
    let nvml = Nvml::builder()
        .lib_path(lib.as_os_str())
        .init()
        .expect("nvml init");
    let dev0 = nvml.device_by_index(0).unwrap();
    let dev1 = nvml.device_by_index(1).unwrap();
    let idle_temp = dev0.temperature(TemperatureSensor::Gpu).unwrap();
    let idle_power = dev0.power_usage().unwrap();
    // No process ran a kernel: no sample, which the driver answers with NOT_FOUND.
    assert!(matches!(
        dev0.process_utilization_stats(None),
        Err(NvmlError::NotFound)
    ));

    // A burner on GPU 0 and a holder (context, no kernels) on GPU 1.
    let mut burner = spawn(
        &node,
        &[
            "burn",
            "--seconds",
            "4",
            "--kernel-us",
            "2000",
            "--sync-every",
            "25",
        ],
    );
    let mut holder = spawn(
        &node,
        &[
            "--device", "1", "alloc", "--chunk", "1Gi", "--max", "1Gi", "--hold", "30",
        ],
    );
    first_line(&mut holder);
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let samples = dev0.process_utilization_stats(None).unwrap();
    let last = samples.iter().map(|s| s.timestamp).max().unwrap_or(0);
    std::thread::sleep(std::time::Duration::from_millis(500));
    let since = dev0.process_utilization_stats(last).unwrap();
    let busy_temp = dev0.temperature(TemperatureSensor::Gpu).unwrap();
    let busy_power = dev0.power_usage().unwrap();
    let held = dev1.process_utilization_stats(None);
    burner.wait().unwrap();

    // The whole buffer (lastSeen 0): one sample per 200 ms period the burner ran, oldest
    // first, each its share of the second before it.
    assert!(samples.len() >= 5, "{samples:?}");
    assert!(samples.iter().all(|s| s.pid == burner.id()), "{samples:?}");
    assert!(samples.windows(2).all(|w| w[0].timestamp < w[1].timestamp));
    let latest = samples.last().map_or(0, |s| s.sm_util);
    assert!(latest >= 80, "burner's SM share {samples:?}");
    // Since the last one read: only the periods that ended since (2 or 3 in 500 ms, more
    // when the host is slow to wake the test).
    assert!(
        !since.is_empty() && since.len() < samples.len(),
        "{since:?}"
    );
    assert!(since
        .iter()
        .all(|s| s.timestamp > last && s.pid == burner.id()));
    // A holder that runs no kernel has no sample.
    assert!(matches!(held, Err(NvmlError::NotFound)), "{held:?}");
    assert!(busy_temp > idle_temp, "{idle_temp} -> {busy_temp}");
    assert!(busy_power > idle_power, "{idle_power} -> {busy_power}");
    assert!(busy_power <= dev0.enforced_power_limit().unwrap());
    assert!(dev0.clock_info(Clock::SM).unwrap() > 0);
    assert!(dev0.max_clock_info(Clock::Memory).unwrap() > 0);
    assert_eq!(dev0.cuda_compute_capability().unwrap().major, 9);
    assert!(!dev0.serial().unwrap().is_empty());
    // The graphics list of a compute-only GPU is empty, not an error.
    assert!(dev1.running_graphics_processes().unwrap().is_empty());
    holder.kill().unwrap();
    holder.wait().unwrap();
}
