//! Acceptance 6: `status_json` follows its documented shape (docs/observability.md) and the table is
//! aligned, in the project's short byte spelling (`141Gi`, `47.3Gi`) and percent.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use gpuslice_agent::status::render::{
    render_reaped, render_rebuild, render_table, render_table_measured, status_json,
    status_json_measured, GpuMeasured, Measured,
};
use gpuslice_config::{PlacementConfig, Policy, Quantity};
use gpuslice_registry::{
    read_registry, FakeSystem, Gpu, Inventory, KubernetesRef, Options, Owner, Registry,
    RegistryFile, Request, Selector,
};
use serde_json::Value;

const GI: u64 = 1 << 30;

/// `n` GPUs of `memory` bytes, model "NVIDIA H200".
fn inventory(n: u32, memory: u64) -> Inventory {
    Inventory {
        gpus: (0..n)
            .map(|i| Gpu {
                index: i,
                uuid: format!("GPU-{i:08x}-1111-2222-3333-444444444444"),
                model: "NVIDIA H200".into(),
                memory_total: memory,
                minor: i,
                pci_bus_id: Some(format!("0000:{:02x}:00.0", i + 1)),
                numa_node: Some(0),
                pcie_root: None,
            })
            .collect(),
    }
}

fn state_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

/// A registry in `dir` on the fake system `sys`, binpacking, pending timeout 60 s.
fn open(dir: &Path, sys: Arc<FakeSystem>) -> Registry {
    let options = Options {
        placement: PlacementConfig {
            policy: Policy::Binpack,
            memory_overcommit: 1.0,
            max_slices_per_gpu: None,
        },
        pending_timeout: Duration::from_secs(60),
        recheck_interval: Options::DEFAULT_RECHECK,
    };
    Registry::open(dir, options, sys, gpuslice_registry::no_cleanup()).expect("open registry")
}

/// Two H200-sized GPUs: a pending 12 GiB / 30 % slice and a bound Kubernetes one of 2 × 25 %
/// on GPU 0 and 1, a whole GPU… on a third.
fn populated() -> (tempfile::TempDir, RegistryFile) {
    let dir = state_dir();
    let sys = Arc::new(FakeSystem::new(1_000));
    let reg = open(dir.path(), sys.clone());
    reg.set_inventory(inventory(3, 141 * GI))
        .expect("inventory");
    let pending = Request {
        memory: Some(Quantity::Bytes(12 * GI)),
        cores: 30,
        selectors: vec![Selector::Index(0)],
        ..Request::new(Owner::container())
    };
    reg.reserve(&pending).expect("reserve");
    let k8s = KubernetesRef {
        namespace: "team-a".into(),
        pod: "trainer-0".into(),
        pod_uid: Some("uid".into()),
        container: "main".into(),
        unknown: Default::default(),
    };
    let owner = Owner::Container {
        container_id: None,
        process: None,
        kubernetes: Some(k8s),
    };
    let two = Request {
        gpus: 2,
        memory: Some(Quantity::Percent(25)),
        cores: 50,
        selectors: vec![Selector::Index(0), Selector::Index(1)],
        ..Request::new(owner)
    };
    let r = reg.reserve(&two).expect("reserve");
    sys.spawn(4242, 1);
    reg.bind(
        &r.id,
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        4242,
    )
    .expect("bind");
    let whole = Request {
        whole_gpu: true,
        selectors: vec![Selector::Index(2)],
        ..Request::new(Owner::container())
    };
    reg.reserve(&whole).expect("whole");
    let file = read_registry(dir.path()).expect("read");
    (dir, file)
}

#[test]
fn status_json_follows_the_contract() {
    let (_d, file) = populated();
    let v = status_json(&file);
    let gpus = v["gpus"].as_array().expect("gpus array");
    assert_eq!(gpus.len(), 3);
    for (i, g) in gpus.iter().enumerate() {
        assert_eq!(g["index"], i as u64);
        assert!(g["uuid"].as_str().expect("uuid").starts_with("GPU-"));
        assert_eq!(g["model"], "NVIDIA H200");
        assert_eq!(
            g["memory_total"].as_u64(),
            Some(141 * GI),
            "bytes as integers"
        );
        assert!(g["memory_allocated"].is_u64() && g["cores_allocated"].is_u64());
    }
    let quarter = (141 * GI) / 4;
    assert_eq!(
        gpus[0]["memory_allocated"].as_u64(),
        Some(12 * GI + quarter)
    );
    assert_eq!(gpus[0]["cores_allocated"].as_u64(), Some(80));
    assert_eq!(gpus[1]["memory_allocated"].as_u64(), Some(quarter));
    assert_eq!(gpus[1]["cores_allocated"].as_u64(), Some(50));
    assert_eq!(gpus[2]["memory_allocated"].as_u64(), Some(141 * GI));
    assert_eq!(gpus[2]["cores_allocated"].as_u64(), Some(100));

    let rs = v["reservations"].as_array().expect("reservations array");
    assert_eq!(rs.len(), 3);
    for r in rs {
        assert_eq!(r["id"].as_str().map(str::len), Some(16));
        assert!(matches!(r["state"].as_str(), Some("pending" | "bound")));
        assert!(r["container_id"].is_null() || r["container_id"].is_string());
        for b in r["gpus"].as_array().expect("gpus") {
            assert!(b["uuid"].as_str().expect("uuid").starts_with("GPU-"));
            assert!(b["memory"].is_u64() && b["cores"].is_u64(), "{b}");
        }
    }
    assert_eq!(rs[0]["state"], "pending");
    assert_eq!(rs[0]["container_id"], Value::Null);
    assert_eq!(rs[0]["gpus"][0]["memory"].as_u64(), Some(12 * GI));
    assert_eq!(rs[0]["gpus"][0]["cores"].as_u64(), Some(30));
    assert_eq!(rs[1]["state"], "bound");
    assert_eq!(rs[1]["container_id"].as_str().map(str::len), Some(64));
    assert_eq!(rs[1]["gpus"].as_array().map(Vec::len), Some(2));
    assert_eq!(rs[1]["gpus"][1]["uuid"], gpus[1]["uuid"]);
    // It round-trips as text, as `status --json` prints it.
    let text = serde_json::to_string(&v).expect("serialise");
    assert_eq!(serde_json::from_str::<Value>(&text).expect("parse"), v);
}

/// Start column of each header word in `header`.
fn columns(header: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in header
        .char_indices()
        .chain(std::iter::once((header.len(), ' ')))
    {
        match (c == ' ', start) {
            (false, None) => start = Some(i),
            (true, Some(s)) => {
                out.push((s, i));
                start = None;
            }
            _ => {}
        }
    }
    out
}

#[test]
fn table_is_aligned_in_gib_and_percent() {
    let (_d, file) = populated();
    let text = render_table(&file);
    let lines: Vec<&str> = text.lines().collect();
    let blank = lines.iter().position(|l| l.is_empty()).expect("sections");
    let (gpu_part, res_part) = (&lines[..blank], &lines[blank + 1..]);
    assert!(
        gpu_part[0].starts_with("GPU")
            && gpu_part[0].contains("MODEL")
            && gpu_part[0].contains("BOOKED")
    );
    assert_eq!(gpu_part.len(), 4);
    // Right-aligned numbers: every GPU line ends where the header ends.
    assert!(
        gpu_part.iter().all(|l| l.len() == gpu_part[0].len()),
        "{text}"
    );
    // Each column's text ends at its header's end (right-aligned) or starts at its start.
    let cols = columns(gpu_part[0]);
    for l in &gpu_part[1..] {
        let b = l.as_bytes();
        for (n, &(s, e)) in cols.iter().enumerate() {
            if n == 1 {
                assert!(
                    b[s] != b' ' && b[s - 1] == b' ',
                    "MODEL misaligned in {l:?}"
                );
            } else {
                assert!(
                    b[e - 1] != b' ' && (e == b.len() || b[e] == b' '),
                    "column {n} misaligned in {l:?}"
                );
            }
        }
    }
    let gpu0 = gpu_part[1];
    assert!(gpu0.contains("141Gi"), "{gpu0}");
    // 12 GiB + a quarter of 141 GiB booked: 47.25 GiB.
    assert!(gpu0.contains("47.3Gi"), "{gpu0}");
    assert!(gpu0.contains("80%"), "{gpu0}");
    assert!(
        gpu0.contains(&format!(
            "{}%",
            ((12.0 + 141.0 / 4.0) / 141.0 * 100.0f64).round()
        )),
        "{gpu0}"
    );
    assert!(gpu_part[3].trim_end().ends_with("whole"), "{}", gpu_part[3]);

    assert!(res_part[0].starts_with("RESERVATION") && res_part[0].contains("OWNER"));
    let cols = columns(res_part[0]);
    for l in &res_part[1..] {
        let b = l.as_bytes();
        for &(s, _) in &cols {
            assert!(
                b[s] != b' ' && (s == 0 || b[s - 1] == b' '),
                "misaligned {l:?}"
            );
        }
    }
    assert!(
        res_part[1].contains("pending") && res_part[1].contains("0: 12Gi 30% cores"),
        "{}",
        res_part[1]
    );
    assert!(
        res_part[2].contains("team-a/trainer-0/main"),
        "{}",
        res_part[2]
    );
    assert!(res_part[3].contains("2: whole GPU"), "{}", res_part[3]);
}

#[test]
fn empty_registry_and_gc_report_render() {
    let text = render_table(&RegistryFile::default());
    assert!(
        text.contains("gpuslice cdi generate") && text.contains("no reservations"),
        "{text}"
    );
    assert_eq!(render_reaped(&[]), "nothing to reap\n");
}

/// `gc --rebuild` prints what it restored, also when the inventory shrank under it, and what
/// became of a record it could not read.
#[test]
fn rebuild_report_renders() {
    let dir = state_dir();
    let reg = open(dir.path(), Arc::new(FakeSystem::new(1_000)));
    reg.set_inventory(inventory(2, 20 * GI)).expect("inventory");
    let slice = Request {
        memory: Some(Quantity::Bytes(4 * GI)),
        selectors: vec![Selector::Index(1)],
        ..Request::new(Owner::container())
    };
    let r = reg.reserve(&slice).expect("reserve");
    // Listed and live, its record unreadable: restored from the registry's entry.
    let broken = reg.reserve(&slice).expect("reserve");
    std::fs::write(
        reg.slice_dir(&broken.id)
            .expect("slice dir")
            .join("reservation.json"),
        b"nonsense",
    )
    .expect("write");
    let report = reg.rebuild(inventory(1, 20 * GI)).expect("rebuild");
    let text = render_rebuild(&report);
    assert!(text.contains("restored 2 reservations"), "{text}");
    assert!(text.contains(&format!("  {} (pending, ", r.id)), "{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("unreadable record: "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.contains(&broken.id) && line.contains("restored from the registry's entry"),
        "{text}"
    );
}

/// GPU 0 measured (3 GiB used, 45 %), GPU 1 not; the pending slice uses 1 GiB.
fn measured(file: &RegistryFile) -> Measured {
    let mut m = Measured::default();
    m.gpus.insert(
        file.inventory.gpus[0].uuid.clone(),
        GpuMeasured {
            memory_used: Some(3 * GI),
            utilization: Some(45),
        },
    );
    let r0 = &file.reservations[0];
    m.memory_used.insert(
        r0.id.clone(),
        [(r0.gpus[0].uuid.clone(), GI)].into_iter().collect(),
    );
    m
}

#[test]
fn measured_columns_sit_next_to_the_booked_ones() {
    let (_d, file) = populated();
    let m = measured(&file);
    let text = render_table_measured(&file, &m, &gpuslice_config::Config::default().placement);
    let lines: Vec<&str> = text.lines().collect();
    let header = lines[0];
    let cols: Vec<&str> = header.split_whitespace().collect();
    assert_eq!(
        cols,
        [
            "GPU",
            "MODEL",
            "MEMORY",
            "ALLOCATED",
            "FREE",
            "USED",
            "CORES",
            "UTIL",
            "BOOKED",
            "SLICES"
        ]
    );
    // Right-aligned under their headers.
    let used_end = header.find("USED").unwrap() + 4;
    let util_end = header.find("UTIL").unwrap() + 4;
    assert_eq!(&lines[1][used_end - 4..used_end], " 3Gi", "{text}");
    assert_eq!(&lines[1][util_end - 3..util_end], "45%", "{text}");
    assert_eq!(
        &lines[2][used_end - 1..used_end],
        "-",
        "GPU 1 not measured: {text}"
    );
    assert_eq!(&lines[2][util_end - 1..util_end], "-", "{text}");
    let blank = lines.iter().position(|l| l.is_empty()).unwrap();
    let res = &lines[blank + 1..];
    assert!(res[0].ends_with("USED"), "{}", res[0]);
    let at = res[0].find("USED").unwrap();
    assert_eq!(&res[1][at..], "0: 1Gi", "{text}");
    assert_eq!(&res[2][at..], "-", "unmeasured reservation: {text}");
    // Without measurements every measured cell is a dash and nothing else moves.
    let plain = render_table(&file);
    assert_eq!(plain.lines().count(), text.lines().count());
    assert!(!plain.contains("45%"));

    let mut m = m;
    m.gpu_error = Some("NVML (libnvidia-ml.so.1) cannot be initialised: not loaded".into());
    let text = render_table_measured(&file, &m, &gpuslice_config::Config::default().placement);
    assert!(
        text.lines()
            .any(|l| l.starts_with("not measured: NVML") && l.contains("not loaded")),
        "{text}"
    );
}

#[test]
fn status_json_carries_measured_figures_beside_the_contract() {
    let (_d, file) = populated();
    let v = status_json_measured(
        &file,
        &measured(&file),
        &gpuslice_config::Config::default().placement,
    );
    assert_eq!(v["gpus"][0]["memory_used"].as_u64(), Some(3 * GI));
    assert_eq!(v["gpus"][0]["utilization"].as_u64(), Some(45));
    assert!(v["gpus"][1]["memory_used"].is_null());
    assert!(v["gpus"][1]["utilization"].is_null());
    assert_eq!(
        v["reservations"][0]["gpus"][0]["memory_used"].as_u64(),
        Some(GI)
    );
    assert!(v["reservations"][1]["gpus"][0]["memory_used"].is_null());
    assert!(v["measure_error"].is_null());
    // The contract's fields are unchanged by measurements.
    let plain = status_json(&file);
    for (g, p) in v["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .zip(plain["gpus"].as_array().unwrap())
    {
        for key in [
            "index",
            "uuid",
            "model",
            "memory_total",
            "memory_allocated",
            "cores_allocated",
        ] {
            assert_eq!(g[key], p[key], "{key}");
        }
    }
    assert_eq!(v["reservations"][0]["id"], plain["reservations"][0]["id"]);
    assert_eq!(
        v["reservations"][0]["gpus"][0]["memory"],
        plain["reservations"][0]["gpus"][0]["memory"]
    );
}
