//! Idle slices: slices whose measured use stayed under a threshold of their limit for a
//! whole window, with the memory they hold and the workload they belong to, largest holding
//! first. Use is what the driver reports for the slice's processes (NVML's per-process
//! memory and SM utilisation, attributed by the node agent as its enforcer attributes them,
//! from Prometheus over the window), never the usage file the container itself writes: a
//! container that zeroes its file is not idle while its processes hold memory or run
//! kernels. One computation for `kubectl gpuslice pods --idle` and the web console's Idle
//! page.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::model::{claim_series, Model};
use crate::usage::{self, format_window, Sample, SliceUsage, Usage, UsageError};

/// The default threshold: 5 % of the limit.
pub const DEFAULT_THRESHOLD_PERCENT: f64 = 5.0;
/// The default window: one hour.
pub const DEFAULT_WINDOW: u64 = 3600;

/// A threshold the idle computation cannot use.
#[derive(Debug, thiserror::Error)]
pub enum IdleError {
    #[error("threshold `{value}` is not a percentage; accepted: a number from 0 to 100 (percent of the slice's limit), e.g. 5")]
    Threshold { value: String },
    #[error("idle slices are measured use over time: give --prometheus URL (a Prometheus scraping `gpuslice serve`)")]
    NoPrometheus,
    #[error(transparent)]
    Fetch(#[from] crate::fetch::FetchError),
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Window(#[from] UsageError),
}

/// Everything the idle rows are made from, read for `namespaces` (`None`: all): the model's
/// sources, the use now and over the window; then [`idle_slices`].
pub async fn fetch_rows(
    client: &kube::Client,
    prometheus: Option<&str>,
    namespaces: Option<&std::collections::BTreeSet<String>>,
    opts: &IdleOptions,
) -> Result<Vec<IdleSlice>, IdleError> {
    let url = prometheus.ok_or(IdleError::NoPrometheus)?;
    let scope = match namespaces.map(|n| n.iter().collect::<Vec<_>>()).as_deref() {
        Some([one]) => crate::fetch::PodScope::Namespace((*one).clone()),
        _ => crate::fetch::PodScope::All,
    };
    let (src, window) = tokio::join!(
        crate::fetch::sources(client, &scope, Some(url)),
        fetch(url, opts.window)
    );
    let src = src?;
    let window = window?;
    let model = crate::model::build(&src, namespaces);
    let usage = src
        .usage
        .as_ref()
        .map_err(|e| IdleError::Usage(e.clone()))?;
    Ok(idle_slices(&model, usage, &window, opts, namespaces))
}

/// What "idle" means: use under `threshold_percent` of the limit for `window` seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IdleOptions {
    pub threshold_percent: f64,
    pub window: u64,
}

impl Default for IdleOptions {
    fn default() -> Self {
        IdleOptions {
            threshold_percent: DEFAULT_THRESHOLD_PERCENT,
            window: DEFAULT_WINDOW,
        }
    }
}

/// Parses a threshold in percent (`5`, `2.5`, `5%`).
pub fn parse_threshold(value: &str) -> Result<f64, IdleError> {
    let v: f64 = value
        .trim()
        .trim_end_matches('%')
        .parse()
        .map_err(|_| IdleError::Threshold {
            value: value.to_string(),
        })?;
    if !(0.0..=100.0).contains(&v) {
        return Err(IdleError::Threshold {
            value: value.to_string(),
        });
    }
    Ok(v)
}

/// A slice series' key: (node, reservation, uuid), as [`usage::fold`] keys them.
type Key = (String, String, String);

fn key_of(labels: &BTreeMap<String, String>) -> Key {
    let l = |k: &str| labels.get(k).cloned().unwrap_or_default();
    (l("node"), l("reservation"), l("uuid"))
}

fn key_of_slice(s: &SliceUsage) -> Key {
    (s.node.clone(), s.reservation.clone(), s.uuid.clone())
}

/// Per slice series: the most it used over the window, and whether it existed at its start.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WindowUse {
    pub max_memory_used: BTreeMap<Key, f64>,
    pub max_compute_used: BTreeMap<Key, f64>,
    /// Slices whose limit series was there a window ago (younger ones are not judged).
    pub present_at_start: BTreeMap<Key, ()>,
}

/// The three instant queries of the window (most memory the driver reported for the slice's
/// processes, most compute share, the limit a window ago).
pub fn queries(window: u64) -> [String; 3] {
    let w = format_window(window);
    [
        format!("max_over_time(gpuslice_slice_nvml_memory_used_bytes[{w}])"),
        format!("max_over_time(gpuslice_slice_nvml_compute_used_ratio[{w}])"),
        format!("gpuslice_slice_memory_limit_bytes offset {w}"),
    ]
}

fn fold_max(samples: &[Sample]) -> BTreeMap<Key, f64> {
    let mut out = BTreeMap::new();
    for s in samples {
        if let Some(v) = s.value.1.parse::<f64>().ok().filter(|v| v.is_finite()) {
            let e = out.entry(key_of(&s.metric)).or_insert(v);
            *e = e.max(v);
        }
    }
    out
}

/// Folds the answers of [`queries`].
pub fn fold(memory: &[Sample], compute: &[Sample], limits: &[Sample]) -> WindowUse {
    WindowUse {
        max_memory_used: fold_max(memory),
        max_compute_used: fold_max(compute),
        present_at_start: limits.iter().map(|s| (key_of(&s.metric), ())).collect(),
    }
}

/// Asks the Prometheus at `base` the three queries of `window`.
pub async fn fetch(base: &str, window: u64) -> Result<WindowUse, UsageError> {
    let [m, c, l] = queries(window);
    let (m, c, l) = tokio::join!(
        usage::query(base, &m),
        usage::query(base, &c),
        usage::query(base, &l)
    );
    Ok(fold(&m?, &c?, &l?))
}

/// One idle slice.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IdleSlice {
    pub namespace: String,
    /// `kind/name` of the pods' workload; `claim/NAME` when no pod of the claim is known.
    pub workload: String,
    /// The pods holding the slice.
    pub pods: Vec<String>,
    /// The claim's name; `None` for a slice of the annotation path.
    pub claim: Option<String>,
    pub node: String,
    pub device: String,
    pub model: String,
    pub uuid: String,
    /// The memory the slice holds (its limit).
    pub memory_held: u64,
    /// The most memory its processes held over the window, as the driver reports it.
    pub memory_used_max: u64,
    /// The compute share, percent of the GPU (0: not throttled).
    pub cores_share: u64,
    /// The most compute its processes used over the window (the driver's per-process SM
    /// utilisation), percent of the GPU.
    pub cores_used_max: f64,
}

/// The slices of `usage` that stayed idle over the window (`namespaces`: only those; `None`:
/// all), largest holding first, then by namespace and workload.
pub fn idle_slices(
    model: &Model,
    usage: &Usage,
    window: &WindowUse,
    opts: &IdleOptions,
    namespaces: Option<&std::collections::BTreeSet<String>>,
) -> Vec<IdleSlice> {
    let fraction = opts.threshold_percent / 100.0;
    let mut out = Vec::new();
    for s in &usage.slices {
        if namespaces.is_some_and(|set| !set.contains(&s.namespace)) {
            continue;
        }
        let key = key_of_slice(s);
        let (Some(limit), Some(used), Some(_)) = (
            s.memory_limit,
            window.max_memory_used.get(&key),
            window.present_at_start.get(&key),
        ) else {
            continue;
        };
        // Unthrottled: the share is of the whole GPU.
        let compute_limit = s.compute_limit.filter(|c| *c > 0.0).unwrap_or(1.0);
        let compute = window.max_compute_used.get(&key).copied().unwrap_or(0.0);
        if *used >= fraction * limit as f64 || compute >= fraction * compute_limit {
            continue;
        }
        let gpu = model.gpus.iter().find(|g| g.uuid == s.uuid);
        let (mut claim, mut pods, mut workload) = (None, Vec::new(), String::new());
        if s.pod.is_empty() {
            // A claim's slice: the claim whose series this is, its pods and their workload.
            if let Some(c) = gpu.and_then(|g| {
                g.claims
                    .iter()
                    .find(|c| claim_series(usage, &g.uuid, c, &g.claims).is_some_and(|x| x == s))
            }) {
                claim = Some(c.name.clone());
                pods = c.pods.clone();
                workload = model
                    .pods
                    .iter()
                    .find(|p| p.namespace == c.namespace && p.claim.as_deref() == Some(&c.name))
                    .map_or_else(|| format!("claim/{}", c.name), |p| p.workload.clone());
            }
        } else {
            pods = vec![s.pod.clone()];
            workload = model
                .pods
                .iter()
                .find(|p| p.namespace == s.namespace && p.pod == s.pod)
                .map_or_else(|| format!("pod/{}", s.pod), |p| p.workload.clone());
        }
        if workload.is_empty() {
            workload = format!("reservation/{}", s.reservation);
        }
        out.push(IdleSlice {
            namespace: s.namespace.clone(),
            workload,
            pods,
            claim,
            node: gpu.map_or_else(|| s.node.clone(), |g| g.node.clone()),
            device: gpu.map_or_else(|| format!("gpu-{}", s.index), |g| g.device.clone()),
            model: gpu.map(|g| g.model.clone()).unwrap_or_default(),
            uuid: s.uuid.clone(),
            memory_held: limit,
            memory_used_max: used.max(0.0).round() as u64,
            cores_share: s.compute_limit.map_or(0, |c| (c * 100.0).round() as u64),
            cores_used_max: compute * 100.0,
        });
    }
    out.sort_by(|a, b| {
        b.memory_held.cmp(&a.memory_held).then_with(|| {
            (&a.namespace, &a.workload, &a.uuid).cmp(&(&b.namespace, &b.workload, &b.uuid))
        })
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::{claims, pod, slices, usage, GIB};
    use crate::model::{build, Sources};

    fn sample(s: &SliceUsage, v: f64) -> Sample {
        let mut metric = BTreeMap::new();
        for (k, val) in [
            ("node", &s.node),
            ("reservation", &s.reservation),
            ("uuid", &s.uuid),
        ] {
            metric.insert(k.to_string(), val.clone());
        }
        Sample {
            metric,
            value: (0.0, v.to_string()),
        }
    }

    #[test]
    fn idle_means_under_the_threshold_for_the_whole_window() {
        let u = usage();
        let mut src = Sources {
            slices: slices(),
            claims: claims(),
            pods: vec![pod("ml", "pair-0", "gpu", "pair", &[("a", true)])],
            usage: Ok(u.clone()),
        };
        src.pods[0].metadata.owner_references = Some(vec![serde_json::from_value(
            serde_json::json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "pair-5d8f", "uid": "u", "controller": true}),
        )
        .unwrap()]);
        src.pods[0].metadata.labels =
            Some([("pod-template-hash".to_string(), "5d8f".to_string())].into());
        let m = build(&src, None);
        // train (20Gi) used 8Gi; the pair's two slices (10Gi each) at most 256Mi, under 5 %
        // of 10Gi (512Mi); the annotation probe (2Gi) used 1Gi.
        let mut memory: Vec<Sample> = Vec::new();
        for s in &u.slices {
            let v = match s.memory_limit {
                Some(l) if l == 10 * GIB => 256.0 * 1024.0 * 1024.0,
                _ => s.memory_used.unwrap() as f64,
            };
            memory.push(sample(s, v));
        }
        let limits: Vec<Sample> = u.slices.iter().map(|s| sample(s, 1.0)).collect();
        let w = fold(&memory, &[], &limits);
        let idle = idle_slices(&m, &u, &w, &IdleOptions::default(), None);
        let rows: Vec<(&str, Option<&str>, &str, u64, u64)> = idle
            .iter()
            .map(|r| {
                (
                    r.workload.as_str(),
                    r.claim.as_deref(),
                    r.device.as_str(),
                    r.memory_held,
                    r.memory_used_max,
                )
            })
            .collect();
        assert_eq!(
            rows,
            [
                (
                    "deployment/pair",
                    Some("pair"),
                    "gpu-0",
                    10 * GIB,
                    256 << 20
                ),
                (
                    "deployment/pair",
                    Some("pair"),
                    "gpu-1",
                    10 * GIB,
                    256 << 20
                ),
            ]
        );
        assert_eq!(idle[0].pods, ["pair-0"]);
        // A higher threshold takes the probe (1Gi of 2Gi) too; the largest holding first.
        let opts = IdleOptions {
            threshold_percent: 60.0,
            ..IdleOptions::default()
        };
        let idle = idle_slices(&m, &u, &w, &opts, None);
        let held: Vec<u64> = idle.iter().map(|r| r.memory_held).collect();
        assert_eq!(held, [20 * GIB, 10 * GIB, 10 * GIB, 2 * GIB], "{idle:?}");
        // A slice younger than the window is not judged; compute over the threshold is busy.
        let w2 = fold(&memory, &[sample(&u.slices[1], 0.2)], &limits[1..]);
        let idle = idle_slices(&m, &u, &w2, &IdleOptions::default(), None);
        assert_eq!(idle.len(), 1, "{idle:?}");
        assert_eq!(idle[0].device, "gpu-1");
        let ops = std::collections::BTreeSet::from(["ops".to_string()]);
        assert!(idle_slices(&m, &u, &w, &opts, Some(&ops)).len() == 1);
    }

    #[test]
    fn thresholds_and_queries_are_spelled_as_documented() {
        assert_eq!(parse_threshold("5").unwrap(), 5.0);
        assert_eq!(parse_threshold("2.5%").unwrap(), 2.5);
        for bad in ["", "x", "-1", "101"] {
            let e = parse_threshold(bad).unwrap_err().to_string();
            assert!(e.contains("accepted: a number from 0 to 100"), "{e}");
        }
        assert_eq!(
            queries(3600),
            [
                "max_over_time(gpuslice_slice_nvml_memory_used_bytes[1h])",
                "max_over_time(gpuslice_slice_nvml_compute_used_ratio[1h])",
                "gpuslice_slice_memory_limit_bytes offset 1h"
            ]
        );
    }

    /// A container that zeroes its usage file (or never had a shim) while its processes
    /// hold memory, or run kernels, is not idle: the window is judged from the series the
    /// exporter takes from the driver, whatever the usage file series say.
    #[test]
    fn a_forged_usage_file_does_not_make_a_busy_slice_idle() {
        let u = usage();
        let src = Sources {
            slices: slices(),
            claims: claims(),
            pods: Vec::new(),
            usage: Ok(u.clone()),
        };
        let m = build(&src, None);
        // The probe (2Gi): its usage file reads 0 throughout; the driver saw its processes
        // hold 1Gi, then, in the second store, hold nothing but run kernels at 40 %.
        let probe = u.slices.iter().find(|s| s.pod == "probe").unwrap();
        let stores = [
            [
                ("gpuslice_slice_memory_used_bytes", 0.0),
                ("gpuslice_slice_compute_used_ratio", 0.0),
                ("gpuslice_slice_nvml_memory_used_bytes", GIB as f64),
                ("gpuslice_slice_nvml_compute_used_ratio", 0.0),
                ("gpuslice_slice_memory_limit_bytes", 2.0 * GIB as f64),
            ],
            [
                ("gpuslice_slice_memory_used_bytes", 0.0),
                ("gpuslice_slice_compute_used_ratio", 0.0),
                ("gpuslice_slice_nvml_memory_used_bytes", 0.0),
                ("gpuslice_slice_nvml_compute_used_ratio", 0.4),
                ("gpuslice_slice_memory_limit_bytes", 2.0 * GIB as f64),
            ],
        ];
        for store in stores {
            // Prometheus answering each query with the probe's series of the metric it names.
            let answer = |q: &str| -> Vec<Sample> {
                let name: String = q
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .find(|w| w.starts_with("gpuslice_"))
                    .unwrap()
                    .to_string();
                let v = store.iter().find(|(n, _)| *n == name).unwrap().1;
                vec![sample(probe, v)]
            };
            let [mq, cq, lq] = queries(3600);
            let w = fold(&answer(&mq), &answer(&cq), &answer(&lq));
            let idle = idle_slices(&m, &u, &w, &IdleOptions::default(), None);
            assert!(
                !idle.iter().any(|r| r.pods == ["probe"]),
                "a slice whose processes the driver saw busy is idle: {idle:?} ({store:?})"
            );
        }
        // The same store with the driver's figures at 0 too: idle.
        let answer = |q: &str| -> Vec<Sample> {
            let v = if q.contains("limit") {
                2.0 * GIB as f64
            } else {
                0.0
            };
            vec![sample(probe, v)]
        };
        let [mq, cq, lq] = queries(3600);
        let w = fold(&answer(&mq), &answer(&cq), &answer(&lq));
        let idle = idle_slices(&m, &u, &w, &IdleOptions::default(), None);
        assert_eq!(idle.len(), 1, "{idle:?}");
        assert_eq!(idle[0].pods, ["probe"]);
    }
}
