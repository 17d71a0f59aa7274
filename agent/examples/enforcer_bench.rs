//! Benchmark of the enforcer's own work per cycle on a node of 8 GPUs and 100 slices:
//! attribution of every GPU process to its reservation through a fixture `/proc` (pid
//! namespace links, status and cgroup files, as the kernel has them), the memory and compute
//! decisions, and the throttle plan; reported as CPU time per cycle and per second at the
//! default 500 ms interval. The NVML query itself is the driver's cost and is left out
//! (it is measured on a real node with `nvidia-smi`-class tools, not here).
//!
//! `cargo run --release -p gpuslice-agent --example enforcer_bench [cycles]`

#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark: a failed step is fatal

use std::path::Path;
use std::time::{Duration, Instant};

use gpuslice_agent::enforce::cycle::{Enforcer, Roots, Throttles};
use gpuslice_agent::enforce::signal::{SignalError, Signaller};
use gpuslice_agent::gpu::{DeviceReading, GpuProcess};
use gpuslice_config::EnforceConfig;
use gpuslice_registry::{
    Booking, Gpu, Inventory, Owner, ProcessRef, RegistryFile, Reservation, ReservationState,
};

const GPUS: usize = 8;
const SLICES: usize = 100;

struct NoKill;

impl Signaller for NoKill {
    fn start_time(&self, _pid: u32) -> Option<u64> {
        Some(1)
    }
    fn kill(&mut self, pid: u32, _start: u64) -> Result<(), SignalError> {
        panic!("the benchmark's slices are all under their limits; pid {pid} would be killed")
    }
}

fn fake_process(root: &Path, pid: u32, ns: u64, nspid: u32, cgroup: &str) {
    let dir = root.join(pid.to_string());
    std::fs::create_dir_all(dir.join("ns")).unwrap();
    std::os::unix::fs::symlink(format!("pid:[{ns}]"), dir.join("ns/pid")).unwrap();
    std::fs::write(
        dir.join("status"),
        format!("Name:\tpython3\nPid:\t{pid}\nNSpid:\t{pid}\t{nspid}\n"),
    )
    .unwrap();
    std::fs::write(dir.join("cgroup"), cgroup).unwrap();
    // Started at tick 1 (field 22), as every reservation records its init.
    std::fs::write(
        dir.join("stat"),
        format!("{pid} (python3) S 1 {pid} {pid} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 1 0 0\n"),
    )
    .unwrap();
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
    Duration::from_nanos(text.split_whitespace().next().unwrap().parse().unwrap())
}

fn main() {
    let cycles: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    let dir = tempfile::tempdir().unwrap();
    let proc_root = dir.path().join("proc");
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    // The enforcer's own process, in the host namespace.
    fake_process(&proc_root, 1, 4026531836, 1, "0::/\n");
    std::os::unix::fs::symlink("1", proc_root.join("self")).unwrap();
    std::fs::create_dir_all(proc_root.join("sys/kernel/random")).unwrap();
    std::fs::write(proc_root.join("sys/kernel/random/boot_id"), "b\n").unwrap();
    let uuid = |g: usize| format!("GPU-00000000-0000-0000-0000-{g:012}");
    let mut file = RegistryFile {
        inventory: Inventory {
            gpus: (0..GPUS)
                .map(|g| Gpu {
                    index: g as u32,
                    uuid: uuid(g),
                    model: "NVIDIA H200".into(),
                    memory_total: 141 << 30,
                    minor: g as u32,
                    pci_bus_id: None,
                    numa_node: None,
                    pcie_root: None,
                })
                .collect(),
        },
        ..RegistryFile::default()
    };
    let mut gpus: Vec<DeviceReading> = (0..GPUS)
        .map(|g| DeviceReading {
            uuid: uuid(g),
            processes: Some(Vec::new()),
            ..DeviceReading::default()
        })
        .collect();
    for s in 0..SLICES {
        let init = 10_000 + s as u32 * 10;
        let ns = 4026540000 + s as u64;
        let id = format!("ctr{s:04}");
        fake_process(
            &proc_root,
            init,
            ns,
            1,
            &format!("12:freezer:/{id}\n0::/{id}\n"),
        );
        // Two GPU processes per slice in its namespace.
        for k in 1..=2 {
            fake_process(&proc_root, init + k, ns, 1 + k, &format!("0::/{id}\n"));
            gpus[s % GPUS]
                .processes
                .get_or_insert_default()
                .push(GpuProcess {
                    pid: init + k,
                    used: Some(1 << 30),
                    sm: Some(3),
                });
        }
        file.reservations.push(Reservation {
            id: format!("{s:016x}"),
            state: ReservationState::Bound,
            owner: Owner::Container {
                container_id: Some(id),
                process: Some(ProcessRef {
                    pid: init,
                    start_time: 1,
                    boot_id: "b".into(),
                    cgroup: None,
                    unknown: Default::default(),
                }),
                kubernetes: None,
            },
            whole_gpu: false,
            gpus: vec![Booking {
                index: (s % GPUS) as u32,
                uuid: uuid(s % GPUS),
                memory: 4 << 30,
                cores: 10,
                unknown: Default::default(),
            }],
            created_ms: 0,
            deadline_ms: None,
            bound_ms: Some(0),
            reserved_by: None,
            unknown: Default::default(),
        });
    }
    let mut enforcer = Enforcer::new(
        EnforceConfig::default(),
        Roots {
            state_dir: state,
            proc_root,
            cgroup_root: dir.path().join("cgroup"),
        },
        Box::new(NoKill),
        Throttles::default(),
    );
    let start = Instant::now();
    let cpu0 = thread_cpu();
    let t0 = Instant::now();
    for i in 0..cycles {
        let out = enforcer.cycle(&file, &gpus, t0 + Duration::from_millis(500 * u64::from(i)));
        assert!(out.events.is_empty(), "{:?}", out.events);
    }
    let cpu = thread_cpu() - cpu0;
    let per_cycle = cpu / cycles;
    let interval = EnforceConfig::default().interval;
    println!(
        "enforcer cycle, {GPUS} GPUs, {SLICES} slices, {} GPU processes: {:.1} µs CPU per cycle ({cycles} cycles, {:.2} s wall); at {} ms: {:.2} ms CPU per second ({:.3} % of a core)",
        SLICES * 2,
        per_cycle.as_secs_f64() * 1e6,
        start.elapsed().as_secs_f64(),
        interval.as_millis(),
        per_cycle.as_secs_f64() * 1e3 * (1.0 / interval.as_secs_f64()),
        per_cycle.as_secs_f64() / interval.as_secs_f64() * 100.0
    );
}
