//! The monitoring packaging stays in step with the exporter: every metric the
//! Grafana dashboard and the Prometheus rules query is one the exporter emits, the rules
//! pass `promtool check rules`, and the scrape settings point at the exporter's port.

use crate::serve_common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpuslice_agent::gpu::{DeviceReading, GpuProcess, Reading};
use serve_common::{parse, uuid, FakeMeter, Node, GI};

fn packaging(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../packaging")
        .join(rel)
}

/// The names of every family a fully populated node exports (two scrapes, so the achieved
/// share exists too; an enforcer with a throttled slice and an unowned process).
fn exported_names() -> BTreeSet<String> {
    let node = Node::new(1);
    let a = node.slice(2 * GI, 30, 0, Some(("c", 4001)), Some(("ns", "pod", "ctr")));
    let _h = node.hold(&a, 1, 1, GI);
    let meter = FakeMeter::default();
    *meter.0.lock().unwrap() = Reading {
        devices: vec![DeviceReading {
            index: 0,
            uuid: uuid(0),
            model: "NVIDIA H200".into(),
            memory_total: Some(10 * GI),
            memory_used: Some(GI),
            utilization: Some(0.1),
            processes: Some(vec![GpuProcess {
                pid: 1,
                used: None,
                sm: None,
            }]),
        }],
        errors: vec![],
    };
    let enforcer = gpuslice_agent::enforce::events::Shared::default();
    {
        let mut live = gpuslice_agent::enforce::events::lock(&enforcer);
        live.throttled = vec![(a.clone(), uuid(0), 0.4)];
        live.unowned = vec![(uuid(0), 1)];
    }
    let mut c = node.collector(Some(meter)).with_enforcer(enforcer);
    let t0 = Instant::now();
    c.collect(t0);
    let s = c.collect(t0 + Duration::from_secs(2));
    let text = gpuslice_agent::encode::encode(&s, c.errors(), gpuslice_agent::encode::Format::Text);
    parse(&text).into_iter().map(|s| s.name).collect()
}

/// `gpuslice_…` identifiers in a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("gpuslice_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        out.push(name);
    }
    out
}

/// Every `expr` of a JSON document (Grafana targets).
fn json_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                    _ => json_exprs(x, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| json_exprs(x, out)),
        _ => {}
    }
}

#[test]
fn dashboard_queries_only_exported_metrics_per_node_and_per_pod() {
    let names = exported_names();
    let text = std::fs::read_to_string(packaging("grafana/gpuslice-dashboard.json")).unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).expect("dashboard is JSON");
    let mut exprs = Vec::new();
    json_exprs(&dash, &mut exprs);
    assert!(exprs.len() > 10, "{exprs:?}");
    let mut used = BTreeSet::new();
    for e in &exprs {
        for n in metric_names(e) {
            assert!(
                names.contains(&n),
                "dashboard queries {n}, which is not exported: {e}"
            );
            used.insert(n);
        }
    }
    // Both screens: per node (GPU figures) and per pod (slice figures).
    for n in [
        "gpuslice_gpu_memory_booked_bytes",
        "gpuslice_gpu_memory_used_bytes",
        "gpuslice_gpu_utilization_ratio",
        "gpuslice_slice_memory_used_bytes",
        "gpuslice_slice_memory_limit_bytes",
        "gpuslice_slice_compute_busy_seconds_total",
    ] {
        assert!(used.contains(n), "dashboard never shows {n}");
    }
    let vars: Vec<&str> = dash["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(vars, ["datasource", "node", "namespace", "pod"]);
    let ids: Vec<u64> = dash["panels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_u64().unwrap())
        .collect();
    assert_eq!(
        ids.len(),
        ids.iter().collect::<BTreeSet<_>>().len(),
        "panel ids unique"
    );
}

#[test]
fn rules_pass_promtool_and_query_only_exported_metrics() {
    let names = exported_names();
    let path = packaging("monitoring/rules.yaml");
    let out = std::process::Command::new("promtool")
        .args(["check", "rules"])
        .arg(&path)
        .output()
        .expect("promtool (Debian's prometheus package) must be installed");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&path).unwrap();
    let exprs: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("expr:"))
        .collect();
    assert!(exprs.len() >= 5);
    for e in exprs {
        for n in metric_names(e) {
            assert!(
                names.contains(&n),
                "rules query {n}, which is not exported: {e}"
            );
        }
    }
}

#[test]
fn scrape_settings_point_at_the_exporter() {
    let port = gpuslice_config::DEFAULT_LISTEN
        .rsplit(':')
        .next()
        .unwrap()
        .to_string();
    let ds = std::fs::read_to_string(packaging("monitoring/exporter.yaml")).unwrap();
    assert!(
        ds.contains(&format!("prometheus.io/port: \"{port}\"")),
        "{ds}"
    );
    assert!(ds.contains(&format!("0.0.0.0:{port}")), "{ds}");
    assert!(ds.contains("hostPID: true"), "NVML pids are host pids");
    assert!(ds.contains("path: /healthz"));
    let sm = std::fs::read_to_string(packaging("monitoring/servicemonitor.yaml")).unwrap();
    assert!(sm.contains(&format!("port: {port}")), "{sm}");
    assert!(
        sm.contains("honorLabels: true"),
        "the workload's namespace/pod labels must survive"
    );
}
