//! The Nodes page (`/`: per node CPU, memory and GPU memory used with share bars and
//! sparklines, a compact slice map) and a node's page (`/nodes/NAME`: a slice map and a
//! chart per GPU): the model plus, from Prometheus, each GPU's memory used and the kubelets'
//! cAdvisor CPU and memory over the last hour (one range query each: three per page).

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Response, StatusCode};

use crate::fetch::PodScope;
use crate::model::Model;
use crate::usage::{self, Series, Span};

use super::pages::{self, History, NodeUse};
use super::respond::html;
use super::sources::{banner, model_of, Loaded};
use super::state::{chrome, State};

/// The span of the charts.
pub(super) const HISTORY: u64 = 3600;

/// GPU memory used, per GPU (`uuid`).
pub(super) const GPU_MEMORY: &str = "gpuslice_gpu_memory_used_bytes";
/// The kubelets' cAdvisor: each node's CPU (cores) and memory working set, from its root
/// cgroup (`id="/"`), by the `node` label the scrape gives the kubelet's target.
pub(super) const NODE_CPU: &str =
    r#"sum by (node) (rate(container_cpu_usage_seconds_total{id="/"}[5m]))"#;
pub(super) const NODE_MEMORY: &str =
    r#"sum by (node) (container_memory_working_set_bytes{id="/"})"#;

pub(super) fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The charts' span now, ending [`usage::MIN_STEP`] ago: samples of the last scrape
/// interval may still be on their way, and a point drawn must not change once drawn.
pub(super) fn span() -> Span {
    Span::last(HISTORY, now().saturating_sub(usage::MIN_STEP))
}

/// The lists' sparklines' span: [`span`] with [`usage::SPARK_POINTS`] points.
pub(super) fn spark_span() -> Span {
    Span::last_points(
        HISTORY,
        now().saturating_sub(usage::MIN_STEP),
        usage::SPARK_POINTS,
    )
}

/// Points of `series` keyed by `label`'s value; series of one key are summed at each time.
pub(super) fn keyed(
    span: Span,
    series: Vec<Series>,
    key: impl Fn(&Series) -> Option<String>,
) -> History {
    let mut sums: BTreeMap<String, BTreeMap<u64, f64>> = BTreeMap::new();
    for s in &series {
        if let Some(k) = key(s) {
            let e = sums.entry(k).or_default();
            for (t, v) in &s.points {
                *e.entry(t.round() as u64).or_default() += v;
            }
        }
    }
    History {
        span,
        series: sums
            .into_iter()
            .map(|(k, pts)| (k, pts.into_iter().map(|(t, v)| (t as f64, v)).collect()))
            .collect(),
    }
}

/// One range query over `span`; `Err`: why not.
pub(super) async fn range(state: &State, promql: &str, span: Span) -> Result<Vec<Series>, String> {
    let Some(url) = &state.prometheus else {
        return Err("Prometheus: not configured (start with --prometheus URL)".into());
    };
    usage::query_range(url, promql, span)
        .await
        .map_err(|e| e.to_string())
}

/// Memory used per GPU UUID over the charts' span.
async fn gpu_history(state: &State, span: Span) -> Result<History, String> {
    let series = range(state, GPU_MEMORY, span).await?;
    Ok(keyed(span, series, |s| s.metric.get("uuid").cloned()))
}

/// A cAdvisor history of the model's nodes (`listed`), with the total row summed over
/// their series alone (series of other nodes, and series without a `node` label, count
/// nowhere: the total's capacity is the listed nodes'). `None` (and a banner) when no series
/// names a listed node: Prometheus scrapes no kubelet's cAdvisor, or without the `node`
/// label.
fn by_node(
    span: Span,
    series: Result<Vec<Series>, String>,
    listed: &[&str],
    banners: &mut Vec<pages::Banner>,
) -> Option<History> {
    let mut missing = |text: String| -> Option<History> {
        if !banners.iter().any(|b| b.source == "cadvisor") {
            banners.push(banner("cadvisor", text));
        }
        None
    };
    let series = match series {
        Ok(s) => s,
        Err(e) => return missing(format!("cAdvisor: {e}")),
    };
    let mut h = keyed(span, series, |s| {
        s.metric
            .get("node")
            .filter(|n| listed.contains(&n.as_str()))
            .cloned()
    });
    if h.series.is_empty() {
        return missing("cAdvisor (nodes' CPU and memory): Prometheus has no container_cpu_usage_seconds_total or container_memory_working_set_bytes series with a node label naming a node of the list (it scrapes no kubelet's /metrics/cadvisor, or without the node label; docs/console.md)".to_string());
    }
    let total = sum_rows(h.series.values().flatten());
    h.series.insert(pages::TOTAL_ROW.to_string(), total);
    Some(h)
}

/// The points of several series summed at each time, in time order.
fn sum_rows<'a>(points: impl Iterator<Item = &'a (f64, f64)>) -> Vec<(f64, f64)> {
    let mut sums: BTreeMap<u64, f64> = BTreeMap::new();
    for (t, v) in points {
        *sums.entry(t.round() as u64).or_default() += v;
    }
    sums.into_iter().map(|(t, v)| (t as f64, v)).collect()
}

/// What the Nodes list shows from Prometheus beside the model `m`: each node's GPU memory
/// used (`gpu`: the range query's answer; not shown while the model's use is unavailable),
/// and cAdvisor's CPU and memory, each from its own answer whenever Prometheus is
/// `configured` (a missing GPU exporter leaves them shown). `None` without Prometheus.
#[allow(clippy::too_many_arguments)]
fn node_use(
    span: Span,
    m: &Model,
    configured: bool,
    gpu: Result<History, String>,
    cpu: Result<Vec<Series>, String>,
    memory: Result<Vec<Series>, String>,
    capacity: BTreeMap<String, pages::Capacity>,
    banners: &mut Vec<pages::Banner>,
) -> Option<NodeUse> {
    if !configured {
        return None;
    }
    let gpu_memory = match (&m.usage_unavailable, gpu) {
        // The model's banner already says why.
        (Some(_), _) => None,
        (None, Ok(h)) => Some(node_history(m, &h)),
        (None, Err(e)) => {
            banners.push(banner("prometheus", e));
            None
        }
    };
    let listed: Vec<&str> = m.nodes.iter().map(|n| n.name.as_str()).collect();
    Some(NodeUse {
        gpu_memory,
        cpu: by_node(span, cpu, &listed, banners),
        memory: by_node(span, memory, &listed, banners),
        capacity,
    })
}

/// Per node (and the total row, the sum of the nodes'): the sum of its GPUs' points at each
/// time.
fn node_history(m: &Model, gpus: &History) -> History {
    let mut sums: BTreeMap<String, BTreeMap<u64, f64>> = BTreeMap::new();
    for g in &m.gpus {
        for (t, v) in gpus.points(&g.uuid) {
            *sums
                .entry(g.node.clone())
                .or_default()
                .entry(t.round() as u64)
                .or_default() += v;
        }
    }
    let mut series: BTreeMap<String, Vec<(f64, f64)>> = sums
        .into_iter()
        .map(|(k, pts)| (k, pts.into_iter().map(|(t, v)| (t as f64, v)).collect()))
        .collect();
    if !series.is_empty() {
        let total = sum_rows(series.values().flatten());
        series.insert(pages::TOTAL_ROW.to_string(), total);
    }
    History {
        span: gpus.span,
        series,
    }
}

pub(super) async fn nodes(state: &State, available: bool) -> Response<Full<Bytes>> {
    // The range queries need nothing from the model: asked beside it.
    let span = spark_span();
    let (loaded, gpu, cpu, memory) = tokio::join!(
        model_of(state, PodScope::None, true),
        gpu_history(state, span),
        range(state, NODE_CPU, span),
        range(state, NODE_MEMORY, span)
    );
    let Loaded {
        model: m,
        usage,
        capacity,
        mut banners,
    } = loaded;
    let used = m.as_ref().and_then(|m| {
        node_use(
            span,
            m,
            state.prometheus.is_some(),
            gpu,
            cpu,
            memory,
            capacity,
            &mut banners,
        )
    });
    html(
        StatusCode::OK,
        pages::nodes_page(
            &chrome(state, banners),
            m.as_ref(),
            available,
            used.as_ref(),
            usage.as_ref(),
        ),
    )
}

pub(super) async fn node(state: &State, name: &str) -> Response<Full<Bytes>> {
    let Loaded {
        model: m,
        usage,
        mut banners,
        ..
    } = model_of(state, PodScope::None, true).await;
    let Some(m) = m else {
        return html(
            StatusCode::OK,
            pages::nodes_page(&chrome(state, banners), None, false, None, None),
        );
    };
    let known = m.nodes.iter().any(|n| n.name == name);
    let plugin_missing = banners.iter().any(|b| b.source == format!("plugin:{name}"));
    banners.retain(|b| !b.source.starts_with("plugin:") || b.source == format!("plugin:{name}"));
    if !known && !plugin_missing {
        return html(
            StatusCode::NOT_FOUND,
            pages::not_found_page(&chrome(state, banners), &format!("node {name}")),
        );
    }
    let history = if m.usage_unavailable.is_none() {
        match gpu_history(state, span()).await {
            Ok(h) => Some(h),
            Err(e) => {
                banners.push(banner("prometheus", e));
                None
            }
        }
    } else {
        None
    };
    html(
        StatusCode::OK,
        pages::node_page(
            &chrome(state, banners),
            &m,
            usage.as_ref(),
            name,
            history.as_ref(),
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model;
    use crate::model::tests::{claims, slices};

    const SPAN: Span = Span {
        start: 0,
        end: 120,
        step: 60,
    };

    /// The test model (node-a, node-b); `usage`: what Prometheus answered.
    fn test_model(usage: Result<crate::usage::Usage, String>) -> Model {
        model::build(
            &model::Sources {
                slices: slices(),
                claims: claims(),
                pods: vec![],
                usage,
            },
            None,
        )
    }

    /// A series labelled `labels` with `points`.
    fn series(labels: &[(&str, &str)], points: &[(f64, f64)]) -> Series {
        Series {
            metric: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            points: points.to_vec(),
        }
    }

    #[test]
    fn the_cadvisor_total_sums_the_listed_nodes_alone() {
        let mut banners = Vec::new();
        let s = vec![
            series(&[("node", "node-a")], &[(0.0, 1.0), (60.0, 2.0)]),
            series(&[("node", "node-b")], &[(60.0, 10.0)]),
            // A node without gpuslice GPUs, and a series without the node label.
            series(&[("node", "cpu-only")], &[(0.0, 100.0), (60.0, 100.0)]),
            series(&[], &[(60.0, 1000.0)]),
        ];
        let h = by_node(SPAN, Ok(s), &["node-a", "node-b"], &mut banners).unwrap();
        assert_eq!(h.series[pages::TOTAL_ROW], [(0.0, 1.0), (60.0, 12.0)]);
        assert_eq!(h.series["node-a"], [(0.0, 1.0), (60.0, 2.0)]);
        assert!(!h.series.contains_key("cpu-only"), "{h:?}");
        assert!(banners.is_empty(), "{banners:?}");
    }

    #[test]
    fn cadvisor_without_a_node_label_naming_a_listed_node_is_a_missing_source() {
        let unlabelled = vec![series(&[], &[(0.0, 5.0), (60.0, 6.0)])];
        let elsewhere = vec![series(&[("node", "cpu-only")], &[(60.0, 7.0)])];
        for s in [unlabelled, elsewhere, vec![]] {
            let mut banners = Vec::new();
            let h = by_node(SPAN, Ok(s.clone()), &["node-a", "node-b"], &mut banners);
            assert!(h.is_none(), "{s:?}: {h:?}");
            assert_eq!(banners.len(), 1, "{s:?}");
            assert_eq!(banners[0].source, "cadvisor");
            assert!(
                banners[0]
                    .text
                    .contains("with a node label naming a node of the list"),
                "{}",
                banners[0].text
            );
            // The memory query's answer adds no second banner.
            assert!(by_node(SPAN, Ok(s), &["node-a"], &mut banners).is_none());
            assert_eq!(banners.len(), 1);
        }
    }

    #[test]
    fn cpu_and_memory_stay_when_only_the_gpu_exporter_is_missing() {
        let cpu = || Ok(vec![series(&[("node", "node-a")], &[(60.0, 0.5)])]);
        let memory = || Ok(vec![series(&[("node", "node-a")], &[(60.0, 4e9)])]);
        let gpu = || {
            Ok(History {
                span: SPAN,
                series: BTreeMap::new(),
            })
        };
        let capacity = || BTreeMap::from([("node-a".to_string(), (Some(2.0), Some(16e9)))]);
        // The exporter's series missing: the model's use unavailable.
        let m = test_model(Err(
            "Prometheus at http://p:9090 has no gpuslice_gpu_* series".into(),
        ));
        let mut banners = Vec::new();
        let u = node_use(
            SPAN,
            &m,
            true,
            gpu(),
            cpu(),
            memory(),
            capacity(),
            &mut banners,
        )
        .unwrap();
        assert!(u.gpu_memory.is_none());
        assert_eq!(u.cpu.as_ref().unwrap().now("node-a"), Some(0.5));
        assert_eq!(u.memory.as_ref().unwrap().now(pages::TOTAL_ROW), Some(4e9));
        assert!(
            banners.is_empty(),
            "the model's banner says it: {banners:?}"
        );
        let chrome = pages::Chrome {
            rights: String::new(),
            allow_edit: false,
            banners: vec![],
        };
        let html = pages::nodes_page(&chrome, Some(&m), false, Some(&u), None);
        let a = html
            .split("<tr data-node=\"node-a\">")
            .nth(1)
            .and_then(|r| r.split("</tr>").next())
            .unwrap();
        assert!(a.contains("<td data-col=\"cpu\" data-value=\"500\" class=\"use\"><span class=\"v\">500m</span>"), "{a}");
        assert!(a.contains("<td data-col=\"memory-used\" class=\"use unknown\"><span class=\"v\">—</span></td>"), "{a}");
        // Only the GPU memory query failing: its banner, CPU and memory still shown.
        let m = test_model(Ok(crate::model::tests::usage()));
        let mut banners = Vec::new();
        let u = node_use(
            SPAN,
            &m,
            true,
            Err("Prometheus at http://p:9090 is unreachable".into()),
            cpu(),
            memory(),
            capacity(),
            &mut banners,
        )
        .unwrap();
        assert!(u.gpu_memory.is_none() && u.cpu.is_some() && u.memory.is_some());
        assert_eq!(banners.len(), 1);
        assert_eq!(banners[0].source, "prometheus");
        // Without Prometheus nothing is asked of it.
        let mut banners = Vec::new();
        let none = node_use(
            SPAN,
            &m,
            false,
            gpu(),
            cpu(),
            memory(),
            capacity(),
            &mut banners,
        );
        assert!(none.is_none() && banners.is_empty());
    }

    #[test]
    fn node_rows_sum_their_gpus_at_each_time() {
        let m = test_model(Err("x".into()));
        let mut h = History {
            span: Span {
                start: 0,
                end: 120,
                step: 60,
            },
            series: BTreeMap::new(),
        };
        h.series
            .insert("GPU-NVIDIA-H200-0".into(), vec![(0.0, 1.0), (60.0, 2.0)]);
        h.series
            .insert("GPU-NVIDIA-H200-1".into(), vec![(0.0, 10.0), (60.0, 20.0)]);
        h.series
            .insert("GPU-NVIDIA-L4-0".into(), vec![(60.0, 100.0)]);
        h.series
            .insert("GPU-elsewhere".into(), vec![(60.0, 1000.0)]);
        let n = node_history(&m, &h);
        assert_eq!(n.series["node-a"], [(0.0, 11.0), (60.0, 22.0)]);
        assert_eq!(n.series["node-b"], [(60.0, 100.0)]);
        assert_eq!(n.series[pages::TOTAL_ROW], [(0.0, 11.0), (60.0, 122.0)]);
    }
}
