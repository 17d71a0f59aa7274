//! The plugin's renderings of the model: kubectl-style tables (a first row for the cluster
//! total, `used (pct%)` figures, `n/a` where use is not measured, more columns with
//! `-o wide`) and the model itself as JSON or YAML.

use serde::Serialize;

use crate::budgets::{self, NamespaceBudget, QueueBudget, RESOURCES};
use crate::model::{ContainerSlice, Figure, GpuView, Model, NodeView, TOTAL};
use gpuslice_dra::quota::Resource;

/// `-o` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Wide,
    Json,
    Yaml,
}

/// Output that could not be written.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("cannot encode the output as JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("cannot encode the output as YAML: {0}")]
    Yaml(#[from] serde_yaml_ng::Error),
}

/// What a figure reads where use is not measured.
pub const NOT_MEASURED: &str = "n/a";

/// Bytes as a table figure (`141Gi`, `20.5Gi`, `512Mi`, `0`): the workspace's one short
/// spelling, shared with the web page.
pub use gpuslice_config::quantity::format_bytes_rounded as bytes;

/// `value (pct%)` of `of`; just `value` when `of` is 0.
pub fn with_pct(value: String, part: f64, of: u64) -> String {
    if of == 0 {
        return value;
    }
    format!("{value} ({:.0}%)", part / of as f64 * 100.0)
}

fn mem_pct(v: u64, of: u64) -> String {
    with_pct(bytes(v), v as f64, of)
}

fn cores_pct(v: u64, of: u64) -> String {
    with_pct(v.to_string(), v as f64, of)
}

fn used(v: Option<u64>, of: u64, fmt: fn(u64, u64) -> String) -> String {
    v.map_or_else(|| NOT_MEASURED.to_string(), |v| fmt(v, of))
}

fn count(v: Option<u64>) -> String {
    v.map_or_else(|| NOT_MEASURED.to_string(), |v| v.to_string())
}

/// Columns padded to their widest cell plus three spaces, as kubectl prints them. Control
/// characters in a cell (a model name or attribute from a ResourceSlice) are escaped, so
/// nothing the cluster holds moves the operator's cursor or forges a line.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.iter().map(|c| gpuslice_registry::printable(c)).collect())
        .collect();
    let rows = rows.as_slice();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    let head: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    for r in std::iter::once(&head).chain(rows) {
        let mut line = String::new();
        for (i, c) in r.iter().enumerate() {
            line.push_str(c);
            if i + 1 < r.len() {
                line.push_str(&" ".repeat(widths[i] - c.chars().count() + 3));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn memory_cells(f: &Figure) -> Vec<String> {
    vec![
        bytes(f.capacity),
        mem_pct(f.allocated, f.capacity),
        mem_pct(f.free, f.capacity),
        used(f.used, f.capacity, mem_pct),
    ]
}

fn cores_cells(f: &Figure) -> Vec<String> {
    vec![
        f.capacity.to_string(),
        cores_pct(f.allocated, f.capacity),
        cores_pct(f.free, f.capacity),
        used(f.used, f.capacity, cores_pct),
    ]
}

const FIGURE_HEADER: [&str; 8] = [
    "MEMORY",
    "MEMORY ALLOCATED",
    "MEMORY FREE",
    "MEMORY USED",
    "CORES",
    "CORES ALLOCATED",
    "CORES FREE",
    "CORES USED",
];

/// `nodes`: the total row, then one row per node.
pub fn nodes_table(total: &NodeView, nodes: &[&NodeView], wide: bool) -> String {
    let mut header = vec!["NODE", "GPUS"];
    header.extend(FIGURE_HEADER);
    header.push("MODE");
    if wide {
        header.extend(["SLICES", "IDLE", "LARGEST FREE", "MODELS"]);
    }
    let rows: Vec<Vec<String>> = std::iter::once(total)
        .chain(nodes.iter().copied())
        .map(|n| {
            let mut r = vec![n.name.clone(), n.gpus.to_string()];
            r.extend(memory_cells(&n.memory));
            r.extend(cores_cells(&n.cores));
            r.push(if n.mode.is_empty() {
                "-".into()
            } else {
                n.mode.clone()
            });
            if wide {
                r.push(n.slices.to_string());
                r.push(count(n.idle_slices));
                r.push(bytes(n.largest_free_memory));
                r.push(if n.name == TOTAL && n.models.is_empty() {
                    "-".into()
                } else {
                    n.models.join(",")
                });
            }
            r
        })
        .collect();
    table(&header, &rows)
}

fn claim_label(c: &crate::model::ClaimOnGpu) -> String {
    let mut s = format!("{}/{}={}/{}", c.namespace, c.name, bytes(c.memory), c.cores);
    if c.idle == Some(true) {
        s.push_str("(idle)");
    }
    s
}

/// `gpus`: the total row, then one row per GPU.
pub fn gpus_table(total: &NodeView, gpus: &[&GpuView], wide: bool) -> String {
    let mut header = vec!["NODE", "GPU", "MODEL"];
    header.extend(FIGURE_HEADER);
    header.extend(["CLAIMS", "IDLE"]);
    if wide {
        header.extend(["UUID", "HELD BY (NAMESPACE/CLAIM=MEMORY/CORES)"]);
    }
    let mut rows = Vec::new();
    let mut t = vec![TOTAL.to_string(), total.gpus.to_string(), "-".into()];
    t.extend(memory_cells(&total.memory));
    t.extend(cores_cells(&total.cores));
    t.push(total.slices.to_string());
    t.push(count(total.idle_slices));
    if wide {
        t.extend(["-".into(), "-".into()]);
    }
    rows.push(t);
    for g in gpus {
        let model = match &g.unhealthy {
            Some(why) => format!("{} (unhealthy: {why})", g.model),
            None => g.model.clone(),
        };
        let mut r = vec![g.node.clone(), g.device.clone(), model];
        r.extend(memory_cells(&g.memory));
        r.extend(cores_cells(&g.cores));
        r.push(g.claims.len().to_string());
        r.push(count(g.idle_slices));
        if wide {
            r.push(g.uuid.clone());
            let held: Vec<String> = g.claims.iter().map(claim_label).collect();
            r.push(if held.is_empty() {
                "-".into()
            } else {
                held.join(",")
            });
        }
        rows.push(r);
    }
    table(&header, &rows)
}

fn opt_bytes_pct(v: Option<u64>, of: u64) -> String {
    used(v, of, mem_pct)
}

/// `pods`: the total row, then one row per container and GPU.
pub fn pods_table(pods: &[&ContainerSlice], all_namespaces: bool, wide: bool) -> String {
    let mut header = Vec::new();
    if all_namespaces {
        header.push("NAMESPACE");
    }
    header.extend([
        "POD",
        "CONTAINER",
        "NODE",
        "GPU",
        "CLAIM",
        "MEMORY LIMIT",
        "MEMORY USED",
        "DRIVER USED",
        "CORES SHARE",
        "CORES USED",
    ]);
    if wide {
        header.extend(["UUID", "SHARES SLICE WITH"]);
    }
    let sum = |f: fn(&ContainerSlice) -> Option<u64>| -> Option<u64> {
        // A slice shared by containers is counted once.
        pods.iter()
            .filter(|p| {
                p.shared_with
                    .iter()
                    .all(|o| o.as_str() > p.container.as_str())
            })
            .map(|p| f(p))
            .sum()
    };
    let once: Vec<&&ContainerSlice> = pods
        .iter()
        .filter(|p| {
            p.shared_with
                .iter()
                .all(|o| o.as_str() > p.container.as_str())
        })
        .collect();
    let limit: u64 = once.iter().map(|p| p.memory_limit).sum();
    let mut total = Vec::new();
    if all_namespaces {
        total.push("-".to_string());
    }
    total.extend([
        TOTAL.to_string(),
        "-".into(),
        "-".into(),
        "-".into(),
        "-".into(),
        bytes(limit),
        opt_bytes_pct(sum(|p| p.memory_used), limit),
        opt_bytes_pct(sum(|p| p.memory_used_driver), limit),
        once.iter().map(|p| p.cores_share).sum::<u64>().to_string(),
        once.iter()
            .map(|p| p.cores_used)
            .sum::<Option<f64>>()
            .map_or_else(|| NOT_MEASURED.to_string(), |v| format!("{v:.0}")),
    ]);
    if wide {
        total.extend(["-".into(), "-".into()]);
    }
    let mut rows = vec![total];
    for p in pods {
        let mut r = Vec::new();
        if all_namespaces {
            r.push(p.namespace.clone());
        }
        r.extend([
            p.pod.clone(),
            p.container.clone(),
            p.node.clone(),
            p.device.clone(),
            p.claim.clone().unwrap_or_else(|| "(annotation)".into()),
            bytes(p.memory_limit),
            opt_bytes_pct(p.memory_used, p.memory_limit),
            opt_bytes_pct(p.memory_used_driver, p.memory_limit),
            if p.cores_share == 0 {
                "-".into()
            } else {
                p.cores_share.to_string()
            },
            match (p.cores_used, p.cores_share) {
                (None, _) => NOT_MEASURED.to_string(),
                (Some(u), 0) => format!("{u:.0}"),
                (Some(u), s) => with_pct(format!("{u:.0}"), u, s),
            },
        ]);
        if wide {
            r.push(p.uuid.clone());
            r.push(if p.shared_with.is_empty() {
                "-".into()
            } else {
                p.shared_with.join(",")
            });
        }
        rows.push(r);
    }
    table(&header, &rows)
}

/// `kubectl gpuslice pods --idle`: one row per idle slice, largest holding first.
pub fn idle_table(rows: &[crate::idle::IdleSlice], all_namespaces: bool, wide: bool) -> String {
    let mut header = Vec::new();
    if all_namespaces {
        header.push("NAMESPACE");
    }
    header.extend([
        "WORKLOAD",
        "PODS",
        "CLAIM",
        "GPU",
        "MEMORY HELD",
        "MAX USED",
        "CORES SHARE",
        "MAX CORES USED",
    ]);
    if wide {
        header.push("UUID");
    }
    let mut out = Vec::new();
    for r in rows {
        let mut row = Vec::new();
        if all_namespaces {
            row.push(r.namespace.clone());
        }
        row.extend([
            r.workload.clone(),
            if r.pods.is_empty() {
                "-".into()
            } else {
                r.pods.join(",")
            },
            r.claim.clone().unwrap_or_else(|| "(annotation)".into()),
            crate::model::gpu_label(&r.node, &r.device, &r.model),
            bytes(r.memory_held),
            mem_pct(r.memory_used_max, r.memory_held),
            if r.cores_share == 0 {
                "-".into()
            } else {
                r.cores_share.to_string()
            },
            format!("{:.0}", r.cores_used_max),
        ]);
        if wide {
            row.push(r.uuid.clone());
        }
        out.push(row);
    }
    table(&header, &out)
}

/// A budget figure: `-` where the quota names no hard value, else `used (pct%)` of it.
fn budget_cells(b: &NamespaceBudget, what: Resource) -> [String; 2] {
    let l = b.limit(what);
    match l.hard {
        None => ["-".into(), "-".into()],
        Some(hard) => [
            budgets::show(what, hard),
            with_pct(budgets::show(what, l.used), l.used as f64, hard),
        ],
    }
}

/// `quota`: one row per ResourceQuota and name set, hard and used of GPU memory, cores and
/// GPUs (`-` where the quota names none).
pub fn budgets_table(rows: &[NamespaceBudget], all_namespaces: bool) -> String {
    let mut header = Vec::new();
    if all_namespaces {
        header.push("NAMESPACE");
    }
    header.extend([
        "QUOTA",
        "NAMES",
        "MEMORY",
        "MEMORY USED",
        "CORES",
        "CORES USED",
        "GPUS",
        "GPUS USED",
    ]);
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|b| {
            let mut r = Vec::new();
            if all_namespaces {
                r.push(b.namespace.clone());
            }
            r.push(b.quota.clone());
            r.push(b.name_sets());
            for what in RESOURCES {
                r.extend(budget_cells(b, what));
            }
            r
        })
        .collect();
    table(&header, &rows)
}

/// `quota`'s Kueue part: one row per ClusterQueue charging `gpuslice.io/memory`.
pub fn queues_table(queues: &[QueueBudget]) -> String {
    let header = [
        "CLUSTERQUEUE",
        "COHORT",
        "MEMORY NOMINAL",
        "BORROWING LIMIT",
        "MEMORY USED",
        "BORROWED",
        "RESERVED",
    ];
    let rows: Vec<Vec<String>> = queues
        .iter()
        .map(|q| {
            vec![
                q.name.clone(),
                q.cohort.clone().unwrap_or_else(|| "-".into()),
                bytes(q.nominal),
                match (&q.cohort, q.borrowing_limit) {
                    (None, _) => "-".into(),
                    (Some(_), None) => "unlimited".into(),
                    (Some(_), Some(l)) => bytes(l),
                },
                mem_pct(q.used, q.nominal),
                bytes(q.borrowed),
                bytes(q.reserved),
            ]
        })
        .collect();
    table(&header, &rows)
}

/// `-o json` / `-o yaml` of any view.
pub fn encode<T: Serialize>(value: &T, output: Output) -> Result<String, RenderError> {
    Ok(match output {
        Output::Json => {
            let mut s = serde_json::to_string_pretty(value)?;
            s.push('\n');
            s
        }
        Output::Yaml => serde_yaml_ng::to_string(value)?,
        Output::Wide => String::new(),
    })
}

/// The one warning line when use is not measured, naming the source.
pub fn usage_warning(model: &Model) -> Option<String> {
    model
        .usage_unavailable
        .as_ref()
        .map(|why| format!("warning: used figures are {NOT_MEASURED}: {why}"))
}

#[cfg(test)]
mod tests {

    #[test]
    fn control_characters_in_cells_are_escaped() {
        let out = table(&["MODEL"], &[vec!["L4\u{1b}[2J\nFAKE   ROW".to_string()]]);
        assert_eq!(out, "MODEL\nL4\\u{1b}[2J\\nFAKE   ROW\n");
        assert_eq!(out.lines().count(), 2);
    }

    use super::*;
    use crate::model::tests::{claims, slices, usage};
    use crate::model::{build, Sources};

    const GIB: u64 = 1 << 30;

    #[test]
    fn figures_read_like_kubectl() {
        assert_eq!(bytes(0), "0");
        assert_eq!(bytes(512), "512");
        assert_eq!(bytes(141 * GIB), "141Gi");
        assert_eq!(bytes(41 * GIB / 2), "20.5Gi");
        assert_eq!(bytes(1536 << 20), "1.5Gi");
        assert_eq!(bytes(512 << 20), "512Mi");
        assert_eq!(with_pct("30Gi".into(), 30.0, 141), "30Gi (21%)");
        assert_eq!(with_pct("0".into(), 0.0, 0), "0");
        let t = table(
            &["A", "LONG HEADER"],
            &[vec!["wide cell".into(), "x".into()]],
        );
        assert_eq!(t, "A           LONG HEADER\nwide cell   x\n");
    }

    fn model(measured: bool) -> crate::model::Model {
        build(
            &Sources {
                slices: slices(),
                claims: claims(),
                pods: Vec::new(),
                usage: if measured {
                    Ok(usage())
                } else {
                    Err("no --prometheus URL given".into())
                },
            },
            None,
        )
    }

    #[test]
    fn nodes_table_starts_with_the_total_and_says_na_when_not_measured() {
        let m = model(false);
        let nodes: Vec<&NodeView> = m.nodes.iter().collect();
        let t = nodes_table(&m.total, &nodes, false);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4, "{t}");
        let cells = |l: &str| -> Vec<String> {
            l.split("   ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(String::from)
                .collect()
        };
        assert_eq!(
            cells(lines[0]),
            [
                "NODE",
                "GPUS",
                "MEMORY",
                "MEMORY ALLOCATED",
                "MEMORY FREE",
                "MEMORY USED",
                "CORES",
                "CORES ALLOCATED",
                "CORES FREE",
                "CORES USED",
                "MODE"
            ]
        );
        assert_eq!(
            cells(lines[1]),
            [
                "*",
                "3",
                "265Gi",
                "64Gi (24%)",
                "201Gi (76%)",
                "n/a",
                "275",
                "80 (29%)",
                "195 (71%)",
                "n/a",
                "capacity"
            ]
        );
        assert_eq!(
            cells(lines[2]),
            [
                "node-a",
                "2",
                "241Gi",
                "40Gi (17%)",
                "201Gi (83%)",
                "n/a",
                "175",
                "30 (17%)",
                "145 (83%)",
                "n/a",
                "capacity"
            ]
        );
        assert_eq!(cells(lines[3])[0], "node-b");
        assert_eq!(
            usage_warning(&m).unwrap(),
            "warning: used figures are n/a: no --prometheus URL given"
        );
        let wide = nodes_table(&m.total, &nodes, true);
        assert!(
            wide.lines()
                .next()
                .unwrap()
                .ends_with("SLICES   IDLE   LARGEST FREE   MODELS"),
            "{wide}"
        );
        assert!(wide.contains("NVIDIA H200,NVIDIA L4"), "{wide}");
    }

    #[test]
    fn gpus_and_pods_tables_show_use_claims_and_idle_slices() {
        let m = model(true);
        assert_eq!(usage_warning(&m), None);
        let gpus: Vec<&GpuView> = m.gpus.iter().collect();
        let t = gpus_table(&m.total, &gpus, true);
        let cells = |l: &str| -> Vec<String> {
            l.split("   ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(String::from)
                .collect()
        };
        assert_eq!(
            cells(t.lines().nth(2).unwrap()),
            [
                "node-a",
                "gpu-0",
                "NVIDIA H200",
                "141Gi",
                "30Gi (21%)",
                "111Gi (79%)",
                "12Gi (9%)",
                "100",
                "30 (30%)",
                "70 (70%)",
                "42 (42%)",
                "2",
                "1",
                "GPU-NVIDIA-H200-0",
                "ml/pair=10Gi/0(idle),ml/train=20Gi/30"
            ],
            "{t}"
        );
        // The L4 is not measured: n/a, not zero.
        assert_eq!(
            cells(t.lines().nth(4).unwrap())[3..=13],
            [
                "24Gi",
                "24Gi (100%)",
                "0 (0%)",
                "n/a",
                "100",
                "50 (50%)",
                "50 (50%)",
                "n/a",
                "1",
                "n/a",
                "GPU-NVIDIA-L4-0"
            ]
        );
        assert_eq!(
            cells(t.lines().nth(1).unwrap())[12],
            "n/a",
            "the total's idle count is unknown too"
        );

        let mut src_pods = m.pods.clone();
        src_pods.push(ContainerSlice {
            namespace: "ml".into(),
            pod: "train-0".into(),
            container: "main".into(),
            node: "node-a".into(),
            claim: Some("train".into()),
            device: "gpu-0".into(),
            uuid: "GPU-x".into(),
            memory_limit: 20 * GIB,
            memory_used: Some(8 * GIB),
            memory_used_driver: Some(9 * GIB),
            cores_share: 30,
            cores_used: Some(28.0),
            shared_with: vec![],
            workload: "deployment/train".into(),
        });
        let rows: Vec<&ContainerSlice> = src_pods.iter().collect();
        let t = pods_table(&rows, true, false);
        assert!(
            t.lines().next().unwrap().starts_with("NAMESPACE   POD"),
            "{t}"
        );
        assert!(
            t.lines().nth(1).unwrap().starts_with("-           *"),
            "{t}"
        );
        let train = t.lines().find(|l| l.contains("train-0")).unwrap();
        assert_eq!(
            cells(train)[6..],
            ["20Gi", "8Gi (40%)", "9Gi (45%)", "30", "28 (93%)"],
            "{t}"
        );
        let probe = t.lines().find(|l| l.contains("probe")).unwrap();
        assert!(probe.contains("(annotation)"), "{t}");
    }

    #[test]
    fn json_and_yaml_carry_the_model() {
        let m = model(false);
        let j = encode(&m.total, Output::Json).unwrap();
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(v["memory"]["capacity"], 265 * GIB);
        assert!(v["memory"]["used"].is_null());
        assert_eq!(v["largestFreeMemory"], 111 * GIB);
        let y = encode(&m.total, Output::Yaml).unwrap();
        assert!(y.contains("largestFreeMemory: "), "{y}");
    }

    #[test]
    fn quota_tables_show_hard_and_used_with_their_share() {
        use crate::budgets::tests::{budget, rq};
        use crate::budgets::{quota_budget, QueueBudget};
        let mut rows = vec![budget("team-a", "10Gi", "6Gi", "4", "1")];
        let hami = rq(
            "legacy",
            "hami",
            serde_json::json!({"limits.nvidia.com/gpumem": "20480", "limits.nvidia.com/gpucores": "200"}),
            serde_json::json!({"limits.nvidia.com/gpumem": "5120", "limits.nvidia.com/gpucores": "50"}),
        );
        rows.push(quota_budget(&hami, true, true).0.unwrap());
        let t = budgets_table(&rows, true);
        assert_eq!(
            t,
            "NAMESPACE   QUOTA   NAMES         MEMORY   MEMORY USED   CORES   CORES USED   GPUS   GPUS USED\n\
             team-a      gpu     gpuslice.io   10Gi     6Gi (60%)     -       -            4      1 (25%)\n\
             legacy      hami    nvidia.com    20Gi     5Gi (25%)     200     50 (25%)     -      -\n"
        );
        let one = budgets_table(&rows[..1], false);
        assert!(one.starts_with("QUOTA   NAMES"), "{one}");
        let q = [
            QueueBudget {
                name: "team-a".into(),
                cohort: Some("pool".into()),
                nominal: 8 * GIB,
                borrowing_limit: None,
                used: 12 * GIB,
                borrowed: 4 * GIB,
                reserved: 12 * GIB,
            },
            QueueBudget {
                name: "solo".into(),
                cohort: None,
                nominal: 8 * GIB,
                borrowing_limit: Some(0),
                used: 0,
                borrowed: 0,
                reserved: 0,
            },
        ];
        assert_eq!(
            queues_table(&q),
            "CLUSTERQUEUE   COHORT   MEMORY NOMINAL   BORROWING LIMIT   MEMORY USED   BORROWED   RESERVED\n\
             team-a         pool     8Gi              unlimited         12Gi (150%)   4Gi        12Gi\n\
             solo           -        8Gi              -                 0 (0%)        0          0\n"
        );
    }
}
