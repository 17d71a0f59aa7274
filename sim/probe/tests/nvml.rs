//! The simulated NVML through the `nvml-wrapper` crate (what gpuslice's inventory uses):
//! count, names, UUIDs, minors, PCI ids, memory, compute processes with host pids and memory,
//! utilisation. One test per binary: it sets the process environment NVML reads.

use crate::common;
use common::*;

use nvml_wrapper::Nvml;

#[test]
fn nvml_wrapper_reads_the_simulated_node() {
    let node = node(2, 8 * GIB);
    for (k, v) in node.env() {
        std::env::set_var(k, v);
    }
    let lib = node.lib_dir().join("libnvidia-ml.so.1");
    let nvml = Nvml::builder()
        .lib_path(lib.as_os_str())
        .init()
        .expect("nvml init");
    assert_eq!(nvml.sys_cuda_driver_version().unwrap(), 12040);
    assert!(!nvml.sys_driver_version().unwrap().is_empty());
    assert_eq!(nvml.device_count().unwrap(), 2);
    for (i, d) in node.devices.iter().enumerate() {
        let dev = nvml.device_by_index(i as u32).unwrap();
        assert_eq!(dev.name().unwrap(), d.model);
        assert_eq!(dev.uuid().unwrap(), d.uuid);
        assert_eq!(dev.minor_number().unwrap(), d.minor);
        assert_eq!(dev.index().unwrap(), i as u32);
        assert_eq!(dev.pci_info().unwrap().bus_id, d.pci_bus_id);
        let m = dev.memory_info().unwrap();
        assert_eq!((m.total, m.used, m.free), (d.memory, 0, d.memory));
        assert!(dev.running_compute_processes().unwrap().is_empty());
        assert_eq!(
            nvml.device_by_uuid(d.uuid.as_str())
                .unwrap()
                .index()
                .unwrap(),
            i as u32
        );
    }

    // A process holding memory on GPU 1 shows with its pid and memory, node-wide.
    let mut holder = spawn(
        &node,
        &[
            "--device", "1", "alloc", "--chunk", "1Gi", "--max", "3Gi", "--hold", "30",
        ],
    );
    first_line(&mut holder);
    let dev1 = nvml.device_by_index(1).unwrap();
    let procs = dev1.running_compute_processes().unwrap();
    assert_eq!(procs.len(), 1, "{procs:?}");
    assert_eq!(procs[0].pid, holder.id());
    assert_eq!(
        procs[0].used_gpu_memory,
        nvml_wrapper::enums::device::UsedGpuMemory::Used(3 * GIB)
    );
    assert_eq!(dev1.memory_info().unwrap().used, 3 * GIB);
    assert!(nvml
        .device_by_index(0)
        .unwrap()
        .running_compute_processes()
        .unwrap()
        .is_empty());
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert!(
        dev1.running_compute_processes().unwrap().is_empty(),
        "a dead process is gone"
    );
    assert_eq!(dev1.memory_info().unwrap().used, 0);

    // Utilisation follows the device timeline.
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
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let busy = nvml
        .device_by_index(0)
        .unwrap()
        .utilization_rates()
        .unwrap()
        .gpu;
    let idle = dev1.utilization_rates().unwrap().gpu;
    burner.wait().unwrap();
    assert!(busy >= 80, "GPU 0 utilisation {busy} while burning");
    assert_eq!(idle, 0);
}
