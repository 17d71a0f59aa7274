//! The exporter's collection: limits, measured memory and achieved share per
//! slice; booked and measured figures per GPU; the registry's health; and acceptance 3 — a
//! corrupted or missing usage file, a vanished container, NVML errors or a corrupt registry
//! never crash it, the affected series are dropped and the error counter rises.

use crate::serve_common;

use std::time::{Duration, Instant};

use gpuslice_agent::gpu::{DeviceReading, GpuProcess, Reading};
use serve_common::{fake_process, find, scrape, uuid, value, FakeMeter, Node, GI};

/// Both GPUs measured, with `procs` on GPU 0.
fn reading(procs: Vec<GpuProcess>) -> Reading {
    Reading {
        devices: (0..2)
            .map(|i| DeviceReading {
                index: i,
                uuid: uuid(i),
                model: "NVIDIA H200".into(),
                memory_total: Some(10 * GI),
                memory_used: Some(if i == 0 { 3 * GI } else { 0 }),
                utilization: Some(if i == 0 { 0.3 } else { 0.0 }),
                processes: Some(if i == 0 { procs.clone() } else { vec![] }),
            })
            .collect(),
        errors: vec![],
    }
}

fn errors(series: &[serve_common::Series], source: &str) -> f64 {
    value(
        series,
        "gpuslice_exporter_errors_total",
        &[("source", source)],
    )
}

#[test]
fn slices_show_limits_measured_memory_share_and_nvml_cross_check() {
    let node = Node::new(2);
    // Slice A: 4 GiB, not throttled, in Kubernetes; one shim process (pid 7 in its
    // namespace, host pid 5007) holds 1 GiB; NVML also sees a process in the container that
    // bypasses the shim (host pid 5008, same namespace) using 256 MiB.
    let a = node.slice(
        4 * GI,
        0,
        0,
        Some(("ctr-a", 4000)),
        Some(("team", "trainer-0", "main")),
    );
    fake_process(node.proc.path(), "4000", 4026532001, 1, "0::/a\n");
    fake_process(node.proc.path(), "5007", 4026532001, 7, "0::/a\n");
    fake_process(node.proc.path(), "5008", 4026532001, 8, "0::/a\n");
    let _held_a = node.hold(&a, 4026532001, 7, GI);
    // Slice B: 2 GiB with a 30 % share; its busy counter moves 0.6 s in 2 s.
    let b = node.slice(2 * GI, 30, 0, Some(("ctr-b", 4100)), None);
    fake_process(node.proc.path(), "4100", 4026532002, 1, "0::/b\n");
    let held_b = node.hold(&b, 4026532002, 1, 512 << 20);
    // A stranger on the GPU (host namespace) is nobody's.
    fake_process(node.proc.path(), "6000", 4026531836, 6000, "0::/user\n");

    let meter = FakeMeter::default();
    *meter.0.lock().unwrap() = reading(vec![
        GpuProcess {
            pid: 5007,
            used: Some(GI + (300 << 20)),
            sm: Some(20),
        },
        GpuProcess {
            pid: 5008,
            used: Some(256 << 20),
            sm: Some(15),
        },
        GpuProcess {
            pid: 6000,
            used: Some(GI),
            sm: Some(50),
        },
    ]);
    let mut c = node.collector(Some(meter));
    let t0 = Instant::now();
    held_b
        .device(0)
        .unwrap()
        .busy_ns
        .fetch_add(5_000_000_000, std::sync::atomic::Ordering::SeqCst);
    let (_, first) = scrape(&mut c, t0);
    assert!(
        find(&first, "gpuslice_slice_compute_used_ratio", &[]).is_empty(),
        "no share before a second sample"
    );
    held_b
        .device(0)
        .unwrap()
        .busy_ns
        .fetch_add(600_000_000, std::sync::atomic::Ordering::SeqCst);
    let (_, s) = scrape(&mut c, t0 + Duration::from_secs(2));

    let ra = [("reservation", a.as_str())];
    let rb = [("reservation", b.as_str())];
    assert_eq!(
        value(&s, "gpuslice_slice_memory_limit_bytes", &ra),
        (4 * GI) as f64
    );
    assert_eq!(
        value(&s, "gpuslice_slice_memory_used_bytes", &ra),
        GI as f64
    );
    assert_eq!(
        value(&s, "gpuslice_slice_nvml_memory_used_bytes", &ra),
        (GI + (300 << 20) + (256 << 20)) as f64,
        "shim process plus the bypassing one, not the stranger"
    );
    let driver_share = value(&s, "gpuslice_slice_nvml_compute_used_ratio", &ra);
    assert!(
        (driver_share - 0.35).abs() < 1e-9,
        "the driver's SM figures of both processes, not the stranger's: {driver_share}"
    );
    let la = &find(&s, "gpuslice_slice_memory_limit_bytes", &ra)[0].labels;
    assert_eq!(la["namespace"], "team");
    assert_eq!(la["pod"], "trainer-0");
    assert_eq!(la["container"], "main");
    assert_eq!(la["container_id"], "ctr-a");
    assert_eq!(la["uuid"], uuid(0));
    assert_eq!(la["index"], "0");
    assert_eq!(la["node"], "node-a");
    assert!(find(&s, "gpuslice_slice_compute_limit_ratio", &ra).is_empty());
    assert!(find(&s, "gpuslice_slice_compute_used_ratio", &ra).is_empty());

    assert_eq!(
        value(&s, "gpuslice_slice_memory_used_bytes", &rb),
        (512 << 20) as f64
    );
    assert_eq!(value(&s, "gpuslice_slice_compute_limit_ratio", &rb), 0.3);
    let share = value(&s, "gpuslice_slice_compute_used_ratio", &rb);
    assert!((share - 0.3).abs() < 1e-9, "{share}");
    assert!((value(&s, "gpuslice_slice_compute_busy_seconds_total", &rb) - 5.6).abs() < 1e-9);
    assert_eq!(value(&s, "gpuslice_slice_nvml_memory_used_bytes", &rb), 0.0);
    assert_eq!(
        value(&s, "gpuslice_slice_nvml_compute_used_ratio", &rb),
        0.0,
        "no process on the GPU: no compute"
    );

    let g0 = [("uuid", uuid(0))];
    let g0: Vec<(&str, &str)> = g0.iter().map(|(k, v)| (*k, v.as_str())).collect();
    assert_eq!(
        value(&s, "gpuslice_gpu_memory_total_bytes", &g0),
        (10 * GI) as f64
    );
    assert_eq!(
        value(&s, "gpuslice_gpu_memory_booked_bytes", &g0),
        (6 * GI) as f64
    );
    assert_eq!(value(&s, "gpuslice_gpu_cores_booked_ratio", &g0), 0.3);
    assert_eq!(value(&s, "gpuslice_gpu_slices", &g0), 2.0);
    assert_eq!(
        value(&s, "gpuslice_gpu_memory_used_bytes", &g0),
        (3 * GI) as f64
    );
    assert_eq!(value(&s, "gpuslice_gpu_utilization_ratio", &g0), 0.3);
    let g = &find(&s, "gpuslice_gpu_memory_total_bytes", &g0)[0].labels;
    assert_eq!(g["model"], "NVIDIA H200");
    assert_eq!(g["index"], "0");

    assert_eq!(
        value(&s, "gpuslice_reservations", &[("state", "bound")]),
        2.0
    );
    assert_eq!(
        value(&s, "gpuslice_reservations", &[("state", "pending")]),
        0.0
    );
    assert_eq!(value(&s, "gpuslice_reserved_total", &[]), 2.0);
    assert_eq!(
        value(&s, "gpuslice_refused_total", &[("reason", "no-fit")]),
        0.0
    );
    for source in ["registry", "usage", "limits", "nvml", "container", "proc"] {
        assert_eq!(errors(&s, source), 0.0, "{source}");
    }
}

#[test]
fn corrupt_or_missing_slice_files_drop_their_series_and_count() {
    let node = Node::new(1);
    let junk = node.slice(GI, 0, 0, Some(("c1", 4001)), None);
    let gone = node.slice(GI, 0, 0, Some(("c2", 4002)), None);
    let short = node.slice(GI, 0, 0, Some(("c3", 4003)), None);
    let nolimits = node.slice(GI, 0, 0, Some(("c4", 4004)), None);
    let fine = node.slice(GI, 0, 0, Some(("c5", 4005)), None);
    let _h = node.hold(&fine, 1, 1, 100);
    std::fs::write(
        node.usage_path(&junk),
        vec![7u8; gpuslice_slice::usage::USAGE_FILE_SIZE as usize],
    )
    .unwrap();
    std::fs::remove_file(node.usage_path(&gone)).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(node.usage_path(&short))
        .unwrap()
        .set_len(10)
        .unwrap();
    std::fs::write(
        node.reg.slice_dir(&nolimits).unwrap().join("limits.json"),
        "{",
    )
    .unwrap();

    let mut c = node.collector(None);
    let (_, s) = scrape(&mut c, Instant::now());
    for id in [&junk, &gone, &short, &nolimits] {
        let r = [("reservation", id.as_str())];
        assert!(
            find(&s, "gpuslice_slice_memory_used_bytes", &r).is_empty(),
            "{id} still has a used series"
        );
        assert_eq!(
            value(&s, "gpuslice_slice_memory_limit_bytes", &r),
            GI as f64,
            "the booking is still known from the registry"
        );
    }
    assert_eq!(
        value(
            &s,
            "gpuslice_slice_memory_used_bytes",
            &[("reservation", fine.as_str())]
        ),
        100.0
    );
    assert_eq!(errors(&s, "usage"), 3.0);
    assert_eq!(errors(&s, "limits"), 1.0);
    // Every scrape that meets them counts them again.
    let (_, s) = scrape(&mut c, Instant::now());
    assert_eq!(errors(&s, "usage"), 6.0);
}

#[test]
fn vanished_container_and_expired_pending_drop_out() {
    let node = Node::new(1);
    let live = node.slice(GI, 10, 0, Some(("alive", 4001)), None);
    let dead = node.slice(2 * GI, 20, 0, Some(("dead", 4002)), None);
    let pending = node.slice(3 * GI, 0, 0, None, None);
    let mut c = node.collector(None);
    let (_, s) = scrape(&mut c, Instant::now());
    assert_eq!(
        value(&s, "gpuslice_reservations", &[("state", "pending")]),
        1.0
    );
    assert_eq!(
        value(&s, "gpuslice_gpu_memory_booked_bytes", &[]),
        (6 * GI) as f64
    );
    assert_eq!(
        find(
            &s,
            "gpuslice_slice_memory_limit_bytes",
            &[("reservation", pending.as_str())]
        )[0]
        .labels["container_id"],
        ""
    );

    node.sys.kill(4002);
    node.sys.advance_ms(61_000);
    let (_, s) = scrape(&mut c, Instant::now());
    for id in [&dead, &pending] {
        assert!(
            find(
                &s,
                "gpuslice_slice_memory_limit_bytes",
                &[("reservation", id.as_str())]
            )
            .is_empty(),
            "{id} still exported"
        );
    }
    assert_eq!(
        value(
            &s,
            "gpuslice_slice_memory_limit_bytes",
            &[("reservation", live.as_str())]
        ),
        GI as f64
    );
    assert_eq!(
        value(&s, "gpuslice_reservations", &[("state", "stale")]),
        2.0
    );
    assert_eq!(
        value(&s, "gpuslice_reservations", &[("state", "bound")]),
        1.0
    );
    assert_eq!(
        value(&s, "gpuslice_gpu_memory_booked_bytes", &[]),
        GI as f64
    );
    assert_eq!(value(&s, "gpuslice_gpu_cores_booked_ratio", &[]), 0.1);
    assert_eq!(
        errors(&s, "container"),
        1.0,
        "a vanished container is an error"
    );
    // A reused pid (another start time) is a vanished container too, seen once the owner's
    // start time is read again.
    node.sys.spawn(4001, 1);
    let (_, s) = scrape(&mut c, Instant::now());
    assert_eq!(
        value(
            &s,
            "gpuslice_slice_memory_limit_bytes",
            &[("reservation", live.as_str())]
        ),
        GI as f64,
        "between rechecks only the pid's existence is probed"
    );
    let later = Instant::now() + gpuslice_agent::liveness::OWNER_RECHECK;
    let (_, s) = scrape(&mut c, later);
    assert!(find(&s, "gpuslice_slice_memory_limit_bytes", &[]).is_empty());
    assert_eq!(errors(&s, "container"), 4.0);
}

#[test]
fn nvml_errors_drop_measured_series_and_count() {
    let node = Node::new(2);
    let id = node.slice(GI, 0, 0, Some(("c", 4001)), None);
    let meter = FakeMeter::default();
    let mut r = reading(vec![GpuProcess {
        pid: 99999,
        used: Some(5),
        sm: None,
    }]);
    r.devices[0].memory_used = None;
    r.devices[0].utilization = None;
    r.devices[1].processes = None;
    r.errors = vec![
        "NVML GPU 0: cannot read memory: Unknown".into(),
        "NVML GPU 0: cannot read utilisation: Unknown".into(),
        "NVML GPU 1: cannot read compute processes: GpuLost".into(),
    ];
    *meter.0.lock().unwrap() = r;
    let mut c = node.collector(Some(meter.clone()));
    let (_, s) = scrape(&mut c, Instant::now());
    let g0 = uuid(0);
    let g1 = uuid(1);
    assert!(find(&s, "gpuslice_gpu_memory_used_bytes", &[("uuid", &g0)]).is_empty());
    assert!(find(&s, "gpuslice_gpu_utilization_ratio", &[("uuid", &g0)]).is_empty());
    assert_eq!(
        value(&s, "gpuslice_gpu_memory_used_bytes", &[("uuid", &g1)]),
        0.0
    );
    assert_eq!(
        value(&s, "gpuslice_gpu_memory_booked_bytes", &[("uuid", &g0)]),
        GI as f64,
        "booked figures do not need NVML"
    );
    assert_eq!(errors(&s, "nvml"), 3.0);
    // The process NVML listed has no /proc entry (it exited): counted, not fatal.
    assert_eq!(errors(&s, "proc"), 1.0);
    assert_eq!(
        value(
            &s,
            "gpuslice_slice_nvml_memory_used_bytes",
            &[("reservation", id.as_str())]
        ),
        0.0
    );

    // NVML gone entirely: every measured series goes, the rest stays.
    *meter.0.lock().unwrap() = Reading {
        devices: vec![],
        errors: vec!["NVML cannot count the GPUs: Uninitialized".into()],
    };
    let (_, s) = scrape(&mut c, Instant::now());
    assert!(find(&s, "gpuslice_gpu_memory_used_bytes", &[]).is_empty());
    assert!(find(&s, "gpuslice_slice_nvml_memory_used_bytes", &[]).is_empty());
    assert_eq!(find(&s, "gpuslice_gpu_memory_total_bytes", &[]).len(), 2);
    assert_eq!(errors(&s, "nvml"), 4.0);
}

#[test]
fn unavailable_nvml_is_retried_and_counted() {
    use gpuslice_agent::gpu::{GpuMeter, MeterError};
    use std::sync::{Arc, Mutex};
    let node = Node::new(1);
    let meter = FakeMeter::default();
    *meter.0.lock().unwrap() = reading(vec![]);
    let tries = Arc::new(Mutex::new(0));
    let t = tries.clone();
    let m = meter.clone();
    let t0 = Instant::now();
    let mut c = node.collector(None).with_reopen(
        Box::new(move || {
            let mut n = t.lock().unwrap();
            *n += 1;
            if *n < 2 {
                Err(MeterError::Init {
                    lib: "libnvidia-ml.so.1".into(),
                    detail: "not loaded".into(),
                })
            } else {
                Ok(Box::new(m.clone()) as Box<dyn GpuMeter>)
            }
        }),
        t0,
    );
    let (_, s) = scrape(&mut c, t0 + Duration::from_secs(1));
    assert_eq!(*tries.lock().unwrap(), 0, "not retried before the interval");
    assert!(find(&s, "gpuslice_gpu_memory_used_bytes", &[]).is_empty());
    let (_, s) = scrape(&mut c, t0 + Duration::from_secs(61));
    assert_eq!(*tries.lock().unwrap(), 1);
    assert_eq!(errors(&s, "nvml"), 1.0);
    assert!(find(&s, "gpuslice_gpu_memory_used_bytes", &[]).is_empty());
    let (_, s) = scrape(&mut c, t0 + Duration::from_secs(122));
    assert_eq!(*tries.lock().unwrap(), 2);
    // The inventory's GPU and the one only NVML knows.
    assert_eq!(find(&s, "gpuslice_gpu_memory_used_bytes", &[]).len(), 2);
    assert_eq!(find(&s, "gpuslice_gpu_memory_booked_bytes", &[]).len(), 1);
}

#[test]
fn corrupt_registry_keeps_measured_gpus_and_counts() {
    let node = Node::new(2);
    node.slice(GI, 0, 0, Some(("c", 4001)), None);
    std::fs::write(node.state.path().join("registry.json"), "{not json").unwrap();
    let meter = FakeMeter::default();
    *meter.0.lock().unwrap() = reading(vec![]);
    let mut c = node.collector(Some(meter));
    let (_, s) = scrape(&mut c, Instant::now());
    assert_eq!(errors(&s, "registry"), 1.0);
    assert!(find(&s, "gpuslice_slice_memory_limit_bytes", &[]).is_empty());
    assert!(find(&s, "gpuslice_gpu_memory_booked_bytes", &[]).is_empty());
    assert!(find(&s, "gpuslice_reservations", &[]).is_empty());
    assert_eq!(find(&s, "gpuslice_gpu_memory_used_bytes", &[]).len(), 2);
    assert_eq!(find(&s, "gpuslice_gpu_memory_total_bytes", &[]).len(), 2);
}

#[test]
fn whole_gpu_is_limited_to_the_gpu_and_measured_by_nvml_only() {
    use gpuslice_registry::{Owner, Request, Selector};
    let node = Node::new(1);
    let req = Request {
        whole_gpu: true,
        selectors: vec![Selector::Index(0)],
        ..Request::new(Owner::container())
    };
    let r = node.reg.reserve(&req).unwrap();
    node.sys.spawn(4500, 45_000);
    node.reg.bind(&r.id, "whole", 4500).unwrap();
    fake_process(node.proc.path(), "4500", 4026532050, 1, "0::/whole\n");
    fake_process(node.proc.path(), "4501", 4026532050, 2, "0::/whole\n");
    let meter = FakeMeter::default();
    *meter.0.lock().unwrap() = reading(vec![GpuProcess {
        pid: 4501,
        used: Some(3 * GI),
        sm: None,
    }]);
    let mut c = node.collector(Some(meter));
    let (_, s) = scrape(&mut c, Instant::now());
    let id = [("reservation", r.id.as_str())];
    assert_eq!(
        value(&s, "gpuslice_slice_memory_limit_bytes", &id),
        (10 * GI) as f64
    );
    assert_eq!(value(&s, "gpuslice_slice_compute_limit_ratio", &id), 1.0);
    assert_eq!(
        value(&s, "gpuslice_slice_nvml_memory_used_bytes", &id),
        (3 * GI) as f64
    );
    assert!(find(&s, "gpuslice_slice_memory_used_bytes", &id).is_empty());
    assert_eq!(errors(&s, "usage"), 0.0, "no usage file is expected");
    assert_eq!(errors(&s, "limits"), 0.0);
    assert_eq!(
        value(&s, "gpuslice_gpu_cores_booked_ratio", &[("uuid", &uuid(0))]),
        1.0
    );
}
